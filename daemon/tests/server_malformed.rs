//! Malformed requests: each gets an errno reply (or, with no readable header, is dropped),
//! changes nothing on the host, and the server goes on serving.

mod common;

use common::*;
use daxfsd::abi::{opcode as op, *};

fn host_names(h: &Harness) -> Vec<String> {
    let mut v: Vec<_> = std::fs::read_dir(&h.share)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn truncated_header_is_dropped() {
    let h = Harness::new();
    let req = h.request(0, 0, op::LOOKUP, ROOT, &[&cname("x")]);
    for n in [0, 1, 10, 39] {
        let (res, reply) = h.send_raw(req[..n].to_vec(), ROOM);
        assert!(res.is_err(), "{n}-byte request");
        assert!(!reply.replied);
    }
    h.assert_alive();
}

#[test]
fn header_len_must_match_the_request() {
    let h = Harness::new();
    for delta in [-1i64, 1, 1000, -30] {
        let mut req = h.request(
            0,
            0,
            op::MKDIR,
            ROOT,
            &[
                &raw(&MkdirIn {
                    mode: 0o755,
                    umask: 0,
                }),
                &cname("d"),
            ],
        );
        let len = (req.len() as i64 + delta) as u32;
        req[..4].copy_from_slice(&len.to_le_bytes());
        let (_, reply) = h.send_raw(req, ROOM);
        assert_eq!(reply.errno(), libc::EINVAL, "len off by {delta}");
    }
    let mut req = h.request(0, 0, op::LOOKUP, ROOT, &[&cname("x")]);
    req[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(h.send_raw(req, ROOM).1.errno(), libc::EINVAL);
    // Extension length past the end of the request.
    let mut req = h.request(0, 0, op::LOOKUP, ROOT, &[&cname("x")]);
    req[36..38].copy_from_slice(&100u16.to_le_bytes());
    assert_eq!(h.send_raw(req, ROOM).1.errno(), libc::EINVAL);
    assert!(host_names(&h).is_empty(), "no MKDIR went through");
    h.assert_alive();
}

#[test]
fn unknown_opcode_is_enosys() {
    let h = Harness::new();
    assert_eq!(h.send(9999, ROOT, &[]).errno(), libc::ENOSYS);
    h.assert_alive();
}

#[test]
fn names_are_validated() {
    let h = Harness::new();
    let mk = raw(&MkdirIn {
        mode: 0o755,
        umask: 0,
    });
    // No NUL terminator.
    assert_eq!(h.send(op::LOOKUP, ROOT, &[b"abc"]).errno(), libc::EINVAL);
    assert_eq!(
        h.send(op::MKDIR, ROOT, &[&mk, b"abc"]).errno(),
        libc::EINVAL
    );
    // Longer than NAME_MAX.
    let long = "n".repeat(256);
    assert_eq!(h.lookup(ROOT, &long).unwrap_err(), libc::ENAMETOOLONG);
    assert_eq!(h.mkdir(ROOT, &long, 0o755).unwrap_err(), libc::ENAMETOOLONG);
    assert_eq!(
        h.lookup(ROOT, &"n".repeat(255)).unwrap_err(),
        libc::ENOENT,
        "255 is fine"
    );
    // Empty, with a slash, trailing bytes after the name.
    assert_eq!(h.lookup(ROOT, "").unwrap_err(), libc::EINVAL);
    assert_eq!(h.mkdir(ROOT, "a/b", 0o755).unwrap_err(), libc::EINVAL);
    assert_eq!(
        h.send(op::MKDIR, ROOT, &[&mk, &cname("a"), b"junk"])
            .errno(),
        libc::EINVAL
    );
    // RENAME with one name only; SYMLINK without a target.
    let rn = raw(&RenameIn { newdir: ROOT });
    assert_eq!(
        h.send(op::RENAME, ROOT, &[&rn, &cname("a")]).errno(),
        libc::EINVAL
    );
    assert_eq!(
        h.send(op::SYMLINK, ROOT, &[&cname("s")]).errno(),
        libc::EINVAL
    );
    let long_target = "t".repeat(PATH_MAX);
    assert_eq!(
        h.symlink(ROOT, "s", &long_target).unwrap_err(),
        libc::ENAMETOOLONG
    );
    assert!(host_names(&h).is_empty());
    h.assert_alive();
}

#[test]
fn truncated_arguments_are_rejected() {
    let h = Harness::new();
    for opcode in [
        op::GETATTR,
        op::SETATTR,
        op::OPEN,
        op::READ,
        op::WRITE,
        op::MKDIR,
        op::SETLK,
        op::FALLOCATE,
    ] {
        let r = h.send(opcode, ROOT, &[&[1, 2, 3]]);
        assert!(r.result().is_err(), "opcode {opcode}");
    }
    h.assert_alive();
}

#[test]
fn io_sizes_are_bounded_by_the_negotiated_maximum() {
    let h = Harness::new();
    let (e, o) = h.create(ROOT, "f", 0o644, libc::O_RDWR).unwrap();
    let a = ReadIn {
        fh: o.fh,
        size: MAX_IO + 1,
        ..Default::default()
    };
    let req = h.request(0, 0, op::READ, e.nodeid, &[&raw(&a)]);
    assert_eq!(h.send_raw(req, 2 << 20).1.errno(), libc::EINVAL);
    let big = vec![1u8; MAX_IO as usize + 1];
    assert_eq!(h.write(e.nodeid, o.fh, 0, &big).unwrap_err(), libc::EINVAL);
    // WRITE whose size disagrees with the data carried.
    let w = WriteIn {
        fh: o.fh,
        size: 10,
        ..Default::default()
    };
    assert_eq!(
        h.send(op::WRITE, e.nodeid, &[&raw(&w), b"abc"]).errno(),
        libc::EINVAL
    );
    let w = WriteIn {
        fh: o.fh,
        size: 1,
        ..Default::default()
    };
    assert_eq!(
        h.send(op::WRITE, e.nodeid, &[&raw(&w), b"abc"]).errno(),
        libc::EINVAL
    );
    // READ larger than the reply buffer.
    let a = ReadIn {
        fh: o.fh,
        size: 8192,
        ..Default::default()
    };
    let req = h.request(0, 0, op::READ, e.nodeid, &[&raw(&a)]);
    assert_eq!(h.send_raw(req, 4096).1.errno(), libc::ENOBUFS);
    assert_eq!(
        std::fs::metadata(h.host("f")).unwrap().len(),
        0,
        "nothing written"
    );
    h.assert_alive();
}

#[test]
fn batch_forget_count_must_match() {
    let h = Harness::new();
    let ino = h.make_file(ROOT, "f", b"");
    for count in [2, u32::MAX, 0] {
        let mut args = raw(&BatchForgetIn { count, dummy: 0 });
        args.extend(raw(&ForgetOne {
            nodeid: ino,
            nlookup: 1,
        }));
        let r = h.send(op::BATCH_FORGET, 0, &[&args]);
        assert!(!r.replied, "BATCH_FORGET never gets a reply");
        assert_eq!(
            h.fs()
                .lookup_count(daxfsd::filesystem::Inode::from_raw(ino)),
            1,
            "count {count}: nothing forgotten"
        );
    }
    h.assert_alive();
}

#[test]
fn no_room_for_a_reply() {
    let h = Harness::new();
    let req = h.request(0, 0, op::GETATTR, ROOT, &[&raw(&GetattrIn::default())]);
    let (res, reply) = h.send_raw(req.clone(), 8);
    assert!(res.is_err());
    assert!(!reply.replied);
    let (res, _) = h.send_raw(req.clone(), 0);
    assert!(res.is_err());
    // Room for the header but not the body: an error reply.
    let (_, reply) = h.send_raw(req, 20);
    assert_eq!(reply.errno(), libc::ENOBUFS);
    // FORGET needs no reply room at all.
    h.lookup(ROOT, "alive").ok();
    let ino = h.make_file(ROOT, "g", b"");
    let req = h.request(0, 0, op::FORGET, ino, &[&raw(&ForgetIn { nlookup: 1 })]);
    assert_eq!(h.send_raw(req, 0).0.unwrap().written, 0);
    assert_eq!(h.getattr(ino).unwrap_err(), libc::EBADF);
    h.assert_alive();
}

/// The exit report counts every request the server handled by opcode, malformed ones and
/// unknown opcodes included.
#[test]
fn requests_are_counted_by_opcode() {
    let h = Harness::new();
    let base = h.server.request_counts();
    for _ in 0..3 {
        let _ = h.lookup(ROOT, "absent");
    }
    let _ = h.getattr(ROOT);
    let mut req = h.request(0, 0, op::LOOKUP, ROOT, &[&cname("x")]);
    req[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(h.send_raw(req, ROOM).1.errno(), libc::EINVAL);
    let _ = h.send(999, ROOT, &[]);
    let c = h.server.request_counts();
    assert_eq!(c.of("LOOKUP") - base.of("LOOKUP"), 4);
    assert_eq!(c.of("GETATTR") - base.of("GETATTR"), 1);
    assert_eq!(c.of("?") - base.of("?"), 1);
    let line = c.to_string();
    assert!(line.starts_with("requests: "), "{line}");
    assert!(line.contains("LOOKUP 4"), "{line}");
}
