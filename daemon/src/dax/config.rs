//! Settings and sizes of a window: copy mode, mapping mode, range size, budget, pooled or
//! not, and its start-up description.

use std::sync::atomic::Ordering;

use super::copy::{self, CopyMode};
use super::mode::MapMode;
use super::{
    DaxWindow, WindowSink, FRONTEND_SLOT_LIMIT, MIN_GUEST_RANGE, RANGE_SIZE, RESERVED_SLOTS,
    WRITEBACK_PERIOD,
};

/// This project's hybrid guest kernels map the window over this many ranges (guest-kernel
/// patch 0010): for the start-up description only, the window learns the size from the guest.
const HYBRID_RANGES: u64 = 128;
/// The largest range those kernels map (`FUSE_DAX_RANGE_MAX`, 1 GiB).
const HYBRID_MAX_RANGE: u64 = 1 << 30;

impl<S: WindowSink> DaxWindow<S> {
    /// Sets when read-only mappings become copy slots (`--dax-copy`; `Off` until called).
    pub fn set_copy_mode(&self, mode: CopyMode) {
        self.copy_mode.store(mode as u8, Ordering::Relaxed);
    }

    /// Sets where guest mappings go (`--dax-mapping`; [`MapMode::Direct`] until called, the
    /// library's default, which the daemon's command line turns to pooled). Call it before
    /// the guest maps anything.
    pub fn set_map_mode(&self, mode: MapMode) {
        self.pool_always
            .store(mode == MapMode::Pooled, Ordering::Relaxed);
    }

    pub fn copy_mode(&self) -> CopyMode {
        match self.copy_mode.load(Ordering::Relaxed) {
            x if x == CopyMode::Auto as u8 => CopyMode::Auto,
            x if x == CopyMode::Always as u8 => CopyMode::Always,
            _ => CopyMode::Off,
        }
    }

    /// Gives the window `/proc/self/fd` (opened before the sandbox), so a snapshot of an
    /// executable can keep a read-only descriptor and follow host changes.
    pub fn set_proc_self_fd(&self, fd: std::os::fd::OwnedFd) {
        let _ = self.proc_self_fd.set(fd);
    }

    /// The guest's range size: the length of its first checked SETUPMAPPING, or a smaller one
    /// it mapped since (see [`Self::note_guest_range`]); [`RANGE_SIZE`] until it mapped one.
    pub fn guest_range(&self) -> u64 {
        match self.guest_range.load(Ordering::Relaxed) {
            0 => RANGE_SIZE,
            r => r,
        }
    }

    /// The guest's ranges in the window, of [`Self::guest_range`] bytes each.
    pub fn ranges(&self) -> usize {
        self.size.div_ceil(self.guest_range()) as usize
    }

    /// Frontend mappings kept live at most (the configured budget, at least 1).
    pub fn budget(&self) -> usize {
        self.budget.max(1)
    }

    /// Whether new guest mappings are served from the pool: `--dax-mapping pooled` (the
    /// daemon's default: no SHMEM request after the first, see [`super::mode`]), the pool is
    /// in the frontend already, or the window has more guest ranges than the budget (a guest
    /// that maps all of them one frontend mapping each would pass QEMU's memory slots: 2 MiB
    /// ranges from 1 GiB up; the hybrid guest kernel's ranges, the window over 128, never).
    /// The guest's range size is learnt from its first SETUPMAPPING before it is decided,
    /// which is the first time this is asked for a mapping. Pooled, the whole
    /// window is one frontend mapping of [`Slots`](super::copy::Slots) (slot offset = window offset), made at the
    /// first SETUPMAPPING; each guest mapping is a copy of its file range there, merged back
    /// into the file at the sync points when writable (as a merged shadow). So no guest
    /// mapping is ever refused for the budget, whatever the window's size and the guest's
    /// range size; the price is a copy per SETUPMAPPING instead of a zero-copy mapping, and
    /// guest stores reach the file at the sync points (at most [`WRITEBACK_PERIOD`] later).
    pub fn pooled(&self) -> bool {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        self.pool_always.load(Ordering::Relaxed)
            || t.pool == Some(t.gen)
            || self.ranges() > self.budget()
    }

    /// Learns the guest's range size from a SETUPMAPPING inside the window (checked by the
    /// caller): a range is a power of two from [`MIN_GUEST_RANGE`] to the window's size at a
    /// multiple of its size. The first such mapping sets it, larger or smaller than
    /// [`RANGE_SIZE`] (the hybrid guest kernel maps 8 MiB ranges in a 1 GiB window: 128, within
    /// the budget, so the window can be direct); any later smaller one lowers it, for the
    /// daemon's life.
    ///
    /// The guest is untrusted, and what it shows here never lets the frontend hold more than
    /// the budget: [`Self::reserve`] grants no frontend mapping past it whatever the range
    /// size, and the pool goes into the frontend only while the window holds no mapping of
    /// its own. A guest that shows large ranges and then maps smaller ones (more of them than
    /// the budget) gets its new mappings placed directly until the budget is reached, then
    /// ENOSPC, until its mappings are gone and the pool takes over: as a guest going from
    /// 2 MiB to 256 KiB ranges always did.
    pub(super) fn note_guest_range(&self, moffset: u64, len: u64) {
        if !(len.is_power_of_two()
            && len >= MIN_GUEST_RANGE
            && len <= self.size
            && moffset % len == 0)
        {
            return;
        }
        let before = match self.guest_range.compare_exchange(
            0,
            len,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => {
                let ranges = self.size.div_ceil(len) as usize;
                log::info!(
                    "the guest maps {} KiB DAX ranges: {ranges} of them fit the window, {} the budget of {} frontend mappings",
                    len >> 10,
                    if ranges > self.budget() { "more than" } else { "within" },
                    self.budget()
                );
                return;
            }
            Err(_) => self.guest_range.fetch_min(len, Ordering::Relaxed),
        };
        let ranges = self.size.div_ceil(len) as usize;
        if len < before && ranges > self.budget() {
            log::info!(
                "the guest maps {} KiB DAX ranges: {ranges} of them fit the window, more than the budget of {} frontend mappings: new mappings are served from the pool once the window holds no frontend mapping (until then a mapping past the budget is refused with ENOSPC)",
                len >> 10,
                self.budget()
            );
        }
    }

    /// The smallest guest range size with which the window has no more ranges than the
    /// budget: guests mapping ranges this large or larger are served direct (without
    /// `--dax-mapping pooled`).
    fn min_direct_range(&self) -> u64 {
        let mut r = MIN_GUEST_RANGE;
        while r < self.size && self.size.div_ceil(r) > self.budget() as u64 {
            r *= 2;
        }
        r
    }

    /// The start-up description: size, budget, the guest's ranges, pooled or direct (and for
    /// which range sizes).
    pub fn describe(&self) -> String {
        let known = self.guest_range.load(Ordering::Relaxed) != 0;
        let hybrid = (self.size / HYBRID_RANGES)
            .next_power_of_two()
            .clamp(MIN_GUEST_RANGE, HYBRID_MAX_RANGE)
            .min(self.size);
        let mut d = format!(
            "DAX window {} MiB, at most {} frontend mappings (QEMU 11.1's {} vhost-user memory slots less {} for guest RAM and KVM; shadow tails fold into one mapping per range when short); {}",
            self.size >> 20,
            self.budget(),
            FRONTEND_SLOT_LIMIT,
            RESERVED_SLOTS,
            if known {
                format!(
                    "the guest maps {} ranges of {} KiB",
                    self.ranges(),
                    self.guest_range() >> 10
                )
            } else {
                format!(
                    "the guest's range size is learnt from its first mapping (Linux: 2 MiB, {} ranges; this project's hybrid guest kernel: the window over {HYBRID_RANGES}, {} KiB)",
                    self.size.div_ceil(RANGE_SIZE),
                    hybrid >> 10
                )
            }
        );
        let pooled = "so the whole window is one frontend mapping of a memfd and every guest mapping a copy in it (writable ones written back at sync points, at most every";
        let secs = WRITEBACK_PERIOD.as_secs();
        let min_direct = self.min_direct_range();
        if self.pool_always.load(Ordering::Relaxed) {
            d.push_str(&format!("; pooled: --dax-mapping pooled (no SHMEM request after the first: safe to pause with QEMU 11.1.3), {pooled} {secs} s)"));
        } else if known && self.ranges() > self.budget() {
            d.push_str(&format!(
                "; pooled: more ranges than mappings, {pooled} {secs} s)"
            ));
        } else {
            d.push_str(&format!(
                "; direct: zero-copy mappings of the files (--dax-mapping direct: with QEMU 11.1.3, pausing the VM while the guest maps or unmaps can crash QEMU) while the guest's ranges are {} KiB or larger, else pooled (more ranges than mappings) once the window holds no mapping: {pooled} {secs} s)",
                min_direct >> 10
            ));
        }
        match self.copy_mode() {
            CopyMode::Off => d.push_str("; copy slots off"),
            m => d.push_str(&format!(
                "; copy slots {m} (read-only ranges copied into one memfd of at most {} MiB, the window's size{})",
                self.size >> 20,
                if m == CopyMode::Auto {
                    format!(", while the guest recycles more than {} ranges a second of a window at least 3/4 full", copy::CHURN_PER_SECOND)
                } else {
                    String::new()
                }
            )),
        }
        d
    }
}
