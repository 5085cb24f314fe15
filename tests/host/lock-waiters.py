#!/usr/bin/env python3
"""N processes wait with F_SETLKW for a write lock another process holds on a file of a
mount, then the holder closes the file: its close (FLUSH: the unlock) must return at once,
and every waiter must get the lock in turn, one at a time, within BOUND seconds.

    lock-waiters.py MOUNTDIR N BOUND

Prints "LOCK-WAITERS-OK ..." on success, else what went wrong, and exits non-zero.
"""
import fcntl
import os
import select
import sys
import time

m, n, bound = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
f = os.path.join(m, "lockfile")
with open(f, "w") as fh:
    fh.write("locked\n")
h = os.open(f, os.O_RDWR)
fcntl.lockf(h, fcntl.LOCK_EX)
r, w = os.pipe()
kids = []
for i in range(n):
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.close(h)
            fd = os.open(f, os.O_RDWR)
            fcntl.lockf(fd, fcntl.LOCK_EX)
            # "+" when the lock is ours, "-" just before the close that frees it: the
            # sequence shows whether two waiters ever held it at once.
            os.write(w, b"+")
            time.sleep(0.002)
            os.write(w, b"-")
            os.close(fd)
        except OSError:
            os._exit(1)
        os._exit(0)
    kids.append(pid)
os.close(w)
# Every waiter is in by now; none may have the lock.
time.sleep(2)
if select.select([r], [], [], 0)[0]:
    print("a waiter had the lock while its holder held it")
    sys.exit(1)
t0 = time.monotonic()
# A close whose FLUSH is never served waits uninterruptibly: the caller bounds that.
os.close(h)
closed = time.monotonic() - t0
seq = b""
while seq.count(b"-") < n:
    left = bound - (time.monotonic() - t0)
    if left <= 0 or not select.select([r], [], [], left)[0]:
        print(f"{seq.count(b'-')} of {n} waiters had the lock within {bound:.0f} s "
              f"(holder's close took {closed:.2f} s)")
        sys.exit(1)
    b = os.read(r, 4096)
    if not b:
        print(f"waiters ended early: {seq!r}")
        sys.exit(1)
    seq += b
took = time.monotonic() - t0
if seq != b"+-" * n:
    print(f"two waiters held the lock at once: {seq!r}")
    sys.exit(1)
for k in kids:
    if os.waitpid(k, 0)[1] != 0:
        print(f"waiter {k} failed")
        sys.exit(1)
print(f"LOCK-WAITERS-OK {n} waiters had the lock in turn in {took:.2f} s "
      f"(holder's close {closed:.2f} s)")
