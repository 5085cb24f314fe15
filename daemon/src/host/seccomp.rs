//! `--seccomp`: a system call allow-list for the serving daemon, compiled to BPF with
//! `seccompiler` (pure Rust, no libseccomp).
//!
//! [`install`] runs once start-up is over (sandbox entered, capabilities dropped, the
//! filesystem and the vhost-user machinery built) and before the frontend is accepted, and
//! applies to every thread of the process (`SECCOMP_FILTER_FLAG_TSYNC`); threads created later
//! inherit it. A call outside the list:
//! - `kill`: the kernel kills the whole process (`SECCOMP_RET_KILL_PROCESS`, SIGSYS; the
//!   kernel log names the call);
//! - `log`: the call runs, and the kernel logs it (`SECCOMP_RET_LOG`): to find a missing
//!   entry, run with `--seccomp log` and read `dmesg` (`type=1326 ... syscall=NR`);
//! - `trap`: the thread gets SIGSYS (`SECCOMP_RET_TRAP`); the daemon's handler writes the
//!   call's number to stderr and exits with status 159 (128 + SIGSYS).
//!
//! The list ([`ALLOWED`]) was found by running the protocol suites (every FUSE opcode, DAX
//! mappings with shadow tails, several queues, device resets, disconnects) against a daemon
//! under `strace -f` and `--seccomp log`, then checked against the calls the code makes on
//! paths the suites do not reach (locks, fallocate, copy_file_range, syncfs, the per-thread
//! credential switch, abort). Arguments are checked where that closes a door at no cost:
//! `clone` only creates threads (no namespace flags), `unshare` only takes `CLONE_FS`,
//! `prctl` only names threads; nothing creates sockets, mounts, traces or executes. `clone3`
//! fails with `ENOSYS` (its flags sit behind a pointer, which BPF cannot read), so glibc
//! falls back to `clone`: a second filter returns that errno, which takes precedence over the
//! first filter's "allow" (the kernel applies the strictest answer of all filters).

use std::collections::BTreeMap;
use std::io;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// What happens on a system call outside the allow-list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Kill the process.
    Kill,
    /// Log the call and let it run.
    Log,
    /// Send SIGSYS to the calling thread.
    Trap,
}

impl Action {
    fn seccomp(self) -> SeccompAction {
        match self {
            Action::Kill => SeccompAction::KillProcess,
            Action::Log => SeccompAction::Log,
            Action::Trap => SeccompAction::Trap,
        }
    }
}

/// Every system call the daemon makes once it serves the frontend, by name (for the log
/// and the tests) and number. Calls with argument checks are in [`conditional_rules`].
pub const ALLOWED: &[(&str, libc::c_long)] = &[
    // The vhost-user socket: messages with SCM_RIGHTS (frontend requests, backend requests
    // such as SHMEM_MAP), the accept of the frontend, the final shutdown.
    ("accept4", libc::SYS_accept4),
    ("recvmsg", libc::SYS_recvmsg),
    ("sendmsg", libc::SYS_sendmsg),
    ("shutdown", libc::SYS_shutdown),
    ("getsockopt", libc::SYS_getsockopt),
    // --syslog records on the socket connected at start-up.
    ("sendto", libc::SYS_sendto),
    // Event loops and notifications.
    ("epoll_create1", libc::SYS_epoll_create1),
    ("epoll_ctl", libc::SYS_epoll_ctl),
    #[cfg(target_arch = "x86_64")]
    ("epoll_wait", libc::SYS_epoll_wait),
    // What glibc's epoll_wait uses where the architecture has no epoll_wait (aarch64).
    #[cfg(not(target_arch = "x86_64"))]
    ("epoll_pwait", libc::SYS_epoll_pwait),
    ("eventfd2", libc::SYS_eventfd2),
    // Waiting for the frontend or a stop signal, whichever comes first.
    ("ppoll", libc::SYS_ppoll),
    #[cfg(target_arch = "x86_64")]
    ("poll", libc::SYS_poll),
    // Memory: the allocator, guest memory tables, DAX mappings, thread stacks.
    ("brk", libc::SYS_brk),
    ("mmap", libc::SYS_mmap),
    ("munmap", libc::SYS_munmap),
    ("mremap", libc::SYS_mremap),
    ("mprotect", libc::SYS_mprotect),
    ("madvise", libc::SYS_madvise),
    // DAX shadow tails (the part of a guest mapping past the file's last whole page).
    ("memfd_create", libc::SYS_memfd_create),
    // Threads, signals, time.
    ("futex", libc::SYS_futex),
    // Allowed here so that this filter does not kill it: the second filter turns it into
    // ENOSYS (the stricter action wins), and glibc then creates threads with `clone`.
    ("clone3", libc::SYS_clone3),
    ("set_robust_list", libc::SYS_set_robust_list),
    ("rseq", libc::SYS_rseq),
    ("sigaltstack", libc::SYS_sigaltstack),
    ("rt_sigprocmask", libc::SYS_rt_sigprocmask),
    ("rt_sigaction", libc::SYS_rt_sigaction),
    ("rt_sigreturn", libc::SYS_rt_sigreturn),
    // Calls only signal, resume and error paths make. A timed wait interrupted by a stop
    // (SIGSTOP/SIGCONT, a cgroup freeze, a debugger attach) resumes through restart_syscall:
    // futex with a relative timeout, poll, (clock_)nanosleep (`std::thread::sleep`). Without
    // it the first SIGCONT killed the daemon (issue 21).
    ("restart_syscall", libc::SYS_restart_syscall),
    ("clock_nanosleep", libc::SYS_clock_nanosleep),
    ("nanosleep", libc::SYS_nanosleep),
    // A panic's message and a log line may go out as one vectored write.
    ("writev", libc::SYS_writev),
    ("rt_sigtimedwait", libc::SYS_rt_sigtimedwait),
    ("sched_yield", libc::SYS_sched_yield),
    ("sched_getaffinity", libc::SYS_sched_getaffinity),
    // Normally answered by the vDSO; the system call when the clock source has no vDSO
    // support (some virtual machines).
    ("clock_gettime", libc::SYS_clock_gettime),
    ("getrandom", libc::SYS_getrandom),
    ("getpid", libc::SYS_getpid),
    ("gettid", libc::SYS_gettid),
    ("tgkill", libc::SYS_tgkill),
    ("exit", libc::SYS_exit),
    ("exit_group", libc::SYS_exit_group),
    ("getuid", libc::SYS_getuid),
    ("geteuid", libc::SYS_geteuid),
    ("getgid", libc::SYS_getgid),
    ("getegid", libc::SYS_getegid),
    // Per-thread credentials for creating files as the guest caller.
    ("setresuid", libc::SYS_setresuid),
    ("setresgid", libc::SYS_setresgid),
    // Descriptors and I/O.
    ("close", libc::SYS_close),
    ("fcntl", libc::SYS_fcntl),
    ("read", libc::SYS_read),
    ("write", libc::SYS_write),
    ("pread64", libc::SYS_pread64),
    ("pwrite64", libc::SYS_pwrite64),
    ("preadv", libc::SYS_preadv),
    ("pwritev", libc::SYS_pwritev),
    ("preadv2", libc::SYS_preadv2),
    ("pwritev2", libc::SYS_pwritev2),
    ("lseek", libc::SYS_lseek),
    // The passthrough filesystem.
    ("openat", libc::SYS_openat),
    ("statx", libc::SYS_statx),
    ("newfstatat", libc::SYS_newfstatat),
    ("fstat", libc::SYS_fstat),
    // DAX: inode marks for host changes to mapped files (dax/host_watch.rs).
    ("fanotify_mark", libc::SYS_fanotify_mark),
    ("fstatfs", libc::SYS_fstatfs),
    ("getdents64", libc::SYS_getdents64),
    ("readlinkat", libc::SYS_readlinkat),
    // Live migration (--migration-mode=file-handles, --migration-verify-handles).
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("mkdirat", libc::SYS_mkdirat),
    ("mknodat", libc::SYS_mknodat),
    ("symlinkat", libc::SYS_symlinkat),
    ("linkat", libc::SYS_linkat),
    ("unlinkat", libc::SYS_unlinkat),
    ("renameat2", libc::SYS_renameat2),
    // glibc's renameat2() uses renameat when the flags are 0.
    ("renameat", libc::SYS_renameat),
    ("fchownat", libc::SYS_fchownat),
    ("fchmodat", libc::SYS_fchmodat),
    ("fchmod", libc::SYS_fchmod),
    // The per-thread umask of a create with --posix-acl (after unshare(CLONE_FS)).
    ("umask", libc::SYS_umask),
    ("ftruncate", libc::SYS_ftruncate),
    ("utimensat", libc::SYS_utimensat),
    ("fallocate", libc::SYS_fallocate),
    ("copy_file_range", libc::SYS_copy_file_range),
    // DAX copies (copy slots, the pool, shadows) go file -> pipe -> memfd (dax/memfd.rs).
    ("pipe2", libc::SYS_pipe2),
    ("splice", libc::SYS_splice),
    ("fsync", libc::SYS_fsync),
    ("fdatasync", libc::SYS_fdatasync),
    ("syncfs", libc::SYS_syncfs),
    ("flock", libc::SYS_flock),
    ("fchdir", libc::SYS_fchdir),
    ("setxattr", libc::SYS_setxattr),
    ("getxattr", libc::SYS_getxattr),
    ("listxattr", libc::SYS_listxattr),
    ("removexattr", libc::SYS_removexattr),
];

/// Added to [`ALLOWED`] when a host mount serves FUSE-over-io-uring (`--io-uring`): the ring
/// calls, and pinning each queue thread next to its CPU.
pub const IO_URING: &[(&str, libc::c_long)] = &[
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("sched_setaffinity", libc::SYS_sched_setaffinity),
];

/// `clone` flags that would leave the process's namespaces.
const CLONE_NAMESPACES: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, seccompiler::BackendError> {
    SeccompRule::new(conds)
}

/// Calls allowed only with some arguments.
fn conditional_rules() -> Result<Vec<(libc::c_long, Vec<SeccompRule>)>, seccompiler::BackendError> {
    use SeccompCmpArgLen::Qword;
    Ok(vec![
        // Threads only: CLONE_THREAD set, no namespace flag.
        (
            libc::SYS_clone,
            vec![rule(vec![SeccompCondition::new(
                0,
                Qword,
                SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64 | CLONE_NAMESPACES),
                libc::CLONE_THREAD as u64,
            )?])?],
        ),
        // A thread's own working directory (path-based xattr calls), nothing else.
        (
            libc::SYS_unshare,
            vec![rule(vec![SeccompCondition::new(
                0,
                Qword,
                SeccompCmpOp::Eq,
                libc::CLONE_FS as u64,
            )?])?],
        ),
        // FUSE passthrough on a host mount (--mount): registering and dropping backing
        // files on the /dev/fuse connection; the inode-flag ioctls of FUSE_IOCTL
        // (`protocol::ioctl`); no other ioctl.
        (
            libc::SYS_ioctl,
            vec![
                rule(vec![SeccompCondition::new(
                    1,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    crate::protocol::ioctl::FS_IOC_GETFLAGS.into(),
                )?])?,
                rule(vec![SeccompCondition::new(
                    1,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    crate::protocol::ioctl::FS_IOC_SETFLAGS.into(),
                )?])?,
                rule(vec![SeccompCondition::new(
                    1,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    crate::protocol::ioctl::FS_IOC_FSGETXATTR.into(),
                )?])?,
                rule(vec![SeccompCondition::new(
                    1,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    crate::protocol::ioctl::FS_IOC_FSSETXATTR.into(),
                )?])?,
                rule(vec![SeccompCondition::new(
                    1,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    crate::transport::dev_fuse::FUSE_DEV_IOC_BACKING_OPEN.into(),
                )?])?,
                rule(vec![SeccompCondition::new(
                    1,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Eq,
                    crate::transport::dev_fuse::FUSE_DEV_IOC_BACKING_CLOSE.into(),
                )?])?,
            ],
        ),
        // Thread names.
        (
            libc::SYS_prctl,
            vec![rule(vec![SeccompCondition::new(
                0,
                Qword,
                SeccompCmpOp::Eq,
                libc::PR_SET_NAME as u64,
            )?])?],
        ),
    ])
}

/// How many system calls the filter lets through ([`ALLOWED`], plus those allowed only with
/// some arguments).
pub fn allowed_count() -> usize {
    ALLOWED.len() + conditional_rules().map_or(0, |r| r.len())
}

/// The compiled filters.
#[derive(Debug, Clone)]
pub struct Filters {
    /// The allow-list; anything else gets the chosen [`Action`].
    allow: BpfProgram,
    /// `clone3` -> `ENOSYS` (everything else passes this one).
    no_clone3: BpfProgram,
}

fn arch() -> io::Result<TargetArch> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "--seccomp: no filter for {} ({e}); use --seccomp none",
                std::env::consts::ARCH
            ),
        )
    })
}

fn compile_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("cannot build the seccomp filter: {e}"))
}

/// Builds the filters for `action`. Allocates; [`Filters::install_this_thread`] does not, so
/// a forked child can install a filter built before the fork.
pub fn build(action: Action) -> io::Result<Filters> {
    build_with(action, &[])
}

/// [`build`] with `extra` calls allowed too (e.g. [`IO_URING`]).
pub fn build_with(action: Action, extra: &[(&str, libc::c_long)]) -> io::Result<Filters> {
    let arch = arch()?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &(_, nr) in ALLOWED.iter().chain(extra) {
        rules.insert(nr, Vec::new());
    }
    for (nr, r) in conditional_rules().map_err(compile_err)? {
        rules.insert(nr, r);
    }
    let allow: BpfProgram = SeccompFilter::new(rules, action.seccomp(), SeccompAction::Allow, arch)
        .map_err(compile_err)?
        .try_into()
        .map_err(compile_err)?;
    let no_clone3: BpfProgram = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(compile_err)?
    .try_into()
    .map_err(compile_err)?;
    Ok(Filters { allow, no_clone3 })
}

impl Filters {
    /// Installs both filters on every thread of the process (sets `no_new_privs`).
    pub fn install_all_threads(&self) -> io::Result<()> {
        for p in [&self.no_clone3, &self.allow] {
            seccompiler::apply_filter_all_threads(p)
                .map_err(|e| io::Error::other(format!("cannot install the seccomp filter: {e}")))?;
        }
        Ok(())
    }

    /// Installs both filters on the calling thread only. Makes no allocation on success.
    pub fn install_this_thread(&self) -> Result<(), seccompiler::Error> {
        seccompiler::apply_filter(&self.no_clone3)?;
        seccompiler::apply_filter(&self.allow)
    }

    /// Instructions in the allow-list program.
    pub fn len(&self) -> usize {
        self.allow.len()
    }

    /// Never true: a built filter always has instructions.
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty()
    }
}

/// Writes the trapped system call's number to stderr and exits 128 + SIGSYS.
extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // The siginfo layout for SIGSYS (`_sigsys`): call address, then the int system call
    // number, at offset 16 (after si_signo, si_errno, si_code and padding) on 64-bit Linux.
    let nr = if info.is_null() {
        -1
    } else {
        // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler; for SIGSYS
        // from seccomp the union holds `_sigsys { void *call_addr; int syscall; ... }` at
        // offset 16, so the int at byte 24 is the call number.
        unsafe { *(info.cast::<u8>().add(24).cast::<libc::c_int>()) }
    };
    // No allocation in a signal handler: the message is put together on the stack.
    let mut msg = [0u8; 96];
    let mut len = 0;
    let mut put = |bytes: &[u8]| {
        for &b in bytes {
            if len < msg.len() {
                msg[len] = b;
                len += 1;
            }
        }
    };
    put(b"daxfsd: seccomp: system call ");
    if nr < 0 {
        put(b"-");
    }
    let mut digits = [0u8; 10];
    let mut n = nr.unsigned_abs();
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    put(&digits[i..]);
    put(b" not in the allow-list (--seccomp trap)\n");
    // SAFETY: write(2) and _exit(2) are async-signal-safe; `msg` is a valid buffer.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), len);
        libc::_exit(128 + libc::SIGSYS);
    }
}

/// Installs the SIGSYS handler of `--seccomp trap`: it writes the trapped call's number to
/// stderr and exits with status 159 (128 + SIGSYS).
pub fn install_sigsys_reporter() -> io::Result<()> {
    // SAFETY: `sa` is zero-initialised (a valid sigaction), then filled in; the handler is
    // async-signal-safe.
    let ret = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigsys as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut())
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Builds and installs the filter for `action` on every thread (see the module docs).
pub fn install(action: Action) -> io::Result<()> {
    install_with(action, &[])
}

/// [`install`] with `extra` calls allowed too.
pub fn install_with(action: Action, extra: &[(&str, libc::c_long)]) -> io::Result<()> {
    let f = build_with(action, extra)?;
    if action == Action::Trap {
        install_sigsys_reporter()?;
    }
    f.install_all_threads()?;
    log::info!(
        "seccomp: {} system calls allowed, others: {:?} ({} BPF instructions)",
        allowed_count() + extra.len(),
        action,
        f.len()
    );
    Ok(())
}
