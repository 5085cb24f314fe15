//! The DAX cache window: SETUPMAPPING/REMOVEMAPPING become vhost-user
//! `SHMEM_MAP`/`SHMEM_UNMAP` requests to the frontend.
//!
//! [`DaxWindow`] validates every request (bounds with checked arithmetic, page alignment,
//! non-zero length), keeps the live mappings in an interval map so that a SETUPMAPPING over a
//! live range (Linux's read-only -> writable upgrade, or a remap to another file) becomes
//! UNMAP then MAP (QEMU refuses overlapping maps), and sends nothing while the device is not
//! running (QEMU 11.1 crashes on a map before the guest started the device). Requests go out
//! through a [`WindowSink`]: the vhost-user backend channel in the daemon, a recorder in tests.
//!
//! QEMU 11.1 refuses to map a file range the file does not wholly cover, but Linux maps
//! 2 MiB ranges whatever the file size. So each guest mapping is placed as up to two frontend
//! mappings: the file's whole pages, then a shadow tail ([`tail::Tail`]) for the rest. The
//! server keeps tails coherent with the request path through [`Mapper::sync`] (write guest
//! changes back before the file is touched) and [`Mapper::refresh`] (re-place an inode's
//! mappings after its size changed).

pub mod tail;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

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
    /// SETUPMAPPINGs placed in the frontend.
    pub maps: u64,
    /// Guest mappings removed (by REMOVEMAPPING, upgrades and remaps).
    pub unmaps: u64,
    /// SETUPMAPPINGs over a live range (read-only -> writable upgrades and remaps).
    pub upgrades: u64,
    /// Requests refused or failed (invalid, or the frontend said no).
    pub failures: u64,
    /// Bytes mapped right now.
    pub mapped_bytes: u64,
    /// Mappings that needed a shadow tail (file shorter than the range).
    pub tails: u64,
    /// Tail bytes written back to files.
    pub written_back: u64,
}

impl std::fmt::Display for DaxStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "dax: maps={} unmaps={} upgrades={} failures={} mapped_bytes={} tails={} written_back={}",
            self.maps, self.unmaps, self.upgrades, self.failures, self.mapped_bytes, self.tails, self.written_back
        )
    }
}

/// One guest mapping as placed in the frontend.
struct Placed {
    owner: u64,
    len: u64,
    foffset: u64,
    writable: bool,
    /// The mapped file (kept to re-place the mapping and write the tail back).
    file: Arc<File>,
    /// Bytes `[0, file_len)` of the range are mapped from the file.
    file_len: u64,
    /// The rest, when the file does not cover it.
    tail: Option<tail::Tail>,
}

#[derive(Default)]
struct Table {
    live: BTreeMap<u64, Placed>,
    by_owner: HashMap<u64, BTreeSet<u64>>,
}

impl Table {
    fn insert(&mut self, moffset: u64, p: Placed) {
        self.by_owner.entry(p.owner).or_default().insert(moffset);
        self.live.insert(moffset, p);
    }

    fn remove(&mut self, moffset: u64) -> Option<Placed> {
        let p = self.live.remove(&moffset)?;
        if let Some(set) = self.by_owner.get_mut(&p.owner) {
            set.remove(&moffset);
            if set.is_empty() {
                self.by_owner.remove(&p.owner);
            }
        }
        Some(p)
    }

    fn of_owner(&self, owner: u64) -> Vec<u64> {
        self.by_owner
            .get(&owner)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }
}

#[derive(Default)]
struct Counters {
    maps: AtomicU64,
    unmaps: AtomicU64,
    upgrades: AtomicU64,
    failures: AtomicU64,
    tails: AtomicU64,
    written_back: AtomicU64,
}

/// The DAX window of one device.
pub struct DaxWindow<S: WindowSink = Backend> {
    size: u64,
    sink: RwLock<Option<S>>,
    running: AtomicBool,
    /// Live mappings. The lock also serialises requests to the frontend, so the table
    /// always matches what the frontend has mapped.
    table: Mutex<Table>,
    counters: Counters,
}

fn einval(why: &str) -> io::Error {
    log::warn!("DAX request refused: {why}");
    io::Error::from_raw_os_error(libc::EINVAL)
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
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
            table: Mutex::new(Table::default()),
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

    /// The device stopped or was reset: the frontend dropped every mapping, so do we (after
    /// writing shadow tails back), and nothing more is sent until it starts again.
    pub fn stop(&self) {
        // Every request to the frontend is sent with the table lock held and after checking
        // `running`: taking the lock first means none is in flight once this returns.
        let guard = self.table.lock();
        self.running.store(false, Ordering::SeqCst);
        if let Ok(mut t) = guard {
            let all: Vec<u64> = t.live.keys().copied().collect();
            for m in all {
                if let Some(mut p) = t.remove(m) {
                    self.write_back(&mut p);
                }
            }
        }
    }

    pub fn stats(&self) -> DaxStats {
        let c = &self.counters;
        DaxStats {
            maps: c.maps.load(Ordering::Relaxed),
            unmaps: c.unmaps.load(Ordering::Relaxed),
            upgrades: c.upgrades.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
            mapped_bytes: self
                .table
                .lock()
                .map(|t| t.live.values().map(|p| p.len).sum())
                .unwrap_or(0),
            tails: c.tails.load(Ordering::Relaxed),
            written_back: c.written_back.load(Ordering::Relaxed),
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
    fn overlapping(t: &Table, start: u64, end: u64) -> io::Result<Vec<u64>> {
        // The mapping that starts before `start` may reach into the range.
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

    fn lock(&self) -> io::Result<MutexGuard<'_, Table>> {
        self.table
            .lock()
            .map_err(|_| io::Error::other("mapping table lock poisoned"))
    }

    fn with_sink<T>(&self, f: impl FnOnce(&S) -> io::Result<T>) -> io::Result<T> {
        if !self.running.load(Ordering::SeqCst) {
            log::warn!("DAX request while the device is not running");
            return Err(eio());
        }
        let guard = self
            .sink
            .read()
            .map_err(|_| io::Error::other("sink lock poisoned"))?;
        match guard.as_ref() {
            Some(s) => f(s),
            None => {
                log::warn!("DAX request before the frontend set up the backend channel");
                Err(eio())
            }
        }
    }

    /// Counts a refused or failed request.
    fn counted<T>(&self, res: io::Result<T>) -> io::Result<T> {
        if res.is_err() {
            self.counters.failures.fetch_add(1, Ordering::Relaxed);
        }
        res
    }

    /// Checks a window range and takes every live mapping wholly inside it out of the
    /// frontend. Returns the locked table (so the caller can place a new mapping before
    /// anyone else sends) and whether anything was removed.
    fn clear_range(&self, moffset: u64, len: u64) -> io::Result<(MutexGuard<'_, Table>, bool)> {
        let end = self.check_range(moffset, len)?;
        let mut t = self.lock()?;
        let old = Self::overlapping(&t, moffset, end)?;
        let replaced = !old.is_empty();
        for s in old {
            self.remove_locked(&mut t, s)?;
        }
        Ok((t, replaced))
    }

    fn write_back(&self, p: &mut Placed) {
        if !p.writable {
            return;
        }
        if let Some(t) = p.tail.as_mut() {
            match t.write_back(&p.file, p.foffset + p.file_len) {
                Ok(n) => {
                    self.counters
                        .written_back
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) => log::error!("writing a DAX tail back to its file failed: {e}"),
            }
        }
    }

    /// Places a guest mapping in the frontend: the file's whole pages, then a shadow tail.
    #[allow(clippy::too_many_arguments)]
    fn place(
        &self,
        owner: u64,
        moffset: u64,
        len: u64,
        file: Arc<File>,
        foffset: u64,
        writable: bool,
    ) -> io::Result<Placed> {
        let size = crate::sys::fstat(file.as_fd())?.st_size.max(0) as u64;
        let (file_len, valid) = tail::layout(size, foffset, len);
        if file_len > 0 {
            self.with_sink(|s| s.map(moffset, file_len, file.as_fd(), foffset, writable))
                .map_err(|e| {
                    log::error!("SHMEM_MAP {moffset:#x}+{file_len:#x} failed: {e}");
                    eio()
                })?;
        }
        let mut tail = None;
        if file_len < len {
            let t =
                tail::Tail::new(&file, foffset + file_len, valid, len - file_len).and_then(|t| {
                    self.with_sink(|s| {
                        s.map(moffset + file_len, len - file_len, t.fd(), 0, writable)
                    })?;
                    Ok(t)
                });
            match t {
                Ok(t) => {
                    self.counters.tails.fetch_add(1, Ordering::Relaxed);
                    tail = Some(t);
                }
                Err(e) => {
                    log::error!(
                        "SHMEM_MAP of the tail at {:#x} failed: {e}",
                        moffset + file_len
                    );
                    if file_len > 0 {
                        let _ = self.with_sink(|s| s.unmap(moffset, file_len));
                    }
                    return Err(eio());
                }
            }
        }
        Ok(Placed {
            owner,
            len,
            foffset,
            writable,
            file,
            file_len,
            tail,
        })
    }

    /// Takes a placed mapping out of the frontend (its tail written back first).
    fn unplace(&self, moffset: u64, p: &mut Placed) -> io::Result<()> {
        self.write_back(p);
        let mut res = Ok(());
        if p.file_len > 0 {
            res = self.with_sink(|s| s.unmap(moffset, p.file_len));
        }
        if p.tail.is_some() {
            let r = self.with_sink(|s| s.unmap(moffset + p.file_len, p.len - p.file_len));
            res = res.and(r);
        }
        res.map_err(|e| {
            log::error!("SHMEM_UNMAP {moffset:#x}+{:#x} failed: {e}", p.len);
            eio()
        })
    }

    fn remove_locked(&self, t: &mut Table, moffset: u64) -> io::Result<()> {
        if let Some(mut p) = t.remove(moffset) {
            self.unplace(moffset, &mut p)?;
            self.counters.unmaps.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl<S: WindowSink> Mapper for DaxWindow<S> {
    fn window_size(&self) -> u64 {
        self.size
    }

    fn map(
        &self,
        owner: u64,
        moffset: u64,
        len: u64,
        fd: BorrowedFd,
        foffset: u64,
        writable: bool,
    ) -> io::Result<()> {
        let res = (|| {
            self.check_range(moffset, len)?;
            if foffset % MAP_ALIGNMENT != 0 || foffset.checked_add(len).is_none() {
                return Err(einval("file offset not page aligned or overflowing"));
            }
            let file = Arc::new(File::from(fd.try_clone_to_owned()?));
            let (mut t, replaced) = self.clear_range(moffset, len)?;
            if replaced {
                self.counters.upgrades.fetch_add(1, Ordering::Relaxed);
            }
            let p = self.place(owner, moffset, len, file, foffset, writable)?;
            t.insert(moffset, p);
            self.counters.maps.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })();
        self.counted(res)
    }

    fn unmap(&self, moffset: u64, len: u64) -> io::Result<()> {
        // Nothing mapped there: nothing to do (the guest may remove a range it never got).
        let res = self.clear_range(moffset, len).map(drop);
        self.counted(res)
    }

    fn sync(&self, owner: u64) {
        let Ok(mut t) = self.table.lock() else { return };
        for m in t.of_owner(owner) {
            if let Some(p) = t.live.get_mut(&m) {
                self.write_back(p);
            }
        }
    }

    fn end_session(&self) {
        let Ok(mut t) = self.table.lock() else { return };
        let all: Vec<u64> = t.live.keys().copied().collect();
        for m in all {
            if let Err(e) = self.remove_locked(&mut t, m) {
                log::warn!("end of session: removing DAX mapping {m:#x} failed: {e}");
            }
        }
    }

    fn refresh(&self, owner: u64) {
        let Ok(mut t) = self.table.lock() else { return };
        for m in t.of_owner(owner) {
            let Some(p) = t.live.get(&m) else { continue };
            let size = crate::sys::fstat(p.file.as_fd()).map(|s| s.st_size.max(0) as u64);
            let Ok(size) = size else { continue };
            if p.tail.is_none() && tail::layout(size, p.foffset, p.len).0 == p.file_len {
                continue;
            }
            let Some(mut p) = t.remove(m) else { continue };
            let replaced = self.unplace(m, &mut p).and_then(|()| {
                self.place(p.owner, m, p.len, p.file.clone(), p.foffset, p.writable)
            });
            match replaced {
                Ok(np) => t.insert(m, np),
                Err(e) => {
                    // The guest's mapping is gone from the frontend: its next access faults
                    // there instead of reading stale data.
                    log::error!("re-placing DAX mapping {m:#x} after a size change failed: {e}");
                    self.counters.failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
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

    fn device_paused(&self) {
        // Interim: send nothing while paused; the mapping table is kept as it is.
        self.running.store(false, Ordering::SeqCst);
    }

    fn device_reset(&self) {
        self.stop();
    }

    fn window_size(&self) -> u64 {
        self.size
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
        (w, rec, {
            let f = tempfile::tempfile().unwrap();
            f.set_len(16 * MB2).unwrap();
            f
        })
    }

    fn calls(r: &Rec) -> Vec<String> {
        std::mem::take(&mut *r.calls.lock().unwrap())
    }

    #[test]
    fn map_unmap_round_trip() {
        let (w, rec, f) = window();
        w.map(7, MB2, MB2, f.as_fd(), 0, false).unwrap();
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
        w.map(7, 0, MB2, f.as_fd(), 0, false).unwrap();
        w.map(7, 0, MB2, f.as_fd(), 0, true).unwrap();
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
        assert!(w.map(7, 0, 0, fd, 0, false).is_err(), "zero length");
        assert!(
            w.map(7, 8 * MB2, MB2, fd, 0, false).is_err(),
            "past the end"
        );
        assert!(
            w.map(7, u64::MAX - 4095, 8192, fd, 0, false).is_err(),
            "overflowing sum"
        );
        assert!(
            w.map(7, 100, MB2, fd, 0, false).is_err(),
            "unaligned window offset"
        );
        assert!(
            w.map(7, 0, MB2, fd, 7, false).is_err(),
            "unaligned file offset"
        );
        assert!(
            w.map(7, 0, MB2, fd, u64::MAX - 4095, false).is_err(),
            "file range overflows"
        );
        assert!(w.unmap(0, !4095).is_err(), "unmap past the end");
        assert!(calls(&rec).is_empty());
        assert_eq!(w.stats().failures, 7);
    }

    #[test]
    fn partial_overlaps_are_refused() {
        let (w, rec, f) = window();
        w.map(7, MB2, MB2, f.as_fd(), 0, false).unwrap();
        calls(&rec);
        assert!(w.map(7, MB2 + 4096, MB2, f.as_fd(), 0, false).is_err());
        assert!(w.map(7, 0, MB2 + 4096, f.as_fd(), 0, false).is_err());
        assert!(w.unmap(MB2, 4096).is_err());
        assert!(calls(&rec).is_empty());
        // A range that covers it wholly replaces it.
        w.map(7, 0, 4 * MB2, f.as_fd(), 0, false).unwrap();
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
        w.map(7, 0, MB2, f.as_fd(), 0, false).unwrap();
        w.stop();
        assert_eq!(w.stats().mapped_bytes, 0, "reset forgets every mapping");
        calls(&rec);
        assert!(w.map(7, 0, MB2, f.as_fd(), 0, false).is_err());
        assert!(calls(&rec).is_empty());
        w.start();
        w.map(7, 0, MB2, f.as_fd(), 0, false).unwrap();
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
        let e = w.map(7, 0, MB2, f.as_fd(), 0, false).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert_eq!(w.stats().failures, 1);
        assert_eq!(w.stats().mapped_bytes, 0);
    }

    #[test]
    fn short_files_get_a_shadow_tail() {
        let (w, rec, f) = window();
        f.set_len(MB2 / 2 + 100).unwrap();
        w.map(7, 0, MB2, f.as_fd(), 0, true).unwrap();
        assert_eq!(
            calls(&rec),
            vec!["map 0x0+0x100000@0x0 rw", "map 0x100000+0x100000@0x0 rw"],
            "whole pages from the file, the rest from a tail"
        );
        assert_eq!(w.stats().tails, 1);
        // Growing the file through the request path re-places the mapping.
        f.set_len(MB2).unwrap();
        w.refresh(7);
        assert_eq!(
            calls(&rec),
            vec![
                "unmap 0x0+0x100000",
                "unmap 0x100000+0x100000",
                "map 0x0+0x200000@0x0 rw"
            ]
        );
        assert_eq!(w.stats().tails, 1, "no tail needed any more");
        // Refreshing an inode whose mappings are whole does nothing.
        w.refresh(7);
        w.refresh(8);
        assert!(calls(&rec).is_empty());
        // Shrinking splits it again.
        f.set_len(4096).unwrap();
        w.refresh(7);
        assert_eq!(
            calls(&rec),
            vec![
                "unmap 0x0+0x200000",
                "map 0x0+0x1000@0x0 rw",
                "map 0x1000+0x1ff000@0x0 rw"
            ]
        );
    }

    #[test]
    fn empty_files_map_only_a_tail() {
        let (w, rec, f) = window();
        f.set_len(0).unwrap();
        w.map(7, MB2, MB2, f.as_fd(), 0, false).unwrap();
        assert_eq!(calls(&rec), vec!["map 0x200000+0x200000@0x0 ro"]);
        assert_eq!(f.metadata().unwrap().len(), 0, "the file is never extended");
    }
}
