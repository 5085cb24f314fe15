//! Handlers of the opcodes on open files and directories: open, I/O, sync, release,
//! locks, directory listings and the DAX window's mappings. One method per opcode.

use std::io;

use crate::protocol::abi::{self, *};
use crate::protocol::filesystem::{DirEntry, Entry, FileSystem, Handle, Inode, LockOwner};
use crate::protocol::iobuf::{Reader, Writer};

use super::{einval, empty, err, obj, open_out, HandlerResult, Reply, Req, Server};
use super::{MAP_ALIGNMENT_LOG2, PAGE_SIZE};

impl<F: FileSystem> Server<F> {
    pub(super) fn open(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let ino = req.nodeid;
        let a: OpenIn = r.read_obj()?;
        let (fh, flags) = self.fs.open(&req.ctx, ino, a.flags, a.open_flags)?;
        obj(w, &open_out(fh, flags, self.pass_through(ino, fh)))
    }

    pub(super) fn opendir(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let a: OpenIn = r.read_obj()?;
        let (fh, flags) = self.fs.opendir(&req.ctx, req.nodeid, a.flags)?;
        obj(w, &open_out(fh, flags, None))
    }

    pub(super) fn read(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let a: ReadIn = r.read_obj()?;
        self.check_io_size(a.size)?;
        if (a.size as usize) > w.available() {
            return Err(err(libc::ENOBUFS));
        }
        self.fs.read(
            &req.ctx,
            req.nodeid,
            Handle::from_raw(a.fh),
            w,
            a.size,
            a.offset,
        )?;
        Ok(Reply::Body)
    }

    pub(super) fn write(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let a: WriteIn = r.read_obj()?;
        self.check_io_size(a.size)?;
        check_write_data(&a, r)?;
        let kill = a.write_flags & WRITE_KILL_SUIDGID != 0;
        let n = self.fs.write(
            &req.ctx,
            req.nodeid,
            Handle::from_raw(a.fh),
            r,
            a.size,
            a.offset,
            kill,
        )?;
        write_out(w, n)
    }

    pub(super) fn release(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        let a: ReleaseIn = r.read_obj()?;
        let flock = a.release_flags & RELEASE_FLOCK_UNLOCK != 0;
        if let Some(p) = &self.fuse_passthrough {
            p.released(a.fh);
        }
        let (fh, owner) = (Handle::from_raw(a.fh), LockOwner::from_raw(a.lock_owner));
        empty(self.fs.release(&req.ctx, req.nodeid, fh, flock, owner))
    }

    pub(super) fn releasedir(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        let a: ReleaseIn = r.read_obj()?;
        empty(
            self.fs
                .releasedir(&req.ctx, req.nodeid, Handle::from_raw(a.fh)),
        )
    }

    pub(super) fn fsync(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        let (fh, datasync) = fsync_args(r)?;
        empty(self.fs.fsync(&req.ctx, req.nodeid, datasync, fh))
    }

    pub(super) fn fsyncdir(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        let (fh, datasync) = fsync_args(r)?;
        empty(self.fs.fsyncdir(&req.ctx, req.nodeid, datasync, fh))
    }

    pub(super) fn flush(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        let a: FlushIn = r.read_obj()?;
        let (fh, owner) = (Handle::from_raw(a.fh), LockOwner::from_raw(a.lock_owner));
        empty(self.fs.flush(&req.ctx, req.nodeid, fh, owner))
    }

    pub(super) fn getlk(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let a: LkIn = r.read_obj()?;
        let (fh, owner) = (Handle::from_raw(a.fh), LockOwner::from_raw(a.owner));
        let lk = self.fs.getlk(&req.ctx, req.nodeid, fh, owner, a.lk)?;
        obj(w, &LkOut { lk })
    }

    pub(super) fn setlk(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        self.set_lock(req, r, false)
    }

    pub(super) fn setlkw(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        self.set_lock(req, r, true)
    }

    /// SETLK and SETLKW: the same argument; `wait` is SETLKW's.
    fn set_lock(&self, req: &Req, r: &mut Reader, wait: bool) -> HandlerResult {
        let a: LkIn = r.read_obj()?;
        let flock = a.lk_flags & LK_FLOCK != 0;
        let (fh, owner) = (Handle::from_raw(a.fh), LockOwner::from_raw(a.owner));
        empty(
            self.fs
                .setlk(&req.ctx, req.nodeid, fh, owner, a.lk, flock, wait),
        )
    }

    pub(super) fn fallocate(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        let a: FallocateIn = r.read_obj()?;
        empty(self.fs.fallocate(
            &req.ctx,
            req.nodeid,
            Handle::from_raw(a.fh),
            a.mode,
            a.offset,
            a.length,
        ))
    }

    pub(super) fn lseek(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let a: LseekIn = r.read_obj()?;
        let offset = self.fs.lseek(
            &req.ctx,
            req.nodeid,
            Handle::from_raw(a.fh),
            a.offset,
            a.whence,
        )?;
        obj(w, &LseekOut { offset })
    }

    pub(super) fn copy_file_range(
        &self,
        req: &Req,
        r: &mut Reader,
        w: &mut Writer,
    ) -> HandlerResult {
        let a: CopyFileRangeIn = r.read_obj()?;
        let n = self.fs.copy_file_range(
            &req.ctx,
            req.nodeid,
            Handle::from_raw(a.fh_in),
            a.off_in,
            Inode::from_raw(a.nodeid_out),
            Handle::from_raw(a.fh_out),
            a.off_out,
            copy_len(a.len),
            a.flags,
        )?;
        write_out(w, n)
    }

    pub(super) fn readdir(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        self.list_dir(req, r, w, false)
    }

    pub(super) fn readdirplus(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        self.list_dir(req, r, w, true)
    }

    /// READDIR and READDIRPLUS (`plus`): entries as long as they fit the guest's buffer.
    fn list_dir(&self, req: &Req, r: &mut Reader, w: &mut Writer, plus: bool) -> HandlerResult {
        let a: ReadIn = r.read_obj()?;
        self.check_io_size(a.size)?;
        let mut budget = (a.size as usize).min(w.available());
        let fixed = if plus {
            std::mem::size_of::<DirentPlus>()
        } else {
            std::mem::size_of::<Dirent>()
        };
        let mut add = |d: DirEntry, e: Option<&Entry>| -> io::Result<bool> {
            if d.name.is_empty() || d.name.len() > NAME_MAX {
                return Err(err(libc::EIO));
            }
            let size = abi::dirent_size(fixed, d.name.len()).ok_or_else(einval)?;
            if size > budget {
                return Ok(false);
            }
            let dirent = Dirent {
                ino: d.ino,
                off: d.offset,
                namelen: d.name.len() as u32,
                typ: d.typ,
            };
            if plus {
                let entry_out = e.map(|e| self.entry_out(e)).unwrap_or_default();
                w.write_obj(&DirentPlus { entry_out, dirent })?;
            } else {
                w.write_obj(&dirent)?;
            }
            w.write_all(d.name)?;
            let pad = size - fixed - d.name.len();
            w.write_all(&[0u8; 8][..pad])?;
            budget -= size;
            Ok(true)
        };
        self.fs.readdir(
            &req.ctx,
            req.nodeid,
            Handle::from_raw(a.fh),
            a.offset,
            plus,
            &mut add,
        )?;
        Ok(Reply::Body)
    }

    pub(super) fn setupmapping(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        let a: SetupmappingIn = r.read_obj()?;
        let writable = a.flags & SETUPMAPPING_FLAG_WRITE != 0;
        empty(self.fs.setupmapping(
            &req.ctx,
            req.nodeid,
            Handle::from_raw(a.fh),
            a.foffset,
            a.len,
            a.moffset,
            writable,
            self.mapper.as_ref(),
        ))
    }

    pub(super) fn removemapping(&self, _: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        let ranges = removemapping_ranges(r)?;
        // Every range is checked before any is unmapped: a malformed request changes nothing.
        self.check_window_ranges(&ranges)?;
        let mut first_err = None;
        for one in ranges {
            if let Err(e) = self.mapper.unmap(one.moffset, one.len) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(Reply::Body), Err)
    }

    /// Each range must be non-empty, aligned and inside the window (when there is one).
    fn check_window_ranges(&self, ranges: &[RemovemappingOne]) -> io::Result<()> {
        let size = self.mapper.window_size();
        let align = 1u64 << MAP_ALIGNMENT_LOG2;
        if size == 0 {
            return Ok(());
        }
        if let Some(bad) = ranges.iter().find(|one| {
            one.len == 0
                || one.moffset % align != 0
                || one.len % align != 0
                || !matches!(one.moffset.checked_add(one.len), Some(end) if end <= size)
        }) {
            log::warn!(
                "REMOVEMAPPING of {:#x}+{:#x}: not a range of the {size:#x}-byte window",
                bad.moffset,
                bad.len
            );
            return Err(einval());
        }
        Ok(())
    }
}

/// WRITE's data must be exactly the `size` it announces.
fn check_write_data(a: &WriteIn, r: &Reader) -> io::Result<()> {
    if a.size as usize != r.available() {
        log::warn!(
            "WRITE of {} bytes carries {} bytes of data",
            a.size,
            r.available()
        );
        return Err(einval());
    }
    Ok(())
}

/// The reply of WRITE and COPY_FILE_RANGE: a 32-bit count.
fn write_out(w: &mut Writer, n: usize) -> HandlerResult {
    let size = u32::try_from(n).map_err(|_| einval())?;
    obj(w, &WriteOut { size, padding: 0 })
}

/// COPY_FILE_RANGE's length: the reply carries a 32-bit count, so never copy more than fits
/// (rounded down to a page).
fn copy_len(len: u64) -> u64 {
    len.min(u64::from(u32::MAX) & !u64::from(PAGE_SIZE - 1))
}

/// FSYNC's and FSYNCDIR's argument: the handle, and whether only data is synced.
fn fsync_args(r: &mut Reader) -> io::Result<(Handle, bool)> {
    let a: FsyncIn = r.read_obj()?;
    Ok((Handle::from_raw(a.fh), a.fsync_flags & FSYNC_FDATASYNC != 0))
}

/// REMOVEMAPPING's ranges: `count` of them (at least one), exactly filling the payload.
fn removemapping_ranges(r: &mut Reader) -> io::Result<Vec<RemovemappingOne>> {
    let a: RemovemappingIn = r.read_obj()?;
    let len = (a.count as usize).checked_mul(std::mem::size_of::<RemovemappingOne>());
    if a.count == 0 || len != Some(r.available()) {
        log::warn!(
            "REMOVEMAPPING count {} does not match {} bytes",
            a.count,
            r.available()
        );
        return Err(einval());
    }
    let mut ranges = Vec::with_capacity(a.count as usize);
    for _ in 0..a.count {
        ranges.push(r.read_obj::<RemovemappingOne>()?);
    }
    Ok(ranges)
}
