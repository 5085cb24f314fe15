#!/usr/bin/env bash
# shellcheck disable=SC2015 # "grep && ok || bad": ok never fails
# DAX end to end: QEMU 11.1 (profile dax, TCG) + daxfsd with a DAX window, checked in the
# guest and on the host after the VM exits.
#
#   tests/e2e/dax.sh [-v] [--dax-policy hybrid|upstream] [--dax-copy auto|always|off]
#                    [--dax-mapping direct|pooled]
#
# --dax-policy mounts with -o dax_policy=P (guest-kernel/patches: the window policy; the
# kernel's default is hybrid); without it the kernel's default policy is checked. fio_4x_window
# wants 1,000 maps and unmaps with upstream (a remap per miss), 100 with hybrid (random misses go
# to FUSE_READ/WRITE unless a range proves hot; the sequential md5 pass after fio is a stream,
# which maps the whole file through the window: 128 ranges of 2 MiB through 32 with upstream,
# 512 of 512 KiB through 128 with hybrid).
# --dax-copy M runs every daemon with --dax-copy=M (read-only ranges as copy slots; default
# auto). With `always`, fio_4x_window also wants copy slots placed and parked ones reused.
# --dax-mapping M runs every daemon with --dax-mapping=M (default direct here; pooled is the
# daemon's default, which `make test-dax-policy` runs): with pooled, mmap_verify_churn does
# not want commit waits (one SHMEM_MAP per session) and every window_<size> wants its ranges
# pooled.
#
# Run 1, `-o dax=always`, 64 MiB window, --cache never:
#   mount_dax          the mount really is dax=always and the guest saw the window
#   dax_range          /proc/mounts shows the policy's range size (hybrid: 512k for the 64 MiB
#                      window, upstream: 2048k) and a mount with dax_range=3k is refused
#   host_write_read    a file written on the host before boot reads back intact
#   dax_write_to_host  bytes written through DAX are in the host file after the VM exits
#   mmap_shared        MAP_SHARED read/write coherent with read()/write()
#   truncate_extend    truncate and extend of a mapped file (content and size, both sides)
#   small_file_tail    a file that ends mid-page (shadow tail) reads and writes correctly
#   fio_4x_window      fio verify=crc32c over a file 4x the window, then a sequential md5 of it
#                      in the guest equal to the host's (reclaim: hundreds to thousands of maps
#                      and unmaps, zero failures in the daemon's counters)
# Run 2, `-o dax=inode` (the guest's default) with --dax-policy size:1M:
#   inode_policy       only the large file is mapped
# Run 3, `-o dax=always`, daemon with --modcaps=-dac_override (files the daemon cannot map
# writable; host and guest coherence):
#   immutable_read     a `chattr +i` file reads with the host's checksum
#   ro0444_read        a 0444 file (no DAC override in the daemon) reads with the host's checksum
#   running_bin_read   a binary a host process is running reads with the host's checksum
#   host_exec          the host executes a file the guest has just read through DAX
#   grown_on_host      a file grown on the host past its last page while the guest has that
#                      range mapped reads the host's new bytes in the guest
#   tail_both_survive  guest bytes stored into a tail page and host bytes written elsewhere in
#                      the same page both end up in the file (and the guest sees the host's)
#   host_rewrite_seen  a file the guest read (mapped read-only: a copy slot with --dax-copy)
#                      and the host then rewrote in place reads the host's bytes when the
#                      guest opens it again (close-to-open)
# Run 4, `-o dax=always`, --cache auto (the guest caches attributes for 1 s):
#   mmap_mtime         stores through a shared mapping move mtime and ctime as the guest sees
#                      them by the next msync, fsync or munmap (after a read fault, a store to a
#                      page stored to before, another page, after close), and a write(2) inside
#                      the file at once; in a 64 KiB file (whole pages: the host page cache) and
#                      a 6000-byte one (its last page a shadow tail); still so after the
#                      attribute timeout; the host files' mtimes are the guest's last ones
# Run 4b, `-o dax=always`, 64 MiB window, --cache never, two shell loops of lookups running:
#   mmap_verify_churn  fio mmap randwrite, crc32c verify_backlog, over a 128 MiB file for 30 s:
#                      no verify error (the first load or store after a page fault's
#                      SETUPMAPPING reaches the mapping, not a hole: QEMU 11.1 acks SHMEM_MAP
#                      before it commits it and the daemon waits for the commit), and the
#                      daemon waited for commits (commit_waits > 0 in its counters)
# Runs 5-7 (run 5 per window), `-o dax=always`, windows of 1G, 2G and 8G, --cache auto (inodes,
# and with the upstream policy their mapped ranges, stay). With the hybrid policy the guest maps
# the window over 128 (8, 16 and 64 MiB ranges, 128 of them: within daxfsd's budget of 445
# frontend mappings, so --dax-mapping=direct maps them directly); with upstream, 2 MiB ranges
# (512 to 4096 of them, more than the budget: served pooled, one frontend mapping):
#   window_<size>      /proc/mounts shows the policy's dax_range for the window (hybrid: 8192k,
#                      16384k, 65536k; upstream: 2048k); 700 small files read, then one page of
#                      every range of a sparse file through an mmap that stays (550 ranges, each
#                      a SETUPMAPPING: more than the window holds, and with 2 MiB ranges past
#                      QEMU 11.1's 512 memory regions if each were a frontend mapping, the abort
#                      of issue #20), then fio verify over psync and mmap: no QEMU abort, no guest
#                      I/O error, digests equal the host's, maps >= 550 and 0 failures in the
#                      daemon's counters, the frontend's memory table (peak_table_regions in the
#                      daemon's log) under QEMU's 512 regions, the window's mappings
#                      (peak_regions) within the budget, and direct (pooled=0) with hybrid, pooled
#                      (pooled >= 550) with upstream
# Without a VM:
#   window_768M        --dax-window=768M is refused with the two nearest sizes; no QEMU started
# Ends with "e2e-dax: N passed, M failed"; exits non-zero on any failure.
set -euo pipefail
RIG_TAG=e2e-dax
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$RIG_ROOT"

verbose=() policy_mo="" copy_mode="" mapping=direct
while (($#)); do
    case $1 in
        -v) verbose=(-v); shift ;;
        --dax-policy) [[ ${2:-} == hybrid || ${2:-} == upstream ]] || die "--dax-policy needs hybrid or upstream"
            policy_mo=dax_policy=$2; shift 2 ;;
        --dax-copy) [[ ${2:-} =~ ^(auto|always|off)$ ]] || die "--dax-copy needs auto, always or off"
            copy_mode=$2; shift 2 ;;
        --dax-mapping) [[ ${2:-} =~ ^(direct|pooled)$ ]] || die "--dax-mapping needs direct or pooled"
            mapping=$2; shift 2 ;;
        *) die "unknown argument '$1' (use -v, --dax-policy hybrid|upstream, --dax-copy auto|always|off, --dax-mapping direct|pooled)" ;;
    esac
done
# Daemon arguments for every run.
# By default these runs test direct (zero-copy) mappings: the commit wait, copy slots,
# coherence through live mappings, the budget; the 1G-8G windows below are direct with the
# hybrid policy's ranges and pooled with upstream's. The daemon's default (pooled) runs them
# with --dax-mapping pooled, the whole guest suite in `make test-dax` and the pauses under
# churn in lifecycle.sh (pause-dax-churn).
[[ $mapping == pooled && $copy_mode == always ]] && die "--dax-copy always is for direct mappings"
dargs=(-a "--dax-mapping=$mapping")
[[ -n $copy_mode ]] && dargs+=(-a "--dax-copy=$copy_mode")
min_cycles=100 want_range=512k
[[ $policy_mo == dax_policy=upstream ]] && min_cycles=1000 want_range=2048k
need_cmd python3
# ok, bad, check, md5, guest_complete and rig_summary come from scripts/lib.sh; the guest
# scripts' check, waitfor and guest_end from tests/e2e/guest/lib.sh (scripts/vm.sh sends them).

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
grep -q 'virtiofs.*dax=always' /proc/mounts && dmesg | grep -q 'Cache len'; check mount_dax [ \$? = 0 ]
tag=\$(awk '\$2 == "/mnt" { print \$1 }' /proc/mounts)
mkdir -p /tmp/m2
grep -q ' /mnt virtiofs .*dax_range=$want_range' /proc/mounts && ! mount -t virtiofs -o dax=always,dax_range=3k "\$tag" /tmp/m2 2>/dev/null
check dax_range [ \$? = 0 ] || grep virtiofs /proc/mounts
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
# A sequential pass over the same file: a stream, which every policy maps range by range
# (upstream: 128 ranges of 2 MiB through a 32-range window; hybrid: 512 of 512 KiB through
# 128); the host compares the digest after the VM exits.
md5sum /mnt/big | cut -d' ' -f1 >/mnt/big.guest.md5
guest_end
EOF
log1="$logs/e2e-dax-$(date +%Y%m%d-%H%M%S)-$$.log"
log "run 1: dax=always, 64 MiB window, fio over a 256 MiB file (a few minutes under TCG)"
rc1=0
scripts/vm.sh "${verbose[@]}" -p dax --cache never -a --dax-window=64M "${dargs[@]}" -o "dax=always${policy_mo:+,$policy_mo}" \
    -s "$share" --script "$work/run1.sh" -m 1G -T 1200 -l "$log1" >"$work/out1.txt" || rc1=$?
guest_complete run1 "$work/out1.txt" "$rc1"
guest_fail=$(grep -c '^GUEST FAIL' "$work/out1.txt" || true)
counters=$(grep -ao 'dax: maps=.*' "${log1%.log}.daemon.log" | tail -n 1 || true)
log "daemon counters: ${counters:-none}"
declare -A c=()
for kv in ${counters#dax: }; do c[${kv%%=*}]=${kv#*=}; done

if ((rc1 == 0)) && grep -q '^GUEST PASS mount_dax' "$work/out1.txt"; then ok mount_dax; else bad mount_dax "guest run rc=$rc1, see $log1"; fi
grep -q '^GUEST PASS dax_range' "$work/out1.txt" && ok dax_range || bad dax_range "/proc/mounts lacks dax_range=$want_range, or dax_range=3k was accepted"
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
big_guest=$(cat "$share/big.guest.md5" 2>/dev/null || echo missing)
big_host=$(md5 "$share/big" 2>/dev/null || echo none)
if grep -q '^GUEST PASS fio_verify' "$work/out1.txt" && [[ $(stat -c %s "$share/big" 2>/dev/null) == 268435456 ]] &&
    [[ $big_guest == "$big_host" ]] &&
    ((${c[maps]:-0} >= min_cycles && ${c[unmaps]:-0} >= min_cycles && ${c[failures]:-1} == 0)) &&
    { [[ $copy_mode != always ]] || ((${c[copies]:-0} > 0 && ${c[reused]:-0} > 0)); }; then
    ok fio_4x_window
else
    bad fio_4x_window "fio verify in the guest, guest md5 $big_guest vs host $big_host, or counters (${counters:-none}) short of $min_cycles maps/unmaps with 0 failures${copy_mode:+ (--dax-copy=$copy_mode: copies and reused > 0 with always)}"
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
scripts/vm.sh "${verbose[@]}" -p dax --cache never -a --dax-window=64M -a --dax-policy=size:1M "${dargs[@]}" ${policy_mo:+-o "$policy_mo"} \
    -s "$share" -m 1G -T 300 -l "$log2" \
    -c "[ \"\$(cat /mnt/small1 /mnt/small2 /mnt/large | md5sum | cut -d' ' -f1)\" = $want ]" >"$work/out2.txt" || rc2=$?
counters2=$(grep -ao 'dax: maps=.*' "${log2%.log}.daemon.log" | tail -n 1 || true)
maps2=$(sed -n 's/.*maps=\([0-9]*\).*/\1/p' <<<"$counters2")
# 8 MiB is 16 ranges of 512 KiB (hybrid) or 4 of 2 MiB (upstream); a mapped small file would
# add at least one more.
want_maps2=$(((8 << 20) / (${want_range%k} << 10)))
if ((rc2 == 0)) && [[ $maps2 == "$want_maps2" ]]; then
    ok inode_policy
else
    bad inode_policy "guest rc=$rc2, counters: ${counters2:-none} (want maps=$want_maps2: the large file only)"
fi

# ---- run 3: files the daemon cannot map writable; host and guest in one page ---------
rm -rf -- "$share" && mkdir -p "$share"
head -c $((3 * 1024 * 1024 + 777)) /dev/urandom >"$share/imm"
chattr +i "$share/imm" || bad immutable_read "chattr +i failed on $(df --output=fstype "$share" | tail -n 1)"
binpid=""
# (set -e applies in the trap too: a command failing there would fail the run.)
trap 'chattr -i "$share/imm" 2>/dev/null || true; [[ -z $binpid ]] || kill "$binpid" 2>/dev/null || true; rm -rf -- "$work"' EXIT
head -c 300000 /dev/urandom >"$share/ro0444" && chmod 0444 "$share/ro0444"
cp /bin/sleep "$share/runbin" && chmod 0755 "$share/runbin"
"$share/runbin" 900 &
binpid=$!
printf '#!/bin/sh\necho host-ran-it\n' >"$share/prog.sh" && chmod 0755 "$share/prog.sh"
head -c 5000 /dev/urandom >"$share/grow"
head -c 6000 /dev/zero | tr '\0' '.' >"$share/page"
head -c $((3 * 1024 * 1024)) /dev/urandom >"$share/rew"
want_imm=$(md5 "$share/imm") want_ro=$(md5 "$share/ro0444") want_bin=$(md5 "$share/runbin")
cat >"$work/run3.sh" <<EOF
check immutable_read [ "\$(md5sum /mnt/imm | cut -d' ' -f1)" = "$want_imm" ]
check ro0444_read [ "\$(md5sum /mnt/ro0444 | cut -d' ' -f1)" = "$want_ro" ]
check running_bin_read [ "\$(md5sum /mnt/runbin | cut -d' ' -f1)" = "$want_bin" ]
md5sum /mnt/prog.sh >/dev/null
md5sum /mnt/grow >/dev/null
# Held open, so the inode (and its mapped ranges) stays while the host rewrites it.
exec 3</mnt/rew
md5sum /mnt/rew >/dev/null
printf 'GUEST' | dd of=/mnt/page bs=1 seek=4100 conv=notrunc 2>/dev/null
echo "@@E2E-DAX-READ@@"
waitfor /mnt/host.done 120
check host_exec [ "\$(cat /mnt/host.done)" = host-ran-it ]
check grown_on_host [ "\$(md5sum /mnt/grow | cut -d' ' -f1)" = "\$(cat /mnt/grow.md5)" ]
check host_rewrite_seen [ "\$(md5sum /mnt/rew | cut -d' ' -f1)" = "\$(cat /mnt/rew.md5)" ]
exec 3<&-
sync
check tail_guest_sees_host [ "\$(dd if=/mnt/page bs=1 skip=5000 count=4 2>/dev/null)" = HOST ]
check tail_guest_kept [ "\$(dd if=/mnt/page bs=1 skip=4100 count=5 2>/dev/null)" = GUEST ]
guest_end
EOF
log3="$logs/e2e-dax-files-$(date +%Y%m%d-%H%M%S)-$$.log"
log "run 3: immutable, 0444 without DAC override, running binary; host exec; host and guest in one page"
rc3=0
scripts/vm.sh "${verbose[@]}" -p dax --cache never -a --dax-window=64M -a --modcaps=-dac_override "${dargs[@]}" \
    -o dax=always -s "$share" --script "$work/run3.sh" -m 1G -T 600 -l "$log3" >"$work/out3.txt" &
vmpid=$!
# The host side, while the guest waits: execute the file the guest read, grow a file past
# its last page, write into the page the guest stored into.
for _ in $(seq 1 1200); do
    grep -q '@@E2E-DAX-READ@@' "$log3" 2>/dev/null && break
    kill -0 "$vmpid" 2>/dev/null || break
    sleep 0.5
done
"$share/prog.sh" >"$work/exec.out" 2>&1 || true
head -c 9000 /dev/urandom | dd of="$share/grow" bs=1 seek=5000 conv=notrunc 2>/dev/null
md5 "$share/grow" >"$share/grow.md5"
head -c 100000 /dev/urandom | dd of="$share/rew" bs=4096 seek=100 conv=notrunc 2>/dev/null
md5 "$share/rew" >"$share/rew.md5"
printf 'HOST' | dd of="$share/page" bs=1 seek=5000 conv=notrunc 2>/dev/null
cp "$work/exec.out" "$share/host.done.tmp" && mv "$share/host.done.tmp" "$share/host.done"
wait "$vmpid" || rc3=$?
kill "$binpid" 2>/dev/null || true
binpid=""
guest_complete run3 "$work/out3.txt" "$rc3"
for g in immutable_read ro0444_read running_bin_read; do
    if grep -q "^GUEST PASS $g" "$work/out3.txt"; then ok "$g"; else bad "$g" "guest checksum differs from the host's (rc=$rc3, see $log3)"; fi
done
if [[ $(cat "$work/exec.out") == host-ran-it ]] && grep -q '^GUEST PASS host_exec' "$work/out3.txt"; then
    ok host_exec
else
    bad host_exec "host exec of a file the guest read: '$(head -c 200 "$work/exec.out")'"
fi
if grep -q '^GUEST PASS grown_on_host' "$work/out3.txt"; then ok grown_on_host; else bad grown_on_host "guest read of the grown file differs from the host's"; fi
counters3=$(grep -ao 'dax: maps=.*' "${log3%.log}.daemon.log" | tail -n 1 || true)
recopied3=$(sed -n 's/.*recopied=\([0-9]*\).*/\1/p' <<<"$counters3")
# With --dax-copy=always the rewritten file's copies must have been re-read in place.
if grep -q '^GUEST PASS host_rewrite_seen' "$work/out3.txt" && { [[ $copy_mode != always ]] || ((${recopied3:-0} > 0)); }; then
    ok host_rewrite_seen
else
    bad host_rewrite_seen "guest read of the file rewritten on the host differs from the host's, or no copy re-read (${counters3:-no counters})"
fi
if grep -q '^GUEST PASS tail_guest_sees_host' "$work/out3.txt" && grep -q '^GUEST PASS tail_guest_kept' "$work/out3.txt" &&
    [[ $(dd if="$share/page" bs=1 skip=4100 count=5 2>/dev/null) == GUEST ]] &&
    [[ $(dd if="$share/page" bs=1 skip=5000 count=4 2>/dev/null) == HOST ]] && [[ $(stat -c %s "$share/page") == 6000 ]]; then
    ok tail_both_survive
else
    bad tail_both_survive "host file has '$(dd if="$share/page" bs=1 skip=4100 count=5 2>/dev/null)' at 4100 and '$(dd if="$share/page" bs=1 skip=5000 count=4 2>/dev/null)' at 5000"
fi
chattr -i "$share/imm" 2>/dev/null || true

# ---- run 4: times after stores through the window, attributes cached ------------------
# A share of its own: the EXIT trap still runs chattr -i on run 3's file.
share5=$work/share-mtime
mkdir -p "$share5"
log5="$logs/e2e-dax-mtime-$(date +%Y%m%d-%H%M%S)-$$.log"
log "run 4: dax=always, --cache auto: mtime/ctime after stores through mappings (about 30 s in the guest)"
cat >"$work/run5.sh" <<'EOF'
/e2e/vfstest mmapmtime /mnt/whole 65536 && /e2e/vfstest mmapmtime /mnt/tail 6000 &&
    stat -c '%n %Y' /mnt/whole /mnt/tail
EOF
rc5=0
scripts/vm.sh "${verbose[@]}" -p dax --cache auto -a --dax-window=64M "${dargs[@]}" -o "dax=always${policy_mo:+,$policy_mo}" \
    -s "$share5" --script "$work/run5.sh" -m 1G -T 300 -l "$log5" >"$work/out5.txt" 2>&1 || rc5=$?
guest_t=$(grep -E '^/mnt/(whole|tail) [0-9]+$' "$work/out5.txt" | sed 's,^/mnt/,,' | sort)
host_t=$(cd "$share5" && stat -c '%n %Y' whole tail 2>/dev/null | sort)
if ((rc5 == 0)) && [[ -n $guest_t && $guest_t == "$host_t" ]]; then
    ok mmap_mtime
else
    bad mmap_mtime "rc=$rc5: $(grep -a 'vfstest' "$work/out5.txt" | tail -n 2 | tr '\n' '|') guest '$guest_t' host '$host_t' (see $log5)"
fi
# ---- run 4b: mmap stores and loads right after their SETUPMAPPING -------------------------
# QEMU 11.1 acknowledges SHMEM_MAP before it commits the mapping: a daemon that answered the
# guest at the ack let the first access after a fault reach a hole of the window (loads read
# zeros, stores were dropped). fio failed with EILSEQ within 10-20 s here while other requests
# kept the guest's virtqueue busy (its completion work then sees a reply without waiting for
# the interrupt, which QEMU injects only after the commit).
share6=$work/share-churn
mkdir -p "$share6"
: >"$share6/x"
log6="$logs/e2e-dax-churn-$(date +%Y%m%d-%H%M%S)-$$.log"
log "run 4b: dax=always, --cache never, fio mmap verify over 2x the window with lookups running (about 60 s)"
cat >"$work/run6.sh" <<'EOF'
( while [ ! -e /mnt/stop ]; do [ -e /mnt/x ]; done ) &
( while [ ! -e /mnt/stop ]; do [ -e /mnt/x ]; done ) &
fio --name=m --filename=/mnt/ws --size=128M --rw=randwrite --bs=64k --ioengine=mmap --verify=crc32c \
    --verify_backlog=256 --verify_fatal=1 --time_based --runtime=30 --output=/tmp/fio6.out >/tmp/fio6.err 2>&1
frc=$?
touch /mnt/stop
wait
echo "fio rc=$frc"
[ $frc = 0 ] || grep -h 'err=\|verify\|bad' /tmp/fio6.out /tmp/fio6.err | head -n 6
exit $frc
EOF
rc6=0
scripts/vm.sh "${verbose[@]}" -p dax --cache never -a --dax-window=64M "${dargs[@]}" -o "dax=always${policy_mo:+,$policy_mo}" \
    -s "$share6" --script "$work/run6.sh" -m 1G -T 300 -l "$log6" >"$work/out6.txt" 2>&1 || rc6=$?
waits6=$(grep -ao 'commit_waits=[0-9]*' "${log6%.log}.daemon.log" 2>/dev/null | tail -n 1 || true)
# Pooled: one SHMEM_MAP for the session, which may or may not have had to wait.
if ((rc6 == 0)) && grep -aq '^fio rc=0' "$work/out6.txt" && { [[ $mapping == pooled ]] || [[ ${waits6#commit_waits=} -gt 0 ]]; }; then
    ok mmap_verify_churn
else
    bad mmap_verify_churn "rc=$rc6, ${waits6:-no commit_waits in the daemon log}: $(grep -a 'fio rc\|err=\|verify' "$work/out6.txt" | head -n 4 | tr '\n' '|') (see $log6)"
fi
rm -rf -- "$share6"
# ---- runs 5-7: windows with more 2 MiB ranges than QEMU's memory slots ---------------
rm -rf -- "$share" && mkdir -p "$share/small"
for i in $(seq 1 700); do head -c $((4096 + i)) /dev/urandom >"$share/small/s$i"; done
want_small=$(for i in $(seq 1 700); do cat "$share/small/s$i"; done | md5)
# Sparse past its first 64 MiB: the strided read maps 550 ranges (of up to 64 MiB: hybrid, 8G
# window) without their I/O.
head -c $((64 * 1024 * 1024)) /dev/urandom >"$share/huge"
truncate -s $((550 * 64))M "$share/huge"
want_huge=$(head -c $((64 * 1024 * 1024)) "$share/huge" | md5)
budget=445
cat >"$work/runwin.sh" <<EOF
r=\$(sed -n 's,.* /mnt virtiofs .*dax_range=\([0-9]*\)k.*,\1,p' /proc/mounts)
echo "GUEST RANGE \${r}k"
check small_read [ "\$(for i in \$(seq 1 700); do cat /mnt/small/s\$i; done | md5sum | cut -d' ' -f1)" = "$want_small" ]
# One page of every range through one mmap (page faults map under either policy).
fio --name=s --filename=/mnt/huge --size=\$((550 * r))k --rw=read:\$((r - 4))k --bs=4k --number_ios=550 \
    --ioengine=mmap --output=/tmp/fio0.out >/dev/null 2>&1
check huge_strided [ \$? = 0 ] || tail -n 5 /tmp/fio0.out
check huge_read [ "\$(head -c 67108864 /mnt/huge | md5sum | cut -d' ' -f1)" = "$want_huge" ]
fio --name=p --filename=/mnt/fio-psync --size=16M --rw=randwrite --bs=64k --ioengine=psync \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --output=/tmp/fio1.out >/dev/null 2>&1
check fio_psync [ \$? = 0 ] || tail -n 5 /tmp/fio1.out
fio --name=m --filename=/mnt/fio-mmap --size=16M --rw=randwrite --bs=64k --ioengine=mmap \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --output=/tmp/fio2.out >/dev/null 2>&1
check fio_mmap [ \$? = 0 ] || tail -n 5 /tmp/fio2.out
check no_io_error [ "\$(dmesg | grep -ci 'virtiofs.*error\\|I/O error')" = 0 ]
guest_end
EOF
for win in 1G 2G 8G; do
    # The guest's ranges: hybrid, the window over 128; upstream, 2 MiB.
    case $policy_mo:$win in
        dax_policy=upstream:*) want_win_range=2048k ;;
        *:1G) want_win_range=8192k ;;
        *:2G) want_win_range=16384k ;;
        *:8G) want_win_range=65536k ;;
    esac
    logw="$logs/e2e-dax-win$win-$(date +%Y%m%d-%H%M%S)-$$.log"
    log "run: dax=always, $win window, dax_range=$want_win_range: 700 files, 550 ranges of one file, fio"
    rcw=0
    scripts/vm.sh "${verbose[@]}" -p dax --cache auto -a "--dax-window=$win" "${dargs[@]}" -o "dax=always${policy_mo:+,$policy_mo}" \
        -s "$share" --script "$work/runwin.sh" -m 1G -T 600 -l "$logw" >"$work/outwin.txt" || rcw=$?
    guest_complete "window_$win" "$work/outwin.txt" "$rcw"
    countersw=$(grep -ao 'dax: maps=.*' "${logw%.log}.daemon.log" | tail -n 1 || true)
    log "daemon counters ($win): ${countersw:-none}"
    declare -A cw=()
    for kv in ${countersw#dax: }; do cw[${kv%%=*}]=${kv#*=}; done
    g_ok=1
    for g in small_read huge_strided huge_read fio_psync fio_mmap no_io_error; do
        grep -q "^GUEST PASS $g" "$work/outwin.txt" || g_ok=0
    done
    got_range=$(sed -n 's/^GUEST RANGE //p' "$work/outwin.txt" | tail -n 1)
    # Direct with the hybrid policy's ranges (nothing pooled), pooled with upstream's, and
    # with --dax-mapping pooled.
    if [[ $want_win_range == 2048k || $mapping == pooled ]]; then
        how_ok=$((${cw[pooled]:-0} >= 550)) want_how="pooled>=550"
    else
        how_ok=$((${cw[pooled]:-1} == 0)) want_how="pooled=0"
    fi
    if ((rcw == 0 && g_ok && how_ok)) && [[ $got_range == "$want_win_range" ]] &&
        ((${cw[maps]:-0} >= 550 && ${cw[failures]:-1} == 0)) &&
        ((${cw[peak_regions]:-999} <= budget && ${cw[peak_table_regions]:-999} > 0 && ${cw[peak_table_regions]:-999} < 512)) &&
        ! grep -qa 'Assertion' "$logw" "$work/outwin.txt"; then
        ok "window_$win"
    else
        bad "window_$win" "vm rc=$rcw, guest checks $(grep -c '^GUEST PASS' "$work/outwin.txt")/6, dax_range ${got_range:-none} (want $want_win_range), counters ${countersw:-none} (want maps>=550, failures=0, $want_how, peak_regions<=$budget, peak_table_regions<512), see $logw"
    fi
    rm -f "$share/fio-psync" "$share/fio-mmap"
done

# ---- --dax-window 768M: refused at start, no QEMU ----------------------------------
log4="$logs/e2e-dax-768-$(date +%Y%m%d-%H%M%S)-$$.log"
rc4=0
scripts/vm.sh -p dax -a --dax-window=768M -s "$share" -c true -T 60 -l "$log4" >"$work/out4.txt" 2>&1 || rc4=$?
if ((rc4 != 0)) && grep -q 'is not a power of two' "$work/out4.txt" && grep -q 'use 512M or 1G' "$work/out4.txt" &&
    [[ ! -s $log4 ]]; then
    ok window_768M
else
    bad window_768M "rc=$rc4, console log $(stat -c %s "$log4" 2>/dev/null || echo 0) bytes: $(tail -n 3 "$work/out4.txt")"
fi

rig_summary e2e-dax
