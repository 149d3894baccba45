//! Best-first beam search over any [`GraphView`], resumable: a scan asks for
//! the next batch of results as long as the executor wants rows.
//!
//! One round is the classic search with beam `ef`: expand the nearest
//! unexpanded candidate while it is nearer than the ef-th best result found
//! so far. Its results come out sorted. Nodes found but not among the ef best
//! are kept (`spare`), and unexpanded candidates stay in `frontier`, so the
//! next round continues exactly where this one stopped, never computing a
//! distance twice. When the graph walk runs dry, a final sweep visits every
//! node the walk never reached (a graph need not be connected after deletes),
//! so a scan never silently returns fewer rows than the index holds.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::idset::IdSet;

use crate::metric::Metric;
use crate::store::GraphView;

/// A found node: its search distance, id and payload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hit {
    pub dist: f32,
    pub node: u32,
    pub payload: u64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Cand {
    dist: f32,
    node: u32,
    payload: u64,
    deleted: bool,
}
impl Eq for Cand {}
impl Ord for Cand {
    fn cmp(&self, o: &Self) -> Ordering {
        self.dist.total_cmp(&o.dist).then(self.node.cmp(&o.node))
    }
}
impl PartialOrd for Cand {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// The state of one query's search across rounds.
pub struct Search {
    metric: Metric,
    query: Vec<f32>,
    visited: IdSet,
    /// discovered, not yet expanded (min-heap)
    frontier: BinaryHeap<Reverse<Cand>>,
    /// discovered live nodes not yet returned and not in the current beam (min-heap)
    spare: BinaryHeap<Reverse<Cand>>,
    swept: bool,
    /// distance computations so far (for statistics and tests)
    pub visits: u64,
    neighbors: Vec<u32>,
}

impl Search {
    /// Starts a search for `query` (raw, as the user gave it).
    pub fn new<G: GraphView>(store: &G, metric: Metric, query: &[f32]) -> Search {
        Search::resume(store, metric, query, &[])
    }

    /// Continues a search whose first results were found elsewhere (the GPU
    /// search worker, over its copy of the graph): the `returned` nodes are
    /// expanded like any candidate but never returned again, so the next
    /// rounds start from the neighbourhood that answer found and hand out
    /// only nodes not handed out before.
    pub fn resume<G: GraphView>(store: &G, metric: Metric, query: &[f32], returned: &[u32]) -> Search {
        let mut s = Search {
            metric,
            query: metric.prepare_query(query),
            visited: IdSet::default(),
            frontier: BinaryHeap::new(),
            spare: BinaryHeap::new(),
            swept: false,
            visits: 0,
            neighbors: Vec::new(),
        };
        for &node in returned {
            if !s.visited.insert(node) {
                continue;
            }
            let (m, q) = (s.metric, &s.query);
            if let Some(v) = store.visit(node, |x| m.search_distance(q, x)) {
                s.visits += 1;
                s.frontier.push(Reverse(Cand { dist: v.dist, node, payload: v.payload, deleted: v.deleted }));
            }
        }
        if let Some(e) = store.entry() {
            s.discover(store, e);
        }
        let mut seeds = Vec::new();
        store.seeds(&mut seeds);
        for node in seeds {
            s.discover(store, node);
        }
        s
    }

    /// Seeds the search with extra starting nodes (insert uses the new node's
    /// own neighbourhood; repair uses a deleted node's neighbours).
    pub fn seed<G: GraphView>(&mut self, store: &G, node: u32) {
        self.discover(store, node);
    }

    fn discover<G: GraphView>(&mut self, store: &G, node: u32) {
        if !self.visited.insert(node) {
            return;
        }
        let (m, q) = (self.metric, &self.query);
        if let Some(v) = store.visit(node, |x| m.search_distance(q, x)) {
            self.visits += 1;
            let c = Cand { dist: v.dist, node, payload: v.payload, deleted: v.deleted };
            self.frontier.push(Reverse(c));
            if !v.deleted {
                self.spare.push(Reverse(c));
            }
        }
    }

    /// The next up to `ef` results, in increasing distance; empty when every
    /// node has been returned. Results of later rounds can be nearer than the
    /// last result of an earlier round (a node the first walk missed).
    pub fn next_round<G: GraphView>(&mut self, store: &G, ef: usize) -> Vec<Hit> {
        let ef = ef.max(1);
        // the beam: the ef best not-yet-returned results (max-heap)
        let mut beam: BinaryHeap<Cand> = BinaryHeap::with_capacity(ef + 1);
        while beam.len() < ef {
            match self.spare.pop() {
                Some(Reverse(c)) => beam.push(c),
                None => break,
            }
        }
        while let Some(&Reverse(c)) = self.frontier.peek() {
            if beam.len() >= ef && c.dist > beam.peek().map_or(f32::INFINITY, |w| w.dist) {
                break;
            }
            self.frontier.pop();
            let mut nb = std::mem::take(&mut self.neighbors);
            store.neighbors(c.node, &mut nb);
            for &u in &nb {
                if self.visited.contains(&u) {
                    continue;
                }
                self.visited.insert(u);
                let (m, q) = (self.metric, &self.query);
                let Some(v) = store.visit(u, |x| m.search_distance(q, x)) else { continue };
                self.visits += 1;
                let cu = Cand { dist: v.dist, node: u, payload: v.payload, deleted: v.deleted };
                self.frontier.push(Reverse(cu));
                if v.deleted {
                    continue;
                }
                if beam.len() < ef {
                    beam.push(cu);
                } else if cu.dist < beam.peek().unwrap().dist {
                    let out = beam.pop().unwrap();
                    self.spare.push(Reverse(out));
                    beam.push(cu);
                } else {
                    self.spare.push(Reverse(cu));
                }
            }
            self.neighbors = nb;
        }
        if beam.is_empty() && self.frontier.is_empty() && !self.swept {
            self.sweep(store);
            return self.next_round(store, ef);
        }
        let mut out: Vec<Hit> =
            beam.into_vec().into_iter().map(|c| Hit { dist: c.dist, node: c.node, payload: c.payload }).collect();
        out.sort_by(|a, b| a.dist.total_cmp(&b.dist).then(a.node.cmp(&b.node)));
        out
    }

    /// Visits every node the walk never reached, as spare results.
    fn sweep<G: GraphView>(&mut self, store: &G) {
        self.swept = true;
        for node in 0..store.node_count() {
            if self.visited.contains(&node) {
                continue;
            }
            self.visited.insert(node);
            let (m, q) = (self.metric, &self.query);
            if let Some(v) = store.visit(node, |x| m.search_distance(q, x)) {
                self.visits += 1;
                if !v.deleted {
                    self.spare.push(Reverse(Cand { dist: v.dist, node, payload: v.payload, deleted: false }));
                }
            }
        }
    }
}

/// The `k` nearest results of a plain search with beam `ef` (ef ≥ k).
pub fn search<G: GraphView>(store: &G, metric: Metric, query: &[f32], k: usize, ef: usize) -> Vec<Hit> {
    let mut s = Search::new(store, metric, query);
    let mut r = s.next_round(store, ef.max(k));
    r.truncate(k);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flat::FlatIndex;
    use crate::node;
    use crate::params::BuildParams;
    use crate::rnn_descent::build;

    #[test]
    fn resume_never_returns_a_node_twice() {
        let (n, dim) = (400usize, 4usize);
        let v: Vec<f32> = (0..n * dim).map(|i| ((i * 7919) % 1000) as f32 / 10.0).collect();
        let g = build(&v, dim, &BuildParams { degree: 8, ..BuildParams::default() }, &mut |_, _| true).unwrap();
        let mut store = FlatIndex::new(Metric::L2, dim, v.clone(), g);
        store.flags[5] = node::DELETED;
        let q = [50.0, 20.0, 70.0, 10.0];
        // the first answer, as the worker would give it: a deleted node included
        let mut first: Vec<u32> = search(&store, Metric::L2, &q, 10, 10).iter().map(|h| h.node).collect();
        first.push(5);
        let mut s = Search::resume(&store, Metric::L2, &q, &first);
        let mut all = first.clone();
        loop {
            let round = s.next_round(&store, 16);
            if round.is_empty() {
                break;
            }
            assert!(round.iter().all(|h| !first.contains(&h.node)), "a node of the first answer came back");
            all.extend(round.iter().map(|h| h.node));
        }
        all.sort_unstable();
        assert_eq!(all, (0..n as u32).collect::<Vec<_>>(), "every node once (5 only as handed out)");
    }
}
