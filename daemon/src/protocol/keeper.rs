//! The keeper seam: what a file server keeps outside its own process so that the next one
//! resumes its FUSE session after a crash (`--restartable`; the holder is the keeper, see
//! `host::holder`). Each entry is an id, a few bytes and at most one descriptor; the keeper
//! holds the descriptor, so the open file description (its offset, its OFD locks, an unlinked
//! file) lives on while no server runs.
//!
//! A server keeps an entry before any reply that names it reaches the guest, and releases
//! it when the guest can no longer name it; releases may lag (an entry kept too long only
//! costs a descriptor until the session ends).

use std::os::fd::BorrowedFd;

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kept {
    /// The negotiated FUSE session ([`super::server::SessionState`]).
    Session,
    /// An inode the guest holds, by node id.
    Inode(u64),
    /// An open handle, by handle id.
    Handle(u64),
    /// A POSIX lock owner's descriptor on a handle: handle id, lock owner. Released with
    /// its handle too.
    Owner(u64, u64),
    /// The DAX pool's memfd (what QEMU maps as the whole window); meta: whether the pool's
    /// SHMEM_MAP is known to have reached the frontend (1) or may have (0).
    DaxPool,
    /// The DAX window's page-hash memfd (`dax::kept::HashStore`); meta: the window size.
    DaxHashes,
    /// A guest mapping placed in the DAX pool, by window offset, with its file.
    DaxPlaced(u64),
    /// A frontend mapping of a direct DAX window (`--dax-mapping=direct`), by window offset,
    /// with the descriptor the frontend maps; meta: length, file offset, flags (writable,
    /// whether its SHMEM_MAP is known to have reached the frontend, what it maps).
    DaxFront(u64),
    /// A guest mapping placed directly (not pooled), by window offset, with its file.
    DaxDirect(u64),
    /// A shadow memfd of a direct window: its id, and the part (0 the memfd, 1 its agreed
    /// copy, 2 the file it syncs with).
    DaxShadow(u64, u64),
}

impl Kept {
    /// Its wire form: kind and two ids.
    pub fn to_wire(self) -> (u8, u64, u64) {
        match self {
            Kept::Session => (1, 0, 0),
            Kept::Inode(id) => (2, id, 0),
            Kept::Handle(id) => (3, id, 0),
            Kept::Owner(fh, owner) => (4, fh, owner),
            Kept::DaxPool => (5, 0, 0),
            Kept::DaxHashes => (6, 0, 0),
            Kept::DaxPlaced(m) => (7, m, 0),
            Kept::DaxFront(m) => (8, m, 0),
            Kept::DaxDirect(m) => (9, m, 0),
            Kept::DaxShadow(id, part) => (10, id, part),
        }
    }

    pub fn from_wire(kind: u8, id: u64, id2: u64) -> Option<Self> {
        match kind {
            1 => Some(Kept::Session),
            2 => Some(Kept::Inode(id)),
            3 => Some(Kept::Handle(id)),
            4 => Some(Kept::Owner(id, id2)),
            5 => Some(Kept::DaxPool),
            6 => Some(Kept::DaxHashes),
            7 => Some(Kept::DaxPlaced(id)),
            8 => Some(Kept::DaxFront(id)),
            9 => Some(Kept::DaxDirect(id)),
            10 => Some(Kept::DaxShadow(id, id2)),
            _ => None,
        }
    }
}

impl Kept {
    /// Whether the DAX window takes it back (else the file system does).
    pub fn is_dax(self) -> bool {
        matches!(
            self,
            Kept::DaxPool
                | Kept::DaxHashes
                | Kept::DaxPlaced(_)
                | Kept::DaxFront(_)
                | Kept::DaxDirect(_)
                | Kept::DaxShadow(..)
        )
    }
}

/// An entry as it comes back to the next server: what, its bytes, its descriptor.
pub type KeptEntry = (Kept, Vec<u8>, Option<std::os::fd::OwnedFd>);

/// Where entries go.
pub trait Keeper: Send + Sync {
    /// Keeps (or replaces) entry `what`: `meta` and a duplicate of `fd`.
    fn keep(&self, what: Kept, meta: &[u8], fd: Option<BorrowedFd<'_>>);
    /// Drops entry `what`.
    fn release(&self, what: Kept);
    /// The session ended: every entry goes.
    fn clear(&self);
}
