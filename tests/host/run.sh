#!/usr/bin/env bash
# The project's guest suite on a HOST mount: daxfsd --mount over /dev/fuse (with and without
# FUSE passthrough) and bindfs (Debian's FUSE mirror, the traditional peer), as root.
#
# For each transport: mount the share, run tests/e2e/guest/suite.sh on the mount (with the
# host's vfstest and fio; `remount` stops and restarts the daemon), the host-side checks of
# tests/e2e/host-check.sh on the share, the host escape checks below, and for daxfsd the
# SIGUSR1 report (passthrough: backing files opened > 0; devfuse: no passthrough at all) and
# a clean SIGTERM (exit 0, unmounted). 70 lock waiters (more than the 64 lock threads) on an
# overlayfs share must all get the lock in turn after the holder's close. Then a SIGKILLed
# daemon's stale mount must be refused at the next start with the fix named, and nothing
# unmounted.
# Transport io-uring (not in the default list): daxfsd --io-uring=on, without passthrough;
# the SIGUSR1 report must show requests served from the rings and none but INIT through
# read(2) besides FORGET/INTERRUPT. It needs fuse.enable_uring=Y: tests/host/io-uring.sh
# sets it (and restores it) and runs `-t io-uring`.
#
#   tests/host/run.sh [-t devfuse,passthrough,io-uring,bindfs] [-d DAXFSD] [--skip a,b] [-v]
#
# Ends with "host: N passed, M failed" and the end marker (scripts/lib.sh rig_summary); bindfs's
# results as PEER lines and "peer: N passed, M failed".
set -euo pipefail
RIG_TAG=host
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$RIG_ROOT"

transports="devfuse passthrough bindfs" daxfsd=$RIG_ROOT/target/debug/daxfsd skip="" verbose=0
while (($#)); do
    case $1 in
        -t) (($# >= 2)) || die "-t needs a value"; transports=${2//,/ }; shift 2 ;;
        -d) (($# >= 2)) || die "-d needs a value"; daxfsd=$2; shift 2 ;;
        --skip) (($# >= 2)) || die "--skip needs a value"; skip=$2; shift 2 ;;
        -v) verbose=1; shift ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
(($(id -u) == 0)) || die "run as root (mount(2), drop_caches, mknod)"
[[ -e /dev/fuse ]] || die "no /dev/fuse (modprobe fuse)"
[[ -x $daxfsd ]] || die "no daxfsd at $daxfsd (cargo build, or -d PATH)"
need_cmd gcc
need_cmd fio
need_cmd setpriv
need_cmd python3
if [[ " $transports " == *" bindfs "* ]] && ! command -v bindfs >/dev/null; then
    die "bindfs is not installed: run 'scripts/provision-deps.sh test' (or leave it out with -t)"
fi

# ok, bad, import_checks and rig_summary come from scripts/lib.sh. A peer's (bindfs) results
# (RIG_PEER=1) are reported side by side but do not fail the run: they show what the
# traditional FUSE mirror passes of the same suite.

run=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-host.XXXXXX")
chmod 0755 "$run"
RIG_CLEANUP+=("cleanup_mounts")
cleanup_mounts() {
    local m
    for m in "$run"/*/mnt "$run"/waiters/share; do
        if grep -q " $m " /proc/mounts; then umount -l "$m" 2>/dev/null || true; fi
    done
    [[ -f $run/pid ]] && kill -KILL "$(cat "$run/pid")" 2>/dev/null
    rm -rf -- "$run"
}

log "compiling tests/e2e/guest/vfstest.c for the host"
gcc -O2 -Wall -Wextra -Werror -o "$run/vfstest" tests/e2e/guest/vfstest.c

# start_daxfsd T SHARE MNT LOG: mounts and records the pid in $run/pid.
start_daxfsd() {
    local pt=off ur=off
    [[ $1 == passthrough ]] && pt=auto
    [[ $1 == io-uring ]] && ur=on
    setsid "$daxfsd" --shared-dir "$2" --mount "$3" --xattr --passthrough=$pt --io-uring=$ur \
        --log-level info </dev/null >>"$4" 2>&1 &
    echo $! >"$run/pid"
    wait_mounted "$3" || { cat "$4" >&2; return 1; }
}
start_bindfs() {
    bindfs -o allow_other,dev,suid "$2" "$3" >>"$4" 2>&1 || return 1
    pidof bindfs | tr ' ' '\n' | sort -n | tail -n 1 >"$run/pid"
    wait_mounted "$3"
}
wait_mounted() {
    local i
    for ((i = 0; i < 100; i++)); do
        grep -q " $1 " /proc/mounts && stat "$1" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    return 1
}
# stop T MNT: SIGTERM (daxfsd) or umount (bindfs); waits for the process.
stop() {
    local pid rc=0
    pid=$(cat "$run/pid")
    if [[ $1 == bindfs ]]; then
        umount "$2" || rc=$?
    else
        kill -TERM "$pid"
    fi
    for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { kill -KILL "$pid"; return 1; }
    rm -f "$run/pid"
    return $rc
}

# Escapes attempted through a host mount. The host kernel resolves every path (symlinks,
# `..`) itself, so what the daemon must hold is: names stay names (a symlink it is asked to
# rename, link, chown or set xattrs on is not followed), no hard link or rename reaches
# outside the share, and its own privileges never serve an unprivileged user more than the
# files' modes allow (mode bits and ownership of what that user creates are the user's).
escape_checks() { # T SHARE MNT OUTSIDE
    local t=$1 share=$2 m=$3 outside=$4 before after
    before=$(tree_snapshot "$outside")
    mkdir "$m/esc"
    ln -s / "$m/esc/root"; ln -s "$outside" "$m/esc/hostside"; ln -s "$outside/secret" "$m/esc/hostsecret"
    ln -s ../../.. "$m/esc/up"
    (
        cd "$m/esc"
        # Name operations on the links themselves (no following).
        mv hostside hostside2 && mv hostside2 hostside
        ln -P hostsecret hostsecret-link 2>/dev/null || true
        chown -h 65534:65534 hostsecret; chown -h 0:0 hostsecret
        touch -h -d @1 hostside
        setfattr -h -n trusted.esc -v 1 hostsecret 2>/dev/null || true
        rm -f hostsecret-link
        # Hard links and renames across the mount boundary.
        ln "$outside/secret" hard-host 2>/dev/null && echo "ESC: hard link from outside"
        python3 -c 'import os, sys; os.rename(sys.argv[1], "moved")' "$outside/secret" 2>/dev/null &&
            { mv moved "$outside/secret"; echo "ESC: rename(2) from outside"; }
        python3 -c 'import os, sys; os.rename("hostsecret", sys.argv[1])' "$outside/renamed" 2>/dev/null &&
            echo "ESC: rename(2) to outside"
        true
    ) >"$run/esc.out" 2>&1
    after=$(tree_snapshot "$outside")
    if [[ $before == "$after" ]] && ! grep -q '^ESC:' "$run/esc.out"; then
        ok "$t:escape_outside_untouched"
    else
        bad "$t:escape_outside_untouched" "$(grep '^ESC:' "$run/esc.out"; diff <(printf '%s\n' "$before") <(printf '%s\n' "$after") | head -n 6)"
    fi
    local links=1 l
    for l in root hostside hostsecret up; do [[ -L $share/esc/$l ]] || links=0; done
    if ((links)) && [[ $(readlink "$share/esc/hostside") == "$outside" && ! -e $share/esc/hard-host ]]; then
        ok "$t:escape_links_stay_links"
    else
        bad "$t:escape_links_stay_links" "$(find "$share/esc" -maxdepth 1 -printf '%y %p -> %l\n' | head -n 8)"
    fi
    # An unprivileged user through the root daemon: modes hold, creations are theirs.
    printf 'root only\n' >"$m/esc/private"; chmod 0600 "$m/esc/private"
    mkdir "$m/esc/rootdir"; chmod 0755 "$m/esc/rootdir"
    mkdir "$m/esc/tmp"; chmod 1777 "$m/esc/tmp"
    local as=(setpriv --reuid=65534 --regid=65534 --clear-groups --)
    local leaks=()
    "${as[@]}" cat "$m/esc/private" >/dev/null 2>&1 && leaks+=("read a 0600 root file")
    "${as[@]}" sh -c "echo x >'$m/esc/rootdir/f'" 2>/dev/null && leaks+=("created in a 0755 root dir")
    "${as[@]}" chmod 0666 "$m/esc/private" 2>/dev/null && leaks+=("chmod of a root file")
    "${as[@]}" sh -c "echo mine >'$m/esc/tmp/mine'" || leaks+=("cannot create in a 1777 dir")
    [[ $(stat -c %u:%g "$share/esc/tmp/mine" 2>/dev/null) == 65534:65534 ]] || leaks+=("file of uid 65534 is owned by $(stat -c %u:%g "$share/esc/tmp/mine" 2>/dev/null) on the host")
    "${as[@]}" rm -f "$m/esc/private" 2>/dev/null && leaks+=("removed a root file in a root dir")
    if ((${#leaks[@]} == 0)); then
        ok "$t:escape_unprivileged_user"
    else
        bad "$t:escape_unprivileged_user" "$(IFS=';'; echo "${leaks[*]}")"
    fi
    rm -rf "$m/esc"
}


# passthrough_opened LOG: backing files opened over every daemon run in LOG (the suite's
# remount restarts the daemon): the sum of each run's last report, or "none".
passthrough_opened() {
    awk '/ mounted .* on / { sum += last; last = 0; seen = seen }
         /passthrough: [0-9]+ backing files opened/ {
             for (i = 1; i <= NF; i++) if ($i == "passthrough:") { last = $(i + 1); seen = 1 }
         }
         END { if (seen) print sum + last; else print "none" }' "$1"
}

t0=$SECONDS
for t in $transports; do
    case $t in devfuse|passthrough|io-uring) RIG_PEER=0 ;; bindfs) RIG_PEER=1 ;; *) die "unknown transport '$t'" ;; esac
    d=$run/$t
    share=$d/share m=$d/mnt outside=$d/outside dlog=$d/daemon.log
    mkdir -p "$share" "$m" "$outside/sub"
    printf 'secret\n' >"$outside/secret"; chmod 0640 "$outside/secret"
    printf 'keep\n' >"$outside/sub/keep"
    tt0=$SECONDS
    if [[ $t == bindfs ]]; then start=start_bindfs fstype=fuse; else start=start_daxfsd fstype=fuse.daxfsd; fi
    if ! $start "$t" "$share" "$m" "$dlog"; then
        bad "$t:mount" "$(tail -n 5 "$dlog")"
        continue
    fi
    fstype=$(awk -v m="$m" '$2 == m { print $3 }' /proc/mounts)
    ok "$t:mounted ($fstype)"
    # `remount` in the suite: stop and start again on the same share.
    cat >"$d/remount.sh" <<EOF
#!/bin/bash
set -e
$(declare -f start_daxfsd start_bindfs wait_mounted stop)
run=$(printf %q "$run") daxfsd=$(printf %q "$daxfsd")
stop $t $(printf %q "$m")
$start $t $(printf %q "$share") $(printf %q "$m") $(printf %q "$dlog")
EOF
    chmod +x "$d/remount.sh"
    log "$t: guest suite on $m"
    out=$d/suite.txt
    # From the transport's own directory: fio leaves its verify state files in the cwd.
    src=0
    (cd "$d" && E2E_HOST=1 E2E_VFSTEST=$run/vfstest E2E_FSTYPE=$fstype E2E_REMOUNT=$d/remount.sh \
        E2E_CMDLINE="daxfsd.xattr=on daxfsd.check_timeout=120${skip:+ daxfsd.skip=$skip}${RIG_SUBSUITE_DIE_AFTER:+ daxfsd.die_after=$RIG_SUBSUITE_DIE_AFTER}" \
        sh "$RIG_ROOT/tests/e2e/guest/suite.sh" "$m") >"$out" 2>&1 || src=$?
    ((verbose)) && sed 's/^/  /' "$out"
    # The suite's checks as T:NAME; cut short (no or a disagreeing E2E RESULT): T:suite/incomplete.
    import_checks "$t:suite" "$out" "$src" e2e "$t:"
    escape_checks "$t" "$share" "$m" "$outside"
    if [[ $t == devfuse ]]; then
        # This kernel (6.18) predates the 2026 zero-copy series: the daemon must say so.
        if grep -q 'lacks FUSE-over-io-uring zero copy' "$dlog"; then
            ok "$t:zero_copy_absence_logged"
        else
            bad "$t:zero_copy_absence_logged" "$(grep -i 'zero copy' "$dlog" | head -n 1)"
        fi
    fi
    if [[ $t != bindfs ]]; then
        kill -USR1 "$(cat "$run/pid")"
        sleep 0.5
        opened=$(passthrough_opened "$dlog")
        if [[ $t == passthrough ]]; then
            if [[ $opened =~ ^[0-9]+$ ]] && ((opened > 0)); then
                ok "$t:passthrough_used ($opened backing files over all runs; now $(grep -o 'passthrough: .*' "$dlog" | tail -n 1))"
            else
                bad "$t:passthrough_used" "report: $(grep 'dev/fuse:' "$dlog" | tail -n 1)"
            fi
        elif [[ $opened == none ]]; then
            ok "$t:no_passthrough"
            if [[ $t == io-uring ]]; then
                ring=$(grep 'requests served from' "$dlog" | tail -n 1)
                served=$(sed -n 's/.*io-uring: \([0-9]*\) requests served from.*/\1/p' <<<"$ring")
                if [[ $served =~ ^[0-9]+$ ]] && ((served > 0)) &&
                    [[ $ring == *"other than FORGET/INTERRUPT: 1;"* ]]; then
                    ok "$t:rings_used (${ring#*read(2) })"
                else
                    bad "$t:rings_used" "report: ${ring:-$(grep 'dev/fuse:' "$dlog" | tail -n 1)}"
                fi
            fi
        else
            bad "$t:no_passthrough" "--passthrough=off registered backing files: $opened"
        fi
    fi
    rc=0
    stop "$t" "$m" || rc=$?
    if ((rc == 0)) && ! grep -q " $m " /proc/mounts; then
        ok "$t:clean_stop"
    else
        bad "$t:clean_stop" "rc=$rc; $(grep " $m " /proc/mounts) $(tail -n 3 "$dlog")"
    fi
    if [[ $t != bindfs ]] && grep -q 'SIGTERM: session ended' "$dlog"; then
        grep -q 'passthrough: .* 0 live' "$dlog" || [[ $t == devfuse || $t == io-uring ]] ||
            bad "$t:backing_ids_closed" "$(grep -o 'passthrough: .*' "$dlog" | tail -n 1)"
    fi
    if grep -q '^E2E RESULT ' "$out" && [[ -z $skip ]]; then
        hrc=0
        RIG_DIE_AFTER_CHECKS=${RIG_SUBSUITE_DIE_AFTER:-} tests/e2e/host-check.sh "$share" on >"$d/host-check.txt" 2>&1 || hrc=$?
        import_checks "$t:host-check" "$d/host-check.txt" "$hrc" suite "$t:"
    fi
    log "$t: done in $((SECONDS - tt0))s"
done

RIG_PEER=0
if [[ " $transports " == *" devfuse "* ]]; then
    # Waiting locks (--posix-lock: SETLKW) never take every worker: six processes wait for a
    # lock on a 2-worker daemon while the holder still reads, lists and unlocks.
    d=$run/locks
    mkdir -p "$d/share" "$d/mnt"
    cat >"$d/locks.py" <<'PY'
import fcntl, os, sys, time
m = sys.argv[1]
f = os.path.join(m, "lockfile")
open(f, "w").close()
open(os.path.join(m, "other"), "w").write("x")
h = os.open(f, os.O_RDWR)
fcntl.lockf(h, fcntl.LOCK_EX)
kids = []
for i in range(6):
    pid = os.fork()
    if pid == 0:
        fd = os.open(f, os.O_RDWR)
        fcntl.lockf(fd, fcntl.LOCK_EX)
        fcntl.lockf(fd, fcntl.LOCK_UN)
        os._exit(0)
    kids.append(pid)
time.sleep(1.5)
assert open(os.path.join(m, "other")).read() == "x"
os.listdir(m)
fcntl.lockf(h, fcntl.LOCK_UN)
for k in kids:
    assert os.waitpid(k, 0)[1] == 0
print("LOCKS-OK")
PY
    "$daxfsd" --shared-dir "$d/share" --mount "$d/mnt" --posix-lock --thread-pool-size 2 \
        --io-uring=off --sandbox none </dev/null >"$d/log" 2>&1 &
    pid=$!
    echo $pid >"$run/pid"
    if wait_mounted "$d/mnt"; then
        out=$(timeout 20 python3 "$d/locks.py" "$d/mnt" 2>&1) || true
        if [[ $out == LOCKS-OK ]]; then
            ok "lock_waits_leave_workers_free"
            kill -TERM $pid; wait $pid || true
        else
            bad "lock_waits_leave_workers_free" "${out:-timed out (deadlock)}"
            # Killing the daemon aborts the connection and frees the waiting processes.
            kill -KILL $pid; wait $pid 2>/dev/null || true
            umount -l "$d/mnt" 2>/dev/null || true
        fi
        rm -f "$run/pid"
    else
        bad "lock_waits_leave_workers_free" "could not mount: $(tail -n 3 "$d/log")"
    fi

    # More lock waiters than lock threads (64) on a share on overlayfs (FLUSH is a long
    # request there): the holder's close must still be served and every waiter get the lock in
    # turn. Served on the readers beyond 64, the waits took all of them and the close never ran.
    d=$run/waiters
    mkdir -p "$d/lower" "$d/upper" "$d/work" "$d/share" "$d/mnt"
    if mount -t overlay overlay -o "lowerdir=$d/lower,upperdir=$d/upper,workdir=$d/work" "$d/share"; then
        # /dev/fuse readers, whatever fuse.enable_uring says (tests/host/io-uring.sh has the
        # same waiters over the rings: lock_waiters_beyond_ring_entries).
        "$daxfsd" --shared-dir "$d/share" --mount "$d/mnt" --posix-lock --io-uring=off \
            </dev/null >"$d/log" 2>&1 &
        pid=$!
        echo $pid >"$run/pid"
        if wait_mounted "$d/mnt"; then
            # The bound is the script's own (30 s after the close); a close that hangs is in an
            # uninterruptible FLUSH, which only the daemon's end releases.
            python3 tests/host/lock-waiters.py "$d/mnt" 70 30 >"$d/out" 2>&1 &
            py=$!
            for ((i = 0; i < 400; i++)); do kill -0 $py 2>/dev/null || break; sleep 0.1; done
            if kill -0 $py 2>/dev/null; then
                kill -KILL $pid; wait $pid 2>/dev/null || true
                umount -l "$d/mnt" 2>/dev/null || true
                wait $py 2>/dev/null || true
                bad "lock_waiters_beyond_lock_threads_on_overlayfs" "hung for 40 s (daemon killed): $(grep -m1 'lock wait' "$d/log")"
            else
                rc=0; wait $py || rc=$?
                if ((rc == 0)) && grep -q '^LOCK-WAITERS-OK' "$d/out"; then
                    ok "lock_waiters_beyond_lock_threads_on_overlayfs ($(cut -d' ' -f2- "$d/out"))"
                else
                    bad "lock_waiters_beyond_lock_threads_on_overlayfs" "rc=$rc: $(cat "$d/out")"
                fi
                kill -TERM $pid; wait $pid || true
            fi
        else
            bad "lock_waiters_beyond_lock_threads_on_overlayfs" "could not mount: $(tail -n 3 "$d/log")"
        fi
        rm -f "$run/pid"
        umount -l "$d/share" 2>/dev/null || true
    else
        bad "lock_waiters_beyond_lock_threads_on_overlayfs" "cannot mount overlayfs on $d/share"
    fi

    # SIGTERM on a busy mount: detached at once (gone from the mount table), served until
    # its last user leaves (a process working in it reads and writes on), then exit 0.
    d=$run/busy
    mkdir -p "$d/share" "$d/mnt"
    "$daxfsd" --shared-dir "$d/share" --mount "$d/mnt" </dev/null >"$d/log" 2>&1 &
    pid=$!
    echo $pid >"$run/pid"
    if wait_mounted "$d/mnt"; then
        (cd "$d/mnt" && sleep 3 && echo after >late && cat late) >"$d/user.out" 2>&1 &
        user=$!
        sleep 0.5
        kill -TERM $pid
        sleep 1
        alive=0; kill -0 $pid 2>/dev/null && alive=1
        detached=1; grep -q " $d/mnt " /proc/mounts && detached=0
        wait $user || true
        rc=0; wait $pid || rc=$?
        rm -f "$run/pid"
        if ((alive && detached && rc == 0)) && [[ $(cat "$d/user.out") == after && $(cat "$d/share/late") == after ]]; then
            ok "busy_mount_detached_and_served_until_its_user_left"
        else
            bad "busy_mount_detached_and_served_until_its_user_left" "alive=$alive detached=$detached rc=$rc user: $(cat "$d/user.out") $(tail -n 2 "$d/log")"
        fi
    else
        bad "busy_mount_detached_and_served_until_its_user_left" "could not mount: $(tail -n 3 "$d/log")"
    fi

    # A daemon killed with SIGKILL leaves a dead mount: the next start names the fix and
    # leaves the mount (and what is under it) alone.
    d=$run/stale
    mkdir -p "$d/share" "$d/mnt"
    "$daxfsd" --shared-dir "$d/share" --mount "$d/mnt" --sandbox none </dev/null >"$d/log" 2>&1 &
    pid=$!
    echo $pid >"$run/pid"
    if wait_mounted "$d/mnt"; then
        kill -KILL $pid; wait $pid 2>/dev/null || true; rm -f "$run/pid"
        rc=0
        # Bounded: a daemon that mounts anyway is stopped after 10 s.
        msg=$(timeout -s TERM 10 "$daxfsd" --shared-dir "$d/share" --mount "$d/mnt" 2>&1) || rc=$?
        if ((rc != 0)) && [[ $msg == *"stale FUSE mount"*"umount -l $d/mnt"* ]] && grep -q " $d/mnt " /proc/mounts; then
            ok "stale_mount_reported"
        else
            bad "stale_mount_reported" "rc=$rc: $msg"
        fi
        umount -l "$d/mnt"
    else
        bad "stale_mount_reported" "could not mount: $(tail -n 3 "$d/log")"
    fi
fi

if [[ " $transports " == *" devfuse "* ]]; then
    # A non-root user mounts through fusermount3 (or libfuse 2's fusermount), with the
    # default sandbox; SIGTERM unmounts. Without either helper: the one-line error.
    d=$run/user
    mkdir -p "$d/share" "$d/mnt"
    chown -R 65534:65534 "$d"
    as=(setpriv --reuid=65534 --regid=65534 --clear-groups --)
    if command -v fusermount3 >/dev/null || command -v fusermount >/dev/null; then
        "${as[@]}" "$daxfsd" --shared-dir "$d/share" --mount "$d/mnt" </dev/null >"$d/log" 2>&1 &
        pid=$!
        echo $pid >"$run/pid"
        # Without user_allow_other in /etc/fuse.conf only that user (not root) sees the mount.
        for ((i = 0; i < 100; i++)); do
            grep -q " $d/mnt " /proc/mounts && "${as[@]}" stat "$d/mnt" >/dev/null 2>&1 && break
            sleep 0.1
        done
        if "${as[@]}" sh -c "echo user >'$d/mnt/f'" &&
            [[ $(stat -c %u "$d/share/f") == 65534 ]]; then
            kill -TERM $pid
            rc=0; wait $pid || rc=$?
            rm -f "$run/pid"
            if ((rc == 0)) && ! grep -q " $d/mnt " /proc/mounts && grep -q 'passthrough off: .*CAP_SYS_ADMIN' "$d/log"; then
                ok "non_root_fusermount"
            else
                bad "non_root_fusermount" "rc=$rc; $(grep " $d/mnt " /proc/mounts) $(tail -n 2 "$d/log")"
            fi
        else
            bad "non_root_fusermount" "$(tail -n 3 "$d/log")"
            kill -KILL $pid 2>/dev/null; umount -l "$d/mnt" 2>/dev/null || true
        fi
    else
        rc=0
        msg=$("${as[@]}" "$daxfsd" --shared-dir "$d/share" --mount "$d/mnt" 2>&1) || rc=$?
        if ((rc != 0)) && [[ $msg == *"needs fusermount3: install it (apt install fuse3)"* ]]; then
            ok "non_root_without_fusermount_error"
        else
            bad "non_root_without_fusermount_error" "rc=$rc: $msg"
        fi
    fi
fi

log "done in $((SECONDS - t0))s"
rig_summary host
