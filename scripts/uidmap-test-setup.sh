#!/bin/bash
# Set-up for the --uid-map/--gid-map test (tests/vufs-driver/tests/uidmap.rs), as root:
# - newuidmap/newgidmap (Debian package uidmap, from scripts/provision-deps.sh test);
# - the system user daxfsd-test, created when absent (an existing user is never modified);
# - one /etc/subuid and one /etc/subgid range of 65536 ids for it, appended when it has
#   none, after every range already there (nothing of the machine's is changed or removed).
# Idempotent. Prints the user's ids and ranges.
set -euo pipefail
RIG_TAG=uidmap-test-setup
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
USER_NAME=daxfsd-test
COUNT=65536

[[ $(id -u) == 0 ]] || die "run as root (it adds a system user)"

if ! command -v newuidmap >/dev/null || ! command -v newgidmap >/dev/null; then
    die "newuidmap/newgidmap not found; run 'scripts/provision-deps.sh test' (package uidmap)"
fi
if ! id -u "$USER_NAME" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$USER_NAME"
fi

# add_range FILE: a range for the user unless it has one.
add_range() {
    local f=$1 start=1000000
    touch "$f"
    if grep -q "^$USER_NAME:" "$f"; then
        return
    fi
    # After the end of every existing range (numeric entries and user names alike).
    local end
    end=$(awk -F: 'NF >= 3 && $2 ~ /^[0-9]+$/ && $3 ~ /^[0-9]+$/ { e = $2 + $3; if (e > m) m = e } END { print m + 0 }' "$f")
    (( end > start )) && start=$end
    echo "$USER_NAME:$start:$COUNT" >> "$f"
}
add_range /etc/subuid
add_range /etc/subgid
echo "uidmap-test-setup: $USER_NAME uid $(id -u "$USER_NAME") gid $(id -g "$USER_NAME");" \
    "subuid $(grep "^$USER_NAME:" /etc/subuid | head -1 | cut -d: -f2-)," \
    "subgid $(grep "^$USER_NAME:" /etc/subgid | head -1 | cut -d: -f2-)"
