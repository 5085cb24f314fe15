//! A reply the client never got (/dev/fuse answers ENOENT when the request was interrupted):
//! an OPEN or CREATE handle it carried must be released by the server, since the client
//! will never send RELEASE for it.

mod common;

use common::*;
use daxfsd::abi::{opcode as op, *};

/// The reply bytes as the transport wrote them (header + body).
fn wire(r: &Reply) -> Vec<u8> {
    let mut v = raw(&OutHeader {
        len: (std::mem::size_of::<OutHeader>() + r.body.len()) as u32,
        error: r.error,
        unique: r.unique,
    });
    v.extend_from_slice(&r.body);
    v
}

#[test]
fn a_lost_open_reply_releases_its_handle() {
    let h = Harness::new();
    std::fs::write(h.host("f"), b"data").unwrap();
    let e = h.lookup(ROOT, "f").unwrap();
    let a = OpenIn {
        flags: libc::O_RDONLY as u32,
        open_flags: 0,
    };
    let req = h.request(0, 0, op::OPEN, e.nodeid, &[&raw(&a)]);
    let (_, reply) = h.send_raw(req.clone(), ROOM);
    let o: OpenOut = reply.obj();
    assert_eq!(h.read(e.nodeid, o.fh, 0, 4).unwrap(), b"data");
    h.server.reply_lost(&req, &wire(&reply));
    assert_eq!(h.read(e.nodeid, o.fh, 0, 4), Err(libc::EBADF));
}

#[test]
fn a_lost_create_reply_releases_its_handle_and_keeps_the_file() {
    let h = Harness::new();
    let a = CreateIn {
        flags: libc::O_RDWR as u32,
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        open_flags: 0,
    };
    let req = h.request(0, 0, op::CREATE, ROOT, &[&raw(&a), &cname("new")]);
    let (_, reply) = h.send_raw(req.clone(), ROOM);
    let e: EntryOut = read_at(&reply.body, 0);
    let o: OpenOut = read_at(&reply.body, std::mem::size_of::<EntryOut>());
    assert_eq!(h.write(e.nodeid, o.fh, 0, b"x").unwrap(), 1);
    h.server.reply_lost(&req, &wire(&reply));
    assert_eq!(h.write(e.nodeid, o.fh, 0, b"y"), Err(libc::EBADF));
    // The file was created on the host (the client may look it up again); only the handle
    // is gone.
    assert_eq!(std::fs::read(h.host("new")).unwrap(), b"x");
}

#[test]
fn lost_replies_of_other_requests_or_errors_change_nothing() {
    let h = Harness::new();
    std::fs::write(h.host("f"), b"data").unwrap();
    let e = h.lookup(ROOT, "f").unwrap();
    let o = h.open(e.nodeid, libc::O_RDONLY).unwrap();
    // A GETATTR reply, an error reply, and garbage: nothing is released.
    let req = h.request(0, 0, op::GETATTR, e.nodeid, &[&raw(&GetattrIn::default())]);
    let (_, reply) = h.send_raw(req.clone(), ROOM);
    h.server.reply_lost(&req, &wire(&reply));
    let open_req = h.request(
        0,
        0,
        op::OPEN,
        e.nodeid,
        &[&raw(&OpenIn {
            flags: 0,
            open_flags: 0,
        })],
    );
    h.server.reply_lost(&open_req, &[0u8; 3]);
    h.server.reply_lost(&[1, 2, 3], &[]);
    assert_eq!(h.read(e.nodeid, o.fh, 0, 4).unwrap(), b"data");
}

#[test]
fn a_lost_lock_reply_gives_the_lock_back() {
    let h = Harness::with(|c| c.posix_lock = true);
    std::fs::write(h.host("f"), b"data").unwrap();
    let e = h.lookup(ROOT, "f").unwrap();
    let o1 = h.open(e.nodeid, libc::O_RDWR).unwrap();
    let o2 = h.open(e.nodeid, libc::O_RDWR).unwrap();
    let lock = |fh: u64, owner: u64| LkIn {
        fh,
        owner,
        lk: FileLock {
            start: 0,
            end: u64::MAX,
            typ: libc::F_WRLCK as u32,
            pid: 1,
        },
        lk_flags: 0,
        padding: 0,
    };
    let req = h.request(0, 0, op::SETLKW, e.nodeid, &[&raw(&lock(o1.fh, 1))]);
    let (_, reply) = h.send_raw(req.clone(), ROOM);
    assert_eq!(reply.error, 0);
    // Owner 2 cannot have it while owner 1 holds it...
    let r = h.send(op::SETLK, e.nodeid, &[&raw(&lock(o2.fh, 2))]);
    assert_eq!(r.error, -libc::EAGAIN);
    // ...and can once owner 1's reply is known lost.
    h.server.reply_lost(&req, &wire(&reply));
    let r = h.send(op::SETLK, e.nodeid, &[&raw(&lock(o2.fh, 2))]);
    assert_eq!(r.error, 0);
}
