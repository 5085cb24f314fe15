//! What launchers see of the daemon's life: the pid file `<socket>.pid` (created and locked
//! before the socket listens: a second daemon on the same path is refused and the live
//! daemon keeps its socket; a dead daemon's files are taken over) and the stop signals.
//!
//! SIGTERM, SIGINT and SIGHUP in every sandbox mode, with a connected, INITed session that
//! wrote a file: daxfsd ends the session through its clean-exit path and exits 0 with the
//! socket and pid file removed. Upstream virtiofsd 1.14 shares the pid-file part; on a
//! signal it `_exit(1)`s (SIGTERM, SIGHUP) or dies of it (SIGINT) and leaves its files:
//! against it, these tests check that instead (so they are known to observe the real thing).

use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use daxfsd::abi::{self, SETUPMAPPING_FLAG_READ as READ, SETUPMAPPING_FLAG_WRITE as WRITE};
use vufs_driver::{DaemonKind, Session};

fn kind() -> DaemonKind {
    DaemonKind::from_env()
}

struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait(&mut self, t: Duration) -> ExitStatus {
        let end = Instant::now() + t;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < end,
                "the daemon did not exit within {t:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: signalling our own child process.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the daemon on `socket` sharing `share`, waiting until the socket exists.
fn spawn(socket: &Path, share: &Path, sandbox: &str, log: &str) -> Proc {
    spawn_with(socket, share, sandbox, log, &[])
}

fn spawn_with(socket: &Path, share: &Path, sandbox: &str, log: &str, args: &[&str]) -> Proc {
    let bin = kind().binary().unwrap_or_else(|e| panic!("{e}"));
    let log = socket.with_file_name(log);
    let f = std::fs::File::create(&log).unwrap();
    let mut cmd = Command::new(bin);
    // The pool as asked on 2-core hosts too (see common::start_with).
    cmd.env("DAXFSD_THREADS", "asked");
    // SAFETY: between fork and exec the closure only calls signal(2) and sigprocmask(2), which
    // are async-signal-safe, on the child's own dispositions and mask.
    unsafe {
        cmd.pre_exec(|| {
            // The stop signals as a service manager delivers them, whatever this test inherited:
            // a shell starts background jobs with SIGINT ignored and `nohup` ignores SIGHUP,
            // and a daemon that keeps the default action of an ignored signal never sees it.
            for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT] {
                libc::signal(sig, libc::SIG_DFL);
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        });
    }
    let child = cmd
        .arg(format!("--socket-path={}", socket.display()))
        .arg(format!("--shared-dir={}", share.display()))
        .arg(format!("--sandbox={sandbox}"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .unwrap();
    let mut p = Proc { child, log };
    let end = Instant::now() + Duration::from_secs(10);
    while !std::fs::metadata(socket).is_ok_and(|m| m.file_type().is_socket()) {
        if let Some(st) = p.child.try_wait().unwrap() {
            panic!("daemon exited early ({st}); log:\n{}", p.log());
        }
        assert!(Instant::now() < end, "no socket; log:\n{}", p.log());
        std::thread::sleep(Duration::from_millis(10));
    }
    p
}

fn pid_file(socket: &Path) -> PathBuf {
    PathBuf::from(format!("{}.pid", socket.display()))
}

fn signal_name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        _ => "SIGHUP",
    }
}

#[test]
fn stop_signals_end_the_session_cleanly_in_every_sandbox() {
    let upstream = kind() == DaemonKind::Virtiofsd;
    for sandbox in ["none", "chroot", "namespace"] {
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            let what = format!("{} --sandbox={sandbox} {}", kind().name(), signal_name(sig));
            let dir = tempfile::tempdir().unwrap();
            let share = dir.path().join("share");
            std::fs::create_dir(&share).unwrap();
            let socket = dir.path().join("fs.sock");
            let mut d = spawn(&socket, &share, sandbox, "daemon.log");
            let pid: u32 = std::fs::read_to_string(pid_file(&socket))
                .unwrap_or_else(|e| panic!("{what}: no pid file: {e}"))
                .trim()
                .parse()
                .unwrap();
            assert_eq!(pid, d.child.id(), "{what}: the pid file names the daemon");
            let s = Session::connect(&socket).unwrap();
            s.init().unwrap();
            let (e, o) = s
                .create(abi::ROOT_ID, "f", libc::O_RDWR as u32, 0o644, 0)
                .unwrap();
            assert_eq!(
                s.write(e.nodeid, o.fh, 0, b"before the signal").unwrap(),
                17
            );
            d.signal(sig);
            let st = d.wait(Duration::from_secs(20));
            assert_eq!(
                std::fs::read(share.join("f")).unwrap(),
                b"before the signal",
                "{what}"
            );
            if upstream {
                // virtiofsd 1.14: _exit(1) from its SIGTERM/SIGHUP handler; SIGINT kills it.
                if sig == libc::SIGINT {
                    assert_eq!(st.signal(), Some(sig), "{what}: {st}");
                } else {
                    assert_eq!(st.code(), Some(1), "{what}: {st}");
                }
                assert!(
                    pid_file(&socket).exists(),
                    "{what}: virtiofsd leaves its pid file"
                );
            } else {
                assert_eq!(st.code(), Some(0), "{what}: {st}; log:\n{}", d.log());
                assert!(!socket.exists(), "{what}: socket left behind");
                assert!(!pid_file(&socket).exists(), "{what}: pid file left behind");
                let log = d.log();
                assert!(
                    log.contains(&format!("{}: session ended cleanly", signal_name(sig))),
                    "{what}: the clean-exit path did not run; log:\n{log}"
                );
            }
            drop(s);
        }
    }
}

#[test]
fn a_signal_before_the_frontend_connects_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let socket = dir.path().join("fs.sock");
    let mut d = spawn(&socket, &share, "none", "daemon.log");
    std::thread::sleep(Duration::from_millis(200));
    d.signal(libc::SIGTERM);
    let st = d.wait(Duration::from_secs(10));
    if kind() == DaemonKind::Virtiofsd {
        assert_eq!(st.code(), Some(1), "{st}");
    } else {
        assert_eq!(st.code(), Some(0), "{st}; log:\n{}", d.log());
        assert!(!socket.exists() && !pid_file(&socket).exists());
    }
}

#[test]
fn a_second_daemon_on_the_same_socket_is_refused_and_a_dead_ones_files_are_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let socket = dir.path().join("fs.sock");
    let mut first = spawn(&socket, &share, "none", "first.log");
    let bin = kind().binary().unwrap();
    let out = Command::new(&bin)
        .arg(format!("--socket-path={}", socket.display()))
        .arg(format!("--shared-dir={}", share.display()))
        .arg("--sandbox=none")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a second daemon started: {err}");
    assert!(err.contains(".pid"), "the error names the pid file: {err}");
    if kind() != DaemonKind::Virtiofsd {
        assert_eq!(
            err.lines().filter(|l| !l.trim().is_empty()).count(),
            1,
            "one line: {err}"
        );
    }
    // The live daemon still has its socket and serves it.
    let s = Session::connect(&socket).unwrap();
    s.init().unwrap();
    drop(s);
    first.wait(Duration::from_secs(10));
    // A daemon killed with SIGKILL leaves both files; the next one takes them over.
    let mut killed = spawn(&socket, &share, "none", "killed.log");
    killed.child.kill().unwrap();
    killed.child.wait().unwrap();
    assert!(socket.exists() && pid_file(&socket).exists());
    let next = spawn(&socket, &share, "none", "next.log");
    // The old socket file is there from the start: wait for the pid file to name the new
    // daemon (it rewrites it before it replaces the socket).
    let end = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(pid_file(&socket))
        .unwrap_or_default()
        .trim()
        != next.child.id().to_string()
    {
        assert!(
            Instant::now() < end,
            "the pid file was not taken over; log:\n{}",
            next.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    let s = Session::connect(&socket).unwrap();
    s.init().unwrap();
}

#[test]
fn sigterm_writes_back_dirty_dax_tails_in_every_sandbox() {
    if kind() != DaemonKind::Daxfsd {
        eprintln!(
            "{} has no DAX window: this test is daxfsd's (its shadow tails)",
            kind().name()
        );
        return;
    }
    const MIB2: u64 = 2 << 20;
    for sandbox in ["none", "chroot", "namespace"] {
        let dir = tempfile::tempdir().unwrap();
        let share = dir.path().join("share");
        std::fs::create_dir(&share).unwrap();
        // One whole page and 100 bytes: the mapping's last partial page is a shadow tail.
        let data: Vec<u8> = (0..4196).map(|i| (i % 251) as u8).collect();
        std::fs::write(share.join("tail.bin"), &data).unwrap();
        let socket = dir.path().join("fs.sock");
        let mut d = spawn_with(
            &socket,
            &share,
            sandbox,
            "daemon.log",
            &["--dax-window=64M"],
        );
        let s = Session::connect(&socket).unwrap();
        s.init().unwrap();
        let w = s
            .dax()
            .cloned()
            .expect("daxfsd --dax-window=64M offers a window");
        let e = s.lookup(abi::ROOT_ID, "tail.bin").unwrap();
        let o = s.open(e.nodeid, libc::O_RDWR as u32).unwrap();
        s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ | WRITE, 0)
            .unwrap();
        // Written through the window into the tail, then nothing: no REMOVEMAPPING, no
        // FSYNC, no RELEASE. Only the clean exit writes it back.
        w.write(4096 + 10, b"dirty tail bytes").unwrap();
        d.signal(libc::SIGTERM);
        let st = d.wait(Duration::from_secs(20));
        assert_eq!(
            st.code(),
            Some(0),
            "--sandbox={sandbox}: {st}; log:\n{}",
            d.log()
        );
        let host = std::fs::read(share.join("tail.bin")).unwrap();
        assert_eq!(host.len(), data.len(), "--sandbox={sandbox}: size changed");
        assert_eq!(
            &host[4106..4122],
            b"dirty tail bytes",
            "--sandbox={sandbox}: the tail was not written back; log:\n{}",
            d.log()
        );
        assert_eq!(host[..4106], data[..4106], "--sandbox={sandbox}");
        assert_eq!(host[4122..], data[4122..], "--sandbox={sandbox}");
        drop(s);
    }
}

/// SIGTERM with WRITEs and READs in flight on several queues and a SETLKW waiting on a
/// host lock: the daemon still stops promptly, exits 0 and removes its files; every WRITE
/// it acknowledged is on the host.
#[test]
fn sigterm_under_load_exits_cleanly() {
    use daxfsd::abi::{opcode as op, ReadIn, WriteIn};
    use vm_memory::ByteValued;
    use vufs_driver::{Chain, Seg};
    if kind() != DaemonKind::Daxfsd {
        eprintln!(
            "{}: the load test uses daxfsd's --queues and --posix-lock",
            kind().name()
        );
        return;
    }
    const MIB: usize = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    std::fs::write(share.join("f"), vec![0u8; 8 * MIB]).unwrap();
    // A host process holds a lock the guest's SETLKW will wait for.
    let host = vufs_driver::host_write_lock(&share.join("f")).unwrap();
    let socket = dir.path().join("fs.sock");
    let mut d = spawn_with(
        &socket,
        &share,
        "namespace",
        "daemon.log",
        &["--queues=4", "--posix-lock"],
    );
    let s = Session::connect(&socket).unwrap();
    s.init().unwrap();
    let dev = s.device().clone();
    let e = s.lookup(abi::ROOT_ID, "f").unwrap();
    let fh = s.open(e.nodeid, libc::O_RDWR as u32).unwrap().fh;
    let chain = |opcode: u32, parts: &[&[u8]], body: u32| {
        let len = parts.iter().map(|p| p.len()).sum();
        let hdr = s.header(opcode, e.nodeid, len);
        let mut segs = vec![Seg::Readable(hdr.as_slice().to_vec())];
        segs.extend(parts.iter().map(|p| Seg::Readable(p.to_vec())));
        segs.push(Seg::Writable(16));
        if body > 0 {
            segs.push(Seg::Writable(body));
        }
        Chain {
            segs,
            indirect: dev.info().indirect_desc,
        }
    };
    let lk = vufs_driver::whole_file_write_lock(fh, 1);
    let _setlkw = dev
        .submit(1, &chain(op::SETLKW, &[lk.as_slice()], 0))
        .unwrap();
    let mut writes = Vec::new();
    let mut reads = Vec::new();
    let data = vec![0xa5u8; MIB];
    for i in 0..16u64 {
        let q = 1 + (i % 4) as usize;
        let w = WriteIn {
            fh,
            offset: (i % 8) * MIB as u64,
            size: MIB as u32,
            ..Default::default()
        };
        writes.push((
            w.offset,
            dev.submit(q, &chain(op::WRITE, &[w.as_slice(), &data], 8))
                .unwrap(),
        ));
        let r = ReadIn {
            fh,
            offset: (i % 8) * MIB as u64,
            size: MIB as u32,
            ..Default::default()
        };
        reads.push(
            dev.submit(q, &chain(op::READ, &[r.as_slice()], MIB as u32))
                .unwrap(),
        );
    }
    let t0 = Instant::now();
    d.signal(libc::SIGTERM);
    let st = d.wait(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{st}; log:\n{}", d.log());
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?} to stop",
        t0.elapsed()
    );
    assert!(!socket.exists() && !pid_file(&socket).exists());
    // Every WRITE the daemon acknowledged (out header error 0) is on the host.
    let file = std::fs::read(share.join("f")).unwrap();
    let mut acked = 0;
    for (off, p) in writes {
        let Ok(c) = p.wait(Duration::from_millis(100)) else {
            continue;
        };
        if c.data.len() >= 16 && i32::from_le_bytes(c.data[4..8].try_into().unwrap()) == 0 {
            acked += 1;
            let r = off as usize..off as usize + MIB;
            assert!(
                file[r].iter().all(|&b| b == 0xa5),
                "acknowledged WRITE at {off} not on the host"
            );
        }
    }
    eprintln!("{acked} of 16 WRITEs were acknowledged before the stop");
    drop(reads);
    drop(s);
    drop(host);
}

/// Process `pid` and its descendants (a sandboxed daemon serves from a child process).
fn tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let p = all[i];
        let kids =
            std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        all.extend(
            kids.split_whitespace()
                .filter_map(|k| k.parse::<u32>().ok()),
        );
        i += 1;
    }
    all
}

/// Sends `sig` to process `pid` and every descendant.
fn signal_tree(pid: u32, sig: libc::c_int) {
    for p in tree(pid) {
        // SAFETY: signalling our own child and its descendants.
        unsafe { libc::kill(p as i32, sig) };
    }
}

/// Freezes process `pid` through a cgroup (v2 `cgroup.freeze` under /sys/fs/cgroup or its
/// `unified` mount, else the v1 freezer), or `None` when this host has neither writable.
struct Freezer {
    dir: PathBuf,
    v2: bool,
}

impl Freezer {
    fn new(pid: u32) -> Option<Freezer> {
        let name = format!("daxfsd-test-{}-{pid}", std::process::id());
        for (base, v2) in [
            ("/sys/fs/cgroup", true),
            ("/sys/fs/cgroup/unified", true),
            ("/sys/fs/cgroup/freezer", false),
        ] {
            let ctl = if v2 { "cgroup.freeze" } else { "freezer.state" };
            let probe = Path::new(base).join(if v2 { "cgroup.procs" } else { "tasks" });
            if !probe.exists() {
                continue;
            }
            let dir = Path::new(base).join(&name);
            if std::fs::create_dir(&dir).is_err() || !dir.join(ctl).exists() {
                let _ = std::fs::remove_dir(&dir);
                continue;
            }
            if tree(pid)
                .iter()
                .any(|p| std::fs::write(dir.join("cgroup.procs"), p.to_string()).is_err())
            {
                let _ = std::fs::remove_dir(&dir);
                continue;
            }
            return Some(Freezer { dir, v2 });
        }
        None
    }

    fn set(&self, frozen: bool) {
        let (ctl, v) = match (self.v2, frozen) {
            (true, f) => ("cgroup.freeze", if f { "1" } else { "0" }),
            (false, true) => ("freezer.state", "FROZEN"),
            (false, false) => ("freezer.state", "THAWED"),
        };
        std::fs::write(self.dir.join(ctl), v).unwrap();
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        self.set(false);
        // The daemon (if still alive) goes back to the root cgroup so the directory can go.
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            let root = self.dir.parent().unwrap().join("cgroup.procs");
            for p in procs.lines() {
                let _ = std::fs::write(&root, p);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// SIGSTOP + SIGCONT (what a debugger attach, `kill -STOP` or a job-control stop does) and a
/// cgroup freeze of a daemon under traffic, with a DAX window (its write-back thread), a
/// thread pool (idle workers) and a SETLKW polling a host lock (daxfsd): the kernel resumes
/// the timed waits through `restart_syscall`, which the default seccomp filter (kill) must
/// allow. Afterwards requests are still answered and the daemon is alive.
#[test]
fn stop_cont_and_freeze_under_traffic_keep_serving() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let daxfsd = kind() == DaemonKind::Daxfsd;
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    std::fs::write(share.join("f"), vec![7u8; 1 << 20]).unwrap();
    let host_lock = vufs_driver::host_write_lock(&share.join("f")).unwrap();
    let socket = dir.path().join("fs.sock");
    let mut args = vec!["--thread-pool-size=4"];
    if daxfsd {
        args.extend(["--dax-window=64M", "--posix-lock"]);
    }
    // The default seccomp action (kill), as a service manager starts it.
    let mut d = spawn_with(&socket, &share, "namespace", "daemon.log", &args);
    let s = Session::connect(&socket).unwrap();
    s.init().unwrap();
    let s = s.with_timeout(Duration::from_secs(20));
    let e = s.lookup(abi::ROOT_ID, "f").unwrap();
    let fh = s.open(e.nodeid, libc::O_RDWR as u32).unwrap().fh;
    let mut setlkw = None;
    if daxfsd {
        let w = s.dax().cloned().expect("a DAX window");
        s.setupmapping(e.nodeid, fh, 0, 2 << 20, READ | WRITE, 0)
            .unwrap();
        w.write(10, b"dirty").unwrap();
        // A SETLKW waiting on a host lock: the daemon polls it in a timed wait.
        use daxfsd::abi::opcode as op;
        use vm_memory::ByteValued;
        let lk = vufs_driver::whole_file_write_lock(fh, 1);
        let chain = s.linux_chain(op::SETLKW, e.nodeid, &[lk.as_slice()], 0);
        setlkw = Some(s.device().submit(1, &chain).unwrap());
    }
    let stop = AtomicBool::new(false);
    let done = AtomicUsize::new(0);
    let pid = d.child.id();
    let freezer = Freezer::new(pid);
    let mut rounds = Vec::new();
    std::thread::scope(|sc| {
        let (s, stop, done) = (&s, &stop, &done);
        sc.spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Each request may wait out a stop: the session's timeout is 20 s.
                let ok = s.getattr(e.nodeid, None).is_ok()
                    && s.write(e.nodeid, fh, (i % 64) * 4096, &[i as u8; 4096])
                        .is_ok()
                    && s.fsync(e.nodeid, fh, false).is_ok();
                if !ok {
                    break;
                }
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        });
        for round in 0..4 {
            std::thread::sleep(Duration::from_millis(300));
            signal_tree(pid, libc::SIGSTOP);
            std::thread::sleep(Duration::from_millis(700));
            signal_tree(pid, libc::SIGCONT);
            rounds.push(format!("STOP/CONT {round}"));
        }
        if let Some(f) = &freezer {
            eprintln!("freezing through {}", f.dir.display());
            for round in 0..3 {
                std::thread::sleep(Duration::from_millis(300));
                f.set(true);
                std::thread::sleep(Duration::from_millis(700));
                f.set(false);
                rounds.push(format!("freeze/thaw {round}"));
            }
        } else {
            eprintln!("no writable cgroup freezer on this host: STOP/CONT only");
        }
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
    });
    drop(freezer);
    let alive = d.child.try_wait().unwrap();
    assert!(
        alive.is_none(),
        "{} died after {rounds:?}: {:?}; log:\n{}",
        kind().name(),
        alive,
        d.log()
    );
    // Still answering, on every path the traffic used.
    s.getattr(e.nodeid, None).unwrap();
    assert_eq!(s.write(e.nodeid, fh, 0, b"after").unwrap(), 5);
    s.fsync(e.nodeid, fh, false).unwrap();
    eprintln!(
        "{}: {} request rounds across {rounds:?}; still serving",
        kind().name(),
        done.load(Ordering::Relaxed)
    );
    assert!(done.load(Ordering::Relaxed) > 0);
    drop(host_lock);
    if let Some(p) = setlkw {
        // The host lock is gone: the SETLKW the daemon polled through every stop completes.
        let c = p.wait(Duration::from_secs(10)).expect("SETLKW answered");
        assert!(c.data.len() >= 16, "{c:?}");
    }
}
