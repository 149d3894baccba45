//! The engine's one prune rule over given candidate lists, on the GPU
//! (kernels/rnn_descent.cu's grnnd_prune, which shares its `occludes` with
//! GRNND's update): what a merge of lists needs, and what the build check
//! compares with gpu_graph_engine::prune::rng_prune list for list.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use crate::abi;
use crate::device::{function, Gpu};
use crate::error::{cuda, guard, GpuError};
use crate::grnnd::lanes_for;
use crate::memory::zeroed;
use crate::vectors::DeviceVectors;

/// Candidate lists of several nodes: row i holds `per_row` candidate ids of
/// node `nodes[i]` (NO_NODE-padded) with their distances to it, ascending by
/// (distance, id), as rng_prune takes them.
pub struct CandidateLists<'a> {
    pub per_row: usize,
    pub ids: &'a [u32],
    pub dists: &'a [f32],
}

/// For each row, the kept ids (at most `degree`, NO_NODE after): rows ×
/// degree. `vectors` are the stored vectors (n × `dim`) the ids name.
pub fn prune_lists(
    gpu: &Gpu,
    vectors: &[f32],
    dim: usize,
    lists: &CandidateLists,
    degree: usize,
) -> Result<Vec<u32>, GpuError> {
    let c = lists.per_row;
    let rows = lists.ids.len().checked_div(c).unwrap_or(0);
    if rows == 0 || degree == 0 {
        return Ok(vec![abi::NO_NODE; rows * degree]);
    }
    if lists.dists.len() != lists.ids.len() {
        return Err(GpuError::Unsupported("one distance per candidate".into()));
    }
    guard("GPU prune", || {
        let st = &gpu.stream;
        let f = function(&gpu.grnnd, "grnnd_prune")?;
        let dv = DeviceVectors::upload(gpu, vectors, dim)?;
        let ids = st.clone_htod(lists.ids).map_err(|e| cuda("uploading candidates", e))?;
        let dists = st.clone_htod(lists.dists).map_err(|e| cuda("uploading candidates", e))?;
        let mut out = zeroed::<u32>(st, rows * degree, "the kept lists")?;
        let w = abi::GRNND_WARPS as usize;
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(w) as u32, 1, 1),
            block_dim: (abi::GRNND_WARPS * 32, 1, 1),
            shared_mem_bytes: (w * 2 * degree * 4) as u32,
        };
        let (half, dp, g) = (0u32, dv.dp as u32, lanes_for(dv.dp, 0));
        let (rows32, c32, deg32) = (rows as u32, c as u32, degree as u32);
        let mut b = st.launch_builder(&f);
        b.arg(&dv.x).arg(&half).arg(&dp).arg(&g).arg(&rows32).arg(&ids).arg(&dists).arg(&c32).arg(&deg32);
        b.arg(&mut out);
        // SAFETY: the arguments match grnnd_prune; one warp per row, with
        // 2 * degree words of shared memory each.
        unsafe { b.launch(cfg) }.map_err(|e| cuda("grnnd_prune", e))?;
        let kept = st.clone_dtoh(&out).map_err(|e| cuda("downloading the kept lists", e))?;
        st.synchronize().map_err(|e| cuda("grnnd_prune", e))?;
        Ok(kept)
    })
}
