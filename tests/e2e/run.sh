#!/usr/bin/env bash
# Run the end-to-end suite: for each QEMU profile, boot the test guest on a
# fresh shared directory, run tests/e2e/guest/suite.sh on the virtio-fs
# mount, then check the results from the host (tests/e2e/host-check.sh).
#
#   tests/e2e/run.sh [options]
#     -d, --daemon D        daxfsd (default), virtiofsd (upstream 1.14.0) or a path
#     -p, --profiles LIST   profiles, space or comma separated (default: "pci mmio")
#     -a, --daemon-arg ARG  extra daemon argument (repeatable)
#         --no-xattr        run the daemon without --xattr (expects ENOTSUP)
#     -o, --mount-opts OPTS guest mount options, e.g. dax=always (profile dax
#                           with daxfsd -a --dax-window=1G)
#     -T, --timeout SEC     per-VM timeout (default: 600)
#         --only LIST       run only these guest checks (comma separated); the
#         --skip LIST       others / these are reported as skipped, and the
#                           host-side checks (which need the full run) are not run
#         --check-timeout S seconds before a hung guest check is killed (default: 90)
#     -v, --verbose         stream the guest consoles
#
# Prints the guest's checks as PROFILE:NAME, ends with "e2e: N passed, M failed" (scripts/lib.sh
# rig_summary) and exits non-zero on any failure, a VM timeout, a suite cut short, or a
# QEMU/daemon process left behind.
set -euo pipefail
RIG_TAG=e2e
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

daemon=daxfsd profiles="pci mmio" xattr=on timeout=600 verbose=() only="" skip="" check_timeout=90 mount_opts=()
daemon_args=()
while (($#)); do
    case $1 in
        -d|--daemon) (($# >= 2)) || die "$1 needs a value"; daemon=$2; shift 2 ;;
        -p|--profiles) (($# >= 2)) || die "$1 needs a value"; profiles=${2//,/ }; shift 2 ;;
        -a|--daemon-arg) (($# >= 2)) || die "$1 needs a value"; daemon_args+=(-a "$2"); shift 2 ;;
        --no-xattr) xattr=off; shift ;;
        -o|--mount-opts) (($# >= 2)) || die "$1 needs a value"; mount_opts=(-o "$2"); shift 2 ;;
        -T|--timeout) (($# >= 2)) || die "$1 needs a value"; timeout=$2; shift 2 ;;
        -v|--verbose) verbose=(-v); shift ;;
        --only) (($# >= 2)) || die "$1 needs a value"; only=$2; shift 2 ;;
        --skip) (($# >= 2)) || die "$1 needs a value"; skip=$2; shift 2 ;;
        --check-timeout) (($# >= 2)) || die "$1 needs a value"; check_timeout=$2; shift 2 ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
[[ -n ${profiles// /} ]] || die "no profiles given"
[[ $xattr == on ]] && daemon_args+=(-a --xattr)
[[ $only$skip =~ ^[a-z0-9_,]*$ ]] || die "--only/--skip take check names separated by commas"
[[ $check_timeout =~ ^[1-9][0-9]*$ ]] || die "--check-timeout must be a positive number of seconds"
guest_args="daxfsd.xattr=$xattr daxfsd.check_timeout=$check_timeout${only:+ daxfsd.only=$only}${skip:+ daxfsd.skip=$skip}"
# Checks upstream virtiofsd fails, each for a reason of its own; its run expects them to fail
# (a pass there says the list is out of date), which also proves each check can fail:
#   busy_text  it asks for FUSE_ATOMIC_O_TRUNC, so an O_RDONLY|O_TRUNC open of a running
#              program empties the host file before Linux refuses the open with ETXTBSY
[[ $daemon != virtiofsd ]] || guest_args+=" daxfsd.expect_fail=busy_text"
# Negative control (lib.sh): the guest suite stops after that many checks.
[[ -z ${RIG_SUBSUITE_DIE_AFTER:-} ]] || guest_args+=" daxfsd.die_after=$RIG_SUBSUITE_DIE_AFTER"

# Prerequisites: each step is cached and quick when already done.
"$RIG_ROOT/guest-kernel/build.sh" >/dev/null
"$RIG_ROOT/scripts/build-initramfs.sh" >/dev/null
needs11=0
for p in $profiles; do
    [[ -r $RIG_ROOT/qemu-config/$p.sh ]] || die "unknown profile '$p'"
    grep -q '^PROFILE_QEMU=11' "$RIG_ROOT/qemu-config/$p.sh" && needs11=1
done
if ((needs11)); then "$RIG_ROOT/scripts/provision-qemu.sh" all; else "$RIG_ROOT/scripts/provision-qemu.sh" system; fi
[[ $daemon == virtiofsd ]] && "$RIG_ROOT/scripts/provision-virtiofsd.sh" >/dev/null

# Everything of this run (shares, sockets) lives below one private directory,
# which also lets the final check find any process left behind.
run_dir=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-e2e.XXXXXX")
RIG_CLEANUP+=("rm -rf -- $(printf %q "$run_dir")")

t0=$SECONDS
for p in $profiles; do
    share=$run_dir/share-$p
    mkdir -p "$share"
    log "profile $p: guest suite (daemon $daemon, xattr $xattr${mount_opts[1]:+, -o ${mount_opts[1]}})"
    out=$run_dir/guest-$p.txt
    pt0=$SECONDS p0=$RIG_PASS f0=$RIG_FAIL s0=$RIG_SKIP
    TMPDIR=$run_dir "$RIG_ROOT/scripts/vm.sh" -p "$p" -d "$daemon" "${daemon_args[@]}" \
        -s "$share" "${mount_opts[@]}" -t e2e -T "$timeout" --append "$guest_args" "${verbose[@]}" >"$out" && vm_rc=0 || vm_rc=$?
    grep -av '^CHECK ' "$out" | sed 's/^/  /' || true
    # The guest's checks as this run's (PROFILE:NAME). The suite's last line counts what it
    # ran: a suite that died part way has none, one whose lines were lost counts differently,
    # and a VM that failed (timeout, crash) with no failed check fails too: PROFILE/incomplete.
    import_checks "$p" "$out" "$vm_rc" e2e "$p:"
    if [[ -n $only$skip ]]; then
        log "profile $p: host-side checks not run (partial run: --only/--skip)"
    elif grep -q '^E2E RESULT ' "$out"; then
        log "profile $p: host-side checks"
        hout=$run_dir/host-$p.txt
        hrc=0
        RIG_DIE_AFTER_CHECKS=${RIG_SUBSUITE_DIE_AFTER:-} "$RIG_ROOT/tests/e2e/host-check.sh" "$share" "$xattr" >"$hout" 2>&1 || hrc=$?
        import_checks "$p:host-check" "$hout" "$hrc" suite "$p:"
    fi
    log "profile $p: $((RIG_PASS - p0)) passed, $((RIG_FAIL - f0)) failed, $((RIG_SKIP - s0)) skipped in $((SECONDS - pt0))s"
done

# No QEMU or daemon of this run may survive it.
sleep 0.2
if left=$(pgrep -a -f -- "$run_dir"); then
    log "FAIL: processes left behind:"
    printf '%s\n' "$left" >&2
    # They are this run's own: stop them.
    for pid in $(pgrep -f -- "$run_dir"); do kill -KILL "$pid" 2>/dev/null || true; done
    bad leftover-processes "$(printf '%s\n' "$left" | head -n 3 | tr '\n' '|')"
fi

log "done in $((SECONDS - t0))s"
rig_summary e2e
