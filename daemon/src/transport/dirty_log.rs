//! Dirty-page logging for live migration: the pieces of a reply written into guest memory,
//! marked in the frontend's log once the reply is written.

use super::vhost_user::GuestMemoryLogged;
use crate::protocol::iobuf::Seg;

/// The host (address, length) pieces of a reply, without an allocation for the usual few.
pub(super) enum Spans {
    Inline([(usize, usize); 4], usize),
    Heap(Vec<(usize, usize)>),
}

impl Spans {
    pub(super) fn of(writable: &[Seg<'_>]) -> Self {
        // A far segment is no guest RAM: address 0 lies in no region and is skipped.
        let span = |s: &Seg<'_>| match s {
            Seg::Mem(s) => (s.ptr_guard().as_ptr() as usize, s.len()),
            Seg::Far { len, .. } => (0, *len),
        };
        if writable.len() > 4 {
            return Spans::Heap(writable.iter().map(span).collect());
        }
        let mut a = [(0, 0); 4];
        for (d, s) in a.iter_mut().zip(writable) {
            *d = span(s);
        }
        Spans::Inline(a, writable.len())
    }

    pub(super) fn as_slice(&self) -> &[(usize, usize)] {
        match self {
            Spans::Inline(a, n) => &a[..*n],
            Spans::Heap(v) => v,
        }
    }
}

/// Marks the first `written` bytes of a reply dirty in the frontend's migration log (a no-op
/// until SET_LOG_BASE). `spans` are the host (address, length) pieces of the writable part,
/// in order; each is found in the region whose host mapping holds it (addresses only, no
/// memory is touched).
pub(super) fn mark_written(mem: &GuestMemoryLogged, spans: &[(usize, usize)], written: usize) {
    use vm_memory::bitmap::Bitmap;
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
    if written == 0 {
        return;
    }
    // The regions by host address, once per request; each span then finds its region by
    // binary search (a chain may hold 65,535 buffers, the table up to 512 regions).
    let mut regions: Vec<(usize, usize, _)> = mem
        .iter()
        .filter_map(|r| {
            let base = r.get_host_address(vm_memory::MemoryRegionAddress(0)).ok()?;
            Some((base as usize, r.len() as usize, r))
        })
        .collect();
    regions.sort_unstable_by_key(|&(base, _, _)| base);
    let mut left = written;
    for &(host, len) in spans {
        if left == 0 {
            break;
        }
        let n = len.min(left);
        left -= n;
        let i = regions.partition_point(|&(base, _, _)| base <= host);
        if let Some(&(base, size, region)) = i.checked_sub(1).and_then(|i| regions.get(i)) {
            if host - base < size {
                region
                    .bitmap()
                    .mark_dirty(host - base, n.min(size - (host - base)));
            }
        }
    }
}
