//! POSIX edge cases through the driver, each checked against what the host itself answers
//! for the same call on the same file system: timestamps across the whole range the FUSE
//! protocol carries (before 1970, past 2038, past the file system's own limits, nanoseconds
//! at their bounds) and `lseek` for every whence at and around the ends of a file.
//! Daemon: `VUFS_DAEMON` (default: upstream virtiofsd 1.14).

mod common;

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::errno;
use daxfsd::abi::{self, fattr, SetattrIn};
use vufs_driver::DriverConfig;

const ROOT: u64 = abi::ROOT_ID;

type Times = ((i64, i64), (i64, i64));

/// `utimensat(path, [atime, mtime])` on the host: Ok, or the errno.
fn host_utimens(p: &Path, at: (i64, i64), mt: (i64, i64)) -> Result<(), i32> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: at.0,
            tv_nsec: at.1,
        },
        libc::timespec {
            tv_sec: mt.0,
            tv_nsec: mt.1,
        },
    ];
    // SAFETY: `c` is NUL-terminated and `ts` holds the two timespecs the call reads.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    }
}

fn host_times(p: &Path) -> Times {
    let md = fs::metadata(p).unwrap();
    ((md.atime(), md.atime_nsec()), (md.mtime(), md.mtime_nsec()))
}

/// The times of an attribute reply, the seconds read back as the guest kernel does (a
/// signed time64 in two's complement).
fn attr_times(a: &abi::Attr) -> Times {
    (
        (a.atime as i64, i64::from(a.atimensec)),
        (a.mtime as i64, i64::from(a.mtimensec)),
    )
}

fn set_times(at: (i64, u32), mt: (i64, u32)) -> SetattrIn {
    SetattrIn {
        valid: fattr::ATIME | fattr::MTIME,
        atime: at.0 as u64,
        atimensec: at.1,
        mtime: mt.0 as u64,
        mtimensec: mt.1,
        ..Default::default()
    }
}

#[test]
fn timestamps_are_stored_as_the_host_stores_them() {
    let mut r = common::start_with(&[], &DriverConfig::default(), |d| {
        fs::write(d.join("f"), b"x").unwrap();
        fs::write(d.join("ref"), b"x").unwrap();
    });
    let e = r.s.lookup(ROOT, "f").unwrap();
    let (f, rf) = (r.host("f"), r.host("ref"));
    let mut cases: Vec<((i64, u32), (i64, u32))> = [
        (0, 0),
        (-1, 0),
        (-1, 999_999_999),
        (-315_619_200, 0),        // 1960-01-01 (`touch -d 1960-01-01`)
        (i32::MIN as i64, 0),     // 1901-12-13, the signed 32-bit minimum
        (i32::MIN as i64 - 1, 1), // before it
        (-62_135_596_800, 500),   // year 1
        (i64::MIN, 0),            // below any file system's range
        (i32::MAX as i64, 999_999_999),
        (i32::MAX as i64 + 1, 0),     // 2038-01-19 03:14:08
        (4_102_444_800, 999_999_999), // 2100-01-01
        (1 << 34, 0),                 // 2514: past ext4's 2446
        (i64::MAX, 999_999_999),      // above any file system's range
        (5, 1_000_000_000),           // no time: nanoseconds out of range
        (5, u32::MAX),
    ]
    .iter()
    .map(|&t| (t, t))
    .collect();
    // atime and mtime are independent.
    cases.push(((-315_619_200, 1), (4_102_444_800, 2)));
    cases.push(((4_102_444_800, 3), (i32::MIN as i64, 4)));
    let mut report = Vec::new();
    for (at, mt) in cases {
        let want =
            host_utimens(&rf, (at.0, at.1.into()), (mt.0, mt.1.into())).map(|()| host_times(&rf));
        let got = r.s.setattr(e.nodeid, &set_times(at, mt));
        report.push(format!("{at:?}/{mt:?}: host {want:?}"));
        match want {
            Err(w) => {
                let g = got.expect_err("the host refused these times");
                assert_eq!(errno(&g), w, "{at:?}/{mt:?}: the host's errno");
            }
            Ok(t) => {
                let got = got.unwrap_or_else(|e| panic!("{at:?}/{mt:?}: {e}; host stored {t:?}"));
                assert_eq!(attr_times(&got.attr), t, "{at:?}/{mt:?}: SETATTR reply");
                assert_eq!(host_times(&f), t, "{at:?}/{mt:?}: host file");
                let a = r.s.getattr(e.nodeid, None).unwrap();
                assert_eq!(attr_times(&a.attr), t, "{at:?}/{mt:?}: GETATTR");
            }
        }
    }
    eprintln!("{}", report.join("\n"));
    r.s.forget(e.nodeid, 1).unwrap();
    r.assert_clean();
}

#[test]
fn time_now_flags_set_the_current_time() {
    let mut r = common::start_with(&[], &DriverConfig::default(), |d| {
        fs::write(d.join("f"), b"x").unwrap();
    });
    let e = r.s.lookup(ROOT, "f").unwrap();
    let f = r.host("f");
    host_utimens(&f, (-2, 7), (-3, 8)).unwrap();
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    let t0 = now();
    // What a guest sends for utimensat(path, {UTIME_NOW, {-11, 12}}).
    let mut a = set_times((-7, 1), (-11, 12));
    a.valid |= fattr::ATIME_NOW;
    r.s.setattr(e.nodeid, &a).unwrap();
    let ((at, _), mt) = host_times(&f);
    assert!(at >= t0 && at <= now(), "ATIME_NOW: atime {at}");
    assert_eq!(mt, (-11, 12), "the given mtime");
    // utimensat(path, {UTIME_OMIT, UTIME_NOW}): the atime stays.
    let before = host_times(&f).0;
    let a = SetattrIn {
        valid: fattr::MTIME | fattr::MTIME_NOW,
        ..Default::default()
    };
    r.s.setattr(e.nodeid, &a).unwrap();
    let (at, (mt, _)) = host_times(&f);
    assert_eq!(at, before, "atime omitted");
    assert!(mt >= t0 && mt <= now(), "MTIME_NOW: mtime {mt}");
    r.s.forget(e.nodeid, 1).unwrap();
    r.assert_clean();
}

/// `lseek` of a host descriptor: the offset or the errno.
fn host_lseek(fd: &fs::File, offset: i64, whence: i32) -> Result<u64, i32> {
    // SAFETY: `fd` is an open descriptor for the call.
    let r = unsafe { libc::lseek64(fd.as_raw_fd(), offset, whence) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(r as u64)
    }
}

#[test]
fn lseek_answers_every_whence_as_the_host_does() {
    let mut r = common::start_with(&[], &DriverConfig::default(), |d| {
        let f = fs::File::create(d.join("sparse")).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[1u8; 4096], 0).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[2u8; 100], 1 << 20).unwrap();
        fs::File::create(d.join("empty")).unwrap();
    });
    let size = (1i64 << 20) + 100;
    let mut nodes = Vec::new();
    for (name, size) in [("sparse", size), ("empty", 0)] {
        let e = r.s.lookup(ROOT, name).unwrap();
        let o = r.s.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
        let host = fs::File::open(r.host(name)).unwrap();
        for whence in [
            libc::SEEK_SET,
            libc::SEEK_END,
            libc::SEEK_DATA,
            libc::SEEK_HOLE,
            5,
            99,
        ] {
            for off in [
                0,
                1,
                4095,
                4096,
                size - 1,
                size,
                size + 1,
                -1,
                -size,
                -size - 1,
                i64::MIN,
                i64::MAX,
                1 << 62,
            ] {
                let want = host_lseek(&host, off, whence);
                let got =
                    r.s.lseek(e.nodeid, o.fh, off as u64, whence as u32)
                        .map_err(|e| errno(&e));
                assert_eq!(got, want, "{name}: lseek({off}, {whence})");
            }
        }
        nodes.push((e.nodeid, o.fh));
    }
    // lseek(2): at or past the end, and before the start, SEEK_DATA and SEEK_HOLE give ENXIO
    // (the host's answers above, spelled out).
    let (ino, fh) = nodes[0];
    for off in [size, size + 1, 1 << 40, -1, i64::MIN] {
        for whence in [libc::SEEK_DATA, libc::SEEK_HOLE] {
            let e = r.s.lseek(ino, fh, off as u64, whence as u32).unwrap_err();
            assert_eq!(errno(&e), libc::ENXIO, "lseek({off}, {whence})");
        }
    }
    for (ino, fh) in nodes {
        r.s.release(ino, fh, 0).unwrap();
        r.s.forget(ino, 1).unwrap();
    }
    r.assert_clean();
}
