//! Coherence with the request path: shadows written back, mappings re-placed when their
//! file's page layout changed, copy slots re-read when their file moved, periodically and
//! at the hooks of [`Coherence`].

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::coherent::Coherence;
use super::copy::CopySig;
use super::placement::{Plan, Source};
use super::stranded::errno_of;
use super::table::SharedShadow;
use super::tail;
use super::{file_size, DaxWindow, WindowSink};

impl<S: WindowSink> DaxWindow<S> {
    /// Writes every shadow back every `period` until the window is dropped.
    pub fn spawn_writeback(self: &Arc<Self>, period: Duration)
    where
        S: 'static,
    {
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("dax-writeback".into())
            .spawn(move || {
                // Signals are for the threads that wait for them (SIGUSR1, SIGTERM): a
                // thread with them unblocked would take their default action instead.
                // SAFETY: `all` is initialised by sigfillset; this changes only this
                // thread's mask.
                unsafe {
                    let mut all: libc::sigset_t = std::mem::zeroed();
                    libc::sigfillset(&mut all);
                    libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
                }
                loop {
                    // A timed condvar wait (futex) rather than a sleep: the seccomp allowlist
                    // has futex for every lock already.
                    let (m, cv) = (Mutex::new(()), Condvar::new());
                    let g = m.lock().unwrap_or_else(|e| e.into_inner());
                    drop(cv.wait_timeout(g, period));
                    match weak.upgrade() {
                        Some(w) => w.sync_all(),
                        None => return,
                    }
                }
            });
        if let Err(e) = spawned {
            log::error!("cannot start the DAX write-back thread: {e}");
        }
    }

    /// Merges a shadow with its file, counting what moved. A failure of a writable shadow
    /// is a write-back error of `owner` (recorded, so its next FSYNC, FLUSH and SYNCFS report
    /// it); the shadow keeps the guest's bytes for the next sync.
    pub(super) fn sync_shadow(&self, s: &SharedShadow, owner: Option<u64>) -> io::Result<()> {
        let mut g = s.lock().unwrap_or_else(|e| e.into_inner());
        match g.sync() {
            Ok(r) => {
                self.counters
                    .written_back
                    .fetch_add(r.written, Ordering::Relaxed);
                self.counters.pulled.fetch_add(r.pulled, Ordering::Relaxed);
                let wrote = g.writable();
                drop(g);
                if let (true, Some(o)) = (wrote, owner) {
                    self.written_back(o);
                }
                Ok(())
            }
            Err(e) => {
                log::error!("syncing a DAX shadow with its file failed: {e}");
                if g.writable() {
                    self.counters.wb_failures.fetch_add(1, Ordering::Relaxed);
                    if let Some(o) = owner {
                        self.wb.record(o, errno_of(&e));
                    }
                }
                Err(e)
            }
        }
    }

    /// Shadows of `owner`'s mappings.
    pub(super) fn shadows_of(&self, owner: u64) -> Vec<SharedShadow> {
        let Ok(t) = self.table.lock() else {
            return Vec::new();
        };
        let mut out: Vec<SharedShadow> = Vec::new();
        if let Some(set) = t.by_owner.get(&owner) {
            for m in set {
                if let Some(s) = t.live.get(m).and_then(|p| p.shadow.clone()) {
                    if !out.iter().any(|o| Arc::ptr_eq(o, &s)) {
                        out.push(s);
                    }
                }
            }
        }
        out
    }

    /// Re-places `owner`'s mappings whose page layout no longer matches the file.
    pub(super) fn relayout(&self, owner: u64) {
        let stale: Vec<(u64, u64)> = {
            let Ok(t) = self.table.lock() else { return };
            let Some(set) = t.by_owner.get(&owner) else {
                return;
            };
            // Every mapping of an owner maps the same inode (through its own descriptor):
            // one fstat for all of them, however many ranges the guest maps.
            let mut size: Option<Option<u64>> = None;
            set.iter()
                .filter_map(|m| {
                    let p = t.live.get(m)?;
                    if p.whole {
                        return None;
                    }
                    let f = p.file.as_ref()?;
                    let size = *size.get_or_insert_with(|| file_size(f).ok());
                    let size = size?;
                    (tail::layout(size, p.foffset, p.len).0 != p.file_len).then_some((*m, p.len))
                })
                .collect()
        };
        for (m, len) in stale {
            let Ok((gen, placed)) = self.claim_off(m, len) else {
                continue;
            };
            let np = placed.and_then(|p| {
                let f = p.file.clone()?;
                let key = crate::sys::fstat(f.as_fd())
                    .map(|st| (st.st_dev, st.st_ino))
                    .ok()?;
                let r = self.place(gen, &p.request(m, &f), &Source::kept(&f, key), Plan::Direct);
                match r {
                    Ok(np) => {
                        self.counters.replaced.fetch_add(1, Ordering::Relaxed);
                        Some(np)
                    }
                    Err(e) => {
                        // The guest's mapping is gone from the frontend: its next access
                        // faults there instead of reading stale data.
                        log::error!(
                            "re-placing DAX mapping {m:#x} after a size change failed: {e}"
                        );
                        self.counters.failures.fetch_add(1, Ordering::Relaxed);
                        None
                    }
                }
            });
            if let Some(p) = &np {
                self.keep_placed(m, p);
            }
            self.release(gen, m, np, 0);
        }
    }

    /// Re-reads copy slots whose file changed since the copy (size, mtime or ctime moved):
    /// `owner`'s, or every live one. With `force` (a file range the request path just wrote),
    /// the slots of `owner` overlapping it are re-read whatever the timestamps say.
    pub(super) fn recopy(&self, owner: Option<u64>, force: Option<(u64, u64)>) {
        let cands: Vec<(u64, u64, u64, u64, Arc<File>, CopySig)> = {
            let Ok(t) = self.table.lock() else { return };
            let pick = |m: &u64| {
                let p = t.live.get(m)?;
                let sig = p.copy?;
                Some((*m, p.owner, p.len, p.foffset, p.file.clone()?, sig))
            };
            match owner {
                Some(o) => match t.by_owner.get(&o) {
                    Some(set) => set.iter().filter_map(pick).collect(),
                    None => return,
                },
                None => t.live.keys().filter_map(pick).collect(),
            }
        };
        // One fstat per owner (its mappings all map the same inode), not one per copy.
        let mut sigs: HashMap<u64, Option<CopySig>> = HashMap::new();
        for (m, owner, len, foffset, f, sig) in cands {
            let forced = force.is_some_and(|(s, e)| s < foffset.saturating_add(len) && foffset < e);
            let now = *sigs.entry(owner).or_insert_with(|| CopySig::of(&f).ok());
            if !forced && CopySig::unchanged(Some(sig), now) {
                continue;
            }
            if force.is_some() && !forced {
                // The file moved because of the request path's own write, elsewhere: this
                // copy's bytes did not change (the request was checked against the file
                // just before it). Take the new timestamps without re-reading now; they are
                // from this clock tick, so they prove nothing later (a host write in the same
                // tick would hide behind them) and the next sync point re-reads the copy once.
                if let (Some(now), Ok(mut t)) = (now, self.table.lock()) {
                    if let Some(p) = t.live.get_mut(&m) {
                        if p.copy == Some(sig)
                            && p.file.as_ref().is_some_and(|x| Arc::ptr_eq(x, &f))
                        {
                            p.copy = Some(now);
                        }
                    }
                }
                continue;
            }
            let Some((gen, mut p)) = self.claim_one(m) else {
                continue;
            };
            // Re-placed meanwhile (another file, no longer a copy): put back as it is.
            let same = p.copy.is_some() && p.file.as_ref().is_some_and(|x| Arc::ptr_eq(x, &f));
            if same {
                match self.fill_slot(m, p.len, &f, p.foffset) {
                    Ok(sig) => {
                        p.copy = Some(sig);
                        self.counters.recopied.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => log::error!("refreshing DAX copy slot {m:#x}: {e}"),
                }
            }
            self.release(gen, m, Some(p), 0);
        }
    }

    /// Every shadow the table's placements use, each with the owner of one of them.
    fn all_shadows(&self) -> Vec<(SharedShadow, Option<u64>)> {
        let Ok(t) = self.table.lock() else {
            return Vec::new();
        };
        let mut out: Vec<(SharedShadow, Option<u64>)> = Vec::new();
        for p in t.live.values() {
            if let Some(s) = &p.shadow {
                if !out.iter().any(|(o, _)| Arc::ptr_eq(o, s)) {
                    out.push((s.clone(), Some(p.owner)));
                }
            }
        }
        out
    }
}

impl<S: WindowSink> DaxWindow<S> {
    /// Whether a sync point of `owner` has work: mappings (or a claim holding them), or a
    /// write-back error or stranded bytes of its own.
    fn has_work(&self, owner: u64) -> bool {
        self.owners.has(owner) || self.wb.has(owner)
    }

    /// [`Coherence::sync`], limited for pooled ranges to those mapping part of `range`.
    fn sync_owner(&self, owner: u64, range: Option<(u64, u64)>) {
        if !self.has_work(owner) {
            return;
        }
        // A merge or a round trip holding the inode's placements ends first: its bytes
        // count for this sync point.
        self.wait_claims(Some(owner), range, false);
        for s in self.shadows_of(owner) {
            let _ = self.sync_shadow(&s, Some(owner));
        }
        self.retry_stranded(Some(owner));
        self.sync_pooled(Some(owner), range);
        self.relayout(owner);
        self.recopy(Some(owner), None);
    }
}

impl<S: WindowSink> DaxWindow<S> {
    /// [`Coherence::refresh`]; with `range` (file bytes a request just wrote), pooled ranges
    /// are merged and copies re-read only where they hold those bytes (copies of them
    /// whatever the file's timestamps say: see [`Self::recopy`]).
    fn refresh_range(&self, owner: u64, range: Option<(u64, u64)>) {
        if !self.owners.has(owner) {
            return;
        }
        self.relayout(owner);
        for s in self.shadows_of(owner) {
            let _ = self.sync_shadow(&s, Some(owner));
        }
        self.sync_pooled(Some(owner), range);
        self.recopy(Some(owner), range);
    }
}

impl<S: WindowSink> Coherence for DaxWindow<S> {
    fn holds(&self, owner: u64) -> bool {
        self.has_work(owner)
    }

    fn sync(&self, owner: u64) {
        self.sync_owner(owner, None);
    }

    fn sync_range(&self, owner: u64, offset: u64, len: u64) {
        self.sync_owner(owner, Some((offset, offset.saturating_add(len))));
    }

    fn refresh(&self, owner: u64) {
        self.refresh_range(owner, None);
    }

    fn shrinking(&self, owner: u64, size: u64) {
        self.shrink_owner(owner, size);
    }

    fn revalidate(&self, owner: u64) {
        if self.owners.has(owner) {
            self.recopy(Some(owner), None);
        }
    }

    fn written(&self, owner: u64, offset: u64, len: u64) {
        // A write changes no other byte of the file, and may only have moved its end
        // (relayout, shadow tails): pooled ranges and copies of the bytes written only.
        self.refresh_range(owner, Some((offset, offset.saturating_add(len))));
    }

    fn sync_all(&self) {
        self.wait_claims(None, None, false);
        for (s, owner) in self.all_shadows() {
            let _ = self.sync_shadow(&s, owner);
        }
        self.retry_stranded(None);
        self.sync_pooled(None, None);
        self.recopy(None, None);
        self.trim_pool();
    }

    fn err_sample(&self, owner: u64) -> u64 {
        self.wb.sample(owner)
    }

    fn err_check(&self, owner: u64, since: &mut u64) -> Option<i32> {
        self.wb.check(owner, since)
    }

    fn err_sample_all(&self) -> u64 {
        self.wb.sample_all()
    }

    fn err_check_all(&self, since: &mut u64) -> Option<i32> {
        self.wb.check_all(since)
    }
}
