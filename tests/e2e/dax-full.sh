#!/usr/bin/env bash
# A DAX guest writing while the share's host file system is full, or its file immutable
# (issue #36): QEMU 11.1 (profile dax, TCG) + daxfsd, `-o dax=always`, a 64 MiB window (the
# hybrid policy's 512 KiB ranges), --cache auto. Needs root (mounts).
#
#   tests/e2e/dax-full.sh [-v] [-d DAEMON] [--mapping pooled|direct]... [--fs tmpfs|ext4]...
#                         [--case full|immutable]...
#
# For each file system (default: tmpfs, then ext4) and each mapping mode (default: pooled,
# daxfsd's default, then direct) one boot on a fresh file system mounted for it as the share:
# tmpfs size=64m, or a 128 MiB ext4 image (mkfs -m 0 -b 4096: 1 KiB blocks, mkfs's default for
# so small a file system, make the guest's msync of a DAX mapping fail with EIO, see README)
# on a loop device. Mounts, loop
# devices and immutable flags are undone on every exit (lib.sh's RIG_CLEANUP).
# The guest's writer is tests/e2e/dax-full-writer.c, built static on the host and run from
# the share: it copies a 16 MiB host file (`pat`) over a file with pwrite + fsync (`write`)
# or with stores through MAP_SHARED + msync + fsync (`mmap`), and prints the errno of the
# first call that failed. Checks, per file system and mode (NAME_FS_MODE):
#   alive            QEMU and the daemon lived through every step and the guest finished
#   full_write       with 6 MiB free, `write` into a sparse 16 MiB file fails with ENOSPC (at
#                    a write or at fsync), in both modes
#   full_mmap        the same with `mmap` (after the guest truncated the first file back to
#                    a hole, so 6 MiB are free again): direct, the writer dies of SIGBUS (status 135: the
#                    page fault's SETUPMAPPING is refused with ENOSPC, as a local file system
#                    that cannot allocate at a fault does); pooled, msync or fsync fails with
#                    ENOSPC (or SIGBUS, should the pool refuse the mapping)
#   upgrade_read     last (the host fills the file system again) a 4 KiB `write` into the allocated first page
#                    of a file whose first range the guest mapped read-only (a load through
#                    mmap) and whose other pages are holes: exits 0 or fails with ENOSPC, and
#                    the guest then reads that page as the host file has it at the end, never
#                    as zeros (a refused read-only -> writable upgrade must not leave a hole)
#   rewrite_write, rewrite_mmap   the host frees the space; the same writer again exits 0 and
#                    the host file's md5 is `pat`'s
# ext4 only (its file made immutable with chattr +i after the guest opened it read-write and
# loaded its first page through a mapping, so the daemon holds it open for DAX and the
# guest has its first range mapped read-only; before the writer's first store):
#   imm_write        `write` fails with EPERM, both modes
#   imm_mmap         `mmap`: direct, SIGBUS (SETUPMAPPING refused with EPERM); pooled, msync
#                    or fsync fails with EPERM (or SIGBUS)
#   imm_rewrite_write, imm_rewrite_mmap   after chattr -i, the writers exit 0 and the host
#                    files' md5 are `pat`'s
# A file made immutable while the guest has it mapped writable (direct) is not covered: ext4
# refuses QEMU's next store to a clean page with SIGBUS (README, Limits).
# Ends with "e2e-dax-full: N passed, M failed"; exits non-zero on any failure.
set -euo pipefail
RIG_TAG=e2e-dax-full
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$RIG_ROOT"

verbose=() daemon=() modes=() fss=() cases=()
while (($#)); do
    case $1 in
        -v) verbose=(-v); shift ;;
        -d) [[ -n ${2:-} ]] || die "-d needs a daemon path"; daemon=(-d "$2"); shift 2 ;;
        --mapping) [[ ${2:-} =~ ^(pooled|direct)$ ]] || die "--mapping needs pooled or direct"; modes+=("$2"); shift 2 ;;
        --fs) [[ ${2:-} =~ ^(tmpfs|ext4)$ ]] || die "--fs needs tmpfs or ext4"; fss+=("$2"); shift 2 ;;
        --case) [[ ${2:-} =~ ^(full|immutable)$ ]] || die "--case needs full or immutable"; cases+=("$2"); shift 2 ;;
        *) die "unknown argument '$1' (use -v, -d DAEMON, --mapping pooled|direct, --fs tmpfs|ext4, --case full|immutable)" ;;
    esac
done
((${#modes[@]})) || modes=(pooled direct)
((${#fss[@]})) || fss=(tmpfs ext4)
((${#cases[@]})) || cases=(full immutable)
full=0 imm=0
for c in "${cases[@]}"; do [[ $c == full ]] && full=1; [[ $c == immutable ]] && imm=1; done
((EUID == 0)) || die "needs root: it mounts a tmpfs and an ext4 image on a loop device"
need_cmd gcc gcc
need_cmd mkfs.ext4 e2fsprogs
need_cmd chattr e2fsprogs
need_cmd losetup mount
need_cmd fallocate util-linux
# ok, bad, md5, guest_complete and rig_summary come from scripts/lib.sh; the guest script's
# check, waitfor and guest_end from tests/e2e/guest/lib.sh (scripts/vm.sh sends them).

work=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-e2e-dax-full.XXXXXX")
# What is mounted, attached or immutable right now (undone by teardown, and at any exit).
mnt="" loopdev="" immutable=()
teardown() {
    local f
    for f in "${immutable[@]}"; do chattr -i "$f" 2>/dev/null || true; done
    immutable=()
    if [[ -n $mnt ]] && mountpoint -q "$mnt"; then
        umount "$mnt" 2>/dev/null || umount -l "$mnt" || true
    fi
    mnt=""
    if [[ -n $loopdev ]]; then losetup -d "$loopdev" || true; fi
    loopdev=""
}
# A VM still running (the script interrupted): stopped first (vm.sh stops QEMU and the daemon),
# so nothing holds the file system when it is unmounted.
vmpid=""
stop_vm() {
    [[ -n $vmpid ]] && kill -0 "$vmpid" 2>/dev/null || return 0
    kill -TERM "$vmpid" 2>/dev/null || true
    wait "$vmpid" 2>/dev/null || true
}
RIG_CLEANUP+=(stop_vm teardown "rm -rf -- $(printf %q "$work")")
logs="$DAXFSD_CACHE/logs"
mkdir -p "$logs"

gcc -static -O2 -Wall -Wextra -Werror -o "$work/dax-full-writer" tests/e2e/dax-full-writer.c
head -c $((16 << 20)) /dev/urandom >"$work/pat"
want=$(md5 "$work/pat")

cat >"$work/guest.sh" <<'EOF'
W=/mnt/dax-full-writer
st() { echo "STATUS $1 $2 $(tail -n 1 /tmp/$1.out 2>/dev/null)"; }
check mounted_dax grep -q ' /mnt virtiofs .*dax=always' /proc/mounts || grep /mnt /proc/mounts
if [ -e /mnt/w_sp ]; then
    $W write /mnt/pat /mnt/w_sp >/tmp/full_write.out 2>&1; st full_write $?
    # The space the write took back (a guest truncate), and at once the mmap writer, which
    # also stops part way. QEMU used to die of SIGBUS here on ext4 with direct mappings: its
    # first store into a 2 MiB page-cache folio reserved blocks for all of the folio, past
    # the range the daemon had allocated (dax/prealloc.rs).
    truncate -s 0 /mnt/w_sp && truncate -s 16777216 /mnt/w_sp
    $W mmap /mnt/pat /mnt/m_sp >/tmp/full_mmap.out 2>&1; st full_mmap $?
    echo "@@DAX-FULL-FULL@@"
    check host_freed_space waitfor /mnt/freed 300
    $W write /mnt/pat /mnt/w_sp >/tmp/rewrite_write.out 2>&1; st rewrite_write $?
    $W mmap /mnt/pat /mnt/m_sp >/tmp/rewrite_mmap.out 2>&1; st rewrite_mmap $?
fi
if [ -e /mnt/imm_w ]; then
    $W write /mnt/pat /mnt/imm_w /mnt/imm.go >/tmp/imm_write.out 2>&1 &
    p1=$!
    $W mmap /mnt/pat /mnt/imm_m /mnt/imm.go >/tmp/imm_mmap.out 2>&1 &
    p2=$!
    i=0
    until grep -q opened /tmp/imm_write.out 2>/dev/null && grep -q opened /tmp/imm_mmap.out 2>/dev/null; do
        i=$((i + 1)); [ $i -lt 600 ] || break; sleep 0.2
    done
    echo "@@DAX-FULL-OPENED@@"
    wait $p1; st imm_write $?
    wait $p2; st imm_mmap $?
    echo "@@DAX-FULL-IMM@@"
    check host_cleared_flag waitfor /mnt/imm.off 300
    $W write /mnt/pat /mnt/imm_w >/tmp/imm_rewrite_write.out 2>&1; st imm_rewrite_write $?
    $W mmap /mnt/pat /mnt/imm_m >/tmp/imm_rewrite_mmap.out 2>&1; st imm_rewrite_mmap $?
fi
if [ -e /mnt/u ]; then
    # Last (QEMU died here on ext4 with direct mappings): the host fills the file system
    # again; a 4 KiB store into the allocated first page of a range the guest has mapped
    # read-only (the writer loads it first), whose other pages are holes.
    echo "@@DAX-FULL-REFILL@@"
    check host_refilled waitfor /mnt/refilled 300
    $W write /mnt/pat4k /mnt/u /mnt/u.go >/tmp/upgrade_write.out 2>&1; st upgrade_write $?
    echo "UPGRADE $(head -c 4096 /mnt/u | md5sum | cut -d' ' -f1)"
fi
echo "@@DAX-FULL-END@@"
guest_end
EOF

# wait_marker LOG PID MARKER: until the guest printed MARKER or the VM ended.
wait_marker() {
    for _ in $(seq 1 1200); do
        grep -aq "$3" "$1" 2>/dev/null && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.5
    done
    return 1
}

for fs in "${fss[@]}"; do
    for mode in "${modes[@]}"; do
        t=${fs}_$mode
        mnt=$work/mnt-$t
        mkdir -p "$mnt"
        if [[ $fs == tmpfs ]]; then
            mount -t tmpfs -o size=64m,mode=0755 daxfsd-full "$mnt"
        else
            truncate -s 128M "$work/ext4-$t.img"
            mkfs.ext4 -q -F -m 0 -b 4096 "$work/ext4-$t.img"
            loopdev=$(losetup -f --show "$work/ext4-$t.img")
            mount -t ext4 "$loopdev" "$mnt"
        fi
        cp "$work/dax-full-writer" "$work/pat" "$mnt/"
        files=()
        ((full)) && files+=(w_sp m_sp u)
        [[ $fs == ext4 ]] && ((imm)) && files+=(imm_w imm_m)
        ((${#files[@]})) || { log "$t: no case runs on $fs"; teardown; continue; }
        for f in "${files[@]}"; do truncate -s 16M "$mnt/$f"; done
        if ((full)); then
            head -c 4096 /dev/zero | tr '\0' A | dd of="$mnt/u" conv=notrunc status=none
            head -c 4096 /dev/zero | tr '\0' B >"$mnt/pat4k"
            touch "$mnt/u.go"
        fi
        # Leave 6 MiB free: the writers stop a third of the way in.
        avail=$(($(stat -f -c '%a * %S' "$mnt")))
        ((full)) && fallocate -l $((avail - (6 << 20))) "$mnt/filler"
        log "$t: $(($(stat -f -c '%a * %S' "$mnt") >> 20)) MiB free on $fs; --dax-mapping=$mode, the guest writes 16 MiB files"
        logf="$logs/e2e-dax-full-$t-$(date +%Y%m%d-%H%M%S)-$$.log"
        rc=0
        scripts/vm.sh "${verbose[@]}" "${daemon[@]}" -p dax -a --dax-window=64M -a "--dax-mapping=$mode" \
            -o dax=always -s "$mnt" --script "$work/guest.sh" -m 1G -T 600 -l "$logf" \
            >"$work/out-$t.txt" 2>"$work/err-$t.txt" &
        vmpid=$!
        if ((full)) && wait_marker "$logf" "$vmpid" '@@DAX-FULL-FULL@@'; then
            rm -f "$mnt/filler"
            touch "$mnt/freed"
            log "$t: the host freed the space"
        fi
        if [[ $fs == ext4 ]] && ((imm)) && wait_marker "$logf" "$vmpid" '@@DAX-FULL-OPENED@@'; then
            immutable=("$mnt/imm_w" "$mnt/imm_m")
            chattr +i "${immutable[@]}"
            touch "$mnt/imm.go"
            log "$t: chattr +i on the files the guest opened"
            if wait_marker "$logf" "$vmpid" '@@DAX-FULL-IMM@@'; then
                chattr -i "${immutable[@]}"
                immutable=()
                touch "$mnt/imm.off"
            fi
        fi
        if ((full)) && wait_marker "$logf" "$vmpid" '@@DAX-FULL-REFILL@@'; then
            avail=$(($(stat -f -c '%a * %S' "$mnt")))
            ((avail == 0)) || fallocate -l "$avail" "$mnt/filler" || true
            touch "$mnt/refilled"
            log "$t: the host filled the file system again ($(($(stat -f -c '%a * %S' "$mnt") >> 10)) KiB free)"
        fi
        wait "$vmpid" || rc=$?
        vmpid=""
        out=$work/out-$t.txt
        grep -E '^STATUS ' "$out" || true
        guest_complete "guest_$t" "$out" "$rc"
        grep -ao 'dax: maps=.*' "${logf%.log}.daemon.log" | tail -n 1 || true
        if ((rc == 0)) && grep -q '^@@DAX-FULL-END@@' "$out" && ! grep -q '^GUEST FAIL ' "$out"; then
            ok "alive_$t"
        else
            bad "alive_$t" "vm rc=$rc: $(grep -ao 'FAIL (.*' "$work/err-$t.txt" | head -n 1) (console $logf)"
        fi
        # status NAME: the writer's exit status and last line ("-" when it never ran).
        status() { sed -n "s/^STATUS $1 \\([0-9]*\\).*/\\1/p" "$out" | tail -n 1; }
        said() { sed -n "s/^STATUS $1 [0-9]* //p" "$out" | tail -n 1; }
        # failed NAME ERRNO: exited 1 naming ERRNO; with `mmap` in direct mode only SIGBUS.
        failed() {
            local s
            s=$(status "$1")
            if [[ $1 == *mmap && $mode == direct ]]; then
                [[ $s == 135 ]]
            else
                [[ $s == 135 ]] && [[ $1 == *mmap ]] && return 0
                [[ $s == 1 && $(said "$1") == *": $2 ("* ]]
            fi
        }
        landed() { [[ $(status "$1") == 0 && $(md5 "$mnt/$2") == "$want" && $(stat -c %s "$mnt/$2") == $((16 << 20)) ]]; }
        checks=() lands=()
        ((full)) && checks+=(full_write:ENOSPC full_mmap:ENOSPC) lands+=(rewrite_write:w_sp rewrite_mmap:m_sp)
        [[ $fs == ext4 ]] && ((imm)) && checks+=(imm_write:EPERM imm_mmap:EPERM) lands+=(imm_rewrite_write:imm_w imm_rewrite_mmap:imm_m)
        for c in "${checks[@]}"; do
            n=${c%%:*} e=${c#*:}
            if failed "$n" "$e"; then
                ok "${n}_$t"
            else
                bad "${n}_$t" "writer status '$(status "$n")' ($(said "$n")); want $([[ $n == *mmap && $mode == direct ]] && echo "135 (SIGBUS)" || echo "1 naming $e")"
            fi
        done
        if ((full)); then
            # The guest's view of that page then equals the host file's at the end: the
            # store's bytes (it landed, or stays to be written back), or the old ones (it
            # failed), never a hole of the window (zeros).
            got=$(sed -n 's/^UPGRADE \([0-9a-f]*\)$/\1/p' "$out" | tail -n 1)
            host=$(head -c 4096 "$mnt/u" | md5)
            s=$(status upgrade_write)
            if [[ -n $got && $got == "$host" ]] && { [[ $s == 0 ]] || failed upgrade_write ENOSPC; }; then
                ok "upgrade_read_$t"
            else
                bad "upgrade_read_$t" "writer status '$s' ($(said upgrade_write)); the guest read page 0 as ${got:-nothing}, the host file has $host (A*4096 $(head -c 4096 /dev/zero | tr '\0' A | md5), B*4096 $(head -c 4096 /dev/zero | tr '\0' B | md5), zeros $(head -c 4096 /dev/zero | md5))"
            fi
        fi
        for c in "${lands[@]}"; do
            n=${c%%:*} f=${c#*:}
            if landed "$n" "$f"; then
                ok "${n}_$t"
            else
                bad "${n}_$t" "writer status '$(status "$n")' ($(said "$n")), host md5 $(md5 "$mnt/$f") size $(stat -c %s "$mnt/$f"), want $want"
            fi
        done
        teardown
    done
done

rig_summary e2e-dax-full
