//! What each vring had taken and not yet given back, in memory that outlives the process
//! (`--restartable`: the holder keeps the region and hands it to every file server it
//! starts; see `host::holder`). A server started after a crash resumes each ring where the
//! dead one left it: the next available index it would have popped, the used index the
//! guest sees, and the heads it had popped and not completed, which it serves again.
//!
//! Order of the records (each a store to shared memory, which survives the process):
//! - pop of head `h` at avail position `p`: `inflight[h] = 1`, then `last_avail = p + 1`. A
//!   death between the two leaves `avail[p] == h` flagged: [`RingRecords::resume`] counts
//!   position `p` as popped (a flagged head cannot be in the avail ring again: the guest
//!   offers a head anew only once it was used).
//! - completion of `h` with the used index `u` before it: `completing = (h, u)`, the used
//!   element and index (guest-visible), then `inflight[h] = 0` and `completing` cleared. A
//!   death in between is told apart by the guest's used index: `u + 1` means published.
//!
//! Pops and completions of one vring are serialized by the vring's lock, so one
//! `completing` slot per vring is enough.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU8, Ordering};

use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress};

use super::vhost_user::{FsVring, GuestMemoryLogged};
use super::vring_chain::ChainAt;

/// Vrings recorded: hiprio, the notification queue and 63 request queues, and one spare.
pub const MAX_VRINGS: usize = 66;
const HEADS: usize = super::vhost_user::MAX_QUEUE_SIZE;
const HEADER: usize = 4096;
const PER_VRING: usize = 2048;
/// Size of the region (the holder makes a memfd of this size).
pub const REGION_SIZE: usize = HEADER + MAX_VRINGS * PER_VRING;
const NONE: u16 = u16::MAX;

// Offsets within a vring's record.
const LIVE: usize = 0;
const LAST_AVAIL: usize = 4;
const COMPLETING_HEAD: usize = 6;
const COMPLETING_USED: usize = 8;
const INFLIGHT: usize = 16;

/// Where a dead server left a vring.
#[derive(Debug, PartialEq, Eq)]
pub struct Resumed {
    /// The next avail position to pop.
    pub next_avail: u16,
    /// Heads popped and never published into the used ring: to serve again.
    pub heads: Vec<u16>,
}

/// The shared region, mapped.
pub struct RingRecords {
    base: *mut u8,
    _fd: OwnedFd,
}

// SAFETY: the mapping is only accessed through atomics at in-bounds offsets; it lives as long
// as the value (unmapped in Drop).
unsafe impl Send for RingRecords {}
// SAFETY: as above; every access is an atomic operation.
unsafe impl Sync for RingRecords {}

impl RingRecords {
    /// Maps the region `fd` (at least [`REGION_SIZE`] bytes, shared).
    pub fn map(fd: OwnedFd) -> io::Result<Self> {
        // SAFETY: fstat only writes into `st`.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `st` a valid output location.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if (st.st_size as usize) < REGION_SIZE {
            return Err(io::Error::other("ring record region too small"));
        }
        // At least REGION_SIZE bytes (checked above); `Drop` unmaps them.
        let p = crate::sys::map_shared(fd.as_fd(), REGION_SIZE)?;
        Ok(RingRecords { base: p, _fd: fd })
    }

    fn at(&self, vring: usize, off: usize) -> *mut u8 {
        debug_assert!(vring < MAX_VRINGS && off < PER_VRING);
        // SAFETY: callers pass vring < MAX_VRINGS and off < PER_VRING (checked by `ok`), so
        // the offset is inside the REGION_SIZE mapping.
        unsafe { self.base.add(HEADER + vring * PER_VRING + off) }
    }

    fn u32(&self, vring: usize, off: usize) -> &AtomicU32 {
        // SAFETY: in bounds (see `at`), 4-aligned (the mapping is page-aligned, offsets are
        // multiples of 4), and only ever accessed atomically.
        unsafe { &*self.at(vring, off).cast::<AtomicU32>() }
    }

    fn u16(&self, vring: usize, off: usize) -> &AtomicU16 {
        // SAFETY: as `u32`, 2-aligned.
        unsafe { &*self.at(vring, off).cast::<AtomicU16>() }
    }

    fn flag(&self, vring: usize, head: u16) -> &AtomicU8 {
        // SAFETY: as `u32`; head < HEADS keeps it within the vring's record.
        unsafe {
            &*self
                .at(vring, INFLIGHT + usize::from(head))
                .cast::<AtomicU8>()
        }
    }

    fn ok(vring: usize, head: u16) -> bool {
        vring < MAX_VRINGS && usize::from(head) < HEADS
    }

    /// Head `head` was popped; `next_avail` is the position after it. The records' stores
    /// are Release: the next process reads what this one executed, in order (all that
    /// matters), at the cost of plain stores.
    pub fn popped(&self, vring: usize, head: u16, next_avail: u16) {
        if !Self::ok(vring, head) {
            return;
        }
        self.flag(vring, head).store(1, Ordering::Release);
        self.u16(vring, LAST_AVAIL)
            .store(next_avail, Ordering::Release);
    }

    /// Head `head` is about to be published at used index `used_before`.
    pub fn completing(&self, vring: usize, head: u16, used_before: u16) {
        if !Self::ok(vring, head) {
            return;
        }
        self.u16(vring, COMPLETING_USED)
            .store(used_before, Ordering::Release);
        self.u16(vring, COMPLETING_HEAD)
            .store(head, Ordering::Release);
    }

    /// Head `head` was published (or dropped by a reset).
    pub fn completed(&self, vring: usize, head: u16) {
        if !Self::ok(vring, head) {
            return;
        }
        self.flag(vring, head).store(0, Ordering::Release);
        self.u16(vring, COMPLETING_HEAD)
            .store(NONE, Ordering::Release);
    }

    /// The vring was stopped with nothing in flight (or reset): nothing to resume.
    pub fn stopped(&self, vring: usize) {
        if vring >= MAX_VRINGS {
            return;
        }
        self.u32(vring, LIVE).store(0, Ordering::SeqCst);
        for h in 0..HEADS as u16 {
            self.flag(vring, h).store(0, Ordering::Relaxed);
        }
        self.u16(vring, COMPLETING_HEAD)
            .store(NONE, Ordering::SeqCst);
    }

    /// Every vring stopped (device reset).
    pub fn reset(&self) {
        (0..MAX_VRINGS).for_each(|v| self.stopped(v));
    }

    /// This process starts `vring` (its first kick). When a previous process left it live,
    /// returns where to resume: `used_idx` is the guest's used index, `avail_at(p)` the head
    /// at avail position `p` and `avail_idx` the guest's avail index. Otherwise records it
    /// as live from `next_avail` and returns `None`.
    pub fn start(
        &self,
        vring: usize,
        next_avail: u16,
        used_idx: u16,
        avail_idx: u16,
        avail_at: impl Fn(u16) -> Option<u16>,
    ) -> Option<Resumed> {
        if vring >= MAX_VRINGS {
            return None;
        }
        if self.u32(vring, LIVE).load(Ordering::SeqCst) == 0 {
            self.stopped(vring);
            self.u16(vring, LAST_AVAIL)
                .store(next_avail, Ordering::SeqCst);
            self.u32(vring, LIVE).store(1, Ordering::SeqCst);
            return None;
        }
        let h = self.u16(vring, COMPLETING_HEAD).load(Ordering::SeqCst);
        if h != NONE && usize::from(h) < HEADS {
            let u = self.u16(vring, COMPLETING_USED).load(Ordering::SeqCst);
            if used_idx == u.wrapping_add(1) {
                self.flag(vring, h).store(0, Ordering::SeqCst);
            }
            self.u16(vring, COMPLETING_HEAD)
                .store(NONE, Ordering::SeqCst);
        }
        let mut last = self.u16(vring, LAST_AVAIL).load(Ordering::SeqCst);
        if last != avail_idx {
            if let Some(h) = avail_at(last).filter(|&h| usize::from(h) < HEADS) {
                if self.flag(vring, h).load(Ordering::SeqCst) != 0 {
                    last = last.wrapping_add(1);
                    self.u16(vring, LAST_AVAIL).store(last, Ordering::SeqCst);
                }
            }
        }
        let heads = (0..HEADS as u16)
            .filter(|&h| self.flag(vring, h).load(Ordering::SeqCst) != 0)
            .collect();
        Some(Resumed {
            next_avail: last,
            heads,
        })
    }
}

impl Drop for RingRecords {
    fn drop(&mut self) {
        // SAFETY: `base` is the REGION_SIZE mapping made in `map`, unmapped once, here.
        unsafe { libc::munmap(self.base.cast(), REGION_SIZE) };
    }
}

/// Takes vring `queue` over where a dead server left it, at this process's first look at
/// it: sets the next avail and used positions and returns the chains to serve again (`None`
/// when the vring starts fresh). `in_order`: its buffers are taken and returned in order (the
/// notification queue): the ones taken and not returned are simply taken again.
pub(super) fn take_over(
    records: &RingRecords,
    queue: usize,
    vring: &FsVring,
    mem: &GuestMemoryLogged,
    in_order: bool,
) -> Option<Vec<ChainAt>> {
    let mut v = vring.get_mut();
    let q = v.get_queue_mut();
    let used = q.used_idx(mem, Ordering::Acquire).map_or(0, |w| w.0);
    let avail = q.avail_idx(mem, Ordering::Acquire).map_or(0, |w| w.0);
    let (ring, size) = (q.avail_ring(), q.size());
    let avail_at = |p: u16| {
        let off = 4 + 2 * u64::from(p % size.max(1));
        mem.read_obj::<u16>(GuestAddress(ring + off))
            .ok()
            .map(u16::from_le)
    };
    let r = records.start(queue, q.next_avail(), used, avail, avail_at)?;
    q.set_next_used(used);
    if in_order {
        q.set_next_avail(used);
        log::info!("queue {queue}: resumed at {used}");
        return Some(Vec::new());
    }
    q.set_next_avail(r.next_avail);
    log::info!(
        "queue {queue}: resumed at avail {}; serving {} request(s) again",
        r.next_avail,
        r.heads.len()
    );
    let (table, size) = (q.desc_table(), q.size());
    Some(
        r.heads
            .iter()
            .map(|&head| ChainAt { table, size, head })
            .collect(),
    )
}

/// A new, zeroed region for the holder to keep.
pub fn new_region() -> io::Result<OwnedFd> {
    let name = c"daxfsd-ring-records";
    // SAFETY: `name` is NUL-terminated; memfd_create returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create just returned this descriptor, owned once, here.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // SAFETY: ftruncate on our own memfd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), REGION_SIZE as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records() -> RingRecords {
        RingRecords::map(new_region().unwrap()).unwrap()
    }

    #[test]
    fn a_fresh_vring_is_not_resumed_and_a_live_one_is() {
        let r = records();
        assert_eq!(r.start(2, 5, 5, 9, |_| None), None);
        r.popped(2, 7, 6);
        r.popped(2, 3, 7);
        r.completing(2, 7, 5);
        r.completed(2, 7);
        // A second process: head 3 is to serve again, from avail position 7.
        let got = r.start(2, 0, 6, 9, |_| None).unwrap();
        assert_eq!(
            got,
            Resumed {
                next_avail: 7,
                heads: vec![3]
            }
        );
    }

    #[test]
    fn a_death_between_the_flag_and_the_position_counts_the_pop_once() {
        let r = records();
        r.start(1, 0, 0, 4, |_| None);
        r.popped(1, 9, 1);
        // Died after flagging head 4 at position 1, before recording position 2.
        r.flag(1, 4).store(1, Ordering::SeqCst);
        let got = r
            .start(1, 0, 0, 4, |p| Some([9, 4, 8, 2][usize::from(p)]))
            .unwrap();
        assert_eq!(
            got,
            Resumed {
                next_avail: 2,
                heads: vec![4, 9]
            }
        );
    }

    #[test]
    fn a_death_inside_a_completion_is_told_apart_by_the_used_index() {
        let r = records();
        r.start(1, 0, 0, 2, |_| None);
        r.popped(1, 0, 1);
        r.popped(1, 1, 2);
        r.completing(1, 0, 0);
        // Published (the guest's used index moved to 1): not served again.
        assert_eq!(r.start(1, 0, 1, 2, |_| None).unwrap().heads, vec![1]);
        let r = records();
        r.start(1, 0, 0, 2, |_| None);
        r.popped(1, 0, 1);
        r.completing(1, 0, 0);
        // Not published: served again.
        assert_eq!(r.start(1, 0, 0, 2, |_| None).unwrap().heads, vec![0]);
    }

    #[test]
    fn a_stopped_vring_starts_fresh() {
        let r = records();
        r.start(0, 0, 0, 1, |_| None);
        r.popped(0, 0, 1);
        r.stopped(0);
        assert_eq!(r.start(0, 1, 1, 1, |_| None), None);
    }
}
