//! SETUPMAPPING / REMOVEMAPPING through the passthrough filesystem into a mapper.

mod common;

use common::*;
use daxfsd::abi::{init_flags, opcode as op, *};
use daxfsd::testing::recording::MapCall;

const MB2: u64 = 2 << 20;

fn setup(
    h: &Harness,
    ino: u64,
    fh: u64,
    foffset: u64,
    len: u64,
    moffset: u64,
    flags: u64,
) -> Result<(), i32> {
    let a = SetupmappingIn {
        fh,
        foffset,
        len,
        flags,
        moffset,
    };
    h.send(op::SETUPMAPPING, ino, &[&raw(&a)])
        .result()
        .map(drop)
}

fn removemapping(h: &Harness, ranges: &[(u64, u64)]) -> Reply {
    let mut args = raw(&RemovemappingIn {
        count: ranges.len() as u32,
    });
    for &(moffset, len) in ranges {
        args.extend(raw(&RemovemappingOne { moffset, len }));
    }
    h.send(op::REMOVEMAPPING, 0, &[&args])
}

const RW: u64 = SETUPMAPPING_FLAG_READ | SETUPMAPPING_FLAG_WRITE;
const RO: u64 = SETUPMAPPING_FLAG_READ;

#[test]
fn mappings_reach_the_mapper_with_the_right_file() {
    let h = Harness::new();
    let ino = h.make_file(ROOT, "f", &[1u8; 8192]);
    let file = {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(h.host("f")).unwrap();
        (md.dev(), md.ino())
    };
    let rw = h.open(ino, libc::O_RDWR).unwrap();
    setup(&h, ino, rw.fh, 0, MB2, 0, RW).unwrap();
    setup(&h, ino, rw.fh, 4096, MB2, MB2, RO).unwrap();
    let r = removemapping(&h, &[(0, MB2), (MB2, MB2)]);
    assert_eq!(r.result().unwrap().len(), 0);
    assert_eq!(
        h.mapper_calls(),
        [
            MapCall::Map {
                moffset: 0,
                len: MB2,
                foffset: 0,
                writable: true,
                file
            },
            MapCall::Map {
                moffset: MB2,
                len: MB2,
                foffset: 4096,
                writable: false,
                file
            },
            MapCall::Unmap {
                moffset: 0,
                len: MB2
            },
            MapCall::Unmap {
                moffset: MB2,
                len: MB2
            },
        ]
    );
}

#[test]
fn mapping_permissions_follow_the_handle() {
    let h = Harness::new();
    let ino = h.make_file(ROOT, "f", b"x");
    let ro = h.open(ino, libc::O_RDONLY).unwrap();
    assert_eq!(
        setup(&h, ino, ro.fh, 0, MB2, 0, RW).unwrap_err(),
        libc::EACCES
    );
    assert!(
        h.mapper_calls().is_empty(),
        "refused before reaching the mapper"
    );
    setup(&h, ino, ro.fh, 0, MB2, 0, RO).unwrap();
    // A write-only handle still maps (through a descriptor that mmap accepts).
    let wo = h.open(ino, libc::O_WRONLY).unwrap();
    setup(&h, ino, wo.fh, 0, MB2, MB2, RW).unwrap();
    let calls = h.mapper_calls();
    assert_eq!(calls.len(), 2);
    assert!(matches!(calls[1], MapCall::Map { writable: true, moffset, .. } if moffset == MB2));
    // Unknown handle, handle of another inode, directory handle.
    assert_eq!(setup(&h, ino, 999, 0, MB2, 0, RO).unwrap_err(), libc::EBADF);
    let other = h.make_file(ROOT, "g", b"");
    assert_eq!(
        setup(&h, other, ro.fh, 0, MB2, 0, RO).unwrap_err(),
        libc::EBADF
    );
    let d = h.opendir(ROOT).unwrap();
    assert_eq!(
        setup(&h, ROOT, d.fh, 0, MB2, 0, RO).unwrap_err(),
        libc::EBADF
    );
    // Outside the window: the mapper refuses.
    assert_eq!(
        setup(&h, ino, ro.fh, 0, MB2, WINDOW, RO).unwrap_err(),
        libc::EINVAL
    );
    assert_eq!(h.mapper_calls().len(), 2);
}

#[test]
fn readonly_share_never_maps_writable() {
    let h = Harness::with(|c| c.readonly = true);
    std::fs::write(h.host("f"), b"x").unwrap();
    let ino = h.lookup(ROOT, "f").unwrap().nodeid;
    let ro = h.open(ino, libc::O_RDONLY).unwrap();
    assert_eq!(
        setup(&h, ino, ro.fh, 0, MB2, 0, RW).unwrap_err(),
        libc::EACCES
    );
    setup(&h, ino, ro.fh, 0, MB2, 0, RO).unwrap();
    assert_eq!(h.mapper_calls().len(), 1);
}

#[test]
fn removemapping_validates_counts() {
    let h = Harness::new();
    // count 0, count larger than the ranges sent, count overflowing.
    assert_eq!(removemapping(&h, &[]).errno(), libc::EINVAL);
    let mut args = raw(&RemovemappingIn { count: 2 });
    args.extend(raw(&RemovemappingOne {
        moffset: 0,
        len: MB2,
    }));
    assert_eq!(h.send(op::REMOVEMAPPING, 0, &[&args]).errno(), libc::EINVAL);
    let mut args = raw(&RemovemappingIn { count: u32::MAX });
    args.extend(raw(&RemovemappingOne {
        moffset: 0,
        len: MB2,
    }));
    assert_eq!(h.send(op::REMOVEMAPPING, 0, &[&args]).errno(), libc::EINVAL);
    assert!(h.mapper_calls().is_empty());
    // A range outside the window fails the whole request: nothing is unmapped.
    let r = removemapping(&h, &[(WINDOW, MB2), (0, MB2)]);
    assert_eq!(r.errno(), libc::EINVAL);
    assert!(h.mapper_calls().is_empty());
    h.assert_alive();
}

#[test]
fn no_window_means_enosys() {
    let h = Harness::uninit(|_| {}, MapperKind::None);
    let out = h.init();
    let agreed = u64::from(out.flags) | (u64::from(out.flags2) << 32);
    assert_eq!(agreed & init_flags::MAP_ALIGNMENT, 0);
    let ino = h.make_file(ROOT, "f", b"x");
    let o = h.open(ino, libc::O_RDWR).unwrap();
    assert_eq!(
        setup(&h, ino, o.fh, 0, MB2, 0, RW).unwrap_err(),
        libc::ENOSYS
    );
    assert_eq!(removemapping(&h, &[(0, MB2)]).errno(), libc::ENOSYS);
    h.assert_alive();
}
