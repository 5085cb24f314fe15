#!/usr/bin/env bash
# Run fstests in one guest: the Debian 12 root of build-root.sh on a virtio-blk disk (QEMU
# snapshot: the cached image is never written), the project's guest kernel with
# tests/fstests/kernel.fragment, two virtio-fs shares (TEST and SCRATCH, one daemon each),
# and optionally the same tests on ext4 on two virtio-blk disks in the same guest (the
# reference).
#
#   tests/fstests/run.sh [options] TEST... | -f LISTFILE
#
#   -d, --daemon D        daxfsd (target/debug/daxfsd, default), virtiofsd (upstream 1.14,
#                         `make virtiofsd`) or a path; "none" runs only the ext4 reference
#   -p, --profile P       pci (Debian's QEMU, vhost-user-fs-pci; default) or dax (QEMU 11.1,
#                         the DAX window: give -a --dax-window=SIZE and -o dax=always)
#       --cache MODE      daemon --cache=MODE (default auto)
#   -a, --daemon-arg ARG  extra daemon argument (repeatable)
#   -o, --mount-opts O    virtio-fs mount options for TEST and SCRATCH (e.g. dax=always)
#       --ext4            also run the list on ext4 (virtio-blk) in the same guest
#   -b, --backing B       the host file system each share directory lives on: plain (a
#                         directory under TMPDIR, default), ext4, xfs, btrfs (a sparse loop
#                         image each, BACKING_SIZE, default 4G), tmpfs (size BACKING_SIZE),
#                         overlay (lower, upper and work directories under TMPDIR) or nfs
#                         (NFS v4 loopback: the host's nfsd exports a directory under TMPDIR,
#                         mounted from localhost); unmounted and removed on every exit
#   -n, --name NAME       configuration label in the result lines (default: daemon-cache)
#   -f, --list FILE       tests, one per line (# comments)
#       --out DIR         keep fstests' results (the .out.bad, .full, .notrun files) in DIR
#   -T, --timeout SEC     kill the guest after SEC seconds (default 1200)
#   -m, --mem SIZE        guest RAM (default 1536M)
#
# Prints one line per test and file system:
#   FSTEST <name> <fs> <test> passed|failed|notrun|missing [reason]
# then one summary line per file system:
#   FSTESTS <name> <fs> passed=N failed=N notrun=N missing=N
# ("fs" is virtiofs or ext4; "missing": the test gave no result, e.g. the guest died), and
# `CHECK FAIL fstests-<name>/incomplete: ...` when the guest program (guest.sh, with the
# rig's guest helpers) ended without its GUEST END line or disagrees with it.
# Exit status: 0 when every listed test has a result on every file system and none failed;
# 1 when a test failed or is missing or the guest program was cut short; 125 when the rig
# failed (no guest result at all, or the backing file system cannot be set up here: then the
# last line on stderr says why).
set -euo pipefail
RIG_TAG=fstests
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
HERE=$RIG_ROOT/tests/fstests

daemon=daxfsd profile=pci cache=auto mountopts="" ext4=0 name="" listfile="" outdir="" backing=plain
timeout=1200 mem=1536M
daemon_args=() tests=()
need_arg() { (($1 >= 2)) || die "option $2 needs a value (see --help)"; }
while (($#)); do
    case $1 in
        -d|--daemon) need_arg $# "$1"; daemon=$2; shift 2 ;;
        -p|--profile) need_arg $# "$1"; profile=$2; shift 2 ;;
        --cache) need_arg $# "$1"; cache=$2; shift 2 ;;
        -a|--daemon-arg) need_arg $# "$1"; daemon_args+=("$2"); shift 2 ;;
        -o|--mount-opts) need_arg $# "$1"; mountopts=$2; shift 2 ;;
        --ext4) ext4=1; shift ;;
        -b|--backing) need_arg $# "$1"; backing=$2; shift 2 ;;
        -n|--name) need_arg $# "$1"; name=$2; shift 2 ;;
        -f|--list) need_arg $# "$1"; listfile=$2; shift 2 ;;
        --out) need_arg $# "$1"; outdir=$2; shift 2 ;;
        -T|--timeout) need_arg $# "$1"; timeout=$2; shift 2 ;;
        -m|--mem) need_arg $# "$1"; mem=$2; shift 2 ;;
        -h|--help) sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option '$1' (see --help)" ;;
        *) tests+=("$1"); shift ;;
    esac
done
if [[ -n $listfile ]]; then
    [[ -r $listfile ]] || die "test list '$listfile' not readable"
    mapfile -t -O "${#tests[@]}" tests < <(sed 's/#.*//;s/[[:space:]]*$//;/^$/d' "$listfile" | awk '{print $1}')
fi
((${#tests[@]})) || die "no tests given (TEST... or -f LISTFILE)"
for t in "${tests[@]}"; do
    [[ $t =~ ^[a-z0-9]+/[0-9]{3,4}$ ]] || die "bad test name '$t' (want e.g. generic/001)"
done
[[ $timeout =~ ^[0-9]+$ ]] || die "--timeout must be whole seconds"
[[ $mem =~ ^[0-9]+[MG]$ ]] || die "--mem must look like 1536M or 2G"
[[ $mountopts =~ ^[A-Za-z0-9=,_.-]*$ ]] || die "bad --mount-opts '$mountopts'"
[[ $daemon == none && $ext4 == 0 ]] && die "-d none needs --ext4 (nothing to run otherwise)"
[[ -n $name ]] || name="${daemon##*/}-$cache"
[[ $name =~ ^[A-Za-z0-9._+@-]+$ ]] || die "bad --name '$name'"
accel=${ACCEL:-tcg}
backing_size=${BACKING_SIZE:-4G}
[[ $backing_size =~ ^[0-9]+[MG]$ ]] || die "BACKING_SIZE must look like 512M or 4G"
# A backing this host cannot provide is a rig failure, said on the last line, never a skip.
no_backing() { log "FAIL: backing $backing is not available on this host: $*"; exit 125; }
# have_fs TYPE [MODULE]: the kernel knows file system TYPE (after loading MODULE if it can).
have_fs() {
    grep -qw -- "$1" /proc/filesystems && return 0
    modprobe -q -- "${2:-$1}" 2>/dev/null || true
    grep -qw -- "$1" /proc/filesystems
}
case $backing in
    plain) ;;
    ext4|xfs|btrfs|tmpfs|overlay|nfs)
        [[ $daemon != none ]] || die "--backing needs a daemon (-d none runs only ext4)"
        (($(id -u) == 0)) || no_backing "mounting needs root"
        case $backing in
            ext4) need_cmd mkfs.ext4 e2fsprogs ;;
            xfs) need_cmd mkfs.xfs xfsprogs ;;
            btrfs) need_cmd mkfs.btrfs btrfs-progs ;;
        esac
        case $backing in
            ext4|xfs|btrfs) need_cmd losetup mount; have_fs "$backing" ||
                no_backing "the kernel has no $backing (not in /proc/filesystems, no module)" ;;
            tmpfs) have_fs tmpfs || no_backing "the kernel has no tmpfs" ;;
            overlay) have_fs overlay || no_backing "the kernel has no overlayfs" ;;
            nfs)
                have_fs nfs4 nfs || no_backing "the kernel has no NFS v4 client (CONFIG_NFS_FS, CONFIG_NFS_V4; no nfs module)"
                have_fs nfsd || no_backing "the kernel has no NFS server (CONFIG_NFSD; no nfsd module)"
                for c in exportfs rpc.nfsd rpc.mountd; do
                    command -v "$c" >/dev/null ||
                        no_backing "$c missing (Debian package nfs-kernel-server; scripts/provision-deps.sh)"
                done
                command -v mount.nfs4 >/dev/null || no_backing "mount.nfs4 missing (Debian package nfs-common)" ;;
        esac ;;
    *) die "unknown --backing '$backing' (plain, ext4, xfs, btrfs, tmpfs, overlay, nfs)" ;;
esac

case $daemon in
    daxfsd) daemon_bin=$RIG_ROOT/target/debug/daxfsd
        [[ -x $daemon_bin ]] || die "no $daemon_bin; run 'make build'" ;;
    virtiofsd) daemon_bin=$("$RIG_ROOT/scripts/provision-virtiofsd.sh" --print-path)
        [[ -x $daemon_bin ]] || die "upstream virtiofsd is not installed; run 'make virtiofsd'" ;;
    none) daemon_bin="" ;;
    *) [[ -x $daemon ]] || die "daemon '$daemon' is not an executable file"; daemon_bin=$daemon ;;
esac
case $profile in
    pci) qemu=(qemu-system-x86_64); need_cmd qemu-system-x86_64 qemu-system-x86 ;;
    dax) qemu=("$RIG_ROOT/scripts/qemu-11.sh")
        "$RIG_ROOT/scripts/provision-qemu.sh" 11 --print-path >/dev/null ||
            die "profile dax needs QEMU >= 11.1; run 'make qemu'" ;;
    *) die "unknown profile '$profile' (pci or dax)" ;;
esac
need_cmd mkfs.ext4 e2fsprogs
need_cmd debugfs e2fsprogs
kernel=$("$RIG_ROOT/guest-kernel/build.sh" --print-path --fragment "$HERE/kernel.fragment")
[[ -s $kernel ]] || die "fstests guest kernel not built; run 'make fstests-image'"
rootimg=$("$HERE/build-root.sh" --print-path)
[[ -s $rootimg && -f ${rootimg%/*}/.complete ]] || die "fstests root not built; run 'make fstests-image'"

# ---- private state ---------------------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/var/tmp}/daxfsd-fstests.XXXXXX")
pids=() mounts=() exports=() nfsd_started=0 mountd_pid=""
stop_pid() {
    local pid=$1
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
# shellcheck disable=SC2317 # called from the EXIT handler
cleanup_run() {
    local p
    for p in "${pids[@]}"; do stop_pid "$p"; done
    # The shares hold what fstests left (root-owned; with --inode-flags maybe immutable or
    # append-only, from a test that died before its cleanup): ours to remove.
    if [[ " ${daemon_args[*]} " == *" --inode-flags "* ]]; then
        chattr -R -f -i -a -- "$work/test" "$work/scratch" 2>/dev/null || true
    fi
    unmount_backing
    rm -rf --one-file-system -- "$work"
}
# shellcheck disable=SC2317 # called from cleanup_run
unmount_backing() {
    local i m
    # Newest first (NFS mounts before their exports' directories); a busy mount is detached
    # lazily (a loop device frees itself then: autoclear); rm --one-file-system never enters
    # a mount that is left.
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        m=${mounts[i]}
        mountpoint -q -- "$m" || continue
        umount -- "$m" 2>/dev/null || umount -l -- "$m" 2>/dev/null ||
            log "warning: could not unmount $m"
    done
    for m in "${exports[@]}"; do exportfs -u "localhost:$m" 2>/dev/null || true; done
    ((nfsd_started)) && { rpc.nfsd 0 2>/dev/null || true; }
    [[ -z $mountd_pid ]] || stop_pid "$mountd_pid"
    mounts=() exports=()
}
# backing_mount SHARE: make $work/SHARE (the daemon's shared directory) a fresh file system
# of type $backing.
backing_mount() {
    local dir=$work/$1 img=$work/$1.$backing.img base=$work/$1.$backing
    mkdir -p -- "$dir"
    case $backing in
        plain) return 0 ;;
        ext4|xfs|btrfs)
            truncate -s "$backing_size" -- "$img"
            case $backing in
                ext4) mkfs.ext4 -q -F -- "$img" ;;
                xfs) mkfs.xfs -q -f -- "$img" ;;
                btrfs) mkfs.btrfs -q -f -- "$img" ;;
            esac >/dev/null || no_backing "mkfs.$backing failed on $img"
            mounts+=("$dir")
            mount -o loop -t "$backing" -- "$img" "$dir" || no_backing "cannot loop-mount $img" ;;
        tmpfs)
            mounts+=("$dir")
            mount -t tmpfs -o "size=$backing_size,mode=0755" "fst$1" "$dir" || no_backing "cannot mount tmpfs" ;;
        overlay)
            mkdir -p -- "$base/lower" "$base/upper" "$base/work"
            mounts+=("$dir")
            mount -t overlay -o "lowerdir=$base/lower,upperdir=$base/upper,workdir=$base/work" "fst$1" "$dir" ||
                no_backing "cannot mount overlayfs" ;;
        nfs)
            mkdir -p -- "$base"
            if ! mountpoint -q /proc/fs/nfsd; then
                mount -t nfsd nfsd /proc/fs/nfsd || no_backing "cannot mount /proc/fs/nfsd"
            fi
            # The host's own nfsd and mountd when they run; else ours, NFS v4 only (no
            # rpcbind), stopped again on exit.
            if ! pgrep -x rpc.mountd >/dev/null; then
                setsid rpc.mountd -F -N 2 -N 3 </dev/null >"$work/mountd.log" 2>&1 &
                mountd_pid=$!
                sleep 1
                kill -0 "$mountd_pid" 2>/dev/null || no_backing "rpc.mountd did not start: $(tail -n 1 "$work/mountd.log")"
            fi
            if [[ $(cat /proc/fs/nfsd/threads 2>/dev/null) == 0 ]]; then
                rpc.nfsd -N 2 -N 3 4 || no_backing "rpc.nfsd did not start"
                nfsd_started=1
            fi
            exports+=("$base")
            exportfs -i -o "rw,sync,no_root_squash,no_subtree_check,insecure,fsid=$RANDOM$RANDOM" "localhost:$base" ||
                no_backing "exportfs of $base failed"
            mounts+=("$dir")
            mount -t nfs4 -o "vers=4.2,hard" "localhost:$base" "$dir" || no_backing "cannot mount localhost:$base" ;;
    esac
    log "$1: share on $backing ($(findmnt -n -o SOURCE,FSTYPE --target "$dir" | tr -s ' '))"
}
RIG_CLEANUP+=(cleanup_run)

# ---- the control disk: what the guest runs -----------------------------------------------
mkdir -p "$work/ctl"
printf '%s\n' "${tests[@]}" >"$work/ctl/tests"
fslist=()
[[ $daemon != none ]] && fslist+=(virtiofs)
((ext4)) && fslist+=(ext4)
{
    printf 'FSLIST=(%s)\n' "${fslist[*]}"
    printf 'VIRTIOFS_MOUNT_OPTS=%q\n' "$mountopts"
    printf 'RUN_NAME=%q\n' "$name"
} >"$work/ctl/run.conf"
# The rig's guest helpers first (the negative control's count included), then the program.
{ guest_helpers; cat -- "$HERE/guest.sh"; } >"$work/ctl/init.sh"
mkfs.ext4 -q -F -L fstctl -d "$work/ctl" "$work/ctl.img" 512M >/dev/null

# ---- daemons: one per share ----------------------------------------------------------------
# shellcheck disable=SC2054 # commas are QEMU option syntax
qemu_args=(
    -accel "$accel" -cpu "$([[ $accel == kvm ]] && echo host || echo max)" -smp 1 -m "$mem"
    -nodefaults -no-user-config -display none -no-reboot
    -object "memory-backend-memfd,id=mem,size=$mem,share=on" -M q35 -numa node,memdev=mem
    -kernel "$kernel"
    -append "console=ttyS0 8250.nr_uarts=1 root=/dev/vda rw rootfstype=ext4 init=/sbin/fstests-boot panic=-1 loglevel=4"
    -drive "file=$rootimg,if=none,id=root,format=raw,snapshot=on"
    -device virtio-blk-pci,drive=root,serial=fstroot
    -drive "file=$work/ctl.img,if=none,id=ctl,format=raw"
    -device virtio-blk-pci,drive=ctl,serial=fstctl
    -serial "file:$work/console.log" -monitor none
)
if ((ext4)); then
    for d in ext4test ext4scratch; do
        truncate -s 8G "$work/$d.img"
        qemu_args+=(-drive "file=$work/$d.img,if=none,id=$d,format=raw,cache=unsafe"
            -device "virtio-blk-pci,drive=$d,serial=$d")
    done
fi
if [[ $daemon != none ]]; then
    for share in test scratch; do
        tag=fst$share sock=$work/$share.sock
        backing_mount "$share"
        cmd=("$daemon_bin" "--socket-path=$sock" "--shared-dir=$work/$share" "--cache=$cache")
        [[ $profile == dax ]] && cmd+=("--tag=$tag")
        cmd+=("${daemon_args[@]}")
        log "$share: ${cmd[*]}"
        setsid "${cmd[@]}" </dev/null >"$work/$share.daemon.log" 2>&1 &
        pids+=("$!")
        for _ in $(seq 1 200); do [[ -S $sock ]] && break; kill -0 "${pids[-1]}" 2>/dev/null || break; sleep 0.05; done
        [[ -S $sock ]] || { tail -n 20 "$work/$share.daemon.log" >&2; log "FAIL: the $share daemon did not start"; exit 125; }
        qemu_args+=(-chardev "socket,id=vfs$share,path=$sock")
        if [[ $profile == dax ]]; then
            qemu_args+=(-device "vhost-user-test-device-pci,chardev=vfs$share,virtio-id=26,num_vqs=2,config_size=40")
        else
            qemu_args+=(-device "vhost-user-fs-pci,chardev=vfs$share,tag=$tag,queue-size=1024")
        fi
    done
fi

# ---- the guest -------------------------------------------------------------------------------
log "$name: ${#tests[@]} test(s) on ${fslist[*]} (profile $profile, $accel; console $work/console.log)"
setsid "${qemu[@]}" "${qemu_args[@]}" </dev/null >"$work/qemu.out" 2>&1 &
qemu_pid=$!
pids+=("$qemu_pid")
t0=$SECONDS timed_out=0 daemon_died=0
while kill -0 "$qemu_pid" 2>/dev/null; do
    if ((timeout > 0 && SECONDS - t0 > timeout)); then timed_out=1; break; fi
    for p in "${pids[@]:0:${#pids[@]}-1}"; do
        kill -0 "$p" 2>/dev/null || daemon_died=1
    done
    if ((daemon_died)); then
        # A daemon leaves when QEMU disconnects, which races with QEMU's own exit: only a
        # daemon gone while QEMU keeps running died mid-run.
        for _ in $(seq 1 30); do kill -0 "$qemu_pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$qemu_pid" 2>/dev/null || daemon_died=0
        break
    fi
    sleep 1
done
((timed_out)) && log "FAIL: timeout after ${timeout}s"
((daemon_died)) && log "FAIL: a daemon exited while the guest ran"
stop_pid "$qemu_pid"
log "guest done after $((SECONDS - t0))s"

# ---- results -------------------------------------------------------------------------------
if [[ -n $outdir ]]; then
    mkdir -p "$outdir"
    debugfs -R "rdump /results $outdir" "$work/ctl.img" >/dev/null 2>&1 || true
    cp -f -- "$work/console.log" "$outdir/console.log" 2>/dev/null || true
    for share in test scratch; do
        [[ -f $work/$share.daemon.log ]] && cp -f -- "$work/$share.daemon.log" "$outdir/"
    done
fi
# progress_results FS: "TEST STATUS REASON" from ./check's own lines ("generic/002 12s",
# "generic/003 [not run] why", "generic/004 - output mismatch ...", "[failed, ...]") in the
# console between the "=== NAME FS" header of FS and the next header.
progress_results() {
    tr -d '\r' <"$work/console.log" | awk -v hdr="=== $name $1: " '
        index($0, "=== ") == 1 { on = (index($0, hdr) == 1); next }
        !on || $1 !~ /^[a-z0-9]+\/[0-9]+$/ { next }
        { t = $1; r = $0; sub(/^[^ ]+ +/, "", r) }
        /\[not run\]|\[expunged\]/ { sub(/^[^[]*\[[a-z ]*\] */, "", r); print t "\tnotrun\t" r; next }
        / - output mismatch|\[failed/ { sub(/ *\(see .*/, "", r); print t "\tfailed\t" r; next }
        $NF ~ /^[0-9]+s$/ { print t "\tpassed\t" }'
}
guest_rc=$(grep -ao '@@FSTESTS-GUEST-EXIT rc=[0-9]*@@' "$work/console.log" | tail -n 1 | tr -dc 0-9 || true)
tr -d '\r' <"$work/console.log" >"$work/guest.out" 2>/dev/null || true
rc=0 any=0
for fs in "${fslist[@]}"; do
    declare -A res=() why=()
    while IFS= read -r line; do
        # GUEST PASS fs/test | GUEST FAIL fs/test: reason | GUEST SKIP fs/test: reason
        line=${line#GUEST }
        k=${line%% *} line=${line#* } r=""
        [[ $line == *": "* ]] && r=${line#*: }
        line=${line%%: *}
        [[ ${line%%/*} == "$fs" ]] || continue
        t=${line#*/}
        case $k in PASS) s=passed ;; FAIL) s=failed ;; *) s=notrun ;; esac
        res[$t]=$s why[$t]=$r
    done < <(grep -aE '^GUEST (PASS|FAIL|SKIP) ' "$work/guest.out" || true)
    if ((${#res[@]} == 0)); then
        # No summary for this file system (the guest was stopped or died during ./check):
        # take the results ./check printed per test so far; the test it was in is missing.
        while read -r t s r; do res[$t]=$s why[$t]=$r; done < <(progress_results "$fs")
    fi
    np=0 nf=0 nn=0 nm=0
    for t in "${tests[@]}"; do
        s=${res[$t]:-missing}
        case $s in
            passed) np=$((np + 1)) ;;
            failed) nf=$((nf + 1)) ;;
            notrun) nn=$((nn + 1)) ;;
            *) s=missing; nm=$((nm + 1)) ;;
        esac
        [[ $s == missing ]] || any=1
        printf 'FSTEST %s %s %s %s%s\n' "$name" "$fs" "$t" "$s" "${why[$t]:+ ${why[$t]}}"
    done
    printf 'FSTESTS %s %s passed=%d failed=%d notrun=%d missing=%d\n' "$name" "$fs" "$np" "$nf" "$nn" "$nm"
    ((nf + nm == 0)) || rc=1
    unset res why
done
# The guest program must have ended with its GUEST END line, in agreement with its checks
# (scripts/lib.sh): else CHECK FAIL fstests-NAME/incomplete, and under the negative control
# (RIG_SUBSUITE_DIE_AFTER) the run stops here.
RIG_LABEL=fstests-$name
subsuite_end "fstests-$name" "$work/guest.out" "${guest_rc:-125}" 0 guest
((RIG_FAIL == 0)) || rc=1
if ((timed_out || daemon_died)) || [[ -z $guest_rc ]] || ((any == 0)); then
    printf -- '--- last 30 console lines ---\n' >&2
    tail -n 30 "$work/console.log" >&2 || true
    for share in test scratch; do
        [[ -s $work/$share.daemon.log ]] || continue
        printf -- '--- last 10 lines of the %s daemon log ---\n' "$share" >&2
        tail -n 10 "$work/$share.daemon.log" >&2
    done
    ((any)) || { log "FAIL: the guest gave no test result (rig failure)"; exit 125; }
    rc=1
fi
exit "$rc"
