//! FUSE_IOCTL, restricted to the inode-flag commands.
//!
//! A Linux guest sends FUSE_IOCTL for `chattr`/`lsattr` (and `xfs_io` chattr) from
//! `fuse_fileattr_get`/`fuse_fileattr_set` (fs/fuse/ioctl.c): on a handle it opened for the
//! purpose, `FS_IOC_GETFLAGS`/`FS_IOC_SETFLAGS` with a 4-byte flag word (whatever the
//! command's encoded `long`), or `FS_IOC_FSGETXATTR`/`FS_IOC_FSSETXATTR` with a
//! `struct fsxattr`; `in_size` is the argument's size for a command that writes, `out_size`
//! for one that reads, and the reply carries exactly `out_size` bytes after
//! `fuse_ioctl_out`. Every other command, and any unrestricted (CUSE) request, is answered
//! `ENOTTY` as a file system without the ioctl answers; sizes that do not match the command
//! are `EINVAL`. Nothing is allocated from a guest size: each argument has a fixed size.

use std::io;

use crate::protocol::abi::{ioctl_flags, Fsxattr, IoctlIn, IoctlOut};
use crate::protocol::filesystem::{Context, FileSystem, Handle, Inode};
use crate::protocol::iobuf::{Reader, Writer};

/// `FS_IOC_GETFLAGS`: `_IOR('f', 1, long)` on a 64-bit kernel.
pub const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
/// `FS_IOC_SETFLAGS`: `_IOW('f', 2, long)`.
pub const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
/// `FS_IOC32_GETFLAGS`: `_IOR('f', 1, int)` (a 32-bit kernel's `FS_IOC_GETFLAGS`).
pub const FS_IOC32_GETFLAGS: u32 = 0x8004_6601;
/// `FS_IOC32_SETFLAGS`: `_IOW('f', 2, int)`.
pub const FS_IOC32_SETFLAGS: u32 = 0x4004_6602;
/// `FS_IOC_FSGETXATTR`: `_IOR('X', 31, struct fsxattr)`.
pub const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
/// `FS_IOC_FSSETXATTR`: `_IOW('X', 32, struct fsxattr)`.
pub const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;

/// `FS_IMMUTABLE_FL` and `FS_APPEND_FL`: the flags that bind every host user too.
pub const FS_IMMUTABLE_FL: u32 = 0x0000_0010;
pub const FS_APPEND_FL: u32 = 0x0000_0020;

const FSXATTR_SIZE: u32 = std::mem::size_of::<Fsxattr>() as u32;

/// An inode-flag request, decoded and bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileAttrRequest {
    /// `FS_IOC_GETFLAGS`: the `FS_*_FL` word.
    GetFlags,
    /// `FS_IOC_SETFLAGS` with the new `FS_*_FL` word.
    SetFlags(u32),
    /// `FS_IOC_FSGETXATTR`.
    GetXattr,
    /// `FS_IOC_FSSETXATTR` with the new attributes.
    SetXattr(Fsxattr),
}

impl FileAttrRequest {
    /// Whether the request changes the inode.
    pub fn sets(&self) -> bool {
        matches!(
            self,
            FileAttrRequest::SetFlags(_) | FileAttrRequest::SetXattr(_)
        )
    }
}

/// The answer to a [`FileAttrRequest`]: what a get read, or `Done` for a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileAttrReply {
    Flags(u32),
    Xattr(Fsxattr),
    Done,
}

fn err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// Reads the flag word a set carries: 4 bytes (what Linux sends), or 8 (the command's
/// encoded `long`) whose value must fit the 32-bit word.
fn read_flag_word(r: &mut Reader, size: u32) -> io::Result<u32> {
    match size {
        4 => Ok(u32::from_ne_bytes(r.read_obj::<[u8; 4]>()?)),
        8 => u32::try_from(u64::from_ne_bytes(r.read_obj::<[u8; 8]>()?)).map_err(|_| {
            log::debug!("FUSE_IOCTL: a flag word past 32 bits");
            err(libc::EINVAL)
        }),
        _ => Err(err(libc::EINVAL)),
    }
}

/// Decodes the request after `a` (its fixed part, already read): `ENOTTY` for a command or
/// mode not served, `EINVAL` for sizes that do not fit the command.
pub fn decode(a: &IoctlIn, r: &mut Reader) -> io::Result<FileAttrRequest> {
    if a.flags & ioctl_flags::UNRESTRICTED != 0 {
        log::debug!("FUSE_IOCTL: unrestricted ioctl {:#x} refused", a.cmd);
        return Err(err(libc::ENOTTY));
    }
    let bad_size = || {
        log::debug!(
            "FUSE_IOCTL {:#x}: in_size {} / out_size {} do not fit the command",
            a.cmd,
            a.in_size,
            a.out_size
        );
        err(libc::EINVAL)
    };
    match a.cmd {
        FS_IOC_GETFLAGS | FS_IOC32_GETFLAGS => match (a.in_size, a.out_size) {
            (0, 4 | 8) => Ok(FileAttrRequest::GetFlags),
            _ => Err(bad_size()),
        },
        FS_IOC_SETFLAGS | FS_IOC32_SETFLAGS => match (a.in_size, a.out_size) {
            (4 | 8, 0) => Ok(FileAttrRequest::SetFlags(read_flag_word(r, a.in_size)?)),
            _ => Err(bad_size()),
        },
        FS_IOC_FSGETXATTR => match (a.in_size, a.out_size) {
            (0, FSXATTR_SIZE) => Ok(FileAttrRequest::GetXattr),
            _ => Err(bad_size()),
        },
        FS_IOC_FSSETXATTR => match (a.in_size, a.out_size) {
            (FSXATTR_SIZE, 0) => Ok(FileAttrRequest::SetXattr(r.read_obj()?)),
            _ => Err(bad_size()),
        },
        cmd => {
            log::debug!("FUSE_IOCTL: ioctl {cmd:#x} not served");
            Err(err(libc::ENOTTY))
        }
    }
}

/// Writes the reply: `fuse_ioctl_out` then exactly `out_size` bytes (`a` was checked by
/// [`decode`], so they match the reply's kind).
fn encode(a: &IoctlIn, reply: FileAttrReply, w: &mut Writer) -> io::Result<()> {
    w.write_obj(&IoctlOut::default())?;
    match (reply, a.out_size) {
        (FileAttrReply::Flags(f), 4) => w.write_all(&f.to_ne_bytes()),
        (FileAttrReply::Flags(f), 8) => w.write_all(&u64::from(f).to_ne_bytes()),
        (FileAttrReply::Xattr(x), FSXATTR_SIZE) => w.write_obj(&x),
        (FileAttrReply::Done, 0) => Ok(()),
        (reply, size) => {
            // A filesystem answering a get with a set's reply (or the reverse): its bug, not
            // the guest's, but still no reply of the wrong size.
            log::warn!(
                "FUSE_IOCTL {:#x}: reply {reply:?} for out_size {size}",
                a.cmd
            );
            Err(err(libc::EIO))
        }
    }
}

/// FUSE_IOCTL on `inode`: decode, ask `fs`, encode.
pub fn serve<F: FileSystem + ?Sized>(
    fs: &F,
    ctx: &Context,
    inode: Inode,
    r: &mut Reader,
    w: &mut Writer,
) -> io::Result<()> {
    let a: IoctlIn = r.read_obj()?;
    let req = decode(&a, r)?;
    let reply = fs.fileattr(ctx, inode, Handle::from_raw(a.fh), req)?;
    encode(&a, reply, w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{ByteValued, VolatileSlice};

    fn decode_bytes(a: &IoctlIn, arg: &[u8]) -> io::Result<FileAttrRequest> {
        let mut data = arg.to_vec();
        let segs = if data.is_empty() {
            Vec::new()
        } else {
            vec![VolatileSlice::from(&mut data[..])]
        };
        decode(a, &mut Reader::new(segs))
    }

    fn ioc(cmd: u32, in_size: u32, out_size: u32) -> IoctlIn {
        IoctlIn {
            cmd,
            in_size,
            out_size,
            ..IoctlIn::default()
        }
    }

    /// The errno the guest gets: a short argument is an `UnexpectedEof`, which the server
    /// answers with EINVAL.
    fn errno(r: io::Result<FileAttrRequest>) -> i32 {
        let e = r.unwrap_err();
        match e.kind() {
            io::ErrorKind::UnexpectedEof => libc::EINVAL,
            _ => e.raw_os_error().unwrap(),
        }
    }

    #[test]
    fn the_command_numbers_are_the_kernels() {
        const fn ioc_num(dir: u32, typ: u8, nr: u32, size: u32) -> u32 {
            (dir << 30) | (size << 16) | ((typ as u32) << 8) | nr
        }
        assert_eq!(FS_IOC_GETFLAGS, ioc_num(2, b'f', 1, 8));
        assert_eq!(FS_IOC_SETFLAGS, ioc_num(1, b'f', 2, 8));
        assert_eq!(FS_IOC32_GETFLAGS, ioc_num(2, b'f', 1, 4));
        assert_eq!(FS_IOC32_SETFLAGS, ioc_num(1, b'f', 2, 4));
        assert_eq!(FS_IOC_FSGETXATTR, ioc_num(2, b'X', 31, 28));
        assert_eq!(FS_IOC_FSSETXATTR, ioc_num(1, b'X', 32, 28));
        assert_eq!(
            FS_IOC_GETFLAGS as libc::c_ulong,
            libc::FS_IOC_GETFLAGS as libc::c_ulong
        );
    }

    #[test]
    fn linux_requests_decode() {
        let get = ioc(FS_IOC_GETFLAGS, 0, 4);
        assert_eq!(decode_bytes(&get, &[]).unwrap(), FileAttrRequest::GetFlags);
        let set = ioc(FS_IOC_SETFLAGS, 4, 0);
        let v = 0x20u32.to_ne_bytes();
        assert_eq!(
            decode_bytes(&set, &v).unwrap(),
            FileAttrRequest::SetFlags(0x20)
        );
        let gx = ioc(FS_IOC_FSGETXATTR, 0, 28);
        assert_eq!(decode_bytes(&gx, &[]).unwrap(), FileAttrRequest::GetXattr);
        let x = Fsxattr {
            xflags: 8,
            projid: 7,
            ..Fsxattr::default()
        };
        let sx = ioc(FS_IOC_FSSETXATTR, 28, 0);
        assert_eq!(
            decode_bytes(&sx, x.as_slice()).unwrap(),
            FileAttrRequest::SetXattr(x)
        );
    }

    #[test]
    fn wrong_sizes_and_commands_are_refused() {
        for (a, arg, want) in [
            (ioc(FS_IOC_GETFLAGS, 0, 3), &[][..], libc::EINVAL),
            (ioc(FS_IOC_GETFLAGS, 0, u32::MAX), &[], libc::EINVAL),
            (ioc(FS_IOC_GETFLAGS, 4, 4), &[0; 4], libc::EINVAL),
            (ioc(FS_IOC_SETFLAGS, 2, 0), &[0; 2], libc::EINVAL),
            (ioc(FS_IOC_SETFLAGS, u32::MAX, 0), &[0; 8], libc::EINVAL),
            (ioc(FS_IOC_SETFLAGS, 4, 4), &[0; 4], libc::EINVAL),
            // The argument announced but not sent.
            (ioc(FS_IOC_SETFLAGS, 4, 0), &[0; 2], libc::EINVAL),
            (
                ioc(FS_IOC_SETFLAGS, 8, 0),
                &[0, 0, 0, 0, 1, 0, 0, 0],
                libc::EINVAL,
            ),
            (ioc(FS_IOC_FSGETXATTR, 0, 27), &[], libc::EINVAL),
            (ioc(FS_IOC_FSSETXATTR, 28, 0), &[0; 20], libc::EINVAL),
            (ioc(0x8008_6610, 0, 8), &[], libc::ENOTTY),
            (ioc(0, 0, 0), &[], libc::ENOTTY),
        ] {
            assert_eq!(errno(decode_bytes(&a, arg)), want, "{a:?}");
        }
        let mut a = ioc(FS_IOC_GETFLAGS, 0, 4);
        a.flags = ioctl_flags::UNRESTRICTED;
        assert_eq!(errno(decode_bytes(&a, &[])), libc::ENOTTY);
    }
}
