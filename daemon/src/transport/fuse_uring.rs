//! FUSE-over-io-uring: the kernel hands requests to per-CPU ring queues instead of `read(2)`
//! on `/dev/fuse` (Linux 6.14+, `CONFIG_FUSE_IO_URING`, module parameter
//! `fuse.enable_uring=Y`; fs/fuse/dev_uring.c).
//!
//! The protocol: after INIT (negotiated on `/dev/fuse`, with `FUSE_OVER_IO_URING` offered by the
//! kernel and agreed by us), the server registers ring entries with `IORING_OP_URING_CMD` on the
//! `/dev/fuse` descriptor, command `FUSE_IO_URING_CMD_REGISTER`, one SQE per entry, each naming
//! two buffers: a 288-byte header (`fuse_uring_req_header`: the in/out header, the per-opcode
//! argument struct, and `fuse_uring_ent_in_out` with the commit id and payload size) and a
//! payload buffer of at least the negotiated `max_write`. The kernel keeps one queue per
//! possible CPU and routes a request to the queue of the CPU its caller runs on; it uses the ring
//! only once every queue has an entry. A completion (CQE, result 0) means the entry holds a
//! request; the server answers with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` on the same entry,
//! which delivers the reply and waits for the next request in one step. FORGET and INTERRUPT
//! still come through `read(2)`, so the `/dev/fuse` readers keep running.
//!
//! Each queue here is one thread with its own ring (`SQE128` entries: the command lives in the
//! 80-byte area), `depth` entries and one mapping for all their buffers. The thread turns an
//! entry into the server's [`Reader`]/[`Writer`] (header, argument struct, payload; reply header
//! into the header area, reply body into the payload) and calls the same [`Server::handle`] as
//! every other transport. A request that may wait indefinitely (SETLKW) is handed with its
//! entry to a lock thread ([`LockWaits`], as the /dev/fuse readers do), so that it cannot stall
//! the rest of its CPU's queue; the queue thread, the ring's only submitter, commits the lock
//! thread's answer. The kernel answers a request only through the entry it was sent on, so a
//! waiting SETLKW keeps its entry: in its place the queue registers a spare entry, so that it
//! always has `depth` entries fetching however many waits hold one (the unlock that ends them
//! needs an entry too). Spares stay registered (the kernel cannot take one back) and serve like
//! the others; at most [`MAX_LOCK_WAITS`] waits hold entries at once, beyond that a SETLKW
//! fails with ENOLCK. A reply the kernel refuses
//! (ENOENT) goes to [`Server::reply_lost`], which gives back a handle or lock it carried.
//!
//! Teardown: on unmount the kernel completes every waiting entry with `-ENOTCONN`; a queue thread
//! whose entries are all gone exits. [`Rings::shutdown`] (SIGTERM) wakes each thread through an
//! eventfd polled in its ring; the thread drops its ring, which cancels its commands, and exits.
//! The buffer mappings stay until the process exits: the kernel's ring entries keep their
//! addresses until the connection is torn down.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::thread::JoinHandle;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use vm_memory::VolatileSlice;

use crate::protocol::abi::{opcode as op, InHeader, OutHeader};
use crate::protocol::filesystem::FileSystem;
use crate::protocol::iobuf::{Reader, Seg, Writer};
use crate::protocol::policy::{self, Wait};
use crate::protocol::server::Server;

use super::lock_waits::{LockWaits, WaitServer, MAX_LOCK_THREADS};

/// `FUSE_IO_URING_CMD_REGISTER` (include/uapi/linux/fuse.h).
const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `FUSE_URING_IN_OUT_HEADER_SZ`: room for `fuse_in_header` / `fuse_out_header`.
const IN_OUT_HEADER_SZ: usize = 128;
/// `FUSE_URING_OP_IN_OUT_SZ`: room for the per-opcode argument struct.
const OP_IN_OUT_SZ: usize = 128;
/// Offset of `fuse_uring_ent_in_out` in `fuse_uring_req_header`.
const ENT_IN_OUT_OFF: usize = IN_OUT_HEADER_SZ + OP_IN_OUT_SZ;
/// `sizeof(struct fuse_uring_req_header)`: two header areas plus the 32-byte `ent_in_out`
/// (`u64 flags, u64 commit_id, u32 payload_sz, u32 padding, u64 reserved`).
const REQ_HEADER_SZ: usize = ENT_IN_OUT_OFF + 32;
/// `FUSE_MIN_READ_BUFFER`: the kernel's smallest payload size.
const MIN_PAYLOAD: usize = 8192;
/// The FUSE minor version of the kernel series that adds ring buffer rings and zero-copy
/// (`fuse_uring_cmd_req` init flags; not in Linux 6.18).
const ZERO_COPY_MINOR: u32 = 46;
/// Ring entries per queue unless the caller says otherwise.
pub const DEFAULT_DEPTH: usize = 8;
/// Most lock waits (SETLKW) of a connection holding ring entries at once, waiting or queued
/// for one of the [`MAX_LOCK_THREADS`] lock threads. Each has a spare
/// entry registered in its place: a header and a payload buffer of address space, of which
/// only the pages a request touches take memory.
pub const MAX_LOCK_WAITS: usize = 1024;

const IN_HEADER_LEN: usize = std::mem::size_of::<InHeader>();
const OUT_HEADER_LEN: usize = std::mem::size_of::<OutHeader>();
/// `user_data` of the stop-eventfd poll.
const STOP: u64 = u64::MAX;
/// `user_data` of the poll on the eventfd that helper threads signal when a blocking request
/// they took is answered.
const DONE: u64 = u64::MAX - 1;

const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
const _: () = assert!(IN_HEADER_LEN <= IN_OUT_HEADER_SZ);

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
const SYSCTL: &str = "/proc/sys/kernel/io_uring_disabled";

/// Whether this kernel can serve FUSE requests over io_uring, before mounting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    Available,
    /// Why not, with what to do about it: one line for the log or an error.
    Unavailable(String),
}

/// Looks at the kernel: the fuse module parameter (absent without `CONFIG_FUSE_IO_URING`), the
/// io_uring sysctl, and whether this process can create an `SQE128` ring at all (seccomp,
/// containers).
pub fn availability() -> Availability {
    possible_cpus();
    let param = match fs::read_to_string(PARAM) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Availability::Unavailable(format!(
                "kernel without FUSE_OVER_IO_URING ({PARAM} does not exist; \
                 needs Linux 6.14+ with CONFIG_FUSE_IO_URING=y)"
            ))
        }
        Err(e) => return Availability::Unavailable(format!("cannot read {PARAM}: {e}")),
    };
    if param.trim() != "Y" {
        return Availability::Unavailable(format!(
            "fuse.enable_uring=N (as root: echo Y > {PARAM})"
        ));
    }
    if let Ok(s) = fs::read_to_string(SYSCTL) {
        match s.trim() {
            "0" => {}
            "2" => {
                return Availability::Unavailable(format!(
                "io_uring is disabled ({SYSCTL} = 2; as root: sysctl kernel.io_uring_disabled=0)"
            ))
            }
            "1" => {
                // Only CAP_SYS_ADMIN and members of kernel.io_uring_group may create rings. The
                // probe below runs before the capability drop, so it cannot tell: the queue
                // threads, after the drop, would be refused.
                return Availability::Unavailable(format!(
                    "io_uring is restricted ({SYSCTL} = 1; as root: sysctl kernel.io_uring_disabled=0)"
                ));
            }
            v => log::debug!("{SYSCTL} = {v}"),
        }
    }
    match IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2) {
        Ok(_) => Availability::Available,
        Err(e) => Availability::Unavailable(format!("cannot create an io_uring ({e})")),
    }
}

/// Number of ring queues the kernel expects: one per possible CPU (`num_possible_cpus()`).
/// Read once, by [`availability`] before the sandbox hides /sys: a queue too few and the
/// kernel never uses the ring (it waits for every queue).
fn possible_cpus() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        let s = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
        match parse_cpu_list(s.trim()) {
            0 => {
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                log::warn!(
                    "io-uring: cannot read /sys/devices/system/cpu/possible; assuming {n} queues"
                );
                n
            }
            n => n,
        }
    })
}

/// Counts the CPUs in a kernel CPU list such as `0-3,8-11` (0 when it cannot be parsed).
fn parse_cpu_list(s: &str) -> usize {
    let mut n = 0usize;
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>(), b.parse::<usize>()),
            None => (part.parse::<usize>(), part.parse::<usize>()),
        };
        match (a, b) {
            (Ok(a), Ok(b)) if b >= a => n += b - a + 1,
            _ => return 0,
        }
    }
    n
}

/// Counters of the io-uring transport, for the log and the daemon's report.
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests served from a ring entry.
    pub served: AtomicU64,
    /// Requests whose entry was malformed (answered with EIO).
    pub malformed: AtomicU64,
    /// Replies the kernel refused (ENOENT: the request ended meanwhile); an OPEN/CREATE
    /// handle or a lock they carried is given back.
    pub lost: AtomicU64,
    /// Queues registered.
    pub queues: AtomicUsize,
    /// Entries per queue.
    pub depth: AtomicUsize,
    /// Spare entries registered in place of entries held by lock waits (all queues).
    pub spares: AtomicU64,
}

/// Running ring queues.
pub struct Rings {
    threads: Vec<JoinHandle<()>>,
    stops: Vec<OwnedFd>,
    stats: Arc<Stats>,
}

impl Rings {
    /// The transport's counters.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Stops every queue thread and waits for it. The kernel completes the threads' pending
    /// commands with an error when their rings close.
    pub fn shutdown(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        for fd in &self.stops {
            signal(fd.as_raw_fd());
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                log::error!("io-uring queue thread panicked");
            }
        }
    }
}

impl Drop for Rings {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn signal(fd: RawFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd this process owns.
    let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the result is checked before use.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Registers one queue per possible CPU on the FUSE connection `dev` (the `/dev/fuse`
/// descriptor, already past INIT with `FUSE_OVER_IO_URING` agreed) and serves them with one
/// thread each. Returns once every queue has registered its entries, or the first error (the
/// kernel then turns io_uring off for the connection and requests keep coming through
/// `read(2)`).
pub fn start<F>(
    dev: RawFd,
    server: Arc<Server<F>>,
    depth: usize,
    stats: Arc<Stats>,
) -> io::Result<Rings>
where
    F: FileSystem + Send + Sync + 'static,
{
    let session = server.export_session();
    let payload = (session.max_io as usize).max(MIN_PAYLOAD);
    if session.minor < ZERO_COPY_MINOR {
        log::info!(
            "io-uring: kernel FUSE 7.{} has no ring zero-copy (buffer rings, FUSE 7.{ZERO_COPY_MINOR}+): \
             requests and replies are copied through the ring buffers",
            session.minor
        );
    }
    let depth = depth.clamp(1, 1024);
    let queues = possible_cpus();
    stats.depth.store(depth, Ordering::Relaxed);
    let mut rings = Rings {
        threads: Vec::new(),
        stops: Vec::new(),
        stats: stats.clone(),
    };
    let waits = LockWaits::new(
        RingWaits {
            server: server.clone(),
            stats: stats.clone(),
        },
        "fuse-uring-lock",
        MAX_LOCK_THREADS,
        MAX_LOCK_WAITS - MAX_LOCK_THREADS,
    );
    let (tx, rx) = mpsc::channel();
    for qid in 0..queues {
        let stop = eventfd()?;
        let stop_fd = stop.as_raw_fd();
        rings.stops.push(stop);
        let waits = waits.clone();
        let tx = tx.clone();
        let t = std::thread::Builder::new()
            .name(format!("fuse-uring-{qid}"))
            .spawn(move || {
                let q = Queue::new(dev, qid, depth, payload, stop_fd);
                let mut q = match q {
                    Ok(q) => q,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                match q.register() {
                    Ok(()) => {
                        let _ = tx.send(Ok(()));
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                }
                drop(tx);
                q.serve(&waits);
            })?;
        rings.threads.push(t);
    }
    drop(tx);
    for _ in 0..queues {
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::Error::other("io-uring queue thread died")),
        }
    }
    stats.queues.store(queues, Ordering::Relaxed);
    log::info!(
        "io-uring: {queues} queues x {depth} entries, payload buffers of {payload} bytes: \
         requests are served from the rings"
    );
    Ok(rings)
}

/// After INIT: starts the rings when INIT agreed `FUSE_OVER_IO_URING`. Returns `Ok(None)`
/// when requests stay on `/dev/fuse` (logged, with the reason), and an error only when
/// `required` (`--io-uring=on`). When the rings cannot start after INIT agreed on them, the
/// kernel would hold every request until they do: a REGISTER for a queue that does not exist
/// makes it turn io_uring off for the connection, and requests come through `read(2)`.
pub fn start_after_init<F>(
    dev: RawFd,
    server: Arc<Server<F>>,
    depth: usize,
    stats: Arc<Stats>,
    required: bool,
) -> io::Result<Option<Rings>>
where
    F: FileSystem + Send + Sync + 'static,
{
    let fail = |why: String| {
        if required {
            Err(io::Error::other(format!("--io-uring=on: {why}")))
        } else {
            log::warn!("io-uring: not used: {why}; requests come through read(2) on /dev/fuse");
            Ok(None)
        }
    };
    if server.negotiated_flags() & crate::protocol::abi::init_flags::OVER_IO_URING == 0 {
        return fail(
            "the kernel did not offer FUSE_OVER_IO_URING at INIT (fuse.enable_uring set to N after the start?)"
                .into(),
        );
    }
    match start(dev, server, depth, stats) {
        Ok(r) => Ok(Some(r)),
        Err(e) => {
            if let Err(p) = turn_off(dev) {
                log::error!(
                    "io-uring: cannot start the rings ({e}) nor turn io_uring off for the connection ({p}): \
                     the mount would hang"
                );
                return Err(io::Error::other(format!("io-uring: {e}")));
            }
            fail(format!("cannot start the rings: {e}"))
        }
    }
}

/// Makes the kernel give up io_uring on the FUSE connection `dev` (past INIT): a REGISTER
/// that it refuses. Requests then come through `read(2)`.
pub fn turn_off(dev: RawFd) -> io::Result<()> {
    let mut ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2)?;
    let mut hdr = vec![0u8; REQ_HEADER_SZ];
    let mut payload = vec![0u8; MIN_PAYLOAD];
    let iov = [
        libc::iovec {
            iov_base: hdr.as_mut_ptr().cast(),
            iov_len: hdr.len(),
        },
        libc::iovec {
            iov_base: payload.as_mut_ptr().cast(),
            iov_len: payload.len(),
        },
    ];
    // No CPU has this number: the kernel answers EINVAL and turns io_uring off.
    let e = ring_cmd(dev, CMD_REGISTER, u16::MAX, 0, Some(iov.as_ptr())).user_data(0);
    // SAFETY: the iovecs and their buffers outlive the wait below, and the kernel refuses the
    // command before keeping any address.
    unsafe { ring.submission().push(&e) }.map_err(|_| io::Error::other("SQ full"))?;
    ring.submit_and_wait(1)?;
    let res = ring.completion().next().map_or(0, |c| c.result());
    if res >= 0 {
        return Err(io::Error::other(
            "the kernel accepted a REGISTER for queue 65535",
        ));
    }
    log::info!(
        "io-uring: turned off for this connection (REGISTER answered {})",
        io::Error::from_raw_os_error(-res)
    );
    Ok(())
}

/// One anonymous mapping of `depth` entries' buffers, never unmapped (see the module
/// documentation), and the entries' iovec pairs for REGISTER.
struct Buffers {
    base: *mut u8,
    hdr_stride: usize,
    payload_off: usize,
    payload: usize,
    /// Per entry: header and payload iovecs. Boxed: the kernel reads them at submission, after
    /// the owner may have moved.
    iovs: Box<[[libc::iovec; 2]]>,
}

impl Buffers {
    fn new(depth: usize, payload: usize) -> io::Result<Self> {
        let page = 4096usize;
        let hdr_stride = REQ_HEADER_SZ.next_multiple_of(64);
        let payload = payload.next_multiple_of(page);
        let payload_off = (hdr_stride * depth).next_multiple_of(page);
        let len = depth
            .checked_mul(payload)
            .and_then(|p| p.checked_add(payload_off))
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: anonymous private mapping at an address of the kernel's choosing; the result
        // is checked before use.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut b = Buffers {
            base: base.cast(),
            hdr_stride,
            payload_off,
            payload,
            iovs: Box::new([]),
        };
        b.iovs = (0..depth)
            .map(|i| {
                [
                    libc::iovec {
                        iov_base: b.header(i).cast(),
                        iov_len: REQ_HEADER_SZ,
                    },
                    libc::iovec {
                        iov_base: b.payload(i).cast(),
                        iov_len: b.payload,
                    },
                ]
            })
            .collect();
        Ok(b)
    }

    fn header(&self, i: usize) -> *mut u8 {
        // In bounds: `i < depth` and the mapping holds `depth` header strides.
        self.base.wrapping_add(i * self.hdr_stride)
    }

    fn payload(&self, i: usize) -> *mut u8 {
        self.base.wrapping_add(self.payload_off + i * self.payload)
    }

    /// Entry `i`'s memory.
    fn entry(&self, i: usize) -> EntryMem {
        EntryMem {
            index: i,
            header: self.header(i),
            payload: self.payload(i),
            payload_len: self.payload,
        }
    }
}

/// Every entry's buffers of one queue: the first `depth` entries, then the spares, in mappings
/// of `per` entries each, added as spares need them.
struct Entries {
    segs: Vec<Buffers>,
    per: usize,
    payload: usize,
}

impl Entries {
    fn new(per: usize, payload: usize) -> io::Result<Self> {
        Ok(Entries {
            segs: vec![Buffers::new(per, payload)?],
            per,
            payload,
        })
    }

    /// Entries with buffers.
    fn capacity(&self) -> usize {
        self.segs.len() * self.per
    }

    /// Maps buffers for `per` more entries.
    fn grow(&mut self) -> io::Result<()> {
        self.segs.push(Buffers::new(self.per, self.payload)?);
        Ok(())
    }

    /// Entry `i`'s memory (`i < capacity()`).
    fn entry(&self, i: usize) -> EntryMem {
        let mut e = self.segs[i / self.per].entry(i % self.per);
        e.index = i;
        e
    }

    /// Entry `i`'s iovec pair, alive as long as the queue.
    fn iov(&self, i: usize) -> *const libc::iovec {
        self.segs[i / self.per].iovs[i % self.per].as_ptr()
    }

    #[cfg(test)]
    fn header_slice(&self, i: usize, off: usize, len: usize) -> VolatileSlice<'static> {
        self.entry(i).header_slice(off, len)
    }

    #[cfg(test)]
    fn payload_slice(&self, i: usize, len: usize) -> VolatileSlice<'static> {
        self.entry(i).payload_slice(len)
    }
}

/// One ring entry's header and payload buffers, inside a [`Buffers`] mapping (never unmapped).
/// Whoever holds it between the entry's completion and its next submission (the queue
/// thread, or the helper thread a blocking request is handed to) is the only one touching
/// that memory: the kernel writes an entry only while it is submitted.
struct EntryMem {
    index: usize,
    header: *mut u8,
    payload: *mut u8,
    payload_len: usize,
}

// SAFETY: the pointers stay valid for the life of the process (the mapping is never
// unmapped) and an `EntryMem` is handed over, not shared: the queue thread does not touch the
// entry again until the helper gives it back.
unsafe impl Send for EntryMem {}

impl EntryMem {
    /// A slice of the header area.
    fn header_slice(&self, off: usize, len: usize) -> VolatileSlice<'static> {
        assert!(off + len <= REQ_HEADER_SZ);
        // SAFETY: the range lies in this entry's header, inside a mapping that lives as long
        // as the process; only the holder of this `EntryMem` accesses it while the kernel does
        // not (see the type's documentation), and always through volatile slices.
        unsafe { VolatileSlice::new(self.header.wrapping_add(off), len) }
    }

    /// The first `len` bytes of the payload buffer.
    fn payload_slice(&self, len: usize) -> VolatileSlice<'static> {
        assert!(len <= self.payload_len);
        // SAFETY: as for `header_slice`, within this entry's payload buffer.
        unsafe { VolatileSlice::new(self.payload, len) }
    }

    /// The request's opcode.
    fn opcode(&self) -> u32 {
        read_u32(&self.header_slice(0, IN_HEADER_LEN), 4)
    }

    /// Writes an error reply header.
    fn error_reply(&self, unique: u64, errno: i32) {
        let mut h = [0u8; OUT_HEADER_LEN];
        h[0..4].copy_from_slice(&(OUT_HEADER_LEN as u32).to_ne_bytes());
        h[4..8].copy_from_slice(&(-errno).to_ne_bytes());
        h[8..16].copy_from_slice(&unique.to_ne_bytes());
        self.header_slice(0, OUT_HEADER_LEN).copy_from(&h[..]);
    }

    /// Answers the request in this entry with `errno` and no body; returns the commit id.
    fn fail(&self, errno: i32) -> u64 {
        let hdr = self.header_slice(0, REQ_HEADER_SZ);
        self.error_reply(read_u64(&hdr, 8), errno);
        self.header_slice(ENT_IN_OUT_OFF + 16, 4)
            .copy_from(&0u32.to_ne_bytes()[..]);
        read_u64(&hdr, ENT_IN_OUT_OFF + 8)
    }

    /// Serves the request in this entry and leaves the reply in it; returns the commit id.
    /// `scratch` receives a copy of the payload (see [`Queue::scratch`]).
    fn serve<F: FileSystem>(
        &self,
        server: &Server<F>,
        stats: &Stats,
        scratch: &mut Vec<u8>,
        qid: u16,
    ) -> u64 {
        let i = self.index;
        let hdr = self.header_slice(0, REQ_HEADER_SZ);
        let commit_id = read_u64(&hdr, ENT_IN_OUT_OFF + 8);
        let payload_sz = read_u32(&hdr, ENT_IN_OUT_OFF + 16) as usize;
        let mut inh = [0u8; IN_HEADER_LEN];
        if let Ok(s) = hdr.subslice(0, IN_HEADER_LEN) {
            s.copy_to(&mut inh[..]);
        }
        let len = u32::from_ne_bytes([inh[0], inh[1], inh[2], inh[3]]) as usize;
        let opcode = u32::from_ne_bytes([inh[4], inh[5], inh[6], inh[7]]);
        let mut unique = [0u8; 8];
        unique.copy_from_slice(&inh[8..16]);
        let unique = u64::from_ne_bytes(unique);
        // The kernel puts the first argument (the per-opcode struct) in the header area and
        // the rest in the payload; the in-header's `len` covers all three.
        let op_len = len
            .checked_sub(IN_HEADER_LEN)
            .and_then(|n| n.checked_sub(payload_sz))
            .filter(|&n| n <= OP_IN_OUT_SZ && payload_sz <= self.payload_len);
        let Some(op_len) = op_len else {
            log::warn!(
                "io-uring queue {qid} entry {i}: request of {len} bytes with a {payload_sz}-byte payload \
                 does not fit the entry; answering EIO"
            );
            stats.malformed.fetch_add(1, Ordering::Relaxed);
            return self.fail(libc::EIO);
        };
        let payload = self.payload_slice(payload_sz);
        let body_in = if opcode == op::WRITE {
            payload
        } else {
            scratch.clear();
            scratch.resize(payload_sz, 0);
            payload.copy_to(&mut scratch[..]);
            VolatileSlice::from(&mut scratch[..])
        };
        let r = Reader::with_far(
            vec![
                Seg::Mem(VolatileSlice::from(&mut inh[..])),
                Seg::Mem(self.header_slice(IN_OUT_HEADER_SZ, op_len)),
                Seg::Mem(body_in),
            ],
            None,
        );
        let w = Writer::with_far(
            vec![
                Seg::Mem(self.header_slice(0, OUT_HEADER_LEN)),
                Seg::Mem(self.payload_slice(self.payload_len)),
            ],
            None,
        );
        let body = match server.handle(r, Some(w)) {
            Ok(h) if h.written >= OUT_HEADER_LEN => h.written - OUT_HEADER_LEN,
            Ok(h) => {
                // Ring requests always take a reply (FORGET and INTERRUPT come via read(2)).
                log::warn!(
                    "io-uring: {} unique={unique} produced no reply; answering EIO",
                    op::name(h.opcode)
                );
                self.error_reply(unique, libc::EIO);
                0
            }
            Err(e) => {
                log::warn!("io-uring: request unique={unique} not answered ({e}); answering EIO");
                self.error_reply(unique, libc::EIO);
                0
            }
        };
        let body = u32::try_from(body).unwrap_or(0);
        self.header_slice(ENT_IN_OUT_OFF + 16, 4)
            .copy_from(&body.to_ne_bytes()[..]);
        stats.served.fetch_add(1, Ordering::Relaxed);
        commit_id
    }
}

/// How the io_uring transport serves a lock wait ([`LockWaits`]): the entry travels to a lock
/// thread, which leaves the reply in it and sends it back to its queue thread to commit.
struct RingWaits<F: FileSystem + Send + Sync + 'static> {
    server: Arc<Server<F>>,
    stats: Arc<Stats>,
}

/// A lock wait: its entry, and the way back to the queue that commits it.
struct RingWait {
    entry: EntryMem,
    qid: u16,
    tx: mpsc::Sender<(usize, u64)>,
    done: Arc<OwnedFd>,
}

impl RingWait {
    fn answered(self, commit_id: u64) {
        if self.tx.send((self.entry.index, commit_id)).is_ok() {
            signal(self.done.as_raw_fd());
        }
    }
}

impl<F: FileSystem + Send + Sync + 'static> WaitServer for RingWaits<F> {
    type Job = RingWait;

    fn serve(&self, job: RingWait) {
        let commit_id = job
            .entry
            .serve(&self.server, &self.stats, &mut Vec::new(), job.qid);
        job.answered(commit_id);
    }

    fn refuse(&self, job: RingWait) {
        let commit_id = job.entry.fail(libc::ENOLCK);
        job.answered(commit_id);
    }
}

/// Whether a request leaves the ring's thread for a helper of its own: only one that may
/// wait indefinitely (SETLKW, [`policy::INDEFINITE`]), whose end may need this very queue.
/// One that takes long ([`policy::LONG`]: FSYNC, FLUSH, ...) still ends by itself and holds
/// back only its own CPU's queue meanwhile; a thread started for each of them (a FLUSH per
/// guest `close`) would cost more than the wait it spares the others.
fn waits_indefinitely(opcode: u32) -> bool {
    policy::wait(opcode) == Wait::Indefinite
}

/// Reads a native-endian u32/u64 field from entry memory.
fn read_u64(s: &VolatileSlice<'_>, off: usize) -> u64 {
    let mut b = [0u8; 8];
    if let Ok(sub) = s.subslice(off, 8) {
        sub.copy_to(&mut b[..]);
    }
    u64::from_ne_bytes(b)
}

fn read_u32(s: &VolatileSlice<'_>, off: usize) -> u32 {
    let mut b = [0u8; 4];
    if let Ok(sub) = s.subslice(off, 4) {
        sub.copy_to(&mut b[..]);
    }
    u32::from_ne_bytes(b)
}

/// Builds a FUSE ring command SQE. `iov` (for REGISTER) is the entry's two-iovec array.
fn ring_cmd(
    dev: RawFd,
    cmd_op: u32,
    qid: u16,
    commit_id: u64,
    iov: Option<*const libc::iovec>,
) -> squeue::Entry128 {
    // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 padding[6]; }
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut b = opcode::UringCmd80::new(types::Fd(dev), cmd_op).cmd(cmd);
    if let Some(iov) = iov {
        b = b.addr(Some(iov as u64));
    }
    let mut e = b.build();
    if iov.is_some() {
        // The kernel wants `sqe->len` = 2 (header and payload iovecs); the crate's builder has
        // no setter for it.
        // SAFETY: `squeue::Entry128` is `#[repr(C)]` over `Entry` (itself `#[repr(C)]` over
        // the kernel's `struct io_uring_sqe`) followed by the 64-byte command tail, 128 bytes
        // in all (asserted above). `len` is the u32 at byte offset 24 of `io_uring_sqe`
        // (include/uapi/linux/io_uring.h); the pointer comes from a unique borrow of the whole
        // entry, and the write is unaligned-safe.
        unsafe {
            (&mut e as *mut squeue::Entry128)
                .cast::<u8>()
                .add(24)
                .cast::<u32>()
                .write_unaligned(2);
        }
    }
    e
}

struct Queue {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    dev: RawFd,
    qid: u16,
    /// Entries kept fetching requests, besides those lock waits hold.
    depth: usize,
    bufs: Entries,
    /// Entries registered so far (the first `depth`, then spares): indexes below it.
    used: usize,
    /// Entries held by lock waits (handed to [`LockWaits`], not committed yet).
    held: usize,
    /// Entries the kernel still holds or this thread or a lock thread is serving.
    live: usize,
    alive: Vec<bool>,
    stop_fd: RawFd,
    /// Copy of a request payload, so that a reply written into the payload buffer cannot
    /// overwrite request bytes not yet read. WRITE data is used in place (read before the
    /// reply is written).
    scratch: Vec<u8>,
    /// Completions seen while registering, served first.
    pending: Vec<cqueue::Entry>,
    /// Failed commands per entry since its last request, to bound re-registration.
    retries: Vec<u8>,
    /// Per entry: the request's in-header and argument struct, kept for OPEN, CREATE, SETLK
    /// and SETLKW until the reply is committed, for [`Server::reply_lost`].
    saved: Vec<Vec<u8>>,
    /// Signalled by a helper thread that answered a blocking request (SETLKW); it sends the
    /// entry and commit id on `done_tx`.
    done: Arc<OwnedFd>,
    done_tx: mpsc::Sender<(usize, u64)>,
    done_rx: mpsc::Receiver<(usize, u64)>,
}

impl Queue {
    fn new(
        dev: RawFd,
        qid: usize,
        depth: usize,
        payload: usize,
        stop_fd: RawFd,
    ) -> io::Result<Self> {
        let qid = u16::try_from(qid).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // Best effort: run next to the CPU whose requests this queue gets.
        // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and sched_setaffinity only
        // touch it and this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(usize::from(qid), &mut set);
            let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
        // One command per entry, plus the two polls.
        let entries = u32::try_from(depth + 2).unwrap_or(1026).next_power_of_two();
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_cqsize(entries * 2)
            .build(entries)
            .or_else(|_| {
                // Kernels without DEFER_TASKRUN.
                IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(entries)
            })?;
        let bufs = Entries::new(depth, payload)?;
        let (done_tx, done_rx) = mpsc::channel();
        Ok(Queue {
            ring,
            dev,
            qid,
            depth,
            bufs,
            used: 0,
            held: 0,
            live: 0,
            alive: vec![false; depth],
            stop_fd,
            scratch: Vec::new(),
            pending: Vec::new(),
            retries: vec![0; depth],
            saved: vec![Vec::new(); depth],
            done: Arc::new(eventfd()?),
            done_tx,
            done_rx,
        })
    }

    fn push(&mut self, e: squeue::Entry128) -> io::Result<()> {
        // SAFETY: every buffer an SQE names (the iovec arrays and the entry buffers they point
        // to) lives as long as this queue or longer; the stop eventfd outlives the thread.
        let r = unsafe { self.ring.submission().push(&e) };
        if r.is_err() {
            // Each entry has at most one command in flight and the SQ holds depth + 2.
            self.ring.submit()?;
            // SAFETY: as above.
            unsafe { self.ring.submission().push(&e) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        Ok(())
    }

    fn arm_done(&mut self) -> io::Result<()> {
        let poll = opcode::PollAdd::new(types::Fd(self.done.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(DONE);
        self.push(poll.into())
    }

    /// Commits the entries lock threads have answered, and re-arms their poll.
    fn collect_done(&mut self) {
        let mut n = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from this queue's own eventfd (non-blocking).
        let _ = unsafe { libc::read(self.done.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
        while let Ok((i, commit_id)) = self.done_rx.try_recv() {
            self.held = self.held.saturating_sub(1);
            self.commit(i, commit_id);
        }
        if let Err(e) = self.arm_done() {
            log::error!("io-uring queue {}: cannot poll for helpers: {e}", self.qid);
        }
    }

    fn commit(&mut self, i: usize, commit_id: u64) {
        let e =
            ring_cmd(self.dev, CMD_COMMIT_AND_FETCH, self.qid, commit_id, None).user_data(i as u64);
        if let Err(e) = self.push(e) {
            log::error!("io-uring queue {}: cannot commit: {e}", self.qid);
            self.retire(i);
        }
    }

    /// Hands a request that may wait indefinitely (SETLKW waits for another process's lock) to
    /// the lock threads with its entry, so that the queue keeps serving its other entries: the
    /// lock holder may itself need this queue to let go. A spare entry takes its place while
    /// fewer than `depth` fetch (see the module documentation).
    fn offload<F>(&mut self, i: usize, waits: &Arc<LockWaits<RingWaits<F>>>)
    where
        F: FileSystem + Send + Sync + 'static,
    {
        self.held += 1;
        waits.submit(RingWait {
            entry: self.bufs.entry(i),
            qid: self.qid,
            tx: self.done_tx.clone(),
            done: self.done.clone(),
        });
        if self.live.saturating_sub(self.held) < self.depth
            && self.used < self.depth + MAX_LOCK_WAITS
        {
            self.add_spare(&waits.server().stats);
        }
    }

    /// Registers one more entry, mapping buffers for it when none are left.
    fn add_spare(&mut self, stats: &Stats) {
        let i = self.used;
        if i == self.bufs.capacity() {
            if let Err(e) = self.bufs.grow() {
                log::warn!(
                    "io-uring queue {}: no buffers for a spare entry ({e}); {} of {} entries wait for locks",
                    self.qid,
                    self.held,
                    self.live
                );
                return;
            }
            let n = self.bufs.capacity();
            self.alive.resize(n, false);
            self.retries.resize(n, 0);
            self.saved.resize(n, Vec::new());
        }
        if let Err(e) = self.register_entry(i) {
            log::warn!(
                "io-uring queue {}: cannot register a spare entry: {e}",
                self.qid
            );
            return;
        }
        self.used += 1;
        self.alive[i] = true;
        self.live += 1;
        if stats.spares.fetch_add(1, Ordering::Relaxed) == 0 {
            log::info!(
                "io-uring queue {}: lock waits hold {} entries; registering spares in their place",
                self.qid,
                self.held
            );
        }
    }

    fn register_entry(&mut self, i: usize) -> io::Result<()> {
        let iov = self.bufs.iov(i);
        let e = ring_cmd(self.dev, CMD_REGISTER, self.qid, 0, Some(iov)).user_data(i as u64);
        self.push(e)
    }

    /// Registers every entry and the stop poll; fails with the kernel's error when a
    /// registration is refused at once.
    fn register(&mut self) -> io::Result<()> {
        let poll = opcode::PollAdd::new(types::Fd(self.stop_fd), libc::POLLIN as u32)
            .build()
            .user_data(STOP);
        self.push(poll.into())?;
        self.arm_done()?;
        for i in 0..self.depth {
            self.register_entry(i)?;
            self.alive[i] = true;
            self.live += 1;
        }
        self.used = self.depth;
        self.ring.submit()?;
        // A registration the kernel refuses completes inline with its error; an accepted one
        // completes only when a request arrives.
        let mut first_err = None;
        let mut keep = Vec::new();
        for cqe in self.ring.completion() {
            if cqe.result() < 0 && cqe.user_data() < DONE && first_err.is_none() {
                first_err = Some(io::Error::from_raw_os_error(-cqe.result()));
            }
            keep.push(cqe);
        }
        if let Some(e) = first_err {
            return Err(io::Error::new(
                e.kind(),
                format!("FUSE_IO_URING_CMD_REGISTER on queue {}: {e}", self.qid),
            ));
        }
        self.pending = keep;
        Ok(())
    }
}

impl Queue {
    /// Serves completions until the stop eventfd fires or the kernel has given back every
    /// entry (unmount, abort).
    fn serve<F>(&mut self, waits: &Arc<LockWaits<RingWaits<F>>>)
    where
        F: FileSystem + Send + Sync + 'static,
    {
        let RingWaits { server, stats } = waits.server();
        let mut cqes = std::mem::take(&mut self.pending);
        loop {
            for cqe in cqes.drain(..) {
                let (ud, res) = (cqe.user_data(), cqe.result());
                if ud == STOP {
                    log::debug!("io-uring queue {}: stopping", self.qid);
                    return;
                }
                if ud == DONE {
                    self.collect_done();
                    continue;
                }
                let Ok(i) = usize::try_from(ud) else { continue };
                if i >= self.used || !self.alive[i] {
                    continue;
                }
                if res == 0 {
                    self.retries[i] = 0;
                    self.save_request(i);
                    if waits_indefinitely(self.bufs.entry(i).opcode()) {
                        self.offload(i, waits);
                        continue;
                    }
                    let commit_id = self.serve_entry(i, server, stats);
                    self.commit(i, commit_id);
                } else {
                    self.failed(i, -res, server, stats);
                }
            }
            if self.live == 0 {
                log::info!(
                    "io-uring queue {}: the kernel released every entry (unmounted or aborted)",
                    self.qid
                );
                return;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    // The CQ is full: drain it below before submitting more.
                }
                Err(e) => {
                    log::error!("io-uring queue {}: io_uring_enter: {e}", self.qid);
                    return;
                }
            }
            cqes.extend(self.ring.completion());
        }
    }

    fn retire(&mut self, i: usize) {
        if self.alive[i] {
            self.alive[i] = false;
            self.live -= 1;
        }
    }

    /// A command on entry `i` failed with `errno`.
    /// Keeps what [`Server::reply_lost`] needs of the request in entry `i`, for the opcodes
    /// whose lost reply leaves something to give back.
    fn save_request(&mut self, i: usize) {
        let e = self.bufs.entry(i);
        let saved = &mut self.saved[i];
        saved.clear();
        if !matches!(e.opcode(), op::OPEN | op::CREATE | op::SETLK | op::SETLKW) {
            return;
        }
        let hdr = e.header_slice(0, REQ_HEADER_SZ);
        let len = read_u32(&hdr, 0) as usize;
        let payload_sz = read_u32(&hdr, ENT_IN_OUT_OFF + 16) as usize;
        let op_len = len
            .saturating_sub(IN_HEADER_LEN)
            .saturating_sub(payload_sz)
            .min(OP_IN_OUT_SZ);
        saved.resize(IN_HEADER_LEN + op_len, 0);
        e.header_slice(0, IN_HEADER_LEN)
            .copy_to(&mut saved[..IN_HEADER_LEN]);
        e.header_slice(IN_OUT_HEADER_SZ, op_len)
            .copy_to(&mut saved[IN_HEADER_LEN..]);
    }

    /// The commit of entry `i` was refused with ENOENT: its reply never reached the client.
    fn reply_lost<F: FileSystem>(&mut self, i: usize, server: &Server<F>, stats: &Stats) {
        stats.lost.fetch_add(1, Ordering::Relaxed);
        let saved = std::mem::take(&mut self.saved[i]);
        if saved.is_empty() {
            return;
        }
        let e = self.bufs.entry(i);
        let body = (read_u32(&e.header_slice(0, REQ_HEADER_SZ), ENT_IN_OUT_OFF + 16) as usize)
            .min(1024)
            .min(e.payload_len);
        let mut reply = vec![0u8; OUT_HEADER_LEN + body];
        e.header_slice(0, OUT_HEADER_LEN)
            .copy_to(&mut reply[..OUT_HEADER_LEN]);
        e.payload_slice(body).copy_to(&mut reply[OUT_HEADER_LEN..]);
        server.reply_lost(&saved, &reply);
    }

    fn failed<F: FileSystem>(&mut self, i: usize, errno: i32, server: &Server<F>, stats: &Stats) {
        if errno == libc::ENOENT {
            self.reply_lost(i, server, stats);
        }
        match errno {
            // Connection torn down (unmount, abort, daemon exit) or ring cancelled.
            libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => {
                log::debug!("io-uring queue {} entry {i}: errno {errno}", self.qid);
                self.retire(i);
            }
            _ => {
                // E.g. ENOENT: the request this entry answered was already ended by the kernel
                // (interrupted, timed out); the kernel dropped the entry. Register its buffers
                // again as a fresh entry, a few times at most.
                log::warn!(
                    "io-uring queue {} entry {i}: {}",
                    self.qid,
                    io::Error::from_raw_os_error(errno)
                );
                self.retries[i] = self.retries[i].saturating_add(1);
                if self.retries[i] > 3 || self.register_entry(i).is_err() {
                    self.retire(i);
                }
            }
        }
    }

    /// Serves the request in entry `i` on this thread; returns the commit id.
    fn serve_entry<F: FileSystem>(&mut self, i: usize, server: &Server<F>, stats: &Stats) -> u64 {
        self.bufs
            .entry(i)
            .serve(server, stats, &mut self.scratch, self.qid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a lock wait leaves the ring's thread; writebacks end by themselves.
    #[test]
    fn only_lock_waits_leave_the_ring_thread() {
        assert!(waits_indefinitely(op::SETLKW));
        for o in [op::SETLK, op::FSYNC, op::FLUSH, op::SYNCFS, op::READ] {
            assert!(!waits_indefinitely(o), "{}", op::name(o));
        }
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0"), 1);
        assert_eq!(parse_cpu_list("0-1"), 2);
        assert_eq!(parse_cpu_list("0-3,8-11"), 8);
        assert_eq!(parse_cpu_list("0-3,5"), 5);
        assert_eq!(parse_cpu_list("x"), 0);
        assert_eq!(parse_cpu_list("3-1"), 0);
    }

    /// Fills entry `i` as the kernel does: in-header, first argument in `op_in`, the rest in
    /// the payload, `ent_in_out` with the commit id and payload size (node id 1, the root).
    fn put_request(
        q: &Queue,
        i: usize,
        opcode: u32,
        unique: u64,
        op_in: &[u8],
        payload: &[u8],
        len: u32,
    ) {
        let h = InHeader {
            len,
            opcode,
            unique,
            nodeid: 1,
            ..Default::default()
        };
        q.bufs
            .header_slice(i, 0, IN_HEADER_LEN)
            .copy_from(vm_memory::ByteValued::as_slice(&h));
        q.bufs
            .header_slice(i, IN_OUT_HEADER_SZ, op_in.len())
            .copy_from(op_in);
        q.bufs.payload_slice(i, payload.len()).copy_from(payload);
        q.bufs
            .header_slice(i, ENT_IN_OUT_OFF + 8, 8)
            .copy_from(&unique.to_ne_bytes()[..]);
        q.bufs
            .header_slice(i, ENT_IN_OUT_OFF + 16, 4)
            .copy_from(&(payload.len() as u32).to_ne_bytes()[..]);
    }

    /// (error, unique, payload_sz) of the reply in entry `i`.
    fn reply(q: &Queue, i: usize) -> (i32, u64, u32) {
        let h = q.bufs.header_slice(i, 0, REQ_HEADER_SZ);
        (
            read_u32(&h, 4) as i32,
            read_u64(&h, 8),
            read_u32(&h, ENT_IN_OUT_OFF + 16),
        )
    }

    #[test]
    fn entries_decode_into_the_server() {
        use crate::protocol::abi::{AttrOut, GetattrIn};
        let server = crate::testing::fuzzing::server(crate::testing::memfs::MemFs::new().unwrap());
        let stats = Stats::default();
        let stop = eventfd().unwrap();
        let mut q = Queue::new(-1, 0, 2, MIN_PAYLOAD, stop.as_raw_fd()).unwrap();
        let hl = IN_HEADER_LEN as u32;

        // GETATTR of the root: its argument struct in op_in, no payload.
        let ga = GetattrIn::default();
        let ga = vm_memory::ByteValued::as_slice(&ga);
        put_request(&q, 0, op::GETATTR, 42, ga, &[], hl + ga.len() as u32);
        assert_eq!(q.serve_entry(0, &server, &stats), 42, "commit id");
        assert_eq!(reply(&q, 0), (0, 42, std::mem::size_of::<AttrOut>() as u32));

        // LOOKUP: no argument struct, the name in the payload; memfs has no such name.
        put_request(&q, 1, op::LOOKUP, 44, &[], b"nope\0", hl + 5);
        assert_eq!(q.serve_entry(1, &server, &stats), 44);
        assert_eq!(reply(&q, 1), (-libc::ENOENT, 44, 0));

        // A length that puts more than 128 bytes in op_in: EIO, counted, no panic.
        put_request(&q, 0, op::GETATTR, 46, ga, &[], hl + 300);
        assert_eq!(q.serve_entry(0, &server, &stats), 46);
        assert_eq!(reply(&q, 0), (-libc::EIO, 46, 0));
        // A length shorter than the header and payload: EIO too.
        put_request(&q, 1, op::LOOKUP, 48, &[], b"nope\0", 3);
        assert_eq!(q.serve_entry(1, &server, &stats), 48);
        assert_eq!(reply(&q, 1), (-libc::EIO, 48, 0));
        assert_eq!(stats.malformed.load(Ordering::Relaxed), 2);
        assert_eq!(stats.served.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn register_sqe_layout() {
        let iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let e = ring_cmd(7, CMD_REGISTER, 3, 0x1122, Some(iov.as_ptr()));
        // SAFETY: reads the 128 bytes of a live, #[repr(C)] 128-byte entry.
        let b: [u8; 128] = unsafe { std::mem::transmute_copy(&e) };
        assert_eq!(b[0], opcode::UringCmd80::CODE, "opcode");
        assert_eq!(i32::from_ne_bytes(b[4..8].try_into().unwrap()), 7, "fd");
        assert_eq!(
            u32::from_ne_bytes(b[8..12].try_into().unwrap()),
            CMD_REGISTER,
            "cmd_op"
        );
        assert_eq!(
            u64::from_ne_bytes(b[16..24].try_into().unwrap()),
            iov.as_ptr() as u64,
            "addr"
        );
        assert_eq!(u32::from_ne_bytes(b[24..28].try_into().unwrap()), 2, "len");
        // The command area starts at byte 48: fuse_uring_cmd_req.
        assert_eq!(
            u64::from_ne_bytes(b[56..64].try_into().unwrap()),
            0x1122,
            "commit_id"
        );
        assert_eq!(u16::from_ne_bytes(b[64..66].try_into().unwrap()), 3, "qid");
    }
}
