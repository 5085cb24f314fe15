//! Shared harness: a daemon (`VUFS_DAEMON`: `virtiofsd` (default), `daxfsd` or a path; extra
//! arguments in `VUFS_DAEMON_ARGS`) sharing a fresh tempdir, and an INITed session on it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use tempfile::TempDir;
use vufs_driver::{Daemon, DaemonKind, DriverConfig, Session};

pub struct Rig {
    /// Field order matters: the session (socket) goes first, then the daemon, then the dir.
    pub s: Session,
    pub daemon: Daemon,
    pub root: TempDir,
}

impl Rig {
    pub fn host(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    pub fn shared(&self) -> &Path {
        self.root.path()
    }
}

pub fn kind() -> DaemonKind {
    DaemonKind::from_env()
}

/// Starts the daemon with `args` on a fresh shared dir prepared by `prep`, connects and INITs.
pub fn start_with(args: &[&str], cfg: &DriverConfig, prep: impl FnOnce(&Path)) -> Rig {
    start_in(None, args, cfg, prep)
}

/// [`start_with`] with the shared dir made inside `dir` (the system's temporary directory
/// when `None`): to test a share on a given file system (e.g. tmpfs in `/dev/shm`).
pub fn start_in(
    dir: Option<&Path>,
    args: &[&str],
    cfg: &DriverConfig,
    prep: impl FnOnce(&Path),
) -> Rig {
    let mut b = tempfile::Builder::new();
    b.prefix("vufs-shared-");
    let root = match dir {
        Some(d) => b.tempdir_in(d),
        None => b.tempdir(),
    }
    .expect("tempdir");
    prep(root.path());
    let kind = kind();
    let mut b = Daemon::builder(&kind).unwrap_or_else(|e| panic!("{e}"));
    // The queue threads and the pool as asked, whatever the CPUs: the tests of both run
    // on 2-core hosts too (`threads_are_cut_to_the_cpus` checks the cut).
    b = b.shared_dir(root.path()).env("DAXFSD_THREADS", "asked");
    for a in args {
        b = b.arg(a);
    }
    // Extra daemon arguments for every test, e.g. to size daxfsd's DAX window.
    for a in std::env::var("VUFS_DAEMON_ARGS")
        .unwrap_or_default()
        .split_whitespace()
    {
        b = b.arg(a);
    }
    let daemon = b
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", kind.name()));
    let s = Session::connect_with(daemon.socket_path(), cfg).unwrap_or_else(|e| {
        panic!(
            "connecting to {}: {e}\nlog:\n{}",
            kind.name(),
            daemon.log_contents()
        )
    });
    s.init()
        .unwrap_or_else(|e| panic!("INIT: {e}\nlog:\n{}", daemon.log_contents()));
    Rig { s, daemon, root }
}

pub fn start(args: &[&str]) -> Rig {
    start_with(args, &DriverConfig::default(), |_| {})
}

pub fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error()
        .unwrap_or_else(|| panic!("expected an errno, got {e}"))
}

impl Rig {
    /// No protocol violations seen, and the daemon is still running.
    pub fn assert_clean(&mut self) {
        let v = self.s.device().violations();
        assert!(
            v.is_empty(),
            "protocol violations: {v:?}\nlog:\n{}",
            self.daemon.log_contents()
        );
        let st = self.daemon.try_wait().expect("try_wait");
        assert!(
            st.is_none(),
            "daemon exited: {st:?}\nlog:\n{}",
            self.daemon.log_contents()
        );
    }
}

/// Whether the daemon under test is daxfsd (the DAX tests' precondition: the peer has no DAX
/// window); says so on stderr when not.
pub fn only_daxfsd(test: &str) -> bool {
    if kind() != DaemonKind::Daxfsd {
        eprintln!(
            "{test}: {} has no DAX window; this test is for daxfsd",
            kind().name()
        );
        return false;
    }
    true
}

/// `len` bytes of a pattern that differs per `seed` and per offset.
pub fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}
