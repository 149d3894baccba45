//! Writing a whole index at once (CREATE INDEX): pages filled in shared
//! buffers without per-page WAL, then WAL-logged in bulk with
//! log_newpage_range, as pgvector does at the end of its builds.

use gpu_graph_engine::graph::Graph;
use pgrx::pg_sys;

use super::buffer::{page_contents, Locked, Xlog};
use super::layout::Layout;
use super::meta::Meta;
use super::page_store::{format_chunk_page, write_list, write_vector_tuple};

unsafe fn new_buffer(rel: pg_sys::Relation, fork: pg_sys::ForkNumber::Type) -> Locked {
    let buf = pg_sys::ReadBufferExtended(
        rel,
        fork,
        pg_sys::InvalidBlockNumber, // P_NEW
        pg_sys::ReadBufferMode::RBM_NORMAL,
        std::ptr::null_mut(),
    );
    pg_sys::LockBuffer(buf, pg_sys::BUFFER_LOCK_EXCLUSIVE as i32);
    Locked { buf }
}

/// Writes the meta page and every node of `graph` (vectors `stored`, one
/// payload per node) into the empty relation `rel`. Returns the number of
/// blocks written. Not WAL-logged: call [`log_all`] after.
///
/// # Safety
/// `rel` must be a new, empty gpu_graph index relation.
pub unsafe fn write_index(rel: pg_sys::Relation, meta: &Meta, graph: &Graph, stored: &[f32], payloads: &[u64], progress: &mut dyn FnMut(u32)) -> u32 {
    let layout: Layout = meta.layout();
    let n = payloads.len();
    {
        let b = new_buffer(rel, pg_sys::ForkNumber::MAIN_FORKNUM);
        let page = pg_sys::BufferGetPage(b.buf);
        meta.write_fresh(page);
        pg_sys::MarkBufferDirty(b.buf);
    }
    let sd = layout.stored_dim;
    let chunks = n.div_ceil(layout.per_chunk);
    for c in 0..chunks {
        let first = c * layout.per_chunk;
        let last = (first + layout.per_chunk).min(n);
        for i in 0..layout.pages_per_chunk {
            let b = new_buffer(rel, pg_sys::ForkNumber::MAIN_FORKNUM);
            let page = pg_sys::BufferGetPage(b.buf);
            format_chunk_page(page, i, &layout);
            let contents = page_contents(page);
            if i == 0 {
                for node in first..last {
                    let list: Vec<u32> = graph.neighbors(node as u32).collect();
                    write_list(contents.add(layout.graph_offset(node as u32)), &list, layout.degree);
                }
            } else {
                let lo = first + (i - 1) * layout.per_vector_page;
                let hi = (lo + layout.per_vector_page).min(last);
                for node in lo..hi {
                    let v = &stored[node * sd..(node + 1) * sd];
                    write_vector_tuple(contents.add(layout.vector_offset(node as u32)), payloads[node], 0, v);
                }
            }
            pg_sys::MarkBufferDirty(b.buf);
        }
        progress((last) as u32);
    }
    layout.blocks_for(n as u32)
}

/// WAL-logs every block of a freshly written index (permanent relations only).
///
/// # Safety
/// `rel` must be an open index relation holding `blocks` blocks.
pub unsafe fn log_all(rel: pg_sys::Relation, blocks: u32) {
    if (*(*rel).rd_rel).relpersistence as u8 == pg_sys::RELPERSISTENCE_PERMANENT {
        pg_sys::log_newpage_range(rel, pg_sys::ForkNumber::MAIN_FORKNUM, 0, blocks, true);
    }
}

/// The init fork of an unlogged index: a meta page describing an empty index.
///
/// # Safety
/// `rel` must be an unlogged gpu_graph index without an init fork yet.
pub unsafe fn write_init_fork(rel: pg_sys::Relation, meta: &Meta) {
    let b = new_buffer(rel, pg_sys::ForkNumber::INIT_FORKNUM);
    let mut x = Xlog::start(rel);
    let page = x.register(&b, true);
    meta.write_fresh(page);
    x.finish();
}
