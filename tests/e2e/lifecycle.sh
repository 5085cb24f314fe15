#!/usr/bin/env bash
# The VM lifecycle end to end, with real QEMUs (TCG) driven through their monitor.
#
#   tests/e2e/lifecycle.sh [-v] [--only CASE[,CASE...]]
#
# Cases:
#   pause-pci-daxfsd     profile pci (QEMU 7.2, vhost-user-fs-pci), daxfsd: the guest holds
#                        an fd and a working directory on the share and keeps reading while
#                        the host types `stop` / `cont` three times; afterwards the old fd
#                        reads, stat/readdir/create/write work, a 48 MiB file has the host's
#                        checksum, and no guest request failed during the pauses
#   pause-pci-virtiofsd  the same against upstream virtiofsd 1.14 (proof the test is right)
#   pause-dax            the same on profile dax (QEMU 11.1, DAX window, -o dax=always, the
#                        daemon's default --dax-mapping pooled): the 48 MiB file is read
#                        through DAX before and after the pauses. The guest's busy loop maps
#                        and unmaps a file's ranges at every `cat`: with direct mappings a
#                        `stop` then races SHMEM requests, which QEMU 11.1.3 dies of (below);
#                        CI saw it once (SIGSEGV at stop_1). Direct mappings under pauses are
#                        pause-dax-rapid's, with no new mapping during the cycles
#   pause-dax-rapid      profile dax: 30 stop/cont cycles back to back while the guest keeps
#                        reading a 48 MiB file through its live DAX mappings; QEMU must stay
#                        up, the file keeps the host's checksum, and a file first mapped after
#                        the cycles reads correctly (the window restarts after `cont`). The
#                        guest maps nothing new during the cycles: QEMU 11.1.3 segfaults on a
#                        SHMEM request it reads after `stop` began (ARCHITECTURE.md, "DAX on
#                        QEMU 11.1", issue #10), a race no backend can close
#   pause-dax-churn      profile dax with the daemon's default (--dax-mapping pooled): 30
#                        stop/cont cycles at random gaps while the guest reads a 160 MiB file
#                        through a 64 MiB window (it maps and unmaps all the time); QEMU stays
#                        up, the checksum holds, every guest mapping was served from the pool
#                        (one SHMEM request in all). Negative control: with
#                        LIFECYCLE_CHURN_ARGS="-a --dax-mapping=direct -a --dax-copy=off"
#                        QEMU 11.1.3 died (SIGSEGV) after 15 and 26 cycles (2 runs of 2)
#   sigterm-dax          DAX shadow tails: bytes the guest stored through a shared mapping
#                        into a file's last partial page (no close, no fsync after the
#                        store) are on the host after a guest `sync` while the guest runs,
#                        and after SIGTERM to the daemon (which exits 0) without a sync
# Ends with "e2e-lifecycle: N passed, M failed"; exits non-zero on any failure.
set -euo pipefail
RIG_TAG=e2e-lifecycle
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$RIG_ROOT"

verbose=() only=""
while (($#)); do
    case $1 in
        -v) verbose=(-v); shift ;;
        --only) (($# >= 2)) || die "--only needs a value"; only=,$2,; shift 2 ;;
        -h|--help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
need_cmd python3
# ok, bad, check, md5, subsuite_end and rig_summary come from scripts/lib.sh; the guest
# scripts' check and guest_end from tests/e2e/guest/lib.sh (scripts/vm.sh sends them).
wanted() { [[ -z $only || $only == *",$1,"* ]]; }
hmp() { python3 scripts/hmp.py "$@"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-e2e-lifecycle.XXXXXX")
vm_pid=""
# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
    [[ -n $vm_pid ]] && kill "$vm_pid" 2>/dev/null && wait "$vm_pid" 2>/dev/null
    if [[ -n ${LIFECYCLE_KEEP:-} ]]; then echo "kept $work" >&2; else rm -rf -- "$work"; fi
}
trap cleanup EXIT

"$RIG_ROOT/guest-kernel/build.sh" >/dev/null
"$RIG_ROOT/scripts/build-initramfs.sh" >/dev/null
"$RIG_ROOT/scripts/provision-qemu.sh" all >/dev/null

# wait_file PATH SECONDS: wait for PATH to exist while the VM runs.
wait_file() {
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        [[ -e $1 ]] && return 0
        kill -0 "$vm_pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# Guest checks print "GUEST PASS name" / "GUEST FAIL name: detail"; collect them as checks.
# A guest script that ends with guest_end must have printed its end line (subsuite_end).
collect() { # collect CASE OUTPUT_FILE STATUS
    local line n
    while IFS= read -r line; do
        case $line in
            "GUEST PASS "*) ok "$1/${line#GUEST PASS }" ;;
            "GUEST FAIL "*) n=${line#GUEST FAIL }; bad "$1/${n%%: *}" "${n#*: }" ;;
        esac
    done <"$2"
    if grep -q '^guest_end$' "$work/$1.sh"; then subsuite_end "$1/guest" "$2" "$3" 0 guest; fi
}

# vm_started CASE PROFILE DAEMON SHARE [vm.sh args...]: boots the case's VM in the background
# (vm_pid) with its guest script $work/CASE.sh, monitor $work/CASE.mon and logs
# $work/CASE.{log,out,err}.
vm_started() {
    local name=$1 profile=$2 daemon=$3 share=$4
    shift 4
    scripts/vm.sh "${verbose[@]}" -p "$profile" -d "$daemon" -s "$share" --monitor "$work/$name.mon" \
        -T 600 -l "$work/$name.log" --script "$work/$name.sh" "$@" >"$work/$name.out" 2>"$work/$name.err" &
    vm_pid=$!
}

# vm_finished CASE RC: waits for the case's VM (its exit status joins RC), collects the
# guest's checks and checks the VM's exit.
vm_finished() {
    local name=$1 rc=$2
    wait "$vm_pid" || rc=$?
    vm_pid=""
    collect "$name" "$work/$name.out" "$rc"
    if ((rc == 0)); then
        ok "$name/vm_exit"
    else
        bad "$name/vm_exit" "vm.sh exited $rc"
        tail -n 30 "$work/$name.err" >&2
    fi
}

guest_pause_script() { # guest_pause_script WANT_MD5
    cat <<EOF
exec 3</mnt/keep
cd /mnt/wd || exit 1
md5sum /mnt/big48 | cut -d' ' -f1 >/tmp/md5-before
: >/tmp/errs
(
    n=0
    # Ends when the host says so, or after 50 failed requests (a broken session).
    while [ ! -e /mnt/go ] && [ "\$(wc -l </tmp/errs)" -lt 50 ]; do
        cat /mnt/busy >/dev/null || echo "read busy" >>/tmp/errs
        ls /mnt >/dev/null || echo "ls" >>/tmp/errs
        stat /mnt/keep >/dev/null || echo "stat" >>/tmp/errs
        n=\$((n + 1))
    done
    echo "\$n" >/tmp/loops
) &
bg=\$!
touch /mnt/ready
wait \$bg
check io_during_pauses [ ! -s /tmp/errs ] || sort /tmp/errs | uniq -c
check busy_loop_ran [ "\$(cat /tmp/loops)" -gt 0 ]
check fd_read_after_pause [ "\$(cat <&3)" = kept-content ]
check cwd_after_pause [ "\$(cat inwd)" = in-wd ]
check stat_after_pause [ "\$(stat -c %s /mnt/keep)" = 12 ]
check readdir_after_pause sh -c 'ls /mnt | grep -qx keep'
echo created-after >/mnt/created
check create_write_after_pause [ "\$(cat /mnt/created)" = created-after ]
check big_before_pause [ "\$(cat /tmp/md5-before)" = "$1" ]
check big_after_pause [ "\$(md5sum /mnt/big48 | cut -d' ' -f1)" = "$1" ]
guest_end
EOF
}

# pause_case NAME PROFILE DAEMON [vm.sh args...]
pause_case() {
    local name=$1 profile=$2 daemon=$3 rc=0 i st
    shift 3
    wanted "$name" || return 0
    local share=$work/$name mon=$work/$name.mon
    mkdir -p "$share/wd"
    printf 'kept-content' >"$share/keep"
    printf 'in-wd' >"$share/wd/inwd"
    head -c $((48 << 20)) /dev/urandom >"$share/big48"
    head -c $((4 << 20)) /dev/urandom >"$share/busy"
    guest_pause_script "$(md5 "$share/big48")" >"$work/$name.sh"
    log "$name: boot ($profile, $daemon), three stop/cont rounds while the guest reads"
    vm_started "$name" "$profile" "$daemon" "$share" "$@"
    if ! wait_file "$share/ready" 300; then
        bad "$name/guest_ready" "the guest never got ready (see below)"
    else
        local rounds=0
        for i in 1 2 3; do
            st=$(hmp "$mon" stop "info status" 2>&1) || { bad "$name/stop_$i" "$st"; break; }
            [[ $st == *paused* ]] || bad "$name/paused_$i" "after stop: $st"
            sleep 1
            st=$(hmp "$mon" cont "info status" 2>&1) || { bad "$name/cont_$i" "$st"; break; }
            [[ $st == *running* ]] || bad "$name/resumed_$i" "after cont: $st"
            sleep 1
            rounds=$i
        done
        ((rounds == 3)) && ok "$name/three_stop_cont_rounds"
        touch "$share/go"
    fi
    vm_finished "$name" "$rc"
    if [[ $(cat "$share/created" 2>/dev/null) == created-after ]]; then
        ok "$name/host_sees_guest_write"
    else
        bad "$name/host_sees_guest_write" "share/created: $(cat "$share/created" 2>&1)"
    fi
    if grep -q 'before INIT' "$work/$name.daemon.log" 2>/dev/null; then
        bad "$name/session_kept" "$(grep -m3 'before INIT' "$work/$name.daemon.log")"
    else
        ok "$name/session_kept"
    fi
}

pause_case pause-pci-daxfsd pci "${LIFECYCLE_DAXFSD:-daxfsd}"
pause_case pause-pci-virtiofsd pci virtiofsd
# shellcheck disable=SC2086 # LIFECYCLE_DAX_ARGS is a list of words
pause_case pause-dax dax daxfsd -a --dax-window=64M -o dax=always ${LIFECYCLE_DAX_ARGS:-}

# ---- pause-dax-rapid: stop/cont back to back while the guest reads through DAX ------
if wanted pause-dax-rapid; then
    name=pause-dax-rapid share=$work/$name mon=$work/$name.mon
    mkdir -p "$share"
    head -c $((48 << 20)) /dev/urandom >"$share/big48"
    head -c $((16 << 20)) /dev/urandom >"$share/after16"
    big=$(md5 "$share/big48") after=$(md5 "$share/after16")
    cat >"$work/$name.sh" <<GUEST
check big_before [ "\$(md5sum /mnt/big48 | cut -d' ' -f1)" = $big ]
touch /mnt/ready
loops=0 bad=0
while [ ! -e /mnt/go ]; do
    [ "\$(md5sum /mnt/big48 | cut -d' ' -f1)" = $big ] || bad=\$((bad + 1))
    loops=\$((loops + 1))
done
check big_during_pauses [ "\$bad" = 0 ]
check reads_during_pauses [ "\$loops" -gt 0 ]
check mapped_after_pauses [ "\$(md5sum /mnt/after16 | cut -d' ' -f1)" = $after ]
guest_end
GUEST
    log "$name: 30 stop/cont cycles back to back while the guest reads through DAX"
    vm_started "$name" dax daxfsd "$share" -a --dax-window=64M -a --dax-mapping=direct -o dax=always
    rc=0
    if ! wait_file "$share/ready" 300; then
        bad "$name/guest_ready" "the guest never got ready"
    else
        cmds=()
        for _ in $(seq 1 30); do cmds+=(stop cont); done
        if st=$(hmp "$mon" "${cmds[@]}" "info status" 2>&1) && [[ $st == *running* ]]; then
            ok "$name/thirty_stop_cont_cycles"
        else
            bad "$name/thirty_stop_cont_cycles" "$(tail -n 3 <<<"$st")"
        fi
        touch "$share/go"
    fi
    vm_finished "$name" "$rc"
    if [[ ! -s $work/$name.daemon.log ]]; then
        bad "$name/no_refused_maps" "no daemon log"
    elif grep -q 'device is not running' "$work/$name.daemon.log"; then
        bad "$name/no_refused_maps" "$(grep -m3 'device is not running' "$work/$name.daemon.log")"
    else
        ok "$name/no_refused_maps"
    fi
fi

# ---- pause-dax-churn: stop/cont while the guest remaps, with the daemon's default -------
if wanted pause-dax-churn; then
    name=pause-dax-churn share=$work/$name mon=$work/$name.mon
    mkdir -p "$share"
    head -c $((160 << 20)) /dev/urandom >"$share/big160"
    big=$(md5 "$share/big160")
    cat >"$work/$name.sh" <<GUEST
touch /mnt/ready
loops=0 bad=0
while [ ! -e /mnt/go ]; do
    [ "\$(md5sum /mnt/big160 | cut -d' ' -f1)" = $big ] || bad=\$((bad + 1))
    loops=\$((loops + 1))
done
check big_during_pauses [ "\$bad" = 0 ]
check reads_during_pauses [ "\$loops" -gt 0 ]
guest_end
GUEST
    log "$name: 30 stop/cont cycles while the guest reads 160 MiB through a 64 MiB window (default --dax-mapping)"
    # shellcheck disable=SC2086 # LIFECYCLE_CHURN_ARGS is a list of words
    vm_started "$name" dax daxfsd "$share" -a --dax-window=64M -o dax=always ${LIFECYCLE_CHURN_ARGS:-}
    rc=0
    if ! wait_file "$share/ready" 300; then
        bad "$name/guest_ready" "the guest never got ready"
    else
        sleep 5
        cycles=0
        for _ in $(seq 1 30); do
            st=$(hmp "$mon" stop cont "info status" 2>&1) || break
            [[ $st == *running* ]] || break
            cycles=$((cycles + 1))
            sleep 0.$((RANDOM % 10))
        done
        if ((cycles == 30)); then
            ok "$name/thirty_stop_cont_cycles_while_remapping"
        else
            bad "$name/thirty_stop_cont_cycles_while_remapping" "after $cycles cycles: $(tail -n 3 <<<"$st")"
        fi
        touch "$share/go"
    fi
    vm_finished "$name" "$rc"
    # The guest kept remapping during the cycles (the window is smaller than the file), and
    # every mapping went to the pool.
    stats=$(grep -o 'dax: maps=[^ ]* .*pooled=[0-9]*' "$work/$name.daemon.log" 2>/dev/null | tail -n 1)
    maps=$(sed -n 's/.*dax: maps=\([0-9]*\).*/\1/p' <<<"$stats")
    pooled=$(sed -n 's/.* pooled=\([0-9]*\).*/\1/p' <<<"$stats")
    if [[ -n $maps && $maps -gt 64 && $pooled == "$maps" ]]; then
        ok "$name/all_mappings_pooled"
    else
        bad "$name/all_mappings_pooled" "daemon stats: ${stats:-none in $work/$name.daemon.log}"
    fi
fi

# ---- sigterm-dax: dirty shadow tails ---------------------------------------------
if wanted sigterm-dax; then
    name=sigterm-dax share=$work/$name mon=$work/$name.mon
    mkdir -p "$share"
    head -c 100 /dev/zero | tr '\0' a >"$share/tailfile"
    cat >"$work/$name.sh" <<'EOF'
/e2e/vfstest mmapdirty /mnt/tailfile 10 GUESTBYTES >/tmp/d1 &
while [ ! -s /tmp/d1 ]; do sleep 0.1; done
sync
touch /mnt/synced
while [ ! -e /mnt/go ]; do sleep 0.2; done
/e2e/vfstest mmapdirty /mnt/tailfile 40 SECOND >/tmp/dirty &
while [ ! -s /tmp/dirty ]; do sleep 0.1; done
touch /mnt/dirty
sleep 600
EOF
    log "$name: DAX tail writes, guest sync, then SIGTERM to the daemon"
    vm_started "$name" dax daxfsd "$share" -a --dax-window=64M -a --dax-mapping=direct -o dax=always
    if ! wait_file "$share/synced" 300; then
        bad "$name/guest_ready" "the guest never synced"
    else
        got=$(dd if="$share/tailfile" bs=1 skip=10 count=10 2>/dev/null)
        if [[ $got == GUESTBYTES ]]; then ok "$name/sync_visible_on_host"; else bad "$name/sync_visible_on_host" "host reads '$got'"; fi
        touch "$share/go"
        if ! wait_file "$share/dirty" 120; then
            bad "$name/guest_dirty" "the guest never wrote its second tail"
        else
            # At once: the periodic write-back (5 s) must not be what saves the bytes.
            dpid=$(cat "$mon.daemon-pid")
            kill -TERM "$dpid"
            for _ in $(seq 1 100); do kill -0 "$dpid" 2>/dev/null || break; sleep 0.1; done
            if kill -0 "$dpid" 2>/dev/null; then
                bad "$name/daemon_exits_on_sigterm" "still running 10 s after SIGTERM"
            else
                ok "$name/daemon_exits_on_sigterm"
            fi
            got=$(dd if="$share/tailfile" bs=1 skip=40 count=6 2>/dev/null)
            if [[ $got == SECOND ]]; then ok "$name/sigterm_writes_tails_back"; else bad "$name/sigterm_writes_tails_back" "host reads '$got'"; fi
            size=$(stat -c %s "$share/tailfile")
            if [[ $size == 100 ]]; then ok "$name/size_unchanged"; else bad "$name/size_unchanged" "size $size"; fi
        fi
    fi
    wait "$vm_pid" 2>/dev/null || true
    vm_pid=""
    if grep -q 'daemon exited (status 0)' "$work/$name.err"; then
        ok "$name/daemon_exit_status_0"
    else
        bad "$name/daemon_exit_status_0" "$(grep -m1 'daemon exited' "$work/$name.err" || echo 'no exit line')"
    fi
fi

rig_summary e2e-lifecycle
