//! Stranded bytes: guest stores whose write-back failed when their range left the window
//! (REMOVEMAPPING, a reset, a re-placement). A local file system keeps such pages until it
//! can write them; so does the window: the range's bytes move to a shadow of their own
//! (a shadow tail or merged shadow is kept as it is), retried at every sync point of the
//! inode and by the periodic write-back, and a new pooled mapping of the same file range
//! takes them over. The error is recorded ([`super::wberr`]) whatever happens to them.
//!
//! Bound: stranded bytes never exceed a quarter of the window. Past it the oldest are
//! dropped with an error in the log and recorded again against their inode, so the next
//! FSYNC, FLUSH and SYNCFS still fail: bytes are never lost silently.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};

use super::baseline::PageHashes;
use super::table::{Placed, SharedShadow};
use super::tail::Shadow;
use super::{DaxWindow, WindowSink};

/// One range of guest bytes not yet in its file.
pub(super) struct Stranded {
    pub(super) owner: u64,
    /// Host file `(st_dev, st_ino)` and the file range.
    pub(super) key: (u64, u64),
    pub(super) foffset: u64,
    pub(super) len: u64,
    pub(super) shadow: SharedShadow,
}

/// The owner of stranded bytes whose session ended (no inode has this number).
const NO_OWNER: u64 = u64::MAX;

/// The errno of a failed write-back (EIO when the error carries none).
pub(super) fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

impl<S: WindowSink> DaxWindow<S> {
    /// The `stranded` counter: how many ranges `st` holds now.
    fn count_stranded(&self, st: &[Stranded]) {
        self.counters
            .stranded
            .store(st.len() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Most stranded bytes the window keeps.
    fn stranded_limit(&self) -> u64 {
        (self.size / 4).max(super::RANGE_SIZE)
    }

    /// Keeps a pooled range whose merge just failed with `e`: its guest and agreed bytes move
    /// to a shadow of their own before the pool's range is freed.
    pub(super) fn strand_pooled(&self, m: u64, p: &Placed) {
        let (Some(file), Some(valid), Some(pages), Some(slots)) = (
            p.file.clone(),
            p.pool_agreed,
            p.pool_pages.as_ref(),
            self.slots.get(),
        ) else {
            return;
        };
        let key = match crate::sys::fstat(file.as_fd()) {
            Ok(st) => (st.st_dev, st.st_ino),
            Err(_) => (0, 0),
        };
        match Shadow::adopt(slots.file(), m, pages, p.len, valid, file, p.foffset) {
            Ok(sh) => self.strand(p.owner, key, p.foffset, p.len, Arc::new(Mutex::new(sh))),
            Err(e) => {
                log::error!(
                    "DAX: {} bytes of guest stores at file offset {:#x} could not be kept after a failed write-back: {e}",
                    p.len,
                    p.foffset
                );
                self.wb.record(p.owner, errno_of(&e));
            }
        }
    }

    /// Keeps `shadow` (with bytes the last sync could not write) until a sync succeeds.
    pub(super) fn strand(
        &self,
        owner: u64,
        key: (u64, u64),
        foffset: u64,
        len: u64,
        shadow: SharedShadow,
    ) {
        let mut st = self.stranded.lock().unwrap_or_else(|e| e.into_inner());
        if st.iter().any(|s| Arc::ptr_eq(&s.shadow, &shadow)) {
            return;
        }
        st.push(Stranded {
            owner,
            key,
            foffset,
            len,
            shadow,
        });
        let limit = self.stranded_limit();
        let mut dropped = Vec::new();
        while st.iter().map(|s| s.len).sum::<u64>() > limit && st.len() > 1 {
            dropped.push(st.remove(0));
        }
        self.count_stranded(&st);
        drop(st);
        for old in dropped {
            log::error!(
                "DAX: dropping {} bytes of guest stores at file offset {:#x} (inode {}) that could not be written back: more than {} MiB are waiting",
                old.len,
                old.foffset,
                old.owner,
                limit >> 20
            );
            self.wb.record(old.owner, libc::EIO);
        }
    }

    /// The FUSE session ended: stranded bytes belong to no inode of the next one.
    pub(super) fn orphan_stranded(&self) {
        for s in self
            .stranded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter_mut()
        {
            s.owner = NO_OWNER;
        }
    }

    /// Tries to write stranded bytes back (`owner`'s, or all): the ones that reach their file
    /// are dropped, the others record their error again.
    pub(super) fn retry_stranded(&self, owner: Option<u64>) {
        let cands: Vec<(u64, SharedShadow)> = {
            let st = self.stranded.lock().unwrap_or_else(|e| e.into_inner());
            if st.is_empty() {
                return;
            }
            st.iter()
                .filter(|s| owner.map_or(true, |o| o == s.owner))
                .map(|s| (s.owner, s.shadow.clone()))
                .collect()
        };
        for (o, sh) in cands {
            if self.sync_shadow(&sh, Some(o)).is_ok() {
                let mut st = self.stranded.lock().unwrap_or_else(|e| e.into_inner());
                st.retain(|s| !Arc::ptr_eq(&s.shadow, &sh));
                self.count_stranded(&st);
            }
        }
    }

    /// A write-back of `owner`'s bytes succeeded: with nothing of it stranded, its pending
    /// error is resolved ([`super::wberr::WbErrors::resolved`]).
    pub(super) fn written_back(&self, owner: u64) {
        if !self.wb.has(owner) {
            return;
        }
        let stranded = self
            .stranded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|s| s.owner == owner);
        if !stranded {
            self.wb.resolved(owner);
        }
    }

    /// The stranded shadow of exactly file range `[foffset, foffset + len)` of host file
    /// `key`, taken out (a new pooled mapping of the range takes its bytes over).
    pub(super) fn take_stranded(
        &self,
        key: (u64, u64),
        foffset: u64,
        len: u64,
    ) -> Option<Stranded> {
        let mut st = self.stranded.lock().unwrap_or_else(|e| e.into_inner());
        let i = st
            .iter()
            .position(|s| s.key == key && s.foffset == foffset && s.len == len)?;
        let s = st.remove(i);
        self.count_stranded(&st);
        Some(s)
    }

    /// Stranded bytes of exactly file range `[foffset, foffset + len)` of host file `key`
    /// that a new writable pooled mapping of the range must take over: written back first if
    /// that works now (`None`: the file has them, fill the range from it).
    pub(super) fn unstrand(&self, key: (u64, u64), foffset: u64, len: u64) -> Option<Stranded> {
        let s = self.take_stranded(key, foffset, len)?;
        if self.sync_shadow(&s.shadow, Some(s.owner)).is_ok() {
            return None;
        }
        Some(s)
    }

    /// Puts stranded bytes into the pooled range at `m` (filled from the file just before):
    /// the guest's bytes, and the agreed ones as page hashes; returns the agreed length and
    /// the hashes. On failure they stay stranded.
    pub(super) fn overlay_stranded(&self, s: Stranded, m: u64) -> io::Result<(u64, PageHashes)> {
        let g = s.shadow.lock().unwrap_or_else(|e| e.into_inner());
        let (now, agreed, valid) = g.parts();
        let copied = (|| {
            copy_all(now, self.slots()?.file(), m, s.len)?;
            PageHashes::of(agreed.unwrap_or(now), 0, valid, s.len)
        })();
        drop(g);
        match copied {
            Ok(pages) => Ok((valid, pages)),
            Err(e) => {
                self.strand(s.owner, s.key, s.foffset, s.len, s.shadow);
                Err(e)
            }
        }
    }
}

/// Copies `[0, len)` of `src` into `dst` at `at` (zeros where `src` has holes).
fn copy_all(src: &File, dst: &File, at: u64, len: u64) -> io::Result<()> {
    let done = super::memfd::copy_range(src, 0, dst, at, len, false)?;
    super::memfd::zero_range(dst, at + done, len - done)
}
