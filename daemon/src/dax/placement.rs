//! Placement: how one guest mapping becomes frontend mappings (direct with a shadow tail,
//! snapshot, merged, copy slot; the pool is in [`super::pool`]), and how a placement leaves
//! the frontend again.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use super::copy::{self, CopyMode, CopySig, Slots};
use super::kept::Front;
use super::table::{Placed, SharedShadow};
use super::tail::{self, Shadow, ShadowKey};
use super::{eio, file_size, DaxWindow, WindowSink};
use crate::protocol::mapper::MapRequest;

/// How to place a guest mapping.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Plan {
    /// From the file, then a tail when the file ends inside the range.
    Direct,
    /// Read-only, from a snapshot of the whole range.
    Snapshot,
    /// Writable, the whole range from a shadow written back to the file.
    Merged,
    /// Read-only, the whole range from a copy slot ([`copy`]).
    Copy,
}

/// Where a placement's bytes come from, besides the request.
pub(super) struct Source<'a> {
    /// The descriptor the placement keeps (to map from, refill and write back to): the
    /// request's, a read-only one for an executable's snapshot, or none.
    pub(super) keep: Option<Arc<File>>,
    /// The request's file, read now (sizes, copies, new shadows).
    pub(super) file: &'a File,
    /// The file's `(st_dev, st_ino)`, the key of its shadows.
    pub(super) key: (u64, u64),
}

impl<'a> Source<'a> {
    /// A placement that keeps `file` and reads from it.
    pub(super) fn kept(file: &'a Arc<File>, key: (u64, u64)) -> Self {
        Source {
            keep: Some(file.clone()),
            file,
            key,
        }
    }
}

impl<S: WindowSink> DaxWindow<S> {
    /// Whether a read-only mapping of `[moffset, moffset + len)` asked now becomes a copy
    /// slot: under `auto`, while the window churns, or onto a parked slot of exactly that
    /// range within [`copy::CHURN_LINGER`] of the last churn (a refill in place instead of
    /// taking the slot out of the frontend).
    pub(super) fn copy_now(&self, moffset: u64, len: u64) -> bool {
        match self.copy_mode() {
            CopyMode::Off => false,
            CopyMode::Always => true,
            CopyMode::Auto => self
                .table
                .lock()
                .map(|mut t| {
                    let parked = t.parked.get(&moffset).is_some_and(|p| p.len == len);
                    if parked {
                        t.churn.hot_within(copy::CHURN_LINGER)
                    } else {
                        t.churn.hot()
                    }
                })
                .unwrap_or(false),
        }
    }

    /// The copy slots' memfd (made on first use: the window's size at most).
    pub(super) fn slots(&self) -> io::Result<&Slots> {
        if let Some(s) = self.slots.get() {
            return Ok(s);
        }
        let s = Slots::new(self.size).map_err(|e| {
            log::error!("cannot make the DAX copy slots' memfd: {e}");
            e
        })?;
        Ok(self.slots.get_or_init(|| s))
    }

    /// A read-only descriptor of the file behind `fd` (through `/proc/self/fd`), if any.
    pub(super) fn reopen_read_only(&self, fd: BorrowedFd) -> Option<File> {
        let dir = self.proc_self_fd.get()?;
        let name = std::ffi::CString::new(fd.as_raw_fd().to_string()).ok()?;
        crate::sys::openat(dir.as_fd(), &name, libc::O_RDONLY | libc::O_CLOEXEC, 0)
            .map(File::from)
            .map_err(|e| log::debug!("reopening a mapped file read-only: {e}"))
            .ok()
    }

    pub(super) fn log_snapshot(&self, st: &libc::stat64, why: &str) {
        let mut l = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        if l.len() < 4096 && l.insert((st.st_dev, st.st_ino)) {
            log::info!(
                "DAX: file dev={} ino={} is mapped read-only from a snapshot ({why})",
                st.st_dev,
                st.st_ino
            );
        }
    }

    /// Places a guest mapping in the frontend (round trips; no lock held).
    pub(super) fn place(
        &self,
        gen: u64,
        req: &MapRequest<'_>,
        src: &Source<'_>,
        plan: Plan,
    ) -> io::Result<Placed> {
        let (moffset, len, foffset) = (req.moffset, req.len, req.foffset);
        let size = file_size(src.file)?;
        let (file_len, _) = tail::layout(size, foffset, len);
        let mut plan = plan;
        let mut regions = match plan {
            Plan::Direct if file_len > 0 && file_len < len => 2,
            _ => 1,
        };
        if plan == Plan::Copy {
            if !self.reserve(gen, 1) {
                log::warn!(
                    "DAX mapping budget of {} frontend mappings reached: SETUPMAPPING at {moffset:#x} refused",
                    self.budget()
                );
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let res = self
                .fill_slot(moffset, len, src.file, foffset)
                .and_then(|sig| {
                    let slots = self.slots()?;
                    self.with_sink(|s| {
                        s.map_as(Front::Slot, moffset, len, slots.fd(), moffset, false)
                    })
                    .map_err(|e| {
                        log::error!("SHMEM_MAP of copy slot {moffset:#x}+{len:#x} failed: {e}");
                        eio()
                    })?;
                    Ok(sig)
                });
            return match res {
                Ok(sig) => {
                    self.counters.copies.fetch_add(1, Ordering::Relaxed);
                    Ok(Placed::copy_slot(req, src.keep.clone(), sig))
                }
                Err(e) => {
                    self.free_slot(moffset, len);
                    self.unreserve(gen, 1);
                    Err(e)
                }
            };
        }
        if !self.reserve(gen, regions) {
            let can_merge = regions == 2 && self.reserve(gen, 1);
            if !can_merge {
                log::warn!(
                    "DAX mapping budget of {} frontend mappings reached: SETUPMAPPING at {moffset:#x} refused",
                    self.budget()
                );
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            plan = Plan::Merged;
            regions = 1;
        }
        let res = self.place_reserved(req, src, plan, file_len);
        match res {
            Ok(mut p) => {
                p.regions = regions;
                Ok(p)
            }
            Err(e) => {
                self.unreserve(gen, regions);
                Err(e)
            }
        }
    }

    /// Places a guest mapping as `plan` says, with its frontend mappings reserved already;
    /// `file_len`: bytes of the range the file covers in whole pages (direct plans only).
    pub(super) fn place_reserved(
        &self,
        req: &MapRequest<'_>,
        src: &Source<'_>,
        plan: Plan,
        file_len: u64,
    ) -> io::Result<Placed> {
        let MapRequest {
            owner,
            moffset,
            len,
            foffset,
            writable,
            ..
        } = *req;
        let file = src.keep.clone();
        let key = src.key;
        let whole = plan != Plan::Direct;
        let file_len = if whole { 0 } else { file_len };
        let mut placed = Placed {
            owner,
            len,
            foffset,
            writable,
            file: file.clone(),
            file_len,
            shadow: None,
            whole,
            regions: 0,
            copy: None,
            pooled: false,
            pool_agreed: None,
            pool_pages: None,
            pool_sig: None,
        };
        if file_len > 0 {
            let f = file.as_ref().ok_or_else(eio)?;
            if writable {
                // The blocks first: a store into a hole the host file system cannot fill
                // would be a SIGBUS in QEMU; refused here, the guest gets the errno.
                super::prealloc::allocate(f, foffset, file_len).map_err(|e| {
                    log::warn!(
                        "DAX: writable SETUPMAPPING {moffset:#x}+{file_len:#x} refused: \
                         allocating file bytes {foffset:#x}+{file_len:#x} failed: {e}"
                    );
                    e
                })?;
            }
            let _watched = self.host.watch(f, owner, moffset, foffset, file_len);
            self.with_sink(|s| {
                s.map_as(Front::File, moffset, file_len, f.as_fd(), foffset, writable)
            })
            .map_err(|e| {
                log::error!("SHMEM_MAP {moffset:#x}+{file_len:#x} failed: {e}");
                eio()
            })?;
        }
        if file_len < len {
            let at = foffset + file_len;
            let shadow = self
                .shadow(
                    (key.0, key.1, at, whole),
                    src.file,
                    file,
                    len - file_len,
                    writable,
                )
                .and_then(|sh| {
                    // A descriptor of its own: the shadow's lock is not held across the round
                    // trip (a reset writes shadows back and must not wait for the frontend).
                    let fd = sh
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .fd()
                        .try_clone_to_owned()?;
                    self.with_sink(|s| {
                        s.map_as(
                            Front::Shadow,
                            moffset + file_len,
                            len - file_len,
                            fd.as_fd(),
                            0,
                            writable,
                        )
                    })?;
                    Ok(sh)
                });
            match shadow {
                Ok(sh) => {
                    let c = match plan {
                        Plan::Direct => &self.counters.tails,
                        Plan::Snapshot | Plan::Copy => &self.counters.snapshots,
                        Plan::Merged => &self.counters.merged,
                    };
                    c.fetch_add(1, Ordering::Relaxed);
                    placed.shadow = Some(sh);
                }
                Err(e) => {
                    log::error!(
                        "SHMEM_MAP of the shadow at {:#x} failed: {e}",
                        moffset + file_len
                    );
                    if file_len > 0 {
                        let _ = self.with_sink(|s| s.unmap(moffset, file_len));
                    }
                    return Err(eio());
                }
            }
        }
        Ok(placed)
    }

    /// Takes a placement out of the frontend (its shadow written back first). A frontend
    /// that no longer has it (it was reset behind our back) is not an error for the guest.
    pub(super) fn unplace(&self, moffset: u64, p: &Placed) {
        if !p.pooled {
            self.forget_direct(moffset);
        }
        self.settle(moffset, p);
        if p.pooled {
            // Nothing of its own in the frontend: the pool stays.
            self.free_pooled(moffset, p);
            self.counters.unmaps.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if !self.running.load(Ordering::SeqCst) {
            // Paused (QEMU keeps its mappings across stop/cont): unmap once it runs again.
            let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            if p.file_len > 0 {
                t.orphans.push((moffset, p.file_len));
            }
            if p.file_len < p.len {
                t.orphans.push((moffset + p.file_len, p.len - p.file_len));
            }
            self.counters.unmaps.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if p.file_len > 0 {
            if let Err(e) = self.with_sink(|s| s.unmap(moffset, p.file_len)) {
                log::warn!("SHMEM_UNMAP {moffset:#x}+{:#x}: {e}", p.file_len);
            }
        }
        if p.file_len < p.len {
            let (m, l) = (moffset + p.file_len, p.len - p.file_len);
            if let Err(e) = self.with_sink(|s| s.unmap(m, l)) {
                log::warn!("SHMEM_UNMAP {m:#x}+{l:#x}: {e}");
            }
        }
        if p.copy.is_some() {
            self.free_slot(moffset, p.len);
        }
        self.counters.unmaps.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes a placement's shadow (or its pooled bytes) back: it is leaving the frontend.
    /// Bytes that cannot be written now are kept ([`Self::strand`]), never dropped.
    pub(super) fn settle(&self, m: u64, p: &Placed) {
        if let Some(s) = &p.shadow {
            if self.sync_shadow(s, Some(p.owner)).is_err() {
                let writable = s.lock().unwrap_or_else(|e| e.into_inner()).writable();
                if writable {
                    self.strand(p.owner, (0, 0), p.foffset, p.len - p.file_len, s.clone());
                }
            }
        }
        if p.pool_agreed.is_some() && self.merge_pooled(m, p).is_err() {
            self.strand_pooled(m, p);
        }
    }

    /// The shared shadow of `key`, made (from `file`) if none is live.
    pub(super) fn shadow(
        &self,
        key: ShadowKey,
        file: &File,
        keep: Option<Arc<File>>,
        size: u64,
        writable: bool,
    ) -> io::Result<SharedShadow> {
        let mut reg = self.shadows.lock().unwrap_or_else(|e| e.into_inner());
        reg.retain(|_, w| w.strong_count() > 0);
        if let Some(s) = reg.get(&key).and_then(Weak::upgrade) {
            let mut g = s.lock().unwrap_or_else(|e| e.into_inner());
            g.grow(size, file)?;
            g.attach(keep, writable)?;
            drop(g);
            return Ok(s);
        }
        let mut sh = Shadow::new(file, key.2, size)?;
        sh.attach(keep, writable)?;
        let s = Arc::new(Mutex::new(sh));
        reg.insert(key, Arc::downgrade(&s));
        Ok(s)
    }

    /// Fills the copy slot `[moffset, moffset + len)` from `file`; returns what it copied.
    pub(super) fn fill_slot(
        &self,
        moffset: u64,
        len: u64,
        file: &File,
        foffset: u64,
    ) -> io::Result<CopySig> {
        let sig = CopySig::of(file)?;
        self.slots()?
            .fill(moffset, len, file, foffset)
            .map_err(|e| {
                log::error!("copying a file range into DAX copy slot {moffset:#x}: {e}");
                eio()
            })?;
        Ok(sig)
    }

    /// Frees a copy slot's pages (no frontend mapping of it is left).
    pub(super) fn free_slot(&self, s: u64, l: u64) {
        if let Some(slots) = self.slots.get() {
            if let Err(e) = slots.zero(s, l) {
                log::debug!("freeing copy slot {s:#x}+{l:#x}: {e}");
            }
        }
    }
}
