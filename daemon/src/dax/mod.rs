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
//! Budget. Every frontend mapping is a memory region in QEMU (a KVM memory slot on KVM hosts,
//! an entry in each vhost-user backend's memory table). The window never has more than
//! `budget` of them live or in flight; see [`DEFAULT_MAP_BUDGET`].

pub mod coherent;
pub mod copy;
pub mod host_watch;
pub mod mode;
pub mod tail;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, Weak};
use std::time::Duration;

use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags};
use vhost::vhost_user::{Backend, VhostUserFrontendReqHandler};

use crate::mapper::Mapper;
use crate::vhost_user::BackendChannel;
use copy::{Churn, CopyMode, CopySig, Slots};
use tail::{Shadow, ShadowKey};

/// Window mappings must be aligned to this (what INIT's `map_alignment` announces).
pub const MAP_ALIGNMENT: u64 = 4096;
/// The unit Linux maps in (fs/fuse/dax.c `FUSE_DAX_SZ`).
pub const RANGE_SIZE: u64 = 2 << 20;
/// The smallest guest range size the budget makes room for: Linux with this project's patches
/// maps ranges of `dax_range=` (hybrid policy default 256 KiB). A guest that maps smaller pieces
/// gets no more than `size / MIN_GUEST_RANGE` frontend mappings, so it cannot make the
/// frontend's memory map grow without bound.
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
    /// Requests refused or failed (invalid, over budget, or the frontend said no).
    pub failures: u64,
    /// Bytes mapped right now.
    pub mapped_bytes: u64,
    /// Mappings that needed a shadow tail (file shorter than the range).
    pub tails: u64,
    /// Read-only mappings served from a snapshot.
    pub snapshots: u64,
    /// Writable mappings merged into one frontend mapping for the budget.
    pub merged: u64,
    /// Mappings re-placed because the file's page layout changed.
    pub replaced: u64,
    /// Guest bytes written back from shadows to files.
    pub written_back: u64,
    /// Host bytes copied into shadows.
    pub pulled: u64,
    /// Frontend mappings live now, and the most ever live.
    pub regions: u64,
    pub peak_regions: u64,
    /// Read-only mappings placed as copy slots (with a SHMEM_MAP).
    pub copies: u64,
    /// Copy slots refilled in place: a parked slot reused, no frontend round trip.
    pub reused: u64,
    /// Copy slots re-read because the file changed.
    pub recopied: u64,
    /// Parked copy slots now, and parked slots unmapped for the budget.
    pub parked: u64,
    pub evicted: u64,
    /// Guest mappings served from the pool (a window with more ranges than the budget).
    pub pooled: u64,
    /// Regions in the frontend's memory table (guest RAM and window mappings) now, and the
    /// most ever: what QEMU holds against its `VHOST_USER_MAX_RAM_SLOTS`.
    pub table_regions: u64,
    pub peak_table_regions: u64,
    /// SHMEM requests whose memory-table update had not reached the daemon yet when the
    /// frontend acknowledged them (each waited for it before the guest got its reply).
    pub commit_waits: u64,
}

impl std::fmt::Display for DaxStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "dax: maps={} unmaps={} upgrades={} failures={} mapped_bytes={} tails={} snapshots={} merged={} replaced={} written_back={} pulled={} regions={} peak_regions={} copies={} reused={} recopied={} parked={} evicted={} pooled={} table_regions={} peak_table_regions={} commit_waits={}",
            self.maps, self.unmaps, self.upgrades, self.failures, self.mapped_bytes, self.tails,
            self.snapshots, self.merged, self.replaced, self.written_back, self.pulled,
            self.regions, self.peak_regions, self.copies, self.reused, self.recopied,
            self.parked, self.evicted, self.pooled, self.table_regions, self.peak_table_regions,
            self.commit_waits
        )
    }
}

type SharedShadow = Arc<Mutex<Shadow>>;

/// One guest mapping as placed in the frontend.
struct Placed {
    owner: u64,
    len: u64,
    foffset: u64,
    writable: bool,
    /// The mapped file; `None` for a snapshot of a file kept without a descriptor.
    file: Option<Arc<File>>,
    /// Bytes `[0, file_len)` of the range are mapped from the file.
    file_len: u64,
    /// The rest (or, when `whole`, all of it) from a shadow.
    shadow: Option<SharedShadow>,
    whole: bool,
    /// Frontend mappings this placement uses.
    regions: usize,
    /// A copy slot (the whole range from [`Slots`] at the same offset): what it was copied
    /// from. `file` is the descriptor it is refilled from.
    copy: Option<CopySig>,
    /// Served from the pool (the window's one frontend mapping of [`Slots`]): no frontend
    /// mapping of its own. Read-only ones are copies (`copy`); writable ones are merged
    /// with the file at sync points, `Some(agreed length)` of their bytes in the pool's
    /// agreed copy, and the file as the last merge left it (`pool_sig`).
    pooled: bool,
    pool_agreed: Option<u64>,
    pool_sig: Option<CopySig>,
}

impl Placed {
    /// A copy slot holding `len` bytes of `file` from `foffset`, copied as `sig` says.
    fn copy_slot(
        owner: u64,
        len: u64,
        foffset: u64,
        file: Option<Arc<File>>,
        sig: CopySig,
    ) -> Self {
        Placed {
            owner,
            len,
            foffset,
            writable: false,
            file,
            file_len: 0,
            shadow: None,
            whole: true,
            regions: 1,
            copy: Some(sig),
            pooled: false,
            pool_agreed: None,
            pool_sig: None,
        }
    }
}

/// How to place a guest mapping.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Plan {
    /// From the file, then a tail when the file ends inside the range.
    Direct,
    /// Read-only, from a snapshot of the whole range.
    Snapshot,
    /// Writable, the whole range from a shadow written back to the file.
    Merged,
    /// Read-only, the whole range from a copy slot ([`copy`]).
    Copy,
}

/// A copy slot the guest removed: still mapped in the frontend, no guest mapping.
struct Parked {
    len: u64,
    /// Parking order (evicted oldest first).
    seq: u64,
}

#[derive(Default)]
struct Table {
    live: BTreeMap<u64, Placed>,
    /// Window ranges with a frontend round trip in progress.
    busy: Vec<(u64, u64)>,
    by_owner: HashMap<u64, BTreeSet<u64>>,
    /// Frontend mappings live or reserved for a round trip in progress.
    regions: usize,
    peak: usize,
    /// Bumped when the frontend dropped every mapping (device reset): round trips that
    /// started before it publish nothing.
    gen: u64,
    /// Frontend mappings a round trip placed across a reset: the frontend may have applied
    /// them after its reset. Unmapped (a refusal tolerated) before the range is used again.
    orphans: Vec<(u64, u64)>,
    /// Parked copy slots by window offset (never overlapping a live or busy range). Each
    /// holds one frontend mapping, counted in `regions`.
    parked: BTreeMap<u64, Parked>,
    park_seq: u64,
    /// Guest ranges removed lately (for `--dax-copy=auto`).
    churn: Churn,
    /// The generation in which the pool (one frontend mapping of the whole window from
    /// [`Slots`]) was mapped; the pool is in the frontend while this equals `gen`.
    pool: Option<u64>,
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

    fn is_busy(&self, start: u64, end: u64) -> bool {
        self.busy.iter().any(|&(s, e)| s < end && start < e)
    }

    /// Releases the busy range holding `start` (busy ranges never overlap).
    fn unbusy(&mut self, start: u64) {
        if let Some(i) = self.busy.iter().position(|&(s, e)| s <= start && start < e) {
            self.busy.swap_remove(i);
        }
    }

    fn park(&mut self, moffset: u64, len: u64) {
        self.park_seq += 1;
        let seq = self.park_seq;
        self.parked.insert(moffset, Parked { len, seq });
    }

    /// Parked slots overlapping `[start, end)`.
    fn parked_overlapping(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        if let Some((&s, p)) = self.parked.range(..start).next_back() {
            if s + p.len > start {
                out.push((s, p.len));
            }
        }
        out.extend(self.parked.range(start..end).map(|(&s, p)| (s, p.len)));
        out
    }
}

/// Inodes with live mappings, sharded so that a request for an unmapped inode takes one
/// small lock that no frontend round trip ever holds.
struct Owners([Mutex<HashMap<u64, usize>>; 16]);

impl Owners {
    fn new() -> Self {
        Owners(std::array::from_fn(|_| Mutex::new(HashMap::new())))
    }
    fn shard(&self, owner: u64) -> MutexGuard<'_, HashMap<u64, usize>> {
        let i = (owner ^ (owner >> 7) ^ (owner >> 17)) as usize % self.0.len();
        self.0[i].lock().unwrap_or_else(|e| e.into_inner())
    }
    fn add(&self, owner: u64) {
        *self.shard(owner).entry(owner).or_default() += 1;
    }
    fn sub(&self, owner: u64) {
        let mut s = self.shard(owner);
        if let Some(n) = s.get_mut(&owner) {
            *n -= 1;
            if *n == 0 {
                s.remove(&owner);
            }
        }
    }
    fn has(&self, owner: u64) -> bool {
        self.shard(owner).contains_key(&owner)
    }
    fn clear(&self) {
        for s in &self.0 {
            s.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }
}

#[derive(Default)]
struct Counters {
    maps: AtomicU64,
    unmaps: AtomicU64,
    upgrades: AtomicU64,
    failures: AtomicU64,
    tails: AtomicU64,
    snapshots: AtomicU64,
    merged: AtomicU64,
    replaced: AtomicU64,
    written_back: AtomicU64,
    pulled: AtomicU64,
    copies: AtomicU64,
    reused: AtomicU64,
    recopied: AtomicU64,
    evicted: AtomicU64,
    pooled: AtomicU64,
    table_regions: AtomicU64,
    peak_table_regions: AtomicU64,
    commit_waits: AtomicU64,
}

/// The DAX window of one device.
///
/// Lock order (a thread holding one may take those after it, never one before it):
/// 1. `pool_lock` (held across the pool's one SHMEM_MAP round trip; pause and reset never
///    take it);
/// 2. `shadows` (the registry), then one shadow's own mutex (`SharedShadow`; never held
///    across a frontend round trip);
/// 3. `table` (bookkeeping only, never across a round trip; `idle` waits on it);
/// 4. an `owners` shard, `logged`;
///
/// `sink` (a read lock for the duration of one request to the frontend) is taken with none of
/// the mutexes above held except `pool_lock`. A shadow's mutex and `table` are never held
/// together: code that needs both copies what it needs out of the table first.
pub struct DaxWindow<S: WindowSink = Backend> {
    size: u64,
    /// The configured budget of frontend mappings (see [`DaxWindow::budget`]).
    budget: usize,
    /// The smallest aligned power-of-two range the guest mapped (at least
    /// [`MIN_GUEST_RANGE`], at most [`RANGE_SIZE`]): its range size.
    guest_range: AtomicU64,
    sink: RwLock<Option<S>>,
    running: AtomicBool,
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
    /// The bytes writable pooled ranges agreed on with their files at the last merge (same
    /// offsets as `slots`), made at the first writable pooled mapping.
    agreed: std::sync::OnceLock<Slots>,
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
}

/// Memory-table updates seen, for [`DaxWindow::with_sink`].
#[derive(Default)]
struct TableUpdates {
    count: u64,
    /// Whether the frontend sends a memory-table update for each SHMEM request: learnt from
    /// the first request (an update within [`COMMIT_PROBE`]) and from any update holding a
    /// host file the window mapped; `None` until then.
    reports: Option<bool>,
}

/// How long a SHMEM request waits for the frontend's memory-table update after the ack.
const COMMIT_WAIT: Duration = Duration::from_secs(2);
/// How long the first SHMEM request waits for one, to learn whether the frontend sends them.
const COMMIT_PROBE: Duration = Duration::from_millis(500);

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
            guest_range: AtomicU64::new(RANGE_SIZE),
            sink: RwLock::new(None),
            running: AtomicBool::new(false),
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
            agreed: std::sync::OnceLock::new(),
            pool_lock: Mutex::new(()),
            shmem_lock: Mutex::new(()),
            committed: Mutex::new(TableUpdates::default()),
            committed_cv: Condvar::new(),
        })
    }

    /// Sets when read-only mappings become copy slots (`--dax-copy`; `Off` until called).
    pub fn set_copy_mode(&self, mode: CopyMode) {
        self.copy_mode.store(mode as u8, Ordering::Relaxed);
    }

    /// Sets where guest mappings go (`--dax-mapping`; [`mode::MapMode::Direct`] until
    /// called, the library's default, which the daemon's command line turns to pooled).
    /// Call it before the guest maps anything.
    pub fn set_map_mode(&self, mode: mode::MapMode) {
        self.pool_always
            .store(mode == mode::MapMode::Pooled, Ordering::Relaxed);
    }

    pub fn copy_mode(&self) -> CopyMode {
        match self.copy_mode.load(Ordering::Relaxed) {
            x if x == CopyMode::Auto as u8 => CopyMode::Auto,
            x if x == CopyMode::Always as u8 => CopyMode::Always,
            _ => CopyMode::Off,
        }
    }

    /// Whether a read-only mapping of `[moffset, moffset + len)` asked now becomes a copy
    /// slot: under `auto`, while the window churns, or onto a parked slot of exactly that
    /// range within [`copy::CHURN_LINGER`] of the last churn (a refill in place instead of
    /// taking the slot out of the frontend).
    fn copy_now(&self, moffset: u64, len: u64) -> bool {
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
    fn slots(&self) -> io::Result<&Slots> {
        if let Some(s) = self.slots.get() {
            return Ok(s);
        }
        let s = Slots::new(self.size).map_err(|e| {
            log::error!("cannot make the DAX copy slots' memfd: {e}");
            e
        })?;
        Ok(self.slots.get_or_init(|| s))
    }

    /// Gives the window `/proc/self/fd` (opened before the sandbox), so a snapshot of an
    /// executable can keep a read-only descriptor and follow host changes.
    pub fn set_proc_self_fd(&self, fd: std::os::fd::OwnedFd) {
        let _ = self.proc_self_fd.set(fd);
    }

    /// A read-only descriptor of the file behind `fd` (through `/proc/self/fd`), if any.
    fn reopen_read_only(&self, fd: BorrowedFd) -> Option<File> {
        let dir = self.proc_self_fd.get()?;
        let name = std::ffi::CString::new(fd.as_raw_fd().to_string()).ok()?;
        crate::sys::openat(dir.as_fd(), &name, libc::O_RDONLY | libc::O_CLOEXEC, 0)
            .map(File::from)
            .map_err(|e| log::debug!("reopening a mapped file read-only: {e}"))
            .ok()
    }

    /// The guest's ranges in the window: 2 MiB ranges until the guest maps a smaller aligned
    /// power-of-two range (down to [`MIN_GUEST_RANGE`]).
    pub fn ranges(&self) -> usize {
        self.size.div_ceil(self.guest_range.load(Ordering::Relaxed)) as usize
    }

    /// Frontend mappings kept live at most (the configured budget, at least 1).
    pub fn budget(&self) -> usize {
        self.budget.max(1)
    }

    /// Whether new guest mappings are served from the pool: `--dax-mapping pooled` (the
    /// daemon's default: no SHMEM request after the first, see [`mode`]), the pool is in the
    /// frontend already, or the window has more guest ranges than the budget (a guest that
    /// maps all of them one frontend mapping each would pass QEMU's memory slots). Pooled, the whole
    /// window is one frontend mapping of [`Slots`] (slot offset = window offset), made at the
    /// first SETUPMAPPING; each guest mapping is a copy of its file range there, merged back
    /// into the file at the sync points when writable (as a merged shadow). So no guest
    /// mapping is ever refused for the budget, whatever the window's size and the guest's
    /// range size; the price is a copy per SETUPMAPPING instead of a zero-copy mapping, and
    /// guest stores reach the file at the sync points (at most [`WRITEBACK_PERIOD`] later).
    pub fn pooled(&self) -> bool {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        self.pool_always.load(Ordering::Relaxed)
            || t.pool == Some(t.gen)
            || self.ranges() > self.budget()
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

    /// Learns the guest's range size from a checked SETUPMAPPING.
    fn note_guest_range(&self, moffset: u64, len: u64) {
        if !(len.is_power_of_two() && len >= MIN_GUEST_RANGE && moffset % len == 0) {
            return;
        }
        let before = self.guest_range.fetch_min(len, Ordering::Relaxed);
        let ranges = self.size.div_ceil(len) as usize;
        if len < before && ranges > self.budget() {
            log::info!(
                "the guest maps {} KiB DAX ranges: {ranges} of them fit the window, more than the budget of {} frontend mappings: new mappings are served from the pool once the window holds no frontend mapping (until then a mapping past the budget is refused with ENOSPC)",
                len >> 10,
                self.budget()
            );
        }
    }

    /// The start-up description: size, ranges, budget (and a warning when the window has
    /// more ranges than QEMU's memory slots allow).
    pub fn describe(&self) -> String {
        let mut d = format!(
            "DAX window {} MiB: {} ranges of 2 MiB (up to {} when the guest maps smaller ones), at most {} frontend mappings (QEMU 11.1's {} vhost-user memory slots less {} for guest RAM and KVM; shadow tails fold into one mapping per range when short)",
            self.size >> 20,
            self.ranges(),
            self.size.div_ceil(MIN_GUEST_RANGE),
            self.budget(),
            FRONTEND_SLOT_LIMIT,
            RESERVED_SLOTS
        );
        let why = if self.pool_always.load(Ordering::Relaxed) {
            Some("--dax-mapping pooled (no SHMEM request after the first: safe to pause with QEMU 11.1.3)")
        } else if self.ranges() > self.budget() {
            Some("more ranges than mappings")
        } else {
            None
        };
        match why {
            Some(why) => d.push_str(&format!(
                "; pooled: {why}, so the whole window is one frontend mapping of a memfd and every guest mapping a copy in it (writable ones written back at sync points, at most every {} s)",
                WRITEBACK_PERIOD.as_secs()
            )),
            None => d.push_str("; direct: zero-copy mappings of the files (--dax-mapping direct: with QEMU 11.1.3, pausing the VM while the guest maps or unmaps can crash QEMU)"),
        }
        match self.copy_mode() {
            CopyMode::Off => d.push_str("; copy slots off"),
            m => d.push_str(&format!(
                "; copy slots {m} (read-only ranges copied into one memfd of at most {} MiB, the window's size{})",
                self.size >> 20,
                if m == CopyMode::Auto {
                    format!(", while the guest recycles more than {} ranges a second of a window at least 3/4 full", copy::CHURN_PER_SECOND)
                } else {
                    String::new()
                }
            )),
        }
        d
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

    /// The device was reset: the frontend dropped every mapping (QEMU's `virtio_reset`
    /// removes them all), so do we, after writing shadows back. Sends nothing and never
    /// waits for a round trip in progress (those see the new generation and publish nothing).
    pub fn stop(&self) {
        self.running.store(false, Ordering::SeqCst);
        self.wake_commit_waiters();
        let (live, parked, _pool) = self.drain(true);
        for (m, p) in live {
            self.settle(m, &p);
            if p.pooled {
                self.free_pooled(m, &p);
            }
        }
        for (s, l) in parked {
            self.free_slot(s, l);
        }
    }

    /// What `device_paused` does: send nothing until the device starts; keep the table.
    pub fn pause(&self) {
        self.running.store(false, Ordering::SeqCst);
        self.wake_commit_waiters();
    }

    /// Ends the waits of [`Self::with_sink`] for a memory-table update (the device stopped).
    fn wake_commit_waiters(&self) {
        drop(self.committed.lock().unwrap_or_else(|e| e.into_inner()));
        self.committed_cv.notify_all();
    }

    #[cfg(test)]
    fn device_paused_for_test(&self) {
        self.pause();
    }

    /// Empties the table (new generation); returns what was in it, the parked copy slots and
    /// whether the pool was in the frontend. `reset`: the frontend dropped every mapping,
    /// orphans included.
    #[allow(clippy::type_complexity)]
    fn drain(&self, reset: bool) -> (Vec<(u64, Placed)>, Vec<(u64, u64)>, bool) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let pool = t.pool.take() == Some(t.gen);
        t.gen += 1;
        t.regions = 0;
        if reset {
            t.orphans.clear();
        }
        t.by_owner.clear();
        self.owners.clear();
        let parked = std::mem::take(&mut t.parked)
            .into_iter()
            .map(|(s, p)| (s, p.len))
            .collect();
        (
            std::mem::take(&mut t.live).into_iter().collect(),
            parked,
            pool,
        )
    }

    pub fn stats(&self) -> DaxStats {
        let c = &self.counters;
        let (mapped_bytes, regions, peak, parked) = self
            .table
            .lock()
            .map(|t| {
                (
                    t.live.values().map(|p| p.len).sum(),
                    t.regions,
                    t.peak,
                    t.parked.len(),
                )
            })
            .unwrap_or_default();
        DaxStats {
            maps: c.maps.load(Ordering::Relaxed),
            unmaps: c.unmaps.load(Ordering::Relaxed),
            upgrades: c.upgrades.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
            mapped_bytes,
            tails: c.tails.load(Ordering::Relaxed),
            snapshots: c.snapshots.load(Ordering::Relaxed),
            merged: c.merged.load(Ordering::Relaxed),
            replaced: c.replaced.load(Ordering::Relaxed),
            written_back: c.written_back.load(Ordering::Relaxed),
            pulled: c.pulled.load(Ordering::Relaxed),
            regions: regions as u64,
            peak_regions: peak as u64,
            copies: c.copies.load(Ordering::Relaxed),
            reused: c.reused.load(Ordering::Relaxed),
            recopied: c.recopied.load(Ordering::Relaxed),
            parked: parked as u64,
            evicted: c.evicted.load(Ordering::Relaxed),
            pooled: c.pooled.load(Ordering::Relaxed),
            table_regions: c.table_regions.load(Ordering::Relaxed),
            peak_table_regions: c.peak_table_regions.load(Ordering::Relaxed),
            commit_waits: c.commit_waits.load(Ordering::Relaxed),
        }
    }

    /// Writes every shadow back every `period` until the window is dropped.
    pub fn spawn_writeback(self: &Arc<Self>, period: Duration)
    where
        S: 'static,
    {
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("dax-writeback".into())
            .spawn(move || {
                // Signals are for the threads that wait for them (SIGUSR1, SIGTERM): a
                // thread with them unblocked would take their default action instead.
                // SAFETY: `all` is initialised by sigfillset; this changes only this
                // thread's mask.
                unsafe {
                    let mut all: libc::sigset_t = std::mem::zeroed();
                    libc::sigfillset(&mut all);
                    libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
                }
                loop {
                    // A timed condvar wait (futex) rather than a sleep: the seccomp allowlist
                    // has futex for every lock already.
                    let (m, cv) = (Mutex::new(()), Condvar::new());
                    let g = m.lock().unwrap_or_else(|e| e.into_inner());
                    drop(cv.wait_timeout(g, period));
                    match weak.upgrade() {
                        Some(w) => w.sync_all(),
                        None => return,
                    }
                }
            });
        if let Err(e) = spawned {
            log::error!("cannot start the DAX write-back thread: {e}");
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
    fn with_sink<T>(&self, f: impl FnOnce(&S) -> io::Result<T>) -> io::Result<T> {
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
        let res = f(s)?;
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

    /// Counts a refused or failed request.
    fn counted<T>(&self, res: io::Result<T>) -> io::Result<T> {
        if res.is_err() {
            self.counters.failures.fetch_add(1, Ordering::Relaxed);
        }
        res
    }

    /// Claims `[moffset, end)`: waits until no round trip is in progress there, takes every
    /// live mapping wholly inside it out of the table and marks the range busy. Returns the
    /// generation and what was taken out (still in the frontend).
    fn claim(&self, moffset: u64, end: u64) -> io::Result<(u64, Vec<(u64, Placed)>)> {
        self.claim_parked(moffset, end, false)
            .map(|(g, t, _)| (g, t))
    }

    /// Claims `[m, m + len)` and takes every mapping in it out of the frontend, freeing their
    /// share of the budget. Returns the generation and the placement that started at `m`
    /// (for the caller to place again, then release the claim with).
    fn claim_off(&self, m: u64, len: u64) -> io::Result<(u64, Option<Placed>)> {
        let (gen, taken) = self.claim(m, m + len)?;
        let mut placed = None;
        let mut freed = 0;
        for (s, p) in taken {
            self.unplace(s, &p);
            freed += p.regions;
            if s == m {
                placed = Some(p);
            }
        }
        self.unreserve(gen, freed);
        Ok((gen, placed))
    }

    /// [`Self::claim`]; with `take_parked`, also takes the parked copy slots overlapping the
    /// range out of the table (the busy range then spans them too) and returns them.
    #[allow(clippy::type_complexity)]
    fn claim_parked(
        &self,
        moffset: u64,
        end: u64,
        take_parked: bool,
    ) -> io::Result<(u64, Vec<(u64, Placed)>, Vec<(u64, u64)>)> {
        let mut t = self.lock()?;
        let (bstart, bend) = loop {
            let (mut s, mut e) = (moffset, end);
            if take_parked {
                for (ps, pl) in t.parked_overlapping(moffset, end) {
                    s = s.min(ps);
                    e = e.max(ps + pl);
                }
            }
            if !t.is_busy(s, e) {
                break (s, e);
            }
            t = self
                .idle
                .wait(t)
                .map_err(|_| io::Error::other("mapping table lock poisoned"))?;
        };
        let old = Self::overlapping(&t, moffset, end)?;
        let mut parked = Vec::new();
        if take_parked {
            for (ps, pl) in t.parked_overlapping(moffset, end) {
                t.parked.remove(&ps);
                parked.push((ps, pl));
            }
        }
        let mut taken = Vec::with_capacity(old.len());
        for s in old {
            if let Some(p) = t.remove(s) {
                self.owners.sub(p.owner);
                taken.push((s, p));
            }
        }
        t.busy.push((bstart, bend));
        let mut orphans = Vec::new();
        t.orphans.retain(|&(s, l)| {
            let hit = s < end && moffset < s + l;
            if hit {
                orphans.push((s, l));
            }
            !hit
        });
        let gen = t.gen;
        drop(t);
        for (s, l) in orphans {
            if let Err(e) = self.with_sink(|k| k.unmap(s, l)) {
                log::debug!("SHMEM_UNMAP of orphan {s:#x}+{l:#x}: {e} (the reset removed it)");
            }
        }
        Ok((gen, taken, parked))
    }

    /// Ends a claim: publishes `placed` if the frontend still has it (same generation).
    fn release(&self, gen: u64, moffset: u64, placed: Option<Placed>, freed: usize) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if t.gen == gen {
            t.regions = t.regions.saturating_sub(freed);
            if let Some(p) = placed {
                self.owners.add(p.owner);
                t.insert(moffset, p);
            }
        } else if let Some(p) = placed {
            log::warn!("DAX mapping {moffset:#x} completed across a device reset: dropped");
            if p.pooled {
                // Nothing of its own in the frontend; its bytes are freed below.
                drop(t);
                self.free_pooled(moffset, &p);
                t = self.table.lock().unwrap_or_else(|e| e.into_inner());
                t.unbusy(moffset);
                drop(t);
                self.idle.notify_all();
                return;
            }
            if p.file_len > 0 {
                t.orphans.push((moffset, p.file_len));
            }
            if p.file_len < p.len {
                t.orphans.push((moffset + p.file_len, p.len - p.file_len));
            }
        }
        t.unbusy(moffset);
        drop(t);
        self.idle.notify_all();
    }

    /// Ends a claim that parks copy slots (still in the frontend, still counted): they stay
    /// parked if the frontend still has them (same generation).
    fn release_parking(&self, gen: u64, moffset: u64, freed: usize, park: &[(u64, u64)]) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if t.gen == gen {
            t.regions = t.regions.saturating_sub(freed);
            for &(s, l) in park {
                t.park(s, l);
            }
        }
        t.unbusy(moffset);
        drop(t);
        self.idle.notify_all();
    }

    /// Reserves `n` frontend mappings for a new guest mapping. More than one is granted only
    /// while every 2 MiB range not yet mapped by the guest keeps one mapping in reserve.
    /// Parked copy slots are unmapped (oldest first) to make room.
    fn reserve(&self, gen: u64, n: usize) -> bool {
        loop {
            let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            if t.gen != gen {
                return false;
            }
            let guest = t.live.len() + t.busy.len();
            let headroom = if n > 1 {
                self.ranges().saturating_sub(guest)
            } else {
                0
            };
            if t.regions + n + headroom <= self.budget() {
                t.regions += n;
                t.peak = t.peak.max(t.regions);
                return true;
            }
            let victim = t
                .parked
                .iter()
                .filter(|(&s, p)| !t.is_busy(s, s + p.len))
                .min_by_key(|(_, p)| p.seq)
                .map(|(&s, p)| (s, p.len));
            let Some((s, l)) = victim else {
                return false;
            };
            t.parked.remove(&s);
            t.busy.push((s, s + l));
            drop(t);
            self.unmap_parked(gen, s, l);
            self.counters.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Unmaps a parked copy slot taken out of the table (its range marked busy by the
    /// caller) and gives its frontend mapping back to the budget.
    fn unmap_parked(&self, gen: u64, s: u64, l: u64) {
        self.drop_parked(gen, s, l);
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.unbusy(s);
        drop(t);
        self.idle.notify_all();
    }

    /// Takes a parked slot out of the frontend (or leaves it as an orphan while paused) and
    /// frees its pages. No busy bookkeeping.
    fn drop_parked(&self, gen: u64, s: u64, l: u64) {
        if self.running.load(Ordering::SeqCst) {
            if let Err(e) = self.with_sink(|k| k.unmap(s, l)) {
                log::warn!("SHMEM_UNMAP of parked copy slot {s:#x}+{l:#x}: {e}");
            }
        } else {
            let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            if t.gen == gen {
                t.orphans.push((s, l));
            }
        }
        self.free_slot(s, l);
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if t.gen == gen {
            t.regions = t.regions.saturating_sub(1);
        }
    }

    /// Frees a copy slot's pages (no frontend mapping of it is left).
    fn free_slot(&self, s: u64, l: u64) {
        if let Some(slots) = self.slots.get() {
            if let Err(e) = slots.zero(s, l) {
                log::debug!("freeing copy slot {s:#x}+{l:#x}: {e}");
            }
        }
    }

    /// Fills the copy slot `[moffset, moffset + len)` from `file`; returns what it copied.
    fn fill_slot(&self, moffset: u64, len: u64, file: &File, foffset: u64) -> io::Result<CopySig> {
        let sig = CopySig::of(file)?;
        self.slots()?
            .fill(moffset, len, file, foffset)
            .map_err(|e| {
                log::error!("copying a file range into DAX copy slot {moffset:#x}: {e}");
                eio()
            })?;
        Ok(sig)
    }

    fn unreserve(&self, gen: u64, n: usize) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if t.gen == gen {
            t.regions = t.regions.saturating_sub(n);
        }
    }

    /// The shared shadow of `key`, made (from `file`) if none is live.
    fn shadow(
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

    /// Merges a shadow with its file, counting what moved.
    fn sync_shadow(&self, s: &SharedShadow) {
        let mut g = s.lock().unwrap_or_else(|e| e.into_inner());
        match g.sync() {
            Ok(r) => {
                self.counters
                    .written_back
                    .fetch_add(r.written, Ordering::Relaxed);
                self.counters.pulled.fetch_add(r.pulled, Ordering::Relaxed);
            }
            Err(e) => log::error!("syncing a DAX shadow with its file failed: {e}"),
        }
    }

    /// Writes a placement's shadow (or its pooled bytes) back: it is leaving the frontend.
    fn settle(&self, m: u64, p: &Placed) {
        if let Some(s) = &p.shadow {
            self.sync_shadow(s);
        }
        if p.pool_agreed.is_some() {
            self.merge_pooled(m, p);
        }
    }

    /// The agreed bytes of writable pooled ranges (made on first use: the window's size at
    /// most).
    fn agreed(&self) -> io::Result<&Slots> {
        if let Some(s) = self.agreed.get() {
            return Ok(s);
        }
        let s = Slots::named(c"daxfsd-pool-agreed", self.size)?;
        Ok(self.agreed.get_or_init(|| s))
    }

    /// Merges a writable pooled range with its file (three ways, as a shadow); returns the
    /// new agreed length and the file's signature after it, `None` when there is nothing to
    /// merge or it failed (logged).
    fn merge_pooled(&self, m: u64, p: &Placed) -> Option<(u64, Option<CopySig>)> {
        let old = p.pool_agreed?;
        let f = p.file.as_ref()?;
        let (slots, agreed) = (self.slots.get()?, self.agreed.get()?);
        let unchanged = p.pool_sig.is_some() && CopySig::of(f).ok() == p.pool_sig;
        let r = tail::merge(
            tail::Span {
                file: slots.file(),
                at: m,
            },
            Some(tail::Span {
                file: agreed.file(),
                at: m,
            }),
            old,
            p.len,
            tail::Span {
                file: f,
                at: p.foffset,
            },
            true,
            unchanged,
        );
        match r {
            Ok((r, valid)) => {
                self.counters
                    .written_back
                    .fetch_add(r.written, Ordering::Relaxed);
                self.counters.pulled.fetch_add(r.pulled, Ordering::Relaxed);
                Some((valid, CopySig::of(f).ok()))
            }
            Err(e) => {
                log::error!("merging pooled DAX range {m:#x} with its file failed: {e}");
                None
            }
        }
    }

    /// Frees a pooled range's bytes (it left the table; already written back).
    fn free_pooled(&self, m: u64, p: &Placed) {
        self.free_slot(m, p.len);
        if p.pool_agreed.is_some() {
            if let Some(a) = self.agreed.get() {
                if let Err(e) = a.zero(m, p.len) {
                    log::debug!("freeing pooled agreed bytes {m:#x}: {e}");
                }
            }
        }
    }

    /// Merges `owner`'s writable pooled ranges (or every one) with their files.
    fn sync_pooled(&self, owner: Option<u64>) {
        let cands: Vec<(u64, u64)> = {
            let Ok(t) = self.table.lock() else { return };
            let pick = |m: &u64| {
                let p = t.live.get(m)?;
                p.pool_agreed.map(|_| (*m, p.len))
            };
            match owner {
                Some(o) => match t.by_owner.get(&o) {
                    Some(set) => set.iter().filter_map(pick).collect(),
                    None => return,
                },
                None => t.live.keys().filter_map(pick).collect(),
            }
        };
        for (m, len) in cands {
            let Ok((gen, taken)) = self.claim(m, m + len) else {
                continue;
            };
            let mut placed = None;
            for (s, mut p) in taken {
                if s == m && placed.is_none() {
                    if let Some((v, sig)) = self.merge_pooled(m, &p) {
                        p.pool_agreed = Some(v);
                        p.pool_sig = sig;
                    }
                    placed = Some(p);
                } else {
                    self.unplace(s, &p);
                    self.unreserve(gen, p.regions);
                }
            }
            self.release(gen, m, placed, 0);
        }
    }

    /// Puts the pool (the whole window from [`Slots`], writable) into the frontend if it is
    /// not there yet. `Ok(false)`: it cannot be, the window holds frontend mappings of its
    /// own (the guest started mapping smaller ranges after some were placed).
    fn ensure_pool(&self, gen: u64) -> io::Result<bool> {
        let _one = self.pool_lock.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut t = self.lock()?;
            if t.gen != gen {
                return Err(eio());
            }
            if t.pool == Some(gen) {
                return Ok(true);
            }
            if t.regions > 0 {
                return Ok(false);
            }
            t.regions += 1;
            t.peak = t.peak.max(t.regions);
        }
        let r = self
            .slots()
            .and_then(|slots| self.with_sink(|s| s.map(0, self.size, slots.fd(), 0, true)));
        let mut t = self.lock()?;
        match r {
            Ok(()) if t.gen == gen => {
                t.pool = Some(gen);
                drop(t);
                log::info!(
                    "DAX pool in the frontend: the {} MiB window is one mapping of the copy memfd",
                    self.size >> 20
                );
                Ok(true)
            }
            Ok(()) => {
                // The device was reset meanwhile: the frontend may have applied it after.
                t.orphans.push((0, self.size));
                Err(eio())
            }
            Err(e) => {
                if t.gen == gen {
                    t.regions = t.regions.saturating_sub(1);
                }
                drop(t);
                log::error!("SHMEM_MAP of the DAX pool failed: {e}");
                Err(eio())
            }
        }
    }

    /// Whether a new guest mapping goes to the pool (see [`DaxWindow::pooled`]).
    fn use_pool(&self) -> bool {
        self.pooled()
    }

    /// Places a guest mapping in the pool: a copy of its file range at the same offset of
    /// [`Slots`]. `Ok(None)`: the pool cannot be put into the frontend now (see
    /// [`Self::ensure_pool`]); the caller places it directly.
    #[allow(clippy::too_many_arguments)]
    fn place_pooled(
        &self,
        gen: u64,
        owner: u64,
        moffset: u64,
        len: u64,
        file: Option<Arc<File>>,
        source: &File,
        foffset: u64,
        writable: bool,
    ) -> io::Result<Option<Placed>> {
        if !self.ensure_pool(gen)? {
            return Ok(None);
        }
        let sig = CopySig::of(source)?;
        let slots = self.slots()?;
        let copied = slots.fill(moffset, len, source, foffset).map_err(|e| {
            log::error!("copying a file range into the DAX pool at {moffset:#x}: {e}");
            eio()
        })?;
        let pool_agreed = if writable {
            self.agreed()
                .and_then(|a| a.copy_from(slots, moffset, len))
                .map_err(|e| {
                    log::error!("keeping the agreed bytes of pooled range {moffset:#x}: {e}");
                    eio()
                })?;
            Some(copied)
        } else {
            None
        };
        self.counters.pooled.fetch_add(1, Ordering::Relaxed);
        Ok(Some(Placed {
            owner,
            len,
            foffset,
            writable,
            file,
            file_len: 0,
            shadow: None,
            whole: true,
            regions: 0,
            copy: if writable { None } else { Some(sig) },
            pooled: true,
            pool_agreed,
            pool_sig: Some(sig),
        }))
    }

    fn log_snapshot(&self, st: &libc::stat64, why: &str) {
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
    #[allow(clippy::too_many_arguments)]
    fn place(
        &self,
        gen: u64,
        owner: u64,
        moffset: u64,
        len: u64,
        file: Option<Arc<File>>,
        source: &File,
        key: (u64, u64),
        foffset: u64,
        writable: bool,
        plan: Plan,
    ) -> io::Result<Placed> {
        let size = file_size(source)?;
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
                .fill_slot(moffset, len, source, foffset)
                .and_then(|sig| {
                    let slots = self.slots()?;
                    self.with_sink(|s| s.map(moffset, len, slots.fd(), moffset, false))
                        .map_err(|e| {
                            log::error!("SHMEM_MAP of copy slot {moffset:#x}+{len:#x} failed: {e}");
                            eio()
                        })?;
                    Ok(sig)
                });
            return match res {
                Ok(sig) => {
                    self.counters.copies.fetch_add(1, Ordering::Relaxed);
                    Ok(Placed::copy_slot(owner, len, foffset, file, sig))
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
        let res = self.place_reserved(
            owner, moffset, len, file, source, key, foffset, writable, plan, file_len,
        );
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

    #[allow(clippy::too_many_arguments)]
    fn place_reserved(
        &self,
        owner: u64,
        moffset: u64,
        len: u64,
        file: Option<Arc<File>>,
        source: &File,
        key: (u64, u64),
        foffset: u64,
        writable: bool,
        plan: Plan,
        file_len: u64,
    ) -> io::Result<Placed> {
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
            pool_sig: None,
        };
        if file_len > 0 {
            let f = file.as_ref().ok_or_else(eio)?;
            let _watched = host_watch::watch(f, owner, moffset, foffset, file_len);
            self.with_sink(|s| s.map(moffset, file_len, f.as_fd(), foffset, writable))
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
                    source,
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
                        s.map(moffset + file_len, len - file_len, fd.as_fd(), 0, writable)
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
    fn unplace(&self, moffset: u64, p: &Placed) {
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

    /// Re-places `owner`'s mappings whose page layout no longer matches the file.
    fn relayout(&self, owner: u64) {
        let stale: Vec<(u64, u64)> = {
            let Ok(t) = self.table.lock() else { return };
            let Some(set) = t.by_owner.get(&owner) else {
                return;
            };
            // Every mapping of an owner maps the same inode (through its own descriptor):
            // one fstat for all of them, however many ranges the guest maps.
            let mut size: Option<Option<u64>> = None;
            set.iter()
                .filter_map(|m| {
                    let p = t.live.get(m)?;
                    if p.whole {
                        return None;
                    }
                    let f = p.file.as_ref()?;
                    let size = *size.get_or_insert_with(|| file_size(f).ok());
                    let size = size?;
                    (tail::layout(size, p.foffset, p.len).0 != p.file_len).then_some((*m, p.len))
                })
                .collect()
        };
        for (m, len) in stale {
            let Ok((gen, placed)) = self.claim_off(m, len) else {
                continue;
            };
            let np = placed.and_then(|p| {
                let f = p.file.clone()?;
                let key = crate::sys::fstat(f.as_fd())
                    .map(|st| (st.st_dev, st.st_ino))
                    .ok()?;
                let r = self.place(
                    gen,
                    p.owner,
                    m,
                    p.len,
                    Some(f.clone()),
                    &f,
                    key,
                    p.foffset,
                    p.writable,
                    Plan::Direct,
                );
                match r {
                    Ok(np) => {
                        self.counters.replaced.fetch_add(1, Ordering::Relaxed);
                        Some(np)
                    }
                    Err(e) => {
                        // The guest's mapping is gone from the frontend: its next access
                        // faults there instead of reading stale data.
                        log::error!(
                            "re-placing DAX mapping {m:#x} after a size change failed: {e}"
                        );
                        self.counters.failures.fetch_add(1, Ordering::Relaxed);
                        None
                    }
                }
            });
            self.release(gen, m, np, 0);
        }
    }

    /// Re-reads copy slots whose file changed since the copy (size, mtime or ctime moved):
    /// `owner`'s, or every live one. With `force` (a file range the request path just wrote),
    /// the slots of `owner` overlapping it are re-read whatever the timestamps say.
    fn recopy(&self, owner: Option<u64>, force: Option<(u64, u64)>) {
        let cands: Vec<(u64, u64, u64, u64, Arc<File>, CopySig)> = {
            let Ok(t) = self.table.lock() else { return };
            let pick = |m: &u64| {
                let p = t.live.get(m)?;
                let sig = p.copy?;
                Some((*m, p.owner, p.len, p.foffset, p.file.clone()?, sig))
            };
            match owner {
                Some(o) => match t.by_owner.get(&o) {
                    Some(set) => set.iter().filter_map(pick).collect(),
                    None => return,
                },
                None => t.live.keys().filter_map(pick).collect(),
            }
        };
        // One fstat per owner (its mappings all map the same inode), not one per copy.
        let mut sigs: HashMap<u64, Option<CopySig>> = HashMap::new();
        for (m, owner, len, foffset, f, sig) in cands {
            let forced = force.is_some_and(|(s, e)| s < foffset.saturating_add(len) && foffset < e);
            let now = *sigs.entry(owner).or_insert_with(|| CopySig::of(&f).ok());
            if !forced && now == Some(sig) {
                continue;
            }
            if force.is_some() && !forced {
                // The file moved because of the request path's own write, elsewhere: this
                // copy's bytes did not change (the request was checked against the file
                // just before it). Take the new timestamps without re-reading.
                if let (Some(now), Ok(mut t)) = (now, self.table.lock()) {
                    if let Some(p) = t.live.get_mut(&m) {
                        if p.copy == Some(sig)
                            && p.file.as_ref().is_some_and(|x| Arc::ptr_eq(x, &f))
                        {
                            p.copy = Some(now);
                        }
                    }
                }
                continue;
            }
            let Ok((gen, taken)) = self.claim(m, m + len) else {
                continue;
            };
            let mut placed = None;
            for (s, mut p) in taken {
                let same = s == m
                    && p.copy.is_some()
                    && p.file.as_ref().is_some_and(|x| Arc::ptr_eq(x, &f));
                if same && placed.is_none() {
                    match self.fill_slot(m, p.len, &f, p.foffset) {
                        Ok(sig) => {
                            p.copy = Some(sig);
                            self.counters.recopied.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => log::error!("refreshing DAX copy slot {m:#x}: {e}"),
                    }
                    placed = Some(p);
                } else if s == m && placed.is_none() {
                    // Re-placed meanwhile: put it back as it is.
                    placed = Some(p);
                } else {
                    self.unplace(s, &p);
                    self.unreserve(gen, p.regions);
                }
            }
            self.release(gen, m, placed, 0);
        }
    }

    /// Shadows of `owner`'s mappings.
    fn shadows_of(&self, owner: u64) -> Vec<SharedShadow> {
        let Ok(t) = self.table.lock() else {
            return Vec::new();
        };
        let mut out: Vec<SharedShadow> = Vec::new();
        if let Some(set) = t.by_owner.get(&owner) {
            for m in set {
                if let Some(s) = t.live.get(m).and_then(|p| p.shadow.clone()) {
                    if !out.iter().any(|o| Arc::ptr_eq(o, &s)) {
                        out.push(s);
                    }
                }
            }
        }
        out
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
            let end = self.check_range(moffset, len)?;
            if foffset % MAP_ALIGNMENT != 0 || foffset.checked_add(len).is_none() {
                return Err(einval("file offset not page aligned or overflowing"));
            }
            self.note_guest_range(moffset, len);
            let st = crate::sys::fstat(fd)?;
            let rw = fd_writable(fd);
            let exec = st.st_mode & 0o111 != 0;
            if writable && !rw {
                log::warn!("DAX: writable mapping asked with a read-only descriptor");
                return Err(io::Error::from_raw_os_error(libc::EACCES));
            }
            let source = File::from(fd.try_clone_to_owned()?);
            let (plan, keep) = if writable {
                (Plan::Direct, None)
            } else if !rw {
                self.log_snapshot(&st, "it cannot be opened read-write");
                (Plan::Snapshot, None)
            } else if exec {
                // Keep no writable descriptor: the host may run the file meanwhile.
                let ro = self.reopen_read_only(fd).map(Arc::new);
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
            let file = match keep {
                Some(k) => k,
                None => Some(source.clone()),
            };
            if self.use_pool() {
                let (gen, taken, parked) = self.claim_parked(moffset, end, true)?;
                let mut freed = 0;
                if !taken.is_empty() {
                    self.counters.upgrades.fetch_add(1, Ordering::Relaxed);
                }
                for (s, p) in &taken {
                    self.unplace(*s, p);
                    freed += p.regions;
                }
                // Parked copy slots from before the window turned pooled.
                for (s, l) in parked {
                    self.drop_parked(gen, s, l);
                }
                self.unreserve(gen, freed);
                let placed = match self.place_pooled(
                    gen,
                    owner,
                    moffset,
                    len,
                    file.clone(),
                    &source,
                    foffset,
                    writable,
                ) {
                    Ok(Some(p)) => Ok(p),
                    Ok(None) => self.place(
                        gen,
                        owner,
                        moffset,
                        len,
                        file,
                        &source,
                        (st.st_dev, st.st_ino),
                        foffset,
                        writable,
                        if plan == Plan::Copy {
                            Plan::Direct
                        } else {
                            plan
                        },
                    ),
                    Err(e) => Err(e),
                };
                return match placed {
                    Ok(p) => {
                        self.release(gen, moffset, Some(p), 0);
                        self.counters.maps.fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    }
                    Err(e) => {
                        self.release(gen, moffset, None, 0);
                        Err(e)
                    }
                };
            }
            let (gen, taken, parked) = self.claim_parked(moffset, end, true)?;
            let mut freed = 0;
            if !taken.is_empty() {
                self.counters.upgrades.fetch_add(1, Ordering::Relaxed);
            }
            // A copy slot already in the frontend at exactly this range (parked, or a live
            // copy the guest maps again) is refilled in place: no frontend round trip.
            let mut reuse = false;
            for (s, p) in &taken {
                if plan == Plan::Copy && !reuse && *s == moffset && p.len == len && p.copy.is_some()
                {
                    reuse = true;
                    self.counters.unmaps.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                self.unplace(*s, p);
                freed += p.regions;
            }
            drop(taken);
            for (s, l) in parked {
                if plan == Plan::Copy && !reuse && s == moffset && l == len {
                    reuse = true;
                    continue;
                }
                // Anything else there (a writable or direct mapping, another extent) needs
                // the parked slot out of the frontend first.
                self.drop_parked(gen, s, l);
            }
            self.unreserve(gen, freed);
            let placed = if reuse {
                match self.fill_slot(moffset, len, &source, foffset) {
                    Ok(sig) => {
                        self.counters.reused.fetch_add(1, Ordering::Relaxed);
                        Ok(Placed::copy_slot(owner, len, foffset, file, sig))
                    }
                    Err(e) => {
                        // The slot stays in the frontend: park it again.
                        self.release_parking(gen, moffset, 0, &[(moffset, len)]);
                        return Err(e);
                    }
                }
            } else {
                self.place(
                    gen,
                    owner,
                    moffset,
                    len,
                    file,
                    &source,
                    (st.st_dev, st.st_ino),
                    foffset,
                    writable,
                    plan,
                )
            };
            match placed {
                Ok(p) => {
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

    fn sync(&self, owner: u64) {
        if !self.owners.has(owner) {
            return;
        }
        for s in self.shadows_of(owner) {
            self.sync_shadow(&s);
        }
        self.sync_pooled(Some(owner));
        self.relayout(owner);
        self.recopy(Some(owner), None);
    }

    fn refresh(&self, owner: u64) {
        if !self.owners.has(owner) {
            return;
        }
        self.relayout(owner);
        for s in self.shadows_of(owner) {
            self.sync_shadow(&s);
        }
        self.sync_pooled(Some(owner));
        self.recopy(Some(owner), None);
    }

    fn shrinking(&self, owner: u64, size: u64) {
        self.shrink_owner(owner, size);
    }

    fn revalidate(&self, owner: u64) {
        if self.owners.has(owner) {
            self.recopy(Some(owner), None);
        }
    }

    fn written(&self, owner: u64, offset: u64, len: u64) {
        if self.owners.has(owner) {
            self.sync_pooled(Some(owner));
            self.recopy(Some(owner), Some((offset, offset.saturating_add(len))));
        }
    }

    fn sync_all(&self) {
        let all: Vec<SharedShadow> = {
            let reg = self.shadows.lock().unwrap_or_else(|e| e.into_inner());
            reg.values().filter_map(Weak::upgrade).collect()
        };
        for s in all {
            self.sync_shadow(&s);
        }
        self.sync_pooled(None);
        self.recopy(None, None);
    }

    fn end_session(&self) {
        // DESTROY or a new INIT: the frontend still has the mappings unless the device was
        // reset (then `stop` already emptied the table, or QEMU refuses the unmaps, which
        // `unplace` tolerates).
        // While paused, `unplace` keeps them as orphans, unmapped once the device runs.
        let (live, parked, pool) = self.drain(false);
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

impl BackendChannel for DaxWindow<Backend> {
    fn set_channel(&self, backend: Backend) {
        log::info!("backend request channel ready: {}", self.describe());
        self.set_sink(backend);
    }

    fn device_started(&self) {
        self.start();
    }

    fn device_paused(&self) {
        // `stop`/`cont` (vhost_dev_stop/start) leave QEMU's SHMEM mappings in place: keep
        // the table as it is and send nothing until the device starts again. No lock taken.
        self.pause();
    }

    fn device_reset(&self) {
        self.stop();
    }

    fn window_size(&self) -> u64 {
        self.size
    }

    fn round_trips_in_flight(&self) -> usize {
        self.table.lock().map(|t| t.busy.len()).unwrap_or(0)
    }

    fn memory_regions(&self, n: usize, window_regions: usize) {
        self.note_table_regions(n, window_regions);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileExt;

    #[derive(Default)]
    struct Rec {
        calls: Mutex<Vec<String>>,
        fail_map: AtomicBool,
        /// Descriptors of live maps by window offset (what the frontend would map).
        fds: Mutex<HashMap<u64, File>>,
        /// Held by a test to delay every reply.
        gate: Mutex<()>,
        /// Held by a test to delay the replies to maps that do not start a 2 MiB range
        /// (shadow tails).
        tail_gate: Mutex<()>,
        /// File offsets of live maps by window offset.
        foffs: Mutex<HashMap<u64, u64>>,
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
            drop(self.gate.lock().unwrap());
            if moffset % MB2 != 0 {
                drop(self.tail_gate.lock().unwrap());
            }
            if self.fail_map.load(Ordering::SeqCst) {
                return Err(io::Error::other("frontend said no"));
            }
            self.fds
                .lock()
                .unwrap()
                .insert(moffset, File::from(_fd.try_clone_to_owned().unwrap()));
            self.foffs.lock().unwrap().insert(moffset, foffset);
            let w = if writable { "rw" } else { "ro" };
            self.calls
                .lock()
                .unwrap()
                .push(format!("map {moffset:#x}+{len:#x}@{foffset:#x} {w}"));
            Ok(())
        }
        fn unmap(&self, moffset: u64, len: u64) -> io::Result<()> {
            drop(self.gate.lock().unwrap());
            self.fds.lock().unwrap().remove(&moffset);
            self.calls
                .lock()
                .unwrap()
                .push(format!("unmap {moffset:#x}+{len:#x}"));
            Ok(())
        }
    }

    /// QEMU 11.1 as it answers SHMEM requests: the ack at once, the commit (the vCPUs' new
    /// view of the window, then the backend's memory-table update) a moment later, from its
    /// main loop (`vhost_user_backend_handle_shmem_map` replies before
    /// `memory_region_transaction_commit`).
    #[derive(Default)]
    struct AckThenCommit {
        window: std::sync::OnceLock<std::sync::Weak<DaxWindow<Arc<AckThenCommit>>>>,
        acked: AtomicU64,
        /// Requests the guest can see (committed).
        visible: AtomicU64,
    }

    impl AckThenCommit {
        fn ack(self: &Arc<Self>) -> io::Result<()> {
            self.acked.fetch_add(1, Ordering::SeqCst);
            let me = Arc::clone(self);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                let n = me.visible.fetch_add(1, Ordering::SeqCst) + 1;
                if let Some(w) = me.window.get().and_then(std::sync::Weak::upgrade) {
                    // RAM plus the window's mappings; one of them a host file it mapped.
                    w.note_table_regions(1 + n as usize, 1);
                }
            });
            Ok(())
        }
    }

    impl WindowSink for Arc<AckThenCommit> {
        fn map(&self, _: u64, _: u64, _: BorrowedFd, _: u64, _: bool) -> io::Result<()> {
            self.ack()
        }
        fn unmap(&self, _: u64, _: u64) -> io::Result<()> {
            self.ack()
        }
    }

    #[test]
    fn a_mapping_is_answered_only_once_the_frontend_made_it_visible() {
        let q = Arc::new(AckThenCommit::default());
        let w = Arc::new(DaxWindow::new(8 * MB2).unwrap());
        q.window.set(Arc::downgrade(&w)).ok().unwrap();
        w.set_sink(q.clone());
        w.start();
        // The guest RAM at start-up.
        w.note_table_regions(1, 0);
        let f = tempfile::tempfile().unwrap();
        f.set_len(16 * MB2).unwrap();
        for i in 0..4 {
            // SETUPMAPPING, an upgrade (UNMAP + MAP), REMOVEMAPPING: the reply (the return)
            // must not reach the guest before the window change it answers is visible.
            w.map(1, i * MB2, MB2, f.as_fd(), i * MB2, false).unwrap();
            assert_eq!(
                q.visible.load(Ordering::SeqCst),
                q.acked.load(Ordering::SeqCst),
                "SETUPMAPPING answered before QEMU committed its SHMEM_MAP"
            );
            w.map(1, i * MB2, MB2, f.as_fd(), i * MB2, true).unwrap();
            assert_eq!(
                q.visible.load(Ordering::SeqCst),
                q.acked.load(Ordering::SeqCst),
                "upgrade answered before QEMU committed its SHMEM_UNMAP and SHMEM_MAP"
            );
            w.unmap(i * MB2, MB2).unwrap();
            assert_eq!(
                q.visible.load(Ordering::SeqCst),
                q.acked.load(Ordering::SeqCst),
                "REMOVEMAPPING answered before QEMU committed its SHMEM_UNMAP"
            );
        }
        assert_eq!(q.acked.load(Ordering::SeqCst), 16);
        assert!(w.stats().commit_waits >= 16);
    }

    /// A frontend that sends no memory-table update for SHMEM requests (the userspace driver)
    /// costs one probe, not a wait per request.
    #[test]
    fn a_frontend_without_table_updates_is_probed_once() {
        let (w, _rec, f) = window();
        w.note_table_regions(1, 0);
        let t = std::time::Instant::now();
        for i in 0..4 {
            w.map(1, i * MB2, MB2, f.as_fd(), i * MB2, true).unwrap();
            w.unmap(i * MB2, MB2).unwrap();
        }
        assert!(
            t.elapsed() < COMMIT_PROBE + Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(w.stats().commit_waits, 1);
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

    fn tmpfile_with(bytes: &[u8], mode: u32) -> File {
        use std::os::unix::fs::PermissionsExt;
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(bytes, 0).unwrap();
        f.set_permissions(std::fs::Permissions::from_mode(mode))
            .unwrap();
        f
    }

    /// Window bytes `[m, m+len)` as the frontend's mappings show them (every mapping here
    /// starts at offset 0 of its descriptor).
    fn window_read(rec: &Rec, m: u64, len: usize) -> Vec<u8> {
        let fds = rec.fds.lock().unwrap();
        let mut out = vec![0u8; len];
        for x in 0..len as u64 {
            let at = m + x;
            let (k, fd) = fds
                .iter()
                .filter(|(k, _)| **k <= at)
                .max_by_key(|(k, _)| **k)
                .expect("mapped");
            let mut b = [0u8; 1];
            fd.read_exact_at(&mut b, at - k).unwrap();
            out[x as usize] = b[0];
        }
        out
    }

    fn mapped_bytes(rec: &Rec, moffset: u64, len: usize) -> Vec<u8> {
        let fds = rec.fds.lock().unwrap();
        let mut v = vec![0u8; len];
        fds[&moffset].read_exact_at(&mut v, 0).unwrap();
        v
    }

    #[test]
    fn executables_are_mapped_from_a_snapshot_without_a_writable_descriptor() {
        let (w, rec, _) = window();
        let f = tmpfile_with(&[7u8; 10000], 0o755);
        w.map(7, 0, MB2, f.as_fd(), 0, false).unwrap();
        assert_eq!(calls(&rec), vec!["map 0x0+0x200000@0x0 ro"]);
        assert_eq!(w.stats().snapshots, 1);
        assert_eq!(mapped_bytes(&rec, 0, 10000), vec![7u8; 10000]);
        assert_eq!(mapped_bytes(&rec, 0, 10001)[10000], 0, "zero padded");
        // No descriptor of the file is kept by the window (no /proc/self/fd given).
        let t = w.table.lock().unwrap();
        assert!(t.live[&0].file.is_none());
        drop(t);
        // With /proc/self/fd, a read-only one, which follows host changes at sync points.
        let w2: DaxWindow<Arc<Rec>> = DaxWindow::new(8 * MB2).unwrap();
        let rec2 = Arc::new(Rec::default());
        w2.set_sink(rec2.clone());
        w2.start();
        w2.set_proc_self_fd(
            crate::sys::open(c"/proc/self/fd", libc::O_PATH | libc::O_DIRECTORY, 0).unwrap(),
        );
        w2.map(5, 0, MB2, f.as_fd(), 0, false).unwrap();
        {
            let t = w2.table.lock().unwrap();
            let kept = t.live[&0].file.as_ref().expect("a read-only descriptor");
            assert!(!fd_writable(kept.as_fd()));
        }
        f.write_all_at(b"new", 0).unwrap();
        w2.sync(5);
        assert_eq!(&mapped_bytes(&rec2, 0, 3), b"new");
        // A writable mapping of it maps the file itself.
        w.map(7, 0, MB2, f.as_fd(), 0, true).unwrap();
        assert_eq!(
            calls(&rec),
            vec![
                "unmap 0x0+0x200000",
                "map 0x0+0x2000@0x0 rw",
                "map 0x2000+0x1fe000@0x0 rw"
            ]
        );
    }

    #[test]
    fn read_only_descriptors_get_a_snapshot_kept_coherent() {
        let (w, rec, _) = window();
        let path = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(path.path(), [1u8; 5000]).unwrap();
        let ro = File::open(path.path()).unwrap();
        w.map(9, 0, MB2, ro.as_fd(), 0, false).unwrap();
        assert_eq!(calls(&rec), vec!["map 0x0+0x200000@0x0 ro"]);
        // A writable mapping needs a writable descriptor.
        let e = w.map(9, MB2, MB2, ro.as_fd(), 0, true).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EACCES));
        // The host changes the file: the next sync point shows it to the guest.
        let rw = std::fs::OpenOptions::new()
            .write(true)
            .open(path.path())
            .unwrap();
        rw.write_all_at(&[2u8; 100], 4000).unwrap();
        w.sync(9);
        let got = mapped_bytes(&rec, 0, 5000);
        assert_eq!(
            &got[3999..4101],
            &[&[1u8][..], &[2u8; 100], &[1u8]].concat()[..]
        );
    }

    #[test]
    fn aliases_share_one_tail() {
        let (w, rec, _) = window();
        let path = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(path.path(), b"hello world").unwrap();
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path.path())
                .unwrap()
        };
        let (a, b) = (open(), open());
        // Two inodes (a bind mount alias) map the same host range at two window offsets.
        w.map(1, 0, MB2, a.as_fd(), 0, true).unwrap();
        w.map(2, MB2, MB2, b.as_fd(), 0, true).unwrap();
        calls(&rec);
        let fds = rec.fds.lock().unwrap();
        fds[&0].write_all_at(b"HELLO", 0).unwrap();
        let mut via_b = [0u8; 5];
        fds[&MB2].read_exact_at(&mut via_b, 0).unwrap();
        assert_eq!(&via_b, b"HELLO", "one memfd behind both mappings");
        drop(fds);
        // Writing back through either inode writes the bytes once; the other has no stale
        // copy to overwrite them with.
        w.sync(2);
        w.sync(1);
        assert_eq!(std::fs::read(path.path()).unwrap(), b"HELLO world");
        assert_eq!(w.stats().written_back, 5);
    }

    #[test]
    fn size_changes_replace_only_when_the_page_layout_changes() {
        let (w, rec, f) = window();
        f.set_len(100).unwrap();
        w.map(7, 0, MB2, f.as_fd(), 0, true).unwrap();
        calls(&rec);
        // Growth inside the last page: the tail is updated in place, nothing re-placed.
        f.write_all_at(b"grown", 100).unwrap();
        w.refresh(7);
        w.sync(7);
        assert!(
            calls(&rec).is_empty(),
            "no unmap/map for an unchanged layout"
        );
        assert_eq!(&mapped_bytes(&rec, 0, 105)[100..], b"grown");
        // Growth past the page: re-placed once.
        f.set_len(3 * 4096).unwrap();
        w.sync(7);
        assert_eq!(
            calls(&rec),
            vec![
                "unmap 0x0+0x200000",
                "map 0x0+0x3000@0x0 rw",
                "map 0x3000+0x1fd000@0x0 rw"
            ]
        );
        assert_eq!(w.stats().replaced, 1);
    }

    #[test]
    fn the_budget_folds_tails_into_one_mapping_per_range() {
        // 8 ranges, room for 10 frontend mappings: small files need 2 each, so most fold.
        let w: DaxWindow<Arc<Rec>> = DaxWindow::with_budget(8 * MB2, 10).unwrap();
        let rec = Arc::new(Rec::default());
        w.set_sink(rec.clone());
        w.start();
        let files: Vec<File> = (0..8)
            .map(|i| tmpfile_with(&vec![i as u8; 5000], 0o644))
            .collect();
        for (i, f) in files.iter().enumerate() {
            w.map(i as u64, i as u64 * MB2, MB2, f.as_fd(), 0, true)
                .unwrap();
        }
        let s = w.stats();
        assert!(s.peak_regions <= 10, "{s}");
        assert!(s.merged > 0, "{s}");
        assert_eq!(s.mapped_bytes, 8 * MB2);
        // Every range shows its file's bytes, zero padded.
        for (i, _) in files.iter().enumerate() {
            let m = i as u64 * MB2;
            let mut want = vec![i as u8; 5000];
            want.resize(8192, 0);
            assert_eq!(window_read(&rec, m, 8192), want, "range {i}");
        }
        // A hostile guest mapping 4 KiB pieces runs into the budget and gets ENOSPC.
        let w2: DaxWindow<Arc<Rec>> = DaxWindow::with_budget(2 * MB2, 2).unwrap();
        w2.set_sink(Arc::new(Rec::default()));
        w2.start();
        let f = tmpfile_with(&[0u8; 8192], 0o644);
        w2.map(1, 0, 4096, f.as_fd(), 0, false).unwrap();
        w2.map(1, 4096, 4096, f.as_fd(), 0, false).unwrap();
        let e = w2.map(1, 8192, 4096, f.as_fd(), 0, false).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
    }

    #[test]
    fn smaller_guest_ranges_past_the_budget_go_to_the_pool() {
        // 4 MiB window, room for 2 frontend mappings: 2 ranges of 2 MiB at first.
        let w: DaxWindow<Arc<Rec>> = DaxWindow::with_budget(2 * MB2, 2).unwrap();
        let rec = Arc::new(Rec::default());
        w.set_sink(rec.clone());
        w.start();
        assert_eq!((w.ranges(), w.budget(), w.pooled()), (2, 2, false));
        let f = tmpfile_with(&vec![7u8; 4 << 20], 0o644);
        // A guest mounted with dax_range=512k maps 8 ranges of 512 KiB: more than the budget,
        // so the window becomes one pooled mapping and every range fits.
        let r = 512 << 10;
        for i in 0..8 {
            w.map(1, i * r, r, f.as_fd(), i * r, i % 2 == 1).unwrap();
        }
        assert_eq!((w.ranges(), w.budget(), w.pooled()), (8, 2, true));
        assert_eq!(calls(&rec), vec!["map 0x0+0x400000@0x0 rw"]);
        assert_eq!(w.stats().peak_regions, 1, "{}", w.stats());
        assert_eq!(frontend_read(&rec, 0, 4 << 20), vec![7u8; 4 << 20]);
        // Below MIN_GUEST_RANGE, or unaligned, the ranges stay 2 MiB: a hostile guest's
        // 4 KiB pieces run into the budget (ENOSPC), they cannot grow the frontend's map.
        let w2: DaxWindow<Arc<Rec>> = DaxWindow::with_budget(2 * MB2, 2).unwrap();
        w2.set_sink(Arc::new(Rec::default()));
        w2.start();
        w2.map(1, 0, 4096, f.as_fd(), 0, false).unwrap();
        w2.map(
            1,
            3 * MIN_GUEST_RANGE,
            MIN_GUEST_RANGE * 2,
            f.as_fd(),
            0,
            false,
        )
        .unwrap();
        assert_eq!((w2.ranges(), w2.budget()), (2, 2));
        let e = w2.map(1, MB2, 4096, f.as_fd(), 0, false).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
    }

    #[test]
    fn pooled_mode_sends_one_shmem_request_however_the_guest_maps() {
        // 8 ranges, well within the budget: direct would send a SHMEM request per guest map
        // and unmap (QEMU 11.1.3 crashes on one it reads after a `stop` began); pooled sends
        // the pool's one map, and the guest still reads the file's bytes.
        let w: DaxWindow<Arc<Rec>> = DaxWindow::new(8 * MB2).unwrap();
        w.set_map_mode(mode::MapMode::Pooled);
        let rec = Arc::new(Rec::default());
        w.set_sink(rec.clone());
        w.start();
        assert!(w.pooled());
        let f = data_file(7, 3 * MB2 as usize);
        for _ in 0..3 {
            for i in 0..8u64 {
                w.map(i, i * MB2, MB2, f.as_fd(), (i % 3) * MB2, i % 2 == 0)
                    .unwrap();
            }
            for i in 0..8u64 {
                w.unmap(i * MB2, MB2).unwrap();
            }
        }
        w.map(9, 5 * MB2, MB2, f.as_fd(), MB2, false).unwrap();
        assert_eq!(calls(&rec), vec!["map 0x0+0x1000000@0x0 rw"]);
        assert!(pool_read(&rec, 5 * MB2, 4096).iter().all(|&b| b == 7));
        let s = w.stats();
        assert_eq!((s.pooled, s.peak_regions, s.failures), (25, 1, 0), "{s}");
        w.set_map_mode(mode::MapMode::Direct);
        assert!(
            w.pooled(),
            "the pool stays for the session once it is in the frontend"
        );
    }

    #[test]
    fn a_window_with_more_ranges_than_the_budget_is_one_pooled_mapping() {
        // 16 ranges, room for 4 frontend mappings: a guest that maps all 16 (half of them
        // writable, of files shorter than a range) is never refused and the frontend holds
        // one mapping.
        let w: DaxWindow<Arc<Rec>> = DaxWindow::with_budget(16 * MB2, 4).unwrap();
        let rec = Arc::new(Rec::default());
        w.set_sink(rec.clone());
        w.start();
        assert!(w.pooled());
        let files: Vec<File> = (0..16).map(|i| data_file(i as u8 + 1, 5000)).collect();
        for (i, f) in files.iter().enumerate() {
            w.map(i as u64, i as u64 * MB2, MB2, f.as_fd(), 0, i % 2 == 1)
                .unwrap();
        }
        assert_eq!(calls(&rec), vec!["map 0x0+0x2000000@0x0 rw"]);
        let s = w.stats();
        assert_eq!((s.pooled, s.peak_regions, s.failures), (16, 1, 0), "{s}");
        for i in 0..16u64 {
            let got = pool_read(&rec, i * MB2, 8192);
            assert!(got[..5000].iter().all(|&b| b == i as u8 + 1), "range {i}");
            assert!(got[5000..].iter().all(|&b| b == 0), "range {i} zero padded");
        }
        // The guest stores into a writable range; the host writes elsewhere in the file: the
        // next sync point writes the guest's run and shows the host's bytes.
        let pool = rec.fds.lock().unwrap()[&0].try_clone().unwrap();
        pool.write_all_at(b"GUEST", MB2 + 10).unwrap();
        files[1].write_all_at(b"HOST", 100).unwrap();
        w.sync(1);
        let mut got = [0u8; 5];
        files[1].read_exact_at(&mut got, 10).unwrap();
        assert_eq!(&got, b"GUEST");
        assert_eq!(&pool_read(&rec, MB2 + 100, 4), b"HOST");
        assert_eq!(files[1].metadata().unwrap().len(), 5000, "never extended");
        // A read-only range follows the file at sync points and never writes it back.
        pool.write_all_at(b"X", 0).unwrap();
        files[0].write_all_at(b"NEW", 0).unwrap();
        w.sync(0);
        assert_eq!(&pool_read(&rec, 0, 3), b"NEW");
        // An upgrade stays in the pool; guest stores reach the file.
        w.map(0, 0, MB2, files[0].as_fd(), 0, true).unwrap();
        pool.write_all_at(b"up", 3).unwrap();
        w.unmap(0, MB2).unwrap();
        let mut got = [0u8; 5];
        files[0].read_exact_at(&mut got, 0).unwrap();
        assert_eq!(&got, b"NEWup");
        assert!(
            calls(&rec).is_empty(),
            "nothing sent for maps, upgrades, unmaps"
        );
        assert_eq!(pool_read(&rec, 0, 8), vec![0u8; 8], "freed");
        // A reset drops the pool (the frontend did) after writing back; the next map puts
        // it back. DESTROY unmaps it.
        pool.write_all_at(b"Z", 3 * MB2).unwrap();
        w.stop();
        let mut got = [0u8; 1];
        files[3].read_exact_at(&mut got, 0).unwrap();
        assert_eq!(&got, b"Z", "written back at the reset");
        w.start();
        w.map(3, 0, MB2, files[3].as_fd(), 0, false).unwrap();
        w.end_session();
        assert_eq!(
            calls(&rec),
            vec!["map 0x0+0x2000000@0x0 rw", "unmap 0x0+0x2000000"]
        );
    }

    #[test]
    fn a_reset_during_the_pools_map_drops_it_and_maps_it_again() {
        let w: DaxWindow<Arc<Rec>> = DaxWindow::with_budget(8 * MB2, 2).unwrap();
        let w = Arc::new(w);
        let rec = Arc::new(Rec::default());
        w.set_sink(rec.clone());
        w.start();
        let f = data_file(4, MB2 as usize);
        let gate = rec.gate.lock().unwrap();
        let (w2, fd) = (w.clone(), f.try_clone().unwrap());
        let t = std::thread::spawn(move || w2.map(1, 0, MB2, fd.as_fd(), 0, false));
        std::thread::sleep(Duration::from_millis(100));
        let started = std::time::Instant::now();
        w.stop();
        assert!(started.elapsed() < Duration::from_secs(1), "reset waited");
        drop(gate);
        assert!(t.join().unwrap().is_err(), "the map raced a reset");
        w.start();
        w.map(1, MB2, MB2, f.as_fd(), 0, false).unwrap();
        assert_eq!(
            calls(&rec),
            vec![
                "map 0x0+0x1000000@0x0 rw",
                "unmap 0x0+0x1000000",
                "map 0x0+0x1000000@0x0 rw"
            ],
            "the pool the frontend may have kept is taken out before it is mapped again"
        );
        assert_eq!(pool_read(&rec, MB2, 4), vec![4u8; 4]);
        let s = w.stats();
        assert_eq!((s.regions, s.mapped_bytes), (1, MB2), "{s}");
    }

    #[test]
    fn a_reset_does_not_wait_for_a_tail_mapping_in_flight() {
        // Issue #20 c: a shadow's mutex held across the tail's SHMEM_MAP round trip while
        // the reset writes that shadow back.
        let (w, rec, _) = window();
        let w = Arc::new(w);
        let path = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(path.path(), [5u8; 5000]).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path.path())
            .unwrap();
        // A live mapping with a tail, then another mapping of the same range (same shadow)
        // whose tail reply the frontend holds back.
        w.map(7, MB2, MB2, f.as_fd(), 0, true).unwrap();
        let gate = rec.tail_gate.lock().unwrap();
        let (w2, fd) = (w.clone(), f.try_clone().unwrap());
        let t = std::thread::spawn(move || w2.map(8, 0, MB2, fd.as_fd(), 0, true));
        std::thread::sleep(Duration::from_millis(200));
        let (tx, rx) = std::sync::mpsc::channel();
        let w3 = w.clone();
        let r = std::thread::spawn(move || {
            w3.stop();
            tx.send(()).unwrap();
        });
        let done = rx.recv_timeout(Duration::from_secs(2));
        drop(gate);
        r.join().unwrap();
        let _ = t.join().unwrap();
        assert!(
            done.is_ok(),
            "the reset waited for the frontend's tail reply"
        );
    }

    #[test]
    fn a_failed_setattr_that_shrank_the_file_still_replaces_its_mappings() {
        // Issue #20 a: a SETATTR that truncates and then fails (an invalid mtime after the
        // size) leaves whole-page file mappings past the new EOF unless the mappings are
        // re-placed whatever the result.
        use crate::filesystem::{Context, FileSystem, Handle, Inode};
        struct TruncatesThenFails(File);
        impl FileSystem for TruncatesThenFails {
            fn setattr(
                &self,
                _: &Context,
                _: Inode,
                _: &crate::abi::SetattrIn,
                _: Option<Handle>,
            ) -> io::Result<(crate::abi::Attr, Duration)> {
                self.0.set_len(0)?;
                Err(io::Error::from_raw_os_error(libc::EINVAL))
            }
        }
        let (w, rec, f) = window();
        let w = Arc::new(w);
        w.map(7, 0, MB2, f.as_fd(), 0, true).unwrap();
        calls(&rec);
        let fs = coherent::Coherent::new(TruncatesThenFails(f.try_clone().unwrap()), w.clone());
        let ctx = Context {
            uid: 0,
            gid: 0,
            pid: 0,
        };
        let e = fs
            .setattr(&ctx, 7, &crate::abi::SetattrIn::default(), None)
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        assert_eq!(
            calls(&rec),
            vec!["unmap 0x0+0x200000", "map 0x0+0x200000@0x0 rw"],
            "the file's pages leave the window; the range is a shadow of the empty file"
        );
    }

    #[test]
    fn a_grown_shadow_holds_the_files_bytes() {
        // Issue #20 e: a longer mapping of a shadowed range grows the shadow; the grown part
        // must hold the file's bytes, not zeros.
        let (w, rec, _) = window();
        let path = tempfile::NamedTempFile::new().unwrap();
        let bytes: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(path.path(), &bytes).unwrap();
        let ro = File::open(path.path()).unwrap();
        w.map(9, 0, 4096, ro.as_fd(), 0, false).unwrap();
        w.map(9, MB2, 4 * 4096, ro.as_fd(), 0, false).unwrap();
        assert_eq!(mapped_bytes(&rec, MB2, 3 * 4096), bytes);
        w.sync(9);
        assert_eq!(mapped_bytes(&rec, MB2, 3 * 4096), bytes);
        assert_eq!(std::fs::read(path.path()).unwrap(), bytes);
    }

    #[test]
    fn reset_and_pause_never_wait_for_a_frontend_round_trip() {
        let (w, rec, f) = window();
        let w = Arc::new(w);
        let gate = rec.gate.lock().unwrap();
        // A SETUPMAPPING whose SHMEM_MAP reply is held back by the frontend.
        let w2 = w.clone();
        let fd = f.try_clone().unwrap();
        let t = std::thread::spawn(move || w2.map(7, 0, MB2, fd.as_fd(), 0, false));
        std::thread::sleep(Duration::from_millis(50));
        let started = std::time::Instant::now();
        w.device_paused_for_test();
        w.stop();
        w.sync(8);
        w.sync_all();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "pause/reset waited for the frontend"
        );
        drop(gate);
        let _ = t.join().unwrap();
        assert_eq!(
            w.stats().mapped_bytes,
            0,
            "nothing published across the reset"
        );
        // The frontend may have applied that map after its reset: it is unmapped before the
        // range is used again.
        calls(&rec);
        w.start();
        w.map(7, 0, MB2, f.as_fd(), 0, false).unwrap();
        assert_eq!(
            calls(&rec),
            vec!["unmap 0x0+0x200000", "map 0x0+0x200000@0x0 ro"]
        );
    }

    #[test]
    fn an_unmap_while_paused_is_sent_once_the_device_runs() {
        let (w, rec, f) = window();
        w.map(7, 0, MB2, f.as_fd(), 0, false).unwrap();
        calls(&rec);
        // stop/cont keeps QEMU's mappings: a removal that completes while paused is not
        // sent then, and not forgotten either.
        w.pause();
        w.unmap(0, MB2).unwrap();
        assert!(calls(&rec).is_empty());
        w.start();
        w.map(7, 0, MB2, f.as_fd(), 0, true).unwrap();
        assert_eq!(
            calls(&rec),
            vec!["unmap 0x0+0x200000", "map 0x0+0x200000@0x0 rw"]
        );
        // DESTROY sends the pending ones too.
        w.map(7, MB2, MB2, f.as_fd(), 0, false).unwrap();
        w.pause();
        w.unmap(MB2, MB2).unwrap();
        w.start();
        calls(&rec);
        w.end_session();
        let mut got = calls(&rec);
        got.sort();
        assert_eq!(got, vec!["unmap 0x0+0x200000", "unmap 0x200000+0x200000"]);
    }

    /// Window bytes `[m, m+len)` as the pool (the frontend mapping at 0) shows them.
    fn pool_read(rec: &Rec, m: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        rec.fds.lock().unwrap()[&0]
            .read_exact_at(&mut v, m)
            .unwrap();
        v
    }

    /// Window bytes `[m, m+len)` of the frontend mapping that starts at `m`, at its file
    /// offset.
    fn frontend_read(rec: &Rec, m: u64, len: usize) -> Vec<u8> {
        let fds = rec.fds.lock().unwrap();
        let at = rec.foffs.lock().unwrap()[&m];
        let mut v = vec![0u8; len];
        fds[&m].read_exact_at(&mut v, at).unwrap();
        v
    }

    fn copy_window(mode: CopyMode, ranges: u64, budget: usize) -> (DaxWindow<Arc<Rec>>, Arc<Rec>) {
        let w = DaxWindow::with_budget(ranges * MB2, budget).unwrap();
        let rec = Arc::new(Rec::default());
        w.set_sink(rec.clone());
        w.set_copy_mode(mode);
        w.start();
        (w, rec)
    }

    fn data_file(fill: u8, len: usize) -> File {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(&vec![fill; len], 0).unwrap();
        f
    }

    #[test]
    fn copy_slots_park_and_refill_without_a_round_trip() {
        let (w, rec) = copy_window(CopyMode::Always, 8, DEFAULT_MAP_BUDGET);
        let a = data_file(1, 3 * MB2 as usize);
        let b = data_file(2, 3 * MB2 as usize);
        w.map(7, MB2, MB2, a.as_fd(), MB2, false).unwrap();
        assert_eq!(
            calls(&rec),
            vec!["map 0x200000+0x200000@0x200000 ro"],
            "slot offset = window offset"
        );
        assert_eq!(frontend_read(&rec, MB2, 4096), vec![1u8; 4096]);
        // REMOVEMAPPING parks it: nothing sent.
        w.unmap(MB2, MB2).unwrap();
        assert!(calls(&rec).is_empty());
        let s = w.stats();
        assert_eq!((s.parked, s.regions, s.mapped_bytes), (1, 1, 0), "{s}");
        // Another file's read-only range at the same window offset: refilled in place.
        w.map(9, MB2, MB2, b.as_fd(), 0, false).unwrap();
        assert!(calls(&rec).is_empty(), "no SHMEM request for a parked slot");
        assert_eq!(
            frontend_read(&rec, MB2, MB2 as usize),
            vec![2u8; MB2 as usize]
        );
        let s = w.stats();
        assert_eq!((s.copies, s.reused, s.parked, s.maps), (1, 1, 0, 2), "{s}");
        // A parked slot of another extent is unmapped before a map over it.
        w.unmap(MB2, MB2).unwrap();
        w.map(9, MB2, 4096, b.as_fd(), 0, false).unwrap();
        assert_eq!(
            calls(&rec),
            vec!["unmap 0x200000+0x200000", "map 0x200000+0x1000@0x200000 ro"]
        );
        // A device reset forgets parked slots (the frontend dropped them).
        w.unmap(MB2, 4096).unwrap();
        w.stop();
        w.start();
        assert_eq!((w.stats().parked, w.stats().regions), (0, 0));
        w.map(9, MB2, MB2, b.as_fd(), 0, false).unwrap();
        assert_eq!(calls(&rec), vec!["map 0x200000+0x200000@0x200000 ro"]);
        // DESTROY unmaps parked slots.
        w.unmap(MB2, MB2).unwrap();
        w.end_session();
        assert_eq!(calls(&rec), vec!["unmap 0x200000+0x200000"]);
    }

    #[test]
    fn an_upgrade_turns_a_copy_into_a_direct_mapping() {
        let (w, rec) = copy_window(CopyMode::Always, 8, DEFAULT_MAP_BUDGET);
        let f = data_file(3, MB2 as usize);
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
        // Stores reach the file.
        rec.fds.lock().unwrap()[&0]
            .write_all_at(b"store", 10)
            .unwrap();
        let mut got = [0u8; 5];
        f.read_exact_at(&mut got, 10).unwrap();
        assert_eq!(&got, b"store");
        // A writable map over a parked slot unmaps the slot first.
        w.map(7, MB2, MB2, f.as_fd(), 0, false).unwrap();
        w.unmap(MB2, MB2).unwrap();
        calls(&rec);
        w.map(7, MB2, MB2, f.as_fd(), 0, true).unwrap();
        assert_eq!(
            calls(&rec),
            vec!["unmap 0x200000+0x200000", "map 0x200000+0x200000@0x0 rw"]
        );
        assert_eq!(w.stats().parked, 0);
    }

    #[test]
    fn copies_follow_the_file_at_sync_points_and_zero_past_eof() {
        let (w, rec) = copy_window(CopyMode::Always, 8, DEFAULT_MAP_BUDGET);
        let f = data_file(4, 5000);
        w.map(7, 0, MB2, f.as_fd(), 0, false).unwrap();
        let got = frontend_read(&rec, 0, 8192);
        assert_eq!(&got[..5000], &[4u8; 5000][..]);
        assert!(got[5000..].iter().all(|&b| b == 0), "zeros past EOF");
        // A host write: seen at the next sync point (size moved).
        f.write_all_at(b"host", 5000).unwrap();
        w.sync(8);
        assert_eq!(
            &frontend_read(&rec, 0, 5004)[5000..],
            &[0u8; 4],
            "other inode"
        );
        w.sync(7);
        assert_eq!(&frontend_read(&rec, 0, 5004)[5000..], b"host");
        // A write through the request path is in the copy whatever the timestamps say.
        f.write_all_at(b"fuse", 0).unwrap();
        w.written(7, 0, 4);
        assert_eq!(&frontend_read(&rec, 0, 4), b"fuse");
        // A request-path write elsewhere in the file re-reads only the copies it overlaps.
        let big = data_file(1, 2 * MB2 as usize);
        w.map(9, 2 * MB2, MB2, big.as_fd(), 0, false).unwrap();
        w.map(9, 3 * MB2, MB2, big.as_fd(), MB2, false).unwrap();
        calls(&rec);
        let before = w.stats().recopied;
        big.write_all_at(b"x", MB2 + 5).unwrap();
        w.written(9, MB2 + 5, 1);
        w.refresh(9);
        w.sync(9);
        assert_eq!(
            w.stats().recopied,
            before + 1,
            "only the written range re-read"
        );
        assert_eq!(&frontend_read(&rec, 3 * MB2, 6)[5..], b"x");
        w.unmap(2 * MB2, 2 * MB2).unwrap();
        // Shrinking zeroes the rest; the periodic pass sees it too.
        f.set_len(2).unwrap();
        w.sync_all();
        assert_eq!(frontend_read(&rec, 0, 4), b"fu\0\0");
        assert!(w.stats().recopied >= 3, "{}", w.stats());
        assert!(calls(&rec).is_empty(), "refreshes send nothing");
    }

    #[test]
    fn the_budget_evicts_parked_slots_oldest_first() {
        // 4 ranges, room for 6 frontend mappings.
        let (w, rec) = copy_window(CopyMode::Always, 4, 6);
        let f = data_file(5, 4 * MB2 as usize);
        for i in 0..4 {
            w.map(7, i * MB2, MB2, f.as_fd(), i * MB2, false).unwrap();
        }
        for i in 0..4 {
            w.unmap(i * MB2, MB2).unwrap();
        }
        calls(&rec);
        assert_eq!((w.stats().parked, w.stats().regions), (4, 4));
        // A writable mapping of a short file needs 2 mappings plus one in reserve per free
        // range: parked slots make room, oldest first.
        let short = data_file(6, 5000);
        w.map(8, 0, MB2, short.as_fd(), 0, true).unwrap();
        assert_eq!(
            calls(&rec),
            vec![
                "unmap 0x0+0x200000",
                "unmap 0x200000+0x200000",
                "unmap 0x400000+0x200000",
                "map 0x0+0x1000@0x0 rw",
                "map 0x1000+0x1ff000@0x0 rw"
            ]
        );
        let s = w.stats();
        assert_eq!((s.parked, s.evicted, s.regions), (1, 2, 3), "{s}");
        assert!(s.peak_regions <= 6, "{s}");
    }

    #[test]
    fn auto_copies_only_while_the_window_churns() {
        let (w, rec) = copy_window(CopyMode::Auto, 8, DEFAULT_MAP_BUDGET);
        let f = data_file(7, 8 * MB2 as usize);
        w.map(7, 0, MB2, f.as_fd(), 0, false).unwrap();
        assert_eq!(calls(&rec), vec!["map 0x0+0x200000@0x0 ro"]);
        assert_eq!(w.stats().copies, 0, "a calm window maps the file");
        // An emptying window is not churn: the guest drops many ranges of a window with room
        // to spare (an evicted inode, dropped caches), then maps again.
        for i in 1..4 {
            w.map(7, i * MB2, MB2, f.as_fd(), i * MB2, false).unwrap();
        }
        for _ in 0..=copy::CHURN_PER_SECOND {
            for i in 0..4 {
                w.unmap(i * MB2, MB2).unwrap();
            }
            for i in 0..4 {
                w.map(7, i * MB2, MB2, f.as_fd(), i * MB2, false).unwrap();
            }
        }
        assert_eq!(w.stats().copies, 0, "half a window recycled: {}", w.stats());
        // A full window recycling one range is.
        for i in 4..8 {
            w.map(7, i * MB2, MB2, f.as_fd(), i * MB2, false).unwrap();
        }
        for _ in 0..=copy::CHURN_PER_SECOND {
            w.unmap(0, MB2).unwrap();
            w.map(7, 0, MB2, f.as_fd(), 0, false).unwrap();
        }
        assert!(w.stats().copies >= 1, "{}", w.stats());
        let before = rec.calls.lock().unwrap().len();
        w.unmap(0, MB2).unwrap();
        w.map(7, 0, MB2, f.as_fd(), 0, false).unwrap();
        assert_eq!(rec.calls.lock().unwrap().len(), before, "parked and reused");
        // Calm again (the rate window is 2 s): a map onto a parked slot still refills it
        // within CHURN_LINGER (another file too); a range with no parked slot maps the file.
        std::thread::sleep(Duration::from_millis(2100));
        let g = data_file(9, MB2 as usize);
        w.unmap(0, MB2).unwrap();
        w.map(8, 0, MB2, g.as_fd(), 0, false).unwrap();
        assert_eq!(
            rec.calls.lock().unwrap().len(),
            before,
            "refilled after the churn"
        );
        assert_eq!(window_read(&rec, 0, 4), vec![9u8; 4]);
        w.unmap(MB2, MB2).unwrap();
        w.map(7, MB2, MB2, f.as_fd(), MB2, false).unwrap();
        assert_eq!(
            calls(&rec)[before..],
            [
                "unmap 0x200000+0x200000",
                "map 0x200000+0x200000@0x200000 ro"
            ]
        );
        // Off never copies (the default of a window: today's behaviour).
        let (w, rec) = copy_window(CopyMode::Off, 8, DEFAULT_MAP_BUDGET);
        for _ in 0..=copy::CHURN_PER_SECOND {
            w.map(7, 0, MB2, f.as_fd(), 0, false).unwrap();
            w.unmap(0, MB2).unwrap();
        }
        assert_eq!(w.stats().copies, 0);
        assert_eq!(calls(&rec).len(), 2 * (copy::CHURN_PER_SECOND as usize + 1));
        assert_eq!(
            DaxWindow::<Arc<Rec>>::new(MB2).unwrap().copy_mode(),
            CopyMode::Off
        );
    }
}
