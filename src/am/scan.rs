//! Index scans (ambeginscan … amendscan): the engine's resumable search over
//! the index's pages, handing out heap TIDs in increasing distance with the
//! exact distance in xs_orderbyvals.
//!
//! The first round may come from the search worker (gpu_graph.search_device,
//! see worker::client); a scan that wants more rows continues on the CPU
//! from the nodes the worker handed out, never returning one twice.

use std::collections::VecDeque;

use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::search::{Hit, Search};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgMemoryContexts;

use super::vector::{check_dim, checked};
use crate::gucs::{EF_SEARCH, ITERATIVE_SCAN};
use crate::storage::codec::payload_to_tid;
use crate::storage::meta::Meta;
use crate::storage::page_store::PageStore;
use crate::types::pgvector::Column;
use crate::worker;

struct ScanState {
    store: Option<PageStore>,
    metric: Metric,
    /// the query as given, for a CPU search after the worker's round
    query: Vec<f32>,
    /// the nodes of the worker's round, when it answered the first one
    handed: Option<Vec<u32>>,
    /// of those, the ones not read from the pages yet (worker::first_round)
    rest: Vec<u32>,
    /// the meta page as the scan read it
    meta: Option<Meta>,
    search: Option<Search>,
    batch: VecDeque<Hit>,
    rounds: u32,
    last: f32,
    /// the query was NULL: rows come in no order with NULL distances
    null_query: bool,
    done: bool,
}

/// The scan's state.
///
/// # Safety
/// `scan` must be a scan ambeginscan started, and the state not otherwise
/// borrowed while the reference lives.
unsafe fn state<'a>(scan: pg_sys::IndexScanDesc) -> &'a mut ScanState {
    // SAFETY: ambeginscan set `opaque` to a ScanState that lives as long as
    // the scan's memory context (the caller's contract).
    unsafe { &mut *((*scan).opaque as *mut ScanState) }
}

#[pg_guard]
pub unsafe extern "C-unwind" fn ambeginscan(
    index: pg_sys::Relation,
    nkeys: i32,
    norderbys: i32,
) -> pg_sys::IndexScanDesc {
    let st = ScanState {
        store: None,
        metric: Metric::L2,
        query: Vec::new(),
        handed: None,
        rest: Vec::new(),
        meta: None,
        search: None,
        batch: VecDeque::new(),
        rounds: 0,
        last: f32::NEG_INFINITY,
        null_query: false,
        done: false,
    };
    let n = norderbys.max(1) as usize;
    // SAFETY: PostgreSQL calls ambeginscan with the open index and the key
    // counts, in the memory context the scan lives in; RelationGetIndexScan
    // returns a scan descriptor allocated there, whose fields are set here.
    unsafe {
        let scan = pg_sys::RelationGetIndexScan(index, nkeys, norderbys);
        // dropped when the scan's memory context goes, also after an ERROR
        (*scan).opaque = PgMemoryContexts::CurrentMemoryContext.leak_and_drop_on_delete(st) as *mut std::ffi::c_void;
        (*scan).xs_orderbyvals = pg_sys::palloc0(n * std::mem::size_of::<pg_sys::Datum>()) as *mut pg_sys::Datum;
        (*scan).xs_orderbynulls = pg_sys::palloc0(n * std::mem::size_of::<bool>()) as *mut bool;
        scan
    }
}

#[pg_guard]
pub unsafe extern "C-unwind" fn amrescan(
    scan: pg_sys::IndexScanDesc,
    _keys: pg_sys::ScanKey,
    _nkeys: i32,
    orderbys: pg_sys::ScanKey,
    norderbys: i32,
) {
    // SAFETY: PostgreSQL calls amrescan on a scan ambeginscan started, with
    // `norderbys` ordering keys (no more than it began with, the size of
    // orderByData); no other borrow of the state is alive in a callback.
    let st = unsafe {
        if !orderbys.is_null() && norderbys > 0 {
            std::ptr::copy(orderbys, (*scan).orderByData, norderbys as usize);
        }
        state(scan)
    };
    st.search = None;
    st.handed = None;
    st.rest = Vec::new();
    st.meta = None;
    st.store = None;
    st.batch.clear();
    st.rounds = 0;
    st.last = f32::NEG_INFINITY;
    st.null_query = false;
    st.done = false;
}

/// Starts the search on the first amgettuple of a (re)scan.
///
/// # Safety
/// `scan` must be a scan ambeginscan started, `st` its state.
unsafe fn start(scan: pg_sys::IndexScanDesc, st: &mut ScanState) {
    // SAFETY: `scan` is a started scan (the caller's contract) of a gpu_graph
    // index, open and locked while the scan runs; with an ordering key,
    // orderByData holds it, its argument a real[] datum unless it is null
    // (the operators take real[]).
    unsafe {
        let index = (*scan).indexRelation;
        if (*scan).numberOfOrderBys == 0 {
            error!("gpu_graph indexes only answer ORDER BY <distance operator> queries");
        }
        count_scan(index);
        // a scan the worker answers reads no page of the index (meta_mirror)
        let mirrored = worker::meta_mirror::for_scan(index);
        let whole = mirrored.is_none();
        let mut meta = mirrored.unwrap_or_else(|| Meta::read_then(index, |m| worker::meta_mirror::seen(index, m)));
        if meta.dim == 0 {
            st.done = true; // nothing indexed yet
            return;
        }
        let key = &*(*scan).orderByData;
        st.metric = meta.metric();
        let mut store = PageStore::new(index, &meta);
        let query: Vec<f32> = if key.sk_flags & pg_sys::SK_ISNULL as i32 != 0 {
            st.null_query = true;
            vec![0.0; meta.dim as usize]
        } else {
            let whence = String::new;
            let v = checked(Column::of_index(index), key.sk_argument, &whence);
            check_dim(meta.dim as usize, v.len(), &whence);
            v.to_vec()
        };
        let ef = EF_SEARCH.get() as usize;
        // a NULL query's rows come in no order: nothing to ask the worker
        let answer = if st.null_query { None } else { worker::first_round(index, &meta, &store, &query, ef) };
        match answer {
            Some(answer) => {
                st.batch = answer.hits.into();
                st.handed = Some(answer.handed);
                st.rest = answer.rest;
                st.rounds = 1;
            }
            None => {
                if !whole {
                    // the CPU's search starts from the page's entry point
                    // and pinned rows, not the cached copy's
                    meta = Meta::read(index);
                    store = PageStore::new(index, &meta);
                }
                st.search = Some(Search::new(&store, st.metric, &query));
            }
        }
        st.query = query;
        st.store = Some(store);
        st.meta = Some(meta);
    }
}

/// pgstat_count_index_scan: one scan of the index in pg_stat_user_indexes'
/// idx_scan (the executor counts the tuples; the scans are the AM's to count).
///
/// # Safety
/// `index` must be an open index.
unsafe fn count_scan(index: pg_sys::Relation) {
    // SAFETY: the caller's contract.
    if let Some(c) = unsafe { crate::storage::buffer::stat_counts(index) } {
        c.t_numscans += 1;
    }
}

#[pg_guard]
pub unsafe extern "C-unwind" fn amgettuple(scan: pg_sys::IndexScanDesc, _dir: pg_sys::ScanDirection::Type) -> bool {
    // SAFETY: PostgreSQL calls amgettuple on a scan ambeginscan started,
    // of an index open and locked while the scan runs; the state is borrowed
    // only here during the call, and xs_orderbyvals and xs_orderbynulls have
    // room for one value (ambeginscan).
    unsafe {
        let st = state(scan);
        if st.store.is_none() && !st.done {
            start(scan, st);
        }
        let mode = ITERATIVE_SCAN.get();
        loop {
            if st.done {
                return false;
            }
            if let Some(hit) = st.batch.pop_front() {
                if !admit::hit(mode, &mut st.last, hit.dist) {
                    continue;
                }
                (*scan).xs_heaptid = payload_to_tid(hit.payload);
                (*scan).xs_recheck = false;
                (*scan).xs_recheckorderby = false;
                *(*scan).xs_orderbyvals = pg_sys::Datum::from(st.metric.to_sql(hit.dist).to_bits());
                *(*scan).xs_orderbynulls = st.null_query;
                return true;
            }
            let store = st.store.as_ref().unwrap();
            if !st.rest.is_empty() {
                // the rest of the worker's round, still the first round
                let rest = std::mem::take(&mut st.rest);
                let meta = st.meta.as_ref().expect("a started scan read its meta page");
                st.batch = worker::verify_nodes(store, meta, &st.query, &rest).into();
                continue;
            }
            if !admit::another_round(mode, st.rounds) {
                return false;
            }
            crate::latch::check_interrupts();
            if st.search.is_none() {
                // the worker answered the first round: go on from its nodes
                worker::cpu_after_worker();
                st.search = Some(Search::resume(store, st.metric, &st.query, st.handed.as_deref().unwrap_or_default()));
            }
            let batch = st.search.as_mut().unwrap().next_round(store, EF_SEARCH.get() as usize);
            st.rounds += 1;
            if batch.is_empty() {
                st.done = true;
                return false;
            }
            st.batch = batch.into();
        }
    }
}

/// What gpu_graph.iterative_scan lets through, for scans and batches alike.
pub mod admit {
    use crate::gucs::IterativeScan;

    /// Whether a search goes on to another round after `rounds` rounds.
    pub fn another_round(mode: IterativeScan, rounds: u32) -> bool {
        mode != IterativeScan::Off || rounds == 0
    }

    /// Whether a hit at `dist` is handed out after the nearest so far at
    /// `last` (strict_order drops one nearer than a row already handed out);
    /// moves `last` on.
    pub fn hit(mode: IterativeScan, last: &mut f32, dist: f32) -> bool {
        if mode == IterativeScan::StrictOrder && dist < *last {
            return false;
        }
        *last = last.max(dist);
        true
    }
}

#[pg_guard]
pub unsafe extern "C-unwind" fn amendscan(scan: pg_sys::IndexScanDesc) {
    // SAFETY: PostgreSQL calls amendscan on a scan ambeginscan started, whose
    // state is borrowed nowhere else during the call.
    unsafe {
        // free the search's memory now rather than with the context
        let st = state(scan);
        st.search = None;
        st.handed = None;
        st.batch = VecDeque::new();
    }
}
