#!/usr/bin/env bash
# Build the test guest's initramfs: busybox (static), fio, setfacl/getfacl
# (acl), setfattr/getfattr (attr) and inotifywait (inotify-tools) with every
# library they link and the
# loader, the static helper tests/e2e/guest/vfstest.c, the
# guest /init and the e2e suite. Uncompressed newc cpio (fastest to unpack
# under TCG), reproducible, cached by a hash of all its inputs at
#   $DAXFSD_CACHE/initramfs/<key>/initramfs.cpio
#
#   scripts/build-initramfs.sh [--force]     prints the cpio path on stdout
set -euo pipefail
RIG_TAG=initramfs
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

GUEST="$RIG_ROOT/tests/e2e/guest"
BUSYBOX=/bin/busybox
FIO=/usr/bin/fio
# ACL and xattr tools for the guest checks of --posix-acl and --xattrmap (tests/e2e/acl.sh);
# a real file watcher for the notification checks (tests/e2e/notify.sh).
TOOLS=(/usr/bin/setfacl /usr/bin/getfacl /usr/bin/setfattr /usr/bin/getfattr /usr/bin/inotifywait)

force=0
case ${1:-} in
    --force) force=1 ;;
    "") ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (only --force)" ;;
esac

need_cmd gcc gcc
need_cmd python3 python3
need_cmd ldd libc-bin
[[ -x $FIO ]] || die "$FIO missing; run 'make vm-deps' (package fio)"
[[ -x $BUSYBOX && $(ldd "$BUSYBOX" 2>&1 || true) == *"not a dynamic"* ]] ||
    die "$BUSYBOX is missing or not static; run 'make vm-deps' (package busybox-static)"
[[ -r /usr/lib/x86_64-linux-gnu/libc.a ]] || die "static libc missing; run 'make vm-deps' (libc6-dev)"
for t in "${TOOLS[@]}"; do
    [[ -x $t ]] || die "$t missing; run 'make vm-deps' (packages acl, attr and inotify-tools)"
done

# The libraries of fio and the tools as "host-path" lines, plus the program interpreter.
mapfile -t fio_libs < <(ldd "$FIO" "${TOOLS[@]}" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $1 !~ /:$/ { print $1 }' | LC_ALL=C sort -u)
((${#fio_libs[@]} > 1)) || die "ldd $FIO listed no libraries"
for lib in "${fio_libs[@]}"; do [[ -r $lib ]] || die "fio library $lib is not readable"; done

sources=("$0" "$RIG_ROOT/scripts/mkcpio.py" "$GUEST/init" "$GUEST/suite.sh" "$GUEST/vfstest.c")
key=$( {
    hash_inputs "${sources[@]}"
    gcc --version | head -n1
    sha256sum "$BUSYBOX" "$FIO" "${TOOLS[@]}" "${fio_libs[@]}"
} | sha256sum | cut -c1-16)
out_dir="$DAXFSD_CACHE/initramfs/$key"
cpio="$out_dir/initramfs.cpio"
if [[ -s $cpio && $force -eq 0 ]]; then
    log "cached: $cpio"
    printf '%s\n' "$cpio"
    exit 0
fi

mkdir -p "$DAXFSD_CACHE/initramfs"
work=$(mktemp -d "$DAXFSD_CACHE/initramfs/.build-$key.XXXXXX")
RIG_CLEANUP+=("rm -rf -- $(printf %q "$work")")
root="$work/root"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,etc,proc,sys,dev,tmp,run,mnt,root,e2e}
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"

log "compiling tests/e2e/guest/vfstest.c (gcc -static)"
gcc -static -O2 -Wall -Wextra -Werror -o "$root/e2e/vfstest" "$GUEST/vfstest.c" 2>"$work/gcc.log" ||
    { cat "$work/gcc.log" >&2; die "compiling vfstest.c failed"; }

log "busybox $("$BUSYBOX" 2>&1 | head -n1 | awk '{print $2}') with its applet links"
install -m 755 "$BUSYBOX" "$root/bin/busybox"
while IFS= read -r applet; do
    [[ -e $root/$applet || -L $root/$applet ]] && continue
    mkdir -p "$root/$(dirname "$applet")"
    ln -s /bin/busybox "$root/$applet"
done < <("$BUSYBOX" --list-full)

log "fio $("$FIO" --version) with ${#fio_libs[@]} libraries"
install -m 755 "$FIO" "$root/usr/bin/fio"
for t in "${TOOLS[@]}"; do
    rm -f -- "$root$t" # a busybox applet link of the same name
    install -m 755 "$t" "$root$t"
done
for lib in "${fio_libs[@]}"; do
    # Merged /usr: /lib/... and /lib64/... live under usr/ in the image.
    dest=$lib
    case $dest in /lib/*|/lib64/*) dest=/usr$dest ;; esac
    mkdir -p "$root$(dirname "$dest")"
    cp -L -- "$lib" "$root$dest"
done

install -m 755 "$GUEST/init" "$root/init"
install -m 755 "$GUEST/suite.sh" "$root/e2e/suite.sh"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
# shellcheck disable=SC2016 # expanded by the guest shell
printf 'export PS1='"'"'daxfsd-guest:$PWD# '"'"'\ncd /mnt 2>/dev/null\n' >"$root/etc/profile"

# Every library fio needs must resolve inside the image.
missing=$("$root/usr/lib64/ld-linux-x86-64.so.2" --inhibit-cache \
    --library-path "$root/usr/lib/x86_64-linux-gnu" "$root/usr/bin/fio" --version 2>&1 >/dev/null || true)
[[ -z $missing ]] || die "fio does not run inside the image: $missing"
for t in "${TOOLS[@]}"; do
    # --help: inotifywait has no --version.
    missing=$("$root/usr/lib64/ld-linux-x86-64.so.2" --inhibit-cache \
        --library-path "$root/usr/lib/x86_64-linux-gnu" "$root$t" --help 2>&1 >/dev/null || true)
    [[ -z $missing ]] || die "$t does not run inside the image: $missing"
done

log "writing uncompressed cpio"
mkdir -p "$work/out"
SOURCE_DATE_EPOCH=0 python3 "$RIG_ROOT/scripts/mkcpio.py" "$work/out/initramfs.cpio" "$root" \
    --node dev/console:c:5:1:600 --node dev/null:c:1:3:666
rm -rf -- "$out_dir"
mv -T -- "$work/out" "$out_dir"
# Keep the five newest images (each is ~85 MB; several worktrees may be using different
# ones at once); older ones are ours to drop.
find "$DAXFSD_CACHE/initramfs" -mindepth 1 -maxdepth 1 -type d ! -name '.*' -printf '%T@ %p\n' |
    sort -rn | tail -n +6 | cut -d' ' -f2- | while IFS= read -r old; do rm -rf -- "$old"; done
log "done: $cpio ($(du -h "$cpio" | cut -f1))"
printf '%s\n' "$cpio"
