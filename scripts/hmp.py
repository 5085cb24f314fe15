#!/usr/bin/env python3
"""Send commands to QEMU's human monitor on a UNIX socket and print the replies.

    scripts/hmp.py SOCKET COMMAND [COMMAND...]

Waits up to 30 s for the socket to accept, sends each command after the
"(qemu) " prompt and prints what QEMU answered. Exit status 1 when the socket
cannot be reached or QEMU closes it.
"""
import socket
import sys
import time

PROMPT = b"(qemu) "


def read_prompt(s: socket.socket, timeout: float) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while not buf.endswith(PROMPT):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no monitor prompt within %.0f s" % timeout)
        s.settimeout(left)
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError("QEMU closed the monitor")
        buf += chunk
    return buf[: -len(PROMPT)]


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path, cmds = sys.argv[1], sys.argv[2:]
    deadline = time.monotonic() + 30
    while True:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            break
        except OSError as e:
            if time.monotonic() > deadline:
                print("hmp: cannot connect to %s: %s" % (path, e), file=sys.stderr)
                return 1
            time.sleep(0.1)
    try:
        read_prompt(s, 30)
        for cmd in cmds:
            s.sendall(cmd.encode() + b"\n")
            out = read_prompt(s, 120).decode(errors="replace")
            # QEMU echoes the command (with terminal escapes) before its answer.
            lines = [l for l in out.replace("\r", "").split("\n")[1:] if l.strip()]
            if lines:
                print("\n".join(lines))
    except (OSError, TimeoutError, ConnectionError) as e:
        print("hmp: %s" % e, file=sys.stderr)
        return 1
    finally:
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
