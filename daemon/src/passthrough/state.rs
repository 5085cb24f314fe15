//! The passthrough's migratable state: the tables that move with a guest's FUSE session
//! (every inode the guest holds and every open handle), the options that say how inodes are
//! named (`--migration-*`), and their part of the device-state stream (see
//! [`crate::migration::format`] for the frame and the layout).

use std::io;

use super::fhandle::FileHandleBytes;
use crate::migration::format::{bad, Codec, Dec, Enc};
use crate::protocol::filesystem::{Handle, Inode};

/// Most inodes a stream may carry.
pub const MAX_INODES: usize = 1 << 20;
/// Most open handles a stream may carry.
pub const MAX_HANDLES: usize = 1 << 20;
/// Longest path (bytes) of one inode inside the shared directory.
pub const MAX_PATH: usize = libc::PATH_MAX as usize;

/// How the source tells the destination where each inode is (`--migration-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigrationMode {
    /// The inode's path inside the shared directory (works across file systems; brittle if
    /// files are renamed behind the daemon's back or unlinked while open).
    #[default]
    FindPaths,
    /// A file handle (`name_to_handle_at`): the same file system on both sides, and
    /// `CAP_DAC_READ_SEARCH` on the destination; survives renames and unlinked open files.
    FileHandles,
}

/// What the destination does with an inode it cannot restore (`--migration-on-error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Refuse the whole state: QEMU's migration fails and the source guest runs on.
    #[default]
    Abort,
    /// Accept the state; the inodes (and their handles) that could not be restored return
    /// errors to the guest (EIO), everything else works.
    GuestError,
}

/// Migration options, with virtiofsd 1.14's meanings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MigrationOptions {
    pub mode: MigrationMode,
    pub on_error: OnError,
    /// find-paths: the source adds a file handle for each path, the destination checks the
    /// file it opened has that handle (catches a path that now names another file).
    pub verify_handles: bool,
    /// find-paths: the source checks each path it found names the inode (and searches the
    /// shared directory for the right one when not).
    pub confirm_paths: bool,
}

/// Where the destination finds an inode's host file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// The shared directory itself (inode 1 only).
    Root,
    /// A relative path inside the shared directory, components separated by `/`.
    Path(Vec<u8>),
    /// A file handle on the shared directory's file system.
    Handle(FileHandleBytes),
    /// The source found no way to name it (e.g. unlinked while open, in find-paths mode).
    Lost,
}

/// One inode the guest holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeState {
    pub id: Inode,
    pub refs: u64,
    pub generation: u64,
    /// `S_IFMT` bits.
    pub kind: u32,
    pub location: Location,
    /// `--migration-verify-handles`: the file handle the destination must find there.
    pub verify: Option<FileHandleBytes>,
}

/// One open handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleState {
    pub fh: Handle,
    pub inode: Inode,
    pub dir: bool,
    /// `open(2)` flags to reopen it with (access mode, `O_APPEND`, `O_DIRECT`, ...).
    pub flags: u32,
}

/// The passthrough file system's tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsState {
    /// Features agreed in INIT that change the filesystem's behaviour (bit set of the
    /// passthrough's own flags).
    pub negotiated: u32,
    pub next_inode: Inode,
    pub next_handle: Handle,
    pub inodes: Vec<InodeState>,
    pub handles: Vec<HandleState>,
}

/// Checks that a path from the stream is a relative path of plain components (no `..`,
/// no `.`, no empty component, no NUL): it can only name something below the root.
pub fn check_relative_path(p: &[u8]) -> io::Result<()> {
    if p.is_empty() || p.len() > MAX_PATH || p.contains(&0) {
        return Err(bad("invalid path in the device state"));
    }
    for c in p.split(|&b| b == b'/') {
        if c.is_empty() || c == b"." || c == b".." || c.len() > 255 {
            return Err(bad(format!(
                "path {:?} in the device state is not a plain relative path",
                String::from_utf8_lossy(p)
            )));
        }
    }
    Ok(())
}

impl Codec for FsState {
    fn encode(&self, e: &mut Enc) -> io::Result<()> {
        if self.inodes.len() > MAX_INODES || self.handles.len() > MAX_HANDLES {
            return Err(bad(format!(
                "{} inodes and {} handles: more than a stream may carry ({MAX_INODES}, {MAX_HANDLES})",
                self.inodes.len(),
                self.handles.len()
            )));
        }
        e.u32(self.negotiated);
        e.u64(self.next_inode.raw());
        e.u64(self.next_handle.raw());
        e.u32(self.inodes.len() as u32);
        for i in &self.inodes {
            e.u64(i.id.raw());
            e.u64(i.refs);
            e.u64(i.generation);
            e.u32(i.kind);
            match &i.location {
                Location::Root => e.u8(0),
                Location::Path(p) => {
                    e.u8(1);
                    e.bytes16(p, MAX_PATH, "path")?;
                }
                Location::Handle(h) => {
                    e.u8(2);
                    h.encode(e)?;
                }
                Location::Lost => e.u8(3),
            }
            match &i.verify {
                None => e.u8(0),
                Some(h) => {
                    e.u8(1);
                    h.encode(e)?;
                }
            }
        }
        e.u32(self.handles.len() as u32);
        for h in &self.handles {
            e.u64(h.fh.raw());
            e.u64(h.inode.raw());
            e.u8(u8::from(h.dir));
            e.u32(h.flags);
        }
        Ok(())
    }

    fn decode(d: &mut Dec) -> io::Result<Self> {
        let negotiated = d.u32("negotiated flags")?;
        let next_inode = Inode::from_raw(d.u64("next inode")?);
        let next_handle = Handle::from_raw(d.u64("next handle")?);
        // Smallest inode record: 3 x u64 + u32 + location tag + verify tag.
        let n = d.count(MAX_INODES, 30, "inodes")?;
        let mut inodes = Vec::with_capacity(n);
        for _ in 0..n {
            let id = Inode::from_raw(d.u64("inode id")?);
            let refs = d.u64("inode refs")?;
            let generation = d.u64("inode generation")?;
            let kind = d.u32("inode kind")?;
            let location = match d.u8("inode location")? {
                0 => Location::Root,
                1 => Location::Path(d.bytes16(MAX_PATH, "path")?),
                2 => Location::Handle(FileHandleBytes::decode(d)?),
                3 => Location::Lost,
                t => return Err(bad(format!("inode {id}: unknown location tag {t}"))),
            };
            let verify = match d.bool("verify handle tag")? {
                false => None,
                true => Some(FileHandleBytes::decode(d)?),
            };
            inodes.push(InodeState {
                id,
                refs,
                generation,
                kind,
                location,
                verify,
            });
        }
        let n = d.count(MAX_HANDLES, 21, "handles")?;
        let mut handles = Vec::with_capacity(n);
        for _ in 0..n {
            handles.push(HandleState {
                fh: Handle::from_raw(d.u64("handle id")?),
                inode: Inode::from_raw(d.u64("handle inode")?),
                dir: d.bool("handle kind")?,
                flags: d.u32("handle flags")?,
            });
        }
        Ok(FsState {
            negotiated,
            next_inode,
            next_handle,
            inodes,
            handles,
        })
    }

    /// Unique ids, the root exactly once as inode 1, handles on known inodes, counters past
    /// every id in use.
    fn validate(&self) -> io::Result<()> {
        let mut ids = std::collections::HashSet::with_capacity(self.inodes.len());
        let mut root = false;
        for i in &self.inodes {
            if i.id.raw() == 0 || !ids.insert(i.id) {
                return Err(bad(format!("inode id {} is 0 or repeated", i.id)));
            }
            if i.id >= self.next_inode {
                return Err(bad(format!(
                    "inode {} is not below the next id {}",
                    i.id, self.next_inode
                )));
            }
            if i.refs == 0 {
                return Err(bad(format!("inode {} has no references", i.id)));
            }
            match &i.location {
                Location::Root if i.id == Inode::ROOT => root = true,
                Location::Root => return Err(bad(format!("inode {} claims to be the root", i.id))),
                _ if i.id == Inode::ROOT => return Err(bad("inode 1 is not the shared directory")),
                Location::Path(p) => check_relative_path(p)?,
                Location::Handle(_) | Location::Lost => {}
            }
            if i.kind & !(libc::S_IFMT) != 0 {
                return Err(bad(format!("inode {}: bad file type {:#o}", i.id, i.kind)));
            }
        }
        if !root {
            return Err(bad("the device state has no root inode"));
        }
        let mut fhs = std::collections::HashSet::with_capacity(self.handles.len());
        for h in &self.handles {
            if !fhs.insert(h.fh) || h.fh >= self.next_handle {
                return Err(bad(format!(
                    "handle {} is repeated or not below the next id",
                    h.fh
                )));
            }
            if !ids.contains(&h.inode) {
                return Err(bad(format!(
                    "handle {} names unknown inode {}",
                    h.fh, h.inode
                )));
            }
        }
        Ok(())
    }

    fn summary(&self) -> String {
        format!(
            "{} inodes, {} handles",
            self.inodes.len(),
            self.handles.len()
        )
    }
}
