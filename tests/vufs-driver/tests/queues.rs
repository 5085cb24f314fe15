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
