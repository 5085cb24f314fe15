#!/usr/bin/env bash
# `make test-fstests`: the curated fstests list (tests/fstests/quick.list) on daxfsd in two
# configurations, each against ext4 on virtio-blk in the same guest kernel and root:
#   auto   --cache=auto --xattr --inode-flags, vhost-user-fs-pci (Debian's QEMU); the guest
#          also runs the list on ext4 (the reference for both configurations)
#   dax    --cache=auto --xattr --inode-flags --posix-acl --dax-window=256M (pooled mappings),
#          -o dax=always, QEMU 11.1 (the ACL tests, which auto reports as not run, run here)
# then the negative control: the harness against daemons started --readonly must fail.
#
#   tests/fstests/test.sh [-d DAEMON] [-f LIST] [--out DIR] [--no-control]
# (-f: another test list than quick.list, e.g. one test for the rig self-test)
#
# A test fails the suite when it passes on ext4 and fails (or gives no result) on daxfsd,
# unless tests/fstests/accepted.list names it for that configuration, with a reason. Tests
# that do not run on virtio-fs are counted and listed, not failed. One CHECK line per
# configuration and test (scripts/lib.sh), a table, then the usual summary and end marker.
set -euo pipefail
RIG_TAG=fstests-test
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
HERE=$RIG_ROOT/tests/fstests
# shellcheck source=compare.sh
source "$HERE/compare.sh"

daemon=daxfsd outdir="" control=1 list=$HERE/quick.list
while (($#)); do
    case $1 in
        -d|--daemon) (($# >= 2)) || die "-d needs a value"; daemon=$2; shift 2 ;;
        --out) (($# >= 2)) || die "--out needs a value"; outdir=$2; shift 2 ;;
        -f|--list) (($# >= 2)) || die "-f needs a value"; list=$2; shift 2 ;;
        --no-control) control=0; shift ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ -n $outdir ]] || outdir=$DAXFSD_CACHE/fstests/results/test-$(date +%Y%m%d-%H%M%S)
mkdir -p "$outdir"
t_start=$SECONDS

# run_config NAME RUN.SH-ARGS...: results in $outdir/NAME.txt; the status is kept, not fatal.
run_config() {
    local name=$1 rc=0
    shift
    log "configuration $name"
    "$HERE/run.sh" -n "$name" -f "$list" --out "$outdir/$name" "$@" >"$outdir/$name.txt" || rc=$?
    grep '^FSTESTS ' "$outdir/$name.txt" >&2 || true
    log "configuration $name: status $rc after $((SECONDS - t_start))s"
    # The guest program cut short (run.sh found no GUEST END): this run is incomplete (and
    # under the negative control, RIG_SUBSUITE_DIE_AFTER, it stops here).
    if grep -q '^CHECK FAIL fstests-.*/incomplete' "$outdir/$name.txt"; then
        bad "fstests/$name/incomplete" "$(sed -n 's/^CHECK FAIL fstests-[^:]*: //p' "$outdir/$name.txt" | head -n 1)"
    fi
    return 0
}

# --inode-flags: chattr for generic/545 (virtiofsd has no such option: -d virtiofsd drops it).
iflags=(-a --inode-flags)
[[ $daemon == daxfsd || $daemon == */daxfsd ]] || iflags=()
run_config auto -d "$daemon" --cache auto -a --xattr "${iflags[@]}" --ext4
run_config dax -d "$daemon" -p dax --cache auto -a --xattr "${iflags[@]}" -a --posix-acl -a --dax-window=256M -o dax=always

ref=$outdir/auto.txt
for cfg in auto dax; do
    compare_config "$cfg" "$outdir/$cfg.txt" "$ref" "$HERE/accepted.list"
done

if ((control)); then
    # Negative control: the same harness, both shares read-only. Every test that writes must
    # fail; the harness must say so with a non-zero status and failed tests.
    rc=0
    "$HERE/run.sh" -n readonly -d "$daemon" --cache auto -a --readonly -T 600 \
        generic/184 generic/258 >"$outdir/readonly.txt" 2>"$outdir/readonly.log" || rc=$?
    failed=$(sed -n 's/^FSTESTS readonly virtiofs .* failed=\([0-9]*\) .*/\1/p' "$outdir/readonly.txt")
    if ((rc == 1)) && ((${failed:-0} > 0)); then
        ok "fstests/negative-control/readonly"
    else
        bad "fstests/negative-control/readonly" "the harness passed a --readonly daemon (status $rc, failed=${failed:-none})"
    fi
fi

print_table "$outdir" auto dax
log "results in $outdir; $((SECONDS - t_start))s"
rig_summary fstests
