# shellcheck shell=bash
# Pieces shared by every QEMU profile. Sourced by scripts/vm.sh, which sets:
#   VM_SOCK VM_TAG VM_MEM VM_CPUS VM_ACCEL VM_KERNEL VM_INITRD VM_APPEND
#   VM_QUEUE_SIZE VM_NUM_QUEUES
# A profile file (qemu-config/<name>.sh) defines:
#   PROFILE_DESC     one line for --list
#   PROFILE_QEMU     system (Debian's QEMU, >= 7.2) or 11 (scripts/qemu-11.sh)
#   PROFILE_APPEND   extra guest kernel command line
#   profile_args     appends the machine and the virtio-fs device to QEMU_ARGS

# CPU model for the accelerator: TCG emulates "max"; KVM passes the host's.
common_cpu() { if [[ $VM_ACCEL == kvm ]]; then echo host; else echo max; fi; }

# Accelerator, CPUs, the guest kernel, and the vhost-user chardev.
common_args() {
    QEMU_ARGS+=(
        -accel "$VM_ACCEL" -cpu "$(common_cpu)" -smp "$VM_CPUS" -m "$VM_MEM"
        -nodefaults -no-user-config -display none -no-reboot
        -kernel "$VM_KERNEL" -initrd "$VM_INITRD" -append "$VM_APPEND"
        -chardev "socket,id=vfs,path=$VM_SOCK"
    )
}

# Guest RAM the vhost-user daemon can map: a shared memfd.
common_memfd() {
    QEMU_ARGS+=(-object "memory-backend-memfd,id=mem,size=$VM_MEM,share=on")
}

# Host TSC frequency in kHz (from /proc/cpuinfo), for tsc_early_khz=.
host_tsc_khz() {
    awk -F: '/^cpu MHz/ { printf "%d\n", $2 * 1000 + 0.5; exit }' /proc/cpuinfo
}
