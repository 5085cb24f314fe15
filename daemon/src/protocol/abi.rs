//! FUSE and virtio-fs wire format (Linux `include/uapi/linux/fuse.h`, protocol 7.41,
//! as spoken by a 6.12 virtio-fs client).
//!
//! Every struct here is `#[repr(C)]`, has no padding the kernel does not have, and is
//! checked against the kernel's size at compile time. All of them are plain old data,
//! so they can be read from and written to guest memory as bytes ([`ByteValued`]).

use std::mem::size_of;

use vm_memory::ByteValued;

/// Major version of the protocol we speak.
pub const KERNEL_VERSION: u32 = 7;
/// Highest minor version we implement.
pub const KERNEL_MINOR_VERSION: u32 = 41;
/// Lowest minor version we accept from a client.
pub const MIN_KERNEL_MINOR_VERSION: u32 = 27;
/// Inode number of the root directory.
pub const ROOT_ID: u64 = 1;
/// Longest file name component (Linux `NAME_MAX`).
pub const NAME_MAX: usize = 255;
/// Longest path (symlink target) accepted (Linux `PATH_MAX`).
pub const PATH_MAX: usize = 4096;
/// Longest extended attribute name (Linux `XATTR_NAME_MAX`).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest extended attribute value (Linux `XATTR_SIZE_MAX`).
pub const XATTR_SIZE_MAX: usize = 65536;

/// Request opcodes.
pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const NOTIFY_REPLY: u32 = 41;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SETUPMAPPING: u32 = 48;
    pub const REMOVEMAPPING: u32 = 49;
    pub const SYNCFS: u32 = 50;
    pub const TMPFILE: u32 = 51;
    pub const STATX: u32 = 52;

    /// Name of an opcode for log lines.
    pub fn name(op: u32) -> &'static str {
        const NAMES: [&str; 53] = [
            "?",
            "LOOKUP",
            "FORGET",
            "GETATTR",
            "SETATTR",
            "READLINK",
            "SYMLINK",
            "?",
            "MKNOD",
            "MKDIR",
            "UNLINK",
            "RMDIR",
            "RENAME",
            "LINK",
            "OPEN",
            "READ",
            "WRITE",
            "STATFS",
            "RELEASE",
            "?",
            "FSYNC",
            "SETXATTR",
            "GETXATTR",
            "LISTXATTR",
            "REMOVEXATTR",
            "FLUSH",
            "INIT",
            "OPENDIR",
            "READDIR",
            "RELEASEDIR",
            "FSYNCDIR",
            "GETLK",
            "SETLK",
            "SETLKW",
            "ACCESS",
            "CREATE",
            "INTERRUPT",
            "BMAP",
            "DESTROY",
            "IOCTL",
            "POLL",
            "NOTIFY_REPLY",
            "BATCH_FORGET",
            "FALLOCATE",
            "READDIRPLUS",
            "RENAME2",
            "LSEEK",
            "COPY_FILE_RANGE",
            "SETUPMAPPING",
            "REMOVEMAPPING",
            "SYNCFS",
            "TMPFILE",
            "STATX",
        ];
        NAMES.get(op as usize).copied().unwrap_or("?")
    }
}

/// `FUSE_INIT` flags (`flags` in the low 32 bits, `flags2` in the high 32 bits).
pub mod init_flags {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const POSIX_LOCKS: u64 = 1 << 1;
    pub const FILE_OPS: u64 = 1 << 2;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const SPLICE_WRITE: u64 = 1 << 7;
    pub const SPLICE_MOVE: u64 = 1 << 8;
    pub const SPLICE_READ: u64 = 1 << 9;
    pub const FLOCK_LOCKS: u64 = 1 << 10;
    pub const HAS_IOCTL_DIR: u64 = 1 << 11;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const NO_OPEN_SUPPORT: u64 = 1 << 17;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const HANDLE_KILLPRIV: u64 = 1 << 19;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const ABORT_ERROR: u64 = 1 << 21;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    pub const EXPLICIT_INVAL_DATA: u64 = 1 << 25;
    pub const MAP_ALIGNMENT: u64 = 1 << 26;
    pub const SUBMOUNTS: u64 = 1 << 27;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const SETXATTR_EXT: u64 = 1 << 29;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const INIT_RESERVED: u64 = 1 << 31;
    pub const SECURITY_CTX: u64 = 1 << 32;
    pub const HAS_INODE_DAX: u64 = 1 << 33;
    pub const CREATE_SUPP_GROUP: u64 = 1 << 34;
    pub const HAS_EXPIRE_ONLY: u64 = 1 << 35;
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    pub const PASSTHROUGH: u64 = 1 << 37;
    pub const NO_EXPORT_SUPPORT: u64 = 1 << 38;
    pub const HAS_RESEND: u64 = 1 << 39;
    pub const ALLOW_IDMAP: u64 = 1 << 40;
    /// The client can take requests over io_uring (Linux 6.14+, `fuse.enable_uring=Y`).
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_open_out.open_flags`.
pub mod fopen {
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const NONSEEKABLE: u32 = 1 << 2;
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const STREAM: u32 = 1 << 4;
    pub const NOFLUSH: u32 = 1 << 5;
    pub const PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
    pub const PASSTHROUGH: u32 = 1 << 7;
}

/// `fuse_setattr_in.valid`.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_attr.flags`.
pub mod attr_flags {
    pub const SUBMOUNT: u32 = 1 << 0;
    pub const DAX: u32 = 1 << 1;
}

/// `fuse_getattr_in.getattr_flags`.
pub const GETATTR_FH: u32 = 1 << 0;
/// `fuse_release_in.release_flags`.
pub const RELEASE_FLUSH: u32 = 1 << 0;
/// `fuse_release_in.release_flags`.
pub const RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;
/// `fuse_write_in.write_flags`: delayed write from the page cache.
pub const WRITE_CACHE: u32 = 1 << 0;
/// `fuse_write_in.write_flags`: `lock_owner` is valid.
pub const WRITE_LOCKOWNER: u32 = 1 << 1;
/// `fuse_write_in.write_flags`: kill suid and sgid bits.
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `fuse_read_in.read_flags`: `lock_owner` is valid.
pub const READ_LOCKOWNER: u32 = 1 << 1;
/// `fuse_lk_in.lk_flags`: a BSD `flock()` lock.
pub const LK_FLOCK: u32 = 1 << 0;
/// `fuse_fsync_in.fsync_flags`: data only.
pub const FSYNC_FDATASYNC: u32 = 1 << 0;
/// `fuse_open_in.open_flags`: kill suid and sgid on truncate.
pub const OPEN_KILL_SUIDGID: u32 = 1 << 0;
/// `fuse_setxattr_in.setxattr_flags`: clear SGID when the ACL is set.
pub const SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;
/// `fuse_setupmapping_in.flags`: map writable.
pub const SETUPMAPPING_FLAG_WRITE: u64 = 1 << 0;
/// `fuse_setupmapping_in.flags`: map readable.
pub const SETUPMAPPING_FLAG_READ: u64 = 1 << 1;
/// Size of `fuse_setxattr_in` before `FUSE_SETXATTR_EXT`.
pub const COMPAT_SETXATTR_IN_SIZE: usize = 8;
/// Size of `fuse_init_in` sent by clients older than 7.36.
pub const COMPAT_INIT_IN_SIZE: usize = 16;

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct Kstatfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    pub padding: u32,
    pub spare: [u32; 6],
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FileLock {
    pub start: u64,
    pub end: u64,
    pub typ: u32,
    pub pid: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct EntryOut {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: Attr,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct ForgetIn {
    pub nlookup: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct ForgetOne {
    pub nodeid: u64,
    pub nlookup: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct BatchForgetIn {
    pub count: u32,
    pub dummy: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct GetattrIn {
    pub flags: u32,
    pub dummy: u32,
    pub fh: u64,
}

/// `struct fuse_statx_in` (FUSE_STATX, ABI 7.39).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct StatxIn {
    pub getattr_flags: u32,
    pub reserved: u32,
    pub fh: u64,
    pub sx_flags: u32,
    pub sx_mask: u32,
}

/// `struct fuse_sx_time`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct SxTime {
    pub tv_sec: i64,
    pub tv_nsec: u32,
    pub reserved: i32,
}

/// `struct fuse_statx`: `struct statx` as FUSE carries it.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct Statx {
    pub mask: u32,
    pub blksize: u32,
    pub attributes: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub mode: u16,
    pub spare0: u16,
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub attributes_mask: u64,
    pub atime: SxTime,
    pub btime: SxTime,
    pub ctime: SxTime,
    pub mtime: SxTime,
    pub rdev_major: u32,
    pub rdev_minor: u32,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub spare2: [u64; 14],
}

/// `struct fuse_statx_out`; `flags` are the `attr_flags::*` of `fuse_attr.flags`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct StatxOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub flags: u32,
    pub spare: [u64; 2],
    pub stat: Statx,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct AttrOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub dummy: u32,
    pub attr: Attr,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct MknodIn {
    pub mode: u32,
    pub rdev: u32,
    pub umask: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct MkdirIn {
    pub mode: u32,
    pub umask: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct RenameIn {
    pub newdir: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct Rename2In {
    pub newdir: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct LinkIn {
    pub oldnodeid: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct SetattrIn {
    pub valid: u32,
    pub padding: u32,
    pub fh: u64,
    pub size: u64,
    pub lock_owner: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub unused4: u32,
    pub uid: u32,
    pub gid: u32,
    pub unused5: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct OpenIn {
    pub flags: u32,
    pub open_flags: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct CreateIn {
    pub flags: u32,
    pub mode: u32,
    pub umask: u32,
    pub open_flags: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct OpenOut {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: i32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct ReleaseIn {
    pub fh: u64,
    pub flags: u32,
    pub release_flags: u32,
    pub lock_owner: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct FlushIn {
    pub fh: u64,
    pub unused: u32,
    pub padding: u32,
    pub lock_owner: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct ReadIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub read_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct WriteIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub write_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct WriteOut {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct StatfsOut {
    pub st: Kstatfs,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct FsyncIn {
    pub fh: u64,
    pub fsync_flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct SetxattrIn {
    pub size: u32,
    pub flags: u32,
    pub setxattr_flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct GetxattrIn {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct GetxattrOut {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct LkIn {
    pub fh: u64,
    pub owner: u64,
    pub lk: FileLock,
    pub lk_flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct LkOut {
    pub lk: FileLock,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct AccessIn {
    pub mask: u32,
    pub padding: u32,
}

/// `fuse_init_in` as sent by clients >= 7.36 (older ones send the first 16 bytes).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub flags2: u32,
    pub unused: [u32; 11],
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct InitOut {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub time_gran: u32,
    pub max_pages: u16,
    pub map_alignment: u16,
    pub flags2: u32,
    pub max_stack_depth: u32,
    pub unused: [u32; 6],
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct InterruptIn {
    pub unique: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub total_extlen: u16,
    pub padding: u16,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct OutHeader {
    pub len: u32,
    pub error: i32,
    pub unique: u64,
}

/// Fixed part of `fuse_dirent`; the name follows, padded to 8 bytes.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct Dirent {
    pub ino: u64,
    pub off: u64,
    pub namelen: u32,
    pub typ: u32,
}

/// Fixed part of `fuse_direntplus`; the name follows, padded to 8 bytes.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct DirentPlus {
    pub entry_out: EntryOut,
    pub dirent: Dirent,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct FallocateIn {
    pub fh: u64,
    pub offset: u64,
    pub length: u64,
    pub mode: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct LseekIn {
    pub fh: u64,
    pub offset: u64,
    pub whence: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct LseekOut {
    pub offset: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct CopyFileRangeIn {
    pub fh_in: u64,
    pub off_in: u64,
    pub nodeid_out: u64,
    pub fh_out: u64,
    pub off_out: u64,
    pub len: u64,
    pub flags: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct SetupmappingIn {
    pub fh: u64,
    pub foffset: u64,
    pub len: u64,
    pub flags: u64,
    pub moffset: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct RemovemappingIn {
    pub count: u32,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RemovemappingOne {
    pub moffset: u64,
    pub len: u64,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct SyncfsIn {
    pub padding: u64,
}

/// `fuse_ioctl_in`; `in_size` bytes of argument follow.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct IoctlIn {
    pub fh: u64,
    /// `ioctl_flags::*`.
    pub flags: u32,
    pub cmd: u32,
    pub arg: u64,
    pub in_size: u32,
    pub out_size: u32,
}

/// `fuse_ioctl_out`; the `out_size` bytes of the result follow.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct IoctlOut {
    pub result: i32,
    pub flags: u32,
    pub in_iovs: u32,
    pub out_iovs: u32,
}

/// `FUSE_IOCTL_*` request flags.
pub mod ioctl_flags {
    /// A 32-bit (compat) caller.
    pub const COMPAT: u32 = 1 << 0;
    /// Not restricted to the sizes the command encodes (CUSE only; never virtio-fs).
    pub const UNRESTRICTED: u32 = 1 << 1;
    /// In a reply: retry with other buffers (refused by the kernel when restricted).
    pub const RETRY: u32 = 1 << 2;
    /// A 32-bit kernel.
    pub const BIT32: u32 = 1 << 3;
    /// The handle is a directory's.
    pub const DIR: u32 = 1 << 4;
    /// An x32 caller.
    pub const COMPAT_X32: u32 = 1 << 5;
}

/// `struct fsxattr` (`FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Fsxattr {
    pub xflags: u32,
    pub extsize: u32,
    pub nextents: u32,
    pub projid: u32,
    pub cowextsize: u32,
    pub pad: [u8; 8],
}

/// virtio-fs device configuration space (`struct virtio_fs_config`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VirtioFsConfig {
    pub tag: [u8; 36],
    pub num_request_queues: u32,
    /// Size of each notification buffer the driver posts (`VIRTIO_FS_F_NOTIFICATION`);
    /// 0 when the device offers no notification queue.
    pub notify_buf_size: u32,
}

impl Default for VirtioFsConfig {
    fn default() -> Self {
        VirtioFsConfig {
            tag: [0; 36],
            num_request_queues: 0,
            notify_buf_size: 0,
        }
    }
}

macro_rules! wire_structs {
    ($($t:ty = $size:expr),* $(,)?) => {
        $(
            const _: () = assert!(size_of::<$t>() == $size);
            // SAFETY: `$t` is `#[repr(C)]`, made only of integers (or arrays and structs of
            // integers), and its size equals the sum of its fields (asserted above against the
            // kernel's size), so it has no padding and every bit pattern is a valid value.
            unsafe impl ByteValued for $t {}
        )*
    };
}

wire_structs! {
    Attr = 88, Kstatfs = 80, FileLock = 24, EntryOut = 128, ForgetIn = 8, ForgetOne = 16,
    BatchForgetIn = 8, GetattrIn = 16, AttrOut = 104, MknodIn = 16, MkdirIn = 8, RenameIn = 8,
    Rename2In = 16, LinkIn = 8, SetattrIn = 88, OpenIn = 8, CreateIn = 16, OpenOut = 16,
    ReleaseIn = 24, FlushIn = 24, ReadIn = 40, WriteIn = 40, WriteOut = 8, StatfsOut = 80,
    FsyncIn = 16, SetxattrIn = 16, GetxattrIn = 8, GetxattrOut = 8, LkIn = 48, LkOut = 24,
    AccessIn = 8, InitIn = 64, InitOut = 64, InterruptIn = 8, InHeader = 40, OutHeader = 16,
    Dirent = 24, DirentPlus = 152, FallocateIn = 32, LseekIn = 24, LseekOut = 8,
    CopyFileRangeIn = 56, SetupmappingIn = 40, RemovemappingIn = 4, RemovemappingOne = 16,
    SyncfsIn = 8, VirtioFsConfig = 44, IoctlIn = 32, IoctlOut = 16, Fsxattr = 28,
    StatxIn = 24, SxTime = 16, Statx = 256, StatxOut = 288,
}

/// Size of a directory entry record with a name of `namelen` bytes, padded to 8 bytes.
pub fn dirent_size(fixed: usize, namelen: usize) -> Option<usize> {
    fixed.checked_add(namelen)?.checked_add(7).map(|n| n & !7)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_names_line_up() {
        assert_eq!(opcode::name(opcode::LOOKUP), "LOOKUP");
        assert_eq!(opcode::name(opcode::SETUPMAPPING), "SETUPMAPPING");
        assert_eq!(opcode::name(opcode::TMPFILE), "TMPFILE");
        assert_eq!(opcode::name(opcode::STATX), "STATX");
        assert_eq!(opcode::name(7), "?");
        assert_eq!(opcode::name(u32::MAX), "?");
    }

    #[test]
    fn dirent_padding() {
        assert_eq!(dirent_size(24, 1), Some(32));
        assert_eq!(dirent_size(24, 8), Some(32));
        assert_eq!(dirent_size(24, 9), Some(40));
        assert_eq!(dirent_size(usize::MAX, 1), None);
    }
}
