//! The passthrough's part of the device-state stream: round trip, hostile streams, and
//! export/import.

use std::io;

use crate::migration::format::{fnv1a64, MAX_STREAM, VERSION};
use crate::passthrough::fhandle::FileHandleBytes;
use crate::passthrough::state::*;
use crate::protocol::filesystem::{Handle, Inode};
use crate::protocol::server::SessionState;

type DeviceState = crate::protocol::state::DeviceState<FsState>;

fn encode(s: &DeviceState) -> io::Result<Vec<u8>> {
    s.encode_stream()
}

fn decode(b: &[u8]) -> io::Result<DeviceState> {
    DeviceState::decode_stream(b)
}

fn sample() -> DeviceState {
    DeviceState {
        session: SessionState {
            initialized: true,
            minor: 41,
            max_io: 1 << 20,
            flags: 0x1234_5678_9abc,
        },
        fs: FsState {
            negotiated: 3,
            next_inode: Inode::from_raw(10),
            next_handle: Handle::from_raw(7),
            inodes: vec![
                InodeState {
                    id: Inode::from_raw(1),
                    refs: 2,
                    generation: 0,
                    kind: libc::S_IFDIR,
                    location: Location::Root,
                    verify: None,
                },
                InodeState {
                    id: Inode::from_raw(4),
                    refs: 3,
                    generation: 0,
                    kind: libc::S_IFREG,
                    location: Location::Path(b"dir/file".to_vec()),
                    verify: Some(FileHandleBytes {
                        handle_type: 1,
                        bytes: vec![1, 2, 3, 4, 5, 6, 7, 8],
                    }),
                },
                InodeState {
                    id: Inode::from_raw(9),
                    refs: 1,
                    generation: 0,
                    kind: libc::S_IFREG,
                    location: Location::Handle(FileHandleBytes {
                        handle_type: 0x81,
                        bytes: vec![9; 12],
                    }),
                    verify: None,
                },
                InodeState {
                    id: Inode::from_raw(5),
                    refs: 1,
                    generation: 0,
                    kind: libc::S_IFDIR,
                    location: Location::Lost,
                    verify: None,
                },
            ],
            handles: vec![
                HandleState {
                    fh: Handle::from_raw(3),
                    inode: Inode::from_raw(4),
                    dir: false,
                    flags: libc::O_RDWR as u32,
                },
                HandleState {
                    fh: Handle::from_raw(6),
                    inode: Inode::from_raw(1),
                    dir: true,
                    flags: 0,
                },
            ],
        },
    }
}

#[test]
fn round_trip() {
    let s = sample();
    s.validate().unwrap();
    let bytes = encode(&s).unwrap();
    assert_eq!(decode(&bytes).unwrap(), s);
}

/// The bytes on the wire are those the encoder before the layers split produced for
/// `sample()` (a daxfsd of either version reads the other's stream).
#[test]
fn sample_encodes_to_the_same_bytes_as_before() {
    let golden: String = [
        "44415846534d494701000000f9000000012900000000001000bc9a785634120000030000000a0000",
        "00000000000700000000000000040000000100000000000000020000000000000000000000000000",
        "00004000000000040000000000000003000000000000000000000000000000008000000108006469",
        "722f66696c6501010000000800010203040506070809000000000000000100000000000000000000",
        "00000000000080000002810000000c00090909090909090909090909000500000000000000010000",
        "00000000000000000000000000004000000300020000000300000000000000040000000000000000",
        "0200000006000000000000000100000000000000010000000003f76996a23e162e",
    ]
    .concat();
    let hex: String = encode(&sample())
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(hex, golden);
}

#[test]
fn every_truncation_is_refused() {
    let bytes = encode(&sample()).unwrap();
    for n in 0..bytes.len() {
        assert!(decode(&bytes[..n]).is_err(), "truncated to {n} bytes");
    }
}

#[test]
fn every_bit_flip_is_refused() {
    let bytes = encode(&sample()).unwrap();
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            assert!(decode(&b).is_err(), "bit {bit} of byte {i}");
        }
    }
}

/// A stream with a valid header and checksum around an arbitrary payload: what a forger
/// (or a bug) could produce.
fn forge(payload: &[u8]) -> Vec<u8> {
    let mut out = b"DAXFSMIG".to_vec();
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&fnv1a64(payload).to_le_bytes());
    out
}

fn payload_with_counts(inodes: u32, extra: &[u8]) -> Vec<u8> {
    let mut p = vec![1u8];
    p.extend_from_slice(&31u32.to_le_bytes());
    p.extend_from_slice(&4096u32.to_le_bytes());
    p.extend_from_slice(&0u64.to_le_bytes());
    p.extend_from_slice(&0u32.to_le_bytes());
    p.extend_from_slice(&2u64.to_le_bytes());
    p.extend_from_slice(&1u64.to_le_bytes());
    p.extend_from_slice(&inodes.to_le_bytes());
    p.extend_from_slice(extra);
    p
}

#[test]
fn oversized_counts_and_lengths_are_refused_before_allocating() {
    // Four billion inodes announced in a few bytes: refused by the cap, nothing allocated.
    let e = decode(&forge(&payload_with_counts(u32::MAX, &[]))).unwrap_err();
    assert!(e.to_string().contains("inodes"), "{e}");
    // Under the cap but more than the stream holds.
    let e = decode(&forge(&payload_with_counts(1000, &[]))).unwrap_err();
    assert!(e.to_string().contains("do not fit"), "{e}");
    // A path longer than PATH_MAX.
    let mut rec = Vec::new();
    rec.extend_from_slice(&2u64.to_le_bytes());
    rec.extend_from_slice(&1u64.to_le_bytes());
    rec.extend_from_slice(&0u64.to_le_bytes());
    rec.extend_from_slice(&libc::S_IFREG.to_le_bytes());
    rec.push(1);
    rec.extend_from_slice(&u16::MAX.to_le_bytes());
    rec.extend_from_slice(&[b'a'; 64]);
    let e = decode(&forge(&payload_with_counts(1, &rec))).unwrap_err();
    assert!(e.to_string().contains("path of 65535"), "{e}");
    // A stream larger than the limit.
    assert!(decode(&vec![0u8; MAX_STREAM + 1]).is_err());
    // Wrong version, wrong magic.
    let mut b = encode(&sample()).unwrap();
    b[8] = 2;
    assert!(decode(&b).unwrap_err().to_string().contains("version 2"));
    b[0] = b'X';
    assert!(decode(&b).unwrap_err().to_string().contains("magic"));
}

#[test]
fn garbage_never_panics() {
    // A cheap deterministic generator: random payloads behind a valid header and checksum.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for len in 0..600usize {
        let mut p = Vec::with_capacity(len);
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            p.push(x as u8);
        }
        if let Ok(s) = decode(&forge(&p)) {
            let _ = s.validate();
        }
        let _ = decode(&p);
    }
}

#[test]
fn inconsistent_states_are_refused() {
    type Break = Box<dyn Fn(&mut DeviceState)>;
    let cases: Vec<(&str, Break)> = vec![
        (
            "no root",
            Box::new(|s| {
                s.fs.inodes
                    .remove(0)
                    .id
                    .eq(&Inode::ROOT)
                    .then_some(())
                    .unwrap()
            }),
        ),
        (
            "repeated id",
            Box::new(|s| s.fs.inodes[2].id = Inode::from_raw(4)),
        ),
        (
            "id past next",
            Box::new(|s| s.fs.next_inode = Inode::from_raw(5)),
        ),
        ("zero refs", Box::new(|s| s.fs.inodes[1].refs = 0)),
        (
            "root elsewhere",
            Box::new(|s| s.fs.inodes[1].location = Location::Root),
        ),
        (
            "dotdot",
            Box::new(|s| s.fs.inodes[1].location = Location::Path(b"../etc/passwd".to_vec())),
        ),
        (
            "absolute",
            Box::new(|s| s.fs.inodes[1].location = Location::Path(b"/etc/passwd".to_vec())),
        ),
        (
            "empty component",
            Box::new(|s| s.fs.inodes[1].location = Location::Path(b"a//b".to_vec())),
        ),
        (
            "handle on unknown inode",
            Box::new(|s| s.fs.handles[0].inode = Inode::from_raw(77)),
        ),
        (
            "repeated handle",
            Box::new(|s| s.fs.handles[1].fh = Handle::from_raw(3)),
        ),
        (
            "handle past next",
            Box::new(|s| s.fs.next_handle = Handle::from_raw(4)),
        ),
        ("bad kind", Box::new(|s| s.fs.inodes[1].kind = 0o777)),
    ];
    for (what, f) in cases {
        let mut s = sample();
        f(&mut s);
        // Structurally fine, so it encodes and decodes; validation refuses it.
        let d = decode(&encode(&s).unwrap()).unwrap();
        assert!(d.validate().is_err(), "{what} accepted");
    }
}

mod passthrough {
    use super::*;
    use crate::passthrough::{Config, PassthroughFs};
    use crate::protocol::filesystem::{Context, FileSystem, InitCaps};
    use std::ffi::CString;

    fn fs(dir: &std::path::Path) -> PassthroughFs {
        let fs = PassthroughFs::new(Config {
            root_dir: dir.to_path_buf(),
            ..Default::default()
        })
        .unwrap();
        fs.init(InitCaps { flags: u64::MAX }).unwrap();
        fs
    }

    fn c(s: &str) -> CString {
        CString::new(s).unwrap()
    }

    /// Source with: dir "d", file "d/f" open read-write, the dir open; returns ids.
    fn populated(dir: &std::path::Path) -> (PassthroughFs, Inode, Inode, Handle, Handle) {
        std::fs::create_dir(dir.join("d")).unwrap();
        std::fs::write(dir.join("d/f"), b"hello").unwrap();
        let src = fs(dir);
        let ctx = Context::default();
        let d = src.lookup(&ctx, Inode::ROOT, &c("d")).unwrap().inode;
        let f = src.lookup(&ctx, d, &c("f")).unwrap().inode;
        src.lookup(&ctx, d, &c("f")).unwrap();
        let (fh, _) = src.open(&ctx, f, libc::O_RDWR as u32, 0).unwrap();
        let (dh, _) = src.opendir(&ctx, d, 0).unwrap();
        (src, d, f, fh, dh)
    }

    fn round(src: &PassthroughFs, opts: &MigrationOptions) -> FsState {
        let st = DeviceState {
            session: SessionState::default(),
            fs: src.export_state(opts).unwrap(),
        };
        st.validate().unwrap();
        decode(&encode(&st).unwrap()).unwrap().fs
    }

    fn check_same(dst: &PassthroughFs, d: Inode, f: Inode, fh: Handle, dh: Handle) {
        let ctx = Context::default();
        assert_eq!(dst.lookup_count(f), 2);
        assert_eq!(dst.lookup_count(d), 1);
        assert_eq!(dst.handle_count(), 2);
        let (attr, _) = dst.getattr(&ctx, f, Some(fh)).unwrap();
        assert_eq!(attr.size, 5);
        // The handle is still open read-write: a truncate through it works.
        let ctx2 = Context::default();
        assert!(
            dst.releasedir(&ctx2, d, dh).is_ok(),
            "directory handle restored"
        );
        // New inodes get fresh ids past the migrated ones.
        std::fs::write(dst.config().root_dir.join("d/g"), b"x").unwrap();
        let g = dst.lookup(&ctx, d, &c("g")).unwrap().inode;
        assert!(g > f && g > d, "new id {g}");
    }

    #[test]
    fn posix_acl_agreement_survives_migration() {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        // Default ACL on d: user rwx, group rwx, other none (tag, perm, id).
        let mut acl = 2u32.to_le_bytes().to_vec();
        for (tag, perm) in [(1u16, 7u16), (4, 7), (0x20, 0)] {
            acl.extend_from_slice(&tag.to_le_bytes());
            acl.extend_from_slice(&perm.to_le_bytes());
            acl.extend_from_slice(&u32::MAX.to_le_bytes());
        }
        let path = CString::new(tmp.path().join("d").as_os_str().as_bytes()).unwrap();
        crate::sys::setxattr(&path, &c("system.posix_acl_default"), &acl, 0).unwrap();
        let src = PassthroughFs::new(Config {
            root_dir: tmp.path().to_path_buf(),
            posix_acl: true,
            ..Default::default()
        })
        .unwrap();
        src.init(InitCaps { flags: u64::MAX }).unwrap();
        let opts = MigrationOptions::default();
        let st = round(&src, &opts);
        // The destination (configured alike) has not agreed anything in an INIT of its own;
        // the guest, though, goes on sending unmasked modes (DONT_MASK), so the agreement must
        // come with the state.
        let dst = PassthroughFs::new(Config {
            root_dir: tmp.path().to_path_buf(),
            posix_acl: true,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(dst.import_state(&st, &opts).unwrap(), (0, 0));
        let ctx = Context::default();
        let d = dst.lookup(&ctx, Inode::ROOT, &c("d")).unwrap().inode;
        dst.mkdir(&ctx, d, &c("x"), 0o777, 0o077).unwrap();
        let mode = std::fs::metadata(tmp.path().join("d/x")).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o770, "the default ACL, not the umask, decides");
    }

    #[test]
    fn find_paths_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let (src, d, f, fh, dh) = populated(tmp.path());
        let opts = MigrationOptions {
            verify_handles: true,
            confirm_paths: true,
            ..Default::default()
        };
        let st = round(&src, &opts);
        assert!(st.inodes.iter().any(|i| i.id == f
            && i.location == Location::Path(b"d/f".to_vec())
            && i.verify.is_some()));
        let dst = fs(tmp.path());
        assert_eq!(dst.import_state(&st, &opts).unwrap(), (0, 0));
        check_same(&dst, d, f, fh, dh);
    }

    #[test]
    fn file_handles_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let (src, d, f, fh, dh) = populated(tmp.path());
        let opts = MigrationOptions {
            mode: MigrationMode::FileHandles,
            ..Default::default()
        };
        let st = round(&src, &opts);
        assert!(st
            .inodes
            .iter()
            .all(|i| i.id == Inode::ROOT || matches!(i.location, Location::Handle(_))));
        let dst = fs(tmp.path());
        assert_eq!(dst.import_state(&st, &opts).unwrap(), (0, 0));
        check_same(&dst, d, f, fh, dh);
    }

    #[test]
    fn unlinked_file_aborts_or_becomes_a_guest_error() {
        let tmp = tempfile::tempdir().unwrap();
        let (src, d, f, fh, _) = populated(tmp.path());
        std::fs::remove_file(tmp.path().join("d/f")).unwrap();
        let opts = MigrationOptions::default();
        let st = round(&src, &opts);
        assert!(st
            .inodes
            .iter()
            .any(|i| i.id == f && i.location == Location::Lost));
        let dst = fs(tmp.path());
        let before = dst.inode_count();
        let e = dst.import_state(&st, &opts).unwrap_err();
        assert!(e.to_string().contains(&format!("inode {f}")), "{e}");
        assert_eq!(dst.inode_count(), before, "abort leaves the tables alone");
        let ge = MigrationOptions {
            on_error: OnError::GuestError,
            ..Default::default()
        };
        assert_eq!(dst.import_state(&st, &ge).unwrap(), (1, 1));
        let ctx = Context::default();
        assert!(dst.getattr(&ctx, f, Some(fh)).is_err());
        assert!(dst.getattr(&ctx, d, None).is_ok());
        // In file-handles mode an unlinked open file still migrates.
        let fhm = MigrationOptions {
            mode: MigrationMode::FileHandles,
            ..Default::default()
        };
        let st = round(&src, &fhm);
        let dst = fs(tmp.path());
        assert_eq!(dst.import_state(&st, &fhm).unwrap(), (0, 0));
        assert_eq!(dst.getattr(&ctx, f, Some(fh)).unwrap().0.size, 5);
    }

    #[test]
    fn unlinked_name_with_another_hard_link_is_found_by_search() {
        let tmp = tempfile::tempdir().unwrap();
        let (src, _, f, fh, _) = populated(tmp.path());
        std::fs::create_dir_all(tmp.path().join("x/y")).unwrap();
        std::fs::hard_link(tmp.path().join("d/f"), tmp.path().join("x/y/other")).unwrap();
        std::fs::remove_file(tmp.path().join("d/f")).unwrap();
        let opts = MigrationOptions {
            verify_handles: true,
            ..Default::default()
        };
        let st = round(&src, &opts);
        let i = st.inodes.iter().find(|i| i.id == f).unwrap();
        assert_eq!(i.location, Location::Path(b"x/y/other".to_vec()));
        assert!(i.verify.is_some());
        let dst = fs(tmp.path());
        assert_eq!(dst.import_state(&st, &opts).unwrap(), (0, 0));
        let ctx = Context::default();
        assert_eq!(dst.getattr(&ctx, f, Some(fh)).unwrap().0.size, 5);
    }

    /// The file handle of host path `p` (test helper; needs no capability).
    fn handle_of(p: &std::path::Path) -> FileHandleBytes {
        let f = std::fs::File::open(p).unwrap();
        crate::passthrough::file_handle_of(std::os::fd::AsFd::as_fd(&f)).unwrap()
    }

    fn one_inode(kind: u32, location: Location) -> FsState {
        FsState {
            negotiated: 0,
            next_inode: Inode::from_raw(3),
            next_handle: Handle::from_raw(1),
            inodes: vec![
                InodeState {
                    id: Inode::from_raw(1),
                    refs: 1,
                    generation: 0,
                    kind: libc::S_IFDIR,
                    location: Location::Root,
                    verify: None,
                },
                InodeState {
                    id: Inode::from_raw(2),
                    refs: 1,
                    generation: 0,
                    kind,
                    location,
                    verify: None,
                },
            ],
            handles: vec![],
        }
    }

    /// A hostile source names host files outside the shared directory by file handle: a
    /// directory next to the share, the file system's root (ext4: type 1, inode 2), a file
    /// outside. Each is refused in file-handles mode, and any handle entry in find-paths mode.
    /// Opening handles needs CAP_DAC_READ_SEARCH: the test runs as root.
    #[test]
    fn handles_outside_the_share_are_refused() {
        assert_eq!(
            // SAFETY: geteuid has no preconditions and cannot fail.
            unsafe { libc::geteuid() },
            0,
            "this test needs root (CAP_DAC_READ_SEARCH to open file handles)"
        );
        let tmp = tempfile::tempdir().unwrap();
        let share = tmp.path().join("share");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(share.join("in")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"secret").unwrap();
        std::fs::write(share.join("in/f"), b"f").unwrap();
        let dst = fs(&share);
        let fhm = MigrationOptions {
            mode: MigrationMode::FileHandles,
            ..Default::default()
        };
        for (what, kind, p) in [
            ("directory outside", libc::S_IFDIR, outside.clone()),
            ("directory above", libc::S_IFDIR, tmp.path().to_path_buf()),
            ("file system root", libc::S_IFDIR, "/".into()),
            ("file outside", libc::S_IFREG, outside.join("secret")),
        ] {
            let st = one_inode(kind, Location::Handle(handle_of(&p)));
            let r = dst.import_state(&st, &fhm);
            eprintln!("{what}: {r:?}");
            let e = r.expect_err(what);
            assert!(
                e.to_string().contains("outside the shared directory"),
                "{what}: {e}"
            );
            assert_eq!(dst.inode_count(), 1, "{what}: tables untouched");
            let ge = MigrationOptions {
                on_error: OnError::GuestError,
                ..fhm
            };
            assert_eq!(dst.import_state(&st, &ge).unwrap(), (1, 0), "{what}");
            assert_eq!(dst.inode_count(), 1, "{what}: left out");
        }
        // A file outside, unlinked while still open on this host: refused as well.
        let gone = outside.join("gone");
        std::fs::write(&gone, b"gone").unwrap();
        let keep = std::fs::File::open(&gone).unwrap();
        let h = handle_of(&gone);
        std::fs::remove_file(&gone).unwrap();
        let e = dst
            .import_state(&one_inode(libc::S_IFREG, Location::Handle(h)), &fhm)
            .unwrap_err();
        assert!(
            e.to_string().contains("outside the shared directory"),
            "{e}"
        );
        drop(keep);
        // Inside the share: accepted in file-handles mode ...
        for (kind, p) in [
            (libc::S_IFDIR, share.join("in")),
            (libc::S_IFREG, share.join("in/f")),
        ] {
            let st = one_inode(kind, Location::Handle(handle_of(&p)));
            assert_eq!(dst.import_state(&st, &fhm).unwrap(), (0, 0), "{p:?}");
            assert_eq!(dst.inode_count(), 2);
            // ... and refused in find-paths mode, where no handle is expected.
            let e = dst
                .import_state(&st, &MigrationOptions::default())
                .unwrap_err();
            assert!(e.to_string().contains("find-paths"), "{e}");
        }
    }

    /// The migrated negotiated bits are ones this daemon's configuration offers: every bit
    /// set is refused, and a stream agreeing writeback with a daemon without it too.
    #[test]
    fn negotiated_bits_not_configured_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = fs(tmp.path());
        // Bit 0 is writeback (see passthrough/migration.rs).
        for negotiated in [u32::MAX, 1, 1 << 31] {
            let mut st = one_inode(libc::S_IFDIR, Location::Lost);
            st.inodes.pop();
            st.negotiated = negotiated;
            let e = dst
                .import_state(&st, &MigrationOptions::default())
                .expect_err("refused");
            assert!(e.to_string().contains("not configured"), "{e}");
        }
    }

    #[test]
    fn replaced_file_is_caught_by_verify_handles() {
        let tmp = tempfile::tempdir().unwrap();
        let (src, _, f, _, _) = populated(tmp.path());
        let opts = MigrationOptions {
            verify_handles: true,
            ..Default::default()
        };
        let st = round(&src, &opts);
        // Someone replaces the file between save and load.
        std::fs::rename(tmp.path().join("d/f"), tmp.path().join("old")).unwrap();
        std::fs::write(tmp.path().join("d/f"), b"other").unwrap();
        let dst = fs(tmp.path());
        let e = dst.import_state(&st, &opts).unwrap_err();
        assert!(e.to_string().contains(&format!("inode {f}")), "{e}");
        assert!(e.to_string().contains("file handle"), "{e}");
    }
}
