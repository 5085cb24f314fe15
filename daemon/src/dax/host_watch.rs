//! Host changes to files the window maps directly (issue #20).
//!
//! QEMU maps a direct placement's file range shared (`SHMEM_MAP`), and so does the daemon (the
//! range comes back in the memory table, ADD_MEM_REG). When a host process shrinks the file,
//! the pages past the new end of file are gone: QEMU's next access to them (a guest load under
//! TCG) is a SIGBUS and QEMU dies; on KVM hosts the vCPU gets EFAULT and the VM stops.
//!
//! Two defences, both here so that placement only calls `watch` where it maps a file (and
//! `evacuate` moves the mappings the watch finds):
//! - **Before a host process can shrink a mapped file, its mappings leave the file.** Linux
//!   6.14+ sends fanotify *pre-content* permission events (`FAN_PRE_ACCESS`) before truncate
//!   (`truncate`, `ftruncate`) and before every read, write or fallocate of a file opened on a
//!   file system that allows them (ext4, xfs, btrfs: `SB_I_ALLOW_HSM`; not tmpfs, not NFS),
//!   and `FAN_OPEN_PERM` before an open, which is the only event an `O_TRUNC` open gets (seen on
//!   6.18). A truncate's event has a range of length 0; a read's, write's or mmap's has the
//!   range it touches, and those are let through at once ([`may_shrink_from`]). A truncate or
//!   an open from another process of a file the window maps directly moves the mappings at or
//!   past its offset (all of them for an open, which may be `O_TRUNC`) to a shadow of the
//!   range (the snapshot or merged placement: a memfd that follows the file at every sync
//!   point and, when writable, writes guest stores back run by run)
//!   with SHMEM_UNMAP + SHMEM_MAP, and only then allows the operation. A shadow never faults:
//!   the guest sees the new size and bytes at its next sync point (OPEN, READ, GETATTR of the
//!   inode, the 5 s pass). The daemon's own accesses are let through at once, and so is the
//!   frontend's `mmap` of a range the daemon is mapping right now (`Expect`).
//!   The group needs CAP_SYS_ADMIN (made at start, before capabilities are dropped); marks are
//!   inode marks (`FAN_MARK_EVICTABLE`: they never pin an inode).
//! - **The daemon never reads guest memory through a host file's mapping** ([`DaxWindow::backs_window`]):
//!   the transport leaves regions whose descriptor is a file the window mapped out of the
//!   memory it resolves descriptors with, so a descriptor pointing into such a range fails that
//!   one request instead of faulting in the daemon.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use super::{DaxWindow, WindowSink};

/// `FAN_PRE_ACCESS` (Linux 6.14+, `include/uapi/linux/fanotify.h`; not in `libc` yet).
const FAN_PRE_ACCESS: u64 = 0x0010_0000;
/// `FAN_EVENT_INFO_TYPE_RANGE`: the file range of a pre-content event.
const FAN_EVENT_INFO_TYPE_RANGE: u8 = 6;

/// A host file: `(st_dev, st_ino)`.
pub(super) type Key = (u64, u64);

/// The host file `f` is.
pub(super) fn key_of(f: &File) -> Option<Key> {
    crate::sys::fstat(f.as_fd())
        .ok()
        .map(|st| (st.st_dev, st.st_ino))
}

/// One window's host-change state: the files it sent the frontend, each owner's last file,
/// the fanotify marks and (with `--dax-mapping direct` and the capability) the group. Owned
/// by the [`DaxWindow`]; every registry is a leaf lock except `marks`, under which a mark
/// is added or removed through the group.
#[derive(Default)]
pub(super) struct HostWatch {
    sent: Mutex<Sent>,
    /// The host file each guest inode (owner) mapped last: a guest truncate through an alias
    /// inode reaches the other aliases' mappings by it. Bounded: cleared when it grows past
    /// [`OWNERS_MAX`] (an owner then found by its live mappings only).
    owners: Mutex<HashMap<u64, Key>>,
    marks: Mutex<Marks>,
    /// Set once by [`DaxWindow::watch_host`].
    group: OnceLock<Arc<Group>>,
}

/// Host files the window mapped, by window offset (bounded by the window's pages).
#[derive(Default)]
struct Sent {
    by_off: HashMap<u64, Key>,
    by_key: HashMap<Key, HashSet<u64>>,
}

const OWNERS_MAX: usize = 1 << 16;

/// Host files marked in the fanotify group: a descriptor of each (the mark is removed
/// through it) and the window offsets mapping it directly. The mark goes with the last of
/// them, so host opens of a file the window no longer maps do not pass through the daemon.
/// Bounded by the window's mappings.
#[derive(Default)]
struct Marks {
    by_key: HashMap<Key, (OwnedFd, HashSet<u64>)>,
    by_off: HashMap<u64, Key>,
}

const MARK_MASK: u64 = FAN_PRE_ACCESS | libc::FAN_OPEN_PERM;

fn unmark(w: &Group, fd: &OwnedFd) {
    // SAFETY: removes the mark of the inode of the open descriptor `fd` (no path); plain
    // integer arguments.
    let r = unsafe {
        libc::fanotify_mark(
            w.fd.as_raw_fd(),
            libc::FAN_MARK_REMOVE | libc::FAN_MARK_INODE,
            MARK_MASK,
            fd.as_raw_fd(),
            std::ptr::null(),
        )
    };
    if r < 0 {
        // ENOENT: the kernel evicted the mark with the inode (FAN_MARK_EVICTABLE).
        log::debug!("fanotify mark removal: {}", io::Error::last_os_error());
    }
}

/// Forgets window offset `moffset` in `m`; returns the descriptor of a file it was the last
/// mapping of (whose mark is to go).
fn forget_off(m: &mut Marks, moffset: u64) -> Option<OwnedFd> {
    let key = m.by_off.remove(&moffset)?;
    let (_, offs) = m.by_key.get_mut(&key)?;
    offs.remove(&moffset);
    if !offs.is_empty() {
        return None;
    }
    m.by_key.remove(&key).map(|(fd, _)| fd)
}

/// A file range: (dev, ino, offset, len).
type Range = (u64, u64, u64, u64);

struct Job {
    fd: OwnedFd,
    /// The lowest file offset the operation may shrink the file to.
    from: u64,
}

/// The fanotify group and its bookkeeping: made by [`init`] while the daemon still has
/// CAP_SYS_ADMIN, then handed to the window ([`DaxWindow::watch_host`]).
pub struct Group {
    fd: OwnedFd,
    pid: i32,
    /// Frontend `mmap`s of a file range the daemon is sending.
    expected: Mutex<HashMap<Range, usize>>,
    jobs: Mutex<VecDeque<Job>>,
    more: Condvar,
    /// Marks failed for good (kernel older than 6.14): stop trying.
    off: AtomicBool,
    /// File systems already logged as without pre-content events.
    no_hsm: Mutex<HashSet<u64>>,
}

/// Makes the fanotify group (needs CAP_SYS_ADMIN: call before capabilities are dropped).
/// Logs and returns `None` where host truncates cannot be intercepted.
pub fn init() -> Option<Group> {
    let flags = libc::FAN_CLASS_PRE_CONTENT
        | libc::FAN_CLOEXEC
        | libc::FAN_UNLIMITED_QUEUE
        | libc::FAN_UNLIMITED_MARKS;
    let ev_flags = (libc::O_RDONLY | libc::O_LARGEFILE | libc::O_CLOEXEC) as libc::c_uint;
    // SAFETY: fanotify_init takes two flag words and returns a new descriptor or -1.
    let fd = unsafe { libc::fanotify_init(flags, ev_flags) };
    if fd < 0 {
        log::warn!(
            "DAX: host truncates of mapped files cannot be intercepted (fanotify_init: {}; needs CAP_SYS_ADMIN): a host process that shrinks a file the guest maps can crash QEMU",
            io::Error::last_os_error()
        );
        return None;
    }
    // SAFETY: fanotify_init returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Some(Group {
        fd,
        pid: std::process::id() as i32,
        expected: Mutex::default(),
        jobs: Mutex::default(),
        more: Condvar::new(),
        off: AtomicBool::new(false),
        no_hsm: Mutex::default(),
    })
}

/// While alive, the frontend's `mmap` of this range is expected (not a host change).
pub(crate) struct Expect(Option<(Arc<Group>, Range)>);

impl Drop for Expect {
    fn drop(&mut self) {
        if let Some((w, k)) = &self.0 {
            let mut e = w.expected.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = e.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    e.remove(k);
                }
            }
        }
    }
}

impl HostWatch {
    fn note_sent(&self, moffset: u64, key: Key) {
        let mut s = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = s.by_off.insert(moffset, key) {
            if let Some(set) = s.by_key.get_mut(&old) {
                set.remove(&moffset);
                if set.is_empty() {
                    s.by_key.remove(&old);
                }
            }
        }
        s.by_key.entry(key).or_default().insert(moffset);
    }

    /// Whether `file` is a host file the window mapped.
    pub(super) fn backs_window(&self, file: &File) -> bool {
        let Some(key) = key_of(file) else {
            return false;
        };
        let s = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        s.by_key.contains_key(&key)
    }

    /// The host file guest inode `owner` mapped last, if known.
    pub(super) fn owner_key(&self, owner: u64) -> Option<Key> {
        self.owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&owner)
            .copied()
    }

    /// The frontend mapping at window offset `moffset` goes (SHMEM_UNMAP): when it was the
    /// last direct mapping of its file, the file's mark goes.
    pub(super) fn unmapped(&self, moffset: u64) {
        let Some(w) = self.group.get() else { return };
        let mut m = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(fd) = forget_off(&mut m, moffset) {
            unmark(w, &fd);
        }
    }

    /// Every frontend mapping went (device reset): every mark goes.
    pub(super) fn unmapped_all(&self) {
        let Some(w) = self.group.get() else { return };
        let mut m = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        m.by_off.clear();
        for (_, (fd, _)) in m.by_key.drain() {
            unmark(w, &fd);
        }
    }

    /// Called just before the window maps `len` bytes of `f` from `foffset` at `moffset`:
    /// notes the file as window-backed and watches it for host changes. Keep the guard until
    /// the SHMEM_MAP is answered.
    pub(super) fn watch(
        &self,
        f: &File,
        owner: u64,
        moffset: u64,
        foffset: u64,
        len: u64,
    ) -> Expect {
        let Some(key) = key_of(f) else {
            return Expect(None);
        };
        self.note_sent(moffset, key);
        {
            let mut o = self.owners.lock().unwrap_or_else(|e| e.into_inner());
            if o.len() >= OWNERS_MAX {
                o.clear();
            }
            o.insert(owner, key);
        }
        let Some(w) = self.group.get() else {
            return Expect(None);
        };
        if w.off.load(Ordering::Relaxed) || !self.mark(w, f, key, moffset) {
            return Expect(None);
        }
        let k = (key.0, key.1, foffset, len);
        *w.expected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(k)
            .or_default() += 1;
        Expect(Some((w.clone(), k)))
    }

    /// Marks `f` (host file `key`, mapped at `moffset`) in group `w`; false (logged once)
    /// where it cannot be.
    fn mark(&self, w: &Group, f: &File, key: Key, moffset: u64) -> bool {
        let how = libc::FAN_MARK_ADD | libc::FAN_MARK_INODE | libc::FAN_MARK_EVICTABLE;
        // Under the registry's lock: a removal for the file's last old mapping cannot undo it.
        let mut reg = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: marks the inode of the open descriptor `f` (no path); plain integer arguments.
        let r = unsafe {
            libc::fanotify_mark(
                w.fd.as_raw_fd(),
                how,
                MARK_MASK,
                f.as_raw_fd(),
                std::ptr::null(),
            )
        };
        if r == 0 {
            // A mapping at this offset of another file (not unmapped first) stops counting.
            if reg.by_off.get(&moffset).is_some_and(|k| *k != key) {
                if let Some(fd) = forget_off(&mut reg, moffset) {
                    unmark(w, &fd);
                }
            }
            let fresh = !reg.by_key.contains_key(&key);
            let dup = if fresh {
                f.as_fd().try_clone_to_owned().ok()
            } else {
                None
            };
            match (reg.by_key.get_mut(&key), dup) {
                (Some((_, offs)), _) => {
                    offs.insert(moffset);
                    reg.by_off.insert(moffset, key);
                }
                (None, Some(fd)) => {
                    reg.by_key.insert(key, (fd, HashSet::from([moffset])));
                    reg.by_off.insert(moffset, key);
                }
                // No descriptor to remove it by later (EMFILE): the mark stays, as it is
                // evictable it pins nothing.
                (None, None) => {}
            }
            return true;
        }
        drop(reg);
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINVAL) => {
                if !w.off.swap(true, Ordering::Relaxed) {
                    log::warn!("DAX: this kernel has no fanotify pre-content events (Linux 6.14+): a host process that shrinks a file the guest maps can crash QEMU");
                }
            }
            _ => {
                let mut l = w.no_hsm.lock().unwrap_or_else(|e| e.into_inner());
                if l.len() < 64 && l.insert(key.0) {
                    log::warn!("DAX: host truncates on file system dev={} cannot be intercepted ({e}; pre-content events need ext4, xfs or btrfs): a host process that shrinks a file the guest maps there can crash QEMU", key.0);
                }
            }
        }
        false
    }
}

fn respond(w: &Group, fd: &OwnedFd) {
    let r = libc::fanotify_response {
        fd: fd.as_raw_fd(),
        response: libc::FAN_ALLOW,
    };
    // SAFETY: writes one response struct from a live local to the group's descriptor.
    let n = unsafe {
        libc::write(
            w.fd.as_raw_fd(),
            &r as *const _ as *const libc::c_void,
            std::mem::size_of_val(&r),
        )
    };
    if n < 0 {
        log::error!("fanotify response failed: {}", io::Error::last_os_error());
    }
}

fn block_signals() {
    // SAFETY: `all` is initialised by sigfillset; this changes only this thread's mask.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
}

impl<S: WindowSink + 'static> DaxWindow<S> {
    /// Hands the window the fanotify group from [`init`] and starts its event threads.
    pub fn watch_host(self: &Arc<Self>, group: Group) {
        let w = Arc::new(group);
        if self.host.group.set(w.clone()).is_err() {
            log::error!("DAX host watch started twice: the second group is dropped");
            return;
        }
        // Mappings a server before this one made (`--restartable`) are marked again.
        self.watch_taken_back();
        let events = w.clone();
        let reader = std::thread::Builder::new()
            .name("dax-host-events".into())
            .spawn(move || {
                block_signals();
                read_events(&events)
            });
        let window = Arc::downgrade(self);
        let worker = std::thread::Builder::new()
            .name("dax-host-watch".into())
            .spawn(move || {
                block_signals();
                loop {
                    // Every event queued now, as one batch: each file is evacuated once, from
                    // the lowest offset any of its events may shrink it to, then all are
                    // answered.
                    let batch: Vec<Job> = {
                        let mut q = w.jobs.lock().unwrap_or_else(|e| e.into_inner());
                        while q.is_empty() {
                            q = w.more.wait(q).unwrap_or_else(|e| e.into_inner());
                        }
                        q.drain(..).collect()
                    };
                    let mut files: HashMap<Key, u64> = HashMap::new();
                    for job in &batch {
                        let Ok(st) = crate::sys::fstat(job.fd.as_fd()) else {
                            continue;
                        };
                        let from = files.entry((st.st_dev, st.st_ino)).or_insert(job.from);
                        *from = (*from).min(job.from);
                    }
                    if let Some(win) = window.upgrade() {
                        for (key, from) in files {
                            win.evacuate(key, from);
                        }
                    }
                    for job in &batch {
                        respond(&w, &job.fd);
                    }
                }
            });
        if let Err(e) = reader.and(worker) {
            log::error!("cannot start the DAX host-watch threads: {e}");
        }
    }

    /// Whether `file` is a host file the window mapped (then the frontend's memory region of
    /// it may fault when a host process shrinks the file: the daemon must not read through it).
    pub fn backs_window(&self, file: &File) -> bool {
        self.host.backs_window(file)
    }
}

/// Reads events; lets the daemon's own and expected ones through at once, queues the others.
fn read_events(w: &Group) {
    let mut buf = vec![0u64; 1024];
    loop {
        // SAFETY: reads into a live buffer of the given size.
        let n = unsafe {
            libc::read(
                w.fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len() * 8,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            log::error!(
                "reading fanotify events failed: {e}; host changes are no longer intercepted"
            );
            return;
        }
        // SAFETY: the buffer is u64-aligned and `n` bytes of it were written.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, n as usize) };
        let meta = std::mem::size_of::<libc::fanotify_event_metadata>();
        let mut at = 0;
        while at + meta <= bytes.len() {
            // SAFETY: `meta` bytes are in the buffer at `at`; read_unaligned copes with any
            // alignment.
            let m: libc::fanotify_event_metadata =
                unsafe { std::ptr::read_unaligned(bytes[at..].as_ptr() as *const _) };
            let len = (m.event_len as usize).max(meta);
            let end = (at + len).min(bytes.len());
            let mut range: Option<(u64, u64)> = None;
            let mut i = at + m.metadata_len as usize;
            while i + 4 <= end {
                let ty = bytes[i];
                let hl = u16::from_ne_bytes([bytes[i + 2], bytes[i + 3]]) as usize;
                if hl < 4 {
                    break;
                }
                if ty == FAN_EVENT_INFO_TYPE_RANGE && i + 24 <= end {
                    let off = u64::from_ne_bytes(bytes[i + 8..i + 16].try_into().unwrap_or([0; 8]));
                    let cnt =
                        u64::from_ne_bytes(bytes[i + 16..i + 24].try_into().unwrap_or([0; 8]));
                    range = Some((off, cnt));
                }
                i += hl;
            }
            at += len;
            if m.fd < 0 {
                continue;
            }
            // SAFETY: the kernel installed this descriptor for the event; we own it.
            let fd = unsafe { OwnedFd::from_raw_fd(m.fd) };
            if m.pid == w.pid || expected(w, &fd, range) {
                respond(w, &fd);
                continue;
            }
            let Some(from) = may_shrink_from(m.mask, range) else {
                respond(w, &fd);
                continue;
            };
            w.jobs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_back(Job { fd, from });
            w.more.notify_one();
        }
    }
}

/// Where an event's operation may shrink the file to, or `None` when it cannot shrink it.
///
/// A pre-content event with a range of length 0 is a truncate (`fsnotify_truncate_perm`);
/// one with a length is a read, write, mmap or fallocate of that range, which leaves the
/// file's size alone: answered at once, never queued. A worker that evacuates reads the file,
/// and another daemon mapping the same file gets that read as an event of its own: were reads
/// queued behind its worker, two daemons evacuating at once would wait on each other for ever.
/// An open (`FAN_OPEN_PERM`) may be an `O_TRUNC` open, whose truncate sends no event of its
/// own: from 0. (`fallocate(FALLOC_FL_COLLAPSE_RANGE)` shrinks a file, but its event is that
/// of a write: not intercepted, see docs/limits.md.)
fn may_shrink_from(mask: u64, range: Option<(u64, u64)>) -> Option<u64> {
    if mask & FAN_PRE_ACCESS == 0 {
        return Some(0);
    }
    match range {
        Some((_, count)) if count > 0 => None,
        Some((offset, _)) => Some(offset),
        None => Some(0),
    }
}

fn expected(w: &Group, fd: &OwnedFd, range: Option<(u64, u64)>) -> bool {
    let Some((off, cnt)) = range else {
        return false;
    };
    let e = w.expected.lock().unwrap_or_else(|e| e.into_inner());
    if e.is_empty() {
        return false;
    }
    let Ok(st) = crate::sys::fstat(fd.as_fd()) else {
        return false;
    };
    // The frontend's mmap of a range being mapped (it blocks QEMU's main loop, which the
    // worker may be waiting for: never queue it).
    e.keys().any(|&(dev, ino, o, l)| {
        dev == st.st_dev && ino == st.st_ino && off >= o && off.saturating_add(cnt) <= o + l
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dax::coherent::Coherence;
    use crate::dax::tests::map_at;
    use std::os::fd::BorrowedFd;
    use std::os::unix::fs::FileExt;
    use std::sync::Arc;

    const MB2: u64 = 2 << 20;

    /// A frontend that keeps what it was asked to map.
    #[derive(Default)]
    struct Front {
        calls: Mutex<Vec<String>>,
        fds: Mutex<HashMap<u64, File>>,
    }

    impl WindowSink for Arc<Front> {
        fn map(&self, m: u64, len: u64, fd: BorrowedFd, fo: u64, _w: bool) -> io::Result<()> {
            let f = File::from(fd.try_clone_to_owned()?);
            self.calls
                .lock()
                .unwrap()
                .push(format!("map {m:#x}+{len:#x}@{fo:#x}"));
            self.fds.lock().unwrap().insert(m, f);
            Ok(())
        }
        fn unmap(&self, m: u64, len: u64) -> io::Result<()> {
            self.fds.lock().unwrap().remove(&m);
            self.calls
                .lock()
                .unwrap()
                .push(format!("unmap {m:#x}+{len:#x}"));
            Ok(())
        }
    }

    #[test]
    fn a_host_shrink_moves_direct_mappings_to_shadows_first() {
        let w = DaxWindow::new(8 * MB2).unwrap();
        let front = Arc::new(Front::default());
        w.set_sink(front.clone());
        w.start();
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..3 * MB2).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("f"), &bytes).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.path().join("f"))
            .unwrap();
        let key = key_of(&f).unwrap();
        // Two guest ranges of the file, both mapped from it directly.
        map_at(&w, 7, 0, MB2, f.as_fd(), 0, true).unwrap();
        map_at(&w, 7, MB2, MB2, f.as_fd(), MB2, false).unwrap();
        front.calls.lock().unwrap().clear();
        let file_ino = |m: u64| key_of(&front.fds.lock().unwrap()[&m]);
        assert_eq!(file_ino(0), Some(key));

        // Nothing of the file lies past 4 MiB: nothing moves.
        assert_eq!(w.evacuate(key, 2 * MB2), 0);
        // A shrink to 3 MiB could cut the second range only.
        assert_eq!(w.evacuate(key, MB2 + 4096), 1);
        assert_eq!(
            std::mem::take(&mut *front.calls.lock().unwrap()),
            vec!["unmap 0x200000+0x200000", "map 0x200000+0x200000@0x0"]
        );
        assert_ne!(file_ino(MB2), Some(key), "the frontend still maps the file");
        // An open (maybe O_TRUNC): everything moves; moved ranges stay moved.
        assert_eq!(w.evacuate(key, 0), 1);
        assert_ne!(file_ino(0), Some(key));
        assert_eq!(w.stats().replaced, 2);

        // The host truncates: the frontend's mappings are memfds with the old bytes (no
        // fault); at the inode's next sync point they read zeros past the new end, and the
        // file is neither extended nor written.
        let shadow = front.fds.lock().unwrap()[&MB2].try_clone().unwrap();
        let mut got = vec![0u8; 4096];
        shadow.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(&got[..], &bytes[MB2 as usize..MB2 as usize + 4096]);
        f.set_len(100).unwrap();
        w.sync(7);
        shadow.read_exact_at(&mut got, 0).unwrap();
        assert!(got.iter().all(|&b| b == 0));
        let first = front.fds.lock().unwrap()[&0].try_clone().unwrap();
        first.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(&got[..100], &bytes[..100]);
        assert!(got[100..].iter().all(|&b| b == 0));
        assert_eq!(f.metadata().unwrap().len(), 100);
    }

    #[test]
    fn a_guest_shrink_through_an_alias_moves_every_mapping_of_the_file() {
        let w = DaxWindow::new(8 * MB2).unwrap();
        let front = Arc::new(Front::default());
        w.set_sink(front.clone());
        w.start();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), vec![7u8; 4 * MB2 as usize]).unwrap();
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(dir.path().join("f"))
                .unwrap()
        };
        let (a, b) = (open(), open());
        let key = key_of(&a).unwrap();
        // Guest inodes 7 and 8 are two names (aliases) of one host file.
        map_at(&w, 7, 0, MB2, a.as_fd(), 0, true).unwrap();
        map_at(&w, 8, MB2, MB2, b.as_fd(), 2 * MB2, false).unwrap();
        let maps_file = |m: u64| key_of(&front.fds.lock().unwrap()[&m]) == Some(key);
        assert!(maps_file(0) && maps_file(MB2));
        // Growing moves nothing.
        w.shrinking(8, 5 * MB2);
        assert!(maps_file(0) && maps_file(MB2));
        // SETATTR size 100 through inode 8 (it may fail half way: the moves come first).
        w.shrinking(8, 100);
        assert!(!maps_file(0), "inode 7's mapping still maps the file");
        assert!(!maps_file(MB2), "inode 8's mapping still maps the file");
        assert_eq!(w.stats().replaced, 2);
    }

    #[test]
    fn only_truncates_and_opens_may_shrink() {
        let open = libc::FAN_OPEN_PERM;
        // An open may be O_TRUNC: everything may go.
        assert_eq!(may_shrink_from(open, None), Some(0));
        // A truncate to 4096: a range of length 0 there.
        assert_eq!(may_shrink_from(FAN_PRE_ACCESS, Some((4096, 0))), Some(4096));
        // Reads, writes, mmaps: the range they touch; the size stays.
        assert_eq!(may_shrink_from(FAN_PRE_ACCESS, Some((0, 1 << 20))), None);
        assert_eq!(may_shrink_from(FAN_PRE_ACCESS, Some((8192, 1))), None);
        // No range reported: assume the worst.
        assert_eq!(may_shrink_from(FAN_PRE_ACCESS, None), Some(0));
    }

    #[test]
    fn sent_files_are_window_backed_until_their_offset_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let a = File::create(dir.path().join("a")).unwrap();
        let b = File::create(dir.path().join("b")).unwrap();
        let (ka, kb) = (key_of(&a).unwrap(), key_of(&b).unwrap());
        let h = HostWatch::default();
        let at = |k: Key| {
            let s = h.sent.lock().unwrap();
            s.by_key.get(&k).is_some_and(|o| o.contains(&(1 << 40)))
        };
        h.note_sent(1 << 40, ka);
        assert!(h.backs_window(&a) && at(ka) && !at(kb));
        h.note_sent(1 << 40, kb);
        assert!(h.backs_window(&b) && at(kb) && !at(ka));
    }
}
