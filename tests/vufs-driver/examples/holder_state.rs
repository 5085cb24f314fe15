//! What `--restartable` keeps per inode: starts daxfsd with a holder on a share of N files
//! (default 100,000), looks every file up, and prints the holder's and the file server's
//! resident memory and descriptors before and after, as one JSON line.
//!
//!   DAXFSD=target/release/daxfsd cargo run --release -p vufs-driver --example holder_state [N]

use std::time::Instant;

use vufs_driver::{Daemon, DaemonKind, Session};

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn server_of(holder: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{holder}/task/{holder}/children"))
        .ok()
        .and_then(|s| s.split_whitespace().last()?.parse().ok())
        .expect("the holder has no file server")
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(100_000, |a| a.parse().expect("N: a number"));
    let tmp = tempfile::tempdir().unwrap();
    let share = tmp.path().join("share");
    std::fs::create_dir(&share).unwrap();
    for i in 0..n {
        std::fs::File::create(share.join(format!("f{i}"))).unwrap();
    }
    let d = Daemon::builder(&DaemonKind::Daxfsd)
        .unwrap()
        .shared_dir(&share)
        .arg("--restartable")
        .spawn()
        .unwrap();
    let s = Session::connect(d.socket_path()).unwrap();
    s.init().unwrap();
    let holder = d.pid().unwrap();
    let server = server_of(holder);
    let before = (rss_kib(holder), fds(holder), rss_kib(server), fds(server));
    let t0 = Instant::now();
    for i in 0..n {
        if let Err(e) = s.lookup(1, format!("f{i}")) {
            let log = d.log_contents();
            let tail: Vec<&str> = log.lines().rev().take(8).collect();
            panic!(
                "LOOKUP f{i}: {e}; daemon log (last lines, newest first):\n{}",
                tail.join("\n")
            );
        }
    }
    let took = t0.elapsed();
    // The holder applies what the server sent on its own thread: let it catch up.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let after = (rss_kib(holder), fds(holder), rss_kib(server), fds(server));
    println!(
        "{{\"inodes\":{n},\"lookup_s\":{:.2},\"holder_rss_kib\":[{},{}],\"holder_fds\":[{},{}],\"server_rss_kib\":[{},{}],\"server_fds\":[{},{}],\"holder_bytes_per_inode\":{}}}",
        took.as_secs_f64(),
        before.0,
        after.0,
        before.1,
        after.1,
        before.2,
        after.2,
        before.3,
        after.3,
        (after.0.saturating_sub(before.0) * 1024) / n as u64
    );
}
