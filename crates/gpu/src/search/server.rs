//! The host side of the persistent search kernel: start, residency,
//! submission, polling, shutdown. See the module documentation
//! (crates/gpu/src/search/mod.rs) for the protocol and the decisions.

use std::cell::Cell;
use std::ffi::c_void;
use std::fmt;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUdeviceptr, CUresult, CUstream};
use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::Ptx;
use gpu_graph_engine::metric::Metric;
use rayon::prelude::*;

use super::merge::merge_lists;
use super::plan::*;
use crate::device::Gpu;
use crate::error::{cuda, guard, GpuError};
use crate::nvrtc::{self, KernelSource, Target};

/// kernels/search_persistent.cu, embedded like the other kernels.
pub const SEARCH_KERNEL: KernelSource =
    KernelSource { name: "search_persistent.cu", src: include_str!("../../../../kernels/search_persistent.cu") };

/// Why a query could not be served. The worker falls back to the CPU on
/// every one of them.
#[derive(Clone, Debug, PartialEq)]
pub enum SearchError {
    /// Every query slot is in use.
    Busy,
    /// `wait` ran out of time; the ticket is still pending (wait again, or
    /// drop it: its slot comes back when the GPU finishes).
    Timeout,
    /// A bad argument: unknown or unloaded index, wrong query length, k or
    /// ef beyond what the server was sized for, a ticket already answered.
    Invalid(String),
    /// The server was shut down.
    Closed,
    /// The CUDA context failed (a fault inside the kernel, a lost device):
    /// every later call fails the same way. A fault inside a kernel
    /// (illegal address, trap) is sticky for the whole process: CUDA
    /// answers every later call in it with the same error, whatever context
    /// is created next ("the process must be terminated and relaunched",
    /// CUDA's documentation of CUDA_ERROR_ILLEGAL_ADDRESS). So the worker
    /// drops its tickets, the server and the [`Gpu`] (none of which hangs
    /// or panics) and exits; a new process starts a new server.
    /// [`SearchServer::context_broken`] says whether a CUDA error (rather
    /// than the kernel quitting by itself) caused it.
    Poisoned(String),
    /// Any other GPU failure.
    Gpu(GpuError),
}

impl fmt::Display for SearchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SearchError::Busy => write!(f, "every GPU query slot is busy"),
            SearchError::Timeout => write!(f, "the GPU did not answer in time"),
            SearchError::Invalid(s) => write!(f, "invalid GPU search request: {s}"),
            SearchError::Closed => write!(f, "the GPU search server is shut down"),
            SearchError::Poisoned(s) => write!(f, "the GPU context failed: {s}"),
            SearchError::Gpu(e) => write!(f, "{e}"),
        }
    }
}
impl std::error::Error for SearchError {}

impl From<GpuError> for SearchError {
    fn from(e: GpuError) -> Self {
        SearchError::Gpu(e)
    }
}
impl From<SearchError> for GpuError {
    fn from(e: SearchError) -> Self {
        match e {
            SearchError::Gpu(g) => g,
            SearchError::Invalid(s) => GpuError::Unsupported(s),
            other => GpuError::Cuda(other.to_string()),
        }
    }
}

/// An index to upload: the stored vectors (already prepared by
/// `Metric::prepare_stored`), the graph, and per-node flags.
#[derive(Clone, Copy, Debug)]
pub struct IndexImage<'a> {
    /// n rows of `stored_dim` values.
    pub vectors: &'a [f32],
    pub stored_dim: usize,
    /// n rows of `degree` ids, NO_NODE padded.
    pub adjacency: &'a [u32],
    pub degree: usize,
    pub entry: u32,
    /// Per node, bit 0 ([`FLAG_DELETED`]) = deleted: traversed, never a
    /// result. None = nothing deleted.
    pub flags: Option<&'a [u8]>,
    /// L2 and cosine rank by squared L2 over the stored vectors, inner
    /// product by -dot over the first stored_dim - 1 coordinates.
    pub metric: Metric,
}

/// A resident index, named by every query against it. Stale after unload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ResidentId {
    table: u32,
    gen: u32,
}

/// What a resident index occupies.
#[derive(Clone, Copy, Debug)]
pub struct ResidentInfo {
    pub n: usize,
    pub stored_dim: usize,
    pub degree: usize,
    /// vectors kept as fp16 (exact)
    pub half: bool,
    /// device bytes (vectors, adjacency, flags)
    pub bytes: usize,
}

/// How the server was sized (from [`ServerConfig`] and the device).
#[derive(Clone, Debug)]
pub struct ServerInfo {
    pub slots: usize,
    pub ctas_per_slot: usize,
    pub groups: usize,
    pub sm_count: u32,
    /// resident blocks per SM of the kernel at its shared memory size
    pub blocks_per_sm: u32,
    pub shared_bytes: usize,
    pub visited_log2: u32,
    pub list_cap: usize,
    pub k_max: usize,
    pub max_dim: usize,
    /// slot words written by cuStreamWriteValue32 (false: a 4-byte async
    /// copy on the same stream, where the device lacks stream memory ops)
    pub stream_mem_ops: bool,
    /// device bytes of the server itself (slots, visited tables)
    pub device_bytes: usize,
    /// pinned host bytes
    pub pinned_bytes: usize,
    pub compile_ms: f64,
}

/// One answered query with the kernel's work counters.
#[derive(Clone, Debug)]
pub struct Answer {
    /// (search distance, node), ascending, distinct, no deleted node
    pub hits: Vec<(f32, u32)>,
    /// nodes expanded, all CTAs
    pub expanded: u32,
    /// distances computed, all CTAs
    pub computed: u32,
    /// CTAs stopped by the iteration cap
    pub capped: u32,
}

/// A submitted query. Dropping it unanswered abandons it: its slot returns
/// to the pool once the GPU finishes. It does not keep the server (or the
/// CUDA context) alive.
pub struct Ticket {
    inner: Weak<Inner>,
    slot: u32,
    cmd: u32,
    done: bool,
}

impl Ticket {
    pub fn slot(&self) -> usize {
        self.slot as usize
    }
    pub fn is_answered(&self) -> bool {
        self.done
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            if let Some(inner) = self.inner.upgrade() {
                inner.abandon(self.slot, self.cmd);
            }
        }
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ticket(slot {}, cmd {:#x})", self.slot, self.cmd)
    }
}

/// The persistent search kernel and its host side. Every method takes
/// `&self` and is thread-safe: any number of threads may submit and wait.
pub struct SearchServer {
    inner: Arc<Inner>,
}

struct Resident {
    table: u32,
    gen: u32,
    n: usize,
    dim: usize,
    degree: usize,
    ip: bool,
    fmt: RowFormat,
    d_vectors: CUdeviceptr,
    d_adjacency: CUdeviceptr,
    d_flags: CUdeviceptr,
    async_alloc: bool,
    bytes: usize,
    flags: Vec<AtomicU8>,
}

enum Entry {
    Free,
    /// being loaded or unloaded: not usable, not reusable
    Busy,
    Ready(Arc<Resident>),
}

#[derive(Default)]
struct SlotState {
    /// sequence number of the last query (27 bits)
    seq: u32,
    /// the cmd word of the last query
    cmd: u32,
    busy: bool,
    abandoned: bool,
    resident: Option<Arc<Resident>>,
    ctas: u32,
    k: u32,
    max_expand: u32,
}

struct Group {
    stream: CUstream,
    free: Mutex<Vec<u32>>,
}

struct Inner {
    // keeps the context alive as long as the server
    _ctx: Arc<CudaContext>,
    cu_ctx: sys::CUcontext,
    module: Mutex<Option<Arc<CudaModule>>>,
    /// poisoned by a CUDA error (a sticky one: the context is unusable)
    sticky: AtomicBool,
    info: ServerInfo,
    policy: SearchPolicy,
    allow_fault: bool,
    half_when_exact: bool,
    async_alloc: bool,
    kernel_stream: CUstream,
    mgmt: Mutex<CUstream>,
    groups: Vec<Group>,
    slots: Vec<Mutex<SlotState>>,
    slot_group: Vec<u16>,
    // device memory
    d_cmd: CUdeviceptr,
    d_done: CUdeviceptr,
    d_reqs: CUdeviceptr,
    d_visited: CUdeviceptr,
    d_indexes: CUdeviceptr,
    // pinned host memory
    h_reqs: *mut u8,
    h_results: *mut u8,
    h_finish: *mut u32,
    h_zero: *mut u8,
    h_words: *mut u32,
    req_stride: usize,
    result_stride: usize,
    cta_block: usize,
    max_qwords: usize,
    registry: RwLock<Vec<Entry>>,
    next_gen: AtomicU32,
    closed: AtomicBool,
    poisoned: AtomicBool,
    poison_msg: Mutex<Option<String>>,
    device_freed: AtomicBool,
    t0: Instant,
    last_health_us: AtomicU64,
}

// Raw CUDA handles and pinned pointers: every use is synchronised by the
// slot ownership protocol, the mutexes or the driver itself.
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

const FINISH_STRIDE_WORDS: usize = 16;
const HEALTH_EVERY_US: u64 = 1000;

fn ck(what: &str, r: CUresult) -> Result<(), GpuError> {
    r.result().map_err(|e| cuda(what, e))
}

fn err_name(r: CUresult) -> String {
    let mut p: *const std::ffi::c_char = std::ptr::null();
    unsafe { sys::cuGetErrorName(r, &mut p) };
    if p.is_null() {
        format!("{r:?}")
    } else {
        unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn bind_ctx(c: sys::CUcontext) -> Result<(), GpuError> {
    let mut cur: sys::CUcontext = null_mut();
    unsafe { sys::cuCtxGetCurrent(&mut cur) };
    if cur != c {
        ck("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(c) })?;
    }
    Ok(())
}

fn new_stream() -> Result<CUstream, GpuError> {
    let mut s: CUstream = null_mut();
    ck("cuStreamCreate", unsafe { sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) })?;
    Ok(s)
}

fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

thread_local! {
    static PREFERRED_GROUP: Cell<usize> = const { Cell::new(usize::MAX) };
}
static NEXT_GROUP: AtomicUsize = AtomicUsize::new(0);

/// Pieces allocated by `start`, freed together on failure.
#[derive(Default)]
struct Allocs {
    dev: Vec<CUdeviceptr>,
    host: Vec<*mut c_void>,
    streams: Vec<CUstream>,
}
impl Allocs {
    fn release(&mut self) {
        unsafe {
            for s in self.streams.drain(..) {
                sys::cuStreamDestroy_v2(s);
            }
            for d in self.dev.drain(..) {
                sys::cuMemFree_v2(d);
            }
            for h in self.host.drain(..) {
                sys::cuMemFreeHost(h);
            }
        }
    }
    fn dev(&mut self, bytes: usize, what: &str) -> Result<CUdeviceptr, GpuError> {
        let mut d: CUdeviceptr = 0;
        ck(&format!("allocating {what}"), unsafe { sys::cuMemAlloc_v2(&mut d, bytes.max(4)) })?;
        self.dev.push(d);
        ck(&format!("clearing {what}"), unsafe { sys::cuMemsetD8_v2(d, 0, bytes.max(4)) })?;
        Ok(d)
    }
    fn host(&mut self, bytes: usize, mapped: bool, what: &str) -> Result<*mut u8, GpuError> {
        let mut p: *mut c_void = null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | if mapped { sys::CU_MEMHOSTALLOC_DEVICEMAP } else { 0 };
        ck(&format!("pinning {what}"), unsafe { sys::cuMemHostAlloc(&mut p, bytes.max(4), flags) })?;
        self.host.push(p);
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, bytes.max(4)) };
        Ok(p as *mut u8)
    }
}

fn device_ptr_of(h: *mut u8, what: &str) -> Result<CUdeviceptr, GpuError> {
    let mut d: CUdeviceptr = 0;
    ck(&format!("mapping {what}"), unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, h as *mut c_void, 0) })?;
    Ok(d)
}

impl SearchServer {
    /// Compiles (once per process) and launches the persistent kernel.
    ///
    /// Launch this before anything else runs in the context, and launch no
    /// kernel that was never launched before while it runs: with CUDA's
    /// lazy module loading (the default) a first launch may wait for the
    /// context to go idle, which this kernel never does. (Kernels launched
    /// once before `start`, or CUDA_MODULE_LOADING=EAGER, are safe.)
    pub fn start(gpu: &Gpu, cfg: ServerConfig) -> Result<SearchServer, GpuError> {
        guard("starting the GPU search server", || Self::start_inner(gpu, cfg))
    }

    fn start_inner(gpu: &Gpu, cfg: ServerConfig) -> Result<SearchServer, GpuError> {
        let ctx = gpu.ctx.clone();
        let cu_ctx = ctx.cu_ctx();
        bind_ctx(cu_ctx)?;
        let t = Instant::now();
        let target = gpu.info.target.clone();
        let c = nvrtc::compiled(&SEARCH_KERNEL, &target, &[])?;
        let ptx = match target {
            Target::Cubin(_) => Ptx::from_binary(c.image.clone()),
            Target::Ptx(_) => Ptx::from_src(String::from_utf8_lossy(&c.image).trim_end_matches('\0').to_string()),
        };
        let module = ctx.load_module(ptx).map_err(|e| cuda("loading search_persistent.cu", e))?;
        let func = module.load_function("search_persistent").map_err(|e| cuda("kernel search_persistent", e))?;
        let f = func.cu_function();
        let compile_ms = t.elapsed().as_secs_f64() * 1e3;

        // sizes
        let ctas = if cfg.ctas_per_slot == 0 { DEFAULT_CTAS_PER_SLOT } else { cfg.ctas_per_slot };
        if !(1..=32).contains(&ctas) {
            return Err(GpuError::Unsupported(format!("{ctas} CTAs per slot (1 to 32)")));
        }
        let max_qwords = round_up(cfg.max_dim.max(1), 8);
        let list_cap = cfg.max_list.max(1);
        let k_max = round_up(cfg.max_k.max(1), 2);
        let smem = shared_bytes(max_qwords, list_cap);
        if smem > 48 * 1024 {
            ck("raising the kernel's shared memory", unsafe {
                sys::cuFuncSetAttribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
            })?;
        }
        let mut per_sm: i32 = 0;
        ck("occupancy", unsafe { sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut per_sm, f, 32, smem) })?;
        let sm = gpu.info.sm_count;
        let resident = per_sm.max(0) as usize * sm as usize;
        let slots = if cfg.slots == 0 { (resident / ctas).min(256) } else { cfg.slots };
        if slots == 0 || slots * ctas > resident {
            return Err(GpuError::Unsupported(format!(
                "{slots} slots x {ctas} CTAs do not fit resident at once: {per_sm} blocks per SM x {sm} SMs \
                 ({smem} bytes of shared memory each)"
            )));
        }
        let groups = if cfg.groups == 0 { slots.min(8) } else { cfg.groups.min(slots) }.max(1);
        let visited_log2 = if cfg.visited_log2 == 0 {
            ((list_cap * ctas * 16).next_power_of_two().trailing_zeros()).clamp(12, 17)
        } else {
            cfg.visited_log2.clamp(8, 24)
        };
        let req_stride = round_up(REQ_HEAD_BYTES + 4 * max_qwords, 128);
        let cta_block = OUT_HEAD_BYTES + 8 * k_max;
        let result_stride = round_up(ctas * cta_block, 128);
        let visited_bytes = slots << visited_log2 << 3;
        let max_indexes = cfg.max_indexes.max(1);
        let device_bytes = slots * (8 + req_stride) + visited_bytes + max_indexes * DESC_BYTES;
        gpu.reserve(device_bytes, "the GPU search server")?;

        let mut a = Allocs::default();
        let r = (|| -> Result<Inner, GpuError> {
            let d_cmd = a.dev(slots * 4, "the slot words")?;
            let d_done = a.dev(slots * 4, "the slot counters")?;
            let d_reqs = a.dev(slots * req_stride, "the request buffers")?;
            let d_visited = a.dev(visited_bytes, "the visited tables")?;
            let d_indexes = a.dev(max_indexes * DESC_BYTES, "the index table")?;
            let h_reqs = a.host(slots * req_stride, false, "the request staging")?;
            let h_results = a.host(slots * result_stride, true, "the result blocks")?;
            let h_finish = a.host(slots * FINISH_STRIDE_WORDS * 4, true, "the finish words")? as *mut u32;
            let h_zero = a.host(8 << visited_log2, false, "a zero block")?;
            let h_words = a.host(slots * 4, false, "the slot word staging")? as *mut u32;
            let d_results = device_ptr_of(h_results, "the result blocks")?;
            let d_finish = device_ptr_of(h_finish as *mut u8, "the finish words")?;
            let kernel_stream = new_stream()?;
            a.streams.push(kernel_stream);
            let mgmt = new_stream()?;
            a.streams.push(mgmt);
            let mut gs = Vec::with_capacity(groups);
            let mut slot_group = vec![0u16; slots];
            for g in 0..groups {
                let s = new_stream()?;
                a.streams.push(s);
                // group g: slots [g * slots / groups, (g + 1) * slots / groups)
                let lo = g * slots / groups;
                let hi = (g + 1) * slots / groups;
                slot_group[lo..hi].fill(g as u16);
                gs.push(Group { stream: s, free: Mutex::new((lo as u32..hi as u32).rev().collect()) });
            }
            // stream memory operations: try one on a word nobody reads yet
            let stream_mem_ops = unsafe {
                sys::cuStreamWriteValue32_v2(mgmt, d_done, 0, 0).result().is_ok()
                    && sys::cuStreamSynchronize(mgmt).result().is_ok()
            };
            ck("synchronising", unsafe { sys::cuStreamSynchronize(mgmt) })?;
            let mut pools: i32 = 0;
            unsafe {
                sys::cuDeviceGetAttribute(
                    &mut pools,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
                    ctx.cu_device(),
                )
            };

            // launch
            let mut p_indexes = d_indexes;
            let mut p_nindexes = max_indexes as u32;
            let mut p_cmd = d_cmd;
            let mut p_reqs = d_reqs;
            let mut p_req_stride = req_stride as u32;
            let mut p_visited = d_visited;
            let mut p_vlog2 = visited_log2;
            let mut p_done = d_done;
            let mut p_results = d_results;
            let mut p_result_stride = result_stride as u32;
            let mut p_kmax = k_max as u32;
            let mut p_finish = d_finish;
            let mut p_finish_stride = FINISH_STRIDE_WORDS as u32;
            let mut p_ctas = ctas as u32;
            let mut p_list_cap = list_cap as u32;
            let mut p_max_qwords = max_qwords as u32;
            let mut p_sleep = cfg.max_sleep_ns.max(64);
            let mut params: [*mut c_void; 17] = [
                &mut p_indexes as *mut _ as *mut c_void,
                &mut p_nindexes as *mut _ as *mut c_void,
                &mut p_cmd as *mut _ as *mut c_void,
                &mut p_reqs as *mut _ as *mut c_void,
                &mut p_req_stride as *mut _ as *mut c_void,
                &mut p_visited as *mut _ as *mut c_void,
                &mut p_vlog2 as *mut _ as *mut c_void,
                &mut p_done as *mut _ as *mut c_void,
                &mut p_results as *mut _ as *mut c_void,
                &mut p_result_stride as *mut _ as *mut c_void,
                &mut p_kmax as *mut _ as *mut c_void,
                &mut p_finish as *mut _ as *mut c_void,
                &mut p_finish_stride as *mut _ as *mut c_void,
                &mut p_ctas as *mut _ as *mut c_void,
                &mut p_list_cap as *mut _ as *mut c_void,
                &mut p_max_qwords as *mut _ as *mut c_void,
                &mut p_sleep as *mut _ as *mut c_void,
            ];
            ck("launching search_persistent", unsafe {
                sys::cuLaunchKernel(
                    f,
                    (slots * ctas) as u32,
                    1,
                    1,
                    32,
                    1,
                    1,
                    smem as u32,
                    kernel_stream,
                    params.as_mut_ptr(),
                    null_mut(),
                )
            })?;
            let pinned_bytes = slots * (req_stride + result_stride + FINISH_STRIDE_WORDS * 4 + 4) + (8 << visited_log2);
            Ok(Inner {
                _ctx: ctx.clone(),
                cu_ctx,
                module: Mutex::new(Some(module.clone())),
                sticky: AtomicBool::new(false),
                info: ServerInfo {
                    slots,
                    ctas_per_slot: ctas,
                    groups,
                    sm_count: sm,
                    blocks_per_sm: per_sm as u32,
                    shared_bytes: smem,
                    visited_log2,
                    list_cap,
                    k_max,
                    max_dim: cfg.max_dim,
                    stream_mem_ops,
                    device_bytes,
                    pinned_bytes,
                    compile_ms,
                },
                policy: cfg.policy,
                allow_fault: cfg.allow_fault_injection,
                half_when_exact: cfg.half_when_exact,
                async_alloc: pools > 0,
                kernel_stream,
                mgmt: Mutex::new(mgmt),
                groups: gs,
                slots: (0..slots).map(|_| Mutex::new(SlotState::default())).collect(),
                slot_group,
                d_cmd,
                d_done,
                d_reqs,
                d_visited,
                d_indexes,
                h_reqs,
                h_results,
                h_finish,
                h_zero,
                h_words,
                req_stride,
                result_stride,
                cta_block,
                max_qwords,
                registry: RwLock::new((0..max_indexes).map(|_| Entry::Free).collect()),
                next_gen: AtomicU32::new(1),
                closed: AtomicBool::new(false),
                poisoned: AtomicBool::new(false),
                poison_msg: Mutex::new(None),
                device_freed: AtomicBool::new(false),
                t0: Instant::now(),
                last_health_us: AtomicU64::new(0),
            })
        })();
        match r {
            Ok(inner) => {
                // owned by Inner from here on
                a.dev.clear();
                a.host.clear();
                a.streams.clear();
                Ok(SearchServer { inner: Arc::new(inner) })
            }
            Err(e) => {
                a.release();
                Err(e)
            }
        }
    }

    pub fn info(&self) -> &ServerInfo {
        &self.inner.info
    }

    /// The plan `submit` uses for (k, ef).
    pub fn plan(&self, k: usize, ef: usize) -> QueryPlan {
        self.inner.policy.plan(k, ef, self.inner.info.ctas_per_slot)
    }

    /// Uploads an index; queries name it by the returned id. Several indexes
    /// can be resident at once. Safe while queries run.
    pub fn load(&self, image: &IndexImage) -> Result<ResidentId, GpuError> {
        self.inner.load(image)
    }

    /// Removes an index: new queries against it fail at once; waits (up to
    /// 10 s) for those in flight, then frees its device memory.
    pub fn unload(&self, id: ResidentId) -> Result<(), GpuError> {
        self.inner.unload(id)
    }

    /// Device bytes of a resident index (None when not resident).
    pub fn bytes(&self, id: ResidentId) -> Option<usize> {
        self.resident_info(id).map(|r| r.bytes)
    }

    pub fn resident_info(&self, id: ResidentId) -> Option<ResidentInfo> {
        self.inner.resident(id).ok().map(|r| ResidentInfo {
            n: r.n,
            stored_dim: r.dim,
            degree: r.degree,
            half: r.fmt.half,
            bytes: r.bytes,
        })
    }

    /// Sets a node's flags (bit 0 = deleted) after upload. Queries submitted
    /// after this returns never return a node marked deleted.
    pub fn update_flags(&self, id: ResidentId, node: u32, flags: u8) -> Result<(), GpuError> {
        self.inner.update_flags(id, node, flags)
    }

    /// Sets the flags of many nodes at once: the host copy node by node,
    /// then the whole flag array in one copy.
    pub fn update_flags_batch(&self, id: ResidentId, changes: &[(u32, u8)]) -> Result<(), GpuError> {
        self.inner.update_flags_batch(id, changes)
    }

    /// Submits a query (`query` already prepared like `Metric::prepare_query`,
    /// stored_dim values) for its k nearest with beam `ef`, planned by the
    /// server's [`SearchPolicy`]. Takes a free slot or fails with Busy.
    pub fn submit(&self, index: ResidentId, query: &[f32], k: usize, ef: usize) -> Result<Ticket, SearchError> {
        let plan = self.plan(k, ef);
        self.submit_plan(index, query, k, &plan)
    }

    /// Submits with an explicit plan (measurements).
    pub fn submit_plan(
        &self,
        index: ResidentId,
        query: &[f32],
        k: usize,
        plan: &QueryPlan,
    ) -> Result<Ticket, SearchError> {
        Inner::submit(&self.inner, None, index, query, k, plan)
    }

    /// Submits into one slot group (0..info().groups) only: for a worker that
    /// gives each host thread its own group of slots and stream.
    pub fn submit_in_group(
        &self,
        group: usize,
        index: ResidentId,
        query: &[f32],
        k: usize,
        ef: usize,
    ) -> Result<Ticket, SearchError> {
        let plan = self.plan(k, ef);
        Inner::submit(&self.inner, Some(group), index, query, k, &plan)
    }

    /// The answer if the GPU has finished, without blocking.
    pub fn poll(&self, ticket: &mut Ticket) -> Result<Option<Vec<(f32, u32)>>, SearchError> {
        Ok(self.poll_answer(ticket)?.map(|a| a.hits))
    }

    pub fn poll_answer(&self, ticket: &mut Ticket) -> Result<Option<Answer>, SearchError> {
        self.check_ticket(ticket)?;
        self.inner.poll(ticket)
    }

    /// Waits for the answer: (search distance, node) ascending, distinct,
    /// without deleted nodes. On Timeout the ticket stays pending.
    pub fn wait(&self, ticket: &mut Ticket, timeout: Duration) -> Result<Vec<(f32, u32)>, SearchError> {
        Ok(self.wait_answer(ticket, timeout)?.hits)
    }

    pub fn wait_answer(&self, ticket: &mut Ticket, timeout: Duration) -> Result<Answer, SearchError> {
        self.check_ticket(ticket)?;
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if let Some(a) = self.inner.poll(ticket)? {
                return Ok(a);
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                if start.elapsed() >= timeout {
                    return Err(SearchError::Timeout);
                }
                std::thread::yield_now();
            }
        }
    }

    fn check_ticket(&self, t: &Ticket) -> Result<(), SearchError> {
        if !std::ptr::eq(t.inner.as_ptr(), Arc::as_ptr(&self.inner)) {
            return Err(SearchError::Invalid("a ticket of another server".into()));
        }
        Ok(())
    }

    /// Frees abandoned slots whose query has finished (submit does this by
    /// itself when it finds no free slot).
    pub fn reclaim(&self) -> usize {
        self.inner.reclaim_abandoned()
    }

    /// Whether the context has failed; the reason.
    pub fn poisoned(&self) -> Option<String> {
        if self.inner.poisoned.load(Ordering::Acquire) {
            Some(self.inner.poison_text())
        } else {
            None
        }
    }

    /// Whether the server was poisoned by a CUDA error: the context, and
    /// with a kernel fault the whole process, cannot use CUDA any more.
    pub fn context_broken(&self) -> bool {
        self.inner.sticky.load(Ordering::Acquire)
    }

    /// Checks the kernel now (is it still running?).
    pub fn health(&self) -> Result<(), SearchError> {
        self.inner.last_health_us.store(0, Ordering::Relaxed);
        self.inner.health()
    }

    /// Test switch: makes the kernel do an illegal memory access, which
    /// poisons the CUDA context (only with
    /// `ServerConfig::allow_fault_injection`). Every later call fails with
    /// Poisoned; recovery is a new process (see [`SearchError::Poisoned`]).
    pub fn inject_fault(&self) -> Result<(), SearchError> {
        if !self.inner.allow_fault {
            return Err(SearchError::Invalid("fault injection is off (ServerConfig::allow_fault_injection)".into()));
        }
        self.inner.usable()?;
        let slot = self.inner.take_slot(None).ok_or(SearchError::Busy)?;
        {
            let mut st = self.inner.slots[slot as usize].lock().unwrap_or_else(|e| e.into_inner());
            st.busy = true;
        }
        self.inner.write_cmd(slot, CMD_FAULT)
    }

    /// Stops the kernel (Quit in every slot after the queries in flight
    /// finish, up to 2 s), waits for it to exit (up to 5 s) and frees the
    /// device memory. Idempotent; Drop calls it. After a fault it frees what
    /// it can and returns Ok.
    pub fn shutdown(&self) -> Result<(), GpuError> {
        self.inner.shutdown()
    }
}

impl Drop for SearchServer {
    fn drop(&mut self) {
        let _ = self.inner.shutdown();
    }
}

impl Inner {
    fn poison_text(&self) -> String {
        self.poison_msg.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_else(|| "unknown".into())
    }

    fn poison(&self, msg: String) -> SearchError {
        {
            let mut m = self.poison_msg.lock().unwrap_or_else(|e| e.into_inner());
            if m.is_none() {
                *m = Some(msg);
            }
        }
        self.sticky.store(true, Ordering::Release);
        self.poisoned.store(true, Ordering::Release);
        SearchError::Poisoned(self.poison_text())
    }

    /// Poisoned without a CUDA error (the kernel exited by itself): the
    /// context itself still works.
    fn poison_soft(&self, msg: String) -> SearchError {
        {
            let mut m = self.poison_msg.lock().unwrap_or_else(|e| e.into_inner());
            if m.is_none() {
                *m = Some(msg);
            }
        }
        self.poisoned.store(true, Ordering::Release);
        SearchError::Poisoned(self.poison_text())
    }

    fn usable(&self) -> Result<(), SearchError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(SearchError::Poisoned(self.poison_text()));
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(SearchError::Closed);
        }
        Ok(())
    }

    fn bind(&self) -> Result<(), SearchError> {
        bind_ctx(self.cu_ctx).map_err(|e| self.poison(e.to_string()))
    }

    /// Is the kernel still running? Asked at most every HEALTH_EVERY_US.
    fn health(&self) -> Result<(), SearchError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(SearchError::Poisoned(self.poison_text()));
        }
        let now = self.t0.elapsed().as_micros() as u64 + HEALTH_EVERY_US;
        let last = self.last_health_us.load(Ordering::Relaxed);
        if now < last + HEALTH_EVERY_US
            || self.last_health_us.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err()
        {
            return Ok(());
        }
        self.bind()?;
        let r = unsafe { sys::cuStreamQuery(self.kernel_stream) };
        match r {
            CUresult::CUDA_ERROR_NOT_READY => Ok(()),
            CUresult::CUDA_SUCCESS => {
                if self.closed.load(Ordering::Acquire) {
                    Err(SearchError::Closed)
                } else {
                    Err(self.poison_soft("the search kernel exited".into()))
                }
            }
            e => Err(self.poison(format!("the search kernel failed: {}", err_name(e)))),
        }
    }

    fn resident(&self, id: ResidentId) -> Result<Arc<Resident>, SearchError> {
        let reg = self.registry.read().unwrap_or_else(|e| e.into_inner());
        match reg.get(id.table as usize) {
            Some(Entry::Ready(r)) if r.gen == id.gen => Ok(r.clone()),
            _ => Err(SearchError::Invalid(format!("index {id:?} is not resident"))),
        }
    }

    fn take_slot(&self, group: Option<usize>) -> Option<u32> {
        let g_n = self.groups.len();
        let pop = |g: usize| self.groups[g].free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        if let Some(g) = group {
            return pop(g % g_n);
        }
        let pref = PREFERRED_GROUP.with(|p| {
            if p.get() == usize::MAX {
                p.set(NEXT_GROUP.fetch_add(1, Ordering::Relaxed));
            }
            p.get()
        });
        for i in 0..g_n {
            if let Some(s) = pop((pref + i) % g_n) {
                return Some(s);
            }
        }
        None
    }

    fn group_of(&self, slot: u32) -> usize {
        self.slot_group[slot as usize] as usize
    }

    fn release_slot(&self, slot: u32, st: &mut SlotState) {
        st.busy = false;
        st.abandoned = false;
        st.resident = None;
        let g = self.group_of(slot);
        self.groups[g].free.lock().unwrap_or_else(|e| e.into_inner()).push(slot);
    }

    fn finish_word(&self, slot: u32) -> u32 {
        // SAFETY: pinned, mapped, lives as long as Inner; the GPU writes it
        unsafe {
            (*(self.h_finish.add(slot as usize * FINISH_STRIDE_WORDS) as *const AtomicU32)).load(Ordering::Acquire)
        }
    }

    fn abandon(&self, slot: u32, cmd: u32) {
        let mut st = self.slots[slot as usize].lock().unwrap_or_else(|e| e.into_inner());
        if !st.busy || st.cmd != cmd {
            return;
        }
        if self.finish_word(slot) == cmd {
            self.release_slot(slot, &mut st);
        } else {
            st.abandoned = true;
        }
    }

    fn reclaim_abandoned(&self) -> usize {
        let mut freed = 0;
        for (i, s) in self.slots.iter().enumerate() {
            if let Ok(mut st) = s.try_lock() {
                if st.busy && st.abandoned && self.finish_word(i as u32) == st.cmd {
                    self.release_slot(i as u32, &mut st);
                    freed += 1;
                }
            }
        }
        freed
    }

    /// Writes a slot word on the slot's group stream: the device copy the
    /// kernel polls.
    fn write_cmd(&self, slot: u32, value: u32) -> Result<(), SearchError> {
        self.bind()?;
        let stream = self.groups[self.group_of(slot)].stream;
        let addr = self.d_cmd + 4 * slot as u64;
        let r = if self.info.stream_mem_ops {
            unsafe { sys::cuStreamWriteValue32_v2(stream, addr, value, 0) }
        } else {
            // fallback: a 4-byte copy from pinned memory, same stream, same order
            unsafe {
                let w = self.h_words.add(slot as usize);
                std::ptr::write_volatile(w, value);
                sys::cuMemcpyHtoDAsync_v2(addr, w as *const c_void, 4, stream)
            }
        };
        if r != CUresult::CUDA_SUCCESS {
            return Err(self.poison(format!("writing a slot word: {}", err_name(r))));
        }
        Ok(())
    }

    fn submit(
        this: &Arc<Inner>,
        group: Option<usize>,
        index: ResidentId,
        query: &[f32],
        k: usize,
        plan: &QueryPlan,
    ) -> Result<Ticket, SearchError> {
        this.usable()?;
        let res = this.resident(index)?;
        if query.len() != res.dim {
            return Err(SearchError::Invalid(format!(
                "query of {} values for an index of stored dimension {}",
                query.len(),
                res.dim
            )));
        }
        if k == 0 || k > this.info.k_max {
            return Err(SearchError::Invalid(format!("k = {k} (1 to {})", this.info.k_max)));
        }
        if plan.ctas == 0 || plan.ctas as usize > this.info.ctas_per_slot {
            return Err(SearchError::Invalid(format!("{} CTAs (1 to {})", plan.ctas, this.info.ctas_per_slot)));
        }
        if plan.list == 0 || plan.list as usize > this.info.list_cap {
            return Err(SearchError::Invalid(format!(
                "a list of {} per CTA (at most {}; ef too large)",
                plan.list, this.info.list_cap
            )));
        }
        if group.is_some_and(|g| g >= this.groups.len()) {
            return Err(SearchError::Invalid(format!("group {} of {}", group.unwrap(), this.groups.len())));
        }
        let slot = match this.take_slot(group) {
            Some(s) => s,
            None => {
                if this.reclaim_abandoned() == 0 {
                    return Err(SearchError::Busy);
                }
                this.take_slot(group).ok_or(SearchError::Busy)?
            }
        };
        let r = Inner::fill_and_send(this, slot, &res, query, k, plan);
        match r {
            Ok(cmd) => Ok(Ticket { inner: Arc::downgrade(this), slot, cmd, done: false }),
            Err(e) => {
                let mut st = this.slots[slot as usize].lock().unwrap_or_else(|e| e.into_inner());
                if !this.poisoned.load(Ordering::Acquire) {
                    this.release_slot(slot, &mut st);
                }
                Err(e)
            }
        }
    }

    fn fill_and_send(
        this: &Arc<Inner>,
        slot: u32,
        res: &Arc<Resident>,
        query: &[f32],
        k: usize,
        plan: &QueryPlan,
    ) -> Result<u32, SearchError> {
        this.bind()?;
        let stream = this.groups[this.group_of(slot)].stream;
        let mut st = this.slots[slot as usize].lock().unwrap_or_else(|e| e.into_inner());
        let mut seq = st.seq + 1;
        if seq > SEQ_LIMIT {
            // the 27-bit sequence would wrap: entries of old queries could
            // then look current, so clear the slot's visited table first
            let bytes = 8usize << this.info.visited_log2;
            let addr = this.d_visited + (slot as u64) * bytes as u64;
            let r = unsafe { sys::cuMemcpyHtoDAsync_v2(addr, this.h_zero as *const c_void, bytes, stream) };
            if r != CUresult::CUDA_SUCCESS {
                return Err(this.poison(format!("clearing a visited table: {}", err_name(r))));
            }
            seq = 1;
        }
        let cmd = cmd_word(seq, plan.ctas);
        // the request, staged in pinned memory (ours until the next query of
        // this slot, which cannot start before this one finished)
        let qwords = res.fmt.qwords;
        let bytes = REQ_HEAD_BYTES + 4 * qwords;
        unsafe {
            let base = this.h_reqs.add(slot as usize * this.req_stride);
            let head = base as *mut u32;
            let words = [
                cmd,
                res.table,
                res.gen,
                k as u32,
                plan.list,
                plan.ctas,
                plan.max_expand.max(1),
                plan.offset_beam,
                plan.beam_width.max(1),
                plan.seeds.min(31),
                qwords as u32,
                0,
                0,
                0,
                0,
                0,
            ];
            std::ptr::copy_nonoverlapping(words.as_ptr(), head, 16);
            let q = base.add(REQ_HEAD_BYTES) as *mut f32;
            std::ptr::copy_nonoverlapping(query.as_ptr(), q, query.len());
            for i in query.len()..qwords {
                *q.add(i) = 0.0;
            }
            if res.ip {
                // -dot over the first stored_dim - 1 coordinates only
                *q.add(res.dim - 1) = 0.0;
            }
            let dst = this.d_reqs + (slot as u64) * this.req_stride as u64;
            let r = sys::cuMemcpyHtoDAsync_v2(dst, base as *const c_void, bytes, stream);
            if r != CUresult::CUDA_SUCCESS {
                return Err(this.poison(format!("copying a query: {}", err_name(r))));
            }
        }
        st.seq = seq;
        st.cmd = cmd;
        st.busy = true;
        st.abandoned = false;
        st.resident = Some(res.clone());
        st.ctas = plan.ctas;
        st.k = k as u32;
        st.max_expand = plan.max_expand.max(1);
        drop(st);
        this.write_cmd(slot, cmd)?;
        Ok(cmd)
    }

    fn poll(&self, t: &mut Ticket) -> Result<Option<Answer>, SearchError> {
        if t.done {
            return Err(SearchError::Invalid("this ticket was already answered".into()));
        }
        if self.finish_word(t.slot) != t.cmd {
            self.health()?;
            if self.closed.load(Ordering::Acquire) && self.device_freed.load(Ordering::Acquire) {
                return Err(SearchError::Closed);
            }
            return Ok(None);
        }
        let mut st = self.slots[t.slot as usize].lock().unwrap_or_else(|e| e.into_inner());
        if !st.busy || st.cmd != t.cmd {
            return Err(SearchError::Invalid("stale ticket".into()));
        }
        let res = st.resident.clone().expect("a busy slot names its index");
        let (ctas, k) = (st.ctas as usize, st.k as usize);
        let mut lists: Vec<Vec<(f32, u32)>> = Vec::with_capacity(ctas);
        let (mut expanded, mut computed, mut capped) = (0u32, 0u32, 0u32);
        let mut bad = None;
        for c in 0..ctas {
            // SAFETY: the GPU wrote this block before the finish word we read
            // with acquire; nobody writes it again until the slot is reused
            unsafe {
                let base = self.h_results.add(t.slot as usize * self.result_stride + c * self.cta_block);
                let head = base as *const u32;
                let h = [
                    std::ptr::read_volatile(head),
                    std::ptr::read_volatile(head.add(1)),
                    std::ptr::read_volatile(head.add(2)),
                    std::ptr::read_volatile(head.add(3)),
                ];
                if h[0] != t.cmd {
                    bad = Some(format!("CTA {c} answered {:#x} for {:#x}", h[0], t.cmd));
                    break;
                }
                if h[2] == OUT_BAD_INDEX {
                    bad = Some("the kernel found no such index".into());
                    break;
                }
                expanded = expanded.saturating_add(h[2]);
                computed = computed.saturating_add(h[3]);
                if h[2] >= st.max_expand {
                    capped += 1;
                }
                let cnt = (h[1] as usize).min(k);
                let pairs = base.add(OUT_HEAD_BYTES) as *const u32;
                let mut v = Vec::with_capacity(cnt);
                for i in 0..cnt {
                    let d = f32::from_bits(std::ptr::read(pairs.add(2 * i)));
                    let n = std::ptr::read(pairs.add(2 * i + 1));
                    v.push((d, n));
                }
                lists.push(v);
            }
        }
        self.release_slot(t.slot, &mut st);
        drop(st);
        t.done = true;
        if let Some(b) = bad {
            return Err(SearchError::Gpu(GpuError::Cuda(b)));
        }
        let refs: Vec<&[(f32, u32)]> = lists.iter().map(|v| v.as_slice()).collect();
        let n = res.n as u32;
        let hits =
            merge_lists(&refs, k, |v| v < n && res.flags[v as usize].load(Ordering::Relaxed) & FLAG_DELETED == 0);
        Ok(Some(Answer { hits, expanded, computed, capped }))
    }

    fn mgmt_sync(&self, s: CUstream, what: &str) -> Result<(), GpuError> {
        ck(what, unsafe { sys::cuStreamSynchronize(s) })
    }

    fn load(&self, im: &IndexImage) -> Result<ResidentId, GpuError> {
        self.usable().map_err(GpuError::from)?;
        let dim = im.stored_dim;
        if dim == 0 || dim > self.info.max_dim {
            return Err(GpuError::Unsupported(format!(
                "stored dimension {dim} (the server takes 1 to {})",
                self.info.max_dim
            )));
        }
        if !im.vectors.len().is_multiple_of(dim) {
            return Err(GpuError::Unsupported("vectors are not a whole number of rows".into()));
        }
        let n = im.vectors.len() / dim;
        if n == 0 || n >= (1usize << 31) {
            return Err(GpuError::Unsupported(format!("{n} rows (1 to 2^31 - 1)")));
        }
        if im.degree == 0 || im.degree > CAND_CAP || im.adjacency.len() != n * im.degree {
            return Err(GpuError::Unsupported(format!(
                "adjacency of {} ids for {n} rows of degree {} (degree 1 to {CAND_CAP})",
                im.adjacency.len(),
                im.degree
            )));
        }
        if im.entry as usize >= n {
            return Err(GpuError::Unsupported(format!("entry point {} of {n} rows", im.entry)));
        }
        if im.flags.is_some_and(|f| f.len() != n) {
            return Err(GpuError::Unsupported("flags must have one byte per row".into()));
        }
        let ip = im.metric == Metric::InnerProduct;
        if ip && dim < 2 {
            return Err(GpuError::Unsupported("inner product needs the extra stored coordinate".into()));
        }
        let half = self.info_half_ok(im.vectors);
        let fmt = RowFormat::new(dim, half);
        if fmt.qwords > self.max_qwords {
            return Err(GpuError::Unsupported(format!("stored dimension {dim} too large")));
        }
        let rb = fmt.row_bytes();
        let mut rows = vec![0u8; n * rb];
        rows.par_chunks_mut(rb).zip(im.vectors.par_chunks(dim)).for_each(|(o, v)| {
            if half {
                for (i, x) in v.iter().enumerate() {
                    let h = f16_exact(*x).unwrap_or(0);
                    o[2 * i..2 * i + 2].copy_from_slice(&h.to_le_bytes());
                }
            } else {
                for (i, x) in v.iter().enumerate() {
                    o[4 * i..4 * i + 4].copy_from_slice(&x.to_le_bytes());
                }
            }
        });
        let flags: Vec<u8> = im.flags.map(|f| f.to_vec()).unwrap_or_else(|| vec![0u8; n]);
        let adj_bytes = n * im.degree * 4;
        let bytes = rows.len() + adj_bytes + n;

        // a table entry
        let table = {
            let mut reg = self.registry.write().unwrap_or_else(|e| e.into_inner());
            let Some(i) = reg.iter().position(|e| matches!(e, Entry::Free)) else {
                return Err(GpuError::Unsupported(format!("{} indexes already resident", reg.len())));
            };
            reg[i] = Entry::Busy;
            i
        };
        let r = self.upload(table, im, &fmt, &rows, &flags, bytes, ip, n);
        let mut reg = self.registry.write().unwrap_or_else(|e| e.into_inner());
        match r {
            Ok(res) => {
                let id = ResidentId { table: res.table, gen: res.gen };
                reg[table] = Entry::Ready(Arc::new(res));
                Ok(id)
            }
            Err(e) => {
                reg[table] = Entry::Free;
                Err(e)
            }
        }
    }

    fn info_half_ok(&self, v: &[f32]) -> bool {
        self.half_when_exact && v.par_iter().all(|x| f16_exact(*x).is_some())
    }

    #[allow(clippy::too_many_arguments)]
    fn upload(
        &self,
        table: usize,
        im: &IndexImage,
        fmt: &RowFormat,
        rows: &[u8],
        flags: &[u8],
        bytes: usize,
        ip: bool,
        n: usize,
    ) -> Result<Resident, GpuError> {
        bind_ctx(self.cu_ctx)?;
        let mut free = 0usize;
        let mut total = 0usize;
        ck("cuMemGetInfo", unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
        if bytes + (256 << 20) > free {
            return Err(GpuError::OutOfMemory { needed: bytes, free, what: "a resident index".into() });
        }
        let mgmt = self.mgmt.lock().unwrap_or_else(|e| e.into_inner());
        let s = *mgmt;
        let mut ptrs: Vec<CUdeviceptr> = Vec::new();
        let alloc = |ptrs: &mut Vec<CUdeviceptr>, b: usize| -> Result<CUdeviceptr, GpuError> {
            let mut d: CUdeviceptr = 0;
            let r = if self.async_alloc {
                unsafe { sys::cuMemAllocAsync(&mut d, b.max(4), s) }
            } else {
                unsafe { sys::cuMemAlloc_v2(&mut d, b.max(4)) }
            };
            ck("allocating a resident index", r)?;
            ptrs.push(d);
            Ok(d)
        };
        let r = (|| -> Result<Resident, GpuError> {
            let dv = alloc(&mut ptrs, rows.len())?;
            let da = alloc(&mut ptrs, im.adjacency.len() * 4)?;
            let df = alloc(&mut ptrs, n)?;
            unsafe {
                ck("uploading vectors", sys::cuMemcpyHtoDAsync_v2(dv, rows.as_ptr() as *const c_void, rows.len(), s))?;
                ck(
                    "uploading the graph",
                    sys::cuMemcpyHtoDAsync_v2(da, im.adjacency.as_ptr() as *const c_void, im.adjacency.len() * 4, s),
                )?;
                ck("uploading flags", sys::cuMemcpyHtoDAsync_v2(df, flags.as_ptr() as *const c_void, n, s))?;
            }
            let gen = self.next_gen.fetch_add(1, Ordering::Relaxed).max(1);
            let mut desc = [0u8; DESC_BYTES];
            let words: [u32; 10] = [
                n as u32,
                im.degree as u32,
                im.entry,
                fmt.chunks as u32,
                fmt.half as u32,
                ip as u32,
                fmt.lanes,
                gen,
                0,
                0,
            ];
            desc[0..8].copy_from_slice(&dv.to_le_bytes());
            desc[8..16].copy_from_slice(&da.to_le_bytes());
            desc[16..24].copy_from_slice(&df.to_le_bytes());
            for (i, w) in words.iter().enumerate() {
                desc[24 + 4 * i..28 + 4 * i].copy_from_slice(&w.to_le_bytes());
            }
            let dd = self.d_indexes + (table * DESC_BYTES) as u64;
            unsafe {
                ck(
                    "writing the index table",
                    sys::cuMemcpyHtoDAsync_v2(dd, desc.as_ptr() as *const c_void, DESC_BYTES, s),
                )?;
            }
            // the sources are pageable host memory: wait before they go
            self.mgmt_sync(s, "uploading an index")?;
            Ok(Resident {
                table: table as u32,
                gen,
                n,
                dim: im.stored_dim,
                degree: im.degree,
                ip,
                fmt: *fmt,
                d_vectors: dv,
                d_adjacency: da,
                d_flags: df,
                async_alloc: self.async_alloc,
                bytes,
                flags: flags.iter().map(|&f| AtomicU8::new(f)).collect(),
            })
        })();
        if r.is_err() {
            for d in ptrs {
                unsafe {
                    if self.async_alloc {
                        sys::cuMemFreeAsync(d, s);
                    } else {
                        sys::cuMemFree_v2(d);
                    }
                }
            }
            let _ = self.mgmt_sync(s, "freeing");
        }
        r
    }

    fn free_resident(&self, r: &Resident, s: CUstream) {
        unsafe {
            for d in [r.d_vectors, r.d_adjacency, r.d_flags] {
                if r.async_alloc {
                    sys::cuMemFreeAsync(d, s);
                } else {
                    sys::cuMemFree_v2(d);
                }
            }
        }
    }

    fn unload(&self, id: ResidentId) -> Result<(), GpuError> {
        self.usable().map_err(GpuError::from)?;
        let res = {
            let mut reg = self.registry.write().unwrap_or_else(|e| e.into_inner());
            match reg.get(id.table as usize) {
                Some(Entry::Ready(r)) if r.gen == id.gen => {
                    let r = r.clone();
                    reg[id.table as usize] = Entry::Busy;
                    r
                }
                _ => return Err(GpuError::Unsupported(format!("index {id:?} is not resident"))),
            }
        };
        // wait for the queries in flight (each slot holds a reference)
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&res) > 1 {
            self.reclaim_abandoned();
            if self.poisoned.load(Ordering::Acquire) {
                break;
            }
            if Instant::now() > deadline {
                // still in use: keep its memory (and its table entry) alive
                return Err(GpuError::Cuda("unload: queries on the index did not finish in 10 s".into()));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        bind_ctx(self.cu_ctx)?;
        let mgmt = self.mgmt.lock().unwrap_or_else(|e| e.into_inner());
        let s = *mgmt;
        let zero = [0u8; DESC_BYTES];
        let dd = self.d_indexes + (id.table as usize * DESC_BYTES) as u64;
        let r1 = ck("clearing the index table", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dd, zero.as_ptr() as *const c_void, DESC_BYTES, s)
        });
        self.free_resident(&res, s);
        let r2 = self.mgmt_sync(s, "unloading an index");
        drop(mgmt);
        self.registry.write().unwrap_or_else(|e| e.into_inner())[id.table as usize] = Entry::Free;
        r1.and(r2)
    }

    fn update_flags(&self, id: ResidentId, node: u32, flags: u8) -> Result<(), GpuError> {
        self.usable().map_err(GpuError::from)?;
        let res = self.resident(id).map_err(GpuError::from)?;
        if node as usize >= res.n {
            return Err(GpuError::Unsupported(format!("node {node} of {}", res.n)));
        }
        // host copy first: answers merged from now on drop the node even if
        // a query already in flight still returns it
        res.flags[node as usize].store(flags, Ordering::Relaxed);
        bind_ctx(self.cu_ctx)?;
        let mgmt = self.mgmt.lock().unwrap_or_else(|e| e.into_inner());
        let s = *mgmt;
        let b = [flags];
        ck("updating flags", unsafe {
            sys::cuMemcpyHtoDAsync_v2(res.d_flags + node as u64, b.as_ptr() as *const c_void, 1, s)
        })?;
        self.mgmt_sync(s, "updating flags")
    }

    fn update_flags_batch(&self, id: ResidentId, changes: &[(u32, u8)]) -> Result<(), GpuError> {
        self.usable().map_err(GpuError::from)?;
        let res = self.resident(id).map_err(GpuError::from)?;
        if let Some(&(v, _)) = changes.iter().find(|c| c.0 as usize >= res.n) {
            return Err(GpuError::Unsupported(format!("node {v} of {}", res.n)));
        }
        for &(v, f) in changes {
            res.flags[v as usize].store(f, Ordering::Relaxed);
        }
        let all: Vec<u8> = res.flags.iter().map(|f| f.load(Ordering::Relaxed)).collect();
        bind_ctx(self.cu_ctx)?;
        let mgmt = self.mgmt.lock().unwrap_or_else(|e| e.into_inner());
        let s = *mgmt;
        ck("updating flags", unsafe {
            sys::cuMemcpyHtoDAsync_v2(res.d_flags, all.as_ptr() as *const c_void, all.len(), s)
        })?;
        self.mgmt_sync(s, "updating flags")
    }

    fn shutdown(&self) -> Result<(), GpuError> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let mut result = Ok(());
        let mut kernel_done = false;
        if !self.poisoned.load(Ordering::Acquire) && bind_ctx(self.cu_ctx).is_ok() {
            // let the queries in flight finish
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                self.reclaim_abandoned();
                let busy = self.slots.iter().enumerate().any(|(i, s)| {
                    let st = s.lock().unwrap_or_else(|e| e.into_inner());
                    st.busy && self.finish_word(i as u32) != st.cmd
                });
                if !busy || Instant::now() > deadline || self.poisoned.load(Ordering::Acquire) {
                    break;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            // Quit in every slot: one copy of the whole word array, after
            // the slot words still queued on the group streams (written
            // again once, in case a submit raced with the close)
            let quit = || {
                let mgmt = self.mgmt.lock().unwrap_or_else(|e| e.into_inner());
                let s = *mgmt;
                let n = self.slots.len();
                unsafe {
                    for g in &self.groups {
                        let _ = sys::cuStreamSynchronize(g.stream);
                    }
                    for i in 0..n {
                        std::ptr::write_volatile(self.h_words.add(i), CMD_QUIT);
                    }
                    let r = sys::cuMemcpyHtoDAsync_v2(self.d_cmd, self.h_words as *const c_void, 4 * n, s);
                    if r == CUresult::CUDA_SUCCESS {
                        let _ = sys::cuStreamSynchronize(s);
                    }
                }
            };
            quit();
            let mut requit = Some(Instant::now() + Duration::from_secs(1));
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                if requit.is_some_and(|t| Instant::now() > t) {
                    requit = None;
                    quit();
                }
                let r = unsafe { sys::cuStreamQuery(self.kernel_stream) };
                match r {
                    CUresult::CUDA_SUCCESS => {
                        kernel_done = true;
                        break;
                    }
                    CUresult::CUDA_ERROR_NOT_READY => {
                        if Instant::now() > deadline {
                            result = Err(GpuError::Cuda("the search kernel did not quit within 5 s".into()));
                            break;
                        }
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    e => {
                        self.poison(format!("the search kernel failed: {}", err_name(e)));
                        break;
                    }
                }
            }
        }
        let poisoned = self.poisoned.load(Ordering::Acquire);
        if kernel_done || poisoned {
            // device memory: the kernel no longer reads it (or the context
            // is gone and these calls only fail)
            let _ = bind_ctx(self.cu_ctx);
            let mgmt = self.mgmt.lock().unwrap_or_else(|e| e.into_inner());
            let s = *mgmt;
            let mut reg = self.registry.write().unwrap_or_else(|e| e.into_inner());
            for e in reg.iter_mut() {
                if let Entry::Ready(r) = std::mem::replace(e, Entry::Free) {
                    self.free_resident(&r, s);
                }
            }
            drop(reg);
            unsafe {
                let _ = sys::cuStreamSynchronize(s);
                for d in [self.d_cmd, self.d_done, self.d_reqs, self.d_visited, self.d_indexes] {
                    sys::cuMemFree_v2(d);
                }
            }
            self.device_freed.store(true, Ordering::Release);
        }
        result
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // pinned memory and streams live as long as any ticket; device
        // memory was freed by shutdown (not when the kernel never quit)
        let _ = bind_ctx(self.cu_ctx);
        unsafe {
            for s in self.groups.iter().map(|g| g.stream) {
                sys::cuStreamDestroy_v2(s);
            }
            let m = *self.mgmt.lock().unwrap_or_else(|e| e.into_inner());
            if self.device_freed.load(Ordering::Acquire) {
                sys::cuStreamDestroy_v2(self.kernel_stream);
            }
            sys::cuStreamDestroy_v2(m);
            for p in [self.h_reqs, self.h_results, self.h_finish as *mut u8, self.h_zero, self.h_words as *mut u8] {
                sys::cuMemFreeHost(p as *mut c_void);
            }
        }
        let module = self.module.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(module);
    }
}
