//! Driver side of a split virtqueue (virtio 1.x, section 2.7): descriptor table, available
//! ring and used ring in guest memory, a kick eventfd we signal and a call eventfd the backend
//! signals. Any number of threads may submit to and wait on one queue.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vm_memory::ByteValued;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::memory::{Block, GuestMem};

/// `VIRTQ_DESC_F_NEXT`.
pub const DESC_F_NEXT: u16 = 1;
/// `VIRTQ_DESC_F_WRITE`: device-writable.
pub const DESC_F_WRITE: u16 = 2;
/// `VIRTQ_DESC_F_INDIRECT`.
pub const DESC_F_INDIRECT: u16 = 4;
/// `VIRTQ_USED_F_NO_NOTIFY`.
const USED_F_NO_NOTIFY: u16 = 1;
/// Byte written into device-writable buffers before submission, so bytes the device claims
/// to have written but did not are visible.
pub const POISON: u8 = 0xa5;

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

// SAFETY: `Desc` is `#[repr(C)]` with fields 8+4+2+2 = 16 bytes and no padding; every bit
// pattern is a valid value.
unsafe impl ByteValued for Desc {}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct UsedElem {
    id: u32,
    len: u32,
}

// SAFETY: `UsedElem` is `#[repr(C)]`, two u32 fields, no padding; any bit pattern is valid.
unsafe impl ByteValued for UsedElem {}

/// One buffer of a descriptor chain, in chain order.
#[derive(Debug, Clone)]
pub enum Seg {
    /// Device-readable buffer holding these bytes (may be empty: a zero-length descriptor).
    Readable(Vec<u8>),
    /// Device-writable buffer of this many bytes (may be 0), filled with [`POISON`] first.
    /// Its contents come back in [`Completion::data`].
    Writable(u32),
    /// A descriptor with an arbitrary address and length and no buffer behind it (e.g. outside
    /// guest memory). Nothing is read back from it.
    Raw { addr: u64, len: u32, writable: bool },
}

/// A descriptor chain to put on a queue.
#[derive(Debug, Clone)]
pub struct Chain {
    pub segs: Vec<Seg>,
    /// Put the segments in an indirect table (`VIRTQ_DESC_F_INDIRECT`) referenced by one
    /// descriptor in the ring, as Linux does when the feature is negotiated.
    pub indirect: bool,
}

/// A used-ring entry for one chain, with the bytes of its [`Seg::Writable`] buffers.
#[derive(Debug, Clone)]
pub struct Completion {
    /// `len` of the used element: bytes the device says it wrote.
    pub used_len: u32,
    /// Concatenated `Seg::Writable` buffers, cut to `min(used_len, their total size)`.
    pub data: Vec<u8>,
    /// Total size of the `Seg::Writable` buffers.
    pub capacity: u32,
}

impl Completion {
    /// The `error` of the reply's out-header, `None` when the reply is shorter than one.
    pub fn error(&self) -> Option<i32> {
        self.data
            .get(..16)
            .and_then(daxfsd::abi::OutHeader::from_slice)
            .map(|h| h.error)
    }
}

/// Counters of one queue.
#[derive(Debug, Default, Clone, Copy)]
pub struct QueueStats {
    pub submitted: u64,
    pub completed: u64,
    pub kicks: u64,
    pub kicks_suppressed: u64,
    /// Call eventfd reads that returned a non-zero count.
    pub calls: u64,
}

struct Inflight {
    serial: u64,
    descs: Vec<u16>,
    blocks: Vec<Block>,
    /// Allocated writable buffers (addr, len) in chain order.
    writable: Vec<(u64, u32)>,
    abandoned: bool,
}

struct Done {
    used_len: u32,
    blocks: Vec<Block>,
    writable: Vec<(u64, u32)>,
}

struct State {
    free_desc: Vec<u16>,
    next_avail: u16,
    last_used: u16,
    serial: u64,
    inflight: HashMap<u16, Inflight>,
    done: HashMap<u64, Done>,
    reaping: bool,
    disconnected: bool,
    violations: Vec<String>,
    stats: QueueStats,
}

/// One split virtqueue.
pub struct Queue {
    index: u16,
    size: u16,
    mem: Arc<GuestMem>,
    rings: Block,
    desc: u64,
    avail: u64,
    used: u64,
    kick: EventFd,
    call: EventFd,
    event_idx: bool,
    poison: bool,
    hup: Option<Arc<UnixStream>>,
    state: Mutex<State>,
    cond: Condvar,
}

/// A submitted chain. Wait for it with [`Pending::wait`]; dropping it unwaited leaves the
/// buffers to be freed when the device returns the chain.
pub struct Pending {
    queue: Arc<Queue>,
    serial: u64,
    waited: bool,
}

impl Queue {
    /// Allocates the rings of a queue of `size` entries (a power of two) in `mem`.
    pub(crate) fn new(
        mem: Arc<GuestMem>,
        index: u16,
        size: u16,
        event_idx: bool,
        poison: bool,
        hup: Option<Arc<UnixStream>>,
    ) -> io::Result<Queue> {
        if size == 0 || !size.is_power_of_two() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("queue size {size} is not a power of two"),
            ));
        }
        let n = u64::from(size);
        let desc_len = 16 * n;
        let avail_len = (4 + 2 * n + 2).next_multiple_of(4);
        let used_len = 4 + 8 * n + 2;
        let rings = mem.alloc(desc_len + avail_len + used_len, 4096)?;
        mem.write(rings.addr, &vec![0u8; rings.len as usize])?;
        let new_fd = || EventFd::new(EFD_NONBLOCK);
        Ok(Queue {
            index,
            size,
            desc: rings.addr,
            avail: rings.addr + desc_len,
            used: rings.addr + desc_len + avail_len,
            rings,
            mem,
            kick: new_fd()?,
            call: new_fd()?,
            event_idx,
            poison,
            hup,
            state: Mutex::new(State {
                free_desc: (0..size).rev().collect(),
                next_avail: 0,
                last_used: 0,
                serial: 0,
                inflight: HashMap::new(),
                done: HashMap::new(),
                reaping: false,
                disconnected: false,
                violations: Vec::new(),
                stats: QueueStats::default(),
            }),
            cond: Condvar::new(),
        })
    }

    /// Queue index (0 = hiprio).
    pub fn index(&self) -> u16 {
        self.index
    }

    /// Number of ring entries.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Guest addresses of the descriptor table, available ring and used ring.
    pub fn ring_addrs(&self) -> (u64, u64, u64) {
        (self.desc, self.avail, self.used)
    }

    pub fn kick_fd(&self) -> &EventFd {
        &self.kick
    }

    pub(crate) fn call_fd(&self) -> &EventFd {
        &self.call
    }

    /// Counters so far.
    pub fn stats(&self) -> QueueStats {
        self.lock().map(|s| s.stats).unwrap_or_default()
    }

    /// Protocol violations the driver saw on this queue (bad used ids, impossible used
    /// lengths, used index running ahead): empty for a correct backend.
    pub fn violations(&self) -> Vec<String> {
        self.lock()
            .map(|s| s.violations.clone())
            .unwrap_or_default()
    }

    fn lock(&self) -> io::Result<MutexGuard<'_, State>> {
        self.state
            .lock()
            .map_err(|_| io::Error::other(format!("queue {} lock poisoned", self.index)))
    }

    /// Puts `chain` on the available ring and kicks the backend if it wants a kick.
    pub fn submit(self: &Arc<Self>, chain: &Chain) -> io::Result<Pending> {
        if chain.segs.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty chain"));
        }
        let mut st = self.lock()?;
        self.reap(&mut st)?;
        let ring_descs = if chain.indirect { 1 } else { chain.segs.len() };
        if st.free_desc.len() < ring_descs {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "queue {}: {} free descriptors, chain needs {ring_descs}",
                    self.index,
                    st.free_desc.len()
                ),
            ));
        }
        let mut blocks = Vec::new();
        let built = self.build(chain, &mut blocks);
        let (descs, writable) = match built {
            Ok(v) => v,
            Err(e) => {
                blocks.into_iter().for_each(|b| self.mem.free(b));
                return Err(e);
            }
        };
        // Chain the descriptors: into the indirect table, or into the ring's table.
        let ids: Vec<u16> = (0..ring_descs).filter_map(|_| st.free_desc.pop()).collect();
        let head = ids[0];
        let res = if chain.indirect {
            let table = self.mem.alloc(16 * descs.len() as u64, 16);
            match table {
                Ok(t) => {
                    blocks.push(t);
                    self.write_chain(t.addr, &descs, |i| i as u16)
                        .and_then(|_| {
                            let d = Desc {
                                addr: t.addr,
                                len: 16 * descs.len() as u32,
                                flags: DESC_F_INDIRECT,
                                next: 0,
                            };
                            self.mem.write_obj(self.desc + 16 * u64::from(head), d)
                        })
                }
                Err(e) => Err(e),
            }
        } else {
            self.write_chain(self.desc, &descs, |i| ids[i])
        };
        if let Err(e) = res {
            st.free_desc.extend(&ids);
            blocks.into_iter().for_each(|b| self.mem.free(b));
            return Err(e);
        }
        st.serial += 1;
        let serial = st.serial;
        st.inflight.insert(
            head,
            Inflight {
                serial,
                descs: ids,
                blocks,
                writable,
                abandoned: false,
            },
        );
        // Publish: ring entry, then the index (release), then decide about the kick.
        let old = st.next_avail;
        let slot = self.avail + 4 + 2 * u64::from(old % self.size);
        self.mem.write_obj(slot, head)?;
        let new = old.wrapping_add(1);
        self.mem.store_u16(self.avail + 2, new, Ordering::Release)?;
        st.next_avail = new;
        st.stats.submitted += 1;
        fence(Ordering::SeqCst);
        let kick = if self.event_idx {
            let ev = self
                .mem
                .load_u16(self.used + 4 + 8 * u64::from(self.size), Ordering::Acquire)?;
            new.wrapping_sub(ev).wrapping_sub(1) < new.wrapping_sub(old)
        } else {
            self.mem.load_u16(self.used, Ordering::Acquire)? & USED_F_NO_NOTIFY == 0
        };
        if kick {
            st.stats.kicks += 1;
            self.kick.write(1)?;
        } else {
            st.stats.kicks_suppressed += 1;
        }
        Ok(Pending {
            queue: Arc::clone(self),
            serial,
            waited: false,
        })
    }

    /// Allocates and fills the buffers of `chain`; returns its descriptors (without NEXT
    /// links) and its allocated writable buffers.
    #[allow(clippy::type_complexity)]
    fn build(
        &self,
        chain: &Chain,
        blocks: &mut Vec<Block>,
    ) -> io::Result<(Vec<Desc>, Vec<(u64, u32)>)> {
        let mut descs = Vec::with_capacity(chain.segs.len());
        let mut writable = Vec::new();
        for seg in &chain.segs {
            let d = match seg {
                Seg::Readable(bytes) => {
                    let len = u32::try_from(bytes.len()).map_err(io::Error::other)?;
                    let b = self
                        .mem
                        .alloc(bytes.len() as u64, align_for(bytes.len() as u64))?;
                    blocks.push(b);
                    self.mem.write(b.addr, bytes)?;
                    Desc {
                        addr: b.addr,
                        len,
                        flags: 0,
                        next: 0,
                    }
                }
                Seg::Writable(len) => {
                    let b = self
                        .mem
                        .alloc(u64::from(*len), align_for(u64::from(*len)))?;
                    blocks.push(b);
                    if self.poison {
                        self.mem.write(b.addr, &vec![POISON; *len as usize])?;
                    }
                    writable.push((b.addr, *len));
                    Desc {
                        addr: b.addr,
                        len: *len,
                        flags: DESC_F_WRITE,
                        next: 0,
                    }
                }
                Seg::Raw {
                    addr,
                    len,
                    writable: w,
                } => {
                    if *w {
                        // Counts in the chain's capacity (a reply may land there, e.g. a READ
                        // into the DAX window); read back only when it is guest RAM.
                        writable.push((*addr, *len));
                    }
                    Desc {
                        addr: *addr,
                        len: *len,
                        flags: if *w { DESC_F_WRITE } else { 0 },
                        next: 0,
                    }
                }
            };
            descs.push(d);
        }
        Ok((descs, writable))
    }

    /// Writes `descs` into the table at `table`, descriptor i at slot `id(i)`, linked by NEXT.
    fn write_chain(&self, table: u64, descs: &[Desc], id: impl Fn(usize) -> u16) -> io::Result<()> {
        for (i, d) in descs.iter().enumerate() {
            let mut d = *d;
            if i + 1 < descs.len() {
                d.flags |= DESC_F_NEXT;
                d.next = id(i + 1);
            }
            self.mem.write_obj(table + 16 * u64::from(id(i)), d)?;
        }
        Ok(())
    }

    /// Moves every new used-ring entry to `done` (or frees it, if abandoned). Returns how many.
    fn reap(&self, st: &mut State) -> io::Result<usize> {
        let used_idx = self.mem.load_u16(self.used + 2, Ordering::Acquire)?;
        let pending = used_idx.wrapping_sub(st.last_used);
        if pending > self.size {
            let v = format!(
                "queue {}: used idx {used_idx} is {pending} entries ahead of {} (size {})",
                self.index, st.last_used, self.size
            );
            if st.violations.last() != Some(&v) {
                st.violations.push(v);
            }
            return Ok(0);
        }
        for _ in 0..pending {
            let slot = self.used + 4 + 8 * u64::from(st.last_used % self.size);
            let e: UsedElem = self.mem.read_obj(slot)?;
            st.last_used = st.last_used.wrapping_add(1);
            let Some(inf) = u16::try_from(e.id)
                .ok()
                .and_then(|id| st.inflight.remove(&id))
            else {
                let v = format!(
                    "queue {}: used element id {} (len {}) is not an in-flight head",
                    self.index, e.id, e.len
                );
                st.violations.push(v);
                continue;
            };
            st.free_desc.extend(&inf.descs);
            st.stats.completed += 1;
            let cap: u64 = inf.writable.iter().map(|w| u64::from(w.1)).sum();
            if u64::from(e.len) > cap {
                st.violations.push(format!(
                    "queue {}: used len {} exceeds the {cap} writable bytes of chain {}",
                    self.index, e.len, e.id
                ));
            }
            if inf.abandoned {
                inf.blocks.into_iter().for_each(|b| self.mem.free(b));
            } else {
                st.done.insert(
                    inf.serial,
                    Done {
                        used_len: e.len,
                        blocks: inf.blocks,
                        writable: inf.writable,
                    },
                );
            }
        }
        if pending > 0 {
            self.cond.notify_all();
        }
        Ok(usize::from(pending))
    }

    /// Asks for a notification on the next used entry; true if the used ring is still empty
    /// afterwards (safe to sleep).
    fn arm(&self, st: &State) -> io::Result<bool> {
        if self.event_idx {
            let at = self.avail + 4 + 2 * u64::from(self.size);
            self.mem.store_u16(at, st.last_used, Ordering::Release)?;
        }
        fence(Ordering::SeqCst);
        Ok(self.mem.load_u16(self.used + 2, Ordering::Acquire)? == st.last_used)
    }

    fn wait(&self, serial: u64, timeout: Duration) -> io::Result<Completion> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock()?;
        loop {
            if let Some(done) = st.done.remove(&serial) {
                drop(st);
                return self.finish(done);
            }
            let now = Instant::now();
            if st.disconnected || now >= deadline {
                return Err(self.give_up(&mut st, serial, timeout));
            }
            if st.reaping {
                st = self
                    .cond
                    .wait_timeout(st, deadline - now)
                    .map_err(|_| io::Error::other("queue lock poisoned"))?
                    .0;
                continue;
            }
            st.reaping = true;
            drop(st);
            let res = self.reap_or_sleep(deadline - now);
            st = self.lock()?;
            st.reaping = false;
            self.cond.notify_all();
            match res {
                Ok(true) => st.disconnected = true,
                Ok(false) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The reaper's turn: reap, else arm notifications and sleep on the call eventfd (and the
    /// vhost-user socket's hang-up). Returns true if the backend hung up.
    fn reap_or_sleep(&self, timeout: Duration) -> io::Result<bool> {
        match self.call.read() {
            Ok(n) if n > 0 => self.lock()?.stats.calls += 1,
            _ => {}
        }
        let mut st = self.lock()?;
        if self.reap(&mut st)? > 0 || !self.arm(&st)? {
            self.reap(&mut st)?;
            return Ok(false);
        }
        drop(st);
        let hup = poll_two(
            self.call.as_raw_fd(),
            self.hup.as_ref().map(|f| f.as_raw_fd()),
            timeout,
        )?;
        let mut st = self.lock()?;
        self.reap(&mut st)?;
        Ok(hup)
    }

    fn give_up(&self, st: &mut State, serial: u64, timeout: Duration) -> io::Error {
        // A last look at the ring: completed, but never signalled?
        let silent = self.reap(st).unwrap_or(0) > 0 && st.done.contains_key(&serial);
        if let Some(inf) = st.inflight.values_mut().find(|i| i.serial == serial) {
            inf.abandoned = true;
        }
        if let Some(done) = st.done.remove(&serial) {
            done.blocks.into_iter().for_each(|b| self.mem.free(b));
        }
        let why = if st.disconnected {
            "the backend closed the vhost-user socket".to_string()
        } else if silent {
            "the backend completed the request but did not signal the call eventfd".to_string()
        } else {
            format!("no used-ring entry within {timeout:?}")
        };
        let mut msg = format!("queue {}: {why}", self.index);
        if !st.violations.is_empty() {
            msg.push_str(&format!("; violations: {:?}", st.violations));
        }
        let kind = if st.disconnected {
            io::ErrorKind::ConnectionAborted
        } else {
            io::ErrorKind::TimedOut
        };
        io::Error::new(kind, msg)
    }

    fn finish(&self, done: Done) -> io::Result<Completion> {
        let capacity: u64 = done.writable.iter().map(|w| u64::from(w.1)).sum();
        let mut left = u64::from(done.used_len).min(capacity) as usize;
        let mut data = Vec::with_capacity(left);
        let mut res = Ok(());
        for &(addr, len) in &done.writable {
            let n = (len as usize).min(left);
            if n == 0 {
                break;
            }
            let in_ram = addr >= self.mem.base()
                && addr
                    .checked_add(u64::from(len))
                    .is_some_and(|e| e <= self.mem.base() + self.mem.size());
            if !in_ram {
                // A raw buffer outside guest RAM (the DAX window): the test reads it itself.
                left -= n;
                continue;
            }
            let at = data.len();
            data.resize(at + n, 0);
            if let Err(e) = self.mem.read(addr, &mut data[at..]) {
                res = Err(e);
                break;
            }
            left -= n;
        }
        done.blocks.into_iter().for_each(|b| self.mem.free(b));
        res.map(|_| Completion {
            used_len: done.used_len,
            data,
            capacity: capacity as u32,
        })
    }

    /// Marks the queue dead (the backend is gone): waiters return at once.
    pub(crate) fn set_disconnected(&self) {
        if let Ok(mut st) = self.lock() {
            st.disconnected = true;
        }
        self.cond.notify_all();
    }

    /// Puts the rings back to their initial state (a rebooted guest's fresh queue): zeroed
    /// rings, indices 0, every descriptor free. Chains in flight are forgotten; their buffers
    /// stay allocated, since a backend may still write into them.
    pub(crate) fn reset_rings(&self) -> io::Result<()> {
        let mut st = self.lock()?;
        self.mem
            .write(self.rings.addr, &vec![0u8; self.rings.len as usize])?;
        st.free_desc = (0..self.size).rev().collect();
        st.next_avail = 0;
        st.last_used = 0;
        st.inflight.clear();
        Ok(())
    }

    /// Frees the ring memory (on device teardown).
    pub(crate) fn release_rings(&self) {
        self.mem.free(self.rings);
    }
}

impl Pending {
    /// Waits up to `timeout` for the backend to return the chain.
    pub fn wait(mut self, timeout: Duration) -> io::Result<Completion> {
        self.waited = true;
        self.queue.wait(self.serial, timeout)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.waited {
            return;
        }
        if let Ok(mut st) = self.queue.lock() {
            if let Some(inf) = st.inflight.values_mut().find(|i| i.serial == self.serial) {
                inf.abandoned = true;
            }
            if let Some(done) = st.done.remove(&self.serial) {
                done.blocks.into_iter().for_each(|b| self.queue.mem.free(b));
            }
        }
    }
}

fn align_for(len: u64) -> u64 {
    if len >= 4096 {
        4096
    } else {
        64
    }
}

/// Polls `fd` for input and `hup` (if any) for a hang-up. Returns true on hang-up.
fn poll_two(fd: RawFd, hup: Option<RawFd>, timeout: Duration) -> io::Result<bool> {
    let mut fds = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: hup.unwrap_or(-1),
            events: libc::POLLRDHUP,
            revents: 0,
        },
    ];
    crate::poll(&mut fds, timeout)?;
    Ok(fds[1].revents != 0)
}
