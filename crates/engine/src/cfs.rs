//! Collect-Filter-Store (Tagore's GNN-Descent paper, CFS; TSDG's two
//! stages): NSG, Vamana, CAGRA and TSDG graphs made from a start graph, on
//! all rayon threads.
//!
//! - Collect: the nodes a search for the node's vector finds over the start
//!   graph (beam `pool`: the "path" collect) and the node's own start list
//!   (the "1-hop" collect).
//! - Filter: the graph's [`Filter`] over the `pool` nearest of them.
//! - Store: every kept edge offered back to its target (reverse edges); a
//!   list then over the degree is filtered again by the same filter; TSDG
//!   orders each list by (lambda, distance) ([`tsdg_order`]); last, every
//!   node is made reachable from the entry point (a node no walk from the
//!   entry reaches is linked from the nearest reachable node a search for
//!   it finds; the paper is silent on this, NSG's DFS tree does the same).
//!
//! The start graph is RNN-Descent's: the search of the collect needs a
//! navigable graph, and its lists are the 1-hop candidates.

use rayon::prelude::*;

use crate::candidates::Candidates;
use crate::filter::{tsdg_order, Filter};
use crate::graph::Graph;
use crate::metric::Metric;
use crate::rnn_descent::Progress;
use crate::search::Search;
use crate::store::{GraphView, Visit};
use crate::NO_NODE;

/// The graphs built by CFS.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Algorithm {
    Nsg,
    Vamana {
        alpha: f32,
    },
    Cagra,
    /// stage 1 Vamana's filter with `alpha`; stage 2 lists ordered by
    /// lambda, edges above `max_lambda` dropped
    Tsdg {
        alpha: f32,
        max_lambda: usize,
    },
}

impl Algorithm {
    /// The filter of the collect and of full lists.
    pub fn filter(self) -> Filter {
        match self {
            Algorithm::Nsg => Filter::Nsg,
            Algorithm::Vamana { alpha } | Algorithm::Tsdg { alpha, .. } => Filter::Vamana { alpha },
            Algorithm::Cagra => Filter::Cagra,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CfsParams {
    pub algorithm: Algorithm,
    pub degree: usize,
    /// candidates collected per node (the collect search's beam)
    pub pool: usize,
}

/// Nodes per step between progress reports (a cancel waits for one step).
const STEP: usize = 16_384;

/// A graph over stored vectors, as a store: a hit's payload is its node id.
struct View<'a> {
    vectors: &'a [f32],
    dim: usize,
    degree: usize,
    adjacency: &'a [u32],
    entry: Option<u32>,
}

impl GraphView for View<'_> {
    fn stored_dim(&self) -> usize {
        self.dim
    }
    fn degree(&self) -> usize {
        self.degree
    }
    fn node_count(&self) -> u32 {
        (self.vectors.len() / self.dim) as u32
    }
    fn entry(&self) -> Option<u32> {
        self.entry
    }
    fn visit<F: FnOnce(&[f32]) -> f32>(&self, node: u32, dist: F) -> Option<Visit> {
        let i = node as usize;
        let row = self.vectors.get(i * self.dim..(i + 1) * self.dim)?;
        Some(Visit { dist: dist(row), payload: node as u64, deleted: false })
    }
    fn neighbors(&self, node: u32, out: &mut Vec<u32>) {
        out.clear();
        let s = node as usize * self.degree;
        if let Some(list) = self.adjacency.get(s..s + self.degree) {
            out.extend(list.iter().copied().take_while(|&x| x != NO_NODE));
        }
    }
}

/// The graph of `params.algorithm` over `vectors` (n × `dim` stored
/// vectors), from `start` (same nodes, its entry kept). None when
/// `progress` says stop.
pub fn refine(
    vectors: &[f32],
    dim: usize,
    start: &Graph,
    params: &CfsParams,
    progress: &mut dyn Progress,
) -> Option<Graph> {
    let n = vectors.len().checked_div(dim).unwrap_or(0);
    let (degree, pool, filter) = (params.degree, params.pool.max(params.degree), params.algorithm.filter());
    let start_view = View { vectors, dim, degree: start.degree, adjacency: &start.adjacency, entry: start.entry };
    let row = |v: usize| &vectors[v * dim..(v + 1) * dim];
    let steps = 2 * n.div_ceil(STEP) + 1;
    let mut done = 0;
    // collect and filter
    let lists = in_steps(n, &mut done, steps, progress, |v| {
        // L2 over stored vectors is the graph distance, whatever the SQL metric
        let mut search = Search::new(&start_view, Metric::L2, row(v));
        let mut ids: Vec<u32> = search.next_round(&start_view, pool).iter().map(|h| h.node).collect();
        ids.extend(start.neighbors(v as u32));
        ids.sort_unstable();
        ids.dedup();
        ids.retain(|&x| x != v as u32);
        let kept = Candidates::collect(&start_view, row(v), ids).filter(filter, pool, degree);
        kept.into_iter().map(|k| k.0).collect::<Vec<u32>>()
    })?;
    // store: reverse edges, full lists filtered again, TSDG's order
    let mut incoming: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (v, list) in lists.iter().enumerate() {
        for &u in list {
            incoming[u as usize].push(v as u32);
        }
    }
    let stored = in_steps(n, &mut done, steps, progress, |u| {
        let mut ids = lists[u].clone();
        ids.extend(&incoming[u]);
        ids.sort_unstable();
        ids.dedup();
        let c = Candidates::collect(&start_view, row(u), ids);
        let list = if c.len() > degree { c.filter(filter, usize::MAX, degree) } else { c.nearest(usize::MAX).0 };
        let list = match params.algorithm {
            Algorithm::Tsdg { max_lambda, .. } => {
                let (cands, vecs) =
                    Candidates::collect(&start_view, row(u), list.iter().map(|k| k.0)).nearest(usize::MAX);
                tsdg_order(&cands, &vecs, dim, max_lambda)
            }
            _ => list,
        };
        list.into_iter().map(|k| k.0).collect::<Vec<u32>>()
    })?;
    drop(lists);
    let mut adjacency = vec![NO_NODE; n * degree];
    for (v, list) in stored.iter().enumerate() {
        adjacency[v * degree..v * degree + list.len()].copy_from_slice(list);
    }
    drop(stored);
    connect(vectors, dim, degree, &mut adjacency, start.entry, pool);
    done += 1;
    if !progress.round(done, steps) {
        return None;
    }
    Some(Graph { degree, adjacency, entry: start.entry })
}

/// `f` of every node 0..n on all threads, STEP nodes at a time, reporting
/// each step to `progress` (on this thread); None when it says stop.
fn in_steps<T: Send>(
    n: usize,
    done: &mut usize,
    steps: usize,
    progress: &mut dyn Progress,
    f: impl Fn(usize) -> T + Sync,
) -> Option<Vec<T>> {
    let mut out = Vec::with_capacity(n);
    for first in (0..n).step_by(STEP) {
        out.par_extend((first..(first + STEP).min(n)).into_par_iter().map(&f));
        *done += 1;
        if !progress.round(*done, steps) {
            return None;
        }
    }
    Some(out)
}

/// Makes every node reachable from `entry`: a node no walk reaches is
/// linked from the nearest reached node a search for it finds (appended to
/// that node's list, or in place of its last edge when full), and what it
/// reaches is reached from then on. Returns the links added.
fn connect(vectors: &[f32], dim: usize, degree: usize, adjacency: &mut [u32], entry: Option<u32>, ef: usize) -> usize {
    let n = vectors.len() / dim;
    let Some(entry) = entry else { return 0 };
    let mut reached = vec![false; n];
    walk(adjacency, degree, entry, &mut reached);
    let mut links = 0;
    for u in 0..n {
        if reached[u] {
            continue;
        }
        let from = {
            let view = View { vectors, dim, degree, adjacency, entry: Some(entry) };
            let mut search = Search::new(&view, Metric::L2, &vectors[u * dim..(u + 1) * dim]);
            let hits = search.next_round(&view, ef);
            hits.iter().map(|h| h.node).find(|&w| reached[w as usize] && w as usize != u).unwrap_or(entry)
        };
        let list = &mut adjacency[from as usize * degree..(from as usize + 1) * degree];
        let slot = list.iter().position(|&x| x == NO_NODE).unwrap_or(degree - 1);
        list[slot] = u as u32;
        links += 1;
        walk(adjacency, degree, u as u32, &mut reached);
    }
    links
}

/// Marks what a walk from `from` reaches.
fn walk(adjacency: &[u32], degree: usize, from: u32, reached: &mut [bool]) {
    let mut stack = vec![from];
    reached[from as usize] = true;
    while let Some(v) = stack.pop() {
        for &w in adjacency[v as usize * degree..(v as usize + 1) * degree].iter().take_while(|&&x| x != NO_NODE) {
            if !reached[w as usize] {
                reached[w as usize] = true;
                stack.push(w);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_links_an_island() {
        // 0 → 1, and 2 ↔ 3 unreachable from 0: two links make every node reached
        let vectors = [0.0, 1.0, 10.0, 11.0];
        let mut adjacency = vec![1, NO_NODE, NO_NODE, NO_NODE, 3, NO_NODE, 2, NO_NODE];
        let links = connect(&vectors, 1, 2, &mut adjacency, Some(0), 4);
        let mut reached = vec![false; 4];
        walk(&adjacency, 2, 0, &mut reached);
        assert!(reached.iter().all(|&r| r), "{adjacency:?}");
        assert_eq!(links, 1, "linking 2 reaches 3 through it: {adjacency:?}");
    }
}
