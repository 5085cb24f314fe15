//! Migration as a capability: a file system that can hand over its state
//! ([`SerializableFileSystem`]), and the [`Server`] that moves it together with its own
//! negotiated session ([`SessionState`]) as one device state.
//!
//! The stream's frame and field codec are the migration layer's
//! ([`crate::migration::format`]); the transfer (a thread per SET_DEVICE_STATE_FD, checked by
//! CHECK_DEVICE_STATE) is [`crate::migration::Migration`], which sees the server only as a
//! [`StateHost`] that reads and writes streams.

use std::io;
use std::sync::Arc;

use crate::migration::format::{Codec, Dec, Enc};
use crate::migration::StateHost;
use crate::protocol::filesystem::FileSystem;
use crate::protocol::server::{Server, SessionState};

/// A file system whose state can move to another daemon (live migration).
pub trait SerializableFileSystem: FileSystem {
    /// Its tables, as they travel in the stream.
    type State: Codec + Clone + Send + Sync + 'static;
    /// How it names what it hands over (`--migration-*`).
    type Options: Clone + Send + Sync + 'static;

    /// Collects the tables (called with every vring stopped).
    fn save_state(&self, opts: &Self::Options) -> io::Result<Self::State>;
    /// Replaces the tables with a decoded, validated state; on error the tables are as they
    /// were.
    fn load_state(&self, state: &Self::State, opts: &Self::Options) -> io::Result<()>;
    /// The INIT flags its configuration asks for (a migrated session may have agreed only
    /// to flags the server or this file system offers).
    fn init_wants(&self) -> u64;
}

/// Everything that moves: the server's session and its file system's tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceState<S> {
    pub session: SessionState,
    pub fs: S,
}

impl<S: Codec> DeviceState<S> {
    /// Encodes the state into a complete stream.
    pub fn encode_stream(&self) -> io::Result<Vec<u8>> {
        let mut e = Enc::new();
        // The session part cannot fail: the file system's limits are the first refusal.
        self.session.encode(&mut e)?;
        self.fs.encode(&mut e)?;
        e.into_stream()
    }

    /// Decodes a complete stream; any malformation is an `InvalidData` error.
    pub fn decode_stream(stream: &[u8]) -> io::Result<Self> {
        let mut d = Dec::stream(stream)?;
        let session = SessionState::decode(&mut d)?;
        let fs = S::decode(&mut d)?;
        d.finish()?;
        Ok(DeviceState { session, fs })
    }

    /// Consistency checks beyond the format (the file system's).
    pub fn validate(&self) -> io::Result<()> {
        self.fs.validate()
    }
}

impl<F: SerializableFileSystem> Server<F> {
    /// The device state (called with every vring stopped).
    pub fn save_state(&self, opts: &F::Options) -> io::Result<DeviceState<F::State>> {
        Ok(DeviceState {
            session: self.export_session(),
            fs: self.fs().save_state(opts)?,
        })
    }

    /// Applies a decoded, validated state: the session, then the file system's tables; if
    /// the tables are refused the session is put back, so either all of it or nothing.
    pub fn load_state(&self, state: DeviceState<F::State>, opts: &F::Options) -> io::Result<()> {
        let before = self.export_session();
        let fs_wants = self.fs().init_wants();
        self.import_session(&state.session, fs_wants)?;
        if let Err(e) = self.fs().load_state(&state.fs, opts) {
            let _ = self.import_session(&before, fs_wants);
            return Err(e);
        }
        Ok(())
    }

    /// This server as the migration layer sees it: streams in and out, with `opts`.
    pub fn state_host(self: &Arc<Self>, opts: F::Options) -> Arc<dyn StateHost>
    where
        F: Send + Sync + 'static,
    {
        Arc::new(ServerState {
            server: self.clone(),
            opts,
        })
    }
}

/// A server and its migration options, as a [`StateHost`].
struct ServerState<F: SerializableFileSystem> {
    server: Arc<Server<F>>,
    opts: F::Options,
}

impl<F: SerializableFileSystem + Send + Sync + 'static> StateHost for ServerState<F> {
    fn save_stream(&self) -> io::Result<(Vec<u8>, String)> {
        let state = self.server.save_state(&self.opts)?;
        Ok((state.encode_stream()?, state.fs.summary()))
    }

    fn load_stream(&self, stream: &[u8]) -> io::Result<String> {
        let state = DeviceState::<F::State>::decode_stream(stream)?;
        state.validate()?;
        let summary = state.fs.summary();
        self.server.load_state(state, &self.opts)?;
        Ok(summary)
    }
}
