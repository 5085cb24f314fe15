//! DAX beyond the happy path, against a frontend that behaves like QEMU 11.1: it holds at
//! most `QEMU_SLOT_LIMIT` mappings (each SHMEM_MAP is a memory region / KVM slot), serves no
//! backend request while it waits for a control-channel reply, and drops every mapping on a
//! device reset. Only daxfsd has a window; upstream virtiofsd gets a message and no checks.

mod common;
#[path = "common/host.rs"]
mod host;

use std::fs;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use daxfsd::abi::SETUPMAPPING_FLAG_WRITE as WRITE;
use daxfsd::abi::{self, RemovemappingOne, SETUPMAPPING_FLAG_READ as READ};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vm_memory::ByteValued;
use vufs_driver::dax::QEMU_SLOT_LIMIT;
use vufs_driver::DriverConfig;

const MIB2: u64 = 2 << 20;

/// 128 small files, each mapped writable in its own 2 MiB range of a 256 MiB window: mapped
/// naively (whole pages from the file + a tail) that is 256 frontend mappings, past QEMU's
/// slots. daxfsd folds tails so the frontend never holds more than its limit, every range
/// reads the file's bytes, and guest stores reach the files.
#[test]
fn map_storm_past_the_budget_stays_within_qemus_slots() {
    if !common::only_daxfsd("map_storm_past_the_budget_stays_within_qemus_slots") {
        return;
    }
    const N: usize = 128;
    let sizes: Vec<usize> = (0..N).map(|i| 4096 + 17 + i * 13).collect();
    let sz = sizes.clone();
    let mut r = common::start_with(
        &["--dax-window=256M", "--dax-mapping=direct"],
        &DriverConfig::default(),
        |d| {
            for (i, n) in sz.iter().enumerate() {
                fs::write(d.join(format!("f{i}")), common::bytes(*n, i as u8)).unwrap();
            }
        },
    );
    let w =
        r.s.dax()
            .cloned()
            .expect("daxfsd --dax-window=256M offered no window");
    assert_eq!(w.len(), 256 << 20);
    let mut handles = Vec::new();
    for i in 0..N {
        let e = r.s.lookup(abi::ROOT_ID, format!("f{i}")).unwrap();
        let o = r.s.open(e.nodeid, libc::O_RDWR as u32).unwrap();
        r.s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ | WRITE, i as u64 * MIB2)
            .unwrap_or_else(|err| panic!("SETUPMAPPING {i}: {err}\n{}", r.daemon.log_contents()));
        handles.push((e.nodeid, o.fh));
    }
    assert!(
        w.peak() <= QEMU_SLOT_LIMIT,
        "{} frontend mappings live at once, QEMU has {QEMU_SLOT_LIMIT}",
        w.peak()
    );
    assert!(
        w.mappings().len() > N,
        "tails fold only when short: {}",
        w.mappings().len()
    );
    for (i, n) in sizes.iter().enumerate() {
        let mut got = vec![0u8; 8192];
        w.read(i as u64 * MIB2, &mut got).unwrap();
        let mut want = common::bytes(*n, i as u8);
        want.resize(8192, 0);
        assert_eq!(got, want, "range {i}");
    }
    // Guest stores into every file's last page, then fsync: the host has them.
    for (i, (node, fh)) in handles.iter().enumerate() {
        w.write(i as u64 * MIB2 + 4096, b"GUEST").unwrap();
        r.s.fsync(*node, *fh, false).unwrap();
    }
    for (i, n) in sizes.iter().enumerate() {
        let host = fs::read(r.host(&format!("f{i}"))).unwrap();
        assert_eq!(host.len(), *n, "file {i} size");
        assert_eq!(&host[4096..4101], b"GUEST", "file {i}");
        assert_eq!(host[..4096], common::bytes(*n, i as u8)[..4096], "file {i}");
    }
    for (i, (node, fh)) in handles.iter().enumerate() {
        let one = RemovemappingOne {
            moffset: i as u64 * MIB2,
            len: MIB2,
        };
        r.s.removemapping(*node, &[one]).unwrap();
        r.s.release(*node, *fh, libc::O_RDWR as u32).unwrap();
    }
    assert!(w.mappings().is_empty(), "{:?}", w.mappings());
    let st = w.stats();
    assert_eq!((st.maps_rejected, st.unmaps_rejected), (0, 0), "{st:?}");
    r.assert_clean();
}

/// The guest stores into a file's tail page while the host writes other bytes of the same
/// page: after each sync point both sides' bytes are in the file and in the window. Tails
/// are direct mappings' (a pooled range keeps one hash per page of what it agreed with the
/// file, and a page both sides change between two merges is the guest's whole: see
/// daemon/src/dax/baseline.rs and its unit tests).
#[test]
fn host_writes_and_guest_tail_writes_both_survive() {
    if !common::only_daxfsd("host_writes_and_guest_tail_writes_both_survive") {
        return;
    }
    let len = 4096 + 2000;
    let args = ["--dax-window=64M", "--dax-mapping=direct"];
    let mut r = common::start_with(&args, &DriverConfig::default(), |d| {
        fs::write(d.join("t"), vec![b'.'; len]).unwrap();
    });
    let w = r.s.dax().cloned().expect("no window");
    let e = r.s.lookup(abi::ROOT_ID, "t").unwrap();
    let o = r.s.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    r.s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ | WRITE, 0)
        .unwrap();
    let host = fs::OpenOptions::new()
        .write(true)
        .open(r.host("t"))
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // The host writes even offsets 4096..6096 step 40, the guest odd ones step 40 + 21.
    let hthread = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut round = 0u8;
            while !stop.load(Ordering::Relaxed) {
                for off in (4096..4096 + 2000).step_by(40) {
                    host.write_all_at(&[b'a' + round % 26], off as u64).unwrap();
                }
                round = round.wrapping_add(1);
                std::thread::sleep(Duration::from_millis(1));
            }
            round
        })
    };
    for round in 0..30u8 {
        for off in (4096 + 21..4096 + 2000).step_by(40) {
            w.write(off as u64, &[b'A' + round % 26]).unwrap();
        }
        r.s.fsync(e.nodeid, o.fh, false).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = hthread.join().unwrap();
    r.s.fsync(e.nodeid, o.fh, false).unwrap();
    let file = fs::read(r.host("t")).unwrap();
    assert_eq!(file.len(), len);
    let mut win = vec![0u8; len];
    w.read(0, &mut win).unwrap();
    for off in (4096 + 21..4096 + 2000).step_by(40) {
        assert_eq!(
            file[off],
            b'A' + 29 % 26,
            "guest byte at {off} lost on the host"
        );
    }
    let last_host = b'a' + (rounds.wrapping_sub(1)) % 26;
    for off in (4096..4096 + 2000).step_by(40) {
        assert_eq!(file[off], last_host, "host byte at {off} clobbered");
        assert_eq!(
            win[off], last_host,
            "guest does not see the host byte at {off}"
        );
    }
    assert!(file[..4096].iter().all(|&b| b == b'.'));
    r.s.release(e.nodeid, o.fh, libc::O_RDWR as u32).unwrap();
    r.assert_clean();
}

/// Two inodes for one host file (the same directory bind-mounted twice inside the share):
/// their mappings of the file's last range share one tail, so neither's write-back can
/// overwrite the other's bytes with a stale copy.
#[test]
fn alias_inodes_share_a_tail() {
    if !common::only_daxfsd("alias_inodes_share_a_tail") {
        return;
    }
    let mut r = common::start_with(
        &["--dax-window=64M", "--dax-mapping=direct"],
        &DriverConfig::default(),
        |d| {
            fs::create_dir(d.join("a")).unwrap();
            fs::create_dir(d.join("b")).unwrap();
            fs::write(d.join("a/f"), b"0123456789").unwrap();
        },
    );
    let (a, b) = (r.host("a"), r.host("b"));
    let st = std::process::Command::new("mount")
        .arg("--bind")
        .arg(&a)
        .arg(&b)
        .status()
        .expect("running mount");
    assert!(
        st.success(),
        "alias_inodes_share_a_tail needs root to bind-mount a directory inside the share"
    );
    struct Umount(std::path::PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let _u = Umount(b.clone());
    let w = r.s.dax().cloned().expect("no window");
    let da = r.s.lookup(abi::ROOT_ID, "a").unwrap();
    let db = r.s.lookup(abi::ROOT_ID, "b").unwrap();
    let fa = r.s.lookup(da.nodeid, "f").unwrap();
    let fb = r.s.lookup(db.nodeid, "f").unwrap();
    let oa = r.s.open(fa.nodeid, libc::O_RDWR as u32).unwrap();
    let ob = r.s.open(fb.nodeid, libc::O_RDWR as u32).unwrap();
    r.s.setupmapping(fa.nodeid, oa.fh, 0, MIB2, READ | WRITE, 0)
        .unwrap();
    r.s.setupmapping(fb.nodeid, ob.fh, 0, MIB2, READ | WRITE, MIB2)
        .unwrap();
    // A store through one alias shows through the other at once (one memfd).
    w.write(2, b"AB").unwrap();
    w.write(MIB2 + 6, b"CD").unwrap();
    let mut via_b = [0u8; 10];
    w.read(MIB2, &mut via_b).unwrap();
    assert_eq!(&via_b, b"01AB45CD89");
    // Sync points of both inodes, in either order: both stores reach the file.
    r.s.fsync(fb.nodeid, ob.fh, false).unwrap();
    r.s.fsync(fa.nodeid, oa.fh, false).unwrap();
    assert_eq!(fs::read(r.host("a/f")).unwrap(), b"01AB45CD89");
    for (n, o, m) in [(fa.nodeid, oa.fh, 0), (fb.nodeid, ob.fh, MIB2)] {
        r.s.removemapping(
            n,
            &[RemovemappingOne {
                moffset: m,
                len: MIB2,
            }],
        )
        .unwrap();
        r.s.release(n, o, libc::O_RDWR as u32).unwrap();
    }
    r.assert_clean();
}

/// A frontend that is slow to answer SHMEM requests and, like QEMU's main loop, answers none
/// while it waits for the reply to GET_VRING_BASE / RESET_DEVICE, resets the device again
/// and again under a storm of SETUPMAPPING/REMOVEMAPPING. Nothing may hang: every reset
/// completes, the daemon serves a new session after each, and at the end its view of the
/// window agrees with the frontend's.
#[test]
fn resets_race_a_map_storm_with_delayed_frontend_replies() {
    if !common::only_daxfsd("resets_race_a_map_storm_with_delayed_frontend_replies") {
        return;
    }
    let data = common::bytes(8 << 20, 9);
    let d2 = data.clone();
    // RESET_DEVICE too (QEMU negotiates it when the backend offers it).
    let cfg = DriverConfig {
        protocol_features: DriverConfig::default().protocol_features
            | VhostUserProtocolFeatures::RESET_DEVICE,
        ..DriverConfig::default()
    };
    let mut r = common::start_with(&["--dax-window=64M", "--queues=2"], &cfg, |d| {
        fs::write(d.join("big"), &d2).unwrap();
        fs::write(d.join("small"), b"tail").unwrap();
    });
    let w = r.s.dax().cloned().expect("no window");
    w.set_reply_delay(Duration::from_millis(5));
    let dev = r.s.device().clone();
    dev.set_timeout(Duration::from_secs(2));
    let maps = Arc::new(AtomicU64::new(0));
    for round in 0..4 {
        let stop = Arc::new(AtomicBool::new(false));
        let storm = {
            let (stop, maps) = (stop.clone(), maps.clone());
            let s = r.s.on_queue(1).unwrap();
            std::thread::spawn(move || {
                let Ok(e) = s.lookup(abi::ROOT_ID, "big") else {
                    return;
                };
                let Ok(o) = s.open(e.nodeid, libc::O_RDWR as u32) else {
                    return;
                };
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let m = (i % 32) * MIB2;
                    let f = (i % 4) * MIB2;
                    let flags = if i % 3 == 0 { READ | WRITE } else { READ };
                    if s.setupmapping(e.nodeid, o.fh, f, MIB2, flags, m).is_ok() {
                        maps.fetch_add(1, Ordering::Relaxed);
                    }
                    if i % 5 == 4 {
                        let _ = s.removemapping(
                            e.nodeid,
                            &[RemovemappingOne {
                                moffset: m,
                                len: MIB2,
                            }],
                        );
                    }
                    i += 1;
                }
            })
        };
        std::thread::sleep(Duration::from_millis(150));
        // QEMU's main loop blocks in GET_VRING_BASE/RESET_DEVICE and serves no SHMEM
        // request meanwhile: the backend must answer the control requests anyway.
        let t0 = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let (w, dev) = (w.clone(), dev.clone());
            std::thread::spawn(move || {
                let _held = w.hold_backend_channel();
                let _ = tx.send(dev.stop(true));
            });
        }
        let bases = rx.recv_timeout(Duration::from_secs(20));
        let took = t0.elapsed();
        assert!(
            matches!(bases, Ok(Ok(_))),
            "round {round}: device stop/reset did not complete ({took:?}): {bases:?}\n{}",
            r.daemon.log_contents()
        );
        // A request waiting for the frontend's reply must not hold the vring's base back
        // (QEMU would sit in GET_VRING_BASE for the daemon's whole drain timeout).
        assert!(
            took < Duration::from_secs(3),
            "round {round}: device stop/reset took {took:?}"
        );
        stop.store(true, Ordering::Relaxed);
        storm.join().unwrap();
        dev.restart().unwrap();
        r.s.init().unwrap_or_else(|e| {
            panic!(
                "round {round}: INIT after reset: {e}\n{}",
                r.daemon.log_contents()
            )
        });
    }
    assert!(maps.load(Ordering::Relaxed) > 0, "the storm mapped nothing");
    // A fresh session maps and reads correct bytes, and the frontend's table holds exactly
    // what this session mapped (no stale mapping refused the new ones).
    w.set_reply_delay(Duration::ZERO);
    let e = r.s.lookup(abi::ROOT_ID, "big").unwrap();
    let o = r.s.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    for k in 0..4u64 {
        r.s.setupmapping(e.nodeid, o.fh, k * MIB2, MIB2, READ, k * MIB2)
            .unwrap_or_else(|err| panic!("map {k}: {err}\n{}", r.daemon.log_contents()));
    }
    let mut got = vec![0u8; 4096];
    for k in 0..4u64 {
        w.read(k * MIB2 + 8192, &mut got).unwrap();
        let at = (k * MIB2 + 8192) as usize;
        assert_eq!(got, data[at..at + 4096], "range {k}");
    }
    let live: Vec<u64> = w.mappings().iter().map(|m| m.shm_offset).collect();
    let want = if vufs_driver::dax::pooled() {
        vec![0]
    } else {
        vec![0, MIB2, 2 * MIB2, 3 * MIB2]
    };
    assert_eq!(live, want, "frontend table");
    r.s.release(e.nodeid, o.fh, libc::O_RDONLY as u32).unwrap();
    // Requests the frontend saw outside a started device are what a reset raced (sent
    // before the reset, read by the frontend after it): none may come after a restart.
    let v = dev.violations();
    assert!(
        v.iter().all(|s| !s.contains("memory slots")),
        "slot violations: {v:?}"
    );
    assert!(r.daemon.try_wait().unwrap().is_none(), "daemon exited");
}

/// Issue #10: QEMU 11.1 reads the backend channel only after its whole vhost_dev_stop has
/// returned, and then segfaults on any SHMEM request (NULL device pointer). A SETUPMAPPING
/// over a live range (UNMAP then MAP) whose UNMAP reply comes while GET_VRING_BASE waits for
/// it must not send its MAP: the driver records every request it reads after the stop began.
/// After `cont` the window maps again and reads the file's bytes.
#[test]
fn pause_during_a_remap_sends_no_shmem_request() {
    if !common::only_daxfsd("pause_during_a_remap_sends_no_shmem_request") {
        return;
    }
    let data = common::bytes(4 << 20, 3);
    let d2 = data.clone();
    let mut r = common::start_with(&["--dax-window=64M"], &DriverConfig::default(), |d| {
        fs::write(d.join("big"), &d2).unwrap();
    });
    let w = r.s.dax().cloned().expect("no window");
    let dev = r.s.device().clone();
    let e = r.s.lookup(abi::ROOT_ID, "big").unwrap();
    let o = r.s.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    r.s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ, 0).unwrap();
    for round in 0..3 {
        // The frontend reads the UNMAP at once and answers it 150 ms later, inside the
        // daemon's drain (which waits 200 ms for requests waiting on the frontend).
        w.set_reply_delay(Duration::from_millis(150));
        let remap = {
            let s = r.s.on_queue(1).unwrap();
            let (node, fh) = (e.nodeid, o.fh);
            std::thread::spawn(move || s.setupmapping(node, fh, MIB2, MIB2, READ | WRITE, 0))
        };
        std::thread::sleep(Duration::from_millis(50));
        let bases = dev.pause().unwrap();
        let res = remap.join().unwrap();
        let v = dev.violations();
        assert!(
            v.is_empty(),
            "round {round}: requests sent during the stop: {v:?}\n{}",
            r.daemon.log_contents()
        );
        // Refused (the frontend cannot map now) or done; never a lost mapping.
        if let Err(err) = &res {
            assert_eq!(common::errno(err), libc::EIO, "round {round}: {err}");
        }
        w.set_reply_delay(Duration::ZERO);
        dev.resume(&bases).unwrap();
        r.s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ, 0)
            .unwrap_or_else(|err| {
                panic!(
                    "round {round}: map after cont: {err}\n{}",
                    r.daemon.log_contents()
                )
            });
        let mut got = vec![0u8; 4096];
        w.read(8192, &mut got).unwrap();
        assert_eq!(got, data[8192..8192 + 4096], "round {round}: window bytes");
    }
    r.assert_clean();
}

/// Guest stores into a tail reach the file on SYNCFS and on FSYNCDIR (the guest's `sync`)
/// without any request on the file itself, and, with no request at all, within the periodic
/// write-back: a SIGKILL of the daemon after that loses nothing.
#[test]
fn syncfs_fsyncdir_and_the_periodic_write_back_reach_the_file() {
    if !common::only_daxfsd("syncfs_fsyncdir_and_the_periodic_write_back_reach_the_file") {
        return;
    }
    let mut r = common::start_with(&["--dax-window=64M"], &DriverConfig::default(), |d| {
        fs::write(d.join("s"), vec![b'.'; 100]).unwrap();
    });
    let w = r.s.dax().cloned().expect("no window");
    let e = r.s.lookup(abi::ROOT_ID, "s").unwrap();
    let o = r.s.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    r.s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ | WRITE, 0)
        .unwrap();
    let path = r.host("s");
    let host = || fs::read(&path).unwrap();

    w.write(10, b"SYNCFS").unwrap();
    let syncfs = abi::SyncfsIn::default();
    r.s.call(abi::opcode::SYNCFS, abi::ROOT_ID, &[syncfs.as_slice()], 0)
        .unwrap();
    assert_eq!(&host()[10..16], b"SYNCFS", "SYNCFS wrote the tail back");

    w.write(20, b"FSYNCDIR").unwrap();
    let d = r.s.opendir(abi::ROOT_ID, 0).unwrap();
    let a = abi::FsyncIn {
        fh: d.fh,
        ..Default::default()
    };
    r.s.call(abi::opcode::FSYNCDIR, abi::ROOT_ID, &[a.as_slice()], 0)
        .unwrap();
    assert_eq!(&host()[20..28], b"FSYNCDIR", "FSYNCDIR wrote the tail back");
    r.s.releasedir(abi::ROOT_ID, d.fh, 0).unwrap();

    // No request: the periodic write-back (every 5 s) is the bound on what SIGKILL loses.
    w.write(40, b"PERIODIC").unwrap();
    let t0 = Instant::now();
    while &host()[40..48] != b"PERIODIC" && t0.elapsed() < Duration::from_secs(12) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(&host()[40..48], b"PERIODIC", "not written back within 12 s");
    r.daemon.kill().unwrap();
    let h = host();
    assert_eq!(h.len(), 100, "size unchanged");
    assert_eq!(&h[10..16], b"SYNCFS");
}

/// DESTROY (the guest unmounts; the device is not reset) ends the session: every mapping
/// leaves the frontend too, with guest stores written back first, and a new session starts
/// from an empty window.
#[test]
fn destroy_unmaps_every_mapping() {
    if !common::only_daxfsd("destroy_unmaps_every_mapping") {
        return;
    }
    let mut r = common::start_with(&["--dax-window=64M"], &DriverConfig::default(), |d| {
        fs::write(d.join("big"), common::bytes(5 << 20, 3)).unwrap();
        fs::write(d.join("small"), b"small file").unwrap();
    });
    let w = r.s.dax().cloned().expect("no window");
    let big = r.s.lookup(abi::ROOT_ID, "big").unwrap();
    let small = r.s.lookup(abi::ROOT_ID, "small").unwrap();
    let ob = r.s.open(big.nodeid, libc::O_RDONLY as u32).unwrap();
    let os = r.s.open(small.nodeid, libc::O_RDWR as u32).unwrap();
    for k in 0..3 {
        r.s.setupmapping(big.nodeid, ob.fh, k * MIB2, MIB2, READ, k * MIB2)
            .unwrap();
    }
    r.s.setupmapping(small.nodeid, os.fh, 0, MIB2, READ | WRITE, 8 * MIB2)
        .unwrap();
    w.write(8 * MIB2, b"SMALL").unwrap();
    // Direct: at least one frontend mapping per guest mapping; pooled: the pool.
    let least = if vufs_driver::dax::pooled() { 1 } else { 4 };
    assert!(w.mappings().len() >= least, "{:?}", w.mappings());
    r.s.destroy().unwrap();
    assert!(
        w.mappings().is_empty(),
        "left after DESTROY: {:?}",
        w.mappings()
    );
    assert_eq!(fs::read(r.host("small")).unwrap(), b"SMALL file");
    r.s.init().unwrap();
    let big = r.s.lookup(abi::ROOT_ID, "big").unwrap();
    let ob = r.s.open(big.nodeid, libc::O_RDONLY as u32).unwrap();
    r.s.setupmapping(big.nodeid, ob.fh, 0, MIB2, READ, 0)
        .unwrap();
    let mut got = vec![0u8; 4096];
    w.read(4096, &mut got).unwrap();
    assert_eq!(got, common::bytes(5 << 20, 3)[4096..8192]);
    let st = w.stats();
    assert_eq!((st.maps_rejected, st.unmaps_rejected), (0, 0), "{st:?}");
    r.assert_clean();
}

/// Issue #36: the share's file system fills up under a pooled window. The guest's stores
/// into a sparse file cannot be written back: FSYNC and FLUSH fail with ENOSPC (never 0),
/// REMOVEMAPPING keeps the bytes, and once the host frees space the next FSYNC writes them
/// and succeeds. Root (a 4 MiB tmpfs as the share).
#[test]
fn a_full_share_fails_fsync_until_space_is_freed() {
    if !common::only_daxfsd("a_full_share_fails_fsync_until_space_is_freed") {
        return;
    }
    let t = host::Tmpfs::mount("4M")
        .expect("a_full_share_fails_fsync_until_space_is_freed needs root to mount a tmpfs");
    let sparse = fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(t.path.join("sparse"))
        .unwrap();
    sparse.set_len(2 * MIB2).unwrap();
    // Fill the file system.
    let filler = fs::File::create(t.path.join("filler")).unwrap();
    let chunk = vec![1u8; 64 << 10];
    let mut at = 0u64;
    while filler.write_all_at(&chunk, at).is_ok() {
        at += chunk.len() as u64;
    }
    let d = host::spawn(
        &host::daxfsd(),
        &t.path,
        &["--dax-window=64M", "--dax-mapping=pooled"],
    );
    let s = host::connect(&d, &DriverConfig::default());
    let w = s.dax().cloned().expect("no window");
    let e = s.lookup(abi::ROOT_ID, "sparse").unwrap();
    let o1 = s.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    let o2 = s.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    s.setupmapping(e.nodeid, o1.fh, 0, MIB2, READ | WRITE, 0)
        .unwrap();
    let data = common::bytes(MIB2 as usize, 9);
    w.write(0, &data).unwrap();
    let enospc = |r: std::io::Result<()>, what: &str| {
        let err = r.expect_err(&format!("{what} succeeded on a full file system"));
        assert_eq!(common::errno(&err), libc::ENOSPC, "{what}: {err}");
    };
    enospc(s.fsync(e.nodeid, o1.fh, false), "FSYNC");
    enospc(
        s.fsync(e.nodeid, o1.fh, false),
        "a second FSYNC (bytes still not written)",
    );
    enospc(s.flush(e.nodeid, o2.fh, 0), "FLUSH of another handle");
    // The guest drops the range: its bytes must not go with it.
    s.removemapping(
        e.nodeid,
        &[RemovemappingOne {
            moffset: 0,
            len: MIB2,
        }],
    )
    .unwrap();
    enospc(s.fsync(e.nodeid, o1.fh, false), "FSYNC after REMOVEMAPPING");
    drop(filler);
    fs::remove_file(t.path.join("filler")).unwrap();
    s.fsync(e.nodeid, o1.fh, false)
        .expect("FSYNC once the host freed space");
    let mut got = vec![0u8; MIB2 as usize];
    sparse.read_exact_at(&mut got, 0).unwrap();
    assert!(got == data, "the guest's bytes reached the file");
    // The other handle last looked at its FLUSH; the failures since are reported to it once.
    enospc(
        s.fsync(e.nodeid, o2.fh, false),
        "FSYNC of the other handle, the failures since its FLUSH",
    );
    s.fsync(e.nodeid, o2.fh, false)
        .expect("an error is reported once per handle");
    s.fsync(e.nodeid, o1.fh, false).expect("and once");
    assert!(d.log_contents().contains("ENOSPC") || d.log_contents().contains("No space"));
}
