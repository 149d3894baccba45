//! The adapter over crates/gpu's persistent search kernel (SearchServer):
//! every use of its API by the worker is in this file, and so is the one
//! mapping of its errors onto a search round's [`Outcome`].

use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::metric::Metric;
use gpu_graph_gpu::search::answers::{AnswerArea, Route};
use gpu_graph_gpu::search::{
    BatchTicket, HalfRows, Patch, ResidentId, SearchError, SearchPolicy, SearchServer, ServerConfig, Ticket,
};
use gpu_graph_gpu::{Gpu, GpuError};

use std::time::Instant;

use super::device::Hits;
use super::outcome::Outcome;
use super::rows::Rows;
use super::shmem::shared;

pub struct GpuSearch {
    // fields drop in order: the server (and its kernel) before the context
    server: SearchServer,
    gpu: Gpu,
    /// a batch's prepared queries (cosine, inner product), kept
    prepared: std::cell::RefCell<Vec<f32>>,
}

pub struct GpuResident {
    id: ResidentId,
    metric: Metric,
}

/// A query on the GPU and when the worker submitted it.
pub struct GpuPending(Ticket, Instant);

/// A batch on the GPU: the batch kernel's, or (a small batch) its queries
/// in the persistent kernel's slots.
pub enum GpuBatch {
    Kernel(Box<BatchTicket>),
    Singles(Vec<(Ticket, Option<Hits>)>),
}

/// Batches smaller than this go to the persistent kernel query by query
/// (several CTAs each, answered as they finish); larger ones to the batch
/// kernel (one CTA each, one launch). On an H200 (1M SIFT, ef 20,
/// gpu-graph-searchcheck): a batch of 16 took 174 us in the batch kernel
/// against a p50 of 118 us for 16 queries in flight in the persistent
/// kernel; 64 took 206 us against 171 us; a batch of 256 took 265 us (965k
/// queries/s), where the persistent kernel's 256 slots top out near 350k.
const BATCH_KERNEL_MIN: usize = 64;

/// What a failed request means for the scan that made it. A server that is
/// closed or poisoned answers Error here; [`GpuSearch::health`] then tells
/// the worker to exit.
fn outcome(e: SearchError) -> Outcome {
    match e {
        SearchError::Busy => Outcome::Busy,
        SearchError::Invalid(_) | SearchError::Gpu(GpuError::OutOfMemory { .. } | GpuError::Unsupported(_)) => {
            Outcome::Unfit
        }
        SearchError::Timeout | SearchError::Gpu(_) | SearchError::Closed | SearchError::Poisoned(_) => {
            pgrx::log!("gpu_graph search worker: a GPU request failed: {e}");
            Outcome::Error
        }
    }
}

/// The worker's server configuration, but its answer area (the shared
/// memory's size for that area is reckoned from it too).
pub fn server_config() -> ServerConfig {
    // fault injection is reachable only through a superuser-only
    // setting; one slot group (stream): the worker submits from one
    // thread, and each group's stream waits for every patch of a
    // copy once (cuStreamWaitEvent): with 8 groups, up to 8 driver
    // calls a patch on the worker's thread, at thousands of patches
    // a second under inserts. Vectors in fp16, rounded where they
    // are not exact (an index with storage = 'f32'; the default f16
    // pages are exact): every answer's nodes are re-read from the
    // pages with their exact distances (client::verify), and at 768
    // dimensions the kernel took 276 us a query on fp32 rows against
    // 197 us on fp16 rows at ef 40 (H200, docs/benchmarks.md)
    // As many GPU slots as the ring has, where the device allows:
    // two-warp CTAs halve them (a small GPU then takes one warp).
    ServerConfig {
        allow_fault_injection: true,
        groups: 1,
        half_rows: HalfRows::Rounded,
        min_slots: crate::gucs::WORKER_SLOTS.get() as usize,
        // the A/B of the doorbell (docs/benchmarks.md): the
        // server's environment, as GPU_GRAPH_SEARCH_NVRTC_OPTIONS
        copy_requests: std::env::var_os("GPU_GRAPH_COPY_REQUESTS").is_some_and(|v| v == "1"),
        // and of the search's start (plan::SearchPolicy::scan)
        policy: SearchPolicy {
            scan: scan_from_env().unwrap_or(SearchPolicy::default().scan),
            ..SearchPolicy::default()
        },
        ..ServerConfig::default()
    }
}

/// GPU_GRAPH_SEARCH_SCAN: the start's scan of every query, for A/B runs.
fn scan_from_env() -> Option<usize> {
    std::env::var("GPU_GRAPH_SEARCH_SCAN").ok()?.parse().ok()
}

impl GpuSearch {
    pub fn open() -> Result<GpuSearch, String> {
        // NVRTC's first compile sets SIGTERM and SIGINT to SIG_IGN for a
        // moment, which would discard one held pending by the block below (a
        // shutdown's SIGTERM lost): the shield's taker keeps them, and its
        // drop serves them to the worker's handlers
        let _shield = crate::threads::NvrtcShield::new();
        // the driver's threads start here (context, streams, the persistent
        // kernel's launch): they must not take the worker's signals
        crate::threads::with_signals_blocked(|| {
            let gpu = Gpu::open().map_err(|e| e.to_string())?;
            // the answers in shared memory, where the scans read their own
            // (worker::own_answer)
            let area = shared().map(|s| s.answer_area()).map(|(ptr, len)| AnswerArea { ptr: ptr as usize, len });
            let cfg = ServerConfig { answer_area: area, ..server_config() };
            let server = SearchServer::start(&gpu, cfg).map_err(|e| e.to_string())?;
            if let (Some(s), true) = (shared(), server.info().answer_area) {
                s.answers.publish(server.info().answer_layout);
            }
            Ok(GpuSearch { server, gpu, prepared: Default::default() })
        })
    }

    pub fn describe(&self) -> String {
        let i = self.server.info();
        format!(
            "{} ({} query slots of {} CTAs of {} warps{})",
            self.gpu.info().name,
            i.slots,
            i.ctas_per_slot,
            i.cta_warps,
            if i.doorbell { "" } else { ", requests copied" }
        )
    }

    /// gpu_graph.gpu_memory_limit = 0: the device memory free now less 1 GiB.
    pub fn auto_limit(&self) -> usize {
        self.gpu.mem_info().map(|(free, _)| free.saturating_sub(1 << 30)).unwrap_or(0)
    }

    /// Uploads a copy; its device bytes. Err: what it means for the scans
    /// of the index, and why.
    /// `rows`: each node's row, which the kernel then writes beside each
    /// hit (a copy whose scans may read their own answers).
    pub fn load(&self, index: &FlatIndex, rows: &Rows) -> Result<(GpuResident, usize), (Outcome, String)> {
        let rows = rows.run(0, index.len());
        let id = self.server.load_with_rows(index, Some(&rows)).map_err(|e| (outcome(e.clone()), e.to_string()))?;
        let bytes = self.server.resident_info(id).map_or(0, |r| r.bytes);
        Ok((GpuResident { id, metric: index.metric }, bytes))
    }

    pub fn unload(&self, r: GpuResident) {
        // queries against it fail from now on; an error here leaves device
        // memory behind, which the next health check reports
        let _ = self.server.unload(r.id);
    }

    /// (stored dimension, degree, nodes) of a resident copy.
    pub fn dims(&self, r: &GpuResident) -> Option<(usize, usize, usize)> {
        self.server.resident_info(r.id).map(|i| (i.stored_dim, i.degree, i.n))
    }

    /// Whether a resident copy holds fp16 rows (rounded: see HalfRows);
    /// true when it is unknown.
    pub fn half(&self, r: &GpuResident) -> bool {
        self.server.resident_info(r.id).is_none_or(|i| i.half)
    }

    /// Device bytes of a resident copy (it grows when inserts fill its room).
    pub fn bytes(&self, r: &GpuResident) -> Option<usize> {
        self.server.resident_info(r.id).map(|i| i.bytes)
    }

    /// Brings a copy up to date in place; false when it must be loaded
    /// again (full with no room on the device to grow, or no longer exact
    /// in fp16), Err when the patch failed.
    /// The patch's nodes take their rows from `rows` (the copy's, already
    /// patched).
    pub fn patch(&self, r: &GpuResident, p: &mut Patch, rows: &Rows) -> Result<bool, Outcome> {
        p.payloads = p.rows.iter().map(|(first, flags, _)| (*first, rows.run(*first as usize, flags.len()))).collect();
        self.server.patch(r.id, p).map_err(outcome)
    }

    /// A query held on the host until [`GpuSearch::send_held`] (the worker
    /// sends each loop's queries together).
    pub fn submit(&self, r: &GpuResident, query: &[f32], k: usize, ef: usize) -> Result<GpuPending, Outcome> {
        let k = k.min(self.server.info().k_max);
        let t = Instant::now();
        self.server.submit_held(r.id, &r.metric.prepare_query(query), k, ef).map(|q| GpuPending(q, t)).map_err(outcome)
    }

    /// Sends the queries `submit` held.
    pub fn send_held(&self) -> Result<usize, Outcome> {
        self.server.send_held().map_err(outcome)
    }

    /// Where the query's answer will be in the shared answer area; None
    /// when the server keeps its answers in memory of its own.
    pub fn route(&self, p: &GpuPending) -> Option<Route> {
        self.server.info().answer_area.then(|| p.0.route())
    }

    /// Whether the GPU has finished the query (its answer is then in the
    /// answer area; see `route`).
    pub fn finished(&self, p: &GpuPending) -> bool {
        let Some(s) = shared() else { return false };
        // SAFETY: the server writes its finish words at the area's start
        // (the server runs: `self` holds it).
        unsafe {
            gpu_graph_gpu::search::answers::finished(s.answer_area().0, &self.server.info().answer_layout, &p.0.route())
        }
    }

    /// The answer once the GPU has it, its times recorded in the latency
    /// breakdown.
    pub fn poll(&self, p: &mut GpuPending) -> Result<Option<Hits>, Outcome> {
        let Some(a) = self.server.poll(&mut p.0).map_err(outcome)? else { return Ok(None) };
        if let Some(s) = shared() {
            let l = &s.counters.latency;
            let span_us = l.record_kernel(&a.times);
            l.transport.record(p.1.elapsed().as_micros() as i64 - span_us);
        }
        Ok(Some(a.hits))
    }

    /// A batch of queries (as the user gave them, `dim` values each) for
    /// the batch kernel.
    pub fn submit_batch(
        &self,
        r: &GpuResident,
        queries: &[f32],
        dim: usize,
        k: usize,
        ef: usize,
        width: usize,
    ) -> Result<GpuBatch, Outcome> {
        let k = k.min(self.server.info().k_max);
        let n = queries.len() / dim.max(1);
        // (the persistent kernel searches whole lists: a prefix goes to the batch kernel)
        if n < BATCH_KERNEL_MIN && n <= self.server.info().slots / 2 && width == 0 {
            let singles = queries.chunks_exact(dim).map(|q| self.submit(r, q, k, ef).map(|p| (p.0, None)));
            if let Ok(tickets) = singles.collect::<Result<Vec<_>, Outcome>>() {
                return Ok(GpuBatch::Singles(tickets));
            }
            // no slots for all of them now: the batch kernel
        }
        let submit = |prepared: &[f32]| self.server.submit_batch(r.id, prepared, k, ef, width);
        let sent = if r.metric == Metric::L2 {
            // L2 queries are searched as given: sent straight from the segment
            submit(queries)
        } else {
            // a buffer kept from batch to batch (a fresh one of tens of MB
            // is a page fault every 4 kB)
            let mut prepared = self.prepared.borrow_mut();
            prepared.clear();
            for q in queries.chunks_exact(dim.max(1)) {
                r.metric.prepare_into(q, &mut prepared);
            }
            submit(&prepared)
        };
        sent.map(|t| GpuBatch::Kernel(Box::new(t))).map_err(outcome)
    }

    pub fn poll_batch(&self, b: &mut GpuBatch) -> Result<Option<Vec<Hits>>, Outcome> {
        match b {
            GpuBatch::Kernel(t) => self.server.poll_batch(t).map_err(outcome),
            GpuBatch::Singles(tickets) => {
                for (t, hits) in tickets.iter_mut().filter(|(_, h)| h.is_none()) {
                    match self.server.poll(t).map_err(outcome)? {
                        Some(a) => *hits = Some(a.hits),
                        None => return Ok(None),
                    }
                }
                Ok(Some(tickets.iter_mut().map(|(_, h)| h.take().unwrap_or_default()).collect()))
            }
        }
    }

    /// gpu_graph.inject_fault: a fault inside the kernel.
    pub fn inject_fault(&self) {
        if let Err(e) = self.server.inject_fault() {
            pgrx::log!("gpu_graph search worker: fault injection: {e}");
        }
    }

    /// Err(why) once the server can serve no more (a fault in the kernel, a
    /// lost device, the kernel gone): only a new process gets a new context.
    pub fn health(&self) -> Result<(), String> {
        match self.server.health() {
            Err(e @ (SearchError::Closed | SearchError::Poisoned(_))) => Err(e.to_string()),
            _ => Ok(()),
        }
    }

    pub fn shutdown(&self) {
        let _ = self.server.shutdown();
    }
}
