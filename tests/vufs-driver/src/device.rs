//! The vhost-user frontend: connects to a backend socket, negotiates features and sets up
//! guest memory, virtqueues and the DAX window with the message sequence QEMU uses for a
//! virtio-fs device, then moves descriptor chains.

use std::io;
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use daxfsd::abi::VirtioFsConfig;
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserHeaderFlag};
use vhost::vhost_user::{
    Frontend, FrontendReqHandler, VhostUserFrontend, VhostUserProtocolFeatures,
    VhostUserVirtioFeatures,
};
use vhost::{VhostBackend, VringConfigData};
use vm_memory::ByteValued;

use crate::dax::{DaxWindow, Handler, ReqThread};
use crate::memory::GuestMem;
use crate::queue::{Chain, Completion, Pending, Queue};

/// `VIRTIO_F_VERSION_1`.
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;
/// `VIRTIO_FS_F_NOTIFICATION`.
pub const VIRTIO_FS_F_NOTIFICATION: u64 = 1 << 0;
/// `VIRTIO_RING_F_INDIRECT_DESC`.
pub const VIRTIO_RING_F_INDIRECT_DESC: u64 = 1 << 28;
/// `VIRTIO_RING_F_EVENT_IDX`.
pub const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << 29;

/// Whether to use an optional feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeatureMode {
    /// Use it if the backend offers it.
    Auto,
    /// Require it: connecting fails if the backend does not offer it.
    On,
    /// Never use it.
    Off,
}

/// How to set up the device.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// Guest RAM size (rounded up to 2 MiB).
    pub mem_size: u64,
    /// Guest physical address of guest RAM (non-zero by default, to catch backends that
    /// confuse guest addresses with offsets).
    pub mem_base: u64,
    /// Entries per virtqueue (a power of two).
    pub queue_size: u16,
    pub event_idx: FeatureMode,
    pub indirect_desc: FeatureMode,
    /// Use at most this many request queues (default: all the device has).
    pub max_request_queues: Option<usize>,
    /// Timeout of every vhost-user message and every request.
    pub timeout: Duration,
    /// DAX window size; default: region 0 of `GET_SHMEM_CONFIG`.
    pub dax_window: Option<u64>,
    /// Protocol features to accept (of those offered).
    pub protocol_features: VhostUserProtocolFeatures,
    /// Set NEED_REPLY on every message without a reply once REPLY_ACK is negotiated, so a
    /// rejected message fails where it happens.
    pub need_reply: bool,
    /// Fill device-writable buffers with [`crate::queue::POISON`] before submitting.
    pub poison: bool,
    /// Put the DAX window at this guest-physical address and report each window mapping in
    /// the memory table, as QEMU 11.1 does (`None`: the window is in no memory table).
    pub window_gpa: Option<u64>,
    /// Negotiate the notification queue (`VIRTIO_FS_F_NOTIFICATION`) when offered: queue 1
    /// is then the notification queue and request queues start at 2.
    pub notification: bool,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            mem_size: 128 << 20,
            mem_base: 1 << 30,
            queue_size: 256,
            event_idx: FeatureMode::Auto,
            indirect_desc: FeatureMode::Auto,
            max_request_queues: None,
            timeout: Duration::from_secs(10),
            dax_window: None,
            protocol_features: VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::REPLY_ACK
                | VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::BACKEND_REQ
                | VhostUserProtocolFeatures::BACKEND_SEND_FD
                | VhostUserProtocolFeatures::SHMEM,
            need_reply: true,
            poison: true,
            window_gpa: None,
            notification: false,
        }
    }
}

/// What the handshake found.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub backend_features: u64,
    pub acked_features: u64,
    pub backend_protocol_features: u64,
    pub acked_protocol_features: u64,
    /// `GET_QUEUE_NUM` (with MQ).
    pub queue_num: Option<u64>,
    /// `GET_CONFIG` (with CONFIG).
    pub config: Option<VirtioFsConfig>,
    /// The tag from the config space, up to its first NUL.
    pub tag: Option<String>,
    /// Request queues in use (queues 1..=n).
    pub num_request_queues: usize,
    /// Region sizes from `GET_SHMEM_CONFIG` (with SHMEM).
    pub shmem_sizes: Vec<u64>,
    pub event_idx: bool,
    pub indirect_desc: bool,
    /// The notification queue was negotiated (queue 1; requests on 2..).
    pub notification: bool,
}

/// A started virtio-fs device on a vhost-user connection.
pub struct Device {
    frontend: Mutex<Option<Frontend>>,
    sock: Arc<UnixStream>,
    mem: Arc<GuestMem>,
    queues: Vec<Arc<Queue>>,
    info: DeviceInfo,
    dax: Option<Arc<DaxWindow>>,
    handler: Option<Arc<Handler>>,
    req_thread: Mutex<Option<ReqThread>>,
    timeout_ms: AtomicU64,
    need_reply: bool,
}

fn vu(op: &'static str) -> impl FnOnce(vhost::Error) -> io::Error {
    move |e| io::Error::other(format!("vhost-user {op}: {e}"))
}

/// Connects to `path`, retrying while the socket does not exist yet or refuses, until
/// `timeout`.
pub fn connect_socket(path: &Path, timeout: Duration) -> io::Result<UnixStream> {
    let deadline = Instant::now() + timeout;
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("connecting to {}: {e}", path.display()),
                ))
            }
        }
    }
}

impl Device {
    /// Connects to the backend socket at `path` and starts the device.
    pub fn connect(path: &Path, cfg: &DriverConfig) -> io::Result<Arc<Device>> {
        let sock = connect_socket(path, cfg.timeout)?;
        Device::from_stream(sock, cfg)
    }

    /// Starts the device on a connected socket.
    pub fn from_stream(sock: UnixStream, cfg: &DriverConfig) -> io::Result<Arc<Device>> {
        sock.set_read_timeout(Some(cfg.timeout))?;
        sock.set_write_timeout(Some(cfg.timeout))?;
        let sock2 = Arc::new(sock.try_clone()?);
        let mut fe = Frontend::from_stream(sock, 64);

        // Initialisation, in QEMU's order (vhost_user_backend_init, then vhost_dev_init).
        let features = fe.get_features().map_err(vu("GET_FEATURES"))?;
        if features & VIRTIO_F_VERSION_1 == 0 {
            return Err(io::Error::other(format!(
                "backend features {features:#x} lack VIRTIO_F_VERSION_1 (virtio-fs is modern-only)"
            )));
        }
        let has_pf = features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0;
        let (mut offered_pf, mut pf) = (0, VhostUserProtocolFeatures::empty());
        if has_pf {
            let offered = fe
                .get_protocol_features()
                .map_err(vu("GET_PROTOCOL_FEATURES"))?;
            offered_pf = offered.bits();
            pf = offered & cfg.protocol_features;
            fe.set_protocol_features(pf)
                .map_err(vu("SET_PROTOCOL_FEATURES"))?;
        }
        let need_reply = cfg.need_reply && pf.contains(VhostUserProtocolFeatures::REPLY_ACK);
        let queue_num = if pf.contains(VhostUserProtocolFeatures::MQ) {
            let n = fe.get_queue_num().map_err(vu("GET_QUEUE_NUM"))?;
            if n < 2 {
                return Err(io::Error::other(format!(
                    "GET_QUEUE_NUM says {n}: virtio-fs needs hiprio + at least one request queue"
                )));
            }
            Some(n)
        } else {
            None
        };

        let (handler, server) = if pf.contains(VhostUserProtocolFeatures::BACKEND_REQ) {
            let handler = Arc::new(Handler {
                window: OnceLock::new(),
                errors: Mutex::new(Vec::new()),
                report: OnceLock::new(),
            });
            let mut server = FrontendReqHandler::new(Arc::clone(&handler))
                .map_err(|e| io::Error::other(e.to_string()))?;
            server.set_reply_ack_flag(pf.contains(VhostUserProtocolFeatures::REPLY_ACK));
            let tx = server.get_tx_raw_fd();
            acked(&mut fe, need_reply, |fe| fe.set_backend_request_fd(&tx))
                .map_err(vu("SET_BACKEND_REQ_FD"))?;
            (Some(handler), Some(server))
        } else {
            (None, None)
        };

        acked(&mut fe, need_reply, |fe| fe.set_owner()).map_err(vu("SET_OWNER"))?;
        fe.get_features().map_err(vu("GET_FEATURES"))?;

        let (config, tag) = if pf.contains(VhostUserProtocolFeatures::CONFIG) {
            // Tag and request queues (40 bytes) every device has; notify_buf_size only with
            // the notification feature.
            let mut raw = vec![0u8; std::mem::size_of::<VirtioFsConfig>()];
            let size = if features & VIRTIO_FS_F_NOTIFICATION != 0 {
                raw.len()
            } else {
                40
            };
            let (_, buf) = fe
                .get_config(
                    0,
                    size as u32,
                    VhostUserConfigFlags::empty(),
                    &vec![0u8; size],
                )
                .map_err(vu("GET_CONFIG"))?;
            if buf.len() < 40 {
                return Err(io::Error::other("GET_CONFIG: short config space"));
            }
            let n = buf.len().min(raw.len());
            raw[..n].copy_from_slice(&buf[..n]);
            let c = VirtioFsConfig::from_slice(&raw)
                .copied()
                .ok_or_else(|| io::Error::other("GET_CONFIG: short config space"))?;
            let end = c.tag.iter().position(|b| *b == 0).unwrap_or(c.tag.len());
            (
                Some(c),
                Some(String::from_utf8_lossy(&c.tag[..end]).into_owned()),
            )
        } else {
            (None, None)
        };
        let shmem_sizes = if pf.contains(VhostUserProtocolFeatures::SHMEM) {
            let c = fe.get_shmem_config().map_err(vu("GET_SHMEM_CONFIG"))?;
            let n = (c.nregions as usize).min(c.memory_sizes.len());
            c.memory_sizes[..n].to_vec()
        } else {
            Vec::new()
        };

        // Queues: hiprio, the notification queue when negotiated, request queues.
        let notification = cfg.notification && features & VIRTIO_FS_F_NOTIFICATION != 0;
        let fixed = 1 + usize::from(notification);
        let mut nreq = match (&config, queue_num) {
            (Some(c), _) if c.num_request_queues > 0 => c.num_request_queues as usize,
            (_, Some(n)) => (n as usize).saturating_sub(fixed).max(1),
            _ => 1,
        };
        if let Some(n) = queue_num {
            nreq = nreq.min((n as usize).saturating_sub(fixed).max(1));
        }
        if let Some(m) = cfg.max_request_queues {
            nreq = nreq.min(m.max(1));
        }
        let use_feature = |mode: FeatureMode, bit: u64, name: &str| match mode {
            FeatureMode::Off => Ok(false),
            FeatureMode::Auto => Ok(features & bit != 0),
            FeatureMode::On if features & bit != 0 => Ok(true),
            FeatureMode::On => Err(io::Error::other(format!("backend does not offer {name}"))),
        };
        let event_idx = use_feature(cfg.event_idx, VIRTIO_RING_F_EVENT_IDX, "EVENT_IDX")?;
        let indirect = use_feature(
            cfg.indirect_desc,
            VIRTIO_RING_F_INDIRECT_DESC,
            "INDIRECT_DESC",
        )?;

        // The window: the configured size, else region 0 of GET_SHMEM_CONFIG.
        let size = cfg
            .dax_window
            .or(shmem_sizes.first().copied().filter(|s| *s > 0));
        let dax = match (&handler, size) {
            (Some(h), Some(size)) => {
                let w = Arc::new(DaxWindow::new(size)?);
                h.window
                    .set(Arc::clone(&w))
                    .map_err(|_| io::Error::other("DAX window set twice"))?;
                Some(w)
            }
            _ => None,
        };

        let mem = Arc::new(GuestMem::new(cfg.mem_base, cfg.mem_size)?);
        if let (Some(h), Some(w), Some(gpa)) = (&handler, &dax, cfg.window_gpa) {
            let rep = crate::dax::Reporter {
                fe: fe.clone(),
                ram: mem.region_info()?,
                gpa,
                host: w.as_ptr() as u64,
                maps: Mutex::new(Default::default()),
            };
            if h.report.set(rep).is_err() {
                return Err(io::Error::other("window reporter set twice"));
            }
        }
        let queues = (0..nreq + fixed)
            .map(|i| {
                Queue::new(
                    Arc::clone(&mem),
                    i as u16,
                    cfg.queue_size,
                    event_idx,
                    cfg.poison,
                    Some(Arc::clone(&sock2)),
                )
                .map(Arc::new)
            })
            .collect::<io::Result<Vec<_>>>()?;
        for (i, q) in queues.iter().enumerate() {
            acked(&mut fe, need_reply, |fe| fe.set_vring_call(i, q.call_fd()))
                .map_err(vu("SET_VRING_CALL"))?;
        }

        // Start (vhost_dev_start).
        let mut acked_features =
            VIRTIO_F_VERSION_1 | (features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits());
        if event_idx {
            acked_features |= VIRTIO_RING_F_EVENT_IDX;
        }
        if indirect {
            acked_features |= VIRTIO_RING_F_INDIRECT_DESC;
        }
        if notification {
            acked_features |= VIRTIO_FS_F_NOTIFICATION;
        }
        start_vrings(
            &mut fe,
            need_reply,
            acked_features,
            &mem,
            &queues,
            has_pf,
            None,
        )?;
        if let Some(w) = &dax {
            w.set_started(true);
        }
        let req_thread = match (server, &handler) {
            (Some(server), Some(h)) => Some(ReqThread::spawn(server, Arc::clone(h))?),
            _ => None,
        };

        Ok(Arc::new(Device {
            frontend: Mutex::new(Some(fe)),
            sock: sock2,
            mem,
            info: DeviceInfo {
                backend_features: features,
                acked_features,
                backend_protocol_features: offered_pf,
                acked_protocol_features: pf.bits(),
                queue_num,
                config,
                tag,
                num_request_queues: nreq,
                shmem_sizes,
                event_idx,
                indirect_desc: indirect,
                notification,
            },
            queues,
            dax,
            handler,
            req_thread: Mutex::new(req_thread),
            timeout_ms: AtomicU64::new(cfg.timeout.as_millis() as u64),
            need_reply,
        }))
    }

    /// What the handshake negotiated.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Guest memory.
    pub fn mem(&self) -> &Arc<GuestMem> {
        &self.mem
    }

    /// The DAX window, if the device has one.
    pub fn dax(&self) -> Option<&Arc<DaxWindow>> {
        self.dax.as_ref()
    }

    /// Number of queues (hiprio + request queues).
    pub fn num_queues(&self) -> usize {
        self.queues.len()
    }

    /// Queue `index` (0 = hiprio).
    pub fn queue(&self, index: usize) -> io::Result<&Arc<Queue>> {
        self.queues.get(index).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "no queue {index}: the device has {} queues",
                    self.queues.len()
                ),
            )
        })
    }

    /// Default timeout of requests.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    /// Changes the default timeout of requests.
    pub fn set_timeout(&self, t: Duration) {
        self.timeout_ms
            .store(t.as_millis() as u64, Ordering::Relaxed);
    }

    /// Puts `chain` on queue `index`.
    pub fn submit(&self, index: usize, chain: &Chain) -> io::Result<Pending> {
        self.queue(index)?.submit(chain)
    }

    /// Puts `chain` on queue `index` and waits (default timeout) for it to come back.
    pub fn call(&self, index: usize, chain: &Chain) -> io::Result<Completion> {
        self.submit(index, chain)?.wait(self.timeout())
    }

    /// Errors seen on the backend-request channel (bad messages, broken socket).
    pub fn backend_request_errors(&self) -> Vec<String> {
        self.handler
            .as_ref()
            .and_then(|h| h.errors.lock().ok().map(|v| v.clone()))
            .unwrap_or_default()
    }

    /// Every protocol violation seen so far: on the queues, the DAX window and the
    /// backend-request channel. Empty for a correct backend.
    pub fn violations(&self) -> Vec<String> {
        let mut v: Vec<String> = self.queues.iter().flat_map(|q| q.violations()).collect();
        if let Some(w) = &self.dax {
            v.extend(w.violations());
        }
        v.extend(self.backend_request_errors());
        v
    }

    /// Runs `f` on the vhost-user frontend, for tests of control-plane messages. With
    /// `need_reply`, NEED_REPLY is set on the messages `f` sends.
    pub fn with_frontend<T>(
        &self,
        need_reply: bool,
        f: impl FnOnce(&mut Frontend) -> vhost::Result<T>,
    ) -> io::Result<T> {
        self.locked_frontend(|fe| {
            acked(fe, need_reply && self.need_reply, f)
                .map_err(|e| io::Error::other(format!("vhost-user: {e}")))
        })
    }

    /// Stops the device the way QEMU does when the guest resets it (reboot): GET_VRING_BASE
    /// on every vring, then, with `reset_device` and if negotiated, RESET_DEVICE. Like QEMU,
    /// the frontend then drops every DAX mapping, and a SHMEM_MAP/UNMAP arriving before
    /// [`Device::restart`] is a violation. Requests still in flight are abandoned (their
    /// waiters time out). Returns the vring bases the backend reported.
    pub fn stop(&self, reset_device: bool) -> io::Result<Vec<u32>> {
        self.locked_frontend(|fe| {
            if let Some(w) = &self.dax {
                w.begin_stop();
            }
            let bases = Self::vring_bases(fe, self.queues.len())?;
            if reset_device
                && self.info.acked_protocol_features
                    & VhostUserProtocolFeatures::RESET_DEVICE.bits()
                    != 0
            {
                acked(fe, self.need_reply, |fe| fe.reset_device()).map_err(vu("RESET_DEVICE"))?;
            }
            if let Some(w) = &self.dax {
                if reset_device {
                    w.reset();
                } else {
                    w.set_started(false);
                }
            }
            Ok(bases)
        })
    }

    /// Pauses the device as QEMU's `stop` does (also a snapshot, or the source of a
    /// migration): GET_VRING_BASE on every vring, nothing else. The rings, the guest's FUSE
    /// session and the DAX window stay as they are; [`Device::resume`] carries on from the
    /// returned bases.
    pub fn pause(&self) -> io::Result<Vec<u32>> {
        self.stop(false)
    }

    /// Runs `f` on the connected frontend, holding its lock.
    fn locked_frontend<T>(&self, f: impl FnOnce(&mut Frontend) -> io::Result<T>) -> io::Result<T> {
        let mut g = self
            .frontend
            .lock()
            .map_err(|_| io::Error::other("frontend lock poisoned"))?;
        let fe = g
            .as_mut()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "disconnected"))?;
        f(fe)
    }

    /// GET_VRING_BASE on every vring.
    fn vring_bases(fe: &mut Frontend, n: usize) -> io::Result<Vec<u32>> {
        (0..n)
            .map(|i| fe.get_vring_base(i).map_err(vu("GET_VRING_BASE")))
            .collect()
    }

    /// Resumes a paused device as QEMU's `cont` does: the same rings, from the bases the
    /// backend reported at the pause.
    pub fn resume(&self, bases: &[u32]) -> io::Result<()> {
        self.locked_frontend(|fe| self.start(fe, Some(bases)))?;
        for q in &self.queues {
            q.kick_fd().write(1)?;
        }
        Ok(())
    }

    /// Starts a stopped device again as a rebooted guest does: fresh (zeroed) rings from
    /// index 0 and the same features, memory and queues.
    pub fn restart(&self) -> io::Result<()> {
        self.locked_frontend(|fe| {
            for q in &self.queues {
                q.reset_rings()?;
            }
            self.start(fe, None)
        })
    }

    /// Sets the vrings up (from `bases`, or from 0) and lets the DAX window accept requests.
    fn start(&self, fe: &mut Frontend, bases: Option<&[u32]>) -> io::Result<()> {
        let has_pf =
            self.info.acked_features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0;
        start_vrings(
            fe,
            self.need_reply,
            self.info.acked_features,
            &self.mem,
            &self.queues,
            has_pf,
            bases,
        )?;
        if let Some(w) = &self.dax {
            w.set_started(true);
        }
        Ok(())
    }

    /// Closes the vhost-user connection (the backend should exit). Requests fail afterwards.
    pub fn disconnect(&self) {
        if let Some(w) = &self.dax {
            w.set_started(false);
        }
        if let Ok(mut g) = self.frontend.lock() {
            g.take();
        }
        let _ = self.sock.shutdown(Shutdown::Both);
        for q in &self.queues {
            q.set_disconnected();
        }
    }

    /// Raw fd of the vhost-user socket (for polling; do not close it).
    pub fn socket_fd(&self) -> i32 {
        self.sock.as_raw_fd()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.disconnect();
        if let Ok(mut t) = self.req_thread.lock() {
            t.take();
        }
        for q in &self.queues {
            q.release_rings();
        }
    }
}

/// `vhost_dev_start`: features, memory table, then every vring from index 0, enabled.
fn start_vrings(
    fe: &mut Frontend,
    need_reply: bool,
    acked_features: u64,
    mem: &GuestMem,
    queues: &[Arc<Queue>],
    has_pf: bool,
    bases: Option<&[u32]>,
) -> io::Result<()> {
    acked(fe, need_reply, |fe| fe.set_features(acked_features)).map_err(vu("SET_FEATURES"))?;
    let region = mem.region_info()?;
    acked(fe, need_reply, |fe| {
        fe.set_mem_table(std::slice::from_ref(&region)).map(|_| ())
    })
    .map_err(vu("SET_MEM_TABLE"))?;
    let hva = |gpa: u64| region.userspace_addr + (gpa - region.guest_phys_addr);
    for (i, q) in queues.iter().enumerate() {
        let (d, a, u) = q.ring_addrs();
        let rc = VringConfigData {
            queue_max_size: q.size(),
            queue_size: q.size(),
            flags: 0,
            desc_table_addr: hva(d),
            used_ring_addr: hva(u),
            avail_ring_addr: hva(a),
            log_addr: None,
        };
        acked(fe, need_reply, |fe| fe.set_vring_num(i, q.size())).map_err(vu("SET_VRING_NUM"))?;
        let base = bases.and_then(|b| b.get(i)).copied().unwrap_or(0);
        acked(fe, need_reply, |fe| fe.set_vring_base(i, base as u16))
            .map_err(vu("SET_VRING_BASE"))?;
        acked(fe, need_reply, |fe| fe.set_vring_addr(i, &rc)).map_err(vu("SET_VRING_ADDR"))?;
        acked(fe, need_reply, |fe| fe.set_vring_kick(i, q.kick_fd()))
            .map_err(vu("SET_VRING_KICK"))?;
        acked(fe, need_reply, |fe| fe.set_vring_call(i, q.call_fd()))
            .map_err(vu("SET_VRING_CALL"))?;
    }
    if has_pf {
        for i in 0..queues.len() {
            acked(fe, need_reply, |fe| fe.set_vring_enable(i, true))
                .map_err(vu("SET_VRING_ENABLE"))?;
        }
    }
    Ok(())
}

/// Runs `f` with NEED_REPLY set on the frontend's messages when `on`.
fn acked<T>(
    fe: &mut Frontend,
    on: bool,
    f: impl FnOnce(&mut Frontend) -> vhost::Result<T>,
) -> vhost::Result<T> {
    if !on {
        return f(fe);
    }
    fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    let r = f(fe);
    fe.set_hdr_flags(VhostUserHeaderFlag::empty());
    r
}
