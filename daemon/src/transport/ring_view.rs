//! A vring's index fields as host pointers, resolved once per memory table and ring layout
//! instead of at every access.
//!
//! A queue thread's turn reads the avail index (every pop, the last one finding the ring
//! empty; the check after re-enabling notifications), reads `used_event` (the EVENT_IDX
//! check before a signal) and writes `avail_event` (re-enabling notifications). Through
//! vm-memory each of those finds the region, builds a slice and bounds-checks it: with 4
//! request queues on one thread that was about half of each turn's ~800 instructions of ring
//! work (bench/HISTORY.md, 2026-11-28). Here the fields are resolved once and read or written
//! with single atomic accesses, as the virtio spec's split ring wants them (the avail index
//! with Acquire, the stores the guest must see ordered by the caller's fence).
//!
//! The guest is untrusted: every value read is only a number to bound (the avail index
//! against the ring size, a head against the table size by the walk), never a pointer.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use vhost_user_backend::bitmap::BitmapMmapRegion;
use virtio_queue::{Queue, QueueT};
use vm_memory::bitmap::Bitmap;
use vm_memory::{
    Address, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress,
};

use super::vhost_user::GuestMemoryLogged;

/// Split-ring layout (virtio 1.x, 2.7): the avail ring is `flags, idx, ring[size],
/// used_event` (u16 each); the used ring is `flags, idx, ring[size] (8 bytes each),
/// avail_event`.
const AVAIL_HEADER: u64 = 4;
const USED_HEADER: u64 = 4;
const USED_ELEM: u64 = 8;

/// What a view was resolved for: it is used only while all of these still hold.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Layout {
    avail_ring: u64,
    used_ring: u64,
    size: u16,
}

impl Layout {
    fn of(q: &Queue) -> Self {
        Layout {
            avail_ring: q.avail_ring(),
            used_ring: q.used_ring(),
            size: q.size(),
        }
    }
}

/// The host pointers of one vring's avail ring and `avail_event`.
struct Ptrs {
    /// The avail ring's first u16 (`flags`); `idx` is at `[1]`, the ring at `[2..2 + size]`,
    /// `used_event` at `[2 + size]`.
    avail: *const AtomicU16,
    /// The used ring's `avail_event`.
    avail_event: *const AtomicU16,
    /// The migration log's bitmap at `avail_event` (a store there is logged as vm-memory's
    /// own stores are).
    avail_event_log: BitmapMmapRegion,
}

/// A vring's ring fields resolved in one memory table (kept in the vring's
/// [`super::queue_state::QueueState`], used under its lock).
pub(super) struct RingView {
    /// The memory table the pointers point into, held: its regions stay mapped while the
    /// view lives (`update_memory` drops the views of a replaced table).
    mem: Arc<GuestMemoryLogged>,
    layout: Layout,
    /// `None` where the rings do not lie inside one region each or are misaligned: the
    /// vring is then served through vm-memory, as before.
    ptrs: Option<Ptrs>,
    /// An avail index beyond the ring was logged (once per view).
    warned: bool,
}

// SAFETY: the raw pointers point into the mappings of `mem`, an `Arc` this value holds (so
// they stay mapped wherever the value moves), and are only ever accessed through atomics;
// the bitmap is `Send`.
unsafe impl Send for RingView {}

impl RingView {
    /// Resolves `q`'s rings in `mem`.
    fn new(mem: Arc<GuestMemoryLogged>, q: &Queue) -> Self {
        let layout = Layout::of(q);
        let ptrs = Self::resolve(&mem, layout);
        RingView {
            mem,
            layout,
            ptrs,
            warned: false,
        }
    }

    fn resolve(mem: &GuestMemoryLogged, l: Layout) -> Option<Ptrs> {
        if l.size == 0 || l.avail_ring == 0 || l.used_ring == 0 {
            return None;
        }
        // flags, idx, ring[size], used_event.
        let avail_len = AVAIL_HEADER + 2 * u64::from(l.size) + 2;
        let avail = host_range(mem, l.avail_ring, avail_len)?.0;
        let event_at = l
            .used_ring
            .checked_add(USED_HEADER + USED_ELEM * u64::from(l.size))?;
        let (avail_event, region, off) = host_range(mem, event_at, 2)?;
        if avail as usize % 2 != 0 || avail_event as usize % 2 != 0 {
            return None;
        }
        Some(Ptrs {
            avail: avail.cast(),
            avail_event: avail_event.cast(),
            avail_event_log: region.bitmap().slice_at(off),
        })
    }

    /// Whether this view was resolved in `mem` for `q`'s present layout.
    fn fits(&self, mem: &GuestMemoryLogged, q: &Queue) -> bool {
        std::ptr::eq(Arc::as_ptr(&self.mem), mem) && self.layout == Layout::of(q)
    }

    /// The view of `q` in `mem` kept in `slot`, resolved again when the memory table or the
    /// ring's layout changed since; `None` where the rings cannot be read through pointers.
    pub(super) fn of<'s>(
        slot: &'s mut Option<RingView>,
        mem: &vm_memory::atomic::GuestMemoryLoadGuard<GuestMemoryLogged>,
        q: &Queue,
    ) -> Option<&'s mut RingView> {
        if !slot.as_ref().is_some_and(|v| v.fits(mem, q)) {
            *slot = Some(RingView::new(mem.clone().into_inner(), q));
        }
        slot.as_mut().filter(|v| v.ptrs.is_some())
    }

    fn ptrs(&self) -> &Ptrs {
        // `of` hands out only views with pointers.
        self.ptrs.as_ref().expect("a view with pointers")
    }

    fn avail_at(&self, i: usize) -> &AtomicU16 {
        debug_assert!(i < 3 + usize::from(self.layout.size));
        // SAFETY: `avail` maps the avail ring's 3 + size u16 fields (checked in `resolve`,
        // inside one region of `mem`, which this view holds mapped), 2-aligned (checked
        // there); callers pass i < 3 + size. The guest writes the ring concurrently: the
        // accesses are atomic.
        unsafe { &*self.ptrs().avail.add(i) }
    }

    /// The guest's avail index (Acquire: the ring entries it publishes are read after it).
    pub(super) fn avail_idx(&self) -> u16 {
        u16::from_le(self.avail_at(1).load(Ordering::Acquire))
    }

    /// The head the guest put at avail position `pos` (any value: the walk bounds it).
    pub(super) fn avail_entry(&self, pos: u16) -> u16 {
        let i = usize::from(pos % self.layout.size);
        u16::from_le(self.avail_at(2 + i).load(Ordering::Acquire))
    }

    /// The guest's `used_event` (EVENT_IDX): signal once the used index passes it.
    pub(super) fn used_event(&self) -> u16 {
        let i = 2 + usize::from(self.layout.size);
        u16::from_le(self.avail_at(i).load(Ordering::Relaxed))
    }

    /// Writes `avail_event` (EVENT_IDX: the guest kicks once its avail index passes it),
    /// logged for a migration; the caller fences before reading the avail index again.
    pub(super) fn set_avail_event(&self, v: u16) {
        let p = self.ptrs();
        // SAFETY: `avail_event` maps the 2 bytes of the used ring's `avail_event` inside one
        // region of `mem` (held mapped by this view), 2-aligned (both checked in `resolve`).
        let field = unsafe { &*p.avail_event };
        field.store(v.to_le(), Ordering::Relaxed);
        p.avail_event_log.mark_dirty(0, 2);
    }

    /// Logs an avail index the guest moved more than a ring ahead, once per view.
    pub(super) fn warn_bad_index(&mut self, queue: usize, avail: u16, next: u16) {
        if !self.warned {
            self.warned = true;
            log::warn!(
                "queue {queue}: the guest's avail index {avail} is more than the ring's {} \
                 entries past {next}; not served until it is back in range",
                self.layout.size
            );
        }
    }
}

/// The host address of `len` bytes at guest address `addr` when they lie inside one region
/// of `mem`, with that region and the offset in it.
fn host_range(
    mem: &GuestMemoryLogged,
    addr: u64,
    len: u64,
) -> Option<(
    *mut u8,
    &vm_memory::GuestRegionMmap<BitmapMmapRegion>,
    usize,
)> {
    let region = mem.find_region(GuestAddress(addr))?;
    let off = addr.checked_sub(region.start_addr().raw_value())?;
    if off.checked_add(len)? > region.len() {
        return None;
    }
    let p = region.get_host_address(MemoryRegionAddress(off)).ok()?;
    Some((p, region, usize::try_from(off).ok()?))
}

/// The guest's `used_event` of `q` read through vm-memory (a vring without a view); `None`
/// where it cannot be read.
pub(super) fn used_event_slow(mem: &GuestMemoryLogged, q: &Queue) -> Option<u16> {
    use vm_memory::Bytes;
    let off = AVAIL_HEADER + 2 * u64::from(q.size());
    let at = q.avail_ring().checked_add(off)?;
    mem.load::<u16>(GuestAddress(at), Ordering::Relaxed)
        .ok()
        .map(u16::from_le)
}

/// Whether the guest's avail index `avail` says requests wait past `next` (the next position
/// to pop) in a ring of `size`: an index more than a ring ahead is the guest breaking the
/// ring's rules, nothing to serve (virtio-queue refuses to pop there), so no reason to stay
/// awake: a thread that took it for work would spin on a ring it never pops.
pub(super) fn requests_waiting(avail: u16, next: u16, size: u16) -> bool {
    let n = avail.wrapping_sub(next);
    n != 0 && n <= size
}

/// Whether a guest must be signalled after `added` used entries up to `next_used`, given its
/// `used_event` (EVENT_IDX; `None`: unreadable, so signal). The caller fences (SeqCst)
/// between its used-ring stores and reading `used_event`. The same test as virtio-queue's
/// and Linux's `vring_need_event`: `used_event` lies in the entries added since the last
/// check, in wrapping u16 order.
pub(super) fn needs_signal(used_event: Option<u16>, next_used: u16, added: u16) -> bool {
    let Some(e) = used_event else { return true };
    next_used.wrapping_sub(e).wrapping_sub(1) < added
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_test_matches_the_spec() {
        // used_event 4: signal once the used index passes 4 (index 5 published).
        assert!(needs_signal(Some(4), 5, 1));
        assert!(!needs_signal(Some(4), 4, 1));
        assert!(needs_signal(Some(4), 8, 4), "passed within the batch");
        assert!(!needs_signal(Some(9), 8, 4), "not reached yet");
        assert!(!needs_signal(Some(2), 8, 4), "passed before the batch");
        // Wrapping.
        assert!(needs_signal(Some(u16::MAX), 1, 2));
        assert!(needs_signal(None, 1, 0), "unreadable: signal");
        assert!(!needs_signal(Some(0), 0, 0), "nothing added");
    }

    #[test]
    fn an_index_beyond_the_ring_is_no_request() {
        assert!(!requests_waiting(5, 5, 16));
        assert!(requests_waiting(6, 5, 16));
        assert!(requests_waiting(21, 5, 16), "a full ring");
        assert!(!requests_waiting(22, 5, 16), "more than a ring ahead");
        assert!(!requests_waiting(4, 5, 16), "behind");
        assert!(requests_waiting(3, u16::MAX - 2, 16), "wrapping");
    }
}
