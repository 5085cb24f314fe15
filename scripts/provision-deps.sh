#!/usr/bin/env bash
# Install every Debian package the VM rig needs (kernel build, initramfs,
# QEMU, debootstrap, upstream virtiofsd's build deps, host-side checks).
# Idempotent: does nothing when all are installed. Waits for an apt/dpkg run
# by someone else instead of failing. Runs `apt-get update` only when the
# package lists are missing, stale, or lack a package.
#
#   scripts/provision-deps.sh [--list]     --list: print the package names
set -euo pipefail
RIG_TAG=deps
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PACKAGES=(
    # guest kernel
    linux-source-6.12 build-essential flex bison bc libelf-dev libssl-dev lz4 xz-utils patch perl
    # initramfs
    busybox-static fio libc6-dev python3 acl attr
    # QEMU: Debian's (profiles pci, mmio) and the trixie tree for QEMU 11 (dax)
    qemu-system-x86 debootstrap debian-archive-keyring ca-certificates
    # upstream virtiofsd built with cargo (Rust itself comes from rustup)
    libseccomp-dev libcap-ng-dev pkg-config
    # launcher and host-side checks
    util-linux procps coreutils attr
)

if [[ ${1:-} == --list ]]; then printf '%s\n' "${PACKAGES[@]}"; exit 0; fi
[[ -z ${1:-} ]] || die "unknown argument '$1' (only --list)"
command -v dpkg-query >/dev/null || die "this rig needs Debian (or a derivative) with apt"

missing=()
for p in "${PACKAGES[@]}"; do
    [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true) == installed ]] || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
    log "all ${#PACKAGES[@]} packages installed"
    exit 0
fi
[[ $(id -u) -eq 0 ]] || die "missing packages (${missing[*]}); run 'make vm-deps' as root"

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
