//! A request decoded from one walk of its descriptor chain, served on the queue's thread
//! or handed to a pool thread ([`Walked`]); chains that are no request are refused.

use std::sync::Arc;

use vm_memory::{Bytes, VolatileSlice};

use super::dirty_log::{mark_written, Spans};
use super::vhost_user::GuestMemoryLogged;
use super::window_regions::Window;
use crate::protocol::abi::{InHeader, OutHeader};
use crate::protocol::filesystem::FileSystem;
use crate::protocol::iobuf::{FarIo, Reader, Seg, Writer};
use crate::protocol::server::Server;
use crate::transport::vring_chain::{Malformed, Split};

/// Bytes of a FUSE request header.
const IN_HEADER_LEN: usize = std::mem::size_of::<InHeader>();

/// A copy of a request's FUSE header, if it is readable.
fn header_of(readable: &[Seg<'_>], far: Option<&dyn FarIo>) -> Option<InHeader> {
    if let Some(Seg::Mem(first)) = readable.first().filter(|f| f.len() >= IN_HEADER_LEN) {
        // The common case: the header is in the first buffer.
        return first.read_obj::<InHeader>(0).ok();
    }
    Reader::with_far(readable.to_vec(), far)
        .read_obj::<InHeader>()
        .ok()
}

/// A request as decoded from one walk of its chain: one copy of its header, and the buffers
/// that walk found (guest memory, or far segments in the DAX window). Everything the
/// transport decides (the thread, the opcode served, the bytes the server reads and writes)
/// comes from this one decoding.
pub(crate) struct Decoded<'m> {
    pub(crate) hdr: InHeader,
    pub(crate) readable: Vec<Seg<'m>>,
    pub(crate) writable: Vec<Seg<'m>>,
}

/// A chain that is no request to serve: refused by the walk (answered with EIO where it can
/// be, [`answer_malformed`]), or well formed but too short for a FUSE header (dropped).
pub(crate) enum Refused<'m> {
    Malformed(Malformed<'m>),
    NoHeader(String),
}

/// Decodes a walked chain: its FUSE header, read once; a chain the walk refused or too short
/// for a header is no request ([`refuse`] completes it).
pub(crate) fn decode<'m>(
    split: Result<Split<'m>, Malformed<'m>>,
    far: Option<&dyn FarIo>,
) -> Result<Decoded<'m>, Refused<'m>> {
    let (readable, writable) = split.map_err(Refused::Malformed)?;
    let Some(hdr) = header_of(&readable, far) else {
        let total: usize = readable.iter().map(|s| s.len()).sum();
        return Err(Refused::NoHeader(format!(
            "{total} readable bytes, too short for a FUSE header"
        )));
    };
    Ok(Decoded {
        hdr,
        readable,
        writable,
    })
}

/// Completes a chain that is no request ([`decode`]); returns the bytes written for the used
/// ring (an EIO reply, or nothing).
pub(super) fn refuse(
    mem: &GuestMemoryLogged,
    refused: Refused<'_>,
    far: Option<&dyn FarIo>,
    queue: usize,
    head: u16,
) -> u32 {
    match refused {
        Refused::Malformed(m) => answer_malformed(mem, m, far),
        Refused::NoHeader(e) => {
            log::warn!("queue {queue}: dropping descriptor chain {head}: {e}");
            0
        }
    }
}

/// Serves a decoded request; returns the bytes written for the used ring.
pub(crate) fn serve<F: FileSystem>(
    server: &Server<F>,
    mem: &GuestMemoryLogged,
    req: Decoded<'_>,
    far: Option<&dyn FarIo>,
) -> u32 {
    let Decoded {
        hdr,
        readable,
        writable,
    } = req;
    let spans = Spans::of(&writable);
    let w = (!writable.is_empty()).then(|| Writer::with_far(writable, far));
    let mut r = Reader::with_far(readable, far);
    let total = r.available();
    // The header bytes are skipped, not read again: `hdr` is what is served.
    let handled = r
        .skip(IN_HEADER_LEN)
        .and_then(|()| server.handle_decoded(hdr, total, r, w));
    let used = match handled {
        Ok(h) => u32::try_from(h.written).unwrap_or(0),
        Err(e) => {
            log::warn!("request dropped: {e}");
            0
        }
    };
    // A migration's log must see the reply once it is written (never before).
    mark_written(mem, spans.as_slice(), used as usize);
    used
}

/// Answers a chain [`walk`](super::vring_chain::walk) refused (a buffer outside guest memory
/// and the window, a readable buffer after a writable one, no readable buffer): with EIO in
/// its out-header when its FUSE header and the first 16 writable bytes could be resolved, so
/// the request fails instead of looking served. Otherwise (no header to take the `unique`
/// from, or no room for an out-header: nothing the guest's driver could read an answer from)
/// the chain is still completed, with 0 bytes written, like FORGET: it never stays in flight.
fn answer_malformed(mem: &GuestMemoryLogged, m: Malformed<'_>, far: Option<&dyn FarIo>) -> u32 {
    let (readable, writable) = m.partial;
    let hdr = header_of(&readable, far);
    let spans = Spans::of(&writable);
    let mut w = Writer::with_far(writable, far);
    let used = match hdr {
        Some(h) if w.available() >= std::mem::size_of::<OutHeader>() => {
            let out = OutHeader {
                len: std::mem::size_of::<OutHeader>() as u32,
                error: -libc::EIO,
                unique: h.unique,
            };
            w.write_obj(&out).map_or(0, |()| out.len)
        }
        _ => 0,
    };
    log::warn!(
        "malformed descriptor chain: {}; {}",
        m.why,
        if used > 0 {
            "answered with EIO"
        } else {
            "completed without a reply (no header or out-header to answer with)"
        }
    );
    mark_written(mem, spans.as_slice(), used as usize);
    used
}

/// A decoded request handed to a pool thread: the guest memory its buffers were resolved in
/// (held, so they stay mapped until it is served, whatever memory table the frontend sets
/// meanwhile) and the buffers as host (address, length) pieces. The pool thread serves these,
/// not a new walk of the chain.
pub(crate) struct Walked {
    mem: vm_memory::atomic::GuestMemoryLoadGuard<GuestMemoryLogged>,
    /// The DAX window far segments are moved through.
    window: Option<Arc<Window>>,
    hdr: InHeader,
    readable: Vec<Piece>,
    writable: Vec<Piece>,
}

/// A buffer of a [`Walked`] request: host memory (address, length), or a far segment.
#[derive(Clone, Copy)]
enum Piece {
    Mem(usize, usize),
    Far(u64, usize),
}

impl Walked {
    /// `req`, decoded from a walk in `mem` (far segments in `window`), for another thread.
    ///
    /// # Safety
    ///
    /// `req` must come from [`walk`](super::vring_chain::walk) over `mem` itself (through
    /// [`decode`]): its guest buffers lie inside `mem`'s regions, which [`Walked::serve`] uses
    /// again as slices.
    pub(crate) unsafe fn of(
        mem: vm_memory::atomic::GuestMemoryLoadGuard<GuestMemoryLogged>,
        req: Decoded<'_>,
        window: Option<Arc<Window>>,
    ) -> Self {
        let piece = |s: &Seg<'_>| match s {
            Seg::Mem(v) => Piece::Mem(v.ptr_guard().as_ptr() as usize, v.len()),
            Seg::Far { at, len } => Piece::Far(*at, *len),
        };
        Walked {
            hdr: req.hdr,
            readable: req.readable.iter().map(piece).collect(),
            writable: req.writable.iter().map(piece).collect(),
            mem,
            window,
        }
    }

    /// Serves the request; returns the bytes written for the used ring.
    pub(crate) fn serve<F: FileSystem>(self, server: &Server<F>) -> u32 {
        fn segs(pieces: &[Piece]) -> Vec<Seg<'_>> {
            pieces
                .iter()
                .map(|&p| match p {
                    Piece::Mem(addr, len) => {
                        // SAFETY: each piece is a buffer `walk` resolved inside one region of
                        // the `mem` the request holds (bounds-checked there; `Walked::of`'s
                        // contract); that collection keeps its regions mapped while it lives,
                        // and the slices borrow the request that holds it. The guest may
                        // change the bytes at any time: every access through a
                        // `VolatileSlice` is volatile.
                        Seg::Mem(unsafe { VolatileSlice::new(addr as *mut u8, len) })
                    }
                    Piece::Far(at, len) => Seg::Far { at, len },
                })
                .collect()
        }
        let req = Decoded {
            hdr: self.hdr,
            readable: segs(&self.readable),
            writable: segs(&self.writable),
        };
        let far = self.window.as_deref().map(|w| w as &dyn FarIo);
        serve(server, &self.mem, req, far)
    }
}
