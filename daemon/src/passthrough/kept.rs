//! The passthrough's part of a session kept across a crash (`--restartable`, see
//! [`crate::protocol::keeper`]): every inode the guest holds and every open handle, each
//! with its descriptor, given to the keeper as the tables change, and taken back by the
//! next server.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::handle::HandleData;
use super::inode::from_kept_meta;
use super::PassthroughFs;
use crate::protocol::filesystem::{Handle, Inode, LockOwner};
use crate::protocol::keeper::{Keeper, Kept, KeptEntry};

impl PassthroughFs {
    /// Keeps inodes and handles with `keeper` from now on.
    pub fn set_keeper(&self, keeper: Arc<dyn Keeper>) {
        self.inodes.set_keeper(keeper.clone());
        self.handles.set_keeper(keeper);
    }

    /// Takes back what a crashed server kept: the options it agreed in INIT (`agreed`, the
    /// session's flags), its inodes (their lookup counts pinned: the guest's are unknown)
    /// and its handles. Returns how many inodes and handles came back; entries that do not
    /// decode are dropped with a log line.
    pub fn restore_kept(&self, agreed: u64, entries: Vec<KeptEntry>) -> (usize, usize) {
        self.apply_agreed(agreed & self.init_wants());
        let mut inodes = Vec::new();
        let mut handles = Vec::new();
        // Lock owners' descriptors, by handle.
        let mut owners: HashMap<u64, Vec<(LockOwner, OwnedFd)>> = HashMap::new();
        for (what, meta, fd) in entries {
            match (what, fd) {
                (Kept::Inode(id), Some(fd)) => match from_kept_meta(&meta) {
                    Some((key, kind)) => inodes.push((Inode::from_raw(id), key, kind, fd)),
                    None => log::warn!("restart: inode {id}: entry does not decode"),
                },
                (Kept::Handle(fh), Some(fd)) => match HandleData::from_kept(&meta, fd) {
                    Some(h) => handles.push((Handle::from_raw(fh), h)),
                    None => log::warn!("restart: handle {fh}: entry does not decode"),
                },
                (Kept::Owner(fh, owner), Some(fd)) => owners
                    .entry(fh)
                    .or_default()
                    .push((LockOwner::from_raw(owner), fd)),
                // The session is the caller's, the DAX window's entries the window's.
                (w, _) if w == Kept::Session || w.is_dax() => {}
                (what, _) => log::warn!("restart: {what:?} came back without a descriptor"),
            }
        }
        let counts = (inodes.len(), handles.len());
        self.inodes.restore(inodes);
        // Host changes while no server ran went unseen.
        self.watch_tables_again();
        for (fh, h) in &handles {
            for (owner, fd) in owners.remove(&fh.raw()).into_iter().flatten() {
                h.restore_owner(owner, fd);
            }
        }
        self.handles.restore(handles);
        counts
    }
}
