//! FUSE_STATX (opcode 52), sent as Linux's `fuse_do_statx` sends it: `fuse_statx_in` with
//! `sx_mask = STATX_BASIC_STATS | STATX_BTIME`, a reply of `fuse_statx_out` (288 bytes).
//! daxfsd answers GETATTR's attributes plus the host's birth time and the `STATX_ATTR_*`
//! inode flags (append, immutable, nodump, compressed), which is how a guest kernel that
//! reads `fuse_statx.attributes` shows `chattr` flags in statx(2) (fstests generic/424).
//! Upstream virtiofsd 1.14 does not serve FUSE_STATX: it answers ENOSYS (the guest then
//! asks GETATTR), which these tests assert when `VUFS_DAEMON=virtiofsd`.

mod common;

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use common::{errno, kind};
use daxfsd::abi::{self, opcode as op, StatxIn, StatxOut};
use vm_memory::ByteValued;
use vufs_driver::{DaemonKind, DriverConfig, Session};

const ROOT: u64 = abi::ROOT_ID;
const FS_APPEND_FL: libc::c_int = 0x20;
const FS_NODUMP_FL: libc::c_int = 0x40;
/// The attributes a STATX reply may carry: the inode flags FUSE_IOCTL serves.
const FLAG_ATTRS: u64 = (libc::STATX_ATTR_COMPRESSED
    | libc::STATX_ATTR_IMMUTABLE
    | libc::STATX_ATTR_APPEND
    | libc::STATX_ATTR_NODUMP) as u64;

fn statx(s: &Session, node: u64, fh: Option<u64>) -> io::Result<StatxOut> {
    let a = StatxIn {
        getattr_flags: if fh.is_some() { abi::GETATTR_FH } else { 0 },
        reserved: 0,
        fh: fh.unwrap_or(0),
        sx_flags: 0,
        sx_mask: libc::STATX_BASIC_STATS | libc::STATX_BTIME,
    };
    let body = s.call(op::STATX, node, &[a.as_slice()], 288 + 64)?;
    assert_eq!(body.len(), 288, "STATX reply size");
    Ok(*StatxOut::from_slice(&body).unwrap())
}

/// The host's own statx of `p` (not following a symlink).
fn host_statx(p: &Path) -> libc::statx {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut st = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` a writable `struct statx`.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            st.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0, "host statx: {}", io::Error::last_os_error());
    // SAFETY: statx succeeded, so it filled `st`.
    unsafe { st.assume_init() }
}

fn host_set_flags(p: &Path, flags: libc::c_int) {
    let f = File::open(p).unwrap();
    // SAFETY: FS_IOC_SETFLAGS reads one int, which `flags` is.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) };
    assert_eq!(r, 0, "host FS_IOC_SETFLAGS: {}", io::Error::last_os_error());
}

/// Clears the host flags of a file when the test ends, passed or not.
struct Unflag(std::path::PathBuf);

impl Drop for Unflag {
    fn drop(&mut self) {
        if let Ok(f) = File::open(&self.0) {
            let v: libc::c_int = 0;
            // SAFETY: FS_IOC_SETFLAGS reads one int, which `v` is.
            unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &v) };
        }
    }
}

fn is_peer() -> bool {
    kind() == DaemonKind::Virtiofsd
}

/// Checks one STATX reply against GETATTR and the host: the basic fields are GETATTR's, the
/// birth time and the flag attributes the host's.
fn check_against(s: &Session, node: u64, host: &Path, sx: &StatxOut) {
    let a = s.getattr(node, None).unwrap().attr;
    let h = host_statx(host);
    let st = &sx.stat;
    assert_eq!(
        st.mask & libc::STATX_BASIC_STATS,
        libc::STATX_BASIC_STATS,
        "{st:?}"
    );
    assert_eq!(
        (st.ino, st.size, st.blocks, u32::from(st.mode), st.nlink),
        (a.ino, a.size, a.blocks, a.mode, a.nlink)
    );
    assert_eq!((st.uid, st.gid, st.blksize), (a.uid, a.gid, a.blksize));
    assert_eq!(
        (
            st.mtime.tv_sec,
            st.mtime.tv_nsec,
            st.ctime.tv_sec,
            st.ctime.tv_nsec
        ),
        (a.mtime as i64, a.mtimensec, a.ctime as i64, a.ctimensec)
    );
    assert_eq!(sx.flags, a.flags);
    assert_eq!(
        st.mask & libc::STATX_BTIME != 0,
        h.stx_mask & libc::STATX_BTIME != 0
    );
    if h.stx_mask & libc::STATX_BTIME != 0 {
        assert_eq!(
            (st.btime.tv_sec, st.btime.tv_nsec),
            (h.stx_btime.tv_sec, h.stx_btime.tv_nsec)
        );
    }
    assert_eq!(st.attributes_mask, h.stx_attributes_mask & FLAG_ATTRS);
    assert_eq!(
        st.attributes,
        h.stx_attributes & h.stx_attributes_mask & FLAG_ATTRS
    );
}

#[test]
fn statx_answers_getattr_with_btime_and_flag_attributes() {
    let mut r = common::start_with(&[], &DriverConfig::default(), |d| {
        std::fs::write(d.join("f"), b"x").unwrap();
        std::os::unix::fs::symlink("f", d.join("l")).unwrap();
        host_set_flags(&d.join("f"), FS_NODUMP_FL);
    });
    let _unflag = Unflag(r.host("f"));
    let f = r.s.lookup(ROOT, "f").unwrap().nodeid;
    let l = r.s.lookup(ROOT, "l").unwrap().nodeid;
    if is_peer() {
        assert_eq!(errno(&statx(&r.s, f, None).unwrap_err()), libc::ENOSYS);
        r.assert_clean();
        return;
    }
    // The share's host file system reports the nodump attribute (ext4, xfs, btrfs, tmpfs do).
    let h = host_statx(&r.host("f"));
    assert_ne!(
        h.stx_attributes_mask & libc::STATX_ATTR_NODUMP as u64,
        0,
        "the host file system reports no statx attributes: this test needs one that does"
    );
    let sx = statx(&r.s, f, None).unwrap();
    assert_ne!(sx.stat.attributes & libc::STATX_ATTR_NODUMP as u64, 0);
    assert_eq!(sx.stat.attributes & libc::STATX_ATTR_APPEND as u64, 0);
    check_against(&r.s, f, &r.host("f"), &sx);

    // A flag the host sets later shows at the next STATX (nothing cached in the daemon).
    host_set_flags(&r.host("f"), FS_APPEND_FL);
    let sx = statx(&r.s, f, None).unwrap();
    assert_ne!(sx.stat.attributes & libc::STATX_ATTR_APPEND as u64, 0);
    assert_eq!(sx.stat.attributes & libc::STATX_ATTR_NODUMP as u64, 0);
    check_against(&r.s, f, &r.host("f"), &sx);

    // Through an open handle (GETATTR_FH), and of a symlink (not followed).
    let fh = r.s.open(f, libc::O_RDONLY as u32).unwrap().fh;
    let sx = statx(&r.s, f, Some(fh)).unwrap();
    check_against(&r.s, f, &r.host("f"), &sx);
    r.s.release(f, fh, 0).unwrap();
    let sx = statx(&r.s, l, None).unwrap();
    assert_eq!(u32::from(sx.stat.mode) & libc::S_IFMT, libc::S_IFLNK);
    check_against(&r.s, l, &r.host("l"), &sx);
    r.assert_clean();
}

#[test]
fn statx_refuses_bad_requests() {
    let mut r = common::start_with(&[], &DriverConfig::default(), |d| {
        std::fs::write(d.join("f"), b"x").unwrap();
    });
    let f = r.s.lookup(ROOT, "f").unwrap().nodeid;
    // A body shorter than fuse_statx_in: EINVAL, nothing read past it (virtiofsd: ENOSYS,
    // whatever the body).
    let e = r.s.call(op::STATX, f, &[&[0u8; 12]], 288).unwrap_err();
    if is_peer() {
        assert_eq!(errno(&e), libc::ENOSYS);
        r.assert_clean();
        return;
    }
    assert_eq!(errno(&e), libc::EINVAL);
    // An inode the guest was never given.
    assert_eq!(errno(&statx(&r.s, 999_999, None).unwrap_err()), libc::EBADF);
    // The session goes on.
    statx(&r.s, f, None).unwrap();
    r.assert_clean();
}
