#!/usr/bin/env bash
# Host side of the e2e suite: after the VM has exited, check that what the
# guest did on the virtio-fs mount reached the shared directory on the host.
#
#   tests/e2e/host-check.sh SHARED_DIR on|off    (on: daemon ran with --xattr)
#
# Prints "CHECK PASS host:<name>" / "CHECK FAIL host:<name>: <detail>" lines, the summary
# and end marker of scripts/lib.sh, and exits non-zero if any check failed.
set -euo pipefail
RIG_TAG='host-check'
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
(($# == 2)) || { echo "usage: $0 SHARED_DIR on|off" >&2; exit 2; }
S=$1
XATTR=$2
W=$S/e2e
[[ -d $S ]] || die "'$S' is not a directory"

# Each check is a function that dies with the reason (lib.sh check_run).
eq() { [[ $1 == "$2" ]] || die "$3: got '$1', expected '$2'"; }

h_tree() { [[ -d $W ]] || die "$W missing: the guest suite did not run or wrote nothing"; }

h_data() {
    eq "$(cat "$W/basic/hello.txt")" $'hello\nworld' "hello.txt"
    (cd "$W/data" && sha256sum --quiet -c rand.sha256) || die "rand.bin differs from the guest's checksum"
    eq "$(stat -c %s "$W/data/rand.bin")" 8388608 "rand.bin size"
    eq "$(stat -c %s "$W/basic/append.bin")" 151 "append.bin size"
    eq "$(stat -c %s "$W/basic/trunc")" 1048576 "trunc size"
    eq "$(head -c 10 "$W/basic/trunc")" 0123456789 "trunc head"
    cmp -s <(tail -c +11 "$W/basic/trunc") <(head -c 1048566 /dev/zero) || die "trunc tail is not zero"
    eq "$(cat "$W/basic/trunc0")" abc "trunc0"
    [[ -f $W/basic/empty && ! -s $W/basic/empty ]] || die "empty file"
}

h_dirs() {
    eq "$(find "$W/dir1000" -mindepth 1 | wc -l)" 1000 "dir1000 entry count"
    local want
    want=$(for i in $(seq 0 999); do printf 'f%04d\n' "$i"; done)
    eq "$(ls "$W/dir1000")" "$want" "dir1000 names"
    [[ ! -e $W/dir1000-rm ]] || die "dir1000-rm was not removed"
    [[ ! -e $W/dirs/a ]] || die "dirs/a was not removed"
    eq "$(stat -c %a "$W/dirs/m700")" 700 "dirs/m700 mode"
}

h_rename() {
    local r=$W/rename
    [[ ! -e $r/src && ! -e $r/dirA && ! -e $r/other ]] || die "rename sources still exist"
    eq "$(cat "$r/dst")" src-data "rename/dst"
    eq "$(cat "$r/dirB/moved")" moved "rename/dirB/moved"
    eq "$(cat "$r/renamed-long")" x "renamed-long"
    # vfstest rename2: xa and xd2 exchanged (dir <-> file), xb = A.
    eq "$(cat "$r/r2/xa/inner")" I "r2/xa/inner"
    eq "$(cat "$r/r2/xb")" A "r2/xb"
    eq "$(cat "$r/r2/xd2")" B "r2/xd2"
    [[ -d $r/r2/xd1 ]] || die "r2/xd1 missing"
}

h_links() {
    local l=$W/links
    eq "$(stat -c %h "$l/h1")" 2 "h1 nlink"
    eq "$(stat -c %i "$l/h1")" "$(stat -c %i "$l/h2")" "h1/h2 inode"
    eq "$(cat "$l/h1")" $'shared\nmore' "h1 content"
    eq "$(readlink "$l/sym")" target.txt "sym"
    eq "$(readlink "$l/dangling")" does-not-exist "dangling"
    eq "$(readlink "$l/longsym" | wc -c)" 1002 "longsym length (+newline)"
}

h_perm() {
    local p=$W/perm
    eq "$(stat -c %a "$p/m640")" 640 "m640"
    eq "$(stat -c %a "$p/m1777")" 1777 "m1777"
    eq "$(stat -c '%u:%g' "$p/owned")" 1234:5678 "owned"
    eq "$(stat -c '%u:%g' "$p/lsym")" 4321:8765 "lsym (chown -h)"
}

h_times() {
    eq "$(stat -c '%.9X %.9Y' "$W/times/fixed")" "1000000000.123456789 1234567890.987654321" "fixed atime/mtime"
    eq "$(TZ=UTC stat -c %y "$W/times/touched" | cut -c1-19)" "2001-02-03 04:05:06" "touched mtime"
}

h_time_edges() { # the guest's timeedges files, in the range every 64-bit-time file system stores
    local e=$W/times/edges
    eq "$(stat -c '%.9X %.9Y' "$e/e0")" "-315619200.000000000 -0.000000001" "e0 (1960; -1 s + 999999999 ns)"
    eq "$(stat -c '%.9X %.9Y' "$e/e1")" "-2147483648.000000000 -2147483646.999999999" "e1 (INT32_MIN; +1 s 1 ns)"
    eq "$(stat -c '%.9X %.9Y' "$e/e2")" "4102444800.999999999 2147483648.000000000" "e2 (2100; 2038)"
    eq "$(stat -c '%.9X %.9Y' "$e/e3")" "0.000000000 2147483647.999999999" "e3 (0; INT32_MAX)"
    eq "$(stat -c %Y "$e/t1960")" -315619200 "t1960 (touch -d 1960-01-01)"
}

h_xattr() {
    local f=$W/xattr/x
    if [[ $XATTR == off ]]; then
        [[ -z $(getfattr --absolute-names -d -m '^user\.' "$f" 2>/dev/null) ]] || die "xattrs set although the daemon ran without --xattr"
        return 0
    fi
    eq "$(getfattr --absolute-names --only-values -n user.daxfsd "$f")" value "user.daxfsd"
    eq "$(getfattr --absolute-names --only-values -n user.other "$f")" "" "user.other"
    getfattr --absolute-names -n user.gone "$f" >/dev/null 2>&1 && die "user.gone was not removed"
    eq "$(getfattr --absolute-names --only-values -n user.big "$f" | wc -c)" 1024 "user.big size"
    eq "$(getfattr --absolute-names --only-values -n user.dir "$f.d")" d "user.dir on a directory"
}

h_statfs() {
    local guest host
    guest=$(cat "$W/statfs.txt")
    read -r frsize blocks namelen < <(stat -f -c '%S %b %l' "$S")
    host="frsize=$frsize blocks=$blocks"
    [[ $guest == "$host "* ]] || die "guest statfs '$guest' does not match the host's '$host'"
    [[ $guest == *" namelen=$namelen" ]] || die "guest namelen in '$guest', host $namelen"
}

h_sparse() {
    local f=$W/sparse/big
    eq "$(stat -c %s "$f")" $((300 * 1024 * 1024 + 4)) "size"
    (($(stat -c '%b * %B' "$f") < 16 * 1024 * 1024)) || die "not sparse on the host: $(du -h "$f")"
    eq "$(dd if="$f" bs=1 skip=$((1024 * 1024)) count=4 status=none)" HEAD "HEAD mark"
    eq "$(dd if="$f" bs=1M skip=300 count=1 status=none | head -c 4)" MIDL "MIDL mark"
}

h_unlink() {
    eq "$(find "$W/unlink" -mindepth 1 | wc -l)" 0 "entries left in unlink/ (incl. hidden)"
}

h_special() {
    [[ -p $W/special/fifo ]] || die "special/fifo is not a FIFO on the host"
    [[ -S $W/special/sock ]] || die "special/sock is not a socket on the host"
}

h_fio() {
    local n
    n=$(find "$W/fio" -type f | wc -l)
    ((n >= 2)) || die "fio left $n data files, expected 2"
    eq "$(stat -c %s "$W/fio/seq.0.0")" $((16 * 1024 * 1024)) "fio seq file size"
}

check_run host:tree h_tree
if [[ -d $W ]]; then
    check_run host:data h_data
    check_run host:dirs h_dirs
    check_run host:rename h_rename
    check_run host:links h_links
    check_run host:perm h_perm
    check_run host:times h_times
    check_run host:time_edges h_time_edges
    check_run host:xattr h_xattr
    check_run host:statfs h_statfs
    check_run host:sparse h_sparse
    check_run host:unlink h_unlink
    check_run host:special h_special
    check_run host:fio h_fio
fi
rig_summary host-check
