#!/usr/bin/env bash
# Build the daxfsd guest kernel (bzImage, everything built in) from Debian's
# linux-source-6.12: tinyconfig + config.fragment + patches/*.patch.
#
#   guest-kernel/build.sh [--print-path] [--force] [--fragment FILE]
#
# The result is cached at $DAXFSD_CACHE/kernel/<key>/bzImage, key = source
# package version + hash of fragment and patches. --fragment FILE merges one
# more fragment after config.fragment (a variant kernel with its own key, e.g.
# tests/fstests/kernel.fragment: block devices and ext4); the default kernel
# and its key are unchanged without it. Prints the bzImage path on
# stdout; progress goes to stderr, kbuild output to <key>/build.log.
set -euo pipefail
RIG_TAG=kernel
# shellcheck source=../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"

SRC_PKG=linux-source-6.12
SRC_TARBALL=/usr/src/linux-source-6.12.tar.xz
HERE="$RIG_ROOT/guest-kernel"
FRAGMENT="$HERE/config.fragment"
# Bump when this script changes how the kernel is built.
RECIPE=1

print_only=0 force=0 extra=""
while (($#)); do
    case $1 in
        --print-path) print_only=1 ;;
        --force) force=1 ;;
        --fragment) (($# >= 2)) || die "--fragment needs a file"; extra=$2; shift ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) die "unknown argument '$1' (use --print-path, --force or --fragment FILE)" ;;
    esac
    shift
done
[[ -z $extra || -r $extra ]] || die "fragment '$extra' not readable"

version=$(deb_version "$SRC_PKG")
[[ -n $version && -r $SRC_TARBALL ]] ||
    die "$SRC_PKG is not installed ($SRC_TARBALL missing); run 'make vm-deps'"
mapfile -t patches < <(find "$HERE/patches" -maxdepth 1 -name '*.patch' -type f | LC_ALL=C sort)
key="${version//[^A-Za-z0-9.+-]/_}-$(printf 'recipe %s\n' "$RECIPE" | cat - "$FRAGMENT" | sha256sum | cut -c1-8)"
if ((${#patches[@]})); then
    key="$key-$(hash_inputs "${patches[@]}" | cut -c1-8)"
fi
[[ -z $extra ]] || key="$key-x$(sha256sum <"$extra" | cut -c1-8)"
out_dir="$DAXFSD_CACHE/kernel/$key"
image="$out_dir/bzImage"

if ((print_only)); then printf '%s\n' "$image"; exit 0; fi
if [[ -s $image && $force -eq 0 ]]; then
    log "cached: $image"
    printf '%s\n' "$image"
    exit 0
fi

for c in make gcc flex bison bc perl lz4 patch; do need_cmd "$c"; done
[[ -r /usr/include/libelf.h ]] || die "libelf headers missing; run 'make vm-deps' (libelf-dev)"
[[ -r /usr/include/openssl/ssl.h ]] || die "OpenSSL headers missing; run 'make vm-deps' (libssl-dev)"

mkdir -p "$DAXFSD_CACHE/kernel"
work=$(mktemp -d "$DAXFSD_CACHE/kernel/.build-$key.XXXXXX")
RIG_CLEANUP+=("rm -rf -- $(printf %q "$work")")
buildlog="$work/build.log"
: >"$buildlog"
jobs=$(nproc)

log "key $key; building in $work (log: $DAXFSD_CACHE/kernel/$key.build.log on failure)"
fail() {
    cp -f -- "$buildlog" "$DAXFSD_CACHE/kernel/$key.build.log" 2>/dev/null || true
    die "$1 (full log: $DAXFSD_CACHE/kernel/$key.build.log)"
}

log "unpacking $SRC_TARBALL ($SRC_PKG $version)"
run_logged "$buildlog" tar -C "$work" -xf "$SRC_TARBALL" || fail "unpack failed"
src="$work/linux-source-6.12"
[[ -d $src ]] || fail "unexpected tarball layout: no linux-source-6.12/ directory"

for p in "${patches[@]}"; do
    log "applying patch ${p##*/}"
    run_logged "$buildlog" patch -d "$src" -p1 --forward --batch -i "$p" || fail "patch ${p##*/} does not apply"
done

kmake=(make -C "$src" ARCH=x86_64)

log "configuring: tinyconfig + ${FRAGMENT#"$RIG_ROOT"/} + olddefconfig"
run_logged "$buildlog" "${kmake[@]}" tinyconfig || fail "make tinyconfig failed"
fragments=("$FRAGMENT")
[[ -z $extra ]] || fragments+=("$extra")
run_logged "$buildlog" "$src/scripts/kconfig/merge_config.sh" -m -O "$src" "$src/.config" "${fragments[@]}" ||
    fail "merging the fragment failed"
run_logged "$buildlog" "${kmake[@]}" olddefconfig || fail "make olddefconfig failed"

# Every option the fragment asks for must be in the final .config as asked.
missing=()
while IFS= read -r line; do
    case $line in
        CONFIG_*=*)
            grep -qxF -- "$line" "$src/.config" || missing+=("$line (have: $(grep -E "^(# )?${line%%=*}[= ]" "$src/.config" || echo unset))")
            ;;
        "# CONFIG_"*" is not set")
            opt=${line#\# }; opt=${opt%% *}
            grep -q "^$opt=" "$src/.config" && missing+=("$line (have: $(grep "^$opt=" "$src/.config"))")
            ;;
    esac
done < <(cat -- "${fragments[@]}")
if ((${#missing[@]})); then
    printf 'kernel: error: required option not in the final .config: %s\n' "${missing[@]}" >&2
    fail "${#missing[@]} required option(s) missing after olddefconfig (a dependency is unmet)"
fi
log "config verified: all $(cat -- "${fragments[@]}" | grep -cE '^(CONFIG_|# CONFIG_.* is not set)') fragment options present"

log "compiling bzImage with -j$jobs (about 5 min on 2 cores)"
run_logged "$buildlog" "${kmake[@]}" -j"$jobs" bzImage || fail "kernel build failed"
built="$src/arch/x86/boot/bzImage"
[[ -s $built ]] || fail "build finished without $built"

stage="$work/out"
mkdir -p "$stage"
cp -- "$built" "$stage/bzImage"
cp -- "$src/.config" "$stage/config"
cp -- "$buildlog" "$stage/build.log"
printf '%s %s\n' "$SRC_PKG" "$version" >"$stage/source"
rm -rf -- "$out_dir"
mv -- "$stage" "$out_dir"
log "done: $image ($(du -h "$image" | cut -f1))"
printf '%s\n' "$image"
