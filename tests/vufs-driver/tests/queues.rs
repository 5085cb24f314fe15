//! Virtqueue mechanics against a real backend: feature variants (EVENT_IDX, indirect
//! descriptors, tiny rings), ring index wrap-around, pipelined requests and several threads.

mod common;

use std::fs;
use std::thread;

use daxfsd::abi::{self, opcode, GetattrIn, InHeader};
use vm_memory::ByteValued;
use vufs_driver::{Chain, DriverConfig, FeatureMode, Seg};

const ROOT: u64 = abi::ROOT_ID;

/// A write/read/getattr workload of `n` rounds on one file; checks the data every round.
fn workload(r: &common::Rig, name: &str, n: usize) {
    let flags = (libc::O_RDWR | libc::O_CREAT) as u32;
    let (e, o) =
        r.s.create(ROOT, name, flags, libc::S_IFREG | 0o644, 0)
            .unwrap();
    for i in 0..n {
        let data = format!("{name}:{i:08}").into_bytes();
        let off = (i % 7 * 4096) as u64;
        assert_eq!(
            r.s.write(e.nodeid, o.fh, off, &data).unwrap() as usize,
            data.len()
        );
        assert_eq!(
            r.s.read(e.nodeid, o.fh, off, data.len() as u32).unwrap(),
            data
        );
        assert!(r.s.getattr(e.nodeid, None).unwrap().attr.size >= off + data.len() as u64);
    }
    r.s.release(e.nodeid, o.fh, flags).unwrap();
    r.s.forget(e.nodeid, 1).unwrap();
}

#[test]
fn feature_and_ring_size_variants() {
    let variants = [
        // Without indirect descriptors a WRITE chain takes 5 ring entries.
        (FeatureMode::Off, FeatureMode::Off, 8u16),
        (FeatureMode::On, FeatureMode::Off, 8),
        (FeatureMode::Off, FeatureMode::On, 2),
        (FeatureMode::On, FeatureMode::On, 1024),
    ];
    for (event_idx, indirect, queue_size) in variants {
        let cfg = DriverConfig {
            event_idx,
            indirect_desc: indirect,
            queue_size,
            ..Default::default()
        };
        let mut r = common::start_with(&[], &cfg, |_| {});
        let info = r.s.device().info().clone();
        assert_eq!(info.event_idx, event_idx == FeatureMode::On);
        assert_eq!(info.indirect_desc, indirect == FeatureMode::On);
        workload(&r, "f", 100);
        let st = r.s.device().queue(1).unwrap().stats();
        assert_eq!(st.submitted, st.completed);
        assert!(st.completed >= 300, "{st:?}");
        r.assert_clean();
    }
}

#[test]
fn ring_indices_wrap_past_u16() {
    // 70,000 requests on a 4-entry ring: the avail and used indices wrap past 65535.
    let cfg = DriverConfig {
        queue_size: 4,
        ..Default::default()
    };
    let mut r = common::start_with(&[], &cfg, |_| {});
    for i in 0..70_000 {
        if let Err(e) = r.s.getattr(ROOT, None) {
            panic!("request {i}: {e}\nlog:\n{}", r.daemon.log_contents());
        }
    }
    let st = r.s.device().queue(1).unwrap().stats();
    assert!(st.completed > 70_000, "{st:?}");
    r.assert_clean();
}

#[test]
fn pipelined_requests_complete_in_any_wait_order() {
    let mut r = common::start(&[]);
    let dev = r.s.device().clone();
    let mut pending = Vec::new();
    let mut uniques = Vec::new();
    for _ in 0..64 {
        let arg = GetattrIn::default();
        let hdr: InHeader = r.s.header(opcode::GETATTR, ROOT, arg.as_slice().len());
        uniques.push(hdr.unique);
        let chain = Chain {
            segs: vec![
                Seg::Readable(hdr.as_slice().to_vec()),
                Seg::Readable(arg.as_slice().to_vec()),
                Seg::Writable(16),
                Seg::Writable(104),
            ],
            indirect: dev.info().indirect_desc,
        };
        pending.push(dev.submit(1, &chain).unwrap());
    }
    // Wait in reverse order: completions for others are parked until asked for.
    for (p, unique) in pending.into_iter().zip(uniques).rev() {
        let c = p.wait(dev.timeout()).unwrap();
        assert_eq!(c.used_len, 120);
        let h = abi::OutHeader::from_slice(&c.data[..16]).unwrap();
        assert_eq!((h.unique, h.error, h.len), (unique, 0, 120));
    }
    r.assert_clean();
}

#[test]
fn threads_share_a_session() {
    let mut r = common::start_with(&[], &DriverConfig::default(), |d| {
        fs::create_dir(d.join("t")).unwrap();
    });
    let nreq = r.s.device().info().num_request_queues;
    thread::scope(|sc| {
        for t in 0..6 {
            let s = r.s.on_queue(1 + t % nreq).unwrap();
            let root = &r.root;
            sc.spawn(move || {
                let dir = s.lookup(ROOT, "t").unwrap();
                let name = format!("thread-{t}");
                let flags = (libc::O_RDWR | libc::O_CREAT) as u32;
                let (e, o) = s
                    .create(dir.nodeid, &name, flags, libc::S_IFREG | 0o644, 0)
                    .unwrap();
                let mut want = Vec::new();
                for i in 0..200u32 {
                    let chunk = format!("{t}/{i};").into_bytes();
                    s.write(e.nodeid, o.fh, want.len() as u64, &chunk).unwrap();
                    want.extend_from_slice(&chunk);
                    if i % 10 == 0 {
                        assert_eq!(s.read(e.nodeid, o.fh, 0, 1 << 16).unwrap(), want);
                    }
                }
                s.release(e.nodeid, o.fh, flags).unwrap();
                assert_eq!(fs::read(root.path().join("t").join(&name)).unwrap(), want);
            });
        }
    });
    r.assert_clean();
}

/// More request queues and a bigger pool must never make the same requests slower: threads
/// the CPUs cannot run at once only hand requests over and wake each other (on 2 cores, 4
/// queues served 4 KiB READs at 0.31x of one queue, a pool of 4 at 0.30x-0.41x of none). So
/// the daemon serves on at most one thread per CPU but one (at least one) and says so. Here:
/// 4 queues and `--thread-pool-size=4` under a depth-16 load, then the daemon's threads
/// that served requests are counted.
#[test]
fn threads_are_cut_to_the_cpus() {
    use vufs_driver::{Daemon, DaemonKind, Session};
    let kind = common::kind();
    if kind != DaemonKind::Daxfsd {
        eprintln!(
            "{}: serves one request queue; the cut is daxfsd's; skipped",
            kind.name()
        );
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let useful = cpus.saturating_sub(1).max(1);
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("f"), vec![5u8; 1 << 20]).unwrap();
    // As a user starts it: no DAXFSD_THREADS in its environment.
    let d = Daemon::builder(&kind)
        .unwrap()
        .shared_dir(dir.path())
        .arg("--queues=4")
        .arg("--thread-pool-size=4")
        .spawn()
        .unwrap();
    let cfg = DriverConfig {
        max_request_queues: Some(4),
        ..Default::default()
    };
    let s = Session::connect_with(d.socket_path(), &cfg).unwrap();
    s.init().unwrap();
    let e = s.lookup(ROOT, "f").unwrap();
    let o = s.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    let dev = s.device().clone();
    assert_eq!(dev.info().num_request_queues, 4, "{:?}", dev.info());
    let mut pending = std::collections::VecDeque::new();
    for i in 0..2000u64 {
        let chain = s.linux_chain(
            opcode::READ,
            e.nodeid,
            &[abi::ReadIn {
                fh: o.fh,
                offset: (i % 256) * 4096,
                size: 4096,
                ..Default::default()
            }
            .as_slice()],
            4096,
        );
        pending.push_back(dev.submit(1 + (i % 4) as usize, &chain).unwrap());
        if pending.len() >= 16 {
            let c = pending.pop_front().unwrap().wait(dev.timeout()).unwrap();
            assert_eq!(c.data.len(), 16 + 4096);
        }
    }
    for p in pending {
        assert_eq!(p.wait(dev.timeout()).unwrap().data.len(), 16 + 4096);
    }
    // Threads by name: the pool's are "fs-worker"; the queue threads are vhost-user-backend's
    // vring workers (one per set of queues).
    let pid = d.pid().unwrap();
    let names: Vec<String> = fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect();
    let workers = names.iter().filter(|n| *n == "fs-worker").count();
    let vring = names.iter().filter(|n| *n == "vring_worker").count();
    let log = d.log_contents();
    if useful < 4 {
        assert!(
            workers <= useful,
            "{cpus} CPUs: {workers} pool threads (asked 4), threads {names:?}\nlog:\n{log}"
        );
        assert!(
            vring <= useful,
            "{cpus} CPUs: {vring} queue threads for 4 queues, threads {names:?}"
        );
        assert!(
            log.contains(&format!(
                "{cpus} CPU(s) to run on: serving 4 request queue(s) on {useful} thread(s)"
            )),
            "no line saying the threads were cut; log:\n{log}"
        );
    } else {
        assert_eq!(
            workers, 4,
            "{cpus} CPUs: the pool as asked; threads {names:?}"
        );
        assert!(
            !log.contains("CPU(s) to run on"),
            "cut on {cpus} CPUs:\n{log}"
        );
    }
}
