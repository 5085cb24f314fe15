"""Small helpers the bench scripts share (bench/daemon-wrap.py, bench/host.py, bench/meta.py,
bench/notify.py)."""
import itertools
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


def rank_sum_p(xs, ys):
    """One-sided exact Wilcoxon rank-sum (Mann-Whitney) test: the probability, were xs and
    ys drawn from one distribution, that xs' rank sum is at least the one observed (small:
    xs are larger). Every split of the pooled samples is counted (ties share their mean
    rank), so it is exact for the handful of boots a bench row has (6 and 6: 924 splits).
    None with fewer than 2 values on either side.

    >>> rank_sum_p([5, 6, 7], [1, 2, 3])  # the one split of 20 with every x above every y
    0.05
    >>> rank_sum_p([1, 2, 3], [5, 6, 7])
    1.0
    >>> rank_sum_p([2, 2], [2, 2])  # all tied: every split is as large
    1.0
    >>> rank_sum_p([1], [2, 3]) is None
    True
    """
    if len(xs) < 2 or len(ys) < 2:
        return None
    pooled = sorted(xs + ys)
    rank = {}
    for v in set(pooled):
        first = pooled.index(v)
        rank[v] = first + (pooled.count(v) + 1) / 2
    ranks = [rank[v] for v in xs + ys]
    seen = sum(ranks[:len(xs)])
    splits = list(itertools.combinations(ranks, len(xs)))
    return sum(1 for c in splits if sum(c) >= seen - 1e-9) / len(splits)


def verdict(ours, peer, alpha=0.05):
    """'faster', 'slower' or 'level' for times `ours` against `peer` (lower is better): faster
    or slower only where the one-sided rank-sum test says so at `alpha`; '-' without data.

    >>> verdict([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    'faster (p=0.004)'
    >>> verdict([6, 7, 8, 9, 10], [1, 2, 3, 4, 5])
    'slower (p=0.004)'
    >>> verdict([1, 3, 5, 7, 9], [2, 4, 6, 8, 10])
    'level (p=0.35)'
    >>> verdict([1.0], [1.0, 2.0])
    '-'
    """
    p_slower = rank_sum_p(ours, peer)
    if p_slower is None:
        return "-"
    p_faster = rank_sum_p(peer, ours)
    if p_faster < alpha:
        return f"faster (p={p_faster:.3f})"
    if p_slower < alpha:
        return f"slower (p={p_slower:.3f})"
    return f"level (p={min(p_faster, p_slower):.2f})"


def run_rows(log, label, items, run, rows, save, ok):
    """Runs one boot (or run) per item and keeps going past failures: for each (name, start
    message, item) it logs the message, appends run(item) (a dict with a "status") to rows,
    logs "LABEL NAME: ok(row)" or the row's error (with its console log, when it has one),
    and saves.

    >>> said, rows = [], []
    >>> run = lambda i: {"status": "ok"} if i else {"status": "failed", "error": "no boot"}
    >>> run_rows(said.append, "x", [("a", "x: a", 1), ("b", "x: b", 0)], run, rows,
    ...          lambda: said.append("saved"), lambda r: "fine")
    >>> said
    ['x: a', 'x a: fine', 'saved', 'x: b', 'ERROR x b: no boot', 'saved']
    >>> len(rows)
    2
    """
    for name, start, item in items:
        log(start)
        r = run(item)
        rows.append(r)
        if r["status"] == "ok":
            log(f"{label} {name}: {ok(r)}")
        else:
            where = f"; console log {r['console_log']}" if r.get("console_log") else ""
            log(f"ERROR {label} {name}: {r.get('error')}{where}")
        save()
