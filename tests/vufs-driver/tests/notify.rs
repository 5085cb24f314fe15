//! The notification queue (issue #42): host changes reach the driver as FUSE notifications on
//! virtqueue 1, after the driver negotiated VIRTIO_FS_F_NOTIFICATION. Only daxfsd offers it.

mod common;
#[path = "common/host.rs"]
mod host;

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

/// A host write to a file the guest maps through a pooled DAX range reaches the window at
/// once (the watch refreshes the range), with no request of the guest in between and whether
/// or not the guest takes notifications.
#[test]
fn a_host_write_reaches_a_pooled_dax_range_without_a_sync_point() {
    if !only_daxfsd("a_host_write_reaches_a_pooled_dax_range_without_a_sync_point") {
        return;
    }
    const MIB2: u64 = 2 << 20;
    use daxfsd::abi::{SETUPMAPPING_FLAG_READ as READ, SETUPMAPPING_FLAG_WRITE as WRITE};
    let mut rig = start_with(
        &["--notify", "--dax-window=64M", "--dax-mapping=pooled"],
        &DriverConfig::default(),
        |root| std::fs::write(root.join("f"), vec![b'.'; 8192]).unwrap(),
    );
    let w = rig.s.dax().cloned().expect("no window");
    let e = rig.s.lookup(1, "f").unwrap();
    let o = rig.s.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    rig.s
        .setupmapping(e.nodeid, o.fh, 0, MIB2, READ | WRITE, 0)
        .unwrap();
    let mut win = vec![0u8; 16];
    w.read(100, &mut win).unwrap();
    assert_eq!(win, [b'.'; 16]);
    // The guest stores elsewhere in the same range meanwhile: both survive.
    w.write(5000, b"guest").unwrap();
    sh(&format!(
        "printf 'host bytes here!' | dd of={} bs=1 seek=100 conv=notrunc status=none",
        rig.host("f").display()
    ));
    let start = Instant::now();
    loop {
        w.read(100, &mut win).unwrap();
        if &win == b"host bytes here!" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "the window still shows {:?}\nlog:\n{}",
            String::from_utf8_lossy(&win),
            rig.daemon.log_contents()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "host write visible in the window after {:?}",
        start.elapsed()
    );
    assert!(start.elapsed() < Duration::from_millis(1500));
    let mut g = [0u8; 5];
    w.read(5000, &mut g).unwrap();
    assert_eq!(&g, b"guest", "the guest's store survived the refresh");
    rig.s.fsync(e.nodeid, o.fh, false).unwrap();
    let file = std::fs::read(rig.host("f")).unwrap();
    assert_eq!(&file[100..116], b"host bytes here!");
    assert_eq!(&file[5000..5005], b"guest");
    rig.s.release(e.nodeid, o.fh, libc::O_RDWR as u32).unwrap();
    rig.assert_clean();
}

/// A migrated session: host changes between the source's last event and the destination's
/// first went unwatched, so the destination's first notification is one INC_EPOCH.
#[test]
fn a_migrated_session_starts_with_a_broad_invalidation() {
    if !only_daxfsd("a_migrated_session_starts_with_a_broad_invalidation") {
        return;
    }
    use vhost::vhost_user::message::VhostUserProtocolFeatures;
    use vufs_driver::migrate::{load_state, save_state};
    use vufs_driver::Session;
    let mut c = cfg();
    c.protocol_features |= VhostUserProtocolFeatures::DEVICE_STATE;
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("d")).unwrap();
    let kind = common::kind();
    let a = host::spawn(&kind, root.path(), &["--notify"]);
    let src = host::connect(&a, &c);
    let d = src.lookup(1, "d").unwrap().nodeid;
    src.device().stop(false).unwrap();
    let state = save_state(src.device()).unwrap();
    // Unwatched: the source stopped, the destination has not loaded yet.
    sh(&format!(": > {}/d/while-moving", root.path().display()));
    let b = host::spawn(&kind, root.path(), &["--notify"]);
    let dst = Session::connect_with(b.socket_path(), &c).unwrap();
    dst.device().stop(false).unwrap();
    load_state(dst.device(), &state)
        .unwrap_or_else(|e| panic!("load: {e}\nlog:\n{}", b.log_contents()));
    dst.device().restart().unwrap();
    let dst = Session::new(dst.device().clone());
    let nq = dst.device().queue(1).unwrap();
    let first = nq
        .submit(&Chain {
            segs: vec![Seg::Writable(4096)],
            indirect: false,
        })
        .unwrap()
        .wait(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("no notification: {e}\nlog:\n{}", b.log_contents()));
    assert_eq!(parse(&first.data[..first.used_len as usize]).0, INC_EPOCH);
    // The destination watches the guest's directories by the ids it knows.
    let next = nq
        .submit(&Chain {
            segs: vec![Seg::Writable(4096)],
            indirect: false,
        })
        .unwrap();
    sh(&format!(": > {}/d/after", root.path().display()));
    let mut got = Vec::new();
    let mut p = Some(next);
    while let Some(pending) = p.take() {
        let c = pending
            .wait(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{e}; got {got:?}\nlog:\n{}", b.log_contents()));
        let n = parse(&c.data[..c.used_len as usize]);
        let done = n.0 == FSNOTIFY && n.1 == d && n.3 == "after";
        got.push(n);
        if !done {
            assert!(got.len() < 8, "{got:?}");
            p = Some(
                nq.submit(&Chain {
                    segs: vec![Seg::Writable(4096)],
                    indirect: false,
                })
                .unwrap(),
            );
        }
    }
    drop(src);
}
