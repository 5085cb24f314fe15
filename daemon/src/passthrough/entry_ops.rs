//! Namespace and metadata operations: lookup, attributes, links, names, statfs, access.

use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use super::{check_name, decode_dev, err, fd_name, stat_fd, PassthroughFs};
use crate::protocol::abi::{fattr, Attr, Kstatfs, SetattrIn};
use crate::protocol::filesystem::{Context, Entry, Handle, Inode, StatxExtra};
use crate::sys;

/// One time of a SETATTR as `utimensat` takes it: `UTIME_NOW` for FATTR_*_NOW, the given time
/// for FATTR_*, else `UTIME_OMIT`.
///
/// The seconds travel as a `u64` that the guest kernel filled from its signed `time64_t`:
/// they are read back as two's complement, so times before 1970 stay negative. Every value
/// goes to the host, which stores it or clamps it to its file system's range (and the reply
/// shows what it stored). Nanoseconds past 999999999 are no time: EINVAL, as `utimensat`
/// gives, also for the values `utimensat` would read as UTIME_NOW or UTIME_OMIT (the protocol
/// says those with the flags, never with the nanoseconds).
fn timespec(valid: u32, set: u32, now: u32, secs: u64, nsecs: u32) -> io::Result<libc::timespec> {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::UTIME_OMIT,
    };
    if valid & now != 0 {
        t.tv_nsec = libc::UTIME_NOW;
    } else if valid & set != 0 {
        if nsecs >= 1_000_000_000 {
            return Err(err(libc::EINVAL));
        }
        // Two's complement on purpose (see above); `time_t` is 64 bits on every target.
        t.tv_sec = secs as i64 as libc::time_t;
        t.tv_nsec = libc::c_long::from(nsecs);
    }
    Ok(t)
}

impl PassthroughFs {
    pub(super) fn do_getattr(&self, inode: Inode) -> io::Result<(Attr, Duration)> {
        let data = self.inode(inode)?;
        let st = stat_fd(data.fd()?.as_fd())?;
        Ok((self.guest_attr(&st), self.timeout()))
    }

    /// The host's birth time and `STATX_ATTR_*` flags of `inode` (the server keeps those
    /// FUSE carries).
    pub(super) fn do_statx_extra(&self, inode: Inode) -> io::Result<StatxExtra> {
        let data = self.inode(inode)?;
        let st = sys::statx(
            data.fd()?.as_fd(),
            sys::EMPTY,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BTIME,
        )?;
        Ok(StatxExtra {
            btime: (st.stx_mask & libc::STATX_BTIME != 0)
                .then_some((st.stx_btime.tv_sec, st.stx_btime.tv_nsec)),
            attributes: st.stx_attributes & st.stx_attributes_mask,
            attributes_mask: st.stx_attributes_mask,
        })
    }

    pub(super) fn do_setattr(
        &self,
        inode: Inode,
        a: &SetattrIn,
        handle: Option<Handle>,
    ) -> io::Result<(Attr, Duration)> {
        self.check_writable()?;
        let data = self.inode(inode)?;
        let h = handle
            .map(|fh| self.handles.get_file(inode, fh))
            .transpose()?;
        let valid = a.valid;
        let killpriv = self
            .negotiated
            .killpriv_v2
            .load(std::sync::atomic::Ordering::Relaxed);

        // Checked before anything changes: a refused time leaves the file as it was.
        let times =
            if valid & (fattr::ATIME | fattr::MTIME | fattr::ATIME_NOW | fattr::MTIME_NOW) != 0 {
                Some([
                    timespec(valid, fattr::ATIME, fattr::ATIME_NOW, a.atime, a.atimensec)?,
                    timespec(valid, fattr::MTIME, fattr::MTIME_NOW, a.mtime, a.mtimensec)?,
                ])
            } else {
                None
            };

        if valid & fattr::MODE != 0 {
            let mode = a.mode & 0o7777;
            match &h {
                Some(h) => sys::fchmod(h.fd(), mode)?,
                // Through the magic link: lands on the inode itself, follows nothing.
                None => sys::fchmodat(
                    self.proc_self_fd.as_fd(),
                    &fd_name(data.fd()?.as_fd()),
                    mode,
                )?,
            }
        }

        if valid & (fattr::UID | fattr::GID) != 0 {
            // New owners are guest ids: translate them (a forbidden one is refused).
            let uid = if valid & fattr::UID != 0 {
                self.cfg
                    .uid_map
                    .to_host(a.uid)
                    .ok_or_else(|| err(libc::EPERM))?
            } else {
                u32::MAX
            };
            let gid = if valid & fattr::GID != 0 {
                self.cfg
                    .gid_map
                    .to_host(a.gid)
                    .ok_or_else(|| err(libc::EPERM))?
            } else {
                u32::MAX
            };
            sys::fchownat(
                data.fd()?.as_fd(),
                sys::EMPTY,
                uid,
                gid,
                libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            )?;
        }

        if valid & fattr::SIZE != 0 {
            match data.kind {
                libc::S_IFREG => {}
                libc::S_IFDIR => return Err(err(libc::EISDIR)),
                _ => return Err(err(libc::EINVAL)),
            }
            let kill = killpriv && valid & fattr::KILL_SUIDGID != 0 && valid & fattr::MODE == 0;
            // Without a handle (Linux sends an `O_TRUNC` open's truncation so, after its
            // OPEN; also `truncate(2)`), through a handle of the inode open for writing when
            // there is one, not a descriptor of its own: ext4, xfs and btrfs write a file
            // truncated to 0 out early when the truncating open file is closed (ext4's
            // `auto_da_alloc`: a rewrite by `O_TRUNC` without fsync survives a host crash). A
            // descriptor closed at once, before the rewrite, would spend that on nothing.
            let writable = h
                .clone()
                .filter(|h| matches!(h.access(), Some((_, true))))
                .or_else(|| self.handles.writer(inode));
            match writable.as_ref() {
                Some(h) => {
                    sys::ftruncate(h.fd(), a.size)?;
                    if kill {
                        self.kill_suidgid(h.fd())?;
                    }
                }
                None => {
                    let fd = self.reopen(&data, libc::O_WRONLY)?;
                    sys::ftruncate(fd.as_fd(), a.size)?;
                    if kill {
                        self.kill_suidgid(fd.as_fd())?;
                    }
                }
            }
        }

        if let Some(times) = times {
            match &h {
                Some(h) => sys::futimens(h.fd(), &times)?,
                None => sys::utimensat(
                    self.proc_self_fd.as_fd(),
                    &fd_name(data.fd()?.as_fd()),
                    &times,
                    0,
                )?,
            }
        }

        self.do_getattr(inode)
    }

    pub(super) fn do_symlink(
        &self,
        ctx: &Context,
        target: &CStr,
        parent: Inode,
        name: &CStr,
    ) -> io::Result<Entry> {
        self.check_writable()?;
        check_name(name)?;
        let p = self.dir_inode(parent)?;
        // Before switching credentials: opening a file handle needs CAP_DAC_READ_SEARCH.
        let pfd = p.fd()?;
        {
            let _creds = self.creds.switch_to(&self.host_ctx(ctx)?)?;
            sys::symlinkat(target, pfd.as_fd(), name)?;
        }
        self.do_lookup(&p, name)
    }

    pub(super) fn do_mknod(
        &self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        self.check_writable()?;
        check_name(name)?;
        let p = self.dir_inode(parent)?;
        let (perm, _umask) = self.create_mode(mode, umask)?;
        let mode = (mode & libc::S_IFMT) | perm;
        // Before switching credentials: opening a file handle needs CAP_DAC_READ_SEARCH.
        let pfd = p.fd()?;
        {
            let _creds = self.creds.switch_to(&self.host_ctx(ctx)?)?;
            sys::mknodat(pfd.as_fd(), name, mode, decode_dev(rdev))?;
        }
        self.do_lookup(&p, name)
    }

    pub(super) fn do_mkdir(
        &self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        self.check_writable()?;
        check_name(name)?;
        let p = self.dir_inode(parent)?;
        // Before switching credentials: opening a file handle needs CAP_DAC_READ_SEARCH.
        let pfd = p.fd()?;
        {
            let (mode, _umask) = self.create_mode(mode, umask)?;
            let _creds = self.creds.switch_to(&self.host_ctx(ctx)?)?;
            sys::mkdirat(pfd.as_fd(), name, mode)?;
        }
        self.do_lookup(&p, name)
    }

    pub(super) fn do_unlink(
        &self,
        parent: Inode,
        name: &CStr,
        flags: libc::c_int,
    ) -> io::Result<()> {
        self.check_writable()?;
        check_name(name)?;
        let p = self.dir_inode(parent)?;
        sys::unlinkat(p.fd()?.as_fd(), name, flags)
    }

    pub(super) fn do_rename(
        &self,
        olddir: Inode,
        oldname: &CStr,
        newdir: Inode,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        self.check_writable()?;
        check_name(oldname)?;
        check_name(newname)?;
        let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT;
        if flags & !known != 0 {
            return Err(err(libc::EINVAL));
        }
        let old = self.dir_inode(olddir)?;
        let new = self.dir_inode(newdir)?;
        sys::renameat2(
            old.fd()?.as_fd(),
            oldname,
            new.fd()?.as_fd(),
            newname,
            flags,
        )
    }

    pub(super) fn do_link(
        &self,
        inode: Inode,
        newparent: Inode,
        newname: &CStr,
    ) -> io::Result<Entry> {
        self.check_writable()?;
        check_name(newname)?;
        let data = self.inode(inode)?;
        if data.is_dir() {
            return Err(err(libc::EPERM));
        }
        let p = self.dir_inode(newparent)?;
        // Through the magic link (AT_SYMLINK_FOLLOW follows only that link, onto the inode
        // itself): needs no CAP_DAC_READ_SEARCH, unlike AT_EMPTY_PATH.
        sys::linkat(
            self.proc_self_fd.as_fd(),
            &fd_name(data.fd()?.as_fd()),
            p.fd()?.as_fd(),
            newname,
            libc::AT_SYMLINK_FOLLOW,
        )?;
        self.do_lookup(&p, newname)
    }

    pub(super) fn do_statfs(&self, inode: Inode) -> io::Result<Kstatfs> {
        let data = self.inode(inode)?;
        let st = sys::fstatfs(data.fd()?.as_fd())?;
        Ok(Kstatfs {
            blocks: st.f_blocks,
            bfree: st.f_bfree,
            bavail: st.f_bavail,
            files: st.f_files,
            ffree: st.f_ffree,
            bsize: st.f_bsize as u32,
            namelen: st.f_namelen as u32,
            frsize: st.f_frsize as u32,
            padding: 0,
            spare: [0; 6],
        })
    }

    /// Permission check against the file's mode bits with the caller's ids (as the guest's
    /// `access(2)` expects; the daemon's own root powers do not count). Root passes
    /// everything but `X_OK` on a file without any execute bit.
    pub(super) fn do_access(&self, ctx: &Context, inode: Inode, mask: u32) -> io::Result<()> {
        let ctx = &self.host_ctx(ctx)?;
        let data = self.inode(inode)?;
        let st = stat_fd(data.fd()?.as_fd())?;
        let mode = u32::from(st.stx_mode);
        let mask = mask & 0o7;
        if mask == libc::F_OK as u32 {
            return Ok(());
        }
        if mask & libc::W_OK as u32 != 0 && self.cfg.readonly {
            return Err(err(libc::EROFS));
        }
        if ctx.uid == 0 {
            let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
            if mask & libc::X_OK as u32 != 0 && !is_dir && mode & 0o111 == 0 {
                return Err(err(libc::EACCES));
            }
            return Ok(());
        }
        let bits = if st.stx_uid == ctx.uid {
            (mode >> 6) & 0o7
        } else if st.stx_gid == ctx.gid {
            (mode >> 3) & 0o7
        } else {
            mode & 0o7
        };
        if mask & !bits != 0 {
            return Err(err(libc::EACCES));
        }
        Ok(())
    }
}
