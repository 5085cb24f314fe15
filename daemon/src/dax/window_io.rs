//! Request buffers inside the window (issue #43): a guest `write(2)`, `O_DIRECT` write or
//! `read` whose buffer is a DAX mapping hands the daemon descriptors that point into the
//! window. The transport never maps the window (a host file may shrink under a mapping: a
//! read past its end would be a SIGBUS in the daemon; the pool, shadows and copy slots are
//! memory the guest may map writable), so it asks the window to move those bytes: each
//! window offset is served with `pread`/`pwrite` on what backs it, as the table says:
//! - a direct placement's file pages `[0, file_len)`: the file at `foffset` (a store is a
//!   store into the file's page cache, as the guest's own store through the mapping);
//! - its tail, or a whole shadow (snapshots, merged ranges): the shadow's memfd;
//! - a copy slot or a pooled range: the slots memfd at the window offset (a store into a
//!   writable pooled range is a guest store: the pool is merged with the file at sync points).
//!
//! A range with nothing live mapped (never mapped, removed, or a store into a read-only
//! mapping), or whose file no longer covers it (a host shrink), is an EIO for the request
//! that reached it, never a fault. A range with a frontend round trip in flight (a remap or
//! an upgrade to writable) is waited for, at most [`BUSY_WAIT`].
//!
//! The transport learns which regions of its memory table are the window's, and where the
//! window is in guest-physical space, from [`DaxWindow::sent_offset`]: every SHMEM_MAP the window
//! sent is noted with its file, file offset and length ([`IoState::note_map`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use super::host_watch::{key_of, Key};
use super::table::SharedShadow;
use super::{eio, DaxWindow, WindowSink};

/// How long a request waits for a round trip in flight on the range its buffer is in.
const BUSY_WAIT: Duration = Duration::from_secs(5);

/// How often a store looks its range up again after evacuations moved it.
const STORE_RETRIES: usize = 4;

/// Frontend mappings sent, by window offset: (file, file offset, length).
type Sent = BTreeMap<u64, (Key, u64, u64)>;

/// The window's state for request buffers inside it (a field of [`DaxWindow`]; leaf locks).
#[derive(Default)]
pub(super) struct IoState {
    /// Every SHMEM_MAP the window sent, noted before it is sent (the frontend's memory-table
    /// update follows its ack). Bounded: at most one entry per window page (a map at an
    /// offset replaces the old one).
    sent: Mutex<Sent>,
    /// Stores into a direct placement's file hold this shared, from their check of the file's
    /// size to the end of the `pwrite`; an evacuation that moved mappings takes it
    /// exclusively and bumps the generation before it lets the host's shrink go on
    /// ([`IoState::evacuated`]). A store whose look-up is older than the generation looks
    /// again (the range is a shadow now): so a store never lands after a host truncate that
    /// pre-content events announced, where it would extend the file again.
    gate: RwLock<u64>,
}

impl IoState {
    /// Notes a SHMEM_MAP of `len` bytes of `fd` from `foffset` at window offset `moffset`.
    pub(super) fn note_map(&self, moffset: u64, len: u64, fd: BorrowedFd<'_>, foffset: u64) {
        let Ok(st) = crate::sys::fstat(fd) else {
            return;
        };
        let mut s = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        s.insert(moffset, ((st.st_dev, st.st_ino), foffset, len));
    }

    /// Notes a SHMEM_UNMAP of the mapping at `moffset`.
    pub(super) fn note_unmap(&self, moffset: u64) {
        self.sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&moffset);
    }

    /// The window offsets of the mappings sent.
    pub(super) fn sent_offsets(&self) -> Vec<u64> {
        let s = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        s.keys().copied().collect()
    }

    /// Forgets every mapping (the frontend dropped them all: device reset).
    pub(super) fn note_reset(&self) {
        self.sent.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Called by an evacuation after it moved direct mappings to shadows, before the shrink.
    pub(super) fn evacuated(&self) {
        *self.gate.write().unwrap_or_else(|e| e.into_inner()) += 1;
    }

    fn generation(&self) -> u64 {
        *self.gate.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// What backs one piece of the window.
enum Backing {
    /// A direct placement's file.
    File(std::sync::Arc<File>),
    /// A shadow's memfd.
    Shadow(SharedShadow),
    /// The slots memfd (copy slots and the pool).
    Slots,
}

/// `len` bytes of the window from some offset, backed by `backing` from `at`, as the table
/// said at evacuation generation `gen`.
struct Piece {
    backing: Backing,
    at: u64,
    len: u64,
    gen: u64,
}

/// A store found its range moved by an evacuation since its look-up.
fn moved() -> io::Error {
    io::Error::from(io::ErrorKind::Interrupted)
}

fn pread_exact(f: &File, buf: &mut [u8], at: u64) -> io::Result<()> {
    match super::memfd::pread_full(f, buf, at) {
        Ok(n) if n == buf.len() => Ok(()),
        // The file ends inside the range (a host shrink): the range is gone.
        Ok(_) => Err(eio()),
        Err(e) => Err(e),
    }
}

/// `f` as a `File` for the call (the descriptor stays owned by its owner).
fn with_file<T>(fd: BorrowedFd<'_>, f: impl FnOnce(&File) -> T) -> T {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: `fd` is open for the call; ManuallyDrop never closes the borrowed descriptor.
    let file = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(fd.as_raw_fd()) });
    f(&file)
}

impl<S: WindowSink> DaxWindow<S> {
    /// What backs window offset `moffset`, for a load (`store` false) or a store.
    fn piece(&self, moffset: u64, store: bool) -> io::Result<Piece> {
        // Before the look-up: an evacuation after it shows as a newer generation.
        let gen = self.io.generation();
        let deadline = Instant::now() + BUSY_WAIT;
        let mut t = self.lock()?;
        while t.is_busy(moffset, moffset + 1) {
            let now = Instant::now();
            if now >= deadline {
                log::warn!("DAX: window offset {moffset:#x} stayed busy: request buffer refused");
                return Err(eio());
            }
            t = self
                .idle
                .wait_timeout(t, deadline - now)
                .map_err(|_| io::Error::other("mapping table lock poisoned"))?
                .0;
        }
        let Some((&s, p)) = t
            .live
            .range(..=moffset)
            .next_back()
            .filter(|(&s, p)| s + p.len > moffset)
        else {
            log::debug!("DAX: request buffer at window offset {moffset:#x}: nothing mapped");
            return Err(eio());
        };
        if store && !p.writable {
            log::debug!("DAX: request stores into read-only window offset {moffset:#x}");
            return Err(eio());
        }
        let rel = moffset - s;
        let piece = if p.pooled || p.copy.is_some() {
            Piece {
                backing: Backing::Slots,
                at: moffset,
                len: p.len - rel,
                gen,
            }
        } else if !p.whole && rel < p.file_len {
            Piece {
                backing: Backing::File(p.file.clone().ok_or_else(eio)?),
                at: p.foffset + rel,
                len: p.file_len - rel,
                gen,
            }
        } else {
            let from = if p.whole { 0 } else { p.file_len };
            Piece {
                backing: Backing::Shadow(p.shadow.clone().ok_or_else(eio)?),
                at: rel - from,
                len: p.len - rel,
                gen,
            }
        };
        Ok(piece)
    }

    /// Moves `buf` to or from `piece` (`buf` no longer than the piece).
    fn move_piece(&self, piece: Piece, buf: Buf<'_>) -> io::Result<()> {
        let n = buf.len() as u64;
        let end = piece.at.checked_add(n).ok_or_else(eio)?;
        match piece.backing {
            Backing::File(f) => match buf {
                Buf::Load(b) => pread_exact(&f, b, piece.at),
                Buf::Store(d) => {
                    let g = self.io.gate.read().unwrap_or_else(|e| e.into_inner());
                    if *g != piece.gen {
                        return Err(moved());
                    }
                    // Never past the end of the file: the guest's mapping of what a host
                    // shrink cut off is gone (QEMU's would fault), and a store must not
                    // extend the file behind the host's back.
                    if end > super::file_size(&f)? {
                        return Err(eio());
                    }
                    let r = f.write_all_at(d, piece.at);
                    drop(g);
                    r
                }
            },
            Backing::Shadow(sh) => {
                let sh = sh.lock().unwrap_or_else(|e| e.into_inner());
                if end > sh.size() {
                    return Err(eio());
                }
                with_file(sh.fd(), |f| match buf {
                    Buf::Load(b) => pread_exact(f, b, piece.at),
                    Buf::Store(d) => f.write_all_at(d, piece.at),
                })
            }
            Backing::Slots => {
                let slots = self.slots.get().ok_or_else(eio)?;
                if end > slots.size() {
                    return Err(eio());
                }
                let f = slots.file();
                match buf {
                    Buf::Load(b) => pread_exact(f, b, piece.at),
                    Buf::Store(d) => f.write_all_at(d, piece.at),
                }
            }
        }
    }

    /// Fills `buf` with the window's bytes at `moffset` (a load by the guest through its
    /// mapping would see them), read from what backs them; EIO where nothing is mapped or
    /// the file no longer covers the range.
    /// The window offset of a mapping sent of `len` bytes of `file` from `foffset`, if any
    /// (how the transport knows a memory-table region is the window's).
    pub fn sent_offset(&self, file: &File, foffset: u64, len: u64) -> Option<u64> {
        let key = key_of(file)?;
        let s = self.io.sent.lock().unwrap_or_else(|e| e.into_inner());
        s.iter()
            .find(|(_, &(k, fo, l))| k == key && fo == foffset && l == len)
            .map(|(&m, _)| m)
    }

    pub fn read_window(&self, moffset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let m = moffset.checked_add(done as u64).ok_or_else(eio)?;
            let piece = self.piece(m, false)?;
            let n = usize::try_from(piece.len)
                .unwrap_or(usize::MAX)
                .min(buf.len() - done);
            self.move_piece(piece, Buf::Load(&mut buf[done..done + n]))
                .map_err(|e| io_failed(m, e))?;
            done += n;
        }
        Ok(())
    }

    /// Stores `data` at window offset `moffset` into what backs it, as a guest store through
    /// a writable mapping would; EIO where nothing writable is mapped or the file no longer
    /// covers the range.
    pub fn write_window(&self, moffset: u64, data: &[u8]) -> io::Result<()> {
        let mut done = 0usize;
        let mut retries = 0;
        while done < data.len() {
            let m = moffset.checked_add(done as u64).ok_or_else(eio)?;
            let piece = self.piece(m, true)?;
            let n = usize::try_from(piece.len)
                .unwrap_or(usize::MAX)
                .min(data.len() - done);
            match self.move_piece(piece, Buf::Store(&data[done..done + n])) {
                Ok(()) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted && retries < STORE_RETRIES => {
                    retries += 1;
                }
                Err(e) => return Err(io_failed(m, e)),
            }
        }
        Ok(())
    }
}

/// Which way a piece moves.
enum Buf<'a> {
    Load(&'a mut [u8]),
    Store(&'a [u8]),
}

impl Buf<'_> {
    fn len(&self) -> usize {
        match self {
            Buf::Load(b) => b.len(),
            Buf::Store(d) => d.len(),
        }
    }
}

fn io_failed(moffset: u64, e: io::Error) -> io::Error {
    log::debug!("DAX: request buffer at window offset {moffset:#x}: {e}");
    eio()
}
