//! The window's counters: one list declares each [`DaxStats`] field, the counter behind it
//! (an atomic, or read from the table when asked), and its name in the log line.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{DaxWindow, WindowSink};

/// Declares the fields of [`DaxStats`] once: the struct, its [`Counters`] (a `Counted`
/// atomic, or `FromTable` for a field [`DaxWindow::stats`] reads from the table) and the
/// names [`DaxStats::fields`] gives the log line.
macro_rules! window_stats {
    ($( $(#[doc = $doc:literal])* $name:ident: $kind:ident, )*) => {
        /// Counters of a window, for logs and tests.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct DaxStats {
            $( $(#[doc = $doc])* pub $name: u64, )*
        }

        /// What the window counts as it goes, one member per [`DaxStats`] field.
        #[derive(Default)]
        pub(super) struct Counters {
            $( pub(super) $name: $kind, )*
        }

        impl Counters {
            /// The counted fields now (those read from the table are 0).
            fn load(&self) -> DaxStats {
                DaxStats {
                    $( $name: Sample::sample(&self.$name), )*
                }
            }
        }

        impl DaxStats {
            /// Every field with its name, in declaration order (the log line's order).
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$( (stringify!($name), self.$name), )*]
            }
        }
    };
}

/// A field counted by the window as it goes.
type Counted = AtomicU64;

/// A field [`DaxWindow::stats`] reads from the table: no counter of its own.
#[derive(Default)]
pub(super) struct FromTable;

/// The value of a [`Counters`] member.
trait Sample {
    fn sample(&self) -> u64;
}

impl Sample for Counted {
    fn sample(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }
}

impl Sample for FromTable {
    fn sample(&self) -> u64 {
        0
    }
}

window_stats! {
    /// SETUPMAPPINGs placed in the frontend.
    maps: Counted,
    /// Guest mappings removed (by REMOVEMAPPING, upgrades and remaps).
    unmaps: Counted,
    /// SETUPMAPPINGs over a live range (read-only -> writable upgrades and remaps).
    upgrades: Counted,
    /// Requests refused or failed (invalid, over budget, or the frontend said no).
    failures: Counted,
    /// Bytes mapped right now.
    mapped_bytes: FromTable,
    /// Mappings that needed a shadow tail (file shorter than the range).
    tails: Counted,
    /// Read-only mappings served from a snapshot.
    snapshots: Counted,
    /// Writable mappings merged into one frontend mapping for the budget.
    merged: Counted,
    /// Mappings re-placed because the file's page layout changed.
    replaced: Counted,
    /// Guest bytes written back from shadows to files.
    written_back: Counted,
    /// Host bytes copied into shadows.
    pulled: Counted,
    /// Frontend mappings live now.
    regions: FromTable,
    /// The most frontend mappings ever live.
    peak_regions: FromTable,
    /// Read-only mappings placed as copy slots (with a SHMEM_MAP).
    copies: Counted,
    /// Copy slots refilled in place: a parked slot reused, no frontend round trip.
    reused: Counted,
    /// Copy slots re-read because the file changed.
    recopied: Counted,
    /// Parked copy slots now.
    parked: FromTable,
    /// Parked slots unmapped for the budget.
    evicted: Counted,
    /// Guest mappings served from the pool (a window with more ranges than the budget).
    pooled: Counted,
    /// Regions in the frontend's memory table (guest RAM and window mappings) now: what QEMU
    /// holds against its `VHOST_USER_MAX_RAM_SLOTS`.
    table_regions: Counted,
    /// The most regions ever in the frontend's memory table.
    peak_table_regions: Counted,
    /// SHMEM requests whose memory-table update had not reached the daemon yet when the
    /// frontend acknowledged them (each waited for it before the guest got its reply).
    commit_waits: Counted,
    /// Write-backs of guest stores (shadows, pooled ranges) that failed: each recorded
    /// against its inode and reported by the next FSYNC, FLUSH and SYNCFS.
    wb_failures: Counted,
    /// Ranges of guest stores kept after a failed write-back, waiting for the next one.
    stranded: Counted,
    /// Pages of writable pooled ranges that the guest and a host process both changed
    /// between two merges: the guest's page was written whole (see `dax/baseline.rs`).
    conflicts: Counted,
    /// Host memory the pool holds now: its memfd's pages and what writable pooled ranges
    /// keep to merge with their files.
    pool_held: FromTable,
}

impl std::fmt::Display for DaxStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dax:")?;
        for (name, value) in self.fields() {
            write!(f, " {name}={value}")?;
        }
        Ok(())
    }
}

impl<S: WindowSink> DaxWindow<S> {
    /// The counters now, and what the table holds.
    pub fn stats(&self) -> DaxStats {
        let mut s = self.counters.load();
        if let Ok(t) = self.table.lock() {
            s.mapped_bytes = t.live.values().map(|p| p.len).sum();
            s.regions = t.regions as u64;
            s.peak_regions = t.peak as u64;
            s.parked = t.parked.len() as u64;
        }
        s.pool_held = self.pool_held();
        s
    }

    /// Counts a refused or failed request.
    pub(super) fn counted<T>(&self, res: io::Result<T>) -> io::Result<T> {
        if res.is_err() {
            self.counters.failures.fetch_add(1, Ordering::Relaxed);
        }
        res
    }
}
