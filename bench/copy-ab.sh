#!/bin/bash
# DAX copy slots A/B (issue 13), side by side in one run: each guest window policy (upstream,
# hybrid) with daxfsd --dax-copy=auto and --dax-copy=off, plus no DAX, interleaved round by
# round, on the pressure section's shape (daxfsd --cache never --dax-window=64M, a 256M file:
# 4x the window). Jobs per boot: mmap randread and psync randread over the 256M file, then
# mmap randread inside the window (a 32M file). One line per boot: MiB/s per job, the daemon's
# copy-slot counters and the host's load.
# Usage: bench/copy-ab.sh [OUTDIR] (default: a new directory under ${TMPDIR:-/tmp})
# Env: ROUNDS (default 2), RUNTIME (fio seconds per job, default 5).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-2}
RUNTIME=${RUNTIME:-5}
out=${1:-$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-copy-ab.XXXXXX")}
mkdir -p "$out"
[[ -x target/release/daxfsd ]] || { echo "copy-ab: target/release/daxfsd missing; run 'make release'" >&2; exit 1; }
echo "# bench/copy-ab.sh: $(date -u +%FT%TZ), daxfsd git $(git rev-parse --short HEAD 2>/dev/null || echo '?'), rounds $ROUNDS, ${RUNTIME}s per job; MiB/s"
for round in $(seq 1 "$ROUNDS"); do
    for cfg in upstream:auto upstream:off hybrid:auto hybrid:off nodax:off; do
        pol=${cfg%%:*} mode=${cfg#*:}
        mo=dax=always,dax_policy=$pol
        [[ $pol == nodax ]] && mo=dax=never
        d=$out/$round-$pol-$mode
        nice -n 10 scripts/fio-vm.sh --out "$d" -p dax -d daxfsd-release --cache never --file-size 256M \
            --runtime "$RUNTIME" --cpus 2 --mem 2G -o "$mo" --log "$d.log" \
            -a --dax-window=64M -a --dax-mapping=direct -a --allow-mmap -a "--dax-copy=$mode" \
            randread-mmap:randread:mmap:1:1 randread-psync:randread:psync:1:1 \
            inwin-randread-mmap:randread:mmap:1:1:32M >"$d.txt" 2>&1 || true
        res=$(awk 'NF >= 2 && $2 ~ /^[0-9.]+$/ {printf "%s %s  ", $1, $2}' "$d.txt")
        cnt=$(grep -ao 'dax: maps=.*' "$d.daemon.log" 2>/dev/null | tail -n 1 |
            grep -oE '(^| )(maps|copies|reused)=[0-9]+' | tr -d ' ' | tr '\n' ' ' || true)
        echo "round $round $pol copy=$mode: ${res:-failed (see $d.txt)} | ${cnt:-no counters} | load $(cut -d' ' -f1 /proc/loadavg)"
    done
done
