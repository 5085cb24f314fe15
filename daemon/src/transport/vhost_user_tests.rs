//! Unit tests of the vhost-user backend: chains, threads, config space (`vhost_user.rs`).

use super::*;
use crate::protocol::abi::{opcode, InHeader, OutHeader};
use crate::protocol::iobuf::{Reader, Writer};
use crate::protocol::mapper::NoMapper;
use crate::protocol::server::ServerOptions;
use crate::testing::memfs::MemFs;
use crate::transport::vring_chain::{split_chain, Split};
use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};

const MEM: usize = 0x20_0000;

fn mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap()
}

fn desc(addr: u64, len: u32, write: bool) -> RawDescriptor {
    let flags = if write { VRING_DESC_F_WRITE as u16 } else { 0 };
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0))
}

/// The transport's walk of `chain` (checked against the reference walk).
fn walk<'m>(
    m: &'m GuestMemoryMmap,
    vq: &MockSplitQueue<GuestMemoryMmap>,
    chain: virtio_queue::DescriptorChain<&GuestMemoryMmap>,
) -> Result<Split<'m>, String> {
    let at = ChainAt {
        table: vq.desc_table_addr().0,
        size: 16,
        head: chain.head_index(),
    };
    let fast = crate::transport::vring_chain::walk_chain(m, at, None);
    assert_eq!(fast.is_ok(), split_chain(m, chain).is_ok());
    fast
}

fn backend() -> FsBackend<MemFs> {
    let server = Arc::new(Server::new(
        MemFs::new().unwrap(),
        Box::new(NoMapper),
        ServerOptions::default(),
    ));
    let cfg = FsBackendConfig {
        tag: Some("fs".into()),
        request_queues: 2,
        thread_pool_size: 0,
        notify: None,
    };
    FsBackend::new(server, &cfg, None).unwrap()
}

/// Runs one chain through the transport; returns the used length.
fn run(m: &GuestMemoryMmap, descs: &[RawDescriptor]) -> u32 {
    let vq = MockSplitQueue::new(m, 16);
    let chain = vq.build_desc_chain(descs).unwrap();
    let b = backend();
    match walk(m, &vq, chain) {
        Ok((r, w)) => {
            let w = (!w.is_empty()).then(|| Writer::with_far(w, None));
            b.server()
                .handle(Reader::with_far(r, None), w)
                .map(|h| h.written as u32)
                .unwrap_or(0)
        }
        Err(_) => 0,
    }
}

fn put_init(m: &GuestMemoryMmap, at: u64) -> u32 {
    let hdr = InHeader {
        len: 40 + 64,
        opcode: opcode::INIT,
        unique: 7,
        ..Default::default()
    };
    m.write_obj(hdr, GuestAddress(at)).unwrap();
    let init = crate::protocol::abi::InitIn {
        major: 7,
        minor: 41,
        ..Default::default()
    };
    m.write_obj(init, GuestAddress(at + 40)).unwrap();
    40 + 64
}

/// The queue thread keeps only requests that end by themselves soon
/// ([`crate::protocol::policy`]). COPY_FILE_RANGE (up to 4 GiB copied on the host) was
/// missing: it ran on the queue's thread and held back every request behind it.
#[test]
fn waiting_and_long_requests_leave_the_queue_thread() {
    // MemFs keeps the default: a FLUSH may write back.
    let b = backend();
    let may_block = |o: u32| {
        let hdr = InHeader {
            opcode: o,
            nodeid: 1,
            ..Default::default()
        };
        b.server.wait(&hdr) != Wait::Short
    };
    for o in [
        opcode::SETLKW,
        opcode::FSYNC,
        opcode::FSYNCDIR,
        opcode::SYNCFS,
        opcode::FLUSH,
        opcode::FALLOCATE,
        opcode::COPY_FILE_RANGE,
    ] {
        assert!(may_block(o), "{}", opcode::name(o));
    }
    for o in [opcode::SETLK, opcode::READ, opcode::WRITE, opcode::RELEASE] {
        assert!(!may_block(o), "{}", opcode::name(o));
    }
}

#[test]
fn request_split_across_descriptors_is_served() {
    let m = mem();
    let len = put_init(&m, 0x10_0000);
    // The request in two readable pieces, the reply in two writable pieces.
    let descs = [
        desc(0x10_0000, 10, false),
        desc(0x10_0000 + 10, len - 10, false),
        desc(0x18_0000, 8, true),
        desc(0x19_0000, 4096, true),
    ];
    assert_eq!(run(&m, &descs), 16 + 64);
    let out: OutHeader = m.read_obj(GuestAddress(0x18_0000)).unwrap();
    assert_eq!(out.len, 16 + 64);
    // The header's second half (`unique`) landed in the second writable descriptor.
    let unique: u64 = m.read_obj(GuestAddress(0x19_0000)).unwrap();
    assert_eq!(unique, 7);
    assert_eq!(out.error, 0);
}

#[test]
fn malformed_chains_are_dropped() {
    let m = mem();
    let len = put_init(&m, 0x10_0000);
    let reply = desc(0x18_0000, 4096, true);
    // Writable before readable.
    let vq = MockSplitQueue::new(&m, 16);
    let chain = vq
        .build_desc_chain(&[reply, desc(0x10_0000, len, false)])
        .unwrap();
    assert!(walk(&m, &vq, chain)
        .unwrap_err()
        .contains("after a writable"));
    // Pointing outside guest memory.
    let vq = MockSplitQueue::new(&m, 16);
    let chain = vq
        .build_desc_chain(&[desc(MEM as u64 - 8, 64, false), reply])
        .unwrap();
    assert!(walk(&m, &vq, chain)
        .unwrap_err()
        .contains("outside guest memory"));
    let vq = MockSplitQueue::new(&m, 16);
    let chain = vq
        .build_desc_chain(&[desc(u64::MAX - 8, 64, false), reply])
        .unwrap();
    assert!(walk(&m, &vq, chain).is_err());
    // No readable part.
    let vq = MockSplitQueue::new(&m, 16);
    let chain = vq.build_desc_chain(&[reply]).unwrap();
    assert!(walk(&m, &vq, chain).is_err());
}

#[test]
fn short_chains_get_no_reply_and_no_panic() {
    let m = mem();
    let len = put_init(&m, 0x10_0000);
    // Header cut short: dropped.
    assert_eq!(
        run(
            &m,
            &[desc(0x10_0000, 20, false), desc(0x18_0000, 4096, true)]
        ),
        0
    );
    // No room for a reply header: dropped.
    assert_eq!(
        run(&m, &[desc(0x10_0000, len, false), desc(0x18_0000, 8, true)]),
        0
    );
    // Reply room for the header only: an error reply fits.
    assert_eq!(
        run(
            &m,
            &[desc(0x10_0000, len, false), desc(0x18_0000, 16, true)]
        ),
        16
    );
    let out: OutHeader = m.read_obj(GuestAddress(0x18_0000)).unwrap();
    assert_eq!(out.error, -libc::ENOBUFS);
}

/// Every queue is served by exactly one thread, and the event number vhost-user-backend
/// gives its kick there (the rank of its bit in the thread's mask) leads back to it.
#[test]
fn every_queue_has_one_thread_and_its_events_lead_back_to_it() {
    for shared in [2, 3] {
        for n in 1..=10 {
            for threads in 1..=12 {
                let masks = thread_masks(n, shared, threads);
                let want = threads.min(n.max(shared) - shared + 1);
                assert_eq!(masks.len(), want, "{n} queues, {threads} threads");
                for q in 0..n {
                    let owners: Vec<usize> = (0..masks.len())
                        .filter(|&t| masks[t] >> q & 1 == 1)
                        .collect();
                    assert_eq!(owners.len(), 1, "queue {q} of {n}");
                    let t = owners[0];
                    // vhost-user-backend's rule (handler.rs, set_vring_kick).
                    let evt = masks[t].count_ones() - (masks[t] >> q).count_ones();
                    assert_eq!(queue_of(&masks, t, evt as u16), q, "queue {q} of {n}");
                }
                assert!(masks.iter().all(|&m| m != 0), "an idle thread");
            }
        }
    }
    assert_eq!(thread_masks(3, 2, 8), vec![0b11, 0b100]);
    assert_eq!(thread_masks(4, 3, 8), vec![0b111, 0b1000]);
    // One thread (2 CPUs): every queue on it; two: the further queues in turn.
    assert_eq!(thread_masks(5, 2, 1), vec![0b11111]);
    assert_eq!(thread_masks(5, 2, 2), vec![0b01011, 0b10100]);
    assert_eq!(queue_of(&[0b1011], 0, 2), 3);
    assert_eq!(queue_of(&[0b1011], 0, 3), 64, "no such event");
}

#[test]
fn config_space_and_features() {
    let b = backend();
    let cfg = b.get_config(0, 40);
    assert_eq!(&cfg[..2], b"fs");
    assert_eq!(u32::from_le_bytes(cfg[36..40].try_into().unwrap()), 2);
    assert_eq!(b.get_config(36, 4), 2u32.to_le_bytes());
    assert!(b.get_config(30, 20).is_empty(), "out-of-range read refused");
    assert!(b.get_config(u32::MAX, 2).is_empty());
    assert_eq!(b.num_queues(), 3);
    assert!(b
        .protocol_features()
        .contains(VhostUserProtocolFeatures::CONFIG));
    assert!(!b
        .protocol_features()
        .contains(VhostUserProtocolFeatures::SHMEM));
    assert!(b.get_shmem_config().is_err());
    let server = Arc::new(Server::new(
        MemFs::new().unwrap(),
        Box::new(NoMapper),
        ServerOptions::default(),
    ));
    let cfg = FsBackendConfig {
        tag: None,
        request_queues: 1,
        thread_pool_size: 0,
        notify: None,
    };
    let b = FsBackend::new(server, &cfg, None).unwrap();
    assert!(
        !b.protocol_features()
            .contains(VhostUserProtocolFeatures::CONFIG),
        "no tag, no CONFIG (QEMU 7.x)"
    );
    assert!(b.get_config(0, 40).is_empty());
}
