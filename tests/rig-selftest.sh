#!/usr/bin/env bash
# Negative controls for the test rig itself: a green `make test` must mean every sub-suite
# ran to its end. For lib.sh's helpers and for every runner, a sub-suite made to die after
# its first check (RIG_SUBSUITE_DIE_AFTER, see scripts/lib.sh) must fail the run:
#   lib        run_subsuite, import_checks and guest_complete with fake sub-suites (died part
#              way, exited 0 without its end marker, counts that disagree, too few checks, a
#              complete one, which must pass), and the guest helpers (tests/e2e/guest/lib.sh)
#              under sh, with and without GUEST_DIE_AFTER
#   launchers  tests/launchers/run.sh --only vng,libvirt (libvirt.sh, vng.sh died)
#   lima       tests/launchers/lima.sh (its guest command died)
#   e2e        tests/e2e/run.sh -p pci (the guest suite died: no E2E RESULT line)
#   host       tests/host/run.sh -t devfuse (the suite on a /dev/fuse mount died)
#   io-uring   tests/host/io-uring.sh (tests/host/run.sh -t io-uring died)
#   pjdfstest  tests/host/pjdfstest.sh -t guest (its guest script died)
#   acl fhandles never dax dax-buffers dax-host dax-full lifecycle escape migrate soak notify
#   notify-burst (tests/e2e/notify.sh --boots 3: its third guest script), restart
#   (tests/e2e/restart.sh --kills 1)
#   fstests    tests/fstests/test.sh on one test (its guest program, guest.sh with the guest
#              helpers, died after its first check: no GUEST END line)
#              tests/e2e/NAME.sh, the cheapest options that reach a guest script (its first
#              guest script died: no GUEST END line)
# Each runner stops at the first sub-suite it finds cut short, so a case costs one boot.
# tests/e2e/README.md says what a new runner must do to be covered here.
#
# --per-kind (`make test-rig`, part of `make test`): lib, and the cheapest runner for each
# kind of sub-suite lib.sh reads: io-uring (run_subsuite of a script of this rig), host
# (import_checks suite: the suite on a mount), e2e (import_checks e2e: the guest suite's
# `E2E RESULT`), migrate (import_checks guest: a guest command the runner packs with
# guest_helpers itself) and notify (guest_complete: a vm.sh guest script). About 25 s instead
# of about 5 min: lima alone took 205 s of 318. Without it, the full set, each runner's own
# wiring (`make test-rig-all`).
#
#   tests/rig-selftest.sh [--per-kind | --only lib,launchers,e2e,...]
set -euo pipefail
RIG_TAG=rig-selftest
# shellcheck source=../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
cd "$RIG_ROOT"

all="lib launchers lima e2e host io-uring pjdfstest acl fhandles never dax dax-buffers dax-host dax-full lifecycle escape migrate soak notify notify-burst restart fstests"
per_kind="lib io-uring host e2e migrate notify"
only=$all
while (($#)); do
    case $1 in
        --only) (($# >= 2)) || die "--only needs a value"; only=${2//,/ }; shift 2 ;;
        --per-kind) only=$per_kind; shift ;;
        -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
work=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-rig-selftest.XXXXXX")
RIG_CLEANUP+=("rm -rf -- $(printf %q "$work")")

# lib_case NAME WANT(pass|fail) MIN SCRIPT: run_subsuite on a fake sub-suite, in a subshell
# with its own totals; the fake's body is SCRIPT (bash, with lib.sh sourced).
lib_case() {
    local name=$1 want=$2 min=$3 body=$4 got
    printf '%s\n' "#!/usr/bin/env bash" "source $(printf %q "$RIG_ROOT/scripts/lib.sh")" "$body" >"$work/fake-$name.sh"
    chmod +x "$work/fake-$name.sh"
    if (RIG_PASS=0 RIG_FAIL=0 RIG_FAILED=()
        run_subsuite "fake-$name" "$work/fake-$name.out" "$min" -- "$work/fake-$name.sh" >"$work/lib-$name.txt"
        ((RIG_FAIL == 0))); then got=pass; else got=fail; fi
    [[ $got == "$want" ]] && s=0 || s=1
    check "lib: $name -> run $want" "$s" "got $got: $(grep 'incomplete' "$work/lib-$name.txt" | head -n 1)"
}

# import_case NAME WANT KIND STATUS TEXT: import_checks on an output TEXT (printf %b).
import_case() {
    local name=$1 want=$2 kind=$3 st=$4 got
    printf '%b' "$5" >"$work/import-$name.out"
    if (RIG_PASS=0 RIG_FAIL=0 RIG_FAILED=()
        import_checks "import-$name" "$work/import-$name.out" "$st" "$kind" x: >"$work/import-$name.txt"
        ((RIG_FAIL == 0))); then got=pass; else got=fail; fi
    [[ $got == "$want" ]] && s=0 || s=1
    check "lib: import $name -> run $want" "$s" "got $got: $(grep 'incomplete' "$work/import-$name.txt" | head -n 1)"
}

# guest_case NAME WANT DIE_AFTER BODY: a guest script (guest_helpers, then BODY) run by sh on
# the host; guest_complete on its output.
guest_case() {
    local name=$1 want=$2 got rc=0
    { RIG_SUBSUITE_DIE_AFTER=$3 guest_helpers; printf '%s\n' "$4"; } >"$work/guest-$name.sh"
    sh "$work/guest-$name.sh" >"$work/guest-$name.out" 2>&1 || rc=$?
    if (RIG_PASS=0 RIG_FAIL=0 RIG_FAILED=()
        guest_complete "guest-$name" "$work/guest-$name.out" "$rc" >"$work/guest-$name.txt"
        ((RIG_FAIL == 0))); then got=pass; else got=fail; fi
    [[ $got == "$want" ]] && s=0 || s=1
    check "lib: guest $name -> run $want" "$s" "got $got (status $rc): $(tail -n 2 "$work/guest-$name.txt" | tr '\n' ' ')"
}

# runner_case NAME COMMAND...: with RIG_SUBSUITE_DIE_AFTER=1 the runner must exit non-zero
# and name the cut-short sub-suite as incomplete.
runner_case() {
    local name=$1 rc=0
    shift
    log "$name: $* (sub-suites die after their first check)"
    RIG_SUBSUITE_DIE_AFTER=1 "$@" >"$work/$name.out" 2>"$work/$name.log" || rc=$?
    if ((rc != 0)) && grep -q 'incomplete' "$work/$name.out"; then
        ok "$name: a sub-suite that dies after one check fails the run (status $rc; $(grep -m1 -o '[^ ]*incomplete[^;]*' "$work/$name.out"))"
    else
        bad "$name: a sub-suite that dies after one check fails the run" \
            "status $rc; $(tail -n 4 "$work/$name.out" "$work/$name.log" | tr '\n' ' ')"
    fi
}

daxfsd=$RIG_ROOT/target/debug/daxfsd
for part in $only; do
    case $part in
        lib)
            lib_case complete pass 2 'ok one; ok two; rig_summary fake'
            lib_case complete-with-failure fail 2 'ok one; bad two x; rig_summary fake'
            lib_case died-after-first fail 0 'ok one; exit 3; ok two; rig_summary fake'
            lib_case exit-0-no-summary fail 0 'ok one; exit 0'
            lib_case counts-disagree fail 0 'ok one; echo "SUITE END fake pass=2 fail=0"'
            lib_case too-few-checks fail 3 'ok one; ok two; rig_summary fake'
            lib_case failed-without-check fail 0 'ok one; rig_summary fake; exit 1'
            lib_case negative-control fail 0 'RIG_DIE_AFTER_CHECKS=1; ok one; ok two; rig_summary fake'
            lib_case skips-counted pass 1 'ok one; skipped two; rig_summary fake'
            import_case e2e-complete pass e2e 0 'CHECK PASS a (1s)\nCHECK SKIP b\nE2E RESULT passed=1 failed=0 skipped=1\n'
            import_case e2e-died fail e2e 97 'CHECK PASS a (1s)\nE2E: negative control\n'
            import_case e2e-lost-line fail e2e 0 'CHECK PASS a\nE2E RESULT passed=2 failed=0 skipped=0\n'
            import_case vm-failed fail e2e 124 'CHECK PASS a\nE2E RESULT passed=1 failed=0 skipped=0\n'
            import_case suite-complete pass suite 0 'CHECK PASS host:a\nSUITE END h pass=1 fail=0\n'
            import_case suite-died fail suite 97 'CHECK PASS host:a\n'
            import_case guest-complete pass guest 0 'GUEST PASS a\nGUEST END pass=1 fail=0\n'
            # shellcheck disable=SC2016 # expanded by the guest script
            guest_case complete pass "" 'check one true; waitfor /; check two [ "$(echo x | md5)" = 401b30e3b8b5d629635a5c613cdb7919 ]; guest_end'
            guest_case complete-with-failure pass "" 'check one true; check two false && exit 3; guest_end'
            guest_case die-after-first fail 1 'check one true; check two true; guest_end'
            guest_case skips-counted pass "" 'check one true; skip two "not here"; guest_end'
            guest_case skip-lost fail "" 'check one true; skip two; echo "GUEST END pass=1 fail=0"'
            guest_case no-end fail "" 'check one true'
            guest_case exit-0-early fail "" 'ok one; exit 0; guest_end'
            ;;
        launchers)
            [[ -x $daxfsd ]] || die "no $daxfsd; run 'make build'"
            runner_case launchers-vng env DAXFSD="$daxfsd" tests/launchers/run.sh --only vng --daemons daxfsd
            runner_case launchers-libvirt env DAXFSD="$daxfsd" tests/launchers/run.sh --only libvirt --daemons daxfsd
            ;;
        lima) runner_case lima tests/launchers/lima.sh ;;
        e2e) runner_case e2e tests/e2e/run.sh -d "$daxfsd" -p pci ;;
        host) runner_case host tests/host/run.sh -d "$daxfsd" -t devfuse ;;
        io-uring) runner_case io-uring tests/host/io-uring.sh "$daxfsd" ;;
        pjdfstest) runner_case pjdfstest tests/host/pjdfstest.sh -d "$daxfsd" -t guest ;;
        acl|escape) runner_case "$part" "tests/e2e/$part.sh" ;;
        fhandles) runner_case fhandles tests/e2e/fhandles.sh ;;
        never) runner_case never tests/e2e/never.sh ;;
        dax) runner_case dax tests/e2e/dax.sh ;;
        dax-buffers) runner_case dax-buffers tests/e2e/dax-buffers.sh --mode pooled ;;
        dax-host) runner_case dax-host tests/e2e/dax-host.sh --cache never ;;
        dax-full) runner_case dax-full tests/e2e/dax-full.sh --fs tmpfs --mapping pooled --case full ;;
        lifecycle) runner_case lifecycle tests/e2e/lifecycle.sh --only pause-pci-daxfsd ;;
        restart) runner_case restart tests/e2e/restart.sh --kills 1 ;;
        migrate) runner_case migrate tests/e2e/migrate.sh -m find-paths ;;
        soak) runner_case soak tests/e2e/soak.sh --seconds 5 --pause-every 0 ;;
        notify) runner_case notify tests/e2e/notify.sh -d "$daxfsd" ;;
        fstests)
            printf 'generic/184\n' >"$work/fstests.list"
            runner_case fstests tests/fstests/test.sh --no-control -f "$work/fstests.list" --out "$work/fstests" ;;
        notify-burst) runner_case notify-burst tests/e2e/notify.sh -d "$daxfsd" --boots 3 --burst 1000 ;;
        *) die "unknown part '$part' ($all)" ;;
    esac
done
rig_summary rig-selftest
