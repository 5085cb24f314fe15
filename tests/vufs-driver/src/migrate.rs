//! The frontend's side of the vhost-user device-state transfer (protocol feature
//! DEVICE_STATE), as QEMU's `vhost-user-fs` drives it in a live migration: with every vring
//! stopped, SET_DEVICE_STATE_FD hands the backend one end of a pipe, the state flows through
//! it until EOF, then CHECK_DEVICE_STATE asks whether it went well.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};

use vhost::vhost_user::message::{VhostTransferStateDirection, VhostTransferStatePhase};
use vhost::vhost_user::VhostUserFrontend;

use crate::Device;

/// Largest state read back from a backend.
const MAX_STATE: u64 = 256 << 20;

fn pipe() -> io::Result<(File, File)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both descriptors are new and owned by nobody else.
    let (r, w) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    Ok((r, w))
}

fn set_fd(dev: &Device, dir: VhostTransferStateDirection, fd: OwnedFd) -> io::Result<()> {
    let back = dev.with_frontend(false, |fe| {
        fe.set_device_state_fd(dir, VhostTransferStatePhase::STOPPED, fd)
    })?;
    if back.is_some() {
        return Err(io::Error::other(
            "backend returned its own transfer fd (unexpected for daxfsd)",
        ));
    }
    Ok(())
}

/// CHECK_DEVICE_STATE: `Ok` when the backend reports success.
pub fn check_state(dev: &Device) -> io::Result<()> {
    dev.with_frontend(false, |fe| fe.check_device_state())
}

/// Saves the backend's state (call with the device stopped: [`Device::stop`]).
pub fn save_state(dev: &Device) -> io::Result<Vec<u8>> {
    let (r, w) = pipe()?;
    // Read on a thread, as QEMU does from its migration thread: the backend must not block
    // the control channel while it writes.
    let reader = std::thread::spawn(move || -> io::Result<Vec<u8>> {
        let mut buf = Vec::new();
        r.take(MAX_STATE).read_to_end(&mut buf)?;
        Ok(buf)
    });
    set_fd(dev, VhostTransferStateDirection::SAVE, w.into())?;
    let state = reader
        .join()
        .map_err(|_| io::Error::other("state reader panicked"))??;
    check_state(dev)?;
    Ok(state)
}

/// Loads `state` into the backend; the result of CHECK_DEVICE_STATE is returned.
pub fn load_state(dev: &Device, state: &[u8]) -> io::Result<()> {
    let (r, mut w) = pipe()?;
    set_fd(dev, VhostTransferStateDirection::LOAD, r.into())?;
    // The backend may stop reading a stream it refuses: a broken pipe is not our error.
    match w.write_all(state) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
        Err(e) => return Err(e),
    }
    drop(w);
    check_state(dev)
}

/// The frontend's dirty-page log (SET_LOG_BASE with LOG_SHMFD): one bit per 4 KiB guest page,
/// from guest physical address 0, in a memfd shared with the backend.
pub struct DirtyLog {
    file: File,
    len: u64,
}

impl DirtyLog {
    /// Creates a log covering guest physical addresses below `end` and hands it to the backend.
    pub fn start(dev: &Device, end: u64) -> io::Result<DirtyLog> {
        use std::os::fd::AsRawFd;
        let len = end.div_ceil(4096).div_ceil(8).next_multiple_of(8);
        // SAFETY: the name is NUL-terminated; a non-negative result is a new descriptor.
        let fd = unsafe { libc::memfd_create(c"vufs-dirty-log".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len)?;
        let region = vhost::VhostUserDirtyLogRegion {
            mmap_size: len,
            mmap_offset: 0,
            mmap_handle: file.as_raw_fd(),
        };
        dev.with_frontend(false, |fe| {
            vhost::VhostBackend::set_log_base(fe, 0, Some(region))
        })?;
        Ok(DirtyLog { file, len })
    }

    /// Guest page numbers whose bit is set.
    pub fn dirty_pages(&self) -> io::Result<Vec<u64>> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; self.len as usize];
        self.file.read_exact_at(&mut buf, 0)?;
        let mut pages = Vec::new();
        for (i, b) in buf.iter().enumerate() {
            for bit in 0..8 {
                if b & (1 << bit) != 0 {
                    pages.push(i as u64 * 8 + bit);
                }
            }
        }
        Ok(pages)
    }

    /// Clears every bit (as QEMU does when it syncs the log).
    pub fn clear(&self) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file.write_all_at(&vec![0u8; self.len as usize], 0)
    }
}
