#!/usr/bin/env python3
"""Lists non-test Rust functions longer than a limit (issue #41: at most 150 lines each).

Usage: scripts/long-functions.py [LIMIT] [DIR...]   (default 150, daemon/src)
Prints `lines path:line name` per function over the limit, longest first; exits 1 when any.
A function is counted from its `fn` line to the line of its closing brace, found by brace
depth outside strings, chars and comments. `#[cfg(test)]` items, files named tests.rs or
*_tests.rs, and files in a tests/ folder are skipped.
"""
import os
import re
import sys

FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?"
                r"(?:extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)")


def strip(line, state):
    """The line without strings, chars and comments; `state` carries a block comment."""
    out, i = [], 0
    while i < len(line):
        if state["block"]:
            j = line.find("*/", i)
            if j < 0:
                return "".join(out)
            state["block"], i = False, j + 2
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"], i = True, i + 2
            continue
        if c == '"':
            i += 1
            while i < len(line) and line[i] != '"':
                i += 2 if line[i] == "\\" else 1
            i += 1
            continue
        if c == "'" and re.match(r"'(\\.|[^\\'])'", line[i:i + 4]):
            i += len(re.match(r"'(\\.|[^\\'])'", line[i:i + 4]).group(0))
            continue
        out.append(c)
        i += 1
    return "".join(out)


def functions(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    state = {"block": False}
    code = [strip(line, state) for line in lines]
    skip_depth = None  # depth at which a #[cfg(test)] item began
    pending_test = False
    depth = 0
    stack = []  # (name, start line, depth at its body)
    for n, text in enumerate(code, 1):
        if "#[cfg(test)]" in lines[n - 1]:
            pending_test = True
        m = FN.match(text)
        if m and skip_depth is None and not pending_test:
            stack.append((m.group(1), n, depth))
        for ch in text:
            if ch == "{":
                if pending_test and skip_depth is None:
                    skip_depth = depth
                    pending_test = False
                depth += 1
            elif ch == "}":
                depth -= 1
                if skip_depth is not None and depth == skip_depth:
                    skip_depth = None
                while stack and stack[-1][2] == depth and depth >= 0:
                    name, start, _ = stack.pop()
                    yield name, start, n - start + 1
        if ";" in text and stack and stack[-1][2] == depth and "{" not in text:
            # A declaration without a body (trait method).
            if text.rstrip().endswith(";"):
                stack.pop()
        if pending_test and text.strip().endswith(";"):
            pending_test = False


def main():
    args = sys.argv[1:]
    limit = int(args.pop(0)) if args and args[0].isdigit() else 150
    roots = args or ["daemon/src"]
    found = []
    for root in roots:
        for d, _, files in os.walk(root):
            for f in files:
                if (not f.endswith(".rs") or f == "tests.rs" or f.endswith("_tests.rs")
                        or "tests" in os.path.relpath(d, root).split(os.sep)):
                    continue
                p = os.path.join(d, f)
                found += [(ln, p, s, name) for name, s, ln in functions(p) if ln > limit]
    for ln, p, s, name in sorted(found, reverse=True):
        print(f"{ln:5} {p}:{s} {name}")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
