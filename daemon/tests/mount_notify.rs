//! Host changes reach a host mount's caches (`--mount --notify`, issue #42): with
//! `--cache=always` the kernel keeps entries, attributes and data for a day, so a change made
//! beside the mount (in the shared directory itself) stays invisible through it; with
//! `--notify` the daemon invalidates what changed and the next access sees it at once.
//! The same steps without `--notify` are the control: they must see the stale state, or the
//! test proves nothing. Root only (mount(2)).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::mount::{mount, require_root, Mounted};

/// What `stat(2)` shows of f through the mount: size and permission bits. (Rust's
/// `metadata` asks `statx` for the birth time, which FUSE attributes do not cache, so it would
/// fetch fresh attributes at every call; and this kernel refreshes a file's attributes when it
/// is read, so reads are not part of the comparison.)
fn seen(m: &Mounted) -> (u64, u32) {
    let f = m.mnt.join("d/f");
    let c = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is NUL-terminated and `st` a writable stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::stat(c.as_ptr(), &mut st) }, 0);
    (st.st_size as u64, st.st_mode & 0o777)
}

/// Changes the share from another process (the daemon skips its own changes).
fn host_change(m: &Mounted) {
    let d = m.share.join("d");
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "printf 'new bytes' > {0}/f && chmod 600 {0}/f",
            d.display()
        ))
        .status()
        .unwrap();
    assert!(st.success());
}

/// Caches through the mount, changes the share, and returns what the mount shows after
/// `within` (polling: the first moment it is the new state, or the stale state at the end).
fn after_change(args: &[&str], within: Duration) -> ((u64, u32), Duration) {
    require_root("mount(2)");
    let dir = tempfile::tempdir().unwrap();
    let m = mount(dir.path(), args, |share| {
        std::fs::create_dir_all(share.join("d")).unwrap();
        std::fs::write(share.join("d/f"), b"old").unwrap();
    });
    std::fs::set_permissions(
        m.share.join("d/f"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    assert_eq!(seen(&m), (3, 0o644), "before");
    host_change(&m);
    let start = Instant::now();
    loop {
        let s = seen(&m);
        if s == (9, 0o600) || start.elapsed() >= within {
            return (s, start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn host_changes_invalidate_a_host_mounts_long_caches() {
    // Without FUSE passthrough: its reads bypass the page cache this test is about.
    let (control, _) = after_change(
        &["--cache=always", "--passthrough=off"],
        Duration::from_millis(700),
    );
    assert_eq!(
        control,
        (3, 0o644),
        "the control must see the stale cache, or this test shows nothing"
    );
    let (with, t) = after_change(
        &["--cache=always", "--passthrough=off", "--notify"],
        Duration::from_secs(2),
    );
    assert_eq!(with, (9, 0o600), "with --notify the host change is seen");
    eprintln!("host change seen through the mount after {t:?}");
    assert!(t < Duration::from_millis(500), "took {t:?}");
    let (coherent, _) = after_change(
        &["--cache=coherent", "--passthrough=off"],
        Duration::from_secs(2),
    );
    assert_eq!(coherent, (9, 0o600), "--cache=coherent");
}
