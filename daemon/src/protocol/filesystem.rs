//! The filesystem seam: what the FUSE server asks of whatever holds the files.
//!
//! Every method has a default that fails with `ENOSYS`, so a filesystem implements only
//! what it supports. Arguments are already decoded and validated by the server (names are
//! single, NUL-free, non-empty path components of at most `NAME_MAX` bytes; sizes are
//! within the negotiated limits); a filesystem still must not trust inode numbers or
//! handles, which come straight from the guest.

use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use crate::protocol::abi::{Attr, FileLock, Kstatfs, SetattrIn};
use crate::protocol::iobuf::{Reader, Writer};
use crate::protocol::mapper::Mapper;

/// Inode number as the guest sees it.
pub type Inode = u64;
/// Open file or directory handle as the guest sees it.
pub type Handle = u64;

/// Who sent a request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Context {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// The answer to a lookup-like request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Entry {
    pub inode: Inode,
    pub generation: u64,
    pub attr: Attr,
    pub attr_timeout: Duration,
    pub entry_timeout: Duration,
}

/// One directory entry handed to the server's reply builder.
#[derive(Debug, Clone, Copy)]
pub struct DirEntry<'a> {
    pub ino: u64,
    /// Offset of the *next* entry (what the guest passes to continue after this one).
    pub offset: u64,
    /// `DT_*` type.
    pub typ: u32,
    pub name: &'a [u8],
}

/// Result of GETXATTR/LISTXATTR: the value, or only its size when the guest asked with 0.
#[derive(Debug, PartialEq, Eq)]
pub enum XattrReply {
    Value(Vec<u8>),
    Count(u32),
}

/// Features the client offers, and the filesystem picks from, in INIT.
#[derive(Debug, Clone, Copy, Default)]
pub struct InitCaps {
    /// `init_flags::*` the client offered (flags | flags2 << 32).
    pub flags: u64,
}

/// Open options returned by OPEN/OPENDIR/CREATE (`fopen::*` flags).
pub type OpenFlags = u32;

/// Sink for READDIR/READDIRPLUS entries. Returns `Ok(false)` once the reply is full (the
/// entry was *not* added), so the filesystem can stop and undo side effects of that entry.
pub type AddEntry<'a> = dyn FnMut(DirEntry, Option<&Entry>) -> io::Result<bool> + 'a;

fn enosys<T>() -> io::Result<T> {
    Err(io::Error::from_raw_os_error(libc::ENOSYS))
}

/// A filesystem served over FUSE. Methods take `&self`: requests arrive concurrently from
/// several queues, so implementations synchronise internally.
#[allow(unused_variables, clippy::too_many_arguments)]
pub trait FileSystem: Send + Sync {
    /// Session start: returns the `init_flags` the filesystem wants out of `caps.flags`.
    fn init(&self, caps: InitCaps) -> io::Result<u64> {
        Ok(0)
    }
    /// Session end (DESTROY, device reset, disconnect): drop every inode and handle.
    fn destroy(&self) {}
    /// Requests waiting indefinitely (SETLKW) give up now with EINTR: the transport must
    /// complete them (a vring is stopping).
    fn interrupt_waits(&self) {}

    fn lookup(&self, ctx: &Context, parent: Inode, name: &CStr) -> io::Result<Entry> {
        enosys()
    }
    fn forget(&self, ctx: &Context, inode: Inode, count: u64) {}
    fn batch_forget(&self, ctx: &Context, requests: &[(Inode, u64)]) {
        for &(inode, count) in requests {
            self.forget(ctx, inode, count);
        }
    }
    fn getattr(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Option<Handle>,
    ) -> io::Result<(Attr, Duration)> {
        enosys()
    }
    fn setattr(
        &self,
        ctx: &Context,
        inode: Inode,
        attr: &SetattrIn,
        handle: Option<Handle>,
    ) -> io::Result<(Attr, Duration)> {
        enosys()
    }
    fn readlink(&self, ctx: &Context, inode: Inode) -> io::Result<Vec<u8>> {
        enosys()
    }
    fn symlink(
        &self,
        ctx: &Context,
        target: &CStr,
        parent: Inode,
        name: &CStr,
    ) -> io::Result<Entry> {
        enosys()
    }
    fn mknod(
        &self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        enosys()
    }
    fn mkdir(
        &self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        enosys()
    }
    fn unlink(&self, ctx: &Context, parent: Inode, name: &CStr) -> io::Result<()> {
        enosys()
    }
    fn rmdir(&self, ctx: &Context, parent: Inode, name: &CStr) -> io::Result<()> {
        enosys()
    }
    fn rename(
        &self,
        ctx: &Context,
        olddir: Inode,
        oldname: &CStr,
        newdir: Inode,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        enosys()
    }
    fn link(
        &self,
        ctx: &Context,
        inode: Inode,
        newparent: Inode,
        newname: &CStr,
    ) -> io::Result<Entry> {
        enosys()
    }
    fn open(
        &self,
        ctx: &Context,
        inode: Inode,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Handle, OpenFlags)> {
        enosys()
    }
    fn create(
        &self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        flags: u32,
        umask: u32,
        fuse_flags: u32,
    ) -> io::Result<(Entry, Handle, OpenFlags)> {
        enosys()
    }
    /// Reads up to `size` bytes at `offset` straight into `w`; returns the bytes read.
    fn read(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        w: &mut Writer,
        size: u32,
        offset: u64,
    ) -> io::Result<usize> {
        enosys()
    }
    /// Writes `size` bytes from `r` at `offset`; returns the bytes written.
    fn write(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        r: &mut Reader,
        size: u32,
        offset: u64,
        kill_priv: bool,
    ) -> io::Result<usize> {
        enosys()
    }
    fn statfs(&self, ctx: &Context, inode: Inode) -> io::Result<Kstatfs> {
        enosys()
    }
    fn release(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        flock_release: bool,
        lock_owner: u64,
    ) -> io::Result<()> {
        enosys()
    }
    fn fsync(&self, ctx: &Context, inode: Inode, datasync: bool, handle: Handle) -> io::Result<()> {
        enosys()
    }
    fn setxattr(
        &self,
        ctx: &Context,
        inode: Inode,
        name: &CStr,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
    ) -> io::Result<()> {
        enosys()
    }
    fn getxattr(
        &self,
        ctx: &Context,
        inode: Inode,
        name: &CStr,
        size: u32,
    ) -> io::Result<XattrReply> {
        enosys()
    }
    fn listxattr(&self, ctx: &Context, inode: Inode, size: u32) -> io::Result<XattrReply> {
        enosys()
    }
    fn removexattr(&self, ctx: &Context, inode: Inode, name: &CStr) -> io::Result<()> {
        enosys()
    }
    fn flush(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        lock_owner: u64,
    ) -> io::Result<()> {
        enosys()
    }
    fn opendir(&self, ctx: &Context, inode: Inode, flags: u32) -> io::Result<(Handle, OpenFlags)> {
        enosys()
    }
    /// Lists entries from `offset` on, calling `add` for each until it returns `Ok(false)`.
    /// With `plus`, each entry comes with its looked-up [`Entry`] (one lookup reference each;
    /// when `add` refuses an entry, the filesystem drops the reference it took for it).
    fn readdir(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        offset: u64,
        plus: bool,
        add: &mut AddEntry,
    ) -> io::Result<()> {
        enosys()
    }
    fn releasedir(&self, ctx: &Context, inode: Inode, handle: Handle) -> io::Result<()> {
        enosys()
    }
    fn fsyncdir(
        &self,
        ctx: &Context,
        inode: Inode,
        datasync: bool,
        handle: Handle,
    ) -> io::Result<()> {
        enosys()
    }
    fn getlk(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        owner: u64,
        lock: FileLock,
    ) -> io::Result<FileLock> {
        enosys()
    }
    fn setlk(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        owner: u64,
        lock: FileLock,
        flock: bool,
        sleep: bool,
    ) -> io::Result<()> {
        enosys()
    }
    fn access(&self, ctx: &Context, inode: Inode, mask: u32) -> io::Result<()> {
        enosys()
    }
    fn fallocate(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> io::Result<()> {
        enosys()
    }
    fn lseek(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        enosys()
    }
    fn copy_file_range(
        &self,
        ctx: &Context,
        inode_in: Inode,
        handle_in: Handle,
        off_in: u64,
        inode_out: Inode,
        handle_out: Handle,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> io::Result<usize> {
        enosys()
    }
    fn tmpfile(
        &self,
        ctx: &Context,
        parent: Inode,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> io::Result<(Entry, Handle, OpenFlags)> {
        enosys()
    }
    fn syncfs(&self, ctx: &Context, inode: Inode) -> io::Result<()> {
        enosys()
    }
    /// The host descriptor behind an open file handle, for FUSE passthrough (the kernel
    /// then reads and writes it itself). Filesystems that cannot, or must see every READ
    /// and WRITE, refuse (the default).
    fn backing_fd(&self, inode: Inode, handle: Handle) -> io::Result<Box<dyn AsFd + Send + Sync>> {
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }
    /// Maps `len` bytes of the file at `foffset` into the DAX window at `moffset` through
    /// `mapper`. `writable` asks for a writable mapping.
    fn setupmapping(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        foffset: u64,
        len: u64,
        moffset: u64,
        writable: bool,
        mapper: &dyn Mapper,
    ) -> io::Result<()> {
        enosys()
    }
}
