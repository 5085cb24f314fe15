#!/bin/bash
# In the fstests guest (written to the control disk as init.sh by run.sh, after the rig's
# guest helpers, tests/e2e/guest/lib.sh; started by /sbin/fstests-boot): run the listed
# tests with fstests' ./check on each file system of run.conf (virtiofs: tags fsttest and
# fstscratch; ext4: the virtio-blk disks with serials ext4test and ext4scratch), results
# under /ctl/results/FS, and print one guest check per test on the console for the host:
#   GUEST PASS FS/TEST | GUEST FAIL FS/TEST: REASON | GUEST SKIP FS/TEST: REASON (not run)
# then `GUEST END pass=N fail=M skip=K` (guest_end): without it the host knows the run was
# cut short.
set -u
# shellcheck source=/dev/null
source /ctl/run.conf
mapfile -t TESTS </ctl/tests
cd /opt/xfstests || { bad setup "no /opt/xfstests"; guest_end; }
mkdir -p /mnt/test /mnt/scratch /ctl/results
# Loopback up (no iproute2 in the root): fstests' lock tests (generic/131) talk over TCP to
# localhost. SIOCSIFFLAGS (0x8914) with IFF_UP|IFF_RUNNING; the kernel gives lo 127.0.0.1.
python3 -c 'import fcntl, socket, struct
fcntl.ioctl(socket.socket(), 0x8914, struct.pack("16sh22x", b"lo", 0x41))' ||
    echo "loopback: could not bring lo up"
# The shares and disks start empty each run; fstests wants no leftovers of another run.
disk() { # disk SERIAL: /dev/vdX with that virtio-blk serial
    local s
    for s in /sys/block/vd*/serial; do
        [[ $(cat "$s") == "$1" ]] && { s=${s#/sys/block/}; echo "/dev/${s%/serial}"; return 0; }
    done
    return 1
}

for fs in "${FSLIST[@]}"; do
    cfg=/ctl/$fs.config
    case $fs in
        virtiofs)
            {
                echo "export FSTYP=virtiofs"
                echo "export TEST_DEV=fsttest TEST_DIR=/mnt/test"
                echo "export SCRATCH_DEV=fstscratch SCRATCH_MNT=/mnt/scratch"
                if [[ -n $VIRTIOFS_MOUNT_OPTS ]]; then
                    echo "export MOUNT_OPTIONS='-o $VIRTIOFS_MOUNT_OPTS'"
                    echo "export TEST_FS_MOUNT_OPTS='-o $VIRTIOFS_MOUNT_OPTS'"
                fi
            } >"$cfg" ;;
        ext4)
            if ! tdev=$(disk ext4test) || ! sdev=$(disk ext4scratch); then
                bad "ext4/setup" "ext4 disks missing"; continue
            fi
            mkfs.ext4 -q -F "$tdev" || { bad "ext4/setup" "mkfs.ext4 $tdev failed"; continue; }
            {
                echo "export FSTYP=ext4"
                echo "export TEST_DEV=$tdev TEST_DIR=/mnt/test"
                echo "export SCRATCH_DEV=$sdev SCRATCH_MNT=/mnt/scratch"
            } >"$cfg" ;;
    esac
    echo "=== $RUN_NAME $fs: ${#TESTS[@]} test(s) ==="
    log=/ctl/results/$fs.check.log
    HOST_OPTIONS=$cfg RESULT_BASE=/ctl/results/$fs ./check "${TESTS[@]}" 2>&1 | tee "$log"
    umount /mnt/scratch 2>/dev/null
    umount /mnt/test 2>/dev/null
    ran=" $(sed -n 's/^Ran: //p' "$log" | tail -n 1) "
    notrun=" $(sed -n 's/^Not run: //p' "$log" | tail -n 1) "
    failed=" $(sed -n 's/^Failures: //p' "$log" | tail -n 1) "
    for t in "${TESTS[@]}"; do
        why=""
        if [[ $failed == *" $t "* ]]; then
            why=$(grep -a "^$t " "$log" | tail -n 1 | sed "s|^$t *||;s| *(see .*||;s|^[0-9]*s \.\.\. *||")
            bad "$fs/$t" "${why:0:120}"
        elif [[ $notrun == *" $t "* ]]; then
            why=$(head -n 1 "/ctl/results/$fs/$t.notrun" 2>/dev/null)
            skip "$fs/$t" "${why:0:120}"
        elif [[ $ran == *" $t "* ]]; then
            ok "$fs/$t"
        fi
    done
done
sync
guest_end
