//! The exact k-NN graph against brute force, and the exact start against
//! the random one.

use std::collections::HashSet;
use std::time::Instant;

use gpu_graph_engine::dataset::Matrix;
use gpu_graph_engine::distance::l2sq;
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::recall::exact_knn;
use gpu_graph_gpu::{build_with, knn_graph, Gpu, GpuOptions, KnnGraph, KnnInit};
use rayon::prelude::*;

use crate::common::{cpu_recall, Data, Verdict, K};

/// Tie-aware: every returned id of row `v` is a true neighbour at most as
/// far as the true k-th, no id twice, and the GPU's fp32 distances are right.
fn row_error(data: &[f32], dim: usize, n: usize, g: &KnnGraph, v: usize, k: usize) -> Option<String> {
    let row = &data[v * dim..(v + 1) * dim];
    let mut all: Vec<(f32, u32)> =
        (0..n).filter(|&u| u != v).map(|u| (l2sq(row, &data[u * dim..(u + 1) * dim]), u as u32)).collect();
    all.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let kth = all[k - 1].0;
    let mut seen = HashSet::new();
    for (j, &id) in g.ids[v * g.k..v * g.k + k].iter().enumerate() {
        if id as usize >= n || id as usize == v || !seen.insert(id) {
            return Some(format!("row {v}: bad id {id} at {j}"));
        }
        let d = l2sq(row, &data[id as usize * dim..(id as usize + 1) * dim]);
        if d > kth + 1e-5 * kth.abs().max(1e-30) {
            return Some(format!("row {v}: id {id} at {d} beyond the true k-th {kth}"));
        }
        let gd = g.dists[v * g.k + j];
        if (gd - d).abs() > 1e-5 * d.abs().max(1e-30) + 1e-6 {
            return Some(format!("row {v}: distance of {id} {gd} != {d}"));
        }
    }
    None
}

/// The exact k-NN graph of the first `rows` rows against brute force on a sample.
pub fn check(gpu: &Gpu, data: &Data, rows: usize, k: usize, sample: usize, verdict: &mut Verdict) {
    if rows < 2 {
        return;
    }
    let dim = data.base.dim;
    let prefix = &data.base.data[..rows * dim];
    let t = Instant::now();
    let g = match knn_graph(gpu, prefix, dim, k) {
        Ok(g) => g,
        Err(e) => {
            verdict.check(false, format!("exact k-NN: {e}"));
            return;
        }
    };
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let k = k.min(rows - 1);
    let step = (rows / sample.max(1)).max(1);
    let rows_checked: Vec<usize> = (0..rows).step_by(step).take(sample).collect();
    let bad: Vec<String> = rows_checked.par_iter().filter_map(|&v| row_error(prefix, dim, rows, &g, v, k)).collect();
    verdict.check(
        bad.is_empty(),
        format!(
            "exact k-NN (k {k}) of {rows} rows: {ms:.1} ms; {} of {} sampled rows differ from brute force",
            bad.len(),
            rows_checked.len()
        ),
    );
    for b in bad.iter().take(5) {
        println!("      {b}");
    }
}

/// Exact against random start on the first `rows` rows: time and recall
/// (300 queries, ground truth of the prefix by brute force).
pub fn bench(gpu: &Gpu, data: &Data, rows: usize, params: &BuildParams) {
    let rows = rows.min(data.base.len());
    let dim = data.base.dim;
    let prefix = data.base.data[..rows * dim].to_vec();
    let qs = Matrix { dim, data: data.queries.data[..300.min(data.queries.len()) * dim].to_vec() };
    let truth = exact_knn(&prefix, dim, &qs.data, K, Metric::L2);
    for (label, init) in [("random", KnnInit::Random), ("exact", KnnInit::Exact)] {
        match build_with(gpu, &prefix, dim, params, init, &GpuOptions::default(), &|| false) {
            Ok((g, pt)) => {
                let index = FlatIndex::new(Metric::L2, dim, prefix.clone(), g);
                let r: Vec<String> = [10, 20, 40, 80]
                    .iter()
                    .map(|&ef| format!("{:.4}", cpu_recall(&index, Metric::L2, &qs, &truth, ef).0))
                    .collect();
                println!(
                    "knn-bench rows {rows:>8} start {label:<6}: total {:.1} ms (start {:.1}, refine {:.1}, cut {:.1}, download {:.1}); recall@10 {}",
                    pt.total_ms(),
                    pt.knn_ms,
                    pt.refine_ms,
                    pt.final_cut_ms,
                    pt.download_ms,
                    r.join(" ")
                )
            }
            Err(e) => println!("knn-bench rows {rows} start {label}: {e}"),
        }
    }
}
