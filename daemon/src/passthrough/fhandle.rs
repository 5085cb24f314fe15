//! File handles (`name_to_handle_at` / `open_by_handle_at`), for `--inode-file-handles`.
//!
//! An inode kept as a file handle holds no descriptor: each operation opens the handle
//! (`open_by_handle_at`, which needs `CAP_DAC_READ_SEARCH`) on a *mount descriptor*, an
//! ordinary (not `O_PATH`: the kernel refuses those) descriptor of a directory on the same
//! mount. Mount descriptors are shared by every inode of their mount and closed with the
//! last of them ([`MountFds`]).
//!
//! The handles of inodes are made here from descriptors of files inside the shared
//! directory; none comes from the guest. A migration stream (`--migration-mode=file-handles`)
//! does bring handles from outside: a handle can name any file of the file system, so
//! `migration.rs` checks each file it opens that way lies inside the share before use.
//! Opening one cannot follow a symlink or a path.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};

use crate::migration::format::{bad, Dec, Enc};

/// Longest file handle (`MAX_HANDLE_SZ`).
pub const MAX_FILE_HANDLE: usize = 128;

/// A file handle as `name_to_handle_at` makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHandleBytes {
    pub handle_type: i32,
    pub bytes: Vec<u8>,
}

impl FileHandleBytes {
    /// Its part of a device-state stream: type i32, u16 length + bytes.
    pub fn encode(&self, e: &mut Enc) -> io::Result<()> {
        e.u32(self.handle_type as u32);
        e.bytes16(&self.bytes, MAX_FILE_HANDLE, "file handle")
    }

    /// Reads one from a device-state stream; an empty handle is refused.
    pub fn decode(d: &mut Dec) -> io::Result<Self> {
        let handle_type = d.u32("file handle type")? as i32;
        let bytes = d.bytes16(MAX_FILE_HANDLE, "file handle")?;
        if bytes.is_empty() {
            return Err(bad("empty file handle"));
        }
        Ok(FileHandleBytes { handle_type, bytes })
    }
}

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
struct RawHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_FILE_HANDLE],
}

/// The file handle of the file behind `fd` (not following a symlink), with the mount id the
/// kernel reports for it.
pub(super) fn name_to_handle(fd: BorrowedFd) -> io::Result<(FileHandleBytes, u64)> {
    name_to_handle_flags(fd, 0)
}

/// [`name_to_handle`] with more `name_to_handle_at` flags (e.g. `AT_HANDLE_FID`).
pub(super) fn name_to_handle_flags(
    fd: BorrowedFd,
    flags: libc::c_int,
) -> io::Result<(FileHandleBytes, u64)> {
    let mut h = RawHandle {
        handle_bytes: MAX_FILE_HANDLE as u32,
        handle_type: 0,
        f_handle: [0; MAX_FILE_HANDLE],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `h` is a file_handle header followed by MAX_FILE_HANDLE bytes, as announced in
    // handle_bytes; the empty path with AT_EMPTY_PATH names `fd` itself; the kernel writes
    // at most handle_bytes bytes and the mount id.
    let r = unsafe {
        libc::name_to_handle_at(
            fd.as_raw_fd(),
            c"".as_ptr(),
            (&mut h as *mut RawHandle).cast::<libc::file_handle>(),
            &mut mount_id,
            libc::AT_EMPTY_PATH | flags,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = (h.handle_bytes as usize).min(MAX_FILE_HANDLE);
    Ok((
        FileHandleBytes {
            handle_type: h.handle_type,
            bytes: h.f_handle[..n].to_vec(),
        },
        mount_id as u64,
    ))
}

/// Opens file handle `fh` with `flags` on the file system of `mount_fd`.
pub(super) fn open_handle(
    mount_fd: BorrowedFd,
    fh: &FileHandleBytes,
    flags: libc::c_int,
) -> io::Result<OwnedFd> {
    if fh.bytes.is_empty() || fh.bytes.len() > MAX_FILE_HANDLE {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut h = RawHandle {
        handle_bytes: fh.bytes.len() as u32,
        handle_type: fh.handle_type,
        f_handle: [0; MAX_FILE_HANDLE],
    };
    h.f_handle[..fh.bytes.len()].copy_from_slice(&fh.bytes);
    // SAFETY: `h` is a valid file_handle of handle_bytes (<= MAX_FILE_HANDLE) bytes; the
    // kernel only reads it. A non-negative result is a new descriptor we own.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount_fd.as_raw_fd(),
            (&mut h as *mut RawHandle).cast::<libc::file_handle>(),
            flags | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by open_by_handle_at and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `e` says the file system cannot make file handles (rather than a passing error).
pub(super) fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::EOVERFLOW) | Some(libc::ENOSYS)
    )
}

/// One mount descriptor per mount id, alive while an inode of that mount uses it.
#[derive(Default)]
pub(super) struct MountFds {
    map: Mutex<HashMap<u64, Weak<OwnedFd>>>,
}

impl MountFds {
    /// The mount descriptor of mount `mnt`, or `None` when none is open.
    pub fn get(&self, mnt: u64) -> Option<Arc<OwnedFd>> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&mnt).and_then(Weak::upgrade)
    }

    /// Keeps `fd` as the mount descriptor of `mnt` (or returns the one another thread put
    /// there first). Entries of mounts no inode uses any more are dropped on the way.
    pub fn insert(&self, mnt: u64, fd: OwnedFd) -> Arc<OwnedFd> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(live) = map.get(&mnt).and_then(Weak::upgrade) {
            return live;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let fd = Arc::new(fd);
        map.insert(mnt, Arc::downgrade(&fd));
        fd
    }

    /// Mount descriptors open now.
    pub fn len(&self) -> usize {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.values().filter(|w| w.strong_count() > 0).count()
    }
}
