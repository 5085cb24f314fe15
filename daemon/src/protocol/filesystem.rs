//! The filesystem seam: what the FUSE server asks of whatever holds the files.
//!
//! [`FileSystem`] is the contract, method by method. What holds for every method:
//!
//! - **Defaults.** Every method has a default: requests fail with `ENOSYS` (the guest then
//!   stops sending most of them), the session hooks do nothing. A filesystem implements
//!   only what it supports.
//! - **Trust.** Arguments are decoded and validated by the server (names are single,
//!   NUL-free, non-empty path components of at most `NAME_MAX` bytes; sizes are within the
//!   negotiated limits); inode numbers and handles come straight from the guest and must
//!   be checked: an unknown or mismatched one is an error (the passthrough answers
//!   `EBADF`), never a panic or another file's data.
//! - **Errors.** An error's raw OS error number is what the guest sees (`-errno` in the
//!   reply); an error without one becomes `EIO` (`EINVAL` for a short read of an argument).
//!   A failed call must leave no trace the guest cannot see: no reference taken, no handle
//!   open, nothing created it was not told about.
//! - **Lookup counts.** Every successful call that answers with an [`Entry`] (LOOKUP,
//!   MKNOD, MKDIR, SYMLINK, LINK, CREATE, TMPFILE, each READDIRPLUS entry the sink took)
//!   gives the guest one more reference to `Entry::inode`; FORGET and BATCH_FORGET give
//!   them back. An inode stays valid while it has references, and its number is not
//!   reused for another file before they are all gone. The server itself gives one back
//!   (`forget(ctx, inode, 1)`) when it undoes a create whose security label failed.
//! - **Blocking.** Methods run on the transport's threads; how long one may take is the
//!   opcode policy of [`crate::protocol::policy`]: only SETLKW may wait indefinitely, and
//!   only it must give up with `EINTR` on [`FileSystem::interrupt_waits`].
//! - **Decorators.** A filesystem that wraps another (e.g. DAX coherence in
//!   `dax::coherent`) is written with `filesystem_impl!`: every method it does not write
//!   itself is forwarded to the inner one, so none can be forgotten. A decorator passes each
//!   call's result through unchanged unless it documents otherwise, and keeps the lookup
//!   counts of the inner filesystem exact (an entry it drops after the inner call succeeded
//!   is forgotten).
//! - **Concurrency.** Methods take `&self`: requests arrive concurrently from several queues
//!   and threads, so implementations synchronise internally. The guest orders nothing
//!   between requests in flight except through their replies.
//!
//! The methods are written once, in `with_filesystem_methods!`: the trait, the forwarders
//! of `filesystem_impl!` and the tests that prove them all come from that one list.

use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use crate::protocol::abi::{Attr, FileLock, Kstatfs, SetattrIn};
use crate::protocol::iobuf::{Reader, Writer};
use crate::protocol::mapper::Mapper;

/// Inode number as the guest sees it.
pub type Inode = u64;
/// Open file or directory handle as the guest sees it.
pub type Handle = u64;

/// Who sent a request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Context {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// The answer to a lookup-like request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Entry {
    pub inode: Inode,
    pub generation: u64,
    pub attr: Attr,
    pub attr_timeout: Duration,
    pub entry_timeout: Duration,
}

/// One directory entry handed to the server's reply builder.
#[derive(Debug, Clone, Copy)]
pub struct DirEntry<'a> {
    pub ino: u64,
    /// Offset of the *next* entry (what the guest passes to continue after this one).
    pub offset: u64,
    /// `DT_*` type.
    pub typ: u32,
    pub name: &'a [u8],
}

/// Result of GETXATTR/LISTXATTR: the value, or only its size when the guest asked with 0.
#[derive(Debug, PartialEq, Eq)]
pub enum XattrReply {
    Value(Vec<u8>),
    Count(u32),
}

/// Features the client offers, and the filesystem picks from, in INIT.
#[derive(Debug, Clone, Copy, Default)]
pub struct InitCaps {
    /// `init_flags::*` the client offered (flags | flags2 << 32).
    pub flags: u64,
}

/// What FUSE_STATX adds to GETATTR's attributes ([`FileSystem::statx_extra`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatxExtra {
    /// Birth time (seconds, nanoseconds), when the filesystem keeps one.
    pub btime: Option<(i64, u32)>,
    /// `STATX_ATTR_*` flags set on the file (only among `attributes_mask`).
    pub attributes: u64,
    /// `STATX_ATTR_*` flags the filesystem reports, set or not.
    pub attributes_mask: u64,
}

/// Open options returned by OPEN/OPENDIR/CREATE (`fopen::*` flags).
pub type OpenFlags = u32;

/// Sink for READDIR/READDIRPLUS entries. Returns `Ok(false)` once the reply is full (the
/// entry was *not* added), so the filesystem can stop and undo side effects of that entry.
pub type AddEntry<'a> = dyn FnMut(DirEntry, Option<&Entry>) -> io::Result<bool> + 'a;

fn enosys<T>() -> io::Result<T> {
    Err(io::Error::from_raw_os_error(libc::ENOSYS))
}

/// The one list of [`FileSystem`] methods: their documentation, signature and default.
///
/// `with_filesystem_methods!([path::to::callback] tokens...)` invokes
/// `callback! { tokens... ; <every method> }`, each method as
/// `#[doc] fn name(&self, arg: Type, ...) -> Ret { default }`. The trait below is one such
/// callback; [`filesystem_impl!`] is another. Types are named as this module imports them:
/// a module that invokes [`filesystem_impl!`] imports the ones its forwarders need.
macro_rules! with_filesystem_methods {
    ([$($callback:tt)*] $($pre:tt)*) => {
        $($callback)*! { $($pre)* ;

        // --- Session ---

        /// INIT, once per session before any other request: `caps.flags` holds the
        /// `init_flags` the guest offers; returns those the filesystem wants (the server
        /// keeps only offered ones and adds its own). An error fails INIT and the session.
        /// Called again after [`FileSystem::destroy`] for a new session.
        fn init(&self, caps: InitCaps) -> io::Result<u64> { Ok(0) }

        /// Session end: DESTROY, a device reset or a disconnect. Every inode reference and
        /// handle of the session is dropped without FORGET or RELEASE; the next request is
        /// INIT. Never fails; a decorator drops its own per-session state too.
        fn destroy(&self) {}

        /// Not a request: the transport is stopping a queue and must complete every request
        /// it holds. A SETLKW waiting now gives up with `EINTR` promptly; nothing else
        /// changes. A filesystem whose methods never wait indefinitely has nothing to do.
        fn interrupt_waits(&self) {}

        /// Not a request: whether a FLUSH of `inode` may write back data (its host close runs
        /// a file system `flush` that does: NFS, FUSE, overlayfs over those; or a decorator
        /// writes back what it holds of the inode). `false` lets a transport serve the FLUSH
        /// on the thread that read it ([`crate::protocol::server::Server::wait`]). When
        /// unsure, `true`.
        fn flush_writes_back(&self, inode: Inode) -> bool { true }

        // --- Names and inodes ---

        /// LOOKUP: the entry `name` in directory `parent`. Success takes one lookup
        /// reference on the returned inode (the same inode number for the same file while
        /// referenced). `ENOENT` for a missing name, `ENOTDIR` when `parent` is not a
        /// directory.
        fn lookup(&self, ctx: &Context, parent: Inode, name: &CStr) -> io::Result<Entry> {
            enosys()
        }

        /// FORGET: the guest gives back `count` lookup references to `inode`. No reply, so
        /// no error: an unknown inode or a count beyond what is held is ignored (logged at
        /// most). At zero references the inode may be dropped and its number reused.
        fn forget(&self, ctx: &Context, inode: Inode, count: u64) {}

        /// BATCH_FORGET: [`FileSystem::forget`] for each `(inode, count)`, in order. The
        /// default does exactly that; override only to do it cheaper.
        fn batch_forget(&self, ctx: &Context, requests: &[(Inode, u64)]) {
            for &(inode, count) in requests {
                self.forget(ctx, inode, count);
            }
        }

        /// GETATTR: the attributes of `inode` and how long the guest may cache them.
        /// `handle` is set when the guest asked through an open file (`GETATTR_FH`); it may
        /// be used, the answer is the same. Takes no reference.
        fn getattr(
            &self,
            ctx: &Context,
            inode: Inode,
            handle: Option<Handle>,
        ) -> io::Result<(Attr, Duration)> {
            enosys()
        }

        /// STATX: what FUSE_STATX answers beyond GETATTR's attributes (the server asks
        /// [`FileSystem::getattr`] for those): the birth time and the `STATX_ATTR_*` inode
        /// flags. `ENOSYS` (the default) makes the guest ask GETATTR from then on.
        fn statx_extra(
            &self,
            ctx: &Context,
            inode: Inode,
        ) -> io::Result<crate::protocol::filesystem::StatxExtra> {
            enosys()
        }

        /// SETATTR: changes the attributes `attr.valid` selects (`fattr::*`: mode, owner,
        /// size, times; `handle` is set with `FATTR_FH`), then answers as GETATTR. A size
        /// change truncates or extends the file, and may happen even when a later attribute
        /// fails. Permission checks are the filesystem's (as the caller `ctx`).
        fn setattr(
            &self,
            ctx: &Context,
            inode: Inode,
            attr: &SetattrIn,
            handle: Option<Handle>,
        ) -> io::Result<(Attr, Duration)> {
            enosys()
        }

        /// READLINK: the target of symlink `inode`, as stored (not resolved, no NUL).
        /// `EINVAL` when `inode` is not a symlink.
        fn readlink(&self, ctx: &Context, inode: Inode) -> io::Result<Vec<u8>> {
            enosys()
        }

        /// SYMLINK: creates `name` in `parent` pointing at `target` (non-empty, shorter
        /// than `PATH_MAX`, never resolved here), owned by the caller. Success takes a
        /// reference as LOOKUP does; the server may undo it with UNLINK and FORGET when it
        /// cannot label the new inode. `EEXIST` when `name` exists.
        fn symlink(
            &self,
            ctx: &Context,
            target: &CStr,
            parent: Inode,
            name: &CStr,
        ) -> io::Result<Entry> {
            enosys()
        }

        /// MKNOD: creates a regular file, FIFO, socket or device node `name` in `parent`
        /// with `mode` (type and permission bits) and device number `rdev`, owned by the
        /// caller. `umask` is the caller's, not yet applied: the filesystem applies it to
        /// `mode`, or (POSIX ACLs negotiated) lets the directory's default ACL decide as
        /// the host would. A reference as LOOKUP; undone like SYMLINK.
        fn mknod(
            &self,
            ctx: &Context,
            parent: Inode,
            name: &CStr,
            mode: u32,
            rdev: u32,
            umask: u32,
        ) -> io::Result<Entry> {
            enosys()
        }

        /// MKDIR: creates directory `name` in `parent` (`mode` and `umask` as MKNOD). A
        /// reference as LOOKUP; undone with RMDIR and FORGET.
        fn mkdir(
            &self,
            ctx: &Context,
            parent: Inode,
            name: &CStr,
            mode: u32,
            umask: u32,
        ) -> io::Result<Entry> {
            enosys()
        }

        /// UNLINK: removes non-directory `name` from `parent`. Takes no reference and drops
        /// none: an open or referenced inode lives on until RELEASE and FORGET. `EISDIR`
        /// for a directory.
        fn unlink(&self, ctx: &Context, parent: Inode, name: &CStr) -> io::Result<()> {
            enosys()
        }

        /// RMDIR: removes the empty directory `name` from `parent` (`ENOTEMPTY`,
        /// `ENOTDIR`). References as UNLINK.
        fn rmdir(&self, ctx: &Context, parent: Inode, name: &CStr) -> io::Result<()> {
            enosys()
        }

        /// RENAME and RENAME2: moves `oldname` in `olddir` to `newname` in `newdir`.
        /// `flags` are `renameat2(2)` flags (`RENAME_NOREPLACE`, `RENAME_EXCHANGE`,
        /// `RENAME_WHITEOUT`; 0 for RENAME); `EINVAL` for ones the filesystem cannot honour.
        /// Inode numbers of the moved files do not change; a replaced target is unlinked.
        fn rename(
            &self,
            ctx: &Context,
            olddir: Inode,
            oldname: &CStr,
            newdir: Inode,
            newname: &CStr,
            flags: u32,
        ) -> io::Result<()> {
            enosys()
        }

        /// LINK: a new name `newname` in `newparent` for the existing `inode` (not a
        /// directory: `EPERM`). Answers with the same inode and takes a reference on it.
        fn link(
            &self,
            ctx: &Context,
            inode: Inode,
            newparent: Inode,
            newname: &CStr,
        ) -> io::Result<Entry> {
            enosys()
        }

        // --- Files ---

        /// OPEN: opens `inode` with the guest's `open(2)` `flags` (`O_CREAT`, `O_EXCL` and
        /// `O_NOCTTY` already handled by the guest; `O_TRUNC` truncates) and FUSE
        /// `fuse_flags` (`FUSE_OPEN_KILL_SUIDGID`). Returns a handle, valid until RELEASE,
        /// and `fopen::*` flags. A handle pins its inode: it stays valid without a lookup
        /// reference. Must not block on the file itself (a FIFO without a writer).
        fn open(
            &self,
            ctx: &Context,
            inode: Inode,
            flags: u32,
            fuse_flags: u32,
        ) -> io::Result<(Handle, OpenFlags)> {
            enosys()
        }

        /// CREATE: LOOKUP, creating `name` in `parent` as a regular file (`mode`, `umask` as
        /// MKNOD) when it is missing, then OPEN with `flags` (`O_EXCL`: `EEXIST` when it
        /// exists). A reference and a handle on success. The server may call it first with
        /// `O_EXCL` added (to label only files it created) and again without on `EEXIST`;
        /// it undoes a failed label with RELEASE, UNLINK and FORGET.
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
            enosys()
        }

        /// TMPFILE: an unnamed regular file in directory `parent` (`O_TMPFILE`), opened with
        /// `flags`; `mode`, `umask` as MKNOD. A reference and a handle, as CREATE.
        fn tmpfile(
            &self,
            ctx: &Context,
            parent: Inode,
            mode: u32,
            flags: u32,
            umask: u32,
        ) -> io::Result<(Entry, Handle, OpenFlags)> {
            enosys()
        }

        /// READ: up to `size` bytes of the file at byte `offset`, written straight into `w`
        /// (which has room for `size`); returns how many. Fewer than `size` means end of
        /// file (0 at or past it), except for files opened with `FOPEN_DIRECT_IO`.
        fn read(
            &self,
            ctx: &Context,
            inode: Inode,
            handle: Handle,
            w: &mut Writer,
            size: u32,
            offset: u64,
        ) -> io::Result<usize> {
            enosys()
        }

        /// WRITE: the `size` bytes `r` holds (exactly that many), at byte `offset` (a handle
        /// opened with `O_APPEND` appends, as `pwrite(2)` does); returns how many were
        /// written (at most `size`).
        /// `kill_priv` asks to clear set-user-ID and set-group-ID as an unprivileged write
        /// would (`WRITE_KILL_SUIDGID`); the guest sends it on direct writes whether or not
        /// `FUSE_HANDLE_KILLPRIV_V2` was negotiated.
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
            enosys()
        }

        /// FLUSH: the guest closed one descriptor of `handle` (there may be more, and
        /// RELEASE comes after the last one). Reports delayed write errors the way
        /// `close(2)` does and drops the POSIX locks `lock_owner` holds on the file. May
        /// take long (a host close can write back a whole file, e.g. over NFS).
        fn flush(
            &self,
            ctx: &Context,
            inode: Inode,
            handle: Handle,
            lock_owner: u64,
        ) -> io::Result<()> {
            enosys()
        }

        /// RELEASE: the last descriptor of `handle` is gone: the handle is closed and
        /// invalid from now on, whatever the result (the guest ignores it). `flock_release`
        /// asks to drop the `flock(2)` lock `lock_owner` holds through the handle first.
        /// The server also releases handles whose OPEN or CREATE reply never reached the
        /// guest (`false`, 0).
        fn release(
            &self,
            ctx: &Context,
            inode: Inode,
            handle: Handle,
            flock_release: bool,
            lock_owner: u64,
        ) -> io::Result<()> {
            enosys()
        }

        /// FSYNC: the file's data (and its metadata unless `datasync`) reach stable storage
        /// before the reply. May take long.
        fn fsync(
            &self,
            ctx: &Context,
            inode: Inode,
            datasync: bool,
            handle: Handle,
        ) -> io::Result<()> {
            enosys()
        }

        /// FALLOCATE: `fallocate(2)` with `mode` (`FALLOC_FL_*`) on `length` bytes at byte
        /// `offset`: allocates, punches or zeroes a range, possibly changing the size
        /// (unless `FALLOC_FL_KEEP_SIZE`). `EOPNOTSUPP` for a mode the host cannot do. May
        /// take long.
        fn fallocate(
            &self,
            ctx: &Context,
            inode: Inode,
            handle: Handle,
            mode: u32,
            offset: u64,
            length: u64,
        ) -> io::Result<()> {
            enosys()
        }

        /// LSEEK: the guest only sends `SEEK_DATA` and `SEEK_HOLE` (`whence`); returns the
        /// byte offset found from `offset` on, `ENXIO` past the end.
        fn lseek(
            &self,
            ctx: &Context,
            inode: Inode,
            handle: Handle,
            offset: u64,
            whence: u32,
        ) -> io::Result<u64> {
            enosys()
        }

        /// COPY_FILE_RANGE: copies up to `len` bytes from `off_in` of one open file to
        /// `off_out` of another (or the same) without passing them through the guest;
        /// returns how many (0 at the end of the input). `flags` are `copy_file_range(2)`
        /// flags (0 today). `EXDEV` when the host cannot, so the guest copies itself.
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
            enosys()
        }

        /// STATFS: `statfs(2)` of the filesystem holding `inode`.
        fn statfs(&self, ctx: &Context, inode: Inode) -> io::Result<Kstatfs> {
            enosys()
        }

        /// SYNCFS: every file of the filesystem `inode` belongs to reaches stable storage
        /// (`syncfs(2)`). May take long.
        fn syncfs(&self, ctx: &Context, inode: Inode) -> io::Result<()> {
            enosys()
        }

        // --- Extended attributes ---

        /// SETXATTR: sets attribute `name` to `value`; `flags` are `XATTR_CREATE` /
        /// `XATTR_REPLACE` (`EEXIST` / `ENODATA`), `setxattr_flags` the FUSE ones
        /// (`SETXATTR_ACL_KILL_SGID`). The server also calls it to label a new inode with
        /// the creator's security context (undoing the create when it fails).
        fn setxattr(
            &self,
            ctx: &Context,
            inode: Inode,
            name: &CStr,
            value: &[u8],
            flags: u32,
            setxattr_flags: u32,
        ) -> io::Result<()> {
            enosys()
        }

        /// GETXATTR: the value of `name`. With `size` 0 only its length
        /// ([`XattrReply::Count`]); `ERANGE` when it does not fit in `size` bytes, `ENODATA`
        /// when there is none.
        fn getxattr(
            &self,
            ctx: &Context,
            inode: Inode,
            name: &CStr,
            size: u32,
        ) -> io::Result<XattrReply> {
            enosys()
        }

        /// LISTXATTR: the NUL-terminated names of the attributes, `size` as GETXATTR.
        fn listxattr(&self, ctx: &Context, inode: Inode, size: u32) -> io::Result<XattrReply> {
            enosys()
        }

        /// REMOVEXATTR: removes attribute `name` (`ENODATA` when there is none).
        fn removexattr(&self, ctx: &Context, inode: Inode, name: &CStr) -> io::Result<()> {
            enosys()
        }

        // --- Directories ---

        /// OPENDIR: opens directory `inode` (`ENOTDIR` otherwise) for READDIR; `flags` as
        /// OPEN. A handle valid until RELEASEDIR.
        fn opendir(
            &self,
            ctx: &Context,
            inode: Inode,
            flags: u32,
        ) -> io::Result<(Handle, OpenFlags)> {
            enosys()
        }

        /// READDIR and READDIRPLUS: calls `add` for each entry from `offset` on (0: the
        /// start; otherwise a [`DirEntry::offset`] given out before on this handle), in a
        /// stable order, until `add` returns `Ok(false)` (reply full: that entry was not
        /// added and comes first next time) or the directory ends. With `plus`, each entry
        /// comes with its [`Entry`], looked up as LOOKUP does (one reference each); the
        /// reference of an entry `add` refused is given back. An error from `add` ends the
        /// call with that error.
        fn readdir(
            &self,
            ctx: &Context,
            inode: Inode,
            handle: Handle,
            offset: u64,
            plus: bool,
            add: &mut AddEntry,
        ) -> io::Result<()> {
            enosys()
        }

        /// RELEASEDIR: closes a directory handle, as RELEASE.
        fn releasedir(&self, ctx: &Context, inode: Inode, handle: Handle) -> io::Result<()> {
            enosys()
        }

        /// FSYNCDIR: FSYNC of a directory. A guest `sync` of a mount sends it for the root:
        /// a decorator that holds data of other files writes it back here too. May take
        /// long.
        fn fsyncdir(
            &self,
            ctx: &Context,
            inode: Inode,
            datasync: bool,
            handle: Handle,
        ) -> io::Result<()> {
            enosys()
        }

        // --- Locks and permissions ---

        /// GETLK: the first POSIX lock that would conflict with `lock` (byte range
        /// `start..=end`, `typ` `F_RDLCK`/`F_WRLCK`) taken by `owner`, or `lock` with `typ`
        /// `F_UNLCK` when none would.
        fn getlk(
            &self,
            ctx: &Context,
            inode: Inode,
            handle: Handle,
            owner: u64,
            lock: FileLock,
        ) -> io::Result<FileLock> {
            enosys()
        }

        /// SETLK and SETLKW: takes or drops (`F_UNLCK`) a lock for `owner`: a POSIX byte
        /// range lock, or with `flock` a `flock(2)` lock of the whole file. Without `sleep`
        /// a conflicting lock fails at once with `EAGAIN`; with `sleep` (SETLKW) the call
        /// waits for it, indefinitely, and must give up with `EINTR` when
        /// [`FileSystem::interrupt_waits`] is called. The server drops a lock whose reply
        /// was lost with a second, non-waiting call.
        fn setlk(
            &self,
            ctx: &Context,
            inode: Inode,
            handle: Handle,
            owner: u64,
            lock: FileLock,
            flock: bool,
            sleep: bool,
        ) -> io::Result<()> {
            enosys()
        }

        /// ACCESS: whether the caller may access `inode` as `access(2)` `mask` (`R_OK`,
        /// `W_OK`, `X_OK`, or `F_OK` 0) says: `Ok` or `EACCES`.
        fn access(&self, ctx: &Context, inode: Inode, mask: u32) -> io::Result<()> {
            enosys()
        }

        /// IOCTL, the inode-flag commands only (decoded and bounded by
        /// `protocol::ioctl`): read or change the `FS_*_FL` word or the `fsxattr` of
        /// `inode` through its open `handle` (file or directory). A get answers with the
        /// matching [`crate::protocol::ioctl::FileAttrReply`], a set with `Done`. The
        /// default is `ENOTTY`, what a file system without these ioctls answers.
        fn fileattr(
            &self,
            ctx: &Context,
            inode: Inode,
            handle: Handle,
            request: crate::protocol::ioctl::FileAttrRequest,
        ) -> io::Result<crate::protocol::ioctl::FileAttrReply> {
            Err(io::Error::from_raw_os_error(libc::ENOTTY))
        }

        // --- Host-side seams (not FUSE requests of their own) ---

        /// The host descriptor behind open `handle` of `inode`, for FUSE passthrough: the
        /// server asks right after a successful OPEN or CREATE when passthrough was
        /// negotiated, and the kernel then reads and writes the descriptor itself, never
        /// sending READ or WRITE for that handle. A filesystem (or decorator) that must see
        /// every READ and WRITE refuses, as the default does (`EOPNOTSUPP`).
        fn backing_fd(
            &self,
            inode: Inode,
            handle: Handle,
        ) -> io::Result<Box<dyn AsFd + Send + Sync>> {
            Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
        }

        /// SETUPMAPPING: maps `len` bytes of the open file at byte `foffset` into the DAX
        /// window at byte `moffset` through `mapper` (the server checked the range against
        /// the window and its alignment). `writable` asks for a writable mapping (`EACCES`
        /// on a read-only handle). The mapping replaces what the range held and outlives
        /// the handle, until REMOVEMAPPING (which goes to the mapper directly).
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
            enosys()
        }
        }
    };
}
pub(crate) use with_filesystem_methods;

/// Callback of [`with_filesystem_methods!`] that declares the trait.
macro_rules! declare_trait {
    (
        $(#[$trait_attr:meta])* ;
        $(
            $(#[$attr:meta])*
            fn $name:ident(&$self_:ident $(, $arg:ident: $ty:ty)* $(,)?) $(-> $ret:ty)?
            $default:block
        )*
    ) => {
        $(#[$trait_attr])*
        pub trait FileSystem: Send + Sync {
            $(
                $(#[$attr])*
                fn $name(&$self_ $(, $arg: $ty)*) $(-> $ret)? $default
            )*
        }
    };
}

with_filesystem_methods!([declare_trait]
    /// A filesystem served over FUSE: one method per request it can answer, plus the
    /// session hooks and the host-side seams. The contract each method states is what the
    /// server relies on; see the module documentation for what holds for all of them.
    #[allow(unused_variables, clippy::too_many_arguments)]
);

/// Implements [`FileSystem`] without writing its signatures again: each method is written
/// as `fn name(&self, arg, ...) { body }`, its arguments named (or `_`) in the trait's
/// order, their types and the return type taken from the trait. Every method not written
/// is handled as the header says:
///
/// - `others => self.field;` forwards it to the filesystem in `self.field` (decorators: a
///   method can never be forgotten, and a new trait method is forwarded by default);
/// - `others => default;` leaves the trait's default (`ENOSYS`).
///
/// A written method whose name is not a trait method, or written twice, does not compile;
/// nor does one with a wrong number of arguments.
///
/// ```text
/// filesystem_impl! {
///     impl[F: FileSystem] FileSystem for Logged<F>;
///     others => self.inner;
///     fn unlink(&self, ctx, parent, name) {
///         log::info!("unlink {name:?}");
///         self.inner.unlink(ctx, parent, name)
///     }
/// }
/// ```
///
/// The module invoking it imports the types of the methods it forwards or writes (as the
/// trait's module names them: `Context`, `io`, `CStr`, ...).
macro_rules! filesystem_impl {
    (
        $(#[$impl_attr:meta])*
        impl[$($gen:tt)*] FileSystem for $ty:ty;
        others => $($others:ident).+;
        $($methods:tt)*
    ) => {
        $crate::protocol::filesystem::filesystem_impl!(@parse ($) [$(#[$impl_attr])*]
            [$($gen)*] [$ty] [$($others).+] $($methods)*);
    };
    (
        @parse ($d:tt) [$($impl_attr:tt)*] [$($gen:tt)*] [$ty:ty] [$($others:tt)*]
        $(
            $(#[$attr:meta])*
            fn $name:ident(&$self_:ident $(, $arg:tt)*) $body:block
        )*
    ) => {
        const _: () = {
            // A method written twice is a duplicate variant here.
            #[allow(dead_code, non_camel_case_types)]
            enum Written {
                $($name),*
            }
            // A method written that the trait does not have is no `T::name` here.
            #[allow(dead_code)]
            fn written_are_trait_methods<T: $crate::protocol::filesystem::FileSystem>() {
                $(let _ = T::$name;)*
            }
            /// For each trait method (name, typed arguments, return type): the body written
            /// for it, else what `others` says.
            macro_rules! one_method {
                $(
                    ($name ($d($d a:ident: $d t:ty),*) ($d($d r:ty)?)) => {
                        $(#[$attr])*
                        fn $name(&$self_, $d($d a: $d t),*) $d(-> $d r)? {
                            let ($($arg,)*) = ($d($d a,)*);
                            $body
                        }
                    };
                )*
                ($d n:ident ($d($d a:ident: $d t:ty),*) ($d($d r:ty)?)) => {
                    $crate::protocol::filesystem::filesystem_impl!(@other [$($others)*]
                        $d n ($d($d a: $d t),*) ($d($d r)?));
                };
            }
            $($impl_attr)*
            impl<$($gen)*> $crate::protocol::filesystem::FileSystem for $ty {
                $crate::protocol::filesystem::with_filesystem_methods!(
                    [$crate::protocol::filesystem::each_method] one_method);
            }
        };
    };
    (@other [default] $($rest:tt)*) => {};
    (@other [self . $field:ident] $n:ident ($($a:ident: $t:ty),*) ($($r:ty)?)) => {
        fn $n(&self, $($a: $t),*) $(-> $r)? {
            $crate::protocol::filesystem::FileSystem::$n(&self.$field, $($a),*)
        }
    };
}
pub(crate) use filesystem_impl;

/// Callback of [`with_filesystem_methods!`]: `$each!` once per method with its name,
/// typed arguments and return type.
macro_rules! each_method {
    (
        $each:ident ;
        $(
            $(#[$attr:meta])*
            fn $name:ident(&$self_:ident $(, $arg:ident: $ty:ty)* $(,)?) $(-> $ret:ty)?
            $default:block
        )*
    ) => {
        $( $each! { $name ($($arg: $ty),*) ($($ret)?) } )*
    };
}
pub(crate) use each_method;

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Mutex;

    use vm_memory::VolatileSlice;

    use super::*;
    use crate::protocol::mapper::NoMapper;

    /// The name of every trait method, in the list's order.
    macro_rules! names {
        (; $($(#[$attr:meta])* fn $name:ident $args:tt $(-> $ret:ty)? $default:block)*) => {
            &[$(stringify!($name)),*]
        };
    }
    pub(crate) const METHODS: &[&str] = with_filesystem_methods!([names]);

    /// A filesystem that records the name of every method called, then does what the
    /// trait's default does. Generated from the list, not from [`filesystem_impl!`], so it
    /// proves the forwarders rather than relying on them.
    #[derive(Default)]
    pub(crate) struct Probe(pub(crate) Mutex<Vec<&'static str>>);

    macro_rules! probe {
        (;
            $(
                $(#[$attr:meta])*
                fn $name:ident(&$self_:ident $(, $arg:ident: $ty:ty)* $(,)?) $(-> $ret:ty)?
                $default:block
            )*
        ) => {
            #[allow(unused_variables)]
            impl FileSystem for Probe {
                $(
                    fn $name(&$self_ $(, $arg: $ty)*) $(-> $ret)? {
                        $self_.0.lock().unwrap().push(stringify!($name));
                        $default
                    }
                )*
            }
        };
    }
    with_filesystem_methods!([probe]);

    /// Calls every method of `fs` once, in the list's order.
    pub(crate) fn call_every_method(fs: &dyn FileSystem) {
        let (ctx, name, lock) = (Context::default(), c"n", FileLock::default());
        let mut out = [0u8; 16];
        let mut w = Writer::new(vec![VolatileSlice::from(&mut out[..])]);
        let mut data = [0u8; 16];
        let mut r = Reader::new(vec![VolatileSlice::from(&mut data[..])]);
        let mut add = |_: DirEntry, _: Option<&Entry>| Ok(true);
        let _ = fs.init(InitCaps::default());
        fs.destroy();
        fs.interrupt_waits();
        let _ = fs.flush_writes_back(1);
        let _ = fs.lookup(&ctx, 1, name);
        fs.forget(&ctx, 2, 1);
        fs.batch_forget(&ctx, &[]);
        let _ = fs.getattr(&ctx, 2, None);
        let _ = fs.statx_extra(&ctx, 2);
        let _ = fs.setattr(&ctx, 2, &SetattrIn::default(), None);
        let _ = fs.readlink(&ctx, 2);
        let _ = fs.symlink(&ctx, c"t", 1, name);
        let _ = fs.mknod(&ctx, 1, name, 0o644, 0, 0);
        let _ = fs.mkdir(&ctx, 1, name, 0o755, 0);
        let _ = fs.unlink(&ctx, 1, name);
        let _ = fs.rmdir(&ctx, 1, name);
        let _ = fs.rename(&ctx, 1, name, 1, c"m", 0);
        let _ = fs.link(&ctx, 2, 1, c"m");
        let _ = fs.open(&ctx, 2, 0, 0);
        let _ = fs.create(&ctx, 1, name, 0o644, 0, 0, 0);
        let _ = fs.tmpfile(&ctx, 1, 0o644, 0, 0);
        let _ = fs.read(&ctx, 2, 3, &mut w, 16, 0);
        let _ = fs.write(&ctx, 2, 3, &mut r, 16, 0, false);
        let _ = fs.flush(&ctx, 2, 3, 7);
        let _ = fs.release(&ctx, 2, 3, false, 7);
        let _ = fs.fsync(&ctx, 2, false, 3);
        let _ = fs.fallocate(&ctx, 2, 3, 0, 0, 4096);
        let _ = fs.lseek(&ctx, 2, 3, 0, libc::SEEK_DATA as u32);
        let _ = fs.copy_file_range(&ctx, 2, 3, 0, 4, 5, 0, 16, 0);
        let _ = fs.statfs(&ctx, 1);
        let _ = fs.syncfs(&ctx, 1);
        let _ = fs.setxattr(&ctx, 2, c"user.x", b"v", 0, 0);
        let _ = fs.getxattr(&ctx, 2, c"user.x", 0);
        let _ = fs.listxattr(&ctx, 2, 0);
        let _ = fs.removexattr(&ctx, 2, c"user.x");
        let _ = fs.opendir(&ctx, 1, 0);
        let _ = fs.readdir(&ctx, 1, 6, 0, true, &mut add);
        let _ = fs.releasedir(&ctx, 1, 6);
        let _ = fs.fsyncdir(&ctx, 1, true, 6);
        let _ = fs.getlk(&ctx, 2, 3, 7, lock);
        let _ = fs.setlk(&ctx, 2, 3, 7, lock, false, true);
        let _ = fs.access(&ctx, 2, libc::R_OK as u32);
        let _ = fs.fileattr(
            &ctx,
            2,
            3,
            crate::protocol::ioctl::FileAttrRequest::GetFlags,
        );
        let _ = fs.backing_fd(2, 3);
        let _ = fs.setupmapping(&ctx, 2, 3, 0, 4096, 0, false, &NoMapper);
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

    /// A decorator that writes nothing itself forwards everything, results included.
    #[test]
    fn an_empty_decorator_forwards_every_method() {
        struct Nothing {
            inner: Probe,
        }
        filesystem_impl! {
            impl[] FileSystem for Nothing;
            others => self.inner;
        }
        let fs = Nothing {
            inner: Probe::default(),
        };
        call_every_method(&fs);
        assert_eq!(*fs.inner.0.lock().unwrap(), METHODS);
        let e = fs.lookup(&Context::default(), 1, c"n").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSYS));
        assert_eq!(fs.init(InitCaps::default()).unwrap(), 0);
    }

    /// `others => default` leaves unwritten methods at the trait's defaults.
    #[test]
    fn others_default_keeps_the_trait_defaults() {
        struct Lookups;
        filesystem_impl! {
            impl[] FileSystem for Lookups;
            others => default;
            fn lookup(&self, _, parent, _) { Ok(Entry { inode: parent + 1, ..Entry::default() }) }
        }
        let ctx = Context::default();
        assert_eq!(Lookups.lookup(&ctx, 1, c"n").unwrap().inode, 2);
        let e = Lookups.getattr(&ctx, 1, None).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSYS));
        let e = Lookups.backing_fd(1, 1).err().unwrap();
        assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP));
    }
}
