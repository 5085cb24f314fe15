# shellcheck shell=bash
# Verdicts and tables over the result lines of tests/fstests/run.sh. Sourced by test.sh and
# conformance.sh after scripts/lib.sh (ok, bad, log).

# accepted_reason TEST CONFIG FILE: the reason FILE gives for TEST failing in CONFIG (lines
# "TEST CONFIG[,CONFIG...]|* REASON"), or nothing.
accepted_reason() {
    local t c r
    [[ -r $3 ]] || return 0
    while read -r t c r; do
        [[ $t == "$1" ]] || continue
        if [[ $c == '*' || ",$c," == *",$2,"* ]]; then printf '%s\n' "$r"; return 0; fi
    done < <(sed 's/#.*//;/^[[:space:]]*$/d' "$3")
}

# compare_config CONFIG[@BACKING] RESULTS REFERENCE ACCEPTED: one check per test of CONFIG's virtio-fs
# results against the ext4 results in REFERENCE. Fails a test that passes on ext4 and fails
# or gives no result here, unless ACCEPTED names it; a test that does not run here, or fails
# on ext4 too, is listed (INFO), not failed.
compare_config() {
    local cfg=$1 res=$2 ref=$3 acc=$4 t s e why reason n=0
    declare -A ext4=()
    while read -r _ _ _ t e _; do ext4[$t]=$e; done < <(grep '^FSTEST [^ ]* ext4 ' "$ref" 2>/dev/null || true)
    if ((${#ext4[@]} == 0)); then
        bad "fstests/$cfg/reference" "no ext4 results in $ref"
    fi
    while read -r _ _ _ t s why; do
        n=$((n + 1))
        e=${ext4[$t]:-missing}
        reason=$(accepted_reason "$t" "${cfg%@*}" "$acc") # the same on every backing
        case $s in
            passed)
                ok "fstests/$cfg/$t"
                [[ -z $reason ]] || echo "INFO fstests/$cfg/$t passes: its accepted difference ($reason) is no longer needed"
                ;;
            notrun)
                echo "INFO fstests/$cfg/$t not run on virtio-fs (ext4: $e): $why" ;;
            *)
                if [[ $s == missing ]]; then
                    bad "fstests/$cfg/$t" "no result (the guest or daemon died during it)"
                elif [[ $e != passed ]]; then
                    echo "INFO fstests/$cfg/$t failed here and does not pass on ext4 ($e): $why"
                elif [[ -n $reason ]]; then
                    ok "fstests/$cfg/$t"
                    echo "INFO fstests/$cfg/$t failed, an accepted difference: $reason"
                else
                    bad "fstests/$cfg/$t" "passes on ext4, $s here: $why"
                fi
                ;;
        esac
        [[ $e != missing ]] || bad "fstests/ext4/$t" "no ext4 result for the reference"
    done < <(grep "^FSTEST $cfg virtiofs " "$res" 2>/dev/null || true)
    ((n > 0)) || bad "fstests/$cfg/run" "no virtio-fs results in $res (rig failure; see $res and its directory)"
}

# print_table DIR CONFIG...: passed / failed / not run per configuration and file system,
# from the FSTESTS summary lines of DIR/CONFIG.txt.
print_table() {
    local dir=$1 cfg line name fs p f nr m
    shift
    printf '%-22s %-9s %7s %7s %7s %7s\n' configuration fs passed failed notrun missing
    for cfg in "$@"; do
        while read -r line; do
            # FSTESTS name fs passed=N failed=N notrun=N missing=N
            read -r _ name fs _ p _ f _ nr _ m <<<"${line//=/ }"
            printf '%-22s %-9s %7s %7s %7s %7s\n' "$name" "$fs" "$p" "$f" "$nr" "$m"
        done < <(grep '^FSTESTS ' "$dir/$cfg.txt" 2>/dev/null || true)
    done
}
