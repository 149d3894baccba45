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
use gpu_graph_engine::repair::{repair, repair_from};
use gpu_graph_engine::search::search;
use gpu_graph_engine::store::{GraphMut, GraphView};

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
    delete_and_repair_with(&base, &queries, random_fifth(), Some(None));
}

/// The same on a pool of two threads (VACUUM's, sized by
/// max_parallel_maintenance_workers).
#[test]
fn delete_a_random_fifth_from_a_snapshot_on_two_threads() {
    let (base, queries) = sift(N);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    delete_and_repair_with(&base, &queries, random_fifth(), Some(Some(&pool)));
}

fn delete_and_repair(base: &Matrix<f32>, queries: &Matrix<f32>, dead: IdSet) {
    delete_and_repair_with(base, queries, dead, None);
}

/// `snapshot`: None, repaired through the store; Some(pool), from a
/// snapshot on that pool (None: rayon's global one).
fn delete_and_repair_with(
    base: &Matrix<f32>,
    queries: &Matrix<f32>,
    mut dead: IdSet,
    snapshot: Option<Option<&rayon::ThreadPool>>,
) {
    let n = base.len();
    let store = build_store(Metric::L2, base, &BuildParams::default());
    // the entry point goes too, so repair has to move it
    let entry = store.entry().unwrap();
    dead.insert(entry);
    let deleted: Vec<u32> = dead.iter().copied().collect();
    for &d in &deleted {
        store.mark_deleted(d);
    }
    let stats = if let Some(pool) = snapshot {
        let copy = FlatIndex::snapshot(Metric::L2, &store).unwrap();
        let mut batches = 0;
        let stats = repair_from(&store, &copy, &deleted, 4096, pool, &mut || batches += 1);
        assert_eq!(batches, N.div_ceil(4096));
        stats
    } else {
        repair(&store, &deleted)
    };
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
