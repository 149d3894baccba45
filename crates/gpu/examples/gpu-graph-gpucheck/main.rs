//! The GPU test of the graph builders, run on the GPU machine
//! (tests/gpu/build.sh):
//!
//! 1. opens the GPU (and says what it found);
//! 2. builds the graph of a data set on the GPU (GRNND) and on the CPU (the
//!    engine's rnn_descent::build) with the same parameters, printing each
//!    build's time (per phase for the GPU); the device's final cut is
//!    compared list for list with the engine's (gpu_graph_engine::graph::
//!    final_cut) on the downloaded pools;
//! 3. searches both graphs with the engine's search and prints recall@10 at
//!    ef 10/20/40/80 (tie-aware, against exact ground truth);
//! 4. a cancelled build stops promptly and frees its memory;
//! 5. the GPU's CFS filters (kernels/filter.cu: RNG, the same `occludes`
//!    as GRNND's update; NSG; Vamana; CAGRA) equal the engine's
//!    Filter::apply list for list, each side timed on the same candidates;
//!    whole CFS refinements with the GPU's collect searches and filters
//!    keep the CPU's recall@10 (at ef 20 and 40, within 0.01), each side
//!    timed;
//! 6. the exact k-NN graph of the GPU equals brute force on a sample.
//!
//! Exits 1 if the GPU's recall is more than 0.01 below the CPU's at some ef,
//! or any check fails; 2 on a usage or I/O error.
//!
//! `--cfs-from-builds nsg,cagra,...` refines every GPU build's graph (on
//! the GPU) and the CPU's CFS start (on the CPU) into those graphs and
//! prints their recall@10 at ef 10 / 20 / 40 / 80: the GPU-built and the
//! CPU-built CFS graphs of one data set; the one from a `knn=random`
//! variant (the CPU's algorithm on the GPU) must be within 0.01 of the
//! CPU's at every ef.
//!
//! A `--variant key=value,...` builds again on the GPU with some settings
//! changed (keys: knn, order = random|ascending, lanes, half, verify, early,
//! s, r, t1, t2, rho, seed, degree) and reports its recall too; the first GPU
//! build (no variant) is the one compared with the CPU.

#[path = "../common/mod.rs"]
mod common;
mod filters;
mod knn;
mod refine;

use std::time::Instant;

use clap::Parser;
use common::{cpu_recall, number, pairs, usage, Data, DataArgs, GraphArgs, Verdict};
use gpu_graph_engine::cfs::START_ORDER;
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::graph::Graph;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::params::ScanOrder;
use gpu_graph_engine::rnn_descent;
use gpu_graph_gpu::{build_with, Gpu, GpuError, GpuOptions, KnnInit};

const EFS: [usize; 4] = [10, 20, 40, 80];

#[derive(Parser)]
#[command(about = "GPU graph builders against the CPU builder, exact k-NN, CFS filter parity and CFS refinements")]
struct Opts {
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    graph: GraphArgs,
    /// Initial graph: auto, random, exact or descent (GNN-Descent).
    #[arg(long, default_value = "auto", value_parser = parse_knn)]
    knn: KnnInit,
    /// Another GPU build with these settings changed (key=value,...).
    #[arg(long)]
    variant: Vec<String>,
    /// Build the first GPU variant this many times (timings).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Skip the CPU build and the recall comparison.
    #[arg(long)]
    no_cpu: bool,
    /// Skip every GPU build (the k-NN and filter checks only).
    #[arg(long)]
    skip_builds: bool,
    #[arg(long)]
    no_cancel_test: bool,
    /// Rows of the exact k-NN check (default: all).
    #[arg(long)]
    knn_check_rows: Option<usize>,
    /// k of the exact k-NN check(s).
    #[arg(long, value_delimiter = ',', default_values_t = [16])]
    knn_k: Vec<usize>,
    /// Rows sampled against brute force in the k-NN check.
    #[arg(long, default_value_t = 300)]
    knn_sample: usize,
    /// Exact against random start at these row counts (time and recall).
    #[arg(long, value_delimiter = ',')]
    knn_bench: Vec<usize>,
    /// Rows of the GNN-Descent check against the exact k-NN graph (0: none).
    #[arg(long, default_value_t = 0)]
    descent_rows: usize,
    /// GNN-Descent's rounds in that check, it1:it2 each (the first is checked).
    #[arg(long, value_delimiter = ',', default_values_t = ["10:4".to_string()])]
    descent_rounds: Vec<String>,
    /// Rows whose candidate lists the filter check compares.
    #[arg(long, alias = "prune-rows", default_value_t = 2000)]
    filter_rows: usize,
    /// Rows of the CFS refinement check (0: none).
    #[arg(long, default_value_t = 20_000)]
    cfs_rows: usize,
    /// Refine each GPU build's graph on the GPU and a CPU build in the CFS
    /// start's order on the CPU into these CFS graphs (nsg, vamana, cagra,
    /// tsdg) and print their recall: GPU-built beside CPU-built.
    #[arg(long, value_delimiter = ',')]
    cfs_from_builds: Vec<String>,
    /// Print one line per GRNND round.
    #[arg(long)]
    verbose: bool,
}

fn parse_knn(s: &str) -> Result<KnnInit, String> {
    match s {
        "auto" => Ok(KnnInit::Auto),
        "random" => Ok(KnnInit::Random),
        "exact" => Ok(KnnInit::Exact),
        "descent" | "gnn_descent" => Ok(KnnInit::Descent),
        _ => Err("auto, random, exact or descent".into()),
    }
}

/// One GPU build's settings.
#[derive(Clone)]
struct Variant {
    label: String,
    params: BuildParams,
    knn: KnnInit,
    opts: GpuOptions,
}

impl Variant {
    fn apply(&mut self, spec: &str) {
        for (k, v) in pairs(spec) {
            let p = &mut self.params;
            match k.as_str() {
                "knn" => self.knn = parse_knn(&v).unwrap_or_else(|e| usage(&e)),
                "order" => {
                    self.opts.order = match v.as_str() {
                        "random" => ScanOrder::Random,
                        "ascending" => ScanOrder::Ascending,
                        _ => usage("order = random|ascending"),
                    }
                }
                "lanes" => self.opts.lanes_per_distance = number(&k, &v),
                "half" => self.opts.half_when_exact = number::<u32>(&k, &v) != 0,
                "verify" => self.opts.verify_cut = number::<u32>(&k, &v) != 0,
                "early" => self.opts.early_stop = number(&k, &v),
                "s" => p.s = number(&k, &v),
                "r" => p.r = number(&k, &v),
                "t1" => p.t1 = number(&k, &v),
                "t2" => p.t2 = number(&k, &v),
                "rho" => p.rho = number(&k, &v),
                "seed" => p.seed = number(&k, &v),
                "degree" => p.degree = number(&k, &v),
                _ => usage(&format!("unknown variant key {k:?}")),
            }
        }
    }
}

/// recall@10 at each ef of EFS, and queries/s on this machine's cores.
fn evaluate(g: &Graph, data: &Data) -> Vec<(f64, f64)> {
    let index = FlatIndex::new(Metric::L2, data.base.dim, data.base.data.clone(), g.clone());
    EFS.iter().map(|&ef| cpu_recall(&index, Metric::L2, &data.queries, &data.truth, ef)).collect()
}

fn graph_stats(g: &Graph) -> String {
    let n = g.len();
    let edges: usize = (0..n as u32).map(|v| g.neighbors(v).count()).sum();
    let empty = (0..n as u32).filter(|&v| g.neighbors(v).next().is_none()).count();
    format!("mean degree {:.2}, empty lists {empty}", edges as f64 / n.max(1) as f64)
}

fn print_recall(label: &str, r: &[(f64, f64)]) {
    let cells: Vec<String> =
        EFS.iter().zip(r).map(|(ef, (rc, qps))| format!("ef{ef} {rc:.4} ({qps:.0} qps)")).collect();
    println!("recall@10 {label:<28} {}", cells.join("  "));
}

/// Builds one variant (`reps` times); its graph, printed with its phases.
fn gpu_build(gpu: &Gpu, data: &Data, v: &Variant, reps: usize, verdict: &mut Verdict) -> Option<Graph> {
    let mut graph = None;
    for rep in 0..reps {
        let t = Instant::now();
        match build_with(gpu, &data.base.data, data.base.dim, &v.params, v.knn, &v.opts, &|| false) {
            Ok((g, pt)) => {
                println!(
                    "build {:<28} total {:.1} ms (wall {:.1}): upload {:.1}, start {:.1} ({}), refine {:.1} ({} rounds{}), final cut {:.1}, download {:.1}, medoid {:.1}",
                    v.label,
                    pt.total_ms(),
                    t.elapsed().as_secs_f64() * 1e3,
                    pt.upload_ms,
                    pt.knn_ms,
                    pt.start.label(),
                    pt.refine_ms,
                    pt.rounds,
                    if pt.half { ", fp16" } else { ", fp32" },
                    pt.final_cut_ms,
                    pt.download_ms,
                    pt.entry_ms
                );
                if rep == 0 {
                    if !pt.descent_entered.is_empty() {
                        println!("      GNN-Descent: entries per round {:?}", pt.descent_entered);
                    }
                    println!("      inserts per round: {:?}", pt.inserts_per_round);
                    println!("      distances per round: {:?}", pt.distances_per_round);
                }
                if let Some(mm) = pt.cut_mismatches {
                    verdict.check(mm == 0, format!("final cut: the device's and the engine's differ in {mm} lists"));
                }
                graph = Some(g);
            }
            Err(e) => {
                verdict.check(false, format!("build {}: {e}", v.label));
            }
        }
    }
    graph
}

/// Every GPU variant, then the CPU build; the first GPU build's recall must
/// be within 0.01 of the CPU's at every ef.
fn builds(gpu: &Gpu, data: &Data, o: &Opts, params: BuildParams, verdict: &mut Verdict) -> Vec<(String, Graph)> {
    let mut graphs = Vec::new();
    let first = Variant {
        label: "gpu".into(),
        params,
        knn: o.knn,
        opts: GpuOptions { verbose: o.verbose, verify_cut: true, ..Default::default() },
    };
    let mut variants = vec![first.clone()];
    for spec in &o.variant {
        let mut v = Variant { label: format!("gpu[{spec}]"), ..first.clone() };
        v.apply(spec);
        variants.push(v);
    }
    let mut first_recall = None;
    for (i, v) in variants.iter().enumerate() {
        let Some(g) = gpu_build(gpu, data, v, if i == 0 { o.repeat.max(1) } else { 1 }, verdict) else { continue };
        println!("      {}", graph_stats(&g));
        let r = evaluate(&g, data);
        print_recall(&v.label, &r);
        if i == 0 {
            first_recall = Some(r);
        }
        if !o.cfs_from_builds.is_empty() {
            graphs.push((v.label.clone(), g));
        }
    }
    let Some(gr) = first_recall else {
        verdict.check(false, "no GPU build to compare".into());
        return graphs;
    };
    if o.no_cpu {
        return graphs;
    }
    let t = Instant::now();
    let g = rnn_descent::build(&data.base.data, data.base.dim, &params, &mut |_: usize, _: usize| true)
        .expect("not cancelled");
    println!("build {:<28} total {:.1} ms", "cpu (engine)", t.elapsed().as_secs_f64() * 1e3);
    println!("      {}", graph_stats(&g));
    let r = evaluate(&g, data);
    print_recall("cpu (engine)", &r);
    for ((ef, (g, _)), (c, _)) in EFS.iter().zip(&gr).zip(&r) {
        verdict.check(*g >= c - 0.01, format!("ef {ef}: GPU recall@10 {g:.4}, CPU {c:.4} (at most 0.01 below)"));
    }
    if !o.cfs_from_builds.is_empty() {
        // a CPU build refines its start in the GPU's scan order
        let t = Instant::now();
        let s =
            rnn_descent::build_in(&data.base.data, data.base.dim, &params, START_ORDER, &mut |_: usize, _: usize| true)
                .expect("not cancelled");
        println!("build {:<28} total {:.1} ms", "cpu (CFS start)", t.elapsed().as_secs_f64() * 1e3);
        println!("      {}", graph_stats(&s));
        print_recall("cpu (CFS start)", &evaluate(&s, data));
        graphs.push(("cpu (CFS start)".into(), s));
    }
    graphs
}

/// A cancel stops a build promptly and frees its device memory.
fn cancel_test(gpu: &Gpu, data: &Data, params: &BuildParams, verdict: &mut Verdict) {
    let free0 = gpu.mem_info().map(|m| m.0).unwrap_or(0);
    let calls = std::cell::Cell::new(0);
    let t = Instant::now();
    let r = build_with(gpu, &data.base.data, data.base.dim, params, KnnInit::Random, &GpuOptions::default(), &|| {
        calls.set(calls.get() + 1);
        calls.get() > 3
    });
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let free1 = gpu.mem_info().map(|m| m.0).unwrap_or(0);
    let ok = matches!(r, Err(GpuError::Cancelled)) && free1 + (64 << 20) >= free0;
    verdict.check(
        ok,
        format!(
            "cancel after 3 checks: {:?} in {ms:.1} ms; free device memory {} MiB before, {} MiB after",
            r.as_ref().err(),
            free0 >> 20,
            free1 >> 20
        ),
    );
}

fn main() {
    let o = Opts::parse();
    let gpu = common::open_gpu();
    let data = o.data.load(Metric::L2);
    let params = o.graph.params();
    println!("params: {params:?}, knn {:?}", o.knn);
    let mut verdict = Verdict::default();
    if !o.skip_builds {
        let graphs = builds(&gpu, &data, &o, params, &mut verdict);
        refine::from_builds(&gpu, &data, &graphs, &o.cfs_from_builds, &params, &mut verdict);
        if !o.no_cancel_test {
            cancel_test(&gpu, &data, &params, &mut verdict);
        }
    }
    filters::check(&gpu, &data, o.filter_rows, params.degree, &mut verdict);
    refine::check(&gpu, &data, o.cfs_rows, &params, &mut verdict);
    let kn = o.knn_check_rows.unwrap_or(data.base.len()).min(data.base.len());
    for &k in &o.knn_k {
        knn::check(&gpu, &data, kn, k, o.knn_sample, &mut verdict);
    }
    if o.descent_rows > 1 {
        let rounds: Vec<(usize, usize)> = o
            .descent_rounds
            .iter()
            .map(|r| {
                let (a, b) = r.split_once(':').unwrap_or_else(|| usage("--descent-rounds takes it1:it2,..."));
                (number("it1", a), number("it2", b))
            })
            .collect();
        knn::descent_check(&gpu, &data, o.descent_rows.min(data.base.len()), &rounds, &mut verdict);
    }
    for &rows in &o.knn_bench {
        knn::bench(&gpu, &data, rows, &params);
    }
    verdict.finish()
}
