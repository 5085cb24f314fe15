//! POSIX ACLs (`--posix-acl`) at the protocol level, against either daemon: the ACL xattrs
//! reach the host file, default ACLs are inherited on create with `FUSE_DONT_MASK` (the
//! guest's umask only applies without one), chmod changes the mask, and
//! `FUSE_SETXATTR_ACL_KILL_SGID` clears the setgid bit.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use daxfsd::abi::{fattr, init_flags as f, SetattrIn, SETXATTR_ACL_KILL_SGID};
use vufs_driver::Xattr;

const ROOT: u64 = 1;
const ACCESS: &str = "system.posix_acl_access";
const DEFAULT: &str = "system.posix_acl_default";

// The kernel's xattr form of an ACL (include/uapi/linux/posix_acl_xattr.h).
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
const UNDEFINED: u32 = u32::MAX;

/// Encodes `(tag, perm, id)` entries (already in the kernel's order).
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn parse(v: &[u8]) -> Vec<(u16, u16, u32)> {
    assert_eq!(v.len() % 8, 4, "ACL xattr of {} bytes", v.len());
    assert_eq!(&v[..4], &2u32.to_le_bytes(), "ACL version");
    v[4..]
        .chunks(8)
        .map(|c| {
            (
                u16::from_le_bytes([c[0], c[1]]),
                u16::from_le_bytes([c[2], c[3]]),
                u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            )
        })
        .collect()
}

fn perm_of(entries: &[(u16, u16, u32)], tag: u16) -> u16 {
    entries
        .iter()
        .find(|e| e.0 == tag)
        .unwrap_or_else(|| panic!("no entry {tag:#x} in {entries:?}"))
        .1
}

fn host_getxattr(path: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 1024];
    // SAFETY: valid NUL-terminated strings and a buffer of the length passed.
    let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (len >= 0).then(|| buf[..len as usize].to_vec())
}

fn host_mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().mode() & 0o7777
}

fn start() -> common::Rig {
    let r = common::start(&["--posix-acl"]);
    let agreed = r.s.negotiated();
    assert_eq!(
        agreed & (f::POSIX_ACL | f::DONT_MASK),
        f::POSIX_ACL | f::DONT_MASK,
        "--posix-acl must negotiate POSIX_ACL and DONT_MASK: {agreed:#x}"
    );
    r
}

/// A default ACL granting user 4321 rwx, group r-x, others nothing.
fn default_acl() -> Vec<u8> {
    acl(&[
        (USER_OBJ, 7, UNDEFINED),
        (USER, 7, 4321),
        (GROUP_OBJ, 5, UNDEFINED),
        (MASK, 7, UNDEFINED),
        (OTHER, 0, UNDEFINED),
    ])
}

#[test]
fn default_acl_is_inherited_and_replaces_the_umask() {
    let mut r = start();
    let d = r.s.mkdir(ROOT, "d", 0o755, 0o022).unwrap();
    r.s.setxattr(d.nodeid, DEFAULT, &default_acl(), 0).unwrap();
    // Served through to the host directory, and read back over FUSE.
    assert_eq!(
        host_getxattr(&r.host("d"), DEFAULT).map(|v| parse(&v)),
        Some(parse(&default_acl()))
    );
    match r.s.getxattr(d.nodeid, DEFAULT, 1024).unwrap() {
        Xattr::Data(v) => assert_eq!(parse(&v), parse(&default_acl())),
        other => panic!("GETXATTR: {other:?}"),
    }

    // A restrictive umask is ignored under a default ACL: mode 0666 & ACL -> 0660.
    let (e, o) =
        r.s.create(d.nodeid, "f", libc::O_RDWR as u32, 0o666, 0o077)
            .unwrap();
    r.s.release(e.nodeid, o.fh, 0).unwrap();
    assert_eq!(host_mode(&r.host("d/f")), 0o660, "mode of d/f");
    assert_eq!(e.attr.mode & 0o7777, 0o660, "mode in the CREATE reply");
    let inherited = parse(&host_getxattr(&r.host("d/f"), ACCESS).expect("d/f has no access ACL"));
    assert_eq!(
        inherited,
        vec![
            (USER_OBJ, 6, UNDEFINED),
            (USER, 7, 4321),
            (GROUP_OBJ, 5, UNDEFINED),
            (MASK, 6, UNDEFINED),
            (OTHER, 0, UNDEFINED),
        ]
    );
    // A subdirectory inherits the default ACL as its own default, and its access ACL.
    let sub = r.s.mkdir(d.nodeid, "sub", 0o777, 0o077).unwrap();
    assert_eq!(host_mode(&r.host("d/sub")), 0o770);
    assert_eq!(sub.attr.mode & 0o7777, 0o770);
    assert_eq!(
        host_getxattr(&r.host("d/sub"), DEFAULT).map(|v| parse(&v)),
        Some(parse(&default_acl()))
    );
    // MKNOD (a fifo) too.
    r.s.mknod(d.nodeid, "p", libc::S_IFIFO | 0o666, 0, 0o077)
        .unwrap();
    assert_eq!(host_mode(&r.host("d/p")), 0o660);

    // Without a default ACL the guest's umask applies (DONT_MASK: the daemon applies it).
    let (e, o) =
        r.s.create(ROOT, "g", libc::O_RDWR as u32, 0o666, 0o027)
            .unwrap();
    r.s.release(e.nodeid, o.fh, 0).unwrap();
    assert_eq!(host_mode(&r.host("g")), 0o640);
    assert_eq!(host_getxattr(&r.host("g"), ACCESS), None);
    r.s.mkdir(ROOT, "h", 0o777, 0o002).unwrap();
    assert_eq!(host_mode(&r.host("h")), 0o775);
    r.assert_clean();
}

#[test]
fn chmod_changes_the_mask() {
    let mut r = start();
    let d = r.s.mkdir(ROOT, "d", 0o755, 0o022).unwrap();
    r.s.setxattr(d.nodeid, DEFAULT, &default_acl(), 0).unwrap();
    let (e, o) =
        r.s.create(d.nodeid, "f", libc::O_RDWR as u32, 0o660, 0)
            .unwrap();
    r.s.release(e.nodeid, o.fh, 0).unwrap();
    let a = SetattrIn {
        valid: fattr::MODE,
        mode: libc::S_IFREG | 0o640,
        ..Default::default()
    };
    let got = r.s.setattr(e.nodeid, &a).unwrap();
    assert_eq!(got.attr.mode & 0o7777, 0o640);
    let acl_now = parse(&host_getxattr(&r.host("d/f"), ACCESS).unwrap());
    assert_eq!(
        perm_of(&acl_now, MASK),
        4,
        "the group bits of chmod are the mask"
    );
    assert_eq!(
        perm_of(&acl_now, USER),
        7,
        "named entries keep their permissions"
    );
    match r.s.getxattr(e.nodeid, ACCESS, 1024).unwrap() {
        Xattr::Data(v) => assert_eq!(parse(&v), acl_now),
        other => panic!("GETXATTR: {other:?}"),
    }
    // Setting an access ACL changes the mode: the mask becomes the group bits.
    let new = acl(&[
        (USER_OBJ, 6, UNDEFINED),
        (USER, 6, 4321),
        (GROUP_OBJ, 4, UNDEFINED),
        (MASK, 6, UNDEFINED),
        (OTHER, 4, UNDEFINED),
    ]);
    r.s.setxattr(e.nodeid, ACCESS, &new, 0).unwrap();
    assert_eq!(host_mode(&r.host("d/f")), 0o664);
    r.s.removexattr(e.nodeid, ACCESS).unwrap();
    assert_eq!(host_getxattr(&r.host("d/f"), ACCESS), None);
    r.assert_clean();
}

#[test]
fn acl_kill_sgid_clears_setgid() {
    let mut r = start();
    assert_ne!(r.s.negotiated() & f::SETXATTR_EXT, 0, "SETXATTR_EXT");
    // Files owned by root, in a group the caller (uid 0, gid 0) is not in, setgid.
    for name in ["kill", "keep"] {
        let (e, o) =
            r.s.create(ROOT, name, libc::O_RDWR as u32, 0o664, 0)
                .unwrap();
        r.s.release(e.nodeid, o.fh, 0).unwrap();
        std::os::unix::fs::chown(r.host(name), None, Some(4321)).unwrap();
        std::fs::set_permissions(r.host(name), std::fs::Permissions::from_mode(0o2775)).unwrap();
        assert_eq!(host_mode(&r.host(name)), 0o2775);
    }
    let value = acl(&[
        (USER_OBJ, 7, UNDEFINED),
        (USER, 5, 4321),
        (GROUP_OBJ, 5, UNDEFINED),
        (MASK, 5, UNDEFINED),
        (OTHER, 5, UNDEFINED),
    ]);
    let kill = r.s.lookup(ROOT, "kill").unwrap();
    r.s.setxattr_ext(kill.nodeid, ACCESS, &value, 0, SETXATTR_ACL_KILL_SGID)
        .unwrap();
    assert_eq!(
        host_mode(&r.host("kill")),
        0o755,
        "setgid cleared, mask applied"
    );
    assert!(host_getxattr(&r.host("kill"), ACCESS).is_some());
    // Without the flag (the caller is in the group or capable) the bit stays.
    let keep = r.s.lookup(ROOT, "keep").unwrap();
    r.s.setxattr_ext(keep.nodeid, ACCESS, &value, 0, 0).unwrap();
    assert_eq!(host_mode(&r.host("keep")), 0o2755);
    r.assert_clean();
}

/// Without `--posix-acl` the guest kernel does not apply ACLs but passes the ACL attributes
/// through as plain ones: both daemons refuse them (`EOPNOTSUPP`, so the guest sees a file
/// system without ACLs and uses the mode bits) and leave them out of the list, and nothing
/// reaches the host file.
#[test]
fn acl_xattrs_refused_without_posix_acl() {
    let mut r = common::start(&["--xattr"]);
    assert_eq!(r.s.negotiated() & f::POSIX_ACL, 0, "POSIX_ACL not agreed");
    let (e, o) =
        r.s.create(ROOT, "f", libc::O_RDWR as u32, 0o644, 0)
            .unwrap();
    r.s.release(e.nodeid, o.fh, 0).unwrap();
    let d = r.s.mkdir(ROOT, "d", 0o755, 0).unwrap();
    let value = acl(&[
        (USER_OBJ, 6, UNDEFINED),
        (USER, 6, 4321),
        (GROUP_OBJ, 4, UNDEFINED),
        (MASK, 6, UNDEFINED),
        (OTHER, 4, UNDEFINED),
    ]);
    let refused = |what: &str, res: std::io::Result<()>| {
        let e = res.expect_err(what);
        assert_eq!(common::errno(&e), libc::EOPNOTSUPP, "{what}: {e}");
    };
    refused("SETXATTR access", r.s.setxattr(e.nodeid, ACCESS, &value, 0));
    refused(
        "SETXATTR default",
        r.s.setxattr(d.nodeid, DEFAULT, &default_acl(), 0),
    );
    assert_eq!(host_getxattr(&r.host("f"), ACCESS), None, "nothing stored");
    assert_eq!(host_getxattr(&r.host("d"), DEFAULT), None, "nothing stored");

    // An ACL set on the host is neither read nor removed through the share, nor listed;
    // the other attributes are.
    let set_on_host = |rel: &str, name: &str, v: &[u8]| {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let p = CString::new(r.host(rel).as_os_str().as_bytes()).unwrap();
        let n = CString::new(name).unwrap();
        // SAFETY: valid NUL-terminated strings and a value of the length passed.
        let rc = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
        assert_eq!(
            rc,
            0,
            "host setxattr {name}: {}",
            std::io::Error::last_os_error()
        );
    };
    set_on_host("f", ACCESS, &value);
    set_on_host("f", "user.kept", b"v");
    let got = r.s.getxattr(e.nodeid, ACCESS, 1024).map(|_| ());
    refused("GETXATTR access", got);
    let got = r.s.getxattr(e.nodeid, ACCESS, 0).map(|_| ());
    refused("GETXATTR access (size)", got);
    refused("REMOVEXATTR access", r.s.removexattr(e.nodeid, ACCESS));
    assert!(
        host_getxattr(&r.host("f"), ACCESS).is_some(),
        "host ACL kept"
    );
    let want = b"user.kept\0".to_vec();
    match r.s.listxattr(e.nodeid, 1024).unwrap() {
        Xattr::Data(v) => assert_eq!(v, want, "LISTXATTR"),
        other => panic!("LISTXATTR: {other:?}"),
    }
    // The size probe: daxfsd answers the size of the list it serves; virtiofsd 1.14 answers
    // the host list's size (an upper bound, which is all listxattr(2) callers rely on).
    match r.s.listxattr(e.nodeid, 0).unwrap() {
        Xattr::Size(n) if common::kind() == vufs_driver::DaemonKind::Daxfsd => {
            assert_eq!(n as usize, want.len(), "LISTXATTR size");
            match r.s.listxattr(e.nodeid, n).unwrap() {
                Xattr::Data(v) => assert_eq!(v, want, "LISTXATTR of the probed size"),
                other => panic!("LISTXATTR: {other:?}"),
            }
        }
        Xattr::Size(n) => assert!(n as usize >= want.len(), "LISTXATTR size {n}"),
        other => panic!("LISTXATTR size: {other:?}"),
    }
    r.assert_clean();
}
