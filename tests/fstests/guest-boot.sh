#!/bin/bash
# PID 1 of the fstests guest (installed as /sbin/fstests-boot in the root image): mount the
# pseudo file systems, find the control disk (virtio-blk serial "fstctl"), run its init.sh,
# power off. Everything a run decides lives on the control disk, not in the image.
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -o remount,rw /
hostname fstests
ctl=""
for s in /sys/block/vd*/serial; do
    [[ $(cat "$s" 2>/dev/null) == fstctl ]] && { ctl=/dev/${s#/sys/block/}; ctl=${ctl%/serial}; }
done
mkdir -p /ctl
if [[ -n $ctl ]] && mount -t ext4 "$ctl" /ctl && [[ -r /ctl/init.sh ]]; then
    bash /ctl/init.sh
    echo "@@FSTESTS-GUEST-EXIT rc=$?@@"
else
    echo "@@FSTESTS-GUEST-EXIT rc=125@@ no control disk"
fi
umount /ctl 2>/dev/null
sync
exec /sbin/fstests-poweroff
