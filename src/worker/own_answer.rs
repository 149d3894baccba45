//! A scan reads its own answer where the GPU wrote it.
//!
//! The GPU worker's search server writes its answers (each CTA's hits, each
//! hit's row beside it, then the finish word) into an area of PostgreSQL's
//! shared memory, page-locked and mapped into the device by the worker; every
//! backend maps the same memory at the same address. Once the worker has
//! started a scan's search it publishes where the answer will be (its route,
//! ring::Slot::publish), and the scan, polling, reads it there as soon as the
//! finish word says so: the worker does not collect, merge, reply or wake
//! for it. At 64 clients its one thread was the limit (3.4-3.6 us a request,
//! 60-70% of it answering: docs/benchmarks.md). A scan that sleeps on its
//! latch says so (ring::Slot::sleep) and the worker answers it as before.
//!
//! Who reads an answer is decided by one compare-and-swap out of WORKING
//! (ring.rs), so the worker frees a GPU slot only after its scan has read it
//! (COLLECTED). A worker that restarts recovers the ring before its server
//! takes the area; a scan that sees the worker changed reads nothing here.

use std::sync::atomic::{AtomicU32, Ordering};

use gpu_graph_gpu::search::answers::{self, AnswerLayout};
use gpu_graph_gpu::search::KernelTimes;

use super::ring::Slot;
use super::shmem::Shared;

/// Host pages (the area is registered with the driver in whole pages).
pub const PAGE: usize = 4096;

/// Bytes of the answer area: enough for the worker's server at its most
/// slots (the device decides how many it takes).
pub fn area_bytes() -> usize {
    answers::area_bytes(&super::gpu::server_config()).map_or(0, |b| b.next_multiple_of(PAGE))
}

/// The layout the serving worker's server writes the area in (its fields;
/// `slots` 0: none, the scans never read the area).
#[repr(C)]
pub struct Published([AtomicU32; 6]);

impl Published {
    /// The worker, once its server runs in the area: before it publishes
    /// any route (a route's release store then carries these).
    pub fn publish(&self, l: AnswerLayout) {
        let v = [l.slots, l.finish_stride, l.result_stride, l.cta_block, l.k_max, l.results_at];
        for (w, v) in self.0.iter().zip(v) {
            w.store(v, Ordering::Relaxed);
        }
    }

    fn get(&self) -> AnswerLayout {
        let v: [u32; 6] = std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed));
        AnswerLayout {
            slots: v[0],
            finish_stride: v[1],
            result_stride: v[2],
            cta_block: v[3],
            k_max: v[4],
            results_at: v[5],
        }
    }
}

/// What a scan read of its answer: (search distance, node, row) nearest
/// first, with the kernel's clock of the search.
pub struct Own {
    pub hits: Vec<(f32, u32, u64)>,
    pub times: KernelTimes,
}

/// Backend, polling request `seq` in `slot` (submitted while the worker
/// had started `starts` times): its answer, read from the area, once the
/// GPU has finished it and the worker left it to the scan; None while not
/// (the worker's reply then comes as before). Err: an answer that made no
/// sense (the scan falls back).
pub fn take(shared: &Shared, slot: &Slot, seq: u64, starts: u64) -> Option<Result<Own, String>> {
    let route = slot.route(seq)?;
    let l = shared.answers.get();
    if route.slot >= l.slots {
        return None;
    }
    let (area, len) = shared.answer_area();
    if l.bytes() > len {
        return None;
    }
    // SAFETY: the area is live shared memory of `len` bytes; the layout is
    // the one its server writes in (published before the route, whose
    // acquire load above carries it).
    if !unsafe { answers::finished(area, &l, &route) } {
        return None;
    }
    // a worker that started again since the request may have reused the
    // area: the request is its old worker's, whose answer this is not
    if shared.worker_starts.load(Ordering::Acquire) != starts || !slot.collect(seq) {
        return None;
    }
    // SAFETY: the finish word said this query (acquire); the slot is
    // COLLECTING, so the worker keeps the GPU slot until COLLECTED below.
    let read = unsafe { answers::read(area.add(l.results_at as usize), &l, &route) }
        .map(|b| Own { hits: b.merged_rows(|_| true), times: b.times });
    slot.collected(seq);
    Some(read)
}

/// The kernel's clock of an answer a scan read itself, into the latency
/// breakdown (which the worker records for those it answers): one in
/// KERNEL_SAMPLE a backend, as these histograms are not sharded.
pub fn record_kernel(own: &Own) {
    static SEEN: AtomicU32 = AtomicU32::new(0);
    if !SEEN.fetch_add(1, Ordering::Relaxed).is_multiple_of(KERNEL_SAMPLE) {
        return;
    }
    super::stats::counters().latency.record_kernel(&own.times);
}

const KERNEL_SAMPLE: u32 = 8;
