#!/usr/bin/env bash
# shellcheck disable=SC2015 # "grep && ok || bad": ok never fails
# I/O whose buffer is a DAX mapping (issue #43; what fstests generic/638 and generic/708 do):
# QEMU 11.1 (profile dax, TCG), `-o dax=always`, 64 MiB window, once per mapping mode
# (--dax-mapping pooled, the default, and direct), the guest kernel's default policy.
#
#   tests/e2e/dax-buffers.sh [-v] [-d DAEMON] [--mode pooled|direct]
#
# -d picks the daemon binary (scripts/vm.sh -d; default target/debug/daxfsd); --mode runs one
# mode only. The guest runs tests/e2e/guest/daxbuf.c (built here with gcc -static, run from
# the share):
#   overlap_<mode>  t_mmap_writev_overlap: a pwritev from a DAX mapping of two pages back into
#                   the same file, extending it over a page that is also a source (FUSE_WRITE
#                   with data descriptors in the window)
#   dio_<mode>      an O_DIRECT write of a new file from a DAX mapping of another, touched
#                   first (1 MiB, more than one mapped range)
#   read_<mode>     a read of a file never read before (FUSE_READ) into a writable DAX mapping
#                   of another file, at an odd offset
# Each passes when the guest reads the right bytes back, the host file after the VM exits holds
# them byte for byte, and the daemon logged no malformed descriptor chain.
# Ends with "e2e-dax-buffers: N passed, M failed"; exits non-zero on any failure.
set -euo pipefail
RIG_TAG=e2e-dax-buffers
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$RIG_ROOT"

verbose=() daemon=() modes=(pooled direct)
while (($#)); do
    case $1 in
        -v) verbose=(-v); shift ;;
        -d) [[ -n ${2:-} ]] || die "-d needs a daemon"; daemon=(-d "$2"); shift 2 ;;
        --mode) [[ ${2:-} == pooled || ${2:-} == direct ]] || die "--mode needs pooled or direct"
            modes=("$2"); shift 2 ;;
        *) die "unknown argument '$1' (use -v, -d DAEMON, --mode pooled|direct)" ;;
    esac
done
need_cmd gcc

work=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-e2e-dax-buffers.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
logs="$DAXFSD_CACHE/logs"
mkdir -p "$logs"
gcc -static -O2 -Wall -Wextra -Werror -o "$work/daxbuf" tests/e2e/guest/daxbuf.c ||
    die "compiling tests/e2e/guest/daxbuf.c failed"

checks=(overlap dio read)
files=(overlap dio-dst read-target)
for mode in "${modes[@]}"; do
    share=$work/share-$mode
    mkdir -p "$share"
    cp "$work/daxbuf" "$share/daxbuf"
    cat >"$work/run-$mode.sh" <<'EOF'
for c in overlap dio read; do check "$c" /mnt/daxbuf "$c" /mnt; done
guest_end
EOF
    logf="$logs/e2e-dax-buffers-$mode-$(date +%Y%m%d-%H%M%S)-$$.log"
    log "$mode: dax=always, 64 MiB window"
    rc=0
    scripts/vm.sh "${verbose[@]}" "${daemon[@]}" -p dax --cache auto -a --dax-window=64M -a "--dax-mapping=$mode" \
        -o dax=always -s "$share" --script "$work/run-$mode.sh" -m 1G -T 600 -l "$logf" >"$work/out-$mode.txt" || rc=$?
    grep -a '^daxbuf:' "$work/out-$mode.txt" || true
    guest_complete "guest_$mode" "$work/out-$mode.txt" "$rc"
    dlog=${logf%.log}.daemon.log
    malformed=$(grep -ac 'malformed descriptor chain' "$dlog" 2>/dev/null || true)
    for i in "${!checks[@]}"; do
        c=${checks[$i]} f=$share/${files[$i]}
        if ((rc == 0)) && grep -q "^GUEST PASS $c\$" "$work/out-$mode.txt" && [[ -s $f.want ]] &&
            cmp -s "$f" "$f.want" && ((${malformed:-0} == 0)); then
            ok "${c}_$mode"
        else
            why=$(grep -a "^daxbuf: $c:" "$work/out-$mode.txt" | head -n 1 || true)
            bad "${c}_$mode" "vm rc=$rc, ${why:-guest check ran}, host file $(cmp "$f" "$f.want" 2>&1 | head -n 1 || true), ${malformed:-0} malformed chains in the daemon log (see $logf)"
        fi
    done
done

rig_summary e2e-dax-buffers
