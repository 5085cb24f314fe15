#!/usr/bin/env bash
# DAX end to end: QEMU 11.1 (profile dax, TCG) + daxfsd with a DAX window, checked in the
# guest and on the host after the VM exits.
#
#   tests/e2e/dax.sh [-v] [--dax-policy hybrid|upstream]
#
# --dax-policy mounts with -o dax_policy=P (guest-kernel/patches: the window policy; the
# kernel's default is hybrid); without it the kernel's default policy is checked. fio_4x_window
# wants 1,000 maps and unmaps with upstream (a remap per miss), 100 with hybrid (misses go to
# FUSE_READ/WRITE; the ranges still cycle, fio's verify pass alone streams 128 of them).
#
# Run 1, `-o dax=always`, 64 MiB window, --cache never:
#   mount_dax          the mount really is dax=always and the guest saw the window
#   host_write_read    a file written on the host before boot reads back intact
#   dax_write_to_host  bytes written through DAX are in the host file after the VM exits
#   mmap_shared        MAP_SHARED read/write coherent with read()/write()
#   truncate_extend    truncate and extend of a mapped file (content and size, both sides)
#   small_file_tail    a file that ends mid-page (shadow tail) reads and writes correctly
#   fio_4x_window      fio verify=crc32c over a file 4x the window (reclaim: thousands of
#                      maps and unmaps, zero failures in the daemon's counters)
# Run 2, `-o dax=inode` (the guest's default) with --dax-policy size:1M:
#   inode_policy       only the large file is mapped
# Ends with "e2e-dax: N passed, M failed"; exits non-zero on any failure.
set -euo pipefail
RIG_TAG=e2e-dax
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$RIG_ROOT"

verbose=() policy_mo=""
while (($#)); do
    case $1 in
        -v) verbose=(-v); shift ;;
        --dax-policy) [[ ${2:-} == hybrid || ${2:-} == upstream ]] || die "--dax-policy needs hybrid or upstream"
            policy_mo=dax_policy=$2; shift 2 ;;
        *) die "unknown argument '$1' (use -v, --dax-policy hybrid|upstream)" ;;
    esac
done
min_cycles=100
[[ $policy_mo == dax_policy=upstream ]] && min_cycles=1000
need_cmd python3
pass=0 fail=0
ok() { pass=$((pass + 1)); printf 'CHECK PASS %s\n' "$1"; }
bad() { fail=$((fail + 1)); printf 'CHECK FAIL %s: %s\n' "$1" "$2"; }
md5() { md5sum "$@" | cut -d' ' -f1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-e2e-dax.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
share=$work/share
mkdir -p "$share"
logs="$DAXFSD_CACHE/logs"
mkdir -p "$logs"

# ---- run 1: dax=always ------------------------------------------------------------
head -c $((3 * 1024 * 1024 + 123)) /dev/urandom >"$share/hostfile"
want_host=$(md5 "$share/hostfile")
head -c $((4 * 1024 * 1024)) /dev/zero >"$share/dwrite"
head -c $((6 * 1024 * 1024)) /dev/urandom >"$share/trunc"
want_t1=$(head -c 1048576 "$share/trunc" | md5)
zeros4m=$(head -c $((4 * 1024 * 1024)) /dev/zero | md5)
printf 'tail-bytes-0123456789' >"$share/small"

cat >"$work/run1.sh" <<EOF
rc=0
check() { n=\$1; shift; if "\$@"; then echo "GUEST PASS \$n"; else echo "GUEST FAIL \$n"; rc=1; fi; }
grep -q 'virtiofs.*dax=always' /proc/mounts && dmesg | grep -q 'Cache len'; check mount_dax [ \$? = 0 ]
check host_write_read [ "\$(md5sum /mnt/hostfile | cut -d' ' -f1)" = "$want_host" ]
dd if=/dev/urandom of=/tmp/pat bs=1M count=2 2>/dev/null
dd if=/tmp/pat of=/mnt/dwrite bs=1M seek=1 conv=notrunc 2>/dev/null
md5sum /tmp/pat | cut -d' ' -f1 >/mnt/dwrite.md5
check dax_write_guest [ "\$(dd if=/mnt/dwrite bs=1M skip=1 count=2 2>/dev/null | md5sum | cut -d' ' -f1)" = "\$(cat /mnt/dwrite.md5)" ]
/e2e/vfstest mmap /mnt/mmapfile; check mmap_shared [ \$? = 0 ]
cat /mnt/trunc >/dev/null
truncate -s 1048576 /mnt/trunc
check truncate_size [ "\$(stat -c %s /mnt/trunc)" = 1048576 ]
check truncate_content [ "\$(md5sum /mnt/trunc | cut -d' ' -f1)" = "$want_t1" ]
truncate -s 5242880 /mnt/trunc
check extend_zeros [ "\$(dd if=/mnt/trunc bs=1M skip=1 count=4 2>/dev/null | md5sum | cut -d' ' -f1)" = "$zeros4m" ]
printf 'EXTENDED' | dd of=/mnt/trunc bs=1 seek=4194304 conv=notrunc 2>/dev/null
check extend_write [ "\$(dd if=/mnt/trunc bs=1 skip=4194304 count=8 2>/dev/null)" = EXTENDED ]
check small_read [ "\$(cat /mnt/small)" = tail-bytes-0123456789 ]
printf 'TAIL' | dd of=/mnt/small bs=1 seek=5 conv=notrunc 2>/dev/null
printf -- '-more' >>/mnt/small
check small_write [ "\$(cat /mnt/small)" = tail-TAILs-0123456789-more ]
fio --name=big --filename=/mnt/big --size=256M --rw=randwrite --bs=64k --ioengine=psync \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --output=/tmp/fio.out >/dev/null 2>&1
frc=\$?
check fio_verify [ \$frc = 0 ] || tail -n 20 /tmp/fio.out
exit \$rc
EOF
log1="$logs/e2e-dax-$(date +%Y%m%d-%H%M%S)-$$.log"
log "run 1: dax=always, 64 MiB window, fio over a 256 MiB file (a few minutes under TCG)"
rc1=0
scripts/vm.sh "${verbose[@]}" -p dax --cache never -a --dax-window=64M -o "dax=always${policy_mo:+,$policy_mo}" \
    -s "$share" --script "$work/run1.sh" -m 1G -T 1200 -l "$log1" >"$work/out1.txt" || rc1=$?
grep -E '^GUEST (PASS|FAIL)' "$work/out1.txt" || true
guest_fail=$(grep -c '^GUEST FAIL' "$work/out1.txt" || true)
counters=$(grep -ao 'dax: maps=.*' "${log1%.log}.daemon.log" | tail -n 1 || true)
log "daemon counters: ${counters:-none}"
declare -A c=()
for kv in ${counters#dax: }; do c[${kv%%=*}]=${kv#*=}; done

if ((rc1 == 0)) && grep -q '^GUEST PASS mount_dax' "$work/out1.txt"; then ok mount_dax; else bad mount_dax "guest run rc=$rc1, see $log1"; fi
grep -q '^GUEST PASS host_write_read' "$work/out1.txt" && ok host_write_read || bad host_write_read "guest md5 differs from the host's"
want_dw=$(cat "$share/dwrite.md5" 2>/dev/null || echo missing)
got_dw=$(dd if="$share/dwrite" bs=1M skip=1 count=2 2>/dev/null | md5)
if [[ $want_dw == "$got_dw" ]] && [[ $(stat -c %s "$share/dwrite") == 4194304 ]] &&
    [[ $(head -c 1048576 "$share/dwrite" | md5) == "$(head -c 1048576 /dev/zero | md5)" ]]; then
    ok dax_write_to_host
else
    bad dax_write_to_host "host bytes 1M..3M md5 $got_dw, guest wrote $want_dw"
fi
grep -q '^GUEST PASS mmap_shared' "$work/out1.txt" && ok mmap_shared || bad mmap_shared "vfstest mmap failed in the guest"
t_ok=1
for g in truncate_size truncate_content extend_zeros extend_write; do
    grep -q "^GUEST PASS $g" "$work/out1.txt" || t_ok=0
done
if ((t_ok)) && [[ $(stat -c %s "$share/trunc") == 5242880 ]] &&
    [[ $(head -c 1048576 "$share/trunc" | md5) == "$want_t1" ]] &&
    [[ $(dd if="$share/trunc" bs=1 skip=4194304 count=8 2>/dev/null) == EXTENDED ]]; then
    ok truncate_extend
else
    bad truncate_extend "guest or host view of the truncated/extended file is wrong"
fi
if grep -q '^GUEST PASS small_read' "$work/out1.txt" && grep -q '^GUEST PASS small_write' "$work/out1.txt" &&
    [[ $(cat "$share/small") == tail-TAILs-0123456789-more ]]; then
    ok small_file_tail
else
    bad small_file_tail "host has '$(cat "$share/small" 2>/dev/null)'"
fi
if grep -q '^GUEST PASS fio_verify' "$work/out1.txt" && [[ $(stat -c %s "$share/big" 2>/dev/null) == 268435456 ]] &&
    ((${c[maps]:-0} >= min_cycles && ${c[unmaps]:-0} >= min_cycles && ${c[failures]:-1} == 0)); then
    ok fio_4x_window
else
    bad fio_4x_window "fio verify in the guest, or counters (${counters:-none}) short of $min_cycles maps/unmaps with 0 failures"
fi
((guest_fail == 0)) || log "guest reported $guest_fail failing step(s); console log $log1"

# ---- run 2: dax=inode with a size policy -------------------------------------------
rm -rf -- "$share" && mkdir -p "$share"
head -c 4096 /dev/urandom >"$share/small1"
head -c 100000 /dev/urandom >"$share/small2"
head -c $((8 * 1024 * 1024)) /dev/urandom >"$share/large"
want=$(cat "$share/small1" "$share/small2" "$share/large" | md5)
log2="$logs/e2e-dax-inode-$(date +%Y%m%d-%H%M%S)-$$.log"
log "run 2: dax=inode, --dax-policy size:1M"
rc2=0
scripts/vm.sh "${verbose[@]}" -p dax --cache never -a --dax-window=64M -a --dax-policy=size:1M ${policy_mo:+-o "$policy_mo"} \
    -s "$share" -m 1G -T 300 -l "$log2" \
    -c "[ \"\$(cat /mnt/small1 /mnt/small2 /mnt/large | md5sum | cut -d' ' -f1)\" = $want ]" >"$work/out2.txt" || rc2=$?
counters2=$(grep -ao 'dax: maps=.*' "${log2%.log}.daemon.log" | tail -n 1 || true)
maps2=$(sed -n 's/.*maps=\([0-9]*\).*/\1/p' <<<"$counters2")
# 8 MiB is four 2 MiB ranges; a mapped small file would add at least one more.
if ((rc2 == 0)) && [[ $maps2 == 4 ]]; then
    ok inode_policy
else
    bad inode_policy "guest rc=$rc2, counters: ${counters2:-none} (want maps=4: the large file only)"
fi

printf 'e2e-dax: %d passed, %d failed\n' "$pass" "$fail"
((fail == 0))
