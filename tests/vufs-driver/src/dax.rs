//! The DAX window (virtio shared memory region 0) and the thread that serves the backend's
//! `SHMEM_MAP` / `SHMEM_UNMAP` requests into it, with QEMU 11.1's rules: a map must not overlap
//! a live mapping, an unmap must name exactly one live mapping (same offset and length).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags};
use vhost::vhost_user::{Error as VuError, FrontendReqHandler, VhostUserFrontendReqHandler};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

const PAGE: u64 = 4096;

/// Live SHMEM mappings QEMU 11.1 can hold for a vhost-user device: its vhost memory listener
/// puts every fd-backed RAM section into the backend's memory table, each SHMEM mapping
/// included, and `vhost_user_add_remove_regions` asserts the table holds at most
/// `VHOST_USER_MAX_RAM_SLOTS` = 512 regions (QEMU aborts past it). This driver's guest memory
/// is one region. The driver refuses a map past the limit and records a violation.
pub const QEMU_SLOT_LIMIT: usize = 512 - 1;

/// The DAX mapping mode a test with a window runs in when it names none: `VUFS_DAX_MAPPING`
/// (`pooled` or `direct`), `direct` when unset.
pub fn mapping_mode() -> &'static str {
    match std::env::var("VUFS_DAX_MAPPING").as_deref() {
        Ok("pooled") => "pooled",
        Ok("direct") | Err(_) => "direct",
        Ok(other) => panic!("VUFS_DAX_MAPPING={other}: use pooled or direct"),
    }
}

/// Whether this run's DAX tests are pooled ([`mapping_mode`]).
pub fn pooled() -> bool {
    mapping_mode() == "pooled"
}

/// One live mapping in the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    pub shm_offset: u64,
    pub len: u64,
    pub fd_offset: u64,
    pub writable: bool,
}

/// Counters of backend requests on the window.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DaxStats {
    pub map_requests: u64,
    pub unmap_requests: u64,
    pub maps_rejected: u64,
    pub unmaps_rejected: u64,
}

struct WindowState {
    maps: BTreeMap<u64, Mapping>,
    stats: DaxStats,
    /// Set while the device is started; requests outside that are violations (QEMU 11.1.3
    /// crashes on a map before the guest started the device).
    started: bool,
    /// Set from the first GET_VRING_BASE of a stop until the device starts again. QEMU 11.1
    /// reads the backend channel only after its vhost_dev_stop returned, which leaves the
    /// device pointer NULL, and its SHMEM handlers dereference it: a request the frontend
    /// reads in that time is a segfault there (a violation here).
    stopping: bool,
    violations: Vec<String>,
    /// Live mappings allowed at once (QEMU's slots).
    slot_limit: usize,
    /// Most mappings ever live at once.
    peak: usize,
}

/// A reserved `PROT_NONE` address range the backend maps file ranges into.
pub struct DaxWindow {
    base: usize,
    len: u64,
    state: Mutex<WindowState>,
    /// Delay before each SHMEM reply, in microseconds (a frontend whose main loop is busy).
    reply_delay_us: std::sync::atomic::AtomicU64,
    /// Held while the frontend is "inside" a control-channel request: like QEMU's main loop,
    /// it serves no backend request until that request's reply arrives.
    busy: Mutex<()>,
}

impl DaxWindow {
    /// Reserves `len` bytes (a multiple of the page size).
    pub fn new(len: u64) -> io::Result<DaxWindow> {
        if len == 0 || len % PAGE != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("DAX window size {len:#x} is not a non-zero multiple of the page size"),
            ));
        }
        let size = usize::try_from(len).map_err(io::Error::other)?;
        // SAFETY: anonymous PROT_NONE reservation at an address of the kernel's choosing;
        // touches no existing mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(DaxWindow {
            base: p as usize,
            len,
            state: Mutex::new(WindowState {
                maps: BTreeMap::new(),
                stats: DaxStats::default(),
                started: false,
                stopping: false,
                violations: Vec::new(),
                slot_limit: QEMU_SLOT_LIMIT,
                peak: 0,
            }),
            reply_delay_us: std::sync::atomic::AtomicU64::new(0),
            busy: Mutex::new(()),
        })
    }

    /// Window size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false (a window has a non-zero size); for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of the window in this process. Bytes are accessible only inside live
    /// mappings, and only while they stay mapped: prefer [`DaxWindow::read`].
    pub fn as_ptr(&self) -> *const u8 {
        self.base as *const u8
    }

    fn lock(&self) -> MutexGuard<'_, WindowState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Live mappings, by window offset.
    pub fn mappings(&self) -> Vec<Mapping> {
        self.lock().maps.values().copied().collect()
    }

    /// Request counters.
    pub fn stats(&self) -> DaxStats {
        self.lock().stats
    }

    /// Requests that broke the rules (outside a started device): empty for a good backend.
    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    /// Sets how many mappings may be live at once (default [`QEMU_SLOT_LIMIT`]).
    pub fn set_slot_limit(&self, n: usize) {
        self.lock().slot_limit = n;
    }

    /// Most mappings live at once so far.
    pub fn peak(&self) -> usize {
        self.lock().peak
    }

    /// Delays every SHMEM reply by `d`.
    pub fn set_reply_delay(&self, d: Duration) {
        self.reply_delay_us
            .store(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Blocks the backend-request channel until the guard drops, as QEMU's main loop does
    /// while it waits for the reply to a control request (GET_VRING_BASE, RESET_DEVICE).
    pub fn hold_backend_channel(&self) -> MutexGuard<'_, ()> {
        self.busy.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn frontend_turn(&self) {
        let d = self.reply_delay_us.load(Ordering::Relaxed);
        if d > 0 {
            std::thread::sleep(Duration::from_micros(d));
        }
        drop(self.hold_backend_channel());
    }

    /// What QEMU does on `stop` (vhost_dev_stop): vrings stop, mappings stay, and no request
    /// is accepted until the device starts again.
    pub fn pause(&self) {
        self.lock().started = false;
    }

    pub(crate) fn set_started(&self, started: bool) {
        let mut st = self.lock();
        st.started = started;
        if started {
            st.stopping = false;
        }
    }

    /// A device stop begins (before its first GET_VRING_BASE): see `WindowState::stopping`.
    pub(crate) fn begin_stop(&self) {
        self.lock().stopping = true;
    }

    /// The frontend reads a backend request (before it serves it).
    fn on_read(&self, what: &str, off: u64, len: u64) {
        let mut st = self.lock();
        if st.stopping {
            st.violations.push(format!(
                "{what} {off:#x}+{len:#x} read after a device stop began (QEMU 11.1 segfaults: \
                 its vhost_dev_stop left the device pointer NULL)"
            ));
        }
    }

    /// What QEMU does on a device reset (`virtio_reset`: "mappings are removed to prevent
    /// stale fds from remaining open"): every mapping is dropped and no request is accepted
    /// until the device starts again.
    pub(crate) fn reset(&self) {
        let mut st = self.lock();
        st.started = false;
        let maps = std::mem::take(&mut st.maps);
        for m in maps.values() {
            self.reserve(m.shm_offset, m.len);
        }
    }

    /// Copies window bytes at `offset` into `buf`. Fails unless the whole range lies in live
    /// mappings. The mapped file must be at least as long as the range (else SIGBUS, as for
    /// a guest).
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let st = self.lock();
        self.check_covered(&st, offset, buf.len() as u64, false)?;
        // SAFETY: [offset, offset+len) lies inside the window and inside live mappings with
        // PROT_READ (checked above); the lock keeps them mapped during the copy; `buf` is a
        // distinct, valid destination.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.base + offset as usize) as *const u8,
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        Ok(())
    }

    /// Copies `data` into the window at `offset`; the range must lie in writable mappings.
    pub fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let st = self.lock();
        self.check_covered(&st, offset, data.len() as u64, true)?;
        // SAFETY: the range is inside the window and inside live PROT_READ|PROT_WRITE shared
        // mappings (checked above), kept mapped by the lock; `data` does not overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.base + offset as usize) as *mut u8,
                data.len(),
            )
        };
        Ok(())
    }

    fn check_covered(
        &self,
        st: &WindowState,
        offset: u64,
        len: u64,
        write: bool,
    ) -> io::Result<()> {
        let end = offset
            .checked_add(len)
            .filter(|e| *e <= self.len)
            .ok_or_else(|| einval(format!("range {offset:#x}+{len:#x} outside the window")))?;
        let mut at = offset;
        while at < end {
            let m = st
                .maps
                .range(..=at)
                .next_back()
                .map(|(_, m)| *m)
                .filter(|m| at < m.shm_offset + m.len)
                .ok_or_else(|| einval(format!("window offset {at:#x} is not mapped")))?;
            if write && !m.writable {
                return Err(einval(format!("window offset {at:#x} is mapped read-only")));
            }
            at = m.shm_offset + m.len;
        }
        Ok(())
    }

    fn map(&self, req: &VhostUserMMap, fd: RawFd) -> io::Result<u64> {
        let (shmid, fd_offset, off, len, flags) =
            (req.shmid, req.fd_offset, req.shm_offset, req.len, req.flags);
        let mut st = self.lock();
        st.stats.map_requests += 1;
        let writable = flags & VhostUserMMapFlags::WRITABLE.bits() != 0;
        let res = (|| {
            self.check_request(&mut st, "SHMEM_MAP", shmid, off, len)?;
            if fd_offset % PAGE != 0 {
                return Err(einval(format!("fd offset {fd_offset:#x} not page aligned")));
            }
            let end = off + len;
            if let Some((_, m)) = st.maps.range(..end).next_back() {
                if m.shm_offset + m.len > off {
                    return Err(einval(format!(
                        "map {off:#x}+{len:#x} overlaps live mapping {:#x}+{:#x}",
                        m.shm_offset, m.len
                    )));
                }
            }
            if st.maps.len() >= st.slot_limit {
                let v = format!(
                    "SHMEM_MAP {off:#x}+{len:#x} with {} mappings live: past the {} memory slots QEMU has",
                    st.maps.len(),
                    st.slot_limit
                );
                st.violations.push(v.clone());
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
            let foff = libc::off_t::try_from(fd_offset).map_err(|_| einval("fd offset too big"))?;
            // SAFETY: the target range [base+off, base+off+len) lies inside our reserved window
            // (checked) and overlaps no live mapping, so MAP_FIXED replaces only our own
            // PROT_NONE reservation; `fd` is valid for the duration of the call.
            let p = unsafe {
                libc::mmap(
                    (self.base + off as usize) as *mut libc::c_void,
                    len as usize,
                    prot,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd,
                    foff,
                )
            };
            if p == libc::MAP_FAILED {
                let e = io::Error::last_os_error();
                self.reserve(off, len);
                return Err(e);
            }
            st.maps.insert(
                off,
                Mapping {
                    shm_offset: off,
                    len,
                    fd_offset,
                    writable,
                },
            );
            st.peak = st.peak.max(st.maps.len());
            Ok(0)
        })();
        if res.is_err() {
            st.stats.maps_rejected += 1;
        }
        res
    }

    fn unmap(&self, req: &VhostUserMMap) -> io::Result<u64> {
        let (shmid, off, len) = (req.shmid, req.shm_offset, req.len);
        let mut st = self.lock();
        st.stats.unmap_requests += 1;
        let res = (|| {
            self.check_request(&mut st, "SHMEM_UNMAP", shmid, off, len)?;
            match st.maps.get(&off) {
                Some(m) if m.len == len => {}
                _ => {
                    return Err(einval(format!(
                        "unmap {off:#x}+{len:#x} does not name exactly one live mapping"
                    )))
                }
            }
            self.reserve(off, len);
            st.maps.remove(&off);
            Ok(0)
        })();
        if res.is_err() {
            st.stats.unmaps_rejected += 1;
        }
        res
    }

    fn check_request(
        &self,
        st: &mut WindowState,
        what: &str,
        shmid: u8,
        off: u64,
        len: u64,
    ) -> io::Result<()> {
        if !st.started {
            st.violations.push(format!(
                "{what} {off:#x}+{len:#x} while the device is not started"
            ));
            return Err(einval("device not started"));
        }
        if shmid != 0 {
            return Err(einval(format!("unknown shmid {shmid}")));
        }
        if len == 0 || off % PAGE != 0 || len % PAGE != 0 {
            return Err(einval(format!("range {off:#x}+{len:#x} not page aligned")));
        }
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(einval(format!(
                "range {off:#x}+{len:#x} outside the {:#x}-byte window",
                self.len
            ))),
        }
    }

    /// Puts the PROT_NONE reservation back over [off, off+len).
    fn reserve(&self, off: u64, len: u64) {
        // SAFETY: the range lies inside our own window (callers checked), so MAP_FIXED only
        // replaces pages of the window.
        unsafe {
            libc::mmap(
                (self.base + off as usize) as *mut libc::c_void,
                len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
    }
}

impl Drop for DaxWindow {
    fn drop(&mut self) {
        // SAFETY: [base, base+len) is the window we reserved in `new`; nothing refers to it
        // once the window is dropped.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len as usize) };
    }
}

fn einval(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}

/// The frontend's handler of backend requests: forwards SHMEM_* to the window (if any).
pub(crate) struct Handler {
    pub window: OnceLock<Arc<DaxWindow>>,
    pub errors: Mutex<Vec<String>>,
    /// Set with [`crate::DriverConfig::window_gpa`]: window mappings go into the memory table.
    pub report: OnceLock<Reporter>,
}

/// Puts every live window mapping into the backend's memory table as a region of its own at
/// `gpa` + its window offset, as QEMU 11.1's vhost memory listener does: a guest buffer in
/// the window is then a descriptor the backend can find in its table (a guest `write(2)`
/// from a DAX mapping). The table is sent (SET_MEM_TABLE, RAM first) before the SHMEM reply:
/// QEMU sends its update after the reply, which a backend must accept either way.
pub(crate) struct Reporter {
    pub fe: vhost::vhost_user::Frontend,
    pub ram: vhost::VhostUserMemoryRegionInfo,
    pub gpa: u64,
    /// Host address of the window in this process.
    pub host: u64,
    /// Live mappings by window offset: length, file offset and a descriptor of the file.
    pub maps: Mutex<BTreeMap<u64, (u64, u64, std::os::fd::OwnedFd)>>,
}

impl Reporter {
    fn send(&self, maps: &BTreeMap<u64, (u64, u64, std::os::fd::OwnedFd)>) {
        use vhost::VhostBackend;
        let mut regions = vec![self.ram];
        for (&off, (len, fo, fd)) in maps {
            regions.push(vhost::VhostUserMemoryRegionInfo {
                guest_phys_addr: self.gpa + off,
                memory_size: *len,
                userspace_addr: self.host + off,
                mmap_offset: *fo,
                mmap_handle: fd.as_raw_fd(),
            });
        }
        if let Err(e) = self.fe.set_mem_table(&regions) {
            log::warn!("SET_MEM_TABLE with {} window regions: {e}", maps.len());
        }
    }

    fn mapped(&self, req: &VhostUserMMap, fd: RawFd) {
        // SAFETY: `fd` is open for the duration of the call that handed it over.
        let dup = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned();
        let Ok(dup) = dup else { return };
        let mut m = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        let (off, len, fo) = (req.shm_offset, req.len, req.fd_offset);
        m.insert(off, (len, fo, dup));
        self.send(&m);
    }

    fn unmapped(&self, req: &VhostUserMMap) {
        let mut m = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        let off = req.shm_offset;
        if m.remove(&off).is_some() {
            self.send(&m);
        }
    }
}

impl Handler {
    fn window(&self) -> io::Result<&DaxWindow> {
        self.window
            .get()
            .map(|w| &**w)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENODEV))
    }
}

impl VhostUserFrontendReqHandler for Handler {
    fn shmem_map(
        &self,
        req: &VhostUserMMap,
        fd: &dyn AsRawFd,
    ) -> vhost::vhost_user::HandlerResult<u64> {
        // The fd is closed when we return: mmap inside the call.
        if let Ok(w) = self.window() {
            w.on_read("SHMEM_MAP", req.shm_offset, req.len);
            w.frontend_turn();
        }
        let r = self.window().and_then(|w| w.map(req, fd.as_raw_fd()));
        if let Err(e) = &r {
            log::debug!("SHMEM_MAP rejected: {e}");
        } else if let Some(rep) = self.report.get() {
            rep.mapped(req, fd.as_raw_fd());
        }
        r.map_err(|e| io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(libc::EINVAL)))
    }

    fn shmem_unmap(&self, req: &VhostUserMMap) -> vhost::vhost_user::HandlerResult<u64> {
        if let Ok(w) = self.window() {
            w.on_read("SHMEM_UNMAP", req.shm_offset, req.len);
            w.frontend_turn();
        }
        let r = self.window().and_then(|w| w.unmap(req));
        if let Err(e) = &r {
            log::debug!("SHMEM_UNMAP rejected: {e}");
        } else if let Some(rep) = self.report.get() {
            rep.unmapped(req);
        }
        r.map_err(|e| io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(libc::EINVAL)))
    }
}

/// The thread serving the backend-request channel.
pub(crate) struct ReqThread {
    stop: Arc<EventFd>,
    stopped: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ReqThread {
    pub(crate) fn spawn(
        mut server: FrontendReqHandler<Handler>,
        handler: Arc<Handler>,
    ) -> io::Result<ReqThread> {
        let stop = Arc::new(EventFd::new(EFD_NONBLOCK)?);
        let stopped = Arc::new(AtomicBool::new(false));
        // A backend that sends half a message must not wedge the thread: time out reads.
        set_rcv_timeout(server.as_raw_fd(), Duration::from_secs(2))?;
        let (stop2, stopped2) = (Arc::clone(&stop), Arc::clone(&stopped));
        let thread = std::thread::Builder::new()
            .name("vufs-backend-req".into())
            .spawn(move || loop {
                let mut fds = [pollfd(stop2.as_raw_fd()), pollfd(server.as_raw_fd())];
                match crate::poll(&mut fds, Duration::from_secs(3600)) {
                    Ok(_) if stopped2.load(Ordering::Acquire) => return,
                    Ok(_) if fds[1].revents == 0 => continue,
                    Ok(_) => {}
                    Err(e) => {
                        push(&handler, format!("backend-request poll: {e}"));
                        return;
                    }
                }
                match server.handle_request() {
                    Ok(_) => {}
                    Err(VuError::ReqHandlerError(_)) => {} // rejected request, answered already
                    Err(VuError::Disconnected) | Err(VuError::PartialMessage) => return,
                    Err(e @ (VuError::SocketBroken(_) | VuError::SocketError(_))) => {
                        push(&handler, format!("backend-request channel: {e}"));
                        return;
                    }
                    Err(e) => push(&handler, format!("bad backend request: {e}")),
                }
            })?;
        Ok(ReqThread {
            stop,
            stopped,
            thread: Some(thread),
        })
    }
}

fn push(h: &Handler, msg: String) {
    log::warn!("{msg}");
    if let Ok(mut v) = h.errors.lock() {
        v.push(msg);
    }
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

fn set_rcv_timeout(fd: RawFd, t: Duration) -> io::Result<()> {
    // SAFETY: `fd` is an open socket owned by the caller for the duration of the call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: SO_RCVTIMEO takes a timeval; we pass a valid pointer and its exact size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Drop for ReqThread {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Release);
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::BorrowedFd;
    use std::os::unix::net::UnixStream;

    use vhost::vhost_user::Backend;

    use super::*;

    struct Rig {
        w: Arc<DaxWindow>,
        backend: Backend,
        _thread: ReqThread,
    }

    fn rig(len: u64) -> Rig {
        let w = Arc::new(DaxWindow::new(len).unwrap());
        w.set_started(true);
        let h = Arc::new(Handler {
            window: OnceLock::new(),
            errors: Mutex::new(Vec::new()),
            report: OnceLock::new(),
        });
        assert!(h.window.set(Arc::clone(&w)).is_ok());
        let mut server = FrontendReqHandler::new(Arc::clone(&h)).unwrap();
        server.set_reply_ack_flag(true);
        // SAFETY: the fd is the handler's open socket; we only duplicate it.
        let tx = unsafe { BorrowedFd::borrow_raw(server.get_tx_raw_fd()) };
        let backend = Backend::from_stream(UnixStream::from(tx.try_clone_to_owned().unwrap()));
        backend.set_reply_ack_flag(true);
        backend.set_shmem_flag(true);
        let thread = ReqThread::spawn(server, h).unwrap();
        Rig {
            w,
            backend,
            _thread: thread,
        }
    }

    fn msg(shm_offset: u64, len: u64, fd_offset: u64, writable: bool) -> VhostUserMMap {
        VhostUserMMap {
            shmid: 0,
            padding: [0; 7],
            fd_offset,
            shm_offset,
            len,
            flags: if writable {
                VhostUserMMapFlags::WRITABLE.bits()
            } else {
                0
            },
        }
    }

    fn file(pages: usize) -> std::fs::File {
        let mut f = crate::memory::memfd("dax-test").unwrap();
        let data: Vec<u8> = (0..pages * 4096)
            .map(|i| (i / 4096 * 31 + i) as u8)
            .collect();
        f.write_all(&data).unwrap();
        f
    }

    #[test]
    fn map_read_write_unmap() {
        let r = rig(1 << 20);
        let f = file(4);
        r.backend
            .shmem_map(&msg(0x1000, 0x2000, 0x1000, false), &f)
            .unwrap();
        assert_eq!(
            r.w.mappings(),
            vec![Mapping {
                shm_offset: 0x1000,
                len: 0x2000,
                fd_offset: 0x1000,
                writable: false
            }]
        );
        let mut buf = vec![0u8; 0x2000];
        r.w.read(0x1000, &mut buf).unwrap();
        let want: Vec<u8> = (0x1000..0x3000)
            .map(|i: usize| (i / 4096 * 31 + i) as u8)
            .collect();
        assert_eq!(buf, want);
        assert!(
            r.w.write(0x1000, b"x").is_err(),
            "read-only mapping written"
        );
        assert!(
            r.w.read(0, &mut buf[..16]).is_err(),
            "unmapped window offset read"
        );
        assert!(
            r.w.read(0x2f00, &mut buf[..0x200]).is_err(),
            "read past the mapping"
        );

        // Overlaps are refused, adjacent maps are fine.
        assert!(r
            .backend
            .shmem_map(&msg(0x2000, 0x2000, 0, true), &f)
            .is_err());
        assert!(r.backend.shmem_map(&msg(0, 0x2000, 0, true), &f).is_err());
        r.backend
            .shmem_map(&msg(0x3000, 0x1000, 0, true), &f)
            .unwrap();
        r.w.write(0x3000, b"via-window").unwrap();
        let mut head = [0u8; 10];
        // SAFETY: reading the memfd we own into a local buffer.
        let n = unsafe { libc::pread(f.as_raw_fd(), head.as_mut_ptr().cast(), 10, 0) };
        assert_eq!((n, &head), (10, b"via-window"));

        // Bounds and alignment.
        assert!(r
            .backend
            .shmem_map(&msg(1 << 20, 0x1000, 0, false), &f)
            .is_err());
        assert!(r
            .backend
            .shmem_map(&msg(0x8000, 0x800, 0, false), &f)
            .is_err());
        assert!(r
            .backend
            .shmem_map(&msg(0x8000, 0x1000, 0x10, false), &f)
            .is_err());

        // Unmap must name one mapping exactly.
        assert!(r
            .backend
            .shmem_unmap(&msg(0x1000, 0x1000, 0, false))
            .is_err());
        assert!(r
            .backend
            .shmem_unmap(&msg(0x1000, 0x3000, 0, false))
            .is_err());
        r.backend
            .shmem_unmap(&msg(0x1000, 0x2000, 0, false))
            .unwrap();
        assert!(r.w.read(0x1000, &mut buf[..16]).is_err());
        assert!(r
            .backend
            .shmem_unmap(&msg(0x1000, 0x2000, 0, false))
            .is_err());
        // Upgrade read-only to writable the QEMU way: unmap, then map.
        r.backend
            .shmem_map(&msg(0x1000, 0x2000, 0, false), &f)
            .unwrap();
        r.backend
            .shmem_unmap(&msg(0x1000, 0x2000, 0, false))
            .unwrap();
        r.backend
            .shmem_map(&msg(0x1000, 0x2000, 0, true), &f)
            .unwrap();
        r.w.write(0x1000, b"ok").unwrap();

        let st = r.w.stats();
        assert_eq!(
            st,
            DaxStats {
                map_requests: 9,
                unmap_requests: 5,
                maps_rejected: 5,
                unmaps_rejected: 3
            }
        );
        assert_eq!(r.w.mappings().len(), 2);
        assert!(r.w.violations().is_empty());
    }

    #[test]
    fn requests_outside_a_started_device_are_violations() {
        let r = rig(1 << 20);
        let f = file(1);
        r.w.set_started(false);
        assert!(r.backend.shmem_map(&msg(0, 0x1000, 0, false), &f).is_err());
        assert_eq!(r.w.violations().len(), 1);
        assert!(r.w.mappings().is_empty());
    }
}
