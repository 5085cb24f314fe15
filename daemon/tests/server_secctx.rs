//! The security-context request extension (`FUSE_SECURITY_CTX`) through the server: the
//! label lands on the new host inode, a create whose label cannot be set is undone, and
//! the extension is ignored when the option is off.

mod common;

use common::*;
use daxfsd::abi::{opcode as op, *};

const NAME: &[u8] = b"security.selinux";
const LABEL: &[u8] = b"system_u:object_r:unit_t:s0\0";

fn area(name: &[u8], value: &[u8]) -> Vec<u8> {
    let mut body = (value.len() as u32).to_le_bytes().to_vec();
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(name);
    body.push(0);
    body.extend_from_slice(value);
    let total = (8 + body.len()).div_ceil(8) * 8;
    let mut v = (total as u32).to_le_bytes().to_vec();
    v.extend_from_slice(&1u32.to_le_bytes());
    v.extend_from_slice(&body);
    v.resize(total, 0);
    v
}

/// Sends `opcode` on the root with `args` and the extension area `ext`.
fn send_ext(h: &Harness, opcode: u32, args: &[&[u8]], ext: &[u8]) -> Reply {
    let mut all = args.to_vec();
    all.push(ext);
    let mut req = h.request(0, 0, opcode, ROOT, &all);
    // InHeader.total_extlen, in units of 8 bytes.
    let off = std::mem::offset_of!(InHeader, total_extlen);
    req[off..off + 2].copy_from_slice(&((ext.len() / 8) as u16).to_le_bytes());
    h.send_raw(req, ROOM).1
}

fn creates(i: usize) -> Vec<(u32, String, Vec<u8>)> {
    let create = CreateIn {
        flags: libc::O_RDWR as u32,
        mode: 0o644,
        ..Default::default()
    };
    let mkdir = MkdirIn {
        mode: 0o755,
        umask: 0,
    };
    let mknod = MknodIn {
        mode: libc::S_IFIFO | 0o644,
        ..Default::default()
    };
    let n = |b: &str| format!("{b}{i}");
    vec![
        (op::CREATE, n("f"), [raw(&create), cname(&n("f"))].concat()),
        (op::MKDIR, n("d"), [raw(&mkdir), cname(&n("d"))].concat()),
        (op::MKNOD, n("p"), [raw(&mknod), cname(&n("p"))].concat()),
        (op::SYMLINK, n("l"), [cname(&n("l")), cname("t")].concat()),
    ]
}

fn host_lgetxattr(path: &std::path::Path, name: &[u8]) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: valid NUL-terminated strings and a buffer of the length passed.
    let len =
        unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (len >= 0).then(|| buf[..len as usize].to_vec())
}

#[test]
fn label_is_set_on_each_new_inode() {
    let h = Harness::with(|c| c.security_label = true);
    for (opc, name, args) in creates(0) {
        let r = send_ext(&h, opc, &[&args], &area(NAME, LABEL));
        assert_eq!(r.error, 0, "{name}");
        assert_eq!(
            host_lgetxattr(&h.host(&name), NAME).as_deref(),
            Some(LABEL),
            "{name}"
        );
    }
    // TMPFILE too: the label is on the unnamed file (read back over GETXATTR).
    let tmp = [
        raw(&CreateIn {
            flags: libc::O_RDWR as u32,
            mode: 0o600,
            ..Default::default()
        }),
        cname("tmp"),
    ]
    .concat();
    let r = send_ext(&h, op::TMPFILE, &[&tmp], &area(NAME, LABEL));
    assert_eq!(r.error, 0, "TMPFILE");
    let e: EntryOut = read_at(&r.body, 0);
    let get = [
        raw(&GetxattrIn {
            size: 256,
            padding: 0,
        }),
        cname("security.selinux"),
    ]
    .concat();
    let got = h.send(op::GETXATTR, e.nodeid, &[&get]);
    assert_eq!(got.result().unwrap(), LABEL);
}

#[test]
fn a_label_that_cannot_be_set_undoes_the_create() {
    // xattrs off: the label's SETXATTR fails (ENOSYS), so nothing may be left behind.
    let h = Harness::with(|c| {
        c.security_label = true;
        c.xattr = false;
    });
    for (opc, name, args) in creates(1) {
        let r = send_ext(&h, opc, &[&args], &area(NAME, LABEL));
        assert_eq!(r.error, -libc::ENOSYS, "{name}");
        assert!(
            std::fs::symlink_metadata(h.host(&name)).is_err(),
            "{name} was left unlabelled"
        );
    }
    // The server still works and the names are free.
    for (opc, name, args) in creates(1) {
        assert_eq!(h.send(opc, ROOT, &[&args]).error, 0, "{name}");
    }
}

#[test]
fn without_the_option_the_extension_is_ignored() {
    let h = Harness::new();
    for (opc, name, args) in creates(2) {
        // Even a malformed one: it is not read unless FUSE_SECURITY_CTX was agreed.
        let r = send_ext(&h, opc, &[&args], &[0xff; 16]);
        assert_eq!(r.error, 0, "{name}");
        assert_eq!(host_lgetxattr(&h.host(&name), NAME), None);
    }
}

#[test]
fn create_of_an_existing_file_neither_labels_nor_removes_it() {
    // xattrs off, so a label attempt would fail and undo: the file must survive untouched.
    let h = Harness::with(|c| {
        c.security_label = true;
        c.xattr = false;
    });
    std::fs::write(h.host("old"), b"keep me").unwrap();
    let args = [
        raw(&CreateIn {
            flags: libc::O_RDWR as u32,
            mode: 0o644,
            ..Default::default()
        }),
        cname("old"),
    ]
    .concat();
    let r = send_ext(&h, op::CREATE, &[&args], &area(NAME, LABEL));
    assert_eq!(r.error, 0, "CREATE without O_EXCL opens the existing file");
    assert_eq!(std::fs::read(h.host("old")).unwrap(), b"keep me");
    // With O_EXCL it is EEXIST, and the file is still there.
    let args = [
        raw(&CreateIn {
            flags: (libc::O_RDWR | libc::O_EXCL) as u32,
            mode: 0o644,
            ..Default::default()
        }),
        cname("old"),
    ]
    .concat();
    let r = send_ext(&h, op::CREATE, &[&args], &area(NAME, LABEL));
    assert_eq!(r.error, -libc::EEXIST);
    assert_eq!(std::fs::read(h.host("old")).unwrap(), b"keep me");
}
