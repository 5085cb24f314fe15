//! Escape attempts: a guest trying to reach the host outside the shared directory through
//! symlinks, `..`, bad names, forged inode numbers and handles, special files, and lookups
//! racing host-side renames.
//!
//! Layout: a temporary directory holding `share/` (what the daemon serves) and `outside/` (a
//! sentinel tree next to it). Every test snapshots `outside/` (names, sizes, modes, owners,
//! link counts, mtimes, ctimes, content hashes, xattrs) and a few `/etc` files before and
//! after, checks that nothing new appeared next to the share, in `/`, `/etc`, `/tmp` or the
//! daemon's working directory (every name a test creates carries a unique probe prefix), and
//! that no reply carries the sentinel's secret bytes, its xattr value or a name that exists
//! only outside. Daemon: `VUFS_DAEMON` (default virtiofsd); see [`start`] for the sandbox
//! each runs in. A few expectations are stricter for daxfsd (marked where they are).

mod common;
#[path = "common/host.rs"]
mod host;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use daxfsd::abi::{self, fattr, opcode as op, CopyFileRangeIn, CreateIn, ReadIn, SetattrIn};
use host::{Cases, FileState};
use vm_memory::ByteValued;
use vufs_driver::{DaemonKind, DriverConfig, Session, Xattr};

const ROOT: u64 = abi::ROOT_ID;
const S_IFLNK: u32 = libc::S_IFLNK;

/// The share, the sentinel next to it, and what the host looked like before the test.
struct World {
    tmp: tempfile::TempDir,
    share: PathBuf,
    outside: PathBuf,
    /// Content of `outside/secret`; must never show up in a reply.
    marker: Vec<u8>,
    /// Value of the `user.sentinel` xattr of `outside/secret`.
    xattr_value: Vec<u8>,
    /// A name that exists only in `outside/`.
    outside_name: String,
    /// Prefix of every name a test creates.
    probe: String,
    before: BTreeMap<PathBuf, FileState>,
    watched: Vec<(PathBuf, Option<FileState>)>,
    cwd: PathBuf,
}

/// Symlinks planted in the share by the host: name -> target.
fn planted(outside: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("l_root", "/".to_string()),
        ("l_etc", "/etc".to_string()),
        ("l_passwd", "/etc/passwd".to_string()),
        ("l_up", "../..".to_string()),
        ("l_proc_root", "/proc/self/root".to_string()),
        ("l_proc_cwd", "/proc/self/cwd".to_string()),
        ("l_out", "../outside".to_string()),
        ("l_secret", "../outside/secret".to_string()),
        (
            "l_abs_secret",
            outside.join("secret").to_string_lossy().into_owned(),
        ),
        ("l_abs_outdir", outside.to_string_lossy().into_owned()),
    ]
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated path and name; the value buffer is valid for its length.
    let r = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setxattr: {}", io::Error::last_os_error());
}

fn world(test: &str) -> World {
    let tmp = tempfile::Builder::new()
        .prefix("vufs-escape-")
        .tempdir()
        .unwrap();
    let share = tmp.path().join("share");
    let outside = tmp.path().join("outside");
    fs::create_dir(&share).unwrap();
    fs::create_dir(&outside).unwrap();
    let nonce = format!("{}{:x}", std::process::id(), tmp.path().as_os_str().len());
    let marker = format!("SECRET-{nonce}-{test}-do-not-leak").into_bytes();
    let xattr_value = format!("XATTR-{nonce}-sentinel").into_bytes();
    let outside_name = format!("only-outside-{nonce}");
    fs::write(outside.join("secret"), &marker).unwrap();
    fs::set_permissions(
        outside.join("secret"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    set_xattr(&outside.join("secret"), "user.sentinel", &xattr_value);
    fs::create_dir_all(outside.join("sub").join(&outside_name)).unwrap();
    fs::write(outside.join("sub").join("deep"), &marker).unwrap();
    fs::write(outside.join(&outside_name), &marker).unwrap();
    symlink("secret", outside.join("link-in-outside")).unwrap();

    fs::write(share.join("file"), b"inside data").unwrap();
    fs::create_dir_all(share.join("dir").join("sub")).unwrap();
    fs::write(share.join("dir").join("f2"), b"second file").unwrap();
    for (name, target) in planted(&outside) {
        symlink(&target, share.join(name)).unwrap();
    }
    let watched = ["/etc/passwd", "/etc/hostname", "/etc/hosts", "/etc/shadow"]
        .iter()
        .map(|p| (PathBuf::from(p), host::file_state(Path::new(p))))
        .collect();
    World {
        before: host::snapshot(&outside),
        probe: format!("vufsprobe{nonce}"),
        share,
        outside,
        marker,
        xattr_value,
        outside_name,
        watched,
        cwd: std::env::current_dir().unwrap(),
        tmp,
    }
}

impl World {
    /// A fresh name for something the guest creates.
    fn name(&self, what: &str) -> String {
        format!("{}-{what}", self.probe)
    }

    /// Nothing outside the share was written, created, removed or had metadata changed.
    fn check_host(&self, when: &str) {
        let after = host::snapshot(&self.outside);
        let d = host::diff(&self.before, &after);
        assert!(d.is_empty(), "{when}: outside/ changed:\n{}", d.join("\n"));
        let top: BTreeSet<String> = fs::read_dir(self.tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            top,
            BTreeSet::from(["outside".to_string(), "share".to_string()]),
            "{when}: something appeared next to the share"
        );
        for (p, st) in &self.watched {
            assert_eq!(&host::file_state(p), st, "{when}: {} changed", p.display());
        }
        for dir in [
            Path::new("/"),
            Path::new("/etc"),
            Path::new("/tmp"),
            self.tmp.path(),
            &self.outside,
            &self.outside.join("sub"),
            &self.cwd,
        ] {
            let found = host::names_containing(dir, &self.probe);
            assert!(found.is_empty(), "{when}: probe names outside: {found:?}");
        }
    }

    /// A reply must not carry anything that exists only outside the share.
    fn no_leak(&self, what: &str, bytes: &[u8]) {
        for needle in [
            &self.marker[..],
            &self.xattr_value[..],
            self.outside_name.as_bytes(),
        ] {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle),
                "{what}: reply carries data from outside the share: {:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
}

/// The daemon under test, contained the way it contains itself: daxfsd with no sandbox at
/// all (every containment check here is its own code), virtiofsd in its default namespace
/// sandbox (without it, virtiofsd 1.14 follows a RENAME or LINK name such as
/// `../outside/x` out of the share).
fn start(w: &World) -> (vufs_driver::Daemon, Session) {
    let kind = common::kind();
    let sandbox = if kind == DaemonKind::Virtiofsd {
        "namespace"
    } else {
        "none"
    };
    let d = host::spawn_in(&kind, &w.share, sandbox, &["--xattr"]);
    let s = host::connect(&d, &DriverConfig::default()).with_timeout(Duration::from_secs(5));
    (d, s)
}

/// [`refused`] when `strict`; otherwise anything goes as long as the host checks pass.
fn bad_name<T: std::fmt::Debug>(strict: bool, cases: &mut Cases, what: String, r: io::Result<T>) {
    if strict {
        refused(cases, what, r);
    } else {
        cases.case(what);
    }
}

/// The operation failed with an errno (any errno: what matters is the refusal; the host
/// checks show it had no effect).
fn refused<T: std::fmt::Debug>(cases: &mut Cases, what: String, r: io::Result<T>) -> i32 {
    let e = host::errno_of(&what, r);
    cases.case(what);
    e
}

fn setattr(valid: u32) -> SetattrIn {
    SetattrIn {
        valid,
        mode: 0o777,
        size: 0,
        atime: 1,
        mtime: 1,
        uid: 0,
        gid: 0,
        ..Default::default()
    }
}

fn tmpfile(s: &Session, parent: u64) -> io::Result<Vec<u8>> {
    let a = CreateIn {
        flags: libc::O_RDWR as u32,
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        open_flags: 0,
    };
    s.call(op::TMPFILE, parent, &[a.as_slice(), b"tmpfile\0"], 144)
}

/// Every namespace operation with `parent` as the directory must fail.
fn refuse_as_parent(cases: &mut Cases, w: &World, s: &Session, parent: u64, label: &str) {
    let file = s.lookup(ROOT, "file").unwrap().nodeid;
    let p = |op: &str| format!("{op} with {label} as parent");
    for child in ["secret", "passwd", "etc", "sub", &w.outside_name] {
        refused(
            cases,
            p(&format!("LOOKUP {child}")),
            s.lookup(parent, child),
        );
    }
    let flags = (libc::O_CREAT | libc::O_RDWR) as u32;
    refused(
        cases,
        p("CREATE"),
        s.create(parent, w.name("c"), flags, libc::S_IFREG | 0o644, 0),
    );
    refused(cases, p("MKDIR"), s.mkdir(parent, w.name("d"), 0o755, 0));
    refused(
        cases,
        p("MKNOD fifo"),
        s.mknod(parent, w.name("n"), libc::S_IFIFO | 0o644, 0, 0),
    );
    refused(
        cases,
        p("SYMLINK"),
        s.symlink(parent, w.name("s"), "/etc/passwd"),
    );
    refused(cases, p("LINK"), s.link(file, parent, w.name("l")));
    refused(
        cases,
        p("RENAME into"),
        s.rename(ROOT, "file", parent, w.name("r")),
    );
    refused(
        cases,
        p("RENAME out of"),
        s.rename(parent, "secret", ROOT, w.name("r")),
    );
    refused(cases, p("UNLINK"), s.unlink(parent, "secret"));
    refused(cases, p("RMDIR"), s.rmdir(parent, "sub"));
    refused(cases, p("TMPFILE"), tmpfile(s, parent));
    refused(
        cases,
        p("OPENDIR"),
        s.opendir(parent, libc::O_RDONLY as u32),
    );
    assert!(s.getattr(file, None).is_ok());
    s.forget(file, 1).unwrap();
}

/// Host symlinks in the share to `/`, `/etc`, `../..`, `/proc/self/root`, `../outside`, ...:
/// LOOKUP returns the link itself, and nothing goes through it.
#[test]
fn planted_symlinks_are_never_followed() {
    let mut cases = Cases::new("escape", "planted_symlinks_are_never_followed");
    let w = world("planted");
    let (mut d, s) = start(&w);
    let kind = common::kind();
    for (name, target) in planted(&w.outside) {
        let host_ino = fs::symlink_metadata(w.share.join(name)).unwrap().ino();
        let e = s.lookup(ROOT, name).unwrap();
        assert_eq!(e.attr.mode & libc::S_IFMT, S_IFLNK, "{name}: {:?}", e.attr);
        assert_eq!(e.attr.ino, host_ino, "{name}: LOOKUP gave another inode");
        cases.case(format!("LOOKUP {name} gives the link itself"));
        let a = s.getattr(e.nodeid, None).unwrap();
        assert_eq!((a.attr.ino, a.attr.size), (host_ino, target.len() as u64));
        cases.case(format!("GETATTR {name} is the link's"));
        let t = s.readlink(e.nodeid).unwrap();
        assert_eq!(t, target.as_bytes(), "{name}");
        w.no_leak("READLINK", &t);
        cases.case(format!("READLINK {name}"));

        for child in [".", ".."] {
            refused(
                &mut cases,
                format!("LOOKUP {child} under {name}"),
                s.lookup(e.nodeid, child),
            );
        }
        for flags in [
            libc::O_RDONLY,
            libc::O_RDWR,
            libc::O_WRONLY | libc::O_TRUNC,
            libc::O_RDONLY | libc::O_NOFOLLOW,
        ] {
            refused(
                &mut cases,
                format!("OPEN {name} flags {flags:#o}"),
                s.open(e.nodeid, flags as u32),
            );
        }
        refused(
            &mut cases,
            format!("SETATTR size of {name}"),
            s.setattr(e.nodeid, &setattr(fattr::SIZE)),
        );
        // These may act on the link itself (never on its target): the host checks decide.
        let _ = s.setattr(e.nodeid, &setattr(fattr::MODE));
        cases.case(format!("SETATTR mode of {name}"));
        let _ = s.setattr(e.nodeid, &setattr(fattr::ATIME | fattr::MTIME));
        cases.case(format!("SETATTR times of {name}"));
        let _ = s.setattr(e.nodeid, &setattr(fattr::UID | fattr::GID));
        cases.case(format!("SETATTR owner of {name}"));
        let _ = s.setxattr(e.nodeid, format!("user.{}", w.probe), b"x", 0);
        cases.case(format!("SETXATTR on {name}"));
        let _ = s.removexattr(e.nodeid, "user.sentinel");
        cases.case(format!("REMOVEXATTR through {name}"));
        match s.getxattr(e.nodeid, "user.sentinel", 4096) {
            Ok(Xattr::Data(v)) => w.no_leak(&format!("GETXATTR through {name}"), &v),
            Ok(other) => panic!("GETXATTR through {name}: {other:?}"),
            Err(_) => {}
        }
        cases.case(format!("GETXATTR through {name}"));
        if let Ok(Xattr::Data(v)) = s.listxattr(e.nodeid, 4096) {
            assert!(
                !String::from_utf8_lossy(&v).contains("sentinel"),
                "LISTXATTR through {name}: {v:?}"
            );
        }
        cases.case(format!("LISTXATTR through {name}"));

        refuse_as_parent(&mut cases, &w, &s, e.nodeid, name);

        // A hard link of the link is a link of the symlink, never of its target.
        let hl = w.name(&format!("hl-{name}"));
        match s.link(e.nodeid, ROOT, &hl) {
            Ok(le) => {
                let m = fs::symlink_metadata(w.share.join(&hl)).unwrap();
                assert!(m.file_type().is_symlink(), "LINK of {name} made {m:?}");
                assert_eq!(m.ino(), host_ino);
                assert_eq!(le.attr.ino, host_ino);
                s.unlink(ROOT, &hl).unwrap();
                s.forget(le.nodeid, 1).unwrap();
            }
            Err(err) => assert!(err.raw_os_error().is_some(), "{err}"),
        }
        cases.case(format!("LINK of {name} links the link"));
        // Opening the link's name for writing must not open its target.
        let flags = (libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC) as u32;
        refused(
            &mut cases,
            format!("CREATE over {name}"),
            s.create(ROOT, name, flags, libc::S_IFREG | 0o644, 0),
        );
        refused(
            &mut cases,
            format!("MKDIR over {name}"),
            s.mkdir(ROOT, name, 0o755, 0),
        );
        s.forget(e.nodeid, 1).unwrap();
        w.check_host(name);
    }
    // Listings show links as links.
    let dh = s.opendir(ROOT, libc::O_RDONLY as u32).unwrap();
    let ents = s.readdir(ROOT, dh.fh, 0, 65536).unwrap();
    for (name, _) in planted(&w.outside) {
        let e = ents
            .iter()
            .find(|e| e.name == name.as_bytes())
            .unwrap_or_else(|| panic!("{name} not listed"));
        assert_eq!(e.typ, 10, "{name} listed as type {}", e.typ);
        w.no_leak("READDIR", &e.name);
    }
    cases.case("READDIR lists links as links");
    if let Ok(plus) = s.readdirplus(ROOT, dh.fh, 0, 65536) {
        for e in plus.iter().filter(|e| e.entry.nodeid != 0) {
            w.no_leak("READDIRPLUS", &e.dirent.name);
            if e.dirent.name.starts_with(b"l_") {
                assert_eq!(e.entry.attr.mode & libc::S_IFMT, S_IFLNK);
            }
        }
        cases.case("READDIRPLUS attributes are the links'");
    }
    s.releasedir(ROOT, dh.fh, 0).unwrap();
    w.check_host("after listing");
    assert!(s.device().violations().is_empty());
    assert!(d.try_wait().unwrap().is_none(), "{}", d.log_contents());
    eprintln!("daemon: {}", kind.name());
}

/// `..` at the root, repeated `..`, and names that are not one component.
#[test]
fn dotdot_and_bad_names_stay_inside() {
    let mut cases = Cases::new("escape", "dotdot_and_bad_names_stay_inside");
    let daxfsd = common::kind() == DaemonKind::Daxfsd;
    let w = world("dotdot");
    let (mut d, s) = start(&w);
    let share_ino = fs::metadata(&w.share).unwrap().ino();

    let e = s.lookup(ROOT, "..").unwrap();
    assert_eq!(
        (e.nodeid, e.attr.ino),
        (ROOT, share_ino),
        "'..' of the root"
    );
    cases.case("LOOKUP .. at the root is the root");
    let e = s.lookup(ROOT, ".").unwrap();
    assert_eq!((e.nodeid, e.attr.ino), (ROOT, share_ino));
    cases.case("LOOKUP . at the root");
    // Repeated `..` from two levels down ends at the root and stays there.
    let dir = s.lookup(ROOT, "dir").unwrap();
    let sub = s.lookup(dir.nodeid, "sub").unwrap();
    let inside: BTreeSet<u64> = [share_ino, dir.attr.ino, sub.attr.ino].into();
    let mut at = sub.nodeid;
    let mut ino = sub.attr.ino;
    for i in 0..6 {
        let up = s.lookup(at, "..").unwrap();
        assert!(
            inside.contains(&up.attr.ino),
            "step {i}: '..' left the share (ino {})",
            up.attr.ino
        );
        (at, ino) = (up.nodeid, up.attr.ino);
        cases.case(format!("repeated .. step {i}"));
    }
    // daxfsd resolves `..` (and stops at the root, nodeid 1 itself); virtiofsd 1.14 answers
    // `..` with the directory itself. Either stays inside; only daxfsd must reach the root.
    if daxfsd {
        assert_eq!((at, ino), (ROOT, share_ino));
        let e = s.lookup(at, "..").unwrap();
        assert_eq!((e.nodeid, e.attr.ino), (ROOT, share_ino));
    }
    cases.case("repeated .. ends inside (daxfsd: at the root)");

    let bad_lookups = [
        "../outside",
        "../outside/secret",
        "..//outside",
        "/etc",
        "/",
        "//",
        "dir/sub",
        "dir/../../outside",
        "",
    ];
    let share_inos: BTreeSet<u64> = host::snapshot(&w.share).values().map(|st| st.ino).collect();
    for name in bad_lookups {
        match s.lookup(ROOT, name) {
            // virtiofsd 1.14 resolves "/" and "//" to the root: inside, so not an escape.
            Ok(e) if !daxfsd => assert!(
                share_inos.contains(&e.attr.ino),
                "LOOKUP {name:?} left the share: {e:?}"
            ),
            r => {
                let e = host::errno_of(&format!("LOOKUP {name:?}"), r);
                assert!(
                    [libc::EINVAL, libc::ENOENT].contains(&e),
                    "LOOKUP {name:?}: errno {e}"
                );
            }
        }
        cases.case(format!("LOOKUP {name:?}"));
    }
    refused(
        &mut cases,
        "LOOKUP ../../outside below dir".into(),
        s.lookup(dir.nodeid, "../../outside"),
    );
    // A name with a NUL inside: "file\0../outside/secret". (virtiofsd 1.14 exits on a
    // request it cannot decode, see malformed.rs: daxfsd only.)
    if daxfsd {
        let raw = s.call(op::LOOKUP, ROOT, &[b"file\0../outside/secret\0"], 128);
        refused(&mut cases, "LOOKUP with an embedded NUL".into(), raw);
    }
    let long = "x".repeat(256);
    refused(
        &mut cases,
        "LOOKUP of a 256-byte name".into(),
        s.lookup(ROOT, &long),
    );

    // daxfsd refuses every name that is not one component itself; virtiofsd 1.14 leaves
    // that to its sandbox (it creates "../x" as the share's "x"), so there only the host
    // checks apply.
    let strict = daxfsd;
    let p = &w.probe;
    let bad_names = [
        "..".to_string(),
        ".".to_string(),
        String::new(),
        format!("../outside/{p}"),
        format!("../{p}"),
        format!("/tmp/{p}"),
        format!("dir/{p}"),
        format!("{p}/"),
    ];
    let flags = (libc::O_CREAT | libc::O_RDWR) as u32;
    let file = s.lookup(ROOT, "file").unwrap();
    for n in &bad_names {
        bad_name(
            strict,
            &mut cases,
            format!("CREATE {n:?}"),
            s.create(ROOT, n, flags, libc::S_IFREG | 0o644, 0),
        );
        bad_name(
            strict,
            &mut cases,
            format!("MKDIR {n:?}"),
            s.mkdir(ROOT, n, 0o755, 0),
        );
        bad_name(
            strict,
            &mut cases,
            format!("MKNOD {n:?}"),
            s.mknod(ROOT, n, libc::S_IFREG | 0o644, 0, 0),
        );
        bad_name(
            strict,
            &mut cases,
            format!("SYMLINK {n:?}"),
            s.symlink(ROOT, n, "file"),
        );
        bad_name(
            strict,
            &mut cases,
            format!("LINK to {n:?}"),
            s.link(file.nodeid, ROOT, n),
        );
        bad_name(
            strict,
            &mut cases,
            format!("RENAME file to {n:?}"),
            s.rename(ROOT, "file", ROOT, n),
        );
        bad_name(
            strict,
            &mut cases,
            format!("RENAME2 exchange file with {n:?}"),
            s.rename2(ROOT, "file", ROOT, n, libc::RENAME_EXCHANGE),
        );
    }
    for n in [
        "../outside/secret",
        "../outside",
        "..",
        ".",
        "",
        "/etc/passwd",
        "dir/f2",
    ] {
        bad_name(
            strict,
            &mut cases,
            format!("RENAME {n:?} into the share"),
            s.rename(ROOT, n, ROOT, w.name("stolen")),
        );
        bad_name(
            strict,
            &mut cases,
            format!("UNLINK {n:?}"),
            s.unlink(ROOT, n),
        );
        bad_name(strict, &mut cases, format!("RMDIR {n:?}"), s.rmdir(ROOT, n));
    }
    // `..` as a name below a directory the guest made.
    let made = s.mkdir(ROOT, w.name("dir"), 0o755, 0).unwrap();
    refused(
        &mut cases,
        "RMDIR .. below a new directory".into(),
        s.rmdir(made.nodeid, ".."),
    );
    refused(
        &mut cases,
        "RENAME .. below a new directory".into(),
        s.rename(made.nodeid, "..", ROOT, w.name("x")),
    );
    refused(
        &mut cases,
        "SYMLINK named .. below a new directory".into(),
        s.symlink(made.nodeid, "..", "/"),
    );
    let up = s.lookup(made.nodeid, "..").unwrap();
    assert!([share_ino, made.attr.ino].contains(&up.attr.ino), "{up:?}");
    if daxfsd {
        assert_eq!((up.nodeid, up.attr.ino), (ROOT, share_ino));
    }
    cases.case(".. of a new directory is the root");
    s.rmdir(ROOT, w.name("dir")).unwrap();
    // The share itself is untouched apart from the guest's own probe directory, now gone.
    if strict {
        assert!(w.share.join("file").exists() && w.share.join("dir").join("sub").is_dir());
        assert!(host::names_containing(&w.share, &w.probe).is_empty());
    }
    w.check_host("bad names");
    assert!(s.device().violations().is_empty());
    assert!(d.try_wait().unwrap().is_none(), "{}", d.log_contents());
}

/// Symlinks the guest makes may point anywhere (their target is data), but nothing the daemon
/// does follows them; links and renames stay inside.
#[test]
fn guest_made_links_stay_inside() {
    let mut cases = Cases::new("escape", "guest_made_links_stay_inside");
    let w = world("guestlinks");
    let (mut d, s) = start(&w);
    let targets = [
        "/etc/passwd".to_string(),
        "../outside/secret".to_string(),
        "../outside".to_string(),
        "/proc/self/root/etc".to_string(),
        w.outside.join("secret").to_string_lossy().into_owned(),
        "../../../../../../../../".to_string(),
    ];
    for (i, t) in targets.iter().enumerate() {
        let name = w.name(&format!("sym{i}"));
        let e = s.symlink(ROOT, &name, t).unwrap();
        assert_eq!(
            fs::read_link(w.share.join(&name)).unwrap(),
            PathBuf::from(t),
            "SYMLINK -> {t}"
        );
        cases.case(format!("SYMLINK -> {t} is only a link in the share"));
        for flags in [libc::O_RDONLY, libc::O_WRONLY | libc::O_TRUNC, libc::O_RDWR] {
            refused(
                &mut cases,
                format!("OPEN link -> {t} flags {flags:#o}"),
                s.open(e.nodeid, flags as u32),
            );
        }
        let flags = (libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC) as u32;
        refused(
            &mut cases,
            format!("CREATE over link -> {t}"),
            s.create(ROOT, &name, flags, libc::S_IFREG | 0o644, 0),
        );
        refused(
            &mut cases,
            format!("SETATTR size of link -> {t}"),
            s.setattr(e.nodeid, &setattr(fattr::SIZE)),
        );
        let _ = s.setattr(e.nodeid, &setattr(fattr::MODE | fattr::MTIME));
        cases.case(format!("SETATTR mode+mtime of link -> {t}"));
        refuse_as_parent(&mut cases, &w, &s, e.nodeid, &format!("link -> {t}"));
        w.check_host(t);
    }
    // Over-long target.
    let long = "a/".repeat(2100);
    refused(
        &mut cases,
        "SYMLINK with an over-long target".into(),
        s.symlink(ROOT, w.name("long"), &long),
    );
    // Swapping a file with a link to outside swaps names inside the share only.
    let link = w.name("sym1");
    s.rename2(ROOT, "file", ROOT, &link, libc::RENAME_EXCHANGE)
        .unwrap();
    assert!(fs::symlink_metadata(w.share.join("file"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        fs::read(w.share.join(&link)).unwrap(),
        b"inside data",
        "exchange"
    );
    w.check_host("RENAME_EXCHANGE");
    s.rename2(ROOT, "file", ROOT, &link, libc::RENAME_EXCHANGE)
        .unwrap();
    cases.case("RENAME_EXCHANGE of a file and a link to outside");
    // RENAME onto a link replaces the link, never the target.
    s.rename(ROOT, "file", ROOT, &link).unwrap();
    assert_eq!(fs::read(w.share.join(&link)).unwrap(), b"inside data");
    s.rename(ROOT, &link, ROOT, "file").unwrap();
    cases.case("RENAME onto a link to outside");
    w.check_host("renames");
    assert!(s.device().violations().is_empty());
    assert!(d.try_wait().unwrap().is_none(), "{}", d.log_contents());
}

fn read_in(fh: u64) -> ReadIn {
    ReadIn {
        fh,
        offset: 0,
        size: 4096,
        ..Default::default()
    }
}

/// Inode numbers and handles the guest never got (or gave back) name nothing: LINK cannot
/// reach a file outside, and no handle reaches another inode.
#[test]
fn forged_nodeids_and_handles() {
    let mut cases = Cases::new("escape", "forged_nodeids_and_handles");
    let w = world("forged");
    let (mut d, s) = start(&w);
    // A forgotten inode: looked up, then forgotten to zero.
    let gone = s.lookup(ROOT, "dir").unwrap().nodeid;
    s.forget(gone, 1).unwrap();
    let probe = s.lookup(ROOT, "file").unwrap();
    let ids = [
        ("0", 0u64),
        ("2^64-1", u64::MAX),
        ("random", 0x5eed_1234_9abc_def1),
        ("forgotten", gone),
        ("never issued", probe.nodeid + 100_000),
        ("2^63", 1 << 63),
    ];
    let file = probe.nodeid;
    let flags = (libc::O_CREAT | libc::O_RDWR) as u32;
    for (label, id) in ids {
        let p = |op: &str| format!("{op} on {label} nodeid");
        refused(&mut cases, p("GETATTR"), s.getattr(id, None));
        refused(
            &mut cases,
            p("SETATTR"),
            s.setattr(id, &setattr(fattr::MODE)),
        );
        refused(&mut cases, p("LOOKUP secret"), s.lookup(id, "secret"));
        refused(&mut cases, p("LOOKUP .."), s.lookup(id, ".."));
        refused(&mut cases, p("LOOKUP ."), s.lookup(id, "."));
        refused(&mut cases, p("OPEN"), s.open(id, libc::O_RDWR as u32));
        refused(
            &mut cases,
            p("OPENDIR"),
            s.opendir(id, libc::O_RDONLY as u32),
        );
        refused(&mut cases, p("READLINK"), s.readlink(id));
        refused(
            &mut cases,
            p("CREATE in"),
            s.create(id, w.name("c"), flags, libc::S_IFREG | 0o644, 0),
        );
        refused(
            &mut cases,
            p("MKDIR in"),
            s.mkdir(id, w.name("d"), 0o755, 0),
        );
        refused(
            &mut cases,
            p("MKNOD in"),
            s.mknod(id, w.name("n"), libc::S_IFREG | 0o644, 0, 0),
        );
        refused(&mut cases, p("SYMLINK in"), s.symlink(id, w.name("s"), "x"));
        refused(
            &mut cases,
            p("LINK of"),
            s.link(id, ROOT, w.name("hardlink")),
        );
        refused(
            &mut cases,
            p("LINK into"),
            s.link(file, id, w.name("hardlink")),
        );
        refused(
            &mut cases,
            p("RENAME from"),
            s.rename(id, "secret", ROOT, w.name("r")),
        );
        refused(
            &mut cases,
            p("RENAME into"),
            s.rename(ROOT, "file", id, w.name("r")),
        );
        refused(&mut cases, p("UNLINK in"), s.unlink(id, "secret"));
        refused(&mut cases, p("RMDIR in"), s.rmdir(id, "sub"));
        refused(&mut cases, p("SETXATTR"), s.setxattr(id, "user.x", b"1", 0));
        refused(
            &mut cases,
            p("GETXATTR"),
            s.getxattr(id, "user.sentinel", 4096),
        );
        refused(&mut cases, p("LISTXATTR"), s.listxattr(id, 4096));
        refused(
            &mut cases,
            p("REMOVEXATTR"),
            s.removexattr(id, "user.sentinel"),
        );
        refused(&mut cases, p("TMPFILE in"), tmpfile(&s, id));
        refused(
            &mut cases,
            p("READ"),
            s.call(op::READ, id, &[read_in(0).as_slice()], 4096),
        );
        assert!(host::names_containing(&w.share, &w.probe).is_empty());
        w.check_host(label);
    }
    assert_eq!(s.getattr(file, None).unwrap().attr.ino, probe.attr.ino);

    // Handles.
    let fh = s.open(file, libc::O_RDWR as u32).unwrap().fh;
    let dir = s.lookup(ROOT, "dir").unwrap().nodeid;
    let f2 = s.lookup(dir, "f2").unwrap().nodeid;
    let fh2 = s.open(f2, libc::O_RDWR as u32).unwrap().fh;
    let dfh = s.opendir(ROOT, libc::O_RDONLY as u32).unwrap().fh;
    let released = s.open(file, libc::O_RDONLY as u32).unwrap().fh;
    s.release(file, released, 0).unwrap();
    let handles = [
        ("0", 0u64),
        ("2^64-1", u64::MAX),
        ("random", 0x0bad_cafe_f00d_1234),
        ("released", released),
        ("another inode's", fh2),
        ("a directory's", dfh),
    ];
    let issued = [fh, fh2, dfh];
    for (label, h) in handles {
        if issued.contains(&h) && !["another inode's", "a directory's"].contains(&label) {
            // e.g. virtiofsd numbers handles from 0: not a forged value there.
            continue;
        }
        let p = |op: &str| format!("{op} with {label} handle");
        refused(&mut cases, p("READ"), s.read(file, h, 0, 4096));
        refused(&mut cases, p("WRITE"), s.write(file, h, 0, b"overwritten"));
        refused(&mut cases, p("FSYNC"), s.fsync(file, h, false));
        refused(&mut cases, p("FLUSH"), s.flush(file, h, 0));
        refused(&mut cases, p("FALLOCATE"), s.fallocate(file, h, 0, 4096, 0));
        refused(&mut cases, p("LSEEK"), s.lseek(file, h, 0, 0));
        let mut a = setattr(fattr::SIZE | fattr::FH);
        a.fh = h;
        refused(&mut cases, p("SETATTR size"), s.setattr(file, &a));
        let lk = vufs_driver::whole_file_write_lock(h, 1);
        refused(
            &mut cases,
            p("SETLK"),
            s.call(op::SETLK, file, &[lk.as_slice()], 0),
        );
        refused(
            &mut cases,
            p("GETLK"),
            s.call(op::GETLK, file, &[lk.as_slice()], 24),
        );
        let cfr = CopyFileRangeIn {
            fh_in: h,
            off_in: 0,
            nodeid_out: file,
            fh_out: fh,
            off_out: 100,
            len: 4096,
            flags: 0,
        };
        refused(
            &mut cases,
            p("COPY_FILE_RANGE from"),
            s.call(op::COPY_FILE_RANGE, file, &[cfr.as_slice()], 8),
        );
        let cfr = CopyFileRangeIn {
            fh_in: fh,
            off_in: 0,
            nodeid_out: file,
            fh_out: h,
            off_out: 100,
            len: 4096,
            flags: 0,
        };
        refused(
            &mut cases,
            p("COPY_FILE_RANGE to"),
            s.call(op::COPY_FILE_RANGE, file, &[cfr.as_slice()], 8),
        );
        if h != dfh {
            refused(&mut cases, p("READDIR"), s.readdir(ROOT, h, 0, 4096));
        }
    }
    // The handles of the files themselves still work, and nothing was written.
    assert_eq!(s.read(file, fh, 0, 100).unwrap(), b"inside data");
    assert_eq!(s.read(f2, fh2, 0, 100).unwrap(), b"second file");
    assert_eq!(fs::read(w.share.join("file")).unwrap(), b"inside data");
    assert_eq!(
        fs::read(w.share.join("dir").join("f2")).unwrap(),
        b"second file"
    );
    cases.case("real handles unaffected");
    w.check_host("handles");
    assert!(s.device().violations().is_empty());
    assert!(d.try_wait().unwrap().is_none(), "{}", d.log_contents());
}

/// Device nodes, fifos and sockets the guest makes (or finds) in the share are never opened on
/// the host: opening them fails at once (no hang on a fifo, no host device behind a node).
#[test]
fn special_files_are_never_opened_on_the_host() {
    let mut cases = Cases::new("escape", "special_files_are_never_opened_on_the_host");
    let w = world("special");
    let fifo = w.share.join("host-fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    let hnull =
        std::ffi::CString::new(w.share.join("host-null").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid NUL-terminated path; mode and device number are plain integers.
    let made_null =
        unsafe { libc::mknod(hnull.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } == 0;
    let (mut d, s) = start(&w);
    let mut nodes = vec![(
        "host fifo".to_string(),
        s.lookup(ROOT, "host-fifo").unwrap().nodeid,
    )];
    if made_null {
        nodes.push((
            "host /dev/null node".into(),
            s.lookup(ROOT, "host-null").unwrap().nodeid,
        ));
    }
    let specs = [
        ("fifo", libc::S_IFIFO, 0u32),
        ("/dev/mem node", libc::S_IFCHR, (1 << 8) | 1),
        ("/dev/null node", libc::S_IFCHR, (1 << 8) | 3),
        ("block 8:0 node", libc::S_IFBLK, 8 << 8),
        ("socket", libc::S_IFSOCK, 0),
    ];
    for (label, kind, rdev) in specs {
        let name = w.name(label.split(' ').next().unwrap().trim_start_matches('/'));
        match s.mknod(ROOT, &name, kind | 0o666, rdev, 0) {
            Ok(e) => {
                let m = fs::symlink_metadata(w.share.join(&name)).unwrap();
                assert_eq!(m.mode() & libc::S_IFMT, kind, "{label}");
                nodes.push((format!("guest {label}"), e.nodeid));
            }
            Err(e) => assert!(e.raw_os_error().is_some(), "MKNOD {label}: {e}"),
        }
        cases.case(format!("MKNOD {label}"));
    }
    for (label, n) in &nodes {
        for flags in [libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR] {
            let t0 = Instant::now();
            refused(
                &mut cases,
                format!("OPEN {label} flags {flags:#o}"),
                s.open(*n, flags as u32),
            );
            assert!(t0.elapsed() < Duration::from_secs(2), "OPEN {label} hung");
        }
        refused(
            &mut cases,
            format!("SETATTR size of {label}"),
            s.setattr(*n, &setattr(fattr::SIZE)),
        );
        refused(
            &mut cases,
            format!("OPENDIR {label}"),
            s.opendir(*n, libc::O_RDONLY as u32),
        );
        refuse_as_parent(&mut cases, &w, &s, *n, label);
    }
    w.check_host("special files");
    assert!(s.device().violations().is_empty());
    assert!(d.try_wait().unwrap().is_none(), "{}", d.log_contents());
}

/// Lookups and `..` walks in several threads while the host renames directories around
/// inside the share: every inode the guest gets is one of the share's, and `..` walks end at
/// the root.
#[test]
fn lookups_racing_host_renames_stay_inside() {
    let mut cases = Cases::new("escape", "lookups_racing_host_renames_stay_inside");
    let w = world("race");
    let deep = w.share.join("a/b/c/d");
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("leaf"), b"leaf").unwrap();
    fs::create_dir_all(w.share.join("x/y")).unwrap();
    let known: BTreeSet<u64> = host::snapshot(&w.share).values().map(|st| st.ino).collect();
    let share_ino = fs::metadata(&w.share).unwrap().ino();
    let (mut d, s) = start(&w);
    let nreq = s.device().info().num_request_queues;
    let stop = AtomicBool::new(false);
    let seen = std::sync::Mutex::new(BTreeSet::new());
    let walks = std::sync::atomic::AtomicUsize::new(0);
    let root_nodes = std::sync::Mutex::new(BTreeSet::from([ROOT]));
    let daxfsd = common::kind() == DaemonKind::Daxfsd;
    std::thread::scope(|sc| {
        for t in 0..3 {
            let s = s.on_queue(1 + t % nreq).unwrap();
            let (stop, seen, known, walks, root_nodes) =
                (&stop, &seen, &known, &walks, &root_nodes);
            sc.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut at = ROOT;
                    let mut depth = 0;
                    for name in ["a", "b", "c", "d", "leaf"] {
                        match s.lookup(at, name) {
                            Ok(e) => {
                                assert!(
                                    known.contains(&e.attr.ino),
                                    "LOOKUP {name} gave ino {} from outside the share",
                                    e.attr.ino
                                );
                                seen.lock().unwrap().insert(e.attr.ino);
                                if name != "leaf" {
                                    at = e.nodeid;
                                    depth += 1;
                                }
                            }
                            Err(e) => {
                                assert!(e.raw_os_error().is_some(), "{e}");
                                break;
                            }
                        }
                    }
                    // Walk back up: at most `depth` steps plus the moves that happened, then
                    // the root for good.
                    let mut steps = 0;
                    while at != ROOT && !root_nodes.lock().unwrap().contains(&at) {
                        let up = match s.lookup(at, "..") {
                            Ok(up) => up,
                            Err(e) => {
                                assert!(e.raw_os_error().is_some(), "{e}");
                                break;
                            }
                        };
                        assert!(
                            known.contains(&up.attr.ino),
                            "'..' gave ino {} from outside the share",
                            up.attr.ino
                        );
                        if up.nodeid == at && !daxfsd {
                            break; // virtiofsd: `..` is the directory itself
                        }
                        at = up.nodeid;
                        if up.attr.ino == share_ino {
                            // The root (under nodeid 1 for daxfsd, maybe an alias elsewhere).
                            assert!(!daxfsd || at == ROOT, "root under nodeid {at}");
                            root_nodes.lock().unwrap().insert(at);
                        }
                        steps += 1;
                        assert!(steps <= 8, "'..' walk from depth {depth} did not end");
                    }
                    walks.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let share = &w.share;
        let stop = &stop;
        sc.spawn(move || {
            let deadline = Instant::now() + Duration::from_millis(1500);
            let mv = |a: &str, b: &str| {
                let _ = fs::rename(share.join(a), share.join(b));
            };
            while Instant::now() < deadline {
                mv("a/b", "x/y/b");
                mv("x/y/b", "a/b");
                mv("a", "a2");
                mv("a2", "x/a");
                mv("x/a", "a");
                mv("a/b/c", "c-top");
                mv("c-top", "a/b/c");
            }
            stop.store(true, Ordering::Relaxed);
        });
    });
    let up = s.lookup(ROOT, "..").unwrap();
    assert_eq!(up.attr.ino, share_ino);
    eprintln!(
        "{} walks, {} distinct inodes seen",
        walks.load(Ordering::Relaxed),
        seen.lock().unwrap().len()
    );
    assert!(walks.load(Ordering::Relaxed) > 10);
    cases.case("lookups under host renames return share inodes only");
    cases.case("'..' walks under host renames end at the root");
    cases.case("'..' of the root after the race");
    w.check_host("rename race");
    assert!(s.device().violations().is_empty());
    assert!(d.try_wait().unwrap().is_none(), "{}", d.log_contents());
}

/// A host user moves a directory the guest holds out of the share: LOOKUP `..` of it (and of
/// a directory below it) must not give the guest the host directory it now lies in; daxfsd
/// answers the root. Under `--sandbox chroot` and `none` (the namespace sandbox has no path
/// out either way): the daemon's own check, not a sandbox, keeps it inside.
#[test]
fn dotdot_after_a_host_move_out_stays_at_the_root() {
    let kind = common::kind();
    let daxfsd = kind == DaemonKind::Daxfsd;
    for sandbox in ["chroot", "none"] {
        let tmp = tempfile::tempdir().unwrap();
        let share = tmp.path().join("share");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(share.join("m/n")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("secret"), b"secret").unwrap();
        let mut d = host::spawn_in(&kind, &share, sandbox, &[]);
        let s = host::connect(&d, &DriverConfig::default()).with_timeout(Duration::from_secs(5));
        let share_ino = fs::metadata(&share).unwrap().ino();
        let m = s.lookup(ROOT, "m").unwrap().nodeid;
        let n = s.lookup(m, "n").unwrap().nodeid;
        fs::rename(share.join("m"), outside.join("moved")).unwrap();
        let forbidden: BTreeSet<u64> = [tmp.path(), outside.as_path(), Path::new("/")]
            .iter()
            .map(|p| fs::metadata(p).unwrap().ino())
            .collect();
        for (what, dir) in [("moved directory", m), ("directory below it", n)] {
            let mut at = dir;
            for step in 0..4 {
                let up = s.lookup(at, "..").unwrap();
                assert!(
                    !forbidden.contains(&up.attr.ino),
                    "--sandbox={sandbox} {}: '..' of the {what} (step {step}) is a host directory outside the share (ino {})",
                    kind.name(),
                    up.attr.ino
                );
                if daxfsd && what == "moved directory" && step == 0 {
                    assert_eq!(
                        (up.nodeid, up.attr.ino),
                        (ROOT, share_ino),
                        "--sandbox={sandbox}"
                    );
                }
                // Nothing of outside/ is reachable from what `..` gave.
                assert!(s.lookup(up.nodeid, "secret").is_err() || up.nodeid == dir);
                at = up.nodeid;
            }
            if daxfsd {
                assert_eq!(
                    at, ROOT,
                    "--sandbox={sandbox}: {what}: the walk ends at the root"
                );
            }
        }
        eprintln!("--sandbox={sandbox}: '..' after the move stays inside");
        assert!(d.try_wait().unwrap().is_none(), "{}", d.log_contents());
    }
}
