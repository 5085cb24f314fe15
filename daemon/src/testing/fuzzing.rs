//! Fuzzing harness shared by the `fuzz/` targets and the corpus replay test.
//!
//! An input is a sequence of records, each one request:
//! `[shape: u8][len: u16 le][len bytes of request]`. `shape` picks how the request is cut
//! into readable slices and how much reply room it gets, so the server sees requests split
//! at arbitrary points and replies that do not fit. Every input runs against a fresh server
//! that has already negotiated INIT, so fuzzing starts past the handshake.

use std::io;

use vm_memory::{ByteValued, VolatileSlice};

use crate::protocol::abi::{self, InHeader, InitIn};
use crate::protocol::filesystem::FileSystem;
use crate::protocol::iobuf::{Reader, Writer};
use crate::protocol::server::{Server, ServerOptions};
use crate::testing::recording::RecordingMapper;

mod seeds;
pub use seeds::seeds;

/// Reply room a record can ask for (indexed by the low bits of `shape`).
const REPLY_ROOM: [usize; 8] = [0, 8, 16, 24, 128, 4096, 8192, 1 << 20];
/// DAX window of the harness's recording mapper.
pub const WINDOW: u64 = 64 << 20;

/// One decoded record.
pub struct Record<'a> {
    pub shape: u8,
    pub bytes: &'a [u8],
}

/// Splits an input into records; a truncated tail becomes a shorter last record.
pub fn records(mut data: &[u8]) -> Vec<Record<'_>> {
    let mut out = Vec::new();
    while data.len() >= 3 {
        let shape = data[0];
        let len = usize::from(u16::from_le_bytes([data[1], data[2]]));
        let rest = &data[3..];
        let n = len.min(rest.len());
        out.push(Record {
            shape,
            bytes: &rest[..n],
        });
        data = &rest[n..];
    }
    out
}

/// Encodes requests as one input (the inverse of [`records`]).
pub fn encode(reqs: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (shape, bytes) in reqs {
        let len = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
        out.push(*shape);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&bytes[..usize::from(len)]);
    }
    out
}

/// Runs one request through `server`, cut according to `shape`.
pub fn run_record<F: FileSystem>(server: &Server<F>, rec: &Record) -> io::Result<usize> {
    let mut req = rec.bytes.to_vec();
    // Up to three cut points derived from the shape and the length.
    let cuts = usize::from(rec.shape >> 6);
    let mut pieces: Vec<&mut [u8]> = Vec::new();
    let mut rest: &mut [u8] = &mut req;
    for i in 0..cuts {
        let at = if rest.is_empty() {
            0
        } else {
            (usize::from(rec.shape) * (i + 7)) % rest.len()
        };
        let (a, b) = std::mem::take(&mut rest).split_at_mut(at);
        pieces.push(a);
        rest = b;
    }
    pieces.push(rest);
    let readable: Vec<VolatileSlice> = pieces.into_iter().map(VolatileSlice::from).collect();
    let mut reply = vec![0u8; REPLY_ROOM[usize::from(rec.shape & 7)]];
    let w =
        (!reply.is_empty()).then(|| Writer::new(vec![VolatileSlice::from(reply.as_mut_slice())]));
    server.handle(Reader::new(readable), w).map(|h| h.written)
}

/// A request: header plus `args`, with `len` set to the real size.
pub fn request(opcode: u32, nodeid: u64, args: &[&[u8]]) -> Vec<u8> {
    let body: usize = args.iter().map(|a| a.len()).sum();
    let hdr = InHeader {
        len: u32::try_from(std::mem::size_of::<InHeader>() + body).unwrap_or(u32::MAX),
        opcode,
        unique: 1,
        nodeid,
        ..Default::default()
    };
    let mut v = hdr.as_slice().to_vec();
    for a in args {
        v.extend_from_slice(a);
    }
    v
}

/// A fresh server over `fs` with a recording mapper, past INIT.
pub fn server<F: FileSystem>(fs: F) -> Server<F> {
    let s = Server::new(
        fs,
        Box::new(RecordingMapper::new(WINDOW)),
        ServerOptions::default(),
    );
    let init = InitIn {
        major: abi::KERNEL_VERSION,
        minor: abi::KERNEL_MINOR_VERSION,
        max_readahead: 1 << 20,
        flags: u32::MAX,
        flags2: u32::MAX,
        ..Default::default()
    };
    let rec_bytes = request(abi::opcode::INIT, 0, &[init.as_slice()]);
    let rec = Record {
        shape: 7,
        bytes: &rec_bytes,
    };
    if let Err(e) = run_record(&s, &rec) {
        log::error!("fuzz harness INIT failed: {e}");
    }
    s
}

/// Runs a whole input against a fresh server over `fs`.
pub fn run_input<F: FileSystem>(fs: F, data: &[u8]) {
    let s = server(fs);
    for rec in records(data) {
        // Errors are the point of fuzzing; only a panic, hang or OOM is a finding.
        let _ = run_record(&s, &rec);
    }
    s.reset();
}

/// The passthrough filesystem over `dir` with every optional feature on (xattrs included).
pub fn passthrough_fs(dir: &std::path::Path) -> io::Result<crate::passthrough::PassthroughFs> {
    crate::passthrough::PassthroughFs::new(crate::passthrough::Config {
        root_dir: dir.to_path_buf(),
        xattr: true,
        posix_acl: true,
        security_label: true,
        ..Default::default()
    })
}

/// Removes everything inside `dir` (not `dir` itself), so each input starts empty.
pub fn empty_dir(dir: &std::path::Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            let r = match e.file_type() {
                Ok(t) if t.is_dir() => std::fs::remove_dir_all(&p),
                _ => std::fs::remove_file(&p),
            };
            if let Err(err) = r {
                log::warn!("cannot clean {}: {err}", p.display());
            }
        }
    }
}

/// Guest memory of the chain harness; queue structures at 0, request data from `DATA`.
#[cfg(any(test, feature = "fuzzing"))]
const CHAIN_MEM: usize = 2 << 20;
#[cfg(any(test, feature = "fuzzing"))]
const DATA: u64 = 1 << 20;

/// An arbitrary descriptor chain through the transport and the server:
/// `[n][n x (addr: u32 le, len: u16 le, flags: u8)][guest memory contents...]`, stored as
/// entries 0..n of a 16-entry descriptor table, head 0. Flags bit 0 marks the descriptor
/// device-writable; bit 1 makes `addr` absolute (so it may point at the queue itself or
/// outside guest memory) instead of relative to the data area; bit 2 makes it refer to an
/// indirect table; bit 3 sets NEXT with `next` = bits 4..7 (any index, so loops and
/// out-of-range links too). Without bit 3, entries link to the following one and the last ends
/// the chain. The transport's walk must agree exactly with `virtio-queue`'s own chain iterator.
///
/// Then the queue thread's path: the chain is decoded once (a chain without a header is
/// dropped). With bit 3 of the count byte it is served as a pool thread serves it (from the
/// [`Walked`](crate::transport::vhost_user) copy) after the guest has rewritten its descriptor
/// table and every request byte; otherwise as the queue thread serves it. Either way a reply
/// must answer the decoded header's `unique`: nothing reads the header again.
#[cfg(any(test, feature = "fuzzing"))]
pub fn run_chain(data: &[u8]) -> Option<usize> {
    use virtio_bindings::bindings::virtio_ring::{
        VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    };
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::{Queue, QueueT};
    use vm_memory::{
        Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend,
        GuestMemoryMmap,
    };

    use crate::protocol::abi::OutHeader;
    use crate::transport::vhost_user::{decode, serve, GuestMemoryLogged, Walked};
    use crate::transport::vring_chain::{split_chain, walk_chain, ChainAt};

    const QSIZE: u16 = 16;
    let (&n, rest) = data.split_first()?;
    let pooled = n & 8 != 0;
    let n = usize::from(n % 8) + 1;
    let table = rest.get(..n * 7)?;
    let contents = &rest[n * 7..];
    let atomic = GuestMemoryAtomic::new(
        GuestMemoryLogged::from_ranges(&[(GuestAddress(0), CHAIN_MEM)]).ok()?,
    );
    let guard = atomic.memory();
    let mem: &GuestMemoryMmap<_> = &guard;
    let len = contents.len().min(CHAIN_MEM - DATA as usize);
    mem.write_slice(&contents[..len], GuestAddress(DATA)).ok()?;
    let vq = MockSplitQueue::new(mem, QSIZE);
    for (i, d) in table.chunks_exact(7).enumerate() {
        let addr = u64::from(u32::from_le_bytes([d[0], d[1], d[2], d[3]]));
        let dlen = u32::from(u16::from_le_bytes([d[4], d[5]]));
        let addr = if d[6] & 2 != 0 {
            addr
        } else {
            DATA + addr % (CHAIN_MEM as u64 - DATA)
        };
        let mut flags = 0;
        if d[6] & 1 != 0 {
            flags |= VRING_DESC_F_WRITE as u16;
        }
        if d[6] & 4 != 0 {
            flags |= VRING_DESC_F_INDIRECT as u16;
        }
        let next = if d[6] & 8 != 0 {
            flags |= VRING_DESC_F_NEXT as u16;
            u16::from(d[6] >> 4)
        } else if i + 1 < n {
            flags |= VRING_DESC_F_NEXT as u16;
            i as u16 + 1
        } else {
            0
        };
        let raw = RawDescriptor::from(SplitDescriptor::new(addr, dlen, flags, next));
        vq.desc_table().store(i as u16, raw).ok()?;
    }
    vq.avail().ring().ref_at(0).ok()?.store(0);
    vq.avail().idx().store(1);
    let mut q: Queue = vq.create_queue().ok()?;
    let chain = q.pop_descriptor_chain(mem)?;
    let at = ChainAt {
        table: q.desc_table(),
        size: q.size(),
        head: chain.head_index(),
    };
    let spans = |r: &Result<crate::transport::vring_chain::Split<'_>, String>| {
        r.as_ref().ok().map(|(r, w)| {
            let f = |v: &Vec<crate::protocol::iobuf::Seg<'_>>| {
                v.iter()
                    .map(|s| match s {
                        crate::protocol::iobuf::Seg::Mem(s) => {
                            (s.ptr_guard().as_ptr() as usize, s.len())
                        }
                        crate::protocol::iobuf::Seg::Far { at, len } => (*at as usize, *len),
                    })
                    .collect::<Vec<_>>()
            };
            (f(r), f(w))
        })
    };
    let fast = walk_chain(mem, at, None);
    assert_eq!(
        spans(&fast),
        spans(&split_chain(mem, chain)),
        "the transport's chain walk disagrees with virtio-queue's"
    );
    let refused = |why| crate::transport::vring_chain::Malformed {
        why,
        partial: (Vec::new(), Vec::new()),
    };
    let req = decode(fast.map_err(refused), None).ok()?;
    let unique = req.hdr.unique;
    // Where the reply's header goes, when its first buffer holds one.
    let base = mem.get_host_address(GuestAddress(0)).ok()? as usize;
    let reply = req
        .writable
        .first()
        .filter(|s| s.len() >= std::mem::size_of::<OutHeader>())
        .and_then(|s| match s {
            crate::protocol::iobuf::Seg::Mem(s) => Some(GuestAddress(
                (s.ptr_guard().as_ptr() as usize - base) as u64,
            )),
            crate::protocol::iobuf::Seg::Far { .. } => None,
        });
    let s = server(crate::testing::memfs::MemFs::new().ok()?);
    let used = if pooled {
        // SAFETY: `req` was decoded from `walk_chain` over `guard` (`mem`) above.
        let job = unsafe { Walked::of(guard.clone(), req, None) };
        // The guest rewrites its chain and its request once the queue thread has decoded it.
        mem.write_slice(
            &[0xa5; 16 * QSIZE as usize],
            GuestAddress(vq.desc_table_addr().0),
        )
        .ok()?;
        mem.write_slice(&vec![0x5a; len], GuestAddress(DATA)).ok()?;
        job.serve(&s)
    } else {
        serve(&s, mem, req, None)
    };
    if let (Some(at), true) = (reply, used as usize >= std::mem::size_of::<OutHeader>()) {
        let out: OutHeader = mem.read_obj(at).ok()?;
        assert_eq!(out.unique, unique, "the reply answers another header");
    }
    Some(used as usize)
}

/// A [`run_chain`] input carrying `req` in two readable descriptors (cut in the middle)
/// followed by one 8 KiB writable descriptor.
pub fn chain_input(req: &[u8]) -> Vec<u8> {
    let len = u16::try_from(req.len()).unwrap_or(u16::MAX);
    let half = len / 2;
    // The count byte is taken modulo 8, plus one: 2 means three descriptors.
    let mut v = vec![2u8];
    let mut desc = |addr: u32, len: u16, flags: u8| {
        v.extend_from_slice(&addr.to_le_bytes());
        v.extend_from_slice(&len.to_le_bytes());
        v.push(flags);
    };
    desc(0, half, 0);
    desc(u32::from(half), len - half, 0);
    desc(0x8_0000, 8192, 1);
    v.extend_from_slice(&req[..usize::from(len)]);
    v
}

/// The share layout of the migration-stream harness: `share/` holds `d/f`, `d/e/`, `g`
/// (a hard link of `d/f`) and `l` (a symlink); `outside/` next to it holds `secret`.
pub fn migration_world(top: &std::path::Path) -> io::Result<std::path::PathBuf> {
    let share = top.join("share");
    std::fs::create_dir_all(share.join("d/e"))?;
    std::fs::create_dir_all(top.join("outside/sub"))?;
    std::fs::write(top.join("outside/secret"), b"secret")?;
    if !share.join("d/f").exists() {
        std::fs::write(share.join("d/f"), b"hello")?;
        std::fs::hard_link(share.join("d/f"), share.join("g"))?;
        std::os::unix::fs::symlink("../outside/secret", share.join("l"))?;
    }
    Ok(share)
}

/// Host inode numbers of everything in the shared directory (the harness's oracle).
fn share_inos(share: &std::path::Path) -> std::collections::HashSet<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::HashSet::new();
    let mut todo = vec![share.to_path_buf()];
    while let Some(p) = todo.pop() {
        if let Ok(m) = std::fs::symlink_metadata(&p) {
            out.insert(m.ino());
            if m.is_dir() {
                if let Ok(rd) = std::fs::read_dir(&p) {
                    todo.extend(rd.flatten().map(|e| e.path()));
                }
            }
        }
    }
    out
}

/// A migration stream (`--migration-mode` etc. from the first byte, the stream after it)
/// loaded by a destination daemon serving `share` (see [`migration_world`]): it must never
/// panic, and every inode it lets in must be one of the share's (a GETATTR of each node id
/// the stream names answers an inode number of the share, or an error). First byte: bit 0
/// file-handles mode, bit 1 on-error guest-error, bit 2 the server past INIT (else fresh),
/// bit 3: the rest is a bare payload, framed here (magic, version, length, checksum) so the
/// fuzzer's mutations reach the decoder's fields and the import instead of the checksum.
/// Returns whether the state was taken.
pub fn run_migration_stream(share: &std::path::Path, data: &[u8]) -> bool {
    use crate::passthrough::state::{FsState, MigrationMode, MigrationOptions, OnError};
    use crate::protocol::state::DeviceState;
    let Some((&opt, stream)) = data.split_first() else {
        return false;
    };
    let framed;
    let stream = if opt & 8 != 0 {
        framed = frame(stream);
        &framed[..]
    } else {
        stream
    };
    let Ok(state) = DeviceState::<FsState>::decode_stream(stream) else {
        return false;
    };
    if state.validate().is_err() {
        return false;
    }
    let opts = MigrationOptions {
        mode: if opt & 1 != 0 {
            MigrationMode::FileHandles
        } else {
            MigrationMode::FindPaths
        },
        on_error: if opt & 2 != 0 {
            OnError::GuestError
        } else {
            OnError::Abort
        },
        ..Default::default()
    };
    let Ok(fs) = passthrough_fs(share) else {
        return false;
    };
    let s = if opt & 4 != 0 {
        server(fs)
    } else {
        Server::new(
            fs,
            Box::new(RecordingMapper::new(WINDOW)),
            ServerOptions::default(),
        )
    };
    let loaded = s.load_state(state.clone(), &opts).is_ok();
    if loaded {
        let inside = share_inos(share);
        for i in &state.fs.inodes {
            let mut rec_bytes = request(
                abi::opcode::GETATTR,
                i.id.raw(),
                &[abi::GetattrIn::default().as_slice()],
            );
            let mut reply = vec![0u8; 16 + std::mem::size_of::<abi::AttrOut>()];
            let w = Writer::new(vec![VolatileSlice::from(reply.as_mut_slice())]);
            let readable = vec![VolatileSlice::from(rec_bytes.as_mut_slice())];
            if s.handle(Reader::new(readable), Some(w)).is_ok() {
                let err = i32::from_le_bytes([reply[4], reply[5], reply[6], reply[7]]);
                if err == 0 {
                    let ino = u64::from_le_bytes(reply[32..40].try_into().unwrap_or_default());
                    assert!(
                        inside.contains(&ino),
                        "migrated inode {} is host inode {ino}, outside the shared directory",
                        i.id
                    );
                }
            }
        }
    }
    s.reset();
    loaded
}

/// A device-state stream around `payload`: magic, version, length, payload, checksum.
fn frame(payload: &[u8]) -> Vec<u8> {
    use crate::migration::format::{fnv1a64, MAGIC, VERSION};
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(&VERSION.to_le_bytes());
    v.extend_from_slice(
        &u32::try_from(payload.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    v.extend_from_slice(payload);
    v.extend_from_slice(&fnv1a64(payload).to_le_bytes());
    v
}

/// Seeds for the migration-stream target: real exports of the harness's share (find-paths,
/// with verify handles, file-handles), a stream naming `outside/` by file handle, one with
/// every negotiated bit set. `top` gets the share (see [`migration_world`]).
pub fn migration_seeds(top: &std::path::Path) -> io::Result<Vec<(String, Vec<u8>)>> {
    use crate::passthrough::state::{MigrationMode, MigrationOptions};
    use crate::protocol::filesystem::{Context, Inode};
    use std::os::fd::AsFd;
    let share = migration_world(top)?;
    let s = server(passthrough_fs(&share)?);
    let ctx = Context::default();
    let fs = s.fs();
    let name = |n: &str| std::ffi::CString::new(n).unwrap_or_default();
    let d = fs.lookup(&ctx, Inode::ROOT, &name("d"))?.inode;
    let f = fs.lookup(&ctx, d, &name("f"))?.inode;
    fs.lookup(&ctx, d, &name("e"))?;
    fs.lookup(&ctx, Inode::ROOT, &name("g"))?;
    fs.lookup(&ctx, Inode::ROOT, &name("l"))?;
    fs.open(&ctx, f, libc::O_RDWR as u32, 0)?;
    fs.opendir(&ctx, d, 0)?;
    let mut out = Vec::new();
    let modes = [
        ("find_paths", 0u8, MigrationOptions::default()),
        (
            "find_paths_verify",
            2,
            MigrationOptions {
                verify_handles: true,
                confirm_paths: true,
                ..Default::default()
            },
        ),
        (
            "file_handles",
            1 | 4,
            MigrationOptions {
                mode: MigrationMode::FileHandles,
                ..Default::default()
            },
        ),
    ];
    let mut handles_state = None;
    for (n, opt, opts) in modes {
        let st = s.save_state(&opts)?;
        let mut v = vec![opt];
        v.extend(st.encode_stream()?);
        out.push((n.to_string(), v));
        if opts.mode == MigrationMode::FileHandles {
            handles_state = Some(st);
        }
    }
    if let Some(mut st) = handles_state {
        let outside = std::fs::File::open(top.join("outside"))?;
        let h = crate::passthrough::file_handle_of(outside.as_fd())?;
        if let Some(i) = st.fs.inodes.iter_mut().find(|i| i.id == d) {
            i.location = crate::passthrough::state::Location::Handle(h);
        }
        let mut v = vec![1u8];
        v.extend(st.encode_stream()?);
        out.push(("handle_outside".into(), v));
        st.fs.negotiated = u32::MAX;
        st.session.flags = u64::MAX;
        let mut v = vec![1u8 | 4];
        v.extend(st.encode_stream()?);
        out.push(("every_flag".into(), v));
    }
    s.reset();
    // The same states as bare payloads (option bit 3: framed by the harness).
    let bare: Vec<(String, Vec<u8>)> = out
        .iter()
        .map(|(n, v)| {
            let mut b = vec![v[0] | 8];
            b.extend_from_slice(&v[1 + 16..v.len() - 8]);
            (format!("{n}_payload"), b)
        })
        .collect();
    out.extend(bare);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::memfs::MemFs;

    #[test]
    fn migration_seeds_load_and_hostile_ones_are_refused() {
        let top = tempfile::tempdir().unwrap();
        let seeds = migration_seeds(top.path()).unwrap();
        assert_eq!(seeds.len(), 10);
        let share = top.path().join("share");
        for (name, data) in &seeds {
            // Runs, and never lets an inode from outside in (the harness asserts it).
            let loaded = run_migration_stream(&share, data);
            let hostile = name.starts_with("handle_outside") || name.starts_with("every_flag");
            assert_eq!(loaded, !hostile, "{name}");
        }
    }

    #[test]
    fn records_round_trip() {
        let reqs = vec![(1u8, vec![1, 2, 3]), (200u8, vec![]), (7u8, vec![9; 300])];
        let enc = encode(&reqs);
        let dec = records(&enc);
        assert_eq!(dec.len(), 3);
        assert_eq!(dec[2].bytes, &[9; 300][..]);
        assert_eq!(dec[1].shape, 200);
        assert_eq!(records(&[1, 255, 255, 4]).len(), 1, "truncated tail kept");
    }

    #[test]
    fn seeds_exercise_the_server() {
        // Each seed runs; the create/write/read sequence really reads back its data.
        for (name, data) in seeds() {
            run_input(MemFs::new().unwrap(), &data);
            assert!(!records(&data).is_empty(), "{name}");
        }
        let s = server(MemFs::new().unwrap());
        let (_, data) = seeds()
            .into_iter()
            .find(|(n, _)| n == "seq_create_write_read")
            .unwrap();
        let recs = records(&data);
        assert_eq!(run_record(&s, &recs[0]).unwrap(), 16 + 128 + 16);
        assert_eq!(run_record(&s, &recs[1]).unwrap(), 16 + 8);
        assert_eq!(
            run_record(&s, &recs[2]).unwrap(),
            16 + 5,
            "READ returns the 5 bytes written"
        );
    }

    #[test]
    fn chains_of_every_shape_are_survived() {
        // A valid INIT split over two readable descriptors plus one writable.
        let init = request(
            abi::opcode::INIT,
            0,
            &[InitIn {
                major: 7,
                minor: 41,
                ..Default::default()
            }
            .as_slice()],
        );
        let mut input = vec![2u8];
        input.extend_from_slice(&[0, 0, 0, 0, 10, 0, 0]);
        input.extend_from_slice(&[10, 0, 0, 0, (init.len() - 10) as u8, 0, 0]);
        input.extend_from_slice(&[0, 0, 1, 0, 0, 16, 1]);
        input.extend_from_slice(&init);
        assert_eq!(run_chain(&input), Some(16 + 64));
        let mkdir = request(
            abi::opcode::MKDIR,
            abi::ROOT_ID,
            &[
                abi::MkdirIn {
                    mode: 0o755,
                    umask: 0,
                }
                .as_slice(),
                b"d\0",
            ],
        );
        assert_eq!(run_chain(&chain_input(&mkdir)), Some(16 + 128));
        // As a pool thread serves them, after the guest rewrote the table and every request
        // byte: answered from the decoded header (run_chain checks the reply's `unique`).
        for mut pooled in [input.clone(), chain_input(&mkdir)] {
            pooled[0] |= 8;
            assert!(run_chain(&pooled).is_some_and(|n| n >= 16));
        }
        // Too short for a header: dropped on either path.
        for n in [0u8, 8] {
            assert_eq!(run_chain(&[n, 0, 0, 0, 0, 39, 0, 0, 7, 7]), None);
        }
        // Absolute addresses outside memory, writable first, zero lengths, huge lengths.
        assert_eq!(run_chain(&[1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2]), None);
        assert_eq!(run_chain(&[1, 0, 0, 0, 0, 0, 0, 1]), None);
        assert_eq!(
            run_chain(&[2, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 40, 0, 0]),
            None
        );
        run_chain(&[7; 64]);
        assert_eq!(run_chain(&[]), None);
    }

    #[test]
    fn cut_requests_are_reassembled() {
        let s = server(MemFs::new().unwrap());
        let req = request(
            abi::opcode::MKDIR,
            abi::ROOT_ID,
            &[
                abi::MkdirIn {
                    mode: 0o755,
                    umask: 0,
                }
                .as_slice(),
                b"dir\0",
            ],
        );
        // 3 cuts (shape >> 6 == 3), reply room 4096.
        let rec = Record {
            shape: 0xc5,
            bytes: &req,
        };
        assert_eq!(run_record(&s, &rec).unwrap(), 16 + 128);
    }
}
