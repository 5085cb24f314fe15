#!/usr/bin/env bash
# Host changes reach the guest (issue #42): the virtio-fs notification queue on QEMU 11.1
# (profile dax, TCG), guest kernel patches 0011-0012, daxfsd --cache=coherent.
#
#   tests/e2e/notify.sh [-v] [-d DAEMON] [-a DAEMON_ARG]... [--kernel BZIMAGE] [--bound-ms MS]
#
# Boot 1: the generic device with the notification queue (the dax profile gives it num_vqs =
# 2 + request queues and config_size=44 for a daemon with --cache=coherent), daxfsd --cache=coherent, `-o dax=never` (so cached
# data lives in the guest's page cache). A guest inotifywait (inotify-tools) watches the
# tree /mnt/w (recursive) while the host acts:
#   queue_up        the guest negotiated the feature and posted its buffers (dmesg)
#   cached_edit     the guest read /mnt/cached into its caches; the host rewrites it in place
#                   (new data, new size); the guest's next read returns the host's bytes and
#                   size
#   host_create, host_write, host_chmod, host_rename, host_delete
#                   each host change gives the watcher the event a local change gives
#                   (CREATE, MODIFY, ATTRIB, MOVED_FROM + MOVED_TO with one cookie, DELETE)
#                   within the bound (--bound-ms, default 1000: the host's time from the
#                   change to the event line on the guest's serial console, an upper bound;
#                   measured 31-63 ms under TCG on a loaded 2-core host, Nov 2026)
#   host_order      the watcher saw exactly those six events, in that order
#   own_once        the guest's own create, write, chmod, rename and delete of /mnt/w/own
#                   give exactly one event each (none echoed back by the daemon)
# Boot 2: the device without the queue (num_vqs = 1 + request queues, config_size=40), daxfsd
# without --notify: the same kernel still mounts and works (no_feature_io), and does not
# set up a notification queue (no_feature_quiet).
# Prints the measured latencies (median, max). Ends with "e2e-notify: N passed, M failed".
set -euo pipefail
RIG_TAG=e2e-notify
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$RIG_ROOT"

verbose=() daemon=() bound_ms=1000
while (($#)); do
    case $1 in
        -v) verbose=(-v); shift ;;
        -d) [[ -n ${2:-} ]] || die "-d needs a daemon path"; daemon=(-d "$2"); shift 2 ;;
        -a) [[ -n ${2:-} ]] || die "-a needs a daemon argument"; daemon+=(-a "$2"); shift 2 ;;
        --kernel) [[ -r ${2:-} ]] || die "--kernel needs a readable bzImage"; daemon+=(--kernel "$2"); shift 2 ;;
        --bound-ms) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || die "--bound-ms needs a number"; bound_ms=$2; shift 2 ;;
        -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (use -v, -d DAEMON, -a ARG, --kernel BZIMAGE, --bound-ms MS)" ;;
    esac
done

work=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-e2e-notify.XXXXXX")
RIG_CLEANUP+=("rm -rf -- $(printf %q "$work")")
logs="$DAXFSD_CACHE/logs"
mkdir -p "$logs"
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# ---- boot 1: the notification queue ---------------------------------------------------
cat >"$work/guest.sh" <<'EOF'
# Poll (lookups) for a control file the host creates; 60 s at most.
waitfor() { i=0; while [ ! -e "$1" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done; [ -e "$1" ]; }
dmesg | grep -o 'notification queue: .*' | sed 's/^/@@QUEUE /'
check guest_notify_queue sh -c "dmesg | grep -q 'notification queue: '"
grep ' /mnt ' /proc/mounts | sed 's/^/@@MOUNT /'
# The file the host will edit: its data and attributes in the guest's caches.
cat /mnt/cached >/dev/null
stat -c %s /mnt/cached >/dev/null
# Each event goes to the console at once (inotifywait flushes per event; tee writes what it
# reads) and to /tmp/ev for the counts below.
inotifywait -m -r -e create,modify,attrib,moved_from,moved_to,delete \
    --format 'EV %e %w%f %c' /mnt/w 2>/tmp/iw.err | tee /tmp/ev &
i=0
while ! grep -q 'Watches established' /tmp/iw.err && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
echo "@@NOTIFY-READY@@"
# The host has rewritten /mnt/cached when ctl/go-read exists: one read now.
waitfor /mnt/ctl/go-read
echo "@@CACHED size=$(stat -c %s /mnt/cached) md5=$(md5sum </mnt/cached | cut -d' ' -f1)@@"
waitfor /mnt/ctl/host-done
# The guest's own changes: one event each, none echoed back.
: >/mnt/w/own
echo data >>/mnt/w/own
chmod 600 /mnt/w/own
mv /mnt/w/own /mnt/w/own2
rm /mnt/w/own2
sleep 4
kill "$(pidof inotifywait)" 2>/dev/null
wait 2>/dev/null
for e in "CREATE /mnt/w/own" "MODIFY /mnt/w/own" "ATTRIB /mnt/w/own" "MOVED_FROM /mnt/w/own" \
    "MOVED_TO /mnt/w/own2" "DELETE /mnt/w/own2"; do
    echo "@@OWN $(grep -c "^EV $e " /tmp/ev) $e"
done
echo "@@OWN-ALL $(grep -c ' /mnt/w/own' /tmp/ev)"
dmesg | grep -i 'virtio-fs\|virtiofs' | tail -n 20
echo "@@NOTIFY-DONE@@"
guest_end
EOF

share=$work/share
mkdir -p "$share/w/sub" "$share/ctl"
printf 'old bytes\n' >"$share/cached"
logf="$logs/e2e-notify-$(date +%Y%m%d-%H%M%S)-$$.log"
log "boot 1: notification queue, daxfsd --cache=coherent (console $logf)"
rc=0
scripts/vm.sh "${verbose[@]}" "${daemon[@]}" -p dax --cache coherent -o dax=never \
    -s "$share" --script "$work/guest.sh" -T 300 -l "$logf" >"$work/out1.txt" 2>"$work/err1.txt" &
vmpid=$!

# The console log stamps each line ("[   5.499] text"): C is the start of a line's text.
C='^(\[ *[0-9.]+\] )?'
# wait_line REGEX [SECONDS]: until the console has a line matching REGEX (grep -E).
wait_line() {
    local deadline=$((SECONDS + ${2:-60}))
    while ((SECONDS < deadline)); do
        grep -aqE -- "$1" "$logf" 2>/dev/null && return 0
        kill -0 "$vmpid" 2>/dev/null || { grep -aqE -- "$1" "$logf" 2>/dev/null; return; }
        sleep 0.02
    done
    return 1
}

lat=()
# step NAME REGEX COMMAND...: run COMMAND in the share, then wait (the bound, plus slack to
# tell late from never) for the guest's event line; check it came within the bound.
step() {
    local name=$1 re=$2 t0 t1 ms
    shift 2
    t0=$(now_ms)
    (cd "$share" && "$@")
    if wait_line "$re" $((bound_ms / 1000 + 10)); then
        t1=$(now_ms) ms=$((t1 - t0))
        lat+=("$ms")
        if ((ms <= bound_ms)); then ok "$name"; else bad "$name" "event after $ms ms (bound $bound_ms ms)"; fi
        log "$name: event after $ms ms"
    else
        bad "$name" "no '$re' on the guest console within $((bound_ms / 1000 + 10)) s"
    fi
}

if wait_line '@@NOTIFY-READY@@' 240; then
    if grep -aqE "${C}@@QUEUE notification queue: 16 buffers" "$logf"; then ok queue_up; else
        bad queue_up "guest dmesg: $(grep -a 'virtiofs\|virtio-fs' "$logf" | tail -n 3 | tr '\n' ' ')"
    fi
    new='new bytes from the host, longer than before'
    printf '%s\n' "$new" >"$share/cached"
    want_size=$(stat -c %s "$share/cached") want_md5=$(md5sum <"$share/cached" | cut -d' ' -f1)
    touch "$share/ctl/go-read"
    if wait_line '@@CACHED ' 30; then
        got=$(grep -ao '@@CACHED [^@]*@@' "$logf" | head -n 1 || true)
        if [[ $got == "@@CACHED size=$want_size md5=$want_md5@@" ]]; then ok cached_edit; else
            bad cached_edit "guest read '$got', host has size=$want_size md5=$want_md5"
        fi
    else
        bad cached_edit "the guest never saw ctl/go-read"
    fi
    step host_create "${C}EV CREATE /mnt/w/a 0" sh -c ': >w/a'
    step host_write "${C}EV MODIFY /mnt/w/a " sh -c 'printf hello >>w/a'
    step host_chmod "${C}EV ATTRIB /mnt/w/a " chmod 600 w/a
    step host_rename "${C}EV MOVED_TO /mnt/w/sub/b [1-9]" mv w/a w/sub/b
    step host_delete "${C}EV DELETE /mnt/w/sub/b " rm w/sub/b
    sleep 1
    # Every event line of the watched tree, in order (the guest's own come later).
    seq_got=$(grep -aE "${C}EV " "$logf" | tr -d '\r' | sed -E 's/^\[[^]]*\] //' |
        awk '$3 !~ /^\/mnt\/w\/own/ {print $2, $3}' | paste -sd';' || true)
    seq_want='CREATE /mnt/w/a;MODIFY /mnt/w/a;ATTRIB /mnt/w/a;MOVED_FROM /mnt/w/a;MOVED_TO /mnt/w/sub/b;DELETE /mnt/w/sub/b'
    cookies=$(grep -aE "${C}EV MOVED_(FROM|TO) /mnt/w/(a|sub/b) " "$logf" | tr -d '\r' | awk '{print $NF}' | sort -u || true)
    if [[ $seq_got == "$seq_want" && $cookies =~ ^[1-9][0-9]*$ ]]; then ok host_order; else
        bad host_order "watcher saw '$seq_got' (move cookies: $(echo "$cookies" | paste -sd' '))"
    fi
    touch "$share/ctl/host-done"
else
    bad queue_up "the guest never got ready (vm: $(grep -ao 'FAIL (.*' "$work/err1.txt" | head -n 1))"
fi
wait "$vmpid" || rc=$?
guest_complete guest1 "$work/out1.txt" "$rc"
if grep -aq '@@NOTIFY-DONE@@' "$logf"; then
    own=$(grep -aoE '@@OWN(-ALL)? .*' "$logf" | tr -d '\r' || true)
    n_bad=$(echo "$own" | awk '$1 == "@@OWN" && $2 != 1' | wc -l)
    n_own=$(echo "$own" | grep -c '^@@OWN ' || true)
    all=$(echo "$own" | awk '$1 == "@@OWN-ALL" {print $2}')
    if ((n_bad == 0 && n_own == 6)) && [[ $all == 6 ]]; then ok own_once; else
        bad own_once "$(echo "$own" | paste -sd' ')"
    fi
else
    bad own_once "the guest did not finish (vm rc=$rc, console $logf)"
fi
if ((${#lat[@]})); then
    sorted=$(printf '%s\n' "${lat[@]}" | sort -n)
    med=$(echo "$sorted" | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}')
    log "host change -> guest watcher event (ms, ${#lat[@]} changes): median $med, max $(echo "$sorted" | tail -n 1), bound $bound_ms"
fi

# ---- boot 2: no notification queue ------------------------------------------------------
cat >"$work/guest2.sh" <<'EOF'
echo "@@QUEUE $(dmesg | grep -c 'notification queue')"
echo hello-from-the-guest >/mnt/g && sync
echo "@@READ $(cat /mnt/h)"
ls /mnt | tr '\n' ' ' | sed 's/^/@@LS /'
echo
check guest_no_queue sh -c "! dmesg | grep -q 'notification queue: '"
guest_end
EOF
share2=$work/share2
mkdir -p "$share2"
echo hello-from-the-host >"$share2/h"
logf2="$logs/e2e-notify-off-$(date +%Y%m%d-%H%M%S)-$$.log"
log "boot 2: no notification queue, daxfsd --cache=auto (console $logf2)"
rc=0
scripts/vm.sh "${verbose[@]}" "${daemon[@]}" -p dax --cache auto -s "$share2" --script "$work/guest2.sh" \
    -T 240 -l "$logf2" >"$work/out2.txt" 2>"$work/err2.txt" || rc=$?
guest_complete guest2 "$work/out2.txt" "$rc"
if ((rc == 0)) && [[ $(cat "$share2/g" 2>/dev/null) == hello-from-the-guest ]] &&
    grep -aqE "${C}@@READ hello-from-the-host" "$logf2"; then
    ok no_feature_io
else
    bad no_feature_io "vm rc=$rc, host sees '$(cat "$share2/g" 2>/dev/null)' (console $logf2)"
fi
if grep -aqE "${C}@@QUEUE 0" "$logf2"; then ok no_feature_quiet; else
    bad no_feature_quiet "$(grep -a '@@QUEUE\|notification' "$logf2" | head -n 3 | tr '\n' ' ' || true)"
fi
rig_summary e2e-notify
