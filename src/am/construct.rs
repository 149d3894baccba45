//! Graph construction for CREATE INDEX: on the GPU when `gpu_graph.build_device`
//! allows and one is usable, else on the CPU. Both run GRNND / RNN-Descent
//! with the same parameters and the same final cut, so either graph serves the
//! same scans.

use std::time::Instant;

use gpu_graph_engine::graph::Graph;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::rnn_descent;
use gpu_graph_gpu::{Gpu, GpuError, KnnInit};
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::gucs::{BuildDevice, BUILD_DEVICE};

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

fn interrupt_pending() -> bool {
    // a plain read of a flag the signal handler sets; CHECK_FOR_INTERRUPTS
    // itself may longjmp, which must not happen inside CUDA calls
    // SAFETY: a volatile read of a sig_atomic_t, which is what the signal
    // handler writes; any thread may read it.
    unsafe { std::ptr::read_volatile(&raw const pg_sys::InterruptPending) != 0 }
}

fn on_gpu(vectors: &[f32], stored_dim: usize, params: &BuildParams, knn: KnnInit) -> Result<Constructed, GpuError> {
    let gpu = Gpu::open()?;
    let (graph, t) = gpu_graph_gpu::build(&gpu, vectors, stored_dim, params, knn, &interrupt_pending)?;
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
        // SAFETY: the engine calls back on the calling (backend) thread,
        // which updates its own progress entry.
        unsafe {
            pg_sys::pgstat_progress_update_param(pg_sys::PROGRESS_CREATEIDX_TUPLES_TOTAL as i32, all as i64);
            pg_sys::pgstat_progress_update_param(pg_sys::PROGRESS_CREATEIDX_TUPLES_DONE as i32, done as i64);
        }
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
        let result = std::thread::scope(|s| {
            let gpu = s.spawn(|| on_gpu(vectors, stored_dim, params, knn));
            // an ERROR in here unwinds through the scope, which first waits
            // for the GPU thread (it stops at the next round on a cancel)
            meanwhile();
            gpu.join().unwrap_or_else(|_| Err(GpuError::Cuda("the GPU build thread panicked".into())))
        });
        match result {
            Ok(c) => return c,
            Err(GpuError::Cancelled) => {
                pg_sys::check_for_interrupts!();
                error!("gpu_graph: index build cancelled");
            }
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
