//! Blocks for a file range before it is mapped writable (direct placements).
//!
//! QEMU maps a direct placement's file range shared and writable. A guest store into a hole
//! of that range makes the host file system allocate a block at QEMU's page fault; when it
//! cannot (full file system, quota, an immutable file on ext4), the fault is a SIGBUS in QEMU,
//! which dies (TCG; on KVM hosts the vCPU gets EFAULT and the VM stops). So before a writable
//! range is mapped, its blocks are allocated with `fallocate(FALLOC_FL_KEEP_SIZE)` over the
//! part of the range the file covers (the daemon never changes a file's size for the window):
//! a failure then answers the SETUPMAPPING with the file system's errno (ENOSPC, EDQUOT,
//! EPERM, EIO ...), where the guest can see it (this project's guest kernel falls back to
//! FUSE_WRITE for a write(2), which gets the same error; a page fault gets SIGBUS in the
//! guest process, as on a local file system that cannot allocate at a fault).
//!
//! The blocks allocated are those of the range rounded out to the host's largest page-cache
//! folio ([`folio_span`], the transparent huge page size: 2 MiB on x86-64), within the file's
//! size. QEMU asks for transparent huge pages on every RAM block it maps (`qemu_madvise(...,
//! QEMU_MADV_HUGEPAGE)` in `ram_block_add`, the SHMEM_MAP mappings included), so a read
//! fault there may fill a 2 MiB folio, and file systems with large folios (ext4 since Linux
//! 6.16, xfs, btrfs) prepare the WHOLE folio for writing at QEMU's first store into it
//! (`block_page_mkwrite` over `folio_size`): blocks of the neighbouring, unmapped part of
//! that folio are reserved then, and on a nearly full file system that reservation failed
//! with SIGBUS in QEMU although the mapped range itself had its blocks (issue #36; shown on
//! this host without QEMU by a store into a fallocated 512 KiB range of a `MADV_HUGEPAGE`
//! mapping of a sparse file on an ext4 with 1 MiB free).
//!
//! A file system without `fallocate` (EOPNOTSUPP) is mapped as before: a store into a hole
//! there can still fault in QEMU when the file system is full (README, "Limits"). So can a
//! store into a range whose blocks exist but must be copied on write (btrfs, reflinked xfs
//! extents), and a store to a file made immutable after its range was mapped.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// What [`allocate`] did.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(super) enum Allocated {
    /// The range has its blocks.
    Yes,
    /// The file system has no `fallocate` (or not this mode): mapped without it.
    Unsupported,
}

/// `fallocate(2)` attempts interrupted by a signal before giving up with EINTR.
const EINTR_TRIES: usize = 8;

/// Used when the host does not say (no `/sys`, no transparent huge pages): x86-64's and
/// arm64's (4 KiB pages) PMD size.
const DEFAULT_FOLIO_SPAN: u64 = 2 << 20;

static FOLIO_SPAN: OnceLock<u64> = OnceLock::new();

/// The largest page-cache folio the host kernel makes, which a store through a mapping
/// prepares for writing whole: the transparent huge page size
/// (`/sys/kernel/mm/transparent_hugepage/hpage_pmd_size`). Read once; the daemon calls it
/// before entering its sandbox (which has no `/sys`).
pub fn folio_span() -> u64 {
    *FOLIO_SPAN.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .filter(|&n| n.is_power_of_two() && (4096..=1 << 30).contains(&n))
            .unwrap_or(DEFAULT_FOLIO_SPAN)
    })
}

/// `[offset, offset + len)` rounded out to whole folios of `span` bytes, but never past the
/// file's last page (`size` rounded up to 4 KiB: no folio reaches further into the file) nor
/// short of the range asked.
fn folio_bounds(offset: u64, len: u64, size: u64, span: u64) -> (u64, u64) {
    let end = offset.saturating_add(len);
    let last_page = size.saturating_add(4095) & !4095;
    let start = offset & !(span - 1);
    let wide_end = end.checked_next_multiple_of(span).unwrap_or(end);
    (start, wide_end.min(last_page).max(end))
}

/// Allocates the blocks of `[offset, offset + len)` of `file`, and of the rest of the folios
/// it touches ([`folio_span`]), without changing the file's size. `Err` carries the file
/// system's errno for the guest.
pub(super) fn allocate(file: &File, offset: u64, len: u64) -> io::Result<Allocated> {
    if len == 0 {
        return Ok(Allocated::Yes);
    }
    let size = super::file_size(file)?;
    let (offset, end) = folio_bounds(offset, len, size, folio_span());
    let len = end - offset;
    let mut tries = 0;
    loop {
        match crate::sys::fallocate(file.as_fd(), libc::FALLOC_FL_KEEP_SIZE, offset, len) {
            Ok(()) => return Ok(Allocated::Yes),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) && tries + 1 < EINTR_TRIES => {
                tries += 1;
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
                ) =>
            {
                static LOGGED: AtomicBool = AtomicBool::new(false);
                if !LOGGED.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "DAX: the shared directory's file system has no fallocate ({e}): writable \
                         ranges are mapped without allocating their blocks first; a store into a \
                         hole when it is full can kill QEMU (README, Limits)"
                    );
                }
                return Ok(Allocated::Unsupported);
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::fs::File;
    use std::io;
    use std::os::fd::BorrowedFd;
    use std::os::unix::fs::{FileExt, MetadataExt};
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};

    use super::{allocate, folio_bounds, folio_span, Allocated};
    use crate::dax::{DaxWindow, WindowSink};
    use crate::protocol::mapper::{MapRequest, Mapper};

    const MB: u64 = 1 << 20;

    /// A tmpfs of `size` bytes mounted on a new temporary directory, unmounted when dropped:
    /// a host file system that fills up. Needs root (as `make test` runs); as another user
    /// the test fails unless DAXFSD_SKIP_ROOT_TESTS is set (then it says it skipped).
    struct SmallFs {
        dir: Option<tempfile::TempDir>,
        path: PathBuf,
    }

    impl SmallFs {
        fn mount(name: &str, size: u64) -> Option<Self> {
            if crate::sys::geteuid() != 0 {
                if std::env::var_os("DAXFSD_SKIP_ROOT_TESTS").is_some() {
                    eprintln!("SKIPPED {name}: needs root (DAXFSD_SKIP_ROOT_TESTS is set)");
                    return None;
                }
                panic!("{name} mounts a tmpfs and needs root; run as root or set DAXFSD_SKIP_ROOT_TESTS=1");
            }
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().to_path_buf();
            let c = |s: &str| CString::new(s).unwrap();
            let target = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
            let opts = c(&format!("size={size},mode=0700"));
            // SAFETY: every pointer is a NUL-terminated string that outlives the call.
            let r = unsafe {
                libc::mount(
                    c("tmpfs").as_ptr(),
                    target.as_ptr(),
                    c("tmpfs").as_ptr(),
                    0,
                    opts.as_ptr().cast(),
                )
            };
            assert_eq!(r, 0, "mount tmpfs: {}", io::Error::last_os_error());
            Some(SmallFs {
                dir: Some(dir),
                path,
            })
        }

        fn path(&self) -> &Path {
            &self.path
        }
    }

    impl Drop for SmallFs {
        fn drop(&mut self) {
            let target = CString::new(self.path.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: `target` is a NUL-terminated string that outlives the call.
            let r = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            if r != 0 {
                eprintln!("umount {:?}: {}", self.path, io::Error::last_os_error());
            }
            drop(self.dir.take());
        }
    }

    /// A frontend that records the maps it was asked for.
    #[derive(Default)]
    struct Maps(Mutex<Vec<(u64, u64, bool)>>);

    impl WindowSink for Arc<Maps> {
        fn map(&self, m: u64, len: u64, _: BorrowedFd, _: u64, w: bool) -> io::Result<()> {
            self.0.lock().unwrap().push((m, len, w));
            Ok(())
        }
        fn unmap(&self, m: u64, len: u64) -> io::Result<()> {
            self.0
                .lock()
                .unwrap()
                .retain(|&(s, l, _)| (s, l) != (m, len));
            Ok(())
        }
    }

    fn rw_file(p: &Path, len: u64) -> File {
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(p)
            .unwrap();
        f.set_len(len).unwrap();
        f
    }

    fn map(
        w: &DaxWindow<Arc<Maps>>,
        f: &File,
        m: u64,
        foffset: u64,
        writable: bool,
    ) -> io::Result<()> {
        use std::os::fd::AsFd;
        w.map(&MapRequest {
            owner: 1,
            moffset: m,
            len: 2 * MB,
            fd: f.as_fd(),
            foffset,
            writable,
        })
    }

    #[test]
    fn allocate_keeps_size_and_fails_with_the_file_systems_errno() {
        let Some(fs) = SmallFs::mount("allocate_keeps_size", 4 * MB) else {
            return;
        };
        assert!(
            folio_span() <= 2 * MB,
            "this test assumes folios of at most 2 MiB"
        );
        let f = rw_file(&fs.path().join("sparse"), 16 * MB);
        assert_eq!(f.metadata().unwrap().blocks(), 0);
        assert_eq!(allocate(&f, 2 * MB, 2 * MB).unwrap(), Allocated::Yes);
        let md = f.metadata().unwrap();
        assert_eq!(md.len(), 16 * MB, "the size moved");
        assert_eq!(md.blocks() * 512, 2 * MB, "the range was not allocated");
        // Allocated already: nothing more needed, even with the file system full.
        let fill = rw_file(&fs.path().join("fill"), 0);
        let e = allocate(&fill, 0, 4 * MB).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        assert_eq!(allocate(&f, 2 * MB, 2 * MB).unwrap(), Allocated::Yes);
        let e = allocate(&f, 4 * MB, 4 * MB).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        assert_eq!(f.metadata().unwrap().len(), 16 * MB);
        // An immutable file (tmpfs has chattr +i since Linux 6.0): EPERM.
        let imm = rw_file(&fs.path().join("imm"), MB);
        let flags: libc::c_long = 0x10; // FS_IMMUTABLE_FL
                                        // SAFETY: FS_IOC_SETFLAGS reads one c_long (an int on Linux) from the pointer.
        let r = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&imm),
                libc::FS_IOC_SETFLAGS,
                &flags,
            )
        };
        assert_eq!(r, 0, "chattr +i: {}", io::Error::last_os_error());
        let e = allocate(&imm, 0, 4096).unwrap_err();
        let clear: libc::c_long = 0;
        // SAFETY: as above.
        unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&imm),
                libc::FS_IOC_SETFLAGS,
                &clear,
            )
        };
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
    }

    /// Issue #36: QEMU's first store into a huge-page folio of a mapped file prepares the
    /// whole folio for writing, so the blocks allocated are those of every folio the range
    /// touches, within the file's size.
    #[test]
    fn allocate_covers_every_folio_the_range_touches() {
        let s = 2 * MB;
        assert_eq!(folio_bounds(s / 4, s / 4, 16 * MB, s), (0, s));
        assert_eq!(folio_bounds(s, s, 16 * MB, s), (s, 2 * s));
        assert_eq!(folio_bounds(s - 4096, 8192, 16 * MB, s), (0, 2 * s));
        // Not past the file's last page, and never short of the range asked.
        assert_eq!(folio_bounds(0, 4096, s / 2 + 100, s), (0, s / 2 + 4096));
        assert_eq!(
            folio_bounds(s / 2, 4096, s / 2 + 4096, s),
            (0, s / 2 + 4096)
        );
        assert_eq!(folio_bounds(s / 2, 8192, 0, s), (0, s / 2 + 8192));
        assert_eq!(folio_bounds(u64::MAX - 4095, 4096, u64::MAX, s).1, u64::MAX);

        let Some(fs) = SmallFs::mount("allocate_covers_folios", 16 * MB) else {
            return;
        };
        let span = folio_span();
        let f = rw_file(&fs.path().join("sparse"), 4 * span);
        assert_eq!(
            allocate(&f, span + span / 4, span / 4).unwrap(),
            Allocated::Yes
        );
        let md = f.metadata().unwrap();
        assert_eq!((md.len(), md.blocks() * 512), (4 * span, span));
        let e = rw_file(&fs.path().join("short"), span / 2 + 100);
        assert_eq!(allocate(&e, 0, 4096).unwrap(), Allocated::Yes);
        let md = e.metadata().unwrap();
        assert_eq!(
            (md.len(), md.blocks() * 512),
            (span / 2 + 100, span / 2 + 4096)
        );
    }

    /// Issue #36: a writable direct mapping over holes of a file on a full file system was
    /// mapped, and QEMU's first store there died of SIGBUS. Now the SETUPMAPPING fails with
    /// ENOSPC and nothing is mapped; a read-only one still maps (it allocates nothing), and
    /// once there is room the writable one maps with its blocks allocated.
    #[test]
    fn writable_direct_map_on_a_full_file_system_is_refused_with_enospc() {
        let Some(fs) = SmallFs::mount("writable_direct_map_full", 3 * MB) else {
            return;
        };
        let w = DaxWindow::with_budget(8 * 2 * MB, 64).unwrap();
        let maps = Arc::new(Maps::default());
        w.set_sink(maps.clone());
        w.start();
        let f = rw_file(&fs.path().join("sparse"), 16 * MB);
        let fill = rw_file(&fs.path().join("fill"), 0);
        fill.write_all_at(&vec![7u8; (2 * MB) as usize], 0).unwrap();
        // 1 MiB free: a 2 MiB writable range of holes cannot get its blocks.
        let e = map(&w, &f, 0, 4 * MB, true).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        assert!(
            maps.0.lock().unwrap().is_empty(),
            "mapped: {:?}",
            maps.0.lock().unwrap()
        );
        assert_eq!(f.metadata().unwrap().len(), 16 * MB);
        map(&w, &f, 0, 4 * MB, false).unwrap();
        assert_eq!(*maps.0.lock().unwrap(), vec![(0, 2 * MB, false)]);
        // The read-only -> writable upgrade is refused too: nothing writable is mapped, and
        // the read-only mapping stays (Linux keeps its range mapped read-only when the
        // upgrade fails: without it in the frontend the guest would read zeros there).
        let e = map(&w, &f, 0, 4 * MB, true).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        assert_eq!(*maps.0.lock().unwrap(), vec![(0, 2 * MB, false)]);
        w.unmap(0, 2 * MB).unwrap();
        // Room again: mapped writable, its blocks allocated, the size unchanged.
        fill.set_len(0).unwrap();
        map(&w, &f, 2 * MB, 4 * MB, true).unwrap();
        assert_eq!(*maps.0.lock().unwrap(), vec![(2 * MB, 2 * MB, true)]);
        let md = f.metadata().unwrap();
        assert_eq!((md.len(), md.blocks() * 512), (16 * MB, 2 * MB));
    }
}
