//! Candidate neighbours read out of a store for pruning: what insert,
//! repair and the CFS builds do before applying a filter.

use crate::filter::Filter;
use crate::metric::graph_distance;
use crate::store::GraphView;

/// Live candidates of one node: their distances to it and their vectors.
pub struct Candidates {
    cands: Vec<(u32, f32)>,
    vectors: Vec<f32>,
    dim: usize,
}

impl Candidates {
    /// Reads each of `ids` once (its vector and its distance to `from`),
    /// skipping free and deleted nodes: they are never made neighbours.
    pub fn collect<G: GraphView>(store: &G, from: &[f32], ids: impl IntoIterator<Item = u32>) -> Candidates {
        let dim = store.stored_dim();
        let mut c = Candidates { cands: Vec::new(), vectors: Vec::new(), dim };
        for id in ids {
            let before = c.vectors.len();
            let vectors = &mut c.vectors;
            match store.visit(id, |x| {
                vectors.extend_from_slice(x);
                graph_distance(from, x)
            }) {
                Some(v) if !v.deleted => c.cands.push((id, v.dist)),
                Some(_) => c.vectors.truncate(before),
                None => {}
            }
        }
        c
    }

    /// [`Candidates::collect`] of only the `limit` nearest of `ids` (ties by
    /// id): distances first, then the vectors of those kept. Repair follows
    /// chains of deleted nodes to thousands of candidates of which the prune
    /// looks at the nearest few dozen; copying every vector was half of
    /// VACUUM's time.
    pub fn collect_nearest<G: GraphView>(
        store: &G,
        from: &[f32],
        ids: impl IntoIterator<Item = u32>,
        limit: usize,
    ) -> Candidates {
        let mut near: Vec<(f32, u32)> = ids
            .into_iter()
            .filter_map(|id| store.visit(id, |x| graph_distance(from, x)).filter(|v| !v.deleted).map(|v| (v.dist, id)))
            .collect();
        let key = |a: &(f32, u32), b: &(f32, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
        if near.len() > limit {
            near.select_nth_unstable_by(limit, key);
            near.truncate(limit);
        }
        Candidates::collect(store, from, near.into_iter().map(|(_, id)| id))
    }

    pub fn len(&self) -> usize {
        self.cands.len()
    }
    pub fn is_empty(&self) -> bool {
        self.cands.is_empty()
    }

    /// What a graph keeps of the `limit` nearest (ties by id; `ids` must
    /// have been distinct): its `filter`'s list, at most `degree`, then in
    /// its `order` where it has one ([`GraphView::order`], TSDG's:
    /// a list an insert or repair rewrites stays in the order a batch's
    /// prefix search needs).
    pub fn keep(self, filter: Filter, order: Option<Filter>, limit: usize, degree: usize) -> Vec<(u32, f32)> {
        let (cands, vectors) = self.nearest(limit);
        let kept = filter.apply(&cands, &vectors, self.dim, degree);
        let Some(order) = order else { return kept };
        // the kept candidates' vectors, in the kept (ascending) order
        let mut rows = Vec::with_capacity(kept.len() * self.dim);
        for k in &kept {
            let i = cands.iter().position(|c| c.0 == k.0).expect("a kept candidate is a candidate");
            rows.extend_from_slice(&vectors[i * self.dim..(i + 1) * self.dim]);
        }
        order.apply(&kept, &rows, self.dim, degree)
    }

    /// All of them in `order` (no filter: a list with room that takes one
    /// more neighbour keeps every one, in the graph's order).
    pub fn ordered(self, order: Filter, degree: usize) -> Vec<(u32, f32)> {
        let (cands, vectors) = self.nearest(usize::MAX);
        order.apply(&cands, &vectors, self.dim, degree)
    }

    /// The `limit` nearest (ties by id) in ascending distance, with their
    /// vectors in that order.
    pub fn nearest(&self, limit: usize) -> (Vec<(u32, f32)>, Vec<f32>) {
        let mut order: Vec<usize> = (0..self.cands.len()).collect();
        let key = |&i: &usize| (self.cands[i].1, self.cands[i].0);
        order.sort_unstable_by(|a, b| {
            let (a, b) = (key(a), key(b));
            a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
        });
        order.truncate(limit);
        let cands: Vec<(u32, f32)> = order.iter().map(|&i| self.cands[i]).collect();
        let mut vectors = Vec::with_capacity(order.len() * self.dim);
        for &i in &order {
            vectors.extend_from_slice(&self.vectors[i * self.dim..(i + 1) * self.dim]);
        }
        (cands, vectors)
    }
}
