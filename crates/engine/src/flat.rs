//! An index in flat arrays: the one shape in which a whole index travels
//! between the parts of gpu_graph. A build produces its [`Graph`] over the
//! vectors it was given; the GPU search server uploads a `FlatIndex`; the
//! search worker reads an index's pages into one (and searches it with the
//! engine's search in its CPU test mode); the CPU model of the GPU search
//! kernel runs on one. [`crate::memory::MemoryStore`], the store that takes
//! concurrent inserts and deletes, is made from one.

use crate::graph::Graph;
use crate::metric::Metric;
use crate::node;
use crate::store::{GraphView, Visit};
use crate::NO_NODE;

#[derive(Clone, Debug)]
pub struct FlatIndex {
    pub metric: Metric,
    /// Length of a stored vector ([`Metric::stored_dim`]).
    pub stored_dim: usize,
    /// n × `stored_dim` stored vectors ([`Metric::prepare_stored`]).
    pub vectors: Vec<f32>,
    /// One byte of [`crate::node`] flags per node.
    pub flags: Vec<u8>,
    /// The neighbour lists (n × degree) and the entry point.
    pub graph: Graph,
}

impl FlatIndex {
    /// An index of live nodes: `vectors` (n × `stored_dim`) and a graph over them.
    pub fn new(metric: Metric, stored_dim: usize, vectors: Vec<f32>, graph: Graph) -> FlatIndex {
        let n = graph.len();
        assert!(stored_dim > 0 && vectors.len() == n * stored_dim, "one stored vector per node of the graph");
        FlatIndex { metric, stored_dim, vectors, flags: vec![node::LIVE; n], graph }
    }

    /// `n` free nodes with empty lists, to be filled in place (the worker's
    /// copy of an index's pages). None when the memory cannot be had: an
    /// allocation failure must not abort the process that asked.
    pub fn try_free(
        metric: Metric,
        stored_dim: usize,
        degree: usize,
        n: usize,
        entry: Option<u32>,
    ) -> Option<FlatIndex> {
        Some(FlatIndex {
            metric,
            stored_dim,
            vectors: try_filled(n * stored_dim, 0.0)?,
            flags: try_filled(n, node::FREE)?,
            graph: Graph { degree, adjacency: try_filled(n * degree, NO_NODE)?, entry },
        })
    }

    /// Every node free, with `adjacency` (n × `degree`) as its lists, its
    /// vectors zero and not yet touched (the memory is the system's zero
    /// pages until a vector is written): a copy of some nodes of a store,
    /// each written in place with its flags. None when the memory cannot be
    /// had.
    pub fn try_sparse(
        metric: Metric,
        stored_dim: usize,
        degree: usize,
        adjacency: Vec<u32>,
        entry: Option<u32>,
    ) -> Option<FlatIndex> {
        let n = adjacency.len() / degree.max(1);
        Some(FlatIndex {
            metric,
            stored_dim,
            vectors: try_zeroed(n * stored_dim)?,
            flags: try_filled(n, node::FREE)?,
            graph: Graph { degree, adjacency, entry },
        })
    }

    /// A copy of `store`'s vectors, flags and lists; None when the memory
    /// cannot be had.
    pub fn snapshot<G: GraphView>(metric: Metric, store: &G) -> Option<FlatIndex> {
        let adjacency = store.adjacency();
        let all = vec![true; adjacency.len() / store.degree().max(1)];
        FlatIndex::snapshot_of(metric, store, adjacency, &all)
    }

    /// A copy of `store`'s lists (`adjacency`, as [`GraphView::adjacency`]
    /// read them) and of the `wanted` nodes' vectors and flags, the others
    /// free (VACUUM's repair: engine::repair::needed says which it reads).
    pub fn snapshot_of<G: GraphView>(
        metric: Metric,
        store: &G,
        adjacency: Vec<u32>,
        wanted: &[bool],
    ) -> Option<FlatIndex> {
        let sd = store.stored_dim();
        let mut ix = FlatIndex::try_sparse(metric, sd, store.degree(), adjacency, store.entry())?;
        for node in (0..ix.len().min(wanted.len())).filter(|&v| wanted[v]) {
            let row = &mut ix.vectors[node * sd..(node + 1) * sd];
            let Some(v) = store.visit(node as u32, |x| {
                row.copy_from_slice(x);
                0.0
            }) else {
                continue; // a free slot stays FREE
            };
            ix.flags[node] = if v.deleted { node::DELETED } else { node::LIVE };
        }
        Some(ix)
    }

    /// Host bytes of an index of `n` nodes.
    pub fn bytes_for(n: usize, stored_dim: usize, degree: usize) -> usize {
        n * (4 * stored_dim + 4 * degree + 1)
    }

    pub fn len(&self) -> usize {
        self.flags.len()
    }
    pub fn is_empty(&self) -> bool {
        self.flags.is_empty()
    }
    pub fn bytes(&self) -> usize {
        Self::bytes_for(self.len(), self.stored_dim, self.graph.degree)
    }
    pub fn vector(&self, node: u32) -> &[f32] {
        let i = node as usize * self.stored_dim;
        &self.vectors[i..i + self.stored_dim]
    }
}

/// `n` zeros from a zeroed allocation: large ones are fresh pages of the
/// system's, touched (and so paid for) only where written.
fn try_zeroed(n: usize) -> Option<Vec<f32>> {
    let layout = std::alloc::Layout::array::<f32>(n).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: a layout of non-zero size; the pointer, when not null, is an
    // allocation of the global allocator with that layout, holding n f32
    // zeros (all-zero bits are 0.0), which the Vec then owns.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut f32;
        (!p.is_null()).then(|| Vec::from_raw_parts(p, n, n))
    }
}

fn try_filled<T: Clone>(n: usize, value: T) -> Option<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.resize(n, value);
    Some(v)
}

/// Searched like the pages: a hit's payload is its node id.
impl GraphView for FlatIndex {
    fn stored_dim(&self) -> usize {
        self.stored_dim
    }
    fn degree(&self) -> usize {
        self.graph.degree
    }
    fn node_count(&self) -> u32 {
        self.len() as u32
    }
    fn entry(&self) -> Option<u32> {
        self.graph.entry
    }
    fn visit<F: FnOnce(&[f32]) -> f32>(&self, node: u32, dist: F) -> Option<Visit> {
        let f = *self.flags.get(node as usize)?;
        if f & node::FREE != 0 {
            return None;
        }
        Some(Visit { dist: dist(self.vector(node)), payload: node as u64, deleted: f & node::DELETED != 0 })
    }
    fn neighbors(&self, node: u32, out: &mut Vec<u32>) {
        out.clear();
        if (node as usize) < self.len() {
            out.extend(self.graph.neighbors(node));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_decide_what_a_visit_sees() {
        let g = Graph { degree: 2, adjacency: vec![1, 2, 0, NO_NODE, 0, 1], entry: Some(0) };
        let mut ix = FlatIndex::new(Metric::L2, 1, vec![0.0, 1.0, 2.0], g);
        ix.flags[1] = node::DELETED;
        ix.flags[2] = node::FREE;
        let mut out = Vec::new();
        ix.neighbors(1, &mut out);
        assert_eq!(out, vec![0]);
        assert_eq!(ix.visit(0, |x| x[0]), Some(Visit { dist: 0.0, payload: 0, deleted: false }));
        assert!(ix.visit(1, |x| x[0]).unwrap().deleted);
        assert_eq!(ix.visit(2, |x| x[0]), None);
        assert_eq!(ix.visit(3, |x| x[0]), None);
        assert_eq!(ix.bytes(), 3 * (4 + 8 + 1));
        let free = FlatIndex::try_free(Metric::Cosine, 4, 8, 5, None).unwrap();
        assert!(free.flags.iter().all(|&f| f == node::FREE) && free.graph.adjacency.len() == 40);
    }

    #[test]
    fn a_prefix_reads_the_first_entries_of_each_list() {
        use crate::search::search;
        use crate::store::Prefix;
        // a path 0 - 1 - 2 - 3 - 4 where each list names its far side last
        let g = Graph { degree: 2, adjacency: vec![1, NO_NODE, 0, 2, 1, 3, 2, 4, 3, NO_NODE], entry: Some(0) };
        let ix = FlatIndex::new(Metric::L2, 1, vec![0.0, 1.0, 2.0, 3.0, 4.0], g);
        let whole = Prefix { graph: &ix, width: 2 };
        let first = Prefix { graph: &ix, width: 1 };
        let mut out = Vec::new();
        first.neighbors(1, &mut out);
        assert_eq!((out, first.degree(), whole.degree()), (vec![0], 1, 2));
        // the whole lists walk to 4; the first entries only go back to 0
        let ids = |hits: Vec<crate::search::Hit>| hits.iter().map(|h| h.node).collect::<Vec<_>>();
        assert_eq!(ids(search(&whole, Metric::L2, &[4.0], 1, 4)), ids(search(&ix, Metric::L2, &[4.0], 1, 4)));
        assert_eq!(ids(search(&whole, Metric::L2, &[4.0], 1, 4)), vec![4]);
        assert_eq!(ids(search(&first, Metric::L2, &[4.0], 1, 4)), vec![1]);
    }
}
