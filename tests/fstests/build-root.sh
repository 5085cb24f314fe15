#!/usr/bin/env bash
# Build (once) the fstests guest root: a Debian 12 minbase tree made with debootstrap, the
# packages fstests needs, fstests itself built from the vendored tarball (on the host, in the
# tree with chroot: much faster than in a TCG guest), the fstests users, and an ext4 image of
# the tree the harness boots from a virtio-blk disk.
#
#   tests/fstests/build-root.sh [--print-path]
#
# Cached at $DAXFSD_CACHE/fstests/<key>/root.img; key = the tarball's sha256, the package
# list, the guest boot files and RECIPE. Prints the image path. Needs root (debootstrap,
# chroot). The mirror is this machine's own (apt configuration), never a built-in host.
#   FSTESTS_TARBALL   the fstests source (default: ../shared/vendor/ beside the repository)
set -euo pipefail
RIG_TAG=fstests-root
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
HERE=$RIG_ROOT/tests/fstests

# Bump when the recipe below changes.
RECIPE=1
SUITE=bookworm
# The vendored fstests: tag v2026.01.27 (../shared/vendor/README.md has the same checksum).
TARBALL=${FSTESTS_TARBALL:-$RIG_ROOT/../shared/vendor/xfstests-v2026.01.27.tar.gz}
TARBALL_SHA256=533161623934abb32a123b4193813da4481345000ae3d4a8176fb75117abe36a
# What fstests needs in the guest (to build it and to run it): platform.md, fstests README.
PACKAGES=(
    # build
    make gcc libc6-dev autoconf automake libtool pkgconf xfslibs-dev uuid-dev libacl1-dev
    libattr1-dev libaio-dev liburing-dev libgdbm-dev libcap-dev
    # run
    xfsprogs e2fsprogs acl attr util-linux psmisc bc gawk procps kmod libcap2-bin file
    python3 perl
)

print_only=0
for arg in "$@"; do
    case $arg in
        --print-path) print_only=1 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) die "unknown argument '$arg' (use --print-path)" ;;
    esac
done

[[ -r $TARBALL ]] || die "fstests source $TARBALL missing (../shared/vendor beside the repository; FSTESTS_TARBALL=FILE)"
key="r$RECIPE-$(cut -c1-12 <<<"$TARBALL_SHA256")-$({ printf '%s\n' "$SUITE" "${PACKAGES[@]}"; cat -- "$HERE/guest-boot.sh" "$HERE/poweroff.c"; } | sha256sum | cut -c1-12)"
out_dir="$DAXFSD_CACHE/fstests/$key"
image=$out_dir/root.img

if ((print_only)); then printf '%s\n' "$image"; exit 0; fi
if [[ -s $image && -f $out_dir/.complete ]]; then
    log "cached: $image"
    printf '%s\n' "$image"
    exit 0
fi

have=$(sha256sum <"$TARBALL" | cut -d' ' -f1)
[[ $have == "$TARBALL_SHA256" ]] || die "$TARBALL: sha256 $have, expected $TARBALL_SHA256"
[[ $(id -u) -eq 0 ]] || die "building the fstests root needs root (debootstrap, chroot)"
need_cmd debootstrap debootstrap
need_cmd mkfs.ext4 e2fsprogs
mirror=$(apt_mirror_uri) || die "no Debian archive URI found in /etc/apt/sources.list{,.d}"

mkdir -p "$DAXFSD_CACHE/fstests"
# One builder at a time; a build that failed part way resumes after its last finished stage
# (stamps in the work directory), so a failed package install does not redo debootstrap.
exec 9>"$DAXFSD_CACHE/fstests/.lock-$key"
flock -n 9 || { log "another build of $key runs; waiting for it"; flock 9; }
if [[ -s $image && -f $out_dir/.complete ]]; then
    log "cached: $image"
    printf '%s\n' "$image"
    exit 0
fi
tmp=$DAXFSD_CACHE/fstests/.tmp-$key
tree=$tmp/tree
mkdir -p "$tmp"
mounted=()
unmount_all() {
    local m
    for m in "${mounted[@]}"; do umount -l -- "$m" 2>/dev/null || true; done
    mounted=()
}
RIG_CLEANUP+=("unmount_all")
blog=$tmp/build.log
fail() {
    cp -f -- "$blog" "$DAXFSD_CACHE/fstests/$key.build.log" 2>/dev/null || true
    die "$1 (log: $DAXFSD_CACHE/fstests/$key.build.log; the next run resumes)"
}
in_tree=(chroot "$tree" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8)
stage_done() { [[ -f $tmp/.stage-$1 ]]; }
stage_ok() { : >"$tmp/.stage-$1"; }

if ! stage_done debootstrap; then
    rm -rf --one-file-system -- "$tree"
    log "debootstrap --variant=minbase $SUITE from $mirror (2-4 min)"
    run_logged "$blog" nice -n 10 debootstrap --variant=minbase "$SUITE" "$tree" "$mirror" || fail "debootstrap failed"
    stage_ok debootstrap
fi
cat >"$tree/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $SUITE
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
: >"$tree/etc/apt/sources.list"
apt-config dump | grep -E '^Acquire::(Check-Valid-Until|Check-Date|https?::[Pp]roxy|ftp::[Pp]roxy)' \
    >"$tree/etc/apt/apt.conf.d/90host-acquire" || true
printf '#!/bin/sh\nexit 101\n' >"$tree/usr/sbin/policy-rc.d"
chmod +x "$tree/usr/sbin/policy-rc.d"
for m in proc sys dev; do
    mount --bind "/$m" "$tree/$m"
    mounted=("$tree/$m" "${mounted[@]}")
done

if ! stage_done packages; then
    log "apt-get install ${#PACKAGES[@]} packages in the tree (2-4 min)"
    run_logged "$blog" "${in_tree[@]}" apt-get update || fail "apt-get update in the tree failed"
    run_logged "$blog" "${in_tree[@]}" DEBIAN_FRONTEND=noninteractive nice -n 10 apt-get install -y \
        --no-install-recommends "${PACKAGES[@]}" || fail "installing the packages failed"
    "${in_tree[@]}" apt-get clean >/dev/null 2>&1 || true
    stage_ok packages
fi

if ! stage_done fstests; then
    log "building fstests ($(basename "$TARBALL")) in the tree (3-6 min)"
    rm -rf -- "$tree/opt/xfstests"
    mkdir -p "$tree/opt"
    tar -C "$tree/opt" -xzf "$TARBALL" || fail "unpacking $TARBALL failed"
    [[ -d $tree/opt/xfstests ]] || fail "unexpected tarball layout: no xfstests/ directory"
    run_logged "$blog" "${in_tree[@]}" nice -n 10 make -C /opt/xfstests -j"$(nproc)" || fail "building fstests failed"
    [[ -x $tree/opt/xfstests/ltp/fsx && -x $tree/opt/xfstests/ltp/fsstress ]] || fail "fstests built without fsx/fsstress"
    stage_ok fstests
fi

log "users, boot files"
# fstests' users (README: fsgqa, fsgqa2 and the digit-leading 123456-fsgqa).
for u in fsgqa fsgqa2 123456-fsgqa; do
    "${in_tree[@]}" id "$u" >/dev/null 2>&1 && continue
    run_logged "$blog" "${in_tree[@]}" useradd -m --badname "$u" || fail "useradd $u"
done
install -m 0755 "$HERE/guest-boot.sh" "$tree/sbin/fstests-boot"
cp -- "$HERE/poweroff.c" "$tree/tmp/poweroff.c"
run_logged "$blog" "${in_tree[@]}" gcc -O2 -o /sbin/fstests-poweroff /tmp/poweroff.c || fail "building poweroff"
rm -f -- "$tree/tmp/poweroff.c"
printf 'fstests\n' >"$tree/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 fstests\n' >"$tree/etc/hosts"
: >"$tree/etc/fstab"
unmount_all

# The image: the tree plus room for results and fstests' files on the root (the run's writes
# go to a QEMU snapshot; the image itself is never written).
size_mb=$(( $(du -sm "$tree" | cut -f1) + 1024 ))
log "ext4 image of the tree (${size_mb} MiB)"
run_logged "$blog" mkfs.ext4 -q -F -L fstests-root -d "$tree" "$tmp/root.img" "${size_mb}M" || fail "mkfs.ext4 -d failed"
rm -rf -- "$tmp/out"
mkdir -p "$tmp/out"
mv -- "$tmp/root.img" "$tmp/out/root.img"
cp -- "$blog" "$tmp/out/build.log"
printf 'tarball %s\npackages %s\n' "$TARBALL_SHA256" "${PACKAGES[*]}" >"$tmp/out/.complete"
rm -rf -- "$out_dir"
mv -T -- "$tmp/out" "$out_dir"
rm -rf --one-file-system -- "$tmp"
log "done: $image ($(du -h "$image" | cut -f1) on disk)"
printf '%s\n' "$image"
