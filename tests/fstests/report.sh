#!/usr/bin/env bash
# The conformance table of a `make conformance` run as markdown and JSON, from the result
# lines of tests/fstests/run.sh (DIR/CONFIG.txt, one per configuration; the first
# configuration's file also holds the ext4 reference).
#
#   tests/fstests/report.sh DIR MD JSON CONFIG...
#
# MD: per configuration and file system passed / failed / not run / missing, then one row
# per test with its status in every configuration. JSON: the same, as
# {"configs":[{"name","fs","passed","failed","notrun","missing"}],
#  "tests":{"generic/NNN":{"CONFIG/FS":"passed|failed|notrun|missing", ...}}}.
set -euo pipefail
(($# >= 4)) || { echo "usage: $0 DIR MD JSON CONFIG..." >&2; exit 2; }
dir=$1 md=$2 json=$3
shift 3
configs=("$@")

# Columns: every (configuration, file system) pair that has a summary line, in order.
cols=()
declare -A sums=()
for cfg in "${configs[@]}"; do
    [[ -r $dir/$cfg.txt ]] || { echo "no results for $cfg in $dir" >&2; exit 1; }
    while read -r _ name fs rest; do
        cols+=("$name/$fs")
        sums[$name/$fs]=$rest
    done < <(grep '^FSTESTS ' "$dir/$cfg.txt")
done
((${#cols[@]} > 0)) || { echo "no summary lines in $dir" >&2; exit 1; }

declare -A st=()
tests=()
for cfg in "${configs[@]}"; do
    while read -r _ name fs t s _; do
        [[ -n ${st[$t]+x} ]] || { tests+=("$t"); st[$t]=1; }
        st[$t/$name/$fs]=$s
    done < <(grep '^FSTEST ' "$dir/$cfg.txt")
done
mapfile -t tests < <(printf '%s\n' "${tests[@]}" | sort)

count() { # count KEY "passed=N failed=N ..."
    local kv
    for kv in $2; do [[ ${kv%%=*} != "$1" ]] || { printf '%s' "${kv#*=}"; return; }; done
    printf 0
}

{
    echo "| configuration | fs | passed | failed | not run | missing |"
    echo "|---|---|---|---|---|---|"
    for c in "${cols[@]}"; do
        s=${sums[$c]}
        printf '| %s | %s | %s | %s | %s | %s |\n' "${c%/*}" "${c#*/}" "$(count passed "$s")" \
            "$(count failed "$s")" "$(count notrun "$s")" "$(count missing "$s")"
    done
    echo
    printf '| test |'
    printf ' %s |' "${cols[@]}"
    echo
    printf '|---|'
    printf -- '---|%.0s' "${cols[@]}"
    echo
    for t in "${tests[@]}"; do
        printf '| %s |' "$t"
        for c in "${cols[@]}"; do printf ' %s |' "${st[$t/$c]:--}"; done
        echo
    done
} >"$md"

{
    printf '{\n  "configs": [\n'
    sep=""
    for c in "${cols[@]}"; do
        s=${sums[$c]}
        printf '%s    {"name": "%s", "fs": "%s", "passed": %s, "failed": %s, "notrun": %s, "missing": %s}' \
            "$sep" "${c%/*}" "${c#*/}" "$(count passed "$s")" "$(count failed "$s")" \
            "$(count notrun "$s")" "$(count missing "$s")"
        sep=$',\n'
    done
    printf '\n  ],\n  "tests": {\n'
    sep=""
    for t in "${tests[@]}"; do
        printf '%s    "%s": {' "$sep" "$t"
        s2=""
        for c in "${cols[@]}"; do
            [[ -n ${st[$t/$c]:-} ]] || continue
            printf '%s"%s": "%s"' "$s2" "$c" "${st[$t/$c]}"
            s2=", "
        done
        printf '}'
        sep=$',\n'
    done
    printf '\n  }\n}\n'
} >"$json"
