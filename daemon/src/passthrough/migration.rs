//! Export and import of the passthrough's tables for live migration (see
//! [`crate::migration`]): inodes by path or file handle, handles by inode and open flags.

use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::fhandle;
use super::fhandle::FileHandleBytes;
use super::handle::{HandleData, HandleKind};
use super::inode::{InodeData, InodeKey};
use super::state::{
    check_relative_path, FsState, HandleState, InodeState, Location, MigrationMode,
    MigrationOptions, OnError, MAX_PATH,
};
use super::{err, fd_name, key_of, stat_fd, PassthroughFs, STATX_MASK};
use crate::protocol::filesystem::Inode;
use crate::sys;

/// Most directory entries the fallback path search visits.
const SEARCH_MAX_ENTRIES: usize = 1_000_000;

const NEG_WRITEBACK: u32 = 1 << 0;
const NEG_SUBMOUNTS: u32 = 1 << 1;
const NEG_KILLPRIV_V2: u32 = 1 << 2;
/// POSIX_ACL + DONT_MASK: the guest sends unmasked modes, the daemon applies its umask.
const NEG_POSIX_ACL: u32 = 1 << 3;

/// Open flags that describe a handle (the rest, like `O_CREAT`, only mattered at open).
const HANDLE_FLAGS: i32 = libc::O_ACCMODE
    | libc::O_APPEND
    | libc::O_DIRECT
    | libc::O_NOATIME
    | libc::O_SYNC
    | libc::O_DSYNC;

/// The file handle of the file behind `fd` (not following a symlink).
fn file_handle(fd: BorrowedFd) -> io::Result<FileHandleBytes> {
    fhandle::name_to_handle(fd).map(|(h, _)| h)
}

/// The file handle of inode `data`: the one it is kept as, or a new one.
fn inode_handle(data: &InodeData) -> io::Result<FileHandleBytes> {
    match data.handle() {
        Some(h) => Ok(h.clone()),
        None => file_handle(data.fd()?.as_fd()),
    }
}

/// Opens a file handle (`O_PATH`) on the file system of `mount_fd`.
fn open_handle(mount_fd: BorrowedFd, fh: &FileHandleBytes) -> io::Result<OwnedFd> {
    fhandle::open_handle(mount_fd, fh, libc::O_PATH | libc::O_NOFOLLOW)
}

/// `fcntl(F_GETFL)` of `fd`.
fn status_flags(fd: BorrowedFd) -> io::Result<i32> {
    // SAFETY: F_GETFL only reads the descriptor's status flags.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// An inode opened from the stream.
enum Restored {
    /// Shown to lie inside the shared directory.
    Inside(Arc<InodeData>),
    /// A non-directory opened by file handle that still needs a name inside the share.
    Unconfirmed(Arc<InodeData>),
}

/// The error for a stream entry naming a host file outside the shared directory.
fn outside() -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        "the file handle names a file outside the shared directory",
    )
}

impl PassthroughFs {
    /// The path of `fd` as this process sees it (`/proc/self/fd/N`), `None` when unlinked.
    fn proc_path(&self, fd: BorrowedFd) -> Option<Vec<u8>> {
        let p = sys::readlinkat(self.proc_self_fd.as_fd(), &fd_name(fd)).ok()?;
        (p.first() == Some(&b'/') && !p.ends_with(b" (deleted)")).then_some(p)
    }

    /// The path of inode `data` relative to the shared directory, or `None`.
    fn relative_path(
        &self,
        root: &[u8],
        data: &InodeData,
        opts: &MigrationOptions,
    ) -> Option<Vec<u8>> {
        let p = self.proc_path(data.fd().ok()?.as_fd())?;
        let rel = if root == b"/" {
            p.get(1..)?
        } else {
            p.strip_prefix(root)?.strip_prefix(b"/")?
        };
        check_relative_path(rel).ok()?;
        if opts.confirm_paths {
            // Make sure the path names this very file right now.
            let fd = self.open_path(rel).ok()?;
            if key_of(&stat_fd(fd.as_fd()).ok()?) != data.key {
                return None;
            }
        }
        Some(rel.to_vec())
    }

    /// Walks the shared directory breadth-first (never following a symlink, at most
    /// [`SEARCH_MAX_ENTRIES`] entries, paths up to `PATH_MAX`) for the host files in
    /// `wanted`; returns the first path found for each inode. Directories are reopened by
    /// path when their turn comes, so the walk holds two descriptors at a time.
    fn search_paths(&self, wanted: &HashMap<InodeKey, Inode>) -> HashMap<Inode, Vec<u8>> {
        let mut found = HashMap::new();
        let mut queue: VecDeque<Vec<u8>> = VecDeque::from([Vec::new()]);
        let mut visited = 0usize;
        let mut buf = vec![0u8; 16 * 1024];
        while let Some(prefix) = queue.pop_front() {
            let dir = if prefix.is_empty() {
                self.inodes.get(Inode::ROOT).and_then(|r| {
                    sys::openat(r.fd()?.as_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)
                })
            } else {
                self.open_path(&prefix).and_then(|p| {
                    sys::openat(p.as_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)
                })
            };
            let Ok(dir) = dir else { continue };
            loop {
                let n = match sys::getdents64(dir.as_fd(), &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n.min(buf.len()),
                };
                let mut off = 0;
                // linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name (NUL-terminated).
                while off + 20 <= n {
                    let reclen = usize::from(u16::from_ne_bytes([buf[off + 16], buf[off + 17]]));
                    if reclen < 20 || off + reclen > n {
                        break;
                    }
                    let rec = &buf[off + 19..off + reclen];
                    off += reclen;
                    let Ok(name) = CStr::from_bytes_until_nul(rec) else {
                        continue;
                    };
                    let nb = name.to_bytes();
                    if nb.is_empty() || nb == b"." || nb == b".." {
                        continue;
                    }
                    visited += 1;
                    if visited > SEARCH_MAX_ENTRIES {
                        log::warn!(
                            "migration: path search stopped after {SEARCH_MAX_ENTRIES} entries"
                        );
                        return found;
                    }
                    let mut path = prefix.clone();
                    if !path.is_empty() {
                        path.push(b'/');
                    }
                    path.extend_from_slice(nb);
                    if path.len() > MAX_PATH {
                        continue;
                    }
                    let Ok(st) =
                        sys::statx(dir.as_fd(), name, libc::AT_SYMLINK_NOFOLLOW, STATX_MASK)
                    else {
                        continue;
                    };
                    if let Some(&id) = wanted.get(&key_of(&st)) {
                        found.entry(id).or_insert_with(|| path.clone());
                        if found.len() == wanted.len() {
                            return found;
                        }
                    }
                    if u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFDIR {
                        queue.push_back(path);
                    }
                }
            }
        }
        found
    }

    /// Opens relative path `rel` below the shared directory one component at a time, never
    /// following a symlink, as an `O_PATH` descriptor.
    fn open_path(&self, rel: &[u8]) -> io::Result<OwnedFd> {
        check_relative_path(rel)?;
        let root = self.inodes.get(Inode::ROOT)?;
        let root = root.fd()?;
        let mut cur: Option<OwnedFd> = None;
        for comp in rel.split(|&b| b == b'/') {
            let name = CString::new(comp).map_err(|_| err(libc::EINVAL))?;
            let dir = cur.as_ref().map_or(root.as_fd(), |f| f.as_fd());
            cur = Some(sys::openat(dir, &name, libc::O_PATH | libc::O_NOFOLLOW, 0)?);
        }
        cur.ok_or_else(|| err(libc::EINVAL))
    }

    /// The migration state of the tables (called with every vring stopped).
    pub fn export_state(&self, opts: &MigrationOptions) -> io::Result<FsState> {
        let (inodes, next_inode) = self.inodes.export();
        let root = self.inodes.get(Inode::ROOT)?;
        let root_path = self.proc_path(root.fd()?.as_fd());
        let mut out = Vec::with_capacity(inodes.len());
        // find-paths: inodes /proc/self/fd gave no usable path for, by host identity.
        let mut unnamed: HashMap<InodeKey, Inode> = HashMap::new();
        for (data, refs) in &inodes {
            let location = if data.id == Inode::ROOT {
                Location::Root
            } else {
                match opts.mode {
                    MigrationMode::FindPaths => match root_path
                        .as_deref()
                        .and_then(|r| self.relative_path(r, data, opts))
                    {
                        Some(p) => Location::Path(p),
                        None => {
                            unnamed.insert(data.key, data.id);
                            Location::Lost
                        }
                    },
                    MigrationMode::FileHandles => match inode_handle(data) {
                        Ok(h) => Location::Handle(h),
                        Err(e) => {
                            log::warn!("migration: no file handle for inode {}: {e}", data.id);
                            Location::Lost
                        }
                    },
                }
            };
            out.push(InodeState {
                id: data.id,
                refs: *refs,
                generation: 0,
                kind: data.kind,
                location,
                verify: None,
            });
        }
        if !unnamed.is_empty() {
            // As virtiofsd: fall back to walking the shared directory (finds, e.g., another
            // hard link of a file whose guest-visible name was unlinked).
            let found = self.search_paths(&unnamed);
            log::info!(
                "migration: searched the shared directory for {} inode(s), found {}",
                unnamed.len(),
                found.len()
            );
            for i in &mut out {
                if let Some(p) = found.get(&i.id) {
                    i.location = Location::Path(p.clone());
                }
            }
        }
        let by_id: HashMap<Inode, &Arc<InodeData>> =
            inodes.iter().map(|(d, _)| (d.id, d)).collect();
        let mut lost = 0usize;
        for i in &mut out {
            match &i.location {
                Location::Lost => {
                    lost += 1;
                    log::warn!(
                        "migration: inode {} cannot be named for the destination (unlinked or moved?)",
                        i.id
                    );
                }
                Location::Path(_) if opts.verify_handles => {
                    if let Some(data) = by_id.get(&i.id) {
                        i.verify = inode_handle(data)
                            .inspect_err(|e| {
                                log::warn!("migration: no file handle for inode {}: {e}", i.id)
                            })
                            .ok();
                    }
                }
                _ => {}
            }
        }
        out.sort_by_key(|i| i.id);
        let (handles, next_handle) = self.handles.export();
        let mut hs = Vec::with_capacity(handles.len());
        for (fh, h) in handles {
            let dir = matches!(h.kind, HandleKind::Dir { .. });
            let flags = if dir {
                libc::O_RDONLY
            } else {
                status_flags(h.fd())? & HANDLE_FLAGS
            };
            hs.push(HandleState {
                fh,
                inode: h.inode,
                dir,
                flags: flags as u32,
            });
        }
        hs.sort_by_key(|h| h.fh);
        let n = &self.negotiated;
        let mut negotiated = 0;
        for (on, bit) in [
            (&n.writeback, NEG_WRITEBACK),
            (&n.submounts, NEG_SUBMOUNTS),
            (&n.killpriv_v2, NEG_KILLPRIV_V2),
            (&n.posix_acl, NEG_POSIX_ACL),
        ] {
            if on.load(Ordering::Relaxed) {
                negotiated |= bit;
            }
        }
        if lost > 0 {
            log::warn!("migration: {lost} inode(s) sent without a location");
        }
        Ok(FsState {
            negotiated,
            next_inode,
            next_handle,
            inodes: out,
            handles: hs,
        })
    }

    /// Finds and checks one inode of the stream. A file handle is a pointer anywhere into the
    /// shared directory's file system, so what it opens must be shown to lie inside the
    /// share: a directory by its `..` chain; a non-directory by its path as the kernel knows
    /// it (`/proc/self/fd`) naming it from the root, else it comes back as `Unconfirmed` for
    /// one search of the share ([`Self::import_state`]).
    fn restore_inode(
        &self,
        i: &InodeState,
        opts: &MigrationOptions,
        root_path: Option<&[u8]>,
    ) -> io::Result<Restored> {
        let root = self.inodes.get(Inode::ROOT)?;
        let by_handle = matches!(i.location, Location::Handle(_));
        let fd = match &i.location {
            Location::Path(p) => self.open_path(p)?,
            Location::Handle(_) if opts.mode != MigrationMode::FileHandles => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a file handle entry, but this daemon migrates in find-paths mode (--migration-mode)",
                ))
            }
            Location::Handle(h) => {
                // open_by_handle_at refuses an O_PATH descriptor as the mount descriptor.
                let mount = sys::openat(
                    root.fd()?.as_fd(),
                    c".",
                    libc::O_RDONLY | libc::O_DIRECTORY,
                    0,
                )?;
                open_handle(mount.as_fd(), h).map_err(|e| {
                    if e.raw_os_error() == Some(libc::EPERM) {
                        io::Error::new(
                            e.kind(),
                            format!("{e}: opening file handles needs CAP_DAC_READ_SEARCH (run as root with --modcaps=+dac_read_search)"),
                        )
                    } else {
                        e
                    }
                })?
            }
            Location::Lost => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "the source could not name it (unlinked or moved)",
                ))
            }
            Location::Root => return Err(err(libc::EINVAL)),
        };
        let st = stat_fd(fd.as_fd())?;
        let kind = u32::from(st.stx_mode) & libc::S_IFMT;
        if kind != i.kind {
            return Err(io::Error::other(format!(
                "file type {kind:#o} where the source had {:#o}",
                i.kind
            )));
        }
        if let Some(want) = &i.verify {
            let have = file_handle(fd.as_fd())?;
            if &have != want {
                return Err(io::Error::other(
                    "file handle differs from the source's (the path names another file)",
                ));
            }
        }
        let confirmed = !by_handle
            || if kind == libc::S_IFDIR {
                if !self.dir_inside_share(fd.as_fd())? {
                    return Err(outside());
                }
                true
            } else {
                root_path.is_some_and(|r| self.relative_path_of(r, fd.as_fd()).is_some())
            };
        let data = Arc::new(InodeData {
            id: i.id,
            key: key_of(&st),
            file: self.inode_file(fd, &st)?,
            kind,
            dax_fd: std::sync::Mutex::default(),
        });
        Ok(if confirmed {
            Restored::Inside(data)
        } else {
            Restored::Unconfirmed(data)
        })
    }

    /// The path of the file behind `fd` relative to the shared directory (`root`: the root's
    /// own path as `/proc/self/fd` gives it), checked to name this very file now.
    ///
    /// An unlinked file (still open on this host, e.g. by the source daemon) cannot be named
    /// now; it passes when the directory it was last linked in, as the kernel remembers it,
    /// is inside the share by that path, and only when the share is not this process's root
    /// (`--sandbox none`). Where it is (`chroot`, `namespace`), the kernel shows a file that
    /// the root does not reach by its path from the file system's root or the host's, with
    /// nothing to tell it from a path inside the share: `/tmp/x (deleted)` outside reads the
    /// same as `tmp/x` once was inside. Such a file is refused like any other the share does
    /// not name.
    fn relative_path_of(&self, root: &[u8], fd: BorrowedFd) -> Option<Vec<u8>> {
        let p = sys::readlinkat(self.proc_self_fd.as_fd(), &fd_name(fd)).ok()?;
        let st = stat_fd(fd).ok()?;
        let (p, deleted) = match p.strip_suffix(b" (deleted)") {
            Some(p) if st.stx_nlink == 0 => (p, true),
            _ => (&p[..], false),
        };
        if deleted && root == b"/" {
            log::warn!(
                "migration: an unlinked file by file handle cannot be placed inside the share \
                 from its old path {:?} while the share is the daemon's root (sandbox)",
                String::from_utf8_lossy(p)
            );
            return None;
        }
        let rel = if root == b"/" {
            p.strip_prefix(b"/")?
        } else {
            p.strip_prefix(root)?.strip_prefix(b"/")?
        };
        check_relative_path(rel).ok()?;
        if deleted {
            // Its last directory: below the root by a plain path, or the root itself (the
            // root's own path, not "/", was stripped above: it named the share).
            return match rel.iter().rposition(|&b| b == b'/') {
                Some(n) => self.open_path(&rel[..n]).ok().map(|_| rel.to_vec()),
                None => Some(rel.to_vec()),
            };
        }
        let named = self.open_path(rel).ok()?;
        (key_of(&stat_fd(named.as_fd()).ok()?) == key_of(&st)).then(|| rel.to_vec())
    }

    /// Replaces the tables with a migrated state. With `OnError::Abort` any inode or handle
    /// that cannot be restored refuses the whole state and leaves the tables untouched; with
    /// `OnError::GuestError` it is left out (the guest then gets `EBADF` for it) and the
    /// rest is installed. Returns how many inodes and handles were left out.
    pub fn import_state(
        &self,
        state: &FsState,
        opts: &MigrationOptions,
    ) -> io::Result<(usize, usize)> {
        let mut offered = 0;
        for (on, bit) in [
            (self.cfg.writeback, NEG_WRITEBACK),
            (self.cfg.announce_submounts, NEG_SUBMOUNTS),
            (self.cfg.killpriv_v2, NEG_KILLPRIV_V2),
            (self.cfg.posix_acl, NEG_POSIX_ACL),
        ] {
            if on {
                offered |= bit;
            }
        }
        if state.negotiated & !offered != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the migrated state agrees features {:#x} this daemon is not configured for (it offers {offered:#x})",
                    state.negotiated & !offered
                ),
            ));
        }
        let root = self.inodes.get(Inode::ROOT)?;
        let root_path = self.proc_path(root.fd()?.as_fd());
        let mut inodes = Vec::with_capacity(state.inodes.len());
        let mut failed = 0usize;
        let mut results = Vec::with_capacity(state.inodes.len());
        let mut unconfirmed: HashMap<InodeKey, Inode> = HashMap::new();
        for i in &state.inodes {
            if i.id == Inode::ROOT {
                results.push(Ok(Restored::Inside(root.clone())));
                continue;
            }
            let r = self.restore_inode(i, opts, root_path.as_deref());
            if let Ok(Restored::Unconfirmed(d)) = &r {
                unconfirmed.insert(d.key, d.id);
            }
            results.push(r);
        }
        // Non-directories by file handle the kernel gave no path inside the share for: one
        // walk of the share looks for a name of each (at most SEARCH_MAX_ENTRIES entries).
        let found = if unconfirmed.is_empty() {
            HashMap::new()
        } else {
            self.search_paths(&unconfirmed)
        };
        for (i, r) in state.inodes.iter().zip(results) {
            let r = match r {
                Ok(Restored::Inside(d)) => Ok(d),
                Ok(Restored::Unconfirmed(d)) if found.contains_key(&d.id) => Ok(d),
                Ok(Restored::Unconfirmed(_)) => Err(outside()),
                Err(e) => Err(e),
            };
            match r {
                Ok(data) => inodes.push((data, i.refs)),
                Err(e) => {
                    let what = match &i.location {
                        Location::Path(p) => format!("path {:?}", String::from_utf8_lossy(p)),
                        Location::Handle(_) => "file handle".to_string(),
                        _ => "no location".to_string(),
                    };
                    if opts.on_error == OnError::Abort {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("inode {} ({what}): {e}", i.id),
                        ));
                    }
                    log::warn!(
                        "migration: inode {} ({what}) not restored: {e}; the guest gets errors for it",
                        i.id
                    );
                    failed += 1;
                }
            }
        }
        let by_id: std::collections::HashMap<Inode, &Arc<InodeData>> =
            inodes.iter().map(|(d, _)| (d.id, d)).collect();
        let mut handles = Vec::with_capacity(state.handles.len());
        let mut failed_handles = 0usize;
        for h in &state.handles {
            let r = match by_id.get(&h.inode) {
                None => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "its inode was not restored",
                )),
                Some(data) if h.dir != data.is_dir() => Err(err(libc::EINVAL)),
                Some(data) if h.dir => self
                    .reopen(data, libc::O_RDONLY)
                    .map(|fd| HandleData::dir(h.inode, fd)),
                Some(data) => {
                    let flags = (h.flags as i32) & HANDLE_FLAGS;
                    self.reopen(data, flags | libc::O_CLOEXEC)
                        .map(|fd| HandleData::file(h.inode, fd, flags))
                }
            };
            match r {
                Ok(d) => handles.push((h.fh, d)),
                Err(e) if opts.on_error == OnError::Abort => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("handle {} of inode {}: {e}", h.fh, h.inode),
                    ))
                }
                Err(e) => {
                    log::warn!(
                        "migration: handle {} of inode {} not restored: {e}",
                        h.fh,
                        h.inode
                    );
                    failed_handles += 1;
                }
            }
        }
        drop(by_id);
        let n = &self.negotiated;
        n.writeback
            .store(state.negotiated & NEG_WRITEBACK != 0, Ordering::Relaxed);
        n.submounts
            .store(state.negotiated & NEG_SUBMOUNTS != 0, Ordering::Relaxed);
        n.killpriv_v2
            .store(state.negotiated & NEG_KILLPRIV_V2 != 0, Ordering::Relaxed);
        n.posix_acl
            .store(state.negotiated & NEG_POSIX_ACL != 0, Ordering::Relaxed);
        self.inodes.replace(inodes, state.next_inode);
        // Host changes between the source's last event and our first went unseen.
        self.watch_tables_again();
        self.handles.replace(handles, state.next_handle);
        Ok((failed, failed_handles))
    }
}

impl crate::protocol::state::SerializableFileSystem for PassthroughFs {
    type State = FsState;
    type Options = MigrationOptions;

    fn save_state(&self, opts: &MigrationOptions) -> io::Result<FsState> {
        self.export_state(opts)
    }

    fn load_state(&self, state: &FsState, opts: &MigrationOptions) -> io::Result<()> {
        let (inodes, handles) = self.import_state(state, opts)?;
        if inodes + handles > 0 {
            log::warn!(
                "migration: {inodes} inode(s) and {handles} handle(s) could not be restored; the guest gets errors for them (--migration-on-error=guest-error)"
            );
        }
        Ok(())
    }

    fn init_wants(&self) -> u64 {
        PassthroughFs::init_wants(self)
    }
}

#[cfg(test)]
#[path = "migration_tests.rs"]
mod tests;
