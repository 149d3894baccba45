//! Whole CFS refinements of the first rows, from the CPU's RNN-Descent
//! graph (in the scan order a CPU build refines, cfs::START_ORDER), on both sides: the GPU's (cfs::refine_with the GPU's collect
//! searches and filters, as a GPU build refines) against the CPU's, each
//! timed, and the recall@10 of both graphs under the engine's search. The
//! GPU's searches may find a few other candidates than the CPU's (another
//! expansion order, other ties), so the graphs are not compared list for
//! list; the GPU's graph must keep the CPU's recall within 0.01.

use std::convert::Infallible;
use std::time::Instant;

use gpu_graph_engine::cfs::{refine, refine_with, Algorithm, CfsParams, START_ORDER};
use gpu_graph_engine::collect_rows::CpuCollect;
use gpu_graph_engine::filter_rows::{CpuFilters, Timed};
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::graph::Graph;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::recall::exact_knn;
use gpu_graph_engine::rnn_descent;
use gpu_graph_gpu::collect::GpuCollect;
use gpu_graph_gpu::filter::GpuFilters;
use gpu_graph_gpu::{Gpu, GpuError};

use crate::common::{cpu_recall, Data, Verdict, K};
use crate::filters::PER_ROW;

/// The efs of the recall comparison.
const EFS: [usize; 2] = [20, 40];

/// A refinement's graph and ms: in all, of its setup (the GPU's uploads and
/// search server), its searches and its filters.
struct Refined {
    graph: Graph,
    total_ms: f64,
    setup_ms: f64,
    collect_ms: f64,
    filter_ms: f64,
    /// ms at the end of the collect-and-filter steps, of the store's, and
    /// of the links that make every node reachable
    phases: [f64; 3],
}

/// A progress callback noting when each phase of refine_with ended
/// (`all` = 2 × steps a phase + 1 for the links).
fn phase_marks(t: Instant, phases: &mut [f64; 3]) -> impl FnMut(usize, usize) -> bool + '_ {
    move |done: usize, all: usize| {
        let per = (all - 1) / 2;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        match done {
            d if d == per => phases[0] = ms,
            d if d == 2 * per => phases[1] = ms,
            d if d == all => phases[2] = ms,
            _ => {}
        }
        true
    }
}

/// As src/am/refine.rs refines after a GPU build: the filters first (their
/// kernel launched before the search server's persistent kernel runs).
fn on_gpu(gpu: &Gpu, base: &[f32], dim: usize, start: &Graph, p: &CfsParams) -> Result<Refined, GpuError> {
    let t = Instant::now();
    let mut filters = Timed { inner: GpuFilters::new(gpu, base, dim)?, ms: 0.0 };
    let mut collect = Timed { inner: GpuCollect::start(gpu, base, dim, start, p.beam())?, ms: 0.0 };
    let setup_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut phases = [0.0; 3];
    let g = refine_with(base, dim, start, p, &mut collect, &mut filters, &mut phase_marks(t, &mut phases))?;
    let graph = g.expect("never stopped");
    let total_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(Refined { graph, total_ms, setup_ms, collect_ms: collect.ms, filter_ms: filters.ms, phases })
}

fn on_cpu(base: &[f32], dim: usize, start: &Graph, p: &CfsParams) -> Refined {
    let t = Instant::now();
    let mut collect = Timed { inner: CpuCollect { vectors: base, dim, start }, ms: 0.0 };
    let mut filters = Timed { inner: CpuFilters { vectors: base, dim }, ms: 0.0 };
    let mut phases = [0.0; 3];
    let g: Result<Option<Graph>, Infallible> =
        refine_with(base, dim, start, p, &mut collect, &mut filters, &mut phase_marks(t, &mut phases));
    let Ok(Some(graph)) = g else { unreachable!("never stopped") };
    let total_ms = t.elapsed().as_secs_f64() * 1e3;
    debug_assert_eq!(Some(&graph), refine(base, dim, start, p, &mut |_: usize, _: usize| true).as_ref());
    Refined { graph, total_ms, setup_ms: 0.0, collect_ms: collect.ms, filter_ms: filters.ms, phases }
}

/// The CFS graphs of the first `rows` rows refined on the GPU and on the
/// CPU: each side's times, and recall@10 at EFS (the GPU's at most 0.01
/// below the CPU's).
pub fn check(gpu: &Gpu, data: &Data, rows: usize, params: &BuildParams, verdict: &mut Verdict) {
    let (n, dim) = (data.base.len().min(rows), data.base.dim);
    if n <= PER_ROW {
        return;
    }
    let base = &data.base.data[..n * dim];
    // the loaded ground truth is over all the rows read
    let t = Instant::now();
    let own_truth;
    let truth = if n == data.base.len() {
        &data.truth
    } else {
        own_truth = exact_knn(base, dim, &data.queries.data, K, Metric::L2);
        println!("refine: ground truth of the first {n} rows by brute force ({:.1} s)", t.elapsed().as_secs_f64());
        &own_truth
    };
    let recall = |g: &Graph| -> Vec<f64> {
        let index = FlatIndex::new(Metric::L2, dim, base.to_vec(), g.clone());
        EFS.iter().map(|&ef| cpu_recall(&index, Metric::L2, &data.queries, truth, ef).0).collect()
    };
    let start =
        rnn_descent::build_in(base, dim, params, START_ORDER, &mut |_: usize, _: usize| true).expect("not cancelled");
    let algorithms = [
        Algorithm::Nsg,
        Algorithm::Vamana { alpha: 1.2 },
        Algorithm::Cagra,
        Algorithm::Tsdg { alpha: 1.2, max_lambda: 32 },
    ];
    for algorithm in algorithms {
        let p = CfsParams { algorithm, degree: params.degree, pool: PER_ROW };
        let g = match on_gpu(gpu, base, dim, &start, &p) {
            Ok(g) => g,
            Err(e) => {
                verdict.check(false, format!("refine {algorithm:?} on the GPU: {e}"));
                continue;
            }
        };
        let c = on_cpu(base, dim, &start, &p);
        let (gr, cr) = (recall(&g.graph), recall(&c.graph));
        let differ = (0..n as u32).filter(|&v| g.graph.neighbors(v).ne(c.graph.neighbors(v))).count();
        let cells: Vec<String> =
            EFS.iter().zip(gr.iter().zip(&cr)).map(|(ef, (g, c))| format!("ef {ef} {g:.4} (CPU {c:.4})")).collect();
        verdict.check(
            gr.iter().zip(&cr).all(|(g, c)| *g >= c - 0.01),
            format!(
                "refine {algorithm:?} ({n} rows, pool {PER_ROW}): GPU {:.0} ms (setup {:.0}, searches {:.0}, filters {:.0}; phases end at {:.0?}) against CPU {:.0} ms (searches {:.0}, filters {:.0}; phases end at {:.0?}; {} threads); recall@10 of the GPU's graph {} (at most 0.01 below); {differ} lists differ",
                g.total_ms,
                g.setup_ms,
                g.collect_ms,
                g.filter_ms,
                g.phases,
                c.total_ms,
                c.collect_ms,
                c.filter_ms,
                c.phases,
                rayon::current_num_threads(),
                cells.join(", ")
            ),
        );
    }
}

/// Each start graph of `graphs` (the builds' own, all of them over every
/// row) refined into each CFS graph of `names` (a GPU build's on the GPU,
/// a CPU build's on the CPU, as CREATE INDEX does), with recall@10 at ef
/// 10 / 20 / 40 / 80: the GPU-built CFS graphs beside the CPU-built. A GPU
/// build from random lists (`knn=random`, labelled so) runs the CPU's
/// algorithm: its CFS graph must reach the CPU-built one's recall within
/// 0.01 at every ef (other GPU builds are printed, not checked: their
/// k-NN start is the GPU's own).
pub fn from_builds(
    gpu: &Gpu,
    data: &Data,
    graphs: &[(String, Graph)],
    names: &[String],
    params: &BuildParams,
    verdict: &mut Verdict,
) {
    let (base, dim) = (&data.base.data, data.base.dim);
    for name in names {
        let algorithm = match name.as_str() {
            "nsg" => Algorithm::Nsg,
            "vamana" => Algorithm::Vamana { alpha: 1.2 },
            "cagra" => Algorithm::Cagra,
            "tsdg" => Algorithm::Tsdg { alpha: 1.2, max_lambda: 32 },
            _ => crate::common::usage("--cfs-from-builds takes nsg, vamana, cagra, tsdg"),
        };
        // the index's default candidates (src/am/options.rs)
        let p = CfsParams { algorithm, degree: params.degree, pool: 64 };
        let (mut from_random, mut from_cpu) = (None, None);
        for (label, start) in graphs {
            // a CPU build refines on the CPU (deterministic), a GPU build on the GPU
            let on_the_cpu = label.starts_with("cpu");
            let refined = if on_the_cpu { Ok(on_cpu(base, dim, start, &p)) } else { on_gpu(gpu, base, dim, start, &p) };
            match refined {
                Ok(g) => {
                    // the builds' own evaluation, at the builds' efs
                    let r: Vec<f64> = crate::evaluate(&g.graph, data).into_iter().map(|(r, _)| r).collect();
                    let cells: Vec<String> =
                        crate::EFS.iter().zip(&r).map(|(ef, r)| format!("ef{ef} {r:.4}")).collect();
                    println!("cfs {name:<7} from {label:<28} {:.0} ms: {}", g.total_ms, cells.join("  "));
                    if on_the_cpu {
                        from_cpu = Some(r);
                    } else if label.contains("knn=random") {
                        from_random = Some(r);
                    }
                }
                Err(e) => {
                    verdict.check(false, format!("refine {name} from {label} on the GPU: {e}"));
                }
            }
        }
        if let (Some(g), Some(c)) = (from_random, from_cpu) {
            let cells: Vec<String> = crate::EFS
                .iter()
                .zip(g.iter().zip(&c))
                .map(|(ef, (g, c))| format!("ef {ef} {g:.4} (CPU {c:.4})"))
                .collect();
            verdict.check(
                g.iter().zip(&c).all(|(g, c)| (g - c).abs() <= 0.01),
                format!(
                    "{name} built on the GPU from random lists against the CPU build: {} (within 0.01)",
                    cells.join(", ")
                ),
            );
        }
    }
}
