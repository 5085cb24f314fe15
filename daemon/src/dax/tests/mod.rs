//! Unit tests of the window against recording frontends.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::coherent::{self, Coherence};
use super::copy::CopyMode;
use super::sink::COMMIT_PROBE;
use super::{fd_writable, DaxWindow, WindowSink, DEFAULT_MAP_BUDGET, MIN_GUEST_RANGE};
use crate::protocol::keeper::{Keeper, Kept, KeptEntry};
use crate::protocol::mapper::{MapRequest, Mapper};

/// [`Mapper::map`] with the request's fields as arguments.
pub(super) fn map_at(
    w: &impl Mapper,
    owner: u64,
    moffset: u64,
    len: u64,
    fd: BorrowedFd,
    foffset: u64,
    writable: bool,
) -> io::Result<()> {
    w.map(&MapRequest {
        owner,
        moffset,
        len,
        fd,
        foffset,
        writable,
    })
}

#[derive(Default)]
struct Rec {
    calls: Mutex<Vec<String>>,
    fail_map: AtomicBool,
    /// Descriptors of live maps by window offset (what the frontend would map).
    fds: Mutex<HashMap<u64, File>>,
    /// Held by a test to delay every reply.
    gate: Mutex<()>,
    /// Held by a test to delay the replies to maps that do not start a 2 MiB range
    /// (shadow tails).
    tail_gate: Mutex<()>,
    /// File offsets of live maps by window offset.
    foffs: Mutex<HashMap<u64, u64>>,
}

impl WindowSink for std::sync::Arc<Rec> {
    fn map(
        &self,
        moffset: u64,
        len: u64,
        _fd: BorrowedFd,
        foffset: u64,
        writable: bool,
    ) -> io::Result<()> {
        drop(self.gate.lock().unwrap());
        if moffset % MB2 != 0 {
            drop(self.tail_gate.lock().unwrap());
        }
        if self.fail_map.load(Ordering::SeqCst) {
            return Err(io::Error::other("frontend said no"));
        }
        self.fds
            .lock()
            .unwrap()
            .insert(moffset, File::from(_fd.try_clone_to_owned().unwrap()));
        self.foffs.lock().unwrap().insert(moffset, foffset);
        let w = if writable { "rw" } else { "ro" };
        self.calls
            .lock()
            .unwrap()
            .push(format!("map {moffset:#x}+{len:#x}@{foffset:#x} {w}"));
        Ok(())
    }
    fn unmap(&self, moffset: u64, len: u64) -> io::Result<()> {
        drop(self.gate.lock().unwrap());
        self.fds.lock().unwrap().remove(&moffset);
        self.calls
            .lock()
            .unwrap()
            .push(format!("unmap {moffset:#x}+{len:#x}"));
        Ok(())
    }
}

/// QEMU 11.1 as it answers SHMEM requests: the ack at once, the commit (the vCPUs' new
/// view of the window, then the backend's memory-table update) a moment later, from its
/// main loop (`vhost_user_backend_handle_shmem_map` replies before
/// `memory_region_transaction_commit`).
#[derive(Default)]
struct AckThenCommit {
    window: std::sync::OnceLock<std::sync::Weak<DaxWindow<Arc<AckThenCommit>>>>,
    acked: AtomicU64,
    /// Requests the guest can see (committed).
    visible: AtomicU64,
}

impl AckThenCommit {
    fn ack(self: &Arc<Self>) -> io::Result<()> {
        self.acked.fetch_add(1, Ordering::SeqCst);
        let me = Arc::clone(self);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let n = me.visible.fetch_add(1, Ordering::SeqCst) + 1;
            if let Some(w) = me.window.get().and_then(std::sync::Weak::upgrade) {
                // RAM plus the window's mappings; one of them a host file it mapped.
                w.note_table_regions(1 + n as usize, 1);
            }
        });
        Ok(())
    }
}

impl WindowSink for Arc<AckThenCommit> {
    fn map(&self, _: u64, _: u64, _: BorrowedFd, _: u64, _: bool) -> io::Result<()> {
        self.ack()
    }
    fn unmap(&self, _: u64, _: u64) -> io::Result<()> {
        self.ack()
    }
}

#[test]
fn a_mapping_is_answered_only_once_the_frontend_made_it_visible() {
    let q = Arc::new(AckThenCommit::default());
    let w = Arc::new(DaxWindow::new(8 * MB2).unwrap());
    q.window.set(Arc::downgrade(&w)).ok().unwrap();
    w.set_sink(q.clone());
    w.start();
    // The guest RAM at start-up.
    w.note_table_regions(1, 0);
    let f = tempfile::tempfile().unwrap();
    f.set_len(16 * MB2).unwrap();
    for i in 0..4 {
        // SETUPMAPPING, an upgrade (UNMAP + MAP), REMOVEMAPPING: the reply (the return)
        // must not reach the guest before the window change it answers is visible.
        map_at(&w, 1, i * MB2, MB2, f.as_fd(), i * MB2, false).unwrap();
        assert_eq!(
            q.visible.load(Ordering::SeqCst),
            q.acked.load(Ordering::SeqCst),
            "SETUPMAPPING answered before QEMU committed its SHMEM_MAP"
        );
        map_at(&w, 1, i * MB2, MB2, f.as_fd(), i * MB2, true).unwrap();
        assert_eq!(
            q.visible.load(Ordering::SeqCst),
            q.acked.load(Ordering::SeqCst),
            "upgrade answered before QEMU committed its SHMEM_UNMAP and SHMEM_MAP"
        );
        w.unmap(i * MB2, MB2).unwrap();
        assert_eq!(
            q.visible.load(Ordering::SeqCst),
            q.acked.load(Ordering::SeqCst),
            "REMOVEMAPPING answered before QEMU committed its SHMEM_UNMAP"
        );
    }
    assert_eq!(q.acked.load(Ordering::SeqCst), 16);
    assert!(w.stats().commit_waits >= 16);
}

/// A frontend that sends no memory-table update for SHMEM requests (the userspace driver)
/// costs one probe, not a wait per request.
#[test]
fn a_frontend_without_table_updates_is_probed_once() {
    let (w, _rec, f) = window();
    w.note_table_regions(1, 0);
    let t = std::time::Instant::now();
    for i in 0..4 {
        map_at(&w, 1, i * MB2, MB2, f.as_fd(), i * MB2, true).unwrap();
        w.unmap(i * MB2, MB2).unwrap();
    }
    assert!(
        t.elapsed() < COMMIT_PROBE + Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(w.stats().commit_waits, 1);
}

const MB2: u64 = 2 << 20;

fn window() -> (
    DaxWindow<std::sync::Arc<Rec>>,
    std::sync::Arc<Rec>,
    std::fs::File,
) {
    let (w, rec) = running(8 * MB2, DEFAULT_MAP_BUDGET);
    (w, rec, {
        let f = tempfile::tempfile().unwrap();
        f.set_len(16 * MB2).unwrap();
        f
    })
}

fn calls(r: &Rec) -> Vec<String> {
    std::mem::take(&mut *r.calls.lock().unwrap())
}

#[test]
fn map_unmap_round_trip() {
    let (w, rec, f) = window();
    map_at(&w, 7, MB2, MB2, f.as_fd(), 0, false).unwrap();
    assert_eq!(w.stats().mapped_bytes, MB2);
    w.unmap(MB2, MB2).unwrap();
    assert_eq!(
        calls(&rec),
        vec!["map 0x200000+0x200000@0x0 ro", "unmap 0x200000+0x200000"]
    );
    let s = w.stats();
    assert_eq!(
        (s.maps, s.unmaps, s.upgrades, s.failures, s.mapped_bytes),
        (1, 1, 0, 0, 0)
    );
}

#[test]
fn remap_of_live_range_is_unmap_then_map() {
    let (w, rec, f) = window();
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, false).unwrap();
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, true).unwrap();
    assert_eq!(
        calls(&rec),
        vec![
            "map 0x0+0x200000@0x0 ro",
            "unmap 0x0+0x200000",
            "map 0x0+0x200000@0x0 rw"
        ]
    );
    assert_eq!(w.stats().upgrades, 1);
    assert_eq!(w.stats().mapped_bytes, MB2);
}

#[test]
fn invalid_requests_send_nothing() {
    let (w, rec, f) = window();
    let fd = f.as_fd();
    assert!(map_at(&w, 7, 0, 0, fd, 0, false).is_err(), "zero length");
    assert!(
        map_at(&w, 7, 8 * MB2, MB2, fd, 0, false).is_err(),
        "past the end"
    );
    assert!(
        map_at(&w, 7, u64::MAX - 4095, 8192, fd, 0, false).is_err(),
        "overflowing sum"
    );
    assert!(
        map_at(&w, 7, 100, MB2, fd, 0, false).is_err(),
        "unaligned window offset"
    );
    assert!(
        map_at(&w, 7, 0, MB2, fd, 7, false).is_err(),
        "unaligned file offset"
    );
    assert!(
        map_at(&w, 7, 0, MB2, fd, u64::MAX - 4095, false).is_err(),
        "file range overflows"
    );
    assert!(w.unmap(0, !4095).is_err(), "unmap past the end");
    assert!(calls(&rec).is_empty());
    assert_eq!(w.stats().failures, 7);
}

#[test]
fn partial_overlaps_are_refused() {
    let (w, rec, f) = window();
    map_at(&w, 7, MB2, MB2, f.as_fd(), 0, false).unwrap();
    calls(&rec);
    assert!(map_at(&w, 7, MB2 + 4096, MB2, f.as_fd(), 0, false).is_err());
    assert!(map_at(&w, 7, 0, MB2 + 4096, f.as_fd(), 0, false).is_err());
    assert!(w.unmap(MB2, 4096).is_err());
    assert!(calls(&rec).is_empty());
    // A range that covers it wholly replaces it.
    map_at(&w, 7, 0, 4 * MB2, f.as_fd(), 0, false).unwrap();
    assert_eq!(
        calls(&rec),
        vec!["unmap 0x200000+0x200000", "map 0x0+0x800000@0x0 ro"]
    );
}

#[test]
fn unmapping_an_unmapped_range_is_a_no_op() {
    let (w, rec, _f) = window();
    w.unmap(0, MB2).unwrap();
    assert!(calls(&rec).is_empty());
    assert_eq!(w.stats().failures, 0);
}

#[test]
fn nothing_is_sent_while_stopped() {
    let (w, rec, f) = window();
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, false).unwrap();
    w.reset();
    assert_eq!(w.stats().mapped_bytes, 0, "reset forgets every mapping");
    calls(&rec);
    assert!(map_at(&w, 7, 0, MB2, f.as_fd(), 0, false).is_err());
    assert!(calls(&rec).is_empty());
    w.start();
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, false).unwrap();
    assert_eq!(
        calls(&rec),
        vec!["map 0x0+0x200000@0x0 ro"],
        "no stale unmap after reset"
    );
}

#[test]
fn frontend_refusal_is_eio_and_counted() {
    let (w, rec, f) = window();
    rec.fail_map.store(true, Ordering::SeqCst);
    let e = map_at(&w, 7, 0, MB2, f.as_fd(), 0, false).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    assert_eq!(w.stats().failures, 1);
    assert_eq!(w.stats().mapped_bytes, 0);
}

#[test]
fn short_files_get_a_shadow_tail() {
    let (w, rec, f) = window();
    f.set_len(MB2 / 2 + 100).unwrap();
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, true).unwrap();
    assert_eq!(
        calls(&rec),
        vec!["map 0x0+0x100000@0x0 rw", "map 0x100000+0x100000@0x0 rw"],
        "whole pages from the file, the rest from a tail"
    );
    assert_eq!(w.stats().tails, 1);
    // Growing the file through the request path re-places the mapping.
    f.set_len(MB2).unwrap();
    w.refresh(7);
    assert_eq!(
        calls(&rec),
        vec![
            "unmap 0x0+0x100000",
            "unmap 0x100000+0x100000",
            "map 0x0+0x200000@0x0 rw"
        ]
    );
    assert_eq!(w.stats().tails, 1, "no tail needed any more");
    // Refreshing an inode whose mappings are whole does nothing.
    w.refresh(7);
    w.refresh(8);
    assert!(calls(&rec).is_empty());
    // Shrinking splits it again.
    f.set_len(4096).unwrap();
    w.refresh(7);
    assert_eq!(
        calls(&rec),
        vec![
            "unmap 0x0+0x200000",
            "map 0x0+0x1000@0x0 rw",
            "map 0x1000+0x1ff000@0x0 rw"
        ]
    );
}

#[test]
fn empty_files_map_only_a_tail() {
    let (w, rec, f) = window();
    f.set_len(0).unwrap();
    map_at(&w, 7, MB2, MB2, f.as_fd(), 0, false).unwrap();
    assert_eq!(calls(&rec), vec!["map 0x200000+0x200000@0x0 ro"]);
    assert_eq!(f.metadata().unwrap().len(), 0, "the file is never extended");
}

fn tmpfile_with(bytes: &[u8], mode: u32) -> File {
    use std::os::unix::fs::PermissionsExt;
    let f = tempfile::tempfile().unwrap();
    f.write_all_at(bytes, 0).unwrap();
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .unwrap();
    f
}

/// Window bytes `[m, m+len)` as the frontend's mappings show them (every mapping here
/// starts at offset 0 of its descriptor).
fn window_read(rec: &Rec, m: u64, len: usize) -> Vec<u8> {
    let fds = rec.fds.lock().unwrap();
    let mut out = vec![0u8; len];
    for x in 0..len as u64 {
        let at = m + x;
        let (k, fd) = fds
            .iter()
            .filter(|(k, _)| **k <= at)
            .max_by_key(|(k, _)| **k)
            .expect("mapped");
        let mut b = [0u8; 1];
        fd.read_exact_at(&mut b, at - k).unwrap();
        out[x as usize] = b[0];
    }
    out
}

fn mapped_bytes(rec: &Rec, moffset: u64, len: usize) -> Vec<u8> {
    let fds = rec.fds.lock().unwrap();
    let mut v = vec![0u8; len];
    fds[&moffset].read_exact_at(&mut v, 0).unwrap();
    v
}

#[test]
fn executables_are_mapped_from_a_snapshot_without_a_writable_descriptor() {
    let (w, rec, _) = window();
    let f = tmpfile_with(&[7u8; 10000], 0o755);
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, false).unwrap();
    assert_eq!(calls(&rec), vec!["map 0x0+0x200000@0x0 ro"]);
    assert_eq!(w.stats().snapshots, 1);
    assert_eq!(mapped_bytes(&rec, 0, 10000), vec![7u8; 10000]);
    assert_eq!(mapped_bytes(&rec, 0, 10001)[10000], 0, "zero padded");
    // No descriptor of the file is kept by the window (no /proc/self/fd given).
    let t = w.table.lock().unwrap();
    assert!(t.live[&0].file.is_none());
    drop(t);
    // With /proc/self/fd, a read-only one, which follows host changes at sync points.
    let (w2, rec2) = running(8 * MB2, DEFAULT_MAP_BUDGET);
    w2.set_proc_self_fd(
        crate::sys::open(c"/proc/self/fd", libc::O_PATH | libc::O_DIRECTORY, 0).unwrap(),
    );
    map_at(&w2, 5, 0, MB2, f.as_fd(), 0, false).unwrap();
    {
        let t = w2.table.lock().unwrap();
        let kept = t.live[&0].file.as_ref().expect("a read-only descriptor");
        assert!(!fd_writable(kept.as_fd()));
    }
    f.write_all_at(b"new", 0).unwrap();
    w2.sync(5);
    assert_eq!(&mapped_bytes(&rec2, 0, 3), b"new");
    // A writable mapping of it maps the file itself.
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, true).unwrap();
    assert_eq!(
        calls(&rec),
        vec![
            "unmap 0x0+0x200000",
            "map 0x0+0x2000@0x0 rw",
            "map 0x2000+0x1fe000@0x0 rw"
        ]
    );
}

#[test]
fn read_only_descriptors_get_a_snapshot_kept_coherent() {
    let (w, rec, _) = window();
    let path = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(path.path(), [1u8; 5000]).unwrap();
    let ro = File::open(path.path()).unwrap();
    map_at(&w, 9, 0, MB2, ro.as_fd(), 0, false).unwrap();
    assert_eq!(calls(&rec), vec!["map 0x0+0x200000@0x0 ro"]);
    // A writable mapping needs a writable descriptor.
    let e = map_at(&w, 9, MB2, MB2, ro.as_fd(), 0, true).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES));
    // The host changes the file: the next sync point shows it to the guest.
    let rw = std::fs::OpenOptions::new()
        .write(true)
        .open(path.path())
        .unwrap();
    rw.write_all_at(&[2u8; 100], 4000).unwrap();
    w.sync(9);
    let got = mapped_bytes(&rec, 0, 5000);
    assert_eq!(
        &got[3999..4101],
        &[&[1u8][..], &[2u8; 100], &[1u8]].concat()[..]
    );
}

#[test]
fn aliases_share_one_tail() {
    let (w, rec, _) = window();
    let path = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(path.path(), b"hello world").unwrap();
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path.path())
            .unwrap()
    };
    let (a, b) = (open(), open());
    // Two inodes (a bind mount alias) map the same host range at two window offsets.
    map_at(&w, 1, 0, MB2, a.as_fd(), 0, true).unwrap();
    map_at(&w, 2, MB2, MB2, b.as_fd(), 0, true).unwrap();
    calls(&rec);
    let fds = rec.fds.lock().unwrap();
    fds[&0].write_all_at(b"HELLO", 0).unwrap();
    let mut via_b = [0u8; 5];
    fds[&MB2].read_exact_at(&mut via_b, 0).unwrap();
    assert_eq!(&via_b, b"HELLO", "one memfd behind both mappings");
    drop(fds);
    // Writing back through either inode writes the bytes once; the other has no stale
    // copy to overwrite them with.
    w.sync(2);
    w.sync(1);
    assert_eq!(std::fs::read(path.path()).unwrap(), b"HELLO world");
    assert_eq!(w.stats().written_back, 5);
}

#[test]
fn size_changes_replace_only_when_the_page_layout_changes() {
    let (w, rec, f) = window();
    f.set_len(100).unwrap();
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, true).unwrap();
    calls(&rec);
    // Growth inside the last page: the tail is updated in place, nothing re-placed.
    f.write_all_at(b"grown", 100).unwrap();
    w.refresh(7);
    w.sync(7);
    assert!(
        calls(&rec).is_empty(),
        "no unmap/map for an unchanged layout"
    );
    assert_eq!(&mapped_bytes(&rec, 0, 105)[100..], b"grown");
    // Growth past the page: re-placed once.
    f.set_len(3 * 4096).unwrap();
    w.sync(7);
    assert_eq!(
        calls(&rec),
        vec![
            "unmap 0x0+0x200000",
            "map 0x0+0x3000@0x0 rw",
            "map 0x3000+0x1fd000@0x0 rw"
        ]
    );
    assert_eq!(w.stats().replaced, 1);
}

#[test]
fn the_budget_folds_tails_into_one_mapping_per_range() {
    // 8 ranges, room for 10 frontend mappings: small files need 2 each, so most fold.
    let (w, rec) = running(8 * MB2, 10);
    let files: Vec<File> = (0..8)
        .map(|i| tmpfile_with(&vec![i as u8; 5000], 0o644))
        .collect();
    for (i, f) in files.iter().enumerate() {
        map_at(&w, i as u64, i as u64 * MB2, MB2, f.as_fd(), 0, true).unwrap();
    }
    let s = w.stats();
    assert!(s.peak_regions <= 10, "{s}");
    assert!(s.merged > 0, "{s}");
    assert_eq!(s.mapped_bytes, 8 * MB2);
    // Every range shows its file's bytes, zero padded.
    for (i, _) in files.iter().enumerate() {
        let m = i as u64 * MB2;
        let mut want = vec![i as u8; 5000];
        want.resize(8192, 0);
        assert_eq!(window_read(&rec, m, 8192), want, "range {i}");
    }
    // A hostile guest mapping 4 KiB pieces runs into the budget and gets ENOSPC.
    let (w2, _) = running(2 * MB2, 2);
    let f = tmpfile_with(&[0u8; 8192], 0o644);
    map_at(&w2, 1, 0, 4096, f.as_fd(), 0, false).unwrap();
    map_at(&w2, 1, 4096, 4096, f.as_fd(), 0, false).unwrap();
    let e = map_at(&w2, 1, 8192, 4096, f.as_fd(), 0, false).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
}

#[test]
fn smaller_guest_ranges_past_the_budget_go_to_the_pool() {
    // 4 MiB window, room for 2 frontend mappings: 2 ranges of 2 MiB at first.
    let (w, rec) = running(2 * MB2, 2);
    assert_eq!((w.ranges(), w.budget(), w.pooled()), (2, 2, false));
    let f = tmpfile_with(&vec![7u8; 4 << 20], 0o644);
    // A guest mounted with dax_range=512k maps 8 ranges of 512 KiB: more than the budget,
    // so the window becomes one pooled mapping and every range fits.
    let r = 512 << 10;
    for i in 0..8 {
        map_at(&w, 1, i * r, r, f.as_fd(), i * r, i % 2 == 1).unwrap();
    }
    assert_eq!((w.ranges(), w.budget(), w.pooled()), (8, 2, true));
    assert_eq!(calls(&rec), vec!["map 0x0+0x400000@0x0 rw"]);
    assert_eq!(w.stats().peak_regions, 1, "{}", w.stats());
    assert_eq!(frontend_read(&rec, 0, 4 << 20), vec![7u8; 4 << 20]);
    // Below MIN_GUEST_RANGE, or unaligned, the ranges stay 2 MiB: a hostile guest's
    // 4 KiB pieces run into the budget (ENOSPC), they cannot grow the frontend's map.
    let (w2, _) = running(2 * MB2, 2);
    map_at(&w2, 1, 0, 4096, f.as_fd(), 0, false).unwrap();
    map_at(
        &w2,
        1,
        3 * MIN_GUEST_RANGE,
        MIN_GUEST_RANGE * 2,
        f.as_fd(),
        0,
        false,
    )
    .unwrap();
    assert_eq!((w2.ranges(), w2.budget()), (2, 2));
    let e = map_at(&w2, 1, MB2, 4096, f.as_fd(), 0, false).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
}

const GB: u64 = 1 << 30;
const MB8: u64 = 8 << 20;

#[test]
fn large_guest_ranges_keep_a_large_window_direct() {
    // 1 GiB has 512 ranges of 2 MiB, more than the budget (445): pooled until the guest's
    // first mapping shows its range size. The hybrid guest kernel maps the window over 128:
    // 128 ranges of 8 MiB, each a frontend mapping of the file.
    let (w, rec) = running(GB, DEFAULT_MAP_BUDGET);
    assert_eq!((w.ranges(), w.pooled()), (512, true));
    let f = data_file(3, 2 * MB8 as usize);
    map_at(&w, 1, 0, MB8, f.as_fd(), 0, false).unwrap();
    map_at(&w, 1, 5 * MB8, MB8, f.as_fd(), MB8, true).unwrap();
    assert_eq!((w.ranges(), w.pooled()), (128, false));
    assert_eq!(
        calls(&rec),
        vec![
            "map 0x0+0x800000@0x0 ro",
            "map 0x2800000+0x800000@0x800000 rw"
        ]
    );
    assert_eq!(frontend_read(&rec, 5 * MB8, 4096), vec![3u8; 4096]);
    let s = w.stats();
    assert_eq!((s.pooled, s.regions, s.failures), (0, 2, 0), "{s}");
}

#[test]
fn smaller_ranges_after_large_ones_keep_the_budget() {
    // The guest shows 8 MiB ranges (128 in 1 GiB: direct), then maps 2 MiB ones: 512 of them
    // fit the window, more than the budget. The frontend never holds more than the budget:
    // they are placed directly up to it, then refused with ENOSPC while the window holds
    // mappings of its own; once those are gone, the pool serves every range.
    let (w, rec) = running(GB, DEFAULT_MAP_BUDGET);
    let f = data_file(5, MB8 as usize);
    map_at(&w, 1, 0, MB8, f.as_fd(), 0, false).unwrap();
    assert!(!w.pooled());
    let (mut placed, mut refused) = (1, None);
    for i in 0..(GB - MB8) / MB2 {
        match map_at(&w, 2, MB8 + i * MB2, MB2, f.as_fd(), 0, false) {
            Ok(()) => placed += 1,
            Err(e) => {
                refused = Some(e.raw_os_error());
                break;
            }
        }
    }
    assert_eq!(
        (placed, refused),
        (DEFAULT_MAP_BUDGET, Some(Some(libc::ENOSPC)))
    );
    assert_eq!((w.ranges(), w.pooled()), (512, true));
    let s = w.stats();
    assert_eq!(
        (s.peak_regions, s.regions, s.pooled),
        (DEFAULT_MAP_BUDGET as u64, DEFAULT_MAP_BUDGET as u64, 0),
        "{s}"
    );
    // A larger range again changes nothing: the window stays at 2 MiB ranges.
    w.unmap(0, GB).unwrap();
    calls(&rec);
    map_at(&w, 3, 0, MB8, f.as_fd(), 0, false).unwrap();
    for i in 0..8 {
        map_at(&w, 3, MB8 + i * MB2, MB2, f.as_fd(), 0, i % 2 == 0).unwrap();
    }
    assert_eq!(calls(&rec), vec!["map 0x0+0x40000000@0x0 rw"]);
    let s = w.stats();
    assert_eq!((w.ranges(), s.regions, s.pooled), (512, 1, 9), "{s}");
}

#[test]
fn pooled_mode_sends_one_shmem_request_however_the_guest_maps() {
    // 8 ranges, well within the budget: direct would send a SHMEM request per guest map and
    // unmap (QEMU 11.1.3 crashes on one it reads after a `stop` began); pooled sends the
    // pool's one map, and the guest still reads the file's bytes.
    let (w, rec) = running(8 * MB2, DEFAULT_MAP_BUDGET);
    w.set_map_mode(super::mode::MapMode::Pooled);
    assert!(w.pooled());
    let f = data_file(7, 3 * MB2 as usize);
    for _ in 0..3 {
        for i in 0..8u64 {
            map_at(&w, i, i * MB2, MB2, f.as_fd(), (i % 3) * MB2, i % 2 == 0).unwrap();
        }
        for i in 0..8u64 {
            w.unmap(i * MB2, MB2).unwrap();
        }
    }
    map_at(&w, 9, 5 * MB2, MB2, f.as_fd(), MB2, false).unwrap();
    assert_eq!(calls(&rec), vec!["map 0x0+0x1000000@0x0 rw"]);
    assert!(pool_read(&rec, 5 * MB2, 4096).iter().all(|&b| b == 7));
    let s = w.stats();
    assert_eq!((s.pooled, s.peak_regions, s.failures), (25, 1, 0), "{s}");
    w.set_map_mode(super::mode::MapMode::Direct);
    assert!(
        w.pooled(),
        "the pool stays for the session once it is in the frontend"
    );
}

#[test]
fn a_window_with_more_ranges_than_the_budget_is_one_pooled_mapping() {
    // 16 ranges, room for 4 frontend mappings: a guest that maps all 16 (half of them
    // writable, of files shorter than a range) is never refused and the frontend holds
    // one mapping.
    let (w, rec) = running(16 * MB2, 4);
    assert!(w.pooled());
    let files: Vec<File> = (0..16).map(|i| data_file(i as u8 + 1, 5000)).collect();
    for (i, f) in files.iter().enumerate() {
        map_at(&w, i as u64, i as u64 * MB2, MB2, f.as_fd(), 0, i % 2 == 1).unwrap();
    }
    assert_eq!(calls(&rec), vec!["map 0x0+0x2000000@0x0 rw"]);
    let s = w.stats();
    assert_eq!((s.pooled, s.peak_regions, s.failures), (16, 1, 0), "{s}");
    for i in 0..16u64 {
        let got = pool_read(&rec, i * MB2, 8192);
        assert!(got[..5000].iter().all(|&b| b == i as u8 + 1), "range {i}");
        assert!(got[5000..].iter().all(|&b| b == 0), "range {i} zero padded");
    }
    // The guest stores into a writable range; the host writes another page of the file:
    // the next sync point writes the guest's run and shows the host's bytes.
    let pool = rec.fds.lock().unwrap()[&0].try_clone().unwrap();
    pool.write_all_at(b"GUEST", MB2 + 10).unwrap();
    files[1].write_all_at(b"HOST", 4096 + 100).unwrap();
    w.sync(1);
    let mut got = [0u8; 5];
    files[1].read_exact_at(&mut got, 10).unwrap();
    assert_eq!(&got, b"GUEST");
    assert_eq!(&pool_read(&rec, MB2 + 4096 + 100, 4), b"HOST");
    assert_eq!(files[1].metadata().unwrap().len(), 5000, "never extended");
    assert_eq!(w.stats().conflicts, 0);
    // Both change the same page between two sync points: the agreed bytes of a pooled page
    // are kept as a hash, so the guest's page is written whole (as a guest page cache writes
    // a dirty page back), counted as a conflict. Every other page keeps the host's bytes.
    pool.write_all_at(b"again", MB2 + 10).unwrap();
    files[1].write_all_at(b"HOST2", 200).unwrap();
    files[1].write_all_at(b"HOST3", 4096 + 200).unwrap();
    w.sync(1);
    let mut got = [0u8; 5];
    files[1].read_exact_at(&mut got, 10).unwrap();
    assert_eq!(&got, b"again");
    files[1].read_exact_at(&mut got, 200).unwrap();
    assert_eq!(got, [2u8; 5], "the guest's page won");
    assert_eq!(&pool_read(&rec, MB2 + 4096 + 200, 5), b"HOST3");
    assert_eq!(w.stats().conflicts, 1);
    // A read-only range follows the file at sync points and never writes it back.
    pool.write_all_at(b"X", 0).unwrap();
    files[0].write_all_at(b"NEW", 0).unwrap();
    w.sync(0);
    assert_eq!(&pool_read(&rec, 0, 3), b"NEW");
    // An upgrade stays in the pool; guest stores reach the file.
    map_at(&w, 0, 0, MB2, files[0].as_fd(), 0, true).unwrap();
    pool.write_all_at(b"up", 3).unwrap();
    w.unmap(0, MB2).unwrap();
    let mut got = [0u8; 5];
    files[0].read_exact_at(&mut got, 0).unwrap();
    assert_eq!(&got, b"NEWup");
    assert!(
        calls(&rec).is_empty(),
        "nothing sent for maps, upgrades, unmaps"
    );
    assert_eq!(pool_read(&rec, 0, 8), vec![0u8; 8], "freed");
    // A reset drops the pool (the frontend did) after writing back; the next map puts
    // it back. DESTROY unmaps it.
    pool.write_all_at(b"Z", 3 * MB2).unwrap();
    w.reset();
    let mut got = [0u8; 1];
    files[3].read_exact_at(&mut got, 0).unwrap();
    assert_eq!(&got, b"Z", "written back at the reset");
    w.start();
    map_at(&w, 3, 0, MB2, files[3].as_fd(), 0, false).unwrap();
    w.end_session();
    assert_eq!(
        calls(&rec),
        vec!["map 0x0+0x2000000@0x0 rw", "unmap 0x0+0x2000000"]
    );
}

#[test]
fn a_reset_during_the_pools_map_drops_it_and_maps_it_again() {
    let w: DaxWindow<Arc<Rec>> = DaxWindow::with_budget(8 * MB2, 2).unwrap();
    let w = Arc::new(w);
    let rec = Arc::new(Rec::default());
    w.set_sink(rec.clone());
    w.start();
    let f = data_file(4, MB2 as usize);
    let gate = rec.gate.lock().unwrap();
    let (w2, fd) = (w.clone(), f.try_clone().unwrap());
    let t = std::thread::spawn(move || map_at(&w2, 1, 0, MB2, fd.as_fd(), 0, false));
    std::thread::sleep(Duration::from_millis(100));
    let started = std::time::Instant::now();
    w.reset();
    assert!(started.elapsed() < Duration::from_secs(1), "reset waited");
    drop(gate);
    assert!(t.join().unwrap().is_err(), "the map raced a reset");
    w.start();
    map_at(&w, 1, MB2, MB2, f.as_fd(), 0, false).unwrap();
    assert_eq!(
        calls(&rec),
        vec![
            "map 0x0+0x1000000@0x0 rw",
            "unmap 0x0+0x1000000",
            "map 0x0+0x1000000@0x0 rw"
        ],
        "the pool the frontend may have kept is taken out before it is mapped again"
    );
    assert_eq!(pool_read(&rec, MB2, 4), vec![4u8; 4]);
    let s = w.stats();
    assert_eq!((s.regions, s.mapped_bytes), (1, MB2), "{s}");
}

#[test]
fn a_reset_does_not_wait_for_a_tail_mapping_in_flight() {
    // Issue #20 c: a shadow's mutex held across the tail's SHMEM_MAP round trip while
    // the reset writes that shadow back.
    let (w, rec, _) = window();
    let w = Arc::new(w);
    let path = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(path.path(), [5u8; 5000]).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path.path())
        .unwrap();
    // A live mapping with a tail, then another mapping of the same range (same shadow)
    // whose tail reply the frontend holds back.
    map_at(&w, 7, MB2, MB2, f.as_fd(), 0, true).unwrap();
    let gate = rec.tail_gate.lock().unwrap();
    let (w2, fd) = (w.clone(), f.try_clone().unwrap());
    let t = std::thread::spawn(move || map_at(&w2, 8, 0, MB2, fd.as_fd(), 0, true));
    std::thread::sleep(Duration::from_millis(200));
    let (tx, rx) = std::sync::mpsc::channel();
    let w3 = w.clone();
    let r = std::thread::spawn(move || {
        w3.reset();
        tx.send(()).unwrap();
    });
    let done = rx.recv_timeout(Duration::from_secs(2));
    drop(gate);
    r.join().unwrap();
    let _ = t.join().unwrap();
    assert!(
        done.is_ok(),
        "the reset waited for the frontend's tail reply"
    );
}

#[test]
fn a_failed_setattr_that_shrank_the_file_still_replaces_its_mappings() {
    // Issue #20 a: a SETATTR that truncates and then fails (an invalid mtime after the
    // size) leaves whole-page file mappings past the new EOF unless the mappings are
    // re-placed whatever the result.
    use crate::protocol::filesystem::{Context, FileSystem, Handle, Inode};
    struct TruncatesThenFails(File);
    impl FileSystem for TruncatesThenFails {
        fn setattr(
            &self,
            _: &Context,
            _: Inode,
            _: &crate::protocol::abi::SetattrIn,
            _: Option<Handle>,
        ) -> io::Result<(crate::protocol::abi::Attr, Duration)> {
            self.0.set_len(0)?;
            Err(io::Error::from_raw_os_error(libc::EINVAL))
        }
    }
    let (w, rec, f) = window();
    let w = Arc::new(w);
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, true).unwrap();
    calls(&rec);
    let fs = coherent::Coherent::new(TruncatesThenFails(f.try_clone().unwrap()), Some(w.clone()));
    let ctx = Context {
        uid: 0,
        gid: 0,
        pid: 0,
    };
    let e = fs
        .setattr(
            &ctx,
            Inode::from_raw(7),
            &crate::protocol::abi::SetattrIn::default(),
            None,
        )
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    assert_eq!(
        calls(&rec),
        vec!["unmap 0x0+0x200000", "map 0x0+0x200000@0x0 rw"],
        "the file's pages leave the window; the range is a shadow of the empty file"
    );
}

#[test]
fn a_flush_writes_back_while_the_window_maps_the_inode() {
    // FLUSH runs on the queue's thread only where it writes nothing back: an inode the window
    // maps has tails or copies to write back first, whatever the file system says.
    use crate::protocol::filesystem::{FileSystem, Inode};
    struct LocalDisk;
    impl FileSystem for LocalDisk {
        fn flush_writes_back(&self, _: Inode) -> bool {
            false
        }
    }
    let (w, _rec, f) = window();
    let w = Arc::new(w);
    let fs = coherent::Coherent::new(LocalDisk, Some(w.clone()));
    assert!(!fs.flush_writes_back(Inode::from_raw(7)));
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, true).unwrap();
    assert!(fs.flush_writes_back(Inode::from_raw(7)), "mapped");
    assert!(!fs.flush_writes_back(Inode::from_raw(8)), "another inode");
    w.unmap(0, MB2).unwrap();
    assert!(!fs.flush_writes_back(Inode::from_raw(7)), "unmapped");
}

#[test]
fn a_writers_close_sends_flush_when_there_is_a_window() {
    // With a window the guest's close of a writer is where it has the server set the times
    // after stores through the window: NOFLUSH from the file system is dropped for writers
    // only. Without a window the file system's answer stands.
    use crate::protocol::abi::fopen;
    use crate::protocol::filesystem::{Context, Entry, FileSystem, Handle, Inode, OpenFlags};
    use std::ffi::CStr;
    struct NoFlushes;
    impl FileSystem for NoFlushes {
        fn open(&self, _: &Context, _: Inode, _: u32, _: u32) -> io::Result<(Handle, OpenFlags)> {
            Ok((Handle::from_raw(1), fopen::NOFLUSH | fopen::KEEP_CACHE))
        }
        #[allow(clippy::too_many_arguments)]
        fn create(
            &self,
            _: &Context,
            _: Inode,
            _: &CStr,
            _: u32,
            _: u32,
            _: u32,
            _: u32,
        ) -> io::Result<(Entry, Handle, OpenFlags)> {
            Ok((Entry::default(), Handle::from_raw(1), fopen::NOFLUSH))
        }
        fn tmpfile(
            &self,
            _: &Context,
            _: Inode,
            _: u32,
            _: u32,
            _: u32,
        ) -> io::Result<(Entry, Handle, OpenFlags)> {
            Ok((Entry::default(), Handle::from_raw(1), fopen::NOFLUSH))
        }
    }
    let ctx = Context::default();
    let (w, _rec, _f) = window();
    let with = coherent::Coherent::new(NoFlushes, Some(Arc::new(w)));
    let without = coherent::Coherent::new(NoFlushes, None);
    let name = c"f";
    for (flags, windowed) in [
        (libc::O_RDONLY, fopen::NOFLUSH),
        (libc::O_WRONLY, 0),
        (libc::O_RDWR, 0),
        (libc::O_RDWR | libc::O_APPEND, 0),
    ] {
        let f = flags as u32;
        let o = with.open(&ctx, Inode::from_raw(7), f, 0).unwrap().1;
        assert_eq!(o, windowed | fopen::KEEP_CACHE, "open {flags:#o}");
        assert_eq!(
            with.create(&ctx, Inode::ROOT, name, 0o644, f, 0, 0)
                .unwrap()
                .2,
            windowed
        );
        assert_eq!(
            with.tmpfile(&ctx, Inode::ROOT, 0o644, f, 0).unwrap().2,
            windowed
        );
        let o = without.open(&ctx, Inode::from_raw(7), f, 0).unwrap().1;
        assert_eq!(
            o,
            fopen::NOFLUSH | fopen::KEEP_CACHE,
            "no window {flags:#o}"
        );
        let o = without
            .create(&ctx, Inode::ROOT, name, 0o644, f, 0, 0)
            .unwrap()
            .2;
        assert_eq!(o, fopen::NOFLUSH);
    }
}

#[test]
fn a_grown_shadow_holds_the_files_bytes() {
    // Issue #20 e: a longer mapping of a shadowed range grows the shadow; the grown part
    // must hold the file's bytes, not zeros.
    let (w, rec, _) = window();
    let path = tempfile::NamedTempFile::new().unwrap();
    let bytes: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8 + 1).collect();
    std::fs::write(path.path(), &bytes).unwrap();
    let ro = File::open(path.path()).unwrap();
    map_at(&w, 9, 0, 4096, ro.as_fd(), 0, false).unwrap();
    map_at(&w, 9, MB2, 4 * 4096, ro.as_fd(), 0, false).unwrap();
    assert_eq!(mapped_bytes(&rec, MB2, 3 * 4096), bytes);
    w.sync(9);
    assert_eq!(mapped_bytes(&rec, MB2, 3 * 4096), bytes);
    assert_eq!(std::fs::read(path.path()).unwrap(), bytes);
}

#[test]
fn reset_and_pause_never_wait_for_a_frontend_round_trip() {
    let (w, rec, f) = window();
    let w = Arc::new(w);
    let gate = rec.gate.lock().unwrap();
    // A SETUPMAPPING whose SHMEM_MAP reply is held back by the frontend.
    let w2 = w.clone();
    let fd = f.try_clone().unwrap();
    let t = std::thread::spawn(move || map_at(&w2, 7, 0, MB2, fd.as_fd(), 0, false));
    std::thread::sleep(Duration::from_millis(50));
    let started = std::time::Instant::now();
    w.device_paused_for_test();
    w.reset();
    w.sync(8);
    w.sync_all();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "pause/reset waited for the frontend"
    );
    drop(gate);
    let _ = t.join().unwrap();
    assert_eq!(
        w.stats().mapped_bytes,
        0,
        "nothing published across the reset"
    );
    // The frontend may have applied that map after its reset: it is unmapped before the
    // range is used again.
    calls(&rec);
    w.start();
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, false).unwrap();
    assert_eq!(
        calls(&rec),
        vec!["unmap 0x0+0x200000", "map 0x0+0x200000@0x0 ro"]
    );
}

#[test]
fn an_unmap_while_paused_is_sent_once_the_device_runs() {
    let (w, rec, f) = window();
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, false).unwrap();
    calls(&rec);
    // stop/cont keeps QEMU's mappings: a removal that completes while paused is not
    // sent then, and not forgotten either.
    w.pause();
    w.unmap(0, MB2).unwrap();
    assert!(calls(&rec).is_empty());
    w.start();
    map_at(&w, 7, 0, MB2, f.as_fd(), 0, true).unwrap();
    assert_eq!(
        calls(&rec),
        vec!["unmap 0x0+0x200000", "map 0x0+0x200000@0x0 rw"]
    );
    // DESTROY sends the pending ones too.
    map_at(&w, 7, MB2, MB2, f.as_fd(), 0, false).unwrap();
    w.pause();
    w.unmap(MB2, MB2).unwrap();
    w.start();
    calls(&rec);
    w.end_session();
    let mut got = calls(&rec);
    got.sort();
    assert_eq!(got, vec!["unmap 0x0+0x200000", "unmap 0x200000+0x200000"]);
}

/// Window bytes `[m, m+len)` as the pool (the frontend mapping at 0) shows them.
fn pool_read(rec: &Rec, m: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rec.fds.lock().unwrap()[&0]
        .read_exact_at(&mut v, m)
        .unwrap();
    v
}

/// Window bytes `[m, m+len)` of the frontend mapping that starts at `m`, at its file
/// offset.
fn frontend_read(rec: &Rec, m: u64, len: usize) -> Vec<u8> {
    let fds = rec.fds.lock().unwrap();
    let at = rec.foffs.lock().unwrap()[&m];
    let mut v = vec![0u8; len];
    fds[&m].read_exact_at(&mut v, at).unwrap();
    v
}

/// A running window of `size` bytes and `budget` frontend mappings, with its recorder.
fn running(size: u64, budget: usize) -> (DaxWindow<Arc<Rec>>, Arc<Rec>) {
    let w = DaxWindow::with_budget(size, budget).unwrap();
    let rec = Arc::new(Rec::default());
    w.set_sink(rec.clone());
    w.start();
    (w, rec)
}

fn copy_window(mode: CopyMode, ranges: u64, budget: usize) -> (DaxWindow<Arc<Rec>>, Arc<Rec>) {
    let (w, rec) = running(ranges * MB2, budget);
    w.set_copy_mode(mode);
    (w, rec)
}

fn data_file(fill: u8, len: usize) -> File {
    let f = tempfile::tempfile().unwrap();
    f.write_all_at(&vec![fill; len], 0).unwrap();
    f
}

mod copy_slots;
mod kept_direct;
mod pool;
