//! Command line: virtiofsd 1.14's options with the same meaning, plus daxfsd's own.
//!
//! `-o` takes exactly the keys virtiofsd 1.14 takes (and rejects what it rejects), plus
//! `flock` and `posix_lock`, which the C virtiofsd accepted and daxfsd gives the same
//! meaning (remote locks, off by default). Every virtiofsd 1.14 option is implemented.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

/// `--sandbox`: defined with the sandbox it chooses.
pub use crate::host::sandbox::Sandbox;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CachePolicy {
    /// No guest caching of data or metadata.
    Never,
    /// Cache for one second.
    Auto,
    /// Cache until changed through the guest.
    Always,
    /// Cache metadata only.
    Metadata,
    /// Cache as `always` while the guest takes host-change notifications (implies
    /// --notify), as `auto` when it does not.
    Coherent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Seccomp {
    /// No system call filter.
    None,
    /// Kill the daemon (the kernel log names the call).
    Kill,
    /// Let the call run and log it to the kernel log (dmesg: `type=1326 ... syscall=NR`).
    Log,
    /// Raise SIGSYS: the daemon writes the call's number to stderr and exits with status 159.
    Trap,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "lower")]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Negotiation {
    Never,
    Auto,
    Always,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MigrationModeArg {
    /// Send each inode's path inside the shared directory.
    FindPaths,
    /// Send each inode's file handle.
    FileHandles,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MigrationOnErrorArg {
    /// Refuse the state: the migration fails, the source guest runs on.
    Abort,
    /// Accept the state; inodes that could not be restored return errors to the guest.
    GuestError,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InodeFileHandles {
    Never,
    /// `fallback` is virtiofsd's deprecated alias.
    #[value(alias = "fallback")]
    Prefer,
    Mandatory,
}

/// The version `--version` prints and the log names at start: the package version, and
/// `+ID` when the build's environment had `DAXFSD_BUILD_ID=ID` (to tell two builds apart).
pub const VERSION: &str = env!("DAXFSD_VERSION");

/// daxfsd: vhost-user virtio-fs daemon with a working DAX window.
///
/// Serves --shared-dir to one virtio-fs device over the vhost-user socket --socket-path
/// (or an inherited listening socket --fd), for QEMU's `-device vhost-user-fs-pci` or, with
/// --dax-window, the device with a DAX cache window. Exits when the frontend disconnects,
/// or cleanly (exit status 0) on SIGTERM, SIGINT or SIGHUP. With --socket-path, the pid
/// file `<socket-path>.pid` is created and locked before the socket listens (a second
/// daemon on the same path fails) and removed at exit. Accepts virtiofsd's options with the
/// same meaning.
#[derive(Debug, Parser)]
#[command(
    name = "daxfsd",
    version = VERSION,
    about,
    long_about = None,
    max_term_width = 100,
    args_override_self = true
)]
pub struct Cli {
    /// Directory to share with the guest.
    #[arg(long, value_name = "DIR")]
    pub shared_dir: Option<PathBuf>,

    /// Tag the device advertises in its config space (what the guest passes to `mount -t
    /// virtiofs TAG`). Setting it offers VHOST_USER_PROTOCOL_F_CONFIG, which the DAX device
    /// (`vhost-user-test-device-pci`) needs; QEMU 7.1 to 8.0 crash on that feature, and
    /// `vhost-user-fs-pci` takes the tag from its own `tag=` property, so leave it unset there.
    #[arg(long, value_name = "TAG")]
    pub tag: Option<String>,

    /// vhost-user socket to listen on (created; the socket file of a daemon that is gone is
    /// replaced, a live daemon's is not). `--socket` is virtiofsd's deprecated spelling.
    #[arg(long, alias = "socket", value_name = "PATH")]
    pub socket_path: Option<PathBuf>,

    /// Group that owns the vhost-user socket.
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,

    /// Inherited file descriptor of a listening (not yet connected) UNIX socket.
    #[arg(long, value_name = "FD", conflicts_with = "socket_path")]
    pub fd: Option<i32>,

    /// Keep QEMU's connection and the session's descriptors in a small holder process and
    /// serve files in a child that is started again when it dies, and upgraded under a
    /// running guest by `kill -USR2 HOLDER` (the pid in the pid file) to the binary now
    /// installed at the path the holder was started from. Not with a DAX window yet. See
    /// docs/restart.md.
    #[arg(long, conflicts_with = "mount")]
    pub restartable: bool,

    /// Serve the shared directory on this host directory through /dev/fuse instead of to a
    /// VM (mount(2) as root; `fusermount3` for other users). Unmounted on SIGTERM, SIGINT
    /// and SIGHUP. Excludes --socket-path and --fd.
    #[arg(long, value_name = "MOUNTPOINT")]
    pub mount: Option<PathBuf>,

    /// With --mount: FUSE passthrough (the kernel reads and writes the host file itself):
    /// auto (where the kernel has it), off, or size:N (only files of at least N bytes, with
    /// an optional k/m/g suffix).
    #[arg(long, value_name = "POLICY", default_value = "auto", value_parser = parse_passthrough)]
    pub passthrough: PassthroughPolicy,

    /// With --mount: take requests over FUSE-over-io-uring (per-CPU ring queues) instead of
    /// read(2) on /dev/fuse: auto (when the kernel offers it: Linux 6.14+ with
    /// `fuse.enable_uring=Y`), on (fail when it cannot), or off.
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = parse_io_uring)]
    pub io_uring: IoUringMode,

    /// Maximum thread pool size. A value of "0" disables the pool (each request queue is
    /// served on its own thread); so does "1" with one request queue (one request at a
    /// time either way, without a hand-off). With --mount: the number of threads reading
    /// /dev/fuse (0 = the default, 4).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub thread_pool_size: usize,

    /// Number of request queues the device offers (each gets a worker thread).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub queues: usize,

    /// Caching: never (no guest cache, DAX still possible), auto (1 s timeouts), always
    /// (cache until changed through the guest), metadata (cache metadata only), coherent
    /// (`always` while host changes are reported to the guest, see --notify; else `auto`).
    #[arg(long, value_enum, default_value = "auto")]
    pub cache: CachePolicy,

    /// Report host changes to the guest over the virtio-fs notification queue
    /// (VIRTIO_FS_F_NOTIFICATION): its caches are invalidated and its inotify watchers see
    /// host creates, writes, attribute changes, renames and deletes. Adds one virtqueue: with
    /// QEMU's vhost-user-test-device-pci set num_vqs=2+queues and config_size=44.
    /// vhost-user-fs-pci cannot offer the feature; guests without support never negotiate it.
    #[arg(long)]
    pub notify: bool,

    /// Enable the guest's writeback cache (FUSE_WRITEBACK_CACHE).
    #[arg(long)]
    pub writeback: bool,

    /// Honour O_DIRECT opens from the guest.
    #[arg(long)]
    pub allow_direct_io: bool,

    /// Allow shared mmap in the guest even with --cache never (FUSE_DIRECT_IO_ALLOW_MMAP).
    #[arg(long)]
    pub allow_mmap: bool,

    /// Disable READDIRPLUS (directory listings without attributes).
    #[arg(long)]
    pub no_readdirplus: bool,

    /// Enable extended attributes.
    #[arg(long)]
    pub xattr: bool,

    /// POSIX ACLs (`system.posix_acl_*`, default ACLs inherited on create; implies --xattr):
    /// never (the default); auto and always both offer them to the guest.
    #[arg(long, value_enum, value_name = "MODE", num_args = 0..=1, require_equals = true, default_missing_value = "always", default_value = "never")]
    pub posix_acl: Negotiation,

    /// Serve the share read-only: every modifying request fails with EROFS.
    #[arg(long)]
    pub readonly: bool,

    /// Tell the guest which directories are mount points (the default).
    #[arg(long)]
    pub announce_submounts: bool,

    /// Do not tell the guest which directories are mount points.
    #[arg(long, overrides_with = "announce_submounts")]
    pub no_announce_submounts: bool,

    /// When to reference inodes by file handles instead of O_PATH fds (far fewer open fds
    /// on large trees; needs CAP_DAC_READ_SEARCH, kept for it): never; prefer (handles where
    /// the file system makes them, fds elsewhere, fds for all when handles do not work at
    /// start); mandatory (handles only: start fails when they do not work).
    #[arg(long, value_enum, value_name = "MODE", num_args = 0..=1, require_equals = true, default_missing_value = "prefer", default_value = "prefer")]
    pub inode_file_handles: InodeFileHandles,

    /// Confine the daemon to the shared directory. The vhost-user socket is created first,
    /// outside the sandbox; capabilities are then dropped to those serving files needs.
    #[arg(long, value_enum, default_value = "namespace")]
    pub sandbox: Sandbox,

    /// Action on a system call outside the daemon's allow-list (installed on every thread
    /// once start-up is over, before the frontend is served).
    #[arg(long, value_enum, default_value = "kill")]
    pub seccomp: Seccomp,

    /// Open-file limit (RLIMIT_NOFILE); 0 leaves it unchanged
    /// [default: min(1000000, /proc/sys/fs/nr_open)].
    #[arg(long, value_name = "N")]
    pub rlimit_nofile: Option<u64>,

    /// Log level.
    #[arg(long, value_enum, ignore_case = true, default_value = "info")]
    pub log_level: LogLevel,

    /// Log to the system log (/dev/log) instead of stderr. Without a system log the daemon
    /// says so once and logs to stderr.
    #[arg(long)]
    pub syslog: bool,

    /// Print the vhost-user backend capabilities as JSON and exit.
    #[arg(long)]
    pub print_capabilities: bool,

    /// Size of the DAX cache window: a power of two of at least 2M (e.g. 1G, 512M; 0 = no
    /// window). Needs a frontend with vhost-user SHMEM support (QEMU >= 11.1); guests mount
    /// with `-o dax=always`.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "0")]
    pub dax_window: u64,

    /// Which files the guest maps through the window on `dax=inode` mounts (the guest's
    /// default): `always` (every regular file), `never`, or `size:N` (files of at least N
    /// bytes, e.g. size:1M). `-o dax=always` mounts map every file regardless.
    #[arg(long, value_name = "POLICY", value_parser = parse_dax_policy, default_value = "always")]
    pub dax_policy: crate::protocol::server::DaxPolicy,

    /// When read-only DAX mappings are served from copies instead of the file: `auto`
    /// (copies only while the guest recycles more than 32 ranges a second of a window at least
    /// 3/4 full, and for 10 s after that onto the copies it left), `always`,
    /// or `off`. A copy slot is filled with a read of the file into a memfd of at most the
    /// window's size; when the guest drops it, the frontend keeps it mapped and the next
    /// read-only mapping of that window range reuses it, so a window that churns stops
    /// changing QEMU's memory map per miss (1-2 ms each under TCG). The trade-off: a copy is a
    /// point in time. Host changes to the file reach the guest at OPEN, GETATTR, READ, FLUSH,
    /// FSYNC and every 5 s (close-to-open, as without DAX), not at once as through a direct
    /// mapping; writes through the guest's own FUSE requests are in the copy before the
    /// reply, and a writable mapping always maps the file. Use `off` where guests must see
    /// host writes through an existing mmap at once. Ignored without `--dax-window`.
    #[arg(long, value_name = "MODE", default_value = "auto")]
    pub dax_copy: crate::dax::copy::CopyMode,

    /// How guest DAX mappings reach QEMU: `pooled` (default) serves every guest mapping from
    /// a copy of the file range in one memfd that QEMU maps once, so the VM can be paused,
    /// snapshotted or saved at any time; `direct` maps the files themselves (zero-copy: the
    /// host's page cache is shared by the guests, no copy per mapping), but QEMU 11.1.3 can
    /// crash when the VM is paused while the guest maps or unmaps (an upstream bug no daemon
    /// can avoid): use it only for VMs that are never paused, or with a fixed QEMU. Windows
    /// with more guest ranges than QEMU's memory slots allow (1G and up with Linux's 2 MiB
    /// ranges; never with this project's hybrid guest kernel, which maps the window over 128)
    /// are pooled in either mode. Ignored without `--dax-window`.
    #[arg(long, value_name = "MODE", default_value = "pooled")]
    pub dax_mapping: crate::dax::mode::MapMode,

    /// Debug log level (same as --log-level debug).
    #[arg(short = 'd')]
    pub debug: bool,

    /// Stay in the foreground (always the case; accepted for compatibility).
    #[arg(short = 'f')]
    pub foreground: bool,

    /// Options in the legacy format, comma separated, as virtiofsd 1.14 takes them:
    /// source=DIR, cache=auto|always|none|metadata, sandbox=namespace|chroot,
    /// loglevel=debug|info|warn|err, modcaps=CAPS, xattrmap=MAP, xattr, no_xattr,
    /// readdirplus, no_readdirplus, writeback, no_writeback, allow_direct_io,
    /// no_allow_direct_io, announce_submounts, killpriv_v2, no_killpriv_v2, posix_acl,
    /// no_posix_acl, security_label, no_security_label, no_posix_lock, no_flock; and
    /// posix_lock, flock (remote locks, as in the C virtiofsd).
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub compat_options: Vec<String>,

    /// Serve POSIX (fcntl) locks on the host, per guest lock owner. Off by default, as in
    /// virtiofsd: the guest kernel then keeps the locks itself (they are not seen by other
    /// guests or host processes).
    #[arg(long)]
    pub posix_lock: bool,

    /// Serve BSD flock() locks on the host. Off by default, as in virtiofsd.
    #[arg(long)]
    pub flock: bool,

    /// Translate extended attribute names between guest and host, in virtiofsd's rule
    /// language (e.g. `:map::user.virtiofs.:`; implies --xattr). A malformed or
    /// unterminated map is refused at start, quoting the rule.
    #[arg(long, value_name = "MAP")]
    pub xattrmap: Option<String>,

    /// Change the capabilities kept after start-up (default: chown, dac_override, fowner,
    /// fsetid, setgid, setuid, mknod, setfcap): `+name` adds, `-name` removes, separated by
    /// `:`, e.g. `--modcaps=+sys_admin:-mknod` (sys_admin: trusted.* xattrs).
    #[arg(long, value_name = "CAPS")]
    pub modcaps: Option<String>,

    /// Security labels (FUSE_SECURITY_CTX: the context the guest sends with each create is
    /// set as that `security.*` xattr on the new file; implies --xattr; setting `security.*`
    /// needs CAP_SYS_ADMIN without a host LSM: `--modcaps=+sys_admin`): never (the default);
    /// auto and always both offer it.
    #[arg(long, value_enum, value_name = "MODE", num_args = 0..=1, require_equals = true, default_missing_value = "always", default_value = "never")]
    pub security_label: Negotiation,

    /// Enable FUSE_HANDLE_KILLPRIV_V2 (the daemon clears suid/sgid on write and truncate).
    #[arg(long, overrides_with = "no_killpriv_v2")]
    pub killpriv_v2: bool,

    /// Disable FUSE_HANDLE_KILLPRIV_V2 (the default).
    #[arg(long)]
    pub no_killpriv_v2: bool,

    /// Let the guest set host inode flags (chattr: FS_IOC_SETFLAGS, FS_IOC_FSSETXATTR), and
    /// keep CAP_LINUX_IMMUTABLE for it. They change the host file for every host user
    /// (`+i`, `+a` bind host root too), so by default only reading them (lsattr) is served
    /// and a set that would change anything fails with EOPNOTSUPP.
    #[arg(long)]
    pub inode_flags: bool,

    /// Pass the guest's O_NOATIME on to the host. By default, as in virtiofsd, it is dropped
    /// (it fails with EPERM on files the daemon does not own without CAP_FOWNER).
    #[arg(long)]
    pub preserve_noatime: bool,

    /// UID map `:inside:outside:count:` for the user namespace of a non-root daemon's
    /// namespace sandbox, set with newuidmap (package uidmap; the ranges must be granted in
    /// /etc/subuid), e.g. `:0:1000:1:` then `:1:100000:65536:`; repeatable. Refused for a
    /// root daemon, as virtiofsd refuses it.
    #[arg(long, value_name = "MAP")]
    pub uid_map: Vec<String>,

    /// GID map, as --uid-map (newgidmap, /etc/subgid).
    #[arg(long, value_name = "MAP")]
    pub gid_map: Vec<String>,

    /// Translate uids between guest and host inside the daemon, as virtiofsd:
    /// `TYPE:A:B:COUNT` with TYPE guest, host, squash-guest, squash-host, map, or
    /// `forbid-guest:ID:COUNT` (repeatable; cannot be combined with --posix-acl).
    #[arg(long, value_name = "MAP")]
    pub translate_uid: Vec<String>,

    /// Same as --translate-uid, for gids.
    #[arg(long, value_name = "MAP")]
    pub translate_gid: Vec<String>,

    /// Live migration (source side): how inodes are named for the destination.
    /// find-paths: their paths inside the shared directory (found through /proc/self/fd at
    /// switch-over); file-handles: file handles (same file system on both sides, and
    /// CAP_DAC_READ_SEARCH on the destination).
    #[arg(long, value_enum, value_name = "MODE", default_value = "find-paths")]
    pub migration_mode: MigrationModeArg,

    /// Live migration (destination side): an inode that cannot be restored either aborts
    /// the migration (abort; the source guest runs on) or returns errors to the guest for
    /// that inode only (guest-error).
    #[arg(long, value_enum, value_name = "POLICY", default_value = "abort")]
    pub migration_on_error: MigrationOnErrorArg,

    /// Live migration, find-paths only: the source sends each inode's file handle too and
    /// the destination checks it opened the very same file (same file system on both sides).
    #[arg(long)]
    pub migration_verify_handles: bool,

    /// Live migration, find-paths only: the source re-checks at switch-over that each path
    /// still names its inode.
    #[arg(long)]
    pub migration_confirm_paths: bool,
}

/// A command-line problem, reported as one line.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Invalid(String),
}

/// Parses sizes such as `4096`, `512K`, `64M`, `1G`, `2GiB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?} (examples: 4096, 512M, 1G)"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// The smallest DAX window: one 2 MiB range, the unit Linux maps.
pub const MIN_DAX_WINDOW: u64 = 2 << 20;

/// `--dax-window` must be a power of two (QEMU 11.1 places the window in a PCI BAR and
/// aborts at start otherwise) and at least [`MIN_DAX_WINDOW`]. The message names the two
/// nearest valid sizes.
pub fn check_dax_window(size: u64) -> Result<(), String> {
    if size >= MIN_DAX_WINDOW && size.is_power_of_two() {
        return Ok(());
    }
    let human = |n: u64| -> String {
        if n >= 1 << 30 && n % (1 << 30) == 0 {
            format!("{}G", n >> 30)
        } else if n % (1 << 20) == 0 {
            format!("{}M", n >> 20)
        } else {
            n.to_string()
        }
    };
    let hint = if size < MIN_DAX_WINDOW {
        format!("the smallest is {}", human(MIN_DAX_WINDOW))
    } else {
        let below = 1u64 << (63 - size.leading_zeros());
        match below.checked_mul(2) {
            Some(above) => format!("use {} or {}", human(below), human(above)),
            None => format!("use {}", human(below)),
        }
    };
    Err(format!(
        "--dax-window {} is not a power of two of at least 2M (QEMU places the window in a PCI BAR): {hint}",
        human(size)
    ))
}

/// Parses `--dax-policy`.
pub fn parse_dax_policy(s: &str) -> Result<crate::protocol::server::DaxPolicy, String> {
    use crate::protocol::server::DaxPolicy;
    match s {
        "always" => Ok(DaxPolicy::Always),
        "never" => Ok(DaxPolicy::Never),
        _ => match s.strip_prefix("size:") {
            Some(n) => parse_size(n).map(DaxPolicy::MinSize),
            None => Err(format!(
                "invalid DAX policy {s:?}: use always, never or size:N (e.g. size:1M)"
            )),
        },
    }
}

/// `--io-uring`: how a host mount takes its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoUringMode {
    /// The rings when the kernel offers them, else read(2).
    #[default]
    Auto,
    /// The rings or a one-line error.
    On,
    /// read(2) on /dev/fuse only.
    Off,
}

fn parse_io_uring(s: &str) -> Result<IoUringMode, String> {
    match s {
        "auto" => Ok(IoUringMode::Auto),
        "on" | "yes" => Ok(IoUringMode::On),
        "off" | "no" => Ok(IoUringMode::Off),
        _ => Err(format!("{s:?}: use auto, on or off")),
    }
}

/// `--passthrough`: which regular files the kernel reads and writes itself on a host mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PassthroughPolicy {
    /// Every regular file, where the kernel supports FUSE passthrough.
    #[default]
    Auto,
    /// None: every READ and WRITE goes through the daemon.
    Off,
    /// Regular files of at least this many bytes when opened.
    MinSize(u64),
}

fn parse_passthrough(s: &str) -> Result<PassthroughPolicy, String> {
    match s {
        "auto" | "on" => Ok(PassthroughPolicy::Auto),
        "off" | "never" => Ok(PassthroughPolicy::Off),
        _ => {
            let Some(n) = s.strip_prefix("size:") else {
                return Err(format!(
                    "{s:?}: use auto, off or size:N (N bytes, k/m/g suffix allowed)"
                ));
            };
            let (digits, mult) = match n.as_bytes().last().map(u8::to_ascii_lowercase) {
                Some(b'k') => (&n[..n.len() - 1], 1u64 << 10),
                Some(b'm') => (&n[..n.len() - 1], 1 << 20),
                Some(b'g') => (&n[..n.len() - 1], 1 << 30),
                _ => (n, 1),
            };
            digits
                .parse::<u64>()
                .ok()
                .and_then(|v| v.checked_mul(mult))
                .map(PassthroughPolicy::MinSize)
                .ok_or_else(|| format!("size:{n}: not a byte count (e.g. size:1m)"))
        }
    }
}

impl Cli {
    /// Whether host changes are reported to the guest (`--notify`, or `--cache=coherent`).
    pub fn wants_notify(&self) -> bool {
        self.notify || self.cache == CachePolicy::Coherent
    }

    /// `--uid-map`/`--gid-map`, parsed.
    pub fn user_ns_maps(&self) -> Result<crate::host::sandbox::UserNsMaps, String> {
        let parse = |opt: &str, v: &[String]| {
            v.iter()
                .map(|m| crate::host::sandbox::IdRange::parse(opt, m))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(crate::host::sandbox::UserNsMaps {
            uid: parse("--uid-map", &self.uid_map)?,
            gid: parse("--gid-map", &self.gid_map)?,
        })
    }

    /// Folds `-o` and `-d` into the long options and rejects what is not implemented.
    pub fn normalize(&mut self) -> Result<(), CliError> {
        for opts in std::mem::take(&mut self.compat_options) {
            for o in opts.split(',') {
                self.apply_compat(o)?;
            }
        }
        if self.debug {
            self.log_level = LogLevel::Debug;
        }

        // Announcing submounts is virtiofsd's default; --announce-submounts only restates it.
        self.announce_submounts = !self.no_announce_submounts;
        // As in virtiofsd: these imply --xattr.
        if self.xattrmap.is_some()
            || self.posix_acl != Negotiation::Never
            || self.security_label != Negotiation::Never
        {
            self.xattr = true;
        }
        if self.posix_acl != Negotiation::Never
            && (!self.translate_uid.is_empty() || !self.translate_gid.is_empty())
        {
            return Err(CliError::Invalid(
                "--translate-uid/--translate-gid cannot be combined with --posix-acl (translating ids would break ACLs); drop one".into(),
            ));
        }
        if (!self.uid_map.is_empty() || !self.gid_map.is_empty())
            && (crate::sys::geteuid() == 0 || self.sandbox != Sandbox::Namespace)
        {
            // virtiofsd 1.14 refuses these the same way: they set up the user namespace of
            // an unprivileged daemon's namespace sandbox (through newuidmap/newgidmap).
            return Err(CliError::Invalid(
                "--uid-map/--gid-map are for a non-root daemon with --sandbox namespace; drop them (a root daemon maps nothing)".into(),
            ));
        }
        if self.inode_file_handles == InodeFileHandles::Mandatory
            && self.modcaps.as_deref().is_some_and(|m| {
                m.split(':').any(|i| {
                    i.eq_ignore_ascii_case("-dac_read_search")
                        || i.eq_ignore_ascii_case("-cap_dac_read_search")
                })
            })
        {
            return Err(CliError::Invalid(
                "--inode-file-handles=mandatory needs CAP_DAC_READ_SEARCH: drop -dac_read_search from --modcaps".into(),
            ));
        }
        self.user_ns_maps().map_err(CliError::Invalid)?;
        crate::passthrough::idmap::IdMap::parse("--translate-uid", &self.translate_uid)
            .map_err(CliError::Invalid)?;
        crate::passthrough::idmap::IdMap::parse("--translate-gid", &self.translate_gid)
            .map_err(CliError::Invalid)?;
        if let Some(spec) = &self.xattrmap {
            crate::passthrough::xattrmap::XattrMap::parse(spec).map_err(CliError::Invalid)?;
        }
        if self.migration_mode == MigrationModeArg::FileHandles {
            for (on, name) in [
                (self.migration_verify_handles, "--migration-verify-handles"),
                (self.migration_confirm_paths, "--migration-confirm-paths"),
            ] {
                if on {
                    return Err(CliError::Invalid(format!(
                        "{name} only applies to --migration-mode=find-paths (file handles need no check); drop one"
                    )));
                }
            }
        }
        if let Some(spec) = &self.modcaps {
            crate::host::caps::CapSet::daemon_default()
                .modify(spec)
                .map_err(CliError::Invalid)?;
        }
        if self.print_capabilities {
            return Ok(());
        }
        let Some(dir) = &self.shared_dir else {
            return Err(CliError::Invalid(
                "missing --shared-dir DIR (the directory to share)".into(),
            ));
        };
        if !dir.is_dir() {
            return Err(CliError::Invalid(format!(
                "--shared-dir {}: not a directory (create it or fix the path)",
                dir.display()
            )));
        }
        if let Some(mp) = &self.mount {
            if self.socket_path.is_some() || self.fd.is_some() {
                return Err(CliError::Invalid(
                    "--mount serves the host, --socket-path/--fd a VM: give only one".into(),
                ));
            }
            if self.dax_window != 0 || self.tag.is_some() {
                return Err(CliError::Invalid(
                    "--dax-window and --tag are for a VM; drop them with --mount".into(),
                ));
            }
            if mp.as_os_str().is_empty() {
                return Err(CliError::Invalid("--mount needs a directory".into()));
            }
        } else if self.passthrough != PassthroughPolicy::Auto {
            return Err(CliError::Invalid(
                "--passthrough only applies to --mount (a VM has no host page cache to pass through); drop it".into(),
            ));
        }
        if self.mount.is_none() && self.io_uring != IoUringMode::Auto {
            return Err(CliError::Invalid(
                "--io-uring only applies to --mount (a VM's requests come over virtqueues); drop it".into(),
            ));
        }
        if self.mount.is_none() && self.socket_path.is_none() && self.fd.is_none() {
            return Err(CliError::Invalid(
                "missing --socket-path PATH (or --fd FD): where QEMU connects (or --mount MOUNTPOINT to serve the host)".into(),
            ));
        }
        if self
            .tag
            .as_ref()
            .is_some_and(|t| t.is_empty() || t.len() > 36)
        {
            return Err(CliError::Invalid("--tag must be 1 to 36 bytes".into()));
        }
        if self.readonly && self.dax_window > 0 {
            // QEMU 11.1 maps every window range shared and writable, so a read-only share
            // cannot hand it a descriptor without giving the guest write access.
            return Err(CliError::Invalid(
                "--dax-window cannot be combined with --readonly (QEMU maps DAX ranges writable); drop one".into(),
            ));
        }
        if self.dax_window != 0 {
            check_dax_window(self.dax_window).map_err(CliError::Invalid)?;
        }
        if self.queues == 0 || self.queues > crate::transport::vhost_user::MAX_REQUEST_QUEUES {
            return Err(CliError::Invalid(format!(
                "--queues must be 1..={}",
                crate::transport::vhost_user::MAX_REQUEST_QUEUES
            )));
        }
        Ok(())
    }

    /// One `-o` item, parsed as virtiofsd 1.14 parses it: `key=value` items split on every
    /// `=` (so a value may not contain one), the value sets fixed, anything else rejected.
    fn apply_compat(&mut self, o: &str) -> Result<(), CliError> {
        let bad_value = |k: &str, v: &str, allowed: &str| {
            CliError::Invalid(format!("invalid value '{v}' for '-o {k}' (use {allowed})"))
        };
        let unknown = || CliError::Invalid(format!("unknown option '-o {o}'"));
        if o.contains('=') {
            let parts: Vec<&str> = o.split('=').collect();
            let [key, v] = parts[..] else {
                return Err(unknown());
            };
            match key {
                "source" => self.shared_dir = Some(PathBuf::from(v)),
                "cache" => {
                    self.cache = match v {
                        "auto" => CachePolicy::Auto,
                        "always" => CachePolicy::Always,
                        "none" => CachePolicy::Never,
                        "metadata" => CachePolicy::Metadata,
                        _ => return Err(bad_value(key, v, "auto, always, none or metadata")),
                    }
                }
                "loglevel" => {
                    self.log_level = match v {
                        "debug" => LogLevel::Debug,
                        "info" => LogLevel::Info,
                        "warn" => LogLevel::Warn,
                        "err" => LogLevel::Error,
                        _ => return Err(bad_value(key, v, "debug, info, warn or err")),
                    }
                }
                "sandbox" => {
                    self.sandbox = match v {
                        "namespace" => Sandbox::Namespace,
                        "chroot" => Sandbox::Chroot,
                        _ => return Err(bad_value(key, v, "namespace or chroot")),
                    }
                }
                "modcaps" => self.modcaps = Some(v.to_string()),
                "xattrmap" => self.xattrmap = Some(v.to_string()),
                _ => return Err(unknown()),
            }
            return Ok(());
        }
        match o {
            "xattr" => self.xattr = true,
            "no_xattr" => self.xattr = false,
            "readdirplus" => self.no_readdirplus = false,
            "no_readdirplus" => self.no_readdirplus = true,
            "writeback" => self.writeback = true,
            "no_writeback" => self.writeback = false,
            "allow_direct_io" => self.allow_direct_io = true,
            "no_allow_direct_io" => self.allow_direct_io = false,
            "announce_submounts" => self.no_announce_submounts = false,
            "killpriv_v2" => self.killpriv_v2 = true,
            "no_killpriv_v2" => self.killpriv_v2 = false,
            "posix_acl" => self.posix_acl = Negotiation::Always,
            "no_posix_acl" => self.posix_acl = Negotiation::Never,
            "security_label" => self.security_label = Negotiation::Always,
            "no_security_label" => self.security_label = Negotiation::Never,
            "posix_lock" => self.posix_lock = true,
            "no_posix_lock" => self.posix_lock = false,
            "flock" => self.flock = true,
            "no_flock" => self.flock = false,
            _ => return Err(unknown()),
        }
        Ok(())
    }

    /// The live-migration options.
    pub fn migration_options(&self) -> crate::passthrough::state::MigrationOptions {
        use crate::passthrough::state::{MigrationMode, MigrationOptions, OnError};
        MigrationOptions {
            mode: match self.migration_mode {
                MigrationModeArg::FindPaths => MigrationMode::FindPaths,
                MigrationModeArg::FileHandles => MigrationMode::FileHandles,
            },
            on_error: match self.migration_on_error {
                MigrationOnErrorArg::Abort => OnError::Abort,
                MigrationOnErrorArg::GuestError => OnError::GuestError,
            },
            verify_handles: self.migration_verify_handles,
            confirm_paths: self.migration_confirm_paths,
        }
    }

    /// `--print-capabilities` output, in virtiofsd's format.
    pub fn capabilities_json() -> String {
        let v = serde_json::json!({
            "type": "fs",
            "features": ["migrate-precopy", "separate-options"]
        });
        serde_json::to_string_pretty(&v).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, String> {
        let mut c = Cli::try_parse_from(std::iter::once("daxfsd").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        c.normalize().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert!(parse_size("1X").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn dax_policies() {
        use crate::protocol::server::DaxPolicy;
        assert_eq!(parse_dax_policy("always"), Ok(DaxPolicy::Always));
        assert_eq!(parse_dax_policy("never"), Ok(DaxPolicy::Never));
        assert_eq!(parse_dax_policy("size:1M"), Ok(DaxPolicy::MinSize(1 << 20)));
        assert!(parse_dax_policy("size:").is_err());
        assert!(parse_dax_policy("*.img").is_err());
    }

    #[test]
    fn virtiofsd_options_parse() {
        let c = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/tmp/s",
            "--tag=fs0",
            "--cache=never",
            "--writeback",
            "--allow-direct-io",
            "--allow-mmap",
            "--no-readdirplus",
            "--xattr",
            "--readonly",
            "--no-announce-submounts",
            "--inode-file-handles=never",
            "--sandbox=none",
            "--seccomp=none",
            "--rlimit-nofile=4096",
            "--log-level=debug",
            "--thread-pool-size=0",
            "--socket-group=root",
            "--no-killpriv-v2",
            "-f",
        ])
        .unwrap();
        assert_eq!(c.cache, CachePolicy::Never);
        assert!(c.writeback && c.xattr && c.readonly && c.no_readdirplus);
        assert!(!c.announce_submounts);
        assert_eq!(c.tag.as_deref(), Some("fs0"));
        assert_eq!(c.rlimit_nofile, Some(4096));
        assert_eq!(c.log_level, LogLevel::Debug);
    }

    #[test]
    fn compat_o_options() {
        let c = parse(&[
            "--socket-path=/tmp/s",
            "-o",
            "source=/tmp,cache=none,xattr,no_readdirplus",
            "-d",
        ])
        .unwrap();
        assert_eq!(c.shared_dir, Some(PathBuf::from("/tmp")));
        assert_eq!(c.cache, CachePolicy::Never);
        assert!(c.xattr && c.no_readdirplus);
        assert_eq!(c.log_level, LogLevel::Debug);
        // What libvirt 9.0 passes.
        let c = parse(&[
            "--fd=3",
            "-o",
            "source=/tmp,cache=always,sandbox=chroot,no_xattr,no_flock,no_posix_lock",
            "--thread-pool-size=16",
        ])
        .unwrap();
        assert_eq!(
            (c.cache, c.sandbox, c.xattr, c.posix_lock, c.flock),
            (CachePolicy::Always, Sandbox::Chroot, false, false, false)
        );
        assert_eq!(c.thread_pool_size, 16);
        // Every key virtiofsd 1.14 takes, and their values.
        let c = parse(&[
            "--socket-path=/tmp/s",
            "-o",
            "source=/tmp,writeback,allow_direct_io,killpriv_v2,readdirplus,loglevel=warn",
            "-o",
            "modcaps=+sys_admin,announce_submounts,no_writeback,no_allow_direct_io",
            "-o",
            "no_killpriv_v2,cache=metadata,sandbox=namespace,posix_lock,flock,xattr",
        ])
        .unwrap();
        assert!(!c.writeback && !c.allow_direct_io && !c.killpriv_v2 && !c.no_readdirplus);
        assert!(c.posix_lock && c.flock && c.xattr && c.announce_submounts);
        assert_eq!(c.log_level, LogLevel::Warn);
        assert_eq!(c.cache, CachePolicy::Metadata);
        assert_eq!(c.modcaps.as_deref(), Some("+sys_admin"));
        for (o, want) in [
            ("loglevel=err", LogLevel::Error),
            ("loglevel=info", LogLevel::Info),
            ("loglevel=debug", LogLevel::Debug),
        ] {
            let c = parse(&["--socket-path=/s", "-o", &format!("source=/tmp,{o}")]).unwrap();
            assert_eq!(c.log_level, want, "{o}");
        }
        // And what virtiofsd 1.14 rejects.
        for bad in [
            "bogus",
            "",
            "readonly",
            "timeout=1",
            "sandbox=none",
            "cache=never",
            "loglevel=error",
            "log_level=debug",
            "source=/a=b",
            "xattr=1",
            "debug",
        ] {
            let e =
                parse(&["--socket-path=/tmp/s", "-o", &format!("source=/tmp,{bad}")]).unwrap_err();
            assert!(e.contains("-o"), "{bad}: {e}");
        }
        let e = parse(&["--socket-path=/tmp/s", "-o", "source=/tmp,"]).unwrap_err();
        assert!(e.contains("-o"), "a trailing comma: {e}");
    }

    #[test]
    fn virtiofsd_spellings_and_overrides() {
        let c = parse(&[
            "--shared-dir=/tmp",
            "--socket=/tmp/s",
            "--log-level=DEBUG",
            "--inode-file-handles=fallback",
            "--killpriv-v2",
            "--no-killpriv-v2",
            "--no-announce-submounts",
            "--announce-submounts",
            "--syslog",
            "--preserve-noatime",
        ])
        .unwrap();
        assert_eq!(c.socket_path, Some(PathBuf::from("/tmp/s")));
        assert_eq!(c.log_level, LogLevel::Debug);
        assert_eq!(c.inode_file_handles, InodeFileHandles::Prefer);
        assert!(!c.killpriv_v2, "the later --no-killpriv-v2 wins");
        assert!(c.announce_submounts, "the later --announce-submounts wins");
        assert!(c.syslog && c.preserve_noatime);
        let c = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/tmp/s",
            "--no-killpriv-v2",
            "--killpriv-v2",
            "--cache=auto",
            "--cache=never",
        ])
        .unwrap();
        assert!(c.killpriv_v2);
        assert_eq!(
            c.cache,
            CachePolicy::Never,
            "repeated options: the last wins"
        );
    }

    #[test]
    fn formerly_unimplemented_options_parse() {
        let c = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/tmp/s",
            "--inode-file-handles=mandatory",
        ])
        .unwrap();
        assert_eq!(c.inode_file_handles, InodeFileHandles::Mandatory);
        let e = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/tmp/s",
            "--inode-file-handles=mandatory",
            "--modcaps=-dac_read_search",
        ])
        .unwrap_err();
        assert!(e.contains("CAP_DAC_READ_SEARCH"), "{e}");
        // Implemented now; as in virtiofsd they imply --xattr.
        for opts in [
            &["--posix-acl"][..],
            &["--security-label"],
            &["-o", "posix_acl,security_label"],
            &["--posix-acl=auto", "--security-label=always"],
        ] {
            let mut args = vec!["--shared-dir=/tmp", "--socket-path=/tmp/s"];
            args.extend_from_slice(opts);
            let c = parse(&args).unwrap();
            assert!(c.xattr, "{opts:?}");
            assert!(
                c.posix_acl != Negotiation::Never || c.security_label != Negotiation::Never,
                "{opts:?}"
            );
        }
        let c = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/tmp/s",
            "-o",
            "posix_acl,no_posix_acl,security_label,no_security_label",
        ])
        .unwrap();
        assert_eq!(
            (c.posix_acl, c.security_label, c.xattr),
            (Negotiation::Never, Negotiation::Never, false)
        );
        // As virtiofsd: uid/gid maps only for a non-root daemon's namespace sandbox.
        let e = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/tmp/s",
            "--sandbox=none",
            "--uid-map=:0:100000:65536:",
        ])
        .unwrap_err();
        assert!(
            e.contains("non-root daemon with --sandbox namespace"),
            "{e}"
        );
        let e = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/tmp/s",
            "--xattrmap=:ok:all::: :prefix:client:hi",
        ])
        .unwrap_err();
        assert!(e.contains("rule 2 \":prefix:client:hi\""), "{e}");
        for ok in [
            "--syslog",
            "--thread-pool-size=4",
            "--preserve-noatime",
            "--xattrmap=:map::user.virtiofs.:",
            "--translate-uid=map:1000:2000:10",
            "--translate-gid=squash-guest:0:100:1",
        ] {
            parse(&["--shared-dir=/tmp", "--socket-path=/tmp/s", ok]).unwrap();
        }
    }

    #[test]
    fn sandbox_seccomp_and_caps_defaults() {
        let c = parse(&["--shared-dir=/tmp", "--socket-path=/tmp/s"]).unwrap();
        assert_eq!(c.sandbox, Sandbox::Namespace);
        assert_eq!(c.seccomp, Seccomp::Kill);
        assert_eq!(c.modcaps, None);
        for (arg, sb, sc) in [
            ("--sandbox=chroot", Sandbox::Chroot, Seccomp::Kill),
            ("--sandbox=none", Sandbox::None, Seccomp::Kill),
            ("--seccomp=log", Sandbox::Namespace, Seccomp::Log),
            ("--seccomp=trap", Sandbox::Namespace, Seccomp::Trap),
            ("--seccomp=none", Sandbox::Namespace, Seccomp::None),
        ] {
            let c = parse(&["--shared-dir=/tmp", "--socket-path=/tmp/s", arg]).unwrap();
            assert_eq!((c.sandbox, c.seccomp), (sb, sc), "{arg}");
        }
        let c = parse(&["--socket-path=/tmp/s", "-o", "source=/tmp,sandbox=chroot"]).unwrap();
        assert_eq!(c.sandbox, Sandbox::Chroot);
        let c = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/tmp/s",
            "--modcaps=+sys_admin:-mknod",
        ])
        .unwrap();
        assert_eq!(c.modcaps.as_deref(), Some("+sys_admin:-mknod"));
        let e = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/tmp/s",
            "--modcaps=+bogus",
        ])
        .unwrap_err();
        assert!(e.contains("unknown capability"), "{e}");
    }

    #[test]
    fn bad_input_names_the_fix() {
        let e = parse(&["--socket-path=/tmp/s"]).unwrap_err();
        assert!(e.contains("--shared-dir"), "{e}");
        let e = parse(&["--shared-dir=/nonexistent/x", "--socket-path=/tmp/s"]).unwrap_err();
        assert!(e.contains("not a directory"), "{e}");
        let e = parse(&["--shared-dir=/tmp"]).unwrap_err();
        assert!(e.contains("--socket-path"), "{e}");
        let e = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--tag=0123456789012345678901234567890123456",
        ])
        .unwrap_err();
        assert!(e.contains("--tag"), "{e}");
    }

    #[test]
    fn dax_window_checks() {
        let e = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--readonly",
            "--dax-window=1G",
        ])
        .unwrap_err();
        assert!(e.contains("--readonly"), "{e}");
        let e = parse(&["--shared-dir=/tmp", "--socket-path=/s", "--dax-window=1000"]).unwrap_err();
        assert!(e.contains("smallest is 2M"), "{e}");
        let e = parse(&["--shared-dir=/tmp", "--socket-path=/s", "--dax-window=768M"]).unwrap_err();
        assert!(
            e.contains("power of two") && e.contains("use 512M or 1G"),
            "{e}"
        );
        let e = parse(&["--shared-dir=/tmp", "--socket-path=/s", "--dax-window=1M"]).unwrap_err();
        assert!(e.contains("smallest is 2M"), "{e}");
        let e = parse(&["--shared-dir=/tmp", "--socket-path=/s", "--dax-window=3G"]).unwrap_err();
        assert!(e.contains("use 2G or 4G"), "{e}");
        assert!(parse(&["--shared-dir=/tmp", "--socket-path=/s", "--dax-window=2M"]).is_ok());
        assert_eq!(
            parse(&["--shared-dir=/tmp", "--socket-path=/s", "--dax-window=64M"])
                .unwrap()
                .dax_window,
            64 << 20
        );
    }

    /// Pooled unless asked: no operator's pause may meet QEMU 11.1.3's SHMEM race.
    #[test]
    fn dax_mapping_is_pooled_unless_asked() {
        use crate::dax::mode::MapMode;
        let base = ["--shared-dir=/tmp", "--socket-path=/s", "--dax-window=64M"];
        assert_eq!(parse(&base).unwrap().dax_mapping, MapMode::Pooled);
        let mut direct = base.to_vec();
        direct.push("--dax-mapping=direct");
        assert_eq!(parse(&direct).unwrap().dax_mapping, MapMode::Direct);
        let mut bad = base.to_vec();
        bad.push("--dax-mapping=zero");
        assert!(parse(&bad).unwrap_err().contains("pooled or direct"));
    }

    #[test]
    fn migration_options() {
        use crate::passthrough::state::{MigrationMode, OnError};
        let c = parse(&["--shared-dir=/tmp", "--socket-path=/s"]).unwrap();
        let o = c.migration_options();
        assert_eq!(
            (o.mode, o.on_error),
            (MigrationMode::FindPaths, OnError::Abort)
        );
        assert!(!o.verify_handles && !o.confirm_paths);
        let c = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--migration-mode=find-paths",
            "--migration-on-error=guest-error",
            "--migration-verify-handles",
            "--migration-confirm-paths",
        ])
        .unwrap();
        let o = c.migration_options();
        assert_eq!(o.on_error, OnError::GuestError);
        assert!(o.verify_handles && o.confirm_paths);
        let c = parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--migration-mode=file-handles",
        ])
        .unwrap();
        assert_eq!(c.migration_options().mode, MigrationMode::FileHandles);
        for opt in ["--migration-verify-handles", "--migration-confirm-paths"] {
            let e = parse(&[
                "--shared-dir=/tmp",
                "--socket-path=/s",
                "--migration-mode=file-handles",
                opt,
            ])
            .unwrap_err();
            assert!(e.contains(opt) && e.contains("find-paths"), "{e}");
        }
        assert!(parse(&[
            "--shared-dir=/tmp",
            "--socket-path=/s",
            "--migration-mode=x"
        ])
        .is_err());
    }

    #[test]
    fn mount_excludes_vm_options_and_passthrough_needs_mount() {
        let c = parse(&["--shared-dir=/tmp", "--mount=/mnt"]).unwrap();
        assert_eq!(c.mount, Some(PathBuf::from("/mnt")));
        assert_eq!(c.passthrough, PassthroughPolicy::Auto);
        for extra in ["--socket-path=/s", "--fd=3"] {
            let e = parse(&["--shared-dir=/tmp", "--mount=/mnt", extra]).unwrap_err();
            assert!(e.contains("give only one"), "{extra}: {e}");
        }
        let e = parse(&["--shared-dir=/tmp", "--mount=/mnt", "--dax-window=2M"]).unwrap_err();
        assert!(e.contains("for a VM"), "{e}");
        let e = parse(&["--shared-dir=/tmp", "--socket-path=/s", "--passthrough=off"]).unwrap_err();
        assert!(e.contains("only applies to --mount"), "{e}");
        let e = parse(&["--shared-dir=/tmp"]).unwrap_err();
        assert!(e.contains("--mount MOUNTPOINT"), "{e}");
    }

    #[test]
    fn passthrough_policies() {
        let p = |v: &str| {
            parse(&[
                "--shared-dir=/tmp",
                "--mount=/mnt",
                &format!("--passthrough={v}"),
            ])
        };
        assert_eq!(p("off").unwrap().passthrough, PassthroughPolicy::Off);
        assert_eq!(p("auto").unwrap().passthrough, PassthroughPolicy::Auto);
        assert_eq!(
            p("size:4096").unwrap().passthrough,
            PassthroughPolicy::MinSize(4096)
        );
        assert_eq!(
            p("size:1m").unwrap().passthrough,
            PassthroughPolicy::MinSize(1 << 20)
        );
        assert_eq!(
            p("size:2G").unwrap().passthrough,
            PassthroughPolicy::MinSize(2 << 30)
        );
        for bad in ["size:", "size:x", "size:99999999999999999999g", "sometimes"] {
            assert!(p(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn capabilities_are_json() {
        let v: serde_json::Value = serde_json::from_str(&Cli::capabilities_json()).unwrap();
        assert_eq!(v["type"], "fs");
        assert!(v["features"].is_array());
        assert!(v["features"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "migrate-precopy"));
    }
}
