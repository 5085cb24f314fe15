//! The virtio-fs notification queue (`VIRTIO_FS_F_NOTIFICATION`, issue #42).
//!
//! Offered only when the daemon is started with one (`--notify`): QEMU's generic device then
//! needs `num_vqs` = 2 + request queues, since a guest that negotiates the feature numbers
//! its queues 0 hiprio, 1 notifications, 2.. requests (without it: 0 hiprio, 1.. requests,
//! and the extra vring stays unused). The driver posts device-writable buffers of
//! `notify_buf_size` bytes; each carries one FUSE notify message from the file system's
//! [`Notifier`]. Messages wait in the notifier (bounded, coalescing) while the guest has no
//! buffer posted, the vring is stopped (pause, snapshot) or the device is being reset; they
//! are delivered at the next kick of the queue or wake-up of the notifier, on the worker
//! thread that serves the hiprio queue.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddressSpace};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::vhost_user::{FsVring, GuestMem, GuestMemoryLogged};
use crate::protocol::notify::Notifier;

/// The feature bit (`VIRTIO_FS_F_NOTIFICATION`).
pub const VIRTIO_FS_F_NOTIFICATION: u64 = 1 << 0;

/// The notification queue's side of the backend.
pub(crate) struct NotifyQueue {
    notifier: Arc<Notifier>,
    /// Written by the notifier's waker when messages start waiting.
    wake: Arc<EventFd>,
    /// The guest negotiated the feature (then vring 1 is this queue).
    acked: AtomicBool,
}

impl NotifyQueue {
    pub fn new(notifier: Arc<Notifier>) -> io::Result<Self> {
        let wake = Arc::new(EventFd::new(EFD_NONBLOCK)?);
        let w = wake.clone();
        notifier.set_waker(Box::new(move || {
            if let Err(e) = w.write(1) {
                log::warn!("notifications: cannot wake the queue thread: {e}");
            }
        }));
        Ok(NotifyQueue {
            notifier,
            wake,
            acked: AtomicBool::new(false),
        })
    }

    /// The descriptor the hiprio thread's epoll watches for wake-ups.
    pub fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Consumes a wake-up.
    pub fn woken(&self) {
        let _ = self.wake.read();
    }

    /// Whether the guest negotiated the feature.
    pub fn acked(&self) -> bool {
        self.acked.load(Ordering::Acquire)
    }

    /// SET_FEATURES: whether the guest takes notifications; RESET_DEVICE: it does not.
    pub fn set_acked(&self, on: bool) {
        if self.acked.swap(on, Ordering::AcqRel) != on {
            log::info!(
                "notification queue {}",
                if on {
                    "negotiated: host changes reach the guest"
                } else {
                    "off"
                }
            );
        }
        self.notifier.set_live(on);
        if on && !self.notifier.is_empty() {
            // Messages queued before the guest's features arrived (a migrated session's
            // INC_EPOCH): the hiprio thread delivers them once buffers are there.
            let _ = self.wake.write(1);
        }
    }

    /// Whether messages wait.
    pub fn waiting(&self) -> bool {
        !self.notifier.is_empty()
    }

    /// Puts waiting messages into the buffers the guest posted, one per buffer, while both
    /// last; signals the guest once at the end. A buffer too small for its message (the
    /// driver asked for less than `notify_buf_size`) is returned empty and the message is
    /// dropped, with a log line: a guest cannot make it wait for ever.
    pub fn deliver(&self, vring: &FsVring, atomic: &GuestMem) {
        if !self.acked() || !vring.get_ref().get_queue().ready() {
            return;
        }
        let mem = atomic.memory();
        let mut delivered = 0usize;
        while let Some(msg) = self.notifier.front() {
            let chain = {
                let mut v = vring.get_mut();
                v.get_queue_mut().pop_descriptor_chain(mem.clone())
            };
            let Some(chain) = chain else {
                // No buffer: ask for a kick when the guest posts one (with EVENT_IDX the
                // driver kicks only past the index we publish), then look once more.
                match vring.enable_notification() {
                    Ok(true) => continue,
                    _ => break,
                }
            };
            let head = chain.head_index();
            let used = match write_into(&mem, chain, &msg) {
                Ok(n) => n,
                Err(e) => {
                    log::warn!("notification buffer {head}: {e}; message dropped");
                    0
                }
            };
            self.notifier.pop_front();
            if let Err(e) = vring.add_used(head, used as u32) {
                log::error!("notification buffer {head}: cannot return it: {e}");
                break;
            }
            delivered += 1;
        }
        if delivered > 0 {
            super::queue_state::notify(vring);
        }
    }
}

/// Writes `msg` into the writable descriptors of `chain`; the bytes written.
fn write_into<M>(
    mem: &GuestMemoryLogged,
    chain: virtio_queue::DescriptorChain<M>,
    msg: &[u8],
) -> io::Result<usize>
where
    M: std::ops::Deref<Target = GuestMemoryLogged>,
{
    let mut room = 0usize;
    let mut parts = Vec::new();
    for d in chain.writable() {
        room = room.saturating_add(d.len() as usize);
        parts.push(d);
        if room >= msg.len() {
            break;
        }
    }
    if room < msg.len() {
        return Err(io::Error::other(format!(
            "{room} writable bytes for a {}-byte message",
            msg.len()
        )));
    }
    let mut off = 0usize;
    for d in parts {
        let n = (d.len() as usize).min(msg.len() - off);
        mem.write_slice(&msg[off..off + n], d.addr())
            .map_err(|e| io::Error::other(format!("buffer outside guest memory: {e}")))?;
        off += n;
        if off == msg.len() {
            break;
        }
    }
    Ok(off)
}
