//! The GPU search worker's core: one persistent kernel
//! (kernels/search_persistent.cu, after ALGAS, 004_1c495ead554c4546.txt)
//! serving every query of the process, and its host side.
//!
//! ```text
//! let server = SearchServer::start(&gpu, ServerConfig::default())?;
//! let id = server.load(&IndexImage { vectors, stored_dim, adjacency, degree, entry, flags: None, metric })?;
//! let mut t = server.submit(id, &metric.prepare_query(q), k, ef)?;   // any thread
//! let hits: Vec<(f32, u32)> = server.wait(&mut t, timeout)?;        // (search distance, node) ascending
//! ```
//!
//! # Protocol (see the kernel's header comment for the device side)
//! * A fixed grid of `slots x ctas_per_slot` single-warp CTAs, all resident
//!   (sized with the occupancy API; `start` refuses a configuration that
//!   would not be). Idle CTAs back off with `nanosleep` (64 ns, then 0.5 us,
//!   4 us, and `max_sleep_ns` after ~0.3 s idle); the host hands out the
//!   most recently freed slot first (LIFO per group) so busy slots stay hot.
//! * Submit: the request (64-byte header + query) is written to the slot's
//!   pinned staging buffer, copied with cuMemcpyHtoDAsync to the slot's
//!   device buffer, then cuStreamWriteValue32 on the same (non-blocking,
//!   per-group) stream sets the slot's device word to
//!   `seq << 5 | (ctas - 1)`. Stream order puts the request in device
//!   memory before the word changes. The kernel polls only that
//!   device-local word.
//! * Answer: each CTA writes its results to mapped pinned host memory,
//!   fences at system scope and arrives on a device counter; the last one
//!   writes the slot's finish word (host memory) with the same value. The
//!   host polls only that host-local word, then reads the per-CTA lists and
//!   merges them with a heap (dedupe, deleted filtered again on the host).
//! * Sequence numbers instead of None/Work/Finish/Done values: no word is
//!   ever reset, so the host and the GPU never race on one; Done is the
//!   host's own bookkeeping (the slot back in its free list).
//! * Health: a waiting thread asks cuStreamQuery about the kernel's stream
//!   at most once a millisecond; an error (or the kernel having exited)
//!   poisons the server: every call then fails with
//!   [`SearchError::Poisoned`].
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
//! * Spreading a beam over CTAs: see [`SearchPolicy`]; each CTA's list is
//!   ceil(ef / ctas). One CTA = the CPU's beam search exactly (checked by
//!   the CPU model [`sim`] against engine::search).
//! * Start: the entry point, computed by whichever CTA claims it; CTA t
//!   then expands the entry's neighbours j with j % ctas == t, and (with
//!   more than one CTA) `seeds` pseudo-random nodes of its own.
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
//!   for the queries in flight); `update_flags` / `update_flags_batch` for
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
//! # Measured (NVIDIA H200, 132 SMs, driver 580 / CUDA 13.0; 16 host cores)
//! `gpu-graph-searchcheck` on 1M SIFT from `make_sift128.py --rows 1000000`,
//! GRNND graph of degree 32 built on the GPU, k = 10, default policy, 1.5 s
//! per run (latency = submit to answer, host side included):
//!
//! | ef | plan | recall@10 GPU / CPU | 1 thread q/s, p50/p99 us | 16 threads | 64 threads |
//! |----|------|------|------|------|------|
//! | 10 | 1x10 | 0.9666 / 0.9642 | 9.9k, 99/147 | 151k, 104/152 | 399k, 152/286 |
//! | 20 | 2x10 | 0.9854 / 0.9853 | 8.6k, 111/187 | 132k, 116/194 | 379k, 161/291 |
//! | 40 | 3x14 | 0.9950 / 0.9937 | 7.2k, 135/224 | 109k, 141/234 | 357k, 172/286 |
//! | 64 | 4x16 | 0.9974 / 0.9962 | 6.4k, 150/247 | 99k, 155/251 | 335k, 184/296 |
//! | 100 | 4x25 | 0.9981 / 0.9991 | 5.3k, 180/302 | 83k, 186/310 | 290k, 212/349 |
//!
//! 256 slots x 4 CTAs (12 blocks/SM resident at 154 registers and 14.7 KB
//! of shared memory each), fp16 copy of the vectors (exact for SIFT),
//! 367 MiB for the index. Beam extend pays: with beam 1 (no extend) the 64
//! thread throughput at 100k rows fell from 316-395k to 153-248k q/s and
//! p99 rose to 3-6 ms.

pub mod merge;
pub mod plan;
pub mod server;
pub mod sim;

pub use merge::merge_lists;
pub use plan::{QueryPlan, SearchPolicy, ServerConfig, DEFAULT_CTAS_PER_SLOT, FLAG_DELETED};
pub use server::{
    Answer, IndexImage, ResidentId, ResidentInfo, SearchError, SearchServer, ServerInfo, Ticket, SEARCH_KERNEL,
};
