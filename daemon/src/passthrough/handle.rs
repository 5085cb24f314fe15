//! Open file and directory handles: guest handle numbers to host descriptors.
//!
//! A handle is a `u64` from our own counter. It remembers the inode it was opened on, and
//! every use checks that the guest names the same inode, so a handle cannot be used to reach
//! another file. Regular files hold a descriptor reopened from the inode with the guest's
//! access mode; directories hold a directory descriptor plus a lock that serialises the
//! `lseek` + `getdents64` pair of a READDIR.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::protocol::filesystem::{Handle, Inode};

/// What a handle refers to.
#[derive(Debug)]
pub(super) enum HandleKind {
    File { readable: bool, writable: bool },
    Dir { lock: Mutex<()> },
}

#[derive(Debug)]
pub(super) struct HandleData {
    pub inode: Inode,
    pub fd: OwnedFd,
    pub kind: HandleKind,
    /// POSIX lock owners of this handle (the guest's `lock_owner`, one per process sharing
    /// the open file): each gets its own host open file description, on which its locks are
    /// host OFD locks, so owners conflict with each other exactly as processes do, and one
    /// owner's unlock or FLUSH never touches another's locks.
    owners: Mutex<HashMap<u64, LockOwner>>,
}

/// One POSIX lock owner's host descriptor, and the guest pid and sequence number of its
/// last lock (host OFD locks carry no pid: GETLK reports this one).
#[derive(Debug, Clone)]
pub(super) struct LockOwner {
    pub fd: Arc<OwnedFd>,
    pid: u32,
    seq: u64,
}

/// Orders POSIX lock acquisitions across handles.
static LOCK_SEQ: AtomicU64 = AtomicU64::new(1);

impl AsFd for HandleData {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl HandleData {
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn file(inode: Inode, fd: OwnedFd, access: libc::c_int) -> Self {
        let acc = access & libc::O_ACCMODE;
        HandleData {
            inode,
            fd,
            kind: HandleKind::File {
                readable: acc == libc::O_RDONLY || acc == libc::O_RDWR,
                writable: acc == libc::O_WRONLY || acc == libc::O_RDWR,
            },
            owners: Mutex::new(HashMap::new()),
        }
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<u64, LockOwner>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lock owner `owner`'s descriptor, made with `open` on first use.
    pub fn owner_fd(
        &self,
        owner: u64,
        open: impl FnOnce() -> io::Result<OwnedFd>,
    ) -> io::Result<Arc<OwnedFd>> {
        let mut m = self.owners();
        if let Some(o) = m.get(&owner) {
            return Ok(o.fd.clone());
        }
        let fd = Arc::new(open()?);
        m.insert(
            owner,
            LockOwner {
                fd: fd.clone(),
                pid: 0,
                seq: 0,
            },
        );
        Ok(fd)
    }

    /// Lock owner `owner`'s descriptor, if it has one.
    pub fn existing_owner_fd(&self, owner: u64) -> Option<Arc<OwnedFd>> {
        self.owners().get(&owner).map(|o| o.fd.clone())
    }

    /// Records that guest process `pid` took a POSIX lock as `owner`.
    pub fn note_lock(&self, owner: u64, pid: u32) {
        if let Some(o) = self.owners().get_mut(&owner) {
            o.pid = pid;
            o.seq = LOCK_SEQ.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Forgets `owner` (its FLUSH: the process closed its descriptor), returning its
    /// descriptor so the caller can unlock it.
    pub fn take_owner(&self, owner: u64) -> Option<Arc<OwnedFd>> {
        self.owners().remove(&owner).map(|o| o.fd)
    }

    /// Every owner's descriptor (RELEASE).
    pub fn take_all_owners(&self) -> Vec<Arc<OwnedFd>> {
        self.owners().drain().map(|(_, o)| o.fd).collect()
    }

    pub fn dir(inode: Inode, fd: OwnedFd) -> Self {
        HandleData {
            inode,
            fd,
            kind: HandleKind::Dir {
                lock: Mutex::new(()),
            },
            owners: Mutex::new(HashMap::new()),
        }
    }

    /// `(readable, writable)` for a file handle; `None` for a directory.
    pub fn access(&self) -> Option<(bool, bool)> {
        match self.kind {
            HandleKind::File { readable, writable } => Some((readable, writable)),
            HandleKind::Dir { .. } => None,
        }
    }
}

fn ebadf() -> io::Error {
    io::Error::from_raw_os_error(libc::EBADF)
}

/// The handle table.
pub(super) struct HandleStore {
    map: RwLock<HashMap<Handle, Arc<HandleData>>>,
    next: AtomicU64,
}

impl HandleStore {
    pub fn new() -> Self {
        HandleStore {
            map: RwLock::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }

    pub fn insert(&self, data: HandleData) -> Handle {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::new(data));
        id
    }

    /// Handle `fh`, which must have been opened on `inode`; else `EBADF`.
    pub fn get(&self, inode: Inode, fh: Handle) -> io::Result<Arc<HandleData>> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        match map.get(&fh) {
            Some(h) if h.inode == inode => Ok(h.clone()),
            _ => Err(ebadf()),
        }
    }

    /// A regular-file handle.
    pub fn get_file(&self, inode: Inode, fh: Handle) -> io::Result<Arc<HandleData>> {
        let h = self.get(inode, fh)?;
        match h.kind {
            HandleKind::File { .. } => Ok(h),
            HandleKind::Dir { .. } => Err(ebadf()),
        }
    }

    /// A directory handle.
    pub fn get_dir(&self, inode: Inode, fh: Handle) -> io::Result<Arc<HandleData>> {
        let h = self.get(inode, fh)?;
        match h.kind {
            HandleKind::Dir { .. } => Ok(h),
            HandleKind::File { .. } => Err(ebadf()),
        }
    }

    /// Removes handle `fh` of `inode`; `dir` says which kind the caller expects.
    pub fn remove(&self, inode: Inode, fh: Handle, dir: bool) -> io::Result<Arc<HandleData>> {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        let ok = match map.get(&fh) {
            Some(h) => h.inode == inode && matches!(h.kind, HandleKind::Dir { .. }) == dir,
            None => false,
        };
        if !ok {
            return Err(ebadf());
        }
        map.remove(&fh).ok_or_else(ebadf)
    }

    /// The most recent handle of `inode` open for writing, if any (one pass over the table,
    /// as [`Self::lock_holder`]; asked only by a SETATTR that truncates without a handle).
    pub fn writer(&self, inode: Inode) -> Option<Arc<HandleData>> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        map.iter()
            .filter(|(_, h)| h.inode == inode && matches!(h.access(), Some((_, true))))
            .max_by_key(|(fh, _)| **fh)
            .map(|(_, h)| h.clone())
    }

    /// The guest pid that most recently locked `inode` as an owner other than `except`.
    pub fn lock_holder(&self, inode: Inode, except: u64) -> Option<u32> {
        let map = self.map.read().ok()?;
        map.values()
            .filter(|h| h.inode == inode)
            .flat_map(|h| {
                h.owners()
                    .iter()
                    .filter(|(o, l)| **o != except && l.pid != 0)
                    .map(|(_, l)| (l.pid, l.seq))
                    .collect::<Vec<_>>()
            })
            .max_by_key(|(_, seq)| *seq)
            .map(|(pid, _)| pid)
    }

    /// Every handle and the next free id (migration).
    pub fn export(&self) -> (Vec<(Handle, Arc<HandleData>)>, Handle) {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let v = map.iter().map(|(fh, h)| (*fh, h.clone())).collect();
        (v, self.next.load(Ordering::Relaxed))
    }

    /// Replaces every handle (migration); ids come from the source.
    pub fn replace(&self, entries: Vec<(Handle, HandleData)>, next: Handle) {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        map.clear();
        map.extend(entries.into_iter().map(|(fh, h)| (fh, Arc::new(h))));
        self.next.store(next, Ordering::Relaxed);
    }

    /// Drops every handle.
    pub fn clear(&self) {
        self.map.write().unwrap_or_else(|p| p.into_inner()).clear();
    }

    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|p| p.into_inner()).len()
    }
}
