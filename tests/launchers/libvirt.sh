#!/usr/bin/env bash
# libvirt 9.0 (Debian 12) starting the daemon for a virtiofs <filesystem>: `virsh create`
# of a q35 domain with the project's guest kernel and initramfs, whose guest mounts the
# share, reads a host file and writes one the host then checks. One domain per variant:
# the defaults, each cache mode, <sandbox mode='chroot'/>, xattr on and off,
# <thread_pool size='16'/>, <lock posix='off' flock='off'/>.
#
#   RUN_DIR=DIR tests/launchers/libvirt.sh DAEMON-BINARY NAME
#
# Installs libvirt with apt when it is missing, and runs libvirtd/virtlogd when they are not
# running (stopping the ones it started at the end). libvirt under this root sandbox needs:
# qemu as root, no security driver, no cgroup controllers, no private namespaces, and
# shared (memfd) guest memory, which vhost-user needs anyway. Prints CHECK PASS/FAIL lines.
set -euo pipefail
RIG_TAG=libvirt
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
bin=$1 name=$2
work=$(mktemp -d "${RUN_DIR:-/tmp}/libvirt-$name.XXXXXX")
started=()
cleanup() {
    local pid
    for pid in "${started[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf -- "$work"
}
trap cleanup EXIT

if ! command -v virsh >/dev/null || ! [[ -x /usr/sbin/libvirtd ]]; then
    log "installing libvirt (apt)"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        libvirt-daemon-system libvirt-clients libvirt-daemon-driver-qemu >/dev/null
fi
conf=/etc/libvirt/qemu.conf
if ! grep -q '^# daxfsd launcher tests' "$conf"; then
    log "configuring $conf for this root sandbox"
    cat >>"$conf" <<'CONF'
# daxfsd launcher tests (tests/launchers/libvirt.sh): QEMU as root, no confinement.
user = "root"
group = "root"
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
CONF
    # A running libvirtd reads qemu.conf at start only.
    if pid=$(pidof libvirtd); then kill "$pid"; sleep 1; fi
fi
if ! pidof virtlogd >/dev/null; then
    /usr/sbin/virtlogd -d; sleep 0.3; started+=("$(pidof virtlogd)")
fi
if ! pidof libvirtd >/dev/null; then
    /usr/sbin/libvirtd -d; started+=("$(pidof libvirtd)")
fi
for _ in $(seq 1 50); do virsh -q -c qemu:///system version >/dev/null 2>&1 && break; sleep 0.2; done
virsh -c qemu:///system version | grep -i 'running hypervisor\|libvirt' >&2 || true

kernel=$("$RIG_ROOT/guest-kernel/build.sh" --print-path)
initramfs=$("$RIG_ROOT/scripts/build-initramfs.sh" 2>/dev/null)
mkdir -p "$work/cmd"
printf '%s\n' 'cat from-host.txt && echo "written by the guest" > from-guest.txt && sync' >"$work/cmd/daxfsd-cmd"
python3 "$RIG_ROOT/scripts/mkcpio.py" "$work/cmd.cpio" "$work/cmd"
cat -- "$initramfs" "$work/cmd.cpio" >"$work/initrd.cpio"

# variant name | <binary> attributes | <binary> children
variants=(
    "defaults||"
    "cache-none||<cache mode='none'/>"
    "cache-always||<cache mode='always'/>"
    "sandbox-chroot-xattr-on| xattr='on'|<sandbox mode='chroot'/>"
    "xattr-off-thread-pool-16| xattr='off'|<thread_pool size='16'/>"
    "locks-off||<lock posix='off' flock='off'/>"
)
n=0
for v in "${variants[@]}"; do
    IFS='|' read -r vname attrs children <<<"$v"
    n=$((n + 1))
    share=$work/share-$vname
    mkdir -p "$share"
    echo "host file for libvirt $vname" >"$share/from-host.txt"
    dom=daxfsd-launcher-$$-$n
    console=$work/$vname.console
    cat >"$work/$vname.xml" <<XML
<domain type='qemu'>
  <name>$dom</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>$kernel</kernel>
    <initrd>$work/initrd.cpio</initrd>
    <cmdline>console=ttyS0 panic=-1 oops=panic 8250.nr_uarts=1 daxfsd.tag=lvfs daxfsd.run=cmd</cmdline>
  </os>
  <cpu mode='custom' match='exact'><model fallback='allow'>qemu64</model></cpu>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <filesystem type='mount' accessmode='passthrough'>
      <driver type='virtiofs' queue='1024'/>
      <binary path='$bin'$attrs>$children</binary>
      <source dir='$share'/>
      <target dir='lvfs'/>
    </filesystem>
    <serial type='file'><source path='$console'/><target port='0'/></serial>
    <memballoon model='none'/>
  </devices>
</domain>
XML
    log "$name/$vname: virsh create"
    rc=0
    virsh -q -c qemu:///system create "$work/$vname.xml" >"$work/$vname.virsh" 2>&1 || rc=$?
    if ((rc != 0)); then
        echo "CHECK FAIL libvirt/$name/$vname: virsh create failed: $(tr '\n' ' ' <"$work/$vname.virsh")"
        log "daemon log:"; tail -n 5 "/var/log/libvirt/qemu/$dom-fs0-virtiofsd.log" >&2 2>/dev/null || true
        continue
    fi
    cmdline=$(pgrep -a -f -- "$share" | grep -v qemu-system | head -n 1 || true)
    log "$name/$vname: daemon: ${cmdline:-?}"
    for _ in $(seq 1 600); do
        virsh -q -c qemu:///system domstate "$dom" >/dev/null 2>&1 || break
        sleep 0.5
    done
    if virsh -q -c qemu:///system domstate "$dom" >/dev/null 2>&1; then
        virsh -q -c qemu:///system destroy "$dom" >/dev/null 2>&1 || true
        echo "CHECK FAIL libvirt/$name/$vname: the guest did not finish within 300 s"
        continue
    fi
    grep -aq "host file for libvirt $vname" "$console" 2>/dev/null && st=0 || st=$?
    ((st == 0)) && echo "CHECK PASS libvirt/$name/$vname: guest reads the host's file" ||
        echo "CHECK FAIL libvirt/$name/$vname: guest reads the host's file: $(grep -a 'CHECK FAIL\|RESULT' "$console" 2>/dev/null | tr '\n' ' ')"
    if [[ $(cat "$share/from-guest.txt" 2>/dev/null) == "written by the guest" ]]; then
        echo "CHECK PASS libvirt/$name/$vname: host sees the guest's file"
    else
        echo "CHECK FAIL libvirt/$name/$vname: host sees the guest's file"
    fi
done
