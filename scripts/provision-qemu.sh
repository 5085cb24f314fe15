#!/usr/bin/env bash
# Provide the QEMUs the rig runs. Idempotent.
#
#   scripts/provision-qemu.sh [all|system|11] [--print-path]
#
#   system  Debian's qemu-system-x86 (bookworm: 7.2) - profiles pci, mmio.
#   11      QEMU >= 11.1 from trixie-backports, unpacked into a minbase trixie
#           tree at $DAXFSD_CACHE/qemu-trixie/<key>/ (profile dax). It is run
#           in place through that tree's loader by scripts/qemu-11.sh.
#   --print-path  print the trixie tree of '11' (empty + exit 1 if missing).
#
# The trixie tree is built in a temporary directory and renamed into place
# when complete, so an interrupted run never leaves a tree that looks done.
set -euo pipefail
RIG_TAG=qemu
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Bump to rebuild the tree when the recipe below changes.
RECIPE=1
SUITE=trixie
MIN_SYSTEM=7.2
MIN_DAX=11.1
QEMU11_ROOT="$DAXFSD_CACHE/qemu-trixie"
QEMU11_DIR="$QEMU11_ROOT/$SUITE-backports-r$RECIPE"

what=all print=0
for arg in "$@"; do
    case $arg in
        all|system|11) what=$arg ;;
        --print-path) print=1 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) die "unknown argument '$arg' (use all, system, 11 or --print-path)" ;;
    esac
done

if ((print)); then
    [[ -f $QEMU11_DIR/.complete ]] || exit 1
    printf '%s\n' "$QEMU11_DIR"
    exit 0
fi

# version_ge A B: A >= B for dotted versions.
version_ge() { [[ $(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1) == "$2" ]]; }
# "QEMU emulator version 7.2.19 (Debian ...)" -> 7.2.19
qemu_version_of() { "$@" -version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9.]*\).*/\1/p' | head -n1; }

provision_system() {
    need_cmd qemu-system-x86_64 qemu-system-x86
    local v
    v=$(qemu_version_of qemu-system-x86_64)
    [[ -n $v ]] || die "qemu-system-x86_64 -version gave no version"
    version_ge "$v" "$MIN_SYSTEM" || die "system QEMU is $v, profiles pci/mmio need >= $MIN_SYSTEM"
    log "system QEMU $v: $(command -v qemu-system-x86_64)"
}

provision_11() {
    if [[ -f $QEMU11_DIR/.complete ]]; then
        local v
        v=$("$RIG_ROOT/scripts/qemu-11.sh" -version | sed -n 's/^QEMU emulator version \([0-9.]*\).*/\1/p')
        if [[ -n $v ]] && version_ge "$v" "$MIN_DAX"; then
            log "cached: QEMU $v in $QEMU11_DIR"
            return 0
        fi
        die "cached tree $QEMU11_DIR does not run QEMU >= $MIN_DAX (got '${v:-nothing}'); remove it and re-run"
    fi
    need_cmd debootstrap debootstrap
    [[ $(id -u) -eq 0 ]] || die "building the trixie tree needs root (debootstrap, chroot)"
    local mirror
    mirror=$(apt_mirror_uri) || die "no Debian archive URI found in /etc/apt/sources.list{,.d}"
    mkdir -p "$QEMU11_ROOT"
    # Temp trees of runs that died are ours to remove (never a complete tree).
    local old
    for old in "$QEMU11_ROOT"/.tmp-*.pid "$QEMU11_ROOT"/.tmp-*.log; do
        [[ -f $old && ! -e ${old%.*} ]] && rm -f -- "$old"
    done
    for old in "$QEMU11_ROOT"/.tmp-*; do
        [[ -d $old && ! -e $old/.complete ]] || continue
        if [[ ! -e $old.pid ]] || ! kill -0 "$(cat "$old.pid")" 2>/dev/null; then
            log "removing stale partial tree $old"
            rm -rf --one-file-system -- "$old"
            rm -f -- "$old.pid" "$old.log"
        fi
    done
    tmp=$(mktemp -d "$QEMU11_ROOT/.tmp-XXXXXX")
    echo $$ >"$tmp.pid"
    RIG_CLEANUP+=("rm -rf --one-file-system -- $(printf %q "$tmp"); rm -f -- $(printf %q "$tmp.pid")")
    local dlog="$tmp.log"
    : >"$dlog"

    log "debootstrap --variant=minbase $SUITE from $mirror (1-3 min)"
    run_logged "$dlog" debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$tmp" "$mirror" ||
        die "debootstrap failed (log: $dlog)"
    # apt in the tree: same archive, plus backports; host's Acquire/proxy settings.
    cat >"$tmp/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $SUITE $SUITE-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    : >"$tmp/etc/apt/sources.list"
    apt-config dump | grep -E '^Acquire::(Check-Valid-Until|Check-Date|https?::[Pp]roxy|ftp::[Pp]roxy)' \
        >"$tmp/etc/apt/apt.conf.d/90host-acquire" || true
    printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
    chmod +x "$tmp/usr/sbin/policy-rc.d"

    log "apt-get update in the $SUITE tree"
    run_logged "$dlog" chroot "$tmp" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        apt-get update || die "apt-get update in the tree failed (log: $dlog)"
    log "installing qemu-system-x86 from $SUITE-backports (1-2 min)"
    run_logged "$dlog" chroot "$tmp" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        -t "$SUITE-backports" qemu-system-x86 || die "installing qemu-system-x86 in the tree failed (log: $dlog)"
    chroot "$tmp" apt-get clean >/dev/null 2>&1 || true

    local v
    v=$(QEMU11_DIR="$tmp" "$RIG_ROOT/scripts/qemu-11.sh" -version | sed -n 's/^QEMU emulator version \([0-9.]*\).*/\1/p')
    [[ -n $v ]] || die "the installed QEMU does not run (log: $dlog)"
    version_ge "$v" "$MIN_DAX" || die "$SUITE-backports gave QEMU $v, need >= $MIN_DAX"
    printf '%s\n' "$v" >"$tmp/.complete"
    chmod 755 "$tmp"
    mv -T -- "$tmp" "$QEMU11_DIR"
    RIG_CLEANUP=()
    rm -f -- "$tmp.pid"
    mv -f -- "$dlog" "$QEMU11_DIR.log"
    log "QEMU $v ready in $QEMU11_DIR ($(du -sh "$QEMU11_DIR" | cut -f1))"
}

case $what in
    system) provision_system ;;
    11) provision_11 ;;
    all) provision_system; provision_11 ;;
esac
