#!/usr/bin/env bash
# End-to-end tests with the tools that launch virtiofsd, each run against daxfsd and
# against upstream virtiofsd 1.14 (proof that the test observes the real thing):
#   cmdline  Kata (Go runtime, runtime-rs) and podman machine command lines, QEMU guest
#   libvirt  libvirt 9.0 (`virsh create`), installed with apt by libvirt.sh
#   vng      virtme-ng 1.42 from PyPI (`vng --run`), installed with pip by vng.sh
#   probe    what launchers probe: --version, --help (virtme-ng greps --readonly),
#            --print-capabilities (libvirt)
#   options  guest checks of --xattrmap and --translate-uid/--translate-gid (QEMU guest)
#   install  (daxfsd only) `make install DESTDIR=...`: the vhost-user descriptor that
#            libvirt and lima read, the binary it names, the man page
# Each guest mounts the share, reads a file the host wrote and writes one the host checks.
#
#   tests/launchers/run.sh [--only probe,cmdline,libvirt,vng,options,install] [--daemons "daxfsd virtiofsd"]
#
# Ends with "launchers: N passed, M failed" and exits non-zero on any failure, also when
# libvirt.sh or vng.sh dies part way or runs fewer checks than it must (run_subsuite).
set -euo pipefail
RIG_TAG=launchers
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
here=$RIG_ROOT/tests/launchers

only="probe cmdline libvirt vng options install" daemons="daxfsd virtiofsd"
while (($#)); do
    case $1 in
        --only) only=${2//,/ }; shift 2 ;;
        --daemons) daemons=$2; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

daemon_bin() { # daemon_bin NAME: path of daxfsd ($DAXFSD, default the debug build) or virtiofsd
    case $1 in
        daxfsd)
            local b=${DAXFSD:-$RIG_ROOT/target/debug/daxfsd}
            [[ -x $b ]] || die "no daxfsd at $b; run 'make build' (or set DAXFSD)"
            echo "$b" ;;
        virtiofsd) "$RIG_ROOT/scripts/provision-virtiofsd.sh" 2>/dev/null ;;
        *) die "unknown daemon '$1'" ;;
    esac
}
export -f daemon_bin

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-launchers.XXXXXX")
trap 'rm -rf -- "$run_dir"' EXIT
# The guest's part, run in the mounted share.
GUEST_CMD='cat from-host.txt && echo "written by the guest" > from-guest.txt && sync'

cmdline_case() { # cmdline_case CASE DAEMON
    local c=$1 d=$2 share=$run_dir/$1-$2 out err rc=0
    mkdir -p "$share"
    echo "host file for $c/$d" >"$share/from-host.txt"
    out=$run_dir/$c-$d.out err=$run_dir/$c-$d.err
    : >"$err"
    LAUNCHER_CASE=$c LAUNCHER_BIN=$(daemon_bin "$d") LAUNCHER_ERR=$err TMPDIR=$run_dir \
        "$RIG_ROOT/scripts/vm.sh" -p pci -d "$here/cmdline.sh" -s "$share" -T 300 \
        -c "$GUEST_CMD" >"$out" 2>"$out.log" || rc=$?
    grep -q "host file for $c/$d" "$out" && s=0 || s=$?; check "$c/$d: guest reads the host's file" "$s" "vm.sh rc=$rc; $(tail -n 5 "$out.log" | tr '\n' ' ')"
    [[ $(cat "$share/from-guest.txt" 2>/dev/null) == "written by the guest" ]] && s=0 || s=$?
    check "$c/$d: host sees the guest's file" "$s"
    if [[ $c == kata-rs ]]; then
        grep -q 'Waiting for vhost-user socket connection\.\.\.' "$err" && s=0 || s=$?
        check "$c/$d: 'Waiting for vhost-user socket connection...' on stderr" "$s"
    fi
}

t0=$SECONDS
for part in $only; do
    case $part in
        cmdline)
            "$RIG_ROOT/guest-kernel/build.sh" >/dev/null
            "$RIG_ROOT/scripts/build-initramfs.sh" >/dev/null
            for d in $daemons; do
                for c in kata-go kata-rs podman; do
                    log "cmdline: $c with $d"
                    cmdline_case "$c" "$d"
                done
            done ;;
        probe)
            for d in $daemons; do
                b=$(daemon_bin "$d")
                "$b" --version >"$run_dir/v" 2>&1 && s=0 || s=$?; check "probe/$d: --version ($(head -n1 "$run_dir/v"))" "$s"
                "$b" --help 2>&1 | grep -q -- '--readonly' && s=0 || s=$?; check "probe/$d: --help lists --readonly" "$s"
                "$b" --print-capabilities | python3 -c 'import json,sys; c=json.load(sys.stdin); assert c["type"] == "fs" and isinstance(c["features"], list), c' 2>"$run_dir/caps" && s=0 || s=$?
                check "probe/$d: --print-capabilities is vhost-user JSON of type fs" "$s" "$(tail -n1 "$run_dir/caps")"
            done ;;
        options)
            for d in $daemons; do
                b=$(daemon_bin "$d")
                # --xattrmap: every guest name lives under user.virtiofs. on the host.
                share=$run_dir/xattrmap-$d
                mkdir -p "$share"
                rc=0
                TMPDIR=$run_dir "$RIG_ROOT/scripts/vm.sh" -p pci -d "$b" -s "$share" -T 300 \
                    -a "--xattrmap=:map::user.virtiofs.:" \
                    -c '/e2e/vfstest xattr /mnt/x on && echo XATTR-CHECKS-OK' \
                    >"$run_dir/xm-$d.out" 2>"$run_dir/xm-$d.log" || rc=$?
                grep -q XATTR-CHECKS-OK "$run_dir/xm-$d.out" && s=0 || s=$?
                check "options/$d: guest xattr checks pass through --xattrmap" "$s" "vm.sh rc=$rc $(tail -n 3 "$run_dir/xm-$d.out" | tr '\n' ' ')"
                python3 - "$share/x" <<'PY' && s=0 || s=$?
import os, sys
p = sys.argv[1]
names = os.listxattr(p)
assert os.getxattr(p, "user.virtiofs.user.daxfsd") == b"value", names
assert "user.daxfsd" not in names, names
PY
                check "options/$d: the host has the guest's user.daxfsd as user.virtiofs.user.daxfsd" "$s"
                # --translate-uid/gid: guest root is host 4242:4343.
                share=$run_dir/translate-$d
                mkdir -p "$share"
                chmod 0777 "$share"
                echo host >"$share/hostowned"
                chown 4242:4343 "$share/hostowned"
                rc=0
                TMPDIR=$run_dir "$RIG_ROOT/scripts/vm.sh" -p pci -d "$b" -s "$share" -T 300 \
                    -a --translate-uid=map:0:4242:1 -a --translate-gid=map:0:4343:1 \
                    -c 'echo guest > made && stat -c "OWNER %n %u:%g" made hostowned' \
                    >"$run_dir/tr-$d.out" 2>"$run_dir/tr-$d.log" || rc=$?
                grep -q 'OWNER made 0:0' "$run_dir/tr-$d.out" && grep -q 'OWNER hostowned 0:0' "$run_dir/tr-$d.out" && s=0 || s=$?
                check "options/$d: the guest sees host 4242:4343 as 0:0" "$s" "vm.sh rc=$rc $(grep OWNER "$run_dir/tr-$d.out" | tr '\n' ' ')"
                [[ $(stat -c %u:%g "$share/made" 2>/dev/null) == 4242:4343 ]] && s=0 || s=$?
                check "options/$d: a file the guest's root creates is 4242:4343 on the host" "$s" "$(stat -c %u:%g "$share/made" 2>&1)"
            done ;;
        install)
            dest=$run_dir/destdir
            make -s -C "$RIG_ROOT" install DESTDIR="$dest" PREFIX=/usr >"$run_dir/install.log" 2>&1 && s=0 || s=$?
            check "install: make install DESTDIR PREFIX=/usr" "$s" "$(tail -n 3 "$run_dir/install.log" | tr '\n' ' ')"
            json=$dest/usr/share/qemu/vhost-user/50-daxfsd.json
            python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["type"] == "fs" and d["binary"] == "/usr/bin/daxfsd", d' "$json" 2>"$run_dir/json" && s=0 || s=$?
            check "install: share/qemu/vhost-user/50-daxfsd.json names /usr/bin/daxfsd, type fs" "$s" "$(tail -n1 "$run_dir/json")"
            "$dest/usr/bin/daxfsd" --version | grep -q '^daxfsd ' && s=0 || s=$?; check "install: the installed binary runs" "$s"
            man -l "$dest/usr/share/man/man1/daxfsd.1" 2>/dev/null | grep -q -- '--shared-dir' ||
                grep -q 'shared\\-dir' "$dest/usr/share/man/man1/daxfsd.1" && s=0 || s=$?
            check "install: man page daxfsd.1 (from the clap definitions)" "$s" ;;
        libvirt|vng)
            # libvirt: 6 variants x 2 checks; vng: 6 checks.
            min=6; [[ $part == libvirt ]] && min=12
            for d in $daemons; do
                log "$part with $d"
                run_subsuite "$part/$d" "$run_dir/$part-$d.txt" "$min" -- \
                    env RUN_DIR="$run_dir" "$here/$part.sh" "$(daemon_bin "$d")" "$d"
            done ;;
        *) die "unknown part '$part' (probe, cmdline, libvirt, vng, options, install)" ;;
    esac
done
log "done in $((SECONDS - t0))s"
rig_summary launchers
