#!/usr/bin/env bash
# check-space.sh GIB DIR...: fail with one line, before any build starts, when a file system
# holding DIR has less than GIB GiB free. A build that runs out of space part way fails far
# from its cause (the linker dies with SIGBUS writing a test binary).
set -euo pipefail
need_gib=${1:?usage: check-space.sh GIB DIR...}
shift
for dir in "$@"; do
    mkdir -p "$dir"
    avail_kib=$(df -Pk -- "$dir" | awk 'NR == 2 { print $4 }')
    if (( avail_kib < need_gib * 1024 * 1024 )); then
        echo "make: only $((avail_kib / 1024)) MiB free for $dir; the build and test artifacts" \
            "need about ${need_gib} GiB: free some space there and rerun" >&2
        exit 1
    fi
done
