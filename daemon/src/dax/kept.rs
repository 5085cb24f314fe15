//! The window kept across a server crash or upgrade (`--restartable`, see
//! [`crate::protocol::keeper`] and docs/restart.md): pooled, and below ([`Front`]) direct.
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
//!
//! A direct window's state is what QEMU maps: each frontend mapping ([`Kept::DaxFront`]: kept
//! unsure before its SHMEM_MAP, sent after the ack, released after its unmap; see
//! `sink::Sending::map_as`), each guest mapping on them ([`Kept::DaxDirect`], kept before the
//! reply names it) and each shadow with its agreed copy ([`Kept::DaxShadow`], see
//! [`super::tail::Shadow::keep_with`]). The next server rebuilds the table from them; what
//! the vault cannot vouch for (unsure, or no guest mapping on it) is an orphan, unmapped
//! before its range is used again.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::baseline::PageHashes;
use super::copy::{CopySig, Slots};
use super::table::{Placed, SharedShadow, Table};
use super::tail::{Shadow, ShadowKey};
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
        let _ = self.keeper.set(keeper.clone());
        // What the take-back dropped goes; the shadows it took back are kept by this server
        // from now on (released when let go, kept again as their merges move them).
        for what in std::mem::take(&mut *self.kept_drop.lock().unwrap_or_else(|e| e.into_inner())) {
            keeper.release(what);
        }
        let live: Vec<(ShadowKey, SharedShadow)> = {
            let reg = self.shadows.lock().unwrap_or_else(|e| e.into_inner());
            reg.iter()
                .filter_map(|(k, w)| w.upgrade().map(|s| (*k, s)))
                .collect()
        };
        for (key, sh) in live {
            sh.lock()
                .unwrap_or_else(|e| e.into_inner())
                .keep_with(&keeper, key);
        }
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

    /// Keeps a placement at `m` (before the reply that names it).
    pub(super) fn keep_placed(&self, m: u64, p: &Placed) {
        let Some(k) = self.keeper.get() else { return };
        if !p.pooled {
            self.keep_direct(k, m, p);
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

    /// The pool left the frontend (device reset, end of session): nothing of it is kept,
    /// nor the guest mappings at `placed`.
    pub(super) fn forget_pool(&self, placed: impl IntoIterator<Item = u64>) {
        if let Some(k) = self.keeper.get() {
            for m in placed {
                k.release(Kept::DaxPlaced(m));
                k.release(Kept::DaxDirect(m));
            }
            k.release(Kept::DaxPool);
        }
    }

    /// Takes back the window a server before this one kept (before the device runs): the
    /// pool memfd, whether QEMU maps it, the placements with their files and hashes; a
    /// direct window's frontend mappings, guest mappings and shadows (see
    /// [`Self::restore_direct`]). Returns how many guest mappings came back; entries that do
    /// not fit this window are dropped with a log line (a pooled range's bytes are still in
    /// the pool memfd, which QEMU maps).
    pub fn restore_kept(&self, entries: Vec<KeptEntry>) -> usize {
        let mut pool = None;
        let mut hashes = None;
        let mut placed = Vec::new();
        let mut direct = Vec::new();
        for (what, meta, fd) in entries {
            if matches!(
                what,
                Kept::DaxFront(_) | Kept::DaxDirect(_) | Kept::DaxShadow(..)
            ) {
                direct.push((what, meta, fd));
                continue;
            }
            match (what, fd) {
                (Kept::DaxPool, Some(fd)) => pool = Some((meta.first() == Some(&1), fd)),
                (Kept::DaxHashes, Some(fd)) if u64_at(&meta, 0) == self.size => hashes = Some(fd),
                (Kept::DaxPlaced(m), fd) if meta.len() == PLACED_META => placed.push((m, meta, fd)),
                (what, _) => log::warn!("restart: DAX entry {what:?} does not fit this window"),
            }
        }
        let n = self.restore_direct(direct);
        n + self.restore_pooled(pool, hashes, placed)
    }

    /// The pooled part of [`Self::restore_kept`].
    fn restore_pooled(
        &self,
        pool: Option<(bool, OwnedFd)>,
        hashes: Option<OwnedFd>,
        placed: Vec<(u64, Vec<u8>, Option<OwnedFd>)>,
    ) -> usize {
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
        t.regions += 1;
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

/// What a direct window's frontend mapping maps ([`Kept::DaxFront`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Front {
    /// Whole pages of the guest's file.
    File,
    /// A shadow memfd (a tail, a snapshot, a merged range).
    Shadow,
    /// A copy slot (the copy slots' memfd at the same window offset).
    Slot,
}

/// A frontend mapping's flags: writable, acknowledged, and its kind from bit 8.
const FRONT_WRITABLE: u64 = 1;
const FRONT_SENT: u64 = 2;
/// A direct placement's flags (beside [`WRITABLE`]).
const WHOLE: u64 = 2;
const COPY: u64 = 4;
/// A direct placement's meta: owner, file offset, length, flags, file_len, regions, shadow.
const DIRECT_META: usize = 7 * 8;

impl Front {
    /// The meta of a frontend mapping of this kind.
    pub(super) fn meta(self, len: u64, foffset: u64, writable: bool, sent: bool) -> Vec<u8> {
        let kind = match self {
            Front::File => 0u64,
            Front::Shadow => 1,
            Front::Slot => 2,
        };
        let flags = kind << 8
            | if writable { FRONT_WRITABLE } else { 0 }
            | if sent { FRONT_SENT } else { 0 };
        [len, foffset, flags]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    fn of(flags: u64) -> Option<Front> {
        match flags >> 8 {
            0 => Some(Front::File),
            1 => Some(Front::Shadow),
            2 => Some(Front::Slot),
            _ => None,
        }
    }
}

/// A kept shadow's parts as they came back: memfd (with its meta), agreed copy, file.
type ShadowParts = [Option<(Vec<u8>, OwnedFd)>; 3];

/// The direct window's vault entries, sorted by kind (`sort_direct_entries`).
struct DirectEntries {
    /// Frontend mappings, by mapping id.
    fronts: BTreeMap<u64, KeptFront>,
    /// Guest mappings: id, their metadata, their file.
    directs: Vec<(u64, Vec<u8>, Option<OwnedFd>)>,
    /// Shadow parts, by shadow id.
    parts: HashMap<u64, ShadowParts>,
    /// Entries that fit nothing, to be released.
    drop_kept: Vec<Kept>,
}

/// A frontend mapping as it came back.
struct KeptFront {
    len: u64,
    foffset: u64,
    kind: Option<Front>,
    sent: bool,
    fd: Option<OwnedFd>,
    /// A guest mapping came back on it.
    used: bool,
}

impl<S: WindowSink> DaxWindow<S> {
    /// Keeps a direct placement at `m` (its frontend mappings are kept already) with its
    /// shadow.
    fn keep_direct(&self, k: &Arc<dyn Keeper>, m: u64, p: &Placed) {
        let shadow = p.shadow.as_ref().and_then(|s| self.keep_shadow(k, s));
        let flags = if p.writable { WRITABLE } else { 0 }
            | if p.whole { WHOLE } else { 0 }
            | if p.copy.is_some() { COPY } else { 0 };
        let meta: Vec<u8> = [
            p.owner,
            p.foffset,
            p.len,
            flags,
            p.file_len,
            p.regions as u64,
            shadow.unwrap_or(0),
        ]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
        k.keep(
            Kept::DaxDirect(m),
            &meta,
            p.file.as_ref().map(|f| f.as_fd()),
        );
    }

    /// Keeps `sh` (found in the registry by identity) from now on; its id.
    fn keep_shadow(&self, k: &Arc<dyn Keeper>, sh: &SharedShadow) -> Option<u64> {
        let key = {
            let reg = self.shadows.lock().unwrap_or_else(|e| e.into_inner());
            reg.iter()
                .find(|(_, w)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(sh)))
                .map(|(k, _)| *k)?
        };
        sh.lock()
            .unwrap_or_else(|e| e.into_inner())
            .keep_with(k, key)
    }

    /// The direct placement at `m` left the window.
    pub(super) fn forget_direct(&self, m: u64) {
        if let Some(k) = self.keeper.get() {
            k.release(Kept::DaxDirect(m));
        }
    }

    /// The frontend dropped its mappings at `offsets` (a device reset).
    pub(super) fn forget_fronts(&self, offsets: Vec<u64>) {
        if let Some(k) = self.keeper.get() {
            for m in offsets {
                k.release(Kept::DaxFront(m));
            }
        }
    }

    /// The direct part of [`Self::restore_kept`]: each guest mapping whose frontend mappings
    /// were all acknowledged comes back with its file, shadow or copy slot; an acknowledged
    /// copy slot no guest mapping names is parked again; every other frontend mapping (its
    /// SHMEM_MAP unacknowledged, or no guest mapping on it) is an orphan, unmapped before its
    /// range is used again. A shadow no guest mapping names is merged into its file once.
    fn restore_direct(&self, entries: Vec<KeptEntry>) -> usize {
        if entries.is_empty() {
            return 0;
        }
        let DirectEntries {
            mut fronts,
            directs,
            parts,
            mut drop_kept,
        } = Self::sort_direct_entries(entries);
        let shadows = self.restore_shadows(parts, &mut drop_kept);
        let mut used_shadows = std::collections::HashSet::new();
        let mut n = 0;
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let mut watch = Vec::new();
        for (m, meta, fd) in directs {
            let (owner, foffset, len, flags) = (
                u64_at(&meta, 0),
                u64_at(&meta, 1),
                u64_at(&meta, 2),
                u64_at(&meta, 3),
            );
            let (file_len, regions, sid) = (u64_at(&meta, 4), u64_at(&meta, 5), u64_at(&meta, 6));
            let (writable, whole, copy) =
                (flags & WRITABLE != 0, flags & WHOLE != 0, flags & COPY != 0);
            let file = fd.map(|f: OwnedFd| Arc::new(File::from(f)));
            let shadow = shadows.get(&sid).cloned();
            // Its frontend mappings: each acknowledged, of the kind and length it needs.
            let mut need = Vec::new();
            if copy {
                need.push((m, len, Front::Slot));
            } else {
                if file_len > 0 {
                    need.push((m, file_len, Front::File));
                }
                if file_len < len {
                    need.push((m + file_len, len - file_len, Front::Shadow));
                }
            }
            let fronts_ok = need.iter().all(|&(at, l, kind)| {
                fronts
                    .get(&at)
                    .is_some_and(|f| f.sent && !f.used && f.len == l && f.kind == Some(kind))
            });
            let fits = m % MAP_ALIGNMENT == 0
                && len > 0
                && file_len <= len
                && m.checked_add(len).is_some_and(|e| e <= self.size)
                && Self::overlapping(&t, m, m + len).is_ok_and(|v| v.is_empty())
                && usize::try_from(regions).is_ok_and(|r| r == need.len() || r == 1);
            let parts_ok = (file_len == 0 || file.is_some())
                && (!writable || file.is_some())
                && (copy || file_len == len || shadow.is_some());
            if !(fronts_ok && fits && parts_ok) {
                log::warn!("restart: DAX mapping {m:#x}+{len:#x} does not fit: dropped (its frontend mappings are unmapped before reuse)");
                drop_kept.push(Kept::DaxDirect(m));
                continue;
            }
            for &(at, _, _) in &need {
                if let Some(f) = fronts.get_mut(&at) {
                    f.used = true;
                }
            }
            if copy {
                if let Some(fd) = fronts.get(&m).and_then(|f| f.fd.as_ref()) {
                    self.take_slots(fd);
                }
            }
            if file_len > 0 {
                if let Some(f) = &file {
                    watch.push((f.clone(), owner, m, foffset, file_len));
                }
            }
            let shadow = if copy || file_len == len {
                None
            } else {
                used_shadows.insert(sid);
                shadow
            };
            // A copy's file may have changed while no server ran: a signature that proves
            // nothing makes the next sync point refresh it.
            let stale = CopySig {
                size: -1,
                mtime: (0, 0),
                ctime: (0, 0),
                settled: false,
            };
            self.owners.add(owner);
            t.regions += regions as usize;
            t.insert(
                m,
                Placed {
                    owner,
                    len,
                    foffset,
                    writable,
                    file,
                    file_len,
                    shadow,
                    whole,
                    regions: regions as usize,
                    copy: copy.then_some(stale),
                    pooled: false,
                    pool_agreed: None,
                    pool_pages: None,
                    pool_sig: None,
                },
            );
            n += 1;
        }
        self.park_or_orphan(&mut t, &fronts);
        t.peak = t.peak.max(t.regions);
        let live: Vec<(u64, u64)> = t.live.iter().map(|(&m, p)| (m, p.len)).collect();
        drop(t);
        for (m, len) in live {
            self.note_guest_range(m, len);
        }
        for (f, owner, m, foffset, len) in watch {
            drop(self.host.watch(&f, owner, m, foffset, len));
        }
        Self::write_back_unnamed(shadows, &used_shadows, &mut drop_kept);
        self.kept_drop
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(drop_kept);
        n
    }

    /// The direct window's vault entries by kind.
    fn sort_direct_entries(entries: Vec<KeptEntry>) -> DirectEntries {
        let mut fronts = BTreeMap::new();
        let mut directs = Vec::new();
        let mut parts: HashMap<u64, ShadowParts> = HashMap::new();
        let mut drop_kept = Vec::new();
        for (what, meta, fd) in entries {
            match what {
                Kept::DaxFront(m) => {
                    let flags = u64_at(&meta, 2);
                    fronts.insert(
                        m,
                        KeptFront {
                            len: u64_at(&meta, 0),
                            foffset: u64_at(&meta, 1),
                            kind: Front::of(flags),
                            sent: flags & FRONT_SENT != 0 && meta.len() == 24,
                            fd,
                            used: false,
                        },
                    );
                }
                Kept::DaxDirect(m) if meta.len() == DIRECT_META => directs.push((m, meta, fd)),
                Kept::DaxShadow(id, part @ 0..=2) => match fd {
                    Some(fd) => parts.entry(id).or_default()[part as usize] = Some((meta, fd)),
                    None => drop_kept.push(what),
                },
                what => {
                    log::warn!("restart: DAX entry {what:?} does not fit this window");
                    drop_kept.push(what);
                }
            }
        }
        DirectEntries {
            fronts,
            directs,
            parts,
            drop_kept,
        }
    }

    /// The kept shadows, registered again (aliases share them), by their vault id.
    fn restore_shadows(
        &self,
        parts: HashMap<u64, ShadowParts>,
        drop_kept: &mut Vec<Kept>,
    ) -> HashMap<u64, SharedShadow> {
        let mut shadows: HashMap<u64, SharedShadow> = HashMap::new();
        for (id, [memfd, agreed, file]) in parts {
            let shadow = memfd.and_then(|(meta, fd)| {
                Shadow::from_kept(
                    &meta,
                    File::from(fd),
                    agreed.map(|(_, f)| File::from(f)),
                    file.map(|(_, f)| Arc::new(File::from(f))),
                )
            });
            let Some((key, sh)) = shadow else {
                log::error!("restart: DAX shadow {id} came back incomplete: dropped");
                drop_kept.extend((0..3).map(|p| Kept::DaxShadow(id, p)));
                continue;
            };
            let sh = Arc::new(Mutex::new(sh));
            self.shadows
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, Arc::downgrade(&sh));
            shadows.insert(id, sh);
        }
        shadows
    }

    /// Kept frontend mappings no guest mapping took: acknowledged copy slots are parked
    /// again, the rest are orphans, unmapped before their range is used again.
    fn park_or_orphan(&self, t: &mut Table, fronts: &BTreeMap<u64, KeptFront>) {
        for (&m, f) in fronts {
            // Unsure ones too: the frontend may map them, so requests never resolve
            // buffers through them (until they are unmapped as orphans).
            if let Some(fd) = &f.fd {
                self.io.note_map(m, f.len, fd.as_fd(), f.foffset);
            }
            if f.used {
                continue;
            }
            let free = m.checked_add(f.len).is_some_and(|e| e <= self.size)
                && Self::overlapping(t, m, m + f.len).is_ok_and(|v| v.is_empty())
                && t.parked_overlapping(m, m + f.len).is_empty();
            if f.sent && f.kind == Some(Front::Slot) && free && f.fd.is_some() {
                if let Some(fd) = &f.fd {
                    self.take_slots(fd);
                }
                t.park(m, f.len);
                t.regions += 1;
            } else {
                // Unmapped (a refusal tolerated) before its range is used again.
                t.orphans.push((m, f.len));
            }
        }
    }

    /// A shadow no guest mapping names any more (its last one left as the server died): its
    /// guest bytes go to the file now.
    fn write_back_unnamed(
        shadows: HashMap<u64, SharedShadow>,
        used: &std::collections::HashSet<u64>,
        drop_kept: &mut Vec<Kept>,
    ) {
        for (id, sh) in shadows {
            if used.contains(&id) {
                continue;
            }
            if let Err(e) = sh.lock().unwrap_or_else(|e| e.into_inner()).sync() {
                log::error!("restart: writing back DAX shadow {id} no mapping names: {e}");
            }
            drop_kept.extend((0..3).map(|p| Kept::DaxShadow(id, p)));
        }
    }

    /// The copy slots' memfd, from a kept frontend mapping of it.
    fn take_slots(&self, fd: &OwnedFd) {
        if self.slots.get().is_some() {
            return;
        }
        match fd
            .try_clone()
            .and_then(|f| Slots::from_memfd(File::from(f), self.size))
        {
            Ok(s) => {
                let _ = self.slots.get_or_init(|| s);
            }
            Err(e) => log::error!("restart: the DAX copy slots' memfd does not fit: {e}"),
        }
    }

    /// Marks (fanotify) the files of the direct mappings taken back, once the host watch
    /// runs (see [`super::host_watch`]).
    pub(super) fn watch_taken_back(&self) {
        let files: Vec<_> = {
            let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            t.live
                .iter()
                .filter(|(_, p)| !p.pooled && p.file_len > 0)
                .filter_map(|(&m, p)| Some((p.file.clone()?, p.owner, m, p.foffset, p.file_len)))
                .collect()
        };
        for (f, owner, m, foffset, len) in files {
            drop(self.host.watch(&f, owner, m, foffset, len));
        }
    }
}
