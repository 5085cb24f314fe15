//! Transports: each turns its own framing into the server's `Reader`/`Writer` pairs.

pub mod dev_fuse;
pub mod dev_fuse_notify;
pub mod fuse_uring;
pub mod notify_queue;
pub mod vhost_user;
pub mod vring_chain;
