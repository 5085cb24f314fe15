//! Extended attributes (only with `Config::xattr`; otherwise `ENOSYS`, like virtiofsd).
//!
//! The path-based calls go through `/proc/self/fd/N` of the inode's `O_PATH` descriptor:
//! the magic link lands on the inode itself, so this works for every file type without
//! opening it (a device node is never opened) and without following a symlink's target.

use std::ffi::CStr;
use std::io;

use super::{err, proc_path, PassthroughFs};
use crate::abi::XATTR_SIZE_MAX;
use crate::filesystem::{Inode, XattrReply};
use crate::sys;

/// Largest attribute list we fetch (Linux `XATTR_LIST_MAX`).
const XATTR_LIST_MAX: usize = 65536;

fn reply((value, len): (Vec<u8>, usize), size: u32) -> io::Result<XattrReply> {
    if size == 0 {
        let n = u32::try_from(len).map_err(|_| err(libc::E2BIG))?;
        Ok(XattrReply::Count(n))
    } else {
        Ok(XattrReply::Value(value))
    }
}

impl PassthroughFs {
    fn check_xattr(&self) -> io::Result<()> {
        if self.cfg.xattr {
            Ok(())
        } else {
            Err(err(libc::ENOSYS))
        }
    }

    pub(super) fn do_setxattr(
        &self,
        inode: Inode,
        name: &CStr,
        value: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        self.check_xattr()?;
        self.check_writable()?;
        let data = self.inode(inode)?;
        sys::setxattr(&proc_path(data.fd()), name, value, flags as libc::c_int)
    }

    pub(super) fn do_getxattr(
        &self,
        inode: Inode,
        name: &CStr,
        size: u32,
    ) -> io::Result<XattrReply> {
        self.check_xattr()?;
        let data = self.inode(inode)?;
        // The guest picks `size`: never allocate more than an attribute can hold.
        let buf = (size as usize).min(XATTR_SIZE_MAX);
        reply(sys::getxattr(&proc_path(data.fd()), name, buf)?, size)
    }

    pub(super) fn do_listxattr(&self, inode: Inode, size: u32) -> io::Result<XattrReply> {
        self.check_xattr()?;
        let data = self.inode(inode)?;
        let buf = (size as usize).min(XATTR_LIST_MAX);
        reply(sys::listxattr(&proc_path(data.fd()), buf)?, size)
    }

    pub(super) fn do_removexattr(&self, inode: Inode, name: &CStr) -> io::Result<()> {
        self.check_xattr()?;
        self.check_writable()?;
        let data = self.inode(inode)?;
        sys::removexattr(&proc_path(data.fd()), name)
    }
}
