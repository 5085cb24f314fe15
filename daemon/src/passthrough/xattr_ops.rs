//! Extended attributes (only with `Config::xattr`; otherwise `ENOSYS`, like virtiofsd),
//! with names translated by `Config::xattrmap` when set (see [`super::xattrmap`]).
//!
//! The POSIX ACL attributes (`system.posix_acl_access`, `system.posix_acl_default`) are
//! served only when `FUSE_POSIX_ACL` is negotiated (`--posix-acl`). Without it the guest
//! kernel does not apply ACLs (no permission checks, no default-ACL inheritance, no mode
//! update on set) but would still pass them through as plain attributes: storing them would
//! give the guest ACLs that look set and have no effect, and would leave host-side ACLs that
//! the host kernel then enforces. So get, set and remove answer `EOPNOTSUPP` and the list
//! leaves them out, as upstream virtiofsd does; the guest sees a file system without ACLs and
//! relies on the mode bits.
//!
//! The path-based calls go through the magic link `N` of the inode's `O_PATH` descriptor in
//! `/proc/self/fd`: it lands on the inode itself, so this works for every file type without
//! opening it (a device node is never opened) and without following a symlink's target.
//!
//! The path-based xattr system calls take no directory descriptor, and an absolute
//! `/proc/self/fd/N` would resolve from the process root: inside the sandbox that is the
//! guest-controlled share, not procfs. So the calling thread first gets its own working
//! directory (`unshare(CLONE_FS)`, once per thread), moves it to the `/proc/self/fd`
//! descriptor opened before the sandbox, and passes the relative name `N`. Other threads
//! never see that working directory, and nothing in the daemon resolves relative paths.

use std::borrow::Cow;
use std::cell::Cell;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use std::sync::atomic::Ordering;

use super::xattrmap::ClientName;
use super::{err, fd_name, PassthroughFs};
use crate::protocol::abi::{SETXATTR_ACL_KILL_SGID, XATTR_SIZE_MAX};
use crate::protocol::filesystem::{Inode, XattrReply};
use crate::sys;

thread_local! {
    /// Whether this thread already has a working directory of its own.
    static OWN_CWD: Cell<bool> = const { Cell::new(false) };
}

/// Largest attribute list we fetch (Linux `XATTR_LIST_MAX`).
const XATTR_LIST_MAX: usize = 65536;

/// The names of the POSIX ACL attributes (`<linux/posix_acl_xattr.h>`).
const POSIX_ACL_NAMES: [&[u8]; 2] = [b"system.posix_acl_access", b"system.posix_acl_default"];

fn is_posix_acl(name: &[u8]) -> bool {
    POSIX_ACL_NAMES.contains(&name)
}

/// `list` (NUL-terminated names) without the POSIX ACL names.
fn without_acls(list: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(list.len());
    for name in list.split(|&c| c == 0).filter(|n| !n.is_empty()) {
        if !is_posix_acl(name) {
            out.extend_from_slice(name);
            out.push(0);
        }
    }
    out
}

/// Gives the calling thread its own `fs_struct` (working directory, umask), once.
fn own_fs() -> io::Result<()> {
    if !OWN_CWD.get() {
        sys::unshare_fs()?;
        OWN_CWD.set(true);
    }
    Ok(())
}

/// Puts the thread's umask back to 0 (the daemon's, see the module docs of `passthrough`).
#[must_use]
pub(super) struct UmaskGuard(());

impl Drop for UmaskGuard {
    fn drop(&mut self) {
        sys::umask(0);
    }
}

fn reply((value, len): (Vec<u8>, usize), size: u32) -> io::Result<XattrReply> {
    if size == 0 {
        let n = u32::try_from(len).map_err(|_| err(libc::E2BIG))?;
        Ok(XattrReply::Count(n))
    } else {
        Ok(XattrReply::Value(value))
    }
}

impl PassthroughFs {
    /// Runs `f` with the name of `fd` relative to the thread's working directory, which is
    /// `/proc/self/fd` for the duration (see the module docs).
    fn at_proc_fd<T>(
        &self,
        fd: BorrowedFd,
        f: impl FnOnce(&CStr) -> io::Result<T>,
    ) -> io::Result<T> {
        own_fs()?;
        sys::fchdir(self.proc_self_fd.as_fd())?;
        f(&fd_name(fd))
    }

    /// The host name for a guest attribute name (`--xattrmap`); `EOPNOTSUPP` for the POSIX
    /// ACL names unless `FUSE_POSIX_ACL` is negotiated (see the module docs).
    fn host_xattr_name<'a>(&self, name: &'a CStr) -> io::Result<Cow<'a, CStr>> {
        if !self.negotiated.posix_acl.load(Ordering::Relaxed) && is_posix_acl(name.to_bytes()) {
            return Err(err(libc::EOPNOTSUPP));
        }
        match &self.cfg.xattrmap {
            None => Ok(Cow::Borrowed(name)),
            Some(m) => match m.client(name) {
                ClientName::Host(h) => Ok(Cow::Owned(h)),
                ClientName::Refuse(e) => Err(err(e)),
            },
        }
    }

    fn check_xattr(&self) -> io::Result<()> {
        if self.cfg.xattr {
            Ok(())
        } else {
            Err(err(libc::ENOSYS))
        }
    }

    /// The permission bits to create a file with, and (with POSIX ACLs negotiated) the guard
    /// of the thread umask set to the guest's for the create: the host kernel then applies
    /// the umask only when the parent has no default ACL (see the module docs of
    /// `passthrough`).
    pub(super) fn create_mode(
        &self,
        mode: u32,
        umask: u32,
    ) -> io::Result<(u32, Option<UmaskGuard>)> {
        if !self.negotiated.posix_acl.load(Ordering::Relaxed) {
            return Ok((mode & 0o7777 & !umask, None));
        }
        own_fs()?;
        sys::umask(umask & 0o777);
        Ok((mode & 0o7777, Some(UmaskGuard(()))))
    }

    pub(super) fn do_setxattr(
        &self,
        inode: Inode,
        name: &CStr,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
    ) -> io::Result<()> {
        self.check_xattr()?;
        self.check_writable()?;
        // The guest kernel asks us to clear the setgid bit when the caller setting an
        // access ACL is neither in the file's group nor has CAP_FSETID; the host kernel
        // would not, as the daemon has CAP_FSETID. As virtiofsd: set the ACL (which may
        // change the mode), then clear the bit from the resulting mode.
        let kill_sgid = self.negotiated.posix_acl.load(Ordering::Relaxed)
            && setxattr_flags & SETXATTR_ACL_KILL_SGID != 0
            && name.to_bytes() == b"system.posix_acl_access";
        let name = self.host_xattr_name(name)?;
        let data = self.inode(inode)?;
        self.at_proc_fd(data.fd()?.as_fd(), |p| {
            sys::setxattr(p, &name, value, flags as libc::c_int)
        })?;
        if kill_sgid {
            let st = sys::fstat(data.fd()?.as_fd())?;
            if st.st_mode & libc::S_ISGID != 0 {
                let mode = st.st_mode & 0o7777 & !libc::S_ISGID;
                sys::fchmodat(
                    self.proc_self_fd.as_fd(),
                    &fd_name(data.fd()?.as_fd()),
                    mode,
                )?;
            }
        }
        Ok(())
    }

    pub(super) fn do_getxattr(
        &self,
        inode: Inode,
        name: &CStr,
        size: u32,
    ) -> io::Result<XattrReply> {
        self.check_xattr()?;
        let name = self.host_xattr_name(name)?;
        let data = self.inode(inode)?;
        // The guest picks `size`: never allocate more than an attribute can hold.
        let buf = (size as usize).min(XATTR_SIZE_MAX);
        let got = self.at_proc_fd(data.fd()?.as_fd(), |p| sys::getxattr(p, &name, buf))?;
        reply(got, size)
    }

    pub(super) fn do_listxattr(&self, inode: Inode, size: u32) -> io::Result<XattrReply> {
        self.check_xattr()?;
        let data = self.inode(inode)?;
        let acls = self.negotiated.posix_acl.load(Ordering::Relaxed);
        if acls && self.cfg.xattrmap.is_none() {
            let buf = (size as usize).min(XATTR_LIST_MAX);
            let got = self.at_proc_fd(data.fd()?.as_fd(), |p| sys::listxattr(p, buf))?;
            return reply(got, size);
        }
        // The guest's list differs from the host's: fetch the whole host list (bounded by
        // XATTR_LIST_MAX), translate it, then answer the size or the list.
        let (host, _) =
            self.at_proc_fd(data.fd()?.as_fd(), |p| sys::listxattr(p, XATTR_LIST_MAX))?;
        let mut list = match &self.cfg.xattrmap {
            Some(map) => map.server_list(&host),
            None => host,
        };
        if !acls {
            list = without_acls(&list);
        }
        if size != 0 && list.len() > size as usize {
            return Err(err(libc::ERANGE));
        }
        let len = list.len();
        reply((list, len), size)
    }

    pub(super) fn do_removexattr(&self, inode: Inode, name: &CStr) -> io::Result<()> {
        self.check_xattr()?;
        self.check_writable()?;
        let name = self.host_xattr_name(name)?;
        let data = self.inode(inode)?;
        self.at_proc_fd(data.fd()?.as_fd(), |p| sys::removexattr(p, &name))
    }
}
