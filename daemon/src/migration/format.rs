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
//!
//! This module holds the frame and the field codec ([`Enc`], [`Dec`]); each part of the
//! payload encodes itself through [`Codec`] next to what it describes: the session in the
//! FUSE server (`protocol::server::SessionState`), the tables in the passthrough file system
//! (`passthrough::state::FsState`, file handles in `passthrough::fhandle`).

use std::io;

pub const MAGIC: &[u8; 8] = b"DAXFSMIG";
pub const VERSION: u32 = 1;
/// Largest stream accepted (header, payload and checksum).
pub const MAX_STREAM: usize = 64 << 20;
const HEADER_LEN: usize = 16;
const TRAILER_LEN: usize = 8;

/// The error for a malformed or unencodable state (`InvalidData`).
pub fn bad(what: impl Into<String>) -> io::Error {
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

/// A part of the state that writes itself into a payload and reads itself back: each layer
/// describes its own part (the server its session, the file system its tables).
pub trait Codec: Sized {
    /// Appends this part to the payload; refuses what the format cannot carry.
    fn encode(&self, e: &mut Enc) -> io::Result<()>;
    /// Reads this part; any malformation is an `InvalidData` error, never a panic.
    fn decode(d: &mut Dec) -> io::Result<Self>;
    /// Consistency checks beyond the format.
    fn validate(&self) -> io::Result<()> {
        Ok(())
    }
    /// A few words for the log ("3 inodes, 1 handles").
    fn summary(&self) -> String {
        String::new()
    }
}

/// The payload being written (little endian).
#[derive(Default)]
pub struct Enc(Vec<u8>);

impl Enc {
    pub fn new() -> Self {
        Enc(Vec::new())
    }
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// `b` as u16 length + bytes, refused when longer than `max`.
    pub fn bytes16(&mut self, b: &[u8], max: usize, what: &str) -> io::Result<()> {
        if b.len() > max {
            return Err(bad(format!("{what} of {} bytes (most {max})", b.len())));
        }
        self.u16(b.len() as u16);
        self.0.extend_from_slice(b);
        Ok(())
    }
    /// The complete stream around the payload: magic, version, length, payload, checksum.
    pub fn into_stream(self) -> io::Result<Vec<u8>> {
        let payload = self.0;
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
}

/// The payload being read; every read is checked against what is left.
pub struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    /// Checks the frame of a complete stream (size, magic, version, length, checksum) and
    /// reads its payload.
    pub fn stream(stream: &'a [u8]) -> io::Result<Self> {
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
        Ok(Dec {
            buf: payload,
            pos: 0,
        })
    }
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
    pub fn u8(&mut self, what: &str) -> io::Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    pub fn u16(&mut self, what: &str) -> io::Result<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub fn u32(&mut self, what: &str) -> io::Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self, what: &str) -> io::Result<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    pub fn bool(&mut self, what: &str) -> io::Result<bool> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(bad(format!("{what}: {v} is not a boolean"))),
        }
    }
    /// u16 length + bytes, refused when longer than `max`.
    pub fn bytes16(&mut self, max: usize, what: &str) -> io::Result<Vec<u8>> {
        let n = usize::from(self.u16(what)?);
        if n > max {
            return Err(bad(format!("{what} of {n} bytes (most {max})")));
        }
        Ok(self.take(n, what)?.to_vec())
    }
    /// A count of records at least `min_len` bytes each, checked against its cap and
    /// against what is left of the stream (so no count can make us allocate more than the
    /// stream's own size).
    pub fn count(&mut self, max: usize, min_len: usize, what: &str) -> io::Result<usize> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(bad(format!("{n} {what} (most {max})")));
        }
        if n.saturating_mul(min_len) > self.buf.len() - self.pos {
            return Err(bad(format!("{n} {what} do not fit in the stream")));
        }
        Ok(n)
    }
    /// Checks the whole payload was read.
    pub fn finish(self) -> io::Result<()> {
        if self.pos != self.buf.len() {
            return Err(bad(format!(
                "{} trailing bytes after the device state",
                self.buf.len() - self.pos
            )));
        }
        Ok(())
    }
}
