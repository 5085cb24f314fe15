//! Host-side helpers for the fault, escape and DAX-abuse suites: daemons of a chosen kind,
//! fd counts, a small tmpfs, tree snapshots, case counting. Used with
//! `#[path = "common/host.rs"] mod host;` next to `mod common;`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vufs_driver::{Daemon, DaemonKind, DriverConfig, Session};

/// Starts a daemon of `kind` sharing `shared` with `args` (plus `--seccomp=none`; the builder
/// already passes `--sandbox=none` and `--cache=never`).
pub fn spawn(kind: &DaemonKind, shared: &Path, args: &[&str]) -> Daemon {
    spawn_in(kind, shared, "none", args)
}

/// [`spawn`] with `--sandbox=SANDBOX`.
pub fn spawn_in(kind: &DaemonKind, shared: &Path, sandbox: &str, args: &[&str]) -> Daemon {
    let mut b = Daemon::builder(kind)
        .unwrap_or_else(|e| panic!("{e}"))
        .shared_dir(shared)
        .sandbox(sandbox)
        .env("DAXFSD_THREADS", "asked")
        .arg("--seccomp=none");
    for a in args {
        b = b.arg(a);
    }
    b.spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", kind.name()))
}

/// Connects and INITs; panics with the daemon log on failure.
pub fn connect(d: &Daemon, cfg: &DriverConfig) -> Session {
    let s = Session::connect_with(d.socket_path(), cfg)
        .unwrap_or_else(|e| panic!("connecting: {e}\nlog:\n{}", d.log_contents()));
    s.init()
        .unwrap_or_else(|e| panic!("INIT: {e}\nlog:\n{}", d.log_contents()));
    s
}

/// The daxfsd binary, for tests of daxfsd-only features (DAX window, RESET_DEVICE, log lines).
pub fn daxfsd() -> DaemonKind {
    DaemonKind::Daxfsd
}

/// Open descriptors of process `pid`.
pub fn fd_count(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/fd: {e}"))
        .count()
}

/// The descriptor count of `pid` once it equals `want`, or the last count after `timeout`.
/// A daemon thread may hold a descriptor for a moment (DAX's periodic write-back keeps the
/// files it writes to open while it writes): that is not a leak, a count that stays is.
pub fn fd_count_settled(pid: u32, want: usize, timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        let n = fd_count(pid);
        if n == want || Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the descriptors of `pid` point at, for failure messages.
pub fn fd_targets(pid: u32) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| {
                    let t = fs::read_link(e.path()).unwrap_or_default();
                    format!("{}->{}", e.file_name().to_string_lossy(), t.display())
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Waits until `pred(log)` holds or `timeout` passes; returns whether it held.
pub fn wait_log(d: &Daemon, timeout: Duration, pred: impl Fn(&str) -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if pred(&d.log_contents()) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A tmpfs mounted on a fresh directory; unmounted (lazily) on drop.
pub struct Tmpfs {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size: &str) -> io::Result<Tmpfs> {
        let dir = tempfile::Builder::new().prefix("vufs-tmpfs-").tempdir()?;
        let path = dir.path().join("mnt");
        fs::create_dir(&path)?;
        let target = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
        let opts = CString::new(format!("size={size},mode=0755")).map_err(io::Error::other)?;
        // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
        let r = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Tmpfs { path, _dir: dir })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if let Ok(p) = CString::new(self.path.as_os_str().as_bytes()) {
            // SAFETY: `p` is a valid NUL-terminated path.
            unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Everything about one file that a write, a metadata change or a new link would change
/// (not atime).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileState {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
    pub content: u64,
    pub xattrs: BTreeMap<String, Vec<u8>>,
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    })
}

fn xattrs_of(p: &Path) -> BTreeMap<String, Vec<u8>> {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return BTreeMap::new();
    };
    let mut buf = vec![0u8; 65536];
    // SAFETY: `c` is a valid path and `buf` a writable buffer of the length passed.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return BTreeMap::new();
    }
    buf.truncate(n as usize);
    let mut out = BTreeMap::new();
    for name in buf.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let Ok(cn) = CString::new(name) else { continue };
        let mut v = vec![0u8; 65536];
        // SAFETY: valid NUL-terminated path and name; `v` is writable for its length.
        let m = unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        v.truncate(m.max(0) as usize);
        out.insert(String::from_utf8_lossy(name).into_owned(), v);
    }
    out
}

/// One path's state (not following a symlink at the end).
pub fn file_state(p: &Path) -> Option<FileState> {
    let m = fs::symlink_metadata(p).ok()?;
    let content = if m.file_type().is_file() {
        fnv(&fs::read(p).unwrap_or_default())
    } else if m.file_type().is_symlink() {
        fnv(fs::read_link(p).unwrap_or_default().as_os_str().as_bytes())
    } else {
        0
    };
    Some(FileState {
        mode: m.mode(),
        uid: m.uid(),
        gid: m.gid(),
        nlink: m.nlink(),
        ino: m.ino(),
        size: m.size(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
        content,
        xattrs: xattrs_of(p),
    })
}

/// Every path under `root` (root included), by path relative to it, never following symlinks.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, FileState> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Some(st) = file_state(&p) else { continue };
        if st.mode & libc::S_IFMT == libc::S_IFDIR {
            if let Ok(rd) = fs::read_dir(&p) {
                stack.extend(rd.filter_map(|e| e.ok()).map(|e| e.path()));
            }
        }
        let rel = p.strip_prefix(root).unwrap_or(&p).to_path_buf();
        out.insert(rel, st);
    }
    out
}

/// Differences between two snapshots, one line each.
pub fn diff(
    before: &BTreeMap<PathBuf, FileState>,
    after: &BTreeMap<PathBuf, FileState>,
) -> Vec<String> {
    let mut v = Vec::new();
    for (p, b) in before {
        match after.get(p) {
            None => v.push(format!("{} removed", p.display())),
            Some(a) if a != b => v.push(format!("{} changed: {b:?} -> {a:?}", p.display())),
            _ => {}
        }
    }
    for p in after.keys().filter(|p| !before.contains_key(*p)) {
        v.push(format!("{} appeared", p.display()));
    }
    v
}

/// Names directly in `dir` containing `needle`.
pub fn names_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().contains(needle))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Counts and names the cases a test checks; prints the total when dropped (and every case
/// with `VUFS_LIST_CASES=1`).
pub struct Cases {
    suite: &'static str,
    test: &'static str,
    pub names: Vec<String>,
}

impl Cases {
    pub fn new(suite: &'static str, test: &'static str) -> Cases {
        Cases {
            suite,
            test,
            names: Vec::new(),
        }
    }

    /// Records one case.
    pub fn case(&mut self, name: impl Into<String>) {
        self.names.push(name.into());
    }

    pub fn count(&self) -> usize {
        self.names.len()
    }
}

impl Drop for Cases {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            eprintln!(
                "CASES {}::{}: {} cases",
                self.suite,
                self.test,
                self.names.len()
            );
            if std::env::var_os("VUFS_LIST_CASES").is_some() {
                for n in &self.names {
                    eprintln!("CASE {}::{}: {n}", self.suite, self.test);
                }
            }
        }
    }
}

/// The errno of a failed operation; panics with `what` if it succeeded or carried none.
pub fn errno_of<T: std::fmt::Debug>(what: &str, r: io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("{what}: succeeded ({v:?}), expected an error"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("{what}: failed without an errno: {e}")),
    }
}
