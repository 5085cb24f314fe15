//! The file server's end of the keeper (`--restartable`): entries go to the holder over a
//! `SOCK_SEQPACKET` socket, one message each (see [`crate::protocol::keeper`]); at start, the
//! entries a dead server kept come back over it, ended by [`OP_END`].
//!
//! A message: `op` (u8), kind (u8), two bytes of padding, the meta length (u32 LE), two ids
//! (u64 LE each), the meta bytes; at most one descriptor with it.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::protocol::keeper::{Keeper, Kept, KeptEntry};

pub const OP_KEEP: u8 = 1;
pub const OP_RELEASE: u8 = 2;
pub const OP_CLEAR: u8 = 3;
/// Holder to server: one entry kept by a server before.
pub const OP_ENTRY: u8 = 4;
/// Holder to server: no more entries.
pub const OP_END: u8 = 5;
/// Largest meta an entry carries.
pub const MAX_META: usize = 256;
const HEAD: usize = 24;

/// The environment variable with the number of the inherited keeper socket.
pub const KEEPER_ENV: &str = "DAXFSD_HOLDER_KEEPER";

/// One decoded message.
pub struct Message {
    pub op: u8,
    pub what: Option<Kept>,
    pub meta: Vec<u8>,
    pub fd: Option<OwnedFd>,
}

/// Encodes and sends one message.
pub fn send(
    sock: &UnixDatagram,
    op: u8,
    what: Option<Kept>,
    meta: &[u8],
    fd: Option<RawFd>,
) -> io::Result<()> {
    let (kind, id, id2) = what.map_or((0, 0, 0), Kept::to_wire);
    let mut buf = Vec::with_capacity(HEAD + meta.len());
    buf.extend_from_slice(&[op, kind, 0, 0]);
    buf.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    buf.extend_from_slice(&id.to_le_bytes());
    buf.extend_from_slice(&id2.to_le_bytes());
    buf.extend_from_slice(meta);
    let fds: Vec<RawFd> = fd.into_iter().collect();
    sock.send_with_fds(&[&buf[..]], &fds)
        .map(|_| ())
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))
}

/// Receives one message; `None` when the peer closed.
pub fn recv(sock: &UnixDatagram) -> io::Result<Option<Message>> {
    let mut buf = [0u8; HEAD + MAX_META];
    let mut raw = [-1 as RawFd; 1];
    let mut iov = [libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }];
    // SAFETY: the iovec points to `buf`, which outlives the call and may take any bytes.
    let (n, nfds) = unsafe { sock.recv_with_fds(&mut iov, &mut raw) }
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    let fd = crate::host::holder::received(&raw[..nfds]).pop();
    if n == 0 {
        return Ok(None);
    }
    if n < HEAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "short keeper message",
        ));
    }
    let len = u32::from_le_bytes(buf[4..8].try_into().unwrap()) as usize;
    if HEAD + len > n {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "keeper message meta cut short",
        ));
    }
    let id = u64::from_le_bytes(buf[8..16].try_into().unwrap());
    let id2 = u64::from_le_bytes(buf[16..24].try_into().unwrap());
    Ok(Some(Message {
        op: buf[0],
        what: Kept::from_wire(buf[1], id, id2),
        meta: buf[HEAD..HEAD + len].to_vec(),
        fd,
    }))
}

/// A new connected `SOCK_SEQPACKET` pair (close-on-exec).
pub fn seqpacket_pair() -> io::Result<(UnixDatagram, UnixDatagram)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array for socketpair to fill.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair just created both descriptors; each is owned once, here.
    Ok(unsafe {
        (
            UnixDatagram::from_raw_fd(fds[0]),
            UnixDatagram::from_raw_fd(fds[1]),
        )
    })
}

/// The server's link to its holder.
pub struct KeeperLink {
    sock: UnixDatagram,
}

impl KeeperLink {
    /// The link a holder started this server with, if any.
    pub fn inherited() -> io::Result<Option<Self>> {
        Ok(
            crate::host::holder::inherited(KEEPER_ENV)?.map(|fd| KeeperLink {
                sock: UnixDatagram::from(fd),
            }),
        )
    }

    /// The entries kept by the servers before this one.
    pub fn fetch(&self) -> io::Result<Vec<KeptEntry>> {
        let mut out = Vec::new();
        loop {
            match recv(&self.sock)? {
                None => return Err(io::Error::other("the holder closed the keeper socket")),
                Some(m) if m.op == OP_END => return Ok(out),
                Some(Message {
                    op: OP_ENTRY,
                    what: Some(what),
                    meta,
                    fd,
                }) => out.push((what, meta, fd)),
                Some(m) => log::warn!("keeper: unexpected message {} at start", m.op),
            }
        }
    }

    fn send(&self, op: u8, what: Option<Kept>, meta: &[u8], fd: Option<BorrowedFd<'_>>) {
        if let Err(e) = send(&self.sock, op, what, meta, fd.map(|f| f.as_raw_fd())) {
            log::error!("keeper: cannot reach the holder ({e}); a crash now loses the session");
        }
    }
}

impl Keeper for KeeperLink {
    fn keep(&self, what: Kept, meta: &[u8], fd: Option<BorrowedFd<'_>>) {
        self.send(OP_KEEP, Some(what), meta, fd);
    }

    fn release(&self, what: Kept) {
        self.send(OP_RELEASE, Some(what), &[], None);
    }

    fn clear(&self) {
        self.send(OP_CLEAR, None, &[], None);
    }
}
