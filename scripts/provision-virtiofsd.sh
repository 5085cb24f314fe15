#!/usr/bin/env bash
# Install upstream virtiofsd (the reference daemon the rig tests and
# benchmarks daxfsd against) into $DAXFSD_CACHE/virtiofsd-<version>/bin.
# Idempotent; prints the binary path on stdout.
#
#   scripts/provision-virtiofsd.sh [--print-path]
set -euo pipefail
RIG_TAG=virtiofsd
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VERSION=1.14.0
root="$DAXFSD_CACHE/virtiofsd-$VERSION"
bin="$root/bin/virtiofsd"

case ${1:-} in
    --print-path) printf '%s\n' "$bin"; exit 0 ;;
    "") ;;
    *) die "unknown argument '$1' (only --print-path)" ;;
esac

if [[ -x $bin ]] && "$bin" --version 2>/dev/null | grep -qF "$VERSION"; then
    log "cached: $bin ($("$bin" --version | head -n1))"
    printf '%s\n' "$bin"
    exit 0
fi

need_cmd cargo
need_cmd pkg-config pkg-config
pkg-config --exists libseccomp || die "libseccomp-dev missing; run 'make vm-deps'"
pkg-config --exists libcap-ng || die "libcap-ng-dev missing; run 'make vm-deps'"

mkdir -p "$DAXFSD_CACHE"
# Build outside any work tree; install into a temp root, then rename.
export CARGO_TARGET_DIR="$DAXFSD_CACHE/cargo-target-virtiofsd"
tmp=$(mktemp -d "$DAXFSD_CACHE/.virtiofsd-$VERSION.XXXXXX")
RIG_CLEANUP+=("rm -rf -- $(printf %q "$tmp")")
blog="$DAXFSD_CACHE/virtiofsd-$VERSION.build.log"
: >"$blog"
log "cargo install --locked virtiofsd $VERSION (1-3 min; log: $blog)"
run_logged "$blog" cargo install --locked virtiofsd --version "$VERSION" --root "$tmp" ||
    die "cargo install virtiofsd $VERSION failed (log: $blog)"
"$tmp/bin/virtiofsd" --version | grep -qF "$VERSION" || die "installed virtiofsd does not report $VERSION"
chmod 755 "$tmp"
rm -rf -- "$root"
mv -T -- "$tmp" "$root"
RIG_CLEANUP=()
log "installed $bin"
printf '%s\n' "$bin"
