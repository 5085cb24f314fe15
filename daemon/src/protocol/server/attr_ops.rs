//! Handlers of the opcodes that read or change what an inode or the filesystem is rather
//! than a file's bytes: attributes, symlink targets, access, xattrs, statfs and syncfs.
//! One method per opcode.

use vm_memory::ByteValued;

use crate::protocol::abi::*;
use crate::protocol::filesystem::{FileSystem, Handle, StatxExtra};
use crate::protocol::iobuf::{Reader, Writer};

use super::decode::{check_xattr_name, split_cstr, xattr_name};
use super::{einval, empty, err, obj, split_timeout, xattr, HandlerResult, Reply, Req, Server};

impl<F: FileSystem> Server<F> {
    pub(super) fn getattr(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let a: GetattrIn = r.read_obj()?;
        let fh = (a.flags & GETATTR_FH != 0).then_some(Handle::from_raw(a.fh));
        self.attr(w, self.fs.getattr(&req.ctx, req.nodeid, fh)?)
    }

    /// STATX: GETATTR's attributes as `struct fuse_statx`, with what
    /// [`FileSystem::statx_extra`] adds. Every basic field is filled whatever `sx_mask` asks
    /// (statx(2) may return more than asked), so the guest can cache them as GETATTR's.
    pub(super) fn statx(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let a: StatxIn = r.read_obj()?;
        let fh = (a.getattr_flags & GETATTR_FH != 0).then_some(Handle::from_raw(a.fh));
        let extra = self.fs.statx_extra(&req.ctx, req.nodeid)?;
        let (mut attr, timeout) = self.fs.getattr(&req.ctx, req.nodeid, fh)?;
        self.apply_dax_policy(&mut attr);
        let (attr_valid, attr_valid_nsec) = split_timeout(timeout);
        obj(
            w,
            &StatxOut {
                attr_valid,
                attr_valid_nsec,
                flags: attr.flags,
                spare: [0; 2],
                stat: statx_of(&attr, &extra),
            },
        )
    }

    pub(super) fn setattr(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let a: SetattrIn = r.read_obj()?;
        let fh = (a.valid & fattr::FH != 0).then_some(Handle::from_raw(a.fh));
        self.attr(w, self.fs.setattr(&req.ctx, req.nodeid, &a, fh)?)
    }

    pub(super) fn readlink(&self, req: &Req, _: &mut Reader, w: &mut Writer) -> HandlerResult {
        let target = self.fs.readlink(&req.ctx, req.nodeid)?;
        w.write_all(&target)?;
        Ok(Reply::Body)
    }

    pub(super) fn access(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        let a: AccessIn = r.read_obj()?;
        empty(self.fs.access(&req.ctx, req.nodeid, a.mask))
    }

    pub(super) fn statfs(&self, req: &Req, _: &mut Reader, w: &mut Writer) -> HandlerResult {
        let st = self.fs.statfs(&req.ctx, req.nodeid)?;
        obj(w, &StatfsOut { st })
    }

    /// The inode-flag ioctls (see [`crate::protocol::ioctl`]); any other ENOTTY.
    pub(super) fn ioctl(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        crate::protocol::ioctl::serve(&self.fs, &req.ctx, req.nodeid, r, w).map(|()| Reply::Body)
    }

    pub(super) fn syncfs(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        let _: SyncfsIn = r.read_obj()?;
        empty(self.fs.syncfs(&req.ctx, req.nodeid))
    }

    pub(super) fn setxattr(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        let ext = self.negotiated_flags() & init_flags::SETXATTR_EXT != 0;
        let mut a = SetxattrIn::default();
        let n = if ext {
            std::mem::size_of::<SetxattrIn>()
        } else {
            COMPAT_SETXATTR_IN_SIZE
        };
        r.read_exact(&mut a.as_mut_slice()[..n])?;
        let rest = r.read_vec(r.available())?;
        let (name, value) = split_cstr(&rest)?;
        check_xattr_name(name)?;
        if a.size as usize > XATTR_SIZE_MAX {
            return Err(err(libc::E2BIG));
        }
        if value.len() != a.size as usize {
            return Err(einval());
        }
        // Without FUSE_SETXATTR_EXT the compat struct ends before `setxattr_flags` (left 0).
        let (ctx, ino, ext_flags) = (&req.ctx, req.nodeid, a.setxattr_flags);
        empty(self.fs.setxattr(ctx, ino, name, value, a.flags, ext_flags))
    }

    pub(super) fn getxattr(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let a: GetxattrIn = r.read_obj()?;
        let name = xattr_name(r)?;
        xattr(
            w,
            a.size,
            self.fs.getxattr(&req.ctx, req.nodeid, &name, a.size)?,
        )
    }

    pub(super) fn listxattr(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let a: GetxattrIn = r.read_obj()?;
        xattr(w, a.size, self.fs.listxattr(&req.ctx, req.nodeid, a.size)?)
    }

    pub(super) fn removexattr(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        let name = xattr_name(r)?;
        empty(self.fs.removexattr(&req.ctx, req.nodeid, &name))
    }
}

/// The `STATX_ATTR_*` flags a STATX reply carries: the inode flags FS_IOC_GETFLAGS serves
/// (chattr +c/+i/+a/+d). The host's others (mount root, automount, DAX, verity, ...) say
/// something of the host's mounts or of nothing the guest sees through FUSE.
pub(crate) const STATX_ATTRS: u64 = (libc::STATX_ATTR_COMPRESSED
    | libc::STATX_ATTR_IMMUTABLE
    | libc::STATX_ATTR_APPEND
    | libc::STATX_ATTR_NODUMP) as u64;

/// `attr` (as GETATTR answers it) and `extra` as `struct fuse_statx`.
fn statx_of(attr: &Attr, extra: &StatxExtra) -> Statx {
    let time = |sec: u64, nsec: u32| SxTime {
        tv_sec: sec as i64,
        tv_nsec: nsec,
        reserved: 0,
    };
    let mut mask = libc::STATX_BASIC_STATS;
    let btime = match extra.btime {
        Some((sec, nsec)) => {
            mask |= libc::STATX_BTIME;
            SxTime {
                tv_sec: sec,
                tv_nsec: nsec,
                reserved: 0,
            }
        }
        None => SxTime::default(),
    };
    let attributes_mask = extra.attributes_mask & STATX_ATTRS;
    Statx {
        mask,
        blksize: attr.blksize,
        attributes: extra.attributes & attributes_mask,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        // File type and permission bits: 16 bits, as in struct stat.
        mode: attr.mode as u16,
        spare0: 0,
        ino: attr.ino,
        size: attr.size,
        blocks: attr.blocks,
        attributes_mask,
        atime: time(attr.atime, attr.atimensec),
        btime,
        ctime: time(attr.ctime, attr.ctimensec),
        mtime: time(attr.mtime, attr.mtimensec),
        // `attr.rdev` is in the kernel's new_encode_dev form.
        rdev_major: (attr.rdev & 0xfff00) >> 8,
        rdev_minor: (attr.rdev & 0xff) | ((attr.rdev >> 12) & 0xfff00),
        dev_major: 0,
        dev_minor: 0,
        spare2: [0; 14],
    }
}
