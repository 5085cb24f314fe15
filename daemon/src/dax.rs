//! The DAX cache window: SETUPMAPPING/REMOVEMAPPING become vhost-user
//! `SHMEM_MAP`/`SHMEM_UNMAP` requests to the frontend.
//!
//! [`DaxWindow`] validates every request (bounds with checked arithmetic, page alignment,
//! non-zero length), keeps the live mappings in an interval map so that a SETUPMAPPING over a
//! live range (Linux's read-only -> writable upgrade, or a remap to another file) becomes
//! UNMAP then MAP (QEMU refuses overlapping maps), and sends nothing while the device is not
//! running (QEMU 11.1 crashes on a map before the guest started the device). Requests go out
//! through a [`WindowSink`]: the vhost-user backend channel in the daemon, a recorder in tests.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags};
use vhost::vhost_user::{Backend, VhostUserFrontendReqHandler};

use crate::mapper::Mapper;
use crate::vhost_user::BackendChannel;

/// Window mappings must be aligned to this (what INIT's `map_alignment` announces).
pub const MAP_ALIGNMENT: u64 = 4096;

/// Where map/unmap requests go.
pub trait WindowSink: Send + Sync {
    fn map(
        &self,
        moffset: u64,
        len: u64,
        fd: BorrowedFd,
        foffset: u64,
        writable: bool,
    ) -> io::Result<()>;
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

/// Counters of a window, for logs and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DaxStats {
    /// Successful maps sent to the frontend.
    pub maps: u64,
    /// Successful unmaps sent to the frontend (including those of upgrades and remaps).
    pub unmaps: u64,
    /// SETUPMAPPINGs over a live range (read-only -> writable upgrades and remaps).
    pub upgrades: u64,
    /// Requests refused or failed (invalid, or the frontend said no).
    pub failures: u64,
    /// Bytes mapped right now.
    pub mapped_bytes: u64,
}

impl std::fmt::Display for DaxStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "dax: maps={} unmaps={} upgrades={} failures={} mapped_bytes={}",
            self.maps, self.unmaps, self.upgrades, self.failures, self.mapped_bytes
        )
    }
}

/// A live mapping: its length (keyed by window offset).
type Live = u64;

#[derive(Default)]
struct Counters {
    maps: AtomicU64,
    unmaps: AtomicU64,
    upgrades: AtomicU64,
    failures: AtomicU64,
}

/// The DAX window of one device.
pub struct DaxWindow<S: WindowSink = Backend> {
    size: u64,
    sink: RwLock<Option<S>>,
    running: AtomicBool,
    /// Live mappings by window offset. The lock also serialises requests to the frontend,
    /// so the table always matches what the frontend has mapped.
    live: Mutex<BTreeMap<u64, Live>>,
    counters: Counters,
}

fn einval(why: &str) -> io::Error {
    log::warn!("DAX request refused: {why}");
    io::Error::from_raw_os_error(libc::EINVAL)
}

impl<S: WindowSink> DaxWindow<S> {
    /// A window of `size` bytes (a multiple of [`MAP_ALIGNMENT`]).
    pub fn new(size: u64) -> io::Result<Self> {
        if size == 0 || size % MAP_ALIGNMENT != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("DAX window size must be a non-zero multiple of {MAP_ALIGNMENT}"),
            ));
        }
        Ok(DaxWindow {
            size,
            sink: RwLock::new(None),
            running: AtomicBool::new(false),
            live: Mutex::new(BTreeMap::new()),
            counters: Counters::default(),
        })
    }

    /// Installs the channel to the frontend.
    pub fn set_sink(&self, sink: S) {
        if let Ok(mut s) = self.sink.write() {
            *s = Some(sink);
        }
    }

    /// The guest started using the device: requests may go to the frontend.
    pub fn start(&self) {
        self.running.store(true, Ordering::SeqCst);
    }

    /// The device stopped or was reset: the frontend dropped every mapping, so do we, and
    /// nothing more is sent until it starts again.
    pub fn stop(&self) {
        self.running.store(false, Ordering::SeqCst);
        if let Ok(mut live) = self.live.lock() {
            live.clear();
        }
    }

    pub fn stats(&self) -> DaxStats {
        let c = &self.counters;
        DaxStats {
            maps: c.maps.load(Ordering::Relaxed),
            unmaps: c.unmaps.load(Ordering::Relaxed),
            upgrades: c.upgrades.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
            mapped_bytes: self.live.lock().map(|l| l.values().sum()).unwrap_or(0),
        }
    }

    /// Checks a window range: non-empty, aligned, inside the window.
    fn check_range(&self, moffset: u64, len: u64) -> io::Result<u64> {
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
    fn overlapping(
        live: &BTreeMap<u64, Live>,
        start: u64,
        end: u64,
    ) -> io::Result<Vec<(u64, Live)>> {
        let mut out = Vec::new();
        // The mapping that starts before `start` may reach into the range.
        if let Some((&s, &m)) = live.range(..start).next_back() {
            if s + m > start {
                return Err(einval("range cuts through a live mapping"));
            }
        }
        for (&s, &m) in live.range(start..end) {
            if s + m > end {
                return Err(einval("range cuts through a live mapping"));
            }
            out.push((s, m));
        }
        Ok(out)
    }

    fn with_sink<T>(&self, f: impl FnOnce(&S) -> io::Result<T>) -> io::Result<T> {
        if !self.running.load(Ordering::SeqCst) {
            log::warn!("DAX request while the device is not running");
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let guard = self
            .sink
            .read()
            .map_err(|_| io::Error::other("sink lock poisoned"))?;
        match guard.as_ref() {
            Some(s) => f(s),
            None => {
                log::warn!("DAX request before the frontend set up the backend channel");
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
        }
    }

    fn fail<T>(&self, e: io::Error) -> io::Result<T> {
        self.counters.failures.fetch_add(1, Ordering::Relaxed);
        Err(e)
    }

    fn unmap_locked(&self, live: &mut BTreeMap<u64, Live>, start: u64, m: Live) -> io::Result<()> {
        self.with_sink(|s| s.unmap(start, m)).map_err(|e| {
            log::error!("SHMEM_UNMAP {start:#x}+{:#x} failed: {e}", m);
            io::Error::from_raw_os_error(libc::EIO)
        })?;
        live.remove(&start);
        self.counters.unmaps.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl<S: WindowSink> Mapper for DaxWindow<S> {
    fn window_size(&self) -> u64 {
        self.size
    }

    fn map(
        &self,
        moffset: u64,
        len: u64,
        fd: BorrowedFd,
        foffset: u64,
        writable: bool,
    ) -> io::Result<()> {
        let end = match self.check_range(moffset, len) {
            Ok(end) => end,
            Err(e) => return self.fail(e),
        };
        if foffset % MAP_ALIGNMENT != 0 || foffset.checked_add(len).is_none() {
            return self.fail(einval("file offset not page aligned or overflowing"));
        }
        let Ok(mut live) = self.live.lock() else {
            return self.fail(io::Error::other("mapping table lock poisoned"));
        };
        let old = match Self::overlapping(&live, moffset, end) {
            Ok(v) => v,
            Err(e) => return self.fail(e),
        };
        if !old.is_empty() {
            self.counters.upgrades.fetch_add(1, Ordering::Relaxed);
        }
        for (s, m) in old {
            if let Err(e) = self.unmap_locked(&mut live, s, m) {
                return self.fail(e);
            }
        }
        if let Err(e) = self.with_sink(|s| s.map(moffset, len, fd, foffset, writable)) {
            log::error!("SHMEM_MAP {moffset:#x}+{len:#x} failed: {e}");
            return self.fail(io::Error::from_raw_os_error(libc::EIO));
        }
        live.insert(moffset, len);
        self.counters.maps.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn unmap(&self, moffset: u64, len: u64) -> io::Result<()> {
        let end = match self.check_range(moffset, len) {
            Ok(end) => end,
            Err(e) => return self.fail(e),
        };
        let Ok(mut live) = self.live.lock() else {
            return self.fail(io::Error::other("mapping table lock poisoned"));
        };
        let old = match Self::overlapping(&live, moffset, end) {
            Ok(v) => v,
            Err(e) => return self.fail(e),
        };
        // Nothing mapped there: nothing to do (the guest may remove a range it never got).
        for (s, m) in old {
            if let Err(e) = self.unmap_locked(&mut live, s, m) {
                return self.fail(e);
            }
        }
        Ok(())
    }
}

impl BackendChannel for DaxWindow<Backend> {
    fn set_channel(&self, backend: Backend) {
        log::info!(
            "backend request channel ready: DAX window of {} bytes",
            self.size
        );
        self.set_sink(backend);
    }

    fn device_started(&self) {
        self.start();
    }

    fn device_stopped(&self) {
        self.stop();
    }

    fn window_size(&self) -> u64 {
        self.size
    }
}

impl<S: WindowSink> Mapper for std::sync::Arc<DaxWindow<S>> {
    fn window_size(&self) -> u64 {
        self.as_ref().window_size()
    }
    fn map(
        &self,
        moffset: u64,
        len: u64,
        fd: BorrowedFd,
        foffset: u64,
        writable: bool,
    ) -> io::Result<()> {
        self.as_ref().map(moffset, len, fd, foffset, writable)
    }
    fn unmap(&self, moffset: u64, len: u64) -> io::Result<()> {
        self.as_ref().unmap(moffset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[derive(Default)]
    struct Rec {
        calls: Mutex<Vec<String>>,
        fail_map: AtomicBool,
    }

    impl WindowSink for std::sync::Arc<Rec> {
        fn map(
            &self,
            moffset: u64,
            len: u64,
            _fd: BorrowedFd,
            foffset: u64,
            writable: bool,
        ) -> io::Result<()> {
            if self.fail_map.load(Ordering::SeqCst) {
                return Err(io::Error::other("frontend said no"));
            }
            let w = if writable { "rw" } else { "ro" };
            self.calls
                .lock()
                .unwrap()
                .push(format!("map {moffset:#x}+{len:#x}@{foffset:#x} {w}"));
            Ok(())
        }
        fn unmap(&self, moffset: u64, len: u64) -> io::Result<()> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("unmap {moffset:#x}+{len:#x}"));
            Ok(())
        }
    }

    const MB2: u64 = 2 << 20;

    fn window() -> (
        DaxWindow<std::sync::Arc<Rec>>,
        std::sync::Arc<Rec>,
        std::fs::File,
    ) {
        let w = DaxWindow::new(8 * MB2).unwrap();
        let rec = std::sync::Arc::new(Rec::default());
        w.set_sink(rec.clone());
        w.start();
        (w, rec, tempfile::tempfile().unwrap())
    }

    fn calls(r: &Rec) -> Vec<String> {
        std::mem::take(&mut *r.calls.lock().unwrap())
    }

    #[test]
    fn map_unmap_round_trip() {
        let (w, rec, f) = window();
        w.map(MB2, MB2, f.as_fd(), 0, false).unwrap();
        assert_eq!(w.stats().mapped_bytes, MB2);
        w.unmap(MB2, MB2).unwrap();
        assert_eq!(
            calls(&rec),
            vec!["map 0x200000+0x200000@0x0 ro", "unmap 0x200000+0x200000"]
        );
        let s = w.stats();
        assert_eq!(
            (s.maps, s.unmaps, s.upgrades, s.failures, s.mapped_bytes),
            (1, 1, 0, 0, 0)
        );
    }

    #[test]
    fn remap_of_live_range_is_unmap_then_map() {
        let (w, rec, f) = window();
        w.map(0, MB2, f.as_fd(), 0, false).unwrap();
        w.map(0, MB2, f.as_fd(), 0, true).unwrap();
        assert_eq!(
            calls(&rec),
            vec![
                "map 0x0+0x200000@0x0 ro",
                "unmap 0x0+0x200000",
                "map 0x0+0x200000@0x0 rw"
            ]
        );
        assert_eq!(w.stats().upgrades, 1);
        assert_eq!(w.stats().mapped_bytes, MB2);
    }

    #[test]
    fn invalid_requests_send_nothing() {
        let (w, rec, f) = window();
        let fd = f.as_fd();
        assert!(w.map(0, 0, fd, 0, false).is_err(), "zero length");
        assert!(w.map(8 * MB2, MB2, fd, 0, false).is_err(), "past the end");
        assert!(
            w.map(u64::MAX - 4095, 8192, fd, 0, false).is_err(),
            "overflowing sum"
        );
        assert!(
            w.map(100, MB2, fd, 0, false).is_err(),
            "unaligned window offset"
        );
        assert!(
            w.map(0, MB2, fd, 7, false).is_err(),
            "unaligned file offset"
        );
        assert!(
            w.map(0, MB2, fd, u64::MAX - 4095, false).is_err(),
            "file range overflows"
        );
        assert!(w.unmap(0, !4095).is_err(), "unmap past the end");
        assert!(calls(&rec).is_empty());
        assert_eq!(w.stats().failures, 7);
    }

    #[test]
    fn partial_overlaps_are_refused() {
        let (w, rec, f) = window();
        w.map(MB2, MB2, f.as_fd(), 0, false).unwrap();
        calls(&rec);
        assert!(w.map(MB2 + 4096, MB2, f.as_fd(), 0, false).is_err());
        assert!(w.map(0, MB2 + 4096, f.as_fd(), 0, false).is_err());
        assert!(w.unmap(MB2, 4096).is_err());
        assert!(calls(&rec).is_empty());
        // A range that covers it wholly replaces it.
        w.map(0, 4 * MB2, f.as_fd(), 0, false).unwrap();
        assert_eq!(
            calls(&rec),
            vec!["unmap 0x200000+0x200000", "map 0x0+0x800000@0x0 ro"]
        );
    }

    #[test]
    fn unmapping_an_unmapped_range_is_a_no_op() {
        let (w, rec, _f) = window();
        w.unmap(0, MB2).unwrap();
        assert!(calls(&rec).is_empty());
        assert_eq!(w.stats().failures, 0);
    }

    #[test]
    fn nothing_is_sent_while_stopped() {
        let (w, rec, f) = window();
        w.map(0, MB2, f.as_fd(), 0, false).unwrap();
        w.stop();
        assert_eq!(w.stats().mapped_bytes, 0, "reset forgets every mapping");
        calls(&rec);
        assert!(w.map(0, MB2, f.as_fd(), 0, false).is_err());
        assert!(calls(&rec).is_empty());
        w.start();
        w.map(0, MB2, f.as_fd(), 0, false).unwrap();
        assert_eq!(
            calls(&rec),
            vec!["map 0x0+0x200000@0x0 ro"],
            "no stale unmap after reset"
        );
    }

    #[test]
    fn frontend_refusal_is_eio_and_counted() {
        let (w, rec, f) = window();
        rec.fail_map.store(true, Ordering::SeqCst);
        let e = w.map(0, MB2, f.as_fd(), 0, false).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert_eq!(w.stats().failures, 1);
        assert_eq!(w.stats().mapped_bytes, 0);
    }
}
