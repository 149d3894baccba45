//! VACUUM: ambulkdelete marks the nodes of dead heap TIDs deleted (so no scan
//! can return them from then on, before the heap reuses those TIDs), then the
//! engine's repair reconnects the lists that pointed at them (on
//! max_parallel_maintenance_workers + 1 threads, one in autovacuum, from a
//! copy of every list and of the vectors it reads when that fits in
//! maintenance_work_mem) and frees them for reuse; amvacuumcleanup reports
//! statistics.

use gpu_graph_engine::repair;
use gpu_graph_engine::store::GraphView;
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::storage::codec::payload_to_tid;
use crate::storage::layout::{FLAG_DELETED, FLAG_FREE};
use crate::storage::meta::Meta;
use crate::storage::page_store::PageStore;

fn stats_or_new(stats: *mut pg_sys::IndexBulkDeleteResult) -> *mut pg_sys::IndexBulkDeleteResult {
    if stats.is_null() {
        // SAFETY: VACUUM calls its index callbacks in a memory context that
        // lasts the whole command, where the result is palloc'd zeroed.
        unsafe { pg_sys::palloc0(std::mem::size_of::<pg_sys::IndexBulkDeleteResult>()) as *mut _ }
    } else {
        stats
    }
}

#[pg_guard]
pub unsafe extern "C-unwind" fn ambulkdelete(
    info: *mut pg_sys::IndexVacuumInfo,
    stats: *mut pg_sys::IndexBulkDeleteResult,
    callback: pg_sys::IndexBulkDeleteCallback,
    callback_state: *mut std::ffi::c_void,
) -> *mut pg_sys::IndexBulkDeleteResult {
    // the repair's threads off the search worker's core, which serves the
    // scans meanwhile
    crate::worker::keep_off_worker_core();
    // (whatever else of VACUUM runs on rayon's global pool: its threads
    // block signals)
    crate::threads::init_rayon();
    // SAFETY: VACUUM calls ambulkdelete with `info` naming the open, locked
    // gpu_graph index and `stats` NULL or its earlier result; `callback` with
    // `callback_state` says whether a heap TID is dead.
    unsafe {
        let stats = stats_or_new(stats);
        let index = (*info).index;
        let meta = Meta::read(index);
        if meta.dim == 0 {
            return stats;
        }
        let callback = callback.expect("ambulkdelete without a callback");
        let store = PageStore::new(index, &meta);
        let mut deleted = Vec::new();
        let mut dead = Vec::new();
        let mut removed = 0.0;
        let n = store.node_count();
        // page by page; the callback only looks the TID up in VACUUM's list
        for start in (0..n).step_by(8192) {
            pg_sys::vacuum_delay_point();
            store.for_each_header(start..(start + 8192).min(n), &mut |node, h| {
                if h.flags & FLAG_FREE != 0 {
                    return; // a free slot names no row
                }
                if h.flags & FLAG_DELETED != 0 {
                    deleted.push(node); // left by an interrupted VACUUM: repair it now
                    return;
                }
                let mut tid = payload_to_tid(h.payload());
                if callback(&mut tid, callback_state) {
                    dead.push(node);
                    removed += 1.0;
                }
            });
        }
        // one record per vector page; the heap reuses none of these TIDs
        // before this VACUUM is done with every index
        store.mark_deleted_many(&dead);
        deleted.extend(dead);
        deleted.sort_unstable();
        (*stats).tuples_removed += removed;
        if !deleted.is_empty() {
            let t = std::time::Instant::now();
            let (r, threads) = repair_deleted(&store, &meta, &deleted);
            // DEBUG1, as CREATE INDEX reports its build (PostgreSQL 15 hands
            // an index's VACUUM DEBUG2 whether VERBOSE or not)
            debug1!(
                "gpu_graph index \"{}\": {} deleted nodes freed, {} lists rebuilt, {} nodes linked again, on {} \
                 thread{} in {:.1} ms",
                crate::am::relation::name_of((*index).rd_id),
                r.freed,
                r.repaired,
                r.relinked,
                threads,
                if threads == 1 { "" } else { "s" },
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        stats
    }
}

/// Lists rebuilt per batch of [`repair::repair_from`]: a cancel waits for at
/// most one batch.
const REPAIR_BATCH: usize = 16_384;

/// The repair's threads: as many as a parallel index build of PostgreSQL
/// may take (max_parallel_maintenance_workers and the leader), one in an
/// autovacuum worker (which PostgreSQL never runs in parallel). On every
/// core, VACUUM's repair took the cores of the scans it ran beside (the
/// delete loop of tests/gpu/worker-writes.sh, docs/benchmarks.md); a
/// session that wants it faster raises max_parallel_maintenance_workers.
fn repair_threads() -> usize {
    // SAFETY: plain reads of this process's settings and type.
    unsafe {
        if pg_sys::MyBackendType == pg_sys::BackendType::B_AUTOVAC_WORKER {
            1
        } else {
            pg_sys::max_parallel_maintenance_workers.max(0) as usize + 1
        }
    }
}

/// The engine's repair of the lists that named `deleted`, and the threads
/// it took: computed on [`repair_threads`] threads from an in-memory copy
/// of every list and of the vectors the repair reads (engine::repair::
/// needed: with few deletes a small share of them) where that copy fits
/// in maintenance_work_mem, else list by list through the buffers (on this
/// thread). (A copy of every vector made a VACUUM of 50 deleted rows of
/// 100k cost 133 ms, most of it allocating and filling that copy.)
fn repair_deleted(store: &PageStore, meta: &Meta, deleted: &[u32]) -> (repair::RepairStats, usize) {
    let (n, sd, degree) = (store.node_count() as usize, store.layout.stored_dim, store.layout.degree);
    // SAFETY: a plain read of this backend's setting (kB).
    let budget = unsafe { pg_sys::maintenance_work_mem } as usize * 1024;
    // the lists (and a byte a node of flags and of the wanted set) first
    let lists = n * (4 * degree + 2);
    if lists <= budget {
        let threads = repair_threads();
        let pool = crate::threads::pool(threads);
        let adjacency = store.adjacency();
        let wanted = repair::needed(&adjacency, degree, deleted, Some(&pool));
        let vectors = wanted.iter().filter(|&&w| w).count() * 4 * sd;
        if let Some(copy) =
            (lists + vectors <= budget).then(|| store.snapshot_of(meta.metric(), adjacency, &wanted)).flatten()
        {
            let r = repair::repair_from(store, &copy, deleted, REPAIR_BATCH, Some(&pool), &mut || {
                crate::latch::check_interrupts();
                // SAFETY: VACUUM's own process, between batches.
                unsafe { pg_sys::vacuum_delay_point() };
            });
            return (r, threads);
        }
    }
    (repair::repair(store, deleted), 1)
}

#[pg_guard]
pub unsafe extern "C-unwind" fn amvacuumcleanup(
    info: *mut pg_sys::IndexVacuumInfo,
    stats: *mut pg_sys::IndexBulkDeleteResult,
) -> *mut pg_sys::IndexBulkDeleteResult {
    // SAFETY: VACUUM calls amvacuumcleanup with `info` naming the open, locked
    // gpu_graph index and `stats` NULL or ambulkdelete's result.
    unsafe {
        if (*info).analyze_only {
            return stats;
        }
        let stats = stats_or_new(stats);
        let index = (*info).index;
        // from the meta page, not a pass over every node (which every VACUUM
        // of the table paid, deletes or not): after ambulkdelete's repair
        // no deleted node is left, so the allocated nodes less the free ones
        // are the live ones (an estimate only if a VACUUM was interrupted)
        let meta = Meta::read(index);
        (*stats).num_index_tuples = (meta.node_count - meta.free_count.min(meta.node_count)) as f64;
        (*stats).num_pages = pg_sys::RelationGetNumberOfBlocksInFork(index, pg_sys::ForkNumber::MAIN_FORKNUM);
        stats
    }
}
