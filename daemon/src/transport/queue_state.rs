//! One vring's requests between pop and completion: the in-flight counts that bound and
//! drain it, and the used-ring completions with their batched notifications.

use std::io;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use vhost_user_backend::VringT;
use virtio_queue::QueueT;

use super::ring_records::RingRecords;
use super::ring_view::{needs_signal, requests_waiting, used_event_slow, RingView};
use super::vhost_user::{FsVring, GuestMem, Mem};
use super::worker_pool::Look;

/// Completions held back at most before the guest is notified.
const MAX_UNSIGNALLED: usize = 32;

/// Requests of one vring between pop and completion.
#[derive(Default)]
pub(super) struct QueueState {
    /// Bumped when the device resets: a chain popped in one epoch is never completed in
    /// another (a rebooted guest has new rings there).
    pub(super) epoch: u64,
    /// Popped and not yet completed.
    pub(super) inflight: usize,
    /// Of those, requests that may block indefinitely (they never hold back a notification).
    pub(super) blocking: usize,
    /// Used entries added since the guest was last notified, or since the last EVENT_IDX
    /// check that found no signal due (what Linux and virtio-queue call `num_added`: every
    /// check of this vring is ours, [`signal_needed`], so the count is exact).
    pub(super) unsignalled: usize,
    /// The vring's ring fields as host pointers, for the queue thread ([`RingView`]).
    pub(super) view: Option<RingView>,
    /// Threads waiting on `drained` and on `space`. A `Condvar` notify is a futex system
    /// call even with no waiter; with these counts (kept under the same lock as the waits)
    /// a completion notifies only when someone waits: two system calls less per request.
    pub(super) drain_waiters: usize,
    pub(super) space_waiters: usize,
}

/// One vring's request bookkeeping, shared with the threads that serve its requests.
#[derive(Default)]
pub(super) struct QueueShared {
    pub(super) state: Mutex<QueueState>,
    /// The queue thread's look before sleeping.
    pub(super) look: Look,
    /// Signalled when `inflight` drops to 0.
    pub(super) drained: Condvar,
    /// Signalled on each completion: a worker holding back at the in-flight bound goes on.
    pub(super) space: Condvar,
    /// With `--restartable`: the vring's records, and its index there.
    pub(super) records: OnceLock<(Arc<RingRecords>, usize)>,
}

impl QueueShared {
    pub(super) fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts a served request into the used ring, unless the device was reset since it was
    /// popped, and notifies the guest when due. `in_batch`: the caller notifies at the end
    /// of its batch, so only a long batch needs a notification now. (Notifying as soon as an
    /// EVENT_IDX guest asks, as virtiofsd does, measured 0.7x on 4 KiB READ at depth 16: the
    /// driver wakes once per request instead of once per batch.)
    /// `atomic`: the guest memory where the guest's `used_event` is read when a signal may be
    /// due.
    pub(super) fn complete(&self, vring: &FsVring, done: Done, in_batch: bool, atomic: &GuestMem) {
        let mut s = self.lock();
        s.inflight = s.inflight.saturating_sub(1);
        if s.space_waiters > 0 {
            self.space.notify_one();
        }
        if done.blocking {
            s.blocking = s.blocking.saturating_sub(1);
        }
        let records = self.records.get();
        if s.epoch != done.epoch {
            log::info!("request finished after a device reset; not completed");
        } else if let Err(e) = {
            if let Some((r, i)) = records {
                r.completing(*i, done.head, vring.get_ref().get_queue().next_used());
            }
            vring.add_used(done.head, done.used)
        } {
            log::error!("cannot complete request {}: {e}", done.head);
        } else {
            s.unsignalled += 1;
            let others_running = s.inflight - s.blocking > 0;
            let due = if in_batch {
                s.unsignalled >= MAX_UNSIGNALLED
            } else {
                done.blocking || !others_running || s.unsignalled >= MAX_UNSIGNALLED
            };
            if due {
                let mem = vm_memory::GuestAddressSpace::memory(atomic);
                signal_due(vring, &mut s, &mem);
            }
        }
        if let Some((r, i)) = records {
            r.completed(*i, done.head);
        }
        if s.inflight == 0 && s.unsignalled == 0 && s.drain_waiters > 0 {
            self.drained.notify_all();
        }
    }

    /// Notifies the guest of completions held back by a batch; `mem`: the queue thread's
    /// view of guest memory, where the guest's `used_event` is read (through the vring's
    /// [`RingView`]).
    pub(super) fn flush(&self, vring: &FsVring, mem: &Mem) {
        let mut s = self.lock();
        if s.unsignalled > 0 {
            signal_due(vring, &mut s, mem);
        }
        if s.inflight == 0 && s.drain_waiters > 0 {
            self.drained.notify_all();
        }
    }
}

/// A served request, ready for the used ring.
pub(super) struct Done {
    pub(super) head: u16,
    pub(super) used: u32,
    pub(super) epoch: u64,
    pub(super) blocking: bool,
}

/// Whether the guest must be signalled for the used entries `s` holds back, which it counts
/// as signalled from now on: if it asked to be (EVENT_IDX: its `used_event` among them),
/// always without EVENT_IDX. `vq`: the vring's queue, under its lock; `used_event` is read
/// through the vring's kept [`RingView`] (through vm-memory in `mem` where the rings cannot
/// be). Every check of a request vring is this one, under its [`QueueShared`] lock, so
/// [`QueueState::unsignalled`] counts exactly the entries since the last. (virtio-queue's
/// `needs_notification` keeps a count of its own that only its own checks reset: the two
/// must not be mixed.)
pub(super) fn signal_needed(s: &mut QueueState, vq: &virtio_queue::Queue, mem: &Mem) -> bool {
    let added = std::mem::take(&mut s.unsignalled);
    if added == 0 {
        return false;
    }
    if !vq.event_idx_enabled() {
        return true;
    }
    // The used entries and index stored before `used_event` is read (the driver stores
    // `used_event` before it reads the used index: one of the two sees the other).
    fence(Ordering::SeqCst);
    let event = match RingView::of(&mut s.view, mem, vq) {
        Some(r) => Some(r.used_event()),
        None => used_event_slow(mem, vq),
    };
    // More than 65,535 entries without a check cannot happen (at most a ring's worth is in
    // flight, MAX_UNSIGNALLED are held back); saturate anyway: signal.
    let added = u16::try_from(added).unwrap_or(u16::MAX);
    needs_signal(event, vq.next_used(), added)
}

/// [`signal_needed`] for `vring`, and the signal.
fn signal_due(vring: &FsVring, s: &mut QueueState, mem: &Mem) {
    let yes = signal_needed(s, vring.get_ref().get_queue(), mem);
    if yes {
        signal(vring);
    }
}

/// Signals the guest (its used ring moved); a failure is logged.
pub(super) fn signal(vring: &FsVring) {
    if let Err(e) = vring.signal_used_queue() {
        log::warn!("cannot notify the guest: {e}");
    }
}

/// Signals the guest if it asked to be (EVENT_IDX) or always without EVENT_IDX, by
/// virtio-queue's own count (the notification queue's: no other check of that vring).
pub(super) fn notify(vring: &FsVring) {
    let res = vring.needs_notification().map_err(io::Error::other);
    if let Err(e) = res.and_then(|yes| {
        if yes {
            vring.signal_used_queue()
        } else {
            Ok(())
        }
    }) {
        log::warn!("cannot notify the guest: {e}");
    }
}

/// Re-enables the guest's notifications of `vring` (EVENT_IDX: `avail_event` set to the next
/// position to pop) and says whether requests arrived meanwhile (the avail index moved past
/// it, by a ring at most: [`requests_waiting`]): then the caller serves them instead of
/// sleeping.
pub(super) fn enable_notification(q: &QueueShared, vring: &FsVring, mem: &Mem) -> io::Result<bool> {
    let mut s = q.lock();
    let v = vring.get_ref();
    let queue = v.get_queue();
    match RingView::of(&mut s.view, mem, queue) {
        Some(r) if queue.event_idx_enabled() => {
            let next = queue.next_avail();
            r.set_avail_event(next);
            // The store before the avail index is read again (virtio-queue and Linux fence
            // here): a kick the guest decided against is then seen here.
            fence(Ordering::SeqCst);
            Ok(requests_waiting(r.avail_idx(), next, queue.size()))
        }
        _ => {
            drop(v);
            drop(s);
            if !vring.enable_notification().map_err(io::Error::other)? {
                return Ok(false);
            }
            let v = vring.get_ref();
            let queue = v.get_queue();
            Ok(queue
                .avail_idx(&**mem, Ordering::Acquire)
                .is_ok_and(|a| requests_waiting(a.0, queue.next_avail(), queue.size())))
        }
    }
}
