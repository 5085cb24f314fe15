#!/usr/bin/env bash
# Negative controls for the test rig itself: a green `make test` must mean every sub-suite
# ran to its end. For lib.sh's run_subsuite and for each runner that starts sub-suites, a
# sub-suite made to die after its first check (RIG_SUBSUITE_DIE_AFTER, see scripts/lib.sh)
# must fail the run:
#   lib        run_subsuite with fake sub-suites: died part way, exited 0 without its
#              summary, counts that disagree, too few checks, a complete one (must pass)
#   launchers  tests/launchers/run.sh --only vng,libvirt (libvirt.sh, vng.sh died)
#   e2e        tests/e2e/run.sh -p pci (the guest suite died: no E2E RESULT line)
#   host       tests/host/run.sh -t devfuse (the suite on a /dev/fuse mount died)
#
#   tests/rig-selftest.sh [--only lib,launchers,e2e,host]
set -euo pipefail
RIG_TAG=rig-selftest
# shellcheck source=../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
cd "$RIG_ROOT"

only="lib launchers e2e host"
while (($#)); do
    case $1 in
        --only) (($# >= 2)) || die "--only needs a value"; only=${2//,/ }; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
            ;;
        launchers)
            [[ -x $daxfsd ]] || die "no $daxfsd; run 'make build'"
            runner_case launchers-vng env DAXFSD="$daxfsd" tests/launchers/run.sh --only vng --daemons daxfsd
            runner_case launchers-libvirt env DAXFSD="$daxfsd" tests/launchers/run.sh --only libvirt --daemons daxfsd
            ;;
        e2e)
            runner_case e2e tests/e2e/run.sh -d "$daxfsd" -p pci ;;
        host)
            runner_case host tests/host/run.sh -d "$daxfsd" -t devfuse ;;
        *) die "unknown part '$part' (lib, launchers, e2e, host)" ;;
    esac
done
rig_summary rig-selftest
