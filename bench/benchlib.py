"""Small helpers the bench scripts share (bench/daemon-wrap.py, bench/host.py, bench/meta.py)."""
import os


def descendants(pid):
    """pid and all its descendants (via /proc/PID/task/TID/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                pass
    return out


def ratio(a, b):
    """a / b as '1.23x', '-' when either is missing or zero."""
    if not a or not b:
        return "-"
    return f"{a / b:.2f}x"
