//! Session-level opcodes: INIT, DESTROY, INTERRUPT, IOCTL, unknown opcodes.

mod common;

use common::*;
use daxfsd::abi::{init_flags as f, opcode as op, *};
use daxfsd::passthrough::CachePolicy;

fn init_flags_for(tweak: impl FnOnce(&mut daxfsd::passthrough::Config)) -> u64 {
    let h = Harness::uninit(tweak, MapperKind::Recording);
    let out = h.init();
    let agreed = u64::from(out.flags) | (u64::from(out.flags2) << 32);
    assert_eq!(agreed, h.server.negotiated_flags());
    agreed
}

#[test]
fn init_negotiates_what_the_fs_wants() {
    let h = Harness::uninit(|_| {}, MapperKind::Recording);
    let out = h.init();
    assert_eq!((out.major, out.minor), (7, 41));
    assert_eq!(out.max_write, MAX_IO);
    assert_eq!(out.map_alignment, 12, "a window exists");
    let agreed = u64::from(out.flags) | (u64::from(out.flags2) << 32);
    for want in [f::DO_READDIRPLUS, f::READDIRPLUS_AUTO] {
        assert_ne!(agreed & want, 0, "flag {want:#x} negotiated");
    }
    // The guest applies the umask; writeback, submounts, killpriv and remote locks are
    // opt-in (locks stay in the guest by default, as with virtiofsd). Never
    // ATOMIC_O_TRUNC: Linux would send an O_TRUNC open's truncation before checking it may
    // happen (ETXTBSY); see `vfstest busytext`.
    for not in [
        f::ATOMIC_O_TRUNC,
        f::POSIX_LOCKS,
        f::FLOCK_LOCKS,
        f::DONT_MASK,
        f::WRITEBACK_CACHE,
        f::SUBMOUNTS,
        f::HANDLE_KILLPRIV_V2,
        f::DIRECT_IO_ALLOW_MMAP,
    ] {
        assert_eq!(agreed & not, 0, "flag {not:#x} not negotiated");
    }
}

#[test]
fn init_follows_the_config() {
    let never = init_flags_for(|c| c.cache = CachePolicy::Never);
    assert_eq!(never & (f::DO_READDIRPLUS | f::READDIRPLUS_AUTO), 0);
    assert_eq!(never & f::DIRECT_IO_ALLOW_MMAP, 0);
    let mmap = init_flags_for(|c| {
        c.cache = CachePolicy::Never;
        c.allow_mmap = true;
    });
    assert_ne!(mmap & f::DIRECT_IO_ALLOW_MMAP, 0);
    let no_rdp = init_flags_for(|c| c.readdirplus = false);
    assert_eq!(no_rdp & f::DO_READDIRPLUS, 0);
    let wb = init_flags_for(|c| c.writeback = true);
    assert_ne!(wb & f::WRITEBACK_CACHE, 0);
    let sub = init_flags_for(|c| c.announce_submounts = true);
    assert_ne!(sub & f::SUBMOUNTS, 0);
    let kp = init_flags_for(|c| c.killpriv_v2 = true);
    assert_ne!(kp & f::HANDLE_KILLPRIV_V2, 0);
    let pl = init_flags_for(|c| c.posix_lock = true);
    assert_eq!(pl & (f::POSIX_LOCKS | f::FLOCK_LOCKS), f::POSIX_LOCKS);
    let fl = init_flags_for(|c| c.flock = true);
    assert_eq!(fl & (f::POSIX_LOCKS | f::FLOCK_LOCKS), f::FLOCK_LOCKS);
}

#[test]
fn init_offers_only_what_the_client_offered() {
    let h = Harness::uninit(
        |c| {
            c.writeback = true;
            c.posix_lock = true;
        },
        MapperKind::Recording,
    );
    let init = InitIn {
        major: 7,
        minor: 31,
        flags: (f::POSIX_LOCKS | f::MAX_PAGES) as u32,
        ..Default::default()
    };
    let out: InitOut = h.send(op::INIT, 0, &[&raw(&init)]).obj();
    assert_eq!(u64::from(out.flags), f::POSIX_LOCKS | f::MAX_PAGES);
    assert_eq!(out.flags2, 0);
}

#[test]
fn init_errors() {
    let h = Harness::uninit(|_| {}, MapperKind::Recording);
    // Anything before INIT.
    assert_eq!(h.send(op::LOOKUP, ROOT, &[&cname("x")]).errno(), libc::EIO);
    // Too old.
    let old = InitIn {
        major: 6,
        minor: 99,
        ..Default::default()
    };
    assert_eq!(h.send(op::INIT, 0, &[&raw(&old)]).errno(), libc::EPROTO);
    let old_minor = InitIn {
        major: 7,
        minor: 26,
        ..Default::default()
    };
    assert_eq!(
        h.send(op::INIT, 0, &[&raw(&old_minor)]).errno(),
        libc::EPROTO
    );
    // Shorter than even the compat init_in.
    assert_eq!(
        h.send(op::INIT, 0, &[&[7, 0, 0, 0, 31, 0, 0, 0]]).errno(),
        libc::EINVAL
    );
    assert_eq!(h.send(op::LOOKUP, ROOT, &[&cname("x")]).errno(), libc::EIO);
    // A newer major gets our version back to retry with, and no session yet.
    let newer = InitIn {
        major: 8,
        minor: 0,
        ..Default::default()
    };
    let out: InitOut = h.send(op::INIT, 0, &[&raw(&newer)]).obj();
    assert_eq!((out.major, out.minor), (7, 41));
    assert_eq!(h.send(op::LOOKUP, ROOT, &[&cname("x")]).errno(), libc::EIO);
    h.init();
    h.assert_alive();
}

#[test]
fn destroy_ends_the_session_and_drops_state() {
    let h = Harness::new();
    let ino = h.make_file(ROOT, "f", b"data");
    let o = h.open(ino, libc::O_RDONLY).unwrap();
    assert_eq!(h.fs().handle_count(), 1);
    assert_eq!(h.fs().inode_count(), 2);
    let r = h.send(op::DESTROY, 0, &[]);
    assert_eq!(r.result().unwrap().len(), 0);
    assert_eq!(h.fs().handle_count(), 0);
    assert_eq!(h.fs().inode_count(), 1, "only the root is left");
    // No session until the next INIT.
    assert_eq!(h.send(op::LOOKUP, ROOT, &[&cname("f")]).errno(), libc::EIO);
    h.init();
    assert_eq!(h.read(ino, o.fh, 0, 4).unwrap_err(), libc::EBADF);
    assert_eq!(h.getattr(ino).unwrap_err(), libc::EBADF);
    assert_eq!(std::fs::read(h.host("f")).unwrap(), b"data", "files stay");
    let e = h.lookup(ROOT, "f").unwrap();
    assert_eq!(e.attr.size, 4);
}

#[test]
fn interrupt_gets_no_reply() {
    let h = Harness::new();
    let r = h.send(op::INTERRUPT, 0, &[&raw(&InterruptIn { unique: 7 })]);
    assert!(!r.replied);
    // Malformed INTERRUPT: still no reply.
    let r = h.send(op::INTERRUPT, 0, &[&[1, 2]]);
    assert!(!r.replied);
    h.assert_alive();
}

#[test]
fn ioctl_is_enotty() {
    let h = Harness::new();
    let ino = h.make_file(ROOT, "f", b"");
    assert_eq!(h.send(op::IOCTL, ino, &[&[0u8; 32]]).errno(), libc::ENOTTY);
    h.assert_alive();
}

#[test]
fn unknown_and_unserved_opcodes_are_enosys() {
    let h = Harness::new();
    for opcode in [
        0,
        7,
        19,
        op::BMAP,
        op::POLL,
        op::NOTIFY_REPLY,
        53,
        4096,
        u32::MAX,
    ] {
        let r = h.send(opcode, ROOT, &[&[0u8; 16]]);
        assert_eq!(r.errno(), libc::ENOSYS, "opcode {opcode}");
    }
    h.assert_alive();
}
