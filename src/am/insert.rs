//! INSERT / COPY / UPDATE after CREATE INDEX (aminsert): the engine's one
//! insert routine over the index's pages.

use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::{distance, insert};
use pgrx::pg_sys;
use pgrx::prelude::*;

use super::options;
use super::vector::{at_tid, check_dim, check_encodable, check_storage, checked};
use crate::storage::codec::tid_to_payload;
use crate::storage::meta::Meta;
use crate::storage::page_store::PageStore;
use crate::types::pgvector::Column;
use crate::worker;

/// Beam of the neighbour search for a new row: wider than a query's because
/// the new node's list is built from it once and kept.
pub fn insert_ef(degree: usize) -> usize {
    (2 * degree).max(64)
}

#[pg_guard]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C-unwind" fn aminsert(
    index: pg_sys::Relation,
    values: *mut pg_sys::Datum,
    isnull: *mut bool,
    heap_tid: pg_sys::ItemPointer,
    _heap: pg_sys::Relation,
    _check_unique: pg_sys::IndexUniqueCheck::Type,
    _index_unchanged: bool,
    _index_info: *mut pg_sys::IndexInfo,
) -> bool {
    // SAFETY: PostgreSQL calls aminsert with the open, locked gpu_graph index,
    // the datum and null flag of its one column and the new row's heap TID;
    // a non-null datum of the column is of its operator class's type.
    unsafe {
        if *isnull {
            return false;
        }
        let whence = || at_tid(heap_tid);
        let v = checked(Column::of_index(index), *values, &whence);
        let v = &*v;
        let mut meta = Meta::read(index);
        if meta.dim == 0 {
            // an index built on an empty table takes its dimensions from the first row
            let metric = options::metric(index);
            check_storage(meta.element(), v.len());
            meta = {
                Meta::update(index, |m| {
                    if m.dim == 0 {
                        m.dim = v.len() as u32;
                        m.max_norm = distance::norm(v);
                    }
                });
                Meta::read(index)
            };
            debug_assert_eq!(meta.metric(), metric);
        }
        check_dim(meta.dim as usize, v.len(), &whence);
        let metric = meta.metric();
        if !metric.indexable(v) {
            return false; // zero vectors have no direction under cosine
        }
        let mut stored = Vec::with_capacity(meta.stored_dim());
        metric.prepare_stored(v, meta.max_norm, &mut stored);
        check_encodable(meta.element(), &stored);
        let store = PageStore::new(index, &meta);
        let ef = insert_ef(meta.degree as usize);
        // the neighbour search on the GPU when the worker answers it; only
        // nodes the pages have now (the copy may be newer than `meta`)
        let found = worker::insert_neighbours(index, &meta, &stored, ef).map(|mut nodes| {
            let n = Meta::read(index).node_count;
            nodes.retain(|&u| u < n);
            nodes
        });
        let id = insert::insert_near(&store, &stored, tid_to_payload(&*heap_tid), ef, found);
        if metric == Metric::InnerProduct && distance::norm(v) > meta.max_norm {
            // above M its edges are off: searches start from it while there
            // is room among the pinned rows (engine::outliers)
            Meta::update(index, |m| m.pin(id));
        }
        false
    }
}
