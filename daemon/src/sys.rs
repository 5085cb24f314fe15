//! Thin, checked wrappers over the system calls the daemon needs.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `fstat` of an open file descriptor.
pub fn fstat(fd: BorrowedFd) -> io::Result<libc::stat64> {
    let mut st = std::mem::MaybeUninit::<libc::stat64>::zeroed();
    // SAFETY: `fd` is a valid descriptor for the duration of the call and `st` points to
    // writable memory of the right size.
    let ret = unsafe { libc::fstat64(fd.as_raw_fd(), st.as_mut_ptr()) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fstat64` succeeded, so it filled in the whole struct.
    Ok(unsafe { st.assume_init() })
}
