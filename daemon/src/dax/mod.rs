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
//! Placement. QEMU 11.1 maps a file range only when the file covers all of it, and maps
//! every range shared and writable. So a guest mapping becomes one of:
//! - *direct*: the file's whole pages from the file, plus a shared shadow tail
//!   ([`tail::Shadow`]) for the rest when the file ends inside the range (1 or 2 frontend
//!   mappings);
//! - *snapshot*: a read-only guest mapping of a file the daemon cannot open read-write
//!   (immutable, read-only mount, no permission) or of an executable file (so the host can
//!   still execute it: no writable descriptor is held): the whole range from a memfd copy,
//!   refreshed from the file at every sync point (1 frontend mapping);
//! - *merged*: a writable mapping that would need two frontend mappings when the mapping
//!   budget has no room for them: the whole range from a shadow written back run by run.
//!
//! Locking. The table lock is held only for bookkeeping, never across a frontend round trip:
//! a request claims its window range (marks it busy), releases the lock, talks to the
//! frontend, and takes the lock again to publish the result. Device pause and reset (called
//! from the vhost-user control thread, which the frontend may be blocking on) therefore never
//! wait for a frontend reply. A request for an inode with no mappings looks at one shard of
//! an owner index, not the table.
//!
//! Files: `mapping` has the [`Mapper`](crate::protocol::mapper::Mapper) side
//! (SETUPMAPPING, REMOVEMAPPING, end of session); `placement` and `pool` decide and make
//! placements (`prealloc` allocates a writable direct range's blocks before it is mapped, so a
//! full host file system refuses the SETUPMAPPING instead of faulting in QEMU); `table` keeps the bookkeeping (claims, budget, parked copy slots, generations);
//! `sink` sends SHMEM requests and waits for their commit; `sync` keeps placements coherent
//! with their files ([`coherent::Coherence`]); `config` and `stats` are settings and
//! counters; [`tail`], [`copy`] and `memfd` are the memfds behind shadows and copy slots;
//! [`host_watch`] follows host processes that may shrink a mapped file and `evacuate` moves
//! the mappings of such a file to shadows; [`coherent`] is the filesystem decorator that
//! calls the coherence hooks around requests; [`window_io`] moves the bytes of request
//! buffers that lie in the window.
//!
//! Budget. Every frontend mapping is a memory region in QEMU (a KVM memory slot on KVM hosts,
//! an entry in each vhost-user backend's memory table). The window never has more than
//! `budget` of them live or in flight; see [`DEFAULT_MAP_BUDGET`].

mod baseline;
pub mod coherent;
mod config;
pub mod copy;
mod evacuate;
pub mod host_watch;
mod kept;
mod mapping;
mod memfd;
pub mod mode;
mod placement;
mod pool;
mod prealloc;
pub use prealloc::folio_span;
mod sink;
mod stats;
mod stranded;
mod sync;
mod table;
pub mod tail;
#[cfg(test)]
mod tests;
mod wberr;
pub mod window_io;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Condvar, Mutex, RwLock, Weak};
use std::time::Duration;

use vhost::vhost_user::Backend;

use copy::{CopyMode, Slots};
use sink::TableUpdates;
pub use sink::WindowSink;
use stats::Counters;
pub use stats::DaxStats;
use table::{Owners, Table};
use tail::{Shadow, ShadowKey};

/// Window mappings must be aligned to this (what INIT's `map_alignment` announces).
pub const MAP_ALIGNMENT: u64 = 4096;
/// The unit Linux 6.12 maps in (fs/fuse/dax.c `FUSE_DAX_SZ`), and the upstream policy of this
/// project's guest kernel: the guest's range size until its first SETUPMAPPING shows it.
pub const RANGE_SIZE: u64 = 2 << 20;
/// The smallest guest range size the window learns: Linux with this project's patches maps
/// ranges of `dax_range=` (hybrid policy default: the window over 128, 256 KiB at least, up to
/// 1 GiB). A guest that maps smaller pieces gets no more than the budget of frontend mappings
/// (ENOSPC past it), so it cannot make the frontend's memory map grow without bound.
pub const MIN_GUEST_RANGE: u64 = 256 << 10;
/// QEMU 11.1's `VHOST_USER_MAX_RAM_SLOTS` (hw/virtio/vhost-user.c: 512 on every target but
/// ppc). Its vhost memory listener puts every fd-backed RAM section of the guest's address
/// space into each vhost-user backend's memory table, every SHMEM mapping included (each is
/// its own memory region); with CONFIGURE_MEM_SLOTS, `vhost_user_add_remove_regions`
/// asserts the table holds at most this many and QEMU aborts past it.
pub const QEMU_MAX_RAM_SLOTS: usize = 512;
/// What the backend answers to GET_MAX_MEM_SLOTS (`vhost-user-backend`'s `MAX_MEM_SLOTS`):
/// QEMU keeps `min(answer, QEMU_MAX_RAM_SLOTS)` as the device's limit (it refuses to plug
/// memory devices past it, and refuses a backend whose limit is below the RAM present).
pub const MAX_MEM_SLOTS_ANSWER: usize = 509;
/// Memory regions one vhost-user backend's table may hold: the smaller of the two above.
pub const FRONTEND_SLOT_LIMIT: usize = if MAX_MEM_SLOTS_ANSWER < QEMU_MAX_RAM_SLOTS {
    MAX_MEM_SLOTS_ANSWER
} else {
    QEMU_MAX_RAM_SLOTS
};
/// Slots left for everything in the table that is not a window mapping: the guest's RAM
/// sections (2 to 4 on a pc or q35 machine with a memory backend; each hot-plugged DIMM or
/// virtio-mem memslot one more), with room to spare. On KVM hosts every mapping is also a KVM
/// memory slot: 509 usable ones per address space before Linux 5.15 (32,764 since), of which
/// QEMU itself takes a dozen or two for ROMs, the VGA and RAM, so this margin covers those
/// hosts too.
pub const RESERVED_SLOTS: usize = 64;
/// Frontend mappings the window keeps live at most (445). A window with more guest ranges
/// than this is served *pooled* (see [`DaxWindow::pooled`]): one frontend mapping in all.
pub const DEFAULT_MAP_BUDGET: usize = FRONTEND_SLOT_LIMIT - RESERVED_SLOTS;
/// How often dirty shadows are written back without a guest request: the most a SIGKILL of
/// the daemon can lose is guest stores into shadow tails of the last period.
pub const WRITEBACK_PERIOD: Duration = Duration::from_secs(5);

/// The DAX window of one device.
///
/// Lock order: a thread holding a lock takes only locks of a later group, never one of an
/// earlier group or a second one of its own group (except as the arrows say):
/// 1. `pool_lock`, held across the pool's one SHMEM_MAP round trip (pause and reset never
///    take it);
/// 2. `shadows` (the registry) -> one shadow's own mutex (`SharedShadow`);
/// 3. `table` (`idle` waits on it) -> an `owners` shard;
/// 4. `sink` (a read lock for one request to the frontend, its commit wait included) ->
///    `shmem_lock` -> `committed` (`committed_cv` waits on it);
/// 5. leaves: `logged`, `stranded` (a shadow of it is locked only after it is let go),
///    the write-back errors, `host` ([`host_watch`]: files sent to the frontend, owner keys,
///    marks, a group's expected ranges) and `io` ([`window_io`]: mappings sent, the
///    evacuation gate, held shared across one `pwrite`).
///
/// Groups 2 and 3 are never held together either: code that needs a shadow and the table
/// copies what it needs out of the table first. So nothing but `pool_lock` is held across a
/// frontend round trip, and device pause and reset (called from the vhost-user control
/// thread, which the frontend may be blocking on) never wait for one: they take `committed`
/// alone to wake the commit waits, and `table` then a shadow, one after the other.
pub struct DaxWindow<S: WindowSink = Backend> {
    size: u64,
    /// The configured budget of frontend mappings (see [`DaxWindow::budget`]).
    budget: usize,
    /// The guest's range size: its first checked SETUPMAPPING's length (an aligned power of
    /// two from [`MIN_GUEST_RANGE`] to the window's size), lowered by any smaller one since;
    /// 0 until then ([`RANGE_SIZE`] is assumed). See [`DaxWindow::ranges`].
    guest_range: AtomicU64,
    sink: RwLock<Option<S>>,
    running: AtomicBool,
    /// Until when host operations on mapped files wait for a paused device: set by the first
    /// that waits in a pause and shared by every later one (a batch of host opens waits one
    /// bound in all, not one each); cleared when the device runs again.
    paused_until: Mutex<Option<std::time::Instant>>,
    /// Live mappings. Never held across a frontend round trip.
    table: Mutex<Table>,
    /// Signalled when a busy range is released.
    idle: Condvar,
    owners: Owners,
    shadows: Mutex<HashMap<ShadowKey, Weak<Mutex<Shadow>>>>,
    /// Files already logged as mapped from snapshots (bounded).
    logged: Mutex<HashSet<(u64, u64)>>,
    /// `/proc/self/fd`, to reopen an executable read-only for its snapshot.
    proc_self_fd: std::sync::OnceLock<std::os::fd::OwnedFd>,
    counters: Counters,
    /// `--dax-copy` (a [`CopyMode`] as u8).
    copy_mode: std::sync::atomic::AtomicU8,
    /// `--dax-mapping pooled`: every guest mapping goes to the pool (see [`mode::MapMode`]).
    pool_always: AtomicBool,
    /// The copy slots' memfd, made at the first copy.
    slots: std::sync::OnceLock<Slots>,
    /// Serialises the pool's SHMEM_MAP.
    pool_lock: Mutex<()>,
    /// Serialises SHMEM requests to the frontend, each until its memory-table update
    /// arrived (see [`DaxWindow::with_sink`]).
    shmem_lock: Mutex<()>,
    /// Memory-table updates received from the frontend, and whether it sends one for each
    /// SHMEM request (QEMU 11.1 does).
    committed: Mutex<TableUpdates>,
    /// Signalled at each memory-table update.
    committed_cv: Condvar,
    /// Write-back errors, for FSYNC, FLUSH and SYNCFS to report.
    wb: wberr::WbErrors,
    /// Guest bytes whose write-back failed after their range left the window (leaf lock).
    stranded: Mutex<Vec<stranded::Stranded>>,
    /// Host files the window sent the frontend and their fanotify marks (leaf locks).
    host: host_watch::HostWatch,
    /// Mappings sent and the evacuation gate, for request buffers in the window (leaf locks).
    io: window_io::IoState,
    /// Where the pooled window is kept across a server crash (`--restartable`, [`kept`]).
    keeper: std::sync::OnceLock<std::sync::Arc<dyn crate::protocol::keeper::Keeper>>,
    /// The page hashes and agreed lengths of writable pooled ranges, when kept.
    hash_store: std::sync::OnceLock<std::sync::Arc<kept::HashStore>>,
    /// A server before this one may have sent the pool's SHMEM_MAP without its reply: the
    /// next [`DaxWindow::ensure_pool`] unmaps the window first.
    pool_unsure: AtomicBool,
    /// Entries a server before this one kept that the take-back dropped: released once the
    /// keeper is set ([`DaxWindow::set_keeper`]).
    kept_drop: Mutex<Vec<crate::protocol::keeper::Kept>>,
}

fn einval(why: &str) -> io::Error {
    log::warn!("DAX request refused: {why}");
    io::Error::from_raw_os_error(libc::EINVAL)
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

fn file_size(f: &File) -> io::Result<u64> {
    Ok(crate::sys::fstat(f.as_fd())?.st_size.max(0) as u64)
}

/// Whether `fd` was opened for writing.
fn fd_writable(fd: BorrowedFd) -> bool {
    // SAFETY: F_GETFL reads the descriptor's status flags; `fd` is valid for the call.
    let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    fl >= 0 && fl & libc::O_ACCMODE == libc::O_RDWR
}

impl<S: WindowSink> DaxWindow<S> {
    /// A window of `size` bytes (a multiple of [`MAP_ALIGNMENT`]) with the default budget.
    pub fn new(size: u64) -> io::Result<Self> {
        Self::with_budget(size, DEFAULT_MAP_BUDGET)
    }

    /// A window that keeps at most `budget` frontend mappings live; with more guest ranges
    /// than that it is served pooled ([`DaxWindow::pooled`]).
    pub fn with_budget(size: u64, budget: usize) -> io::Result<Self> {
        if size == 0 || size % MAP_ALIGNMENT != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("DAX window size must be a non-zero multiple of {MAP_ALIGNMENT}"),
            ));
        }
        Ok(DaxWindow {
            size,
            budget,
            guest_range: AtomicU64::new(0),
            sink: RwLock::new(None),
            running: AtomicBool::new(false),
            paused_until: Mutex::new(None),
            table: Mutex::new(Table::default()),
            idle: Condvar::new(),
            owners: Owners::new(),
            shadows: Mutex::new(HashMap::new()),
            logged: Mutex::new(HashSet::new()),
            proc_self_fd: std::sync::OnceLock::new(),
            counters: Counters::default(),
            copy_mode: std::sync::atomic::AtomicU8::new(CopyMode::Off as u8),
            pool_always: AtomicBool::new(false),
            slots: std::sync::OnceLock::new(),
            pool_lock: Mutex::new(()),
            shmem_lock: Mutex::new(()),
            committed: Mutex::new(TableUpdates::default()),
            committed_cv: Condvar::new(),
            wb: wberr::WbErrors::default(),
            stranded: Mutex::new(Vec::new()),
            host: host_watch::HostWatch::default(),
            io: window_io::IoState::default(),
            keeper: std::sync::OnceLock::new(),
            hash_store: std::sync::OnceLock::new(),
            pool_unsure: AtomicBool::new(false),
            kept_drop: Mutex::new(Vec::new()),
        })
    }
}
