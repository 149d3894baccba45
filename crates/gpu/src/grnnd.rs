//! The GPU build: GRNND (kernels/rnn_descent.cu) from a random start, with
//! an exact or GNN-Descent k-NN start beside it, then the engine's final
//! cut, done on the device.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use gpu_graph_engine::graph::{final_cut, Graph};
use gpu_graph_engine::medoid::medoid;
use gpu_graph_engine::params::{BuildParams, ScanOrder};
use gpu_graph_engine::NO_NODE;
use rayon::prelude::*;

use crate::abi;
use crate::device::{function, Gpu};
use crate::error::{cuda, guard, GpuError};
use crate::knn;
use crate::knn_descent::{self, DescentParams};
use crate::memory::zeroed;
use crate::vectors::DeviceVectors;

/// The initial graph (index option `knn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnnInit {
    /// Exact up to [`EXACT_KNN_AUTO_MAX_ROWS`] rows, GNN-Descent above.
    Auto,
    /// S random neighbours per node (GRNND's Algorithm 3 line 4).
    Random,
    /// The S exact nearest neighbours, by the tensor-core k-NN kernel.
    Exact,
    /// The S nearest neighbours GNN-Descent finds (crate::knn_descent).
    Descent,
}

/// The initial graph a build of some size starts from ([`KnnInit::start`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Start {
    #[default]
    Random,
    Exact,
    Descent,
}

impl Start {
    /// Whether the start has k-NN lists besides the random ones.
    fn knn(self) -> bool {
        self != Start::Random
    }

    pub fn label(self) -> &'static str {
        match self {
            Start::Random => "random",
            Start::Exact => "exact+random",
            Start::Descent => "descent+random",
        }
    }
}

/// Row count up to which `knn = 'auto'` starts from the exact k-NN graph,
/// and above which from GNN-Descent's: a k-NN start never makes the rounds
/// shorter, but it improves recall at small ef (exact: +0.01 to 0.02 at ef
/// 10), and the exact graph's cost grows quadratically (+4.8 s at 1M SIFT,
/// 15 s at 1M x 768) where GNN-Descent's grows with n (0.14 s and 0.5 s in
/// a build, for 0.965 against the exact start's 0.965 and the random
/// start's 0.957-0.960 at ef 10 on 1M SIFT; docs/benchmarks.md).
pub const EXACT_KNN_AUTO_MAX_ROWS: usize = 100_000;

/// Knobs of the GPU builder that are not index options (for measurements).
#[derive(Clone, Copy, Debug)]
pub struct GpuOptions {
    pub order: ScanOrder,
    /// Use an fp16 copy of the vectors in the rounds when it is exact.
    pub half_when_exact: bool,
    /// Also download the pools and check the device's final cut against
    /// the engine's (`PhaseTimes::cut_mismatches`).
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
    /// the initial graph (random, or the exact or GNN-Descent's k-NN and random)
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
    pub start: Start,
    /// GNN-Descent's start: the list entries each of its rounds changed
    pub descent_entered: Vec<u64>,
    /// update rounds run (fewer than t1 * t2 with early stop)
    pub rounds: usize,
    /// new entries inserted by each update round
    pub inserts_per_round: Vec<u64>,
    /// pair distances computed by each update round
    pub distances_per_round: Vec<u64>,
    /// whether the rounds read the fp16 copy of the vectors
    pub half: bool,
    /// with `verify_cut`: lists where the device's cut and the engine's differ
    pub cut_mismatches: Option<usize>,
}

impl PhaseTimes {
    pub fn total_ms(&self) -> f64 {
        self.upload_ms + self.knn_ms + self.refine_ms + self.final_cut_ms + self.download_ms
    }
}

/// One warp per vertex, with GRNND_SCRATCH_WORDS * R words of shared memory each.
fn warp_grid(n: usize, r: usize) -> LaunchConfig {
    let w = abi::GRNND_WARPS as usize;
    LaunchConfig {
        grid_dim: (n.div_ceil(w) as u32, 1, 1),
        block_dim: (abi::GRNND_WARPS * 32, 1, 1),
        shared_mem_bytes: (w * abi::GRNND_SCRATCH_WORDS as usize * r * 4) as u32,
    }
}

/// Lanes per distance: about 4 float4 loads per lane.
pub(crate) fn lanes_for(dp: usize, asked: u32) -> u32 {
    if asked != 0 {
        return asked.clamp(1, 32).next_power_of_two().min(32);
    }
    let q = (dp / 4 / 4).max(1) as u32;
    let p = 1u32 << (31 - q.leading_zeros());
    p.clamp(1, 32)
}

/// What the caller of a build can see and say while it runs (on the build's
/// thread): a closure `|| stop` is one that only may stop it.
pub trait Control {
    /// Asked between rounds; true stops the build with
    /// [`GpuError::Cancelled`], every device buffer freed.
    fn stop(&self) -> bool;
    /// Told after each update round: `done` of at most `total` (early
    /// stopping may end the build before `total`).
    fn round(&self, _done: usize, _total: usize) {}
}

impl<F: Fn() -> bool> Control for F {
    fn stop(&self) -> bool {
        self()
    }
}

/// Builds the graph on the GPU with [`GpuOptions::default`], under `control`.
pub fn build(
    gpu: &Gpu,
    vectors: &[f32],
    stored_dim: usize,
    params: &BuildParams,
    knn: KnnInit,
    control: &dyn Control,
) -> Result<(Graph, PhaseTimes), GpuError> {
    build_with(gpu, vectors, stored_dim, params, knn, &GpuOptions::default(), control)
}

pub fn build_with(
    gpu: &Gpu,
    vectors: &[f32],
    stored_dim: usize,
    params: &BuildParams,
    knn: KnnInit,
    opts: &GpuOptions,
    control: &dyn Control,
) -> Result<(Graph, PhaseTimes), GpuError> {
    let r = guard("GPU build", || build_inner(gpu, vectors, stored_dim, params, knn, opts, control));
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
    control: &dyn Control,
) -> Result<(Graph, PhaseTimes), GpuError> {
    let degree = params.degree;
    let n = vectors.len().checked_div(dim).unwrap_or(0);
    if n < 2 || degree == 0 {
        // nothing to refine: no edges
        let t = Instant::now();
        let g = Graph { degree, adjacency: vec![NO_NODE; n * degree], entry: medoid(vectors, dim) };
        let times = PhaseTimes { entry_ms: t.elapsed().as_secs_f64() * 1e3, ..PhaseTimes::default() };
        return Ok((g, times));
    }
    // as the CPU builder: a pool never holds fewer than the final degree
    let r = params.r.max(degree);
    if r > 1024 {
        return Err(GpuError::Unsupported(format!("pool capacity r = {r} (at most 1024 on the GPU)")));
    }
    let start = knn_init.start(n);
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
        let t = Instant::now();
        let dv = Run::upload(gpu, n, dim, params, start, &mut || DeviceVectors::upload(gpu, vectors, dim))?;
        // the k-NN start's fp16 scale: a pass over the vectors only then
        let maxabs = if start.knn() { crate::vectors::max_abs(vectors) } else { 0.0 };
        let mut run = Run::new(gpu, dv, maxabs, t, params, start, opts, control)?;
        run.start()?;
        run.refine()?;
        let (entry, mut adjacency, host_ms) = host.join().expect("the host thread panicked");
        run.times.entry_ms = host_ms;
        let adj = run.final_cut()?;
        let t = Instant::now();
        let st = run.st;
        st.memcpy_dtoh(&adj, &mut adjacency).map_err(|e| cuda("downloading the graph", e))?;
        st.synchronize().map_err(|e| cuda("downloading the graph", e))?;
        run.times.download_ms = t.elapsed().as_secs_f64() * 1e3;
        run.verify_cut(&adjacency)?;
        Ok((Graph { degree, adjacency, entry }, run.times))
    })
}

/// Builds the graph of `n` rows handed over in pieces of consecutive rows
/// by `next` (None: no more; the host never holds them all), and hands its
/// lists back in pieces of at most `piece_rows` consecutive nodes to
/// `lists` (first node, their `degree` ids a node). No entry point: the
/// caller has the rows to find one. A build whose device memory
/// ([`device_bytes`]) the caller has weighed: the host's is a piece.
#[allow(clippy::too_many_arguments)]
pub fn build_streamed(
    gpu: &Gpu,
    n: usize,
    dim: usize,
    params: &BuildParams,
    knn_init: KnnInit,
    next: &mut dyn FnMut() -> Option<Vec<f32>>,
    piece_rows: usize,
    lists: &mut dyn FnMut(usize, &[u32]),
    control: &dyn Control,
) -> Result<PhaseTimes, GpuError> {
    let r = guard("GPU build", || {
        if n < 2 || params.degree == 0 || params.r.max(params.degree) > 1024 {
            return Err(GpuError::Unsupported(format!(
                "a streamed build of {n} rows, degree {}, pool {}",
                params.degree, params.r
            )));
        }
        let start = knn_init.start(n);
        let t = Instant::now();
        let mut maxabs = 0f32;
        let dv = Run::upload(gpu, n, dim, params, start, &mut || {
            let (dv, m) = DeviceVectors::upload_pieces(gpu, n, dim, next)?;
            maxabs = m;
            Ok(dv)
        })?;
        let opts = GpuOptions::default();
        let mut run = Run::new(gpu, dv, maxabs, t, params, start, &opts, control)?;
        run.start()?;
        run.refine()?;
        let adj = run.final_cut()?;
        let t = Instant::now();
        let (st, degree) = (run.st, params.degree);
        let step = piece_rows.max(1);
        let mut host = vec![0u32; step.min(n) * degree];
        for first in (0..n).step_by(step) {
            let rows = step.min(n - first);
            let out = &mut host[..rows * degree];
            st.memcpy_dtoh(&adj.slice(first * degree..(first + rows) * degree), out)
                .map_err(|e| cuda("downloading the graph", e))?;
            st.synchronize().map_err(|e| cuda("downloading the graph", e))?;
            lists(first, out);
        }
        run.times.download_ms = t.elapsed().as_secs_f64() * 1e3;
        Ok(run.times)
    });
    let _ = gpu.stream.synchronize();
    r
}

/// The GRNND kernels of the device's module.
struct Kernels {
    update: CudaFunction,
    reverse: CudaFunction,
    init_random: CudaFunction,
    init_knn: CudaFunction,
    finish: CudaFunction,
    to_half: CudaFunction,
}

impl Kernels {
    fn load(gpu: &Gpu, cfg: &LaunchConfig) -> Result<Kernels, GpuError> {
        let m = &gpu.grnnd;
        let k = Kernels {
            update: function(m, "grnnd_update")?,
            reverse: function(m, "grnnd_reverse")?,
            init_random: function(m, "grnnd_init_random")?,
            init_knn: function(m, "grnnd_init_knn")?,
            finish: function(m, "grnnd_finish")?,
            to_half: function(m, "grnnd_to_half")?,
        };
        if cfg.shared_mem_bytes > 48 * 1024 {
            for f in [&k.update, &k.reverse, &k.init_random, &k.finish] {
                f.set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    cfg.shared_mem_bytes as i32,
                )
                .map_err(|e| cuda("GRNND shared memory", e))?;
            }
        }
        Ok(k)
    }
}

impl KnnInit {
    /// The option as the start of a CFS graph's RNN-Descent (nsg, vamana,
    /// cagra, tsdg): `auto` is random lists, the CPU's start, so that GPU
    /// and CPU builds refine the same graph (recall@10 within 0.003 at ef
    /// 10-80 on 1M SIFT, tests/gpu/build.sh). From GNN-Descent's start the
    /// CFS graphs searched worse from the entry point on 1M SIFT (Vamana
    /// 0.879 / 0.954 against 0.934 / 0.974 at ef 10 / 20, two builds each)
    /// and the start costs 1.4 s; docs/benchmarks.md.
    pub fn for_cfs(self) -> KnnInit {
        match self {
            KnnInit::Auto => KnnInit::Random,
            other => other,
        }
    }

    /// The start of a build of `n` rows.
    pub fn start(self, n: usize) -> Start {
        match self {
            KnnInit::Exact => Start::Exact,
            KnnInit::Random => Start::Random,
            KnnInit::Descent => Start::Descent,
            KnnInit::Auto if n <= EXACT_KNN_AUTO_MAX_ROWS => Start::Exact,
            // GNN-Descent's lists hold 30-bit ids
            KnnInit::Auto if n > abi::GNND_ID_MASK as usize => Start::Random,
            KnnInit::Auto => Start::Descent,
        }
    }
}

/// Device memory a build of `n` rows of `dim` floats takes at its peak: the
/// vectors (and half again for the copy made while they are laid out), the
/// two candidate pools and their counters, the final lists, and the k-NN
/// start's buffers when it has one. CREATE INDEX weighs it against
/// gpu_graph.build_gpu_memory to decide whether to build in shards.
pub fn device_bytes(n: usize, dim: usize, params: &BuildParams, start: Start) -> usize {
    let (degree, r) = (params.degree, params.r.max(params.degree));
    let vectors = n * dim.div_ceil(4) * 4 * 4;
    let mut need = vectors * 3 / 2 + 2 * n * r * 8 + 2 * n * 4 + n * degree * 4 + 64;
    if n > 1 {
        let (dk, k) = (knn::dk_for(dim), Run::k_init(params, n, r));
        need += match start {
            Start::Random => 0,
            Start::Exact => knn::device_bytes(n, dk, k),
            Start::Descent => knn_descent::device_bytes(n, dk, k),
        };
    }
    need
}

/// One build on the device: the double-buffered pools, their counters, and
/// what the rounds read.
struct Run<'a> {
    gpu: &'a Gpu,
    st: &'a Arc<CudaStream>,
    k: Kernels,
    cfg: LaunchConfig,
    /// the vectors' largest magnitude (the k-NN starts' fp16 scale)
    maxabs: f32,
    params: &'a BuildParams,
    opts: &'a GpuOptions,
    control: &'a dyn Control,
    start: Start,
    n: usize,
    r: usize,
    dv: Option<DeviceVectors>,
    /// the fp16 copy, when exact
    half: Option<CudaSlice<u16>>,
    pool_a: CudaSlice<u64>,
    pool_b: CudaSlice<u64>,
    cnt_a: CudaSlice<u32>,
    cnt_b: CudaSlice<u32>,
    stats: CudaSlice<u64>,
    times: PhaseTimes,
}

impl<'a> Run<'a> {
    /// The build's device memory reserved, then the vectors uploaded by
    /// `upload`.
    fn upload(
        gpu: &Gpu,
        n: usize,
        dim: usize,
        params: &BuildParams,
        start: Start,
        upload: &mut dyn FnMut() -> Result<DeviceVectors, GpuError>,
    ) -> Result<DeviceVectors, GpuError> {
        DeviceVectors::plan(n, dim)?;
        gpu.reserve(device_bytes(n, dim, params, start), "the GPU graph build")?;
        let dv = upload()?;
        gpu.stream.synchronize().map_err(|e| cuda("uploading the vectors", e))?;
        Ok(dv)
    }

    /// A build over the uploaded `dv` (copied in since `started`).
    #[allow(clippy::too_many_arguments)]
    fn new(
        gpu: &'a Gpu,
        dv: DeviceVectors,
        maxabs: f32,
        started: Instant,
        params: &'a BuildParams,
        start: Start,
        opts: &'a GpuOptions,
        control: &'a dyn Control,
    ) -> Result<Run<'a>, GpuError> {
        let n = dv.n;
        let r = params.r.max(params.degree);
        let cfg = warp_grid(n, r);
        let k = Kernels::load(gpu, &cfg)?;
        let st = &gpu.stream;
        let times = PhaseTimes { upload_ms: started.elapsed().as_secs_f64() * 1e3, start, ..Default::default() };
        if control.stop() {
            return Err(GpuError::Cancelled);
        }
        Ok(Run {
            gpu,
            st,
            k,
            cfg,
            maxabs,
            params,
            opts,
            control,
            start,
            n,
            r,
            dv: Some(dv),
            half: None,
            pool_a: zeroed(st, n * r, "the pools")?,
            pool_b: zeroed(st, n * r, "the pools")?,
            cnt_a: zeroed(st, n, "the pool counters")?,
            cnt_b: zeroed(st, n, "the pool counters")?,
            stats: zeroed(st, abi::STAT_COUNT as usize, "statistics")?,
            times,
        })
    }

    /// A k-NN start: the S nearest (at most KNN_MAX_K) plus S random
    /// neighbours. Measured (SIFT): the exact neighbours alone trap
    /// RNN-Descent in a sparse graph (mean degree ~8, recall@10 at ef 10
    /// ~0.69 where a random start gives ~0.85); with S random edges beside
    /// them it beats the random start.
    fn k_init(params: &BuildParams, n: usize, r: usize) -> usize {
        params.s.max(1).min(abi::KNN_MAX_K as usize).min(n - 1).min(r)
    }

    fn dv(&self) -> &DeviceVectors {
        self.dv.as_ref().expect("the vectors stay until the final cut")
    }

    /// Device address of the vectors the rounds read (the fp16 copy if any).
    fn xptr(&self) -> u64 {
        match &self.half {
            Some(h) => h.device_ptr(self.st).0,
            None => self.dv().x.device_ptr(self.st).0,
        }
    }

    fn sync(&self, what: &str) -> Result<(), GpuError> {
        self.st.synchronize().map_err(|e| cuda(what, e))?;
        if self.control.stop() {
            return Err(GpuError::Cancelled);
        }
        Ok(())
    }

    /// The initial graph: the k-NN lists (when asked), the fp16 copy
    /// (after the k-NN, which re-ranks in fp32), then the random start.
    fn start(&mut self) -> Result<(), GpuError> {
        let t = Instant::now();
        let (n32, r32) = (self.n as u32, self.r as u32);
        let mut keep32 = 0u32;
        if self.start.knn() {
            let k = Self::k_init(self.params, self.n, self.r);
            let (ki, kd) = if self.start == Start::Exact {
                knn::knn_device(self.gpu, self.dv(), self.maxabs, k, self.control)?
            } else {
                let p = DescentParams { seed: self.params.seed, ..DescentParams::default() };
                let mut entered = Vec::new();
                let r =
                    knn_descent::descent_device(self.gpu, self.dv(), self.maxabs, k, &p, self.control, &mut entered)?;
                self.times.descent_entered = entered;
                r
            };
            let k32 = k as u32;
            let c = LaunchConfig {
                grid_dim: ((self.n * self.r).div_ceil(256) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.st.launch_builder(&self.k.init_knn);
            b.arg(&ki).arg(&kd).arg(&n32).arg(&k32).arg(&mut self.pool_a).arg(&mut self.cnt_a).arg(&r32);
            // SAFETY: the arguments match grnnd_init_knn; the grid covers n * R threads.
            unsafe { b.launch(c) }.map_err(|e| cuda("grnnd_init_knn", e))?;
            keep32 = k32;
        }
        if self.opts.half_when_exact {
            self.half = self.exact_half()?;
        }
        self.times.half = self.half.is_some();
        let (xptr, half32, dp32) = (self.xptr(), self.half.is_some() as u32, self.dv().dp as u32);
        let (g32, s32, seed) =
            (lanes_for(self.dv().dp, self.opts.lanes_per_distance), self.params.s.max(1) as u32, self.params.seed);
        let mut b = self.st.launch_builder(&self.k.init_random);
        b.arg(&xptr).arg(&half32).arg(&n32).arg(&dp32).arg(&g32).arg(&mut self.pool_a).arg(&mut self.cnt_a);
        b.arg(&r32).arg(&s32).arg(&seed).arg(&keep32);
        // SAFETY: the arguments match grnnd_init_random; one warp per vertex.
        unsafe { b.launch(self.cfg) }.map_err(|e| cuda("grnnd_init_random", e))?;
        self.sync("the start")?;
        self.times.knn_ms = t.elapsed().as_secs_f64() * 1e3;
        Ok(())
    }

    /// The vectors in fp16 when every value converts exactly (None else).
    fn exact_half(&self) -> Result<Option<CudaSlice<u16>>, GpuError> {
        let dv = self.dv();
        let mut h: CudaSlice<u16> = zeroed(self.st, dv.n * dv.dp, "the fp16 vectors")?;
        let mut lossy: CudaSlice<u32> = zeroed(self.st, 1, "a flag")?;
        let count = (dv.n * dv.dp) as u64;
        let c = LaunchConfig { grid_dim: (2048, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.st.launch_builder(&self.k.to_half);
        b.arg(&dv.x).arg(&count).arg(&mut h).arg(&mut lossy);
        // SAFETY: the arguments match grnnd_to_half (a grid-stride loop).
        unsafe { b.launch(c) }.map_err(|e| cuda("grnnd_to_half", e))?;
        let lossy = self.st.clone_dtoh(&lossy).map_err(|e| cuda("grnnd_to_half", e))?[0];
        Ok((lossy == 0).then_some(h))
    }

    /// GRNND's rounds: t1 outer rounds of t2 updates, reverse edges between.
    fn refine(&mut self) -> Result<(), GpuError> {
        let t = Instant::now();
        let mode = if self.opts.order == ScanOrder::Ascending { abi::MODE_ASCENDING } else { 0 };
        let mut round = 0u32;
        for outer in 0..self.params.t1 {
            for _ in 0..self.params.t2 {
                let inserted = self.update(round, mode)?;
                round += 1;
                self.control.round(round as usize, self.params.t1 * self.params.t2);
                if self.control.stop() {
                    return Err(GpuError::Cancelled);
                }
                if self.opts.early_stop > 0.0 && (inserted as f64) < self.opts.early_stop * self.n as f64 {
                    break;
                }
            }
            if outer + 1 < self.params.t1 {
                self.reverse()?;
            }
        }
        self.times.rounds = round as usize;
        self.st.synchronize().map_err(|e| cuda("the refinement", e))?;
        self.times.refine_ms = t.elapsed().as_secs_f64() * 1e3;
        Ok(())
    }

    /// One update round into the other buffer; the entries it inserted.
    fn update(&mut self, round: u32, mode: u32) -> Result<u64, GpuError> {
        let tr = Instant::now();
        let st = self.st;
        let empty = |e| cuda("clearing a pool buffer", e);
        st.memset_zeros(&mut self.cnt_b).map_err(empty)?;
        st.memset_zeros(&mut self.stats).map_err(empty)?;
        {
            let (p, _g) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut self.pool_b, st);
            // SAFETY: all of pool_b, on the build's stream (EMPTY = all ones).
            unsafe { cudarc::driver::result::memset_d8_async(p, 0xFF, self.n * self.r * 8, st.cu_stream()) }
                .map_err(empty)?;
        }
        let (xptr, half32, n32, dp32, r32) =
            (self.xptr(), self.half.is_some() as u32, self.n as u32, self.dv().dp as u32, self.r as u32);
        let g32 = lanes_for(self.dv().dp, self.opts.lanes_per_distance);
        let seed = self.params.seed;
        let mut b = st.launch_builder(&self.k.update);
        b.arg(&xptr).arg(&half32).arg(&n32).arg(&dp32).arg(&g32).arg(&self.pool_a).arg(&mut self.pool_b);
        b.arg(&mut self.cnt_b).arg(&r32).arg(&seed).arg(&round).arg(&mode).arg(&mut self.stats);
        // SAFETY: the arguments match grnnd_update; one warp per vertex.
        unsafe { b.launch(self.cfg) }.map_err(|e| cuda("grnnd_update", e))?;
        std::mem::swap(&mut self.pool_a, &mut self.pool_b);
        std::mem::swap(&mut self.cnt_a, &mut self.cnt_b);
        let sv = st.clone_dtoh(&self.stats).map_err(|e| cuda("grnnd_update", e))?;
        let inserted = sv[abi::STAT_INSERTED as usize];
        self.times.inserts_per_round.push(inserted);
        self.times.distances_per_round.push(sv[abi::STAT_DISTANCES as usize]);
        if self.opts.verbose {
            eprintln!(
                "  round {}: {:.2} ms, {} distances, {} redirects, {inserted} entered",
                round + 1,
                tr.elapsed().as_secs_f64() * 1e3,
                sv[abi::STAT_DISTANCES as usize],
                sv[abi::STAT_REDIRECTS as usize]
            );
        }
        Ok(inserted)
    }

    /// Reverse edges: the other buffer starts as a copy of the snapshot,
    /// which the kernel reads.
    fn reverse(&mut self) -> Result<(), GpuError> {
        let st = self.st;
        st.memcpy_dtod(&self.pool_a, &mut self.pool_b).map_err(|e| cuda("copying the pools", e))?;
        st.memcpy_dtod(&self.cnt_a, &mut self.cnt_b).map_err(|e| cuda("copying the counters", e))?;
        let (n32, r32, rho) = (self.n as u32, self.r as u32, self.params.rho);
        let mut b = st.launch_builder(&self.k.reverse);
        b.arg(&self.pool_a).arg(&mut self.pool_b).arg(&mut self.cnt_b).arg(&n32).arg(&r32).arg(&rho);
        // SAFETY: the arguments match grnnd_reverse; one warp per vertex.
        unsafe { b.launch(self.cfg) }.map_err(|e| cuda("grnnd_reverse", e))?;
        std::mem::swap(&mut self.pool_a, &mut self.pool_b);
        std::mem::swap(&mut self.cnt_a, &mut self.cnt_b);
        self.sync("grnnd_reverse")
    }

    /// The final cut on the device: n x degree ids, left there.
    fn final_cut(&mut self) -> Result<CudaSlice<u32>, GpuError> {
        let (st, degree) = (self.st, self.params.degree);
        // the rounds' buffers go before the adjacency is allocated
        self.half = None;
        self.dv = None;
        let t = Instant::now();
        let mut adj: CudaSlice<u32> = zeroed(st, self.n * degree, "the adjacency")?;
        let (n32, r32, deg32) = (self.n as u32, self.r as u32, degree as u32);
        let mut b = st.launch_builder(&self.k.finish);
        b.arg(&self.pool_a).arg(&n32).arg(&r32).arg(&deg32).arg(&mut adj);
        // SAFETY: the arguments match grnnd_finish; one warp per vertex.
        unsafe { b.launch(self.cfg) }.map_err(|e| cuda("grnnd_finish", e))?;
        st.synchronize().map_err(|e| cuda("the final cut", e))?;
        self.times.final_cut_ms = t.elapsed().as_secs_f64() * 1e3;
        Ok(adj)
    }

    /// With `verify_cut`: the engine's cut of the downloaded pools compared
    /// with the device's, list for list.
    fn verify_cut(&mut self, adjacency: &[u32]) -> Result<(), GpuError> {
        if self.opts.verify_cut {
            let degree = self.params.degree;
            let pools: Vec<u64> = self.st.clone_dtoh(&self.pool_a).map_err(|e| cuda("downloading the pools", e))?;
            let engine = engine_cut(&pools, self.r, degree);
            let differ = engine.chunks(degree).zip(adjacency.chunks(degree)).filter(|(a, b)| a != b).count();
            self.times.cut_mismatches = Some(differ);
        }
        Ok(())
    }
}

/// The engine's final cut of downloaded pools (abi.h's slot layout).
fn engine_cut(pools: &[u64], r: usize, degree: usize) -> Vec<u32> {
    let mut adjacency = vec![NO_NODE; pools.len() / r * degree];
    adjacency.par_chunks_mut(degree).enumerate().for_each_init(Vec::new, |scratch, (v, out)| {
        let slots = pools[v * r..(v + 1) * r].iter().filter(|&&s| s != abi::POOL_EMPTY);
        let cands = slots.map(|&s| (f32::from_bits((s >> 32) as u32), (s as u32) & abi::POOL_ID_MASK));
        final_cut(v as u32, cands, scratch, out);
    });
    adjacency
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(d: f32, id: u32, new: bool) -> u64 {
        ((d.to_bits() as u64) << 32) | id as u64 | if new { abi::POOL_NEW_BIT as u64 } else { 0 }
    }

    #[test]
    fn engine_cut_reads_the_pool_layout() {
        // node 0: ids 5 (twice, the nearer copy first), 3, itself, EMPTY
        let e = abi::POOL_EMPTY;
        let pools = vec![slot(2.0, 5, true), slot(1.0, 3, false), slot(0.5, 5, false), slot(0.0, 0, false), e];
        let pools = [pools, vec![slot(4.0, 0, true), e, e, e, e]].concat();
        assert_eq!(engine_cut(&pools, 5, 3), vec![5, 3, NO_NODE, 0, NO_NODE, NO_NODE]);
        assert_eq!(engine_cut(&pools, 5, 1), vec![5, 0]);
    }

    #[test]
    fn auto_starts_exact_up_to_100k_rows_then_from_gnn_descent() {
        assert_eq!(KnnInit::Auto.start(EXACT_KNN_AUTO_MAX_ROWS), Start::Exact);
        assert_eq!(KnnInit::Auto.start(EXACT_KNN_AUTO_MAX_ROWS + 1), Start::Descent);
        assert_eq!(KnnInit::Auto.start(1 << 30), Start::Random);
        assert_eq!(KnnInit::Random.start(10), Start::Random);
        assert_eq!(KnnInit::Exact.start(10_000_000), Start::Exact);
        assert_eq!(KnnInit::Descent.start(10), Start::Descent);
    }

    #[test]
    fn a_k_nn_start_is_counted_in_the_device_memory() {
        // what CREATE INDEX weighs against gpu_graph.build_gpu_memory
        let p = BuildParams::default();
        let (n, dim) = (1_000_000, 128);
        let random = device_bytes(n, dim, &p, Start::Random);
        let descent = device_bytes(n, dim, &p, Start::Descent);
        let k = Run::k_init(&p, n, p.r.max(p.degree));
        assert_eq!(descent - random, knn_descent::device_bytes(n, knn::dk_for(dim), k));
        assert_eq!(device_bytes(n, dim, &p, Start::Exact) - random, knn::device_bytes(n, knn::dk_for(dim), k));
        // 1M SIFT: the build measured needing 2,952 MiB with the descent
        assert_eq!(descent >> 20, 2952);
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
