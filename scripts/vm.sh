#!/usr/bin/env bash
# Boot the daxfsd test guest against a virtio-fs daemon: the one launcher used
# by the e2e tests, the demo and the benchmarks.
#
#   scripts/vm.sh [options] [-- GUEST COMMAND...]
#
#   -p, --profile NAME     QEMU profile from qemu-config/: pci (default), dax, mmio
#   -d, --daemon D         daxfsd (default: target/debug/daxfsd, `make build`),
#                          daxfsd-release (target/release/daxfsd, `make release`),
#                          virtiofsd (upstream 1.14.0, see `make virtiofsd`) or a path;
#                          the binary it runs is named on stderr
#   -a, --daemon-arg ARG   extra daemon argument (repeatable), e.g. -a --xattr
#       --cache MODE       daemon --cache=MODE (default: auto)
#   -s, --shared-dir DIR   directory to share (default: a new empty temp dir,
#                          removed afterwards)
#   -t, --test NAME        guest program: shell (interactive), e2e (the suite),
#                          none (boot, mount, power off); default: shell on a
#                          terminal without a command, else the command
#   -c, --cmd 'CMD'        guest shell command, run in /mnt (same as -- CMD...)
#       --script FILE      guest shell script, run in /mnt
#   -o, --mount-opts OPTS  extra mount options, e.g. dax=always
#       --append ARGS      extra guest kernel command line
#       --tag TAG          virtio-fs tag (default: daxfsd)
#       --virtfs DIR       also export DIR over virtio-9p (QEMU -virtfs local,
#                          security_model=none), mount tag daxfsd9p; the guest
#                          mounts it itself (mount -t 9p -o trans=virtio daxfsd9p M)
#   -m, --mem SIZE         guest RAM (default: 1G)
#       --cpus N           vCPUs (default: 1)
#       --queues N         request queues (default: 1); --queue-size N (default: 1024)
#   -T, --timeout SEC      kill the VM after SEC seconds (default: 600; 0 = none)
#   -l, --log FILE         serial console log (default: $DAXFSD_CACHE/logs/...)
#       --monitor PATH     QEMU's human monitor on the UNIX socket PATH (stop, cont,
#                          migrate, ...); the daemon's pid is written to PATH.daemon-pid
#   -v, --verbose          also stream the console to stderr as it happens
#   The guest program's output is printed on stdout when the VM has exited.
#       --kernel FILE      guest bzImage (default: guest-kernel/build.sh)
#       --initramfs FILE   initramfs (default: scripts/build-initramfs.sh)
#       --print-cmd        print the daemon and QEMU command lines, run nothing
#       --list             list the QEMU profiles
#   ACCEL=kvm in the environment uses KVM instead of TCG.
#
# Exit status: the guest program's status; 124 on timeout; 125 when the rig
# itself failed (daemon or QEMU did not start, the guest gave no result, the
# daemon crashed).
set -euo pipefail
RIG_TAG=vm
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

profile=pci daemon=daxfsd cache=auto shared="" test="" cmd="" script="" mountopts=""
extra_append="" tag=daxfsd virtfs="" mem=1G cpus=1 queues=1 queue_size=1024 timeout=600
logfile="" verbose=0 kernel="" initramfs="" print_cmd=0 monitor=""
daemon_args=()

usage() { sed -n '2,43p' "$0" | sed 's/^# \{0,1\}//'; }
need_arg() { (($1 >= 2)) || die "option $2 needs a value (see --help)"; }
while (($#)); do
    case $1 in
        -p|--profile) need_arg $# "$1"; profile=$2; shift 2 ;;
        -d|--daemon) need_arg $# "$1"; daemon=$2; shift 2 ;;
        -a|--daemon-arg) need_arg $# "$1"; daemon_args+=("$2"); shift 2 ;;
        --cache) need_arg $# "$1"; cache=$2; shift 2 ;;
        -s|--shared-dir) need_arg $# "$1"; shared=$2; shift 2 ;;
        -t|--test) need_arg $# "$1"; test=$2; shift 2 ;;
        -c|--cmd) need_arg $# "$1"; cmd=$2; shift 2 ;;
        --script) need_arg $# "$1"; script=$2; shift 2 ;;
        -o|--mount-opts) need_arg $# "$1"; mountopts=$2; shift 2 ;;
        --append) need_arg $# "$1"; extra_append+=" $2"; shift 2 ;;
        --tag) need_arg $# "$1"; tag=$2; shift 2 ;;
        --virtfs) need_arg $# "$1"; virtfs=$2; shift 2 ;;
        -m|--mem) need_arg $# "$1"; mem=$2; shift 2 ;;
        --cpus) need_arg $# "$1"; cpus=$2; shift 2 ;;
        --queues) need_arg $# "$1"; queues=$2; shift 2 ;;
        --queue-size) need_arg $# "$1"; queue_size=$2; shift 2 ;;
        -T|--timeout) need_arg $# "$1"; timeout=$2; shift 2 ;;
        -l|--log) need_arg $# "$1"; logfile=$2; shift 2 ;;
        --monitor) need_arg $# "$1"; monitor=$2; shift 2 ;;
        -v|--verbose) verbose=1; shift ;;
        --kernel) need_arg $# "$1"; kernel=$2; shift 2 ;;
        --initramfs) need_arg $# "$1"; initramfs=$2; shift 2 ;;
        --print-cmd) print_cmd=1; shift ;;
        --list)
            for f in "$RIG_ROOT"/qemu-config/*.sh; do
                [[ ${f##*/} == common.sh ]] && continue
                printf '%-6s %s\n' "$(basename "$f" .sh)" "$(sed -n 's/^PROFILE_DESC="\(.*\)"$/\1/p' "$f")"
            done
            exit 0 ;;
        -h|--help) usage; exit 0 ;;
        --) shift; (($#)) && cmd="$*"; break ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

# ---- validate ------------------------------------------------------------
[[ $timeout =~ ^[0-9]+$ ]] || die "--timeout must be whole seconds, got '$timeout'"
[[ $cpus =~ ^[1-9][0-9]*$ ]] || die "--cpus must be a positive number, got '$cpus'"
[[ $queues =~ ^[1-9][0-9]*$ ]] || die "--queues must be a positive number, got '$queues'"
[[ $queue_size =~ ^[1-9][0-9]*$ ]] || die "--queue-size must be a positive number, got '$queue_size'"
[[ $mem =~ ^[0-9]+[MG]$ ]] || die "--mem must look like 512M or 2G, got '$mem'"
[[ $tag =~ ^[A-Za-z0-9._-]{1,35}$ ]] || die "--tag must be 1-35 characters of [A-Za-z0-9._-]"
[[ $mountopts != *[[:space:]]* ]] || die "--mount-opts must not contain spaces"
[[ -z $cmd || -z $script ]] || die "give either --cmd or --script, not both"
[[ -z $script || -r $script ]] || die "guest script '$script' not readable"
[[ -z $virtfs || -d $virtfs ]] || die "--virtfs '$virtfs' is not a directory"
[[ $virtfs != *,* ]] || die "--virtfs path must not contain a comma (QEMU option syntax)"
profile_names() {
    local f n
    for f in "$RIG_ROOT"/qemu-config/*.sh; do
        n=${f##*/}; n=${n%.sh}
        [[ $n == common ]] || printf '%s ' "$n"
    done
}
profile_file="$RIG_ROOT/qemu-config/$profile.sh"
[[ -r $profile_file ]] || die "unknown profile '$profile' (have: $(profile_names))"
accel=${ACCEL:-tcg}
[[ $accel == tcg || $accel == kvm ]] || die "ACCEL must be tcg or kvm, got '$accel'"
if [[ -z $test ]]; then
    if [[ -n $cmd || -n $script ]]; then test=cmd
    elif [[ -t 0 && -t 1 ]]; then test=shell
    else die "no guest program: give --test e2e|shell|none, --cmd or --script"
    fi
fi
case $test in
    shell|e2e|none) [[ -z $cmd && -z $script ]] || die "--test $test takes no --cmd/--script" ;;
    cmd) [[ -n $cmd || -n $script ]] || die "--test cmd needs --cmd or --script" ;;
    *) die "unknown --test '$test' (shell, e2e, none; or use --cmd)" ;;
esac
interactive=0
if [[ $test == shell ]]; then
    [[ -t 0 && -t 1 ]] || die "--test shell needs a terminal on stdin and stdout"
    interactive=1
fi

case $daemon in
    daxfsd)
        daemon=$RIG_ROOT/target/debug/daxfsd
        [[ -x $daemon ]] || die "no $daemon; run 'make build' (or use --daemon daxfsd-release after 'make release')"
        ;;
    daxfsd-release)
        daemon=$RIG_ROOT/target/release/daxfsd
        [[ -x $daemon ]] || die "no $daemon; run 'make release' (or use --daemon daxfsd for the debug build)"
        ;;
    virtiofsd)
        daemon=$("$RIG_ROOT/scripts/provision-virtiofsd.sh" --print-path)
        [[ -x $daemon ]] || die "upstream virtiofsd is not installed; run 'make virtiofsd'"
        ;;
    *) [[ -x $daemon ]] || die "daemon '$daemon' is not an executable file" ;;
esac

log "daemon: $daemon"

# shellcheck source=../qemu-config/common.sh
source "$RIG_ROOT/qemu-config/common.sh"
PROFILE_DAEMON_TAG=0
# shellcheck source=/dev/null
source "$profile_file"
case $PROFILE_QEMU in
    system) qemu=(qemu-system-x86_64); need_cmd qemu-system-x86_64 qemu-system-x86 ;;
    11) qemu=("$RIG_ROOT/scripts/qemu-11.sh")
        "$RIG_ROOT/scripts/provision-qemu.sh" 11 --print-path >/dev/null ||
            die "profile $profile needs QEMU >= 11.1; run 'make qemu'" ;;
    *) die "profile $profile: bad PROFILE_QEMU '$PROFILE_QEMU'" ;;
esac

if [[ -z $kernel ]]; then
    kernel=$("$RIG_ROOT/guest-kernel/build.sh" --print-path)
    [[ -s $kernel ]] || die "guest kernel not built; run 'make kernel'"
fi
[[ -r $kernel ]] || die "kernel '$kernel' not readable"
if [[ -z $initramfs ]]; then
    initramfs=$("$RIG_ROOT/scripts/build-initramfs.sh" 2>/dev/null) ||
        die "initramfs build failed; run 'make initramfs' to see why"
fi
[[ -r $initramfs ]] || die "initramfs '$initramfs' not readable"

# ---- private state; everything below is removed on exit ------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-vm.XXXXXX")
own_shared=0
daemon_pid="" qemu_pid="" stamp_pid="" sleeper_pid=""
stop_group() { # stop_group PID NAME: TERM its process group, then KILL
    local pid=$1
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 30); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$2 did not stop on SIGTERM; killing it"
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}
# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_group "$qemu_pid" QEMU
    stop_group "$daemon_pid" daemon
    [[ -n $sleeper_pid ]] && kill "$sleeper_pid" 2>/dev/null
    [[ -n $stamp_pid ]] && { wait "$stamp_pid" 2>/dev/null || true; }
    ((own_shared)) && rm -rf -- "$shared"
    rm -rf -- "$tmp"
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

if [[ -z $shared ]]; then
    shared=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-share.XXXXXX")
    own_shared=1
fi
[[ -d $shared ]] || die "shared dir '$shared' is not a directory"
shared=$(cd "$shared" && pwd)

if [[ -z $logfile ]]; then
    mkdir -p "$DAXFSD_CACHE/logs"
    logfile="$DAXFSD_CACHE/logs/vm-$(date +%Y%m%d-%H%M%S)-$profile-$$.log"
    # Keep the newest 100 logs of ours.
    find "$DAXFSD_CACHE/logs" -maxdepth 1 -name 'vm-*.log' -printf '%T@ %p\n' 2>/dev/null |
        sort -rn | tail -n +101 | cut -d' ' -f2- | while IFS= read -r old; do
            rm -f -- "$old" "${old%.log}.daemon.log"
        done
fi
mkdir -p "$(dirname "$logfile")"
: >"$logfile"
daemon_log="${logfile%.log}.daemon.log"
: >"$daemon_log"

# Guest command: packed as /daxfsd-cmd in a second cpio appended to the first, after the
# guest helpers (tests/e2e/guest/lib.sh: check, waitfor, md5, guest_end; scripts/lib.sh).
initrd=$initramfs
if [[ $test == cmd ]]; then
    mkdir -p "$tmp/cmd"
    {
        guest_helpers
        if [[ -n $script ]]; then cat -- "$script"; else printf '%s\n' "$cmd"; fi
    } >"$tmp/cmd/daxfsd-cmd"
    python3 "$RIG_ROOT/scripts/mkcpio.py" "$tmp/cmd.cpio" "$tmp/cmd"
    cat -- "$initramfs" "$tmp/cmd.cpio" >"$tmp/initrd.cpio"
    initrd=$tmp/initrd.cpio
fi

sock=$tmp/vfs.sock
VM_SOCK=$sock VM_TAG=$tag VM_MEM=$mem VM_CPUS=$cpus VM_ACCEL=$accel
VM_KERNEL=$kernel VM_INITRD=$initrd VM_QUEUE_SIZE=$queue_size VM_NUM_QUEUES=$queues
VM_APPEND="console=ttyS0 panic=-1 oops=panic 8250.nr_uarts=1 daxfsd.tag=$tag daxfsd.run=$test"
[[ -n $mountopts ]] && VM_APPEND+=" daxfsd.mountopts=$mountopts"
[[ -n $PROFILE_APPEND ]] && VM_APPEND+=" $PROFILE_APPEND"
VM_APPEND+=$extra_append
((${#VM_APPEND} < 2000)) || die "guest kernel command line too long (${#VM_APPEND} bytes)"
export VM_SOCK VM_TAG VM_MEM VM_CPUS VM_ACCEL VM_KERNEL VM_INITRD VM_APPEND VM_QUEUE_SIZE VM_NUM_QUEUES
QEMU_ARGS=()
profile_args
if [[ -n $virtfs ]]; then
    QEMU_ARGS+=(-virtfs "local,path=$(cd "$virtfs" && pwd),security_model=none,mount_tag=daxfsd9p")
fi
if ((interactive)); then
    QEMU_ARGS+=(-chardev "stdio,id=con,mux=on,signal=off,logfile=$logfile" -serial chardev:con -mon chardev=con)
elif [[ -n $monitor ]]; then
    QEMU_ARGS+=(-serial stdio -monitor "unix:$monitor,server=on,wait=off")
else
    QEMU_ARGS+=(-serial stdio -monitor none)
fi
daemon_cmd=("$daemon" "--socket-path=$sock" "--shared-dir=$shared" "--cache=$cache")
# Profiles whose device reads the tag from the daemon's config space.
((PROFILE_DAEMON_TAG)) && daemon_cmd+=("--tag=$tag")
daemon_cmd+=("${daemon_args[@]}")

if ((print_cmd)); then
    printf 'daemon:'; printf ' %q' "${daemon_cmd[@]}"; printf '\n'
    printf 'qemu:'; printf ' %q' "${qemu[@]}" "${QEMU_ARGS[@]}"; printf '\n'
    exit 0
fi

# ---- daemon ---------------------------------------------------------------
log "profile $profile ($accel), daemon ${daemon##*/}, share $shared, guest: $test${cmd:+ [$cmd]}${script:+ $script}"
setsid "${daemon_cmd[@]}" </dev/null >"$daemon_log" 2>&1 &
daemon_pid=$!
[[ -z $monitor ]] || echo "$daemon_pid" >"$monitor.daemon-pid"
for _ in $(seq 1 200); do
    [[ -S $sock ]] && break
    if ! kill -0 "$daemon_pid" 2>/dev/null; then
        wait "$daemon_pid" && drc=0 || drc=$?
        daemon_pid=""
        printf -- '--- daemon log (%s) ---\n' "$daemon_log" >&2; tail -n 20 "$daemon_log" >&2
        log "FAIL: the daemon exited with status $drc before creating its socket"
        exit 125
    fi
    sleep 0.05
done
[[ -S $sock ]] || { log "FAIL: the daemon created no socket at $sock within 10 s"; exit 125; }

# ---- QEMU -------------------------------------------------------------------
t_start=$EPOCHREALTIME
usec() { local t=${1/./}; echo $((10#$t)); }
elapsed() { local d=$(($(usec "$EPOCHREALTIME") - $(usec "$t_start"))); printf '%d.%03d' $((d / 1000000)) $((d / 1000 % 1000)); }

qemu_rc=0 timed_out=0 daemon_died=0
if ((interactive)); then
    log "interactive guest; console log: $logfile (Ctrl-A x quits QEMU)"
    "${qemu[@]}" "${QEMU_ARGS[@]}" 2>"$tmp/qemu.err" || qemu_rc=$?
else
    mkfifo "$tmp/console"
    # Console lines, stamped with seconds since QEMU started.
    stamp() {
        local line
        while IFS= read -r line || [[ -n $line ]]; do
            line=${line//$'\r'/}
            printf '[%9s] %s\n' "$(elapsed)" "$line"
        done
    }
    if ((verbose)); then
        stamp <"$tmp/console" | tee -a "$logfile" >&2 &
    else
        stamp <"$tmp/console" >>"$logfile" &
    fi
    stamp_pid=$!
    setsid "${qemu[@]}" "${QEMU_ARGS[@]}" </dev/null >"$tmp/console" 2>"$tmp/qemu.err" &
    qemu_pid=$!
    waitfor=("$qemu_pid" "$daemon_pid")
    if ((timeout > 0)); then
        sleep "$timeout" &
        sleeper_pid=$!
        waitfor+=("$sleeper_pid")
    fi
    done_pid=""
    wait -n -p done_pid "${waitfor[@]}" && done_rc=0 || done_rc=$?
    if [[ $done_pid == "$qemu_pid" ]]; then
        qemu_rc=$done_rc; qemu_pid=""
    elif [[ $done_pid == "$daemon_pid" ]]; then
        daemon_rc=$done_rc; daemon_pid=""
        # A daemon leaves when QEMU disconnects: that races with QEMU's own
        # exit. Only a daemon gone while QEMU keeps running died mid-run.
        for _ in $(seq 1 30); do kill -0 "$qemu_pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$qemu_pid" 2>/dev/null; then
            daemon_died=1
            log "FAIL: the daemon exited (status $daemon_rc) while the guest was running"
        else
            wait "$qemu_pid" && qemu_rc=0 || qemu_rc=$?
            qemu_pid=""
        fi
    else
        timed_out=1; sleeper_pid=""
        log "FAIL: timeout: the guest did not finish within ${timeout}s"
    fi
    if [[ -n $qemu_pid ]]; then
        stop_group "$qemu_pid" QEMU
        qemu_pid=""
    fi
    [[ -n $sleeper_pid ]] && { kill "$sleeper_pid" 2>/dev/null; wait "$sleeper_pid" 2>/dev/null || true; sleeper_pid=""; }
    wait "$stamp_pid" 2>/dev/null || true
    stamp_pid=""
fi
run_time=$(elapsed)

# ---- daemon exit: it should leave by itself once QEMU disconnected -------------
daemon_rc=${daemon_rc:-}
if [[ -n $daemon_pid ]]; then
    for _ in $(seq 1 50); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$daemon_pid" 2>/dev/null; then
        log "note: the daemon was still running 5 s after QEMU exited; stopping it"
        stop_group "$daemon_pid" daemon
    else
        wait "$daemon_pid" && daemon_rc=0 || daemon_rc=$?
    fi
    daemon_pid=""
fi

# ---- verdict --------------------------------------------------------------------
result=$(grep -ao '@@DAXFSD-RESULT rc=[0-9]*@@' "$logfile" | tail -n 1 | sed 's/.*rc=\([0-9]*\)@@/\1/' || true)
# "[    2.345] DAXFSD-MOUNTED uptime=1.90" -> host and guest seconds to the mount
read -r host_s guest_s < <(sed -n 's/^\[ *\([0-9.]*\)\] DAXFSD-MOUNTED uptime=\([0-9.]*\).*/\1 \2/p' "$logfile" | head -n1) || true
boot=""
[[ -n ${host_s:-} ]] && boot="boot-to-mount ${host_s}s (guest uptime ${guest_s}s), "
rc=0 why=""
if ((timed_out)); then rc=124 why="timeout after ${timeout}s"
elif ((daemon_died)); then rc=125 why="daemon exited during the run (status $daemon_rc)"
elif [[ -z $result ]]; then
    rc=125
    if grep -aq 'Kernel panic' "$logfile"; then why="guest kernel panic"
    elif ((qemu_rc != 0)); then why="QEMU exited with status $qemu_rc"
    else why="the guest gave no result marker"
    fi
else
    rc=$result
    ((rc == 0)) || why="guest program exited with status $rc"
fi
if [[ -n $daemon_rc && $daemon_rc != 0 && $rc == 0 && $daemon_died == 0 ]]; then
    rc=125 why="the daemon exited with status $daemon_rc after the guest finished"
fi

# The guest program's own output (console lines between the mount and the
# result marker) goes to stdout, so `vm.sh -c CMD >out` captures it.
if ((interactive == 0)); then
    sed -n '/DAXFSD-MOUNTED uptime=/,/@@DAXFSD-RESULT rc=/p' "$logfile" |
        sed '1d;$d' | sed 's/^\[ *[0-9.]*\] //' | sed '${/^$/d}'
fi
if ((rc != 0)); then
    if [[ -s $tmp/qemu.err ]]; then
        printf -- '--- QEMU stderr ---\n' >&2; tail -n 20 "$tmp/qemu.err" >&2
    fi
    if ((interactive == 0)); then
        printf -- '--- last 40 console lines (%s) ---\n' "$logfile" >&2
        tail -n 40 "$logfile" >&2
    fi
    printf -- '--- last 15 daemon log lines (%s) ---\n' "$daemon_log" >&2
    tail -n 15 "$daemon_log" >&2
    fails=$(grep -a 'CHECK FAIL' "$logfile" | sed 's/^\[[^]]*\] //' || true)
    if [[ -n $fails ]]; then
        printf -- '--- failed checks ---\n%s\n' "$fails" >&2
    fi
    log "FAIL ($why): ${boot}run ${run_time}s, rc=$rc; console log $logfile"
else
    [[ -s $tmp/qemu.err ]] && grep -v '^$' "$tmp/qemu.err" | sed 's/^/qemu: /' >&2
    log "OK: ${boot}run ${run_time}s; console log $logfile"
fi
exit "$rc"
