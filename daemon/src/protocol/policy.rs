//! How long a request may hold the thread that serves it: the one opcode policy every
//! transport schedules by (vhost-user queues, `/dev/fuse` workers, io_uring rings).
//!
//! Three classes, decided by what the request does on the host, not by how long it usually
//! takes:
//!
//! - [`Wait::Indefinite`]: waits for something only another request or process can end.
//!   Such a request must never hold a thread that the request ending its wait may need,
//!   and gives up with `EINTR` on [`FileSystem::interrupt_waits`].
//! - [`Wait::Long`]: bounded, but by storage rather than by the request: it writes back data
//!   whose amount the request does not bound (a whole file, a whole filesystem, a range of
//!   gigabytes). Fine to wait for, not on a thread other requests queue behind.
//! - [`Wait::Short`]: everything else: metadata operations and I/O bounded by the
//!   negotiated `max_write`. Runs wherever the transport read it.
//!
//! What each transport does with the classes is its own (vhost-user: a pool of threads for
//! each of the two classes that leave the queue's thread, so that lock waits never take the
//! threads the request ending them needs; /dev/fuse: `may_block` and `maybe_wake`); the
//! classes are decided here only.
//!
//! [`FileSystem::interrupt_waits`]: crate::protocol::filesystem::FileSystem::interrupt_waits

use crate::protocol::abi::opcode as op;

/// How long a request may take, by what it does on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Bounded by the request itself: runs inline.
    Short,
    /// Bounded by storage, not by the request: writes back data it does not bound.
    Long,
    /// Unbounded: waits for another lock owner.
    Indefinite,
}

/// Requests that may wait indefinitely, and why.
///
/// - SETLKW: waits until another owner drops a conflicting lock. That owner may be the
///   guest process whose UNLOCK, FLUSH or RELEASE is queued behind this very request.
pub const INDEFINITE: &[u32] = &[op::SETLKW];

/// Requests that may take long, and why.
///
/// - FSYNC: `fsync(2)` writes back every dirty page of the file and waits for the device
///   (or the NFS server); the DAX decorator writes the inode's shadow tails back first.
/// - FSYNCDIR: `fsync(2)` of a directory; a guest `sync` sends it for the root, and the DAX
///   decorator then writes back every tail of the share.
/// - SYNCFS: `syncfs(2)` writes back the whole host filesystem.
/// - FLUSH: a host `close(2)` of a duplicate of the file's descriptor, which runs the host
///   filesystem's flush: NFS writes back all of the file's dirty data and waits for it, a
///   FUSE filesystem on the host round-trips to its own server, and the close drops the
///   owner's POSIX locks (the DAX decorator also writes back the inode's tails). On NFS
///   and FUSE it takes as long as an FSYNC; without a `flush` it is short, so the
///   vhost-user transport asks [`crate::protocol::server::Server::wait`], which asks the
///   filesystem (`flush_writes_back`; passthrough: not on ext2/3/4, xfs, btrfs, tmpfs, which
///   have no `flush`): a `--cache never` tree unpack of 1,437 files, each closed once, ran
///   0.4-0.8 s faster (3 of 3 boots) with its FLUSHes on the queue's thread.
/// - FALLOCATE: a range of up to 2^63 bytes: zeroing or allocating it on filesystems
///   without unwritten extents (or over NFS) writes or sends every block of it.
/// - COPY_FILE_RANGE: copies up to 4 GiB (the reply's 32-bit count) on the host in one
///   call; across host filesystems, or on ones without reflinks, byte by byte.
///
/// Not here, though they touch the disk: READ and WRITE (at most `max_write` bytes, even
/// with `O_SYNC`), RELEASE (its host close follows the FLUSH that wrote the file back, so
/// it finds little to write), OPEN with `O_TRUNC` and SETATTR of the size (freeing blocks
/// is metadata work), DESTROY (closing every handle may flush, but nothing can be queued
/// behind the session's last request), and SETUPMAPPING (a round trip to the VMM's main
/// loop, which never needs a queue's thread).
pub const LONG: &[u32] = &[
    op::FSYNC,
    op::FSYNCDIR,
    op::SYNCFS,
    op::FLUSH,
    op::FALLOCATE,
    op::COPY_FILE_RANGE,
];

/// The class of `opcode` (unknown opcodes are [`Wait::Short`]: the server fails them at
/// once).
pub fn wait(opcode: u32) -> Wait {
    if INDEFINITE.contains(&opcode) {
        Wait::Indefinite
    } else if LONG.contains(&opcode) {
        Wait::Long
    } else {
        Wait::Short
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lock_waits_are_indefinite() {
        assert_eq!(wait(op::SETLKW), Wait::Indefinite);
        // The non-waiting lock calls fail at once with EAGAIN instead.
        assert_eq!(wait(op::SETLK), Wait::Short);
        assert_eq!(wait(op::GETLK), Wait::Short);
    }

    #[test]
    fn writebacks_are_long() {
        for o in [op::FSYNC, op::FSYNCDIR, op::SYNCFS, op::FALLOCATE] {
            assert_eq!(wait(o), Wait::Long, "{}", op::name(o));
        }
        // What the /dev/fuse wake-up and io_uring lists missed: a host close can write back
        // a whole file, and a copy is as large as the guest asks.
        assert_eq!(wait(op::FLUSH), Wait::Long);
        assert_eq!(wait(op::COPY_FILE_RANGE), Wait::Long);
    }

    #[test]
    fn requests_bounded_by_themselves_run_inline() {
        for o in [
            op::LOOKUP,
            op::GETATTR,
            op::READ,
            op::WRITE,
            op::OPEN,
            op::CREATE,
            op::RELEASE,
            op::READDIRPLUS,
            op::SETUPMAPPING,
            op::REMOVEMAPPING,
            op::FORGET,
            op::INTERRUPT,
            op::DESTROY,
            u32::MAX,
        ] {
            assert_eq!(wait(o), Wait::Short, "{}", op::name(o));
        }
        assert_ne!(wait(op::SETLKW), Wait::Short);
        assert_ne!(wait(op::FLUSH), Wait::Short);
    }

    #[test]
    fn no_opcode_is_in_two_classes() {
        assert!(INDEFINITE.iter().all(|o| !LONG.contains(o)));
    }
}
