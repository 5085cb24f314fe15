#!/usr/bin/env bash
# make demo: boot a QEMU 11.1 guest whose virtio-fs share is mounted with DAX, run 4 KiB
# fio jobs, do the same without DAX (same daemon, same QEMU, `-o dax=never`) and with DAX
# over direct (zero-copy) mappings (`--dax-mapping=direct`; the default is pooled, see
# README "Limits"), and print them side by side, ending with one machine-readable line
# (DAX = the daemon's default):
#   dax-speedup randread-psync: <R>x (dax <A> MiB/s, no-dax <B> MiB/s)
# Environment: DEMO_RUNTIME (seconds per job, default 10), DEMO_FILE_SIZE (default 128M),
# DEMO_WINDOW (DAX window, default 512M: 128 ranges of 4 MiB with the hybrid guest kernel,
# the window over 128, or 256 of Linux's 2 MiB, within the 445 frontend mappings QEMU 11.1
# allows, so with --dax-mapping=direct every range is a zero-copy mapping; 1G and up are
# pooled in either mode with 2 MiB ranges, direct with the hybrid guest kernel's), ACCEL
# (tcg or kvm).
set -euo pipefail
RIG_TAG=demo
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$RIG_ROOT"

runtime=${DEMO_RUNTIME:-10}
fsize=${DEMO_FILE_SIZE:-128M}
window=${DEMO_WINDOW:-512M}
jobs=(seqread-psync:read:psync randread-psync:randread:psync randread-mmap:randread:mmap)
out="$DAXFSD_CACHE/demo/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"

run() { # run LABEL MOUNTOPTS EXTRA-DAEMON-ARGS...
    local label=$1 mo=$2; shift 2
    local args=()
    for a in "$@"; do args+=(-a "$a"); done
    log "$label: booting a guest (daxfsd --cache never $*, mount -o $mo), ${#jobs[@]} fio jobs of ${runtime}s"
    scripts/fio-vm.sh --out "$out/$label" -p dax -d daxfsd-release --cache never -o "$mo" --file-size "$fsize" \
        --runtime "$runtime" --log "$out/$label/console.log" -a "--dax-window=$window" "${args[@]}" \
        "${jobs[@]}" >"$out/$label/summary.txt" || {
        cat "$out/$label/summary.txt" "$out/$label/guest-output.txt" >&2 2>/dev/null || true
        die "$label run failed (console log $out/$label/console.log)"
    }
}
mkdir -p "$out/dax" "$out/no-dax" "$out/dax-direct"
run dax dax=always
run dax-direct dax=always --dax-mapping=direct
# Without DAX, mmap with --cache never needs FUSE_DIRECT_IO_ALLOW_MMAP (--allow-mmap).
run no-dax dax=never --allow-mmap

python3 - "$out" <<'PY'
import sys, os
out = sys.argv[1]
def load(label):
    res = {}
    for line in open(os.path.join(out, label, "summary.txt")):
        parts = line.split()
        if len(parts) == 3:
            res[parts[0]] = (float(parts[1]), float(parts[2]))
    return res
dax, nodax, direct = load("dax"), load("no-dax"), load("dax-direct")
print()
print("daxfsd, QEMU 11.1 (TCG), 4 KiB blocks, --cache never; DAX = mount -o dax=always,")
print("pooled (the default: safe to pause) and direct (--dax-mapping=direct: zero-copy)")
print(f"{'workload':<18}{'no-DAX MiB/s':>14}{'DAX MiB/s':>12}{'speedup':>10}{'direct MiB/s':>14}{'speedup':>10}")
def cell(a, b):
    fa = f"{a[0]:.1f}" if a else "failed"
    sp = f"{a[0] / b[0]:.1f}x" if a and b and b[0] > 0 else "-"
    return fa, sp
for name in ["seqread-psync", "randread-psync", "randread-mmap"]:
    b = nodax.get(name)
    fb = f"{b[0]:.1f}" if b else "failed"
    fa, sp = cell(dax.get(name), b)
    fd, sd = cell(direct.get(name), b)
    print(f"{name:<18}{fb:>14}{fa:>12}{sp:>10}{fd:>14}{sd:>10}")
for label in ("dax", "dax-direct", "no-dax"):
    try:
        stats = [l.split("] ", 1)[-1].strip() for l in open(os.path.join(out, label, "console.daemon.log")) if "dax: maps=" in l]
        if stats:
            print(f"daemon counters ({label}): {stats[-1]}")
    except OSError:
        pass
print(f"results: {out}")
a, b = dax.get("randread-psync"), nodax.get("randread-psync")
if not a or not b or b[0] <= 0:
    sys.exit("demo: randread-psync did not complete in both runs")
print(f"dax-speedup randread-psync: {a[0] / b[0]:.1f}x (dax {a[0]:.1f} MiB/s, no-dax {b[0]:.1f} MiB/s)")
PY
