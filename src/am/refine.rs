//! The CFS refinement of a built graph (NSG, Vamana, CAGRA, TSDG:
//! gpu_graph_engine::cfs). Its filters run on the GPU when RNN-Descent's
//! build did (gpu_graph_gpu::filter::GpuFilters, on a thread of its own as
//! the build's GPU work is), else, or when the GPU fails, on all cores. The
//! collect's searches, the reverse edges, TSDG's order and the links that
//! make every node reachable run on the CPU either way.

use std::time::{Duration, Instant};

use gpu_graph_engine::cfs::{self, CfsParams};
use gpu_graph_engine::filter_rows::{CpuFilters, Timed};
use gpu_graph_engine::graph::Graph;
use gpu_graph_gpu::filter::GpuFilters;
use gpu_graph_gpu::{Control, Gpu, GpuError};
use pgrx::pg_sys;
use pgrx::prelude::*;

use super::construct::{report_rounds, Constructed, Device, StopOnDrop, Watch};
use crate::latch;
use crate::worker::GpuBuild;

/// What the refinement took, for the build's report.
pub struct CfsStats {
    pub total_ms: f64,
    /// of it, filtering candidates
    pub filter_ms: f64,
    /// where the filters ran
    pub filters_on_gpu: bool,
}

/// Turns RNN-Descent's graph into the CFS graph `cfs` asks for; its time
/// counts as graph construction.
pub fn refine(built: &mut Constructed, vectors: &[f32], stored_dim: usize, cfs: &CfsParams) {
    let t = Instant::now();
    let mut on_gpu = None;
    if matches!(built.device, Device::Gpu { .. }) {
        match with_gpu_filters(&built.graph, vectors, stored_dim, cfs) {
            Ok(done) => on_gpu = Some(done),
            Err(e) => notice!("gpu_graph: CFS filters on the CPU: {e}"),
        }
    }
    let filters_on_gpu = on_gpu.is_some();
    let (graph, filter_ms) = on_gpu.unwrap_or_else(|| {
        let mut filters = Timed { inner: CpuFilters { vectors, dim: stored_dim }, ms: 0.0 };
        let Ok(graph) = cfs::refine_with(vectors, stored_dim, &built.graph, cfs, &mut filters, &mut |done, all| {
            // the engine calls back on the calling (backend) thread
            report_rounds(done, all);
            pg_sys::check_for_interrupts!();
            true
        });
        (graph.unwrap_or_else(|| error!("gpu_graph: index build cancelled")), filters.ms)
    });
    built.graph = graph;
    let total_ms = t.elapsed().as_secs_f64() * 1e3;
    built.construct_ms += total_ms as f32;
    built.cfs = Some(CfsStats { total_ms, filter_ms, filters_on_gpu });
}

/// The refinement with the GPU's filters on a thread of its own (CUDA's
/// threads must not take the backend's signals), the backend serving
/// interrupts meanwhile; the graph and the filters' ms.
fn with_gpu_filters(
    start: &Graph,
    vectors: &[f32],
    stored_dim: usize,
    cfs: &CfsParams,
) -> Result<(Graph, f64), GpuError> {
    let watch = Watch::default();
    // the search worker leaves the GPU to the build while it runs
    let aside = GpuBuild::begin();
    let result = std::thread::scope(|s| {
        let gpu = s.spawn(|| {
            crate::threads::block_signals();
            let gpu = Gpu::open()?;
            let mut filters = Timed { inner: GpuFilters::new(&gpu, vectors, stored_dim)?, ms: 0.0 };
            let graph = cfs::refine_with(vectors, stored_dim, start, cfs, &mut filters, &mut |done, all| {
                watch.round(done, all);
                !watch.stop()
            })?;
            Ok((graph, filters.ms))
        });
        // an ERROR below unwinds through here: the guard stops the thread
        // at its next step, and the scope waits for it
        let _stop = StopOnDrop(&watch);
        while !gpu.is_finished() {
            latch::nap(Duration::from_millis(10));
            watch.waiting();
        }
        gpu.join().unwrap_or_else(|_| Err(GpuError::Cuda("the CFS filter thread panicked".into())))
    });
    drop(aside);
    match result? {
        (Some(graph), ms) => Ok((graph, ms)),
        // only the guard stops the thread, on the way out of the scope
        (None, _) => unreachable!("the CFS refinement stopped with no one leaving"),
    }
}
