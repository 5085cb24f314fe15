#!/usr/bin/env bash
# Run the trixie-backports QEMU (>= 11.1) in place, through its own tree's
# dynamic loader and libraries, with its own firmware, data and modules.
# Same arguments as qemu-system-x86_64. Provision it with `make qemu`.
#   QEMU11_DIR  the tree (default: what provision-qemu.sh built)
set -euo pipefail
if [[ -z ${QEMU11_DIR:-} ]]; then
    QEMU11_DIR=$("$(dirname "${BASH_SOURCE[0]}")/provision-qemu.sh" 11 --print-path) ||
        { echo "qemu-11: error: QEMU 11 is not provisioned; run 'make qemu'" >&2; exit 1; }
fi
d=$QEMU11_DIR
[[ -x $d/usr/bin/qemu-system-x86_64 ]] ||
    { echo "qemu-11: error: $d/usr/bin/qemu-system-x86_64 missing; run 'make qemu'" >&2; exit 1; }
# Modules (accel, ui, ...) are looked up in a compiled-in host path otherwise.
export QEMU_MODULE_DIR="$d/usr/lib/x86_64-linux-gnu/qemu"
# Firmware links in usr/share/qemu are absolute (/usr/share/seabios/...): list
# the tree's real firmware directories first so host files are never used.
exec "$d/lib64/ld-linux-x86-64.so.2" \
    --library-path "$d/usr/lib/x86_64-linux-gnu:$d/lib/x86_64-linux-gnu" \
    "$d/usr/bin/qemu-system-x86_64" \
    -L "$d/usr/share/seabios" -L "$d/usr/share/qemu" "$@"
