//! The engine's storage traits over the index's buffers: the one search,
//! insert and repair routine of the engine runs on PostgreSQL pages through
//! this, under buffer locks and generic WAL records (`buffer::Xlog`).
//!
//! Lock order: a graph page may be held exclusively while vector pages are
//! read (insert re-prunes a list under its lock); a vector page lock is never
//! held while another lock is taken, so no cycle can form. The meta page is
//! taken first when taken at all (freeing and reusing a slot hold it while
//! they lock the slot's vector page).

use std::cell::{Cell, RefCell};

use gpu_graph_engine::filter::Filter;
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::store::{GraphMut, GraphView, Visit};
use gpu_graph_engine::NO_NODE;
use pgrx::pg_sys;

use super::buffer::{Locked, Xlog};
use super::codec::{Tuple, VectorHeader};
use super::corrupt::corrupted;
use super::layout::{Layout, FLAG_DELETED, FLAG_FREE};
use super::meta::Meta;

pub struct PageStore {
    /// an open gpu_graph index, for as long as the store is used
    pub rel: pg_sys::Relation,
    pub layout: Layout,
    /// an f16 vector widened for the distance function
    scratch: RefCell<Vec<f32>>,
    /// node ids below this exist (the meta page's count when last read):
    /// a list naming one above it is checked against the meta page again
    known: Cell<u32>,
    /// inner product's pinned outliers as the meta page named them when the
    /// store was made (a scan's store lives one scan)
    pinned: Vec<u32>,
    /// the graph's filter and order, for inserts and VACUUM's repair
    filter: Filter,
    order: Option<Filter>,
}

impl PageStore {
    /// # Safety
    /// `rel` must be an open gpu_graph index whose meta page `meta` was read
    /// from, and stay open while the store is used.
    pub unsafe fn new(rel: pg_sys::Relation, meta: &Meta) -> PageStore {
        PageStore {
            rel,
            layout: meta.layout(),
            scratch: RefCell::new(Vec::new()),
            known: Cell::new(meta.node_count),
            pinned: meta.pinned().collect(),
            filter: meta.filter(),
            order: meta.order(),
        }
    }

    /// ERROR (index corrupted) if `list`, read from `node`'s graph page, names
    /// a node the index does not have (nodes allocated since `known` was
    /// read are fine): no search may follow it off the end of the relation.
    fn check_ids(&self, node: u32, list: &[u32]) {
        // SAFETY: `rel` is an open gpu_graph index (new's contract).
        let count = unsafe { Meta::read(self.rel).node_count };
        self.known.set(count);
        if let Some(u) = list.iter().find(|&&u| u >= count) {
            // SAFETY: as above.
            unsafe {
                corrupted(
                    self.rel,
                    self.layout.graph_block(node),
                    format!("the list of node {node} names node {u}, beyond the index's {count}"),
                )
            };
        }
    }

    /// Sets flags on a node's vector tuple, WAL-logged; returns the old flags.
    fn set_flags(&self, node: u32, f: impl FnOnce(u16) -> u16) -> u16 {
        // SAFETY: `rel` is open (PageStore::new's contract); the buffer is
        // locked exclusively and changed only through the record's copy.
        unsafe {
            let b = Locked::read(self.rel, self.layout.vector_block(node), true);
            let mut x = Xlog::start(self.rel);
            let old = x.register(&b, false).set_flags(&self.layout, node, f);
            x.only(node..node + 1);
            x.finish();
            old
        }
    }

    /// Appends a new chunk's pages; the caller holds the meta page exclusively,
    /// which serialises allocation.
    fn extend_chunk(&self, first_node: u32) {
        let expected = self.layout.graph_block(first_node);
        // SAFETY: `rel` is open (PageStore::new's contract); the relation
        // extension lock serialises extension with other backends, and each
        // new page is written only through its record's copy.
        unsafe {
            pg_sys::LockRelationForExtension(self.rel, pg_sys::ExclusiveLock as i32);
            for i in 0..self.layout.pages_per_chunk {
                let b = Locked::extend(self.rel, pg_sys::ForkNumber::MAIN_FORKNUM);
                let got = b.block();
                if got != expected + i as u32 {
                    pgrx::error!(
                        "gpu_graph: index has unexpected block {got} (expected {}); REINDEX it",
                        expected + i as u32
                    );
                }
                let mut x = Xlog::start(self.rel);
                x.register(&b, true).format_chunk_page(i, &self.layout);
                x.finish();
            }
            pg_sys::UnlockRelationForExtension(self.rel, pg_sys::ExclusiveLock as i32);
        }
    }
}

impl PageStore {
    /// [`GraphView::visit`] of many nodes, each vector page read once for
    /// all the nodes on it (a batch's answers: one pin and share lock per
    /// page, not per node): `dist(i, vector)` is node i's distance; the
    /// visits in the order of `nodes`.
    pub fn visit_many(&self, nodes: &[u32], mut dist: impl FnMut(usize, &[f32]) -> f32) -> Vec<Option<Visit>> {
        let mut order: Vec<(u32, u32)> =
            nodes.iter().enumerate().map(|(i, &v)| (self.layout.vector_block(v), i as u32)).collect();
        order.sort_unstable();
        let mut out = vec![None; nodes.len()];
        let mut scratch = self.scratch.borrow_mut();
        for run in order.chunk_by(|a, b| a.0 == b.0) {
            // SAFETY: as in visit: `rel` is open; the page is read under the
            // share lock of `b`, which lives through the run.
            unsafe {
                let b = Locked::read(self.rel, run[0].0, false);
                let page = b.page();
                for &(_, i) in run {
                    let i = i as usize;
                    out[i] = page.tuple(&self.layout, nodes[i]).visit(&mut scratch, |x| dist(i, x));
                }
            }
        }
        out
    }
}

impl GraphView for PageStore {
    fn stored_dim(&self) -> usize {
        self.layout.stored_dim
    }
    fn degree(&self) -> usize {
        self.layout.degree
    }
    fn node_count(&self) -> u32 {
        // SAFETY: `rel` is an open gpu_graph index (PageStore::new's contract).
        unsafe { Meta::read(self.rel).node_count }
    }
    fn entry(&self) -> Option<u32> {
        // SAFETY: as in node_count.
        unsafe { Meta::read(self.rel).entry() }
    }
    fn adjacency(&self) -> Vec<u32> {
        let (n, degree) = (self.node_count() as usize, self.layout.degree);
        let mut out = vec![NO_NODE; n * degree];
        for first in (0..n).step_by(self.layout.per_chunk) {
            let last = (first + self.layout.per_chunk).min(n);
            // SAFETY: as in neighbors; one share lock for the chunk's lists
            unsafe {
                let b = Locked::read(self.rel, self.layout.graph_block(first as u32), false);
                for v in first..last {
                    out[v * degree..(v + 1) * degree].copy_from_slice(b.page().list(&self.layout, v as u32));
                }
            }
        }
        out
    }
    fn seeds(&self, out: &mut Vec<u32>) {
        out.extend_from_slice(&self.pinned);
    }
    fn filter(&self) -> Filter {
        self.filter
    }
    fn order(&self) -> Option<Filter> {
        self.order
    }
    fn visit<F: FnOnce(&[f32]) -> f32>(&self, node: u32, dist: F) -> Option<Visit> {
        // SAFETY: `rel` is open (PageStore::new's contract); the view lives
        // under the share lock of `b`, and this process does not write the
        // buffer meanwhile.
        unsafe {
            let b = Locked::read(self.rel, self.layout.vector_block(node), false);
            b.page().tuple(&self.layout, node).visit(&mut self.scratch.borrow_mut(), dist)
        }
    }
    fn neighbors(&self, node: u32, out: &mut Vec<u32>) {
        out.clear();
        // SAFETY: as in visit.
        unsafe {
            let b = Locked::read(self.rel, self.layout.graph_block(node), false);
            out.extend(b.page().neighbors(&self.layout, node));
        }
        let known = self.known.get();
        if out.iter().any(|&u| u >= known) {
            self.check_ids(node, out);
        }
    }
    fn lists_of(&self, nodes: &[u32], f: &mut dyn FnMut(u32, &[u32])) {
        let degree = self.layout.degree;
        let mut lists: Vec<u32> = Vec::new();
        let mut list = Vec::with_capacity(degree);
        let mut at = 0;
        while at < nodes.len() {
            // the nodes of one graph page: their lists copied under one lock
            let block = self.layout.graph_block(nodes[at]);
            let group = nodes[at..].iter().take_while(|&&x| self.layout.graph_block(x) == block).count();
            lists.clear();
            // SAFETY: as in visit.
            unsafe {
                let b = Locked::read(self.rel, block, false);
                for &x in &nodes[at..at + group] {
                    lists.extend_from_slice(b.page().list(&self.layout, x));
                }
            }
            let known = self.known.get();
            for (&x, slots) in nodes[at..at + group].iter().zip(lists.chunks_exact(degree)) {
                list.clear();
                list.extend(slots.iter().copied().take_while(|&u| u != NO_NODE));
                if list.iter().any(|&u| u >= known) {
                    self.check_ids(x, &list);
                }
                f(x, &list);
            }
            at += group;
        }
    }
}

impl GraphMut for PageStore {
    fn allocate(&self, stored: &[f32], payload: u64) -> u32 {
        assert_eq!(stored.len(), self.layout.stored_dim);
        if let Some(node) = self.reuse_free(stored, payload) {
            return node;
        }
        // SAFETY: `rel` is an open gpu_graph index (PageStore::new's
        // contract); the meta page's exclusive lock is held while the id is
        // taken and the chunk extended.
        let node = unsafe {
            Meta::update(self.rel, |m| {
                let n = m.node_count;
                if (n as usize).is_multiple_of(self.layout.per_chunk) {
                    self.extend_chunk(n);
                }
                m.node_count += 1;
                n
            })
        };
        // SAFETY: as in set_flags.
        unsafe {
            let b = Locked::read(self.rel, self.layout.vector_block(node), true);
            let mut x = Xlog::start(self.rel);
            x.register(&b, false).put_tuple(&self.layout, node, payload, 0, stored);
            x.only_row(node, &self.layout);
            x.finish();
        }
        node
    }

    fn update_neighbors(&self, node: u32, f: &mut dyn FnMut(&mut Vec<u32>) -> bool) {
        // SAFETY: `rel` is open (PageStore::new's contract). The list is
        // copied out under the exclusive lock and that view dropped before
        // the record registers the buffer; the change goes through the
        // record's copy.
        unsafe {
            let b = Locked::read(self.rel, self.layout.graph_block(node), true);
            let mut list: Vec<u32> = b.page().neighbors(&self.layout, node).collect();
            if !f(&mut list) {
                return;
            }
            list.truncate(self.layout.degree);
            let mut x = Xlog::start(self.rel);
            x.register(&b, false).put_list(&self.layout, node, &list);
            x.only_list(node, &list, self.layout.degree);
            x.finish();
        }
    }

    fn set_entry(&self, node: Option<u32>) {
        // SAFETY: `rel` is an open gpu_graph index (PageStore::new's contract).
        unsafe { Meta::update(self.rel, |m| m.entry = node.unwrap_or(NO_NODE)) }
    }

    fn set_entry_if(&self, expected: Option<u32>, node: Option<u32>) -> Option<u32> {
        // SAFETY: `rel` is an open gpu_graph index (PageStore::new's
        // contract); the meta page's exclusive lock makes the test and the
        // set one step for every backend.
        unsafe {
            Meta::update(self.rel, |m| {
                let found = m.entry();
                if found == expected {
                    m.entry = node.unwrap_or(NO_NODE);
                }
                found
            })
        }
    }

    fn mark_deleted(&self, node: u32) {
        self.set_flags(node, |f| f | FLAG_DELETED);
    }

    fn replace_many_if(&self, changes: &[(u32, Vec<u32>, Vec<u32>)]) -> Vec<bool> {
        let mut written = Vec::with_capacity(changes.len());
        // one record per graph page: VACUUM rewrites tens of thousands of
        // lists, and a record per list cost more than computing them
        for group in changes.chunk_by(|a, b| self.layout.graph_block(a.0) == self.layout.graph_block(b.0)) {
            // SAFETY: as in update_neighbors; the lists are compared under
            // the exclusive lock and changed through the record's copy.
            unsafe {
                let b = Locked::read(self.rel, self.layout.graph_block(group[0].0), true);
                let same: Vec<bool> = group
                    .iter()
                    .map(|(v, read, _)| b.page().neighbors(&self.layout, *v).eq(read.iter().copied()))
                    .collect();
                if same.iter().any(|&s| s) {
                    let mut x = Xlog::start(self.rel);
                    let mut page = x.register(&b, false);
                    for ((v, _, new), &s) in group.iter().zip(&same) {
                        if s {
                            page.put_list(&self.layout, *v, &new[..new.len().min(self.layout.degree)]);
                        }
                    }
                    let changed = group.iter().zip(&same).filter(|(_, &s)| s).map(|(c, _)| c.0);
                    let (lo, hi) = changed.fold((u32::MAX, 0), |(lo, hi), v| (lo.min(v), hi.max(v + 1)));
                    x.only(lo..hi);
                    x.finish();
                }
                written.extend(same);
            }
        }
        written
    }

    fn free_many(&self, nodes: &[u32]) {
        // the lists, one record per graph page
        let cleared: Vec<(u32, Vec<u32>, Vec<u32>)> = nodes
            .iter()
            .map(|&n| {
                let mut list = Vec::new();
                self.neighbors(n, &mut list);
                (n, list, Vec::new())
            })
            .collect();
        for ((n, _, _), ok) in cleared.iter().zip(self.replace_many_if(&cleared)) {
            if !ok {
                self.update_neighbors(*n, &mut |l| {
                    l.clear();
                    true
                });
            }
        }
        // the chain, one record per vector page (with the meta page)
        for group in nodes.chunk_by(|a, b| self.layout.vector_block(*a) == self.layout.vector_block(*b)) {
            self.chain_free(group);
        }
    }

    fn free(&self, node: u32) {
        self.update_neighbors(node, &mut |l| {
            l.clear();
            true
        });
        self.chain_free(&[node]);
    }
}

impl PageStore {
    /// Flags `nodes` (all on one vector page, lists already empty) free and
    /// puts them on the free list: the meta page, then the vector page, are
    /// locked exclusively (the order every path takes) and both changed in
    /// one record, so the chain and the flags never disagree, after a crash
    /// too.
    fn chain_free(&self, nodes: &[u32]) {
        let Some(&first) = nodes.first() else { return };
        // SAFETY: `rel` is an open gpu_graph index (PageStore::new's contract).
        unsafe {
            let mb = Locked::read(self.rel, 0, true);
            let mut m = mb.page().meta().checked(self.rel);
            let vb = Locked::read(self.rel, self.layout.vector_block(first), true);
            let fresh: Vec<u32> = nodes
                .iter()
                .copied()
                .filter(|&n| vb.page().tuple(&self.layout, n).header.flags & FLAG_FREE == 0)
                .collect();
            if fresh.is_empty() {
                return; // freed already
            }
            let mut x = Xlog::start(self.rel);
            {
                let mut page = x.register(&vb, false);
                for &n in &fresh {
                    page.put_header(&self.layout, n, m.free_head as u64, FLAG_FREE);
                    m.unpin(n);
                    m.free_head = n;
                    m.free_count += 1;
                }
            }
            m.generation += 1;
            x.register(&mb, false).put_meta(&m);
            x.finish();
        }
    }

    /// Marks `nodes` (in node order) deleted, one record per vector page.
    pub fn mark_deleted_many(&self, nodes: &[u32]) {
        for group in nodes.chunk_by(|a, b| self.layout.vector_block(*a) == self.layout.vector_block(*b)) {
            // SAFETY: as in set_flags.
            unsafe {
                let b = Locked::read(self.rel, self.layout.vector_block(group[0]), true);
                let mut x = Xlog::start(self.rel);
                let mut page = x.register(&b, false);
                for &n in group {
                    page.set_flags(&self.layout, n, |f| f | FLAG_DELETED);
                }
                x.only(group[0]..group[group.len() - 1] + 1);
                x.finish();
            }
        }
    }
}

impl PageStore {
    /// Calls `f` with each node's id and vector header, one vector page at a
    /// time (a pass over every node takes one buffer lookup a page, not one
    /// a node).
    pub fn for_each_header(&self, nodes: std::ops::Range<u32>, f: &mut dyn FnMut(u32, VectorHeader)) {
        self.for_each_tuple(nodes, &mut |v, t| f(v, t.header));
    }

    /// Calls `f` with each node's vector tuple, one share lock a vector page.
    fn for_each_tuple(&self, nodes: std::ops::Range<u32>, f: &mut dyn FnMut(u32, Tuple)) {
        let (per_page, per_chunk) = (self.layout.per_vector_page as u32, self.layout.per_chunk as u32);
        let mut node = nodes.start;
        while node < nodes.end {
            // the rest of this node's vector page (a chunk's last page may be short)
            let slot = node % per_chunk;
            let end = (node - slot % per_page + per_page).min(node - slot + per_chunk).min(nodes.end);
            // SAFETY: as in visit.
            unsafe {
                let b = Locked::read(self.rel, self.layout.vector_block(node), false);
                for v in node..end {
                    f(v, b.page().tuple(&self.layout, v));
                }
            }
            node = end;
        }
    }

    /// A copy of the whole graph, read page by page.
    pub fn snapshot(&self, metric: Metric) -> Option<FlatIndex> {
        let adjacency = self.adjacency();
        let all = vec![true; adjacency.len() / self.layout.degree.max(1)];
        self.snapshot_of(metric, adjacency, &all)
    }

    /// VACUUM's repair's copy: every list (`adjacency`, this store's,
    /// n × degree) and the vectors and flags of the `wanted` nodes, the
    /// others free; read page by page, a page with no wanted node not at
    /// all (engine::repair::needed says which).
    pub fn snapshot_of(&self, metric: Metric, adjacency: Vec<u32>, wanted: &[bool]) -> Option<FlatIndex> {
        let (sd, degree) = (self.layout.stored_dim, self.layout.degree);
        let mut ix = FlatIndex::try_sparse(metric, sd, degree, adjacency, self.entry())?;
        let n = ix.len().min(wanted.len());
        let mut v = 0;
        while v < n {
            if !wanted[v] {
                v += 1;
                continue;
            }
            let end = v + wanted[v..n].iter().take_while(|&&w| w).count();
            self.for_each_tuple(v as u32..end as u32, &mut |u, t| {
                let u = u as usize;
                ix.flags[u] = t.header.flags as u8;
                t.vector.copy_to(&mut ix.vectors[u * sd..(u + 1) * sd]);
            });
            v = end;
        }
        Some(ix)
    }

    /// Rewrites a node's stored vector in place (payload and flags stay).
    pub fn put_vector(&self, node: u32, stored: &[f32]) {
        assert_eq!(stored.len(), self.layout.stored_dim);
        // SAFETY: as in set_flags.
        unsafe {
            let b = Locked::read(self.rel, self.layout.vector_block(node), true);
            let h = b.page().tuple(&self.layout, node).header;
            let mut x = Xlog::start(self.rel);
            x.register(&b, false).put_tuple(&self.layout, node, h.payload(), h.flags, stored);
            x.only_row(node, &self.layout);
            x.finish();
        }
    }

    /// Takes the free list's first slot for a new node, or None when the list
    /// is empty. The chain's next id is read from the slot, and the meta page
    /// and the slot's new tuple are written in one record (see `free`).
    fn reuse_free(&self, stored: &[f32], payload: u64) -> Option<u32> {
        // SAFETY: as in `free`.
        unsafe {
            let mb = Locked::read(self.rel, 0, true);
            let mut m = mb.page().meta().checked(self.rel);
            let node = m.free_head;
            if node == NO_NODE {
                return None;
            }
            if node >= m.node_count {
                corrupted(self.rel, 0, format!("its free list starts at node {node} of {}", m.node_count));
            }
            let vb = Locked::read(self.rel, self.layout.vector_block(node), true);
            let header = vb.page().tuple(&self.layout, node).header;
            let next = header.payload();
            if header.flags & FLAG_FREE == 0 || (next >= m.node_count as u64 && next != NO_NODE as u64) {
                corrupted(self.rel, vb.block(), format!("node {node} is on the free list but not a free slot"));
            }
            m.free_head = next as u32;
            m.free_count = m.free_count.saturating_sub(1);
            m.generation += 1;
            let mut x = Xlog::start(self.rel);
            x.register(&mb, false).put_meta(&m);
            x.register(&vb, false).put_tuple(&self.layout, node, payload, 0, stored);
            x.only_row(node, &self.layout);
            x.finish();
            Some(node)
        }
    }
}
