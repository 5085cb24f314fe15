//! The vhost-user transport: virtqueue descriptor chains in, FUSE requests to the server,
//! replies back into the chains.
//!
//! Queue 0 is the high-priority queue (FORGET), queues 1..=N are request queues; with a
//! negotiated notification queue ([`super::notify_queue`]) queue 1 is that one and the
//! request queues are 2..=N+1. Queue 0, the notification queue and the first request queue
//! share a worker thread, each further queue has its own (`thread_masks`), so a
//! multi-queue guest is served on several cores. Guest memory comes from the frontend's
//! memory table; every descriptor is resolved to host memory through `vm-memory`, which
//! bounds-checks it.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
    VhostUserShMemConfig, VhostUserVirtioFeatures,
};
use vhost::vhost_user::Backend;
use vhost_user_backend::bitmap::BitmapMmapRegion;
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use virtio_queue::QueueT;
use vm_memory::{
    ByteValued, Bytes, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap, VolatileSlice,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use super::notify_queue::{NotifyQueue, VIRTIO_FS_F_NOTIFICATION};
use crate::protocol::abi::{InHeader, OutHeader, VirtioFsConfig};
use crate::protocol::filesystem::FileSystem;
use crate::protocol::iobuf::{FarIo, Reader, Seg, Writer};
use crate::protocol::notify::{Notifier, NOTIFY_BUF_SIZE};
use crate::protocol::policy::Wait;
use crate::protocol::server::Server;
use crate::transport::vring_chain::{walk, ChainAt, Malformed, Split, WindowAt};

/// Bytes of a FUSE request header.
const IN_HEADER_LEN: usize = std::mem::size_of::<InHeader>();

/// Guest memory as the backend sees it: with a dirty-page bitmap that the frontend's log
/// (SET_LOG_BASE, during a live migration) replaces.
pub type GuestMemoryLogged = GuestMemoryMmap<BitmapMmapRegion>;
pub type GuestMem = GuestMemoryAtomic<GuestMemoryLogged>;
type FsVring = VringRwLock<GuestMem>;

/// Largest queue the frontend may set up.
pub const MAX_QUEUE_SIZE: usize = 1024;
/// Completions held back at most before the guest is notified.
const MAX_UNSIGNALLED: usize = 32;
/// Most request queues we serve (one worker thread each; the vring mask is 64 bits).
pub const MAX_REQUEST_QUEUES: usize = 63;
/// Most threads serving requests that may wait indefinitely (SETLKW), whatever the pool size.
const MAX_WAIT_THREADS: usize = 64;
/// Most threads serving requests that may take long (FSYNC, FLUSH, ...), whatever the pool
/// size: a budget of their own, never taken by lock waits.
const MAX_LONG_THREADS: usize = 64;
/// How long GET_VRING_BASE waits for the vring's requests in flight before reporting the
/// base anyway (a hung host file system must not hang the frontend for ever).
const STOP_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a queue thread looks for more requests before it sleeps in epoll (see [`Look`]).
/// Measured with `protobench` on an idle 2-core host: 4 KiB READ at depth 1 went from 19k to
/// 64k requests/s, depth 16 from 502k to 522k.
const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(30);
/// Most batches a queue thread goes without a look after looks that found nothing (see
/// [`Look`]).
const LOOK_BACKOFF_MAX: u32 = 32;
/// Requests the first request queue serves at most before it looks at the hiprio queue that
/// shares its thread (FORGETs must not wait for a request queue the guest keeps full).
const HIPRIO_EVERY: usize = 32;
/// How long GET_VRING_BASE waits when the requests left wait for the frontend itself.
const STOP_FRONTEND_GRACE: Duration = Duration::from_millis(200);

/// Receives the backend-request channel once the frontend sets it up (the DAX window).
pub trait BackendChannel: Send + Sync {
    fn set_channel(&self, backend: Backend);
    /// The guest started a vring (its first kick since start, pause or reset).
    fn device_started(&self);
    /// A vring is being stopped with GET_VRING_BASE (`stop` in the monitor, a snapshot, the
    /// source of a migration, or the first step of a guest reboot); called before its
    /// requests in flight are drained. The FUSE session goes on; send nothing until a vring
    /// starts again.
    fn device_paused(&self);
    /// The device was reset (RESET_DEVICE) or the frontend went away: forget the channel's
    /// state, send nothing more.
    fn device_reset(&self);
    /// Size of the shared-memory window, or 0.
    fn window_size(&self) -> u64;
    /// Requests waiting for the frontend's reply to a SHMEM_MAP/UNMAP. QEMU answers none
    /// while it waits for GET_VRING_BASE, so a vring stop must not wait for them.
    fn round_trips_in_flight(&self) -> usize {
        0
    }
    /// The frontend's memory table now holds `n` regions, `window_regions` of them host
    /// files the window mapped (a SHMEM mapping the frontend reports in the table).
    fn memory_regions(&self, _n: usize, _window_regions: usize) {}
    /// The window offset at which the window sent the frontend a mapping of `len` bytes of
    /// `file` from `foffset`, if it did (how a memory-table region is known to be the
    /// window's, and where the window is in guest-physical space).
    fn window_offset(&self, _file: &std::fs::File, _foffset: u64, _len: u64) -> Option<u64> {
        None
    }
    /// Fills `buf` with the window's bytes at `moffset`, read from what backs them (never
    /// through a mapping); EIO where nothing live is mapped.
    fn read_window(&self, _moffset: u64, _buf: &mut [u8]) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EIO))
    }
    /// Stores `data` at window offset `moffset` into what backs it, as a guest store there
    /// would; EIO where nothing live and writable is mapped.
    fn write_window(&self, _moffset: u64, _data: &[u8]) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EIO))
    }
}

/// No guest-physical base known yet.
const NO_BASE: u64 = u64::MAX;

/// The DAX window as the request path sees it: where it lies in guest-physical space (learnt
/// from the memory table: [`without_window_files`]) and the channel that moves the bytes of
/// buffers inside it ([`FarIo`]).
pub(crate) struct Window {
    base: AtomicU64,
    size: u64,
    channel: Arc<dyn BackendChannel>,
}

impl Window {
    fn at(&self) -> Option<WindowAt> {
        let base = self.base.load(Ordering::Relaxed);
        (base != NO_BASE).then_some(WindowAt {
            base,
            size: self.size,
        })
    }
}

impl FarIo for Window {
    fn read_far(&self, at: u64, buf: &mut [u8]) -> io::Result<()> {
        self.channel.read_window(at, buf)
    }

    fn write_far(&self, at: u64, data: &[u8]) -> io::Result<()> {
        self.channel.write_window(at, data)
    }
}

/// Backend options.
#[derive(Debug, Clone)]
pub struct FsBackendConfig {
    /// Tag for the config space; `None` leaves the config space (and the CONFIG protocol
    /// feature, which QEMU 7.1 to 8.0 crash on) out.
    pub tag: Option<String>,
    pub request_queues: usize,
    /// Worker threads shared by the request queues (virtiofsd's `--thread-pool-size`); 0, and
    /// 1 with one request queue ([`uses_pool`]), serve requests on their queue's thread. With
    /// one queue, a pool with no job queued or running leaves the last request in sight to
    /// the queue's thread too (`Pool::is_idle`).
    /// Requests that may block indefinitely always run on threads of their own, whatever
    /// this is.
    pub thread_pool_size: usize,
    /// Host changes for the guest: offers the notification queue (one more vring).
    pub notify: Option<Arc<Notifier>>,
}

/// Whether requests go to a `--thread-pool-size` pool. A pool of one thread behind one request
/// queue serves one request at a time, as the queue's own thread does, plus a hand-off and a
/// wake-up per request: such a "pool" (Kata Containers passes `--thread-pool-size=1`) serves
/// on the queue's thread (protobench, depth 16: 4 KiB READ 188k/s through a pool of one,
/// 476k/s on the queue's thread). With more queues a pool of one still bounds them to one
/// request at a time, as asked.
fn uses_pool(cfg: &FsBackendConfig) -> bool {
    cfg.thread_pool_size > 1 || (cfg.thread_pool_size == 1 && cfg.request_queues > 1)
}

/// Requests of one vring between pop and completion.
#[derive(Default)]
struct QueueState {
    /// Bumped when the device resets: a chain popped in one epoch is never completed in
    /// another (a rebooted guest has new rings there).
    epoch: u64,
    /// Popped and not yet completed.
    inflight: usize,
    /// Of those, requests that may block indefinitely (they never hold back a notification).
    blocking: usize,
    /// Used entries added since the guest was last notified.
    unsignalled: usize,
    /// Threads waiting on `drained` and on `space`. A `Condvar` notify is a futex system
    /// call even with no waiter; with these counts (kept under the same lock as the waits)
    /// a completion notifies only when someone waits: two system calls less per request.
    drain_waiters: usize,
    space_waiters: usize,
}

/// Whether a queue thread looks at its ring for [`POLL_BEFORE_SLEEP`] before it sleeps.
///
/// A look pays when the guest sends its next request within microseconds (a driver in a
/// loop, deep queues on KVM). Under TCG, or for a metadata walk, the next request comes
/// hundreds of microseconds after the reply: nearly every look is wasted, and on a host whose
/// cores the vCPU threads share, its yields take time the guest needs (perf of a `--cache
/// never` tree unpack in a TCG guest: 20.8% of the daemon's samples under `sched_yield`). So
/// after a look that found nothing the thread skips the next 1, 2, 4, ... batches' looks (up
/// to [`LOOK_BACKOFF_MAX`]); a look that finds a request resets it.
///
/// The look spins (`spin_loop`), it does not `sched_yield`: where the vCPU threads want the
/// thread's core, a yield runs one of them for a whole time slice (milliseconds) while the
/// thread, runnable but not asleep, gets no wake-up from the guest's kick, so requests wait.
/// (With yields, 1,185 of 8,192 looks under 4 fio jobs overran twice their length.) A spin
/// costs a busy vCPU at most the look's 30 us. A look that still overran its own length (the
/// thread was preempted: [`Seen::Contended`]) counts as a miss.
///
/// Measured (protobench; 4 fio jobs in a 2-vCPU TCG guest on 2 host cores, interleaved): no
/// look at all cut protobench's 4 KiB READs at depth 16 from 445k to 185k/s (virtiofsd 1.14:
/// 305k); with yields the guest's jobs ran ~5% slower than with no look (medians of 16
/// rounds); spinning keeps protobench within 10% of the yielding look and the guest's jobs
/// level with no look. Only the queue's own thread uses it.
#[derive(Default)]
struct Look {
    /// Batches left to go without a look.
    skip: AtomicU32,
    /// What the next miss sets `skip` to (doubled each miss, 0 after a hit).
    backoff: AtomicU32,
}

impl Look {
    /// Whether to look after this batch (counts a skipped one).
    fn due(&self) -> bool {
        let s = self.skip.load(Ordering::Relaxed);
        if s > 0 {
            self.skip.store(s - 1, Ordering::Relaxed);
        }
        s == 0
    }

    /// Records what a look saw: only a request on an uncontended core keeps the thread
    /// looking.
    fn found(&self, seen: Seen) {
        if seen == Seen::Request {
            self.backoff.store(0, Ordering::Relaxed);
        } else {
            let b = (self.backoff.load(Ordering::Relaxed) * 2).clamp(1, LOOK_BACKOFF_MAX);
            self.backoff.store(b, Ordering::Relaxed);
            self.skip.store(b, Ordering::Relaxed);
        }
    }
}

/// What a queue thread's look before sleeping saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// A new request, on a core no other thread wanted.
    Request,
    /// A new request, but the look was preempted: it overran its own length.
    Contended,
    /// No request.
    Nothing,
}

/// Threads awake now, against the cores they may take: queue threads serving a batch or
/// looking, and `--thread-pool-size` threads serving a request.
///
/// A spinning look only pays while the request's producer runs on another core, so a queue
/// thread looks only while no more threads are awake than the CPUs the daemon may run on, less
/// one (none on one CPU). Where busy threads outnumber the spare cores, a spin takes a core
/// that another queue's requests, or the pool thread serving its own, want; the thread sleeps
/// instead and the next kick wakes it. (protobench, 4 queues on 2 cores: 4 KiB READ at depth
/// 16 ran at 0.4x the rate of yielding looks while one thread at a time spun; bench/HISTORY.md.)
struct Awake {
    now: AtomicUsize,
    max: usize,
}

impl Awake {
    fn new() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Awake {
            now: AtomicUsize::new(0),
            max: cpus.saturating_sub(1),
        }
    }

    /// Counts the calling thread awake until the guard drops.
    fn wake(&self) -> AwakeGuard<'_> {
        self.now.fetch_add(1, Ordering::AcqRel);
        AwakeGuard(&self.now)
    }

    /// Whether a thread that is awake may look: no more are awake than cores to spare.
    fn may_look(&self) -> bool {
        self.now.load(Ordering::Acquire) <= self.max
    }
}

/// A thread awake; counted in [`Awake`] until dropped.
struct AwakeGuard<'a>(&'a AtomicUsize);

impl Drop for AwakeGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// One vring's request bookkeeping, shared with the threads that serve its requests.
#[derive(Default)]
struct QueueShared {
    state: Mutex<QueueState>,
    /// The queue thread's look before sleeping.
    look: Look,
    /// Signalled when `inflight` drops to 0.
    drained: Condvar,
    /// Signalled on each completion: a worker holding back at the in-flight bound goes on.
    space: Condvar,
}

impl QueueShared {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts a served request into the used ring, unless the device was reset since it was
    /// popped, and notifies the guest when due. `in_batch`: the caller notifies at the end
    /// of its batch, so only a long batch needs a notification now. (Notifying as soon as an
    /// EVENT_IDX guest asks, as virtiofsd does, measured 0.7x on 4 KiB READ at depth 16: the
    /// driver wakes once per request instead of once per batch.)
    fn complete(&self, vring: &FsVring, done: Done, in_batch: bool) {
        let mut s = self.lock();
        s.inflight = s.inflight.saturating_sub(1);
        if s.space_waiters > 0 {
            self.space.notify_one();
        }
        if done.blocking {
            s.blocking = s.blocking.saturating_sub(1);
        }
        if s.epoch != done.epoch {
            log::info!("request finished after a device reset; not completed");
        } else if let Err(e) = vring.add_used(done.head, done.used) {
            log::error!("cannot complete request {}: {e}", done.head);
        } else {
            s.unsignalled += 1;
            let others_running = s.inflight - s.blocking > 0;
            let due = if in_batch {
                s.unsignalled >= MAX_UNSIGNALLED
            } else {
                done.blocking || !others_running || s.unsignalled >= MAX_UNSIGNALLED
            };
            if due {
                s.unsignalled = 0;
                notify(vring);
            }
        }
        if s.inflight == 0 && s.unsignalled == 0 && s.drain_waiters > 0 {
            self.drained.notify_all();
        }
    }

    /// Notifies the guest of completions held back by a batch.
    fn flush(&self, vring: &FsVring) {
        let mut s = self.lock();
        if s.unsignalled > 0 {
            s.unsignalled = 0;
            notify(vring);
        }
        if s.inflight == 0 && s.drain_waiters > 0 {
            self.drained.notify_all();
        }
    }
}

/// A served request, ready for the used ring.
struct Done {
    head: u16,
    used: u32,
    epoch: u64,
    blocking: bool,
}

/// Signals the guest if it asked to be (EVENT_IDX) or always without EVENT_IDX.
fn notify(vring: &FsVring) {
    let res = vring
        .needs_notification()
        .map_err(io::Error::other)
        .and_then(|yes| {
            if yes {
                vring.signal_used_queue()
            } else {
                Ok(())
            }
        });
    if let Err(e) = res {
        log::warn!("cannot notify the guest: {e}");
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A pool of threads running jobs; threads are started on demand up to `max`, and those
/// beyond `keep` leave after a while idle.
///
/// A job wakes the thread that went idle last (a stack, not a queue): its core and cache are
/// the warmest, and a steady stream of jobs keeps running on the same one or two threads. (A
/// shared condition variable wakes the longest sleeper: with a pool of 4 the jobs rotated
/// over all four threads, and protobench's 4 KiB READ at depth 1 made 1.2 CPU migrations per
/// request against virtiofsd's 0.5.)
struct Pool {
    name: &'static str,
    max: usize,
    keep: usize,
    inner: Mutex<PoolInner>,
    /// Where a thread running a job counts as awake ([`Awake`]); `None` for jobs that mostly
    /// sleep (requests that may block).
    awake: Option<Arc<Awake>>,
    /// Jobs submitted and not finished (queued or running).
    pending: AtomicUsize,
}

#[derive(Default)]
struct PoolInner {
    jobs: VecDeque<Job>,
    threads: usize,
    /// Threads waiting for a job, the one that went idle last on top.
    idle: Vec<Arc<Sleeper>>,
}

/// A pool thread waiting for a job.
struct Sleeper {
    thread: std::thread::Thread,
    woken: AtomicBool,
}

impl Sleeper {
    fn wake(&self) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }

    /// Sleeps until woken or `timeout` passes; whether it was woken.
    fn sleep(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.woken.load(Ordering::Acquire) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            std::thread::park_timeout(deadline - now);
        }
    }
}

impl Pool {
    fn new(name: &'static str, max: usize, keep: usize, awake: Option<Arc<Awake>>) -> Arc<Self> {
        Arc::new(Pool {
            name,
            max,
            keep,
            inner: Mutex::new(PoolInner::default()),
            awake,
            pending: AtomicUsize::new(0),
        })
    }

    /// Whether no job is queued or running.
    fn is_idle(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }

    fn lock(&self) -> MutexGuard<'_, PoolInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `job` on a pool thread (queued when all `max` threads are busy).
    fn submit(self: &Arc<Self>, job: Job) {
        self.pending.fetch_add(1, Ordering::AcqRel);
        let mut g = self.lock();
        g.jobs.push_back(job);
        if let Some(sleeper) = g.idle.pop() {
            // Woken after the lock is released: a thread woken while it is held would wake
            // only to sleep again on the lock.
            drop(g);
            sleeper.wake();
            return;
        }
        if g.threads >= self.max {
            // A busy thread takes it when it is done.
            return;
        }
        g.threads += 1;
        drop(g);
        let pool = self.clone();
        let spawned = std::thread::Builder::new()
            .name(self.name.into())
            .spawn(move || pool.run());
        if let Err(e) = spawned {
            log::error!("cannot start a {} thread: {e}", self.name);
            let mut g = self.lock();
            g.threads -= 1;
            if g.threads == 0 {
                // Nobody would ever run the queued jobs: run them here.
                let jobs: Vec<Job> = g.jobs.drain(..).collect();
                drop(g);
                jobs.into_iter().for_each(|j| {
                    j();
                    self.pending.fetch_sub(1, Ordering::AcqRel);
                });
            }
        }
    }

    fn run(&self) {
        let me = Arc::new(Sleeper {
            thread: std::thread::current(),
            woken: AtomicBool::new(false),
        });
        let mut g = self.lock();
        loop {
            if let Some(job) = g.jobs.pop_front() {
                drop(g);
                {
                    let _awake = self.awake.as_ref().map(|a| a.wake());
                    job();
                }
                self.pending.fetch_sub(1, Ordering::AcqRel);
                g = self.lock();
                continue;
            }
            // Sleep at once: a pool thread that looked for its next job before sleeping (50 us,
            // yielding) saved protobench a futex wake-up per request, but in a guest it cost
            // more than the wake-up: a yield on a core a vCPU wants leaves the job a time
            // slice behind a thread no submit wakes (4 fio jobs, `--thread-pool-size=4`:
            // 9-20% slower; bench/HISTORY.md).
            me.woken.store(false, Ordering::Relaxed);
            g.idle.push(me.clone());
            drop(g);
            let woken = me.sleep(Duration::from_secs(30));
            g = self.lock();
            // A submit that wakes a thread takes it off the stack first; one still there timed
            // out, or saw a wake-up meant for an earlier sleep.
            let still_idle = match g.idle.iter().position(|s| Arc::ptr_eq(s, &me)) {
                Some(i) => {
                    g.idle.remove(i);
                    true
                }
                None => false,
            };
            if still_idle && !woken && g.jobs.is_empty() && g.threads > self.keep {
                g.threads -= 1;
                return;
            }
        }
    }
}

/// The device-state port (SET_DEVICE_STATE_FD / CHECK_DEVICE_STATE): what [`FsBackend`]
/// calls to migrate, [`crate::migration::Migration`] in the daemon.
pub trait DeviceStateTransfer: Send + Sync {
    /// Starts a transfer over `file` (`load`: the frontend writes the state into it).
    fn set_fd(&self, load: bool, file: std::fs::File) -> io::Result<()>;
    /// Waits for the transfer and reports its result.
    fn check(&self) -> io::Result<()>;
}

impl DeviceStateTransfer for crate::migration::Migration {
    fn set_fd(&self, load: bool, file: std::fs::File) -> io::Result<()> {
        crate::migration::Migration::set_fd(self, load, file)
    }

    fn check(&self) -> io::Result<()> {
        crate::migration::Migration::check(self)
    }
}

/// A virtio-fs device backend over a FUSE server.
pub struct FsBackend<F: FileSystem> {
    server: Arc<Server<F>>,
    config: Option<VirtioFsConfig>,
    request_queues: usize,
    event_idx: AtomicBool,
    mem: RwLock<Option<GuestMem>>,
    /// Bit i set: vring i has been started and not stopped since.
    running: AtomicU64,
    queues: Vec<Arc<QueueShared>>,
    /// Threads awake now: whether a queue thread may look ([`Awake`]).
    awake: Arc<Awake>,
    /// `--thread-pool-size` workers, when non-zero.
    pool: Option<Arc<Pool>>,
    /// Threads for requests that may wait indefinitely ([`Wait::Indefinite`]).
    waits: Arc<Pool>,
    /// Threads for requests that may take long ([`Wait::Long`]). Apart from `waits`: the
    /// request that ends a lock wait (the holder's FLUSH at close, an FSYNC before its UNLOCK)
    /// must never queue behind the waits (65 waiters on one lock filled one shared pool of
    /// 64, and the holder's FLUSH never ran).
    long: Arc<Pool>,
    channel: Option<Arc<dyn BackendChannel>>,
    /// The DAX window, when there is one: buffers inside it are moved through the channel.
    window: Option<Arc<Window>>,
    /// Live migration (DEVICE_STATE), when the filesystem supports it.
    device_state: Option<Arc<dyn DeviceStateTransfer>>,
    /// The notification queue, when offered.
    notify: Option<NotifyQueue>,
}

/// Which queues each worker thread serves (`queues_per_thread`): the first `shared` queues
/// (the hiprio queue, the notification queue when offered, and the first request queue)
/// share a thread, every further request queue has its own.
///
/// FORGETs arrive on the hiprio queue and take the inode table's lock that the LOOKUPs of
/// the request queue take. On threads of their own the two contended for it: a `--cache
/// never` tree unpack in a TCG guest (1,551 entries) made 29,800 hiprio wake-ups and 31,500
/// futex calls in the daemon, against 2,100 futex calls on one shared thread (virtiofsd
/// serves all its queues on one thread: 5). A hiprio request is short and never waits, so
/// sharing delays no request queue for long.
fn thread_masks(num_queues: usize, shared: usize) -> Vec<u64> {
    let mut masks = vec![(1u64 << num_queues.min(shared)) - 1];
    masks.extend((shared..num_queues.min(64)).map(|q| 1u64 << q));
    masks
}

/// The queue behind `device_event` of worker `thread` ([`thread_masks`]): vhost-user-backend
/// numbers a thread's events by the rank of the queue's bit in the thread's mask.
fn queue_of(thread: usize, device_event: u16, shared: usize) -> usize {
    match thread {
        0 => usize::from(device_event),
        t => t + shared - 1,
    }
}

/// `queue`'s bit in [`FsBackend::running`].
fn queue_bit(queue: usize) -> u64 {
    1u64 << queue.min(63)
}

impl<F: FileSystem + 'static> FsBackend<F> {
    pub fn new(
        server: Arc<Server<F>>,
        cfg: &FsBackendConfig,
        channel: Option<Arc<dyn BackendChannel>>,
    ) -> io::Result<Self> {
        if cfg.request_queues == 0 || cfg.request_queues > MAX_REQUEST_QUEUES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("request queues must be 1..={MAX_REQUEST_QUEUES}"),
            ));
        }
        let config = match &cfg.tag {
            None => None,
            Some(tag) => {
                let mut config = VirtioFsConfig::default();
                let tag = tag.as_bytes();
                if tag.is_empty() || tag.len() > config.tag.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("tag must be 1..={} bytes", config.tag.len()),
                    ));
                }
                config.tag[..tag.len()].copy_from_slice(tag);
                config.num_request_queues = cfg.request_queues as u32;
                if cfg.notify.is_some() {
                    config.notify_buf_size = NOTIFY_BUF_SIZE;
                }
                Some(config)
            }
        };
        let awake = Arc::new(Awake::new());
        let pool = uses_pool(cfg).then(|| {
            let n = cfg.thread_pool_size;
            Pool::new("fs-worker", n, n, Some(awake.clone()))
        });
        Ok(FsBackend {
            server,
            config,
            request_queues: cfg.request_queues,
            event_idx: AtomicBool::new(false),
            mem: RwLock::new(None),
            running: AtomicU64::new(0),
            queues: (0..=cfg.request_queues + usize::from(cfg.notify.is_some()))
                .map(|_| Arc::new(QueueShared::default()))
                .collect(),
            awake,
            pool,
            waits: Pool::new("fs-wait", MAX_WAIT_THREADS, 0, None),
            long: Pool::new("fs-long", MAX_LONG_THREADS, 0, None),
            window: channel.as_ref().filter(|c| c.window_size() > 0).map(|c| {
                Arc::new(Window {
                    base: AtomicU64::new(NO_BASE),
                    size: c.window_size(),
                    channel: c.clone(),
                })
            }),
            channel,
            device_state: None,
            notify: cfg.notify.clone().map(NotifyQueue::new).transpose()?,
        })
    }

    /// Queues on the first worker thread ([`thread_masks`]).
    fn shared_queues(&self) -> usize {
        2 + usize::from(self.notify.is_some())
    }

    /// Whether vring `queue` is the notification queue (offered and negotiated).
    fn is_notify_queue(&self, queue: usize) -> bool {
        queue == 1 && self.notify.as_ref().is_some_and(|n| n.acked())
    }

    /// The notification queue's wake-up: the descriptor and the event id to register on the
    /// first worker thread's epoll (`VringEpollHandler::register_listener`).
    pub fn notify_wake(&self) -> Option<(std::os::fd::RawFd, u64)> {
        self.notify
            .as_ref()
            .map(|n| (n.wake_fd(), self.notify_wake_event()))
    }

    fn notify_wake_event(&self) -> u64 {
        self.num_queues() as u64 + 1
    }

    /// Offers live migration (protocol feature DEVICE_STATE) through `t`.
    pub fn with_device_state(mut self, t: Arc<dyn DeviceStateTransfer>) -> Self {
        self.device_state = Some(t);
        self
    }

    pub fn server(&self) -> &Arc<Server<F>> {
        &self.server
    }

    /// The guest memory, once the frontend set the table.
    fn memory(&self) -> Option<GuestMem> {
        self.mem.read().ok().and_then(|m| m.clone())
    }

    /// Ends the FUSE session and the DAX state of a reset device.
    fn end_session(&self, why: &str) {
        log::info!("device {why}: dropping all inodes, handles and mappings");
        if let Some(c) = &self.channel {
            c.device_reset();
        }
        self.server.reset();
    }

    /// Marks `queue` running, under its lock (`stop_vring` clears the bit under it): when the
    /// vring (re)starts, the DAX window, paused when it or the device stopped, starts too.
    fn mark_running(&self, queue: usize) {
        let bit = queue_bit(queue);
        if self.running.fetch_or(bit, Ordering::SeqCst) & bit == 0 {
            if let Some(c) = &self.channel {
                c.device_started();
            }
        }
    }

    /// Waits until vring `queue` has no request in flight (they complete into its used ring
    /// and the guest is notified), at most [`STOP_DRAIN_TIMEOUT`]. Requests waiting for a
    /// lock give up with EINTR: asked again at every look while any is in flight, since a
    /// wait still queued for a thread of the lock-wait pool (more than 64 waiters) starts
    /// after the first interruption.
    fn drain(&self, queue: usize) {
        let Some(q) = self.queues.get(queue) else {
            return;
        };
        let mut s = q.lock();
        let start = Instant::now();
        let deadline = start + STOP_DRAIN_TIMEOUT;
        while s.inflight > 0 || s.unsignalled > 0 {
            if s.blocking > 0 {
                self.server.fs().interrupt_waits();
            }
            let now = Instant::now();
            let waiting_frontend = self
                .channel
                .as_ref()
                .map_or(0, |c| c.round_trips_in_flight());
            if waiting_frontend > 0
                && s.inflight <= waiting_frontend
                && now >= start + STOP_FRONTEND_GRACE
            {
                // The frontend answers them only after it has our reply: waiting would stall
                // QEMU for the whole timeout. They complete once it answers.
                log::warn!(
                    "queue {queue}: {} request(s) wait for the frontend's reply to a DAX \
                     mapping; reporting the vring base without them",
                    s.inflight
                );
                return;
            }
            if now >= deadline {
                log::error!(
                    "queue {queue}: {} request(s) still running {}s after the vring stopped; \
                     reporting its base anyway (they complete when it restarts)",
                    s.inflight,
                    STOP_DRAIN_TIMEOUT.as_secs()
                );
                return;
            }
            s.drain_waiters += 1;
            s = q
                .drained
                .wait_timeout(s, (deadline - now).min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
            s.drain_waiters -= 1;
        }
    }

    /// Serves vring `queue` until it is empty. `hiprio`: the hiprio vring, when `queue` is
    /// the request queue sharing its thread ([`thread_masks`]): served in between, every
    /// [`HIPRIO_EVERY`] requests and while waiting for room, so that a request queue the guest
    /// keeps full never holds its FORGETs back (each one pins a host descriptor and an inode
    /// table entry until it is served).
    fn process_queue(
        &self,
        queue: usize,
        vring: &FsVring,
        hiprio: Option<&FsVring>,
    ) -> io::Result<()> {
        let Some(atomic) = self
            .mem
            .read()
            .map_err(|_| io::Error::other("memory lock poisoned"))?
            .clone()
        else {
            log::warn!("queue kicked before the memory table was set");
            return Ok(());
        };
        let Some(q) = self.queues.get(queue) else {
            return Ok(());
        };
        let event_idx = self.event_idx.load(Ordering::Relaxed);
        let _awake = self.awake.wake();
        let window = self.window.clone();
        let mut since_hiprio = 0usize;
        loop {
            if event_idx {
                vring.disable_notification().map_err(io::Error::other)?;
            }
            loop {
                since_hiprio += 1;
                if since_hiprio >= HIPRIO_EVERY {
                    since_hiprio = 0;
                    self.serve_hiprio(hiprio, &atomic);
                }
                // The epoch and the pop under one lock: a reset cannot fall between them.
                let (epoch, chain) = {
                    let mut s = q.lock();
                    // Backpressure: at most a ring's worth of requests in flight. A guest
                    // that republishes heads it has not had back (virtio-queue does not
                    // track them) waits here until its requests complete, instead of
                    // queueing work for the pools without bound.
                    let limit = usize::from(vring.get_ref().get_queue().size()).max(1);
                    let mut warned = false;
                    while s.inflight >= limit {
                        if !vring.get_ref().get_queue().ready() {
                            return Ok(());
                        }
                        if !warned {
                            log::debug!("queue {queue}: {limit} requests in flight; waiting");
                            warned = true;
                        }
                        if hiprio.is_some_and(|h| Self::has_request(h, &atomic.memory())) {
                            drop(s);
                            self.serve_hiprio(hiprio, &atomic);
                            s = q.lock();
                            continue;
                        }
                        s.space_waiters += 1;
                        s = q
                            .space
                            .wait_timeout(s, Duration::from_millis(100))
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                        s.space_waiters -= 1;
                    }
                    let chain = Self::pop(vring, &atomic);
                    if chain.is_some() {
                        s.inflight += 1;
                        // A vring stopped and restarted while this loop ran (a `stop`/`cont`
                        // during a long request) gives its next request here, before the
                        // thread sees the restart's kick: it runs on a started device.
                        if self.running.load(Ordering::SeqCst) & queue_bit(queue) == 0 {
                            self.mark_running(queue);
                        }
                    }
                    (s.epoch, chain)
                };
                let Some(at) = chain else { break };
                let head = at.head;
                // Walked once, its header read once, here: the opcode of this one copy picks
                // the thread, and the thread serves this copy and these buffers (the guest
                // may rewrite its descriptors and its header meanwhile). A chain this walk
                // finds no request in is dropped here, never walked again elsewhere.
                let mem = atomic.memory();
                let far = window.as_deref();
                let split = walk(&mem, at, far.and_then(Window::at));
                let req = match decode(split, far.map(|w| w as &dyn FarIo)) {
                    Ok(req) => req,
                    Err(refused) => {
                        let used = refuse(&mem, refused, far.map(|w| w as &dyn FarIo), queue, head);
                        let done = Done {
                            head,
                            used,
                            epoch,
                            blocking: false,
                        };
                        q.complete(vring, done, true);
                        continue;
                    }
                };
                // Requests that may wait indefinitely (a lock held by someone else) or for
                // long (a flush to slow storage; [`Server::wait`]) never run on the queue's
                // own thread or hold back its notifications.
                let wait = self.server.wait(&req.hdr);
                let blocking = wait != Wait::Short;
                if blocking {
                    q.lock().blocking += 1;
                }
                let pool = if wait == Wait::Indefinite {
                    Some(&self.waits)
                } else if wait == Wait::Long {
                    Some(&self.long)
                } else {
                    // The last request in sight while the pool has nothing to do is served
                    // here: handing it over would cost a wake-up of a pool thread while this
                    // one goes to sleep, and nothing else waits for this thread. With one
                    // request queue only (more queue threads serving at once would exceed a
                    // pool of one).
                    self.pool.as_ref().filter(|p| {
                        !(self.request_queues == 1
                            && p.is_idle()
                            && !Self::has_request(vring, &mem))
                    })
                };
                match pool {
                    None => {
                        let used = serve(&self.server, &mem, req, far.map(|w| w as &dyn FarIo));
                        let done = Done {
                            head,
                            used,
                            epoch,
                            blocking,
                        };
                        q.complete(vring, done, true);
                    }
                    Some(pool) => {
                        // SAFETY: `req` was decoded from `walk` over `mem` just above.
                        let job = unsafe { Walked::of(mem.clone(), req, window.clone()) };
                        let (server, q, vring) = (self.server.clone(), q.clone(), vring.clone());
                        pool.submit(Box::new(move || {
                            let used = job.serve(&server);
                            let done = Done {
                                head,
                                used,
                                epoch,
                                blocking,
                            };
                            q.complete(&vring, done, false);
                        }));
                    }
                }
            }
            q.flush(vring);
            // A guest with requests in flight often sends the next one within microseconds:
            // look for it briefly before sleeping in epoll (a wake-up from an idle core costs
            // far more than the look), unless recent looks found nothing ([`Look`]) or more
            // threads are awake than there are cores to spare ([`Awake`]).
            if q.look.due() && self.awake.may_look() {
                let seen = Self::more_soon(vring, &atomic);
                q.look.found(seen);
                if seen != Seen::Nothing {
                    continue;
                }
            }
            if !event_idx || !vring.enable_notification().map_err(io::Error::other)? {
                break;
            }
        }
        Ok(())
    }

    /// Serves what the hiprio queue holds (FORGET, INTERRUPT), from the thread of the request
    /// queue that shares it.
    fn serve_hiprio(&self, hiprio: Option<&FsVring>, mem: &GuestMem) {
        let Some(h) = hiprio else { return };
        if !Self::has_request(h, &mem.memory()) {
            return;
        }
        if let Err(e) = self.process_queue(0, h, None) {
            log::error!("queue 0: {e}");
        }
    }

    /// Whether the guest makes a new request available within [`POLL_BEFORE_SLEEP`], and
    /// whether the look was preempted (it overran its own length: the core is wanted by
    /// another thread, and [`Look`] counts that as a miss).
    fn more_soon(vring: &FsVring, mem: &GuestMem) -> Seen {
        let deadline = Instant::now() + POLL_BEFORE_SLEEP;
        // Still looking past this: the thread was preempted.
        let late = deadline + POLL_BEFORE_SLEEP;
        let mem = mem.memory();
        loop {
            let more = Self::has_request(vring, &mem);
            let now = Instant::now();
            if now >= late {
                return if more { Seen::Contended } else { Seen::Nothing };
            }
            if more {
                return Seen::Request;
            }
            if now >= deadline {
                return Seen::Nothing;
            }
            std::hint::spin_loop();
        }
    }

    /// Whether the guest has made a request available that is not popped yet.
    fn has_request(vring: &FsVring, mem: &GuestMemoryLogged) -> bool {
        let v = vring.get_ref();
        let q = v.get_queue();
        q.ready()
            && q.avail_idx(mem, Ordering::Acquire)
                .is_ok_and(|i| i.0 != q.next_avail())
    }

    /// Takes the next available chain: where it is (the walk happens later, outside the
    /// vring lock).
    fn pop(vring: &FsVring, mem: &GuestMem) -> Option<ChainAt> {
        let mut v = vring.get_mut();
        let q = v.get_queue_mut();
        let head = q.pop_descriptor_chain(mem.memory())?.head_index();
        Some(ChainAt {
            table: q.desc_table(),
            size: q.size(),
            head,
        })
    }
}

/// Guest memory without the frontend's regions of the DAX window, and the number left out.
///
/// Every SHMEM mapping comes back in the memory table as a region of its own: a host file (it
/// may shrink under the mapping, and a read past its end would be a SIGBUS in the daemon), a
/// shadow or the pool (memory the guest may map writable). None of them is used to resolve
/// descriptors: a buffer in the window is a far segment that the window moves with
/// `pread`/`pwrite` on what backs it ([`Window`], issue #43). A region is the window's when
/// the window sent its file and offset ([`BackendChannel::window_offset`], which gives the
/// window's guest-physical base too, stored in `window`), when it lies inside the window's
/// known range, or when its file is one the window mapped (issue #20). Returns a collection
/// of its own (sharing the regions), never the frontend handler's.
fn without_window_files(mem: &GuestMem, window: Option<&Window>) -> (GuestMemoryLogged, usize) {
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
    let all = mem.memory();
    let regions: Vec<_> = all
        .iter()
        .map(|r| {
            let fo = r.file_offset();
            let at = window.zip(fo).and_then(|(w, fo)| {
                w.channel
                    .window_offset(fo.file(), fo.start(), r.len())
                    .and_then(|m| r.start_addr().0.checked_sub(m))
            });
            let mapped = fo.is_some_and(|fo| crate::dax::host_watch::backs_window(fo.file()));
            (r.start_addr(), r.len(), at, mapped)
        })
        .collect();
    if let Some(w) = window {
        // The base most regions agree on (one file range mapped at two offsets gives one
        // wrong candidate per region; the window's own ranges all give the right one).
        let mut votes: Vec<(u64, usize)> = Vec::new();
        for b in regions.iter().filter_map(|r| r.2) {
            match votes.iter_mut().find(|v| v.0 == b) {
                Some(v) => v.1 += 1,
                None => votes.push((b, 1)),
            }
        }
        if let Some(&(base, _)) = votes.iter().max_by_key(|v| v.1) {
            if w.base.swap(base, Ordering::Relaxed) != base {
                log::debug!("DAX window at guest-physical {base:#x}");
            }
        }
    }
    let span = window.and_then(Window::at);
    let mut keep = Vec::with_capacity(regions.len());
    let mut rest: Option<GuestMemoryLogged> = None;
    let mut left_out = 0;
    for (at, len, base, mapped) in regions {
        // remove_region hands the region out as the Arc the collection holds.
        let taken = match &rest {
            Some(c) => c.remove_region(at, len),
            None => all.remove_region(at, len),
        };
        let Ok((r, region)) = taken else { continue };
        rest = Some(r);
        let inside = span.is_some_and(|w| w.offset_of(at.0, len).is_some());
        if base.is_some() || inside || mapped {
            left_out += 1;
            log::trace!(
                "memory region {:#x}+{len:#x} is the DAX window's: not used for descriptors",
                at.0
            );
        } else {
            keep.push(region);
        }
    }
    (
        GuestMemoryLogged::from_arc_regions(keep).unwrap_or_else(|_| GuestMemoryLogged::new()),
        left_out,
    )
}

/// A copy of a request's FUSE header, if it is readable.
fn header_of(readable: &[Seg<'_>], far: Option<&dyn FarIo>) -> Option<InHeader> {
    if let Some(Seg::Mem(first)) = readable.first().filter(|f| f.len() >= IN_HEADER_LEN) {
        // The common case: the header is in the first buffer.
        return first.read_obj::<InHeader>(0).ok();
    }
    Reader::with_far(readable.to_vec(), far)
        .read_obj::<InHeader>()
        .ok()
}

/// A request as decoded from one walk of its chain: one copy of its header, and the buffers
/// that walk found (guest memory, or far segments in the DAX window). Everything the
/// transport decides (the thread, the opcode served, the bytes the server reads and writes)
/// comes from this one decoding.
pub(crate) struct Decoded<'m> {
    pub(crate) hdr: InHeader,
    pub(crate) readable: Vec<Seg<'m>>,
    pub(crate) writable: Vec<Seg<'m>>,
}

/// A chain that is no request to serve: refused by the walk (answered with EIO where it can
/// be, [`answer_malformed`]), or well formed but too short for a FUSE header (dropped).
pub(crate) enum Refused<'m> {
    Malformed(Malformed<'m>),
    NoHeader(String),
}

/// Decodes a walked chain: its FUSE header, read once; a chain the walk refused or too short
/// for a header is no request ([`refuse`] completes it).
pub(crate) fn decode<'m>(
    split: Result<Split<'m>, Malformed<'m>>,
    far: Option<&dyn FarIo>,
) -> Result<Decoded<'m>, Refused<'m>> {
    let (readable, writable) = split.map_err(Refused::Malformed)?;
    let Some(hdr) = header_of(&readable, far) else {
        let total: usize = readable.iter().map(|s| s.len()).sum();
        return Err(Refused::NoHeader(format!(
            "{total} readable bytes, too short for a FUSE header"
        )));
    };
    Ok(Decoded {
        hdr,
        readable,
        writable,
    })
}

/// Completes a chain that is no request ([`decode`]); returns the bytes written for the used
/// ring (an EIO reply, or nothing).
fn refuse(
    mem: &GuestMemoryLogged,
    refused: Refused<'_>,
    far: Option<&dyn FarIo>,
    queue: usize,
    head: u16,
) -> u32 {
    match refused {
        Refused::Malformed(m) => answer_malformed(mem, m, far),
        Refused::NoHeader(e) => {
            log::warn!("queue {queue}: dropping descriptor chain {head}: {e}");
            0
        }
    }
}

/// Serves a decoded request; returns the bytes written for the used ring.
pub(crate) fn serve<F: FileSystem>(
    server: &Server<F>,
    mem: &GuestMemoryLogged,
    req: Decoded<'_>,
    far: Option<&dyn FarIo>,
) -> u32 {
    let Decoded {
        hdr,
        readable,
        writable,
    } = req;
    let spans = Spans::of(&writable);
    let w = (!writable.is_empty()).then(|| Writer::with_far(writable, far));
    let mut r = Reader::with_far(readable, far);
    let total = r.available();
    // The header bytes are skipped, not read again: `hdr` is what is served.
    let handled = r
        .skip(IN_HEADER_LEN)
        .and_then(|()| server.handle_decoded(hdr, total, r, w));
    let used = match handled {
        Ok(h) => u32::try_from(h.written).unwrap_or(0),
        Err(e) => {
            log::warn!("request dropped: {e}");
            0
        }
    };
    // A migration's log must see the reply once it is written (never before).
    mark_written(mem, spans.as_slice(), used as usize);
    used
}

/// Answers a chain [`walk`] refused (a buffer outside guest memory and the window, a
/// readable buffer after a writable one, no readable buffer): with EIO in its out-header
/// when its FUSE header and the first 16 writable bytes could be resolved, so the request
/// fails instead of looking served. Otherwise (no header to take the `unique` from, or no
/// room for an out-header: nothing the guest's driver could read an answer from) the chain
/// is still completed, with 0 bytes written, like FORGET: it never stays in flight.
fn answer_malformed(mem: &GuestMemoryLogged, m: Malformed<'_>, far: Option<&dyn FarIo>) -> u32 {
    let (readable, writable) = m.partial;
    let hdr = header_of(&readable, far);
    let spans = Spans::of(&writable);
    let mut w = Writer::with_far(writable, far);
    let used = match hdr {
        Some(h) if w.available() >= std::mem::size_of::<OutHeader>() => {
            let out = OutHeader {
                len: std::mem::size_of::<OutHeader>() as u32,
                error: -libc::EIO,
                unique: h.unique,
            };
            w.write_obj(&out).map_or(0, |()| out.len)
        }
        _ => 0,
    };
    log::warn!(
        "malformed descriptor chain: {}; {}",
        m.why,
        if used > 0 {
            "answered with EIO"
        } else {
            "completed without a reply (no header or out-header to answer with)"
        }
    );
    mark_written(mem, spans.as_slice(), used as usize);
    used
}

/// A decoded request handed to a pool thread: the guest memory its buffers were resolved in
/// (held, so they stay mapped until it is served, whatever memory table the frontend sets
/// meanwhile) and the buffers as host (address, length) pieces. The pool thread serves these,
/// not a new walk of the chain.
pub(crate) struct Walked {
    mem: vm_memory::atomic::GuestMemoryLoadGuard<GuestMemoryLogged>,
    /// The DAX window far segments are moved through.
    window: Option<Arc<Window>>,
    hdr: InHeader,
    readable: Vec<Piece>,
    writable: Vec<Piece>,
}

/// A buffer of a [`Walked`] request: host memory (address, length), or a far segment.
#[derive(Clone, Copy)]
enum Piece {
    Mem(usize, usize),
    Far(u64, usize),
}

impl Walked {
    /// `req`, decoded from a walk in `mem` (far segments in `window`), for another thread.
    ///
    /// # Safety
    ///
    /// `req` must come from [`walk`] over `mem` itself (through [`decode`]): its guest
    /// buffers lie inside `mem`'s regions, which [`Walked::serve`] uses again as slices.
    pub(crate) unsafe fn of(
        mem: vm_memory::atomic::GuestMemoryLoadGuard<GuestMemoryLogged>,
        req: Decoded<'_>,
        window: Option<Arc<Window>>,
    ) -> Self {
        let piece = |s: &Seg<'_>| match s {
            Seg::Mem(v) => Piece::Mem(v.ptr_guard().as_ptr() as usize, v.len()),
            Seg::Far { at, len } => Piece::Far(*at, *len),
        };
        Walked {
            hdr: req.hdr,
            readable: req.readable.iter().map(piece).collect(),
            writable: req.writable.iter().map(piece).collect(),
            mem,
            window,
        }
    }

    /// Serves the request; returns the bytes written for the used ring.
    pub(crate) fn serve<F: FileSystem>(self, server: &Server<F>) -> u32 {
        fn segs(pieces: &[Piece]) -> Vec<Seg<'_>> {
            pieces
                .iter()
                .map(|&p| match p {
                    Piece::Mem(addr, len) => {
                        // SAFETY: each piece is a buffer `walk` resolved inside one region of
                        // the `mem` the request holds (bounds-checked there; `Walked::of`'s
                        // contract); that collection keeps its regions mapped while it lives,
                        // and the slices borrow the request that holds it. The guest may
                        // change the bytes at any time: every access through a
                        // `VolatileSlice` is volatile.
                        Seg::Mem(unsafe { VolatileSlice::new(addr as *mut u8, len) })
                    }
                    Piece::Far(at, len) => Seg::Far { at, len },
                })
                .collect()
        }
        let req = Decoded {
            hdr: self.hdr,
            readable: segs(&self.readable),
            writable: segs(&self.writable),
        };
        let far = self.window.as_deref().map(|w| w as &dyn FarIo);
        serve(server, &self.mem, req, far)
    }
}

/// The host (address, length) pieces of a reply, without an allocation for the usual few.
enum Spans {
    Inline([(usize, usize); 4], usize),
    Heap(Vec<(usize, usize)>),
}

impl Spans {
    fn of(writable: &[Seg<'_>]) -> Self {
        // A far segment is no guest RAM: address 0 lies in no region and is skipped.
        let span = |s: &Seg<'_>| match s {
            Seg::Mem(s) => (s.ptr_guard().as_ptr() as usize, s.len()),
            Seg::Far { len, .. } => (0, *len),
        };
        if writable.len() > 4 {
            return Spans::Heap(writable.iter().map(span).collect());
        }
        let mut a = [(0, 0); 4];
        for (d, s) in a.iter_mut().zip(writable) {
            *d = span(s);
        }
        Spans::Inline(a, writable.len())
    }

    fn as_slice(&self) -> &[(usize, usize)] {
        match self {
            Spans::Inline(a, n) => &a[..*n],
            Spans::Heap(v) => v,
        }
    }
}

/// Marks the first `written` bytes of a reply dirty in the frontend's migration log (a no-op
/// until SET_LOG_BASE). `spans` are the host (address, length) pieces of the writable part,
/// in order; each is found in the region whose host mapping holds it (addresses only, no
/// memory is touched).
fn mark_written(mem: &GuestMemoryLogged, spans: &[(usize, usize)], written: usize) {
    use vm_memory::bitmap::Bitmap;
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
    if written == 0 {
        return;
    }
    // The regions by host address, once per request; each span then finds its region by
    // binary search (a chain may hold 65,535 buffers, the table up to 512 regions).
    let mut regions: Vec<(usize, usize, _)> = mem
        .iter()
        .filter_map(|r| {
            let base = r.get_host_address(vm_memory::MemoryRegionAddress(0)).ok()?;
            Some((base as usize, r.len() as usize, r))
        })
        .collect();
    regions.sort_unstable_by_key(|&(base, _, _)| base);
    let mut left = written;
    for &(host, len) in spans {
        if left == 0 {
            break;
        }
        let n = len.min(left);
        left -= n;
        let i = regions.partition_point(|&(base, _, _)| base <= host);
        if let Some(&(base, size, region)) = i.checked_sub(1).and_then(|i| regions.get(i)) {
            if host - base < size {
                region
                    .bitmap()
                    .mark_dirty(host - base, n.min(size - (host - base)));
            }
        }
    }
}

impl<F: FileSystem + 'static> VhostUserBackend for FsBackend<F> {
    type Bitmap = BitmapMmapRegion;
    type Vring = FsVring;

    fn num_queues(&self) -> usize {
        self.request_queues + 1 + usize::from(self.notify.is_some())
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            // Dirty-page logging (QEMU refuses to migrate without it).
            | VhostUserVirtioFeatures::LOG_ALL.bits()
            | if self.notify.is_some() { VIRTIO_FS_F_NOTIFICATION } else { 0 }
    }

    fn acked_features(&self, features: u64) {
        if let Some(n) = &self.notify {
            n.set_acked(features & VIRTIO_FS_F_NOTIFICATION != 0);
        }
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        let mut f = VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::BACKEND_REQ
            | VhostUserProtocolFeatures::BACKEND_SEND_FD
            | VhostUserProtocolFeatures::RESET_DEVICE;
        if self.config.is_some() {
            f |= VhostUserProtocolFeatures::CONFIG;
        }
        if self.channel.as_ref().is_some_and(|c| c.window_size() > 0) {
            // Every SHMEM mapping becomes a RAM region of the guest's address space that QEMU
            // also puts into our memory table. Without CONFIGURE_MEM_SLOTS that table holds at
            // most 8 regions: past a few live mappings SET_MEM_TABLE fails, and with it the
            // restart of the vrings after `stop`/`cont` (the guest hangs).
            f |= VhostUserProtocolFeatures::SHMEM | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS;
        }
        if self.device_state.is_some() {
            f |= VhostUserProtocolFeatures::DEVICE_STATE | VhostUserProtocolFeatures::LOG_SHMFD;
        }
        f
    }

    fn reset_device(&self) {
        for q in &self.queues {
            let mut s = q.lock();
            s.epoch += 1;
            s.unsignalled = 0;
        }
        self.running.store(0, Ordering::SeqCst);
        if let Some(n) = &self.notify {
            // Node ids die with the session; SET_FEATURES says again what the guest takes.
            n.set_acked(false);
        }
        self.end_session("reset");
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let Some(config) = &self.config else {
            log::warn!("GET_CONFIG without a config space (no --tag)");
            return Vec::new();
        };
        let bytes = config.as_slice();
        let start = offset as usize;
        match start.checked_add(size as usize) {
            Some(end) if end <= bytes.len() => bytes[start..end].to_vec(),
            _ => {
                log::warn!(
                    "GET_CONFIG {offset}+{size} outside the {}-byte config",
                    bytes.len()
                );
                Vec::new()
            }
        }
    }

    fn update_memory(&self, mem: GuestMem) -> io::Result<()> {
        // An atomic of our own, updated in place (queue loops that hold it see the change),
        // never the frontend handler's: that one is updated before this call, with regions
        // that must be left out.
        let (filtered, window_regions) = without_window_files(&mem, self.window.as_deref());
        if let Some(c) = &self.channel {
            use vm_memory::GuestMemoryBackend as _;
            c.memory_regions(mem.memory().num_regions(), window_regions);
        }
        let mut slot = self
            .mem
            .write()
            .map_err(|_| io::Error::other("memory lock poisoned"))?;
        match slot.as_ref() {
            Some(own) => own
                .lock()
                .map_err(|_| io::Error::other("memory lock poisoned"))?
                .replace(filtered),
            None => *slot = Some(GuestMemoryAtomic::new(filtered)),
        }
        Ok(())
    }

    fn set_backend_req_fd(&self, backend: Backend) {
        match &self.channel {
            Some(c) => c.set_channel(backend),
            None => log::debug!("backend request channel set up (unused: no DAX window)"),
        }
    }

    fn get_shmem_config(&self) -> io::Result<VhostUserShMemConfig> {
        match self.channel.as_ref().map(|c| c.window_size()) {
            Some(size) if size > 0 => Ok(VhostUserShMemConfig::new(1, &[size])),
            _ => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no DAX window configured",
            )),
        }
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        thread_masks(self.num_queues(), self.shared_queues())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK)
            .map_err(|e| log::error!("cannot create exit event: {e}"))
            .ok()
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // No SHMEM_MAP/UNMAP from here on, before the drain: QEMU 11.1 reads the backend
        // channel only once its whole vhost_dev_stop has returned, which leaves the device
        // pointer NULL, and its SHMEM handlers dereference it (a segfault, issue #10). A
        // request served during the drain keeps its unmaps as orphans (sent after the
        // restart) and gets EIO for a new mapping, instead of killing the VM.
        if let Some(c) = &self.channel {
            c.device_paused();
        }
        // Requests in flight complete before the base is reported: a guest cannot re-send a
        // virtio-fs request, and the base tells the frontend they were consumed.
        self.drain(queue_index as usize);
        let bit = queue_bit(queue_index as usize);
        let before = {
            let _g = self.queues.get(queue_index as usize).map(|q| q.lock());
            self.running.fetch_and(!bit, Ordering::SeqCst)
        };
        if before & bit != 0 && before & !bit == 0 {
            // A pause, not a reset: the guest keeps its FUSE session (node ids, handles). A
            // rebooting guest ends it with its next INIT (or the frontend with RESET_DEVICE).
            log::info!("device stopped: every vring stopped, FUSE session kept");
        }
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[FsVring],
        thread_id: usize,
    ) -> io::Result<()> {
        if thread_id == 0 && u64::from(device_event) == self.notify_wake_event() {
            if let Some(n) = &self.notify {
                n.woken();
                if let (Some(vring), Some(mem)) = (vrings.get(1), self.memory()) {
                    n.deliver(vring, &mem);
                }
            }
            return Ok(());
        }
        let queue = queue_of(thread_id, device_event, self.shared_queues());
        if evset != EventSet::IN {
            log::warn!("queue {queue}: unexpected event set {evset:?}");
            return Ok(());
        }
        let Some(vring) = vrings.get(usize::from(device_event)) else {
            log::warn!("queue {queue}: event {device_event} for an unknown vring");
            return Ok(());
        };
        {
            // Under the queue's lock, as stop_vring clears the bit: a kick that raced the
            // vring's stop (GET_VRING_BASE marks it not ready first) must not mark the
            // device running again (a device-state transfer would be refused).
            let _g = self.queues.get(queue).map(|q| q.lock());
            if !vring.get_ref().get_queue().ready() {
                log::debug!("queue {queue}: kick for a stopped vring ignored");
                return Ok(());
            }
            self.mark_running(queue);
        }
        if self.is_notify_queue(queue) {
            // The guest posted buffers: messages waiting go out.
            if let (Some(n), Some(mem)) = (&self.notify, self.memory()) {
                n.deliver(vring, &mem);
            }
            return Ok(());
        }
        // The hiprio vring, served in between by the request queue(s) sharing its thread.
        let hiprio = (thread_id == 0 && queue != 0)
            .then(|| vrings.first())
            .flatten();
        // A broken queue must not end the worker: log and wait for the next kick.
        if let Err(e) = self.process_queue(queue, vring, hiprio) {
            log::error!("queue {queue}: {e}");
        }
        if thread_id == 0 {
            // Messages that found the notification vring not yet running (a wake-up before
            // the device started) go out with the first requests.
            if let (Some(n), Some(nq)) = (&self.notify, vrings.get(1)) {
                if n.acked() && n.waiting() {
                    if let Some(mem) = self.memory() {
                        n.deliver(nq, &mem);
                    }
                }
            }
        }
        Ok(())
    }

    fn set_device_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: std::fs::File,
    ) -> io::Result<Option<std::fs::File>> {
        let Some(t) = &self.device_state else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no device-state transfer",
            ));
        };
        if phase != VhostTransferStatePhase::STOPPED {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("device-state transfer in phase {phase:?}"),
            ));
        }
        if self.running.load(Ordering::SeqCst) != 0 {
            // The tables must not change under the transfer.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "device-state transfer while vrings run (stop them first)",
            ));
        }
        // The transfer runs on its own thread; CHECK_DEVICE_STATE reports how it went.
        t.set_fd(direction == VhostTransferStateDirection::LOAD, file)?;
        Ok(None)
    }

    fn check_device_state(&self) -> io::Result<()> {
        match &self.device_state {
            Some(t) => t.check(),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no device-state transfer",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::abi::{opcode, InHeader, OutHeader};
    use crate::protocol::mapper::NoMapper;
    use crate::protocol::server::ServerOptions;
    use crate::testing::memfs::MemFs;
    use crate::transport::vring_chain::split_chain;
    use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Bytes, GuestAddress};

    const MEM: usize = 0x20_0000;

    /// Looks that find requests keep the queue thread looking after every batch; misses
    /// (nothing found, or found by a preempted look) space the looks out 1, 2, 4, ... batches
    /// apart up to the cap, and one hit resets it.
    #[test]
    fn the_look_backs_off_after_misses_and_resets_on_a_hit() {
        let l = Look::default();
        for _ in 0..5 {
            assert!(l.due());
            l.found(Seen::Request);
        }
        // Every look misses: the batches skipped before each next look.
        let mut gaps = Vec::new();
        assert!(l.due());
        for i in 0..8 {
            // A request found on a core other threads wanted is a miss too.
            l.found(if i % 2 == 0 {
                Seen::Nothing
            } else {
                Seen::Contended
            });
            let mut n = 0;
            while !l.due() {
                n += 1;
            }
            gaps.push(n);
        }
        assert_eq!(gaps, [1, 2, 4, 8, 16, 32, 32, 32]);
        l.found(Seen::Request);
        assert!(l.due(), "a hit looks again at once");
    }

    /// A pool of one behind one queue is the queue's thread; any other pool is a pool.
    #[test]
    fn a_pool_of_one_behind_one_queue_serves_on_the_queue_thread() {
        let cfg = |request_queues, thread_pool_size| FsBackendConfig {
            tag: None,
            request_queues,
            thread_pool_size,
            notify: None,
        };
        assert!(!uses_pool(&cfg(1, 0)));
        assert!(!uses_pool(&cfg(1, 1)));
        assert!(
            uses_pool(&cfg(2, 1)),
            "one worker for two queues bounds them"
        );
        assert!(uses_pool(&cfg(1, 2)));
        assert!(!uses_pool(&cfg(4, 0)));
    }

    /// A queue thread may look while no more threads are awake than `max`; a guard counts
    /// its thread until dropped.
    #[test]
    fn threads_look_only_while_no_more_are_awake_than_cores_to_spare() {
        let a = Awake {
            now: AtomicUsize::new(0),
            max: 2,
        };
        let first = a.wake();
        assert!(a.may_look(), "alone");
        let second = a.wake();
        assert!(a.may_look(), "two awake, two cores to spare");
        let third = a.wake();
        assert!(!a.may_look(), "three awake: none looks");
        drop(first);
        assert!(a.may_look());
        drop((second, third));
        assert_eq!(a.now.load(Ordering::Relaxed), 0);
        let one_cpu = Awake {
            now: AtomicUsize::new(0),
            max: 0,
        };
        let _g = one_cpu.wake();
        assert!(!one_cpu.may_look(), "on one CPU no thread looks");
    }

    /// Every job runs, whether a sleeping, a busy or a new thread takes it: bursts from one
    /// submitter and from several, with gaps that let workers fall asleep between them.
    #[test]
    fn the_pool_runs_every_job_through_wakeups_and_sleeps() {
        use std::sync::atomic::AtomicUsize;
        let pool = Pool::new("test-worker", 4, 4, None);
        let done = Arc::new(AtomicUsize::new(0));
        let submit = |pool: &Arc<Pool>, n: usize| {
            for i in 0..n {
                let done = done.clone();
                pool.submit(Box::new(move || {
                    if i % 7 == 0 {
                        std::thread::sleep(Duration::from_micros(30));
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                }));
            }
        };
        let mut want = 0;
        for round in 0..200 {
            let n = 1 + round % 17;
            submit(&pool, n);
            want += n;
            if round % 3 == 0 {
                // The workers go to sleep.
                std::thread::sleep(Duration::from_micros(150));
            }
        }
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let pool = pool.clone();
                let done = done.clone();
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        let done = done.clone();
                        pool.submit(Box::new(move || {
                            done.fetch_add(1, Ordering::SeqCst);
                        }));
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        want += 1500;
        let deadline = Instant::now() + Duration::from_secs(10);
        while done.load(Ordering::SeqCst) < want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(done.load(Ordering::SeqCst), want);
        let g = pool.lock();
        assert!(g.threads <= 4 && g.jobs.is_empty(), "threads {}", g.threads);
    }

    /// A job wakes the thread that went idle last, again and again (a queue of sleepers would
    /// rotate the jobs over all three).
    #[test]
    fn the_pool_wakes_the_thread_that_went_idle_last() {
        let pool = Pool::new("test-worker", 3, 3, None);
        let idle = |n: usize| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while pool.lock().idle.len() < n && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(pool.lock().idle.len(), n);
        };
        // Three jobs at once start three threads.
        let gate = Arc::new(std::sync::Barrier::new(4));
        for _ in 0..3 {
            let gate = gate.clone();
            pool.submit(Box::new(move || {
                gate.wait();
            }));
        }
        gate.wait();
        idle(3);
        for _ in 0..5 {
            let last = pool.lock().idle.last().map(|s| s.thread.id());
            let (tx, rx) = std::sync::mpsc::channel();
            pool.submit(Box::new(move || {
                tx.send(std::thread::current().id()).unwrap();
            }));
            let ran_on = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(Some(ran_on), last, "the job ran on the thread idle last");
            idle(3);
        }
        assert_eq!(pool.lock().threads, 3);
    }

    #[test]
    fn the_pool_is_idle_only_with_no_job_queued_or_running() {
        // The queue thread serves the last request in sight itself only while this holds.
        let pool = Pool::new("test-worker", 1, 1, None);
        assert!(pool.is_idle(), "new");
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        pool.submit(Box::new(move || {
            go_rx.recv().unwrap();
        }));
        let tx = done_tx.clone();
        pool.submit(Box::new(move || tx.send(()).unwrap()));
        assert!(!pool.is_idle(), "one running, one queued");
        go_tx.send(()).unwrap();
        done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pool.is_idle() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(pool.is_idle(), "both done");
    }

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap()
    }

    fn desc(addr: u64, len: u32, write: bool) -> RawDescriptor {
        let flags = if write { VRING_DESC_F_WRITE as u16 } else { 0 };
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0))
    }

    /// The transport's walk of `chain` (checked against the reference walk).
    fn walk<'m>(
        m: &'m GuestMemoryMmap,
        vq: &MockSplitQueue<GuestMemoryMmap>,
        chain: virtio_queue::DescriptorChain<&GuestMemoryMmap>,
    ) -> Result<Split<'m>, String> {
        let at = ChainAt {
            table: vq.desc_table_addr().0,
            size: 16,
            head: chain.head_index(),
        };
        let fast = crate::transport::vring_chain::walk_chain(m, at, None);
        assert_eq!(fast.is_ok(), split_chain(m, chain).is_ok());
        fast
    }

    fn backend() -> FsBackend<MemFs> {
        let server = Arc::new(Server::new(
            MemFs::new().unwrap(),
            Box::new(NoMapper),
            ServerOptions::default(),
        ));
        let cfg = FsBackendConfig {
            tag: Some("fs".into()),
            request_queues: 2,
            thread_pool_size: 0,
            notify: None,
        };
        FsBackend::new(server, &cfg, None).unwrap()
    }

    /// Runs one chain through the transport; returns the used length.
    fn run(m: &GuestMemoryMmap, descs: &[RawDescriptor]) -> u32 {
        let vq = MockSplitQueue::new(m, 16);
        let chain = vq.build_desc_chain(descs).unwrap();
        let b = backend();
        match walk(m, &vq, chain) {
            Ok((r, w)) => {
                let w = (!w.is_empty()).then(|| Writer::with_far(w, None));
                b.server()
                    .handle(Reader::with_far(r, None), w)
                    .map(|h| h.written as u32)
                    .unwrap_or(0)
            }
            Err(_) => 0,
        }
    }

    fn put_init(m: &GuestMemoryMmap, at: u64) -> u32 {
        let hdr = InHeader {
            len: 40 + 64,
            opcode: opcode::INIT,
            unique: 7,
            ..Default::default()
        };
        m.write_obj(hdr, GuestAddress(at)).unwrap();
        let init = crate::protocol::abi::InitIn {
            major: 7,
            minor: 41,
            ..Default::default()
        };
        m.write_obj(init, GuestAddress(at + 40)).unwrap();
        40 + 64
    }

    /// The queue thread keeps only requests that end by themselves soon
    /// ([`crate::protocol::policy`]). COPY_FILE_RANGE (up to 4 GiB copied on the host) was
    /// missing: it ran on the queue's thread and held back every request behind it.
    #[test]
    fn waiting_and_long_requests_leave_the_queue_thread() {
        // MemFs keeps the default: a FLUSH may write back.
        let b = backend();
        let may_block = |o: u32| {
            let hdr = InHeader {
                opcode: o,
                nodeid: 1,
                ..Default::default()
            };
            b.server.wait(&hdr) != Wait::Short
        };
        for o in [
            opcode::SETLKW,
            opcode::FSYNC,
            opcode::FSYNCDIR,
            opcode::SYNCFS,
            opcode::FLUSH,
            opcode::FALLOCATE,
            opcode::COPY_FILE_RANGE,
        ] {
            assert!(may_block(o), "{}", opcode::name(o));
        }
        for o in [opcode::SETLK, opcode::READ, opcode::WRITE, opcode::RELEASE] {
            assert!(!may_block(o), "{}", opcode::name(o));
        }
    }

    #[test]
    fn request_split_across_descriptors_is_served() {
        let m = mem();
        let len = put_init(&m, 0x10_0000);
        // The request in two readable pieces, the reply in two writable pieces.
        let descs = [
            desc(0x10_0000, 10, false),
            desc(0x10_0000 + 10, len - 10, false),
            desc(0x18_0000, 8, true),
            desc(0x19_0000, 4096, true),
        ];
        assert_eq!(run(&m, &descs), 16 + 64);
        let out: OutHeader = m.read_obj(GuestAddress(0x18_0000)).unwrap();
        assert_eq!(out.len, 16 + 64);
        // The header's second half (`unique`) landed in the second writable descriptor.
        let unique: u64 = m.read_obj(GuestAddress(0x19_0000)).unwrap();
        assert_eq!(unique, 7);
        assert_eq!(out.error, 0);
    }

    #[test]
    fn malformed_chains_are_dropped() {
        let m = mem();
        let len = put_init(&m, 0x10_0000);
        let reply = desc(0x18_0000, 4096, true);
        // Writable before readable.
        let vq = MockSplitQueue::new(&m, 16);
        let chain = vq
            .build_desc_chain(&[reply, desc(0x10_0000, len, false)])
            .unwrap();
        assert!(walk(&m, &vq, chain)
            .unwrap_err()
            .contains("after a writable"));
        // Pointing outside guest memory.
        let vq = MockSplitQueue::new(&m, 16);
        let chain = vq
            .build_desc_chain(&[desc(MEM as u64 - 8, 64, false), reply])
            .unwrap();
        assert!(walk(&m, &vq, chain)
            .unwrap_err()
            .contains("outside guest memory"));
        let vq = MockSplitQueue::new(&m, 16);
        let chain = vq
            .build_desc_chain(&[desc(u64::MAX - 8, 64, false), reply])
            .unwrap();
        assert!(walk(&m, &vq, chain).is_err());
        // No readable part.
        let vq = MockSplitQueue::new(&m, 16);
        let chain = vq.build_desc_chain(&[reply]).unwrap();
        assert!(walk(&m, &vq, chain).is_err());
    }

    #[test]
    fn short_chains_get_no_reply_and_no_panic() {
        let m = mem();
        let len = put_init(&m, 0x10_0000);
        // Header cut short: dropped.
        assert_eq!(
            run(
                &m,
                &[desc(0x10_0000, 20, false), desc(0x18_0000, 4096, true)]
            ),
            0
        );
        // No room for a reply header: dropped.
        assert_eq!(
            run(&m, &[desc(0x10_0000, len, false), desc(0x18_0000, 8, true)]),
            0
        );
        // Reply room for the header only: an error reply fits.
        assert_eq!(
            run(
                &m,
                &[desc(0x10_0000, len, false), desc(0x18_0000, 16, true)]
            ),
            16
        );
        let out: OutHeader = m.read_obj(GuestAddress(0x18_0000)).unwrap();
        assert_eq!(out.error, -libc::ENOBUFS);
    }

    /// Every queue is served by exactly one thread, and the event number vhost-user-backend
    /// gives its kick there (the rank of its bit in the thread's mask) leads back to it.
    #[test]
    fn every_queue_has_one_thread_and_its_events_lead_back_to_it() {
        for shared in [2, 3] {
            for n in 1..=10 {
                let masks = thread_masks(n, shared);
                assert_eq!(masks.len(), n.max(shared) - shared + 1, "{n} queues");
                for q in 0..n {
                    let owners: Vec<usize> = (0..masks.len())
                        .filter(|&t| masks[t] >> q & 1 == 1)
                        .collect();
                    assert_eq!(owners.len(), 1, "queue {q} of {n}");
                    let t = owners[0];
                    // vhost-user-backend's rule (handler.rs, set_vring_kick).
                    let evt = masks[t].count_ones() - (masks[t] >> q).count_ones();
                    assert_eq!(queue_of(t, evt as u16, shared), q, "queue {q} of {n}");
                }
            }
        }
        assert_eq!(thread_masks(3, 2), vec![0b11, 0b100]);
        assert_eq!(thread_masks(4, 3), vec![0b111, 0b1000]);
    }

    #[test]
    fn config_space_and_features() {
        let b = backend();
        let cfg = b.get_config(0, 40);
        assert_eq!(&cfg[..2], b"fs");
        assert_eq!(u32::from_le_bytes(cfg[36..40].try_into().unwrap()), 2);
        assert_eq!(b.get_config(36, 4), 2u32.to_le_bytes());
        assert!(b.get_config(30, 20).is_empty(), "out-of-range read refused");
        assert!(b.get_config(u32::MAX, 2).is_empty());
        assert_eq!(b.num_queues(), 3);
        assert!(b
            .protocol_features()
            .contains(VhostUserProtocolFeatures::CONFIG));
        assert!(!b
            .protocol_features()
            .contains(VhostUserProtocolFeatures::SHMEM));
        assert!(b.get_shmem_config().is_err());
        let server = Arc::new(Server::new(
            MemFs::new().unwrap(),
            Box::new(NoMapper),
            ServerOptions::default(),
        ));
        let cfg = FsBackendConfig {
            tag: None,
            request_queues: 1,
            thread_pool_size: 0,
            notify: None,
        };
        let b = FsBackend::new(server, &cfg, None).unwrap();
        assert!(
            !b.protocol_features()
                .contains(VhostUserProtocolFeatures::CONFIG),
            "no tag, no CONFIG (QEMU 7.x)"
        );
        assert!(b.get_config(0, 40).is_empty());
    }
}
