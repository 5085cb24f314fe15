//! DAX copy slots (`daxfsd --dax-copy`), through the real daemon and a frontend that behaves
//! like QEMU 11.1: read-only ranges served from a copy, parked on REMOVEMAPPING and refilled
//! in place with no SHMEM request, upgraded to the file on a writable SETUPMAPPING, refreshed
//! at the request path's sync points, zero past EOF, parked slots evicted for the budget, and
//! `--dax-copy=off` exactly as without copy slots. Only daxfsd has a window. Copy slots are
//! how direct windows copy (a pooled window copies every mapping), so these name
//! `--dax-mapping=direct` whatever `VUFS_DAX_MAPPING` says.

mod common;

use std::fs;
use std::os::unix::fs::FileExt;

use daxfsd::abi::{
    self, RemovemappingOne, SETUPMAPPING_FLAG_READ as READ, SETUPMAPPING_FLAG_WRITE as WRITE,
};
use daxfsd::dax::DEFAULT_MAP_BUDGET;
use vufs_driver::dax::QEMU_SLOT_LIMIT;
use vufs_driver::{DaemonKind, DriverConfig};

const MIB2: u64 = 2 << 20;

fn only_daxfsd(test: &str) -> bool {
    if common::kind() != DaemonKind::Daxfsd {
        eprintln!(
            "{test}: {} has no DAX window or copy slots; this test is for daxfsd",
            common::kind().name()
        );
        return false;
    }
    true
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed ^ (i >> 12) as u8)
        .collect()
}

fn one(moffset: u64, len: u64) -> [RemovemappingOne; 1] {
    [RemovemappingOne { moffset, len }]
}

#[test]
fn a_parked_slot_is_refilled_with_no_shmem_request() {
    if !only_daxfsd("a_parked_slot_is_refilled_with_no_shmem_request") {
        return;
    }
    let (a, b) = (bytes(6 << 20, 1), bytes(5000, 2));
    let (a2, b2) = (a.clone(), b.clone());
    let mut r = common::start_with(
        &[
            "--dax-window=64M",
            "--dax-copy=always",
            "--dax-mapping=direct",
        ],
        &DriverConfig::default(),
        |d| {
            fs::write(d.join("a"), &a2).unwrap();
            fs::write(d.join("b"), &b2).unwrap();
        },
    );
    let w = r.s.dax().cloned().expect("no window");
    let ea = r.s.lookup(abi::ROOT_ID, "a").unwrap();
    let eb = r.s.lookup(abi::ROOT_ID, "b").unwrap();
    let oa = r.s.open(ea.nodeid, libc::O_RDONLY as u32).unwrap();
    let ob = r.s.open(eb.nodeid, libc::O_RDONLY as u32).unwrap();

    // File a, range 1, at window range 3: one SHMEM_MAP of the slot (slot offset = window
    // offset), showing the file's bytes.
    r.s.setupmapping(ea.nodeid, oa.fh, MIB2, MIB2, READ, 3 * MIB2)
        .unwrap();
    let m = w.mappings();
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(
        (m[0].shm_offset, m[0].len, m[0].fd_offset, m[0].writable),
        (3 * MIB2, MIB2, 3 * MIB2, false)
    );
    let mut got = vec![0u8; MIB2 as usize];
    w.read(3 * MIB2, &mut got).unwrap();
    assert!(
        got == a[MIB2 as usize..2 * MIB2 as usize],
        "copy differs from the file"
    );
    let st = w.stats();
    assert_eq!((st.map_requests, st.unmap_requests), (1, 0), "{st:?}");

    // REMOVEMAPPING parks it: the frontend keeps the mapping, nothing is sent.
    r.s.removemapping(ea.nodeid, &one(3 * MIB2, MIB2)).unwrap();
    assert_eq!(w.stats(), st, "REMOVEMAPPING of a copy slot sent a request");
    assert_eq!(w.mappings().len(), 1, "the parked slot stays mapped");

    // File b (5000 bytes) read-only at the same window range: refilled in place, no SHMEM
    // request; its bytes, then zeros past EOF (none of file a's bytes remain).
    r.s.setupmapping(eb.nodeid, ob.fh, 0, MIB2, READ, 3 * MIB2)
        .unwrap();
    assert_eq!(w.stats(), st, "a parked slot was not reused");
    w.read(3 * MIB2, &mut got).unwrap();
    assert_eq!(&got[..5000], &b[..]);
    assert!(
        got[5000..].iter().all(|&x| x == 0),
        "bytes past EOF not zero"
    );

    // Many recycles of one range: still one SHMEM_MAP in all.
    for i in 0..20u64 {
        r.s.removemapping(eb.nodeid, &one(3 * MIB2, MIB2)).unwrap();
        r.s.setupmapping(ea.nodeid, oa.fh, (i % 2) * MIB2, MIB2, READ, 3 * MIB2)
            .unwrap();
        let mut head = vec![0u8; 4096];
        w.read(3 * MIB2, &mut head).unwrap();
        let at = ((i % 2) * MIB2) as usize;
        assert_eq!(head, a[at..at + 4096], "recycle {i}");
    }
    assert_eq!(w.stats(), st, "{:?}", w.stats());
    assert!(w.violations().is_empty(), "{:?}", w.violations());
    r.s.release(ea.nodeid, oa.fh, 0).unwrap();
    r.s.release(eb.nodeid, ob.fh, 0).unwrap();
    r.assert_clean();
}

#[test]
fn an_upgrade_turns_a_copy_into_a_direct_mapping() {
    if !only_daxfsd("an_upgrade_turns_a_copy_into_a_direct_mapping") {
        return;
    }
    let data = bytes(4 << 20, 3);
    let d2 = data.clone();
    let mut r = common::start_with(
        &[
            "--dax-window=64M",
            "--dax-copy=always",
            "--dax-mapping=direct",
        ],
        &DriverConfig::default(),
        |d| fs::write(d.join("f"), &d2).unwrap(),
    );
    let w = r.s.dax().cloned().expect("no window");
    let e = r.s.lookup(abi::ROOT_ID, "f").unwrap();
    let o = r.s.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    r.s.setupmapping(e.nodeid, o.fh, MIB2, MIB2, READ, 0)
        .unwrap();
    assert_eq!(w.mappings()[0].fd_offset, 0, "a copy slot");
    // Linux's upgrade: SETUPMAPPING with WRITE at the same window offset.
    r.s.setupmapping(e.nodeid, o.fh, MIB2, MIB2, READ | WRITE, 0)
        .unwrap();
    let m = w.mappings();
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(m[0].writable);
    assert_eq!(m[0].fd_offset, MIB2, "the file itself, not the copy");
    assert_eq!(w.stats().unmap_requests, 1);
    // Guest stores reach the file.
    w.write(100, b"stored-through-dax").unwrap();
    let host = fs::read(r.host("f")).unwrap();
    assert_eq!(
        &host[MIB2 as usize + 100..MIB2 as usize + 118],
        b"stored-through-dax"
    );
    // A writable mapping over a parked slot: the slot is unmapped first.
    r.s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ, MIB2)
        .unwrap();
    r.s.removemapping(e.nodeid, &one(MIB2, MIB2)).unwrap();
    let before = w.stats();
    r.s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ | WRITE, MIB2)
        .unwrap();
    let after = w.stats();
    assert_eq!(
        (
            after.unmap_requests - before.unmap_requests,
            after.map_requests - before.map_requests
        ),
        (1, 1)
    );
    assert!(w.violations().is_empty(), "{:?}", w.violations());
    r.s.release(e.nodeid, o.fh, 0).unwrap();
    r.assert_clean();
}

#[test]
fn host_writes_reach_a_copy_at_the_refresh_points() {
    if !only_daxfsd("host_writes_reach_a_copy_at_the_refresh_points") {
        return;
    }
    let mut r = common::start_with(
        &[
            "--dax-window=64M",
            "--dax-copy=always",
            "--dax-mapping=direct",
        ],
        &DriverConfig::default(),
        |d| fs::write(d.join("f"), bytes(100_000, 4)).unwrap(),
    );
    let w = r.s.dax().cloned().expect("no window");
    let e = r.s.lookup(abi::ROOT_ID, "f").unwrap();
    let o = r.s.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    r.s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ, 0).unwrap();
    let host = fs::OpenOptions::new()
        .write(true)
        .open(r.host("f"))
        .unwrap();
    let look = |at: u64, n: usize| {
        let mut v = vec![0u8; n];
        w.read(at, &mut v).unwrap();
        v
    };
    // GETATTR.
    host.write_all_at(b"host-1", 10).unwrap();
    r.s.getattr(e.nodeid, None).unwrap();
    assert_eq!(look(10, 6), b"host-1");
    // FLUSH (close).
    host.write_all_at(b"host-2", 20).unwrap();
    r.s.flush(e.nodeid, o.fh, 0).unwrap();
    assert_eq!(look(20, 6), b"host-2");
    // OPEN.
    host.write_all_at(b"host-3", 30).unwrap();
    let o2 = r.s.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    assert_eq!(look(30, 6), b"host-3");
    // Growth past the old end: the new bytes replace the zeros.
    host.write_all_at(b"grown", 100_000).unwrap();
    r.s.read(e.nodeid, o2.fh, 0, 16).unwrap();
    assert_eq!(look(100_000, 5), b"grown");
    assert_eq!(look(100_005, 3), [0u8; 3]);
    // A guest WRITE through the request queue is in the copy before the reply, whatever
    // the file's timestamps say.
    for i in 0..50u8 {
        r.s.write(e.nodeid, o.fh, 40, &[i; 8]).unwrap();
        assert_eq!(look(40, 8), [i; 8], "write {i}");
    }
    // Shrinking (SETATTR size through the request path): zeros past the new end.
    let sa = abi::SetattrIn {
        valid: abi::fattr::SIZE,
        size: 12,
        ..Default::default()
    };
    r.s.setattr(e.nodeid, &sa).unwrap();
    assert_eq!(look(10, 4), [b'h', b'o', 0, 0]);
    assert!(w.violations().is_empty(), "{:?}", w.violations());
    assert_eq!(w.stats().map_requests, 1, "refreshes send no SHMEM request");
    r.s.release(e.nodeid, o2.fh, 0).unwrap();
    r.s.release(e.nodeid, o.fh, 0).unwrap();
    r.assert_clean();
}

/// 256 ranges (512 MiB window), room for daxfsd's budget of frontend mappings: 256 parked
/// slots plus a writable small file (two mappings, and one kept in reserve per free range)
/// make the daemon unmap parked slots, oldest first, never passing the budget.
#[test]
fn parked_slots_are_evicted_for_the_budget() {
    if !only_daxfsd("parked_slots_are_evicted_for_the_budget") {
        return;
    }
    const N: u64 = 256;
    // Parked slots that must go: the one at range 0 (mapped over), then enough of the rest
    // to leave room for 2 mappings and one per free range: (N - 1) - (budget - 2 - (N - 1)).
    let evict = 2 * N - DEFAULT_MAP_BUDGET as u64;
    let mut r = common::start_with(
        &[
            "--dax-window=512M",
            "--dax-copy=always",
            "--dax-mapping=direct",
        ],
        &DriverConfig::default(),
        |d| {
            fs::write(d.join("small"), bytes(4096, 5)).unwrap();
            fs::write(d.join("tailed"), bytes(5000, 6)).unwrap();
        },
    );
    let w = r.s.dax().cloned().expect("no window");
    let e = r.s.lookup(abi::ROOT_ID, "small").unwrap();
    let o = r.s.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    for i in 0..N {
        r.s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ, i * MIB2)
            .unwrap();
    }
    for i in 0..N {
        r.s.removemapping(e.nodeid, &one(i * MIB2, MIB2)).unwrap();
    }
    assert_eq!(w.mappings().len(), N as usize, "all parked");
    let st = w.stats();
    assert_eq!((st.map_requests, st.unmap_requests), (N, 0));
    // A writable mapping of a file that ends inside its range needs two frontend mappings:
    // with 255 parked slots and 255 free ranges to keep one in reserve for, the oldest
    // parked slots (ranges 1..=evict) go.
    let t = r.s.lookup(abi::ROOT_ID, "tailed").unwrap();
    let ot = r.s.open(t.nodeid, libc::O_RDWR as u32).unwrap();
    r.s.setupmapping(t.nodeid, ot.fh, 0, MIB2, READ | WRITE, 0)
        .unwrap();
    let after = w.stats();
    assert_eq!(after.unmap_requests, 1 + evict, "{after:?}");
    assert!(
        w.peak() <= DEFAULT_MAP_BUDGET && DEFAULT_MAP_BUDGET < QEMU_SLOT_LIMIT,
        "peak {}",
        w.peak()
    );
    let live: Vec<u64> = w.mappings().iter().map(|m| m.shm_offset).collect();
    for i in 1..=evict {
        assert!(!live.contains(&(i * MIB2)), "range {i} should be evicted");
    }
    let kept = evict + 1;
    assert!(live.contains(&(kept * MIB2)), "range {kept} stays parked");
    // An evicted range maps again; a parked one is reused.
    let before = w.stats().map_requests;
    r.s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ, kept * MIB2)
        .unwrap();
    assert_eq!(w.stats().map_requests, before, "parked slot reused");
    r.s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ, MIB2)
        .unwrap();
    assert_eq!(
        w.stats().map_requests,
        before + 1,
        "evicted slot mapped again"
    );
    assert!(w.violations().is_empty(), "{:?}", w.violations());
    r.s.release(t.nodeid, ot.fh, 0).unwrap();
    r.s.release(e.nodeid, o.fh, 0).unwrap();
    r.assert_clean();
}

/// `--dax-copy=off`, and `auto` on a calm window: read-only ranges map the file itself and
/// REMOVEMAPPING unmaps them, as before copy slots existed.
#[test]
fn off_and_a_calm_auto_window_map_the_file() {
    if !only_daxfsd("off_and_a_calm_auto_window_map_the_file") {
        return;
    }
    for mode in ["--dax-copy=off", "--dax-copy=auto"] {
        let data = bytes(4 << 20, 7);
        let d2 = data.clone();
        let mut r = common::start_with(
            &["--dax-window=64M", "--dax-mapping=direct", mode],
            &DriverConfig::default(),
            |d| fs::write(d.join("f"), &d2).unwrap(),
        );
        let w = r.s.dax().cloned().expect("no window");
        let e = r.s.lookup(abi::ROOT_ID, "f").unwrap();
        let o = r.s.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
        for i in 0..3u64 {
            r.s.setupmapping(e.nodeid, o.fh, MIB2, MIB2, READ, i * MIB2)
                .unwrap();
            let m = w.mappings();
            assert_eq!(m[0].fd_offset, MIB2, "{mode}: the file's own offset: {m:?}");
            r.s.removemapping(e.nodeid, &one(i * MIB2, MIB2)).unwrap();
            assert!(w.mappings().is_empty(), "{mode}: nothing parked");
        }
        let st = w.stats();
        assert_eq!(
            (st.map_requests, st.unmap_requests),
            (3, 3),
            "{mode}: {st:?}"
        );
        assert!(
            r.daemon.log_contents().contains(if mode.ends_with("off") {
                "copy slots off"
            } else {
                "copy slots auto"
            }),
            "{mode}: start-up log"
        );
        r.s.release(e.nodeid, o.fh, 0).unwrap();
        r.assert_clean();
    }
}
