//! The DAX seam: mapping file ranges into the device's shared-memory cache window.
//!
//! The FUSE server turns SETUPMAPPING into [`Mapper::map`] (through the filesystem, which
//! opens the file) and REMOVEMAPPING into [`Mapper::unmap`]. Implementations: [`NoMapper`]
//! (no window: ENOSYS, like upstream virtiofsd), `testing::RecordingMapper` (tests), and the real
//! window over vhost-user `SHMEM_MAP`/`SHMEM_UNMAP` in [`crate::dax`] (which also keeps the
//! window coherent with the request path: `dax::coherent::Coherence`).

use std::io;
use std::os::fd::BorrowedFd;

/// One SETUPMAPPING as the filesystem hands it to the mapper: a range of an open file to
/// map at a window offset.
#[derive(Debug, Clone, Copy)]
pub struct MapRequest<'a> {
    /// The inode the range belongs to (the one the request named): the key of the window's
    /// bookkeeping for that file.
    pub owner: u64,
    /// Window offset of the mapping (page aligned, inside the window).
    pub moffset: u64,
    /// Length of the mapping in bytes (page aligned, non-zero).
    pub len: u64,
    /// The file, opened by the filesystem (read-write when it could be, read-only otherwise).
    pub fd: BorrowedFd<'a>,
    /// File offset the mapping starts at (page aligned).
    pub foffset: u64,
    /// Whether the guest may store through the mapping.
    pub writable: bool,
}

/// Maps and unmaps ranges of the cache window.
pub trait Mapper: Send + Sync {
    /// Size of the window in bytes; 0 when there is none.
    fn window_size(&self) -> u64;
    /// Maps `req.len` bytes of `req.fd` at `req.foffset` to window offset `req.moffset`.
    fn map(&self, req: &MapRequest<'_>) -> io::Result<()>;
    /// Unmaps `len` bytes at window offset `moffset`.
    fn unmap(&self, moffset: u64, len: u64) -> io::Result<()>;
    /// The FUSE session ended (DESTROY, a new INIT, a device reset): remove every mapping.
    fn end_session(&self) {}
}

/// A shared mapper (the daemon keeps a handle to its window for counters and shutdown).
impl<M: Mapper + ?Sized> Mapper for std::sync::Arc<M> {
    fn window_size(&self) -> u64 {
        (**self).window_size()
    }
    fn map(&self, req: &MapRequest<'_>) -> io::Result<()> {
        (**self).map(req)
    }
    fn unmap(&self, moffset: u64, len: u64) -> io::Result<()> {
        (**self).unmap(moffset, len)
    }
    fn end_session(&self) {
        (**self).end_session()
    }
}

/// No cache window: every request fails with `ENOSYS`.
#[derive(Debug, Default)]
pub struct NoMapper;

impl Mapper for NoMapper {
    fn window_size(&self) -> u64 {
        0
    }
    fn map(&self, _: &MapRequest<'_>) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }
    fn unmap(&self, _: u64, _: u64) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }
}
