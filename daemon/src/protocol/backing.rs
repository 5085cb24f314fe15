//! FUSE passthrough (Linux 6.9+): the kernel reads and writes a registered host file itself.
//!
//! The seam, like the DAX [`Mapper`](crate::protocol::mapper::Mapper): a transport that can
//! register backing files implements [`Backing`] (/dev/fuse: `FUSE_DEV_IOC_BACKING_OPEN` /
//! `FUSE_DEV_IOC_BACKING_CLOSE`); vhost-user has none. [`Passthrough`] holds the policy and
//! the bookkeeping the kernel's rules need (fs/fuse/iomode.c, 6.18):
//! - an inode open for passthrough must be opened for passthrough again, with the *same*
//!   backing object (else the open fails: EINVAL, EBUSY), so one backing id serves every
//!   open of an inode and is closed when its last handle is released;
//! - an inode open without passthrough (cached I/O) cannot start passthrough (ETXTBSY), so
//!   a file already open the ordinary way stays ordinary until all its handles are closed.
//!
//! The kernel registers the file with the daemon's credentials at registration time and
//! opens its own backing file per FUSE file with the open's flags; the permission checks
//! are those of the OPEN the server already answered.

use std::collections::HashMap;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Registers host files with the kernel for passthrough.
pub trait Backing: Send + Sync {
    /// Registers `fd` (a regular file); returns its backing id.
    fn open(&self, fd: BorrowedFd) -> io::Result<i32>;
    /// Drops the registration `id`.
    fn close(&self, id: i32) -> io::Result<()>;
}

/// Which regular files use passthrough.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// None.
    #[default]
    Off,
    /// Every regular file.
    All,
    /// Regular files of at least this many bytes when first opened.
    MinSize(u64),
}

#[derive(Default)]
struct InodeState {
    /// The backing id while passthrough handles are open.
    id: Option<i32>,
    passthrough: u32,
    plain: u32,
}

#[derive(Default)]
struct State {
    /// Open file handles: inode and whether they use passthrough.
    handles: HashMap<u64, (u64, bool)>,
    inodes: HashMap<u64, InodeState>,
}

/// Counters for the SIGUSR1 and exit reports.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Backing ids registered.
    pub opened: u64,
    /// Registrations the kernel refused (the file was served through READ/WRITE).
    pub refused: u64,
    /// Backing ids closed.
    pub closed: u64,
    /// Backing ids open now.
    pub live: u64,
    /// Opens answered with FOPEN_PASSTHROUGH.
    pub passthrough_opens: u64,
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "passthrough: {} backing files opened, {} refused, {} closed, {} live; {} opens passed through",
            self.opened, self.refused, self.closed, self.live, self.passthrough_opens
        )
    }
}

/// Policy and bookkeeping of FUSE passthrough for one server.
pub struct Passthrough {
    backing: Box<dyn Backing>,
    policy: Policy,
    state: Mutex<State>,
    opened: AtomicU64,
    refused: AtomicU64,
    closed: AtomicU64,
    pt_opens: AtomicU64,
    refusal_logged: AtomicBool,
}

impl Passthrough {
    pub fn new(backing: Box<dyn Backing>, policy: Policy) -> Self {
        Passthrough {
            backing,
            policy,
            state: Mutex::default(),
            opened: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            pt_opens: AtomicU64::new(0),
            refusal_logged: AtomicBool::new(false),
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new handle `fh` of `inode`. `fd` is its host descriptor when the filesystem can
    /// expose one. Returns the backing id to answer with FOPEN_PASSTHROUGH, or None for
    /// ordinary READ/WRITE.
    pub fn opened(&self, inode: u64, fh: u64, fd: Option<BorrowedFd>) -> Option<i32> {
        let mut st = self.lock();
        let ino = st.inodes.entry(inode).or_default();
        let id = match (ino.id, fd) {
            // Already passed through: every open must share the backing object.
            (Some(id), _) => Some(id),
            (None, Some(fd)) if ino.plain == 0 && self.wants(fd) => match self.backing.open(fd) {
                Ok(id) => {
                    self.opened.fetch_add(1, Ordering::Relaxed);
                    ino.id = Some(id);
                    Some(id)
                }
                Err(e) => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    if !self.refusal_logged.swap(true, Ordering::Relaxed) {
                        log::warn!(
                            "FUSE passthrough refused for inode {inode}: {e}; such files use READ/WRITE (logged once, counted)"
                        );
                    }
                    None
                }
            },
            _ => None,
        };
        if id.is_some() {
            ino.passthrough += 1;
            self.pt_opens.fetch_add(1, Ordering::Relaxed);
        } else {
            ino.plain += 1;
        }
        st.handles.insert(fh, (inode, id.is_some()));
        id
    }

    fn wants(&self, fd: BorrowedFd) -> bool {
        let min = match self.policy {
            Policy::Off => return false,
            Policy::All => 0,
            Policy::MinSize(n) => n,
        };
        match crate::sys::fstat(fd) {
            Ok(st) => st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_size as u64 >= min,
            Err(_) => false,
        }
    }

    /// Handle `fh` was released (or its open never reached the client).
    pub fn released(&self, fh: u64) {
        let mut st = self.lock();
        let Some((inode, pt)) = st.handles.remove(&fh) else {
            return;
        };
        let Some(ino) = st.inodes.get_mut(&inode) else {
            return;
        };
        if pt {
            ino.passthrough = ino.passthrough.saturating_sub(1);
            if ino.passthrough == 0 {
                if let Some(id) = ino.id.take() {
                    self.close(id);
                }
            }
        } else {
            ino.plain = ino.plain.saturating_sub(1);
        }
        if ino.passthrough == 0 && ino.plain == 0 {
            st.inodes.remove(&inode);
        }
    }

    fn close(&self, id: i32) {
        if let Err(e) = self.backing.close(id) {
            log::debug!("closing backing id {id}: {e}");
        }
        self.closed.fetch_add(1, Ordering::Relaxed);
    }

    /// Session end: closes every backing id still open.
    pub fn close_all(&self) {
        let mut st = self.lock();
        st.handles.clear();
        for (_, ino) in st.inodes.drain() {
            if let Some(id) = ino.id {
                self.close(id);
            }
        }
    }

    pub fn stats(&self) -> Stats {
        let opened = self.opened.load(Ordering::Relaxed);
        let closed = self.closed.load(Ordering::Relaxed);
        Stats {
            opened,
            refused: self.refused.load(Ordering::Relaxed),
            closed,
            live: opened.saturating_sub(closed),
            passthrough_opens: self.pt_opens.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::sync::Arc;

    /// Records registrations (the real one is the /dev/fuse ioctl, tested on a mount).
    #[derive(Default)]
    struct Ids {
        next: AtomicU64,
        open: Mutex<Vec<i32>>,
        refuse: AtomicBool,
    }

    impl Backing for Arc<Ids> {
        fn open(&self, _fd: BorrowedFd) -> io::Result<i32> {
            if self.refuse.load(Ordering::Relaxed) {
                return Err(io::Error::from_raw_os_error(libc::ELOOP));
            }
            let id = self.next.fetch_add(1, Ordering::Relaxed) as i32 + 1;
            self.open.lock().unwrap().push(id);
            Ok(id)
        }
        fn close(&self, id: i32) -> io::Result<()> {
            self.open.lock().unwrap().retain(|&i| i != id);
            Ok(())
        }
    }

    fn file(len: usize) -> std::fs::File {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &vec![1u8; len]).unwrap();
        f
    }

    #[test]
    fn one_backing_id_per_inode_closed_with_the_last_handle() {
        let ids = Arc::new(Ids::default());
        let p = Passthrough::new(Box::new(ids.clone()), Policy::All);
        let f = file(10);
        let a = p.opened(7, 100, Some(f.as_fd()));
        let b = p.opened(7, 101, Some(f.as_fd()));
        assert_eq!(a, Some(1));
        assert_eq!(b, a, "a second open shares the backing id");
        p.released(100);
        assert_eq!(*ids.open.lock().unwrap(), vec![1]);
        p.released(101);
        assert!(ids.open.lock().unwrap().is_empty());
        let s = p.stats();
        assert_eq!(
            (s.opened, s.closed, s.live, s.passthrough_opens),
            (1, 1, 0, 2)
        );
    }

    #[test]
    fn plain_handles_keep_an_inode_ordinary_and_policy_sizes() {
        let ids = Arc::new(Ids::default());
        let p = Passthrough::new(Box::new(ids.clone()), Policy::MinSize(100));
        let small = file(10);
        let big = file(200);
        assert_eq!(p.opened(1, 10, Some(small.as_fd())), None);
        assert_eq!(p.opened(2, 20, None), None, "no descriptor: ordinary");
        // Inode 1 is open the ordinary way: it stays so even once big enough.
        assert_eq!(p.opened(1, 11, Some(big.as_fd())), None);
        assert_eq!(p.opened(3, 30, Some(big.as_fd())), Some(1));
        p.released(10);
        p.released(11);
        assert_eq!(p.opened(1, 12, Some(big.as_fd())), Some(2));
        ids.refuse.store(true, Ordering::Relaxed);
        assert_eq!(p.opened(4, 40, Some(big.as_fd())), None);
        assert_eq!(p.stats().refused, 1);
        p.close_all();
        assert!(ids.open.lock().unwrap().is_empty());
        assert_eq!(p.stats().live, 0);
    }
}
