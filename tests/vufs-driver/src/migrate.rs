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
