//! Guest memory: one memfd-backed region shared with the backend by `SET_MEM_TABLE`, and a
//! first-fit allocator for rings, indirect tables and request buffers inside it, with a cache
//! of recently freed blocks per length (a benchmark's requests reuse the same few sizes, and
//! the first-fit search over a fragmented list was the driver's largest cost per request).

use std::collections::{BTreeMap, HashMap};
use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Mutex;

use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};

use vhost::VhostUserMemoryRegionInfo;

/// Guest RAM as the backend sees it: `size` bytes at guest physical address `base`.
pub struct GuestMem {
    mem: GuestMemoryMmap<()>,
    file: File,
    base: u64,
    size: u64,
    heap: Mutex<Heap>,
}

/// A block of guest memory handed out by [`GuestMem::alloc`]. Give it back with
/// [`GuestMem::free`]; a block the backend may still touch must not be freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Guest physical address of the first byte.
    pub addr: u64,
    /// Length in bytes (at least what was asked for).
    pub len: u64,
}

impl GuestMem {
    /// Creates `size` bytes of guest memory (rounded up to 2 MiB) at guest address `base`
    /// (page aligned), backed by a fresh memfd.
    pub fn new(base: u64, size: u64) -> io::Result<GuestMem> {
        const ALIGN: u64 = 2 << 20;
        if base % 4096 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("guest memory base {base:#x} is not page aligned"),
            ));
        }
        let size = size
            .checked_next_multiple_of(ALIGN)
            .filter(|s| *s > 0 && base.checked_add(*s).is_some())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "bad guest memory size"))?;
        let file = memfd("vufs-guest-ram")?;
        file.set_len(size)?;
        let len = usize::try_from(size).map_err(io::Error::other)?;
        let fo = FileOffset::new(file.try_clone()?, 0);
        let mem =
            GuestMemoryMmap::<()>::from_ranges_with_files([(GuestAddress(base), len, Some(fo))])
                .map_err(|e| io::Error::other(format!("mapping guest memory: {e}")))?;
        Ok(GuestMem {
            mem,
            file,
            base,
            size,
            heap: Mutex::new(Heap::new(base, size)),
        })
    }

    /// Guest physical address of the first byte.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The `vm-memory` view, for tests that want to poke guest memory directly.
    pub fn memory(&self) -> &GuestMemoryMmap<()> {
        &self.mem
    }

    /// The region description for `SET_MEM_TABLE`.
    pub fn region_info(&self) -> io::Result<VhostUserMemoryRegionInfo> {
        let region = self
            .mem
            .find_region(GuestAddress(self.base))
            .ok_or_else(|| io::Error::other("guest memory has no region"))?;
        let host = region
            .get_host_address(vm_memory::MemoryRegionAddress(0))
            .map_err(|e| io::Error::other(format!("guest memory host address: {e}")))?;
        Ok(VhostUserMemoryRegionInfo {
            guest_phys_addr: self.base,
            memory_size: self.size,
            userspace_addr: host as u64,
            mmap_offset: 0,
            mmap_handle: self.file.as_raw_fd(),
        })
    }

    /// Allocates `len` bytes (at least 1) aligned to `align` (a power of two).
    pub fn alloc(&self, len: u64, align: u64) -> io::Result<Block> {
        let len = len.max(1).next_multiple_of(8);
        let mut heap = self.heap.lock().map_err(|_| poisoned())?;
        heap.alloc(len, align.max(8)).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!(
                    "guest memory exhausted: no {len} free bytes ({} of {} free); \
                     raise DriverConfig::mem_size",
                    heap.free_bytes(),
                    self.size
                ),
            )
        })
    }

    /// Returns a block from [`GuestMem::alloc`].
    pub fn free(&self, block: Block) {
        if let Ok(mut heap) = self.heap.lock() {
            heap.free(block);
        }
    }

    /// Free bytes left in the allocator.
    pub fn free_bytes(&self) -> u64 {
        self.heap.lock().map(|h| h.free_bytes()).unwrap_or(0)
    }

    /// `len` bytes at `addr` as one slice (guest memory is a single region).
    fn slice(&self, addr: u64, len: usize) -> io::Result<vm_memory::VolatileSlice<'_>> {
        self.mem
            .get_slice(GuestAddress(addr), len)
            .map_err(|e| io::Error::other(format!("guest access at {addr:#x}+{len:#x}: {e}")))
    }

    /// Copies `data` to guest address `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> io::Result<()> {
        self.slice(addr, data.len())?.copy_from(data);
        Ok(())
    }

    /// Copies guest bytes at `addr` into `buf`.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        self.slice(addr, buf.len())?.copy_to(buf);
        Ok(())
    }

    /// Writes a plain-old-data value at `addr`.
    pub fn write_obj<T: vm_memory::ByteValued>(&self, addr: u64, val: T) -> io::Result<()> {
        self.write(addr, val.as_slice())
    }

    /// Reads a plain-old-data value at `addr`.
    pub fn read_obj<T: vm_memory::ByteValued + Default>(&self, addr: u64) -> io::Result<T> {
        let mut v = T::default();
        self.read(addr, v.as_mut_slice())?;
        Ok(v)
    }

    /// Atomic 16-bit store (ring indices).
    pub(crate) fn store_u16(
        &self,
        addr: u64,
        v: u16,
        o: std::sync::atomic::Ordering,
    ) -> io::Result<()> {
        self.mem
            .store(v, GuestAddress(addr), o)
            .map_err(|e| io::Error::other(format!("guest store at {addr:#x}: {e}")))
    }

    /// Atomic 16-bit load (ring indices).
    pub(crate) fn load_u16(&self, addr: u64, o: std::sync::atomic::Ordering) -> io::Result<u16> {
        self.mem
            .load(GuestAddress(addr), o)
            .map_err(|e| io::Error::other(format!("guest load at {addr:#x}: {e}")))
    }
}

fn poisoned() -> io::Error {
    io::Error::other("guest memory allocator lock poisoned")
}

/// Creates an anonymous memory file (close-on-exec).
pub(crate) fn memfd(name: &str) -> io::Result<File> {
    let mut cname = name.as_bytes().to_vec();
    cname.push(0);
    let cname = CStr::from_bytes_with_nul(&cname).map_err(io::Error::other)?;
    // SAFETY: `cname` is a valid NUL-terminated string that outlives the call; the flags are
    // valid for memfd_create.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create, is valid and owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Freed blocks kept per length for reuse, at most this many per length...
const CACHE_PER_LEN: usize = 64;
/// ...and at most this many bytes in all (the rest goes back to the free list).
const CACHE_BYTES: u64 = 8 << 20;

/// The allocator: a cache of freed blocks by length in front of the free list.
struct Heap {
    list: FreeList,
    cache: HashMap<u64, Vec<u64>>,
    cached: u64,
}

impl Heap {
    fn new(start: u64, len: u64) -> Heap {
        Heap {
            list: FreeList::new(start, len),
            cache: HashMap::new(),
            cached: 0,
        }
    }

    fn free_bytes(&self) -> u64 {
        self.list.free_bytes() + self.cached
    }

    fn alloc(&mut self, len: u64, align: u64) -> Option<Block> {
        if let Some(v) = self.cache.get_mut(&len) {
            if let Some(i) = v.iter().rposition(|a| a % align == 0) {
                let addr = v.swap_remove(i);
                self.cached -= len;
                return Some(Block { addr, len });
            }
        }
        self.list.alloc(len, align).or_else(|| {
            // Out of contiguous room: give the cache back and try once more.
            for (len, v) in self.cache.drain() {
                for addr in v {
                    self.list.free(Block { addr, len });
                }
            }
            self.cached = 0;
            self.list.alloc(len, align)
        })
    }

    fn free(&mut self, b: Block) {
        if self.cached + b.len <= CACHE_BYTES {
            let v = self.cache.entry(b.len).or_default();
            if v.len() < CACHE_PER_LEN {
                v.push(b.addr);
                self.cached += b.len;
                return;
            }
        }
        self.list.free(b);
    }
}

/// First-fit free list over `[start, start+len)`, coalescing on free.
struct FreeList {
    free: BTreeMap<u64, u64>,
}

impl FreeList {
    fn new(start: u64, len: u64) -> FreeList {
        let mut free = BTreeMap::new();
        free.insert(start, len);
        FreeList { free }
    }

    fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    fn alloc(&mut self, len: u64, align: u64) -> Option<Block> {
        let (start, flen, addr) = self.free.iter().find_map(|(&s, &l)| {
            let addr = s.checked_next_multiple_of(align)?;
            (addr.checked_add(len)? <= s + l).then_some((s, l, addr))
        })?;
        self.free.remove(&start);
        if addr > start {
            self.free.insert(start, addr - start);
        }
        let end = addr + len;
        if end < start + flen {
            self.free.insert(end, start + flen - end);
        }
        Some(Block { addr, len })
    }

    fn free(&mut self, b: Block) {
        let (mut start, mut len) = (b.addr, b.len);
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            if ps + pl == start {
                self.free.remove(&ps);
                start = ps;
                len += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += nl;
        }
        self.free.insert(start, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_list_coalesces() {
        let mut f = FreeList::new(0x1000, 0x10000);
        let a = f.alloc(100, 8).unwrap();
        let b = f.alloc(4096, 4096).unwrap();
        assert_eq!(b.addr % 4096, 0);
        let c = f.alloc(8, 8).unwrap();
        f.free(b);
        f.free(a);
        f.free(c);
        assert_eq!(f.free.len(), 1);
        assert_eq!(f.free_bytes(), 0x10000);
    }

    #[test]
    fn freed_blocks_are_reused_and_counted() {
        let mut h = Heap::new(0x1000, 0x4000);
        let a = h.alloc(4096, 4096).unwrap();
        h.free(a);
        assert_eq!(h.free_bytes(), 0x4000);
        assert_eq!(h.alloc(4096, 4096).unwrap(), a);
        // A cached block that does not meet a larger alignment is not handed out for it.
        let b = h.alloc(64, 8).unwrap();
        let c = h.alloc(64, 8).unwrap();
        h.free(b);
        h.free(c);
        let d = h.alloc(64, 4096);
        assert!(d.is_none_or(|d| d.addr % 4096 == 0));
        // When the list runs dry, the cache is given back to it.
        let mut h = Heap::new(0, 0x2000);
        let x = h.alloc(0x1000, 8).unwrap();
        h.free(x);
        assert_eq!(h.alloc(0x2000, 8).map(|b| b.len), Some(0x2000));
    }

    #[test]
    fn guest_mem_round_trip() {
        let m = GuestMem::new(0x4000_0000, 1).unwrap();
        assert_eq!(m.size(), 2 << 20);
        let b = m.alloc(16, 16).unwrap();
        m.write(b.addr, b"hello").unwrap();
        let mut buf = [0u8; 5];
        m.read(b.addr, &mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        assert!(m.read(0, &mut buf).is_err());
        m.free(b);
        assert_eq!(m.free_bytes(), 2 << 20);
    }
}
