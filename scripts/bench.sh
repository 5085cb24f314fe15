#!/usr/bin/env bash
# make bench: the benchmark suite (issue 6). Results: bench/results/<run>.json (every cell),
# bench/results/<run>.{md,png} and the latest run's bench/results/report.{md,png}.
#
#   scripts/bench.sh [--quick] [options]
#
#   --quick             reduced matrix (6 jobs, 3 s, 1 repeat) for a fast look (< 10 min)
#   --only LIST         sections to run, comma separated
#                       (default: proto,matrix,pressure,mq,host,meta,density,notify)
#                         proto     requests/s and instructions per request, no VM (vufs-driver)
#                         matrix    the seed's fio matrix x 5 configurations
#                         pressure  randread over 4x the DAX window, DAX vs no DAX
#                         mq        1, 2, 4 request queues, 4 vCPUs, daxfsd vs virtiofsd
#                         host      daxfsd --mount on the host: /dev/fuse, passthrough,
#                                   io-uring vs native and bindfs (etcfs table, fio); root
#                         meta      unpack/walk/read/du/walk/delete a Linux source tree in the
#                                   guest: daxfsd, virtiofsd per cache mode, DAX, virtio-9p
#                         density   4 guests read one 256 MiB file, DAX vs not (guest and host
#                                   memory); daemon RSS after 100k inodes; exec to socket
#                         notify    host edit -> guest sees it (re-read loop, inotify watcher):
#                                   daxfsd never/auto/always/coherent, virtiofsd, 9p
#   --runtime SEC       seconds per fio job (default 5; quick 3)
#   --repeats N         boots per configuration; medians reported (default 3; quick 1)
#   --file-size SIZE    matrix data file size (default 128M; quick 64M)
#   --cpus N            guest vCPUs for matrix and pressure (default 2)
#   --jobs REGEX        only matrix jobs whose name matches, e.g. 'randread|seqread'
#   --configs REGEX     only matrix, pressure, meta, density, notify configurations whose
#                       name matches
#   --meta-tree LIST    meta: Linux source subtrees to unpack (default arch/x86, 1,551
#                       entries; arch/arm 4,627; arch 18,344: ~4-5 h under TCG)
#   --kernel BZIMAGE    meta, density, notify: this guest kernel (default guest-kernel/build.sh's)
#   --estimate          print the plan and its estimated duration, run nothing
#   --results DIR       where results go (default bench/results)
# Environment: ACCEL (tcg or kvm), DAXFSD_CACHE (raw data and console logs go to
# $DAXFSD_CACHE/bench/<run>), CARGO_TARGET_DIR (where the microbenchmark is built).
# The VM runs use target/release/daxfsd (make release) and upstream virtiofsd 1.14.0
# (make virtiofsd); every guest runs on the `dax` QEMU profile (see bench/run.py).
# A failed cell is reported (ERROR line with its console log) and the run goes on; the
# exit status is 1 if any cell failed.
set -euo pipefail
RIG_TAG=bench
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$RIG_ROOT"

for a in "$@"; do
    case $a in -h|--help) sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
done
estimate=0
for a in "$@"; do [[ $a == --estimate ]] && estimate=1; done

# The chart needs Debian's matplotlib, which only Debian's python3 sees (a python3 earlier in
# PATH, e.g. from pyenv, does not).
py=python3
[[ -x /usr/bin/python3 ]] && py=/usr/bin/python3
need_cmd "$py" python3
if ((estimate == 0)); then
    # What the suite needs beyond the VM rig (scripts/provision-deps.sh bench; `make bench`
    # installs it): matplotlib for the chart, valgrind for the instruction counts, bindfs as
    # the host section's traditional FUSE peer.
    "$py" -c 'import matplotlib' 2>/dev/null ||
        die "$py lacks matplotlib; run 'scripts/provision-deps.sh bench' (package python3-matplotlib)"
    need_cmd valgrind valgrind
    need_cmd bindfs bindfs
    [[ -x target/release/daxfsd ]] || die "target/release/daxfsd missing; run 'make release'"

    # The protocol microbenchmark (tests/vufs-driver/examples/protobench.rs).
    protobench=""
    target_dir=${CARGO_TARGET_DIR:-$RIG_ROOT/target}
    blog="$DAXFSD_CACHE/bench-build.log"
    mkdir -p "$DAXFSD_CACHE"
    log "building the protocol microbenchmark (cargo build --release --example protobench; log $blog)"
    : >"$blog"
    if run_logged "$blog" cargo build --release -p vufs-driver --example protobench; then
        protobench=$target_dir/release/examples/protobench
    else
        log "ERROR: the protocol microbenchmark did not build (log $blog); its section will be marked failed"
    fi
    set -- --protobench "${protobench:-/nonexistent}" "$@"
fi
exec "$py" "$RIG_ROOT/bench/run.py" "$@"
