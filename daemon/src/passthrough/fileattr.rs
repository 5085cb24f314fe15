//! FUSE_IOCTL's inode flags (`chattr`/`lsattr`) on the host inode, through
//! the descriptor of the guest's open handle, never a path.
//!
//! Reading is always served. Setting changes the host inode for every host user too
//! (`+i` and `+a` bind root on the host, and need CAP_LINUX_IMMUTABLE), so it is served
//! only with [`Config::inode_flags`](super::Config::inode_flags) (`--inode-flags`);
//! without it a set that changes nothing succeeds (the host is not called) and any other is refused with
//! `EOPNOTSUPP`, as a file system answers for flags it cannot store (`chattr` then says
//! "Operation not supported", and fstests' `_require_chattr` skips the test).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::{err, PassthroughFs};
use crate::protocol::abi::Fsxattr;
use crate::protocol::filesystem::{Handle, Inode};
use crate::protocol::ioctl::{
    FileAttrReply, FileAttrRequest, FS_IOC_FSGETXATTR, FS_IOC_FSSETXATTR, FS_IOC_GETFLAGS,
    FS_IOC_SETFLAGS,
};

fn get_flags(fd: BorrowedFd) -> io::Result<u32> {
    let mut v: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one `int` (the kernel's ioctl_getflags uses an
    // `unsigned int` pointer whatever the command encodes), which `v` is; `fd` is open.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::Ioctl::from(FS_IOC_GETFLAGS), &mut v) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v as u32)
}

fn set_flags(fd: BorrowedFd, flags: u32) -> io::Result<()> {
    let v = flags as libc::c_int;
    // SAFETY: FS_IOC_SETFLAGS reads one `int`, which `v` is, and keeps no pointer.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::Ioctl::from(FS_IOC_SETFLAGS), &v) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn get_xattr(fd: BorrowedFd) -> io::Result<Fsxattr> {
    let mut x = Fsxattr::default();
    // SAFETY: FS_IOC_FSGETXATTR writes one `struct fsxattr`, whose layout `Fsxattr` has
    // (28 bytes, asserted in abi.rs).
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::Ioctl::from(FS_IOC_FSGETXATTR), &mut x) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(x)
}

fn set_xattr(fd: BorrowedFd, x: &Fsxattr) -> io::Result<()> {
    // SAFETY: FS_IOC_FSSETXATTR reads one `struct fsxattr`, which `x` is, and keeps no
    // pointer.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::Ioctl::from(FS_IOC_FSSETXATTR), x) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether setting `new` would change what `old` holds (`nextents` is read-only).
fn xattr_changes(old: &Fsxattr, new: &Fsxattr) -> bool {
    (old.xflags, old.extsize, old.projid, old.cowextsize)
        != (new.xflags, new.extsize, new.projid, new.cowextsize)
}

impl PassthroughFs {
    pub(super) fn do_fileattr(
        &self,
        inode: Inode,
        handle: Handle,
        request: FileAttrRequest,
    ) -> io::Result<FileAttrReply> {
        let h = self.handles.get(inode, handle)?;
        let fd = h.fd();
        if request.sets() {
            self.check_writable()?;
        }
        let refuse = |what: &str| {
            log::debug!("inode {inode}: {what} refused (no --inode-flags)");
            Err(err(libc::EOPNOTSUPP))
        };
        match request {
            FileAttrRequest::GetFlags => get_flags(fd).map(FileAttrReply::Flags),
            FileAttrRequest::GetXattr => get_xattr(fd).map(FileAttrReply::Xattr),
            // Without --inode-flags the host inode is left alone, even its ctime.
            FileAttrRequest::SetFlags(f) if !self.cfg.inode_flags => match get_flags(fd)? == f {
                true => Ok(FileAttrReply::Done),
                false => refuse("FS_IOC_SETFLAGS"),
            },
            FileAttrRequest::SetXattr(x) if !self.cfg.inode_flags => {
                match xattr_changes(&get_xattr(fd)?, &x) {
                    false => Ok(FileAttrReply::Done),
                    true => refuse("FS_IOC_FSSETXATTR"),
                }
            }
            FileAttrRequest::SetFlags(f) => set_flags(fd, f).map(|()| FileAttrReply::Done),
            FileAttrRequest::SetXattr(x) => set_xattr(fd, &x).map(|()| FileAttrReply::Done),
        }
    }
}
