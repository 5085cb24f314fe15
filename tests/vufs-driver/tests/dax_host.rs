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

use daxfsd::abi::{self, SETUPMAPPING_FLAG_READ as READ, SETUPMAPPING_FLAG_WRITE as WRITE};
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
    let mut d = host::spawn(&host::daxfsd(), p, &["--dax-window=64M", "--dax-copy=off"]);
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
