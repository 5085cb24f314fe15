//! Evacuation: direct placements of a host file that may shrink move to shadows (the
//! snapshot or merged placement) before the shrink, so no frontend mapping reaches past the
//! file's end. [`super::host_watch`] finds the files (a host process about to touch one);
//! the request path asks through [`super::coherent::Coherence::shrinking`].

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::host_watch::{key_of, Key};
use super::placement::{Plan, Source};
use super::{DaxWindow, WindowSink};

/// How long host operations on mapped files wait for a paused device to run again (no SHMEM
/// request may go to QEMU 11.1 while it is stopped): counted from the first that waits in a
/// pause, so a batch of them (20 host opens) waits this long in all.
const PAUSED_WAIT: Duration = Duration::from_secs(10);

impl<S: WindowSink> DaxWindow<S> {
    /// The guest is about to shrink inode `owner`'s file to `size` (SETATTR, an O_TRUNC open;
    /// the daemon's own truncate, which the fanotify watch lets through): every direct mapping
    /// of the host file reaching past `size`, through any alias inode, moves to a shadow first.
    pub(crate) fn shrink_owner(&self, owner: u64, size: u64) {
        let known = self.host.owner_key(owner);
        let key = known.or_else(|| {
            let t = self.table.lock().ok()?;
            let m = t.by_owner.get(&owner)?.iter().next()?;
            t.live.get(m)?.file.as_ref().and_then(|f| key_of(f))
        });
        if let Some(key) = key {
            self.evacuate(key, size);
        }
    }

    /// Direct placements of host file `key` whose file part reaches past `from`.
    fn direct_of(&self, key: Key, from: u64) -> Vec<(u64, u64)> {
        let cands: Vec<(u64, u64, Arc<File>)> = {
            let Ok(t) = self.table.lock() else {
                return Vec::new();
            };
            t.live
                .iter()
                .filter(|(_, p)| !p.whole && p.file_len > 0)
                .filter(|(_, p)| p.foffset.saturating_add(p.file_len) > from)
                .filter_map(|(&m, p)| Some((m, p.len, p.file.clone()?)))
                .collect()
        };
        let mut keys: HashMap<*const File, Option<Key>> = HashMap::new();
        cands
            .into_iter()
            .filter(|(_, _, f)| {
                *keys.entry(Arc::as_ptr(f)).or_insert_with(|| key_of(f)) == Some(key)
            })
            .map(|(m, l, _)| (m, l))
            .collect()
    }

    /// A host process may shrink file `key` to `from` or beyond: moves every direct mapping
    /// of it reaching past `from` to a shadow (no frontend mapping of the file is left there),
    /// waiting for a paused device to run. Returns how many moved.
    pub(crate) fn evacuate(&self, key: Key, from: u64) -> usize {
        let mut moved = 0;
        for _pass in 0..3 {
            let stale = self.direct_of(key, from);
            if stale.is_empty() {
                // A round trip in flight may be placing this file: let it publish, look again.
                let busy = self
                    .table
                    .lock()
                    .map(|t| !t.busy.is_empty())
                    .unwrap_or(false);
                if !busy {
                    break;
                }
                let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
                drop(self.idle.wait_timeout(t, Duration::from_millis(500)));
                continue;
            }
            // One bound for every host operation of a pause, not one each (set only while
            // paused: `start` clears it).
            let deadline = if self.running.load(Ordering::SeqCst) {
                Instant::now()
            } else {
                *self
                    .paused_until
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert_with(|| Instant::now() + PAUSED_WAIT)
            };
            while !self.running.load(Ordering::SeqCst) && Instant::now() < deadline {
                // A timed condvar wait, not a sleep: the seccomp allowlist has futex only.
                let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
                drop(self.idle.wait_timeout(t, Duration::from_millis(20)));
            }
            if !self.running.load(Ordering::SeqCst) {
                log::error!(
                    "DAX: a host process changes file dev={} ino={} while the device is stopped: its {} mapping(s) stay (no SHMEM request may reach a stopped QEMU); if it shrinks, the guest's next access there can crash QEMU",
                    key.0,
                    key.1,
                    stale.len()
                );
                return moved;
            }
            for (m, len) in stale {
                moved += self.evacuate_one(m, len, key);
            }
        }
        if moved > 0 {
            // Request stores into the moved ranges' file finish before the shrink goes on;
            // later ones look the range up again (a shadow now).
            self.io.evacuated();
            log::info!(
                "DAX: host access to file dev={} ino={}: {moved} direct mapping(s) moved to shadows before it may shrink",
                key.0,
                key.1
            );
        }
        moved
    }

    fn evacuate_one(&self, m: u64, len: u64, key: Key) -> usize {
        let Ok((gen, placed)) = self.claim_off(m, len) else {
            return 0;
        };
        let np = placed.and_then(|p| {
            let f = p.file.clone()?;
            if !self.reserve(gen, 1) {
                return None;
            }
            let plan = if p.writable {
                Plan::Merged
            } else {
                Plan::Snapshot
            };
            match self.place_reserved(&p.request(m, &f), &Source::kept(&f, key), plan, 0) {
                Ok(mut np) => {
                    np.regions = 1;
                    self.counters.replaced.fetch_add(1, Ordering::Relaxed);
                    Some(np)
                }
                Err(e) => {
                    // The guest's range is gone from the frontend: its next access there
                    // reads nothing mapped instead of a page past the end of the file.
                    log::error!("moving DAX mapping {m:#x} to a shadow failed: {e}");
                    self.unreserve(gen, 1);
                    None
                }
            }
        });
        let ok = np.is_some();
        if let Some(p) = &np {
            self.keep_placed(m, p);
        }
        self.release(gen, m, np, 0);
        usize::from(ok)
    }
}
