//! Live migration: the device state that moves a guest's FUSE session from one daxfsd to
//! another, through the vhost-user device-state transfer (protocol feature DEVICE_STATE:
//! SET_DEVICE_STATE_FD, then CHECK_DEVICE_STATE) that QEMU's `vhost-user-fs` uses to migrate
//! internally.
//!
//! What moves: the negotiated FUSE session (so the destination does not expect a new INIT),
//! every inode the guest holds (its node id, lookup count, and how the destination finds the
//! same host file: a path inside the shared directory or a file handle, per
//! `--migration-mode`), and every open file and directory handle (its id, inode and open
//! flags). No file data moves: source and destination must share the same directory
//! contents (virtiofsd's rule; see README "Live migration").
//!
//! The transfer never blocks the vhost-user thread: `set_fd` starts a thread that writes
//! (save) or reads and applies (load) the state; `check` waits for it and reports its result,
//! so a refused state fails CHECK_DEVICE_STATE and QEMU fails the migration.

pub mod format;

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most inodes a stream may carry.
pub const MAX_INODES: usize = 1 << 20;
/// Most open handles a stream may carry.
pub const MAX_HANDLES: usize = 1 << 20;
/// Longest path (bytes) of one inode inside the shared directory.
pub const MAX_PATH: usize = libc::PATH_MAX as usize;
/// Longest file handle (`MAX_HANDLE_SZ`).
pub const MAX_FILE_HANDLE: usize = 128;

/// How the source tells the destination where each inode is (`--migration-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigrationMode {
    /// The inode's path inside the shared directory (works across file systems; brittle if
    /// files are renamed behind the daemon's back or unlinked while open).
    #[default]
    FindPaths,
    /// A file handle (`name_to_handle_at`): the same file system on both sides, and
    /// `CAP_DAC_READ_SEARCH` on the destination; survives renames and unlinked open files.
    FileHandles,
}

/// What the destination does with an inode it cannot restore (`--migration-on-error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Refuse the whole state: QEMU's migration fails and the source guest runs on.
    #[default]
    Abort,
    /// Accept the state; the inodes (and their handles) that could not be restored return
    /// errors to the guest (EIO), everything else works.
    GuestError,
}

/// Migration options, with virtiofsd 1.14's meanings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MigrationOptions {
    pub mode: MigrationMode,
    pub on_error: OnError,
    /// find-paths: the source adds a file handle for each path, the destination checks the
    /// file it opened has that handle (catches a path that now names another file).
    pub verify_handles: bool,
    /// find-paths: the source checks each path it found names the inode (and searches the
    /// shared directory for the right one when not).
    pub confirm_paths: bool,
}

/// The negotiated FUSE session (see `server::Server::export_session`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionState {
    pub initialized: bool,
    pub minor: u32,
    pub max_io: u32,
    pub flags: u64,
}

/// A file handle as `name_to_handle_at` makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHandleBytes {
    pub handle_type: i32,
    pub bytes: Vec<u8>,
}

/// Where the destination finds an inode's host file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// The shared directory itself (inode 1 only).
    Root,
    /// A relative path inside the shared directory, components separated by `/`.
    Path(Vec<u8>),
    /// A file handle on the shared directory's file system.
    Handle(FileHandleBytes),
    /// The source found no way to name it (e.g. unlinked while open, in find-paths mode).
    Lost,
}

/// One inode the guest holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeState {
    pub id: u64,
    pub refs: u64,
    pub generation: u64,
    /// `S_IFMT` bits.
    pub kind: u32,
    pub location: Location,
    /// `--migration-verify-handles`: the file handle the destination must find there.
    pub verify: Option<FileHandleBytes>,
}

/// One open handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleState {
    pub fh: u64,
    pub inode: u64,
    pub dir: bool,
    /// `open(2)` flags to reopen it with (access mode, `O_APPEND`, `O_DIRECT`, ...).
    pub flags: u32,
}

/// The passthrough file system's tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsState {
    /// Features agreed in INIT that change the filesystem's behaviour (bit set of the
    /// passthrough's own flags).
    pub negotiated: u32,
    pub next_inode: u64,
    pub next_handle: u64,
    pub inodes: Vec<InodeState>,
    pub handles: Vec<HandleState>,
}

/// Everything that moves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceState {
    pub session: SessionState,
    pub fs: FsState,
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// Checks that a path from the stream is a relative path of plain components (no `..`,
/// no `.`, no empty component, no NUL): it can only name something below the root.
pub fn check_relative_path(p: &[u8]) -> io::Result<()> {
    if p.is_empty() || p.len() > MAX_PATH || p.contains(&0) {
        return Err(bad("invalid path in the device state"));
    }
    for c in p.split(|&b| b == b'/') {
        if c.is_empty() || c == b"." || c == b".." || c.len() > 255 {
            return Err(bad(format!(
                "path {:?} in the device state is not a plain relative path",
                String::from_utf8_lossy(p)
            )));
        }
    }
    Ok(())
}

impl DeviceState {
    /// Consistency checks beyond the format: unique ids, the root exactly once as inode 1,
    /// handles on known inodes, counters past every id in use.
    pub fn validate(&self) -> io::Result<()> {
        let fs = &self.fs;
        let mut ids = std::collections::HashSet::with_capacity(fs.inodes.len());
        let mut root = false;
        for i in &fs.inodes {
            if i.id == 0 || !ids.insert(i.id) {
                return Err(bad(format!("inode id {} is 0 or repeated", i.id)));
            }
            if i.id >= fs.next_inode {
                return Err(bad(format!(
                    "inode {} is not below the next id {}",
                    i.id, fs.next_inode
                )));
            }
            if i.refs == 0 {
                return Err(bad(format!("inode {} has no references", i.id)));
            }
            match &i.location {
                Location::Root if i.id == crate::abi::ROOT_ID => root = true,
                Location::Root => return Err(bad(format!("inode {} claims to be the root", i.id))),
                _ if i.id == crate::abi::ROOT_ID => {
                    return Err(bad("inode 1 is not the shared directory"))
                }
                Location::Path(p) => check_relative_path(p)?,
                Location::Handle(_) | Location::Lost => {}
            }
            if i.kind & !(libc::S_IFMT) != 0 {
                return Err(bad(format!("inode {}: bad file type {:#o}", i.id, i.kind)));
            }
        }
        if !root {
            return Err(bad("the device state has no root inode"));
        }
        let mut fhs = std::collections::HashSet::with_capacity(fs.handles.len());
        for h in &fs.handles {
            if !fhs.insert(h.fh) || h.fh >= fs.next_handle {
                return Err(bad(format!(
                    "handle {} is repeated or not below the next id",
                    h.fh
                )));
            }
            if !ids.contains(&h.inode) {
                return Err(bad(format!(
                    "handle {} names unknown inode {}",
                    h.fh, h.inode
                )));
            }
        }
        Ok(())
    }
}

/// What the daemon's state lives in: the server (session) and its filesystem (tables).
pub trait StateHost: Send + Sync {
    /// Collects the state (called with every vring stopped).
    fn save_state(&self, opts: &MigrationOptions) -> io::Result<DeviceState>;
    /// Applies a decoded, validated state; under `OnError::Abort` either all of it or nothing.
    fn load_state(&self, state: DeviceState, opts: &MigrationOptions) -> io::Result<()>;
}

/// The transport's side: what FsBackend calls for SET_DEVICE_STATE_FD / CHECK_DEVICE_STATE.
pub trait DeviceStateTransfer: Send + Sync {
    /// Starts a transfer over `file` (`load`: the frontend writes the state into it).
    fn set_fd(&self, load: bool, file: File) -> io::Result<()>;
    /// Waits for the transfer and reports its result.
    fn check(&self) -> io::Result<()>;
}

/// How long CHECK_DEVICE_STATE waits for the transfer. QEMU checks once it has closed its
/// end of the pipe, so the transfer is normally done; a frontend that never closes it gets an
/// error instead of a vhost-user thread blocked for good.
const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs transfers on a thread of their own.
pub struct Migration {
    host: Arc<dyn StateHost>,
    opts: MigrationOptions,
    /// The running (or finished, unchecked) transfer's result.
    job: Mutex<Option<Receiver<io::Result<()>>>>,
}

impl Migration {
    pub fn new(host: Arc<dyn StateHost>, opts: MigrationOptions) -> Self {
        Migration {
            host,
            opts,
            job: Mutex::new(None),
        }
    }

    fn save(host: &dyn StateHost, opts: &MigrationOptions, mut file: File) -> io::Result<()> {
        let state = host.save_state(opts)?;
        let bytes = format::encode(&state)?;
        file.write_all(&bytes)?;
        log::info!(
            "migration: saved {} inodes, {} handles ({} bytes)",
            state.fs.inodes.len(),
            state.fs.handles.len(),
            bytes.len()
        );
        Ok(())
    }

    fn load(host: &dyn StateHost, opts: &MigrationOptions, file: File) -> io::Result<()> {
        let mut buf = Vec::new();
        file.take(format::MAX_STREAM as u64 + 1)
            .read_to_end(&mut buf)?;
        let state = format::decode(&buf)?;
        state.validate()?;
        let (n, h) = (state.fs.inodes.len(), state.fs.handles.len());
        host.load_state(state, opts)?;
        log::info!(
            "migration: loaded {n} inodes, {h} handles ({} bytes)",
            buf.len()
        );
        Ok(())
    }
}

impl DeviceStateTransfer for Migration {
    fn set_fd(&self, load: bool, file: File) -> io::Result<()> {
        let mut job = self.job.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = job.take() {
            match old.try_recv() {
                Err(TryRecvError::Empty) => {
                    *job = Some(old);
                    return Err(io::Error::other("a device-state transfer is still running"));
                }
                _ => log::warn!("migration: a new transfer starts before the last was checked"),
            }
        }
        let host = self.host.clone();
        let opts = self.opts;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("migration".into())
            .spawn(move || {
                let r = if load {
                    Self::load(host.as_ref(), &opts, file)
                } else {
                    Self::save(host.as_ref(), &opts, file)
                };
                if let Err(e) = &r {
                    let what = if load { "loading" } else { "saving" };
                    log::error!("migration: {what} the device state failed: {e}");
                }
                let _ = tx.send(r);
            })?;
        *job = Some(rx);
        Ok(())
    }

    fn check(&self) -> io::Result<()> {
        let job = self.job.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(rx) = job else {
            return Err(io::Error::other("no device-state transfer was started"));
        };
        match rx.recv_timeout(CHECK_TIMEOUT) {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout) => {
                log::error!(
                    "migration: the device-state transfer did not finish within {CHECK_TIMEOUT:?}"
                );
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "device-state transfer still running",
                ))
            }
            Err(RecvTimeoutError::Disconnected) => Err(io::Error::other(
                "the device-state transfer thread ended without a result",
            )),
        }
    }
}

/// A served filesystem whose migratable state is a passthrough's tables.
pub trait PassthroughState {
    fn passthrough(&self) -> &crate::passthrough::PassthroughFs;
}

impl PassthroughState for crate::passthrough::PassthroughFs {
    fn passthrough(&self) -> &crate::passthrough::PassthroughFs {
        self
    }
}

impl PassthroughState for crate::dax::coherent::Coherent<crate::passthrough::PassthroughFs> {
    fn passthrough(&self) -> &crate::passthrough::PassthroughFs {
        self.inner()
    }
}

impl<F: crate::filesystem::FileSystem + PassthroughState> StateHost for crate::server::Server<F> {
    fn save_state(&self, opts: &MigrationOptions) -> io::Result<DeviceState> {
        Ok(DeviceState {
            session: self.export_session(),
            fs: self.fs().passthrough().export_state(opts)?,
        })
    }

    fn load_state(&self, state: DeviceState, opts: &MigrationOptions) -> io::Result<()> {
        let before = self.export_session();
        let fs_wants = self.fs().passthrough().init_wants();
        self.import_session(&state.session, fs_wants)?;
        match self.fs().passthrough().import_state(&state.fs, opts) {
            Ok((0, 0)) => Ok(()),
            Ok((inodes, handles)) => {
                log::warn!(
                    "migration: {inodes} inode(s) and {handles} handle(s) could not be restored; the guest gets errors for them (--migration-on-error=guest-error)"
                );
                Ok(())
            }
            Err(e) => {
                let _ = self.import_session(&before, fs_wants);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests;
