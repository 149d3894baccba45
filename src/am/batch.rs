//! gpu_graph_search_batch(index, queries, k, ef): the k nearest rows visible
//! to the caller for each row of a two-dimensional real[] of queries, as
//! (query, rank, ctid, distance) rows, query numbered from 1 in the order
//! given, rank from 1 nearest first.
//!
//! Each query is the search an ORDER BY … LIMIT k scan of the index makes on
//! the CPU (rounds of `ef` results, gpu_graph.iterative_scan deciding
//! whether and how later rounds come), with the executor's part done here:
//! a row is returned only when the table has a version of it visible to the
//! caller's snapshot, and its ctid is that version's, so the rows join back
//! to the table by ctid. The same queries through ORDER BY … LIMIT k at the
//! same ef_search on the CPU give the same rows in the same order.
//!
//! Searched in the calling backend, one query after another (the buffer
//! manager is this process's alone); cancel stops it between queries.

use gpu_graph_engine::search::Search;
use pgrx::prelude::*;
use pgrx::{pg_sys, AnyArray};

use super::relation::{name_of, open_gpu_graph_index};
use super::scan::admit;
use super::vector::{check_dim, check_values};
use crate::gucs::{EF_SEARCH, EF_SEARCH_MAX, ITERATIVE_SCAN};
use crate::storage::codec::payload_to_tid;
use crate::storage::meta::Meta;
use crate::storage::page_store::PageStore;
use crate::types::array::{real_matrix, MAX_DIM};

/// The most rows a query may ask for (as ef_search's limit).
const MAX_K: i32 = EF_SEARCH_MAX;

/// One answer row: query, rank, ctid, distance.
type Row = (i32, i32, pg_sys::ItemPointerData, f32);

fn invalid(msg: String) -> ! {
    ereport!(ERROR, PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, msg);
}

#[pg_extern(sql = "
CREATE FUNCTION gpu_graph_search_batch(index regclass, queries real[], k int, ef int DEFAULT NULL)
    RETURNS TABLE (query int, rank int, ctid tid, distance real)
    AS 'MODULE_PATHNAME', 'gpu_graph_search_batch_wrapper' LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION gpu_graph_search_batch(regclass, real[], int, int) IS
    'the k nearest visible rows of each query (a row of the two-dimensional array): query number from 1, rank from 1, the row''s ctid and distance; ef defaults to gpu_graph.ef_search';
")]
fn gpu_graph_search_batch(
    index: Option<pg_sys::Oid>,
    queries: Option<AnyArray>,
    k: Option<i32>,
    ef: Option<i32>,
) -> TableIterator<
    'static,
    (name!(query, i32), name!(rank, i32), name!(ctid, pg_sys::ItemPointerData), name!(distance, f32)),
> {
    // NULL index, queries or k: no rows, as a STRICT function would give
    let (Some(index), Some(queries), Some(k)) = (index, queries, k) else {
        return TableIterator::new(Vec::new());
    };
    if !(1..=MAX_K).contains(&k) {
        invalid(format!("gpu_graph_search_batch: k must be between 1 and {MAX_K}, not {k}"));
    }
    let ef = match ef {
        None => EF_SEARCH.get(),
        Some(e) if (1..=EF_SEARCH_MAX).contains(&e) => e,
        Some(e) => invalid(format!("gpu_graph_search_batch: ef must be between 1 and {EF_SEARCH_MAX}, not {e}")),
    } as usize;
    // SAFETY: a SQL function runs in a transaction with an active snapshot;
    // `queries` is a non-null array datum (AnyArray holds one).
    TableIterator::new(unsafe { search_batch(index, queries.datum(), k as usize, ef) })
}

/// # Safety
/// In a transaction; `queries` a non-null array datum.
unsafe fn search_batch(index: pg_sys::Oid, queries: pg_sys::Datum, k: usize, ef: usize) -> Vec<Row> {
    let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
    // SAFETY: in a transaction (the caller's contract): the index and its
    // table stay open and locked until closed below; an ERROR on the way
    // releases both with the transaction.
    unsafe {
        let rel = open_gpu_graph_index(index, lock, "gpu_graph_search_batch");
        let heap_oid = (*(*rel).rd_index).indrelid;
        let user = pg_sys::GetUserId();
        if pg_sys::pg_class_aclcheck(heap_oid, user, pg_sys::ACL_SELECT as pg_sys::AclMode)
            != pg_sys::AclResult::ACLCHECK_OK
        {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                format!("permission denied for table {}", name_of(heap_oid))
            );
        }
        let (n, dim, values) = match real_matrix(queries) {
            Ok(m) => m,
            Err(e) => crate::am::vector::data_error(e.message()),
        };
        let meta = Meta::read(rel);
        let mut out = Vec::with_capacity(n * k);
        if n > 0 && meta.dim != 0 {
            check_dim(meta.dim as usize, dim, &|| " (queries)".into());
            let heap = pg_sys::table_open(heap_oid, lock);
            let visible = Visible::new(heap);
            let store = PageStore::new(rel, &meta);
            let metric = meta.metric();
            let mode = ITERATIVE_SCAN.get();
            for (i, q) in values.chunks_exact(dim).enumerate() {
                pg_sys::check_for_interrupts!();
                check_values(q, MAX_DIM, &|| format!(" (query {})", i + 1));
                let mut search = Search::new(&store, metric, q);
                let (mut last, mut rounds, mut rank) = (f32::NEG_INFINITY, 0, 0);
                'rounds: while admit::another_round(mode, rounds) {
                    let hits = search.next_round(&store, ef);
                    rounds += 1;
                    if hits.is_empty() {
                        break;
                    }
                    for hit in hits {
                        if !admit::hit(mode, &mut last, hit.dist) {
                            continue;
                        }
                        if let Some(ctid) = visible.version_of(payload_to_tid(hit.payload)) {
                            rank += 1;
                            out.push((i as i32 + 1, rank as i32, ctid, metric.to_sql(hit.dist) as f32));
                            if rank == k {
                                break 'rounds;
                            }
                        }
                    }
                }
            }
            visible.end();
            pg_sys::table_close(heap, lock);
        }
        pg_sys::index_close(rel, lock);
        out
    }
}

/// The table's side of an index scan: which version of a row, if any, the
/// caller's snapshot sees (the executor's heap fetch after amgettuple).
struct Visible {
    heap: pg_sys::Relation,
    fetch: *mut pg_sys::IndexFetchTableData,
    slot: *mut pg_sys::TupleTableSlot,
    snapshot: pg_sys::Snapshot,
}

impl Visible {
    /// # Safety
    /// `heap` open and locked while this lives, in a transaction with an
    /// active snapshot.
    unsafe fn new(heap: pg_sys::Relation) -> Visible {
        // SAFETY: the table AM's index-fetch callbacks on an open table
        // (the caller's contract); the slot is the table's own kind.
        unsafe {
            let fetch = ((*(*heap).rd_tableam).index_fetch_begin.unwrap())(heap);
            let slot = pg_sys::table_slot_create(heap, std::ptr::null_mut());
            Visible { heap, fetch, slot, snapshot: pg_sys::GetActiveSnapshot() }
        }
    }

    /// Ends the fetches (an ERROR before leaves the buffer pin and the
    /// slot to the transaction's abort).
    fn end(self) {
        // SAFETY: made in new() for the table still open; ended once.
        unsafe {
            pg_sys::ExecDropSingleTupleTableSlot(self.slot);
            ((*(*self.heap).rd_tableam).index_fetch_end.unwrap())(self.fetch);
        }
    }

    /// The ctid of the version of the row at `tid` (a HOT chain's root, as
    /// the index holds it) that the snapshot sees.
    fn version_of(&self, mut tid: pg_sys::ItemPointerData) -> Option<pg_sys::ItemPointerData> {
        let (mut call_again, mut all_dead) = (false, false);
        // SAFETY: fetch and slot were made for `heap`, open while self
        // lives; an MVCC snapshot sees at most one version, so call_again
        // stays false.
        unsafe {
            let fetch_tuple = (*(*self.heap).rd_tableam).index_fetch_tuple.unwrap();
            fetch_tuple(self.fetch, &mut tid, self.snapshot, self.slot, &mut call_again, &mut all_dead)
                .then(|| (*self.slot).tts_tid)
        }
    }
}
