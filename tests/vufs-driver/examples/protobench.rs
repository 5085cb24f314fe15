//! Protocol-level microbenchmark: FUSE requests per second and instructions per request of a
//! vhost-user-fs backend, driven by the userspace driver (no VM, no guest kernel).
//!
//! ```text
//! cargo run --release -p vufs-driver --example protobench -- [options]
//!   --daemon D[,ARG]  daxfsd | virtiofsd | PATH, with extra daemon arguments after commas
//!                     (e.g. daxfsd,--thread-pool-size=4); repeatable; default: daxfsd and
//!                     virtiofsd. `@dax-ranges=N` among them is protobench's: before the
//!                     run, map N writable 64 MiB DAX ranges of the file the requests use
//!                     (window offsets 0, 64M, ...; the daemon needs a window that large) and
//!                     store a byte into each, as a guest writing through DAX would;
//!                     `@dax-from=MIB` maps them from that file offset on (default 0: over
//!                     the bytes the requests read; past 64 the file's end, beside them)
//!   --op OP           read (4 KiB READ) | write (4 KiB WRITE over the same file) | getattr |
//!                     lookup (of one name) | readdirplus (4 KiB of a 64-entry directory) |
//!                     cat (what `cat FILE` costs a `--cache=never` mount, one file at a
//!                     time: LOOKUP, OPEN, GETATTR, READ, READ at EOF, FLUSH (unless the
//!                     OPEN reply has NOFLUSH), RELEASE, FORGET of one of 64 4 KiB files;
//!                     the rate counts files; --depth 1 only)
//!                     (repeatable; default: read and getattr)
//!   --seconds S       measuring time per (daemon, op) for the rate (default 3)
//!   --depth N         requests in flight (default 1: one at a time)
//!   --queues N        spread the requests over N request queues (default 1)
//!   --blocked-lock    first put a SETLKW that waits (a lock this process holds) on queue 1,
//!                     measure with it pending, then let it complete (daxfsd needs
//!                     --posix-lock in its arguments for the lock to reach the host)
//!   --callgrind N     instead of the rate: instructions per request under
//!                     `valgrind --tool=callgrind`, from a run of N requests minus a
//!                     baseline run of 0 requests (same set-up: INIT, LOOKUP, OPEN), with
//!                     --queues and --depth as given
//!                     (PROTOBENCH_CALLGRIND_KEEP=DIR keeps each callgrind.out there)
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
/// READDIRPLUS buffer: the reply fills part of it (checked as at most this).
const DIR_BUF: u32 = 4096;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Read,
    Write,
    Getattr,
    Lookup,
    Readdirplus,
    Cat,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Getattr => "getattr",
            Op::Lookup => "lookup",
            Op::Readdirplus => "readdirplus",
            Op::Cat => "cat",
        }
    }
}

struct Opts {
    daemons: Vec<String>,
    ops: Vec<Op>,
    seconds: f64,
    depth: usize,
    queues: usize,
    blocked_lock: bool,
    callgrind: Option<u64>,
    seccomp: Option<String>,
    json: Option<PathBuf>,
}

fn usage() -> ! {
    eprintln!(
        "usage: protobench [--daemon daxfsd|virtiofsd|PATH]... [--op read|write|getattr|lookup|readdirplus|cat]... \
         [--seconds S] [--depth N] [--queues N] [--callgrind N] [--seccomp MODE] [--json FILE]"
    );
    std::process::exit(2)
}

fn parse() -> Opts {
    let mut o = Opts {
        daemons: Vec::new(),
        ops: Vec::new(),
        seconds: 3.0,
        depth: 1,
        queues: 1,
        blocked_lock: false,
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
                "write" => Op::Write,
                "lookup" => Op::Lookup,
                "readdirplus" => Op::Readdirplus,
                "getattr" => Op::Getattr,
                "cat" => Op::Cat,
                _ => usage(),
            }),
            "--seconds" => o.seconds = val().parse().unwrap_or_else(|_| usage()),
            "--depth" => o.depth = val().parse().unwrap_or_else(|_| usage()),
            "--queues" => o.queues = val().parse().unwrap_or_else(|_| usage()),
            "--blocked-lock" => o.blocked_lock = true,
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
    if o.queues == 0 || o.queues > 16 {
        eprintln!("protobench: --queues must be 1..=16");
        std::process::exit(2);
    }
    if o.depth == 0 || o.depth > 64 {
        eprintln!("protobench: --depth must be 1..=64");
        std::process::exit(2);
    }
    if o.ops.contains(&Op::Cat) && (o.depth > 1 || o.queues > 1) {
        eprintln!("protobench: --op cat runs one request at a time: drop --depth and --queues");
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

/// `NAME[,ARG...]`: the daemon's binary, its extra arguments, and the DAX ranges to map
/// first (`@dax-ranges=N`).
fn daemon_spec(spec: &str) -> io::Result<(PathBuf, Vec<String>, (u64, u64))> {
    let mut parts = spec.split(',');
    let name = parts.next().unwrap_or_default();
    let bin = kind(name)
        .binary()
        .map_err(|e| io::Error::other(format!("{name}: {e}")))?;
    let (mut ranges, mut from) = (0, 0);
    let mut args = Vec::new();
    for a in parts {
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| io::Error::other(format!("{spec}: bad {a}")))
        };
        if let Some(n) = a.strip_prefix("@dax-ranges=") {
            ranges = num(n)?;
        } else if let Some(n) = a.strip_prefix("@dax-from=") {
            from = num(n)? << 20;
        } else {
            args.push(a.to_string());
        }
    }
    Ok((bin, args, (ranges, from)))
}

/// Maps `n` writable 64 MiB DAX ranges of the target's file (see `@dax-ranges`) and stores a
/// byte into each through the window.
fn map_ranges(t: &Target, (n, from): (u64, u64)) -> io::Result<()> {
    const RANGE: u64 = 64 << 20;
    if n == 0 {
        return Ok(());
    }
    let w =
        t.s.dax()
            .cloned()
            .ok_or_else(|| io::Error::other("@dax-ranges: the daemon offers no DAX window"))?;
    for k in 0..n {
        t.s.setupmapping(
            t.nodeid,
            t.fh,
            from + k * RANGE,
            RANGE,
            abi::SETUPMAPPING_FLAG_READ | abi::SETUPMAPPING_FLAG_WRITE,
            k * RANGE,
        )?;
        w.write(k * RANGE + 4096, &[k as u8 + 1])?;
    }
    Ok(())
}

/// A share with one 64 MiB file of non-zero bytes and a directory of 64 files of 4 KiB.
fn make_share() -> io::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new().prefix("protobench-").tempdir()?;
    File::create(dir.path().join("locked"))?;
    std::fs::create_dir(dir.path().join("dir"))?;
    for i in 0..64 {
        File::create(dir.path().join(format!("dir/entry-{i:02}")))?.write_all(&[b'x'; 4096])?;
    }
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
    /// The 64-entry directory, opened (readdirplus).
    dir: (u64, u64),
    queues: usize,
    daemon: Daemon,
}

fn start(
    binary: &Path,
    args: &[String],
    share: &Path,
    seccomp: &str,
    queues: usize,
    timeout: Duration,
) -> io::Result<Target> {
    let mut b = Daemon::builder(&DaemonKind::Path(binary.into()))?
        .shared_dir(share)
        .arg(format!("--seccomp={seccomp}"))
        .start_timeout(timeout);
    if queues > 1 {
        b = b.arg(format!("--queues={queues}"));
    }
    for a in args {
        b = b.arg(a);
    }
    let daemon = b.spawn()?;
    let cfg = DriverConfig {
        poison: false,
        timeout,
        max_request_queues: Some(queues),
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
    let o = s.open(e.nodeid, libc::O_RDWR as u32)?;
    if s.device().queue(queues).is_err() {
        return Err(io::Error::other(format!(
            "the daemon set up fewer than {queues} request queues"
        )));
    }
    let d = s.lookup(1, "dir")?;
    let od = s.opendir(d.nodeid, libc::O_RDONLY as u32)?;
    Ok(Target {
        s,
        nodeid: e.nodeid,
        fh: o.fh,
        dir: (d.nodeid, od.fh),
        queues,
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
        Op::Write => {
            let a = abi::WriteIn {
                fh: t.fh,
                offset: (i * u64::from(BLOCK)) % FILE_SIZE,
                size: BLOCK,
                ..Default::default()
            };
            (
                op::WRITE,
                a.as_slice().to_vec(),
                std::mem::size_of::<abi::WriteOut>(),
            )
        }
        Op::Getattr => {
            let a = abi::GetattrIn {
                flags: 0,
                dummy: 0,
                fh: 0,
            };
            (op::GETATTR, a.as_slice().to_vec(), 104)
        }
        Op::Lookup => (op::LOOKUP, b"data\0".to_vec(), 128),
        Op::Cat => unreachable!("cat is a sequence of requests (see `cat`)"),
        Op::Readdirplus => {
            let a = abi::ReadIn {
                fh: t.dir.1,
                size: DIR_BUF,
                ..Default::default()
            };
            (op::READDIRPLUS, a.as_slice().to_vec(), DIR_BUF as usize)
        }
    };
    let nodeid = match op {
        Op::Lookup => 1,
        Op::Readdirplus => t.dir.0,
        _ => t.nodeid,
    };
    // A WRITE's data in its own buffer after the argument, as Linux lays it out.
    let data = (op == Op::Write).then(|| vec![(i % 251) as u8; BLOCK as usize]);
    let data_len = data.as_ref().map_or(0, Vec::len);
    let hdr = t.s.header(opcode, nodeid, arg.len() + data_len);
    let mut segs = vec![Seg::Readable(hdr.as_slice().to_vec()), Seg::Readable(arg)];
    segs.extend(data.map(Seg::Readable));
    segs.push(Seg::Writable(std::mem::size_of::<OutHeader>() as u32));
    segs.push(Seg::Writable(reply as u32));
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
    // READDIRPLUS fills as many entries as fit: any non-empty reply up to the buffer.
    let len_ok = match op {
        Op::Readdirplus => oh.len as usize > 16 && oh.len as usize <= 16 + want,
        _ => oh.len as usize == 16 + want,
    };
    if oh.unique != unique || oh.error != 0 || !len_ok {
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

/// One file as `cat` on a `--cache=never` mount reads it (each request waits for the one
/// before, as the guest's system calls do).
fn cat(t: &Target, i: u64) -> io::Result<()> {
    let s = &t.s;
    let e = s.lookup(t.dir.0, format!("entry-{:02}", i % 64))?;
    let o = s.open(e.nodeid, libc::O_RDONLY as u32)?;
    s.getattr(e.nodeid, None)?;
    let got = s.read(e.nodeid, o.fh, 0, 128 << 10)?.len();
    let eof = s.read(e.nodeid, o.fh, got as u64, 128 << 10)?.len();
    if got != 4096 || eof != 0 {
        return Err(io::Error::other(format!(
            "cat: read {got} then {eof} bytes"
        )));
    }
    // As Linux: no FLUSH on close where the OPEN reply said NOFLUSH.
    if o.open_flags & abi::fopen::NOFLUSH == 0 {
        s.flush(e.nodeid, o.fh, 0x1234)?;
    }
    s.release(e.nodeid, o.fh, libc::O_RDONLY as u32)?;
    s.forget(e.nodeid, 1)
}

/// Sends `n` requests (or until `deadline`), keeping `depth` in flight. Returns the count.
fn run(t: &Target, op: Op, n: u64, deadline: Option<Instant>, depth: usize) -> io::Result<u64> {
    if op == Op::Cat {
        let mut done = 0;
        while done < n && !deadline.is_some_and(|d| Instant::now() >= d) {
            cat(t, done)?;
            done += 1;
        }
        return Ok(done);
    }
    let dev = t.s.device();
    let timeout = dev.timeout();
    let mut pending = std::collections::VecDeque::new();
    let mut sent = 0u64;
    let mut done = 0u64;
    loop {
        let stop = sent >= n || (sent % 64 == 0 && deadline.is_some_and(|d| Instant::now() >= d));
        if !stop && pending.len() < depth {
            let (chain, unique, want) = request(t, op, sent);
            let queue = 1 + (sent as usize % t.queues);
            pending.push_back((dev.submit(queue, &chain)?, unique, want));
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

/// Holds an OFD write lock on `locked` in the share and puts a SETLKW for it on queue 1; the
/// request waits until the returned file is dropped.
fn blocked_lock(t: &Target, share: &Path) -> io::Result<(File, vufs_driver::queue::Pending)> {
    let f = vufs_driver::host_write_lock(&share.join("locked"))?;
    let e = t.s.lookup(1, "locked")?;
    let o = t.s.open(e.nodeid, libc::O_RDWR as u32)?;
    let lk = vufs_driver::whole_file_write_lock(o.fh, 1);
    let chain = t.s.linux_chain(op::SETLKW, e.nodeid, &[lk.as_slice()], 0);
    let p = t.s.device().submit(1, &chain)?;
    std::thread::sleep(Duration::from_millis(100));
    Ok((f, p))
}

/// `pid` and its live descendants: with `--restartable` the file server is the holder's child.
fn family(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let p = all[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                    all.extend(c.split_whitespace().filter_map(|x| x.parse::<u32>().ok()));
                }
            }
        }
        i += 1;
    }
    all
}

/// CPU time (user + system, every thread) process `pid` and its descendants have used, in
/// seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    family(pid).into_iter().map(cpu_seconds_of).sum()
}

fn cpu_seconds_of(pid: u32) -> Option<f64> {
    vufs_driver::process_cpu(pid).map(|d| d.as_secs_f64())
}

/// Context switches (voluntary and not) of every thread process `pid` and its descendants
/// have now: what it costs in wake-ups and preemptions, on a host too loaded for the rate to
/// be steady.
fn cswitches(pid: u32) -> Option<u64> {
    family(pid).into_iter().map(cswitches_of).sum()
}

fn cswitches_of(pid: u32) -> Option<u64> {
    let mut n = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let status = std::fs::read_to_string(t.ok()?.path().join("status")).ok()?;
        for l in status.lines() {
            if let Some(v) = l
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                n += v.trim().parse::<u64>().ok()?;
            }
        }
    }
    Some(n)
}

fn rate(o: &Opts, name: &str, share: &Path, op: Op, out: &mut Out) -> io::Result<()> {
    let seccomp = o.seccomp.as_deref().unwrap_or("kill");
    let (bin, args, ranges) = daemon_spec(name)?;
    let t = start(
        &bin,
        &args,
        share,
        seccomp,
        o.queues,
        Duration::from_secs(10),
    )?;
    map_ranges(&t, ranges)?;
    let lock = if o.blocked_lock {
        Some(blocked_lock(&t, share)?)
    } else {
        None
    };
    run(&t, op, 2000, None, o.depth)?; // warm-up: page cache, allocations, branch predictors
    let pid = t.daemon.pid();
    let cpu0 = pid.and_then(cpu_seconds);
    let cs0 = pid.and_then(cswitches);
    let ring0 = ring_counts(&t);
    let t0 = Instant::now();
    let n = run(
        &t,
        op,
        u64::MAX,
        Some(t0 + Duration::from_secs_f64(o.seconds)),
        o.depth,
    )?;
    let secs = t0.elapsed().as_secs_f64();
    // The daemon's CPU per request: what it costs whoever sends the requests (the rate is
    // bounded by this driver on a small machine, the CPU per request is not).
    let cpu = match (cpu0, pid.and_then(cpu_seconds)) {
        (Some(a), Some(b)) if n > 0 => format!("{:.2}", (b - a) * 1e6 / n as f64),
        _ => "null".to_string(),
    };
    let cs = match (cs0, pid.and_then(cswitches)) {
        (Some(a), Some(b)) if n > 0 => format!("{:.3}", b.saturating_sub(a) as f64 / n as f64),
        _ => "null".to_string(),
    };
    // The driver's kicks (each a wake-up the daemon may take) and the daemon's signals it
    // read, per request, summed over the request queues: a daemon's context switches beyond
    // its kicks are its own sleeps.
    let ring1 = ring_counts(&t);
    let per_req = |a: u64, b: u64| format!("{:.3}", b.saturating_sub(a) as f64 / n.max(1) as f64);
    let (kicks, calls) = (per_req(ring0.0, ring1.0), per_req(ring0.1, ring1.1));
    if let Some((f, p)) = lock {
        drop(f);
        p.wait(Duration::from_secs(10))?;
    }
    let v = t.s.device().violations();
    drop(t.s);
    let mut daemon = t.daemon;
    let _ = daemon.wait_exit(Duration::from_secs(5));
    if !v.is_empty() {
        return Err(io::Error::other(format!("protocol violations: {v:?}")));
    }
    let rps = n as f64 / secs;
    out.emit(format!(
        "{{\"kind\":\"rate\",\"daemon\":\"{name}\",\"op\":\"{}\",\"depth\":{},\"queues\":{},\
         \"blocked_lock\":{},\"requests\":{n},\"seconds\":{secs:.3},\"req_per_s\":{rps:.0},\
         \"usec_per_req\":{:.2},\"daemon_cpu_usec_per_req\":{cpu},\
         \"daemon_cswitch_per_req\":{cs},\"kicks_per_req\":{kicks},\
         \"calls_per_req\":{calls},\"seccomp\":\"{seccomp}\"}}",
        op.name(),
        o.depth,
        o.queues,
        o.blocked_lock,
        1e6 / rps
    ))
}

/// Kicks the driver sent and calls it read so far, over the request queues.
fn ring_counts(t: &Target) -> (u64, u64) {
    (1..=t.queues)
        .filter_map(|q| t.s.device().queue(q).ok().map(|q| q.stats()))
        .fold((0, 0), |(k, c), s| (k + s.kicks, c + s.calls))
}

/// Total instructions (Ir) the daemon executed in a run of `n` requests of `op` under
/// callgrind (every thread; start-up and exit included).
fn callgrind_run(
    bin: &Path,
    args: &[String],
    share: &Path,
    seccomp: &str,
    op: Op,
    n: u64,
    (queues, depth): (usize, usize),
) -> io::Result<u64> {
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
    let t = start(
        &wrapper,
        args,
        share,
        seccomp,
        queues,
        Duration::from_secs(120),
    )?;
    if n > 0 {
        run(&t, op, n, None, depth)?;
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
    if let Some(keep) = std::env::var_os("PROTOBENCH_CALLGRIND_KEEP") {
        // For callgrind_annotate: DIR/<daemon file name>-<op>-<n>.out
        let name = bin.file_name().unwrap_or_default().to_string_lossy();
        let to = Path::new(&keep).join(format!("{name}-{}-{n}.out", op.name()));
        std::fs::copy(&outf, &to)?;
    }
    // "summary: N" (or "totals: N") holds the whole run's Ir.
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .ok_or_else(|| io::Error::other("callgrind output has no summary line"))
}

fn callgrind(o: &Opts, name: &str, share: &Path, n: u64, out: &mut Out) -> io::Result<()> {
    let seccomp = o.seccomp.as_deref().unwrap_or("none");
    let (bin, args, _) = daemon_spec(name)?;
    let shape = (o.queues, o.depth);
    let base = callgrind_run(&bin, &args, share, seccomp, Op::Read, 0, shape)?;
    for &op in &o.ops {
        let total = callgrind_run(&bin, &args, share, seccomp, op, n, shape)?;
        let per = (total as f64 - base as f64) / n as f64;
        out.emit(format!(
            "{{\"kind\":\"callgrind\",\"daemon\":\"{name}\",\"op\":\"{}\",\"requests\":{n},\
             \"queues\":{},\"depth\":{},\"instructions_total\":{total},\
             \"instructions_baseline\":{base},\"instructions_per_req\":{per:.0}}}",
            op.name(),
            o.queues,
            o.depth
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
        let res = match o.callgrind {
            Some(n) => callgrind(&o, name, share.path(), n.max(1), &mut out),
            None => o
                .ops
                .iter()
                .try_for_each(|&op| rate(&o, name, share.path(), op, &mut out)),
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
