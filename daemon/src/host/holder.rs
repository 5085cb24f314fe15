//! The holder (`--restartable`): a small process that keeps QEMU's vhost-user connection
//! while the file server beneath it is replaced by a new build (SIGUSR2) or started again.
//!
//! QEMU 11.1 cannot take a new backend under a running guest, so the process QEMU talks to
//! must never change. The holder is that process. It owns the listening socket and QEMU's
//! connection, the descriptors QEMU sends (guest memory, kick and call eventfds, the backend
//! channel) and nothing of the share. It starts the file server (this same binary, without
//! `--restartable`) on a private connection and relays vhost-user messages both ways:
//!
//! - QEMU to server: every message is forwarded as it is; the ones that set device state
//!   (features, owner, memory table, vring setup, logging) are also kept, compacted, with
//!   duplicates of their descriptors: the *record*. A server started later is brought to the
//!   same state by sending it the record ([`Record::replay`]).
//! - The backend channel (SHMEM_MAP/UNMAP from the server to QEMU) goes through the holder as
//!   well ([`relay_backend`]): a server that dies between a request and QEMU's reply never
//!   leaves a stale reply for the next one.
//!
//! The holder never reads a guest request, a vring or guest memory: it only writes to the
//! kick eventfds after a restart, so that the new server looks at the rings once.
//!
//! What a server needs to go on with the guest's session is kept outside it, in the holder:
//! - the **vault** ([`serve_vault`], `crate::protocol::keeper`): the negotiated session and,
//!   with its descriptor, every inode the guest holds, every open handle and every POSIX lock
//!   owner's descriptor, sent by the server before a reply names them. An open file
//!   description lives while the holder holds it: offsets, OFD locks and unlinked files
//!   survive the server;
//! - the **ring records** (`crate::transport::ring_records`): for each vring, the next
//!   avail position and the heads taken and not completed.
//!
//! **Crash** (SIGKILL, panic, OOM kill): the holder reads what the dead server kept, starts a
//! new one, which takes the vault's entries back and resumes each ring where the records
//! say (serving again what was taken and not completed), and replays the record.
//!
//! **Upgrade** (SIGUSR2): the holder stops every running vring with GET_VRING_BASE (the
//! server drains its requests in flight: the quiet point, nothing is served twice), kills the
//! server without its clean exit (which would end the session), and starts the binary now at
//! the path the holder was started from, which takes the vault back; the vrings start again
//! at the reported bases. When the new binary does not come up, the holder starts the build
//! it was started as (kept open since start).
//!
//! Signals: SIGTERM, SIGINT and SIGHUP go to the server (its clean exit), then the holder
//! exits. SIGUSR2 upgrades.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::host::cli::Cli;
use crate::host::keeper_link;
use crate::host::runfiles::RunFiles;
use crate::host::sandbox;
use crate::protocol::keeper::{Kept, KeptEntry};

/// The environment variable that tells a file server it runs under a holder: the number of
/// the inherited listening socket the holder connects to.
pub const HOLDER_ENV: &str = "DAXFSD_HOLDER_LISTENER";
/// The number of the inherited ring-record region ([`crate::transport::ring_records`]).
pub const RECORDS_ENV: &str = "DAXFSD_HOLDER_RECORDS";

const HDR: usize = 12;
/// Largest vhost-user payload the holder relays (QEMU's largest, a memory table or a config
/// space, is a few hundred bytes).
const MAX_PAYLOAD: usize = 64 * 1024;
/// Most descriptors one message carries (VHOST_MEMORY_BASELINE_NREGIONS).
const MAX_FDS: usize = 8;
/// How long a server that was asked to go may take before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(10);
/// Most entries the vault keeps (far above the inodes and handles a server keeps open).
const MAX_VAULT: usize = 1 << 22;
/// Restarts after crashes within [`CRASH_WINDOW`] before the holder gives up.
const MAX_CRASHES: usize = 30;
const CRASH_WINDOW: Duration = Duration::from_secs(60);

const VERSION: u32 = 0x1;
const REPLY: u32 = 0x4;
const NEED_REPLY: u32 = 0x8;
const PROTOCOL_F_REPLY_ACK: u64 = 1 << 3;

mod req {
    pub const GET_FEATURES: u32 = 1;
    pub const SET_FEATURES: u32 = 2;
    pub const SET_OWNER: u32 = 3;
    pub const RESET_OWNER: u32 = 4;
    pub const SET_MEM_TABLE: u32 = 5;
    pub const SET_LOG_BASE: u32 = 6;
    pub const SET_LOG_FD: u32 = 7;
    pub const SET_VRING_NUM: u32 = 8;
    pub const SET_VRING_ADDR: u32 = 9;
    pub const SET_VRING_BASE: u32 = 10;
    pub const GET_VRING_BASE: u32 = 11;
    pub const SET_VRING_KICK: u32 = 12;
    pub const SET_VRING_CALL: u32 = 13;
    pub const SET_VRING_ERR: u32 = 14;
    pub const GET_PROTOCOL_FEATURES: u32 = 15;
    pub const SET_PROTOCOL_FEATURES: u32 = 16;
    pub const GET_QUEUE_NUM: u32 = 17;
    pub const SET_VRING_ENABLE: u32 = 18;
    pub const SET_BACKEND_REQ_FD: u32 = 21;
    pub const GET_CONFIG: u32 = 24;
    pub const SET_CONFIG: u32 = 25;
    pub const POSTCOPY_ADVISE: u32 = 28;
    pub const GET_INFLIGHT_FD: u32 = 31;
    pub const RESET_DEVICE: u32 = 34;
    pub const GET_MAX_MEM_SLOTS: u32 = 36;
    pub const ADD_MEM_REG: u32 = 37;
    pub const REM_MEM_REG: u32 = 38;
    pub const SET_STATUS: u32 = 39;
    pub const GET_STATUS: u32 = 40;
    pub const GET_SHARED_OBJECT: u32 = 41;
    pub const SET_DEVICE_STATE_FD: u32 = 42;
    pub const CHECK_DEVICE_STATE: u32 = 43;
    pub const GET_SHMEM_CONFIG: u32 = 44;
}

/// One vhost-user message: header, payload and the descriptors that came with it.
struct Msg {
    req: u32,
    flags: u32,
    body: Vec<u8>,
    fds: Vec<OwnedFd>,
}

impl Msg {
    fn new(req: u32, body: Vec<u8>) -> Self {
        Msg {
            req,
            flags: VERSION,
            body,
            fds: Vec::new(),
        }
    }

    /// The vring a vring message is about.
    fn vring(&self) -> u32 {
        match self.req {
            req::SET_VRING_KICK | req::SET_VRING_CALL | req::SET_VRING_ERR => {
                (self.u64_at(0) & 0xff) as u32
            }
            _ => self.u32_at(0),
        }
    }

    fn u32_at(&self, off: usize) -> u32 {
        self.body
            .get(off..off + 4)
            .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()))
    }

    fn u64_at(&self, off: usize) -> u64 {
        self.body
            .get(off..off + 8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
    }

    /// A copy with duplicated descriptors, and without NEED_REPLY (a replayed message is
    /// answered by nobody).
    fn dup(&self) -> io::Result<Msg> {
        Ok(Msg {
            req: self.req,
            flags: self.flags & !NEED_REPLY,
            body: self.body.clone(),
            fds: self
                .fds
                .iter()
                .map(|f| f.try_clone())
                .collect::<io::Result<_>>()?,
        })
    }
}

/// Whether the backend answers `m` (the requests that always have a reply, and any with
/// NEED_REPLY once REPLY_ACK is negotiated).
fn expects_reply(m: &Msg, reply_ack: bool) -> bool {
    matches!(
        m.req,
        req::GET_FEATURES
            | req::GET_PROTOCOL_FEATURES
            | req::GET_VRING_BASE
            | req::GET_QUEUE_NUM
            | req::GET_CONFIG
            | req::GET_INFLIGHT_FD
            | req::GET_MAX_MEM_SLOTS
            | req::GET_STATUS
            | req::GET_SHARED_OBJECT
            | req::SET_DEVICE_STATE_FD
            | req::CHECK_DEVICE_STATE
            | req::GET_SHMEM_CONFIG
            | req::POSTCOPY_ADVISE
            | req::SET_LOG_BASE
    ) || (reply_ack && m.flags & NEED_REPLY != 0)
}

fn set_cloexec(fd: RawFd) {
    // SAFETY: F_SETFD on a descriptor this process owns changes only its close-on-exec flag.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// Takes ownership of descriptors the kernel just installed from a message's SCM_RIGHTS,
/// close-on-exec (no server the holder starts inherits them by accident).
pub(crate) fn received(raw: &[RawFd]) -> Vec<OwnedFd> {
    raw.iter()
        .map(|&fd| {
            set_cloexec(fd);
            // SAFETY: the kernel just installed `fd` in this process for us; nothing else
            // owns it.
            unsafe { OwnedFd::from_raw_fd(fd) }
        })
        .collect()
}

/// The descriptor a holder passed this server in environment variable `var` (its number),
/// if any: taken out of the environment (no child of ours takes it for its own) and made
/// close-on-exec. Call it before any thread is spawned.
pub(crate) fn inherited(var: &str) -> io::Result<Option<OwnedFd>> {
    let Some(v) = std::env::var_os(var) else {
        return Ok(None);
    };
    let fd: RawFd = v
        .to_str()
        .and_then(|s| s.parse().ok())
        .filter(|&fd| fd >= 0)
        .ok_or_else(|| io::Error::other(format!("{var}: not a descriptor number")))?;
    std::env::remove_var(var);
    set_cloexec(fd);
    // SAFETY: the holder started us with this descriptor open under that number, for us
    // alone; nothing else in this process uses it.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Reads one message; `None` when the peer closed the connection.
fn recv_msg(sock: &UnixStream) -> io::Result<Option<Msg>> {
    let mut hdr = [0u8; HDR];
    let mut raw = [-1 as RawFd; MAX_FDS];
    let mut iov = [libc::iovec {
        iov_base: hdr.as_mut_ptr().cast(),
        iov_len: HDR,
    }];
    // SAFETY: the iovec points to `hdr`, which outlives the call and may take any bytes.
    let (n, nfds) = unsafe { sock.recv_with_fds(&mut iov, &mut raw) }
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    let fds = received(&raw[..nfds]);
    if n == 0 {
        return Ok(None);
    }
    let mut r = sock;
    if n < HDR {
        r.read_exact(&mut hdr[n..])?;
    }
    let word = |i: usize| u32::from_le_bytes(hdr[i..i + 4].try_into().unwrap());
    let size = word(8) as usize;
    if size > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("vhost-user message {} of {size} bytes", word(0)),
        ));
    }
    let mut body = vec![0u8; size];
    r.read_exact(&mut body)?;
    Ok(Some(Msg {
        req: word(0),
        flags: word(4),
        body,
        fds,
    }))
}

fn send_msg(sock: &UnixStream, m: &Msg) -> io::Result<()> {
    let mut buf = Vec::with_capacity(HDR + m.body.len());
    buf.extend_from_slice(&m.req.to_le_bytes());
    buf.extend_from_slice(&m.flags.to_le_bytes());
    buf.extend_from_slice(&(m.body.len() as u32).to_le_bytes());
    buf.extend_from_slice(&m.body);
    let fds: Vec<RawFd> = m.fds.iter().map(|f| f.as_raw_fd()).collect();
    let n = sock
        .send_with_fds(&[&buf[..]], &fds)
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    if n < buf.len() {
        let mut w = sock;
        w.write_all(&buf[n..])?;
    }
    Ok(())
}

/// What was set up for one vring.
#[derive(Default)]
struct VringRecord {
    /// SET_VRING_NUM, _BASE, _ADDR, _CALL, _ERR, _ENABLE, by request.
    setup: BTreeMap<u32, Msg>,
    kick: Option<Msg>,
    /// Stopped by GET_VRING_BASE (its base is the reported one); a later kick restarts it.
    stopped: bool,
}

/// The device state QEMU set, kept to bring a new server to it.
#[derive(Default)]
struct Record {
    protocol: Option<Msg>,
    owner: Option<Msg>,
    features: Option<Msg>,
    /// QEMU's end of the backend channel.
    backend: Option<OwnedFd>,
    /// SET_MEM_TABLE, then the ADD/REM_MEM_REG since.
    memory: Vec<Msg>,
    /// SET_LOG_BASE, SET_LOG_FD, SET_STATUS, SET_CONFIG: the last of each.
    other: BTreeMap<u32, Msg>,
    vrings: BTreeMap<u32, VringRecord>,
}

impl Record {
    fn reply_ack(&self) -> bool {
        self.protocol
            .as_ref()
            .is_some_and(|p| p.u64_at(0) & PROTOCOL_F_REPLY_ACK != 0)
    }

    /// Keeps what `m` sets (a duplicate of it). SET_BACKEND_REQ_FD is taken apart by the
    /// caller (the channel is relayed).
    fn keep(&mut self, m: &Msg) -> io::Result<()> {
        match m.req {
            req::SET_PROTOCOL_FEATURES => self.protocol = Some(m.dup()?),
            req::SET_OWNER => self.owner = Some(m.dup()?),
            req::SET_FEATURES => self.features = Some(m.dup()?),
            req::SET_MEM_TABLE => self.memory = vec![m.dup()?],
            req::ADD_MEM_REG | req::REM_MEM_REG => {
                // Memory hot-plug is rare; a long history is folded by the next SET_MEM_TABLE.
                if self.memory.len() < 1024 {
                    self.memory.push(m.dup()?);
                } else {
                    log::warn!("holder: memory region history full; a restart may miss regions");
                }
            }
            req::SET_LOG_BASE | req::SET_LOG_FD | req::SET_STATUS | req::SET_CONFIG => {
                self.other.insert(m.req, m.dup()?);
            }
            req::SET_VRING_NUM
            | req::SET_VRING_ADDR
            | req::SET_VRING_BASE
            | req::SET_VRING_CALL
            | req::SET_VRING_ERR
            | req::SET_VRING_ENABLE => {
                let v = self.vrings.entry(m.vring()).or_default();
                v.setup.insert(m.req, m.dup()?);
            }
            req::SET_VRING_KICK => {
                let v = self.vrings.entry(m.vring()).or_default();
                v.kick = Some(m.dup()?);
                v.stopped = false;
            }
            req::RESET_DEVICE | req::RESET_OWNER => self.vrings.clear(),
            _ => {}
        }
        Ok(())
    }

    /// GET_VRING_BASE answered `base` for vring `index`: it is stopped there.
    fn stopped_at(&mut self, index: u32, base: u32) {
        let v = self.vrings.entry(index).or_default();
        let mut body = index.to_le_bytes().to_vec();
        body.extend_from_slice(&base.to_le_bytes());
        v.setup
            .insert(req::SET_VRING_BASE, Msg::new(req::SET_VRING_BASE, body));
        v.stopped = true;
    }

    /// The vrings running now.
    fn running(&self) -> Vec<u32> {
        self.vrings
            .iter()
            .filter(|(_, v)| v.kick.is_some() && !v.stopped)
            .map(|(&i, _)| i)
            .collect()
    }
}

/// What servers kept (the keeper's entries, [`crate::protocol::keeper`]), with the
/// descriptors, which the holder holds while no server runs.
type Vault = Arc<Mutex<BTreeMap<Kept, (Vec<u8>, Option<OwnedFd>)>>>;

/// Serves one server's keeper socket: first every entry kept so far, then what the server
/// keeps and releases, until it closes (it exited).
fn serve_vault(sock: UnixDatagram, vault: Vault) {
    let snapshot: Vec<KeptEntry> = {
        let v = vault.lock().unwrap_or_else(|p| p.into_inner());
        v.iter()
            .map(|(k, (m, fd))| (*k, m.clone(), fd.as_ref().and_then(|f| f.try_clone().ok())))
            .collect()
    };
    for (what, meta, fd) in &snapshot {
        let raw = fd.as_ref().map(|f| f.as_raw_fd());
        if let Err(e) = keeper_link::send(&sock, keeper_link::OP_ENTRY, Some(*what), meta, raw) {
            log::error!("holder: cannot hand kept entries over: {e}");
            return;
        }
    }
    drop(snapshot);
    if keeper_link::send(&sock, keeper_link::OP_END, None, &[], None).is_err() {
        return;
    }
    loop {
        let m = match keeper_link::recv(&sock) {
            Ok(Some(m)) => m,
            Ok(None) => return,
            Err(e) => {
                log::warn!("holder: keeper socket: {e}");
                continue;
            }
        };
        let mut v = vault.lock().unwrap_or_else(|p| p.into_inner());
        match (m.op, m.what) {
            (keeper_link::OP_KEEP, Some(w)) if v.len() >= MAX_VAULT && !v.contains_key(&w) => {
                // A server gone wrong cannot make the holder grow without bound.
                log::error!("holder: vault full ({MAX_VAULT} entries); {w:?} not kept");
            }
            (keeper_link::OP_KEEP, Some(w)) => {
                v.insert(w, (m.meta, m.fd));
            }
            (keeper_link::OP_RELEASE, Some(w)) => {
                v.remove(&w);
                if let Kept::Handle(fh) = w {
                    // Its lock owners go with it.
                    let owners: Vec<Kept> = v
                        .range(Kept::Owner(fh, 0)..=Kept::Owner(fh, u64::MAX))
                        .map(|(k, _)| *k)
                        .collect();
                    owners.iter().for_each(|k| {
                        v.remove(k);
                    });
                }
            }
            (keeper_link::OP_CLEAR, _) => v.clear(),
            (op, _) => log::warn!("holder: unknown keeper message {op}"),
        }
    }
}

/// A file server process and the holder's ends of its connections.
struct Server {
    child: Child,
    /// The vhost-user connection (the holder is its frontend).
    conn: UnixStream,
    /// Relays the backend channel while this server lives.
    backend_relay: Option<JoinHandle<()>>,
    /// Serves its keeper socket.
    vault: Option<JoinHandle<()>>,
}

impl Server {
    /// Sends `m` and, when one comes, reads the reply.
    fn call(&self, m: &Msg, reply_ack: bool) -> io::Result<Option<Msg>> {
        send_msg(&self.conn, m)?;
        if !expects_reply(m, reply_ack) {
            return Ok(None);
        }
        match recv_msg(&self.conn)? {
            Some(r) if r.req == m.req && r.flags & REPLY != 0 => Ok(Some(r)),
            Some(r) => Err(io::Error::other(format!(
                "file server answered request {} with {}",
                m.req, r.req
            ))),
            None => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
        }
    }

    /// Starts relaying the backend channel between this server and `qemu_end`; returns `m`
    /// (a SET_BACKEND_REQ_FD) carrying the server's end instead.
    fn attach_backend(&mut self, qemu_end: &OwnedFd, mut m: Msg) -> io::Result<Msg> {
        let (ours, theirs) = UnixStream::pair()?;
        let qemu = UnixStream::from(qemu_end.try_clone()?);
        if let Some(old) = self.backend_relay.take() {
            // A second channel: the old relay ends when the server closes its end.
            drop(old);
        }
        self.backend_relay = Some(
            std::thread::Builder::new()
                .name("backend-relay".into())
                .spawn(move || relay_backend(ours, qemu))?,
        );
        m.fds = vec![OwnedFd::from(theirs)];
        Ok(m)
    }

    /// Ends the server: closes its connection (its clean exit) and waits, killing it after
    /// [`EXIT_GRACE`].
    fn finish(mut self) {
        let _ = self.conn.shutdown(std::net::Shutdown::Both);
        let deadline = Instant::now() + EXIT_GRACE;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    log::warn!(
                        "holder: file server {} did not exit; killing it",
                        self.child.id()
                    );
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        if let Some(t) = self.backend_relay.take() {
            let _ = t.join();
        }
        // Everything the server kept before it died is in the vault once this returns.
        if let Some(t) = self.vault.take() {
            let _ = t.join();
        }
    }
}

/// Copies the backend channel's requests from the server to QEMU, and QEMU's replies back,
/// until the server's end closes. A reply QEMU sends after the server died is read here
/// and dropped, so the next server's channel starts clean.
fn relay_backend(server: UnixStream, qemu: UnixStream) {
    loop {
        let m = match recv_msg(&server) {
            Ok(Some(m)) => m,
            Ok(None) => return,
            Err(e) => {
                log::warn!("holder: backend channel from the file server: {e}");
                return;
            }
        };
        if let Err(e) = send_msg(&qemu, &m) {
            log::error!("holder: backend channel to QEMU: {e}");
            return;
        }
        if m.flags & NEED_REPLY == 0 {
            continue;
        }
        match recv_msg(&qemu) {
            Ok(Some(r)) => {
                let _ = send_msg(&server, &r);
            }
            Ok(None) => return,
            Err(e) => {
                log::error!("holder: backend channel reply from QEMU: {e}");
                return;
            }
        }
    }
}

/// How the holder starts servers: the binary, its arguments, and the build the holder was
/// started as (kept open: a package upgrade may replace the file at `path`).
struct Launcher {
    path: PathBuf,
    own: File,
    args: Vec<OsString>,
    /// The vrings' records, handed to every server.
    records: OwnedFd,
    vault: Vault,
}

impl Launcher {
    fn new(cli: &Cli) -> io::Result<Self> {
        let path = std::env::current_exe()?;
        let own = File::open("/proc/self/exe")?;
        let mut args: Vec<OsString> = std::env::args_os()
            .skip(1)
            .filter(|a| a != "--restartable")
            .collect();
        // The holder keeps inodes as the descriptors the server holds them by.
        args.push("--inode-file-handles=never".into());
        if cli.sandbox == sandbox::Sandbox::Namespace {
            // Every server in a mount namespace of its own would see the kept descriptors
            // under other mount ids (another inode key, lookups refused as outside the share).
            let mode = if crate::sys::geteuid() == 0 {
                "chroot"
            } else {
                "none"
            };
            log::info!("holder: servers run with --sandbox={mode} (one mount namespace for all)");
            args.push(format!("--sandbox={mode}").into());
        }
        let records = crate::transport::ring_records::new_region()?;
        Ok(Launcher {
            path,
            own,
            args,
            records,
            vault: Vault::default(),
        })
    }

    /// Starts a server (the file at `path`, or with `own` the holder's own build) and
    /// connects to it.
    fn spawn(&self, own: bool) -> io::Result<Server> {
        let dir = private_dir()?;
        let sock = dir.join("server.sock");
        let listener = UnixListener::bind(&sock)?;
        // Queued in the backlog until the server accepts it.
        let conn = UnixStream::connect(&sock)?;
        let _ = std::fs::remove_file(&sock);
        let _ = std::fs::remove_dir(&dir);
        let lfd = listener.as_raw_fd();
        let exe = if own {
            PathBuf::from(format!("/proc/self/fd/{}", self.own.as_raw_fd()))
        } else {
            self.path.clone()
        };
        let mut cmd = Command::new(&exe);
        let rfd = self.records.as_raw_fd();
        let (ours, theirs) = keeper_link::seqpacket_pair()?;
        let kfd = theirs.as_raw_fd();
        cmd.args(&self.args)
            .env(HOLDER_ENV, lfd.to_string())
            .env(RECORDS_ENV, rfd.to_string())
            .env(keeper_link::KEEPER_ENV, kfd.to_string());
        // SAFETY: between fork and exec only async-signal-safe calls: fcntl to let the
        // listener, the records, the keeper socket (and the holder's own binary, for
        // /proc/self/fd) through exec, and
        // sigprocmask to give the server the default signal mask back.
        unsafe {
            let own_fd = self.own.as_raw_fd();
            cmd.pre_exec(move || {
                libc::fcntl(lfd, libc::F_SETFD, 0);
                libc::fcntl(rfd, libc::F_SETFD, 0);
                libc::fcntl(kfd, libc::F_SETFD, 0);
                if own {
                    libc::fcntl(own_fd, libc::F_SETFD, 0);
                }
                let mut empty: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut empty);
                libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| {
            io::Error::new(e.kind(), format!("cannot start {}: {e}", exe.display()))
        })?;
        drop(listener);
        drop(theirs);
        let vault = self.vault.clone();
        let vault = std::thread::Builder::new()
            .name("vault".into())
            .spawn(move || serve_vault(ours, vault))?;
        Ok(Server {
            child,
            conn,
            backend_relay: None,
            vault: Some(vault),
        })
    }
}

/// A fresh 0700 directory for the private socket.
fn private_dir() -> io::Result<PathBuf> {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let mut template = base
        .join("daxfsd-holder-XXXXXX")
        .into_os_string()
        .into_encoded_bytes();
    template.push(0);
    // SAFETY: `template` is a NUL-terminated, writable buffer that mkdtemp fills in place.
    let p = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    if p.is_null() {
        return Err(io::Error::last_os_error());
    }
    template.pop();
    // SAFETY: the bytes came from an OsString and mkdtemp only replaced the X's with
    // portable file name characters.
    Ok(PathBuf::from(unsafe {
        OsString::from_encoded_bytes_unchecked(template)
    }))
}

/// The holder's state: QEMU's connection, the record, the server.
struct Holder {
    qemu: UnixStream,
    record: Record,
    launcher: Launcher,
    server: Option<Server>,
    /// The last build that came up: the file at the path (false) or the holder's own.
    own_build: bool,
    crashes: Vec<Instant>,
}

impl Holder {
    /// Starts a server and brings it to the recorded state; `restart` are vrings the holder
    /// stopped (an upgrade) to start again.
    fn start(&mut self, restart: &[u32]) -> io::Result<()> {
        let mut server = self.launcher.spawn(self.own_build)?;
        let pid = server.child.id();
        match self.replay(&mut server, restart) {
            Ok(()) => {
                log::info!("holder: file server {pid} serving");
                self.server = Some(server);
                Ok(())
            }
            Err(e) => {
                server.finish();
                Err(io::Error::new(
                    e.kind(),
                    format!("file server {pid} did not take the device state: {e}"),
                ))
            }
        }
    }

    fn replay(&self, server: &mut Server, restart: &[u32]) -> io::Result<()> {
        let rec = &self.record;
        // The backend records what it offered; SET_PROTOCOL_FEATURES checks against it.
        server.call(&Msg::new(req::GET_FEATURES, Vec::new()), false)?;
        server.call(&Msg::new(req::GET_PROTOCOL_FEATURES, Vec::new()), false)?;
        if let Some(p) = &rec.protocol {
            server.call(&p.dup()?, false)?;
        }
        for m in [&rec.owner, &rec.features].into_iter().flatten() {
            server.call(&m.dup()?, false)?;
        }
        if let Some(qemu_end) = &rec.backend {
            let m =
                server.attach_backend(qemu_end, Msg::new(req::SET_BACKEND_REQ_FD, Vec::new()))?;
            server.call(&m, false)?;
        }
        for m in rec.memory.iter().chain(rec.other.values()) {
            server.call(&m.dup()?, false)?;
        }
        for v in rec.vrings.values() {
            for m in v.setup.values().filter(|m| m.req != req::SET_VRING_ENABLE) {
                server.call(&m.dup()?, false)?;
            }
        }
        for (&i, v) in &rec.vrings {
            let start = !v.stopped || restart.contains(&i);
            if let (true, Some(k)) = (start, &v.kick) {
                server.call(&k.dup()?, false)?;
            }
            if let Some(e) = v.setup.get(&req::SET_VRING_ENABLE) {
                server.call(&e.dup()?, false)?;
            }
        }
        // A reply from the server to the last message proves it took them all.
        server.call(&Msg::new(req::GET_FEATURES, Vec::new()), false)?;
        for (&i, v) in &rec.vrings {
            if v.stopped && !restart.contains(&i) {
                continue;
            }
            // The new server looks at the ring once: requests the guest made available
            // while no server ran are served now.
            if let Some(fd) = v.kick.as_ref().and_then(|k| k.fds.first()) {
                let _ = (&File::from(fd.try_clone()?)).write_all(&1u64.to_ne_bytes());
            }
        }
        Ok(())
    }

    /// Relays one message from QEMU (and its reply).
    fn relay_request(&mut self, mut m: Msg) -> io::Result<()> {
        if m.req == req::SET_BACKEND_REQ_FD {
            // The server gets the holder's relay instead of QEMU's end.
            let qemu_end = m
                .fds
                .pop()
                .ok_or_else(|| io::Error::other("SET_BACKEND_REQ_FD without a descriptor"))?;
            let server = self
                .server
                .as_mut()
                .ok_or_else(|| io::Error::other("no file server"))?;
            let m = server.attach_backend(&qemu_end, m)?;
            self.record.backend = Some(qemu_end);
            if let Some(r) = server.call(&m, self.record.reply_ack())? {
                send_msg(&self.qemu, &r)?;
            }
            return Ok(());
        }
        self.record.keep(&m)?;
        let reply_ack = self.record.reply_ack();
        loop {
            let server = self
                .server
                .as_ref()
                .ok_or_else(|| io::Error::other("no file server"))?;
            match server.call(&m, reply_ack) {
                Ok(reply) => {
                    if let Some(r) = reply {
                        if m.req == req::GET_VRING_BASE {
                            self.record.stopped_at(r.u32_at(0), r.u32_at(4));
                        }
                        send_msg(&self.qemu, &r)?;
                    }
                    return Ok(());
                }
                Err(e) => {
                    log::warn!("holder: file server lost during request {}: {e}", m.req);
                    self.crashed()?;
                    // A query is asked again. What `m` set is in the record the new server
                    // was given; when QEMU waits for its ack (NEED_REPLY), the holder acks.
                    let waits_ack = reply_ack && m.flags & NEED_REPLY != 0;
                    if !expects_reply(&m, false) {
                        if waits_ack {
                            let mut ack = Msg::new(m.req, 0u64.to_le_bytes().to_vec());
                            ack.flags |= REPLY;
                            send_msg(&self.qemu, &ack)?;
                        }
                        return Ok(());
                    }
                    m = m.dup()?;
                }
            }
        }
    }

    /// A file server at the recorded state in place of the current one (which must go).
    fn restart_with(&mut self, restart: &[u32]) -> io::Result<()> {
        if let Some(s) = self.server.take() {
            s.finish();
        }
        match self.start(restart) {
            Ok(()) => Ok(()),
            Err(e) if !self.own_build => {
                log::error!("holder: {e}; starting the build the holder runs instead");
                self.own_build = true;
                self.start(restart)
            }
            Err(e) => Err(e),
        }
    }

    /// The server died on its own: start another.
    fn crashed(&mut self) -> io::Result<()> {
        let now = Instant::now();
        self.crashes
            .retain(|t| now.duration_since(*t) < CRASH_WINDOW);
        self.crashes.push(now);
        if self.crashes.len() > MAX_CRASHES {
            return Err(io::Error::other(format!(
                "the file server died {} times within {CRASH_WINDOW:?}; giving up",
                self.crashes.len()
            )));
        }
        let since = Instant::now();
        if let Some(mut s) = self.server.take() {
            let status = s.child.wait();
            log::error!(
                "holder: file server {} ended ({status:?}); starting it again",
                s.child.id()
            );
            s.finish();
        }
        self.restart_with(&[])?;
        log::info!(
            "holder: serving again {} ms after the crash was seen",
            since.elapsed().as_millis()
        );
        Ok(())
    }

    /// SIGUSR2: hand the session over to the binary at the holder's path.
    fn upgrade(&mut self) -> io::Result<()> {
        let started = Instant::now();
        let running = self.record.running();
        let reply_ack = self.record.reply_ack();
        let server = self
            .server
            .as_ref()
            .ok_or_else(|| io::Error::other("no file server"))?;
        for &i in &running {
            let mut body = i.to_le_bytes().to_vec();
            body.extend_from_slice(&0u32.to_le_bytes());
            let r = server
                .call(&Msg::new(req::GET_VRING_BASE, body), reply_ack)?
                .ok_or_else(|| io::Error::other("no GET_VRING_BASE reply"))?;
            self.record.stopped_at(r.u32_at(0), r.u32_at(4));
        }
        // The quiet point: nothing in flight. The server goes without its clean exit (which
        // would end the session): what it kept stays with the holder for the new build.
        if let Some(s) = &mut self.server {
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
        log::info!("holder: upgrade: {} vring(s) stopped", running.len());
        self.own_build = false;
        self.restart_with(&running)?;
        self.mark_running(&running);
        log::info!(
            "holder: upgrade done in {} ms",
            started.elapsed().as_millis()
        );
        Ok(())
    }

    fn mark_running(&mut self, vrings: &[u32]) {
        for i in vrings {
            if let Some(v) = self.record.vrings.get_mut(i) {
                v.stopped = false;
            }
        }
    }
}

/// A signalfd for the holder's signals (blocked in the holder; servers get the default mask).
fn signal_fd() -> io::Result<OwnedFd> {
    let sigs = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR2];
    let set = sandbox::sigset(&sigs);
    // SAFETY: `set` is a valid signal set; this changes only the holder's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    // SAFETY: `set` is valid; signalfd returns a new descriptor or -1.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: signalfd just returned this new descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn read_signal(fd: &OwnedFd) -> Option<libc::c_int> {
    let mut info = [0u8; 128];
    // SAFETY: reads one signalfd_siginfo (128 bytes) into `info`.
    let n = unsafe { libc::read(fd.as_raw_fd(), info.as_mut_ptr().cast(), info.len()) };
    (n == 128).then(|| u32::from_ne_bytes(info[..4].try_into().unwrap()) as libc::c_int)
}

fn poll_in(fds: &[RawFd], timeout_ms: i32) -> io::Result<Vec<bool>> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: `p` is a valid array of `p.len()` pollfds.
        let r = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
        if r >= 0 {
            return Ok(p.iter().map(|x| x.revents != 0).collect());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Runs the holder until QEMU disconnects or a stop signal ends the server.
pub fn run(cli: &Cli) -> io::Result<()> {
    if cli.inode_file_handles == crate::host::cli::InodeFileHandles::Mandatory {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--restartable does not take --inode-file-handles=mandatory yet (the holder keeps inodes as descriptors); drop one",
        ));
    }
    // The holder holds a descriptor for every inode and handle the guest has: as many as
    // the server may, so the same limit.
    if let Err(e) = crate::host::startup::raise_nofile(cli.rlimit_nofile) {
        log::warn!("holder: {e}; keeping the current open-file limit");
    }
    let launcher = Launcher::new(cli)?;
    let signals = signal_fd()?;
    let (listener, run_files): (UnixListener, Option<RunFiles>) = match (&cli.socket_path, cli.fd) {
        (_, Some(fd)) => {
            // SAFETY: the user passed this descriptor to us as a listening socket we now own.
            (unsafe { UnixListener::from_raw_fd(fd) }, None)
        }
        (Some(path), None) => {
            let mut files = RunFiles::lock(path)?;
            let l = files.listen(|_| Ok(()))?;
            (l, Some(files))
        }
        (None, None) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "missing --socket-path",
            ))
        }
    };
    log::info!("holder {}: waiting for the frontend", std::process::id());
    eprintln!("Waiting for vhost-user socket connection...");
    let ready = poll_in(&[listener.as_raw_fd(), signals.as_raw_fd()], -1)?;
    if ready[1] {
        log::info!("holder: stopped before a frontend connected");
        drop(run_files);
        return Ok(());
    }
    let (qemu, _) = listener.accept()?;
    drop(listener);
    log::info!("holder: frontend connected");
    let mut h = Holder {
        qemu,
        record: Record::default(),
        launcher,
        server: None,
        own_build: false,
        crashes: Vec::new(),
    };
    h.start(&[])?;
    let result = serve(&mut h, &signals);
    if let Some(s) = h.server.take() {
        s.finish();
    }
    drop(run_files);
    result
}

fn serve(h: &mut Holder, signals: &OwnedFd) -> io::Result<()> {
    loop {
        let server_fd = h.server.as_ref().map_or(-1, |s| s.conn.as_fd().as_raw_fd());
        let ready = poll_in(&[h.qemu.as_raw_fd(), server_fd, signals.as_raw_fd()], -1)?;
        if ready[2] {
            match read_signal(signals) {
                Some(libc::SIGUSR2) => {
                    log::info!("holder: SIGUSR2: upgrading the file server");
                    if let Err(e) = h.upgrade() {
                        log::error!("holder: upgrade failed: {e}");
                        if h.server.is_none() {
                            h.crashed()?;
                        }
                    }
                }
                Some(sig) => {
                    log::info!(
                        "holder: {}: stopping",
                        crate::host::startup::signal_name(sig)
                    );
                    if let Some(s) = &h.server {
                        // SAFETY: kill only sends a signal to our own child.
                        unsafe { libc::kill(s.child.id() as libc::pid_t, sig) };
                    }
                    return Ok(());
                }
                None => {}
            }
            continue;
        }
        if ready[1] {
            // The server never speaks first on this connection: it closed it (exited).
            h.crashed()?;
            continue;
        }
        if ready[0] {
            match recv_msg(&h.qemu)? {
                Some(m) => h.relay_request(m)?,
                None => {
                    log::info!("holder: frontend disconnected, exiting");
                    return Ok(());
                }
            }
        }
    }
}
