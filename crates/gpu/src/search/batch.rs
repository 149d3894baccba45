//! The large-batch search: many queries against one resident index in one
//! launch of `search_batch` (kernels/search_persistent.cu), one single-warp
//! CTA a query, on its own stream beside the persistent kernel.
//!
//! The persistent kernel is built for latency (a query's beam spread over
//! several CTAs, a slot word per query, an answer per query to mapped host
//! memory); a batch needs none of that: its queries go to the device in one
//! copy, each is searched by one CTA (the CPU's beam search, as a one-CTA
//! plan of the persistent kernel is), and the answers come back in one copy.
//! The persistent kernel keeps its resident blocks, so single queries keep
//! their slots while a batch runs; the batch's blocks take what the SMs
//! have left and wait for room.
//!
//! Decisions where the papers are silent:
//! * Visited tables: one per block of the launch (not per query), entries
//!   tagged with a generation as the persistent kernel's are; block b's
//!   j-th query uses generation `visit_base + j`, and `visit_base` moves past
//!   every launch, so no table is cleared between queries or batches (all
//!   are zeroed when the 32-bit generation would wrap).
//! * Launches are serialised on the batch stream (they share the tables);
//!   several tickets may be in flight, each ordered after the patches the
//!   index had when it was submitted, as a single query is.
//! * Deleted nodes: the kernel skips those flagged on the device; the host
//!   filters again with its own flags when it collects, as for single
//!   queries (a node is never returned once `update_flags` returned).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{result, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use parking_lot::Mutex;

use super::launch::err_name;
use super::merge::merge_lists;
use super::plan::QueryPlan;
use super::registry::{Registry, Resident};
use crate::abi::{self, BatchParams};
use crate::device::{function, Gpu};
use crate::error::{cuda, GpuError};
use crate::memory::{device_addr, zeroed};

/// Each query's (search distance, node), ascending, distinct, no deleted node.
pub type BatchAnswers = Vec<Vec<(f32, u32)>>;

pub(crate) struct BatchKernel {
    func: CudaFunction,
    stream: Arc<CudaStream>,
    /// one table of 2^visited_log2 entries per block
    visited: CudaSlice<u64>,
    pub blocks: usize,
    pub visited_log2: u32,
    /// entries of the index table
    n_indexes: u32,
    /// generation of the next launch's first queries (never 0: zeroed
    /// entries are generation 0)
    next_base: Mutex<u32>,
    /// the patches this stream is ordered after
    waited: AtomicU64,
    /// the host side of a batch's queries when the kernel's rows differ
    /// from them (kept: see `submit`)
    rows: Mutex<Vec<f32>>,
}

/// Dynamic shared memory of one batch CTA.
fn smem_bytes(qwords: usize, list: usize) -> usize {
    abi::search_smem_bytes(qwords as u32, list as u32) as usize
}

impl BatchKernel {
    /// The batch kernel of the persistent kernel's module, with `blocks`
    /// visited tables; launched once empty here, before the persistent
    /// kernel starts (a first launch while it runs may wait for the
    /// context to go idle: see SearchServer::start).
    pub fn new(
        gpu: &Gpu,
        module: &Arc<CudaModule>,
        blocks: usize,
        visited_log2: u32,
        max_smem: usize,
        indexes: u64,
        n_indexes: usize,
    ) -> Result<BatchKernel, GpuError> {
        let func = function(module, "search_batch")?;
        if max_smem > 48 * 1024 {
            func.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                max_smem as i32,
            )
            .map_err(|e| cuda("raising the batch kernel's shared memory", e))?;
        }
        let stream = gpu.ctx.new_stream().map_err(|e| cuda("creating the batch stream", e))?;
        let visited = zeroed::<u64>(&stream, blocks << visited_log2, "the batch visited tables")?;
        let k = BatchKernel {
            func,
            stream,
            visited,
            blocks,
            visited_log2,
            n_indexes: n_indexes as u32,
            next_base: Mutex::new(1),
            waited: AtomicU64::new(0),
            rows: Mutex::new(Vec::new()),
        };
        let p = BatchParams { indexes, visited: device_addr(&k.visited), visited_log2, ..BatchParams::default() };
        k.launch(p, 1, smem_bytes(8, 1))?;
        k.stream.synchronize().map_err(|e| cuda("the batch kernel's first launch", e))?;
        Ok(k)
    }

    /// Resident blocks per SM of the batch kernel at `smem` bytes each, and
    /// the registers of one of its threads.
    pub fn occupancy(module: &Arc<CudaModule>, smem: usize) -> Result<(usize, usize), GpuError> {
        let f = function(module, "search_batch")?;
        let blocks =
            f.occupancy_max_active_blocks_per_multiprocessor(32, smem, None).map_err(|e| cuda("occupancy", e))?;
        let regs = f
            .get_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)
            .map_err(|e| cuda("the batch kernel's registers", e))?;
        Ok((blocks as usize, regs as usize))
    }

    pub fn device_bytes(blocks: usize, visited_log2: u32) -> usize {
        blocks << visited_log2 << 3
    }

    fn launch(&self, params: BatchParams, blocks: usize, smem: usize) -> Result<(), GpuError> {
        let cfg =
            LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: smem as u32 };
        let mut b = self.stream.launch_builder(&self.func);
        b.arg(&params);
        // SAFETY: the one parameter is abi.h's BatchParams (layout checked);
        // its buffers live until the launch's event completed (the ticket
        // holds them) and the tables as long as this kernel.
        unsafe { b.launch(cfg) }.map_err(|e| cuda("launching search_batch", e))?;
        Ok(())
    }

    /// Sends `n` prepared queries (`res.dim` values each) for their `k`
    /// nearest under `plan` (one CTA: `plan.list` is the beam), through the
    /// first `width` entries of each list (0: whole lists).
    pub fn submit(
        &self,
        registry: &Registry,
        res: Arc<Resident>,
        queries: &[f32],
        k: usize,
        plan: &QueryPlan,
        width: usize,
    ) -> Result<BatchTicket, GpuError> {
        let t0 = std::time::Instant::now();
        let n = queries.len() / res.dim;
        let qwords = res.fmt.qwords;
        let s = &self.stream;
        let mut d_queries = zeroed::<f32>(s, n * qwords, "a batch's queries")?;
        let copied = if qwords == res.dim && !res.ip {
            // the kernel's rows are the prepared queries as they are
            s.memcpy_htod(queries, &mut d_queries)
        } else {
            // padded (and the inner product's last coordinate zeroed) in a
            // buffer kept from batch to batch: a fresh one of tens of MB is
            // a page fault every 4 kB
            let mut rows = self.rows.lock();
            rows.clear();
            rows.resize(n * qwords, 0.0);
            for (row, q) in rows.chunks_exact_mut(qwords).zip(queries.chunks_exact(res.dim)) {
                res.query_row(q, row);
            }
            s.memcpy_htod(&rows[..], &mut d_queries)
        };
        copied.map_err(|e| cuda("copying a batch's queries", e))?;
        // ResultHit pairs (distance bits, node)
        let hits = zeroed::<u32>(s, 2 * n * k, "a batch's answers")?;
        let counts = zeroed::<u32>(s, n, "a batch's answer counts")?;
        // the index's patches so far land before the batch starts
        let (epoch, patched) = registry.patched();
        if epoch > self.waited.load(Ordering::Acquire) {
            s.wait(patched).map_err(|e| cuda("waiting for a patch", e))?;
            self.waited.fetch_max(epoch, Ordering::AcqRel);
        }
        let per_block = n.div_ceil(self.blocks.max(1)) as u32;
        let blocks = n.min(self.blocks).max(1);
        let mut base = self.next_base.lock();
        if (*base as u64) + per_block as u64 >= u32::MAX as u64 {
            // the generations would wrap: old entries could look current
            let bytes = self.visited.len() * 8;
            // SAFETY: the whole of `visited`, on the stream that uses it.
            unsafe { result::memset_d8_async(device_addr(&self.visited), 0, bytes, s.cu_stream()) }
                .map_err(|e| cuda("clearing the batch visited tables", e))?;
            *base = 1;
        }
        let params = BatchParams {
            indexes: registry.table_addr(),
            queries: device_addr(&d_queries),
            visited: device_addr(&self.visited),
            hits: device_addr(&hits),
            counts: device_addr(&counts),
            n_indexes: self.n_indexes,
            index: res.table,
            gen: res.gen,
            n: n as u32,
            qwords: qwords as u32,
            k: k as u32,
            list: plan.list,
            max_expand: plan.max_expand.max(1),
            offset_beam: plan.offset_beam,
            beam: plan.beam_width.max(1),
            visited_log2: self.visited_log2,
            visit_base: *base,
            width: width.min(res.degree) as u32,
            pad0: 0,
        };
        let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let started = s.context().new_event(timed).map_err(|e| cuda("creating an event", e))?;
        let done = s.context().new_event(timed).map_err(|e| cuda("creating an event", e))?;
        started.record(s).map_err(|e| cuda("recording a batch's start", e))?;
        self.launch(params, blocks, smem_bytes(qwords, plan.list as usize))?;
        *base += per_block;
        drop(base);
        done.record(s).map_err(|e| cuda("recording a batch's end", e))?;
        let submit_ms = t0.elapsed().as_secs_f64() * 1e3;
        Ok(BatchTicket { res, n, k, _queries: d_queries, hits, counts, started, done, submit_ms, stream: s.clone() })
    }
}

/// A batch on its way. Dropping it unanswered is safe: its buffers are
/// freed in stream order, after the kernel.
pub struct BatchTicket {
    res: Arc<Resident>,
    n: usize,
    k: usize,
    _queries: CudaSlice<f32>,
    hits: CudaSlice<u32>,
    counts: CudaSlice<u32>,
    started: CudaEvent,
    done: CudaEvent,
    submit_ms: f64,
    stream: Arc<CudaStream>,
}

impl BatchTicket {
    pub fn len(&self) -> usize {
        self.n
    }
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Ok(None) while the GPU works; the answers once it is done: each
    /// query's (search distance, node), ascending, distinct, no deleted
    /// node. Err: the driver's error (a fault in the kernel).
    pub(crate) fn poll(&self) -> Result<Option<BatchAnswers>, String> {
        // SAFETY: a live event of this ticket.
        match unsafe { sys::cuEventQuery(self.done.cu_event()) } {
            CUresult::CUDA_ERROR_NOT_READY => return Ok(None),
            CUresult::CUDA_SUCCESS => {}
            e => return Err(format!("the batch search failed: {}", err_name(e))),
        }
        let s = &self.stream;
        let mut counts = vec![0u32; self.n];
        let mut hits = vec![0u32; 2 * self.n * self.k];
        // the kernel is done: these copies wait for nothing else
        s.memcpy_dtoh(&self.counts, &mut counts).map_err(|e| format!("reading a batch's answers: {e:?}"))?;
        s.memcpy_dtoh(&self.hits, &mut hits).map_err(|e| format!("reading a batch's answers: {e:?}"))?;
        s.synchronize().map_err(|e| format!("reading a batch's answers: {e:?}"))?;
        if counts.contains(&abi::OUT_BAD_INDEX) {
            return Err("the batch kernel found no such index".into());
        }
        let res = &self.res;
        let mut list = Vec::with_capacity(self.k);
        Ok(Some(
            counts
                .iter()
                .zip(hits.chunks_exact(2 * self.k))
                .map(|(&c, h)| {
                    list.clear();
                    list.extend(
                        h[..2 * (c as usize).min(self.k)].chunks_exact(2).map(|h| (f32::from_bits(h[0]), h[1])),
                    );
                    merge_lists(&[&list], self.k, |v| res.is_result(v))
                })
                .collect(),
        ))
    }

    /// Host milliseconds `submit` took (queries laid out and copied, the
    /// launch), and the kernel's milliseconds (device clock) once done.
    pub fn timing(&self) -> (f64, Option<f64>) {
        let kernel = self.started.elapsed_ms(&self.done).ok().map(|ms| ms as f64);
        (self.submit_ms, kernel)
    }
}
