//! Table bookkeeping: the guest mappings placed in the frontend, the window ranges with a
//! round trip in flight, parked copy slots, the budget of frontend mappings and the device
//! generation. Every method here takes the table lock only for bookkeeping; the round trips
//! they need (unmapping orphans and evicted parked slots) go out with it released.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use super::baseline::PageHashes;
use super::copy::{Churn, CopySig};
use super::tail::Shadow;
use super::{einval, DaxWindow, WindowSink, MAP_ALIGNMENT};
use crate::protocol::mapper::MapRequest;

/// Placements taken out of the table, by window offset.
pub(super) type Taken = Vec<(u64, Placed)>;
/// Window extents `(offset, length)`.
pub(super) type Extents = Vec<(u64, u64)>;

pub(super) type SharedShadow = Arc<Mutex<Shadow>>;

/// One guest mapping as placed in the frontend.
pub(super) struct Placed {
    pub(super) owner: u64,
    pub(super) len: u64,
    pub(super) foffset: u64,
    pub(super) writable: bool,
    /// The mapped file; `None` for a snapshot of a file kept without a descriptor.
    pub(super) file: Option<Arc<File>>,
    /// Bytes `[0, file_len)` of the range are mapped from the file.
    pub(super) file_len: u64,
    /// The rest (or, when `whole`, all of it) from a shadow.
    pub(super) shadow: Option<SharedShadow>,
    pub(super) whole: bool,
    /// Frontend mappings this placement uses.
    pub(super) regions: usize,
    /// A copy slot (the whole range from [`Slots`] at the same offset): what it was copied
    /// from. `file` is the descriptor it is refilled from.
    pub(super) copy: Option<CopySig>,
    /// Served from the pool (the window's one frontend mapping of [`Slots`]): no frontend
    /// mapping of its own. Read-only ones are copies (`copy`); writable ones are merged
    /// with the file at sync points, `Some(agreed length)` of their bytes, what was agreed
    /// kept as page hashes (`pool_pages`, see [`super::baseline`]), and the file's signature
    /// from before the last merge when that merge wrote nothing into it (`pool_sig`;
    /// `None`: the next merge reads the file).
    pub(super) pooled: bool,
    pub(super) pool_agreed: Option<u64>,
    pub(super) pool_pages: Option<Arc<PageHashes>>,
    pub(super) pool_sig: Option<CopySig>,
}

impl Placed {
    /// The request that placed this mapping at window offset `moffset`, reading from `file`
    /// (its kept descriptor): to place it again.
    pub(super) fn request<'a>(&self, moffset: u64, file: &'a File) -> MapRequest<'a> {
        MapRequest {
            owner: self.owner,
            moffset,
            len: self.len,
            fd: file.as_fd(),
            foffset: self.foffset,
            writable: self.writable,
        }
    }

    /// A copy slot holding the range `req` asks for, copied as `sig` says, refilled from
    /// `file`.
    pub(super) fn copy_slot(req: &MapRequest<'_>, file: Option<Arc<File>>, sig: CopySig) -> Self {
        Placed {
            owner: req.owner,
            len: req.len,
            foffset: req.foffset,
            writable: false,
            file,
            file_len: 0,
            shadow: None,
            whole: true,
            regions: 1,
            copy: Some(sig),
            pooled: false,
            pool_agreed: None,
            pool_pages: None,
            pool_sig: None,
        }
    }
}

/// A window range claimed by a request or a merge (see [`DaxWindow::claim`]).
pub(super) struct Busy {
    pub(super) start: u64,
    pub(super) end: u64,
    /// Owners of the placements the claim took out of `live`. They stay counted in
    /// `owners` until the claim ends, so that a sync point of theirs sees them and waits
    /// ([`DaxWindow::wait_claims`]) instead of reporting durable before the claim's merge.
    /// Each with the file range its placement maps (`foffset`, `len`).
    pub(super) owners: Vec<Held>,
    /// The claim only merges bytes with their files (no frontend round trip): a reset or a
    /// clean exit waits for it to end.
    pub(super) merging: bool,
}

/// A placement a claim holds out of the table: its inode and the file bytes it maps.
#[derive(Clone, Copy)]
pub(super) struct Held {
    pub(super) owner: u64,
    pub(super) foffset: u64,
    pub(super) len: u64,
}

impl Held {
    pub(super) fn of(p: &Placed) -> Held {
        Held {
            owner: p.owner,
            foffset: p.foffset,
            len: p.len,
        }
    }

    /// Whether it is `owner`'s (any owner's: `None`) and maps part of file bytes `range`
    /// (all: `None`).
    fn matches(&self, owner: Option<u64>, range: Option<(u64, u64)>) -> bool {
        owner.map_or(true, |o| o == self.owner)
            && range.map_or(true, |(s, e)| {
                self.foffset < e && s < self.foffset.saturating_add(self.len)
            })
    }
}

/// A copy slot the guest removed: still mapped in the frontend, no guest mapping.
pub(super) struct Parked {
    pub(super) len: u64,
    /// Parking order (evicted oldest first).
    pub(super) seq: u64,
}

#[derive(Default)]
pub(super) struct Table {
    pub(super) live: BTreeMap<u64, Placed>,
    /// Window ranges with a frontend round trip or a merge in progress.
    pub(super) busy: Vec<Busy>,
    pub(super) by_owner: HashMap<u64, BTreeSet<u64>>,
    /// Frontend mappings live or reserved for a round trip in progress.
    pub(super) regions: usize,
    pub(super) peak: usize,
    /// Bumped when the frontend dropped every mapping (device reset): round trips that
    /// started before it publish nothing.
    pub(super) gen: u64,
    /// Frontend mappings a round trip placed across a reset: the frontend may have applied
    /// them after its reset. Unmapped (a refusal tolerated) before the range is used again.
    pub(super) orphans: Vec<(u64, u64)>,
    /// Parked copy slots by window offset (never overlapping a live or busy range). Each
    /// holds one frontend mapping, counted in `regions`.
    pub(super) parked: BTreeMap<u64, Parked>,
    pub(super) park_seq: u64,
    /// Guest ranges removed lately (for `--dax-copy=auto`).
    pub(super) churn: Churn,
    /// The generation in which the pool (one frontend mapping of the whole window from
    /// [`Slots`]) was mapped; the pool is in the frontend while this equals `gen`.
    pub(super) pool: Option<u64>,
}

impl Table {
    pub(super) fn insert(&mut self, moffset: u64, p: Placed) {
        self.by_owner.entry(p.owner).or_default().insert(moffset);
        self.live.insert(moffset, p);
    }

    pub(super) fn remove(&mut self, moffset: u64) -> Option<Placed> {
        let p = self.live.remove(&moffset)?;
        if let Some(set) = self.by_owner.get_mut(&p.owner) {
            set.remove(&moffset);
            if set.is_empty() {
                self.by_owner.remove(&p.owner);
            }
        }
        Some(p)
    }

    pub(super) fn is_busy(&self, start: u64, end: u64) -> bool {
        self.busy.iter().any(|b| b.start < end && start < b.end)
    }

    /// Marks `[start, end)` busy (see [`Busy`]).
    pub(super) fn mark_busy(&mut self, start: u64, end: u64, owners: Vec<Held>, merging: bool) {
        self.busy.push(Busy {
            start,
            end,
            owners,
            merging,
        });
    }

    /// Releases the busy range holding `start` (busy ranges never overlap).
    pub(super) fn unbusy(&mut self, start: u64) -> Option<Busy> {
        let i = self
            .busy
            .iter()
            .position(|b| b.start <= start && start < b.end)?;
        Some(self.busy.swap_remove(i))
    }

    pub(super) fn park(&mut self, moffset: u64, len: u64) {
        self.park_seq += 1;
        let seq = self.park_seq;
        self.parked.insert(moffset, Parked { len, seq });
    }

    /// Parked slots overlapping `[start, end)`.
    pub(super) fn parked_overlapping(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        if let Some((&s, p)) = self.parked.range(..start).next_back() {
            if s + p.len > start {
                out.push((s, p.len));
            }
        }
        out.extend(self.parked.range(start..end).map(|(&s, p)| (s, p.len)));
        out
    }
}

/// Inodes with live mappings, sharded so that a request for an unmapped inode takes one
/// small lock that no frontend round trip ever holds.
pub(super) struct Owners([Mutex<HashMap<u64, usize>>; 16]);

impl Owners {
    pub(super) fn new() -> Self {
        Owners(std::array::from_fn(|_| Mutex::new(HashMap::new())))
    }
    pub(super) fn shard(&self, owner: u64) -> MutexGuard<'_, HashMap<u64, usize>> {
        let i = (owner ^ (owner >> 7) ^ (owner >> 17)) as usize % self.0.len();
        self.0[i].lock().unwrap_or_else(|e| e.into_inner())
    }
    pub(super) fn add(&self, owner: u64) {
        *self.shard(owner).entry(owner).or_default() += 1;
    }
    pub(super) fn sub(&self, owner: u64) {
        let mut s = self.shard(owner);
        if let Some(n) = s.get_mut(&owner) {
            *n -= 1;
            if *n == 0 {
                s.remove(&owner);
            }
        }
    }
    pub(super) fn has(&self, owner: u64) -> bool {
        self.shard(owner).contains_key(&owner)
    }
    pub(super) fn clear(&self) {
        for s in &self.0 {
            s.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }
}

impl<S: WindowSink> DaxWindow<S> {
    /// Checks a window range: non-empty, aligned, inside the window.
    pub(super) fn check_range(&self, moffset: u64, len: u64) -> io::Result<u64> {
        if len == 0 {
            return Err(einval("zero length"));
        }
        if moffset % MAP_ALIGNMENT != 0 || len % MAP_ALIGNMENT != 0 {
            return Err(einval("window range not page aligned"));
        }
        match moffset.checked_add(len) {
            Some(end) if end <= self.size => Ok(end),
            _ => Err(einval("range outside the window")),
        }
    }

    /// Live mappings overlapping `[start, end)`; fails if one is not wholly inside it.
    pub(super) fn overlapping(t: &Table, start: u64, end: u64) -> io::Result<Vec<u64>> {
        if let Some((&s, p)) = t.live.range(..start).next_back() {
            if s + p.len > start {
                return Err(einval("range cuts through a live mapping"));
            }
        }
        let mut out = Vec::new();
        for (&s, p) in t.live.range(start..end) {
            if s + p.len > end {
                return Err(einval("range cuts through a live mapping"));
            }
            out.push(s);
        }
        Ok(out)
    }

    pub(super) fn lock(&self) -> io::Result<MutexGuard<'_, Table>> {
        self.table
            .lock()
            .map_err(|_| io::Error::other("mapping table lock poisoned"))
    }

    /// Claims `[moffset, end)`: waits until no round trip is in progress there, takes every
    /// live mapping wholly inside it out of the table and marks the range busy. Returns the
    /// generation and what was taken out (still in the frontend).
    pub(super) fn claim(&self, moffset: u64, end: u64) -> io::Result<(u64, Taken)> {
        self.claim_parked(moffset, end, false)
            .map(|(g, t, _)| (g, t))
    }

    /// Claims `[m, m + len)` and takes every mapping in it out of the frontend, freeing their
    /// share of the budget. Returns the generation and the placement that started at `m`
    /// (for the caller to place again, then release the claim with).
    pub(super) fn claim_off(&self, m: u64, len: u64) -> io::Result<(u64, Option<Placed>)> {
        let (gen, taken) = self.claim(m, m + len)?;
        let mut placed = None;
        let mut freed = 0;
        for (s, p) in taken {
            self.unplace(s, &p);
            freed += p.regions;
            if s == m {
                placed = Some(p);
            }
        }
        self.unreserve(gen, freed);
        Ok((gen, placed))
    }

    /// [`Self::claim`]; with `take_parked`, also takes the parked copy slots overlapping the
    /// range out of the table (the busy range then spans them too) and returns them.
    pub(super) fn claim_parked(
        &self,
        moffset: u64,
        end: u64,
        take_parked: bool,
    ) -> io::Result<(u64, Taken, Extents)> {
        let mut t = self.lock()?;
        let (bstart, bend) = loop {
            let (mut s, mut e) = (moffset, end);
            if take_parked {
                for (ps, pl) in t.parked_overlapping(moffset, end) {
                    s = s.min(ps);
                    e = e.max(ps + pl);
                }
            }
            if !t.is_busy(s, e) {
                break (s, e);
            }
            t = self
                .idle
                .wait(t)
                .map_err(|_| io::Error::other("mapping table lock poisoned"))?;
        };
        let old = Self::overlapping(&t, moffset, end)?;
        let mut parked = Vec::new();
        if take_parked {
            for (ps, pl) in t.parked_overlapping(moffset, end) {
                t.parked.remove(&ps);
                parked.push((ps, pl));
            }
        }
        let mut taken = Vec::with_capacity(old.len());
        for s in old {
            if let Some(p) = t.remove(s) {
                taken.push((s, p));
            }
        }
        let owners = taken.iter().map(|(_, p)| Held::of(p)).collect();
        t.mark_busy(bstart, bend, owners, false);
        let mut orphans = Vec::new();
        t.orphans.retain(|&(s, l)| {
            let hit = s < end && moffset < s + l;
            if hit {
                orphans.push((s, l));
            }
            !hit
        });
        let gen = t.gen;
        drop(t);
        for (s, l) in orphans {
            if let Err(e) = self.with_sink(|k| k.unmap(s, l)) {
                log::debug!("SHMEM_UNMAP of orphan {s:#x}+{l:#x}: {e} (the reset removed it)");
            }
        }
        Ok((gen, taken, parked))
    }

    /// Ends a claim: publishes `placed` if the frontend still has it (same generation).
    pub(super) fn release(&self, gen: u64, moffset: u64, placed: Option<Placed>, freed: usize) {
        self.release_all(gen, moffset, placed.map(|p| (moffset, p)), freed);
    }

    /// Ends the claim holding `moffset`: publishes `placed` (each at its window offset) if
    /// the frontend still has them (same generation), and ends the claim's hold on the owners
    /// it took out. Across a reset, pooled bytes are settled (written back, or kept when
    /// that fails) and freed, anything else left for the frontend to have dropped.
    pub(super) fn release_all(
        &self,
        gen: u64,
        moffset: u64,
        placed: impl IntoIterator<Item = (u64, Placed)>,
        freed: usize,
    ) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let mut stale = Vec::new();
        if t.gen == gen {
            t.regions = t.regions.saturating_sub(freed);
            for (m, p) in placed {
                self.owners.add(p.owner);
                self.note_agreed(&p);
                t.insert(m, p);
            }
        } else {
            for (m, p) in placed {
                log::warn!("DAX mapping {m:#x} completed across a device reset: dropped");
                if p.pooled {
                    // Nothing of its own in the frontend; its bytes are settled below.
                    stale.push((m, p));
                    continue;
                }
                self.forget_direct(m);
                if p.file_len > 0 {
                    t.orphans.push((m, p.file_len));
                }
                if p.file_len < p.len {
                    t.orphans.push((m + p.file_len, p.len - p.file_len));
                }
            }
        }
        if !stale.is_empty() {
            drop(t);
            for (m, p) in stale {
                self.settle(m, &p);
                self.free_pooled(m, &p);
            }
            t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        }
        self.end_claim(t, gen, moffset);
    }

    /// Unmarks the busy range holding `moffset` and, in the same generation, ends its hold on
    /// the owners it took out (added back first by the caller where republished); wakes the
    /// waiters.
    fn end_claim(&self, mut t: MutexGuard<'_, Table>, gen: u64, moffset: u64) {
        if let Some(b) = t.unbusy(moffset) {
            if t.gen == gen {
                for h in b.owners {
                    self.owners.sub(h.owner);
                }
            }
        }
        drop(t);
        self.idle.notify_all();
    }

    /// Ends a claim that parks copy slots (still in the frontend, still counted): they stay
    /// parked if the frontend still has them (same generation).
    pub(super) fn release_parking(
        &self,
        gen: u64,
        moffset: u64,
        freed: usize,
        park: &[(u64, u64)],
    ) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if t.gen == gen {
            t.regions = t.regions.saturating_sub(freed);
            for &(s, l) in park {
                t.park(s, l);
            }
        }
        self.end_claim(t, gen, moffset);
    }

    /// Claims the live placement at `m` alone, however long it is now, for a merge or a
    /// refresh that puts it back ([`Self::release`]): `None` when nothing is mapped at `m`.
    /// Unlike [`Self::claim`] it never takes out a neighbour the guest mapped since the
    /// caller looked.
    pub(super) fn claim_one(&self, m: u64) -> Option<(u64, Placed)> {
        let mut t = self.table.lock().ok()?;
        let len = loop {
            let len = t.live.get(&m)?.len;
            if !t.is_busy(m, m + len) {
                break len;
            }
            t = self.idle.wait(t).ok()?;
        };
        let p = t.remove(m)?;
        t.mark_busy(m, m + len, vec![Held::of(&p)], true);
        Some((t.gen, p))
    }

    /// Claims `[s, e)` only if nothing is live or busy there: `None` otherwise.
    pub(super) fn claim_empty(&self, s: u64, e: u64) -> Option<u64> {
        let mut t = self.table.lock().ok()?;
        let live = t
            .live
            .range(..e)
            .next_back()
            .is_some_and(|(&m, p)| m + p.len > s);
        if live || t.is_busy(s, e) {
            return None;
        }
        t.mark_busy(s, e, Vec::new(), true);
        Some(t.gen)
    }

    /// Waits until no claim holds a placement of `owner` (of any owner: `None`) mapping part
    /// of file bytes `range` (any: `None`) out of the table, or, with `merges_only`, until no
    /// merge is in progress at all.
    pub(super) fn wait_claims(
        &self,
        owner: Option<u64>,
        range: Option<(u64, u64)>,
        merges_only: bool,
    ) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let held = |t: &Table| {
            t.busy.iter().any(|b| {
                if merges_only {
                    b.merging
                } else {
                    b.owners.iter().any(|h| h.matches(owner, range))
                }
            })
        };
        while held(&t) {
            t = self.idle.wait(t).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Reserves `n` frontend mappings for a new guest mapping. More than one is granted only
    /// while every guest range ([`DaxWindow::ranges`]) not yet mapped keeps one mapping in reserve.
    /// Parked copy slots are unmapped (oldest first) to make room.
    pub(super) fn reserve(&self, gen: u64, n: usize) -> bool {
        loop {
            let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            if t.gen != gen {
                return false;
            }
            let guest = t.live.len() + t.busy.len();
            let headroom = if n > 1 {
                self.ranges().saturating_sub(guest)
            } else {
                0
            };
            if t.regions + n + headroom <= self.budget() {
                t.regions += n;
                t.peak = t.peak.max(t.regions);
                return true;
            }
            let victim = t
                .parked
                .iter()
                .filter(|(&s, p)| !t.is_busy(s, s + p.len))
                .min_by_key(|(_, p)| p.seq)
                .map(|(&s, p)| (s, p.len));
            let Some((s, l)) = victim else {
                return false;
            };
            t.parked.remove(&s);
            t.mark_busy(s, s + l, Vec::new(), false);
            drop(t);
            self.unmap_parked(gen, s, l);
            self.counters.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(super) fn unreserve(&self, gen: u64, n: usize) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if t.gen == gen {
            t.regions = t.regions.saturating_sub(n);
        }
    }

    /// Unmaps a parked copy slot taken out of the table (its range marked busy by the
    /// caller) and gives its frontend mapping back to the budget.
    pub(super) fn unmap_parked(&self, gen: u64, s: u64, l: u64) {
        self.drop_parked(gen, s, l);
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        self.end_claim(t, gen, s);
    }

    /// Takes a parked slot out of the frontend (or leaves it as an orphan while paused) and
    /// frees its pages. No busy bookkeeping.
    pub(super) fn drop_parked(&self, gen: u64, s: u64, l: u64) {
        if self.running.load(Ordering::SeqCst) {
            if let Err(e) = self.with_sink(|k| k.unmap(s, l)) {
                log::warn!("SHMEM_UNMAP of parked copy slot {s:#x}+{l:#x}: {e}");
            }
        } else {
            let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            if t.gen == gen {
                t.orphans.push((s, l));
            }
        }
        self.free_slot(s, l);
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if t.gen == gen {
            t.regions = t.regions.saturating_sub(1);
        }
    }

    /// Empties the table (new generation); returns what was in it, the parked copy slots and
    /// whether the pool was in the frontend. `reset`: the frontend dropped every mapping,
    /// orphans included.
    pub(super) fn drain(&self, reset: bool) -> (Taken, Extents, bool) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let pool = t.pool.take() == Some(t.gen);
        t.gen += 1;
        t.regions = 0;
        if reset {
            t.orphans.clear();
        }
        t.by_owner.clear();
        self.owners.clear();
        let parked = std::mem::take(&mut t.parked)
            .into_iter()
            .map(|(s, p)| (s, p.len))
            .collect();
        (
            std::mem::take(&mut t.live).into_iter().collect(),
            parked,
            pool,
        )
    }

    /// Requests waiting for the frontend's reply to a SHMEM request (the window ranges busy
    /// with a round trip).
    pub fn round_trips_in_flight(&self) -> usize {
        self.table.lock().map(|t| t.busy.len()).unwrap_or(0)
    }
}
