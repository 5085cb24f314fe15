//! Faults at the protocol level: the frontend dying mid-I/O, a guest reboot (device stop and
//! reset), a full host disk, and descriptor exhaustion in the daemon.
//!
//! Daemon: tests that need daxfsd-only features (the DAX window, RESET_DEVICE, its log lines)
//! select daxfsd explicitly; the others run against `VUFS_DAEMON` (default virtiofsd).

mod common;
#[path = "common/host.rs"]
mod host;

use std::fs;
use std::time::{Duration, Instant};

use daxfsd::abi::{
    self, opcode as op, ReadIn, RemovemappingOne, SetupmappingIn, WriteIn,
    SETUPMAPPING_FLAG_READ as READ, SETUPMAPPING_FLAG_WRITE as WRITE,
};
use host::Cases;
use vhost::vhost_user::VhostUserProtocolFeatures;
use vm_memory::ByteValued;
use vufs_driver::{DaemonKind, DriverConfig, Session};

const ROOT: u64 = abi::ROOT_ID;
const MIB: usize = 1 << 20;
const MIB2: u64 = 2 << 20;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 12) as u8)
        .collect()
}

/// The frontend disappears with large READs, WRITEs, DAX mappings and a blocked SETLKW in
/// flight on four request queues: daxfsd must notice, log it and exit 0 within seconds.
/// daxfsd only: it checks daxfsd's log line and uses the DAX window.
#[test]
fn frontend_killed_mid_io_exits_cleanly() {
    let mut cases = Cases::new("faults", "frontend_killed_mid_io_exits_cleanly");
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("big"), pattern(16 * MIB, 1)).unwrap();
    let mut d = host::spawn(
        &host::daxfsd(),
        dir.path(),
        // Remote POSIX locks (off by default, as in virtiofsd) for the blocked SETLKW.
        &["--queues=4", "--dax-window=64M", "--posix-lock"],
    );
    let cfg = DriverConfig {
        mem_size: 256 << 20,
        ..Default::default()
    };
    let s = host::connect(&d, &cfg);
    let dev = s.device().clone();
    assert_eq!(dev.info().num_request_queues, 4, "{:?}", dev.info());
    let e = s.lookup(ROOT, "big").unwrap();
    let fh = s.open(e.nodeid, libc::O_RDWR as u32).unwrap().fh;
    // A second handle holds a write lock; a SETLKW through the first blocks a worker for good.
    let locker = s.open(e.nodeid, libc::O_RDWR as u32).unwrap().fh;
    let lk = |fh: u64| vufs_driver::whole_file_write_lock(fh, fh);
    s.call(op::SETLK, e.nodeid, &[lk(locker).as_slice()], 0)
        .unwrap();

    let mut pending = Vec::new();
    let blocked = s.linux_chain(op::SETLKW, e.nodeid, &[lk(fh).as_slice()], 0);
    pending.push(dev.submit(4, &blocked).unwrap());
    let data = pattern(MIB, 7);
    for round in 0..12u64 {
        for q in 1..=4usize {
            let off = ((round * 4 + q as u64) % 15) * MIB as u64;
            let w = WriteIn {
                fh,
                offset: off,
                size: MIB as u32,
                ..Default::default()
            };
            pending.push(
                dev.submit(
                    q,
                    &s.linux_chain(op::WRITE, e.nodeid, &[w.as_slice(), &data], 8),
                )
                .unwrap(),
            );
            let r = ReadIn {
                fh,
                offset: off,
                size: MIB as u32,
                ..Default::default()
            };
            pending.push(
                dev.submit(
                    q,
                    &s.linux_chain(op::READ, e.nodeid, &[r.as_slice()], MIB as u32),
                )
                .unwrap(),
            );
            let m = SetupmappingIn {
                fh,
                foffset: (round % 8) * MIB2,
                len: MIB2,
                flags: READ | if q % 2 == 0 { WRITE } else { 0 },
                moffset: ((round * 4 + q as u64) % 32) * MIB2,
            };
            pending.push(
                dev.submit(
                    q,
                    &s.linux_chain(op::SETUPMAPPING, e.nodeid, &[m.as_slice()], 0),
                )
                .unwrap(),
            );
        }
    }
    let queues: Vec<_> = (1..=4).map(|q| dev.queue(q).unwrap().clone()).collect();
    let submitted: u64 = queues.iter().map(|q| q.stats().submitted).sum();
    // Abrupt end, as when QEMU is killed: no DESTROY, no GET_VRING_BASE; the vhost-user
    // socket and the backend-request channel just close.
    let t0 = Instant::now();
    drop(s);
    drop(dev);
    let st = d
        .wait_exit(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("daxfsd did not exit after the frontend vanished: {e}"));
    let took = t0.elapsed();
    cases.case("exit after disconnect with requests in flight");
    assert!(
        st.success(),
        "daxfsd exited with {st} after a disconnect mid-I/O; log:\n{}",
        d.log_contents()
    );
    cases.case("exit status 0");
    let log = d.log_contents();
    assert!(
        log.contains("frontend disconnected"),
        "no disconnect line in the log:\n{log}"
    );
    cases.case("disconnect logged");
    assert!(!log.contains("panicked"), "daxfsd panicked:\n{log}");
    cases.case("no panic");
    let completed: u64 = queues.iter().map(|q| q.stats().completed).sum();
    eprintln!("{submitted} requests submitted, {completed} completed, exit after {took:?}");
    assert!(completed < submitted, "nothing was in flight");
    cases.case("requests were in flight");
    drop(pending);
    let v: Vec<String> = queues.iter().flat_map(|q| q.violations()).collect();
    assert!(v.is_empty(), "{v:?}");
}

/// Opens everything a busy guest would: lookups, handles, directory handles, DAX mappings.
/// Returns (nodeids, (nodeid, fh) file handles, (nodeid, fh) dir handles).
#[allow(clippy::type_complexity)]
fn busy_session(s: &Session, files: usize) -> (Vec<u64>, Vec<(u64, u64)>, Vec<(u64, u64)>) {
    let mut nodes = Vec::new();
    let mut fhs = Vec::new();
    let mut dirs = Vec::new();
    let nreq = s.device().info().num_request_queues;
    for i in 0..files {
        let q = s.on_queue(1 + i % nreq).unwrap();
        let e = q.lookup(ROOT, format!("f{i}")).unwrap();
        nodes.push(e.nodeid);
        if i % 2 == 0 {
            let flags = if i % 4 == 0 {
                libc::O_RDWR
            } else {
                libc::O_RDONLY
            };
            let o = q.open(e.nodeid, flags as u32).unwrap();
            fhs.push((e.nodeid, o.fh));
            if i < 20 {
                let w = if flags == libc::O_RDWR { WRITE } else { 0 };
                q.setupmapping(e.nodeid, o.fh, 0, MIB2, READ | w, i as u64 * MIB2)
                    .unwrap();
            }
        }
    }
    for name in ["d0", "d1", "d2"] {
        let e = s.lookup(ROOT, name).unwrap();
        let o = s.opendir(e.nodeid, libc::O_RDONLY as u32).unwrap();
        let sub = s.lookup(e.nodeid, "inner").unwrap();
        nodes.extend([e.nodeid, sub.nodeid]);
        dirs.push((e.nodeid, o.fh));
    }
    (nodes, fhs, dirs)
}

/// A guest reboot as QEMU performs it: GET_VRING_BASE on every vring (and, with
/// `reset_device`, VHOST_USER_RESET_DEVICE), then the rebooted guest starts the device with
/// fresh rings and mounts again. The old session's inodes, handles and DAX mappings must all
/// be gone: the daemon's descriptors are back to what it had right after INIT, it reports no
/// mapped bytes, and the new session maps into a clean window.
fn reboot(reset_device: bool) {
    let test = if reset_device {
        "guest_reboot_with_reset_device"
    } else {
        "guest_reboot_by_stopping_vrings"
    };
    let mut cases = Cases::new("faults", test);
    let dir = tempfile::tempdir().unwrap();
    for i in 0..48 {
        fs::write(dir.path().join(format!("f{i}")), pattern(64 << 10, i as u8)).unwrap();
    }
    for name in ["d0", "d1", "d2"] {
        fs::create_dir_all(dir.path().join(name).join("inner")).unwrap();
    }
    // daxfsd only: DAX window, RESET_DEVICE, SIGUSR1 counters.
    let mut d = host::spawn(
        &host::daxfsd(),
        dir.path(),
        &["--queues=2", "--dax-window=64M"],
    );
    let mut cfg = DriverConfig::default();
    cfg.protocol_features |= VhostUserProtocolFeatures::RESET_DEVICE;
    let s = host::connect(&d, &cfg);
    let pid = d.pid().unwrap();
    let dev = s.device().clone();
    let w = s
        .dax()
        .cloned()
        .expect("daxfsd --dax-window=64M has a window");
    if reset_device {
        assert_ne!(
            dev.info().acked_protocol_features & VhostUserProtocolFeatures::RESET_DEVICE.bits(),
            0,
            "daxfsd does not offer RESET_DEVICE"
        );
    }
    let baseline = host::fd_count(pid);
    let baseline_fds = host::fd_targets(pid);

    let (nodes, fhs, dirs) = busy_session(&s, 48);
    let busy = host::fd_count(pid);
    // Open files and directories hold a descriptor each; inodes do too, unless (the default
    // --inode-file-handles=prefer, as root) they are kept as file handles.
    assert!(
        busy >= baseline + fhs.len() + dirs.len(),
        "the session should hold descriptors: {baseline} -> {busy} ({} inodes)",
        nodes.len()
    );
    // Ten 2 MiB guest mappings of 64 KiB files: file pages plus a shadow tail each.
    let mapped: u64 = w.mappings().iter().map(|m| m.len).sum();
    assert_eq!(mapped, 10 * MIB2, "{:?}", w.mappings());
    let before_reset = w.stats();

    // Reboot: stop every ring (and reset the device).
    dev.stop(reset_device).unwrap();
    let why = if reset_device {
        "device reset"
    } else {
        "device stopped"
    };
    assert!(
        host::wait_log(&d, Duration::from_secs(5), |l| l.contains(why)),
        "no '{why}' line in the log:\n{}",
        d.log_contents()
    );
    cases.case("stop logged");
    // Nothing may be sent to the frontend after the stop.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        w.stats(),
        before_reset,
        "DAX requests after the device stopped"
    );
    assert!(w.violations().is_empty(), "{:?}", w.violations());
    cases.case("no SHMEM_MAP/UNMAP after the stop");
    let stopped = if reset_device {
        // The reset closes the session's descriptors; a DAX write-back or refresh that was
        // running may hold one a moment longer.
        host::fd_count_settled(pid, baseline, Duration::from_secs(2))
    } else {
        host::fd_count(pid)
    };
    if reset_device {
        assert!(
            stopped <= baseline,
            "reset device still holds {stopped} descriptors (baseline {baseline}):\n{:#?}",
            host::fd_targets(pid)
        );
        cases.case("descriptors released at the reset");
        daemon_reports_nothing_mapped(&d, pid);
        cases.case("daemon reports mapped_bytes=0");
    } else {
        // Stopping the vrings alone is also what `stop` in QEMU's monitor does: the session
        // must survive it. The reboot ends it with the new INIT below.
        // (The vrings' kick and call eventfds are closed at GET_VRING_BASE.)
        assert!(
            stopped >= baseline + fhs.len() + dirs.len(),
            "a stopped (not reset) device must keep its session's descriptors: \
             {busy} -> {stopped}, baseline {baseline}"
        );
        cases.case("session kept across the vring stop");
    }

    // The rebooted guest: fresh rings, INIT, same nodeids are unknown now.
    dev.restart().unwrap();
    s.init().unwrap();
    let after = host::fd_count_settled(pid, baseline, Duration::from_secs(2));
    assert_eq!(
        after,
        baseline,
        "descriptors after the reboot differ from the baseline\nbefore: {baseline_fds:#?}\nafter: {:#?}",
        host::fd_targets(pid)
    );
    cases.case("descriptor count back to baseline");
    if !reset_device {
        daemon_reports_nothing_mapped(&d, pid);
        cases.case("daemon reports mapped_bytes=0 after the new INIT");
    }
    for &(n, fh) in fhs.iter().take(5) {
        let e = host::errno_of("READ of a pre-reboot handle", s.read(n, fh, 0, 16));
        assert_eq!(e, libc::EBADF);
    }
    cases.case("old handles invalid");
    for &n in nodes.iter().take(5) {
        let e = host::errno_of("GETATTR of a pre-reboot inode", s.getattr(n, None));
        assert_eq!(e, libc::EBADF);
    }
    cases.case("old inodes invalid");
    for &(n, fh) in dirs.iter().take(2) {
        let e = host::errno_of(
            "READDIR of a pre-reboot dir handle",
            s.readdir(n, fh, 0, 4096),
        );
        assert_eq!(e, libc::EBADF);
    }
    cases.case("old dir handles invalid");
    // A clean window: mapping offset 0 again sends exactly one SHMEM_MAP and no stale UNMAP.
    assert!(w.mappings().is_empty());
    let e = s.lookup(ROOT, "f0").unwrap();
    let o = s.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    let st0 = w.stats();
    s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ, 0).unwrap();
    let st1 = w.stats();
    assert!(
        st1.map_requests > st0.map_requests && st1.unmap_requests == st0.unmap_requests,
        "mapping after the reboot: {st0:?} -> {st1:?} (a stale UNMAP?)"
    );
    assert_eq!(w.stats().maps_rejected, 0, "{:?}", w.stats());
    let mut buf = vec![0u8; 4096];
    w.read(0, &mut buf).unwrap();
    assert_eq!(buf, pattern(64 << 10, 0)[..4096]);
    cases.case("new session maps into a clean window");
    s.removemapping(
        e.nodeid,
        &[RemovemappingOne {
            moffset: 0,
            len: MIB2,
        }],
    )
    .unwrap();
    s.release(e.nodeid, o.fh, 0).unwrap();
    s.forget(e.nodeid, 1).unwrap();
    // Twice in a row, the second time with nothing open: still the baseline.
    dev.stop(reset_device).unwrap();
    dev.restart().unwrap();
    s.init().unwrap();
    assert_eq!(
        host::fd_count_settled(pid, baseline, Duration::from_secs(2)),
        baseline,
        "{:#?}",
        host::fd_targets(pid)
    );
    cases.case("second reboot");
    let v = dev.violations();
    assert!(v.is_empty(), "{v:?}");
    assert!(d.try_wait().unwrap().is_none(), "{}", d.log_contents());
}

/// SIGUSR1 makes the daemon log its DAX counters (no mapping may be left) and its requests.
fn daemon_reports_nothing_mapped(d: &vufs_driver::Daemon, pid: u32) {
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    assert!(
        host::wait_log(d, Duration::from_secs(5), |l| {
            l.lines()
                .rev()
                .find(|l| l.contains("dax: maps="))
                .is_some_and(|l| l.contains("mapped_bytes=0"))
        }),
        "daxfsd still reports mapped bytes:\n{}",
        d.log_contents()
    );
    // The same report counts the requests served, by opcode.
    assert!(
        host::wait_log(d, Duration::from_secs(5), |l| {
            l.lines()
                .any(|l| l.contains("requests: ") && l.contains("LOOKUP "))
        }),
        "no request counts in the SIGUSR1 report:\n{}",
        d.log_contents()
    );
}

#[test]
fn guest_reboot_by_stopping_vrings() {
    reboot(false);
}

#[test]
fn guest_reboot_with_reset_device() {
    reboot(true);
}

/// The share is a 2 MiB tmpfs: writes past the space fail with ENOSPC, what was written reads
/// back intact, and the daemon keeps serving (space freed through the guest is usable again).
#[test]
fn host_disk_full() {
    let mut cases = Cases::new("faults", "host_disk_full");
    let kind = common::kind();
    let tmpfs = host::Tmpfs::mount("2m").expect("mount a 2 MiB tmpfs (needs root)");
    let mut d = host::spawn(&kind, &tmpfs.path, &[]);
    let s = host::connect(&d, &DriverConfig::default());
    let flags = (libc::O_RDWR | libc::O_CREAT) as u32;
    let (a, ah) = s
        .create(ROOT, "a", flags, libc::S_IFREG | 0o644, 0)
        .unwrap();
    let first = pattern(MIB, 3);
    assert_eq!(s.write(a.nodeid, ah.fh, 0, &first).unwrap() as usize, MIB);
    s.fsync(a.nodeid, ah.fh, false).unwrap();

    let (b, bh) = s
        .create(ROOT, "b", flags, libc::S_IFREG | 0o644, 0)
        .unwrap();
    let chunk = pattern(256 << 10, 9);
    let mut written = 0usize;
    let mut enospc = false;
    for _ in 0..16 {
        match s.write(b.nodeid, bh.fh, written as u64, &chunk) {
            Ok(n) => {
                assert!(n as usize <= chunk.len());
                written += n as usize;
                if n == 0 {
                    break;
                }
            }
            Err(e) => {
                assert_eq!(
                    e.raw_os_error(),
                    Some(libc::ENOSPC),
                    "write past the space: {e}"
                );
                enospc = true;
                break;
            }
        }
    }
    assert!(
        enospc,
        "no ENOSPC after {written} bytes on a 2 MiB filesystem"
    );
    assert!(
        written < 2 * MIB,
        "{written} bytes fit in 2 MiB minus 1 MiB"
    );
    cases.case("WRITE past the space -> ENOSPC");
    // Further writes keep failing cleanly; so does CREATE + WRITE of a new file.
    let e = host::errno_of(
        "WRITE on a full fs",
        s.write(b.nodeid, bh.fh, written as u64, &chunk),
    );
    assert_eq!(e, libc::ENOSPC);
    cases.case("WRITE again -> ENOSPC");
    if let Ok((c, ch)) = s.create(ROOT, "c", flags, libc::S_IFREG | 0o644, 0) {
        let e = host::errno_of("WRITE to a new file", s.write(c.nodeid, ch.fh, 0, &chunk));
        assert_eq!(e, libc::ENOSPC);
        s.release(c.nodeid, ch.fh, flags).unwrap();
    }
    cases.case("new file on a full fs -> ENOSPC");

    // Earlier data is intact, through the daemon and on the host.
    let mut back = Vec::new();
    while back.len() < MIB {
        let got = s
            .read(a.nodeid, ah.fh, back.len() as u64, 256 << 10)
            .unwrap();
        assert!(!got.is_empty());
        back.extend(got);
    }
    assert!(back == first, "file a changed");
    assert!(fs::read(tmpfs.path.join("a")).unwrap() == first);
    let bb = fs::read(tmpfs.path.join("b")).unwrap();
    assert_eq!(bb.len(), written);
    assert!(
        bb.chunks(chunk.len()).all(|c| c == &chunk[..c.len()]),
        "file b holds other bytes than those reported written"
    );
    cases.case("data written before reads back intact");
    let st = s.statfs(ROOT).unwrap();
    assert!(st.bavail <= 1, "{st:?}");
    cases.case("STATFS shows the full fs");

    // Still serving: free space through the guest, write again.
    s.release(b.nodeid, bh.fh, flags).unwrap();
    s.unlink(ROOT, "b").unwrap();
    s.forget(b.nodeid, 1).unwrap();
    assert_eq!(
        s.write(a.nodeid, ah.fh, MIB as u64, &chunk).unwrap() as usize,
        chunk.len()
    );
    assert_eq!(
        s.read(a.nodeid, ah.fh, MIB as u64, chunk.len() as u32)
            .unwrap(),
        chunk
    );
    cases.case("serving after space is freed");
    s.release(a.nodeid, ah.fh, flags).unwrap();
    let v = s.device().violations();
    assert!(v.is_empty(), "{v:?}");
    assert!(d.try_wait().unwrap().is_none(), "{}", d.log_contents());
    drop(s);
    drop(d);
}

/// With a small RLIMIT_NOFILE (64; virtiofsd needs 700) the daemon runs out of descriptors: LOOKUP/OPEN fail with
/// EMFILE/ENFILE (no crash, no hang, every request answered), and once the guest releases
/// some, new LOOKUPs and OPENs work again.
#[test]
fn fd_exhaustion() {
    let mut cases = Cases::new("faults", "fd_exhaustion");
    let kind = common::kind();
    // virtiofsd refuses to start with fewer than 610 descriptors.
    let (limit, files) = if kind == DaemonKind::Virtiofsd {
        (700, 1500)
    } else {
        (64, 200)
    };
    let dir = tempfile::tempdir().unwrap();
    for i in 0..files {
        fs::write(dir.path().join(format!("f{i:04}")), format!("file {i}")).unwrap();
    }
    fs::create_dir(dir.path().join("sub")).unwrap();
    let mut d = host::spawn(&kind, dir.path(), &[&format!("--rlimit-nofile={limit}")]);
    let s = host::connect(&d, &DriverConfig::default()).with_timeout(Duration::from_secs(5));
    let mut held: Vec<(u64, Option<u64>)> = Vec::new();
    let mut failure = None;
    'outer: for i in 0..files {
        let name = format!("f{i:04}");
        match s.lookup(ROOT, &name) {
            Ok(e) => {
                held.push((e.nodeid, None));
                match s.open(e.nodeid, libc::O_RDONLY as u32) {
                    Ok(o) => held.last_mut().unwrap().1 = Some(o.fh),
                    Err(err) => {
                        failure = Some(("OPEN", err));
                        break 'outer;
                    }
                }
            }
            Err(err) => {
                failure = Some(("LOOKUP", err));
                break 'outer;
            }
        }
    }
    let (what, err) =
        failure.unwrap_or_else(|| panic!("{files} files opened under RLIMIT_NOFILE {limit}"));
    let errno = err
        .raw_os_error()
        .unwrap_or_else(|| panic!("{what} failed without an errno (hang or crash?): {err}"));
    assert!(
        errno == libc::EMFILE || errno == libc::ENFILE,
        "{what} at the descriptor limit: {err}"
    );
    assert!(d.try_wait().unwrap().is_none(), "{}", d.log_contents());
    cases.case(format!("{what} at the limit -> EMFILE/ENFILE"));
    eprintln!("{} files looked up before {what} failed", held.len());

    // Everything needing a descriptor fails cleanly; the rest works. (daxfsd holds a
    // descriptor per inode, so LOOKUP needs one too; virtiofsd may use file handles.)
    let strict = kind == DaemonKind::Daxfsd;
    let at_limit = |what: &str, r: std::io::Result<()>| match r {
        Ok(()) if !strict => {}
        r => {
            let e = host::errno_of(what, r);
            assert!(e == libc::EMFILE || e == libc::ENFILE, "{what}: errno {e}");
        }
    };
    s.getattr(ROOT, None).unwrap();
    cases.case("GETATTR at the limit");
    let last = format!("f{:04}", files - 1);
    at_limit("LOOKUP at the limit", s.lookup(ROOT, &last).map(drop));
    cases.case("LOOKUP at the limit");
    at_limit(
        "OPENDIR at the limit",
        s.opendir(ROOT, libc::O_RDONLY as u32).map(drop),
    );
    cases.case("OPENDIR at the limit");
    let flags = (libc::O_RDWR | libc::O_CREAT) as u32;
    at_limit(
        "CREATE at the limit",
        s.create(ROOT, "new", flags, libc::S_IFREG | 0o644, 0)
            .map(drop),
    );
    cases.case("CREATE at the limit");
    // Handles still open keep working.
    let (n0, fh0) = held[0];
    assert_eq!(s.read(n0, fh0.unwrap(), 0, 64).unwrap(), b"file 0");
    cases.case("READ on a held handle at the limit");

    // Release some: the daemon serves new lookups and opens again.
    for (n, fh) in held.drain(..8) {
        if let Some(fh) = fh {
            s.release(n, fh, 0).unwrap();
        }
        s.forget(n, 1).unwrap();
    }
    let e = s.lookup(ROOT, &last).unwrap();
    let o = s.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    assert_eq!(
        s.read(e.nodeid, o.fh, 0, 64).unwrap(),
        format!("file {}", files - 1).as_bytes()
    );
    cases.case("LOOKUP+OPEN+READ after releasing");
    let sub = s.lookup(ROOT, "sub").unwrap();
    let dh = s.opendir(sub.nodeid, libc::O_RDONLY as u32).unwrap();
    s.releasedir(sub.nodeid, dh.fh, 0).unwrap();
    cases.case("OPENDIR after releasing");
    let v = s.device().violations();
    assert!(v.is_empty(), "{v:?}");
    assert!(d.try_wait().unwrap().is_none(), "{}", d.log_contents());
    // Not a daxfsd-only test, but the daemon must not have given up on the session.
    if kind == DaemonKind::Daxfsd {
        assert!(!d.log_contents().contains("panicked"));
    }
}

/// A guest reboots while one of its requests is stuck in the daemon (a SETLKW waiting for a
/// lock a host process holds). The stop must not hang, and when the stuck request finally
/// finishes after the reboot, the daemon must not complete it into the new rings (that would
/// corrupt the rebooted guest's memory) nor keep its descriptors. daxfsd only (RESET_DEVICE).
#[test]
fn reboot_with_a_request_stuck_in_the_daemon() {
    let mut cases = Cases::new("faults", "reboot_with_a_request_stuck_in_the_daemon");
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("locked"), b"locked file").unwrap();
    let mut d = host::spawn(&host::daxfsd(), dir.path(), &["--queues=2", "--posix-lock"]);
    let mut cfg = DriverConfig::default();
    cfg.protocol_features |= VhostUserProtocolFeatures::RESET_DEVICE;
    let s = host::connect(&d, &cfg);
    let pid = d.pid().unwrap();
    let dev = s.device().clone();
    let baseline = host::fd_count(pid);

    // A host process (this one) holds a write lock on the file.
    let host_file = vufs_driver::host_write_lock(&dir.path().join("locked")).unwrap();

    let e = s.lookup(ROOT, "locked").unwrap();
    let fh = s.open(e.nodeid, libc::O_RDWR as u32).unwrap().fh;
    let lk = vufs_driver::whole_file_write_lock(fh, 1);
    let stuck = dev
        .submit(1, &s.linux_chain(op::SETLKW, e.nodeid, &[lk.as_slice()], 0))
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));

    let t0 = Instant::now();
    dev.stop(true).unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "stop took {:?}",
        t0.elapsed()
    );
    cases.case("stop with a request stuck in the daemon returns");
    drop(stuck);
    dev.restart().unwrap();
    s.init().unwrap();
    for _ in 0..10 {
        s.getattr(ROOT, None).unwrap();
    }
    cases.case("rebooted device serves");

    // The host releases its lock: the stuck SETLKW completes inside the daemon, after the
    // reboot. Keep the rebooted guest busy on the same queue meanwhile.
    drop(host_file);
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        s.getattr(ROOT, None).unwrap();
    }
    let v = dev.violations();
    assert!(
        v.is_empty(),
        "a request from before the reboot was completed into the new rings: {v:?}"
    );
    cases.case("no stale completion in the new rings");
    assert_eq!(
        host::fd_count(pid),
        baseline,
        "{:#?}",
        host::fd_targets(pid)
    );
    cases.case("descriptors back to baseline");
    assert!(d.try_wait().unwrap().is_none(), "{}", d.log_contents());
}
