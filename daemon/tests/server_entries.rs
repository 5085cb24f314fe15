//! Namespace and metadata opcodes, checked against the host directory.

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

use common::*;
use daxfsd::abi::{fattr, opcode as op, *};
use daxfsd::filesystem::Inode;

#[test]
fn lookup_finds_host_files_and_counts_references() {
    let h = Harness::new();
    std::fs::write(h.host("f"), b"abc").unwrap();
    let e = h.lookup(ROOT, "f").unwrap();
    assert_ne!(e.nodeid, ROOT);
    assert_eq!(e.attr.ino, host_ino(&h.host("f")));
    assert_eq!(e.attr.size, 3);
    assert_eq!(e.attr.mode & libc::S_IFMT, libc::S_IFREG);
    assert_eq!((e.entry_valid, e.attr_valid), (1, 1), "cache=auto: 1 s");
    let again = h.lookup(ROOT, "f").unwrap();
    assert_eq!(again.nodeid, e.nodeid, "same host file, same nodeid");
    assert_eq!(h.fs().lookup_count(Inode::from_raw(e.nodeid)), 2);

    assert_eq!(h.lookup(ROOT, "missing").unwrap_err(), libc::ENOENT);
    assert_eq!(h.lookup(999, "f").unwrap_err(), libc::EBADF);
    assert_eq!(h.lookup(e.nodeid, "x").unwrap_err(), libc::ENOTDIR);
}

#[test]
fn forget_drops_references() {
    let h = Harness::new();
    std::fs::write(h.host("f"), b"").unwrap();
    let ino = h.lookup(ROOT, "f").unwrap().nodeid;
    h.lookup(ROOT, "f").unwrap();
    h.forget(ino, 1);
    assert_eq!(h.fs().lookup_count(Inode::from_raw(ino)), 1);
    assert!(h.getattr(ino).is_ok());
    h.forget(ino, 1);
    assert_eq!(h.getattr(ino).unwrap_err(), libc::EBADF, "gone at zero");
    // The root and unknown inodes: ignored, no reply, no panic.
    h.forget(ROOT, 100);
    h.forget(12345, 1);
    assert!(h.getattr(ROOT).is_ok());
    // Looked up again: a fresh nodeid.
    let ino2 = h.lookup(ROOT, "f").unwrap().nodeid;
    assert_ne!(ino2, ino);
}

#[test]
fn batch_forget_drops_every_listed_reference() {
    let h = Harness::new();
    let a = h.make_file(ROOT, "a", b"");
    let b = h.make_file(ROOT, "b", b"");
    h.lookup(ROOT, "b").unwrap();
    let mut args = raw(&BatchForgetIn { count: 3, dummy: 0 });
    for (nodeid, nlookup) in [(a, 1), (b, 5), (999, 1)] {
        args.extend(raw(&ForgetOne { nodeid, nlookup }));
    }
    let r = h.send(op::BATCH_FORGET, 0, &[&args]);
    assert!(!r.replied);
    assert_eq!(h.getattr(a).unwrap_err(), libc::EBADF);
    assert_eq!(h.getattr(b).unwrap_err(), libc::EBADF);
    assert_eq!(h.fs().inode_count(), 1);
}

#[test]
fn getattr_reports_the_host_file() {
    let h = Harness::new();
    std::fs::write(h.host("f"), b"hello").unwrap();
    std::fs::set_permissions(h.host("f"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let ino = h.lookup(ROOT, "f").unwrap().nodeid;
    let a = h.getattr(ino).unwrap();
    let md = std::fs::metadata(h.host("f")).unwrap();
    assert_eq!(a.mode, libc::S_IFREG | 0o640);
    assert_eq!((a.size, a.ino, a.nlink), (5, md.ino(), 1));
    assert_eq!(
        (a.mtime, a.mtimensec),
        (md.mtime() as u64, md.mtime_nsec() as u32)
    );
    let root = h.getattr(ROOT).unwrap();
    assert_eq!(root.ino, host_ino(&h.share));
    assert_eq!(h.getattr(77).unwrap_err(), libc::EBADF);
}

#[test]
fn setattr_changes_the_host_file() {
    let h = Harness::new();
    let ino = h.make_file(ROOT, "f", b"0123456789abcdef");
    let path = h.host("f");

    let mut a = setattr_in(fattr::MODE);
    a.mode = 0o600;
    assert_eq!(h.setattr(ino, &a).unwrap().mode, libc::S_IFREG | 0o600);
    assert_eq!(host_mode(&path), libc::S_IFREG | 0o600);

    let mut a = setattr_in(fattr::UID | fattr::GID);
    (a.uid, a.gid) = (1234, 5678);
    let attr = h.setattr(ino, &a).unwrap();
    assert_eq!((attr.uid, attr.gid), (1234, 5678));
    assert_eq!(host_owner(&path), (1234, 5678));
    let mut a = setattr_in(fattr::GID);
    a.gid = 42;
    h.setattr(ino, &a).unwrap();
    assert_eq!(
        host_owner(&path),
        (1234, 42),
        "uid unchanged when only GID is valid"
    );

    let mut a = setattr_in(fattr::SIZE);
    a.size = 4;
    assert_eq!(h.setattr(ino, &a).unwrap().size, 4);
    assert_eq!(std::fs::read(&path).unwrap(), b"0123");

    let mut a = setattr_in(fattr::MTIME | fattr::ATIME);
    (a.mtime, a.mtimensec, a.atime, a.atimensec) = (1_000_000_000, 5, 1_500_000_000, 0);
    let attr = h.setattr(ino, &a).unwrap();
    assert_eq!((attr.mtime, attr.mtimensec), (1_000_000_000, 5));
    let md = std::fs::metadata(&path).unwrap();
    assert_eq!(
        (md.mtime(), md.mtime_nsec(), md.atime()),
        (1_000_000_000, 5, 1_500_000_000)
    );

    let a = setattr_in(fattr::MTIME | fattr::MTIME_NOW);
    h.setattr(ino, &a).unwrap();
    let md = std::fs::metadata(&path).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (md.mtime() - now).abs() < 60,
        "MTIME_NOW sets the current time"
    );
    assert_eq!(md.atime(), 1_500_000_000, "atime omitted");

    // Through an open handle.
    let o = h.open(ino, libc::O_RDWR).unwrap();
    let mut a = setattr_in(fattr::SIZE | fattr::FH);
    (a.size, a.fh) = (2, o.fh);
    h.setattr(ino, &a).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"01");

    // Errors.
    let mut a = setattr_in(fattr::SIZE);
    a.size = 0;
    assert_eq!(h.setattr(ROOT, &a).unwrap_err(), libc::EISDIR);
    assert_eq!(h.setattr(999, &a).unwrap_err(), libc::EBADF);
    let other = h.make_file(ROOT, "g", b"");
    let mut a = setattr_in(fattr::SIZE | fattr::FH);
    a.fh = o.fh;
    assert_eq!(
        h.setattr(other, &a).unwrap_err(),
        libc::EBADF,
        "handle of another inode"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"01");
}

#[test]
fn readlink_returns_the_target_text() {
    let h = Harness::new();
    std::os::unix::fs::symlink("some/where", h.host("l")).unwrap();
    let l = h.lookup(ROOT, "l").unwrap();
    assert_eq!(l.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    let r = h.send(op::READLINK, l.nodeid, &[]);
    assert_eq!(r.result().unwrap(), b"some/where");
    let f = h.make_file(ROOT, "f", b"");
    assert_eq!(h.send(op::READLINK, f, &[]).errno(), libc::EINVAL);
    assert_eq!(h.send(op::READLINK, 999, &[]).errno(), libc::EBADF);
}

#[test]
fn symlink_creates_a_host_symlink() {
    let h = Harness::new();
    let e = h.symlink(ROOT, "l", "../../etc/passwd").unwrap();
    assert_eq!(e.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(
        std::fs::read_link(h.host("l")).unwrap().to_str().unwrap(),
        "../../etc/passwd"
    );
    assert_eq!(h.symlink(ROOT, "l", "x").unwrap_err(), libc::EEXIST);
    assert_eq!(h.symlink(ROOT, ".", "x").unwrap_err(), libc::EINVAL);
    assert_eq!(h.symlink(999, "m", "x").unwrap_err(), libc::EBADF);
}

#[test]
fn creating_ops_use_the_callers_ids() {
    let h = Harness::new();
    std::fs::set_permissions(&h.share, std::fs::Permissions::from_mode(0o777)).unwrap();
    let d = h.mkdir_as(1000, 1001, ROOT, "d", 0o755, 0).unwrap();
    assert_eq!((d.attr.uid, d.attr.gid), (1000, 1001));
    assert_eq!(host_owner(&h.host("d")), (1000, 1001));
    let (f, o) = h
        .create_as(1000, 1001, d.nodeid, "f", 0o600, libc::O_RDWR)
        .unwrap();
    assert_eq!(host_owner(&h.host("d/f")), (1000, 1001));
    h.release(f.nodeid, o.fh).unwrap();
    let r = h.send_as(
        1000,
        1001,
        op::SYMLINK,
        d.nodeid,
        &[&cname("l"), &cname("f")],
    );
    r.result().unwrap();
    assert_eq!(host_owner(&h.host("d/l")), (1000, 1001));
    let mk = MknodIn {
        mode: libc::S_IFIFO | 0o644,
        ..Default::default()
    };
    let r = h.send_as(1000, 1001, op::MKNOD, d.nodeid, &[&raw(&mk), &cname("p")]);
    r.result().unwrap();
    assert_eq!(host_owner(&h.host("d/p")), (1000, 1001));
    // The caller's permissions apply: uid 1000 cannot create in a root-owned 0755 dir.
    let root_dir = h.mkdir(ROOT, "rootonly", 0o755).unwrap();
    assert_eq!(
        h.mkdir_as(1000, 1001, root_dir.nodeid, "x", 0o755, 0)
            .unwrap_err(),
        libc::EACCES
    );
    // The thread got its ids back: root creates root-owned files.
    h.mkdir(ROOT, "mine", 0o755).unwrap();
    assert_eq!(host_owner(&h.host("mine")), (0, 0));
    // uid -1 would mean "unchanged" to setresuid: refused.
    assert_eq!(
        h.mkdir_as(u32::MAX, 0, ROOT, "bad", 0o755, 0).unwrap_err(),
        libc::EINVAL
    );
    assert!(!h.host("bad").exists());
}

#[test]
fn mknod_creates_special_files() {
    let h = Harness::new();
    let e = h.mknod(ROOT, "fifo", libc::S_IFIFO | 0o640, 0).unwrap();
    assert_eq!(e.attr.mode, libc::S_IFIFO | 0o640);
    assert!(std::fs::symlink_metadata(h.host("fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    h.mknod(ROOT, "sock", libc::S_IFSOCK | 0o600, 0).unwrap();
    assert!(std::fs::symlink_metadata(h.host("sock"))
        .unwrap()
        .file_type()
        .is_socket());
    // rdev travels in the kernel's encoding: major 1, minor 5 (/dev/zero) = 0x105.
    let c = h.mknod(ROOT, "zero", libc::S_IFCHR | 0o600, 0x105).unwrap();
    assert_eq!(c.attr.rdev, 0x105);
    let rdev = std::fs::symlink_metadata(h.host("zero")).unwrap().rdev();
    assert_eq!((libc::major(rdev), libc::minor(rdev)), (1, 5));
    // The request's umask applies.
    let a = MknodIn {
        mode: libc::S_IFREG | 0o666,
        rdev: 0,
        umask: 0o027,
        padding: 0,
    };
    h.send(op::MKNOD, ROOT, &[&raw(&a), &cname("reg")])
        .result()
        .unwrap();
    assert_eq!(host_mode(&h.host("reg")), libc::S_IFREG | 0o640);
    assert_eq!(
        h.mknod(ROOT, "fifo", libc::S_IFIFO | 0o600, 0).unwrap_err(),
        libc::EEXIST
    );
    assert_eq!(
        h.mknod(ROOT, "..", libc::S_IFIFO | 0o600, 0).unwrap_err(),
        libc::EINVAL
    );
}

#[test]
fn mkdir_applies_the_umask() {
    let h = Harness::new();
    let d = h.mkdir_as(0, 0, ROOT, "d", 0o777, 0o077).unwrap();
    assert_eq!(d.attr.mode, libc::S_IFDIR | 0o700);
    assert_eq!(host_mode(&h.host("d")), libc::S_IFDIR | 0o700);
    let sub = h.mkdir(d.nodeid, "sub", 0o750).unwrap();
    assert!(h.host("d/sub").is_dir());
    assert_eq!(sub.attr.mode, libc::S_IFDIR | 0o750);
    assert_eq!(h.mkdir(ROOT, "d", 0o755).unwrap_err(), libc::EEXIST);
    let f = h.make_file(ROOT, "f", b"");
    assert_eq!(h.mkdir(f, "x", 0o755).unwrap_err(), libc::ENOTDIR);
}

#[test]
fn unlink_and_rmdir_remove_host_entries() {
    let h = Harness::new();
    h.make_file(ROOT, "f", b"x");
    let d = h.mkdir(ROOT, "d", 0o755).unwrap();
    h.make_file(d.nodeid, "inner", b"");
    assert_eq!(
        h.send(op::UNLINK, ROOT, &[&cname("d")]).errno(),
        libc::EISDIR
    );
    assert_eq!(
        h.send(op::RMDIR, ROOT, &[&cname("d")]).errno(),
        libc::ENOTEMPTY
    );
    assert_eq!(
        h.send(op::RMDIR, ROOT, &[&cname("f")]).errno(),
        libc::ENOTDIR
    );
    h.send(op::UNLINK, ROOT, &[&cname("f")]).result().unwrap();
    assert!(!h.host("f").exists());
    assert_eq!(
        h.send(op::UNLINK, ROOT, &[&cname("f")]).errno(),
        libc::ENOENT
    );
    h.send(op::UNLINK, d.nodeid, &[&cname("inner")])
        .result()
        .unwrap();
    h.send(op::RMDIR, ROOT, &[&cname("d")]).result().unwrap();
    assert!(!h.host("d").exists());
    assert_eq!(
        h.send(op::RMDIR, ROOT, &[&cname("d")]).errno(),
        libc::ENOENT
    );
}

fn rename2(
    h: &Harness,
    olddir: u64,
    old: &str,
    newdir: u64,
    new: &str,
    flags: u32,
) -> Result<(), i32> {
    let a = Rename2In {
        newdir,
        flags,
        padding: 0,
    };
    h.send(op::RENAME2, olddir, &[&raw(&a), &cname(old), &cname(new)])
        .result()
        .map(drop)
}

#[test]
fn rename_moves_host_entries() {
    let h = Harness::new();
    h.make_file(ROOT, "a", b"A");
    let d = h.mkdir(ROOT, "d", 0o755).unwrap();
    let r = h.send(
        op::RENAME,
        ROOT,
        &[
            &raw(&RenameIn { newdir: d.nodeid }),
            &cname("a"),
            &cname("b"),
        ],
    );
    r.result().unwrap();
    assert!(!h.host("a").exists());
    assert_eq!(std::fs::read(h.host("d/b")).unwrap(), b"A");
    let r = h.send(
        op::RENAME,
        ROOT,
        &[
            &raw(&RenameIn { newdir: d.nodeid }),
            &cname("a"),
            &cname("c"),
        ],
    );
    assert_eq!(r.errno(), libc::ENOENT);
    let r = h.send(
        op::RENAME,
        ROOT,
        &[&raw(&RenameIn { newdir: 999 }), &cname("d"), &cname("c")],
    );
    assert_eq!(r.errno(), libc::EBADF);
}

#[test]
fn rename2_honours_its_flags() {
    let h = Harness::new();
    h.make_file(ROOT, "x", b"X");
    h.make_file(ROOT, "y", b"Y");
    assert_eq!(
        rename2(&h, ROOT, "x", ROOT, "y", libc::RENAME_NOREPLACE).unwrap_err(),
        libc::EEXIST
    );
    assert_eq!(std::fs::read(h.host("y")).unwrap(), b"Y");
    rename2(&h, ROOT, "x", ROOT, "y", libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(std::fs::read(h.host("x")).unwrap(), b"Y");
    assert_eq!(std::fs::read(h.host("y")).unwrap(), b"X");
    rename2(&h, ROOT, "x", ROOT, "z", libc::RENAME_NOREPLACE).unwrap();
    assert_eq!(std::fs::read(h.host("z")).unwrap(), b"Y");
    assert_eq!(
        rename2(&h, ROOT, "z", ROOT, "w", 0x100).unwrap_err(),
        libc::EINVAL
    );
    assert!(h.host("z").exists());
}

#[test]
fn link_makes_a_host_hard_link() {
    let h = Harness::new();
    let ino = h.make_file(ROOT, "f", b"data");
    let d = h.mkdir(ROOT, "d", 0o755).unwrap();
    let r = h.send(
        op::LINK,
        d.nodeid,
        &[&raw(&LinkIn { oldnodeid: ino }), &cname("g")],
    );
    let e: EntryOut = r.obj();
    assert_eq!(e.nodeid, ino, "the same inode");
    assert_eq!(e.attr.nlink, 2);
    assert_eq!(host_ino(&h.host("d/g")), host_ino(&h.host("f")));
    assert_eq!(h.fs().lookup_count(Inode::from_raw(ino)), 2);
    let r = h.send(
        op::LINK,
        d.nodeid,
        &[&raw(&LinkIn { oldnodeid: ino }), &cname("g")],
    );
    assert_eq!(r.errno(), libc::EEXIST);
    let r = h.send(
        op::LINK,
        ROOT,
        &[
            &raw(&LinkIn {
                oldnodeid: d.nodeid,
            }),
            &cname("dl"),
        ],
    );
    assert_eq!(r.errno(), libc::EPERM, "no hard links to directories");
    let r = h.send(
        op::LINK,
        ROOT,
        &[&raw(&LinkIn { oldnodeid: 999 }), &cname("z")],
    );
    assert_eq!(r.errno(), libc::EBADF);
}

#[test]
fn statfs_reports_the_host_filesystem() {
    let h = Harness::new();
    let st: StatfsOut = h.send(op::STATFS, ROOT, &[]).obj();
    let path = std::ffi::CString::new(h.share.to_str().unwrap()).unwrap();
    let mut host: libc::statvfs = unsafe_zeroed_statvfs();
    // SAFETY: `path` is NUL-terminated and `host` is a writable statvfs.
    assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut host) }, 0);
    assert_eq!(u64::from(st.st.bsize), host.f_bsize);
    assert_eq!(st.st.blocks, host.f_blocks);
    assert_eq!(u64::from(st.st.namelen), host.f_namemax);
    assert_eq!(h.send(op::STATFS, 999, &[]).errno(), libc::EBADF);
}

fn unsafe_zeroed_statvfs() -> libc::statvfs {
    // SAFETY: statvfs is plain integers; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

fn access(h: &Harness, uid: u32, gid: u32, ino: u64, mask: i32) -> Result<(), i32> {
    let a = AccessIn {
        mask: mask as u32,
        padding: 0,
    };
    h.send_as(uid, gid, op::ACCESS, ino, &[&raw(&a)])
        .result()
        .map(drop)
}

#[test]
fn access_checks_the_callers_permissions() {
    let h = Harness::new();
    let ino = h.make_file(ROOT, "f", b"");
    std::os::unix::fs::chown(h.host("f"), Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(h.host("f"), std::fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(access(&h, 1000, 1000, ino, libc::R_OK | libc::W_OK), Ok(()));
    assert_eq!(access(&h, 1000, 1000, ino, libc::X_OK), Err(libc::EACCES));
    assert_eq!(
        access(&h, 2000, 1000, ino, libc::R_OK),
        Ok(()),
        "group read"
    );
    assert_eq!(access(&h, 2000, 1000, ino, libc::W_OK), Err(libc::EACCES));
    assert_eq!(access(&h, 2000, 2000, ino, libc::R_OK), Err(libc::EACCES));
    assert_eq!(access(&h, 2000, 2000, ino, libc::F_OK), Ok(()));
    assert_eq!(access(&h, 0, 0, ino, libc::R_OK | libc::W_OK), Ok(()));
    assert_eq!(
        access(&h, 0, 0, ino, libc::X_OK),
        Err(libc::EACCES),
        "no x bit at all"
    );
    assert_eq!(access(&h, 0, 0, ROOT, libc::X_OK), Ok(()));
    assert_eq!(access(&h, 0, 0, 999, libc::F_OK), Err(libc::EBADF));
}

#[test]
fn readonly_refuses_every_modification() {
    let h = Harness::with(|c| c.readonly = true);
    std::fs::write(h.host("f"), b"data").unwrap();
    std::fs::create_dir(h.host("d")).unwrap();
    let f = h.lookup(ROOT, "f").unwrap().nodeid;
    let before = std::fs::metadata(h.host("f")).unwrap();

    assert_eq!(h.mkdir(ROOT, "n", 0o755).unwrap_err(), libc::EROFS);
    assert_eq!(
        h.create(ROOT, "n", 0o644, libc::O_RDWR).unwrap_err(),
        libc::EROFS
    );
    assert_eq!(
        h.mknod(ROOT, "n", libc::S_IFIFO | 0o644, 0).unwrap_err(),
        libc::EROFS
    );
    assert_eq!(h.symlink(ROOT, "n", "f").unwrap_err(), libc::EROFS);
    assert_eq!(
        h.send(op::UNLINK, ROOT, &[&cname("f")]).errno(),
        libc::EROFS
    );
    assert_eq!(h.send(op::RMDIR, ROOT, &[&cname("d")]).errno(), libc::EROFS);
    let r = h.send(
        op::RENAME,
        ROOT,
        &[&raw(&RenameIn { newdir: ROOT }), &cname("f"), &cname("g")],
    );
    assert_eq!(r.errno(), libc::EROFS);
    let r = h.send(
        op::LINK,
        ROOT,
        &[&raw(&LinkIn { oldnodeid: f }), &cname("g")],
    );
    assert_eq!(r.errno(), libc::EROFS);
    let mut a = setattr_in(fattr::MODE);
    a.mode = 0o777;
    assert_eq!(h.setattr(f, &a).unwrap_err(), libc::EROFS);
    assert_eq!(h.open(f, libc::O_RDWR).unwrap_err(), libc::EROFS);
    assert_eq!(
        h.open(f, libc::O_RDONLY | libc::O_TRUNC).unwrap_err(),
        libc::EROFS
    );
    let ct = CreateIn {
        flags: libc::O_RDWR as u32,
        mode: 0o600,
        ..Default::default()
    };
    assert_eq!(
        h.send(op::TMPFILE, ROOT, &[&raw(&ct), &cname("t")]).errno(),
        libc::EROFS
    );
    let mut sx = raw(&SetxattrIn {
        size: 1,
        ..Default::default()
    });
    sx.extend(cname("user.a"));
    sx.push(b'1');
    assert_eq!(h.send(op::SETXATTR, f, &[&sx]).errno(), libc::EROFS);
    assert_eq!(
        h.send(op::REMOVEXATTR, f, &[&cname("user.a")]).errno(),
        libc::EROFS
    );
    assert_eq!(
        h.send_as(
            0,
            0,
            op::ACCESS,
            f,
            &[&raw(&AccessIn {
                mask: 2,
                padding: 0
            })]
        )
        .errno(),
        libc::EROFS
    );

    // Reading still works, and nothing changed on the host.
    let o = h.open(f, libc::O_RDONLY).unwrap();
    assert_eq!(h.write(f, o.fh, 0, b"x").unwrap_err(), libc::EROFS);
    let fa = FallocateIn {
        fh: o.fh,
        length: 10,
        ..Default::default()
    };
    assert_eq!(h.send(op::FALLOCATE, f, &[&raw(&fa)]).errno(), libc::EROFS);
    assert_eq!(h.read(f, o.fh, 0, 10).unwrap(), b"data");
    let after = std::fs::metadata(h.host("f")).unwrap();
    assert_eq!(
        (after.mode(), after.len(), after.mtime()),
        (before.mode(), before.len(), before.mtime())
    );
    let mut names: Vec<_> = std::fs::read_dir(&h.share)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["d", "f"]);
}

#[test]
fn translated_ids_as_virtiofsd_translate_uid_and_gid() {
    use daxfsd::passthrough::idmap::IdMap;
    let h = Harness::with(|c| {
        c.uid_map = IdMap::parse(
            "--translate-uid",
            &[
                "map:1000:2000:10",
                "forbid-guest:666:1",
                "squash-host:3000:65534:100",
            ],
        )
        .unwrap();
        c.gid_map = IdMap::parse("--translate-gid", &["guest:1000:5000:10"]).unwrap();
    });
    std::fs::set_permissions(&h.share, std::fs::Permissions::from_mode(0o777)).unwrap();
    // Guest 1003:1004 creates: the host file belongs to 2003:5004; the guest sees 1003 for
    // the uid (both directions) and the host gid 5004 (guest-to-host only).
    let (f, o) = h
        .create_as(1003, 1004, ROOT, "f", 0o644, libc::O_RDWR)
        .unwrap();
    h.release(f.nodeid, o.fh).unwrap();
    assert_eq!(host_owner(&h.host("f")), (2003, 5004));
    assert_eq!((f.attr.uid, f.attr.gid), (1003, 5004));
    let d = h.mkdir_as(1001, 1001, ROOT, "d", 0o755, 0).unwrap();
    assert_eq!(host_owner(&h.host("d")), (2001, 5001));
    // Host owners seen by the guest.
    std::fs::write(h.host("h"), b"x").unwrap();
    std::os::unix::fs::chown(h.host("h"), Some(3050), Some(7)).unwrap();
    let e = h.lookup(ROOT, "h").unwrap();
    assert_eq!((e.attr.uid, e.attr.gid), (65534, 7), "squash-host");
    // SETATTR's new owner is a guest id.
    let mut a = setattr_in(fattr::UID | fattr::GID);
    (a.uid, a.gid) = (1009, 1002);
    let attr = h.setattr(e.nodeid, &a).unwrap();
    assert_eq!(host_owner(&h.host("h")), (2009, 5002));
    assert_eq!((attr.uid, attr.gid), (1009, 5002));
    // A forbidden guest id can neither create nor own files.
    assert_eq!(
        h.mkdir_as(666, 0, ROOT, "no", 0o755, 0).unwrap_err(),
        libc::EPERM
    );
    a.uid = 666;
    assert_eq!(h.setattr(e.nodeid, &a).unwrap_err(), libc::EPERM);
    // Access checks use the translated ids: guest 1001 owns d on the host (as 2001).
    assert_eq!(access(&h, 1001, 1001, d.nodeid, libc::W_OK), Ok(()));
    assert_eq!(
        access(&h, 1002, 1002, d.nodeid, libc::W_OK),
        Err(libc::EACCES)
    );
}

/// `utimensat(path, [atime, mtime])` on the host, without the daemon.
fn host_utimens(p: &std::path::Path, at: (i64, i64), mt: (i64, i64)) -> Result<(), i32> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: at.0,
            tv_nsec: at.1,
        },
        libc::timespec {
            tv_sec: mt.0,
            tv_nsec: mt.1,
        },
    ];
    // SAFETY: `c` is NUL-terminated and `ts` holds the two timespecs the call reads.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    }
}

/// ((atime, atime ns), (mtime, mtime ns)) of a host file.
fn host_times(p: &std::path::Path) -> ((i64, i64), (i64, i64)) {
    let md = std::fs::metadata(p).unwrap();
    ((md.atime(), md.atime_nsec()), (md.mtime(), md.mtime_nsec()))
}

/// The times of an attribute reply, the seconds read as the signed time64 the kernel
/// stored in them (two's complement).
fn attr_times(a: &Attr) -> ((i64, i64), (i64, i64)) {
    (
        (a.atime as i64, i64::from(a.atimensec)),
        (a.mtime as i64, i64::from(a.mtimensec)),
    )
}

/// Timestamps a guest can send (seconds as the kernel's signed time64, nanoseconds).
const EDGE_TIMES: &[(i64, u32)] = &[
    (0, 0),
    (-1, 0),
    (-1, 999_999_999),
    (-315_619_200, 0),        // 1960-01-01, `touch -d 1960-01-01`
    (i32::MIN as i64, 0),     // 1901-12-13, the signed 32-bit minimum
    (i32::MIN as i64 - 1, 1), // before it
    (-62_135_596_800, 500),   // year 1
    (i64::MIN, 0),            // far below any file system's limit
    (i32::MAX as i64, 999_999_999),
    (i32::MAX as i64 + 1, 0),     // 2038-01-19 03:14:08
    (4_102_444_800, 999_999_999), // 2100-01-01
    (1 << 34, 0),                 // 2514, past ext4's 2446
    (i64::MAX, 999_999_999),      // far above any file system's limit
];

#[test]
fn setattr_times_are_stored_as_the_host_stores_them() {
    let h = Harness::new();
    let ino = h.make_file(ROOT, "f", b"x");
    std::fs::write(h.host("ref"), b"x").unwrap();
    for &(s, ns) in EDGE_TIMES {
        // The host's own answer for these times, on a file of the same file system.
        let want = host_utimens(&h.host("ref"), (s, ns.into()), (s, ns.into()))
            .map(|()| host_times(&h.host("ref")));
        let mut a = setattr_in(fattr::ATIME | fattr::MTIME);
        (a.atime, a.atimensec, a.mtime, a.mtimensec) = (s as u64, ns, s as u64, ns);
        let got = h.setattr(ino, &a);
        match want {
            Err(e) => assert_eq!(got.unwrap_err(), e, "({s}, {ns}): the host's errno"),
            Ok(t) => {
                let got =
                    got.unwrap_or_else(|e| panic!("({s}, {ns}): errno {e}, host stored {t:?}"));
                assert_eq!(attr_times(&got), t, "({s}, {ns}): reply");
                assert_eq!(host_times(&h.host("f")), t, "({s}, {ns}): host file");
                assert_eq!(
                    attr_times(&h.getattr(ino).unwrap()),
                    t,
                    "({s}, {ns}): GETATTR"
                );
            }
        }
    }
    // atime and mtime are independent: a negative atime beside a post-2038 mtime.
    let (at, mt) = ((-315_619_200, 1), (4_102_444_800, 2));
    host_utimens(&h.host("ref"), at, mt).unwrap();
    let want = host_times(&h.host("ref"));
    let mut a = setattr_in(fattr::ATIME | fattr::MTIME);
    (a.atime, a.atimensec, a.mtime, a.mtimensec) = (at.0 as u64, 1, mt.0 as u64, 2);
    assert_eq!(attr_times(&h.setattr(ino, &a).unwrap()), want);
    assert_eq!(host_times(&h.host("f")), want);
}

#[test]
fn setattr_time_flags_and_bad_nanoseconds() {
    let h = Harness::new();
    let ino = h.make_file(ROOT, "f", b"x");
    let path = h.host("f");
    host_utimens(&path, (-2, 7), (-3, 8)).unwrap();
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    // Only ATIME: mtime stays.
    let mut a = setattr_in(fattr::ATIME);
    (a.atime, a.atimensec) = ((-5i64) as u64, 9);
    h.setattr(ino, &a).unwrap();
    assert_eq!(host_times(&path), ((-5, 9), (-3, 8)));
    // ATIME_NOW: atime now, the given seconds ignored; mtime stays.
    let mut a = setattr_in(fattr::ATIME | fattr::ATIME_NOW);
    (a.atime, a.atimensec) = ((-7i64) as u64, 1);
    let t0 = now();
    h.setattr(ino, &a).unwrap();
    let ((at, _), mt) = host_times(&path);
    assert!(at >= t0 && at <= now(), "ATIME_NOW: {at}");
    assert_eq!(mt, (-3, 8));
    // MTIME with ATIME_NOW: the given mtime and the current atime.
    let mut a = setattr_in(fattr::ATIME | fattr::ATIME_NOW | fattr::MTIME);
    (a.mtime, a.mtimensec) = ((-11i64) as u64, 12);
    h.setattr(ino, &a).unwrap();
    let ((at, _), mt) = host_times(&path);
    assert!(at >= t0, "ATIME_NOW: {at}");
    assert_eq!(mt, (-11, 12));
    // Nanoseconds past 999999999 are no time: EINVAL (what utimensat gives), also for the
    // values utimensat reads as UTIME_NOW / UTIME_OMIT: the protocol says "now" with
    // FATTR_*_NOW and "leave" by leaving the flag out. Nothing changes.
    for ns in [
        1_000_000_000u32,
        libc::UTIME_NOW as u32,
        libc::UTIME_OMIT as u32,
        u32::MAX,
    ] {
        let mut a = setattr_in(fattr::MTIME);
        (a.mtime, a.mtimensec) = (100, ns);
        assert_eq!(
            h.setattr(ino, &a).unwrap_err(),
            libc::EINVAL,
            "mtime ns {ns}"
        );
        let mut a = setattr_in(fattr::ATIME);
        (a.atime, a.atimensec) = (100, ns);
        assert_eq!(
            h.setattr(ino, &a).unwrap_err(),
            libc::EINVAL,
            "atime ns {ns}"
        );
    }
    assert_eq!(
        host_times(&path).1,
        (-11, 12),
        "refused requests change nothing"
    );
    // A bad nanosecond count beside a _NOW flag for the same time is not looked at.
    let mut a = setattr_in(fattr::MTIME | fattr::MTIME_NOW);
    a.mtimensec = u32::MAX;
    h.setattr(ino, &a).unwrap();
    assert!(host_times(&path).1 .0 >= t0, "MTIME_NOW");
}
