#!/usr/bin/env bash
# Live migration end to end: two QEMU 11.1 processes on this machine, each with
# `-device vhost-user-fs-pci` and its own daxfsd, sharing the same host directory. QEMU
# migrates the device internally through the vhost-user device-state transfer
# (DEVICE_STATE: SET_DEVICE_STATE_FD + CHECK_DEVICE_STATE).
#
#   tests/e2e/migrate.sh [-m find-paths|file-handles|refusal|all] [-d DAXFSD|virtiofsd] [-T SEC]
#
# For each migration mode (default: all):
#   The guest (tests/e2e/guest/migrate-guest.sh) keeps a working directory and two open
#   files on the share; the source migrates over tcp:127.0.0.1 (QMP `migrate`); the host
#   writes the marker; on the destination the guest reads the fd opened before, lists its
#   cwd, creates, writes, appends through the old fd, renames. The host then checks the
#   files and both daemons' logs.
# Then the refusal case: the source migrates to a file, one byte inside daxfsd's state in
# that file is flipped, and a destination loads it: daxfsd refuses the state (checksum),
# QEMU's incoming migration fails, and the source guest (`cont`) finishes its checks there.
# Last, QEMU must refuse to migrate a guest with the DAX device (vhost-user-test-device-pci).
# Ends with "e2e-migrate: N passed, M failed"; exits non-zero on any failure.
set -euo pipefail
RIG_TAG=e2e-migrate
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$RIG_ROOT"

modes=(find-paths file-handles) daxfsd="" timeout=900 refusal=1 upstream=0
while (($#)); do
    case $1 in
        -m) case ${2:-} in all) ;; find-paths|file-handles) modes=("$2") refusal=0 ;;
                refusal) modes=() ;;
                *) die "-m takes find-paths, file-handles, refusal or all" ;; esac; shift 2 ;;
        -d) daxfsd=$2; shift 2 ;;
        -T) timeout=$2; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
need_cmd python3
if [[ $daxfsd == virtiofsd ]]; then
    # Upstream virtiofsd 1.14 runs the same migrations (proof the test is right); the
    # daxfsd log checks and the refusal case (it flips a byte of daxfsd's format) are skipped.
    daxfsd=$(scripts/provision-virtiofsd.sh --print-path)
    [[ -x $daxfsd ]] || die "upstream virtiofsd is not installed; run 'make virtiofsd'"
    upstream=1 refusal=0
fi
if [[ -z $daxfsd ]]; then
    for c in target/release/daxfsd target/debug/daxfsd; do
        [[ -x $c ]] || continue
        if [[ -z $daxfsd || $c -nt $daxfsd ]]; then daxfsd=$c; fi
    done
fi
[[ -n $daxfsd && -x $daxfsd ]] || die "no daxfsd binary; run 'cargo build'"
daxfsd=$(realpath "$daxfsd")
scripts/provision-qemu.sh 11 --print-path >/dev/null || die "needs QEMU >= 11.1; run 'make qemu'"
kernel=$(guest-kernel/build.sh --print-path)
[[ -s $kernel ]] || die "guest kernel not built; run 'make kernel'"
initramfs=$(scripts/build-initramfs.sh 2>/dev/null) || die "initramfs missing; run 'make initramfs'"

# ok, bad, check and rig_summary come from scripts/lib.sh.
verdict() { # verdict NAME WHY CMD...: PASS when CMD succeeds, else FAIL with WHY
    local name=$1 why=$2; shift 2
    if "$@"; then ok "$name"; else bad "$name" "$why"; fi
}

work=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-e2e-migrate.XXXXXX")
logs="$DAXFSD_CACHE/logs/migrate-$(date +%Y%m%d-%H%M%S)-$$"
mkdir -p "$logs"
pids=()
stop_all() {
    local p
    for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true; done
    sleep 0.5
    for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    pids=()
}
# shellcheck disable=SC2016 # expanded when the cleanup runs
RIG_CLEANUP+=('stop_all' 'rm -rf -- "$work"')

# The guest program, packed as /daxfsd-cmd in a cpio appended to the initramfs, after the
# guest helpers (tests/e2e/guest/lib.sh), as scripts/vm.sh does.
mkdir -p "$work/cmd"
{ guest_helpers; cat tests/e2e/guest/migrate-guest.sh; } >"$work/cmd/daxfsd-cmd"
python3 scripts/mkcpio.py "$work/cmd.cpio" "$work/cmd"
cat -- "$initramfs" "$work/cmd.cpio" >"$work/initrd"

# qmp SOCKET COMMAND [JSON-ARGS]: one QMP command; prints the "return" (or exits 1 with
# the error).
qmp() {
    python3 - "$@" <<'PY'
import json, socket, sys
path, cmd = sys.argv[1], sys.argv[2]
args = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
s = socket.socket(socket.AF_UNIX)
s.settimeout(60)
s.connect(path)
f = s.makefile("rw")
def call(c, a=None):
    msg = {"execute": c}
    if a is not None:
        msg["arguments"] = a
    f.write(json.dumps(msg) + "\n"); f.flush()
    while True:
        r = json.loads(f.readline())
        if "return" in r or "error" in r:
            return r
json.loads(f.readline())
call("qmp_capabilities")
r = call(cmd, args)
if "error" in r:
    print(json.dumps(r["error"])); sys.exit(1)
print(json.dumps(r["return"]))
PY
}

# wait_for SECONDS CMD...: polls CMD every 0.5 s.
wait_for() {
    local t=$1; shift
    local n=$((t * 2))
    while ((n-- > 0)); do "$@" && return 0; sleep 0.5; done
    return 1
}
alive() { kill -0 "$1" 2>/dev/null; }

# start_daemon NAME SHARE ARGS...: daxfsd on $work/NAME.sock (default sandbox and seccomp).
start_daemon() {
    local name=$1 share=$2; shift 2
    setsid "$daxfsd" --socket-path="$work/$name.sock" --shared-dir="$share" --cache=auto "$@" \
        </dev/null >"$logs/$name.daemon.log" 2>&1 &
    pids+=($!)
    wait_for 10 test -S "$work/$name.sock" || { bad "$name-daemon" "no socket"; return 1; }
}

# start_qemu NAME [QEMU ARGS...]: the guest, on QEMU 11.1 with vhost-user-fs-pci; QMP on
# $work/NAME.qmp, console in $logs/NAME.console.
start_qemu() {
    local name=$1; shift
    setsid scripts/qemu-11.sh -accel tcg -cpu max -smp 1 -m 512M \
        -nodefaults -no-user-config -display none -no-reboot \
        -kernel "$kernel" -initrd "$work/initrd" \
        -append "console=ttyS0 panic=-1 oops=panic 8250.nr_uarts=1 daxfsd.tag=mig daxfsd.run=cmd" \
        -object memory-backend-memfd,id=mem,size=512M,share=on -M q35 -numa node,memdev=mem \
        -chardev "socket,id=vfs,path=$work/$name.sock" \
        -device vhost-user-fs-pci,chardev=vfs,tag=mig,queue-size=1024 \
        -serial "file:$logs/$name.console" \
        -qmp "unix:$work/$name.qmp,server=on,wait=off" "$@" \
        </dev/null >"$logs/$name.qemu.log" 2>&1 &
    pids+=($!)
    wait_for 20 test -S "$work/$name.qmp" || { bad "$name-qemu" "no QMP socket: $(tail -n 3 "$logs/$name.qemu.log")"; return 1; }
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

migration_status() { # migration_status QMP: prints the status of query-migrate
    qmp "$1" query-migrate | python3 -c 'import json,sys; print(json.load(sys.stdin).get("status","none"))'
}

# wait_migration QMP: until completed or failed; prints the final status.
wait_migration() {
    local st n=$((timeout * 2))
    while ((n-- > 0)); do
        st=$(migration_status "$1" 2>/dev/null) || st=unknown
        case $st in completed|failed|cancelled) echo "$st"; return 0 ;; esac
        sleep 0.5
    done
    echo timeout
}

# guest_checks NAME CONSOLE: the guest's checks (NAME/CHECK), its end line and its result.
guest_checks() {
    local name=$1 console=$2
    tr -d '\r' <"$console" >"$console.txt"
    import_checks "$name/guest" "$console.txt" 0 guest "$name/"
    if grep -aq '@@DAXFSD-RESULT rc=0@@' "$console"; then ok "$name/guest-result"
    else bad "$name/guest-result" "no rc=0 result (console $console)"; fi
}

run_mode() {
    local mode=$1 src_args=() dst_args=() port st
    local share=$work/share-$mode
    mkdir -p "$share"
    log "mode $mode: booting the source"
    src_args=(--migration-mode="$mode")
    # The destination migrates in the source's mode: a daemon in find-paths mode refuses a
    # stream of file-handle entries (handles from a stream are trusted in file-handles mode
    # only, and checked to lie inside the share there too).
    dst_args=(--migration-mode="$mode" --migration-on-error=abort)
    # Opening file handles on the destination needs CAP_DAC_READ_SEARCH (as in virtiofsd).
    [[ $mode == file-handles ]] && dst_args+=(--modcaps=+dac_read_search)
    start_daemon "src-$mode" "$share" "${src_args[@]}" || return 0
    start_daemon "dst-$mode" "$share" "${dst_args[@]}" || return 0
    local s=src-$mode d=dst-$mode
    start_qemu "$s" || return 0
    if ! wait_for "$timeout" grep -aq MIGRATE-READY "$logs/$s.console"; then
        bad "$mode/source-ready" "guest never said MIGRATE-READY (console $logs/$s.console)"
        stop_all; return 0
    fi
    ok "$mode/source-ready"
    port=$(free_port)
    start_qemu "$d" -incoming "tcp:127.0.0.1:$port" || { stop_all; return 0; }
    log "mode $mode: migrating to tcp:127.0.0.1:$port"
    local out
    if ! out=$(qmp "$work/$s.qmp" migrate "{\"uri\": \"tcp:127.0.0.1:$port\"}" 2>&1); then
        bad "$mode/migrate" "QMP migrate refused: $out"; stop_all; return 0
    fi
    st=$(wait_migration "$work/$s.qmp")
    if [[ $st != completed ]]; then
        bad "$mode/migrate" "status $st; $(qmp "$work/$s.qmp" query-migrate 2>&1 | head -c 400)"
        stop_all; return 0
    fi
    ok "$mode/migrate-completed"
    local dst_status
    dst_status=$(qmp "$work/$d.qmp" query-status | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')
    verdict "$mode/destination-running" "status $dst_status" [ "$dst_status" = running ]
    qmp "$work/$s.qmp" quit >/dev/null 2>&1 || true
    echo destination >"$share/migrated"
    # Wait for the destination guest to finish (QEMU exits at the guest's reboot).
    if wait_for "$timeout" grep -aq '@@DAXFSD-RESULT' "$logs/$d.console"; then :; else
        bad "$mode/destination-finished" "no result within ${timeout}s"
    fi
    guest_checks "$mode" "$logs/$d.console"
    if grep -aq 'MIGRATE-RESUMED on destination' "$logs/$d.console"; then ok "$mode/resumed-on-destination"
    else bad "$mode/resumed-on-destination" "not in $logs/$d.console"; fi
    # The files the guest made after the switch-over, on the host.
    verdict "$mode/host-sees-created" "work/renamed: $(cat "$share/work/renamed" 2>&1)" \
        [ "$(cat "$share/work/renamed" 2>/dev/null)" = "made after migration" ]
    verdict "$mode/host-sees-append" "work/appended: $(cat "$share/work/appended" 2>&1)" \
        [ "$(tr '\n' ' ' <"$share/work/appended" 2>/dev/null)" = "line1 line2 " ]
    ((upstream)) && { stop_all; return 0; }
    verdict "$mode/source-saved" "no 'migration: saved' in $logs/$s.daemon.log" \
        grep -q 'migration: saved' "$logs/$s.daemon.log"
    verdict "$mode/destination-loaded" "no 'migration: loaded' in $logs/$d.daemon.log" \
        grep -q 'migration: loaded' "$logs/$d.daemon.log"
    stop_all
}

# The refusal case: a state the destination must refuse. The source migrates to a file,
# one payload byte of daxfsd's state inside it is flipped, a destination loads the file.
run_refusal() {
    local share=$work/share-refusal s=src-refusal d=dst-refusal st out
    mkdir -p "$share"
    log "refusal: booting the source"
    start_daemon "$s" "$share" || return 0
    start_daemon "$d" "$share" || return 0
    start_qemu "$s" || return 0
    if ! wait_for "$timeout" grep -aq MIGRATE-READY "$logs/$s.console"; then
        bad "refusal/source-ready" "guest never said MIGRATE-READY"; stop_all; return 0
    fi
    log "refusal: migrating to a file"
    if ! out=$(qmp "$work/$s.qmp" migrate "{\"uri\": \"file:$work/state.mig\"}" 2>&1); then
        bad "refusal/migrate-to-file" "QMP migrate refused: $out"; stop_all; return 0
    fi
    st=$(wait_migration "$work/$s.qmp")
    if [[ $st != completed ]]; then
        bad "refusal/migrate-to-file" "status $st"; stop_all; return 0
    fi
    ok "refusal/migrate-to-file"
    # Flip one byte inside the payload of daxfsd's state (after its 16-byte header).
    if out=$(python3 - "$work/state.mig" <<'PY'
import mmap, sys
with open(sys.argv[1], "r+b") as f:
    m = mmap.mmap(f.fileno(), 0)
    at = m.find(b"DAXFSMIG")
    if at < 0 or m.find(b"DAXFSMIG", at + 1) >= 0:
        sys.exit("daxfsd's state is not in the stream exactly once")
    m[at + 16 + 10] ^= 0x40
    m.flush()
    print(at)
PY
    ); then ok "refusal/state-found-in-stream"; else
        bad "refusal/state-found-in-stream" "$out"; stop_all; return 0
    fi
    start_qemu "$d" -incoming "file:$work/state.mig" || { stop_all; return 0; }
    # The destination must fail to load and exit; the source stays paused until `cont`.
    if wait_for 120 grep -aq 'load of migration failed' "$logs/$d.qemu.log"; then
        ok "refusal/destination-load-failed"
    else
        bad "refusal/destination-load-failed" "QEMU: $(tail -n 3 "$logs/$d.qemu.log")"
    fi
    if wait_for 30 grep -q 'loading the device state failed.*checksum' "$logs/$d.daemon.log"; then
        ok "refusal/daemon-refused-corrupt-state"
    else
        bad "refusal/daemon-refused-corrupt-state" "$(tail -n 3 "$logs/$d.daemon.log")"
    fi
    if grep -q panicked "$logs/$d.daemon.log"; then bad "refusal/no-panic" "daemon panicked"
    else ok "refusal/no-panic"; fi
    # The source guest carries on where it was.
    qmp "$work/$s.qmp" cont >/dev/null || bad "refusal/source-cont" "QMP cont failed"
    echo source >"$share/migrated"
    if wait_for "$timeout" grep -aq '@@DAXFSD-RESULT' "$logs/$s.console"; then :; else
        bad "refusal/source-finished" "no result within ${timeout}s"
    fi
    guest_checks refusal "$logs/$s.console"
    verdict "refusal/source-continued" "not in $logs/$s.console" \
        grep -aq 'MIGRATE-RESUMED on source' "$logs/$s.console"
    stop_all
    rm -f -- "$work/state.mig"
}

# The DAX device (vhost-user-test-device-pci, QEMU 11.1's only device with a window) is not
# migratable: QEMU must refuse up front (the README says so; this keeps it true).
run_dax_blocked() {
    local share=$work/share-dax n=dax out
    mkdir -p "$share"
    start_daemon "$n" "$share" --tag=mig --dax-window=64M || return 0
    setsid scripts/qemu-11.sh -accel tcg -cpu max -smp 1 -m 512M \
        -nodefaults -no-user-config -display none -no-reboot -S \
        -object memory-backend-memfd,id=mem,size=512M,share=on -M q35 -numa node,memdev=mem \
        -chardev "socket,id=vfs,path=$work/$n.sock" \
        -device vhost-user-test-device-pci,chardev=vfs,virtio-id=26,num_vqs=2,config_size=40 \
        -qmp "unix:$work/$n.qmp,server=on,wait=off" </dev/null >"$logs/$n.qemu.log" 2>&1 &
    pids+=($!)
    wait_for 20 test -S "$work/$n.qmp" || { bad "dax/not-migratable" "no QMP socket"; stop_all; return 0; }
    sleep 1
    if out=$(qmp "$work/$n.qmp" migrate '{"uri": "tcp:127.0.0.1:9"}' 2>&1); then
        bad "dax/not-migratable" "QEMU accepted the migration: $out"
    elif [[ $out == *non-migratable*vhost-user-test-device* ]]; then
        ok "dax/not-migratable"
    else
        bad "dax/not-migratable" "unexpected refusal: $out"
    fi
    stop_all
}

for m in "${modes[@]}"; do run_mode "$m"; done
((refusal)) && run_refusal
((upstream)) || run_dax_blocked
log "logs: $logs"
rig_summary e2e-migrate
