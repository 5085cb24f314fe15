//! The VM lifecycle at the protocol level: a pause (every vring stopped with GET_VRING_BASE,
//! then started again from the reported bases, as QEMU's `stop`/`cont`, snapshots and the
//! source of a migration do) keeps the guest's FUSE session; requests in flight when a vring
//! stops complete before its base is reported; a request that waits on a lock never stalls
//! the other requests of its queue; an oversized request is refused before the daemon
//! allocates anything for it.
//!
//! Daemon: `pause_resume_keeps_the_session` runs against `VUFS_DAEMON` (upstream virtiofsd
//! by default: proof the test is right); the others need daxfsd features (remote POSIX
//! locks, its pool) or measure daxfsd's memory, and select daxfsd explicitly.

mod common;
#[path = "common/host.rs"]
mod host;

use std::fs;
use std::time::{Duration, Instant};

use daxfsd::abi::{self, opcode as op};
use host::Cases;
use vm_memory::ByteValued;
use vufs_driver::{Chain, DriverConfig, Seg, Session};

const ROOT: u64 = abi::ROOT_ID;

/// The error field of a completion's out-header.
fn reply_error(c: &vufs_driver::Completion) -> i32 {
    c.error()
        .unwrap_or_else(|| panic!("no reply header in {} bytes", c.data.len()))
}

fn setlkw(s: &Session, nodeid: u64, fh: u64) -> Chain {
    let lk = vufs_driver::whole_file_write_lock(fh, 1);
    s.linux_chain(op::SETLKW, nodeid, &[lk.as_slice()], 0)
}

/// stop/cont in QEMU's monitor: every node id, file handle and directory handle the guest
/// had before the pause works after it, and the share is writable.
#[test]
fn pause_resume_keeps_the_session() {
    let mut cases = Cases::new("lifecycle", "pause_resume_keeps_the_session");
    let r = common::start_with(&[], &DriverConfig::default(), |root| {
        fs::write(root.join("kept"), b"written before the pause").unwrap();
        fs::create_dir(root.join("dir")).unwrap();
        fs::write(root.join("dir/inner"), b"x").unwrap();
    });
    let s = &r.s;
    let dev = s.device().clone();
    let e = s.lookup(ROOT, "kept").unwrap();
    let fh = s.open(e.nodeid, libc::O_RDWR as u32).unwrap().fh;
    let d = s.lookup(ROOT, "dir").unwrap();
    let dh = s.opendir(d.nodeid, libc::O_RDONLY as u32).unwrap().fh;

    for round in 0..3 {
        let bases = dev.pause().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        dev.resume(&bases).unwrap();

        assert_eq!(
            s.read(e.nodeid, fh, 0, 64).unwrap(),
            b"written before the pause",
            "round {round}"
        );
        let a = s.getattr(e.nodeid, None).unwrap();
        assert_eq!(a.attr.size, 24);
        let names = s.readdir(d.nodeid, dh, 0, 4096).unwrap();
        assert!(
            names.iter().any(|n| n.name == b"inner"),
            "readdir through a pre-pause dir handle: {names:?}"
        );
        let name = format!("after{round}");
        let (c, ch) = s
            .create(
                ROOT,
                &name,
                (libc::O_RDWR | libc::O_CREAT) as u32,
                libc::S_IFREG | 0o644,
                0,
            )
            .unwrap();
        assert_eq!(s.write(c.nodeid, ch.fh, 0, b"new").unwrap(), 3);
        s.release(c.nodeid, ch.fh, 0).unwrap();
        assert_eq!(fs::read(r.host(&name)).unwrap(), b"new");
    }
    cases.case("fd, node id and dir handle from before three pauses work after them");
    cases.case("create and write after a pause");
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
}

/// A request in flight when the vrings stop completes before GET_VRING_BASE returns: a
/// SETLKW waiting for a lock the host holds gives up with EINTR (the guest retries it), and
/// the pause does not wait for the lock.
#[test]
fn pause_completes_requests_in_flight() {
    let mut cases = Cases::new("lifecycle", "pause_completes_requests_in_flight");
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("locked"), b"data").unwrap();
    // Remote POSIX locks are opt-in (as in virtiofsd).
    let d = host::spawn(&host::daxfsd(), dir.path(), &["--posix-lock"]);
    let s = host::connect(&d, &DriverConfig::default());
    let dev = s.device().clone();
    let held = vufs_driver::host_write_lock(&dir.path().join("locked")).unwrap();
    let e = s.lookup(ROOT, "locked").unwrap();
    let fh = s.open(e.nodeid, libc::O_RDWR as u32).unwrap().fh;

    let waiting = dev.submit(1, &setlkw(&s, e.nodeid, fh)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let bases = dev.pause().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "GET_VRING_BASE waited {:?} for a lock",
        t0.elapsed()
    );
    cases.case("pause with a waiting SETLKW returns promptly");
    let c = waiting
        .wait(Duration::from_secs(1))
        .expect("the waiting SETLKW was completed before the base was reported");
    assert_eq!(reply_error(&c), -libc::EINTR);
    cases.case("the waiting SETLKW completed (EINTR) before the base was reported");

    dev.resume(&bases).unwrap();
    assert_eq!(s.read(e.nodeid, fh, 0, 16).unwrap(), b"data");
    drop(held);
    // The guest retries: now it gets the lock.
    let again = dev.submit(1, &setlkw(&s, e.nodeid, fh)).unwrap();
    let c = again.wait(Duration::from_secs(5)).unwrap();
    assert_eq!(reply_error(&c), 0);
    cases.case("after resume the same handle reads and locks");
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
}

/// A SETLKW waiting on a lock must not hold up the other requests of its queue, with
/// requests served on the queue's thread (`--thread-pool-size 0`, and 1 with one queue) or
/// by a pool of two.
#[test]
fn waiting_lock_does_not_stall_its_queue() {
    for pool in ["--thread-pool-size=0", "--thread-pool-size=2"] {
        let mut cases = Cases::new("lifecycle", "waiting_lock_does_not_stall_its_queue");
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("locked"), b"data").unwrap();
        fs::write(dir.path().join("other"), vec![7u8; 65536]).unwrap();
        let d = host::spawn(&host::daxfsd(), dir.path(), &[pool, "--posix-lock"]);
        let s = host::connect(&d, &DriverConfig::default());
        let dev = s.device().clone();
        let held = vufs_driver::host_write_lock(&dir.path().join("locked")).unwrap();
        let e = s.lookup(ROOT, "locked").unwrap();
        let fh = s.open(e.nodeid, libc::O_RDWR as u32).unwrap().fh;
        let o = s.lookup(ROOT, "other").unwrap();
        let ofh = s.open(o.nodeid, libc::O_RDONLY as u32).unwrap().fh;

        let waiting: Vec<_> = (0..4)
            .map(|_| dev.submit(1, &setlkw(&s, e.nodeid, fh)).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        for i in 0..200u64 {
            let data = s.read(o.nodeid, ofh, (i % 16) * 4096, 4096).unwrap();
            assert_eq!(data, vec![7u8; 4096]);
            s.getattr(ROOT, None).unwrap();
        }
        let took = t0.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "{pool}: 400 requests behind 4 waiting SETLKWs took {took:?}"
        );
        cases.case(format!(
            "{pool}: reads and getattrs pass 4 waiting SETLKWs ({took:?})"
        ));
        drop(held);
        let mut granted = 0;
        for w in waiting {
            if reply_error(&w.wait(Duration::from_secs(5)).unwrap()) == 0 {
                granted += 1;
            }
        }
        // Same owner and handle: the first waiter takes the lock, the others then share it.
        assert!(granted >= 1, "{pool}: no waiter got the lock");
        cases.case(format!(
            "{pool}: the waiters complete once the host lets go"
        ));
        assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    }
}

/// Peak resident memory of a process (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A request whose descriptors alias the same guest pages can claim gigabytes of payload.
/// The daemon refuses it by its length alone: its peak memory does not move.
#[test]
fn oversized_requests_are_refused_before_allocation() {
    let mut cases = Cases::new(
        "lifecycle",
        "oversized_requests_are_refused_before_allocation",
    );
    let dir = tempfile::tempdir().unwrap();
    let mut d = host::spawn(&host::daxfsd(), dir.path(), &["--xattr"]);
    let cfg = DriverConfig::default();
    let s = host::connect(&d, &cfg);
    let dev = s.device().clone();
    let pid = d.pid().unwrap();
    // Settle the daemon's own allocations first.
    for _ in 0..50 {
        s.getattr(ROOT, None).unwrap();
    }
    let before = peak_rss_kib(pid);

    // 16 descriptors of 60 MiB each over the same guest memory: 960 MiB of "payload".
    let alias = Seg::Raw {
        addr: cfg.mem_base,
        len: 60 << 20,
        writable: false,
    };
    let claimed: usize = 16 * (60 << 20);
    for opcode in [
        op::SETXATTR,
        op::SYMLINK,
        op::WRITE,
        op::MKNOD,
        op::BATCH_FORGET,
    ] {
        let hdr = s.header(opcode, ROOT, claimed);
        let mut segs = vec![Seg::Readable(hdr.as_slice().to_vec())];
        segs.extend(std::iter::repeat_n(alias.clone(), 16));
        segs.push(Seg::Writable(16));
        let c = dev
            .submit(
                1,
                &Chain {
                    segs,
                    indirect: true,
                },
            )
            .unwrap()
            .wait(Duration::from_secs(10))
            .unwrap();
        if opcode != op::BATCH_FORGET {
            assert_eq!(reply_error(&c), -libc::EINVAL, "{}", op::name(opcode));
        }
    }
    let after = peak_rss_kib(pid);
    assert!(
        after < before + 8 * 1024,
        "peak RSS grew from {before} KiB to {after} KiB for refused requests"
    );
    cases.case(format!(
        "5 requests claiming 960 MiB each refused; peak RSS {before} -> {after} KiB"
    ));
    assert!(
        host::wait_log(&d, Duration::from_secs(2), |l| l
            .contains("exceeds the opcode's limit")),
        "no log line for the refused requests:\n{}",
        d.log_contents()
    );
    cases.case("refusals logged");
    s.getattr(ROOT, None).unwrap();
    assert!(d.try_wait().unwrap().is_none(), "{}", d.log_contents());
}
