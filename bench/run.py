#!/usr/bin/env python3
"""The benchmark runner behind scripts/bench.sh (which installs what it needs, builds the
protocol microbenchmark and then runs this). See `scripts/bench.sh --help`.

Sections:
  proto     protocol microbenchmark without a VM (tests/vufs-driver/examples/protobench.rs):
            4 KiB READ and GETATTR requests/s on one queue, instructions per request under
            callgrind; daxfsd vs virtiofsd
  matrix    the seed's fio matrix (psync, libaio iodepth 16, mmap x seqread, randread,
            seqwrite, randwrite x single job and 4 jobs on 4 files), 4 KiB blocks, five
            configurations, each boot running every job, repeated
  pressure  a working set 4x the 64M DAX window (psync randread and seqread, mmap randread,
            4 jobs, 1,000 small files) and in-window cells with the guest's tmpfs ceiling:
            no DAX, DAX with the kernel's upstream window policy, DAX with the hybrid policy
            (guest-kernel/patches, mount option dax_policy=)
  mq        1, 2, 4 request queues with a 4-vCPU guest and 4 jobs, daxfsd vs virtiofsd
  meta      unpack, walk, read, du, walk again and delete a Linux source tree in the guest:
            daxfsd and virtiofsd per cache mode, daxfsd with DAX, virtio-9p (bench/meta.py)
  density   four guests reading one 256 MiB file with and without DAX (guest page cache,
            host memory), daemon memory after a walk of 100,000 inodes, exec to ready socket

Every guest runs on the `dax` profile (QEMU 11.1, the generic vhost-user device): it is the
one profile that has a DAX window and that both daxfsd and upstream virtiofsd can serve, so
DAX/non-DAX and daxfsd/virtiofsd ratios are taken on the same QEMU, device and guest.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no bench/__pycache__ in the work tree
import report  # noqa: E402  (bench/report.py)
import host  # noqa: E402  (bench/host.py: the host-mount section)
import meta  # noqa: E402  (bench/meta.py: the meta and density sections)
import notify  # noqa: E402  (bench/notify.py: the notify section)

T0 = time.time()


def log(msg):
    print(f"[bench {int(time.time() - T0):5d}s] {msg}", file=sys.stderr, flush=True)


def fmt_dur(s):
    s = int(s)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


# ---- the plan ---------------------------------------------------------------------------

RWS = [("seqread", "read"), ("randread", "randread"), ("seqwrite", "write"), ("randwrite", "randwrite")]
ENGINES = [("psync", 1), ("mmap", 1), ("libaio", 16)]


def matrix_jobs():
    """The seed's 24 jobs, in the seed's order: NAME:RW:ENGINE:IODEPTH:NUMJOBS."""
    jobs = []
    for rwname, rw in RWS:
        for engine, depth in ENGINES:
            for multi in (False, True):
                name = f"{rwname}-{engine}" + ("-multi" if multi else "")
                jobs.append(f"{name}:{rw}:{engine}:{depth}:{4 if multi else 1}")
    return jobs


QUICK_MATRIX_JOBS = ["seqread-psync", "randread-psync", "randread-mmap", "randread-libaio",
                     "randwrite-psync", "randread-psync-multi"]

MATRIX_CONFIGS = [
    # name, daemon, cache, mount options, extra daemon args
    ("daxfsd-never", "daxfsd", "never", "dax=never", ["--dax-window=512M", "--allow-mmap"]),
    ("daxfsd-never-dax", "daxfsd", "never", "dax=always",
     ["--dax-window=512M", "--allow-mmap", "--dax-mapping=direct"]),
    ("daxfsd-auto", "daxfsd", "auto", "dax=never", ["--dax-window=512M"]),
    ("virtiofsd-never", "virtiofsd", "never", "dax=never", ["--allow-mmap"]),
    ("virtiofsd-auto", "virtiofsd", "auto", "dax=never", []),
]


# The pressure section: one daemon (daxfsd --cache never) and one 64M window; the mount
# option picks no DAX, DAX with the kernel's upstream window policy, or the hybrid policy.
# The daemon runs with its default --dax-copy=auto (read-only ranges from copy slots while the
# window churns); the two -nocopy configurations run each policy with --dax-copy=off, so the
# effect of copy slots shows in the same run. dax-hybrid-2m runs the hybrid policy with 6.12's
# 2 MiB ranges (its default for this window is 512 KiB), so the range size's share shows too.
PRESSURE_WINDOW = "64M"
PRESSURE_CONFIGS = [
    ("nodax", "dax=never", []),
    ("dax-upstream", "dax=always,dax_policy=upstream", []),
    ("dax-hybrid", "dax=always,dax_policy=hybrid", []),
    ("dax-hybrid-2m", "dax=always,dax_policy=hybrid,dax_range=2M", []),
    ("dax-upstream-nocopy", "dax=always,dax_policy=upstream", ["--dax-copy=off"]),
    ("dax-hybrid-nocopy", "dax=always,dax_policy=hybrid", ["--dax-copy=off"]),
]
# fio-vm.sh jobs, in the order each boot runs them: the guest's own tmpfs (the ceiling) and
# the in-window cells first, on an empty window; then the working set 4x the window (the
# shared 256M data file; 4 jobs on 4 files of 64M; 1,000 files of 64K, which need 1,000
# 2 MiB ranges of a 32-range window).
PRESSURE_JOBS = [
    "tmpfs-randread-psync:randread:psync:1:1:32M:1:tmpfs",
    "tmpfs-randread-mmap:randread:mmap:1:1:32M:1:tmpfs",
    "inwin-randread-psync:randread:psync:1:1:32M",
    "inwin-randread-mmap:randread:mmap:1:1:32M",
    "randread-psync:randread:psync:1:1",
    "randread-psync-multi:randread:psync:1:4:64M",
    "seqread-psync:read:psync:1:1",
    "randread-mmap:randread:mmap:1:1",
    "smallfiles-randread-psync:randread:psync:1:1:64K:1000",
]


def build_plan(a):
    boots = []

    def boot(section, config, rep, daemon, cache, mo, dargs, jobs, fsize, cpus=None, queues=1,
             expect_unsupported=None):
        boots.append({
            "id": f"{section}-{config}-r{rep}", "section": section, "config": config,
            "repeat": rep, "daemon": daemon, "cache": cache, "mount_opts": mo,
            "daemon_args": dargs, "jobs": jobs, "file_size": fsize,
            "cpus": cpus or a.cpus, "mem": a.mem, "queues": queues, "runtime": a.runtime,
            "expect_unsupported": expect_unsupported,
        })

    sections = a.only
    if "matrix" in sections:
        jobs = matrix_jobs()
        if a.quick:
            jobs = [j for j in jobs if j.split(":")[0] in QUICK_MATRIX_JOBS]
        if a.jobs:
            jobs = [j for j in jobs if re.search(a.jobs, j.split(":")[0])]
        for rep in range(1, a.repeats + 1):
            # Each repeat starts one configuration later, so no configuration always runs
            # first (or right after another) while the host's load drifts.
            k = (rep - 1) % len(MATRIX_CONFIGS)
            for name, daemon, cache, mo, dargs in MATRIX_CONFIGS[k:] + MATRIX_CONFIGS[:k]:
                if a.configs and not re.search(a.configs, name):
                    continue
                boot("matrix", name, rep, daemon, cache, mo, dargs, jobs, a.file_size)
    if "pressure" in sections:
        for rep in range(1, a.repeats + 1):
            k = (rep - 1) % len(PRESSURE_CONFIGS)
            for name, mo, extra in PRESSURE_CONFIGS[k:] + PRESSURE_CONFIGS[:k]:
                if a.configs and not re.search(a.configs, name):
                    continue
                boot("pressure", name, rep, "daxfsd", "never", mo,
                     [f"--dax-window={PRESSURE_WINDOW}", "--allow-mmap", "--dax-mapping=direct"]
                     + extra, PRESSURE_JOBS,
                     a.pressure_file_size)
    if "mq" in sections:
        jobs = ["randread-psync-multi:randread:psync:1:4"]
        if not a.quick:
            jobs.append("randread-libaio-multi:randread:libaio:16:4")
        for rep in range(1, a.repeats + 1):
            mq = [("daxfsd", 1), ("daxfsd", 2), ("daxfsd", 4), ("virtiofsd", 1)]
            k = (rep - 1) % len(mq)
            for dmn, q in mq[k:] + mq[:k]:
                boot("mq", f"{dmn}-q{q}", rep, dmn, "never", "dax=never",
                     [f"--queues={q}"] if dmn == "daxfsd" else [], jobs, a.mq_file_size,
                     cpus=4, queues=q)
            if rep == 1:
                # virtiofsd 1.14 has one request queue: QEMU's device set-up fails with more.
                # Tried once, to record what happens.
                for q in (2, 4):
                    boot("mq", f"virtiofsd-q{q}", rep, "virtiofsd", "never", "dax=never", [],
                         jobs, a.mq_file_size, cpus=4, queues=q,
                         expect_unsupported="virtiofsd 1.14 serves one request queue")
    return boots


# Seconds, for the estimate, measured on this rig (TCG, 2 shared host cores, Nov 2026):
# boot to mount plus power-off per vCPU count, fio start-up per job beyond --runtime, and
# making the data files on the host per MiB.
EST_BOOT = {1: 5.5, 2: 6.0, 4: 11.0}
EST_JOB = 0.8
EST_JOB_MULTI = 1.0
EST_MIB = 0.008


def size_mib(s):
    n, unit = int(s[:-1]), s[-1].upper()
    return n * {"K": 1 / 1024, "M": 1, "G": 1024}[unit]


def estimate_boot(b):
    shared = [int(j.split(":")[4]) for j in b["jobs"] if len(j.split(":")) < 6]
    t = EST_BOOT.get(b["cpus"], 12.0) + max(shared, default=0) * size_mib(b["file_size"]) * EST_MIB
    for j in b["jobs"]:
        f = j.split(":")
        if len(f) >= 6 and (len(f) < 8 or f[7] == "share"):
            t += int(f[4]) * int(f[6] if len(f) > 6 else 1) * size_mib(f[5]) * EST_MIB
    for j in b["jobs"]:
        t += b["runtime"] + (EST_JOB_MULTI if j.split(":")[4] != "1" else EST_JOB)
    if b["expect_unsupported"]:
        t = 3.0
    return t


# Requests counted under callgrind: the two the rates measure, WRITE, and the two a tree walk
# adds (LOOKUP; READDIRPLUS of a 64-entry directory).
PROTO_CALLGRIND_OPS = ("read", "getattr", "write", "lookup", "readdirplus")


def estimate_proto(a):
    if "proto" not in a.only:
        return 0.0
    rate = a.proto_rounds * (len(a.proto_depths) * 2 * 2 + 6 * a.proto_extra) * (a.proto_seconds + 0.5)
    return rate + 5.0 + a.callgrind_rounds * a.callgrind_requests / 2000 * 1.5 * len(PROTO_CALLGRIND_OPS)


# ---- machine ----------------------------------------------------------------------------

def sh(cmd, **kw):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine(a):
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kb = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    osname = ""
    try:
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                osname = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    first = lambda s: s.splitlines()[0] if s else ""  # noqa: E731
    rev = sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    dirty = sh(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"])
    kernel_path = a.kernel or sh([os.path.join(ROOT, "guest-kernel/build.sh"), "--print-path"])
    m = re.search(r"/(\d+\.\d+\.\d+)[^/]*/bzImage$", kernel_path or "")
    return {
        "cpu_model": cpu,
        "host_cores": os.cpu_count(),
        "host_mem_gib": round(mem_kb / 1048576, 1),
        "host_os": osname,
        "host_kernel": os.uname().release,
        "qemu_system": first(sh(["qemu-system-x86_64", "--version"])),
        "qemu_11": first(sh([os.path.join(ROOT, "scripts/qemu-11.sh"), "--version"])),
        "accel": os.environ.get("ACCEL", "tcg"),
        "guest_kernel": m.group(1) if m else os.path.basename(os.path.dirname(kernel_path or "")),
        "daxfsd": first(sh([a.daxfsd, "--version"])) + (f" (git {rev}{'+dirty' if dirty else ''})" if rev else ""),
        "virtiofsd": first(sh([a.virtiofsd, "--version"])),
        "loadavg_start": open("/proc/loadavg").read().split()[:3],
    }


# ---- one boot ---------------------------------------------------------------------------

def fio_summary(path):
    """Cell numbers from one fio JSON output (group_reporting: one job entry)."""
    text = open(path).read()
    data = json.loads(text[text.index("{"):])
    job = data["jobs"][0]
    side = "write" if job["write"]["io_bytes"] > job["read"]["io_bytes"] else "read"
    d = job[side]
    pct = d.get("clat_ns", {}).get("percentile", {})
    us = lambda k: round(pct[k] / 1000, 1) if k in pct else None  # noqa: E731
    return {
        "side": side,
        "mib_s": round(d["bw"] / 1024.0, 2),
        "iops": round(d["iops"], 1),
        "total_ios": d.get("total_ios", 0),
        "clat_mean_us": round(d.get("clat_ns", {}).get("mean", 0) / 1000, 1),
        "clat_p50_us": us("50.000000"),
        "clat_p99_us": us("99.000000"),
        "fio_version": data.get("fio version"),
        "elapsed_s": job.get("elapsed"),
    }


def cpu_between(samples, t0, t1):
    """Daemon CPU seconds between host times t0 and t1, interpolated from the samples."""
    if not samples or t1 <= t0:
        return None

    def at(t):
        prev = None
        for s in samples:
            if s[0] >= t:
                if prev is None:
                    return s[1]
                f = (t - prev[0]) / (s[0] - prev[0]) if s[0] > prev[0] else 1.0
                return prev[1] + f * (s[1] - prev[1])
            prev = s
        return samples[-1][1]

    if t0 < samples[0][0] - 1 or t1 > samples[-1][0] + 1:
        return None
    return max(0.0, at(t1) - at(t0))


def rss_between(samples, t0, t1):
    """Peak sampled (VmRSS, RssAnon + RssFile) between t0 and t1, KiB."""
    sel = [s for s in samples if t0 - 0.3 <= s[0] <= t1 + 0.3]
    if not sel:
        return None, None
    return max(s[2] for s in sel), max(s[3] + s[4] for s in sel)


class Runner:
    def __init__(self, a, raw):
        self.a, self.raw = a, raw
        self.child = None

    def stop(self):
        if self.child and self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signal.SIGTERM)
            except OSError:
                pass
            try:
                self.child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.child.pid, signal.SIGKILL)

    def run_boot(self, b, progress):
        a = self.a
        d = os.path.join(self.raw, b["id"])
        os.makedirs(d, exist_ok=True)
        console = os.path.join(d, "console.log")
        b["console_log"] = console
        b["daemon_log"] = os.path.join(d, "console.daemon.log")
        stats = os.path.join(d, "daemon-stats.json")
        real = a.daxfsd if b["daemon"] == "daxfsd" else a.virtiofsd
        cmd = [os.path.join(ROOT, "scripts/fio-vm.sh"), "--out", d, "--marks", "-p", "dax",
               "-d", os.path.join(HERE, "daemon-wrap.py"), "--cache", b["cache"],
               "--file-size", b["file_size"], "--runtime", str(b["runtime"]),
               "--cpus", str(b["cpus"]), "--mem", b["mem"], "--queues", str(b["queues"]),
               "--log", console]
        if b["mount_opts"]:
            cmd += ["-o", b["mount_opts"]]
        for x in b["daemon_args"]:
            cmd += ["-a", x]
        cmd += b["jobs"]
        b["command"] = cmd
        env = dict(os.environ, BENCH_DAEMON=real, BENCH_STATS=stats)
        errlog = os.path.join(d, "fio-vm.log")
        t_start = time.time()
        with open(errlog, "w") as ef:
            self.child = subprocess.Popen(cmd, stdout=open(os.path.join(d, "summary.txt"), "w"),
                                          stderr=ef, stdin=subprocess.DEVNULL,
                                          start_new_session=True, env=env)
            reported = set()
            share = None
            while True:
                try:
                    rc = self.child.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    pass
                # Live cells: read finished jobs' results on the share as they land.
                if share is None:
                    m = re.search(r"data file\(s\) of \S+ in (\S+)", open(errlog).read())
                    share = m.group(1) if m else None
                if share:
                    for j in b["jobs"]:
                        name = j.split(":")[0]
                        if name in reported or not os.path.exists(f"{share}/.results/{name}.t1"):
                            continue
                        try:
                            r = fio_summary(f"{share}/.results/{name}.json")
                        except (OSError, ValueError, KeyError, IndexError):
                            continue  # reported (and classified) when the boot is over
                        progress(b, name, r, None)
                        reported.add(name)
        self.child = None
        b["rc"] = rc
        b["wall_s"] = round(time.time() - t_start, 1)
        errtext = open(errlog).read()
        m = re.search(r"boot-to-mount ([0-9.]+)s", errtext)
        b["boot_to_mount_s"] = float(m.group(1)) if m else None
        try:
            st = json.load(open(stats))
            b["daemon_stats"] = {k: v for k, v in st.items() if k != "samples"}
            samples = st.get("samples", [])
        except (OSError, ValueError):
            b["daemon_stats"], samples = None, []
        # daxfsd logs its DAX counters at exit: "dax: maps=N unmaps=N upgrades=N ...".
        try:
            lines = [ln for ln in open(b["daemon_log"], errors="replace") if "dax: maps=" in ln]
            if lines:
                b["dax_counters"] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", lines[-1])}
        except OSError:
            pass
        cells = []
        for j in b["jobs"]:
            name, rw, engine, depth, numjobs = j.split(":")[:5]
            c = {"section": b["section"], "config": b["config"], "job": name, "rw": rw,
                 "engine": engine, "iodepth": int(depth), "numjobs": int(numjobs),
                 "repeat": b["repeat"], "boot": b["id"], "status": "ok"}
            try:
                c.update(fio_summary(os.path.join(d, name + ".json")))
            except (OSError, ValueError, KeyError, IndexError):
                c["status"] = "failed"
                err = ""
                try:
                    err = open(os.path.join(d, name + ".err")).read().strip().splitlines()[-1]
                except (OSError, IndexError):
                    pass
                if b["expect_unsupported"]:
                    c["status"] = "unsupported"
                    c["error"] = b["expect_unsupported"]
                    q = re.findall(r"qemu-system-x86_64: (.*)", errtext)
                    if q:
                        c["error"] += "; QEMU: " + q[-1].split(": ", 1)[-1]
                elif engine == "mmap" and "No such device" in err:
                    c["status"] = "unsupported"
                    c["error"] = "mmap: " + err
                else:
                    c["error"] = err or f"no result (fio-vm.sh exit {rc})"
                c["console_log"] = console
            try:
                t0, t1 = (float(x) for x in open(os.path.join(d, name + ".marks")).read().split())
                c["t0"], c["t1"] = t0, t1
                cpu = cpu_between(samples, t0, t1)
                if cpu is not None:
                    c["daemon_cpu_s"] = round(cpu, 3)
                    c["daemon_cpu_pct"] = round(100 * cpu / (t1 - t0), 1)
                    if c.get("total_ios"):
                        c["daemon_cpu_us_per_io"] = round(cpu * 1e6 / c["total_ios"], 2)
                rss, priv = rss_between(samples, t0, t1)
                c["daemon_rss_kb"], c["daemon_private_kb"] = rss, priv
            except (OSError, ValueError):
                pass
            if c["job"] not in reported:
                progress(b, name, c if c["status"] == "ok" else None, c["status"], c.get("error"))
            cells.append(c)
        if rc != 0 and not b["expect_unsupported"]:
            log(f"ERROR boot {b['id']} failed (fio-vm.sh exit {rc}); console log {console}; "
                f"rig log {errlog}")
            tail = [ln for ln in errtext.splitlines() if "FAIL" in ln or "error" in ln.lower()]
            for ln in tail[-3:]:
                log(f"      {ln}")
        b["status"] = "ok" if rc == 0 else ("unsupported" if b["expect_unsupported"] else "failed")
        return cells


# ---- protocol microbenchmark ------------------------------------------------------------

# --thread-pool-size values the proto section measures both daemons with.
PROTO_POOLS = (1, 4)


def run_proto(a, raw, results, save):
    out = os.path.join(raw, "proto.jsonl")
    rows = []
    env = dict(os.environ, DAXFSD=a.daxfsd, VIRTIOFSD=a.virtiofsd)

    def pb(args, what, rnd=None):
        log(f"proto: {what}")
        p = subprocess.run([a.protobench] + args, capture_output=True, text=True, env=env,
                           timeout=600)
        got = []
        for line in p.stdout.splitlines():
            try:
                got.append(json.loads(line))
            except ValueError:
                pass
        with open(out, "a") as f:
            for g in got:
                f.write(json.dumps(g) + "\n")
        if p.returncode != 0:
            log(f"ERROR proto: {what} failed: {p.stderr.strip()[-400:]}")
            rows.append({"kind": "error", "what": what, "error": p.stderr.strip()[-400:]})
        for g in got:
            if rnd is not None:
                g["round"] = rnd
            if g["kind"] == "rate":
                cs = g.get("daemon_cswitch_per_req")
                log(f"proto: {g['daemon']:9s} {g['op']:7s} depth {g['depth']:2d}: "
                    f"{g['req_per_s']:8.0f} req/s ({g['usec_per_req']:.1f} us/req"
                    + (f", {cs:.3f} context switches/req" if cs is not None else "") + ")")
            else:
                log(f"proto: {g['daemon']:9s} {g['op']:7s} {g['instructions_per_req']:8.0f} "
                    f"instructions/request (callgrind, {g['requests']} requests)")
        rows.extend(got)

    if not a.protobench or not os.access(a.protobench, os.X_OK):
        log("ERROR proto: no protobench binary (its build failed); skipping the section")
        results["proto"] = {"rows": [{"kind": "error", "what": "build", "error": "protobench not built"}]}
        return
    for r in range(1, a.proto_rounds + 1):
        for depth in a.proto_depths:
            for dmn in (("daxfsd", "virtiofsd") if r % 2 else ("virtiofsd", "daxfsd")):
                pb(["--daemon", dmn, "--seconds", str(a.proto_seconds), "--depth", str(depth)],
                   f"round {r}/{a.proto_rounds}: {dmn} req/s, depth {depth}", r)
        if a.proto_extra:
            depth = max(a.proto_depths)
            # Four request queues (virtiofsd 1.14 serves one: daxfsd only), and READs of
            # another file while a SETLKW waits on the same queue (virtiofsd 1.14 has no POSIX
            # locks: daxfsd only, against its own plain rate above).
            pb(["--daemon", "daxfsd", "--seconds", str(a.proto_seconds), "--depth", str(depth),
                "--queues", "4", "--op", "read"],
               f"round {r}/{a.proto_rounds}: daxfsd req/s, 4 queues, depth {depth}", r)
            pb(["--daemon", "daxfsd,--posix-lock", "--seconds", str(a.proto_seconds),
                "--depth", str(depth), "--blocked-lock", "--op", "read"],
               f"round {r}/{a.proto_rounds}: daxfsd req/s with a SETLKW waiting, depth {depth}", r)
            # Worker pools as launchers set them (Kata 1, libvirt 4; the default 0 serves on
            # the queue thread), at every depth, daemons alternating as above.
            for pool in PROTO_POOLS:
                for pdepth in a.proto_depths:
                    for dmn in (("daxfsd", "virtiofsd") if r % 2 else ("virtiofsd", "daxfsd")):
                        pb(["--daemon", f"{dmn},--thread-pool-size={pool}",
                            "--seconds", str(a.proto_seconds), "--depth", str(pdepth)],
                           f"round {r}/{a.proto_rounds}: {dmn} req/s with "
                           f"--thread-pool-size={pool}, depth {pdepth}", r)
    # The count moves by up to ~10% with the host's load (the daemon's event loop takes
    # other paths when requests arrive at other moments): several runs, median reported.
    for r in range(1, a.callgrind_rounds + 1):
        pb(["--callgrind", str(a.callgrind_requests)] + [x for op in PROTO_CALLGRIND_OPS for x in ("--op", op)],
           f"round {r}/{a.callgrind_rounds}: instructions per request under callgrind "
           f"({a.callgrind_requests} requests - 0)", r)
    results["proto"] = {"rows": rows, "seccomp_rate": "kill", "seccomp_callgrind": "none"}
    save()


# ---- main -------------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default="proto,matrix,pressure,mq,host,meta,density,notify")
    p.add_argument("--runtime", type=int)
    p.add_argument("--repeats", type=int)
    p.add_argument("--file-size")
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--mem", default="1G")
    p.add_argument("--jobs", help="regex: only matrix jobs whose name matches")
    p.add_argument("--configs", help="regex: only matrix, pressure, meta and density "
                   "configurations whose name matches")
    p.add_argument("--meta-tree", help="meta: subtrees of the Linux source to unpack, comma "
                   "separated (default arch/x86, 1,551 entries; arch/arm 4,627; arch 18,344)")
    p.add_argument("--estimate", action="store_true", help="print the plan's duration and exit")
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    p.add_argument("--raw")
    p.add_argument("--protobench")
    p.add_argument("--daxfsd", default=os.path.join(ROOT, "target/release/daxfsd"))
    p.add_argument("--virtiofsd")
    p.add_argument("--density-file-mib", type=int, default=meta.DENSITY_FILE_MIB,
                   help="density: the file the four guests read, in MiB (default %(default)s)")
    p.add_argument("--density-window", default=meta.DENSITY_WINDOW,
                   help="density: the DAX window of each guest (default %(default)s)")
    p.add_argument("--kernel", help="meta, density, notify: guest bzImage (default: "
                   "guest-kernel/build.sh's)")
    a = p.parse_args()
    a.only = [s.strip() for s in a.only.split(",") if s.strip()]
    bad = [s for s in a.only if s not in ("proto", "matrix", "pressure", "mq", "host", "meta",
                                          "density", "notify")]
    if bad:
        sys.exit(f"bench: unknown section(s) {bad}")
    if a.quick:
        a.runtime = a.runtime or 3
        a.repeats = a.repeats or 1
        a.file_size = a.file_size or "64M"
        a.proto_seconds, a.proto_rounds, a.proto_depths, a.callgrind_requests = 2, 1, [1], 2000
        a.proto_extra = False
        a.callgrind_rounds = 1
    else:
        a.runtime = a.runtime or 5
        a.repeats = a.repeats or 3
        a.file_size = a.file_size or "128M"
        a.proto_seconds, a.proto_rounds, a.proto_depths, a.callgrind_requests = 3, 3, [1, 16], 5000
        a.proto_extra = True
        a.callgrind_rounds = 3
    a.pressure_file_size = "256M"
    a.mq_file_size = "64M"
    if not a.virtiofsd:
        a.virtiofsd = sh([os.path.join(ROOT, "scripts/provision-virtiofsd.sh"), "--print-path"])

    boots = build_plan(a)
    est = sum(estimate_boot(b) for b in boots) + estimate_proto(a)
    if "host" in a.only:
        est += host.estimate(a)
    est += meta.estimate(a)
    est += notify.estimate(a)
    ncells = sum(len(b["jobs"]) for b in boots)
    mode = "quick" if a.quick else "full"
    log(f"plan ({mode}): {len(boots)} guest boots, {ncells} fio cells ({a.runtime}s each, "
        f"{a.repeats} repeat(s)), sections {','.join(a.only)}; estimated {fmt_dur(est)}")
    if a.estimate:
        for sec in ("matrix", "pressure", "mq"):
            bs = [b for b in boots if b["section"] == sec]
            if bs:
                log(f"  {sec:8s}: {len(bs):3d} boots, {sum(len(b['jobs']) for b in bs):4d} cells, "
                    f"~{fmt_dur(sum(estimate_boot(b) for b in bs))}")
        if "proto" in a.only:
            log(f"  proto   : ~{fmt_dur(estimate_proto(a))}")
        if "host" in a.only:
            log(f"  host    : ~{fmt_dur(host.estimate(a))}")
        if "meta" in a.only or "density" in a.only:
            mb = meta.plan(a) if "meta" in a.only else []
            log(f"  meta/density: {len(mb)} meta boots; ~{fmt_dur(meta.estimate(a))}")
        if "notify" in a.only:
            log(f"  notify  : {len(notify.plan(a))} boots; ~{fmt_dur(notify.estimate(a))}")
        return 0
    for f, what in ((a.daxfsd, "daxfsd (make release)"), (a.virtiofsd, "virtiofsd (make virtiofsd)")):
        if not f or not os.access(f, os.X_OK):
            sys.exit(f"bench: error: {what} not found at {f!r}")

    run_id = time.strftime("%Y%m%d-%H%M%S") + ("-quick" if a.quick else "")
    cache = os.environ.get("DAXFSD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "daxfsd")
    raw = a.raw or os.path.join(cache, "bench", run_id)
    os.makedirs(raw, exist_ok=True)
    os.makedirs(a.results, exist_ok=True)
    json_path = os.path.join(a.results, f"{run_id}.json")
    results = {
        "run_id": run_id, "mode": mode, "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "raw_dir": raw, "estimate_s": round(est),
        "settings": {"runtime_s": a.runtime, "repeats": a.repeats, "file_size": a.file_size,
                     "pressure_file_size": a.pressure_file_size, "mq_file_size": a.mq_file_size,
                     "cpus": a.cpus, "mem": a.mem, "block_size": "4k", "profile": "dax",
                     "sections": a.only, "proto_seconds": a.proto_seconds,
                     "proto_rounds": a.proto_rounds, "proto_depths": a.proto_depths,
                     "callgrind_requests": a.callgrind_requests,
                     "callgrind_rounds": a.callgrind_rounds},
        "machine": machine(a), "configs": report.CONFIGS, "boots": boots, "cells": [],
    }
    log(f"results: {json_path}; raw data and console logs: {raw}")

    def save():
        report.summarize(results)
        tmp = json_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(tmp, json_path)

    runner = Runner(a, raw)

    def on_signal(sig, _f):
        log("interrupted: stopping the current guest; partial results are kept")
        runner.stop()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    done_cells = [0]
    interrupted = False
    try:
        if "proto" in a.only:
            run_proto(a, raw, results, save)
        vm_boots = boots
        t_vm0 = time.time()
        for i, b in enumerate(vm_boots):
            left = sum(estimate_boot(x) for x in vm_boots[i:])
            log(f"boot {i + 1}/{len(vm_boots)}: {b['section']} {b['config']} repeat {b['repeat']}: "
                f"{len(b['jobs'])} job(s) of {b['runtime']}s, {b['cpus']} vCPU, {b['queues']} queue(s) "
                f"(~{fmt_dur(left)} left)")

            def progress(bt, name, r, status, err=None):
                done_cells[0] += 1
                head = (f"cell {done_cells[0]}/{ncells} {bt['section']} {bt['config']} "
                        f"r{bt['repeat']} {name}")
                if r:
                    p50 = r.get("clat_p50_us")
                    p99 = r.get("clat_p99_us")
                    log(f"{head}: {r['mib_s']:8.1f} MiB/s {r['iops']:8.0f} IOPS  "
                        f"clat p50 {p50 if p50 is not None else '-'} us p99 {p99 if p99 is not None else '-'} us")
                elif status == "unsupported":
                    log(f"{head}: unsupported ({err})")
                else:
                    log(f"ERROR {head}: failed: {err}; console log {bt['console_log']}")

            cells = runner.run_boot(b, progress)
            results["cells"].extend(cells)
            save()
        results["vm_wall_s"] = round(time.time() - t_vm0, 1)
        if "host" in a.only:
            t_h0 = time.time()
            host.run_host(a, raw, results, save)
            results["host_wall_s"] = round(time.time() - t_h0, 1)
        if "meta" in a.only:
            t_m0 = time.time()
            meta.run_meta(a, raw, results, save)
            results["meta_wall_s"] = round(time.time() - t_m0, 1)
        if "density" in a.only:
            t_d0 = time.time()
            meta.run_density(a, raw, results, save)
            results["density_wall_s"] = round(time.time() - t_d0, 1)
        if "notify" in a.only:
            t_n0 = time.time()
            notify.run_notify(a, raw, results, save)
            results["notify_wall_s"] = round(time.time() - t_n0, 1)
    except KeyboardInterrupt:
        interrupted = True
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    results["duration_s"] = round(time.time() - T0, 1)
    results["interrupted"] = interrupted
    results["machine"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    save()
    md = os.path.join(a.results, f"{run_id}.md")
    png = os.path.join(a.results, f"{run_id}.png")
    report.render(results, md, png)
    for src, dst in ((md, "report.md"), (png, "report.png"), (json_path, "latest.json")):
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(a.results, dst))
    failed = [c for c in results["cells"] if c["status"] == "failed"]
    proto_err = [r for r in results.get("proto", {}).get("rows", []) if r.get("kind") == "error"]
    log(f"done in {fmt_dur(results['duration_s'])} (estimated {fmt_dur(est)}): "
        f"{len(results['cells'])} cells, {len(failed)} failed; report {os.path.join(a.results, 'report.md')}")
    for c in failed:
        log(f"FAILED {c['section']} {c['config']} r{c['repeat']} {c['job']}: {c.get('error')} "
            f"(console log {c.get('console_log')})")
    for r in proto_err:
        log(f"FAILED proto {r['what']}: {r['error'][-200:]}")
    hres = results.get("host", {})
    host_err = hres.get("errors", []) + [
        f"{c['config']} r{c['repeat']} {c['row']}: {c.get('error')}"
        for c in hres.get("cells", []) if c.get("status") == "failed"]
    for e in host_err:
        log(f"FAILED host {e}")
    meta_err = [f"meta {c['config']} r{c['repeat']}: {c.get('error')}"
                for c in results.get("meta", {}).get("cells", []) if c.get("status") != "ok"]
    meta_err += [f"density {c.get('config', c.get('daemon'))}: {c.get('error')}"
                 for k in ("configs", "walk") for c in results.get("density", {}).get(k, [])
                 if c.get("status") != "ok"]
    meta_err += [f"notify {r['config']}: {r.get('error')}"
                 for r in results.get("notify", {}).get("rows", []) if r.get("status") != "ok"]
    for e in meta_err:
        log(f"FAILED {e}")
    if interrupted:
        return 130
    return 1 if failed or proto_err or host_err or meta_err else 0


if __name__ == "__main__":
    sys.exit(main())
