//! Writing a whole index at once (CREATE INDEX). Pages go through shared
//! buffers and are WAL-logged as full page images in batches of 32 as soon as
//! they are filled (no second pass over the relation, as log_newpage_range
//! would make; one record per page costs twice as much).
//!
//! The vector pages do not depend on the graph, so they are written (and
//! logged) first — while a GPU build runs, when there is one — and the graph
//! pages, allocated empty in their place, are filled once the graph exists.

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

fn needs_wal(rel: pg_sys::Relation) -> bool {
    unsafe { (*(*rel).rd_rel).relpersistence as u8 == pg_sys::RELPERSISTENCE_PERMANENT }
}

/// Filled, locked pages waiting to be marked dirty and WAL-logged together.
struct Batch {
    rel: pg_sys::Relation,
    wal: bool,
    pages: Vec<Locked>,
}

impl Batch {
    /// XLR_MAX_BLOCK_ID: the most pages one record can carry.
    const MAX: usize = 32;

    fn new(rel: pg_sys::Relation) -> Batch {
        Batch { rel, wal: needs_wal(rel), pages: Vec::with_capacity(Self::MAX) }
    }
    fn push(&mut self, b: Locked) {
        self.pages.push(b);
        if self.pages.len() == Self::MAX {
            self.flush();
        }
    }
    /// As log_newpage_range does for each group: in a critical section, mark
    /// the buffers dirty and log their images in one record.
    fn flush(&mut self) {
        if self.pages.is_empty() {
            return;
        }
        unsafe {
            let mut blocks: Vec<pg_sys::BlockNumber> =
                self.pages.iter().map(|b| pg_sys::BufferGetBlockNumber(b.buf)).collect();
            let mut images: Vec<pg_sys::Page> = self.pages.iter().map(|b| pg_sys::BufferGetPage(b.buf)).collect();
            pg_sys::CritSectionCount += 1;
            for b in &self.pages {
                pg_sys::MarkBufferDirty(b.buf);
            }
            if self.wal {
                pg_sys::log_newpages(
                    &mut (*self.rel).rd_node,
                    pg_sys::ForkNumber::MAIN_FORKNUM,
                    blocks.len() as i32,
                    blocks.as_mut_ptr(),
                    images.as_mut_ptr(),
                    true,
                );
            }
            pg_sys::CritSectionCount -= 1;
        }
        self.pages.clear(); // unlocks and unpins
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.flush();
        }
    }
}

/// Writes the meta page and every page of `meta.node_count` nodes, vector
/// pages filled and graph pages empty, in block order. `progress` gets the
/// nodes written so far; it may raise an ERROR (a query cancel).
///
/// # Safety
/// `rel` must be a new, empty gpu_graph index relation.
pub unsafe fn write_vector_pages(
    rel: pg_sys::Relation,
    meta: &Meta,
    stored: &[f32],
    payloads: &[u64],
    progress: &mut dyn FnMut(u32),
) {
    let layout: Layout = meta.layout();
    let n = payloads.len();
    let mut batch = Batch::new(rel);
    {
        let b = new_buffer(rel, pg_sys::ForkNumber::MAIN_FORKNUM);
        meta.write_fresh(pg_sys::BufferGetPage(b.buf));
        batch.push(b);
    }
    let sd = layout.stored_dim;
    for c in 0..n.div_ceil(layout.per_chunk) {
        let first = c * layout.per_chunk;
        let last = (first + layout.per_chunk).min(n);
        for i in 0..layout.pages_per_chunk {
            let b = new_buffer(rel, pg_sys::ForkNumber::MAIN_FORKNUM);
            let page = pg_sys::BufferGetPage(b.buf);
            format_chunk_page(page, i, &layout);
            if i > 0 {
                let contents = page_contents(page);
                let lo = first + (i - 1) * layout.per_vector_page;
                let hi = (lo + layout.per_vector_page).min(last);
                for node in lo..hi {
                    let v = &stored[node * sd..(node + 1) * sd];
                    write_vector_tuple(contents.add(layout.vector_offset(node as u32)), payloads[node], 0, v);
                }
                batch.push(b);
            } else {
                // logged when it is filled
                pg_sys::MarkBufferDirty(b.buf);
            }
        }
        progress(last as u32);
    }
    batch.flush();
}

/// Fills the graph pages written empty by [`write_vector_pages`].
///
/// # Safety
/// As for [`write_vector_pages`], after it.
pub unsafe fn write_graph_pages(rel: pg_sys::Relation, layout: &Layout, graph: &Graph, progress: &mut dyn FnMut(u32)) {
    let n = graph.len();
    let mut batch = Batch::new(rel);
    let mut list = Vec::with_capacity(layout.degree);
    for first in (0..n).step_by(layout.per_chunk.max(1)) {
        let b = Locked::read(rel, layout.graph_block(first as u32), true);
        let contents = pg_sys::BufferGetPage(b.buf) as *mut u8;
        let contents = contents.add(super::layout::PAGE_HEADER);
        for node in first..(first + layout.per_chunk).min(n) {
            list.clear();
            list.extend(graph.neighbors(node as u32));
            write_list(contents.add(layout.graph_offset(node as u32)), &list, layout.degree);
        }
        batch.push(b);
        progress((first + layout.per_chunk).min(n) as u32);
    }
    batch.flush();
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
