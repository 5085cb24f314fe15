//! Thin, checked wrappers over the system calls the daemon needs.
//!
//! Every wrapper takes borrowed descriptors and C strings, turns a failing return value into
//! the `errno` it set, and hands back owned descriptors, so callers never touch raw fds or
//! `errno`. Nothing here resolves a path on its own: callers pass a directory descriptor and
//! a single name (or the empty name with `AT_EMPTY_PATH`).

use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// An empty C string, for `AT_EMPTY_PATH` calls.
pub const EMPTY: &CStr = c"";

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_size(ret: libc::ssize_t) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

fn to_off(v: u64) -> io::Result<libc::off64_t> {
    libc::off64_t::try_from(v).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `CLOCK_REALTIME_COARSE` as `(seconds, nanoseconds)`: the clock file timestamps come from
/// (one clock tick behind a fine-grained clock at most).
pub fn coarse_realtime() -> io::Result<(i64, i64)> {
    let mut ts = MaybeUninit::<libc::timespec>::zeroed();
    // SAFETY: `ts` points to writable memory the size of a `timespec`.
    check(unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, ts.as_mut_ptr()) })?;
    // SAFETY: `clock_gettime` succeeded, so it filled in the struct.
    let ts = unsafe { ts.assume_init() };
    Ok((ts.tv_sec, ts.tv_nsec))
}

/// `fstat` of an open file descriptor.
pub fn fstat(fd: BorrowedFd) -> io::Result<libc::stat64> {
    let mut st = MaybeUninit::<libc::stat64>::zeroed();
    // SAFETY: `fd` is a valid descriptor for the duration of the call and `st` points to
    // writable memory of the right size.
    let ret = unsafe { libc::fstat64(fd.as_raw_fd(), st.as_mut_ptr()) };
    check(ret)?;
    // SAFETY: `fstat64` succeeded, so it filled in the whole struct.
    Ok(unsafe { st.assume_init() })
}

/// Maps the first `len` bytes of the shared memory `fd` (a memfd) readable and writable,
/// `MAP_SHARED`: stores through the mapping reach the file, and every other mapping of it.
/// The caller checks that the file holds at least `len` bytes (a page past its end faults
/// with `SIGBUS`), keeps it from shrinking while mapped, and `munmap`s the `len` bytes when
/// done.
pub fn map_shared(fd: BorrowedFd, len: usize) -> io::Result<*mut u8> {
    // SAFETY: a new mapping at an address the kernel picks (no hint, no MAP_FIXED), so no
    // memory of this process changes; `fd` is valid for the call. What the returned pointer
    // may be used for is the caller's contract (above).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// `statx(dir, name, flags, mask)`.
pub fn statx(
    dir: BorrowedFd,
    name: &CStr,
    flags: libc::c_int,
    mask: libc::c_uint,
) -> io::Result<libc::statx> {
    let mut st = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `dir` is valid for the call, `name` is NUL-terminated and `st` is writable
    // memory of the right size.
    let ret = unsafe { libc::statx(dir.as_raw_fd(), name.as_ptr(), flags, mask, st.as_mut_ptr()) };
    check(ret)?;
    // SAFETY: `statx` succeeded; the struct was zero-initialised, so fields it did not
    // fill in are zero, which is a valid value for every (integer) field.
    Ok(unsafe { st.assume_init() })
}

/// `open(path, flags, mode)`: only for the shared directory itself and `/proc/self/fd`.
pub fn open(path: &CStr, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    openat_raw(libc::AT_FDCWD, path, flags, mode)
}

/// `openat(dir, name, flags | O_CLOEXEC, mode)`.
pub fn openat(dir: BorrowedFd, name: &CStr, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    openat_raw(dir.as_raw_fd(), name, flags, mode)
}

fn openat_raw(dir: libc::c_int, name: &CStr, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `dir` is AT_FDCWD or a valid descriptor, `name` is NUL-terminated; the mode
    // argument is read only with O_CREAT/O_TMPFILE.
    let fd = unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    check(fd)?;
    // SAFETY: `openat` succeeded, so `fd` is a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `readlinkat(dir, name)`: the whole target.
pub fn readlinkat(dir: BorrowedFd, name: &CStr) -> io::Result<Vec<u8>> {
    // Not zeroed first: the kernel writes the bytes it returns, and only those are kept (a
    // zeroed PATH_MAX buffer was ~4,500 instructions per call; a READDIRPLUS makes two).
    let mut buf: Vec<u8> = Vec::with_capacity(libc::PATH_MAX as usize + 1);
    // SAFETY: `buf` has capacity for `buf.capacity()` bytes, which the kernel may write;
    // `dir` and `name` are valid.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.capacity(),
        )
    };
    let n = check_size(n)?;
    if n >= buf.capacity() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    // SAFETY: the kernel wrote the first `n` bytes (`n` < capacity, checked above).
    unsafe { buf.set_len(n) };
    Ok(buf)
}

/// `mkdirat(dir, name, mode)`.
pub fn mkdirat(dir: BorrowedFd, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `dir` is valid and `name` is NUL-terminated.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }).map(drop)
}

/// `mknodat(dir, name, mode, dev)`.
pub fn mknodat(dir: BorrowedFd, name: &CStr, mode: u32, dev: libc::dev_t) -> io::Result<()> {
    // SAFETY: `dir` is valid and `name` is NUL-terminated.
    check(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, dev) }).map(drop)
}

/// `symlinkat(target, dir, name)`.
pub fn symlinkat(target: &CStr, dir: BorrowedFd, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated and `dir` is valid.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// `linkat(olddir, oldname, newdir, newname, flags)`.
pub fn linkat(
    olddir: BorrowedFd,
    oldname: &CStr,
    newdir: BorrowedFd,
    newname: &CStr,
    flags: libc::c_int,
) -> io::Result<()> {
    // SAFETY: descriptors are valid and names are NUL-terminated.
    check(unsafe {
        libc::linkat(
            olddir.as_raw_fd(),
            oldname.as_ptr(),
            newdir.as_raw_fd(),
            newname.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// `unlinkat(dir, name, flags)`.
pub fn unlinkat(dir: BorrowedFd, name: &CStr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: `dir` is valid and `name` is NUL-terminated.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

/// `renameat2(olddir, oldname, newdir, newname, flags)`.
pub fn renameat2(
    olddir: BorrowedFd,
    oldname: &CStr,
    newdir: BorrowedFd,
    newname: &CStr,
    flags: libc::c_uint,
) -> io::Result<()> {
    // SAFETY: descriptors are valid and names are NUL-terminated.
    check(unsafe {
        libc::renameat2(
            olddir.as_raw_fd(),
            oldname.as_ptr(),
            newdir.as_raw_fd(),
            newname.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// `fchownat(dir, name, uid, gid, flags)`; `u32::MAX` leaves an id unchanged.
pub fn fchownat(
    dir: BorrowedFd,
    name: &CStr,
    uid: u32,
    gid: u32,
    flags: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `dir` is valid and `name` is NUL-terminated.
    check(unsafe { libc::fchownat(dir.as_raw_fd(), name.as_ptr(), uid, gid, flags) }).map(drop)
}

/// `fchmodat(dir, name, mode, 0)` (follows a final link: used on `/proc/self/fd` entries).
pub fn fchmodat(dir: BorrowedFd, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `dir` is valid and `name` is NUL-terminated.
    check(unsafe { libc::fchmodat(dir.as_raw_fd(), name.as_ptr(), mode, 0) }).map(drop)
}

/// `fchmod(fd, mode)`.
pub fn fchmod(fd: BorrowedFd, mode: u32) -> io::Result<()> {
    // SAFETY: `fd` is valid for the call.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode) }).map(drop)
}

/// `ftruncate(fd, size)`.
pub fn ftruncate(fd: BorrowedFd, size: u64) -> io::Result<()> {
    let size = to_off(size)?;
    // SAFETY: `fd` is valid for the call.
    check(unsafe { libc::ftruncate64(fd.as_raw_fd(), size) }).map(drop)
}

/// `utimensat(dir, name, times, flags)`.
pub fn utimensat(
    dir: BorrowedFd,
    name: &CStr,
    times: &[libc::timespec; 2],
    flags: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `times` points to two timespecs, `dir` is valid, `name` is NUL-terminated.
    check(unsafe { libc::utimensat(dir.as_raw_fd(), name.as_ptr(), times.as_ptr(), flags) })
        .map(drop)
}

/// `futimens(fd, times)`.
pub fn futimens(fd: BorrowedFd, times: &[libc::timespec; 2]) -> io::Result<()> {
    // SAFETY: `times` points to two timespecs and `fd` is valid.
    check(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) }).map(drop)
}

/// `fstatfs(fd)` (works on `O_PATH` descriptors).
pub fn fstatfs(fd: BorrowedFd) -> io::Result<libc::statfs64> {
    let mut st = MaybeUninit::<libc::statfs64>::zeroed();
    // SAFETY: `fd` is valid and `st` is writable memory of the right size.
    check(unsafe { libc::fstatfs64(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: `fstatfs64` succeeded, so it filled in the struct.
    Ok(unsafe { st.assume_init() })
}

/// `fsync(fd)`, or `fdatasync(fd)` when `datasync`.
pub fn fsync(fd: BorrowedFd, datasync: bool) -> io::Result<()> {
    // SAFETY: `fd` is valid for the call.
    let ret = unsafe {
        if datasync {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    };
    check(ret).map(drop)
}

/// `syncfs(fd)`.
pub fn syncfs(fd: BorrowedFd) -> io::Result<()> {
    // SAFETY: `fd` is valid for the call.
    check(unsafe { libc::syncfs(fd.as_raw_fd()) }).map(drop)
}

/// `dup(fd)` with close-on-exec.
pub fn dup(fd: BorrowedFd) -> io::Result<OwnedFd> {
    fd.try_clone_to_owned()
}

/// `setxattr(path, name, value, flags)` (follows a final link; a relative `path` resolves
/// from the thread's working directory).
pub fn setxattr(path: &CStr, name: &CStr, value: &[u8], flags: libc::c_int) -> io::Result<()> {
    // SAFETY: strings are NUL-terminated, `value` is readable for its length.
    check(unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(drop)
}

/// `getxattr(path, name)` into a buffer of `size` bytes; with `size == 0`, only the length.
/// Returns the value (empty when `size == 0`) and its length.
pub fn getxattr(path: &CStr, name: &CStr, size: usize) -> io::Result<(Vec<u8>, usize)> {
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` is writable for `size` bytes (a zero size never writes); strings are
    // NUL-terminated.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let n = check_size(n)?;
    buf.truncate(n);
    Ok((buf, n))
}

/// `listxattr(path)` into a buffer of `size` bytes; with `size == 0`, only the length.
pub fn listxattr(path: &CStr, size: usize) -> io::Result<(Vec<u8>, usize)> {
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` is writable for `size` bytes; `path` is NUL-terminated.
    let n = unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let n = check_size(n)?;
    buf.truncate(n);
    Ok((buf, n))
}

/// `removexattr(path, name)`.
pub fn removexattr(path: &CStr, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated.
    check(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
}

/// `getdents64(fd, buf)`: bytes of `linux_dirent64` records written to `buf`.
pub fn getdents64(fd: BorrowedFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable for `buf.len()` bytes and `fd` is valid.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    Ok(check_long(n)? as usize)
}

/// [`getdents64`] into `buf`'s capacity: `buf` holds the records read (empty at the end of
/// the directory). The buffer is not zeroed first (a zeroed 16 KiB buffer per READDIRPLUS
/// cost more instructions than the rest of its listing).
pub fn getdents64_into(fd: BorrowedFd, buf: &mut Vec<u8>) -> io::Result<usize> {
    buf.clear();
    // SAFETY: `buf` has capacity for `buf.capacity()` bytes, which the kernel may write;
    // `fd` is valid.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.capacity(),
        )
    };
    let n = check_long(n)? as usize;
    if n > buf.capacity() {
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    // SAFETY: the kernel wrote the first `n` bytes, at most the capacity (checked above).
    unsafe { buf.set_len(n) };
    Ok(n)
}

/// `lseek(fd, offset, whence)`; a negative offset is the kernel's to judge (SEEK_END and
/// SEEK_DATA/SEEK_HOLE give it a meaning or an errno of their own).
pub fn lseek(fd: BorrowedFd, offset: i64, whence: libc::c_int) -> io::Result<u64> {
    // SAFETY: `fd` is valid for the call.
    let ret = unsafe { libc::lseek64(fd.as_raw_fd(), offset, whence) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ret as u64)
}

/// `fcntl(fd, cmd, lock)` for the (OFD) record-lock commands.
pub fn fcntl_lock(fd: BorrowedFd, cmd: libc::c_int, lock: &mut libc::flock64) -> io::Result<()> {
    // SAFETY: `lock` points to a valid, writable `flock64` and `fd` is valid.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), cmd, lock as *mut libc::flock64) }).map(drop)
}

/// `flock(fd, op)`.
pub fn flock(fd: BorrowedFd, op: libc::c_int) -> io::Result<()> {
    // SAFETY: `fd` is valid for the call.
    check(unsafe { libc::flock(fd.as_raw_fd(), op) }).map(drop)
}

/// `fallocate(fd, mode, offset, len)`.
pub fn fallocate(fd: BorrowedFd, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    let (offset, len) = (to_off(offset)?, to_off(len)?);
    // SAFETY: `fd` is valid for the call.
    check(unsafe { libc::fallocate64(fd.as_raw_fd(), mode, offset, len) }).map(drop)
}

/// `copy_file_range(fd_in, off_in, fd_out, off_out, len, flags)`: bytes copied.
pub fn copy_file_range(
    fd_in: BorrowedFd,
    off_in: u64,
    fd_out: BorrowedFd,
    off_out: u64,
    len: usize,
    flags: libc::c_uint,
) -> io::Result<usize> {
    let mut off_in = to_off(off_in)?;
    let mut off_out = to_off(off_out)?;
    // SAFETY: the offsets point to valid `loff_t`s that outlive the call; descriptors are
    // valid.
    let n = unsafe {
        libc::syscall(
            libc::SYS_copy_file_range,
            fd_in.as_raw_fd(),
            &mut off_in as *mut libc::off64_t,
            fd_out.as_raw_fd(),
            &mut off_out as *mut libc::off64_t,
            len,
            flags,
        )
    };
    Ok(check_long(n)? as usize)
}

/// Sets the *calling thread's* effective uid (`setresuid(-1, euid, -1)` as a raw system
/// call: glibc's wrappers would change every thread of the process).
pub fn set_thread_euid(euid: u32) -> io::Result<()> {
    // SAFETY: plain system call on integers; -1 leaves the real and saved ids unchanged.
    let ret = unsafe { libc::syscall(libc::SYS_setresuid, -1i64, euid as libc::c_long, -1i64) };
    check_long(ret).map(drop)
}

/// Sets the *calling thread's* effective gid (`setresgid(-1, egid, -1)` as a raw system
/// call).
pub fn set_thread_egid(egid: u32) -> io::Result<()> {
    // SAFETY: plain system call on integers; -1 leaves the real and saved ids unchanged.
    let ret = unsafe { libc::syscall(libc::SYS_setresgid, -1i64, egid as libc::c_long, -1i64) };
    check_long(ret).map(drop)
}

/// The effective uid of the calling thread.
pub fn geteuid() -> u32 {
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The effective gid of the calling thread.
pub fn getegid() -> u32 {
    // SAFETY: `getegid` has no preconditions and cannot fail.
    unsafe { libc::getegid() }
}

/// `fchdir(fd)`: the calling thread's working directory (its own after
/// [`unshare_fs`]).
pub fn fchdir(fd: BorrowedFd) -> io::Result<()> {
    // SAFETY: `fd` is valid for the call.
    check(unsafe { libc::fchdir(fd.as_raw_fd()) }).map(drop)
}

/// `unshare(CLONE_FS)`: gives the calling thread its own working directory, root and umask
/// (copies of the process's), so `fchdir` no longer affects the other threads.
pub fn unshare_fs() -> io::Result<()> {
    // SAFETY: plain system call on an integer flag; CLONE_FS only copies this thread's
    // filesystem attributes.
    check(unsafe { libc::unshare(libc::CLONE_FS) }).map(drop)
}

/// Sets the process umask; returns the previous one.
pub fn umask(mask: u32) -> u32 {
    // SAFETY: `umask` has no preconditions and cannot fail.
    unsafe { libc::umask(mask) }
}
