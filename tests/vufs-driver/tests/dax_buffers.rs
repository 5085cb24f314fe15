//! Requests whose data buffers lie in the DAX window (issue #43): a guest `write(2)` or
//! `O_DIRECT` write from a DAX mapping, a `read` into one. The driver reports every window
//! mapping in the backend's memory table at the window's guest-physical address, as QEMU 11.1
//! does, and points the request's data descriptors there. Each case runs in both mapping
//! modes (`--dax-mapping pooled`, the default, and `direct`).

mod common;

use std::fs;
use std::time::Duration;

use daxfsd::abi::SETUPMAPPING_FLAG_WRITE as WRITE;
use daxfsd::abi::{self, opcode, ReadIn, WriteIn, SETUPMAPPING_FLAG_READ as READ};
use vm_memory::ByteValued;
use vufs_driver::{DriverConfig, Reply, Seg, Session};

const MIB2: u64 = 2 << 20;
const PAGE: usize = 4096;
const ROOT: u64 = abi::ROOT_ID;
/// The window's guest-physical address: above the driver's guest RAM.
const WINDOW_GPA: u64 = 1 << 40;
const MODES: [&str; 2] = ["pooled", "direct"];

fn rig(mode: &str, prep: impl FnOnce(&std::path::Path)) -> Option<common::Rig> {
    rig_in(None, mode, prep)
}

fn rig_in(
    dir: Option<&std::path::Path>,
    mode: &str,
    prep: impl FnOnce(&std::path::Path),
) -> Option<common::Rig> {
    if !common::only_daxfsd("dax_buffers") {
        return None;
    }
    let cfg = DriverConfig {
        window_gpa: Some(WINDOW_GPA),
        ..DriverConfig::default()
    };
    let mode = format!("--dax-mapping={mode}");
    Some(common::start_in(
        dir,
        &["--dax-window=64M", &mode, "--cache=auto"],
        &cfg,
        prep,
    ))
}

fn write_in(fh: u64, offset: u64, size: usize) -> Vec<u8> {
    WriteIn {
        fh,
        offset,
        size: size as u32,
        ..Default::default()
    }
    .as_slice()
    .to_vec()
}

/// A WRITE of `nodeid` at `offset` whose data is the window bytes at the given (window
/// offset, length) pieces.
fn write_from_window(
    s: &Session,
    nodeid: u64,
    fh: u64,
    offset: u64,
    pieces: &[(u64, u32)],
) -> Reply {
    let size: usize = pieces.iter().map(|p| p.1 as usize).sum();
    let arg = write_in(fh, offset, size);
    let hdr = s.header(opcode::WRITE, nodeid, arg.len() + size);
    let mut segs = vec![Seg::Readable(hdr.as_slice().to_vec()), Seg::Readable(arg)];
    segs.extend(pieces.iter().map(|&(m, len)| Seg::Raw {
        addr: WINDOW_GPA + m,
        len,
        writable: false,
    }));
    segs.push(Seg::Writable(16));
    segs.push(Seg::Writable(8));
    s.send_chain(1, segs).expect("WRITE reply")
}

/// A READ of `size` bytes of `nodeid` at `offset` into the window at `moffset`.
fn read_into_window(
    s: &Session,
    nodeid: u64,
    fh: u64,
    offset: u64,
    moffset: u64,
    size: u32,
) -> Reply {
    let arg = ReadIn {
        fh,
        offset,
        size,
        ..Default::default()
    };
    let hdr = s.header(opcode::READ, nodeid, arg.as_slice().len());
    let segs = vec![
        Seg::Readable(hdr.as_slice().to_vec()),
        Seg::Readable(arg.as_slice().to_vec()),
        Seg::Writable(16),
        Seg::Raw {
            addr: WINDOW_GPA + moffset,
            len: size,
            writable: true,
        },
    ];
    s.send_chain(1, segs).expect("READ reply")
}

/// The out-header's error, and the bytes it says were written or read.
fn outcome(mode: &str, r: &Reply, log: &str) -> (i32, u32) {
    let h = r.header().unwrap_or_else(|| {
        panic!(
            "{mode}: no out-header (used len {}): {r:?}\nlog:\n{log}",
            r.used_len
        )
    });
    if h.error != 0 {
        return (h.error, 0);
    }
    let body = r.body();
    if body.len() >= 8 && h.len as usize == 16 + 8 && r.capacity == 24 {
        // A WRITE's fuse_write_out.
        return (0, u32::from_le_bytes(body[..4].try_into().unwrap()));
    }
    (0, h.len - 16)
}

/// t_mmap_writev_overlap (fstests generic/638): two pages of a file mapped, 64 bytes of 0xAA
/// at the start of each, then a write of those two mapped 64-byte pieces back into the same
/// file at `2 * page - 64`: the write's second half lands in a page that is also a source.
#[test]
fn write_from_a_mapping_of_the_same_file_with_overlapping_pages() {
    for mode in MODES {
        let mut init = vec![0x55u8; 2 * PAGE];
        init[..64].fill(0xAA);
        init[PAGE..PAGE + 64].fill(0xAA);
        let Some(mut r) = rig(mode, |d| fs::write(d.join("f"), &init).unwrap()) else {
            return;
        };
        let s = &r.s;
        let f = s.lookup(ROOT, "f").unwrap().nodeid;
        let fh = s.open(f, libc::O_RDWR as u32).unwrap().fh;
        s.setupmapping(f, fh, 0, MIB2, READ | WRITE, 0).unwrap();
        let rep = write_from_window(
            s,
            f,
            fh,
            2 * PAGE as u64 - 64,
            &[(0, 64), (PAGE as u64, 64)],
        );
        let log = r.daemon.log_contents();
        assert_eq!(
            outcome(mode, &rep, &log),
            (0, 128),
            "{mode}: {rep:?}\nlog:\n{log}"
        );
        s.fsync(f, fh, false).unwrap();
        let mut want = init.clone();
        want[2 * PAGE - 64..].fill(0xAA);
        want.extend_from_slice(&[0xAA; 64]);
        assert_eq!(
            s.read(f, fh, 0, 3 * PAGE as u32).unwrap(),
            want,
            "{mode}: through FUSE"
        );
        assert_eq!(
            fs::read(r.root.path().join("f")).unwrap(),
            want,
            "{mode}: host file"
        );
        s.release(f, fh, 0).unwrap();
        r.assert_clean();
    }
}

/// An `O_DIRECT` write of one file whose buffer is a DAX mapping of another (fstests
/// generic/708), across the boundary of two mapped ranges, at an odd offset.
#[test]
fn write_from_a_mapping_of_another_file() {
    for mode in MODES {
        let src = common::bytes(2 * MIB2 as usize, 7);
        let Some(mut r) = rig(mode, |d| {
            fs::write(d.join("src"), &src).unwrap();
            fs::write(d.join("dst"), b"").unwrap();
        }) else {
            return;
        };
        let s = &r.s;
        let a = s.lookup(ROOT, "src").unwrap().nodeid;
        let afh = s.open(a, libc::O_RDONLY as u32).unwrap().fh;
        s.setupmapping(a, afh, 0, MIB2, READ, 0).unwrap();
        s.setupmapping(a, afh, MIB2, MIB2, READ, MIB2).unwrap();
        let b = s.lookup(ROOT, "dst").unwrap().nodeid;
        let bfh = s.open(b, libc::O_RDWR as u32).unwrap().fh;
        let from = MIB2 - 3 * PAGE as u64 + 100;
        let len = 6 * PAGE as u32;
        let rep = write_from_window(s, b, bfh, 4096, &[(from, len)]);
        let log = r.daemon.log_contents();
        assert_eq!(
            outcome(mode, &rep, &log),
            (0, len),
            "{mode}: {rep:?}\nlog:\n{log}"
        );
        let got = fs::read(r.root.path().join("dst")).unwrap();
        assert_eq!(got.len(), 4096 + len as usize, "{mode}");
        assert!(got[..4096].iter().all(|&b| b == 0), "{mode}: hole");
        assert!(
            got[4096..] == src[from as usize..from as usize + len as usize],
            "{mode}: the written bytes are not the mapped file's"
        );
        r.assert_clean();
    }
}

/// A `read` of one file into a writable DAX mapping of another: the bytes are what the guest
/// then sees through its mapping, and they reach the mapped file.
#[test]
fn read_into_a_mapping() {
    for mode in MODES {
        let data = common::bytes(64 << 10, 3);
        let old = common::bytes(MIB2 as usize, 9);
        let Some(mut r) = rig(mode, |d| {
            fs::write(d.join("data"), &data).unwrap();
            fs::write(d.join("target"), &old).unwrap();
        }) else {
            return;
        };
        let s = &r.s;
        let w = s.dax().cloned().expect("window");
        let t = s.lookup(ROOT, "target").unwrap().nodeid;
        let tfh = s.open(t, libc::O_RDWR as u32).unwrap().fh;
        s.setupmapping(t, tfh, 0, MIB2, READ | WRITE, 0).unwrap();
        let d = s.lookup(ROOT, "data").unwrap().nodeid;
        let dfh = s.open(d, libc::O_RDONLY as u32).unwrap().fh;
        let (at, len) = (8192 + 7u64, 40_000u32);
        let rep = read_into_window(s, d, dfh, 100, at, len);
        let log = r.daemon.log_contents();
        assert_eq!(
            outcome(mode, &rep, &log),
            (0, len),
            "{mode}: {rep:?}\nlog:\n{log}"
        );
        let want = &data[100..100 + len as usize];
        let mut seen = vec![0u8; len as usize];
        w.read(at, &mut seen).unwrap();
        assert!(
            seen == want,
            "{mode}: the guest's mapping does not hold the bytes read"
        );
        s.fsync(t, tfh, false).unwrap();
        let mut file = old.clone();
        file[at as usize..at as usize + len as usize].copy_from_slice(want);
        assert!(
            fs::read(r.root.path().join("target")).unwrap() == file,
            "{mode}: the mapped file does not hold the bytes read"
        );
        s.release(t, tfh, 0).unwrap();
        r.assert_clean();
    }
}

/// A host process truncates the file behind a request's buffer just before the request:
/// the request fails with EIO or completes (never the chain, never the daemon), and the
/// daemon serves the next requests. On the system's temporary directory (ext4 here: the host
/// watch moves direct mappings to shadows before the shrink) and on tmpfs (no pre-content
/// events: the direct mapping's file really shrinks under it, and the requests get EIO).
#[test]
fn host_truncate_of_the_file_behind_a_buffer() {
    let shm = std::path::Path::new("/dev/shm");
    assert!(shm.is_dir(), "/dev/shm (tmpfs) is needed for this test");
    for (dir, mode) in [
        (None, "pooled"),
        (None, "direct"),
        (Some(shm), "pooled"),
        (Some(shm), "direct"),
    ] {
        let src = common::bytes(MIB2 as usize, 5);
        let Some(mut r) = rig_in(dir, mode, |d| {
            fs::write(d.join("src"), &src).unwrap();
            fs::write(d.join("dst"), b"").unwrap();
            fs::write(d.join("data"), common::bytes(8192, 1)).unwrap();
        }) else {
            return;
        };
        let s = r.s.with_timeout(Duration::from_secs(20));
        let a = s.lookup(ROOT, "src").unwrap().nodeid;
        let afh = s.open(a, libc::O_RDWR as u32).unwrap().fh;
        s.setupmapping(a, afh, 0, MIB2, READ | WRITE, 0).unwrap();
        let b = s.lookup(ROOT, "dst").unwrap().nodeid;
        let bfh = s.open(b, libc::O_RDWR as u32).unwrap().fh;
        fs::OpenOptions::new()
            .write(true)
            .open(r.root.path().join("src"))
            .unwrap()
            .set_len(4096)
            .unwrap();
        let log = || r.daemon.log_contents();
        // From the shrunk range into another file, and from another file into it.
        let w = write_from_window(&s, b, bfh, 0, &[(65536, 65536)]);
        let (err, n) = outcome(mode, &w, &log());
        assert!(
            err == -libc::EIO || (err == 0 && n == 65536),
            "{mode}: write {w:?}"
        );
        let c = s.lookup(ROOT, "data").unwrap().nodeid;
        let cfh = s.open(c, libc::O_RDONLY as u32).unwrap().fh;
        let rd = read_into_window(&s, c, cfh, 0, 65536, 4096);
        let (err, _) = outcome(mode, &rd, &log());
        assert!(err == -libc::EIO || err == 0, "{mode}: read {rd:?}");
        eprintln!(
            "{mode} in {}: write from the shrunk range: {}; read into it: {}",
            dir.map_or("the temporary directory".into(), |d| d
                .display()
                .to_string()),
            if w.header().unwrap().error == 0 {
                "completed"
            } else {
                "EIO"
            },
            if err == 0 { "completed" } else { "EIO" },
        );
        let alive = r.daemon.try_wait().unwrap().is_none();
        assert!(alive, "{mode}: daemon died\n{}", r.daemon.log_contents());
        // The next requests are served.
        assert_eq!(s.write(b, bfh, 0, b"after").unwrap(), 5);
        assert_eq!(&s.read(b, bfh, 0, 5).unwrap(), b"after");
        s.getattr(ROOT, None).unwrap();
        r.assert_clean();
    }
}

/// A chain with a data buffer outside guest memory and outside the window, whose header and
/// out-header are fine, is answered with EIO: the request fails, it is not completed as if
/// served (a reply of 0 bytes, which Linux reads as a success with a zeroed out-header).
#[test]
fn a_buffer_outside_memory_is_answered_with_eio() {
    let Some(mut r) = rig("direct", |d| fs::write(d.join("f"), b"x").unwrap()) else {
        return;
    };
    let s = &r.s;
    let f = s.lookup(ROOT, "f").unwrap().nodeid;
    let fh = s.open(f, libc::O_RDWR as u32).unwrap().fh;
    let arg = write_in(fh, 0, 64);
    let hdr = s.header(opcode::WRITE, f, arg.len() + 64);
    let segs = vec![
        Seg::Readable(hdr.as_slice().to_vec()),
        Seg::Readable(arg),
        Seg::Raw {
            addr: 1 << 50,
            len: 64,
            writable: false,
        },
        Seg::Writable(16),
        Seg::Writable(8),
    ];
    let rep = s.send_chain(1, segs).unwrap();
    let h = rep
        .header()
        .unwrap_or_else(|| panic!("no reply header: {rep:?}"));
    assert_eq!(
        (h.error, h.unique, rep.used_len),
        (-libc::EIO, hdr.unique, 16)
    );
    assert_eq!(fs::read(r.root.path().join("f")).unwrap(), b"x");
    s.getattr(ROOT, None).unwrap();
    r.assert_clean();
}

/// A host truncate while requests store into the truncated file's range through the window
/// (READs into a direct mapping, as fast as they complete): every request completes or fails
/// with EIO, and once the truncate returned the file keeps its new size (a store never lands
/// after the shrink and extends the file again; ext4 announces the shrink, the mapping moves
/// to a shadow first). Rounds with the truncate at varying moments.
#[test]
fn host_truncate_while_requests_store_into_the_file() {
    for mode in MODES {
        let Some(mut r) = rig(mode, |d| {
            fs::write(d.join("data"), common::bytes(4096, 1)).unwrap();
        }) else {
            return;
        };
        let s = r.s.with_timeout(Duration::from_secs(20));
        let path = r.root.path().join("t");
        let c = s.lookup(ROOT, "data").unwrap().nodeid;
        let cfh = s.open(c, libc::O_RDONLY as u32).unwrap().fh;
        let (mut eio, mut done) = (0, 0);
        for round in 0..20u64 {
            fs::write(&path, common::bytes(MIB2 as usize, round as u8)).unwrap();
            let t = s.lookup(ROOT, "t").unwrap().nodeid;
            let tfh = s.open(t, libc::O_RDWR as u32).unwrap().fh;
            s.setupmapping(t, tfh, 0, MIB2, READ | WRITE, 0).unwrap();
            let p2 = path.clone();
            let host = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_micros(200 * (round % 7)));
                fs::OpenOptions::new()
                    .write(true)
                    .open(&p2)
                    .unwrap()
                    .set_len(4096)
                    .unwrap();
            });
            while !host.is_finished() {
                let rd = read_into_window(&s, c, cfh, 0, 65536, 4096);
                match outcome(mode, &rd, "") {
                    (0, 4096) => done += 1,
                    (e, _) if e == -libc::EIO => eio += 1,
                    other => panic!("{mode}: READ into the window: {other:?}"),
                }
            }
            host.join().unwrap();
            assert_eq!(
                fs::metadata(&path).unwrap().len(),
                4096,
                "{mode}, round {round}: a store extended the file after the host's truncate"
            );
            let one = abi::RemovemappingOne {
                moffset: 0,
                len: MIB2,
            };
            s.removemapping(t, &[one]).unwrap();
            s.release(t, tfh, 0).unwrap();
            assert_eq!(
                fs::metadata(&path).unwrap().len(),
                4096,
                "{mode}, round {round}: after the unmap"
            );
        }
        eprintln!("{mode}: {done} READs into the window completed, {eio} got EIO");
        r.assert_clean();
    }
}
