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
//! Searched in the calling backend: one query after another through the
//! buffers, or, for a batch large enough to pay for it, the first rounds on
//! all cores from an in-memory copy of the index (`copy_for`; the same
//! search on the same lists and vectors, so the same rows). Visibility is
//! checked on the main thread (the buffer manager is its alone); cancel
//! stops it between queries, or chunks of them on all cores.

use gpu_graph_engine::cfs::Algorithm;
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::search::{Hit, Search};
use gpu_graph_engine::store::{GraphView, Prefix, Visit};
use pgrx::prelude::*;
use pgrx::{pg_sys, AnyArray};
use rayon::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use super::relation::{name_of, open_gpu_graph_index};
use super::scan::admit;
use super::vector::{check_dim, check_values};
use crate::gucs::{IterativeScan, BATCH_PREFIX, EF_SEARCH, EF_SEARCH_MAX, ITERATIVE_SCAN};
use crate::storage::codec::payload_to_tid;
use crate::storage::meta::Meta;
use crate::storage::page_store::PageStore;
use crate::types::array::{real_matrix, MAX_DIM};
use crate::worker;

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

/// Entries of each list a batch searches: gpu_graph.batch_prefix, or the
/// index's choice (TSDG orders each list so that a prefix is itself a good
/// smaller list: half of it for batches; whole lists on other graphs).
fn prefix(meta: &Meta, degree: usize) -> usize {
    match BATCH_PREFIX.get() {
        0 if matches!(meta.cfs(), Some(Algorithm::Tsdg { .. })) => degree.div_ceil(2),
        0 => degree,
        p => (p as usize).min(degree),
    }
}

/// Queries searched together: the first rounds of a chunk run on all cores
/// (from a copy), then the main thread checks visibility and goes on where
/// a query needs more rounds; a cancel waits for at most one chunk.
const CHUNK: usize = 1024;

/// Batches at least this large may search on all cores from an in-memory
/// copy of the index (see `copy_for`).
const PARALLEL_MIN_QUERIES: usize = 256;

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
        // (grown as rows come: n × k can be far more than a batch returns)
        let mut out = Vec::with_capacity(n.saturating_mul(k).min(1 << 16));
        if n > 0 && meta.dim != 0 {
            check_dim(meta.dim as usize, dim, &|| " (queries)".into());
            let heap = pg_sys::table_open(heap_oid, lock);
            let store = PageStore::new(rel, &meta);
            let mut batch = Batch {
                store: &store,
                meta: &meta,
                visible: Visible::new(heap),
                metric: meta.metric(),
                mode: ITERATIVE_SCAN.get(),
                k,
                ef,
                out: &mut out,
            };
            // the worker takes a segment of queries at a time; the
            // CPU (from a copy, or the pages) whatever it does not answer
            let mut copy: Option<Option<Rc<Copy>>> = None;
            let per = worker::batch_segment(dim);
            // one shared-memory segment for all of them (kept by the worker too)
            let width = prefix(&meta, store.layout.degree);
            // (the worker is told 0 for whole lists)
            let prefix_only = if width < store.layout.degree { width } else { 0 };
            let mut call = worker::BatchCall::new(k, ef, prefix_only, n.min(per));
            let pages = Prefix { graph: &store, width };
            for (s, segment) in values.chunks(dim * per).enumerate() {
                let queries: Vec<&[f32]> = segment.chunks_exact(dim).collect();
                for (j, q) in queries.iter().enumerate() {
                    check_values(q, MAX_DIM, &|| format!(" (query {})", s * per + j + 1));
                }
                if let Some(answers) = worker::batch_first_rounds(rel, &meta, &store, &queries, &mut call) {
                    // the rows the answers will most likely return, looked up
                    // page by page of the table first
                    batch.visible.prefetch(answers.iter().flat_map(|a| a.hits.iter().take(k)).map(|h| h.payload));
                    let firsts = answers.into_iter().map(|a| First {
                        search: None,
                        hits: a.hits,
                        handed: a.handed,
                        rest: a.rest,
                    });
                    batch.answer(&pages, s * per + 1, &queries, firsts.collect(), false);
                    continue;
                }
                let copy = copy.get_or_insert_with(|| copy_for(rel, &store, &meta, n, ef));
                for (c, chunk) in queries.chunks(CHUNK).enumerate() {
                    let first = s * per + c * CHUNK + 1;
                    match copy {
                        Some(copy) => {
                            let copy = Prefix { graph: &**copy, width };
                            let rounds: Vec<_> =
                                chunk.par_iter().map(|q| first_round(&copy, batch.metric, q, ef)).collect();
                            batch.answer(&copy, first, chunk, rounds, true);
                        }
                        None => {
                            for (j, q) in chunk.iter().enumerate() {
                                let round = first_round(&pages, batch.metric, q, ef);
                                batch.answer(&pages, first + j, &chunk[j..=j], vec![round], false);
                            }
                        }
                    }
                }
            }
            batch.visible.end();
            pg_sys::table_close(heap, lock);
        }
        pg_sys::index_close(rel, lock);
        out
    }
}

/// An in-memory copy of the index to search on all cores, where that pays:
/// more than one core, a batch of at least PARALLEL_MIN_QUERIES whose
/// searches visit more nodes than the copy reads (a query visits about ef
/// times the degree), and a copy within maintenance_work_mem (as VACUUM's).
/// Kept for the rest of the transaction while the index's generation and
/// node count stay as they were, so the chunks of gpu_graph_knn_join (one
/// batch each) copy the index once.
fn copy_for(rel: pg_sys::Relation, store: &PageStore, meta: &Meta, queries: usize, ef: usize) -> Option<Rc<Copy>> {
    crate::threads::init_rayon();
    let nodes = store.node_count() as usize;
    let (sd, degree) = (store.layout.stored_dim, store.layout.degree);
    // SAFETY: a plain read of this backend's setting (kB).
    let budget = unsafe { pg_sys::maintenance_work_mem } as usize * 1024;
    let pays = rayon::current_num_threads() > 1
        && queries >= PARALLEL_MIN_QUERIES
        && queries.saturating_mul(ef * degree) >= nodes
        && FlatIndex::bytes_for(nodes, sd, degree) <= budget;
    if !pays {
        return None;
    }
    // SAFETY: `rel` is the open index `store` reads.
    let node = unsafe { (*rel).rd_node };
    let key = (node.spcNode.to_u32(), node.dbNode.to_u32(), node.relNode.to_u32(), meta.generation, meta.node_count);
    if let Some(copy) = CACHED.with_borrow(|c| c.as_ref().filter(|(k, _)| *k == key).map(|(_, copy)| copy.clone())) {
        return Some(copy);
    }
    CACHED.with_borrow_mut(|c| *c = None); // the old one goes before the new one is made
    let mut seeds = Vec::new();
    store.seeds(&mut seeds);
    let copy = Rc::new(Copy { flat: store.snapshot(meta.metric())?, seeds });
    register_forget();
    CACHED.with_borrow_mut(|c| *c = Some((key, copy.clone())));
    Some(copy)
}

/// Which index, at which generation and node count, a copy was made of.
type CopyKey = (u32, u32, u32, u64, u32);

thread_local! {
    /// The last copy this backend made, until its transaction ends.
    static CACHED: RefCell<Option<(CopyKey, Rc<Copy>)>> = const { RefCell::new(None) };
}

/// Drops the cached copy when the transaction ends (registered once).
fn register_forget() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: a backend may register transaction callbacks at any time; the
    // callback lives as long as the library.
    ONCE.call_once(|| unsafe { pg_sys::RegisterXactCallback(Some(forget), std::ptr::null_mut()) });
}

#[pg_guard]
unsafe extern "C-unwind" fn forget(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    if matches!(
        event,
        XACT_EVENT_COMMIT
            | XACT_EVENT_ABORT
            | XACT_EVENT_PREPARE
            | XACT_EVENT_PARALLEL_COMMIT
            | XACT_EVENT_PARALLEL_ABORT
    ) {
        CACHED.with_borrow_mut(|c| *c = None);
    }
}

/// The index in memory, searched as its pages are (the same entry point,
/// seeds, lists, vectors and flags); a hit's payload is its node id, the
/// pages give its row.
struct Copy {
    flat: FlatIndex,
    seeds: Vec<u32>,
}

impl GraphView for Copy {
    fn stored_dim(&self) -> usize {
        self.flat.stored_dim()
    }
    fn degree(&self) -> usize {
        self.flat.degree()
    }
    fn node_count(&self) -> u32 {
        self.flat.node_count()
    }
    fn entry(&self) -> Option<u32> {
        self.flat.entry()
    }
    fn seeds(&self, out: &mut Vec<u32>) {
        out.extend_from_slice(&self.seeds);
    }
    fn visit<F: FnOnce(&[f32]) -> f32>(&self, node: u32, dist: F) -> Option<Visit> {
        self.flat.visit(node, dist)
    }
    fn neighbors(&self, node: u32, out: &mut Vec<u32>) {
        self.flat.neighbors(node, out)
    }
}

/// A query's first round of results, and how to go on: its search, or
/// (answered by the worker) the nodes handed out, from which a search on
/// the pages resumes.
struct First {
    search: Option<Search>,
    hits: Vec<Hit>,
    handed: Vec<u32>,
    /// the worker's nodes not yet read from the pages
    rest: Vec<u32>,
}

/// A query's search and its first round of results.
fn first_round<G: GraphView>(g: &G, metric: Metric, q: &[f32], ef: usize) -> First {
    let mut search = Search::new(g, metric, q);
    let hits = search.next_round(g, ef);
    First { search: Some(search), hits, handed: Vec::new(), rest: Vec::new() }
}

/// What turns searches into answer rows.
struct Batch<'a> {
    /// the index's pages and meta page
    store: &'a PageStore,
    meta: &'a Meta,
    visible: Visible,
    metric: Metric,
    mode: IterativeScan,
    k: usize,
    ef: usize,
    out: &'a mut Vec<Row>,
}

impl Batch<'_> {
    /// The rows of queries `first`, `first` + 1, …, each from its first
    /// round: hits as iterative_scan lets them through, those with a
    /// visible version, further rounds (on `g`, where the search ran: the
    /// pages for a worker's answer) until k rows or none left, as an ORDER
    /// BY scan with LIMIT k.
    ///
    /// Hits found on a copy (`on_copy`) are nodes: each is read again from
    /// its page for its row and its distance now (a node VACUUM freed or
    /// reused since the copy was taken is then skipped, or answers for its
    /// new row). A worker's hits were checked against the pages already.
    fn answer<G: GraphView>(&mut self, g: &G, first: usize, queries: &[&[f32]], firsts: Vec<First>, on_copy: bool) {
        let store = self.store;
        for (j, mut f) in firsts.into_iter().enumerate() {
            crate::latch::check_interrupts();
            let prepared = on_copy.then(|| self.metric.prepare_query(queries[j]));
            let (mut last, mut rounds, mut rank) = (f32::NEG_INFINITY, 1, 0);
            let mut hits = std::mem::take(&mut f.hits);
            'rounds: loop {
                if hits.is_empty() && f.rest.is_empty() {
                    break;
                }
                for mut hit in hits.drain(..) {
                    if let Some(q) = &prepared {
                        let m = self.metric;
                        match store.visit(hit.node, |x| m.search_distance(q, x)) {
                            Some(v) if !v.deleted => (hit.payload, hit.dist) = (v.payload, v.dist),
                            _ => continue,
                        }
                    }
                    if !admit::hit(self.mode, &mut last, hit.dist) {
                        continue;
                    }
                    if let Some(ctid) = self.visible.version_of(hit.payload) {
                        rank += 1;
                        self.out.push(((first + j) as i32, rank, ctid, self.metric.to_sql(hit.dist) as f32));
                        if rank as usize == self.k {
                            break 'rounds;
                        }
                    }
                }
                if !f.rest.is_empty() {
                    // the rest of the worker's answer, read from the pages now
                    hits = worker::verify_nodes(store, self.meta, queries[j], &std::mem::take(&mut f.rest));
                    continue;
                }
                if !admit::another_round(self.mode, rounds) {
                    break;
                }
                let search = f.search.get_or_insert_with(|| {
                    // the worker answered the first round: go on from its nodes
                    worker::cpu_after_worker();
                    Search::resume(g, self.metric, queries[j], &f.handed)
                });
                hits = search.next_round(g, self.ef);
                rounds += 1;
            }
        }
    }
}

/// The table's side of an index scan: which version of a row, if any, the
/// caller's snapshot sees (the executor's heap fetch after amgettuple).
struct Visible {
    heap: pg_sys::Relation,
    fetch: *mut pg_sys::IndexFetchTableData,
    slot: *mut pg_sys::TupleTableSlot,
    snapshot: pg_sys::Snapshot,
    /// versions looked up ahead (`prefetch`), by the payload of the TID
    known: HashMap<u64, Option<pg_sys::ItemPointerData>>,
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
            Visible { heap, fetch, slot, snapshot: pg_sys::GetActiveSnapshot(), known: HashMap::new() }
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

    /// Looks up the rows of these payloads in TID order, so that the
    /// table AM keeps each heap page pinned for all the rows on it (a
    /// batch's answers share pages); `version_of` then answers from them.
    /// Replaces what an earlier call looked up.
    fn prefetch(&mut self, payloads: impl Iterator<Item = u64>) {
        let mut all: Vec<u64> = payloads.collect();
        all.sort_unstable();
        all.dedup();
        self.known.clear();
        for p in all {
            let v = self.fetch_version(payload_to_tid(p));
            self.known.insert(p, v);
        }
    }

    /// The ctid of the version of the row of `payload` (a HOT chain's
    /// root, as the index holds it) that the snapshot sees.
    fn version_of(&self, payload: u64) -> Option<pg_sys::ItemPointerData> {
        match self.known.get(&payload) {
            Some(&v) => v,
            None => self.fetch_version(payload_to_tid(payload)),
        }
    }

    fn fetch_version(&self, mut tid: pg_sys::ItemPointerData) -> Option<pg_sys::ItemPointerData> {
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

// the table form, over this function (sql/knn_join.sql says why it is SQL)
extension_sql_file!("../../sql/knn_join.sql", name = "knn_join", requires = [gpu_graph_search_batch]);
