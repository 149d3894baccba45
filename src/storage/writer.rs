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

use super::buffer::{Locked, Xlog};
use super::codec::PageMut;
use super::layout::Layout;
use super::meta::Meta;

fn needs_wal(rel: pg_sys::Relation) -> bool {
    // SAFETY: an open relation's relcache entry (every caller's `rel`) has its pg_class row.
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

    /// # Safety
    /// `rel` must be an open index relation, open while the batch lives.
    unsafe fn new(rel: pg_sys::Relation) -> Batch {
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
        let mut blocks: Vec<pg_sys::BlockNumber> = self.pages.iter().map(Locked::block).collect();
        // SAFETY: `rel` is open (Batch::new's contract); every buffer in the
        // batch is pinned and locked exclusively, and no view of its page
        // lives any more (the writers' end before they push). No ERROR can
        // come between marking the buffers dirty and logging them: a
        // critical section makes one a PANIC, as in log_newpage_range.
        unsafe {
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
    // SAFETY: `rel` is open (the caller's contract).
    let mut batch = unsafe { Batch::new(rel) };
    // SAFETY: `rel` is a new index no other backend can see, so extending it
    // needs no lock; each new page is locked exclusively and written through
    // its one view, which ends before the page joins the batch.
    let new_page = |format: &mut dyn FnMut(&mut PageMut)| unsafe {
        let b = Locked::extend(rel, pg_sys::ForkNumber::MAIN_FORKNUM);
        format(&mut b.page_mut());
        b
    };
    batch.push(new_page(&mut |p| p.format_meta(meta)));
    let sd = layout.stored_dim;
    for c in 0..n.div_ceil(layout.per_chunk) {
        let first = c * layout.per_chunk;
        let last = (first + layout.per_chunk).min(n);
        // the graph page, logged when it is filled
        let graph = new_page(&mut |p| p.format_chunk_page(0, &layout));
        // SAFETY: the buffer is pinned and locked exclusively (`graph`).
        unsafe { pg_sys::MarkBufferDirty(graph.buf) };
        drop(graph);
        for i in 1..layout.pages_per_chunk {
            let lo = first + (i - 1) * layout.per_vector_page;
            let hi = (lo + layout.per_vector_page).min(last);
            batch.push(new_page(&mut |p| {
                p.format_chunk_page(i, &layout);
                for node in lo..hi {
                    p.put_tuple(&layout, node as u32, payloads[node], 0, &stored[node * sd..(node + 1) * sd]);
                }
            }));
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
    // SAFETY: `rel` is open (the caller's contract).
    let mut batch = unsafe { Batch::new(rel) };
    let mut list = Vec::with_capacity(layout.degree);
    for first in (0..n).step_by(layout.per_chunk.max(1)) {
        // SAFETY: the graph page exists (write_vector_pages wrote it); it is
        // locked exclusively and written through its one view, which ends
        // before the page joins the batch.
        let b = unsafe { Locked::read(rel, layout.graph_block(first as u32), true) };
        {
            // SAFETY: as above.
            let mut page = unsafe { b.page_mut() };
            for node in first..(first + layout.per_chunk).min(n) {
                list.clear();
                list.extend(graph.neighbors(node as u32));
                page.put_list(layout, node as u32, &list);
            }
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
    // SAFETY: `rel` is open and its init fork new (the caller's contract); the
    // page is written through the record's copy.
    unsafe {
        let b = Locked::extend(rel, pg_sys::ForkNumber::INIT_FORKNUM);
        let mut x = Xlog::start(rel);
        x.register(&b, true).format_meta(meta);
        x.finish();
    }
}
