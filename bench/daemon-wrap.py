#!/usr/bin/env python3
"""Run a vhost-user-fs daemon and measure what it costs: `scripts/vm.sh -d bench/daemon-wrap.py`.

    BENCH_DAEMON=/path/to/daemon BENCH_STATS=out.json bench/daemon-wrap.py DAEMON-ARGS...

Starts BENCH_DAEMON with the arguments it was given (stdin/stdout/stderr inherited), forwards
SIGTERM/SIGINT/SIGHUP to it, and exits with its status. Meanwhile it samples the daemon and
every descendant (the namespace sandbox forks a child) from /proc every BENCH_SAMPLE_MS
(default 200 ms): CPU seconds (utime + stime) and memory (VmRSS, RssAnon, RssFile, RssShmem).
When the daemon has exited it writes BENCH_STATS (JSON):

    exit          the daemon's exit status (negative: killed by that signal)
    maxrss_kb     ru_maxrss from wait4; it counts this wrapper's own memory too (the forked
                  child's before exec), so read peak.VmHWM instead
    cpu_user_s, cpu_sys_s   from wait4 (whole lifetime, children included)
    peak          peak of each sampled memory field (KiB, summed over the processes);
                  VmHWM is the kernel's exact high-water mark of each process's RSS since exec
    samples       [[epoch_s, cpu_s, rss_kb, anon_kb, file_kb, shmem_kb], ...]

RssShmem is guest RAM the daemon touched through its shared mapping of the guest's memfd
(data it copied into or out of guest buffers): it is counted in VmRSS but is guest memory,
not the daemon's own. RssAnon + RssFile is what the daemon itself holds.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

from benchlib import descendants  # bench/benchlib.py, beside this script

TICK = os.sysconf("SC_CLK_TCK")


def sample(pid):
    cpu = 0.0
    mem = {"VmRSS": 0, "VmHWM": 0, "RssAnon": 0, "RssFile": 0, "RssShmem": 0}
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
            with open(f"/proc/{p}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
        cpu += (int(fields[11]) + int(fields[12])) / TICK
        for line in status.splitlines():
            key, _, val = line.partition(":")
            if key in mem:
                mem[key] += int(val.split()[0])
    return cpu, mem


def main():
    real = os.environ.get("BENCH_DAEMON")
    stats_path = os.environ.get("BENCH_STATS")
    if not real or not stats_path:
        sys.exit("daemon-wrap: set BENCH_DAEMON and BENCH_STATS")
    period = int(os.environ.get("BENCH_SAMPLE_MS", "200")) / 1000.0
    child = subprocess.Popen([real] + sys.argv[1:])

    def forward(sig, _frame):
        try:
            child.send_signal(sig)
        except OSError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)

    samples, peak = [], {"VmRSS": 0, "VmHWM": 0, "RssAnon": 0, "RssFile": 0, "RssShmem": 0,
                       "private": 0}
    done = threading.Event()

    def sampler():
        while not done.is_set():
            t = time.time()
            cpu, mem = sample(child.pid)
            if mem["VmRSS"]:
                samples.append([round(t, 3), round(cpu, 2), mem["VmRSS"], mem["RssAnon"],
                                mem["RssFile"], mem["RssShmem"]])
                for k, v in mem.items():
                    peak[k] = max(peak[k], v)
                peak["private"] = max(peak["private"], mem["RssAnon"] + mem["RssFile"])
            done.wait(period)

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    while True:
        try:
            _, status, ru = os.wait4(child.pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            status, ru = 0, None
            break
    done.set()
    th.join(timeout=2)
    code = os.waitstatus_to_exitcode(status)
    stats = {
        "daemon": real,
        "args": sys.argv[1:],
        "exit": code,
        "maxrss_kb": ru.ru_maxrss if ru else None,
        "cpu_user_s": round(ru.ru_utime, 3) if ru else None,
        "cpu_sys_s": round(ru.ru_stime, 3) if ru else None,
        "peak": peak,
        "sample_period_s": period,
        "samples": samples,
    }
    tmp = stats_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(stats, f)
    os.replace(tmp, stats_path)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
