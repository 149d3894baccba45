//! The CFS refinement of a built graph (NSG, Vamana, CAGRA, TSDG:
//! gpu_graph_engine::cfs). Its collect's searches and its filters run on
//! the GPU when RNN-Descent's build did (gpu_graph_gpu::collect::GpuCollect
//! and gpu_graph_gpu::filter::GpuFilters, on a thread of its own as the
//! build's GPU work is), else, or when the GPU fails, on all cores. The
//! rest of the collect, the reverse edges, TSDG's order and the links that
//! make every node reachable run on the CPU either way.

use std::time::{Duration, Instant};

use gpu_graph_engine::cfs::{self, CfsParams};
use gpu_graph_engine::collect_rows::CpuCollect;
use gpu_graph_engine::filter_rows::{CpuFilters, Timed};
use gpu_graph_engine::graph::Graph;
use gpu_graph_gpu::collect::GpuCollect;
use gpu_graph_gpu::filter::GpuFilters;
use gpu_graph_gpu::{Control, Gpu, GpuError};
use pgrx::prelude::*;

use super::construct::{report_rounds, Constructed, Device, StopOnDrop, Watch};
use crate::latch;
use crate::worker::GpuBuild;

/// What the refinement took, for the build's report.
pub struct CfsStats {
    pub total_ms: f64,
    /// of it, the collect's searches
    pub collect_ms: f64,
    /// of it, filtering candidates
    pub filter_ms: f64,
    /// where the searches and the filters ran
    pub on_gpu: bool,
}

/// Turns RNN-Descent's graph into the CFS graph `cfs` asks for; its time
/// counts as graph construction.
pub fn refine(built: &mut Constructed, vectors: &[f32], stored_dim: usize, cfs: &CfsParams) {
    let t = Instant::now();
    let mut on_gpu = None;
    if matches!(built.device, Device::Gpu { .. }) {
        match on_the_gpu(&built.graph, vectors, stored_dim, cfs) {
            Ok(done) => on_gpu = Some(done),
            Err(e) => notice!("gpu_graph: CFS refinement on the CPU: {e}"),
        }
    }
    let is_on_gpu = on_gpu.is_some();
    let (graph, collect_ms, filter_ms) = on_gpu.unwrap_or_else(|| {
        let start = &built.graph;
        let mut collect = Timed { inner: CpuCollect { vectors, dim: stored_dim, start }, ms: 0.0 };
        let mut filters = Timed { inner: CpuFilters { vectors, dim: stored_dim }, ms: 0.0 };
        let Ok(graph) =
            cfs::refine_with(vectors, stored_dim, start, cfs, &mut collect, &mut filters, &mut |done, all| {
                // the engine calls back on the calling (backend) thread
                report_rounds(done, all);
                latch::check_interrupts();
                true
            });
        (graph.unwrap_or_else(|| error!("gpu_graph: index build cancelled")), collect.ms, filters.ms)
    });
    built.graph = graph;
    let total_ms = t.elapsed().as_secs_f64() * 1e3;
    built.construct_ms += total_ms as f32;
    built.cfs = Some(CfsStats { total_ms, collect_ms, filter_ms, on_gpu: is_on_gpu });
}

/// The refinement with the GPU's searches and filters on a thread of its
/// own (CUDA's threads must not take the backend's signals), the backend
/// serving interrupts meanwhile; the graph, the searches' and the filters'
/// ms.
fn on_the_gpu(
    start: &Graph,
    vectors: &[f32],
    stored_dim: usize,
    cfs: &CfsParams,
) -> Result<(Graph, f64, f64), GpuError> {
    let watch = Watch::default();
    // the search worker leaves the GPU to the build while it runs, and
    // NVRTC's signals are held back while the GPU threads may compile
    let aside = GpuBuild::begin();
    let result = std::thread::scope(|s| {
        let gpu = s.spawn(|| {
            crate::threads::block_signals();
            let gpu = Gpu::open()?;
            // the filters first: their kernel's first launch must come
            // before the search server's persistent kernel runs
            let mut filters = Timed { inner: GpuFilters::new(&gpu, vectors, stored_dim)?, ms: 0.0 };
            let searches = GpuCollect::start(&gpu, vectors, stored_dim, start, cfs.beam())?;
            let mut collect = Timed { inner: searches, ms: 0.0 };
            let graph =
                cfs::refine_with(vectors, stored_dim, start, cfs, &mut collect, &mut filters, &mut |done, all| {
                    watch.round(done, all);
                    !watch.stop()
                })?;
            Ok((graph, collect.ms, filters.ms))
        });
        // an ERROR below unwinds through here: the guard stops the thread
        // at its next step, and the scope waits for it
        let _stop = StopOnDrop(&watch);
        while !gpu.is_finished() {
            latch::nap(Duration::from_millis(10));
            watch.waiting();
        }
        gpu.join().unwrap_or_else(|_| Err(GpuError::Cuda("the CFS refinement thread panicked".into())))
    });
    drop(aside);
    match result? {
        (Some(graph), collect_ms, filter_ms) => Ok((graph, collect_ms, filter_ms)),
        // only the guard stops the thread, on the way out of the scope
        (None, ..) => unreachable!("the CFS refinement stopped with no one leaving"),
    }
}
