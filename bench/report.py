#!/usr/bin/env python3
"""Summaries, report.md and report.png for a benchmark run (bench/run.py writes the JSON).

    bench/report.py RESULTS.json [--md FILE] [--png FILE] [--pressure-from RUN.json]
                    [--host-from RUN.json] [--proto-from RUN.json] [--meta-from RUN.json]

(run it with /usr/bin/python3: the chart needs Debian's python3-matplotlib)

re-renders a run's report from its JSON (default: next to the JSON, same base name).
--pressure-from replaces the run's `pressure` section with the one of RUN.json (a later
`--only pressure` run): the report then says which sections come from which run.
--proto-from replaces the `proto` section with the one of RUN.json (an `--only proto` run).
--host-from adds (or replaces) the `host` section with the one of RUN.json (an `--only host`
run); its heading names that run. --meta-from does the same for the `meta`, `density` and
`notify` sections (bench/meta.py, bench/notify.py) of RUN.json, for those RUN.json has; given again, a later run's
sections replace an earlier one's (`--meta-from A --meta-from B`: B's meta, A's density when
B ran no density).
"""
import json
import os
import statistics
import sys

import host as host_report  # bench/host.py: the `host` section (daxfsd over /dev/fuse)
import meta as meta_report  # bench/meta.py: the `meta` and `density` sections
import notify as notify_report  # bench/notify.py: the `notify` section (host edit -> guest)

CONFIGS = {
    "daxfsd-never": "daxfsd cache=never",
    "daxfsd-never-dax": "daxfsd cache=never + DAX (direct mappings)",
    "daxfsd-auto": "daxfsd cache=auto",
    "virtiofsd-never": "virtiofsd 1.14 cache=never",
    "virtiofsd-auto": "virtiofsd 1.14 cache=auto",
    "nodax": "daxfsd, no DAX",
    "dax-64M": "daxfsd, DAX, 64M window",
    "dax-1G": "daxfsd, DAX, 1G window",
    "dax-upstream": "daxfsd, DAX 64M, upstream policy",
    "dax-hybrid": "daxfsd, DAX 64M, hybrid policy",
    "dax-upstream-nocopy": "daxfsd --dax-copy=off, DAX 64M, upstream policy",
    "dax-hybrid-nocopy": "daxfsd --dax-copy=off, DAX 64M, hybrid policy",
    "dax-hybrid-2m": "daxfsd, DAX 64M, hybrid policy with 2 MiB ranges",
    "daxfsd-q1": "daxfsd 1 queue",
    "daxfsd-q2": "daxfsd 2 queues",
    "daxfsd-q4": "daxfsd 4 queues",
    "virtiofsd-q1": "virtiofsd 1 queue",
    "virtiofsd-q2": "virtiofsd 2 queues",
    "virtiofsd-q4": "virtiofsd 4 queues",
}

RWS = ["seqread", "randread", "seqwrite", "randwrite"]
ENGINES = ["psync", "mmap", "libaio"]
SEED_JOBS = [f"{rw}-{e}{m}" for rw in RWS for e in ENGINES for m in ("", "-multi")]
# The seed's numbers (virtiofs cache=none vs cache=none + DAX, MiB/s; 0 = unsupported).
SEED = {
    "seqread-psync": (35, 643), "seqread-psync-multi": (219, 2132), "seqread-mmap": (0, 741),
    "seqread-mmap-multi": (0, 2530), "seqread-libaio": (293, 425), "seqread-libaio-multi": (207, 1543),
    "randread-psync": (36, 572), "randread-psync-multi": (211, 1764), "randread-mmap": (0, 719),
    "randread-mmap-multi": (0, 2005), "randread-libaio": (300, 413), "randread-libaio-multi": (327, 1326),
    "seqwrite-psync": (34, 494), "seqwrite-psync-multi": (223, 1680), "seqwrite-mmap": (0, 1217),
    "seqwrite-mmap-multi": (0, 2359), "seqwrite-libaio": (282, 348), "seqwrite-libaio-multi": (320, 1255),
    "randwrite-psync": (32, 458), "randwrite-psync-multi": (213, 1343), "randwrite-mmap": (0, 663),
    "randwrite-mmap-multi": (0, 1820), "randwrite-libaio": (292, 341), "randwrite-libaio-multi": (322, 1094),
}


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---- summaries --------------------------------------------------------------------------

def summarize(res):
    """Adds res["summary"] (per cell: medians over repeats), res["daemon_cost"] and
    res["proto_summary"]."""
    groups = {}
    for c in res.get("cells", []):
        groups.setdefault((c["section"], c["config"], c["job"]), []).append(c)
    summary = []
    for (sec, cfg, job), cs in groups.items():
        ok = [c for c in cs if c["status"] == "ok"]
        if ok:
            status = "ok"
        elif all(c["status"] == "unsupported" for c in cs):
            status = "unsupported"
        else:
            status = "failed"
        bws = [c["mib_s"] for c in ok]
        m = med(bws)
        summary.append({
            "section": sec, "config": cfg, "job": job, "status": status,
            "runs_ok": len(ok), "runs": len(cs),
            "mib_s": m, "mib_s_all": bws,
            "spread_pct": round(100 * (max(bws) - min(bws)) / m, 1) if m else None,
            "iops": med([c["iops"] for c in ok]),
            "clat_p50_us": med([c.get("clat_p50_us") for c in ok]),
            "clat_p99_us": med([c.get("clat_p99_us") for c in ok]),
            "daemon_cpu_pct": med([c.get("daemon_cpu_pct") for c in ok]),
            "daemon_cpu_us_per_io": med([c.get("daemon_cpu_us_per_io") for c in ok]),
            "errors": sorted({c.get("error", "") for c in cs if c["status"] != "ok"}),
            "console_logs": [c.get("console_log") for c in cs if c["status"] == "failed"],
        })
    res["summary"] = summary

    cost = {}
    for b in res.get("boots", []):
        st = b.get("daemon_stats")
        if not st or b.get("status") == "unsupported":
            continue
        k = (b["section"], b["config"])
        e = cost.setdefault(k, {"section": k[0], "config": k[1], "boots": 0, "hwm_kb": 0,
                                "private_kb": 0, "shmem_kb": 0, "cpu_s": []})
        e["boots"] += 1
        pk = st.get("peak", {})
        e["hwm_kb"] = max(e["hwm_kb"], pk.get("VmHWM", 0))
        e["private_kb"] = max(e["private_kb"], pk.get("private", 0))
        e["shmem_kb"] = max(e["shmem_kb"], pk.get("RssShmem", 0))
        if st.get("cpu_user_s") is not None:
            e["cpu_s"].append(st["cpu_user_s"] + st["cpu_sys_s"])
    for e in cost.values():
        e["cpu_s_per_boot"] = round(med(e["cpu_s"]), 2) if e["cpu_s"] else None
        e["under_64mib"] = e["private_kb"] < 64 * 1024
    res["daemon_cost"] = list(cost.values())

    rows = res.get("proto", {}).get("rows", [])
    ps = {"rate": [], "callgrind": [], "extra": []}
    rg, cg, ex, plain = {}, {}, {}, {}
    for r in rows:
        if r.get("kind") == "rate":
            if r.get("queues", 1) != 1 or r.get("blocked_lock") or "," in r["daemon"]:
                k = (r["daemon"], r["op"], r["depth"], r.get("queues", 1),
                     bool(r.get("blocked_lock")))
                ex.setdefault(k, []).append((r.get("round"), r["req_per_s"]))
                continue
            rg.setdefault((r["daemon"], r["op"], r["depth"]), []).append(r["req_per_s"])
            plain[(r["daemon"], r["op"], r["depth"], r.get("round"))] = r["req_per_s"]
        elif r.get("kind") == "callgrind":
            cg.setdefault((r["daemon"], r["op"], r["requests"]), []).append(r["instructions_per_req"])
    for (d, op, n), v in sorted(cg.items()):
        ps["callgrind"].append({"daemon": d, "op": op, "requests": n,
                                "instructions_per_req": med(v), "all": v})
    for (d, op, depth), v in sorted(rg.items()):
        ps["rate"].append({"daemon": d, "op": op, "depth": depth, "req_per_s": med(v), "all": v})
    for (d, op, depth, q, lk), v in sorted(ex.items()):
        # Against the same daemon's plain rate of the same round (load moves whole rounds).
        paired = [x / plain[(d.split(",")[0], op, depth, rnd)] for rnd, x in v
                  if plain.get((d.split(",")[0], op, depth, rnd))]
        ps["extra"].append({"daemon": d, "op": op, "depth": depth, "queues": q,
                            "blocked_lock": lk, "req_per_s": med([x for _, x in v]),
                            "all": [x for _, x in v],
                            "vs_plain": med(paired) if paired else None, "vs_plain_all": paired})
    res["proto_summary"] = ps
    meta_report.summarize(res)
    return res


def combine(full, pr):
    """`full` with its pressure section replaced by the pressure section of run `pr`."""
    def keep(xs):
        return [x for x in xs if x.get("section") != "pressure"]

    def pressure(xs):
        return [x for x in xs if x.get("section") == "pressure"]

    out = dict(full)
    out["cells"] = keep(full.get("cells", [])) + pressure(pr.get("cells", []))
    out["boots"] = keep(full.get("boots", [])) + pressure(pr.get("boots", []))
    out["configs"] = {**full.get("configs", {}), **pr.get("configs", {})}
    ps = pr.get("settings", {})
    out["settings"] = {**full.get("settings", {}),
                       "pressure_file_size": ps.get("pressure_file_size"),
                       "pressure_runtime_s": ps.get("runtime_s"),
                       "pressure_repeats": ps.get("repeats")}
    pm = pr.get("machine", {})
    out["combined"] = [
        {"run_id": full["run_id"], "mode": full.get("mode"), "started": full.get("started"),
         "sections": "every section but pressure"},
        {"run_id": pr["run_id"], "mode": pr.get("mode"), "started": pr.get("started"),
         "sections": "pressure", "daxfsd": pm.get("daxfsd"), "guest_kernel": pm.get("guest_kernel"),
         "runtime_s": pr.get("settings", {}).get("runtime_s"),
         "repeats": pr.get("settings", {}).get("repeats"),
         "loadavg": [pm.get("loadavg_start"), pm.get("loadavg_end")]},
    ]
    out["run_id"] = f"{full['run_id']} + {pr['run_id']}"
    return out


# ---- markdown ---------------------------------------------------------------------------

def cell(summary, sec, cfg, job):
    for s in summary:
        if s["section"] == sec and s["config"] == cfg and s["job"] == job:
            return s
    return None


def bw_text(s):
    if s is None:
        return "-"
    if s["status"] == "unsupported":
        return "unsupported"
    if s["status"] == "failed":
        return "**failed**"
    t = f"{s['mib_s']:.1f}"
    if s["runs_ok"] < s["runs"]:
        t += f" ({s['runs_ok']}/{s['runs']} ok)"
    return t


def ratio(a, b):
    if not a or not b or a["status"] != "ok" or b["status"] != "ok" or not b["mib_s"]:
        return "-"
    return f"{a['mib_s'] / b['mib_s']:.2f}x"


def num(x, fmt="{:.0f}"):
    return "-" if x is None else fmt.format(x)


# The pressure section (bench/run.py PRESSURE_JOBS): jobs over a working set 4x the window,
# then the in-window cells with their tmpfs ceiling.
PRESSURE_4X = [
    ("randread-psync", "psync randread, 256M file"),
    ("seqread-psync", "psync seqread, 256M file"),
    ("randread-mmap", "mmap randread, 256M file"),
    ("randread-psync-multi", "psync randread, 4 jobs x 64M files"),
    ("smallfiles-randread-psync", "psync randread, 1,000 files x 64K"),
]
PRESSURE_INWIN = [("inwin-randread-psync", "tmpfs-randread-psync", "psync randread, 32M file"),
                  ("inwin-randread-mmap", "tmpfs-randread-mmap", "mmap randread, 32M file")]
PRESSURE_KEYS = ("nodax", "dax-upstream", "dax-hybrid")
# Runs since copy slots (issue 13): the same two policies with --dax-copy=off; the main DAX
# configurations then run the daemon's default --dax-copy=auto.
PRESSURE_NOCOPY = ("dax-upstream-nocopy", "dax-hybrid-nocopy")


def has_nocopy(S):
    return any(s["section"] == "pressure" and s["config"] in PRESSURE_NOCOPY for s in S)


def copy_md(res, S, w):
    """The copy-slot table: each policy with --dax-copy=off and with auto, same run."""
    w("\nCopy slots (`--dax-copy`, issue 13): each DAX policy run again with `--dax-copy=off` "
      "in the same run. With the default `auto` the daemon serves read-only ranges from copies "
      "in one window-sized memfd while the guest recycles more than 32 ranges a second; a "
      "removed copy stays mapped in QEMU and the next read-only map of that window range "
      "refills it in place, so a miss no longer changes QEMU's memory map. MiB/s:\n")
    w("| job | upstream, off | upstream, auto | auto / off | hybrid, off | hybrid, auto "
      "| auto / off | hybrid / upstream, off | hybrid / upstream, auto | hybrid auto / no DAX |")
    w("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for j, label in PRESSURE_4X + [(j, label) for j, _, label in PRESSURE_INWIN]:
        nd, uo, ua, ho, ha = (cell(S, "pressure", k, j) for k in
                              ("nodax", "dax-upstream-nocopy", "dax-upstream",
                               "dax-hybrid-nocopy", "dax-hybrid"))
        if uo or ua or ho or ha:
            w(f"| {label} | {bw_text(uo)} | {bw_text(ua)} | {ratio(ua, uo)} | {bw_text(ho)} "
              f"| {bw_text(ha)} | {ratio(ha, ho)} | {ratio(ho, uo)} | {ratio(ha, ua)} "
              f"| {ratio(ha, nd)} |")


def range_md(S, w):
    """The range-size table: the hybrid policy with its default ranges and with 2 MiB."""
    w("\nRange size (`dax_range=`, guest-kernel patch 0006): the hybrid policy maps 512 KiB "
      "ranges in this 64M window by default (the window over 128); `dax-hybrid-2m` mounts it "
      "with `dax_range=2M`, 6.12's size, in the same run. MiB/s:\n")
    w("| job | upstream (2 MiB) | hybrid, 2 MiB | hybrid, 512 KiB | 512 KiB / 2 MiB "
      "| hybrid 2 MiB / upstream | hybrid 512 KiB / upstream |")
    w("|---|--:|--:|--:|--:|--:|--:|")
    for j, label in PRESSURE_4X + [(j, label) for j, _, label in PRESSURE_INWIN]:
        u, h2, h = (cell(S, "pressure", k, j) for k in
                    ("dax-upstream", "dax-hybrid-2m", "dax-hybrid"))
        if h2:
            w(f"| {label} | {bw_text(u)} | {bw_text(h2)} | {bw_text(h)} | {ratio(h, h2)} "
              f"| {ratio(h2, u)} | {ratio(h, u)} |")


def pressure_md(res, S, w):
    st_ = res.get("settings", {})
    w("## Window pressure: DAX policies\n")
    w("One daemon (daxfsd `--cache never --dax-window=64M`), one QEMU 11.1, "
      "one guest kernel (guest-kernel/patches); the mount option picks the configuration: "
      "`dax=never` (no DAX), `dax=always,dax_policy=upstream` (Linux 6.12's window management: "
      "32 ranges of 2 MiB; every miss maps a range, evicting a busy one inline) or "
      "`dax=always,dax_policy=hybrid` (128 ranges of 512 KiB; misses go to FUSE_READ/WRITE "
      "unless the range is admitted and a free range is at hand; page faults map; LRU reclaim, "
      "batched, off the I/O path). 4 KiB blocks, "
      f"{st_.get('pressure_runtime_s') or st_.get('runtime_s')} s per job, MiB/s, median of "
      f"{st_.get('pressure_repeats') or st_.get('repeats')} boot(s) per "
      "configuration.\n")
    w("Working set 4x the window:\n")
    w("| job | no DAX | DAX upstream | DAX hybrid | upstream / no DAX | hybrid / no DAX "
      "| hybrid / upstream |")
    w("|---|--:|--:|--:|--:|--:|--:|")
    for j, label in PRESSURE_4X:
        a, b, c = (cell(S, "pressure", k, j) for k in PRESSURE_KEYS)
        if a or b or c:
            w(f"| {label} | {bw_text(a)} | {bw_text(b)} | {bw_text(c)} | {ratio(b, a)} "
              f"| {ratio(c, a)} | {ratio(c, b)} |")
    w("\nInside the window (a 32M file, read first in each boot), against the same guest "
      "reading a 32M file on its own tmpfs in the same boot (the ceiling for DAX, whose reads "
      "are guest memory copies too):\n")
    w("| job | no DAX | DAX upstream | DAX hybrid | tmpfs (hybrid boot) | no DAX / tmpfs "
      "| upstream / tmpfs | hybrid / tmpfs |")
    w("|---|--:|--:|--:|--:|--:|--:|--:|")
    for j, t, label in PRESSURE_INWIN:
        a, b, c = (cell(S, "pressure", k, j) for k in PRESSURE_KEYS)
        ta, tb, tc = (cell(S, "pressure", k, t) for k in PRESSURE_KEYS)
        w(f"| {label} | {bw_text(a)} | {bw_text(b)} | {bw_text(c)} | {bw_text(tc)} "
          f"| {ratio(a, ta)} | {ratio(b, tb)} | {ratio(c, tc)} |")
    if has_nocopy(S):
        copy_md(res, S, w)
    has_2m = any(s["section"] == "pressure" and s["config"] == "dax-hybrid-2m" for s in S)
    if has_2m:
        range_md(S, w)
    cnt = []
    for k in (PRESSURE_KEYS[1:] + (PRESSURE_NOCOPY if has_nocopy(S) else ())
              + (("dax-hybrid-2m",) if has_2m else ())):
        bs = [b for b in res.get("boots", []) if b["section"] == "pressure" and b["config"] == k
              and b.get("dax_counters")]
        if bs:
            maps = med([b["dax_counters"].get("maps") for b in bs])
            unmaps = med([b["dax_counters"].get("unmaps") for b in bs])
            t = f"`{k}`: {maps:.0f} SETUPMAPPINGs and {unmaps:.0f} ranges removed per boot"
            if any("copies" in b["dax_counters"] for b in bs):
                copies = med([b["dax_counters"].get("copies", 0) for b in bs])
                reused = med([b["dax_counters"].get("reused", 0) for b in bs])
                t += f" ({copies:.0f} copy slots mapped, {reused:.0f} refilled in place)"
            cnt.append(t)
    if cnt:
        w("\nDAX window traffic (daxfsd's counters, median per boot, all jobs): "
          + "; ".join(cnt) + ".")
    w("")


def render_md(res):
    S = res.get("summary", [])
    m = res.get("machine", {})
    st = res.get("settings", {})
    out = []
    w = out.append
    w(f"# daxfsd benchmark report: run {res['run_id']}\n")
    if res.get("combined"):
        full, pr = res["combined"]
        others = [(k, res[k]["from_run"]["run_id"]) for k in ("host", "proto", "meta", "density",
                                                                 "notify")
                  if isinstance(res.get(k), dict) and res[k].get("from_run")]
        what = {"host": "host-mount section", "proto": "protocol section",
                "meta": "meta section", "density": "density section",
                "notify": "notify section"}
        runs = dict(others)
        if runs.get("density") and runs.get("meta") == runs.get("density"):
            # One run gave both.
            others = [(k, x) for k, x in others if k != "density"]
            what["meta"] = "meta and density sections"
        # The density run first: a later --meta-from replaces an earlier one's sections.
        extra = "".join(f" --{'meta' if k in ('density', 'notify') else k}-from {r}.json"
                        for k, r in sorted(others, key=lambda o: o[0] != "density"))
        w(f"**{2 + len(others)} runs combined** (`bench/report.py {full['run_id']}.json --pressure-from "
          f"{pr['run_id']}.json{extra}`): the window-pressure section comes from run {pr['run_id']} "
          f"(started {pr['started']}, "
          f"{pr.get('daxfsd', '?')}, guest kernel {pr.get('guest_kernel', '?')} with "
          f"guest-kernel/patches, {pr.get('repeats')} boots per configuration x "
          f"{pr.get('runtime_s')} s, host load "
          f"{' '.join((pr.get('loadavg') or [[]])[0] or [])} at its start)"
          + "".join(f"; the {what[k]} from run {r}"
                    for k, r in others)
          + "; every other section "
          f"from run {full['run_id']} (started {full['started']}). Each run's own report: "
          f"`bench/results/{full['run_id']}.md`, `bench/results/{pr['run_id']}.md`. Ratios are "
          "only taken between configurations of the same run.\n")
    dur = res.get("duration_s")
    w(f"{res.get('mode', '?')} run, {res.get('started', '?')} to {res.get('finished', '?')}"
      + (f" ({dur / 60:.1f} min; estimated {res.get('estimate_s', 0) / 60:.1f} min)" if dur else "")
      + (", **interrupted**" if res.get("interrupted") else "")
      + ". Every cell with its repeats, latencies and daemon cost: "
      + ", ".join(f"`bench/results/{r['run_id']}.json`" for r in res.get("combined", [res])) + "."
      + f" Raw fio output and console logs: `{res.get('raw_dir', '?')}`.\n")
    w("Absolute numbers are TCG numbers on a shared 2-core host and move with its load: "
      "compare the ratios, which come from configurations measured side by side in one run "
      "(each repeat boots every configuration once, in turn).\n")

    w("## Machine\n")
    w("| | |\n|---|---|")
    for k, label in [("cpu_model", "CPU"), ("host_cores", "host cores"), ("host_mem_gib", "host RAM (GiB)"),
                     ("host_os", "host OS"), ("host_kernel", "host kernel"),
                     ("qemu_11", "QEMU (every guest: profile `dax`)"), ("qemu_system", "Debian QEMU (not used)"),
                     ("accel", "accelerator"), ("guest_kernel", "guest kernel"),
                     ("daxfsd", "daxfsd"), ("virtiofsd", "virtiofsd")]:
        w(f"| {label} | {m.get(k, '?')} |")
    w(f"| guest | {st.get('cpus')} vCPU (4 for the multi-queue runs), {st.get('mem')} RAM, fio {fio_version(res)} |")
    w(f"| host load average (1/5/15 min) | start {' '.join(m.get('loadavg_start', []))}, "
      f"end {' '.join(m.get('loadavg_end', []))} |\n")

    w("## Settings\n")
    w(f"- fio: 4 KiB blocks, `--time_based --runtime={st.get('runtime_s')}`, "
      f"{st.get('repeats')} repeat(s) per cell, **median** reported; libaio at iodepth 16; "
      f"\"multi\" = 4 jobs, one file each. Data files: {st.get('file_size')} each, random bytes, "
      "made on the host before each boot.")
    w("- QEMU profile `dax` for every guest (QEMU 11.1, `vhost-user-test-device-pci` as virtio-fs). "
      "It is the only profile with a DAX window, and upstream virtiofsd serves it too, so DAX vs "
      "non-DAX (same daxfsd command line, only the mount option differs) and daxfsd vs virtiofsd "
      "are measured on the same QEMU, device and guest kernel.")
    w("- Configurations: " + "; ".join(
        f"`{k}` = {CONFIGS[k]}" for k in ("daxfsd-never", "daxfsd-never-dax", "daxfsd-auto",
                                          "virtiofsd-never", "virtiofsd-auto")) + ".")
    w("  daxfsd runs with `--dax-window=512M` in all three (mounted `-o dax=never` or `-o dax=always`); "
      "`--allow-mmap` with `--cache never` for both daemons (FUSE_DIRECT_IO_ALLOW_MMAP), so mmap "
      "without DAX is measured instead of being unsupported as in the seed. Both daemons run with "
      "their default sandbox and seccomp.\n")

    jobs = [j for j in SEED_JOBS if any(s["job"] == j and s["section"] == "matrix" for s in S)]
    if jobs:
        w("## fio matrix, MiB/s\n")
        w("| I/O operation | daxfsd never | daxfsd never + DAX | **DAX / non-DAX** | daxfsd auto "
          "| virtiofsd never | virtiofsd auto | **daxfsd / virtiofsd** never | **daxfsd / virtiofsd** auto "
          "| seed: none / none+DAX |")
        w("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
        for j in jobs:
            c = {k: cell(S, "matrix", k, j) for k in ("daxfsd-never", "daxfsd-never-dax", "daxfsd-auto",
                                                      "virtiofsd-never", "virtiofsd-auto")}
            seed = SEED.get(j)
            seed_txt = f"{seed[0]} / {seed[1]}" if seed else "-"
            w(f"| {j} | {bw_text(c['daxfsd-never'])} | {bw_text(c['daxfsd-never-dax'])} "
              f"| {ratio(c['daxfsd-never-dax'], c['daxfsd-never'])} | {bw_text(c['daxfsd-auto'])} "
              f"| {bw_text(c['virtiofsd-never'])} | {bw_text(c['virtiofsd-auto'])} "
              f"| {ratio(c['daxfsd-never'], c['virtiofsd-never'])} | {ratio(c['daxfsd-auto'], c['virtiofsd-auto'])} "
              f"| {seed_txt} |")
        w("")
        w("### In the seed's layout (cache=none vs cache=none + DAX)\n")
        w("```")
        w(f"{'NAME':<28}{'I/O Operation':<24}BW(Read/Write)")
        for j in jobs:
            for cfg, nm in (("daxfsd-never", "daxfsd-cache-none"), ("daxfsd-never-dax", "daxfsd-cache-none-dax")):
                s = cell(S, "matrix", cfg, j)
                bw = ("0(KiB/s)" if s and s["status"] == "unsupported" else
                      "failed" if not s or s["status"] != "ok" else f"{s['mib_s']:.1f}(MiB/s)")
                w(f"{nm:<28}{j:<24}{bw}")
        w("```\n")

        w("### IOPS, completion latency and daemon CPU per cell\n")
        w("Medians over the repeats. clat = fio completion latency; daemon CPU = the daemon's "
          "CPU time (all its processes, sampled from /proc every 200 ms) during the job, as % of one "
          "core and per I/O; spread = (max - min) / median of MiB/s over the repeats.\n")
        w("| I/O operation | configuration | MiB/s | IOPS | clat p50 us | clat p99 us | daemon CPU % "
          "| daemon CPU us/IO | spread | runs ok |")
        w("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
        for j in jobs:
            for k in ("daxfsd-never", "daxfsd-never-dax", "daxfsd-auto", "virtiofsd-never", "virtiofsd-auto"):
                s = cell(S, "matrix", k, j)
                if not s:
                    continue
                w(f"| {j} | {k} | {bw_text(s)} | {num(s['iops'])} | {num(s['clat_p50_us'], '{:.1f}')} "
                  f"| {num(s['clat_p99_us'], '{:.1f}')} | {num(s['daemon_cpu_pct'], '{:.1f}')} "
                  f"| {num(s['daemon_cpu_us_per_io'], '{:.1f}')} | {num(s['spread_pct'], '{:.0f}%')} "
                  f"| {s['runs_ok']}/{s['runs']} |")
        w("")

    cost = res.get("daemon_cost", [])
    if cost:
        w("## Daemon cost per configuration\n")
        w("Peak RSS = the kernel's high-water mark (VmHWM) summed over the daemon's processes "
          "(the namespace sandbox forks one). It includes guest RAM the daemon touched through "
          "its shared mapping of the guest's memory (RssShmem: buffers it copied file data "
          "into or out of), which is guest memory, not the daemon's; own memory = peak "
          "RssAnon + RssFile, the part the 64 MiB budget is about. CPU = user + system seconds "
          "of a whole boot (start-up, every job, exit), median over the repeats.\n")
        w("| section | configuration | boots | peak RSS MiB | own memory peak MiB | guest RAM touched MiB "
          "| CPU s per boot | own memory < 64 MiB |")
        w("|---|---|--:|--:|--:|--:|--:|---|")
        for e in cost:
            w(f"| {e['section']} | {e['config']} | {e['boots']} | {e['hwm_kb'] / 1024:.1f} "
              f"| {e['private_kb'] / 1024:.1f} | {e['shmem_kb'] / 1024:.1f} | {num(e['cpu_s_per_boot'], '{:.2f}')} "
              f"| {'yes' if e['under_64mib'] else '**NO**'} |")
        w("")

    if any(s["section"] == "pressure" and s["config"] == "dax-hybrid" for s in S):
        pressure_md(res, S, w)
    pj = [j for j in ("randread-psync", "randread-mmap") if any(s["section"] == "pressure" and s["job"] == j
                                                               and s["config"] == "dax-64M" for s in S)]
    if pj:
        st_ = res.get("settings", {})
        w("## Window pressure\n")
        w(f"randread over one {st_.get('pressure_file_size')} file, 4 KiB, daxfsd `--cache never`: the "
          "working set is 4x a 64M DAX window, so the guest keeps reclaiming 2 MiB ranges "
          "(REMOVEMAPPING + SETUPMAPPING). MiB/s, median.\n")
        w("| I/O operation | no DAX | DAX, 64M window | DAX, 1G window | DAX 64M / no DAX | DAX 64M / DAX 1G |")
        w("|---|--:|--:|--:|--:|--:|")
        for j in pj:
            a, b, c = (cell(S, "pressure", k, j) for k in ("nodax", "dax-64M", "dax-1G"))
            w(f"| {j} | {bw_text(a)} | {bw_text(b)} | {bw_text(c)} | {ratio(b, a)} | {ratio(b, c)} |")
        cnt = []
        for k in ("dax-64M", "dax-1G"):
            bs = [b for b in res.get("boots", []) if b["section"] == "pressure" and b["config"] == k
                  and b.get("dax_counters")]
            if bs:
                maps = med([b["dax_counters"].get("maps") for b in bs])
                unmaps = med([b["dax_counters"].get("unmaps") for b in bs])
                ios = med([sum(c.get("total_ios", 0) for c in res.get("cells", [])
                               if c["boot"] == b["id"] and c["status"] == "ok") for b in bs])
                per = f", {maps / ios:.2f} maps per I/O" if ios else ""
                cnt.append(f"`{k}`: {maps:.0f} SETUPMAPPINGs and {unmaps:.0f} removals per boot{per}")
        if cnt:
            w("\nDAX window traffic (daxfsd's counters, median per boot, both jobs): " + "; ".join(cnt) + ".")
        w("")

    mj = [j for j in ("randread-psync-multi", "randread-libaio-multi") if any(s["section"] == "mq" and s["job"] == j for s in S)]
    if mj:
        w("## Request queues\n")
        w("4-vCPU guest, 4 jobs on 4 files, `--cache never`, no DAX; `--queues N` in vm.sh "
          "(num_vqs = 1 + N) and `--queues=N` for daxfsd. MiB/s, median.\n")
        w("| I/O operation | daxfsd 1 queue | daxfsd 2 | daxfsd 4 | virtiofsd 1 | virtiofsd 2 | virtiofsd 4 "
          "| daxfsd 4 / 1 | daxfsd / virtiofsd, 1 queue |")
        w("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
        for j in mj:
            c = {k: cell(S, "mq", k, j) for k in ("daxfsd-q1", "daxfsd-q2", "daxfsd-q4",
                                                  "virtiofsd-q1", "virtiofsd-q2", "virtiofsd-q4")}
            w(f"| {j} | {bw_text(c['daxfsd-q1'])} | {bw_text(c['daxfsd-q2'])} | {bw_text(c['daxfsd-q4'])} "
              f"| {bw_text(c['virtiofsd-q1'])} | {bw_text(c['virtiofsd-q2'])} | {bw_text(c['virtiofsd-q4'])} "
              f"| {ratio(c['daxfsd-q4'], c['daxfsd-q1'])} | {ratio(c['daxfsd-q1'], c['virtiofsd-q1'])} |")
        uns = [s for s in S if s["section"] == "mq" and s["status"] == "unsupported"]
        if uns:
            w(f"\nunsupported: {uns[0]['config']}...: {'; '.join(uns[0]['errors'])}")
        w("")

    ps = res.get("proto_summary", {})
    if ps.get("rate") or ps.get("callgrind"):
        st_ = res.get("settings", {})
        w("## Protocol microbenchmark (no VM)\n")
        fr = res.get("proto", {}).get("from_run")
        if fr:
            w(f"From run {fr['run_id']} (`--only proto`, started {fr['started']}; its own report: "
              f"`bench/results/{fr['run_id']}.md`).\n")
        w("`tests/vufs-driver/examples/protobench.rs`: the userspace virtio-fs driver plays QEMU "
          "and the guest over the vhost-user socket; one request queue, requests laid out as Linux "
          "lays them out, every reply checked. READ = 4 KiB at sequential offsets of a 64 MiB file "
          "(host page cache); GETATTR of that file. Both daemons: `--cache=never --sandbox=none`, "
          "seccomp `kill` for the rates and `none` under valgrind. The driver runs on the same 2 "
          "cores, so req/s is a round-trip figure of driver + daemon.\n")
        if ps.get("rate"):
            w(f"Requests per second (median of {st_.get('proto_rounds')} round(s) of "
              f"{st_.get('proto_seconds')} s, daemons alternating):\n")
            w("| request | in flight | daxfsd req/s | virtiofsd req/s | daxfsd / virtiofsd |")
            w("|---|--:|--:|--:|--:|")
            keys = sorted({(r["op"], r["depth"]) for r in ps["rate"]})
            for op, depth in keys:
                d = next((r for r in ps["rate"] if r["daemon"] == "daxfsd" and r["op"] == op and r["depth"] == depth), None)
                v = next((r for r in ps["rate"] if r["daemon"] == "virtiofsd" and r["op"] == op and r["depth"] == depth), None)
                rt = f"{d['req_per_s'] / v['req_per_s']:.2f}x" if d and v and v["req_per_s"] else "-"
                w(f"| {op.upper()} | {depth} | {num(d and d['req_per_s'])} | {num(v and v['req_per_s'])} | {rt} |")
            w("")
        extra = ps.get("extra", [])
        pools = {}
        for e in extra:
            name, _, args = e["daemon"].partition(",")
            if args.startswith("--thread-pool-size=") and e["queues"] == 1 and not e["blocked_lock"]:
                pools.setdefault((int(args.split("=")[1]), e["op"], e["depth"]), {})[name] = e
        if pools:
            w("With a worker pool (`--thread-pool-size`, both daemons; Kata passes 1, libvirt 4 "
              "when configured): req/s (median of the rounds, daemons alternating):\n")
            w("| pool | request | in flight | daxfsd req/s | virtiofsd req/s | daxfsd / virtiofsd |")
            w("|--:|---|--:|--:|--:|--:|")
            for (n, op, depth), by in sorted(pools.items()):
                d, v = by.get("daxfsd"), by.get("virtiofsd")
                rt = f"{d['req_per_s'] / v['req_per_s']:.2f}x" if d and v and v["req_per_s"] else "-"
                w(f"| {n} | {op.upper()} | {depth} | {num(d and d['req_per_s'])} | "
                  f"{num(v and v['req_per_s'])} | {rt} |")
            w("")
        if extra:
            w("Variants: req/s (median), and the ratio to the same daemon's plain rate at the same "
              "depth in the same round (median, range in brackets; the host's load moves whole "
              "rounds). virtiofsd 1.14 serves one request queue and has no POSIX locks, so those "
              "two rows are daxfsd's only:\n")
            w("| daemon | request | in flight | variant | req/s | / plain |")
            w("|---|---|--:|---|--:|--:|")
        for e in extra:
            name, _, args = e["daemon"].partition(",")
            rt = "-"
            if e.get("vs_plain"):
                rt = f"{e['vs_plain']:.2f}x"
                if len(e.get("vs_plain_all", [])) > 1:
                    rt += f" ({min(e['vs_plain_all']):.2f}-{max(e['vs_plain_all']):.2f})"
            if e["queues"] != 1:
                what = f"{e['queues']} request queues"
            elif e["blocked_lock"]:
                what = "a SETLKW waiting on the same queue (another file)"
            else:
                what = " ".join(a for a in args.split(",") if a)
            w(f"| {name} | {e['op'].upper()} | {e['depth']} | {what} | {num(e['req_per_s'])} | {rt} |")
        if extra:
            w("")
        if ps.get("callgrind"):
            n = ps["callgrind"][0]["requests"]
            w(f"Instructions per request (callgrind `Ir`, every thread of the daemon: a run of {n} "
              "requests minus a run of 0 requests with the same start-up (INIT, LOOKUPs, OPEN, OPENDIR) and exit, "
              f"divided by {n}; user-space instructions only, system calls not counted; median of "
              f"{st_.get('callgrind_rounds', 1)} run(s), range in brackets):\n")
            w("| request | daxfsd | virtiofsd | daxfsd / virtiofsd |")
            w("|---|--:|--:|--:|")
            for op in ("read", "getattr", "write", "lookup", "readdirplus"):
                d = next((r for r in ps["callgrind"] if r["daemon"] == "daxfsd" and r["op"] == op), None)
                v = next((r for r in ps["callgrind"] if r["daemon"] == "virtiofsd" and r["op"] == op), None)
                if not d and not v:
                    continue
                rt = f"{d['instructions_per_req'] / v['instructions_per_req']:.2f}x" if d and v else "-"

                def ir(x):
                    if not x:
                        return "-"
                    t = f"{x['instructions_per_req']:.0f}"
                    if len(x.get("all", [])) > 1:
                        t += f" ({min(x['all']):.0f}-{max(x['all']):.0f})"
                    return t
                w(f"| {op.upper()} | {ir(d)} | {ir(v)} | {rt} |")
            w("")

    bad = [s for s in S if s["status"] == "failed"]
    perr = [r for r in res.get("proto", {}).get("rows", []) if r.get("kind") == "error"]
    w("## Failures\n")
    if not bad and not perr:
        w("None.\n")
    for s in bad:
        w(f"- {s['section']} `{s['config']}` {s['job']}: {'; '.join(s['errors'])} "
          f"(console log: {', '.join(sorted(set(filter(None, s['console_logs']))))})")
    for r in perr:
        w(f"- proto {r['what']}: `{r['error'][-300:]}`")
    if bad or perr:
        w("")

    boots = [b for b in res.get("boots", []) if "wall_s" in b]
    if boots:
        bt = [b["boot_to_mount_s"] for b in boots if b.get("boot_to_mount_s")]
        w("## Run time\n")
        w(f"{len(boots)} guest boots, {sum(b['wall_s'] for b in boots) / 60:.1f} min of VM time; "
          f"boot to mount median {num(med(bt), '{:.1f}')} s. `scripts/bench.sh --estimate` prints the "
          "planned duration of a matrix without running it.\n")
    host_report.render_md(res, w)
    meta_report.render_md(res, w)
    notify_report.render_md(res, w)
    return "\n".join(out) + "\n"


def fio_version(res):
    for c in res.get("cells", []):
        if c.get("fio_version"):
            return c["fio_version"]
    return "?"


# ---- chart ------------------------------------------------------------------------------

COLORS = {
    "daxfsd-never": "#4c72b0", "daxfsd-never-dax": "#dd8452", "daxfsd-auto": "#8fb0de",
    "virtiofsd-never": "#55a868", "virtiofsd-auto": "#a5d6a7",
}


def render_png(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    S = res.get("summary", [])
    jobs = [j for j in SEED_JOBS if any(s["job"] == j and s["section"] == "matrix" for s in S)]
    cfgs = [k for k in COLORS if any(s["config"] == k and s["section"] == "matrix" for s in S)]
    height = max(6.0, 0.42 * len(jobs) * max(1, len(cfgs)) / 3 + 2)
    has_host = bool(res.get("host", {}).get("summary"))
    meta_report.summarize(res)
    has_meta = bool(res.get("meta", {}).get("summary")) or any(
        c.get("status") == "ok" for c in res.get("density", {}).get("configs", []))
    has_notify = any(r.get("status") == "ok" for r in res.get("notify", {}).get("rows", []))
    if has_host:
        height += 3.5
    if has_meta:
        height += 4.0
    if has_notify:
        height += 3.5
    if (has_meta or has_notify) and not jobs and not has_host:
        # A meta/density run alone: only their panels.
        nr = bool(has_meta) + has_notify
        fig = plt.figure(figsize=(16, 5.5 * nr))
        gs = fig.add_gridspec(nr, 2, width_ratios=[2.2, 1], hspace=0.4)
        has_den = any(c.get("status") == "ok" for c in res.get("density", {}).get("configs", []))
        if has_meta:
            meta_report.render_png(res, [fig.add_subplot(gs[0, 0]), fig.add_subplot(gs[0, 1])]
                                   if has_den else [fig.add_subplot(gs[0, :])])
        if has_notify:
            notify_report.render_png(res, [fig.add_subplot(gs[nr - 1, :])])
        m = res.get("machine", {})
        fig.suptitle(f"daxfsd benchmark {res['run_id']}: {m.get('cpu_model', '?')}, "
                     f"{m.get('host_cores')} host cores, {m.get('qemu_11', '?')}, "
                     f"{m.get('accel', 'tcg').upper()}", fontsize=11)
        fig.savefig(path, dpi=90, bbox_inches="tight")
        plt.close(fig)
        return
    fig = plt.figure(figsize=(16, height))
    nrows = 3 + has_host + has_meta + has_notify
    gs = fig.add_gridspec(nrows, 2, width_ratios=[1.6, 1], hspace=0.55, wspace=0.25)
    ax = fig.add_subplot(gs[:3, 0])
    if has_host:
        host_report.render_png(res, [fig.add_subplot(gs[3, :])])
    if has_meta:
        meta_report.render_png(res, [fig.add_subplot(gs[3 + has_host, 0]),
                                     fig.add_subplot(gs[3 + has_host, 1])])
    if has_notify:
        notify_report.render_png(res, [fig.add_subplot(gs[nrows - 1, :])])
    n = max(1, len(cfgs))
    bh = 0.8 / n
    for i, k in enumerate(cfgs):
        ys, xs, labels = [], [], []
        for r, j in enumerate(jobs):
            s = cell(S, "matrix", k, j)
            y = r + (i - (n - 1) / 2) * bh
            if s and s["status"] == "ok" and s["mib_s"]:
                ys.append(y)
                xs.append(s["mib_s"])
            elif s:
                labels.append((y, "unsupported" if s["status"] == "unsupported" else "FAILED"))
        ax.barh(ys, xs, height=bh, color=COLORS[k], label=CONFIGS[k])
        for y, t in labels:
            ax.text(0.0, y, " " + t, va="center", fontsize=6, color="red",
                    transform=ax.get_yaxis_transform())
    ax.set_yticks(range(len(jobs)))
    ax.set_yticklabels(jobs, fontsize=8)
    ax.invert_yaxis()
    if any(s["section"] == "matrix" and s["status"] == "ok" and s["mib_s"] for s in S):
        ax.set_xscale("log")
    ax.set_xlabel("MiB/s (log scale), median")
    st = res.get("settings", {})
    ax.set_title(f"fio 4 KiB, {st.get('runtime_s')} s x {st.get('repeats')} run(s), "
                 f"{st.get('cpus')} vCPU guest, QEMU 11.1 TCG", fontsize=10)
    ax.grid(axis="x", which="both", alpha=0.3)
    # Below the x label: 0.55 inch, in axes fractions.
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.55 / (height * 0.85)),
              ncol=3, frameon=False)
    # DAX/non-DAX ratio next to each job.
    for r, j in enumerate(jobs):
        a, b = cell(S, "matrix", "daxfsd-never-dax", j), cell(S, "matrix", "daxfsd-never", j)
        t = ratio(a, b)
        if t != "-":
            ax.text(1.01, r, f"DAX {t}", transform=ax.get_yaxis_transform(), va="center", fontsize=7)

    def bars(axp, title, entries, xlabel_fmt="{:.0f}", ylabel="MiB/s"):
        names = [e[0] for e in entries]
        vals = [e[1] or 0 for e in entries]
        cols = [e[2] for e in entries]
        axp.bar(range(len(entries)), vals, color=cols)
        axp.set_ylim(0, (max(vals) if vals and max(vals) > 0 else 1) * 1.3)
        axp.set_xticks(range(len(entries)))
        axp.set_xticklabels(names, fontsize=7, rotation=20, ha="right")
        axp.set_title(title, fontsize=9)
        axp.set_ylabel(ylabel, fontsize=8)
        axp.tick_params(axis="y", labelsize=7)
        for i, (v, e) in enumerate(zip(vals, entries)):
            axp.text(i, v, e[3] if len(e) > 3 else (xlabel_fmt.format(v) if v else "n/a"),
                     ha="center", va="bottom", fontsize=7)

    # Window pressure.
    axp = fig.add_subplot(gs[0, 1])
    if any(s["section"] == "pressure" and s["config"] == "dax-hybrid" for s in S):
        cols = {"nodax": "#4c72b0", "dax-upstream": "#dd8452", "dax-hybrid": "#55a868",
                "dax-upstream-nocopy": "#f2c9a8", "dax-hybrid-nocopy": "#b4dcb9"}
        short = {"randread-psync": "randread", "seqread-psync": "seqread",
                 "randread-mmap": "mmap rand", "randread-psync-multi": "4 jobs",
                 "smallfiles-randread-psync": "1000 files", "inwin-randread-psync": "in-win psync",
                 "inwin-randread-mmap": "in-win mmap"}
        jobs_p = [j for j, _ in PRESSURE_4X] + [j for j, _, _ in PRESSURE_INWIN]
        keys = PRESSURE_KEYS
        if has_nocopy(S):
            keys = ("nodax", "dax-upstream-nocopy", "dax-upstream", "dax-hybrid-nocopy",
                    "dax-hybrid")
        bw_ = 0.8 / len(keys)
        for i, k in enumerate(keys):
            xs, vs = [], []
            for r, j in enumerate(jobs_p):
                c_ = cell(S, "pressure", k, j)
                if c_ and c_["status"] == "ok" and c_["mib_s"]:
                    xs.append(r + (i - (len(keys) - 1) / 2) * bw_)
                    vs.append(c_["mib_s"])
            label = CONFIGS[k]
            if has_nocopy(S) and k in ("dax-upstream", "dax-hybrid"):
                label += " (copy auto)"
            axp.bar(xs, vs, width=bw_, color=cols[k], label=label)
        axp.set_yscale("log")
        axp.set_xticks(range(len(jobs_p)))
        axp.set_xticklabels([short[j] for j in jobs_p], fontsize=7, rotation=20, ha="right")
        axp.set_ylabel("MiB/s (log)", fontsize=8)
        axp.tick_params(axis="y", labelsize=7)
        axp.set_title("window pressure: 4x a 64M window, and in-window"
                      + (f"\n(run {res['combined'][1]['run_id']})" if res.get("combined") else ""),
                      fontsize=9)
        lo, hi = axp.get_ylim()
        axp.set_ylim(lo, hi * 30)  # room for the legend above the bars
        axp.legend(fontsize=6, loc="upper left", frameon=False, ncol=2)
    ent = []
    for j in ("randread-psync", "randread-mmap"):
        for k, col in (("nodax", "#4c72b0"), ("dax-64M", "#dd8452"), ("dax-1G", "#f2b880")):
            s = cell(S, "pressure", k, j)
            if s:
                ent.append((f"{j.split('-')[1]}\n{k}", s["mib_s"] if s["status"] == "ok" else None, col))
    if ent and not any(s["section"] == "pressure" and s["config"] == "dax-hybrid" for s in S):
        bars(axp, f"window pressure: randread, {st.get('pressure_file_size')} file, 64M window", ent, "{:.1f}")
    elif not ent and not any(s["section"] == "pressure" and s["config"] == "dax-hybrid" for s in S):
        axp.axis("off")
    # Request queues.
    axq = fig.add_subplot(gs[1, 1])
    plotted = False
    for j, ls in (("randread-psync-multi", "-"), ("randread-libaio-multi", "--")):
        for dmn, col in (("daxfsd", "#4c72b0"), ("virtiofsd", "#55a868")):
            pts = []
            for q in (1, 2, 4):
                s = cell(S, "mq", f"{dmn}-q{q}", j)
                if s and s["status"] == "ok":
                    pts.append((q, s["mib_s"]))
            if pts:
                axq.plot([p[0] for p in pts], [p[1] for p in pts], ls, marker="o", color=col,
                         label=f"{dmn} {j.replace('randread-', '')}")
                plotted = True
    if plotted:
        axq.set_xticks([1, 2, 4])
        axq.set_xlabel("request queues (4 vCPU, 4 jobs)", fontsize=8)
        axq.set_ylabel("MiB/s", fontsize=8)
        axq.set_title("request queues: randread, cache=never, no DAX", fontsize=9)
        axq.legend(fontsize=7)
        axq.tick_params(labelsize=7)
        axq.set_ylim(bottom=0)
    else:
        axq.axis("off")
    # Protocol microbenchmark.
    axr = fig.add_subplot(gs[2, 1])
    ps = res.get("proto_summary", {})
    ent = []
    for op in ("read", "getattr"):
        for dmn, col in (("daxfsd", "#4c72b0"), ("virtiofsd", "#55a868")):
            r = next((x for x in ps.get("callgrind", []) if x["daemon"] == dmn and x["op"] == op), None)
            rr = next((x for x in ps.get("rate", []) if x["daemon"] == dmn and x["op"] == op and x["depth"] == 1), None)
            if r or rr:
                lab = f"{r['instructions_per_req']:.0f} instr" if r else "n/a"
                if rr:
                    lab += f"\n{rr['req_per_s'] / 1000:.0f}k req/s"
                ent.append((f"{op.upper()}\n{dmn}", r["instructions_per_req"] if r else 0, col, lab))
    if ent:
        title = "protocol: instructions per request (callgrind); req/s at depth 1"
        fr = res.get("proto", {}).get("from_run")
        if fr:
            title += f"\n(run {fr['run_id']})"
        bars(axr, title, ent, ylabel="instructions / request")
        axr.set_ylim(top=(max(e[1] for e in ent) or 1) * 1.4)
    else:
        axr.axis("off")
    m = res.get("machine", {})
    fig.suptitle(f"daxfsd benchmark {res['run_id']}: {m.get('cpu_model', '?')}, {m.get('host_cores')} host cores, "
                 f"{m.get('qemu_11', '?')}, {m.get('accel', 'tcg').upper()}", fontsize=11)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def render(res, md_path, png_path):
    summarize(res)
    with open(md_path, "w") as f:
        f.write(render_md(res))
    try:
        render_png(res, png_path)
    except ImportError as e:
        print(f"report: no chart ({e}); install python3-matplotlib", file=sys.stderr)
    except Exception as e:  # noqa: BLE001  (a chart problem must not lose the report)
        print(f"report: ERROR drawing {png_path}: {e!r}", file=sys.stderr)


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) >= 2 else 2
    src = sys.argv[1]
    base = os.path.splitext(src)[0]
    md, png = base + ".md", base + ".png"
    args = sys.argv[2:]
    pfrom = hfrom = qfrom = None
    mfrom = []
    while args:
        if args[0] == "--md" and len(args) > 1:
            md = args[1]
        elif args[0] == "--png" and len(args) > 1:
            png = args[1]
        elif args[0] == "--pressure-from" and len(args) > 1:
            pfrom = args[1]
        elif args[0] == "--host-from" and len(args) > 1:
            hfrom = args[1]
        elif args[0] == "--proto-from" and len(args) > 1:
            qfrom = args[1]
        elif args[0] == "--meta-from" and len(args) > 1:
            mfrom.append(args[1])
        else:
            print(__doc__, file=sys.stderr)
            return 2
        args = args[2:]
    res = json.load(open(src))
    if pfrom:
        res = combine(res, json.load(open(pfrom)))
    if hfrom:
        h = json.load(open(hfrom))
        res["host"] = dict(h["host"], from_run={"run_id": h["run_id"], "started": h["started"]})
    if qfrom:
        q = json.load(open(qfrom))
        res["proto"] = dict(q["proto"], from_run={"run_id": q["run_id"], "started": q["started"]})
        for k in ("proto_seconds", "proto_rounds", "callgrind_rounds"):
            if k in q.get("settings", {}):
                res.setdefault("settings", {})[k] = q["settings"][k]
    for f in mfrom:
        q = json.load(open(f))
        for k in ("meta", "density", "notify"):
            if k in q:
                res[k] = dict(q[k], from_run={"run_id": q["run_id"], "started": q["started"]})
    render(res, md, png)
    print(f"{md}\n{png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
