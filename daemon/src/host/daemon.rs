//! The vhost-user mode: wires the layers together and runs one vhost-user session. The
//! start-up it shares with the /dev/fuse mount is [`super::startup`]'s.

use std::io;
use std::os::fd::FromRawFd;
use std::sync::Arc;

use vhost::vhost_user::{Backend, Listener};
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::dax::DaxWindow;
use crate::host::caps;
use crate::host::cli::Cli;
use crate::host::keeper_link::KeeperLink;
use crate::host::runfiles::RunFiles;
use crate::host::sandbox::{self, Entered};
use crate::host::startup::{self, capabilities_to_keep, signal_name, STOP_SIGNALS};
use crate::protocol::mapper::{Mapper, NoMapper};
use crate::protocol::notify::{Notification, Notifier};
use crate::protocol::server::{Server, ServerOptions, SessionState};
use crate::transport::vhost_user::{BackendChannel, FsBackend, FsBackendConfig};

/// The filesystem served: the host directory, behind the DAX coherence decorator.
type ServedFs = crate::dax::coherent::Coherent<crate::passthrough::PassthroughFs>;

/// The DAX window, whose backend channel is vhost-user's.
type Window = Arc<DaxWindow<Backend>>;

/// Gives the socket file to `group`.
fn chown_socket_group(path: &std::path::Path, group: &str) -> io::Result<()> {
    let cgroup =
        std::ffi::CString::new(group).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `cgroup` is NUL-terminated; the result is only read before any other getgr* call
    // (we are still single-threaded here).
    let gr = unsafe { libc::getgrnam(cgroup.as_ptr()) };
    if gr.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("--socket-group: no group named {group}"),
        ));
    }
    // SAFETY: `gr` is non-null and points to libc's static group entry.
    let gid = unsafe { (*gr).gr_gid };
    std::os::unix::fs::chown(path, None, Some(gid))?;
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o660);
    std::fs::set_permissions(path, mode)
}

/// The listening vhost-user socket: `--fd`, or a fresh socket on `--socket-path` behind its
/// locked pid file (see [`RunFiles`]).
fn listen(cli: &Cli) -> io::Result<(Listener, Option<RunFiles>)> {
    if let Some(fd) = crate::host::holder::inherited(crate::host::holder::HOLDER_ENV)? {
        return Ok((
            Listener::from(std::os::unix::net::UnixListener::from(fd)),
            None,
        ));
    }
    match (&cli.socket_path, cli.fd) {
        (_, Some(fd)) => {
            // SAFETY: the user passed this descriptor to us as a listening socket we now own
            // (virtiofsd's --fd contract); nothing else in this process uses it.
            Ok((unsafe { Listener::from_raw_fd(fd) }, None))
        }
        (Some(path), None) => {
            let mut files = RunFiles::lock(path)?;
            let l = files.listen(|p| match &cli.socket_group {
                Some(g) => chown_socket_group(p, g),
                None => Ok(()),
            })?;
            Ok((Listener::from(l), Some(files)))
        }
        (None, None) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "missing --socket-path",
        )),
    }
}

/// Under a holder: what the server before this one kept comes back (after a crash), and
/// `fs` keeps its own with `link` from now on. Returns the link and the kept session, for
/// the server.
fn take_back(
    link: KeeperLink,
    fs: &crate::passthrough::PassthroughFs,
    window: Option<&DaxWindow<Backend>>,
) -> io::Result<(Arc<KeeperLink>, Option<SessionState>)> {
    let link = Arc::new(link);
    let mut entries = link.fetch()?;
    let session = entries
        .iter()
        .position(|(w, _, _)| *w == crate::protocol::keeper::Kept::Session)
        .and_then(|i| SessionState::from_kept(&entries.swap_remove(i).1));
    if let Some(st) = &session {
        let (dax, entries): (Vec<_>, Vec<_>) =
            entries.into_iter().partition(|(w, _, _)| w.is_dax());
        let (inodes, handles) = fs.restore_kept(st.flags, entries);
        let placed = window.map_or(0, |w| w.restore_kept(dax));
        log::info!("restart: session taken back: {inodes} inode(s), {handles} handle(s), {placed} DAX mapping(s)");
    }
    fs.set_keeper(link.clone());
    if let Some(w) = window {
        w.set_keeper(link.clone())?;
    }
    Ok((link, session))
}

/// The ring-record region a holder (`--restartable`) started this server with.
fn inherited_ring_records() -> io::Result<Option<crate::transport::ring_records::RingRecords>> {
    crate::host::holder::inherited(crate::host::holder::RECORDS_ENV)?
        .map(crate::transport::ring_records::RingRecords::map)
        .transpose()
}

#[derive(Default)]
struct StopState {
    /// The signal that asked us to stop.
    signal: Option<libc::c_int>,
    /// The frontend connection, once there is one.
    conn: Option<vhost_user_backend::ShutdownHandle>,
}

/// SIGTERM, SIGINT and SIGHUP: stop serving and take the clean-exit path.
///
/// The signals are blocked in every thread (this runs before any thread is spawned, and
/// threads inherit the mask) and taken by one thread with `sigwait`. Before a frontend
/// connects, the signal wakes the main thread's wait for a connection; afterwards it shuts
/// the connection down, so the session ends as on a disconnect.
struct Stopper {
    state: Arc<std::sync::Mutex<StopState>>,
    wake: Arc<vmm_sys_util::eventfd::EventFd>,
}

impl Stopper {
    fn install() -> io::Result<Self> {
        let set = sandbox::sigset(&STOP_SIGNALS);
        // SIGUSR1 too: it belongs to the DAX statistics reporter (which takes it with sigwait
        // and is spawned later); no thread may receive it with its default action.
        let mut block = STOP_SIGNALS.to_vec();
        block.push(libc::SIGUSR1);
        let blocked = sandbox::sigset(&block);
        // SAFETY: `blocked` is a valid signal set; this changes only this thread's mask
        // (inherited by every thread spawned from here on).
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &blocked, std::ptr::null_mut()) };
        let wake = Arc::new(vmm_sys_util::eventfd::EventFd::new(libc::EFD_CLOEXEC)?);
        let state = Arc::new(std::sync::Mutex::new(StopState::default()));
        let (st, wk) = (state.clone(), wake.clone());
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || loop {
                let mut sig = 0;
                // SAFETY: `set` is a valid signal set and `sig` a valid output location.
                if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                    continue;
                }
                let mut g = st.lock().unwrap_or_else(|p| p.into_inner());
                if g.signal.is_some() {
                    log::info!("{}: already stopping", signal_name(sig));
                    continue;
                }
                log::info!("{}: stopping", signal_name(sig));
                g.signal = Some(sig);
                if let Some(c) = &g.conn {
                    c.shutdown();
                }
                let _ = wk.write(1);
            })?;
        Ok(Stopper { state, wake })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StopState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until a frontend connects to `listener` (true) or a stop signal came (false).
    fn wait_for_frontend(&self, listener: &Listener) -> io::Result<bool> {
        use std::os::fd::AsRawFd;
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.wake.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: `fds` is an array of two valid pollfds.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if self.lock().signal.is_some() {
                return Ok(false);
            }
            if fds[0].revents != 0 {
                return Ok(true);
            }
        }
    }

    /// Hands over the live connection; shuts it down at once if a signal came meanwhile.
    fn connected(&self, conn: Option<vhost_user_backend::ShutdownHandle>) {
        let mut g = self.lock();
        if g.signal.is_some() {
            if let Some(c) = &conn {
                c.shutdown();
            }
        }
        g.conn = conn;
    }

    fn signal(&self) -> Option<libc::c_int> {
        self.lock().signal
    }
}

/// Runs the vhost-user daemon until the frontend disconnects.
///
/// Start-up order: open-file limit, listening socket, sandbox (a namespace sandbox forks
/// here; the parent only supervises), capabilities, filesystem and vhost-user machinery,
/// seccomp filter, then the frontend is accepted and served.
pub fn run(cli: &Cli) -> io::Result<()> {
    let shared_dir = startup::prepare(cli)?;
    let (_, caps_before, _) = caps::current()?;
    let keep = capabilities_to_keep(cli, caps_before)?;

    let (listener, run_files) = listen(cli)?;
    // Mapped before the sandbox, which keeps no inherited descriptor.
    let records = inherited_ring_records()?;
    let keeper = KeeperLink::inherited()?;
    // Read from /sys, which the sandbox does not have.
    let _ = crate::dax::folio_span();

    let maps = cli
        .user_ns_maps()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let (inside, listener, run_files) =
        enter_sandbox(cli, &shared_dir, &maps, listener, run_files)?;
    // With --uid-map/--gid-map the daemon is (typically) root of its own user namespace: it
    // keeps the capabilities serving needs there (over that namespace only), to switch to
    // the guest's ids and set owners within the mapped ranges.
    let keep = if maps != sandbox::UserNsMaps::default() {
        capabilities_to_keep(cli, caps::current()?.1)?
    } else {
        keep
    };
    let stopper = Stopper::install()?;
    let groups = WatchGroups::open(cli);
    drop_capabilities(cli, keep)?;

    let dax_proc_fd = inside.proc_self_fd.try_clone()?;
    let fs = startup::passthrough_fs(cli, inside, |_| {})?;
    let notifier = cli
        .wants_notify()
        .then(|| Arc::new(Notifier::new(crate::protocol::notify::QUEUE_CAP)));
    if let (Some(n), Some(group)) = (&notifier, groups.notify) {
        fs.watch_host(group, n.clone())?;
    }
    let (window, mapper) = dax_window(cli, dax_proc_fd)?;
    if let (Some(n), Some(w)) = (&notifier, window.clone()) {
        refresh_window_on_host_writes(n, w);
    }
    let fs_wants = fs.init_wants();
    let keeper = keeper
        .map(|link| take_back(link, &fs, window.as_deref()))
        .transpose()?;
    // DAX coherence (shadow write-back, re-placement) wraps the filesystem.
    let fs = crate::dax::coherent::Coherent::new(fs, window.clone().map(|w| w as _));
    let server = Arc::new(Server::new(
        fs,
        Box::new(mapper),
        ServerOptions {
            dax_policy: cli.dax_policy,
            ..Default::default()
        },
    ));
    if let Some((link, session)) = keeper {
        if let Some(st) = session {
            server.import_session(&st, fs_wants)?;
        }
        server.set_keeper(link);
    }
    let backend = fs_backend(cli, server, window.clone(), notifier, records)?;
    {
        let (b, w) = (backend.clone(), window.clone());
        startup::spawn_sigusr1_reporter(move || {
            log::info!("{}", b.server().request_counts());
            if let Some(w) = &w {
                log::info!("{}", w.stats());
            }
        });
    }
    if let Some(w) = &window {
        start_window_threads(w, groups.host);
    }
    serve(
        cli,
        &shared_dir,
        &stopper,
        &backend,
        listener,
        run_files,
        window,
    )
}

/// Enters the sandbox of `cli`. A namespace sandbox forks: the supervising parent waits
/// for the serving child and exits with it (never returns); the child goes on, without
/// the run files' descriptors (the supervisor owns the pid file and removes both files).
fn enter_sandbox(
    cli: &Cli,
    shared_dir: &std::path::Path,
    maps: &sandbox::UserNsMaps,
    listener: Listener,
    mut run_files: Option<RunFiles>,
) -> io::Result<(sandbox::Inside, Listener, Option<RunFiles>)> {
    let inside = match sandbox::enter(cli.sandbox, shared_dir, maps)? {
        Entered::Supervisor(mut sup) => {
            log::debug!("sandbox: serving process {} started", sup.child());
            let exit = sup.wait()?;
            drop(listener);
            drop(run_files);
            exit.exit_process()
        }
        Entered::Serving(inside) => inside,
    };
    if cli.sandbox == sandbox::Sandbox::Namespace {
        // No host descriptor stays open in the sandbox.
        if let Some(f) = run_files.take() {
            f.close_without_removing();
        }
    }
    Ok((inside, listener, run_files))
}

/// The fanotify groups serving needs, made while the capabilities last.
struct WatchGroups {
    /// Host truncates of DAX-mapped files (needs CAP_SYS_ADMIN). A pooled window (the
    /// default) maps no host file, so it has nothing to watch.
    host: Option<crate::dax::host_watch::Group>,
    /// Host changes for the guest (`--notify`).
    notify: Option<std::os::fd::OwnedFd>,
}

impl WatchGroups {
    fn open(cli: &Cli) -> Self {
        let direct = cli.dax_window > 0 && cli.dax_mapping == crate::dax::mode::MapMode::Direct;
        WatchGroups {
            host: direct.then(crate::dax::host_watch::init).flatten(),
            notify: if cli.wants_notify() {
                crate::passthrough::open_watch_group()
            } else {
                None
            },
        }
    }
}

/// Drops every capability but `keep`, and says which remain.
fn drop_capabilities(cli: &Cli, keep: caps::CapSet) -> io::Result<()> {
    caps::drop_to(keep)?;
    let kept = keep.names();
    log::debug!(
        "sandbox {:?}; capabilities kept: {}",
        cli.sandbox,
        if kept.is_empty() {
            "none".to_string()
        } else {
            kept.join(",")
        }
    );
    Ok(())
}

/// The DAX window of `--dax-window` (none for 0) and the mapper the server maps through.
fn dax_window(
    cli: &Cli,
    proc_self_fd: std::os::fd::OwnedFd,
) -> io::Result<(Option<Window>, Arc<dyn Mapper>)> {
    let window: Option<Window> = match cli.dax_window {
        0 => None,
        size => Some(Arc::new(DaxWindow::new(size)?)),
    };
    let mapper: Arc<dyn Mapper> = match &window {
        Some(w) => {
            w.set_copy_mode(cli.dax_copy);
            w.set_map_mode(cli.dax_mapping);
            log::info!("{}", w.describe());
            w.set_proc_self_fd(proc_self_fd);
            w.clone()
        }
        None => Arc::new(NoMapper),
    };
    Ok((window, mapper))
}

/// A host write to a file the window holds (pooled, copied or shadowed bytes) reaches
/// them at once, not at the guest's next sync point of the file.
fn refresh_window_on_host_writes(notifier: &Notifier, w: Window) {
    notifier.set_observer(Box::new(move |note| {
        if let Notification::InvalInode { node, off, .. } = note {
            if *off >= 0 {
                crate::dax::coherent::Coherence::refresh(&*w, *node);
            }
        }
    }));
}

/// The vhost-user backend over `server`, with the window as its backend channel, the
/// migration state and the ring records a holder kept.
fn fs_backend(
    cli: &Cli,
    server: Arc<Server<ServedFs>>,
    window: Option<Window>,
    notify: Option<Arc<Notifier>>,
    records: Option<crate::transport::ring_records::RingRecords>,
) -> io::Result<Arc<FsBackend<ServedFs>>> {
    let channel = window.map(|w| w as Arc<dyn BackendChannel>);
    let cfg = FsBackendConfig {
        tag: cli.tag.clone(),
        request_queues: cli.queues,
        thread_pool_size: cli.thread_pool_size,
        notify,
    };
    let migration = crate::migration::Migration::new(server.state_host(cli.migration_options()));
    let mut backend = FsBackend::new(server, &cfg, channel)?.with_device_state(Arc::new(migration));
    if let Some(records) = records {
        backend = backend.with_ring_records(Arc::new(records));
    }
    Ok(Arc::new(backend))
}

/// The window's own threads: the SIGUSR1 statistics reporter, the periodic write-back of
/// shadow tails (bounds what a SIGKILL can lose of guest stores into them) and the watch
/// of host truncates.
fn start_window_threads(w: &Window, host: Option<crate::dax::host_watch::Group>) {
    w.spawn_writeback(crate::dax::WRITEBACK_PERIOD);
    if let Some(group) = host {
        w.watch_host(group);
    }
}

/// Installs seccomp, waits for the frontend and serves it until it disconnects or a stop
/// signal comes; then ends the session cleanly.
fn serve(
    cli: &Cli,
    shared_dir: &std::path::Path,
    stopper: &Stopper,
    backend: &Arc<FsBackend<ServedFs>>,
    mut listener: Listener,
    run_files: Option<RunFiles>,
    window: Option<Window>,
) -> io::Result<()> {
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let mut daemon = VhostUserDaemon::new("daxfsd".to_string(), backend.clone(), mem)
        .map_err(|e| io::Error::other(format!("cannot create the vhost-user daemon: {e}")))?;
    startup::install_seccomp(cli.seccomp, &[])?;
    log::info!(
        "daxfsd {} serving {} (tag {:?}, {} request queue(s), cache {:?}, DAX window {} bytes, sandbox {:?}, seccomp {:?}); waiting for the frontend",
        crate::host::cli::VERSION,
        shared_dir.display(),
        cli.tag,
        cli.queues,
        cli.cache,
        cli.dax_window,
        cli.sandbox,
        cli.seccomp,
    );
    // Kata's runtime-rs waits for this exact line on stderr.
    eprintln!("Waiting for vhost-user socket connection...");
    if !stopper.wait_for_frontend(&listener)? {
        log::info!("stopped before a frontend connected");
        drop(run_files);
        return Ok(());
    }
    if let Some((fd, event)) = backend.notify_wake() {
        // Notifications are delivered on the thread serving the hiprio queue.
        if let Some(h) = daemon.get_epoll_handlers().first() {
            h.register_listener(fd, vmm_sys_util::epoll::EventSet::IN, event)
                .map_err(|e| io::Error::other(format!("notification wake-up: {e}")))?;
        }
    }
    daemon
        .start(&mut listener)
        .map_err(|e| io::Error::other(format!("vhost-user connection failed: {e}")))?;
    stopper.connected(daemon.shutdown_handle());
    log::info!("frontend connected");
    let result = session_end(stopper, daemon.wait());
    for handler in daemon.get_epoll_handlers() {
        handler.send_exit_event();
    }
    if let Some(w) = &window {
        // Write shadow tails back before the process goes.
        w.reset();
    }
    backend.server().reset();
    log::info!("{}", backend.server().request_counts());
    if let Some(w) = &window {
        log::info!("{}", w.stats());
    }
    if let Some(sig) = stopper.signal() {
        log::info!("{}: session ended cleanly, exiting", signal_name(sig));
    }
    drop(run_files);
    result
}

/// How the session ended, as `run`'s result: a stop signal or the frontend's disconnect is
/// a clean end.
fn session_end(stopper: &Stopper, waited: vhost_user_backend::Result<()>) -> io::Result<()> {
    match waited {
        _ if stopper.signal().is_some() => Ok(()),
        Ok(())
        | Err(vhost_user_backend::Error::HandleRequest(
            vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
        )) => {
            log::info!("frontend disconnected, exiting");
            Ok(())
        }
        Err(e) => Err(io::Error::other(format!(
            "vhost-user session ended with an error: {e}"
        ))),
    }
}
