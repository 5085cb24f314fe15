//! [`FileSystem`] for [`PassthroughFs`]: session setup, then each operation, its body here
//! when short, else a call into the topic files (`entry_ops`, `file_ops`, `dir_ops`,
//! `xattr_ops`). BATCH_FORGET keeps the trait's default (one FORGET each).

use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::handle::HandleData;
use super::{err, PassthroughFs};
use crate::protocol::abi::{init_flags as f, Attr, FileLock, Kstatfs, SetattrIn};
use crate::protocol::filesystem::{
    AddEntry, Context, Entry, FileSystem, Handle, InitCaps, Inode, LockOwner, OpenFlags,
    StatxExtra, XattrReply,
};
use crate::protocol::iobuf::{Reader, Writer};
use crate::protocol::mapper::Mapper;
use crate::sys;

impl FileSystem for PassthroughFs {
    fn init(&self, caps: InitCaps) -> io::Result<u64> {
        let offered = caps.flags;
        if self.cfg.announce_submounts && offered & f::SUBMOUNTS == 0 {
            log::warn!("the client does not support submounts");
        }
        let want = self.init_wants();
        self.apply_agreed(want & offered);
        if let (Some(w), Ok(root)) = (self.watch.get(), self.inodes.get(Inode::ROOT)) {
            w.note(&root);
        }
        Ok(want)
    }

    fn destroy(&self) {
        self.handles.clear();
        if let Some(w) = self.watch.get() {
            w.clear();
        }
        self.inodes.clear();
        let n = &self.negotiated;
        n.writeback.store(false, Ordering::Relaxed);
        n.submounts.store(false, Ordering::Relaxed);
        n.killpriv_v2.store(false, Ordering::Relaxed);
    }

    fn interrupt_waits(&self) {
        self.wait_generation.fetch_add(1, Ordering::SeqCst);
    }

    fn lookup(&self, _: &Context, parent: Inode, name: &CStr) -> io::Result<Entry> {
        let p = self.inode(parent)?;
        // `.` is the parent itself; `..` has its own check (see do_lookup).
        if !matches!(name.to_bytes(), b"." | b"..") {
            self.check_inside(&p)?;
        }
        self.do_lookup(&p, name)
    }
    fn forget(&self, _: &Context, inode: Inode, count: u64) {
        self.forget_inode(inode, count)
    }
    fn getattr(
        &self,
        _: &Context,
        inode: Inode,
        _: Option<Handle>,
    ) -> io::Result<(Attr, Duration)> {
        self.do_getattr(inode)
    }
    fn statx_extra(&self, _: &Context, inode: Inode) -> io::Result<StatxExtra> {
        self.do_statx_extra(inode)
    }
    fn setattr(
        &self,
        _: &Context,
        inode: Inode,
        attr: &SetattrIn,
        handle: Option<Handle>,
    ) -> io::Result<(Attr, Duration)> {
        self.do_setattr(inode, attr, handle)
    }
    fn readlink(&self, _: &Context, inode: Inode) -> io::Result<Vec<u8>> {
        let data = self.inode(inode)?;
        if !data.is_symlink() {
            return Err(err(libc::EINVAL));
        }
        sys::readlinkat(data.fd()?.as_fd(), sys::EMPTY)
    }
    fn symlink(
        &self,
        ctx: &Context,
        target: &CStr,
        parent: Inode,
        name: &CStr,
    ) -> io::Result<Entry> {
        self.do_symlink(ctx, target, parent, name)
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
        self.do_mknod(ctx, parent, name, mode, rdev, umask)
    }
    fn mkdir(
        &self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        self.do_mkdir(ctx, parent, name, mode, umask)
    }
    fn unlink(&self, _: &Context, parent: Inode, name: &CStr) -> io::Result<()> {
        self.do_unlink(parent, name, 0)
    }
    fn rmdir(&self, _: &Context, parent: Inode, name: &CStr) -> io::Result<()> {
        self.do_unlink(parent, name, libc::AT_REMOVEDIR)
    }
    fn rename(
        &self,
        _: &Context,
        olddir: Inode,
        oldname: &CStr,
        newdir: Inode,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        self.do_rename(olddir, oldname, newdir, newname, flags)
    }
    fn link(
        &self,
        _: &Context,
        inode: Inode,
        newparent: Inode,
        newname: &CStr,
    ) -> io::Result<Entry> {
        self.do_link(inode, newparent, newname)
    }

    fn open(
        &self,
        _: &Context,
        inode: Inode,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Handle, OpenFlags)> {
        self.do_open(inode, flags, fuse_flags)
    }
    fn create(
        &self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        flags: u32,
        umask: u32,
        _: u32,
    ) -> io::Result<(Entry, Handle, OpenFlags)> {
        self.do_create(ctx, parent, name, mode, flags, umask)
    }
    fn tmpfile(
        &self,
        ctx: &Context,
        parent: Inode,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> io::Result<(Entry, Handle, OpenFlags)> {
        self.do_tmpfile(ctx, parent, mode, flags, umask)
    }
    fn read(
        &self,
        _: &Context,
        inode: Inode,
        handle: Handle,
        w: &mut Writer,
        size: u32,
        offset: u64,
    ) -> io::Result<usize> {
        self.do_read(inode, handle, w, size, offset)
    }
    fn write(
        &self,
        _: &Context,
        inode: Inode,
        handle: Handle,
        r: &mut Reader,
        size: u32,
        offset: u64,
        kill_priv: bool,
    ) -> io::Result<usize> {
        self.do_write(inode, handle, r, size, offset, kill_priv)
    }
    fn flush_writes_back(&self, inode: Inode) -> bool {
        self.do_flush_writes_back(inode)
    }
    fn flush(
        &self,
        _: &Context,
        inode: Inode,
        handle: Handle,
        lock_owner: LockOwner,
    ) -> io::Result<()> {
        self.do_flush(inode, handle, lock_owner)
    }
    fn release(
        &self,
        _: &Context,
        inode: Inode,
        handle: Handle,
        flock_release: bool,
        _: LockOwner,
    ) -> io::Result<()> {
        self.do_release(inode, handle, flock_release)
    }
    fn fsync(&self, _: &Context, inode: Inode, datasync: bool, handle: Handle) -> io::Result<()> {
        self.do_fsync(inode, datasync, handle, false)
    }
    fn fallocate(
        &self,
        _: &Context,
        inode: Inode,
        handle: Handle,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> io::Result<()> {
        self.check_writable()?;
        let h = self.handles.get_file(inode, handle)?;
        sys::fallocate(h.fd(), mode as libc::c_int, offset, length)
    }
    fn lseek(
        &self,
        _: &Context,
        inode: Inode,
        handle: Handle,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        self.do_lseek(inode, handle, offset, whence)
    }
    fn copy_file_range(
        &self,
        _: &Context,
        inode_in: Inode,
        handle_in: Handle,
        off_in: u64,
        inode_out: Inode,
        handle_out: Handle,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> io::Result<usize> {
        self.do_copy_file_range(
            inode_in, handle_in, off_in, inode_out, handle_out, off_out, len, flags,
        )
    }
    fn statfs(&self, _: &Context, inode: Inode) -> io::Result<Kstatfs> {
        self.do_statfs(inode)
    }
    fn syncfs(&self, _: &Context, inode: Inode) -> io::Result<()> {
        let data = self.inode(inode)?;
        let fd = match data.kind {
            libc::S_IFDIR | libc::S_IFREG => self.reopen(&data, libc::O_RDONLY)?,
            _ => return Err(err(libc::EINVAL)),
        };
        // Each SYNCFS writes back the whole host file system: one at a time, so a guest
        // sending many (on up to every blocking thread) cannot multiply that work.
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        sys::syncfs(fd.as_fd())
    }

    fn setxattr(
        &self,
        _: &Context,
        inode: Inode,
        name: &CStr,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
    ) -> io::Result<()> {
        self.do_setxattr(inode, name, value, flags, setxattr_flags)
    }
    fn getxattr(
        &self,
        _: &Context,
        inode: Inode,
        name: &CStr,
        size: u32,
    ) -> io::Result<XattrReply> {
        self.do_getxattr(inode, name, size)
    }
    fn listxattr(&self, _: &Context, inode: Inode, size: u32) -> io::Result<XattrReply> {
        self.do_listxattr(inode, size)
    }
    fn removexattr(&self, _: &Context, inode: Inode, name: &CStr) -> io::Result<()> {
        self.do_removexattr(inode, name)
    }

    fn opendir(&self, _: &Context, inode: Inode, _: u32) -> io::Result<(Handle, OpenFlags)> {
        let data = self.inode(inode)?;
        match data.kind {
            libc::S_IFDIR => {}
            libc::S_IFLNK => return Err(err(libc::ELOOP)),
            _ => return Err(err(libc::ENOTDIR)),
        }
        let fd = self.reopen(&data, libc::O_RDONLY)?;
        let fh = self.handles.insert(HandleData::dir(inode, fd));
        Ok((fh, self.dir_open_flags()))
    }
    fn readdir(
        &self,
        _: &Context,
        inode: Inode,
        handle: Handle,
        offset: u64,
        plus: bool,
        add: &mut AddEntry,
    ) -> io::Result<()> {
        self.do_readdir(inode, handle, offset, plus, add)
    }
    fn releasedir(&self, _: &Context, inode: Inode, handle: Handle) -> io::Result<()> {
        self.handles.remove(inode, handle, true).map(drop)
    }
    fn fsyncdir(
        &self,
        _: &Context,
        inode: Inode,
        datasync: bool,
        handle: Handle,
    ) -> io::Result<()> {
        self.do_fsync(inode, datasync, handle, true)
    }

    fn getlk(
        &self,
        _: &Context,
        inode: Inode,
        handle: Handle,
        owner: LockOwner,
        lock: FileLock,
    ) -> io::Result<FileLock> {
        self.do_getlk(inode, handle, owner, lock)
    }
    fn setlk(
        &self,
        _: &Context,
        inode: Inode,
        handle: Handle,
        owner: LockOwner,
        lock: FileLock,
        flock: bool,
        sleep: bool,
    ) -> io::Result<()> {
        self.do_setlk(inode, handle, owner, lock, flock, sleep)
    }
    fn access(&self, ctx: &Context, inode: Inode, mask: u32) -> io::Result<()> {
        self.do_access(ctx, inode, mask)
    }

    fn fileattr(
        &self,
        _: &Context,
        inode: Inode,
        handle: Handle,
        request: crate::protocol::ioctl::FileAttrRequest,
    ) -> io::Result<crate::protocol::ioctl::FileAttrReply> {
        self.do_fileattr(inode, handle, request)
    }

    fn backing_fd(&self, inode: Inode, handle: Handle) -> io::Result<Box<dyn AsFd + Send + Sync>> {
        Ok(Box::new(self.handles.get_file(inode, handle)?))
    }
    fn setupmapping(
        &self,
        _: &Context,
        inode: Inode,
        handle: Handle,
        foffset: u64,
        len: u64,
        moffset: u64,
        writable: bool,
        mapper: &dyn Mapper,
    ) -> io::Result<()> {
        self.do_setupmapping(inode, handle, foffset, len, moffset, writable, mapper)
    }
}
