//! Where a CFS refinement's time goes on this machine: the collect's
//! searches, the filters, and the rest (the collect's own lists, the
//! reverse edges and lists merged, making every node reachable), which a
//! GPU build runs on the CPU too; recall@10 of the graph at ef 10 / 20 / 40.
//! The start is a CPU build's (RNN-Descent in `START_ORDER`); SEED=N picks
//! another of its random starts, to see how far builds of one table differ.
//!
//! [SEED=N] cargo run --release -p gpu_graph_engine --example cfs_phases -- [ROWS] [nsg|vamana|cagra|tsdg ...]

use std::time::Instant;

use gpu_graph_engine::cfs::{refine_with, Algorithm, CfsParams, START_ORDER};
use gpu_graph_engine::collect_rows::CpuCollect;
use gpu_graph_engine::dataset::{data_dir, read_bvecs, read_fvecs, read_ivecs};
use gpu_graph_engine::filter_rows::{CpuFilters, Timed};
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::recall::{operator_distance, recall_at_k};
use gpu_graph_engine::rnn_descent::build_in;
use gpu_graph_engine::search::search;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rows: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let names: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
    let names = if names.is_empty() { vec!["nsg", "vamana", "cagra", "tsdg"] } else { names };
    let dir = data_dir();
    let base = read_bvecs(&dir.join("sift128_base.bvecs"), Some(rows)).unwrap();
    let queries = read_fvecs(&dir.join("sift128_query.fvecs"), None).unwrap();
    let truth = read_ivecs(&dir.join("sift128_groundtruth_100000.ivecs"), None).ok().filter(|_| rows == 100_000);
    let dim = base.dim;
    let t = Instant::now();
    // a CPU build's start: RNN-Descent in the GPU's scan order (SEED picks
    // another of its random starts: builds of one table differ by it)
    let mut params = BuildParams::default();
    if let Some(seed) = std::env::var("SEED").ok().and_then(|s| s.parse().ok()) {
        params.seed = seed;
    }
    let start = build_in(&base.data, dim, &params, START_ORDER, &mut |_, _| true).unwrap();
    println!("rows {rows} threads {} start graph {:.2} s", rayon::current_num_threads(), t.elapsed().as_secs_f64());
    for name in names {
        let algorithm = match name {
            "nsg" => Algorithm::Nsg,
            "vamana" => Algorithm::Vamana { alpha: 1.2 },
            "cagra" => Algorithm::Cagra,
            "tsdg" => Algorithm::Tsdg { alpha: 1.2, max_lambda: 128 },
            _ => panic!("nsg, vamana, cagra or tsdg"),
        };
        let params = CfsParams { algorithm, degree: 32, pool: 64 };
        let mut collect = Timed { inner: CpuCollect { vectors: &base.data, dim, start: &start }, ms: 0.0 };
        let mut filters = Timed { inner: CpuFilters { vectors: &base.data, dim }, ms: 0.0 };
        let t = Instant::now();
        // the step boundaries: collect steps, store steps, then reachability
        let mut ends = Vec::new();
        let g = refine_with(&base.data, dim, &start, &params, &mut collect, &mut filters, &mut |_, _| {
            ends.push(t.elapsed().as_secs_f64() * 1e3);
            true
        })
        .unwrap()
        .unwrap();
        let total = t.elapsed().as_secs_f64() * 1e3;
        let steps = (ends.len() - 1) / 2;
        let (collect_end, store_end) = (ends[steps - 1], ends[2 * steps - 1]);
        let mut line = format!(
            "{name:<7} total {total:.0} ms: collect+filter phase {collect_end:.0}, store phase {:.0}, reachability {:.0}; searches {:.0}, filters {:.0}, the rest {:.0}",
            store_end - collect_end,
            total - store_end,
            collect.ms,
            filters.ms,
            total - collect.ms - filters.ms
        );
        if let Some(truth) = &truth {
            let index = FlatIndex::new(Metric::L2, dim, base.data.clone(), g);
            for ef in [10, 20, 40] {
                let r: f64 = (0..queries.len())
                    .map(|q| {
                        let kth = operator_distance(Metric::L2, queries.row(q), base.row(truth.row(q)[9] as usize));
                        let found: Vec<f64> = search(&index, Metric::L2, queries.row(q), 10, ef)
                            .iter()
                            .map(|h| operator_distance(Metric::L2, queries.row(q), base.row(h.node as usize)))
                            .collect();
                        recall_at_k(&found, kth, 10)
                    })
                    .sum::<f64>()
                    / queries.len() as f64;
                line += &format!("; recall@10 ef {ef} {r:.4}");
            }
        }
        println!("{line}");
    }
}
