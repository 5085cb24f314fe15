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
//!   `dax::coherent`) writes every method, forwarding the ones it does not change, and
//!   says so with `#[deny(clippy::missing_trait_methods)]` on its impl: a method left to
//!   the trait's default (a new one, or one forgotten) fails the lint, and its test that
//!   wraps the recording probe of `filesystem_tests.rs` and calls every method. A decorator
//!   passes each call's result through unchanged unless it documents otherwise, and keeps
//!   the lookup counts of the inner filesystem exact (an entry it drops after the inner call
//!   succeeded is forgotten).
//! - **Concurrency.** Methods take `&self`: requests arrive concurrently from several queues
//!   and threads, so implementations synchronise internally. The guest orders nothing
//!   between requests in flight except through their replies.
//! - **Ids.** [`Inode`], [`Handle`] and [`LockOwner`] are distinct types: the server makes
//!   them from the wire's numbers, and a call that swaps two does not compile.

use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use crate::protocol::abi::{Attr, FileLock, Kstatfs, SetattrIn};
use crate::protocol::iobuf::{Reader, Writer};
use crate::protocol::mapper::Mapper;

/// Inode number as the guest sees it (`nodeid` on the wire).
///
/// [`Inode`], [`Handle`] and [`LockOwner`] are distinct types over the same `u64`, so one
/// cannot be passed where another is expected:
///
/// ```compile_fail
/// use daxfsd::filesystem::{Context, FileSystem, Handle, Inode};
/// use daxfsd::iobuf::Writer;
/// fn read(fs: &dyn FileSystem, inode: Inode, handle: Handle, w: &mut Writer) {
///     // Inode and handle swapped: does not compile.
///     let _ = fs.read(&Context::default(), handle, inode, w, 4096, 0);
/// }
/// ```
///
/// The same call in the right order compiles:
///
/// ```
/// use daxfsd::filesystem::{Context, FileSystem, Handle, Inode};
/// use daxfsd::iobuf::Writer;
/// fn read(fs: &dyn FileSystem, inode: Inode, handle: Handle, w: &mut Writer) {
///     let _ = fs.read(&Context::default(), inode, handle, w, 4096, 0);
/// }
/// ```
///
/// The raw number is for the wire (the server's decoding and encoding) and for the state a
/// filesystem saves ([`Inode::from_raw`], [`Inode::raw`]).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Inode(u64);

/// Open file or directory handle as the guest sees it (`fh` on the wire). Not an
/// [`Inode`] (see there).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle(u64);

/// Owner of POSIX locks as the guest names it (`lock_owner`/`owner` on the wire): the
/// guest's `fl_owner_t`, not a process id. Not a [`Handle`] (see [`Inode`]).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockOwner(u64);

macro_rules! raw_id {
    ($($t:ident),*) => {$(
        impl $t {
            /// The id a raw wire (or saved state) number names.
            #[inline]
            pub const fn from_raw(n: u64) -> Self {
                $t(n)
            }
            /// The raw number, for the wire and for saved state.
            #[inline]
            pub const fn raw(self) -> u64 {
                self.0
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
    )*};
}
raw_id!(Inode, Handle, LockOwner);

impl Inode {
    /// The root directory ([`crate::protocol::abi::ROOT_ID`]).
    pub const ROOT: Inode = Inode(crate::protocol::abi::ROOT_ID);
}

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

/// A filesystem served over FUSE: one method per request it can answer, plus the session
/// hooks and the host-side seams. The contract each method states is what the server relies
/// on; see the module documentation for what holds for all of them.
#[allow(unused_variables, clippy::too_many_arguments)]
pub trait FileSystem: Send + Sync {
    // --- Session ---

    /// INIT, once per session before any other request: `caps.flags` holds the
    /// `init_flags` the guest offers; returns those the filesystem wants (the server
    /// keeps only offered ones and adds its own). An error fails INIT and the session.
    /// Called again after [`FileSystem::destroy`] for a new session.
    fn init(&self, caps: InitCaps) -> io::Result<u64> {
        Ok(0)
    }

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
    fn flush_writes_back(&self, inode: Inode) -> bool {
        true
    }

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
    fn statx_extra(&self, ctx: &Context, inode: Inode) -> io::Result<StatxExtra> {
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
        lock_owner: LockOwner,
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
        lock_owner: LockOwner,
    ) -> io::Result<()> {
        enosys()
    }

    /// FSYNC: the file's data (and its metadata unless `datasync`) reach stable storage
    /// before the reply. May take long.
    fn fsync(&self, ctx: &Context, inode: Inode, datasync: bool, handle: Handle) -> io::Result<()> {
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
    fn opendir(&self, ctx: &Context, inode: Inode, flags: u32) -> io::Result<(Handle, OpenFlags)> {
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
        owner: LockOwner,
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
        owner: LockOwner,
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
    fn backing_fd(&self, inode: Inode, handle: Handle) -> io::Result<Box<dyn AsFd + Send + Sync>> {
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

#[cfg(test)]
#[path = "filesystem_tests.rs"]
pub(crate) mod tests;
