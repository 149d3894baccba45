//! Joining the graphs of a sharded build into one (Tagore's merge): each
//! node's lists from its shards united, refined by RNN-Descent's own rounds
//! (the index's one prune rule, reverse offers between rounds, the same
//! final cut), and every node made reachable from the entry point.

use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use crate::distance::prefetch;
use crate::graph::Graph;
use crate::metric::graph_distance;
use crate::params::BuildParams;
use crate::rnn_descent::{self, Progress};
use crate::NO_NODE;

/// Refinement of the united lists: outer rounds and update rounds each.
/// On SIFT 12k in 3,000-row shards (the test below): a union re-cut by
/// rng_prune alone lost 0.025 of recall@10 at ef 20 to the whole build;
/// one update round on the union beats the whole build (0.939 / 0.981
/// against 0.929 / 0.979 at ef 20 / 40), two outer rounds of two more so
/// (0.958 / 0.985) at 2.6× the merge's time.
pub const REFINE: (usize, usize) = (1, 1);
/// Rounds of linking unreached nodes before giving up (a scan sweeps any
/// node its walk never reached, so one left over costs speed, not rows).
const REPAIR_ROUNDS: usize = 16;
/// Rows asked for ahead of their distance (as RNN-Descent's update does).
const PREFETCH_AHEAD: usize = 8;

/// The merged graph over `n` = vectors / dim nodes, and the nodes the
/// connectivity repair linked; None when `progress` cancels. `shards[s]`
/// lists shard s's global ids (its local id i is `shards[s][i]`),
/// `graphs[s]` its graph.
pub fn merge(
    vectors: &[f32],
    dim: usize,
    params: &BuildParams,
    shards: &[Vec<u32>],
    graphs: &[Graph],
    progress: &mut dyn Progress,
) -> Option<(Graph, usize)> {
    let n = vectors.len() / dim;
    let row = |i: u32| &vectors[i as usize * dim..(i as usize + 1) * dim];
    // where each node sits in its shards: (shard, local id), two at most
    let mut homes = vec![[(u32::MAX, 0u32); 2]; n];
    for (s, ids) in shards.iter().enumerate() {
        for (local, &g) in ids.iter().enumerate() {
            let h = &mut homes[g as usize];
            let slot = if h[0].0 == u32::MAX { 0 } else { 1 };
            h[slot] = (s as u32, local as u32);
        }
    }
    // each node's lists united, with their distances; its first shard's
    // entries old (their pairs were tested in that shard's rounds), the
    // second's new, so the update tests the pairs across the two
    let lists: Vec<Vec<(u32, f32, bool)>> = (0..n as u32)
        .into_par_iter()
        .map(|x| {
            let mut cands: Vec<(u32, bool)> = Vec::new();
            for (i, &(s, local)) in homes[x as usize].iter().enumerate().filter(|h| h.1 .0 != u32::MAX) {
                let ids = &shards[s as usize];
                cands.extend(graphs[s as usize].neighbors(local).map(|l| (ids[l as usize], i == 1)));
            }
            // an id in both lists stays old
            cands.sort_unstable();
            cands.dedup_by_key(|c| c.0);
            cands.retain(|c| c.0 != x);
            // the rows lie anywhere in memory: ask for a few ahead of use
            for c in cands.iter().take(PREFETCH_AHEAD) {
                prefetch(row(c.0));
            }
            (0..cands.len())
                .map(|i| {
                    if let Some(ahead) = cands.get(i + PREFETCH_AHEAD) {
                        prefetch(row(ahead.0));
                    }
                    let (c, new) = cands[i];
                    (c, graph_distance(row(x), row(c)), new)
                })
                .collect()
        })
        .collect();
    drop(homes);
    let mut graph = rnn_descent::refine(vectors, dim, params, lists, REFINE.0, REFINE.1, progress)?;
    let repaired = ensure_reachable(&mut graph, vectors, dim);
    Some((graph, repaired))
}

/// Makes every node reachable from the graph's entry point ([`connect`]);
/// the nodes linked. A built RNG graph can leave a few nodes that no list
/// names (a search's final sweep still finds them, but no walk does).
pub fn ensure_reachable(graph: &mut Graph, vectors: &[f32], dim: usize) -> usize {
    match graph.entry {
        Some(entry) => connect(graph, entry, vectors, dim),
        None => 0,
    }
}

/// Links every node unreachable from `entry` to a reached one: the nearest
/// reached node of its own list when it has one, else the nearest reached
/// node of all (for one node of each island a round). The link goes into
/// the reached node's list, in a spare slot or over its farthest entry;
/// rounds repeat until all are reached. The nodes linked.
fn connect(graph: &mut Graph, entry: u32, vectors: &[f32], dim: usize) -> usize {
    let (n, degree) = (graph.len(), graph.degree);
    let row = |i: u32| &vectors[i as usize * dim..(i as usize + 1) * dim];
    let mut linked = 0;
    for _ in 0..REPAIR_ROUNDS {
        let reached = reach(graph, entry);
        let unreached: Vec<u32> = (0..n as u32).filter(|&i| !reached[i as usize]).collect();
        if unreached.is_empty() {
            break;
        }
        let mut links: Vec<(u32, u32)> = Vec::new();
        let mut island_done = false;
        for &u in &unreached {
            if let Some(r) = graph.neighbors(u).find(|&r| reached[r as usize]) {
                links.push((r, u));
            } else if !island_done {
                // an island: its nearest reached node of all, one a round
                island_done = true;
                let (_, r) = (0..n as u32)
                    .into_par_iter()
                    .filter(|&r| reached[r as usize])
                    .map(|r| (graph_distance(row(u), row(r)), r))
                    .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
                    .expect("the entry is reached");
                links.push((r, u));
            }
        }
        for (r, u) in links {
            let list = &mut graph.adjacency[r as usize * degree..(r as usize + 1) * degree];
            if list.contains(&u) || degree == 0 {
                continue;
            }
            // lists are nearest first: u goes where its distance puts it,
            // the farthest entry dropped when the list is full
            let d = graph_distance(row(r), row(u));
            let len = list.iter().position(|&x| x == NO_NODE).unwrap_or(degree);
            let at = list[..len].iter().position(|&x| graph_distance(row(r), row(x)) > d).unwrap_or(len);
            if at == degree {
                list[degree - 1] = u;
            } else {
                let end = len.min(degree - 1);
                list.copy_within(at..end, at + 1);
                list[at] = u;
            }
            linked += 1;
        }
    }
    linked
}

/// Which nodes a walk from `entry` reaches ([`reach_lists`]).
pub fn reach(graph: &Graph, entry: u32) -> Vec<bool> {
    reach_lists(&graph.adjacency, graph.degree, &[entry])
}

/// Which of the nodes of `adjacency` (`degree` slots a node, NO_NODE after
/// the last neighbour) a walk from `starts` reaches: breadth first, each
/// level's nodes expanded on all cores (one thread took 2-3 s of a 10M-row
/// build's graph). Ids out of range are not followed, so lists read from a
/// damaged index walk safely. The one walk of the builds' reachability
/// repair, VACUUM's relink and gpu_graph_verify.
pub fn reach_lists(adjacency: &[u32], degree: usize, starts: &[u32]) -> Vec<bool> {
    let n = adjacency.len().checked_div(degree).unwrap_or(0);
    let seen: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
    let fresh = |y: u32| (y as usize) < n && !seen[y as usize].swap(true, Ordering::Relaxed);
    let mut level: Vec<u32> = starts.iter().copied().filter(|&s| fresh(s)).collect();
    while !level.is_empty() {
        level = level
            .par_iter()
            .flat_map_iter(|&x| {
                adjacency[x as usize * degree..(x as usize + 1) * degree]
                    .iter()
                    .copied()
                    .take_while(|&y| y != NO_NODE)
                    .filter(|&y| fresh(y))
            })
            .collect();
    }
    seen.into_iter().map(AtomicBool::into_inner).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn islands_are_linked() {
        // two far groups, each a clique: the second unreachable from the first
        let vectors: Vec<f32> = [0.0, 0.1, 0.2, 100.0, 100.1, 100.2].to_vec();
        let adjacency = vec![1, 2, 0, 2, 1, 0, 4, 5, 3, 5, 4, 3];
        let mut g = Graph { degree: 2, adjacency, entry: Some(0) };
        assert!(!reach(&g, 0)[3]);
        let linked = connect(&mut g, 0, &vectors, 1);
        assert!(linked >= 1);
        assert!(reach(&g, 0).iter().all(|&r| r));
        // node 2's list: 3 replaced its farthest entry, nearest first
        assert_eq!(g.neighbors(2).collect::<Vec<_>>(), vec![1, 3]);
    }
}
