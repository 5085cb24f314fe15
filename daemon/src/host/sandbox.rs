//! `--sandbox`: confine the serving process to the shared directory, as virtiofsd does.
//!
//! - `namespace` (the default): the process forks; the child is pid 1 of a new pid namespace
//!   and also gets new mount, network, IPC and UTS namespaces. In the child, every mount
//!   becomes a slave of the host's (host mounts still propagate in, nothing propagates out),
//!   a fresh procfs is mounted on `/proc` and `/proc/self/fd` opened, the shared directory is
//!   bind-mounted onto itself and becomes the root (`pivot_root`), and the old root is
//!   detached: the daemon sees the share and nothing else. A non-root daemon first enters a
//!   new user namespace mapping only its own uid and gid, or, with `--uid-map`/`--gid-map`
//!   (virtiofsd's syntax `:inside:outside:count:`), the ranges given: a helper process
//!   forked before the namespace exists runs the setuid tools `newuidmap`/`newgidmap`
//!   (Debian package `uidmap`, ranges granted in `/etc/subuid` and `/etc/subgid`) on the
//!   daemon, as virtiofsd does; inside the namespace they would lose their setuid power. The
//!   parent stays outside: it forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT and SIGUSR1 to the child,
//!   waits for it, removes the socket and pid files and exits with the child's status (or dies of
//!   the same signal). The child ends cleanly on SIGTERM, SIGINT and SIGHUP (exit status 0; see
//!   `daemon::run`), so the parent then exits 0 too.
//! - `chroot`: `/proc/self/fd` is opened, then the process `chroot`s into the shared
//!   directory (root only). No fork and no namespaces.
//! - `none`: nothing changes.
//!
//! Whatever must survive is opened first: the caller creates the vhost-user listening socket
//! before [`enter`], and [`Inside::proc_self_fd`] is opened before procfs goes out of sight.
//! Nothing else from the host stays open in the sandbox, except the `--syslog` socket
//! (connected to `/dev/log` before the sandbox, as virtiofsd does) and, with `chroot`, an
//! `O_PATH` descriptor of the socket's directory and the locked pid file (see `runfiles`),
//! which let the daemon remove its socket and pid file at exit.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use clap::ValueEnum;

use crate::sys;

/// One `--uid-map`/`--gid-map` range: ids `inside..inside+count` in the daemon's user
/// namespace are `outside..outside+count` on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

impl IdRange {
    /// Parses virtiofsd's `:inside:outside:count:` (any non-alphanumeric delimiter, the same
    /// first and last). `opt` names the option in the error.
    pub fn parse(opt: &str, s: &str) -> Result<IdRange, String> {
        let bad =
            || format!("{opt} {s:?}: expected :inside:outside:count: (e.g. :0:100000:65536:)");
        let delim = s
            .chars()
            .last()
            .filter(|c| !c.is_alphanumeric())
            .ok_or_else(bad)?;
        let inner = s
            .strip_prefix(delim)
            .and_then(|r| r.strip_suffix(delim))
            .ok_or_else(bad)?;
        let v: Vec<u32> = inner
            .split(delim)
            .map(|f| f.parse::<u32>().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        match v[..] {
            [inside, outside, count] if count > 0 => Ok(IdRange {
                inside,
                outside,
                count,
            }),
            _ => Err(bad()),
        }
    }
}

/// The id maps of a non-root daemon's user namespace; empty: its own uid/gid only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserNsMaps {
    pub uid: Vec<IdRange>,
    pub gid: Vec<IdRange>,
}

/// The serving process, inside its sandbox.
#[derive(Debug)]
pub struct Inside {
    /// The shared directory as this process now sees it (`/` inside a sandbox).
    pub shared_dir: PathBuf,
    /// `O_PATH` descriptor of this process's `/proc/self/fd`.
    pub proc_self_fd: OwnedFd,
    /// Whether this process still sees the host's file system (only with `none`): it may
    /// then remove its socket file on exit.
    pub sees_host: bool,
}

/// What [`enter`] made of the calling process.
#[derive(Debug)]
pub enum Entered {
    /// Serve the frontend.
    Serving(Inside),
    /// The parent of a namespace sandbox: [`Supervisor::wait`] for the child.
    Supervisor(Supervisor),
}

fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn check(ret: libc::c_int, what: &str) -> io::Result<()> {
    if ret < 0 {
        Err(os_err(what))
    } else {
        Ok(())
    }
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

fn open_proc_self_fd() -> io::Result<OwnedFd> {
    sys::open(c"/proc/self/fd", libc::O_PATH | libc::O_DIRECTORY, 0)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open /proc/self/fd: {e}")))
}

/// Threads of this process, from `/proc/self/status`.
fn thread_count() -> io::Result<usize> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::other("no Threads: line in /proc/self/status"))
}

/// `--sandbox`: how the serving process is confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Sandbox {
    /// Fork a child in new pid, mount, net, ipc and uts namespaces (and a user namespace when
    /// not root) whose root is the shared directory (pivot_root); the parent forwards signals
    /// and exits with the child's status.
    Namespace,
    /// chroot into the shared directory (root only).
    Chroot,
    /// No sandbox.
    None,
}

/// Enters the sandbox `mode` around `shared_dir`. Call it single-threaded (namespace mode
/// forks), after creating the listening socket and before opening anything in the share.
pub fn enter(mode: Sandbox, shared_dir: &Path, maps: &UserNsMaps) -> io::Result<Entered> {
    match mode {
        Sandbox::None => Ok(Entered::Serving(Inside {
            shared_dir: shared_dir.to_path_buf(),
            proc_self_fd: open_proc_self_fd()?,
            sees_host: true,
        })),
        Sandbox::Chroot => enter_chroot(shared_dir).map(Entered::Serving),
        Sandbox::Namespace => enter_namespace(shared_dir, maps),
    }
}

fn enter_chroot(shared_dir: &Path) -> io::Result<Inside> {
    if sys::geteuid() != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "--sandbox chroot needs root; use --sandbox namespace or --sandbox none",
        ));
    }
    let proc_self_fd = open_proc_self_fd()?;
    let dir = cstr(shared_dir)?;
    // SAFETY: `dir` is NUL-terminated; chdir/chroot only read it.
    let ret = unsafe { libc::chdir(dir.as_ptr()) };
    check(ret, "chdir to the shared directory")?;
    // SAFETY: "." is a NUL-terminated literal.
    let ret = unsafe { libc::chroot(c".".as_ptr()) };
    check(ret, "chroot into the shared directory")?;
    // SAFETY: as above.
    let ret = unsafe { libc::chdir(c"/".as_ptr()) };
    check(ret, "chdir to the new root")?;
    Ok(Inside {
        shared_dir: PathBuf::from("/"),
        proc_self_fd,
        sees_host: false,
    })
}

/// Signals the supervisor forwards to the sandboxed child, which exits on them.
const FORWARDED: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// A signal set holding `sigs`.
pub fn sigset(sigs: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the zeroed set; sigaddset takes valid signal numbers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in sigs {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Writes `content` to a `/proc/self` file (user namespace maps).
fn write_proc(path: &str, content: &str) -> io::Result<()> {
    std::fs::write(path, content)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot write {path}: {e}")))
}

/// For a non-root daemon: a user namespace in which it keeps its own uid and gid (and holds
/// the capabilities the namespace setup needs, over that namespace only).
fn enter_user_namespace(maps: &UserNsMaps) -> io::Result<()> {
    if !maps.uid.is_empty() || !maps.gid.is_empty() {
        return enter_mapped_user_namespace(maps);
    }
    let (uid, gid) = (sys::geteuid(), sys::getegid());
    // SAFETY: unshare with a flag; the process is single-threaded (checked by the caller).
    let ret = unsafe { libc::unshare(libc::CLONE_NEWUSER) };
    if ret < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!(
                "--sandbox namespace as uid {uid}: cannot create a user namespace ({e}); \
                 run as root or use --sandbox none"
            ),
        ));
    }
    write_proc("/proc/self/setgroups", "deny")?;
    write_proc("/proc/self/uid_map", &format!("{uid} {uid} 1\n"))?;
    write_proc("/proc/self/gid_map", &format!("{gid} {gid} 1\n"))?;
    Ok(())
}

/// Runs `tool` (newuidmap or newgidmap) on process `pid` with `ranges`; its own error
/// message goes to our stderr.
fn run_map_tool(tool: &str, pid: libc::pid_t, ranges: &[IdRange]) -> bool {
    let mut cmd = std::process::Command::new(tool);
    cmd.arg(pid.to_string());
    for r in ranges {
        cmd.args([r.inside, r.outside, r.count].map(|v| v.to_string()));
    }
    match cmd.stdin(std::process::Stdio::null()).status() {
        Ok(st) if st.success() => true,
        Ok(st) => {
            eprintln!("daxfsd: {tool} {pid} ... failed ({st})");
            false
        }
        Err(e) => {
            eprintln!("daxfsd: cannot run {tool}: {e} (install the uidmap package)");
            false
        }
    }
}

/// The user namespace with `--uid-map`/`--gid-map`: a helper forked first (still outside,
/// with our ids) waits until we have unshared, then maps our namespace; a side without a
/// map gets our own id, written directly as in [`enter_user_namespace`].
fn enter_mapped_user_namespace(maps: &UserNsMaps) -> io::Result<()> {
    let (uid, gid) = (sys::geteuid(), sys::getegid());
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let mut fds = [0; 2];
    // SAFETY: `fds` is a writable array of two ints.
    let ret = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    check(ret, "pipe2")?;
    // SAFETY: pipe2 succeeded: both descriptors are new and owned by nobody else.
    let (go_r, go_w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the caller checked that the process is single-threaded, so the child is a
    // complete copy and may allocate and run commands.
    let helper = unsafe { libc::fork() };
    if helper < 0 {
        return Err(os_err("fork"));
    }
    if helper == 0 {
        drop(go_w);
        let mut b = [0u8; 1];
        // SAFETY: `b` is a writable one-byte buffer.
        let n = unsafe { libc::read(go_r.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
        let ok = n == 1
            && if maps.uid.is_empty() {
                std::fs::write(format!("/proc/{me}/uid_map"), format!("{uid} {uid} 1\n")).is_ok()
            } else {
                run_map_tool("newuidmap", me, &maps.uid)
            }
            && if maps.gid.is_empty() {
                std::fs::write(format!("/proc/{me}/setgroups"), "deny").is_ok()
                    && std::fs::write(format!("/proc/{me}/gid_map"), format!("{gid} {gid} 1\n"))
                        .is_ok()
            } else {
                run_map_tool("newgidmap", me, &maps.gid)
            };
        // SAFETY: _exit has no preconditions; the helper must not run the parent's exit path.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    drop(go_r);
    // SAFETY: unshare with a flag; the process is single-threaded (the helper is a process).
    let ret = unsafe { libc::unshare(libc::CLONE_NEWUSER) };
    let unshared = if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    };
    if unshared.is_ok() {
        // SAFETY: writes one byte from a valid buffer.
        unsafe { libc::write(go_w.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
    }
    drop(go_w);
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is writable.
    let waited = unsafe { libc::waitpid(helper, &mut status, 0) };
    if let Err(e) = unshared {
        return Err(io::Error::new(
            e.kind(),
            format!("--uid-map/--gid-map as uid {uid}: cannot create a user namespace ({e})"),
        ));
    }
    if waited != helper || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(io::Error::other(format!(
            "--uid-map/--gid-map: newuidmap/newgidmap could not map the user namespace (see above): /etc/subuid and /etc/subgid must grant these ranges to uid {uid} / gid {gid}, and the uidmap package must be installed"
        )));
    }
    Ok(())
}

fn enter_namespace(shared_dir: &Path, maps: &UserNsMaps) -> io::Result<Entered> {
    let threads = thread_count()?;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "--sandbox namespace must start single-threaded ({threads} threads)"
        )));
    }
    let shared = std::fs::canonicalize(shared_dir).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("--shared-dir {}: {e}", shared_dir.display()),
        )
    })?;
    if sys::geteuid() != 0 {
        enter_user_namespace(maps)?;
    }
    // The child checks this pipe to learn whether the parent died before PDEATHSIG was set.
    let mut fds = [0; 2];
    // SAFETY: `fds` is a writable array of two ints.
    let ret = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    check(ret, "pipe2")?;
    // SAFETY: pipe2 succeeded: both descriptors are new and owned by nobody else.
    let (alive_r, alive_w) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };

    // Block the forwarded signals and SIGCHLD before the fork: the supervisor takes them with
    // sigwaitinfo, and the child unblocks them once it has handlers.
    let mut block = FORWARDED.to_vec();
    block.extend([libc::SIGUSR1, libc::SIGCHLD]);
    let blocked = sigset(&block);
    let mut old_mask = sigset(&[]);
    // SAFETY: both sets are valid; this changes only the calling thread's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &blocked, &mut old_mask) };

    // SAFETY: unshare with a flag; affects only children created from now on.
    let ret = unsafe { libc::unshare(libc::CLONE_NEWPID) };
    check(ret, "cannot create a pid namespace (unshare CLONE_NEWPID)")?;
    // SAFETY: the process is single-threaded (checked above), so the child is a complete copy.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(os_err("fork"));
    }
    if pid > 0 {
        drop(alive_r);
        return Ok(Entered::Supervisor(Supervisor {
            child: pid,
            _alive: alive_w,
            forwarded: None,
        }));
    }
    // The child: pid 1 of the new pid namespace.
    drop(alive_w);
    // SAFETY: prctl with integer arguments.
    let ret = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    check(ret, "prctl(PR_SET_PDEATHSIG)")?;
    let mut pfd = libc::pollfd {
        fd: alive_r.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is one valid pollfd.
    if unsafe { libc::poll(&mut pfd, 1, 0) } != 0 {
        // The write end closed: the parent is gone already.
        // SAFETY: _exit has no preconditions.
        unsafe { libc::_exit(1) };
    }
    drop(alive_r);
    install_child_signal_handlers()?;
    // Back to the mask saved before the fork, except that SIGTERM, SIGINT and SIGHUP stay
    // blocked: the daemon takes them with sigwait and exits cleanly (a forwarded SIGTERM
    // arriving before that stays pending instead of ending the child at once).
    let mut mask = old_mask;
    for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: `mask` is an initialised signal set and `s` a valid signal.
        unsafe { libc::sigaddset(&mut mask, s) };
    }
    // SAFETY: `mask` is a valid signal set.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut()) };

    let proc_self_fd = setup_child_mounts(&shared)?;
    Ok(Entered::Serving(Inside {
        shared_dir: PathBuf::from("/"),
        proc_self_fd,
        sees_host: false,
    }))
}

/// As pid 1 of its namespace the child ignores every signal it has no handler for, even
/// from the supervisor. SIGTERM, SIGINT and SIGHUP stay blocked and are taken by the
/// daemon's stop thread (`daemon::run`: clean exit, status 0); these handlers are the
/// fallback for a thread that does not block them, and make SIGQUIT end the child as it
/// would end an ordinary process; SIGUSR1 reaches the DAX statistics reporter (which blocks
/// it and takes it with sigwait).
fn install_child_signal_handlers() -> io::Result<()> {
    extern "C" fn on_exit_signal(sig: libc::c_int) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(128 + sig) };
    }
    extern "C" fn on_usr1(_: libc::c_int) {}
    let handlers = FORWARDED
        .iter()
        .map(|&s| (s, on_exit_signal as extern "C" fn(libc::c_int)))
        .chain([(libc::SIGUSR1, on_usr1 as extern "C" fn(libc::c_int))]);
    for (sig, handler) in handlers {
        // SAFETY: `sa` is zero-initialised and then filled in; the handlers are
        // async-signal-safe.
        let ret = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        check(ret, "sigaction")?;
    }
    Ok(())
}

/// In the child's new mount namespace: make the share the root. Returns the `/proc/self/fd`
/// descriptor of the fresh procfs.
fn setup_child_mounts(shared: &Path) -> io::Result<OwnedFd> {
    let flags = libc::CLONE_NEWNS | libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
    // SAFETY: unshare with flags.
    let ret = unsafe { libc::unshare(flags) };
    check(ret, "cannot create mount, network, IPC and UTS namespaces")?;
    let null = std::ptr::null::<libc::c_char>();
    // SAFETY: NULL source/type/data are allowed for a propagation change; "/" is a literal.
    let ret = unsafe {
        libc::mount(
            null,
            c"/".as_ptr(),
            null,
            libc::MS_SLAVE | libc::MS_REC,
            std::ptr::null(),
        )
    };
    check(ret, "cannot make mounts slaves (mount / MS_SLAVE|MS_REC)")?;
    // SAFETY: literal, NUL-terminated strings; no data argument.
    let ret = unsafe {
        libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_NOSUID | libc::MS_RELATIME,
            std::ptr::null(),
        )
    };
    check(
        ret,
        "cannot mount a procfs for the new pid namespace on /proc",
    )?;
    let proc_self_fd = open_proc_self_fd()?;
    let dir = cstr(shared)?;
    // SAFETY: `dir` is NUL-terminated; no type or data argument for a bind mount.
    let ret = unsafe {
        libc::mount(
            dir.as_ptr(),
            dir.as_ptr(),
            null,
            libc::MS_BIND | libc::MS_REC,
            std::ptr::null(),
        )
    };
    check(ret, "cannot bind-mount the shared directory onto itself")?;
    // SAFETY: `dir` is NUL-terminated (the path now resolves to the new bind mount).
    let ret = unsafe { libc::chdir(dir.as_ptr()) };
    check(ret, "chdir to the shared directory")?;
    // pivot_root(".", "."): the share becomes the root and the old root is stacked on top of
    // it, where umount2(".", MNT_DETACH) takes it away.
    // SAFETY: raw system call with two NUL-terminated literals.
    let ret = unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) };
    if ret < 0 {
        return Err(os_err("pivot_root into the shared directory"));
    }
    // SAFETY: NUL-terminated literal.
    let ret = unsafe { libc::umount2(c".".as_ptr(), libc::MNT_DETACH) };
    check(ret, "cannot detach the old root")?;
    // SAFETY: NUL-terminated literal.
    let ret = unsafe { libc::chdir(c"/".as_ptr()) };
    check(ret, "chdir to the new root")?;
    Ok(proc_self_fd)
}

/// The parent of a namespace sandbox.
#[derive(Debug)]
pub struct Supervisor {
    child: libc::pid_t,
    /// Write end of the liveness pipe: closes when this process dies.
    _alive: OwnedFd,
    /// The last signal forwarded to the child.
    forwarded: Option<libc::c_int>,
}

/// How the sandboxed child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildExit {
    Code(i32),
    Signal(libc::c_int),
}

impl Supervisor {
    /// The child's pid (in the supervisor's pid namespace).
    pub fn child(&self) -> libc::pid_t {
        self.child
    }

    /// Forwards signals to the child until it exits; returns how it ended.
    pub fn wait(&mut self) -> io::Result<ChildExit> {
        let mut sigs = FORWARDED.to_vec();
        sigs.extend([libc::SIGUSR1, libc::SIGCHLD]);
        let set = sigset(&sigs);
        loop {
            // SAFETY: `set` is a valid signal set; no siginfo wanted.
            let sig = unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) };
            if sig < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if sig != libc::SIGCHLD {
                // SAFETY: kill with our own child's pid and a valid signal.
                unsafe { libc::kill(self.child, sig) };
                if sig != libc::SIGUSR1 {
                    self.forwarded = Some(sig);
                }
                continue;
            }
            let mut status = 0;
            // SAFETY: `status` is a valid output location.
            let r = unsafe { libc::waitpid(self.child, &mut status, libc::WNOHANG) };
            if r < 0 {
                return Err(os_err("waitpid"));
            }
            if r == self.child {
                if libc::WIFSIGNALED(status) {
                    return Ok(ChildExit::Signal(libc::WTERMSIG(status)));
                }
                if libc::WIFEXITED(status) {
                    let code = libc::WEXITSTATUS(status);
                    // The child's handler turns a forwarded signal into exit(128 + sig).
                    return Ok(match self.forwarded {
                        Some(s) if code == 128 + s => ChildExit::Signal(s),
                        _ => ChildExit::Code(code),
                    });
                }
            }
        }
    }
}

impl ChildExit {
    /// Ends this process the way the child ended: the same exit code, or death by the same
    /// signal (without a core dump).
    pub fn exit_process(self) -> ! {
        match self {
            ChildExit::Code(c) => std::process::exit(c),
            ChildExit::Signal(sig) => {
                let no_core = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                // SAFETY: plain calls on valid arguments: no core file, default action for
                // `sig`, then unblock and raise it.
                unsafe {
                    libc::setrlimit(libc::RLIMIT_CORE, &no_core);
                    libc::signal(sig, libc::SIG_DFL);
                    let set = sigset(&[sig]);
                    libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                    libc::raise(sig);
                }
                std::process::exit(128 + sig)
            }
        }
    }
}
