//! Removing deleted nodes from the graph (VACUUM) without losing recall.
//!
//! Sequential on purpose: the PostgreSQL store is driven by one VACUUM
//! process, and it is fast enough (a fifth of 20k SIFT rows deleted: 0.33 s
//! for 14.5k rebuilt lists). Lists are rewritten the way insert does
//! (computed from a snapshot, written only if unchanged), so concurrent
//! inserts and searches stay safe.

use crate::candidates::Candidates;
use crate::idset::IdSet;
use crate::metric::graph_distance;
use crate::store::{GraphMut, GraphView};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RepairStats {
    /// lists that pointed at a deleted node and were rebuilt
    pub repaired: u64,
    /// deleted nodes freed for reuse
    pub freed: u64,
}

/// `deleted`: nodes already marked deleted. Every live list that points at one
/// of them is rebuilt from its live neighbours plus the live out-neighbours of
/// its deleted neighbours (connecting in-neighbours to out-neighbours), re-pruned
/// with the one rule; the entry point moves to a live node if it was deleted;
/// then the deleted nodes are freed. Must be safe against concurrent searches
/// (they may see either list) and concurrent inserts.
pub fn repair<G: GraphMut>(store: &G, deleted: &[u32]) -> RepairStats {
    let dead: IdSet = deleted.iter().copied().collect();
    let mut stats = RepairStats::default();
    let mut list = Vec::new();
    for v in 0..store.node_count() {
        if dead.contains(&v) {
            continue;
        }
        store.neighbors(v, &mut list);
        if list.iter().any(|u| dead.contains(u)) && rebuild(store, v, &dead) {
            stats.repaired += 1;
        }
    }
    move_entry(store, &dead);
    for &d in &dead {
        // count only nodes this call frees (a free slot visits as None)
        if store.visit(d, |_| 0.0).is_some_and(|v| v.deleted) {
            store.free(d);
            stats.freed += 1;
        }
    }
    stats
}

/// How many of a rebuilt list's nearest candidates the prune considers:
/// beyond twice the degree the rule rarely keeps anything.
const CANDIDATE_FACTOR: usize = 2;

/// Rebuilds `v`'s list; false when `v` was freed or deleted meanwhile.
fn rebuild<G: GraphMut>(store: &G, v: u32, dead: &IdSet) -> bool {
    let degree = store.degree();
    let mut current = Vec::new();
    let mut own = Vec::new();
    loop {
        store.neighbors(v, &mut current);
        own.clear();
        match store.visit(v, |x| {
            own.extend_from_slice(x);
            0.0
        }) {
            Some(s) if !s.deleted => {}
            _ => return false,
        }
        let ids = candidates(store, v, &current, dead);
        let list: Vec<u32> = Candidates::collect(store, &own, ids)
            .prune(CANDIDATE_FACTOR * degree, degree)
            .iter()
            .map(|k| k.0)
            .collect();
        if store.replace_neighbors_if(v, &current, &list) {
            return true;
        }
    }
}

/// Candidate ids for `v` (distinct, without `v`): its neighbours that are not
/// being deleted, and the out-neighbours of those that are, followed through
/// chains of deleted nodes up to [`CHAIN_STEPS`] steps.
///
/// Two steps of a chain and the deleted ones' out-neighbours recover the
/// recall a delete costs; more steps cost time and buy nothing (measured in
/// docs/benchmarks.md, "VACUUM's repair").
fn candidates<G: GraphView>(store: &G, v: u32, list: &[u32], dead: &IdSet) -> Vec<u32> {
    let mut seen = IdSet::default();
    seen.insert(v);
    let mut out = Vec::new();
    let mut frontier: Vec<u32> = Vec::new();
    let mut next = Vec::new();
    let mut buf = Vec::new();
    for &u in list {
        if seen.insert(u) {
            if dead.contains(&u) {
                frontier.push(u)
            } else {
                out.push(u)
            }
        }
    }
    for _ in 0..CHAIN_STEPS {
        for &d in &frontier {
            store.neighbors(d, &mut buf);
            for &w in &buf {
                if seen.insert(w) {
                    if dead.contains(&w) {
                        next.push(w)
                    } else {
                        out.push(w)
                    }
                }
            }
        }
        std::mem::swap(&mut frontier, &mut next);
        next.clear();
    }
    out
}

/// How far [`candidates`] follows chains of deleted nodes.
const CHAIN_STEPS: usize = 2;

/// Moves the entry point off a deleted node: to the live node nearest it
/// within two steps (so the entry stays central), else any live node.
fn move_entry<G: GraphMut>(store: &G, dead: &IdSet) {
    let Some(e) = store.entry() else { return };
    let mut own = Vec::new();
    match store.visit(e, |x| {
        own.extend_from_slice(x);
        0.0
    }) {
        Some(s) if !s.deleted && !dead.contains(&e) => return,
        None => {}
        Some(_) => {
            let mut near = Vec::new();
            let mut buf = Vec::new();
            store.neighbors(e, &mut near);
            for i in 0..near.len() {
                store.neighbors(near[i], &mut buf);
                near.extend_from_slice(&buf);
            }
            let best = near
                .iter()
                .filter(|u| !dead.contains(u) && **u != e)
                .filter_map(|&u| {
                    store.visit(u, |x| graph_distance(&own, x)).filter(|s| !s.deleted).map(|s| (s.dist, u))
                })
                .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            if let Some((_, u)) = best {
                store.set_entry(Some(u));
                return;
            }
        }
    }
    let any =
        (0..store.node_count()).find(|&u| !dead.contains(&u) && store.visit(u, |_| 0.0).is_some_and(|s| !s.deleted));
    store.set_entry(any);
}
