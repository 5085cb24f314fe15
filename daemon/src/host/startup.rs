//! The start-up both modes share, the vhost-user daemon ([`super::daemon`]) and the
//! /dev/fuse mount ([`super::mount`]): from the parsed command line to logging, the
//! open-file limit and the shared directory, the capabilities to keep, the stop signals,
//! the file system on the shared directory as the sandbox shows it, and the seccomp filter.
//! Each mode calls these in its own order (a mount must exist before the sandbox, a socket
//! must listen before it); the two modes never call each other.

use std::io;

use crate::host::caps::{self, CapSet};
use crate::host::cli::{CachePolicy, Cli, LogLevel, Seccomp};
use crate::host::sandbox;
use crate::host::seccomp;
use crate::passthrough::{self, PassthroughFs};

/// The signals that stop either mode cleanly.
pub const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// Sets up logging at the chosen level: to the system log with `syslog` (where there is
/// one; else one warning line and stderr), or to stderr. As in virtiofsd, `RUST_LOG`, when
/// set, overrides the level of the stderr log.
pub fn init_logging(level: LogLevel, syslog: bool) {
    let filter = match level {
        LogLevel::Error => log::LevelFilter::Error,
        LogLevel::Warn => log::LevelFilter::Warn,
        LogLevel::Info => log::LevelFilter::Info,
        LogLevel::Debug => log::LevelFilter::Debug,
        LogLevel::Trace => log::LevelFilter::Trace,
        LogLevel::Off => log::LevelFilter::Off,
    };
    let mut syslog_error = None;
    if syslog {
        match crate::host::syslog::SyslogLogger::connect(std::path::Path::new("/dev/log")) {
            Ok(l) => {
                if log::set_boxed_logger(Box::new(l)).is_ok() {
                    log::set_max_level(filter);
                    return;
                }
            }
            Err(e) => syslog_error = Some(e),
        }
    }
    let mut b = env_logger::Builder::new();
    b.filter_level(filter)
        .format_timestamp_millis()
        .target(env_logger::Target::Stderr);
    if let Ok(spec) = std::env::var("RUST_LOG") {
        b.parse_filters(&spec);
    }
    b.init();
    if let Some(e) = syslog_error {
        log::warn!("--syslog: no system log at /dev/log ({e}); logging to stderr");
    }
}

/// The capabilities to keep: virtiofsd's set changed by `--modcaps`, limited to what the
/// process had before the sandbox (nothing, for a non-root daemon in its user namespace).
pub fn capabilities_to_keep(cli: &Cli, had: CapSet) -> io::Result<CapSet> {
    let mut base = CapSet::daemon_default();
    if cli.inode_file_handles != crate::host::cli::InodeFileHandles::Never {
        // Opening file handles needs CAP_DAC_READ_SEARCH (virtiofsd adds it the same way;
        // `--modcaps=-dac_read_search` removes it again and `prefer` then keeps descriptors).
        base = CapSet(base.0 | (1u64 << caps::CAP_DAC_READ_SEARCH));
    }
    if cli.inode_flags {
        // Setting or clearing the immutable and append-only flags on the host needs it.
        base = CapSet(base.0 | (1u64 << caps::CAP_LINUX_IMMUTABLE));
    }
    let want = match &cli.modcaps {
        Some(spec) => base
            .modify(spec)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
        None => base,
    };
    Ok(CapSet(want.0 & had.0))
}

/// What both modes do first: the descriptor limit (a failure to raise it is only a warning
/// when the user did not ask for a limit) and the shared directory.
pub fn prepare(cli: &Cli) -> io::Result<std::path::PathBuf> {
    match raise_nofile(cli.rlimit_nofile) {
        Err(e) if cli.rlimit_nofile.is_none() => log::warn!("{e}; keeping the current limit"),
        r => r?,
    }
    cli.shared_dir
        .clone()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "missing --shared-dir"))
}

/// Sets RLIMIT_NOFILE to `want` (0: leave it), by default min(1000000, fs.nr_open) like
/// virtiofsd.
pub(crate) fn raise_nofile(want: Option<u64>) -> io::Result<()> {
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

/// The passthrough file system's configuration from the command line.
pub fn passthrough_config(cli: &Cli) -> io::Result<passthrough::Config> {
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
            CachePolicy::Coherent => passthrough::CachePolicy::Coherent,
        },
        writeback: cli.writeback,
        xattr: cli.xattr,
        readonly: cli.readonly,
        allow_direct_io: cli.allow_direct_io,
        allow_mmap: cli.allow_mmap,
        readdirplus: !cli.no_readdirplus,
        announce_submounts: cli.announce_submounts,
        killpriv_v2: cli.killpriv_v2,
        posix_lock: cli.posix_lock,
        posix_acl: cli.posix_acl != crate::host::cli::Negotiation::Never,
        security_label: cli.security_label != crate::host::cli::Negotiation::Never,
        flock: cli.flock,
        preserve_noatime: cli.preserve_noatime,
        xattrmap: match &cli.xattrmap {
            Some(spec) => Some(
                passthrough::xattrmap::XattrMap::parse(spec)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
            ),
            None => None,
        },
        uid_map: passthrough::idmap::IdMap::parse("--translate-uid", &cli.translate_uid)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
        gid_map: passthrough::idmap::IdMap::parse("--translate-gid", &cli.translate_gid)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
        inode_file_handles: match cli.inode_file_handles {
            crate::host::cli::InodeFileHandles::Never => passthrough::FileHandleMode::Never,
            crate::host::cli::InodeFileHandles::Prefer => passthrough::FileHandleMode::Prefer,
            crate::host::cli::InodeFileHandles::Mandatory => passthrough::FileHandleMode::Mandatory,
        },
        inode_flags: cli.inode_flags,
    })
}

/// The passthrough file system on the shared directory as the sandbox shows it (`inside`),
/// configured from the command line and then by `adjust` (what one mode changes).
pub fn passthrough_fs(
    cli: &Cli,
    inside: sandbox::Inside,
    adjust: impl FnOnce(&mut passthrough::Config),
) -> io::Result<PassthroughFs> {
    let mut cfg = passthrough_config(cli)?;
    cfg.root_dir = inside.shared_dir.clone();
    adjust(&mut cfg);
    PassthroughFs::with_proc_self_fd(cfg, inside.proc_self_fd)
}

/// `--seccomp`: installs the filter on every thread, allowing `extra` calls too.
pub fn install_seccomp(mode: Seccomp, extra: &[(&str, libc::c_long)]) -> io::Result<()> {
    match mode {
        Seccomp::None => Ok(()),
        Seccomp::Kill => seccomp::install_with(seccomp::Action::Kill, extra),
        Seccomp::Log => seccomp::install_with(seccomp::Action::Log, extra),
        Seccomp::Trap => seccomp::install_with(seccomp::Action::Trap, extra),
    }
}

/// Blocks SIGUSR1 (so every thread inherits the mask) and logs `report()` whenever it arrives.
pub fn spawn_sigusr1_reporter(report: impl Fn() + Send + 'static) {
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

/// The name a stop signal is logged by.
pub fn signal_name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}
