//! The search server: the facade over the kernel ([`super::launch`]), the
//! slots ([`super::slots`]) and the resident indexes
//! ([`super::registry`]). See the module documentation for the protocol and
//! the decisions.

use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use gpu_graph_engine::flat::FlatIndex;

use super::answers::{AnswerLayout, Route};
use super::batch::{BatchAnswers, BatchKernel, BatchTicket};
use super::doorbell::Doorbell;
use super::health::Health;
use super::launch::Kernel;
use super::plan::{QueryPlan, SearchPolicy, ServerConfig, Sizing, BATCH_ROOM_PER_SM};
use super::registry::{Patch, Registry, ResidentId, ResidentInfo, PATCH_STAGING};
use super::scatter::Scatter;
use super::slots::{Answer, Slots};
use crate::abi::{self, SearchParams};
use crate::device::Gpu;
use crate::error::{cuda, guard, GpuError};

/// A query with a value fp16 cannot hold, for an index kept in fp16.
const OUT_OF_FP16: &str = "a query value beyond fp16's range (|x| > 65504) for an index kept in fp16";

/// Why a request could not be served. The worker falls back to the CPU on
/// every one of them.
#[derive(Clone, Debug, PartialEq)]
pub enum SearchError {
    /// Every query slot is in use.
    Busy,
    /// `wait` ran out of time; the ticket is still pending (wait again, or
    /// drop it: its slot comes back when the GPU finishes).
    Timeout,
    /// A bad argument: unknown or unloaded index, wrong query length, k or
    /// ef beyond what the server was sized for, a ticket already answered,
    /// an index the server does not take.
    Invalid(String),
    /// The server was shut down.
    Closed,
    /// The CUDA context failed (a fault inside the kernel, a lost device), or
    /// the kernel exited by itself: every later call fails the same way. A
    /// fault inside a kernel (illegal address, trap) is sticky for the whole
    /// process: CUDA answers every later call in it with the same error,
    /// whatever context is created next ("the process must be terminated and
    /// relaunched", CUDA's documentation of CUDA_ERROR_ILLEGAL_ADDRESS). So
    /// the worker drops its tickets, the server and the [`Gpu`] (none of
    /// which hangs or panics) and exits; a new process starts a new server.
    /// [`SearchServer::context_broken`] says whether a CUDA error caused it.
    Poisoned(String),
    /// Any other GPU failure (too little memory for an index, say).
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

/// How the server was sized (from [`ServerConfig`] and the device).
#[derive(Clone, Debug)]
pub struct ServerInfo {
    pub slots: usize,
    pub ctas_per_slot: usize,
    /// warps of each CTA
    pub cta_warps: usize,
    /// queries reach the kernel through the doorbell (else copies and
    /// stream writes: `ServerConfig::copy_requests`)
    pub doorbell: bool,
    pub groups: usize,
    pub sm_count: u32,
    /// resident blocks per SM of the kernel at its shared memory size
    pub blocks_per_sm: u32,
    pub shared_bytes: usize,
    pub visited_log2: u32,
    pub list_cap: usize,
    pub k_max: usize,
    pub max_dim: usize,
    /// slot words written by cuStreamWriteValue32 (Err: a 4-byte async copy
    /// on the same stream instead, and why: the device or driver refused
    /// stream memory operations)
    pub stream_mem_ops: Result<(), String>,
    /// device bytes of the server itself (slots, visited tables)
    pub device_bytes: usize,
    /// pinned host bytes
    pub pinned_bytes: usize,
    pub compile_ms: f64,
    /// blocks of a batch launch (each with its own visited table)
    pub batch_blocks: usize,
    /// resident blocks per SM of the batch kernel at the largest shared size
    pub batch_blocks_per_sm: u32,
    /// the answers' layout, and whether they are in the caller's
    /// [`ServerConfig::answer_area`] (where the caller reads them:
    /// [`Ticket::route`], [`crate::search::answers`])
    pub answer_layout: AnswerLayout,
    pub answer_area: bool,
}

/// Most blocks of a batch launch (each has a visited table of its own).
const MAX_BATCH_BLOCKS: usize = 4096;

/// A submitted query. Dropping it unanswered abandons it: its slot returns
/// to the pool once the GPU finishes. It does not keep the server (or the
/// CUDA context) alive.
pub struct Ticket {
    inner: Weak<Inner>,
    slot: u32,
    cmd: u32,
    done: bool,
    route: Route,
}

impl Ticket {
    pub fn slot(&self) -> usize {
        self.slot as usize
    }
    /// Where its answer will be ([`crate::search::answers`]): a caller that
    /// reads it there itself then drops the ticket, which frees the slot
    /// (the GPU having finished it).
    pub fn route(&self) -> Route {
        self.route
    }
    pub fn is_answered(&self) -> bool {
        self.done
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            if let Some(inner) = self.inner.upgrade() {
                inner.slots.abandon(self.slot, self.cmd);
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

struct Inner {
    info: ServerInfo,
    policy: SearchPolicy,
    allow_fault: bool,
    health: Health,
    /// Freed only once the kernel has exited (or the context is gone): a
    /// kernel that would not stop keeps reading them, so they are leaked.
    kernel: ManuallyDrop<Kernel>,
    batch: ManuallyDrop<BatchKernel>,
    slots: ManuallyDrop<Slots>,
    registry: ManuallyDrop<Registry>,
    stopped: std::sync::atomic::AtomicBool,
    // keeps the context alive as long as the server
    _ctx: Arc<CudaContext>,
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
        guard("starting the GPU search server", || {
            let sms = gpu.info.sm_count as usize;
            let (mut z, mut kernel, mut per_sm) = sized(gpu, &cfg)?;
            if z.fewer_than_wanted(&cfg) {
                // the default warps a CTA leave fewer slots than the caller
                // wants: one warp a CTA (this kernel is never launched)
                (z, kernel, per_sm) = sized(gpu, &ServerConfig { cta_warps: 1, ..cfg.clone() })?;
            }
            // the batch kernel's blocks: what the persistent kernel's leave
            // resident, each with a visited table; none (batches refused)
            // unless each SM sub-partition keeps room for one of its warps
            // beside the persistent kernel's (a block that can never start
            // would hang every batch after it)
            let (batch_per_sm, batch_regs) = BatchKernel::occupancy(&kernel.module, z.smem)?;
            let room = z.slots * z.ctas + z.batch_room() * sms <= per_sm * sms && batch_regs <= kernel.registers()?;
            let batch_blocks = if room {
                (batch_per_sm * sms).saturating_sub(z.slots * z.ctas).clamp(BATCH_ROOM_PER_SM * sms, MAX_BATCH_BLOCKS)
            } else {
                0
            };
            // the patch kernel's single-warp blocks fit where the batch
            // kernel's do (GPU_GRAPH_PATCH_SCATTER=0: the driver's batched
            // copies instead, a developer's switch for comparing the two)
            // (on the doorbell the dispatcher applies patches: no kernel)
            let scatter =
                batch_blocks > 0 && !z.doorbell && std::env::var("GPU_GRAPH_PATCH_SCATTER").map_or(true, |v| v != "0");
            let batch_bytes =
                BatchKernel::device_bytes(batch_blocks, z.visited_log2) + if scatter { PATCH_STAGING } else { 0 };
            gpu.reserve(z.device_bytes() + batch_bytes, "the GPU search server")?;
            let mgmt = gpu.ctx.new_stream().map_err(|e| cuda("creating a stream", e))?;
            let doorbell = if z.doorbell { Some(Arc::new(Doorbell::new(&gpu.ctx, z.ring_log2)?)) } else { None };
            // the caller's answer area, where the sizes fit it
            let area = cfg.answer_area.filter(|a| AnswerLayout::of(&z).bytes() <= a.len);
            let slots = Slots::new(&gpu.ctx, &z, &mgmt, &doorbell, area)?;
            let scatter = if scatter { Some(Scatter::new(&kernel.module, &mgmt, PATCH_STAGING)?) } else { None };
            let registry = Registry::new(&z, cfg.max_dim, cfg.half_rows, mgmt, scatter, doorbell)?;
            let batch = BatchKernel::new(
                gpu,
                &kernel.module,
                batch_blocks,
                z.visited_log2,
                z.smem,
                registry.table_addr(),
                z.max_indexes,
            )?;
            let mut params = SearchParams {
                indexes: registry.table_addr(),
                n_indexes: z.max_indexes as u32,
                max_sleep_ns: cfg.max_sleep_ns.max(64),
                ..SearchParams::default()
            };
            slots.params(&mut params);
            registry.params(&mut params);
            kernel.launch(params, z.blocks(), z.smem)?;
            let info = ServerInfo {
                slots: z.slots,
                ctas_per_slot: z.ctas,
                cta_warps: z.warps,
                doorbell: z.doorbell,
                groups: z.groups,
                sm_count: gpu.info.sm_count,
                blocks_per_sm: per_sm as u32,
                shared_bytes: z.smem,
                visited_log2: z.visited_log2,
                list_cap: z.list_cap,
                k_max: z.k_max,
                max_dim: cfg.max_dim,
                stream_mem_ops: slots.stream_mem_ops.clone(),
                device_bytes: z.device_bytes() + batch_bytes,
                pinned_bytes: z.pinned_bytes(),
                compile_ms: kernel.compile_ms,
                batch_blocks,
                batch_blocks_per_sm: batch_per_sm as u32,
                answer_layout: slots.layout(),
                answer_area: area.is_some(),
            };
            let inner = Inner {
                info,
                policy: cfg.policy,
                allow_fault: cfg.allow_fault_injection,
                health: Health::new(),
                kernel: ManuallyDrop::new(kernel),
                batch: ManuallyDrop::new(batch),
                slots: ManuallyDrop::new(slots),
                registry: ManuallyDrop::new(registry),
                stopped: Default::default(),
                _ctx: gpu.ctx.clone(),
            };
            Ok(SearchServer { inner: Arc::new(inner) })
        })
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
    pub fn load(&self, index: &FlatIndex) -> Result<ResidentId, SearchError> {
        self.load_with_rows(index, None)
    }

    /// [`SearchServer::load`] with each node's row (`rows`, one a node),
    /// which the persistent kernel writes beside each hit of an answer and
    /// patches keep ([`Patch::payloads`]).
    pub fn load_with_rows(&self, index: &FlatIndex, rows: Option<&[u64]>) -> Result<ResidentId, SearchError> {
        self.inner.health.usable()?;
        let r = self.inner.registry.load(index, rows);
        self.inner.fatal_or(r)
    }

    /// Removes an index: new queries against it fail at once; waits up to
    /// UNLOAD_WAIT for those in flight to let go of it, which frees its
    /// device memory at once. A query (or batch) still held after that,
    /// by this very thread say, keeps the memory until it is answered or
    /// dropped; the index is gone all the same.
    pub fn unload(&self, id: ResidentId) -> Result<(), SearchError> {
        self.inner.health.usable()?;
        let i = &self.inner;
        let r = i.registry.unload(id, || {
            i.slots.reclaim();
            !i.health.is_poisoned()
        });
        i.fatal_or(r)
    }

    /// What a resident index occupies (None when not resident).
    pub fn resident_info(&self, id: ResidentId) -> Option<ResidentInfo> {
        self.inner.registry.resident(id).ok().map(|r| r.info())
    }

    /// Sets a node's flags (gpu_graph_engine::node) after upload. Queries
    /// submitted after this returns never return a node marked deleted.
    pub fn update_flags(&self, id: ResidentId, node: u32, flags: u8) -> Result<(), SearchError> {
        self.update_flags_batch(id, &[(node, flags)])
    }

    /// Sets the flags of many nodes at once: the host copy node by node,
    /// then the whole flag array in one copy.
    pub fn update_flags_batch(&self, id: ResidentId, changes: &[(u32, u8)]) -> Result<(), SearchError> {
        self.inner.health.usable()?;
        let r = self.inner.registry.update_flags(id, changes);
        self.inner.fatal_or(r)
    }

    /// Brings a resident index up to date in place while queries run (see
    /// `Registry::patch`); Ok(false)
    /// when it must be loaded again instead.
    pub fn patch(&self, id: ResidentId, p: &Patch) -> Result<bool, SearchError> {
        self.inner.health.usable()?;
        let r = self.inner.registry.patch(id, p);
        self.inner.fatal_or(r)
    }

    /// Submits a query (`query` already prepared like `Metric::prepare_query`,
    /// stored_dim values) for its k nearest with beam `ef`, planned by the
    /// server's [`SearchPolicy`]. Takes a free slot or fails with Busy.
    pub fn submit(&self, index: ResidentId, query: &[f32], k: usize, ef: usize) -> Result<Ticket, SearchError> {
        Inner::submit(&self.inner, None, index, query, k, &self.plan(k, ef), false)
    }

    /// As [`SearchServer::submit`], but without the doorbell
    /// (`ServerConfig::copy_requests`) the query waits on the host until
    /// [`SearchServer::send_held`]: a thread with many queries at once sends
    /// them with two driver calls instead of two a query. (On the doorbell
    /// it goes at once: posting costs no driver call.)
    pub fn submit_held(&self, index: ResidentId, query: &[f32], k: usize, ef: usize) -> Result<Ticket, SearchError> {
        Inner::submit(&self.inner, None, index, query, k, &self.plan(k, ef), true)
    }

    /// Sends every query `submit_held` holds; how many.
    pub fn send_held(&self) -> Result<usize, SearchError> {
        self.inner.slots.send_held().map_err(|why| self.inner.health.poison(why, true))
    }

    /// Submits with an explicit plan (measurements).
    pub fn submit_plan(
        &self,
        index: ResidentId,
        query: &[f32],
        k: usize,
        plan: &QueryPlan,
    ) -> Result<Ticket, SearchError> {
        Inner::submit(&self.inner, None, index, query, k, plan, false)
    }

    /// Submits into one slot group (0..info().groups) only: for a caller that
    /// gives each host thread its own group of slots and stream.
    pub fn submit_in_group(
        &self,
        group: usize,
        index: ResidentId,
        query: &[f32],
        k: usize,
        ef: usize,
    ) -> Result<Ticket, SearchError> {
        Inner::submit(&self.inner, Some(group), index, query, k, &self.plan(k, ef), false)
    }

    /// The plan of each query of a batch: one CTA with a beam of
    /// max(ef, k), the CPU's search.
    pub fn batch_plan(&self, k: usize, ef: usize) -> QueryPlan {
        self.inner.policy.plan_with(1, ef.max(k).max(1))
    }

    /// Submits `queries` (prepared like `Metric::prepare_query`, stored_dim
    /// values each, one after another) for their `k` nearest with beam
    /// `ef`, searched together by the batch kernel (see [`super::batch`])
    /// through the first `width` entries of each list (0: whole lists; a
    /// TSDG graph's prefix). Returns at once; [`SearchServer::poll_batch`]
    /// gives the answers.
    pub fn submit_batch(
        &self,
        index: ResidentId,
        queries: &[f32],
        k: usize,
        ef: usize,
        width: usize,
    ) -> Result<BatchTicket, SearchError> {
        let i = &self.inner;
        i.health.usable()?;
        let res = i.registry.resident(index)?;
        let bad = |s: String| Err(SearchError::Invalid(s));
        let n = queries.len() / res.dim;
        if n == 0 || n * res.dim != queries.len() || n >= 1 << 31 {
            return bad(format!("{} values for queries of stored dimension {}", queries.len(), res.dim));
        }
        if !res.takes_query(queries) {
            return bad(OUT_OF_FP16.into());
        }
        if k == 0 || k > i.info.k_max {
            return bad(format!("k = {k} (1 to {})", i.info.k_max));
        }
        if i.info.batch_blocks == 0 {
            return Err(SearchError::Gpu(GpuError::Unsupported(
                "batches: no room for the batch kernel beside the persistent kernel on this GPU".into(),
            )));
        }
        if let Some(why) = batch_refused(&i.info, res.fmt.lanes) {
            return Err(SearchError::Gpu(GpuError::Unsupported(why)));
        }
        let plan = self.batch_plan(k, ef);
        if plan.list as usize > i.info.list_cap {
            return bad(format!("a beam of {} (at most {} in a batch)", plan.list, i.info.list_cap));
        }
        let r = i.batch.submit(&i.registry, res, queries, k, &plan, width).map_err(SearchError::from);
        i.fatal_or(r)
    }

    /// Why a batch of an index whose distances take `lanes` lanes each
    /// is refused by this server (None: it is not).
    pub fn batch_refused_for(&self, index: ResidentId) -> Option<String> {
        let res = self.inner.registry.resident(index).ok()?;
        batch_refused(&self.inner.info, res.fmt.lanes)
    }

    /// A batch's answers if the GPU has finished, without blocking: each
    /// query's (search distance, node), ascending, distinct, no deleted node.
    pub fn poll_batch(&self, ticket: &BatchTicket) -> Result<Option<BatchAnswers>, SearchError> {
        let i = &self.inner;
        i.health.usable()?;
        let r = ticket.poll().map_err(|why| SearchError::Gpu(GpuError::Cuda(why)));
        i.fatal_or(r)
    }

    /// The answer if the GPU has finished, without blocking.
    pub fn poll(&self, ticket: &mut Ticket) -> Result<Option<Answer>, SearchError> {
        self.check_ticket(ticket)?;
        self.inner.poll(ticket)
    }

    /// Waits for the answer. On Timeout the ticket stays pending.
    pub fn wait(&self, ticket: &mut Ticket, timeout: Duration) -> Result<Answer, SearchError> {
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
        self.inner.slots.reclaim()
    }

    /// Whether the server is poisoned; the reason.
    pub fn poisoned(&self) -> Option<String> {
        self.inner.health.poisoned()
    }

    /// Whether the server was poisoned by a CUDA error: the context, and
    /// with a kernel fault the whole process, cannot use CUDA any more.
    pub fn context_broken(&self) -> bool {
        self.inner.health.sticky()
    }

    /// Checks the kernel now (is it still running?).
    pub fn health(&self) -> Result<(), SearchError> {
        self.inner.health.check(&self.inner.kernel, true)
    }

    /// Test switch: makes the kernel do an illegal memory access, which
    /// poisons the CUDA context (only with
    /// `ServerConfig::allow_fault_injection`). Every later call fails with
    /// Poisoned; recovery is a new process (see [`SearchError::Poisoned`]).
    pub fn inject_fault(&self) -> Result<(), SearchError> {
        let i = &self.inner;
        if !i.allow_fault {
            return Err(SearchError::Invalid("fault injection is off (ServerConfig::allow_fault_injection)".into()));
        }
        i.health.usable()?;
        let slot = i.slots.take(None).ok_or(SearchError::Busy)?;
        i.slots.state(slot).busy = true;
        i.slots.write_cmd(slot, abi::CMD_FAULT).map_err(|why| i.health.poison(why, true))
    }

    /// Stops the kernel (Quit in every slot after the queries in flight
    /// finish, up to 2 s), waits for it to exit (up to 5 s) and frees the
    /// device memory. Idempotent; Drop calls it. After a fault it frees what
    /// it can and returns Ok.
    pub fn shutdown(&self) -> Result<(), SearchError> {
        self.inner.shutdown()
    }
}

impl Drop for SearchServer {
    fn drop(&mut self) {
        let _ = self.inner.shutdown();
    }
}

impl Inner {
    /// A CUDA error makes the server unusable: poisons it when the context
    /// is gone, so every later call says so.
    fn fatal_or<T>(&self, r: Result<T, SearchError>) -> Result<T, SearchError> {
        if let Err(SearchError::Gpu(GpuError::Cuda(why))) = &r {
            if self.health.check(&self.kernel, true).is_err() {
                return Err(self.health.poison(why.clone(), true));
            }
        }
        r
    }

    /// Takes a slot and sends the query (or holds it: `hold`); the ticket
    /// holds a weak reference to the server.
    fn submit(
        this: &Arc<Inner>,
        group: Option<usize>,
        index: ResidentId,
        query: &[f32],
        k: usize,
        plan: &QueryPlan,
        hold: bool,
    ) -> Result<Ticket, SearchError> {
        this.health.usable()?;
        let res = this.registry.resident(index)?;
        let bad = |s: String| Err(SearchError::Invalid(s));
        if query.len() != res.dim {
            return bad(format!("query of {} values for an index of stored dimension {}", query.len(), res.dim));
        }
        if !res.takes_query(query) {
            return bad(OUT_OF_FP16.into());
        }
        if k == 0 || k > this.info.k_max {
            return bad(format!("k = {k} (1 to {})", this.info.k_max));
        }
        if plan.ctas == 0 || plan.ctas as usize > this.info.ctas_per_slot {
            return bad(format!("{} CTAs (1 to {})", plan.ctas, this.info.ctas_per_slot));
        }
        if plan.list == 0 || plan.list as usize > this.info.list_cap {
            return bad(format!("a list of {} per CTA (at most {}; ef too large)", plan.list, this.info.list_cap));
        }
        if let Some(g) = group.filter(|&g| g >= this.slots.groups()) {
            return bad(format!("group {g} of {}", this.slots.groups()));
        }
        let slot = match this.slots.take(group) {
            Some(s) => s,
            None if this.slots.reclaim() > 0 => this.slots.take(group).ok_or(SearchError::Busy)?,
            None => return Err(SearchError::Busy),
        };
        let mut st = this.slots.state(slot);
        // the index's patches so far land before this query starts
        let sent = this.slots.send(slot, &mut st, &res, query, k, plan, hold, this.registry.patched());
        match sent {
            Ok(cmd) => {
                let route = this.slots.route(slot, &st);
                Ok(Ticket { inner: Arc::downgrade(this), slot, cmd, done: false, route })
            }
            Err(why) => {
                this.slots.release(slot, &mut st);
                Err(this.health.poison(why, true))
            }
        }
    }

    fn poll(&self, t: &mut Ticket) -> Result<Option<Answer>, SearchError> {
        if t.done {
            return Err(SearchError::Invalid("this ticket was already answered".into()));
        }
        if self.slots.finish_word(t.slot) != t.cmd {
            self.health.check_polled(&self.kernel)?;
            if self.stopped.load(std::sync::atomic::Ordering::Acquire) {
                return Err(SearchError::Closed);
            }
            return Ok(None);
        }
        let mut st = self.slots.state(t.slot);
        if !st.busy || st.cmd != t.cmd {
            return Err(SearchError::Invalid("stale ticket".into()));
        }
        t.done = true;
        self.slots.collect(t.slot, &mut st).map(Some).map_err(|b| SearchError::Gpu(GpuError::Cuda(b)))
    }

    fn shutdown(&self) -> Result<(), SearchError> {
        if !self.health.close() {
            return Ok(());
        }
        let mut result = Ok(());
        let mut exited = false;
        if !self.health.is_poisoned() && self.kernel.stream.context().bind_to_thread().is_ok() {
            // let the queries in flight finish
            let deadline = Instant::now() + Duration::from_secs(2);
            while self.slots.reclaim() > 0 || self.slots.any_in_flight() {
                if Instant::now() > deadline || self.health.is_poisoned() {
                    break;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            (exited, result) = self.stop_kernel();
        }
        if exited || self.health.is_poisoned() {
            // the kernel no longer reads device memory (or the context is
            // gone and freeing only fails)
            self.registry.clear();
            self.stopped.store(true, std::sync::atomic::Ordering::Release);
        }
        result
    }

    /// Quit in every slot (again after 1 s, in case a submit raced with the
    /// close), then up to 5 s for the kernel to return. Whether it did.
    fn stop_kernel(&self) -> (bool, Result<(), SearchError>) {
        self.slots.quit_all(&self.registry.mgmt());
        let mut requit = Some(Instant::now() + Duration::from_secs(1));
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if requit.is_some_and(|t| Instant::now() > t) {
                requit = None;
                self.slots.quit_all(&self.registry.mgmt());
            }
            match self.kernel.state() {
                super::launch::KernelState::Exited => return (true, Ok(())),
                super::launch::KernelState::Failed(e) => {
                    self.health.poison(format!("the search kernel failed: {e}"), true);
                    return (false, Ok(()));
                }
                super::launch::KernelState::Running if Instant::now() > deadline => {
                    let e = GpuError::Cuda("the search kernel did not quit within 5 s".into());
                    return (false, Err(e.into()));
                }
                super::launch::KernelState::Running => std::thread::sleep(Duration::from_micros(200)),
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.stopped.load(std::sync::atomic::Ordering::Acquire) {
            // SAFETY: each field is dropped once, here, and never used again.
            unsafe {
                ManuallyDrop::drop(&mut self.registry);
                ManuallyDrop::drop(&mut self.slots);
                ManuallyDrop::drop(&mut self.batch);
                ManuallyDrop::drop(&mut self.kernel);
            }
        }
        // else the kernel may still run and read them: leaked on purpose
    }
}

/// The server's sizes for `cfg` with its kernel compiled and loaded, and
/// the kernel's resident blocks per SM.
fn sized(gpu: &Gpu, cfg: &ServerConfig) -> Result<(Sizing, Kernel, usize), GpuError> {
    let mut z = Sizing::new(cfg)?;
    let kernel = Kernel::load(gpu, z.smem, cfg.batch_min_blocks, z.warps as u32)?;
    let per_sm = kernel.blocks_per_sm(z.smem)?;
    z.fit(cfg, per_sm, gpu.info.sm_count as usize)?;
    Ok((z, kernel, per_sm))
}

/// Why the batch kernel is refused an index whose distances take `lanes`
/// lanes each. Rows of more than 256 bytes a lane (fp32 rows beyond 1024
/// dimensions: a whole warp a distance) beside a persistent kernel of
/// two-warp CTAs: on an H200 such a batch never answered (1280 and 1536
/// dimensions, 132 slots, with copied requests as well as the doorbell),
/// while it did beside one-warp CTAs or only 32 slots, and at 1024
/// dimensions (docs/benchmarks.md); the cause is not understood, and a
/// kernel that never ends would hold its SMs for good, so such batches
/// search on the CPU (the worker) until it is.
fn batch_refused(info: &ServerInfo, lanes: u32) -> Option<String> {
    (lanes >= 32 && info.cta_warps > 1).then(|| {
        "batches of rows over 4 kB beside two-warp CTAs (a known hang, docs/benchmarks.md): one warp a CTA \
         (ServerConfig::cta_warps) takes them"
            .to_string()
    })
}
