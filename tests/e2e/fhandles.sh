#!/usr/bin/env bash
# Descriptors a daemon holds after a guest walks a tree of 10,100 inodes (100 directories of
# 100 files): `ls -lR` in a guest (profile pci, --cache auto: the guest keeps every inode),
# then the host counts /proc/<daemon>/fd while the guest waits. With O_PATH descriptors
# (--inode-file-handles=never) the daemon holds one per inode; with file handles (prefer,
# the default of both daemons as root) almost none (daxfsd keeps the descriptors of the 128
# handle inodes used last open, so at most 128 more). daxfsd and virtiofsd 1.14 side by side.
#
#   tests/e2e/fhandles.sh
# Prints one line per run and ends with "e2e-fhandles: N passed, M failed".
set -euo pipefail
RIG_TAG=e2e-fhandles
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$RIG_ROOT"

DIRS=100 FILES=100
INODES=$((DIRS * (FILES + 1)))
# ok, bad, check and rig_summary come from scripts/lib.sh.

work=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-e2e-fhandles.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
share=$work/share
for d in $(seq 0 $((DIRS - 1))); do
    mkdir -p "$share/d$d"
    (cd "$share/d$d" && for f in $(seq 0 $((FILES - 1))); do : >"f$f"; done)
done
# The guest walks the share, then waits until the host has counted the daemon's descriptors
# (check, waitfor and guest_end: tests/e2e/guest/lib.sh, sent by scripts/vm.sh).
cat >"$work/guest.sh" <<'EOF'
n=$(ls -lR /mnt | grep -c "^-")
echo "WALKED $n"
check walked [ "$n" -gt 0 ]
check host_counted waitfor /mnt/fds-counted 120
guest_end
EOF

# run NAME DAEMON MODE: fds of the daemon after the walk.
run() {
    local name=$1 daemon=$2 mode=$3 log=$work/$1.log rc=0
    : >"$log"
    scripts/vm.sh -p pci -d "$daemon" -a --sandbox=none -a "--inode-file-handles=$mode" \
        -s "$share" --script "$work/guest.sh" --monitor "$work/$name.mon" -l "$log" -T 240 \
        >"$work/$name.out" 2>&1 &
    local vm=$!
    for _ in $(seq 200); do
        grep -q 'WALKED' "$log" 2>/dev/null && break
        kill -0 "$vm" 2>/dev/null || break
        sleep 1
    done
    local pid fds walked
    pid=$(cat "$work/$name.mon.daemon-pid" 2>/dev/null || echo 0)
    walked=$(grep -a -o 'WALKED [0-9]*' "$log" | head -n1 | cut -d' ' -f2)
    # (0 when the daemon is gone: the guest ended early, which guest_complete reports.)
    fds=$({ find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null || true; } | wc -l)
    touch "$share/fds-counted"
    for _ in $(seq 120); do kill -0 "$vm" 2>/dev/null || break; sleep 0.5; done
    # A guest that did not finish: vm.sh stops QEMU and the daemon when killed.
    kill "$vm" 2>/dev/null || true
    wait "$vm" 2>/dev/null || rc=$?
    rm -f "$share/fds-counted"
    guest_complete "$name/guest" "$work/$name.out" "$rc"
    printf '%-22s daemon %-9s --inode-file-handles=%-9s files seen %-6s descriptors %s\n' \
        "$name" "$daemon" "$mode" "${walked:-?}" "$fds"
    eval "${name}_fds=$fds ${name}_walked=${walked:-0}"
}

run daxfsd_never daxfsd never
run daxfsd_prefer daxfsd prefer
run daxfsd_mandatory daxfsd mandatory
run virtiofsd_never virtiofsd never
run virtiofsd_prefer virtiofsd prefer
files=$((DIRS * FILES))
# shellcheck disable=SC2154 # set by run through eval
for n in daxfsd_never daxfsd_prefer daxfsd_mandatory virtiofsd_never virtiofsd_prefer; do
    w=${n}_walked
    if [[ ${!w} == "$files" ]]; then ok "${n}_walked"; else bad "${n}_walked" "the guest saw ${!w} files, not $files"; fi
done
# shellcheck disable=SC2154
{
    if ((daxfsd_never_fds >= INODES)); then ok daxfsd_fds_per_inode; else bad daxfsd_fds_per_inode "$daxfsd_never_fds < $INODES"; fi
    if ((daxfsd_prefer_fds < 100 + 128)); then ok daxfsd_prefer_few_fds; else bad daxfsd_prefer_few_fds "$daxfsd_prefer_fds"; fi
    if ((daxfsd_mandatory_fds < 100 + 128)); then ok daxfsd_mandatory_few_fds; else bad daxfsd_mandatory_few_fds "$daxfsd_mandatory_fds"; fi
    if ((virtiofsd_never_fds >= INODES)); then ok virtiofsd_fds_per_inode; else bad virtiofsd_fds_per_inode "$virtiofsd_never_fds < $INODES"; fi
    if ((virtiofsd_prefer_fds < 100)); then ok virtiofsd_prefer_few_fds; else bad virtiofsd_prefer_few_fds "$virtiofsd_prefer_fds"; fi
}
rig_summary e2e-fhandles
