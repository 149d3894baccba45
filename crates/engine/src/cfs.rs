//! Collect-Filter-Store (Tagore's GNN-Descent paper, CFS; TSDG's two
//! stages): NSG, Vamana, CAGRA and TSDG graphs made from a start graph, on
//! all rayon threads.
//!
//! - Collect: the nodes a search for the node's vector finds over the start
//!   graph (beam `pool`: the "path" collect), a batch of nodes at a time by
//!   a [`CollectRows`] (the CPU's search or the GPU's), and the node's own
//!   start list (the "1-hop" collect).
//! - Filter: the graph's [`Filter`] over the `pool` nearest of them, a
//!   batch of nodes at a time by a [`FilterRows`] (the CPU's or the GPU's).
//! - Store: every kept edge offered back to its target (reverse edges); a
//!   list then over the degree is filtered again by the same filter; TSDG
//!   orders each list by (lambda, distance) ([`Filter::TsdgOrder`], by the
//!   same [`FilterRows`]: on the GPU it took 11 of tsdg's 19 s on 1M SIFT
//!   on 16 CPU threads); last, every
//!   node is made reachable from the entry point (a node no walk from the
//!   entry reaches is linked from the nearest reachable node a search for
//!   it finds; the paper is silent on this, NSG's DFS tree does the same).
//!
//! The start graph is RNN-Descent's: the search of the collect needs a
//! navigable graph, and its lists are the 1-hop candidates. Built on the
//! CPU, it scans its pools in [`START_ORDER`], the GPU's order.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use crate::collect_rows::{CollectRows, CpuCollect};
use crate::filter::Filter;
use crate::filter_rows::{CpuFilters, FilterRows};
use crate::graph::Graph;
use crate::metric::{graph_distance, Metric};
use crate::params::ScanOrder;
use crate::rnn_descent::Progress;
use crate::search::Search;
use crate::store::{GraphView, Visit};
use crate::NO_NODE;

/// The scan order of the RNN-Descent graph a CFS graph is refined from,
/// on the CPU as on the GPU (GRNND's). From the CPU's start in ascending
/// order the CFS graphs lost up to 0.02 of recall@10 at ef 20 against the
/// GPU's (1M x768: NSG 0.922 against 0.938-0.948); in this order they
/// come within 0.01 (docs/benchmarks.md, "The CPU's start of a CFS graph in
/// the GPU's scan order").
pub const START_ORDER: ScanOrder = ScanOrder::Random;

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

    /// What orders each kept list after the filter: TSDG's (lambda,
    /// distance) order; None for the others (distance order).
    pub fn order(self) -> Option<Filter> {
        match self {
            Algorithm::Tsdg { max_lambda, .. } => Some(Filter::TsdgOrder { max_lambda }),
            _ => None,
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

impl CfsParams {
    /// The collect search's beam: `pool`, at least the degree.
    pub fn beam(&self) -> usize {
        self.pool.max(self.degree)
    }
}

/// Nodes per step between progress reports (a cancel waits for one step).
const STEP: usize = 16_384;

/// A graph over stored vectors, as a store: a hit's payload is its node id.
pub(crate) struct View<'a> {
    pub vectors: &'a [f32],
    pub dim: usize,
    pub degree: usize,
    pub adjacency: &'a [u32],
    pub entry: Option<u32>,
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
/// vectors), from `start` (same nodes, its entry kept), filtered on all
/// rayon threads. None when `progress` says stop.
pub fn refine(
    vectors: &[f32],
    dim: usize,
    start: &Graph,
    params: &CfsParams,
    progress: &mut dyn Progress,
) -> Option<Graph> {
    let mut filters = CpuFilters { vectors, dim };
    let Ok(g) =
        refine_with(vectors, dim, start, params, &mut CpuCollect { vectors, dim, start }, &mut filters, progress);
    g
}

/// [`refine`] with the collect's searches done by `collect` and the filter
/// step by `filters` (the GPU's, say), a batch of nodes per step; the rest
/// of the collect, the reverse edges, TSDG's order and `connect` stay here,
/// on all rayon threads. Fails only when `collect` or `filters` does.
pub fn refine_with<C: CollectRows, F: FilterRows<Error = C::Error>>(
    vectors: &[f32],
    dim: usize,
    start: &Graph,
    params: &CfsParams,
    collect: &mut C,
    filters: &mut F,
    progress: &mut dyn Progress,
) -> Result<Option<Graph>, F::Error> {
    let n = vectors.len().checked_div(dim).unwrap_or(0);
    let (degree, pool, filter) = (params.degree, params.beam(), params.algorithm.filter());
    let row = |v: usize| &vectors[v * dim..(v + 1) * dim];
    let steps = 2 * n.div_ceil(STEP) + 1;
    let mut done = 0;
    // collect and filter
    let lists = in_steps(n, &mut done, steps, progress, |nodes| {
        let hits = collect.collect_rows(nodes.clone(), pool)?;
        debug_assert_eq!(hits.len(), nodes.len(), "one row of hits a node");
        let rows: Vec<Vec<(u32, f32)>> = nodes
            .into_par_iter()
            .zip(hits)
            .map(|(v, mut cands)| {
                // the node's own list beside the hits: only its nodes the
                // search did not find need a distance
                for u in start.neighbors(v as u32) {
                    if !cands.iter().any(|c| c.0 == u) {
                        cands.push((u, graph_distance(row(v), row(u as usize))));
                    }
                }
                cands.retain(|c| c.0 != v as u32);
                by_distance(&mut cands, pool);
                cands
            })
            .collect();
        let kept = filters.filter_rows(filter, &rows, degree)?;
        Ok(rows.par_iter().zip(kept).map(|(row, ids)| with_distances(row, &ids)).collect())
    })?;
    let Some(lists) = lists else { return Ok(None) };
    // store: reverse edges, full lists filtered again, TSDG's order
    let incoming = Incoming::of(&lists);
    let stored = in_steps(n, &mut done, steps, progress, |nodes| {
        let mut rows: Vec<Vec<(u32, f32)>> = nodes
            .into_par_iter()
            .map(|u| {
                // no distance computed again: a list's come from its
                // collect, and an incoming edge's is the same (the graph
                // distance is symmetric, bit for bit)
                let mut c = lists[u].clone();
                c.extend(incoming.of_node(u));
                c.sort_unstable_by_key(|x| x.0);
                c.dedup_by_key(|x| x.0);
                by_distance(&mut c, usize::MAX);
                c
            })
            .collect();
        // only the lists over the degree are filtered again
        let over: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].len() > degree).collect();
        let full: Vec<Vec<(u32, f32)>> = over.iter().map(|&i| std::mem::take(&mut rows[i])).collect();
        let kept = filters.filter_rows(filter, &full, degree)?;
        let refiltered: Vec<Vec<(u32, f32)>> =
            full.par_iter().zip(kept).map(|(row, list)| with_distances(row, &list)).collect();
        for (i, list) in over.into_iter().zip(refiltered) {
            rows[i] = list;
        }
        if let Some(order) = params.algorithm.order() {
            // TSDG's second stage: each kept list in its (lambda, distance)
            // order, by the same FilterRows (on the GPU when it filters)
            return filters.filter_rows(order, &rows, degree);
        }
        Ok(rows.into_iter().map(|r| r.into_iter().map(|k| k.0).collect()).collect())
    })?;
    let Some(stored) = stored else { return Ok(None) };
    // a million small lists each: filled and freed on every thread (one
    // thread took a quarter of a second at 500k rows, in a GPU build's
    // refinement of a few seconds)
    drop(incoming);
    lists.into_par_iter().for_each(drop);
    let mut adjacency = vec![NO_NODE; n * degree];
    adjacency.par_chunks_mut(degree.max(1)).zip(stored.into_par_iter()).for_each(|(out, list)| {
        out[..list.len()].copy_from_slice(&list);
    });
    connect(vectors, dim, degree, &mut adjacency, start.entry, pool);
    done += 1;
    if !progress.round(done, steps) {
        return Ok(None);
    }
    Ok(Some(Graph { degree, adjacency, entry: start.entry }))
}

/// The reverse edges of the collect's lists, node by node (CSR), made on
/// every thread: on one, pushing them into a list a node took 0.64 s at 500k
/// rows, a tenth of a GPU build's refinement. An edge v -> u at distance d
/// is (v, d) among u's; the order within a node's is not fixed (the store
/// sorts and de-duplicates by id, and two entries of one id are the same
/// edge, with the same distance).
struct Incoming {
    /// node u's edges at offsets[u]..offsets[u + 1]
    offsets: Vec<usize>,
    /// (source id, distance bits), packed to be written from any thread
    edges: Vec<AtomicU64>,
}

impl Incoming {
    fn of(lists: &[Vec<(u32, f32)>]) -> Incoming {
        let n = lists.len();
        let counts: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
        lists.par_iter().flatten().for_each(|&(u, _)| {
            counts[u as usize].fetch_add(1, Ordering::Relaxed);
        });
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        for c in &counts {
            offsets.push(offsets[offsets.len() - 1] + c.load(Ordering::Relaxed) as usize);
        }
        // counts become the next free place of each node
        counts.par_iter().enumerate().for_each(|(u, c)| c.store(offsets[u] as u64, Ordering::Relaxed));
        let edges: Vec<AtomicU64> = (0..offsets[n]).into_par_iter().map(|_| AtomicU64::new(0)).collect();
        lists.par_iter().enumerate().for_each(|(v, list)| {
            for &(u, d) in list {
                let at = counts[u as usize].fetch_add(1, Ordering::Relaxed) as usize;
                edges[at].store(((d.to_bits() as u64) << 32) | v as u64, Ordering::Relaxed);
            }
        });
        Incoming { offsets, edges }
    }

    fn of_node(&self, u: usize) -> impl Iterator<Item = (u32, f32)> + '_ {
        self.edges[self.offsets[u]..self.offsets[u + 1]].iter().map(|e| {
            let x = e.load(Ordering::Relaxed);
            (x as u32, f32::from_bits((x >> 32) as u32))
        })
    }
}

/// The ids a filter kept of `row`, with their distances from it. A filter
/// keeps candidates in the row's order (ascending distance), so one walk
/// along the row finds them; an id out of that order (ties) is looked for
/// in the whole row. (A search of the whole row for each id, on one
/// thread, was most of the refinement's own CPU time.)
fn with_distances(row: &[(u32, f32)], kept: &[u32]) -> Vec<(u32, f32)> {
    let mut out = Vec::with_capacity(kept.len());
    let mut at = 0;
    for &id in kept {
        if let Some(i) = row[at..].iter().position(|c| c.0 == id) {
            out.push(row[at + i]);
            at += i + 1;
        } else if let Some(c) = row.iter().find(|c| c.0 == id) {
            out.push(*c);
        }
    }
    debug_assert_eq!(out.len(), kept.len(), "a filter keeps only its candidates");
    out
}

/// The `pool` nearest of distinct candidates, ascending (ties by id), as a
/// filter reads them.
fn by_distance(cands: &mut Vec<(u32, f32)>, pool: usize) {
    cands.sort_unstable_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    cands.truncate(pool);
}

/// `step` over the nodes 0..n, STEP of them at a time, reporting each step
/// to `progress` (on this thread); Ok(None) when it says stop.
fn in_steps<T, E>(
    n: usize,
    done: &mut usize,
    steps: usize,
    progress: &mut dyn Progress,
    mut step: impl FnMut(Range<usize>) -> Result<Vec<T>, E>,
) -> Result<Option<Vec<T>>, E> {
    let mut out = Vec::with_capacity(n);
    for first in (0..n).step_by(STEP) {
        out.extend(step(first..(first + STEP).min(n))?);
        *done += 1;
        if !progress.round(*done, steps) {
            return Ok(None);
        }
    }
    Ok(Some(out))
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

    /// 1,500 points of small integer coordinates (exact distances, some
    /// duplicates) and their exact 12-NN graph as the start.
    pub(crate) fn synthetic() -> (Vec<f32>, usize, Graph) {
        let (n, dim, k) = (1500usize, 6usize, 12usize);
        let mut rng = crate::random::SplitMix64(7);
        let vectors: Vec<f32> = (0..n * dim).map(|_| rng.below(12) as f32).collect();
        let row = |i: usize| &vectors[i * dim..(i + 1) * dim];
        let mut adjacency = Vec::with_capacity(n * k);
        for v in 0..n {
            let mut all: Vec<(f32, u32)> =
                (0..n).filter(|&u| u != v).map(|u| (crate::metric::graph_distance(row(v), row(u)), u as u32)).collect();
            all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            adjacency.extend(all[..k].iter().map(|x| x.1));
        }
        (vectors, dim, Graph { degree: k, adjacency, entry: Some(0) })
    }

    /// FNV-1a of a graph's lists.
    pub(crate) fn fingerprint(g: &Graph) -> u64 {
        g.adjacency.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100_0000_01b3))
    }

    /// The graphs of every algorithm on the synthetic set, as they were
    /// before the filter step became pluggable (fingerprints taken then).
    #[test]
    fn graphs_as_before() {
        let (vectors, dim, start) = synthetic();
        for (algorithm, want) in [
            (Algorithm::Nsg, 3094084645836247716u64),
            (Algorithm::Vamana { alpha: 1.2 }, 1889142407728006807),
            (Algorithm::Cagra, 17756186933247500228),
            (Algorithm::Tsdg { alpha: 1.2, max_lambda: 4 }, 8325050092476221709),
        ] {
            let p = CfsParams { algorithm, degree: 10, pool: 24 };
            let g = refine(&vectors, dim, &start, &p, &mut |_: usize, _: usize| true).expect("not cancelled");
            assert_eq!(fingerprint(&g), want, "{algorithm:?}");
        }
    }

    /// A FilterRows that checks each row's order, filters it alone and
    /// fails at call `fail_at`.
    struct OneByOne<'a> {
        vectors: &'a [f32],
        dim: usize,
        calls: usize,
        fail_at: usize,
    }

    impl FilterRows for OneByOne<'_> {
        type Error = String;
        fn filter_rows(
            &mut self,
            filter: Filter,
            rows: &[Vec<(u32, f32)>],
            degree: usize,
        ) -> Result<Vec<Vec<u32>>, String> {
            self.calls += 1;
            if self.calls == self.fail_at {
                return Err("failed".into());
            }
            let mut cpu = CpuFilters { vectors: self.vectors, dim: self.dim };
            let mut out = Vec::new();
            for row in rows {
                assert!(row.windows(2).all(|w| (w[0].1, w[0].0) < (w[1].1, w[1].0)), "ascending, distinct");
                let Ok(kept) = cpu.filter_rows(filter, std::slice::from_ref(row), degree);
                out.extend(kept);
            }
            Ok(out)
        }
    }

    /// A CollectRows that hands out the CPU's hits in reverse order (the
    /// order of a row is free), or fails.
    struct Reversed<'a> {
        cpu: CpuCollect<'a>,
        fail: bool,
    }

    impl CollectRows for Reversed<'_> {
        type Error = String;
        fn collect_rows(&mut self, nodes: Range<usize>, pool: usize) -> Result<Vec<Vec<(u32, f32)>>, String> {
            if self.fail {
                return Err("no search".into());
            }
            let Ok(mut hits) = self.cpu.collect_rows(nodes, pool);
            hits.iter_mut().for_each(|h| h.reverse());
            Ok(hits)
        }
    }

    #[test]
    fn pluggable_steps_give_the_same_graph() {
        let (vectors, dim, start) = synthetic();
        for algorithm in [Algorithm::Nsg, Algorithm::Cagra, Algorithm::Tsdg { alpha: 1.2, max_lambda: 4 }] {
            let p = CfsParams { algorithm, degree: 10, pool: 24 };
            let mut c = Reversed { cpu: CpuCollect { vectors: &vectors, dim, start: &start }, fail: false };
            let mut f = OneByOne { vectors: &vectors, dim, calls: 0, fail_at: 0 };
            let g = refine_with(&vectors, dim, &start, &p, &mut c, &mut f, &mut |_: usize, _: usize| true);
            let want = refine(&vectors, dim, &start, &p, &mut |_: usize, _: usize| true);
            assert_eq!(g, Ok(want), "{algorithm:?}");
            // one batch for the collect, one for the store, and TSDG's order
            let tsdg = matches!(algorithm, Algorithm::Tsdg { .. });
            assert_eq!(f.calls, 2 + tsdg as usize, "batches filtered");
            let mut f = OneByOne { vectors: &vectors, dim, calls: 0, fail_at: 2 };
            let g = refine_with(&vectors, dim, &start, &p, &mut c, &mut f, &mut |_: usize, _: usize| true);
            assert_eq!(g, Err("failed".to_string()), "a failing filter fails the refine");
            let mut f = OneByOne { vectors: &vectors, dim, calls: 0, fail_at: 0 };
            c.fail = true;
            let g = refine_with(&vectors, dim, &start, &p, &mut c, &mut f, &mut |_: usize, _: usize| true);
            assert_eq!(g, Err("no search".to_string()), "a failing collect fails the refine");
            assert_eq!(f.calls, 0, "nothing filtered after it");
        }
    }
}
