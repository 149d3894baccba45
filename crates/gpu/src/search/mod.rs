//! The GPU search worker's core: one persistent kernel
//! (kernels/search_persistent.cu, after "ALGAS: A Low-latency GPU-Based
//! Approximate Nearest Neighbor Search System") serving every query of the
//! process, and its host side.
//!
//! ```text
//! let server = SearchServer::start(&gpu, ServerConfig::default())?;
//! let id = server.load(&flat_index)?;                                // engine::flat::FlatIndex
//! let mut t = server.submit(id, &metric.prepare_query(q), k, ef)?;  // any thread
//! let hits: Vec<(f32, u32)> = server.wait(&mut t, timeout)?.hits;   // (search distance, node) ascending
//! ```
//!
//! The parts: [`plan`] (configuration, query plans, the server's sizes),
//! [`launch`] (the kernel and its one parameter struct, abi.h's
//! SearchParams), [`slots`] (the slot protocol), [`registry`] (the resident
//! indexes; [`scatter`]: a patch's copies applied by a kernel), [`health`] (closed or poisoned), [`server`] (the facade),
//! [`merge`] (the host's merge of the CTAs' lists) and [`sim`] (a CPU model
//! of one query of the kernel).
//!
//! # Protocol (see [`slots`], and the kernel's header comment for the device side)
//! * A fixed grid of `slots x ctas_per_slot` single-warp CTAs, all resident
//!   (sized with the occupancy API; `start` refuses a configuration that
//!   would not be). Idle CTAs back off with `nanosleep` (64 ns, then 0.5 us,
//!   4 us, and `max_sleep_ns` after ~0.3 s idle); the host hands out the
//!   most recently freed slot first (LIFO per group) so busy slots stay hot.
//! * Submit and answer: see [`slots`].
//! * Health: a waiting thread asks cuStreamQuery about the kernel's stream
//!   at most once a millisecond; an error (or the kernel having exited)
//!   poisons the server: every call then fails with
//!   [`server::SearchError::Poisoned`].
//!
//! # Decisions where the paper is silent
//! * Visited set: a per-slot open-addressing table of (query seq << 32 |
//!   node) entries, not a bitmap. Entries of older queries count as empty,
//!   so the table is never cleared between queries (no barrier among the
//!   CTAs, and none of the paper's clear-while-others-mark race), and its
//!   size follows the work of one query, not the index: one table serves
//!   every resident index, 10M-node indexes included (a bitmap would need
//!   n/8 bytes per slot per index and a race-free clear). Cost: a load plus
//!   one 64-bit CAS per new node. On a full probe run a node counts as
//!   unvisited (a duplicate at worst; the host drops duplicates).
//! * Spreading a beam over CTAs: see [`plan::SearchPolicy`]; each CTA's list is
//!   ceil(ef / ctas). One CTA, beam 1, no seeds and no scan = the CPU's beam search exactly
//!   (checked by the CPU model [`sim`] against engine::search).
//! * Start (the default): a scan of a fixed sample, node j * n / scan;
//!   CTA t measures its share (j % ctas == t), keeps the nearest as its
//!   list and claims them. With no scan: the entry point, computed by
//!   whichever CTA claims it; CTA t then expands the entry's neighbours j
//!   with j % ctas == t, and its share of the query's `seeds` start nodes,
//!   node j * n / seeds. Either is the same sample for every query.
//! * Iteration cap: cap_factor * list + cap_extra expansions per CTA.
//! * Deleted nodes occupy list places and are expanded (the graph stays
//!   navigable) but are never written out; the host filters again with its
//!   own copy of the flags, so a node is never returned once
//!   `update_flags` returned.
//! * Index data is read through L2 only (ld.global.cg): the kernel never
//!   relaunches, so nothing would invalidate L1 when an unload and a load
//!   reuse an address.
//! * Errors: Busy, Timeout, Invalid and Closed leave the server usable;
//!   Poisoned does not, and after a kernel fault nothing in the process can
//!   use CUDA again (CUDA's rule for illegal-address and trap errors): the
//!   worker exits cleanly and is restarted. Measured: a fault is seen within
//!   ~0.2 s (the health check), every call then fails, shutdown and drop
//!   return, and a fresh process serves again.

//! # What the worker must do
//! * Open the [`crate::Gpu`] and `start` the server before anything else
//!   launches kernels in that process, and launch no kernel for the first
//!   time while it runs (CUDA's lazy module loading may then wait for a
//!   context that never idles): keep GPU index builds out of the worker, or
//!   set CUDA_MODULE_LOADING=EAGER.
//! * Load an index with its stored vectors (as prepared on the pages),
//!   adjacency, entry point and deleted flags; key the [`ResidentId`] by
//!   (database, relfilenode, generation); `unload` on eviction (it waits
//!   up to 100 ms for the queries in flight; one held longer keeps the
//!   memory until it is answered or dropped); `update_flags` /
//!   `update_flags_batch` for
//!   deletes (the host copy filters at once).
//! * Per query: `Metric::prepare_query`, `submit` (or `submit_in_group`
//!   with one host thread per group), `wait` with what is left of
//!   gpu_timeout; Busy, Timeout, Invalid, Closed: search on the CPU
//!   instead. A ticket dropped unanswered frees its slot by itself once the
//!   GPU finishes. Distances are search distances (`Metric::to_sql`).
//! * Rows inserted after the load are not on the GPU: merge with a CPU
//!   search of the newer nodes, or reload.
//! * Poisoned: drop everything and exit the worker process; it is restarted
//!   (bgw_restart_time) and backends use the CPU meanwhile.
//!
//! Measurements of plans and throughput: docs/benchmarks.md.

pub mod answers;
pub mod batch;
mod doorbell;
mod health;
mod launch;
pub mod merge;
pub mod plan;
mod registry;
mod scatter;
pub mod server;
pub mod sim;
mod slots;

pub use batch::{BatchAnswers, BatchTicket};
pub use merge::merge_lists;
pub use plan::{HalfRows, QueryPlan, SearchPolicy, ServerConfig, DEFAULT_CTAS_PER_SLOT};
pub use registry::{Patch, ResidentId, ResidentInfo};
pub use server::{SearchError, SearchServer, ServerInfo, Ticket};
pub use slots::{Answer, KernelTimes};
