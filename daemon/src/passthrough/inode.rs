//! The inode table: guest inode numbers to host files, with lookup counts.
//!
//! Every inode the guest knows holds either an `O_PATH | O_NOFOLLOW` descriptor of the host
//! file or, with `--inode-file-handles`, its file handle plus a shared mount descriptor (see
//! [`super::fhandle`]); either way later operations name the file itself and never
//! re-resolve a path. A host file
//! is identified by `(st_dev, st_ino, mount id)`; looking it up again returns the same guest
//! inode and bumps its count. FORGET drops counts; at zero the entry and its descriptor go.
//! The guest's numbers are our own counter, never pointers, and the root (id 1) stays for
//! the life of the filesystem.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};

use super::fhandle::{open_handle, FileHandleBytes};
use crate::protocol::abi::ROOT_ID;
use crate::protocol::filesystem::Inode;
use crate::protocol::keeper::{Keeper, Kept};

/// Identity of a host file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct InodeKey {
    pub dev: u64,
    pub ino: u64,
    /// Mount id (`STATX_MNT_ID`), 0 when the kernel does not report one.
    pub mnt: u64,
}

/// How an inode reaches its host file.
#[derive(Debug)]
pub(super) enum InodeFile {
    /// `O_PATH | O_NOFOLLOW` descriptor of the file itself (a symlink stays a symlink).
    Fd(OwnedFd),
    /// A file handle, opened on `mount` (a descriptor of the same mount) when an operation
    /// needs it; the `O_PATH` descriptor then stays in `open` until [`FdCache`] evicts it.
    Handle {
        handle: FileHandleBytes,
        mount: Arc<OwnedFd>,
        open: Arc<FdSlot>,
        cache: Arc<FdCache>,
    },
}

/// The cached `O_PATH` descriptor of a handle inode.
pub(super) type FdSlot = Mutex<Option<Arc<OwnedFd>>>;

/// Bounds the `O_PATH` descriptors handle inodes keep open between operations: the last
/// `cap` opened stay (first in, first out), so a busy file is not reopened by handle for
/// each request while the daemon's descriptors stay bounded whatever the guest walks.
#[derive(Debug)]
pub(super) struct FdCache {
    cap: usize,
    order: Mutex<std::collections::VecDeque<std::sync::Weak<FdSlot>>>,
}

impl FdCache {
    pub fn new(cap: usize) -> Self {
        FdCache {
            cap,
            order: Mutex::new(std::collections::VecDeque::with_capacity(cap + 1)),
        }
    }

    /// Records that `slot` now holds a descriptor; evicts the oldest beyond the bound.
    fn note(&self, slot: &Arc<FdSlot>) {
        let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        order.push_back(Arc::downgrade(slot));
        while order.len() > self.cap {
            if let Some(old) = order.pop_front().and_then(|w| w.upgrade()) {
                // A slot set twice has two entries: the older one empties it early, never
                // late, so at most `cap` slots hold a descriptor.
                old.lock().unwrap_or_else(|p| p.into_inner()).take();
            }
        }
    }
}

/// One host file the guest holds a reference to.
#[derive(Debug)]
pub(super) struct InodeData {
    pub id: Inode,
    pub key: InodeKey,
    pub file: InodeFile,
    /// `S_IFMT` bits of the mode; fixed for the life of the file.
    pub kind: u32,
    /// The read-write descriptor SETUPMAPPING maps through, opened at the first one and kept
    /// while the guest holds the inode (see `do_setupmapping`).
    pub dax_fd: Mutex<Option<Arc<OwnedFd>>>,
}

/// An `O_PATH` descriptor of an inode: its own, or one opened from its handle for the
/// duration of one operation.
pub(super) enum InodeFd<'a> {
    Borrowed(BorrowedFd<'a>),
    Shared(Arc<OwnedFd>),
}

impl AsFd for InodeFd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            InodeFd::Borrowed(fd) => *fd,
            InodeFd::Shared(fd) => fd.as_fd(),
        }
    }
}

impl InodeData {
    pub fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }
    pub fn is_symlink(&self) -> bool {
        self.kind == libc::S_IFLNK
    }
    /// An `O_PATH | O_NOFOLLOW` descriptor of the file (for a handle: the cached one, or
    /// opened now and cached; `ESTALE` when the file is gone and none is cached).
    pub fn fd(&self) -> io::Result<InodeFd<'_>> {
        match &self.file {
            InodeFile::Fd(fd) => Ok(InodeFd::Borrowed(fd.as_fd())),
            InodeFile::Handle {
                handle,
                mount,
                open,
                cache,
            } => {
                if let Some(fd) = open.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    return Ok(InodeFd::Shared(fd.clone()));
                }
                let fd = Arc::new(open_handle(
                    mount.as_fd(),
                    handle,
                    libc::O_PATH | libc::O_NOFOLLOW,
                )?);
                *open.lock().unwrap_or_else(|p| p.into_inner()) = Some(fd.clone());
                cache.note(open);
                Ok(InodeFd::Shared(fd))
            }
        }
    }
    /// For a handle, opens it with `flags` directly; `None` for a descriptor inode.
    pub fn open_handle(&self, flags: libc::c_int) -> Option<io::Result<OwnedFd>> {
        match &self.file {
            InodeFile::Fd(_) => None,
            InodeFile::Handle { handle, mount, .. } => {
                Some(open_handle(mount.as_fd(), handle, flags))
            }
        }
    }
    /// Whether a handle inode holds its `O_PATH` descriptor right now.
    pub fn fd_cached(&self) -> bool {
        match &self.file {
            InodeFile::Fd(_) => false,
            InodeFile::Handle { open, .. } => {
                open.lock().unwrap_or_else(|p| p.into_inner()).is_some()
            }
        }
    }
    /// The file handle, when the inode is kept as one.
    pub fn handle(&self) -> Option<&FileHandleBytes> {
        match &self.file {
            InodeFile::Fd(_) => None,
            InodeFile::Handle { handle, .. } => Some(handle),
        }
    }
}

/// The hash of the inode and handle tables, whose keys are integers: our own counters (guest
/// inode and handle numbers) and host `(dev, ino, mnt)` triples, none of them chosen by the
/// guest. One multiply per word, folded (the high half into the low), from a seed drawn per
/// table, against SipHash's ~150 instructions per key: a LOOKUP hashes two keys, a
/// READDIRPLUS two per entry. Maps keyed by guest-chosen numbers (lock owners) keep std's.
#[derive(Clone, Copy)]
pub(super) struct IntHash {
    seed: u64,
}

impl Default for IntHash {
    fn default() -> Self {
        IntHash {
            seed: std::collections::hash_map::RandomState::new().hash_one(0x6461_7866_7364u64),
        }
    }
}

impl BuildHasher for IntHash {
    type Hasher = IntHasher;
    fn build_hasher(&self) -> IntHasher {
        IntHasher(self.seed)
    }
}

/// See [`IntHash`].
pub(super) struct IntHasher(u64);

impl Hasher for IntHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        // The multiplier of PCG's 64-bit LCG: odd, bits spread over the word.
        let m = u128::from(self.0 ^ x) * 0x5851_F42D_4C95_7F2D;
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map of the inode or handle table ([`IntHash`]).
pub(super) type IntMap<K, V> = HashMap<K, V, IntHash>;

struct Slot {
    data: Arc<InodeData>,
    /// Lookup count: how many references the guest holds.
    refs: u64,
}

struct Table {
    by_id: IntMap<Inode, Slot>,
    by_key: IntMap<InodeKey, Inode>,
    next_id: Inode,
}

/// The inode table. Operations hold an `Arc` to the entry they work on, so a concurrent
/// FORGET never closes a descriptor that is in use; it closes when the last user is done.
pub(super) struct InodeStore {
    table: Mutex<Table>,
    /// Where inodes are kept across a crash (`--restartable`).
    keeper: std::sync::OnceLock<Arc<dyn Keeper>>,
}

/// Lookup count of an inode restored after a crash: the guest's own count is unknown, so it
/// is never dropped by FORGETs; it goes when the session ends.
pub(super) const PINNED: u64 = 1 << 48;

/// An inode's entry for the keeper: its key and kind.
pub(super) fn kept_meta(data: &InodeData) -> Vec<u8> {
    let mut v = Vec::with_capacity(28);
    for x in [data.key.dev, data.key.ino, data.key.mnt] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.extend_from_slice(&data.kind.to_le_bytes());
    v
}

/// The key and kind back from [`kept_meta`]'s bytes.
pub(super) fn from_kept_meta(b: &[u8]) -> Option<(InodeKey, u32)> {
    let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    (b.len() == 28).then(|| {
        let key = InodeKey {
            dev: u(0),
            ino: u(8),
            mnt: u(16),
        };
        (key, u32::from_le_bytes(b[24..28].try_into().unwrap()))
    })
}

fn ebadf() -> io::Error {
    io::Error::from_raw_os_error(libc::EBADF)
}

impl InodeStore {
    /// A table holding only the root directory (`fd`, `key`) as inode 1.
    pub fn new(fd: OwnedFd, key: InodeKey) -> Self {
        let root = Arc::new(InodeData {
            id: Inode::ROOT,
            key,
            file: InodeFile::Fd(fd),
            kind: libc::S_IFDIR,
            dax_fd: Mutex::default(),
        });
        let mut by_id = IntMap::default();
        by_id.insert(
            Inode::ROOT,
            Slot {
                data: root,
                refs: 1,
            },
        );
        let mut by_key = IntMap::default();
        by_key.insert(key, Inode::ROOT);
        InodeStore {
            table: Mutex::new(Table {
                by_id,
                by_key,
                next_id: Inode::from_raw(ROOT_ID + 1),
            }),
            keeper: std::sync::OnceLock::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic elsewhere cannot leave the maps inconsistent (every update is a single
        // insert/remove pair), so a poisoned lock is still usable.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The inode with guest number `id`, or `EBADF`.
    pub fn get(&self, id: Inode) -> io::Result<Arc<InodeData>> {
        self.lock()
            .by_id
            .get(&id)
            .map(|s| s.data.clone())
            .ok_or_else(ebadf)
    }

    /// Takes one more reference to an inode the caller already holds.
    pub fn add_ref(&self, id: Inode) -> io::Result<Arc<InodeData>> {
        let mut t = self.lock();
        let slot = t.by_id.get_mut(&id).ok_or_else(ebadf)?;
        slot.refs = slot.refs.saturating_add(1);
        Ok(slot.data.clone())
    }

    /// The existing inode of host file `key`, with one more reference, if there is one.
    pub fn ref_existing(&self, key: &InodeKey) -> Option<Arc<InodeData>> {
        let mut t = self.lock();
        let id = *t.by_key.get(key)?;
        let slot = t.by_id.get_mut(&id)?;
        slot.refs = slot.refs.saturating_add(1);
        Some(slot.data.clone())
    }

    /// Takes a reference to the host file `key`: the existing inode if there is one (and
    /// `file` is dropped), else a new inode holding `file`. An existing handle inode whose
    /// handle differs from `file`'s is another file that had the same inode number (freed
    /// and reused): `key` then names the new inode; the old one lives on until forgotten.
    pub fn insert_or_ref(
        &self,
        key: InodeKey,
        file: InodeFile,
        kind: u32,
    ) -> io::Result<Arc<InodeData>> {
        let mut t = self.lock();
        if let Some(&id) = t.by_key.get(&key) {
            if let Some(slot) = t.by_id.get_mut(&id) {
                let same = match (slot.data.handle(), &file) {
                    (None, _) => true,
                    (Some(a), InodeFile::Handle { handle: b, .. }) => a == b,
                    (Some(_), InodeFile::Fd(_)) => false,
                };
                if same {
                    slot.refs = slot.refs.saturating_add(1);
                    return Ok(slot.data.clone());
                }
            }
        }
        let id = t.next_id;
        t.next_id = id
            .raw()
            .checked_add(1)
            .map(Inode::from_raw)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENFILE))?;
        let data = Arc::new(InodeData {
            id,
            key,
            file,
            kind,
            dax_fd: Mutex::default(),
        });
        t.by_id.insert(
            id,
            Slot {
                data: data.clone(),
                refs: 1,
            },
        );
        t.by_key.insert(key, id);
        // Outside the table's lock: a send to the keeper is a system call. (A FORGET that
        // lands in between leaves the keeper an entry the guest no longer names: one
        // descriptor until the session ends.)
        drop(t);
        self.keep(&data);
        Ok(data)
    }

    /// Gives `data` to the keeper (before any reply names it).
    fn keep(&self, data: &InodeData) {
        if let (Some(k), InodeFile::Fd(fd)) = (self.keeper.get(), &data.file) {
            k.keep(
                Kept::Inode(data.id.raw()),
                &kept_meta(data),
                Some(fd.as_fd()),
            );
        }
    }

    /// Keeps every inode with `keeper` from now on.
    pub fn set_keeper(&self, keeper: Arc<dyn Keeper>) {
        let _ = self.keeper.set(keeper);
    }

    /// Puts inodes a crashed server kept back (`id`, key, kind, descriptor), with
    /// [`PINNED`] counts.
    pub fn restore(&self, entries: Vec<(Inode, InodeKey, u32, OwnedFd)>) {
        let mut t = self.lock();
        for (id, key, kind, fd) in entries {
            if id == Inode::ROOT {
                continue;
            }
            let data = Arc::new(InodeData {
                id,
                key,
                file: InodeFile::Fd(fd),
                kind,
                dax_fd: Mutex::default(),
            });
            t.by_key.insert(key, id);
            t.by_id.insert(id, Slot { data, refs: PINNED });
            t.next_id = t.next_id.max(Inode::from_raw(id.raw().saturating_add(1)));
        }
    }

    /// Drops `count` references; the inode goes away at zero (then it is returned). Unknown
    /// ids and the root are ignored.
    pub fn forget(&self, id: Inode, count: u64) -> Option<Arc<InodeData>> {
        if id == Inode::ROOT {
            return None;
        }
        let mut t = self.lock();
        let slot = t.by_id.get_mut(&id)?;
        slot.refs = slot.refs.saturating_sub(count);
        if slot.refs > 0 {
            return None;
        }
        let slot = t.by_id.remove(&id)?;
        // Only remove the key if it still points at this inode.
        if t.by_key.get(&slot.data.key) == Some(&id) {
            t.by_key.remove(&slot.data.key);
        }
        // Outside the table's lock, as `keep` (ids are never reused: no later keep of this
        // one can be overtaken).
        drop(t);
        if let Some(k) = self.keeper.get() {
            k.release(Kept::Inode(id.raw()));
        }
        Some(slot.data)
    }

    /// The guest's number for host file `key`, if the guest holds it (no reference taken).
    pub fn id_of(&self, key: &InodeKey) -> Option<Inode> {
        self.lock().by_key.get(key).copied()
    }

    /// Drops every inode but the root.
    pub fn clear(&self) {
        let mut t = self.lock();
        t.by_id.retain(|&id, _| id == Inode::ROOT);
        t.by_key.retain(|_, id| *id == Inode::ROOT);
    }

    /// Number of inodes in the table (root included).
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    /// Every inode with its lookup count, and the next free id (migration).
    pub fn export(&self) -> (Vec<(Arc<InodeData>, u64)>, Inode) {
        let t = self.lock();
        let v = t.by_id.values().map(|s| (s.data.clone(), s.refs)).collect();
        (v, t.next_id)
    }

    /// Replaces the whole table (migration): `entries` hold the root; ids come from the
    /// source and stay what the guest knows.
    pub fn replace(&self, entries: Vec<(Arc<InodeData>, u64)>, next_id: Inode) {
        let mut t = self.lock();
        t.by_id.clear();
        t.by_key.clear();
        for (data, refs) in entries {
            t.by_key.insert(data.key, data.id);
            if data.id != Inode::ROOT {
                self.keep(&data);
            }
            t.by_id.insert(data.id, Slot { data, refs });
        }
        t.next_id = next_id;
    }

    /// Current lookup count of `id` (0 when unknown).
    pub fn refs(&self, id: Inode) -> u64 {
        self.lock().by_id.get(&id).map_or(0, |s| s.refs)
    }
}
