//! The CFS collect's searches on the GPU: [`GpuCollect`] is a
//! [`CollectRows`] for gpu_graph_engine::cfs::refine_with that searches the
//! start graph for every node's own vector with the search server's batch
//! kernel (kernels/search_persistent.cu's search_batch: one single-warp CTA
//! a query, the CPU's beam search with a beam of `pool`), one launch per
//! batch of nodes. Its hits may differ a little from the CPU search's (the
//! kernel expands a few candidates per step, and ties fall otherwise);
//! gpu-graph-gpucheck compares the recall of the graphs either gives.

use std::ops::Range;
use std::time::{Duration, Instant};

use gpu_graph_engine::collect_rows::CollectRows;
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::graph::Graph;
use gpu_graph_engine::metric::Metric;

use crate::device::Gpu;
use crate::error::GpuError;
use crate::search::{ResidentId, SearchError, SearchServer, ServerConfig};

/// log2 of the entries of a batch block's visited table: a search of beam
/// 64 at degree 32 claims a few thousand nodes, so 2^13 keeps the table at
/// most about half full (the server's default for one CTA of 64 is 2^12).
const VISITED_LOG2: u32 = 13;

/// Longest a batch may take before the collect gives up (a hung kernel
/// must not hang the build: the refinement falls back to the CPU).
const BATCH_WAIT: Duration = Duration::from_secs(60);

/// A search server of one slot (its persistent kernel idles; the batch
/// kernel has the GPU) with the start graph resident.
pub struct GpuCollect {
    server: SearchServer,
    id: ResidentId,
    vectors: Vec<f32>,
    dim: usize,
}

fn gpu_error(e: SearchError) -> GpuError {
    match e {
        SearchError::Gpu(e) => e,
        e => GpuError::Cuda(format!("the GPU's collect searches: {e}")),
    }
}

impl GpuCollect {
    /// Starts the server on `gpu` and loads `start` over `vectors` (n ×
    /// `dim` stored vectors, L2), for searches of beam `pool`.
    ///
    /// Launch every other kernel of the refinement once before this (as
    /// GpuFilters::new does): while the server's persistent kernel runs, a
    /// first launch may wait forever under CUDA's lazy module loading.
    pub fn start(gpu: &Gpu, vectors: &[f32], dim: usize, start: &Graph, pool: usize) -> Result<GpuCollect, GpuError> {
        let cfg = ServerConfig {
            slots: 1,
            ctas_per_slot: 1,
            groups: 1,
            max_dim: dim,
            max_list: pool,
            max_k: pool,
            visited_log2: VISITED_LOG2,
            max_indexes: 1,
            ..ServerConfig::default()
        };
        let server = SearchServer::start(gpu, cfg)?;
        let index = FlatIndex::new(Metric::L2, dim, vectors.to_vec(), start.clone());
        let id = server.load(&index).map_err(gpu_error)?;
        // the host keeps one copy: the queries are the stored vectors
        let FlatIndex { vectors, .. } = index;
        Ok(GpuCollect { server, id, vectors, dim })
    }
}

impl CollectRows for GpuCollect {
    type Error = GpuError;

    fn collect_rows(&mut self, nodes: Range<usize>, pool: usize) -> Result<Vec<Vec<(u32, f32)>>, GpuError> {
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        let queries = &self.vectors[nodes.start * self.dim..nodes.end * self.dim];
        let ticket = self.server.submit_batch(self.id, queries, pool, pool, 0).map_err(gpu_error)?;
        let t = Instant::now();
        loop {
            if let Some(answers) = self.server.poll_batch(&ticket).map_err(gpu_error)? {
                // (the L2 search distance is the graph distance)
                return Ok(answers.into_iter().map(|a| a.into_iter().map(|(d, id)| (id, d)).collect()).collect());
            }
            if t.elapsed() > BATCH_WAIT {
                return Err(GpuError::Cuda(format!("no answer to {} collect searches in {BATCH_WAIT:?}", nodes.len())));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}
