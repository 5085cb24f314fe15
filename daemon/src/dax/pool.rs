//! The pool: a window with more guest ranges than the budget is one frontend mapping of the
//! copy memfd ([`super::copy::Slots`]), every guest mapping a copy in it (see
//! [`DaxWindow::pooled`]), writable ones merged back into their files at the sync points.

use std::io;
use std::sync::atomic::Ordering;

use super::copy::{CopySig, Slots};
use super::placement::Source;
use super::table::Placed;
use super::tail;
use super::{eio, DaxWindow, WindowSink};
use crate::protocol::mapper::MapRequest;

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
        let r = self
            .slots()
            .and_then(|slots| self.with_sink(|s| s.map(0, self.size, slots.fd(), 0, true)));
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
        let sig = CopySig::of(src.file)?;
        let slots = self.slots()?;
        let copied = slots
            .fill(moffset, len, src.file, req.foffset)
            .map_err(|e| {
                log::error!("copying a file range into the DAX pool at {moffset:#x}: {e}");
                eio()
            })?;
        let pool_agreed = if writable {
            self.agreed()
                .and_then(|a| a.copy_from(slots, moffset, len))
                .map_err(|e| {
                    log::error!("keeping the agreed bytes of pooled range {moffset:#x}: {e}");
                    eio()
                })?;
            Some(copied)
        } else {
            None
        };
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
            pool_sig: Some(sig),
        }))
    }

    /// The agreed bytes of writable pooled ranges (made on first use: the window's size at
    /// most).
    pub(super) fn agreed(&self) -> io::Result<&Slots> {
        if let Some(s) = self.agreed.get() {
            return Ok(s);
        }
        let s = Slots::named(c"daxfsd-pool-agreed", self.size)?;
        Ok(self.agreed.get_or_init(|| s))
    }

    /// Merges a writable pooled range with its file (three ways, as a shadow); returns the
    /// new agreed length and the file's signature for the next merge to trust (if any),
    /// `None` when there is nothing to merge or it failed (logged).
    pub(super) fn merge_pooled(&self, m: u64, p: &Placed) -> Option<(u64, Option<CopySig>)> {
        let old = p.pool_agreed?;
        let f = p.file.as_ref()?;
        let (slots, agreed) = (self.slots.get()?, self.agreed.get()?);
        let r = tail::merge(
            tail::Span {
                file: slots.file(),
                at: m,
            },
            Some(tail::Span {
                file: agreed.file(),
                at: m,
            }),
            old,
            p.len,
            tail::Span {
                file: f,
                at: p.foffset,
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
                Some((valid, sig))
            }
            Err(e) => {
                log::error!("merging pooled DAX range {m:#x} with its file failed: {e}");
                None
            }
        }
    }

    /// Frees a pooled range's bytes (it left the table; already written back).
    pub(super) fn free_pooled(&self, m: u64, p: &Placed) {
        self.free_slot(m, p.len);
        if p.pool_agreed.is_some() {
            if let Some(a) = self.agreed.get() {
                if let Err(e) = a.zero(m, p.len) {
                    log::debug!("freeing pooled agreed bytes {m:#x}: {e}");
                }
            }
        }
    }

    /// Merges `owner`'s writable pooled ranges (or every one) with their files.
    pub(super) fn sync_pooled(&self, owner: Option<u64>) {
        let cands: Vec<(u64, u64)> = {
            let Ok(t) = self.table.lock() else { return };
            let pick = |m: &u64| {
                let p = t.live.get(m)?;
                p.pool_agreed.map(|_| (*m, p.len))
            };
            match owner {
                Some(o) => match t.by_owner.get(&o) {
                    Some(set) => set.iter().filter_map(pick).collect(),
                    None => return,
                },
                None => t.live.keys().filter_map(pick).collect(),
            }
        };
        for (m, len) in cands {
            let Ok((gen, taken)) = self.claim(m, m + len) else {
                continue;
            };
            let mut placed = None;
            for (s, mut p) in taken {
                if s == m && placed.is_none() {
                    if let Some((v, sig)) = self.merge_pooled(m, &p) {
                        p.pool_agreed = Some(v);
                        p.pool_sig = sig;
                    }
                    placed = Some(p);
                } else {
                    self.unplace(s, &p);
                    self.unreserve(gen, p.regions);
                }
            }
            self.release(gen, m, placed, 0);
        }
    }
}
