//! daxfsd: a vhost-user virtio-fs daemon with a working DAX window.
//!
//! Layers (see ARCHITECTURE.md), one folder each:
//! - [`transport`]: turns its framing (vhost-user virtqueues) into [`iobuf::Reader`] /
//!   [`iobuf::Writer`] pairs;
//! - [`protocol`]: the FUSE wire format, the [`server::Server`] that decodes, validates,
//!   dispatches to a [`filesystem::FileSystem`] and encodes, and the [`mapper::Mapper`] seam
//!   DAX requests go to;
//! - filesystems: [`passthrough`] (the host directory) with [`dax`] (the window and its
//!   coherence decorator) next to it, and [`migration`] of their state;
//! - [`host`]: the process around them (command line, wiring, sandbox, seccomp, capabilities,
//!   logging, run files).
//!
//! Test-only code (an in-memory filesystem, a recording mapper, the fuzz harness) lives in
//! [`testing`], built only with the `testing` feature.

pub mod dax;
pub mod host;
pub mod migration;
pub mod passthrough;
pub mod protocol;
pub mod sys;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transport;

// The layers' modules under their short names, as the rest of the crate and its users name
// them.
pub use host::{caps, cli, daemon, runfiles, sandbox, seccomp, syslog};
pub use protocol::{abi, backing, filesystem, iobuf, mapper, secctx, server};
#[cfg(feature = "testing")]
pub use testing::{fuzzing, memfs};
pub use transport::{dev_fuse, fuse_uring, vhost_user, vring_chain};
