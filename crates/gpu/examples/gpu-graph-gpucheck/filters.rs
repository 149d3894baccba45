//! The CFS filters on both sides: the GPU's filter_rows (kernels/filter.cu)
//! against the engine's Filter::apply, list for list, for each filter on
//! candidate lists of real rows, with the time of each side on the same
//! candidates (the whole refinements: refine.rs).
//!
//! Integer-valued data (SIFT) makes every distance exact on both sides, so
//! lists must be equal; with other data a comparison within rounding can
//! go the other way (the GPU sums in another order), so up to 1% of the
//! lists may differ.

use std::time::Instant;

use gpu_graph_engine::distance::l2sq;
use gpu_graph_engine::filter::Filter;
use gpu_graph_engine::filter_rows::{CpuFilters, FilterRows};
use gpu_graph_gpu::filter::GpuFilters;
use gpu_graph_gpu::Gpu;
use rayon::prelude::*;

use crate::common::{Data, Verdict};

/// Candidates per list: the index's default `candidates` (CFS's pool).
pub const PER_ROW: usize = 64;
/// Rows of the base the checks read (brute force over them).
const BASE_ROWS: usize = 20_000;

const FILTERS: [Filter; 5] =
    [Filter::Rng, Filter::Nsg, Filter::Vamana { alpha: 1.2 }, Filter::Cagra, Filter::TsdgOrder { max_lambda: 4 }];

/// Whether `differ` of `of` may differ: none on integer data, 1% else.
fn within(differ: usize, of: usize, integral: bool) -> bool {
    differ == 0 || (!integral && differ * 100 <= of)
}

fn note(integral: bool) -> &'static str {
    if integral {
        ""
    } else {
        "; not integer data: up to 1% may round apart"
    }
}

/// For `rows` rows spread over the first BASE_ROWS of the base: their
/// PER_ROW nearest by brute force, filtered by each filter on both sides.
pub fn check(gpu: &Gpu, data: &Data, rows: usize, degree: usize, verdict: &mut Verdict) {
    let (n, dim) = (data.base.len().min(BASE_ROWS), data.base.dim);
    if n <= PER_ROW || rows == 0 {
        return;
    }
    let base = &data.base.data[..n * dim];
    let integral = base.iter().all(|x| x.fract() == 0.0);
    let vec_of = |i: usize| &base[i * dim..(i + 1) * dim];
    let nodes: Vec<usize> = (0..rows).map(|i| i * n / rows).collect();
    let lists: Vec<Vec<(u32, f32)>> = nodes
        .par_iter()
        .map(|&v| {
            let mut all: Vec<(u32, f32)> =
                (0..n).filter(|&u| u != v).map(|u| (u as u32, l2sq(vec_of(v), vec_of(u)))).collect();
            all.sort_unstable_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
            all.truncate(PER_ROW);
            all
        })
        .collect();
    let mut on_gpu = match GpuFilters::new(gpu, base, dim) {
        Ok(f) => f,
        Err(e) => {
            verdict.check(false, format!("the GPU's filters: {e}"));
            return;
        }
    };
    let mut on_cpu = CpuFilters { vectors: base, dim };
    // the first call compiles filter.cu
    let _ = on_gpu.filter_rows(Filter::Rng, &lists[..1], degree);
    for filter in FILTERS {
        let t = Instant::now();
        let gpu_kept = match on_gpu.filter_rows(filter, &lists, degree) {
            Ok(k) => k,
            Err(e) => {
                verdict.check(false, format!("{filter:?} on the GPU: {e}"));
                continue;
            }
        };
        let gpu_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let Ok(cpu_kept) = on_cpu.filter_rows(filter, &lists, degree);
        let cpu_ms = t.elapsed().as_secs_f64() * 1e3;
        let differ = gpu_kept.iter().zip(&cpu_kept).filter(|(g, c)| g != c).count();
        verdict.check(
            within(differ, rows, integral),
            format!(
                "filter {filter:?}: {differ} of {rows} lists differ between the GPU and the engine ({PER_ROW} candidates, degree {degree}); GPU {gpu_ms:.1} ms, CPU {cpu_ms:.1} ms on {} threads{}",
                rayon::current_num_threads(),
                note(integral)
            ),
        );
    }
}
