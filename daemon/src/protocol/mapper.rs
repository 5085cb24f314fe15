//! The DAX seam: mapping file ranges into the device's shared-memory cache window.
//!
//! The FUSE server turns SETUPMAPPING into [`Mapper::map`] (through the filesystem, which
//! opens the file) and REMOVEMAPPING into [`Mapper::unmap`]. Implementations: [`NoMapper`]
//! (no window: ENOSYS, like upstream virtiofsd), `testing::RecordingMapper` (tests), and the real
//! window over vhost-user `SHMEM_MAP`/`SHMEM_UNMAP` in [`crate::dax`].

use std::io;
use std::os::fd::BorrowedFd;

/// Maps and unmaps ranges of the cache window.
pub trait Mapper: Send + Sync {
    /// Size of the window in bytes; 0 when there is none.
    fn window_size(&self) -> u64;
    /// Maps `len` bytes of `fd` at `foffset` to window offset `moffset`, for inode `owner`.
    fn map(
        &self,
        owner: u64,
        moffset: u64,
        len: u64,
        fd: BorrowedFd,
        foffset: u64,
        writable: bool,
    ) -> io::Result<()>;
    /// Unmaps `len` bytes at window offset `moffset`.
    fn unmap(&self, moffset: u64, len: u64) -> io::Result<()>;
    /// Inode `owner` is about to be read, written or synced through the request queue:
    /// bring the file up to date with what the guest wrote through the window.
    fn sync(&self, _owner: u64) {}
    /// Inode `owner` may have changed size through the request queue: update its mappings.
    fn refresh(&self, _owner: u64) {}
    /// Inode `owner`'s file may shrink to `size` through the request queue (SETATTR with a
    /// size, an O_TRUNC open): no frontend mapping of the file may reach past it meanwhile,
    /// whether the request succeeds or fails half way.
    fn shrinking(&self, _owner: u64, _size: u64) {}
    /// Inode `owner` is being looked at (GETATTR): a cheap check that copies of it are not
    /// older than the file (DAX copy slots).
    fn revalidate(&self, _owner: u64) {}
    /// Bytes `[offset, offset + len)` of inode `owner` were just written through the request
    /// queue: copies of them must show the write before the reply.
    fn written(&self, _owner: u64, _offset: u64, _len: u64) {}
    /// The guest synced the whole share (SYNCFS, FSYNCDIR), a periodic write-back or a clean
    /// exit: write every tail the guest changed back to its file.
    fn sync_all(&self) {}
    /// The FUSE session ended (DESTROY, a new INIT, a device reset): remove every mapping.
    fn end_session(&self) {}
}

/// A shared mapper (the daemon keeps a handle to its window for counters and shutdown).
impl<M: Mapper + ?Sized> Mapper for std::sync::Arc<M> {
    fn window_size(&self) -> u64 {
        (**self).window_size()
    }
    fn map(
        &self,
        owner: u64,
        moffset: u64,
        len: u64,
        fd: BorrowedFd,
        foffset: u64,
        writable: bool,
    ) -> io::Result<()> {
        (**self).map(owner, moffset, len, fd, foffset, writable)
    }
    fn unmap(&self, moffset: u64, len: u64) -> io::Result<()> {
        (**self).unmap(moffset, len)
    }
    fn sync(&self, owner: u64) {
        (**self).sync(owner)
    }
    fn refresh(&self, owner: u64) {
        (**self).refresh(owner)
    }
    fn revalidate(&self, owner: u64) {
        (**self).revalidate(owner)
    }
    fn written(&self, owner: u64, offset: u64, len: u64) {
        (**self).written(owner, offset, len)
    }
    fn sync_all(&self) {
        (**self).sync_all()
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
    fn map(&self, _: u64, _: u64, _: u64, _: BorrowedFd, _: u64, _: bool) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }
    fn unmap(&self, _: u64, _: u64) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }
}
