"""The `host` bench section: daxfsd serving the host itself over /dev/fuse (issue 14).

One run, side by side, every configuration over the same backing directory (a tmpfs, so the
storage costs nothing and what is measured is the file system path):

  native            the backing directory itself
  bindfs            Debian's bindfs (libfuse 3), a traditional FUSE mirror
  daxfsd            daxfsd --mount over /dev/fuse, no passthrough
  daxfsd-pt         daxfsd --mount with FUSE passthrough (--passthrough=auto)
  daxfsd-uring      daxfsd --mount over FUSE-over-io-uring (fuse.enable_uring=Y for the run)
  daxfsd-pt-uring   both: passthrough, and the remaining requests over io-uring

Rows: the etcfs table of the seed (25k x 4 KiB, 10k x 64 KiB, 1k x 1 MiB, 100 x 10 MiB files;
write, then read back after dropping the kernel's caches, bench/filebench.c) and fio on one
1 GiB file (4 KiB psync randread, 1 MiB seqread, page cache invalidated first). Each
configuration is mounted afresh per repeat; the order of configurations rotates per repeat;
medians are reported.
"""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

from benchlib import ratio  # bench/benchlib.py

HERE = os.path.dirname(os.path.abspath(__file__))

# (label, files, size in bytes)
ETCFS_ROWS = [
    ("25k x 4 KiB", 25000, 4 << 10),
    ("10k x 64 KiB", 10000, 64 << 10),
    ("1k x 1 MiB", 1000, 1 << 20),
    ("100 x 10 MiB", 100, 10 << 20),
]
QUICK_ROWS = [
    ("2.5k x 4 KiB", 2500, 4 << 10),
    ("1k x 64 KiB", 1000, 64 << 10),
    ("100 x 1 MiB", 100, 1 << 20),
    ("10 x 10 MiB", 10, 10 << 20),
]
FIO_JOBS = [("randread-4k", "randread", "4k"), ("seqread-1m", "read", "1m")]
CONFIGS = ["native", "bindfs", "daxfsd", "daxfsd-pt", "daxfsd-uring", "daxfsd-pt-uring"]
URING_CONFIGS = ("daxfsd-uring", "daxfsd-pt-uring")
LABELS = {
    "native": "native (tmpfs)",
    "bindfs": "bindfs (libfuse 3)",
    "daxfsd": "daxfsd /dev/fuse",
    "daxfsd-pt": "daxfsd + passthrough",
    "daxfsd-uring": "daxfsd io-uring",
    "daxfsd-pt-uring": "daxfsd + passthrough, io-uring",
}
URING_PARAM = "/sys/module/fuse/parameters/enable_uring"


def log(msg):
    print(f"[bench host {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 4 and parts[4] == path:
                return True
    return False


def wait_mounted(path, proc, timeout=20):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if is_mounted(path):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with {proc.returncode} before mounting")
        time.sleep(0.05)
    raise RuntimeError(f"{path} not mounted after {timeout}s")


def force_unmount(path):
    if is_mounted(path):
        subprocess.run(["umount", "-l", path], capture_output=True)


class Mount:
    """One configuration's mount of `backing` at `mnt` (none for native)."""

    def __init__(self, cfg, a, backing, mnt, logdir, rep):
        self.cfg, self.a, self.backing, self.mnt = cfg, a, backing, mnt
        self.proc = None
        self.log_path = os.path.join(logdir, f"{cfg}-r{rep}.log")
        self.report = ""

    def path(self):
        return self.backing if self.cfg == "native" else self.mnt

    def start(self):
        if self.cfg == "native":
            return
        os.makedirs(self.mnt, exist_ok=True)
        if self.cfg == "bindfs":
            # bindfs daemonizes; -f keeps it in the foreground so it is ours to stop.
            cmd = ["bindfs", "-f", "--no-allow-other", self.backing, self.mnt]
        else:
            cmd = [self.a.daxfsd, "--shared-dir", self.backing, "--mount", self.mnt,
                   "--cache", "auto", "--log-level", "info"]
            cmd += {"daxfsd": ["--passthrough=off", "--io-uring=off"],
                    "daxfsd-pt": ["--passthrough=auto", "--io-uring=off"],
                    "daxfsd-uring": ["--passthrough=off", "--io-uring=on"],
                    "daxfsd-pt-uring": ["--passthrough=auto", "--io-uring=on"]}[self.cfg]
        self.logf = open(self.log_path, "w")
        self.logf.write(" ".join(cmd) + "\n")
        self.logf.flush()
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT)
        wait_mounted(self.mnt, self.proc)

    def stop(self):
        if self.proc is None:
            return
        if self.cfg == "bindfs":
            subprocess.run(["umount", self.mnt], capture_output=True)
        else:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        force_unmount(self.mnt)
        self.logf.close()
        with open(self.log_path) as f:
            self.report = f.read()[-4000:]
        self.proc = None


def filebench(a, op, d, n, size):
    p = subprocess.run([a.filebench, op, d, str(n), str(size)], capture_output=True,
                       text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"filebench {op}: {p.stderr.strip()[-300:]}")
    return json.loads(p.stdout)["seconds"]


def fio(a, path, rw, bs, runtime):
    cmd = ["fio", "--name=host", f"--filename={path}", f"--rw={rw}", f"--bs={bs}",
           "--ioengine=psync", "--invalidate=1", "--time_based", f"--runtime={runtime}",
           "--size=1G", "--output-format=json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=runtime + 120)
    if p.returncode != 0:
        raise RuntimeError(f"fio: {p.stderr.strip()[-300:]}")
    j = json.loads(p.stdout[p.stdout.index("{"):])
    rd = j["jobs"][0]["read"]
    return rd["bw_bytes"] / (1 << 20), rd["iops"]


def uring_available():
    return os.path.exists(URING_PARAM) and os.access(URING_PARAM, os.W_OK)


def estimate(a):
    """Seconds the section takes here (measured: about a minute per mount in a full run)."""
    return len(CONFIGS) * (15 if a.quick else 3 * 30)


def run_host(a, raw, results, save):
    """Runs the section; results["host"] = {"cells": [...], ...}."""
    if os.geteuid() != 0:
        log("ERROR host: the section mounts file systems and drops caches: run it as root")
        results["host"] = {"cells": [], "errors": ["not run: needs root"], "configs": CONFIGS,
                           "labels": LABELS, "rows": [], "repeats": 0, "kernel": os.uname().release}
        return
    rows = QUICK_ROWS if a.quick else ETCFS_ROWS
    repeats = 1 if a.quick else 3
    fio_runtime = 3 if a.quick else 5
    logdir = os.path.join(raw, "host")
    os.makedirs(logdir, exist_ok=True)
    cells = []
    host = {"cells": cells, "rows": [r[0] for r in rows], "repeats": repeats,
            "fio_runtime_s": fio_runtime, "configs": CONFIGS, "labels": LABELS,
            "kernel": os.uname().release, "errors": []}
    results["host"] = host

    # The workload helper and bindfs.
    a.filebench = os.path.join(raw, "filebench")
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", a.filebench,
                    os.path.join(HERE, "filebench.c")], check=True)
    configs = list(CONFIGS)
    if not shutil.which("bindfs"):
        host["errors"].append("bindfs not installed")
        configs.remove("bindfs")
    old_uring = None
    if uring_available():
        with open(URING_PARAM) as f:
            old_uring = f.read().strip()
    else:
        host["errors"].append(f"{URING_PARAM} missing or not writable: no io-uring configuration")
        for c in URING_CONFIGS:
            configs.remove(c)

    work = tempfile.mkdtemp(prefix="daxfsd-bench-host-")
    backing = os.path.join(work, "backing")
    mnt = os.path.join(work, "mnt")
    os.makedirs(backing)
    os.makedirs(mnt)
    # A tmpfs: the same (memory) storage under every configuration.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3G", "daxfsd-bench", backing], check=True)
    try:
        for rep in range(1, repeats + 1):
            order = configs[rep - 1:] + configs[:rep - 1]
            for cfg in order:
                run_config(a, host, cells, cfg, rep, rows, backing, mnt, logdir, fio_runtime,
                           old_uring)
                save()
    finally:
        force_unmount(mnt)
        if old_uring is not None:
            with open(URING_PARAM, "w") as f:
                f.write(old_uring + "\n")
        subprocess.run(["umount", backing], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    summarize(host)
    save()


def run_config(a, host, cells, cfg, rep, rows, backing, mnt, logdir, fio_runtime, old_uring):
    if cfg in URING_CONFIGS:
        with open(URING_PARAM, "w") as f:
            f.write("Y\n")
    m = Mount(cfg, a, backing, mnt, logdir, rep)
    try:
        m.start()
        for label, n, size in rows:
            sub = f"r{rep}-{cfg}-{n}"
            d = os.path.join(m.path(), sub)
            os.mkdir(d)
            cell = {"config": cfg, "repeat": rep, "row": label, "files": n, "size": size}
            try:
                cell["write_s"] = filebench(a, "write", d, n, size)
                drop_caches()
                cell["read_s"] = filebench(a, "read", d, n, size)
                cell["status"] = "ok"
                log(f"r{rep} {cfg:12s} {label:13s} write {cell['write_s']:7.3f}s "
                    f"read {cell['read_s']:7.3f}s")
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                cell.update(status="failed", error=str(e))
                log(f"ERROR r{rep} {cfg} {label}: {e}")
            cells.append(cell)
            shutil.rmtree(os.path.join(backing, sub), ignore_errors=True)
            drop_caches()
        data = os.path.join(backing, "fio.data")
        if not os.path.exists(data):
            subprocess.run(["fio", "--name=fill", f"--filename={data}", "--rw=write",
                            "--bs=1m", "--size=1G", "--output-format=terse"],
                           capture_output=True, check=True)
        for name, rw, bs in FIO_JOBS:
            cell = {"config": cfg, "repeat": rep, "row": f"fio {name}", "job": name}
            try:
                drop_caches()
                mib, iops = fio(a, os.path.join(m.path(), "fio.data"), rw, bs, fio_runtime)
                cell.update(status="ok", mib_s=mib, iops=iops)
                log(f"r{rep} {cfg:12s} fio {name:11s} {mib:9.1f} MiB/s {iops:9.0f} IOPS")
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
                cell.update(status="failed", error=str(e))
                log(f"ERROR r{rep} {cfg} fio {name}: {e}")
            cells.append(cell)
    except RuntimeError as e:
        host["errors"].append(f"{cfg} r{rep}: {e} (log {m.log_path})")
        log(f"ERROR r{rep} {cfg}: {e} (log {m.log_path})")
    finally:
        m.stop()
        if cfg in URING_CONFIGS and old_uring is not None:
            with open(URING_PARAM, "w") as f:
                f.write(old_uring + "\n")
    if m.report:
        cells.append({"config": cfg, "repeat": rep, "row": "daemon log tail",
                      "status": "log", "log": m.report[-1500:]})


def med(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def summarize(host):
    s = {}
    for c in host["cells"]:
        if c.get("status") != "ok":
            continue
        e = s.setdefault(f"{c['config']}|{c['row']}", {"config": c["config"], "row": c["row"],
                                                       "write_s": [], "read_s": [], "mib_s": []})
        for k in ("write_s", "read_s", "mib_s"):
            if k in c:
                e[k].append(c[k])
    host["summary"] = [{"config": e["config"], "row": e["row"], "n": max(len(e["read_s"]), len(e["mib_s"])),
                        "write_s": med(e["write_s"]), "read_s": med(e["read_s"]),
                        "mib_s": med(e["mib_s"])} for e in s.values()]


def get(host, cfg, row, key):
    for e in host.get("summary", []):
        if e["config"] == cfg and e["row"] == row:
            return e.get(key)
    return None


def render_md(res, w):
    host = res.get("host")
    if not host:
        return
    cfgs = [c for c in host["configs"] if any(e["config"] == c for e in host.get("summary", []))]
    w("## Host mounts (/dev/fuse, passthrough, io-uring)\n")
    fr = host.get("from_run")
    if fr:
        w(f"From run {fr['run_id']} (`--only host`, started {fr['started']}; its own report: "
          f"`bench/results/{fr['run_id']}.md`).\n")
    w(f"daxfsd serving a tmpfs directory to the host itself, kernel {host['kernel']}; medians of "
      f"{host['repeats']} mount(s) per configuration, order rotated per repeat. Seconds (lower "
      "is better); reads run after dropping the kernel's caches. Configurations: "
      + "; ".join(f"`{c}` = {host['labels'][c]}" for c in cfgs) + ".\n")
    for key, title in (("write_s", "Write"), ("read_s", "Read")):
        w(f"\n### {title} times (s)\n")
        w("| workload | " + " | ".join(cfgs) + " | pt / native | uring speedup | daxfsd best / bindfs |")
        w("|---|" + "--:|" * (len(cfgs) + 3))
        for row in host["rows"]:
            vals = {c: get(host, c, row, key) for c in cfgs}
            pt = ratio(vals.get("daxfsd-pt"), vals.get("native"))
            ur = ratio(vals.get("daxfsd"), vals.get("daxfsd-uring"))
            ours = [v for c, v in vals.items() if c.startswith("daxfsd") and v]
            vb = ratio(vals.get("bindfs"), min(ours) if ours else None)
            w(f"| {row} | " + " | ".join(f"{vals[c]:.3f}" if vals[c] else "-" for c in cfgs)
              + f" | {pt} | {ur} | {vb} |")
    w("\n### fio on one 1 GiB file (MiB/s, higher is better)\n")
    w("| job | " + " | ".join(cfgs) + " | pt / native | uring / devfuse | daxfsd / bindfs |")
    w("|---|" + "--:|" * (len(cfgs) + 3))
    for name, _, _ in FIO_JOBS:
        row = f"fio {name}"
        vals = {c: get(host, c, row, "mib_s") for c in cfgs}
        w(f"| {name} | " + " | ".join(f"{vals[c]:.1f}" if vals[c] else "-" for c in cfgs)
          + f" | {ratio(vals.get('daxfsd-pt'), vals.get('native'))}"
          + f" | {ratio(vals.get('daxfsd-uring'), vals.get('daxfsd'))}"
          + f" | {ratio(vals.get('daxfsd'), vals.get('bindfs'))} |")
    w("\nColumns: `pt / native` is the passthrough time (or rate) over native's; `uring "
      "speedup` is /dev/fuse time over io-uring time (> 1: io-uring faster); `daxfsd best / "
      "bindfs` is bindfs's time over the best daxfsd configuration's (> 1: daxfsd faster).")
    goals = []
    r = ratio(get(host, "daxfsd-pt", host["rows"][-1], "read_s"), get(host, "native", host["rows"][-1], "read_s"))
    goals.append(f"passthrough / native on {host['rows'][-1]} reads: {r} (goal <= 1.10x)")
    r = ratio(get(host, "daxfsd-pt-uring", host["rows"][-1], "read_s"), get(host, "native", host["rows"][-1], "read_s"))
    goals.append(f"passthrough over io-uring / native on {host['rows'][-1]} reads: {r} (goal <= 1.10x)")
    for row in host["rows"][:2]:
        r = ratio(get(host, "daxfsd", row, "read_s"), get(host, "daxfsd-uring", row, "read_s"))
        r2 = ratio(get(host, "daxfsd", row, "write_s"), get(host, "daxfsd-uring", row, "write_s"))
        goals.append(f"io-uring speedup over /dev/fuse on {row}: read {r}, write {r2} (goal >= 1.20x)")
    w("\nGoals (issue 14):\n")
    for g in goals:
        w(f"- {g}")
    for e in host.get("errors", []):
        w(f"- note: {e}")
    w("")


def render_png(res, ax_list):
    """Draws the read-time panel on the first axis given (log scale)."""
    host = res.get("host")
    if not host or not ax_list:
        return
    ax = ax_list[0]
    cfgs = [c for c in host["configs"] if any(e["config"] == c for e in host.get("summary", []))]
    rows = host["rows"]
    width = 0.8 / max(1, len(cfgs))
    for i, c in enumerate(cfgs):
        ys = [get(host, c, r, "read_s") or 0 for r in rows]
        ax.bar([x + i * width for x in range(len(rows))], ys, width, label=host["labels"][c])
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))])
    ax.set_xticklabels(rows, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("read time, s (log)")
    fr = host.get("from_run")
    ax.set_title("Host mounts: etcfs read times (lower is better)"
                 + (f", run {fr['run_id']}" if fr else ""))
    ax.legend(fontsize=7)
