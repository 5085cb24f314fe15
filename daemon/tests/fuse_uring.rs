//! FUSE-over-io-uring on a real host mount (needs root and a kernel with FUSE_IO_URING; the
//! fuse module parameter `enable_uring` is set to Y for the test and restored after it):
//! - the rings serve the requests after INIT (none but INIT comes through read(2)), and their
//!   threads end by themselves when the mount goes away;
//! - a connection that agreed on io_uring but whose rings never start (what `turn_off` exists
//!   for) does not hang: once told, the kernel sends the requests through read(2).

use std::ffi::CString;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use daxfsd::abi::init_flags;
use daxfsd::dev_fuse::{self, Counters, MountOptions};
use daxfsd::fuse_uring;
use daxfsd::mapper::NoMapper;
use daxfsd::memfs::MemFs;
use daxfsd::server::{Server, ServerOptions};

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Sets `enable_uring` to Y; puts the old value back when dropped (also on a failed assert).
struct Param(String);

impl Param {
    fn enable() -> Self {
        assert_eq!(
            daxfsd::sys::geteuid(),
            0,
            "this test mounts FUSE and sets {PARAM}: run it as root"
        );
        let old = fs::read_to_string(PARAM).unwrap_or_else(|e| {
            panic!("{PARAM}: {e}: this kernel has no FUSE_IO_URING (Linux 6.14+)")
        });
        fs::write(PARAM, "Y").unwrap();
        Param(old.trim().to_string())
    }
}

impl Drop for Param {
    fn drop(&mut self) {
        let _ = fs::write(PARAM, &self.0);
    }
}

struct Session {
    _src: tempfile::TempDir,
    mnt: tempfile::TempDir,
    server: Arc<Server<MemFs>>,
    counters: Arc<Counters>,
    workers: Vec<JoinHandle<std::io::Result<()>>>,
}

/// Mounts a MemFs server offering FUSE_OVER_IO_URING; `after_init` runs once INIT is answered.
fn mount(after_init: impl Fn(i32, Arc<Server<MemFs>>) + Send + Sync + 'static) -> Session {
    let src = tempfile::tempdir().unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let m = dev_fuse::mount(mnt.path(), src.path(), MountOptions::default()).unwrap();
    let dev = Arc::new(m.dev);
    let dev_fd = dev.as_raw_fd();
    let server = Arc::new(Server::new(
        MemFs::new().unwrap(),
        Box::new(NoMapper),
        ServerOptions {
            transport_flags: init_flags::OVER_IO_URING,
            ..Default::default()
        },
    ));
    let counters = Arc::new(Counters::default());
    let s = server.clone();
    counters
        .after_init
        .set(move || after_init(dev_fd, s.clone()));
    let workers = dev_fuse::spawn_workers(dev, server.clone(), 2, counters.clone()).unwrap();
    Session {
        _src: src,
        mnt,
        server,
        counters,
        workers,
    }
}

fn umount(p: &Path, flags: i32) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path.
    unsafe { libc::umount2(c.as_ptr(), flags) };
}

/// Runs file operations on the mount in a thread; fails (after a lazy unmount) if they do
/// not finish within 20 s: a request the kernel holds for a ring that never comes.
fn file_ops(mnt: &Path) {
    let dir = mnt.to_path_buf();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = (|| -> std::io::Result<()> {
            let p: PathBuf = dir.join("f");
            fs::write(&p, b"through the ring")?;
            assert_eq!(fs::read(&p)?, b"through the ring");
            fs::create_dir(dir.join("d"))?;
            assert_eq!(fs::read_dir(&dir)?.count(), 2);
            fs::remove_file(&p)?;
            fs::remove_dir(dir.join("d"))
        })();
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(r) => r.unwrap(),
        Err(_) => {
            umount(mnt, libc::MNT_DETACH);
            panic!("file operations on the mount hung for 20 s");
        }
    }
}

fn end(s: Session) {
    umount(s.mnt.path(), 0);
    for w in s.workers {
        w.join().unwrap().unwrap();
    }
    s.server.reset();
}

#[test]
fn rings_serve_then_fall_back() {
    let _param = Param::enable();

    // 1. The rings serve everything after INIT, and end with the mount.
    let rings: Arc<Mutex<Option<fuse_uring::Rings>>> = Arc::default();
    let stats = Arc::new(fuse_uring::Stats::default());
    let (r, st) = (rings.clone(), stats.clone());
    let s = mount(move |dev, server| {
        let started = fuse_uring::start_after_init(dev, server, 4, st.clone(), true).unwrap();
        *r.lock().unwrap() = started;
    });
    file_ops(s.mnt.path());
    let served = stats.served.load(Ordering::Relaxed);
    assert!(served > 0, "no request served from the rings");
    assert_eq!(
        s.counters.not_forget.load(Ordering::Relaxed),
        1,
        "read(2) served more than INIT"
    );
    assert!(stats.queues.load(Ordering::Relaxed) >= 1);
    end(s);
    let t = Instant::now();
    rings
        .lock()
        .unwrap()
        .take()
        .expect("rings started")
        .shutdown();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "ring threads took {:?} to end after the unmount",
        t.elapsed()
    );

    // 2. INIT agreed on io_uring, no ring ever registers: without turn_off every request
    //    would wait for the ring forever; with it they come through read(2).
    let s = mount(|dev, _server| fuse_uring::turn_off(dev).unwrap());
    file_ops(s.mnt.path());
    assert_ne!(
        s.server.negotiated_flags() & init_flags::OVER_IO_URING,
        0,
        "INIT did not agree on io_uring: the fallback was not exercised"
    );
    assert!(
        s.counters.not_forget.load(Ordering::Relaxed) > 5,
        "requests did not come through read(2)"
    );
    end(s);
}
