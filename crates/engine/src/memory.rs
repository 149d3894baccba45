//! An in-memory [`GraphMut`] implementation (tests, benchmarks), made from a
//! [`FlatIndex`].
//!
//! Locking: one `RwLock` over the node arrays, read-locked by every access
//! and write-locked only by `allocate` (which grows the arrays or rewrites a
//! free slot's vector); each neighbour list has its own `Mutex`, so inserts
//! that touch different lists never wait on each other; node states are
//! atomics, so marking and freeing need only the read lock. Closures passed to
//! `update_neighbors` run under the list's lock and must not call back into
//! the store.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use crate::filter::Filter;
use crate::flat::FlatIndex;
use crate::node::{DELETED, FREE, LIVE};
use crate::store::{GraphMut, GraphView, Visit};
use crate::NO_NODE;

struct Nodes {
    vectors: Vec<f32>,
    payloads: Vec<u64>,
    /// [`crate::node`] flags
    states: Vec<AtomicU8>,
    lists: Vec<Mutex<Vec<u32>>>,
}

pub struct MemoryStore {
    stored_dim: usize,
    degree: usize,
    nodes: RwLock<Nodes>,
    /// NO_NODE when there is none
    entry: AtomicU32,
    free_slots: Mutex<Vec<u32>>,
    /// the rule inserts and repair keep lists by ([`GraphView::filter`],
    /// [`GraphView::order`]): RNN-Descent's unless [`MemoryStore::with_rule`]
    filter: Filter,
    order: Option<Filter>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new(stored_dim: usize, degree: usize) -> MemoryStore {
        let nodes = Nodes { vectors: Vec::new(), payloads: Vec::new(), states: Vec::new(), lists: Vec::new() };
        MemoryStore {
            stored_dim,
            degree,
            nodes: RwLock::new(nodes),
            entry: AtomicU32::new(NO_NODE),
            free_slots: Mutex::new(Vec::new()),
            filter: Filter::Rng,
            order: None,
        }
    }

    /// A store holding a flat index (its flags included), with one payload per node.
    pub fn from_flat(index: FlatIndex, payloads: Vec<u64>) -> MemoryStore {
        let FlatIndex { stored_dim, vectors, flags, graph, .. } = index;
        assert_eq!(payloads.len(), flags.len(), "one payload per node");
        let lists = (0..flags.len() as u32).map(|v| Mutex::new(graph.neighbors(v).collect())).collect();
        let free = (0..flags.len() as u32).filter(|&v| flags[v as usize] & FREE != 0).collect();
        let nodes = Nodes { vectors, payloads, states: flags.into_iter().map(AtomicU8::new).collect(), lists };
        MemoryStore {
            stored_dim,
            degree: graph.degree,
            nodes: RwLock::new(nodes),
            entry: AtomicU32::new(graph.entry.unwrap_or(NO_NODE)),
            free_slots: Mutex::new(free),
            filter: Filter::Rng,
            order: None,
        }
    }

    /// The store with a CFS graph's rule for inserts and repair (its
    /// filter, and TSDG's order: `cfs::Algorithm::filter`, `order`).
    pub fn with_rule(self, filter: Filter, order: Option<Filter>) -> MemoryStore {
        MemoryStore { filter, order, ..self }
    }

    fn read(&self) -> RwLockReadGuard<'_, Nodes> {
        self.nodes.read()
    }
}

impl GraphView for MemoryStore {
    fn stored_dim(&self) -> usize {
        self.stored_dim
    }
    fn degree(&self) -> usize {
        self.degree
    }
    fn node_count(&self) -> u32 {
        self.read().states.len() as u32
    }
    fn entry(&self) -> Option<u32> {
        Some(self.entry.load(Ordering::Acquire)).filter(|&e| e != NO_NODE)
    }
    fn filter(&self) -> Filter {
        self.filter
    }
    fn order(&self) -> Option<Filter> {
        self.order
    }
    fn visit<F: FnOnce(&[f32]) -> f32>(&self, node: u32, dist: F) -> Option<Visit> {
        let nodes = self.read();
        let i = node as usize;
        let state = nodes.states.get(i)?.load(Ordering::Acquire);
        if state == FREE {
            return None;
        }
        let d = dist(&nodes.vectors[i * self.stored_dim..(i + 1) * self.stored_dim]);
        Some(Visit { dist: d, payload: nodes.payloads[i], deleted: state == DELETED })
    }
    fn neighbors(&self, node: u32, out: &mut Vec<u32>) {
        out.clear();
        let nodes = self.read();
        if let Some(l) = nodes.lists.get(node as usize) {
            out.extend_from_slice(&l.lock());
        }
    }
}

impl GraphMut for MemoryStore {
    fn allocate(&self, stored: &[f32], payload: u64) -> u32 {
        assert_eq!(stored.len(), self.stored_dim);
        let mut nodes = self.nodes.write();
        // popped under the write lock, so no reader sees the slot half-written
        if let Some(id) = self.free_slots.lock().pop() {
            let i = id as usize;
            nodes.vectors[i * self.stored_dim..(i + 1) * self.stored_dim].copy_from_slice(stored);
            nodes.payloads[i] = payload;
            nodes.lists[i].lock().clear();
            nodes.states[i].store(LIVE, Ordering::Release);
            return id;
        }
        let id = nodes.states.len();
        assert!(id < NO_NODE as usize, "node ids are u32");
        nodes.vectors.extend_from_slice(stored);
        nodes.payloads.push(payload);
        nodes.states.push(AtomicU8::new(LIVE));
        nodes.lists.push(Mutex::new(Vec::with_capacity(self.degree)));
        id as u32
    }
    fn update_neighbors(&self, node: u32, f: &mut dyn FnMut(&mut Vec<u32>) -> bool) {
        let nodes = self.read();
        let mut list = nodes.lists[node as usize].lock();
        let mut copy = list.clone();
        if f(&mut copy) {
            copy.truncate(self.degree);
            *list = copy;
        }
    }
    fn set_entry(&self, node: Option<u32>) {
        self.entry.store(node.unwrap_or(NO_NODE), Ordering::Release);
    }
    fn set_entry_if(&self, expected: Option<u32>, node: Option<u32>) -> Option<u32> {
        let (e, n) = (expected.unwrap_or(NO_NODE), node.unwrap_or(NO_NODE));
        match self.entry.compare_exchange(e, n, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => expected,
            Err(found) => (found != NO_NODE).then_some(found),
        }
    }
    fn mark_deleted(&self, node: u32) {
        let nodes = self.read();
        // a free slot stays free
        let _ = nodes.states[node as usize].compare_exchange(LIVE, DELETED, Ordering::AcqRel, Ordering::Acquire);
    }
    fn free(&self, node: u32) {
        let nodes = self.read();
        let i = node as usize;
        if nodes.states[i].compare_exchange(DELETED, FREE, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            nodes.lists[i].lock().clear();
            self.free_slots.lock().push(node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Graph;

    #[test]
    fn allocate_free_reuse() {
        let s = MemoryStore::new(2, 4);
        assert_eq!((s.node_count(), s.entry()), (0, None));
        let a = s.allocate(&[1.0, 2.0], 10);
        let b = s.allocate(&[3.0, 4.0], 11);
        assert_eq!((a, b), (0, 1));
        s.update_neighbors(a, &mut |l| {
            l.extend([b, b, b, b, b]);
            true
        });
        let mut out = Vec::new();
        s.neighbors(a, &mut out);
        assert_eq!(out.len(), 4, "cut to degree");
        s.update_neighbors(a, &mut |l| {
            l.clear();
            false // not written back
        });
        s.neighbors(a, &mut out);
        assert_eq!(out.len(), 4);

        let v = s.visit(b, |x| x[0] + x[1]).unwrap();
        assert_eq!(v, Visit { dist: 7.0, payload: 11, deleted: false });
        s.free(b); // not deleted: stays
        assert!(s.visit(b, |_| 0.0).is_some());
        s.mark_deleted(b);
        assert!(s.visit(b, |_| 0.0).unwrap().deleted);
        s.free(b);
        assert_eq!(s.visit(b, |_| 0.0), None);
        s.mark_deleted(b); // a free slot stays free
        assert_eq!(s.visit(b, |_| 0.0), None);
        let c = s.allocate(&[5.0, 6.0], 12);
        assert_eq!(c, b, "free slot reused");
        assert_eq!(s.visit(c, |x| x[0]).unwrap(), Visit { dist: 5.0, payload: 12, deleted: false });
        s.neighbors(c, &mut out);
        assert!(out.is_empty());
        assert_eq!(s.node_count(), 2);
        s.set_entry(Some(c));
        assert_eq!(s.entry(), Some(c));
    }

    #[test]
    fn from_flat() {
        let g = Graph { degree: 2, adjacency: vec![1, NO_NODE, 0, 1, NO_NODE, NO_NODE], entry: Some(1) };
        let mut flat = FlatIndex::new(crate::metric::Metric::L2, 1, vec![0.0, 1.0, 2.0], g);
        flat.flags[2] = FREE;
        let s = MemoryStore::from_flat(flat, vec![7, 8, 9]);
        assert_eq!(s.visit(2, |_| 0.0), None, "a free node stays free");
        assert_eq!(s.allocate(&[5.0], 10), 2, "and is reused first");
        let mut out = Vec::new();
        s.neighbors(0, &mut out);
        assert_eq!(out, vec![1]);
        s.neighbors(1, &mut out);
        assert_eq!(out, vec![0, 1]);
        assert_eq!((s.entry(), s.degree(), s.stored_dim()), (Some(1), 2, 1));
    }
}
