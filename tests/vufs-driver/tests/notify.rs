//! The notification queue (issue #42): host changes reach the driver as FUSE notifications on
//! virtqueue 1, after the driver negotiated VIRTIO_FS_F_NOTIFICATION. Only daxfsd offers it.

mod common;

use std::time::{Duration, Instant};

use common::{only_daxfsd, start_with};
use vufs_driver::{Chain, DriverConfig, Seg};

const INVAL_INODE: i32 = 2;
const INVAL_ENTRY: i32 = 3;
const INC_EPOCH: i32 = 8;
const FSNOTIFY: i32 = 128;
const IN_CREATE: u32 = 0x100;
const IN_MODIFY: u32 = 0x2;

/// One notification: (code, node, mask, name).
type Note = (i32, u64, u32, String);

fn parse(m: &[u8]) -> Note {
    assert!(m.len() >= 16, "short message {m:?}");
    let len = u32::from_le_bytes(m[0..4].try_into().unwrap()) as usize;
    assert_eq!(len, m.len(), "header length = bytes written");
    assert_eq!(
        u64::from_le_bytes(m[8..16].try_into().unwrap()),
        0,
        "unique 0"
    );
    let code = i32::from_le_bytes(m[4..8].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(m[at..at + 8].try_into().unwrap());
    let u32_at = |at: usize| u32::from_le_bytes(m[at..at + 4].try_into().unwrap());
    let name = |at: usize, n: usize| {
        assert_eq!(m[at + n], 0, "name NUL-terminated");
        String::from_utf8_lossy(&m[at..at + n]).into_owned()
    };
    match code {
        INVAL_INODE => (code, u64_at(16), 0, String::new()),
        INVAL_ENTRY => (code, u64_at(16), 0, name(32, u32_at(24) as usize)),
        FSNOTIFY => {
            let n = u32_at(28) as usize;
            let nm = if n > 0 { name(40, n) } else { String::new() };
            (code, u64_at(16), u32_at(24), nm)
        }
        _ => (code, 0, 0, String::new()),
    }
}

fn sh(cmd: &str) {
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .status()
        .unwrap();
    assert!(st.success(), "{cmd}");
}

fn cfg() -> DriverConfig {
    DriverConfig {
        notification: true,
        ..Default::default()
    }
}

#[test]
fn host_changes_arrive_on_the_notification_queue() {
    if !only_daxfsd("host_changes_arrive_on_the_notification_queue") {
        return;
    }
    let mut rig = start_with(&["--notify", "--tag", "fs"], &cfg(), |root| {
        std::fs::create_dir(root.join("d")).unwrap();
        std::fs::write(root.join("d/f"), b"1").unwrap();
    });
    let dev = rig.s.device().clone();
    assert!(dev.info().notification, "notification queue negotiated");
    assert_eq!(
        dev.info().config.map(|c| c.notify_buf_size),
        Some(4096),
        "notify_buf_size in the config space"
    );
    let d = rig.s.lookup(1, "d").unwrap().nodeid;
    let f = rig.s.lookup(d, "f").unwrap().nodeid;
    // The guest's own change (through the daemon) is not echoed.
    rig.s.mkdir(d, "mine", 0o755, 0).unwrap();
    let nq = dev.queue(1).unwrap();
    let mut posted: Vec<_> = (0..16)
        .map(|_| {
            nq.submit(&Chain {
                segs: vec![Seg::Writable(4096)],
                indirect: false,
            })
            .unwrap()
        })
        .collect();
    let p = rig.host("d");
    let start = Instant::now();
    sh(&format!(": > {0}/new; echo x >> {0}/f", p.display()));
    let mut got: Vec<Note> = Vec::new();
    let want = |g: &[Note]| {
        g.iter()
            .any(|n| n.0 == FSNOTIFY && n.1 == f && n.2 & IN_MODIFY != 0)
            && g.iter().any(|n| n.0 == FSNOTIFY && n.2 & IN_CREATE != 0)
    };
    while !want(&got) {
        assert!(
            !posted.is_empty() && start.elapsed() < Duration::from_secs(10),
            "no notification within 10 s; got {got:?}\nlog:\n{}",
            rig.daemon.log_contents()
        );
        let c = posted.remove(0).wait(Duration::from_secs(10)).unwrap();
        got.push(parse(&c.data[..c.used_len as usize]));
    }
    let latency = start.elapsed();
    eprintln!("host change to notification: {latency:?}; messages {got:?}");
    let at = |pred: &dyn Fn(&Note) -> bool| got.iter().position(pred).unwrap();
    let create = at(&|n| n.0 == FSNOTIFY && n.1 == d && n.2 == IN_CREATE && n.3 == "new");
    let inval = at(&|n| n.0 == INVAL_ENTRY && n.1 == d && n.3 == "new");
    assert!(
        inval < create,
        "the entry is invalidated before the event: {got:?}"
    );
    let modify = at(&|n| n.0 == FSNOTIFY && n.1 == f && n.2 == IN_MODIFY && n.3.is_empty());
    let data = at(&|n| n.0 == INVAL_INODE && n.1 == f);
    assert!(
        data < modify,
        "the data is invalidated before the event: {got:?}"
    );
    assert!(
        !got.iter().any(|n| n.3 == "mine"),
        "own change echoed: {got:?}"
    );
    rig.assert_clean();
}

#[test]
fn a_burst_with_no_buffers_posted_stays_bounded_and_ends_in_one_epoch() {
    if !only_daxfsd("a_burst_with_no_buffers_posted_stays_bounded_and_ends_in_one_epoch") {
        return;
    }
    let mut rig = start_with(&["--notify"], &cfg(), |root| {
        std::fs::create_dir(root.join("d")).unwrap();
    });
    let dev = rig.s.device().clone();
    rig.s.lookup(1, "d").unwrap();
    let rss = || {
        let pid = rig.daemon.pid().unwrap();
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap()
    };
    let before = rss();
    let p = rig.host("d");
    // 20,000 host creates (in one other process), nobody takes notifications meanwhile.
    sh(&format!(
        "cd {} && i=0; while [ $i -lt 20000 ]; do : > f$i; i=$((i+1)); done",
        p.display()
    ));
    std::thread::sleep(Duration::from_millis(500));
    let after = rss();
    eprintln!("daemon RSS {before} kB -> {after} kB after 20,000 host creates");
    assert!(
        after < before + 16 * 1024,
        "daemon memory grew by {} kB",
        after - before
    );
    // The first buffer posted now gets one broad invalidation, not 20,000 stale events.
    let nq = dev.queue(1).unwrap();
    let c = nq
        .submit(&Chain {
            segs: vec![Seg::Writable(4096)],
            indirect: false,
        })
        .unwrap()
        .wait(Duration::from_secs(10))
        .unwrap();
    assert_eq!(parse(&c.data[..c.used_len as usize]).0, INC_EPOCH);
    rig.assert_clean();
}

#[test]
fn without_the_feature_the_device_serves_as_before() {
    if !only_daxfsd("without_the_feature_the_device_serves_as_before") {
        return;
    }
    // A guest that does not negotiate it: queue 1 is a request queue.
    let mut rig = start_with(&["--notify"], &DriverConfig::default(), |root| {
        std::fs::write(root.join("f"), b"1").unwrap();
    });
    assert!(!rig.s.device().info().notification);
    rig.s.lookup(1, "f").unwrap();
    sh(&format!("echo y >> {}", rig.host("f").display()));
    rig.s.lookup(1, "f").unwrap();
    rig.assert_clean();
}
