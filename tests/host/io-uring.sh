#!/bin/bash
# shellcheck disable=SC2015 # "A && B || fail": fail when either A or B fails
# Host-mount tests of the FUSE-over-io-uring transport (daxfsd --mount --io-uring=...).
# Needs root (mount(2), the fuse module parameter) and a kernel with FUSE_IO_URING.
#
# Sets /sys/module/fuse/parameters/enable_uring for the run and restores the old value on
# every exit path (trap). Checks:
#   refuse_on_when_disabled  enable_uring=N: --io-uring=on exits 1 with a one-line error
#                            naming the fix, and leaves nothing mounted
#   auto_falls_back          enable_uring=N: --io-uring=auto serves through read(2) and logs why
#   ring_workload            enable_uring=Y, --io-uring=on: a workload (data integrity, 1 MiB
#                            writes, directories, renames, xattrs, both CPUs at once) passes,
#                            and the exit report proves the rings served it: ring requests > 0,
#                            read(2) requests other than FORGET/INTERRUPT = 1 (INIT)
#   ring_suite               tests/host/run.sh -t io-uring: the project's guest suite, host
#                            checks and escape checks on the io-uring mount, rings proven used
#   ring_pjdfstest           tests/host/pjdfstest.sh -t io-uring: pjdfstest on the io-uring
#                            mount passes the reference minus the exception list, rings used
#   blocking_lock_no_stall   --posix-lock: while a process on CPU 0 waits in SETLKW for a
#                            lock held by another process on CPU 0, that CPU's queue still
#                            serves (the holder's I/O and unlock), and the waiter gets the lock
#   lock_waiters_beyond_ring_entries  --posix-lock: 70 SETLKW waiters, more than the ring
#                            entries: the holder's close still returns, every waiter gets the
#                            lock in turn within 30 s, and spare entries were registered
#   clean_stop               SIGTERM with the mount busy: the last user is still served past
#                            the grace period, then the ring entries come back and the daemon
#                            exits 0 (every thread ended), nothing stays mounted
# Output: "CHECK PASS|FAIL name" lines (with those of the two sub-suites), then scripts/lib.sh's
# "io-uring: N passed, M failed" and end marker; exit 0 only
# when every check passed. The daemon runs with --passthrough=off so that file data, too,
# travels through the ring payloads (passthrough has its own variant).
# Usage: tests/host/io-uring.sh [DAXFSD] (default target/debug/daxfsd)
set -uo pipefail
RIG_TAG=io-uring
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$RIG_ROOT" || exit 1
DAXFSD=${1:-target/debug/daxfsd}
PARAM=/sys/module/fuse/parameters/enable_uring

[ "$(id -u)" = 0 ] || die "needs root (mount(2) and $PARAM)"
# Not a silent skip: a kernel without the transport fails the target, with the reason.
[ -e "$PARAM" ] || die "FAIL: $PARAM missing: this kernel has no FUSE_IO_URING (Linux 6.14+, CONFIG_FUSE_IO_URING=y)"
[ -x "$DAXFSD" ] || die "$DAXFSD not built (cargo build -p daxfsd)"
DAXFSD=$(realpath "$DAXFSD")

W=$(mktemp -d /tmp/daxfsd-uring-test.XXXXXX)
OLD=$(cat "$PARAM")
PID=
cleanup() {
    if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
        kill -TERM "$PID" 2>/dev/null
        wait "$PID" 2>/dev/null
    fi
    mountpoint -q "$W/mnt" 2>/dev/null && umount -l "$W/mnt"
    echo "$OLD" >"$PARAM"
    rm -rf "$W"
}
RIG_CLEANUP+=(cleanup)
mkdir -p "$W/src" "$W/mnt"

# ok, bad, run_subsuite and rig_summary come from scripts/lib.sh.

start() { # start LOG ARGS...: daemon in the background, waits for the mount
    local log=$1; shift
    RUST_LOG=info "$DAXFSD" --shared-dir "$W/src" --mount "$W/mnt" --xattr --passthrough=off "$@" >"$log" 2>&1 &
    PID=$!
    for _ in $(seq 150); do
        mountpoint -q "$W/mnt" && return 0
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    return 1
}
stop() { # stop: SIGTERM, wait (20 s at most, then SIGKILL: status 137); the daemon's status
    local rc=0
    kill -TERM "$PID" 2>/dev/null
    for _ in $(seq 200); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$PID" 2>/dev/null && kill -KILL "$PID"
    wait "$PID" || rc=$?
    PID=
    return $rc
}

# --- enable_uring=N -------------------------------------------------------------------
echo N >"$PARAM"
out=$("$DAXFSD" --shared-dir "$W/src" --mount "$W/mnt" --io-uring=on 2>&1)
rc=$?
if [ $rc -ne 1 ]; then
    bad refuse_on_when_disabled "exit status $rc, expected 1: $out"
elif mountpoint -q "$W/mnt"; then
    bad refuse_on_when_disabled "left a mount behind"
elif ! grep -q 'io-uring=on: fuse.enable_uring=N (as root: echo Y > /sys/module/fuse/parameters/enable_uring)' <<<"$out"; then
    bad refuse_on_when_disabled "error does not name the fix: $out"
else
    ok refuse_on_when_disabled
fi

if ! start "$W/auto.log" --io-uring=auto; then
    bad auto_falls_back "mount did not come up: $(tail -3 "$W/auto.log")"
else
    echo fallback >"$W/mnt/f" && [ "$(cat "$W/src/f")" = fallback ]
    st=$?
    stop
    if [ $st -ne 0 ]; then
        bad auto_falls_back "write/read through the mount failed"
    elif ! grep -q 'io-uring: not used: fuse.enable_uring=N' "$W/auto.log"; then
        bad auto_falls_back "no log line saying why: $(grep io-uring "$W/auto.log")"
    elif grep -q 'requests served from' "$W/auto.log"; then
        bad auto_falls_back "rings reported although disabled"
    else
        ok auto_falls_back
    fi
fi
rm -rf "${W:?}/src/"*

# --- enable_uring=Y -------------------------------------------------------------------
echo Y >"$PARAM"
workload() { # runs on $W/mnt; prints what failed
    local m=$W/mnt s=$W/src
    head -c 8M /dev/urandom >"$W/ref.bin"
    cp "$W/ref.bin" "$m/big.bin" || { echo "copy in"; return 1; }
    cmp -s "$W/ref.bin" "$s/big.bin" || { echo "host copy differs"; return 1; }
    # 1 MiB writes (max_write) and O_DIRECT reads: every byte through the ring payloads.
    dd if="$W/ref.bin" of="$m/direct.bin" bs=1M oflag=direct status=none || { echo "dd write"; return 1; }
    dd if="$m/direct.bin" of="$W/back.bin" bs=1M iflag=direct status=none || { echo "dd read"; return 1; }
    cmp -s "$W/ref.bin" "$W/back.bin" || { echo "O_DIRECT round trip differs"; return 1; }
    mkdir -p "$m/d/e/f" && touch "$m/d/e/f/x" && mv "$m/d/e/f/x" "$m/d/y" || { echo "dirs/rename"; return 1; }
    [ -e "$s/d/y" ] && [ ! -e "$s/d/e/f/x" ] || { echo "rename not seen on the host"; return 1; }
    ln -s y "$m/d/link" && [ "$(readlink "$m/d/link")" = y ] || { echo "symlink"; return 1; }
    setfattr -n user.k -v vvv "$m/d/y" 2>/dev/null || python3 -c "import os; os.setxattr('$m/d/y', 'user.k', b'vvv')"
    [ "$(python3 -c "import os; print(os.getxattr('$m/d/y', 'user.k').decode())")" = vvv ] || { echo "xattr"; return 1; }
    # Both CPUs at once (one ring queue each), 200 files apiece, then read back.
    local pids=""
    for cpu in 0 1; do
        # shellcheck disable=SC2016 # expanded by the inner shell
        taskset -c "$cpu" sh -c '
            for i in $(seq 200); do echo "$0-$i" >"$1/p$0-$i"; done
            for i in $(seq 200); do [ "$(cat "$1/p$0-$i")" = "$0-$i" ] || exit 1; done
            rm -f "$1"/p"$0"-*' "$cpu" "$m" &
        pids="$pids $!"
    done
    for p in $pids; do wait "$p" || { echo "parallel small files"; return 1; }; done
    ls "$m" >/dev/null && rm -rf "$m/d" "$m/big.bin" "$m/direct.bin" || { echo "cleanup"; return 1; }
}
if ! start "$W/ring.log" --io-uring=on; then
    bad ring_workload "mount did not come up: $(tail -3 "$W/ring.log")"
else
    what=$(workload 2>&1)
    st=$?
    stop
    rc=$?
    report=$(grep 'requests served from' "$W/ring.log" | tail -1)
    served=$(sed -n 's/.*io-uring: \([0-9]*\) requests served from.*/\1/p' <<<"$report")
    viaread=$(sed -n 's/.*read(2) requests other than FORGET\/INTERRUPT: \([0-9]*\);.*/\1/p' <<<"$report")
    if [ $st -ne 0 ]; then
        bad ring_workload "$what"
    elif [ $rc -ne 0 ]; then
        bad ring_workload "daemon exit status $rc"
    elif [ -z "$served" ] || [ "$served" -le 0 ]; then
        bad ring_workload "no requests served from the rings: ${report:-no report}"
    elif [ "$viaread" != 1 ]; then
        bad ring_workload "read(2) served $viaread requests other than FORGET/INTERRUPT (expected 1, INIT): $report"
    else
        echo "    ${report#*] }"
        ok ring_workload
    fi
fi

# The guest suite, host checks and escape checks of tests/host/run.sh over the rings (its
# io-uring transport also checks the ring counters in the SIGUSR1 report).
# Their checks count as this run's; each must run to its end marker (run_subsuite).
run_subsuite ring_suite "$W/run.out" -- tests/host/run.sh -t io-uring -d "$DAXFSD"
if grep -q '^CHECK PASS io-uring:rings_used' "$W/run.out"; then
    ok "ring_suite ($(grep -E '^host: [0-9]+ passed' "$W/run.out" | tail -n 1))"
else
    bad ring_suite "no rings_used check passed: $(tail -n 3 "$W/run.out" | tr '\n' '|')"
fi

# POSIX conformance over the rings: tests/host/pjdfstest.sh -t io-uring (the same reference
# and exception list as the other transports; it also checks the ring counters).
run_subsuite ring_pjdfstest "$W/pjd.out" -- tests/host/pjdfstest.sh -t io-uring -d "$DAXFSD"
if grep -q '^CHECK PASS io-uring: passes the reference' "$W/pjd.out" &&
    grep -q '^CHECK PASS io-uring: rings used' "$W/pjd.out"; then
    ok "ring_pjdfstest ($(grep -E '^pjdfstest: [0-9]+ passed' "$W/pjd.out" | tail -n 1))"
else
    bad ring_pjdfstest "missing checks: $(grep -c '^CHECK PASS' "$W/pjd.out") passed"
fi

if ! start "$W/lock.log" --io-uring=on --posix-lock; then
    bad blocking_lock_no_stall "mount did not come up"
else
    # Both processes on CPU 0: every request goes to queue 0. SIGKILL after 30 s: a process
    # stuck in a FUSE request ignores SIGTERM.
    out=$(timeout -s KILL 30 taskset -c 0 python3 - "$W/mnt" 2>&1 <<'EOF'
import fcntl, os, subprocess, sys, time
m = sys.argv[1]
p = os.path.join(m, "lockfile")
f = open(p, "w")
fcntl.lockf(f, fcntl.LOCK_EX)
child = subprocess.Popen([sys.executable, "-c",
    "import fcntl, sys; f = open(sys.argv[1], 'r+'); fcntl.lockf(f, fcntl.LOCK_EX); print('waiter got the lock')", p])
time.sleep(1.0)  # the child now waits in SETLKW
t = time.time()
with open(os.path.join(m, "other"), "w") as g:
    g.write("x")
os.stat(os.path.join(m, "other"))
dt = time.time() - t
fcntl.lockf(f, fcntl.LOCK_UN)
f.close()
rc = child.wait(timeout=20)
print(f"I/O while a SETLKW waits: {dt:.3f} s; waiter exit {rc}")
sys.exit(0 if dt < 5 and rc == 0 else 1)
EOF
)
    st=$?
    stop
    if [ $st -eq 0 ] && grep -q 'waiter got the lock' <<<"$out"; then
        echo "    $(tail -1 <<<"$out")"
        ok blocking_lock_no_stall
    else
        bad blocking_lock_no_stall "status $st: $(tr '\n' '|' <<<"$out")"
    fi
fi

# More lock waiters than ring entries (2 queues x 8 entries here): each waiting SETLKW holds its
# entry (the kernel takes the answer only there), so its queue registers a spare in its place.
# The holder's close (its unlock) must still get an entry and every waiter the lock in turn,
# one at a time. Without the spares the close never got an entry and the mount hung.
if ! start "$W/waiters.log" --io-uring=on --posix-lock; then
    bad lock_waiters_beyond_ring_entries "mount did not come up"
else
    python3 tests/host/lock-waiters.py "$W/mnt" 70 30 >"$W/waiters.out" 2>&1 &
    py=$!
    for ((i = 0; i < 400; i++)); do kill -0 $py 2>/dev/null || break; sleep 0.1; done
    if kill -0 $py 2>/dev/null; then
        # A close that hangs is in an uninterruptible FLUSH: only the daemon's end frees it.
        kill -KILL "$PID"
        wait "$PID" 2>/dev/null
        PID=
        umount -l "$W/mnt" 2>/dev/null
        wait $py 2>/dev/null
        bad lock_waiters_beyond_ring_entries "hung for 40 s (daemon killed)"
    else
        rc=0
        wait $py || rc=$?
        stop
        spares=$(sed -n 's/.*(+\([0-9]*\) spares for lock waits).*/\1/p' "$W/waiters.log")
        if [ $rc -eq 0 ] && grep -q '^LOCK-WAITERS-OK' "$W/waiters.out" && [ "${spares:-0}" -gt 0 ]; then
            ok "lock_waiters_beyond_ring_entries ($(cut -d' ' -f2- "$W/waiters.out"); $spares spare entries)"
        else
            bad lock_waiters_beyond_ring_entries "rc=$rc, spares=${spares:-none}: $(tr '\n' '|' <"$W/waiters.out")"
        fi
    fi
fi

if ! start "$W/stop.log" --io-uring=on; then
    bad clean_stop "mount did not come up"
else
    # A file open on the mount keeps it busy: SIGTERM detaches it lazily, and the daemon
    # serves that last user past the grace period (tests/host/run.sh covers /dev/fuse); once
    # it lets go, the kernel gives back the ring entries and the daemon exits 0.
    exec 9<"$W/mnt/."
    echo kept >"$W/mnt/kept"
    exec 8<"$W/mnt/kept"
    kill -TERM "$PID"
    sleep 3
    alive=0
    kill -0 "$PID" 2>/dev/null && alive=1
    late=$(cat <&8 2>&1)
    exec 9<&- 8<&-
    t0=$(date +%s)
    stop
    rc=$?
    dt=$(($(date +%s) - t0))
    if [ $alive -ne 1 ] || [ "$late" != kept ]; then
        bad clean_stop "the busy mount was not served past the grace period (alive=$alive, read '$late')"
    elif [ $rc -ne 0 ]; then
        bad clean_stop "exit status $rc after the last user left: $(tail -2 "$W/stop.log")"
    elif [ $dt -gt 10 ]; then
        bad clean_stop "took ${dt}s after the last user left"
    elif grep -q " $W/mnt " /proc/mounts; then
        bad clean_stop "still mounted"
    elif ! grep -q 'the kernel released every entry' "$W/stop.log" ||
        ! grep -q 'session ended, exiting' "$W/stop.log"; then
        bad clean_stop "no clean end in the log: $(tail -2 "$W/stop.log")"
    else
        ok clean_stop
    fi
fi

rig_summary io-uring
