//! Write-back errors of the window, reported to the guest as a local file system reports
//! them (Linux's errseq, lib/errseq.c): a failed merge of guest stores into a file (ENOSPC,
//! EDQUOT, EIO, EPERM of an immutable file, ...) is recorded against the inode, and the next
//! FSYNC or FLUSH of each file handle open on it returns the error once; SYNCFS returns it
//! once for the share. A handle opened after the error was seen does not see it again; one
//! opened before anyone saw it does.
//!
//! Recording is not forgetting: the bytes the merge could not write stay in the window's
//! pool or shadow, or move to a stranded shadow ([`super::DaxWindow::strand`]), and are
//! written back at the next sync point that succeeds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// One error sequence: how many errors were recorded, the last one, and whether a check
/// has reported it since.
#[derive(Clone, Copy, Debug, Default)]
struct Seq {
    count: u64,
    errno: i32,
    seen: bool,
}

impl Seq {
    /// As `errseq_set`: a new error counts only once the last one was seen (retries of the
    /// same bytes failing again while nobody looked are one error, with the latest errno).
    fn record(&mut self, errno: i32) {
        if self.seen || self.count == 0 {
            self.count += 1;
        }
        self.errno = errno;
        self.seen = false;
    }

    /// What a new open file starts from: an error nobody reported yet is still reported.
    fn sample(&self) -> u64 {
        if self.seen {
            self.count
        } else {
            self.count.saturating_sub(1)
        }
    }

    fn check(&mut self, since: &mut u64) -> Option<i32> {
        if *since >= self.count {
            return None;
        }
        *since = self.count;
        self.seen = true;
        Some(self.errno)
    }
}

/// Write-back errors by inode (`owner`), and one sequence for the whole share.
#[derive(Default)]
pub(super) struct WbErrors {
    by_owner: Mutex<HashMap<u64, Seq>>,
    all: Mutex<Seq>,
    /// Whether `by_owner` may hold anything: requests of a window that never failed a
    /// write-back take no lock here.
    any: AtomicBool,
}

impl WbErrors {
    /// A write-back of `owner`'s bytes failed with `errno`.
    pub(super) fn record(&self, owner: u64, errno: i32) {
        self.any.store(true, Ordering::SeqCst);
        self.by_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(owner)
            .or_default()
            .record(errno);
        self.all
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(errno);
    }

    /// The point a handle opened on `owner` now starts checking from.
    pub(super) fn sample(&self, owner: u64) -> u64 {
        self.by_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&owner)
            .map_or(0, Seq::sample)
    }

    /// The error recorded for `owner` after `since`, if any; `since` moves past it.
    pub(super) fn check(&self, owner: u64, since: &mut u64) -> Option<i32> {
        self.by_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&owner)?
            .check(since)
    }

    /// The point the share's sequence starts from.
    pub(super) fn sample_all(&self) -> u64 {
        self.all.lock().unwrap_or_else(|e| e.into_inner()).sample()
    }

    /// The error recorded for any inode after `since`, if any; `since` moves past it.
    pub(super) fn check_all(&self, since: &mut u64) -> Option<i32> {
        self.all
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .check(since)
    }

    /// Every byte of `owner` that had failed to write is in its file now: an error nobody
    /// reported yet no longer concerns a handle opened from now on (one opened before still
    /// reports it).
    pub(super) fn resolved(&self, owner: u64) {
        if let Some(s) = self
            .by_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&owner)
        {
            s.seen = true;
        }
    }

    /// Whether `owner` has an error sequence (a sync point must look even when the window
    /// holds no mapping of it any more).
    pub(super) fn has(&self, owner: u64) -> bool {
        self.any.load(Ordering::SeqCst)
            && self
                .by_owner
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&owner)
    }

    /// A new FUSE session: inode numbers mean other files now.
    pub(super) fn clear_owners(&self) {
        self.by_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_handle_sees_an_error_once_and_late_openers_only_if_unseen() {
        let w = WbErrors::default();
        let mut a = w.sample(1);
        assert_eq!(w.check(1, &mut a), None);
        w.record(1, libc::ENOSPC);
        // Opened after the error, before anyone reported it: sees it.
        let mut b = w.sample(1);
        assert_eq!(w.check(1, &mut a), Some(libc::ENOSPC));
        assert_eq!(w.check(1, &mut a), None, "once per handle");
        assert_eq!(w.check(1, &mut b), Some(libc::ENOSPC));
        // Opened after it was seen: does not.
        let mut c = w.sample(1);
        assert_eq!(w.check(1, &mut c), None);
        w.record(1, libc::EIO);
        assert_eq!(w.check(1, &mut c), Some(libc::EIO));
        assert_eq!(w.check(2, &mut 0), None, "other inodes are unaffected");
        // Failing again before anyone looked: one error, the latest errno.
        w.record(1, libc::ENOSPC);
        let mut d = w.sample(1);
        w.record(1, libc::EDQUOT);
        w.record(1, libc::EDQUOT);
        assert_eq!(w.check(1, &mut c), Some(libc::EDQUOT));
        assert_eq!(w.check(1, &mut c), None);
        assert_eq!(w.check(1, &mut d), Some(libc::EDQUOT));
        // Written since: handles opened from now on do not inherit it; older ones report it.
        w.record(1, libc::EIO);
        let mut old = w.sample(1);
        w.resolved(1);
        let mut new = w.sample(1);
        assert_eq!(w.check(1, &mut new), None);
        assert_eq!(w.check(1, &mut old), Some(libc::EIO));
        let mut s = 0;
        assert_eq!(w.check_all(&mut s), Some(libc::EIO));
        assert_eq!(w.check_all(&mut s), None);
    }
}
