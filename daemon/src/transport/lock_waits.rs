//! Lock waits (SETLKW), served on threads of their own by the host transports.
//!
//! A SETLKW waits until another owner lets go of a conflicting lock, and that owner's unlock
//! (an F_UNLCK, or its close's FLUSH or RELEASE) is itself a request. Served on a thread that
//! takes requests (a /dev/fuse reader, an io_uring queue thread), enough waiters would hold
//! every such thread and the unlock would never be read: the mount would hang for good. So a
//! transport hands each wait to [`LockWaits`]: lock threads start on demand, at most
//! `max_threads`; a wait beyond them queues in arrival order and the first lock thread whose
//! wait ends takes it, so waiters on one lock get it in turn however many there are. A lock
//! thread with nothing queued ends. Beyond `max_queued` queued waits a SETLKW fails with
//! ENOLCK, as a host lock table out of room does, rather than memory growing with the number
//! of waiting callers.
//!
//! What a wait is, and how it is answered, is the transport's ([`WaitServer`]): a copy of the
//! request for /dev/fuse, a ring entry for io_uring.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

/// Most lock threads of a connection (each waits in one SETLKW): the transports' `max_threads`.
pub(super) const MAX_LOCK_THREADS: usize = 64;

/// How a transport serves the waits it hands over.
pub(super) trait WaitServer: Send + Sync + 'static {
    /// One wait: what the lock thread needs to serve and answer it.
    type Job: Send + 'static;
    /// Serves `job` and answers it; may wait as long as the lock does.
    fn serve(&self, job: Self::Job);
    /// Answers `job` with ENOLCK at once.
    fn refuse(&self, job: Self::Job);
}

/// The lock waits of one connection (see the module documentation).
pub(super) struct LockWaits<S: WaitServer> {
    server: S,
    /// Thread name of the lock threads.
    name: &'static str,
    max_threads: usize,
    max_queued: usize,
    inner: Mutex<Inner<S::Job>>,
}

struct Inner<J> {
    /// Waits not started yet, oldest first.
    queued: VecDeque<J>,
    /// Lock threads running.
    threads: usize,
}

impl<S: WaitServer> LockWaits<S> {
    pub(super) fn new(
        server: S,
        name: &'static str,
        max_threads: usize,
        max_queued: usize,
    ) -> Arc<Self> {
        Arc::new(LockWaits {
            server,
            name,
            max_threads: max_threads.max(1),
            max_queued,
            inner: Mutex::new(Inner {
                queued: VecDeque::new(),
                threads: 0,
            }),
        })
    }

    /// The transport's side.
    pub(super) fn server(&self) -> &S {
        &self.server
    }

    fn lock(&self) -> MutexGuard<'_, Inner<S::Job>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands `job` to a lock thread (starting one when fewer than the most run), or queues it;
    /// never waits. A wait that can have no thread is refused (ENOLCK).
    pub(super) fn submit(self: &Arc<Self>, job: S::Job) {
        let mut g = self.lock();
        if g.queued.len() >= self.max_queued {
            drop(g);
            log::warn!(
                "{} lock waits queued behind {} waiting: ENOLCK",
                self.max_queued,
                self.max_threads
            );
            self.server.refuse(job);
            return;
        }
        g.queued.push_back(job);
        if g.threads >= self.max_threads {
            // The first lock thread whose wait ends takes it.
            return;
        }
        g.threads += 1;
        drop(g);
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(self.name.into())
            .spawn(move || me.run());
        if let Err(e) = spawned {
            let mut g = self.lock();
            g.threads -= 1;
            if g.threads > 0 {
                // A running lock thread takes it when its wait ends.
                return;
            }
            // Nobody would take them: refuse them rather than leave them waiting.
            let stranded: Vec<S::Job> = g.queued.drain(..).collect();
            drop(g);
            log::warn!(
                "no thread for {} lock wait(s) ({e}): ENOLCK",
                stranded.len()
            );
            for job in stranded {
                self.server.refuse(job);
            }
        }
    }

    /// A lock thread: serves queued waits, oldest first, until none is left.
    fn run(&self) {
        loop {
            let job = {
                let mut g = self.lock();
                match g.queued.pop_front() {
                    Some(j) => j,
                    None => {
                        g.threads -= 1;
                        return;
                    }
                }
            };
            self.server.serve(job);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Jobs that wait on a shared gate, then report their number.
    struct Gate {
        open: Arc<(Mutex<bool>, std::sync::Condvar)>,
        done: Mutex<mpsc::Sender<(u32, bool)>>,
    }

    impl WaitServer for Gate {
        type Job = u32;
        fn serve(&self, job: u32) {
            let (m, cv) = &*self.open;
            let mut g = m.lock().unwrap();
            while !*g {
                g = cv.wait(g).unwrap();
            }
            drop(g);
            let _ = self.done.lock().unwrap().send((job, true));
        }
        fn refuse(&self, job: u32) {
            let _ = self.done.lock().unwrap().send((job, false));
        }
    }

    #[test]
    fn waits_beyond_the_threads_queue_and_beyond_the_queue_are_refused() {
        let open = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let (tx, rx) = mpsc::channel();
        let waits = LockWaits::new(
            Gate {
                open: open.clone(),
                done: Mutex::new(tx),
            },
            "test-lock",
            2,
            3,
        );
        // 2 on threads (once they have taken them), 3 queued, the sixth refused at once.
        waits.submit(0);
        waits.submit(1);
        for _ in 0..500 {
            if waits.lock().queued.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for j in 2..6 {
            waits.submit(j);
        }
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), (5, false));
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        assert_eq!(waits.lock().threads, 2);
        let (m, cv) = &*open;
        *m.lock().unwrap() = true;
        cv.notify_all();
        let mut served: Vec<u32> = (0..5)
            .map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap())
            .map(|(j, ok)| {
                assert!(ok);
                j
            })
            .collect();
        served.sort_unstable();
        assert_eq!(served, vec![0, 1, 2, 3, 4]);
        // The threads end once nothing is queued.
        for _ in 0..500 {
            if waits.lock().threads == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("lock threads still running with nothing queued");
    }
}
