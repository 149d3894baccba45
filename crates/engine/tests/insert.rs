//! Inserting into a built graph keeps it searchable: sequentially and from
//! several threads at once.

mod common;

use common::*;
use gpu_graph_engine::insert::{insert, insert_near};
use gpu_graph_engine::memory::MemoryStore;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::search::search;
use gpu_graph_engine::store::GraphView;

const BUILT: usize = 20_000;
const ADDED: usize = 5_000;
const EF_CONSTRUCTION: usize = 64;

/// Recall over all rows, and every inserted row found by a search for itself.
fn check(
    store: &MemoryStore,
    base: &gpu_graph_engine::dataset::Matrix<f32>,
    queries: &gpu_graph_engine::dataset::Matrix<f32>,
    ids: &[u32],
) {
    assert_eq!(store.node_count() as usize, BUILT + ADDED);
    let kth = kth_truth("sift128", Metric::L2, base, queries);
    let r = recall(store, Metric::L2, base, queries, &kth, 40);
    println!("recall@10 at ef 40 over {} rows: {r:.4}", base.len());
    assert!(r >= 0.95, "recall@10 = {r}");
    let mut missed = 0;
    for (i, &id) in ids.iter().enumerate() {
        let row = BUILT + i;
        let hits = search(store, Metric::L2, base.row(row), K, 40);
        if !hits.iter().any(|h| h.node == id || h.dist == 0.0) {
            missed += 1;
        }
        assert_eq!(store.visit(id, |_| 0.0).unwrap().payload, row as u64);
    }
    assert_eq!(missed, 0, "{missed} inserted rows not found by a search for themselves");
}

#[test]
fn insert_one_by_one() {
    let (all, queries) = sift(BUILT + ADDED);
    let built = gpu_graph_engine::dataset::Matrix { dim: all.dim, data: all.data[..BUILT * all.dim].to_vec() };
    let store = build_store(Metric::L2, &built, &BuildParams::default());
    let ids: Vec<u32> =
        (BUILT..BUILT + ADDED).map(|row| insert(&store, all.row(row), row as u64, EF_CONSTRUCTION)).collect();
    assert_eq!(ids, (BUILT as u32..(BUILT + ADDED) as u32).collect::<Vec<_>>());
    check(&store, &all, &queries, &ids);
}

#[test]
fn insert_from_four_threads() {
    let (all, queries) = sift(BUILT + ADDED);
    let built = gpu_graph_engine::dataset::Matrix { dim: all.dim, data: all.data[..BUILT * all.dim].to_vec() };
    let store = build_store(Metric::L2, &built, &BuildParams::default());
    let mut ids = vec![0u32; ADDED];
    std::thread::scope(|s| {
        for (t, chunk) in ids.chunks_mut(ADDED / 4).enumerate() {
            let (store, all) = (&store, &all);
            s.spawn(move || {
                for (j, id) in chunk.iter_mut().enumerate() {
                    let row = BUILT + t * (ADDED / 4) + j;
                    *id = insert(store, all.row(row), row as u64, EF_CONSTRUCTION);
                }
            });
        }
    });
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), ADDED, "every insert got its own id");
    check(&store, &all, &queries, &ids);
}

#[test]
fn insert_into_empty_store() {
    let (all, queries) = sift(2_000);
    let store = MemoryStore::new(all.dim, 32);
    for row in 0..all.len() {
        assert_eq!(insert(&store, all.row(row), row as u64, EF_CONSTRUCTION), row as u32);
    }
    assert_eq!(store.entry(), Some(0));
    let kth = kth_truth("sift128", Metric::L2, &all, &queries);
    let r = recall(&store, Metric::L2, &all, &queries, &kth, 40);
    println!("graph grown by inserts alone: recall@10 at ef 40 = {r:.4}");
    assert!(r >= 0.95, "recall@10 = {r}");
}

/// Inserts given their neighbours by another search (as the search worker
/// answers them): every row linked as well as by the insert's own search;
/// an answer with no live node in it (here: nothing, or only a node that
/// is not there) makes the insert search after all.
#[test]
fn insert_near_given_neighbours() {
    let (all, queries) = sift(BUILT + ADDED);
    let built = gpu_graph_engine::dataset::Matrix { dim: all.dim, data: all.data[..BUILT * all.dim].to_vec() };
    let store = build_store(Metric::L2, &built, &BuildParams::default());
    let ids: Vec<u32> = (BUILT..BUILT + ADDED)
        .map(|row| {
            let found = match row % 50 {
                0 => Vec::new(),
                1 => vec![u32::MAX - 1],
                _ => search(&store, Metric::L2, all.row(row), EF_CONSTRUCTION, EF_CONSTRUCTION)
                    .iter()
                    .map(|h| h.node)
                    .collect(),
            };
            insert_near(&store, all.row(row), row as u64, EF_CONSTRUCTION, Some(found))
        })
        .collect();
    assert_eq!(ids, (BUILT as u32..(BUILT + ADDED) as u32).collect::<Vec<_>>());
    check(&store, &all, &queries, &ids);
}
