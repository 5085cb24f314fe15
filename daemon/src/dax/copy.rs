//! Copy slots: read-only guest mappings served from a copy of the file range in one memfd the
//! size of the window, so that a window that churns stops changing the frontend's memory map
//! on every miss.
//!
//! Every direct placement costs a `SHMEM_MAP` and, when the guest recycles the range, a
//! `SHMEM_UNMAP`: each is a change of QEMU's memory map under its big lock plus a synchronous
//! `ADD_MEM_REG`/`REM_MEM_REG` into every vhost-user backend (1-2 ms each under TCG). A copy
//! slot is the guest's range (2 MiB, or the guest's `dax_range=`: smaller in small windows,
//! larger in large ones) of [`Slots`] at the same offset as in the window (slot offset =
//! window offset), filled with `pread` from the file (zeros past EOF). When the guest removes
//! it, the frontend mapping stays ("parked": the guest no longer maps it, and what it holds is
//! data the guest was allowed to read). A later read-only SETUPMAPPING of the same window range
//! refills the memfd in place: no frontend round trip at all.
//!
//! The price is coherence: a copy is a point in time. `DaxWindow` refreshes it when the file
//! changes as seen at the request path's sync points (see ARCHITECTURE.md, "DAX copy slots").

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::str::FromStr;
use std::time::{Duration, Instant};

/// When read-only guest mappings are placed as copy slots (`--dax-copy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CopyMode {
    /// Only while the window churns ([`CHURN_PER_SECOND`]); direct otherwise.
    #[default]
    Auto,
    /// Every read-only mapping of a file the daemon may map directly.
    Always,
    /// Never: every read-only mapping is direct (or a snapshot, as without copy slots).
    Off,
}

impl FromStr for CopyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(CopyMode::Auto),
            "always" => Ok(CopyMode::Always),
            "off" => Ok(CopyMode::Off),
            _ => Err(format!(
                "invalid DAX copy mode {s:?}: use auto, always or off"
            )),
        }
    }
}

impl std::fmt::Display for CopyMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CopyMode::Auto => "auto",
            CopyMode::Always => "always",
            CopyMode::Off => "off",
        })
    }
}

/// Guest ranges removed per second above which `auto` places read-only mappings as copies
/// (only removals from a window at least 3/4 held count: an emptying window is not churn).
///
/// A window whose working set fits recycles nothing once warm (0 removals per second in the
/// in-window bench cells); a uniform random sweep of 4x a 64 MiB window removed several
/// hundred ranges per second, each removal and each new map a 1-2 ms change of QEMU's memory
/// map under TCG. At 32 removals per second the frontend spends 64-128 ms of every second in
/// those map changes, against about 10 ms of `pread` to fill 32 copies of 2 MiB on the host:
/// past that rate copies win, below it DAX's zero-copy, coherent mappings are kept.
pub const CHURN_PER_SECOND: u64 = 32;

/// How long after the last churn a read-only map onto a parked slot still refills it in place
/// under `auto`: a job that follows a churning one (the window still full of parked copies)
/// would otherwise pay three frontend memory-map changes per map (the parked slot out, the
/// file and its tail in) where a refill costs one `pread`.
pub const CHURN_LINGER: Duration = Duration::from_secs(10);

/// Guest removals in a sliding second (two one-second buckets, the older one weighted by how
/// much of it still falls inside the last second).
#[derive(Debug)]
pub struct Churn {
    start: Instant,
    cur: u64,
    prev: u64,
    /// When the rate was last seen above [`CHURN_PER_SECOND`].
    hot_at: Option<Instant>,
}

impl Default for Churn {
    fn default() -> Self {
        Churn {
            start: Instant::now(),
            cur: 0,
            prev: 0,
            hot_at: None,
        }
    }
}

impl Churn {
    fn roll(&mut self, now: Instant) {
        let el = now.saturating_duration_since(self.start);
        if el >= Duration::from_secs(2) {
            self.prev = 0;
            self.cur = 0;
            self.start = now;
        } else if el >= Duration::from_secs(1) {
            self.prev = self.cur;
            self.cur = 0;
            self.start += Duration::from_secs(1);
        }
    }

    /// Counts `n` guest ranges removed now.
    pub fn note(&mut self, n: u64) {
        self.roll(Instant::now());
        self.cur = self.cur.saturating_add(n);
    }

    /// Whether the window churns now (more than [`CHURN_PER_SECOND`] removals in the last
    /// second).
    pub fn hot(&mut self) -> bool {
        let hot = self.rate() > CHURN_PER_SECOND;
        if hot {
            self.hot_at = Some(Instant::now());
        }
        hot
    }

    /// Whether the window churned within the last `within`.
    pub fn hot_within(&mut self, within: Duration) -> bool {
        self.hot() || self.hot_at.is_some_and(|t| t.elapsed() < within)
    }

    /// Removals in the last second (estimated).
    pub fn rate(&mut self) -> u64 {
        let now = Instant::now();
        self.roll(now);
        let frac = now
            .saturating_duration_since(self.start)
            .as_secs_f64()
            .min(1.0);
        self.cur + (self.prev as f64 * (1.0 - frac)) as u64
    }
}

/// What a copy was taken from: when any of it moved, the copy is stale.
///
/// Most writes stamp a file with the kernel's coarse clock, so two writes within one clock
/// tick can leave the same size, mtime and ctime. A signature therefore proves "unchanged
/// since" only when it is *settled*: its ctime lies before the coarse clock read just before
/// the `fstat`, so any later change gets a later ctime (git's "racily clean" rule). One taken
/// in the tick of the file's last change proves nothing, and the caller reads the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopySig {
    pub size: i64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
    pub settled: bool,
}

impl CopySig {
    /// The file's signature now. Take it *before* reading the bytes it is to vouch for.
    pub fn of(file: &File) -> io::Result<CopySig> {
        let now = crate::sys::coarse_realtime()?;
        let st = crate::sys::fstat(file.as_fd())?;
        let ctime = (st.st_ctime, st.st_ctime_nsec);
        Ok(CopySig {
            size: st.st_size,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime,
            settled: ctime < now,
        })
    }

    /// Whether the file cannot have changed between `earlier` and `now` (both present, the
    /// same timestamps and size, and `earlier` settled).
    pub fn unchanged(earlier: Option<CopySig>, now: Option<CopySig>) -> bool {
        match (earlier, now) {
            (Some(e), Some(n)) => {
                e.settled && (e.size, e.mtime, e.ctime) == (n.size, n.mtime, n.ctime)
            }
            _ => false,
        }
    }
}

/// The memfd behind every copy slot: as large as the window, slot offset = window offset.
/// Pages exist only where slots were filled, so it never holds more than the window's size.
///
/// The daemon never maps it: a fill is a `pread` from the file into a bounded buffer and a
/// `pwrite` into the memfd, a free punches the pages out. So no memory of this process is
/// shared with the frontend through it (the guest may store into a slot the frontend maps
/// writable while the daemon fills or frees it, a reset or DESTROY frees parked slots without
/// a claim: neither touches memory the daemon reads or writes), and its pages never count in
/// the daemon's resident set.
pub struct Slots {
    memfd: File,
    size: u64,
}

impl Slots {
    /// A memfd of `size` bytes (nothing allocated until filled).
    pub fn new(size: u64) -> io::Result<Slots> {
        Self::named(c"daxfsd-copy-slots", size)
    }

    /// [`Slots::new`] with the memfd named `name` (for `/proc/PID/fd`).
    pub fn named(name: &std::ffi::CStr, size: u64) -> io::Result<Slots> {
        let memfd = super::memfd::memfd(name, size)?;
        // As large as the window for good: the frontend maps all of it (the pool).
        super::memfd::add_seals(&memfd, libc::F_SEAL_GROW | libc::F_SEAL_SEAL)?;
        Ok(Slots { memfd, size })
    }

    /// The slots of a memfd a server before this one made for a window of `size` bytes.
    pub fn from_memfd(memfd: File, size: u64) -> io::Result<Slots> {
        let st = crate::sys::fstat(memfd.as_fd())?;
        if (st.st_size.max(0) as u64) < size {
            return Err(io::Error::other(
                "the pool memfd is smaller than the window",
            ));
        }
        Ok(Slots { memfd, size })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// The memfd, for reads and writes at slot offsets.
    pub fn file(&self) -> &File {
        &self.memfd
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    fn check(&self, at: u64, len: u64) -> io::Result<()> {
        match at.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }

    /// Fills `[at, at + len)` with the file's bytes from `foffset`, zeros past its end.
    /// Returns the file bytes copied. The caller holds the range exclusively.
    pub fn fill(&self, at: u64, len: u64, file: &File, foffset: u64) -> io::Result<u64> {
        self.check(at, len)?;
        if !matches!(foffset.checked_add(len), Some(e) if i64::try_from(e).is_ok()) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let done = super::memfd::copy_range(file, foffset, &self.memfd, at, len, false)?;
        self.zero(at + done, len - done)?;
        Ok(done)
    }

    /// Copies `[at, at + len)` of `other` (a memfd of the same size) into the same range.
    pub fn copy_from(&self, other: &Slots, at: u64, len: u64) -> io::Result<()> {
        self.check(at, len)?;
        let done = super::memfd::copy_range(&other.memfd, at, &self.memfd, at, len, false)?;
        self.zero(at + done, len - done)
    }

    /// Whether `[start, end)` holds allocated pages.
    pub fn has_data(&self, start: u64, end: u64) -> bool {
        super::memfd::has_data(&self.memfd, start, end)
    }

    /// Zeros `[at, at + len)`: whole pages by punching them out of the memfd (which also
    /// frees them), the partial pages at either end by a write.
    pub fn zero(&self, at: u64, len: u64) -> io::Result<()> {
        self.check(at, len)?;
        super::memfd::zero_range(&self.memfd, at, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn modes_parse() {
        assert_eq!("auto".parse(), Ok(CopyMode::Auto));
        assert_eq!("always".parse(), Ok(CopyMode::Always));
        assert_eq!("off".parse(), Ok(CopyMode::Off));
        assert!("on".parse::<CopyMode>().is_err());
        assert_eq!(CopyMode::default().to_string(), "auto");
    }

    #[test]
    fn fill_copies_and_zero_pads() {
        let s = Slots::new(4 << 20).unwrap();
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(&[7u8; 5000], 0).unwrap();
        // Garbage from an earlier fill must not survive.
        let g = tempfile::tempfile().unwrap();
        g.write_all_at(&vec![9u8; 2 << 20], 0).unwrap();
        assert_eq!(s.fill(2 << 20, 2 << 20, &g, 0).unwrap(), 2 << 20);
        assert_eq!(s.fill(2 << 20, 2 << 20, &f, 0).unwrap(), 5000);
        let mut got = vec![1u8; 2 << 20];
        s.memfd.read_exact_at(&mut got, 2 << 20).unwrap();
        assert_eq!(&got[..5000], &[7u8; 5000][..]);
        assert!(got[5000..].iter().all(|&b| b == 0));
        assert!(s.fill(4 << 20, 4096, &f, 0).is_err(), "past the end");
        assert!(s.fill(u64::MAX - 10, 4096, &f, 0).is_err(), "overflow");
    }

    #[test]
    fn slots_are_never_mapped_into_the_daemon() {
        // Issue #20 f: the frontend maps slots writable (the pool), and a reset or DESTROY
        // frees parked slots without a claim while the guest may store into them. The
        // daemon therefore never maps the memfd itself: no store of its own can race one.
        let s = Slots::named(c"daxfsd-test-unmapped-slots", 4 << 20).unwrap();
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(&[3u8; 5000], 0).unwrap();
        s.fill(0, 2 << 20, &f, 0).unwrap();
        s.zero(0, 2 << 20).unwrap();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(
            !maps.contains("daxfsd-test-unmapped-slots"),
            "the slots' memfd is mapped into the daemon"
        );
        let mut got = vec![1u8; 8192];
        s.file().read_exact_at(&mut got, 0).unwrap();
        assert!(got.iter().all(|&b| b == 0));
    }

    #[test]
    fn churn_counts_the_last_second() {
        let mut c = Churn::default();
        assert_eq!(c.rate(), 0);
        c.note(40);
        assert!(c.rate() >= 40);
        c.start -= Duration::from_secs(3);
        assert_eq!(c.rate(), 0);
    }
}
