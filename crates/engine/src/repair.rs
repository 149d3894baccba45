//! Removing deleted nodes from the graph (VACUUM) without losing recall.
//!
//! Two ways, one rule: [`repair`] rebuilds list after list through the store;
//! [`repair_from`] computes every new list on all cores from an in-memory
//! snapshot of the graph, then writes them through the store. Through
//! PostgreSQL's buffers the first took 29-40 s for a third of 100k rows
//! (every candidate's vector read under a buffer lock, on one core), ten
//! times a rebuild. Either way a list is written only if it still equals
//! what it was computed from (else computed again from the store), so
//! concurrent inserts and searches stay safe.

use rayon::prelude::*;

use crate::candidates::Candidates;
use crate::idset::IdSet;
use crate::merge::reach_lists;
use crate::metric::{graph_distance, Metric};
use crate::search::search;
use crate::store::{GraphMut, GraphView};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RepairStats {
    /// lists that pointed at a deleted node and were rebuilt
    pub repaired: u64,
    /// deleted nodes freed for reuse
    pub freed: u64,
    /// live nodes no walk reached any more, linked again ([`relink`])
    pub relinked: u64,
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
    finish(store, &dead, stats, Walk::ByList, None)
}

/// [`repair`] with every new list computed on `pool`'s threads (None:
/// rayon's current pool, all cores by default) from `snapshot` (a
/// copy of `store`'s graph taken after the deleted nodes were marked),
/// `batch` lists at a time with `between_batches` called between (where a
/// caller checks for a cancel). Nodes added to `store` after the snapshot
/// are repaired from the store itself.
pub fn repair_from<G: GraphMut, S: GraphView + Sync>(
    store: &G,
    snapshot: &S,
    deleted: &[u32],
    batch: usize,
    pool: Option<&rayon::ThreadPool>,
    between_batches: &mut dyn FnMut(),
) -> RepairStats {
    let dead: IdSet = deleted.iter().copied().collect();
    let degree = snapshot.degree();
    // the store's rule (the copy is only vectors and lists)
    let (filter, order) = (store.filter(), store.order());
    let mut stats = RepairStats::default();
    let n = snapshot.node_count();
    for start in (0..n).step_by(batch.max(1)) {
        between_batches();
        let end = (start + batch as u32).min(n);
        let plans: Vec<(u32, Vec<u32>, Vec<u32>)> = in_pool(pool, || {
            (start..end)
                .into_par_iter()
                .filter_map(|v| {
                    if dead.contains(&v) {
                        return None;
                    }
                    let mut current = Vec::new();
                    snapshot.neighbors(v, &mut current);
                    if !current.iter().any(|u| dead.contains(u)) {
                        return None;
                    }
                    let mut own = Vec::new();
                    snapshot.visit(v, |x| {
                        own.extend_from_slice(x);
                        0.0
                    })?;
                    let ids = candidates(snapshot, v, &current, &dead);
                    let list = Candidates::collect_nearest(snapshot, &own, ids, CANDIDATE_FACTOR * degree)
                        .keep(filter, order, CANDIDATE_FACTOR * degree, degree)
                        .iter()
                        .map(|k| k.0)
                        .collect();
                    Some((v, current, list))
                })
                .collect()
        });
        let written = store.replace_many_if(&plans);
        for ((v, _, _), ok) in plans.iter().zip(written) {
            if ok || rebuild(store, *v, &dead) {
                stats.repaired += 1;
            }
        }
    }
    // inserted meanwhile: from the store, as [`repair`] does
    let mut list = Vec::new();
    for v in n..store.node_count() {
        store.neighbors(v, &mut list);
        if !dead.contains(&v) && list.iter().any(|u| dead.contains(u)) && rebuild(store, v, &dead) {
            stats.repaired += 1;
        }
    }
    finish(store, &dead, stats, Walk::InMemory, pool)
}

/// The nodes whose vectors [`repair_from`] reads from its snapshot, by the
/// lists alone (`adjacency`: n × `degree`, padded with NO_NODE, as the
/// snapshot will hold them): every live node whose list names one of
/// `deleted`, and its [`candidates`]. A snapshot with every list but only
/// these vectors repairs as one of the whole index: the vectors of a
/// VACUUM with few deletes are a small share of the index's.
pub fn needed(adjacency: &[u32], degree: usize, deleted: &[u32], pool: Option<&rayon::ThreadPool>) -> Vec<bool> {
    let n = adjacency.len() / degree.max(1);
    let dead: IdSet = deleted.iter().copied().collect();
    let neighbors = |v: u32, out: &mut Vec<u32>| {
        out.clear();
        if (v as usize) < n {
            let l = &adjacency[v as usize * degree..(v as usize + 1) * degree];
            out.extend(l.iter().copied().take_while(|&u| u != crate::NO_NODE));
        }
    };
    let each: Vec<Vec<u32>> = in_pool(pool, || {
        (0..n as u32)
            .into_par_iter()
            .filter_map(|v| {
                if dead.contains(&v) {
                    return None;
                }
                let mut list = Vec::new();
                neighbors(v, &mut list);
                if !list.iter().any(|u| dead.contains(u)) {
                    return None;
                }
                let mut ids = candidates_by(&neighbors, degree, v, &list, &dead);
                ids.push(v);
                Some(ids)
            })
            .collect()
    });
    let mut want = vec![false; n];
    for u in each.into_iter().flatten() {
        if let Some(w) = want.get_mut(u as usize) {
            *w = true;
        }
    }
    want
}

/// Runs `f`, computation only (the store is the caller's thread's), on
/// `pool`'s threads, or in rayon's current pool.
fn in_pool<R: Send>(pool: Option<&rayon::ThreadPool>, f: impl FnOnce() -> R + Send) -> R {
    match pool {
        Some(p) => p.install(f),
        None => f(),
    }
}

/// Moves the entry point off the dead nodes and frees them.
fn finish<G: GraphMut>(
    store: &G,
    dead: &IdSet,
    mut stats: RepairStats,
    walk: Walk,
    pool: Option<&rayon::ThreadPool>,
) -> RepairStats {
    move_entry(store, dead);
    // only nodes this call frees (a free slot visits as None)
    let mut free: Vec<u32> =
        dead.iter().copied().filter(|&d| store.visit(d, |_| 0.0).is_some_and(|v| v.deleted)).collect();
    free.sort_unstable();
    store.free_many(&free);
    stats.freed = free.len() as u64;
    stats.relinked = relink_in(store, walk, pool) as u64;
    stats
}

/// How [`relink`] walks the graph: over a copy of every list, on all cores
/// (4 × degree bytes a node), or list by list from the store (a node's
/// flag), where the copy would not fit the caller's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walk {
    InMemory,
    ByList,
}

/// Which nodes a walk from `starts` reaches, reading one list at a time
/// from the store: breadth first, each level's nodes read in id order, so
/// that a paged store reads its lists page after page, not at random
/// (ids out of range not followed).
fn reach_store<G: GraphView>(store: &G, starts: &[u32]) -> Vec<bool> {
    let n = store.node_count() as usize;
    let mut seen = vec![false; n];
    let fresh = |y: u32, seen: &mut Vec<bool>| (y as usize) < n && !std::mem::replace(&mut seen[y as usize], true);
    let mut level: Vec<u32> = starts.iter().copied().filter(|&s| fresh(s, &mut seen)).collect();
    while !level.is_empty() {
        level.sort_unstable();
        let mut next = Vec::new();
        store.lists_of(&level, &mut |_, list| next.extend(list.iter().copied().filter(|&y| fresh(y, &mut seen))));
        level = next;
    }
    seen
}

/// Rounds of [`relink`]: each links every unreached node to a reached one,
/// so a chain of unreached nodes takes one round a link.
const RELINK_ROUNDS: usize = 8;

/// Links every live node that no walk from the entry point (and the seeds)
/// reaches to the nearest reached node it can find: the nearest reached
/// node of its own list, else the nearest a search for its vector finds.
/// The link goes into that node's list at its distance, over the farthest
/// entry when full. The nodes linked.
///
/// Why: a node whose in-edges all came from deleted nodes is unreachable
/// once they go (the rebuilt lists of others need not name it). At degree
/// 8, a fifth then a third of 10k rows deleted left 21 such nodes.
pub fn relink<G: GraphMut>(store: &G, walk: Walk) -> usize {
    relink_in(store, walk, None)
}

/// [`relink`] with an in-memory walk on `pool`'s threads (None: rayon's
/// current pool).
pub fn relink_in<G: GraphMut>(store: &G, walk: Walk, pool: Option<&rayon::ThreadPool>) -> usize {
    let Some(entry) = store.entry() else { return 0 };
    let (n, degree) = (store.node_count() as usize, store.degree());
    let mut linked = 0;
    let (mut list, mut own) = (Vec::new(), Vec::new());
    for _ in 0..RELINK_ROUNDS {
        let mut starts = vec![entry];
        store.seeds(&mut starts);
        let seen = match walk {
            Walk::InMemory => {
                let adjacency = store.adjacency();
                in_pool(pool, || reach_lists(&adjacency, degree, &starts))
            }
            Walk::ByList => reach_store(store, &starts),
        };
        let reached = |u: u32| seen.get(u as usize) == Some(&true);
        let unreached: Vec<u32> =
            (0..n as u32).filter(|&u| !reached(u) && store.visit(u, |_| 0.0).is_some_and(|v| !v.deleted)).collect();
        if unreached.is_empty() {
            break;
        }
        for u in unreached {
            own.clear();
            store.visit(u, |x| {
                own.extend_from_slice(x);
                0.0
            });
            store.neighbors(u, &mut list);
            let near = |ids: &mut dyn Iterator<Item = u32>| {
                ids.filter(|&r| reached(r))
                    .filter_map(|r| {
                        store.visit(r, |x| graph_distance(&own, x)).filter(|v| !v.deleted).map(|v| (v.dist, r))
                    })
                    .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            };
            let found = near(&mut list.iter().copied()).or_else(|| {
                let hits = search(store, Metric::L2, &own, store.degree(), 2 * store.degree());
                near(&mut hits.iter().map(|h| h.node))
            });
            if let Some((d, r)) = found {
                link_at_distance(store, r, u, d);
                linked += 1;
            }
        }
    }
    linked
}

/// Puts `u` into `r`'s list where its distance `d` to `r` places it (lists
/// are nearest first), dropping the farthest entry when the list is full;
/// in a graph with an order (TSDG's), the list then in that order.
fn link_at_distance<G: GraphMut>(store: &G, r: u32, u: u32, d: f32) {
    let degree = store.degree();
    let (mut read, mut own) = (Vec::new(), Vec::new());
    loop {
        store.neighbors(r, &mut read);
        if read.contains(&u) {
            return;
        }
        own.clear();
        if store
            .visit(r, |x| {
                own.extend_from_slice(x);
                0.0
            })
            .is_none()
        {
            return;
        }
        let at = read
            .iter()
            .position(|&x| store.visit(x, |v| graph_distance(&own, v)).is_none_or(|v| v.dist > d))
            .unwrap_or(read.len());
        let mut new = read.clone();
        new.insert(at.min(degree - 1), u);
        new.truncate(degree);
        if let Some(order) = store.order() {
            // in the graph's order (TSDG's), unless that order drops the
            // link (its lambda over the limit): the link is what matters
            let ordered: Vec<u32> = Candidates::collect(store, &own, new.iter().copied())
                .ordered(order, degree)
                .iter()
                .map(|k| k.0)
                .collect();
            if ordered.contains(&u) {
                new = ordered;
            }
        }
        if store.replace_neighbors_if(r, &read, &new) {
            return;
        }
    }
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
        let list: Vec<u32> = Candidates::collect_nearest(store, &own, ids, CANDIDATE_FACTOR * degree)
            .keep(store.filter(), store.order(), CANDIDATE_FACTOR * degree, degree)
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
    candidates_by(&|u, out: &mut Vec<u32>| store.neighbors(u, out), store.degree(), v, list, dead)
}

/// [`candidates`] with the lists read through `neighbors`.
fn candidates_by(
    neighbors: &dyn Fn(u32, &mut Vec<u32>),
    degree: usize,
    v: u32,
    list: &[u32],
    dead: &IdSet,
) -> Vec<u32> {
    let limit = MAX_CANDIDATES * degree;
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
    'chains: for _ in 0..CHAIN_STEPS {
        for &d in &frontier {
            if out.len() >= limit {
                break 'chains;
            }
            neighbors(d, &mut buf);
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

/// [`candidates`] stops following chains at this many times the degree
/// (the nearest deleted neighbours' first, as lists are nearest first).
/// With a third of the rows deleted the chains reached thousands of
/// candidates a list, whose distances were most of VACUUM's time, for the
/// prune to keep a few of the nearest 64.
const MAX_CANDIDATES: usize = 8;

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
