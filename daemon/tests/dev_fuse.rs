//! The /dev/fuse transport on a real mount (root only: mount(2)). No kernel is mocked: the
//! test mounts, the host kernel sends the requests, the server answers through the
//! transport's workers. Run as root (as `make test` does); as another user the tests fail
//! with a message saying so, unless DAXFSD_SKIP_ROOT_TESTS=1 asks to skip them (printed).

use std::fs;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use daxfsd::backing::{Passthrough, Policy};
use daxfsd::dev_fuse::{self, Counters, DevFuseBacking, MountOptions};
use daxfsd::mapper::NoMapper;
use daxfsd::passthrough::{CachePolicy, Config, PassthroughFs};
use daxfsd::server::{Server, ServerOptions};

fn root_or_skip(name: &str) -> bool {
    if daxfsd::sys::geteuid() == 0 {
        return true;
    }
    if std::env::var_os("DAXFSD_SKIP_ROOT_TESTS").is_some() {
        eprintln!("SKIPPED {name}: needs root (DAXFSD_SKIP_ROOT_TESTS is set)");
        return false;
    }
    panic!("{name} mounts /dev/fuse and needs root; run as root or set DAXFSD_SKIP_ROOT_TESTS=1");
}

fn umount(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is NUL-terminated.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}

#[test]
fn serves_a_real_mount_with_passthrough_and_ends_on_unmount() {
    if !root_or_skip("serves_a_real_mount_with_passthrough_and_ends_on_unmount") {
        return;
    }
    // Each cache policy answers OPEN with other flags (DIRECT_IO, KEEP_CACHE), which
    // passthrough must not carry to the kernel.
    for cache in [CachePolicy::Never, CachePolicy::Auto, CachePolicy::Always] {
        serve_one_mount(cache);
    }
}

fn serve_one_mount(cache: CachePolicy) {
    let dir = tempfile::tempdir().unwrap();
    let (share, mnt) = (dir.path().join("share"), dir.path().join("mnt"));
    fs::create_dir(&share).unwrap();
    fs::create_dir(&mnt).unwrap();
    fs::write(share.join("host.txt"), vec![7u8; 300_000]).unwrap();
    let mp = dev_fuse::check_mountpoint(&mnt, &share).unwrap();
    let m = dev_fuse::mount(&mp, &share, MountOptions::default()).unwrap();
    let dev = Arc::new(m.dev);
    let fs = PassthroughFs::new(Config {
        root_dir: share.clone(),
        cache,
        ..Default::default()
    })
    .unwrap();
    let opts = ServerOptions {
        transport_flags: daxfsd::abi::init_flags::PASSTHROUGH,
        max_stack_depth: 1,
        ..Default::default()
    };
    let server = Arc::new(
        Server::new(fs, Box::new(NoMapper), opts).with_fuse_passthrough(Passthrough::new(
            Box::new(DevFuseBacking::new(dev.clone())),
            Policy::MinSize(100_000),
        )),
    );
    let counters = Arc::new(Counters::default());
    let workers =
        dev_fuse::spawn_workers(dev.clone(), server.clone(), 2, counters.clone()).unwrap();

    // Reads and writes through the mount reach the share; the big file is passed through,
    // the small one (under the size policy) is served with READ/WRITE.
    let mut big = Vec::new();
    fs::File::open(mp.join("host.txt"))
        .unwrap()
        .read_to_end(&mut big)
        .unwrap();
    assert_eq!(big, vec![7u8; 300_000], "{cache:?}");
    // Passed through: reads go to the host file itself, so a change made on the host is
    // seen at once, even with --cache always (where a READ-served file keeps its pages).
    fs::write(share.join("host.txt"), vec![9u8; 300_000]).unwrap();
    let again = fs::read(mp.join("host.txt")).unwrap();
    assert!(again.iter().all(|&b| b == 9), "{cache:?}: stale data");
    let mut f = fs::File::create(mp.join("small.txt")).unwrap();
    f.write_all(b"through the daemon").unwrap();
    drop(f);
    assert_eq!(
        fs::read(share.join("small.txt")).unwrap(),
        b"through the daemon"
    );
    // The kernel sends RELEASE after close(2) returns, asynchronously: the second open of
    // host.txt may arrive while the first one's backing id is still registered, and then
    // shares it (one backing id per inode). So both opens are passed through, on one or
    // two backing ids, and every id is closed once the releases have come in.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let st = loop {
        let st = server.fuse_passthrough_stats().unwrap();
        if st.live == 0 || std::time::Instant::now() > deadline {
            break st;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(st.passthrough_opens, 2, "{cache:?}: {st}");
    assert!((1..=2).contains(&st.opened), "{cache:?}: {st}");
    assert_eq!(st.live, 0, "released with the file: {st}");
    assert_eq!(st.closed, st.opened, "{cache:?}: {st}");
    assert!(counters.requests.load(std::sync::atomic::Ordering::Relaxed) > 5);

    // Unmounting ends every worker cleanly (ENODEV).
    umount(&mp);
    for w in workers {
        w.join().unwrap().unwrap();
    }
}

#[test]
fn a_dead_connection_is_reported_as_a_stale_mount() {
    if !root_or_skip("a_dead_connection_is_reported_as_a_stale_mount") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (share, mnt) = (dir.path().join("share"), dir.path().join("mnt"));
    fs::create_dir(&share).unwrap();
    fs::create_dir(&mnt).unwrap();
    let m = dev_fuse::mount(&mnt, &share, MountOptions::default()).unwrap();
    assert!(m.dev.as_raw_fd() >= 0);
    // Closing the only /dev/fuse descriptor aborts the connection, as a daemon's death does.
    drop(m.dev);
    let e = dev_fuse::check_mountpoint(&mnt, &share).unwrap_err();
    let msg = e.to_string();
    umount(&mnt);
    assert!(
        msg.contains("stale FUSE mount") && msg.contains("umount -l"),
        "{msg}"
    );
    // The mount point itself is fine again, and one inside the share is refused.
    dev_fuse::check_mountpoint(&mnt, &share).unwrap();
    let inner = share.join("sub");
    fs::create_dir(&inner).unwrap();
    assert!(dev_fuse::check_mountpoint(&inner, &share)
        .unwrap_err()
        .to_string()
        .contains("inside --shared-dir"));
    // Over the share, or above it, would hide it.
    for over in [&share, dir.path()] {
        assert!(dev_fuse::check_mountpoint(over, &share)
            .unwrap_err()
            .to_string()
            .contains("would cover --shared-dir"));
    }
}
