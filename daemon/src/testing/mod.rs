//! Test-only pieces, built with the `testing` feature (the crate's own tests, the userspace
//! driver's tests, the fuzz targets): never part of the shipped daemon.

pub mod frontend;
pub mod fuzzing;
pub mod memfs;
pub mod recording;
