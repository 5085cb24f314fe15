//! Memfds and byte ranges between files: what shadows ([`super::tail`]) and copy slots
//! ([`super::copy`]) are made of.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

use super::MAP_ALIGNMENT;

/// Bytes a merge or a copy handles at a time: the heap a shadow costs per sync, whatever
/// the length of the guest's mapping.
pub(super) const CHUNK: usize = 256 << 10;

/// A new memfd of `size` bytes (nothing allocated until written).
pub(super) fn memfd(name: &std::ffi::CStr, size: u64) -> io::Result<File> {
    // SAFETY: `name` is NUL-terminated; memfd_create takes no other pointers.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and nothing else owns it.
    let memfd = unsafe { File::from_raw_fd(fd) };
    memfd.set_len(size)?;
    Ok(memfd)
}

/// Copies `len` bytes of `src` from `from` to `dst` at `to`, a chunk at a time; stops early
/// at the end of `src`. Returns the bytes of `src` the range covered. Holes of `src` (found
/// with `SEEK_DATA`/`SEEK_HOLE`) are not read: with `dst_zero` the destination is known to
/// read zeros there already and is left alone, otherwise they are zeroed in `dst` (punched
/// out where whole pages). So a sparse file costs neither reads nor memory.
pub(super) fn copy_range(
    src: &File,
    from: u64,
    dst: &File,
    to: u64,
    len: u64,
    dst_zero: bool,
) -> io::Result<u64> {
    let size = crate::sys::fstat(src.as_fd())?.st_size.max(0) as u64;
    let end = size.min(from.saturating_add(len));
    if end <= from {
        return Ok(0);
    }
    let mut buf = vec![0u8; CHUNK.min(usize::try_from(end - from).unwrap_or(CHUNK))];
    let mut pos = from;
    while pos < end {
        // The next data at or after `pos`, and the hole after it.
        let data = seek(src, pos, libc::SEEK_DATA).unwrap_or(pos).min(end);
        if data > pos && !dst_zero {
            zero_range(dst, to + (pos - from), data - pos)?;
        }
        if data >= end {
            break;
        }
        let hole = seek(src, data, libc::SEEK_HOLE).unwrap_or(end).min(end);
        let hole = if hole <= data { end } else { hole };
        let mut at = data;
        while at < hole {
            let n = (hole - at).min(buf.len() as u64) as usize;
            let got = pread_full(src, &mut buf[..n], at)?;
            dst.write_all_at(&buf[..got], to + (at - from))?;
            at += got as u64;
            if got < n {
                // The file shrank meanwhile.
                return Ok(at - from);
            }
        }
        pos = hole;
    }
    Ok(end - from)
}

/// `lseek(2)` for `SEEK_DATA`/`SEEK_HOLE`; `None` when the file system cannot tell (then the
/// caller treats everything as data) or there is no data past `at`.
fn seek(f: &File, at: u64, whence: libc::c_int) -> Option<u64> {
    let at = i64::try_from(at).ok()?;
    // SAFETY: lseek takes no pointers; `f` is a valid descriptor for the call.
    let r = unsafe { libc::lseek(f.as_raw_fd(), at, whence) };
    if r < 0 {
        if whence == libc::SEEK_DATA
            && io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO)
        {
            // No data at or after `at`: a hole to the end.
            return Some(u64::MAX);
        }
        return None;
    }
    Some(r as u64)
}

/// Zeros `[at, at + len)` of `f`: whole pages by punching them out (which also frees them),
/// the partial pages at either end by a write.
pub(super) fn zero_range(f: &File, at: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let end = at
        .checked_add(len)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let first = at.next_multiple_of(MAP_ALIGNMENT).min(end);
    let last = (end / MAP_ALIGNMENT * MAP_ALIGNMENT).max(first);
    let zeros = [0u8; MAP_ALIGNMENT as usize];
    f.write_all_at(&zeros[..(first - at) as usize], at)?;
    f.write_all_at(&zeros[..(end - last) as usize], last)?;
    if last > first {
        // SAFETY: fallocate takes no pointers; `f` is a valid descriptor for the call.
        let r = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                first as i64,
                (last - first) as i64,
            )
        };
        if r < 0 {
            let zeros = vec![0u8; CHUNK];
            let mut o = first;
            while o < last {
                let n = (last - o).min(zeros.len() as u64);
                f.write_all_at(&zeros[..n as usize], o)?;
                o += n;
            }
        }
    }
    Ok(())
}

/// Reads up to `buf.len()` bytes at `at`, stopping early only at end of file.
pub(super) fn pread_full(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
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
