//! `--inode-file-handles`: inodes kept as file handles hold no descriptor of their own (at
//! most `HANDLE_FD_CACHE` recently used ones keep theirs), so a walk of a large tree leaves
//! the descriptor count bounded; with O_PATH descriptors it grows by one per inode. Identity, renames, hard links and I/O through handle inodes, and the
//! one-line refusal of `mandatory` where handles cannot be opened. Needs root (opening
//! file handles needs CAP_DAC_READ_SEARCH). One test per binary part, run in sequence, as
//! descriptor counts are per process.

mod common;

use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

use common::*;
use daxfsd::passthrough::{FileHandleMode, HANDLE_FD_CACHE};

/// The tests count this process's descriptors: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const DIRS: usize = 100;
const FILES: usize = 100;

/// Builds DIRS x FILES files under the share, on the host.
fn populate(h: &Harness) {
    for d in 0..DIRS {
        let dir = h.host(&format!("d{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..FILES {
            std::fs::write(dir.join(format!("f{f}")), format!("{d}/{f}")).unwrap();
        }
    }
}

/// Looks up every directory and file (as a guest's `find` with attribute reads does) and
/// returns (descriptors added, walk time in ms). Every inode stays referenced.
fn walk(h: &Harness) -> (usize, u128) {
    let before = fd_count();
    let t = Instant::now();
    for d in 0..DIRS {
        let dn = h.lookup(ROOT, &format!("d{d}")).unwrap().nodeid;
        for f in 0..FILES {
            let e = h.lookup(dn, &format!("f{f}")).unwrap();
            assert_eq!(e.attr.size as usize, format!("{d}/{f}").len());
        }
    }
    let ms = t.elapsed().as_millis();
    (fd_count().saturating_sub(before), ms)
}

#[test]
fn file_handles() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // O_PATH descriptors: one per inode.
    let fds = Harness::with(|c| c.inode_file_handles = FileHandleMode::Never);
    assert_eq!(fds.fs().file_handle_mode(), FileHandleMode::Never);
    populate(&fds);
    let (grown_fds, ms_fds) = walk(&fds);
    assert!(
        grown_fds >= DIRS * (FILES + 1),
        "descriptor inodes: {grown_fds} new descriptors"
    );
    drop(fds);

    // File handles: the walk adds at most the cache's descriptors (the mount descriptor is
    // opened at start).
    for mode in [FileHandleMode::Mandatory, FileHandleMode::Prefer] {
        let h = Harness::with(|c| c.inode_file_handles = mode);
        assert_eq!(
            h.fs().file_handle_mode(),
            mode,
            "file handles must work here (root, ext4/tmpfs)"
        );
        populate(&h);
        let (grown, ms) = walk(&h);
        let (handles, mounts, cached) = h.fs().file_handle_counts();
        eprintln!(
            "walk of {} inodes: descriptors +{grown_fds} in {ms_fds} ms with O_PATH fds; +{grown} in {ms} ms with handles ({mode:?}: {handles} handle inodes, {mounts} mount fd, {cached} cached fds)",
            DIRS * (FILES + 1)
        );
        assert!(cached <= HANDLE_FD_CACHE, "{cached} cached descriptors");
        assert!(
            grown <= HANDLE_FD_CACHE + 2,
            "{mode:?}: {grown} new descriptors after the walk"
        );
        assert_eq!(
            handles,
            DIRS * (FILES + 1),
            "{mode:?}: every inode is a handle"
        );
        assert_eq!(mounts, 1);
        // GETATTR of 2,000 files opens each handle: the cache keeps the last
        // HANDLE_FD_CACHE descriptors and no more.
        let before = fd_count();
        for d in 0..20 {
            let dn = h.lookup(ROOT, &format!("d{d}")).unwrap().nodeid;
            for f in 0..FILES {
                let e = h.lookup(dn, &format!("f{f}")).unwrap();
                h.getattr(e.nodeid).unwrap();
            }
        }
        let (_, _, cached) = h.fs().file_handle_counts();
        assert_eq!(
            cached, HANDLE_FD_CACHE,
            "{mode:?}: the cache is full, not more"
        );
        assert!(
            fd_count() <= before + HANDLE_FD_CACHE,
            "{mode:?}: {} -> {} descriptors",
            before,
            fd_count()
        );
        check_operations(&h);
    }
}

/// Operations on handle inodes behave as on descriptor inodes.
fn check_operations(h: &Harness) {
    // Identity: the same host file is the same nodeid (by (dev, ino, mnt)), hard links too.
    let d0 = h.lookup(ROOT, "d0").unwrap().nodeid;
    let a = h.lookup(d0, "f1").unwrap();
    let b = h.lookup(d0, "f1").unwrap();
    assert_eq!(a.nodeid, b.nodeid);
    std::fs::hard_link(h.host("d0/f1"), h.host("d1/link")).unwrap();
    let d1 = h.lookup(ROOT, "d1").unwrap().nodeid;
    assert_eq!(h.lookup(d1, "link").unwrap().nodeid, a.nodeid);
    assert_eq!(
        a.attr.ino,
        std::fs::metadata(h.host("d0/f1")).unwrap().ino()
    );

    // I/O, create, write, setattr, readdir, xattrs, rename, unlink.
    let o = h.open(a.nodeid, libc::O_RDONLY).unwrap();
    assert_eq!(h.read(a.nodeid, o.fh, 0, 100).unwrap(), b"0/1");
    h.release(a.nodeid, o.fh).unwrap();
    let new = h.make_file(d0, "new", b"hello");
    assert_eq!(std::fs::read(h.host("d0/new")).unwrap(), b"hello");
    let mut sa = setattr_in(daxfsd::abi::fattr::MODE);
    sa.mode = 0o600;
    assert_eq!(h.setattr(new, &sa).unwrap().mode & 0o777, 0o600);
    assert_eq!(host_mode(&h.host("d0/new")) & 0o777, 0o600);
    let names: Vec<String> = h
        .list_dir(d0, 64 * 1024, false)
        .iter()
        .map(|e| e.name().to_string())
        .collect();
    assert!(names.iter().any(|n| n == "new"), "{names:?}");
    host_setxattr(&h.host("d0/new"), "user.k", b"v");
    let sub = h.mkdir(d0, "sub", 0o755).unwrap().nodeid;
    // Renamed on the host behind the guest's back: the handle still names the file.
    std::fs::rename(h.host("d0/new"), h.host("d1/moved")).unwrap();
    assert_eq!(h.getattr(new).unwrap().mode & 0o777, 0o600);
    let o = h.open(new, libc::O_RDONLY).unwrap();
    assert_eq!(h.read(new, o.fh, 0, 100).unwrap(), b"hello");
    h.release(new, o.fh).unwrap();
    assert!(h.lookup(sub, "nothing").is_err());
    // Removed on the host: the inode reports the file as gone (ESTALE) or, while its
    // descriptor is cached, as unlinked; nothing else is reached.
    std::fs::remove_file(h.host("d1/moved")).unwrap();
    match h.getattr(new) {
        Ok(a) => assert_eq!(a.nlink, 0, "getattr of a removed file"),
        Err(e) => assert!(e == libc::ESTALE || e == libc::ENOENT, "getattr: {e}"),
    }
    h.assert_alive();
}

/// `mandatory` where file handles cannot be opened (no CAP_DAC_READ_SEARCH: dropped from
/// the bounding set before exec) fails at start with one line; `prefer` falls back and
/// serves.
#[test]
fn mandatory_refused_without_cap_dac_read_search() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let share = tmp.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let run = |mode: &str| {
        let sock = tmp.path().join(format!("s-{mode}"));
        Command::new("setpriv")
            .arg("--bounding-set=-dac_read_search")
            .arg(env!("CARGO_BIN_EXE_daxfsd"))
            .arg(format!("--socket-path={}", sock.display()))
            .arg(format!("--shared-dir={}", share.display()))
            .arg("--sandbox=none")
            .arg(format!("--inode-file-handles={mode}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("setpriv (util-linux) runs daxfsd")
    };
    let out = run("mandatory").wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mandatory must fail: {err}");
    let line = err
        .lines()
        .find(|l| l.contains("--inode-file-handles=mandatory"))
        .unwrap_or_else(|| panic!("no error line naming the option: {err}"));
    assert!(line.contains("CAP_DAC_READ_SEARCH"), "{line}");
    eprintln!("mandatory without the capability: {line}");

    let mut child = run("prefer");
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let mut line = String::new();
    while std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() > 0 {
        seen.push_str(&line);
        if line.contains("Waiting for vhost-user socket connection") {
            break;
        }
        line.clear();
    }
    // SAFETY: kill() of our own child by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    assert!(
        seen.contains("Waiting for vhost-user socket connection"),
        "prefer must fall back and serve: {seen}"
    );
    assert!(seen.contains("file handles do not work"), "{seen}");
}

/// An inode number freed while the guest still holds the old inode (no descriptor pins it)
/// and reused by a new file: the new file is a new inode, not the old one.
#[test]
fn reused_inode_numbers_are_new_inodes() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let h = Harness::with(|c| c.inode_file_handles = FileHandleMode::Mandatory);
    let mut old = Vec::new();
    for i in 0..50 {
        let n = h
            .mknod(ROOT, &format!("p{i}"), libc::S_IFIFO | 0o644, 0)
            .unwrap();
        old.push((n.nodeid, n.attr.ino));
        std::fs::remove_file(h.host(&format!("p{i}"))).unwrap();
    }
    let mut reused = 0;
    for i in 0..50 {
        let d = h.mkdir(ROOT, &format!("d{i}"), 0o755).unwrap();
        if let Some((id, _)) = old.iter().find(|(_, ino)| *ino == d.attr.ino) {
            reused += 1;
            assert_ne!(
                d.nodeid, *id,
                "a new directory answered as the old fifo's inode"
            );
        }
        assert_eq!(d.attr.mode & libc::S_IFMT, libc::S_IFDIR);
        assert!(h.create(d.nodeid, "f", 0o644, libc::O_RDWR).is_ok());
    }
    eprintln!("inode numbers reused: {reused} of 50");
}
