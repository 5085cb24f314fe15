//! Settings and sizes of a window: copy mode, mapping mode, range size, budget, pooled or not, and its
//! start-up description.

use std::sync::atomic::Ordering;

use super::copy::{self, CopyMode};
use super::mode::MapMode;
use super::{
    DaxWindow, WindowSink, FRONTEND_SLOT_LIMIT, MIN_GUEST_RANGE, RESERVED_SLOTS, WRITEBACK_PERIOD,
};

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

    /// The guest's ranges in the window: 2 MiB ranges until the guest maps a smaller aligned
    /// power-of-two range (down to [`MIN_GUEST_RANGE`]).
    pub fn ranges(&self) -> usize {
        self.size.div_ceil(self.guest_range.load(Ordering::Relaxed)) as usize
    }

    /// Frontend mappings kept live at most (the configured budget, at least 1).
    pub fn budget(&self) -> usize {
        self.budget.max(1)
    }

    /// Whether new guest mappings are served from the pool: `--dax-mapping pooled` (the
    /// daemon's default: no SHMEM request after the first, see [`super::mode`]), the pool is
    /// in the frontend already, or the window has more guest ranges than the budget (a guest that maps all
    /// of them one frontend mapping each would pass QEMU's memory slots). Pooled, the whole
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

    /// Learns the guest's range size from a checked SETUPMAPPING.
    pub(super) fn note_guest_range(&self, moffset: u64, len: u64) {
        if !(len.is_power_of_two() && len >= MIN_GUEST_RANGE && moffset % len == 0) {
            return;
        }
        let before = self.guest_range.fetch_min(len, Ordering::Relaxed);
        let ranges = self.size.div_ceil(len) as usize;
        if len < before && ranges > self.budget() {
            log::info!(
                "the guest maps {} KiB DAX ranges: {ranges} of them fit the window, more than the budget of {} frontend mappings: new mappings are served from the pool once the window holds no frontend mapping (until then a mapping past the budget is refused with ENOSPC)",
                len >> 10,
                self.budget()
            );
        }
    }

    /// The start-up description: size, ranges, budget (and a warning when the window has
    /// more ranges than QEMU's memory slots allow).
    pub fn describe(&self) -> String {
        let mut d = format!(
            "DAX window {} MiB: {} ranges of 2 MiB (up to {} when the guest maps smaller ones), at most {} frontend mappings (QEMU 11.1's {} vhost-user memory slots less {} for guest RAM and KVM; shadow tails fold into one mapping per range when short)",
            self.size >> 20,
            self.ranges(),
            self.size.div_ceil(MIN_GUEST_RANGE),
            self.budget(),
            FRONTEND_SLOT_LIMIT,
            RESERVED_SLOTS
        );
        let why = if self.pool_always.load(Ordering::Relaxed) {
            Some("--dax-mapping pooled (no SHMEM request after the first: safe to pause with QEMU 11.1.3)")
        } else if self.ranges() > self.budget() {
            Some("more ranges than mappings")
        } else {
            None
        };
        match why {
            Some(why) => d.push_str(&format!(
                "; pooled: {why}, so the whole window is one frontend mapping of a memfd and every guest mapping a copy in it (writable ones written back at sync points, at most every {} s)",
                WRITEBACK_PERIOD.as_secs()
            )),
            None => d.push_str("; direct: zero-copy mappings of the files (--dax-mapping direct: with QEMU 11.1.3, pausing the VM while the guest maps or unmaps can crash QEMU)"),
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
