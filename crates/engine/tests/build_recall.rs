//! Graph quality of the CPU RNN-Descent on real data with exact ground truth.
//! Run with `cargo test --release` (a debug build takes minutes). On the
//! repository's sample (data/) the SIFT test has its 25,000 rows and the
//! MiniLM test its 900.

mod common;

use std::time::Instant;

use common::*;
use gpu_graph_engine::dataset::count_rows;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;

/// The first 100,000 rows, or every row of a smaller folder.
#[test]
fn sift_100k_recall_at_ef40() {
    let (base, queries) = sift(100_000);
    let kth = kth_truth("sift128", Metric::L2, &base, &queries);
    let t = Instant::now();
    let store = build_store(Metric::L2, &base, &BuildParams::default());
    let built = t.elapsed();
    let r = recall(&store, Metric::L2, &base, &queries, &kth, 40);
    println!("sift {} rows: build {built:.2?}, recall@10 at ef 40 = {r:.4}", base.len());
    assert!(r >= 0.95, "recall@10 = {r}");
}

#[test]
fn minilm_cosine_recall_at_ef40() {
    let (base, queries) = load("minilm384", None);
    // every row of the file (61,666 in the full set: tests/data.rs checks
    // each folder's sizes)
    assert_eq!((base.len(), base.dim), (count_rows(&base_file("minilm384")).unwrap(), 384));
    let kth = kth_truth("minilm384", Metric::Cosine, &base, &queries);
    let t = Instant::now();
    let store = build_store(Metric::Cosine, &base, &BuildParams::default());
    let built = t.elapsed();
    let r = recall(&store, Metric::Cosine, &base, &queries, &kth, 40);
    println!("minilm {} rows: build {built:.2?}, recall@10 at ef 40 = {r:.4}", base.len());
    assert!(r >= 0.95, "recall@10 = {r}");
}
