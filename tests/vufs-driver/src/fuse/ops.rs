//! One method per FUSE operation, on top of [`Session::call`].

use std::ffi::OsStr;
use std::io;

use daxfsd::abi::{self, init_flags as f, opcode as op};
use daxfsd::abi::{AttrOut, EntryOut, Kstatfs, OpenOut, RemovemappingOne, SetattrIn};
use vm_memory::ByteValued;

use super::{bad, check_reply, cstr, empty, obj, DirEntry, DirEntryPlus, Session, Xattr, OUT_HDR};

impl Session {
    pub fn lookup(&self, parent: u64, name: impl AsRef<OsStr>) -> io::Result<EntryOut> {
        let body = self.call(op::LOOKUP, parent, &[&cstr(name)], 128)?;
        obj(op::LOOKUP, &body)
    }

    /// GETATTR; with `fh`, of that open file.
    pub fn getattr(&self, nodeid: u64, fh: Option<u64>) -> io::Result<AttrOut> {
        let a = abi::GetattrIn {
            flags: if fh.is_some() { abi::GETATTR_FH } else { 0 },
            dummy: 0,
            fh: fh.unwrap_or(0),
        };
        let body = self.call(op::GETATTR, nodeid, &[a.as_slice()], 104)?;
        obj(op::GETATTR, &body)
    }

    pub fn setattr(&self, nodeid: u64, a: &SetattrIn) -> io::Result<AttrOut> {
        let body = self.call(op::SETATTR, nodeid, &[a.as_slice()], 104)?;
        obj(op::SETATTR, &body)
    }

    pub fn mkdir(
        &self,
        parent: u64,
        name: impl AsRef<OsStr>,
        mode: u32,
        umask: u32,
    ) -> io::Result<EntryOut> {
        let a = abi::MkdirIn { mode, umask };
        let body = self.call(op::MKDIR, parent, &[a.as_slice(), &cstr(name)], 128)?;
        obj(op::MKDIR, &body)
    }

    pub fn mknod(
        &self,
        parent: u64,
        name: impl AsRef<OsStr>,
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> io::Result<EntryOut> {
        let a = abi::MknodIn {
            mode,
            rdev,
            umask,
            padding: 0,
        };
        let body = self.call(op::MKNOD, parent, &[a.as_slice(), &cstr(name)], 128)?;
        obj(op::MKNOD, &body)
    }

    /// CREATE: `flags` are open(2) flags.
    pub fn create(
        &self,
        parent: u64,
        name: impl AsRef<OsStr>,
        flags: u32,
        mode: u32,
        umask: u32,
    ) -> io::Result<(EntryOut, OpenOut)> {
        let a = abi::CreateIn {
            flags,
            mode,
            umask,
            open_flags: 0,
        };
        let body = self.call(op::CREATE, parent, &[a.as_slice(), &cstr(name)], 144)?;
        if body.len() != 144 {
            return Err(bad(format!(
                "CREATE reply: body of {} bytes, expected 144",
                body.len()
            )));
        }
        Ok((
            obj(op::CREATE, &body[..128])?,
            obj(op::CREATE, &body[128..])?,
        ))
    }

    pub fn open(&self, nodeid: u64, flags: u32) -> io::Result<OpenOut> {
        let a = abi::OpenIn {
            flags,
            open_flags: 0,
        };
        let body = self.call(op::OPEN, nodeid, &[a.as_slice()], 16)?;
        obj(op::OPEN, &body)
    }

    pub fn opendir(&self, nodeid: u64, flags: u32) -> io::Result<OpenOut> {
        let a = abi::OpenIn {
            flags,
            open_flags: 0,
        };
        let body = self.call(op::OPENDIR, nodeid, &[a.as_slice()], 16)?;
        obj(op::OPENDIR, &body)
    }

    pub fn read(&self, nodeid: u64, fh: u64, offset: u64, size: u32) -> io::Result<Vec<u8>> {
        let a = abi::ReadIn {
            fh,
            offset,
            size,
            ..Default::default()
        };
        let body = self.call(op::READ, nodeid, &[a.as_slice()], size as usize)?;
        if body.len() > size as usize {
            return Err(bad(format!(
                "READ reply: {} bytes for a {size}-byte read",
                body.len()
            )));
        }
        Ok(body)
    }

    /// WRITE; returns the byte count the backend reports.
    pub fn write(&self, nodeid: u64, fh: u64, offset: u64, data: &[u8]) -> io::Result<u32> {
        let a = abi::WriteIn {
            fh,
            offset,
            size: u32::try_from(data.len()).map_err(|_| bad("write too big"))?,
            ..Default::default()
        };
        let body = self.call(op::WRITE, nodeid, &[a.as_slice(), data], 8)?;
        Ok(obj::<abi::WriteOut>(op::WRITE, &body)?.size)
    }

    pub fn readdir(
        &self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> io::Result<Vec<DirEntry>> {
        let a = abi::ReadIn {
            fh,
            offset,
            size,
            ..Default::default()
        };
        let body = self.call(op::READDIR, nodeid, &[a.as_slice()], size as usize)?;
        parse_dirents(&body, false).map(|v| v.into_iter().map(|e| e.dirent).collect())
    }

    pub fn readdirplus(
        &self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> io::Result<Vec<DirEntryPlus>> {
        let a = abi::ReadIn {
            fh,
            offset,
            size,
            ..Default::default()
        };
        let body = self.call(op::READDIRPLUS, nodeid, &[a.as_slice()], size as usize)?;
        parse_dirents(&body, true)
    }

    pub fn rename(
        &self,
        olddir: u64,
        oldname: impl AsRef<OsStr>,
        newdir: u64,
        newname: impl AsRef<OsStr>,
    ) -> io::Result<()> {
        let a = abi::RenameIn { newdir };
        let body = self.call(
            op::RENAME,
            olddir,
            &[a.as_slice(), &cstr(oldname), &cstr(newname)],
            0,
        )?;
        empty(op::RENAME, body)
    }

    /// RENAME2 with renameat2(2) flags (RENAME_NOREPLACE, RENAME_EXCHANGE, ...).
    pub fn rename2(
        &self,
        olddir: u64,
        oldname: impl AsRef<OsStr>,
        newdir: u64,
        newname: impl AsRef<OsStr>,
        flags: u32,
    ) -> io::Result<()> {
        let a = abi::Rename2In {
            newdir,
            flags,
            padding: 0,
        };
        let body = self.call(
            op::RENAME2,
            olddir,
            &[a.as_slice(), &cstr(oldname), &cstr(newname)],
            0,
        )?;
        empty(op::RENAME2, body)
    }

    pub fn unlink(&self, parent: u64, name: impl AsRef<OsStr>) -> io::Result<()> {
        let body = self.call(op::UNLINK, parent, &[&cstr(name)], 0)?;
        empty(op::UNLINK, body)
    }

    pub fn rmdir(&self, parent: u64, name: impl AsRef<OsStr>) -> io::Result<()> {
        let body = self.call(op::RMDIR, parent, &[&cstr(name)], 0)?;
        empty(op::RMDIR, body)
    }

    /// LINK: a new name `newname` in `newparent` for `oldnode`.
    pub fn link(
        &self,
        oldnode: u64,
        newparent: u64,
        newname: impl AsRef<OsStr>,
    ) -> io::Result<EntryOut> {
        let a = abi::LinkIn { oldnodeid: oldnode };
        let body = self.call(op::LINK, newparent, &[a.as_slice(), &cstr(newname)], 128)?;
        obj(op::LINK, &body)
    }

    /// SYMLINK: `name` in `parent` pointing at `target`.
    pub fn symlink(
        &self,
        parent: u64,
        name: impl AsRef<OsStr>,
        target: impl AsRef<OsStr>,
    ) -> io::Result<EntryOut> {
        let body = self.call(op::SYMLINK, parent, &[&cstr(name), &cstr(target)], 128)?;
        obj(op::SYMLINK, &body)
    }

    pub fn readlink(&self, nodeid: u64) -> io::Result<Vec<u8>> {
        self.call(op::READLINK, nodeid, &[], abi::PATH_MAX)
    }

    pub fn statfs(&self, nodeid: u64) -> io::Result<Kstatfs> {
        let body = self.call(op::STATFS, nodeid, &[], 80)?;
        Ok(obj::<abi::StatfsOut>(op::STATFS, &body)?.st)
    }

    pub fn access(&self, nodeid: u64, mask: u32) -> io::Result<()> {
        let a = abi::AccessIn { mask, padding: 0 };
        let body = self.call(op::ACCESS, nodeid, &[a.as_slice()], 0)?;
        empty(op::ACCESS, body)
    }

    fn release_op(&self, opc: u32, nodeid: u64, fh: u64, flags: u32) -> io::Result<()> {
        let a = abi::ReleaseIn {
            fh,
            flags,
            release_flags: 0,
            lock_owner: 0,
        };
        let body = self.call(opc, nodeid, &[a.as_slice()], 0)?;
        empty(opc, body)
    }

    /// RELEASE; `flags` are the open flags.
    pub fn release(&self, nodeid: u64, fh: u64, flags: u32) -> io::Result<()> {
        self.release_op(op::RELEASE, nodeid, fh, flags)
    }

    pub fn releasedir(&self, nodeid: u64, fh: u64, flags: u32) -> io::Result<()> {
        self.release_op(op::RELEASEDIR, nodeid, fh, flags)
    }

    pub fn fsync(&self, nodeid: u64, fh: u64, datasync: bool) -> io::Result<()> {
        let a = abi::FsyncIn {
            fh,
            fsync_flags: if datasync { abi::FSYNC_FDATASYNC } else { 0 },
            padding: 0,
        };
        let body = self.call(op::FSYNC, nodeid, &[a.as_slice()], 0)?;
        empty(op::FSYNC, body)
    }

    pub fn flush(&self, nodeid: u64, fh: u64, lock_owner: u64) -> io::Result<()> {
        let a = abi::FlushIn {
            fh,
            unused: 0,
            padding: 0,
            lock_owner,
        };
        let body = self.call(op::FLUSH, nodeid, &[a.as_slice()], 0)?;
        empty(op::FLUSH, body)
    }

    pub fn fallocate(
        &self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        length: u64,
        mode: u32,
    ) -> io::Result<()> {
        let a = abi::FallocateIn {
            fh,
            offset,
            length,
            mode,
            padding: 0,
        };
        let body = self.call(op::FALLOCATE, nodeid, &[a.as_slice()], 0)?;
        empty(op::FALLOCATE, body)
    }

    pub fn lseek(&self, nodeid: u64, fh: u64, offset: u64, whence: u32) -> io::Result<u64> {
        let a = abi::LseekIn {
            fh,
            offset,
            whence,
            padding: 0,
        };
        let body = self.call(op::LSEEK, nodeid, &[a.as_slice()], 8)?;
        Ok(obj::<abi::LseekOut>(op::LSEEK, &body)?.offset)
    }

    /// FORGET (hiprio queue, no reply).
    pub fn forget(&self, nodeid: u64, nlookup: u64) -> io::Result<()> {
        let a = abi::ForgetIn { nlookup };
        self.call_noreply(op::FORGET, nodeid, &[a.as_slice()])
    }

    /// BATCH_FORGET (hiprio queue, no reply).
    pub fn batch_forget(&self, nodes: &[abi::ForgetOne]) -> io::Result<()> {
        let a = abi::BatchForgetIn {
            count: nodes.len() as u32,
            dummy: 0,
        };
        let mut body = a.as_slice().to_vec();
        nodes
            .iter()
            .for_each(|n| body.extend_from_slice(n.as_slice()));
        self.call_noreply(op::BATCH_FORGET, 0, &[&body])
    }

    /// SETXATTR (with the 16-byte argument if SETXATTR_EXT was negotiated, else 8 bytes).
    pub fn setxattr(
        &self,
        nodeid: u64,
        name: impl AsRef<OsStr>,
        value: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        self.setxattr_ext(nodeid, name, value, flags, 0)
    }

    /// SETXATTR with `setxattr_flags` (e.g. `SETXATTR_ACL_KILL_SGID`; dropped when
    /// SETXATTR_EXT was not negotiated, as the kernel does).
    pub fn setxattr_ext(
        &self,
        nodeid: u64,
        name: impl AsRef<OsStr>,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
    ) -> io::Result<()> {
        let a = abi::SetxattrIn {
            size: value.len() as u32,
            flags,
            setxattr_flags,
            padding: 0,
        };
        let arg = if self.negotiated() & f::SETXATTR_EXT != 0 {
            a.as_slice()
        } else {
            &a.as_slice()[..abi::COMPAT_SETXATTR_IN_SIZE]
        };
        let body = self.call(op::SETXATTR, nodeid, &[arg, &cstr(name), value], 0)?;
        empty(op::SETXATTR, body)
    }

    fn xattr_reply(&self, opc: u32, size: u32, body: Vec<u8>) -> io::Result<Xattr> {
        if size == 0 {
            return Ok(Xattr::Size(obj::<abi::GetxattrOut>(opc, &body)?.size));
        }
        if body.len() > size as usize {
            return Err(bad(format!("{} reply larger than {size}", op::name(opc))));
        }
        Ok(Xattr::Data(body))
    }

    /// GETXATTR; `size` 0 asks for the value's size.
    pub fn getxattr(&self, nodeid: u64, name: impl AsRef<OsStr>, size: u32) -> io::Result<Xattr> {
        let a = abi::GetxattrIn { size, padding: 0 };
        let cap = if size == 0 { 8 } else { size as usize };
        let body = self.call(op::GETXATTR, nodeid, &[a.as_slice(), &cstr(name)], cap)?;
        self.xattr_reply(op::GETXATTR, size, body)
    }

    /// LISTXATTR; `size` 0 asks for the list's size.
    pub fn listxattr(&self, nodeid: u64, size: u32) -> io::Result<Xattr> {
        let a = abi::GetxattrIn { size, padding: 0 };
        let cap = if size == 0 { 8 } else { size as usize };
        let body = self.call(op::LISTXATTR, nodeid, &[a.as_slice()], cap)?;
        self.xattr_reply(op::LISTXATTR, size, body)
    }

    pub fn removexattr(&self, nodeid: u64, name: impl AsRef<OsStr>) -> io::Result<()> {
        let body = self.call(op::REMOVEXATTR, nodeid, &[&cstr(name)], 0)?;
        empty(op::REMOVEXATTR, body)
    }

    /// SETUPMAPPING: map `len` bytes of open file `fh` at `foffset` to window offset
    /// `moffset`; `flags` are [`abi::SETUPMAPPING_FLAG_READ`] / `_WRITE`.
    pub fn setupmapping(
        &self,
        nodeid: u64,
        fh: u64,
        foffset: u64,
        len: u64,
        flags: u64,
        moffset: u64,
    ) -> io::Result<()> {
        let a = abi::SetupmappingIn {
            fh,
            foffset,
            len,
            flags,
            moffset,
        };
        let body = self.call(op::SETUPMAPPING, nodeid, &[a.as_slice()], 0)?;
        empty(op::SETUPMAPPING, body)
    }

    /// REMOVEMAPPING of `ranges` (Linux sends the inode's nodeid).
    pub fn removemapping(&self, nodeid: u64, ranges: &[RemovemappingOne]) -> io::Result<()> {
        let mut arg = abi::RemovemappingIn {
            count: ranges.len() as u32,
        }
        .as_slice()
        .to_vec();
        ranges
            .iter()
            .for_each(|r| arg.extend_from_slice(r.as_slice()));
        let body = self.call(op::REMOVEMAPPING, nodeid, &[&arg], 0)?;
        empty(op::REMOVEMAPPING, body)
    }

    /// DESTROY (what a guest sends at unmount). virtiofsd 1.14 returns the chain without a
    /// reply (used len 0); Linux then reads its zeroed out-header as success, so that is
    /// accepted too.
    pub fn destroy(&self) -> io::Result<()> {
        let hdr = self.header(op::DESTROY, 0, 0);
        let r = self.send_with_header(&hdr, &[], OUT_HDR as u32, self.queue)?;
        if r.used_len == 0 {
            return Ok(());
        }
        empty(op::DESTROY, check_reply(&hdr, &r)?)
    }
}

/// Parses READDIR (`plus` false) or READDIRPLUS records.
fn parse_dirents(mut buf: &[u8], plus: bool) -> io::Result<Vec<DirEntryPlus>> {
    let fixed = if plus { 152 } else { 24 };
    let mut out = Vec::new();
    while !buf.is_empty() {
        if buf.len() < fixed {
            return Err(bad(format!(
                "directory reply: {} trailing bytes",
                buf.len()
            )));
        }
        let entry = if plus {
            *EntryOut::from_slice(&buf[..128]).ok_or_else(|| bad("dirent"))?
        } else {
            EntryOut::default()
        };
        let d = *abi::Dirent::from_slice(&buf[fixed - 24..fixed]).ok_or_else(|| bad("dirent"))?;
        let n = d.namelen as usize;
        if n == 0 || n > abi::NAME_MAX {
            return Err(bad(format!("directory reply: name length {n}")));
        }
        let rec = abi::dirent_size(fixed, n)
            .filter(|r| *r <= buf.len())
            .ok_or_else(|| {
                bad(format!(
                    "directory reply: record of name length {n} overruns the reply"
                ))
            })?;
        out.push(DirEntryPlus {
            entry,
            dirent: DirEntry {
                ino: d.ino,
                off: d.off,
                typ: d.typ,
                name: buf[fixed..fixed + n].to_vec(),
            },
        });
        buf = &buf[rec..];
    }
    Ok(out)
}
