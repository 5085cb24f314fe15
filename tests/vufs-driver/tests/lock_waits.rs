//! Guest POSIX lock waits against the capacity that ends them: waiters must never hold the
//! threads the holder's close (FLUSH) needs. Daemon: `VUFS_DAEMON` (daxfsd only: upstream
//! virtiofsd serves no host POSIX locks).

mod common;
#[path = "common/host.rs"]
mod host;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use daxfsd::abi::{self, opcode as op};
use vm_memory::ByteValued;
use vufs_driver::{DaemonKind, DriverConfig};

/// An overlayfs mount (lower, upper and work directories under `dir`), unmounted on drop.
/// FLUSH on overlayfs is a long request for daxfsd: the host close runs overlayfs' `flush`.
struct Overlay {
    merged: PathBuf,
}

impl Overlay {
    fn mount(dir: &Path) -> Overlay {
        for d in ["lower", "upper", "work", "merged"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let merged = dir.join("merged");
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            dir.join("lower").display(),
            dir.join("upper").display(),
            dir.join("work").display()
        );
        let st = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(&merged)
            .status()
            .unwrap();
        assert!(
            st.success(),
            "mounting overlayfs on {merged:?} (needs root)"
        );
        Overlay { merged }
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.merged).status();
    }
}

/// One guest owner holds a write lock on a file of an overlayfs share, 65 more wait for it
/// with SETLKW (more than the 64 threads lock waits may take), then the holder closes the
/// file: its FLUSH must run and free the lock, and every waiter must get the lock in turn
/// (each closes again, freeing it for the next). With waits and FLUSH on one pool of 64
/// threads, the FLUSH queued behind the waiters for ever.
#[test]
fn sixty_five_lock_waiters_never_starve_the_holders_close() {
    let kind = common::kind();
    if kind != DaemonKind::Daxfsd {
        eprintln!(
            "{}: serves no host POSIX locks (--posix-lock is daxfsd's); skipped",
            kind.name()
        );
        return;
    }
    const WAITERS: u64 = 65;
    let tmp = tempfile::tempdir().unwrap();
    let ovl = Overlay::mount(tmp.path());
    std::fs::write(ovl.merged.join("f"), b"locked").unwrap();
    let d = host::spawn(&kind, &ovl.merged, &["--posix-lock"]);
    let cfg = DriverConfig {
        queue_size: 512,
        ..Default::default()
    };
    let s = host::connect(&d, &cfg);
    let dev = s.device().clone();
    let e = s.lookup(abi::ROOT_ID, "f").unwrap();
    let fh = s.open(e.nodeid, libc::O_RDWR as u32).unwrap().fh;
    // The holder: owner 1.
    let lk = vufs_driver::whole_file_write_lock(fh, 1);
    s.call(op::SETLK, e.nodeid, &[lk.as_slice()], 0).unwrap();
    // The waiters: owners 2..=66, each request on its own thread's wait.
    let (tx, rx) = mpsc::channel::<(u64, Result<i32, String>)>();
    let mut waiting = Vec::new();
    for owner in 2..2 + WAITERS {
        let lk = vufs_driver::whole_file_write_lock(fh, owner);
        let chain = s.linux_chain(op::SETLKW, e.nodeid, &[lk.as_slice()], 0);
        let p = dev.submit(1, &chain).unwrap();
        let tx = tx.clone();
        waiting.push(std::thread::spawn(move || {
            let r = p
                .wait(Duration::from_secs(120))
                .map(|c| c.error().unwrap_or(i32::MIN))
                .map_err(|e| e.to_string());
            let _ = tx.send((owner, r));
        }));
    }
    drop(tx);
    // Every waiter is in (the daemon polls for the lock); none has it.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        rx.try_recv().is_err(),
        "a waiter completed while the holder held the lock"
    );
    // The holder closes the file: FLUSH with its lock owner.
    let t0 = Instant::now();
    let flushed = std::thread::scope(|sc| {
        let h = sc.spawn(|| s.flush(e.nodeid, fh, 1));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !h.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        h.is_finished().then(|| h.join().unwrap())
    });
    let took = t0.elapsed();
    eprintln!("the holder's FLUSH with {WAITERS} waiters: {flushed:?} after {took:?}");
    let Some(flushed) = flushed else {
        panic!(
            "the holder's FLUSH did not complete in 10 s with {WAITERS} lock waiters \
             (queued behind them)"
        );
    };
    flushed.unwrap();
    // Each waiter gets the lock in turn, and its own close frees it for the next.
    let mut got = Vec::new();
    let t1 = Instant::now();
    while (got.len() as u64) < WAITERS {
        let (owner, r) = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| {
                panic!(
                    "{} of {WAITERS} waiters had the lock; none more for 30 s",
                    got.len()
                )
            });
        assert_eq!(r, Ok(0), "waiter {owner}");
        got.push(owner);
        s.flush(e.nodeid, fh, owner).unwrap();
    }
    eprintln!(
        "all {WAITERS} waiters had the lock in turn, in {:?}",
        t1.elapsed()
    );
    for t in waiting {
        t.join().unwrap();
    }
    s.release(e.nodeid, fh, 0).unwrap();
    drop(s);
    drop(d);
}

/// 65 guest owners wait for a lock a host process holds: more waits than the 64 threads lock
/// waits may take, so one is still queued when QEMU stops the vrings. The stop interrupts
/// every wait, the queued one too once it starts (EINTR, which the guest retries): it must
/// return within 3 s, not after the daemon's 10 s drain timeout.
#[test]
fn a_vring_stop_interrupts_sixty_five_lock_waiters() {
    let kind = common::kind();
    if kind != DaemonKind::Daxfsd {
        eprintln!(
            "{}: serves no host POSIX locks (--posix-lock is daxfsd's); skipped",
            kind.name()
        );
        return;
    }
    const WAITERS: u64 = 65;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), b"locked").unwrap();
    let host_lock = vufs_driver::host_write_lock(&tmp.path().join("f")).unwrap();
    let d = host::spawn(&kind, tmp.path(), &["--posix-lock"]);
    let cfg = DriverConfig {
        queue_size: 512,
        ..Default::default()
    };
    let s = host::connect(&d, &cfg);
    let dev = s.device().clone();
    let e = s.lookup(abi::ROOT_ID, "f").unwrap();
    let fh = s.open(e.nodeid, libc::O_RDWR as u32).unwrap().fh;
    let mut pending = Vec::new();
    for owner in 1..=WAITERS {
        let lk = vufs_driver::whole_file_write_lock(fh, owner);
        let chain = s.linux_chain(op::SETLKW, e.nodeid, &[lk.as_slice()], 0);
        pending.push(dev.submit(1, &chain).unwrap());
    }
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    let bases = dev.pause().unwrap();
    let took = t0.elapsed();
    eprintln!("GET_VRING_BASE with {WAITERS} lock waiters: {took:?}");
    let mut interrupted = 0;
    for p in pending {
        let c = p
            .wait(Duration::from_secs(1))
            .expect("completed by the stop");
        assert_eq!(c.error(), Some(-libc::EINTR));
        interrupted += 1;
    }
    assert_eq!(interrupted, WAITERS);
    assert!(
        took < Duration::from_secs(3),
        "a vring stop with {WAITERS} lock waiters took {took:?}"
    );
    dev.resume(&bases).unwrap();
    drop(host_lock);
    s.getattr(e.nodeid, None).unwrap();
}
