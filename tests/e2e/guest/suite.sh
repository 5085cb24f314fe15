#!/bin/sh
# Guest side of the daxfsd end-to-end suite (busybox sh). Runs every check on
# the virtio-fs mount, printing one line per check:
#   CHECK PASS <name> (<seconds>s)
#   CHECK FAIL <name>: <detail>
# and exits non-zero if any failed. It leaves its files under <mount>/e2e
# for tests/e2e/host-check.sh to inspect from the host after the VM exits.
#
# Kernel command line knobs (read from /proc/cmdline):
#   daxfsd.xattr=on|off   whether the daemon runs with --xattr (default on)
#   daxfsd.only=a,b       run only these checks (the others print CHECK SKIP);
#                         seek_data_hole needs sparse_large_file before it
#   daxfsd.skip=a,b       skip these checks (printed as CHECK SKIP)
#   daxfsd.check_timeout=S  seconds before a hung check is killed (default 90)
#   daxfsd.die_after=N    negative control: exit after N checks, without E2E RESULT
#   daxfsd.expect_fail=a,b  checks this daemon is known to fail (a peer's known bug):
#                         a failure prints CHECK PASS "(fails as expected: ...)", a pass
#                         prints CHECK FAIL (the list is out of date)
# On a host mount (tests/host/run.sh) the environment replaces the guest's pieces:
#   E2E_VFSTEST (the helper), E2E_CMDLINE (instead of /proc/cmdline), E2E_FSTYPE
#   (instead of virtiofs), E2E_REMOUNT (a command that unmounts and mounts again),
#   E2E_HOST=1 (leave the host's console log level alone).
# (ls in pipes is deliberate: listing directories is what is under test.)
# shellcheck disable=SC2012,SC2010,SC2015 # "A && B || die" dies if either fails
M=${1:-/mnt}
W=$M/e2e
VT=${E2E_VFSTEST:-/e2e/vfstest}

param() {
    v=$2
    # shellcheck disable=SC2013 # words, not lines
    for w in ${E2E_CMDLINE-$(cat /proc/cmdline)}; do
        case $w in "daxfsd.$1="*) v=${w#daxfsd."$1"=} ;; esac
    done
    printf '%s\n' "$v"
}
XATTR=$(param xattr on)

pass=0 fail=0 skip=0 failed=
ONLY=$(param only "" | tr ',' ' ')
SKIP=$(param skip "" | tr ',' ' ')
CHECK_TIMEOUT=$(param check_timeout 90)
DIE_AFTER=$(param die_after "")
EXPECT_FAIL=$(param expect_fail "" | tr ',' ' ')
HUNG=0
now() { cut -d' ' -f1 /proc/uptime; }
kill_tree() { # kill_tree PID: SIGKILL PID and all its descendants
    kids=$(ps -o pid,ppid | awk -v p="$1" '$2 == p { print $1 }')
    kill -9 "$1" 2>/dev/null   # the parent first: it must not act on its children's death
    for c in $kids; do kill_tree "$c"; done
}
listed() { case " $2 " in *" $1 "*) return 0 ;; esac; return 1; }
# check NAME FUNCTION: run FUNCTION in a subshell; any die() fails the check.
# A check still running after CHECK_TIMEOUT seconds is killed and fails; if
# the mount then does not answer a stat within 10 s the daemon is wedged and
# the remaining checks are reported as not run.
check() {
    name=$1; shift
    if [ -n "$ONLY" ] && ! listed "$name" "$ONLY" || listed "$name" "$SKIP"; then
        echo "CHECK SKIP $name (daxfsd.only/daxfsd.skip)"
        skip=$((skip + 1))
        return 0
    fi
    if [ $HUNG -eq 1 ]; then
        echo "CHECK FAIL $name: not run, the mount stopped answering"
        fail=$((fail + 1)); failed="$failed $name"
        return 0
    fi
    t0=$(now)
    ("$@") >/tmp/check.out 2>&1 &
    cpid=$!
    (sleep "$CHECK_TIMEOUT"; echo "timed out after ${CHECK_TIMEOUT}s" >>/tmp/check.out; kill_tree "$cpid") &
    wpid=$!
    wait "$cpid"
    rc=$?
    kill_tree "$wpid"
    wait "$wpid" 2>/dev/null
    out=$(cat /tmp/check.out)
    t1=$(now)
    dt=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
    detail=$(printf '%s\n' "$out" | grep -v '^$' | tail -n 4 | tr '\n' '|')
    timed_out=0
    case $out in *"timed out after"*) timed_out=1 ;; esac
    if listed "$name" "$EXPECT_FAIL" && [ $rc -eq 0 ]; then
        echo "CHECK FAIL $name: passed, but daxfsd.expect_fail lists it: drop it from the list"
        fail=$((fail + 1)); failed="$failed $name"
    elif listed "$name" "$EXPECT_FAIL" && [ $timed_out -eq 0 ]; then
        # A timeout is no expected failure: it fails below, with the hung-mount test.
        echo "CHECK PASS $name (${dt}s; fails as expected: ${detail%|})"
        pass=$((pass + 1))
    elif [ $rc -eq 0 ]; then
        echo "CHECK PASS $name (${dt}s)"
        pass=$((pass + 1))
    else
        echo "CHECK FAIL $name: rc=$rc ${detail%|}"
        fail=$((fail + 1))
        failed="$failed $name"
        if [ $timed_out -eq 1 ]; then
            stat "$M" >/dev/null 2>&1 &
            spid=$!
            (sleep 10; kill -9 "$spid" 2>/dev/null) &
            wpid=$!
            if ! wait "$spid"; then
                echo "E2E: $M does not answer a stat within 10 s; the remaining checks are not run"
                HUNG=1
                : >/tmp/daxfsd-mount-hung
            fi
            kill_tree "$wpid"; wait "$wpid" 2>/dev/null
        fi
    fi
    if [ -n "$DIE_AFTER" ] && [ $((pass + fail)) -ge "$DIE_AFTER" ]; then
        echo "E2E: negative control: exiting after $DIE_AFTER check(s)"
        exit 97
    fi
}

die() { echo "$*" >&2; exit 1; }
# eq ACTUAL EXPECTED WHAT
eq() { [ "$1" = "$2" ] || die "$3: got '$1', expected '$2'"; }
# Drop the guest's page, dentry and inode caches: re-reads go to the daemon.
dropc() { sync; echo 3 >/proc/sys/vm/drop_caches; }
# must_fail WHAT CMD...: CMD must exit non-zero.
must_fail() { w=$1; shift; if "$@" 2>/dev/null; then die "$w: '$*' succeeded"; fi; }

t_mount() {
    fst=${E2E_FSTYPE:-virtiofs}
    grep -q " $M $fst " /proc/mounts || die "$M is not a $fst mount: $(grep " $M " /proc/mounts)"
    rm -rf "$W"
    mkdir "$W" || die "mkdir $W"
    [ -d "$W" ] || die "$W missing after mkdir"
}

t_create_write_read() {
    d=$W/basic
    mkdir -p "$d" || die "mkdir"
    echo hello >"$d/hello.txt" || die "write"
    eq "$(cat "$d/hello.txt")" hello "read back"
    : >"$d/empty" || die "create empty"
    eq "$(stat -c %s "$d/empty")" 0 "empty size"
    must_fail "O_EXCL create" sh -c "set -C; : >'$d/hello.txt'"
    mkdir "$W/data" || die "mkdir data"
    dd if=/dev/urandom of=/tmp/rand.bin bs=64k count=128 2>/dev/null || die "urandom"
    cp /tmp/rand.bin "$W/data/rand.bin" || die "copy 8 MiB"
    (cd /tmp && sha256sum rand.bin) >"$W/data/rand.sha256" || die "sha256"
    cmp /tmp/rand.bin "$W/data/rand.bin" || die "8 MiB file differs (cached)"
    dropc
    cmp /tmp/rand.bin "$W/data/rand.bin" || die "8 MiB file differs after drop_caches"
    eq "$(stat -c %s "$W/data/rand.bin")" 8388608 "size"
    # Overwrite in the middle, read around it.
    printf 'XYZ' | dd of="$W/data/rand.bin" bs=1 seek=4096 conv=notrunc 2>/dev/null || die "overwrite"
    printf 'XYZ' | dd of=/tmp/rand.bin bs=1 seek=4096 conv=notrunc 2>/dev/null
    dropc
    cmp /tmp/rand.bin "$W/data/rand.bin" || die "partial overwrite differs"
    (cd /tmp && sha256sum rand.bin) >"$W/data/rand.sha256" || die "sha256"
    rm -f /tmp/rand.bin
}

t_append() {
    d=$W/basic
    mkdir -p "$d"
    [ -f "$d/hello.txt" ] || echo hello >"$d/hello.txt"
    echo world >>"$d/hello.txt" || die "append"
    dropc
    eq "$(cat "$d/hello.txt")" "hello
world" "after append"
    $VT append "$d/append.bin" || die "vfstest append"
}

t_truncate() {
    mkdir -p "$W/basic"
    f=$W/basic/trunc
    printf '0123456789abcdef' >"$f"
    truncate -s 10 "$f" || die "shrink"
    eq "$(cat "$f")" 0123456789 "after shrink"
    truncate -s 1M "$f" || die "grow"
    dropc
    eq "$(stat -c %s "$f")" 1048576 "size after grow"
    eq "$(head -c 10 "$f")" 0123456789 "head after grow"
    head -c 1048566 /dev/zero >/tmp/z
    tail -c 1048566 "$f" | cmp - /tmp/z || die "grown part is not zero"
    rm -f /tmp/z
    : >"$W/basic/trunc0"
    printf 'abc' >"$W/basic/trunc0"
    eq "$(stat -c %s "$W/basic/trunc0")" 3 "O_TRUNC rewrite"
}

t_mkdir_rmdir() {
    d=$W/dirs
    mkdir -p "$d/a/b/c" || die "mkdir -p"
    must_fail "mkdir existing" mkdir "$d/a"
    must_fail "rmdir non-empty" rmdir "$d/a"
    : >"$d/a/b/file"
    must_fail "rmdir file" rmdir "$d/a/b/file"
    must_fail "mkdir under file" mkdir "$d/a/b/file/x"
    rm "$d/a/b/file"
    rmdir "$d/a/b/c" "$d/a/b" "$d/a" || die "rmdir chain"
    [ ! -e "$d/a" ] || die "$d/a still exists"
    mkdir -m 700 "$d/m700" || die "mkdir -m"
    eq "$(stat -c %a "$d/m700")" 700 "mkdir mode"
    eq "$(stat -c %h "$d")" 3 "parent link count (. .. m700)"
}

t_readdir_1000() {
    d=$W/dir1000
    mkdir -p "$d" || die "mkdir"
    i=0
    while [ $i -lt 1000 ]; do
        : >"$d/$(printf 'f%04d' $i)" || die "create f$i"
        i=$((i + 1))
    done
    eq "$(ls "$d" | wc -l)" 1000 "ls count"
    dropc
    eq "$(ls "$d" | wc -l)" 1000 "ls count after drop_caches"
    eq "$(ls "$d" | head -n 1)" f0000 "first sorted"
    eq "$(ls "$d" | tail -n 1)" f0999 "last sorted"
    $VT readdir "$d" 1000 || die "vfstest readdir"
    # A second directory: create, list and remove 1000 entries.
    r=$W/dir1000-rm
    mkdir "$r"
    i=0
    while [ $i -lt 1000 ]; do : >"$r/x$i"; i=$((i + 1)); done
    eq "$(find "$r" -type f | wc -l)" 1000 "find count"
    rm -r "$r" || die "rm -r of 1000 entries"
    [ ! -e "$r" ] || die "$r still exists"
}

t_rename() {
    d=$W/rename
    mkdir -p "$d"
    echo src-data >"$d/src"
    echo old-target >"$d/dst"
    mv "$d/src" "$d/dst" || die "rename over existing file"
    [ ! -e "$d/src" ] || die "source still exists"
    eq "$(cat "$d/dst")" src-data "target content"
    dropc
    eq "$(cat "$d/dst")" src-data "target content after drop_caches"
    mkdir "$d/dirA" "$d/dirB"
    echo moved >"$d/dirA/moved"
    rmdir "$d/dirB"
    mkdir "$d/dirB"
    # Directory over an empty directory.
    mv -T "$d/dirA" "$d/dirB" || die "rename dir over empty dir"
    [ ! -e "$d/dirA" ] || die "dirA still exists"
    eq "$(cat "$d/dirB/moved")" moved "moved dir content"
    # Across directories, then back.
    mkdir "$d/other"
    mv "$d/dirB/moved" "$d/other/m" || die "cross-dir rename"
    mv "$d/other/m" "$d/dirB/moved" || die "cross-dir rename back"
    rmdir "$d/other"
    # Case-only and long names.
    long=$(printf 'L%.0s' $(seq 1 250))
    echo x >"$d/$long" || die "create 251-char name"
    mv "$d/$long" "$d/renamed-long" || die "rename long name"
    mkdir "$d/r2"
    $VT rename2 "$d/r2" || die "vfstest rename2"
}

t_hardlinks() {
    d=$W/links
    mkdir -p "$d"
    echo shared >"$d/h1"
    ln "$d/h1" "$d/h2" || die "link"
    eq "$(stat -c %h "$d/h1")" 2 "nlink"
    eq "$(stat -c %i "$d/h1")" "$(stat -c %i "$d/h2")" "same inode"
    echo more >>"$d/h2"
    dropc
    eq "$(cat "$d/h1")" "shared
more" "write through second name"
    ln "$d/h1" "$d/h3" && rm "$d/h3" || die "link + unlink"
    dropc
    eq "$(stat -c %h "$d/h1")" 2 "nlink after unlink of third"
    must_fail "hard link to directory" ln "$W/links" "$d/dirlink"
    must_fail "link over existing" ln "$d/h1" "$d/h2"
}

t_symlinks() {
    d=$W/links
    mkdir -p "$d"
    echo target >"$d/target.txt"
    ln -s target.txt "$d/sym" || die "symlink"
    eq "$(readlink "$d/sym")" target.txt "readlink"
    eq "$(cat "$d/sym")" target "read through"
    eq "$(stat -c %F "$d/sym")" "symbolic link" "lstat type"
    ln -s does-not-exist "$d/dangling"
    must_fail "open dangling" cat "$d/dangling"
    eq "$(readlink "$d/dangling")" does-not-exist "dangling readlink"
    ln -s ../links "$d/dirsym"
    eq "$(ls "$d/dirsym/" | grep -c target.txt)" 1 "list through dir symlink"
    long=$(printf 'p/%.0s' $(seq 1 500))x
    ln -s "$long" "$d/longsym" || die "1001-byte symlink"
    dropc
    eq "$(readlink "$d/longsym")" "$long" "long readlink"
}

t_chmod_chown() {
    d=$W/perm
    mkdir -p "$d"
    : >"$d/m640"
    chmod 640 "$d/m640" || die "chmod"
    eq "$(stat -c %a "$d/m640")" 640 "mode"
    mkdir "$d/m1777" && chmod 1777 "$d/m1777" || die "chmod dir"
    : >"$d/owned"
    chown 1234:5678 "$d/owned" || die "chown"
    dropc
    eq "$(stat -c '%a %u %g' "$d/m640")" "640 0 0" "mode after drop_caches"
    eq "$(stat -c %a "$d/m1777")" 1777 "sticky dir"
    eq "$(stat -c '%u %g' "$d/owned")" "1234 5678" "owner"
    chmod 4755 "$d/m640" && eq "$(stat -c %a "$d/m640")" 4755 "setuid bit"
    chmod 640 "$d/m640"
    ln -s owned "$d/lsym"
    chown -h 4321:8765 "$d/lsym" || die "chown -h symlink"
    eq "$(stat -c '%u %g' "$d/owned")" "1234 5678" "chown -h followed the link"
}

t_utimes() {
    d=$W/times
    mkdir -p "$d"
    $VT utimes "$d/fixed" || die "vfstest utimes"
    touch -d '2001-02-03 04:05:06' "$d/touched" || die "touch -d"
    dropc
    eq "$(TZ=UTC stat -c %y "$d/touched" | cut -c1-19)" "2001-02-03 04:05:06" "touch -d mtime"
}

# Times before 1970, past 2038 and past the host file system's range (issue 26); the files
# stay for host-check.sh's h_time_edges.
t_time_edges() {
    d=$W/times/edges
    mkdir -p "$d"
    $VT timeedges "$d" set || die "vfstest timeedges set"
    dropc
    $VT timeedges "$d" check || die "vfstest timeedges check (after drop_caches)"
    TZ=UTC touch -d '1960-01-01 00:00:00' "$d/t1960" || die "touch -d 1960-01-01"
    dropc
    eq "$(TZ=UTC stat -c '%Y %y' "$d/t1960")" "-315619200 1960-01-01 00:00:00.000000000 +0000" "touch -d 1960-01-01"
}

t_xattr() {
    d=$W/xattr
    mkdir -p "$d"
    $VT xattr "$d/x" "$XATTR" || die "vfstest xattr $XATTR"
}

t_locks() { mkdir -p "$W/basic" && $VT locks "$W/basic/locks" || die "vfstest locks"; }
t_mmap() { mkdir -p "$W/basic" && $VT mmap "$W/basic/mmap" || die "vfstest mmap"; }
t_statfs() {
    $VT statfs "$M" "$W/statfs.txt" || die "vfstest statfs"
    df "$M" >/dev/null || die "df"
}
t_sparse() { mkdir -p "$W/sparse" && $VT sparse "$W/sparse/big" || die "vfstest sparse"; }
t_seek_data_hole() { $VT seekdata "$W/sparse/big" || die "vfstest seekdata"; }
t_seek_edges() { mkdir -p "$W/sparse" && $VT seekedges "$W/sparse/edges" || die "vfstest seekedges"; }
t_unlink_open() { mkdir "$W/unlink" && $VT unlinkopen "$W/unlink" || die "vfstest unlinkopen"; }
t_special() { mkdir "$W/special" && $VT special "$W/special" || die "vfstest special"; }
t_direct_io() { mkdir -p "$W/basic" && $VT direct "$W/basic/direct" || die "vfstest direct"; }
t_busy_text() { mkdir -p "$W/basic" && $VT busytext "$W/basic/busytext" || die "vfstest busytext"; }

t_fio_verify() {
    d=$W/fio
    mkdir -p "$d"
    fio --name=seq --directory="$d" --size=16m --bs=64k --rw=write --ioengine=psync \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --output=/tmp/fio1.txt || {
        tail -n 20 /tmp/fio1.txt; die "fio psync seq write+verify"; }
    fio --name=rand --directory="$d" --size=8m --bs=4k --rw=randwrite --ioengine=libaio \
        --iodepth=4 --direct=1 --verify=crc32c --do_verify=1 --verify_fatal=1 \
        --output=/tmp/fio2.txt || { tail -n 20 /tmp/fio2.txt; die "fio libaio randwrite+verify"; }
    grep -h 'err=' /tmp/fio1.txt /tmp/fio2.txt | grep -v 'err= 0' && die "fio reported errors"
    return 0
}

t_remount() {
    dd if=/dev/urandom of="$W/remount.bin" bs=64k count=16 2>/dev/null || die "write"
    sum=$(sha256sum "$W/remount.bin" | cut -d' ' -f1)
    opts=$(param mountopts "")
    tag=$(param tag daxfsd)
    if [ -n "${E2E_REMOUNT:-}" ]; then
        cd / && sh -c "$E2E_REMOUNT" || die "remount ($E2E_REMOUNT)"
    else
        cd / && umount "$M" || die "umount"
        mount -t virtiofs ${opts:+-o "$opts"} "$tag" "$M" || die "mount again"
    fi
    eq "$(sha256sum "$W/remount.bin" | cut -d' ' -f1)" "$sum" "content after remount"
}

# Keep KERN_INFO (e.g. every drop_caches) off the console.
[ -n "${E2E_HOST:-}" ] || dmesg -n 6 2>/dev/null
echo "E2E suite on $M (xattr=$XATTR)"
ONLY_SAVED=$ONLY SKIP_SAVED=$SKIP
ONLY="" SKIP=""
check mount t_mount
ONLY=$ONLY_SAVED SKIP=$SKIP_SAVED
if [ ! -d "$W" ] || [ $HUNG -eq 1 ]; then
    echo "E2E RESULT passed=$pass failed=$fail skipped=0 (cannot set up $W)"
    exit 1
fi
check create_write_read t_create_write_read
check append t_append
check truncate t_truncate
check mkdir_rmdir t_mkdir_rmdir
check readdir_1000 t_readdir_1000
check rename t_rename
check hardlinks t_hardlinks
check symlinks t_symlinks
check chmod_chown t_chmod_chown
check utimes t_utimes
check time_edges t_time_edges
check xattr t_xattr
check fcntl_flock_locks t_locks
check mmap_shared t_mmap
check statfs t_statfs
check sparse_large_file t_sparse
check seek_data_hole t_seek_data_hole
check seek_edges t_seek_edges
check unlink_open_file t_unlink_open
check special_files t_special
check direct_io t_direct_io
check busy_text t_busy_text
check fio_verify t_fio_verify
check remount t_remount
echo "E2E RESULT passed=$pass failed=$fail skipped=$skip${failed:+ (failed:$failed)}"
[ "$fail" -eq 0 ]
