#!/usr/bin/env bash
# The one list of Debian packages this project uses, in sections, and their installer:
#   rig    the VM rig: guest kernel build, initramfs, QEMU, upstream virtiofsd's build deps
#          (make demo, make vm and every target below start from it)
#   test   what `make test` uses beyond the rig: lint, launchers (libvirt, virtme-ng's udev,
#          lima's qemu-img), host-side FUSE peers and checks, uid maps
#   bench  what `make bench` uses beyond the rig: the chart, instruction counts, bindfs
#   conformance  what `make conformance --backing` uses: xfs/btrfs tools, an NFS server
# No script or test installs a Debian package on its own: they name what is missing and
# point here. Idempotent: does nothing when all are installed. Waits for an apt/dpkg run by
# someone else instead of failing. Runs `apt-get update` only when the package lists are
# missing, stale, or lack a package.
#
#   scripts/provision-deps.sh [--list] [SECTION...]   (default: all sections)
set -euo pipefail
RIG_TAG=deps
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Packages installed into the debootstrapped trees, not on the host, are listed by their
# builders: QEMU 11.1 (scripts/provision-qemu.sh) and the fstests guest root
# (tests/fstests/build-root.sh, PACKAGES); the host side of both is debootstrap below.
# Rust (cargo, rustc) comes from rustup and Go (lima's test builds limactl) from go.dev;
# neither is a Debian package of the right version on Debian 12.
RIG=(
    # guest kernel
    linux-source-6.12 build-essential flex bison bc libelf-dev libssl-dev lz4 xz-utils patch perl
    # initramfs (the guest's fio, ACL and xattr tools and inotifywait are copied from the host)
    busybox-static fio libc6-dev python3 acl attr inotify-tools
    # QEMU: Debian's (profiles pci, mmio) and the trixie tree for QEMU 11 (dax)
    qemu-system-x86 debootstrap debian-archive-keyring ca-certificates
    # upstream virtiofsd built with cargo
    libseccomp-dev libcap-ng-dev pkg-config
    # the launcher and host-side checks
    util-linux procps coreutils e2fsprogs
)
TEST=(
    # make lint: shellcheck over every script
    shellcheck
    # tests/e2e/dax-full.sh: losetup and mount for its ext4 image
    mount
    # tests/host: the traditional FUSE peer and fusermount3 for the non-root mount
    bindfs fuse3
    # tests/launchers: libvirt 9.0, virtme-ng's udev and venv, lima's qemu-img and ssh keys
    libvirt-daemon-system libvirt-clients libvirt-daemon-driver-qemu udev python3-venv
    qemu-utils openssh-client
    # make test-uidmap: newuidmap/newgidmap
    uidmap
)
# make conformance --backing (tests/fstests/run.sh), not make test: the xfs and btrfs images,
# the NFS v4 loopback export (nfsd, mountd, exportfs; mount.nfs4 from its dependency
# nfs-common). Its own section so that `make test` does not install an NFS server.
CONFORMANCE=(
    xfsprogs btrfs-progs nfs-kernel-server
)
BENCH=(
    # the chart (Debian's python3 sees it), instruction counts, the host section's FUSE peer
    python3-matplotlib valgrind bindfs fuse3
)

sections=() list=0
for a in "$@"; do
    case $a in
        --list) list=1 ;;
        rig|test|bench|conformance) sections+=("$a") ;;
        all) sections+=(rig test bench conformance) ;;
        *) die "unknown argument '$a' (--list; sections: rig, test, bench, conformance, all)" ;;
    esac
done
((${#sections[@]})) || sections=(rig test bench conformance)
PACKAGES=()
for sec in "${sections[@]}"; do
    case $sec in
        rig) PACKAGES+=("${RIG[@]}") ;;
        test) PACKAGES+=("${TEST[@]}") ;;
        bench) PACKAGES+=("${BENCH[@]}") ;;
        conformance) PACKAGES+=("${CONFORMANCE[@]}") ;;
    esac
done
mapfile -t PACKAGES < <(printf '%s\n' "${PACKAGES[@]}" | awk '!seen[$0]++')

if ((list)); then printf '%s\n' "${PACKAGES[@]}"; exit 0; fi
command -v dpkg-query >/dev/null || die "this rig needs Debian (or a derivative) with apt"

missing=()
for p in "${PACKAGES[@]}"; do
    [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true) == installed ]] || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
    log "all ${#PACKAGES[@]} packages of ${sections[*]} installed"
    exit 0
fi
[[ $(id -u) -eq 0 ]] || die "missing packages (${missing[*]}); run 'scripts/provision-deps.sh ${sections[*]}' as root"

# Package lists: update when absent, older than a day, or missing a package.
lists_ok=1
if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
    lists_ok=0
elif [[ -n $(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mtime +1 -print -quit) ]]; then
    lists_ok=0
else
    for p in "${missing[@]}"; do
        cand=$(apt-cache policy "$p" 2>/dev/null | sed -n 's/^ *Candidate: //p')
        [[ -n $cand && $cand != "(none)" ]] || { lists_ok=0; break; }
    done
fi
if ((lists_ok == 0)); then
    log "apt-get update"
    apt_get update -qq >/dev/null || die "apt-get update failed"
fi
log "installing ${#missing[@]} package(s): ${missing[*]}"
apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    die "apt-get install failed for: ${missing[*]}"
log "done"
