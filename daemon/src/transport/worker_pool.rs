//! The worker threads of the vhost-user transport: the `--thread-pool-size` pool and the
//! pools for requests that may block ([`Pool`]), and what decides whether a queue thread
//! looks for more requests before it sleeps ([`Look`], [`Awake`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a queue thread looks for more requests before it sleeps in epoll (see [`Look`]).
/// Measured with `protobench` on an idle 2-core host: 4 KiB READ at depth 1 went from 19k to
/// 64k requests/s, depth 16 from 502k to 522k.
pub(super) const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(30);
/// Most batches a queue thread goes without a look after looks that found nothing (see
/// [`Look`]).
const LOOK_BACKOFF_MAX: u32 = 32;

/// Whether a queue thread looks at its ring for [`POLL_BEFORE_SLEEP`] before it sleeps.
///
/// A look pays when the guest sends its next request within microseconds (a driver in a
/// loop, deep queues on KVM). Under TCG, or for a metadata walk, the next request comes
/// hundreds of microseconds after the reply: nearly every look is wasted, and on a host whose
/// cores the vCPU threads share, its yields take time the guest needs (perf of a `--cache
/// never` tree unpack in a TCG guest: 20.8% of the daemon's samples under `sched_yield`). So
/// after a look that found nothing the thread skips the next 1, 2, 4, ... batches' looks (up
/// to [`LOOK_BACKOFF_MAX`]); a look that finds a request resets it.
///
/// The look spins (`spin_loop`), it does not `sched_yield`: where the vCPU threads want the
/// thread's core, a yield runs one of them for a whole time slice (milliseconds) while the
/// thread, runnable but not asleep, gets no wake-up from the guest's kick, so requests wait.
/// (With yields, 1,185 of 8,192 looks under 4 fio jobs overran twice their length.) A spin
/// costs a busy vCPU at most the look's 30 us. A look that still overran its own length (the
/// thread was preempted: [`Seen::Contended`]) counts as a miss.
///
/// Measured (protobench; 4 fio jobs in a 2-vCPU TCG guest on 2 host cores, interleaved): no
/// look at all cut protobench's 4 KiB READs at depth 16 from 445k to 185k/s (virtiofsd 1.14:
/// 305k); with yields the guest's jobs ran ~5% slower than with no look (medians of 16
/// rounds); spinning keeps protobench within 10% of the yielding look and the guest's jobs
/// level with no look. Only the queue's own thread uses it.
#[derive(Default)]
pub(super) struct Look {
    /// Batches left to go without a look.
    skip: AtomicU32,
    /// What the next miss sets `skip` to (doubled each miss, 0 after a hit).
    backoff: AtomicU32,
}

impl Look {
    /// Whether to look after this batch (counts a skipped one).
    pub(super) fn due(&self) -> bool {
        let s = self.skip.load(Ordering::Relaxed);
        if s > 0 {
            self.skip.store(s - 1, Ordering::Relaxed);
        }
        s == 0
    }

    /// Records what a look saw: only a request on an uncontended core keeps the thread
    /// looking.
    pub(super) fn found(&self, seen: Seen) {
        if seen == Seen::Request {
            self.backoff.store(0, Ordering::Relaxed);
        } else {
            let b = (self.backoff.load(Ordering::Relaxed) * 2).clamp(1, LOOK_BACKOFF_MAX);
            self.backoff.store(b, Ordering::Relaxed);
            self.skip.store(b, Ordering::Relaxed);
        }
    }
}

/// What a queue thread's look before sleeping saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    /// A new request, on a core no other thread wanted.
    Request,
    /// A new request, but the look was preempted: it overran its own length.
    Contended,
    /// No request.
    Nothing,
}

/// Threads awake now, against the cores they may take: queue threads serving a batch or
/// looking, and `--thread-pool-size` threads serving a request.
///
/// A spinning look only pays while the request's producer runs on another core, so a queue
/// thread looks only while no more threads are awake than the CPUs the daemon may run on, less
/// one (none on one CPU). Where busy threads outnumber the spare cores, a spin takes a core
/// that another queue's requests, or the pool thread serving its own, want; the thread sleeps
/// instead and the next kick wakes it. (protobench, 4 queues on 2 cores: 4 KiB READ at depth
/// 16 ran at 0.4x the rate of yielding looks while one thread at a time spun; bench/HISTORY.md.)
pub(super) struct Awake {
    now: AtomicUsize,
    max: usize,
}

impl Awake {
    pub(super) fn new() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Awake {
            now: AtomicUsize::new(0),
            max: cpus.saturating_sub(1),
        }
    }

    /// Counts the calling thread awake until the guard drops.
    pub(super) fn wake(&self) -> AwakeGuard<'_> {
        self.now.fetch_add(1, Ordering::AcqRel);
        AwakeGuard(&self.now)
    }

    /// Whether a thread that is awake may look: no more are awake than cores to spare.
    pub(super) fn may_look(&self) -> bool {
        self.now.load(Ordering::Acquire) <= self.max
    }
}

/// A thread awake; counted in [`Awake`] until dropped.
pub(super) struct AwakeGuard<'a>(&'a AtomicUsize);

impl Drop for AwakeGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// The CPUs this process may run on (`sched_getaffinity`), fewer where a cgroup CPU quota
/// allows less (what `available_parallelism` reads: a container's limit), at least 1.
pub(crate) fn affinity_cpus() -> usize {
    let quota = std::thread::available_parallelism().map_or(usize::MAX, |n| n.get());
    // SAFETY: `cpu_set_t` is plain data: all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable for the size given; pid 0 is the calling thread.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return quota.clamp(1, 1024);
    }
    // SAFETY: `set` is initialised (zeroed, then filled by the kernel).
    let n = unsafe { libc::CPU_COUNT(&set) };
    usize::try_from(n).unwrap_or(1).min(quota).max(1)
}

/// The threads requests are served on, asked (`--queues`, `--thread-pool-size`) and clamped
/// to what the CPUs can run at once.
///
/// Each request queue beyond the first used to have a thread of its own, and a pool its
/// threads, whatever the CPUs: on 2 cores, 4 request queues served a 4 KiB READ at depth 16
/// at 0.31x the rate of one queue, and `--thread-pool-size=4` at 0.30x-0.41x of no pool
/// (bench/HISTORY.md): threads that cannot run at once only hand requests over, wake each
/// other and take turns. The guest's side (its vCPUs, or a driver) needs a core too, so at
/// most `cpus - 1` threads (at least 1) serve the request queues, and a pool has at most
/// that many; a pool of one behind one queue thread serves on that thread ([`Self::pool`] 0).
/// Requests that may block (locks, flushes) keep their own pools: those threads sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ThreadPlan {
    /// Threads serving the request queues (the hiprio and notification queues share the first).
    pub queue_threads: usize,
    /// `--thread-pool-size` threads; 0: each request is served on its queue's thread.
    pub pool: usize,
}

impl ThreadPlan {
    /// The plan for `request_queues` (>= 1) and a pool of `pool_asked` on `cpus` CPUs.
    pub(crate) fn new(request_queues: usize, pool_asked: usize, cpus: usize) -> Self {
        let useful = cpus.saturating_sub(1).max(1);
        let queue_threads = request_queues.clamp(1, useful);
        let pool = pool_asked.min(useful);
        // A pool of one behind one queue thread serves one request at a time, as the thread
        // does itself, plus a hand-off and a wake-up per request (Kata passes 1): none. With
        // several queue threads a pool of one still bounds them to one request at a time.
        let pool = if pool > 1 || (pool == 1 && queue_threads > 1) {
            pool
        } else {
            0
        };
        ThreadPlan {
            queue_threads,
            pool,
        }
    }

    /// [`Self::new`] on this host's CPUs, saying in the log when it runs fewer threads than
    /// asked. `DAXFSD_THREADS=asked` in the environment keeps the counts asked (threads that
    /// mostly wait, on slow or remote storage; the tests of the pool and queue threads);
    /// `DAXFSD_THREADS=N` plans as for N CPUs (the tests of queues sharing a thread, on any
    /// host).
    pub(crate) fn for_host(request_queues: usize, pool_asked: usize) -> Self {
        let env = std::env::var_os("DAXFSD_THREADS");
        if env.as_ref().is_some_and(|v| v == "asked") {
            return Self::new(request_queues, pool_asked, usize::MAX);
        }
        let cpus = env
            .and_then(|v| v.to_str()?.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(affinity_cpus);
        let plan = Self::new(request_queues, pool_asked, cpus);
        let pool_cut = pool_asked > 1 && plan.pool < pool_asked;
        if plan.queue_threads < request_queues || pool_cut {
            log::info!(
                "{cpus} CPU(s) to run on: serving {request_queues} request queue(s) on {} thread(s){} \
                 (asked: --thread-pool-size={pool_asked}); threads beyond the CPUs but one only \
                 contend for them",
                plan.queue_threads,
                match plan.pool {
                    0 => ", no worker pool".to_string(),
                    n => format!(", worker pool of {n}"),
                },
            );
        }
        plan
    }
}

pub(super) type Job = Box<dyn FnOnce() + Send>;

/// A pool of threads running jobs; threads are started on demand up to `max`, and those
/// beyond `keep` leave after a while idle.
///
/// A job wakes the thread that went idle last (a stack, not a queue): its core and cache are
/// the warmest, and a steady stream of jobs keeps running on the same one or two threads. (A
/// shared condition variable wakes the longest sleeper: with a pool of 4 the jobs rotated
/// over all four threads, and protobench's 4 KiB READ at depth 1 made 1.2 CPU migrations per
/// request against virtiofsd's 0.5.)
pub(super) struct Pool {
    name: &'static str,
    max: usize,
    keep: usize,
    inner: Mutex<PoolInner>,
    /// Where a thread running a job counts as awake ([`Awake`]); `None` for jobs that mostly
    /// sleep (requests that may block).
    awake: Option<Arc<Awake>>,
    /// Jobs submitted and not finished (queued or running).
    pending: AtomicUsize,
}

#[derive(Default)]
struct PoolInner {
    jobs: VecDeque<Job>,
    threads: usize,
    /// Threads waiting for a job, the one that went idle last on top.
    idle: Vec<Arc<Sleeper>>,
}

/// A pool thread waiting for a job.
struct Sleeper {
    thread: std::thread::Thread,
    woken: AtomicBool,
}

impl Sleeper {
    fn wake(&self) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }

    /// Sleeps until woken or `timeout` passes; whether it was woken.
    fn sleep(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.woken.load(Ordering::Acquire) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            std::thread::park_timeout(deadline - now);
        }
    }
}

impl Pool {
    pub(super) fn new(
        name: &'static str,
        max: usize,
        keep: usize,
        awake: Option<Arc<Awake>>,
    ) -> Arc<Self> {
        Arc::new(Pool {
            name,
            max,
            keep,
            inner: Mutex::new(PoolInner::default()),
            awake,
            pending: AtomicUsize::new(0),
        })
    }

    /// Whether no job is queued or running.
    pub(super) fn is_idle(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }

    fn lock(&self) -> MutexGuard<'_, PoolInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `job` on a pool thread (queued when all `max` threads are busy).
    pub(super) fn submit(self: &Arc<Self>, job: Job) {
        self.pending.fetch_add(1, Ordering::AcqRel);
        let mut g = self.lock();
        g.jobs.push_back(job);
        if let Some(sleeper) = g.idle.pop() {
            // Woken after the lock is released: a thread woken while it is held would wake
            // only to sleep again on the lock.
            drop(g);
            sleeper.wake();
            return;
        }
        if g.threads >= self.max {
            // A busy thread takes it when it is done.
            return;
        }
        g.threads += 1;
        drop(g);
        let pool = self.clone();
        let spawned = std::thread::Builder::new()
            .name(self.name.into())
            .spawn(move || pool.run());
        if let Err(e) = spawned {
            log::error!("cannot start a {} thread: {e}", self.name);
            let mut g = self.lock();
            g.threads -= 1;
            if g.threads == 0 {
                // Nobody would ever run the queued jobs: run them here.
                let jobs: Vec<Job> = g.jobs.drain(..).collect();
                drop(g);
                jobs.into_iter().for_each(|j| {
                    j();
                    self.pending.fetch_sub(1, Ordering::AcqRel);
                });
            }
        }
    }

    fn run(&self) {
        let me = Arc::new(Sleeper {
            thread: std::thread::current(),
            woken: AtomicBool::new(false),
        });
        let mut g = self.lock();
        loop {
            if let Some(job) = g.jobs.pop_front() {
                drop(g);
                {
                    let _awake = self.awake.as_ref().map(|a| a.wake());
                    job();
                }
                self.pending.fetch_sub(1, Ordering::AcqRel);
                g = self.lock();
                continue;
            }
            // Sleep at once: a pool thread that looked for its next job before sleeping (50 us,
            // yielding) saved protobench a futex wake-up per request, but in a guest it cost
            // more than the wake-up: a yield on a core a vCPU wants leaves the job a time
            // slice behind a thread no submit wakes (4 fio jobs, `--thread-pool-size=4`:
            // 9-20% slower; bench/HISTORY.md).
            me.woken.store(false, Ordering::Relaxed);
            g.idle.push(me.clone());
            drop(g);
            let woken = me.sleep(Duration::from_secs(30));
            g = self.lock();
            // A submit that wakes a thread takes it off the stack first; one still there timed
            // out, or saw a wake-up meant for an earlier sleep.
            let still_idle = match g.idle.iter().position(|s| Arc::ptr_eq(s, &me)) {
                Some(i) => {
                    g.idle.remove(i);
                    true
                }
                None => false,
            };
            if still_idle && !woken && g.jobs.is_empty() && g.threads > self.keep {
                g.threads -= 1;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Looks that find requests keep the queue thread looking after every batch; misses
    /// (nothing found, or found by a preempted look) space the looks out 1, 2, 4, ... batches
    /// apart up to the cap, and one hit resets it.
    #[test]
    fn the_look_backs_off_after_misses_and_resets_on_a_hit() {
        let l = Look::default();
        for _ in 0..5 {
            assert!(l.due());
            l.found(Seen::Request);
        }
        // Every look misses: the batches skipped before each next look.
        let mut gaps = Vec::new();
        assert!(l.due());
        for i in 0..8 {
            // A request found on a core other threads wanted is a miss too.
            l.found(if i % 2 == 0 {
                Seen::Nothing
            } else {
                Seen::Contended
            });
            let mut n = 0;
            while !l.due() {
                n += 1;
            }
            gaps.push(n);
        }
        assert_eq!(gaps, [1, 2, 4, 8, 16, 32, 32, 32]);
        l.found(Seen::Request);
        assert!(l.due(), "a hit looks again at once");
    }

    /// A queue thread may look while no more threads are awake than `max`; a guard counts
    /// its thread until dropped.
    #[test]
    fn threads_look_only_while_no_more_are_awake_than_cores_to_spare() {
        let a = Awake {
            now: AtomicUsize::new(0),
            max: 2,
        };
        let first = a.wake();
        assert!(a.may_look(), "alone");
        let second = a.wake();
        assert!(a.may_look(), "two awake, two cores to spare");
        let third = a.wake();
        assert!(!a.may_look(), "three awake: none looks");
        drop(first);
        assert!(a.may_look());
        drop((second, third));
        assert_eq!(a.now.load(Ordering::Relaxed), 0);
        let one_cpu = Awake {
            now: AtomicUsize::new(0),
            max: 0,
        };
        let _g = one_cpu.wake();
        assert!(!one_cpu.may_look(), "on one CPU no thread looks");
    }

    /// Threads are never more than the CPUs but one can run (at least one), a pool of one
    /// behind one queue thread is none, and where the CPUs suffice the plan is what was asked.
    #[test]
    fn the_thread_plan_fits_the_cpus() {
        let plan = |q, p, c| {
            let t = ThreadPlan::new(q, p, c);
            (t.queue_threads, t.pool)
        };
        // 2 CPUs: one serving thread, whatever was asked.
        assert_eq!(plan(4, 0, 2), (1, 0));
        assert_eq!(plan(4, 4, 2), (1, 0));
        assert_eq!(plan(1, 4, 2), (1, 0));
        assert_eq!(plan(1, 1, 2), (1, 0));
        assert_eq!(plan(1, 0, 1), (1, 0));
        // Enough CPUs: as asked (a pool of one serves on one queue's thread).
        assert_eq!(plan(4, 4, 8), (4, 4));
        assert_eq!(plan(1, 1, 8), (1, 0));
        assert_eq!(plan(4, 1, 8), (4, 1));
        // Between: clamped to 3 serving threads each.
        assert_eq!(plan(8, 16, 4), (3, 3));
        // DAXFSD_THREADS=asked: as asked.
        assert_eq!(plan(4, 4, usize::MAX), (4, 4));
        assert_eq!(plan(1, 1, usize::MAX), (1, 0));
        assert!(affinity_cpus() >= 1);
    }

    /// Every job runs, whether a sleeping, a busy or a new thread takes it: bursts from one
    /// submitter and from several, with gaps that let workers fall asleep between them.
    #[test]
    fn the_pool_runs_every_job_through_wakeups_and_sleeps() {
        use std::sync::atomic::AtomicUsize;
        let pool = Pool::new("test-worker", 4, 4, None);
        let done = Arc::new(AtomicUsize::new(0));
        let submit = |pool: &Arc<Pool>, n: usize| {
            for i in 0..n {
                let done = done.clone();
                pool.submit(Box::new(move || {
                    if i % 7 == 0 {
                        std::thread::sleep(Duration::from_micros(30));
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                }));
            }
        };
        let mut want = 0;
        for round in 0..200 {
            let n = 1 + round % 17;
            submit(&pool, n);
            want += n;
            if round % 3 == 0 {
                // The workers go to sleep.
                std::thread::sleep(Duration::from_micros(150));
            }
        }
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let pool = pool.clone();
                let done = done.clone();
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        let done = done.clone();
                        pool.submit(Box::new(move || {
                            done.fetch_add(1, Ordering::SeqCst);
                        }));
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        want += 1500;
        let deadline = Instant::now() + Duration::from_secs(10);
        while done.load(Ordering::SeqCst) < want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(done.load(Ordering::SeqCst), want);
        let g = pool.lock();
        assert!(g.threads <= 4 && g.jobs.is_empty(), "threads {}", g.threads);
    }

    /// A job wakes the thread that went idle last, again and again (a queue of sleepers would
    /// rotate the jobs over all three).
    #[test]
    fn the_pool_wakes_the_thread_that_went_idle_last() {
        let pool = Pool::new("test-worker", 3, 3, None);
        let idle = |n: usize| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while pool.lock().idle.len() < n && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(pool.lock().idle.len(), n);
        };
        // Three jobs at once start three threads.
        let gate = Arc::new(std::sync::Barrier::new(4));
        for _ in 0..3 {
            let gate = gate.clone();
            pool.submit(Box::new(move || {
                gate.wait();
            }));
        }
        gate.wait();
        idle(3);
        for _ in 0..5 {
            let last = pool.lock().idle.last().map(|s| s.thread.id());
            let (tx, rx) = std::sync::mpsc::channel();
            pool.submit(Box::new(move || {
                tx.send(std::thread::current().id()).unwrap();
            }));
            let ran_on = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(Some(ran_on), last, "the job ran on the thread idle last");
            idle(3);
        }
        assert_eq!(pool.lock().threads, 3);
    }

    #[test]
    fn the_pool_is_idle_only_with_no_job_queued_or_running() {
        // The queue thread serves the last request in sight itself only while this holds.
        let pool = Pool::new("test-worker", 1, 1, None);
        assert!(pool.is_idle(), "new");
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        pool.submit(Box::new(move || {
            go_rx.recv().unwrap();
        }));
        let tx = done_tx.clone();
        pool.submit(Box::new(move || tx.send(()).unwrap()));
        assert!(!pool.is_idle(), "one running, one queued");
        go_tx.send(()).unwrap();
        done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pool.is_idle() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(pool.is_idle(), "both done");
    }
}
