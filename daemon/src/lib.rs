//! daxfsd: a vhost-user virtio-fs daemon with a working DAX window.
//!
//! Layers (see ARCHITECTURE.md), one folder each, from the bottom up; a layer imports only
//! the layers below it (`daemon/tests/layers.rs` checks it):
//! - [`sys`]: thin wrappers of system calls;
//! - [`migration`]: the device-state stream (frame and field codec) and the transfer that
//!   moves it; it knows streams, not what is in them;
//! - [`protocol`]: the FUSE wire format, the [`protocol::server::Server`] that decodes,
//!   validates, dispatches to a [`protocol::filesystem::FileSystem`] and encodes, the
//!   [`protocol::mapper::Mapper`] seam DAX requests go to, and migration as a capability of
//!   the file system ([`protocol::state::SerializableFileSystem`]);
//! - file systems: [`passthrough`] (the host directory, with its migratable state) and
//!   [`dax`] (the window and its coherence decorator);
//! - [`transport`]: turns its framing (vhost-user virtqueues, /dev/fuse, FUSE-over-io_uring)
//!   into [`protocol::iobuf::Reader`] / [`protocol::iobuf::Writer`] pairs;
//! - [`host`]: the process around them (command line, start-up, sandbox, seccomp,
//!   capabilities, logging, run files) in its two modes, vhost-user daemon and /dev/fuse
//!   mount.
//!
//! Test-only code (an in-memory filesystem, a recording mapper, the fuzz harness) lives in
//! [`testing`], above everything, built only with the `testing` feature.
//!
//! Inside the crate every path names its layer (`crate::protocol::abi`, never `crate::abi`).

pub mod dax;
pub mod host;
pub mod migration;
pub mod passthrough;
pub mod protocol;
pub mod sys;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transport;

// The public face: the layers' modules under short names, for the crate's users only (its
// tests, the fuzz targets, the userspace driver). Code inside the crate never uses them; it
// names each module by its layer.
pub use host::{caps, cli, daemon, runfiles, sandbox, seccomp, syslog};
pub use protocol::{abi, backing, filesystem, iobuf, mapper, secctx, server};
#[cfg(feature = "testing")]
pub use testing::{fuzzing, memfs};
pub use transport::{dev_fuse, fuse_uring, vhost_user, vring_chain};
