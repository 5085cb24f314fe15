//! DAX coherence as a filesystem decorator: [`Coherent`] wraps any [`FileSystem`] and keeps
//! the window's shadow tails and snapshots coherent with the request path, so the FUSE
//! server only decodes, validates, dispatches and encodes.
//!
//! The rules (ARCHITECTURE.md, "DAX coherence invariants"):
//! - before a request reads, writes, resizes, syncs or closes an inode's file, bytes the
//!   guest stored in that inode's tails are written back and host changes pulled in
//!   ([`Coherence::sync`]);
//! - after a request that may change the file's size, the inode's mappings are re-placed
//!   when (and only when) the page layout changed ([`Coherence::refresh`]);
//! - SYNCFS and FSYNCDIR write back every tail of the share ([`Coherence::sync_all`]).
//!
//! An inode with no mappings costs one sharded lookup, never a global lock.

use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::protocol::abi::{Attr, FileLock, Kstatfs, SetattrIn};
use crate::protocol::filesystem::{
    AddEntry, Context, Entry, FileSystem, Handle, InitCaps, Inode, LockOwner, OpenFlags, XattrReply,
};
use crate::protocol::iobuf::{Reader, Writer};
use crate::protocol::mapper::{Mapper, NoMapper};

/// A cache window that keeps its mappings coherent with the request path: the hooks
/// [`Coherent`] calls around the inner filesystem's requests. The window
/// ([`super::DaxWindow`]) implements them; without a window ([`NoMapper`]) they do nothing.
pub trait Coherence: Mapper {
    /// Inode `owner` is about to be read, written or synced through the request queue:
    /// bring the file up to date with what the guest wrote through the window.
    fn sync(&self, _owner: u64) {}
    /// [`Self::sync`] before a request that reads or writes only file bytes
    /// `[offset, offset + len)`: pooled ranges mapping none of them are left alone.
    fn sync_range(&self, owner: u64, _offset: u64, _len: u64) {
        self.sync(owner)
    }
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
    /// Whether the window holds mappings of inode `owner` (so [`Self::sync`] has work).
    fn holds(&self, _owner: u64) -> bool {
        false
    }
    /// Write-back errors as Linux's errseq reports them: where a handle opened on `owner`
    /// now starts ([`Self::err_check`] reports errors after it).
    fn err_sample(&self, _owner: u64) -> u64 {
        0
    }
    /// The write-back error of `owner` recorded after `*since`, which moves past it.
    fn err_check(&self, _owner: u64, _since: &mut u64) -> Option<i32> {
        None
    }
    /// [`Self::err_sample`] for the whole share (SYNCFS).
    fn err_sample_all(&self) -> u64 {
        0
    }
    /// [`Self::err_check`] for the whole share (SYNCFS).
    fn err_check_all(&self, _since: &mut u64) -> Option<i32> {
        None
    }
}

/// No window: nothing to keep coherent.
impl Coherence for NoMapper {}

/// A filesystem whose file I/O stays coherent with a DAX window (the inner filesystem `F`
/// does the I/O; the window's [`Coherence`] hooks run around it).
pub struct Coherent<F> {
    inner: F,
    mapper: Arc<dyn Coherence>,
    /// Where each open handle stands in its inode's write-back error sequence (only with a
    /// window): an error is reported once per handle, at its next FSYNC or FLUSH.
    seen: Mutex<HashMap<Handle, u64>>,
    /// The same for SYNCFS and FSYNCDIR (one sequence for the share).
    seen_all: Mutex<u64>,
}

impl<F: FileSystem> Coherent<F> {
    /// Wraps `inner` around `window`; without one (`None`) the decorator only forwards.
    pub fn new(inner: F, window: Option<Arc<dyn Coherence>>) -> Self {
        let mapper = window.unwrap_or_else(|| Arc::new(NoMapper));
        let seen_all = Mutex::new(mapper.err_sample_all());
        Coherent {
            inner,
            mapper,
            seen: Mutex::new(HashMap::new()),
            seen_all,
        }
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
        self.mapper.sync(inode.raw());
        let r = f();
        self.mapper.refresh(inode.raw());
        r
    }

    /// [`Self::resizing`] for a request that writes `n` bytes (its result) at `offset`:
    /// copies of those bytes are re-read before the reply, whatever the file's timestamps
    /// say, and before the re-placement (which would otherwise re-read every copy of the
    /// file because this very write moved its mtime).
    /// `len`: the bytes the request may write (only pooled ranges mapping them are merged
    /// first and refreshed after).
    fn written(
        &self,
        inode: Inode,
        offset: u64,
        len: u64,
        f: impl FnOnce() -> io::Result<usize>,
    ) -> io::Result<usize> {
        self.mapper.sync_range(inode.raw(), offset, len);
        let r = f();
        match r {
            Ok(n) => self.mapper.written(inode.raw(), offset, n as u64),
            // A failed write or fallocate may still have moved the file's end.
            Err(_) => self.mapper.refresh(inode.raw()),
        }
        r
    }

    fn synced<T>(&self, inode: Inode, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        self.mapper.sync(inode.raw());
        f()
    }

    /// A sync point that reports write-back errors (FSYNC, FLUSH): the inode is written back
    /// first, then `f` runs, then an error recorded since the handle last looked is
    /// returned, once per handle, as `fsync(2)` and `close(2)` report one on Linux.
    fn reported(
        &self,
        inode: Inode,
        handle: Handle,
        f: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        self.mapper.sync(inode.raw());
        f()?;
        if self.mapper.window_size() == 0 {
            return Ok(());
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        // A handle opened before the window existed starts from the beginning; nothing is
        // inserted for one the table does not know (no growth a guest controls).
        let mut unknown = 0;
        let since = seen.get_mut(&handle).unwrap_or(&mut unknown);
        match self.mapper.err_check(inode.raw(), since) {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }

    /// [`Self::reported`] for the whole share (SYNCFS, FSYNCDIR).
    fn reported_all(&self, f: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        self.mapper.sync_all();
        f()?;
        let mut since = self.seen_all.lock().unwrap_or_else(|e| e.into_inner());
        match self.mapper.err_check_all(&mut since) {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }

    /// A handle was opened on `inode`: it reports write-back errors from now on (and one
    /// recorded before that nobody reported yet).
    fn opened(&self, inode: Inode, handle: Handle) {
        if self.mapper.window_size() > 0 {
            let at = self.mapper.err_sample(inode.raw());
            self.seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(handle, at);
        }
    }

    /// The `open_flags` of a handle opened with guest `flags`: with a window, a writer's
    /// close sends FLUSH whatever the inner filesystem said (`FOPEN_NOFLUSH` dropped). The
    /// guest's `close` is where it has the server set mtime and ctime after stores through
    /// the window (our guest kernel's `fuse_dax_flush_times()`, which `NOFLUSH` skips), and
    /// FLUSH writes the inode's tails back before a host reader looks while the guest still
    /// holds the file. A read-only handle keeps `NOFLUSH`: it stores nothing.
    fn flush_for(&self, flags: u32, open_flags: OpenFlags) -> OpenFlags {
        let writer = flags as i32 & libc::O_ACCMODE != libc::O_RDONLY;
        if writer && self.mapper.window_size() > 0 {
            open_flags & !crate::protocol::abi::fopen::NOFLUSH
        } else {
            open_flags
        }
    }
}

#[deny(clippy::missing_trait_methods)]
impl<F: FileSystem> FileSystem for Coherent<F> {
    fn getattr(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Option<Handle>,
    ) -> io::Result<(Attr, Duration)> {
        // A guest that stats a file may go on to read it through a copy slot: re-read the
        // copies of it when the file moved since.
        self.mapper.revalidate(inode.raw());
        self.inner.getattr(ctx, inode, handle)
    }
    fn statx_extra(
        &self,
        ctx: &Context,
        inode: Inode,
    ) -> io::Result<crate::protocol::filesystem::StatxExtra> {
        self.inner.statx_extra(ctx, inode)
    }
    fn setattr(
        &self,
        ctx: &Context,
        inode: Inode,
        attr: &SetattrIn,
        handle: Option<Handle>,
    ) -> io::Result<(Attr, Duration)> {
        if attr.valid & crate::protocol::abi::fattr::SIZE != 0 {
            self.mapper.shrinking(inode.raw(), attr.size);
        }
        self.resizing(inode, || self.inner.setattr(ctx, inode, attr, handle))
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
            self.mapper.shrinking(inode.raw(), 0);
        }
        let (fh, o) = self.resizing(inode, || self.inner.open(ctx, inode, flags, fuse_flags))?;
        self.opened(inode, fh);
        Ok((fh, self.flush_for(flags, o)))
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
        if let Ok((e, fh, _)) = &r {
            // CREATE of an existing file with O_TRUNC resizes it.
            self.mapper.refresh(e.inode.raw());
            self.opened(e.inode, *fh);
        }
        r.map(|(e, fh, o)| (e, fh, self.flush_for(flags, o)))
    }
    fn tmpfile(
        &self,
        ctx: &Context,
        parent: Inode,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> io::Result<(Entry, Handle, OpenFlags)> {
        let (e, fh, o) = self.inner.tmpfile(ctx, parent, mode, flags, umask)?;
        self.opened(e.inode, fh);
        Ok((e, fh, self.flush_for(flags, o)))
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
        self.mapper.sync_range(inode.raw(), offset, u64::from(size));
        self.inner.read(ctx, inode, handle, w, size, offset)
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
        self.written(inode, offset, u64::from(size), || {
            self.inner
                .write(ctx, inode, handle, r, size, offset, kill_priv)
        })
    }
    fn release(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        flock_release: bool,
        lock_owner: LockOwner,
    ) -> io::Result<()> {
        if self.mapper.window_size() > 0 {
            self.seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&handle);
        }
        self.synced(inode, || {
            self.inner
                .release(ctx, inode, handle, flock_release, lock_owner)
        })
    }
    fn fsync(&self, ctx: &Context, inode: Inode, datasync: bool, handle: Handle) -> io::Result<()> {
        self.reported(inode, handle, || {
            self.inner.fsync(ctx, inode, datasync, handle)
        })
    }
    fn flush_writes_back(&self, inode: Inode) -> bool {
        // FLUSH writes the inode's tails and pooled copies back first.
        self.mapper.holds(inode.raw()) || self.inner.flush_writes_back(inode)
    }
    fn flush(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        lock_owner: LockOwner,
    ) -> io::Result<()> {
        self.reported(inode, handle, || {
            self.inner.flush(ctx, inode, handle, lock_owner)
        })
    }
    fn backing_fd(&self, inode: Inode, handle: Handle) -> io::Result<Box<dyn AsFd + Send + Sync>> {
        // With a DAX window every READ and WRITE must pass here (shadow tails, mapped
        // ranges): no passthrough. Without one (/dev/fuse) there is nothing to keep coherent.
        if self.mapper.window_size() > 0 {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        self.inner.backing_fd(inode, handle)
    }
    fn fsyncdir(
        &self,
        ctx: &Context,
        inode: Inode,
        datasync: bool,
        handle: Handle,
    ) -> io::Result<()> {
        // The guest's `sync` of a directory: every tail of the share reaches its file.
        self.reported_all(|| self.inner.fsyncdir(ctx, inode, datasync, handle))
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
        self.written(inode, offset, length, || {
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
        self.mapper.sync_range(inode_in.raw(), off_in, len);
        self.written(inode_out, off_out, len, || {
            self.inner.copy_file_range(
                ctx, inode_in, handle_in, off_in, inode_out, handle_out, off_out, len, flags,
            )
        })
    }
    fn syncfs(&self, ctx: &Context, inode: Inode) -> io::Result<()> {
        self.reported_all(|| self.inner.syncfs(ctx, inode))
    }

    // Forwarded unchanged.
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
    fn statfs(&self, ctx: &Context, inode: Inode) -> io::Result<Kstatfs> {
        self.inner.statfs(ctx, inode)
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
    fn getlk(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        owner: LockOwner,
        lock: FileLock,
    ) -> io::Result<FileLock> {
        self.inner.getlk(ctx, inode, handle, owner, lock)
    }
    fn setlk(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        owner: LockOwner,
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
    fn fileattr(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        request: crate::protocol::ioctl::FileAttrRequest,
    ) -> io::Result<crate::protocol::ioctl::FileAttrReply> {
        self.inner.fileattr(ctx, inode, handle, request)
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

#[cfg(test)]
mod tests {
    use super::Coherent;
    use crate::protocol::filesystem::tests::{call_every_method, Probe, METHODS};

    /// The DAX decorator, with no window, reaches the inner filesystem for every method:
    /// the ones it changes and the ones it forwards unchanged.
    #[test]
    fn coherent_forwards_every_method() {
        let fs = Coherent::new(Probe::default(), None);
        call_every_method(&fs);
        assert_eq!(*fs.inner().0.lock().unwrap(), METHODS);
    }
}
