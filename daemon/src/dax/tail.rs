//! Shadow tails: QEMU 11.1 maps a file range only when the file covers all of it, so the
//! part of a guest mapping past the last whole page of the file (the page holding EOF and
//! anything after it) is served from a small memfd instead. The memfd starts as a copy of
//! the file's bytes there (zero-padded); bytes the guest writes through a writable mapping
//! are written back to the file ([`Tail::write_back`]) before the daemon touches the file
//! through the request queue, on fsync/flush/release, on unmap and when the device stops.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, FromRawFd};
use std::os::unix::fs::FileExt;

use super::MAP_ALIGNMENT;

/// How a guest mapping of `len` bytes at file offset `foffset` splits for a file of
/// `file_size` bytes: `(file_len, valid)`, the bytes mapped from the file (whole pages) and
/// the bytes of real file data in the tail after them (less than a page).
pub fn layout(file_size: u64, foffset: u64, len: u64) -> (u64, u64) {
    let in_file = file_size.saturating_sub(foffset);
    let file_len = (in_file / MAP_ALIGNMENT * MAP_ALIGNMENT).min(len);
    let valid = if file_len == len {
        0
    } else {
        (in_file - file_len).min(len - file_len)
    };
    (file_len, valid)
}

/// The shadow of one mapping's tail.
pub struct Tail {
    memfd: File,
    /// The file's bytes as last synchronised (what the guest started from).
    snapshot: Vec<u8>,
}

impl Tail {
    /// A memfd of `size` bytes holding the `valid` file bytes at file offset `at`.
    pub fn new(file: &File, at: u64, valid: u64, size: u64) -> io::Result<Tail> {
        let name = c"daxfsd-tail";
        // SAFETY: `name` is NUL-terminated; memfd_create takes no other pointers.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by memfd_create and nothing else owns it.
        let memfd = unsafe { File::from_raw_fd(fd) };
        memfd.set_len(size)?;
        let mut snapshot = vec![0u8; usize::try_from(valid).unwrap_or(0)];
        let n = pread_full(file, &mut snapshot, at)?;
        snapshot.truncate(n);
        memfd.write_all_at(&snapshot, 0)?;
        Ok(Tail { memfd, snapshot })
    }

    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// Writes the bytes the guest changed in the tail back to the file at offset `at`
    /// (never past the file's current end). Returns the bytes written.
    pub fn write_back(&mut self, file: &File, at: u64) -> io::Result<usize> {
        let mut now = vec![0u8; self.snapshot.len()];
        self.memfd.read_exact_at(&mut now, 0)?;
        let Some(first) = now.iter().zip(&self.snapshot).position(|(a, b)| a != b) else {
            return Ok(0);
        };
        let last = now
            .iter()
            .zip(&self.snapshot)
            .rposition(|(a, b)| a != b)
            .unwrap_or(first);
        let size = crate::sys::fstat(file.as_fd())?.st_size.max(0) as u64;
        let end = (at + last as u64 + 1).min(size);
        let start = at + first as u64;
        if end <= start {
            return Ok(0);
        }
        let span = &now[first..first + (end - start) as usize];
        file.write_all_at(span, start)?;
        self.snapshot[first..first + span.len()].copy_from_slice(span);
        Ok(span.len())
    }
}

/// Reads up to `buf.len()` bytes at `at`, stopping early only at end of file.
fn pread_full(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const P: u64 = 4096;
    const R: u64 = 2 << 20;

    #[test]
    fn layouts() {
        assert_eq!(layout(8 * R, 0, R), (R, 0), "whole range inside the file");
        assert_eq!(layout(6, 0, R), (0, 6), "small file: all tail");
        assert_eq!(layout(0, 0, R), (0, 0), "empty file");
        assert_eq!(layout(P + 10, 0, R), (P, 10));
        assert_eq!(
            layout(R + 5, R, R),
            (0, 5),
            "range at the file's last bytes"
        );
        assert_eq!(layout(R, R, R), (0, 0), "range past EOF");
        assert_eq!(layout(3 * P, 0, 2 * P), (2 * P, 0));
    }

    #[test]
    fn tail_round_trip_writes_back_only_changes() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"0123456789").unwrap();
        let fd = f.try_clone().unwrap();
        let mut t = Tail::new(&fd, 2, 8, P).unwrap();
        let mut buf = [0u8; 10];
        t.memfd.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"23456789\0\0", "copy of the file bytes, zero padded");
        assert_eq!(
            t.write_back(&fd, 2).unwrap(),
            0,
            "unchanged: nothing written"
        );
        t.memfd.write_all_at(b"XY", 3).unwrap();
        t.memfd.write_all_at(b"past-eof", 20).unwrap();
        assert_eq!(t.write_back(&fd, 2).unwrap(), 2);
        let mut all = [0u8; 10];
        f.read_exact_at(&mut all, 0).unwrap();
        assert_eq!(&all, b"01234XY789");
        assert_eq!(f.metadata().unwrap().len(), 10, "never extends the file");
        assert_eq!(t.write_back(&fd, 2).unwrap(), 0, "already in sync");
    }

    #[test]
    fn write_back_stops_at_a_shrunken_end() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(b"abcdef", 0).unwrap();
        let fd = f.try_clone().unwrap();
        let mut t = Tail::new(&fd, 0, 6, P).unwrap();
        t.memfd.write_all_at(b"ABCDEF", 0).unwrap();
        f.set_len(3).unwrap();
        assert_eq!(t.write_back(&fd, 0).unwrap(), 3);
        assert_eq!(f.metadata().unwrap().len(), 3);
    }
}
