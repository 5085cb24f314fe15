#!/usr/bin/env bash
# virtme-ng 1.42 (PyPI) booting the project's guest kernel with the daemon found as
# `virtiofsd` in PATH: `vng --run KERNEL --disable-kvm --rwdir DIR --exec CMD` shares the
# host root read-only and DIR read-write over virtio-fs (it silently falls back to 9p if
# the daemon does not start the way virtiofsd does). The guest reads a host file and
# writes into DIR; the host checks.
#
#   RUN_DIR=DIR tests/launchers/vng.sh DAEMON-BINARY NAME
#
# Installs virtme-ng into $DAXFSD_CACHE/virtme-ng-1.42 (a venv, pip) and udev (apt; the
# guest's init runs the host's udevd) when missing. Prints CHECK PASS/FAIL lines.
set -euo pipefail
RIG_TAG=vng
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
bin=$1 name=$2
VNG_VERSION=1.42
venv=$DAXFSD_CACHE/virtme-ng-$VNG_VERSION
have=""
[[ -x $venv/bin/vng ]] && have=$("$venv/bin/pip" show virtme-ng 2>/dev/null | sed -n 's/^Version: //p')
if [[ $have != "$VNG_VERSION" ]]; then
    log "installing virtme-ng $VNG_VERSION (pip, into $venv)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "virtme-ng==$VNG_VERSION"
fi
need_cmd udevadm udev
kernel=$("$RIG_ROOT/guest-kernel/build.sh" --print-path)
work=$(mktemp -d "${RUN_DIR:-/tmp}/vng-$name.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
mkdir -p "$work/bin" "$work/rw"
ln -s "$bin" "$work/bin/virtiofsd"
echo "host marker $name $$" >"$work/host-file"

rc=0
(cd "$work" && PATH="$work/bin:$venv/bin:$PATH" timeout 300 vng --run "$kernel" --disable-kvm \
    --rwdir "$work/rw" --verbose \
    --exec "cat $work/host-file; grep ' $work/rw ' /proc/mounts; echo 'written by the guest' > $work/rw/from-guest") \
    >"$work/out" 2>&1 || rc=$?
out=$work/out
result() { # result NAME STATUS
    check "vng/$name $1" "$2" "vng rc=$rc; $(grep -a 'virtiofsd\|fallback\|rror\|panic' "$out" | tail -n 3 | cut -c1-200 | tr '\n' ' ')"
}
# vng falls back to 9p silently (without --verbose's message on some paths): look at what
# the guest kernel was told to mount.
grep -aq 'rootfstype=virtiofs ' "$out" && s=0 || s=$?; result "the daemon started as virtiofsd (no fallback to 9p)" "$s"
grep -aq 'Mounted root (virtiofs filesystem) readonly' "$out" && s=0 || s=$?; result "host root mounted read-only over virtio-fs" "$s"
grep -aq "host marker $name $$" "$out" && s=0 || s=$?; result "guest reads a host file" "$s"
grep -aq " $work/rw virtiofs " "$out" && s=0 || s=$?; result "--rwdir is a virtio-fs mount" "$s"
[[ $(cat "$work/rw/from-guest" 2>/dev/null) == "written by the guest" ]] && s=0 || s=$?; result "host sees the guest's file in the rwdir" "$s"
sleep 0.5
pgrep -f -- "--shared-dir $work/rw" >/dev/null && s=1 || s=0; result "no daemon left after vng exits" "$s"
rig_summary "vng/$name"
