//! Graph quality of the CFS graphs (NSG, Vamana, CAGRA, TSDG) built on the
//! CPU from RNN-Descent's graph, on real data with exact ground truth: the
//! floor every algorithm must hold at ef_search 40, as RNN-Descent's own.
//! Run with `cargo test --release`.

mod common;

use std::time::Instant;

use common::*;
use gpu_graph_engine::cfs::{refine, Algorithm, CfsParams, START_ORDER};
use gpu_graph_engine::dataset::Matrix;
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::memory::MemoryStore;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::rnn_descent::build_in;

const ALGORITHMS: [(&str, Algorithm); 4] = [
    ("nsg", Algorithm::Nsg),
    ("vamana", Algorithm::Vamana { alpha: 1.2 }),
    ("cagra", Algorithm::Cagra),
    ("tsdg", Algorithm::Tsdg { alpha: 1.2, max_lambda: 32 }),
];

/// Each algorithm over `base`: its recall@10 at ef 40.
fn recalls(set: &str, metric: Metric, base: &Matrix<f32>, queries: &Matrix<f32>) -> Vec<(&'static str, f64)> {
    let kth = kth_truth(set, metric, base, queries);
    let stored = prepare(metric, base);
    let dim = metric.stored_dim(base.dim);
    let params = BuildParams::default();
    let t = Instant::now();
    // the start a CPU build refines (the GPU's scan order)
    let start = build_in(&stored, dim, &params, START_ORDER, &mut |_, _| true).expect("not cancelled");
    println!("{set} {} rows: rnn_descent {:.2?}", base.len(), t.elapsed());
    ALGORITHMS
        .iter()
        .map(|&(name, algorithm)| {
            let t = Instant::now();
            let p = CfsParams { algorithm, degree: params.degree, pool: 64 };
            let g = refine(&stored, dim, &start, &p, &mut |_, _| true).expect("not cancelled");
            let took = t.elapsed();
            let store = MemoryStore::from_flat(
                FlatIndex::new(metric, dim, stored.clone(), g),
                (0..base.len() as u64).collect(),
            );
            let r = recall(&store, metric, base, queries, &kth, 40);
            println!("{set} {name}: refine {took:.2?}, recall@10 at ef 40 = {r:.4}");
            (name, r)
        })
        .collect()
}

#[test]
fn sift_100k_cfs_recall_at_ef40() {
    let (base, queries) = sift(100_000);
    for (name, r) in recalls("sift128", Metric::L2, &base, &queries) {
        assert!(r >= 0.95, "{name}: recall@10 = {r}");
    }
}

#[test]
fn minilm_cosine_cfs_recall_at_ef40() {
    let (base, queries) = load("minilm384", None);
    for (name, r) in recalls("minilm384", Metric::Cosine, &base, &queries) {
        assert!(r >= 0.95, "{name}: recall@10 = {r}");
    }
}
