//! Transports: each turns its own framing into the server's `Reader`/`Writer` pairs.

mod chain_request;
pub mod dev_fuse;
pub mod dev_fuse_notify;
mod dirty_log;
pub mod fuse_uring;
mod lock_waits;
pub mod notify_queue;
mod queue_state;
pub mod ring_records;
mod ring_view;
pub mod vhost_user;
pub mod vring_chain;
mod window_regions;
mod worker_pool;
