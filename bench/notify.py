"""The `notify` bench section (issue 42): how long a host edit takes to become visible in the
guest, per configuration: daxfsd --cache never / auto / always / coherent, upstream virtiofsd
(--cache=auto) and virtio-9p (cache=none).

One guest per configuration (QEMU 11.1, `dax` profile, `-o dax=never` for daxfsd, the
project's guest kernel). The host edits one file, `t/f`, in place (open O_TRUNC, one write of
the edit's number, close) EDITS times, with a random gap of GAP_MIN..GAP_MAX s between edits
(so a cache timeout is met at every phase), and times each edit on its own monotonic clock
from just before the open until the guest's acknowledgement appears: a marker file the guest
creates on the share (the virtio-fs mount `/mnt/ctl`, also for the 9p guests), which the host
polls for every POLL_S. Both ends of that interval are on the host's clock: the guest's clock
is used only for durations.

Two phases, each an idea of "visible":
  read   a guest loop re-opens and reads the file as fast as it can (shell builtins, no fork:
         `read -r v <file`); when it reads a new edit number it creates ctl/seen-N.
  watch  a guest `inotifywait -m -e modify` on the file's directory; on each event line the
         guest creates ctl/ev-K (K counts events). Only a guest that gets host changes as
         fsnotify events (the notification queue: daxfsd --cache=coherent) ever sees one.
An edit not acknowledged within TIMEOUT_S counts as a miss ("not within T s"); a phase stops
after MISS_STOP misses in a row (the `always` read loop, every watcher but coherent's).

The acknowledgement's own cost is measured in the same guest before the phases: the guest
times (on its own clock, a duration) CAL markers created back to back, three times, minus the
cost of reading its clock; the median over CAL is the marker cost. The host sees a marker no later than the
guest's create returns (the daemon creates it before it replies), so host interval - marker
cost is a lower estimate of the latency and the host interval an upper one; the report gives
both (`net` and `raw`), plus the host's poll period (1 ms) on top.
"""

import os
import random
import re
import shutil
import statistics
import subprocess
import tempfile
import time

from benchlib import run_rows  # bench/benchlib.py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# name, transport, daemon, cache, mount options (9p: its cache mode), extra daemon args
NOTIFY_CONFIGS = [
    ("daxfsd-never", "virtiofs", "daxfsd", "never", "dax=never", []),
    ("daxfsd-auto", "virtiofs", "daxfsd", "auto", "dax=never", []),
    ("daxfsd-always", "virtiofs", "daxfsd", "always", "dax=never", []),
    ("daxfsd-coherent", "virtiofs", "daxfsd", "coherent", "dax=never", []),
    ("virtiofsd-auto", "virtiofs", "virtiofsd", "auto", "", []),
    ("9p-none", "9p", "daxfsd", "auto", "none", []),
]
EDITS = 40
EDITS_QUICK = 20
TIMEOUT_S = 3.0
GAP_MIN, GAP_MAX = 0.3, 1.3
MISS_STOP = 3
POLL_S = 0.001
CAL = 50
# The guest leaves a phase when it has seen nothing new for IDLE_S (longer than a timeout
# plus the longest gap, so it never leaves while the host still waits for an edit it could see).
IDLE_S = int(TIMEOUT_S + GAP_MAX + 3)
# The watch phase's idle limit: the host may still be in its read phase that much longer
# (MISS_STOP misses after the guest's last sighting), and the watch phase must outlast it.
IDLE_WATCH_S = IDLE_S + int(MISS_STOP * (TIMEOUT_S + GAP_MAX) + 1)
# Seconds, for --estimate: a boot, an edit (gap and latency), a phase that stops on misses.
EST_BOOT = 25.0
EST_EDIT = 1.0
EST_MISS_PHASE = MISS_STOP * (TIMEOUT_S + GAP_MAX) + IDLE_S


def log(msg):
    print(f"[bench notify {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def plan(a):
    cfgs = list(NOTIFY_CONFIGS)
    if a.configs:
        cfgs = [c for c in cfgs if re.search(a.configs, c[0])]
    return cfgs


def estimate(a):
    if "notify" not in a.only:
        return 0.0
    n = EDITS_QUICK if a.quick else EDITS
    t = 0.0
    for c in plan(a):
        read_ok = c[3] != "always"
        watch_ok = c[3] == "coherent"
        t += EST_BOOT + IDLE_S + IDLE_WATCH_S
        t += n * EST_EDIT if read_ok else EST_MISS_PHASE
        t += n * EST_EDIT if watch_ok else EST_MISS_PHASE
    return t


GUEST = r"""set -u
__NOW__
F=__FILE__
D=${F%/*}
C=/mnt/ctl
IDLE=__IDLE__
IDLE_WATCH=__IDLE_WATCH__
__MOUNT__
[ -r "$F" ] || { echo "NOTIFY-ERROR $F not readable"; exit 1; }
# The acknowledgement's own cost: __CAL__ markers created back to back between two clock
# reads, three times; and two clock reads with nothing between (the clock's own cost, a
# fork and exec each).
r=0
while [ $r -lt 3 ]; do
    a=$(now); b=$(now)
    i=0
    while [ $i -lt __CAL__ ]; do : >"$C/cal-$r-$i"; i=$((i + 1)); done
    c=$(now)
    echo "NOTIFY-CAL $a $b $c"
    r=$((r + 1))
done
uptime_s() { read -r up _ </proc/uptime; echo "${up%.*}"; }
# Phase read: re-read the file until nothing new for IDLE s.
read -r last <"$F" || last=
read -r up _ </proc/uptime; t=${up%.*}
: >"$C/read-ready"
while :; do
    v=
    read -r v <"$F" || :
    read -r up _ </proc/uptime
    if [ -n "$v" ] && [ "$v" != "$last" ]; then
        : >"$C/seen-$v"
        last=$v
        t=${up%.*}
    fi
    [ $((${up%.*} - t)) -ge "$IDLE" ] && break
done
echo "NOTIFY-READ-LAST $last"
: >"$C/read-done"
# Phase watch: an inotify watcher on the file's directory; a marker per event line.
inotifywait -m -e modify --format x "$D" 2>/tmp/iw.err | {
    n=0
    while read -r _; do n=$((n + 1)); : >"$C/ev-$n"; done
} &
i=0
while ! grep -q 'Watches established' /tmp/iw.err && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
grep -q 'Watches established' /tmp/iw.err || { echo "NOTIFY-ERROR inotifywait: $(cat /tmp/iw.err)"; exit 1; }
: >"$C/watch-ready"
seen=0 t=$(uptime_s)
while :; do
    sleep 0.5
    k=$(ls "$C" | grep -c '^ev-')
    if [ "$k" != "$seen" ]; then seen=$k t=$(uptime_s); fi
    [ $(($(uptime_s) - t)) -ge "$IDLE_WATCH" ] && break
done
echo "NOTIFY-WATCH-EVENTS $seen"
kill $(pidof inotifywait) 2>/dev/null
: >"$C/watch-done"
echo "NOTIFY-DONE"
"""


def wait_path(path, deadline, proc):
    """Polls for path until deadline (monotonic); the time it was seen, or None."""
    while True:
        if os.path.exists(path):
            return time.monotonic()
        now = time.monotonic()
        if now >= deadline or (proc is not None and proc.poll() is not None):
            return None
        time.sleep(POLL_S)


def write_edit(path, k):
    with open(path, "w") as f:
        f.write(f"{k}\n")


def run_phase(name, fpath, marker, n, proc, first, by_number=True):
    """n edits; marker(k), called just before edit k is written, is the path that will
    acknowledge it (by_number: a path named after k, checked again at the end for edits seen
    after the timeout). Returns the phase's record: raw host intervals in ms (None = not
    within TIMEOUT_S), late sightings, and the next edit number."""
    lat, k, misses = [], first, 0
    for _ in range(n):
        time.sleep(random.uniform(GAP_MIN, GAP_MAX))
        m = marker(k)
        t0 = time.monotonic()
        write_edit(fpath, k)
        t1 = wait_path(m, t0 + TIMEOUT_S, proc)
        lat.append(None if t1 is None else round((t1 - t0) * 1000, 2))
        k += 1
        misses = misses + 1 if t1 is None else 0
        if misses >= MISS_STOP or proc.poll() is not None:
            break
    late = sum(1 for j, x in enumerate(lat)
               if by_number and x is None and os.path.exists(marker(first + j)))
    log(f"  {name}: {sum(x is not None for x in lat)} of {len(lat)} edits seen within "
        f"{TIMEOUT_S:g} s" + (f" ({late} later)" if late else ""))
    return {"raw_ms": lat, "edits": len(lat), "late": late}, k


def run_config(a, raw, cfg, n):
    name, transport, daemon, cache, mo, dargs = cfg
    d = os.path.join(raw, f"notify-{name}")
    os.makedirs(d, exist_ok=True)
    res = {"config": name, "status": "ok", "desc": describe(cfg)}
    work = tempfile.mkdtemp(prefix="daxfsd-notify.", dir=os.environ.get("TMPDIR", "/tmp"))
    proc = None
    console = os.path.join(d, "console.log")
    out_path = os.path.join(d, "vm.out")
    try:
        share = os.path.join(work, "share")
        ctl = os.path.join(share, "ctl")
        os.makedirs(ctl)
        virtfs = None
        if transport == "9p":
            virtfs = os.path.join(work, "ninep")
            top, gfile = virtfs, "/mnt9p/t/f"
            mount = (f"mkdir -p /mnt9p && mount -t 9p -o trans=virtio,version=9p2000.L,"
                     f"cache={mo},msize=524288 daxfsd9p /mnt9p || "
                     "{ echo 'NOTIFY-ERROR mount -t 9p failed'; exit 1; }")
            vmo = ""
        else:
            top, gfile, mount, vmo = share, "/mnt/t/f", "", mo
        os.makedirs(os.path.join(top, "t"))
        fpath = os.path.join(top, "t", "f")
        write_edit(fpath, 0)
        script = os.path.join(work, "guest.sh")
        from meta import GUEST_NOW, vm_cmd  # bench/meta.py
        with open(script, "w") as f:
            f.write(GUEST.replace("__NOW__", GUEST_NOW).replace("__FILE__", gfile)
                    .replace("__IDLE_WATCH__", str(IDLE_WATCH_S))
                    .replace("__IDLE__", str(IDLE_S)).replace("__MOUNT__", mount)
                    .replace("__CAL__", str(CAL)))
        stats = os.path.join(d, "daemon-stats.json")
        real = a.daxfsd if daemon == "daxfsd" else a.virtiofsd
        cmd = vm_cmd(a, os.path.join(HERE, "daemon-wrap.py"), cache, share, script, console,
                     vmo, dargs, virtfs, timeout=900)
        res["command"] = cmd
        env = dict(os.environ, BENCH_DAEMON=real, BENCH_STATS=stats)
        with open(out_path, "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    stdin=subprocess.DEVNULL)
        if wait_path(os.path.join(ctl, "read-ready"), time.monotonic() + 400, proc) is None:
            raise RuntimeError("the guest never got to the read phase")
        res["read"], k = run_phase("read", fpath, lambda j: os.path.join(ctl, f"seen-{j}"),
                                   n, proc, 1)
        if wait_path(os.path.join(ctl, "watch-ready"), time.monotonic() + IDLE_S + 120,
                     proc) is None:
            raise RuntimeError("the guest never got to the watch phase")
        base = len([x for x in os.listdir(ctl) if x.startswith("ev-")])

        def ev_marker(_k):
            # The guest's next event marker: an edit may give more than one event (the
            # truncate and the write), so count the markers there are just before each edit.
            return os.path.join(ctl, f"ev-{len([x for x in os.listdir(ctl) if x.startswith('ev-')]) + 1}")
        res["watch"], _ = run_phase("watch", fpath, ev_marker, n, proc, k, by_number=False)
        res["watch"]["events_before"] = base
        if wait_path(os.path.join(ctl, "watch-done"), time.monotonic() + IDLE_WATCH_S + 60,
                     proc) is None:
            raise RuntimeError("the guest did not finish the watch phase")
        proc.wait(timeout=120)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        res["status"] = "failed"
        res["error"] = str(e)
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    res["console_log"] = console
    out = open(out_path).read() if os.path.exists(out_path) else ""
    parse_guest(out, res)
    return res


def parse_guest(out, res):
    cal, clock = [], []
    for ln in out.splitlines():
        f = ln.split()
        if len(f) == 4 and f[0] == "NOTIFY-CAL":
            a, b, c = (float(x) for x in f[1:])
            clock.append(b - a)
            cal.append(c - b)  # CAL creates and one clock read
        elif f[:1] == ["NOTIFY-ERROR"] and res["status"] == "ok":
            res["status"] = "failed"
            res["error"] = ln
        elif len(f) == 2 and f[0] == "NOTIFY-WATCH-EVENTS":
            res["guest_events"] = int(f[1])
    if cal:
        per = (statistics.median(cal) - statistics.median(clock)) / CAL
        res["marker_ms"] = round(max(0.0, per) * 1000, 2)
        res["cal_ms"] = [round(x * 1000, 2) for x in cal]
        res["clock_ms"] = [round(x * 1000, 2) for x in clock]
    elif res["status"] == "ok":
        res["status"] = "failed"
        res["error"] = "no NOTIFY-CAL lines from the guest"


def describe(c):
    name, transport, daemon, cache, mo, dargs = c
    if transport == "9p":
        return (f"virtio-9p, QEMU -virtfs local,security_model=none; guest "
                f"-o trans=virtio,version=9p2000.L,cache={mo}; markers on a daxfsd "
                "--cache=auto virtio-fs mount")
    return f"{daemon} --cache={cache} {' '.join(dargs)}".strip() + (f"; guest -o {mo}" if mo else "")


def run_notify(a, raw, results, save):
    n = EDITS_QUICK if a.quick else EDITS
    cfgs = plan(a)
    sec = results.setdefault("notify", {})
    sec.update({"edits": n, "timeout_s": TIMEOUT_S, "gap_s": [GAP_MIN, GAP_MAX],
                "miss_stop": MISS_STOP, "poll_ms": POLL_S * 1000, "cal": CAL,
                "configs": [c[0] for c in cfgs], "rows": []})
    log(f"notify: {len(cfgs)} boots, {n} edits per phase, timeout {TIMEOUT_S:g} s")
    run_rows(log, "notify", [(c[0], f"notify: {c[0]}", c) for c in cfgs],
             lambda c: run_config(a, raw, c, n), sec["rows"], save,
             lambda r: f"marker {r.get('marker_ms')} ms; read {summary(r, 'read')}; "
                       f"watch {summary(r, 'watch')}")


# ---- summaries and report --------------------------------------------------------------

def pct(xs, q):
    """Nearest-rank percentile of xs, None (a miss) ranking above every number; None if the
    rank falls on a miss."""
    s = sorted(xs, key=lambda x: (x is None, x or 0))
    if not s:
        return None
    i = max(0, min(len(s) - 1, -(-len(s) * q // 100) - 1))
    return s[int(i)]


def phase_stats(r, phase):
    p = r.get(phase) or {}
    xs = p.get("raw_ms") or []
    mk = r.get("marker_ms") or 0.0
    seen = [x for x in xs if x is not None]
    out = {"edits": len(xs), "seen": len(seen), "late": p.get("late", 0)}
    for q, k in ((50, "median"), (99, "p99")):
        v = pct(xs, q)
        out[k + "_raw"] = v
        out[k + "_net"] = None if v is None else round(max(0.0, v - mk), 2)
    return out


def summary(r, phase):
    s = phase_stats(r, phase)
    if not s["edits"]:
        return "-"
    if s["median_raw"] is None:
        return f"not within {TIMEOUT_S:g} s ({s['seen']} of {s['edits']} edits)"
    return (f"median {s['median_net']} ms, p99 "
            + (f"{s['p99_net']} ms" if s["p99_raw"] is not None else f"> {TIMEOUT_S:g} s")
            + f" ({s['seen']} of {s['edits']} edits)")


def cell(s, k, t):
    if not s["edits"]:
        return "-"
    v = s[k + "_net"]
    if v is None:
        return f"not within {t:g} s"
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


def render_md(res, w):
    sec = res.get("notify")
    if not sec or not sec.get("rows"):
        return
    t = sec["timeout_s"]
    w("## Host edit to guest visible (`notify`)\n")
    fr = sec.get("from_run")
    if fr:
        w(f"From run {fr['run_id']} (started {fr['started']}).\n")
    w(f"The host rewrites one file in place {sec['edits']} times per phase (random gaps "
      f"{sec['gap_s'][0]:g}-{sec['gap_s'][1]:g} s) and times, on its own clock, each edit from "
      "just before its write to the guest's acknowledgement: a marker file the guest creates "
      f"on the share, polled every {sec['poll_ms']:g} ms. `read`: a guest loop re-reads the file "
      "(shell builtins, no fork) and marks each new content it reads. `watch`: a guest "
      "`inotifywait -m -e modify` on the file's directory marks each event. Milliseconds, net "
      "of the marker's own cost (the guest's time to create one, the median of three rounds "
      f"of {sec['cal']} back to back in the same boot; the raw host interval is that much "
      f"larger); p99 is the nearest rank (with {sec['edits']} edits, the largest). An edit not acknowledged within {t:g} s is a miss; a "
      f"phase stops after {sec['miss_stop']} misses in a row.\n")
    w("| configuration | read: median | read: p99 | read: seen | watch: median | watch: p99 | "
      "watch: seen | marker cost |")
    w("|---|--:|--:|--:|--:|--:|--:|--:|")
    for r in sec["rows"]:
        if r.get("status") != "ok":
            w(f"| {r['config']} | FAILED: {r.get('error')} | | | | | | |")
            continue
        rs, ws = phase_stats(r, "read"), phase_stats(r, "watch")
        w(f"| {r['config']} | {cell(rs, 'median', t)} | {cell(rs, 'p99', t)} | "
          f"{rs['seen']}/{rs['edits']} | {cell(ws, 'median', t)} | {cell(ws, 'p99', t)} | "
          f"{ws['seen']}/{ws['edits']} | {r.get('marker_ms', '-')} |")
    w("\nConfigurations:\n")
    for r in sec["rows"]:
        late = [f"{p}: {r[p]['late']} missed edit(s) seen later" for p in ("read", "watch")
                if r.get(p, {}).get("late")]
        w(f"- `{r['config']}`: {r.get('desc', '')}" + (f" ({'; '.join(late)})" if late else ""))
    w("")



def render_png(res, ax_list):
    """Host edit -> guest visible per configuration: median and p99 (ms, log) of the read and
    watch phases as horizontal bars; a phase without a number is marked as a miss."""
    sec = res.get("notify")
    if not sec or not sec.get("rows") or not ax_list:
        return
    ax = ax_list[0]
    t = sec["timeout_s"]
    rows = [r for r in sec["rows"] if r.get("status") == "ok"]
    bars = (("read", "median", "#4c72b0"), ("read", "p99", "#a1b9dd"),
            ("watch", "median", "#dd8452"), ("watch", "p99", "#f2c1a0"))
    bh = 0.8 / len(bars)
    top = t * 1000
    for r_i, r in enumerate(rows):
        st = {p: phase_stats(r, p) for p in ("read", "watch")}
        for b_i, (p, k, color) in enumerate(bars):
            y = r_i + (b_i - (len(bars) - 1) / 2) * bh
            s = st[p]
            v = s[k + "_net"] if s["edits"] else None
            label = f"{p} {k}" if r_i == 0 else None
            if v is None:
                # A miss (or no edits): a hatched bar to the timeout, with the count seen.
                ax.barh(y, top, bh, color="none", edgecolor=color, hatch="//", linewidth=0.6,
                        label=label)
                ax.text(top, y, f" not within {t:g} s ({s['seen']}/{s['edits']})",
                        va="center", fontsize=6)
            else:
                ax.barh(y, max(v, 0.1), bh, color=color, label=label)
                ax.text(max(v, 0.1), y, f" {v:.1f}" if v < 100 else f" {v:.0f}",
                        va="center", fontsize=6)
    ax.axvline(top, color="grey", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r["config"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(0.1, top * 20)
    ax.set_xlabel("ms from the host's write to the guest seeing it (log; net of the marker)")
    ax.set_title(f"notify: host edit to guest visible, {sec['edits']} edits per phase "
                 "(lower is better)")
    ax.legend(fontsize=7, loc="lower right")
