//! Protocol-level microbenchmark: FUSE requests per second and instructions per request of a
//! vhost-user-fs backend, driven by the userspace driver (no VM, no guest kernel).
//!
//! ```text
//! cargo run --release -p vufs-driver --example protobench -- [options]
//!   --daemon D        daxfsd | virtiofsd | PATH (repeatable; default: daxfsd and virtiofsd)
//!   --op OP           read (4 KiB READ) | getattr (repeatable; default: both)
//!   --seconds S       measuring time per (daemon, op) for the rate (default 3)
//!   --depth N         requests in flight on the queue (default 1: one at a time)
//!   --callgrind N     instead of the rate: instructions per request under
//!                     `valgrind --tool=callgrind`, from a run of N requests minus a
//!                     baseline run of 0 requests (same set-up: INIT, LOOKUP, OPEN)
//!   --seccomp MODE    daemon --seccomp (default: kill for the rate, none under valgrind)
//!   --json FILE       append one JSON object per result to FILE (JSON lines)
//! ```
//!
//! Both daemons get the same command line: `--cache=never --sandbox=none` (the driver's
//! defaults) plus `--seccomp`. Binaries: `$DAXFSD` / `$VIRTIOFSD` as for the driver's tests.
//! Every request is one queue-1 chain laid out as Linux lays it out (in-header, argument,
//! out-header, reply body in separate buffers); each reply is checked (unique, error, length).

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use daxfsd::abi::{self, opcode as op, OutHeader};
use vm_memory::ByteValued;
use vufs_driver::{Chain, Daemon, DaemonKind, DriverConfig, Seg, Session};

const FILE_SIZE: u64 = 64 << 20;
const BLOCK: u32 = 4096;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Read,
    Getattr,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Getattr => "getattr",
        }
    }
}

struct Opts {
    daemons: Vec<String>,
    ops: Vec<Op>,
    seconds: f64,
    depth: usize,
    callgrind: Option<u64>,
    seccomp: Option<String>,
    json: Option<PathBuf>,
}

fn usage() -> ! {
    eprintln!(
        "usage: protobench [--daemon daxfsd|virtiofsd|PATH]... [--op read|getattr]... \
         [--seconds S] [--depth N] [--callgrind N] [--seccomp MODE] [--json FILE]"
    );
    std::process::exit(2)
}

fn parse() -> Opts {
    let mut o = Opts {
        daemons: Vec::new(),
        ops: Vec::new(),
        seconds: 3.0,
        depth: 1,
        callgrind: None,
        seccomp: None,
        json: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--daemon" => o.daemons.push(val()),
            "--op" => o.ops.push(match val().as_str() {
                "read" => Op::Read,
                "getattr" => Op::Getattr,
                _ => usage(),
            }),
            "--seconds" => o.seconds = val().parse().unwrap_or_else(|_| usage()),
            "--depth" => o.depth = val().parse().unwrap_or_else(|_| usage()),
            "--callgrind" => o.callgrind = Some(val().parse().unwrap_or_else(|_| usage())),
            "--seccomp" => o.seccomp = Some(val()),
            "--json" => o.json = Some(val().into()),
            "-h" | "--help" => usage(),
            _ => usage(),
        }
    }
    if o.daemons.is_empty() {
        o.daemons = vec!["daxfsd".into(), "virtiofsd".into()];
    }
    if o.ops.is_empty() {
        o.ops = vec![Op::Read, Op::Getattr];
    }
    if o.depth == 0 || o.depth > 64 {
        eprintln!("protobench: --depth must be 1..=64");
        std::process::exit(2);
    }
    o
}

fn kind(name: &str) -> DaemonKind {
    match name {
        "daxfsd" => DaemonKind::Daxfsd,
        "virtiofsd" => DaemonKind::Virtiofsd,
        p => DaemonKind::Path(p.into()),
    }
}

/// A share with one 64 MiB file of non-zero bytes.
fn make_share() -> io::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new().prefix("protobench-").tempdir()?;
    let mut f = File::create(dir.path().join("data"))?;
    let chunk: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 + 13) as u8).collect();
    for _ in 0..FILE_SIZE >> 20 {
        f.write_all(&chunk)?;
    }
    f.sync_all()?;
    Ok(dir)
}

/// A connected, INITed session with `data` looked up and opened.
struct Target {
    s: Session,
    nodeid: u64,
    fh: u64,
    daemon: Daemon,
}

fn start(binary: &Path, share: &Path, seccomp: &str, timeout: Duration) -> io::Result<Target> {
    let daemon = Daemon::builder(&DaemonKind::Path(binary.into()))?
        .shared_dir(share)
        .arg(format!("--seccomp={seccomp}"))
        .start_timeout(timeout)
        .spawn()?;
    let cfg = DriverConfig {
        poison: false,
        timeout,
        ..DriverConfig::default()
    };
    let s = Session::connect_with(daemon.socket_path(), &cfg).map_err(|e| {
        io::Error::other(format!(
            "connect: {e}; daemon log:\n{}",
            daemon.log_contents()
        ))
    })?;
    s.init()?;
    let e = s.lookup(1, "data")?;
    let o = s.open(e.nodeid, libc::O_RDONLY as u32)?;
    Ok(Target {
        s,
        nodeid: e.nodeid,
        fh: o.fh,
        daemon,
    })
}

/// The chain for request number `i` of kind `op`, and its unique.
fn request(t: &Target, op: Op, i: u64) -> (Chain, u64, usize) {
    let (opcode, arg, reply): (u32, Vec<u8>, usize) = match op {
        Op::Read => {
            let a = abi::ReadIn {
                fh: t.fh,
                offset: (i * u64::from(BLOCK)) % FILE_SIZE,
                size: BLOCK,
                ..Default::default()
            };
            (op::READ, a.as_slice().to_vec(), BLOCK as usize)
        }
        Op::Getattr => {
            let a = abi::GetattrIn {
                flags: 0,
                dummy: 0,
                fh: 0,
            };
            (op::GETATTR, a.as_slice().to_vec(), 104)
        }
    };
    let hdr = t.s.header(opcode, t.nodeid, arg.len());
    let segs = vec![
        Seg::Readable(hdr.as_slice().to_vec()),
        Seg::Readable(arg),
        Seg::Writable(std::mem::size_of::<OutHeader>() as u32),
        Seg::Writable(reply as u32),
    ];
    let chain = Chain {
        segs,
        indirect: t.s.device().info().indirect_desc,
    };
    (chain, hdr.unique, reply)
}

fn check(op: Op, unique: u64, want: usize, data: &[u8]) -> io::Result<()> {
    let oh = OutHeader::from_slice(data.get(..16).unwrap_or(&[]))
        .copied()
        .ok_or_else(|| io::Error::other(format!("{op:?}: short reply ({} bytes)", data.len())))?;
    if oh.unique != unique || oh.error != 0 || oh.len as usize != 16 + want {
        return Err(io::Error::other(format!(
            "{op:?}: bad reply: unique {} (want {unique}), error {}, len {} (want {})",
            oh.unique,
            oh.error,
            oh.len,
            16 + want
        )));
    }
    Ok(())
}

/// Sends `n` requests (or until `deadline`), keeping `depth` in flight. Returns the count.
fn run(t: &Target, op: Op, n: u64, deadline: Option<Instant>, depth: usize) -> io::Result<u64> {
    let dev = t.s.device();
    let timeout = dev.timeout();
    let mut pending = std::collections::VecDeque::new();
    let mut sent = 0u64;
    let mut done = 0u64;
    loop {
        let stop = sent >= n || (sent % 64 == 0 && deadline.is_some_and(|d| Instant::now() >= d));
        if !stop && pending.len() < depth {
            let (chain, unique, want) = request(t, op, sent);
            pending.push_back((dev.submit(1, &chain)?, unique, want));
            sent += 1;
            continue;
        }
        let Some((p, unique, want)) = pending.pop_front() else {
            return Ok(done);
        };
        let c = p.wait(timeout)?;
        check(op, unique, want, &c.data)?;
        done += 1;
        if stop {
            // Drain: no more submissions.
            let n_left = pending.len();
            for _ in 0..n_left {
                let (p, unique, want) = pending.pop_front().expect("pending");
                check(op, unique, want, &p.wait(timeout)?.data)?;
                done += 1;
            }
            return Ok(done);
        }
    }
}

struct Out {
    json: Option<File>,
}

impl Out {
    fn emit(&mut self, line: String) -> io::Result<()> {
        println!("{line}");
        if let Some(f) = &mut self.json {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

fn rate(o: &Opts, name: &str, bin: &Path, share: &Path, op: Op, out: &mut Out) -> io::Result<()> {
    let seccomp = o.seccomp.as_deref().unwrap_or("kill");
    let t = start(bin, share, seccomp, Duration::from_secs(10))?;
    run(&t, op, 2000, None, o.depth)?; // warm-up: page cache, allocations, branch predictors
    let t0 = Instant::now();
    let n = run(
        &t,
        op,
        u64::MAX,
        Some(t0 + Duration::from_secs_f64(o.seconds)),
        o.depth,
    )?;
    let secs = t0.elapsed().as_secs_f64();
    let v = t.s.device().violations();
    drop(t.s);
    let mut daemon = t.daemon;
    let _ = daemon.wait_exit(Duration::from_secs(5));
    if !v.is_empty() {
        return Err(io::Error::other(format!("protocol violations: {v:?}")));
    }
    let rps = n as f64 / secs;
    out.emit(format!(
        "{{\"kind\":\"rate\",\"daemon\":\"{name}\",\"op\":\"{}\",\"depth\":{},\"requests\":{n},\
         \"seconds\":{secs:.3},\"req_per_s\":{rps:.0},\"usec_per_req\":{:.2},\"seccomp\":\"{seccomp}\"}}",
        op.name(),
        o.depth,
        1e6 / rps
    ))
}

/// Total instructions (Ir) the daemon executed in a run of `n` requests of `op` under
/// callgrind (every thread; start-up and exit included).
fn callgrind_run(bin: &Path, share: &Path, seccomp: &str, op: Op, n: u64) -> io::Result<u64> {
    let dir = tempfile::Builder::new()
        .prefix("protobench-cg-")
        .tempdir()?;
    let outf = dir.path().join("callgrind.out");
    let wrapper = dir.path().join("daemon-under-callgrind");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file={} --dump-instr=no \
             --collect-jumps=no {} \"$@\"\n",
            outf.display(),
            bin.display()
        ),
    )?;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    let t = start(&wrapper, share, seccomp, Duration::from_secs(120))?;
    if n > 0 {
        run(&t, op, n, None, 1)?;
    }
    drop(t.s);
    let mut daemon = t.daemon;
    let st = daemon.wait_exit(Duration::from_secs(120))?;
    let text = std::fs::read_to_string(&outf).map_err(|e| {
        io::Error::other(format!(
            "no callgrind output ({e}); daemon exited {st}; log:\n{}",
            daemon.log_contents()
        ))
    })?;
    // "summary: N" (or "totals: N") holds the whole run's Ir.
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .ok_or_else(|| io::Error::other("callgrind output has no summary line"))
}

fn callgrind(
    o: &Opts,
    name: &str,
    bin: &Path,
    share: &Path,
    n: u64,
    out: &mut Out,
) -> io::Result<()> {
    let seccomp = o.seccomp.as_deref().unwrap_or("none");
    let base = callgrind_run(bin, share, seccomp, Op::Read, 0)?;
    for &op in &o.ops {
        let total = callgrind_run(bin, share, seccomp, op, n)?;
        let per = (total as f64 - base as f64) / n as f64;
        out.emit(format!(
            "{{\"kind\":\"callgrind\",\"daemon\":\"{name}\",\"op\":\"{}\",\"requests\":{n},\
             \"instructions_total\":{total},\"instructions_baseline\":{base},\
             \"instructions_per_req\":{per:.0}}}",
            op.name()
        ))?;
    }
    Ok(())
}

fn main() {
    let o = parse();
    let json = o.json.as_ref().map(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    });
    let mut out = Out { json };
    let share = make_share().expect("making the share");
    let mut failed = false;
    for name in &o.daemons {
        let bin = match kind(name).binary() {
            Ok(b) => b,
            Err(e) => {
                eprintln!("protobench: {name}: {e}");
                failed = true;
                continue;
            }
        };
        let res = match o.callgrind {
            Some(n) => callgrind(&o, name, &bin, share.path(), n.max(1), &mut out),
            None => o
                .ops
                .iter()
                .try_for_each(|&op| rate(&o, name, &bin, share.path(), op, &mut out)),
        };
        if let Err(e) = res {
            eprintln!("protobench: ERROR {name}: {e}");
            failed = true;
        }
    }
    drop(share); // process::exit skips destructors: remove the share first
    if failed {
        std::process::exit(1);
    }
}
