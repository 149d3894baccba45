//! Writing a whole index at once (CREATE INDEX), through a [`BulkWriter`]:
//! pages built in private memory and written to the file in block order,
//! WAL-logged 32 full images to a record where WAL is needed.
//!
//! The vector pages do not depend on the graph, so they are written first —
//! while a GPU build runs, when there is one — skipping each chunk's graph
//! page; once the graph exists the graph pages are written in their places.

use gpu_graph_engine::graph::Graph;
use pgrx::pg_sys;

use super::buffer::{Locked, Xlog};
use super::bulk::BulkWriter;
use super::layout::Layout;
use super::meta::Meta;

/// Writes the meta page and the vector pages of `meta.node_count` nodes, in
/// block order, the graph pages' places skipped. `progress` gets the
/// nodes written so far; it may raise an ERROR (a query cancel).
pub fn write_vector_pages(
    out: &mut BulkWriter,
    meta: &Meta,
    stored: &[f32],
    payloads: &[u64],
    progress: &mut dyn FnMut(u32),
) {
    let layout: Layout = meta.layout();
    let n = payloads.len();
    out.append(&mut |p| p.format_meta(meta));
    let sd = layout.stored_dim;
    for c in 0..n.div_ceil(layout.per_chunk) {
        let first = c * layout.per_chunk;
        let last = (first + layout.per_chunk).min(n);
        out.skip(); // the graph page, written once the graph exists
        for i in 1..layout.pages_per_chunk {
            let lo = first + (i - 1) * layout.per_vector_page;
            let hi = (lo + layout.per_vector_page).min(last);
            out.append(&mut |p| {
                p.format_chunk_page(i, &layout);
                for node in lo..hi {
                    p.put_tuple(&layout, node as u32, payloads[node], 0, &stored[node * sd..(node + 1) * sd]);
                }
            });
        }
        progress(last as u32);
    }
}

/// Writes the graph pages in the places [`write_vector_pages`] skipped.
pub fn write_graph_pages(out: &mut BulkWriter, layout: &Layout, graph: &Graph, progress: &mut dyn FnMut(u32)) {
    let n = graph.len();
    let mut list = Vec::with_capacity(layout.degree);
    for first in (0..n).step_by(layout.per_chunk.max(1)) {
        out.rewrite(layout.graph_block(first as u32), &mut |p| {
            p.format_chunk_page(0, layout);
            for node in first..(first + layout.per_chunk).min(n) {
                list.clear();
                list.extend(graph.neighbors(node as u32));
                p.put_list(layout, node as u32, &list);
            }
        });
        progress((first + layout.per_chunk).min(n) as u32);
    }
}

/// The init fork of an unlogged index: a meta page describing an empty index.
///
/// # Safety
/// `rel` must be an unlogged gpu_graph index without an init fork yet.
pub unsafe fn write_init_fork(rel: pg_sys::Relation, meta: &Meta) {
    // SAFETY: `rel` is open and its init fork new (the caller's contract); the
    // page is written through the record's copy.
    unsafe {
        let b = Locked::extend(rel, pg_sys::ForkNumber::INIT_FORKNUM);
        let mut x = Xlog::start(rel);
        x.register(&b, true).format_meta(meta);
        x.finish();
    }
}
