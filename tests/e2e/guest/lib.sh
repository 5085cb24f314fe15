#!/bin/sh
# shellcheck disable=SC2034 # rc is the guest script's
# Helpers for the guest scripts of the e2e runners (busybox sh). scripts/vm.sh puts this file
# in front of every guest --script/--cmd it sends (scripts/lib.sh guest_helpers), after a line
# that sets GUEST_DIE_AFTER (the negative control, from RIG_SUBSUITE_DIE_AFTER); it is not
# in the initramfs. A guest script with checks ends with guest_end, and its runner reads the
# output with guest_complete (scripts/lib.sh), which fails the run when the end line is missing
# or its counts disagree with the lines printed.
#   ok NAME             `GUEST PASS NAME`
#   bad NAME [DETAIL]   `GUEST FAIL NAME: DETAIL`, rc=1
#   skip NAME [WHY]     `GUEST SKIP NAME: WHY` (counted apart; not a check)
#   check NAME CMD...   run CMD: ok NAME, or bad NAME CMD (status 1)
#   waitfor FILE [S]    wait up to S seconds (default 180) for FILE; status 0 when it exists
#   md5 [FILE...]       the bare MD5 digest
#   guest_end           `GUEST END pass=N fail=M[ skip=K]`, then exit with rc
rc=0 guest_pass=0 guest_fail=0 guest_skip=0
ok() {
    echo "GUEST PASS $1"
    guest_pass=$((guest_pass + 1))
    guest_after_check
}
bad() {
    echo "GUEST FAIL $1: ${2:-failed}"
    guest_fail=$((guest_fail + 1)) rc=1
    guest_after_check
}
skip() {
    echo "GUEST SKIP $1: ${2:-skipped}"
    guest_skip=$((guest_skip + 1))
}
# The negative control: exit (status 97, no GUEST END) after GUEST_DIE_AFTER checks.
guest_after_check() {
    if [ -n "${GUEST_DIE_AFTER:-}" ] && [ $((guest_pass + guest_fail)) -ge "$GUEST_DIE_AFTER" ]; then
        echo "guest: negative control: exiting after $GUEST_DIE_AFTER check(s)"
        exit 97
    fi
}
check() {
    _gn=$1
    shift
    if "$@"; then ok "$_gn"; return 0; fi
    bad "$_gn" "$*"
    return 1
}
waitfor() {
    _gi=0 _gmax=$((${2:-180} * 5))
    while [ ! -e "$1" ] && [ $_gi -lt $_gmax ]; do
        sleep 0.2
        _gi=$((_gi + 1))
    done
    [ -e "$1" ]
}
md5() { md5sum "$@" | cut -d' ' -f1; }
guest_end() {
    if [ "$guest_skip" -gt 0 ]; then
        echo "GUEST END pass=$guest_pass fail=$guest_fail skip=$guest_skip"
    else
        echo "GUEST END pass=$guest_pass fail=$guest_fail"
    fi
    exit $rc
}
