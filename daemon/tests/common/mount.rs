//! A `daxfsd --mount` daemon for host-mount tests: started on `<dir>/share` and mounted on
//! `<dir>/mnt`, its log in `<dir>/daemon.log`. Root only (mount(2)).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// Fails the test unless it runs as root (`why`: what needs it).
pub fn require_root(why: &str) {
    // SAFETY: geteuid has no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "run as root ({why})");
}

/// Whether `p` is the root of a FUSE mount.
pub fn is_fuse_mount(p: &Path) -> bool {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is NUL-terminated and `st` a writable statfs.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type == FUSE_SUPER_MAGIC }
}

/// A running `--mount` daemon. Dropping it sends SIGTERM (an orderly unmount), kills it if
/// it is still there 10 s later, and detaches whatever mount is left.
pub struct Mounted {
    pub child: Child,
    pub log: PathBuf,
    pub share: PathBuf,
    pub mnt: PathBuf,
}

impl Mounted {
    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let end = Instant::now() + Duration::from_secs(10);
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let c = std::ffi::CString::new(self.mnt.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is NUL-terminated.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Starts `daxfsd --shared-dir <dir>/share --mount <dir>/mnt ARGS` once `seed` filled the
/// share, and waits (at most 15 s) for the mount.
pub fn mount(dir: &Path, args: &[&str], seed: impl FnOnce(&Path)) -> Mounted {
    let (share, mnt, log) = (dir.join("share"), dir.join("mnt"), dir.join("daemon.log"));
    std::fs::create_dir_all(&share).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    seed(&share);
    let child = Command::new(env!("CARGO_BIN_EXE_daxfsd"))
        .arg("--shared-dir")
        .arg(&share)
        .arg("--mount")
        .arg(&mnt)
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut m = Mounted {
        child,
        log,
        share,
        mnt,
    };
    let end = Instant::now() + Duration::from_secs(15);
    while !is_fuse_mount(&m.mnt) {
        assert!(
            m.child.try_wait().unwrap().is_none() && Instant::now() < end,
            "no mount; log:\n{}",
            m.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    m
}
