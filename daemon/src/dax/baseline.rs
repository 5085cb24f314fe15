//! The baseline of a writable pooled range: what it and its file agreed on at the last
//! merge, kept as one keyed 64-bit hash per page instead of a second copy of its bytes
//! (issue #36: host memory bounded by what the guest maps; 8 bytes per 4 KiB page).
//!
//! The three-way merge ([`super::tail::merge`]) needs the agreed bytes of a page only where
//! the guest changed it, and then they are the file's as long as the host did not change that
//! page too:
//! - the guest's page hashes as agreed: the guest did not change it, its bytes are the
//!   agreed ones (host changes come in byte by byte);
//! - it does not, and the file's page hashes as agreed: only the guest changed it, the file's
//!   bytes are the agreed ones (the guest's runs go out byte by byte);
//! - neither does: both changed the page since the last merge. Its agreed bytes are gone, so
//!   the guest's page is written whole over the host's changes to it: a *conflict*, counted
//!   and logged. This is what a guest's page cache does to a page it dirtied in the
//!   non-DAX modes (and 9p's, NFS's); only `direct` DAX mappings, which share the host's page
//!   cache, merge a page both sides store into byte by byte.
//!
//! While the file's size and timestamps prove it unchanged since the last merge
//! ([`super::copy::CopySig`]), its bytes are the agreed ones: a merge then compares the
//! guest's bytes with the file's (exact, no hashing) and rehashes only the pages it writes.
//! Hashes decide only after the file moved, and at placement (one pass over the range).
//!
//! The hash is XXH3 (64 bits) with a random seed per range: about 20 times faster than std's
//! SipHash here, so hashing a range costs less than copying it into the pool. A guest does
//! not know the seed; a collision it still found (or a chance one, 2^-64 per changed page)
//! would hide a change of its own bytes from the merge: its own data, never another's.
//! Under `--restartable` the hashes and the seed outlive the server ([`super::kept`]).

use std::fs::File;
use std::hash::{BuildHasher, RandomState};
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::kept::HashStore;

use super::memfd::{pread_full, CHUNK};
use super::MAP_ALIGNMENT;

const PAGE: usize = MAP_ALIGNMENT as usize;

/// One hash per page of a range, for its first `valid` bytes (the last page's hash covers
/// its bytes up to there only). Updated only by the merge that claims the range.
pub(crate) struct PageHashes {
    seed: u64,
    pages: Pages,
}

/// Where a range's hashes live: its own heap, or (`--restartable`) its pages of the window's
/// [`HashStore`], which the holder keeps across a server crash.
enum Pages {
    Own(Box<[AtomicU64]>),
    Kept {
        store: Arc<HashStore>,
        first: usize,
        n: usize,
    },
}

impl PageHashes {
    /// The hashes of the first `valid` bytes of `file` from `at` (a range of `len` bytes).
    pub(crate) fn of(file: &File, at: u64, valid: u64, len: u64) -> io::Result<PageHashes> {
        let n = usize::try_from(len.div_ceil(MAP_ALIGNMENT))
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let h = PageHashes {
            // RandomState's keys come from the OS: a random seed without another crate.
            seed: RandomState::new().hash_one(at),
            pages: Pages::Own((0..n).map(|_| AtomicU64::new(0)).collect()),
        };
        h.rehash(file, at, valid)?;
        Ok(h)
    }

    /// The hashes of a range placed at window page `first` as `store` holds them (kept by
    /// a server before this one, with `seed`).
    pub(crate) fn kept(store: Arc<HashStore>, first: usize, n: usize, seed: u64) -> Self {
        PageHashes {
            seed,
            pages: Pages::Kept { store, first, n },
        }
    }

    /// These hashes moved to window page `first` of `store` (nothing else uses those pages).
    pub(crate) fn into_store(self, store: &Arc<HashStore>, first: usize) -> PageHashes {
        let n = self.slots().len();
        let to = store.hashes(first, n);
        for (d, s) in to.iter().zip(self.slots()) {
            d.store(s.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        PageHashes::kept(store.clone(), first, n, self.seed)
    }

    /// The hash's seed.
    pub(crate) fn seed(&self) -> u64 {
        self.seed
    }

    /// The store and window page of kept hashes.
    pub(crate) fn store(&self) -> Option<(&Arc<HashStore>, usize)> {
        match &self.pages {
            Pages::Own(_) => None,
            Pages::Kept { store, first, .. } => Some((store, *first)),
        }
    }

    fn slots(&self) -> &[AtomicU64] {
        match &self.pages {
            Pages::Own(p) => p,
            Pages::Kept { store, first, n } => store.hashes(*first, *n),
        }
    }

    /// Heap bytes held (kept hashes are in the window's store).
    pub(crate) fn bytes(&self) -> u64 {
        std::mem::size_of_val(self.slots()) as u64
    }

    fn hash(&self, bytes: &[u8]) -> u64 {
        xxh3_64_with_seed(bytes, self.seed)
    }

    /// Whether `bytes`, the first bytes of page `i` (as many as the agreed length leaves in
    /// it), are the agreed ones.
    pub(crate) fn agrees(&self, i: usize, bytes: &[u8]) -> bool {
        self.slots()
            .get(i)
            .is_some_and(|h| h.load(Ordering::Relaxed) == self.hash(bytes))
    }

    /// `bytes` are now the agreed bytes of page `i`.
    pub(crate) fn set(&self, i: usize, bytes: &[u8]) {
        if let Some(h) = self.slots().get(i) {
            h.store(self.hash(bytes), Ordering::Relaxed);
        }
    }

    /// Hashes bytes `[0, valid)` of the range as `file` holds them from `at`.
    fn rehash(&self, file: &File, at: u64, valid: u64) -> io::Result<()> {
        let mut buf = vec![0u8; CHUNK.min(usize::try_from(valid).unwrap_or(CHUNK))];
        let mut c = 0;
        while c < valid {
            let n = (valid - c).min(buf.len() as u64) as usize;
            let got = pread_full(file, &mut buf[..n], at + c)?;
            buf[got..n].fill(0);
            self.set_chunk(c, &buf[..n]);
            c += n as u64;
        }
        Ok(())
    }

    /// `bytes` (a page-aligned chunk at range offset `c`, ending at the agreed length or on a
    /// page boundary) are now agreed.
    pub(crate) fn set_chunk(&self, c: u64, bytes: &[u8]) {
        let first = (c / MAP_ALIGNMENT) as usize;
        for (k, page) in bytes.chunks(PAGE).enumerate() {
            self.set(first + k, page);
        }
    }

    /// `bytes` (a chunk at range offset `c`, as [`Self::set_chunk`]) are now agreed; only
    /// the pages holding byte ranges `runs` of it changed.
    pub(crate) fn set_changed(&self, c: u64, bytes: &[u8], runs: &[(usize, usize)]) {
        let first = (c / MAP_ALIGNMENT) as usize;
        let mut last = None;
        for &(s, e) in runs {
            for k in s / PAGE..e.div_ceil(PAGE) {
                if last.is_some_and(|l| l >= k) {
                    continue;
                }
                last = Some(k);
                let end = ((k + 1) * PAGE).min(bytes.len());
                self.set(first + k, &bytes[k * PAGE..end]);
            }
        }
    }

    /// Writes the agreed bytes of `[0, valid)` of a range into `dst` from 0, as far as they
    /// are known: a page the guest's bytes (`now` from `now_at`) hash as agreed is those
    /// bytes, any other one the file's (`host` from `host_at`, zeros past its end). For a
    /// shadow that takes a pooled range's bytes over (see [`super::stranded`]).
    pub(crate) fn materialize(
        &self,
        now: &File,
        now_at: u64,
        host: &File,
        host_at: u64,
        valid: u64,
        dst: &File,
    ) -> io::Result<()> {
        let mut page = vec![0u8; PAGE];
        let mut c = 0u64;
        while c < valid {
            let n = (valid - c).min(MAP_ALIGNMENT) as usize;
            now.read_exact_at(&mut page[..n], now_at + c)?;
            if !self.agrees((c / MAP_ALIGNMENT) as usize, &page[..n]) {
                let got = pread_full(host, &mut page[..n], host_at + c)?;
                page[got..n].fill(0);
            }
            dst.write_all_at(&page[..n], c)?;
            c += n as u64;
        }
        Ok(())
    }
}

/// Pages of a chunk at range offset `c` (page aligned) whose first `valid_c` bytes of
/// `now` do not hash as agreed: the guest changed them.
pub(crate) fn changed_pages(h: &PageHashes, c: u64, now: &[u8]) -> Vec<bool> {
    let first = (c / MAP_ALIGNMENT) as usize;
    now.chunks(PAGE)
        .enumerate()
        .map(|(k, page)| !h.agrees(first + k, page))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_agree_until_changed_and_keys_differ_per_range() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(&vec![3u8; 3 * PAGE + 100], 0).unwrap();
        let h = PageHashes::of(&f, 0, 3 * PAGE as u64 + 100, 4 * PAGE as u64).unwrap();
        assert_eq!(h.bytes(), 32);
        assert!(h.agrees(0, &[3u8; PAGE]));
        assert!(
            h.agrees(3, &[3u8; 100]),
            "the last page up to the agreed length"
        );
        assert!(!h.agrees(3, &[3u8; PAGE]));
        let mut p = [3u8; PAGE];
        p[17] = 4;
        assert!(!h.agrees(1, &p));
        assert_eq!(
            changed_pages(&h, 0, &[[3u8; PAGE], p].concat()),
            [false, true]
        );
        let other = PageHashes::of(&f, 0, PAGE as u64, PAGE as u64).unwrap();
        assert_ne!(
            other.slots()[0].load(Ordering::Relaxed),
            h.slots()[0].load(Ordering::Relaxed),
            "seeds are per range"
        );
    }
}
