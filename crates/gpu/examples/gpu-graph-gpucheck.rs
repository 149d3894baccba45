//! The GPU test of the graph builders, run on the GPU machine:
//!
//! 1. opens the GPU (and says what it found);
//! 2. builds the graph of a data set on the GPU (GRNND) and on the CPU
//!    (the engine's rnn_descent::build) with the same parameters, printing
//!    each build's time (per phase for the GPU);
//! 3. searches both graphs with the engine's search and prints recall@10 at
//!    ef 10/20/40/80 (tie-aware, against exact ground truth);
//! 4. checks the exact k-NN graph of the GPU against brute force on a sample
//!    of rows.
//!
//! Exits 1 if the GPU's recall is more than 0.01 below the CPU's at some ef,
//! or if the k-NN graph differs from brute force; 2 on a usage or I/O error.
//!
//! usage: gpu-graph-gpucheck --base FILE [--rows N] --query FILE [--gt FILE]
//!        [--degree 32] [--s 16] [--r 64] [--t1 3] [--t2 8] [--rho 1.0]
//!        [--knn auto|random|exact] [--variant key=value,...]... [--repeat N]
//!        [--no-cpu] [--knn-check-rows N] [--knn-k 16] [--knn-sample 300]
//!        [--knn-bench 10000,100000,...] [--verbose]
//!
//! A `--variant` builds again on the GPU with some settings changed (keys:
//! knn, order = random|ascending, rule = strict|engine, lanes, early, s, r,
//! t1, t2, rho, seed) and reports its recall too; the first GPU build (no
//! variant) is the one compared with the CPU.

use std::path::Path;
use std::process::exit;
use std::time::Instant;

use gpu_graph_engine::dataset::{self, read_ivecs, Matrix};
use gpu_graph_engine::distance::l2sq;
use gpu_graph_engine::graph::Graph;
use gpu_graph_engine::memory::MemoryStore;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::recall::{exact_knn, mean_recall, truth_from_ids};
use gpu_graph_engine::rnn_descent;
use gpu_graph_engine::search::search;
use gpu_graph_gpu::{build_with, knn_graph, Gpu, GpuOptions, KnnInit, PruneRule, ScanOrder};
use rayon::prelude::*;

const EFS: [usize; 4] = [10, 20, 40, 80];
const K: usize = 10;

fn usage(msg: &str) -> ! {
    eprintln!("{msg}\nusage: see the top of crates/gpu/src/bin/gpu-graph-gpucheck.rs");
    exit(2)
}

fn read_vectors(path: &str, rows: Option<usize>) -> Matrix<f32> {
    dataset::read_vectors(Path::new(path), rows).unwrap_or_else(|e| usage(&e.to_string()))
}

#[derive(Clone)]
struct Variant {
    label: String,
    params: BuildParams,
    knn: KnnInit,
    opts: GpuOptions,
}

fn apply(v: &mut Variant, spec: &str) {
    for kv in spec.split(',').filter(|s| !s.is_empty()) {
        let (k, val) = kv.split_once('=').unwrap_or_else(|| usage(&format!("bad variant item {kv:?}")));
        let num = || val.parse::<f64>().unwrap_or_else(|_| usage(&format!("bad number in {kv:?}")));
        match k {
            "knn" => v.knn = parse_knn(val),
            "order" => {
                v.opts.order = match val {
                    "random" => ScanOrder::Random,
                    "ascending" => ScanOrder::Ascending,
                    _ => usage("order = random|ascending"),
                }
            }
            "rule" => {
                v.opts.rule = match val {
                    "strict" => PruneRule::Strict,
                    "engine" => PruneRule::Engine,
                    _ => usage("rule = strict|engine"),
                }
            }
            "lanes" => v.opts.lanes_per_distance = num() as u32,
            "flags" => {
                v.opts.old_on_accept = match val {
                    "ref" => false,
                    "engine" => true,
                    _ => usage("flags = ref|engine"),
                }
            }
            "half" => v.opts.half_when_exact = num() != 0.0,
            "verify" => v.opts.verify_cut = num() != 0.0,
            "early" => v.opts.early_stop = num(),
            "s" => v.params.s = num() as usize,
            "r" => v.params.r = num() as usize,
            "t1" => v.params.t1 = num() as usize,
            "t2" => v.params.t2 = num() as usize,
            "rho" => v.params.rho = num() as f32,
            "seed" => v.params.seed = num() as u64,
            "degree" => v.params.degree = num() as usize,
            _ => usage(&format!("unknown variant key {k:?}")),
        }
    }
}

fn parse_knn(s: &str) -> KnnInit {
    match s {
        "auto" => KnnInit::Auto,
        "random" => KnnInit::Random,
        "exact" => KnnInit::Exact,
        _ => usage("knn = auto|random|exact"),
    }
}

/// recall@10 at each ef of EFS, and queries per second on this machine's cores
fn evaluate(g: &Graph, base: &Matrix<f32>, queries: &Matrix<f32>, truth: &[Vec<(u32, f64)>]) -> Vec<(f64, f64)> {
    let n = base.len();
    let store = MemoryStore::from_graph(g, base.data.clone(), base.dim, (0..n as u64).collect());
    EFS.iter()
        .map(|&ef| {
            let t = Instant::now();
            let found: Vec<Vec<f64>> = (0..queries.len())
                .into_par_iter()
                .map(|q| {
                    search(&store, Metric::L2, queries.row(q), K, ef)
                        .iter()
                        .map(|h| Metric::L2.to_sql(h.dist))
                        .collect()
                })
                .collect();
            let qps = queries.len() as f64 / t.elapsed().as_secs_f64();
            (mean_recall(&found, truth, K), qps)
        })
        .collect()
}

fn graph_stats(g: &Graph) -> String {
    let n = g.len();
    let edges: usize = (0..n as u32).map(|v| g.neighbors(v).count()).sum();
    let empty = (0..n as u32).filter(|&v| g.neighbors(v).next().is_none()).count();
    format!("mean degree {:.2}, empty lists {empty}", edges as f64 / n.max(1) as f64)
}

fn print_recall(label: &str, r: &[(f64, f64)]) {
    let cells: Vec<String> =
        EFS.iter().zip(r).map(|(ef, (rc, qps))| format!("ef{ef} {rc:.4} ({:.0} qps)", qps)).collect();
    println!("recall@10 {label:<28} {}", cells.join("  "));
}

fn main() {
    let mut base_path = None;
    let mut query_path = None;
    let mut gt_path = None;
    let mut rows = None;
    let mut params = BuildParams::default();
    let mut knn = KnnInit::Auto;
    let mut variants: Vec<String> = Vec::new();
    let mut repeat = 1;
    let mut run_cpu = true;
    let mut knn_rows: Option<usize> = None;
    let mut knn_ks: Vec<usize> = vec![16];
    let mut skip_builds = false;
    let mut cancel_test = true;
    let mut knn_sample = 300;
    let mut knn_bench: Vec<usize> = Vec::new();
    let mut verbose = false;
    let mut args = std::env::args().skip(1);
    let next = |a: &str, it: &mut dyn Iterator<Item = String>| {
        it.next().unwrap_or_else(|| usage(&format!("{a} needs a value")))
    };
    while let Some(a) = args.next() {
        let num = |s: String| s.parse::<f64>().unwrap_or_else(|_| usage(&format!("{a}: not a number")));
        match a.as_str() {
            "--base" => base_path = Some(next(&a, &mut args)),
            "--query" => query_path = Some(next(&a, &mut args)),
            "--gt" => gt_path = Some(next(&a, &mut args)),
            "--rows" => rows = Some(num(next(&a, &mut args)) as usize),
            "--degree" => params.degree = num(next(&a, &mut args)) as usize,
            "--s" => params.s = num(next(&a, &mut args)) as usize,
            "--r" => params.r = num(next(&a, &mut args)) as usize,
            "--t1" => params.t1 = num(next(&a, &mut args)) as usize,
            "--t2" => params.t2 = num(next(&a, &mut args)) as usize,
            "--rho" => params.rho = num(next(&a, &mut args)) as f32,
            "--knn" => knn = parse_knn(&next(&a, &mut args)),
            "--variant" => variants.push(next(&a, &mut args)),
            "--repeat" => repeat = num(next(&a, &mut args)) as usize,
            "--no-cpu" => run_cpu = false,
            "--knn-check-rows" => knn_rows = Some(num(next(&a, &mut args)) as usize),
            "--knn-k" => {
                knn_ks =
                    next(&a, &mut args).split(',').map(|s| s.parse().unwrap_or_else(|_| usage("--knn-k"))).collect()
            }
            "--skip-builds" => skip_builds = true,
            "--no-cancel-test" => cancel_test = false,
            "--knn-sample" => knn_sample = num(next(&a, &mut args)) as usize,
            "--knn-bench" => {
                knn_bench =
                    next(&a, &mut args).split(',').map(|s| s.parse().unwrap_or_else(|_| usage("--knn-bench"))).collect()
            }
            "--verbose" => verbose = true,
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    let base_path = base_path.unwrap_or_else(|| usage("--base is required"));
    let query_path = query_path.unwrap_or_else(|| usage("--query is required"));

    // the GPU
    let t = Instant::now();
    let gpu = match Gpu::open() {
        Ok(g) => g,
        Err(e) => {
            println!("FAIL  Gpu::open: {e}");
            exit(1)
        }
    };
    let i = gpu.info();
    println!(
        "device {} (cc {}.{}, {} SMs, {} MiB), driver {}, NVRTC {}.{} ({:?}), libcuda {}, libnvrtc {}",
        i.name,
        i.cc.0,
        i.cc.1,
        i.sm_count,
        i.total_mem >> 20,
        i.driver_version,
        i.nvrtc_version.0,
        i.nvrtc_version.1,
        i.target,
        i.libcuda,
        i.libnvrtc
    );
    println!("open {:.0} ms (of which compile+load {:.0} ms)", t.elapsed().as_secs_f64() * 1e3, gpu.compile_ms);

    // data
    let t = Instant::now();
    let base = read_vectors(&base_path, rows);
    let queries = read_vectors(&query_path, None);
    if queries.dim != base.dim {
        usage("query and base dimensions differ");
    }
    let truth: Vec<Vec<(u32, f64)>> = match &gt_path {
        Some(p) => {
            let gt = read_ivecs(Path::new(p), Some(queries.len())).unwrap_or_else(|e| usage(&format!("{p}: {e}")));
            truth_from_ids(&base, &queries, &gt, K, Metric::L2)
        }
        None => exact_knn(&base.data, base.dim, &queries.data, K, Metric::L2),
    };
    println!(
        "data: {} rows x {} dims, {} queries, ground truth {} ({:.1} s)",
        base.len(),
        base.dim,
        queries.len(),
        gt_path.as_deref().unwrap_or("by brute force"),
        t.elapsed().as_secs_f64()
    );
    println!("params: {params:?}, knn {knn:?}");

    let mut failed = false;

    // GPU builds
    let mut vlist = vec![Variant {
        label: "gpu".into(),
        params,
        knn,
        opts: GpuOptions { verbose, verify_cut: true, ..Default::default() },
    }];
    for spec in &variants {
        let mut v = vlist[0].clone();
        v.label = format!("gpu[{spec}]");
        apply(&mut v, spec);
        vlist.push(v);
    }
    let mut first_gpu: Option<Vec<(f64, f64)>> = None;
    if skip_builds {
        vlist.clear();
        run_cpu = false;
    }
    for (vi, v) in vlist.iter().enumerate() {
        let reps = if vi == 0 { repeat.max(1) } else { 1 };
        let mut graph = None;
        for rep in 0..reps {
            let t = Instant::now();
            match build_with(&gpu, &base.data, base.dim, &v.params, v.knn, &v.opts, &|| false) {
                Ok((g, pt)) => {
                    println!(
                        "build {:<28} total {:.1} ms (wall {:.1}): upload {:.1}, start {:.1} ({}), refine {:.1} ({} rounds{}), final cut {:.1}, download {:.1}, medoid {:.1}",
                        v.label,
                        pt.total_ms(),
                        t.elapsed().as_secs_f64() * 1e3,
                        pt.upload_ms,
                        pt.knn_ms,
                        if pt.knn_exact { "exact+random" } else { "random" },
                        pt.refine_ms,
                        pt.rounds,
                        if pt.half { ", fp16" } else { ", fp32" },
                        pt.final_cut_ms,
                        pt.download_ms,
                        pt.entry_ms
                    );
                    if rep == 0 {
                        println!("      inserts per round: {:?}", pt.inserts_per_round);
                        println!("      distances per round: {:?}", pt.distances_per_round);
                    }
                    if let Some(mm) = pt.cut_mismatches {
                        println!("      device cut vs host cut: {mm} lists differ");
                        if mm > 0 {
                            println!("FAIL  the device's final cut differs from the host's");
                            failed = true;
                        }
                    }
                    graph = Some(g);
                }
                Err(e) => {
                    println!("FAIL  build {}: {e}", v.label);
                    failed = true;
                }
            }
        }
        if let Some(g) = graph {
            println!("      {}", graph_stats(&g));
            let r = evaluate(&g, &base, &queries, &truth);
            print_recall(&v.label, &r);
            if vi == 0 {
                first_gpu = Some(r);
            }
        }
    }

    // the CPU build
    if run_cpu {
        let t = Instant::now();
        let g =
            rnn_descent::build(&base.data, base.dim, &params, &mut |_: usize, _: usize| true).expect("not canceled");
        println!("build {:<28} total {:.1} ms", "cpu (engine)", t.elapsed().as_secs_f64() * 1e3);
        println!("      {}", graph_stats(&g));
        let r = evaluate(&g, &base, &queries, &truth);
        print_recall("cpu (engine)", &r);
        if let Some(gr) = &first_gpu {
            for ((ef, (g, _)), (c, _)) in EFS.iter().zip(gr).zip(&r) {
                if *g < c - 0.01 {
                    println!("FAIL  GPU recall@10 {g:.4} is more than 0.01 below the CPU's {c:.4} at ef {ef}");
                    failed = true;
                }
            }
        }
    }
    if first_gpu.is_none() && !skip_builds {
        failed = true;
    }

    // a cancel stops a build promptly and frees its device memory
    if cancel_test && !skip_builds {
        let free0 = gpu.mem_info().map(|m| m.0).unwrap_or(0);
        let calls = std::cell::Cell::new(0);
        let t = Instant::now();
        let r = build_with(&gpu, &base.data, base.dim, &params, KnnInit::Random, &GpuOptions::default(), &|| {
            calls.set(calls.get() + 1);
            calls.get() > 3
        });
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let free1 = gpu.mem_info().map(|m| m.0).unwrap_or(0);
        let ok = matches!(r, Err(gpu_graph_gpu::GpuError::Cancelled)) && free1 + (64 << 20) >= free0;
        println!(
            "{}  cancel after 3 checks: {:?} in {ms:.1} ms; free device memory {} MiB before, {} MiB after",
            if ok { "ok  " } else { "FAIL" },
            r.as_ref().err(),
            free0 >> 20,
            free1 >> 20
        );
        failed |= !ok;
    }

    // the exact k-NN graph against brute force
    let kn = knn_rows.unwrap_or(base.len()).min(base.len());
    for &knn_k in &knn_ks {
        if kn >= 2 {
            let data = &base.data[..kn * base.dim];
            let t = Instant::now();
            match knn_graph(&gpu, data, base.dim, knn_k) {
                Err(e) => {
                    println!("FAIL  exact k-NN: {e}");
                    failed = true;
                }
                Ok(g) => {
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    let k = knn_k.min(kn - 1);
                    let step = (kn / knn_sample.max(1)).max(1);
                    let sample: Vec<usize> = (0..kn).step_by(step).take(knn_sample).collect();
                    let bad: Vec<String> = sample
                        .par_iter()
                        .filter_map(|&v| {
                            let row = &data[v * base.dim..(v + 1) * base.dim];
                            let mut all: Vec<(f32, u32)> = (0..kn)
                                .filter(|&u| u != v)
                                .map(|u| (l2sq(row, &data[u * base.dim..(u + 1) * base.dim]), u as u32))
                                .collect();
                            all.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                            let kth = all[k - 1].0;
                            let got = &g.ids[v * g.k..v * g.k + k];
                            // tie-aware: every returned id is a true neighbour at
                            // most as far as the true k-th, no id twice, and the
                            // GPU's fp32 distances are right
                            let mut seen = std::collections::HashSet::new();
                            for (j, &id) in got.iter().enumerate() {
                                if id as usize >= kn || id as usize == v || !seen.insert(id) {
                                    return Some(format!("row {v}: bad id {id} at {j}"));
                                }
                                let d = l2sq(row, &data[id as usize * base.dim..(id as usize + 1) * base.dim]);
                                let tol = 1e-5 * kth.abs().max(1e-30);
                                if d > kth + tol {
                                    return Some(format!("row {v}: id {id} at {d} beyond the true k-th {kth}"));
                                }
                                let gd = g.dists[v * g.k + j];
                                if (gd - d).abs() > 1e-5 * d.abs().max(1e-30) + 1e-6 {
                                    return Some(format!("row {v}: distance of {id} {gd} != {d}"));
                                }
                            }
                            None
                        })
                        .collect();
                    println!(
                        "exact k-NN (k {k}) of {kn} rows: {:.1} ms; {} of {} sampled rows differ from brute force",
                        ms,
                        bad.len(),
                        sample.len()
                    );
                    for b in bad.iter().take(5) {
                        println!("      {b}");
                    }
                    if !bad.is_empty() {
                        failed = true;
                    }
                }
            }
        }
    }

    // exact k-NN start against random start at several sizes: time and
    // recall (300 queries, ground truth of the prefix by brute force)
    for &nb in &knn_bench {
        let nb = nb.min(base.len());
        let prefix = Matrix { dim: base.dim, data: base.data[..nb * base.dim].to_vec() };
        let qs = Matrix { dim: queries.dim, data: queries.data[..300.min(queries.len()) * queries.dim].to_vec() };
        let tr = exact_knn(&prefix.data, prefix.dim, &qs.data, K, Metric::L2);
        for (label, init) in [("random", KnnInit::Random), ("exact", KnnInit::Exact)] {
            let o = GpuOptions::default();
            match build_with(&gpu, &prefix.data, base.dim, &params, init, &o, &|| false) {
                Ok((g, pt)) => {
                    let r = evaluate(&g, &prefix, &qs, &tr);
                    println!(
                        "knn-bench rows {nb:>8} start {label:<6}: total {:.1} ms (start {:.1}, refine {:.1}, cut {:.1}, download {:.1}); recall@10 {}",
                        pt.total_ms(),
                        pt.knn_ms,
                        pt.refine_ms,
                        pt.final_cut_ms,
                        pt.download_ms,
                        r.iter().map(|x| format!("{:.4}", x.0)).collect::<Vec<_>>().join(" ")
                    )
                }
                Err(e) => println!("knn-bench rows {nb} start {label}: {e}"),
            }
        }
    }

    if failed {
        println!("RESULT: FAIL");
        exit(1);
    }
    println!("RESULT: PASS");
}
