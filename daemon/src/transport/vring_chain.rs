//! Descriptor chains of a split virtqueue, resolved to host memory.
//!
//! [`walk_chain`] is the request path: it reads the chain's descriptors straight from the
//! descriptor table (found once per chain with one region look-up) and turns each buffer that
//! lies inside one guest memory region into a slice with one more look-up. Anything else (a
//! table or a buffer that straddles regions or lies outside them) takes the generic `vm-memory`
//! path for that piece, so the result never depends on which path served it.
//!
//! It follows `virtio-queue`'s `DescriptorChain` rule for rule (its [`split_chain`] is the
//! reference, kept for the fuzz target that compares the two): a chain ends at a descriptor
//! without NEXT, after `queue size` descriptors (a loop), at a `next` index or table entry
//! that does not exist, at a second level of indirection or a malformed indirect table, or
//! when the total length would pass `u32::MAX`. Then [`split_chain`]'s checks: readable
//! buffers come first, each lies in guest memory, at least one is readable.
//!
//! A buffer in the DAX window ([`WindowAt`]) becomes a far segment ([`Seg::Far`]) at its
//! window offset: the transport's memory never maps the window (its host files may shrink
//! under a mapping), and the window moves those bytes with `pread`/`pwrite` on what backs
//! them.
//!
//! Why: `protobench` (4 KiB READ, depth 16) spent about 30% of the daemon's time reading
//! descriptors and building slices through `vm-memory`'s generic accessors (each 16-byte
//! descriptor a bounds-checked copy through a slice iterator), and the queue thread walked
//! every chain twice (once for the opcode). See the commit message for the numbers.

use std::ops::Deref;

use virtio_queue::DescriptorChain;
use vm_memory::bitmap::Bitmap;
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemory, GuestMemoryBackend, GuestMemoryMmap,
    GuestMemoryRegion, MemoryRegionAddress, Permissions, VolatileSlice,
};

use crate::protocol::iobuf::Seg;

/// A popped chain: where its descriptor table is, how many entries it has, its head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainAt {
    pub table: u64,
    pub size: u16,
    pub head: u16,
}

/// The device-readable and device-writable buffers of a chain, in order.
pub type Split<'a> = (Vec<Seg<'a>>, Vec<Seg<'a>>);

/// Where the DAX window is in guest-physical space: buffers inside it are far segments at
/// their window offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowAt {
    pub base: u64,
    pub size: u64,
}

impl WindowAt {
    /// The window offset of `len` bytes at guest address `addr`, when all lie in the window.
    pub fn offset_of(&self, addr: u64, len: u64) -> Option<u64> {
        let off = addr.checked_sub(self.base)?;
        (off.checked_add(len)? <= self.size).then_some(off)
    }
}

const DESC_SIZE: u64 = 16;
const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;

/// The host address of `len` bytes at guest address `addr`, when they lie inside one region.
fn resolve<B: Bitmap>(mem: &GuestMemoryMmap<B>, addr: u64, len: u64) -> Option<*mut u8> {
    let region = mem.find_region(GuestAddress(addr))?;
    let off = addr.checked_sub(region.start_addr().raw_value())?;
    if off.checked_add(len)? > region.len() {
        return None;
    }
    region.get_host_address(MemoryRegionAddress(off)).ok()
}

/// A descriptor table (the queue's, or an indirect one).
struct Table<'m, B: Bitmap> {
    mem: &'m GuestMemoryMmap<B>,
    addr: u64,
    len: u16,
    /// The whole table in host memory, when it lies inside one region.
    host: Option<*const u8>,
}

impl<'m, B: Bitmap> Table<'m, B> {
    fn new(mem: &'m GuestMemoryMmap<B>, addr: u64, len: u16) -> Self {
        let host = resolve(mem, addr, u64::from(len) * DESC_SIZE).map(|p| p as *const u8);
        Table {
            mem,
            addr,
            len,
            host,
        }
    }

    /// Entry `i` (< `len`): (addr, len, flags, next), or `None` where it cannot be read.
    fn read(&self, i: u16) -> Option<(u64, u32, u16, u16)> {
        debug_assert!(i < self.len);
        // Entry `i` of a table that `host` maps whole: `host` maps the table's `len` entries
        // (checked in `resolve`, inside one region of `mem`, which stays mapped while `mem` is
        // borrowed) and `i < len`, so the 16 bytes at `p` lie inside it. The guest may change
        // them at any time: the reads are volatile and every value read is validated by the
        // caller before use.
        let (lo, hi): (u64, u64) = match self.host {
            Some(h) if h as usize % 8 == 0 => {
                // SAFETY: in bounds as above; `h` and the entry size are multiples of 8, so
                // both u64 reads are aligned.
                let p = unsafe { h.add(usize::from(i) * DESC_SIZE as usize) }.cast::<u64>();
                // SAFETY: `p` and `p + 1` are the entry's two aligned words (above).
                unsafe { (p.read_volatile(), p.add(1).read_volatile()) }
            }
            Some(h) => {
                // An indirect table the guest did not align: bytewise.
                // SAFETY: in bounds as above; a [u8; 16] read needs no alignment.
                let raw: [u8; 16] = unsafe {
                    std::ptr::read_volatile(h.add(usize::from(i) * DESC_SIZE as usize).cast())
                };
                split_raw(raw)
            }
            None => {
                let at = self.addr.checked_add(u64::from(i) * DESC_SIZE)?;
                split_raw(self.mem.read_obj(GuestAddress(at)).ok()?)
            }
        };
        // Little endian: addr, then len (u32), flags (u16), next (u16).
        let (lo, hi) = (u64::from_le(lo), u64::from_le(hi));
        Some((lo, hi as u32, (hi >> 32) as u16, (hi >> 48) as u16))
    }
}

/// A raw descriptor as its two little-endian 64-bit words, in memory order.
fn split_raw(raw: [u8; 16]) -> (u64, u64) {
    let word = |o: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&raw[o..o + 8]);
        u64::from_ne_bytes(w)
    };
    (word(0), word(8))
}

/// Appends the host slices of guest buffer `addr`+`len` to `out`: one slice when the buffer
/// lies inside one region, else `vm-memory`'s generic path splits it at region boundaries and
/// checks it.
fn push_buffer<'a, B: Bitmap>(
    mem: &'a GuestMemoryMmap<B>,
    window: Option<WindowAt>,
    addr: u64,
    len: u32,
    access: Permissions,
    out: &mut Vec<Seg<'a>>,
) -> Result<(), String> {
    if len == 0 {
        return Ok(());
    }
    if let Some(p) = resolve(mem, addr, u64::from(len)) {
        // SAFETY: `p`..`p + len` lies inside one region of `mem` (checked in `resolve`),
        // mapped for as long as `mem` is borrowed, the slice's lifetime.
        out.push(Seg::Mem(unsafe { VolatileSlice::new(p, len as usize) }));
        return Ok(());
    }
    if let Some(at) = window.and_then(|w| w.offset_of(addr, u64::from(len))) {
        out.push(Seg::Far {
            at,
            len: len as usize,
        });
        return Ok(());
    }
    let bad = |e: vm_memory::GuestMemoryError| {
        format!("descriptor {addr:#x}+{len:#x} outside guest memory: {e}")
    };
    let slices = GuestMemory::get_slices(mem, GuestAddress(addr), len as usize, access);
    for s in slices.map_err(bad)? {
        let s = s.map_err(bad)?;
        // SAFETY: `s` lies inside a region of `mem`, which is mapped (mmap-backed memory:
        // the pointer stays valid without a guard) for as long as `mem` is borrowed, the
        // lifetime of the returned slice; only the bitmap is dropped.
        out.push(Seg::Mem(unsafe {
            VolatileSlice::new(s.ptr_guard_mut().as_ptr(), s.len())
        }));
    }
    Ok(())
}

/// Adds one descriptor's buffer to the readable or writable side.
fn add<'a, B: Bitmap>(
    mem: &'a GuestMemoryMmap<B>,
    window: Option<WindowAt>,
    (addr, len, write): (u64, u32, bool),
    (readable, writable): &mut Split<'a>,
) -> Result<(), String> {
    if !write && !writable.is_empty() {
        return Err("readable descriptor after a writable one".into());
    }
    if write {
        push_buffer(mem, window, addr, len, Permissions::Write, writable)
    } else {
        push_buffer(mem, window, addr, len, Permissions::Read, readable)
    }
}

/// A chain that [`walk_chain`] refused, with what could be resolved of it: the readable and
/// writable buffers up to the first bad one of each side (enough to answer with an error
/// when its header and out-header are among them).
pub struct Malformed<'a> {
    pub why: String,
    pub partial: Split<'a>,
}

/// The chain at `at`, split into its readable and writable parts in host memory (buffers in
/// `window` as far segments).
pub fn walk_chain<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    at: ChainAt,
    window: Option<WindowAt>,
) -> Result<Split<'_>, String> {
    walk(mem, at, window).map_err(|m| m.why)
}

/// [`walk_chain`], keeping what could be resolved of a refused chain.
pub fn walk<B: Bitmap>(
    mem: &GuestMemoryMmap<B>,
    at: ChainAt,
    window: Option<WindowAt>,
) -> Result<Split<'_>, Malformed<'_>> {
    // A FUSE request is typically 2-4 buffers each way: one allocation per side.
    let mut split = (Vec::with_capacity(4), Vec::with_capacity(4));
    let mut table = Table::new(mem, at.table, at.size);
    let (mut next, mut ttl, mut indirect, mut total) = (at.head, at.size, false, 0u32);
    // The first refusal; the walk goes on to the chain's end, resolving what it can of the
    // side that has not failed yet (for the error reply).
    let mut why: Option<String> = None;
    let (mut bad_r, mut bad_w) = (false, false);
    while ttl > 0 && next < table.len {
        let Some((addr, len, flags, follow)) = table.read(next) else {
            break;
        };
        if flags & F_INDIRECT != 0 {
            let entries = u64::from(len) / DESC_SIZE;
            if indirect || u64::from(len) % DESC_SIZE != 0 || entries > u64::from(u16::MAX) {
                break;
            }
            let entries = entries as u16;
            table = Table::new(mem, addr, entries);
            (next, ttl, indirect) = (0, entries, true);
            continue;
        }
        let Some(t) = total.checked_add(len) else {
            break;
        };
        total = t;
        if flags & F_NEXT != 0 {
            next = follow;
            ttl -= 1;
        } else {
            ttl = 0;
        }
        let write = flags & F_WRITE != 0;
        if (write && bad_w) || (!write && bad_r) {
            continue;
        }
        if let Err(e) = add(mem, window, (addr, len, write), &mut split) {
            if write {
                bad_w = true;
            } else {
                bad_r = true;
            }
            why.get_or_insert(e);
        }
    }
    if split.0.is_empty() {
        why.get_or_insert_with(|| "chain has no readable descriptor".into());
    }
    match why {
        Some(why) => Err(Malformed {
            why,
            partial: split,
        }),
        None => Ok(split),
    }
}

/// Splits a chain into its device-readable and device-writable parts, resolved to host
/// memory, through `virtio-queue`'s own chain iterator and `vm-memory`'s generic accessors:
/// the reference [`walk_chain`] is checked against. Works on guest memory with any dirty
/// bitmap; the slices it returns carry none (the caller marks what it wrote).
pub fn split_chain<B: Bitmap, M: Deref<Target = GuestMemoryMmap<B>>>(
    mem: &GuestMemoryMmap<B>,
    chain: DescriptorChain<M>,
) -> Result<Split<'_>, String> {
    let mut split = (Vec::with_capacity(4), Vec::with_capacity(4));
    for desc in chain {
        add(
            mem,
            None,
            (desc.addr().0, desc.len(), desc.is_write_only()),
            &mut split,
        )?;
    }
    if split.0.is_empty() {
        return Err("chain has no readable descriptor".into());
    }
    Ok(split)
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_bindings::bindings::virtio_ring::{
        VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    };
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::{Queue, QueueT};

    const QSIZE: u16 = 16;

    /// Host (address, length) pieces, readable then writable.
    type Spans = (Vec<(usize, usize)>, Vec<(usize, usize)>);

    fn spans(s: &Split<'_>) -> Spans {
        let f = |v: &Vec<Seg<'_>>| {
            v.iter()
                .map(|s| match s {
                    Seg::Mem(s) => (s.ptr_guard().as_ptr() as usize, s.len()),
                    Seg::Far { at, len } => (*at as usize, *len),
                })
                .collect()
        };
        (f(&s.0), f(&s.1))
    }

    /// Both walkers over a table the test writes entry by entry; head 0.
    fn both(mem: &GuestMemoryMmap, descs: &[(u64, u32, u16, u16)]) -> (String, String) {
        let vq = MockSplitQueue::new(mem, QSIZE);
        for (i, &(addr, len, flags, next)) in descs.iter().enumerate() {
            let d = RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next));
            vq.desc_table().store(i as u16, d).unwrap();
        }
        vq.avail().ring().ref_at(0).unwrap().store(0);
        vq.avail().idx().store(1);
        let mut q: Queue = vq.create_queue().unwrap();
        let chain = q.pop_descriptor_chain(mem).unwrap();
        let at = ChainAt {
            table: q.desc_table(),
            size: q.size(),
            head: chain.head_index(),
        };
        let show = |r: Result<Split<'_>, String>| match r {
            Ok(s) => format!("{:?}", spans(&s)),
            Err(_) => "error".into(),
        };
        (
            show(walk_chain(mem, at, None)),
            show(split_chain(mem, chain)),
        )
    }

    fn two_regions() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 0x10_0000),
            (GuestAddress(0x10_0000), 0x10_0000),
        ])
        .unwrap()
    }

    #[test]
    fn walkers_agree_on_shapes() {
        let m = two_regions();
        let (n, w, i) = (
            VRING_DESC_F_NEXT as u16,
            VRING_DESC_F_WRITE as u16,
            VRING_DESC_F_INDIRECT as u16,
        );
        // An indirect table at 0x8000 with a request and a reply.
        let ind = [(0x9000u64, 40u32, n, 1u16), (0xa000, 4096, w, 0)];
        for (k, &(a, l, f, x)) in ind.iter().enumerate() {
            let d = RawDescriptor::from(SplitDescriptor::new(a, l, f, x));
            m.write_obj(d, GuestAddress(0x8000 + 16 * k as u64))
                .unwrap();
        }
        let cases: Vec<Vec<(u64, u32, u16, u16)>> = vec![
            // Plain: readable, readable, writable.
            vec![(0x4000, 40, n, 1), (0x4100, 24, n, 2), (0x5000, 4096, w, 0)],
            // A buffer across the region boundary (generic path, two slices).
            vec![(0xf_ff00, 0x200, n, 1), (0x5000, 64, w, 0)],
            // Writable before readable: error.
            vec![(0x5000, 64, w | n, 1), (0x4000, 40, 0, 0)],
            // Outside guest memory: error.
            vec![(0x20_0000 - 8, 64, n, 1), (0x5000, 64, w, 0)],
            // A loop: ends after QSIZE descriptors, both the same way.
            vec![(0x4000, 8, n, 1), (0x4100, 8, n, 0)],
            // next out of range: the chain ends there.
            vec![(0x4000, 40, n, 99)],
            // Indirect, and an indirect table with a bad length.
            vec![(0x8000, 32, i, 0)],
            // An indirect table the guest did not align (read bytewise).
            vec![(0x8004, 32, i, 0)],
            vec![(0x8000, 31, i, 0)],
            // Zero-length buffers are skipped.
            vec![(0x4000, 0, n, 1), (0x4000, 40, n, 2), (0x5000, 0, w, 0)],
            // Total length past u32::MAX: the chain ends before the overflowing buffer.
            vec![(0x4000, 40, n, 1), (0x4000, u32::MAX, w, 0)],
        ];
        for c in cases {
            let (fast, reference) = both(&m, &c);
            assert_eq!(fast, reference, "chain {c:x?}");
        }
    }
}
