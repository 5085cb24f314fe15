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

use crate::filesystem::{Handle, Inode};

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
    /// Guest pid of the last POSIX lock taken through this handle, and when (a sequence
    /// number): host OFD locks carry no pid, GETLK reports this one.
    lock_owner: Mutex<(u32, u64)>,
}

/// Orders POSIX lock acquisitions across handles.
static LOCK_SEQ: AtomicU64 = AtomicU64::new(1);

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
            lock_owner: Mutex::new((0, 0)),
        }
    }

    /// Records that guest process `pid` took a POSIX lock through this handle.
    pub fn note_lock(&self, pid: u32) {
        if let Ok(mut o) = self.lock_owner.lock() {
            *o = (pid, LOCK_SEQ.fetch_add(1, Ordering::Relaxed));
        }
    }

    pub fn dir(inode: Inode, fd: OwnedFd) -> Self {
        HandleData {
            inode,
            fd,
            kind: HandleKind::Dir {
                lock: Mutex::new(()),
            },
            lock_owner: Mutex::new((0, 0)),
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

    /// Drops every handle.
    /// The guest pid that most recently locked `inode` through a handle other than `except`.
    pub fn lock_holder(&self, inode: Inode, except: Handle) -> Option<u32> {
        let map = self.map.read().ok()?;
        map.iter()
            .filter(|(fh, h)| **fh != except && h.inode == inode)
            .filter_map(|(_, h)| h.lock_owner.lock().ok().map(|o| *o))
            .filter(|(pid, _)| *pid != 0)
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

    pub fn clear(&self) {
        self.map.write().unwrap_or_else(|p| p.into_inner()).clear();
    }

    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|p| p.into_inner()).len()
    }
}
