//! The search worker process: registration, start, the main loop, exit.
//!
//! One loop on the main thread (PostgreSQL calls are allowed there only):
//! take SUBMITTED slots, start their searches, poll the ones on the GPU,
//! answer the finished ones, and read a few pages of a copy being loaded.
//! It sleeps on its latch when there is nothing to do; backends set that
//! latch when they submit. The worker is connected to no database (see
//! `register`); it reads pages by RelFileNode (see `image`).
//!
//! Exits: SIGTERM (pg_terminate_backend, server shutdown) ends the loop, as
//! does a GPU index build starting (the worker steps aside: `gpu_builds`); the
//! worker drops its copies, shuts the GPU server down and exits with status 1
//! so that the postmaster starts it again after bgw_restart_time (status 0
//! would unregister it). Any ERROR or panic inside becomes FATAL (a
//! background worker has no outer error handler): also status 1, never a
//! signal, so PostgreSQL never restarts the other backends because of it. A
//! poisoned GPU context (a device fault) ends the loop the same way. On every
//! exit path the exit callback first marks the worker absent and wakes the
//! backends waiting on it, which then search on the CPU.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::pg_sys;
use pgrx::prelude::*;

use super::batch_area::Area;
use super::device::{BatchStart, Device, Handle, Hits, Start};
use super::gpu::{GpuBatch, GpuPending};
use super::image::Key;
use super::outcome::Outcome;
use super::own_core;
use super::profile::Mark;
use super::residency::{CopyId, Lookup, Residency};
use super::ring::{Request, State, MAX_HITS};
use super::shmem::{shared, Shared};
use super::stats::{add, Counters};
use super::{nap, set_latch, sleep};
use crate::gucs::{Switch, WorkerDevice, GPU_MEMORY_LIMIT, WORKER, WORKER_DEVICE};

/// Seconds the postmaster waits before starting a worker that exited.
const RESTART_SECONDS: i32 = 1;
/// Seconds a worker that could not open its device waits before exiting
/// (and being started again), so a missing GPU does not flood the log.
const RETRY_SECONDS: u64 = 10;
/// With a GPU, how long the loop keeps polling after its last work before
/// it sleeps: a sleeping worker costs each new query a signal and a wakeup.
const GPU_SPIN: Duration = Duration::from_micros(500);
/// How often the worker looks for copies of dropped indexes.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Whether the worker starts: gpu_graph.worker, and for `auto` a GPU device
/// node (looked at without touching CUDA: the postmaster must never create a
/// CUDA context, which forked children cannot use) or the CPU test mode.
pub fn wanted() -> bool {
    match WORKER.get() {
        Switch::Off => false,
        Switch::On => true,
        Switch::Auto => {
            WORKER_DEVICE.get() == WorkerDevice::Cpu
                || ["/dev/nvidiactl", "/dev/nvidia0"].iter().any(|p| Path::new(p).exists())
        }
    }
}

fn set_name<const N: usize>(dst: &mut [std::ffi::c_char; N], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = b as std::ffi::c_char;
    }
}

/// Registers the worker (from _PG_init while shared_preload_libraries loads).
pub fn register() {
    let mut w = pg_sys::BackgroundWorker::default();
    set_name(&mut w.bgw_name, "gpu_graph search worker");
    set_name(&mut w.bgw_type, "gpu_graph search worker");
    set_name(&mut w.bgw_library_name, "gpu_graph");
    set_name(&mut w.bgw_function_name, "gpu_graph_worker_main");
    // connected to no database (as the logical replication launcher): it
    // is then a backend like any other, listed in pg_stat_activity, ended
    // by pg_terminate_backend, and it takes part in ProcSignal barriers
    w.bgw_flags = (pg_sys::BGWORKER_SHMEM_ACCESS | pg_sys::BGWORKER_BACKEND_DATABASE_CONNECTION) as i32;
    // from a consistent state on: hot standby scans are served too
    w.bgw_start_time = pg_sys::BgWorkerStartTime::BgWorkerStart_ConsistentState;
    w.bgw_restart_time = RESTART_SECONDS;
    // SAFETY: called from _PG_init while shared_preload_libraries loads, on
    // the postmaster's only thread; PostgreSQL copies `w`.
    unsafe { pg_sys::RegisterBackgroundWorker(&mut w) };
}

fn shutdown_requested() -> bool {
    // SAFETY: a volatile read of a sig_atomic_t the SIGTERM handler sets.
    unsafe { std::ptr::read_volatile(&raw const pg_sys::ShutdownRequestPending) != 0 }
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn gpu_graph_worker_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(None, None);
    let shared = shared().expect("the search worker runs only when gpu_graph is preloaded");
    // SAFETY: the worker's main thread, at its start: no resource owner is
    // set yet (there is no transaction), and at_exit has the signature
    // before_shmem_exit expects.
    unsafe {
        // buffer pins need a resource owner; there is no transaction here
        pg_sys::CurrentResourceOwner =
            pg_sys::ResourceOwnerCreate(std::ptr::null_mut(), c"gpu_graph search worker".as_ptr());
        pg_sys::before_shmem_exit(Some(at_exit), pg_sys::Datum::from(0));
    }
    if WORKER_DEVICE.get() != WorkerDevice::Cpu {
        // a GPU build runs: the GPU is its alone until it ends (gpu_builds)
        while shared.gpu_builders.any() && !shutdown_requested() {
            nap(Duration::from_millis(100));
        }
    }
    // the slots first: the device's server takes the answer area, where a
    // scan may still read what the previous worker's GPU wrote
    for slot in shared.slots() {
        slot.recover();
    }
    let device = match Device::open(WORKER_DEVICE.get()) {
        Ok(d) => d,
        Err(e) => {
            log!("gpu_graph search worker: cannot start: {e}; scans search on the CPU; trying again in {RETRY_SECONDS} s");
            let until = Instant::now() + Duration::from_secs(RETRY_SECONDS);
            while !shutdown_requested() && Instant::now() < until {
                nap(until - Instant::now());
            }
            // SAFETY: ends the process; nothing of ours needs unwinding
            // (the exit callback marks the worker absent).
            unsafe { pg_sys::proc_exit(1) };
        }
    };
    let auto_limit = device.auto_limit();
    shared.worker_device.store(device.code(), Ordering::Relaxed);
    keep_core(shared, &device);
    // SAFETY: MyProc and MyProcPid are this process's, set before its main
    // function runs.
    let (procno, pid) = unsafe { ((*pg_sys::MyProc).pgprocno, pg_sys::MyProcPid) };
    shared.worker_procno.store(procno, Ordering::Release);
    shared.worker_starts.fetch_add(1, Ordering::AcqRel);
    shared.worker_pid.store(pid, Ordering::Release);
    log!("gpu_graph search worker: serving index scans on {}", device.describe());

    let mut w = Worker {
        shared,
        device,
        auto_limit,
        residency: Residency::default(),
        inflight: Vec::new(),
        taken: Vec::new(),
        health_at: Instant::now(),
        segment: None,
    };
    let outcome = w.serve();
    w.residency.clear(&w.device, shared);
    w.device.shutdown();
    match outcome {
        Ok(Stop::Shutdown) => log!("gpu_graph search worker: stopping"),
        Ok(Stop::StepAside) => log!("gpu_graph search worker: leaving the GPU to an index build until it ends"),
        Err(why) => log!("gpu_graph search worker: exiting after a device failure: {why}"),
    }
    drop(w);
    // SAFETY: ends the process once its copies and the device are released.
    unsafe { pg_sys::proc_exit(1) };
}

/// Every exit: not serving any more, and the backends that wait learn it now.
#[pg_guard]
unsafe extern "C-unwind" fn at_exit(_code: i32, _arg: pg_sys::Datum) {
    let Some(shared) = shared() else { return };
    shared.worker_pid.store(0, Ordering::Release);
    shared.worker_device.store(0, Ordering::Relaxed);
    shared.worker_core.store(0, Ordering::Relaxed);
    shared.residents.publish(&[]);
    for slot in shared.slots() {
        if matches!(slot.state().1, State::Submitted | State::Working | State::Answering) {
            // SAFETY: a submitted request is not written until its backend
            // lets go of the slot and claims one again; the read is volatile,
            // and a stale procno wakes some other process once (set_latch
            // checks the range), which latches allow.
            set_latch(unsafe { std::ptr::read_volatile(&slot.request().procno) });
        }
    }
    // a load in progress holds session locks on its index and database;
    // outside a transaction nothing else would release them
    // SAFETY: the worker's exit callback, on its main thread; the worker
    // holds no lock it still needs.
    unsafe { pg_sys::LockReleaseAll(pg_sys::DEFAULT_LOCKMETHOD as u16, true) };
}

/// Keeps a core to the worker's main thread, or none, as
/// gpu_graph.worker_core says; the backends read which in shared memory.
fn keep_core(shared: &Shared, device: &Device) {
    let core = own_core::keep_for_worker(matches!(device, Device::Gpu(_)));
    shared.worker_core.store(core.map_or(0, |c| c as i32 + 1), Ordering::Relaxed);
}

/// Why the worker stops serving (it exits either way, and is started again).
enum Stop {
    /// SIGTERM: pg_terminate_backend or the server's shutdown
    Shutdown,
    /// a backend builds an index on the GPU (see `gpu_builds`)
    StepAside,
}

/// A request the worker holds (its slot in WORKING).
struct InFlight {
    slot: usize,
    seq: u64,
    taken_at: i64,
    /// gpu_graph.worker_delay: not answered before this
    due: Option<Instant>,
    /// queries of a batch (0: a scan's one query)
    batch: u32,
    /// the copy a scan's (or batch's) queries are searched on
    copy: Option<CopyId>,
    /// a batch's answers were written with their lead's rows (batch_area)
    rows: bool,
    /// its route published: the scan reads the answer itself while it polls
    /// (worker::own_answer)
    own: bool,
    work: Work,
}

enum Work {
    Done(Result<Hits, Outcome>),
    Gpu(GpuPending),
    /// a batch on the device, its segment attached, since when
    Batch(Area, Box<GpuBatch>, Instant),
    /// a batch's answers, to be written to its segment
    BatchAnswers(Area, Vec<Hits>),
}

struct Worker {
    shared: &'static Shared,
    device: Device,
    auto_limit: usize,
    residency: Residency,
    inflight: Vec<InFlight>,
    /// the slots taken in one pass (kept for its allocation)
    taken: Vec<(usize, u64)>,
    /// the last health check while the scans read their own answers
    health_at: Instant,
    /// the last batch segment mapped, kept for the next segment of queries
    /// its backend sends (worker::batch_area), and since when; let go when
    /// idle or after SEGMENT_KEEP unused (its backend has finished, and the
    /// mapping would keep its memory)
    segment: Option<(Area, Instant)>,
}

/// How often the device's health is checked while scans read their own
/// answers (a fault then ends the worker, and the scans fall back).
const HEALTH_EVERY: Duration = Duration::from_millis(2);

/// How long an unused batch segment stays mapped.
const SEGMENT_KEEP: Duration = Duration::from_secs(1);

impl Worker {
    /// gpu_graph.gpu_memory_limit in bytes (0 = none).
    fn limit(&self) -> usize {
        match GPU_MEMORY_LIMIT.get() {
            0 => self.auto_limit,
            mb => (mb as usize) << 20,
        }
    }

    /// Runs until SIGTERM or a GPU build (Ok), or a device failure (Err).
    fn serve(&mut self) -> Result<Stop, String> {
        let mut last_work = Instant::now();
        let mut last_sweep = Instant::now();
        let on_gpu = matches!(self.device, Device::Gpu(_));
        let spin = if on_gpu { GPU_SPIN } else { Duration::ZERO };
        let shared = self.shared;
        let c = &shared.counters;
        loop {
            let pass = Instant::now();
            let (answered, patches) = (c.answered.load(Ordering::Relaxed), c.patches.load(Ordering::Relaxed));
            // SAFETY: as in `sleep`.
            unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
            // ProcSignal barriers (DROP DATABASE waits for every process to
            // close its files) and a cancel (an ERROR: the worker restarts)
            pg_sys::check_for_interrupts!();
            if shutdown_requested() {
                return Ok(Stop::Shutdown);
            }
            if on_gpu && self.shared.gpu_builders.any() {
                return Ok(Stop::StepAside);
            }
            // SAFETY: the SIGHUP handler sets the flag (a sig_atomic_t, read
            // volatile); on the main thread, as PostgreSQL's own processes do,
            // clear it and reread the configuration.
            unsafe {
                if std::ptr::read_volatile(&raw const pg_sys::ConfigReloadPending) != 0 {
                    pg_sys::ConfigReloadPending = 0;
                    pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP);
                    keep_core(shared, &self.device);
                }
            }
            if self.segment.as_ref().is_some_and(|(_, since)| pass.saturating_duration_since(*since) > SEGMENT_KEEP) {
                self.segment = None;
            }
            // three looks at the clock a busy pass (its start, after taking,
            // its end; the cycle counter in their place and in the answers'
            // saved nothing measurable on the GPU machine, docs/benchmarks.md)
            let took = self.take_requests(pass)?;
            let after_take = Instant::now();
            if took {
                add(&c.take_ns, (after_take - pass).as_nanos() as u64);
            }
            if !took {
                // idle: the copies take every page written so far, even of
                // inserts in progress, so that the request that needs them
                // finds little left to patch (patching only what is
                // published when idle kept 64-77% of the read-only
                // queries/s at 1,000 inserts/s against 89-92%, in two H100
                // runs, docs/benchmarks.md), and a quiet spell of writes
                // does not overflow the log
                // SAFETY: the worker's main thread, with a resource owner.
                unsafe { self.residency.sync(&self.device, self.shared)? };
            }
            let t = if took { after_take } else { Instant::now() };
            let answered_before = c.answered.load(Ordering::Relaxed);
            let on_device = self.progress(t)?;
            // SAFETY: the worker lives on the process's main thread
            // (gpu_graph_worker_main), which has a resource owner.
            let loading = unsafe { self.residency.step(&self.device, self.limit(), self.shared)? };
            let end = Instant::now();
            if c.answered.load(Ordering::Relaxed) != answered_before {
                // (a load's step included, when one is under way)
                add(&c.progress_ns, (end - t).as_nanos() as u64);
            }
            if end - last_sweep >= SWEEP_EVERY {
                // SAFETY: as for the step above.
                unsafe { self.residency.forget_dropped(&self.device, self.shared) };
                // SAFETY: as above: a file's pages are looked up on this thread.
                self.shared.meta_mirror.sweep(|k| unsafe { k.exists() });
                last_sweep = end;
            }
            let worked = took
                || loading
                || c.answered.load(Ordering::Relaxed) != answered
                || c.patches.load(Ordering::Relaxed) != patches;
            if worked {
                add(&c.work_ns, (end - pass).as_nanos() as u64);
                add(&c.passes, 1);
            }
            if took || on_device || loading {
                last_work = end;
                continue;
            }
            if last_work.elapsed() < spin {
                std::hint::spin_loop();
                continue;
            }
            self.device.check()?;
            // a quiet spell: the last batch's segment is let go (its backend
            // has sent all it had, or will map it again)
            self.segment = None;
            // until a request, the next delayed answer, or a second
            let now = Instant::now();
            let next = self.inflight.iter().filter_map(|f| f.due).map(|d| d.saturating_duration_since(now)).min();
            sleep(next.unwrap_or(Duration::from_secs(1)));
        }
    }

    /// Takes every submitted request; whether there was one. The copies
    /// follow the change log after the requests are taken and before any
    /// is searched, when one needs changes not read yet: each sees every
    /// change committed before it was submitted.
    fn take_requests(&mut self, now: Instant) -> Result<bool, String> {
        let mut taken = std::mem::take(&mut self.taken);
        taken.clear();
        let prof = &self.shared.counters.profile;
        let mark = Mark::now();
        for (i, slot) in self.shared.slots().iter().enumerate() {
            if let Some(seq) = slot.take() {
                taken.push((i, seq));
            }
        }
        let mut mark = if taken.is_empty() { mark } else { mark.lap(&prof.scan) };
        // what the requests need of the log (a standby's, u64::MAX: none;
        // their copies go by the generation)
        let need = taken
            .iter()
            // SAFETY: just taken (WORKING): no one writes these requests.
            .map(|&(i, _)| unsafe { self.shared.slots()[i].request() }.need)
            .filter(|&n| n != u64::MAX)
            .max();
        if need.is_some_and(|n| self.residency.behind(n, self.shared)) {
            // SAFETY: the worker's main thread, as in `serve`.
            unsafe { self.residency.sync(&self.device, self.shared)? };
            mark = mark.lap(&prof.patch);
        }
        let took = !taken.is_empty();
        // SAFETY: reads the clock; any process may.
        let taken_at = if took { unsafe { pg_sys::GetCurrentTimestamp() } } else { 0 };
        for &(i, seq) in &taken {
            self.start(i, seq, taken_at, now)?;
        }
        if let Err(o) = self.device.send_held() {
            // the device is lost: the held searches fail when polled
            failed(&self.device, o)?;
        }
        if took {
            mark.lap(&prof.start);
        }
        self.taken = taken;
        Ok(took)
    }

    /// Starts the search of the request in slot `i`, just taken under `seq`
    /// at `taken_at` (GetCurrentTimestamp) in the pass that began `now`.
    fn start(&mut self, i: usize, seq: u64, taken_at: i64, now: Instant) -> Result<(), String> {
        let shared = self.shared;
        // SAFETY: take_requests took the slot (WORKING under `seq`): no one
        // writes its request until the worker lets go of it.
        let req = unsafe { shared.slots()[i].request() };
        add(&shared.counters.taken, 1);
        shared.counters.latency.queue.record(taken_at - req.submitted_at);
        if req.fault {
            log!("gpu_graph search worker: failing on purpose (gpu_graph.inject_fault)");
            self.device.inject_fault();
        }
        let query = &req.query[..(req.dim as usize).min(req.query.len())];
        let mut copy = None;
        let mut route = None;
        let work = match self.residency.lookup(Key::of(req), req.generation, req.need) {
            Lookup::Ready(r) if req.batch_n > 0 => {
                copy = Some(r.id());
                batch_work(&self.device, &r.handle, req, &shared.counters, &mut self.segment)?
            }
            Lookup::Ready(r) => {
                copy = Some(r.id());
                match self.device.start(&r.handle, query, req.k as usize, req.ef as usize) {
                    Ok(Start::Done(hits)) => Work::Done(Ok(hits)),
                    Ok(Start::Pending(p)) => {
                        route = self.device.route(&p).filter(|_| req.delay_ms == 0);
                        Work::Gpu(p)
                    }
                    Err(o) => Work::Done(Err(failed(&self.device, o)?)),
                }
            }
            Lookup::Unfit => Work::Done(Err(Outcome::Unfit)),
            Lookup::Stale => {
                // SAFETY: the worker's main thread, as in `serve`.
                unsafe { self.residency.want(req, &self.device, self.limit(), shared) };
                Work::Done(Err(Outcome::Stale))
            }
        };
        // the scan may read its answer itself where the copy's rows are the
        // answer's (as for a reply with rows) and no delay is asked for
        let own = match (route, copy) {
            (Some(route), Some(id)) if self.residency.rows(id).is_some() => {
                shared.slots()[i].publish(seq, route);
                true
            }
            _ => false,
        };
        let due = (req.delay_ms > 0).then(|| now + Duration::from_millis(req.delay_ms as u64));
        self.inflight.push(InFlight { slot: i, seq, taken_at, due, batch: req.batch_n, copy, rows: false, own, work });
        Ok(())
    }

    /// Polls the searches on the device and answers those that are done;
    /// whether any is still on the device.
    fn progress(&mut self, now: Instant) -> Result<bool, String> {
        let mut on_device = false;
        // (counted once a pass: an atomic add a look would cost as much as the look)
        let (mut pending, mut look_ns, mut collect_ns) = (0, 0, 0);
        let mut own_pending = false;
        let mut i = 0;
        while i < self.inflight.len() {
            let f = &mut self.inflight[i];
            let slot = &self.shared.slots()[f.slot];
            if slot.abandoned(f.seq) {
                // the backend gave up: free the slot (dropping a GPU ticket
                // abandons its GPU slot too)
                slot.answer(f.seq);
                self.inflight.swap_remove(i);
                continue;
            }
            if let Work::Batch(_, b, since) = &mut f.work {
                match self.device.poll_batch(b) {
                    Ok(None) => {
                        on_device = true;
                        i += 1;
                        continue;
                    }
                    Ok(Some(answers)) => {
                        add(&self.shared.counters.batch_device_us, since.elapsed().as_micros() as u64);
                        if let Work::Batch(area, ..) = std::mem::replace(&mut f.work, Work::Done(Ok(Vec::new()))) {
                            f.work = Work::BatchAnswers(area, answers);
                        }
                    }
                    Err(o) => f.work = Work::Done(Err(failed(&self.device, o)?)),
                }
            }
            // a batch's answers (the CPU's at once, the GPU's once polled)
            // go to its segment with the copy's rows, when its distances are
            // the pages' and it still follows the log (as for a scan's reply)
            if matches!(f.work, Work::BatchAnswers(..)) {
                if let Work::BatchAnswers(mut area, answers) =
                    std::mem::replace(&mut f.work, Work::Done(Ok(Vec::new())))
                {
                    let t = Instant::now();
                    let rows = f.copy.and_then(|id| self.residency.rows(id)).map(|r| move |node| r.get(node));
                    f.rows = area.write(answers.iter().map(|a| a.as_slice()), rows);
                    add(&self.shared.counters.batch_write_us, t.elapsed().as_micros() as u64);
                    self.segment = Some((area, Instant::now()));
                }
            }
            if let (true, Work::Gpu(p)) = (f.own, &f.work) {
                // a scan that polls reads its answer itself
                match slot.state() {
                    (s, State::Collected) if s == f.seq => {
                        // read: its GPU slot is free again (the ticket's drop)
                        let c = &self.shared.counters;
                        add(&c.searched, 1);
                        add(&c.answered, 1);
                        add(&c.answers_read, 1);
                        slot.free_collected(f.seq);
                        self.inflight.swap_remove(i);
                        continue;
                    }
                    (s, State::Working) if s == f.seq && slot.asleep(f.seq) && self.device.finished(p) => {
                        // asleep: the worker answers, unless the scan
                        // read it meanwhile
                        if !slot.answering(f.seq) {
                            i += 1;
                            continue;
                        }
                    }
                    _ => {
                        own_pending = true;
                        pending += 1;
                        on_device = true;
                        i += 1;
                        continue;
                    }
                }
            }
            if let Work::Gpu(p) = &mut f.work {
                let mark = Mark::now();
                let polled = self.device.poll(p);
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
                    Ok(Some(hits)) => f.work = Work::Done(Ok(hits)),
                    Err(o) => f.work = Work::Done(Err(failed(&self.device, o)?)),
                }
            }
            if f.due.is_some_and(|d| now < d) {
                i += 1;
                continue;
            }
            let f = self.inflight.swap_remove(i);
            self.answer(f);
        }
        let c = &self.shared.counters;
        if pending > 0 {
            add(&c.polls_pending, pending);
        }
        if own_pending && now.saturating_duration_since(self.health_at) >= HEALTH_EVERY {
            // searches the scans read themselves are not polled here: a
            // failed device is found by its health check
            self.health_at = now;
            self.device.check()?;
        }
        if look_ns + collect_ns > 0 {
            add(&c.profile.look, look_ns);
            add(&c.profile.collect, collect_ns);
        }
        Ok(on_device)
    }

    fn answer(&self, f: InFlight) {
        let mark = Mark::now();
        let slot = &self.shared.slots()[f.slot];
        // read before DONE: the backend may free and someone reuse the slot after
        // SAFETY: the worker holds the slot (WORKING, or ABANDONED if its
        // backend gave up) under f.seq until `slot.answer` below; only it
        // touches the request and the reply meanwhile.
        let (procno, reply) = unsafe { (slot.request().procno, slot.reply_mut()) };
        let c = &self.shared.counters;
        // SAFETY: reads the clock; any process may.
        let now = unsafe { pg_sys::GetCurrentTimestamp() };
        reply.with_rows = false;
        match f.work {
            Work::Done(Ok(_)) if f.batch > 0 => {
                add(&c.batch_us, (now - f.taken_at).max(0) as u64);
                reply.n = 0; // the answers are in the batch's segment
                reply.with_rows = f.rows;
                reply.outcome = Outcome::Answered;
            }
            Work::Done(Ok(hits)) => {
                add(&c.searched, 1);
                c.latency.search.record(now - f.taken_at);
                let n = hits.len().min(MAX_HITS);
                // each node's row and distance from the copy, when its
                // distances are the pages' and it still follows the log
                let rows = f.copy.and_then(|id| self.residency.rows(id));
                let mut with_rows = rows.is_some();
                for (j, &(dist, node)) in hits[..n].iter().enumerate() {
                    reply.nodes[j] = node;
                    match rows.map(|r| r.get(node)) {
                        Some(Some(row)) => (reply.dists[j], reply.rows[j]) = (dist, row),
                        _ => with_rows = false,
                    }
                }
                reply.with_rows = with_rows;
                reply.n = n as u32;
                reply.outcome = Outcome::Answered;
            }
            Work::Done(Err(o)) => {
                reply.n = 0;
                reply.outcome = o;
            }
            Work::Gpu(_) | Work::Batch(..) | Work::BatchAnswers(..) => unreachable!("answered only when done"),
        }
        reply.answered_at = now;
        add(&c.answered, 1);
        mark.lap(&c.profile.reply);
        if slot.answer(f.seq) {
            let t = Instant::now();
            set_latch(procno);
            add(&c.wake_ns, t.elapsed().as_nanos() as u64);
        }
    }
}

/// A batch's searches (gpu_graph_search_batch), started on the device with
/// its segment attached; answered at once when the device is the CPU (its
/// answers then already written). A backend that let go of the segment
/// gets Absent (it no longer waits).
fn batch_work(
    device: &Device,
    h: &Handle,
    req: &Request,
    c: &Counters,
    kept: &mut Option<(Area, Instant)>,
) -> Result<Work, String> {
    let t = Instant::now();
    let (n, cap, dim, hits) = (req.batch_n as usize, req.batch_cap as usize, req.dim as usize, req.ef as usize);
    let lead = req.batch_lead as usize;
    let mut area = match kept.take() {
        Some((a, _)) if a.is(req.batch_dsm, cap, dim, hits, lead) => a,
        // SAFETY: the worker's main thread (gpu_graph_worker_main), with
        // its resource owner (an older mapping was let go just above).
        _ => match unsafe { Area::attach(req.batch_dsm, cap, dim, hits, lead) } {
            Some(a) => a,
            None => return Ok(Work::Done(Err(Outcome::Absent))),
        },
    };
    if n > cap {
        return Ok(Work::Done(Err(Outcome::Unfit)));
    }
    area.set_len(n);
    Ok(match device.start_batch(h, area.queries(), dim, req.k as usize, req.ef as usize, req.batch_width as usize) {
        // (written to the segment by `progress`, with the copy's rows)
        Ok(BatchStart::Done(answers)) => Work::BatchAnswers(area, answers),
        Ok(BatchStart::Pending(b)) => {
            add(&c.batch_start_us, t.elapsed().as_micros() as u64);
            Work::Batch(area, Box::new(b), Instant::now())
        }
        Err(o) => Work::Done(Err(failed(device, o)?)),
    })
}

/// A failed search: its outcome for the backend, or Err when the device
/// failed for good (the worker then exits and is started again).
fn failed(device: &Device, o: Outcome) -> Result<Outcome, String> {
    if o == Outcome::Error {
        device.check()?;
    }
    Ok(o)
}
