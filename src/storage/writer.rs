//! Writing a whole index at once (CREATE INDEX), through a [`BulkWriter`]:
//! pages built in private memory and written to the file in block order,
//! WAL-logged 32 full images to a record where WAL is needed.
//!
//! The vector pages do not depend on the graph, so they are written first —
//! while a GPU build runs, when there is one — skipping each chunk's graph
//! page; once the graph exists the graph pages are written in their places.

use gpu_graph_engine::graph::Graph;
use pgrx::pg_sys;

use super::bulk::BulkWriter;
use super::layout::Layout;
use super::meta::Meta;

/// The vector pages of nodes handed over in node order, each chunk written
/// as soon as all its rows are there: the same pages whether the rows come
/// at once (after a serial scan) or batch by batch (a parallel scan's
/// workers', while they scan). Block 0 is left for [`write_meta`], the
/// graph pages' places for [`write_graph_pages`].
pub struct VectorPages {
    layout: Layout,
    /// rows of the chunk not yet whole
    stored: Vec<f32>,
    payloads: Vec<u64>,
    /// nodes whose pages are queued
    pub written: usize,
}

impl VectorPages {
    /// Starts the index: `out` must have numbered no block yet.
    pub fn new(out: &mut BulkWriter, layout: Layout) -> VectorPages {
        out.skip(); // the meta page, once the node count is known
        VectorPages { layout, stored: Vec::new(), payloads: Vec::new(), written: 0 }
    }

    /// Takes the next rows; `progress` gets the nodes written so far and
    /// may raise an ERROR (a query cancel).
    pub fn push(&mut self, out: &mut BulkWriter, stored: &[f32], payloads: &[u64], progress: &mut dyn FnMut(u32)) {
        let (sd, per_chunk) = (self.layout.stored_dim, self.layout.per_chunk);
        let (mut stored, mut payloads) = (stored, payloads);
        if !self.payloads.is_empty() {
            let take = (per_chunk - self.payloads.len()).min(payloads.len());
            self.stored.extend_from_slice(&stored[..take * sd]);
            self.payloads.extend_from_slice(&payloads[..take]);
            (stored, payloads) = (&stored[take * sd..], &payloads[take..]);
            if self.payloads.len() < per_chunk {
                return;
            }
            let (s, p) = (std::mem::take(&mut self.stored), std::mem::take(&mut self.payloads));
            self.chunk(out, &s, &p, progress);
            (self.stored, self.payloads) = (s, p);
            self.stored.clear();
            self.payloads.clear();
        }
        let whole = payloads.len() / per_chunk * per_chunk;
        for first in (0..whole).step_by(per_chunk) {
            let last = first + per_chunk;
            self.chunk(out, &stored[first * sd..last * sd], &payloads[first..last], progress);
        }
        self.stored.extend_from_slice(&stored[whole * sd..]);
        self.payloads.extend_from_slice(&payloads[whole..]);
    }

    /// The rows handed over so far.
    pub fn taken(&self) -> usize {
        self.written + self.payloads.len()
    }

    /// Writes the last, partial chunk; the nodes written in all.
    pub fn finish(&mut self, out: &mut BulkWriter, progress: &mut dyn FnMut(u32)) -> usize {
        if !self.payloads.is_empty() {
            let (s, p) = (std::mem::take(&mut self.stored), std::mem::take(&mut self.payloads));
            self.chunk(out, &s, &p, progress);
        }
        self.written
    }

    /// One chunk's vector pages (at most `per_chunk` rows), its graph page skipped.
    fn chunk(&mut self, out: &mut BulkWriter, stored: &[f32], payloads: &[u64], progress: &mut dyn FnMut(u32)) {
        let layout = &self.layout;
        let (first, sd) = (self.written, layout.stored_dim);
        // here, on rows about to be converted (in cache), not in a pass of its own
        crate::am::vector::check_encodable(layout.element, stored);
        debug_assert_eq!(layout.graph_block(first as u32), out.next_block(), "chunks are written in node order");
        out.skip(); // the graph page, written once the graph exists
                    // every vector page of the chunk, the last chunk's empty ones too
                    // (formatted free for the nodes inserts add)
        for page in 1..layout.pages_per_chunk {
            let lo = ((page - 1) * layout.per_vector_page).min(payloads.len());
            let hi = (lo + layout.per_vector_page).min(payloads.len());
            out.append(&mut |p| {
                p.format_chunk_page(page, layout);
                for i in lo..hi {
                    p.put_tuple(layout, (first + i) as u32, payloads[i], 0, &stored[i * sd..(i + 1) * sd]);
                }
            });
        }
        self.written += payloads.len();
        progress(self.written as u32);
    }
}

/// Writes the meta page in the place [`VectorPages::new`] left.
pub fn write_meta(out: &mut BulkWriter, meta: &Meta) {
    out.rewrite(0, &mut |p| p.format_meta(meta));
}

/// Writes the graph pages in the places [`VectorPages`] skipped.
pub fn write_graph_pages(out: &mut BulkWriter, layout: &Layout, graph: &Graph, progress: &mut dyn FnMut(u32)) {
    write_lists(out, layout, 0, graph.len(), &graph.adjacency, progress);
}

/// Writes the graph pages of nodes `first..` (a chunk's first node) from
/// their lists (`degree` ids a node, NO_NODE-padded), `n` nodes in the
/// index: a whole graph at once, or a paged build's merge batch by batch
/// (batches of whole chunks).
pub fn write_lists(
    out: &mut BulkWriter,
    layout: &Layout,
    first: usize,
    n: usize,
    lists: &[u32],
    progress: &mut dyn FnMut(u32),
) {
    assert_eq!(first % layout.per_chunk.max(1), 0, "gpu_graph: lists written from a chunk's first node");
    let (degree, last) = (layout.degree, first + lists.len() / layout.degree.max(1));
    let mut list = Vec::with_capacity(degree);
    for chunk in (first..last).step_by(layout.per_chunk.max(1)) {
        let end = (chunk + layout.per_chunk).min(n);
        assert!(end <= last || last == n, "gpu_graph: lists of part of a chunk");
        out.rewrite(layout.graph_block(chunk as u32), &mut |p| {
            p.format_chunk_page(0, layout);
            for node in chunk..end {
                let at = (node - first) * degree;
                list.clear();
                list.extend(lists[at..at + degree].iter().copied().take_while(|&x| x != gpu_graph_engine::NO_NODE));
                p.put_list(layout, node as u32, &list);
            }
        });
        progress(end as u32);
    }
}

/// The init fork of an unlogged index: a meta page describing an empty index.
///
/// # Safety
/// `rel` must be an unlogged gpu_graph index without an init fork yet.
pub unsafe fn write_init_fork(rel: pg_sys::Relation, meta: &Meta) {
    // SAFETY: `rel` is open and its init fork new and empty (the caller's
    // contract); no other process sees the fork.
    let mut out = unsafe { BulkWriter::for_fork(rel, pg_sys::ForkNumber::INIT_FORKNUM) };
    out.append(&mut |p| p.format_meta(meta));
    out.finish_synced();
}
