//! Joining the graphs of a sharded build into one (Tagore's merge): each
//! node's lists from its two shards united and cut by distance, and every
//! node made reachable from the entry point.
//!
//! The cut is RNN-Descent's final cut, with no occlusion test across the
//! shards: each list was pruned by the index's rule in its own shard, and a
//! union needs no vectors, so the merge runs on lists alone (out of core,
//! its lists read back from temporary files). Measured on SIFT (2 cores,
//! recall@10 at ef 20 / 40): 500k rows in 9 shards, the union cut 0.981 /
//! 0.993, the union refined by an update round with the vectors (the merge
//! before) 0.982 / 0.995, the union re-pruned by the rule 0.960 / 0.981, the
//! whole build 0.964 / 0.986; 100k in 18 shards: 0.959 / 0.983, 0.954 /
//! 0.983, 0.943 / 0.976, 0.940 / 0.975.

use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use crate::graph::{final_cut, Graph};
use crate::metric::graph_distance;
use crate::NO_NODE;

/// Rounds of linking unreached nodes before giving up (a scan sweeps any
/// node its walk never reached, so one left over costs speed, not rows).
const REPAIR_ROUNDS: usize = 16;

/// Node `x`'s list (`out`, its length the degree) from the (distance, id)
/// entries of its shards' lists: the nearest, each id once.
pub fn union_cut(x: u32, cands: &[(f32, u32)], scratch: &mut Vec<(f32, u32)>, out: &mut [u32]) {
    final_cut(x, cands.iter().copied(), scratch, out);
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
