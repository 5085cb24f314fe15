#!/usr/bin/env bash
# Runs every fuzz target for FUZZ_SECONDS seconds each (default 60) on the stable
# toolchain (cargo-fuzz with --sanitizer none), starting from the committed seeds
# (fuzz/seeds, hand-made) and corpus (fuzz/corpus, what earlier runs found), with the
# working corpus in the cache. Fails on any crash, timeout (hang) or out-of-memory.
# Prints executions per target.
#   scripts/fuzz.sh [--grow] [TARGET...]        FUZZ_SECONDS=N
#   --grow   afterwards, merge what the run found into fuzz/corpus/TARGET (libFuzzer
#            -merge=1 keeps only inputs that add coverage); commit the result
#            (`make fuzz` does this, `make test-fuzz` does not).
set -euo pipefail
RIG_TAG=fuzz
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$RIG_ROOT"

seconds=${FUZZ_SECONDS:-60}
[[ $seconds =~ ^[1-9][0-9]*$ ]] || die "FUZZ_SECONDS must be a positive number of seconds, got '$seconds'"
grow=0
if [[ ${1:-} == --grow ]]; then grow=1; shift; fi
targets=("$@")
((${#targets[@]})) || targets=(server_memfs server_passthrough descriptor_chain migration_stream vhost_frontend)

fuzz_root="$DAXFSD_CACHE/cargo-fuzz-0.13.2"
if [[ ! -x $fuzz_root/bin/cargo-fuzz ]]; then
    log "installing cargo-fuzz 0.13.2 into $fuzz_root (once, about 2 minutes)"
    run_logged "$DAXFSD_CACHE/logs/cargo-fuzz-install.log" \
        env CARGO_TARGET_DIR="$DAXFSD_CACHE/cargo-target-fuzz-install" \
        cargo install --locked cargo-fuzz --version 0.13.2 --root "$fuzz_root.tmp"
    rm -rf "$fuzz_root" && mv "$fuzz_root.tmp" "$fuzz_root"
fi
export PATH="$fuzz_root/bin:$PATH"

log "building fuzz targets"
(cd fuzz && run_logged "$DAXFSD_CACHE/logs/fuzz-build.log" cargo fuzz build -s none -O)

total=0
for t in "${targets[@]}"; do
    [[ -d fuzz/seeds/$t ]] || die "no seeds for fuzz target '$t' (fuzz/seeds/$t)"
    corpus="$DAXFSD_CACHE/fuzz-corpus/$t"
    mkdir -p "$corpus" "$DAXFSD_CACHE/fuzz-artifacts/$t"
    out="$DAXFSD_CACHE/logs/fuzz-$t.log"
    log "fuzzing $t for ${seconds}s"
    mkdir -p "fuzz/corpus/$t"
    if ! (cd fuzz && cargo fuzz run -s none -O "$t" "$corpus" "seeds/$t" "corpus/$t" -- \
            -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
            -artifact_prefix="$DAXFSD_CACHE/fuzz-artifacts/$t/") >"$out" 2>&1; then
        tail -n 40 "$out" >&2
        die "fuzz target $t failed: crash, hang or OOM (artifacts in $DAXFSD_CACHE/fuzz-artifacts/$t, log $out)"
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -n 1)
    log "$t: ${runs:-?} executions, no crash"
    total=$((total + ${runs:-0}))
    if ((grow)); then
        before=$(find "fuzz/corpus/$t" -type f | wc -l)
        (cd fuzz && cargo fuzz run -s none -O "$t" "corpus/$t" "$corpus" -- -merge=1 \
            -timeout=10 -rss_limit_mb=2048) >"$out.merge" 2>&1 ||
            { tail -n 20 "$out.merge" >&2; die "merging the corpus of $t failed (log $out.merge)"; }
        log "$t: fuzz/corpus/$t grew from $before to $(find "fuzz/corpus/$t" -type f | wc -l) inputs"
    fi
done
log "fuzzing done: $total executions in total across ${#targets[@]} target(s), 0 crashes"
