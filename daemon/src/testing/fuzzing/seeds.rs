//! The seed corpus of the server and chain fuzz targets: one valid request per opcode,
//! grouped by opcode family, plus request sequences that reach deeper state.

use vm_memory::ByteValued;

use super::{encode, request};

/// Requests of one input: `(shape, bytes)` each.
type Requests = Vec<(u8, Vec<u8>)>;

/// One valid request per opcode (plus a few sequences): the seed corpus.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut v = entry_seeds();
    v.extend(attr_seeds());
    v.extend(file_seeds());
    v.extend(lock_seeds());
    v.extend(dir_seeds());
    v.extend(session_seeds());
    v.extend(sequence_seeds());
    v.into_iter().map(|(n, reqs)| (n, encode(&reqs))).collect()
}

/// A name as requests carry it (NUL-terminated).
fn seed_name(s: &str) -> Vec<u8> {
    format!("{s}\0").into_bytes()
}

/// One request, with reply room shape 5 (4 KiB).
fn single(opcode: u32, nodeid: u64, args: &[&[u8]]) -> Requests {
    vec![(5u8, request(opcode, nodeid, args))]
}

/// CREATE of `f` in the root (node 2, handle 2 in a fresh filesystem).
fn seed_create() -> Vec<u8> {
    use crate::protocol::abi::{opcode as op, *};
    request(
        op::CREATE,
        ROOT_ID,
        &[
            CreateIn {
                flags: 2,
                mode: 0o644,
                ..Default::default()
            }
            .as_slice(),
            &seed_name("f"),
        ],
    )
}

/// WRITE of `hello` to handle 2.
fn seed_write() -> Vec<u8> {
    use crate::protocol::abi::{opcode as op, *};
    request(
        op::WRITE,
        2,
        &[
            WriteIn {
                fh: 2,
                size: 5,
                ..Default::default()
            }
            .as_slice(),
            b"hello",
        ],
    )
}

/// READ of 4 KiB from handle 2.
fn seed_read() -> crate::protocol::abi::ReadIn {
    crate::protocol::abi::ReadIn {
        fh: 2,
        size: 4096,
        ..Default::default()
    }
}

/// Seeds of names: look up, create, link, rename, remove and forget them.
fn entry_seeds() -> Vec<(String, Requests)> {
    use crate::protocol::abi::{opcode as op, *};
    let root = ROOT_ID;
    vec![
        (
            "lookup".into(),
            single(op::LOOKUP, root, &[&seed_name("f")]),
        ),
        (
            "forget".into(),
            single(op::FORGET, 2, &[ForgetIn { nlookup: 1 }.as_slice()]),
        ),
        (
            "batch_forget".into(),
            single(
                op::BATCH_FORGET,
                0,
                &[
                    BatchForgetIn { count: 1, dummy: 0 }.as_slice(),
                    ForgetOne {
                        nodeid: 2,
                        nlookup: 1,
                    }
                    .as_slice(),
                ],
            ),
        ),
        (
            "symlink".into(),
            single(op::SYMLINK, root, &[&seed_name("l"), &seed_name("target")]),
        ),
        (
            "mknod".into(),
            single(
                op::MKNOD,
                root,
                &[
                    MknodIn {
                        mode: libc::S_IFIFO | 0o644,
                        ..Default::default()
                    }
                    .as_slice(),
                    &seed_name("p"),
                ],
            ),
        ),
        (
            "mkdir".into(),
            single(
                op::MKDIR,
                root,
                &[
                    MkdirIn {
                        mode: 0o755,
                        umask: 0,
                    }
                    .as_slice(),
                    &seed_name("d"),
                ],
            ),
        ),
        (
            "unlink".into(),
            single(op::UNLINK, root, &[&seed_name("f")]),
        ),
        ("rmdir".into(), single(op::RMDIR, root, &[&seed_name("d")])),
        (
            "rename".into(),
            single(
                op::RENAME,
                root,
                &[
                    RenameIn { newdir: root }.as_slice(),
                    &seed_name("a"),
                    &seed_name("b"),
                ],
            ),
        ),
        (
            "rename2".into(),
            single(
                op::RENAME2,
                root,
                &[
                    Rename2In {
                        newdir: root,
                        flags: 1,
                        padding: 0,
                    }
                    .as_slice(),
                    &seed_name("a"),
                    &seed_name("b"),
                ],
            ),
        ),
        (
            "link".into(),
            single(
                op::LINK,
                root,
                &[LinkIn { oldnodeid: 2 }.as_slice(), &seed_name("h")],
            ),
        ),
        ("create".into(), vec![(5, seed_create())]),
        (
            "tmpfile".into(),
            single(
                op::TMPFILE,
                root,
                &[
                    CreateIn {
                        flags: 2,
                        mode: 0o600,
                        ..Default::default()
                    }
                    .as_slice(),
                    &seed_name("/"),
                ],
            ),
        ),
    ]
}

/// Seeds of attributes, symlink targets, access, xattrs, statfs and syncfs.
fn attr_seeds() -> Vec<(String, Requests)> {
    use crate::protocol::abi::{opcode as op, *};
    let root = ROOT_ID;
    vec![
        (
            "getattr".into(),
            single(op::GETATTR, root, &[GetattrIn::default().as_slice()]),
        ),
        (
            "setattr".into(),
            single(
                op::SETATTR,
                root,
                &[SetattrIn {
                    valid: fattr::MODE,
                    mode: 0o700,
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
        ("readlink".into(), single(op::READLINK, root, &[])),
        (
            "access".into(),
            single(
                op::ACCESS,
                root,
                &[AccessIn {
                    mask: 4,
                    padding: 0,
                }
                .as_slice()],
            ),
        ),
        ("statfs".into(), single(op::STATFS, root, &[])),
        (
            "syncfs".into(),
            single(op::SYNCFS, root, &[SyncfsIn::default().as_slice()]),
        ),
        (
            "setxattr".into(),
            single(
                op::SETXATTR,
                root,
                &[
                    SetxattrIn {
                        size: 1,
                        ..Default::default()
                    }
                    .as_slice(),
                    &seed_name("user.a"),
                    b"v",
                ],
            ),
        ),
        (
            "getxattr".into(),
            single(
                op::GETXATTR,
                root,
                &[
                    GetxattrIn {
                        size: 64,
                        padding: 0,
                    }
                    .as_slice(),
                    &seed_name("user.a"),
                ],
            ),
        ),
        (
            "listxattr".into(),
            single(
                op::LISTXATTR,
                root,
                &[GetxattrIn {
                    size: 64,
                    padding: 0,
                }
                .as_slice()],
            ),
        ),
        (
            "removexattr".into(),
            single(op::REMOVEXATTR, root, &[&seed_name("user.a")]),
        ),
    ]
}

/// Seeds of open files: I/O, sync, release, space.
fn file_seeds() -> Vec<(String, Requests)> {
    use crate::protocol::abi::{opcode as op, *};
    vec![
        (
            "open".into(),
            single(
                op::OPEN,
                2,
                &[OpenIn {
                    flags: 2,
                    open_flags: 0,
                }
                .as_slice()],
            ),
        ),
        (
            "read".into(),
            vec![(6, request(op::READ, 2, &[seed_read().as_slice()]))],
        ),
        ("write".into(), vec![(5, seed_write())]),
        (
            "release".into(),
            single(
                op::RELEASE,
                2,
                &[ReleaseIn {
                    fh: 2,
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
        (
            "fsync".into(),
            single(
                op::FSYNC,
                2,
                &[FsyncIn {
                    fh: 2,
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
        (
            "flush".into(),
            single(
                op::FLUSH,
                2,
                &[FlushIn {
                    fh: 2,
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
        (
            "fallocate".into(),
            single(
                op::FALLOCATE,
                2,
                &[FallocateIn {
                    fh: 2,
                    length: 4096,
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
        (
            "lseek".into(),
            single(
                op::LSEEK,
                2,
                &[LseekIn {
                    fh: 2,
                    whence: 3,
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
        (
            "copy_file_range".into(),
            single(
                op::COPY_FILE_RANGE,
                2,
                &[CopyFileRangeIn {
                    fh_in: 2,
                    nodeid_out: 2,
                    fh_out: 2,
                    off_out: 8,
                    len: 4,
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
    ]
}

/// Seeds of byte-range locks: GETLK, SETLK, SETLKW.
fn lock_seeds() -> Vec<(String, Requests)> {
    use crate::protocol::abi::{opcode as op, *};
    vec![
        (
            "getlk".into(),
            single(
                op::GETLK,
                2,
                &[LkIn {
                    fh: 2,
                    lk: FileLock {
                        typ: libc::F_WRLCK as u32,
                        end: u64::MAX,
                        ..Default::default()
                    },
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
        (
            "setlk".into(),
            single(
                op::SETLK,
                2,
                &[LkIn {
                    fh: 2,
                    lk: FileLock {
                        typ: libc::F_RDLCK as u32,
                        end: 10,
                        ..Default::default()
                    },
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
        (
            "setlkw".into(),
            single(
                op::SETLKW,
                2,
                &[LkIn {
                    fh: 2,
                    lk: FileLock {
                        typ: libc::F_UNLCK as u32,
                        ..Default::default()
                    },
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
    ]
}

/// Seeds of directories: open, list, sync, release.
fn dir_seeds() -> Vec<(String, Requests)> {
    use crate::protocol::abi::{opcode as op, *};
    let root = ROOT_ID;
    vec![
        (
            "opendir".into(),
            single(op::OPENDIR, root, &[OpenIn::default().as_slice()]),
        ),
        (
            "readdir".into(),
            single(
                op::READDIR,
                root,
                &[ReadIn {
                    fh: 1,
                    size: 4096,
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
        (
            "readdirplus".into(),
            single(
                op::READDIRPLUS,
                root,
                &[ReadIn {
                    fh: 1,
                    size: 4096,
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
        (
            "releasedir".into(),
            single(
                op::RELEASEDIR,
                root,
                &[ReleaseIn {
                    fh: 1,
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
        (
            "fsyncdir".into(),
            single(
                op::FSYNCDIR,
                root,
                &[FsyncIn {
                    fh: 1,
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
    ]
}

/// Seeds of the session and the DAX window: INIT, INTERRUPT, DESTROY, IOCTL, the mappings.
fn session_seeds() -> Vec<(String, Requests)> {
    use crate::protocol::abi::{opcode as op, *};
    vec![
        (
            "init".into(),
            single(
                op::INIT,
                0,
                &[InitIn {
                    major: 7,
                    minor: 41,
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
        (
            "interrupt".into(),
            single(op::INTERRUPT, 0, &[InterruptIn { unique: 1 }.as_slice()]),
        ),
        ("destroy".into(), single(op::DESTROY, 0, &[])),
        ("ioctl".into(), single(op::IOCTL, 2, &[&[0u8; 32]])),
        (
            "setupmapping".into(),
            single(
                op::SETUPMAPPING,
                2,
                &[SetupmappingIn {
                    fh: 2,
                    len: 2 << 20,
                    flags: 3,
                    ..Default::default()
                }
                .as_slice()],
            ),
        ),
        (
            "removemapping".into(),
            single(
                op::REMOVEMAPPING,
                0,
                &[
                    RemovemappingIn { count: 1 }.as_slice(),
                    RemovemappingOne {
                        moffset: 0,
                        len: 2 << 20,
                    }
                    .as_slice(),
                ],
            ),
        ),
    ]
}

/// Seeds of sequences that reach deeper state (create, write, read back, map, unmap).
fn sequence_seeds() -> Vec<(String, Requests)> {
    use crate::protocol::abi::{opcode as op, *};
    vec![
        (
            "seq_create_write_read".into(),
            vec![
                (5, seed_create()),
                (5, seed_write()),
                (6, request(op::READ, 2, &[seed_read().as_slice()])),
            ],
        ),
        (
            "seq_create_map_unmap".into(),
            vec![
                (5, seed_create()),
                (
                    5,
                    request(
                        op::SETUPMAPPING,
                        2,
                        &[SetupmappingIn {
                            fh: 2,
                            len: 2 << 20,
                            flags: 1,
                            ..Default::default()
                        }
                        .as_slice()],
                    ),
                ),
                (
                    133,
                    request(
                        op::REMOVEMAPPING,
                        0,
                        &[
                            RemovemappingIn { count: 1 }.as_slice(),
                            RemovemappingOne {
                                moffset: 0,
                                len: 2 << 20,
                            }
                            .as_slice(),
                        ],
                    ),
                ),
            ],
        ),
    ]
}
