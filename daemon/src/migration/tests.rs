//! The transfer: streams through pipes, checked by CHECK_DEVICE_STATE.

use std::io::{Read, Write};
use std::os::fd::FromRawFd;

use super::format::{bad, Dec, Enc};
use super::*;

/// A state host whose whole state is one non-zero u64.
#[derive(Default)]
struct Fake {
    loaded: Mutex<Option<u64>>,
}

const SAVED: u64 = 0x1234_5678_9abc;

fn stream(v: u64) -> Vec<u8> {
    let mut e = Enc::new();
    e.u64(v);
    e.into_stream().unwrap()
}

impl StateHost for Fake {
    fn save_stream(&self) -> io::Result<(Vec<u8>, String)> {
        Ok((stream(SAVED), "one value".into()))
    }
    fn load_stream(&self, s: &[u8]) -> io::Result<String> {
        let mut d = Dec::stream(s)?;
        let v = d.u64("value")?;
        d.finish()?;
        if v == 0 {
            return Err(bad("zero"));
        }
        *self.loaded.lock().unwrap() = Some(v);
        Ok("one value".into())
    }
}

fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are new and owned by nobody else.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

#[test]
fn save_then_load_through_pipes() {
    let host = Arc::new(Fake::default());
    let m = Migration::new(host.clone());
    assert!(m.check().is_err(), "check without a transfer");
    let (mut r, w) = pipe();
    m.set_fd(false, w).unwrap();
    let mut bytes = Vec::new();
    r.read_to_end(&mut bytes).unwrap();
    m.check().unwrap();
    assert_eq!(bytes, stream(SAVED));
    let (r, mut w) = pipe();
    m.set_fd(true, r).unwrap();
    w.write_all(&bytes).unwrap();
    drop(w);
    m.check().unwrap();
    assert_eq!(*host.loaded.lock().unwrap(), Some(SAVED));
}

#[test]
fn bad_streams_fail_the_check() {
    let host = Arc::new(Fake::default());
    let m = Migration::new(host.clone());
    let good = stream(SAVED);
    for bad in [Vec::new(), good[..good.len() / 2].to_vec(), stream(0)] {
        let (r, mut w) = pipe();
        m.set_fd(true, r).unwrap();
        let _ = w.write_all(&bad);
        drop(w);
        assert!(m.check().is_err());
    }
    assert!(host.loaded.lock().unwrap().is_none());
}
