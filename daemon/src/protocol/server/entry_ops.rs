//! Handlers of the opcodes that look up, create, link, rename, remove and forget names:
//! one method per opcode, with the security-context policy of the creating ones.

use std::ffi::CStr;
use std::io;

use crate::protocol::abi::*;
use crate::protocol::filesystem::{Entry, FileSystem, Handle, Inode, LockOwner, OpenFlags};
use crate::protocol::iobuf::{Reader, Writer};
use crate::protocol::secctx::SecCtx;

use super::decode::{one_name, placeholder_name, symlink_names, two_names};
use super::{einval, empty, obj, open_out, HandlerResult, Reply, Req, Server};

impl<F: FileSystem> Server<F> {
    pub(super) fn lookup(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let e = self.fs.lookup(&req.ctx, req.nodeid, &one_name(r)?)?;
        self.entry(w, e)
    }

    pub(super) fn symlink(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let (ctx, ino) = (&req.ctx, req.nodeid);
        let (name, target) = symlink_names(r)?;
        let sec = self.secctx(req)?;
        let e = self.fs.symlink(ctx, &target, ino, &name)?;
        self.label(req, sec, &e, || {
            let _ = self.fs.unlink(ctx, ino, &name);
        })?;
        self.entry(w, e)
    }

    pub(super) fn mknod(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let (ctx, ino) = (&req.ctx, req.nodeid);
        let a: MknodIn = r.read_obj()?;
        let (name, sec) = (one_name(r)?, self.secctx(req)?);
        let e = self.fs.mknod(ctx, ino, &name, a.mode, a.rdev, a.umask)?;
        self.label(req, sec, &e, || {
            let _ = self.fs.unlink(ctx, ino, &name);
        })?;
        self.entry(w, e)
    }

    pub(super) fn mkdir(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let (ctx, ino) = (&req.ctx, req.nodeid);
        let a: MkdirIn = r.read_obj()?;
        let (name, sec) = (one_name(r)?, self.secctx(req)?);
        let e = self.fs.mkdir(ctx, ino, &name, a.mode, a.umask)?;
        self.label(req, sec, &e, || {
            let _ = self.fs.rmdir(ctx, ino, &name);
        })?;
        self.entry(w, e)
    }

    pub(super) fn unlink(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        empty(self.fs.unlink(&req.ctx, req.nodeid, &one_name(r)?))
    }

    pub(super) fn rmdir(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        empty(self.fs.rmdir(&req.ctx, req.nodeid, &one_name(r)?))
    }

    pub(super) fn rename(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        let a: RenameIn = r.read_obj()?;
        let (old, new) = two_names(r)?;
        empty(self.fs.rename(
            &req.ctx,
            req.nodeid,
            &old,
            Inode::from_raw(a.newdir),
            &new,
            0,
        ))
    }

    pub(super) fn rename2(&self, req: &Req, r: &mut Reader, _: &mut Writer) -> HandlerResult {
        let a: Rename2In = r.read_obj()?;
        let (old, new) = two_names(r)?;
        empty(self.fs.rename(
            &req.ctx,
            req.nodeid,
            &old,
            Inode::from_raw(a.newdir),
            &new,
            a.flags,
        ))
    }

    pub(super) fn link(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let a: LinkIn = r.read_obj()?;
        let e = self.fs.link(
            &req.ctx,
            Inode::from_raw(a.oldnodeid),
            req.nodeid,
            &one_name(r)?,
        )?;
        self.entry(w, e)
    }

    pub(super) fn create(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let (ctx, ino) = (&req.ctx, req.nodeid);
        let a: CreateIn = r.read_obj()?;
        let (name, mut sec) = (one_name(r)?, self.secctx(req)?);
        let (e, fh, flags) = self.create_for_label(req, &a, &name, &mut sec)?;
        self.label(req, sec, &e, || {
            let _ = self
                .fs
                .release(ctx, e.inode, fh, false, LockOwner::default());
            let _ = self.fs.unlink(ctx, ino, &name);
        })?;
        w.write_obj(&self.entry_out(&e))?;
        obj(w, &open_out(fh, flags, self.pass_through(e.inode, fh)))
    }

    /// CREATE's policy when the request carries a security context: only a file created
    /// here is labelled (and removed if that fails). So it creates exclusively; when the
    /// name exists, it opens the existing file and drops `sec` (that file keeps its label).
    fn create_for_label(
        &self,
        req: &Req,
        a: &CreateIn,
        name: &CStr,
        sec: &mut Option<SecCtx>,
    ) -> io::Result<(Entry, Handle, OpenFlags)> {
        let create = |flags| {
            self.fs.create(
                &req.ctx,
                req.nodeid,
                name,
                a.mode,
                flags,
                a.umask,
                a.open_flags,
            )
        };
        let excl = libc::O_EXCL as u32;
        if sec.is_none() || a.flags & excl != 0 {
            return create(a.flags);
        }
        match create(a.flags | excl) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                *sec = None;
                create(a.flags)
            }
            other => other,
        }
    }

    pub(super) fn tmpfile(&self, req: &Req, r: &mut Reader, w: &mut Writer) -> HandlerResult {
        let ctx = &req.ctx;
        let a: CreateIn = r.read_obj()?;
        placeholder_name(r)?;
        let sec = self.secctx(req)?;
        let (e, fh, flags) = self.fs.tmpfile(ctx, req.nodeid, a.mode, a.flags, a.umask)?;
        self.label(req, sec, &e, || {
            let _ = self
                .fs
                .release(ctx, e.inode, fh, false, LockOwner::default());
        })?;
        w.write_obj(&self.entry_out(&e))?;
        obj(w, &open_out(fh, flags, self.pass_through(e.inode, fh)))
    }

    pub(super) fn forget(&self, req: &Req, r: &mut Reader) -> HandlerResult {
        let a: ForgetIn = r.read_obj()?;
        self.fs.forget(&req.ctx, req.nodeid, a.nlookup);
        Ok(Reply::None)
    }

    pub(super) fn batch_forget(&self, req: &Req, r: &mut Reader) -> HandlerResult {
        let a: BatchForgetIn = r.read_obj()?;
        let len = (a.count as usize).checked_mul(std::mem::size_of::<ForgetOne>());
        if len != Some(r.available()) {
            log::warn!(
                "BATCH_FORGET count {} does not match {} bytes",
                a.count,
                r.available()
            );
            return Err(einval());
        }
        let mut items = Vec::with_capacity(a.count as usize);
        for _ in 0..a.count {
            let one: ForgetOne = r.read_obj()?;
            items.push((Inode::from_raw(one.nodeid), one.nlookup));
        }
        self.fs.batch_forget(&req.ctx, &items);
        Ok(Reply::None)
    }

    /// The security context a creating request carries (parsed before the create, so a
    /// malformed extension creates nothing).
    fn secctx(&self, req: &Req) -> io::Result<Option<SecCtx>> {
        if req.ext.is_empty() {
            return Ok(None);
        }
        crate::protocol::secctx::parse(&req.ext)
            .inspect_err(|_| log::warn!("unique={}: bad request extension", req.unique))
    }

    /// Sets the security context on a new inode, as virtiofsd does without SELinux's
    /// fscreate: after the create (not atomic; the guest sees the inode only with the
    /// reply). If that fails the create is undone (`undo`, then FORGET of the entry) and
    /// the error returned, so the guest never gets an unlabelled inode.
    fn label(
        &self,
        req: &Req,
        sec: Option<SecCtx>,
        e: &Entry,
        undo: impl FnOnce(),
    ) -> io::Result<()> {
        let Some(sec) = sec else { return Ok(()) };
        let set = self
            .fs
            .setxattr(&req.ctx, e.inode, &sec.name, &sec.value, 0, 0);
        if let Err(ref err) = set {
            log::warn!(
                "unique={}: cannot set {:?} on the new inode: {err}; create undone",
                req.unique,
                sec.name
            );
            undo();
            self.fs.forget(&req.ctx, e.inode, 1);
        }
        set
    }
}
