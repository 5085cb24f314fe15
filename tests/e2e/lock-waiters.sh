#!/usr/bin/env bash
# Lock waiters in a guest against the capacity that ends their wait (issue #37, item 3): one
# guest process holds an fcntl write lock on a file of a share on overlayfs (FLUSH is a long
# request there), 80 others wait with F_SETLKW (more than the daemon's 64 lock-wait threads),
# then the holder closes the file. Its FLUSH must be served and every waiter must get the lock
# in turn within 60 s (`vfstest lockwaiters`). daxfsd --posix-lock --cache=auto, profile pci.
#
#   tests/e2e/lock-waiters.sh [-d DAEMON]
# Ends with "e2e-lock-waiters: N passed, M failed".
set -euo pipefail
RIG_TAG=e2e-lock-waiters
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$RIG_ROOT"
# ok, bad and rig_summary come from scripts/lib.sh.

daemon=daxfsd
while (($#)); do
    case $1 in
        -d) (($# >= 2)) || die "-d needs a value"; daemon=$2; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
(($(id -u) == 0)) || die "run as root (mounts overlayfs)"

WAITERS=80 BOUND=60
work=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-e2e-lock-waiters.XXXXXX")
cleanup() {
    if grep -q " $work/share " /proc/mounts; then umount -l "$work/share" 2>/dev/null || true; fi
    rm -rf -- "$work"
}
trap cleanup EXIT
mkdir -p "$work/lower" "$work/upper" "$work/work" "$work/share"
mount -t overlay overlay -o "lowerdir=$work/lower,upperdir=$work/upper,workdir=$work/work" "$work/share" ||
    die "cannot mount overlayfs on $work/share"

log "$WAITERS F_SETLKW waiters in a guest, share on overlayfs"
rc=0
out=$(scripts/vm.sh -p pci -d "$daemon" --cache auto -a --posix-lock -s "$work/share" \
    -l "$work/console.log" -T $((BOUND + 140)) \
    -c "/e2e/vfstest lockwaiters /mnt/lockfile $WAITERS $BOUND" 2>"$work/vm.err") || rc=$?
if ((rc == 0)) && [[ $out == *"LOCKWAITERS OK n=$WAITERS "* ]]; then
    ok "guest_lock_waiters_on_overlayfs ($(grep -o 'LOCKWAITERS OK.*' <<<"$out"))"
elif ((rc == 124)); then
    # The holder's close waits for its FLUSH uninterruptibly: the guest's own bound cannot fire.
    bad "guest_lock_waiters_on_overlayfs" "the guest hung (VM killed after $((BOUND + 140)) s): $(grep -m1 -o 'LOCKWAITERS.*' "$work/console.log" || true)"
else
    bad "guest_lock_waiters_on_overlayfs" "rc=$rc: $(tail -n 3 <<<"$out") $(tail -n 2 "$work/vm.err")"
fi
rig_summary e2e-lock-waiters
