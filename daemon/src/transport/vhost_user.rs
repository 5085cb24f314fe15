//! The vhost-user transport: virtqueue descriptor chains in, FUSE requests to the server,
//! replies back into the chains.
//!
//! Queue 0 is the high-priority queue (FORGET), queues 1..=N are request queues; with a
//! negotiated notification queue ([`super::notify_queue`]) queue 1 is that one and the
//! request queues are 2..=N+1. Queue 0, the notification queue and the first request queue
//! share a worker thread, further queues have threads of their own up to one per CPU but
//! one (`thread_masks`, `ThreadPlan`), so a multi-queue guest is served on several cores.
//! Guest memory comes from the frontend's memory table; every descriptor is resolved to
//! host memory through `vm-memory`, which bounds-checks it.
//!
//! This file is the backend (the vhost-user messages and the queue threads). Its helpers live
//! beside it: [`super::queue_state`] (a vring's requests in flight, completions and
//! notifications), [`super::chain_request`] (a chain decoded once and served, here or on a
//! pool thread), [`super::worker_pool`] (the pools, and whether a queue thread looks before it
//! sleeps), [`super::window_regions`] (the DAX window's regions of the memory table) and
//! [`super::dirty_log`] (a reply's pages in the migration log).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
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
use vm_memory::{ByteValued, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use super::chain_request::refuse;
pub(crate) use super::chain_request::{decode, serve, Walked};
use super::notify_queue::{NotifyQueue, VIRTIO_FS_F_NOTIFICATION};
use super::queue_state::{
    enable_notification, signal, signal_needed, Done, QueueShared, QueueState,
};
use super::ring_records::{take_over, RingRecords};
use super::ring_view::{requests_waiting, RingView};
use super::window_regions::{without_window_files, Window, NO_BASE};
use super::worker_pool::{Awake, Pool, Seen, ThreadPlan, POLL_BEFORE_SLEEP};
use crate::protocol::abi::VirtioFsConfig;
use crate::protocol::filesystem::FileSystem;
use crate::protocol::iobuf::FarIo;
use crate::protocol::notify::{Notifier, NOTIFY_BUF_SIZE};
use crate::protocol::policy::Wait;
use crate::protocol::server::Server;
use crate::transport::vring_chain::{walk, ChainAt};

/// Guest memory as the backend sees it: with a dirty-page bitmap that the frontend's log
/// (SET_LOG_BASE, during a live migration) replaces.
pub type GuestMemoryLogged = GuestMemoryMmap<BitmapMmapRegion>;
pub type GuestMem = GuestMemoryAtomic<GuestMemoryLogged>;
pub(super) type FsVring = VringRwLock<GuestMem>;
/// One load of [`GuestMem`]: the table a queue thread's turn works in.
pub(super) type Mem = vm_memory::atomic::GuestMemoryLoadGuard<GuestMemoryLogged>;

/// Largest queue the frontend may set up.
pub const MAX_QUEUE_SIZE: usize = 1024;
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
/// Requests the first request queue serves at most before it looks at the hiprio queue that
/// shares its thread (FORGETs must not wait for a request queue the guest keeps full).
const HIPRIO_EVERY: usize = 32;
/// Requests a thread serving several request queues takes from one of them at most before it
/// turns to the next (a queue the guest keeps full holds the others back by one turn at most).
const ROUND: usize = 32;
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
    /// Whether `file` is a host file the window mapped (at any offset): the frontend's region
    /// of it may fault when a host process shrinks the file, so it never resolves descriptors.
    fn backs_window(&self, _file: &std::fs::File) -> bool {
        false
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

/// Backend options.
#[derive(Debug, Clone)]
pub struct FsBackendConfig {
    /// Tag for the config space; `None` leaves the config space (and the CONFIG protocol
    /// feature, which QEMU 7.1 to 8.0 crash on) out.
    pub tag: Option<String>,
    pub request_queues: usize,
    /// Worker threads shared by the request queues (virtiofsd's `--thread-pool-size`), at
    /// most one per CPU but one ([`ThreadPlan`]); 0, and 1 behind one queue thread, serve
    /// requests on their queue's thread. With one queue thread, a pool with no job queued or
    /// running leaves the last request in sight to the queue's thread too (`Pool::is_idle`).
    /// Requests that may block indefinitely always run on threads of their own, whatever
    /// this is.
    pub thread_pool_size: usize,
    /// Host changes for the guest: offers the notification queue (one more vring).
    pub notify: Option<Arc<Notifier>>,
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
    /// Threads serving the request queues ([`ThreadPlan`]).
    queue_threads: usize,
    /// The queues of each of them ([`thread_masks`]).
    masks: Vec<u64>,
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
    /// With `--restartable`: what each vring popped and not completed, kept by the holder.
    records: Option<Arc<RingRecords>>,
    /// Bit i set: vring i was checked against `records` since it last started.
    resumed: AtomicU64,
}

/// Which queues each worker thread serves (`queues_per_thread`): the first `shared` queues
/// (the hiprio queue, the notification queue when offered, and the first request queue)
/// share a thread; the further request queues go to `threads` threads in turn (the first
/// one included), one each where there are as many threads as request queues.
///
/// FORGETs arrive on the hiprio queue and take the inode table's lock that the LOOKUPs of
/// the request queue take. On threads of their own the two contended for it: a `--cache
/// never` tree unpack in a TCG guest (1,551 entries) made 29,800 hiprio wake-ups and 31,500
/// futex calls in the daemon, against 2,100 futex calls on one shared thread (virtiofsd
/// serves all its queues on one thread: 5). A hiprio request is short and never waits, so
/// sharing delays no request queue for long.
fn thread_masks(num_queues: usize, shared: usize, threads: usize) -> Vec<u64> {
    let num_queues = num_queues.min(64);
    let extra = num_queues.saturating_sub(shared);
    let threads = threads.clamp(1, extra + 1);
    let mut masks = vec![0u64; threads];
    masks[0] = (1u64 << num_queues.min(shared)) - 1;
    for (i, q) in (shared..num_queues).enumerate() {
        masks[(i + 1) % threads] |= 1u64 << q;
    }
    masks
}

/// The queue behind `device_event` of worker `thread` ([`thread_masks`]): vhost-user-backend
/// numbers a thread's events by the rank of the queue's bit in the thread's mask.
fn queue_of(masks: &[u64], thread: usize, device_event: u16) -> usize {
    let mut m = masks.get(thread).copied().unwrap_or(0);
    for _ in 0..device_event {
        m &= m.wrapping_sub(1);
    }
    // No such event: a queue number no vring has (the caller finds no vring for it).
    if m == 0 {
        64
    } else {
        m.trailing_zeros() as usize
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
        let plan = ThreadPlan::for_host(cfg.request_queues, cfg.thread_pool_size);
        let pool = (plan.pool > 0)
            .then(|| Pool::new("fs-worker", plan.pool, plan.pool, Some(awake.clone())));
        let notify_queues = usize::from(cfg.notify.is_some());
        let masks = thread_masks(
            cfg.request_queues + 1 + notify_queues,
            2 + notify_queues,
            plan.queue_threads,
        );
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
            queue_threads: plan.queue_threads,
            masks,
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
            records: None,
            resumed: AtomicU64::new(0),
        })
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

    /// Records what each vring popped and completed in `records` (a region the holder of
    /// `--restartable` keeps), and resumes vrings a previous process left live there.
    pub fn with_ring_records(mut self, records: Arc<RingRecords>) -> Self {
        for (i, q) in self.queues.iter().enumerate() {
            let _ = q.records.set((records.clone(), i));
        }
        self.records = Some(records);
        self
    }

    /// At the first kick of vring `queue` since it started: when the process before this one
    /// left it live (it died), takes the ring over where it stopped and serves again the
    /// requests it had popped and not completed ([`RingRecords::start`]).
    fn resume_once(&self, queue: usize, vring: &FsVring) {
        let Some(records) = &self.records else { return };
        let bit = queue_bit(queue);
        if self.resumed.fetch_or(bit, Ordering::SeqCst) & bit != 0 {
            return;
        }
        let Some(atomic) = self.memory() else { return };
        let mem = atomic.memory();
        let in_order = self.is_notify_queue(queue);
        let Some(at) = take_over(records, queue, vring, &mem, in_order) else {
            return;
        };
        let Some(q) = self.queues.get(queue) else {
            return;
        };
        for chain in at {
            // The server answers a removal that finds its name gone as done (the dead
            // server did it).
            let far = self.window.as_deref();
            let split = walk(&mem, chain, far.and_then(Window::at));
            if let Ok(req) = decode(split, far.map(|w| w as &dyn FarIo)) {
                self.server.note_served_again(req.hdr.unique);
            }
            let epoch = {
                let mut s = q.lock();
                s.inflight += 1;
                s.epoch
            };
            self.serve_chain(queue, q, vring, chain, epoch, &atomic);
        }
        q.flush(vring, &mem);
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

    /// Serves the request queues `set` (one thread's: [`thread_masks`]) until all of them are
    /// empty, in one loop and one sleep for all: turns of at most
    /// [`ROUND`] requests per queue, starting with `set[0]` (the kicked one), so that a queue
    /// the guest keeps full holds the others back by a turn at most. `hiprio`: the hiprio
    /// vring, when the thread serves it too: served in between, every [`HIPRIO_EVERY`]
    /// requests and while waiting for room, so that a request queue the guest keeps full
    /// never holds its FORGETs back (each one pins a host descriptor and an inode table entry
    /// until it is served). `look`: whether to look before sleeping: only where the thread
    /// serves one request queue. (Not for the hiprio queue: its thread looks at its request
    /// queue. Not over several queues: on 2 cores, 4 queues on one thread spent 2.86 us of
    /// daemon CPU per 4 KiB READ at depth 16 with a look against 2.38 without, and made no
    /// steady gain in rate: the driver, busy with 4 rings, fed the look one request at a
    /// time.)
    ///
    /// Serving each queue of a thread on its own (one epoll event and one batch each) cost 4
    /// request queues on one thread 1.07x-1.08x the instructions per request of one queue;
    /// one loop, 1.05x (protobench at depth 16; bench/HISTORY.md, 2026-11-28): each queue's
    /// own turn (its empty pop, its EVENT_IDX check and signal, its re-enabled notification),
    /// four per batch instead of one. With the ring fields through kept pointers
    /// ([`RingView`]) and the flush under the empty pop's locks, 1.00x-1.04x.
    fn process_queues(
        &self,
        set: &[(usize, &FsVring)],
        hiprio: Option<&FsVring>,
        look: bool,
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
        // A vring served without its kick (hiprio in between) may be popped before its own
        // kick is seen. (The thread's other queues: at their turns, once started.)
        if let Some(&(queue, vring)) = set.first() {
            self.resume_once(queue, vring);
        }
        // The queue's look (used only where the thread serves this one request queue).
        let looks = set
            .first()
            .and_then(|&(queue, _)| self.queues.get(queue))
            .map(|q| &q.look)
            .filter(|_| look);
        let event_idx = self.event_idx.load(Ordering::Relaxed);
        let _awake = self.awake.wake();
        let mut since_hiprio = 0usize;
        // Bit i set: set[i] stopped while waiting for room (not served again in this call).
        let mut stopped = 0u64;
        // Bit i set: set[i] was kicked (i = 0) or popped in this call: its notifications are
        // re-enabled before the thread sleeps. The others' still are: their `avail_event` was
        // written after they were last popped, and nothing popped them since. (At depth 1 a
        // wake-up finds a request on the kicked queue only: 4 queues re-enabled cost each
        // request 3 vring locks, memory-table loads and guest stores more than 1 queue.)
        let mut touched = 1u64;
        // No notification is disabled here: with EVENT_IDX the guest kicks only when its
        // index passes the `avail_event` the last `enable_notification` wrote, so they stay
        // off while the thread serves (virtio-queue's `disable_notification` does nothing
        // then; a call per queue per round cost a vring lock and a memory-table load each);
        // without EVENT_IDX they are never disabled (every loop ends after one pass).
        loop {
            // One load of the memory table for the round's pops, flushes and re-enabled
            // notifications (a new table is seen at the next round).
            let mem = atomic.memory();
            // Whether a turn ended with requests left (another round follows at once).
            let mut left = false;
            for (i, &(queue, vring)) in set.iter().enumerate() {
                if stopped >> i & 1 == 1 || self.is_notify_queue(queue) {
                    continue;
                }
                let Some(q) = self.queues.get(queue) else {
                    continue;
                };
                // Served ahead of its own kick: taken over first where a previous process left
                // it live (`--restartable`), once the frontend started it (a vring not started
                // has no ring to read; its pops find nothing).
                if i > 0 && self.records.is_some() && vring.get_ref().get_queue().ready() {
                    self.resume_once(queue, vring);
                }
                let mut taken = 0;
                loop {
                    if set.len() > 1 && taken == ROUND {
                        left = true;
                        break;
                    }
                    since_hiprio += 1;
                    if since_hiprio >= HIPRIO_EVERY {
                        since_hiprio = 0;
                        self.serve_hiprio(hiprio, &atomic);
                    }
                    let Some((epoch, chain)) =
                        self.pop_with_room(queue, q, vring, hiprio, &atomic, &mem)
                    else {
                        stopped |= 1 << i;
                        break;
                    };
                    let at = match chain {
                        Ok(at) => at,
                        Err(due) => {
                            // Empty: what its turn completed goes to the guest now, whatever
                            // the other queues hold (checked with the empty pop).
                            if due {
                                signal(vring);
                            }
                            break;
                        }
                    };
                    self.serve_chain(queue, q, vring, at, epoch, &atomic);
                    taken += 1;
                    touched |= 1 << i;
                }
            }
            if stopped.count_ones() as usize >= set.len() {
                return Ok(());
            }
            if left {
                continue;
            }
            // A guest with requests in flight often sends the next one within microseconds:
            // look for it briefly before sleeping in epoll (a wake-up from an idle core costs
            // far more than the look), unless recent looks found nothing ([`Look`]) or more
            // threads are awake than there are cores to spare ([`Awake`]).
            if let Some(l) = looks {
                if l.due() && self.awake.may_look() {
                    let seen = Self::more_soon(set, &atomic);
                    l.found(seen);
                    if seen != Seen::Nothing {
                        continue;
                    }
                }
            }
            if !event_idx {
                break;
            }
            let mut more = false;
            for (i, &(queue, vring)) in set.iter().enumerate() {
                if stopped >> i & 1 == 0 && touched >> i & 1 == 1 {
                    if let Some(q) = self.queues.get(queue) {
                        more |= enable_notification(q, vring, &mem)?;
                    }
                }
            }
            if !more {
                break;
            }
        }
        Ok(())
    }

    /// Pops the next chain once fewer than a ring's worth of requests are in flight, with the
    /// epoch it was popped in; `None` when the vring stopped while waiting for room. The
    /// epoch and the pop under one lock: a reset cannot fall between them. A ring found empty
    /// is flushed under the same locks (`Err`: whether the guest is to be signalled for the
    /// completions held back, which the caller does once the locks are dropped): one lock of
    /// the queue and the vring for the empty pop and the flush of each turn.
    fn pop_with_room(
        &self,
        queue: usize,
        q: &QueueShared,
        vring: &FsVring,
        hiprio: Option<&FsVring>,
        atomic: &GuestMem,
        mem: &Mem,
    ) -> Option<(u64, Result<ChainAt, bool>)> {
        let mut s = q.lock();
        // Backpressure: at most a ring's worth of requests in flight. A guest
        // that republishes heads it has not had back (virtio-queue does not
        // track them) waits here until its requests complete, instead of
        // queueing work for the pools without bound.
        let mut warned = false;
        let mut chain = loop {
            {
                // One lock of the vring for the bound and the pop.
                let mut v = vring.get_mut();
                let vq = v.get_queue_mut();
                let limit = usize::from(vq.size()).max(1);
                if s.inflight < limit {
                    let chain = self.pop(queue, vq, &mut s, mem);
                    break chain.ok_or_else(|| signal_needed(&mut s, vq, mem));
                }
                if !vq.ready() {
                    return None;
                }
                if !warned {
                    log::debug!("queue {queue}: {limit} requests in flight; waiting");
                    warned = true;
                }
            }
            if hiprio.is_some_and(|h| Self::has_request(h, mem)) {
                drop(s);
                self.serve_hiprio(hiprio, atomic);
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
        };
        if chain.is_ok() {
            s.inflight += 1;
            // A vring stopped and restarted while this loop ran (a `stop`/`cont`
            // during a long request) gives its next request here, before the
            // thread sees the restart's kick: it runs on a started device.
            if self.running.load(Ordering::SeqCst) & queue_bit(queue) == 0 {
                self.mark_running(queue);
            }
        } else if s.drain_waiters > 0 {
            // A vring stop waits for this flush: the guest is signalled before the stop
            // hears of it (as `QueueShared::flush` does).
            if chain == Err(true) {
                signal(vring);
                chain = Err(false);
            }
            if s.inflight == 0 {
                q.drained.notify_all();
            }
        }
        Some((s.epoch, chain))
    }

    /// Serves one popped chain: walked once, its header read once, then served here or
    /// handed to a pool by what the request may wait for.
    fn serve_chain(
        &self,
        queue: usize,
        q: &Arc<QueueShared>,
        vring: &FsVring,
        at: ChainAt,
        epoch: u64,
        atomic: &GuestMem,
    ) {
        let head = at.head;
        // Walked once, its header read once, here: the opcode of this one copy picks
        // the thread, and the thread serves this copy and these buffers (the guest
        // may rewrite its descriptors and its header meanwhile). A chain this walk
        // finds no request in is dropped here, never walked again elsewhere.
        let mem = atomic.memory();
        let far = self.window.as_deref();
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
                q.complete(vring, done, true, atomic);
                return;
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
            // queue thread only (more queue threads serving at once would exceed a
            // pool of one).
            self.pool.as_ref().filter(|p| {
                !(self.queue_threads == 1 && p.is_idle() && !Self::has_request(vring, &mem))
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
                q.complete(vring, done, true, atomic);
            }
            Some(pool) => {
                // SAFETY: `req` was decoded from `walk` over `mem` just above.
                let job = unsafe { Walked::of(mem.clone(), req, self.window.clone()) };
                let (server, q, vring) = (self.server.clone(), q.clone(), vring.clone());
                let atomic = atomic.clone();
                pool.submit(Box::new(move || {
                    let used = job.serve(&server);
                    let done = Done {
                        head,
                        used,
                        epoch,
                        blocking,
                    };
                    q.complete(&vring, done, false, &atomic);
                }));
            }
        }
    }

    /// Serves what the hiprio queue holds (FORGET, INTERRUPT), from the thread of the request
    /// queue that shares it.
    fn serve_hiprio(&self, hiprio: Option<&FsVring>, mem: &GuestMem) {
        let Some(h) = hiprio else { return };
        if !Self::has_request(h, &mem.memory()) {
            return;
        }
        if let Err(e) = self.process_queues(&[(0, h)], None, false) {
            log::error!("queue 0: {e}");
        }
    }

    /// Whether the guest makes a new request available on one of `set` within
    /// [`POLL_BEFORE_SLEEP`], and whether the look was preempted (it overran its own length:
    /// the core is wanted by another thread, and [`Look`](super::worker_pool::Look) counts
    /// that as a miss).
    fn more_soon(set: &[(usize, &FsVring)], mem: &GuestMem) -> Seen {
        let deadline = Instant::now() + POLL_BEFORE_SLEEP;
        // Still looking past this: the thread was preempted.
        let late = deadline + POLL_BEFORE_SLEEP;
        let mem = mem.memory();
        loop {
            let more = set.iter().any(|&(_, v)| Self::has_request(v, &mem));
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

    /// Whether the guest has made a request available that is not popped yet (an avail index
    /// more than a ring ahead is none: [`requests_waiting`]).
    fn has_request(vring: &FsVring, mem: &GuestMemoryLogged) -> bool {
        let v = vring.get_ref();
        let q = v.get_queue();
        q.ready()
            && q.avail_idx(mem, Ordering::Acquire)
                .is_ok_and(|i| requests_waiting(i.0, q.next_avail(), q.size()))
    }

    /// Takes the next available chain of `vq` (under the vring's lock and `s`, its queue's):
    /// where it is (the walk happens later, outside the vring lock). The avail index and the
    /// head are read through the vring's [`RingView`] (through virtio-queue where the rings
    /// cannot be), bounded as virtio-queue bounds them: an index more than a ring ahead is
    /// refused (logged), a head is any number (the walk refuses one past the table).
    fn pop(
        &self,
        queue: usize,
        vq: &mut virtio_queue::Queue,
        s: &mut QueueState,
        mem: &Mem,
    ) -> Option<ChainAt> {
        if !vq.ready() {
            return None;
        }
        let head = match RingView::of(&mut s.view, mem, vq) {
            Some(r) => {
                let next = vq.next_avail();
                let avail = r.avail_idx();
                if avail == next {
                    return None;
                }
                if avail.wrapping_sub(next) > vq.size() {
                    r.warn_bad_index(queue, avail, next);
                    return None;
                }
                let head = r.avail_entry(next);
                vq.set_next_avail(next.wrapping_add(1));
                head
            }
            None => vq.pop_descriptor_chain(&**mem)?.head_index(),
        };
        if let Some(r) = &self.records {
            r.popped(queue, head, vq.next_avail());
        }
        Some(ChainAt {
            table: vq.desc_table(),
            size: vq.size(),
            head,
        })
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
        if let Some(r) = &self.records {
            r.reset();
        }
        self.resumed.store(0, Ordering::SeqCst);
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
        drop(slot);
        // The vrings' views hold the old table's regions mapped: dropped now, resolved again
        // in the new table at their next use (a view is used only with the table it was
        // resolved in, so one in use meanwhile is never stale).
        for q in &self.queues {
            q.lock().view = None;
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
        self.masks.clone()
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
        if let Some(r) = &self.records {
            r.stopped(queue_index as usize);
        }
        self.resumed.fetch_and(!bit, Ordering::SeqCst);
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
        let queue = queue_of(&self.masks, thread_id, device_event);
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
        self.resume_once(queue, vring);
        if self.is_notify_queue(queue) {
            // The guest posted buffers: messages waiting go out.
            if let (Some(n), Some(mem)) = (&self.notify, self.memory()) {
                n.deliver(vring, &mem);
            }
            return Ok(());
        }
        // A broken queue must not end the worker: log and wait for the next kick.
        let served = if queue == 0 {
            self.process_queues(&[(0, vring)], None, false)
        } else {
            // The hiprio vring, served in between by the request queue(s) sharing its thread.
            let hiprio = (thread_id == 0).then(|| vrings.first()).flatten();
            // Every request queue of this thread, the kicked one first, then the others in
            // turn: served in one loop and one sleep for all.
            // On the stack for the usual few (filling 64 entries cost each wake-up ~130
            // stores).
            let ranks = vrings.len().min(64);
            let mut small = [(queue, vring); 8];
            let mut big = Vec::new();
            let set: &mut [(usize, &FsVring)] = if ranks <= small.len() {
                &mut small
            } else {
                big.resize(ranks, (queue, vring));
                &mut big
            };
            let mut n = 1;
            let kicked = usize::from(device_event);
            for r in (kicked + 1..ranks).chain(0..kicked) {
                let q = queue_of(&self.masks, thread_id, r as u16);
                if q != 0 && q < self.queues.len() && !self.is_notify_queue(q) {
                    set[n] = (q, &vrings[r]);
                    n += 1;
                }
            }
            self.process_queues(&set[..n], hiprio, n == 1)
        };
        if let Err(e) = served {
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
#[path = "vhost_user_tests.rs"]
mod tests;
