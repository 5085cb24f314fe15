//! Tests of the [`FileSystem`] seam, and the probe the decorators' tests use: a filesystem
//! that records every call, and a caller of every method.

use std::sync::Mutex;

use vm_memory::VolatileSlice;

use super::*;
use crate::protocol::mapper::NoMapper;

/// The name of every trait method, in the trait's order.
pub(crate) const METHODS: &[&str] = &[
    "init",
    "destroy",
    "interrupt_waits",
    "flush_writes_back",
    "lookup",
    "forget",
    "batch_forget",
    "getattr",
    "statx_extra",
    "setattr",
    "readlink",
    "symlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "rename",
    "link",
    "open",
    "create",
    "tmpfile",
    "read",
    "write",
    "flush",
    "release",
    "fsync",
    "fallocate",
    "lseek",
    "copy_file_range",
    "statfs",
    "syncfs",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "opendir",
    "readdir",
    "releasedir",
    "fsyncdir",
    "getlk",
    "setlk",
    "access",
    "fileattr",
    "backing_fd",
    "setupmapping",
];

/// A filesystem that records the name of every method called, then does what the
/// trait's default does. It writes every method (`missing_trait_methods`), so a
/// decorator around it that leaves one to the trait's default is caught: the call
/// never reaches the probe.
#[derive(Default)]
pub(crate) struct Probe(pub(crate) Mutex<Vec<&'static str>>);

impl Probe {
    fn called(&self, name: &'static str) {
        self.0.lock().unwrap().push(name);
    }
}

#[deny(clippy::missing_trait_methods)]
#[allow(unused_variables)]
impl FileSystem for Probe {
    fn init(&self, caps: InitCaps) -> io::Result<u64> {
        self.called("init");
        Ok(0)
    }
    fn destroy(&self) {
        self.called("destroy");
    }
    fn interrupt_waits(&self) {
        self.called("interrupt_waits");
    }
    fn flush_writes_back(&self, inode: Inode) -> bool {
        self.called("flush_writes_back");
        true
    }
    fn lookup(&self, ctx: &Context, parent: Inode, name: &CStr) -> io::Result<Entry> {
        self.called("lookup");
        enosys()
    }
    fn forget(&self, ctx: &Context, inode: Inode, count: u64) {
        self.called("forget");
    }
    fn batch_forget(&self, ctx: &Context, requests: &[(Inode, u64)]) {
        self.called("batch_forget");
        for &(inode, count) in requests {
            self.forget(ctx, inode, count);
        }
    }
    fn getattr(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Option<Handle>,
    ) -> io::Result<(Attr, Duration)> {
        self.called("getattr");
        enosys()
    }
    fn statx_extra(&self, ctx: &Context, inode: Inode) -> io::Result<StatxExtra> {
        self.called("statx_extra");
        enosys()
    }
    fn setattr(
        &self,
        ctx: &Context,
        inode: Inode,
        attr: &SetattrIn,
        handle: Option<Handle>,
    ) -> io::Result<(Attr, Duration)> {
        self.called("setattr");
        enosys()
    }
    fn readlink(&self, ctx: &Context, inode: Inode) -> io::Result<Vec<u8>> {
        self.called("readlink");
        enosys()
    }
    fn symlink(
        &self,
        ctx: &Context,
        target: &CStr,
        parent: Inode,
        name: &CStr,
    ) -> io::Result<Entry> {
        self.called("symlink");
        enosys()
    }
    fn mknod(
        &self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        self.called("mknod");
        enosys()
    }
    fn mkdir(
        &self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        self.called("mkdir");
        enosys()
    }
    fn unlink(&self, ctx: &Context, parent: Inode, name: &CStr) -> io::Result<()> {
        self.called("unlink");
        enosys()
    }
    fn rmdir(&self, ctx: &Context, parent: Inode, name: &CStr) -> io::Result<()> {
        self.called("rmdir");
        enosys()
    }
    fn rename(
        &self,
        ctx: &Context,
        olddir: Inode,
        oldname: &CStr,
        newdir: Inode,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        self.called("rename");
        enosys()
    }
    fn link(
        &self,
        ctx: &Context,
        inode: Inode,
        newparent: Inode,
        newname: &CStr,
    ) -> io::Result<Entry> {
        self.called("link");
        enosys()
    }
    fn open(
        &self,
        ctx: &Context,
        inode: Inode,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Handle, OpenFlags)> {
        self.called("open");
        enosys()
    }
    fn create(
        &self,
        ctx: &Context,
        parent: Inode,
        name: &CStr,
        mode: u32,
        flags: u32,
        umask: u32,
        fuse_flags: u32,
    ) -> io::Result<(Entry, Handle, OpenFlags)> {
        self.called("create");
        enosys()
    }
    fn tmpfile(
        &self,
        ctx: &Context,
        parent: Inode,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> io::Result<(Entry, Handle, OpenFlags)> {
        self.called("tmpfile");
        enosys()
    }
    fn read(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        w: &mut Writer,
        size: u32,
        offset: u64,
    ) -> io::Result<usize> {
        self.called("read");
        enosys()
    }
    fn write(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        r: &mut Reader,
        size: u32,
        offset: u64,
        kill_priv: bool,
    ) -> io::Result<usize> {
        self.called("write");
        enosys()
    }
    fn flush(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        lock_owner: LockOwner,
    ) -> io::Result<()> {
        self.called("flush");
        enosys()
    }
    fn release(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        flock_release: bool,
        lock_owner: LockOwner,
    ) -> io::Result<()> {
        self.called("release");
        enosys()
    }
    fn fsync(&self, ctx: &Context, inode: Inode, datasync: bool, handle: Handle) -> io::Result<()> {
        self.called("fsync");
        enosys()
    }
    fn fallocate(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> io::Result<()> {
        self.called("fallocate");
        enosys()
    }
    fn lseek(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        self.called("lseek");
        enosys()
    }
    fn copy_file_range(
        &self,
        ctx: &Context,
        inode_in: Inode,
        handle_in: Handle,
        off_in: u64,
        inode_out: Inode,
        handle_out: Handle,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> io::Result<usize> {
        self.called("copy_file_range");
        enosys()
    }
    fn statfs(&self, ctx: &Context, inode: Inode) -> io::Result<Kstatfs> {
        self.called("statfs");
        enosys()
    }
    fn syncfs(&self, ctx: &Context, inode: Inode) -> io::Result<()> {
        self.called("syncfs");
        enosys()
    }
    fn setxattr(
        &self,
        ctx: &Context,
        inode: Inode,
        name: &CStr,
        value: &[u8],
        flags: u32,
        setxattr_flags: u32,
    ) -> io::Result<()> {
        self.called("setxattr");
        enosys()
    }
    fn getxattr(
        &self,
        ctx: &Context,
        inode: Inode,
        name: &CStr,
        size: u32,
    ) -> io::Result<XattrReply> {
        self.called("getxattr");
        enosys()
    }
    fn listxattr(&self, ctx: &Context, inode: Inode, size: u32) -> io::Result<XattrReply> {
        self.called("listxattr");
        enosys()
    }
    fn removexattr(&self, ctx: &Context, inode: Inode, name: &CStr) -> io::Result<()> {
        self.called("removexattr");
        enosys()
    }
    fn opendir(&self, ctx: &Context, inode: Inode, flags: u32) -> io::Result<(Handle, OpenFlags)> {
        self.called("opendir");
        enosys()
    }
    fn readdir(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        offset: u64,
        plus: bool,
        add: &mut AddEntry,
    ) -> io::Result<()> {
        self.called("readdir");
        enosys()
    }
    fn releasedir(&self, ctx: &Context, inode: Inode, handle: Handle) -> io::Result<()> {
        self.called("releasedir");
        enosys()
    }
    fn fsyncdir(
        &self,
        ctx: &Context,
        inode: Inode,
        datasync: bool,
        handle: Handle,
    ) -> io::Result<()> {
        self.called("fsyncdir");
        enosys()
    }
    fn getlk(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        owner: LockOwner,
        lock: FileLock,
    ) -> io::Result<FileLock> {
        self.called("getlk");
        enosys()
    }
    fn setlk(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        owner: LockOwner,
        lock: FileLock,
        flock: bool,
        sleep: bool,
    ) -> io::Result<()> {
        self.called("setlk");
        enosys()
    }
    fn access(&self, ctx: &Context, inode: Inode, mask: u32) -> io::Result<()> {
        self.called("access");
        enosys()
    }
    fn fileattr(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        request: crate::protocol::ioctl::FileAttrRequest,
    ) -> io::Result<crate::protocol::ioctl::FileAttrReply> {
        self.called("fileattr");
        Err(io::Error::from_raw_os_error(libc::ENOTTY))
    }
    fn backing_fd(&self, inode: Inode, handle: Handle) -> io::Result<Box<dyn AsFd + Send + Sync>> {
        self.called("backing_fd");
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }
    fn setupmapping(
        &self,
        ctx: &Context,
        inode: Inode,
        handle: Handle,
        foffset: u64,
        len: u64,
        moffset: u64,
        writable: bool,
        mapper: &dyn Mapper,
    ) -> io::Result<()> {
        self.called("setupmapping");
        enosys()
    }
}

/// Calls every method of `fs` once, in the trait's order.
pub(crate) fn call_every_method(fs: &dyn FileSystem) {
    let (ctx, name, lock) = (Context::default(), c"n", FileLock::default());
    let mut out = [0u8; 16];
    let mut w = Writer::new(vec![VolatileSlice::from(&mut out[..])]);
    let mut data = [0u8; 16];
    let mut r = Reader::new(vec![VolatileSlice::from(&mut data[..])]);
    let mut add = |_: DirEntry, _: Option<&Entry>| Ok(true);
    let (root, ino, fh, dh) = (
        Inode::ROOT,
        Inode::from_raw(2),
        Handle::from_raw(3),
        Handle::from_raw(6),
    );
    let owner = LockOwner::from_raw(7);
    let _ = fs.init(InitCaps::default());
    fs.destroy();
    fs.interrupt_waits();
    let _ = fs.flush_writes_back(root);
    let _ = fs.lookup(&ctx, root, name);
    fs.forget(&ctx, ino, 1);
    fs.batch_forget(&ctx, &[]);
    let _ = fs.getattr(&ctx, ino, None);
    let _ = fs.statx_extra(&ctx, ino);
    let _ = fs.setattr(&ctx, ino, &SetattrIn::default(), None);
    let _ = fs.readlink(&ctx, ino);
    let _ = fs.symlink(&ctx, c"t", root, name);
    let _ = fs.mknod(&ctx, root, name, 0o644, 0, 0);
    let _ = fs.mkdir(&ctx, root, name, 0o755, 0);
    let _ = fs.unlink(&ctx, root, name);
    let _ = fs.rmdir(&ctx, root, name);
    let _ = fs.rename(&ctx, root, name, root, c"m", 0);
    let _ = fs.link(&ctx, ino, root, c"m");
    let _ = fs.open(&ctx, ino, 0, 0);
    let _ = fs.create(&ctx, root, name, 0o644, 0, 0, 0);
    let _ = fs.tmpfile(&ctx, root, 0o644, 0, 0);
    let _ = fs.read(&ctx, ino, fh, &mut w, 16, 0);
    let _ = fs.write(&ctx, ino, fh, &mut r, 16, 0, false);
    let _ = fs.flush(&ctx, ino, fh, owner);
    let _ = fs.release(&ctx, ino, fh, false, owner);
    let _ = fs.fsync(&ctx, ino, false, fh);
    let _ = fs.fallocate(&ctx, ino, fh, 0, 0, 4096);
    let _ = fs.lseek(&ctx, ino, fh, 0, libc::SEEK_DATA as u32);
    let _ = fs.copy_file_range(
        &ctx,
        ino,
        fh,
        0,
        Inode::from_raw(4),
        Handle::from_raw(5),
        0,
        16,
        0,
    );
    let _ = fs.statfs(&ctx, root);
    let _ = fs.syncfs(&ctx, root);
    let _ = fs.setxattr(&ctx, ino, c"user.x", b"v", 0, 0);
    let _ = fs.getxattr(&ctx, ino, c"user.x", 0);
    let _ = fs.listxattr(&ctx, ino, 0);
    let _ = fs.removexattr(&ctx, ino, c"user.x");
    let _ = fs.opendir(&ctx, root, 0);
    let _ = fs.readdir(&ctx, root, dh, 0, true, &mut add);
    let _ = fs.releasedir(&ctx, root, dh);
    let _ = fs.fsyncdir(&ctx, root, true, dh);
    let _ = fs.getlk(&ctx, ino, fh, owner, lock);
    let _ = fs.setlk(&ctx, ino, fh, owner, lock, false, true);
    let _ = fs.access(&ctx, ino, libc::R_OK as u32);
    let _ = fs.fileattr(
        &ctx,
        ino,
        fh,
        crate::protocol::ioctl::FileAttrRequest::GetFlags,
    );
    let _ = fs.backing_fd(ino, fh);
    let _ = fs.setupmapping(&ctx, ino, fh, 0, 4096, 0, false, &NoMapper);
}

#[test]
fn the_list_holds_every_method_once() {
    let probe = Probe::default();
    call_every_method(&probe);
    assert_eq!(
        *probe.0.lock().unwrap(),
        METHODS,
        "call_every_method misses one"
    );
    let mut unique = METHODS.to_vec();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), METHODS.len());
    assert_eq!(METHODS.len(), 45);
}

/// A filesystem that writes only some methods answers the others with the trait's
/// defaults.
#[test]
fn unwritten_methods_keep_the_trait_defaults() {
    struct Lookups;
    impl FileSystem for Lookups {
        fn lookup(&self, _: &Context, parent: Inode, _: &CStr) -> io::Result<Entry> {
            let inode = Inode::from_raw(parent.raw() + 1);
            Ok(Entry {
                inode,
                ..Entry::default()
            })
        }
    }
    let ctx = Context::default();
    let root = Inode::ROOT;
    assert_eq!(Lookups.lookup(&ctx, root, c"n").unwrap().inode.raw(), 2);
    let e = Lookups.getattr(&ctx, root, None).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSYS));
    let e = Lookups.backing_fd(root, Handle::from_raw(1)).err().unwrap();
    assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP));
    assert_eq!(Lookups.init(InitCaps::default()).unwrap(), 0);
}
