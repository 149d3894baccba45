//! The one prune rule on both sides: the GPU's grnnd_prune (the same
//! `occludes` as GRNND's update) against the engine's rng_prune, list for
//! list, on candidate lists of real rows.

use std::time::Instant;

use gpu_graph_engine::distance::l2sq;
use gpu_graph_engine::prune::rng_prune;
use gpu_graph_engine::NO_NODE;
use gpu_graph_gpu::prune::{prune_lists, CandidateLists};
use gpu_graph_gpu::Gpu;
use rayon::prelude::*;

use crate::common::{Data, Verdict};

/// Candidates per list: beyond twice the degree the rule rarely keeps anything.
const PER_ROW: usize = 64;

/// For `rows` rows spread over the base (each against the first 20,000
/// rows): the 64 nearest candidates by brute force, pruned on both sides.
/// Integer-valued data (SIFT) makes every distance exact on both sides, so
/// the lists must be equal; with other data a comparison within rounding
/// can go the other way (the GPU sums in another order), so up to 1% of the
/// lists may differ.
pub fn check(gpu: &Gpu, data: &Data, rows: usize, degree: usize, verdict: &mut Verdict) {
    let (n, dim) = (data.base.len().min(20_000), data.base.dim);
    if n <= PER_ROW || rows == 0 {
        return;
    }
    let base = &data.base.data[..n * dim];
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
    let ids: Vec<u32> = lists.iter().flat_map(|l| l.iter().map(|c| c.0)).collect();
    let dists: Vec<f32> = lists.iter().flat_map(|l| l.iter().map(|c| c.1)).collect();
    let t = Instant::now();
    let gpu_kept =
        match prune_lists(gpu, base, dim, &CandidateLists { per_row: PER_ROW, ids: &ids, dists: &dists }, degree) {
            Ok(k) => k,
            Err(e) => {
                verdict.check(false, format!("prune on the GPU: {e}"));
                return;
            }
        };
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let differ = lists
        .par_iter()
        .zip(gpu_kept.par_chunks(degree))
        .filter(|(cands, kept)| {
            let vectors: Vec<f32> = cands.iter().flat_map(|c| vec_of(c.0 as usize).iter().copied()).collect();
            let engine: Vec<u32> = rng_prune(cands, &vectors, dim, degree).iter().map(|k| k.0).collect();
            let gpu: Vec<u32> = kept.iter().copied().take_while(|&x| x != NO_NODE).collect();
            engine != gpu
        })
        .count();
    let integral = base.iter().all(|x| x.fract() == 0.0);
    verdict.check(
        differ == 0 || (!integral && differ * 100 <= rows),
        format!(
            "prune rule: {differ} of {rows} lists differ between the GPU and the engine ({PER_ROW} candidates, degree {degree}, {ms:.0} ms{})",
            if integral { "" } else { "; not integer data: up to 1% may round apart" }
        ),
    );
}
