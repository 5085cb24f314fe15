#!/bin/bash
# Quick host-mount comparison of daxfsd's two FUSE transports, side by side in one run:
# read(2) on /dev/fuse (--io-uring=off) against FUSE-over-io-uring (--io-uring=on).
#   fio 4 KiB psync randread, O_DIRECT (every read reaches the daemon), on one file;
#   a small-file loop: create N files of 4 KiB, then read them all back (--cache never, so
#   every open/read/close reaches the daemon).
# Needs root (mount(2), the fuse module parameter), fio. Sets
# /sys/module/fuse/parameters/enable_uring to Y for the run and restores it on every exit.
# Usage: bench/uring-quick.sh [DAXFSD] (default: target/release/daxfsd, built if missing)
# Env: RUNTIME (fio seconds, default 10), FILES (small files, default 2000), SIZE (fio file,
# default 256M), ROUNDS (alternating rounds per transport, default 2; the best is kept).
set -euo pipefail
cd "$(dirname "$0")/.."
DAXFSD=${1:-target/release/daxfsd}
RUNTIME=${RUNTIME:-10}
FILES=${FILES:-2000}
SIZE=${SIZE:-256M}
ROUNDS=${ROUNDS:-2}
PARAM=/sys/module/fuse/parameters/enable_uring

die() { echo "uring-quick: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (mount(2) and $PARAM)"
[ -w "$PARAM" ] || die "$PARAM missing: the kernel has no FUSE_IO_URING"
command -v fio >/dev/null || die "fio not installed (apt install fio)"
if [ ! -x "$DAXFSD" ]; then
    nice -n 10 cargo build --release -p daxfsd >&2
fi

# The share on tmpfs by default, so that the transports are measured rather than the disk
# (this machine's ext4 creates ~1000 files/s natively, whatever is on top).
W=$(mktemp -d "${BENCH_DIR:-/dev/shm}/daxfsd-uring-bench.XXXXXX")
OLD=$(cat "$PARAM")
PID=
cleanup() {
    if [ -n "$PID" ]; then kill -TERM "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
    mountpoint -q "$W/mnt" 2>/dev/null && umount -l "$W/mnt"
    echo "$OLD" >"$PARAM"
    rm -rf "$W"
}
trap cleanup EXIT INT TERM
echo Y >"$PARAM"
mkdir -p "$W/src" "$W/mnt"
fio --name=prep --filename="$W/src/fio.dat" --size="$SIZE" --rw=write --bs=1M \
    --ioengine=psync >/dev/null

start() { # start MODE CACHE
    RUST_LOG=info "$DAXFSD" --shared-dir "$W/src" --mount "$W/mnt" --io-uring="$1" \
        --cache "$2" --passthrough=off >"$W/log.$1" 2>&1 &
    PID=$!
    for _ in $(seq 100); do
        mountpoint -q "$W/mnt" && return 0
        sleep 0.1
    done
    cat "$W/log.$1" >&2
    die "mount did not come up ($1)"
}
stop() {
    kill -TERM "$PID"
    wait "$PID" || true
    PID=
    grep -h "requests" "$W/log.$1" | tail -1 | sed 's/^.*\] /    /' >&2
}
randread() { # prints IOPS
    fio --name=rr --filename="$W/mnt/fio.dat" --size="$SIZE" --rw=randread --bs=4k \
        --ioengine=psync --direct=1 --time_based --runtime="$RUNTIME" \
        --output-format=json | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))'
}
smallfiles() { # prints files per second for create+write, then for read
    python3 - "$W/mnt/small" "$FILES" <<'EOF'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
buf = os.urandom(4096)
t = time.monotonic()
for i in range(n):
    with open(f"{d}/f{i}", "wb") as f:
        f.write(buf)
w = n / (time.monotonic() - t)
t = time.monotonic()
for i in range(n):
    with open(f"{d}/f{i}", "rb") as f:
        assert f.read() == buf
r = n / (time.monotonic() - t)
for i in range(n):
    os.unlink(f"{d}/f{i}")
os.rmdir(d)
print(int(w), int(r))
EOF
}

declare -A RR CW CR
for mode in off on; do RR[$mode]=0; CW[$mode]=0; CR[$mode]=0; done
for round in $(seq "$ROUNDS"); do
    for mode in off on; do
        start "$mode" never
        rr=$(randread)
        read -r cw cr < <(smallfiles)
        stop "$mode"
        echo "round $round, --io-uring=$mode: randread $rr IOPS, create $cw files/s, read $cr files/s" >&2
        [ "$rr" -gt "${RR[$mode]}" ] && RR[$mode]=$rr
        [ "$cw" -gt "${CW[$mode]}" ] && CW[$mode]=$cw
        [ "$cr" -gt "${CR[$mode]}" ] && CR[$mode]=$cr
    done
done
ratio() { python3 -c "print(f'{$1 / $2:.2f}x')"; }
printf '%-34s %14s %14s %8s\n' "best of $ROUNDS (share on $(stat -f -c %T "$W"), --cache never)" "/dev/fuse" "io-uring" "ratio"
printf '%-34s %14s %14s %8s\n' "fio 4k psync randread O_DIRECT" "${RR[off]} IOPS" "${RR[on]} IOPS" "$(ratio "${RR[on]}" "${RR[off]}")"
printf '%-34s %14s %14s %8s\n' "$FILES x 4 KiB create+write" "${CW[off]}/s" "${CW[on]}/s" "$(ratio "${CW[on]}" "${CW[off]}")"
printf '%-34s %14s %14s %8s\n' "$FILES x 4 KiB open+read" "${CR[off]}/s" "${CR[on]}/s" "$(ratio "${CR[on]}" "${CR[off]}")"
