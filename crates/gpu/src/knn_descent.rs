//! GNN-Descent's approximate k-NN graph (Tagore, section 4;
//! kernels/knn_descent.cu): random lists, `it1` rounds of NN-Descent's
//! local join as tensor-core tiles, `it2` rounds of each node expanding its
//! nearest unexpanded neighbours, then the exact k-NN's fp32 re-rank. Every
//! step on the device; the start of a GRNND build where the exact k-NN is
//! too dear (it grows with n^2).

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::abi;
use crate::device::{function, Gpu};
use crate::error::{cuda, guard, GpuError};
use crate::grnnd::Control;
use crate::knn::{self, KnnGraph};
use crate::memory::zeroed;
use crate::vectors::DeviceVectors;

const K: usize = abi::GNND_K as usize;
const CAND: usize = abi::GNND_CAND as usize;
const SAMPLE: usize = abi::GNND_SAMPLE as usize;

/// Rounds of the two phases. The paper runs as many of each (it1 = it2);
/// here phase 1, from random lists with 8 samples of each kind, needs
/// about 10 rounds before phase 2 pays. Recall of the k 16 graph against
/// the exact one (H200, docs/benchmarks.md), it1:it2: 1M SIFT 4:4 0.29,
/// 6:6 0.79, 8:4 0.93, 10:2 0.957, 10:4 0.967 (276 ms), 12:4 0.978
/// (280 ms); 1M x 768 8:4 0.875, 10:4 0.948 (0.90 s; the exact graph
/// 15.0 s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DescentParams {
    pub it1: usize,
    pub it2: usize,
    pub seed: u64,
}

impl Default for DescentParams {
    fn default() -> Self {
        DescentParams { it1: 10, it2: 4, seed: 0x9E37_79B9_7F4A_7C15 }
    }
}

/// The largest k a descent's graph gives (its lists' length).
pub const MAX_K: usize = K;

/// Device memory a descent over `n` rows staged at `dk` halves needs
/// besides the vectors, for a graph of `k` neighbours.
pub(crate) fn device_bytes(n: usize, dk: usize, k: usize) -> usize {
    n * dk * 2 + n * 4 + n * K * 8 + n * CAND * 8 + n * 4 + n * 4 * SAMPLE * 4 + n * 2 * 4 + n * K * 4 + n * k * 8
}

/// The descent's graph of the uploaded vectors, left on the device: (ids,
/// distances), n x k, ascending by fp32 distance. `entered` gets the list
/// entries each round changed (convergence). `control` may stop it between
/// rounds.
pub(crate) fn descent_device(
    gpu: &Gpu,
    dv: &DeviceVectors,
    maxabs: f32,
    k: usize,
    p: &DescentParams,
    control: &dyn Control,
    entered: &mut Vec<u64>,
) -> Result<(CudaSlice<u32>, CudaSlice<f32>), GpuError> {
    let n = dv.n;
    if k == 0 || k > K || n < 2 {
        return Err(GpuError::Unsupported(format!("GNN-Descent with k = {k} (1..={K}) of {n} rows")));
    }
    if n > abi::GNND_ID_MASK as usize {
        return Err(GpuError::Unsupported(format!("GNN-Descent of {n} rows (ids have 30 bits)")));
    }
    let km = gpu.knn_module(0)?;
    let m = gpu.descent_module()?;
    let init = function(&m, "gnnd_init")?;
    let sample = function(&m, "gnnd_sample")?;
    let join = function(&m, "gnnd_join")?;
    let merge = function(&m, "gnnd_merge")?;
    let expand = function(&m, "gnnd_expand")?;
    let ids = function(&m, "gnnd_ids")?;
    join.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        abi::GNND_JOIN_SMEM_BYTES as i32,
    )
    .map_err(|e| cuda("GNN-Descent shared memory", e))?;
    let st = knn::stage(gpu, &km, dv, maxabs)?;
    let s = &gpu.stream;
    let mut lists = zeroed::<u64>(s, n * K, "the k-NN lists")?;
    let mut cand = zeroed::<u64>(s, n * CAND, "the k-NN offers")?;
    let mut cand_cnt = zeroed::<u32>(s, n, "the k-NN offers")?;
    let mut fwd = zeroed::<u32>(s, n * 2 * SAMPLE, "the samples")?;
    let mut rev = zeroed::<u32>(s, n * 2 * SAMPLE, "the samples")?;
    let mut rev_cnt = zeroed::<u32>(s, n * 2, "the samples")?;
    let mut stat = zeroed::<u64>(s, 1, "a counter")?;
    let (n32, dk32) = (n as u32, st.dk as u32);
    let w = abi::GNND_WARPS as usize;
    let warps = |smem: u32| LaunchConfig {
        grid_dim: (n.div_ceil(w) as u32, 1, 1),
        block_dim: (abi::GNND_WARPS * 32, 1, 1),
        shared_mem_bytes: smem,
    };
    let mut b = s.launch_builder(&init);
    b.arg(&st.xh).arg(&st.norms).arg(&n32).arg(&dk32).arg(&st.inv_scale2).arg(&p.seed).arg(&mut lists);
    // SAFETY: the arguments match gnnd_init; one warp per node.
    unsafe { b.launch(warps(0)) }.map_err(|e| cuda("gnnd_init", e))?;
    let fail = |what: &'static str| move |e| cuda(what, e);
    for round in 0..p.it1 + p.it2 {
        s.memset_zeros(&mut stat).map_err(fail("a counter"))?;
        if round < p.it1 {
            s.memset_zeros(&mut rev_cnt).map_err(fail("the samples"))?;
            let mut b = s.launch_builder(&sample);
            b.arg(&mut lists).arg(&n32).arg(&mut fwd).arg(&mut rev).arg(&mut rev_cnt);
            // SAFETY: the arguments match gnnd_sample; one warp per node.
            unsafe { b.launch(warps(0)) }.map_err(fail("gnnd_sample"))?;
            let mut b = s.launch_builder(&join);
            b.arg(&st.xh).arg(&st.norms).arg(&n32).arg(&dk32).arg(&st.inv_scale2).arg(&lists).arg(&fwd);
            b.arg(&rev).arg(&rev_cnt).arg(&mut cand).arg(&mut cand_cnt);
            // SAFETY: the arguments match gnnd_join; one warp per node, its
            // staging rows in the block's dynamic shared memory.
            unsafe { b.launch(warps(abi::GNND_JOIN_SMEM_BYTES)) }.map_err(fail("gnnd_join"))?;
            let mut b = s.launch_builder(&merge);
            b.arg(&mut lists).arg(&n32).arg(&cand).arg(&mut cand_cnt).arg(&mut stat);
            // SAFETY: the arguments match gnnd_merge; one warp per node.
            unsafe { b.launch(warps(0)) }.map_err(fail("gnnd_merge"))?;
        } else {
            let mut b = s.launch_builder(&expand);
            b.arg(&st.xh).arg(&st.norms).arg(&n32).arg(&dk32).arg(&st.inv_scale2).arg(&mut lists).arg(&mut stat);
            // SAFETY: the arguments match gnnd_expand; one warp per node.
            unsafe { b.launch(warps(0)) }.map_err(fail("gnnd_expand"))?;
        }
        entered.push(s.clone_dtoh(&stat).map_err(fail("a GNN-Descent round"))?[0]);
        if control.stop() {
            return Err(GpuError::Cancelled);
        }
    }
    drop((cand, cand_cnt, fwd, rev, rev_cnt, st));
    let mut out = zeroed::<u32>(s, n * K, "the k-NN ids")?;
    let c =
        LaunchConfig { grid_dim: ((n * K).div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut b = s.launch_builder(&ids);
    b.arg(&lists).arg(&n32).arg(&mut out);
    // SAFETY: the arguments match gnnd_ids; a thread per slot.
    unsafe { b.launch(c) }.map_err(fail("gnnd_ids"))?;
    drop(lists);
    knn::rerank(gpu, &km, dv, &out, K, k)
}

/// GNN-Descent's k-NN graph of `vectors` (n x `dim`, squared L2), k <= 32,
/// and the entries each round changed.
pub fn descent_graph(
    gpu: &Gpu,
    vectors: &[f32],
    dim: usize,
    k: usize,
    p: &DescentParams,
) -> Result<(KnnGraph, Vec<u64>), GpuError> {
    guard("GNN-Descent", || {
        let n = vectors.len().checked_div(dim).unwrap_or(0);
        let dv0 = DeviceVectors::plan(n, dim)?;
        gpu.reserve(dv0.bytes() + device_bytes(n, knn::dk_for(dim), k), "GNN-Descent's k-NN graph")?;
        let dv = DeviceVectors::upload(gpu, vectors, dim)?;
        let mut entered = Vec::new();
        let (di, dd) = descent_device(gpu, &dv, crate::vectors::max_abs(vectors), k, p, &|| false, &mut entered)?;
        let ids = gpu.stream.clone_dtoh(&di).map_err(|e| cuda("downloading the k-NN graph", e))?;
        let dists = gpu.stream.clone_dtoh(&dd).map_err(|e| cuda("downloading the k-NN graph", e))?;
        Ok((KnnGraph { k, ids, dists }, entered))
    })
}
