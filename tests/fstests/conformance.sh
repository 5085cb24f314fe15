#!/usr/bin/env bash
# `make conformance` (not in `make test`): a broader fstests list (tests/fstests/conformance.list)
# on more configurations, each compared with ext4 on virtio-blk in the same guest, and upstream
# virtiofsd 1.14 as the peer; prints a table (passed / failed / not run per configuration).
#
#   tests/fstests/conformance.sh [-f LIST] [--configs "NAME..."] [--backing LIST] [--out DIR]
#
# --backing ext4,xfs,btrfs,tmpfs,overlay,nfs (default plain): run every configuration once per
# host file system under the shares (tests/fstests/run.sh --backing), named CONFIG@BACKING
# (plain keeps the bare name). A backing this host cannot provide (e.g. no NFS server in its
# kernel) fails the run, with the reason, in the checks and under the table.
# --keep: a configuration whose results are already in --out DIR is not run again (runs made
# separately, e.g. in parallel, assembled into one verdict and table). --report-only: run
# nothing, judge and tabulate what --out DIR holds (a configuration without results there is a
# failed check, listed under the table).
#
# Configurations (all with --xattr; the first one's guest, on the first backing, also runs the
# list on ext4 on virtio-blk: the reference for every backing):
#   daxfsd-auto daxfsd-never daxfsd-always   --cache=MODE, vhost-user-fs-pci
#   daxfsd-dax-pooled daxfsd-dax-direct      --cache=auto, 256M window, -o dax=always, QEMU 11.1
#   virtiofsd-auto virtiofsd-never virtiofsd-always
# and, by name only: daxfsd-never-acl-kp (--cache=never --posix-acl --killpriv-v2: the ACL
# tests and set-uid clearing with the daemon handling them).
# Under TCG each configuration takes about as long as the list (1-3 hours for the default list
# on all eight). Status 1 when a test that passes on ext4 fails on daxfsd outside
# tests/fstests/accepted.list, or when a test passes on virtiofsd and fails on daxfsd in the
# same cache mode (and backing).
set -euo pipefail
RIG_TAG=fstests-conformance
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
HERE=$RIG_ROOT/tests/fstests
# shellcheck source=compare.sh
source "$HERE/compare.sh"

list=$HERE/conformance.list outdir="" backings=plain keep=0 report_only=0
configs="daxfsd-auto daxfsd-never daxfsd-always daxfsd-dax-pooled daxfsd-dax-direct virtiofsd-auto virtiofsd-never virtiofsd-always"
while (($#)); do
    case $1 in
        -f) (($# >= 2)) || die "-f needs a file"; list=$2; shift 2 ;;
        --configs) (($# >= 2)) || die "--configs needs names"; configs=$2; shift 2 ;;
        --backing) (($# >= 2)) || die "--backing needs names"; backings=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --report-only) keep=1 report_only=1; shift ;;
        --out) (($# >= 2)) || die "--out needs a directory"; outdir=$2; shift 2 ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ -n $outdir ]] || outdir=$DAXFSD_CACHE/fstests/results/conformance-$(date +%Y%m%d-%H%M%S)
mkdir -p "$outdir"
read -r -a bases <<<"$configs"
IFS=, read -r -a backs <<<"$backings"
((${#backs[@]})) || die "--backing needs at least one name"
for b in "${backs[@]}"; do
    case $b in plain|ext4|xfs|btrfs|tmpfs|overlay|nfs) ;; *) die "unknown backing '$b'" ;; esac
done
names=()
for b in "${backs[@]}"; do
    for cfg in "${bases[@]}"; do
        if [[ $b == plain ]]; then names+=("$cfg"); else names+=("$cfg@$b"); fi
    done
done
first=1 ref="" unavailable=()
declare -A norun=()
for cfg in "${names[@]}"; do
    base=${cfg%@*} back=plain
    [[ $cfg == *@* ]] && back=${cfg#*@}
    args=(-n "$cfg" -f "$list" --out "$outdir/$cfg" -T 14400 -a --xattr -b "$back")
    case $base in
        daxfsd-auto|daxfsd-never|daxfsd-always) args+=(-d daxfsd --cache "${base#daxfsd-}") ;;
        daxfsd-never-acl-kp) args+=(-d daxfsd --cache never -a --posix-acl -a --killpriv-v2) ;;
        daxfsd-dax-pooled) args+=(-d daxfsd -p dax --cache auto -a --dax-window=256M -o dax=always) ;;
        daxfsd-dax-direct) args+=(-d daxfsd -p dax --cache auto -a --dax-window=256M -a --dax-mapping=direct -o dax=always) ;;
        virtiofsd-auto|virtiofsd-never|virtiofsd-always) args+=(-d virtiofsd --cache "${base#virtiofsd-}") ;;
        *) die "unknown configuration '$cfg'" ;;
    esac
    if ((first)); then args+=(--ext4); ref=$outdir/$cfg.txt; first=0; fi
    if ((keep)) && grep -q '^FSTESTS ' "$outdir/$cfg.txt" 2>/dev/null; then
        log "configuration $cfg: results kept from $outdir/$cfg.txt"
        continue
    fi
    if ((report_only)); then
        why=$(grep -a 'FAIL: ' "$outdir/$cfg.log" 2>/dev/null | tail -n 1 | sed 's/^.*FAIL: //' || true)
        bad "fstests-conformance/$cfg/run" "no results in $outdir/$cfg.txt (--report-only)${why:+: $why}"
        unavailable+=("$cfg: ${why:-no results (not run in this assembly)}") norun[$cfg]=1
        continue
    fi
    log "configuration $cfg"
    rc=0 t0=$SECONDS
    "$HERE/run.sh" "${args[@]}" >"$outdir/$cfg.txt" 2> >(tee "$outdir/$cfg.log" >&2) || rc=$?
    grep '^FSTESTS ' "$outdir/$cfg.txt" >&2 || true
    log "configuration $cfg: status $rc after $((SECONDS - t0))s"
    echo "$cfg $((SECONDS - t0))" >>"$outdir/times.txt"
    if ((rc == 125)); then
        sleep 1 # the tee of its stderr
        why=$(grep -a 'FAIL: ' "$outdir/$cfg.log" | tail -n 1 | sed 's/^.*FAIL: //')
        bad "fstests-conformance/$cfg/rig" "no run: ${why:-see $outdir/$cfg.log}"
        unavailable+=("$cfg: ${why:-rig failure, see $cfg.log}") norun[$cfg]=1
    fi
done

for cfg in "${names[@]}"; do
    [[ $cfg == daxfsd-* ]] || continue
    [[ -z ${norun[$cfg]:-} ]] || continue # failed above
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
have=()
for cfg in "${names[@]}"; do [[ -r $outdir/$cfg.txt ]] && have+=("$cfg"); done
"$HERE/report.sh" "$outdir" "$outdir/table.md" "$outdir/table.json" "${have[@]}" ||
    bad "fstests-conformance/report" "no markdown/JSON table (see above)"
if ((${#unavailable[@]})); then
    {
        echo
        echo "Not run (each is a failed check):"
        printf -- '- %s\n' "${unavailable[@]}"
    } | tee -a "$outdir/table.txt" "$outdir/table.md"
fi
echo "tables: $outdir/table.md $outdir/table.json (commit them under bench/results/)"
echo "results: $outdir"
rig_summary fstests-conformance
