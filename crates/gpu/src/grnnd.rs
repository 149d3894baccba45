//! The GPU build: GRNND (kernels/rnn_descent.cu) from a random or an exact
//! k-NN start, then the same final cut as the CPU path.

use std::time::Instant;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use gpu_graph_engine::graph::Graph;
use gpu_graph_engine::medoid::medoid;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::NO_NODE;
use rayon::prelude::*;

use crate::device::{function, Gpu};
use crate::error::{cuda, guard, GpuError};
use crate::knn;
use crate::vectors::DeviceVectors;

/// The initial graph (index option `knn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnnInit {
    /// Exact below [`EXACT_KNN_AUTO_MAX_ROWS`] rows, random above.
    Auto,
    /// S random neighbours per node (GRNND's Algorithm 3 line 4).
    Random,
    /// The S exact nearest neighbours, by the tensor-core k-NN kernel.
    Exact,
}

/// Row count up to which `knn = 'auto'` starts from the exact k-NN graph.
///
/// Measured on an H200 (SIFT, degree 32, S 16, R 64, T1 3, T2 8, rho 1): the
/// exact start never makes the build faster (the rounds take as long after
/// it), but it improves recall@10 at ef 10 by 0.01 to 0.02; it costs
/// +38 ms at 50k rows, +53 ms at 100k, +200 ms at 200k, +1.2 s at 500k and
/// +4.8 s at 1M (the fused GEMM is quadratic). Up to 100k rows that is
/// noise next to a CREATE INDEX; beyond, the random start wins. (The first
/// exact build on a machine also pays ~2 s of NVRTC compile, which NVRTC's
/// own cache then keeps for later processes.)
pub const EXACT_KNN_AUTO_MAX_ROWS: usize = 100_000;

/// Order in which a round scans a pool (see rnn_descent.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanOrder {
    /// GRNND's disordered propagation: a fresh random order every round.
    Random = 0,
    /// Algorithm 2's ascending distance order (the CPU path's).
    Ascending = 1,
}

/// The prune/redirect test of a pair (near, far) of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PruneRule {
    /// GRNND's Eq. 2: d(near, far) < d(v, far).
    Strict = 0,
    /// The engine's `prune::occludes`: d(near, far) <= d(v, far), except that
    /// a copy of v (d(v, near) = 0) prunes only other copies.
    Engine = 1,
}

/// Knobs of the GPU builder that are not index options (for measurements).
#[derive(Clone, Copy, Debug)]
pub struct GpuOptions {
    pub order: ScanOrder,
    pub rule: PruneRule,
    /// Mark a candidate old as soon as it is accepted, as the engine's CPU
    /// update does (the reference clears the flags after the scan).
    pub old_on_accept: bool,
    /// Use an fp16 copy of the vectors in the rounds when it is exact.
    pub half_when_exact: bool,
    /// Also download the pools and check the device's final cut against
    /// the host's (`PhaseTimes::cut_mismatches`).
    pub verify_cut: bool,
    /// Lanes per distance (power of two dividing 32); 0 = chosen from the
    /// dimension.
    pub lanes_per_distance: u32,
    /// Stop an outer round's updates early when a round inserts fewer than
    /// `early_stop * n` new entries (0 = always run t2 rounds).
    pub early_stop: f64,
    /// Print one line per round to stderr.
    pub verbose: bool,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            order: ScanOrder::Random,
            rule: PruneRule::Strict,
            old_on_accept: false,
            half_when_exact: true,
            verify_cut: false,
            lanes_per_distance: 0,
            early_stop: 0.0,
            verbose: false,
        }
    }
}

/// Milliseconds per phase of a GPU build.
#[derive(Clone, Debug, Default)]
pub struct PhaseTimes {
    /// host -> device copy of the vectors
    pub upload_ms: f64,
    /// the initial graph (random, or the exact k-NN)
    pub knn_ms: f64,
    /// GRNND's update and reverse-edge rounds
    pub refine_ms: f64,
    /// the final cut on the device (sort, de-duplicate, cut to degree)
    pub final_cut_ms: f64,
    /// device -> host copy of the adjacency
    pub download_ms: f64,
    /// the medoid and the output buffer (CPU, on another thread while the
    /// GPU works: not part of the total)
    pub entry_ms: f64,
    /// which initial graph was used
    pub knn_exact: bool,
    /// update rounds run (fewer than t1 * t2 with early stop)
    pub rounds: usize,
    /// new entries inserted by each update round
    pub inserts_per_round: Vec<u64>,
    /// pair distances computed by each update round
    pub distances_per_round: Vec<u64>,
    /// whether the rounds read the fp16 copy of the vectors
    pub half: bool,
    /// with `verify_cut`: lists where the device's cut and the host's differ
    pub cut_mismatches: Option<usize>,
}

impl PhaseTimes {
    pub fn total_ms(&self) -> f64 {
        self.upload_ms + self.knn_ms + self.refine_ms + self.final_cut_ms + self.download_ms
    }
}

const WARPS_PER_BLOCK: u32 = 8;

fn warp_grid(n: usize, r: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(WARPS_PER_BLOCK as usize) as u32, 1, 1),
        block_dim: (WARPS_PER_BLOCK * 32, 1, 1),
        shared_mem_bytes: (WARPS_PER_BLOCK as usize * 6 * r * 4) as u32,
    }
}

fn lanes_for(dp: usize, asked: u32) -> u32 {
    if asked != 0 {
        return asked.clamp(1, 32).next_power_of_two().min(32);
    }
    // about 4 float4 loads per lane
    let q = (dp / 4 / 4).max(1) as u32;
    let p = 1u32 << (31 - q.leading_zeros());
    p.clamp(1, 32)
}

/// Builds the graph on the GPU with [`GpuOptions::default`]. `cancel` is
/// called between rounds; when it returns true the build stops with
/// [`GpuError::Cancelled`] and every device buffer is freed.
pub fn build(
    gpu: &Gpu,
    vectors: &[f32],
    stored_dim: usize,
    params: &BuildParams,
    knn: KnnInit,
    cancel: &dyn Fn() -> bool,
) -> Result<(Graph, PhaseTimes), GpuError> {
    build_with(gpu, vectors, stored_dim, params, knn, &GpuOptions::default(), cancel)
}

pub fn build_with(
    gpu: &Gpu,
    vectors: &[f32],
    stored_dim: usize,
    params: &BuildParams,
    knn: KnnInit,
    opts: &GpuOptions,
    cancel: &dyn Fn() -> bool,
) -> Result<(Graph, PhaseTimes), GpuError> {
    let r = guard("GPU build", || build_inner(gpu, vectors, stored_dim, params, knn, opts, cancel));
    // whatever happened, leave no work queued behind freed buffers
    let _ = gpu.stream.synchronize();
    r
}

fn build_inner(
    gpu: &Gpu,
    vectors: &[f32],
    dim: usize,
    params: &BuildParams,
    knn_init: KnnInit,
    opts: &GpuOptions,
    cancel: &dyn Fn() -> bool,
) -> Result<(Graph, PhaseTimes), GpuError> {
    let mut times = PhaseTimes::default();
    let degree = params.degree;
    let n = vectors.len().checked_div(dim).unwrap_or(0);
    if n < 2 || degree == 0 {
        // nothing to refine: no edges
        let t = Instant::now();
        let g = Graph { degree, adjacency: vec![NO_NODE; n * degree], entry: medoid(vectors, dim) };
        times.entry_ms = t.elapsed().as_secs_f64() * 1e3;
        return Ok((g, times));
    }
    // as the CPU path: a pool never holds fewer than the final degree
    let r = params.r.max(degree);
    if r > 1024 {
        return Err(GpuError::Unsupported(format!("pool capacity r = {r} (at most 1024 on the GPU)")));
    }
    // On a second thread, while the GPU works: the medoid, and the output
    // buffer with every page touched (a fresh 128 MB buffer costs ~80 ms of
    // page faults inside the download otherwise).
    std::thread::scope(|sc| {
        let host = sc.spawn(|| {
            let t = Instant::now();
            let entry = medoid(vectors, dim);
            let mut adj = vec![0u32; n * degree];
            adj.par_chunks_mut(1024).for_each(|c| c[0] = NO_NODE);
            (entry, adj, t.elapsed().as_secs_f64() * 1e3)
        });
        let mut host = Some(host);
        let mut take = || host.take().expect("taken once").join().expect("the host thread panicked");
        device_build(gpu, vectors, dim, params, knn_init, opts, cancel, times, &mut take)
    })
}

type HostPart = (Option<u32>, Vec<u32>, f64);

#[allow(clippy::too_many_arguments)]
fn device_build(
    gpu: &Gpu,
    vectors: &[f32],
    dim: usize,
    params: &BuildParams,
    knn_init: KnnInit,
    opts: &GpuOptions,
    cancel: &dyn Fn() -> bool,
    mut times: PhaseTimes,
    take_host: &mut dyn FnMut() -> HostPart,
) -> Result<(Graph, PhaseTimes), GpuError> {
    let degree = params.degree;
    let n = vectors.len() / dim;
    let r = params.r.max(degree);
    let s = params.s.max(1);
    let exact = match knn_init {
        KnnInit::Exact => true,
        KnnInit::Random => false,
        KnnInit::Auto => n <= EXACT_KNN_AUTO_MAX_ROWS,
    };
    // the exact start: the S nearest (at most 32) plus S random neighbours.
    // Measured (SIFT): the exact neighbours alone trap RNN-Descent in a
    // sparse graph (mean degree ~8, recall@10 at ef 10 ~0.69 where a random
    // start gives ~0.85); with S random edges beside them it beats the
    // random start.
    let k_init = s.min(knn::MAX_K).min(n - 1).min(r);
    times.knn_exact = exact;

    let plan = DeviceVectors::plan(n, dim)?;
    let mut need = plan.bytes() * 3 / 2 + 2 * n * r * 8 + 2 * n * 4 + n * degree * 4 + 64;
    if exact {
        need += knn::device_bytes(n, knn::dk_for(dim), k_init);
    }
    gpu.reserve(need, "the GPU graph build")?;

    let m = &gpu.grnnd;
    let f_update = function(m, "grnnd_update")?;
    let f_reverse = function(m, "grnnd_reverse")?;
    let f_init_random = function(m, "grnnd_init_random")?;
    let f_init_knn = function(m, "grnnd_init_knn")?;
    let f_finish = function(m, "grnnd_finish")?;
    let f_to_half = function(m, "grnnd_to_half")?;
    let cfg = warp_grid(n, r);
    if cfg.shared_mem_bytes > 48 * 1024 {
        for f in [&f_update, &f_reverse, &f_init_random, &f_finish] {
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                cfg.shared_mem_bytes as i32,
            )
            .map_err(|e| cuda("GRNND shared memory", e))?;
        }
    }
    let st = &gpu.stream;
    let sync = |what: &str| st.synchronize().map_err(|e| cuda(what, e));

    // upload
    let t = Instant::now();
    let dv = DeviceVectors::upload(gpu, vectors, dim)?;
    sync("uploading the vectors")?;
    times.upload_ms = t.elapsed().as_secs_f64() * 1e3;
    if cancel() {
        return Err(GpuError::Cancelled);
    }

    let alloc = |what: &str, e| cuda(&format!("allocating {what}"), e);
    let mut pool_a: CudaSlice<u64> = unsafe { st.alloc(n * r) }.map_err(|e| alloc("the pools", e))?;
    let mut pool_b: CudaSlice<u64> = unsafe { st.alloc(n * r) }.map_err(|e| alloc("the pools", e))?;
    let mut cnt_a: CudaSlice<u32> = st.alloc_zeros(n).map_err(|e| alloc("the pool counters", e))?;
    let mut cnt_b: CudaSlice<u32> = st.alloc_zeros(n).map_err(|e| alloc("the pool counters", e))?;
    let mut stats: CudaSlice<u64> = st.alloc_zeros(4).map_err(|e| alloc("statistics", e))?;

    let (n32, dp32, r32) = (n as u32, dv.dp as u32, r as u32);
    let g32 = lanes_for(dv.dp, opts.lanes_per_distance);
    let seed = params.seed;
    let s32 = s as u32;

    // the initial graph
    let t = Instant::now();
    let mut keep32 = 0u32;
    if exact {
        let (ki, kd) = knn::knn_device(gpu, &dv, vectors, k_init, cancel)?;
        let k32 = k_init as u32;
        let threads = n * r;
        let c = LaunchConfig {
            grid_dim: (threads.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe {
            st.launch_builder(&f_init_knn)
                .arg(&ki)
                .arg(&kd)
                .arg(&n32)
                .arg(&k32)
                .arg(&mut pool_a)
                .arg(&mut cnt_a)
                .arg(&r32)
                .launch(c)
        }
        .map_err(|e| cuda("grnnd_init_knn", e))?;
        keep32 = k32;
    }
    // the fp16 copy, when exact (after the k-NN, which re-ranks in fp32)
    let mut half32 = 0u32;
    let mut xh: Option<CudaSlice<u16>> = None;
    if opts.half_when_exact {
        let mut h: CudaSlice<u16> = unsafe { st.alloc(n * dv.dp) }.map_err(|e| alloc("the fp16 vectors", e))?;
        let mut lossy: CudaSlice<u32> = st.alloc_zeros(1).map_err(|e| alloc("a flag", e))?;
        let count = (n * dv.dp) as u64;
        let c = LaunchConfig { grid_dim: (2048, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        unsafe { st.launch_builder(&f_to_half).arg(&dv.x).arg(&count).arg(&mut h).arg(&mut lossy).launch(c) }
            .map_err(|e| cuda("grnnd_to_half", e))?;
        if st.clone_dtoh(&lossy).map_err(|e| cuda("grnnd_to_half", e))?[0] == 0 {
            half32 = 1;
            xh = Some(h);
        }
    }
    times.half = half32 == 1;
    // device pointer of the vectors the rounds read
    let xptr: u64 = match &xh {
        Some(h) => h.device_ptr(st).0,
        None => dv.x.device_ptr(st).0,
    };
    // the random start, after the exact neighbours if any
    unsafe {
        st.launch_builder(&f_init_random)
            .arg(&xptr)
            .arg(&half32)
            .arg(&n32)
            .arg(&dp32)
            .arg(&g32)
            .arg(&mut pool_a)
            .arg(&mut cnt_a)
            .arg(&r32)
            .arg(&s32)
            .arg(&seed)
            .arg(&keep32)
            .launch(cfg)
    }
    .map_err(|e| cuda("grnnd_init_random", e))?;
    sync("the start")?;
    times.knn_ms = t.elapsed().as_secs_f64() * 1e3;
    if cancel() {
        return Err(GpuError::Cancelled);
    }

    // refinement
    let t = Instant::now();
    let mode32 = (opts.order == ScanOrder::Ascending) as u32
        | ((opts.rule == PruneRule::Engine) as u32) << 1
        | (opts.old_on_accept as u32) << 2;
    let mut round: u32 = 0;
    for outer in 0..params.t1 {
        for inner in 0..params.t2 {
            let tr = Instant::now();
            unsafe {
                let (p, _g) = pool_b.device_ptr_mut(st);
                cudarc::driver::result::memset_d8_async(p, 0xFF, n * r * 8, st.cu_stream())
                    .map_err(|e| cuda("clearing a pool buffer", e))?;
            }
            st.memset_zeros(&mut cnt_b).map_err(|e| cuda("clearing the counters", e))?;
            st.memset_zeros(&mut stats).map_err(|e| cuda("clearing the statistics", e))?;
            unsafe {
                st.launch_builder(&f_update)
                    .arg(&xptr)
                    .arg(&half32)
                    .arg(&n32)
                    .arg(&dp32)
                    .arg(&g32)
                    .arg(&pool_a)
                    .arg(&mut pool_b)
                    .arg(&mut cnt_b)
                    .arg(&r32)
                    .arg(&seed)
                    .arg(&round)
                    .arg(&mode32)
                    .arg(&mut stats)
                    .launch(cfg)
            }
            .map_err(|e| cuda("grnnd_update", e))?;
            std::mem::swap(&mut pool_a, &mut pool_b);
            std::mem::swap(&mut cnt_a, &mut cnt_b);
            round += 1;
            let sv = st.clone_dtoh(&stats).map_err(|e| cuda("grnnd_update", e))?;
            let inserted = sv[0];
            times.inserts_per_round.push(inserted);
            times.distances_per_round.push(sv[1]);
            if opts.verbose {
                eprintln!(
                    "  round {round} (outer {outer}, inner {inner}): {:.2} ms, {} distances, {} redirects, {inserted} entered",
                    tr.elapsed().as_secs_f64() * 1e3,
                    sv[1],
                    sv[2]
                );
            }
            if cancel() {
                return Err(GpuError::Cancelled);
            }
            if opts.early_stop > 0.0 && (inserted as f64) < opts.early_stop * n as f64 {
                break;
            }
        }
        if outer + 1 < params.t1 {
            // reverse edges: the other buffer starts as a copy of the
            // snapshot, which the kernel reads
            st.memcpy_dtod(&pool_a, &mut pool_b).map_err(|e| cuda("copying the pools", e))?;
            st.memcpy_dtod(&cnt_a, &mut cnt_b).map_err(|e| cuda("copying the counters", e))?;
            unsafe {
                st.launch_builder(&f_reverse)
                    .arg(&pool_a)
                    .arg(&mut pool_b)
                    .arg(&mut cnt_b)
                    .arg(&n32)
                    .arg(&r32)
                    .arg(&params.rho)
                    .launch(cfg)
            }
            .map_err(|e| cuda("grnnd_reverse", e))?;
            std::mem::swap(&mut pool_a, &mut pool_b);
            std::mem::swap(&mut cnt_a, &mut cnt_b);
            sync("grnnd_reverse")?;
            if cancel() {
                return Err(GpuError::Cancelled);
            }
        }
    }
    times.rounds = round as usize;
    sync("the refinement")?;
    times.refine_ms = t.elapsed().as_secs_f64() * 1e3;
    drop(cnt_b);
    drop(cnt_a);
    drop(xh);
    drop(dv);

    // the final cut, on the device
    let t = Instant::now();
    let mut adj: CudaSlice<u32> = unsafe { st.alloc(n * degree) }.map_err(|e| alloc("the adjacency", e))?;
    let deg32 = degree as u32;
    unsafe { st.launch_builder(&f_finish).arg(&pool_a).arg(&n32).arg(&r32).arg(&deg32).arg(&mut adj).launch(cfg) }
        .map_err(|e| cuda("grnnd_finish", e))?;
    sync("the final cut")?;
    times.final_cut_ms = t.elapsed().as_secs_f64() * 1e3;
    drop(pool_b);

    // download
    let (entry, mut adjacency, host_ms) = take_host();
    times.entry_ms = host_ms;
    let t = Instant::now();
    st.memcpy_dtoh(&adj, &mut adjacency).map_err(|e| cuda("downloading the graph", e))?;
    sync("downloading the graph")?;
    times.download_ms = t.elapsed().as_secs_f64() * 1e3;
    if opts.verify_cut {
        let pools: Vec<u64> = st.clone_dtoh(&pool_a).map_err(|e| cuda("downloading the pools", e))?;
        let host = final_cut(&pools, r, degree);
        times.cut_mismatches = Some(host.chunks(degree).zip(adjacency.chunks(degree)).filter(|(a, b)| a != b).count());
    }
    drop(pool_a);
    drop(adj);
    Ok((Graph { degree, adjacency, entry }, times))
}

/// The final cut of RNN-Descent on the host, the same as the CPU path's
/// (gpu_graph_engine::rnn_descent::build, "the final cut": each pool sorted
/// by (distance, id), repeated ids removed, the nearest `degree` kept, padded
/// with NO_NODE). The build does it on the device (grnnd_finish) so that
/// only n x degree ids are downloaded; this copy checks it
/// (`GpuOptions::verify_cut`).
///
/// TODO(engine): the engine keeps its cut inside `rnn_descent::build`; once
/// it exports it, the check should call that instead of this copy.
fn final_cut(pools: &[u64], r: usize, degree: usize) -> Vec<u32> {
    let n = pools.len() / r;
    let mut adjacency = vec![NO_NODE; n * degree];
    adjacency.par_chunks_mut(degree).enumerate().for_each_init(Vec::new, |buf: &mut Vec<(f32, u32)>, (v, out)| {
        buf.clear();
        for &s in &pools[v * r..(v + 1) * r] {
            if s == u64::MAX {
                continue;
            }
            let id = (s as u32) & 0x7FFF_FFFF;
            if id as usize == v {
                continue;
            }
            buf.push((f32::from_bits((s >> 32) as u32), id));
        }
        buf.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        // an id met twice (an insert race) keeps its first, nearest copy
        let mut k = 0;
        for &(_, id) in buf.iter() {
            if k == degree {
                break;
            }
            if out[..k].contains(&id) {
                continue;
            }
            out[k] = id;
            k += 1;
        }
    });
    adjacency
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(d: f32, id: u32, new: bool) -> u64 {
        ((d.to_bits() as u64) << 32) | id as u64 | if new { 1 << 31 } else { 0 }
    }

    #[test]
    fn host_cut_sorts_dedupes_and_pads() {
        // node 0: ids 5 (twice, the nearer copy first), 3, itself, EMPTY
        let e = u64::MAX;
        let pools = vec![
            slot(2.0, 5, true),
            slot(1.0, 3, false),
            slot(0.5, 5, false),
            slot(0.0, 0, false),
            e,
            // node 1: one neighbour
            slot(4.0, 0, true),
            e,
            e,
            e,
            e,
        ];
        let adj = final_cut(&pools, 5, 3);
        assert_eq!(adj, vec![5, 3, NO_NODE, 0, NO_NODE, NO_NODE]);
        // degree 1 keeps the nearest only
        assert_eq!(final_cut(&pools, 5, 1), vec![5, 0]);
    }

    #[test]
    fn lanes_per_distance() {
        assert_eq!(lanes_for(128, 0), 8);
        assert_eq!(lanes_for(384, 0), 16);
        assert_eq!(lanes_for(4, 0), 1);
        assert_eq!(lanes_for(4096, 0), 32);
        assert_eq!(lanes_for(128, 3), 4);
    }
}
