//! The worker's answer thread: it looks at the scans' searches on the
//! device, collects each answer where the GPU wrote it, writes the reply
//! into the scan's slot and wakes its backend; the main thread takes the
//! requests, patches the copies and starts the searches.
//!
//! Why two threads: at 64 clients on the 16-core GPU machine the worker's
//! one thread was busy 85-96% of the wall clock, read-only and beside
//! inserts alike, and the scans it served were one over its time a request
//! (~4 us: looks 0.4, collect 1.1, reply 0.6, wake 0.7, start 0.8, scan of
//! the ring 0.15; docs/benchmarks.md). The writes' patches then came out of
//! the queries. Split, the main thread keeps the ring, the patches and the
//! starts, the answer thread the rest, each on a core of its own
//! (own_core) when the worker keeps cores.
//!
//! The answer thread calls nothing of PostgreSQL (pgrx allows that on the
//! main thread only): the latch and the clock are done by hand
//! (any_thread), and a failed search's log line and the device check it
//! calls for go to the main thread. In the CPU test mode the searches are
//! done when started and the thread only replies and wakes, so CI runs it.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use super::any_thread::{set_latch, timestamp_now};
use super::device::{Device, Hits};
use super::gpu::GpuPending;
use super::outcome::Outcome;
use super::own_core;
use super::profile::Mark;
use super::ring::MAX_HITS;
use super::rows::Rows;
use super::shmem::Shared;
use super::stats::add;

/// A scan's request the worker took (its slot WORKING under `seq`).
pub struct Answering {
    pub slot: usize,
    pub seq: u64,
    /// when the worker took it (a TimestampTz)
    pub taken_at: i64,
    /// gpu_graph.worker_delay: not answered before this
    pub due: Option<Instant>,
    /// the rows of the copy searched, when its distances are the pages'
    pub rows: Option<Rows>,
    pub work: Search,
}

pub enum Search {
    Done(Result<Hits, Outcome>),
    Gpu(GpuPending),
}

/// What the two threads share besides the channel (the main thread's,
/// made before the thread starts).
pub struct Control {
    stop: AtomicBool,
    /// the answer thread is about to sleep, or sleeps: wake it after sending
    parked: AtomicBool,
    /// a search failed with Outcome::Error: the main thread asks the device
    /// whether it failed for good (the driver's calls are the main's)
    check_device: AtomicBool,
    /// the core to run on (-1: any), as own_core keeps it
    core: AtomicI32,
}

impl Control {
    pub fn new(core: Option<usize>) -> Control {
        Control {
            stop: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            check_device: AtomicBool::new(false),
            core: AtomicI32::new(core.map_or(-1, |c| c as i32)),
        }
    }
}

/// The main thread's end.
pub struct Answerer<'scope> {
    to: Sender<Answering>,
    control: &'scope Control,
    thread: ScopedJoinHandle<'scope, ()>,
}

/// How long the answer thread polls after its last work before it sleeps
/// (the main thread's own spin when searching on a GPU; none on the CPU,
/// where every search is done when it reaches the thread).
fn spin(device: &Device) -> Duration {
    match device {
        Device::Gpu(_) => Duration::from_micros(500),
        Device::Cpu => Duration::ZERO,
    }
}

/// Starts the answer thread within `scope` (it ends when the Answerer is
/// dropped).
pub fn start<'scope, 'env>(
    scope: &'scope Scope<'scope, 'env>,
    device: &'env Device,
    shared: &'static Shared,
    control: &'env Control,
) -> Answerer<'scope> {
    let (to, from) = channel();
    // the thread blocks every asynchronous signal: they are the main's
    let thread = crate::threads::with_signals_blocked(|| {
        std::thread::Builder::new()
            .name("gpu_graph answers".into())
            .spawn_scoped(scope, move || run(device, shared, from, control))
            .expect("starting the worker's answer thread")
    });
    Answerer { to, control, thread }
}

impl Answerer<'_> {
    /// Hands over requests taken in one pass (then one wake-up at most).
    pub fn send(&self, requests: impl IntoIterator<Item = Answering>) {
        let mut any = false;
        for a in requests {
            // (fails only once the thread has ended, when the worker exits)
            let _ = self.to.send(a);
            any = true;
        }
        if any && self.control.parked.load(Ordering::SeqCst) {
            self.thread.thread().unpark();
        }
    }

    /// Whether a search failed with an error since the last call (the main
    /// thread then checks the device).
    pub fn take_device_check(&self) -> bool {
        self.control.check_device.load(Ordering::Relaxed) && self.control.check_device.swap(false, Ordering::AcqRel)
    }

    /// The core to run on (after gpu_graph.worker_core changed).
    pub fn set_core(&self, core: Option<usize>) {
        self.control.core.store(core.map_or(-1, |c| c as i32), Ordering::Relaxed);
        self.thread.thread().unpark();
    }

    /// Whether the thread has ended (it ends only when told to, or by a
    /// panic: the worker then exits).
    pub fn ended(&self) -> bool {
        self.thread.is_finished()
    }
}

/// The thread ends when its end is dropped (the scope then joins it), also
/// when the main thread unwinds from an ERROR: the requests it held are let
/// go unanswered (the worker is exiting: its exit wakes their backends,
/// and the next worker takes them again).
impl Drop for Answerer<'_> {
    fn drop(&mut self) {
        self.control.stop.store(true, Ordering::SeqCst);
        self.thread.thread().unpark();
    }
}

fn run(device: &Device, shared: &'static Shared, from: Receiver<Answering>, control: &Control) {
    let spin = spin(device);
    let mut held: Vec<Answering> = Vec::new();
    let mut last_work = Instant::now();
    let mut core = -1;
    loop {
        let wanted = control.core.load(Ordering::Relaxed);
        if wanted != core {
            core = wanted;
            own_core::run_on(usize::try_from(core).ok());
        }
        let mut took = false;
        while let Ok(a) = from.try_recv() {
            held.push(a);
            took = true;
        }
        if control.stop.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        let (answered, on_device, next_due) = progress(device, shared, control, &mut held, now);
        if took || answered || on_device {
            last_work = now;
            if on_device {
                std::hint::spin_loop();
            }
            continue;
        }
        if now.saturating_duration_since(last_work) < spin {
            std::hint::spin_loop();
            continue;
        }
        // nothing on the device: sleep until a request, the next delayed
        // answer, or a second (the main thread wakes it when it sends)
        control.parked.store(true, Ordering::SeqCst);
        match from.try_recv() {
            Ok(a) => held.push(a),
            Err(_) => std::thread::park_timeout(next_due.unwrap_or(Duration::from_secs(1))),
        }
        control.parked.store(false, Ordering::SeqCst);
    }
}

/// Looks at every held request: answers those done (and due), lets go of
/// those whose backend gave up. Whether it answered any, whether any is
/// still on the device, and when the next delayed one is due.
fn progress(
    device: &Device,
    shared: &Shared,
    control: &Control,
    held: &mut Vec<Answering>,
    now: Instant,
) -> (bool, bool, Option<Duration>) {
    let c = &shared.counters;
    let (mut answered, mut on_device, mut next_due) = (false, false, None::<Duration>);
    let (mut pending, mut look_ns, mut collect_ns) = (0, 0, 0);
    let started = Mark::now();
    let mut i = 0;
    while i < held.len() {
        let a = &mut held[i];
        let slot = &shared.slots()[a.slot];
        if slot.abandoned(a.seq) {
            // the backend gave up: free the slot (dropping a GPU ticket
            // abandons its GPU slot too)
            slot.answer(a.seq);
            held.swap_remove(i);
            continue;
        }
        if let Search::Gpu(p) = &mut a.work {
            let mark = Mark::now();
            let polled = device.poll(p);
            // (a look that found it finished collected its answer too)
            match polled {
                Ok(None) => look_ns += mark.ns(),
                _ => collect_ns += mark.ns(),
            }
            match polled {
                Ok(None) => {
                    pending += 1;
                    on_device = true;
                    i += 1;
                    continue;
                }
                Ok(Some(hits)) => a.work = Search::Done(Ok(hits)),
                Err(o) => {
                    if o == Outcome::Error {
                        control.check_device.store(true, Ordering::Release);
                    }
                    a.work = Search::Done(Err(o));
                }
            }
        }
        if let Some(d) = a.due.filter(|&d| now < d) {
            let wait = d - now;
            next_due = Some(next_due.map_or(wait, |n| n.min(wait)));
            i += 1;
            continue;
        }
        let a = held.swap_remove(i);
        let what = match a.work {
            Search::Done(Ok(hits)) => Reply::Scan(hits, a.rows.as_ref()),
            Search::Done(Err(o)) => Reply::Failed(o),
            Search::Gpu(_) => unreachable!("answered only when done"),
        };
        answer(shared, a.slot, a.seq, a.taken_at, what);
        answered = true;
    }
    if pending > 0 {
        add(&c.polls_pending, pending);
    }
    if look_ns + collect_ns > 0 {
        add(&c.profile.look, look_ns);
        add(&c.profile.collect, collect_ns);
    }
    if answered {
        add(&c.progress_ns, started.ns());
    }
    (answered, on_device, next_due)
}

/// What a reply says.
pub enum Reply<'a> {
    /// a scan's answer, with the rows of the copy searched when its
    /// distances are the pages'
    Scan(Hits, Option<&'a Rows>),
    /// a batch's answers are in its segment
    Batch,
    /// why there is no answer
    Failed(Outcome),
}

/// Writes the reply of the request in `slot` (WORKING under `seq`, taken
/// at `taken_at`) and wakes its backend.
pub fn answer(shared: &Shared, slot: usize, seq: u64, taken_at: i64, what: Reply) {
    let mark = Mark::now();
    let slot = &shared.slots()[slot];
    // read before DONE: the backend may free and someone reuse the slot after
    // SAFETY: the worker holds the slot (WORKING, or ABANDONED if its
    // backend gave up) under `seq` until `slot.answer` below; only it
    // touches the request and the reply meanwhile.
    let (procno, reply) = unsafe { (slot.request().procno, slot.reply_mut()) };
    let c = &shared.counters;
    let now = timestamp_now();
    reply.with_rows = false;
    match what {
        Reply::Batch => {
            add(&c.batch_us, (now - taken_at).max(0) as u64);
            reply.n = 0;
            reply.outcome = Outcome::Answered;
        }
        Reply::Scan(hits, rows) => {
            add(&c.searched, 1);
            c.latency.search.record(now - taken_at);
            let n = hits.len().min(MAX_HITS);
            // each node's row and distance from the copy (worker::rows)
            let rows = rows.map(|r| r.read());
            let mut with_rows = rows.is_some();
            for (j, &(dist, node)) in hits[..n].iter().enumerate() {
                reply.nodes[j] = node;
                match rows.as_ref().map(|r| r.get(node)) {
                    Some(Some(row)) => (reply.dists[j], reply.rows[j]) = (dist, row),
                    _ => with_rows = false,
                }
            }
            reply.with_rows = with_rows;
            reply.n = n as u32;
            reply.outcome = Outcome::Answered;
        }
        Reply::Failed(o) => {
            reply.n = 0;
            reply.outcome = o;
        }
    }
    reply.answered_at = now;
    add(&c.answered, 1);
    mark.lap(&c.profile.reply);
    if slot.answer(seq) {
        let t = Instant::now();
        set_latch(procno);
        add(&c.wake_ns, t.elapsed().as_nanos() as u64);
    }
}
