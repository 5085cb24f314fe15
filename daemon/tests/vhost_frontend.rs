//! The vhost-user control channel against a hostile or buggy frontend: each seed of the
//! `vhost_frontend` fuzz target (a QEMU-like handshake, vring set-up without descriptors,
//! resets, out-of-range config reads, device state without a descriptor, a message cut
//! short, a size field of 4 GiB) and random bytes end the session without a panic or a hang.

use std::time::{Duration, Instant};

use daxfsd::testing::frontend::{frontend_seeds, message, run_frontend};

fn within(limit: Duration, what: &str, data: &[u8]) -> bool {
    let t = Instant::now();
    let clean = run_frontend(data);
    assert!(
        t.elapsed() < limit,
        "{what}: the session took {:?}",
        t.elapsed()
    );
    clean
}

#[test]
fn every_seed_ends_the_session() {
    let seeds = frontend_seeds();
    assert!(seeds.len() >= 8);
    for (name, data) in &seeds {
        within(Duration::from_secs(10), name, data);
    }
    // A well-formed handshake then a hang-up is a clean end (on a thread of its own: a new
    // daemon, not one an earlier connection left owned).
    let (_, handshake) = seeds
        .iter()
        .find(|(n, _)| n == "handshake")
        .unwrap()
        .clone();
    let clean = std::thread::spawn(move || run_frontend(&handshake))
        .join()
        .unwrap();
    assert!(clean, "a clean hang-up after the handshake");
}

#[test]
fn garbage_and_unknown_requests_end_the_session() {
    // Unknown request codes, a zero-size config read, bytes that are no header at all.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut noise = vec![0u8; 4096];
    for b in noise.iter_mut() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *b = state as u8;
    }
    for (what, data) in [
        ("unknown request", message(0xdead, true, &[1, 2, 3])),
        ("zero-size config", message(24, false, &[0; 12])),
        ("noise", noise),
        ("empty", Vec::new()),
    ] {
        within(Duration::from_secs(10), what, &data);
    }
}

#[test]
fn sessions_leave_no_descriptors_behind() {
    let fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    let seeds = frontend_seeds();
    for (_, data) in &seeds {
        run_frontend(data);
    }
    let before = fds();
    for _ in 0..20 {
        for (_, data) in &seeds {
            run_frontend(data);
        }
    }
    // One daemon per thread serves every connection: nothing grows per connection.
    let after = fds();
    assert!(
        after <= before + 2,
        "{before} descriptors before 20 rounds, {after} after"
    );
}
