//! `daxfsd --mount MOUNTPOINT`: the same server on a host mount through /dev/fuse.
//!
//! Start-up order: open-file limit, mount-point checks (a stale mount is reported, never
//! unmounted), mount (before the sandbox: the sandbox cannot see the mount point), the
//! unmount helper (forked while single-threaded), sandbox, capabilities (CAP_SYS_ADMIN kept
//! only for FUSE passthrough), filesystem and server, seccomp, worker threads.
//!
//! Stop: SIGTERM, SIGINT or SIGHUP ask the helper to unmount (lazily when busy); the
//! workers see ENODEV once the kernel lets the connection go and the daemon exits 0. A
//! lazily detached mount stays alive while processes still use it (open files, working
//! directories, mappings): the daemon keeps serving them until they leave, because ending
//! the connection would drop what the kernel still holds for them (dirty pages of shared
//! mappings, or of every file with --writeback). After [`GRACE`] it says so once; a second
//! stop signal ends it at once (those processes then get ENOTCONN).

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::host::caps::{self, CapSet};
use crate::host::cli::{Cli, IoUringMode, PassthroughPolicy};
use crate::host::sandbox::{self, Entered};
use crate::host::seccomp;
use crate::host::startup::{self, capabilities_to_keep, signal_name, STOP_SIGNALS};
use crate::protocol::abi::init_flags;
use crate::protocol::backing;
use crate::protocol::mapper::{Mapper, NoMapper};
use crate::protocol::server::{Server, ServerOptions};
use crate::transport::dev_fuse::{self, Counters, MountOptions, Unmounter};
use crate::transport::fuse_uring;

/// After a stop signal, how long a lazily unmounted, still busy mount is served before the
/// daemon logs that it waits for the mount's last users.
pub const GRACE: Duration = Duration::from_secs(2);

enum Event {
    Worker(io::Result<()>),
    Stop(libc::c_int),
    /// The session cannot go on as asked (`--io-uring=on` without rings).
    Fatal(io::Error),
}

/// Runs `daxfsd --mount` until the mount goes away or a stop signal came.
pub fn run(cli: &Cli) -> io::Result<()> {
    let shared_dir = startup::prepare(cli)?;
    let requested = cli
        .mount
        .clone()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "missing --mount"))?;
    let mountpoint = dev_fuse::check_mountpoint(&requested, &shared_dir)?;
    match dev_fuse::kernel_has_uring_zero_copy() {
        Some(true) => log::info!(
            "this kernel has FUSE-over-io-uring zero copy (FUSE_URING_ZERO_COPY); daxfsd does not use it yet"
        ),
        Some(false) => log::info!(
            "this kernel lacks FUSE-over-io-uring zero copy (the 2026 FUSE_URING_ZERO_COPY series): data is copied between the kernel and the daemon"
        ),
        None => log::info!("FUSE-over-io-uring zero copy: cannot tell from /proc/kallsyms"),
    }
    let (_, caps_before, _) = caps::current()?;
    let mut keep = capabilities_to_keep(cli, caps_before)?;
    let can_pass_through = caps_before.contains(caps::CAP_SYS_ADMIN);
    if cli.passthrough != PassthroughPolicy::Off && !can_pass_through {
        log::info!(
            "FUSE passthrough off: registering backing files needs CAP_SYS_ADMIN (run as root)"
        );
    }
    if cli.passthrough != PassthroughPolicy::Off {
        // FUSE_DEV_IOC_BACKING_OPEN needs CAP_SYS_ADMIN in the initial user namespace.
        keep = CapSet(keep.0 | (caps_before.0 & CapSet::of(&[caps::CAP_SYS_ADMIN]).0));
    }
    // Before mounting (a refusal leaves nothing behind) and the sandbox (it may hide /sys).
    let uring = io_uring_wanted(cli.io_uring)?;

    let mounted = dev_fuse::mount(
        &mountpoint,
        &shared_dir,
        MountOptions {
            readonly: cli.readonly,
        },
    )?;
    log::info!(
        "mounted {} on {} ({:?})",
        shared_dir.display(),
        mountpoint.display(),
        mounted.by
    );
    let mut unmounter = match Unmounter::spawn(&mountpoint, mounted.by, &[mounted.dev.as_raw_fd()])
    {
        Ok(u) => u,
        Err(e) => {
            let _ = unmount_here(&mountpoint, mounted);
            return Err(e);
        }
    };
    let dev = mounted.dev;
    let maps = match cli.user_ns_maps() {
        Ok(m) => m,
        Err(e) => {
            report_unmount(&mut unmounter, &mountpoint);
            return Err(io::Error::new(io::ErrorKind::InvalidInput, e));
        }
    };
    let inside = match sandbox::enter(cli.sandbox, &shared_dir, &maps) {
        Ok(Entered::Supervisor(mut sup)) => {
            // Only the serving child may hold the connection: if it dies, the mount must
            // fail (ENOTCONN), not hang.
            drop(dev);
            log::debug!("sandbox: serving process {} started", sup.child());
            let exit = sup.wait();
            match unmounter.unmount() {
                Ok(m) if !m.is_empty() => log::info!("{}: {m}", mountpoint.display()),
                _ => {}
            }
            exit?.exit_process()
        }
        Ok(Entered::Serving(inside)) => inside,
        Err(e) => {
            report_unmount(&mut unmounter, &mountpoint);
            return Err(e);
        }
    };
    // With --uid-map/--gid-map the daemon is root of its own user namespace: it keeps the
    // capabilities serving needs there (as the vhost-user path does).
    if maps != sandbox::UserNsMaps::default() {
        match caps::current().and_then(|c| capabilities_to_keep(cli, c.1)) {
            Ok(k) => keep = k,
            Err(e) => {
                report_unmount(&mut unmounter, &mountpoint);
                return Err(e);
            }
        }
    }
    let result = serve(
        cli,
        dev,
        inside,
        keep,
        can_pass_through,
        &mut unmounter,
        &mountpoint,
        uring,
    );
    if result.is_err() {
        report_unmount(&mut unmounter, &mountpoint);
    }
    result
}

/// Without a helper (it could not be forked): unmount from this process.
fn unmount_here(mountpoint: &std::path::Path, m: dev_fuse::Mounted) -> io::Result<()> {
    drop(m.dev);
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: `c` is NUL-terminated.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    Ok(())
}

fn report_unmount(u: &mut Unmounter, mountpoint: &std::path::Path) {
    match u.unmount() {
        Ok(m) if !m.is_empty() => log::info!("{}: {m}", mountpoint.display()),
        Ok(_) => {}
        Err(e) => log::warn!("{}: unmount helper: {e}", mountpoint.display()),
    }
}

/// Whether to offer FUSE-over-io-uring at INIT (`--io-uring`); logs why not.
fn io_uring_wanted(mode: IoUringMode) -> io::Result<bool> {
    if mode == IoUringMode::Off {
        log::info!("io-uring: off (--io-uring=off): requests come through read(2) on /dev/fuse");
        return Ok(false);
    }
    match fuse_uring::availability() {
        fuse_uring::Availability::Available => Ok(true),
        fuse_uring::Availability::Unavailable(why) if mode == IoUringMode::On => {
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("--io-uring=on: {why}; or use --io-uring=auto"),
            ))
        }
        fuse_uring::Availability::Unavailable(why) => {
            log::info!("io-uring: not used: {why}; requests come through read(2) on /dev/fuse");
            Ok(false)
        }
    }
}

/// The server a host mount runs: the passthrough filesystem behind the (forwarding) DAX
/// decorator.
type MountServer = Server<crate::dax::coherent::Coherent<crate::passthrough::PassthroughFs>>;

#[allow(clippy::too_many_arguments)]
fn serve(
    cli: &Cli,
    dev: std::fs::File,
    inside: sandbox::Inside,
    keep: CapSet,
    can_pass_through: bool,
    unmounter: &mut Unmounter,
    mountpoint: &std::path::Path,
    uring: bool,
) -> io::Result<()> {
    // The stop signals (and SIGUSR1, the report) are taken with sigwait by their threads;
    // every thread spawned from here on inherits the mask.
    let mut block = STOP_SIGNALS.to_vec();
    block.push(libc::SIGUSR1);
    let blocked = sandbox::sigset(&block);
    // SAFETY: `blocked` is a valid signal set; this changes only this thread's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &blocked, std::ptr::null_mut()) };

    let dev = Arc::new(dev);
    let server = build_server(cli, &dev, inside, keep, can_pass_through, uring)?;
    let counters = Arc::new(Counters::default());
    let ring_stats = Arc::new(fuse_uring::Stats::default());
    {
        let (c, s, r) = (counters.clone(), server.clone(), ring_stats.clone());
        startup::spawn_sigusr1_reporter(move || {
            log::info!("{}", report(&c, s.fuse_passthrough_stats(), &r));
            log::info!("{}", s.request_counts());
        });
    }
    let extra = if uring { seccomp::IO_URING } else { &[] };

    startup::install_seccomp(cli.seccomp, extra)?;

    let (tx, rx) = mpsc::channel();
    let rings: Arc<Mutex<Option<fuse_uring::Rings>>> = Arc::default();
    if uring {
        start_rings_after_init(cli, &dev, &server, &ring_stats, &counters, &rings, &tx);
    }
    let threads = match cli.thread_pool_size {
        0 => dev_fuse::DEFAULT_THREADS,
        n => n,
    };
    let n_workers = spawn_threads(dev, &server, threads, &counters, &tx)?;
    log::info!(
        "serving {} on {} ({threads} thread(s), cache {:?}, sandbox {:?}, seccomp {:?})",
        cli.shared_dir
            .as_deref()
            .unwrap_or(std::path::Path::new("?"))
            .display(),
        mountpoint.display(),
        cli.cache,
        cli.sandbox,
        cli.seccomp,
    );

    let (stopped_by, first_err) = wait_for_end(&rx, n_workers, unmounter, mountpoint);
    if stopped_by.is_none() && first_err.is_none() {
        log::info!("{}: unmounted, exiting", mountpoint.display());
    }
    if let Some(r) = rings.lock().unwrap_or_else(|e| e.into_inner()).take() {
        r.shutdown();
    }
    let pt = server.fuse_passthrough_stats();
    server.reset();
    log::info!("{}", report(&counters, pt, &ring_stats));
    log::info!("{}", server.request_counts());
    match (stopped_by, first_err) {
        (Some(sig), _) => {
            log::info!("{}: session ended, exiting", signal_name(sig));
            Ok(())
        }
        (None, Some(e)) => Err(e),
        (None, None) => Ok(()),
    }
}

/// Drops capabilities to `keep` and makes the server: the filesystem, its host-change watch
/// (--notify, the group made while capabilities last) and FUSE passthrough when allowed.
fn build_server(
    cli: &Cli,
    dev: &Arc<std::fs::File>,
    inside: sandbox::Inside,
    keep: CapSet,
    can_pass_through: bool,
    uring: bool,
) -> io::Result<Arc<MountServer>> {
    let watch_group = if cli.wants_notify() {
        crate::passthrough::open_watch_group()
    } else {
        None
    };
    caps::drop_to(keep)?;
    // Linux offers FUSE_SUBMOUNTS to virtio-fs only: nothing to announce on a host mount.
    let fs = startup::passthrough_fs(cli, inside, |cfg| cfg.announce_submounts = false)?;
    if let Some(group) = watch_group {
        let n = Arc::new(crate::protocol::notify::Notifier::new(
            crate::protocol::notify::QUEUE_CAP,
        ));
        fs.watch_host(group, n.clone())?;
        crate::transport::dev_fuse_notify::spawn(dev.clone(), n)?;
    }
    let mapper: Arc<dyn Mapper> = Arc::new(NoMapper);
    // No DAX window here: the decorator only forwards.
    let fs = crate::dax::coherent::Coherent::new(fs, None);
    let policy = match can_pass_through {
        true => passthrough_policy(cli),
        false => backing::Policy::Off,
    };
    let mut opts = ServerOptions::default();
    if uring {
        opts.transport_flags |= init_flags::OVER_IO_URING;
    }
    if policy != backing::Policy::Off {
        opts.transport_flags |= init_flags::PASSTHROUGH;
        // Backing files on a plain filesystem; our mount may itself be a lower layer of
        // overlayfs (Linux allows a total stacking depth of 2).
        opts.max_stack_depth = 1;
    }
    let mut server = Server::new(fs, Box::new(mapper), opts);
    if policy != backing::Policy::Off {
        server = server.with_fuse_passthrough(backing::Passthrough::new(
            Box::new(dev_fuse::DevFuseBacking::new(dev.clone())),
            policy,
        ));
    }
    Ok(Arc::new(server))
}

/// Has the worker that answers INIT register the io-uring rings right after its reply (into
/// `rings`); a failure that ends the session goes to `tx`.
fn start_rings_after_init(
    cli: &Cli,
    dev: &std::fs::File,
    server: &Arc<MountServer>,
    stats: &Arc<fuse_uring::Stats>,
    counters: &Counters,
    rings: &Arc<Mutex<Option<fuse_uring::Rings>>>,
    tx: &mpsc::Sender<Event>,
) {
    let (rings, server, stats, tx) = (rings.clone(), server.clone(), stats.clone(), tx.clone());
    let (dev_fd, required) = (dev.as_raw_fd(), cli.io_uring == IoUringMode::On);
    let started = std::sync::atomic::AtomicBool::new(false);
    counters.after_init.set(move || {
        if started.swap(true, Ordering::SeqCst) {
            return;
        }
        let r = fuse_uring::start_after_init(
            dev_fd,
            server.clone(),
            fuse_uring::DEFAULT_DEPTH,
            stats.clone(),
            required,
        );
        match r {
            Ok(r) => *rings.lock().unwrap_or_else(|e| e.into_inner()) = r,
            Err(e) => {
                let _ = tx.send(Event::Fatal(e));
            }
        }
    });
}

/// Starts `threads` workers on `dev`, a joiner for each and the stop-signal thread, all
/// reporting to `tx`; returns the number of workers.
fn spawn_threads(
    dev: Arc<std::fs::File>,
    server: &Arc<MountServer>,
    threads: usize,
    counters: &Arc<Counters>,
    tx: &mpsc::Sender<Event>,
) -> io::Result<usize> {
    let workers = dev_fuse::spawn_workers(dev, server.clone(), threads, counters.clone())?;
    let n_workers = workers.len();
    for (i, h) in workers.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::Builder::new()
            .name(format!("join-{i}"))
            .spawn(move || {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("worker panicked")));
                let _ = tx.send(Event::Worker(r));
            })?;
    }
    let tx = tx.clone();
    let set = sandbox::sigset(&STOP_SIGNALS);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let mut sig = 0;
            // SAFETY: `set` is a valid signal set and `sig` a valid output location.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 && tx.send(Event::Stop(sig)).is_err() {
                return;
            }
        })?;
    Ok(n_workers)
}

/// Waits until the `n_workers` workers ended (the mount went away) or a second stop signal
/// came; a first stop signal or a fatal error unmounts. Returns the stop signal, if any, and
/// the first error.
fn wait_for_end(
    rx: &mpsc::Receiver<Event>,
    n_workers: usize,
    unmounter: &mut Unmounter,
    mountpoint: &std::path::Path,
) -> (Option<libc::c_int>, Option<io::Error>) {
    let mut done = 0;
    let mut deadline: Option<Instant> = None;
    let mut first_err = None;
    let mut stopped_by = None;
    while done < n_workers {
        let ev = match deadline {
            None => rx.recv().ok(),
            Some(d) => match rx.recv_timeout(d.saturating_duration_since(Instant::now())) {
                Ok(ev) => Some(ev),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    log::warn!(
                        "{}: still in use {} s after the lazy unmount; serving its last users until they close their files (their unwritten data would be lost otherwise); send the signal again to stop now",
                        mountpoint.display(),
                        GRACE.as_secs()
                    );
                    deadline = None;
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => None,
            },
        };
        match ev {
            None => break,
            Some(Event::Worker(r)) => {
                done += 1;
                if let Err(e) = r {
                    log::error!("{e}");
                    first_err.get_or_insert(e);
                }
            }
            Some(Event::Fatal(e)) => {
                log::error!("{e}");
                first_err.get_or_insert(e);
                if deadline.is_none() {
                    report_unmount(unmounter, mountpoint);
                    deadline = Some(Instant::now() + GRACE);
                }
            }
            Some(Event::Stop(sig)) => {
                if stopped_by.is_some() {
                    log::warn!(
                        "{}: stopping now; processes still using the detached mount get ENOTCONN",
                        signal_name(sig)
                    );
                    break;
                }
                log::info!("{}: unmounting {}", signal_name(sig), mountpoint.display());
                stopped_by = Some(sig);
                report_unmount(unmounter, mountpoint);
                deadline = Some(Instant::now() + GRACE);
            }
        }
    }
    (stopped_by, first_err)
}

fn report(c: &Counters, pt: Option<backing::Stats>, r: &fuse_uring::Stats) -> String {
    let mut s = format!(
        "/dev/fuse: {} requests, {} interrupted replies, {} reply write errors",
        c.requests.load(Ordering::Relaxed),
        c.interrupted.load(Ordering::Relaxed),
        c.write_errors.load(Ordering::Relaxed)
    );
    if let Some(p) = pt {
        s.push_str("; ");
        s.push_str(&p.to_string());
    }
    let queues = r.queues.load(Ordering::Relaxed);
    if queues > 0 {
        s.push_str(&format!(
            "; read(2) requests other than FORGET/INTERRUPT: {}; io-uring: {} requests served from {queues} queues x {} entries (+{} spares for lock waits), {} malformed, {} replies lost",
            c.not_forget.load(Ordering::Relaxed),
            r.served.load(Ordering::Relaxed),
            r.depth.load(Ordering::Relaxed),
            r.spares.load(Ordering::Relaxed),
            r.malformed.load(Ordering::Relaxed),
            r.lost.load(Ordering::Relaxed),
        ));
    }
    s
}

/// `--passthrough` as the server applies it. The writeback cache excludes passthrough
/// (Linux agrees to FUSE_PASSTHROUGH only without FUSE_WRITEBACK_CACHE).
fn passthrough_policy(cli: &Cli) -> backing::Policy {
    let p = match cli.passthrough {
        PassthroughPolicy::Off => backing::Policy::Off,
        PassthroughPolicy::Auto => backing::Policy::All,
        PassthroughPolicy::MinSize(n) => backing::Policy::MinSize(n),
    };
    if p != backing::Policy::Off && cli.writeback {
        log::warn!("--writeback: Linux does not combine FUSE passthrough with the writeback cache; passthrough off");
        return backing::Policy::Off;
    }
    p
}
