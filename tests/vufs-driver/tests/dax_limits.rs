//! DAX windows of any size stay within QEMU 11.1's memory slots (issue #20): the frontend
//! never holds more than daxfsd's budget of mappings, and no SETUPMAPPING is refused for it
//! when the guest maps every range of a window with more ranges than the budget. Only daxfsd
//! has a window; upstream virtiofsd gets a message and no checks.

mod common;

use std::fs;
use std::os::unix::fs::FileExt;

use daxfsd::abi::SETUPMAPPING_FLAG_WRITE as WRITE;
use daxfsd::abi::{self, RemovemappingOne, SETUPMAPPING_FLAG_READ as READ};
use daxfsd::dax::DEFAULT_MAP_BUDGET;
use vufs_driver::dax::QEMU_SLOT_LIMIT;
use vufs_driver::DriverConfig;

const MIB2: u64 = 2 << 20;

/// A 1 GiB window has 512 ranges of 2 MiB, more than the budget: a guest (upstream policy,
/// which fails the read when SETUPMAPPING fails) that maps every one of them, each a small
/// file (half writable), gets every mapping, the frontend never holds more than the budget,
/// every range reads its file, and guest stores reach the files.
#[test]
fn setupmappings_past_the_budget_stay_within_qemus_slots() {
    if !common::only_daxfsd("setupmappings_past_the_budget_stay_within_qemus_slots") {
        return;
    }
    const N: usize = 512;
    let sizes: Vec<usize> = (0..N).map(|i| 4096 + 17 + (i % 97) * 13).collect();
    let sz = sizes.clone();
    let r = common::start_with(&["--dax-window=1G"], &DriverConfig::default(), |d| {
        for (i, n) in sz.iter().enumerate() {
            fs::write(d.join(format!("f{i}")), common::bytes(*n, i as u8)).unwrap();
        }
    });
    let w =
        r.s.dax()
            .cloned()
            .expect("daxfsd --dax-window=1G offered no window");
    assert_eq!(w.len(), 1 << 30);
    let mut handles = Vec::new();
    for i in 0..N {
        let e = r.s.lookup(abi::ROOT_ID, format!("f{i}")).unwrap();
        let o = r.s.open(e.nodeid, libc::O_RDWR as u32).unwrap();
        let flags = if i % 2 == 1 { READ | WRITE } else { READ };
        r.s.setupmapping(e.nodeid, o.fh, 0, MIB2, flags, i as u64 * MIB2)
            .unwrap_or_else(|err| panic!("SETUPMAPPING {i}: {err}\n{}", r.daemon.log_contents()));
        handles.push((e.nodeid, o.fh));
    }
    assert!(
        w.violations().is_empty(),
        "{:?}\n{}",
        w.violations(),
        r.daemon.log_contents()
    );
    assert!(
        w.peak() <= DEFAULT_MAP_BUDGET && DEFAULT_MAP_BUDGET < QEMU_SLOT_LIMIT,
        "{} frontend mappings live at once; budget {DEFAULT_MAP_BUDGET}, QEMU {QEMU_SLOT_LIMIT}",
        w.peak()
    );
    for (i, n) in sizes.iter().enumerate() {
        let mut got = vec![0u8; 8192];
        w.read(i as u64 * MIB2, &mut got).unwrap();
        let mut want = common::bytes(*n, i as u8);
        want.resize(8192, 0);
        assert_eq!(got, want, "range {i}");
    }
    // Guest stores into the writable ranges, then fsync: the host has them.
    for (i, (node, fh)) in handles.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
        w.write(i as u64 * MIB2 + 4096, b"GUEST").unwrap();
        r.s.fsync(*node, *fh, false).unwrap();
    }
    for (i, n) in sizes.iter().enumerate() {
        let host = fs::read(r.host(&format!("f{i}"))).unwrap();
        assert_eq!(host.len(), *n, "file {i} size");
        let want: &[u8] = if i % 2 == 1 {
            b"GUEST"
        } else {
            &common::bytes(*n, i as u8)[4096..4101]
        };
        assert_eq!(&host[4096..4101], want, "file {i}");
    }
    // The guest reclaims and maps again (another file in each range): still within.
    for (i, (node, _)) in handles.iter().enumerate() {
        let one = RemovemappingOne {
            moffset: i as u64 * MIB2,
            len: MIB2,
        };
        r.s.removemapping(*node, &[one]).unwrap();
        let j = (i + 1) % N;
        let (n2, f2) = handles[j];
        r.s.setupmapping(n2, f2, 0, MIB2, READ, i as u64 * MIB2)
            .unwrap_or_else(|err| panic!("SETUPMAPPING again {i}: {err}"));
        let mut got = vec![0u8; 16];
        w.read(i as u64 * MIB2, &mut got).unwrap();
        let host = fs::read(r.host(&format!("f{j}"))).unwrap();
        assert_eq!(got, host[..16], "range {i} now maps f{j}");
    }
    assert!(w.peak() <= DEFAULT_MAP_BUDGET, "peak {}", w.peak());
    assert!(w.violations().is_empty(), "{:?}", w.violations());
    // A host change reaches a read-only range at the next sync point (GETATTR, OPEN, READ).
    let f0 = fs::OpenOptions::new()
        .write(true)
        .open(r.host("f1"))
        .unwrap();
    f0.write_all_at(b"HOST", 0).unwrap();
    let (n1, _) = handles[1];
    r.s.getattr(n1, None).unwrap();
    let mut got = [0u8; 4];
    w.read(0, &mut got).unwrap();
    assert_eq!(&got, b"HOST");
}

/// Peak resident memory of a process (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// Issue #20 d: one read-only guest mapping as long as the window (1 GiB: served from the
/// pool; 512 MiB: a snapshot shadow, as the file is executable) must not cost the daemon
/// memory in proportion to its length, at the map or at each READ/FLUSH sync point after it.
#[test]
fn a_window_long_read_only_map_keeps_the_daemons_memory_bounded() {
    if !common::only_daxfsd("a_window_long_read_only_map_keeps_the_daemons_memory_bounded") {
        return;
    }
    for (win, len) in [
        ("--dax-window=1G", 1u64 << 30),
        ("--dax-window=512M", 512 << 20),
    ] {
        let r = common::start_with(&[win], &DriverConfig::default(), |d| {
            let f = fs::File::create(d.join("big")).unwrap();
            f.set_len(len).unwrap();
            f.write_all_at(b"head", 0).unwrap();
            f.write_all_at(b"tail", len - 4).unwrap();
            // Executable: the daemon keeps no writable descriptor and maps a snapshot.
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(fs::Permissions::from_mode(0o755))
                .unwrap();
        });
        let pid = r.daemon.pid().expect("daemon pid");
        let w = r.s.dax().cloned().expect("no window");
        let e = r.s.lookup(abi::ROOT_ID, "big").unwrap();
        let o = r.s.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
        let before = peak_rss_kib(pid);
        r.s.setupmapping(e.nodeid, o.fh, 0, len, READ, 0)
            .unwrap_or_else(|err| panic!("SETUPMAPPING {win}: {err}\n{}", r.daemon.log_contents()));
        for _ in 0..2 {
            r.s.read(e.nodeid, o.fh, 0, 4096).unwrap();
            r.s.flush(e.nodeid, o.fh, 0).unwrap();
        }
        let mut got = [0u8; 4];
        w.read(0, &mut got).unwrap();
        assert_eq!(&got, b"head", "{win}");
        w.read(len - 4, &mut got).unwrap();
        assert_eq!(&got, b"tail", "{win}");
        let grew = peak_rss_kib(pid).saturating_sub(before);
        eprintln!("{win}: peak RSS {before} KiB before the map, grew by {grew} KiB");
        assert!(
            grew < 64 << 10,
            "{win}: the daemon's peak RSS grew by {grew} KiB for a {} MiB read-only map",
            len >> 20
        );
        r.s.release(e.nodeid, o.fh, libc::O_RDONLY as u32).unwrap();
    }
}

/// The largest windows: 64 GiB (32,768 ranges of 2 MiB) is one pooled frontend mapping;
/// ranges anywhere in it map, read their files and write back.
#[test]
fn a_64g_window_is_one_frontend_mapping() {
    if !common::only_daxfsd("a_64g_window_is_one_frontend_mapping") {
        return;
    }
    let r = common::start_with(&["--dax-window=64G"], &DriverConfig::default(), |d| {
        fs::write(d.join("f"), common::bytes(3 << 20, 9)).unwrap();
    });
    let w = r.s.dax().cloned().expect("no window");
    assert_eq!(w.len(), 64 << 30);
    let e = r.s.lookup(abi::ROOT_ID, "f").unwrap();
    let o = r.s.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    let last = (64u64 << 30) - MIB2;
    for (i, m) in [0, 12345 * MIB2, last].into_iter().enumerate() {
        r.s.setupmapping(e.nodeid, o.fh, i as u64 * MIB2 / 2, MIB2, READ | WRITE, m)
            .unwrap_or_else(|err| panic!("SETUPMAPPING at {m:#x}: {err}"));
        let mut got = vec![0u8; 4096];
        w.read(m, &mut got).unwrap();
        let want = &common::bytes(3 << 20, 9)[(i << 20)..(i << 20) + 4096];
        assert_eq!(got, want, "range at {m:#x}");
    }
    w.write(last + 10, b"END").unwrap();
    r.s.fsync(e.nodeid, o.fh, false).unwrap();
    let host = fs::read(r.host("f")).unwrap();
    assert_eq!(&host[(2 << 20) + 10..(2 << 20) + 13], b"END");
    assert_eq!(w.peak(), 1, "one frontend mapping");
    assert!(w.violations().is_empty(), "{:?}", w.violations());
}
