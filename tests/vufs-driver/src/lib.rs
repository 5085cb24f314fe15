//! A userspace virtio-fs driver for tests and benchmarks: it plays QEMU (the vhost-user
//! frontend) and the guest's virtio-fs driver against any vhost-user-fs backend socket.
//!
//! - [`daemon::Daemon`] spawns a backend (upstream virtiofsd or daxfsd) on a fresh socket.
//! - [`Session::connect`] does the vhost-user handshake ([`device::Device`]) and gives a FUSE
//!   client: [`Session::init`], [`Session::lookup`], ..., and [`Session::send`] for raw
//!   requests with arbitrary bytes and descriptor layouts ([`queue::Chain`]).
//! - [`dax::DaxWindow`] is the device's shared-memory window; the backend's `SHMEM_MAP` and
//!   `SHMEM_UNMAP` requests land there ([`Session::dax`]).
//!
//! Every request has a timeout, and nothing a backend sends can panic the driver: a broken
//! backend shows up as an `io::Error` (or in [`device::Device::violations`]).
//!
//! ```no_run
//! use vufs_driver::{Daemon, DaemonKind, Session};
//! # fn main() -> std::io::Result<()> {
//! let shared = std::path::Path::new("/tmp/share");
//! let daemon = Daemon::builder(&DaemonKind::from_env())?.shared_dir(shared).arg("--tag=fs").spawn()?;
//! let s = Session::connect(daemon.socket_path())?;
//! let init = s.init()?;                             // FUSE_INIT, Linux 6.12 flags
//! let e = s.lookup(1, "file")?;                     // EntryOut
//! let o = s.open(e.nodeid, libc::O_RDWR as u32)?;
//! let data = s.read(e.nodeid, o.fh, 0, 4096)?;
//! let q2 = s.on_queue(1)?;                          // a handle for another thread/queue
//! if let Some(w) = s.dax() {                        // the DAX window, if the device has one
//!     s.setupmapping(e.nodeid, o.fh, 0, 2 << 20, daxfsd::abi::SETUPMAPPING_FLAG_READ, 0)?;
//!     let mut buf = [0u8; 16];
//!     w.read(0, &mut buf)?;                         // bytes of the file through the window
//!     println!("{:?} {:?}", w.mappings(), w.stats());
//! }
//! let raw = s.send(daxfsd::abi::opcode::GETATTR, 1, &[&[0u8; 16]], 120, 1)?; // raw request
//! println!("{init:?} {} {:?} {}", data.len(), raw.header(), q2.queue());
//! drop(s);                                           // closes the socket; the daemon exits
//! # Ok(()) }
//! ```

use std::io;
use std::time::Duration;

pub mod daemon;
pub mod dax;
pub mod device;
pub mod fuse;
pub mod memory;
pub mod migrate;
pub mod queue;

pub use daemon::{Daemon, DaemonKind};
pub use dax::{DaxStats, DaxWindow, Mapping};
pub use device::{Device, DeviceInfo, DriverConfig, FeatureMode};
pub use fuse::{DirEntry, DirEntryPlus, InitOptions, Reply, Session, Xattr};
pub use queue::{Chain, Completion, Seg};

/// CPU time (user + system, every thread) process `pid` has used so far, from
/// `/proc/PID/stat`; `None` when the process is gone.
pub fn process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at state (field 3).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| Duration::from_nanos(ticks * 1_000_000_000 / hz as u64))
}

/// The argument of a GETLK/SETLK/SETLKW for a write lock on a whole file through handle `fh`,
/// taken by lock owner `owner` (guest pid 1).
pub fn whole_file_write_lock(fh: u64, owner: u64) -> daxfsd::abi::LkIn {
    daxfsd::abi::LkIn {
        fh,
        owner,
        lk: daxfsd::abi::FileLock {
            start: 0,
            end: u64::MAX,
            typ: libc::F_WRLCK as u32,
            pid: 1,
        },
        ..Default::default()
    }
}

/// Takes a write lock on the whole of `path` from this (host) process, as an open file
/// description lock (the kind daxfsd's remote POSIX locks use): a guest's conflicting lock
/// waits until the returned file is dropped.
pub fn host_write_lock(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let mut fl = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    // SAFETY: `f` is an open descriptor and `fl` a valid flock struct the kernel reads.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(f)
}

/// poll(2) on `fds`; returns the number of fds with events (0 on timeout or EINTR).
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<usize> {
    let ms = i32::try_from(timeout.as_millis())
        .unwrap_or(i32::MAX)
        .max(1);
    // SAFETY: `fds` is a valid, exclusively borrowed slice of pollfd structs for the whole
    // call and its length is passed with it; negative fds are ignored by poll(2).
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(0)
        } else {
            Err(e)
        };
    }
    Ok(r as usize)
}
