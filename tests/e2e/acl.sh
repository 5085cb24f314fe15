#!/usr/bin/env bash
# Guest checks of POSIX ACLs, xattr name mapping and uid/gid translation, each in a real
# guest (profile pci) with setfacl/getfacl/setfattr/getfattr from the initramfs, then
# checked from the host:
#  1. --posix-acl: default ACLs inherited by new files and directories (the guest's umask
#     then does not apply), the mask follows chmod and chmod follows the mask, the ACL
#     grants and denies as it says (guest users), setgid cleared when a caller outside the
#     file's group sets an ACL (kept for root), `setfacl -b` removes it; the host's getfacl
#     shows the same ACLs.
#  2. --xattrmap ':map:trusted.:user.virtiofs.:' with --translate-uid/--translate-gid
#     'map:1000:3000:10': guest trusted.* lands as user.virtiofs.trusted.* on the host and
#     reads back, the guest cannot reach user.virtiofs.* itself, other names pass unchanged;
#     files of guest uid 1000 land as host 3000, host ids 3000.. show as 1000.., chown
#     translates, ids outside the map pass unchanged.
# Runs against daxfsd (default) or, with -d virtiofsd, upstream virtiofsd 1.14 (the same
# checks prove the test). Installs the acl package on the host when getfacl is missing.
#
#   tests/e2e/acl.sh [-v] [-d DAEMON]
# Ends with "e2e-acl: N passed, M failed".
set -euo pipefail
RIG_TAG=e2e-acl
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
need_cmd getfacl acl
need_cmd getfattr attr
# ok, bad, check and rig_summary come from scripts/lib.sh.
# expect NAME CONDITION-COMMAND...: a host-side check.
expect() { local n=$1; shift; if "$@" >/dev/null 2>&1; then ok "$n"; else bad "$n" "host: $*"; fi; }

work=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-e2e-acl.XXXXXX")
trap 'rm -rf -- "$work"' EXIT

# Guest helpers shared by both scripts (ok, bad and guest_end come from tests/e2e/guest/lib.sh,
# which scripts/vm.sh sends first): guest users and groups.
guest_prelude() {
    cat <<'EOF'
cd /mnt || exit 1
# t NAME CMD...: CMD must succeed.
t() { n=$1; shift; if "$@" >/tmp/t.out 2>&1; then ok "$n"; else bad "$n" "$* -> $(tr '\n' ' ' </tmp/t.out)"; fi; }
# nt NAME CMD...: CMD must fail.
nt() { n=$1; shift; if "$@" >/dev/null 2>&1; then bad "$n" "$* succeeded"; else ok "$n"; fi; }
# has NAME TEXT FILE: getfacl -nE FILE (numeric ids, no effective-rights comments) prints
# the line TEXT.
has() { if getfacl -nE "$3" 2>/dev/null | grep -qx -- "$2"; then ok "$1"; else bad "$1" "no '$2' in: $(getfacl -nE "$3" 2>&1 | tr '\n' ' ')"; fi; }
as() { u=$1; shift; su "$u" -s /bin/sh -c "$*"; }
for u in u1:1001 u2:1002 u1000:1000; do
    echo "${u%%:*}:x:${u#*:}:${u#*:}::/tmp:/bin/sh" >>/etc/passwd
    echo "${u%%:*}:x:${u#*:}:" >>/etc/group
done
echo "staff:x:2000:u1" >>/etc/group
EOF
}

# 1. POSIX ACLs.
acl_share=$work/acl
mkdir -p "$acl_share"
{
    guest_prelude
    cat <<'EOF'
umask 022
mkdir acl && chmod 0755 acl
t set_default_acl setfacl -d -m u:1001:rwx,g::r-x,o::--- acl
touch acl/file
mkdir acl/dir
touch plain
# Inherited on create: the default ACL replaces the umask (mask rw- from mode 0666, not r--).
has file_inherits_user 'user:1001:rwx' acl/file
has file_inherits_mask 'mask::rw-' acl/file
has file_inherits_other 'other::---' acl/file
has dir_inherits_access 'user:1001:rwx' acl/dir
has dir_inherits_default 'default:user:1001:rwx' acl/dir
t no_acl_umask_applies [ "$(stat -c %a plain)" = 644 ]
# mask and chmod.
touch m && chmod 0644 m
t set_named_user setfacl -m u:1002:rwx m
t group_bits_show_mask [ "$(stat -c %a m)" = 674 ]
chmod 0640 m
has chmod_sets_mask 'mask::r--' m
has named_user_limited 'user:1002:rwx' m
t mask_sets_group_bits sh -c 'setfacl -m m::rw m && [ "$(stat -c %a m)" = 660 ]'
# The ACL decides who may read.
echo secret >acl/grant && chmod 0600 acl/grant && setfacl -m u:1001:r acl/grant
t named_user_may_read as u1 "cat /mnt/acl/grant"
nt other_user_may_not as u2 "cat /mnt/acl/grant"
# setgid: cleared when the caller setting the ACL is not in the file's group.
mkdir -p sg && chmod 0777 sg
touch sg/f && chown 1001:1002 sg/f && chmod 2775 sg/f
t sgid_set sh -c '[ $((0$(stat -c %a sg/f) & 02000)) -ne 0 ]'
t owner_sets_acl as u1 "setfacl -m u:1000:r /mnt/sg/f"
t sgid_cleared sh -c '[ $((0$(stat -c %a sg/f) & 02000)) -eq 0 ]'
touch sg/r && chgrp 2000 sg/r && chmod 2775 sg/r
setfacl -m u:1000:r sg/r
t sgid_kept_for_root sh -c '[ $((0$(stat -c %a sg/r) & 02000)) -ne 0 ]'
touch gone && setfacl -m u:1001:rw gone
t remove_acl setfacl -b gone
t removed_acl_gone sh -c '! getfacl -n gone | grep -q "^user:1001"'
guest_end
EOF
} >"$work/acl-guest.sh"
log "guest: POSIX ACLs (--posix-acl, daemon $daemon)"
rc=0
"$RIG_ROOT/scripts/vm.sh" "${verbose[@]}" -p pci -d "$daemon" -a --posix-acl -a --xattr -s "$acl_share" \
    --script "$work/acl-guest.sh" -T 300 >"$work/acl-out.txt" || rc=$?
if ((rc <= 1)) && grep -q '^GUEST END ' "$work/acl-out.txt"; then ok acl_guest_ran; else bad acl_guest_ran "vm.sh rc=$rc: $(tail -n 5 "$work/acl-out.txt" | tr '\n' ' ')"; fi
import_checks acl_guest "$work/acl-out.txt" "$rc" guest acl_
# The host sees the same ACLs.
# hostacl NAME FILE LINE: the host's getfacl -nE FILE prints LINE.
hostacl() {
    if getfacl -nE "$2" 2>/dev/null | grep -qx -- "$3"; then ok "$1"; else bad "$1" "host getfacl $2: $(getfacl -nE "$2" 2>&1 | tr '\n' ' ')"; fi
}
hostacl acl_host_default "$acl_share/acl" 'default:user:1001:rwx'
hostacl acl_host_file "$acl_share/acl/file" 'user:1001:rwx'
hostacl acl_host_file_mask "$acl_share/acl/file" 'mask::rw-'
hostacl acl_host_dir "$acl_share/acl/dir" 'default:user:1001:rwx'
hostacl acl_host_mask "$acl_share/m" 'mask::rw-'
expect acl_host_sgid_cleared sh -c "[ \$((0\$(stat -c %a '$acl_share/sg/f') & 02000)) -eq 0 ]"
expect acl_host_removed sh -c "! getfattr -n system.posix_acl_access '$acl_share/gone'"

# 2. xattr mapping and id translation.
map_share=$work/map
mkdir -p "$map_share/tr"
chmod 0777 "$map_share/tr"
touch "$map_share/tr/hostfile" && chown 3005:3006 "$map_share/tr/hostfile"
touch "$map_share/tr/outside" && chown 5000:5000 "$map_share/tr/outside"
{
    guest_prelude
    cat <<'EOF'
touch x
t set_trusted setfattr -n trusted.color -v blue x
t get_trusted sh -c '[ "$(getfattr --only-values -n trusted.color x)" = blue ]'
t set_user setfattr -n user.plain -v p x
nt no_direct_prefixed setfattr -n user.virtiofs.sneak -v s x
t list_guest_names sh -c 'l=$(getfattr -d -m - x); echo "$l" | grep -q trusted.color && echo "$l" | grep -q user.plain && ! echo "$l" | grep -q virtiofs'
t remove_trusted setfattr -x trusted.color x
nt removed_trusted getfattr -n trusted.color x
setfattr -n trusted.keep -v k x
# uid/gid translation.
t create_as_1000 as u1000 "touch /mnt/tr/by1000"
t guest_sees_1000 [ "$(stat -c %u:%g tr/by1000)" = 1000:1000 ]
t host_3005_is_1005 [ "$(stat -c %u:%g tr/hostfile)" = 1005:1006 ]
t unmapped_id_unchanged [ "$(stat -c %u:%g tr/outside)" = 5000:5000 ]
touch tr/chowned
t chown_translates chown 1002:1003 tr/chowned
t chown_seen [ "$(stat -c %u:%g tr/chowned)" = 1002:1003 ]
guest_end
EOF
} >"$work/map-guest.sh"
log "guest: --xattrmap and --translate-uid/gid (daemon $daemon)"
rc=0
"$RIG_ROOT/scripts/vm.sh" "${verbose[@]}" -p pci -d "$daemon" -a --xattr \
    -a "--xattrmap=:map:trusted.:user.virtiofs.:" \
    -a "--translate-uid=map:1000:3000:10" -a "--translate-gid=map:1000:3000:10" \
    -s "$map_share" --script "$work/map-guest.sh" -T 300 >"$work/map-out.txt" || rc=$?
if ((rc <= 1)) && grep -q '^GUEST END ' "$work/map-out.txt"; then ok map_guest_ran; else bad map_guest_ran "vm.sh rc=$rc: $(tail -n 5 "$work/map-out.txt" | tr '\n' ' ')"; fi
import_checks map_guest "$work/map-out.txt" "$rc" guest map_
expect map_host_prefixed sh -c "[ \"\$(getfattr --only-values -n user.virtiofs.trusted.keep '$map_share/x')\" = k ]"
expect map_host_no_trusted sh -c "! getfattr -n trusted.keep '$map_share/x'"
expect map_host_user_plain sh -c "[ \"\$(getfattr --only-values -n user.plain '$map_share/x')\" = p ]"
expect map_host_owner_3000 sh -c "[ \"\$(stat -c %u:%g '$map_share/tr/by1000')\" = 3000:3000 ]"
expect map_host_chown_3002 sh -c "[ \"\$(stat -c %u:%g '$map_share/tr/chowned')\" = 3002:3003 ]"

log "daemon $daemon"
rig_summary e2e-acl
