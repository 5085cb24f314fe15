#!/usr/bin/env bash
# Starts the daemon exactly as one launcher does, in place of scripts/vm.sh's own daemon
# command line (vm.sh runs it as `cmdline.sh --socket-path=S --shared-dir=D --cache=C`).
#
#   LAUNCHER_CASE  kata-go | kata-rs | podman
#   LAUNCHER_BIN   the daemon binary (daxfsd or upstream virtiofsd)
#   LAUNCHER_ERR   file that receives a copy of the daemon's stderr
#
# The command lines are the ones the launchers' sources build (see
# /work/shared/notes/platform.md "How launchers start virtiofsd" and the README's drop-in
# section): only the socket and the share are this run's.
set -euo pipefail
sock="" share=""
for a in "$@"; do
    case $a in
        --socket-path=*) sock=${a#*=} ;;
        --shared-dir=*) share=${a#*=} ;;
    esac
done
[[ -n $sock && -n $share ]] || { echo "cmdline.sh: no --socket-path/--shared-dir" >&2; exit 2; }
bin=${LAUNCHER_BIN:?} err=${LAUNCHER_ERR:?}
exec 2> >(tee -a "$err" >&2)
case ${LAUNCHER_CASE:?} in
    kata-go)
        # Kata's Go runtime: a listening socket passed as fd 3; SIGKILL at the end.
        exec python3 - "$sock" "$bin" --syslog --cache=auto "--shared-dir=$share" --fd=3 \
            --thread-pool-size=1 --announce-submounts <<'PY'
import os, socket, sys
path, argv = sys.argv[1], sys.argv[2:]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(1)
os.dup2(s.fileno(), 3)
os.set_inheritable(3, True)
os.execv(argv[0], argv)
PY
        ;;
    kata-rs)
        # Kata's runtime-rs, which then waits for "Waiting for vhost-user socket connection...".
        exec "$bin" --socket-path "$sock" --shared-dir "$share" --cache auto --sandbox none \
            --seccomp none --xattr
        ;;
    podman)
        # podman machine (QEMU provider): the share is the working directory.
        cd "$share"
        RUST_LOG=ERROR exec "$bin" --sandbox none --socket-path "$sock" --shared-dir . --seccomp=none
        ;;
    *) echo "cmdline.sh: unknown LAUNCHER_CASE '$LAUNCHER_CASE'" >&2; exit 2 ;;
esac
