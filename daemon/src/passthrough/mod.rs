//! The passthrough filesystem: serves a host directory, as virtiofsd does.
//!
//! # Containment
//! Nothing the guest sends is ever resolved as a host path. Each guest inode holds an `O_PATH |
//! O_NOFOLLOW` descriptor or a file handle ([`inode`], [`fhandle`]); operations take a directory
//! descriptor and a single name component (`*at()` calls with `AT_SYMLINK_NOFOLLOW` /
//! `O_NOFOLLOW`), or reach the inode itself through its magic link `N` in `/proc/self/fd`, which
//! lands on the inode without re-resolving anything. That directory is a descriptor opened at
//! start-up (before the sandbox hides procfs), never the path `/proc/self/fd`: inside the sandbox
//! that path would resolve in the guest-controlled share. So host symlinks are never followed (the
//! guest reads them with READLINK and resolves them in its own namespace), LOOKUP of `..` at the
//! root returns the root, and `.`/`..` are refused as names of anything that creates, removes or
//! renames. A directory a host user moves out of the share stays the guest's, but yields nothing
//! new: its `..` is the root, LOOKUP in it fails with `ENOENT`, READDIRPLUS gives its names without
//! entries (`dir_inside_share` walks `..` to the root, whatever the sandbox); a migrated file
//! handle is checked the same way. Only regular files are opened for I/O and only directories for
//! listing: symlinks fail with `ELOOP`, device nodes, fifos and sockets with `EPERM` (the guest
//! implements those itself; opening a guest-made device node on the host would be an escape).
//!
//! # File modes and umask
//! Without POSIX ACLs `FUSE_DONT_MASK` is not negotiated, so the guest kernel applies the
//! caller's umask before sending a mode. We apply `mode & !umask` again explicitly
//! (idempotent), and set the *process* umask to 0 in [`PassthroughFs::new`] so the host
//! does not mask a second time with the daemon's own umask. That affects every file the
//! process creates.
//!
//! With `--posix-acl`, `FUSE_DONT_MASK` is negotiated with `FUSE_POSIX_ACL`: the guest sends
//! the unmasked mode and its umask, because a default ACL on the parent replaces the umask.
//! The creating thread (which has its own `fs_struct`, see [`xattr_ops`]) then sets its
//! umask to the guest's for the duration of the create and passes the mode unmasked, so the
//! host kernel applies the umask only when the parent has no default ACL, in one step.
//!
//! # Errors chosen here
//! Unknown inodes and handles: `EBADF`. `.`/`..` as a name to create, remove or rename:
//! `EINVAL`. OPEN of a directory: `EISDIR`; OPENDIR of a non-directory: `ENOTDIR`. Any
//! modifying operation with `readonly`: `EROFS`. A writable DAX mapping through a handle
//! opened read-only: `EACCES` (what `mmap(2)` says for `PROT_WRITE` on such a file).

mod creds;
mod dir_ops;
mod entry_ops;
pub mod fhandle;
mod file_ops;
mod fileattr;
mod fs_impl;
mod handle;
pub mod idmap;
mod inode;
mod kept;
mod migration;
pub mod state;
mod watch;
mod xattr_ops;
pub mod xattrmap;

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::protocol::abi::{attr_flags, fopen, Attr};
use crate::protocol::filesystem::{Context, Entry, Inode};
use crate::sys;

use creds::Creds;
use handle::HandleStore;
use inode::{InodeData, InodeFile, InodeKey, InodeStore};
pub use watch::open_group as open_watch_group;

/// How much the guest may cache (virtiofsd's `--cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CachePolicy {
    /// Nothing: 0 timeouts, `FOPEN_DIRECT_IO` for files.
    Never,
    /// Metadata for 1 s; data cached until the file changes.
    #[default]
    Auto,
    /// Metadata for a day; data and directory listings kept across opens.
    Always,
    /// Metadata for a day; data uncached (`FOPEN_DIRECT_IO`).
    Metadata,
    /// `always`'s caching while the guest takes host-change notifications (every host change
    /// invalidates what the guest holds, [`PassthroughFs::watch_host`]); `auto`'s otherwise.
    Coherent,
}

/// When inodes are kept as file handles instead of `O_PATH` descriptors (virtiofsd's
/// `--inode-file-handles`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FileHandleMode {
    /// Always descriptors.
    #[default]
    Never,
    /// Handles where the file system makes them, descriptors elsewhere; descriptors for
    /// everything when handles do not work on the shared directory at start.
    Prefer,
    /// Handles only: start fails when they do not work; an inode on a file system without
    /// them fails its lookup with `EOPNOTSUPP`.
    Mandatory,
}

/// Passthrough options, with virtiofsd's meanings and defaults.
#[derive(Debug, Clone)]
pub struct Config {
    /// The shared directory.
    pub root_dir: PathBuf,
    pub cache: CachePolicy,
    /// Negotiate `FUSE_WRITEBACK_CACHE`.
    pub writeback: bool,
    /// Serve extended attributes (else the xattr requests fail with `ENOSYS`).
    pub xattr: bool,
    /// Refuse every modification with `EROFS`.
    pub readonly: bool,
    /// Honour `O_DIRECT` from the guest (else it is dropped).
    pub allow_direct_io: bool,
    /// With `cache=never`, negotiate `FUSE_DIRECT_IO_ALLOW_MMAP`.
    pub allow_mmap: bool,
    /// Offer READDIRPLUS (never with `cache=never`).
    pub readdirplus: bool,
    /// Flag directories on another host mount as submounts.
    pub announce_submounts: bool,
    /// Negotiate `FUSE_HANDLE_KILLPRIV_V2` (we clear suid/sgid on write, truncate and
    /// `O_TRUNC`). Off by default, as in virtiofsd. A WRITE flagged `WRITE_KILL_SUIDGID`
    /// clears them either way (the guest's direct writes need it).
    pub killpriv_v2: bool,
    /// Serve POSIX locks on the host (`FUSE_POSIX_LOCKS`), per guest lock owner. Off by
    /// default, as in virtiofsd: the guest kernel then keeps its locks itself.
    pub posix_lock: bool,
    /// Serve BSD flock() locks on the host (`FUSE_FLOCK_LOCKS`). Off by default.
    pub flock: bool,
    /// POSIX ACLs (virtiofsd's `--posix-acl`): negotiate `FUSE_POSIX_ACL` and
    /// `FUSE_DONT_MASK`, serve the `system.posix_acl_*` attributes (see [`xattr_ops`]).
    pub posix_acl: bool,
    /// Security labels (virtiofsd's `--security-label`): negotiate `FUSE_SECURITY_CTX`; the
    /// server then sets the context the guest sends on each new inode.
    pub security_label: bool,
    /// Pass the guest's `O_NOATIME` on (virtiofsd's `--preserve-noatime`); else dropped.
    pub preserve_noatime: bool,
    /// Translate extended attribute names (virtiofsd's `--xattrmap`).
    pub xattrmap: Option<xattrmap::XattrMap>,
    /// Translate uids and gids between guest and host (virtiofsd's `--translate-uid` /
    /// `--translate-gid`); identity by default.
    pub uid_map: idmap::IdMap,
    pub gid_map: idmap::IdMap,
    /// Keep inodes as file handles (see [`FileHandleMode`]).
    pub inode_file_handles: FileHandleMode,
    /// Let the guest set host inode flags (`chattr`, FS_IOC_SETFLAGS/FSSETXATTR; see
    /// [`fileattr`]). Off by default: reading them is always served.
    pub inode_flags: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            root_dir: PathBuf::from("/"),
            cache: CachePolicy::Auto,
            writeback: false,
            xattr: false,
            readonly: false,
            allow_direct_io: false,
            allow_mmap: false,
            readdirplus: true,
            announce_submounts: false,
            killpriv_v2: false,
            posix_lock: false,
            flock: false,
            posix_acl: false,
            security_label: false,
            preserve_noatime: false,
            xattrmap: None,
            uid_map: idmap::IdMap::default(),
            gid_map: idmap::IdMap::default(),
            inode_file_handles: FileHandleMode::Never,
            inode_flags: false,
        }
    }
}

/// Features agreed in INIT that change how we behave.
#[derive(Default)]
struct Negotiated {
    writeback: AtomicBool,
    submounts: AtomicBool,
    killpriv_v2: AtomicBool,
    /// `FUSE_POSIX_ACL` and `FUSE_DONT_MASK`: the guest sends unmasked modes plus its umask.
    posix_acl: AtomicBool,
}

/// Serves [`Config::root_dir`] to the guest.
pub struct PassthroughFs {
    cfg: Config,
    inodes: Arc<InodeStore>,
    handles: HandleStore,
    /// `O_PATH` descriptor of `/proc/self/fd`, to reach an inode through its magic link.
    proc_self_fd: OwnedFd,
    creds: Creds,
    negotiated: Negotiated,
    timeout: Duration,
    /// Host changes reported to the guest (`--notify`), when on.
    watch: OnceLock<Arc<watch::HostWatch>>,
    notifier: OnceLock<Arc<crate::protocol::notify::Notifier>>,
    /// Bumped by `interrupt_waits`: a waiting SETLKW that sees it change gives up (EINTR).
    wait_generation: std::sync::atomic::AtomicU64,
    /// The file-handle mode in effect (`Prefer` becomes `Never` when handles do not work).
    fh_mode: FileHandleMode,
    /// Mount descriptors for inodes kept as handles.
    mount_fds: fhandle::MountFds,
    /// The shared directory's mount descriptor, kept for the life of the filesystem.
    _root_mount: Option<Arc<OwnedFd>>,
    /// Bound on the descriptors handle inodes keep open between operations.
    fd_cache: Arc<inode::FdCache>,
    /// Per host device (file system): whether a close there may write data back
    /// ([`PassthroughFs::do_flush_writes_back`]).
    flush_by_dev: std::sync::RwLock<std::collections::HashMap<u64, bool>>,
}

/// File systems whose files have no `flush` operation (Linux 6.12 and 6.18: ext2/3/4, xfs,
/// btrfs, tmpfs): a close there writes nothing back, only drops the closer's POSIX locks.
/// NFS, FUSE, CIFS, 9p, overlayfs (its flush is its upper file system's) and the rest are
/// taken to write back.
const CLOSE_WRITES_NOTHING: [i64; 4] = [
    0xEF53,      // EXT2/3/4_SUPER_MAGIC
    0x5846_5342, // XFS_SUPER_MAGIC
    0x9123_683E, // BTRFS_SUPER_MAGIC
    0x0102_1994, // TMPFS_MAGIC
];

/// How many host devices [`PassthroughFs::do_flush_writes_back`] remembers.
const FLUSH_BY_DEV_MAX: usize = 256;

/// How many handle inodes keep their `O_PATH` descriptor open between operations.
pub const HANDLE_FD_CACHE: usize = 128;

pub(crate) fn err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// `STATX_MNT_ID` plus the basic fields.
const STATX_MASK: u32 = libc::STATX_BASIC_STATS | libc::STATX_MNT_ID;

/// `statx` of the file behind a descriptor (not following it if it is a symlink).
fn stat_fd(fd: BorrowedFd) -> io::Result<libc::statx> {
    sys::statx(
        fd,
        sys::EMPTY,
        libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        STATX_MASK,
    )
}

fn key_of(st: &libc::statx) -> InodeKey {
    InodeKey {
        dev: libc::makedev(st.stx_dev_major, st.stx_dev_minor),
        ino: st.stx_ino,
        mnt: if st.stx_mask & libc::STATX_MNT_ID != 0 {
            st.stx_mnt_id
        } else {
            0
        },
    }
}

/// Device number in the kernel's `new_encode_dev` form, as FUSE carries it.
fn encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// A FUSE device number (`new_encode_dev` form) as a host `dev_t`.
fn decode_dev(rdev: u32) -> libc::dev_t {
    let major = (rdev & 0xfff00) >> 8;
    let minor = (rdev & 0xff) | ((rdev >> 12) & 0xfff00);
    libc::makedev(major, minor)
}

fn attr_of(st: &libc::statx) -> Attr {
    Attr {
        ino: st.stx_ino,
        size: st.stx_size,
        blocks: st.stx_blocks,
        atime: st.stx_atime.tv_sec as u64,
        mtime: st.stx_mtime.tv_sec as u64,
        ctime: st.stx_ctime.tv_sec as u64,
        atimensec: st.stx_atime.tv_nsec,
        mtimensec: st.stx_mtime.tv_nsec,
        ctimensec: st.stx_ctime.tv_nsec,
        mode: u32::from(st.stx_mode),
        nlink: st.stx_nlink,
        uid: st.stx_uid,
        gid: st.stx_gid,
        rdev: encode_dev(st.stx_rdev_major, st.stx_rdev_minor),
        blksize: st.stx_blksize,
        flags: 0,
    }
}

/// The file handle of `fd` (migration tests and fuzz seeds forge streams with it).
#[cfg(any(test, feature = "testing"))]
pub(crate) fn file_handle_of(fd: BorrowedFd) -> io::Result<fhandle::FileHandleBytes> {
    fhandle::name_to_handle(fd).map(|(h, _)| h)
}

/// Most `..` steps [`PassthroughFs::dir_inside_share`] takes looking for the root (a tree
/// deeper than this counts as outside; `../` x 1,300 stays within PATH_MAX).
const MAX_DEPTH: usize = 1300;

/// Refuses `.`, `..`, and anything that is not one non-empty path component.
fn check_name(name: &CStr) -> io::Result<()> {
    let b = name.to_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(err(libc::EINVAL));
    }
    Ok(())
}

/// The name of `fd` inside `/proc/self/fd`.
fn fd_name(fd: BorrowedFd) -> CString {
    // A decimal number never contains NUL.
    CString::new(fd.as_raw_fd().to_string()).unwrap_or_default()
}

impl PassthroughFs {
    /// Opens the shared directory and `/proc/self/fd`. Sets the process umask to 0 (see the
    /// module docs).
    pub fn new(cfg: Config) -> io::Result<Self> {
        let proc_self_fd = sys::open(c"/proc/self/fd", libc::O_PATH | libc::O_DIRECTORY, 0)?;
        Self::with_proc_self_fd(cfg, proc_self_fd)
    }

    /// Like [`PassthroughFs::new`], with `/proc/self/fd` of this process already open (a
    /// sandbox opens it before procfs goes out of sight). Every inode the filesystem reaches
    /// through a magic link goes through this descriptor, never through a path.
    pub fn with_proc_self_fd(cfg: Config, proc_self_fd: OwnedFd) -> io::Result<Self> {
        if sys::fstatfs(proc_self_fd.as_fd())?.f_type != libc::PROC_SUPER_MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the /proc/self/fd descriptor is not on procfs",
            ));
        }
        let path = CString::new(cfg.root_dir.as_os_str().as_bytes()).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "shared dir path contains NUL")
        })?;
        let root = sys::open(&path, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        let st = stat_fd(root.as_fd())?;
        let mount_fds = fhandle::MountFds::default();
        let (fh_mode, root_mount) = match cfg.inode_file_handles {
            FileHandleMode::Never => (FileHandleMode::Never, None),
            mode => match Self::check_file_handles(root.as_fd(), &mount_fds) {
                Ok(m) => (mode, Some(m)),
                Err(e) if mode == FileHandleMode::Prefer => {
                    log::warn!(
                        "file handles do not work on the shared directory ({e}): inodes are kept as O_PATH descriptors"
                    );
                    (FileHandleMode::Never, None)
                }
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("--inode-file-handles=mandatory: file handles do not work on the shared directory: {e} (they need CAP_DAC_READ_SEARCH, i.e. a root daemon, and a file system that can export handles); use --inode-file-handles=prefer or never"),
                    ))
                }
            },
        };
        sys::umask(0);
        let timeout = match cfg.cache {
            CachePolicy::Never => Duration::ZERO,
            CachePolicy::Auto | CachePolicy::Coherent => Duration::from_secs(1),
            CachePolicy::Always | CachePolicy::Metadata => Duration::from_secs(86400),
        };
        Ok(PassthroughFs {
            inodes: Arc::new(InodeStore::new(root, key_of(&st))),
            handles: HandleStore::new(),
            proc_self_fd,
            creds: Creds::detect(),
            negotiated: Negotiated::default(),
            timeout,
            watch: OnceLock::new(),
            notifier: OnceLock::new(),
            wait_generation: Default::default(),
            fh_mode,
            mount_fds,
            _root_mount: root_mount,
            fd_cache: Arc::new(inode::FdCache::new(HANDLE_FD_CACHE)),
            flush_by_dev: Default::default(),
            cfg,
        })
    }

    /// Makes the shared directory's handle and opens it again, as every later inode will
    /// be: returns its mount descriptor when that works.
    fn check_file_handles(
        root: BorrowedFd,
        mounts: &fhandle::MountFds,
    ) -> io::Result<Arc<OwnedFd>> {
        let (handle, mnt) = fhandle::name_to_handle(root)?;
        let mount = mounts.insert(
            mnt,
            sys::openat(root, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?,
        );
        fhandle::open_handle(mount.as_fd(), &handle, libc::O_PATH | libc::O_NOFOLLOW)?;
        Ok(mount)
    }

    /// Reports host changes to the guest through `notifier` (issue #42): `fan` is the group
    /// [`open_watch_group`] made. The watch starts with the shared directory; every directory
    /// the guest looks up joins it until the guest forgets it.
    pub fn watch_host(
        &self,
        fan: OwnedFd,
        notifier: Arc<crate::protocol::notify::Notifier>,
    ) -> io::Result<()> {
        let proc_self_fd = self.proc_self_fd.try_clone()?;
        let w = watch::HostWatch::new(fan, proc_self_fd, notifier.clone(), self.inodes.clone());
        w.spawn()?;
        if let Ok(root) = self.inodes.get(Inode::ROOT) {
            w.note(&root);
        }
        let _ = self.watch.set(w);
        let _ = self.notifier.set(notifier);
        Ok(())
    }

    /// Directories whose host changes reach the guest now.
    pub fn watched_dirs(&self) -> usize {
        self.watch.get().map_or(0, |w| w.len())
    }

    /// `--cache=coherent` with a guest that takes notifications: cache as `always` does.
    fn coherent_now(&self) -> bool {
        self.notifier.get().is_some_and(|n| n.live())
    }

    /// Entry and attribute timeout under the cache policy.
    fn timeout(&self) -> Duration {
        if self.cfg.cache == CachePolicy::Coherent && self.coherent_now() {
            Duration::from_secs(86400)
        } else {
            self.timeout
        }
    }

    /// Drops `count` guest references to `id`; a directory the guest no longer holds leaves
    /// the host watch.
    fn forget_inode(&self, id: Inode, count: u64) {
        if let Some(gone) = self.inodes.forget(id, count) {
            if let Some(w) = self.watch.get() {
                w.forget(gone.id);
            }
        }
    }

    /// The file-handle mode in effect.
    pub fn file_handle_mode(&self) -> FileHandleMode {
        self.fh_mode
    }

    /// Inodes kept as file handles, mount descriptors open for them, and handle inodes
    /// holding a cached descriptor (at most [`HANDLE_FD_CACHE`]).
    pub fn file_handle_counts(&self) -> (usize, usize, usize) {
        let (v, _) = self.inodes.export();
        let n = v.iter().filter(|(d, _)| d.handle().is_some()).count();
        let cached = v.iter().filter(|(d, _)| d.fd_cached()).count();
        (n, self.mount_fds.len(), cached)
    }

    /// How a newly found host file (`fd`, an `O_PATH` descriptor, and its `st`) is kept:
    /// its descriptor, or its file handle (see [`FileHandleMode`]).
    fn inode_file(&self, fd: OwnedFd, st: &libc::statx) -> io::Result<InodeFile> {
        let mode = self.fh_mode;
        // An unlinked file (O_TMPFILE) keeps its descriptor in prefer mode: nothing could
        // open its handle once the guest closes it, and it has no name to look up again.
        if mode == FileHandleMode::Never || (mode == FileHandleMode::Prefer && st.stx_nlink == 0) {
            return Ok(InodeFile::Fd(fd));
        }
        let (handle, mnt) = match fhandle::name_to_handle(fd.as_fd()) {
            Ok(h) => h,
            Err(e) if mode == FileHandleMode::Prefer && fhandle::unsupported(&e) => {
                log::debug!("no file handle ({e}): keeping a descriptor");
                return Ok(InodeFile::Fd(fd));
            }
            Err(e) => {
                log::warn!("no file handle for a file on mount {}: {e}", key_of(st).mnt);
                return Err(e);
            }
        };
        let mount = match self.mount_fds.get(mnt) {
            Some(m) => m,
            // A new mount: its first inode the guest reaches is normally its root
            // directory, which becomes the mount descriptor. Other files are never opened
            // for that (a device node must not be).
            None if u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFDIR => {
                self.mount_fds.insert(
                    mnt,
                    sys::openat(fd.as_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?,
                )
            }
            None if mode == FileHandleMode::Prefer => return Ok(InodeFile::Fd(fd)),
            None => {
                log::warn!("no mount descriptor for mount {mnt} (a file bind mount?)");
                return Err(err(libc::EOPNOTSUPP));
            }
        };
        Ok(InodeFile::Handle {
            handle,
            mount,
            open: Default::default(),
            cache: self.fd_cache.clone(),
        })
    }

    /// The configuration this filesystem was built with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Inodes currently known to the guest (the root included).
    pub fn inode_count(&self) -> usize {
        self.inodes.len()
    }

    /// Lookup count of guest inode `inode` (0 when unknown).
    pub fn lookup_count(&self, inode: Inode) -> u64 {
        self.inodes.refs(inode)
    }

    /// Open handles.
    pub fn handle_count(&self) -> usize {
        self.handles.len()
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.cfg.readonly {
            Err(err(libc::EROFS))
        } else {
            Ok(())
        }
    }

    fn inode(&self, id: Inode) -> io::Result<Arc<InodeData>> {
        self.inodes.get(id)
    }

    /// Whether the host close of inode `id`'s file may write data back (a FLUSH may take
    /// long): `true` unless its file system is one of [`CLOSE_WRITES_NOTHING`], asked once
    /// per host device with `fstatfs`.
    pub(super) fn do_flush_writes_back(&self, id: Inode) -> bool {
        let Ok(data) = self.inode(id) else {
            return true;
        };
        let dev = data.key.dev;
        if let Some(&b) = self
            .flush_by_dev
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&dev)
        {
            return b;
        }
        let Ok(fd) = data.fd() else {
            return true;
        };
        // `f_type`'s type differs between architectures (i64 here).
        #[allow(clippy::unnecessary_cast)]
        let b = sys::fstatfs(fd.as_fd()).map_or(true, |st| {
            !CLOSE_WRITES_NOTHING.contains(&(st.f_type as i64))
        });
        let mut known = self.flush_by_dev.write().unwrap_or_else(|e| e.into_inner());
        if known.len() < FLUSH_BY_DEV_MAX {
            known.insert(dev, b);
        }
        b
    }

    /// Inode `id`, which must be a directory.
    fn dir_inode(&self, id: Inode) -> io::Result<Arc<InodeData>> {
        let data = self.inodes.get(id)?;
        if !data.is_dir() {
            return Err(err(libc::ENOTDIR));
        }
        Ok(data)
    }

    /// `open_flags` for a handle of inode `id` opened with host flags `hflags`, under the
    /// cache policy.
    ///
    /// `NOFLUSH` where FLUSH has nothing to do: the guest's `close` then sends none, one
    /// round trip less per file read (`cat`, compilers, `git status`) or written (`tar x`,
    /// `cp`). FLUSH's work on the host is the `close` of a duplicate of the handle's
    /// descriptor. For a read-only handle that writes nothing anywhere (NFS flushes writers
    /// only). For a writer it writes nothing on a file system without a `flush` operation
    /// ([`CLOSE_WRITES_NOTHING`]), and every byte of the guest's `write` calls reached the
    /// host file before their replies; the guest's dirty `mmap` pages still go out on
    /// `munmap` and on write-back, as a local file system's do, and RELEASE (synchronous on
    /// virtio-fs) is a DAX sync point as FLUSH was. Not with `--posix-lock`: FLUSH carries
    /// the closing owner, whose POSIX locks on the host end there. Not under the guest's
    /// writeback cache (Linux flushes then anyway). libfuse's `passthrough_hp` does the same
    /// for read-only handles.
    fn file_open_flags(&self, id: Inode, hflags: libc::c_int) -> u32 {
        let cache = match self.cfg.cache {
            CachePolicy::Never | CachePolicy::Metadata => fopen::DIRECT_IO,
            CachePolicy::Auto => 0,
            CachePolicy::Always => fopen::KEEP_CACHE,
            CachePolicy::Coherent if self.coherent_now() => fopen::KEEP_CACHE,
            CachePolicy::Coherent => 0,
        };
        if self.cfg.posix_lock || self.negotiated.writeback.load(Ordering::Relaxed) {
            return cache;
        }
        let read_only = hflags & libc::O_ACCMODE == libc::O_RDONLY;
        if read_only || !self.do_flush_writes_back(id) {
            cache | fopen::NOFLUSH
        } else {
            cache
        }
    }

    /// `open_flags` for a directory handle under the cache policy. Where directory contents
    /// are cached (`always`, `metadata`, as virtiofsd 1.14), KEEP_CACHE too: without it the
    /// guest drops a directory's cached entries at every OPENDIR, so a second `ls -lR` of an
    /// unchanged tree reads every directory again.
    fn dir_open_flags(&self) -> u32 {
        match self.cfg.cache {
            CachePolicy::Never => fopen::DIRECT_IO,
            CachePolicy::Always | CachePolicy::Metadata => fopen::CACHE_DIR | fopen::KEEP_CACHE,
            CachePolicy::Coherent if self.coherent_now() => fopen::CACHE_DIR | fopen::KEEP_CACHE,
            CachePolicy::Auto | CachePolicy::Coherent => 0,
        }
    }

    /// Opens inode `data` for I/O with `flags` (no `O_CREAT`/`O_NOFOLLOW`): directories by
    /// `openat(fd, ".")`, regular files through `/proc/self/fd/N`. Symlinks and special
    /// files are never opened.
    fn reopen(&self, data: &InodeData, flags: libc::c_int) -> io::Result<OwnedFd> {
        let flags = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_NOCTTY);
        match data.kind {
            libc::S_IFDIR | libc::S_IFREG if data.handle().is_some() => {
                let dir = if data.is_dir() { libc::O_DIRECTORY } else { 0 };
                match data.open_handle(flags | dir) {
                    Some(r) => r,
                    None => Err(err(libc::EBADF)),
                }
            }
            libc::S_IFDIR => sys::openat(data.fd()?.as_fd(), c".", flags | libc::O_DIRECTORY, 0),
            libc::S_IFREG => sys::openat(
                self.proc_self_fd.as_fd(),
                &fd_name(data.fd()?.as_fd()),
                flags,
                0,
            ),
            libc::S_IFLNK => Err(err(libc::ELOOP)),
            _ => Err(err(libc::EPERM)),
        }
    }

    /// An `O_PATH` descriptor of the file behind an open descriptor.
    fn path_fd_of(&self, fd: BorrowedFd) -> io::Result<OwnedFd> {
        sys::openat(self.proc_self_fd.as_fd(), &fd_name(fd), libc::O_PATH, 0)
    }

    /// Registers `path_fd` (an `O_PATH` descriptor) as a reference the guest now holds, and
    /// builds its entry. `parent_mnt` is the mount id of the directory it was found in.
    fn register(&self, path_fd: OwnedFd, parent_mnt: u64) -> io::Result<Entry> {
        let st = stat_fd(path_fd.as_fd())?;
        let key = key_of(&st);
        let kind = u32::from(st.stx_mode) & libc::S_IFMT;
        if let Some(data) = self.inodes.ref_existing(&key) {
            // A descriptor inode pins its file, so the key names it. A handle inode does
            // not: its inode number may have been reused by a new file since, which the
            // handle (it holds the generation) tells apart.
            let same = match data.handle() {
                None => true,
                Some(h) => fhandle::name_to_handle(path_fd.as_fd()).is_ok_and(|(now, _)| now == *h),
            };
            if same {
                return Ok(self.entry_of(&data, &st, parent_mnt));
            }
            self.forget_inode(data.id, 1);
        }
        let file = self.inode_file(path_fd, &st)?;
        let data = self.inodes.insert_or_ref(key, file, kind)?;
        if let Some(w) = self.watch.get() {
            w.note(&data);
        }
        Ok(self.entry_of(&data, &st, parent_mnt))
    }

    /// Attributes as the guest sees them (`--translate-uid/gid`: host ids to guest ids).
    fn guest_attr(&self, st: &libc::statx) -> Attr {
        let mut a = attr_of(st);
        a.uid = self.cfg.uid_map.to_guest(a.uid);
        a.gid = self.cfg.gid_map.to_guest(a.gid);
        a
    }

    /// The caller's ids on the host (`--translate-uid/gid`); EPERM for a forbidden id.
    fn host_ctx(&self, ctx: &Context) -> io::Result<Context> {
        match (
            self.cfg.uid_map.to_host(ctx.uid),
            self.cfg.gid_map.to_host(ctx.gid),
        ) {
            (Some(uid), Some(gid)) => Ok(Context {
                uid,
                gid,
                pid: ctx.pid,
            }),
            _ => Err(err(libc::EPERM)),
        }
    }

    fn entry_of(&self, data: &InodeData, st: &libc::statx, parent_mnt: u64) -> Entry {
        let mut attr = self.guest_attr(st);
        if self.negotiated.submounts.load(Ordering::Relaxed)
            && data.is_dir()
            && data.key.mnt != parent_mnt
        {
            attr.flags |= attr_flags::SUBMOUNT;
        }
        Entry {
            inode: data.id,
            generation: 0,
            attr,
            attr_timeout: self.timeout(),
            entry_timeout: self.timeout(),
        }
    }

    /// The INIT flags this configuration wants (what [`FileSystem::init`] asks for; also what
    /// a migrated session may have agreed).
    ///
    /// [`FileSystem::init`]: crate::protocol::filesystem::FileSystem::init
    /// After the tables were replaced (a migration's import, a restart's take-back): the
    /// guest's directories, by the ids it knows, are watched again, and, since host changes
    /// meanwhile went unseen, the guest drops what it caches once, with its first
    /// notification.
    fn watch_tables_again(&self) {
        if let Some(w) = self.watch.get() {
            w.clear();
            let (all, _) = self.inodes.export();
            for (data, _) in all {
                w.note(&data);
            }
        }
        if let Some(n) = self.notifier.get() {
            n.mark_stale();
        }
    }

    /// Applies the INIT flags agreed with the guest (`agreed`: what it offered of
    /// [`Self::init_wants`]) to how requests are served.
    fn apply_agreed(&self, agreed: u64) {
        use crate::protocol::abi::init_flags as f;
        let n = &self.negotiated;
        n.writeback
            .store(agreed & f::WRITEBACK_CACHE != 0, Ordering::Relaxed);
        n.submounts
            .store(agreed & f::SUBMOUNTS != 0, Ordering::Relaxed);
        n.killpriv_v2
            .store(agreed & f::HANDLE_KILLPRIV_V2 != 0, Ordering::Relaxed);
        let acl = f::POSIX_ACL | f::DONT_MASK;
        n.posix_acl.store(agreed & acl == acl, Ordering::Relaxed);
    }

    pub fn init_wants(&self) -> u64 {
        use crate::protocol::abi::init_flags as f;
        let cfg = &self.cfg;
        // Locks are served only when asked for (virtiofsd's default: the guest keeps them).
        let mut want = 0;
        if cfg.posix_lock {
            want |= f::POSIX_LOCKS;
        }
        if cfg.flock {
            want |= f::FLOCK_LOCKS;
        }
        if cfg.readdirplus && cfg.cache != CachePolicy::Never {
            want |= f::DO_READDIRPLUS | f::READDIRPLUS_AUTO;
        }
        if cfg.writeback {
            want |= f::WRITEBACK_CACHE;
        }
        if cfg.announce_submounts {
            want |= f::SUBMOUNTS;
        }
        if cfg.killpriv_v2 {
            want |= f::HANDLE_KILLPRIV_V2;
        }
        if cfg.posix_acl {
            // The guest must leave the umask to us: a default ACL replaces it.
            want |= f::POSIX_ACL | f::DONT_MASK;
        }
        if cfg.security_label {
            want |= f::SECURITY_CTX;
        }
        if cfg.allow_mmap && cfg.cache == CachePolicy::Never {
            want |= f::DIRECT_IO_ALLOW_MMAP;
        }
        want
    }

    /// Whether directory `dir` lies inside the shared directory: its `..` chain reaches the
    /// root (rather than the top of the host's tree, or more than [`MAX_DEPTH`] levels).
    /// Whatever the sandbox: under `chroot`/`none` a directory a host user moved out of the
    /// share, or one named by a forged file handle, has host directories above it.
    ///
    /// Four system calls at any depth: the kernel's path of the root and of `dir`
    /// (`/proc/self/fd`) give the depth `d` of `dir` below the root, and one `statx` of
    /// `../` x `d` from `dir` shows whether that ancestor is the root. The path is only a
    /// hint (in a sandbox a directory outside reads like one inside, and a rename can race):
    /// the `..` chain decides, and where the hint does not lead to the root the chain is
    /// walked level by level (one `statx` per level; a LOOKUP paid that at every depth, a
    /// quadratic number of bytes walked, ~1,300 calls at the deepest).
    fn dir_inside_share(&self, dir: BorrowedFd) -> io::Result<bool> {
        let root = self.inodes.get(Inode::ROOT)?;
        inside_syscall();
        let key = key_of(&stat_fd(dir)?);
        if key == root.key {
            return Ok(true);
        }
        if let Some(d) = self.depth_below_root(&root, dir) {
            if d > MAX_DEPTH {
                return Ok(false);
            }
            let up = CString::new(b"../".repeat(d)).map_err(|_| err(libc::EINVAL))?;
            inside_syscall();
            let k = key_of(&sys::statx(
                dir,
                &up,
                libc::AT_SYMLINK_NOFOLLOW,
                STATX_MASK,
            )?);
            if k == root.key {
                return Ok(true);
            }
        }
        self.walk_to_root(dir, key, root.key)
    }

    /// How many levels below the root directory `dir` is, by the kernel's paths of both
    /// (`None` when either cannot be read or `dir`'s does not start with the root's).
    fn depth_below_root(&self, root: &InodeData, dir: BorrowedFd) -> Option<usize> {
        let root_fd = root.fd().ok()?;
        inside_syscall();
        let r = sys::readlinkat(self.proc_self_fd.as_fd(), &fd_name(root_fd.as_fd())).ok()?;
        inside_syscall();
        let p = sys::readlinkat(self.proc_self_fd.as_fd(), &fd_name(dir)).ok()?;
        if r.ends_with(b" (deleted)") || p.ends_with(b" (deleted)") {
            return None;
        }
        let rel = if r == b"/" {
            p.strip_prefix(b"/")?
        } else {
            p.strip_prefix(r.as_slice())?.strip_prefix(b"/")?
        };
        if rel.is_empty() {
            return None;
        }
        Some(rel.iter().filter(|&&b| b == b'/').count() + 1)
    }

    /// [`Self::dir_inside_share`] the long way: one `statx` per level of `..`, `../..`, ...:
    /// the kernel walks the dots in its dentry cache (no descriptor opened per level).
    fn walk_to_root(&self, dir: BorrowedFd, mut key: InodeKey, root: InodeKey) -> io::Result<bool> {
        let mut path: Vec<u8> = Vec::with_capacity(64);
        for _ in 0..MAX_DEPTH {
            if key == root {
                return Ok(true);
            }
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(b"..");
            let name = CString::new(path.as_slice()).map_err(|_| err(libc::EINVAL))?;
            inside_syscall();
            let k = key_of(&sys::statx(
                dir,
                &name,
                libc::AT_SYMLINK_NOFOLLOW,
                STATX_MASK,
            )?);
            if k == key {
                // The top of this process's tree: `..` is the directory itself.
                return Ok(false);
            }
            key = k;
        }
        Ok(false)
    }

    /// LOOKUP and READDIRPLUS take new host inodes into the session only from a directory
    /// inside the share: `ENOENT` for one a host user moved out (its `..` chain no longer
    /// reaches the root). The root itself needs no walk.
    fn check_inside(&self, dir: &InodeData) -> io::Result<()> {
        if dir.id == Inode::ROOT || !dir.is_dir() {
            return Ok(());
        }
        if self.dir_inside_share(dir.fd()?.as_fd())? {
            return Ok(());
        }
        log::warn!(
            "inode {}: no longer inside the shared directory (moved on the host?); lookups in it fail with ENOENT",
            dir.id
        );
        Err(err(libc::ENOENT))
    }

    /// Looks `name` up in directory `parent` and takes a reference to it.
    fn do_lookup(&self, parent: &InodeData, name: &CStr) -> io::Result<Entry> {
        let b = name.to_bytes();
        if b.is_empty() || b.contains(&b'/') {
            return Err(err(libc::EINVAL));
        }
        if !parent.is_dir() {
            return Err(err(libc::ENOTDIR));
        }
        let same = |id: Inode| -> io::Result<Entry> {
            let data = self.inodes.add_ref(id)?;
            let st = stat_fd(data.fd()?.as_fd())?;
            Ok(self.entry_of(&data, &st, parent.key.mnt))
        };
        if b == b"." || (b == b".." && parent.id == Inode::ROOT) {
            // The directory itself: never the root's host parent.
            return same(parent.id);
        }
        let fd = sys::openat(
            parent.fd()?.as_fd(),
            name,
            libc::O_PATH | libc::O_NOFOLLOW,
            0,
        )?;
        if b == b".." && !self.dir_inside_share(fd.as_fd())? {
            // `parent` was moved out of the share by the host: its host parent is not ours
            // to give; the guest's `..` stays at the root.
            log::warn!(
                "LOOKUP .. of inode {}: its host parent is outside the shared directory (moved on the host?); answering the root",
                parent.id
            );
            return same(Inode::ROOT);
        }
        self.register(fd, parent.key.mnt)
    }

    /// Clears suid, and sgid when group-executable, on a regular file (HANDLE_KILLPRIV_V2:
    /// as root we hold `CAP_FSETID`, so the host kernel would not do it for us).
    fn kill_suidgid(&self, fd: BorrowedFd) -> io::Result<()> {
        let st = sys::fstat(fd)?;
        let mode = st.st_mode;
        if mode & libc::S_IFMT != libc::S_IFREG {
            return Ok(());
        }
        let mut kill = 0;
        if mode & libc::S_ISUID != 0 {
            kill |= libc::S_ISUID;
        }
        if mode & libc::S_ISGID != 0 && mode & libc::S_IXGRP != 0 {
            kill |= libc::S_ISGID;
        }
        if kill == 0 {
            return Ok(());
        }
        sys::fchmod(fd, mode & 0o7777 & !kill)
    }
}

#[cfg(test)]
mod flush_tests {
    use super::*;
    use crate::protocol::filesystem::{FileSystem, InitCaps, LockOwner};

    fn served(dir: &std::path::Path, name: &str) -> (PassthroughFs, Inode) {
        let fs = PassthroughFs::new(Config {
            root_dir: dir.to_path_buf(),
            ..Default::default()
        })
        .unwrap();
        fs.init(InitCaps { flags: u64::MAX }).unwrap();
        let name = CString::new(name).unwrap();
        let ino = fs
            .lookup(&Context::default(), Inode::ROOT, &name)
            .unwrap()
            .inode;
        (fs, ino)
    }

    /// A FLUSH may run on the queue's thread only where the host close writes nothing back.
    #[test]
    fn only_a_close_on_a_known_local_file_system_writes_nothing_back() {
        // tmpfs (/dev/shm) has no flush operation.
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        std::fs::write(shm.path().join("f"), b"x").unwrap();
        let (fs, f) = served(shm.path(), "f");
        assert!(!fs.flush_writes_back(f));
        assert!(!fs.flush_writes_back(f), "remembered per device");
        assert!(
            fs.flush_writes_back(Inode::from_raw(999_999)),
            "an unknown inode: the safe answer"
        );
        // procfs is not on the list: taken to write back.
        let (fs, v) = served(std::path::Path::new("/proc"), "version");
        assert!(fs.flush_writes_back(v));
    }

    /// A writer's close sends FLUSH only where the host close may write back.
    #[test]
    fn a_writer_needs_flush_only_where_the_host_close_writes_back() {
        let ctx = Context::default();
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        std::fs::write(shm.path().join("f"), b"x").unwrap();
        let (fs, f) = served(shm.path(), "f");
        for flags in [libc::O_WRONLY, libc::O_RDWR] {
            let (fh, o) = fs.open(&ctx, f, flags as u32, 0).unwrap();
            assert_eq!(o & fopen::NOFLUSH, fopen::NOFLUSH, "tmpfs {flags:#o}");
            fs.release(&ctx, f, fh, false, LockOwner::default())
                .unwrap();
        }
        // Our own /proc/PID/comm: writable, on procfs, which is not on the list. Opened,
        // never written.
        let (fs, pid) = served(
            std::path::Path::new("/proc"),
            &std::process::id().to_string(),
        );
        let comm = fs
            .lookup(&ctx, pid, &CString::new("comm").unwrap())
            .unwrap()
            .inode;
        let (fh, o) = fs.open(&ctx, comm, libc::O_WRONLY as u32, 0).unwrap();
        assert_eq!(o & fopen::NOFLUSH, 0, "procfs writer");
        fs.release(&ctx, comm, fh, false, LockOwner::default())
            .unwrap();
        let (fh, o) = fs.open(&ctx, comm, libc::O_RDONLY as u32, 0).unwrap();
        assert_eq!(o & fopen::NOFLUSH, fopen::NOFLUSH, "procfs reader");
        fs.release(&ctx, comm, fh, false, LockOwner::default())
            .unwrap();
    }
}

#[cfg(test)]
thread_local! {
    /// System calls [`PassthroughFs::dir_inside_share`] made on this thread (tests).
    static INSIDE_SYSCALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts one system call of [`PassthroughFs::dir_inside_share`] (tests only).
fn inside_syscall() {
    #[cfg(test)]
    INSIDE_SYSCALLS.with(|c| c.set(c.get() + 1));
}

#[cfg(test)]
mod inside_tests {
    use super::*;
    use crate::protocol::filesystem::{Context, FileSystem, InitCaps};

    /// A LOOKUP in a directory below the root checks that the directory is still inside the
    /// share: the system calls that check makes, at depth 1 to 1,000, must not grow with the
    /// depth (a guest makes the tree as deep as it likes).
    #[test]
    fn lookup_inside_check_costs_the_same_at_any_depth() {
        let tmp = tempfile::tempdir().unwrap();
        let deepest = 1000;
        let mut p = tmp.path().to_path_buf();
        for _ in 0..=deepest {
            p.push("d");
        }
        std::fs::create_dir_all(&p).unwrap();
        let fs = PassthroughFs::new(Config {
            root_dir: tmp.path().to_path_buf(),
            ..Default::default()
        })
        .unwrap();
        fs.init(InitCaps { flags: u64::MAX }).unwrap();
        let ctx = Context::default();
        let name = CString::new("d").unwrap();
        let mut dir = Inode::ROOT;
        let mut cost = Vec::new();
        for depth in 1..=deepest {
            dir = fs.lookup(&ctx, dir, &name).unwrap().inode;
            if [1, 10, 100, deepest].contains(&depth) {
                INSIDE_SYSCALLS.with(|c| c.set(0));
                fs.lookup(&ctx, dir, &name).unwrap();
                cost.push((depth, INSIDE_SYSCALLS.with(|c| c.get())));
            }
        }
        eprintln!("system calls of the inside check by depth: {cost:?}");
        assert!(
            cost.iter().all(|&(_, c)| c == cost[0].1),
            "the check costs more deeper down: {cost:?}"
        );
        // Moved out of the share by the host (into a directory next to it): lookups in it
        // fail, at the bottom and one level down.
        let away = tempfile::tempdir().unwrap();
        let top = fs.lookup(&ctx, Inode::ROOT, &name).unwrap();
        let second = fs.lookup(&ctx, top.inode, &name).unwrap().inode;
        std::fs::rename(tmp.path().join("d/d"), away.path().join("moved")).unwrap();
        for d in [dir, second] {
            let e = fs.lookup(&ctx, d, &name).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        }
        // Still inside: the first level.
        fs.lookup(&ctx, top.inode, &CString::new("x").unwrap())
            .map(drop)
            .unwrap_or_else(|e| assert_eq!(e.raw_os_error(), Some(libc::ENOENT)));
    }
}
