#!/usr/bin/env bash
# libvirt 9.0 (Debian 12) starting the daemon for a virtiofs <filesystem>: `virsh create`
# of a q35 domain with the project's guest kernel and initramfs, whose guest mounts the
# share, reads a host file and writes one the host then checks. One domain per variant:
# the defaults, each cache mode, <sandbox mode='chroot'/>, xattr on and off,
# <thread_pool size='16'/>, <lock posix='off' flock='off'/>.
#
#   RUN_DIR=DIR tests/launchers/libvirt.sh DAEMON-BINARY NAME
#
# libvirt comes from scripts/provision-deps.sh (section test). Runs libvirtd/virtlogd when
# they are not running (stopping the ones it started at the end). libvirt under this root
# sandbox needs: qemu as root, no security driver, no cgroup controllers, no private
# namespaces, and shared (memfd) guest memory, which vhost-user needs anyway. The lines this
# adds to /etc/libvirt/qemu.conf are removed again at the end (a libvirtd that was running
# before is restarted with the file as it was). Prints CHECK lines and a rig_summary.
set -euo pipefail
RIG_TAG=libvirt
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
bin=$1 name=$2
work=$(mktemp -d "${RUN_DIR:-/tmp}/libvirt-$name.XXXXXX")
need_cmd virsh libvirt-clients
[[ -x /usr/sbin/libvirtd ]] || die "libvirtd not found; install it with 'make vm-deps' (package libvirt-daemon-system)"
conf=/etc/libvirt/qemu.conf
conf_begin='# daxfsd launcher tests (tests/launchers/libvirt.sh): QEMU as root, no confinement.'
conf_end='# end of daxfsd launcher tests'
started=() restart_libvirtd=0
cleanup() {
    local pid
    for pid in "${started[@]}"; do kill "$pid" 2>/dev/null || true; done
    # Take our lines out of qemu.conf again (also ones a killed earlier run left behind).
    if grep -qxF -- "$conf_begin" "$conf" 2>/dev/null; then
        sed -i "\|^$conf_begin\$|,\|^$conf_end\$|d" "$conf"
        log "restored $conf"
    fi
    if ((restart_libvirtd)); then
        sleep 0.5
        /usr/sbin/libvirtd -d || log "WARNING: could not restart the libvirtd that ran before"
    fi
    rm -rf -- "$work"
}
trap cleanup EXIT

if ! grep -qxF -- "$conf_begin" "$conf"; then
    log "configuring $conf for this root sandbox (undone at exit)"
    cat >>"$conf" <<CONF
$conf_begin
user = "root"
group = "root"
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
$conf_end
CONF
fi
# A running libvirtd reads qemu.conf at start only.
if pid=$(pidof libvirtd); then
    kill "$pid"; restart_libvirtd=1
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
fi
if ! pidof virtlogd >/dev/null; then
    /usr/sbin/virtlogd -d; sleep 0.3; started+=("$(pidof virtlogd)")
fi
/usr/sbin/libvirtd -d; started+=("$(pidof libvirtd)")
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
        bad "libvirt/$name/$vname" "virsh create failed: $(tr '\n' ' ' <"$work/$vname.virsh")"
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
        bad "libvirt/$name/$vname" "the guest did not finish within 300 s"
        continue
    fi
    grep -aq "host file for libvirt $vname" "$console" 2>/dev/null && st=0 || st=$?
    check "libvirt/$name/$vname guest reads the host's file" "$st" \
        "$(grep -a 'CHECK FAIL\|RESULT' "$console" 2>/dev/null | tr '\n' ' ')"
    [[ $(cat "$share/from-guest.txt" 2>/dev/null) == "written by the guest" ]] && st=0 || st=$?
    check "libvirt/$name/$vname host sees the guest's file" "$st"
done
rig_summary "libvirt/$name"
