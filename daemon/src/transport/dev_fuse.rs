//! The /dev/fuse transport: the same [`Server`] serving a host mount point.
//!
//! `daxfsd --mount MOUNTPOINT` opens `/dev/fuse` and mounts it ([`mount`]: mount(2) as
//! root, `fusermount3` with `_FUSE_COMMFD` descriptor passing for other users). Worker
//! threads ([`spawn_workers`]) each read one request with one read(2) into their own buffer,
//! hand a [`Reader`]/[`Writer`] over plain memory to [`Server::handle`] and write the reply
//! with one write(2). Unmounting is done by a small helper process forked before the
//! sandbox ([`Unmounter`]), which stays in the host's mount namespace with the rights to
//! unmount, so the serving process needs neither `umount2` in its seccomp list nor a path
//! to the mount point inside its sandbox. A SETLKW runs on a thread of its own (a lock wait
//! must not hold a worker, [`LockWaits`]); FUSE passthrough registers backing files on the connection
//! ([`DevFuseBacking`]).

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use vm_memory::VolatileSlice;

use crate::protocol::filesystem::FileSystem;
use crate::protocol::iobuf::{Reader, Seg, Writer};
use crate::protocol::policy::{self, Wait};
use crate::protocol::server::Server;

use super::lock_waits::{LockWaits, WaitServer, MAX_LOCK_THREADS};

/// Linux refuses reads of /dev/fuse into buffers smaller than this (`FUSE_MIN_READ_BUFFER`).
pub const MIN_READ_BUFFER: usize = 8192;
/// Worker threads when `--thread-pool-size` is 0: enough that a slow request (fsync, a
/// blocking lock) does not hold up the others, few enough for small machines. Only the first
/// reads from the start; the others are woken as the load needs them ([`Pool`]).
pub const DEFAULT_THREADS: usize = 4;
/// The filesystem type shown in /proc/mounts (`fuse.daxfsd`).
const SUBTYPE: &str = "daxfsd";

fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: path contains a NUL byte", p.display()),
        )
    })
}

/// Checks the mount point before mounting: a directory, outside the shared directory, and
/// not a dead FUSE mount left behind by a daemon that crashed ("Transport endpoint is not
/// connected"), which is reported with the fix and never unmounted on the user's behalf.
pub fn check_mountpoint(mountpoint: &Path, shared_dir: &Path) -> io::Result<PathBuf> {
    // stat may answer from cached attributes of a dead connection; statfs always asks the
    // filesystem, so a dead FUSE mount answers ENOTCONN.
    let statfs = cpath(mountpoint).and_then(|c| {
        // SAFETY: `c` is NUL-terminated and `buf` a writable statfs struct.
        let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        match unsafe { libc::statfs(c.as_ptr(), &mut buf) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    });
    let md = match statfs.and_then(|()| std::fs::metadata(mountpoint)) {
        Ok(md) => md,
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            let p = mountpoint.display();
            return Err(io::Error::other(
                format!(
                    "--mount {p}: a stale FUSE mount is there (Transport endpoint is not connected; its daemon died); unmount it with `umount -l {p}` (or `fusermount3 -u {p}`) and start again"
                ),
            ));
        }
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "--mount {}: {e} (create the directory first)",
                    mountpoint.display()
                ),
            ))
        }
    };
    if !md.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("--mount {}: not a directory", mountpoint.display()),
        ));
    }
    let mp = std::fs::canonicalize(mountpoint)?;
    let shared = std::fs::canonicalize(shared_dir)?;
    if shared.starts_with(&mp) {
        // Mounting over the share (or a directory above it) would hide it: the daemon would
        // look its own files up through its own mount.
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "--mount {}: the mount would cover --shared-dir {}; choose a mount point outside it",
                mp.display(),
                shared.display()
            ),
        ));
    }
    if mp.starts_with(&shared) {
        // Serving a directory that contains its own mount point would loop into itself.
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "--mount {}: inside --shared-dir {}; choose a mount point outside the shared directory",
                mp.display(),
                shared.display()
            ),
        ));
    }
    Ok(mp)
}

/// How the mount was made (and so how it is undone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountedBy {
    /// mount(2) by this (root) process: umount2.
    Kernel,
    /// `fusermount3` for a non-root user: `fusermount3 -u`.
    Fusermount,
}

/// A mounted FUSE connection.
#[derive(Debug)]
pub struct Mounted {
    /// The /dev/fuse descriptor of the connection.
    pub dev: File,
    pub mountpoint: PathBuf,
    pub by: MountedBy,
}

/// What the mount looks like.
#[derive(Debug, Clone, Copy, Default)]
pub struct MountOptions {
    pub readonly: bool,
}

/// The options both mount paths pass: as a virtio-fs guest mount has them
/// (`fs/fuse/virtio_fs.c` sets `default_permissions` and `allow_other`), so the same server
/// sees the same requests. `default_permissions`: the kernel checks mode bits and ACLs
/// against the attributes the server returns, as a local filesystem does (the server's
/// credential switch checks again on the host). `allow_other`: every user of the host sees
/// the share, not just the one who mounted it.
fn common_options(allow_other: bool) -> String {
    let mut o = String::from("default_permissions");
    if allow_other {
        o.push_str(",allow_other");
    }
    o
}

/// Mounts /dev/fuse on `mountpoint`: mount(2) when running as root, else `fusermount3`
/// (installed by Debian's `fuse3`), else a one-line error.
pub fn mount(mountpoint: &Path, source: &Path, opts: MountOptions) -> io::Result<Mounted> {
    if crate::sys::geteuid() == 0 {
        mount_kernel(mountpoint, source, opts)
    } else {
        mount_fusermount(mountpoint, opts)
    }
}

fn mount_kernel(mountpoint: &Path, source: &Path, opts: MountOptions) -> io::Result<Mounted> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot open /dev/fuse: {e} (load the fuse module: modprobe fuse)"),
            )
        })?;
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let data = format!(
        "fd={},rootmode=40000,user_id={uid},group_id={gid},{}",
        dev.as_raw_fd(),
        common_options(true)
    );
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    if opts.readonly {
        flags |= libc::MS_RDONLY;
    }
    let src = cpath(source)?;
    let target = cpath(mountpoint)?;
    let fstype =
        CString::new(format!("fuse.{SUBTYPE}")).map_err(|_| io::ErrorKind::InvalidInput)?;
    let cdata = CString::new(data).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let ret = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            cdata.as_ptr().cast(),
        )
    };
    if ret < 0 {
        return Err(os_err(&format!(
            "cannot mount FUSE on {}",
            mountpoint.display()
        )));
    }
    Ok(Mounted {
        dev,
        mountpoint: mountpoint.to_path_buf(),
        by: MountedBy::Kernel,
    })
}

/// Finds `name` on PATH (or the usual system directories when PATH is unset).
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The setuid mount helper: libfuse 3's `fusermount3`, else libfuse 2's `fusermount`
/// (the same `_FUSE_COMMFD` protocol; Debian 12 installs one or the other).
fn fusermount() -> Option<PathBuf> {
    which("fusermount3").or_else(|| which("fusermount"))
}

/// Whether /etc/fuse.conf lets non-root users mount with `allow_other`.
fn user_allow_other() -> bool {
    std::fs::read_to_string("/etc/fuse.conf").is_ok_and(|s| {
        s.lines()
            .any(|l| l.split('#').next().unwrap_or("").trim() == "user_allow_other")
    })
}

fn mount_fusermount(mountpoint: &Path, opts: MountOptions) -> io::Result<Mounted> {
    let Some(fusermount) = fusermount() else {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "--mount as a non-root user needs fusermount3: install it (apt install fuse3) or run as root",
        ));
    };
    let allow_other = user_allow_other();
    if !allow_other {
        log::warn!(
            "/etc/fuse.conf has no user_allow_other: the mount is visible to this user only"
        );
    }
    let mut o = format!(
        "{},fsname={SUBTYPE},subtype={SUBTYPE}",
        common_options(allow_other)
    );
    o.push_str(if opts.readonly { ",ro" } else { ",rw" });
    let (ours, theirs) = UnixStream::pair()?;
    // The child end must survive exec: clear its close-on-exec flag in the child only.
    let their_fd = theirs.as_raw_fd();
    let mut cmd = std::process::Command::new(&fusermount);
    cmd.arg("-o")
        .arg(&o)
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", their_fd.to_string());
    // SAFETY: the closure only calls fcntl, which is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            if libc::fcntl(their_fd, libc::F_SETFD, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = cmd.status().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot run {}: {e}", fusermount.display()),
        )
    })?;
    drop(theirs);
    if !status.success() {
        return Err(io::Error::other(format!(
            "{} could not mount {} ({status}; see its message above)",
            fusermount.display(),
            mountpoint.display()
        )));
    }
    let fd = recv_fd(&ours)?;
    Ok(Mounted {
        dev: File::from(fd),
        mountpoint: mountpoint.to_path_buf(),
        by: MountedBy::Fusermount,
    })
}

/// Receives one descriptor sent with SCM_RIGHTS (fusermount3's answer).
fn recv_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one descriptor's control message, aligned for cmsghdr.
    let mut cbuf = [0u64; 8];
    // SAFETY: a zeroed msghdr is a valid empty header; the fields set below point to live
    // buffers of the stated sizes.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: `msg` describes valid buffers owned by this frame.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(os_err(
            "receiving the /dev/fuse descriptor from fusermount3",
        ));
    }
    // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR stays inside msg_control.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    let rights = !cmsg.is_null() && {
        // SAFETY: `cmsg` is non-null and points to a control header inside `cbuf`.
        let h = unsafe { &*cmsg };
        h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS
    };
    if !rights {
        return Err(io::Error::other("fusermount3 sent no /dev/fuse descriptor"));
    }
    // SAFETY: an SCM_RIGHTS message carries at least one int; read unaligned from its data.
    let fd: RawFd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast()) };
    // SAFETY: the kernel just installed `fd` in this process for us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A helper process forked before the sandbox that unmounts on request. It stays in the
/// host's mount namespace with the daemon's original privileges; it exits when asked, or
/// (without unmounting: a crashed daemon leaves a stale mount, reported at the next start)
/// when the daemon's end of the socket closes.
#[derive(Debug)]
pub struct Unmounter {
    /// A socket, used through read(2)/write(2) (the serving process's seccomp list has no
    /// recvfrom/sendto for it).
    sock: Option<File>,
    pid: libc::pid_t,
}

/// Unmounts `m`: a plain unmount, and a lazy one (MNT_DETACH, `fusermount3 -u -z`) when the
/// mount is busy. Returns how it went, for the log.
fn do_unmount(mountpoint: &Path, by: MountedBy) -> String {
    match by {
        MountedBy::Kernel => {
            let Ok(target) = cpath(mountpoint) else {
                return "bad path".into();
            };
            // SAFETY: `target` is NUL-terminated.
            if unsafe { libc::umount2(target.as_ptr(), 0) } == 0 {
                return "unmounted".into();
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EBUSY) {
                return format!("umount failed: {e}");
            }
            // SAFETY: as above.
            if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } == 0 {
                "busy: detached (lazy unmount)".into()
            } else {
                format!("lazy umount failed: {}", io::Error::last_os_error())
            }
        }
        MountedBy::Fusermount => {
            let Some(bin) = fusermount() else {
                return "no fusermount3 to unmount with".into();
            };
            let run = |lazy: bool| {
                let mut c = std::process::Command::new(&bin);
                c.arg("-u").arg("-q");
                if lazy {
                    c.arg("-z");
                }
                c.arg("--").arg(mountpoint).status()
            };
            match run(false) {
                Ok(s) if s.success() => "unmounted".into(),
                _ => match run(true) {
                    Ok(s) if s.success() => "busy: detached (lazy unmount)".into(),
                    Ok(s) => format!("{} -u -z failed ({s})", bin.display()),
                    Err(e) => format!("cannot run {}: {e}", bin.display()),
                },
            }
        }
    }
}

impl Unmounter {
    /// Forks the helper. Call while the process is single-threaded.
    pub fn spawn(mountpoint: &Path, by: MountedBy, close: &[RawFd]) -> io::Result<Self> {
        let (ours, theirs) = UnixStream::pair()?;
        let mp = mountpoint.to_path_buf();
        // SAFETY: fork in a single-threaded process (the caller's contract); the child only
        // runs the loop below and exits with _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(os_err("fork of the unmount helper"));
        }
        if pid == 0 {
            drop(ours);
            for &fd in close {
                // SAFETY: closing descriptors this child must not keep (the /dev/fuse
                // connection: a helper holding it would keep a dead daemon's mount
                // answering nothing instead of failing with ENOTCONN).
                unsafe { libc::close(fd) };
            }
            // SAFETY: ignoring terminal signals and naming the process are plain calls.
            unsafe {
                for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
                    libc::signal(s, libc::SIG_IGN);
                }
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
                libc::prctl(libc::PR_SET_NAME, c"daxfsd-umount".as_ptr());
            }
            let mut s = File::from(OwnedFd::from(theirs));
            let mut req = [0u8; 1];
            let code = match s.read(&mut req) {
                Ok(1) => {
                    let msg = do_unmount(&mp, by);
                    let _ = s.write_all(msg.as_bytes());
                    0
                }
                _ => 0,
            };
            // SAFETY: leaves the child without running the parent's atexit handlers.
            unsafe { libc::_exit(code) };
        }
        drop(theirs);
        Ok(Unmounter {
            sock: Some(File::from(OwnedFd::from(ours))),
            pid,
        })
    }

    /// Asks the helper to unmount; returns its report.
    pub fn unmount(&mut self) -> io::Result<String> {
        let Some(mut s) = self.sock.take() else {
            return Ok("already unmounted".into());
        };
        s.write_all(b"u")?;
        let mut msg = String::new();
        s.read_to_string(&mut msg)?;
        Ok(msg)
    }

    /// The helper's process id (it is reaped by whoever outlives it: the serving process
    /// may not call wait4 under its seccomp filter).
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }
}

/// A callback the worker that wrote the INIT reply runs right after the write (the kernel
/// has then set up the connection): the io-uring transport registers its rings there.
#[derive(Default)]
pub struct InitHook(std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>);

impl InitHook {
    /// Sets the callback (once; later calls are ignored).
    pub fn set(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.0.set(Box::new(f));
    }

    fn run(&self) {
        if let Some(f) = self.0.get() {
            f();
        }
    }
}

impl std::fmt::Debug for InitHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "InitHook(set)"
        } else {
            "InitHook"
        })
    }
}

/// Reply-write outcomes and the like, for the exit report.
#[derive(Debug, Default)]
pub struct Counters {
    pub requests: AtomicU64,
    /// Requests other than FORGET, BATCH_FORGET and INTERRUPT (which Linux sends through
    /// read(2) even when the io-uring transport serves the rest).
    pub not_forget: AtomicU64,
    pub after_init: InitHook,
    /// Replies the kernel refused with ENOENT: the request was interrupted meanwhile.
    pub interrupted: AtomicU64,
    pub write_errors: AtomicU64,
}

/// Per-thread buffer size: the largest request (`max_write` of payload plus its headers),
/// never below what the kernel accepts.
pub fn buffer_size(max_write: u32) -> usize {
    (max_write as usize + 4096).max(MIN_READ_BUFFER)
}

/// Most lock waits queued behind the [`MAX_LOCK_THREADS`] at once (each holds a copy of
/// its request, under 100 bytes): beyond that a SETLKW fails with ENOLCK, as a host lock
/// table out of room does, rather than memory growing with the number of waiting callers.
pub const MAX_QUEUED_WAITS: usize = 4096;

/// How the /dev/fuse transport serves a lock wait ([`LockWaits`]): a copy of the request,
/// answered with one write(2) from the lock thread.
struct DevWaits<F: FileSystem + Send + Sync + 'static> {
    dev: Arc<File>,
    server: Arc<Server<F>>,
    counters: Arc<Counters>,
}

impl<F: FileSystem + Send + Sync + 'static> WaitServer for DevWaits<F> {
    type Job = Vec<u8>;

    fn serve(&self, mut req: Vec<u8>) {
        let mut out = vec![0u8; 4096];
        let _ = answer(
            self.dev.as_raw_fd(),
            &self.server,
            &mut req,
            &mut out,
            &self.counters,
        );
    }

    /// Answers `req` with ENOLCK (a reply of the out-header alone).
    fn refuse(&self, req: Vec<u8>) {
        let Some(unique) = req.get(8..16) else {
            return;
        };
        let mut reply = [0u8; 16];
        reply[..4].copy_from_slice(&16u32.to_ne_bytes());
        reply[4..8].copy_from_slice(&(-libc::ENOLCK).to_ne_bytes());
        reply[8..].copy_from_slice(unique);
        // SAFETY: writes the 16 bytes of `reply`.
        let m = unsafe { libc::write(self.dev.as_raw_fd(), reply.as_ptr().cast(), reply.len()) };
        if m < 0 {
            log::debug!(
                "ENOLCK reply: write /dev/fuse: {}",
                io::Error::last_os_error()
            );
        }
    }
}

type Waits<F> = LockWaits<DevWaits<F>>;

/// The connection is gone (ENODEV): unmounted or aborted.
struct Ended;

/// Answers one request: hands it to the server and writes the reply with one write(2).
fn answer<F: FileSystem>(
    fd: RawFd,
    server: &Server<F>,
    req: &mut [u8],
    out: &mut [u8],
    counters: &Counters,
) -> Result<(), Ended> {
    let r = Reader::with_far(vec![Seg::Mem(VolatileSlice::from(&mut *req))], None);
    let w = Writer::with_far(vec![Seg::Mem(VolatileSlice::from(&mut *out))], None);
    let handled = match server.handle(r, Some(w)) {
        Ok(h) => h,
        // Already logged by the server; an unreadable request gets no reply.
        Err(_) => return Ok(()),
    };
    {
        use crate::protocol::abi::opcode as op;
        if !matches!(
            handled.opcode,
            op::FORGET | op::BATCH_FORGET | op::INTERRUPT
        ) {
            counters.not_forget.fetch_add(1, Ordering::Relaxed);
        }
    }
    if handled.written == 0 {
        return Ok(());
    }
    // SAFETY: writes `written` bytes of `out`, which the server filled.
    let m = unsafe { libc::write(fd, out.as_ptr().cast(), handled.written) };
    if m >= 0 && handled.opcode == crate::protocol::abi::opcode::INIT {
        counters.after_init.run();
    }
    if m < 0 {
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOENT) => {
                counters.interrupted.fetch_add(1, Ordering::Relaxed);
                server.reply_lost(req, &out[..handled.written]);
            }
            Some(libc::ENODEV) => return Err(Ended),
            _ => {
                counters.write_errors.fetch_add(1, Ordering::Relaxed);
                log::warn!(
                    "reply to {} ({} bytes): write /dev/fuse: {e}",
                    crate::protocol::abi::opcode::name(handled.opcode),
                    handled.written
                );
            }
        }
    }
    Ok(())
}

/// The workers of one connection. The first reads requests from the start; the others wait
/// parked until the load needs them, and once woken stay. Linux hands a request to the
/// reader that has waited longest, so idle readers take turns and each request then wakes a
/// cold thread, often on the other CPU: one reader serving one synchronous client ran 4 KiB
/// reads at 95k/s where four took 64k/s (measured, fio psync randread O_DIRECT on tmpfs). A
/// worker that takes a request while no other worker is reading wakes a parked one when
/// another request is already waiting (poll(2) on the device), or before a request that may
/// take long (FSYNC, FSYNCDIR, SYNCFS, FALLOCATE). Any other request that keeps every active
/// worker busy for more than [`STALL`] (a slow host file system, a lease break) wakes one too:
/// a watchdog thread looks every [`STALL`] while workers are parked.
pub struct Pool {
    /// Active workers now blocked in read(2).
    reading: AtomicUsize,
    /// Requests being answered by active workers, and how many were taken in all (the
    /// watchdog's sign of progress).
    busy: AtomicUsize,
    taken: AtomicU64,
    /// Workers not woken yet (parked, or not yet at their park).
    inactive: AtomicUsize,
    /// Wake-ups granted to parked workers and not yet taken.
    tokens: Mutex<usize>,
    cv: Condvar,
    /// The watchdog's timed wait (a futex: the seccomp list has no nanosleep).
    watchdog_cv: Condvar,
    /// The connection ended: parked workers return.
    ended: AtomicBool,
}

impl Pool {
    fn new(threads: usize) -> Self {
        Pool {
            reading: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            taken: AtomicU64::new(0),
            inactive: AtomicUsize::new(threads.saturating_sub(1)),
            tokens: Mutex::new(0),
            cv: Condvar::new(),
            watchdog_cv: Condvar::new(),
            ended: AtomicBool::new(false),
        }
    }

    /// Waits until woken (true) or until the connection ends (false).
    fn park(&self) -> bool {
        let mut t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if *t > 0 {
                *t -= 1;
                return true;
            }
            if self.ended.load(Ordering::Acquire) {
                return false;
            }
            t = self.cv.wait(t).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Wakes one parked worker, if any is left.
    fn wake_one(&self) {
        let left = self
            .inactive
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if left.is_ok() {
            *self.tokens.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            self.cv.notify_one();
        }
    }

    /// Wakes a parked worker whenever every active worker has been busy with the same
    /// requests for a whole [`STALL`]; returns when no worker is parked or the pool ended.
    fn watchdog(&self) {
        let mut last = u64::MAX;
        while self.inactive.load(Ordering::Acquire) > 0 && !self.ended.load(Ordering::Acquire) {
            let t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
            drop(self.watchdog_cv.wait_timeout(t, STALL));
            let taken = self.taken.load(Ordering::Acquire);
            let stalled = self.reading.load(Ordering::Acquire) == 0
                && self.busy.load(Ordering::Acquire) > 0
                && taken == last;
            if stalled {
                self.wake_one();
            }
            last = taken;
        }
    }

    fn end(&self) {
        self.ended.store(true, Ordering::Release);
        let _t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        self.cv.notify_all();
        self.watchdog_cv.notify_all();
    }

    /// After a worker took `req`: wake another when the load needs one (see [`Pool`]).
    fn maybe_wake(&self, fd: RawFd, req: &[u8]) {
        if self.inactive.load(Ordering::Acquire) == 0 || self.reading.load(Ordering::Acquire) > 0 {
            return;
        }
        let slow = opcode(req).is_some_and(takes_long);
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let waiting =
            !slow && unsafe { libc::poll(&mut pfd, 1, 0) } > 0 && pfd.revents & libc::POLLIN != 0;
        if slow || waiting {
            self.wake_one();
        }
    }
}

/// How long every active worker may be busy before the watchdog wakes a parked one.
pub const STALL: std::time::Duration = std::time::Duration::from_millis(10);

/// Ends the pool when its worker returns, however it returns.
struct EndPool<'a>(&'a Pool);

impl Drop for EndPool<'_> {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// Counts a request in [`Pool::busy`] while its worker answers it.
struct Busy<'a>(&'a Pool);

impl<'a> Busy<'a> {
    fn new(pool: &'a Pool) -> Self {
        pool.busy.fetch_add(1, Ordering::AcqRel);
        Busy(pool)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The opcode of a raw request (`fuse_in_header.opcode`), if the request is long enough.
fn opcode(req: &[u8]) -> Option<u32> {
    req.get(4..8)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

/// SETLKW waits for another process's lock, whose release needs a worker of its own: served
/// on a separate thread, so waiting locks can never take every worker.
fn may_block(req: &[u8]) -> bool {
    opcode(req).is_some_and(|op| policy::wait(op) == Wait::Indefinite)
}

/// A request that may keep its worker long (FSYNC, FLUSH, ...: [`policy::LONG`]) wakes
/// another worker at once rather than when a request is seen waiting: the rest of the
/// load goes on without it.
fn takes_long(op: u32) -> bool {
    policy::wait(op) == Wait::Long
}

/// Reads requests from `dev` and answers them until the connection ends (ENODEV: unmounted,
/// or aborted). Returns Ok on a clean end.
/// A parked worker (`parked`) first waits for the pool to wake it.
fn serve_one_thread<F: FileSystem + Send + Sync + 'static>(
    dev: &Arc<File>,
    server: &Arc<Server<F>>,
    buf_size: usize,
    counters: &Arc<Counters>,
    pool: &Pool,
    waits: &Arc<Waits<F>>,
    parked: bool,
) -> io::Result<()> {
    let _end = EndPool(pool);
    if parked && !pool.park() {
        return Ok(());
    }
    let mut inbuf = vec![0u8; buf_size];
    let mut outbuf = vec![0u8; buf_size];
    let fd = dev.as_raw_fd();
    loop {
        pool.reading.fetch_add(1, Ordering::AcqRel);
        // SAFETY: reads into `inbuf`, which is valid for `buf_size` bytes.
        let n = unsafe { libc::read(fd, inbuf.as_mut_ptr().cast(), inbuf.len()) };
        pool.reading.fetch_sub(1, Ordering::AcqRel);
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR | libc::EAGAIN) => continue,
                Some(libc::ENODEV) => return Ok(()),
                _ => return Err(io::Error::new(e.kind(), format!("read /dev/fuse: {e}"))),
            }
        }
        let n = n as usize;
        counters.requests.fetch_add(1, Ordering::Relaxed);
        pool.taken.fetch_add(1, Ordering::AcqRel);
        pool.maybe_wake(fd, &inbuf[..n]);
        let _busy = Busy::new(pool);
        if may_block(&inbuf[..n]) {
            // Never served here: a reader waiting for a lock could be the one the holder's
            // unlock (FLUSH, RELEASE, SETLK) needs.
            waits.submit(inbuf[..n].to_vec());
            continue;
        }
        if answer(fd, server, &mut inbuf[..n], &mut outbuf, counters).is_err() {
            return Ok(());
        }
    }
}

/// Starts `threads` workers on `dev`. Each ends when the connection does.
pub fn spawn_workers<F: FileSystem + Send + Sync + 'static>(
    dev: Arc<File>,
    server: Arc<Server<F>>,
    threads: usize,
    counters: Arc<Counters>,
) -> io::Result<Vec<JoinHandle<io::Result<()>>>> {
    let buf_size = buffer_size(server.max_write());
    let threads = threads.max(1);
    let pool = Arc::new(Pool::new(threads));
    let waits = LockWaits::new(
        DevWaits {
            dev: dev.clone(),
            server: server.clone(),
            counters: counters.clone(),
        },
        "fuse-lock",
        MAX_LOCK_THREADS,
        MAX_QUEUED_WAITS,
    );
    if threads > 1 {
        let pool = pool.clone();
        std::thread::Builder::new()
            .name("fuse-watchdog".into())
            .spawn(move || pool.watchdog())?;
    }
    (0..threads)
        .map(|i| {
            let (dev, server, counters) = (dev.clone(), server.clone(), counters.clone());
            let (pool, waits) = (pool.clone(), waits.clone());
            std::thread::Builder::new()
                .name(format!("fuse-{i}"))
                .spawn(move || {
                    serve_one_thread(&dev, &server, buf_size, &counters, &pool, &waits, i > 0)
                })
        })
        .collect()
}

/// `FUSE_DEV_IOC_BACKING_OPEN` = `_IOW(229, 1, struct fuse_backing_map)`.
pub const FUSE_DEV_IOC_BACKING_OPEN: u32 = 0x4010_e501;
/// `FUSE_DEV_IOC_BACKING_CLOSE` = `_IOW(229, 2, uint32_t)`.
pub const FUSE_DEV_IOC_BACKING_CLOSE: u32 = 0x4004_e502;

/// `struct fuse_backing_map` (include/uapi/linux/fuse.h; flags and padding must be 0).
#[repr(C)]
struct BackingMap {
    fd: i32,
    flags: u32,
    padding: u64,
}

/// Backing files registered on a /dev/fuse connection (needs CAP_SYS_ADMIN).
pub struct DevFuseBacking {
    dev: Arc<File>,
}

impl DevFuseBacking {
    pub fn new(dev: Arc<File>) -> Self {
        DevFuseBacking { dev }
    }
}

impl crate::protocol::backing::Backing for DevFuseBacking {
    fn open(&self, fd: std::os::fd::BorrowedFd) -> io::Result<i32> {
        let map = BackingMap {
            fd: fd.as_raw_fd(),
            flags: 0,
            padding: 0,
        };
        // SAFETY: the ioctl reads one `struct fuse_backing_map`, which `map` is, and the
        // descriptor it names stays open for the call.
        let ret = unsafe {
            libc::ioctl(
                self.dev.as_raw_fd(),
                FUSE_DEV_IOC_BACKING_OPEN as libc::c_ulong,
                &map,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ret)
    }

    fn close(&self, id: i32) -> io::Result<()> {
        let id = id as u32;
        // SAFETY: the ioctl reads one u32.
        let ret = unsafe {
            libc::ioctl(
                self.dev.as_raw_fd(),
                FUSE_DEV_IOC_BACKING_CLOSE as libc::c_ulong,
                &id,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Whether the running kernel has FUSE-over-io-uring zero copy (`FUSE_URING_ZERO_COPY`, the
/// 2026 series "fuse: add zero-copy over io-uring"): its page-release callback
/// `fuse_zero_copy_release` (address-taken, so never inlined away) is then among the
/// kernel's symbols next to the io-uring transport's `fuse_uring_*`. None when
/// /proc/kallsyms cannot tell (unreadable, or no FUSE-over-io-uring at all).
pub fn kernel_has_uring_zero_copy() -> Option<bool> {
    let syms = std::fs::read_to_string("/proc/kallsyms").ok()?;
    let mut uring = false;
    for name in syms.lines().filter_map(|l| l.split_whitespace().nth(2)) {
        if name.starts_with("fuse_zero_copy_release") {
            return Some(true);
        }
        uring |= name.starts_with("fuse_uring_");
    }
    uring.then_some(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::abi::opcode as op;

    /// A raw request of `opcode`: the in-header is all the scheduling looks at.
    fn request(opcode: u32) -> Vec<u8> {
        let mut req = vec![0u8; 40];
        req[..4].copy_from_slice(&40u32.to_ne_bytes());
        req[4..8].copy_from_slice(&opcode.to_ne_bytes());
        req
    }

    #[test]
    fn lock_waits_get_a_thread_of_their_own() {
        assert!(may_block(&request(op::SETLKW)));
        for o in [op::SETLK, op::FSYNC, op::FLUSH, op::READ] {
            assert!(!may_block(&request(o)), "{}", op::name(o));
        }
        assert!(!may_block(&[0u8; 6]), "too short for an opcode");
    }

    /// FLUSH and COPY_FILE_RANGE were missing from the wake-up list: a worker busy with a
    /// host close writing a whole file back over NFS (or with a copy of gigabytes) left the
    /// requests behind it to the watchdog, [`STALL`] later.
    #[test]
    fn long_requests_wake_another_worker() {
        for o in [
            op::FSYNC,
            op::FSYNCDIR,
            op::SYNCFS,
            op::FALLOCATE,
            op::FLUSH,
            op::COPY_FILE_RANGE,
        ] {
            assert!(takes_long(o), "{}", op::name(o));
        }
        // A lock wait has a thread of its own; the rest end soon.
        for o in [op::SETLKW, op::SETLK, op::READ, op::WRITE, op::RELEASE] {
            assert!(!takes_long(o), "{}", op::name(o));
        }
    }
}
