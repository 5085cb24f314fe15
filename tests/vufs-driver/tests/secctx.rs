//! Security labels (`--security-label`, `FUSE_SECURITY_CTX`) at the protocol level: the
//! context a Linux guest appends to CREATE, MKDIR, MKNOD and SYMLINK (the request-extension
//! area) becomes that `security.*` xattr of the new host file, against either daemon; a
//! malformed extension area gets EINVAL and creates nothing (daxfsd only: what virtiofsd
//! does with it is its own business).
//!
//! Setting `security.*` on a host without an LSM that owns the name needs CAP_SYS_ADMIN,
//! so both daemons run with `--modcaps=+sys_admin`.

mod common;

use daxfsd::abi::{self, init_flags as f, opcode as op};
use vm_memory::ByteValued;
use vufs_driver::{Daemon, DaemonKind, DriverConfig, InitOptions, Session};

const ROOT: u64 = 1;
const NAME: &str = "security.selinux";
const LABEL: &[u8] = b"system_u:object_r:vufs_t:s0\0";

fn start() -> common::Rig {
    start_with(&["--security-label", "--modcaps=+sys_admin"])
}

fn start_with(args: &[&str]) -> common::Rig {
    let root = tempfile::Builder::new()
        .prefix("vufs-shared-")
        .tempdir()
        .expect("tempdir");
    let kind = common::kind();
    let mut b = Daemon::builder(&kind).unwrap_or_else(|e| panic!("{e}"));
    b = b.shared_dir(root.path());
    for a in args {
        b = b.arg(a);
    }
    let daemon = b.spawn().unwrap_or_else(|e| panic!("{e}"));
    let s = Session::connect_with(daemon.socket_path(), &DriverConfig::default())
        .unwrap_or_else(|e| panic!("connect: {e}\n{}", daemon.log_contents()));
    let mut o = InitOptions::linux(false);
    o.flags |= f::SECURITY_CTX;
    s.init_with(&o)
        .unwrap_or_else(|e| panic!("INIT: {e}\n{}", daemon.log_contents()));
    assert_ne!(
        s.negotiated() & f::SECURITY_CTX,
        0,
        "--security-label must negotiate SECURITY_CTX"
    );
    common::Rig { s, daemon, root }
}

/// The extension area Linux 6.12 sends for one context (`nr` contexts claimed).
fn area(name: &[u8], value: &[u8], nr: u32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&(value.len() as u32).to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(name);
    body.push(0);
    body.extend_from_slice(value);
    let total = (8 + body.len()).div_ceil(8) * 8;
    let mut v = Vec::new();
    v.extend_from_slice(&(total as u32).to_le_bytes());
    v.extend_from_slice(&nr.to_le_bytes());
    v.extend_from_slice(&body);
    v.resize(total, 0);
    v
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// Sends `opcode` with `parts` and the extension area `ext`; returns (errno, body).
fn send_ext(s: &Session, opcode: u32, parts: &[&[u8]], ext: &[u8]) -> (i32, Vec<u8>) {
    assert_eq!(ext.len() % 8, 0);
    let body_len: usize = parts.iter().map(|p| p.len()).sum();
    let mut hdr = s.header(opcode, ROOT, body_len + ext.len());
    hdr.total_extlen = (ext.len() / 8) as u16;
    let mut all: Vec<&[u8]> = parts.to_vec();
    all.push(ext);
    let r = s.send_with_header(&hdr, &all, 16 + 160, 1).unwrap();
    let h = r.header().expect("reply header");
    (-h.error, r.body().to_vec())
}

fn create_parts(kind: u32, name: &str) -> (u32, Vec<Vec<u8>>) {
    match kind {
        op::CREATE => {
            let a = abi::CreateIn {
                flags: libc::O_RDWR as u32,
                mode: 0o644,
                umask: 0,
                open_flags: 0,
            };
            (op::CREATE, vec![a.as_slice().to_vec(), cstr(name)])
        }
        op::MKDIR => {
            let a = abi::MkdirIn {
                mode: 0o755,
                umask: 0,
            };
            (op::MKDIR, vec![a.as_slice().to_vec(), cstr(name)])
        }
        op::MKNOD => {
            let a = abi::MknodIn {
                mode: libc::S_IFIFO | 0o644,
                rdev: 0,
                umask: 0,
                padding: 0,
            };
            (op::MKNOD, vec![a.as_slice().to_vec(), cstr(name)])
        }
        op::SYMLINK => (op::SYMLINK, vec![cstr(name), cstr("target")]),
        _ => unreachable!(),
    }
}

fn host_lgetxattr(path: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: valid NUL-terminated strings and a buffer of the length passed.
    let len =
        unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (len >= 0).then(|| buf[..len as usize].to_vec())
}

const CREATES: [(u32, &str); 4] = [
    (op::CREATE, "file"),
    (op::MKDIR, "dir"),
    (op::MKNOD, "fifo"),
    (op::SYMLINK, "link"),
];

#[test]
fn context_becomes_the_host_xattr() {
    let mut r = start();
    for (opc, name) in CREATES {
        let (opc, parts) = create_parts(opc, name);
        let parts: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        let (errno, body) = send_ext(&r.s, opc, &parts, &area(NAME.as_bytes(), LABEL, 1));
        assert_eq!(
            errno,
            0,
            "{name}: errno {errno}\n{}",
            r.daemon.log_contents()
        );
        assert!(body.len() >= 128, "{name}: reply of {} bytes", body.len());
        assert_eq!(
            host_lgetxattr(&r.host(name), NAME).as_deref(),
            Some(LABEL),
            "{name}"
        );
    }
    // No LSM context in the guest: a header with zero contexts, nothing set.
    let (opc, parts) = create_parts(op::MKDIR, "plain");
    let parts: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
    let mut empty = 8u32.to_le_bytes().to_vec();
    empty.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(send_ext(&r.s, opc, &parts, &empty).0, 0);
    assert!(r.host("plain").is_dir());
    assert_eq!(host_lgetxattr(&r.host("plain"), NAME), None);
    r.assert_clean();
}

#[test]
fn malformed_extensions_are_einval_and_create_nothing() {
    if common::kind() != DaemonKind::Daxfsd {
        eprintln!("daxfsd only: virtiofsd's handling of malformed extensions is not ours to test");
        return;
    }
    let mut r = start();
    let good = area(NAME.as_bytes(), LABEL, 1);
    let mut bad: Vec<(&str, Vec<u8>)> = vec![
        ("two contexts", area(NAME.as_bytes(), LABEL, 2)),
        ("not security.*", area(b"user.selinux", LABEL, 1)),
        ("two headers", [good.clone(), good.clone()].concat()),
    ];
    let mut v = good.clone();
    v[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    bad.push(("size past the area", v));
    let mut v = good.clone();
    v[..4].copy_from_slice(&0u32.to_le_bytes());
    bad.push(("size 0", v));
    let mut v = good.clone();
    v[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    bad.push(("context length past the area", v));
    let mut v = good.clone();
    for b in &mut v[16..] {
        *b = b'a';
    }
    bad.push(("name without NUL", v));
    for (i, (why, ext)) in bad.iter().enumerate() {
        for (opc, base) in CREATES {
            let name = format!("{base}{i}");
            let (opc, parts) = create_parts(opc, &name);
            let parts: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
            let (errno, _) = send_ext(&r.s, opc, &parts, ext);
            assert_eq!(errno, libc::EINVAL, "{why}, {}", op::name(opc));
            assert!(
                std::fs::symlink_metadata(r.host(&name)).is_err(),
                "{why}: {name} was created"
            );
        }
    }
    // total_extlen larger than the request: EINVAL before anything is parsed.
    let (opc, parts) = create_parts(op::MKDIR, "big");
    let body_len: usize = parts.iter().map(|p| p.len()).sum();
    let mut hdr = r.s.header(opc, ROOT, body_len);
    hdr.total_extlen = u16::MAX;
    let parts: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
    let rep = r.s.send_with_header(&hdr, &parts, 16 + 128, 1).unwrap();
    assert_eq!(rep.header().unwrap().error, -libc::EINVAL);
    assert!(!r.host("big").exists());
    // The daemon goes on serving.
    r.s.mkdir(ROOT, "after", 0o755, 0).unwrap();
    r.assert_clean();
}
