//! Containment: nothing a guest sends reads, writes or creates anything outside the shared
//! directory. `<tmp>/outside` (a sibling of the share, holding `secret`) is the sentinel:
//! its listing, sizes, mtimes and contents must not change.

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt};

use common::*;
use daxfsd::abi::{fattr, opcode as op, *};

/// Symlinks a hostile guest (or host user) could plant inside the share.
fn plant(h: &Harness) {
    std::os::unix::fs::symlink("/etc", h.host("etc")).unwrap();
    std::os::unix::fs::symlink("../..", h.host("up")).unwrap();
    std::os::unix::fs::symlink("../outside", h.host("out")).unwrap();
    std::os::unix::fs::symlink("../outside/secret", h.host("secret")).unwrap();
    std::os::unix::fs::symlink("../outside/new", h.host("dangling")).unwrap();
}

#[test]
fn symlinks_are_never_followed() {
    let h = Harness::new();
    plant(&h);
    let before = h.outside_snapshot();
    let out = h.lookup(ROOT, "out").unwrap();
    assert_eq!(out.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(
        out.attr.ino,
        host_ino(&h.host("out")),
        "the link, not its target"
    );
    // Through the link as a directory: not a directory.
    for link in ["out", "etc", "up"] {
        let l = h.lookup(ROOT, link).unwrap().nodeid;
        assert_eq!(h.lookup(l, "secret").unwrap_err(), libc::ENOTDIR, "{link}");
        assert_eq!(h.lookup(l, "passwd").unwrap_err(), libc::ENOTDIR, "{link}");
        assert_eq!(h.lookup(l, "..").unwrap_err(), libc::ENOTDIR, "{link}");
        assert_eq!(h.opendir(l).unwrap_err(), libc::ELOOP);
        assert_eq!(h.mkdir(l, "x", 0o755).unwrap_err(), libc::ENOTDIR);
        assert_eq!(
            h.create(l, "x", 0o644, libc::O_RDWR).unwrap_err(),
            libc::ENOTDIR
        );
        assert_eq!(h.symlink(l, "x", "y").unwrap_err(), libc::ENOTDIR);
        assert_eq!(
            h.mknod(l, "x", libc::S_IFIFO | 0o644, 0).unwrap_err(),
            libc::ENOTDIR
        );
        let ct = CreateIn {
            flags: libc::O_RDWR as u32,
            mode: 0o600,
            ..Default::default()
        };
        assert_eq!(
            h.send(op::TMPFILE, l, &[&raw(&ct), &cname("t")]).errno(),
            libc::ENOTDIR
        );
    }
    // Through the link as a file: never opened.
    let s = h.lookup(ROOT, "secret").unwrap().nodeid;
    assert_eq!(h.open(s, libc::O_RDONLY).unwrap_err(), libc::ELOOP);
    assert_eq!(
        h.open(s, libc::O_RDWR | libc::O_TRUNC).unwrap_err(),
        libc::ELOOP
    );
    let mut a = setattr_in(fattr::SIZE);
    a.size = 0;
    assert_eq!(h.setattr(s, &a).unwrap_err(), libc::EINVAL);
    let mut a = setattr_in(fattr::MODE);
    a.mode = 0o777;
    assert!(
        h.setattr(s, &a).is_err(),
        "chmod of a symlink fails, never reaches the target"
    );
    let mut a = setattr_in(fattr::UID | fattr::GID);
    (a.uid, a.gid) = (4321, 4321);
    h.setattr(s, &a).unwrap();
    assert_eq!(
        host_owner(&h.host("secret")),
        (4321, 4321),
        "the link itself"
    );
    assert_eq!(host_owner(&h.outside.join("secret")), (0, 0));
    let mut a = setattr_in(fattr::MTIME);
    a.mtime = 1;
    h.setattr(s, &a).unwrap();
    assert_eq!(
        std::fs::symlink_metadata(h.host("secret")).unwrap().mtime(),
        1
    );
    // CREATE over an existing or dangling symlink: O_NOFOLLOW, nothing created outside.
    assert_eq!(
        h.create(ROOT, "secret", 0o644, libc::O_RDWR).unwrap_err(),
        libc::ELOOP
    );
    assert_eq!(
        h.create(ROOT, "secret", 0o644, libc::O_RDWR | libc::O_TRUNC)
            .unwrap_err(),
        libc::ELOOP
    );
    assert_eq!(
        h.create(ROOT, "dangling", 0o644, libc::O_RDWR).unwrap_err(),
        libc::ELOOP
    );
    assert!(!h.outside.join("new").exists());
    // READLINK just returns the text.
    let r = h.send(op::READLINK, s, &[]);
    assert_eq!(r.result().unwrap(), b"../outside/secret");
    // LINK of the symlink inode links the symlink itself.
    let r = h.send(
        op::LINK,
        ROOT,
        &[&raw(&LinkIn { oldnodeid: s }), &cname("secret2")],
    );
    r.result().unwrap();
    assert!(std::fs::symlink_metadata(h.host("secret2"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(h.outside_snapshot(), before);
    assert_eq!(std::fs::read(h.outside.join("secret")).unwrap(), b"s3cret");
}

#[test]
fn dot_dot_never_leaves_the_root() {
    let h = Harness::new();
    let before = h.outside_snapshot();
    assert_eq!(h.lookup(ROOT, "..").unwrap().nodeid, ROOT);
    assert_eq!(h.lookup(ROOT, ".").unwrap().nodeid, ROOT);
    let root_ino = host_ino(&h.share);
    assert_eq!(h.lookup(ROOT, "..").unwrap().attr.ino, root_ino);
    let d = h.mkdir(ROOT, "d", 0o755).unwrap().nodeid;
    let up = h.lookup(d, "..").unwrap();
    assert_eq!(up.nodeid, ROOT, "the root's own inode, not a second one");
    assert_eq!(h.lookup(d, ".").unwrap().nodeid, d);
    // The root's parent listing never leaks: READDIRPLUS gives no entry for "..".
    let items = h.list_dir(ROOT, 4096, true);
    let dotdot = items.iter().find(|i| i.name() == "..").unwrap();
    assert!(dotdot.entry.is_none());
    assert_eq!(h.outside_snapshot(), before);
}

/// A host user moves a directory the guest holds out of the share: LOOKUP `..` on it (and on
/// a directory below it) must not hand the guest the host directory it now lies in, nor
/// anything above; it answers the root. (The daemon here runs without a sandbox: what
/// `--sandbox none` gives; tests/vufs-driver escape.rs runs the same under chroot.)
#[test]
fn dot_dot_after_a_host_move_out_stays_at_the_root() {
    let h = Harness::new();
    std::fs::create_dir_all(h.host("m/n")).unwrap();
    let root_ino = host_ino(&h.share);
    let m = h.lookup(ROOT, "m").unwrap().nodeid;
    let n = h.lookup(m, "n").unwrap().nodeid;
    // Inside, `..` of n is m.
    assert_eq!(h.lookup(n, "..").unwrap().nodeid, m);
    std::fs::rename(h.host("m"), h.outside.join("moved")).unwrap();
    let outside_ino = host_ino(&h.outside);
    let above_ino = host_ino(h.tmp.path());
    for (what, dir) in [("moved directory", m), ("directory below it", n)] {
        let up = h.lookup(dir, "..").unwrap();
        assert_ne!(up.attr.ino, outside_ino, "{what}: '..' is outside/");
        assert_ne!(up.attr.ino, above_ino, "{what}: '..' is the share's parent");
        if what == "moved directory" {
            assert_eq!(
                (up.nodeid, up.attr.ino),
                (ROOT, root_ino),
                "{what}: the root"
            );
        }
        // Walking on never leaves: at most two steps to the root, which stays.
        let mut at = up.nodeid;
        for _ in 0..3 {
            let e = h.lookup(at, "..").unwrap();
            assert!(
                ![outside_ino, above_ino].contains(&e.attr.ino),
                "{what}: walk reached {}",
                e.attr.ino
            );
            at = e.nodeid;
        }
        assert_eq!(at, ROOT, "{what}: the walk ends at the root");
    }
    // READDIRPLUS of the moved directory gives no entry for "..".
    let items = h.list_dir(m, 4096, true);
    for i in items.iter().filter(|i| i.name() == "..") {
        if let Some(e) = &i.entry {
            assert!(
                ![outside_ino, above_ino].contains(&e.attr.ino),
                "READDIRPLUS .."
            );
        }
    }
}

/// A directory the guest holds is moved out of the share by a host user, who then puts
/// files there: LOOKUP in it finds nothing (ENOENT) and READDIRPLUS gives no entry with
/// attributes (no new host inode enters the session from outside the share).
#[test]
fn lookups_in_a_directory_moved_out_find_nothing() {
    let h = Harness::new();
    std::fs::create_dir_all(h.host("m/n")).unwrap();
    std::fs::write(h.host("m/f"), b"inside").unwrap();
    let m = h.lookup(ROOT, "m").unwrap().nodeid;
    let n = h.lookup(m, "n").unwrap().nodeid;
    assert!(h.lookup(m, "f").is_ok(), "inside, it is found");
    std::fs::rename(h.host("m"), h.outside.join("moved")).unwrap();
    std::fs::write(h.outside.join("moved/planted"), b"host").unwrap();
    for (dir, name) in [(m, "f"), (m, "planted"), (m, "n"), (n, "x")] {
        assert_eq!(h.lookup(dir, name).unwrap_err(), libc::ENOENT, "{name}");
    }
    let inodes = h.fs().inode_count();
    let items = h.list_dir(m, 4096, true);
    assert!(
        items.iter().any(|i| i.name() == "planted"),
        "the listing itself"
    );
    assert!(
        items.iter().all(|i| i.entry.is_none()),
        "READDIRPLUS gave attributes of a file outside the share"
    );
    assert_eq!(h.fs().inode_count(), inodes, "no inode entered");
    // Moved back: served again.
    std::fs::rename(h.outside.join("moved"), h.host("m")).unwrap();
    assert!(h.lookup(m, "f").is_ok());
}

/// A migrated session agreeing INIT flags this daemon never offers (every bit set) is
/// refused, and the session stays as it was.
#[test]
fn migrated_session_with_every_flag_is_refused() {
    use daxfsd::server::SessionState;
    let h = Harness::new();
    let before = h.server.export_session();
    let mut st = h.server.save_state(&Default::default()).unwrap();
    st.session = SessionState {
        flags: u64::MAX,
        ..before
    };
    let e = h
        .server
        .load_state(st.clone(), &Default::default())
        .unwrap_err();
    assert!(e.to_string().contains("not offer"), "{e}");
    assert_eq!(h.server.export_session(), before);
    // The same state with the flags this session agreed loads.
    st.session = before;
    h.server.load_state(st, &Default::default()).unwrap();
}

#[test]
fn dot_names_are_refused_for_every_modification() {
    let h = Harness::new();
    let before = h.outside_snapshot();
    let f = h.make_file(ROOT, "f", b"f");
    let d = h.mkdir(ROOT, "d", 0o755).unwrap().nodeid;
    for name in [".", ".."] {
        for parent in [ROOT, d] {
            assert_eq!(h.mkdir(parent, name, 0o755).unwrap_err(), libc::EINVAL);
            assert_eq!(
                h.create(parent, name, 0o644, libc::O_RDWR).unwrap_err(),
                libc::EINVAL
            );
            assert_eq!(h.symlink(parent, name, "/etc").unwrap_err(), libc::EINVAL);
            assert_eq!(
                h.mknod(parent, name, libc::S_IFIFO | 0o644, 0).unwrap_err(),
                libc::EINVAL
            );
            assert_eq!(
                h.send(op::UNLINK, parent, &[&cname(name)]).errno(),
                libc::EINVAL
            );
            assert_eq!(
                h.send(op::RMDIR, parent, &[&cname(name)]).errno(),
                libc::EINVAL
            );
            let link = raw(&LinkIn { oldnodeid: f });
            assert_eq!(
                h.send(op::LINK, parent, &[&link, &cname(name)]).errno(),
                libc::EINVAL
            );
            let rn = raw(&RenameIn { newdir: parent });
            let r = h.send(op::RENAME, ROOT, &[&rn, &cname("f"), &cname(name)]);
            assert_eq!(r.errno(), libc::EINVAL);
            let r = h.send(op::RENAME, parent, &[&rn, &cname(name), &cname("x")]);
            assert_eq!(r.errno(), libc::EINVAL);
            let rn2 = raw(&Rename2In {
                newdir: parent,
                flags: libc::RENAME_EXCHANGE,
                padding: 0,
            });
            let r = h.send(op::RENAME2, ROOT, &[&rn2, &cname("f"), &cname(name)]);
            assert_eq!(r.errno(), libc::EINVAL);
        }
    }
    // Paths instead of names: refused by the server before the filesystem.
    let rn = raw(&RenameIn { newdir: ROOT });
    let r = h.send(
        op::RENAME,
        ROOT,
        &[&rn, &cname("f"), &cname("../outside/f")],
    );
    assert_eq!(r.errno(), libc::EINVAL);
    let link = raw(&LinkIn { oldnodeid: f });
    let r = h.send(op::LINK, ROOT, &[&link, &cname("../outside/l")]);
    assert_eq!(r.errno(), libc::EINVAL);
    assert_eq!(
        h.symlink(ROOT, "../outside/s", "x").unwrap_err(),
        libc::EINVAL
    );
    // Symlinks *pointing* outside may be created (they are only text to us).
    h.symlink(ROOT, "s", "../outside/secret").unwrap();
    let r = h.send(op::RENAME, ROOT, &[&rn, &cname("s"), &cname("s2")]);
    r.result().unwrap();
    assert!(h.host("f").is_file() && h.host("d").is_dir() && h.share.exists());
    assert_eq!(h.outside_snapshot(), before);
}

#[test]
fn special_files_are_never_opened() {
    let h = Harness::new();
    let before = h.outside_snapshot();
    // A guest-made /dev/zero (1,5), a block device and a fifo.
    let c = h.mknod(ROOT, "zero", libc::S_IFCHR | 0o666, 0x105).unwrap();
    let b = h.mknod(ROOT, "blk", libc::S_IFBLK | 0o666, 0x700).unwrap();
    let p = h.mknod(ROOT, "fifo", libc::S_IFIFO | 0o666, 0).unwrap();
    assert!(std::fs::symlink_metadata(h.host("zero"))
        .unwrap()
        .file_type()
        .is_char_device());
    for (name, ino) in [("zero", c.nodeid), ("blk", b.nodeid), ("fifo", p.nodeid)] {
        assert_eq!(
            h.open(ino, libc::O_RDONLY).unwrap_err(),
            libc::EPERM,
            "{name}"
        );
        assert_eq!(
            h.open(ino, libc::O_RDWR).unwrap_err(),
            libc::EPERM,
            "{name}"
        );
        // CREATE without O_EXCL on the existing name must not open it either (a fifo
        // would block forever, a device would be the host's).
        assert_eq!(
            h.create(ROOT, name, 0o644, libc::O_RDWR).unwrap_err(),
            libc::EPERM,
            "{name}"
        );
        let mut a = setattr_in(fattr::SIZE);
        a.size = 0;
        assert_eq!(h.setattr(ino, &a).unwrap_err(), libc::EINVAL, "{name}");
        assert_eq!(h.opendir(ino).unwrap_err(), libc::ENOTDIR);
        assert_eq!(
            h.send(op::SYNCFS, ino, &[&raw(&SyncfsIn::default())])
                .errno(),
            libc::EINVAL
        );
    }
    assert_eq!(h.fs().handle_count(), 0);
    assert_eq!(
        h.fs()
            .lookup_count(daxfsd::filesystem::Inode::from_raw(c.nodeid)),
        1,
        "failed CREATEs left no reference"
    );
    // No descriptor other than the O_PATH one was ever opened on the nodes.
    for name in ["zero", "blk", "fifo"] {
        for flags in host_fds_on(&h.host(name)) {
            assert_ne!(
                flags as i32 & libc::O_PATH,
                0,
                "{name}: only O_PATH descriptors"
            );
        }
    }
    assert_eq!(h.outside_snapshot(), before);
}

#[test]
fn inode_numbers_and_handles_are_not_guessable_pointers() {
    let h = Harness::new();
    let before = h.outside_snapshot();
    for bogus in [
        0,
        2,
        3,
        u64::MAX,
        0xffff_8880_0000_0000,
        host_ino(&h.outside),
    ] {
        assert_eq!(h.getattr(bogus).unwrap_err(), libc::EBADF);
        assert_eq!(h.lookup(bogus, "secret").unwrap_err(), libc::EBADF);
        assert_eq!(h.open(bogus, libc::O_RDONLY).unwrap_err(), libc::EBADF);
        assert_eq!(h.read(ROOT, bogus, 0, 10).unwrap_err(), libc::EBADF);
        h.forget(bogus, u64::MAX);
    }
    h.assert_alive();
    assert_eq!(h.outside_snapshot(), before);
}
