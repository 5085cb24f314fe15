//! A FUSE client over the virtio-fs queues: request encoding, strict reply checks, and one
//! method per operation. Requests go out as Linux's virtio-fs driver lays them out: the
//! in-header and each argument in its own device-readable buffer, then the out-header and
//! the reply body in device-writable buffers.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use daxfsd::abi::{self, init_flags as f, opcode as op};
use daxfsd::abi::{EntryOut, InHeader, InitIn, InitOut, OutHeader};
use vm_memory::ByteValued;

use crate::device::{Device, DriverConfig};
use crate::queue::{Chain, Seg};
use crate::DaxWindow;

mod ops;

const OUT_HDR: usize = std::mem::size_of::<OutHeader>();

/// A raw reply: what the device wrote into the writable buffers.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Length of the used-ring element.
    pub used_len: u32,
    /// The bytes written, `min(used_len, capacity)` of them.
    pub data: Vec<u8>,
    /// Size of the writable buffers.
    pub capacity: u32,
}

impl Reply {
    /// The out-header, if the reply has 16 bytes.
    pub fn header(&self) -> Option<OutHeader> {
        self.data
            .get(..OUT_HDR)
            .and_then(OutHeader::from_slice)
            .copied()
    }

    /// Bytes after the out-header, up to the header's `len`.
    pub fn body(&self) -> &[u8] {
        let end = self
            .header()
            .map_or(0, |h| h.len as usize)
            .min(self.data.len());
        self.data.get(OUT_HDR..end).unwrap_or(&[])
    }
}

/// `FUSE_INIT` parameters.
#[derive(Debug, Clone, Copy)]
pub struct InitOptions {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    /// `flags | flags2 << 32`.
    pub flags: u64,
}

impl InitOptions {
    /// What a Linux 6.12 virtio-fs mount asks for, minus the flags that make the kernel append
    /// request extensions this driver does not produce (SECURITY_CTX, CREATE_SUPP_GROUP) and
    /// PASSTHROUGH (meaningless over virtio). With `dax`, also MAP_ALIGNMENT.
    pub fn linux(dax: bool) -> InitOptions {
        let flags = f::ASYNC_READ
            | f::POSIX_LOCKS
            | f::ATOMIC_O_TRUNC
            | f::EXPORT_SUPPORT
            | f::BIG_WRITES
            | f::DONT_MASK
            | f::SPLICE_WRITE
            | f::SPLICE_MOVE
            | f::SPLICE_READ
            | f::FLOCK_LOCKS
            | f::HAS_IOCTL_DIR
            | f::AUTO_INVAL_DATA
            | f::DO_READDIRPLUS
            | f::READDIRPLUS_AUTO
            | f::ASYNC_DIO
            | f::WRITEBACK_CACHE
            | f::NO_OPEN_SUPPORT
            | f::PARALLEL_DIROPS
            | f::HANDLE_KILLPRIV
            | f::POSIX_ACL
            | f::ABORT_ERROR
            | f::MAX_PAGES
            | f::CACHE_SYMLINKS
            | f::NO_OPENDIR_SUPPORT
            | f::EXPLICIT_INVAL_DATA
            | f::HANDLE_KILLPRIV_V2
            | f::SETXATTR_EXT
            | f::INIT_EXT
            | f::HAS_EXPIRE_ONLY
            | f::DIRECT_IO_ALLOW_MMAP
            | f::NO_EXPORT_SUPPORT
            | f::HAS_RESEND
            | f::ALLOW_IDMAP
            | f::SUBMOUNTS
            | f::HAS_INODE_DAX
            | if dax { f::MAP_ALIGNMENT } else { 0 };
        InitOptions {
            major: abi::KERNEL_VERSION,
            minor: abi::KERNEL_MINOR_VERSION,
            max_readahead: 128 << 10,
            flags,
        }
    }
}

/// A directory entry from READDIR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub off: u64,
    pub typ: u32,
    pub name: Vec<u8>,
}

/// A directory entry from READDIRPLUS.
#[derive(Debug, Clone)]
pub struct DirEntryPlus {
    pub entry: EntryOut,
    pub dirent: DirEntry,
}

/// Answer of GETXATTR / LISTXATTR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Xattr {
    /// Size probe (asked with size 0): the size needed.
    Size(u32),
    /// The value (or the NUL-separated name list).
    Data(Vec<u8>),
}

struct Shared {
    unique: AtomicU64,
    init: Mutex<Option<(InitIn, InitOut)>>,
}

/// A FUSE session on a virtio-fs device. Cheap to clone; clones share the connection, which
/// closes when the last clone is dropped. Each clone is bound to one request queue
/// ([`Session::on_queue`]); any number of threads may use sessions at once.
#[derive(Clone)]
pub struct Session {
    dev: Arc<Device>,
    shared: Arc<Shared>,
    queue: usize,
    uid: u32,
    gid: u32,
    pid: u32,
    timeout: Option<Duration>,
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn cstr(name: impl AsRef<OsStr>) -> Vec<u8> {
    let mut v = name.as_ref().as_bytes().to_vec();
    v.push(0);
    v
}

fn obj<T: ByteValued>(what: u32, body: &[u8]) -> io::Result<T> {
    if body.len() != std::mem::size_of::<T>() {
        return Err(bad(format!(
            "{} reply: body of {} bytes, expected {}",
            op::name(what),
            body.len(),
            std::mem::size_of::<T>()
        )));
    }
    T::from_slice(body)
        .copied()
        .ok_or_else(|| bad("misaligned reply"))
}

fn empty(what: u32, body: Vec<u8>) -> io::Result<()> {
    if !body.is_empty() {
        return Err(bad(format!(
            "{} reply: unexpected {}-byte body",
            op::name(what),
            body.len()
        )));
    }
    Ok(())
}

impl Session {
    /// Connects to a backend socket with the default [`DriverConfig`].
    pub fn connect(socket: &Path) -> io::Result<Session> {
        Self::connect_with(socket, &DriverConfig::default())
    }

    /// Connects to a backend socket.
    pub fn connect_with(socket: &Path, cfg: &DriverConfig) -> io::Result<Session> {
        Ok(Self::new(Device::connect(socket, cfg)?))
    }

    /// A session on a started device, on the first request queue (1, or 2 after the
    /// notification queue).
    pub fn new(dev: Arc<Device>) -> Session {
        let queue = 1 + usize::from(dev.info().notification);
        Session {
            dev,
            shared: Arc::new(Shared {
                unique: AtomicU64::new(0),
                init: Mutex::new(None),
            }),
            queue,
            uid: 0,
            gid: 0,
            pid: std::process::id(),
            timeout: None,
        }
    }

    /// This session bound to queue `queue` (1..=num_request_queues; 0 is hiprio).
    pub fn on_queue(&self, queue: usize) -> io::Result<Session> {
        self.dev.queue(queue)?;
        Ok(Session {
            queue,
            ..self.clone()
        })
    }

    /// This session sending requests as `uid`/`gid`/`pid`.
    pub fn with_creds(&self, uid: u32, gid: u32, pid: u32) -> Session {
        Session {
            uid,
            gid,
            pid,
            ..self.clone()
        }
    }

    /// This session with its own request timeout.
    pub fn with_timeout(&self, t: Duration) -> Session {
        Session {
            timeout: Some(t),
            ..self.clone()
        }
    }

    /// The queue this session sends on.
    pub fn queue(&self) -> usize {
        self.queue
    }

    /// The device (queues, negotiated features, violations, control-plane access).
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// The DAX window, if the device has one.
    pub fn dax(&self) -> Option<&Arc<DaxWindow>> {
        self.dev.dax()
    }

    /// The INIT exchange, once done.
    pub fn init_state(&self) -> Option<(InitIn, InitOut)> {
        self.shared.init.lock().ok().and_then(|g| *g)
    }

    /// Flags both sides agreed on in INIT.
    pub fn negotiated(&self) -> u64 {
        self.init_state().map_or(0, |(i, o)| {
            let req = u64::from(i.flags) | u64::from(i.flags2) << 32;
            let mut got = u64::from(o.flags);
            if got & f::INIT_EXT != 0 {
                got |= u64::from(o.flags2) << 32;
            }
            req & got
        })
    }

    /// A fresh request id (never 0).
    pub fn next_unique(&self) -> u64 {
        self.shared.unique.fetch_add(2, Ordering::Relaxed) + 2
    }

    /// An in-header for a request with `body_len` argument bytes, with a fresh unique.
    pub fn header(&self, opcode: u32, nodeid: u64, body_len: usize) -> InHeader {
        InHeader {
            len: (std::mem::size_of::<InHeader>() + body_len) as u32,
            opcode,
            unique: self.next_unique(),
            nodeid,
            uid: self.uid,
            gid: self.gid,
            pid: self.pid,
            total_extlen: 0,
            padding: 0,
        }
    }

    fn timeout(&self) -> Duration {
        self.timeout.unwrap_or_else(|| self.dev.timeout())
    }

    /// A request chain laid out as Linux lays it out: the in-header, each argument in its own
    /// readable buffer, the out-header, and (when `body` > 0) a reply body of `body` bytes.
    pub fn linux_chain(&self, opcode: u32, nodeid: u64, parts: &[&[u8]], body: u32) -> Chain {
        let len = parts.iter().map(|p| p.len()).sum();
        let hdr = self.header(opcode, nodeid, len);
        let mut segs = vec![Seg::Readable(hdr.as_slice().to_vec())];
        segs.extend(parts.iter().map(|p| Seg::Readable(p.to_vec())));
        segs.push(Seg::Writable(std::mem::size_of::<OutHeader>() as u32));
        if body > 0 {
            segs.push(Seg::Writable(body));
        }
        Chain {
            segs,
            indirect: self.dev.info().indirect_desc,
        }
    }

    /// Sends a request built from an in-header and `parts` (each in its own readable
    /// buffer, as given: empty parts become zero-length descriptors), with `reply_capacity`
    /// writable bytes (split as out-header + body when over 16; 0 = no writable buffer) on
    /// queue `queue`. Returns whatever came back, unchecked; a timeout is an error of kind
    /// `TimedOut`.
    pub fn send(
        &self,
        opcode: u32,
        nodeid: u64,
        parts: &[&[u8]],
        reply_capacity: u32,
        queue: usize,
    ) -> io::Result<Reply> {
        let body_len = parts.iter().map(|p| p.len()).sum();
        let hdr = self.header(opcode, nodeid, body_len);
        self.send_with_header(&hdr, parts, reply_capacity, queue)
    }

    /// [`Session::send`] with a caller-made in-header (e.g. a lying `len`).
    pub fn send_with_header(
        &self,
        hdr: &InHeader,
        parts: &[&[u8]],
        reply_capacity: u32,
        queue: usize,
    ) -> io::Result<Reply> {
        let mut segs = vec![Seg::Readable(hdr.as_slice().to_vec())];
        segs.extend(parts.iter().map(|p| Seg::Readable(p.to_vec())));
        match reply_capacity {
            0 => {}
            c if c as usize <= OUT_HDR => segs.push(Seg::Writable(c)),
            c => {
                segs.push(Seg::Writable(OUT_HDR as u32));
                segs.push(Seg::Writable(c - OUT_HDR as u32));
            }
        }
        self.send_chain(queue, segs)
    }

    /// Sends an arbitrary descriptor chain (indirect if the device negotiated it).
    pub fn send_chain(&self, queue: usize, segs: Vec<Seg>) -> io::Result<Reply> {
        let chain = Chain {
            segs,
            indirect: self.dev.info().indirect_desc,
        };
        let c = self.dev.submit(queue, &chain)?.wait(self.timeout())?;
        Ok(Reply {
            used_len: c.used_len,
            data: c.data,
            capacity: c.capacity,
        })
    }

    /// Sends a request and checks the reply strictly; returns the body or the error.
    pub fn call(
        &self,
        opcode: u32,
        nodeid: u64,
        parts: &[&[u8]],
        body_cap: usize,
    ) -> io::Result<Vec<u8>> {
        let body_len = parts.iter().map(|p| p.len()).sum();
        let hdr = self.header(opcode, nodeid, body_len);
        let cap = u32::try_from(OUT_HDR + body_cap).map_err(|_| bad("reply capacity too big"))?;
        let r = self.send_with_header(&hdr, parts, cap, self.queue)?;
        check_reply(&hdr, &r)
    }

    /// Sends a request that has no reply (FORGET, BATCH_FORGET) on the hiprio queue and waits
    /// for the device to return the buffers.
    fn call_noreply(&self, opcode: u32, nodeid: u64, parts: &[&[u8]]) -> io::Result<()> {
        let r = self.send(opcode, nodeid, parts, 0, 0)?;
        if r.used_len != 0 {
            return Err(bad(format!(
                "{} completed with used len {}",
                op::name(opcode),
                r.used_len
            )));
        }
        Ok(())
    }

    /// FUSE_INIT as a Linux guest sends it (see [`InitOptions::linux`]).
    pub fn init(&self) -> io::Result<InitOut> {
        self.init_with(&InitOptions::linux(self.dax().is_some()))
    }

    /// FUSE_INIT with chosen parameters.
    pub fn init_with(&self, o: &InitOptions) -> io::Result<InitOut> {
        let arg = InitIn {
            major: o.major,
            minor: o.minor,
            max_readahead: o.max_readahead,
            flags: o.flags as u32,
            flags2: (o.flags >> 32) as u32,
            unused: [0; 11],
        };
        let bytes = if o.minor < 36 {
            &arg.as_slice()[..abi::COMPAT_INIT_IN_SIZE]
        } else {
            arg.as_slice()
        };
        let body = self.call(op::INIT, 0, &[bytes], std::mem::size_of::<InitOut>())?;
        let out: InitOut = obj(op::INIT, &body)?;
        if let Ok(mut g) = self.shared.init.lock() {
            *g = Some((arg, out));
        }
        Ok(out)
    }
}

/// Checks a reply to the request with header `hdr`: out-header present, same unique,
/// consistent lengths, a sane errno. Returns the body or the error.
fn check_reply(hdr: &InHeader, r: &Reply) -> io::Result<Vec<u8>> {
    let name = op::name(hdr.opcode);
    let cap = r.capacity;
    let h = r.header().ok_or_else(|| {
        bad(format!(
            "{name} reply: used len {} is shorter than an out-header",
            r.used_len
        ))
    })?;
    if h.unique != hdr.unique {
        return Err(bad(format!(
            "{name} reply: unique {} for request {}",
            h.unique, hdr.unique
        )));
    }
    if (h.len as usize) < OUT_HDR || h.len > cap || h.len != r.used_len {
        return Err(bad(format!(
            "{name} reply: header len {}, used len {}, capacity {cap}",
            h.len, r.used_len
        )));
    }
    if h.error != 0 {
        if h.error > 0 || h.error <= -4096 || h.len as usize != OUT_HDR {
            return Err(bad(format!(
                "{name} reply: bad error {} (len {})",
                h.error, h.len
            )));
        }
        return Err(io::Error::from_raw_os_error(-h.error));
    }
    Ok(r.data[OUT_HDR..h.len as usize].to_vec())
}
