//! DAX abuse: SETUPMAPPING / REMOVEMAPPING requests a guest should never send. Each must be
//! refused with an errno and must not reach the frontend: the number of SHMEM_MAP and
//! SHMEM_UNMAP requests the driver's window received stays the same, and so do its live
//! mappings. Valid edge cases must be accepted with exactly the frontend traffic they need.
//!
//! daxfsd only: upstream virtiofsd has no DAX window (it answers ENOSYS, see dax.rs), so the
//! daemon is selected here, not taken from `VUFS_DAEMON`.

mod common;
#[path = "common/host.rs"]
mod host;

use std::fs;
use std::io;
use std::path::Path;
use std::sync::Arc;

use daxfsd::abi::{
    self, opcode as op, RemovemappingIn, RemovemappingOne, SetupmappingIn,
    SETUPMAPPING_FLAG_READ as READ, SETUPMAPPING_FLAG_WRITE as WRITE,
};
use host::Cases;
use vm_memory::ByteValued;
use vufs_driver::{Daemon, DaxStats, DaxWindow, DriverConfig, Mapping, Session};

const ROOT: u64 = abi::ROOT_ID;
const PAGE: u64 = 4096;
const MIB2: u64 = 2 << 20;
/// The window: `--dax-window=64M`.
const W: u64 = 64 << 20;
/// `fuse_setupmapping_in.fh` when Linux names no handle.
const NO_FH: u64 = u64::MAX;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed ^ (i >> 12) as u8)
        .collect()
}

fn mknod(p: &Path, mode: u32, dev: libc::dev_t) -> bool {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid NUL-terminated path; mode and device are plain integers.
    unsafe { libc::mknod(c.as_ptr(), mode, dev) == 0 }
}

struct Rig {
    s: Session,
    w: Arc<DaxWindow>,
    d: Daemon,
    dir: tempfile::TempDir,
    cases: Cases,
    /// The window is pooled (`VUFS_DAX_MAPPING=pooled` and no mode named by the test).
    pooled: bool,
}

fn rig(test: &'static str, args: &[&str]) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    fs::write(p.join("f"), pattern(4 << 20, 1)).unwrap();
    fs::write(p.join("g"), pattern(4 << 20, 2)).unwrap();
    fs::write(p.join("small"), pattern(64 << 10, 3)).unwrap();
    let big = fs::File::create(p.join("big")).unwrap();
    big.set_len(W).unwrap();
    fs::create_dir(p.join("d")).unwrap();
    std::os::unix::fs::symlink("f", p.join("l")).unwrap();
    assert!(mknod(&p.join("p"), libc::S_IFIFO | 0o666, 0));
    // Device nodes (root only): /dev/mem and /dev/null.
    mknod(&p.join("mem"), libc::S_IFCHR | 0o666, libc::makedev(1, 1));
    mknod(&p.join("null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3));
    let mut all = vec!["--dax-window=64M"];
    all.extend_from_slice(args);
    let d = host::spawn(&host::daxfsd(), p, &all);
    let s = host::connect(&d, &DriverConfig::default());
    let w = s
        .dax()
        .cloned()
        .expect("daxfsd --dax-window=64M offers a window");
    assert_eq!(w.len(), W);
    let named = args.iter().any(|a| a.starts_with("--dax-mapping"));
    Rig {
        s,
        w,
        d,
        dir,
        cases: Cases::new("dax_abuse", test),
        pooled: vufs_driver::dax::pooled() && !named,
    }
}

fn traffic(st: &DaxStats) -> (u64, u64) {
    (st.map_requests, st.unmap_requests)
}

impl Rig {
    fn node(&self, name: &str) -> u64 {
        self.s.lookup(ROOT, name).unwrap().nodeid
    }

    /// `f` must fail with one of `want`, sending nothing to the frontend.
    fn reject(&mut self, what: &str, want: &[i32], f: impl FnOnce(&Session) -> io::Result<()>) {
        let (st, maps) = (self.w.stats(), self.w.mappings());
        let r = f(&self.s);
        let errno = match r {
            Ok(()) => panic!(
                "{what}: accepted; frontend traffic {:?} -> {:?}, mappings {:?}",
                traffic(&st),
                traffic(&self.w.stats()),
                self.w.mappings()
            ),
            Err(e) => e
                .raw_os_error()
                .unwrap_or_else(|| panic!("{what}: no errno: {e}")),
        };
        assert!(
            want.contains(&errno),
            "{what}: errno {errno}, want {want:?}"
        );
        assert_eq!(
            traffic(&self.w.stats()),
            traffic(&st),
            "{what}: refused, but SHMEM_MAP/UNMAP went to the frontend (mappings {:?})",
            self.w.mappings()
        );
        assert_eq!(self.w.mappings(), maps, "{what}: mappings changed");
        self.cases.case(what.to_string());
    }

    /// `f` must succeed sending exactly `maps` SHMEM_MAPs and `unmaps` SHMEM_UNMAPs, all
    /// accepted by the frontend.
    fn accept(
        &mut self,
        what: &str,
        (maps, unmaps): (u64, u64),
        f: impl FnOnce(&Session) -> io::Result<()>,
    ) {
        let st = self.w.stats();
        if let Err(e) = f(&self.s) {
            panic!("{what}: refused: {e}\nlog:\n{}", self.d.log_contents());
        }
        let now = self.w.stats();
        if self.pooled {
            // Pooled: one SHMEM request in the whole session (the pool), whatever the guest
            // maps.
            assert_eq!(
                (now.map_requests.min(1), now.unmap_requests),
                (1, 0),
                "{what}: frontend traffic {st:?} -> {now:?} (pooled)"
            );
            assert!(now.map_requests <= 1, "{what}: {now:?} (pooled)");
        } else {
            assert_eq!(
                (
                    now.map_requests - st.map_requests,
                    now.unmap_requests - st.unmap_requests
                ),
                (maps, unmaps),
                "{what}: frontend traffic {st:?} -> {now:?}"
            );
        }
        assert_eq!(
            (now.maps_rejected, now.unmaps_rejected),
            (st.maps_rejected, st.unmaps_rejected),
            "{what}: the frontend refused a request"
        );
        self.cases.case(what.to_string());
    }

    fn finish(mut self) {
        let v = self.s.device().violations();
        assert!(v.is_empty(), "violations: {v:?}");
        assert!(
            self.d.try_wait().unwrap().is_none(),
            "{}",
            self.d.log_contents()
        );
        let log = self.d.log_contents();
        assert!(!log.contains("panicked"), "{log}");
        let _ = &self.dir;
    }
}

fn map(s: &Session, n: u64, fh: u64, foff: u64, len: u64, flags: u64, moff: u64) -> io::Result<()> {
    s.setupmapping(n, fh, foff, len, flags, moff)
}

fn one(moffset: u64, len: u64) -> RemovemappingOne {
    RemovemappingOne { moffset, len }
}

/// A raw REMOVEMAPPING: `count` in the header, then `entries`, then `extra` bytes.
fn removemapping_raw(
    s: &Session,
    n: u64,
    count: u32,
    entries: &[RemovemappingOne],
    extra: &[u8],
) -> io::Result<()> {
    let mut arg = RemovemappingIn { count }.as_slice().to_vec();
    entries
        .iter()
        .for_each(|e| arg.extend_from_slice(e.as_slice()));
    arg.extend_from_slice(extra);
    s.call(op::REMOVEMAPPING, n, &[&arg], 0).map(drop)
}

#[test]
fn setupmapping_abuse_is_refused_before_the_frontend() {
    let mut r = rig("setupmapping_abuse_is_refused_before_the_frontend", &[]);
    let f = r.node("f");
    let fh = r.s.open(f, libc::O_RDWR as u32).unwrap().fh;
    // A live mapping to cut through: f's range 1 at window offset 4 MiB, and a small file's
    // 2 MiB range (file pages + shadow tail) at 8 MiB.
    r.accept("setup: f at 4M", (1, 0), |s| {
        map(s, f, fh, MIB2, MIB2, READ, 2 * MIB2)
    });
    let small = r.node("small");
    r.accept("setup: small file at 8M (file pages + tail)", (2, 0), |s| {
        map(s, small, NO_FH, 0, MIB2, READ | WRITE, 4 * MIB2)
    });
    let einval = &[libc::EINVAL];

    // Window range.
    for (what, moff, len) in [
        ("moffset at the window end", W, MIB2),
        ("range straddling the window end", W - MIB2 + PAGE, MIB2),
        ("last page plus one", W - PAGE, 2 * PAGE),
        ("moffset+len overflows", u64::MAX - PAGE + 1, 2 * PAGE),
        ("len 2^64-4096", 0, u64::MAX - PAGE + 1),
        ("len 2^63", PAGE, 1 << 63),
        ("moffset 2^63", 1 << 63, MIB2),
        ("len larger than the window", 0, W + PAGE),
        ("moffset unaligned (100)", 100, MIB2),
        ("moffset unaligned (2048)", 2048, MIB2),
        ("moffset unaligned (page - 1)", PAGE - 1, PAGE),
        ("len unaligned (100)", 0, 100),
        ("len unaligned (page + 1)", 0, PAGE + 1),
        ("len unaligned (2M - 1)", 0, MIB2 - 1),
        ("zero length", 0, 0),
        ("zero length at the window end", W, 0),
    ] {
        r.reject(&format!("SETUPMAPPING {what}"), einval, |s| {
            map(s, f, fh, 0, len, READ, moff)
        });
    }
    // File range.
    for (what, foff) in [
        ("foffset+len overflows", u64::MAX - PAGE + 1),
        ("foffset 2^64-2M", u64::MAX - MIB2 + 1),
        ("foffset unaligned (1)", 1),
        ("foffset unaligned (512)", 512),
        ("foffset unaligned (2M + 7)", MIB2 + 7),
    ] {
        r.reject(&format!("SETUPMAPPING {what}"), einval, |s| {
            map(s, f, fh, foff, MIB2, READ, 0)
        });
    }
    // Ranges cutting through live mappings.
    for (what, moff, len) in [
        (
            "over the first half of a live mapping",
            2 * MIB2 - PAGE,
            2 * PAGE,
        ),
        ("into a live mapping's end", 3 * MIB2 - PAGE, MIB2),
        ("inside a live mapping", 2 * MIB2 + PAGE, PAGE),
        (
            "the shadow tail of a live mapping",
            4 * MIB2 + (64 << 10),
            MIB2 - (64 << 10),
        ),
        ("the file part of a tailed mapping", 4 * MIB2, 64 << 10),
        (
            "across two live mappings, cutting one",
            3 * MIB2,
            MIB2 + PAGE,
        ),
    ] {
        r.reject(&format!("SETUPMAPPING {what}"), einval, |s| {
            map(s, f, fh, 0, len, READ, moff)
        });
    }

    // Handles.
    let g = r.node("g");
    let gfh = r.s.open(g, libc::O_RDWR as u32).unwrap().fh;
    let rofh = r.s.open(f, libc::O_RDONLY as u32).unwrap().fh;
    let released = r.s.open(f, libc::O_RDWR as u32).unwrap().fh;
    r.s.release(f, released, 0).unwrap();
    let d = r.node("d");
    let dfh = r.s.opendir(d, libc::O_RDONLY as u32).unwrap().fh;
    let ebadf = &[libc::EBADF];
    for (what, h) in [
        ("another inode's handle", gfh),
        ("a released handle", released),
        ("a directory handle", dfh),
        ("a forged handle (2^63)", 1 << 63),
        ("a forged handle (random)", 0x7357_0bad_f00d),
        ("a forged handle (2^64-2)", u64::MAX - 1),
    ] {
        r.reject(&format!("SETUPMAPPING with {what}"), ebadf, |s| {
            map(s, f, h, 0, MIB2, READ, 0)
        });
    }
    r.reject(
        "SETUPMAPPING writable through a read-only handle",
        &[libc::EACCES],
        |s| map(s, f, rofh, 0, MIB2, READ | WRITE, 0),
    );

    // Nodeids that are not regular files, or not at all.
    let l = r.node("l");
    let p = r.node("p");
    let not_files: Vec<(String, u64)> = [("directory", d), ("symlink", l), ("fifo", p)]
        .into_iter()
        .chain(
            ["mem", "null"]
                .into_iter()
                .filter(|n| r.dir.path().join(n).exists())
                .map(|n| ("device node", r.node(n))),
        )
        .map(|(k, n)| (k.to_string(), n))
        .collect();
    let anything = &[
        libc::EACCES,
        libc::EPERM,
        libc::EISDIR,
        libc::ELOOP,
        libc::EINVAL,
        libc::ENODEV,
        libc::EBADF,
    ];
    for (kind, n) in &not_files {
        for flags in [READ, READ | WRITE] {
            r.reject(
                &format!("SETUPMAPPING of a {kind} (fh -1, flags {flags})"),
                anything,
                |s| map(s, *n, NO_FH, 0, MIB2, flags, 0),
            );
        }
        r.reject(
            &format!("SETUPMAPPING of a {kind} with a file's handle"),
            ebadf,
            |s| map(s, *n, fh, 0, MIB2, READ, 0),
        );
    }
    if let Some((_, dn)) = not_files.iter().find(|(k, _)| k == "directory") {
        r.reject(
            "SETUPMAPPING of a directory with its own handle",
            ebadf,
            |s| map(s, *dn, dfh, 0, MIB2, READ, 0),
        );
    }
    let gone = r.node("g");
    r.s.forget(gone, 1).unwrap();
    for (what, n) in [
        ("nodeid 0", 0),
        ("nodeid 2^64-1", u64::MAX),
        ("a never-issued nodeid", 1 << 40),
    ] {
        r.reject(&format!("SETUPMAPPING of {what}"), ebadf, |s| {
            map(s, n, NO_FH, 0, MIB2, READ, 0)
        });
    }
    // Malformed argument.
    let a = SetupmappingIn {
        fh,
        foffset: 0,
        len: MIB2,
        flags: READ,
        moffset: 0,
    };
    r.reject("SETUPMAPPING with a truncated argument", einval, |s| {
        s.call(op::SETUPMAPPING, f, &[&a.as_slice()[..32]], 0)
            .map(drop)
    });
    r.reject("SETUPMAPPING with a 1-byte argument", einval, |s| {
        s.call(op::SETUPMAPPING, f, &[&a.as_slice()[..1]], 0)
            .map(drop)
    });

    // The live mappings still work.
    let mut buf = vec![0u8; 4096];
    r.w.read(2 * MIB2, &mut buf).unwrap();
    assert_eq!(
        buf,
        pattern(4 << 20, 1)[MIB2 as usize..MIB2 as usize + 4096]
    );
    r.finish();
}

#[test]
fn removemapping_abuse_is_refused_before_the_frontend() {
    let mut r = rig("removemapping_abuse_is_refused_before_the_frontend", &[]);
    let f = r.node("f");
    let small = r.node("small");
    r.accept("setup: f at 4M", (1, 0), |s| {
        map(s, f, NO_FH, 0, MIB2, READ, 2 * MIB2)
    });
    r.accept("setup: small at 8M", (2, 0), |s| {
        map(s, small, NO_FH, 0, MIB2, READ, 4 * MIB2)
    });
    let live = one(2 * MIB2, MIB2);
    let einval = &[libc::EINVAL];
    r.reject("REMOVEMAPPING count 0", einval, |s| {
        removemapping_raw(s, f, 0, &[], &[])
    });
    r.reject("REMOVEMAPPING count 0 with an entry", einval, |s| {
        removemapping_raw(s, f, 0, &[live], &[])
    });
    r.reject("REMOVEMAPPING count 2^32-1 with one entry", einval, |s| {
        removemapping_raw(s, f, u32::MAX, &[live], &[])
    });
    r.reject("REMOVEMAPPING count 2^31 with one entry", einval, |s| {
        removemapping_raw(s, f, 1 << 31, &[live], &[])
    });
    r.reject("REMOVEMAPPING count 2 with one entry", einval, |s| {
        removemapping_raw(s, f, 2, &[live], &[])
    });
    r.reject("REMOVEMAPPING count 1 with two entries", einval, |s| {
        removemapping_raw(s, f, 1, &[live, one(4 * MIB2, MIB2)], &[])
    });
    r.reject("REMOVEMAPPING count 1 with half an entry", einval, |s| {
        removemapping_raw(s, f, 1, &[], &live.as_slice()[..8])
    });
    r.reject(
        "REMOVEMAPPING count 1 with an entry and a half",
        einval,
        |s| removemapping_raw(s, f, 1, &[live], &live.as_slice()[..8]),
    );
    r.reject("REMOVEMAPPING without its header", einval, |s| {
        s.call(op::REMOVEMAPPING, f, &[&[1, 0]], 0).map(drop)
    });
    for (what, moff, len) in [
        ("at the window end", W, MIB2),
        ("straddling the window end", W - PAGE, 2 * PAGE),
        ("overflowing", u64::MAX - PAGE + 1, 2 * PAGE),
        ("of length 2^63", 0, 1 << 63),
        ("with an unaligned offset", 2 * MIB2 + 100, MIB2),
        ("with an unaligned length", 2 * MIB2, MIB2 + 1),
        ("of zero length", 2 * MIB2, 0),
        ("cutting a live mapping's head", 2 * MIB2, PAGE),
        ("cutting into a live mapping", MIB2, MIB2 + PAGE),
        ("inside a live mapping", 2 * MIB2 + PAGE, PAGE),
        (
            "of a tailed mapping's tail only",
            4 * MIB2 + (64 << 10),
            MIB2 - (64 << 10),
        ),
        ("of a tailed mapping's file part only", 4 * MIB2, 64 << 10),
    ] {
        r.reject(&format!("REMOVEMAPPING {what}"), einval, |s| {
            s.removemapping(f, &[one(moff, len)])
        });
    }
    // A bad range anywhere in the list: nothing is removed, not even the valid ranges.
    for (what, bad) in [
        ("out of the window", one(W, MIB2)),
        ("unaligned", one(100, PAGE)),
        ("of zero length", one(0, 0)),
        ("overflowing", one(u64::MAX - PAGE + 1, 2 * PAGE)),
    ] {
        r.reject(
            &format!("REMOVEMAPPING of a live range and one {what}"),
            einval,
            |s| s.removemapping(f, &[live, bad]),
        );
        r.reject(
            &format!("REMOVEMAPPING of one {what} and a live range"),
            einval,
            |s| s.removemapping(f, &[bad, live]),
        );
    }
    // Many entries, all bad.
    let many: Vec<RemovemappingOne> = (0..256).map(|i| one(W + i * PAGE, PAGE)).collect();
    r.reject("REMOVEMAPPING of 256 ranges past the window", einval, |s| {
        s.removemapping(f, &many)
    });

    let mut buf = vec![0u8; 4096];
    r.w.read(2 * MIB2, &mut buf).unwrap();
    assert_eq!(buf, pattern(4 << 20, 1)[..4096]);
    // Direct: exactly the live range in the frontend; pooled: the pool, the whole window.
    let held = if vufs_driver::dax::pooled() {
        W
    } else {
        2 * MIB2
    };
    assert_eq!(
        r.w.mappings().iter().map(|m| m.len).sum::<u64>(),
        held,
        "{:?}",
        r.w.mappings()
    );
    r.finish();
}

/// The frontend mappings valid edge cases make, one by one: direct mappings (a pooled window
/// accepts the same requests with no SHMEM request: the tests above run pooled too).
#[test]
fn valid_edge_cases_are_accepted() {
    let mut r = rig("valid_edge_cases_are_accepted", &["--dax-mapping=direct"]);
    let f = r.node("f");
    let g = r.node("g");
    let small = r.node("small");
    let big = r.node("big");
    let fdata = pattern(4 << 20, 1);
    let gdata = pattern(4 << 20, 2);
    let mut buf = vec![0u8; 4096];

    r.accept("map the very last page of the window", (1, 0), |s| {
        map(s, f, NO_FH, 0, PAGE, READ, W - PAGE)
    });
    r.w.read(W - PAGE, &mut buf).unwrap();
    assert_eq!(buf, fdata[..4096]);
    r.accept("map the last 2 MiB range of the window", (1, 1), |s| {
        map(s, f, NO_FH, MIB2, MIB2, READ, W - MIB2)
    });
    r.w.read(W - PAGE, &mut buf).unwrap();
    assert_eq!(buf, fdata[2 * MIB2 as usize - 4096..2 * MIB2 as usize]);
    r.accept("remove the last range", (0, 1), |s| {
        s.removemapping(f, &[one(W - MIB2, MIB2)])
    });

    // Read-only, then the same range writable: UNMAP then MAP, and writes reach the file.
    let fh = r.s.open(f, libc::O_RDWR as u32).unwrap().fh;
    r.accept("map read-only", (1, 0), |s| map(s, f, fh, 0, MIB2, READ, 0));
    assert!(!r.w.mappings()[0].writable);
    r.accept("upgrade the live range to writable", (1, 1), |s| {
        map(s, f, fh, 0, MIB2, READ | WRITE, 0)
    });
    assert_eq!(
        r.w.mappings(),
        vec![Mapping {
            shm_offset: 0,
            len: MIB2,
            fd_offset: 0,
            writable: true
        }]
    );
    r.w.write(4096, b"through-the-window").unwrap();
    assert_eq!(
        &fs::read(r.dir.path().join("f")).unwrap()[4096..4114],
        b"through-the-window"
    );
    // The same range again, read-only: a downgrade is a remap too.
    r.accept("downgrade the live range to read-only", (1, 1), |s| {
        map(s, f, fh, 0, MIB2, READ, 0)
    });
    // Another file at the same window offset: a remap.
    r.accept("remap the live range to another file", (1, 1), |s| {
        map(s, g, NO_FH, 0, MIB2, READ, 0)
    });
    r.w.read(0, &mut buf).unwrap();
    assert_eq!(buf, gdata[..4096]);

    r.accept("remove an unmapped range (nothing sent)", (0, 0), |s| {
        s.removemapping(f, &[one(16 * MIB2, MIB2)])
    });
    r.accept(
        "remove an unmapped range that touches a live one",
        (0, 0),
        |s| s.removemapping(f, &[one(MIB2, MIB2)]),
    );
    // A small file: its whole pages from the file, the rest from a shadow tail.
    r.accept(
        "map 2 MiB of a 64 KiB file (file pages + tail)",
        (2, 0),
        |s| map(s, small, NO_FH, 0, MIB2, READ, 2 * MIB2),
    );
    r.w.read(2 * MIB2, &mut buf).unwrap();
    assert_eq!(buf, pattern(64 << 10, 3)[..4096]);
    r.w.read(2 * MIB2 + (64 << 10), &mut buf).unwrap();
    assert!(buf.iter().all(|b| *b == 0), "past EOF reads zeros");
    r.accept("map a range wholly past EOF (tail only)", (1, 0), |s| {
        map(s, small, NO_FH, MIB2, MIB2, READ, 3 * MIB2)
    });
    // Writable through a write-only handle (the daemon maps a read-write descriptor).
    let wofh = r.s.open(g, libc::O_WRONLY as u32).unwrap().fh;
    r.accept("map writable through a write-only handle", (1, 0), |s| {
        map(s, g, wofh, MIB2, MIB2, READ | WRITE, 5 * MIB2)
    });
    // One request removing several whole mappings (one of them with a tail).
    r.accept("remove three mappings in one request", (0, 4), |s| {
        s.removemapping(f, &[one(0, MIB2), one(2 * MIB2, MIB2), one(3 * MIB2, MIB2)])
    });
    // A range wholly covering several live mappings replaces them.
    r.accept("map over two whole live ranges", (1, 1), |s| {
        map(s, f, NO_FH, 0, 2 * MIB2, READ, 4 * MIB2)
    });
    // The whole window at once, then all of it removed.
    r.accept("remove everything", (0, 1), |s| {
        s.removemapping(f, &[one(0, W)])
    });
    assert!(r.w.mappings().is_empty(), "{:?}", r.w.mappings());
    r.accept("map the whole window in one request", (1, 0), |s| {
        map(s, big, NO_FH, 0, W, READ, 0)
    });
    let many: Vec<RemovemappingOne> = (0..32).map(|i| one(i * MIB2, MIB2)).collect();
    r.reject(
        "remove 32 ranges cutting the whole-window mapping",
        &[libc::EINVAL],
        |s| s.removemapping(f, &many),
    );
    r.accept("remove the whole window", (0, 1), |s| {
        s.removemapping(big, &[one(0, W)])
    });
    r.accept("map 32 ranges", (32, 0), |s| {
        (0..32).try_for_each(|i| map(s, f, NO_FH, 0, MIB2, READ, i * MIB2))
    });
    r.accept("remove 32 ranges in one request", (0, 32), |s| {
        s.removemapping(f, &many)
    });
    r.finish();
}

/// `--readonly`: QEMU maps every DAX range writable, so daxfsd refuses `--dax-window` with
/// `--readonly` at start-up, and a read-only share without a window refuses every mapping
/// (nothing can reach a frontend: there is no window). Also: DAX requests before INIT.
#[test]
fn readonly_share_and_requests_before_init() {
    let mut cases = Cases::new("dax_abuse", "readonly_share_and_requests_before_init");
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("f"), pattern(4 << 20, 1)).unwrap();
    let refused = Daemon::builder(&host::daxfsd())
        .unwrap()
        .shared_dir(dir.path())
        .arg("--seccomp=none")
        .arg("--readonly")
        .arg("--dax-window=64M")
        .spawn();
    match refused {
        Ok(d) => panic!(
            "daxfsd started with --readonly --dax-window:\n{}",
            d.log_contents()
        ),
        Err(e) => assert!(e.to_string().contains("--readonly"), "{e}"),
    }
    cases.case("--readonly with --dax-window refused at start-up");

    let mut d = host::spawn(&host::daxfsd(), dir.path(), &["--readonly"]);
    let s = host::connect(&d, &DriverConfig::default());
    assert!(s.dax().is_none() && s.device().info().shmem_sizes.is_empty());
    let f = s.lookup(ROOT, "f").unwrap().nodeid;
    let rofh = s.open(f, libc::O_RDONLY as u32).unwrap().fh;
    for (what, fh, flags) in [
        ("writable, fh -1", NO_FH, READ | WRITE),
        ("writable, read-only handle", rofh, READ | WRITE),
        ("write-only, fh -1", NO_FH, WRITE),
        ("read-only", rofh, READ),
    ] {
        let e = host::errno_of(
            &format!("SETUPMAPPING {what} on a read-only share"),
            map(&s, f, fh, 0, MIB2, flags, 0),
        );
        assert!(
            [libc::EACCES, libc::EROFS, libc::ENOSYS].contains(&e),
            "{what}: {e}"
        );
        cases.case(format!(
            "SETUPMAPPING {what} on a read-only share without a window"
        ));
    }
    assert!(s.device().violations().is_empty());
    assert!(d.try_wait().unwrap().is_none(), "{}", d.log_contents());
    drop(s);
    drop(d);

    // DAX requests before INIT.
    let d2 = host::spawn(&host::daxfsd(), dir.path(), &["--dax-window=64M"]);
    let s2 = Session::connect(d2.socket_path()).unwrap();
    let w2 = s2.dax().cloned().unwrap();
    let e = host::errno_of(
        "SETUPMAPPING before INIT",
        s2.setupmapping(1, NO_FH, 0, MIB2, READ, 0),
    );
    assert_eq!(e, libc::EIO);
    let e = host::errno_of(
        "REMOVEMAPPING before INIT",
        s2.removemapping(1, &[one(0, MIB2)]),
    );
    assert_eq!(e, libc::EIO);
    assert_eq!(traffic(&w2.stats()), (0, 0));
    assert!(s2.device().violations().is_empty());
    cases.case("SETUPMAPPING before INIT");
    cases.case("REMOVEMAPPING before INIT");
}
