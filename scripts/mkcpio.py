#!/usr/bin/env python3
"""Write a reproducible, uncompressed newc cpio archive (Linux initramfs).

    mkcpio.py OUT DIR [--node PATH:c|b:MAJOR:MINOR:MODE ...]

Every file under DIR goes in, sorted by path, owned by 0:0, with a fixed
mtime (SOURCE_DATE_EPOCH, default 0) and inode numbers by position, so the
same tree always gives the same bytes. --node adds a device node (e.g.
dev/console:c:5:1:600) without needing root to mknod it.
"""
import os
import stat
import sys

MTIME = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))


def header(ino, mode, nlink, size, namesize, rmaj=0, rmin=0):
    fields = [ino, mode, 0, 0, nlink, MTIME, size, 0, 0, rmaj, rmin, namesize, 0]
    return b"070701" + b"".join(b"%08X" % f for f in fields)


def pad4(n):
    return b"\0" * ((4 - n % 4) % 4)


def entries(root):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in dirnames + sorted(filenames):
            full = os.path.join(dirpath, name)
            out.append(os.path.relpath(full, root))
    return sorted(out)


def main(argv):
    if len(argv) < 3:
        sys.exit("usage: mkcpio.py OUT DIR [--node PATH:c|b:MAJOR:MINOR:MODE ...]")
    out_path, root = argv[1], argv[2]
    nodes = []
    rest = argv[3:]
    while rest:
        if rest[0] != "--node" or len(rest) < 2:
            sys.exit("mkcpio.py: bad arguments: %s" % " ".join(rest))
        path, kind, major, minor, mode = rest[1].split(":")
        fmt = stat.S_IFCHR if kind == "c" else stat.S_IFBLK
        nodes.append((path, fmt | int(mode, 8), int(major), int(minor)))
        rest = rest[2:]

    ino = 0
    tmp = out_path + ".tmp"
    with open(tmp, "wb") as f:
        def emit(name, mode, nlink, data=b"", rmaj=0, rmin=0):
            nonlocal ino
            ino += 1
            bname = name.encode() + b"\0"
            hdr = header(ino, mode, nlink, len(data), len(bname), rmaj, rmin)
            f.write(hdr + bname + pad4(len(hdr) + len(bname)))
            f.write(data + pad4(len(data)))

        names = set()
        for rel in entries(root):
            st = os.lstat(os.path.join(root, rel))
            mode = st.st_mode
            names.add(rel)
            if stat.S_ISDIR(mode):
                emit(rel, mode, 2)
            elif stat.S_ISLNK(mode):
                emit(rel, mode, 1, os.readlink(os.path.join(root, rel)).encode())
            elif stat.S_ISREG(mode):
                with open(os.path.join(root, rel), "rb") as src:
                    emit(rel, mode, 1, src.read())
            else:
                sys.exit("mkcpio.py: unsupported file type: %s" % rel)
        for path, mode, major, minor in nodes:
            if path in names:
                sys.exit("mkcpio.py: --node %s already exists in the tree" % path)
            emit(path, mode, 1, b"", major, minor)
        emit("TRAILER!!!", 0, 1)
    os.replace(tmp, out_path)


if __name__ == "__main__":
    main(sys.argv)
