//! [`FileSystem`] for [`PassthroughFs`]: session setup, then one line per operation into
//! the topic files (`entry_ops`, `file_ops`, `dir_ops`, `xattr_ops`). The signatures are the
//! trait's ([`filesystem_impl!`]); BATCH_FORGET keeps the trait's default (one FORGET each).

use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::PassthroughFs;
use crate::protocol::abi::{init_flags as f, Attr, FileLock, Kstatfs, SetattrIn};
use crate::protocol::filesystem::filesystem_impl;
use crate::protocol::filesystem::{
    AddEntry, Context, Entry, Handle, InitCaps, Inode, OpenFlags, XattrReply,
};
use crate::protocol::iobuf::{Reader, Writer};
use crate::protocol::mapper::Mapper;

filesystem_impl! {
    impl[] FileSystem for PassthroughFs;
    others => default;

    fn init(&self, caps) {
        let offered = caps.flags;
        if self.cfg.announce_submounts && offered & f::SUBMOUNTS == 0 {
            log::warn!("the client does not support submounts");
        }
        let want = self.init_wants();
        self.apply_agreed(want & offered);
        if let (Some(w), Ok(root)) = (self.watch.get(), self.inodes.get(crate::protocol::abi::ROOT_ID)) {
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

    fn lookup(&self, _, parent, name) { self.do_lookup_op(parent, name) }
    fn forget(&self, _, inode, count) { self.forget_inode(inode, count) }
    fn getattr(&self, _, inode, _) { self.do_getattr(inode) }
    fn statx_extra(&self, _, inode) { self.do_statx_extra(inode) }
    fn setattr(&self, _, inode, attr, handle) { self.do_setattr(inode, attr, handle) }
    fn readlink(&self, _, inode) { self.do_readlink(inode) }
    fn symlink(&self, ctx, target, parent, name) { self.do_symlink(ctx, target, parent, name) }
    fn mknod(&self, ctx, parent, name, mode, rdev, umask) {
        self.do_mknod(ctx, parent, name, mode, rdev, umask)
    }
    fn mkdir(&self, ctx, parent, name, mode, umask) {
        self.do_mkdir(ctx, parent, name, mode, umask)
    }
    fn unlink(&self, _, parent, name) { self.do_unlink(parent, name, 0) }
    fn rmdir(&self, _, parent, name) { self.do_unlink(parent, name, libc::AT_REMOVEDIR) }
    fn rename(&self, _, olddir, oldname, newdir, newname, flags) {
        self.do_rename(olddir, oldname, newdir, newname, flags)
    }
    fn link(&self, _, inode, newparent, newname) { self.do_link(inode, newparent, newname) }

    fn open(&self, _, inode, flags, fuse_flags) { self.do_open(inode, flags, fuse_flags) }
    fn create(&self, ctx, parent, name, mode, flags, umask, _) {
        self.do_create(ctx, parent, name, mode, flags, umask)
    }
    fn tmpfile(&self, ctx, parent, mode, flags, umask) {
        self.do_tmpfile(ctx, parent, mode, flags, umask)
    }
    fn read(&self, _, inode, handle, w, size, offset) {
        self.do_read(inode, handle, w, size, offset)
    }
    fn write(&self, _, inode, handle, r, size, offset, kill_priv) {
        self.do_write(inode, handle, r, size, offset, kill_priv)
    }
    fn flush_writes_back(&self, inode) { self.do_flush_writes_back(inode) }
    fn flush(&self, _, inode, handle, lock_owner) { self.do_flush(inode, handle, lock_owner) }
    fn release(&self, _, inode, handle, flock_release, _) {
        self.do_release(inode, handle, flock_release)
    }
    fn fsync(&self, _, inode, datasync, handle) { self.do_fsync(inode, datasync, handle, false) }
    fn fallocate(&self, _, inode, handle, mode, offset, length) {
        self.do_fallocate(inode, handle, mode, offset, length)
    }
    fn lseek(&self, _, inode, handle, offset, whence) {
        self.do_lseek(inode, handle, offset, whence)
    }
    fn copy_file_range(
        &self, _, inode_in, handle_in, off_in, inode_out, handle_out, off_out, len, flags
    ) {
        self.do_copy_file_range(
            inode_in, handle_in, off_in, inode_out, handle_out, off_out, len, flags,
        )
    }
    fn statfs(&self, _, inode) { self.do_statfs(inode) }
    fn syncfs(&self, _, inode) { self.do_syncfs(inode) }

    fn setxattr(&self, _, inode, name, value, flags, setxattr_flags) {
        self.do_setxattr(inode, name, value, flags, setxattr_flags)
    }
    fn getxattr(&self, _, inode, name, size) { self.do_getxattr(inode, name, size) }
    fn listxattr(&self, _, inode, size) { self.do_listxattr(inode, size) }
    fn removexattr(&self, _, inode, name) { self.do_removexattr(inode, name) }

    fn opendir(&self, _, inode, _) { self.do_opendir(inode) }
    fn readdir(&self, _, inode, handle, offset, plus, add) {
        self.do_readdir(inode, handle, offset, plus, add)
    }
    fn releasedir(&self, _, inode, handle) { self.do_releasedir(inode, handle) }
    fn fsyncdir(&self, _, inode, datasync, handle) { self.do_fsync(inode, datasync, handle, true) }

    fn getlk(&self, _, inode, handle, owner, lock) { self.do_getlk(inode, handle, owner, lock) }
    fn setlk(&self, _, inode, handle, owner, lock, flock, sleep) {
        self.do_setlk(inode, handle, owner, lock, flock, sleep)
    }
    fn access(&self, ctx, inode, mask) { self.do_access(ctx, inode, mask) }

    fn fileattr(&self, _, inode, handle, request) { self.do_fileattr(inode, handle, request) }

    fn backing_fd(&self, inode, handle) { Ok(Box::new(self.handles.get_file(inode, handle)?)) }
    fn setupmapping(&self, _, inode, handle, foffset, len, moffset, writable, mapper) {
        self.do_setupmapping(inode, handle, foffset, len, moffset, writable, mapper)
    }
}
