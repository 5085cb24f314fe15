#!/usr/bin/env bash
# lima (limactl 1.2.1, built from its Go module by this script) starts a QEMU guest whose
# share is mounted with `mountType: virtiofs`; lima finds the vhost-user-fs backend itself
# through the vhost-user JSON descriptors (`$HOME/.local/share/qemu/vhost-user/*.json` first),
# checks it with `--version` and runs it as `--socket-path S --shared-dir D`.
#
# daxfsd is installed with `make install PREFIX=$HOME/.local` into a private HOME; the
# guest is the project's kernel and initramfs (lima's `images[].kernel`/`initrd`: no network
# image is reachable here) with a command packed into the initrd that writes a file into
# the share and reads one the host put there. The guest has no sshd, so lima never reports
# the instance ready: the test stops it after the guest has powered off and judges by the
# share, the serial log and lima's own log (which daemon it ran, with which arguments).
# Platform workarounds (not mocks): limactl refuses root, so it runs as the system user
# daxfsd-test (scripts/uidmap-test-setup.sh creates it); lima picks `accel=kvm` and
# `-cpu host` on any Linux host, and this host's KVM (PVM) cannot boot an ordinary guest,
# so QEMU_SYSTEM_X86_64 names a wrapper that execs the real qemu-system-x86_64 with TCG.
#
#   tests/launchers/lima.sh [-d daxfsd|virtiofsd]
# Ends with "launchers-lima: N passed, M failed".
set -euo pipefail
RIG_TAG=lima
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$RIG_ROOT"

LIMA_VERSION=v1.2.1
daemon=daxfsd
while (($#)); do
    case $1 in
        -d) (($# >= 2)) || die "-d needs a value"; daemon=$2; shift 2 ;;
        *) die "unknown option '$1'" ;;
    esac
done
[[ $(id -u) == 0 ]] || die "run as root (it sets up the user daxfsd-test that runs limactl)"
need_cmd go golang
need_cmd qemu-system-x86_64 qemu-system-x86
need_cmd ssh-keygen openssh-client
need_cmd qemu-img qemu-utils
# ok, bad, check and rig_summary come from scripts/lib.sh.

# limactl from the Go module proxy (go install ...@version refuses here: the proxy does not
# list lima's versions, which `go install` asks for; a build inside a module does not ask).
lima_dir=$DAXFSD_CACHE/lima-$LIMA_VERSION
limactl=$lima_dir/bin/limactl
# limactl insists on its guest agent next to it (share/lima/), even for a guest that never
# runs it.
agent=$lima_dir/share/lima/lima-guestagent.Linux-x86_64
if [[ ! -x $limactl || ! -x $agent ]]; then
    log "building limactl $LIMA_VERSION (go module github.com/lima-vm/lima)"
    mkdir -p "$lima_dir/src"
    printf 'module daxfsd/limabuild\n\ngo 1.23\n\nrequire github.com/lima-vm/lima %s\n' "$LIMA_VERSION" >"$lima_dir/src/go.mod"
    printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "github.com/lima-vm/lima/cmd/limactl"\n\t_ "github.com/lima-vm/lima/cmd/lima-guestagent"\n)\n' >"$lima_dir/src/tools.go"
    (cd "$lima_dir/src" && GOPATH=$lima_dir/gopath GOFLAGS=-modcacherw go mod tidy >/dev/null 2>&1 &&
        GOPATH=$lima_dir/gopath GOFLAGS=-modcacherw nice -n 10 go build -o "$limactl" github.com/lima-vm/lima/cmd/limactl &&
        GOPATH=$lima_dir/gopath GOFLAGS=-modcacherw nice -n 10 go build -o "$agent" github.com/lima-vm/lima/cmd/lima-guestagent) ||
        die "building limactl failed (the Go module proxy must be reachable)"
fi
log "$("$limactl" --version)"

scripts/uidmap-test-setup.sh >/dev/null
user=daxfsd-test
kernel=$(guest-kernel/build.sh 2>/dev/null | tail -n1)
initramfs=$(scripts/build-initramfs.sh 2>/dev/null | tail -n1)
[[ -r $kernel && -r $initramfs ]] || die "guest kernel or initramfs missing (make kernel initramfs)"

work=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-lima.XXXXXX")
cleanup() {
    # The instance's QEMU and daemon run as $user below $work: stop them by their pid files.
    for p in "$work"/home/.lima/t/*.pid; do
        if [[ -r $p ]]; then kill "$(cat "$p")" 2>/dev/null || true; fi
    done
    rm -rf -- "$work"
}
trap cleanup EXIT
home=$work/home share=$work/share
mkdir -p "$home/bin" "$share"
printf 'from the host\n' >"$share/from-host"

# The backend lima will find: daxfsd installed into $HOME/.local (its descriptor names the
# installed binary), or upstream virtiofsd behind a descriptor of the same form.
if [[ $daemon == daxfsd ]]; then
    make -s install PREFIX="$home/.local" >/dev/null
    want_bin=$home/.local/bin/daxfsd
else
    vfsd=$DAXFSD_CACHE/virtiofsd-1.14.0/bin/virtiofsd
    [[ -x $vfsd ]] || die "$vfsd missing (make virtiofsd)"
    install -D -m 0755 "$vfsd" "$home/.local/bin/virtiofsd"
    want_bin=$home/.local/bin/virtiofsd
    mkdir -p "$home/.local/share/qemu/vhost-user"
    printf '{"description": "virtiofsd 1.14", "type": "fs", "binary": "%s"}\n' "$want_bin" \
        >"$home/.local/share/qemu/vhost-user/50-virtiofsd.json"
fi

cat >"$home/bin/qemu-system-x86_64" <<'EOF'
#!/bin/bash
# lima asks for accel=kvm and -cpu host on Linux; this host's KVM cannot boot the guest.
args=() prev=
for a in "$@"; do
    a=${a//accel=kvm/accel=tcg}
    [[ $prev == -cpu && $a == host* ]] && a=max
    args+=("$a"); prev=$a
done
exec qemu-system-x86_64 "${args[@]}"
EOF
chmod 755 "$home/bin/qemu-system-x86_64"
# A copy the user can run (the cache is under root's home).
install -m 0755 "$limactl" "$home/bin/limactl"
install -D -m 0755 "$agent" "$home/share/lima/lima-guestagent.Linux-x86_64"

# The guest: the project's kernel, the initramfs plus the command (daxfsd.run=cmd).
cp -- "$kernel" "$home/bzImage"
mkdir -p "$work/cmd"
# After the guest helpers (tests/e2e/guest/lib.sh: check, guest_end), as scripts/vm.sh sends them.
{
    guest_helpers
    cat <<'EOF'
check mounted grep -q ' /mnt virtiofs' /proc/mounts
echo "LIMA-GUEST mount: $(grep ' /mnt ' /proc/mounts)"
echo "written by the guest" >/mnt/from-guest
echo "LIMA-GUEST read: $(cat /mnt/from-host)"
guest_end
EOF
} >"$work/cmd/daxfsd-cmd"
python3 scripts/mkcpio.py "$work/cmd.cpio" "$work/cmd"
cat -- "$initramfs" "$work/cmd.cpio" >"$home/initrd.cpio"
truncate -s 64M "$home/base.img"
cat >"$home/t.yaml" <<EOF
vmType: qemu
arch: x86_64
cpus: 1
memory: 1GiB
disk: 1GiB
images:
- location: $home/base.img
  arch: x86_64
  kernel:
    location: $home/bzImage
    cmdline: console=ttyS0 daxfsd.tag=mount0 daxfsd.run=cmd
  initrd:
    location: $home/initrd.cpio
firmware:
  legacyBIOS: true
mountType: virtiofs
mounts:
- location: $share
  writable: true
containerd:
  system: false
  user: false
ssh:
  loadDotSSHPubKeys: false
video:
  display: none
EOF
chown -R "$user:" "$work"
chmod 0755 "$work"

as_user() {
    setpriv --reuid="$user" --regid="$user" --clear-groups \
        env HOME="$home" PATH="$home/.local/bin:$PATH" QEMU_SYSTEM_X86_64="$home/bin/qemu-system-x86_64" "$@"
}
log "limactl start (as $user; backend $daemon; TCG)"
rc=0
as_user timeout 300 "$home/bin/limactl" --tty=false start --name=t --timeout=4m "$home/t.yaml" \
    >"$work/start.log" 2>&1 &
start_pid=$!
# The guest powers off after its command; lima then waits for SSH in vain.
serial=$home/.lima/t/serial.log
for _ in $(seq 240); do
    grep -q '^GUEST END\|@@DAXFSD-RESULT' "$serial" 2>/dev/null && break
    kill -0 "$start_pid" 2>/dev/null || break
    sleep 1
done
sleep 2
pgrep -f -a -- "--shared-dir $share" | cut -d' ' -f2- >"$work/daemon-args.txt" || true
as_user "$home/bin/limactl" stop -f t >/dev/null 2>&1 || true
kill "$start_pid" 2>/dev/null || true
wait "$start_pid" 2>/dev/null || rc=$?
ha_log=$(cat "$home"/.lima/t/ha.stderr.log 2>/dev/null || true)
tr -d '\r' <"$serial" >"$work/serial.txt" 2>/dev/null || true
guest_complete guest "$work/serial.txt"

if grep -q "Using .*$want_bin\|virtiofsd.*$want_bin\|$want_bin" <<<"$ha_log$(cat "$work/daemon-args.txt")"; then
    ok lima_found_backend_by_descriptor
else
    bad lima_found_backend_by_descriptor "lima did not run $want_bin: $(grep -i virtiofs <<<"$ha_log" | head -n 3 | tr '\n' ' ')"
fi
if grep -q -- "--socket-path .*--shared-dir $share" "$work/daemon-args.txt" ||
    grep -q -- "--socket-path.*--shared-dir.*$share" <<<"$ha_log"; then
    ok lima_command_line
else
    bad lima_command_line "no '--socket-path S --shared-dir $share' seen: $(head -c 300 "$work/daemon-args.txt")"
fi
if grep -q "LIMA-GUEST mount: mount0 /mnt virtiofs" "$serial" 2>/dev/null; then
    ok guest_mounted_share
else
    bad guest_mounted_share "$(grep -a -E 'LIMA-GUEST|CHECK FAIL|virtiofs' "$serial" 2>/dev/null | tail -n 3 | tr '\n' ' ')"
fi
if grep -q "LIMA-GUEST read: from the host" "$serial" 2>/dev/null; then ok guest_read_host_file; else bad guest_read_host_file "no host file content in the serial log"; fi
if [[ $(cat "$share/from-guest" 2>/dev/null) == "written by the guest" ]]; then
    ok host_sees_guest_write
else
    bad host_sees_guest_write "$share/from-guest missing"
fi
log "backend as lima ran it: $(head -n1 "$work/daemon-args.txt" | cut -c1-300)"
grep -a 'LIMA-GUEST' "$serial" 2>/dev/null | sed 's/^/  guest: /' || true
if ((RIG_FAIL > 0)); then
    echo "--- limactl start (exit $rc), last lines:"; tail -n 15 "$work/start.log" || true
    echo "--- lima ha.stderr.log, last lines:"; tail -n 15 <<<"$ha_log"
    echo "--- serial log, last lines:"; tail -n 15 "$serial" 2>/dev/null || true
fi
log "backend $daemon, limactl $LIMA_VERSION"
rig_summary launchers-lima
