#!/usr/bin/env bash
# Runs shellcheck on every shell script in the repository: each tracked file whose name ends in
# .sh or whose first line names sh or bash. The guest's scripts (busybox sh) are checked as
# POSIX sh; all others as bash, following `source` relative to the script.
#
#   scripts/lint-shell.sh        (part of `make lint`)
set -euo pipefail
RIG_TAG=shell-lint
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$RIG_ROOT"
need_cmd shellcheck shellcheck
need_cmd git git

bash_scripts=() sh_scripts=()
while IFS= read -r -d '' f; do
    [[ -f $f ]] || continue
    first=$(head -c 128 -- "$f" | tr -d '\0' | head -n 1)
    if [[ $first == '#!'*bash* || ($f == *.sh && $first != '#!'*) ]]; then
        bash_scripts+=("$f")
    elif [[ $first == '#!'*/sh* || $f == *.sh ]]; then
        sh_scripts+=("$f")
    fi
done < <(git ls-files -z)
((${#bash_scripts[@]} + ${#sh_scripts[@]})) || die "no shell scripts found (not a git checkout?)"
rc=0
shellcheck -x -P SCRIPTDIR "${bash_scripts[@]}" || rc=1
# SC3043: busybox sh has `local`.
((${#sh_scripts[@]} == 0)) || shellcheck -s sh -e SC3043 "${sh_scripts[@]}" || rc=1
((rc == 0)) || die "shellcheck found problems (above)"
log "clean: ${#bash_scripts[@]} bash and ${#sh_scripts[@]} sh scripts"
