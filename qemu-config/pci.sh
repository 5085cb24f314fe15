# shellcheck shell=bash disable=SC2034,SC2054 # PROFILE_* are read by vm.sh; commas are QEMU syntax
# pci: q35 + vhost-user-fs-pci. Works with Debian's QEMU (>= 7.2); no DAX window.
PROFILE_DESC="q35, vhost-user-fs-pci (QEMU >= 7.2, no DAX window)"
PROFILE_QEMU=system
PROFILE_APPEND=""
profile_args() {
    common_args
    common_memfd
    QEMU_ARGS+=(
        -M q35 -numa node,memdev=mem
        -device "vhost-user-fs-pci,chardev=vfs,tag=$VM_TAG,queue-size=$VM_QUEUE_SIZE,num-request-queues=$VM_NUM_QUEUES"
    )
}
