//! SIGSTOP/SIGCONT and a cgroup freeze of a `--mount` daemon under traffic, in each host-mount
//! mode: requests read from /dev/fuse, FUSE passthrough, FUSE-over-io-uring. The daemon runs
//! as a service manager starts it (default sandbox, seccomp `kill`): the kernel resumes its
//! timed waits through `restart_syscall` and its ring waits through `io_uring_enter`, which
//! the filter must allow. Afterwards the mount still answers and SIGTERM ends the daemon
//! cleanly. Root only (mount(2), cgroups, `fuse.enable_uring`).

use std::io::{Read, Seek, SeekFrom, Write};
mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::mount::{is_fuse_mount, mount, require_root};

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Process `pid` and its descendants (a sandboxed daemon serves from a child process).
fn tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let p = all[i];
        let kids =
            std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        all.extend(
            kids.split_whitespace()
                .filter_map(|k| k.parse::<u32>().ok()),
        );
        i += 1;
    }
    all
}

fn signal_tree(pid: u32, sig: libc::c_int) {
    for p in tree(pid) {
        // SAFETY: signalling our own child and its descendants.
        unsafe { libc::kill(p as i32, sig) };
    }
}

/// A cgroup v2 holding the daemon's processes, frozen with `cgroup.freeze`.
struct Freezer(PathBuf);

impl Freezer {
    fn new(pid: u32, tag: &str) -> Freezer {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/daxfsd-mount-{tag}-{}-{pid}",
            std::process::id()
        ));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("cgroup {dir:?}: {e}"));
        let f = Freezer(dir);
        for p in tree(pid) {
            std::fs::write(f.0.join("cgroup.procs"), p.to_string()).unwrap();
        }
        f
    }

    fn set(&self, frozen: bool) {
        std::fs::write(self.0.join("cgroup.freeze"), if frozen { "1" } else { "0" }).unwrap();
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        self.set(false);
        if let Ok(procs) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            for p in procs.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/cgroup.procs", p);
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// `fuse.enable_uring` set for the run, the old value put back on drop.
struct UringParam(Option<String>);

impl UringParam {
    fn enable() -> UringParam {
        let old = std::fs::read_to_string(ENABLE_URING)
            .unwrap_or_else(|e| panic!("{ENABLE_URING}: {e} (a kernel with FUSE_IO_URING)"));
        std::fs::write(ENABLE_URING, "Y").unwrap();
        UringParam(Some(old.trim().to_string()))
    }
}

impl Drop for UringParam {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = std::fs::write(ENABLE_URING, old);
        }
    }
}

/// The number after `before` in `log` (its last occurrence).
fn count_after(log: &str, before: &str) -> u64 {
    log.rsplit(before)
        .next()
        .filter(|_| log.contains(before))
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// One host-mount mode through STOP/CONT and freeze under traffic. `used` checks, on the
/// daemon's exit report, that the mode really served the traffic.
fn stop_cont_and_freeze(tag: &str, args: &[&str], used: impl Fn(&str) -> bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut d = mount(dir.path(), args, |share| {
        std::fs::write(share.join("f"), vec![7u8; 256 << 10]).unwrap();
    });
    let pid = d.child.id();
    let f = d.mnt.join("f");
    let stop = AtomicBool::new(false);
    let done = AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(None::<String>);
    let mut rounds = Vec::new();
    std::thread::scope(|sc| {
        let (f, stop, done, failed) = (&f, &stop, &done, &failed);
        sc.spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = (|| -> std::io::Result<()> {
                    let mut h = std::fs::OpenOptions::new().read(true).write(true).open(f)?;
                    let at = (i % 64) * 4096;
                    h.seek(SeekFrom::Start(at))?;
                    h.write_all(&[i as u8; 4096])?;
                    h.sync_all()?;
                    let mut back = vec![0u8; 4096];
                    h.seek(SeekFrom::Start(at))?;
                    h.read_exact(&mut back)?;
                    if back != [i as u8; 4096] {
                        return Err(std::io::Error::other("read back other bytes"));
                    }
                    std::fs::metadata(f)?;
                    Ok(())
                })();
                if let Err(e) = r {
                    *failed.lock().unwrap() = Some(format!("round {i}: {e}"));
                    break;
                }
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        });
        for round in 0..3 {
            std::thread::sleep(Duration::from_millis(300));
            signal_tree(pid, libc::SIGSTOP);
            std::thread::sleep(Duration::from_millis(500));
            signal_tree(pid, libc::SIGCONT);
            rounds.push(format!("STOP/CONT {round}"));
        }
        let fr = Freezer::new(pid, tag);
        for round in 0..3 {
            std::thread::sleep(Duration::from_millis(300));
            fr.set(true);
            std::thread::sleep(Duration::from_millis(500));
            fr.set(false);
            rounds.push(format!("freeze/thaw {round}"));
        }
        drop(fr);
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
    });
    let n = done.load(Ordering::Relaxed);
    eprintln!("{tag}: {n} traffic rounds across {rounds:?}");
    assert!(
        d.child.try_wait().unwrap().is_none(),
        "{tag}: the daemon died; log:\n{}",
        d.log()
    );
    if let Some(e) = failed.lock().unwrap().take() {
        panic!("{tag}: traffic failed: {e}; log:\n{}", d.log());
    }
    assert!(n > 10, "{tag}: only {n} traffic rounds");
    // Still answering; then SIGTERM unmounts and exits 0.
    std::fs::write(d.mnt.join("after"), b"after").unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("share/after")).unwrap(),
        b"after"
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let end = Instant::now() + Duration::from_secs(20);
    let st = loop {
        if let Some(st) = d.child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < end, "{tag}: no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(st.success(), "{tag}: {st:?}; log:\n{}", d.log());
    assert!(!is_fuse_mount(&d.mnt), "{tag}: still mounted");
    let log = d.log();
    let report = log
        .lines()
        .rev()
        .find(|l| l.contains("/dev/fuse: "))
        .unwrap_or("");
    eprintln!("{tag}: {report}");
    assert!(
        used(&log),
        "{tag}: the mode did not serve the traffic:\n{log}"
    );
}

#[test]
fn stop_cont_and_freeze_over_dev_fuse() {
    require_root("mounts /dev/fuse and uses cgroups");
    stop_cont_and_freeze("read", &["--passthrough=off", "--io-uring=off"], |log| {
        count_after(log, "/dev/fuse: ") > 1000
    });
}

#[test]
fn stop_cont_and_freeze_with_fuse_passthrough() {
    require_root("mounts /dev/fuse and uses cgroups");
    stop_cont_and_freeze(
        "passthrough",
        &["--passthrough=auto", "--io-uring=off"],
        |log| count_after(log, "backing files opened, ") == 0 && count_after(log, "live; ") > 10,
    );
}

#[test]
fn stop_cont_and_freeze_over_io_uring() {
    require_root("mounts /dev/fuse and uses cgroups");
    let _param = UringParam::enable();
    stop_cont_and_freeze("io-uring", &["--passthrough=off", "--io-uring=on"], |log| {
        count_after(log, "io-uring: ") > 1000
    });
}
