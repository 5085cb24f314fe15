//! `--uid-map`/`--gid-map`: a non-root daemon (user `daxfsd-test`) in its namespace sandbox,
//! whose user namespace maps namespace uid 0 to the daemon's own uid and 1..65536 to its
//! /etc/subuid range (newuidmap/newgidmap). Files the guest creates as uid 0 land on the
//! host as the daemon's uid; files of guest uid 1000 as subuid start + 999; an id outside
//! the map is refused. Runs against either daemon (`VUFS_DAEMON`), so upstream virtiofsd
//! 1.14 proves the test. Set-up (root, run by the test itself, idempotent):
//! `scripts/uidmap-test-setup.sh`: package uidmap, the system user, its subordinate id ranges.

mod common;
#[path = "common/host.rs"]
mod host;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use daxfsd::abi::{fattr, SetattrIn};
use vufs_driver::{Daemon, DaemonKind, DriverConfig};

const ROOT: u64 = 1;
const USER: &str = "daxfsd-test";
const SETUP: &str = "scripts/uidmap-test-setup.sh did not set up the user and its ranges";

/// (uid, gid) of `name` from /etc/passwd.
fn passwd(name: &str) -> Option<(u32, u32)> {
    fs::read_to_string("/etc/passwd")
        .ok()?
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() > 3 && f[0] == name {
                Some((f[2].parse().ok()?, f[3].parse().ok()?))
            } else {
                None
            }
        })
}

/// The first (start, count) range of `name` in /etc/subuid or /etc/subgid.
fn sub_range(file: &str, name: &str) -> Option<(u32, u32)> {
    fs::read_to_string(file).ok()?.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() == 3 && f[0] == name {
            Some((f[1].parse().ok()?, f[2].parse().ok()?))
        } else {
            None
        }
    })
}

fn owner(p: &Path) -> (u32, u32) {
    let m = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (m.uid(), m.gid())
}

#[test]
fn non_root_daemon_with_uid_and_gid_maps() {
    assert_eq!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "this test runs the daemon as {USER}: run it as root"
    );
    // The set-up is idempotent and changes nothing of the machine's users or ranges.
    let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/uidmap-test-setup.sh");
    let st = std::process::Command::new(&setup)
        .status()
        .unwrap_or_else(|e| panic!("{}: {e}", setup.display()));
    assert!(st.success(), "{} failed ({st})", setup.display());
    let (uid, gid) = passwd(USER).unwrap_or_else(|| panic!("no user {USER}: {SETUP}"));
    let (su, su_n) = sub_range("/etc/subuid", USER).unwrap_or_else(|| panic!("{SETUP}"));
    let (sg, sg_n) = sub_range("/etc/subgid", USER).unwrap_or_else(|| panic!("{SETUP}"));
    assert!(su_n >= 65536 && sg_n >= 65536, "{SETUP}");

    // A copy of the binary the user can run (the cached virtiofsd is under /root).
    let kind = DaemonKind::from_env();
    let bin_dir = tempfile::Builder::new()
        .prefix("uidmap-bin-")
        .tempdir()
        .unwrap();
    fs::set_permissions(bin_dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let bin = bin_dir.path().join("daemon");
    fs::copy(kind.binary().unwrap(), &bin).unwrap();
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();

    let d = Daemon::builder(&DaemonKind::Path(bin))
        .unwrap()
        .sandbox("namespace")
        .user(uid, gid)
        .arg(format!("--uid-map=:0:{uid}:1:"))
        .arg(format!("--uid-map=:1:{su}:65536:"))
        .arg(format!("--gid-map=:0:{gid}:1:"))
        .arg(format!("--gid-map=:1:{sg}:65536:"))
        .spawn()
        .unwrap_or_else(|e| panic!("{} as {USER} with id maps: {e}", kind.name()));
    let pid = d.pid().unwrap();
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uids.split_whitespace()
            .skip(1)
            .all(|u| u == uid.to_string()),
        "the daemon must run as {USER} ({uid}): {uids}"
    );
    let s = host::connect(&d, &DriverConfig::default());
    let share = d.shared_dir().to_path_buf();

    // Guest root: the daemon's own host ids.
    let (e, o) = s
        .create(
            ROOT,
            "by-root",
            libc::O_RDWR as u32,
            libc::S_IFREG | 0o644,
            0,
        )
        .unwrap_or_else(|e| panic!("create as guest root: {e}\n{}", d.log_contents()));
    s.write(e.nodeid, o.fh, 0, b"root data").unwrap();
    s.release(e.nodeid, o.fh, 0).unwrap();
    assert_eq!((e.attr.uid, e.attr.gid), (0, 0), "the guest sees root");
    assert_eq!(
        owner(&share.join("by-root")),
        (uid, gid),
        "guest root -> {USER}"
    );
    assert_eq!(fs::read(share.join("by-root")).unwrap(), b"root data");
    let pubdir = s
        .mkdir(ROOT, "pub", libc::S_IFDIR | 0o777, 0)
        .unwrap_or_else(|e| panic!("mkdir: {e}\n{}", d.log_contents()));
    assert_eq!(owner(&share.join("pub")), (uid, gid));

    // Guest uid/gid 1000: subordinate id start + 999.
    let user = s.with_creds(1000, 1000, 1);
    let (ue, uo) = user
        .create(
            pubdir.nodeid,
            "by-1000",
            libc::O_RDWR as u32,
            libc::S_IFREG | 0o644,
            0,
        )
        .unwrap_or_else(|e| panic!("create as guest uid 1000: {e}\n{}", d.log_contents()));
    user.release(ue.nodeid, uo.fh, 0).unwrap();
    assert_eq!((ue.attr.uid, ue.attr.gid), (1000, 1000));
    assert_eq!(
        owner(&share.join("pub/by-1000")),
        (su + 999, sg + 999),
        "guest 1000 -> subordinate ids"
    );

    // chown by guest root to 2000:3000.
    let a = SetattrIn {
        valid: fattr::UID | fattr::GID,
        uid: 2000,
        gid: 3000,
        ..Default::default()
    };
    let attr = s
        .setattr(e.nodeid, &a)
        .unwrap_or_else(|e| panic!("chown: {e}\n{}", d.log_contents()));
    assert_eq!((attr.attr.uid, attr.attr.gid), (2000, 3000));
    assert_eq!(owner(&share.join("by-root")), (su + 1999, sg + 2999));

    // An id outside the maps is refused; nothing lands.
    let stranger = s.with_creds(70000, 70000, 1);
    assert!(stranger
        .create(
            pubdir.nodeid,
            "by-70000",
            libc::O_RDWR as u32,
            libc::S_IFREG | 0o644,
            0
        )
        .is_err());
    assert!(!share.join("pub/by-70000").exists());
    eprintln!(
        "{}: {USER} ({uid}:{gid}), maps :0:{uid}:1: :1:{su}:65536: / :0:{gid}:1: :1:{sg}:65536:: ok",
        kind.name()
    );
}
