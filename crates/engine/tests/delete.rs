//! Deleting a fifth of the rows and repairing the graph (VACUUM).

mod common;

use common::*;
use gpu_graph_engine::dataset::Matrix;
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::idset::IdSet;
use gpu_graph_engine::insert::insert;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::recall::exact_knn;
use gpu_graph_engine::repair::{needed, repair, repair_from};
use gpu_graph_engine::search::search;
use gpu_graph_engine::store::{GraphMut, GraphView, Visit};

const N: usize = 20_000;

/// A random fifth of the rows.
fn random_fifth() -> IdSet {
    let mut rng = Rng(0x0dd5);
    let mut dead = IdSet::default();
    while dead.len() < N / 5 {
        dead.insert(rng.below(N) as u32);
    }
    dead
}

#[test]
fn delete_a_random_fifth() {
    let (base, queries) = sift(N);
    delete_and_repair(&base, &queries, random_fifth());
}

/// A whole region goes: the nodes around it lose most of their lists.
#[test]
fn delete_the_fifth_nearest_one_point() {
    let (base, queries) = sift(N);
    let near = exact_knn(&base.data, base.dim, queries.row(0), N / 5, Metric::L2);
    delete_and_repair(&base, &queries, near[0].iter().map(|x| x.0).collect());
}

/// The same with the lists computed on all cores from a snapshot.
#[test]
fn delete_a_random_fifth_from_a_snapshot() {
    let (base, queries) = sift(N);
    delete_and_repair_with(&base, &queries, random_fifth(), Copy::Whole(None));
}

/// The same on a pool of two threads (VACUUM's, sized by
/// max_parallel_maintenance_workers).
#[test]
fn delete_a_random_fifth_from_a_snapshot_on_two_threads() {
    let (base, queries) = sift(N);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    delete_and_repair_with(&base, &queries, random_fifth(), Copy::Whole(Some(&pool)));
}

/// From a copy of every list but only the vectors `needed` names (VACUUM's):
/// the repair reads no other (the copy panics if it does), and the graph
/// comes out as whole as from a copy of everything. A few deletes, whose
/// copy holds a small share of the vectors, and a fifth of the rows.
#[test]
fn delete_a_few_from_the_needed_vectors() {
    let (base, queries) = sift(N);
    let mut rng = Rng(0xfe3);
    let few: IdSet = (0..40).map(|_| rng.below(N) as u32).collect();
    delete_and_repair_with(&base, &queries, few, Copy::Needed);
}

#[test]
fn delete_a_random_fifth_from_the_needed_vectors() {
    let (base, queries) = sift(N);
    delete_and_repair_with(&base, &queries, random_fifth(), Copy::Needed);
}

fn delete_and_repair(base: &Matrix<f32>, queries: &Matrix<f32>, dead: IdSet) {
    delete_and_repair_with(base, queries, dead, Copy::None);
}

/// What the repair reads the graph from.
enum Copy<'a> {
    /// the store itself, list by list
    None,
    /// a copy of everything, on that pool (None: rayon's global one)
    Whole(Option<&'a rayon::ThreadPool>),
    /// a copy of every list and of the vectors `needed` names
    Needed,
}

/// A copy that panics when asked for a node's vector it was not given.
struct Strict {
    copy: FlatIndex,
    wanted: Vec<bool>,
}

impl GraphView for Strict {
    fn stored_dim(&self) -> usize {
        self.copy.stored_dim()
    }
    fn degree(&self) -> usize {
        self.copy.degree()
    }
    fn node_count(&self) -> u32 {
        self.copy.node_count()
    }
    fn entry(&self) -> Option<u32> {
        self.copy.entry()
    }
    fn visit<F: FnOnce(&[f32]) -> f32>(&self, node: u32, dist: F) -> Option<Visit> {
        assert!(self.wanted[node as usize], "the repair read node {node}'s vector, which `needed` did not name");
        self.copy.visit(node, dist)
    }
    fn neighbors(&self, node: u32, out: &mut Vec<u32>) {
        self.copy.neighbors(node, out)
    }
}

/// `store`'s lists and the vectors `needed` names, as VACUUM copies them.
fn needed_copy(store: &impl GraphView, deleted: &[u32]) -> Strict {
    let adjacency = store.adjacency();
    let wanted = needed(&adjacency, store.degree(), deleted, None);
    let copy = FlatIndex::snapshot_of(Metric::L2, store, adjacency, &wanted).unwrap();
    Strict { copy, wanted }
}

/// How a delete is repaired (`snapshot`), then every check.
fn delete_and_repair_with(base: &Matrix<f32>, queries: &Matrix<f32>, mut dead: IdSet, snapshot: Copy) {
    let n = base.len();
    let store = build_store(Metric::L2, base, &BuildParams::default());
    // the entry point goes too, so repair has to move it
    let entry = store.entry().unwrap();
    dead.insert(entry);
    let deleted: Vec<u32> = dead.iter().copied().collect();
    for &d in &deleted {
        store.mark_deleted(d);
    }
    let mut batches = 0;
    let stats = match snapshot {
        Copy::None => repair(&store, &deleted),
        Copy::Whole(pool) => {
            let copy = FlatIndex::snapshot(Metric::L2, &store).unwrap();
            repair_from(&store, &copy, &deleted, 4096, pool, &mut || batches += 1)
        }
        Copy::Needed => {
            let copy = needed_copy(&store, &deleted);
            let share = copy.wanted.iter().filter(|&&w| w).count() as f64 / n as f64;
            println!("the copy holds {:.1}% of the vectors", share * 100.0);
            repair_from(&store, &copy, &deleted, 4096, None, &mut || batches += 1)
        }
    };
    if !matches!(snapshot, Copy::None) {
        assert_eq!(batches, N.div_ceil(4096));
    }
    println!("{stats:?}");
    assert_eq!(stats.freed as usize, deleted.len());
    assert!(stats.repaired > 0);
    assert!(store.entry().is_some_and(|e| !dead.contains(&e)));

    // no list holds a freed node, and freed nodes hold no list
    let mut list = Vec::new();
    for v in 0..n as u32 {
        store.neighbors(v, &mut list);
        if dead.contains(&v) {
            assert!(store.visit(v, |_| 0.0).is_none() && list.is_empty());
        } else {
            assert!(!list.iter().any(|u| dead.contains(u)), "node {v} points at a freed node");
        }
    }

    // every live node is reachable from the entry point again
    let mut seen = vec![false; n];
    let mut stack = vec![store.entry().unwrap()];
    seen[stack[0] as usize] = true;
    while let Some(x) = stack.pop() {
        store.neighbors(x, &mut list);
        for &y in &list {
            if !seen[y as usize] {
                seen[y as usize] = true;
                stack.push(y);
            }
        }
    }
    let unreached = (0..n).filter(|&v| !seen[v] && !dead.contains(&(v as u32))).count();
    assert_eq!(unreached, 0, "live nodes no walk reaches ({} relinked)", stats.relinked);

    // exact ground truth over the rows that remain; payload = row
    let live: Vec<usize> = (0..n).filter(|r| !dead.contains(&(*r as u32))).collect();
    let rows: Vec<f32> = live.iter().flat_map(|&r| base.row(r).iter().copied()).collect();
    let kth = kth_exact(Metric::L2, &rows, base.dim, queries);
    for q in 0..queries.len() {
        for h in search(&store, Metric::L2, queries.row(q), K, 40) {
            assert!(!dead.contains(&h.node), "query {q} returned deleted node {}", h.node);
        }
    }
    let r = recall(&store, Metric::L2, base, queries, &kth, 40);
    println!("recall@10 at ef 40 after deleting {}: {r:.4}", deleted.len());
    assert!(r >= 0.93, "recall@10 = {r}");

    // freed slots are reused by later inserts
    let id = insert(&store, base.row(0), u64::MAX, 64);
    assert!(dead.contains(&id), "insert reused a freed slot");
}
