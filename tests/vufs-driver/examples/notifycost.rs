//! What host changes cost with `--notify` (issue #42), to decide between the two designs the
//! issue names: the daemon reports changes for every directory the guest holds (what daxfsd
//! does), or the guest forwards the watches its processes make and the daemon watches only
//! those.
//!
//! ```text
//! cargo run --release -p vufs-driver --example notifycost -- [--dirs K] [--files N] [--rounds R]
//! ```
//!
//! Each round starts `daxfsd --notify --cache=coherent` (`$DAXFSD`) on a share of K
//! directories, takes notifications as a guest does (16 buffers of 4 KiB always posted), and
//! then, from this process (not the daemon), creates N files spread over the K directories,
//! appends to each, and removes each. Two cases, interleaved:
//! - `held`: the driver looked up the K directories first, as a guest that listed the tree
//!   and watches nothing there: what reporting everything costs for directories nobody watches;
//! - `unheld`: it looked up none of them: what forwarding would cost for them (nothing: no
//!   watch, no mark, no message).
//!
//! Printed per case (medians over the rounds): the daemon's CPU time from the first host
//! change until the notifications stop, the messages by kind, and the host's time for the
//! changes (a host process is never slowed by a notification-only fanotify group).

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant};

use vufs_driver::{Chain, Daemon, DaemonKind, DriverConfig, Seg, Session};

const INVAL_INODE: i32 = 2;
const INVAL_ENTRY: i32 = 3;
const DELETE: i32 = 6;
const INC_EPOCH: i32 = 8;
const FSNOTIFY: i32 = 128;

fn kind_name(code: i32) -> &'static str {
    match code {
        INVAL_INODE => "inval_inode",
        INVAL_ENTRY => "inval_entry",
        DELETE => "delete",
        INC_EPOCH => "inc_epoch",
        FSNOTIFY => "fsnotify",
        _ => "other",
    }
}

/// The daemon's user + system CPU time so far.
fn cpu(pid: u32) -> Duration {
    vufs_driver::process_cpu(pid).expect("the daemon runs")
}

struct Outcome {
    daemon_cpu: Duration,
    host: Duration,
    kinds: BTreeMap<&'static str, u64>,
}

fn round(binary: &Path, dirs: usize, files: usize, held: bool) -> Outcome {
    let share = tempfile::tempdir().unwrap();
    for d in 0..dirs {
        std::fs::create_dir(share.path().join(format!("d{d}"))).unwrap();
    }
    let daemon = Daemon::builder(&DaemonKind::Path(binary.into()))
        .unwrap()
        .shared_dir(share.path())
        .arg("--notify")
        .arg("--cache=coherent")
        .spawn()
        .unwrap();
    let cfg = DriverConfig {
        notification: true,
        poison: false,
        ..DriverConfig::default()
    };
    let s = Session::connect_with(daemon.socket_path(), &cfg).unwrap();
    s.init().unwrap();
    if held {
        for d in 0..dirs {
            s.lookup(1, format!("d{d}")).unwrap();
        }
    }
    let nq = s.device().queue(1).unwrap().clone();
    let pid = daemon.pid().unwrap();
    // The guest's side: 16 buffers always posted, each reposted as it returns; done after a
    // second without a message once the host finished.
    let host_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let drainer = {
        let host_done = host_done.clone();
        std::thread::spawn(move || {
            let buffer = || Chain {
                segs: vec![Seg::Writable(4096)],
                indirect: false,
            };
            let mut posted: VecDeque<_> = (0..16).map(|_| nq.submit(&buffer()).unwrap()).collect();
            let mut kinds = BTreeMap::new();
            let mut quiet_since: Option<Instant> = None;
            loop {
                let p = posted.pop_front().unwrap();
                match p.wait(Duration::from_millis(100)) {
                    Ok(c) => {
                        let m = &c.data[..c.used_len as usize];
                        let code = i32::from_le_bytes(m[4..8].try_into().unwrap());
                        *kinds.entry(kind_name(code)).or_insert(0u64) += 1;
                        quiet_since = None;
                    }
                    Err(_) => {
                        let done = host_done.load(std::sync::atomic::Ordering::SeqCst);
                        let since = *quiet_since.get_or_insert_with(Instant::now);
                        if done && since.elapsed() >= Duration::from_secs(1) {
                            break;
                        }
                    }
                }
                posted.push_back(nq.submit(&buffer()).unwrap());
            }
            kinds
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let cpu0 = cpu(pid);
    let start = Instant::now();
    for i in 0..files {
        let p = share.path().join(format!("d{}/f{i}", i % dirs));
        std::fs::write(&p, b"x").unwrap();
    }
    for i in 0..files {
        use std::io::Write;
        let p = share.path().join(format!("d{}/f{i}", i % dirs));
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"y").unwrap();
    }
    for i in 0..files {
        std::fs::remove_file(share.path().join(format!("d{}/f{i}", i % dirs))).unwrap();
    }
    let host = start.elapsed();
    host_done.store(true, std::sync::atomic::Ordering::SeqCst);
    let kinds = drainer.join().unwrap();
    let daemon_cpu = cpu(pid) - cpu0;
    drop(s);
    drop(daemon);
    Outcome {
        daemon_cpu,
        host,
        kinds,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mut dirs = 16;
    let mut files = 4000;
    let mut rounds = 3;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = || -> usize {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{a} needs a number"))
        };
        match a.as_str() {
            "--dirs" => dirs = num().max(1),
            "--files" => files = num().max(1),
            "--rounds" => rounds = num().max(1),
            _ => panic!("unknown argument {a} (use --dirs K, --files N, --rounds R)"),
        }
    }
    let binary = std::env::var("DAXFSD")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| "target/release/daxfsd".into());
    let mut results: BTreeMap<&str, Vec<Outcome>> = BTreeMap::new();
    for r in 0..rounds {
        for (name, held) in [("held", true), ("unheld", false)] {
            let o = round(&binary, dirs, files, held);
            eprintln!(
                "round {r} {name}: daemon CPU {:?}, host {:?}, messages {:?}",
                o.daemon_cpu, o.host, o.kinds
            );
            results.entry(name).or_default().push(o);
        }
    }
    println!(
        "{files} files in {dirs} directories: each created, appended to and removed ({} host changes); medians of {rounds} rounds",
        3 * files
    );
    println!("| case | daemon CPU ms | per host change us | host ms | messages by kind |");
    println!("|---|--:|--:|--:|---|");
    for (name, os) in &results {
        let cpu = median(
            os.iter()
                .map(|o| o.daemon_cpu.as_secs_f64() * 1e3)
                .collect(),
        );
        let host = median(os.iter().map(|o| o.host.as_secs_f64() * 1e3).collect());
        let mut kinds: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for o in os {
            for (k, n) in &o.kinds {
                kinds.entry(k).or_default().push(*n as f64);
            }
        }
        let kinds: Vec<String> = kinds
            .into_iter()
            .map(|(k, v)| format!("{k} {}", median(v)))
            .collect();
        println!(
            "| {name} | {cpu:.1} | {:.2} | {host:.1} | {} |",
            cpu * 1e3 / (3 * files) as f64,
            if kinds.is_empty() {
                "none".to_string()
            } else {
                kinds.join(", ")
            }
        );
    }
}
