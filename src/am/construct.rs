//! Graph construction for CREATE INDEX: on the GPU when `gpu_graph.build_device`
//! allows and one is usable, else on the CPU. Both run GRNND / RNN-Descent
//! with the same parameters and the same final cut, so either graph serves the
//! same scans.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpu_graph_engine::graph::Graph;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::rnn_descent;
use gpu_graph_gpu::{Control, Gpu, GpuError, KnnInit};
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::gucs::{BuildDevice, BUILD_DEVICE};
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
struct StopOnDrop<'a>(&'a Watch);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::Relaxed);
    }
}

/// Between the GPU thread and the backend: the stop flag, and the rounds
/// done, which the backend reports as the CPU build does.
#[derive(Default)]
struct Watch {
    stop: AtomicBool,
    done: AtomicUsize,
    total: AtomicUsize,
}

impl Control for Watch {
    fn stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
    fn round(&self, done: usize, total: usize) {
        self.total.store(total, Ordering::Relaxed);
        self.done.store(done, Ordering::Relaxed);
    }
}

/// A build's rounds in pg_stat_progress_create_index (tuples done / total,
/// as PostgreSQL's view names its counters).
fn report_rounds(done: usize, total: usize) {
    // SAFETY: updates this backend's own progress entry, on its own thread.
    unsafe {
        pg_sys::pgstat_progress_update_param(pg_sys::PROGRESS_CREATEIDX_TUPLES_TOTAL as i32, total as i64);
        pg_sys::pgstat_progress_update_param(pg_sys::PROGRESS_CREATEIDX_TUPLES_DONE as i32, done as i64);
    }
}

fn on_gpu(
    vectors: &[f32],
    stored_dim: usize,
    params: &BuildParams,
    knn: KnnInit,
    watch: &Watch,
) -> Result<Constructed, GpuError> {
    let gpu = Gpu::open()?;
    let (graph, t) = gpu_graph_gpu::build(&gpu, vectors, stored_dim, params, knn, watch)?;
    Ok(Constructed {
        graph,
        device: Device::Gpu { name: gpu.info().name.clone() },
        upload_ms: t.upload_ms as f32,
        construct_ms: (t.knn_ms + t.refine_ms + t.final_cut_ms) as f32,
        download_ms: t.download_ms as f32,
    })
}

fn on_cpu(vectors: &[f32], stored_dim: usize, params: &BuildParams) -> Constructed {
    let t = Instant::now();
    let graph = rnn_descent::build(vectors, stored_dim, params, &mut |done: usize, all: usize| {
        // the engine calls back on the calling (backend) thread
        report_rounds(done, all);
        pg_sys::check_for_interrupts!();
        true
    })
    .unwrap_or_else(|| error!("gpu_graph: index build cancelled"));
    Constructed {
        graph,
        device: Device::Cpu { threads: rayon::current_num_threads() },
        upload_ms: 0.0,
        construct_ms: t.elapsed().as_secs_f32() * 1000.0,
        download_ms: 0.0,
    }
}

/// Builds the graph over `rows` stored vectors. `meanwhile` (PostgreSQL work
/// that does not need the graph) runs exactly once on this thread: during a
/// GPU build, whose thread makes no PostgreSQL call; before a CPU build,
/// which wants every core.
pub fn construct(
    vectors: &[f32],
    stored_dim: usize,
    rows: usize,
    params: &BuildParams,
    knn: KnnInit,
    meanwhile: &mut dyn FnMut(),
) -> Constructed {
    let want = BUILD_DEVICE.get();
    if want != BuildDevice::Cpu && rows > 0 {
        let watch = Watch::default();
        // the search worker leaves the GPU to the build while it runs
        let aside = GpuBuild::begin();
        let result = std::thread::scope(|s| {
            let gpu = s.spawn(|| on_gpu(vectors, stored_dim, params, knn, &watch));
            // an ERROR below unwinds through here: the guard stops the GPU
            // thread, and the scope waits for it (and its device memory to
            // be freed) before the ERROR goes on
            let _stop = StopOnDrop(&watch);
            meanwhile();
            // the backend keeps serving interrupts while the GPU works, so a
            // cancel or statement_timeout ends the build within a round
            while !gpu.is_finished() {
                latch::nap(Duration::from_millis(10));
                report_rounds(watch.done.load(Ordering::Relaxed), watch.total.load(Ordering::Relaxed));
            }
            gpu.join().unwrap_or_else(|_| Err(GpuError::Cuda("the GPU build thread panicked".into())))
        });
        drop(aside);
        match result {
            Ok(c) => return c,
            // only the guard stops the GPU thread, and it is set on the way
            // out of the scope, never before the thread is done
            Err(GpuError::Cancelled) => unreachable!("the GPU build stopped with no one leaving"),
            Err(e) if want == BuildDevice::Gpu => {
                ereport!(
                    ERROR,
                    PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                    format!("gpu_graph: cannot build on the GPU: {e}"),
                    "SET gpu_graph.build_device = auto (or cpu) to build on the CPU."
                );
            }
            Err(e) => {
                ereport!(
                    WARNING,
                    PgSqlErrorCode::ERRCODE_WARNING,
                    format!("gpu_graph: building on the CPU: {e}"),
                    "SET gpu_graph.build_device = cpu to build on the CPU without trying a GPU."
                );
            }
        }
        return on_cpu(vectors, stored_dim, params);
    }
    meanwhile();
    on_cpu(vectors, stored_dim, params)
}
