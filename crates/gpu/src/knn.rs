//! The exact k-NN graph on tensor cores (kernels/knn_exact.cu): fp16 GEMM
//! with fp32 accumulation, norms in the epilogue, per-row top-2k on chip, then
//! an fp32 re-rank that keeps the k best.

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaModule, CudaSlice, LaunchConfig, PushKernelArg};

use crate::abi;
use crate::device::{function, Gpu};
use crate::error::{cuda, guard, GpuError};
use crate::memory::zeroed;
use crate::vectors::DeviceVectors;

/// Largest k: the on-chip lists hold 64 candidates, re-ranked to k <= 32.
pub const MAX_K: usize = abi::KNN_MAX_K as usize;

const BM: usize = abi::KNN_BM as usize;
const BN: usize = abi::KNN_BN as usize;
const KC: usize = abi::KNN_KC as usize;

/// An exact k-NN graph: row v's k nearest other rows, ascending by
/// (distance, id); NO_NODE / +inf where fewer than k other rows exist.
#[derive(Clone, Debug)]
pub struct KnnGraph {
    pub k: usize,
    pub ids: Vec<u32>,
    pub dists: Vec<f32>,
}

/// Device memory the k-NN of `n` rows needs besides the vectors.
pub(crate) fn device_bytes(n: usize, dk: usize, k: usize) -> usize {
    let l = if k > 16 { 64 } else { 32 };
    n * dk * 2 + n * 4 + n * l * 8 + n * k * 8
}

/// Padded dimension of the fp16 copy.
pub(crate) fn dk_for(dim: usize) -> usize {
    dim.div_ceil(KC) * KC
}

/// Power-of-two scale putting the largest magnitude, `maxabs`, near 2^13
/// in fp16.
fn fp16_scale(maxabs: f32) -> f32 {
    if maxabs.is_nan() || maxabs <= 0.0 || !maxabs.is_finite() {
        return 1.0;
    }
    let e = 13 - maxabs.log2().ceil() as i32;
    2f32.powi(e.clamp(-60, 60))
}

/// The vectors staged for the tensor cores (knn_exact.cu's knn_prep):
/// scaled fp16 rows of `dk` halves and the fp32 squared norms.
pub(crate) struct Staged {
    pub xh: CudaSlice<u16>,
    pub norms: CudaSlice<f32>,
    pub dk: usize,
    /// 1 / scale^2: the products' factor back to the vectors' units
    pub inv_scale2: f32,
}

fn warps(rows: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (rows.div_ceil(8) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// Stages the uploaded vectors (`maxabs`: their largest magnitude, for the
/// fp16 scale) by `m`, a compiled knn_exact.cu.
pub(crate) fn stage(gpu: &Gpu, m: &Arc<CudaModule>, dv: &DeviceVectors, maxabs: f32) -> Result<Staged, GpuError> {
    let (n, dk) = (dv.n, dk_for(dv.dim));
    let prep = function(m, "knn_prep")?;
    let s = &gpu.stream;
    let scale = fp16_scale(maxabs);
    let mut xh = zeroed::<u16>(s, n * dk, "the fp16 vectors")?;
    let mut norms = zeroed::<f32>(s, n, "norms")?;
    let (n32, dp32, dk32) = (n as u32, dv.dp as u32, dk as u32);
    let mut b = s.launch_builder(&prep);
    b.arg(&dv.x).arg(&n32).arg(&dp32).arg(&dk32).arg(&scale).arg(&mut xh).arg(&mut norms);
    // SAFETY: the arguments match knn_prep; one warp per row.
    unsafe { b.launch(warps(n)) }.map_err(|e| cuda("knn_prep", e))?;
    Ok(Staged { xh, norms, dk, inv_scale2: 1.0 / (scale * scale) })
}

/// The k best of each row's `l` candidate ids (n x l, NO_NODE for none) by
/// fp32 distance, ascending by (distance, id): knn_exact.cu's knn_rerank.
pub(crate) fn rerank(
    gpu: &Gpu,
    m: &Arc<CudaModule>,
    dv: &DeviceVectors,
    cand_i: &CudaSlice<u32>,
    l: usize,
    k: usize,
) -> Result<(CudaSlice<u32>, CudaSlice<f32>), GpuError> {
    let n = dv.n;
    let f = function(m, "knn_rerank")?;
    let s = &gpu.stream;
    let mut out_i = zeroed::<u32>(s, n * k, "the k-NN graph")?;
    let mut out_d = zeroed::<f32>(s, n * k, "the k-NN graph")?;
    let (n32, dp32, l32, k32) = (n as u32, dv.dp as u32, l as u32, k as u32);
    let mut b = s.launch_builder(&f);
    b.arg(&dv.x).arg(&n32).arg(&dp32).arg(cand_i).arg(&l32).arg(&k32).arg(&mut out_i).arg(&mut out_d);
    // SAFETY: the arguments match knn_rerank; one warp per row.
    unsafe { b.launch(warps(n)) }.map_err(|e| cuda("knn_rerank", e))?;
    s.synchronize().map_err(|e| cuda("the k-NN re-rank", e))?;
    Ok((out_i, out_d))
}

/// The k-NN of the uploaded vectors, left on the device: (ids, distances),
/// n x k. `maxabs` is their largest magnitude (for the fp16 scale).
/// `control` may stop it between launches.
pub(crate) fn knn_device(
    gpu: &Gpu,
    dv: &DeviceVectors,
    maxabs: f32,
    k: usize,
    control: &dyn crate::grnnd::Control,
) -> Result<(CudaSlice<u32>, CudaSlice<f32>), GpuError> {
    if k == 0 || k > MAX_K {
        return Err(GpuError::Unsupported(format!("exact k-NN with k = {k} (1..={MAX_K})")));
    }
    let n = dv.n;
    let l = if k > 16 { 64 } else { 32 };
    let m = gpu.knn_module(l / 32)?;
    let tiles = function(&m, if l == 64 { "knn_tiles_64" } else { "knn_tiles_32" })?;
    tiles
        .set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            abi::KNN_SMEM_BYTES as i32,
        )
        .map_err(|e| cuda("knn shared memory", e))?;
    let st = stage(gpu, &m, dv, maxabs)?;
    let s = &gpu.stream;
    let dk = st.dk;
    let mut cand_i = zeroed::<u32>(s, n * l, "k-NN candidates")?;
    let mut cand_d = zeroed::<f32>(s, n * l, "k-NN candidates")?;
    let (n32, dk32) = (n as u32, dk as u32);
    // column slices of about 2^38 multiply-adds per launch (a few ms on a
    // Hopper), so a cancel is seen promptly even at millions of rows
    let ntiles = n.div_ceil(BN);
    let per_launch = ((1usize << 38) / (n.max(1) * dk * BN)).clamp(1, ntiles);
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(BM) as u32, 1, 1),
        block_dim: (abi::KNN_THREADS, 1, 1),
        shared_mem_bytes: abi::KNN_SMEM_BYTES,
    };
    let mut t = 0;
    while t < ntiles {
        let t1 = (t + per_launch).min(ntiles);
        let (cb, ce, resume) = ((t * BN) as u32, (t1 * BN) as u32, (t > 0) as u32);
        let mut b = s.launch_builder(&tiles);
        b.arg(&st.xh).arg(&st.norms).arg(&n32).arg(&dk32).arg(&st.inv_scale2).arg(&cb).arg(&ce).arg(&resume);
        b.arg(&mut cand_i).arg(&mut cand_d);
        // SAFETY: the arguments match knn_tiles_32/64; a block per BM rows.
        unsafe { b.launch(cfg) }.map_err(|e| cuda("knn_tiles", e))?;
        t = t1;
        if t < ntiles {
            s.synchronize().map_err(|e| cuda("knn_tiles", e))?;
            if control.stop() {
                return Err(GpuError::Cancelled);
            }
        }
    }
    drop(st);
    rerank(gpu, &m, dv, &cand_i, l, k)
}

/// The exact k-NN graph of `vectors` (n x `dim`, squared L2), k <= 32.
pub fn knn_graph(gpu: &Gpu, vectors: &[f32], dim: usize, k: usize) -> Result<KnnGraph, GpuError> {
    guard("exact k-NN", || {
        let n = vectors.len().checked_div(dim).unwrap_or(0);
        if n == 0 {
            return Ok(KnnGraph { k, ids: Vec::new(), dists: Vec::new() });
        }
        let dv0 = DeviceVectors::plan(n, dim)?;
        gpu.reserve(dv0.bytes() + device_bytes(n, dk_for(dim), k), "the exact k-NN graph")?;
        let dv = DeviceVectors::upload(gpu, vectors, dim)?;
        let (di, dd) = knn_device(gpu, &dv, crate::vectors::max_abs(vectors), k, &|| false)?;
        let ids = gpu.stream.clone_dtoh(&di).map_err(|e| cuda("downloading the k-NN graph", e))?;
        let dists = gpu.stream.clone_dtoh(&dd).map_err(|e| cuda("downloading the k-NN graph", e))?;
        Ok(KnnGraph { k, ids, dists })
    })
}
