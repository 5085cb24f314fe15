//! Spawning a vhost-user-fs backend for a test: upstream virtiofsd or daxfsd (same command
//! line), on a fresh socket in a temporary directory. The child is killed on drop.
//!
//! Which daemon: [`DaemonKind::from_env`] reads `VUFS_DAEMON` (`virtiofsd` (default),
//! `daxfsd`, or a path). Binaries: `$VIRTIOFSD` or the rig's cache
//! (`${DAXFSD_CACHE:-${XDG_CACHE_HOME:-~/.cache}/daxfsd}/virtiofsd-1.14.0/bin/virtiofsd`),
//! and `$DAXFSD` or `${CARGO_TARGET_DIR:-<workspace>/target}/debug/daxfsd`.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// The virtiofsd version the rig installs.
pub const VIRTIOFSD_VERSION: &str = "1.14.0";

/// Which backend to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonKind {
    Virtiofsd,
    Daxfsd,
    Path(PathBuf),
}

fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("DAXFSD_CACHE") {
        return d.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"));
    base.join("daxfsd")
}

impl DaemonKind {
    /// From `VUFS_DAEMON`: unset or `virtiofsd` -> upstream virtiofsd, `daxfsd` -> daxfsd,
    /// anything else is a path to a binary with the same command line.
    pub fn from_env() -> DaemonKind {
        match std::env::var_os("VUFS_DAEMON") {
            None => DaemonKind::Virtiofsd,
            Some(v) if v == "virtiofsd" || v.is_empty() => DaemonKind::Virtiofsd,
            Some(v) if v == "daxfsd" => DaemonKind::Daxfsd,
            Some(v) => DaemonKind::Path(v.into()),
        }
    }

    /// Short name for messages.
    pub fn name(&self) -> String {
        match self {
            DaemonKind::Virtiofsd => "virtiofsd".into(),
            DaemonKind::Daxfsd => "daxfsd".into(),
            DaemonKind::Path(p) => p.display().to_string(),
        }
    }

    /// The binary. Fails, saying how to get it, if it does not exist.
    pub fn binary(&self) -> io::Result<PathBuf> {
        let (path, how) = match self {
            DaemonKind::Virtiofsd => {
                (
                    std::env::var_os("VIRTIOFSD")
                        .map(PathBuf::from)
                        .unwrap_or_else(|| {
                            cache_dir().join(format!("virtiofsd-{VIRTIOFSD_VERSION}/bin/virtiofsd"))
                        }),
                    format!(
                    "install it with `scripts/provision-virtiofsd.sh` (or `cargo install --locked \
                     virtiofsd --version {VIRTIOFSD_VERSION} --root {}`; needs libseccomp-dev and \
                     libcap-ng-dev), or point $VIRTIOFSD at a binary",
                    cache_dir().join(format!("virtiofsd-{VIRTIOFSD_VERSION}")).display()
                ),
                )
            }
            DaemonKind::Daxfsd => (
                std::env::var_os("DAXFSD")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| {
                        let target = std::env::var_os("CARGO_TARGET_DIR")
                            .map(PathBuf::from)
                            .unwrap_or_else(|| {
                                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target")
                            });
                        target.join("debug/daxfsd")
                    }),
                "build it with `cargo build -p daxfsd`, or point $DAXFSD at a binary".to_string(),
            ),
            DaemonKind::Path(p) => (p.clone(), "fix $VUFS_DAEMON".to_string()),
        };
        if path.is_file() {
            Ok(path)
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} binary not found at {}: {how}",
                    self.name(),
                    path.display()
                ),
            ))
        }
    }
}

/// Options for [`Daemon`]; make one with [`Daemon::builder`].
#[derive(Debug, Clone)]
pub struct DaemonBuilder {
    binary: PathBuf,
    shared_dir: Option<PathBuf>,
    cache: String,
    sandbox: String,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    start_timeout: Duration,
    user: Option<(u32, u32)>,
}

impl DaemonBuilder {
    /// Directory to share (default: an empty `shared/` in the daemon's temporary directory).
    pub fn shared_dir(mut self, p: impl Into<PathBuf>) -> Self {
        self.shared_dir = Some(p.into());
        self
    }

    /// `--cache=` value (default `never`).
    pub fn cache(mut self, c: &str) -> Self {
        self.cache = c.into();
        self
    }

    /// `--sandbox=` value (default `none`).
    pub fn sandbox(mut self, s: &str) -> Self {
        self.sandbox = s.into();
        self
    }

    /// One more command-line argument (e.g. `--tag=fs`, `--xattr`).
    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }

    /// An environment variable for the child.
    pub fn env(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Runs the daemon as `uid`/`gid` (the caller must be root): its temporary directory
    /// (socket, log) and a shared directory made here are given to that user. The binary
    /// must be one that user can execute.
    pub fn user(mut self, uid: u32, gid: u32) -> Self {
        self.user = Some((uid, gid));
        self
    }

    /// How long to wait for the socket to appear (default 10 s).
    pub fn start_timeout(mut self, t: Duration) -> Self {
        self.start_timeout = t;
        self
    }

    /// Starts the daemon and waits until its socket exists.
    pub fn spawn(self) -> io::Result<Daemon> {
        let dir = tempfile::Builder::new().prefix("vufs-daemon-").tempdir()?;
        let socket = dir.path().join("vhost-user-fs.sock");
        let log = dir.path().join("daemon.log");
        let shared = match self.shared_dir {
            Some(d) => d,
            None => {
                let d = dir.path().join("shared");
                std::fs::create_dir(&d)?;
                if let Some((uid, gid)) = self.user {
                    std::os::unix::fs::chown(&d, Some(uid), Some(gid))?;
                }
                d
            }
        };
        let logf = File::create(&log)?;
        if let Some((uid, gid)) = self.user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
            std::os::unix::fs::chown(&log, Some(uid), Some(gid))?;
        }
        // A test with a window that names no mapping mode runs in the mode of
        // `VUFS_DAX_MAPPING` (`direct` when unset; `make test-unit` runs the DAX tests once
        // more with `pooled`, the daemon's default). Tests of a mechanism one mode has (copy
        // slots, the budget, shadow tails: direct; the pool) name it.
        let has = |p: &str| self.args.iter().any(|a| a.to_string_lossy().starts_with(p));
        let mapping = (has("--dax-window") && !has("--dax-mapping"))
            .then(|| format!("--dax-mapping={}", crate::dax::mapping_mode()));
        let mut cmd = Command::new(&self.binary);
        cmd.arg(format!("--socket-path={}", socket.display()))
            .arg(format!("--shared-dir={}", shared.display()))
            .arg(format!("--cache={}", self.cache))
            .arg(format!("--sandbox={}", self.sandbox))
            .args(&self.args)
            .args(mapping)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf);
        if let Some((uid, gid)) = self.user {
            // std also drops the supplementary groups when root sets a uid.
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
            std::os::unix::process::CommandExt::gid(&mut cmd, gid);
        }
        let child = cmd.spawn().map_err(|e| {
            io::Error::new(e.kind(), format!("spawning {}: {e}", self.binary.display()))
        })?;
        let mut d = Daemon {
            child: Some(child),
            status: None,
            socket,
            log,
            shared,
            binary: self.binary,
            dir,
        };
        d.wait_for_socket(self.start_timeout)?;
        Ok(d)
    }
}

/// A running backend. Killed (SIGKILL) on drop if still running.
pub struct Daemon {
    child: Option<Child>,
    status: Option<ExitStatus>,
    socket: PathBuf,
    log: PathBuf,
    shared: PathBuf,
    binary: PathBuf,
    dir: TempDir,
}

impl Daemon {
    /// Options for a daemon of `kind` (fails if its binary is missing).
    pub fn builder(kind: &DaemonKind) -> io::Result<DaemonBuilder> {
        Ok(DaemonBuilder {
            binary: kind.binary()?,
            shared_dir: None,
            cache: "never".into(),
            sandbox: "none".into(),
            args: Vec::new(),
            env: Vec::new(),
            start_timeout: Duration::from_secs(10),
            user: None,
        })
    }

    /// Starts a daemon of `kind` sharing `shared_dir` with default options.
    pub fn spawn(kind: &DaemonKind, shared_dir: &Path) -> io::Result<Daemon> {
        Self::builder(kind)?.shared_dir(shared_dir).spawn()
    }

    fn wait_for_socket(&mut self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if std::fs::metadata(&self.socket).is_ok_and(|m| m.file_type().is_socket()) {
                return Ok(());
            }
            if let Some(st) = self.try_wait()? {
                return Err(io::Error::other(format!(
                    "{} exited ({st}) before creating its socket; log:\n{}",
                    self.binary.display(),
                    self.log_contents()
                )));
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} did not create {} within {timeout:?}; log:\n{}",
                        self.binary.display(),
                        self.socket.display(),
                        self.log_contents()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The vhost-user socket.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// The shared directory.
    pub fn shared_dir(&self) -> &Path {
        &self.shared
    }

    /// The daemon's temporary directory (socket, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The binary being run.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// Process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// stdout and stderr of the daemon so far.
    pub fn log_contents(&self) -> String {
        std::fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|e| format!("(no log: {e})"))
    }

    /// Exit status, if it has exited.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(c) = &mut self.child {
            if let Some(st) = c.try_wait()? {
                self.status = Some(st);
                self.child = None;
            }
        }
        Ok(self.status)
    }

    /// Waits up to `timeout` for the daemon to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> io::Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_wait()? {
                return Ok(st);
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} still running {timeout:?} later; log:\n{}",
                        self.binary.display(),
                        self.log_contents()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills the daemon (SIGKILL) and reaps it.
    pub fn kill(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            self.status = Some(c.wait()?);
        }
        Ok(self.status)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}
