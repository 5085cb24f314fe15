//! The window as the protocol's [`Mapper`]: SETUPMAPPING, REMOVEMAPPING, and the end of a
//! FUSE session.

use std::fs::File;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::placement::{Plan, Source};
use super::table::Placed;
use super::{einval, fd_writable, file_size, DaxWindow, WindowSink, MAP_ALIGNMENT};
use crate::protocol::mapper::{MapRequest, Mapper};

impl<S: WindowSink> Mapper for DaxWindow<S> {
    fn window_size(&self) -> u64 {
        self.size
    }

    fn map(&self, req: &MapRequest<'_>) -> io::Result<()> {
        let res = (|| {
            let (moffset, len) = (req.moffset, req.len);
            let end = self.check_range(moffset, len)?;
            if req.foffset % MAP_ALIGNMENT != 0 || req.foffset.checked_add(len).is_none() {
                return Err(einval("file offset not page aligned or overflowing"));
            }
            self.note_guest_range(moffset, len);
            let st = crate::sys::fstat(req.fd)?;
            let rw = fd_writable(req.fd);
            let exec = st.st_mode & 0o111 != 0;
            if req.writable && !rw {
                log::warn!("DAX: writable mapping asked with a read-only descriptor");
                return Err(io::Error::from_raw_os_error(libc::EACCES));
            }
            let source = File::from(req.fd.try_clone_to_owned()?);
            let (plan, keep) = if req.writable {
                (Plan::Direct, None)
            } else if !rw {
                self.log_snapshot(&st, "it cannot be opened read-write");
                (Plan::Snapshot, None)
            } else if exec {
                // Keep no writable descriptor: the host may run the file meanwhile.
                let ro = self.reopen_read_only(req.fd).map(Arc::new);
                let how = if ro.is_some() {
                    "executable: the host may run it while the guest reads it"
                } else {
                    "executable: the host may run it while the guest reads it; host changes reach the guest when it maps the range again"
                };
                self.log_snapshot(&st, how);
                (Plan::Snapshot, Some(ro))
            } else if self.copy_now(moffset, len) {
                (Plan::Copy, None)
            } else {
                (Plan::Direct, None)
            };
            // The descriptor kept: none for executables (a writable one would stop the host
            // from executing the file), else this one.
            let source = Arc::new(source);
            let src = Source {
                keep: match keep {
                    Some(k) => k,
                    None => Some(source.clone()),
                },
                file: &source,
                key: (st.st_dev, st.st_ino),
            };
            let pooled = self.use_pool();
            if req.writable && !pooled {
                // A writable direct range needs its blocks (see `prealloc`). Asked before the
                // range's present placement leaves the window: Linux keeps its read-only
                // mapping when an upgrade fails, so the frontend must keep it too (the guest
                // would read zeros there otherwise).
                let (file_len, _) = super::tail::layout(file_size(&source)?, req.foffset, len);
                super::prealloc::allocate(&source, req.foffset, file_len)?;
            }
            // Not pooled, a copy slot already in the frontend at exactly this range (parked,
            // or a live copy the guest maps again) is refilled in place: no frontend round
            // trip.
            let reusable = !pooled && plan == Plan::Copy;
            let (gen, taken, parked) = self.claim_parked(moffset, end, true)?;
            let mut freed = 0;
            if !taken.is_empty() {
                self.counters.upgrades.fetch_add(1, Ordering::Relaxed);
            }
            let mut reuse = false;
            for (s, p) in &taken {
                if reusable && !reuse && *s == moffset && p.len == len && p.copy.is_some() {
                    reuse = true;
                    self.counters.unmaps.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                self.unplace(*s, p);
                freed += p.regions;
            }
            drop(taken);
            for (s, l) in parked {
                if reusable && !reuse && s == moffset && l == len {
                    reuse = true;
                    continue;
                }
                // Anything else there (a writable or direct mapping, another extent, the
                // pool) needs the parked slot out of the frontend first.
                self.drop_parked(gen, s, l);
            }
            self.unreserve(gen, freed);
            let placed = if pooled {
                match self.place_pooled(gen, req, &src) {
                    Ok(Some(p)) => Ok(p),
                    Ok(None) => {
                        let plan = match plan {
                            Plan::Copy => Plan::Direct,
                            plan => plan,
                        };
                        self.place(gen, req, &src, plan)
                    }
                    Err(e) => Err(e),
                }
            } else if reuse {
                match self.fill_slot(moffset, len, &source, req.foffset) {
                    Ok(sig) => {
                        self.counters.reused.fetch_add(1, Ordering::Relaxed);
                        Ok(Placed::copy_slot(req, src.keep, sig))
                    }
                    Err(e) => {
                        // The slot stays in the frontend: park it again.
                        self.release_parking(gen, moffset, 0, &[(moffset, len)]);
                        return Err(e);
                    }
                }
            } else {
                self.place(gen, req, &src, plan)
            };
            match placed {
                Ok(p) => {
                    // Kept before the reply names it (`--restartable`).
                    self.keep_placed(moffset, &p);
                    self.release(gen, moffset, Some(p), 0);
                    self.counters.maps.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }
                Err(e) => {
                    self.release(gen, moffset, None, 0);
                    Err(e)
                }
            }
        })();
        self.counted(res)
    }

    fn unmap(&self, moffset: u64, len: u64) -> io::Result<()> {
        // Nothing mapped there: nothing to do (the guest may remove a range it never got).
        let res = (|| {
            let end = self.check_range(moffset, len)?;
            let (gen, taken) = self.claim(moffset, end)?;
            let mut freed = 0;
            let mut park = Vec::new();
            for (s, p) in &taken {
                if p.copy.is_some() && !p.pooled {
                    // Parked: the frontend keeps it for the next read-only map of the range.
                    self.forget_direct(*s);
                    park.push((*s, p.len));
                    self.counters.unmaps.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                self.unplace(*s, p);
                freed += p.regions;
            }
            if let Ok(mut t) = self.table.lock() {
                // Churn is a full window recycling ranges, not one emptying: an evicted inode
                // or a guest dropping its caches removes many ranges at once from a window
                // with room to spare, and must not turn the next read-only maps into copies.
                let held = t.live.values().map(|p| p.len).sum::<u64>()
                    + taken.iter().map(|(_, p)| p.len).sum::<u64>();
                if held.saturating_mul(4) >= self.size.saturating_mul(3) {
                    t.churn.note(taken.len() as u64);
                }
            }
            self.release_parking(gen, moffset, freed, &park);
            Ok(())
        })();
        self.counted(res)
    }

    fn end_session(&self) {
        // DESTROY or a new INIT: the frontend still has the mappings unless the device was
        // reset (then `stop` already emptied the table, or QEMU refuses the unmaps, which
        // `unplace` tolerates).
        // While paused, `unplace` keeps them as orphans, unmapped once the device runs.
        let (live, parked, pool) = self.drain(false);
        self.forget_pool(live.iter().map(|(m, _)| *m));
        self.wait_claims(None, None, true);
        for (m, p) in live {
            self.unplace(m, &p);
        }
        if pool {
            if self.running.load(Ordering::SeqCst) {
                if let Err(e) = self.with_sink(|k| k.unmap(0, self.size)) {
                    log::debug!("SHMEM_UNMAP of the DAX pool: {e}");
                }
            } else {
                let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
                t.orphans.push((0, self.size));
            }
        }
        for (s, l) in parked {
            if self.running.load(Ordering::SeqCst) {
                if let Err(e) = self.with_sink(|k| k.unmap(s, l)) {
                    log::debug!("SHMEM_UNMAP of parked copy slot {s:#x}+{l:#x}: {e}");
                }
            } else {
                let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
                t.orphans.push((s, l));
            }
            self.free_slot(s, l);
        }
        self.wb.clear_owners();
        self.orphan_stranded();
        if self.running.load(Ordering::SeqCst) {
            let orphans =
                std::mem::take(&mut self.table.lock().unwrap_or_else(|e| e.into_inner()).orphans);
            for (s, l) in orphans {
                if let Err(e) = self.with_sink(|k| k.unmap(s, l)) {
                    log::debug!("SHMEM_UNMAP of orphan {s:#x}+{l:#x}: {e}");
                }
            }
        }
    }
}
