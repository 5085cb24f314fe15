//! The FUSE protocol, independent of any transport: the wire format, scatter-gather
//! buffers, the server, the filesystem trait and the DAX mapper seam.

pub mod abi;
pub mod filesystem;
pub mod iobuf;
pub mod mapper;
pub mod secctx;
pub mod server;
