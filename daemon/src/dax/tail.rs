//! Shadows: memfds that stand in for file bytes the frontend cannot map from the file.
//!
//! QEMU 11.1 maps a file range only when the file covers all of it, and maps every range
//! shared and writable (so it needs a read-write descriptor). Two kinds of placement use a
//! shadow memfd instead of the file:
//! - a *tail*: the part of a guest mapping past the file's last whole page (the page holding
//!   EOF, and anything after it);
//! - a *snapshot*: a whole guest range served from a copy, for read-only guest mappings of
//!   files the daemon does not map directly (see `dax::Placement`), and for writable
//!   mappings merged into one frontend mapping under the mapping budget.
//!
//! A shadow starts as a copy of the file's bytes (zero padded). [`Shadow::sync`] is a
//! three-way merge between the memfd (the guest's view), the agreed bytes (what both sides
//! agreed on at the last sync: a second memfd once a writable guest mapping uses the shadow,
//! the memfd itself before) and the file (the host's view), a chunk at a time so the heap
//! it takes does not grow with the mapping (`merge`; writable pooled ranges use it too):
//! - each run of bytes the guest changed (memfd != snapshot) is written to the file, run by
//!   run, never past the file's current end, so bytes in between keep the host's value;
//! - each byte the guest did not change but the host did (file != snapshot), and each byte
//!   the file grew by, is copied into the memfd, so the guest sees host writes and growth;
//! - bytes past a shrunken end are zeroed in the memfd.
//!
//! When the guest and the host change the same byte between two syncs the guest's store
//! wins (it is the later one as far as the daemon can tell). One shadow exists per host file
//! range, keyed on the host file `(st_dev, st_ino)` and the file offset, so every guest
//! mapping of that range (aliases through hard links or bind mounts included) shares it.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::baseline::{self, PageHashes};
use super::copy::CopySig;
use super::memfd::{copy_range, memfd, pread_full, CHUNK};
use super::MAP_ALIGNMENT;
use crate::protocol::keeper::{Keeper, Kept};

/// How a guest mapping of `len` bytes at file offset `foffset` splits for a file of
/// `file_size` bytes: `(file_len, valid)`, the bytes mapped from the file (whole pages) and
/// the bytes of real file data in the tail after them (less than a page).
pub fn layout(file_size: u64, foffset: u64, len: u64) -> (u64, u64) {
    let in_file = file_size.saturating_sub(foffset);
    let file_len = (in_file / MAP_ALIGNMENT * MAP_ALIGNMENT).min(len);
    let valid = if file_len == len {
        0
    } else {
        (in_file - file_len).min(len - file_len)
    };
    (file_len, valid)
}

/// Key of a shadow: host file `(st_dev, st_ino)`, file offset of its first byte, and whether
/// it is a whole-range snapshot (a tail and a snapshot of the same bytes are different
/// frontend mappings and never share a memfd).
pub type ShadowKey = (u64, u64, u64, bool);

/// What one [`Shadow::sync`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Synced {
    /// Guest bytes written to the file.
    pub written: u64,
    /// Host bytes copied into the memfd.
    pub pulled: u64,
    /// Pages both sides changed since the last merge whose agreed bytes were not kept
    /// (see [`super::baseline`]): the guest's page was written whole.
    pub conflicts: u64,
}

/// One side of a three-way merge: `len` bytes of a file at an offset.
#[derive(Clone, Copy)]
pub(crate) struct Span<'a> {
    pub file: &'a File,
    pub at: u64,
}

/// What a merge knows of the agreed bytes.
#[derive(Clone, Copy)]
pub(crate) enum Agreed<'a> {
    /// The bytes themselves (a shadow's second memfd).
    Bytes(Span<'a>),
    /// One hash per page (a writable pooled range, see [`super::baseline`]); the merge's
    /// first byte is range offset `.1` (page aligned).
    Pages(&'a PageHashes, u64),
}

/// The three-way merge of [`Shadow::sync`] over `size` bytes, a chunk at a time (the heap
/// it uses is bounded by [`CHUNK`], not by `size`):
/// - `now`: the guest's view (a memfd the frontend maps);
/// - `agreed`: what both sides agreed on at the last merge, its first `old` bytes valid;
///   `None` when the guest cannot store into `now` (then `now` holds them);
/// - `host`: the file from `at`.
///
/// `seen`: the file's signature the last merge left (see [`CopySig`]). When it proves the
/// file unchanged since, its bytes are the agreed ones and the file is not read: a read-only
/// range has nothing to merge, a writable one only writes the guest's runs, which halves the
/// cost of the periodic write-back of ranges nobody else writes.
///
/// Returns what moved, the new agreed length (the file's bytes in the range now) and the
/// signature for the next merge.
pub(crate) fn merge(
    now: Span,
    agreed: Option<Agreed>,
    old: u64,
    size: u64,
    host: Span,
    writable: bool,
    seen: Option<CopySig>,
) -> io::Result<(Synced, u64, Option<CopySig>)> {
    let mut out = Synced::default();
    // Taken before anything reads the file: a host write after it moves the file's
    // timestamps past it (when it is settled).
    let sig = CopySig::of(host.file)?;
    let host_unchanged = CopySig::unchanged(seen, Some(sig));
    // The merge's own writes move the file's timestamps, and a host write made while it ran
    // would hide behind them: after writing, the next merge reads the file again.
    let next = |out: &Synced| (out.written == 0).then_some(sig);
    if host_unchanged && !writable {
        return Ok((out, old, Some(sig)));
    }
    let file_size = sig.size.max(0) as u64;
    let in_file = file_size.saturating_sub(host.at).min(size);
    if let (true, true, Some(a)) = (host_unchanged, in_file == old, agreed) {
        let o = merge_guest_only(now, a, old, host, writable)?;
        return Ok((o, old, next(&o)));
    }
    let end = old.max(in_file);
    // A chunk at most, and no more than the merge covers: a merge of one page (a request's
    // part of a pooled range) must not zero three chunks first.
    let buf = CHUNK.min(usize::try_from(end).unwrap_or(CHUNK));
    let mut nowb = vec![0u8; buf];
    let mut agb = vec![0u8; buf];
    let mut hostb = vec![0u8; buf];
    let mut c = 0u64;
    while c < end {
        let n = (end - c).min(CHUNK as u64) as usize;
        // Agreed and current bytes of this chunk that lie inside the old agreed length.
        let old_c = old.saturating_sub(c).min(n as u64) as usize;
        let in_c = in_file.saturating_sub(c).min(n as u64) as usize;
        let nowc = &mut nowb[..n];
        now.file.read_exact_at(nowc, now.at + c)?;
        let agc = &mut agb[..old_c];
        match agreed {
            Some(Agreed::Bytes(a)) => a.file.read_exact_at(agc, a.at + c)?,
            Some(Agreed::Pages(h, base)) => {
                out.conflicts += agreed_pages(h, base + c, &nowc[..old_c], host, c, agc)?;
            }
            None => agc.copy_from_slice(&nowc[..old_c]),
        }
        if nowc[..old_c] == agc[..] {
            // Fast path (memcmp): the guest changed nothing in this chunk, and when the
            // host's bytes are the agreed ones up to the same end there is nothing to move.
            let hostc = &mut hostb[..in_c];
            let got = pread_full(host.file, hostc, host.at + c)?;
            if got == old_c && hostb[..got] == agc[..] {
                c += n as u64;
                continue;
            }
        }
        // The bytes the guest changed (inside the old agreed length).
        let rs = runs(&nowc[..old_c], agc);
        // 1. The guest's runs go to the file, one run at a time, never past its end.
        if writable {
            let room = if rs.is_empty() { 0 } else { room_at(host, c)? };
            for &(s, e) in &rs {
                let e = e.min(in_c).min(room);
                if s >= e {
                    continue;
                }
                host.file
                    .write_all_at(&nowc[s..e], host.at + c + s as u64)?;
                out.written += (e - s) as u64;
            }
        }
        // 2. The host's changes (and growth) come in where the guest changed nothing.
        let hostc = &mut hostb[..in_c];
        let got = pread_full(host.file, hostc, host.at + c)?;
        let hostc = &mut hostb[..got];
        let lim = got.min(old_c);
        for (s, e) in runs(&hostc[..lim], &agc[..lim]) {
            // Host changes, less the bytes the guest changed too (its store wins).
            for (u, v) in unchanged_parts(&nowc[s..e], &agc[s..e]) {
                let (u, v) = (s + u, s + v);
                now.file.write_all_at(&hostc[u..v], now.at + c + u as u64)?;
                out.pulled += (v - u) as u64;
            }
        }
        if got > old_c {
            now.file
                .write_all_at(&hostc[old_c..], now.at + c + old_c as u64)?;
            out.pulled += (got - old_c) as u64;
        }
        // 3. Bytes past a shrunken end read as zeros, as past EOF of a mapped file.
        if got < old_c {
            let zeros = vec![0u8; old_c - got];
            now.file.write_all_at(&zeros, now.at + c + got as u64)?;
        }
        // The agreed bytes are now the file's (guest runs included, as just written).
        if let Some(a) = agreed {
            for &(s, e) in &rs {
                let e = e.min(got);
                if s < e {
                    hostc[s..e].copy_from_slice(&nowc[s..e]);
                }
            }
            if got != old_c || hostc[..] != agc[..] {
                match a {
                    Agreed::Bytes(a) => a.file.write_all_at(hostc, a.at + c)?,
                    Agreed::Pages(h, base) => h.set_chunk(base + c, hostc),
                }
            }
        }
        c += n as u64;
    }
    Ok((out, in_file, next(&out)))
}

/// The agreed bytes of a chunk kept as page hashes (see [`super::baseline`]): into `agc`,
/// the guest's bytes `nowc` where they hash as agreed, the file's elsewhere (zeros past its
/// end). Returns the pages where neither side's bytes do (both changed them: conflicts).
fn agreed_pages(
    h: &PageHashes,
    at: u64,
    nowc: &[u8],
    host: Span,
    c: u64,
    agc: &mut [u8],
) -> io::Result<u64> {
    agc.copy_from_slice(nowc);
    let changed = baseline::changed_pages(h, at, nowc);
    if !changed.contains(&true) {
        return Ok(0);
    }
    let got = pread_full(host.file, agc, host.at + c)?;
    agc[got..].fill(0);
    let page = MAP_ALIGNMENT as usize;
    let mut conflicts = 0;
    for (k, guest) in changed.into_iter().enumerate() {
        let (s, e) = (k * page, ((k + 1) * page).min(agc.len()));
        let i = (at / MAP_ALIGNMENT) as usize + k;
        if !guest {
            agc[s..e].copy_from_slice(&nowc[s..e]);
        } else if agc[s..e] == nowc[s..e] {
            // Both sides hold the same bytes: agreed now, nothing to move.
            h.set(i, &nowc[s..e]);
        } else if !h.agrees(i, &agc[s..e]) {
            conflicts += 1;
        }
    }
    Ok(conflicts)
}

/// [`merge`] when the file holds the agreed bytes: the guest's runs go to the file and into
/// the agreed copy; nothing else moves.
fn merge_guest_only(
    now: Span,
    agreed: Agreed,
    old: u64,
    host: Span,
    writable: bool,
) -> io::Result<Synced> {
    let mut out = Synced::default();
    if !writable {
        return Ok(out);
    }
    let buf = CHUNK.min(usize::try_from(old).unwrap_or(CHUNK));
    let mut nowb = vec![0u8; buf];
    let mut agb = vec![0u8; buf];
    let mut c = 0u64;
    while c < old {
        let n = (old - c).min(CHUNK as u64) as usize;
        let (nowc, agc) = (&mut nowb[..n], &mut agb[..n]);
        now.file.read_exact_at(nowc, now.at + c)?;
        match agreed {
            Agreed::Bytes(a) => a.file.read_exact_at(agc, a.at + c)?,
            Agreed::Pages(..) => {
                // The file is unchanged since the last merge: its bytes are the agreed ones
                // (compared, not hashed: exact, and as fast as a second copy was).
                let got = pread_full(host.file, agc, host.at + c)?;
                agc[got..].fill(0);
            }
        }
        if nowc[..] != agc[..] {
            let room = room_at(host, c)?;
            let mut runs_written = Vec::new();
            for (s, e) in runs(nowc, agc) {
                let e = e.min(room);
                if s >= e {
                    continue;
                }
                runs_written.push((s, e));
                host.file
                    .write_all_at(&nowc[s..e], host.at + c + s as u64)?;
                out.written += (e - s) as u64;
                match agreed {
                    Agreed::Bytes(a) => a.file.write_all_at(&nowc[s..e], a.at + c + s as u64)?,
                    Agreed::Pages(..) => agc[s..e].copy_from_slice(&nowc[s..e]),
                }
            }
            if let Agreed::Pages(h, base) = agreed {
                h.set_changed(base + c, agc, &runs_written);
            }
        }
        c += n as u64;
    }
    Ok(out)
}

/// Bytes of the file from `host.at + c` as it is now (a chunk's worth at most matters). A
/// merge reads the size once when it starts; a host truncate while it runs must not be
/// undone by a guest run written past the new end, so each chunk's runs are clipped to the
/// size just before they are written (the window left is one `fstat` wide).
fn room_at(host: Span, c: u64) -> io::Result<usize> {
    let size = crate::sys::fstat(host.file.as_fd())?.st_size.max(0) as u64;
    let left = size.saturating_sub(host.at + c);
    Ok(usize::try_from(left).unwrap_or(usize::MAX))
}

/// The shadow of one host file range.
pub struct Shadow {
    memfd: File,
    /// Bytes of the memfd (the longest guest mapping that uses it).
    size: u64,
    /// The bytes both sides agreed on at the last sync (`valid` of them): a memfd once a
    /// writable guest mapping uses the shadow; before that the guest cannot store into
    /// `memfd`, which then holds them.
    agreed: Option<File>,
    /// The file's bytes in the shadow as of the last sync (at most `size`).
    valid: u64,
    /// File offset of the memfd's first byte.
    at: u64,
    /// A descriptor for the file (read-write when a writable guest mapping uses the shadow);
    /// `None` for snapshots of files the daemon keeps no descriptor for.
    file: Option<Arc<File>>,
    writable: bool,
    /// The file as of the last sync of a read-only shadow: unchanged, nothing to merge.
    seen: Option<CopySig>,
    /// Where it is kept across a server crash (`--restartable`), its id and its key.
    kept: Option<KeptAs>,
}

/// A shadow's place in the keeper's vault ([`Shadow::keep_with`]).
struct KeptAs {
    keeper: Arc<dyn Keeper>,
    id: u64,
    key: ShadowKey,
}

/// A kept shadow's meta: key (4), size, valid, writable.
const KEPT_META: usize = 7 * 8;

impl Shadow {
    /// A memfd of `size` bytes holding the file's bytes from offset `at` (zero padded).
    pub fn new(file: &File, at: u64, size: u64) -> io::Result<Shadow> {
        let memfd = memfd(c"daxfsd-shadow", size)?;
        // Taken before the copy: a change during it shows at the next sync.
        let seen = CopySig::of(file).ok();
        let file_size = crate::sys::fstat(file.as_fd())?.st_size.max(0) as u64;
        let want = file_size.saturating_sub(at).min(size);
        let valid = copy_range(file, at, &memfd, 0, want, true)?;
        Ok(Shadow {
            memfd,
            size,
            agreed: None,
            valid,
            at,
            file: None,
            writable: false,
            seen,
            kept: None,
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// A writable shadow of file range `[at, at + size)` that takes over the guest's bytes
    /// and the agreed bytes of a pooled range (`size` bytes of `now` at `now_at`; `valid`
    /// agreed bytes, as far as `pages` knows them, see [`PageHashes::materialize`]) whose
    /// stores could not be written back: the range leaves the window, its bytes must not.
    pub(crate) fn adopt(
        now: &File,
        now_at: u64,
        pages: &PageHashes,
        size: u64,
        valid: u64,
        file: Arc<File>,
        at: u64,
    ) -> io::Result<Shadow> {
        let guest = memfd(c"daxfsd-stranded", size)?;
        copy_range(now, now_at, &guest, 0, size, true)?;
        let a = memfd(c"daxfsd-stranded-agreed", size)?;
        pages.materialize(&guest, 0, &file, at, valid, &a)?;
        Ok(Shadow {
            memfd: guest,
            size,
            agreed: Some(a),
            valid,
            at,
            file: Some(file),
            writable: true,
            seen: None,
            kept: None,
        })
    }

    /// The guest's bytes, the agreed ones (if writable) and how many of those are valid.
    pub(crate) fn parts(&self) -> (&File, Option<&File>, u64) {
        (&self.memfd, self.agreed.as_ref(), self.valid)
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Makes the memfd at least `size` bytes (another guest mapping of the range is longer),
    /// the grown part holding `file`'s bytes (zeros past its end).
    pub fn grow(&mut self, size: u64, file: &File) -> io::Result<()> {
        if size <= self.size {
            return Ok(());
        }
        let old = self.size;
        self.memfd.set_len(size)?;
        if let Some(a) = &self.agreed {
            a.set_len(size)?;
        }
        self.size = size;
        if self.valid == old {
            // The file covered the whole old shadow: its next bytes belong in the new part.
            let n = copy_range(file, self.at + old, &self.memfd, old, size - old, true)?;
            if let Some(a) = &self.agreed {
                copy_range(&self.memfd, old, a, old, n, true)?;
            }
            self.valid += n;
        }
        self.keep_meta();
        Ok(())
    }

    /// Gives the shadow a descriptor to sync with; a writable one enables write-back.
    pub fn attach(&mut self, file: Option<Arc<File>>, writable: bool) -> io::Result<()> {
        if writable && self.agreed.is_none() {
            // From now on the guest may store into the memfd: keep the agreed bytes apart.
            let a = memfd(c"daxfsd-shadow-agreed", self.size)?;
            copy_range(&self.memfd, 0, &a, 0, self.valid, true)?;
            self.agreed = Some(a);
        }
        let was = (self.writable, self.agreed.is_some());
        if writable {
            self.writable = true;
        }
        let new_file = file.is_some() && (self.file.is_none() || writable);
        if new_file {
            self.file = file;
        }
        if was != (self.writable, self.agreed.is_some()) || new_file {
            self.keep_parts();
        }
        Ok(())
    }

    /// Whether the guest may have stored into the memfd since the last sync.
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// Three-way merge with the file (see the module comment).
    pub fn sync(&mut self) -> io::Result<Synced> {
        let Some(file) = self.file.clone() else {
            return Ok(Synced::default());
        };
        let (out, valid, seen) = merge(
            Span {
                file: &self.memfd,
                at: 0,
            },
            self.agreed
                .as_ref()
                .map(|a| Agreed::Bytes(Span { file: a, at: 0 })),
            self.valid,
            self.size,
            Span {
                file: &file,
                at: self.at,
            },
            self.writable,
            self.seen,
        )?;
        let moved = self.valid != valid;
        self.valid = valid;
        self.seen = seen;
        if moved {
            self.keep_meta();
        }
        Ok(out)
    }

    /// Its id in the keeper's vault: the memfd's inode number.
    pub(crate) fn kept_id(&self) -> Option<u64> {
        self.kept.as_ref().map(|k| k.id)
    }

    /// Keeps the shadow (`key` in the window's registry) with `keeper` from now on: its
    /// memfd with what the merge knows, its agreed copy, its file. Kept again when any of
    /// those change; released when it is dropped. Returns its id.
    pub(crate) fn keep_with(&mut self, keeper: &Arc<dyn Keeper>, key: ShadowKey) -> Option<u64> {
        if self.kept.is_none() {
            let id = crate::sys::fstat(self.memfd.as_fd()).ok()?.st_ino;
            self.kept = Some(KeptAs {
                keeper: keeper.clone(),
                id,
                key,
            });
            self.keep_parts();
        }
        self.kept_id()
    }

    fn keep_meta(&self) {
        let Some(k) = &self.kept else { return };
        let mut meta = Vec::with_capacity(KEPT_META);
        for v in [
            k.key.0,
            k.key.1,
            k.key.2,
            u64::from(k.key.3),
            self.size,
            self.valid,
            u64::from(self.writable),
        ] {
            meta.extend_from_slice(&v.to_le_bytes());
        }
        k.keeper
            .keep(Kept::DaxShadow(k.id, 0), &meta, Some(self.memfd.as_fd()));
    }

    fn keep_parts(&self) {
        let Some(k) = &self.kept else { return };
        self.keep_meta();
        if let Some(a) = &self.agreed {
            k.keeper
                .keep(Kept::DaxShadow(k.id, 1), &[], Some(a.as_fd()));
        }
        if let Some(f) = &self.file {
            k.keeper
                .keep(Kept::DaxShadow(k.id, 2), &[], Some(f.as_fd()));
        }
    }

    /// A shadow a server before this one kept: part 0's `meta` and memfd, the agreed copy
    /// and the file. Returns its key with it; `None` when the parts do not fit together.
    pub(crate) fn from_kept(
        meta: &[u8],
        memfd: File,
        agreed: Option<File>,
        file: Option<Arc<File>>,
    ) -> Option<(ShadowKey, Shadow)> {
        if meta.len() != KEPT_META {
            return None;
        }
        let v = |i: usize| u64::from_le_bytes(meta[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        let key = (v(0), v(1), v(2), v(3) != 0);
        let (size, valid, writable) = (v(4), v(5), v(6) != 0);
        let fits = |f: &File| {
            crate::sys::fstat(f.as_fd()).is_ok_and(|st| st.st_size.max(0) as u64 >= size)
        };
        if valid > size || !fits(&memfd) || agreed.as_ref().is_some_and(|a| !fits(a)) {
            return None;
        }
        if writable && (agreed.is_none() || file.is_none()) {
            return None;
        }
        Some((
            key,
            Shadow {
                memfd,
                size,
                agreed,
                valid,
                at: key.2,
                file,
                writable,
                // The file may have changed while no server ran: the next merge reads it.
                seen: None,
                kept: None,
            },
        ))
    }
}

impl Drop for Shadow {
    fn drop(&mut self) {
        if let Some(k) = &self.kept {
            for part in 0..3 {
                k.keeper.release(Kept::DaxShadow(k.id, part));
            }
        }
    }
}

/// Runs `[start, end)` where `a` and `b` differ.
fn runs(a: &[u8], b: &[u8]) -> Vec<(usize, usize)> {
    // Equal blocks cost one comparison (memcmp); inside a block that differs, a word whose
    // bytes are all equal or all different is one step: a chunk the guest rewrote whole or
    // not at all costs about a memcmp, not a loop per byte.
    const BLOCK: usize = 256;
    fn extend(out: &mut Vec<(usize, usize)>, s: usize, e: usize) {
        match out.last_mut() {
            Some(r) if r.1 == s => r.1 = e,
            _ => out.push((s, e)),
        }
    }
    let n = a.len().min(b.len());
    let mut out = Vec::new();
    let mut blk = 0;
    while blk < n {
        let end = (blk + BLOCK).min(n);
        if a[blk..end] == b[blk..end] {
            blk = end;
            continue;
        }
        let mut i = blk;
        while i < end {
            if i + 8 <= end {
                let x = word(a, i) ^ word(b, i);
                if x == 0 {
                    i += 8;
                    continue;
                }
                if !has_zero_byte(x) {
                    extend(&mut out, i, i + 8);
                    i += 8;
                    continue;
                }
            }
            if a[i] != b[i] {
                extend(&mut out, i, i + 1);
            }
            i += 1;
        }
        blk = end;
    }
    out
}

/// The complement of [`runs`] over `[0, len)`: the maximal runs where `a` and `b` agree.
fn unchanged_parts(a: &[u8], b: &[u8]) -> Vec<(usize, usize)> {
    let n = a.len().min(b.len());
    let mut out = Vec::new();
    let mut at = 0;
    for (s, e) in runs(a, b) {
        if s > at {
            out.push((at, s));
        }
        at = e;
    }
    if at < n {
        out.push((at, n));
    }
    out
}

fn word(s: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&s[i..i + 8]);
    u64::from_ne_bytes(w)
}

/// Whether any byte of `x` is zero.
fn has_zero_byte(x: u64) -> bool {
    x.wrapping_sub(0x0101_0101_0101_0101) & !x & 0x8080_8080_8080_8080 != 0
}
#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 4096;
    const R: u64 = 2 << 20;

    fn shadow_of(f: &File, at: u64, size: u64, writable: bool) -> Shadow {
        let mut s = Shadow::new(f, at, size).unwrap();
        s.attach(Some(Arc::new(f.try_clone().unwrap())), writable)
            .unwrap();
        s
    }

    fn file_bytes(f: &File) -> Vec<u8> {
        let n = f.metadata().unwrap().len() as usize;
        let mut v = vec![0u8; n];
        f.read_exact_at(&mut v, 0).unwrap();
        v
    }

    #[test]
    fn runs_match_a_byte_by_byte_scan() {
        // Words equal, all different, mixed; runs across word and block edges.
        let naive = |a: &[u8], b: &[u8]| {
            let mut out: Vec<(usize, usize)> = Vec::new();
            for i in 0..a.len().min(b.len()) {
                if a[i] != b[i] {
                    match out.last_mut() {
                        Some(r) if r.1 == i => r.1 = i + 1,
                        _ => out.push((i, i + 1)),
                    }
                }
            }
            out
        };
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..400 {
            let n = (rnd() % 1500) as usize;
            let a: Vec<u8> = (0..n).map(|_| rnd() as u8).collect();
            let mut b = a.clone();
            for _ in 0..(round % 12) {
                let s = (rnd() as usize) % (n + 1);
                let len = (rnd() as usize) % 300;
                for (k, v) in b.iter_mut().enumerate().skip(s).take(len) {
                    // Mostly different bytes, some equal ones inside a run.
                    *v = if rnd() % 9 == 0 {
                        a[k]
                    } else {
                        a[k].wrapping_add(1 + (rnd() % 200) as u8)
                    };
                }
            }
            assert_eq!(runs(&a, &b), naive(&a, &b), "round {round}");
            let gaps = unchanged_parts(&a, &b);
            let covered: usize = gaps.iter().map(|(s, e)| e - s).sum::<usize>()
                + naive(&a, &b).iter().map(|(s, e)| e - s).sum::<usize>();
            assert_eq!(covered, n);
        }
    }

    #[test]
    fn layouts() {
        assert_eq!(layout(8 * R, 0, R), (R, 0), "whole range inside the file");
        assert_eq!(layout(6, 0, R), (0, 6), "small file: all tail");
        assert_eq!(layout(0, 0, R), (0, 0), "empty file");
        assert_eq!(layout(P + 10, 0, R), (P, 10));
        assert_eq!(
            layout(R + 5, R, R),
            (0, 5),
            "range at the file's last bytes"
        );
        assert_eq!(layout(R, R, R), (0, 0), "range past EOF");
        assert_eq!(layout(3 * P, 0, 2 * P), (2 * P, 0));
    }

    #[test]
    fn copy_zero_padded_and_nothing_written_when_unchanged() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(b"0123456789", 0).unwrap();
        let mut t = shadow_of(&f, 2, P, true);
        let mut buf = [0u8; 10];
        t.memfd.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"23456789\0\0");
        assert_eq!(t.sync().unwrap(), Synced::default());
    }

    #[test]
    fn guest_runs_written_back_run_by_run() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(b"0123456789", 0).unwrap();
        let mut t = shadow_of(&f, 0, P, true);
        // The guest changes bytes 1 and 8; the host changes byte 5 in between.
        t.memfd.write_all_at(b"A", 1).unwrap();
        t.memfd.write_all_at(b"B", 8).unwrap();
        f.write_all_at(b"H", 5).unwrap();
        t.memfd.write_all_at(b"past-eof", 20).unwrap();
        let s = t.sync().unwrap();
        assert_eq!(s.written, 2, "two one-byte runs, not the span between them");
        assert_eq!(
            file_bytes(&f),
            b"0A234H67B9",
            "host byte between runs survives"
        );
        assert_eq!(f.metadata().unwrap().len(), 10, "never extends the file");
        let mut buf = [0u8; 10];
        t.memfd.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"0A234H67B9", "the guest sees the host's byte");
        assert_eq!(t.sync().unwrap(), Synced::default(), "in sync");
    }

    #[test]
    fn an_unchanged_file_takes_only_the_guests_runs() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(b"0123456789", 0).unwrap();
        let mut t = shadow_of(&f, 0, P, true);
        t.memfd.write_all_at(b"AB", 2).unwrap();
        assert_eq!(
            t.sync().unwrap(),
            Synced {
                written: 2,
                ..Synced::default()
            }
        );
        assert_eq!(file_bytes(&f), b"01AB456789");
        assert_eq!(t.sync().unwrap(), Synced::default(), "in sync");
        // The file grows on the host: a full merge again.
        f.write_all_at(b"X", 10).unwrap();
        assert_eq!(t.sync().unwrap().pulled, 1);
        let mut buf = [0u8; 11];
        t.memfd.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"01AB456789X");
    }

    #[test]
    fn growth_within_the_page_reaches_the_guest() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(b"abc", 0).unwrap();
        let mut t = shadow_of(&f, 0, P, false);
        f.write_all_at(b"defgh", 3).unwrap();
        assert_eq!(t.sync().unwrap().pulled, 5);
        let mut buf = [0u8; 8];
        t.memfd.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"abcdefgh");
    }

    #[test]
    fn shrink_zeroes_and_clips() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(b"abcdef", 0).unwrap();
        let mut t = shadow_of(&f, 0, P, true);
        t.memfd.write_all_at(b"ABCDEF", 0).unwrap();
        f.set_len(3).unwrap();
        assert_eq!(t.sync().unwrap().written, 3);
        assert_eq!(file_bytes(&f), b"ABC");
        let mut buf = [0u8; 6];
        t.memfd.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"ABC\0\0\0");
    }

    #[test]
    fn only_a_settled_signature_proves_a_file_unchanged() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(b"abc", 0).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let a = CopySig::of(&f).unwrap();
        assert!(a.settled, "{a:?}: changed a clock tick ago");
        assert!(CopySig::unchanged(Some(a), CopySig::of(&f).ok()));
        let racy = CopySig {
            settled: false,
            ..a
        };
        assert!(!CopySig::unchanged(Some(racy), Some(a)));
        f.write_all_at(b"d", 3).unwrap();
        assert!(!CopySig::unchanged(Some(a), CopySig::of(&f).ok()));
        assert!(!CopySig::unchanged(None, Some(a)));
    }

    #[test]
    fn after_writing_back_the_next_sync_reads_the_file() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(b"0123456789", 0).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let mut t = shadow_of(&f, 0, P, true);
        t.memfd.write_all_at(b"G", 1).unwrap();
        assert_eq!(t.sync().unwrap().written, 1);
        // Its own write moved the timestamps; a host write during the merge would hide
        // behind them, so nothing from this merge vouches for the file.
        assert!(t.seen.is_none());
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert_eq!(t.sync().unwrap(), Synced::default());
        assert!(
            t.seen.is_some_and(|s| s.settled),
            "a merge that wrote nothing"
        );
    }

    #[test]
    fn read_only_shadows_never_write() {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(b"abcdef", 0).unwrap();
        let mut t = shadow_of(&f, 0, P, false);
        t.memfd.write_all_at(b"X", 0).unwrap();
        t.sync().unwrap();
        assert_eq!(file_bytes(&f), b"abcdef");
    }
}
