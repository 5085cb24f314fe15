//! FUSE operations through the driver, checked against the host files of the shared
//! directory. Daemon: `VUFS_DAEMON` (default: upstream virtiofsd 1.14).

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::time::Duration;

use common::errno;
use daxfsd::abi::{self, fattr, ForgetOne, SetattrIn};
use vufs_driver::device::{VIRTIO_F_VERSION_1, VIRTIO_RING_F_EVENT_IDX};
use vufs_driver::{DriverConfig, Xattr};

const ROOT: u64 = abi::ROOT_ID;
const DT_DIR: u32 = 4;
const DT_REG: u32 = 8;
const DT_LNK: u32 = 10;

#[test]
fn handshake_and_init() {
    let mut r = common::start(&[]);
    let info = r.s.device().info().clone();
    assert_ne!(info.acked_features & VIRTIO_F_VERSION_1, 0);
    assert_eq!(
        info.acked_features & !info.backend_features,
        0,
        "acked an unoffered feature"
    );
    assert_eq!(
        info.event_idx,
        info.backend_features & VIRTIO_RING_F_EVENT_IDX != 0
    );
    assert!(info.num_request_queues >= 1);
    if let Some(n) = info.queue_num {
        assert!(n as usize > info.num_request_queues);
    }
    let (init_in, out) = r.s.init_state().expect("INIT recorded");
    assert_eq!(out.major, 7);
    assert!(
        out.minor >= abi::MIN_KERNEL_MINOR_VERSION && out.minor <= init_in.minor,
        "{out:?}"
    );
    assert!(out.max_write >= 4096, "{out:?}");
    assert!(u64::from(out.flags) & abi::init_flags::INIT_EXT != 0 || out.flags2 == 0);
    // Only flags we asked for may be "negotiated"; the root is a directory.
    let root = r.s.getattr(ROOT, None).unwrap();
    assert_eq!(root.attr.mode & libc::S_IFMT, libc::S_IFDIR);
    assert_eq!(root.attr.ino, fs::metadata(r.shared()).unwrap().ino());
    r.assert_clean();
}

#[test]
fn tag_from_config_space() {
    let mut r = common::start(&["--tag=vufs-test"]);
    let info = r.s.device().info().clone();
    assert_eq!(info.tag.as_deref(), Some("vufs-test"));
    let cfg = info.config.expect("config space");
    assert!(cfg.num_request_queues >= 1);
    assert_eq!(info.num_request_queues, cfg.num_request_queues as usize);
    r.assert_clean();
}

#[test]
fn lookup_and_getattr_match_host() {
    let mut r = common::start_with(&[], &DriverConfig::default(), |d| {
        fs::write(d.join("hello.txt"), b"hello world").unwrap();
        fs::set_permissions(d.join("hello.txt"), fs::Permissions::from_mode(0o640)).unwrap();
        fs::create_dir(d.join("sub")).unwrap();
    });
    let host = fs::metadata(r.host("hello.txt")).unwrap();
    let e = r.s.lookup(ROOT, "hello.txt").unwrap();
    assert_ne!(e.nodeid, 0);
    assert_eq!(e.attr.size, 11);
    assert_eq!(e.attr.mode, libc::S_IFREG | 0o640);
    assert_eq!(e.attr.ino, host.ino());
    assert_eq!(e.attr.nlink, 1);
    let a = r.s.getattr(e.nodeid, None).unwrap();
    assert_eq!(a.attr, e.attr);
    let d = r.s.lookup(ROOT, "sub").unwrap();
    assert_eq!(d.attr.mode & libc::S_IFMT, libc::S_IFDIR);
    assert_ne!(d.nodeid, e.nodeid);
    assert_eq!(
        errno(&r.s.lookup(ROOT, "missing").unwrap_err()),
        libc::ENOENT
    );
    assert_eq!(
        errno(&r.s.lookup(d.nodeid, "hello.txt").unwrap_err()),
        libc::ENOENT
    );
    r.s.forget(e.nodeid, 1).unwrap();
    r.s.forget(d.nodeid, 1).unwrap();
    r.assert_clean();
}

#[test]
fn create_write_read_roundtrip() {
    let mut r = common::start(&[]);
    let flags = (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) as u32;
    let (e, o) =
        r.s.create(ROOT, "new.bin", flags, libc::S_IFREG | 0o600, 0)
            .unwrap();
    let host = r.host("new.bin");
    let md = fs::metadata(&host).unwrap();
    assert_eq!(md.mode(), libc::S_IFREG | 0o600);
    assert_eq!(e.attr.ino, md.ino());
    assert_eq!(
        errno(&r.s.create(ROOT, "new.bin", flags, 0o600, 0).unwrap_err()),
        libc::EEXIST
    );

    assert_eq!(r.s.write(e.nodeid, o.fh, 0, b"0123456789").unwrap(), 10);
    assert_eq!(r.s.write(e.nodeid, o.fh, 4, b"ab").unwrap(), 2);
    assert_eq!(r.s.write(e.nodeid, o.fh, 20, b"tail").unwrap(), 4);
    let mut want = b"0123ab6789".to_vec();
    want.resize(20, 0);
    want.extend_from_slice(b"tail");
    assert_eq!(fs::read(&host).unwrap(), want);
    assert_eq!(r.s.read(e.nodeid, o.fh, 0, 4096).unwrap(), want);
    assert_eq!(r.s.read(e.nodeid, o.fh, 3, 4).unwrap(), b"3ab6");
    assert_eq!(r.s.read(e.nodeid, o.fh, 100, 10).unwrap(), b"");

    // One max_write-sized write and read, crossing many pages.
    let max = r.s.init_state().unwrap().1.max_write.min(1 << 20) as usize;
    let big: Vec<u8> = (0..max).map(|i| (i * 7 + i / 4096) as u8).collect();
    assert_eq!(r.s.write(e.nodeid, o.fh, 4096, &big).unwrap() as usize, max);
    let got = r.s.read(e.nodeid, o.fh, 4096, max as u32).unwrap();
    assert!(got == big, "big read differs");
    assert_eq!(&fs::read(&host).unwrap()[4096..], &big[..]);
    assert_eq!(
        r.s.getattr(e.nodeid, Some(o.fh)).unwrap().attr.size,
        4096 + max as u64
    );

    // Writes from the host are visible (cache=never).
    fs::write(&host, b"host").unwrap();
    assert_eq!(r.s.read(e.nodeid, o.fh, 0, 100).unwrap(), b"host");

    r.s.fsync(e.nodeid, o.fh, false).unwrap();
    r.s.fsync(e.nodeid, o.fh, true).unwrap();
    r.s.flush(e.nodeid, o.fh, 0).unwrap();
    r.s.release(e.nodeid, o.fh, flags).unwrap();

    // OPEN of the existing file, read-only: writes fail.
    let o2 = r.s.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    assert_eq!(r.s.read(e.nodeid, o2.fh, 0, 4).unwrap(), b"host");
    assert_eq!(
        errno(&r.s.write(e.nodeid, o2.fh, 0, b"x").unwrap_err()),
        libc::EBADF
    );
    r.s.release(e.nodeid, o2.fh, libc::O_RDONLY as u32).unwrap();
    r.s.forget(e.nodeid, 1).unwrap();
    r.assert_clean();
}

fn list_plus(r: &common::Rig, dir: u64) -> BTreeMap<String, vufs_driver::DirEntryPlus> {
    let o = r.s.opendir(dir, libc::O_RDONLY as u32).unwrap();
    let mut all = BTreeMap::new();
    let mut off = 0;
    loop {
        let v = r.s.readdirplus(dir, o.fh, off, 4096).unwrap();
        let Some(last) = v.last() else { break };
        off = last.dirent.off;
        for e in v {
            let name = String::from_utf8(e.dirent.name.clone()).unwrap();
            assert!(all.insert(name, e).is_none(), "entry listed twice");
        }
    }
    r.s.releasedir(dir, o.fh, 0).unwrap();
    all
}

#[test]
fn readdir_and_readdirplus_list_host_entries() {
    let mut r = common::start_with(&[], &DriverConfig::default(), |d| {
        fs::write(d.join("a"), b"12345").unwrap();
        fs::write(d.join("b"), b"").unwrap();
        fs::create_dir(d.join("sub")).unwrap();
        std::os::unix::fs::symlink("a", d.join("link")).unwrap();
        for i in 0..100 {
            fs::write(d.join(format!("many-{i:03}-{}", "x".repeat(i))), b"").unwrap();
        }
    });
    let all = list_plus(&r, ROOT);
    assert_eq!(
        all.len(),
        2 + 4 + 100,
        "{:?}",
        all.keys().collect::<Vec<_>>()
    );
    for (name, e) in &all {
        if name == "." || name == ".." {
            assert_eq!(e.dirent.typ, DT_DIR);
            continue;
        }
        let md = fs::symlink_metadata(r.host(name)).unwrap();
        assert_eq!(e.dirent.ino, md.ino(), "{name}");
        assert_ne!(e.entry.nodeid, 0, "{name}");
        assert_eq!(e.entry.attr.ino, md.ino(), "{name}");
        assert_eq!(e.entry.attr.size, md.size(), "{name}");
        assert_eq!(e.entry.attr.mode, md.mode(), "{name}");
        let want = if md.is_dir() {
            DT_DIR
        } else if md.file_type().is_symlink() {
            DT_LNK
        } else {
            DT_REG
        };
        assert_eq!(e.dirent.typ, want, "{name}");
    }
    // READDIR with small buffers (the longest record is 136 bytes), page by page: the
    // same names.
    let o = r.s.opendir(ROOT, 0).unwrap();
    let (mut names, mut off) = (Vec::new(), 0);
    loop {
        let v = r.s.readdir(ROOT, o.fh, off, 200).unwrap();
        let Some(last) = v.last() else { break };
        off = last.off;
        names.extend(v.into_iter().map(|e| String::from_utf8(e.name).unwrap()));
    }
    r.s.releasedir(ROOT, o.fh, 0).unwrap();
    names.sort();
    assert_eq!(names, all.keys().cloned().collect::<Vec<_>>());
    // Every READDIRPLUS entry with a nodeid counted a lookup: give them back.
    let forgets: Vec<ForgetOne> = all
        .values()
        .filter(|e| e.entry.nodeid != 0 && e.dirent.name != b"." && e.dirent.name != b"..")
        .map(|e| ForgetOne {
            nodeid: e.entry.nodeid,
            nlookup: 1,
        })
        .collect();
    r.s.batch_forget(&forgets).unwrap();
    r.assert_clean();
}

#[test]
fn namespace_operations_match_host() {
    let mut r = common::start(&[]);
    let d = r.s.mkdir(ROOT, "d", libc::S_IFDIR | 0o750, 0).unwrap();
    assert_eq!(
        fs::metadata(r.host("d")).unwrap().mode(),
        libc::S_IFDIR | 0o750
    );
    let flags = (libc::O_WRONLY | libc::O_CREAT) as u32;
    let (f, o) =
        r.s.create(d.nodeid, "f", flags, libc::S_IFREG | 0o644, 0o022)
            .unwrap();
    r.s.write(f.nodeid, o.fh, 0, b"data").unwrap();
    r.s.release(f.nodeid, o.fh, flags).unwrap();

    r.s.rename(d.nodeid, "f", ROOT, "g").unwrap();
    assert!(!r.host("d/f").exists());
    assert_eq!(fs::read(r.host("g")).unwrap(), b"data");
    assert_eq!(
        errno(&r.s.rename(d.nodeid, "f", ROOT, "x").unwrap_err()),
        libc::ENOENT
    );

    fs::write(r.host("other"), b"other").unwrap();
    let e =
        r.s.rename2(ROOT, "g", ROOT, "other", libc::RENAME_NOREPLACE)
            .unwrap_err();
    assert_eq!(errno(&e), libc::EEXIST);
    r.s.rename2(ROOT, "g", ROOT, "other", libc::RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(fs::read(r.host("g")).unwrap(), b"other");
    assert_eq!(fs::read(r.host("other")).unwrap(), b"data");

    let l = r.s.link(f.nodeid, d.nodeid, "hard").unwrap();
    assert_eq!(l.attr.ino, f.attr.ino);
    assert_eq!(l.attr.nlink, 2);
    assert_eq!(fs::metadata(r.host("other")).unwrap().nlink(), 2);
    assert_eq!(fs::read(r.host("d/hard")).unwrap(), b"data");

    let s = r.s.symlink(ROOT, "sym", "d/hard").unwrap();
    assert_eq!(s.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(
        fs::read_link(r.host("sym")).unwrap().to_str(),
        Some("d/hard")
    );
    assert_eq!(r.s.readlink(s.nodeid).unwrap(), b"d/hard");

    assert_eq!(errno(&r.s.rmdir(ROOT, "d").unwrap_err()), libc::ENOTEMPTY);
    assert_eq!(errno(&r.s.unlink(ROOT, "d").unwrap_err()), libc::EISDIR);
    r.s.unlink(d.nodeid, "hard").unwrap();
    r.s.unlink(ROOT, "sym").unwrap();
    assert_eq!(errno(&r.s.unlink(ROOT, "sym").unwrap_err()), libc::ENOENT);
    r.s.rmdir(ROOT, "d").unwrap();
    assert!(!r.host("d").exists() && !r.host("sym").exists());
    assert_eq!(fs::metadata(r.host("other")).unwrap().nlink(), 1);

    let p =
        r.s.mknod(ROOT, "fifo", libc::S_IFIFO | 0o600, 0, 0)
            .unwrap();
    assert!(fs::metadata(r.host("fifo")).unwrap().file_type().is_fifo());
    assert_eq!(p.attr.mode, libc::S_IFIFO | 0o600);

    for (n, c) in [(d.nodeid, 1), (f.nodeid, 2), (s.nodeid, 1), (p.nodeid, 1)] {
        r.s.forget(n, c).unwrap();
    }
    r.assert_clean();
}

#[test]
fn setattr_statfs_access() {
    let mut r = common::start_with(&[], &DriverConfig::default(), |d| {
        fs::write(d.join("f"), vec![7u8; 10000]).unwrap();
    });
    let e = r.s.lookup(ROOT, "f").unwrap();
    let host = r.host("f");
    let a =
        r.s.setattr(
            e.nodeid,
            &SetattrIn {
                valid: fattr::SIZE,
                size: 100,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.attr.size, 100);
    assert_eq!(fs::metadata(&host).unwrap().len(), 100);
    let a =
        r.s.setattr(
            e.nodeid,
            &SetattrIn {
                valid: fattr::MODE,
                mode: 0o604,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.attr.mode, libc::S_IFREG | 0o604);
    assert_eq!(fs::metadata(&host).unwrap().mode(), libc::S_IFREG | 0o604);
    let set = SetattrIn {
        valid: fattr::MTIME | fattr::ATIME,
        mtime: 1_000_000_000,
        mtimensec: 5,
        atime: 1_100_000_000,
        ..Default::default()
    };
    let a = r.s.setattr(e.nodeid, &set).unwrap();
    assert_eq!(
        (a.attr.mtime, a.attr.mtimensec, a.attr.atime),
        (1_000_000_000, 5, 1_100_000_000)
    );
    let md = fs::metadata(&host).unwrap();
    assert_eq!(
        (md.mtime(), md.mtime_nsec(), md.atime()),
        (1_000_000_000, 5, 1_100_000_000)
    );

    let st = r.s.statfs(ROOT).unwrap();
    assert!(st.bsize > 0 && st.blocks > 0 && st.namelen >= 255, "{st:?}");
    r.s.access(e.nodeid, libc::R_OK as u32).unwrap();
    r.s.forget(e.nodeid, 1).unwrap();
    r.assert_clean();
}

fn host_getxattr(path: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: valid NUL-terminated strings and a buffer of the length passed.
    let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (len >= 0).then(|| buf[..len as usize].to_vec())
}

#[test]
fn xattrs() {
    let mut r = common::start_with(&["--xattr"], &DriverConfig::default(), |d| {
        fs::write(d.join("f"), b"x").unwrap();
    });
    let e = r.s.lookup(ROOT, "f").unwrap();
    r.s.setxattr(e.nodeid, "user.vufs", b"value-1", 0).unwrap();
    assert_eq!(
        host_getxattr(&r.host("f"), "user.vufs").as_deref(),
        Some(&b"value-1"[..])
    );
    assert_eq!(
        r.s.getxattr(e.nodeid, "user.vufs", 0).unwrap(),
        Xattr::Size(7)
    );
    assert_eq!(
        r.s.getxattr(e.nodeid, "user.vufs", 64).unwrap(),
        Xattr::Data(b"value-1".to_vec())
    );
    assert_eq!(
        errno(&r.s.getxattr(e.nodeid, "user.vufs", 3).unwrap_err()),
        libc::ERANGE
    );
    let e2 =
        r.s.setxattr(e.nodeid, "user.vufs", b"v", libc::XATTR_CREATE as u32)
            .unwrap_err();
    assert_eq!(errno(&e2), libc::EEXIST);
    let Xattr::Data(list) = r.s.listxattr(e.nodeid, 1024).unwrap() else {
        panic!("list")
    };
    assert!(
        list.split(|b| *b == 0).any(|n| n == b"user.vufs"),
        "{list:?}"
    );
    match r.s.listxattr(e.nodeid, 0).unwrap() {
        Xattr::Size(n) => assert_eq!(n as usize, list.len()),
        x => panic!("{x:?}"),
    }
    r.s.removexattr(e.nodeid, "user.vufs").unwrap();
    assert_eq!(host_getxattr(&r.host("f"), "user.vufs"), None);
    assert_eq!(
        errno(&r.s.getxattr(e.nodeid, "user.vufs", 64).unwrap_err()),
        libc::ENODATA
    );
    r.s.forget(e.nodeid, 1).unwrap();
    r.assert_clean();
}

#[test]
fn forgets_complete_on_hiprio() {
    let mut r = common::start_with(&[], &DriverConfig::default(), |d| {
        for i in 0..20 {
            fs::write(d.join(format!("f{i}")), b"").unwrap();
        }
    });
    let hi = r.s.device().queue(0).unwrap().stats();
    let mut ids = Vec::new();
    for i in 0..20 {
        let a = r.s.lookup(ROOT, format!("f{i}")).unwrap();
        let b = r.s.lookup(ROOT, format!("f{i}")).unwrap();
        assert_eq!(a.nodeid, b.nodeid);
        ids.push(a.nodeid);
    }
    r.s.forget(ids[0], 2).unwrap();
    let batch: Vec<ForgetOne> = ids[1..]
        .iter()
        .map(|&n| ForgetOne {
            nodeid: n,
            nlookup: 2,
        })
        .collect();
    r.s.batch_forget(&batch).unwrap();
    let after = r.s.device().queue(0).unwrap().stats();
    assert_eq!(after.completed, hi.completed + 2);
    // The files are still there and can be looked up again.
    assert_ne!(r.s.lookup(ROOT, "f3").unwrap().nodeid, 0);
    r.assert_clean();
}

#[test]
fn destroy_then_disconnect_daemon_exits_cleanly() {
    let r = common::start(&[]);
    r.s.getattr(ROOT, None).unwrap();
    r.s.destroy().unwrap();
    let common::Rig {
        s,
        mut daemon,
        root,
    } = r;
    drop(s);
    let st = daemon.wait_exit(Duration::from_secs(10)).unwrap();
    assert!(
        st.success(),
        "exit status {st}\nlog:\n{}",
        daemon.log_contents()
    );
    drop(root);
}

#[test]
fn disconnect_without_destroy_daemon_exits_cleanly() {
    let mut r = common::start(&[]);
    r.s.getattr(ROOT, None).unwrap();
    r.s.device().disconnect();
    let e = r.s.getattr(ROOT, None).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionAborted, "{e}");
    let st = r.daemon.wait_exit(Duration::from_secs(10)).unwrap();
    assert!(
        st.success(),
        "exit status {st}\nlog:\n{}",
        r.daemon.log_contents()
    );
}
