//! The GPU search worker: one background worker that owns the CUDA context
//! and answers the first search round of every backend's index scans from
//! copies of the indexes in GPU memory (or, in the test mode
//! gpu_graph.worker_device = cpu, with the engine's CPU search over copies in
//! its own memory), through a ring of query slots in shared memory.
//!
//! - [`shmem`]: the shared memory (header, counters, slots) and its hooks
//! - [`ring`]: a query slot's layout and state machine
//! - [`client`]: the backend's side (submit, wait on the latch, verify)
//! - [`bgworker`]: the worker process (registration, main loop, exits)
//! - [`residency`], [`image`]: the index copies (engine::flat::FlatIndex) and
//!   reading them from pages
//! - [`changes`]: the pages backends changed, which the copies follow
//! - [`device`], [`gpu`]: what the worker searches with
//! - [`own_core`]: the core the worker keeps to itself
//! - [`outcome`]: how a scan's first round went, end to end
//! - [`stats`]: counters, gpu_graph_worker_stats()
//!
//! The worker is an accelerator, never a dependency: whenever it is absent,
//! busy, slow, has no current copy, or fails, the scan searches on the CPU
//! as it would without it.

mod batch_area;
mod bgworker;
mod changes;
mod client;
mod device;
mod gpu;
mod gpu_builds;
mod image;
mod latency;
pub mod meta_mirror;
mod outcome;
mod own_answer;
mod own_core;
mod profile;
mod residency;
mod ring;
mod rows;
mod shmem;
mod stats;

use crate::latch::{nap, sleep};
use pgrx::pg_sys;

pub use changes::{List as ChangedList, PageChange, LIST_IN_LOG, ROW_IN_LOG};
pub use client::{batch_first_rounds, batch_segment, first_round, insert_neighbours, verify_nodes, BatchCall};
pub use gpu_builds::GpuBuild;
pub use stats::{index_info, SearchInfo};

/// Index pages a backend changed (storage's Xlog), with the one list or
/// row each wrote when it did: noted for the worker's copies.
///
/// # Safety
/// `rel` must be an open relation.
pub unsafe fn note_changes(
    rel: pg_sys::Relation,
    pages: &[PageChange],
    lists: &[Option<ChangedList>],
    rows: &[Option<&[u8]>],
) {
    // SAFETY: the caller's contract.
    unsafe { changes::note(rel, pages, lists, rows) }
}

/// Keeps this backend, and the threads it starts from now on, off the
/// core the search worker keeps to itself (gpu_graph.worker_core): for
/// work beside the searches that would take every core, VACUUM's repair.
pub fn keep_off_worker_core() {
    if let Some(s) = shmem::shared() {
        own_core::keep_off(s.worker_core());
    }
}

/// A scan the worker answered first goes on searching on the CPU.
pub fn cpu_after_worker() {
    stats::add(&stats::counters().cpu_after_worker, 1);
}

/// From _PG_init in every process: a transaction that wrote index pages
/// publishes them to the worker before it commits (see `changes`).
pub fn register_callbacks() {
    changes::register();
}

/// From _PG_init while shared_preload_libraries loads: shared memory, and
/// the worker when it is wanted.
pub fn preload() {
    let registered = bgworker::wanted();
    if registered {
        bgworker::register();
    }
    shmem::install(registered);
}

/// Wakes the process with this PGPROC number (a stale number wakes some
/// other process once, which latches allow).
fn set_latch(procno: i32) {
    // SAFETY: ProcGlobal and its allProcs array are set up at server start
    // and live as long as the shared memory; the index is checked against
    // allProcCount, and SetLatch may be called on any process's latch.
    unsafe {
        let global = pg_sys::ProcGlobal;
        if procno >= 0 && (procno as u32) < (*global).allProcCount {
            pg_sys::SetLatch(&raw mut (*(*global).allProcs.add(procno as usize)).procLatch);
        }
    }
}
