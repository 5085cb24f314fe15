//! Open file and directory handles: guest handle numbers to host descriptors.
//!
//! A handle is a `u64` from our own counter. It remembers the inode it was opened on, and
//! every use checks that the guest names the same inode, so a handle cannot be used to reach
//! another file. Regular files hold a descriptor reopened from the inode with the guest's
//! access mode; directories hold a directory descriptor plus a lock that serialises the
//! `lseek` + `getdents64` pair of a READDIR.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::inode::IntMap;
use crate::protocol::filesystem::{Handle, Inode, LockOwner as Owner};
use crate::protocol::keeper::{Keeper, Kept};

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
    owners: Mutex<HashMap<Owner, LockOwner>>,
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

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<Owner, LockOwner>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lock owner `owner`'s descriptor, made with `open` on first use.
    pub fn owner_fd(
        &self,
        owner: Owner,
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
    pub fn existing_owner_fd(&self, owner: Owner) -> Option<Arc<OwnedFd>> {
        self.owners().get(&owner).map(|o| o.fd.clone())
    }

    /// Puts back lock owner `owner`'s descriptor (kept across a crash).
    pub fn restore_owner(&self, owner: Owner, fd: OwnedFd) {
        self.owners().insert(
            owner,
            LockOwner {
                fd: Arc::new(fd),
                pid: 0,
                seq: 0,
            },
        );
    }

    /// Records that guest process `pid` took a POSIX lock as `owner`.
    pub fn note_lock(&self, owner: Owner, pid: u32) {
        if let Some(o) = self.owners().get_mut(&owner) {
            o.pid = pid;
            o.seq = LOCK_SEQ.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Forgets `owner` (its FLUSH: the process closed its descriptor), returning its
    /// descriptor so the caller can unlock it.
    pub fn take_owner(&self, owner: Owner) -> Option<Arc<OwnedFd>> {
        self.owners().remove(&owner).map(|o| o.fd)
    }

    /// Every owner's descriptor (RELEASE).
    pub fn take_all_owners(&self) -> Vec<Arc<OwnedFd>> {
        self.owners().drain().map(|(_, o)| o.fd).collect()
    }

    /// Its entry for the keeper: inode, and 0 (directory) or the access mode + 1.
    fn kept_meta(&self) -> Vec<u8> {
        let mut v = self.inode.raw().to_le_bytes().to_vec();
        v.push(match self.kind {
            HandleKind::Dir { .. } => 0,
            HandleKind::File { readable, writable } => {
                1 + match (readable, writable) {
                    (true, true) => libc::O_RDWR,
                    (false, true) => libc::O_WRONLY,
                    _ => libc::O_RDONLY,
                } as u8
            }
        });
        v
    }

    /// A handle back from [`Self::kept_meta`]'s bytes and its descriptor.
    pub fn from_kept(meta: &[u8], fd: OwnedFd) -> Option<Self> {
        let inode = Inode::from_raw(u64::from_le_bytes(meta.get(..8)?.try_into().ok()?));
        Some(match *meta.get(8)? {
            0 => HandleData::dir(inode, fd),
            m => HandleData::file(inode, fd, libc::c_int::from(m - 1)),
        })
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

    /// Whether this is a file handle open for writing.
    fn writable(&self) -> bool {
        matches!(self.access(), Some((_, true)))
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

/// The handles, and those open for writing by inode (under one lock).
#[derive(Default)]
struct Table {
    map: IntMap<Handle, Arc<HandleData>>,
    /// The handles open for writing of each inode that has one, oldest first: a handle-less
    /// truncate asks for the newest ([`HandleStore::writer`]) without a pass over every handle
    /// the guest holds.
    writers: IntMap<Inode, BTreeSet<Handle>>,
}

impl Table {
    fn add(&mut self, fh: Handle, h: Arc<HandleData>) {
        if h.writable() {
            self.writers.entry(h.inode).or_default().insert(fh);
        }
        if let Some(old) = self.map.insert(fh, h) {
            self.forget_writer(fh, &old);
        }
    }

    fn take(&mut self, fh: Handle) -> Option<Arc<HandleData>> {
        let h = self.map.remove(&fh)?;
        self.forget_writer(fh, &h);
        Some(h)
    }

    fn forget_writer(&mut self, fh: Handle, h: &HandleData) {
        if let Some(set) = self.writers.get_mut(&h.inode) {
            set.remove(&fh);
            if set.is_empty() {
                self.writers.remove(&h.inode);
            }
        }
    }
}

/// The handle table.
pub(super) struct HandleStore {
    map: RwLock<Table>,
    next: AtomicU64,
    /// Where handles are kept across a crash (`--restartable`).
    keeper: std::sync::OnceLock<Arc<dyn Keeper>>,
    /// Handles [`Self::writer`] looked at (tests: its cost must not grow with the table).
    #[cfg(test)]
    examined: std::sync::atomic::AtomicUsize,
}

impl HandleStore {
    pub fn new() -> Self {
        HandleStore {
            map: RwLock::new(Table::default()),
            next: AtomicU64::new(1),
            keeper: std::sync::OnceLock::new(),
            #[cfg(test)]
            examined: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    pub fn insert(&self, data: HandleData) -> Handle {
        let id = Handle::from_raw(self.next.fetch_add(1, Ordering::Relaxed));
        self.keep(id, &data);
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .add(id, Arc::new(data));
        id
    }

    /// Handle `fh`, which must have been opened on `inode`; else `EBADF`.
    pub fn get(&self, inode: Inode, fh: Handle) -> io::Result<Arc<HandleData>> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        match map.map.get(&fh) {
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
        let ok = match map.map.get(&fh) {
            Some(h) => h.inode == inode && matches!(h.kind, HandleKind::Dir { .. }) == dir,
            None => false,
        };
        if !ok {
            return Err(ebadf());
        }
        let h = map.take(fh).ok_or_else(ebadf)?;
        if let Some(k) = self.keeper.get() {
            k.release(Kept::Handle(fh.raw()));
        }
        Ok(h)
    }

    /// Gives handle `fh` to the keeper (before the reply names it).
    fn keep(&self, fh: Handle, h: &HandleData) {
        if let Some(k) = self.keeper.get() {
            k.keep(Kept::Handle(fh.raw()), &h.kept_meta(), Some(h.fd.as_fd()));
        }
    }

    /// The keeper, when there is one.
    pub fn keeper(&self) -> Option<&Arc<dyn Keeper>> {
        self.keeper.get()
    }

    /// Keeps every handle with `keeper` from now on.
    pub fn set_keeper(&self, keeper: Arc<dyn Keeper>) {
        let _ = self.keeper.set(keeper);
    }

    /// Puts handles a crashed server kept back.
    pub fn restore(&self, entries: Vec<(Handle, HandleData)>) {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        for (fh, h) in entries {
            let after = fh.raw().saturating_add(1);
            self.next.fetch_max(after, Ordering::Relaxed);
            map.add(fh, Arc::new(h));
        }
    }

    /// The most recent handle of `inode` open for writing, if any (asked by a SETATTR that
    /// truncates without a handle): from the inode's own writers, whatever else is open.
    pub fn writer(&self, inode: Inode) -> Option<Arc<HandleData>> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let fh = map.writers.get(&inode)?.last()?;
        self.examined();
        map.map.get(fh).cloned()
    }

    /// The guest pid that most recently locked `inode` as an owner other than `except`.
    pub fn lock_holder(&self, inode: Inode, except: Owner) -> Option<u32> {
        let map = self.map.read().ok()?;
        map.map
            .values()
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
        let v = map.map.iter().map(|(fh, h)| (*fh, h.clone())).collect();
        (v, Handle::from_raw(self.next.load(Ordering::Relaxed)))
    }

    /// Replaces every handle (migration); ids come from the source.
    pub fn replace(&self, entries: Vec<(Handle, HandleData)>, next: Handle) {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        *map = Table::default();
        for (fh, h) in entries {
            self.keep(fh, &h);
            map.add(fh, Arc::new(h));
        }
        self.next.store(next.raw(), Ordering::Relaxed);
    }

    /// Drops every handle.
    pub fn clear(&self) {
        *self.map.write().unwrap_or_else(|p| p.into_inner()) = Table::default();
    }

    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|p| p.into_inner()).map.len()
    }

    /// Counts one handle looked at by [`Self::writer`] (tests only).
    fn examined(&self) {
        #[cfg(test)]
        self.examined.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fd() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    /// A handle-less truncate asks for the inode's newest writer: the answer, and the handles
    /// looked at for it, whatever else the table holds (a guest opens as many as it likes).
    #[test]
    fn writer_costs_the_same_whatever_the_table_holds() {
        let t = HandleStore::new();
        let ino = Inode::from_raw;
        let mine = [
            t.insert(HandleData::file(ino(7), fd(), libc::O_WRONLY)),
            t.insert(HandleData::file(ino(7), fd(), libc::O_RDONLY)),
        ];
        let mut cost = Vec::new();
        for others in [0usize, 100, 2000] {
            while t.len() < 2 + others {
                t.insert(HandleData::file(
                    ino(8 + t.len() as u64),
                    fd(),
                    libc::O_RDWR,
                ));
            }
            t.examined.store(0, Ordering::Relaxed);
            let w = t.writer(ino(7)).expect("inode 7 has a writer");
            assert!(Arc::ptr_eq(&w, &t.get(ino(7), mine[0]).unwrap()));
            assert!(t.writer(ino(9_999_999)).is_none());
            cost.push(t.examined.load(Ordering::Relaxed));
        }
        eprintln!("handles looked at with 0, 100, 2000 other handles: {cost:?}");
        assert!(
            cost.iter().all(|&c| c == cost[0]),
            "the cost grows with the table: {cost:?}"
        );
        // The newest writer wins; a removed one is gone from the answer.
        let newer = t.insert(HandleData::file(ino(7), fd(), libc::O_RDWR));
        assert!(Arc::ptr_eq(
            &t.writer(ino(7)).unwrap(),
            &t.get(ino(7), newer).unwrap()
        ));
        t.remove(ino(7), newer, false).unwrap();
        assert!(Arc::ptr_eq(
            &t.writer(ino(7)).unwrap(),
            &t.get(ino(7), mine[0]).unwrap()
        ));
        t.remove(ino(7), mine[0], false).unwrap();
        assert!(t.writer(ino(7)).is_none(), "only a reader left");
        t.replace(
            vec![(
                Handle::from_raw(5),
                HandleData::file(ino(7), fd(), libc::O_WRONLY),
            )],
            Handle::from_raw(6),
        );
        assert!(Arc::ptr_eq(
            &t.writer(ino(7)).unwrap(),
            &t.get(ino(7), Handle::from_raw(5)).unwrap()
        ));
        t.clear();
        assert!(t.writer(ino(7)).is_none());
    }
}
