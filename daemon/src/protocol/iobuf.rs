//! Scatter-gather request and reply buffers.
//!
//! A transport turns one request into a [`Reader`] over the bytes the client wrote and a
//! [`Writer`] over the bytes the client will read back. Both are lists of
//! [`VolatileSlice`]s that the transport has already checked to lie inside memory it owns
//! (guest memory for virtio, a plain buffer for tests and `/dev/fuse`). Every access here is
//! bounds-checked against those slices; file data moves straight between a file and the
//! slices with `preadv`/`pwritev`, without a bounce buffer.
//!
//! A transport may also hand over *far* segments ([`Seg::Far`]): bytes it does not map
//! for the daemon to touch (a virtio-fs guest buffer inside the DAX window, whose memory is
//! a host file that a host process may shrink under it). Those are moved by the transport's
//! [`FarIo`] with `pread`/`pwrite` on whatever backs them, through a bounce buffer of at most
//! [`FAR_CHUNK`] bytes; a far segment that fails fails the operation that reached it (EIO),
//! as a bad user buffer does a local read or write. This layer never learns what they are.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;

use vm_memory::{ByteValued, VolatileSlice};

/// Most iovecs handed to one `preadv`/`pwritev` (Linux `UIO_MAXIOV`).
const MAX_IOVECS: usize = 1024;

/// Most bytes of a far segment moved through one bounce buffer.
pub const FAR_CHUNK: usize = 128 << 10;

/// Moves the bytes of far segments for a transport (see the module doc). `at` is the
/// transport's own address of the first byte; a call never reaches past the segment it was
/// given.
pub trait FarIo: Sync {
    /// Fills all of `buf` with the bytes at `at`, or fails.
    fn read_far(&self, at: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Stores all of `data` at `at`, or fails.
    fn write_far(&self, at: u64, data: &[u8]) -> io::Result<()>;
}

/// One buffer of a request.
#[derive(Clone, Copy, Debug)]
pub enum Seg<'a> {
    /// Memory the transport checked and maps for as long as `'a`.
    Mem(VolatileSlice<'a>),
    /// `len` bytes at the transport's address `at`, moved by its [`FarIo`].
    Far { at: u64, len: usize },
}

impl<'a> Seg<'a> {
    pub fn len(&self) -> usize {
        match self {
            Seg::Mem(s) => s.len(),
            Seg::Far { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The segment without its first `n` (< len) bytes.
    #[inline]
    fn skip(self, n: usize) -> Seg<'a> {
        match self {
            // `n < len`, so the offset is in bounds.
            Seg::Mem(s) => Seg::Mem(s.offset(n).unwrap_or(s)),
            Seg::Far { at, len } => Seg::Far {
                at: at.wrapping_add(n as u64),
                len: len.saturating_sub(n),
            },
        }
    }

    /// The first `n` bytes (at most all of them) and the rest.
    fn split(self, n: usize) -> (Seg<'a>, Seg<'a>) {
        match self {
            Seg::Mem(s) => match s.split_at(n.min(s.len())) {
                Ok((a, b)) => (Seg::Mem(a), Seg::Mem(b)),
                // Unreachable (`n <= len`); an empty rest either way.
                Err(_) => (Seg::Mem(s), Seg::Far { at: 0, len: 0 }),
            },
            Seg::Far { at, len } => {
                let n = n.min(len);
                (
                    Seg::Far { at, len: n },
                    Seg::Far {
                        at: at.wrapping_add(n as u64),
                        len: len - n,
                    },
                )
            }
        }
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

/// Consumes `count` bytes from the front of a segment list.
fn advance(bufs: &mut VecDeque<Seg<'_>>, mut count: usize) {
    while count > 0 {
        let Some(front) = bufs.front_mut() else {
            return;
        };
        if count < front.len() {
            *front = front.skip(count);
            return;
        }
        count -= front.len();
        bufs.pop_front();
    }
}

/// iovecs kept on the stack: a request's data usually spans a few guest buffers.
const INLINE_IOVECS: usize = 8;

/// The iovecs of one `preadv`/`pwritev`: inline up to [`INLINE_IOVECS`] (no allocation per
/// request), else on the heap.
enum Iovecs {
    Inline([libc::iovec; INLINE_IOVECS], usize),
    Heap(Vec<libc::iovec>),
}

impl Iovecs {
    fn as_slice(&self) -> &[libc::iovec] {
        match self {
            Iovecs::Inline(a, n) => &a[..*n],
            Iovecs::Heap(v) => v,
        }
    }
}

/// Builds at most `MAX_IOVECS` iovecs covering at most `count` bytes of the memory segments
/// at the front of `bufs` (up to the first far one).
fn iovecs(bufs: &VecDeque<Seg<'_>>, count: usize) -> Iovecs {
    let mut left = count;
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    let mut out = Iovecs::Inline([empty; INLINE_IOVECS], 0);
    for b in bufs.iter().filter(|b| !b.is_empty()) {
        if left == 0 || out.as_slice().len() == MAX_IOVECS {
            break;
        }
        let Seg::Mem(b) = b else {
            break;
        };
        let len = b.len().min(left);
        let iov = libc::iovec {
            iov_base: b.ptr_guard_mut().as_ptr().cast(),
            iov_len: len,
        };
        match &mut out {
            Iovecs::Inline(a, n) if *n < INLINE_IOVECS => {
                a[*n] = iov;
                *n += 1;
            }
            Iovecs::Inline(a, n) => {
                let mut v = Vec::with_capacity(bufs.len().min(MAX_IOVECS));
                v.extend_from_slice(&a[..*n]);
                v.push(iov);
                out = Iovecs::Heap(v);
            }
            Iovecs::Heap(v) => v.push(iov),
        }
        left -= len;
    }
    out
}

/// The offset argument of `preadv`/`pwritev`: -1 (the file position) for `None`; EINVAL for
/// an offset past `i64::MAX`.
fn raw_offset(off: Option<u64>) -> io::Result<i64> {
    match off {
        Some(o) => i64::try_from(o).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL)),
        None => Ok(-1),
    }
}

/// `off` moved on by `done` bytes (the file position stays the file position).
fn offset_after(off: Option<u64>, done: usize) -> Option<u64> {
    off.map(|o| o.saturating_add(done as u64))
}

/// One `preadv` (`write` false) or `pwritev` of `iov` at `off`.
fn rw(fd: RawFd, iov: &[libc::iovec], off: Option<u64>, write: bool) -> io::Result<usize> {
    let off = raw_offset(off)?;
    let cnt = libc::c_int::try_from(iov.len()).unwrap_or(libc::c_int::MAX);
    let n = if write {
        // SAFETY: every iovec points into memory the caller guarantees valid for its whole
        // length (a segment the transport checked, or a live bounce buffer); the kernel only
        // reads them.
        unsafe { libc::pwritev(fd, iov.as_ptr(), cnt, off) }
    } else {
        // SAFETY: as above, and that memory is writable (a writer's segment, or a bounce
        // buffer owned by the caller).
        unsafe { libc::preadv(fd, iov.as_ptr(), cnt, off) }
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

fn total_len(bufs: &VecDeque<Seg<'_>>) -> usize {
    bufs.iter()
        .fold(0usize, |acc, b| acc.saturating_add(b.len()))
}

fn mem_segs(bufs: Vec<VolatileSlice<'_>>) -> VecDeque<Seg<'_>> {
    bufs.into_iter().map(Seg::Mem).collect()
}

/// The first non-empty segment, if it is far: `(at, len)`.
fn far_front(bufs: &VecDeque<Seg<'_>>) -> Option<(u64, usize)> {
    match bufs.iter().find(|b| !b.is_empty()) {
        Some(Seg::Far { at, len }) => Some((*at, *len)),
        _ => None,
    }
}

/// The readable part of a request.
#[derive(Clone)]
pub struct Reader<'a> {
    bufs: VecDeque<Seg<'a>>,
    consumed: usize,
    /// Bytes left in `bufs` (kept, not summed per call: a chain may hold 65,535 buffers).
    left: usize,
    /// Moves far segments; `Some` only when the request has one.
    far: Option<&'a dyn FarIo>,
}

impl<'a> Reader<'a> {
    /// A reader over `bufs`, which the caller has bounds-checked.
    pub fn new(bufs: Vec<VolatileSlice<'a>>) -> Self {
        let bufs = mem_segs(bufs);
        Reader {
            left: total_len(&bufs),
            bufs,
            consumed: 0,
            far: None,
        }
    }

    /// A reader over `bufs`: memory segments the caller has bounds-checked, far segments
    /// `far` moves (a far segment without `far` fails with EIO where it is reached).
    pub fn with_far(bufs: Vec<Seg<'a>>, far: Option<&'a dyn FarIo>) -> Self {
        let bufs: VecDeque<_> = bufs.into();
        let far = far.filter(|_| bufs.iter().any(|b| matches!(b, Seg::Far { .. })));
        Reader {
            left: total_len(&bufs),
            bufs,
            consumed: 0,
            far,
        }
    }

    /// Bytes left to read.
    pub fn available(&self) -> usize {
        self.left
    }

    /// Bytes read so far.
    pub fn bytes_read(&self) -> usize {
        self.consumed
    }

    /// Drops everything past the next `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        let mut left = len;
        let mut keep = VecDeque::with_capacity(self.bufs.len());
        while let Some(b) = self.bufs.pop_front() {
            if left == 0 {
                break;
            }
            let n = b.len().min(left);
            keep.push_back(b.split(n).0);
            left -= n;
        }
        self.bufs = keep;
        self.left = total_len(&self.bufs);
    }

    /// Skips the next `len` bytes, or fails with `UnexpectedEof` and consumes nothing.
    pub fn skip(&mut self, len: usize) -> io::Result<()> {
        if self.available() < len {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        advance(&mut self.bufs, len);
        self.left -= len;
        self.consumed += len;
        Ok(())
    }

    /// Fills `buf` completely, or fails (`UnexpectedEof`; EIO from a far segment) and
    /// consumes nothing.
    pub fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        if self.available() < buf.len() {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        let mut done = 0;
        for b in self.bufs.iter() {
            if done == buf.len() {
                break;
            }
            match b {
                Seg::Mem(b) => done += b.copy_to(&mut buf[done..]),
                Seg::Far { at, len } => {
                    let n = (*len).min(buf.len() - done);
                    self.far
                        .ok_or_else(eio)?
                        .read_far(*at, &mut buf[done..done + n])?;
                    done += n;
                }
            }
        }
        advance(&mut self.bufs, done);
        self.left -= done;
        self.consumed += done;
        Ok(())
    }

    /// Reads one wire struct.
    pub fn read_obj<T: ByteValued + Default>(&mut self) -> io::Result<T> {
        let mut v = T::default();
        self.read_exact(v.as_mut_slice())?;
        Ok(v)
    }

    /// Reads the next `len` bytes into a vector.
    pub fn read_vec(&mut self, len: usize) -> io::Result<Vec<u8>> {
        if self.available() < len {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        let mut v = vec![0u8; len];
        self.read_exact(&mut v)?;
        Ok(v)
    }

    /// Writes up to `count` bytes of the request to `fd` at `off` (the file position when
    /// `None`) with one `pwritev` (far segments: one `pwrite` per bounce buffer more).
    /// Returns the bytes written: a far segment that cannot be read ends the write there
    /// (EIO if it is the first byte).
    pub fn write_to_fd(&mut self, fd: RawFd, count: usize, off: Option<u64>) -> io::Result<usize> {
        let count = count.min(self.available());
        if count == 0 {
            return Ok(0);
        }
        if self.far.is_none() {
            // Guest-RAM buffers only: one pwritev, as before far segments existed.
            let iov = iovecs(&self.bufs, count);
            if iov.as_slice().is_empty() {
                return Err(eio()); // a far segment without a transport to move it
            }
            let n = rw(fd, iov.as_slice(), off, true)?;
            advance(&mut self.bufs, n);
            self.left -= n;
            self.consumed += n;
            return Ok(n);
        }
        let mut done = 0;
        while done < count {
            let want = count - done;
            let at = offset_after(off, done);
            let (res, asked) = match far_front(&self.bufs) {
                Some((far_at, len)) => {
                    let n = len.min(want).min(FAR_CHUNK);
                    let mut bounce = vec![0u8; n];
                    let res = self
                        .far
                        .ok_or_else(eio)
                        .and_then(|f| f.read_far(far_at, &mut bounce))
                        .and_then(|()| {
                            let iov = [libc::iovec {
                                iov_base: bounce.as_mut_ptr().cast(),
                                iov_len: n,
                            }];
                            rw(fd, &iov, at, true)
                        });
                    (res, n)
                }
                None => {
                    let iov = iovecs(&self.bufs, want);
                    let iov = iov.as_slice();
                    let asked = iov.iter().map(|v| v.iov_len).sum::<usize>();
                    (rw(fd, iov, at, true), asked)
                }
            };
            let n = match res {
                Ok(n) => n,
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            };
            advance(&mut self.bufs, n);
            self.left -= n;
            self.consumed += n;
            done += n;
            // Short, or nothing to do (only empty segments left).
            if n < asked || asked == 0 {
                break;
            }
        }
        Ok(done)
    }
}

/// The writable part of a request: where the reply goes.
pub struct Writer<'a> {
    bufs: VecDeque<Seg<'a>>,
    written: usize,
    /// Room left in `bufs` (kept, not summed per call).
    left: usize,
    /// Moves far segments; `Some` only when the reply has one.
    far: Option<&'a dyn FarIo>,
}

impl<'a> Writer<'a> {
    /// A writer over `bufs`, which the caller has bounds-checked.
    pub fn new(bufs: Vec<VolatileSlice<'a>>) -> Self {
        let bufs = mem_segs(bufs);
        Writer {
            left: total_len(&bufs),
            bufs,
            written: 0,
            far: None,
        }
    }

    /// A writer over `bufs`: memory segments the caller has bounds-checked, far segments
    /// `far` moves (see [`Reader::with_far`]).
    pub fn with_far(bufs: Vec<Seg<'a>>, far: Option<&'a dyn FarIo>) -> Self {
        let bufs: VecDeque<_> = bufs.into();
        let far = far.filter(|_| bufs.iter().any(|b| matches!(b, Seg::Far { .. })));
        Writer {
            left: total_len(&bufs),
            bufs,
            written: 0,
            far,
        }
    }

    /// Room left.
    pub fn available(&self) -> usize {
        self.left
    }

    /// Bytes written so far.
    pub fn bytes_written(&self) -> usize {
        self.written
    }

    /// Splits off everything from `offset` on into a second writer; `self` keeps the first
    /// `offset` bytes. Used to fill a reply body before its header is known.
    pub fn split_at(&mut self, offset: usize) -> io::Result<Writer<'a>> {
        if offset > self.available() {
            return Err(io::Error::from_raw_os_error(libc::ENOBUFS));
        }
        let mut head = VecDeque::with_capacity(self.bufs.len());
        let mut left = offset;
        while left > 0 {
            let Some(b) = self.bufs.pop_front() else {
                break;
            };
            if b.len() <= left {
                left -= b.len();
                head.push_back(b);
            } else {
                let (a, rest) = b.split(left);
                head.push_back(a);
                self.bufs.push_front(rest);
                left = 0;
            }
        }
        let tail = std::mem::replace(&mut self.bufs, head);
        let rest = self.left - offset;
        self.left = offset;
        Ok(Writer {
            bufs: tail,
            written: 0,
            left: rest,
            far: self.far,
        })
    }

    /// Writes all of `data`, or fails (`ENOBUFS`; EIO from a far segment) and consumes
    /// nothing.
    pub fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        if self.available() < data.len() {
            return Err(io::Error::from_raw_os_error(libc::ENOBUFS));
        }
        let mut done = 0;
        for b in self.bufs.iter() {
            if done == data.len() {
                break;
            }
            let n = b.len().min(data.len() - done);
            match b {
                Seg::Mem(b) => b.copy_from(&data[done..done + n]),
                Seg::Far { at, .. } => self
                    .far
                    .ok_or_else(eio)?
                    .write_far(*at, &data[done..done + n])?,
            }
            done += n;
        }
        advance(&mut self.bufs, done);
        self.left -= done;
        self.written += done;
        Ok(())
    }

    /// Writes one wire struct.
    pub fn write_obj<T: ByteValued>(&mut self, v: &T) -> io::Result<()> {
        self.write_all(v.as_slice())
    }

    /// Reads up to `count` bytes from `fd` at `off` (the file position when `None`) straight
    /// into the reply with one `preadv` (far segments: one `pread` per bounce buffer more).
    /// Returns the bytes read: a far segment that cannot be stored ends the read there (EIO
    /// if it is the first byte).
    pub fn read_from_fd(&mut self, fd: RawFd, count: usize, off: Option<u64>) -> io::Result<usize> {
        let count = count.min(self.available());
        if count == 0 {
            return Ok(0);
        }
        if self.far.is_none() {
            // Guest-RAM buffers only: one preadv, as before far segments existed.
            let iov = iovecs(&self.bufs, count);
            if iov.as_slice().is_empty() {
                return Err(eio()); // a far segment without a transport to move it
            }
            let n = rw(fd, iov.as_slice(), off, false)?;
            advance(&mut self.bufs, n);
            self.left -= n;
            self.written += n;
            return Ok(n);
        }
        let mut done = 0;
        while done < count {
            let want = count - done;
            let at = offset_after(off, done);
            let (res, asked) = match far_front(&self.bufs) {
                Some((far_at, len)) => {
                    let n = len.min(want).min(FAR_CHUNK);
                    let mut bounce = vec![0u8; n];
                    let iov = [libc::iovec {
                        iov_base: bounce.as_mut_ptr().cast(),
                        iov_len: n,
                    }];
                    let res = self.far.ok_or_else(eio).and_then(|f| {
                        let got = rw(fd, &iov, at, false)?;
                        f.write_far(far_at, &bounce[..got])?;
                        Ok(got)
                    });
                    (res, n)
                }
                None => {
                    let iov = iovecs(&self.bufs, want);
                    let iov = iov.as_slice();
                    let asked = iov.iter().map(|v| v.iov_len).sum::<usize>();
                    (rw(fd, iov, at, false), asked)
                }
            };
            let n = match res {
                Ok(n) => n,
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            };
            advance(&mut self.bufs, n);
            self.left -= n;
            self.written += n;
            done += n;
            if n < asked || asked == 0 {
                break;
            }
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, Write};

    /// Reads `n` one-byte buffers one byte at a time (as BATCH_FORGET's entries are read off
    /// a chain of tiny buffers); returns the time taken.
    fn read_one_by_one(n: usize) -> std::time::Duration {
        let mut bufs: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8]).collect();
        let t = std::time::Instant::now();
        let mut r = Reader::new(slices(&mut bufs));
        let mut sum = 0u64;
        while r.available() > 0 {
            sum += u64::from(r.read_obj::<u8>().unwrap());
        }
        assert_eq!(r.bytes_read(), n);
        assert!(sum > 0);
        t.elapsed()
    }

    /// The 65,535-buffer chain is served in linear time: 8x the buffers take about 8x the
    /// time (quadratic: 64x and more; measured 86x, 43.8 s, before the byte count was kept);
    /// cache misses on the bigger deque allow up to 40x. The best of three runs each.
    #[test]
    fn many_tiny_buffers_are_read_in_linear_time() {
        let best = |n| (0..3).map(|_| read_one_by_one(n)).min().unwrap();
        let small = best(8191);
        let big = best(65535);
        let ratio = big.as_secs_f64() / small.as_secs_f64().max(1e-9);
        eprintln!("8191 buffers: {small:?}; 65535 buffers: {big:?}; ratio {ratio:.1}");
        assert!(ratio < 40.0, "8x the buffers took {ratio:.1}x the time");
        assert!(big < std::time::Duration::from_secs(2), "{big:?}");
    }

    fn slices(bufs: &mut [Vec<u8>]) -> Vec<VolatileSlice<'_>> {
        bufs.iter_mut()
            .map(|b| VolatileSlice::from(b.as_mut_slice()))
            .collect()
    }

    #[test]
    fn reader_spans_buffers() {
        let mut bufs = vec![vec![1, 2, 3], vec![], vec![4, 5, 6, 7]];
        let mut r = Reader::new(slices(&mut bufs));
        assert_eq!(r.available(), 7);
        let mut a = [0u8; 5];
        r.read_exact(&mut a).unwrap();
        assert_eq!(a, [1, 2, 3, 4, 5]);
        assert_eq!(r.bytes_read(), 5);
        let mut b = [0u8; 3];
        assert!(r.read_exact(&mut b).is_err());
        assert_eq!(r.available(), 2, "a failed read consumes nothing");
        assert_eq!(r.read_vec(2).unwrap(), vec![6, 7]);
    }

    #[test]
    fn reader_truncate() {
        let mut bufs = vec![vec![1, 2, 3], vec![4, 5, 6, 7]];
        let mut r = Reader::new(slices(&mut bufs));
        r.truncate(4);
        assert_eq!(r.available(), 4);
        assert_eq!(r.read_vec(4).unwrap(), vec![1, 2, 3, 4]);
    }

    #[test]
    fn writer_split_and_fill() {
        let mut bufs = vec![vec![0u8; 3], vec![0u8; 5]];
        {
            let mut w = Writer::new(slices(&mut bufs));
            let mut body = w.split_at(4).unwrap();
            assert_eq!(w.available(), 4);
            assert_eq!(body.available(), 4);
            body.write_all(&[9, 9]).unwrap();
            w.write_all(&[1, 2, 3, 4]).unwrap();
            assert!(w.write_all(&[5]).is_err());
            assert!(body.write_all(&[7, 7, 7]).is_err(), "all or nothing");
        }
        assert_eq!(bufs, vec![vec![1, 2, 3], vec![4, 9, 9, 0, 0]]);
    }

    /// A far memory of 64 bytes at transport address 1000; fails past them.
    struct Far(std::sync::Mutex<Vec<u8>>);

    impl FarIo for Far {
        fn read_far(&self, at: u64, buf: &mut [u8]) -> io::Result<()> {
            let m = self.0.lock().unwrap();
            let o = at.checked_sub(1000).ok_or_else(eio)? as usize;
            buf.copy_from_slice(m.get(o..o + buf.len()).ok_or_else(eio)?);
            Ok(())
        }
        fn write_far(&self, at: u64, data: &[u8]) -> io::Result<()> {
            let mut m = self.0.lock().unwrap();
            let o = at.checked_sub(1000).ok_or_else(eio)? as usize;
            m.get_mut(o..o + data.len())
                .ok_or_else(eio)?
                .copy_from_slice(data);
            Ok(())
        }
    }

    #[test]
    fn far_segments_move_through_the_transport() {
        let far = Far(std::sync::Mutex::new((0..64).collect()));
        let f = tempfile::tempfile().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        let mut a = b"AB".to_vec();
        let mut c = b"CD".to_vec();
        let segs = vec![
            Seg::Mem(VolatileSlice::from(a.as_mut_slice())),
            Seg::Far { at: 1010, len: 3 },
            Seg::Mem(VolatileSlice::from(c.as_mut_slice())),
        ];
        let mut r = Reader::with_far(segs.clone(), Some(&far));
        assert_eq!(r.available(), 7);
        assert_eq!(r.write_to_fd(fd, 100, Some(0)).unwrap(), 7);
        assert_eq!(
            std::fs::read(format!("/proc/self/fd/{fd}")).unwrap(),
            [b'A', b'B', 10, 11, 12, b'C', b'D']
        );
        let mut r = Reader::with_far(segs.clone(), Some(&far));
        r.skip(3).unwrap();
        assert_eq!(r.read_vec(3).unwrap(), vec![11, 12, b'C']);
        // Into a writer: the far segment gets the file's bytes.
        let mut w = Writer::with_far(segs.clone(), Some(&far));
        assert_eq!(w.read_from_fd(fd, 7, Some(0)).unwrap(), 7);
        assert_eq!(&far.0.lock().unwrap()[10..13], &[10, 11, 12]);
        let mut w = Writer::with_far(segs, Some(&far));
        let mut body = w.split_at(3).unwrap();
        body.write_all(b"xyzw").unwrap();
        assert_eq!(&far.0.lock().unwrap()[11..13], b"xy");
        assert_eq!(c, b"zw");
        // A far segment that fails: EIO at the first byte, a short count after others.
        let bad = vec![Seg::Far { at: 1062, len: 8 }];
        let mut r = Reader::with_far(bad.clone(), Some(&far));
        let e = r.write_to_fd(fd, 8, Some(0)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert_eq!(r.available(), 8, "nothing consumed");
        let mut x = b"xx".to_vec();
        let mixed = vec![Seg::Mem(VolatileSlice::from(x.as_mut_slice())), bad[0]];
        let mut r = Reader::with_far(mixed, Some(&far));
        assert_eq!(r.write_to_fd(fd, 10, Some(0)).unwrap(), 2);
        // Without a transport to move it, a far segment is an EIO too.
        let mut r = Reader::with_far(vec![Seg::Far { at: 1000, len: 4 }], None);
        assert!(r.read_vec(4).is_err());
    }

    #[test]
    fn file_data_moves_without_bounce() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"hello world").unwrap();
        f.rewind().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        let mut bufs = vec![vec![0u8; 4], vec![0u8; 4]];
        {
            let mut w = Writer::new(slices(&mut bufs));
            assert_eq!(w.read_from_fd(fd, 100, Some(6)).unwrap(), 5);
            assert_eq!(w.bytes_written(), 5);
        }
        assert_eq!(&bufs[0], b"worl");
        assert_eq!(bufs[1][0], b'd');
        let mut src = vec![b"AB".to_vec(), b"CD".to_vec()];
        let mut r = Reader::new(slices(&mut src));
        assert_eq!(r.write_to_fd(fd, 3, Some(1)).unwrap(), 3);
        assert_eq!(r.available(), 1);
        assert_eq!(
            std::fs::read(format!("/proc/self/fd/{fd}")).unwrap(),
            b"hABCo world"
        );
    }
}
