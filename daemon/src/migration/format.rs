//! The device-state stream: a versioned, bounds-checked binary format.
//!
//! ```text
//! magic "DAXFSMIG" | version u32 | payload length u32 | payload | FNV-1a 64 of the payload
//! payload: session | fs
//!   session: initialized u8, minor u32, max_io u32, flags u64
//!   fs:      negotiated u32, next_inode u64, next_handle u64,
//!            inode count u32, inodes, handle count u32, handles
//!   inode:   id u64, refs u64, generation u64, kind u32, location, verify handle (u8 + handle)
//!   location: 0 root | 1 path (u16 len + bytes) | 2 file handle | 3 lost
//!   file handle: type i32, u16 len + bytes
//!   handle:  fh u64, inode u64, dir u8, open flags u32
//! ```
//! All integers are little endian. The stream comes from the frontend (QEMU's migration
//! stream), so the decoder trusts nothing: every length is checked against what is left and
//! against a fixed cap before anything is allocated, the checksum catches corruption, and any
//! violation is an error naming what was wrong, never a panic.

use std::io;

use super::{DeviceState, FileHandleBytes, FsState, HandleState, InodeState, Location};
use super::{SessionState, MAX_FILE_HANDLE, MAX_HANDLES, MAX_INODES, MAX_PATH};

pub const MAGIC: &[u8; 8] = b"DAXFSMIG";
pub const VERSION: u32 = 1;
/// Largest stream accepted (header, payload and checksum).
pub const MAX_STREAM: usize = 64 << 20;
const HEADER_LEN: usize = 16;
const TRAILER_LEN: usize = 8;

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// FNV-1a, 64 bits: enough to catch a corrupted stream (it is no defence against a forger,
/// who controls the frontend anyway).
pub fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes16(&mut self, b: &[u8], max: usize, what: &str) -> io::Result<()> {
        if b.len() > max {
            return Err(bad(format!("{what} of {} bytes (most {max})", b.len())));
        }
        self.u16(b.len() as u16);
        self.0.extend_from_slice(b);
        Ok(())
    }
    fn file_handle(&mut self, h: &FileHandleBytes) -> io::Result<()> {
        self.u32(h.handle_type as u32);
        self.bytes16(&h.bytes, MAX_FILE_HANDLE, "file handle")
    }
}

/// Encodes `state` into a complete stream.
pub fn encode(state: &DeviceState) -> io::Result<Vec<u8>> {
    let fs = &state.fs;
    if fs.inodes.len() > MAX_INODES || fs.handles.len() > MAX_HANDLES {
        return Err(bad(format!(
            "{} inodes and {} handles: more than a stream may carry ({MAX_INODES}, {MAX_HANDLES})",
            fs.inodes.len(),
            fs.handles.len()
        )));
    }
    let mut e = Enc(Vec::new());
    let s = &state.session;
    e.u8(u8::from(s.initialized));
    e.u32(s.minor);
    e.u32(s.max_io);
    e.u64(s.flags);
    e.u32(fs.negotiated);
    e.u64(fs.next_inode);
    e.u64(fs.next_handle);
    e.u32(fs.inodes.len() as u32);
    for i in &fs.inodes {
        e.u64(i.id);
        e.u64(i.refs);
        e.u64(i.generation);
        e.u32(i.kind);
        match &i.location {
            Location::Root => e.u8(0),
            Location::Path(p) => {
                e.u8(1);
                e.bytes16(p, MAX_PATH, "path")?;
            }
            Location::Handle(h) => {
                e.u8(2);
                e.file_handle(h)?;
            }
            Location::Lost => e.u8(3),
        }
        match &i.verify {
            None => e.u8(0),
            Some(h) => {
                e.u8(1);
                e.file_handle(h)?;
            }
        }
    }
    e.u32(fs.handles.len() as u32);
    for h in &fs.handles {
        e.u64(h.fh);
        e.u64(h.inode);
        e.u8(u8::from(h.dir));
        e.u32(h.flags);
    }
    let payload = e.0;
    let total = HEADER_LEN + payload.len() + TRAILER_LEN;
    if total > MAX_STREAM {
        return Err(bad(format!(
            "state of {total} bytes exceeds the {MAX_STREAM}-byte limit"
        )));
    }
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    out.extend_from_slice(&fnv1a64(&payload).to_le_bytes());
    Ok(out)
}

struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize, what: &str) -> io::Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| bad(format!("stream truncated in {what}")))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> io::Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> io::Result<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> io::Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &str) -> io::Result<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn bool(&mut self, what: &str) -> io::Result<bool> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(bad(format!("{what}: {v} is not a boolean"))),
        }
    }
    fn bytes16(&mut self, max: usize, what: &str) -> io::Result<Vec<u8>> {
        let n = usize::from(self.u16(what)?);
        if n > max {
            return Err(bad(format!("{what} of {n} bytes (most {max})")));
        }
        Ok(self.take(n, what)?.to_vec())
    }
    fn file_handle(&mut self) -> io::Result<FileHandleBytes> {
        let handle_type = self.u32("file handle type")? as i32;
        let bytes = self.bytes16(MAX_FILE_HANDLE, "file handle")?;
        if bytes.is_empty() {
            return Err(bad("empty file handle"));
        }
        Ok(FileHandleBytes { handle_type, bytes })
    }
    /// A count of records at least `min_len` bytes each, checked against its cap and
    /// against what is left of the stream (so no count can make us allocate more than the
    /// stream's own size).
    fn count(&mut self, max: usize, min_len: usize, what: &str) -> io::Result<usize> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(bad(format!("{n} {what} (most {max})")));
        }
        if n.saturating_mul(min_len) > self.buf.len() - self.pos {
            return Err(bad(format!("{n} {what} do not fit in the stream")));
        }
        Ok(n)
    }
}

/// Decodes a complete stream; any malformation is an `InvalidData` error.
pub fn decode(stream: &[u8]) -> io::Result<DeviceState> {
    if stream.len() > MAX_STREAM {
        return Err(bad(format!(
            "stream of {} bytes exceeds the {MAX_STREAM}-byte limit",
            stream.len()
        )));
    }
    if stream.len() < HEADER_LEN + TRAILER_LEN {
        return Err(bad(format!(
            "stream of {} bytes is truncated",
            stream.len()
        )));
    }
    if &stream[..8] != MAGIC {
        return Err(bad("not a daxfsd device state (bad magic)"));
    }
    let version = u32::from_le_bytes([stream[8], stream[9], stream[10], stream[11]]);
    if version != VERSION {
        return Err(bad(format!(
            "device state version {version}; this daxfsd reads version {VERSION}"
        )));
    }
    let len = u32::from_le_bytes([stream[12], stream[13], stream[14], stream[15]]) as usize;
    if HEADER_LEN
        .checked_add(len)
        .and_then(|n| n.checked_add(TRAILER_LEN))
        != Some(stream.len())
    {
        return Err(bad(format!(
            "payload length {len} does not match the {}-byte stream",
            stream.len()
        )));
    }
    let payload = &stream[HEADER_LEN..HEADER_LEN + len];
    let mut sum = [0u8; 8];
    sum.copy_from_slice(&stream[HEADER_LEN + len..]);
    if u64::from_le_bytes(sum) != fnv1a64(payload) {
        return Err(bad("checksum mismatch: the device state is corrupt"));
    }
    let mut d = Dec {
        buf: payload,
        pos: 0,
    };
    let session = SessionState {
        initialized: d.bool("session state")?,
        minor: d.u32("session minor")?,
        max_io: d.u32("session max_io")?,
        flags: d.u64("session flags")?,
    };
    let negotiated = d.u32("negotiated flags")?;
    let next_inode = d.u64("next inode")?;
    let next_handle = d.u64("next handle")?;
    // Smallest inode record: 3 x u64 + u32 + location tag + verify tag.
    let n = d.count(MAX_INODES, 30, "inodes")?;
    let mut inodes = Vec::with_capacity(n);
    for _ in 0..n {
        let id = d.u64("inode id")?;
        let refs = d.u64("inode refs")?;
        let generation = d.u64("inode generation")?;
        let kind = d.u32("inode kind")?;
        let location = match d.u8("inode location")? {
            0 => Location::Root,
            1 => Location::Path(d.bytes16(MAX_PATH, "path")?),
            2 => Location::Handle(d.file_handle()?),
            3 => Location::Lost,
            t => return Err(bad(format!("inode {id}: unknown location tag {t}"))),
        };
        let verify = match d.bool("verify handle tag")? {
            false => None,
            true => Some(d.file_handle()?),
        };
        inodes.push(InodeState {
            id,
            refs,
            generation,
            kind,
            location,
            verify,
        });
    }
    let n = d.count(MAX_HANDLES, 21, "handles")?;
    let mut handles = Vec::with_capacity(n);
    for _ in 0..n {
        handles.push(HandleState {
            fh: d.u64("handle id")?,
            inode: d.u64("handle inode")?,
            dir: d.bool("handle kind")?,
            flags: d.u32("handle flags")?,
        });
    }
    if d.pos != payload.len() {
        return Err(bad(format!(
            "{} trailing bytes after the device state",
            payload.len() - d.pos
        )));
    }
    Ok(DeviceState {
        session,
        fs: FsState {
            negotiated,
            next_inode,
            next_handle,
            inodes,
            handles,
        },
    })
}
