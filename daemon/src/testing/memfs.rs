//! A small in-memory filesystem: the fuzz targets' and server tests' filesystem when the
//! host must stay out of the picture. Files are byte vectors, directories are name maps,
//! DAX mappings go to the mapper with a memfd standing in for the file.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::Mutex;
use std::time::Duration;

use crate::protocol::abi::fattr;
use crate::protocol::abi::{Attr, Kstatfs, SetattrIn, ROOT_ID};
use crate::protocol::filesystem::{
    AddEntry, Context, DirEntry, Entry, FileSystem, Handle, InitCaps, Inode, LockOwner, OpenFlags,
};
use crate::protocol::iobuf::{Reader, Writer};
use crate::protocol::mapper::Mapper;

/// Largest file the in-memory filesystem holds (keeps fuzzing within memory).
pub const MAX_FILE_SIZE: u64 = 16 << 20;
/// Most inodes it holds.
pub const MAX_INODES: usize = 4096;

enum Kind {
    File(Vec<u8>),
    Dir(BTreeMap<CString, Inode>),
    Symlink(Vec<u8>),
    Special,
}

struct Node {
    kind: Kind,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    lookups: u64,
    rdev: u32,
}

struct State {
    nodes: HashMap<Inode, Node>,
    next: Inode,
}

/// The in-memory filesystem.
pub struct MemFs {
    state: Mutex<State>,
    backing: File,
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

fn dt_of(mode: u32) -> u32 {
    (mode & libc::S_IFMT) >> 12
}

impl MemFs {
    pub fn new() -> io::Result<Self> {
        let mut nodes = HashMap::new();
        nodes.insert(
            Inode::ROOT,
            Node {
                kind: Kind::Dir(BTreeMap::new()),
                mode: libc::S_IFDIR | 0o755,
                uid: 0,
                gid: 0,
                nlink: 2,
                lookups: 1,
                rdev: 0,
            },
        );
        // A memfd stands in for file contents when a DAX mapping is asked for.
        let name = c"memfs-dax";
        // SAFETY: `name` is a valid NUL-terminated string; the call has no other inputs.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created by memfd_create and is owned by nobody else.
        let backing = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(MemFs {
            state: Mutex::new(State {
                nodes,
                next: Inode::from_raw(ROOT_ID + 1),
            }),
            backing,
        })
    }

    fn lock(&self) -> io::Result<std::sync::MutexGuard<'_, State>> {
        self.state.lock().map_err(|_| errno(libc::EIO))
    }
}

impl State {
    fn node(&self, ino: Inode) -> io::Result<&Node> {
        self.nodes.get(&ino).ok_or_else(|| errno(libc::ENOENT))
    }

    fn node_mut(&mut self, ino: Inode) -> io::Result<&mut Node> {
        self.nodes.get_mut(&ino).ok_or_else(|| errno(libc::ENOENT))
    }

    fn dir(&self, ino: Inode) -> io::Result<&BTreeMap<CString, Inode>> {
        match &self.node(ino)?.kind {
            Kind::Dir(d) => Ok(d),
            _ => Err(errno(libc::ENOTDIR)),
        }
    }

    fn dir_mut(&mut self, ino: Inode) -> io::Result<&mut BTreeMap<CString, Inode>> {
        match &mut self.node_mut(ino)?.kind {
            Kind::Dir(d) => Ok(d),
            _ => Err(errno(libc::ENOTDIR)),
        }
    }

    fn attr(&self, ino: Inode) -> io::Result<Attr> {
        let n = self.node(ino)?;
        let size = match &n.kind {
            Kind::File(d) | Kind::Symlink(d) => d.len() as u64,
            Kind::Dir(d) => d.len() as u64,
            Kind::Special => 0,
        };
        Ok(Attr {
            ino: ino.raw(),
            size,
            blocks: size.div_ceil(512),
            mode: n.mode,
            nlink: n.nlink,
            uid: n.uid,
            gid: n.gid,
            rdev: n.rdev,
            blksize: 4096,
            ..Default::default()
        })
    }

    fn entry(&mut self, ino: Inode) -> io::Result<Entry> {
        self.node_mut(ino)?.lookups += 1;
        Ok(Entry {
            inode: ino,
            generation: 0,
            attr: self.attr(ino)?,
            attr_timeout: Duration::ZERO,
            entry_timeout: Duration::ZERO,
        })
    }

    fn add(
        &mut self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        kind: Kind,
        mode: u32,
        rdev: u32,
    ) -> io::Result<Entry> {
        if self.nodes.len() >= MAX_INODES {
            return Err(errno(libc::ENOSPC));
        }
        if self.dir(parent)?.contains_key(name) {
            return Err(errno(libc::EEXIST));
        }
        let ino = self.next;
        self.next = Inode::from_raw(ino.raw() + 1);
        let is_dir = matches!(kind, Kind::Dir(_));
        self.nodes.insert(
            ino,
            Node {
                kind,
                mode,
                uid: ctx.uid,
                gid: ctx.gid,
                nlink: if is_dir { 2 } else { 1 },
                lookups: 0,
                rdev,
            },
        );
        self.dir_mut(parent)?.insert(name.to_owned(), ino);
        if is_dir {
            self.node_mut(parent)?.nlink += 1;
        }
        self.entry(ino)
    }

    fn drop_if_unused(&mut self, ino: Inode) {
        if ino == Inode::ROOT {
            return;
        }
        if self
            .nodes
            .get(&ino)
            .is_some_and(|n| n.nlink == 0 && n.lookups == 0)
        {
            self.nodes.remove(&ino);
        }
    }

    fn remove(&mut self, parent: Inode, name: &CStr, want_dir: bool) -> io::Result<()> {
        let ino = *self
            .dir(parent)?
            .get(name)
            .ok_or_else(|| errno(libc::ENOENT))?;
        match (&self.node(ino)?.kind, want_dir) {
            (Kind::Dir(d), true) if !d.is_empty() => return Err(errno(libc::ENOTEMPTY)),
            (Kind::Dir(_), true) => {}
            (Kind::Dir(_), false) => return Err(errno(libc::EISDIR)),
            (_, true) => return Err(errno(libc::ENOTDIR)),
            (_, false) => {}
        }
        self.dir_mut(parent)?.remove(name);
        let n = self.node_mut(ino)?;
        n.nlink = if want_dir {
            0
        } else {
            n.nlink.saturating_sub(1)
        };
        if want_dir {
            let p = self.node_mut(parent)?;
            p.nlink = p.nlink.saturating_sub(1);
        }
        self.drop_if_unused(ino);
        Ok(())
    }
}

impl FileSystem for MemFs {
    fn init(&self, _caps: InitCaps) -> io::Result<u64> {
        Ok(0)
    }

    fn destroy(&self) {
        if let Ok(mut s) = self.lock() {
            for n in s.nodes.values_mut() {
                n.lookups = 0;
            }
            let dead: Vec<Inode> = s
                .nodes
                .iter()
                .filter(|(_, n)| n.nlink == 0)
                .map(|(i, _)| *i)
                .collect();
            for i in dead {
                s.drop_if_unused(i);
            }
        }
    }

    fn lookup(&self, _ctx: &Context, parent: Inode, name: &CStr) -> io::Result<Entry> {
        let mut s = self.lock()?;
        let ino = match name.to_bytes() {
            b"." => parent,
            b".." => Inode::ROOT,
            _ => *s
                .dir(parent)?
                .get(name)
                .ok_or_else(|| errno(libc::ENOENT))?,
        };
        s.dir(parent)?;
        s.entry(ino)
    }

    fn forget(&self, _ctx: &Context, inode: Inode, count: u64) {
        if let Ok(mut s) = self.lock() {
            if let Some(n) = s.nodes.get_mut(&inode) {
                n.lookups = n.lookups.saturating_sub(count);
            }
            s.drop_if_unused(inode);
        }
    }

    fn getattr(
        &self,
        _ctx: &Context,
        inode: Inode,
        _h: Option<Handle>,
    ) -> io::Result<(Attr, Duration)> {
        Ok((self.lock()?.attr(inode)?, Duration::ZERO))
    }

    fn setattr(
        &self,
        _ctx: &Context,
        inode: Inode,
        a: &SetattrIn,
        _h: Option<Handle>,
    ) -> io::Result<(Attr, Duration)> {
        let mut s = self.lock()?;
        let n = s.node_mut(inode)?;
        if a.valid & fattr::MODE != 0 {
            n.mode = (n.mode & libc::S_IFMT) | (a.mode & 0o7777);
        }
        if a.valid & fattr::UID != 0 {
            n.uid = a.uid;
        }
        if a.valid & fattr::GID != 0 {
            n.gid = a.gid;
        }
        if a.valid & fattr::SIZE != 0 {
            match &mut n.kind {
                Kind::File(d) if a.size <= MAX_FILE_SIZE => d.resize(a.size as usize, 0),
                Kind::File(_) => return Err(errno(libc::EFBIG)),
                Kind::Dir(_) => return Err(errno(libc::EISDIR)),
                _ => return Err(errno(libc::EINVAL)),
            }
        }
        Ok((s.attr(inode)?, Duration::ZERO))
    }

    fn readlink(&self, _ctx: &Context, inode: Inode) -> io::Result<Vec<u8>> {
        match &self.lock()?.node(inode)?.kind {
            Kind::Symlink(t) => Ok(t.clone()),
            _ => Err(errno(libc::EINVAL)),
        }
    }

    fn symlink(
        &self,
        ctx: &Context,
        target: &CStr,
        parent: Inode,
        name: &CStr,
    ) -> io::Result<Entry> {
        let kind = Kind::Symlink(target.to_bytes().to_vec());
        self.lock()?
            .add(ctx, parent, name, kind, libc::S_IFLNK | 0o777, 0)
    }

    fn mknod(
        &self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        rdev: u32,
        _umask: u32,
    ) -> io::Result<Entry> {
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File(Vec::new()),
            libc::S_IFDIR => return Err(errno(libc::EINVAL)),
            _ => Kind::Special,
        };
        self.lock()?.add(ctx, parent, name, kind, mode, rdev)
    }

    fn mkdir(
        &self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        _umask: u32,
    ) -> io::Result<Entry> {
        let kind = Kind::Dir(BTreeMap::new());
        self.lock()?
            .add(ctx, parent, name, kind, libc::S_IFDIR | (mode & 0o7777), 0)
    }

    fn unlink(&self, _ctx: &Context, parent: Inode, name: &CStr) -> io::Result<()> {
        self.lock()?.remove(parent, name, false)
    }

    fn rmdir(&self, _ctx: &Context, parent: Inode, name: &CStr) -> io::Result<()> {
        self.lock()?.remove(parent, name, true)
    }

    fn rename(
        &self,
        _ctx: &Context,
        olddir: Inode,
        oldname: &CStr,
        newdir: Inode,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        if flags != 0 {
            return Err(errno(libc::EINVAL));
        }
        let mut s = self.lock()?;
        let ino = *s
            .dir(olddir)?
            .get(oldname)
            .ok_or_else(|| errno(libc::ENOENT))?;
        s.dir(newdir)?;
        if matches!(s.node(ino)?.kind, Kind::Dir(_)) {
            // Refuse to move a directory below itself (that would detach a cycle).
            if ino == newdir {
                return Err(errno(libc::EINVAL));
            }
        }
        if let Some(&old) = s.dir(newdir)?.get(newname) {
            if old == ino {
                return Ok(());
            }
            let is_dir = matches!(s.node(old)?.kind, Kind::Dir(_));
            s.remove(newdir, newname, is_dir)?;
        }
        s.dir_mut(olddir)?.remove(oldname);
        s.dir_mut(newdir)?.insert(newname.to_owned(), ino);
        Ok(())
    }

    fn link(
        &self,
        _ctx: &Context,
        inode: Inode,
        newparent: Inode,
        newname: &CStr,
    ) -> io::Result<Entry> {
        let mut s = self.lock()?;
        if matches!(s.node(inode)?.kind, Kind::Dir(_)) {
            return Err(errno(libc::EPERM));
        }
        if s.dir(newparent)?.contains_key(newname) {
            return Err(errno(libc::EEXIST));
        }
        s.dir_mut(newparent)?.insert(newname.to_owned(), inode);
        s.node_mut(inode)?.nlink += 1;
        s.entry(inode)
    }

    fn open(
        &self,
        _ctx: &Context,
        inode: Inode,
        _flags: u32,
        _ff: u32,
    ) -> io::Result<(Handle, OpenFlags)> {
        match self.lock()?.node(inode)?.kind {
            // The inode number serves as the handle.
            Kind::File(_) => Ok((Handle::from_raw(inode.raw()), 0)),
            Kind::Dir(_) => Err(errno(libc::EISDIR)),
            _ => Err(errno(libc::ENXIO)),
        }
    }

    fn create(
        &self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        _flags: u32,
        _umask: u32,
        _ff: u32,
    ) -> io::Result<(Entry, Handle, OpenFlags)> {
        let e = self.lock()?.add(
            ctx,
            parent,
            name,
            Kind::File(Vec::new()),
            libc::S_IFREG | (mode & 0o7777),
            0,
        )?;
        Ok((e, Handle::from_raw(e.inode.raw()), 0))
    }

    fn read(
        &self,
        _ctx: &Context,
        inode: Inode,
        _h: Handle,
        w: &mut Writer,
        size: u32,
        offset: u64,
    ) -> io::Result<usize> {
        let s = self.lock()?;
        let Kind::File(d) = &s.node(inode)?.kind else {
            return Err(errno(libc::EISDIR));
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(d.len());
        let end = start.saturating_add(size as usize).min(d.len());
        w.write_all(&d[start..end])?;
        Ok(end - start)
    }

    fn write(
        &self,
        _ctx: &Context,
        inode: Inode,
        _h: Handle,
        r: &mut Reader,
        size: u32,
        offset: u64,
        _kill: bool,
    ) -> io::Result<usize> {
        let end = offset
            .checked_add(u64::from(size))
            .ok_or_else(|| errno(libc::EFBIG))?;
        if end > MAX_FILE_SIZE {
            return Err(errno(libc::EFBIG));
        }
        let data = r.read_vec(size as usize)?;
        let mut s = self.lock()?;
        let Kind::File(d) = &mut s.node_mut(inode)?.kind else {
            return Err(errno(libc::EISDIR));
        };
        if d.len() < end as usize {
            d.resize(end as usize, 0);
        }
        d[offset as usize..end as usize].copy_from_slice(&data);
        Ok(data.len())
    }

    fn statfs(&self, _ctx: &Context, _inode: Inode) -> io::Result<Kstatfs> {
        let s = self.lock()?;
        Ok(Kstatfs {
            files: MAX_INODES as u64,
            ffree: (MAX_INODES - s.nodes.len()) as u64,
            bsize: 4096,
            namelen: 255,
            frsize: 4096,
            ..Default::default()
        })
    }

    fn release(
        &self,
        _ctx: &Context,
        _i: Inode,
        _h: Handle,
        _flock: bool,
        _owner: LockOwner,
    ) -> io::Result<()> {
        Ok(())
    }

    fn flush(&self, _ctx: &Context, _i: Inode, _h: Handle, _owner: LockOwner) -> io::Result<()> {
        Ok(())
    }

    fn fsync(&self, _ctx: &Context, _i: Inode, _d: bool, _h: Handle) -> io::Result<()> {
        Ok(())
    }

    fn opendir(
        &self,
        _ctx: &Context,
        inode: Inode,
        _flags: u32,
    ) -> io::Result<(Handle, OpenFlags)> {
        self.lock()?.dir(inode)?;
        Ok((Handle::from_raw(inode.raw()), 0))
    }

    fn readdir(
        &self,
        _ctx: &Context,
        inode: Inode,
        _h: Handle,
        offset: u64,
        plus: bool,
        add: &mut AddEntry,
    ) -> io::Result<()> {
        let mut s = self.lock()?;
        let names: Vec<(CString, Inode)> =
            s.dir(inode)?.iter().map(|(n, i)| (n.clone(), *i)).collect();
        for (idx, (name, ino)) in names
            .iter()
            .enumerate()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
        {
            let mode = s.node(*ino)?.mode;
            let entry = if plus { Some(s.entry(*ino)?) } else { None };
            let d = DirEntry {
                ino: ino.raw(),
                offset: idx as u64 + 1,
                typ: dt_of(mode),
                name: name.to_bytes(),
            };
            if !add(d, entry.as_ref())? {
                if plus {
                    if let Ok(n) = s.node_mut(*ino) {
                        n.lookups = n.lookups.saturating_sub(1);
                    }
                }
                break;
            }
        }
        Ok(())
    }

    fn releasedir(&self, _ctx: &Context, _i: Inode, _h: Handle) -> io::Result<()> {
        Ok(())
    }

    fn access(&self, _ctx: &Context, inode: Inode, _mask: u32) -> io::Result<()> {
        self.lock()?.node(inode).map(|_| ())
    }

    fn setupmapping(
        &self,
        _ctx: &Context,
        inode: Inode,
        _h: Handle,
        foffset: u64,
        len: u64,
        moffset: u64,
        writable: bool,
        mapper: &dyn Mapper,
    ) -> io::Result<()> {
        if !matches!(self.lock()?.node(inode)?.kind, Kind::File(_)) {
            return Err(errno(libc::EINVAL));
        }
        mapper.map(&crate::protocol::mapper::MapRequest {
            owner: inode.raw(),
            moffset,
            len,
            fd: self.backing.as_fd(),
            foffset,
            writable,
        })
    }
}
