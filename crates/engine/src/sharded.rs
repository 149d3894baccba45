//! A graph build in shards, for data whose whole build does not fit one
//! device (Tagore; CMANNS sizes the shards from the memory budget): the
//! points partitioned (`partition`), each shard's graph built by the
//! caller's builder (the GPU's GRNND, or RNN-Descent on the CPU), and the
//! graphs joined (`merge`). The same loop serves every builder.

use std::time::Instant;

use rayon::prelude::*;

use crate::graph::Graph;
use crate::params::BuildParams;
use crate::partition::{partition, plan};

/// Points the partition's k-means samples.
const SAMPLE: usize = 100_000;

/// What a sharded build did.
#[derive(Clone, Debug, Default)]
pub struct ShardStats {
    pub shards: usize,
    /// rows of the largest shard
    pub largest: usize,
    /// shard rows over rows
    pub overlap: f64,
    pub partition_ms: f64,
    pub shards_ms: f64,
    pub merge_ms: f64,
    /// nodes the merge linked to make every node reachable
    pub repaired: usize,
}

/// Builds the graph over `vectors` (n × `dim` stored vectors) in shards of
/// at most `max_rows`: `build_shard` builds one shard's graph over the rows
/// it is given (None: cancelled, and so is the build); `progress` gets the
/// shards built and their number, and stops the build by returning false.
pub fn build_sharded(
    vectors: &[f32],
    dim: usize,
    params: &BuildParams,
    max_rows: usize,
    build_shard: &mut dyn FnMut(&[f32]) -> Option<Graph>,
    progress: &mut dyn FnMut(usize, usize) -> bool,
) -> Option<(Graph, ShardStats)> {
    let n = vectors.len() / dim;
    let t = Instant::now();
    let (k, cap) = plan(n, max_rows.max(2));
    let parts = partition(vectors, dim, k, cap, SAMPLE, params.seed);
    let mut stats = ShardStats {
        shards: k,
        largest: parts.shards.iter().map(Vec::len).max().unwrap_or(0),
        overlap: parts.shards.iter().map(Vec::len).sum::<usize>() as f64 / n.max(1) as f64,
        partition_ms: t.elapsed().as_secs_f64() * 1e3,
        ..ShardStats::default()
    };
    if !progress(0, k) {
        return None;
    }
    let t = Instant::now();
    let graphs = std::thread::scope(|scope| {
        let mut graphs = Vec::with_capacity(k);
        let mut next = Some(gather(vectors, dim, &parts.shards[0]));
        for s in 0..k {
            let rows = next.take().expect("gathered ahead");
            // the next shard's rows are gathered while this one builds
            let ahead = parts.shards.get(s + 1).map(|ids| scope.spawn(move || gather(vectors, dim, ids)));
            let built = build_shard(&rows);
            drop(rows);
            next = ahead.map(|h| h.join().expect("gathering a shard's rows"));
            graphs.push(built?);
            if !progress(s + 1, k) {
                return None;
            }
        }
        Some(graphs)
    })?;
    stats.shards_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    // the merge's refinement rounds count as one more step of the progress
    let (graph, repaired) =
        crate::merge::merge(vectors, dim, params, &parts.shards, &graphs, &mut |_: usize, _: usize| progress(k, k))?;
    stats.merge_ms = t.elapsed().as_secs_f64() * 1e3;
    stats.repaired = repaired;
    Some((graph, stats))
}

/// The rows of `ids`, contiguous, copied on every core (at 10M x 96 one
/// shard is 0.85 GB).
fn gather(vectors: &[f32], dim: usize, ids: &[u32]) -> Vec<f32> {
    let len = ids.len() * dim;
    let mut rows: Vec<f32> = Vec::with_capacity(len);
    rows.spare_capacity_mut()[..len].par_chunks_mut(dim.max(1)).zip(ids.par_iter()).for_each(|(out, &i)| {
        out.write_copy_of_slice(&vectors[i as usize * dim..(i as usize + 1) * dim]);
    });
    // SAFETY: every one of the `len` values was written above (one row of
    // `dim` for each id).
    unsafe { rows.set_len(len) };
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{data_dir, read_vectors};
    use crate::flat::FlatIndex;
    use crate::metric::Metric;
    use crate::random::SplitMix64;
    use crate::recall::{exact_knn, mean_recall};
    use crate::rnn_descent;
    use crate::search::search;

    /// `n` points of `dim` around 50 centres, and `q` queries drawn the same way.
    fn clustered(n: usize, q: usize, dim: usize) -> (Vec<f32>, Vec<f32>) {
        let mut rng = SplitMix64(42);
        let mut unit = move || (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        let centres: Vec<f32> = (0..50 * dim).map(|_| unit() * 10.0).collect();
        let mut draw = |count: usize| -> Vec<f32> {
            (0..count)
                .flat_map(|_| {
                    let c = (unit() * 50.0) as usize % 50;
                    (0..dim).map(|j| centres[c * dim + j] + unit() - 0.5).collect::<Vec<f32>>()
                })
                .collect()
        };
        let base = draw(n);
        (base, draw(q))
    }

    fn recall(vectors: &[f32], dim: usize, graph: Graph, queries: &[f32], ef: usize) -> f64 {
        let truth = exact_knn(vectors, dim, queries, 10, Metric::L2);
        let index = FlatIndex::new(Metric::L2, dim, vectors.to_vec(), graph);
        let found: Vec<Vec<f64>> = queries
            .chunks_exact(dim)
            .map(|q| search(&index, Metric::L2, q, 10, ef).iter().map(|h| (h.dist as f64).sqrt()).collect())
            .collect();
        mean_recall(&found, &truth, 10)
    }

    /// The first `n` SIFT rows of the data folder and `q` of its queries.
    fn sift(n: usize, q: usize) -> (Vec<f32>, Vec<f32>, usize) {
        let dir = data_dir();
        let base = read_vectors(&dir.join("sift128_base.bvecs"), Some(n)).expect("the SIFT sample");
        let queries = read_vectors(&dir.join("sift128_query.fvecs"), Some(q)).expect("the SIFT queries");
        (base.data, queries.data, base.dim)
    }

    fn build_with_shards(base: &[f32], dim: usize, params: &BuildParams, max_rows: usize) -> (Graph, ShardStats) {
        let mut built = 0;
        let (g, stats) = build_sharded(
            base,
            dim,
            params,
            max_rows,
            &mut |rows: &[f32]| {
                built += 1;
                rnn_descent::build(rows, dim, params, &mut |_: usize, _: usize| true)
            },
            &mut |_, _| true,
        )
        .unwrap();
        assert_eq!(built, stats.shards);
        (g, stats)
    }

    #[test]
    fn sharded_recall_close_to_whole() {
        let n = 12_000;
        let (base, queries, dim) = sift(n, 200);
        let params = BuildParams::default();
        let whole = rnn_descent::build(&base, dim, &params, &mut |_: usize, _: usize| true).unwrap();
        let (sharded, stats) = build_with_shards(&base, dim, &params, n / 4);
        assert!(stats.shards >= 8 && stats.largest <= n / 4, "{stats:?}");
        assert!((stats.overlap - 2.0).abs() < 1e-9, "every row in two shards");
        assert!(crate::merge::reach(&sharded, sharded.entry.unwrap()).iter().all(|&r| r), "all reachable");
        for ef in [20, 40] {
            let rw = recall(&base, dim, whole.clone(), &queries, ef);
            let rs = recall(&base, dim, sharded.clone(), &queries, ef);
            eprintln!("recall@10 at ef {ef}: whole {rw:.4}, sharded {rs:.4} ({stats:?})");
            assert!(rs >= rw - 0.01, "ef {ef}: whole {rw}, sharded {rs}");
        }
    }

    #[test]
    fn a_cancel_stops_it() {
        let (base, _) = clustered(3000, 0, 8);
        let params = BuildParams::default();
        let r = build_sharded(
            &base,
            8,
            &params,
            1000,
            &mut |rows: &[f32]| rnn_descent::build(rows, 8, &params, &mut |_: usize, _: usize| true),
            &mut |done, _| done < 1,
        );
        assert!(r.is_none());
    }
}
