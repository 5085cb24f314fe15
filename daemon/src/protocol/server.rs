//! The FUSE server: decodes a request, validates it, calls the [`FileSystem`], encodes the
//! reply. It knows nothing of virtio: a transport hands it a [`Reader`] over the request and
//! a [`Writer`] for the reply.
//!
//! Every request from the guest is untrusted. Lengths are checked before anything is read,
//! with checked arithmetic; a malformed request gets an errno reply (or, when even its header
//! is unreadable, is dropped) and a log line, and the server goes on with the next one.

use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use vm_memory::ByteValued;

use crate::migration::format::{Codec, Dec, Enc};
use crate::protocol::abi::{opcode as op, *};
use crate::protocol::backing::{Passthrough as FusePassthrough, Stats as FusePassthroughStats};
use crate::protocol::filesystem::{
    Context, Entry, FileSystem, Handle, InitCaps, Inode, LockOwner, XattrReply,
};
use crate::protocol::iobuf::{Reader, Writer};
use crate::protocol::mapper::Mapper;

mod attr_ops;
mod decode;
mod entry_ops;
mod file_ops;

const IN_HEADER_LEN: usize = std::mem::size_of::<InHeader>();
const OUT_HEADER_LEN: usize = std::mem::size_of::<OutHeader>();
const PAGE_SIZE: u32 = 4096;
/// Pages per READ/WRITE we offer; the client may lower it.
const MAX_PAGES: u16 = 256;
/// log2 of the DAX mapping alignment we require (one page).
const MAP_ALIGNMENT_LOG2: u16 = 12;

fn err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

fn einval() -> io::Error {
    err(libc::EINVAL)
}

/// The negotiated FUSE session, as it moves to another daemon (see
/// [`Server::export_session`] and [`super::state`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionState {
    pub initialized: bool,
    pub minor: u32,
    pub max_io: u32,
    pub flags: u64,
}

impl SessionState {
    /// Its bytes as the keeper holds them: the migration codec, framed and checksummed.
    pub fn to_kept(&self) -> Vec<u8> {
        let mut e = Enc::new();
        // Fixed-size fields far below the stream's limit: neither step can fail.
        let _ = self.encode(&mut e);
        e.into_stream().unwrap_or_default()
    }

    /// From [`Self::to_kept`]'s bytes.
    pub fn from_kept(b: &[u8]) -> Option<Self> {
        let mut d = Dec::stream(b).ok()?;
        let st = Self::decode(&mut d).ok()?;
        d.finish().ok()?;
        Some(st)
    }
}

impl Codec for SessionState {
    fn encode(&self, e: &mut Enc) -> io::Result<()> {
        e.u8(u8::from(self.initialized));
        e.u32(self.minor);
        e.u32(self.max_io);
        e.u64(self.flags);
        Ok(())
    }

    fn decode(d: &mut Dec) -> io::Result<Self> {
        Ok(SessionState {
            initialized: d.bool("session state")?,
            minor: d.u32("session minor")?,
            max_io: d.u32("session max_io")?,
            flags: d.u64("session flags")?,
        })
    }
}

/// What a handler produced: a reply body already written, or no reply at all.
enum Reply {
    Body,
    None,
}

type HandlerResult = io::Result<Reply>;

/// Per-session negotiated state.
#[derive(Default)]
struct Session {
    initialized: AtomicBool,
    minor: AtomicU32,
    /// Largest READ/WRITE payload accepted.
    max_io: AtomicU32,
    /// Flags both sides agreed on.
    flags: AtomicU64,
}

/// Outcome of one request, for transports and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handled {
    /// Bytes written to the reply (0 when there is no reply).
    pub written: usize,
    pub opcode: u32,
}

/// Which regular files get `FUSE_ATTR_DAX` on `dax=inode` mounts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DaxPolicy {
    /// No file (the guest's `dax=inode` then uses no DAX at all).
    #[default]
    Never,
    /// Every regular file.
    Always,
    /// Regular files of at least this many bytes.
    MinSize(u64),
}

impl DaxPolicy {
    fn picks(&self, size: u64) -> bool {
        match *self {
            DaxPolicy::Never => false,
            DaxPolicy::Always => true,
            DaxPolicy::MinSize(n) => size >= n,
        }
    }
}

/// Server options that do not belong to a filesystem.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerOptions {
    /// Largest READ/WRITE payload, in pages (0 = default).
    pub max_pages: u16,
    /// Per-inode DAX policy (used when the client offers `FUSE_HAS_INODE_DAX` and a window exists).
    pub dax_policy: DaxPolicy,
    /// Extra INIT flags the transport offers (e.g. `FUSE_PASSTHROUGH` on /dev/fuse,
    /// `FUSE_OVER_IO_URING` for io-uring), agreed only where the client offers them too.
    /// 0 for vhost-user.
    pub transport_flags: u64,
    /// `max_stack_depth` answered when `FUSE_PASSTHROUGH` is agreed (stacking depth of
    /// the backing files' filesystems; Linux accepts 1..=FILESYSTEM_MAX_STACK_DEPTH = 2).
    pub max_stack_depth: u32,
}

/// A FUSE server over a filesystem `F` and a DAX mapper.
pub struct Server<F: FileSystem> {
    fs: F,
    mapper: Box<dyn Mapper>,
    session: Session,
    max_pages: u16,
    dax_policy: DaxPolicy,
    transport_flags: u64,
    max_stack_depth: u32,
    /// FUSE passthrough, when the transport can register backing files.
    fuse_passthrough: Option<FusePassthrough>,
    /// Where the session is kept across a crash (`--restartable`).
    keeper: std::sync::OnceLock<std::sync::Arc<dyn crate::protocol::keeper::Keeper>>,
    /// Requests served again after a crash ([`Self::note_served_again`]), by unique.
    again: std::sync::Mutex<std::collections::HashSet<u64>>,
    /// Whether `again` holds any (one load per request otherwise).
    any_again: AtomicBool,
    /// Requests handled, by opcode, for the exit report ([`Self::request_counts`]).
    counts: OpCounts,
}

/// Requests handled per opcode (FUSE opcodes are below 64; the rest count in slot 0).
struct OpCounts([AtomicU64; 64]);

impl OpCounts {
    fn note(&self, opcode: u32) {
        let slot = usize::try_from(opcode)
            .ok()
            .filter(|&o| o < 64)
            .unwrap_or(0);
        self.0[slot].fetch_add(1, Ordering::Relaxed);
    }
}

/// What [`Server::request_counts`] returns: requests handled by opcode, most first.
pub struct RequestCounts(Vec<(&'static str, u64)>);

impl RequestCounts {
    /// Requests of the opcode named `name` (as [`op::name`] spells it).
    pub fn of(&self, name: &str) -> u64 {
        self.0.iter().find(|(n, _)| *n == name).map_or(0, |c| c.1)
    }
}

impl std::fmt::Display for RequestCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: u64 = self.0.iter().map(|c| c.1).sum();
        write!(f, "requests: {total}")?;
        for (i, (name, n)) in self.0.iter().enumerate() {
            write!(f, "{}{name} {n}", if i == 0 { " (" } else { ", " })?;
        }
        if !self.0.is_empty() {
            write!(f, ")")?;
        }
        Ok(())
    }
}

/// Parsed request header plus the caller's identity.
struct Req {
    unique: u64,
    nodeid: Inode,
    ctx: Context,
    /// The request-extension area (`total_extlen * 8` bytes after the payload), read only
    /// for the creating opcodes once `FUSE_SECURITY_CTX` is agreed; else empty.
    ext: Vec<u8>,
}

impl<F: FileSystem> Server<F> {
    pub fn new(fs: F, mapper: Box<dyn Mapper>, opts: ServerOptions) -> Self {
        let max_pages = match opts.max_pages {
            0 => MAX_PAGES,
            n => n,
        };
        Server {
            fs,
            mapper,
            session: Session::default(),
            max_pages,
            dax_policy: opts.dax_policy,
            transport_flags: opts.transport_flags,
            max_stack_depth: opts.max_stack_depth,
            fuse_passthrough: None,
            keeper: std::sync::OnceLock::new(),
            again: std::sync::Mutex::default(),
            any_again: AtomicBool::new(false),
            counts: OpCounts(std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    /// Requests handled so far, by opcode (unknown opcodes as `?`), most first.
    pub fn request_counts(&self) -> RequestCounts {
        let mut v: Vec<(&'static str, u64)> = self
            .counts
            .0
            .iter()
            .enumerate()
            .filter_map(|(o, n)| {
                let n = n.load(Ordering::Relaxed);
                (n > 0).then(|| (op::name(o as u32), n))
            })
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        RequestCounts(v)
    }

    /// Serves regular files with FUSE passthrough where `p`'s policy and the client agree
    /// (`FUSE_PASSTHROUGH` must also be in `transport_flags`).
    pub fn with_fuse_passthrough(mut self, p: FusePassthrough) -> Self {
        self.fuse_passthrough = Some(p);
        self
    }

    /// FUSE passthrough counters, when FUSE passthrough is configured.
    pub fn fuse_passthrough_stats(&self) -> Option<FusePassthroughStats> {
        self.fuse_passthrough.as_ref().map(|p| p.stats())
    }

    /// The backing id to open `fh` of `inode` with, if it is to be passed through.
    fn pass_through(&self, inode: Inode, fh: Handle) -> Option<i32> {
        let p = self.fuse_passthrough.as_ref()?;
        if self.session.flags.load(Ordering::Relaxed) & init_flags::PASSTHROUGH == 0 {
            return None;
        }
        let fd = self.fs.backing_fd(inode, fh).ok();
        p.opened(inode.raw(), fh.raw(), fd.as_ref().map(|f| f.as_fd()))
    }

    /// The reply to `request` never reached the client (/dev/fuse answered ENOENT: the
    /// request was interrupted). An OPEN or CREATE handle it carried is released here, as
    /// the client will never release it, and a lock SETLK/SETLKW took is given back.
    pub fn reply_lost(&self, request: &[u8], reply: &[u8]) {
        let Some(hdr) = InHeader::from_slice(request.get(..IN_HEADER_LEN).unwrap_or(&[])) else {
            return;
        };
        let ok = reply
            .get(..OUT_HEADER_LEN)
            .and_then(OutHeader::from_slice)
            .is_some_and(|h| h.error == 0);
        if !ok {
            return;
        }
        let out = reply.get(OUT_HEADER_LEN..).unwrap_or(&[]);
        let ctx = Context {
            uid: hdr.uid,
            gid: hdr.gid,
            pid: hdr.pid,
        };
        if matches!(hdr.opcode, op::SETLK | op::SETLKW) {
            // A lock granted to a waiter that is gone (killed while it waited): give it back,
            // or it would stay held for an owner that never learnt it got it.
            let Some(a) = request
                .get(IN_HEADER_LEN..IN_HEADER_LEN + std::mem::size_of::<LkIn>())
                .and_then(LkIn::from_slice)
            else {
                return;
            };
            if a.lk.typ != libc::F_UNLCK as u32 {
                let unlock = FileLock {
                    typ: libc::F_UNLCK as u32,
                    ..a.lk
                };
                let flock = a.lk_flags & LK_FLOCK != 0;
                log::debug!(
                    "SETLK(W) reply lost: releasing the lock of owner {:#x}",
                    a.owner
                );
                let _ = self.fs.setlk(
                    &ctx,
                    Inode::from_raw(hdr.nodeid),
                    Handle::from_raw(a.fh),
                    LockOwner::from_raw(a.owner),
                    unlock,
                    flock,
                    false,
                );
            }
            return;
        }
        let (ino, open) = match hdr.opcode {
            op::OPEN => (hdr.nodeid, out),
            op::CREATE => {
                let n = std::mem::size_of::<EntryOut>();
                let Some(e) = out.get(..n).and_then(EntryOut::from_slice) else {
                    return;
                };
                (e.nodeid, out.get(n..).unwrap_or(&[]))
            }
            _ => return,
        };
        let Some(o) = open
            .get(..std::mem::size_of::<OpenOut>())
            .and_then(OpenOut::from_slice)
        else {
            return;
        };
        log::debug!(
            "{} interrupted: releasing handle {}",
            op::name(hdr.opcode),
            o.fh
        );
        if let Some(p) = &self.fuse_passthrough {
            p.released(o.fh);
        }
        let (ino, fh) = (Inode::from_raw(ino), Handle::from_raw(o.fh));
        let _ = self.fs.release(&ctx, ino, fh, false, LockOwner::default());
    }

    /// How long the request with this header may hold its thread: the opcode's class
    /// ([`crate::protocol::policy::wait`]), except a FLUSH whose host close writes nothing
    /// back ([`FileSystem::flush_writes_back`]), which is short.
    pub fn wait(&self, hdr: &InHeader) -> crate::protocol::policy::Wait {
        use crate::protocol::policy::{wait, Wait};
        match wait(hdr.opcode) {
            Wait::Long
                if hdr.opcode == op::FLUSH
                    && !self.fs.flush_writes_back(Inode::from_raw(hdr.nodeid)) =>
            {
                Wait::Short
            }
            w => w,
        }
    }

    /// The filesystem being served.
    pub fn fs(&self) -> &F {
        &self.fs
    }

    /// The largest READ/WRITE payload this server can agree to (before INIT lowers it):
    /// what a transport sizes its request buffers for.
    pub fn max_write(&self) -> u32 {
        u32::from(self.max_pages) * PAGE_SIZE
    }

    /// The DAX mapper.
    pub fn mapper(&self) -> &dyn Mapper {
        self.mapper.as_ref()
    }

    /// Ends the session as on DESTROY: used by transports on device reset and disconnect.
    pub fn reset(&self) {
        if let Some(k) = self.keeper.get() {
            k.clear();
        }
        self.session.initialized.store(false, Ordering::SeqCst);
        self.session.flags.store(0, Ordering::SeqCst);
        self.mapper.end_session();
        if let Some(p) = &self.fuse_passthrough {
            p.close_all();
        }
        self.fs.destroy();
    }

    /// Request `unique` is being served again: a server that died had taken it and not
    /// answered (`--restartable`). Its effect may have reached the host before the crash.
    pub fn note_served_again(&self, unique: u64) {
        let mut a = self.again.lock().unwrap_or_else(|p| p.into_inner());
        a.insert(unique);
        self.any_again.store(true, Ordering::Relaxed);
    }

    fn take_again(&self, unique: u64) -> bool {
        let mut a = self.again.lock().unwrap_or_else(|p| p.into_inner());
        let was = a.remove(&unique);
        if a.is_empty() {
            self.any_again.store(false, Ordering::Relaxed);
        }
        was
    }

    /// The answer to a request served again: a removal or rename that finds its name gone
    /// was done by the server that died, so it succeeded. (A creation that finds its name
    /// taken cannot be told from someone else's; it keeps EEXIST, with a log line.)
    fn settle_again(opcode: u32, unique: u64, outcome: HandlerResult) -> HandlerResult {
        let errno = match &outcome {
            Err(e) => e.raw_os_error(),
            Ok(_) => return outcome,
        };
        match (opcode, errno) {
            (op::UNLINK | op::RMDIR | op::RENAME | op::RENAME2, Some(libc::ENOENT)) => {
                log::info!(
                    "{} unique={unique} served again after a crash found its name gone: done before the crash",
                    op::name(opcode)
                );
                Ok(Reply::Body)
            }
            (op::CREATE | op::MKDIR | op::MKNOD | op::SYMLINK | op::LINK, Some(libc::EEXIST)) => {
                log::warn!(
                    "{} unique={unique} served again after a crash: EEXIST (maybe its own effect before the crash)",
                    op::name(opcode)
                );
                outcome
            }
            _ => outcome,
        }
    }

    /// Keeps the session with `keeper` from now on (`--restartable`).
    pub fn set_keeper(&self, keeper: std::sync::Arc<dyn crate::protocol::keeper::Keeper>) {
        let _ = self.keeper.set(keeper);
        self.keep_session();
    }

    fn keep_session(&self) {
        if let Some(k) = self.keeper.get() {
            let st = self.export_session();
            if st.initialized {
                k.keep(crate::protocol::keeper::Kept::Session, &st.to_kept(), None);
            }
        }
    }

    /// The negotiated FUSE session, for the migration state.
    pub fn export_session(&self) -> SessionState {
        let s = &self.session;
        SessionState {
            initialized: s.initialized.load(Ordering::Acquire),
            minor: s.minor.load(Ordering::Relaxed),
            max_io: s.max_io.load(Ordering::Relaxed),
            flags: s.flags.load(Ordering::Relaxed),
        }
    }

    /// Takes over a migrated session: the guest goes on without a new INIT. `max_io` must be
    /// one this server could have negotiated, and the flags ones it offers (`fs_wants`: what
    /// the filesystem's configuration wants in INIT); anything else is refused.
    pub fn import_session(&self, st: &SessionState, fs_wants: u64) -> io::Result<()> {
        let offers = self.server_wants() | fs_wants;
        if st.initialized && st.flags & !offers != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "migrated session agrees INIT flags {:#x} this daemon does not offer (its configuration offers {offers:#x})",
                    st.flags & !offers
                ),
            ));
        }
        let most = u32::from(self.max_pages) * PAGE_SIZE;
        if st.initialized
            && (st.max_io < PAGE_SIZE || st.max_io > most || st.minor < MIN_KERNEL_MINOR_VERSION)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "migrated session: max_io {} (this server: {PAGE_SIZE}..={most}), FUSE minor {}",
                    st.max_io, st.minor
                ),
            ));
        }
        let s = &self.session;
        s.minor.store(st.minor, Ordering::Relaxed);
        s.max_io.store(st.max_io, Ordering::Relaxed);
        s.flags.store(st.flags, Ordering::Relaxed);
        s.initialized.store(st.initialized, Ordering::Release);
        self.keep_session();
        Ok(())
    }

    /// Negotiated INIT flags (0 before INIT).
    pub fn negotiated_flags(&self) -> u64 {
        self.session.flags.load(Ordering::Relaxed)
    }

    /// Handles one request. `w` is `None` when the request came without room for a reply.
    /// Errors mean the request could not even be answered (no readable header, no room for
    /// a reply header); they are logged and the caller just returns the buffers.
    pub fn handle(&self, mut r: Reader, w: Option<Writer>) -> io::Result<Handled> {
        let total = r.available();
        let hdr: InHeader = r.read_obj().inspect_err(|_| {
            log::warn!("dropping request: {total} bytes, too short for a FUSE header");
        })?;
        self.handle_decoded(hdr, total, r, w)
    }

    /// [`Server::handle`] of a request whose header the transport has already read (it chose
    /// the serving thread by its opcode): `hdr` is that copy, `total` the request's length,
    /// `r` positioned just past the header. The guest's memory is not read for the header
    /// again, so the opcode served is the one the thread was chosen for.
    pub fn handle_decoded(
        &self,
        hdr: InHeader,
        total: usize,
        mut r: Reader,
        w: Option<Writer>,
    ) -> io::Result<Handled> {
        self.counts.note(hdr.opcode);
        let mut req = Req {
            unique: hdr.unique,
            nodeid: Inode::from_raw(hdr.nodeid),
            ctx: Context {
                uid: hdr.uid,
                gid: hdr.gid,
                pid: hdr.pid,
            },
            ext: Vec::new(),
        };
        let result = self
            .check_header(&hdr, total, &mut r)
            .map(|ext| req.ext = ext);
        let mut head = w;
        let mut body = match head.as_mut() {
            Some(h) if h.available() >= OUT_HEADER_LEN => Some(h.split_at(OUT_HEADER_LEN)?),
            _ => None,
        };
        let outcome = match result {
            Ok(()) => match body.as_mut() {
                Some(b) => self.dispatch(hdr.opcode, &req, &mut r, b),
                None => self.dispatch_no_reply(hdr.opcode, &req, &mut r),
            },
            Err(e) => Err(e),
        };
        let outcome = if self.any_again.load(Ordering::Relaxed) && self.take_again(hdr.unique) {
            Self::settle_again(hdr.opcode, req.unique, outcome)
        } else {
            outcome
        };
        let written = match outcome {
            Ok(Reply::None) => 0,
            Ok(Reply::Body) => {
                let len = body.as_ref().map_or(0, |b| b.bytes_written());
                Self::write_header(head.as_mut(), req.unique, 0, len, hdr.opcode)?
            }
            Err(e) => {
                // A short read of a fixed-size argument is a malformed request.
                let errno = e.raw_os_error().unwrap_or(match e.kind() {
                    io::ErrorKind::UnexpectedEof => libc::EINVAL,
                    _ => libc::EIO,
                });
                log::debug!(
                    "{} unique={} -> errno {errno}",
                    op::name(hdr.opcode),
                    req.unique
                );
                if matches!(hdr.opcode, op::FORGET | op::BATCH_FORGET | op::INTERRUPT) {
                    0
                } else {
                    Self::write_header(head.as_mut(), req.unique, -errno, 0, hdr.opcode)?
                }
            }
        };
        Ok(Handled {
            written,
            opcode: hdr.opcode,
        })
    }

    fn write_header(
        head: Option<&mut Writer>,
        unique: u64,
        error: i32,
        body: usize,
        opcode: u32,
    ) -> io::Result<usize> {
        let Some(head) = head else {
            log::warn!(
                "{} unique={unique}: no room for a reply, dropped",
                op::name(opcode)
            );
            return Err(err(libc::ENOBUFS));
        };
        let len = OUT_HEADER_LEN.checked_add(body).ok_or_else(einval)?;
        let out = OutHeader {
            len: u32::try_from(len).map_err(|_| einval())?,
            error,
            unique,
        };
        head.write_obj(&out)?;
        Ok(len)
    }

    /// Header checks common to every opcode; limits `r` to this request's payload and
    /// returns the extension area when the opcode may carry a security context.
    fn check_header(&self, hdr: &InHeader, total: usize, r: &mut Reader) -> io::Result<Vec<u8>> {
        if hdr.len as usize != total {
            log::warn!(
                "{} unique={}: header len {} but request has {total} bytes",
                op::name(hdr.opcode),
                hdr.unique,
                hdr.len
            );
            return Err(einval());
        }
        let ext = usize::from(hdr.total_extlen)
            .checked_mul(8)
            .ok_or_else(einval)?;
        let payload = total
            .checked_sub(IN_HEADER_LEN)
            .and_then(|n| n.checked_sub(ext))
            .ok_or_else(|| {
                log::warn!(
                    "{}: extension length {ext} exceeds the request",
                    op::name(hdr.opcode)
                );
                einval()
            })?;
        let max = self.max_payload(hdr.opcode);
        if payload > max {
            // Checked before anything is read: descriptors may alias the same guest pages,
            // so a request can claim gigabytes without the guest having them.
            log::warn!(
                "{} unique={}: {payload}-byte payload exceeds the opcode's limit {max}",
                op::name(hdr.opcode),
                hdr.unique
            );
            return Err(einval());
        }
        // At most 65535 * 8 bytes, all inside the request (checked above).
        let creates = matches!(
            hdr.opcode,
            op::CREATE | op::MKDIR | op::MKNOD | op::SYMLINK | op::TMPFILE
        );
        let secctx = self.session.flags.load(Ordering::Relaxed) & init_flags::SECURITY_CTX != 0;
        let ext_area = if ext > 0 && creates && secctx {
            let mut t = r.clone();
            t.skip(payload)?;
            t.read_vec(ext)?
        } else {
            Vec::new()
        };
        r.truncate(payload);
        if hdr.opcode != op::INIT && !self.session.initialized.load(Ordering::Acquire) {
            log::warn!("{} before INIT", op::name(hdr.opcode));
            return Err(err(libc::EIO));
        }
        Ok(ext_area)
    }

    /// Requests that never get a reply may come without a writable buffer.
    fn dispatch_no_reply(&self, opcode: u32, req: &Req, r: &mut Reader) -> HandlerResult {
        match opcode {
            op::FORGET => self.forget(req, r),
            op::BATCH_FORGET => self.batch_forget(req, r),
            op::INTERRUPT => Ok(Reply::None),
            _ => {
                log::warn!(
                    "{} unique={}: no room for a reply",
                    op::name(opcode),
                    req.unique
                );
                Err(err(libc::ENOBUFS))
            }
        }
    }

    /// One arm per opcode, each its handler (in `entry_ops`, `file_ops`, `attr_ops`).
    fn dispatch(&self, opcode: u32, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        match opcode {
            op::INIT => self.init(r, w),
            op::DESTROY => self.destroy(),
            op::FORGET | op::BATCH_FORGET | op::INTERRUPT => self.dispatch_no_reply(opcode, req, r),
            op::LOOKUP => self.lookup(req, r, w),
            op::GETATTR => self.getattr(req, r, w),
            op::STATX => self.statx(req, r, w),
            op::SETATTR => self.setattr(req, r, w),
            op::READLINK => self.readlink(req, r, w),
            op::SYMLINK => self.symlink(req, r, w),
            op::MKNOD => self.mknod(req, r, w),
            op::MKDIR => self.mkdir(req, r, w),
            op::UNLINK => self.unlink(req, r, w),
            op::RMDIR => self.rmdir(req, r, w),
            op::RENAME => self.rename(req, r, w),
            op::RENAME2 => self.rename2(req, r, w),
            op::LINK => self.link(req, r, w),
            op::OPEN => self.open(req, r, w),
            op::OPENDIR => self.opendir(req, r, w),
            op::CREATE => self.create(req, r, w),
            op::TMPFILE => self.tmpfile(req, r, w),
            op::READ => self.read(req, r, w),
            op::WRITE => self.write(req, r, w),
            op::STATFS => self.statfs(req, r, w),
            op::RELEASE => self.release(req, r, w),
            op::RELEASEDIR => self.releasedir(req, r, w),
            op::FSYNC => self.fsync(req, r, w),
            op::FSYNCDIR => self.fsyncdir(req, r, w),
            op::FLUSH => self.flush(req, r, w),
            op::SETXATTR => self.setxattr(req, r, w),
            op::GETXATTR => self.getxattr(req, r, w),
            op::LISTXATTR => self.listxattr(req, r, w),
            op::REMOVEXATTR => self.removexattr(req, r, w),
            op::READDIR => self.readdir(req, r, w),
            op::READDIRPLUS => self.readdirplus(req, r, w),
            op::GETLK => self.getlk(req, r, w),
            op::SETLK => self.setlk(req, r, w),
            op::SETLKW => self.setlkw(req, r, w),
            op::ACCESS => self.access(req, r, w),
            op::FALLOCATE => self.fallocate(req, r, w),
            op::LSEEK => self.lseek(req, r, w),
            op::COPY_FILE_RANGE => self.copy_file_range(req, r, w),
            op::SYNCFS => self.syncfs(req, r, w),
            op::SETUPMAPPING => self.setupmapping(req, r, w),
            op::REMOVEMAPPING => self.removemapping(req, r, w),
            op::IOCTL => self.ioctl(req, r, w),
            _ => {
                log::debug!("unsupported opcode {opcode} ({})", op::name(opcode));
                Err(err(libc::ENOSYS))
            }
        }
    }

    /// DESTROY: the session ends.
    fn destroy(&self) -> HandlerResult {
        self.reset();
        Ok(Reply::Body)
    }

    /// The largest payload (after the header, before extensions) a request with `opcode` may
    /// carry: bounds what the server ever reads into memory for one request.
    fn max_payload(&self, opcode: u32) -> usize {
        /// Two names, a path and a fixed argument struct, with room to spare.
        const SMALL: usize = 4 * PAGE_SIZE as usize;
        match opcode {
            op::WRITE => {
                let max_io = match self.session.max_io.load(Ordering::Relaxed) {
                    0 => u32::from(self.max_pages) * PAGE_SIZE,
                    n => n,
                };
                std::mem::size_of::<WriteIn>() + max_io as usize
            }
            op::SETXATTR => std::mem::size_of::<SetxattrIn>() + XATTR_NAME_MAX + 1 + XATTR_SIZE_MAX,
            // Linux sends at most a page of entries; allow a generous multiple.
            op::BATCH_FORGET | op::REMOVEMAPPING => 64 * PAGE_SIZE as usize,
            _ => SMALL,
        }
    }

    fn check_io_size(&self, size: u32) -> io::Result<()> {
        let max = self.session.max_io.load(Ordering::Relaxed);
        if size > max {
            log::warn!("I/O of {size} bytes exceeds the negotiated maximum {max}");
            return Err(einval());
        }
        Ok(())
    }

    /// The INIT flags the server and transport want, whatever the filesystem wants.
    ///
    /// Not `FUSE_ATOMIC_O_TRUNC` (virtiofsd asks for it): with it Linux sends an `O_TRUNC`
    /// open's truncation inside OPEN, from `vfs_open`, before the VFS checks the truncation
    /// may happen (`handle_truncate`: ETXTBSY while the file is being executed). An
    /// `open(O_RDONLY | O_TRUNC)` of a running program then failed with ETXTBSY after the
    /// host file was emptied, and the program died of SIGBUS. Without it the kernel strips
    /// `O_TRUNC` from OPEN and truncates with SETATTR once its checks pass: one more round
    /// trip for an `O_TRUNC` open of an existing file (CREATE is unchanged).
    fn server_wants(&self) -> u64 {
        let mut want = init_flags::ASYNC_READ
            | init_flags::BIG_WRITES
            | init_flags::PARALLEL_DIROPS
            | init_flags::MAX_PAGES
            | init_flags::HAS_IOCTL_DIR
            | init_flags::INIT_EXT
            | init_flags::SETXATTR_EXT;
        if self.mapper.window_size() > 0 {
            want |= init_flags::MAP_ALIGNMENT;
            if self.dax_policy != DaxPolicy::Never {
                want |= init_flags::HAS_INODE_DAX;
            }
        }
        want | self.transport_flags
    }

    fn init(&self, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        if self.session.initialized.load(Ordering::Acquire) {
            // A rebooted guest (the device was only stopped, not reset) starts over.
            log::info!("INIT in an initialized session: ending the previous session");
            self.reset();
        }
        let mut a = InitIn::default();
        let n = r.available().min(std::mem::size_of::<InitIn>());
        if n < COMPAT_INIT_IN_SIZE {
            return Err(einval());
        }
        r.read_exact(&mut a.as_mut_slice()[..n])?;
        if a.major < KERNEL_VERSION {
            log::error!("client speaks FUSE {}.{}, need 7.x", a.major, a.minor);
            return Err(err(libc::EPROTO));
        }
        let mut out = InitOut {
            major: KERNEL_VERSION,
            minor: KERNEL_MINOR_VERSION,
            ..Default::default()
        };
        if a.major > KERNEL_VERSION {
            // The client retries INIT with our major version.
            return obj(w, &out);
        }
        if a.minor < MIN_KERNEL_MINOR_VERSION {
            log::error!(
                "client speaks FUSE 7.{}, need 7.{MIN_KERNEL_MINOR_VERSION}",
                a.minor
            );
            return Err(err(libc::EPROTO));
        }
        let mut offered = u64::from(a.flags);
        if offered & init_flags::INIT_EXT != 0 {
            offered |= u64::from(a.flags2) << 32;
        }
        let want = self.server_wants() | self.fs.init(InitCaps { flags: offered })?;
        let agreed = want & offered;
        let max_pages = if agreed & init_flags::MAX_PAGES != 0 {
            self.max_pages
        } else {
            32
        };
        let max_io = u32::from(max_pages) * PAGE_SIZE;
        out.max_readahead = a.max_readahead;
        out.flags = agreed as u32;
        out.flags2 = (agreed >> 32) as u32;
        out.max_background = 64;
        out.congestion_threshold = 48;
        out.max_write = max_io;
        out.time_gran = 1;
        out.max_pages = max_pages;
        if agreed & init_flags::MAP_ALIGNMENT != 0 {
            out.map_alignment = MAP_ALIGNMENT_LOG2;
        }
        if agreed & init_flags::PASSTHROUGH != 0 {
            out.max_stack_depth = self.max_stack_depth;
        } else if self.fuse_passthrough.is_some() {
            log::warn!(
                "the client does not offer FUSE_PASSTHROUGH (kernel without CONFIG_FUSE_PASSTHROUGH or older than 6.9): files are served through READ/WRITE"
            );
        }
        self.session.minor.store(a.minor, Ordering::Relaxed);
        self.session.max_io.store(max_io, Ordering::Relaxed);
        self.session.flags.store(agreed, Ordering::Relaxed);
        self.session.initialized.store(true, Ordering::Release);
        self.keep_session();
        log::info!(
            "INIT: client FUSE {}.{}, flags {agreed:#x}, max_write {max_io}, DAX window {} bytes",
            a.major,
            a.minor,
            self.mapper.window_size()
        );
        obj(w, &out)
    }

    /// Marks a regular file for per-inode DAX when the session negotiated it and the
    /// policy picks the file.
    fn apply_dax_policy(&self, attr: &mut Attr) {
        let inode_dax = self.session.flags.load(Ordering::Relaxed) & init_flags::HAS_INODE_DAX != 0;
        if inode_dax
            && attr.mode & libc::S_IFMT == libc::S_IFREG
            && self.dax_policy.picks(attr.size)
        {
            attr.flags |= attr_flags::DAX;
        }
    }

    /// Wire form of a lookup answer.
    fn entry_out(&self, e: &Entry) -> EntryOut {
        let mut out = entry_out(e);
        self.apply_dax_policy(&mut out.attr);
        out
    }

    fn entry(&self, w: &mut Writer, e: Entry) -> HandlerResult {
        obj(w, &self.entry_out(&e))
    }

    fn attr(&self, w: &mut Writer, (mut attr, timeout): (Attr, Duration)) -> HandlerResult {
        self.apply_dax_policy(&mut attr);
        let (attr_valid, attr_valid_nsec) = split_timeout(timeout);
        obj(
            w,
            &AttrOut {
                attr_valid,
                attr_valid_nsec,
                dummy: 0,
                attr,
            },
        )
    }
}

fn obj<T: ByteValued>(w: &mut Writer, v: &T) -> HandlerResult {
    w.write_obj(v)?;
    Ok(Reply::Body)
}

fn empty(res: io::Result<()>) -> HandlerResult {
    res.map(|()| Reply::Body)
}

fn split_timeout(d: Duration) -> (u64, u32) {
    (d.as_secs(), d.subsec_nanos())
}

/// Wire form of a lookup answer (without the server's DAX policy).
pub fn entry_out(e: &Entry) -> EntryOut {
    let (entry_valid, entry_valid_nsec) = split_timeout(e.entry_timeout);
    let (attr_valid, attr_valid_nsec) = split_timeout(e.attr_timeout);
    EntryOut {
        nodeid: e.inode.raw(),
        generation: e.generation,
        entry_valid,
        attr_valid,
        entry_valid_nsec,
        attr_valid_nsec,
        attr: e.attr,
    }
}

fn open_out(fh: Handle, open_flags: u32, backing: Option<i32>) -> OpenOut {
    match backing {
        // Linux refuses FOPEN_PASSTHROUGH with any flag outside FOPEN_PASSTHROUGH_MASK
        // (KEEP_CACHE: there is no FUSE page cache to keep), and with DIRECT_IO it would
        // still send READ/WRITE here (only mmap goes to the backing file). The backing file
        // is the host file itself, so what --cache never wants (no stale cached copy) holds
        // without DIRECT_IO.
        Some(id) => OpenOut {
            fh: fh.raw(),
            open_flags: (open_flags & fopen::NOFLUSH) | fopen::PASSTHROUGH,
            backing_id: id,
        },
        None => OpenOut {
            fh: fh.raw(),
            open_flags,
            backing_id: 0,
        },
    }
}

fn xattr(w: &mut Writer, size: u32, reply: XattrReply) -> HandlerResult {
    match reply {
        XattrReply::Count(n) => obj(
            w,
            &GetxattrOut {
                size: n,
                padding: 0,
            },
        ),
        XattrReply::Value(v) if size == 0 => {
            let n = u32::try_from(v.len()).map_err(|_| err(libc::E2BIG))?;
            obj(
                w,
                &GetxattrOut {
                    size: n,
                    padding: 0,
                },
            )
        }
        XattrReply::Value(v) if v.len() > size as usize => Err(err(libc::ERANGE)),
        XattrReply::Value(v) => {
            w.write_all(&v)?;
            Ok(Reply::Body)
        }
    }
}
