//! daxfsd: a vhost-user virtio-fs daemon with a working DAX window.
//!
//! Layers (see ARCHITECTURE.md): a transport turns requests into [`iobuf::Reader`] /
//! [`iobuf::Writer`] pairs, the [`server::Server`] decodes and dispatches them to a
//! [`filesystem::FileSystem`], and DAX requests go to a [`mapper::Mapper`].

pub mod abi;
pub mod caps;
pub mod cli;
pub mod daemon;
pub mod dax;
pub mod filesystem;
pub mod fuzzing;
pub mod iobuf;
pub mod mapper;
pub mod memfs;
pub mod migration;
pub mod passthrough;
pub mod runfiles;
pub mod sandbox;
pub mod seccomp;
pub mod secctx;
pub mod server;
pub mod sys;
pub mod syslog;
pub mod vhost_user;
