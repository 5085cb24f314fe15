#!/usr/bin/env bash
# `make conformance` (not in `make test`): a broader fstests list (tests/fstests/conformance.list)
# on more configurations, each compared with ext4 on virtio-blk in the same guest, and upstream
# virtiofsd 1.14 as the peer; prints a table (passed / failed / not run per configuration).
#
#   tests/fstests/conformance.sh [-f LIST] [--configs "NAME..."] [--out DIR]
#
# Configurations (all with --xattr; the first one's guest also runs the list on ext4):
#   daxfsd-auto daxfsd-never daxfsd-always   --cache=MODE, vhost-user-fs-pci
#   daxfsd-dax-pooled daxfsd-dax-direct      --cache=auto, 256M window, -o dax=always, QEMU 11.1
#   virtiofsd-auto virtiofsd-never virtiofsd-always
# and, by name only: daxfsd-never-acl-kp (--cache=never --posix-acl --killpriv-v2: the ACL
# tests and set-uid clearing with the daemon handling them).
# Under TCG each configuration takes about as long as the list (1-3 hours for the default list
# on all eight). Status 1 when a test that passes on ext4 fails on daxfsd outside
# tests/fstests/accepted.list, or when a test passes on virtiofsd and fails on daxfsd in the
# same cache mode.
set -euo pipefail
RIG_TAG=fstests-conformance
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
HERE=$RIG_ROOT/tests/fstests
# shellcheck source=compare.sh
source "$HERE/compare.sh"

list=$HERE/conformance.list outdir=""
configs="daxfsd-auto daxfsd-never daxfsd-always daxfsd-dax-pooled daxfsd-dax-direct virtiofsd-auto virtiofsd-never virtiofsd-always"
while (($#)); do
    case $1 in
        -f) (($# >= 2)) || die "-f needs a file"; list=$2; shift 2 ;;
        --configs) (($# >= 2)) || die "--configs needs names"; configs=$2; shift 2 ;;
        --out) (($# >= 2)) || die "--out needs a directory"; outdir=$2; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ -n $outdir ]] || outdir=$DAXFSD_CACHE/fstests/results/conformance-$(date +%Y%m%d-%H%M%S)
mkdir -p "$outdir"
read -r -a names <<<"$configs"
first=1 ref=""
for cfg in "${names[@]}"; do
    args=(-n "$cfg" -f "$list" --out "$outdir/$cfg" -T 14400 -a --xattr)
    case $cfg in
        daxfsd-auto|daxfsd-never|daxfsd-always) args+=(-d daxfsd --cache "${cfg#daxfsd-}") ;;
        daxfsd-never-acl-kp) args+=(-d daxfsd --cache never -a --posix-acl -a --killpriv-v2) ;;
        daxfsd-dax-pooled) args+=(-d daxfsd -p dax --cache auto -a --dax-window=256M -o dax=always) ;;
        daxfsd-dax-direct) args+=(-d daxfsd -p dax --cache auto -a --dax-window=256M -a --dax-mapping=direct -o dax=always) ;;
        virtiofsd-auto|virtiofsd-never|virtiofsd-always) args+=(-d virtiofsd --cache "${cfg#virtiofsd-}") ;;
        *) die "unknown configuration '$cfg'" ;;
    esac
    if ((first)); then args+=(--ext4); ref=$outdir/$cfg.txt; first=0; fi
    log "configuration $cfg"
    rc=0
    "$HERE/run.sh" "${args[@]}" >"$outdir/$cfg.txt" || rc=$?
    grep '^FSTESTS ' "$outdir/$cfg.txt" >&2 || true
    log "configuration $cfg: status $rc"
done

for cfg in "${names[@]}"; do
    [[ $cfg == daxfsd-* ]] || continue
    compare_config "$cfg" "$outdir/$cfg.txt" "$ref" "$HERE/accepted.list" >"$outdir/$cfg.verdict"
    grep -E '^(CHECK FAIL|INFO .*accepted)' "$outdir/$cfg.verdict" || true
    # The peer: a test virtiofsd passes in the same cache mode must pass on daxfsd.
    peer=virtiofsd-${cfg#daxfsd-}
    [[ -f $outdir/$peer.txt ]] || continue
    while read -r _ _ _ t s _; do
        [[ $s == passed ]] || continue
        grep -q "^FSTEST $cfg virtiofs $t passed" "$outdir/$cfg.txt" ||
            bad "fstests/$cfg/$t/peer" "passes on virtiofsd ($peer), not on daxfsd"
    done < <(grep "^FSTEST $peer virtiofs " "$outdir/$peer.txt")
done
echo
print_table "$outdir" "${names[@]}" | tee "$outdir/table.txt"
"$HERE/report.sh" "$outdir" "$outdir/table.md" "$outdir/table.json" "${names[@]}" ||
    bad "fstests-conformance/report" "no markdown/JSON table (see above)"
echo "tables: $outdir/table.md $outdir/table.json (commit them under bench/results/)"
echo "results: $outdir"
rig_summary fstests-conformance
