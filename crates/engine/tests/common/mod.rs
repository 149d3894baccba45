//! Shared by the integration tests: loading the data sets of the data folder
//! (`dataset::data_dir()`: the full sets, or the repository's sample),
//! building, and measuring tie-aware recall with the SQL operators' distances.
#![allow(dead_code)] // each test binary uses a different part

use std::path::PathBuf;

use gpu_graph_engine::dataset::{count_rows, data_dir, read_fvecs, read_ivecs, read_vectors, Matrix};
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::memory::MemoryStore;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::recall::{exact_knn, operator_distance, recall_at_k};
use gpu_graph_engine::rnn_descent::build;
use gpu_graph_engine::search::search;
use gpu_graph_engine::store::GraphView;
use rayon::prelude::*;

pub const K: usize = 10;

/// The base file of a set of the data folder (`sift128`, `minilm384`).
pub fn base_file(set: &str) -> PathBuf {
    data_dir().join(match set {
        "sift128" => "sift128_base.bvecs",
        "minilm384" => "minilm384_base.fvecs",
        _ => panic!("unknown data set {set}"),
    })
}

/// The first `rows` base rows of `set` (all of them when `rows` is None, or
/// when the folder's file holds fewer: the repository's sample does) and all
/// its queries.
pub fn load(set: &str, rows: Option<usize>) -> (Matrix<f32>, Matrix<f32>) {
    let path = base_file(set);
    let in_file = count_rows(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let want = rows.map_or(in_file, |r| r.min(in_file));
    if rows.is_some_and(|r| r > in_file) {
        println!("{}: {in_file} rows, fewer than the {} asked for: using all of them", path.display(), rows.unwrap());
    }
    let base = read_vectors(&path, Some(want)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let qpath = data_dir().join(format!("{set}_query.fvecs"));
    let queries = read_fvecs(&qpath, None).unwrap_or_else(|e| panic!("{}: {e}", qpath.display()));
    assert_eq!(base.len(), want);
    assert_eq!(queries.dim, base.dim);
    (base, queries)
}

/// The first `rows` SIFT base vectors (every row there is when the folder
/// holds fewer) and the SIFT queries.
pub fn sift(rows: usize) -> (Matrix<f32>, Matrix<f32>) {
    let (base, queries) = load("sift128", Some(rows));
    assert_eq!((base.dim, queries.dim), (128, 128));
    (base, queries)
}

/// The true K-th distance of each query over `base`, which is the first
/// `base.len()` rows of `set`'s base file: from the folder's ground-truth
/// file that covers exactly those rows when it has one
/// (`<set>_groundtruth_<rows>.ivecs` covers the first <rows> rows,
/// `<set>_groundtruth.ivecs` the whole base file), else by brute force.
/// The one place the tests choose where their ground truth comes from.
pub fn kth_truth(set: &str, metric: Metric, base: &Matrix<f32>, queries: &Matrix<f32>) -> Vec<f64> {
    let rows = base.len();
    let mut names = vec![format!("{set}_groundtruth_{rows}.ivecs")];
    if count_rows(&base_file(set)).expect("the base file") == rows {
        names.push(format!("{set}_groundtruth.ivecs"));
    }
    for name in names {
        let path = data_dir().join(&name);
        if !path.is_file() {
            continue;
        }
        let gt = read_ivecs(&path, None).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(gt.len() >= queries.len() && gt.dim >= K, "{name}: {} rows of {} ids", gt.len(), gt.dim);
        assert!(gt.data.iter().all(|&id| id >= 0 && (id as usize) < rows), "{name} names rows beyond the first {rows}");
        let kth = kth_from_ids(metric, base, queries, &gt);
        // the file is about these rows: its first query agrees with brute force
        let first = Matrix { dim: queries.dim, data: queries.row(0).to_vec() };
        let exact = kth_exact(metric, &base.data, base.dim, &first)[0];
        assert!((kth[0] - exact).abs() <= 1e-6 * exact.abs().max(1e-6), "{name}: K-th distance {} != {exact}", kth[0]);
        println!("ground truth: {name} ({rows} rows, {} queries)", queries.len());
        return kth;
    }
    println!("ground truth: brute force ({rows} rows, {} queries)", queries.len());
    kth_exact(metric, &base.data, base.dim, queries)
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
    MemoryStore::from_flat(FlatIndex::new(metric, dim, stored, g), (0..base.len() as u64).collect())
}

/// The true k-th distance of each query, from a ground-truth file's ids.
pub fn kth_from_ids(metric: Metric, base: &Matrix<f32>, queries: &Matrix<f32>, gt: &Matrix<i32>) -> Vec<f64> {
    (0..queries.len()).map(|q| operator_distance(metric, queries.row(q), base.row(gt.row(q)[K - 1] as usize))).collect()
}

/// The true k-th distance of each query by brute force over `rows`.
pub fn kth_exact(metric: Metric, rows: &[f32], dim: usize, queries: &Matrix<f32>) -> Vec<f64> {
    exact_knn(rows, dim, &queries.data, K, metric).iter().map(|t| t[K - 1].1).collect()
}

/// Mean recall@K of a search with beam `ef`; a hit's payload is its row of `base`.
pub fn recall<G: GraphView + Sync>(
    store: &G,
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
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}
