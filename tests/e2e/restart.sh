#!/usr/bin/env bash
# The file server killed and upgraded under a running guest (issue #39): daxfsd --restartable
# (the holder keeps QEMU's connection), profile pci (vhost-user-fs-pci), --cache=auto,
# --posix-lock; or, with --profile dax, the DAX window (pooled, 64 MiB, mounted dax=always
# with the upstream window policy: every read and write of a file maps its range); with
# --mapping direct as well, the window maps the files themselves (--dax-mapping=direct:
# shadow tails, copy slots, fanotify marks, all taken back by each new server).
#
#   tests/e2e/restart.sh [-v] [--kills N] [--profile pci|dax] [--mapping pooled|direct]
#
# With dax every file is read and written through the window: the checksummed file is read
# from it, and each loop also stores a numbered record into /mnt/dwrite through it (dd
# conv=notrunc, a store into the pool QEMU maps; the kernel's DAX write path) and checks an
# mmap MAP_SHARED write is read back (/e2e/vfstest mmap). After the VM, the host checks that
# /mnt/dwrite holds every record the guest stored, across the kills and upgrades.
#
# The guest holds a POSIX write lock on /mnt/lockfile (a process of its own), an append fd on
# /mnt/log and a working directory on the share, and loops: append a line, checksum an 8 MiB
# file, list and stat its cwd, create and remove a file. Meanwhile the host SIGKILLs the file
# server N times (default 10) at random gaps of 0.3-2.5 s, then upgrades it with SIGUSR2 to
# the holder: to a build whose version carries +restart-test (built here with
# DAXFSD_BUILD_ID), installed over the binary's path as a package manager would (rename),
# then once more.
# Checks: each kill followed by a new server (the holder's "serving again" line), each
# upgrade done (a new pid, "upgrade done"), the new version serving, no guest operation
# failed, the log has every line the guest wrote through the fd it kept, the lock is still
# held (another guest process's F_SETLK is refused, F_GETLK names a writer), and the holder's
# own CPU time and memory (printed). Ends with "e2e-restart: N passed, M failed".
set -euo pipefail
RIG_TAG=e2e-restart
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$RIG_ROOT"
# ok, bad, check, md5 and rig_summary come from scripts/lib.sh.

verbose=() kills=10 profile=pci mapping=pooled
while (($#)); do
    case $1 in
        -v) verbose=(-v); shift ;;
        --kills) [[ ${2:-} =~ ^[0-9]+$ ]] || die "--kills needs a number"; kills=$2; shift 2 ;;
        --profile) [[ ${2:-} == @(pci|dax) ]] || die "--profile needs pci or dax"; profile=$2; shift 2 ;;
        --mapping) [[ ${2:-} == @(pooled|direct) ]] || die "--mapping needs pooled or direct"; mapping=$2; shift 2 ;;
        -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
[[ $mapping == pooled || $profile == dax ]] || die "--mapping direct needs --profile dax"

work=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-e2e-restart.XXXXXX")
vm_pid=""
# Run at exit by scripts/lib.sh, in order: the VM (if still up), then the files.
# shellcheck disable=SC2016 # eval'd at exit, when vm_pid is what it is then
RIG_CLEANUP+=('[[ -z $vm_pid ]] || { kill "$vm_pid" 2>/dev/null; wait "$vm_pid" 2>/dev/null; }')
RIG_CLEANUP+=("rm -rf -- $(printf %q "$work")")

# Two builds: this tree's, and the same sources with another version string. The second is
# cached under the first one's checksum (one entry: a changed tree replaces it).
mkdir -p "$work/bin"
cargo build -q -p daxfsd --bin daxfsd
cp target/debug/daxfsd "$work/bin/daxfsd"
upgrade_cache=$DAXFSD_CACHE/restart-build
key=$(sha256sum target/debug/daxfsd | cut -c1-16)
if [[ -x $upgrade_cache/$key/daxfsd ]]; then
    log "upgrade target from the cache ($upgrade_cache/$key)"
else
    log "building the upgrade target (DAXFSD_BUILD_ID=restart-test)"
    DAXFSD_BUILD_ID=restart-test cargo build -q -p daxfsd --bin daxfsd
    rm -rf -- "$upgrade_cache"
    mkdir -p "$upgrade_cache/$key"
    cp target/debug/daxfsd "$upgrade_cache/$key/daxfsd"
    # Back to this tree's build for whatever runs next.
    cargo build -q -p daxfsd --bin daxfsd
fi
cp "$upgrade_cache/$key/daxfsd" "$work/new-daxfsd"
new_version=$("$work/new-daxfsd" --version)
[[ $new_version == *+restart-test ]] || die "the upgrade build says '$new_version'"

mkdir -p "$work/share/dir"
head -c 8M /dev/urandom >"$work/share/data"
want=$(md5 "$work/share/data")
# dax: 4 MiB of records the guest stores through the window, 8 bytes each.
dax_loop=":"
vm_args=(-p pci)
if [[ $profile == dax ]]; then
    RIG_TAG=e2e-restart-dax
    [[ $mapping == pooled ]] || RIG_TAG=e2e-restart-dax-direct
    head -c 4M /dev/zero >"$work/share/dwrite"
    # shellcheck disable=SC2016 # expanded in the guest
    dax_loop='printf "%08d" $i | dd of=/mnt/dwrite bs=8 seek=$i conv=notrunc 2>/dev/null || { errs=$((errs + 1)); echo "FAILED dax store $i"; }
    /e2e/vfstest mmap /mnt/mm >/dev/null || { errs=$((errs + 1)); echo "FAILED mmap $i"; }'
    vm_args=(-p dax -a --dax-window=64M -a "--dax-mapping=$mapping" -o "dax=always,dax_policy=upstream")
fi
cat >"$work/guest.sh" <<GUEST
/e2e/vfstest lockhold /mnt/lockfile >/tmp/lockhold.out 2>&1 &
locker=\$!
n=0; while ! grep -q LOCKED /tmp/lockhold.out && [ \$n -lt 100 ]; do sleep 0.1; n=\$((n + 1)); done
check guest_lock_taken grep -q LOCKED /tmp/lockhold.out
exec 3>>/mnt/log
cd /mnt/dir
touch /mnt/started
i=0 errs=0
while [ ! -e /mnt/stop ] && [ \$i -lt 3000 ]; do
    echo "line \$i" >&3 || { errs=\$((errs + 1)); echo "FAILED append \$i"; }
    m=\$(md5sum /mnt/data | cut -d' ' -f1) || errs=\$((errs + 1))
    [ "\$m" = "$want" ] || { errs=\$((errs + 1)); echo "FAILED md5 \$i: \$m"; }
    ls -la . >/dev/null && stat . >/dev/null || { errs=\$((errs + 1)); echo "FAILED cwd \$i"; }
    echo x >f.\$i && rm f.\$i || { errs=\$((errs + 1)); echo "FAILED create \$i"; }
    $dax_loop
    i=\$((i + 1))
done
exec 3>&-
check guest_loop_ran_through_the_upgrades [ \$i -gt 20 ]
check guest_no_failed_operation [ \$errs -eq 0 ]
check guest_log_has_every_line [ "\$(wc -l </mnt/log)" -eq \$i ]
check guest_cwd_still_usable ls -la .
check guest_lock_still_held /e2e/vfstest lockbusy /mnt/lockfile
kill \$locker
sync
echo "LOOPS \$i"
guest_end
GUEST

log "booting the guest (profile $profile, daxfsd --restartable --posix-lock)"
scripts/vm.sh "${verbose[@]}" "${vm_args[@]}" -d "$work/bin/daxfsd" -a --restartable -a --posix-lock -s "$work/share" \
    --monitor "$work/mon" -T 600 -l "$work/con.log" --script "$work/guest.sh" \
    >"$work/out" 2>"$work/err" &
vm_pid=$!
for _ in $(seq 1 300); do
    [[ -e $work/share/started ]] && break
    kill -0 "$vm_pid" 2>/dev/null || break
    sleep 0.2
done
holder=$(cat "$work/mon.daemon-pid")
dlog="$work/con.daemon.log"
server_pid() { pgrep -P "$holder" -n || true; }
# log_has PATTERN N TENTHS: waits up to TENTHS tenths of a second for N lines of the daemon
# log matching PATTERN; status 1 when they did not come. nth_line PATTERN N: the N-th one.
log_has() {
    local i
    for ((i = 0; i < $3; i++)); do
        (($(grep -c "$1" "$dlog" || true) >= $2)) && return 0
        sleep 0.1
    done
    (($(grep -c "$1" "$dlog" || true) >= $2))
}
nth_line() { grep "$1" "$dlog" | sed -n "${2}p"; }

upgrade() { # upgrade N: SIGUSR2, wait for the N-th "upgrade done" line
    local n=$1 before after done=0
    before=$(server_pid)
    kill -USR2 "$holder"
    log_has 'holder: upgrade done' "$n" 300 || done=1
    after=$(server_pid)
    if ((done == 0)) && [[ -n $after && $after != "$before" ]]; then
        ok "upgrade_$n ($(nth_line 'holder: upgrade done' "$n" | grep -o 'in [0-9]* ms'), server $before -> $after)"
    else
        bad "upgrade_$n" "server $before -> $after; $(grep -E 'holder:.*(fail|error)' "$dlog" | tail -n 2 | tr '\n' '|')"
    fi
}
# kills_and_upgrades: the host side, while the guest loops.
kills_and_upgrades() {
    sleep 2
    for ((k = 1; k <= kills; k++)); do
        victim=$(server_pid)
        kill -KILL "$victim"
        if log_has 'holder: serving again' "$k" 100; then
            ok "kill_$k ($(nth_line 'holder: serving again' "$k" | grep -o '[0-9]* ms'))"
        else
            bad "kill_$k" "no new server after killing $victim: $(grep -E 'holder:.*(giving|error)' "$dlog" | tail -n 2 | tr '\n' '|')"
        fi
        sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.1f", 0.3 + (r % 23) / 10 }')"
    done
    log "installing the +restart-test build over $work/bin/daxfsd"
    cp "$work/new-daxfsd" "$work/bin/daxfsd.new" && mv "$work/bin/daxfsd.new" "$work/bin/daxfsd"
    upgrade 1
    if grep -q "daxfsd $(cut -d' ' -f2 <<<"$new_version") serving" "$dlog"; then
        ok "upgraded_build_serving ($new_version)"
    else
        bad "upgraded_build_serving" "no server logged '$new_version serving'"
    fi
    sleep 2
    upgrade 2
    sleep 2
    read -r _ _ _ _ _ _ _ _ _ _ _ _ _ ut st _ <"/proc/$holder/stat" || true
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$holder/status" 2>/dev/null || echo "?")
    log "holder $holder: CPU $(((ut + st) * 1000 / $(getconf CLK_TCK))) ms, VmRSS $rss KiB"
}
if [[ -e $work/share/started ]]; then
    kills_and_upgrades
else
    # The guest script ended early: what it printed is collected below.
    bad guest_loop_started "the guest did not start its loop: $(tail -n 3 "$work/err" | tr '\n' '|')"
fi
touch "$work/share/stop"
rc=0
wait "$vm_pid" || rc=$?
vm_pid=""
while IFS= read -r line; do
    case $line in
        "GUEST PASS "*) ok "${line#GUEST PASS }" ;;
        "GUEST FAIL "*) n=${line#GUEST FAIL }; bad "${n%%: *}" "${n#*: }" ;;
        FAILED*) log "guest: $line" ;;
    esac
done <"$work/out"
subsuite_end guest "$work/out" "$rc" 4 guest
check vm_exit "$rc" "vm.sh exited $rc: $(tail -n 3 "$work/err" | tr '\n' '|')"
grep -q '^LOOPS' "$work/out" && log "guest $(grep '^LOOPS' "$work/out")"
if [[ $profile == dax ]]; then
    # Every record the guest stored through the window is in the file on the host.
    loops=$(awk '/^LOOPS/ {print $2}' "$work/out")
    loops=${loops:-0}
    for ((i = 0; i < loops; i++)); do printf '%08d' "$i"; done >"$work/dwrite.want"
    if ((loops == 0)); then
        missing="no loops"
    elif cmp -s -n $((loops * 8)) "$work/dwrite.want" "$work/share/dwrite"; then
        missing=0
    else
        missing=$({ cmp -l -n $((loops * 8)) "$work/dwrite.want" "$work/share/dwrite" || true; } |
            awk '{print int(($1 - 1) / 8)}' | sort -u | wc -l)
    fi
    if [[ $missing == 0 ]]; then
        ok "dax_stores_in_the_file (${loops} records)"
    else
        bad "dax_stores_in_the_file" "$missing of ${loops:-?} records missing on the host"
    fi
    log "DAX: the last server $(grep -o 'written_back=[0-9]* pulled=[0-9]*' "$dlog" | tail -n 1 || true); $(grep -c 'changed on both the guest and the host' "$dlog" || true) conflict line(s)"
    taken=$(grep -o '[0-9]* DAX mapping(s)' "$dlog" | awk '{print $1}' | tr '\n' ' ' || true)
    log "DAX mappings taken back by each new server: ${taken:-none}"
    if [[ $mapping == direct ]]; then
        # Each new server took the window's mappings back, none was dropped as unfit.
        most=$(tr ' ' '\n' <<<"$taken" | sort -n | tail -n 1)
        dropped=$(grep -c 'restart: DAX .*dropped' "$dlog" || true)
        direct=0
        grep -q 'direct: zero-copy mappings of the files' "$dlog" || direct=1
        check dax_direct_mappings "$direct" "the daemon did not map the files directly"
        check dax_direct_window_taken_back "$((${most:-0} > 0 ? 0 : 1))" \
            "no restart took a DAX mapping back: ${taken:-none}"
        check dax_direct_nothing_dropped "$dropped" "$dropped mapping(s) dropped at take-back"
    fi
fi
log "requests served again after a crash: $(grep -o 'serving [0-9]* request(s) again' "$dlog" | awk '{s += $2} END {print s + 0}')"
rig_summary "$RIG_TAG"
