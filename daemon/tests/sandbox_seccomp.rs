//! The seccomp filter daxfsd builds, installed in a forked child: calls on the allow-list
//! pass, anything else kills (kill), runs and is logged (log) or raises SIGSYS (trap).
//!
//! The filter is built before the fork; the child only installs it (no allocation) and makes
//! raw system calls, then `_exit`s with a code the parent checks. The forbidden calls are
//! harmless if the filter failed to stop them: `reboot` with invalid magic numbers fails with
//! EINVAL before doing anything, `socket` makes a socket the child never uses.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use daxfsd::seccomp::{self, Action, Filters};

/// A system call made by the child.
type RawCall = fn() -> libc::c_long;

/// `reboot(2)` with magic numbers the kernel rejects (EINVAL) before checking anything else.
fn bad_reboot() -> libc::c_long {
    // SAFETY: invalid magic: the call fails with EINVAL, or is stopped by the filter.
    unsafe { libc::syscall(libc::SYS_reboot, 0, 0, 0, 0) }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a writable array of two ints.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are new and owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Writes `v` to the pipe (async-signal-safe).
fn report(fd: i32, v: i32) {
    let b = v.to_ne_bytes();
    // SAFETY: `b` is a valid 4-byte buffer.
    unsafe { libc::write(fd, b.as_ptr().cast(), 4) };
}

/// Everything the child reported, as i32s.
fn reports(fd: &OwnedFd) -> Vec<i32> {
    let mut out = Vec::new();
    let mut b = [0u8; 4];
    // SAFETY: `b` is a valid, writable 4-byte buffer; the write end is closed, so read ends.
    while unsafe { libc::read(fd.as_raw_fd(), b.as_mut_ptr().cast(), 4) } == 4 {
        out.push(i32::from_ne_bytes(b));
    }
    out
}

enum Ended {
    Exited(i32),
    Signaled(i32),
}

/// Forks; the child runs `body(write_fd)` and exits with its return value. Returns how the
/// child ended and what it reported.
fn in_child(body: impl FnOnce(i32) -> i32) -> (Ended, Vec<i32>, libc::pid_t) {
    let (r, w) = pipe();
    // SAFETY: the child only makes async-signal-safe calls (raw system calls, no allocation)
    // and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = body(w.as_raw_fd());
        // SAFETY: _exit has no preconditions.
        unsafe { libc::_exit(code) };
    }
    drop(w);
    let got = reports(&r);
    let mut status = 0;
    // SAFETY: `status` is a valid output location; `pid` is our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    let ended = if libc::WIFSIGNALED(status) {
        Ended::Signaled(libc::WTERMSIG(status))
    } else {
        Ended::Exited(libc::WEXITSTATUS(status))
    };
    (ended, got, pid)
}

fn build(action: Action) -> Filters {
    seccomp::build(action).expect("build the filter")
}

/// A child that installs `f`, proves that allowed calls work, then makes `forbidden`.
fn run_forbidden(f: &Filters, forbidden: RawCall) -> (Ended, Vec<i32>) {
    let (ended, got, _) = in_child(|w| {
        if f.install_this_thread().is_err() {
            return 90;
        }
        report(w, 1); // write: allowed
                      // SAFETY: getpid has no preconditions.
        if unsafe { libc::getpid() } <= 0 {
            return 91;
        }
        let r = forbidden();
        report(w, 2);
        report(w, if r < 0 { errno() } else { 0 });
        0
    });
    (ended, got)
}

#[test]
fn kill_stops_the_process_on_a_call_outside_the_list() {
    let f = build(Action::Kill);
    assert!(f.len() > seccomp::ALLOWED.len(), "{} instructions", f.len());
    let socket_inet = || {
        // SAFETY: plain system call; the descriptor would be leaked by an exiting child.
        unsafe { libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0) }
    };
    let ptrace_peek = || {
        // SAFETY: PTRACE_PEEKDATA on a process we do not trace: fails with ESRCH if run.
        unsafe { libc::syscall(libc::SYS_ptrace, libc::PTRACE_PEEKDATA, 1, 0, 0) }
    };
    let new_netns = || {
        // SAFETY: unshare of the child's own network namespace: harmless if run.
        unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWNET) }
    };
    let set_dumpable = || {
        // SAFETY: prctl with integer arguments, on the child itself.
        unsafe { libc::syscall(libc::SYS_prctl, libc::PR_SET_DUMPABLE, 1, 0, 0, 0) }
    };
    let forbidden: [(&str, RawCall); 5] = [
        ("reboot", bad_reboot),
        ("socket(AF_INET)", socket_inet),
        ("ptrace", ptrace_peek),
        ("unshare(CLONE_NEWNET)", new_netns),
        ("prctl(PR_SET_DUMPABLE)", set_dumpable),
    ];
    for (name, call) in forbidden {
        let (ended, got) = run_forbidden(&f, call);
        match ended {
            Ended::Signaled(s) => assert_eq!(s, libc::SIGSYS, "{name}: killed by signal {s}"),
            Ended::Exited(c) => panic!("{name}: the child exited {c} (reports {got:?})"),
        }
        assert_eq!(
            got,
            [1],
            "{name}: allowed calls ran, the forbidden one did not return"
        );
    }
}

#[test]
fn allowed_calls_pass_under_kill() {
    let f = build(Action::Kill);
    let (ended, got, _) = in_child(|w| {
        if f.install_this_thread().is_err() {
            return 90;
        }
        // Files: open /proc/self/fd (O_PATH), statx, fchdir there, unshare(CLONE_FS).
        // SAFETY: NUL-terminated literals; results checked.
        let fd = unsafe {
            libc::openat(
                libc::AT_FDCWD,
                c"/proc/self/fd".as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return 91;
        }
        // SAFETY: plain system call with an integer flag.
        if unsafe { libc::unshare(libc::CLONE_FS) } != 0 {
            return 92;
        }
        // SAFETY: `fd` is a directory descriptor.
        if unsafe { libc::fchdir(fd) } != 0 {
            return 93;
        }
        // SAFETY: a zeroed statx is a valid output buffer; the path is NUL-terminated.
        let ok = unsafe {
            let mut st: libc::statx = std::mem::zeroed();
            libc::statx(fd, c"".as_ptr(), libc::AT_EMPTY_PATH, 0, &mut st)
        };
        if ok != 0 {
            return 94;
        }
        // A memfd with ftruncate, pwrite and pread (DAX shadow tails).
        // SAFETY: NUL-terminated name; the buffers are valid for their lengths.
        let ok = unsafe {
            let m = libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC);
            let mut b = [0u8; 3];
            m >= 0
                && libc::ftruncate(m, 4096) == 0
                && libc::pwrite(m, b"abc".as_ptr().cast(), 3, 10) == 3
                && libc::pread(m, b.as_mut_ptr().cast(), 3, 10) == 3
                && &b == b"abc"
                && libc::close(m) == 0
        };
        if !ok {
            return 95;
        }
        // clone3 is turned into ENOSYS (glibc falls back to clone).
        // SAFETY: NULL arguments: EFAULT/EINVAL if it ran, ENOSYS from the filter.
        let r = unsafe { libc::syscall(libc::SYS_clone3, 0, 0) };
        report(w, if r < 0 { errno() } else { -1 });
        // A thread through pthread_create (clone with CLONE_THREAD).
        extern "C" fn thread_main(_: *mut libc::c_void) -> *mut libc::c_void {
            std::ptr::null_mut()
        }
        // SAFETY: a zeroed pthread_t is a valid output location; the start routine takes and
        // returns nothing.
        let ok = unsafe {
            let mut t: libc::pthread_t = std::mem::zeroed();
            libc::pthread_create(&mut t, std::ptr::null(), thread_main, std::ptr::null_mut()) == 0
                && libc::pthread_join(t, std::ptr::null_mut()) == 0
        };
        if !ok {
            return 96;
        }
        // Per-thread credentials, as the passthrough filesystem switches them.
        // SAFETY: -1 keeps every id: no change, but the calls run.
        let ok = unsafe {
            libc::syscall(libc::SYS_setresgid, -1, -1, -1) == 0
                && libc::syscall(libc::SYS_setresuid, -1, -1, -1) == 0
        };
        if !ok {
            return 97;
        }
        report(w, 7);
        0
    });
    match ended {
        Ended::Exited(0) => {}
        Ended::Exited(c) => panic!("an allowed call failed: step {c} (reports {got:?})"),
        Ended::Signaled(s) => panic!("an allowed call was stopped: signal {s} ({got:?})"),
    }
    assert_eq!(got, [libc::ENOSYS, 7], "clone3 must fail with ENOSYS");
}

#[test]
fn tsync_covers_threads_that_already_exist() {
    let f = build(Action::Kill);
    let (ended, got, _) = in_child(|w| {
        // A thread started before the filter, waiting on a pipe.
        let (r, go) = pipe();
        extern "C" fn waiter(arg: *mut libc::c_void) -> *mut libc::c_void {
            let fd = arg as usize as i32;
            let mut b = [0u8; 1];
            // SAFETY: `b` is a valid buffer; `fd` is the read end of a pipe.
            unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
            bad_reboot();
            std::ptr::null_mut()
        }
        // SAFETY: a zeroed pthread_t is a valid output location; the argument is a plain fd.
        let started = unsafe {
            let mut t: libc::pthread_t = std::mem::zeroed();
            libc::pthread_create(
                &mut t,
                std::ptr::null(),
                waiter,
                r.as_raw_fd() as usize as *mut libc::c_void,
            ) == 0
        };
        if !started {
            return 80;
        }
        if f.install_all_threads().is_err() {
            return 81;
        }
        report(w, 1);
        // SAFETY: one byte from a valid buffer; the thread then makes the forbidden call.
        unsafe { libc::write(go.as_raw_fd(), b"x".as_ptr().cast(), 1) };
        // SAFETY: plain sleep; the process is killed meanwhile.
        unsafe { libc::sleep(10) };
        report(w, 2);
        0
    });
    match ended {
        Ended::Signaled(s) => assert_eq!(s, libc::SIGSYS),
        Ended::Exited(c) => panic!("the process survived a forbidden call in another thread: {c}"),
    }
    assert_eq!(got, [1]);
}

#[test]
fn trap_raises_sigsys_naming_the_call() {
    let f = build(Action::Trap);
    static FD: AtomicI32 = AtomicI32::new(-1);
    let (ended, got, _) = in_child(|w| {
        extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
            // SAFETY: SA_SIGINFO handler: `info` is valid; for SIGSYS the call number is the
            // int at byte 24 of siginfo on 64-bit Linux (after the call address).
            let nr = unsafe { *(info.cast::<u8>().add(24).cast::<libc::c_int>()) };
            report(FD.load(Ordering::Relaxed), nr);
            // SAFETY: _exit is async-signal-safe.
            unsafe { libc::_exit(42) };
        }
        FD.store(w, Ordering::Relaxed);
        // SAFETY: single-threaded child; the handler is async-signal-safe.
        let ok = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigsys as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) == 0
        };
        if !ok || f.install_this_thread().is_err() {
            return 90;
        }
        bad_reboot();
        report(w, -1);
        0
    });
    match ended {
        Ended::Exited(42) => {}
        Ended::Exited(c) => panic!("no SIGSYS: exited {c} ({got:?})"),
        Ended::Signaled(s) => panic!("killed by {s}, not trapped"),
    }
    assert_eq!(got, [libc::SYS_reboot as i32]);
}

#[test]
fn trap_without_handler_dies_of_sigsys() {
    let f = build(Action::Trap);
    let (ended, got) = run_forbidden(&f, bad_reboot);
    match ended {
        Ended::Signaled(s) => assert_eq!(s, libc::SIGSYS),
        Ended::Exited(c) => panic!("exited {c} ({got:?})"),
    }
    assert_eq!(got, [1]);
}

/// The kernel log records since `from` (a /dev/kmsg reader positioned at the end earlier).
fn kmsg_reader() -> std::fs::File {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .unwrap_or_else(|e| {
            panic!("--seccomp log writes to the kernel log; this test reads /dev/kmsg: {e}")
        });
    f.seek(SeekFrom::End(0)).expect("seek /dev/kmsg");
    f
}

fn kmsg_records(f: &mut std::fs::File) -> Vec<String> {
    use std::io::Read;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8192];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            // EPIPE: records were overwritten; carry on from the next one.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    out
}

#[test]
fn log_lets_the_call_run_and_the_kernel_logs_it() {
    let actions = std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_logged")
        .expect("read /proc/sys/kernel/seccomp/actions_logged");
    assert!(
        actions.split_whitespace().any(|a| a == "log"),
        "the kernel does not log SECCOMP_RET_LOG (actions_logged: {actions:?})"
    );
    let f = build(Action::Log);
    // Audit records are rate-limited kernel-wide; retry past a suppression window.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut kmsg = kmsg_reader();
        let (ended, got, pid) = in_child(|w| {
            if f.install_this_thread().is_err() {
                return 90;
            }
            report(w, 1);
            let r = bad_reboot();
            report(w, 2);
            report(w, if r < 0 { errno() } else { 0 });
            0
        });
        match ended {
            Ended::Exited(0) => {}
            Ended::Exited(c) => panic!("exited {c} ({got:?})"),
            Ended::Signaled(s) => panic!("killed by {s}: log must not stop the call"),
        }
        // The call ran: the kernel answered EINVAL for the bad magic.
        assert_eq!(got, [1, 2, libc::EINVAL]);
        std::thread::sleep(Duration::from_millis(100));
        let want_pid = format!(" pid={pid} ");
        let want_nr = format!(" syscall={} ", libc::SYS_reboot);
        let logged = kmsg_records(&mut kmsg)
            .iter()
            .any(|r| r.contains("type=1326") && r.contains(&want_pid) && r.contains(&want_nr));
        if logged {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no audit record (type=1326, pid={pid}, syscall={}) in /dev/kmsg",
            libc::SYS_reboot
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

#[test]
fn the_daemons_trap_handler_names_the_call_on_stderr() {
    let f = build(Action::Trap);
    let (r, w) = pipe();
    // SAFETY: the child makes raw system calls only (dup2, sigaction inside the reporter,
    // seccomp) and leaves through the handler's _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: stderr becomes the pipe's write end.
        unsafe { libc::dup2(w.as_raw_fd(), 2) };
        if seccomp::install_sigsys_reporter().is_err() || f.install_this_thread().is_err() {
            // SAFETY: _exit has no preconditions.
            unsafe { libc::_exit(90) };
        }
        bad_reboot();
        // SAFETY: as above.
        unsafe { libc::_exit(0) };
    }
    drop(w);
    let mut status = 0;
    // SAFETY: `status` is a valid output location; `pid` is our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    let mut msg = Vec::new();
    let mut b = [0u8; 256];
    loop {
        // SAFETY: `b` is a valid, writable buffer.
        let n = unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) };
        if n <= 0 {
            break;
        }
        msg.extend_from_slice(&b[..n as usize]);
    }
    let msg = String::from_utf8_lossy(&msg);
    assert!(libc::WIFEXITED(status), "status {status:#x}");
    assert_eq!(libc::WEXITSTATUS(status), 128 + libc::SIGSYS, "{msg}");
    assert!(
        msg.contains(&format!(
            "system call {} not in the allow-list",
            libc::SYS_reboot
        )),
        "{msg:?}"
    );
}
