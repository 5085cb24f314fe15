//! Descriptor accounting: a whole session, then DESTROY, leaves no host descriptor open.
//! (A single test in its own binary, so no other test opens files meanwhile.)

mod common;

use common::*;
use daxfsd::abi::{opcode as op, *};

#[test]
fn destroy_and_forget_close_every_descriptor() {
    let h = Harness::new();
    let baseline = fd_count();

    // Lookups, then FORGET: the inode descriptors close.
    std::fs::write(h.host("pre"), b"x").unwrap();
    let pre = h.lookup(ROOT, "pre").unwrap().nodeid;
    h.lookup(ROOT, "pre").unwrap();
    assert_eq!(fd_count(), baseline + 1);
    h.forget(pre, 2);
    assert_eq!(
        fd_count(),
        baseline,
        "FORGET to zero closes the O_PATH descriptor"
    );

    // A busy session.
    let d = h.mkdir(ROOT, "d", 0o755).unwrap().nodeid;
    for i in 0..10 {
        let (e, o) = h.create(d, &format!("f{i}"), 0o644, libc::O_RDWR).unwrap();
        h.write(e.nodeid, o.fh, 0, b"data").unwrap();
        if i % 2 == 0 {
            h.release(e.nodeid, o.fh).unwrap();
        }
        h.open(e.nodeid, libc::O_RDONLY).unwrap();
    }
    h.symlink(d, "l", "f0").unwrap();
    h.mknod(d, "p", libc::S_IFIFO | 0o644, 0).unwrap();
    let ct = CreateIn {
        flags: libc::O_RDWR as u32,
        mode: 0o600,
        ..Default::default()
    };
    h.send(op::TMPFILE, d, &[&raw(&ct), &cname("t")])
        .result()
        .unwrap();
    let dh = h.opendir(d).unwrap().fh;
    h.readdir(d, dh, 0, 4096, true).unwrap();
    h.opendir(ROOT).unwrap();
    // Failed operations must not leak either.
    assert!(h
        .create(d, "f1", 0o644, libc::O_RDWR | libc::O_EXCL)
        .is_err());
    assert!(h
        .open(h.lookup(d, "p").unwrap().nodeid, libc::O_RDONLY)
        .is_err());
    assert!(h.create(d, "p", 0o644, libc::O_RDWR).is_err());
    assert!(fd_count() > baseline + 20);

    let r = h.send(op::DESTROY, 0, &[]);
    r.result().unwrap();
    assert_eq!(h.fs().handle_count(), 0);
    assert_eq!(h.fs().inode_count(), 1);
    assert_eq!(fd_count(), baseline, "DESTROY returns to the baseline");

    // And the next session works.
    h.init();
    assert_eq!(
        h.lookup(d, "f1").unwrap_err(),
        libc::EBADF,
        "old nodeids are gone"
    );
    let d2 = h.lookup(ROOT, "d").unwrap().nodeid;
    assert!(h.lookup(d2, "f1").is_ok());
}
