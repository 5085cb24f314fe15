//! The pool's write-back (issue #36): errors reported and bytes kept, sync points that wait
//! for merges, merges limited to what a request touches, host memory bounded by what the guest
//! maps, and the window taken back from the restart holder's vault.

use super::*;

/// A host file that can be made to refuse writes: a memfd that takes `F_SEAL_WRITE` (pwrite
/// then fails with EPERM, as on an immutable file).
fn sealable_file(fill: u8, len: usize) -> File {
    // SAFETY: the name is NUL-terminated; memfd_create takes no other pointers.
    let fd = unsafe { libc::memfd_create(c"host".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: a new descriptor nothing else owns.
    let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    f.write_all_at(&vec![fill; len], 0).unwrap();
    f
}

fn refuse_writes(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: F_ADD_SEALS takes an integer; `f` is a valid descriptor.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_WRITE) };
    assert_eq!(r, 0, "F_SEAL_WRITE: {}", io::Error::last_os_error());
}

/// A file system whose own calls succeed, with a new handle per open.
#[derive(Default)]
struct Opens(AtomicU64);

use crate::protocol::filesystem::{Context, FileSystem, Handle, Inode, LockOwner, OpenFlags};

impl FileSystem for Opens {
    fn open(&self, _: &Context, _: Inode, _: u32, _: u32) -> io::Result<(Handle, OpenFlags)> {
        Ok((
            Handle::from_raw(self.0.fetch_add(1, Ordering::SeqCst) + 1),
            0,
        ))
    }
    fn fsync(&self, _: &Context, _: Inode, _: bool, _: Handle) -> io::Result<()> {
        Ok(())
    }
    fn flush(&self, _: &Context, _: Inode, _: Handle, _: LockOwner) -> io::Result<()> {
        Ok(())
    }
    fn syncfs(&self, _: &Context, _: Inode) -> io::Result<()> {
        Ok(())
    }
}

fn errno(r: io::Result<()>) -> Option<i32> {
    r.err().map(|e| e.raw_os_error().unwrap_or(-1))
}

#[test]
fn a_failed_pooled_write_back_is_reported_and_its_bytes_are_kept() {
    // Issue #36, 1: the guest stores through a writable pooled range of a file the host no
    // longer lets anyone write. FSYNC, FLUSH and SYNCFS fail with the error (never 0 while the
    // bytes are not in the file); REMOVEMAPPING keeps them (stranded), and the next pooled
    // mapping of the range shows them to the guest again.
    let (w, rec) = running(8 * MB2, DEFAULT_MAP_BUDGET);
    w.set_map_mode(crate::dax::mode::MapMode::Pooled);
    let w = Arc::new(w);
    let fs = coherent::Coherent::new(Opens::default(), Some(w.clone()));
    let ctx = Context::default();
    let (ino, six) = (Inode::from_raw(5), Inode::from_raw(6));
    let host = sealable_file(7, 3 * MB2 as usize);
    let (h1, _) = fs.open(&ctx, ino, libc::O_RDWR as u32, 0).unwrap();
    map_at(&*w, 5, MB2, MB2, host.as_fd(), MB2, true).unwrap();
    let pool = rec.fds.lock().unwrap()[&0].try_clone().unwrap();
    pool.write_all_at(b"GUEST", MB2 + 10).unwrap();
    assert_eq!(
        errno(fs.fsync(&ctx, ino, false, h1)),
        None,
        "a write-back that works"
    );
    let mut got = [0u8; 5];
    host.read_exact_at(&mut got, MB2 + 10).unwrap();
    assert_eq!(&got, b"GUEST");

    pool.write_all_at(b"LOST?", MB2 + 100).unwrap();
    refuse_writes(&host);
    let (h2, _) = fs.open(&ctx, ino, libc::O_RDWR as u32, 0).unwrap();
    assert_eq!(errno(fs.fsync(&ctx, ino, false, h1)), Some(libc::EPERM));
    assert_eq!(
        errno(fs.flush(&ctx, ino, h2, LockOwner::default())),
        Some(libc::EPERM)
    );
    assert_eq!(errno(fs.syncfs(&ctx, Inode::ROOT)), Some(libc::EPERM));
    assert_eq!(errno(fs.fsync(&ctx, six, false, h1)), None, "another inode");
    assert!(w.stats().wb_failures >= 3, "{}", w.stats());

    // The guest removes the range: its bytes leave the pool but are kept.
    w.unmap(MB2, MB2).unwrap();
    assert_eq!(
        pool_read(&rec, MB2 + 100, 5),
        vec![0u8; 5],
        "the pool is freed"
    );
    assert_eq!(w.stats().stranded, 1, "{}", w.stats());
    assert_eq!(
        errno(fs.fsync(&ctx, ino, false, h2)),
        Some(libc::EPERM),
        "still not written"
    );
    // Mapped again (another window offset): the guest sees its own bytes, not the file's.
    map_at(&*w, 5, 3 * MB2, MB2, host.as_fd(), MB2, true).unwrap();
    assert_eq!(w.stats().stranded, 0, "taken over");
    assert_eq!(&pool_read(&rec, 3 * MB2 + 100, 5), b"LOST?");
    assert_eq!(&pool_read(&rec, 3 * MB2 + 10, 5), b"GUEST");
    // A reset cannot write them either: they stay stranded, not freed.
    w.reset();
    assert_eq!(w.stats().stranded, 1, "{}", w.stats());
    host.read_exact_at(&mut got, MB2 + 100).unwrap();
    assert_eq!(got, [7u8; 5], "the host file was never written");
}

#[test]
fn a_sync_point_waits_for_a_merge_in_progress() {
    // Issue #36, 2: a range claimed by another merge (the periodic write-back) is out of the
    // table meanwhile; an FSYNC of its inode must wait for that merge, not report at once.
    let (w, rec) = running(8 * MB2, DEFAULT_MAP_BUDGET);
    w.set_map_mode(crate::dax::mode::MapMode::Pooled);
    let w = Arc::new(w);
    let host = data_file(7, MB2 as usize);
    map_at(&*w, 5, 0, MB2, host.as_fd(), 0, true).unwrap();
    let (gen, taken) = w.claim(0, MB2).unwrap();
    let synced = Arc::new(AtomicBool::new(false));
    let t = {
        let (w, synced) = (w.clone(), synced.clone());
        std::thread::spawn(move || {
            w.sync(5);
            synced.store(true, Ordering::SeqCst);
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !synced.load(Ordering::SeqCst),
        "the sync point did not wait for the merge"
    );
    let pool = rec.fds.lock().unwrap()[&0].try_clone().unwrap();
    pool.write_all_at(b"late", 64).unwrap();
    let (m, p) = taken.into_iter().next().unwrap();
    w.release(gen, m, Some(p), 0);
    t.join().unwrap();
    let mut got = [0u8; 4];
    host.read_exact_at(&mut got, 64).unwrap();
    assert_eq!(&got, b"late", "the sync point merged after the claim ended");
}

#[test]
fn a_merge_of_a_stale_candidate_never_touches_its_neighbours() {
    // Issue #36, 5: a sync point looks at the table, then claims. If the guest remapped
    // meanwhile with other lengths, only what is mapped at that offset now may be claimed:
    // a neighbour taken out and not put back would be freed (zeroed) while the guest maps it.
    let (w, rec) = running(8 * MB2, DEFAULT_MAP_BUDGET);
    w.set_map_mode(crate::dax::mode::MapMode::Pooled);
    let f = data_file(7, 4 * MB2 as usize);
    map_at(&w, 5, 0, 2 * MB2, f.as_fd(), 0, true).unwrap();
    // What a sync point saw: (0, 4 MiB). The guest then remaps with 1 MiB ranges.
    w.unmap(0, 2 * MB2).unwrap();
    map_at(&w, 5, 0, MB2, f.as_fd(), 0, true).unwrap();
    map_at(&w, 6, MB2, MB2, f.as_fd(), MB2, true).unwrap();
    let pool = rec.fds.lock().unwrap()[&0].try_clone().unwrap();
    pool.write_all_at(b"neighbour", MB2 + 8).unwrap();
    w.merge_at(0, Some(5), None);
    assert_eq!(
        &pool_read(&rec, MB2 + 8, 9),
        b"neighbour",
        "still mapped, not zeroed"
    );
    assert_eq!(w.stats().mapped_bytes, 2 * MB2);
    w.sync(6);
    let mut got = [0u8; 9];
    f.read_exact_at(&mut got, MB2 + 8).unwrap();
    assert_eq!(&got, b"neighbour");
}

#[test]
fn requests_merge_only_the_pooled_ranges_they_touch() {
    // Issue #36, 4: a READ or WRITE of some bytes of an inode merges the writable pooled
    // ranges mapping those bytes, not every range of the inode.
    let (w, rec) = running(16 * MB2, DEFAULT_MAP_BUDGET);
    w.set_map_mode(crate::dax::mode::MapMode::Pooled);
    let f = data_file(7, 16 * MB2 as usize);
    for i in 0..8u64 {
        map_at(&w, 5, 2 * i * MB2, 2 * MB2, f.as_fd(), 2 * i * MB2, true).unwrap();
    }
    let pool = rec.fds.lock().unwrap()[&0].try_clone().unwrap();
    for i in 0..8u64 {
        pool.write_all_at(b"G", 2 * i * MB2).unwrap();
    }
    let before = w.stats().written_back;
    w.sync_range(5, 32 * MB2, 4096);
    assert_eq!(
        w.stats().written_back,
        before,
        "past every mapped range: nothing merged"
    );
    w.sync_range(5, 6 * MB2 + 4096, 4096);
    assert_eq!(w.stats().written_back, before, "its page holding no store");
    w.sync_range(5, 6 * MB2, 4096);
    assert_eq!(
        w.stats().written_back,
        before + 1,
        "the one page holding those bytes"
    );
    pool.write_all_at(b"H", 6 * MB2 + 8192).unwrap();
    w.sync_range(5, 6 * MB2 + 3, 2);
    assert_eq!(
        w.stats().written_back,
        before + 1,
        "another page of the range stays"
    );
    w.sync(5);
    assert_eq!(w.stats().written_back, before + 9);
}

#[test]
fn pool_pages_outside_guest_mappings_go_back_to_the_host() {
    // Issue #36, 3: the pool is one frontend mapping of the whole window, so a guest can
    // store into every page of it. After the periodic pass, the pool's memfd holds no more
    // than the ranges the guest maps (st_blocks), however much it touched.
    const GB: u64 = 1 << 30;
    let (w, rec) = running(GB, DEFAULT_MAP_BUDGET);
    w.set_map_mode(crate::dax::mode::MapMode::Pooled);
    let f = data_file(7, 8 * MB2 as usize);
    for i in 0..4u64 {
        map_at(&w, 5, i * 64 * MB2, MB2, f.as_fd(), i * MB2, i % 2 == 0).unwrap();
    }
    let pool = rec.fds.lock().unwrap()[&0].try_clone().unwrap();
    let chunk = vec![0x5au8; 8 << 20];
    let mut at = 0;
    while at < GB {
        pool.write_all_at(&chunk, at).unwrap();
        at += chunk.len() as u64;
    }
    let blocks = |f: &File| crate::sys::fstat(f.as_fd()).unwrap().st_blocks as u64 * 512;
    assert!(blocks(&pool) >= GB, "the guest touched every page");
    // Two of the four ranges go, then the periodic pass.
    w.unmap(0, MB2).unwrap();
    w.unmap(64 * MB2, MB2).unwrap();
    w.sync_all();
    assert!(
        blocks(&pool) <= 2 * MB2,
        "{} bytes held for 2 MiB mapped",
        blocks(&pool)
    );
    assert_eq!(
        &pool_read(&rec, 128 * MB2, 1),
        &[0x5a],
        "mapped ranges are kept"
    );
}

#[test]
fn writable_pooled_ranges_hold_no_more_than_they_map() {
    // Issue #36, 3: host memory bounded by what the guest maps. Writable pooled ranges the
    // guest stores into everywhere, merged: the pool holds their pages and a small fraction
    // more, not a second copy of each range.
    let (w, rec) = running(64 * MB2, DEFAULT_MAP_BUDGET);
    w.set_map_mode(crate::dax::mode::MapMode::Pooled);
    let f = data_file(7, 16 * MB2 as usize);
    for i in 0..8u64 {
        map_at(&w, 5, 4 * i * MB2, 2 * MB2, f.as_fd(), 2 * i * MB2, true).unwrap();
    }
    let pool = rec.fds.lock().unwrap()[&0].try_clone().unwrap();
    for i in 0..8u64 {
        pool.write_all_at(&vec![0x5au8; 2 * MB2 as usize], 4 * i * MB2)
            .unwrap();
    }
    w.sync_all();
    let mut got = vec![0u8; 2 * MB2 as usize];
    f.read_exact_at(&mut got, 14 * MB2).unwrap();
    assert!(got.iter().all(|&b| b == 0x5a), "merged into the file");
    let s = w.stats();
    assert_eq!(s.mapped_bytes, 16 * MB2);
    assert!(
        s.pool_held <= s.mapped_bytes + s.mapped_bytes / 100,
        "{} bytes held for {} mapped",
        s.pool_held,
        s.mapped_bytes
    );
}

/// The holder's vault, in memory (`--restartable`, `host::holder`).
#[derive(Default)]
pub(super) struct Vault(pub(super) Mutex<std::collections::BTreeMap<Kept, VaultEntry>>);

type VaultEntry = (Vec<u8>, Option<std::os::fd::OwnedFd>);

impl Keeper for Vault {
    fn keep(&self, what: Kept, meta: &[u8], fd: Option<BorrowedFd<'_>>) {
        let fd = fd.map(|f| f.try_clone_to_owned().unwrap());
        self.0.lock().unwrap().insert(what, (meta.to_vec(), fd));
    }
    fn release(&self, what: Kept) {
        self.0.lock().unwrap().remove(&what);
    }
    fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

impl Vault {
    /// What a new server gets back.
    pub(super) fn entries(&self) -> Vec<KeptEntry> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(k, (m, fd))| (*k, m.clone(), fd.as_ref().map(|f| f.try_clone().unwrap())))
            .collect()
    }
}

/// A pooled window kept with `vault`.
fn kept_window(vault: &Arc<Vault>) -> (DaxWindow<Arc<Rec>>, Arc<Rec>) {
    let (w, rec) = running(8 * MB2, DEFAULT_MAP_BUDGET);
    w.set_map_mode(crate::dax::mode::MapMode::Pooled);
    w.set_keeper(vault.clone()).unwrap();
    (w, rec)
}

#[test]
fn a_pooled_window_comes_back_from_the_vault_after_a_crash() {
    let vault = Arc::new(Vault::default());
    let (w, rec) = kept_window(&vault);
    let f = data_file(5, 2 * MB2 as usize);
    map_at(&w, 9, 0, MB2, f.as_fd(), 0, true).unwrap();
    map_at(&w, 9, MB2, MB2, f.as_fd(), MB2, false).unwrap();
    let pool = rec.fds.lock().unwrap()[&0].try_clone().unwrap();
    pool.write_all_at(b"guest", 4096).unwrap();
    // The server dies (nothing of it runs again); the frontend keeps mapping the pool. A
    // new server's window takes the vault back before the device runs.
    let (w2, rec2) = running(8 * MB2, DEFAULT_MAP_BUDGET);
    w2.set_map_mode(crate::dax::mode::MapMode::Pooled);
    assert_eq!(w2.restore_kept(vault.entries()), 2);
    w2.set_keeper(vault.clone()).unwrap();
    pool.write_all_at(b"after", 8192).unwrap();
    f.write_all_at(b"host", 3 * 4096).unwrap();
    Coherence::sync(&w2, 9);
    let mut got = [0u8; 5];
    f.read_exact_at(&mut got, 4096).unwrap();
    assert_eq!(&got, b"guest", "a store from before the crash");
    f.read_exact_at(&mut got, 8192).unwrap();
    assert_eq!(&got, b"after", "a store from after it");
    f.read_exact_at(&mut got[..4], 3 * 4096).unwrap();
    assert_eq!(
        &got[..4],
        b"host",
        "a host change to a page the guest left alone"
    );
    pool.read_exact_at(&mut got[..4], 3 * 4096).unwrap();
    assert_eq!(&got[..4], b"host", "the host change reaches the pool");
    assert_eq!(w2.stats().conflicts, 0);
    // A range placed before the crash leaves the window; a new one goes to the pool, which
    // the frontend still maps: nothing is sent.
    pool.write_all_at(b"late", 5 * 4096).unwrap();
    w2.unmap(0, MB2).unwrap();
    f.read_exact_at(&mut got[..4], 5 * 4096).unwrap();
    assert_eq!(&got[..4], b"late");
    assert!(!vault.0.lock().unwrap().contains_key(&Kept::DaxPlaced(0)));
    map_at(&w2, 9, 2 * MB2, MB2, f.as_fd(), 0, false).unwrap();
    assert!(vault
        .0
        .lock()
        .unwrap()
        .contains_key(&Kept::DaxPlaced(2 * MB2)));
    assert_eq!(calls(&rec2), Vec::<String>::new());
    // The end of the session takes the pool out of the frontend and out of the vault.
    w2.end_session();
    assert_eq!(calls(&rec2), vec!["unmap 0x0+0x1000000"]);
    let left: Vec<Kept> = vault.0.lock().unwrap().keys().copied().collect();
    assert_eq!(left, vec![Kept::DaxHashes]);
}

#[test]
fn a_pool_map_a_crash_left_unanswered_is_unmapped_before_it_is_sent_again() {
    let vault = Arc::new(Vault::default());
    let (w, _rec) = kept_window(&vault);
    // The server died after sending the pool's SHMEM_MAP, before its reply.
    w.keep_pool(w.slots().unwrap(), false);
    let (w2, rec2) = running(8 * MB2, DEFAULT_MAP_BUDGET);
    w2.set_map_mode(crate::dax::mode::MapMode::Pooled);
    assert_eq!(w2.restore_kept(vault.entries()), 0);
    w2.set_keeper(vault.clone()).unwrap();
    let f = data_file(5, MB2 as usize);
    map_at(&w2, 9, 0, MB2, f.as_fd(), 0, false).unwrap();
    assert_eq!(
        calls(&rec2),
        vec!["unmap 0x0+0x1000000", "map 0x0+0x1000000@0x0 rw"]
    );
    assert_eq!(vault.0.lock().unwrap()[&Kept::DaxPool].0, vec![1]);
}
