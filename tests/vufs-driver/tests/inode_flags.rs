//! FUSE_IOCTL for inode flags (`chattr`/`lsattr`), sent as Linux's
//! `fuse_fileattr_get`/`fuse_fileattr_set` send them: on a handle opened read-only, a 4-byte
//! flag word for FS_IOC_GETFLAGS/SETFLAGS, a `struct fsxattr` for FS_IOC_FSGETXATTR/
//! FSSETXATTR, `in_size` for a set, `out_size` for a get. What daxfsd reads is checked
//! against the host's own ioctl on the same file; sets need `--inode-flags`.
//! Upstream virtiofsd 1.14 serves no ioctl: it answers ENOSYS to every one (the guest kernel
//! turns that into ENOTTY), which these tests assert when `VUFS_DAEMON=virtiofsd`.

mod common;

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use common::{errno, kind};
use daxfsd::abi::{self, opcode as op, Fsxattr};
use vm_memory::ByteValued;
use vufs_driver::{DaemonKind, DriverConfig, Session};

const ROOT: u64 = abi::ROOT_ID;
const GETFLAGS: u32 = libc::FS_IOC_GETFLAGS as u32;
const SETFLAGS: u32 = libc::FS_IOC_SETFLAGS as u32;
const FSGETXATTR: u32 = 0x801c_581f;
const FSSETXATTR: u32 = 0x401c_5820;
const FS_IMMUTABLE_FL: u32 = 0x10;
const FS_NODUMP_FL: u32 = 0x40;
const FS_XFLAG_NODUMP: u32 = 0x80;
const FUSE_IOCTL_UNRESTRICTED: u32 = 1 << 1;
const FUSE_IOCTL_DIR: u32 = 1 << 4;

/// `fuse_ioctl_in` for `cmd` on handle `fh`, with the sizes Linux gives the command.
fn req(fh: u64, flags: u32, cmd: u32, in_size: u32, out_size: u32) -> abi::IoctlIn {
    abi::IoctlIn {
        fh,
        flags,
        cmd,
        arg: 0,
        in_size,
        out_size,
    }
}

/// Sends FUSE_IOCTL `a` followed by `arg`; returns the bytes after `fuse_ioctl_out`,
/// checking that the reply holds exactly `out_size` of them.
fn ioctl(s: &Session, node: u64, a: abi::IoctlIn, arg: &[u8]) -> io::Result<Vec<u8>> {
    let body = s.call(op::IOCTL, node, &[a.as_slice(), arg], 16 + 64)?;
    assert_eq!(
        body.len(),
        16 + a.out_size as usize,
        "IOCTL {:#x} reply size",
        a.cmd
    );
    let out = abi::IoctlOut::from_slice(&body[..16]).unwrap();
    assert_eq!((out.result, out.flags), (0, 0), "fuse_ioctl_out {out:?}");
    Ok(body[16..].to_vec())
}

fn get_flags(s: &Session, node: u64, fh: u64, dir: bool) -> io::Result<u32> {
    let f = if dir { FUSE_IOCTL_DIR } else { 0 };
    let b = ioctl(s, node, req(fh, f, GETFLAGS, 0, 4), &[])?;
    Ok(u32::from_ne_bytes(b.try_into().unwrap()))
}

fn set_flags(s: &Session, node: u64, fh: u64, flags: u32) -> io::Result<()> {
    ioctl(s, node, req(fh, 0, SETFLAGS, 4, 0), &flags.to_ne_bytes()).map(drop)
}

fn get_xattr(s: &Session, node: u64, fh: u64) -> io::Result<Fsxattr> {
    let b = ioctl(s, node, req(fh, 0, FSGETXATTR, 0, 28), &[])?;
    Ok(*Fsxattr::from_slice(&b).unwrap())
}

fn set_xattr(s: &Session, node: u64, fh: u64, x: &Fsxattr) -> io::Result<()> {
    ioctl(s, node, req(fh, 0, FSSETXATTR, 28, 0), x.as_slice()).map(drop)
}

/// The host's own FS_IOC_GETFLAGS / SETFLAGS on `p`.
fn host_flags(p: &Path) -> u32 {
    let f = File::open(p).unwrap();
    let mut v: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int, which `v` is.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut v) };
    assert_eq!(r, 0, "host FS_IOC_GETFLAGS: {}", io::Error::last_os_error());
    v as u32
}

fn host_set_flags(p: &Path, flags: u32) {
    let f = File::open(p).unwrap();
    let v = flags as libc::c_int;
    // SAFETY: FS_IOC_SETFLAGS reads one int, which `v` is.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &v) };
    assert_eq!(r, 0, "host FS_IOC_SETFLAGS: {}", io::Error::last_os_error());
}

fn host_xattr(p: &Path) -> Fsxattr {
    let f = File::open(p).unwrap();
    let mut x = Fsxattr::default();
    // SAFETY: FS_IOC_FSGETXATTR writes one struct fsxattr, whose layout Fsxattr has.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::Ioctl::from(FSGETXATTR), &mut x) };
    assert_eq!(
        r,
        0,
        "host FS_IOC_FSGETXATTR: {}",
        io::Error::last_os_error()
    );
    x
}

/// Clears the flags of the files it names when the test ends, passed or not (an immutable
/// file would outlive its temporary directory).
struct Unflag(Vec<PathBuf>);

impl Drop for Unflag {
    fn drop(&mut self) {
        for p in &self.0 {
            if let Ok(f) = File::open(p) {
                let v: libc::c_int = 0;
                // SAFETY: FS_IOC_SETFLAGS reads one int, which `v` is.
                unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &v) };
            }
        }
    }
}

/// virtiofsd serves no ioctl: ENOSYS, whatever the request.
fn is_peer() -> bool {
    kind() == DaemonKind::Virtiofsd
}

fn refused_by_peer<T: std::fmt::Debug>(r: io::Result<T>) {
    assert_eq!(errno(&r.unwrap_err()), libc::ENOSYS);
}

#[test]
fn flags_read_as_the_host_reads_them() {
    let mut r = common::start_with(&[], &DriverConfig::default(), |d| {
        std::fs::write(d.join("f"), b"x").unwrap();
        std::fs::create_dir(d.join("d")).unwrap();
        host_set_flags(&d.join("f"), FS_NODUMP_FL);
        host_set_flags(&d.join("d"), FS_NODUMP_FL);
    });
    let f = r.s.lookup(ROOT, "f").unwrap().nodeid;
    let fh = r.s.open(f, libc::O_RDONLY as u32).unwrap().fh;
    let d = r.s.lookup(ROOT, "d").unwrap().nodeid;
    let dh = r.s.opendir(d, libc::O_RDONLY as u32).unwrap().fh;
    if is_peer() {
        refused_by_peer(get_flags(&r.s, f, fh, false));
        refused_by_peer(get_xattr(&r.s, f, fh));
        refused_by_peer(get_flags(&r.s, d, dh, true));
    } else {
        let want = host_flags(&r.host("f"));
        assert_ne!(want & FS_NODUMP_FL, 0);
        assert_eq!(get_flags(&r.s, f, fh, false).unwrap(), want);
        assert_eq!(
            get_flags(&r.s, d, dh, true).unwrap(),
            host_flags(&r.host("d"))
        );
        let x = get_xattr(&r.s, f, fh).unwrap();
        assert_eq!(x, host_xattr(&r.host("f")));
        assert_ne!(x.xflags & FS_XFLAG_NODUMP, 0);
        // A handle of another inode, or none: EBADF.
        assert_eq!(
            errno(&get_flags(&r.s, d, fh, true).unwrap_err()),
            libc::EBADF
        );
        assert_eq!(
            errno(&get_flags(&r.s, f, 999_999, false).unwrap_err()),
            libc::EBADF
        );
    }
    r.s.release(f, fh, 0).unwrap();
    r.assert_clean();
}

#[test]
fn setting_flags_needs_inode_flags() {
    let mut r = common::start_with(&[], &DriverConfig::default(), |d| {
        std::fs::write(d.join("f"), b"x").unwrap();
    });
    let f = r.s.lookup(ROOT, "f").unwrap().nodeid;
    let fh = r.s.open(f, libc::O_RDONLY as u32).unwrap().fh;
    let before = host_flags(&r.host("f"));
    if is_peer() {
        refused_by_peer(set_flags(&r.s, f, fh, before | FS_NODUMP_FL));
        refused_by_peer(set_xattr(&r.s, f, fh, &Fsxattr::default()));
    } else {
        // A change: refused, the host file untouched.
        let e = set_flags(&r.s, f, fh, before | FS_NODUMP_FL).unwrap_err();
        assert_eq!(errno(&e), libc::EOPNOTSUPP);
        let mut x = host_xattr(&r.host("f"));
        x.xflags |= FS_XFLAG_NODUMP;
        assert_eq!(
            errno(&set_xattr(&r.s, f, fh, &x).unwrap_err()),
            libc::EOPNOTSUPP
        );
        assert_eq!(host_flags(&r.host("f")), before);
        // Setting what is there changes nothing, and succeeds (`chattr -d` of a plain file).
        set_flags(&r.s, f, fh, before).unwrap();
        set_xattr(&r.s, f, fh, &host_xattr(&r.host("f"))).unwrap();
    }
    r.s.release(f, fh, 0).unwrap();
    r.assert_clean();
}

#[test]
fn inode_flags_sets_host_flags() {
    if is_peer() {
        eprintln!("inode_flags_sets_host_flags: virtiofsd has no --inode-flags (see above)");
        return;
    }
    let mut r = common::start_with(&["--inode-flags"], &DriverConfig::default(), |d| {
        std::fs::write(d.join("f"), b"x").unwrap();
    });
    let _unflag = Unflag(vec![r.host("f")]);
    let f = r.s.lookup(ROOT, "f").unwrap().nodeid;
    let fh = r.s.open(f, libc::O_RDONLY as u32).unwrap().fh;
    let before = host_flags(&r.host("f"));
    set_flags(&r.s, f, fh, before | FS_NODUMP_FL).unwrap();
    assert_eq!(host_flags(&r.host("f")), before | FS_NODUMP_FL);
    assert_eq!(
        get_flags(&r.s, f, fh, false).unwrap(),
        before | FS_NODUMP_FL
    );
    // Immutable: the daemon kept CAP_LINUX_IMMUTABLE for it, and the host file is immutable.
    set_flags(&r.s, f, fh, before | FS_IMMUTABLE_FL).unwrap();
    assert_eq!(host_flags(&r.host("f")), before | FS_IMMUTABLE_FL);
    let e = std::fs::OpenOptions::new().write(true).open(r.host("f"));
    assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::EPERM));
    // And back through FSSETXATTR.
    let mut x = get_xattr(&r.s, f, fh).unwrap();
    x.xflags = 0;
    set_xattr(&r.s, f, fh, &x).unwrap();
    assert_eq!(host_flags(&r.host("f")), before & !FS_NODUMP_FL);
    r.s.release(f, fh, 0).unwrap();
    r.assert_clean();
}

#[test]
fn bad_sizes_and_other_ioctls_are_refused() {
    // With sets allowed, so that sizes are what refuses them (virtiofsd has no such flag).
    let opt_in: &[&str] = if is_peer() { &[] } else { &["--inode-flags"] };
    let mut r = common::start_with(opt_in, &DriverConfig::default(), |d| {
        std::fs::write(d.join("f"), b"x").unwrap();
    });
    let f = r.s.lookup(ROOT, "f").unwrap().nodeid;
    let fh = r.s.open(f, libc::O_RDONLY as u32).unwrap().fh;
    let before = host_flags(&r.host("f"));
    let flag = FS_NODUMP_FL.to_ne_bytes();
    let u = FUSE_IOCTL_UNRESTRICTED;
    // (what, request, argument sent, errno)
    let cases = [
        (
            "get, 3-byte result",
            req(fh, 0, GETFLAGS, 0, 3),
            &[][..],
            libc::EINVAL,
        ),
        (
            "get, 4 GiB result",
            req(fh, 0, GETFLAGS, 0, u32::MAX),
            &[],
            libc::EINVAL,
        ),
        (
            "get with an argument",
            req(fh, 0, GETFLAGS, 4, 4),
            &flag,
            libc::EINVAL,
        ),
        (
            "set, 2-byte word",
            req(fh, 0, SETFLAGS, 2, 0),
            &flag[..2],
            libc::EINVAL,
        ),
        (
            "set, word not sent",
            req(fh, 0, SETFLAGS, 4, 0),
            &flag[..2],
            libc::EINVAL,
        ),
        (
            "set, 4 GiB argument",
            req(fh, 0, SETFLAGS, u32::MAX, 0),
            &flag,
            libc::EINVAL,
        ),
        (
            "set with a result",
            req(fh, 0, SETFLAGS, 4, 4),
            &flag,
            libc::EINVAL,
        ),
        (
            "fsxattr, short",
            req(fh, 0, FSGETXATTR, 0, 27),
            &[],
            libc::EINVAL,
        ),
        (
            "fsxattr set, short",
            req(fh, 0, FSSETXATTR, 20, 0),
            &[0; 20],
            libc::EINVAL,
        ),
        (
            "FS_IOC_FIEMAP",
            req(fh, 0, 0xc020_660b, 32, 32),
            &[0; 32],
            libc::ENOTTY,
        ),
        (
            "FS_IOC_GETVERSION",
            req(fh, 0, 0x8008_7601, 0, 8),
            &[],
            libc::ENOTTY,
        ),
        (
            "unrestricted",
            req(fh, u, GETFLAGS, 0, 4),
            &[],
            libc::ENOTTY,
        ),
    ];
    for (what, a, arg, want) in cases {
        let e = ioctl(&r.s, f, a, arg).unwrap_err();
        let want = if is_peer() { libc::ENOSYS } else { want };
        assert_eq!(errno(&e), want, "{what}: {e}");
    }
    // Nothing was set, and the daemon still answers.
    assert_eq!(host_flags(&r.host("f")), before);
    if !is_peer() {
        assert_eq!(get_flags(&r.s, f, fh, false).unwrap(), before);
    }
    r.s.release(f, fh, 0).unwrap();
    r.assert_clean();
}
