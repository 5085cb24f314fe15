//! The pool: a window with more guest ranges than the budget is one frontend mapping of the
//! copy memfd ([`super::copy::Slots`]), every guest mapping a copy in it (see
//! [`DaxWindow::pooled`]), writable ones merged back into their files at the sync points.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::baseline::PageHashes;
use super::copy::{CopySig, Slots};
use super::placement::Source;
use super::stranded::errno_of;
use super::table::Placed;
use super::tail;
use super::{eio, DaxWindow, WindowSink, MAP_ALIGNMENT};
use crate::protocol::mapper::MapRequest;

/// The bytes of a pooled range one claim merges at a time in a whole pass.
pub(super) const MERGE_PART: u64 = 2 << 20;

/// What [`DaxWindow::merge_pooled_part`] did: the range's agreed length, the file's signature
/// from before it when it wrote nothing, and whether it merged the whole range.
pub(super) struct Merged {
    pub(super) agreed: u64,
    pub(super) sig: Option<CopySig>,
    pub(super) whole: bool,
}

impl<S: WindowSink> DaxWindow<S> {
    /// Whether a new guest mapping goes to the pool (see [`DaxWindow::pooled`]).
    pub(super) fn use_pool(&self) -> bool {
        self.pooled()
    }

    /// Puts the pool (the whole window from [`Slots`], writable) into the frontend if it is
    /// not there yet. `Ok(false)`: it cannot be, the window holds frontend mappings of its
    /// own (the guest started mapping smaller ranges after some were placed).
    pub(super) fn ensure_pool(&self, gen: u64) -> io::Result<bool> {
        let _one = self.pool_lock.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut t = self.lock()?;
            if t.gen != gen {
                return Err(eio());
            }
            if t.pool == Some(gen) {
                return Ok(true);
            }
            if t.regions > 0 {
                return Ok(false);
            }
            t.regions += 1;
            t.peak = t.peak.max(t.regions);
        }
        let r = self.slots().and_then(|slots| {
            if self.pool_unsure.swap(false, Ordering::Relaxed) {
                // A server before this one died waiting for this map's reply: QEMU may have
                // it (and refuses an overlapping map) or not (and refuses the unmap).
                if let Err(e) = self.with_sink(|s| s.unmap(0, self.size)) {
                    log::debug!("SHMEM_UNMAP of a DAX pool that may not be mapped: {e}");
                }
            }
            self.keep_pool(slots, false);
            self.with_sink(|s| s.map(0, self.size, slots.fd(), 0, true))
                .inspect(|_| self.keep_pool(slots, true))
        });
        let mut t = self.lock()?;
        match r {
            Ok(()) if t.gen == gen => {
                t.pool = Some(gen);
                drop(t);
                log::info!(
                    "DAX pool in the frontend: the {} MiB window is one mapping of the copy memfd",
                    self.size >> 20
                );
                Ok(true)
            }
            Ok(()) => {
                // The device was reset meanwhile: the frontend may have applied it after.
                t.orphans.push((0, self.size));
                Err(eio())
            }
            Err(e) => {
                if t.gen == gen {
                    t.regions = t.regions.saturating_sub(1);
                }
                drop(t);
                log::error!("SHMEM_MAP of the DAX pool failed: {e}");
                Err(eio())
            }
        }
    }

    /// Places a guest mapping in the pool: a copy of its file range at the same offset of
    /// [`Slots`]. `Ok(None)`: the pool cannot be put into the frontend now (see
    /// [`Self::ensure_pool`]); the caller places it directly.
    pub(super) fn place_pooled(
        &self,
        gen: u64,
        req: &MapRequest<'_>,
        src: &Source<'_>,
    ) -> io::Result<Option<Placed>> {
        let (moffset, len, writable) = (req.moffset, req.len, req.writable);
        if !self.ensure_pool(gen)? {
            return Ok(None);
        }
        // Guest stores of this file range that an earlier write-back could not write are
        // the guest's view of it, not the file's bytes.
        let mut stranded = if writable {
            self.unstrand(src.key, req.foffset, len)
        } else {
            None
        };
        let filled = (|| {
            let sig = CopySig::of(src.file)?;
            let slots = self.slots()?;
            let copied = slots
                .fill(moffset, len, src.file, req.foffset)
                .inspect_err(|e| {
                    log::error!("copying a file range into the DAX pool at {moffset:#x}: {e}")
                })?;
            if !writable {
                return Ok((sig, None, Some(sig)));
            }
            match stranded.take() {
                Some(s) => self
                    .overlay_stranded(s, moffset)
                    .map(|(valid, pages)| (sig, Some((valid, pages)), None))
                    .inspect_err(|e| {
                        log::error!("taking stranded bytes into pooled range {moffset:#x}: {e}")
                    }),
                None => PageHashes::of(slots.file(), moffset, copied, len)
                    .map(|pages| (sig, Some((copied, pages)), Some(sig)))
                    .inspect_err(|e| {
                        log::error!("keeping the agreed pages of pooled range {moffset:#x}: {e}")
                    }),
            }
        })();
        if let Some(s) = stranded {
            // Not taken over: they stay stranded.
            self.strand(s.owner, s.key, s.foffset, s.len, s.shadow);
        }
        let (sig, agreed, pool_sig) = filled.map_err(|_| eio())?;
        let (pool_agreed, pool_pages) = agreed.map_or((None, None), |(v, h)| {
            (Some(v), Some(Arc::new(self.kept_hashes(moffset, h))))
        });
        self.counters.pooled.fetch_add(1, Ordering::Relaxed);
        Ok(Some(Placed {
            owner: req.owner,
            len,
            foffset: req.foffset,
            writable,
            file: src.keep.clone(),
            file_len: 0,
            shadow: None,
            whole: true,
            regions: 0,
            copy: if writable { None } else { Some(sig) },
            pooled: true,
            pool_agreed,
            pool_pages,
            pool_sig,
        }))
    }

    /// Host memory the pool holds: the pages of its memfds (see [`super::DaxStats`]).
    pub(super) fn pool_held(&self) -> u64 {
        let blocks = |s: Option<&Slots>| {
            s.and_then(|s| crate::sys::fstat(s.fd()).ok())
                .map_or(0, |st| st.st_blocks.max(0) as u64 * 512)
        };
        let pages: u64 = self.table.lock().map_or(0, |t| {
            t.live
                .values()
                .filter_map(|p| p.pool_pages.as_ref())
                .map(|h| h.bytes())
                .sum()
        });
        blocks(self.slots.get()) + pages
    }

    /// Merges a writable pooled range with its file (three ways, as a shadow); returns the
    /// new agreed length and the file's signature for the next merge to trust (if any),
    /// `None` when there is nothing to merge. A failure is logged and recorded against the
    /// range's inode (the next FSYNC, FLUSH and SYNCFS report it); the range keeps its bytes.
    pub(super) fn merge_pooled(
        &self,
        m: u64,
        p: &Placed,
    ) -> io::Result<Option<(u64, Option<CopySig>)>> {
        Ok(self
            .merge_pooled_part(m, p, 0, p.len)?
            .map(|r| (r.agreed, r.sig)))
    }

    /// [`Self::merge_pooled`] of bytes `[a, b)` of the range only (page aligned): the rest of
    /// the range is not read. A part is merged only while the file's size leaves the range's
    /// agreed length as it is; otherwise the whole range is (`Merged::whole`). The file's
    /// signature from the last whole merge (`pool_sig`) still vouches for the bytes of a part
    /// (any change of the file since, the merge's own writes included, moves it), so a part
    /// whose file is unchanged is merged without reading the file; only a whole merge or a
    /// whole pass ([`Self::merge_at`]) may set a new one.
    pub(super) fn merge_pooled_part(
        &self,
        m: u64,
        p: &Placed,
        a: u64,
        b: u64,
    ) -> io::Result<Option<Merged>> {
        let (Some(old), Some(pages), Some(f)) = (p.pool_agreed, &p.pool_pages, p.file.as_ref())
        else {
            return Ok(None);
        };
        let Some(slots) = self.slots.get() else {
            return Ok(None);
        };
        let b = b.min(p.len);
        let part = (a > 0 || b < p.len)
            && a < b
            && super::file_size(f)
                .is_ok_and(|size| size.saturating_sub(p.foffset).min(p.len) == old);
        let (a, b) = if part { (a, b) } else { (0, p.len) };
        let r = tail::merge(
            tail::Span {
                file: slots.file(),
                at: m + a,
            },
            Some(tail::Agreed::Pages(pages, a)),
            old.saturating_sub(a).min(b - a),
            b - a,
            tail::Span {
                file: f,
                at: p.foffset + a,
            },
            true,
            p.pool_sig,
        );
        match r {
            Ok((r, valid, sig)) => {
                self.counters
                    .written_back
                    .fetch_add(r.written, Ordering::Relaxed);
                self.counters.pulled.fetch_add(r.pulled, Ordering::Relaxed);
                if r.conflicts > 0 {
                    self.counters
                        .conflicts
                        .fetch_add(r.conflicts, Ordering::Relaxed);
                    log::warn!(
                        "DAX: {} page(s) of pooled range {m:#x} (inode {}) changed on both the guest and the host since the last write-back: the guest's pages were written whole",
                        r.conflicts,
                        p.owner
                    );
                }
                self.written_back(p.owner);
                Ok(Some(Merged {
                    agreed: if part { old } else { valid },
                    sig,
                    whole: !part,
                }))
            }
            Err(e) => {
                log::error!(
                    "writing pooled DAX range {m:#x} (inode {}) back to its file failed: {e}",
                    p.owner
                );
                self.counters.wb_failures.fetch_add(1, Ordering::Relaxed);
                self.wb.record(p.owner, errno_of(&e));
                Err(e)
            }
        }
    }

    /// Frees a pooled range's bytes (it left the table; already written back).
    pub(super) fn free_pooled(&self, m: u64, p: &Placed) {
        self.forget_placed(m);
        self.free_slot(m, p.len);
    }

    /// Merges `owner`'s writable pooled ranges (or every one) with their files; with
    /// `range`, only those mapping part of file bytes `[start, end)`. A range the guest
    /// remapped meanwhile is left as it is (its removal settled it).
    pub(super) fn sync_pooled(&self, owner: Option<u64>, range: Option<(u64, u64)>) {
        let cands: Vec<u64> = {
            let Ok(t) = self.table.lock() else { return };
            let pick = |m: &u64| {
                let p = t.live.get(m)?;
                p.pool_agreed?;
                let hit = range.map_or(true, |(s, e)| {
                    p.foffset < e && s < p.foffset.saturating_add(p.len)
                });
                hit.then_some(*m)
            };
            match owner {
                Some(o) => match t.by_owner.get(&o) {
                    Some(set) => set.iter().filter_map(pick).collect(),
                    None => return,
                },
                None => t.live.keys().filter_map(pick).collect(),
            }
        };
        for m in cands {
            self.merge_at(m, owner, range);
        }
    }

    /// Merges the writable pooled range mapped at `m` now (`owner`'s only, if given) with its
    /// file; with `range`, only its pages holding file bytes `[start, end)`. What the guest
    /// mapped at `m` may differ from what the caller saw: only the placement at `m` is
    /// claimed, whatever its length, and no neighbour is touched. A whole range longer than
    /// [`MERGE_PART`] is merged a part at a time, each under a claim of its own, so a request
    /// for the inode waits for one part at most, not for a 64 MiB range.
    pub(super) fn merge_at(&self, m: u64, owner: Option<u64>, range: Option<(u64, u64)>) {
        let Some((gen, mut p)) = self.claim_one(m) else {
            return;
        };
        let mine = owner.map_or(true, |o| o == p.owner) && p.pool_agreed.is_some();
        let (a, b) = match range {
            None => (0, p.len),
            Some((s, e)) => (
                s.saturating_sub(p.foffset) / MAP_ALIGNMENT * MAP_ALIGNMENT,
                e.saturating_sub(p.foffset).next_multiple_of(MAP_ALIGNMENT),
            ),
        };
        if !mine || a >= b.min(p.len) {
            self.release(gen, m, Some(p), 0);
            return;
        }
        if range.is_some() || p.len <= MERGE_PART {
            if let Ok(Some(r)) = self.merge_pooled_part(m, &p, a, b) {
                if r.whole {
                    p.pool_agreed = Some(r.agreed);
                    p.pool_sig = r.sig;
                }
            }
            self.release(gen, m, Some(p), 0);
            return;
        }
        // The whole range, part by part. Taken before any part reads the file: when no part
        // wrote, the agreed bytes are the file's as of this signature.
        let (Some(f), foffset, len) = (p.file.clone(), p.foffset, p.len) else {
            self.release(gen, m, Some(p), 0);
            return;
        };
        let start_sig = CopySig::of(&f).ok();
        let mut clean = true;
        let mut held = Some((gen, p));
        let mut a = 0;
        loop {
            let (gen, mut p) = match held.take() {
                Some(h) => h,
                None => match self.claim_one(m) {
                    Some(h) => h,
                    None => return,
                },
            };
            let same = p.pool_agreed.is_some()
                && p.foffset == foffset
                && p.len == len
                && p.file.as_ref().is_some_and(|x| Arc::ptr_eq(x, &f));
            if !same {
                // Remapped meanwhile: its removal settled it.
                self.release(gen, m, Some(p), 0);
                return;
            }
            let b = (a + MERGE_PART).min(len);
            match self.merge_pooled_part(m, &p, a, b) {
                Ok(Some(r)) if r.whole => {
                    // The file's size moved: the whole range was merged at once.
                    p.pool_agreed = Some(r.agreed);
                    p.pool_sig = r.sig;
                    self.release(gen, m, Some(p), 0);
                    return;
                }
                Ok(Some(r)) => clean &= r.sig.is_some(),
                Ok(None) => {}
                Err(_) => {
                    self.release(gen, m, Some(p), 0);
                    return;
                }
            }
            a = b;
            if a >= len {
                p.pool_sig = if clean { start_sig } else { None };
                self.release(gen, m, Some(p), 0);
                return;
            }
            self.release(gen, m, Some(p), 0);
        }
    }

    /// Returns the pool's pages outside every guest mapping to the host: a guest may store
    /// anywhere in the window it maps (the pool is one frontend mapping of all of it), and
    /// pages of ranges it never mapped, or that were freed, would otherwise stay allocated.
    pub(super) fn trim_pool(&self) {
        let Some(slots) = self.slots.get() else {
            return;
        };
        let gaps: Vec<(u64, u64)> = {
            let Ok(t) = self.table.lock() else { return };
            if t.pool != Some(t.gen) {
                return;
            }
            let mut gaps = Vec::new();
            let mut at = 0;
            let mut taken: Vec<(u64, u64)> = t.live.iter().map(|(&m, p)| (m, m + p.len)).collect();
            taken.extend(t.busy.iter().map(|b| (b.start, b.end)));
            taken.sort_unstable();
            for (s, e) in taken {
                if s > at {
                    gaps.push((at, s));
                }
                at = at.max(e);
            }
            if at < self.size {
                gaps.push((at, self.size));
            }
            gaps
        };
        for (s, e) in gaps {
            if !slots.has_data(s, e) {
                continue;
            }
            let Some(gen) = self.claim_empty(s, e) else {
                continue;
            };
            if let Err(err) = slots.zero(s, e - s) {
                log::debug!(
                    "returning unmapped DAX pool pages {s:#x}+{:#x}: {err}",
                    e - s
                );
            }
            self.release(gen, s, None, 0);
        }
    }
}
