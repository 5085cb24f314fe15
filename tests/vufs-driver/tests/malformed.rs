//! Malformed requests: bad descriptor layouts and bad FUSE messages, each on a fresh daemon.
//!
//! Every backend must: never leave a chain unanswered while staying alive (a request that
//! times out is a failure), never claim more bytes than the writable buffers hold, answer
//! with a well-formed out-header when it answers, and, if it gives up, close the connection
//! and exit without a signal. A robust backend answers and keeps serving; upstream virtiofsd
//! 1.14 instead exits with status 1 on any request it cannot decode or encode (see
//! `survives`).

mod common;

use std::io::ErrorKind;
use std::time::Duration;

use daxfsd::abi::{self, opcode, GetattrIn};
use vm_memory::ByteValued;
use vufs_driver::{DaemonKind, Seg};

/// Whether the daemon under test is expected to keep serving after a malformed request.
fn survives() -> bool {
    // virtiofsd 1.14 treats every request decode/encode error (and any descriptor outside
    // guest memory) as fatal: it logs it and exits 1.
    common::kind() != DaemonKind::Virtiofsd
}

fn getattr_header(s: &vufs_driver::Session) -> Vec<u8> {
    s.header(opcode::GETATTR, abi::ROOT_ID, 16)
        .as_slice()
        .to_vec()
}

fn arg() -> Vec<u8> {
    GetattrIn::default().as_slice().to_vec()
}

/// Sends `segs` on a fresh daemon and checks the generic rules; returns the reply if any.
fn case(
    name: &str,
    build: impl FnOnce(&vufs_driver::Session) -> Vec<Seg>,
) -> Option<vufs_driver::Reply> {
    let mut r = common::start(&[]);
    let s = r.s.with_timeout(Duration::from_secs(3));
    let segs = build(&s);
    let res = s.send_chain(1, segs);
    let v = s.device().violations();
    assert!(v.is_empty(), "{name}: protocol violations {v:?}");
    match res {
        Ok(rep) => {
            if let Some(h) = rep.header() {
                assert!(
                    h.error <= 0 && h.error > -4096,
                    "{name}: bad errno in {h:?}"
                );
                assert!(
                    h.len as usize >= 16 && h.len <= rep.used_len,
                    "{name}: {h:?} vs used {}",
                    rep.used_len
                );
            }
            // It answered, so it must still serve.
            let after = s.getattr(abi::ROOT_ID, None);
            assert!(
                after.is_ok(),
                "{name}: answered, then GETATTR failed: {after:?}\n{}",
                r.daemon.log_contents()
            );
            r.assert_clean();
            Some(rep)
        }
        Err(e) if e.kind() == ErrorKind::ConnectionAborted => {
            assert!(
                !survives(),
                "{name}: backend hung up: {e}\nlog:\n{}",
                r.daemon.log_contents()
            );
            let st = r.daemon.wait_exit(Duration::from_secs(5)).unwrap();
            assert!(
                st.code().is_some(),
                "{name}: daemon died by signal: {st}\n{}",
                r.daemon.log_contents()
            );
            None
        }
        Err(e) => panic!(
            "{name}: {e} (a chain left unanswered)\nlog:\n{}",
            r.daemon.log_contents()
        ),
    }
}

fn outside(s: &vufs_driver::Session) -> u64 {
    let m = s.device().mem();
    m.base() + m.size() + 4096
}

#[test]
fn writable_descriptor_before_readable() {
    case("writable first", |s| {
        vec![
            Seg::Writable(120),
            Seg::Readable(getattr_header(s)),
            Seg::Readable(arg()),
        ]
    });
}

#[test]
fn readable_descriptor_outside_guest_memory() {
    case("readable outside", |s| {
        vec![
            Seg::Raw {
                addr: outside(s),
                len: 40,
                writable: false,
            },
            Seg::Writable(120),
        ]
    });
}

#[test]
fn readable_descriptor_straddling_end_of_memory() {
    case("straddling", |s| {
        let m = s.device().mem();
        vec![
            Seg::Raw {
                addr: m.base() + m.size() - 20,
                len: 40,
                writable: false,
            },
            Seg::Writable(120),
        ]
    });
}

#[test]
fn writable_descriptor_outside_guest_memory() {
    case("writable outside", |s| {
        vec![
            Seg::Readable(getattr_header(s)),
            Seg::Readable(arg()),
            Seg::Raw {
                addr: outside(s),
                len: 120,
                writable: true,
            },
        ]
    });
}

#[test]
fn zero_length_readable_descriptor() {
    case("zero-length readable", |s| {
        vec![
            Seg::Readable(vec![]),
            Seg::Readable(getattr_header(s)),
            Seg::Readable(arg()),
            Seg::Writable(120),
        ]
    });
}

#[test]
fn zero_length_writable_descriptor() {
    case("zero-length writable", |s| {
        vec![
            Seg::Readable(getattr_header(s)),
            Seg::Readable(arg()),
            Seg::Writable(0),
        ]
    });
}

#[test]
fn reply_buffer_shorter_than_out_header() {
    if let Some(rep) = case("8-byte reply", |s| {
        vec![
            Seg::Readable(getattr_header(s)),
            Seg::Readable(arg()),
            Seg::Writable(8),
        ]
    }) {
        assert!(rep.used_len <= 8);
    }
}

#[test]
fn reply_buffer_too_short_for_the_body() {
    case("header-only reply", |s| {
        vec![
            Seg::Readable(getattr_header(s)),
            Seg::Readable(arg()),
            Seg::Writable(16),
        ]
    });
}

#[test]
fn no_writable_descriptor_for_a_request_with_reply() {
    case("only readable", |s| {
        vec![Seg::Readable(getattr_header(s)), Seg::Readable(arg())]
    });
}

#[test]
fn truncated_in_header() {
    case("20-byte in-header", |s| {
        vec![
            Seg::Readable(getattr_header(s)[..20].to_vec()),
            Seg::Writable(120),
        ]
    });
}

#[test]
fn missing_arguments() {
    case("GETATTR without its argument", |s| {
        vec![Seg::Readable(getattr_header(s)), Seg::Writable(120)]
    });
}

#[test]
fn name_without_nul() {
    case("LOOKUP name without NUL", |s| {
        let h = s.header(opcode::LOOKUP, abi::ROOT_ID, 3);
        vec![
            Seg::Readable(h.as_slice().to_vec()),
            Seg::Readable(b"abc".to_vec()),
            Seg::Writable(144),
        ]
    });
}

#[test]
fn in_header_len_larger_than_the_chain() {
    case("lying len", |s| {
        let mut h = s.header(opcode::GETATTR, abi::ROOT_ID, 16);
        h.len += 1000;
        vec![
            Seg::Readable(h.as_slice().to_vec()),
            Seg::Readable(arg()),
            Seg::Writable(120),
        ]
    });
}

#[test]
fn unknown_opcode_gets_enosys() {
    let rep = case("opcode 9999", |s| {
        let h = s.header(9999, abi::ROOT_ID, 8);
        vec![
            Seg::Readable(h.as_slice().to_vec()),
            Seg::Readable(vec![0; 8]),
            Seg::Writable(16),
            Seg::Writable(64),
        ]
    })
    .expect("an unknown opcode must be answered");
    let h = rep.header().expect("out-header");
    assert_eq!((h.error, h.len, rep.used_len), (-libc::ENOSYS, 16, 16));
}
