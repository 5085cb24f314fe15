# shellcheck shell=bash disable=SC2034,SC2054,SC2154 # PROFILE_* are read by vm.sh; commas are QEMU syntax; cache and daemon_args are vm.sh's
# dax: q35 + the generic vhost-user device as virtio-fs (virtio-id 26). QEMU
# >= 11.1 asks the daemon GET_SHMEM_CONFIG and maps its shared-memory region 0
# (the DAX cache window) as a 64-bit BAR. The tag comes from the daemon's
# virtio config space (GET_CONFIG, 40 bytes: tag[36] + num_request_queues).
# When the daemon serves the notification queue (--notify or --cache=coherent; or
# DAXFSD_FS_NOTIFY=1 in the environment) the device gets it too: num_vqs = 2 + request
# queues and the 44-byte config space (+ notify_buf_size).
PROFILE_DESC="q35, vhost-user-test-device-pci as virtio-fs with the DAX window (QEMU >= 11.1)"
PROFILE_QEMU=11
PROFILE_APPEND=""
profile_args() {
    local notify=0 a
    [[ ${DAXFSD_FS_NOTIFY:-0} == 1 || ${cache:-} == coherent ]] && notify=1
    for a in "${daemon_args[@]}"; do [[ $a == --notify ]] && notify=1; done
    common_args
    common_memfd
    QEMU_ARGS+=(
        -M q35 -numa node,memdev=mem
        -device "vhost-user-test-device-pci,chardev=vfs,virtio-id=26,num_vqs=$((1 + notify + VM_NUM_QUEUES)),config_size=$((notify ? 44 : 40))"
    )
}
# The device has no tag property: the daemon must serve it (--tag=TAG).
PROFILE_DAEMON_TAG=1
