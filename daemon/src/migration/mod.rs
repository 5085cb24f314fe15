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
//!
//! This layer knows streams, not what is in them: [`format`] is the frame and the field
//! codec, [`StateHost`] what reads and writes whole streams (the FUSE server with a file
//! system that has the capability, `protocol::state::SerializableFileSystem`), and
//! [`Migration`] the transfer the vhost-user transport's device-state port drives. Each part
//! of the state lives next to what it describes: the session in `protocol::server`, the
//! passthrough's tables and `--migration-*` options in `passthrough::state`, file handles in
//! `passthrough::fhandle`.

pub mod format;

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the daemon's state lives in, as streams: the FUSE server implements it for its file
/// system (`protocol::state`), this layer only moves the bytes.
pub trait StateHost: Send + Sync {
    /// Collects the state (called with every vring stopped) as a complete stream, with a
    /// few words for the log.
    fn save_stream(&self) -> io::Result<(Vec<u8>, String)>;
    /// Decodes, validates and applies a complete stream; under `OnError::Abort` either all of
    /// it or nothing. Returns a few words for the log.
    fn load_stream(&self, stream: &[u8]) -> io::Result<String>;
}

/// How long CHECK_DEVICE_STATE waits for the transfer. QEMU checks once it has closed its
/// end of the pipe, so the transfer is normally done; a frontend that never closes it gets an
/// error instead of a vhost-user thread blocked for good.
const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs transfers on a thread of their own.
pub struct Migration {
    host: Arc<dyn StateHost>,
    /// The running (or finished, unchecked) transfer's result.
    job: Mutex<Option<Receiver<io::Result<()>>>>,
}

impl Migration {
    pub fn new(host: Arc<dyn StateHost>) -> Self {
        Migration {
            host,
            job: Mutex::new(None),
        }
    }

    fn save(host: &dyn StateHost, mut file: File) -> io::Result<()> {
        let (bytes, summary) = host.save_stream()?;
        file.write_all(&bytes)?;
        log::info!("migration: saved {summary} ({} bytes)", bytes.len());
        Ok(())
    }

    fn load(host: &dyn StateHost, file: File) -> io::Result<()> {
        let mut buf = Vec::new();
        file.take(format::MAX_STREAM as u64 + 1)
            .read_to_end(&mut buf)?;
        let summary = host.load_stream(&buf)?;
        log::info!("migration: loaded {summary} ({} bytes)", buf.len());
        Ok(())
    }

    /// Starts a transfer over `file` (`load`: the frontend writes the state into it) on a
    /// thread of its own (SET_DEVICE_STATE_FD).
    pub fn set_fd(&self, load: bool, file: File) -> io::Result<()> {
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
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("migration".into())
            .spawn(move || {
                let r = if load {
                    Self::load(host.as_ref(), file)
                } else {
                    Self::save(host.as_ref(), file)
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

    /// Waits for the transfer and reports its result (CHECK_DEVICE_STATE).
    pub fn check(&self) -> io::Result<()> {
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

#[cfg(test)]
mod tests;
