//! Inserting into a built graph keeps it searchable: sequentially and from
//! several threads at once; a TSDG graph's lists stay in its order.

mod common;

use common::*;
use gpu_graph_engine::cfs::{refine, Algorithm, CfsParams, START_ORDER};
use gpu_graph_engine::filter::{in_order, Filter};
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::insert::{insert, insert_near};
use gpu_graph_engine::memory::MemoryStore;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::repair::repair;
use gpu_graph_engine::rnn_descent::build_in;
use gpu_graph_engine::search::search;
use gpu_graph_engine::store::{GraphMut, GraphView};

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

/// Lists of live nodes that TSDG's order (`order`) would put otherwise
/// (`filter::in_order`).
fn out_of_order(store: &MemoryStore, order: Filter) -> usize {
    let row = |u: u32| {
        let mut x = Vec::new();
        store.visit(u, |v| {
            x.extend_from_slice(v);
            0.0
        });
        x
    };
    let mut list = Vec::new();
    (0..store.node_count())
        .filter(|&v| store.visit(v, |_| 0.0).is_some_and(|s| !s.deleted))
        .filter(|&v| {
            store.neighbors(v, &mut list);
            !in_order(order, &row(v), &list, &row)
        })
        .count()
}

/// A TSDG graph's rule in the store (Vamana's alpha, then the lambda
/// order): every list an insert or VACUUM's repair writes stays in TSDG's
/// order, which a batch's prefix search reads, and the graph keeps its
/// recall. With the filter alone (the code before) the lists drift out
/// of it.
#[test]
fn a_tsdg_graph_keeps_its_order_through_inserts_and_repair() {
    let (all, queries) = sift(BUILT + ADDED);
    let dim = all.dim;
    let built = &all.data[..BUILT * dim];
    let params = BuildParams::default();
    // lambda 128 drops no edge at degree 32 (see out_of_order)
    let algorithm = Algorithm::Tsdg { alpha: 1.2, max_lambda: 128 };
    let order = algorithm.order().unwrap();
    let start = build_in(built, dim, &params, START_ORDER, &mut |_, _| true).unwrap();
    let cfs = CfsParams { algorithm, degree: params.degree, pool: 64 };
    let graph = refine(built, dim, &start, &cfs, &mut |_, _| true).unwrap();
    let (mut drift, mut graphs, mut sets_buf) = (Vec::new(), Vec::new(), Vec::new());
    for rule in [None, Some(order)] {
        let store = MemoryStore::from_flat(
            FlatIndex::new(Metric::L2, dim, built.to_vec(), graph.clone()),
            (0..BUILT as u64).collect(),
        )
        .with_rule(algorithm.filter(), rule);
        // (the refinement's links for reachability go in at their distance)
        let at_build = out_of_order(&store, order);
        assert!(at_build <= 10, "{at_build} lists of the built graph out of order");
        let ids: Vec<u32> =
            (BUILT..BUILT + ADDED).map(|row| insert(&store, all.row(row), row as u64, EF_CONSTRUCTION)).collect();
        let after_inserts = out_of_order(&store, order);
        let kth = kth_truth("sift128", Metric::L2, &all, &queries);
        let r = recall(&store, Metric::L2, &all, &queries, &kth, 40);
        let missed = ids
            .iter()
            .enumerate()
            .filter(|&(i, &id)| {
                !search(&store, Metric::L2, all.row(BUILT + i), K, 40).iter().any(|h| h.node == id || h.dist == 0.0)
            })
            .count();
        println!("order {rule:?}: recall@10 at ef 40 {r:.4}, {missed} of {ADDED} inserted rows not found by their own vector");
        // measured 0.9910 and 2 either way: the order moves edges, it
        // keeps or drops none (lambda 128)
        assert!(r >= 0.95 && missed <= ADDED / 1000, "order {rule:?}: recall@10 {r}, {missed} rows not found");
        let mut sets = Vec::new();
        for v in 0..store.node_count() {
            store.neighbors(v, &mut sets_buf);
            sets_buf.sort_unstable();
            sets.push(sets_buf.clone());
        }
        graphs.push(sets);
        let deleted: Vec<u32> = (0..BUILT as u32).step_by(10).collect();
        for &d in &deleted {
            store.mark_deleted(d);
        }
        let stats = repair(&store, &deleted);
        let after_repair = out_of_order(&store, order);
        println!(
            "order {rule:?}: lists out of TSDG's order built {at_build}, after inserts {after_inserts}, after repair {after_repair} ({stats:?})"
        );
        drift.push((at_build, after_inserts, after_repair, stats.relinked as usize));
    }
    assert!(graphs[0] == graphs[1], "the order changed which edges the inserts kept");
    let (at_build, inserts, repaired, relinked) = drift[1];
    assert!(inserts <= at_build, "{inserts} lists out of order after inserts, {at_build} built so");
    // the lists of nodes linked again for reachability too
    assert!(repaired <= at_build, "{repaired} lists out of order after repair, {relinked} relinked");
    assert!(drift[0].1 > 1000, "the filter alone kept every list in order: {drift:?}");
}
