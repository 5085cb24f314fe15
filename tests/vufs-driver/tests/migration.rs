//! Live migration at the protocol level: daemon A serves a session, the frontend stops it
//! and saves its device state (SET_DEVICE_STATE_FD + CHECK_DEVICE_STATE), daemon B loads
//! it, and the same node ids and file handles work on B without a new INIT. Corrupt streams
//! are refused by B (CHECK_DEVICE_STATE fails) and the source carries on.
//!
//! Runs against `VUFS_DAEMON` (default virtiofsd: proof that the test checks the protocol);
//! the log-line checks are daxfsd's.

mod common;
#[path = "common/host.rs"]
mod host;

use std::fs;
use std::path::Path;

use vhost::vhost_user::VhostUserProtocolFeatures;
use vufs_driver::migrate::{load_state, save_state};
use vufs_driver::{Daemon, DaemonKind, DriverConfig, Session};

fn cfg() -> DriverConfig {
    let mut c = DriverConfig::default();
    c.protocol_features |= VhostUserProtocolFeatures::DEVICE_STATE;
    c
}

fn is_daxfsd(k: &DaemonKind) -> bool {
    matches!(k, DaemonKind::Daxfsd)
}

/// What the guest held on the source.
struct Held {
    dir: u64,
    file: u64,
    fh: u64,
    dh: u64,
    gone: u64,
    gone_fh: u64,
}

/// Source: INIT, lookups, an open file (written through), an open directory, and a file
/// that is unlinked on the host while open. Stops the device and saves its state.
fn source(d: &Daemon) -> (Session, Held, Vec<u8>) {
    let s = host::connect(d, &cfg());
    let dir = s.lookup(1, "d").unwrap().nodeid;
    let file = s.lookup(dir, "f").unwrap().nodeid;
    s.lookup(dir, "f").unwrap();
    let fh = s.open(file, libc::O_RDWR as u32).unwrap().fh;
    assert_eq!(s.write(file, fh, 5, b" world").unwrap(), 6);
    let dh = s.opendir(dir, 0).unwrap().fh;
    let gone = s.lookup(1, "gone").unwrap().nodeid;
    let gone_fh = s.open(gone, libc::O_RDONLY as u32).unwrap().fh;
    fs::remove_file(d.shared_dir().join("gone")).unwrap();
    s.device().stop(false).unwrap();
    let state =
        save_state(s.device()).unwrap_or_else(|e| panic!("save: {e}\nlog:\n{}", d.log_contents()));
    assert!(!state.is_empty());
    (
        s,
        Held {
            dir,
            file,
            fh,
            dh,
            gone,
            gone_fh,
        },
        state,
    )
}

fn prepare(p: &Path) {
    fs::create_dir(p.join("d")).unwrap();
    fs::write(p.join("d/f"), b"hello").unwrap();
    fs::write(p.join("gone"), b"unlinked but open").unwrap();
}

/// A destination device: connected and stopped, as QEMU's is while the state loads.
fn destination(kind: &DaemonKind, shared: &Path, args: &[&str]) -> (Daemon, Session) {
    let d = host::spawn(kind, shared, args);
    let s = Session::connect_with(d.socket_path(), &cfg())
        .unwrap_or_else(|e| panic!("connecting: {e}\nlog:\n{}", d.log_contents()));
    s.device().stop(false).unwrap();
    (d, s)
}

/// The guest's view on the destination: the same ids and handles work, no INIT.
fn check_served(s: &Session, h: &Held, shared: &Path) {
    assert_eq!(s.read(h.file, h.fh, 0, 64).unwrap(), b"hello world");
    assert_eq!(s.write(h.file, h.fh, 11, b"!").unwrap(), 1);
    assert_eq!(fs::read(shared.join("d/f")).unwrap(), b"hello world!");
    assert_eq!(s.getattr(h.file, Some(h.fh)).unwrap().attr.size, 12);
    let names: Vec<String> = s
        .readdir(h.dir, h.dh, 0, 4096)
        .unwrap()
        .iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    assert!(names.iter().any(|n| n == "f"), "{names:?}");
    let c = s
        .create(h.dir, "new", libc::O_RDWR as u32, 0o100644, 0)
        .unwrap();
    assert!(c.0.nodeid != h.file && c.0.nodeid != h.dir);
    s.write(c.0.nodeid, c.1.fh, 0, b"made after").unwrap();
    assert_eq!(fs::read(shared.join("d/new")).unwrap(), b"made after");
    s.release(h.file, h.fh, 0).unwrap();
    s.releasedir(h.dir, h.dh, 0).unwrap();
    s.forget(h.file, 2).unwrap();
}

fn migrate(mode: &str) {
    let kind = common::kind();
    let root = tempfile::tempdir().unwrap();
    prepare(root.path());
    let mode_arg = format!("--migration-mode={mode}");
    let a = host::spawn(&kind, root.path(), &[&mode_arg]);
    let (src, h, state) = source(&a);

    // Opening file handles needs CAP_DAC_READ_SEARCH, which neither daemon keeps by default.
    // The destination runs in the same --migration-mode: daxfsd takes file-handle entries
    // (pointers anywhere into the file system) only when told to expect them.
    if is_daxfsd(&kind) && mode == "file-handles" {
        let (c, other) = destination(&kind, root.path(), &["--modcaps=+dac_read_search"]);
        let r = load_state(other.device(), &state);
        assert!(r.is_err(), "a find-paths destination took file handles");
        assert!(
            c.log_contents().contains("find-paths mode"),
            "{}",
            c.log_contents()
        );
    }
    let (b, dst) = destination(
        &kind,
        root.path(),
        &[
            "--migration-on-error=guest-error",
            "--modcaps=+dac_read_search",
            &mode_arg,
        ],
    );
    load_state(dst.device(), &state)
        .unwrap_or_else(|e| panic!("load: {e}\nlog:\n{}", b.log_contents()));
    dst.device().restart().unwrap();
    let dst = Session::new(dst.device().clone());
    check_served(&dst, &h, root.path());
    if mode == "file-handles" {
        // A file handle still names the unlinked file.
        assert_eq!(
            dst.read(h.gone, h.gone_fh, 0, 64).unwrap(),
            b"unlinked but open"
        );
    } else {
        // No path names it: with guest-error, only that inode fails.
        assert!(dst.read(h.gone, h.gone_fh, 0, 64).is_err());
        assert!(dst.getattr(h.gone, None).is_err());
        if is_daxfsd(&kind) {
            assert!(
                b.log_contents().contains("not restored"),
                "{}",
                b.log_contents()
            );
        }
    }
    drop(src);
}

#[test]
fn migrate_find_paths() {
    migrate("find-paths");
}

#[test]
fn migrate_file_handles() {
    migrate("file-handles");
}

/// Corrupt or truncated state, and a lost inode under `abort`: the destination refuses
/// (CHECK_DEVICE_STATE fails, no panic, the daemon keeps serving), and the stopped source
/// carries on when restarted (what QEMU does when a migration fails).
#[test]
fn bad_state_is_refused_and_source_continues() {
    let kind = common::kind();
    let root = tempfile::tempdir().unwrap();
    prepare(root.path());
    let a = host::spawn(&kind, root.path(), &[]);
    let (src, h, state) = source(&a);

    let mut flipped = state.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x10;
    let mut huge = state.clone();
    huge.resize(state.len() + (80 << 20), 0xa5);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("bit flip", flipped),
        ("truncated", state[..state.len() - 3].to_vec()),
        ("empty", Vec::new()),
        ("garbage", vec![0x5a; 4096]),
        ("oversized", huge),
    ];
    for (what, bytes) in cases {
        let (b, dst) = destination(&kind, root.path(), &[]);
        let r = load_state(dst.device(), &bytes);
        assert!(r.is_err(), "{what}: accepted\nlog:\n{}", b.log_contents());
        if is_daxfsd(&kind) {
            let log = b.log_contents();
            assert!(
                log.contains("loading the device state failed"),
                "{what}: {log}"
            );
            assert!(!log.contains("panicked"), "{what}: {log}");
        }
        // The refused destination is still a working (fresh) device.
        dst.device().restart().unwrap();
        let fresh = Session::new(dst.device().clone());
        fresh.init().unwrap();
        fresh.lookup(1, "d").unwrap();
    }

    if is_daxfsd(&kind) {
        // A transfer while the vrings run is refused (the tables could change under it).
        let (b, live) = destination(&kind, root.path(), &[]);
        live.device().restart().unwrap();
        let live = Session::new(live.device().clone());
        live.init().unwrap();
        live.lookup(1, "d").unwrap();
        assert!(save_state(live.device()).is_err(), "{}", b.log_contents());
        live.lookup(1, "d").unwrap();
    }

    // The unlinked open file cannot be found by path: `abort` refuses the whole state.
    let (b, dst) = destination(&kind, root.path(), &["--migration-on-error=abort"]);
    assert!(load_state(dst.device(), &state).is_err());
    if is_daxfsd(&kind) {
        assert!(
            b.log_contents().contains(&format!("inode {}", h.gone)),
            "{}",
            b.log_contents()
        );
    }

    // The migration failed: the source is restarted and its session goes on.
    src.device().restart().unwrap();
    let src = Session::new(src.device().clone());
    assert_eq!(src.read(h.file, h.fh, 0, 64).unwrap(), b"hello world");
    assert_eq!(
        src.read(h.gone, h.gone_fh, 0, 64).unwrap(),
        b"unlinked but open"
    );
    src.lookup(h.dir, "f").unwrap();
}

/// Dirty-page logging, which QEMU needs before it migrates at all (LOG_SHMFD): once the
/// frontend sets a log, every guest page the backend writes (replies, used ring) is marked.
#[test]
fn replies_are_logged_dirty() {
    use vufs_driver::migrate::DirtyLog;
    let kind = common::kind();
    let root = tempfile::tempdir().unwrap();
    fs::write(root.path().join("big"), vec![0x5a; 1 << 20]).unwrap();
    let d = host::spawn(&kind, root.path(), &[]);
    let mut c = cfg();
    c.protocol_features |= VhostUserProtocolFeatures::LOG_SHMFD;
    let s = host::connect(&d, &c);
    let f = s.lookup(1, "big").unwrap().nodeid;
    let fh = s.open(f, libc::O_RDONLY as u32).unwrap().fh;
    let end = c.mem_base + c.mem_size;
    let log = DirtyLog::start(s.device(), end)
        .unwrap_or_else(|e| panic!("SET_LOG_BASE: {e}\nlog:\n{}", d.log_contents()));
    // The last completion's ring updates may still land (a worker re-enables notifications
    // after the reply): let them, then start from a clean log as QEMU's sync does.
    std::thread::sleep(std::time::Duration::from_millis(200));
    log.clear().unwrap();
    assert_eq!(s.read(f, fh, 0, 64 << 10).unwrap().len(), 64 << 10);
    let pages = log.dirty_pages().unwrap();
    let guest = c.mem_base / 4096..end / 4096;
    assert!(
        pages.iter().all(|p| guest.contains(p)),
        "dirty pages outside guest memory: {pages:?}"
    );
    // 64 KiB of reply data spans at least 16 pages (plus the out-header and used ring).
    assert!(pages.len() >= 16, "{} dirty pages: {pages:?}", pages.len());
    log.clear().unwrap();
    s.getattr(f, None).unwrap();
    let small = log.dirty_pages().unwrap();
    assert!(
        !small.is_empty() && small.len() <= 4,
        "a GETATTR dirtied {} pages: {small:?}",
        small.len()
    );
}

/// A hostile source names host files outside the destination's shared directory by file
/// handle: a directory, a file, and a file unlinked while open (the source holds it), all
/// next to the share. The destination must refuse every one of them in every sandbox mode.
/// In a chroot or a namespace sandbox the share is the daemon's root, and `/proc/self/fd`
/// shows a file outside it by its path from the file system's root: the share holds
/// directories of those names (every suffix of the outside directory's host path), so an
/// unlinked file's former directory "exists inside the share" by name.
/// Opening handles needs CAP_DAC_READ_SEARCH: the test runs as root.
#[test]
fn handles_outside_the_share_are_refused_in_every_sandbox() {
    let kind = common::kind();
    if !is_daxfsd(&kind) {
        eprintln!(
            "{}: no check of file handles against the share (its file-handles mode trusts \
             the source); skipped",
            kind.name()
        );
        return;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root");
    for sandbox in ["none", "namespace", "chroot"] {
        let tmp = tempfile::tempdir().unwrap();
        let share = tmp.path().join("share");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(share.join("in")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("secret"), b"secret").unwrap();
        fs::write(outside.join("gone"), b"outside, unlinked").unwrap();
        let comps: Vec<_> = outside.components().skip(1).collect();
        for i in 0..comps.len() {
            let mirror: std::path::PathBuf = comps[i..].iter().collect();
            fs::create_dir_all(share.join(mirror)).unwrap();
        }
        // The source shares the directory above both.
        let a = host::spawn(
            &kind,
            tmp.path(),
            &[
                "--migration-mode=file-handles",
                "--modcaps=+dac_read_search",
            ],
        );
        let src = host::connect(&a, &cfg());
        let dir = src.lookup(1, "outside").unwrap().nodeid;
        let secret = src.lookup(dir, "secret").unwrap().nodeid;
        let secret_fh = src.open(secret, libc::O_RDONLY as u32).unwrap().fh;
        let gone = src.lookup(dir, "gone").unwrap().nodeid;
        let gone_fh = src.open(gone, libc::O_RDONLY as u32).unwrap().fh;
        fs::remove_file(outside.join("gone")).unwrap();
        src.device().stop(false).unwrap();
        let state = save_state(src.device())
            .unwrap_or_else(|e| panic!("save: {e}\nlog:\n{}", a.log_contents()));

        let args = [
            "--migration-mode=file-handles",
            "--modcaps=+dac_read_search",
            "--migration-on-error=guest-error",
        ];
        let b = host::spawn_in(&kind, &share, sandbox, &args);
        let dst = Session::connect_with(b.socket_path(), &cfg())
            .unwrap_or_else(|e| panic!("{sandbox}: connecting: {e}\nlog:\n{}", b.log_contents()));
        dst.device().stop(false).unwrap();
        load_state(dst.device(), &state)
            .unwrap_or_else(|e| panic!("{sandbox}: load: {e}\nlog:\n{}", b.log_contents()));
        dst.device().restart().unwrap();
        let dst = Session::new(dst.device().clone());
        let leaked = [
            ("directory", dst.getattr(dir, None).is_ok()),
            ("file", dst.read(secret, secret_fh, 0, 64).is_ok()),
            ("unlinked file", dst.read(gone, gone_fh, 0, 64).is_ok()),
        ];
        eprintln!("sandbox {sandbox}: served from outside the share: {leaked:?}");
        for (what, served) in leaked {
            assert!(
                !served,
                "sandbox {sandbox}: the {what} outside the share was restored\nlog:\n{}",
                b.log_contents()
            );
        }
        assert!(
            b.log_contents().contains("outside the shared directory"),
            "{sandbox}: {}",
            b.log_contents()
        );
        // The share itself is still served.
        dst.lookup(1, "in").unwrap();
        drop(src);
    }
}
