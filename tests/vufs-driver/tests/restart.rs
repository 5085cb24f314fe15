//! `--restartable` (daxfsd only: upstream virtiofsd has no holder): the file server is killed
//! (SIGKILL) and upgraded (SIGUSR2 to the holder) under a connected frontend, which goes on
//! with the same session: node ids, open handles (an unlinked open file's too), a POSIX lock
//! held on the host, and a lock wait that was in flight when the server died, answered once.

use std::path::Path;
use std::time::{Duration, Instant};

use daxfsd::abi::{self, opcode as op, ROOT_ID};
use vm_memory::ByteValued;
use vufs_driver::{Daemon, DaemonKind, Session};

/// The holder's child: the file server serving now.
fn server_pid(holder: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{holder}/task/{holder}/children"))
        .ok()?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Waits until the holder serves with a server other than `old`, and its log has `n` lines
/// containing `line`.
fn wait_new_server(d: &Daemon, old: u32, line: &str, n: usize) -> u32 {
    let holder = d.pid().unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let log = d.log_contents();
        if let Some(p) = server_pid(holder) {
            if p != old && log.matches(line).count() >= n {
                return p;
            }
        }
        assert!(
            Instant::now() < end,
            "no new file server after {old}; log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGKILLs the holder's file server and waits until the next one serves: its pid.
fn kill_server(d: &Daemon) -> u32 {
    let first = server_pid(d.pid().unwrap()).expect("the holder has a file server child");
    // SAFETY: kill sends SIGKILL to the file server, a process of this test's daemon.
    assert_eq!(unsafe { libc::kill(first as i32, libc::SIGKILL) }, 0);
    wait_new_server(d, first, "holder: serving again", 1)
}

/// A conflicting host OFD write lock on `path` is refused (someone holds one).
fn host_lock_refused(path: &Path) -> bool {
    match vufs_driver::host_write_lock(path) {
        Ok(_) => false,
        Err(e) => {
            let busy = matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES));
            assert!(busy, "host lock on {path:?}: {e}");
            true
        }
    }
}

/// Everything the session set up before the server went answers as before.
fn check_session(s: &Session, d: &Daemon, a: (u64, u64), dir: u64, u: (u64, u64), when: &str) {
    let log = || d.log_contents();
    let got = s
        .read(a.0, a.1, 0, 5)
        .unwrap_or_else(|e| panic!("{when}: READ: {e}\n{}", log()));
    assert_eq!(got, b"hello", "{when}: the open handle reads the file");
    s.getattr(dir, None)
        .unwrap_or_else(|e| panic!("{when}: GETATTR of the directory: {e}\n{}", log()));
    s.lookup(dir, "in")
        .unwrap_or_else(|e| panic!("{when}: LOOKUP in the directory: {e}\n{}", log()));
    let got = s
        .read(u.0, u.1, 0, 8)
        .unwrap_or_else(|e| panic!("{when}: READ unlinked: {e}"));
    assert_eq!(got, b"unlinked", "{when}: the unlinked open file reads");
    assert!(
        host_lock_refused(&d.shared_dir().join("a")),
        "{when}: the guest's POSIX lock on a is no longer held on the host"
    );
    // Another lock owner of the guest sees the lock.
    let lk = vufs_driver::whole_file_write_lock(a.1, 8);
    let body = s.call(op::GETLK, a.0, &[lk.as_slice()], 24).unwrap();
    let out = abi::LkOut::from_slice(&body[..24]).unwrap();
    assert_eq!(
        out.lk.typ,
        libc::F_WRLCK as u32,
        "{when}: GETLK names the writer"
    );
}

#[test]
fn the_session_survives_a_killed_and_an_upgraded_file_server() {
    let kind = DaemonKind::from_env();
    if kind != DaemonKind::Daxfsd {
        eprintln!("{}: has no --restartable; skipped", kind.name());
        return;
    }
    let d = Daemon::builder(&kind)
        .unwrap()
        .arg("--restartable")
        .arg("--posix-lock")
        .spawn()
        .unwrap();
    let s = Session::connect(d.socket_path()).unwrap();
    s.init().unwrap();
    let rw = libc::O_RDWR as u32;
    let (e, o) = s.create(ROOT_ID, "a", rw, 0o644, 0).unwrap();
    s.write(e.nodeid, o.fh, 0, b"hello").unwrap();
    let dir = s.mkdir(ROOT_ID, "d", 0o755, 0).unwrap();
    s.create(dir.nodeid, "in", rw, 0o644, 0).unwrap();
    let (ue, uo) = s.create(ROOT_ID, "u", rw, 0o644, 0).unwrap();
    s.write(ue.nodeid, uo.fh, 0, b"unlinked").unwrap();
    s.unlink(ROOT_ID, "u").unwrap();
    let lk = vufs_driver::whole_file_write_lock(o.fh, 7);
    s.call(op::SETLK, e.nodeid, &[lk.as_slice()], 0).unwrap();
    let check = |when: &str| {
        check_session(
            &s,
            &d,
            (e.nodeid, o.fh),
            dir.nodeid,
            (ue.nodeid, uo.fh),
            when,
        )
    };
    check("before");

    // A lock wait in flight: the host holds "w", the guest waits for it.
    let w_path = d.shared_dir().join("w");
    std::fs::write(&w_path, b"").unwrap();
    let host_lock = vufs_driver::host_write_lock(&w_path).unwrap();
    let w = s.lookup(ROOT_ID, "w").unwrap();
    let wh = s.open(w.nodeid, rw).unwrap();
    let wlk = vufs_driver::whole_file_write_lock(wh.fh, 9);
    let chain = s.linux_chain(op::SETLKW, w.nodeid, &[wlk.as_slice()], 0);
    let waiting = s.device().submit(1, &chain).unwrap();
    std::thread::sleep(Duration::from_millis(300));

    let holder = d.pid().unwrap();
    let second = kill_server(&d);
    check("after SIGKILL");
    let log = d.log_contents();
    assert!(
        log.contains("serving 1 request(s) again"),
        "the lock wait in flight was not served again; log:\n{log}"
    );

    // The wait ends once the host lets go, exactly once.
    drop(host_lock);
    let c = waiting
        .wait(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("the lock wait never ended: {e}\n{}", d.log_contents()));
    assert_eq!(c.error(), Some(0), "the lock wait's reply");

    // SAFETY: SIGUSR2 to the holder, this test's daemon.
    assert_eq!(unsafe { libc::kill(holder as i32, libc::SIGUSR2) }, 0);
    wait_new_server(&d, second, "holder: upgrade done", 1);
    check("after upgrade");
    // New work after both.
    let (ne, no) = s.create(dir.nodeid, "new", rw, 0o644, 0).unwrap();
    assert_eq!(s.write(ne.nodeid, no.fh, 0, b"x").unwrap(), 1);
}

/// SIGKILL of the server, then an upgrade, under a pooled DAX window the frontend keeps
/// mapped: the guest's stores made before and after each go to the file at the sync points
/// (FSYNC, REMOVEMAPPING), a host change to a page the guest left alone survives the merge,
/// and nothing more is sent to the frontend (it still maps the pool).
#[test]
fn a_pooled_dax_window_survives_a_killed_and_an_upgraded_file_server() {
    use daxfsd::abi::SETUPMAPPING_FLAG_WRITE as WRITE;
    use daxfsd::abi::{RemovemappingOne, SETUPMAPPING_FLAG_READ as READ};
    const MIB2: u64 = 2 << 20;
    let kind = DaemonKind::from_env();
    if kind != DaemonKind::Daxfsd {
        eprintln!("{}: has no --restartable; skipped", kind.name());
        return;
    }
    let d = Daemon::builder(&kind)
        .unwrap()
        .arg("--restartable")
        .arg("--dax-window=16M")
        .arg("--dax-mapping=pooled")
        .spawn()
        .unwrap();
    let data: Vec<u8> = (0..2 * MIB2 as usize).map(|i| (i % 251) as u8).collect();
    let path = d.shared_dir().join("dax.bin");
    std::fs::write(&path, &data).unwrap();
    let s = Session::connect(d.socket_path()).unwrap();
    s.init().unwrap();
    let w = s
        .dax()
        .cloned()
        .unwrap_or_else(|| panic!("no DAX window\n{}", d.log_contents()));
    let e = s.lookup(ROOT_ID, "dax.bin").unwrap();
    let o = s.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    let rw = READ | WRITE;
    s.setupmapping(e.nodeid, o.fh, 0, MIB2, rw, 0).unwrap();
    s.setupmapping(e.nodeid, o.fh, MIB2, MIB2, rw, MIB2 * 4)
        .unwrap();
    w.write(100, b"before-kill").unwrap();
    w.write(4 * MIB2 + 5000, b"range1-before").unwrap();
    let file_has = |at: usize, want: &[u8], when: &str| {
        let f = std::fs::read(&path).unwrap();
        assert_eq!(
            &f[at..at + want.len()],
            want,
            "{when}: the file at {at}\n{}",
            d.log_contents()
        );
    };

    let holder = d.pid().unwrap();
    let second = kill_server(&d);
    let log = d.log_contents();
    assert!(
        log.contains("2 DAX mapping(s)"),
        "the window was not taken back:\n{log}"
    );
    let mut buf = [0u8; 11];
    w.read(100, &mut buf).unwrap();
    assert_eq!(&buf, b"before-kill", "the guest's view of the pool");
    w.write(200, b"after-kill").unwrap();
    // A host change to a page the guest did not store into since the last merge.
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::OpenOptions::new().write(true).open(&path).unwrap(),
        b"host-change",
        3 * 4096,
    )
    .unwrap();
    s.fsync(e.nodeid, o.fh, false)
        .unwrap_or_else(|err| panic!("FSYNC after the crash: {err}\n{}", d.log_contents()));
    file_has(100, b"before-kill", "FSYNC after SIGKILL");
    file_has(200, b"after-kill", "FSYNC after SIGKILL");
    file_has(
        3 * 4096,
        b"host-change",
        "FSYNC after SIGKILL (host change)",
    );
    let mut hc = [0u8; 11];
    w.read(3 * 4096, &mut hc).unwrap();
    assert_eq!(
        &hc, b"host-change",
        "the host change reaches the guest's view"
    );

    // SAFETY: SIGUSR2 to the holder, this test's daemon.
    assert_eq!(unsafe { libc::kill(holder as i32, libc::SIGUSR2) }, 0);
    wait_new_server(&d, second, "holder: upgrade done", 1);
    w.write(300, b"after-upgrade").unwrap();
    w.write(4 * MIB2 + 6000, b"range1-after").unwrap();
    // A range placed before both restarts leaves the window: its bytes go to the file.
    let one = RemovemappingOne {
        moffset: 4 * MIB2,
        len: MIB2,
    };
    s.removemapping(e.nodeid, &[one])
        .unwrap_or_else(|err| panic!("REMOVEMAPPING: {err}\n{}", d.log_contents()));
    file_has(MIB2 as usize + 5000, b"range1-before", "REMOVEMAPPING");
    file_has(MIB2 as usize + 6000, b"range1-after", "REMOVEMAPPING");
    s.fsync(e.nodeid, o.fh, false).unwrap();
    file_has(300, b"after-upgrade", "FSYNC after the upgrade");
    file_has(100, b"before-kill", "FSYNC after the upgrade");
    // A new mapping after both: placed in the pool QEMU still maps, nothing sent.
    s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ, 2 * MIB2)
        .unwrap();
    w.read(2 * MIB2 + 100, &mut buf).unwrap();
    assert_eq!(&buf, b"before-kill");
    let st = w.stats();
    assert_eq!(
        (st.map_requests, st.unmap_requests, st.maps_rejected),
        (1, 0, 0),
        "only the pool's one map reaches the frontend: {st:?}"
    );
    assert!(w.violations().is_empty(), "{:?}", w.violations());
}

/// SIGKILL of the server, then an upgrade, with direct mappings (`--dax-mapping=direct`):
/// the frontend keeps mapping the file itself, the shadow memfd of its tail past EOF and a
/// copy slot. The next server sends the frontend nothing for them, and the guest's stores
/// (into the file, into the tail before and after each restart) reach the file at FSYNC and
/// REMOVEMAPPING; the copy slot parks and is refilled in place as before.
#[test]
fn a_direct_dax_window_survives_a_killed_and_an_upgraded_file_server() {
    use daxfsd::abi::SETUPMAPPING_FLAG_WRITE as WRITE;
    use daxfsd::abi::{RemovemappingOne, SETUPMAPPING_FLAG_READ as READ};
    const MIB: u64 = 1 << 20;
    const MIB2: u64 = 2 << 20;
    let kind = DaemonKind::from_env();
    if kind != DaemonKind::Daxfsd {
        eprintln!("{}: has no --restartable; skipped", kind.name());
        return;
    }
    let d = Daemon::builder(&kind)
        .unwrap()
        .arg("--restartable")
        .arg("--dax-window=16M")
        .arg("--dax-mapping=direct")
        .arg("--dax-copy=always")
        .spawn()
        .unwrap();
    // The file ends 1000 bytes into the range's second MiB: 1 MiB from the file, a shadow
    // tail for the rest.
    let flen = MIB as usize + 1000;
    let data: Vec<u8> = (0..flen).map(|i| (i % 251) as u8).collect();
    let path = d.shared_dir().join("direct.bin");
    std::fs::write(&path, &data).unwrap();
    // Opened before the mapping: a host open of a mapped file would move its mappings to
    // shadows (`dax::host_watch`, where fanotify pre-content events work).
    let host = std::fs::File::open(&path).unwrap();
    let ro: Vec<u8> = (0..MIB2 as usize).map(|i| (i % 241) as u8).collect();
    std::fs::write(d.shared_dir().join("copy.bin"), &ro).unwrap();
    let s = Session::connect(d.socket_path()).unwrap();
    s.init().unwrap();
    let w = s
        .dax()
        .cloned()
        .unwrap_or_else(|| panic!("no DAX window\n{}", d.log_contents()));
    let e = s.lookup(ROOT_ID, "direct.bin").unwrap();
    let o = s.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    let c = s.lookup(ROOT_ID, "copy.bin").unwrap();
    let co = s.open(c.nodeid, libc::O_RDONLY as u32).unwrap();
    s.setupmapping(e.nodeid, o.fh, 0, MIB2, READ | WRITE, 0)
        .unwrap_or_else(|err| panic!("SETUPMAPPING: {err}\n{}", d.log_contents()));
    s.setupmapping(c.nodeid, co.fh, 0, MIB2, READ, 4 * MIB2)
        .unwrap_or_else(|err| panic!("SETUPMAPPING (copy): {err}\n{}", d.log_contents()));
    let before = w.stats();
    assert_eq!(
        before.map_requests,
        3,
        "file, tail and copy slot: {before:?}\n{}",
        d.log_contents()
    );
    w.write(100, b"file-before").unwrap();
    w.write(MIB + 500, b"tail-kill").unwrap();
    let file_has = |at: u64, want: &[u8], when: &str| {
        let mut got = vec![0u8; want.len()];
        std::os::unix::fs::FileExt::read_exact_at(&host, &mut got, at).unwrap();
        assert_eq!(
            &got[..],
            want,
            "{when}: the file at {at}\n{}",
            d.log_contents()
        );
    };

    let holder = d.pid().unwrap();
    let second = kill_server(&d);
    let log = d.log_contents();
    assert!(
        log.contains("2 DAX mapping(s)"),
        "the window was not taken back:\n{log}"
    );
    let mut buf = [0u8; 9];
    w.read(MIB + 500, &mut buf).unwrap();
    assert_eq!(&buf, b"tail-kill", "the guest's view of the tail");
    w.write(MIB + 600, b"tail-kil2").unwrap();
    s.fsync(e.nodeid, o.fh, false)
        .unwrap_or_else(|err| panic!("FSYNC after the crash: {err}\n{}", d.log_contents()));
    file_has(100, b"file-before", "FSYNC after SIGKILL");
    file_has(MIB + 500, b"tail-kill", "FSYNC after SIGKILL");
    file_has(MIB + 600, b"tail-kil2", "FSYNC after SIGKILL");
    // The copy slot the guest drops stays parked in the frontend.
    let one = RemovemappingOne {
        moffset: 4 * MIB2,
        len: MIB2,
    };
    s.removemapping(c.nodeid, &[one])
        .unwrap_or_else(|err| panic!("REMOVEMAPPING (copy): {err}\n{}", d.log_contents()));

    // SAFETY: SIGUSR2 to the holder, this test's daemon.
    assert_eq!(unsafe { libc::kill(holder as i32, libc::SIGUSR2) }, 0);
    wait_new_server(&d, second, "holder: upgrade done", 1);
    w.write(200, b"file-after").unwrap();
    w.write(MIB + 700, b"tail-upgr").unwrap();
    // The parked slot is refilled in place: no request to the frontend.
    s.setupmapping(c.nodeid, co.fh, 0, MIB2, READ, 4 * MIB2)
        .unwrap_or_else(|err| panic!("SETUPMAPPING (refill): {err}\n{}", d.log_contents()));
    let mut rb = [0u8; 16];
    w.read(4 * MIB2 + 1000, &mut rb).unwrap();
    assert_eq!(&rb[..], &ro[1000..1016], "the refilled copy slot");
    assert_eq!(
        w.stats(),
        before,
        "nothing more reached the frontend\n{}",
        d.log_contents()
    );
    // The range placed before both restarts leaves the window: its tail goes to the file.
    let one = RemovemappingOne {
        moffset: 0,
        len: MIB2,
    };
    s.removemapping(e.nodeid, &[one])
        .unwrap_or_else(|err| panic!("REMOVEMAPPING: {err}\n{}", d.log_contents()));
    file_has(200, b"file-after", "REMOVEMAPPING after the upgrade");
    file_has(MIB + 500, b"tail-kill", "REMOVEMAPPING after the upgrade");
    file_has(MIB + 600, b"tail-kil2", "REMOVEMAPPING after the upgrade");
    file_has(MIB + 700, b"tail-upgr", "REMOVEMAPPING after the upgrade");
    assert_eq!(host.metadata().unwrap().len(), flen as u64);
    let st = w.stats();
    assert_eq!(
        (
            st.map_requests,
            st.unmap_requests,
            st.maps_rejected,
            st.unmaps_rejected
        ),
        (3, 2, 0, 0),
        "only the two unmaps of the removed range: {st:?}"
    );
    assert!(w.violations().is_empty(), "{:?}", w.violations());
}
