//! The files a daemon started with `--socket-path S` owns on the host: the pid file `S.pid`
//! and the socket `S`.
//!
//! As virtiofsd does, the pid file is created and locked (`flock`, exclusive) *before* the
//! socket is listened on, and stays locked for the daemon's life: a second daemon on the
//! same path finds it locked and fails with one line, instead of deleting a live daemon's
//! socket. A pid file nobody holds (its daemon is gone, even by SIGKILL) is taken over, and
//! only then is a stale socket at `S` replaced. At a clean exit both are removed, socket
//! first, while the lock is still held.
//!
//! Both names are reached through a descriptor of their directory opened at start-up, and
//! removed only if they are still the very files this daemon made (same device and inode),
//! so a sandboxed daemon (chroot) can remove them, and nothing a later process put there is
//! ever touched. In the namespace sandbox the serving child closes these descriptors and the
//! supervising parent, which still sees the host, removes the files.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

/// The pid file and socket of one daemon.
#[derive(Debug)]
pub struct RunFiles {
    socket: PathBuf,
    dir: OwnedFd,
    sock_name: CString,
    /// (st_dev, st_ino) of the socket this daemon bound, once it did.
    sock_id: Option<FileId>,
    pid_name: CString,
    /// The locked pid file (the lock lives as long as this descriptor).
    pid_file: File,
    /// Remove the files on drop.
    armed: bool,
}

fn stat_at(dir: &OwnedFd, name: &CString) -> io::Result<libc::stat> {
    // SAFETY: zeroed stat is a valid output buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is an open descriptor, `name` NUL-terminated, `st` writable.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(st)
    }
}

/// What identifies a file: device and inode, and the inode's change time (an inode number
/// is reused as soon as it is freed).
type FileId = (u64, u64, i64, i64);

fn id_of(st: &libc::stat) -> FileId {
    (st.st_dev, st.st_ino, st.st_ctime, st.st_ctime_nsec)
}

fn cname(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

impl RunFiles {
    /// Creates and locks `SOCKET.pid` and writes this process's pid into it.
    pub fn lock(socket: &Path) -> io::Result<Self> {
        let file_name = socket.file_name().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("--socket-path {}: not a file name", socket.display()),
            )
        })?;
        let parent = match socket.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let cdir = cname(parent)?;
        // SAFETY: `cdir` is NUL-terminated; the result is checked.
        let dfd = unsafe {
            libc::open(
                cdir.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if dfd < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "--socket-path {}: directory {}: {e} (create it first)",
                    socket.display(),
                    parent.display()
                ),
            ));
        }
        // SAFETY: open succeeded: a fresh descriptor nobody else owns.
        let dir = unsafe { OwnedFd::from_raw_fd(dfd) };
        let sock_name = CString::new(file_name.as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
        let mut pid_os: OsString = file_name.to_os_string();
        pid_os.push(".pid");
        let pid_name = CString::new(pid_os.into_vec())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
        let pid_path = PathBuf::from(format!("{}.pid", socket.display()));
        let ctx = |e: io::Error| {
            io::Error::new(e.kind(), format!("pid file {}: {e}", pid_path.display()))
        };
        // A daemon that is exiting removes its pid file while we wait for it: retry until
        // the file we locked is the one that has the name.
        for _ in 0..100 {
            // SAFETY: `dir` is open, `pid_name` NUL-terminated; the result is checked.
            let fd = unsafe {
                libc::openat(
                    dir.as_raw_fd(),
                    pid_name.as_ptr(),
                    libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                    0o644,
                )
            };
            if fd < 0 {
                return Err(ctx(io::Error::last_os_error()));
            }
            // SAFETY: openat succeeded: a fresh descriptor nobody else owns.
            let mut file = unsafe { File::from_raw_fd(fd) };
            // SAFETY: flock on an open descriptor.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                    return Err(ctx(e));
                }
                let mut s = String::new();
                let _ = file.read_to_string(&mut s);
                let who = match s.trim() {
                    "" => "another daemon".to_string(),
                    pid => format!("another daemon (pid {pid})"),
                };
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{who} is serving {} (its pid file {} is locked): stop it or choose another --socket-path",
                        socket.display(),
                        pid_path.display()
                    ),
                ));
            }
            let locked = id_of(&fstat(&file).map_err(ctx)?);
            match stat_at(&dir, &pid_name) {
                Ok(st) if id_of(&st) == locked => {}
                _ => continue,
            }
            file.set_len(0).map_err(ctx)?;
            file.write_all_at(format!("{}\n", std::process::id()).as_bytes(), 0)
                .map_err(ctx)?;
            return Ok(RunFiles {
                socket: socket.to_path_buf(),
                dir,
                sock_name,
                sock_id: None,
                pid_name,
                pid_file: file,
                armed: true,
            });
        }
        Err(ctx(io::Error::other(
            "replaced by another process again and again; is a daemon restarting in a loop?",
        )))
    }

    /// The pid file's path.
    pub fn pid_path(&self) -> PathBuf {
        PathBuf::from(format!("{}.pid", self.socket.display()))
    }

    /// Listens on the socket path. A socket file left there by a daemon that is gone is
    /// replaced (we hold the pid file lock, so no live daemon of ours uses it); anything
    /// that is not a socket is left alone and refused. `setup` runs on the new socket's
    /// path before its identity is recorded (ownership, permissions).
    pub fn listen(
        &mut self,
        setup: impl FnOnce(&Path) -> io::Result<()>,
    ) -> io::Result<UnixListener> {
        match stat_at(&self.dir, &self.sock_name) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFSOCK => {
                // SAFETY: `dir` open, name NUL-terminated.
                unsafe { libc::unlinkat(self.dir.as_raw_fd(), self.sock_name.as_ptr(), 0) };
            }
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "--socket-path {}: exists and is not a socket (not replacing it; remove it or choose another path)",
                        self.socket.display()
                    ),
                ))
            }
            Err(_) => {}
        }
        let l = UnixListener::bind(&self.socket).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot listen on {}: {e}", self.socket.display()),
            )
        })?;
        setup(&self.socket)?;
        self.sock_id = stat_at(&self.dir, &self.sock_name)
            .ok()
            .map(|st| id_of(&st));
        Ok(l)
    }

    /// Closes the descriptors without removing anything (the namespace sandbox's serving
    /// child: its supervisor removes the files).
    pub fn close_without_removing(mut self) {
        self.armed = false;
    }

    /// Removes the socket and the pid file, if they are still this daemon's.
    pub fn remove(&mut self) {
        if !self.armed {
            return;
        }
        self.armed = false;
        if let Some(id) = self.sock_id {
            self.unlink_if(&self.sock_name, id);
        }
        if let Ok(st) = fstat(&self.pid_file) {
            self.unlink_if(&self.pid_name, id_of(&st));
        }
    }

    fn unlink_if(&self, name: &CString, id: FileId) {
        match stat_at(&self.dir, name) {
            Ok(st) if id_of(&st) == id => {
                // SAFETY: `dir` open, name NUL-terminated.
                unsafe { libc::unlinkat(self.dir.as_raw_fd(), name.as_ptr(), 0) };
            }
            _ => {}
        }
    }
}

fn fstat(f: &File) -> io::Result<libc::stat> {
    // SAFETY: zeroed stat is a valid output buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `f` is open, `st` writable.
    if unsafe { libc::fstat(f.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

impl Drop for RunFiles {
    fn drop(&mut self) {
        self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_daemon_on_the_same_path_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let sock = d.path().join("s");
        let mut a = RunFiles::lock(&sock).unwrap();
        let _l = a.listen(|_| Ok(())).unwrap();
        let pid = std::fs::read_to_string(d.path().join("s.pid")).unwrap();
        assert_eq!(pid, format!("{}\n", std::process::id()));
        let e = RunFiles::lock(&sock).unwrap_err().to_string();
        assert!(e.contains("is locked") && e.contains(pid.trim()), "{e}");
        assert!(sock.exists(), "the live daemon's socket was touched");
        drop(a);
        assert!(!sock.exists() && !d.path().join("s.pid").exists());
    }

    #[test]
    fn stale_files_are_taken_over_and_user_files_kept() {
        let d = tempfile::tempdir().unwrap();
        let sock = d.path().join("s");
        std::fs::write(d.path().join("s.pid"), "999999\n").unwrap();
        drop(UnixListener::bind(&sock).unwrap());
        let mut a = RunFiles::lock(&sock).unwrap();
        let _l = a.listen(|_| Ok(())).unwrap();
        drop(a);
        assert!(!sock.exists());
        let file = d.path().join("f");
        std::fs::write(&file, b"user data").unwrap();
        let mut b = RunFiles::lock(&file).unwrap();
        let e = b.listen(|_| Ok(())).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        drop(b);
        assert_eq!(std::fs::read(&file).unwrap(), b"user data");
    }

    #[test]
    fn a_file_replaced_after_start_is_not_removed() {
        let d = tempfile::tempdir().unwrap();
        let sock = d.path().join("s");
        let mut a = RunFiles::lock(&sock).unwrap();
        drop(a.listen(|_| Ok(())).unwrap());
        std::fs::remove_file(&sock).unwrap();
        // (Change times tick in jiffies: make sure the replacement's differs.)
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(UnixListener::bind(&sock).unwrap());
        drop(a);
        assert!(sock.exists(), "someone else's socket was removed");
    }
}
