//! The daemon process around the protocol: command line, wiring and session, sandbox,
//! system-call filter, capabilities, logging, pid and socket files.

pub mod caps;
pub mod cli;
pub mod daemon;
mod dax_channel;
pub mod mount;
pub mod runfiles;
pub mod sandbox;
pub mod seccomp;
pub mod syslog;
