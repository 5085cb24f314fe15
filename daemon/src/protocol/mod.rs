//! The FUSE protocol, independent of any transport: the wire format, scatter-gather
//! buffers, the server, the filesystem trait, the DAX mapper seam, the passthrough
//! backing-file seam and the opcode policy the transports schedule requests by.

pub mod abi;
pub mod backing;
pub mod filesystem;
pub mod iobuf;
pub mod ioctl;
pub mod keeper;
pub mod mapper;
pub mod notify;
pub mod policy;
pub mod secctx;
pub mod server;
pub mod state;
