//! A hostile guest against the request queues: the FUSE header rewritten while the daemon
//! reads it, one descriptor head republished without end. Daemon: `VUFS_DAEMON`.

mod common;
#[path = "common/host.rs"]
mod host;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use daxfsd::abi::{self, opcode as op};
use vm_memory::ByteValued;
use vufs_driver::{Chain, DaemonKind, DriverConfig, Seg};

/// The guest address of the first buffer of the chain last made available on queue `q`
/// (direct descriptors).
fn last_head_buffer(dev: &vufs_driver::Device, q: usize) -> u64 {
    let queue = dev.queue(q).unwrap();
    let (desc, avail, _) = queue.ring_addrs();
    let mem = dev.mem();
    let idx: u16 = mem.read_obj(avail + 2).unwrap();
    let slot = u64::from(idx.wrapping_sub(1) % queue.size());
    let head: u16 = mem.read_obj(avail + 4 + 2 * slot).unwrap();
    mem.read_obj::<u64>(desc + 16 * u64::from(head)).unwrap()
}

/// The guest flips a request's opcode between GETATTR and SETLKW (on a file a host process
/// holds locked) while the daemon serves it. Once a SETLKW waits, QEMU's `stop` (GET_VRING_BASE)
/// must still finish within 3 s: the wait must be on a thread a vring stop interrupts, which
/// needs the daemon to choose the thread by the same opcode it then serves.
#[test]
fn opcode_flipped_while_served_never_stalls_a_vring_stop() {
    let kind = common::kind();
    if kind != DaemonKind::Daxfsd {
        eprintln!(
            "{}: serves no host POSIX locks (--posix-lock is daxfsd's); skipped",
            kind.name()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"locked").unwrap();
    let host_lock = vufs_driver::host_write_lock(&dir.path().join("f")).unwrap();
    // A thread pool: the request is read again on a pool thread, well after the choice.
    let d = host::spawn(&kind, dir.path(), &["--posix-lock", "--thread-pool-size=2"]);
    let cfg = DriverConfig {
        indirect_desc: vufs_driver::FeatureMode::Off,
        ..Default::default()
    };
    let s = host::connect(&d, &cfg);
    let dev = s.device().clone();
    let e = s.lookup(abi::ROOT_ID, "f").unwrap();
    let fh = s.open(e.nodeid, libc::O_RDWR as u32).unwrap().fh;
    let lk = vufs_driver::whole_file_write_lock(fh, 7);
    let body = lk.as_slice();
    let mut hdr = s.header(op::GETATTR, e.nodeid, body.len());
    hdr.unique = 1 << 40;
    let stop = AtomicBool::new(false);
    let mut stops = Vec::new();
    let mut tries = 0;
    let t_end = Instant::now() + Duration::from_secs(60);
    std::thread::scope(|sc| {
        let (dev2, stop2) = (&dev, &stop);
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        sc.spawn(move || {
            // The flipper: rewrites the opcode of the newest request as fast as it can.
            let mut addr = 0u64;
            let mut flip = false;
            while !stop2.load(Ordering::Relaxed) {
                while let Ok(a) = rx.try_recv() {
                    addr = a;
                }
                if addr != 0 {
                    let opc = if flip { op::SETLKW } else { op::GETATTR };
                    let _ = dev2.mem().write_obj(addr + 4, opc);
                    flip = !flip;
                }
            }
        });
        // Each request that does not complete at once waits for the host lock (a SETLKW):
        // stop the vrings (QEMU's `stop`), time it, resume; 12 such waits, or 60 s.
        while stops.len() < 12 && Instant::now() < t_end {
            tries += 1;
            hdr.unique += 1;
            let chain = Chain {
                segs: vec![
                    Seg::Readable(hdr.as_slice().to_vec()),
                    Seg::Readable(body.to_vec()),
                    Seg::Writable(16 + 120),
                ],
                indirect: false,
            };
            let p = dev.submit(1, &chain).unwrap();
            tx.send(last_head_buffer(&dev, 1)).unwrap();
            if p.wait(Duration::from_millis(300)).is_ok() {
                continue;
            }
            let t0 = Instant::now();
            let bases = dev.pause().unwrap();
            let took = t0.elapsed();
            eprintln!("request {tries} waited; GET_VRING_BASE on every vring took {took:?}");
            stops.push(took);
            dev.resume(&bases).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        !stops.is_empty(),
        "no request became a waiting SETLKW in {tries} tries"
    );
    let worst = stops.iter().max().unwrap();
    eprintln!(
        "{} stops with a SETLKW waiting, in {tries} requests; slowest {worst:?}",
        stops.len()
    );
    assert!(
        *worst < Duration::from_secs(3),
        "a vring stop took {worst:?}: the wait ran where a stop cannot interrupt it ({stops:?})"
    );
    drop(host_lock);
    s.getattr(e.nodeid, None).unwrap();
}
