//! DAX coherence as a filesystem decorator: [`Coherent`] wraps any [`FileSystem`] and keeps
//! the window's shadow tails and snapshots coherent with the request path, so the FUSE
//! server only decodes, validates, dispatches and encodes.
//!
//! The rules (ARCHITECTURE.md, "DAX coherence invariants"):
//! - before a request reads, writes, resizes, syncs or closes an inode's file, bytes the
//!   guest stored in that inode's tails are written back and host changes pulled in
//!   ([`Mapper::sync`]);
//! - after a request that may change the file's size, the inode's mappings are re-placed
//!   when (and only when) the page layout changed ([`Mapper::refresh`]);
//! - SYNCFS and FSYNCDIR write back every tail of the share ([`Mapper::sync_all`]).
//!
//! An inode with no mappings costs one sharded lookup, never a global lock.

use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use crate::abi::{Attr, FileLock, Kstatfs, SetattrIn};
use crate::filesystem::{
    AddEntry, Context, Entry, FileSystem, Handle, InitCaps, Inode, OpenFlags, XattrReply,
};
use crate::iobuf::{Reader, Writer};
use crate::mapper::Mapper;

/// A filesystem whose file I/O stays coherent with the DAX window `M`.
pub struct Coherent<F> {
    inner: F,
    mapper: Arc<dyn Mapper>,
}

impl<F: FileSystem> Coherent<F> {
    pub fn new(inner: F, mapper: Arc<dyn Mapper>) -> Self {
        Coherent { inner, mapper }
    }

    pub fn inner(&self) -> &F {
        &self.inner
    }

    /// Runs `f` with `inode` written back first and re-placed after the call, whatever its
    /// result: a request can change the size and still fail (a SETATTR that truncates, then
    /// fails on a later attribute), and a mapping past the new end must not stay in the
    /// window. A re-placement happens only when the page layout changed, so it costs one
    /// `fstat` otherwise.
    fn resizing<T>(&self, inode: Inode, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        self.mapper.sync(inode);
        let r = f();
        self.mapper.refresh(inode);
        r
    }

    /// [`Self::resizing`] for a request that writes `n` bytes (its result) at `offset`:
    /// copies of those bytes are re-read before the reply, whatever the file's timestamps
    /// say, and before the re-placement (which would otherwise re-read every copy of the
    /// file because this very write moved its mtime).
    fn written(
        &self,
        inode: Inode,
        offset: u64,
        f: impl FnOnce() -> io::Result<usize>,
    ) -> io::Result<usize> {
        self.mapper.sync(inode);
        let r = f();
        if let Ok(n) = r {
            self.mapper.written(inode, offset, n as u64);
        }
        // A failed write or fallocate may still have moved the file's end.
        self.mapper.refresh(inode);
        r
    }

    fn synced<T>(&self, inode: Inode, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        self.mapper.sync(inode);
        f()
    }
}

#[allow(clippy::too_many_arguments)]
impl<F: FileSystem> FileSystem for Coherent<F> {
    fn init(&self, caps: InitCaps) -> io::Result<u64> {
        self.inner.init(caps)
    }
    fn destroy(&self) {
        self.inner.destroy()
    }
    fn interrupt_waits(&self) {
        self.inner.interrupt_waits()
    }
    fn lookup(&self, ctx: &Context, parent: Inode, name: &CStr) -> io::Result<Entry> {
        self.inner.lookup(ctx, parent, name)
    }
    fn forget(&self, ctx: &Context, inode: Inode, count: u64) {
        self.inner.forget(ctx, inode, count)
    }
    fn batch_forget(&self, ctx: &Context, requests: &[(Inode, u64)]) {
        self.inner.batch_forget(ctx, requests)
    }
    fn getattr(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Option<Handle>,
    ) -> io::Result<(Attr, Duration)> {
        // A guest that stats a file may go on to read it through a copy slot: re-read the
        // copies of it when the file moved since.
        self.mapper.revalidate(inode);
        self.inner.getattr(ctx, inode, handle)
    }
    fn setattr(
        &self,
        ctx: &Context,
        inode: Inode,
        attr: &SetattrIn,
        handle: Option<Handle>,
    ) -> io::Result<(Attr, Duration)> {
        if attr.valid & crate::abi::fattr::SIZE != 0 {
            self.mapper.shrinking(inode, attr.size);
        }
        self.resizing(inode, || self.inner.setattr(ctx, inode, attr, handle))
    }
    fn readlink(&self, ctx: &Context, inode: Inode) -> io::Result<Vec<u8>> {
        self.inner.readlink(ctx, inode)
    }
    fn symlink(
        &self,
        ctx: &Context,
        target: &CStr,
        parent: Inode,
        name: &CStr,
    ) -> io::Result<Entry> {
        self.inner.symlink(ctx, target, parent, name)
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
        self.inner.mknod(ctx, parent, name, mode, rdev, umask)
    }
    fn mkdir(
        &self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        self.inner.mkdir(ctx, parent, name, mode, umask)
    }
    fn unlink(&self, ctx: &Context, parent: Inode, name: &CStr) -> io::Result<()> {
        self.inner.unlink(ctx, parent, name)
    }
    fn rmdir(&self, ctx: &Context, parent: Inode, name: &CStr) -> io::Result<()> {
        self.inner.rmdir(ctx, parent, name)
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
        self.inner
            .rename(ctx, olddir, oldname, newdir, newname, flags)
    }
    fn link(
        &self,
        ctx: &Context,
        inode: Inode,
        newparent: Inode,
        newname: &CStr,
    ) -> io::Result<Entry> {
        self.inner.link(ctx, inode, newparent, newname)
    }
    fn open(
        &self,
        ctx: &Context,
        inode: Inode,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Handle, OpenFlags)> {
        // O_TRUNC resizes; any open is also the point where host changes become visible.
        if flags & libc::O_TRUNC as u32 != 0 {
            self.mapper.shrinking(inode, 0);
        }
        self.resizing(inode, || self.inner.open(ctx, inode, flags, fuse_flags))
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
        let r = self
            .inner
            .create(ctx, parent, name, mode, flags, umask, fuse_flags);
        if let Ok((e, _, _)) = &r {
            // CREATE of an existing file with O_TRUNC resizes it.
            self.mapper.refresh(e.inode);
        }
        r
    }
    fn read(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        w: &mut Writer,
        size: u32,
        offset: u64,
    ) -> io::Result<usize> {
        self.synced(inode, || {
            self.inner.read(ctx, inode, handle, w, size, offset)
        })
    }
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
        self.written(inode, offset, || {
            self.inner
                .write(ctx, inode, handle, r, size, offset, kill_priv)
        })
    }
    fn statfs(&self, ctx: &Context, inode: Inode) -> io::Result<Kstatfs> {
        self.inner.statfs(ctx, inode)
    }
    fn release(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        flock_release: bool,
        lock_owner: u64,
    ) -> io::Result<()> {
        self.synced(inode, || {
            self.inner
                .release(ctx, inode, handle, flock_release, lock_owner)
        })
    }
    fn fsync(&self, ctx: &Context, inode: Inode, datasync: bool, handle: Handle) -> io::Result<()> {
        self.synced(inode, || self.inner.fsync(ctx, inode, datasync, handle))
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
        self.inner
            .setxattr(ctx, inode, name, value, flags, setxattr_flags)
    }
    fn getxattr(
        &self,
        ctx: &Context,
        inode: Inode,
        name: &CStr,
        size: u32,
    ) -> io::Result<XattrReply> {
        self.inner.getxattr(ctx, inode, name, size)
    }
    fn listxattr(&self, ctx: &Context, inode: Inode, size: u32) -> io::Result<XattrReply> {
        self.inner.listxattr(ctx, inode, size)
    }
    fn removexattr(&self, ctx: &Context, inode: Inode, name: &CStr) -> io::Result<()> {
        self.inner.removexattr(ctx, inode, name)
    }
    fn flush(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        lock_owner: u64,
    ) -> io::Result<()> {
        self.synced(inode, || self.inner.flush(ctx, inode, handle, lock_owner))
    }
    fn backing_fd(&self, inode: Inode, handle: Handle) -> io::Result<Box<dyn AsFd + Send + Sync>> {
        // With a DAX window every READ and WRITE must pass here (shadow tails, mapped
        // ranges): no passthrough. Without one (/dev/fuse) there is nothing to keep coherent.
        if self.mapper.window_size() > 0 {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        self.inner.backing_fd(inode, handle)
    }
    fn opendir(&self, ctx: &Context, inode: Inode, flags: u32) -> io::Result<(Handle, OpenFlags)> {
        self.inner.opendir(ctx, inode, flags)
    }
    fn readdir(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        offset: u64,
        plus: bool,
        add: &mut AddEntry,
    ) -> io::Result<()> {
        self.inner.readdir(ctx, inode, handle, offset, plus, add)
    }
    fn releasedir(&self, ctx: &Context, inode: Inode, handle: Handle) -> io::Result<()> {
        self.inner.releasedir(ctx, inode, handle)
    }
    fn fsyncdir(
        &self,
        ctx: &Context,
        inode: Inode,
        datasync: bool,
        handle: Handle,
    ) -> io::Result<()> {
        // The guest's `sync` of a directory: every tail of the share reaches its file.
        self.mapper.sync_all();
        self.inner.fsyncdir(ctx, inode, datasync, handle)
    }
    fn getlk(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        owner: u64,
        lock: FileLock,
    ) -> io::Result<FileLock> {
        self.inner.getlk(ctx, inode, handle, owner, lock)
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
        self.inner
            .setlk(ctx, inode, handle, owner, lock, flock, sleep)
    }
    fn access(&self, ctx: &Context, inode: Inode, mask: u32) -> io::Result<()> {
        self.inner.access(ctx, inode, mask)
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
        self.written(inode, offset, || {
            self.inner
                .fallocate(ctx, inode, handle, mode, offset, length)
                .map(|()| usize::try_from(length).unwrap_or(usize::MAX))
        })
        .map(|_| ())
    }
    fn lseek(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        self.synced(inode, || {
            self.inner.lseek(ctx, inode, handle, offset, whence)
        })
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
        self.mapper.sync(inode_in);
        self.written(inode_out, off_out, || {
            self.inner.copy_file_range(
                ctx, inode_in, handle_in, off_in, inode_out, handle_out, off_out, len, flags,
            )
        })
    }
    fn tmpfile(
        &self,
        ctx: &Context,
        parent: Inode,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> io::Result<(Entry, Handle, OpenFlags)> {
        self.inner.tmpfile(ctx, parent, mode, flags, umask)
    }
    fn syncfs(&self, ctx: &Context, inode: Inode) -> io::Result<()> {
        self.mapper.sync_all();
        self.inner.syncfs(ctx, inode)
    }
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
        self.inner
            .setupmapping(ctx, inode, handle, foffset, len, moffset, writable, mapper)
    }
}

/// Migration: what moves is the wrapped file system's state.
impl<F: crate::protocol::state::SerializableFileSystem>
    crate::protocol::state::SerializableFileSystem for Coherent<F>
{
    type State = F::State;
    type Options = F::Options;

    fn save_state(&self, opts: &F::Options) -> std::io::Result<F::State> {
        self.inner().save_state(opts)
    }

    fn load_state(&self, state: &F::State, opts: &F::Options) -> std::io::Result<()> {
        self.inner().load_state(state, opts)
    }

    fn init_wants(&self) -> u64 {
        self.inner().init_wants()
    }
}
