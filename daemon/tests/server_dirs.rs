//! Directory opcodes: OPENDIR, READDIR, READDIRPLUS, RELEASEDIR, FSYNCDIR.

mod common;

use std::collections::BTreeMap;

use common::*;
use daxfsd::abi::{opcode as op, *};
use daxfsd::filesystem::Inode;

fn populate(h: &Harness) {
    std::fs::write(h.host("a"), b"1").unwrap();
    std::fs::write(h.host("bb"), b"22").unwrap();
    std::fs::create_dir(h.host("dir")).unwrap();
    std::os::unix::fs::symlink("a", h.host("link")).unwrap();
}

#[test]
fn readdir_lists_the_host_directory() {
    let h = Harness::new();
    populate(&h);
    let items = h.list_dir(ROOT, 4096, false);
    let by_name: BTreeMap<_, _> = items.iter().map(|i| (i.name().to_string(), i)).collect();
    assert_eq!(
        by_name.keys().map(String::as_str).collect::<Vec<_>>(),
        [".", "..", "a", "bb", "dir", "link"]
    );
    assert_eq!(items.len(), 6, "no duplicates");
    assert_eq!(by_name["a"].typ, u32::from(libc::DT_REG));
    assert_eq!(by_name["dir"].typ, u32::from(libc::DT_DIR));
    assert_eq!(by_name["link"].typ, u32::from(libc::DT_LNK));
    assert_eq!(by_name["bb"].ino, host_ino(&h.host("bb")));
    assert!(items.iter().all(|i| i.entry.is_none()));
    assert_eq!(h.fs().inode_count(), 1, "plain READDIR looks nothing up");

    // One entry per request, continuing from each entry's offset: the same listing.
    let small = h.list_dir(ROOT, 32, false);
    let names = |v: &[DirItem]| {
        let mut n: Vec<_> = v.iter().map(|i| i.name().to_string()).collect();
        n.sort();
        n
    };
    assert!(small.len() == 6, "one at a time: {small:?}");
    assert_eq!(names(&small), names(&items));
}

#[test]
fn readdirplus_looks_entries_up() {
    let h = Harness::new();
    populate(&h);
    let items = h.list_dir(ROOT, 4096, true);
    assert_eq!(items.len(), 6);
    for i in &items {
        match i.name() {
            "." | ".." => assert!(i.entry.is_none()),
            name => {
                let e = i.entry.as_ref().expect("entry for a real name");
                assert_eq!(e.attr.ino, host_ino(&h.host(name)));
                assert_eq!(h.fs().lookup_count(Inode::from_raw(e.nodeid)), 1, "{name}");
                assert_eq!(h.lookup(ROOT, name).unwrap().nodeid, e.nodeid);
            }
        }
    }
    let bb = items.iter().find(|i| i.name() == "bb").unwrap();
    assert_eq!(bb.entry.unwrap().attr.size, 2);
}

#[test]
fn readdirplus_forgets_entries_that_did_not_fit() {
    let h = Harness::new();
    for i in 0..20 {
        std::fs::write(h.host(&format!("file{i:02}")), b"").unwrap();
    }
    // Room for exactly one direntplus (152 + name padded): every reply leaves the next,
    // already looked-up entry out, and that reference must be dropped again.
    let items = h.list_dir(ROOT, 160, true);
    assert_eq!(items.len(), 22);
    for i in items.iter().filter(|i| i.entry.is_some()) {
        let e = i.entry.unwrap();
        assert_eq!(
            h.fs().lookup_count(Inode::from_raw(e.nodeid)),
            1,
            "{}",
            i.name()
        );
    }
    assert_eq!(h.fs().inode_count(), 21, "root + 20 files, nothing leaked");
    // Too small for even one entry: an empty reply, no reference taken.
    let fh = h.opendir(ROOT).unwrap().fh;
    assert!(h.readdir(ROOT, fh, 0, 100, true).unwrap().is_empty());
    assert_eq!(h.fs().inode_count(), 21);
}

#[test]
fn opendir_readdir_errors() {
    let h = Harness::new();
    populate(&h);
    let a = h.lookup(ROOT, "a").unwrap().nodeid;
    let link = h.lookup(ROOT, "link").unwrap().nodeid;
    assert_eq!(h.opendir(a).unwrap_err(), libc::ENOTDIR);
    assert_eq!(h.opendir(link).unwrap_err(), libc::ELOOP);
    assert_eq!(h.opendir(999).unwrap_err(), libc::EBADF);
    assert_eq!(
        h.readdir(ROOT, 999, 0, 4096, false).unwrap_err(),
        libc::EBADF
    );
    // A file handle is not a directory handle, and handles are tied to their inode.
    let fo = h.open(a, libc::O_RDONLY).unwrap();
    assert_eq!(
        h.readdir(a, fo.fh, 0, 4096, false).unwrap_err(),
        libc::EBADF
    );
    let d = h.lookup(ROOT, "dir").unwrap().nodeid;
    let dh = h.opendir(d).unwrap().fh;
    assert_eq!(
        h.readdir(ROOT, dh, 0, 4096, false).unwrap_err(),
        libc::EBADF
    );
    assert_eq!(
        h.release(d, dh).unwrap_err(),
        libc::EBADF,
        "RELEASE of a dir handle"
    );
    assert_eq!(
        h.releasedir(a, fo.fh).unwrap_err(),
        libc::EBADF,
        "RELEASEDIR of a file"
    );
    // Too large a size for the negotiated maximum.
    assert_eq!(
        h.readdir(d, dh, 0, MAX_IO + 1, false).unwrap_err(),
        libc::EINVAL
    );
}

#[test]
fn releasedir_and_fsyncdir() {
    let h = Harness::new();
    let d = h.opendir(ROOT).unwrap().fh;
    for flags in [0, FSYNC_FDATASYNC] {
        let a = FsyncIn {
            fh: d,
            fsync_flags: flags,
            padding: 0,
        };
        h.send(op::FSYNCDIR, ROOT, &[&raw(&a)]).result().unwrap();
    }
    let bad = FsyncIn {
        fh: 999,
        ..Default::default()
    };
    assert_eq!(
        h.send(op::FSYNCDIR, ROOT, &[&raw(&bad)]).errno(),
        libc::EBADF
    );
    assert_eq!(h.fs().handle_count(), 1);
    h.releasedir(ROOT, d).unwrap();
    assert_eq!(h.fs().handle_count(), 0);
    assert_eq!(h.releasedir(ROOT, d).unwrap_err(), libc::EBADF);
    assert_eq!(h.readdir(ROOT, d, 0, 4096, false).unwrap_err(), libc::EBADF);
}
