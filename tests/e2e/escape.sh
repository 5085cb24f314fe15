#!/usr/bin/env bash
# Escape attempts from inside a guest (profile pci, daxfsd with the default sandbox): the
# guest plants symlinks to /, /etc, ../.., /proc/self/root and to the host path of a
# sentinel directory next to the share, then reads, writes, renames, links and creates
# through them, walks `..` above the mount, and tries to hard-link to the sentinel's file.
# After the VM exits the host asserts that nothing outside the share was written, created,
# removed or had its metadata changed (a snapshot of the sentinel tree and of the share's
# parent directory before and after), and that the symlinks are still plain symlinks.
#
#   tests/e2e/escape.sh [-v] [-d DAEMON]
# Ends with "e2e-escape: N passed, M failed".
set -euo pipefail
RIG_TAG=e2e-escape
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$RIG_ROOT"

verbose=() daemon=daxfsd
while (($#)); do
    case $1 in
        -v) verbose=(-v); shift ;;
        -d) (($# >= 2)) || die "-d needs a value"; daemon=$2; shift 2 ;;
        *) die "unknown option '$1'" ;;
    esac
done
need_cmd python3
# ok, bad, check and rig_summary come from scripts/lib.sh.

work=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-e2e-escape.XXXXXX")
scratch=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-e2e-escape-run.XXXXXX")
trap 'rm -rf -- "$work" "$scratch"' EXIT
share=$work/share outside=$work/outside
mkdir -p "$share" "$outside/sub"
printf 'secret\n' >"$outside/secret"
printf 'keep\n' >"$outside/sub/keep"
chmod 0640 "$outside/secret"

before=$(tree_snapshot "$outside"; ls -1A "$work")

cat >"$scratch/guest.sh" <<EOF
cd /mnt || exit 1
try() { "\$@" >/dev/null 2>&1 </dev/null; true; }
ln -s / root; ln -s /etc etc; ln -s ../.. up; ln -s /proc/self/root procroot
ln -s "$outside" hostside; ln -s "$outside/secret" hostsecret
mkdir d; ln -s ../../.. d/upup
for l in root etc up procroot hostside d/upup; do
    try ls "\$l/"; try cat "\$l/secret" "\$l/hostname" "\$l/passwd"
    try sh -c "echo pwned > \$l/pwned"; try mkdir "\$l/pwned-dir"; try touch "\$l/pwned-touch"
    try mv d/upup "\$l/moved"; try ln "\$l/secret" hard-secret
done
try sh -c 'echo pwned > hostsecret'; try chmod 777 hostsecret; try truncate -s 0 hostsecret
try ln "$outside/secret" hard-host; try cp /mnt/../../etc/hostname stolen
cd /mnt/.. && try touch /mnt/../pwned-above
cd /mnt/d && try sh -c 'echo x > ../../pwned-rel'
cd /mnt
# The guest resolves symlinks itself: these must point into the guest, not the host.
check hostside_dangling [ "\$(readlink hostside)" = "$outside" -a ! -e hostsecret ]
guest_end
EOF
log "guest plants symlinks and tries to reach $outside"
rc=0
"$RIG_ROOT/scripts/vm.sh" "${verbose[@]}" -p pci -d "$daemon" -s "$share" --script "$scratch/guest.sh" -T 120 \
    >"$scratch/out.txt" || rc=$?
after=$(tree_snapshot "$outside"; ls -1A "$work")

guest_complete guest "$scratch/out.txt" "$rc"
if ((rc <= 1)) && grep -q '^GUEST END ' "$scratch/out.txt"; then ok guest_ran; else bad guest_ran "vm.sh rc=$rc"; fi
if [[ $before == "$after" ]]; then
    ok outside_untouched
else
    bad outside_untouched "$(diff <(printf '%s\n' "$before") <(printf '%s\n' "$after") | head -n 10)"
fi
if grep -q '^GUEST PASS hostside_dangling$' "$scratch/out.txt"; then
    ok host_path_not_reachable
else
    bad host_path_not_reachable "the host path $outside was visible from the guest"
fi
links_ok=1
for l in root etc up procroot hostside hostsecret; do
    [[ -L $share/$l ]] || links_ok=0
done
if ((links_ok)) && [[ ! -e $share/hard-host && ! -e $share/hard-secret ]]; then
    ok links_stay_in_share
else
    bad links_stay_in_share "a planted symlink was replaced or a hard link to the outside exists"
fi
if [[ -z $(find / -xdev -maxdepth 2 -name 'pwned*' -newer "$scratch/guest.sh" 2>/dev/null) ]]; then
    ok no_pwned_files_near_root
else
    bad no_pwned_files_near_root "$(find / -xdev -maxdepth 2 -name 'pwned*' -newer "$scratch/guest.sh" 2>/dev/null | head -n 3)"
fi
rig_summary e2e-escape
