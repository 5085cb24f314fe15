//! Regular-file operations: open/create/tmpfile, I/O, sync, locks, space, DAX mapping.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::handle::HandleData;
use super::inode::InodeData;
use super::{check_name, err, PassthroughFs};
use crate::protocol::abi::{FileLock, OPEN_KILL_SUIDGID};
use crate::protocol::filesystem::{Context, Entry, Handle, Inode, LockOwner, OpenFlags};
use crate::protocol::iobuf::{Reader, Writer};
use crate::protocol::mapper::Mapper;
use crate::sys;

/// Open flags passed on to the host; everything else (O_CREAT, O_EXCL, O_NOCTTY,
/// O_NOFOLLOW, O_PATH, O_TMPFILE, O_DIRECTORY, ...) is dropped.
const PASSED_FLAGS: libc::c_int = libc::O_ACCMODE
    | libc::O_APPEND
    | libc::O_TRUNC
    | libc::O_NONBLOCK
    | libc::O_DSYNC
    | libc::O_SYNC
    | libc::O_DIRECT
    | libc::O_NOATIME
    | libc::O_LARGEFILE;

/// Drops every POSIX lock held on `fd` (an owner's descriptor that is going away; an
/// in-flight request may still hold a reference, so closing alone might not).
fn unlock_all(fd: &OwnedFd) {
    let mut fl = libc::flock64 {
        l_type: libc::F_UNLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    if let Err(e) = sys::fcntl_lock(fd.as_fd(), libc::F_OFD_SETLK, &mut fl) {
        log::debug!("unlocking a lock owner: {e}");
    }
}

/// Waits `d` with a timed futex wait: `nanosleep` is not in the seccomp allow-list.
fn nap(d: Duration) {
    static NAP: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
    let g = NAP.0.lock().unwrap_or_else(|p| p.into_inner());
    drop(NAP.1.wait_timeout(g, d));
}

/// `l_len` for a FUSE lock range: 0 means "to the end of the file".
fn to_flock(lock: &FileLock) -> io::Result<libc::flock64> {
    let start = i64::try_from(lock.start).map_err(|_| err(libc::EINVAL))?;
    let len = if lock.end >= i64::MAX as u64 {
        0
    } else if lock.end < lock.start {
        return Err(err(libc::EINVAL));
    } else {
        i64::try_from(lock.end - lock.start + 1).map_err(|_| err(libc::EINVAL))?
    };
    let typ = match lock.typ as libc::c_int {
        libc::F_RDLCK | libc::F_WRLCK | libc::F_UNLCK => lock.typ as libc::c_short,
        _ => return Err(err(libc::EINVAL)),
    };
    Ok(libc::flock64 {
        l_type: typ,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        // OFD locks require 0.
        l_pid: 0,
    })
}

fn from_flock(fl: &libc::flock64) -> FileLock {
    if fl.l_type as libc::c_int == libc::F_UNLCK {
        return FileLock {
            typ: libc::F_UNLCK as u32,
            ..Default::default()
        };
    }
    let start = fl.l_start.max(0) as u64;
    let end = if fl.l_len <= 0 {
        i64::MAX as u64
    } else {
        start.saturating_add(fl.l_len as u64 - 1)
    };
    FileLock {
        start,
        end,
        typ: fl.l_type as u32,
        // OFD lock holders have no pid (-1).
        pid: u32::try_from(fl.l_pid).unwrap_or(0),
    }
}

impl PassthroughFs {
    /// Host open flags for guest `flags` (see [`PASSED_FLAGS`]).
    fn host_flags(&self, flags: u32) -> io::Result<libc::c_int> {
        let mut f = flags as libc::c_int & PASSED_FLAGS;
        if f & libc::O_ACCMODE == libc::O_ACCMODE {
            return Err(err(libc::EINVAL));
        }
        if !self.cfg.allow_direct_io {
            f &= !libc::O_DIRECT;
        }
        if !self.cfg.preserve_noatime {
            f &= !libc::O_NOATIME;
        }
        if self.negotiated.writeback.load(Ordering::Relaxed) {
            // The guest page cache may need to read back what it writes, and it computes
            // append offsets itself.
            if f & libc::O_ACCMODE == libc::O_WRONLY {
                f = (f & !libc::O_ACCMODE) | libc::O_RDWR;
            }
            f &= !libc::O_APPEND;
        }
        let writes = f & libc::O_ACCMODE != libc::O_RDONLY || f & libc::O_TRUNC != 0;
        if writes && self.cfg.readonly {
            return Err(err(libc::EROFS));
        }
        Ok(f)
    }

    pub(super) fn do_open(
        &self,
        inode: Inode,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Handle, OpenFlags)> {
        let data = self.inode(inode)?;
        match data.kind {
            libc::S_IFREG => {}
            libc::S_IFDIR => return Err(err(libc::EISDIR)),
            libc::S_IFLNK => return Err(err(libc::ELOOP)),
            _ => return Err(err(libc::EPERM)),
        }
        let hflags = self.host_flags(flags)?;
        let fd = self.reopen(&data, hflags)?;
        if hflags & libc::O_TRUNC != 0
            && fuse_flags & OPEN_KILL_SUIDGID != 0
            && self.negotiated.killpriv_v2.load(Ordering::Relaxed)
        {
            self.kill_suidgid(fd.as_fd())?;
        }
        let fh = self.handles.insert(HandleData::file(inode, fd, hflags));
        Ok((fh, self.file_open_flags(inode, hflags)))
    }

    /// Registers a freshly created (and opened) file: its inode and a handle.
    fn finish_create(
        &self,
        fd: OwnedFd,
        hflags: libc::c_int,
        parent_mnt: u64,
    ) -> io::Result<(Entry, Handle, OpenFlags)> {
        let path_fd = self.path_fd_of(fd.as_fd())?;
        let entry = self.register(path_fd, parent_mnt)?;
        let fh = self
            .handles
            .insert(HandleData::file(entry.inode, fd, hflags));
        Ok((entry, fh, self.file_open_flags(entry.inode, hflags)))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn do_create(
        &self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> io::Result<(Entry, Handle, OpenFlags)> {
        self.check_writable()?;
        check_name(name)?;
        let p = self.dir_inode(parent)?;
        let hflags = self.host_flags(flags)?;
        let (mode, umask_guard) = self.create_mode(mode, umask)?;
        // Always exclusive and never through a symlink: an existing name is opened only
        // below, after checking that it is a regular file (never a device or fifo).
        // Before switching credentials: opening a file handle needs CAP_DAC_READ_SEARCH.
        let pfd = p.fd()?;
        let created = {
            let _creds = self.creds.switch_to(&self.host_ctx(ctx)?)?;
            sys::openat(
                pfd.as_fd(),
                name,
                hflags | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                mode,
            )
        };
        drop(umask_guard);
        let fd = match created {
            Ok(fd) => fd,
            Err(e)
                if e.raw_os_error() == Some(libc::EEXIST) && flags as i32 & libc::O_EXCL == 0 =>
            {
                let entry = self.do_lookup(&p, name)?;
                let opened = self.inode(entry.inode).and_then(|data| match data.kind {
                    libc::S_IFREG => self.reopen(&data, hflags),
                    libc::S_IFDIR => Err(err(libc::EISDIR)),
                    libc::S_IFLNK => Err(err(libc::ELOOP)),
                    _ => Err(err(libc::EPERM)),
                });
                let fd = match opened {
                    Ok(fd) => fd,
                    Err(e) => {
                        self.forget_inode(entry.inode, 1);
                        return Err(e);
                    }
                };
                let fh = self
                    .handles
                    .insert(HandleData::file(entry.inode, fd, hflags));
                return Ok((entry, fh, self.file_open_flags(entry.inode, hflags)));
            }
            Err(e) => return Err(e),
        };
        self.finish_create(fd, hflags, p.key.mnt)
    }

    pub(super) fn do_tmpfile(
        &self,
        ctx: &Context,
        parent: Inode,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> io::Result<(Entry, Handle, OpenFlags)> {
        self.check_writable()?;
        let p = self.dir_inode(parent)?;
        let hflags = self.host_flags(flags)?;
        let (mode, umask_guard) = self.create_mode(mode, umask)?;
        // Before switching credentials: opening a file handle needs CAP_DAC_READ_SEARCH.
        let pfd = p.fd()?;
        let fd = {
            let _creds = self.creds.switch_to(&self.host_ctx(ctx)?)?;
            sys::openat(pfd.as_fd(), c".", hflags | libc::O_TMPFILE, mode)?
        };
        drop(umask_guard);
        self.finish_create(fd, hflags, p.key.mnt)
    }

    pub(super) fn do_read(
        &self,
        inode: Inode,
        handle: Handle,
        w: &mut Writer,
        size: u32,
        offset: u64,
    ) -> io::Result<usize> {
        let h = self.handles.get_file(inode, handle)?;
        transfer(size, offset, "read", |left, off| {
            w.read_from_fd(h.fd.as_raw_fd(), left, Some(off))
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn do_write(
        &self,
        inode: Inode,
        handle: Handle,
        r: &mut Reader,
        size: u32,
        offset: u64,
        kill_priv: bool,
    ) -> io::Result<usize> {
        self.check_writable()?;
        let h = self.handles.get_file(inode, handle)?;
        // Honoured whether or not FUSE_HANDLE_KILLPRIV_V2 is negotiated: the guest kernel
        // sets the flag on every direct write (`--cache=never`, O_DIRECT) by a caller without
        // CAP_FSETID and clears nothing itself on that path, and our writes run with
        // CAP_FSETID, so the host kernel would keep the bits. A local file system clears
        // them (fstests generic/355).
        if kill_priv {
            self.kill_suidgid(h.fd())?;
        }
        transfer(size, offset, "write", |left, off| {
            r.write_to_fd(h.fd.as_raw_fd(), left, Some(off))
        })
    }

    pub(super) fn do_release(
        &self,
        inode: Inode,
        handle: Handle,
        flock_release: bool,
    ) -> io::Result<()> {
        let h = self.handles.remove(inode, handle, false)?;
        if flock_release {
            // The descriptor may be shared with an in-flight request: unlock explicitly.
            if let Err(e) = sys::flock(h.fd(), libc::LOCK_UN) {
                log::debug!("RELEASE flock unlock: {e}");
            }
        }
        for fd in h.take_all_owners() {
            unlock_all(&fd);
        }
        Ok(())
    }

    /// Like `close(2)` on a duplicate: flushes what the host file system flushes on close,
    /// and drops the POSIX locks of the closing lock owner (only that owner's).
    pub(super) fn do_flush(
        &self,
        inode: Inode,
        handle: Handle,
        owner: LockOwner,
    ) -> io::Result<()> {
        let h = self.handles.get_file(inode, handle)?;
        drop(sys::dup(h.fd())?);
        if let Some(fd) = h.take_owner(owner) {
            unlock_all(&fd);
            if let Some(k) = self.handles.keeper() {
                k.release(crate::protocol::keeper::Kept::Owner(
                    handle.raw(),
                    owner.raw(),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn do_fsync(
        &self,
        inode: Inode,
        datasync: bool,
        handle: Handle,
        dir: bool,
    ) -> io::Result<()> {
        let h = if dir {
            self.handles.get_dir(inode, handle)?
        } else {
            self.handles.get_file(inode, handle)?
        };
        sys::fsync(h.fd(), datasync)
    }

    /// The host descriptor POSIX locks of `owner` on handle `h` live on: its own open file
    /// description, reopened with the handle's access mode.
    fn owner_fd(
        &self,
        h: &HandleData,
        handle: Handle,
        owner: LockOwner,
    ) -> io::Result<Arc<OwnedFd>> {
        if let Some(fd) = h.existing_owner_fd(owner) {
            return Ok(fd);
        }
        let fd = self.new_owner_fd(h, owner)?;
        if let Some(k) = self.handles.keeper() {
            // Before the lock is taken on it: a crash keeps the lock with the descriptor.
            k.keep(
                crate::protocol::keeper::Kept::Owner(handle.raw(), owner.raw()),
                &[],
                Some(fd.as_fd()),
            );
        }
        Ok(fd)
    }

    fn new_owner_fd(&self, h: &HandleData, owner: LockOwner) -> io::Result<Arc<OwnedFd>> {
        h.owner_fd(owner, || {
            let acc = match h.access() {
                Some((true, true)) => libc::O_RDWR,
                Some((false, true)) => libc::O_WRONLY,
                _ => libc::O_RDONLY,
            };
            sys::openat(
                self.proc_self_fd.as_fd(),
                &super::fd_name(h.fd()),
                acc | libc::O_CLOEXEC,
                0,
            )
        })
    }

    pub(super) fn do_getlk(
        &self,
        inode: Inode,
        handle: Handle,
        owner: LockOwner,
        lock: FileLock,
    ) -> io::Result<FileLock> {
        if !self.cfg.posix_lock {
            return Err(err(libc::ENOSYS));
        }
        let h = self.handles.get_file(inode, handle)?;
        let mut fl = to_flock(&lock)?;
        // The owner's own locks never conflict with it; an owner without a descriptor
        // holds nothing, and the handle's descriptor carries no POSIX lock.
        match h.existing_owner_fd(owner) {
            Some(fd) => sys::fcntl_lock(fd.as_fd(), libc::F_OFD_GETLK, &mut fl)?,
            None => sys::fcntl_lock(h.fd(), libc::F_OFD_GETLK, &mut fl)?,
        }
        let mut out = from_flock(&fl);
        if fl.l_type != libc::F_UNLCK as libc::c_short && fl.l_pid <= 0 {
            // An OFD lock has no pid: report the guest process that took it.
            out.pid = self.handles.lock_holder(inode, owner).unwrap_or(0);
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn do_setlk(
        &self,
        inode: Inode,
        handle: Handle,
        owner: LockOwner,
        lock: FileLock,
        flock: bool,
        sleep: bool,
    ) -> io::Result<()> {
        if (flock && !self.cfg.flock) || (!flock && !self.cfg.posix_lock) {
            return Err(err(libc::ENOSYS));
        }
        let h = self.handles.get_file(inode, handle)?;
        // A blocking lock is taken by polling, never by a blocking call: a worker stuck in
        // F_OFD_SETLKW would hold its queue across a device reset (the rebooted guest's
        // queue would be dead until some other process let go of the lock). The wait ends
        // when the handle goes away (RELEASE, DESTROY, device reset).
        let flock_op = if flock {
            Some(match lock.typ as libc::c_int {
                libc::F_RDLCK => libc::LOCK_SH,
                libc::F_WRLCK => libc::LOCK_EX,
                libc::F_UNLCK => libc::LOCK_UN,
                _ => return Err(err(libc::EINVAL)),
            })
        } else {
            None
        };
        let posix = if flock { None } else { Some(to_flock(&lock)?) };
        let owner_fd = match posix {
            // Unlocking as an owner that never locked: nothing to do.
            Some(fl) if fl.l_type == libc::F_UNLCK as libc::c_short => {
                match h.existing_owner_fd(owner) {
                    Some(fd) => Some(fd),
                    None => return Ok(()),
                }
            }
            Some(_) => Some(self.owner_fd(&h, handle, owner)?),
            None => None,
        };
        let try_once = || match (flock_op, posix, &owner_fd) {
            // flock locks belong to the open file (the handle), as on a host.
            (Some(op), _, _) => sys::flock(h.fd(), op | libc::LOCK_NB),
            (None, Some(mut fl), Some(fd)) => {
                sys::fcntl_lock(fd.as_fd(), libc::F_OFD_SETLK, &mut fl)
            }
            _ => Err(err(libc::EINVAL)),
        };
        let mut pause = Duration::from_millis(1);
        let generation = self.wait_generation.load(Ordering::SeqCst);
        loop {
            match try_once() {
                Ok(()) => break,
                Err(e)
                    if sleep && matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) =>
                {
                    nap(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                    if self.wait_generation.load(Ordering::SeqCst) != generation {
                        return Err(err(libc::EINTR));
                    }
                    match self.handles.get_file(inode, handle) {
                        Ok(now) if Arc::ptr_eq(&now, &h) => {}
                        _ => return Err(err(libc::EINTR)),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if !flock && lock.typ != libc::F_UNLCK as u32 {
            h.note_lock(owner, lock.pid);
        }
        Ok(())
    }

    pub(super) fn do_lseek(
        &self,
        inode: Inode,
        handle: Handle,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        let h = self.handles.get_file(inode, handle)?;
        // SEEK_CUR: the file position is the guest's, the handle's own means nothing to it.
        let whence = match libc::c_int::try_from(whence) {
            Ok(w @ (libc::SEEK_SET | libc::SEEK_END | libc::SEEK_DATA | libc::SEEK_HOLE)) => w,
            _ => return Err(err(libc::EINVAL)),
        };
        // The offset is the guest's signed loff_t in two's complement: the host answers a
        // negative one as lseek(2) says (EINVAL for SEEK_SET, ENXIO for SEEK_DATA/SEEK_HOLE,
        // a position before the end for SEEK_END).
        sys::lseek(h.fd(), offset as i64, whence)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn do_copy_file_range(
        &self,
        inode_in: Inode,
        handle_in: Handle,
        off_in: u64,
        inode_out: Inode,
        handle_out: Handle,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> io::Result<usize> {
        self.check_writable()?;
        let hin = self.handles.get_file(inode_in, handle_in)?;
        let hout = self.handles.get_file(inode_out, handle_out)?;
        let flags = libc::c_uint::try_from(flags).map_err(|_| err(libc::EINVAL))?;
        let len = usize::try_from(len).map_err(|_| err(libc::EINVAL))?;
        sys::copy_file_range(hin.fd(), off_in, hout.fd(), off_out, len, flags)
    }

    /// SETUPMAPPING: maps a file range into the DAX window through the inode's kept
    /// read-write descriptor ([`Self::dax_fd`]); a handle, when the guest names one, is only
    /// checked.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn do_setupmapping(
        &self,
        inode: Inode,
        handle: Handle,
        foffset: u64,
        len: u64,
        moffset: u64,
        writable: bool,
        mapper: &dyn Mapper,
    ) -> io::Result<()> {
        if writable && self.cfg.readonly {
            return Err(err(libc::EACCES));
        }
        // Linux's DAX code sends no handle (fh = -1). A handle, when given, must belong to
        // the inode and allow the access asked for.
        if handle != NO_HANDLE {
            let h = self.handles.get_file(inode, handle)?;
            let Some((_, h_writable)) = h.access() else {
                return Err(err(libc::EBADF));
            };
            if writable && !h_writable {
                return Err(err(libc::EACCES));
            }
        }
        // QEMU 11.1 maps every range shared and writable (the read-only flag only tells the
        // guest), so it needs a read-write descriptor even for a read-only mapping; one that
        // cannot be opened so (a read-only host filesystem) is tried read-only.
        let data = self.inode(inode)?;
        // Only regular files are mapped (as only they are opened for I/O): a directory
        // would reopen read-only and reach the frontend as a descriptor it cannot map.
        match data.kind {
            libc::S_IFREG => {}
            libc::S_IFDIR => return Err(err(libc::EISDIR)),
            libc::S_IFLNK => return Err(err(libc::ELOOP)),
            _ => return Err(err(libc::EPERM)),
        }
        let fd = self.dax_fd(&data, writable)?;
        mapper.map(&crate::protocol::mapper::MapRequest {
            owner: inode.raw(),
            moffset,
            len,
            fd: fd.as_fd(),
            foffset,
            writable,
        })
    }

    /// The descriptor SETUPMAPPING maps through: read-write, read-only where the file cannot
    /// be opened so (a read-only share or host file system) and the mapping is read-only.
    ///
    /// The read-write one is opened once per inode and kept while the guest holds the inode:
    /// every open of a file is an event for the DAX host watch of every other daemon mapping
    /// it (an open may be `O_TRUNC`, so each moves that daemon's mappings of the file to
    /// shadows), and a guest reads a file through many SETUPMAPPINGs. Not kept for files with
    /// an execute bit: a writable descriptor would stop the host from running them (ETXTBSY).
    fn dax_fd(&self, data: &InodeData, writable: bool) -> io::Result<Arc<OwnedFd>> {
        if self.cfg.readonly {
            return self.reopen(data, libc::O_RDONLY).map(Arc::new);
        }
        // Held across the open: two SETUPMAPPINGs of one inode open it once, so every other
        // daemon mapping the file sees one open event (each moves its mappings), not two.
        // Only this function takes the lock.
        let mut kept = data.dax_fd.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(fd) = kept.as_ref() {
            return Ok(fd.clone());
        }
        let fd = match self.reopen(data, libc::O_RDWR) {
            Ok(fd) => Arc::new(fd),
            Err(_) if !writable => return self.reopen(data, libc::O_RDONLY).map(Arc::new),
            Err(e) => return Err(e),
        };
        if sys::fstat(fd.as_fd()).is_ok_and(|st| st.st_mode & 0o111 == 0) {
            *kept = Some(fd.clone());
        }
        Ok(fd)
    }
}

/// `fuse_setupmapping_in.fh` when the client names no handle.
const NO_HANDLE: Handle = Handle::from_raw(u64::MAX);

/// Moves `size` bytes at `offset` with `step(bytes_left, file_offset)` until done, end of
/// file (`Ok(0)`) or an error; an error after some progress ends it short, as a syscall would.
fn transfer(
    size: u32,
    offset: u64,
    what: &str,
    mut step: impl FnMut(usize, u64) -> io::Result<usize>,
) -> io::Result<usize> {
    let size = size as usize;
    let mut done = 0;
    while done < size {
        let off = offset
            .checked_add(done as u64)
            .ok_or_else(|| err(libc::EINVAL))?;
        match step(size - done, off) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if done > 0 => {
                log::debug!("short {what} after {done} bytes: {e}");
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
