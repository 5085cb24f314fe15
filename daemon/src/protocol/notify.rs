//! Server-to-guest notifications (issue #42): what the file system wants the guest to learn
//! about host changes, queued until the transport can deliver it.
//!
//! A notification is a FUSE notify message (`fuse_out_header` with `unique` 0 and the code
//! in `error`, then the code's body), as /dev/fuse carries them and as the virtio-fs
//! notification queue (`VIRTIO_FS_F_NOTIFICATION`, virtqueue 1) carries one per buffer. The
//! codes are the kernel's (INVAL_INODE, INVAL_ENTRY, DELETE, INC_EPOCH) plus FSNOTIFY (128,
//! provisional), our guest patch's report of a host change to guest fsnotify watchers.
//!
//! [`Notifier`] is the queue between the producer (the file system's host watch) and the
//! transport that drains it. It is bounded: identical invalidations and repeated
//! modify/attrib events coalesce while they wait, and past [`Notifier::new`]'s capacity the
//! whole queue gives way to one INC_EPOCH (every cached entry and attribute in the guest is
//! stale), so a guest that posts no buffers, or a host that changes a million files, costs a
//! fixed amount of memory. Nothing is queued while no guest negotiated notifications.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::abi::NAME_MAX;

/// FUSE notify codes (`enum fuse_notify_code`).
pub mod code {
    pub const INVAL_INODE: i32 = 2;
    pub const INVAL_ENTRY: i32 = 3;
    pub const DELETE: i32 = 6;
    pub const INC_EPOCH: i32 = 8;
    /// Provisional, outside the kernel's range: a host change for guest fsnotify watchers.
    pub const FSNOTIFY: i32 = 128;
}

/// FSNOTIFY event bits (the inotify values).
pub mod mask {
    pub const MODIFY: u32 = 0x2;
    pub const ATTRIB: u32 = 0x4;
    pub const CLOSE_WRITE: u32 = 0x8;
    pub const MOVED_FROM: u32 = 0x40;
    pub const MOVED_TO: u32 = 0x80;
    pub const CREATE: u32 = 0x100;
    pub const DELETE: u32 = 0x200;
    pub const DELETE_SELF: u32 = 0x400;
    pub const MOVE_SELF: u32 = 0x800;
    pub const ISDIR: u32 = 0x4000_0000;
}

/// Largest message: header, the largest body (FSNOTIFY, 24 bytes) and a name with its NUL.
pub const MAX_MESSAGE: usize = 16 + 24 + NAME_MAX + 1;

/// Notifications a transport's queue holds at most (about 300 bytes each); past it, one
/// broad invalidation replaces them.
pub const QUEUE_CAP: usize = 4096;

/// Notification buffer size the device asks the driver for (`notify_buf_size`).
pub const NOTIFY_BUF_SIZE: u32 = 4096;

/// One notification.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Notification {
    /// Attributes of `node` are stale; with `off >= 0` its cached data from `off` too
    /// (`len <= 0`: to the end).
    InvalInode { node: u64, off: i64, len: i64 },
    /// The entry `name` of directory `parent` is stale.
    InvalEntry { parent: u64, name: Vec<u8> },
    /// The entry `name` of `parent`, which named `child`, is gone.
    Delete {
        parent: u64,
        child: u64,
        name: Vec<u8>,
    },
    /// Every cached entry and attribute is stale (the overflow fallback).
    Epoch,
    /// A host change for the guest's fsnotify watchers: with a name, an event on the entry
    /// `name` of directory `node`; without, an event on `node` itself.
    Fsnotify {
        node: u64,
        mask: u32,
        cookie: u32,
        name: Vec<u8>,
    },
}

impl Notification {
    /// The notify code.
    pub fn code(&self) -> i32 {
        match self {
            Notification::InvalInode { .. } => code::INVAL_INODE,
            Notification::InvalEntry { .. } => code::INVAL_ENTRY,
            Notification::Delete { .. } => code::DELETE,
            Notification::Epoch => code::INC_EPOCH,
            Notification::Fsnotify { .. } => code::FSNOTIFY,
        }
    }

    /// Whether a second copy waiting beside the first adds nothing: invalidations are
    /// idempotent, and so are repeated modify/attrib reports (inotify coalesces those too).
    fn coalesces(&self) -> bool {
        match self {
            Notification::Fsnotify { mask: m, .. } => {
                m & !mask::ISDIR & !(mask::MODIFY | mask::ATTRIB | mask::CLOSE_WRITE) == 0
            }
            _ => true,
        }
    }

    /// The wire message: `fuse_out_header` and the body.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(MAX_MESSAGE);
        let with_name = |body: &mut Vec<u8>, name: &[u8]| {
            body.extend_from_slice(name);
            body.push(0);
        };
        match self {
            Notification::InvalInode { node, off, len } => {
                body.extend_from_slice(&node.to_le_bytes());
                body.extend_from_slice(&off.to_le_bytes());
                body.extend_from_slice(&len.to_le_bytes());
            }
            Notification::InvalEntry { parent, name } => {
                body.extend_from_slice(&parent.to_le_bytes());
                body.extend_from_slice(&(name.len() as u32).to_le_bytes());
                body.extend_from_slice(&0u32.to_le_bytes());
                with_name(&mut body, name);
            }
            Notification::Delete {
                parent,
                child,
                name,
            } => {
                body.extend_from_slice(&parent.to_le_bytes());
                body.extend_from_slice(&child.to_le_bytes());
                body.extend_from_slice(&(name.len() as u32).to_le_bytes());
                body.extend_from_slice(&0u32.to_le_bytes());
                with_name(&mut body, name);
            }
            Notification::Epoch => {}
            Notification::Fsnotify {
                node,
                mask,
                cookie,
                name,
            } => {
                body.extend_from_slice(&node.to_le_bytes());
                body.extend_from_slice(&mask.to_le_bytes());
                body.extend_from_slice(&(name.len() as u32).to_le_bytes());
                body.extend_from_slice(&cookie.to_le_bytes());
                body.extend_from_slice(&0u32.to_le_bytes());
                if !name.is_empty() {
                    with_name(&mut body, name);
                }
            }
        }
        let len = 16 + body.len();
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&(len as u32).to_le_bytes());
        msg.extend_from_slice(&self.code().to_le_bytes());
        msg.extend_from_slice(&0u64.to_le_bytes());
        msg.extend_from_slice(&body);
        msg
    }
}

#[derive(Default)]
struct Pending {
    queue: VecDeque<Notification>,
    /// The coalescing members of `queue`.
    waiting: HashSet<Notification>,
    /// The queue overflowed: an INC_EPOCH goes first.
    overflow: bool,
    /// What the guest caches may be stale (a session imported from a migration source,
    /// whose watch stopped before ours started): an INC_EPOCH goes first, and what is
    /// pushed meanwhile still follows it.
    stale: bool,
}

/// Counters, for the log and the tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NotifyStats {
    pub queued: u64,
    pub coalesced: u64,
    pub sent: u64,
    pub overflows: u64,
}

/// What sees every notification pushed ([`Notifier::set_observer`]).
pub type Observer = Box<dyn Fn(&Notification) + Send + Sync>;

/// The bounded queue of notifications between a file system and a transport.
pub struct Notifier {
    pending: Mutex<Pending>,
    cap: usize,
    /// A guest negotiated notifications on this session.
    live: AtomicBool,
    /// Called when the queue goes from empty to non-empty (the transport's wake-up).
    waker: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
    /// Sees every notification pushed, whether a guest takes them or not (the DAX window
    /// refreshes what it holds of a file the host changed).
    observer: Mutex<Option<Observer>>,
    queued: AtomicU64,
    coalesced: AtomicU64,
    sent: AtomicU64,
    overflows: AtomicU64,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("waiting", &self.len())
            .field("live", &self.live())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Notifier {
    /// A queue holding at most `cap` notifications.
    pub fn new(cap: usize) -> Self {
        Notifier {
            pending: Mutex::default(),
            cap: cap.max(1),
            live: AtomicBool::new(false),
            waker: Mutex::new(None),
            observer: Mutex::new(None),
            queued: AtomicU64::new(0),
            coalesced: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            overflows: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the transport's wake-up.
    pub fn set_waker(&self, waker: Box<dyn Fn() + Send + Sync>) {
        *self.waker.lock().unwrap_or_else(|p| p.into_inner()) = Some(waker);
    }

    /// Sets what sees every notification pushed (it runs on the producer's thread).
    pub fn set_observer(&self, observer: Observer) {
        *self.observer.lock().unwrap_or_else(|p| p.into_inner()) = Some(observer);
    }

    /// Whether a guest receives notifications now (the transport says so).
    pub fn live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// The transport: whether the guest negotiated notifications. Going off drops what waits.
    pub fn set_live(&self, live: bool) {
        if !self.live.swap(live, Ordering::AcqRel) || live {
            return;
        }
        self.reset();
    }

    /// Drops everything queued (the session's node ids are gone).
    pub fn reset(&self) {
        let mut p = self.lock();
        p.queue.clear();
        p.waiting.clear();
        p.overflow = false;
        p.stale = false;
    }

    /// The guest's caches may be stale (changes went unwatched): its first message will be
    /// one INC_EPOCH, even when it negotiates notifications only later (a migration
    /// destination imports the session before the guest's features arrive).
    pub fn mark_stale(&self) {
        self.lock().stale = true;
        if let Some(w) = &*self.waker.lock().unwrap_or_else(|p| p.into_inner()) {
            w();
        }
    }

    /// Queues `batch` in order (one host change: its invalidations, then its event).
    pub fn push(&self, batch: impl IntoIterator<Item = Notification>) {
        let batch: Vec<Notification> = batch.into_iter().collect();
        if let Some(o) = &*self.observer.lock().unwrap_or_else(|p| p.into_inner()) {
            batch.iter().for_each(o);
        }
        if !self.live() {
            return;
        }
        let wake = {
            let mut p = self.lock();
            let was_empty = p.queue.is_empty() && !p.overflow;
            for n in batch {
                if p.overflow {
                    self.coalesced.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if n.coalesces() && p.waiting.contains(&n) {
                    self.coalesced.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if p.queue.len() >= self.cap {
                    // Bounded: the guest learns that everything may have changed instead.
                    self.overflows.fetch_add(1, Ordering::Relaxed);
                    log::warn!(
                        "notifications: {} waiting (the guest takes none, or the host changes \
                         faster than it reads): sending one broad invalidation instead",
                        p.queue.len()
                    );
                    p.queue.clear();
                    p.waiting.clear();
                    p.overflow = true;
                    continue;
                }
                if n.coalesces() {
                    p.waiting.insert(n.clone());
                }
                p.queue.push_back(n);
                self.queued.fetch_add(1, Ordering::Relaxed);
            }
            was_empty && (!p.queue.is_empty() || p.overflow)
        };
        if wake {
            if let Some(w) = &*self.waker.lock().unwrap_or_else(|p| p.into_inner()) {
                w();
            }
        }
    }

    /// The next message to deliver, encoded, without taking it off the queue.
    pub fn front(&self) -> Option<Vec<u8>> {
        let p = self.lock();
        if p.overflow || p.stale {
            return Some(Notification::Epoch.encode());
        }
        p.queue.front().map(Notification::encode)
    }

    /// Takes the message [`front`](Self::front) gave off the queue (it was delivered).
    pub fn pop_front(&self) {
        let mut p = self.lock();
        if p.overflow || p.stale {
            p.overflow = false;
            p.stale = false;
        } else if let Some(n) = p.queue.pop_front() {
            if n.coalesces() {
                p.waiting.remove(&n);
            }
        } else {
            return;
        }
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Messages waiting (an overflow counts as one).
    pub fn len(&self) -> usize {
        let p = self.lock();
        p.queue.len() + usize::from(p.overflow || p.stale)
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> NotifyStats {
        NotifyStats {
            queued: self.queued.load(Ordering::Relaxed),
            coalesced: self.coalesced.load(Ordering::Relaxed),
            sent: self.sent.load(Ordering::Relaxed),
            overflows: self.overflows.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn ev(node: u64, m: u32, name: &str) -> Notification {
        Notification::Fsnotify {
            node,
            mask: m,
            cookie: 0,
            name: name.as_bytes().to_vec(),
        }
    }

    fn drain(n: &Notifier) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(m) = n.front() {
            out.push(m);
            n.pop_front();
        }
        out
    }

    #[test]
    fn messages_are_fuse_notifications() {
        let m = Notification::InvalEntry {
            parent: 7,
            name: b"abc".to_vec(),
        }
        .encode();
        assert_eq!(m.len(), 16 + 16 + 4);
        assert_eq!(u32::from_le_bytes(m[0..4].try_into().unwrap()), 36);
        assert_eq!(i32::from_le_bytes(m[4..8].try_into().unwrap()), 3);
        assert_eq!(u64::from_le_bytes(m[8..16].try_into().unwrap()), 0);
        assert_eq!(&m[16..24], &7u64.to_le_bytes());
        assert_eq!(&m[24..28], &3u32.to_le_bytes());
        assert_eq!(&m[32..], b"abc\0");
        let f = ev(9, mask::CREATE, "x").encode();
        assert_eq!(f.len(), 16 + 24 + 2);
        assert_eq!(i32::from_le_bytes(f[4..8].try_into().unwrap()), 128);
        assert_eq!(ev(9, mask::MODIFY, "").encode().len(), 40);
        let long = ev(1, mask::CREATE, &"n".repeat(NAME_MAX)).encode();
        assert!(long.len() <= MAX_MESSAGE && MAX_MESSAGE <= NOTIFY_BUF_SIZE as usize);
        assert_eq!(Notification::Epoch.encode().len(), 16);
    }

    #[test]
    fn nothing_is_queued_before_a_guest_negotiates() {
        let n = Notifier::new(8);
        n.push([Notification::Epoch]);
        assert!(n.is_empty());
        n.set_live(true);
        n.push([ev(1, mask::CREATE, "a")]);
        assert_eq!(n.len(), 1);
        n.set_live(false);
        assert!(n.is_empty(), "a guest that goes away leaves nothing behind");
    }

    #[test]
    fn repeated_invalidations_and_modifies_coalesce_but_entry_events_keep_their_order() {
        let n = Notifier::new(64);
        n.set_live(true);
        for _ in 0..100 {
            n.push([
                Notification::InvalInode {
                    node: 5,
                    off: 0,
                    len: 0,
                },
                ev(5, mask::MODIFY, ""),
            ]);
        }
        n.push([ev(2, mask::CREATE, "f"), ev(2, mask::DELETE, "f")]);
        n.push([ev(2, mask::CREATE, "f")]);
        let out = drain(&n);
        assert_eq!(
            out.len(),
            5,
            "one inval, one modify, create, delete, create"
        );
        let masks: Vec<u32> = out[2..]
            .iter()
            .map(|m| u32::from_le_bytes(m[24..28].try_into().unwrap()))
            .collect();
        assert_eq!(masks, [mask::CREATE, mask::DELETE, mask::CREATE]);
        // Delivered ones no longer hold the next back.
        n.push([ev(5, mask::MODIFY, "")]);
        assert_eq!(n.len(), 1);
        assert_eq!(n.stats().coalesced, 198);
    }

    #[test]
    fn a_queue_nobody_drains_stays_bounded_and_ends_in_one_epoch() {
        let n = Notifier::new(100);
        n.set_live(true);
        for i in 0..100_000u64 {
            n.push([ev(1, mask::CREATE, &format!("f{i}"))]);
        }
        assert!(n.len() <= 100);
        let out = drain(&n);
        assert_eq!(i32::from_le_bytes(out[0][4..8].try_into().unwrap()), 8);
        assert!(out.len() <= 100);
        assert!(n.stats().overflows >= 1);
    }

    #[test]
    fn a_stale_session_starts_with_one_epoch_and_keeps_what_follows() {
        let n = Notifier::new(16);
        n.mark_stale();
        n.set_live(true);
        n.push([ev(1, mask::CREATE, "a")]);
        let out = drain(&n);
        assert_eq!(out.len(), 2, "the epoch, then the event pushed after it");
        assert_eq!(i32::from_le_bytes(out[0][4..8].try_into().unwrap()), 8);
        assert_eq!(i32::from_le_bytes(out[1][4..8].try_into().unwrap()), 128);
        assert!(n.is_empty());
    }

    #[test]
    fn the_transport_is_woken_once_per_empty_to_busy() {
        let n = Notifier::new(16);
        n.set_live(true);
        let woken = Arc::new(AtomicU64::new(0));
        let w = woken.clone();
        n.set_waker(Box::new(move || {
            w.fetch_add(1, Ordering::SeqCst);
        }));
        n.push([ev(1, mask::CREATE, "a")]);
        n.push([ev(1, mask::CREATE, "b")]);
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        drain(&n);
        n.push([ev(1, mask::CREATE, "c")]);
        assert_eq!(woken.load(Ordering::SeqCst), 2);
    }
}
