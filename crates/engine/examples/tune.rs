//! Build time and recall@10 of the CPU RNN-Descent for a few parameter
//! settings, on the shared data sets (how the defaults in params.rs were
//! chosen).
//!
//! cargo run --release --example tune -- sift|minilm [S,R,T1,T2,RHO ...]

use std::time::Instant;

use gpu_graph_engine::dataset::{data_dir, read_bvecs, read_fvecs, read_ivecs, Matrix};
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::recall::{operator_distance, recall_at_k};
use gpu_graph_engine::rnn_descent::build;
use gpu_graph_engine::search::search;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = data_dir();
    let (metric, base, queries, truth) = match args.first().map(String::as_str) {
        Some("minilm") => (
            Metric::Cosine,
            read_fvecs(&dir.join("minilm384_base.fvecs"), None).unwrap(),
            read_fvecs(&dir.join("minilm384_query.fvecs"), None).unwrap(),
            read_ivecs(&dir.join("minilm384_groundtruth.ivecs"), None).unwrap(),
        ),
        _ => (
            Metric::L2,
            read_bvecs(&dir.join("sift128_base.bvecs"), Some(100_000)).unwrap(),
            read_fvecs(&dir.join("sift128_query.fvecs"), None).unwrap(),
            read_ivecs(&dir.join("sift128_groundtruth_100000.ivecs"), None).unwrap(),
        ),
    };
    let k = 10;
    let kth: Vec<f64> = (0..queries.len())
        .map(|q| operator_distance(metric, queries.row(q), base.row(truth.row(q)[k - 1] as usize)))
        .collect();
    let mut stored = Vec::with_capacity(base.data.len());
    for i in 0..base.len() {
        metric.prepare_stored(base.row(i), 0.0, &mut stored);
    }
    let mut settings: Vec<BuildParams> = args[1.min(args.len())..].iter().map(|s| parse(s)).collect();
    if settings.is_empty() {
        settings.push(BuildParams::default());
    }
    println!("rows {} dim {} threads {}", base.len(), base.dim, rayon::current_num_threads());
    println!("S\tR\tT1\tT2\trho\tbuild_s\tcpu_s\tavg_deg\tr@10ef10\tef20\tef40\tef80\tqps@ef40");
    for p in settings {
        let (t, cpu0) = (Instant::now(), cpu_seconds());
        let g = build(&stored, base.dim, &p, &mut |_, _| true).unwrap();
        let secs = t.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu0;
        let avg_deg = (0..g.len() as u32).map(|u| g.neighbors(u).count()).sum::<usize>() as f64 / g.len() as f64;
        let store = FlatIndex::new(metric, base.dim, stored.clone(), g);
        let mut line =
            format!("{}\t{}\t{}\t{}\t{}\t{:.2}\t{:.2}\t{:.1}", p.s, p.r, p.t1, p.t2, p.rho, secs, cpu, avg_deg);
        let mut qps = 0.0;
        for ef in [10, 20, 40, 80] {
            let t = Instant::now();
            let r = mean_recall_at(&store, metric, &base, &queries, &kth, k, ef);
            if ef == 40 {
                qps = queries.len() as f64 / t.elapsed().as_secs_f64();
            }
            line += &format!("\t{r:.4}");
        }
        println!("{line}\t{qps:.0}");
    }
}

fn mean_recall_at(
    store: &FlatIndex,
    metric: Metric,
    base: &Matrix<f32>,
    queries: &Matrix<f32>,
    kth: &[f64],
    k: usize,
    ef: usize,
) -> f64 {
    let sum: f64 = kth
        .iter()
        .enumerate()
        .map(|(q, &kth)| {
            let found: Vec<f64> = search(store, metric, queries.row(q), k, ef)
                .iter()
                .map(|h| operator_distance(metric, queries.row(q), base.row(h.node as usize)))
                .collect();
            recall_at_k(&found, kth, k)
        })
        .sum();
    sum / queries.len() as f64
}

fn parse(s: &str) -> BuildParams {
    let f: Vec<&str> = s.split(',').collect();
    let d = BuildParams::default();
    BuildParams {
        s: f[0].parse().unwrap(),
        r: f[1].parse().unwrap(),
        t1: f[2].parse().unwrap(),
        t2: f[3].parse().unwrap(),
        rho: f.get(4).map_or(d.rho, |x| x.parse().unwrap()),
        ..d
    }
}

/// CPU seconds this process has used (user + system), from /proc: wall time
/// alone misleads when the machine is shared.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // fields after the parenthesised command name; utime and stime are the 12th and 13th
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<f64> = rest.split_whitespace().skip(11).take(2).filter_map(|x| x.parse().ok()).collect();
    f.iter().sum::<f64>() / 100.0
}
