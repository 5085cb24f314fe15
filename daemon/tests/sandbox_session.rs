//! The daemon in its sandbox, driven like a guest by the userspace driver (`vufs-driver`):
//! a full session with the default sandbox (namespace) and seccomp (kill), what the host
//! sees of the serving process (root, namespaces, mounts, seccomp mode, capabilities), what
//! the guest cannot reach, the chroot sandbox, a non-root daemon, signals, and that nothing
//! is left behind.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use daxfsd::abi::{self, fattr, RemovemappingOne, SetattrIn};
use daxfsd::caps::CapSet;
use vufs_driver::{Daemon, DaemonKind, Session, Xattr};

const ROOT: u64 = abi::ROOT_ID;
const MIB2: u64 = 2 << 20;
const READ: u64 = abi::SETUPMAPPING_FLAG_READ;
/// Decoy files the old `/proc/self/fd/N` paths would have hit inside the share.
const DECOYS: usize = 64;

fn daxfsd() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_daxfsd"))
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error()
        .unwrap_or_else(|| panic!("expected an errno, got {e}"))
}

/// The share every test starts from.
fn prepare_share(d: &Path) {
    fs::write(d.join("hello"), b"hello from the host").unwrap();
    fs::create_dir(d.join("d")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", d.join("esc")).unwrap();
    let decoys = d.join("proc/self/fd");
    fs::create_dir_all(&decoys).unwrap();
    for i in 0..DECOYS {
        fs::write(decoys.join(i.to_string()), b"decoy").unwrap();
    }
    // Two whole 2 MiB ranges, and a file whose mapping needs a shadow tail.
    fs::write(d.join("big.bin"), pattern(2 * MIB2 as usize)).unwrap();
    fs::write(d.join("tail.bin"), pattern(4096 + 100)).unwrap();
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 4096) as u8).collect()
}

/// `listxattr` of a host path (no symlink following), as names.
fn host_xattrs(p: &Path) -> Vec<String> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: `c` is NUL-terminated and `buf` is writable for its length.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(
        n >= 0,
        "llistxattr {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    buf.truncate(n as usize);
    buf.split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// `/proc/<pid>/status` field `key`.
fn status_field(pid: u32, key: &str) -> Option<String> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

fn hex_field(pid: u32, key: &str) -> u64 {
    let v = status_field(pid, key).unwrap_or_else(|| panic!("no {key} for {pid}"));
    u64::from_str_radix(&v, 16).unwrap_or_else(|e| panic!("{key}: {v:?}: {e}"))
}

/// The children of `parent`, from `/proc/*/stat`.
fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let ppid = after
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse::<u32>().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

/// The serving child of a namespace-sandbox supervisor, once it has its seccomp filter.
fn serving_child(supervisor: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let kids = children_of(supervisor);
        if let [child] = kids[..] {
            if status_field(child, "Seccomp").as_deref() == Some("2") {
                return child;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no sandboxed child of {supervisor} (children: {kids:?})"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn alive(pid: u32) -> bool {
    // A zombie still has a /proc entry; count only live processes.
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}

fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(Instant::now() < deadline, "process {pid} is still running");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ns_link(pid: &str, ns: &str) -> PathBuf {
    fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap_or_else(|e| panic!("ns/{ns}: {e}"))
}

/// A daxfsd started directly, with only the options given (so the defaults apply).
struct Raw {
    child: Child,
    dir: tempfile::TempDir,
}

impl Raw {
    fn spawn(share: &Path, args: &[&str], as_user: Option<(u32, u32)>) -> Raw {
        let dir = tempfile::Builder::new()
            .prefix("daxfsd-sandbox-")
            .tempdir()
            .unwrap();
        if let Some((uid, gid)) = as_user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        }
        let log = fs::File::create(dir.path().join("log")).unwrap();
        let mut cmd = Command::new(daxfsd());
        cmd.arg(format!(
            "--socket-path={}",
            dir.path().join("sock").display()
        ))
        .arg(format!("--shared-dir={}", share.display()))
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
        if let Some((uid, gid)) = as_user {
            // std drops the supplementary groups when root sets a uid.
            cmd.uid(uid).gid(gid);
        }
        let mut child = cmd.spawn().expect("spawn daxfsd");
        let deadline = Instant::now() + Duration::from_secs(10);
        let sock = dir.path().join("sock");
        while !sock.exists() {
            if let Some(st) = child.try_wait().unwrap() {
                panic!(
                    "daxfsd exited ({st}) before creating its socket:\n{}",
                    fs::read_to_string(dir.path().join("log")).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "no socket");
            std::thread::sleep(Duration::from_millis(10));
        }
        Raw { child, dir }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "daxfsd still running:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Host-side view of a process sandboxed in `share` by the namespace sandbox.
fn assert_confined_by_namespaces(pid: u32, share: &Path) {
    // Its root is the share, and it sees the share's entries only.
    let root = fs::metadata(format!("/proc/{pid}/root")).unwrap();
    let sh = fs::metadata(share).unwrap();
    assert_eq!(
        (root.dev(), root.ino()),
        (sh.dev(), sh.ino()),
        "root is not the share"
    );
    let mut seen: Vec<_> = fs::read_dir(format!("/proc/{pid}/root"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let mut want: Vec<_> = fs::read_dir(share)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    seen.sort();
    want.sort();
    assert_eq!(seen, want);
    // One mount: the share as `/` (its old root and procfs are detached).
    let mountinfo = fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .collect();
    assert_eq!(points, ["/"], "mounts the daemon sees:\n{mountinfo}");
    // Its own namespaces.
    for ns in ["mnt", "pid", "net", "ipc", "uts"] {
        assert_ne!(
            ns_link(&pid.to_string(), ns),
            ns_link("self", ns),
            "the daemon shares the {ns} namespace with the host"
        );
    }
    // pid 1 of its pid namespace.
    let nspid = status_field(pid, "NSpid").unwrap();
    assert_eq!(nspid.split_whitespace().last(), Some("1"), "NSpid {nspid}");
    // The seccomp filter is on.
    assert_eq!(status_field(pid, "Seccomp").as_deref(), Some("2"));
    assert_eq!(status_field(pid, "NoNewPrivs").as_deref(), Some("1"));
}

/// The capabilities a root daemon keeps: virtiofsd's set plus CAP_DAC_READ_SEARCH (the
/// default `--inode-file-handles=prefer` opens file handles), within what the test had.
fn assert_root_caps(pid: u32) {
    let had = hex_field(std::process::id(), "CapPrm");
    let want = (CapSet::daemon_default().0 | 1 << daxfsd::caps::CAP_DAC_READ_SEARCH) & had;
    assert_eq!(hex_field(pid, "CapEff"), want, "CapEff");
    assert_eq!(hex_field(pid, "CapPrm"), want, "CapPrm");
    assert_eq!(hex_field(pid, "CapBnd") & !want, 0, "CapBnd");
    assert_eq!(hex_field(pid, "CapInh"), 0, "CapInh");
    assert_eq!(hex_field(pid, "CapAmb"), 0, "CapAmb");
}

/// A guest-like session over every kind of request the sandboxed daemon must still serve.
fn exercise(s: &Session, share: &Path) {
    // Read a host file.
    let e = s.lookup(ROOT, "hello").unwrap();
    let o = s.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    assert_eq!(
        s.read(e.nodeid, o.fh, 0, 4096).unwrap(),
        b"hello from the host"
    );
    s.release(e.nodeid, o.fh, 0).unwrap();

    // Create, write, read back, fsync, fallocate, lseek.
    let (n, no) = s
        .create(ROOT, "new", libc::O_RDWR as u32, 0o644, 0o022)
        .unwrap();
    assert_eq!(s.write(n.nodeid, no.fh, 0, b"guest data").unwrap(), 10);
    assert_eq!(s.read(n.nodeid, no.fh, 0, 100).unwrap(), b"guest data");
    s.fsync(n.nodeid, no.fh, false).unwrap();
    s.fsync(n.nodeid, no.fh, true).unwrap();
    s.fallocate(n.nodeid, no.fh, 0, 65536, 0).unwrap();
    assert_eq!(
        s.lseek(n.nodeid, no.fh, 0, libc::SEEK_END as u32).unwrap(),
        65536
    );
    s.flush(n.nodeid, no.fh, 0).unwrap();
    s.release(n.nodeid, no.fh, 0).unwrap();
    assert_eq!(&fs::read(share.join("new")).unwrap()[..10], b"guest data");

    // chmod, truncate through SETATTR.
    let a = SetattrIn {
        valid: fattr::MODE | fattr::SIZE,
        mode: 0o600,
        size: 5,
        ..Default::default()
    };
    let attr = s.setattr(n.nodeid, &a).unwrap();
    assert_eq!((attr.attr.mode & 0o7777, attr.attr.size), (0o600, 5));
    assert_eq!(
        fs::metadata(share.join("new")).unwrap().mode() & 0o7777,
        0o600
    );

    // Directories, rename, hard and symbolic links, unlink, a fifo.
    let sub = s.mkdir(ROOT, "sub", 0o755, 0o022).unwrap();
    s.rename(ROOT, "new", sub.nodeid, "renamed").unwrap();
    assert!(share.join("sub/renamed").is_file());
    let renamed = s.lookup(sub.nodeid, "renamed").unwrap();
    s.link(renamed.nodeid, ROOT, "hard").unwrap();
    assert_eq!(fs::metadata(share.join("hard")).unwrap().nlink(), 2);
    let sl = s.symlink(ROOT, "sl", "sub/renamed").unwrap();
    assert_eq!(s.readlink(sl.nodeid).unwrap(), b"sub/renamed");
    s.mknod(ROOT, "fifo", libc::S_IFIFO | 0o644, 0, 0o022)
        .unwrap();
    assert_eq!(
        fs::symlink_metadata(share.join("fifo")).unwrap().mode() & libc::S_IFMT,
        libc::S_IFIFO
    );
    s.unlink(ROOT, "hard").unwrap();
    s.unlink(ROOT, "fifo").unwrap();
    assert!(!share.join("hard").exists());

    // READDIRPLUS of the root.
    let dh = s.opendir(ROOT, 0).unwrap();
    let names: Vec<String> = s
        .readdirplus(ROOT, dh.fh, 0, 65536)
        .unwrap()
        .iter()
        .map(|e| String::from_utf8_lossy(&e.dirent.name).into_owned())
        .collect();
    for want in ["hello", "d", "esc", "proc", "sub", "sl", "big.bin"] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
    s.releasedir(ROOT, dh.fh, 0).unwrap();
    let st = s.statfs(ROOT).unwrap();
    assert!(st.blocks > 0);

    // Extended attributes reach the file itself, never the decoys at proc/self/fd/N in
    // the share (where an absolute /proc/self/fd/N path would land inside the sandbox).
    s.setxattr(e.nodeid, "user.sandbox", b"value", 0).unwrap();
    assert_eq!(
        s.getxattr(e.nodeid, "user.sandbox", 64).unwrap(),
        Xattr::Data(b"value".to_vec())
    );
    match s.listxattr(e.nodeid, 4096).unwrap() {
        Xattr::Data(list) => assert!(
            list.split(|&b| b == 0).any(|n| n == b"user.sandbox"),
            "{list:?}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(host_xattrs(&share.join("hello")), ["user.sandbox"]);
    s.setxattr(sl.nodeid, "user.on-a-link", b"x", 0)
        .map(|()| panic!("user xattrs on a symlink"))
        .unwrap_or_else(|e| assert_eq!(errno(&e), libc::EPERM));
    for i in 0..DECOYS {
        let p = share.join(format!("proc/self/fd/{i}"));
        assert!(
            host_xattrs(&p).is_empty(),
            "xattr landed on decoy {}",
            p.display()
        );
    }
    s.removexattr(e.nodeid, "user.sandbox").unwrap();
    assert!(host_xattrs(&share.join("hello")).is_empty());

    // A file created as another user gets that owner (per-thread setresuid/setresgid), and
    // the host checks that user's permissions.
    let user = s.with_creds(1000, 1000, 1);
    let err = user
        .create(sub.nodeid, "denied", libc::O_RDWR as u32, 0o644, 0o022)
        .unwrap_err();
    assert_eq!(errno(&err), libc::EACCES);
    let public = s.mkdir(ROOT, "public", 0o777, 0).unwrap();
    let (u, uo) = user
        .create(public.nodeid, "owned", libc::O_RDWR as u32, 0o644, 0o022)
        .unwrap();
    s.release(u.nodeid, uo.fh, 0).unwrap();
    let m = fs::metadata(share.join("public/owned")).unwrap();
    assert_eq!((m.uid(), m.gid()), (1000, 1000));

    // A symlink to a host file is never followed: READLINK gives its text, OPEN fails.
    let esc = s.lookup(ROOT, "esc").unwrap();
    assert_eq!(esc.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(s.readlink(esc.nodeid).unwrap(), b"/etc/hostname");
    let err = s.open(esc.nodeid, libc::O_RDONLY as u32).unwrap_err();
    assert_eq!(errno(&err), libc::ELOOP);
    // `..` of the root is the root.
    let up = s.lookup(ROOT, "..").unwrap();
    assert_eq!(up.attr.ino, fs::metadata(share).unwrap().ino());
}

/// DAX: whole ranges and a shadow tail, read through the window.
fn exercise_dax(s: &Session) {
    let w = s.dax().cloned().expect("--dax-window=64M offers a window");
    let big = pattern(2 * MIB2 as usize);
    let e = s.lookup(ROOT, "big.bin").unwrap();
    let o = s.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    s.setupmapping(e.nodeid, o.fh, MIB2, MIB2, READ, 0).unwrap();
    let mut buf = vec![0u8; 8192];
    w.read(0, &mut buf).unwrap();
    assert_eq!(buf, big[MIB2 as usize..MIB2 as usize + 8192]);
    s.removemapping(
        e.nodeid,
        &[RemovemappingOne {
            moffset: 0,
            len: MIB2,
        }],
    )
    .unwrap();

    let tail = pattern(4096 + 100);
    let t = s.lookup(ROOT, "tail.bin").unwrap();
    let to = s.open(t.nodeid, libc::O_RDWR as u32).unwrap();
    s.setupmapping(t.nodeid, to.fh, 0, MIB2, READ, MIB2)
        .unwrap();
    let mut buf = vec![0u8; tail.len()];
    w.read(MIB2, &mut buf).unwrap();
    assert_eq!(buf, tail);
    s.removemapping(
        t.nodeid,
        &[RemovemappingOne {
            moffset: MIB2,
            len: MIB2,
        }],
    )
    .unwrap();
    s.release(e.nodeid, o.fh, 0).unwrap();
    s.release(t.nodeid, to.fh, 0).unwrap();
}

#[test]
fn default_sandbox_and_seccomp_serve_a_full_session() {
    let share = tempfile::tempdir().unwrap();
    prepare_share(share.path());
    // No --sandbox, no --seccomp: the defaults (namespace, kill).
    let mut d = Raw::spawn(share.path(), &["--xattr", "--dax-window=64M"], None);
    let s = Session::connect(&d.socket()).unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    s.init()
        .unwrap_or_else(|e| panic!("INIT: {e}\n{}", d.log()));
    let child = serving_child(d.pid());
    assert_confined_by_namespaces(child, share.path());
    assert_root_caps(child);
    // The supervisor stays outside, unfiltered.
    assert_eq!(ns_link(&d.pid().to_string(), "mnt"), ns_link("self", "mnt"));

    exercise(&s, share.path());
    exercise_dax(&s);
    assert!(
        d.child.try_wait().unwrap().is_none(),
        "daemon died:\n{}",
        d.log()
    );
    assert!(d.log().contains("seccomp"), "{}", d.log());

    // Disconnect: the child and the supervisor exit 0, the socket file goes.
    drop(s);
    let st = d.wait_exit();
    assert_eq!(st.code(), Some(0), "{st}\n{}", d.log());
    wait_gone(child);
    assert!(!d.socket().exists(), "socket file left behind");
}

/// A daemon with `--xattr --dax-window=64M` in sandbox `mode` (default seccomp), past INIT.
fn start_session(share: &std::path::Path, mode: &str) -> (Daemon, Session) {
    let d = Daemon::builder(&DaemonKind::Path(daxfsd()))
        .unwrap()
        .shared_dir(share)
        .sandbox(mode)
        .arg("--xattr")
        .arg("--dax-window=64M")
        .spawn()
        .unwrap();
    let s = Session::connect(d.socket_path()).unwrap();
    s.init().unwrap();
    (d, s)
}

#[test]
fn chroot_sandbox_serves_and_confines() {
    let share = tempfile::tempdir().unwrap();
    prepare_share(share.path());
    let (mut d, s) = start_session(share.path(), "chroot");
    let pid = d.pid().unwrap();
    // No fork: the daemon itself is chrooted, filtered and stripped of capabilities.
    assert!(children_of(pid).is_empty());
    let root = fs::metadata(format!("/proc/{pid}/root")).unwrap();
    let sh = fs::metadata(share.path()).unwrap();
    assert_eq!((root.dev(), root.ino()), (sh.dev(), sh.ino()));
    assert_eq!(status_field(pid, "Seccomp").as_deref(), Some("2"));
    assert_root_caps(pid);
    exercise(&s, share.path());
    exercise_dax(&s);
    drop(s);
    let st = d.wait_exit(Duration::from_secs(10)).unwrap();
    assert!(st.success(), "{st}\n{}", d.log_contents());
}

#[test]
fn sandbox_none_with_seccomp_serves_the_same_session() {
    let share = tempfile::tempdir().unwrap();
    prepare_share(share.path());
    let (mut d, s) = start_session(share.path(), "none");
    let pid = d.pid().unwrap();
    assert_eq!(status_field(pid, "Seccomp").as_deref(), Some("2"));
    exercise(&s, share.path());
    exercise_dax(&s);
    drop(s);
    let st = d.wait_exit(Duration::from_secs(10)).unwrap();
    assert!(st.success(), "{st}\n{}", d.log_contents());
    assert!(!d.socket_path().exists(), "socket file left behind");
}

#[test]
fn sigterm_to_the_supervisor_ends_the_sandboxed_child() {
    let share = tempfile::tempdir().unwrap();
    let mut d = Raw::spawn(share.path(), &[], None);
    let s = Session::connect(&d.socket()).unwrap();
    s.init().unwrap();
    let child = serving_child(d.pid());
    // SAFETY: kill with our own child's pid.
    assert_eq!(unsafe { libc::kill(d.pid() as i32, libc::SIGTERM) }, 0);
    let st = d.wait_exit();
    // The child ends the session cleanly and exits 0; so does the supervisor.
    assert_eq!(st.code(), Some(0), "{st}\n{}", d.log());
    wait_gone(child);
    assert!(!d.socket().exists(), "socket file left behind");
    let pid_file = format!("{}.pid", d.socket().display());
    assert!(!Path::new(&pid_file).exists(), "pid file left behind");
}

#[test]
fn killing_the_supervisor_takes_the_child_along() {
    let share = tempfile::tempdir().unwrap();
    let mut d = Raw::spawn(share.path(), &[], None);
    let s = Session::connect(&d.socket()).unwrap();
    s.init().unwrap();
    let child = serving_child(d.pid());
    d.child.kill().unwrap();
    let st = d.wait_exit();
    assert_eq!(st.signal(), Some(libc::SIGKILL));
    wait_gone(child);
}

#[test]
fn a_non_root_daemon_sandboxes_itself_in_a_user_namespace() {
    const NOBODY: (u32, u32) = (65534, 65534);
    let base = tempfile::tempdir().unwrap();
    fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let share = base.path().join("share");
    fs::create_dir(&share).unwrap();
    fs::write(share.join("mine"), b"data").unwrap();
    std::os::unix::fs::chown(&share, Some(NOBODY.0), Some(NOBODY.1)).unwrap();
    std::os::unix::fs::chown(share.join("mine"), Some(NOBODY.0), Some(NOBODY.1)).unwrap();
    let mut d = Raw::spawn(&share, &[], Some(NOBODY));
    let s = match Session::connect(&d.socket()).and_then(|s| s.init().map(|_| s)) {
        Ok(s) => s,
        Err(e) => {
            // Without unprivileged user namespaces the daemon must say what to do instead.
            let st = d.wait_exit();
            let log = d.log();
            assert!(
                !st.success() && log.contains("--sandbox none"),
                "{e}; {st}\n{log}"
            );
            return;
        }
    };
    let child = serving_child(d.pid());
    assert_confined_by_namespaces(child, &share);
    // Its own user namespace, no capability left, still uid nobody.
    assert_ne!(ns_link(&child.to_string(), "user"), ns_link("self", "user"));
    assert_eq!(hex_field(child, "CapEff"), 0);
    assert_eq!(hex_field(child, "CapPrm"), 0);
    let uid = status_field(child, "Uid").unwrap();
    assert!(uid.starts_with("65534"), "Uid {uid}");
    // It serves: read, create (owned by nobody), xattrs off by default.
    let e = s.lookup(ROOT, "mine").unwrap();
    let o = s.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    assert_eq!(s.read(e.nodeid, o.fh, 0, 100).unwrap(), b"data");
    let (n, no) = s
        .create(ROOT, "made", libc::O_RDWR as u32, 0o644, 0o022)
        .unwrap();
    s.write(n.nodeid, no.fh, 0, b"x").unwrap();
    assert_eq!(fs::metadata(share.join("made")).unwrap().uid(), NOBODY.0);
    drop(s);
    let st = d.wait_exit();
    assert_eq!(st.code(), Some(0), "{st}\n{}", d.log());
    wait_gone(child);
    assert!(!d.socket().exists());
}
