//! Shared by the GPU check programs (run on the GPU machine by
//! tests/gpu/*.sh): the data and graph options, loading and ground truth,
//! opening the GPU, recall, and the ok/FAIL lines.
#![allow(dead_code)] // each program uses a different part

use std::path::PathBuf;
use std::process::exit;
use std::time::Instant;

use clap::Args;
use gpu_graph_engine::dataset::{read_ivecs, read_vectors, Matrix};
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::recall::{exact_knn, mean_recall, truth_from_ids};
use gpu_graph_engine::search::search;
use gpu_graph_engine::store::GraphView;
use gpu_graph_gpu::Gpu;
use rayon::prelude::*;

/// Recall is recall@K.
pub const K: usize = 10;

/// Which vectors, and their ground truth.
#[derive(Args, Clone, Debug)]
pub struct DataArgs {
    /// Base vectors (.fvecs or .bvecs).
    #[arg(long)]
    pub base: PathBuf,
    /// Read at most this many base rows.
    #[arg(long)]
    pub rows: Option<usize>,
    /// Query vectors (.fvecs or .bvecs).
    #[arg(long)]
    pub query: PathBuf,
    /// Ground-truth ids (.ivecs) over the base rows read; by brute force when absent.
    #[arg(long)]
    pub gt: Option<PathBuf>,
}

/// The graph's build parameters (defaults: the index's).
#[derive(Args, Clone, Debug)]
pub struct GraphArgs {
    #[arg(long, default_value_t = BuildParams::default().degree)]
    pub degree: usize,
    #[arg(long, default_value_t = BuildParams::default().s)]
    pub s: usize,
    #[arg(long, default_value_t = BuildParams::default().r)]
    pub r: usize,
    #[arg(long, default_value_t = BuildParams::default().t1)]
    pub t1: usize,
    #[arg(long, default_value_t = BuildParams::default().t2)]
    pub t2: usize,
    #[arg(long, default_value_t = BuildParams::default().rho)]
    pub rho: f32,
}

impl GraphArgs {
    pub fn params(&self) -> BuildParams {
        let (degree, s, r, t1, t2, rho) = (self.degree, self.s, self.r, self.t1, self.t2, self.rho);
        BuildParams { degree, s, r, t1, t2, rho, ..BuildParams::default() }
    }
}

/// Vectors with exact ground truth.
pub struct Data {
    pub base: Matrix<f32>,
    pub queries: Matrix<f32>,
    /// per query: the true K nearest (row, operator distance)
    pub truth: Vec<Vec<(u32, f64)>>,
}

/// A usage or I/O error: exit status 2.
pub fn usage(msg: &str) -> ! {
    eprintln!("{msg} (--help for the options)");
    exit(2)
}

impl DataArgs {
    pub fn load(&self, metric: Metric) -> Data {
        let t = Instant::now();
        let read = |p: &PathBuf, rows| read_vectors(p, rows).unwrap_or_else(|e| usage(&e.to_string()));
        let base = read(&self.base, self.rows);
        let queries = read(&self.query, None);
        if queries.dim != base.dim {
            usage("query and base dimensions differ");
        }
        let truth = match &self.gt {
            Some(p) => {
                let gt = read_ivecs(p, Some(queries.len())).unwrap_or_else(|e| usage(&format!("{}: {e}", p.display())));
                // ids of the whole base file, when --rows read fewer
                if let Some(&id) = gt.data.iter().find(|&&id| id < 0 || id as usize >= base.len()) {
                    usage(&format!(
                        "{}: the ground truth names row {id}, beyond the {} rows read (--rows): leave out --gt to compute it",
                        p.display(),
                        base.len()
                    ));
                }
                truth_from_ids(&base, &queries, &gt, K, metric)
            }
            None => exact_knn(&base.data, base.dim, &queries.data, K, metric),
        };
        println!(
            "data: {} rows x {} dims, {} queries, ground truth {} ({:.1} s)",
            base.len(),
            base.dim,
            queries.len(),
            self.gt.as_ref().map_or("by brute force".into(), |p| p.display().to_string()),
            t.elapsed().as_secs_f64()
        );
        Data { base, queries, truth }
    }
}

/// Opens the GPU and says what it found; exit status 1 when there is none.
pub fn open_gpu() -> Gpu {
    let t = Instant::now();
    let gpu = Gpu::open().unwrap_or_else(|e| {
        println!("FAIL  Gpu::open: {e}");
        exit(1)
    });
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
    gpu
}

/// Recall@K of the engine's search over `index` at beam `ef` (a hit's
/// payload is its row), and queries/s on this machine's cores.
pub fn cpu_recall<G: GraphView + Sync>(
    index: &G,
    metric: Metric,
    queries: &Matrix<f32>,
    truth: &[Vec<(u32, f64)>],
    ef: usize,
) -> (f64, f64) {
    let t = Instant::now();
    let found: Vec<Vec<f64>> = (0..queries.len())
        .into_par_iter()
        .map(|q| search(index, metric, queries.row(q), K, ef).iter().map(|h| metric.to_sql(h.dist)).collect())
        .collect();
    (mean_recall(&found, truth, K), queries.len() as f64 / t.elapsed().as_secs_f64())
}

/// `key=value,key=value` (a variant of the defaults).
pub fn pairs(spec: &str) -> Vec<(String, String)> {
    spec.split(',')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or_else(|| usage(&format!("bad item {kv:?} (key=value)")));
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// A number of a `pairs` value.
pub fn number<T: std::str::FromStr>(key: &str, v: &str) -> T {
    v.parse().unwrap_or_else(|_| usage(&format!("{key}: not a number: {v:?}")))
}

/// The run's verdict, line by line.
#[derive(Default)]
pub struct Verdict {
    pub failed: bool,
}

impl Verdict {
    /// Prints `ok  ` or `FAIL` and the line; remembers a failure.
    pub fn check(&mut self, ok: bool, line: String) -> bool {
        println!("{} {line}", if ok { "ok  " } else { "FAIL" });
        self.failed |= !ok;
        ok
    }
    /// The last line and the exit status.
    pub fn finish(self) -> ! {
        if self.failed {
            println!("RESULT: FAIL");
            exit(1);
        }
        println!("RESULT: PASS");
        exit(0)
    }
}
