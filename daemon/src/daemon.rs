//! Wires the layers together and runs one vhost-user session.

use std::io;
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStringExt;
use std::sync::Arc;

use vhost::vhost_user::{Backend, Listener};
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::caps::{self, CapSet};
use crate::cli::{CachePolicy, Cli, LogLevel, Seccomp};
use crate::dax::DaxWindow;
use crate::mapper::{Mapper, NoMapper};
use crate::passthrough::{self, PassthroughFs};
use crate::sandbox::{self, Entered};
use crate::seccomp;
use crate::server::{Server, ServerOptions};
use crate::vhost_user::{BackendChannel, FsBackend, FsBackendConfig};

/// Sets up logging to stderr at the chosen level.
pub fn init_logging(level: LogLevel) {
    let filter = match level {
        LogLevel::Error => log::LevelFilter::Error,
        LogLevel::Warn => log::LevelFilter::Warn,
        LogLevel::Info => log::LevelFilter::Info,
        LogLevel::Debug => log::LevelFilter::Debug,
        LogLevel::Trace => log::LevelFilter::Trace,
        LogLevel::Off => log::LevelFilter::Off,
    };
    env_logger::Builder::new()
        .filter_level(filter)
        .format_timestamp_millis()
        .target(env_logger::Target::Stderr)
        .init();
}

fn passthrough_config(cli: &Cli) -> io::Result<passthrough::Config> {
    let root_dir = cli
        .shared_dir
        .clone()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "missing --shared-dir"))?;
    Ok(passthrough::Config {
        root_dir,
        cache: match cli.cache {
            CachePolicy::Never => passthrough::CachePolicy::Never,
            CachePolicy::Auto => passthrough::CachePolicy::Auto,
            CachePolicy::Always => passthrough::CachePolicy::Always,
            CachePolicy::Metadata => passthrough::CachePolicy::Metadata,
        },
        writeback: cli.writeback,
        xattr: cli.xattr,
        readonly: cli.readonly,
        allow_direct_io: cli.allow_direct_io,
        allow_mmap: cli.allow_mmap,
        readdirplus: !cli.no_readdirplus,
        announce_submounts: cli.announce_submounts,
        killpriv_v2: cli.killpriv_v2,
    })
}

/// Sets RLIMIT_NOFILE to `want` (0: leave it), by default min(1000000, fs.nr_open) like
/// virtiofsd.
fn raise_nofile(want: Option<u64>) -> io::Result<()> {
    let target = match want {
        Some(0) => return Ok(()),
        Some(n) => n,
        None => std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(1_000_000)
            .min(1_000_000),
    };
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let new = libc::rlimit {
        rlim_cur: target,
        rlim_max: lim.rlim_max.max(target),
    };
    // SAFETY: `new` is a valid rlimit struct; the kernel only reads it.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if want.is_none() && lim.rlim_cur < lim.rlim_max {
        // No CAP_SYS_RESOURCE to go past the hard limit: take what the hard limit allows.
        let within = libc::rlimit {
            rlim_cur: lim.rlim_max.min(target),
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &within) } == 0 {
            log::debug!("RLIMIT_NOFILE raised to the hard limit {}", within.rlim_cur);
            return Ok(());
        }
    }
    if want.is_none() && lim.rlim_cur >= lim.rlim_max.min(target) {
        log::debug!(
            "RLIMIT_NOFILE stays at {} ({e} raising it to {target})",
            lim.rlim_cur
        );
        return Ok(());
    }
    Err(io::Error::new(
        e.kind(),
        format!("cannot set RLIMIT_NOFILE to {target}: {e}"),
    ))
}

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

/// Blocks SIGUSR1 (so every thread inherits the mask) and logs `report()` whenever it arrives.
fn spawn_sigusr1_reporter(report: impl Fn() + Send + 'static) {
    // SAFETY: `set` is a valid sigset_t, initialised by sigemptyset before use; the calls only
    // change this thread's signal mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let spawned = std::thread::Builder::new()
        .name("sigusr1".into())
        .spawn(move || loop {
            let mut sig = 0;
            // SAFETY: `set` is a valid signal set and `sig` a valid output location.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 && sig == libc::SIGUSR1 {
                report();
            }
        });
    if let Err(e) = spawned {
        log::warn!("no SIGUSR1 reporter: {e}");
    }
}

/// The socket file `--socket-path` created, removed on drop by a process that still sees it.
struct SocketFile(Option<std::path::PathBuf>);

impl SocketFile {
    /// This process no longer sees the host's file system: the path would name something
    /// else (possibly a guest file inside the share), so never touch it.
    fn forget(&mut self) {
        self.0 = None;
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let Some(p) = self.0.take() else { return };
        let Ok(c) = std::ffi::CString::new(p.into_os_string().into_vec()) else {
            return;
        };
        // unlinkat rather than unlink (std::fs::remove_file): the seccomp allow-list has
        // only the former.
        // SAFETY: `c` is NUL-terminated; AT_FDCWD resolves it like unlink would.
        unsafe { libc::unlinkat(libc::AT_FDCWD, c.as_ptr(), 0) };
    }
}

/// The listening vhost-user socket: `--fd`, or a fresh socket on `--socket-path` (a stale
/// file there is replaced).
fn listen(cli: &Cli) -> io::Result<(Listener, SocketFile)> {
    match (&cli.socket_path, cli.fd) {
        (_, Some(fd)) => {
            // SAFETY: the user passed this descriptor to us as a listening socket we now own
            // (virtiofsd's --fd contract); nothing else in this process uses it.
            Ok((unsafe { Listener::from_raw_fd(fd) }, SocketFile(None)))
        }
        (Some(path), None) => {
            let _ = std::fs::remove_file(path);
            let l = std::os::unix::net::UnixListener::bind(path).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot listen on {}: {e}", path.display()),
                )
            })?;
            let file = SocketFile(Some(path.clone()));
            if let Some(g) = &cli.socket_group {
                chown_socket_group(path, g)?;
            }
            // A Listener made from a UnixListener does not remove the path when dropped:
            // SocketFile does, only where the path still means the host's file.
            Ok((Listener::from(l), file))
        }
        (None, None) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "missing --socket-path",
        )),
    }
}

/// The capabilities to keep: virtiofsd's set changed by `--modcaps`, limited to what the
/// process had before the sandbox (nothing, for a non-root daemon in its user namespace).
fn capabilities_to_keep(cli: &Cli, had: CapSet) -> io::Result<CapSet> {
    let want = match &cli.modcaps {
        Some(spec) => CapSet::daemon_default()
            .modify(spec)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
        None => CapSet::daemon_default(),
    };
    Ok(CapSet(want.0 & had.0))
}

/// Runs the daemon until the frontend disconnects.
///
/// Start-up order: open-file limit, listening socket, sandbox (a namespace sandbox forks
/// here; the parent only supervises), capabilities, filesystem and vhost-user machinery,
/// seccomp filter, then the frontend is accepted and served.
pub fn run(cli: &Cli) -> io::Result<()> {
    match raise_nofile(cli.rlimit_nofile) {
        Err(e) if cli.rlimit_nofile.is_none() => log::warn!("{e}; keeping the current limit"),
        r => r?,
    }
    let shared_dir = cli
        .shared_dir
        .clone()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "missing --shared-dir"))?;
    let (_, caps_before, _) = caps::current()?;
    let keep = capabilities_to_keep(cli, caps_before)?;

    let (mut listener, mut socket_file) = listen(cli)?;

    let inside = match sandbox::enter(cli.sandbox, &shared_dir)? {
        Entered::Supervisor(mut sup) => {
            log::debug!("sandbox: serving process {} started", sup.child());
            let exit = sup.wait()?;
            drop(listener);
            drop(socket_file);
            exit.exit_process()
        }
        Entered::Serving(inside) => inside,
    };
    if !inside.sees_host {
        socket_file.forget();
    }
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

    let mut cfg = passthrough_config(cli)?;
    cfg.root_dir = inside.shared_dir.clone();
    let dax_proc_fd = inside.proc_self_fd.try_clone()?;
    let fs = PassthroughFs::with_proc_self_fd(cfg, inside.proc_self_fd)?;

    let window: Option<Arc<DaxWindow<Backend>>> = match cli.dax_window {
        0 => None,
        size => Some(Arc::new(DaxWindow::new(size)?)),
    };
    let mapper: Arc<dyn Mapper> = match &window {
        Some(w) => {
            log::info!("{}", w.describe());
            w.set_proc_self_fd(dax_proc_fd);
            w.clone()
        }
        None => Arc::new(NoMapper),
    };
    // DAX coherence (shadow write-back, re-placement) wraps the filesystem.
    let fs = crate::dax::coherent::Coherent::new(fs, mapper.clone());
    let server = Arc::new(Server::new(
        fs,
        Box::new(mapper),
        ServerOptions {
            dax_policy: cli.dax_policy,
            ..Default::default()
        },
    ));
    let channel = window.clone().map(|w| w as Arc<dyn BackendChannel>);
    let cfg = FsBackendConfig {
        tag: cli.tag.clone(),
        request_queues: cli.queues,
        thread_pool_size: cli.thread_pool_size,
    };
    let migration = crate::migration::Migration::new(server.clone(), cli.migration_options());
    let backend =
        Arc::new(FsBackend::new(server, &cfg, channel)?.with_device_state(Arc::new(migration)));

    if let Some(w) = window.clone() {
        spawn_sigusr1_reporter(move || log::info!("{}", w.stats()));
    }
    if let Some(w) = &window {
        // Bounds what a SIGKILL can lose of guest stores into shadow tails.
        w.spawn_writeback(crate::dax::WRITEBACK_PERIOD);
    }

    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let mut daemon = VhostUserDaemon::new("daxfsd".to_string(), backend.clone(), mem)
        .map_err(|e| io::Error::other(format!("cannot create the vhost-user daemon: {e}")))?;
    match cli.seccomp {
        Seccomp::None => {}
        Seccomp::Kill => seccomp::install(seccomp::Action::Kill)?,
        Seccomp::Log => seccomp::install(seccomp::Action::Log)?,
        Seccomp::Trap => seccomp::install(seccomp::Action::Trap)?,
    }
    log::info!(
        "serving {} (tag {:?}, {} request queue(s), cache {:?}, DAX window {} bytes, sandbox {:?}, seccomp {:?}); waiting for the frontend",
        shared_dir.display(),
        cli.tag,
        cli.queues,
        cli.cache,
        cli.dax_window,
        cli.sandbox,
        cli.seccomp,
    );
    daemon
        .start(&mut listener)
        .map_err(|e| io::Error::other(format!("vhost-user connection failed: {e}")))?;
    log::info!("frontend connected");
    let result = match daemon.wait() {
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
    };
    for handler in daemon.get_epoll_handlers() {
        handler.send_exit_event();
    }
    if let Some(w) = &window {
        // Write shadow tails back before the process goes.
        w.stop();
    }
    backend.server().reset();
    if let Some(w) = &window {
        log::info!("{}", w.stats());
    }
    drop(socket_file);
    result
}
