//! Host changes to the share, for the guest (issue #42).
//!
//! The guest caches entries and attributes, and its processes watch directories with
//! inotify; neither sees a change a host process makes. This watches, with one fanotify
//! group, every directory the guest holds an inode of (marks follow the inode table: added at
//! the directory's first LOOKUP, removed at its last FORGET, so the marks are bounded by what
//! the guest knows and never cover the rest of the host), and turns each host change into
//! FUSE notifications ([`Notification`]) for the transport to deliver:
//! - an entry created, removed or renamed: the entry is invalidated, the directory's
//!   attributes and cached listing too, then a CREATE / DELETE / MOVED_FROM+MOVED_TO event
//!   (one cookie per rename) for the guest's watchers of the directory;
//! - a file written, closed after writing or with changed attributes: if the guest holds its
//!   inode, that inode's attributes (and data, for a write) are invalidated and the event is
//!   reported on it (the guest reaches the parent's watchers through the name it knows);
//!   otherwise the event is reported on the directory, with the name.
//!
//! The daemon's own changes (the guest's requests) are never reported back: fanotify gives
//! each event the pid of the process that made the change, and the daemon's is skipped.
//! Events are read with the directory's file handle and the entry name
//! (`FAN_REPORT_DFID_NAME`); a directory is found again by the handle computed when it was
//! marked. A lost kernel queue (`FAN_Q_OVERFLOW`) becomes one broad invalidation. The group
//! is made before capabilities are dropped; its marks are inode marks, which need no
//! capability.
//!
//! Not covered: a change made through a hard link outside every directory the guest knows
//! (no mark sees it), and a change by a host process inside the daemon's own pid (none).
//! Lock order: the watch's `dirs` lock is taken alone, or before the inode table's.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::inode::{InodeData, InodeStore};
use super::{fd_name, key_of, STATX_MASK};
use crate::protocol::filesystem::Inode;
use crate::protocol::notify::{mask, Notification, Notifier};
use crate::sys;

/// A directory's file handle as fanotify reports it: (type, bytes).
type Fid = (i32, Vec<u8>);

/// What a directory mark reports.
const MARK_MASK: u64 = libc::FAN_CREATE
    | libc::FAN_DELETE
    | libc::FAN_RENAME
    | libc::FAN_ATTRIB
    | libc::FAN_MODIFY
    | libc::FAN_CLOSE_WRITE
    | libc::FAN_DELETE_SELF
    | libc::FAN_MOVE_SELF
    | libc::FAN_EVENT_ON_CHILD
    | libc::FAN_ONDIR;

/// Makes the fanotify group; call before capabilities are dropped (with CAP_SYS_ADMIN the
/// marks are unlimited; without, the kernel's per-user limit applies). `None`, logged, where
/// the host kernel cannot report directory entries (before 5.9) or refuses the group.
pub fn open_group() -> Option<OwnedFd> {
    let base = libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_REPORT_DFID_NAME;
    let ev_flags = (libc::O_RDONLY | libc::O_CLOEXEC) as libc::c_uint;
    for flags in [base | libc::FAN_UNLIMITED_MARKS, base] {
        // SAFETY: fanotify_init takes two flag words and returns a new descriptor or -1.
        let fd = unsafe { libc::fanotify_init(flags, ev_flags) };
        if fd >= 0 {
            // SAFETY: fanotify_init returned a new descriptor that nothing else owns.
            return Some(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    log::warn!(
        "host changes cannot reach the guest: fanotify_init: {} (needs Linux 5.9 or later)",
        io::Error::last_os_error()
    );
    None
}

struct Marked {
    fid: Fid,
    data: Arc<InodeData>,
}

#[derive(Default)]
struct Dirs {
    by_fid: HashMap<Fid, Inode>,
    by_id: HashMap<Inode, Marked>,
}

/// The watch of the directories the guest knows.
pub(super) struct HostWatch {
    fan: OwnedFd,
    pid: i32,
    proc_self_fd: OwnedFd,
    dirs: Mutex<Dirs>,
    notifier: Arc<Notifier>,
    inodes: Arc<InodeStore>,
    cookie: AtomicU32,
}

impl HostWatch {
    pub fn new(
        fan: OwnedFd,
        proc_self_fd: OwnedFd,
        notifier: Arc<Notifier>,
        inodes: Arc<InodeStore>,
    ) -> Arc<Self> {
        Arc::new(HostWatch {
            fan,
            pid: std::process::id() as i32,
            proc_self_fd,
            dirs: Mutex::default(),
            notifier,
            inodes,
            cookie: AtomicU32::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Dirs> {
        self.dirs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the thread that reads the group.
    pub fn spawn(self: &Arc<Self>) -> io::Result<()> {
        let w = self.clone();
        std::thread::Builder::new()
            .name("host-watch".into())
            .spawn(move || w.run())
            .map(|_| ())
    }

    /// Watches directory `data` (the guest holds it now); a no-op when already watched.
    pub fn note(&self, data: &Arc<InodeData>) {
        if !data.is_dir() || self.lock().by_id.contains_key(&data.id) {
            return;
        }
        let fd = match data.fd() {
            Ok(fd) => fd,
            Err(e) => {
                log::debug!("host watch: inode {}: {e}", data.id);
                return;
            }
        };
        let fid = match fid_of(fd.as_fd()) {
            Ok(fid) => fid,
            Err(e) => {
                log::debug!("host watch: inode {} has no file handle: {e}", data.id);
                return;
            }
        };
        let name = fd_name(fd.as_fd());
        // SAFETY: the group and the directory descriptor are open; `name` is a C string naming
        // the directory's entry in /proc/self/fd, resolved relative to `proc_self_fd`.
        let r = unsafe {
            libc::fanotify_mark(
                self.fan.as_raw_fd(),
                libc::FAN_MARK_ADD,
                MARK_MASK,
                self.proc_self_fd.as_raw_fd(),
                name.as_ptr(),
            )
        };
        if r < 0 {
            log::warn!(
                "host watch: cannot watch inode {} ({}): host changes there stay unseen",
                data.id,
                io::Error::last_os_error()
            );
            return;
        }
        let mut d = self.lock();
        d.by_fid.insert(fid.clone(), data.id);
        d.by_id.insert(
            data.id,
            Marked {
                fid,
                data: data.clone(),
            },
        );
    }

    /// Stops watching inode `id` (the guest forgot it).
    pub fn forget(&self, id: Inode) {
        let Some(m) = ({
            let mut d = self.lock();
            let m = d.by_id.remove(&id);
            if let Some(m) = &m {
                if d.by_fid.get(&m.fid) == Some(&id) {
                    d.by_fid.remove(&m.fid);
                }
            }
            m
        }) else {
            return;
        };
        let Ok(fd) = m.data.fd() else {
            return;
        };
        let name = fd_name(fd.as_fd());
        // SAFETY: as in `note`; removing a mark that is already gone fails harmlessly.
        unsafe {
            libc::fanotify_mark(
                self.fan.as_raw_fd(),
                libc::FAN_MARK_REMOVE,
                MARK_MASK,
                self.proc_self_fd.as_raw_fd(),
                name.as_ptr(),
            );
        }
    }

    /// Stops watching everything (the session ended).
    pub fn clear(&self) {
        let mut d = self.lock();
        d.by_fid.clear();
        d.by_id.clear();
        // SAFETY: flushing the group's inode marks takes no path.
        unsafe {
            libc::fanotify_mark(
                self.fan.as_raw_fd(),
                libc::FAN_MARK_FLUSH,
                0,
                libc::AT_FDCWD,
                std::ptr::null(),
            );
        }
    }

    /// Directories watched now.
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    fn run(&self) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: `buf` is writable for its whole length.
            let n = unsafe {
                libc::read(
                    self.fan.as_raw_fd(),
                    buf.as_mut_ptr().cast::<libc::c_void>(),
                    buf.len(),
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                log::error!("host watch: read: {e}; host changes no longer reach the guest");
                return;
            }
            let mut at = 0usize;
            let n = n as usize;
            while let Some(ev) = parse_event(&buf[at..n]) {
                at += ev.len;
                if ev.pid != self.pid {
                    self.report(&ev);
                }
            }
        }
    }

    fn dir(&self, fid: &Fid) -> Option<(Inode, Arc<InodeData>)> {
        let d = self.lock();
        let id = *d.by_fid.get(fid)?;
        Some((id, d.by_id.get(&id)?.data.clone()))
    }

    /// The inode the guest holds for entry `name` of directory `dir`, if any.
    fn known_child(&self, dir: &InodeData, name: &[u8]) -> Option<Inode> {
        let fd = dir.fd().ok()?;
        let cname = std::ffi::CString::new(name).ok()?;
        let st = sys::statx(fd.as_fd(), &cname, libc::AT_SYMLINK_NOFOLLOW, STATX_MASK).ok()?;
        self.inodes.id_of(&key_of(&st))
    }

    fn report(&self, ev: &Event) {
        if ev.mask & libc::FAN_Q_OVERFLOW != 0 {
            log::warn!("host watch: the kernel dropped events; the guest drops its caches");
            self.notifier.push([Notification::Epoch]);
            return;
        }
        let isdir = if ev.mask & libc::FAN_ONDIR != 0 {
            mask::ISDIR
        } else {
            0
        };
        let dir_changed = |node| Notification::InvalInode {
            node,
            off: 0,
            len: 0,
        };
        if ev.mask & libc::FAN_RENAME != 0 {
            let cookie = self
                .cookie
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_add(1)
                .max(1);
            let mut batch = Vec::new();
            let mut events = Vec::new();
            for (rec, m) in [(&ev.old, mask::MOVED_FROM), (&ev.new, mask::MOVED_TO)] {
                let Some((fid, name)) = rec else { continue };
                let Some((d, _)) = self.dir(fid) else {
                    continue;
                };
                batch.push(Notification::InvalEntry {
                    parent: d.raw(),
                    name: name.clone(),
                });
                batch.push(dir_changed(d.raw()));
                events.push(Notification::Fsnotify {
                    node: d.raw(),
                    mask: m | isdir,
                    cookie,
                    name: name.clone(),
                });
            }
            batch.extend(events);
            self.notifier.push(batch);
            return;
        }
        let Some((fid, name)) = &ev.dir else {
            return;
        };
        let Some((d, data)) = self.dir(fid) else {
            return;
        };
        let on_self = name.is_empty() || name == b".";
        let mut batch = Vec::new();
        for (bit, m) in [
            (libc::FAN_CREATE, mask::CREATE),
            (libc::FAN_DELETE, mask::DELETE),
        ] {
            if ev.mask & bit != 0 && !on_self {
                batch.push(Notification::InvalEntry {
                    parent: d.raw(),
                    name: name.clone(),
                });
                batch.push(dir_changed(d.raw()));
                batch.push(Notification::Fsnotify {
                    node: d.raw(),
                    mask: m | isdir,
                    cookie: 0,
                    name: name.clone(),
                });
            }
        }
        for (bit, m) in [
            (libc::FAN_MODIFY, mask::MODIFY),
            (libc::FAN_ATTRIB, mask::ATTRIB),
            (libc::FAN_CLOSE_WRITE, mask::CLOSE_WRITE),
        ] {
            if ev.mask & bit == 0 {
                continue;
            }
            let target = if on_self {
                Some(d)
            } else {
                self.known_child(&data, name)
            };
            match target {
                Some(node) => {
                    if m != mask::CLOSE_WRITE {
                        batch.push(Notification::InvalInode {
                            node: node.raw(),
                            off: if m == mask::MODIFY { 0 } else { -1 },
                            len: 0,
                        });
                    }
                    batch.push(Notification::Fsnotify {
                        node: node.raw(),
                        mask: m | isdir,
                        cookie: 0,
                        name: Vec::new(),
                    });
                }
                None => batch.push(Notification::Fsnotify {
                    node: d.raw(),
                    mask: m | isdir,
                    cookie: 0,
                    name: name.clone(),
                }),
            }
        }
        for (bit, m) in [
            (libc::FAN_DELETE_SELF, mask::DELETE_SELF),
            (libc::FAN_MOVE_SELF, mask::MOVE_SELF),
        ] {
            if ev.mask & bit != 0 {
                batch.push(Notification::Fsnotify {
                    node: d.raw(),
                    mask: m | mask::ISDIR,
                    cookie: 0,
                    name: Vec::new(),
                });
            }
        }
        if !batch.is_empty() {
            self.notifier.push(batch);
        }
    }
}

/// The file handle fanotify reports for the directory behind `fd` (`AT_HANDLE_FID` where the
/// kernel has it, else the exportable handle, which is the same for file systems that export).
fn fid_of(fd: BorrowedFd) -> io::Result<Fid> {
    let (h, _) = super::fhandle::name_to_handle_flags(fd, libc::AT_HANDLE_FID)
        .or_else(|_| super::fhandle::name_to_handle_flags(fd, 0))?;
    Ok((h.handle_type, h.bytes))
}

/// One fanotify event, with the records this group asks for.
struct Event {
    len: usize,
    mask: u64,
    pid: i32,
    dir: Option<(Fid, Vec<u8>)>,
    old: Option<(Fid, Vec<u8>)>,
    new: Option<(Fid, Vec<u8>)>,
}

/// The event at the start of `buf`, if a whole one is there.
fn parse_event(buf: &[u8]) -> Option<Event> {
    const META: usize = std::mem::size_of::<libc::fanotify_event_metadata>();
    if buf.len() < META {
        return None;
    }
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let len = u32_at(buf, 0)? as usize;
    if len < META || len > buf.len() {
        return None;
    }
    let meta_len = usize::from(u16::from_ne_bytes(buf.get(6..8)?.try_into().ok()?));
    let mask = u64::from_ne_bytes(buf.get(8..16)?.try_into().ok()?);
    let fd = u32_at(buf, 16)? as i32;
    let pid = u32_at(buf, 20)? as i32;
    if fd >= 0 {
        // Not with FID reporting; closed all the same should a kernel send one.
        // SAFETY: the kernel gave this descriptor to us with the event; nothing else owns it.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    let mut ev = Event {
        len,
        mask,
        pid,
        dir: None,
        old: None,
        new: None,
    };
    let mut at = meta_len.max(META);
    while at + 4 <= len {
        let kind = buf[at];
        let rec_len = usize::from(u16::from_ne_bytes(buf[at + 2..at + 4].try_into().ok()?));
        if rec_len < 4 || at + rec_len > len {
            break;
        }
        let rec = &buf[at..at + rec_len];
        // header (4), fsid (8), file_handle { handle_bytes, handle_type, f_handle }, name.
        let parsed = (|| {
            let hb = u32_at(rec, 12)? as usize;
            let ht = u32_at(rec, 16)? as i32;
            let fh = rec.get(20..20 + hb)?.to_vec();
            let rest = rec.get(20 + hb..)?;
            let name = rest.split(|&b| b == 0).next().unwrap_or(&[]).to_vec();
            Some(((ht, fh), name))
        })();
        match kind {
            libc::FAN_EVENT_INFO_TYPE_DFID_NAME | libc::FAN_EVENT_INFO_TYPE_DFID => ev.dir = parsed,
            libc::FAN_EVENT_INFO_TYPE_OLD_DFID_NAME => ev.old = parsed,
            libc::FAN_EVENT_INFO_TYPE_NEW_DFID_NAME => ev.new = parsed,
            _ => {}
        }
        at += rec_len;
    }
    Some(ev)
}

#[cfg(test)]
mod tests {
    use super::super::{Config, PassthroughFs};
    use crate::protocol::filesystem::{Context, FileSystem, InitCaps, Inode};
    use crate::protocol::notify::{code, mask, Notifier};
    use std::ffi::CString;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// A message taken apart: (code, node, mask, name, cookie).
    type M = (i32, u64, u32, String, u32);

    fn decode(m: &[u8]) -> M {
        let code = i32::from_le_bytes(m[4..8].try_into().unwrap());
        let node = u64::from_le_bytes(m[16..24].try_into().unwrap());
        let (mask, name, cookie) = match code {
            code::FSNOTIFY => {
                let n = u32::from_le_bytes(m[28..32].try_into().unwrap()) as usize;
                (
                    u32::from_le_bytes(m[24..28].try_into().unwrap()),
                    String::from_utf8_lossy(&m[40..40 + n]).into_owned(),
                    u32::from_le_bytes(m[32..36].try_into().unwrap()),
                )
            }
            code::INVAL_ENTRY => {
                let n = u32::from_le_bytes(m[24..28].try_into().unwrap()) as usize;
                (0, String::from_utf8_lossy(&m[32..32 + n]).into_owned(), 0)
            }
            _ => (0, String::new(), 0),
        };
        (code, node, mask, name, cookie)
    }

    /// Waits up to 5 s for messages, until `done` holds for what came.
    fn collect(n: &Notifier, done: impl Fn(&[M]) -> bool) -> Vec<M> {
        let mut got = Vec::new();
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end && !done(&got) {
            while let Some(m) = n.front() {
                got.push(decode(&m));
                n.pop_front();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        got
    }

    /// Cookies of the MOVED_FROM / MOVED_TO events, from the raw messages kept in `got`.
    fn n_cookies(got: &[M]) -> Vec<u32> {
        got.iter()
            .filter(|m| m.0 == code::FSNOTIFY && m.2 & (mask::MOVED_FROM | mask::MOVED_TO) != 0)
            .map(|m| m.4)
            .collect()
    }

    fn sh(cmd: &str) {
        // Another process: the daemon's own changes are not reported.
        let ok = std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .status()
            .unwrap();
        assert!(ok.success(), "{cmd}");
    }

    fn events(got: &[M]) -> Vec<(u64, u32, String)> {
        got.iter()
            .filter(|m| m.0 == code::FSNOTIFY)
            .map(|m| (m.1, m.2, m.3.clone()))
            .collect()
    }

    #[test]
    fn host_changes_become_invalidations_then_events_and_own_changes_stay_silent() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        std::fs::write(tmp.path().join("d/known"), b"1").unwrap();
        let fs = PassthroughFs::new(Config {
            root_dir: tmp.path().to_path_buf(),
            ..Default::default()
        })
        .unwrap();
        let n = Arc::new(Notifier::new(1024));
        n.set_live(true);
        fs.watch_host(super::open_group().expect("fanotify"), n.clone())
            .unwrap();
        fs.init(InitCaps { flags: u64::MAX }).unwrap();
        let ctx = Context::default();
        let d = fs
            .lookup(&ctx, Inode::ROOT, &CString::new("d").unwrap())
            .unwrap()
            .inode;
        let known = fs
            .lookup(&ctx, d, &CString::new("known").unwrap())
            .unwrap()
            .inode;
        assert_eq!(fs.watched_dirs(), 2, "the root and d");
        let p = tmp.path().join("d");
        let p = p.display();

        // The daemon's own change (this process): nothing.
        let mine = fs
            .mkdir(&ctx, d, &CString::new("mine").unwrap(), 0o755, 0)
            .unwrap()
            .inode;
        sh(&format!(": > {p}/new && echo x >> {p}/known && chmod 600 {p}/new && mv {p}/new {p}/moved && rm {p}/moved"));
        let want = [
            (d.raw(), mask::CREATE, "new".to_string()),
            (known.raw(), mask::MODIFY, String::new()),
            (known.raw(), mask::CLOSE_WRITE, String::new()),
            (d.raw(), mask::ATTRIB, "new".to_string()),
            (d.raw(), mask::MOVED_FROM, "new".to_string()),
            (d.raw(), mask::MOVED_TO, "moved".to_string()),
            (d.raw(), mask::DELETE, "moved".to_string()),
        ];
        let got = collect(&n, |g| events(g).len() >= want.len());
        let ev = events(&got);
        // The shell's `: >` also closes "new" after writing: keep the ones named, in order.
        let seen: Vec<_> = ev
            .iter()
            .filter(|e| !(e.1 == mask::CLOSE_WRITE && e.2 == "new"))
            .cloned()
            .collect();
        assert_eq!(seen, want, "all: {got:?}");
        assert!(
            !got.iter().any(|m| m.3 == "mine"),
            "the daemon's own mkdir was echoed: {got:?}"
        );
        // Each entry event comes after its entry's invalidation.
        let pos = |c: i32, name: &str| got.iter().position(|m| m.0 == c && m.3 == name).unwrap();
        assert!(pos(code::INVAL_ENTRY, "new") < pos(code::FSNOTIFY, "new"));
        // The known file's data is invalidated before its MODIFY.
        let inval = got
            .iter()
            .position(|m| m.0 == code::INVAL_INODE && m.1 == known.raw())
            .expect("INVAL_INODE of the written file");
        let modify = got
            .iter()
            .position(|m| m.0 == code::FSNOTIFY && m.1 == known.raw())
            .unwrap();
        assert!(inval < modify);

        // A rename carries one cookie on both halves.
        let cookies: Vec<u32> = n_cookies(&got);
        assert_eq!(cookies.len(), 2);
        assert!(cookies[0] != 0 && cookies[0] == cookies[1], "{cookies:?}");
        // A forgotten directory leaves the watch: its changes are not reported.
        fs.forget(&ctx, known, 1);
        fs.forget(&ctx, mine, 1);
        fs.forget(&ctx, d, 1);
        assert_eq!(fs.watched_dirs(), 1);
        sh(&format!("touch {p}/after"));
        std::thread::sleep(Duration::from_millis(300));
        let late = collect(&n, |_| false);
        assert!(
            !late.iter().any(|m| m.3 == "after"),
            "a forgotten directory still reports: {late:?}"
        );
    }
}
