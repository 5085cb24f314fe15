//! FUSE_SETUPMAPPING / FUSE_REMOVEMAPPING through the DAX window. A daemon without a window
//! (upstream virtiofsd) must refuse them; a daemon with one (daxfsd) must map the file
//! ranges into the window through SHMEM_MAP/SHMEM_UNMAP, by QEMU 11.1's rules.

mod common;

use std::fs;

use daxfsd::abi::{
    self, init_flags, RemovemappingOne, SETUPMAPPING_FLAG_READ as READ,
    SETUPMAPPING_FLAG_WRITE as WRITE,
};
use vufs_driver::{DaemonKind, DriverConfig};

const MIB2: u64 = 2 << 20;

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ (i >> 12) as u8)
        .collect()
}

#[test]
fn setupmapping_needs_a_window() {
    let mut r = common::start_with(&[], &DriverConfig::default(), |d| {
        fs::write(d.join("f"), pattern(4096)).unwrap();
    });
    if r.s.dax().is_some() {
        eprintln!(
            "the daemon has a DAX window (VUFS_DAEMON_ARGS?): see maps_file_ranges_into_the_window"
        );
        return;
    }
    assert_eq!(r.s.negotiated() & init_flags::MAP_ALIGNMENT, 0);
    let e = r.s.lookup(abi::ROOT_ID, "f").unwrap();
    let o = r.s.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    let err =
        r.s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ, 0)
            .unwrap_err();
    let want = if common::kind() == DaemonKind::Virtiofsd {
        vec![libc::ENOSYS]
    } else {
        vec![libc::ENOSYS, libc::EINVAL, libc::ENODEV]
    };
    assert!(want.contains(&common::errno(&err)), "{err}");
    let one = RemovemappingOne {
        moffset: 0,
        len: MIB2,
    };
    assert!(r.s.removemapping(e.nodeid, &[one]).is_err());
    r.s.release(e.nodeid, o.fh, 0).unwrap();
    r.assert_clean();
}

#[test]
fn maps_file_ranges_into_the_window() {
    let data = pattern(4 << 20);
    // daxfsd offers a window only when asked to.
    let args: &[&str] = if common::kind() == DaemonKind::Daxfsd {
        &["--dax-window=64M"]
    } else {
        &[]
    };
    let mut r = common::start_with(args, &DriverConfig::default(), |d| {
        fs::write(d.join("dax.bin"), &data).unwrap();
    });
    let Some(w) = r.s.dax().cloned() else {
        assert_ne!(
            common::kind(),
            DaemonKind::Daxfsd,
            "daxfsd --dax-window=64M offered no DAX window"
        );
        eprintln!(
            "{} has no DAX window: only setupmapping_needs_a_window applies",
            common::kind().name()
        );
        return;
    };
    assert!(w.len() >= 2 * MIB2, "window of {} bytes", w.len());
    let (_, out) = r.s.init_state().unwrap();
    if r.s.negotiated() & init_flags::MAP_ALIGNMENT != 0 {
        assert!(out.map_alignment <= 21, "{out:?}");
    }
    let e = r.s.lookup(abi::ROOT_ID, "dax.bin").unwrap();
    let o = r.s.open(e.nodeid, libc::O_RDWR as u32).unwrap();

    // Pooled (VUFS_DAX_MAPPING=pooled, the daemon's default): the frontend holds one mapping
    // of the whole window, made at the first SETUPMAPPING; the guest sees the same bytes.
    let pooled = vufs_driver::dax::pooled();
    // Read-only range 0 at window offset 0.
    r.s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ, 0).unwrap();
    let m = w.mappings();
    assert_eq!(m.len(), 1, "{m:?}");
    if pooled {
        assert_eq!(
            (m[0].shm_offset, m[0].len, m[0].writable),
            (0, w.len(), true)
        );
    } else {
        assert_eq!((m[0].shm_offset, m[0].len, m[0].writable), (0, MIB2, false));
    }
    let mut buf = vec![0u8; 8192];
    w.read(0, &mut buf).unwrap();
    assert_eq!(buf, data[..8192]);
    w.read(MIB2 - 8192, &mut buf).unwrap();
    assert_eq!(buf, data[MIB2 as usize - 8192..MIB2 as usize]);

    // Linux upgrades a range to writable with a second SETUPMAPPING at the same offset.
    let before = w.stats();
    r.s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ | WRITE, 0)
        .unwrap();
    let m = w.mappings();
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(m[0].writable);
    if pooled {
        assert_eq!(w.stats(), before, "a pooled upgrade sends nothing");
    } else {
        assert!(
            w.stats().unmap_requests > before.unmap_requests,
            "upgrade without SHMEM_UNMAP"
        );
    }
    w.write(100, b"written-through-dax").unwrap();
    if pooled {
        // Pooled stores reach the file at the sync points.
        r.s.fsync(e.nodeid, o.fh, false).unwrap();
    }
    assert_eq!(
        &fs::read(r.host("dax.bin")).unwrap()[100..119],
        b"written-through-dax"
    );

    // Range 1 at window offset 2 MiB, read-only.
    r.s.setupmapping(e.nodeid, o.fh, MIB2, MIB2, READ, MIB2)
        .unwrap();
    w.read(MIB2, &mut buf).unwrap();
    assert_eq!(buf, data[MIB2 as usize..MIB2 as usize + 8192]);
    assert_eq!(w.mappings().len(), if pooled { 1 } else { 2 });

    let ranges = [
        RemovemappingOne {
            moffset: 0,
            len: MIB2,
        },
        RemovemappingOne {
            moffset: MIB2,
            len: MIB2,
        },
    ];
    r.s.removemapping(e.nodeid, &ranges).unwrap();
    if pooled {
        assert_eq!(w.mappings().len(), 1, "the pool stays");
        w.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0), "a removed range is freed");
    } else {
        assert!(w.mappings().is_empty(), "{:?}", w.mappings());
        assert!(w.read(0, &mut buf).is_err());
    }
    let st = w.stats();
    assert_eq!((st.maps_rejected, st.unmaps_rejected), (0, 0), "{st:?}");
    r.s.release(e.nodeid, o.fh, libc::O_RDWR as u32).unwrap();
    r.s.forget(e.nodeid, 1).unwrap();
    r.assert_clean();
}
