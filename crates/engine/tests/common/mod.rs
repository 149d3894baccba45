//! Shared by the integration tests: loading the shared data sets, building,
//! and measuring tie-aware recall with the SQL operators' distances.
#![allow(dead_code)] // each test binary uses a different part

use gpu_graph_engine::dataset::{data_dir, read_bvecs, read_fvecs, read_ivecs, Matrix};
use gpu_graph_engine::memory::MemoryStore;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::recall::{exact_knn, operator_distance, recall_at_k};
use gpu_graph_engine::rnn_descent::build;
use gpu_graph_engine::search::search;
use rayon::prelude::*;

pub const K: usize = 10;

/// The first `rows` SIFT base vectors and the SIFT queries.
pub fn sift(rows: usize) -> (Matrix<f32>, Matrix<f32>) {
    let dir = data_dir();
    let base = read_bvecs(&dir.join("sift128_base.bvecs"), Some(rows)).expect("sift128_base.bvecs");
    let queries = read_fvecs(&dir.join("sift128_query.fvecs"), None).expect("sift128_query.fvecs");
    assert_eq!((base.len(), base.dim, queries.dim), (rows, 128, 128));
    (base, queries)
}

/// The stored form of every row.
pub fn prepare(metric: Metric, rows: &Matrix<f32>) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.data.len());
    for i in 0..rows.len() {
        metric.prepare_stored(rows.row(i), 0.0, &mut out);
    }
    out
}

/// Builds over `base` and wraps the graph in a store whose payloads are row numbers.
pub fn build_store(metric: Metric, base: &Matrix<f32>, params: &BuildParams) -> MemoryStore {
    let stored = prepare(metric, base);
    let dim = metric.stored_dim(base.dim);
    let g = build(&stored, dim, params, &mut |_, _| true).expect("not cancelled");
    MemoryStore::from_graph(&g, stored, dim, (0..base.len() as u64).collect())
}

/// The true k-th distance of each query, from a ground-truth file's ids.
pub fn kth_from_ids(metric: Metric, base: &Matrix<f32>, queries: &Matrix<f32>, gt: &Matrix<i32>) -> Vec<f64> {
    (0..queries.len()).map(|q| operator_distance(metric, queries.row(q), base.row(gt.row(q)[K - 1] as usize))).collect()
}

/// The true k-th distance of each query by brute force over `rows`.
pub fn kth_exact(metric: Metric, rows: &[f32], dim: usize, queries: &Matrix<f32>) -> Vec<f64> {
    exact_knn(rows, dim, &queries.data, K, metric).iter().map(|t| t[K - 1].1).collect()
}

pub fn ground_truth(name: &str) -> Matrix<i32> {
    read_ivecs(&data_dir().join(name), None).expect("ground truth file")
}

/// Mean recall@K of a search with beam `ef`; a hit's payload is its row of `base`.
pub fn recall(
    store: &MemoryStore,
    metric: Metric,
    base: &Matrix<f32>,
    queries: &Matrix<f32>,
    kth: &[f64],
    ef: usize,
) -> f64 {
    let sum: f64 = (0..queries.len())
        .into_par_iter()
        .map(|q| {
            let found: Vec<f64> = search(store, metric, queries.row(q), K, ef)
                .iter()
                .map(|h| operator_distance(metric, queries.row(q), base.row(h.payload as usize)))
                .collect();
            recall_at_k(&found, kth[q], K)
        })
        .sum();
    sum / queries.len() as f64
}

/// A small deterministic generator for test choices.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
