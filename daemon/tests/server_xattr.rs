//! SETXATTR, GETXATTR, LISTXATTR, REMOVEXATTR, checked on the host files.

mod common;

use common::*;
use daxfsd::abi::{opcode as op, *};

fn setxattr(h: &Harness, ino: u64, name: &str, value: &[u8], flags: i32) -> Result<(), i32> {
    let mut args = raw(&SetxattrIn {
        size: value.len() as u32,
        flags: flags as u32,
        setxattr_flags: 0,
        padding: 0,
    });
    args.extend(cname(name));
    args.extend_from_slice(value);
    h.send(op::SETXATTR, ino, &[&args]).result().map(drop)
}

fn getxattr(h: &Harness, ino: u64, name: &str, size: u32) -> Result<Vec<u8>, i32> {
    let a = GetxattrIn { size, padding: 0 };
    h.send(op::GETXATTR, ino, &[&raw(&a), &cname(name)])
        .result()
        .map(|b| b.to_vec())
}

fn listxattr(h: &Harness, ino: u64, size: u32) -> Result<Vec<u8>, i32> {
    let a = GetxattrIn { size, padding: 0 };
    h.send(op::LISTXATTR, ino, &[&raw(&a)])
        .result()
        .map(|b| b.to_vec())
}

fn removexattr(h: &Harness, ino: u64, name: &str) -> Result<(), i32> {
    h.send(op::REMOVEXATTR, ino, &[&cname(name)])
        .result()
        .map(drop)
}

fn size_of_reply(body: &[u8]) -> u32 {
    assert_eq!(body.len(), 8, "GetxattrOut");
    read_at::<GetxattrOut>(body, 0).size
}

#[test]
fn xattrs_round_trip_through_the_host() {
    let h = Harness::new();
    let f = h.make_file(ROOT, "f", b"");
    setxattr(&h, f, "user.color", b"blue", 0).unwrap();
    assert_eq!(host_getxattr(&h.host("f"), "user.color").unwrap(), b"blue");
    host_setxattr(&h.host("f"), "user.host", b"set-on-host");
    assert_eq!(getxattr(&h, f, "user.host", 64).unwrap(), b"set-on-host");
    assert_eq!(size_of_reply(&getxattr(&h, f, "user.host", 0).unwrap()), 11);
    assert_eq!(getxattr(&h, f, "user.host", 4).unwrap_err(), libc::ERANGE);
    assert_eq!(getxattr(&h, f, "user.none", 64).unwrap_err(), libc::ENODATA);

    let list = listxattr(&h, f, 4096).unwrap();
    let mut names: Vec<_> = list.split(|&b| b == 0).filter(|s| !s.is_empty()).collect();
    names.sort();
    assert_eq!(names, [&b"user.color"[..], b"user.host"]);
    assert_eq!(
        size_of_reply(&listxattr(&h, f, 0).unwrap()) as usize,
        list.len()
    );
    assert_eq!(listxattr(&h, f, 3).unwrap_err(), libc::ERANGE);

    assert_eq!(
        setxattr(&h, f, "user.color", b"red", libc::XATTR_CREATE).unwrap_err(),
        libc::EEXIST
    );
    assert_eq!(
        setxattr(&h, f, "user.new", b"v", libc::XATTR_REPLACE).unwrap_err(),
        libc::ENODATA
    );
    setxattr(&h, f, "user.color", b"red", libc::XATTR_REPLACE).unwrap();
    assert_eq!(host_getxattr(&h.host("f"), "user.color").unwrap(), b"red");

    removexattr(&h, f, "user.color").unwrap();
    assert_eq!(
        host_getxattr(&h.host("f"), "user.color").unwrap_err(),
        libc::ENODATA
    );
    assert_eq!(removexattr(&h, f, "user.color").unwrap_err(), libc::ENODATA);

    // Directories too.
    let d = h.mkdir(ROOT, "d", 0o755).unwrap().nodeid;
    setxattr(&h, d, "user.dir", b"yes", 0).unwrap();
    assert_eq!(host_getxattr(&h.host("d"), "user.dir").unwrap(), b"yes");
    assert_eq!(getxattr(&h, 999, "user.x", 10).unwrap_err(), libc::EBADF);
}

#[test]
fn xattrs_on_special_files_neither_follow_nor_open() {
    let h = Harness::new();
    std::fs::write(h.host("target"), b"").unwrap();
    std::os::unix::fs::symlink("target", h.host("link")).unwrap();
    let link = h.lookup(ROOT, "link").unwrap().nodeid;
    // The symlink itself (user.* is not allowed on symlinks), never its target.
    assert_eq!(
        setxattr(&h, link, "user.x", b"1", 0).unwrap_err(),
        libc::EPERM
    );
    setxattr(&h, link, "trusted.x", b"on-link", 0).unwrap();
    assert_eq!(
        host_getxattr(&h.host("link"), "trusted.x").unwrap(),
        b"on-link"
    );
    assert_eq!(
        host_getxattr(&h.host("target"), "trusted.x").unwrap_err(),
        libc::ENODATA
    );
    assert_eq!(getxattr(&h, link, "trusted.x", 64).unwrap(), b"on-link");

    // A fifo: opening it would block; xattrs work without opening.
    host_mkfifo(&h.host("fifo"));
    let fifo = h.lookup(ROOT, "fifo").unwrap().nodeid;
    setxattr(&h, fifo, "trusted.f", b"ok", 0).unwrap();
    assert_eq!(host_getxattr(&h.host("fifo"), "trusted.f").unwrap(), b"ok");
    assert_eq!(getxattr(&h, fifo, "trusted.f", 64).unwrap(), b"ok");
    removexattr(&h, fifo, "trusted.f").unwrap();
}

#[test]
fn xattrs_off_means_enosys() {
    let h = Harness::with(|c| c.xattr = false);
    let f = h.make_file(ROOT, "f", b"");
    host_setxattr(&h.host("f"), "user.keep", b"1");
    assert_eq!(
        setxattr(&h, f, "user.a", b"1", 0).unwrap_err(),
        libc::ENOSYS
    );
    assert_eq!(getxattr(&h, f, "user.keep", 10).unwrap_err(), libc::ENOSYS);
    assert_eq!(listxattr(&h, f, 100).unwrap_err(), libc::ENOSYS);
    assert_eq!(removexattr(&h, f, "user.keep").unwrap_err(), libc::ENOSYS);
    assert_eq!(host_getxattr(&h.host("f"), "user.keep").unwrap(), b"1");
    assert_eq!(
        host_getxattr(&h.host("f"), "user.a").unwrap_err(),
        libc::ENODATA
    );
}

#[test]
fn xattr_requests_are_validated() {
    let h = Harness::new();
    let f = h.make_file(ROOT, "f", b"");
    // Declared size and the bytes that follow the name disagree.
    let mut args = raw(&SetxattrIn {
        size: 10,
        ..Default::default()
    });
    args.extend(cname("user.a"));
    args.extend_from_slice(b"abc");
    assert_eq!(h.send(op::SETXATTR, f, &[&args]).errno(), libc::EINVAL);
    // Too large a value.
    assert_eq!(
        setxattr(&h, f, "user.big", &vec![0u8; XATTR_SIZE_MAX + 1], 0).unwrap_err(),
        libc::E2BIG
    );
    // Name too long, empty, or unterminated.
    let long = format!("user.{}", "n".repeat(300));
    assert_eq!(getxattr(&h, f, &long, 10).unwrap_err(), libc::ERANGE);
    assert_eq!(getxattr(&h, f, "", 10).unwrap_err(), libc::EINVAL);
    let a = GetxattrIn {
        size: 10,
        padding: 0,
    };
    assert_eq!(
        h.send(op::GETXATTR, f, &[&raw(&a), b"user.a"]).errno(),
        libc::EINVAL
    );
    // A huge buffer request does not allocate 4 GiB: it is capped and works.
    host_setxattr(&h.host("f"), "user.s", b"small");
    let a = GetxattrIn {
        size: u32::MAX,
        padding: 0,
    };
    let r = h.send(op::GETXATTR, f, &[&raw(&a), &cname("user.s")]);
    assert_eq!(r.result().unwrap(), b"small");
    assert_eq!(
        host_getxattr(&h.host("f"), "user.a").unwrap_err(),
        libc::ENODATA
    );
    h.assert_alive();
}

#[test]
fn xattrmap_translates_names_both_ways() {
    // Guest names under "trusted." live on the host under "user.virtiofs.trusted.".
    let map =
        daxfsd::passthrough::xattrmap::XattrMap::parse(":map:trusted.:user.virtiofs.:").unwrap();
    let h = Harness::with(|c| c.xattrmap = Some(map));
    let f = h.make_file(ROOT, "f", b"");
    setxattr(&h, f, "trusted.overlay", b"v1", 0).unwrap();
    assert_eq!(
        host_getxattr(&h.host("f"), "user.virtiofs.trusted.overlay").unwrap(),
        b"v1"
    );
    assert_eq!(getxattr(&h, f, "trusted.overlay", 64).unwrap(), b"v1");
    // The guest cannot reach the mapped names directly.
    assert_eq!(
        getxattr(&h, f, "user.virtiofs.trusted.overlay", 64).unwrap_err(),
        libc::EPERM
    );
    assert_eq!(
        setxattr(&h, f, "user.virtiofs.x", b"v", 0).unwrap_err(),
        libc::EPERM
    );
    // Other names pass unchanged.
    setxattr(&h, f, "user.plain", b"p", 0).unwrap();
    assert_eq!(host_getxattr(&h.host("f"), "user.plain").unwrap(), b"p");
    // The list: mapped names stripped, other names kept.
    let want = b"trusted.overlay\0user.plain\0";
    let size = size_of_reply(&listxattr(&h, f, 0).unwrap());
    assert_eq!(size as usize, want.len());
    let list = listxattr(&h, f, 4096).unwrap();
    let mut names: Vec<_> = list.split(|&b| b == 0).filter(|s| !s.is_empty()).collect();
    names.sort();
    assert_eq!(names, [&b"trusted.overlay"[..], b"user.plain"]);
    assert_eq!(listxattr(&h, f, 5).unwrap_err(), libc::ERANGE);
    removexattr(&h, f, "trusted.overlay").unwrap();
    assert_eq!(
        host_getxattr(&h.host("f"), "user.virtiofs.trusted.overlay").unwrap_err(),
        libc::ENODATA
    );
}
