//! The FUSE protocol, independent of any transport: the wire format, scatter-gather
//! buffers, the server, the filesystem trait, the DAX mapper seam and the passthrough
//! backing-file seam.

pub mod abi;
pub mod backing;
pub mod filesystem;
pub mod iobuf;
pub mod mapper;
pub mod secctx;
pub mod server;
pub mod state;
