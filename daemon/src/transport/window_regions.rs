//! Window-region filtering: which regions of the frontend's memory table are the DAX
//! window's (never used to resolve descriptors), and the window as the request path sees it.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vm_memory::GuestAddressSpace;

use super::vhost_user::{BackendChannel, GuestMem, GuestMemoryLogged};
use crate::protocol::iobuf::FarIo;
use crate::transport::vring_chain::WindowAt;

/// No guest-physical base known yet.
pub(super) const NO_BASE: u64 = u64::MAX;

/// The DAX window as the request path sees it: where it lies in guest-physical space (learnt
/// from the memory table: [`without_window_files`]) and the channel that moves the bytes of
/// buffers inside it ([`FarIo`]).
pub(crate) struct Window {
    pub(super) base: AtomicU64,
    pub(super) size: u64,
    pub(super) channel: Arc<dyn BackendChannel>,
}

impl Window {
    pub(super) fn at(&self) -> Option<WindowAt> {
        let base = self.base.load(Ordering::Relaxed);
        (base != NO_BASE).then_some(WindowAt {
            base,
            size: self.size,
        })
    }
}

impl FarIo for Window {
    fn read_far(&self, at: u64, buf: &mut [u8]) -> io::Result<()> {
        self.channel.read_window(at, buf)
    }

    fn write_far(&self, at: u64, data: &[u8]) -> io::Result<()> {
        self.channel.write_window(at, data)
    }
}

/// Guest memory without the frontend's regions of the DAX window, and the number left out.
///
/// Every SHMEM mapping comes back in the memory table as a region of its own: a host file (it
/// may shrink under the mapping, and a read past its end would be a SIGBUS in the daemon), a
/// shadow or the pool (memory the guest may map writable). None of them is used to resolve
/// descriptors: a buffer in the window is a far segment that the window moves with
/// `pread`/`pwrite` on what backs it ([`Window`], issue #43). A region is the window's when
/// the window sent its file and offset ([`BackendChannel::window_offset`], which gives the
/// window's guest-physical base too, stored in `window`), when it lies inside the window's
/// known range, or when its file is one the window mapped (issue #20). Returns a collection
/// of its own (sharing the regions), never the frontend handler's.
pub(super) fn without_window_files(
    mem: &GuestMem,
    window: Option<&Window>,
) -> (GuestMemoryLogged, usize) {
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
    let all = mem.memory();
    let regions: Vec<_> = all
        .iter()
        .map(|r| {
            let fo = r.file_offset();
            let at = window.zip(fo).and_then(|(w, fo)| {
                w.channel
                    .window_offset(fo.file(), fo.start(), r.len())
                    .and_then(|m| r.start_addr().0.checked_sub(m))
            });
            let mapped = window
                .zip(fo)
                .is_some_and(|(w, fo)| w.channel.backs_window(fo.file()));
            (r.start_addr(), r.len(), at, mapped)
        })
        .collect();
    if let Some(w) = window {
        // The base most regions agree on (one file range mapped at two offsets gives one
        // wrong candidate per region; the window's own ranges all give the right one).
        let mut votes: Vec<(u64, usize)> = Vec::new();
        for b in regions.iter().filter_map(|r| r.2) {
            match votes.iter_mut().find(|v| v.0 == b) {
                Some(v) => v.1 += 1,
                None => votes.push((b, 1)),
            }
        }
        if let Some(&(base, _)) = votes.iter().max_by_key(|v| v.1) {
            if w.base.swap(base, Ordering::Relaxed) != base {
                log::debug!("DAX window at guest-physical {base:#x}");
            }
        }
    }
    let span = window.and_then(Window::at);
    let mut keep = Vec::with_capacity(regions.len());
    let mut rest: Option<GuestMemoryLogged> = None;
    let mut left_out = 0;
    for (at, len, base, mapped) in regions {
        // remove_region hands the region out as the Arc the collection holds.
        let taken = match &rest {
            Some(c) => c.remove_region(at, len),
            None => all.remove_region(at, len),
        };
        let Ok((r, region)) = taken else { continue };
        rest = Some(r);
        let inside = span.is_some_and(|w| w.offset_of(at.0, len).is_some());
        if base.is_some() || inside || mapped {
            left_out += 1;
            log::trace!(
                "memory region {:#x}+{len:#x} is the DAX window's: not used for descriptors",
                at.0
            );
        } else {
            keep.push(region);
        }
    }
    (
        GuestMemoryLogged::from_arc_regions(keep).unwrap_or_else(|_| GuestMemoryLogged::new()),
        left_out,
    )
}
