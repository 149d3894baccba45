//! The storage interface of the engine. Node ids are dense `u32`; a node holds
//! an opaque `payload` (the heap TID in PostgreSQL), its stored vector (already
//! prepared by [`crate::metric::Metric::prepare_stored`]) and a neighbour list
//! of at most `degree` ids.

/// What a visit of a node found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Visit {
    /// The value the caller's distance closure returned for the node's vector.
    pub dist: f32,
    pub payload: u64,
    /// Deleted nodes are still traversed (until VACUUM frees them) but are never results.
    pub deleted: bool,
}

/// Read access, shared by search, insert and repair.
pub trait GraphView {
    /// Length of stored vectors.
    fn stored_dim(&self) -> usize;
    fn degree(&self) -> usize;
    /// Ids below this may exist; some may be free.
    fn node_count(&self) -> u32;
    fn entry(&self) -> Option<u32>;
    /// Nodes every search starts from besides the entry point: inner
    /// product's pinned outliers ([`crate::outliers`]).
    fn seeds(&self, _out: &mut Vec<u32>) {}
    /// The rule insert and repair keep a list's neighbours by: the graph's
    /// own (an NSG index's NSG rule, ...), RNN-Descent's by default.
    fn filter(&self) -> crate::filter::Filter {
        crate::filter::Filter::Rng
    }
    /// What puts a list the filter kept in the graph's order (TSDG's
    /// lambda order, which a batch's prefix search needs); None: the
    /// filter's distance order.
    fn order(&self) -> Option<crate::filter::Filter> {
        None
    }
    /// Every node's list, `degree` slots each padded with NO_NODE: what a
    /// walk over the whole graph reads (a store may read it page by page).
    fn adjacency(&self) -> Vec<u32> {
        let (n, degree) = (self.node_count() as usize, self.degree());
        let mut out = vec![crate::NO_NODE; n * degree];
        let mut list = Vec::new();
        for v in 0..n {
            self.neighbors(v as u32, &mut list);
            out[v * degree..v * degree + list.len()].copy_from_slice(&list);
        }
        out
    }
    /// Applies `dist` to the node's stored vector, read together with its
    /// payload and deleted flag (one consistent read). `None` for a free slot.
    fn visit<F: FnOnce(&[f32]) -> f32>(&self, node: u32, dist: F) -> Option<Visit>;
    /// Replaces `out` with the node's neighbour ids (no padding).
    fn neighbors(&self, node: u32, out: &mut Vec<u32>);
    /// Calls `f` with each of `nodes`' (ascending) neighbour lists, as
    /// [`GraphView::neighbors`] reads them: a walk's level at a time (a
    /// paged store reads each page once for the nodes on it).
    fn lists_of(&self, nodes: &[u32], f: &mut dyn FnMut(u32, &[u32])) {
        let mut list = Vec::new();
        for &x in nodes {
            self.neighbors(x, &mut list);
            f(x, &list);
        }
    }
}

/// Changes, used by insert and VACUUM. Every method is atomic on its own.
pub trait GraphMut: GraphView {
    /// Stores a new node (reusing a free slot where the store has one) with an
    /// empty neighbour list and returns its id.
    fn allocate(&self, stored: &[f32], payload: u64) -> u32;
    /// Reads the node's list, lets `f` change it and writes it back if `f`
    /// returns true, with no other change to that list in between.
    fn update_neighbors(&self, node: u32, f: &mut dyn FnMut(&mut Vec<u32>) -> bool);
    /// Replaces the node's list with `new` only if it still equals `read`
    /// (the list `new` was computed from); false when another writer changed
    /// it meanwhile, and the caller computes again. How insert and repair
    /// rewrite a list without holding its lock while they read other nodes.
    fn replace_neighbors_if(&self, node: u32, read: &[u32], new: &[u32]) -> bool {
        let mut replaced = false;
        self.update_neighbors(node, &mut |list| {
            replaced = list.as_slice() == read;
            if replaced {
                list.clear();
                list.extend_from_slice(new);
            }
            replaced
        });
        replaced
    }
    fn set_entry(&self, node: Option<u32>);
    /// Sets the entry point to `node` only if it is still `expected`, in one
    /// atomic step; returns the entry point found (`expected` on success).
    /// How concurrent first inserts into an empty graph agree on one entry.
    fn set_entry_if(&self, expected: Option<u32>, node: Option<u32>) -> Option<u32>;
    fn mark_deleted(&self, node: u32);
    /// Makes a deleted node's slot free for reuse (its list is emptied).
    fn free(&self, node: u32);
    /// [`GraphMut::replace_neighbors_if`] for many lists at once, in node
    /// order (a store may write the lists of one page in one step); which
    /// were written.
    fn replace_many_if(&self, changes: &[(u32, Vec<u32>, Vec<u32>)]) -> Vec<bool> {
        changes.iter().map(|(v, read, new)| self.replace_neighbors_if(*v, read, new)).collect()
    }
    /// [`GraphMut::free`] for many deleted nodes, in node order.
    fn free_many(&self, nodes: &[u32]) {
        for &n in nodes {
            self.free(n);
        }
    }
}

/// A graph searched through the first `width` entries of each list (TSDG's
/// prefix: lists ordered so that a prefix is itself a good, smaller list;
/// the large-batch search reads fewer neighbours a step). Everything else
/// is the graph's own.
pub struct Prefix<'a, G: GraphView> {
    pub graph: &'a G,
    pub width: usize,
}

impl<G: GraphView> GraphView for Prefix<'_, G> {
    fn stored_dim(&self) -> usize {
        self.graph.stored_dim()
    }
    fn degree(&self) -> usize {
        self.width.min(self.graph.degree())
    }
    fn node_count(&self) -> u32 {
        self.graph.node_count()
    }
    fn entry(&self) -> Option<u32> {
        self.graph.entry()
    }
    fn seeds(&self, out: &mut Vec<u32>) {
        self.graph.seeds(out)
    }
    fn visit<F: FnOnce(&[f32]) -> f32>(&self, node: u32, dist: F) -> Option<Visit> {
        self.graph.visit(node, dist)
    }
    fn neighbors(&self, node: u32, out: &mut Vec<u32>) {
        self.graph.neighbors(node, out);
        out.truncate(self.width);
    }
}
