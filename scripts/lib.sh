# shellcheck shell=bash disable=SC2034 # RIG_* are for the scripts that source this
# Shared helpers for the daxfsd VM rig. Source it; do not execute it.
#   RIG_TAG   prefix of every message (set by the sourcing script)

RIG_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DAXFSD_CACHE="${DAXFSD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/daxfsd}"
RIG_T0=$SECONDS

# One progress line, with seconds since the script started.
log() { printf '[%s %4ds] %s\n' "${RIG_TAG:-rig}" "$((SECONDS - RIG_T0))" "$*" >&2; }
die() { printf '%s: error: %s\n' "${RIG_TAG:-rig}" "$*" >&2; exit 1; }

# need_cmd CMD [package]: fail with a one-line fix when CMD is missing.
need_cmd() {
    command -v "$1" >/dev/null 2>&1 && return 0
    die "'$1' not found; install it with 'make vm-deps' (scripts/provision-deps.sh${2:+, package $2})"
}

# Hash of file contents and base names (order as given). Prints 16 hex digits.
hash_inputs() {
    local f
    for f in "$@"; do
        printf '%s\0' "${f##*/}"
        cat -- "$f"
        printf '\0'
    done | sha256sum | cut -c1-16
}

# Installed version of a Debian package, or empty.
deb_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true; }

# Run a long command with its output in LOGFILE; on failure show the tail.
# The command runs in its own process group (RIG_CHILD) and is waited for in
# the background, so INT/TERM act at once and rig_exit stops the whole group.
RIG_CHILD=""
run_logged() {
    local logfile=$1 rc=0
    shift
    mkdir -p -- "$(dirname -- "$logfile")"
    setsid "$@" </dev/null >>"$logfile" 2>&1 &
    RIG_CHILD=$!
    wait "$RIG_CHILD" || rc=$?
    RIG_CHILD=""
    if ((rc != 0)); then
        printf '%s: command failed (status %d): %s\n--- last 40 lines of %s ---\n' \
            "${RIG_TAG:-rig}" "$rc" "$*" "$logfile" >&2
        tail -n 40 "$logfile" >&2
        return 1
    fi
}

rig_stop_child() {
    local pid=$RIG_CHILD
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.25
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    RIG_CHILD=""
}

# Exit handling for every script that sources this file: stop a running
# run_logged child, then run the RIG_CLEANUP commands (eval'd strings).
RIG_CLEANUP=()
rig_exit() {
    local rc=$? c
    trap - EXIT INT TERM
    rig_stop_child
    for c in "${RIG_CLEANUP[@]}"; do eval "$c" || true; done
    exit "$rc"
}
trap rig_exit EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM

# The primary Debian archive URI from this machine's apt configuration
# (deb822 .sources files or one-line sources.list), never a built-in host.
apt_mirror_uri() {
    local f uri="" suites="" line key val
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -r $f ]] || continue
        uri="" suites=""
        while IFS= read -r line || [[ -n $line ]]; do
            if [[ -z ${line//[[:space:]]/} ]]; then
                if [[ -n $uri && " $suites " =~ \ [a-z]+\  && $uri != *security* ]]; then
                    printf '%s\n' "${uri%/}"; return 0
                fi
                uri="" suites=""; continue
            fi
            [[ $line == \#* ]] && continue
            key=${line%%:*}; val=${line#*:}; val=${val#"${val%%[![:space:]]*}"}
            case ${key,,} in
                uris) uri=${val%% *} ;;
                suites) suites=$val ;;
            esac
        done <"$f"
        if [[ -n $uri && " $suites " =~ \ [a-z]+\  && $uri != *security* ]]; then
            printf '%s\n' "${uri%/}"; return 0
        fi
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -r $f ]] || continue
        # deb [opts] URI SUITE COMPONENTS...: first non-security, non-updates suite.
        uri=$(awk '$1=="deb" { i=2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                  if ($(i+1) !~ /-(security|updates|backports)/ && $i !~ /security/) { print $i; exit } }' "$f")
        if [[ -n $uri ]]; then printf '%s\n' "${uri%/}"; return 0; fi
    done
    return 1
}

# apt-get that waits for a lock held by another apt/dpkg instead of failing.
apt_get() {
    local tries=0
    while :; do
        if DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 "$@"; then
            return 0
        fi
        tries=$((tries + 1))
        # apt-get update has no lock timeout on old apt: retry while locked.
        if ((tries < 60)) && pgrep -x 'apt-get|apt|dpkg|unattended-upgr' >/dev/null 2>&1; then
            log "apt is busy (another apt/dpkg runs); waiting"
            sleep 10
            continue
        fi
        return 1
    done
}

# tree_snapshot DIR...: one line per entry below each DIR (path, mode, owner, size, mtime,
# ctime, content hash, xattr names), for the escape checks' before/after comparisons.
tree_snapshot() {
    python3 - "$@" <<'PY'
import hashlib, os, sys
for root in sys.argv[1:]:
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for n in sorted(dirs + files):
            p = os.path.join(d, n)
            st = os.lstat(p)
            h = ""
            if os.path.isfile(p) and not os.path.islink(p):
                h = hashlib.sha256(open(p, "rb").read()).hexdigest()
            try:
                x = sorted(os.listxattr(p, follow_symlinks=False))
            except OSError:
                x = []
            print(p, oct(st.st_mode), st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_ctime_ns, h, x)
PY
}

# --- Checks and summaries, one set for every test script -------------------------------
# Each check prints one line, `CHECK PASS NAME`, `CHECK FAIL NAME: DETAIL` or `CHECK SKIP NAME`;
# rig_summary prints `LABEL: N passed, M failed[, K skipped]` and the end marker
# `SUITE END LABEL pass=N fail=M[ skip=K]`, and returns non-zero when a check failed. A runner
# starts its sub-suites with run_subsuite (a script of this rig), or reads one that ran
# elsewhere with import_checks (the guest suite, a host-mount suite) or guest_complete (a
# guest script of tests/e2e/guest/lib.sh); each fails the run when the sub-suite ends without
# its end marker (it died part way), prints other counts than its marker says, or exits
# non-zero without a failed check.
#
# Negative controls: RIG_DIE_AFTER_CHECKS=N makes a script exit (status 97, no summary) right
# after its N-th check. RIG_SUBSUITE_DIE_AFTER=N on a runner does that to every sub-suite it
# starts (host scripts, guest scripts through scripts/vm.sh, the guest suite); the run must
# then fail, and it stops at the first sub-suite found cut short (tests/rig-selftest.sh shows
# it does, for each runner).
#
# RIG_PEER=1 while a peer (another daemon, another file system) is checked: its results print
# as `PEER PASS|FAIL`, are counted apart and do not fail the run.
RIG_PASS=0 RIG_FAIL=0 RIG_SKIP=0 RIG_FAILED=() RIG_PEER=0 RIG_PEER_PASS=0 RIG_PEER_FAIL=0 RIG_PEER_FAILED=()
RIG_LABEL=""
rig_after_check() {
    local n=${RIG_DIE_AFTER_CHECKS:-}
    [[ -n $n ]] && ((RIG_PASS + RIG_FAIL >= n)) || return 0
    printf '%s: negative control: exiting after %d check(s)\n' "${RIG_TAG:-rig}" "$n" >&2
    exit 97
}
ok() {
    if ((RIG_PEER)); then RIG_PEER_PASS=$((RIG_PEER_PASS + 1)); printf 'PEER PASS %s\n' "$1"; return 0; fi
    RIG_PASS=$((RIG_PASS + 1)); printf 'CHECK PASS %s\n' "$1"; rig_after_check
}
bad() {
    if ((RIG_PEER)); then
        RIG_PEER_FAIL=$((RIG_PEER_FAIL + 1)) RIG_PEER_FAILED+=("$1")
        printf 'PEER FAIL %s: %s\n' "$1" "${2:-failed}"
        return 0
    fi
    RIG_FAIL=$((RIG_FAIL + 1)) RIG_FAILED+=("$1")
    printf 'CHECK FAIL %s: %s\n' "$1" "${2:-failed}"
    rig_after_check
    # Under the negative control a sub-suite cut short is what the run had to find: stop here.
    if [[ -n ${RIG_SUBSUITE_DIE_AFTER:-} && $1 == *incomplete ]]; then
        log "negative control: a sub-suite was cut short ($1); stopping the run"
        rig_summary "${RIG_LABEL:-${RIG_TAG:-rig}}"
        exit 1
    fi
}
skipped() { RIG_SKIP=$((RIG_SKIP + 1)); printf 'CHECK SKIP %s\n' "$1"; }
# check NAME STATUS [DETAIL]: PASS when STATUS is 0.
check() { if (($2 == 0)); then ok "$1"; else bad "$1" "${3:-status $2}"; fi; }
# check_run NAME CMD...: run CMD (a function may die); PASS when it exits 0, else FAIL with
# the last three lines it printed.
check_run() {
    local name=$1 out rc=0
    shift
    out=$("$@" 2>&1) || rc=$?
    if ((rc == 0)); then ok "$name"; else bad "$name" "$(printf '%s\n' "$out" | tail -n 3 | tr '\n' '|')"; fi
}
# md5 FILE...: the bare MD5 digest (of stdin without FILE).
md5() { md5sum "$@" | cut -d' ' -f1; }
# rig_summary LABEL: the summary line and the end marker; status 1 when any check failed.
rig_summary() {
    ((${#RIG_FAILED[@]} == 0)) || log "failed: ${RIG_FAILED[*]}"
    if ((RIG_PEER_PASS + RIG_PEER_FAIL)); then
        printf 'peer: %d passed, %d failed%s\n' "$RIG_PEER_PASS" "$RIG_PEER_FAIL" \
            "${RIG_PEER_FAILED[*]:+ (${RIG_PEER_FAILED[*]})}"
    fi
    if ((RIG_SKIP)); then
        echo "$1: $RIG_PASS passed, $RIG_FAIL failed, $RIG_SKIP skipped"
        echo "SUITE END $1 pass=$RIG_PASS fail=$RIG_FAIL skip=$RIG_SKIP"
    else
        echo "$1: $RIG_PASS passed, $RIG_FAIL failed"
        echo "SUITE END $1 pass=$RIG_PASS fail=$RIG_FAIL"
    fi
    ((RIG_FAIL == 0))
}
# subsuite_end NAME OUT STATUS [MIN] [MARKER] [DETAIL]: after a sub-suite ran (stdout in OUT, exit
# STATUS), one failed check NAME/incomplete when it ended without its end marker, its marker
# disagrees with the CHECK (or GUEST) lines it printed, it exited non-zero with no failed
# check, or it ran fewer than MIN checks. MARKER is the marker's kind: suite (`SUITE END ...
# pass=N fail=M[ skip=K]`, default), e2e (the guest suite's `E2E RESULT passed=N failed=M
# skipped=K`) or guest (a guest script's `GUEST END pass=N fail=M[ skip=K]`). DETAIL ends the
# message.
subsuite_end() {
    local name=$1 out=$2 rc=$3 min=${4:-0} kind=${5:-suite} extra=${6:-} word=CHECK p f s end why=""
    [[ $kind == guest ]] && word=GUEST
    p=$(grep -ac "^$word PASS " "$out" || true)
    f=$(grep -ac "^$word FAIL " "$out" || true)
    s=$(grep -ac "^$word SKIP " "$out" || true)
    case $kind in
        suite) end=$(sed -n 's/^SUITE END .* pass=\([0-9]*\) fail=\([0-9]*\)\( skip=\([0-9]*\)\)\{0,1\}$/\1 \2 \4/p' "$out" | tail -n 1) ;;
        e2e) end=$(sed -n 's/^E2E RESULT passed=\([0-9]*\) failed=\([0-9]*\) skipped=\([0-9]*\).*/\1 \2 \3/p' "$out" | tail -n 1) ;;
        guest) end=$(sed -n 's/^GUEST END pass=\([0-9]*\) fail=\([0-9]*\)\( skip=\([0-9]*\)\)\{0,1\}$/\1 \2 \4/p' "$out" | tail -n 1) ;;
        *) die "subsuite_end: unknown marker kind '$kind'" ;;
    esac
    # An absent skip count is zero.
    [[ -z $end || $end == *[0-9] ]] || end+=0
    if [[ -z $end ]]; then
        why="ended without its end marker after $((p + f + s)) check(s) (status $rc)"
    elif [[ $end != "$p $f $s" ]]; then
        why="its end marker says pass/fail/skip $end, it printed $p $f $s"
    elif ((rc != 0 && f == 0)); then
        why="exited with status $rc and no failed check"
    elif ((p + f < min)); then
        why="ran $((p + f)) checks, fewer than the $min it must"
    fi
    [[ -z $why ]] || bad "$name/incomplete" "$why${extra:+; $extra}"
}
# run_subsuite NAME OUT [MIN] -- COMMAND...: run a sub-suite of this rig with its stdout in
# OUT (stderr in OUT.log), show its CHECK lines and count them into this script's totals,
# then subsuite_end (NAME/incomplete; the detail adds the last lines of OUT.log).
run_subsuite() {
    local name=$1 out=$2 min=0 rc=0 p f names
    shift 2
    if [[ $1 != -- ]]; then min=$1; shift; fi
    [[ $1 == -- ]] || die "run_subsuite: usage: NAME OUT [MIN] -- COMMAND..."
    shift
    RIG_DIE_AFTER_CHECKS=${RIG_SUBSUITE_DIE_AFTER:-} "$@" >"$out" 2>"$out.log" || rc=$?
    grep -E '^(CHECK|PEER) ' "$out" || true
    p=$(grep -c '^CHECK PASS ' "$out" || true)
    f=$(grep -c '^CHECK FAIL ' "$out" || true)
    RIG_PASS=$((RIG_PASS + p)) RIG_FAIL=$((RIG_FAIL + f)) RIG_SKIP=$((RIG_SKIP + $(grep -c '^CHECK SKIP ' "$out" || true)))
    mapfile -t names < <(sed -n 's/^CHECK FAIL \([^:]*\):.*/\1/p' "$out")
    RIG_FAILED+=("${names[@]}")
    subsuite_end "$name" "$out" "$rc" "$min" suite "last lines of $out.log: $(tail -n 5 "$out.log" | tr '\n' ' ')"
}
# import_checks NAME OUT STATUS MARKER [PREFIX]: the CHECK lines (GUEST lines with MARKER
# guest) of a sub-suite that ran elsewhere (the guest suite in a VM or on a host mount,
# host-check.sh, a guest script), each one of this script's checks with PREFIX before its
# name, then subsuite_end NAME OUT STATUS 0 MARKER.
import_checks() {
    local name=$1 out=$2 rc=$3 kind=$4 pre=${5:-} w=CHECK line
    [[ $kind == guest ]] && w=GUEST
    while IFS= read -r line; do
        line=${line#"$w "}
        case $line in
            "PASS "*) ok "$pre${line#PASS }" ;;
            "FAIL "*) line=${line#FAIL }; bad "$pre${line%%: *}" "${line#*: }" ;;
            "SKIP "*) skipped "$pre${line#SKIP }" ;;
        esac
    done < <(grep -aE "^$w (PASS|FAIL|SKIP) " "$out")
    subsuite_end "$name" "$out" "$rc" 0 "$kind"
}

# --- Guest scripts (tests/e2e/guest/lib.sh) ---------------------------------------------
# guest_helpers: the text scripts/vm.sh puts in front of a guest command: the negative
# control's count, then the guest helpers.
guest_helpers() {
    printf '# tests/e2e/guest/lib.sh, put here by the rig (scripts/lib.sh guest_helpers)\n'
    printf 'GUEST_DIE_AFTER=%s\n' "${RIG_SUBSUITE_DIE_AFTER:-}"
    cat -- "$RIG_ROOT/tests/e2e/guest/lib.sh"
    printf '# ---- the guest command ----\n'
}
# guest_complete NAME OUT [STATUS]: show the GUEST lines of a guest script's output OUT; it
# must end with guest_end's `GUEST END` line and agree with it (subsuite_end, marker guest;
# with STATUS, also a non-zero status without a failed check is NAME/incomplete).
guest_complete() {
    grep -aE '^GUEST (PASS|FAIL|SKIP)' "$2" || true
    subsuite_end "$1" "$2" "${3:-0}" 0 guest
}
