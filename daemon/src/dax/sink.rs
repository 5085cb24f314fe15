//! The sink: where SHMEM_MAP/SHMEM_UNMAP requests go ([`WindowSink`]), the device state that
//! allows sending them (start, pause, reset), and the wait after each request until the
//! frontend committed it (its memory-table update).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::time::Duration;

use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags};
use vhost::vhost_user::{Backend, VhostUserFrontendReqHandler};

use super::kept::Front;
use super::{eio, DaxWindow};
use crate::protocol::keeper::Kept;

/// Where map/unmap requests go: the vhost-user backend channel, a recorder in tests.
pub trait WindowSink: Send + Sync {
    /// SHMEM_MAP: `len` bytes of `fd` from `foffset` at window offset `moffset`.
    fn map(
        &self,
        moffset: u64,
        len: u64,
        fd: BorrowedFd,
        foffset: u64,
        writable: bool,
    ) -> io::Result<()>;
    /// SHMEM_UNMAP of the mapping of `len` bytes at window offset `moffset`.
    fn unmap(&self, moffset: u64, len: u64) -> io::Result<()>;
}

impl WindowSink for Backend {
    fn map(
        &self,
        moffset: u64,
        len: u64,
        fd: BorrowedFd,
        foffset: u64,
        writable: bool,
    ) -> io::Result<()> {
        let flags = if writable {
            VhostUserMMapFlags::WRITABLE
        } else {
            VhostUserMMapFlags::default()
        };
        let req = VhostUserMMap {
            shmid: 0,
            padding: [0; 7],
            fd_offset: foffset,
            shm_offset: moffset,
            len,
            flags: flags.bits(),
        };
        let raw = fd.as_raw_fd();
        self.shmem_map(&req, &raw).map(|_| ())
    }

    fn unmap(&self, moffset: u64, len: u64) -> io::Result<()> {
        let req = VhostUserMMap {
            shm_offset: moffset,
            len,
            ..Default::default()
        };
        self.shmem_unmap(&req).map(|_| ())
    }
}

/// The sink as the window sends through it ([`DaxWindow::with_sink`]): each request is noted
/// in the window's state first (what the frontend maps; the host watch's marks).
pub(super) struct Sending<'a, S> {
    sink: &'a S,
    host: &'a super::host_watch::HostWatch,
    io: &'a super::window_io::IoState,
    keeper: Option<&'a std::sync::Arc<dyn crate::protocol::keeper::Keeper>>,
}

impl<S: WindowSink> Sending<'_, S> {
    /// [`WindowSink::map`] (`m`: window offset, `fo`: file offset, `w`: writable) of the
    /// pool, which [`super::kept`] keeps on its own.
    pub(super) fn map(&self, m: u64, len: u64, fd: BorrowedFd, fo: u64, w: bool) -> io::Result<()> {
        self.io.note_map(m, len, fd, fo);
        self.sink.map(m, len, fd, fo, w)
    }

    /// [`Self::map`] of a direct window's frontend mapping of `kind`: kept (`--restartable`)
    /// as unsure before it is sent, and as sent once the frontend acknowledged it.
    pub(super) fn map_as(
        &self,
        kind: Front,
        m: u64,
        len: u64,
        fd: BorrowedFd,
        fo: u64,
        w: bool,
    ) -> io::Result<()> {
        let keep = |sent| {
            if let Some(k) = self.keeper {
                k.keep(Kept::DaxFront(m), &kind.meta(len, fo, w, sent), Some(fd));
            }
        };
        keep(false);
        self.map(m, len, fd, fo, w)?;
        keep(true);
        Ok(())
    }

    /// [`WindowSink::unmap`]: the mapping is forgotten (and its file's mark goes with its
    /// last mapping) first; its kept entry once the frontend answered.
    pub(super) fn unmap(&self, moffset: u64, len: u64) -> io::Result<()> {
        self.io.note_unmap(moffset);
        self.host.unmapped(moffset);
        let r = self.sink.unmap(moffset, len);
        if let Some(k) = self.keeper {
            k.release(Kept::DaxFront(moffset));
        }
        r
    }
}

/// Memory-table updates seen, for [`DaxWindow::with_sink`].
#[derive(Default)]
pub(super) struct TableUpdates {
    pub(super) count: u64,
    /// Whether the frontend sends a memory-table update for each SHMEM request: learnt from
    /// the first request (an update within [`COMMIT_PROBE`]) and from any update holding a
    /// host file the window mapped; `None` until then.
    pub(super) reports: Option<bool>,
}

/// How long a SHMEM request waits for the frontend's memory-table update after the ack.
pub(super) const COMMIT_WAIT: Duration = Duration::from_secs(2);
/// How long the first SHMEM request waits for one, to learn whether the frontend sends them.
pub(super) const COMMIT_PROBE: Duration = Duration::from_millis(500);

impl<S: WindowSink> DaxWindow<S> {
    /// Installs the channel to the frontend.
    pub fn set_sink(&self, sink: S) {
        if let Ok(mut s) = self.sink.write() {
            *s = Some(sink);
        }
    }

    /// The guest started using the device: requests may go to the frontend.
    pub fn start(&self) {
        self.running.store(true, Ordering::SeqCst);
        *self.paused_until.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The device paused (a vring stopped: `stop` in the monitor, a snapshot, the source of a
    /// migration): send nothing until it starts again; keep the table (QEMU keeps its SHMEM
    /// mappings across stop/cont).
    pub fn pause(&self) {
        self.running.store(false, Ordering::SeqCst);
        *self.paused_until.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.wake_commit_waiters();
    }

    /// The device was reset (RESET_DEVICE, the frontend went away) or the daemon exits: the
    /// frontend dropped every mapping (QEMU's `virtio_reset` removes them all), so do we,
    /// after writing shadows back. Sends nothing and never waits for a round trip in progress
    /// (those see the new generation and publish nothing).
    pub fn reset(&self) {
        self.running.store(false, Ordering::SeqCst);
        // The frontend dropped every mapping: none is kept any more.
        self.forget_fronts(self.io.sent_offsets());
        self.io.note_reset();
        self.host.unmapped_all();
        self.wake_commit_waiters();
        let (live, parked, _pool) = self.drain(true);
        self.forget_pool(live.iter().map(|(m, _)| *m));
        // A merge in progress (the periodic write-back, a request's sync point) ends first:
        // it never waits for the frontend, and a clean exit must not cut it short. Across
        // the new generation its release settles the range again.
        self.wait_claims(None, None, true);
        for (m, p) in live {
            self.settle(m, &p);
            if p.pooled {
                self.free_pooled(m, &p);
            }
        }
        for (s, l) in parked {
            self.free_slot(s, l);
        }
        // Inode numbers name other files in the next session: their errors go, stranded
        // bytes stay (retried by the periodic write-back) under no inode.
        self.wb.clear_owners();
        self.orphan_stranded();
    }

    /// Ends the waits of [`Self::with_sink`] for a memory-table update (the device stopped).
    pub(super) fn wake_commit_waiters(&self) {
        drop(self.committed.lock().unwrap_or_else(|e| e.into_inner()));
        self.committed_cv.notify_all();
    }

    #[cfg(test)]
    pub(super) fn device_paused_for_test(&self) {
        self.pause();
    }

    /// Records the number of regions in the frontend's memory table (every SET_MEM_TABLE,
    /// ADD_MEM_REG and REM_MEM_REG).
    /// `window_regions` of them map host files this window mapped: such a frontend (QEMU
    /// 11.1) puts every SHMEM mapping in the table, at the commit that makes it visible.
    pub fn note_table_regions(&self, n: usize, window_regions: usize) {
        let c = &self.counters;
        c.table_regions.store(n as u64, Ordering::Relaxed);
        c.peak_table_regions.fetch_max(n as u64, Ordering::Relaxed);
        let mut u = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        u.count += 1;
        if window_regions > 0 {
            u.reports = Some(true);
        }
        drop(u);
        self.committed_cv.notify_all();
    }

    /// Sends one SHMEM request with `f` and returns once the frontend has made it visible
    /// to the guest.
    ///
    /// QEMU 11.1 acknowledges SHMEM_MAP/UNMAP *before* it commits the memory-map change
    /// (`vhost_user_backend_handle_shmem_map`/`_unmap` send the reply, then call
    /// `memory_region_transaction_commit`: committing sends the backend its memory-table
    /// update, which must not wait for a backend blocked on the ack). Until that commit the
    /// vCPUs still see the window as it was: a guest that got its SETUPMAPPING reply right
    /// after the ack stored into a hole (stores dropped, loads of zeros) or into the range's
    /// previous file offset, and fio mmap verify failed with EILSEQ. The commit's listeners
    /// run in priority order, TCG's and KVM's (the vCPUs' view) before vhost's, which sends
    /// this daemon ADD_MEM_REG/REM_MEM_REG for the window mapping: that update is the
    /// witness that the change is visible. Requests are serialised so that the first
    /// update after an ack is its own (QEMU serves backend requests one at a time and
    /// finishes each commit before reading the next one). A frontend that sends no update
    /// for the first request within [`COMMIT_PROBE`] (the userspace driver) is not waited
    /// for again, unless an update holding a window-mapped host file shows it does.
    pub(super) fn with_sink<T>(
        &self,
        f: impl FnOnce(&Sending<'_, S>) -> io::Result<T>,
    ) -> io::Result<T> {
        if !self.running.load(Ordering::SeqCst) {
            log::warn!("DAX request while the device is not running: nothing sent");
            return Err(eio());
        }
        let guard = self
            .sink
            .read()
            .map_err(|_| io::Error::other("sink lock poisoned"))?;
        let Some(s) = guard.as_ref() else {
            log::warn!("DAX request before the frontend set up the backend channel");
            return Err(eio());
        };
        let _serial = self.shmem_lock.lock().unwrap_or_else(|e| e.into_inner());
        let before = self
            .committed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .count;
        let res = f(&Sending {
            sink: s,
            host: &self.host,
            io: &self.io,
            keeper: self.keeper.get(),
        })?;
        let mut u = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        let limit = match u.reports {
            Some(false) => None,
            Some(true) => Some(COMMIT_WAIT),
            None => Some(COMMIT_PROBE),
        };
        if let Some(limit) = limit.filter(|_| u.count == before) {
            self.counters.commit_waits.fetch_add(1, Ordering::Relaxed);
            let (g, timeout) = self
                .committed_cv
                .wait_timeout_while(u, limit, |u| {
                    u.count == before && self.running.load(Ordering::SeqCst)
                })
                .unwrap_or_else(|e| e.into_inner());
            u = g;
            if timeout.timed_out() && u.reports.is_none() {
                log::info!(
                    "DAX: the frontend sent no memory-table update for a SHMEM request within {COMMIT_PROBE:?}: SHMEM acks are taken as visible to the guest"
                );
                u.reports = Some(false);
            } else if timeout.timed_out() {
                log::warn!(
                    "DAX: no memory-table update from the frontend {limit:?} after a SHMEM request's ack: the guest may see the window change late"
                );
            }
        }
        if u.reports.is_none() && u.count != before {
            u.reports = Some(true);
        }
        drop(u);
        Ok(res)
    }
}
