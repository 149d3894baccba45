//! Graph construction for CREATE INDEX: on the GPU when `gpu_graph.build_device`
//! allows and one is usable, else on the CPU. Both run GRNND / RNN-Descent
//! with the same parameters and the same final cut, so either graph serves the
//! same scans.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

use gpu_graph_engine::cfs::{self, CfsParams};
use gpu_graph_engine::cost;
use gpu_graph_engine::graph::Graph;
use gpu_graph_engine::params::{BuildParams, ScanOrder};
use gpu_graph_engine::rnn_descent;
use gpu_graph_engine::sharded::{self, Lists, Plan, Rows, ShardBuilder, ShardStats};
use gpu_graph_gpu::{device_bytes, Control, Gpu, GpuError, KnnInit};
use pgrx::pg_sys;
use pgrx::prelude::*;

use super::streamed;
use crate::gucs::{BuildDevice, BUILD_DEVICE, BUILD_GPUS, BUILD_GPU_MEMORY};
use crate::latch;
use crate::worker::GpuBuild;

pub enum Device {
    Cpu { threads: usize },
    Gpu { name: String },
}

pub struct Constructed {
    pub graph: Graph,
    pub device: Device,
    pub upload_ms: f32,
    pub construct_ms: f32,
    pub download_ms: f32,
    /// a build in shards
    pub shards: Option<ShardStats>,
    /// the CFS refinement, when the index's algorithm has one
    pub cfs: Option<super::refine::CfsStats>,
}

/// Tells the GPU thread to stop at its next round. Set on the way out of the
/// backend's side of the build, whichever way it leaves: a cancel or
/// statement_timeout raised by CHECK_FOR_INTERRUPTS, an ERROR while writing
/// pages, or the normal end (when the GPU thread is done anyway).
///
/// The GPU thread reads only this flag, never PostgreSQL's: InterruptPending
/// is also set by harmless interrupts (the idle-stats timeout armed before the
/// statement, ProcSignal barriers, pg_log_backend_memory_contexts) and stays
/// set while the backend holds interrupts off, so reading it aborted long
/// builds nobody cancelled. Deciding what an interrupt means is
/// ProcessInterrupts' job, on the backend thread.
pub(super) struct StopOnDrop<'a>(pub(super) &'a Watch);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::Relaxed);
    }
}

/// Between the GPU thread and the backend: the stop flag, and the rounds
/// done, which the backend reports as the CPU build does.
#[derive(Default)]
pub(super) struct Watch {
    stop: AtomicBool,
    done: AtomicUsize,
    total: AtomicUsize,
    /// a sharded build: the shards built so far, and how many in all (0:
    /// built whole); the rounds reported count over every shard
    shard: AtomicUsize,
    shards: AtomicUsize,
    /// a sharded build's plan and expected time, for the backend's NOTICE
    plan: OnceLock<String>,
}

impl Control for Watch {
    fn stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
    fn round(&self, done: usize, total: usize) {
        let (shard, shards) = (self.shard.load(Ordering::Relaxed), self.shards.load(Ordering::Relaxed).max(1));
        self.total.store(total * shards, Ordering::Relaxed);
        self.done.store(shard * total + done, Ordering::Relaxed);
    }
}

impl Watch {
    /// The backend's turn while a GPU thread builds: the rounds done into
    /// the progress view, and any interrupt served (a cancel raises here).
    pub(super) fn waiting(&self) {
        report_rounds(self.done.load(Ordering::Relaxed), self.total.load(Ordering::Relaxed));
        latch::check_interrupts();
    }
}

/// A build's rounds in pg_stat_progress_create_index (tuples done / total,
/// as PostgreSQL's view names its counters).
pub(super) fn report_rounds(done: usize, total: usize) {
    // SAFETY: updates this backend's own progress entry, on its own thread.
    unsafe {
        pg_sys::pgstat_progress_update_param(pg_sys::PROGRESS_CREATEIDX_TUPLES_TOTAL as i32, total as i64);
        pg_sys::pgstat_progress_update_param(pg_sys::PROGRESS_CREATEIDX_TUPLES_DONE as i32, done as i64);
    }
}

use super::paged::MIN_SHARD_ROWS;

/// The most rows one GPU build fits in `budget` bytes (device_bytes grows
/// with the rows).
fn rows_within(budget: usize, stored_dim: usize, params: &BuildParams, knn: KnnInit) -> usize {
    let fits = |n: usize| device_bytes(n, stored_dim, params, knn.start(n)) <= budget;
    let (mut lo, mut hi) = (0usize, 1usize);
    while fits(hi) && hi < u32::MAX as usize {
        (lo, hi) = (hi, hi * 2);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The most rows a shard may hold within `budget` bytes of the device's
/// `usable` ones; an error when fewer than MIN_SHARD_ROWS fit.
fn shard_rows_on_gpu(
    budget: usize,
    usable: usize,
    stored_dim: usize,
    params: &BuildParams,
    knn: KnnInit,
) -> Result<usize, GpuError> {
    let max_rows = rows_within(budget, stored_dim, params, knn);
    if max_rows < MIN_SHARD_ROWS {
        let needed = device_bytes(MIN_SHARD_ROWS, stored_dim, params, knn.start(MIN_SHARD_ROWS));
        let what = format!("a shard of {MIN_SHARD_ROWS} rows within gpu_graph.build_gpu_memory ({} MiB)", budget >> 20);
        return Err(GpuError::OutOfMemory { needed, free: usable, what });
    }
    Ok(max_rows)
}

/// The device bytes a build may use: gpu_graph.build_gpu_memory's `mb`
/// within the `usable` ones, all of them when 0.
fn gpu_budget(mb: usize, usable: usize) -> usize {
    if mb > 0 {
        (mb << 20).min(usable)
    } else {
        usable
    }
}

/// Builds the graph on the GPU: whole when the build fits in `budget_mb`
/// (0: the device's usable free memory), else in shards that do (Tagore's
/// partition, each shard by the same GRNND kernels, merged on the host).
fn on_gpu(
    vectors: &[f32],
    stored_dim: usize,
    params: &BuildParams,
    knn: KnnInit,
    budget_mb: usize,
    watch: &Watch,
) -> Result<Constructed, GpuError> {
    let gpu = Gpu::open()?;
    let device = || Device::Gpu { name: gpu.info().name.clone() };
    let n = vectors.len() / stored_dim;
    let usable = gpu.usable_memory()?;
    let budget = gpu_budget(budget_mb, usable);
    if device_bytes(n, stored_dim, params, knn.start(n)) <= budget {
        let (graph, t) = gpu_graph_gpu::build(&gpu, vectors, stored_dim, params, knn, watch)?;
        return Ok(Constructed {
            graph,
            device: device(),
            upload_ms: t.upload_ms as f32,
            construct_ms: (t.knn_ms + t.refine_ms + t.final_cut_ms) as f32,
            download_ms: t.download_ms as f32,
            shards: None,
            cfs: None,
        });
    }
    let max_rows = shard_rows_on_gpu(budget, usable, stored_dim, params, knn)?;
    let (k, cap) = gpu_graph_engine::partition::plan(n, max_rows);
    let e = cost::estimate(n, stored_dim, k, &vec![(2 * n).div_ceil(k).min(cap); k], 1);
    let _ = watch.plan.set(format!(
        "gpu_graph: building {n} rows in {k} shards of at most {cap} rows (the whole build needs {} MiB of GPU memory, gpu_graph.build_gpu_memory allows {} MiB); expected {:.1} s: partition {:.1} s, shards {:.1} s, merge {:.1} s",
        device_bytes(n, stored_dim, params, knn.start(n)) >> 20,
        budget >> 20,
        e.total_s(),
        e.partition_s,
        e.shards_s,
        e.merge_s
    ));
    let t = Instant::now();
    let mut failed = None;
    let built = sharded::build_sharded(
        vectors,
        stored_dim,
        params,
        max_rows,
        &mut |rows: &[f32]| match gpu_graph_gpu::build(&gpu, rows, stored_dim, params, knn, watch) {
            Ok((g, _)) => Some(g),
            Err(e) => {
                failed = Some(e);
                None
            }
        },
        &mut |done: usize, total: usize| {
            watch.shards.store(total, Ordering::Relaxed);
            watch.shard.store(done, Ordering::Relaxed);
            !watch.stop()
        },
    );
    let (graph, stats) = built.ok_or_else(|| failed.unwrap_or(GpuError::Cancelled))?;
    Ok(Constructed {
        graph,
        device: device(),
        upload_ms: 0.0,
        construct_ms: t.elapsed().as_secs_f32() * 1000.0,
        download_ms: 0.0,
        shards: Some(stats),
        cfs: None,
    })
}

fn on_cpu(vectors: &[f32], stored_dim: usize, params: &BuildParams, order: ScanOrder) -> Constructed {
    let t = Instant::now();
    let graph = rnn_descent::build_in(vectors, stored_dim, params, order, &mut |done: usize, all: usize| {
        // the engine calls back on the calling (backend) thread
        report_rounds(done, all);
        latch::check_interrupts();
        true
    })
    .unwrap_or_else(|| error!("gpu_graph: index build cancelled"));
    Constructed {
        graph,
        device: Device::Cpu { threads: rayon::current_num_threads() },
        upload_ms: 0.0,
        construct_ms: t.elapsed().as_secs_f32() * 1000.0,
        download_ms: 0.0,
        shards: None,
        cfs: None,
    }
}

/// The scan order of a CPU build's RNN-Descent: the GPU's (GRNND's random
/// order) when a CFS graph is refined from it (`cfs::START_ORDER`), else
/// Algorithm 2's ascending order. (The GPU scans in GRNND's order always.)
pub fn cpu_order(cfs: Option<CfsParams>) -> ScanOrder {
    if cfs.is_some() {
        cfs::START_ORDER
    } else {
        ScanOrder::Ascending
    }
}

/// Builds the graph over `rows` stored vectors, on the CPU in `cpu_order`.
/// `meanwhile` (PostgreSQL work that does not need the graph) runs exactly
/// once on this thread: during a GPU build, whose thread makes no
/// PostgreSQL call; before a CPU build, which wants every core.
pub fn construct(
    vectors: &[f32],
    stored_dim: usize,
    rows: usize,
    params: &BuildParams,
    knn: KnnInit,
    cpu_order: ScanOrder,
    meanwhile: &mut dyn FnMut(),
) -> Constructed {
    let want = BUILD_DEVICE.get();
    if want != BuildDevice::Cpu && rows > 0 {
        let watch = Watch::default();
        let budget_mb = BUILD_GPU_MEMORY.get().max(0) as usize;
        // the search worker leaves the GPU to the build while it runs, and
        // NVRTC's signals are held back while the GPU threads may compile
        let aside = GpuBuild::begin();
        let result = std::thread::scope(|s| {
            let gpu = s.spawn(|| {
                // before CUDA starts its own threads, which inherit the mask
                crate::threads::block_signals();
                on_gpu(vectors, stored_dim, params, knn, budget_mb, &watch)
            });
            // an ERROR below unwinds through here: the guard stops the GPU
            // thread, and the scope waits for it (and its device memory to
            // be freed) before the ERROR goes on
            let _stop = StopOnDrop(&watch);
            meanwhile();
            // the backend keeps serving interrupts while the GPU works, so a
            // cancel or statement_timeout ends the build within a round
            let mut planned = false;
            while !gpu.is_finished() {
                latch::nap(Duration::from_millis(10));
                report_rounds(watch.done.load(Ordering::Relaxed), watch.total.load(Ordering::Relaxed));
                if let (false, Some(plan)) = (planned, watch.plan.get()) {
                    notice!("{plan}");
                    planned = true;
                }
            }
            if let (false, Some(plan)) = (planned, watch.plan.get()) {
                notice!("{plan}");
            }
            gpu.join().unwrap_or_else(|_| Err(GpuError::Cuda("the GPU build thread panicked".into())))
        });
        drop(aside);
        match result {
            Ok(c) => return c,
            // only the guard stops the GPU thread, and it is set on the way
            // out of the scope, never before the thread is done
            Err(GpuError::Cancelled) => unreachable!("the GPU build stopped with no one leaving"),
            Err(e) => fall_back(want, &e),
        }
        return on_cpu(vectors, stored_dim, params, cpu_order);
    }
    meanwhile();
    on_cpu(vectors, stored_dim, params, cpu_order)
}

/// A paged build's shards on the GPUs: a thread for each device opens it
/// and builds the shards it takes from one queue, while the backend reads
/// the next shard's rows from the pages and keeps serving interrupts; the
/// graphs come back in the order the shards were handed over.
/// A shard's graph and its rows back from a device, or why not.
type Built = Result<(Graph, Vec<f32>), GpuError>;

/// Work for a GPU's thread: a shard's rows, or a whole build streamed.
enum Job {
    Shard(usize, Vec<f32>),
    Whole(streamed::Job),
}

struct GpuShards<'a> {
    to: Option<mpsc::Sender<Job>>,
    from: mpsc::Receiver<(usize, Built)>,
    /// devices building
    devices: usize,
    sent: usize,
    next: usize,
    early: std::collections::BTreeMap<usize, Built>,
    watch: &'a Watch,
    failed: Option<GpuError>,
}

impl ShardBuilder for GpuShards<'_> {
    fn in_flight(&self) -> usize {
        self.devices
    }
    fn start(&mut self, rows: Vec<f32>) {
        if let Some(to) = &self.to {
            // a closed queue: every thread failed, which finish reports
            let _ = to.send(Job::Shard(self.sent, rows));
        }
        self.sent += 1;
    }
    fn finish(&mut self) -> Option<(Graph, Vec<f32>)> {
        loop {
            if let Some(r) = self.early.remove(&self.next) {
                self.next += 1;
                return r.map_err(|e| self.failed = Some(e)).ok();
            }
            match self.from.recv_timeout(Duration::from_millis(10)) {
                Ok((seq, r)) => {
                    self.early.insert(seq, r);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => self.watch.waiting(),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.failed.get_or_insert(GpuError::Cuda("the GPU build threads ended".into()));
                    return None;
                }
            }
        }
    }
}

/// What a paged build needs besides its rows and lists.
pub struct PagedBuild<'a> {
    pub rows: &'a mut dyn Rows,
    pub lists: &'a mut dyn Lists,
    pub params: &'a BuildParams,
    pub knn: KnnInit,
    /// the host's plan when it holds that many shards' rows at once
    pub plan: &'a dyn Fn(usize) -> Plan,
    /// gets the merged lists of consecutive nodes
    pub merged: &'a mut dyn FnMut(usize, &[u32]),
    /// the host's bytes (maintenance_work_mem)
    pub budget: usize,
    /// nodes whose lists are written together (a graph page's chunk)
    pub lists_chunk: usize,
    /// NSG, Vamana or CAGRA: each shard's graph refined by CFS while its
    /// rows are in memory (`sharded::Refined`)
    pub cfs: Option<CfsParams>,
}

/// The graph of a paged build (its vectors in the index's pages, read
/// back shard by shard): on the GPU where `gpu_graph.build_device` allows
/// and one opens, each shard within both maintenance_work_mem and
/// `gpu_graph.build_gpu_memory`; else on the CPU. The graph's lists go to
/// `merged`; the result's graph holds only the entry point.
pub fn construct_paged(b: PagedBuild) -> Constructed {
    let t = Instant::now();
    let want = BUILD_DEVICE.get();
    let n = b.rows.len();
    let sd = b.rows.dim();
    let (params, knn) = (b.params, b.knn);
    let mut built = None;
    if want != BuildDevice::Cpu {
        let watch = Watch::default();
        // the worker steps aside; NVRTC's signals held back (as in construct)
        let aside = GpuBuild::begin();
        let (rows_tx, rows_rx) = mpsc::channel::<Job>();
        let rows_rx = std::sync::Mutex::new(rows_rx);
        let (graph_tx, graph_rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(usize, String), GpuError>>();
        let wanted = BUILD_GPUS.get().max(1) as usize;
        let outcome = std::thread::scope(|s| {
            let (watch, rows_rx) = (&watch, &rows_rx);
            for ordinal in 0..wanted {
                let (graph_tx, ready_tx) = (graph_tx.clone(), ready_tx.clone());
                s.spawn(move || {
                    crate::threads::block_signals();
                    let gpu = match Gpu::open_ordinal(ordinal).and_then(|g| Ok((g.usable_memory()?, g))) {
                        Ok((usable, gpu)) => {
                            let _ = ready_tx.send(Ok((usable, gpu.info().name.clone())));
                            gpu
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    drop(ready_tx);
                    loop {
                        // one queue for every device: whichever is free takes the next shard
                        let job = rows_rx.lock().map(|rx| rx.recv());
                        let (seq, rows) = match job {
                            Ok(Ok(Job::Shard(seq, rows))) => (seq, rows),
                            Ok(Ok(Job::Whole(job))) => {
                                streamed::build(&gpu, job, sd, params, knn, watch);
                                return;
                            }
                            _ => return,
                        };
                        let r = gpu_graph_gpu::build(&gpu, &rows, sd, params, knn, watch).map(|(g, _)| (g, rows));
                        if graph_tx.send((seq, r)).is_err() || watch.stop() {
                            return;
                        }
                    }
                });
            }
            drop((graph_tx, ready_tx));
            let _stop = StopOnDrop(watch);
            // every device's answer: the smallest memory of those that opened
            let (mut opened, mut usable, mut name, mut first_error) = (0, usize::MAX, String::new(), None);
            for _ in 0..wanted {
                loop {
                    match ready_rx.recv_timeout(Duration::from_millis(10)) {
                        Ok(Ok((u, n))) => {
                            (opened, usable, name) = (opened + 1, usable.min(u), n);
                            break;
                        }
                        Ok(Err(e)) => {
                            first_error.get_or_insert(e);
                            break;
                        }
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            latch::check_interrupts();
                        }
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                }
            }
            if opened == 0 {
                return Err(first_error.unwrap_or_else(|| GpuError::Cuda("the GPU build threads ended".into())));
            }
            let budget = gpu_budget(BUILD_GPU_MEMORY.get().max(0) as usize, usable);
            // (a CFS graph is refined from all its vectors at once, which
            // the host cannot hold: shards then, each refined)
            if b.cfs.is_none() && device_bytes(n, sd, params, knn.start(n)) <= budget {
                notice!(
                    "gpu_graph: building {n} rows on the GPU, streamed from the index's pages (the vectors exceed maintenance_work_mem); expected {:.1} s of graph construction",
                    cost::streamed_seconds(n, sd)
                );
                let piece_rows = streamed::piece_rows(b.budget, sd, b.lists_chunk);
                let (pieces_tx, pieces) = mpsc::sync_channel(streamed::QUEUED);
                let (back, back_rx) = mpsc::sync_channel(streamed::QUEUED);
                let job = streamed::Job { n, pieces, back, piece_rows };
                // one GPU's thread takes it; the others end with the queue
                let _ = rows_tx.send(Job::Whole(job));
                drop(rows_tx);
                let (entry, _) =
                    streamed::feed(b.rows, pieces_tx, back_rx, piece_rows, b.merged, &mut || watch.waiting())?;
                return Ok(((entry, None), name));
            }
            if opened > 1 {
                name = format!("{opened} x {name}");
            }
            let mut plan = (b.plan)(opened + 1);
            plan.max_rows = plan.max_rows.min(shard_rows_on_gpu(budget, usable, sd, params, knn)?);
            let (k, cap) = gpu_graph_engine::partition::plan(n, plan.max_rows);
            let e = cost::estimate(n, sd, k, &vec![(2 * n).div_ceil(k).min(cap); k], 1);
            notice!(
                "gpu_graph: building {n} rows read back from the index's pages in {k} shards of at most {cap} rows (the vectors exceed maintenance_work_mem); expected {:.1} s of graph construction",
                e.total_s()
            );
            let mut gpu = GpuShards {
                to: Some(rows_tx),
                from: graph_rx,
                devices: opened,
                sent: 0,
                next: 0,
                early: Default::default(),
                watch,
                failed: None,
            };
            let mut go_on = || {
                latch::check_interrupts();
                !watch.stop()
            };
            let r = sharded::build_in_shards(
                b.rows,
                b.lists,
                plan,
                &mut *refining(&mut gpu, b.cfs, sd, &mut go_on),
                b.merged,
                &mut |done: usize, total: usize| {
                    watch.shards.store(total, Ordering::Relaxed);
                    watch.shard.store(done, Ordering::Relaxed);
                    latch::check_interrupts();
                    true
                },
            );
            // the threads' loops end with their queue
            gpu.to = None;
            r.ok_or_else(|| gpu.failed.take().unwrap_or(GpuError::Cancelled))
                .map(|(entry, st)| ((entry, Some(st)), name))
        });
        drop(aside);
        match outcome {
            Ok(((entry, stats), name)) => built = Some((entry, stats, Device::Gpu { name })),
            Err(GpuError::Cancelled) => unreachable!("the GPU build stopped with no one leaving"),
            Err(e) => fall_back(want, &e),
        }
    }
    let (entry, stats, device) = built.unwrap_or_else(|| {
        let (shard, total) = (std::cell::Cell::new(0), std::cell::Cell::new(1));
        let mut cpu = sharded::Inline::new(|rows: &[f32]| {
            Some(
                rnn_descent::build_in(rows, sd, params, cpu_order(b.cfs), &mut |done: usize, all: usize| {
                    report_rounds(shard.get() * all + done, total.get() * all);
                    latch::check_interrupts();
                    true
                })
                .unwrap_or_else(|| error!("gpu_graph: index build cancelled")),
            )
        });
        let plan = (b.plan)(1);
        let (k, cap) = gpu_graph_engine::partition::plan(n, plan.max_rows);
        notice!(
            "gpu_graph: building {n} rows read back from the index's pages in {k} shards of at most {cap} rows on the CPU (the vectors exceed maintenance_work_mem)"
        );
        let mut go_on = || {
            latch::check_interrupts();
            true
        };
        let (entry, stats) = sharded::build_in_shards(
            b.rows,
            b.lists,
            plan,
            &mut *refining(&mut cpu, b.cfs, sd, &mut go_on),
            b.merged,
            &mut |done: usize, all: usize| {
                shard.set(done);
                total.set(all);
                latch::check_interrupts();
                true
            },
        )
        .unwrap_or_else(|| error!("gpu_graph: index build cancelled"));
        (entry, Some(stats), Device::Cpu { threads: rayon::current_num_threads() })
    });
    Constructed {
        graph: Graph { degree: params.degree, adjacency: Vec::new(), entry: Some(entry) },
        device,
        upload_ms: 0.0,
        construct_ms: t.elapsed().as_secs_f32() * 1000.0,
        download_ms: 0.0,
        shards: stats,
        cfs: None,
    }
}

/// `builder`, each shard's graph then refined by `cfs`'s filter when the
/// index has one (`sharded::Refined`); `go_on` is asked between steps.
fn refining<'a>(
    builder: &'a mut dyn ShardBuilder,
    cfs: Option<CfsParams>,
    dim: usize,
    go_on: &'a mut dyn FnMut() -> bool,
) -> Box<dyn ShardBuilder + 'a> {
    match cfs {
        Some(params) => Box::new(sharded::Refined { inner: builder, dim, params, go_on }),
        None => Box::new(builder),
    }
}

/// A GPU build that could not run: an ERROR when the GPU was asked for,
/// else a WARNING and the CPU.
fn fall_back(want: BuildDevice, e: &GpuError) {
    if want == BuildDevice::Gpu {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("gpu_graph: cannot build on the GPU: {e}"),
            "SET gpu_graph.build_device = auto (or cpu) to build on the CPU."
        );
    }
    ereport!(
        WARNING,
        PgSqlErrorCode::ERRCODE_WARNING,
        format!("gpu_graph: building on the CPU: {e}"),
        "SET gpu_graph.build_device = cpu to build on the CPU without trying a GPU."
    );
}
