//! The pooled window kept across a server crash or upgrade (`--restartable`, see
//! [`crate::protocol::keeper`] and docs/restart.md).
//!
//! QEMU keeps its mapping of the pool when the server dies, and the guest's stores are in the
//! pool memfd, so the window's state is: the pool memfd and whether QEMU maps it
//! ([`Kept::DaxPool`]); each guest mapping placed in it, with its file ([`Kept::DaxPlaced`],
//! kept before the SETUPMAPPING reply names it, released when it leaves the table); and, for
//! the writable ones, what they and their files agreed on at the last merge: the page hashes
//! and agreed lengths, which change at every merge and so live in a memfd the holder keeps
//! ([`HashStore`], indexed by window page, written in place: no message per merge).
//!
//! A merge writes the bytes first and their hashes after, so a crash between the two leaves
//! pages whose file and pool bytes agree but whose hash is old: the next merge takes them as
//! changed on both sides and writes the guest's page whole over the same bytes (harmless).
//! An agreed length stored late is the same case for the range's last page.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::baseline::PageHashes;
use super::copy::{CopySig, Slots};
use super::table::Placed;
use super::{DaxWindow, WindowSink, MAP_ALIGNMENT};
use crate::protocol::keeper::{Keeper, Kept, KeptEntry};

/// A placement's meta: owner, file offset, length, flags, the hash seed.
const PLACED_META: usize = 40;
const WRITABLE: u64 = 1;

/// Per window page: the hash of a writable pooled range's page ([`PageHashes`]), and at a
/// range's first page its agreed length. A shared mapping of a memfd the holder keeps.
pub(crate) struct HashStore {
    base: *mut AtomicU64,
    pages: usize,
    len: usize,
    memfd: File,
}

// SAFETY: the mapping is accessed only through atomics at in-bounds indices and lives as long
// as the value (unmapped in Drop).
unsafe impl Send for HashStore {}
// SAFETY: as above.
unsafe impl Sync for HashStore {}

impl HashStore {
    /// A new store for a window of `size` bytes.
    pub(crate) fn new(size: u64) -> io::Result<HashStore> {
        let pages = size / MAP_ALIGNMENT;
        let memfd = super::memfd::memfd(c"daxfsd-pool-hashes", pages * 16)?;
        Self::map(memfd, size)
    }

    /// Maps `memfd` (kept by a server before) for a window of `size` bytes.
    pub(crate) fn map(memfd: File, size: u64) -> io::Result<HashStore> {
        let pages = usize::try_from(size / MAP_ALIGNMENT)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let len = pages * 16;
        if (crate::sys::fstat(memfd.as_fd())?.st_size.max(0) as usize) < len || len == 0 {
            return Err(io::Error::other("DAX hash store smaller than the window"));
        }
        // `memfd` is at least `len` bytes long (checked above), and nothing but ourselves
        // could shrink it; `Drop` unmaps the `len` bytes.
        let p = crate::sys::map_shared(memfd.as_fd(), len)?;
        Ok(HashStore {
            base: p.cast(),
            pages,
            len,
            memfd,
        })
    }

    fn all(&self) -> &[AtomicU64] {
        // SAFETY: `base` maps `len` = 2 * pages * 8 bytes, page aligned (so 8-aligned), for
        // the life of `self`, and is only ever accessed atomically.
        unsafe { std::slice::from_raw_parts(self.base, 2 * self.pages) }
    }

    /// Hashes of window pages `[first, first + n)` (clipped to the window).
    pub(crate) fn hashes(&self, first: usize, n: usize) -> &[AtomicU64] {
        let a = first.min(self.pages);
        &self.all()[a..first.saturating_add(n).min(self.pages)]
    }

    fn agreed_slot(&self, first: usize) -> Option<&AtomicU64> {
        (first < self.pages).then(|| &self.all()[self.pages + first])
    }

    pub(crate) fn set_agreed(&self, first: usize, v: u64) {
        if let Some(a) = self.agreed_slot(first) {
            a.store(v, Ordering::Relaxed);
        }
    }

    fn agreed(&self, first: usize) -> Option<u64> {
        self.agreed_slot(first).map(|a| a.load(Ordering::Relaxed))
    }
}

impl Drop for HashStore {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; nothing borrows it any more.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    b.get(i * 8..i * 8 + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

impl<S: WindowSink> DaxWindow<S> {
    /// Keeps the window with `keeper` from now on (the hash store is made now).
    pub fn set_keeper(&self, keeper: Arc<dyn Keeper>) -> io::Result<()> {
        if self.hash_store.get().is_none() {
            let store = Arc::new(HashStore::new(self.size)?);
            let _ = self.hash_store.set(store);
        }
        let _ = self.keeper.set(keeper);
        Ok(())
    }

    /// The pool's state for the next server: `sent` once its SHMEM_MAP is acknowledged.
    /// Before it (once a session: the end of a session clears the vault) the hash store.
    pub(super) fn keep_pool(&self, slots: &Slots, sent: bool) {
        let Some(k) = self.keeper.get() else { return };
        if !sent {
            if let Some(store) = self.hash_store.get() {
                k.keep(
                    Kept::DaxHashes,
                    &self.size.to_le_bytes(),
                    Some(store.memfd.as_fd()),
                );
            }
        }
        k.keep(Kept::DaxPool, &[u8::from(sent)], Some(slots.fd()));
    }

    /// The hash store pages of a range at `m`, when a keeper keeps them.
    pub(super) fn kept_hashes(&self, m: u64, pages: PageHashes) -> PageHashes {
        match self.hash_store.get() {
            Some(store) if self.keeper.get().is_some() => {
                pages.into_store(store, (m / MAP_ALIGNMENT) as usize)
            }
            _ => pages,
        }
    }

    /// Keeps a pooled placement at `m` (before the reply that names it).
    pub(super) fn keep_placed(&self, m: u64, p: &Placed) {
        let Some(k) = self.keeper.get() else { return };
        if !p.pooled {
            return;
        }
        let seed = p.pool_pages.as_ref().map_or(0, |h| h.seed());
        let mut meta = Vec::with_capacity(PLACED_META);
        for v in [
            p.owner,
            p.foffset,
            p.len,
            if p.writable { WRITABLE } else { 0 },
            seed,
        ] {
            meta.extend_from_slice(&v.to_le_bytes());
        }
        self.note_agreed(p);
        k.keep(
            Kept::DaxPlaced(m),
            &meta,
            p.file.as_ref().map(|f| f.as_fd()),
        );
    }

    /// Stores a writable pooled range's agreed length where the next server finds it.
    pub(super) fn note_agreed(&self, p: &Placed) {
        if let (Some(h), Some(a)) = (&p.pool_pages, p.pool_agreed) {
            if let Some((store, first)) = h.store() {
                store.set_agreed(first, a);
            }
        }
    }

    /// The placement at `m` left the window.
    pub(super) fn forget_placed(&self, m: u64) {
        if let Some(k) = self.keeper.get() {
            k.release(Kept::DaxPlaced(m));
        }
    }

    /// The pool left the frontend (device reset, end of session): nothing of it is kept.
    pub(super) fn forget_pool(&self, placed: impl IntoIterator<Item = u64>) {
        if let Some(k) = self.keeper.get() {
            for m in placed {
                k.release(Kept::DaxPlaced(m));
            }
            k.release(Kept::DaxPool);
        }
    }

    /// Takes back the window a server before this one kept (before the device runs): the
    /// pool memfd, whether QEMU maps it, the placements with their files and hashes. Returns
    /// how many placements came back; entries that do not fit this window are dropped with a
    /// log line (their bytes are still in the pool memfd, which QEMU maps).
    pub fn restore_kept(&self, entries: Vec<KeptEntry>) -> usize {
        let mut pool = None;
        let mut hashes = None;
        let mut placed = Vec::new();
        for (what, meta, fd) in entries {
            match (what, fd) {
                (Kept::DaxPool, Some(fd)) => pool = Some((meta.first() == Some(&1), fd)),
                (Kept::DaxHashes, Some(fd)) if u64_at(&meta, 0) == self.size => hashes = Some(fd),
                (Kept::DaxPlaced(m), fd) if meta.len() == PLACED_META => placed.push((m, meta, fd)),
                (what, _) => log::warn!("restart: DAX entry {what:?} does not fit this window"),
            }
        }
        if let Some(fd) = hashes {
            match HashStore::map(File::from(fd), self.size) {
                Ok(s) => {
                    let _ = self.hash_store.set(Arc::new(s));
                }
                Err(e) => log::error!("restart: the DAX page hashes do not map: {e}"),
            }
        }
        let Some((sent, pool_fd)) = pool else {
            if !placed.is_empty() {
                log::error!("restart: DAX placements came back without their pool");
            }
            return 0;
        };
        let slots = match Slots::from_memfd(File::from(pool_fd), self.size) {
            Ok(s) => s,
            Err(e) => {
                log::error!("restart: the DAX pool memfd does not fit the window: {e}");
                return 0;
            }
        };
        let slots = self.slots.get_or_init(|| slots);
        if !sent {
            // Its SHMEM_MAP may or may not have reached QEMU: the next ensure_pool unmaps
            // first. No placement can have been kept before it was acknowledged.
            self.pool_unsure
                .store(true, std::sync::atomic::Ordering::Relaxed);
            return 0;
        }
        self.io.note_map(0, self.size, slots.fd(), 0);
        let mut n = 0;
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.pool = Some(t.gen);
        t.regions = 1;
        for (m, meta, fd) in placed {
            let (owner, foffset, len, flags) = (
                u64_at(&meta, 0),
                u64_at(&meta, 1),
                u64_at(&meta, 2),
                u64_at(&meta, 3),
            );
            let writable = flags & WRITABLE != 0;
            let fits = m % MAP_ALIGNMENT == 0
                && len > 0
                && m.checked_add(len).is_some_and(|e| e <= self.size)
                && Self::overlapping(&t, m, m + len).is_ok_and(|v| v.is_empty());
            let file = fd.map(|f: OwnedFd| Arc::new(File::from(f)));
            if !fits || (writable && file.is_none()) {
                log::warn!("restart: DAX placement {m:#x}+{len:#x} does not fit: dropped");
                continue;
            }
            let first = (m / MAP_ALIGNMENT) as usize;
            let (pool_agreed, pool_pages) = match (writable, self.hash_store.get()) {
                (true, Some(store)) => (
                    store.agreed(first).map(|a| a.min(len)),
                    Some(Arc::new(PageHashes::kept(
                        store.clone(),
                        first,
                        len.div_ceil(MAP_ALIGNMENT) as usize,
                        u64_at(&meta, 4),
                    ))),
                ),
                (true, None) => {
                    log::error!("restart: DAX placement {m:#x} is writable but its hashes are gone: dropped");
                    continue;
                }
                _ => (None, None),
            };
            // A read-only copy's file may have changed while no server ran: a signature
            // that proves nothing makes the next sync point refresh it.
            let stale = CopySig {
                size: -1,
                mtime: (0, 0),
                ctime: (0, 0),
                settled: false,
            };
            self.owners.add(owner);
            t.insert(
                m,
                Placed {
                    owner,
                    len,
                    foffset,
                    writable,
                    file,
                    file_len: 0,
                    shadow: None,
                    whole: true,
                    regions: 0,
                    copy: if writable { None } else { Some(stale) },
                    pooled: true,
                    pool_agreed,
                    pool_pages,
                    pool_sig: None,
                },
            );
            n += 1;
        }
        drop(t);
        self.pool_always
            .store(true, std::sync::atomic::Ordering::Relaxed);
        n
    }
}
