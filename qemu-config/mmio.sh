# shellcheck shell=bash disable=SC2034,SC2054 # PROFILE_* are read by vm.sh; commas are QEMU syntax
# mmio: microvm + vhost-user-fs-device (virtio-mmio), no ACPI: QEMU adds the
# virtio_mmio.device= entries to the kernel command line itself. Without
# tsc_early_khz about 30% of TCG boots hang calibrating the TSC; with
# acpi=off the guest reboots by triple fault (reboot=t), and -no-reboot
# turns that into a QEMU exit.
PROFILE_DESC="microvm, vhost-user-fs-device over virtio-mmio (QEMU >= 7.2)"
PROFILE_QEMU=system
PROFILE_APPEND="acpi=off reboot=t tsc_early_khz=$(host_tsc_khz)"
profile_args() {
    common_args
    common_memfd
    QEMU_ARGS+=(
        -M microvm,acpi=off,memory-backend=mem
        -device "vhost-user-fs-device,chardev=vfs,tag=$VM_TAG,queue-size=$VM_QUEUE_SIZE,num-request-queues=$VM_NUM_QUEUES"
    )
}
