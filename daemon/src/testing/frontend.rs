//! Fuzzing the vhost-user control channel: arbitrary bytes from a hostile or buggy frontend
//! (the VMM) on the daemon's socket, parsed by the `vhost` crate and served by
//! [`FsBackend`] over a memory file system, as `daxfsd --socket-path` serves them (no DAX
//! window, no sandbox). One input is one connection: its bytes are written to the socket as
//! they come (they may hold many messages, or cut one short), then the frontend hangs up.
//! Messages that need descriptors (SET_MEM_TABLE, SET_VRING_KICK, ...) arrive without any,
//! as from a frontend that forgot them.
//!
//! The oracle: the session ends, with an error or without, and nothing panics or hangs (the
//! fuzzer's timeout); every daemon thread stops.
//!
//! vhost-user-backend 0.24 keeps two eventfds of each `VhostUserDaemon` open for good (its
//! exit events go to epoll as raw descriptors): harmless in daxfsd, one daemon per process,
//! but a fuzzer making one per input runs out of descriptors after 10,000 inputs. So each
//! thread keeps one daemon and backend, and every input is a new connection to it, as from a
//! frontend that reconnects: an input starts from the vhost-user state the previous one left
//! (the FUSE session is reset between inputs). A crash that needs that state shows in the
//! fuzzer's log with the inputs before it.

use std::cell::RefCell;
use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::protocol::mapper::NoMapper;
use crate::protocol::server::{Server, ServerOptions};
use crate::testing::memfs::MemFs;
use crate::transport::vhost_user::{FsBackend, FsBackendConfig};

/// Input size beyond which the rest is ignored (a frontend's messages are small).
pub const MAX_INPUT: usize = 1 << 16;

type Fs = FsBackend<MemFs>;
/// A daemon and its backend, kept for the next connection.
type Kept = (VhostUserDaemon<Arc<Fs>>, Arc<Fs>);

thread_local! {
    /// One daemon per thread, connection after connection (see the module's note).
    static DAEMON: RefCell<Option<Kept>> = const { RefCell::new(None) };
}

fn new_daemon() -> Kept {
    let server = Arc::new(Server::new(
        MemFs::new().expect("memfs"),
        Box::new(NoMapper),
        ServerOptions::default(),
    ));
    let cfg = FsBackendConfig {
        tag: Some("fuzz".into()),
        request_queues: 1,
        thread_pool_size: 0,
        notify: None,
    };
    let backend = Arc::new(FsBackend::new(server, &cfg, None).expect("backend"));
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let daemon = VhostUserDaemon::new("daxfsd-fuzz".into(), backend.clone(), mem).expect("daemon");
    (daemon, backend)
}

/// Serves one frontend connection that sends `data`; returns whether the session ended as a
/// clean hang-up.
pub fn run_frontend(data: &[u8]) -> bool {
    DAEMON.with(|d| {
        let mut d = d.borrow_mut();
        let (daemon, backend) = d.get_or_insert_with(new_daemon);
        let clean = connection(daemon, data);
        backend.server().reset();
        clean
    })
}

fn connection(daemon: &mut VhostUserDaemon<Arc<Fs>>, data: &[u8]) -> bool {
    static N: AtomicU64 = AtomicU64::new(0);
    let data = &data[..data.len().min(MAX_INPUT)];
    let path = std::env::temp_dir().join(format!(
        "daxfsd-fuzz-frontend-{}-{}.sock",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).expect("bind");
    // The daemon connects (the connection waits in the listener's backlog) and starts
    // serving on a thread of its own.
    daemon
        .start_client(path.to_str().expect("utf-8 path"))
        .expect("connect");
    let (mut frontend, _) = listener.accept().expect("accept");
    let _ = std::fs::remove_file(&path);
    // Replies are read (and dropped) all along, so a reply never blocks the daemon.
    let mut replies = frontend.try_clone().expect("clone");
    let drain = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while matches!(replies.read(&mut buf), Ok(n) if n > 0) {}
    });
    let _ = frontend.write_all(data);
    let _ = frontend.shutdown(std::net::Shutdown::Write);
    let ended = daemon.wait();
    drop(frontend);
    let _ = drain.join();
    // As `daxfsd` reads it: a hang-up (between messages or within one) is a clean end.
    matches!(
        ended,
        Ok(())
            | Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            ))
    )
}

/// One frontend message: header (request, flags with version 1, payload size), payload.
pub fn message(request: u32, need_reply: bool, payload: &[u8]) -> Vec<u8> {
    let flags: u32 = 0x1 | if need_reply { 0x8 } else { 0 };
    let mut m = Vec::with_capacity(12 + payload.len());
    m.extend_from_slice(&request.to_le_bytes());
    m.extend_from_slice(&flags.to_le_bytes());
    m.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    m.extend_from_slice(payload);
    m
}

/// Seed connections: the handshake QEMU 11.1 makes with the generic vhost-user device, and
/// variations (vring set-up without descriptors, resets, device state, shared memory).
pub fn frontend_seeds() -> Vec<(String, Vec<u8>)> {
    const GET_FEATURES: u32 = 1;
    const SET_FEATURES: u32 = 2;
    const SET_OWNER: u32 = 3;
    const SET_VRING_NUM: u32 = 8;
    const SET_VRING_ADDR: u32 = 9;
    const SET_VRING_BASE: u32 = 10;
    const GET_VRING_BASE: u32 = 11;
    const GET_PROTOCOL_FEATURES: u32 = 15;
    const SET_PROTOCOL_FEATURES: u32 = 16;
    const GET_QUEUE_NUM: u32 = 17;
    const SET_VRING_ENABLE: u32 = 18;
    const GET_CONFIG: u32 = 24;
    const SET_CONFIG: u32 = 25;
    const RESET_DEVICE: u32 = 34;
    const GET_MAX_MEM_SLOTS: u32 = 36;
    const SET_DEVICE_STATE_FD: u32 = 42;
    const CHECK_DEVICE_STATE: u32 = 43;
    const GET_SHMEM_CONFIG: u32 = 44;
    let u64le = |v: u64| v.to_le_bytes().to_vec();
    let state = |index: u32, num: u32| {
        let mut p = index.to_le_bytes().to_vec();
        p.extend_from_slice(&num.to_le_bytes());
        p
    };
    // VhostUserConfig: offset, size, flags, then the bytes.
    let config = |offset: u32, size: u32| {
        let mut p = offset.to_le_bytes().to_vec();
        p.extend_from_slice(&size.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&vec![0u8; size as usize]);
        p
    };
    let handshake = [
        message(GET_FEATURES, false, &[]),
        message(GET_PROTOCOL_FEATURES, false, &[]),
        message(
            SET_PROTOCOL_FEATURES,
            false,
            &u64le((1 << 0) | (1 << 3) | (1 << 9) | (1 << 13) | (1 << 15)),
        ),
        message(GET_QUEUE_NUM, false, &[]),
        message(SET_OWNER, false, &[]),
        message(GET_MAX_MEM_SLOTS, false, &[]),
        message(GET_CONFIG, false, &config(0, 40)),
        message(SET_FEATURES, false, &u64le((1 << 32) | (1 << 30))),
    ]
    .concat();
    let mut vring = handshake.clone();
    for q in 0..2 {
        vring.extend(message(SET_VRING_NUM, true, &state(q, 1024)));
        vring.extend(message(SET_VRING_BASE, true, &state(q, 0)));
        // VhostUserVringAddrFlags + index, flags, desc, used, avail, log addresses.
        let mut addr = q.to_le_bytes().to_vec();
        addr.extend_from_slice(&0u32.to_le_bytes());
        for a in [0x1000u64, 0x2000, 0x3000, 0] {
            addr.extend_from_slice(&a.to_le_bytes());
        }
        vring.extend(message(SET_VRING_ADDR, true, &addr));
        vring.extend(message(SET_VRING_ENABLE, true, &state(q, 1)));
    }
    vring.extend(message(GET_VRING_BASE, false, &state(1, 0)));
    let mut seeds = vec![
        ("handshake".to_string(), handshake.clone()),
        ("vring-setup-no-fds".to_string(), vring),
        (
            "reset".to_string(),
            [handshake.clone(), message(RESET_DEVICE, true, &[])].concat(),
        ),
        (
            "config-out-of-range".to_string(),
            [
                handshake.clone(),
                message(GET_CONFIG, false, &config(36, 255)),
                message(SET_CONFIG, true, &config(0, 4)),
            ]
            .concat(),
        ),
        (
            "device-state-no-fd".to_string(),
            [
                handshake.clone(),
                message(SET_DEVICE_STATE_FD, false, &state(0, 0)),
                message(CHECK_DEVICE_STATE, false, &[]),
            ]
            .concat(),
        ),
        (
            "shmem-config".to_string(),
            [handshake.clone(), message(GET_SHMEM_CONFIG, false, &[])].concat(),
        ),
        (
            "truncated".to_string(),
            handshake[..handshake.len() - 5].to_vec(),
        ),
        (
            "huge-size".to_string(),
            [handshake, {
                let mut m = message(GET_CONFIG, false, &config(0, 40));
                m[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
                m
            }]
            .concat(),
        ),
    ];
    seeds.sort();
    seeds
}
