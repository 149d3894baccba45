//! Graph quality of the CPU RNN-Descent on real data with exact ground truth.
//! Run with `cargo test --release` (a debug build takes minutes).

mod common;

use std::time::Instant;

use common::*;
use gpu_graph_engine::dataset::{data_dir, read_fvecs};
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;

#[test]
fn sift_100k_recall_at_ef40() {
    let (base, queries) = sift(100_000);
    let kth = kth_from_ids(Metric::L2, &base, &queries, &ground_truth("sift128_groundtruth_100000.ivecs"));
    let t = Instant::now();
    let store = build_store(Metric::L2, &base, &BuildParams::default());
    let built = t.elapsed();
    let r = recall(&store, Metric::L2, &base, &queries, &kth, 40);
    println!("sift 100k: build {built:.2?}, recall@10 at ef 40 = {r:.4}");
    assert!(r >= 0.95, "recall@10 = {r}");
}

#[test]
fn minilm_cosine_recall_at_ef40() {
    let dir = data_dir();
    let base = read_fvecs(&dir.join("minilm384_base.fvecs"), None).unwrap();
    let queries = read_fvecs(&dir.join("minilm384_query.fvecs"), None).unwrap();
    assert_eq!((base.len(), base.dim), (61_666, 384));
    let kth = kth_from_ids(Metric::Cosine, &base, &queries, &ground_truth("minilm384_groundtruth.ivecs"));
    let t = Instant::now();
    let store = build_store(Metric::Cosine, &base, &BuildParams::default());
    let built = t.elapsed();
    let r = recall(&store, Metric::Cosine, &base, &queries, &kth, 40);
    println!("minilm: build {built:.2?}, recall@10 at ef 40 = {r:.4}");
    assert!(r >= 0.95, "recall@10 = {r}");
}
