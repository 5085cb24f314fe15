//! Memfds and byte ranges between files: what shadows ([`super::tail`]) and copy slots
//! ([`super::copy`]) are made of.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use super::MAP_ALIGNMENT;

/// Bytes a merge or a copy handles at a time: the heap a shadow costs per sync, whatever
/// the length of the guest's mapping.
pub(super) const CHUNK: usize = 256 << 10;

/// A new memfd of `size` bytes (nothing allocated until written), sealed against shrinking:
/// the frontend maps it, and a mapping past a shrunken end would be a SIGBUS in QEMU.
pub(super) fn memfd(name: &std::ffi::CStr, size: u64) -> io::Result<File> {
    // SAFETY: `name` is NUL-terminated; memfd_create takes no other pointers.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and nothing else owns it.
    let memfd = unsafe { File::from_raw_fd(fd) };
    memfd.set_len(size)?;
    add_seals(&memfd, libc::F_SEAL_SHRINK)?;
    Ok(memfd)
}

/// Adds `seals` (`F_SEAL_*`) to a memfd made by [`memfd`].
pub(super) fn add_seals(memfd: &File, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: F_ADD_SEALS takes an integer; `memfd` is a valid descriptor for the call.
    if unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
    // Only where splice cannot be used.
    let mut buf: Option<Vec<u8>> = None;
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
            let n = (hole - at).min(CHUNK as u64) as usize;
            let got = match splice_copy(src, at, dst, to + (at - from), n) {
                Some(r) => r?,
                None => {
                    let buf = buf.get_or_insert_with(|| vec![0u8; CHUNK]);
                    let got = pread_full(src, &mut buf[..n], at)?;
                    dst.write_all_at(&buf[..got], to + (at - from))?;
                    got
                }
            };
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

thread_local! {
    /// This thread's pipe for [`splice_copy`] (read end, write end), made at its first copy.
    static PIPE: RefCell<Option<(OwnedFd, OwnedFd)>> = const { RefCell::new(None) };
}

/// Copies up to `n` (at most [`CHUNK`]) bytes of `src` at `from` to `dst` at `to` through this
/// thread's pipe: the source's page-cache pages go into the pipe by reference and are copied
/// once, into `dst`, in the kernel (a buffer in between copies twice and costs a heap chunk).
/// Returns the bytes copied, fewer than `n` only at the end of `src`; `None` where no pipe
/// can be made or the file cannot be spliced (the caller copies through a buffer).
fn splice_copy(src: &File, from: u64, dst: &File, to: u64, n: usize) -> Option<io::Result<usize>> {
    PIPE.with(|p| {
        let mut p = p.borrow_mut();
        if p.is_none() {
            *p = new_pipe();
        }
        let (r, w) = p.as_ref()?;
        let (r, w) = (r.as_raw_fd(), w.as_raw_fd());
        // Offsets as the kernel takes them (checked once: none can overflow below).
        let (from, to) = (i64::try_from(from).ok()?, i64::try_from(to).ok()?);
        i64::try_from(n).ok()?.checked_add(from.max(to))?;
        let mut done = 0;
        while done < n {
            let mut off_in = from + done as i64;
            // SAFETY: plain descriptors and a live local offset; NULL for the pipe's offset.
            let k = unsafe {
                libc::splice(
                    src.as_raw_fd(),
                    &mut off_in,
                    w,
                    std::ptr::null_mut(),
                    n - done,
                    libc::SPLICE_F_MOVE,
                )
            };
            if k < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // Nothing was put in the pipe: a buffer can do it.
                    Some(libc::EINVAL) if done == 0 => None,
                    _ => Some(Err(e)),
                };
            }
            if k == 0 {
                break;
            }
            let mut out = 0;
            while out < k as usize {
                let mut off_out = to + (done + out) as i64;
                // SAFETY: as above, the pipe's read end into `dst` at a live local offset.
                let m = unsafe {
                    libc::splice(
                        r,
                        std::ptr::null_mut(),
                        dst.as_raw_fd(),
                        &mut off_out,
                        k as usize - out,
                        libc::SPLICE_F_MOVE,
                    )
                };
                if m <= 0 {
                    let e = if m == 0 {
                        io::Error::from(io::ErrorKind::WriteZero)
                    } else {
                        io::Error::last_os_error()
                    };
                    if e.raw_os_error() == Some(libc::EINTR) {
                        continue;
                    }
                    // Bytes may be left in the pipe: never let them reach another copy.
                    *p = None;
                    return Some(Err(e));
                }
                out += m as usize;
            }
            done += k as usize;
        }
        Some(Ok(done))
    })
}

/// A pipe that holds a [`CHUNK`] (or as much as the system allows).
fn new_pipe() -> Option<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the live array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return None;
    }
    // SAFETY: pipe2 returned two new descriptors that nothing else owns.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: F_SETPIPE_SZ takes an integer; failure leaves the default size (fewer bytes per
    // splice, same result).
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, CHUNK as libc::c_int) };
    Some((r, w))
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

/// Whether `[start, end)` of `f` holds an allocated page (`SEEK_DATA`; true when the file
/// system cannot tell).
pub(super) fn has_data(f: &File, start: u64, end: u64) -> bool {
    seek(f, start, libc::SEEK_DATA).map_or(true, |at| at < end)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_copy_leaves_nothing_for_the_next() {
        let src = tempfile::tempfile().unwrap();
        src.write_all_at(&[1u8; 300 << 10], 0).unwrap();
        // A destination that cannot be written: the bytes already in this thread's pipe
        // must not reach the next copy.
        let ro = File::open("/proc/self/exe").unwrap();
        assert!(copy_range(&src, 0, &ro, 0, 300 << 10, false).is_err());
        let other = tempfile::tempfile().unwrap();
        other.write_all_at(&[2u8; 100 << 10], 0).unwrap();
        let dst = memfd(c"t", 1 << 20).unwrap();
        assert_eq!(
            copy_range(&other, 0, &dst, 4096, 200 << 10, false).unwrap(),
            100 << 10
        );
        let mut got = vec![0u8; (100 << 10) + 8192];
        dst.read_exact_at(&mut got, 0).unwrap();
        assert!(got[..4096].iter().all(|&b| b == 0));
        assert!(got[4096..4096 + (100 << 10)].iter().all(|&b| b == 2));
        assert!(got[4096 + (100 << 10)..].iter().all(|&b| b == 0));
    }

    #[test]
    fn copies_stop_at_the_end_of_the_source() {
        let src = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..(600u32 << 10)).map(|i| (i % 251) as u8).collect();
        src.write_all_at(&data, 0).unwrap();
        let dst = memfd(c"t", 2 << 20).unwrap();
        // More than a chunk, from an odd offset, past the end of the file.
        let done = copy_range(&src, 4096, &dst, 8192, 1 << 20, false).unwrap();
        assert_eq!(done, data.len() as u64 - 4096);
        let mut got = vec![0u8; done as usize];
        dst.read_exact_at(&mut got, 8192).unwrap();
        assert_eq!(got, data[4096..]);
    }
}
