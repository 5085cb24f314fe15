//! Host changes to a file the DAX window maps (issue #20, item b).
//!
//! QEMU puts every SHMEM mapping into the backend's memory table (its vhost memory listener
//! sends ADD_MEM_REG or SET_MEM_TABLE with the mapped file's descriptor), so the daemon maps
//! the file too. When a host process shrinks the file, the daemon's mapping has pages past
//! the end of file: a guest descriptor pointing there must fail that request only, never
//! make the daemon read through the mapping (a SIGBUS that kills it).
//!
//! daxfsd only (upstream virtiofsd has no DAX window).

mod common;
#[path = "common/host.rs"]
mod host;

use std::fs;
use std::os::fd::AsRawFd;
use std::time::Duration;

use daxfsd::abi::{
    self, RemovemappingOne, SETUPMAPPING_FLAG_READ as READ, SETUPMAPPING_FLAG_WRITE as WRITE,
};
use vhost::VhostBackend;
use vhost::VhostUserMemoryRegionInfo;
use vufs_driver::{DriverConfig, Seg};

const ROOT: u64 = abi::ROOT_ID;
const MIB2: u64 = 2 << 20;

#[test]
fn a_descriptor_into_a_shrunk_mapped_file_fails_only_its_request() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    fs::write(p.join("f"), vec![0x5a; 4 << 20]).unwrap();
    fs::write(p.join("g"), b"untouched").unwrap();
    let mut d = host::spawn(
        &host::daxfsd(),
        p,
        &["--dax-window=64M", "--dax-copy=off", "--dax-mapping=direct"],
    );
    let cfg = DriverConfig::default();
    let s = host::connect(&d, &cfg);
    let w = s.dax().cloned().expect("a DAX window");

    // The guest maps the first 2 MiB of f writable: a direct mapping of the file.
    let f = s.lookup(ROOT, "f").unwrap().nodeid;
    let fh = s.open(f, libc::O_RDWR as u32).unwrap().fh;
    s.setupmapping(f, fh, 0, MIB2, READ | WRITE, 0).unwrap();
    let maps = w.mappings();
    assert!(
        maps.iter().any(|m| m.shm_offset == 0 && m.len == MIB2),
        "no direct mapping: {maps:?}"
    );

    // What QEMU's memory listener does with that mapping: the backend's memory table gets
    // the file range at the window's guest-physical address (here above guest RAM).
    let ram = s.device().mem().region_info().unwrap();
    let host_file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p.join("f"))
        .unwrap();
    let gpa = (cfg.mem_base + cfg.mem_size).next_multiple_of(1 << 30);
    let file_region = VhostUserMemoryRegionInfo {
        guest_phys_addr: gpa,
        memory_size: MIB2,
        userspace_addr: w.as_ptr() as u64,
        mmap_offset: 0,
        mmap_handle: host_file.as_raw_fd(),
    };
    s.device()
        .with_frontend(true, |fe| fe.set_mem_table(&[ram, file_region]))
        .unwrap();

    // A host process shrinks the file.
    host_file.set_len(0).unwrap();

    // A request whose header (read by the daemon itself, not by a system call) lies in the
    // shrunk mapping: a GETATTR of the root.
    let g = s.lookup(ROOT, "g").unwrap().nodeid;
    let gfh = s.open(g, libc::O_RDWR as u32).unwrap().fh;
    let segs = vec![
        Seg::Raw {
            addr: gpa + 8192,
            len: (std::mem::size_of::<abi::InHeader>() + std::mem::size_of::<abi::GetattrIn>())
                as u32,
            writable: false,
        },
        Seg::Writable(16 + 104),
    ];
    let res = s.with_timeout(Duration::from_secs(10)).send_chain(1, segs);
    let alive = match &res {
        Ok(_) => d.try_wait().unwrap(),
        // The backend hung up: how did it end?
        Err(_) => d.wait_exit(Duration::from_secs(5)).ok(),
    };
    assert!(
        alive.is_none(),
        "the daemon died ({alive:?}) on a descriptor into a shrunk mapped file (reply {res:?})\nlog:\n{}",
        d.log_contents()
    );
    let rep = res.unwrap_or_else(|e| panic!("no reply: {e}\nlog:\n{}", d.log_contents()));
    if let Some(h) = rep.header() {
        assert!(
            h.error < 0,
            "a request read from a shrunk mapping succeeded: {h:?}"
        );
    }
    // Only that request failed: the daemon serves the next ones, and g is unchanged.
    s.getattr(ROOT, None).unwrap();
    assert_eq!(fs::read(p.join("g")).unwrap(), b"untouched");
    assert_eq!(s.read(g, gfh, 0, 64).unwrap(), b"untouched");
}

/// Two daemons map one file directly (two guests sharing a directory, `--dax-mapping=direct`),
/// both at once. Each SETUPMAPPING makes the frontend `mmap` the file: a pre-content event for
/// the other daemon's watch. Were such events queued behind the other daemon's watch worker,
/// which may itself be waiting for its frontend to answer a SHMEM request while that frontend
/// waits in an `mmap` of the file for the first daemon, the two would wait on each other for
/// ever (found by `make bench`'s density section: four QEMUs, one file). An mmap, read or write
/// cannot shrink the file: it passes at once and moves nothing. A host truncate then still
/// moves both daemons' mappings to shadows before it goes on.
#[test]
fn two_daemons_mapping_one_file_wait_for_no_one() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    fs::write(p.join("f"), vec![0x5a; 8 << 20]).unwrap();
    let args = ["--dax-window=64M", "--dax-mapping=direct", "--dax-copy=off"];
    let mut ds = [
        host::spawn(&host::daxfsd(), p, &args),
        host::spawn(&host::daxfsd(), p, &args),
    ];
    let cfg = DriverConfig::default();
    let ss: Vec<_> = ds.iter().map(|d| host::connect(d, &cfg)).collect();
    let files: Vec<(u64, u64)> = ss
        .iter()
        .map(|s| {
            let f = s.lookup(ROOT, "f").unwrap().nodeid;
            (f, s.open(f, libc::O_RDONLY as u32).unwrap().fh)
        })
        .collect();
    let logs = |ds: &[vufs_driver::Daemon]| {
        ds.iter()
            .map(|d| d.log_contents())
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    // Within `secs`, or the daemons are killed (their fanotify groups closed: whatever waits
    // on them goes on) and the test fails.
    let within =
        |ds: &mut [vufs_driver::Daemon], secs, what: &str, rx: std::sync::mpsc::Receiver<()>| {
            if rx.recv_timeout(Duration::from_secs(secs)).is_err() {
                let l = logs(ds);
                for d in ds.iter_mut() {
                    let _ = d.kill();
                }
                panic!("{what} still waits after {secs} s\nlogs:\n{l}");
            }
        };

    // Each daemon opens the file for its mappings once (the first SETUPMAPPING): that open
    // moves the other's mappings (an open may truncate). None after that.
    for (s, &(f, fh)) in ss.iter().zip(&files) {
        s.setupmapping(f, fh, 0, MIB2, READ, 0).unwrap();
    }
    let moved = |d: &vufs_driver::Daemon| d.log_contents().matches("moved to shadows").count();
    let before: Vec<usize> = ds.iter().map(moved).collect();

    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|sc| {
        for (s, &(f, fh)) in ss.iter().zip(&files) {
            let tx = tx.clone();
            sc.spawn(move || {
                for _ in 0..10 {
                    for i in 0..4 {
                        s.setupmapping(f, fh, i * MIB2, MIB2, READ, i * MIB2)
                            .unwrap();
                    }
                    let all: Vec<_> = (0..4)
                        .map(|i| RemovemappingOne {
                            moffset: i * MIB2,
                            len: MIB2,
                        })
                        .collect();
                    s.removemapping(f, &all).unwrap();
                }
                for i in 0..4 {
                    s.setupmapping(f, fh, i * MIB2, MIB2, READ, i * MIB2)
                        .unwrap();
                }
                let _ = tx.send(());
            });
        }
        // (A thread that failed drops its sender: the wait ends at once.)
        drop(tx);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let done = (0..2).all(|_| {
            rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
                .is_ok()
        });
        if !done {
            let l = logs(&ds);
            for d in ds.iter_mut() {
                let _ = d.kill();
            }
            panic!("two daemons mapping one file still wait after 60 s\nlogs:\n{l}");
        }
    });
    for (d, n) in ds.iter().zip(before) {
        assert_eq!(
            moved(d),
            n,
            "another daemon's mmaps or SETUPMAPPINGs moved mappings:\n{}",
            d.log_contents()
        );
    }

    let path = p.join("f");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(1 << 20))
            .unwrap();
        let _ = tx.send(());
    });
    within(&mut ds, 30, "the host truncate", rx);
    assert_eq!(fs::metadata(p.join("f")).unwrap().len(), 1 << 20);
    for (s, d) in ss.iter().zip(&ds) {
        // Both serve on; the mappings past the new end left the file before it shrank.
        s.getattr(ROOT, None).unwrap();
        assert!(
            d.log_contents().contains("moved to shadows"),
            "no evacuation:\n{}",
            d.log_contents()
        );
    }
}

/// The inode marks of `pid`'s fanotify group (its fdinfo lists one "fanotify ino:" line each).
fn fanotify_marks(pid: u32) -> usize {
    let mut n = 0;
    for e in fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        let is_group =
            fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("[fanotify]"));
        if is_group {
            let fd = e.file_name();
            let info = fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.to_string_lossy()))
                .unwrap_or_default();
            n += info
                .lines()
                .filter(|l| l.starts_with("fanotify ino:"))
                .count();
        }
    }
    n
}

/// While the VM is paused (its vrings stopped: QEMU `stop`, a snapshot) no SHMEM request may
/// reach QEMU, so a host open of a mapped file waits for the device to run again, up to a
/// bound. 20 host opens of 20 mapped files at once must all be done within that one bound
/// (with one worker waiting 10 s per event in turn they took 20 x 10 s). And once the last
/// mapping of a file goes, no fanotify mark of it is left: later host opens of it no longer
/// pass through the daemon. (The daemon removes the mark; here the kernel also dropped the
/// evictable marks without it, so that part guards against a regression only.)
#[test]
fn a_paused_vm_bounds_a_batch_of_host_opens_and_drops_marks_of_unmapped_files() {
    const FILES: u64 = 20;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    for i in 0..FILES {
        fs::write(p.join(format!("f{i}")), vec![0x5a; MIB2 as usize]).unwrap();
    }
    let mut d = host::spawn(
        &host::daxfsd(),
        p,
        &["--dax-window=64M", "--dax-copy=off", "--dax-mapping=direct"],
    );
    let pid = d.pid().expect("the daemon's pid");
    let s = host::connect(&d, &DriverConfig::default());
    let w = s.dax().cloned().expect("a DAX window");
    let mut open = Vec::new();
    for i in 0..FILES {
        let f = s.lookup(ROOT, format!("f{i}")).unwrap().nodeid;
        let fh = s.open(f, libc::O_RDONLY as u32).unwrap().fh;
        s.setupmapping(f, fh, 0, MIB2, READ, i * MIB2).unwrap();
        open.push((f, fh));
    }
    assert_eq!(w.mappings().len() as u64, FILES, "{:?}", w.mappings());
    let marks = fanotify_marks(pid);
    assert!(
        marks as u64 >= FILES,
        "{marks} fanotify marks for {FILES} mapped files (no pre-content events here?)\n{}",
        d.log_contents()
    );

    let bases = s.device().pause().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let t0 = std::time::Instant::now();
    for i in 0..FILES {
        let (path, tx) = (p.join(format!("f{i}")), tx.clone());
        std::thread::spawn(move || {
            let r = fs::File::open(&path).map(|_| ());
            let _ = tx.send(r.map_err(|e| e.to_string()));
        });
    }
    drop(tx);
    let mut done = 0;
    while done < FILES {
        match rx.recv_timeout(Duration::from_secs(40)) {
            Ok(r) => {
                r.unwrap();
                done += 1;
            }
            Err(_) => {
                let l = d.log_contents();
                let _ = d.kill();
                panic!(
                    "{done} of {FILES} host opens done after {:?} while paused\n{l}",
                    t0.elapsed()
                );
            }
        }
    }
    let took = t0.elapsed();
    eprintln!("{FILES} host opens of mapped files while paused: {took:?}");
    assert!(
        took < Duration::from_secs(15),
        "{FILES} host opens while paused took {took:?} (bound: one 10 s wait for the batch)"
    );
    s.device().resume(&bases).unwrap();

    // Every mapping goes: so do the marks.
    for (i, &(f, _)) in open.iter().enumerate() {
        s.removemapping(
            f,
            &[RemovemappingOne {
                moffset: i as u64 * MIB2,
                len: MIB2,
            }],
        )
        .unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while fanotify_marks(pid) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        fanotify_marks(pid),
        0,
        "marks left after every mapping went\n{}",
        d.log_contents()
    );
    s.getattr(ROOT, None).unwrap();
}
