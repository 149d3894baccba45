//! What a GPU graph build should cost, whole or in shards, before it starts
//! (CMANNS sizes its shards from such a model; the NOTICE of a sharded
//! CREATE INDEX prints it). The constants are fitted to an NVIDIA H200's
//! measurements (docs/benchmarks.md, "Sharded builds" and "CREATE INDEX at
//! scale"): GRNND's time grows with rows × (a fixed part + dimensions) and a
//! little faster than the rows (more of the pools miss the caches), a shard
//! adds a setup that grows with its bytes, and the host's partition and
//! merge grow with rows and dimensions. Fitted on 1-10M rows: beyond that
//! it extrapolates.

/// Seconds a million rows take GRNND, fixed part and per dimension.
const GRAPH_S_PER_MROW: f64 = 0.068;
const GRAPH_S_PER_MROW_DIM: f64 = 0.002_83;
/// How much slower a row gets per decade of rows beyond a million.
const GRAPH_GROWTH: f64 = 0.68;
/// Each shard's setup: a fixed part, and per byte of its vectors (gathered
/// on the host, copied to the device from pageable memory).
const SHARD_SETUP_S: f64 = 0.05;
const SHARD_SETUP_S_PER_BYTE: f64 = 0.53e-9;
/// The merge: seconds a million rows, fixed part and per dimension, and its
/// growth per decade of rows (random reads of the vectors).
const MERGE_S_PER_MROW: f64 = 0.77;
const MERGE_S_PER_MROW_DIM: f64 = 0.002_6;
const MERGE_GROWTH: f64 = 0.42;
/// The partition: a fixed part, and per million rows × cluster × dim^1.5
/// (the assignment's distances, slower per coordinate as rows get wider).
const PARTITION_S: f64 = 0.1;
const PARTITION_S_PER_UNIT: f64 = 4.5e-6;

/// A build streamed from the index's pages (a paged build one GPU holds
/// whole): opening the device after the scan, and per byte of f32 vectors
/// read back from the pages and copied in a piece at a time (the first
/// pass; the entry point's second one overlaps the rounds). Fitted on an
/// H100: 1M x 128 and 20M x 96.
const STREAM_SETUP_S: f64 = 0.45;
const STREAM_S_PER_BYTE: f64 = 0.32e-9;

/// The expected seconds of a build's graph phases.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub partition_s: f64,
    /// every shard's build, on `gpus` devices at once
    pub shards_s: f64,
    pub merge_s: f64,
}

impl Estimate {
    pub fn total_s(&self) -> f64 {
        self.partition_s + self.shards_s + self.merge_s
    }
}

/// GRNND on `n` rows of `dim` floats, whole, on one device.
pub fn graph_seconds(n: usize, dim: usize) -> f64 {
    let m = n as f64 / 1e6;
    let growth = 1.0 + GRAPH_GROWTH * m.max(1e-3).log10().max(-0.9);
    m * (GRAPH_S_PER_MROW + GRAPH_S_PER_MROW_DIM * dim as f64) * growth.max(0.1)
}

/// GRNND on `n` rows of `dim` floats streamed from the index's pages.
pub fn streamed_seconds(n: usize, dim: usize) -> f64 {
    graph_seconds(n, dim) + STREAM_SETUP_S + STREAM_S_PER_BYTE * (n * dim * 4) as f64
}

/// A build of `n` rows of `dim` in `shard_rows` (each row in `copies`
/// shards; 1 shard: the whole build, no partition or merge) on `gpus`
/// devices sharing the shards.
pub fn estimate(n: usize, dim: usize, shards: usize, shard_rows: &[usize], gpus: usize) -> Estimate {
    if shards <= 1 {
        return Estimate { partition_s: 0.0, shards_s: graph_seconds(n, dim), merge_s: 0.0 };
    }
    let m = n as f64 / 1e6;
    let each: Vec<f64> = shard_rows
        .iter()
        .map(|&r| graph_seconds(r, dim) + SHARD_SETUP_S + SHARD_SETUP_S_PER_BYTE * (r * dim * 4) as f64)
        .collect();
    // shards go to the devices in turn; the slowest device sets the time
    let gpus = gpus.max(1);
    let shards_s = (0..gpus).map(|g| each.iter().skip(g).step_by(gpus).sum::<f64>()).fold(0.0, f64::max);
    let d = dim as f64;
    Estimate {
        partition_s: PARTITION_S + PARTITION_S_PER_UNIT * m * shards as f64 * d.powf(1.5),
        shards_s,
        merge_s: m * (MERGE_S_PER_MROW + MERGE_S_PER_MROW_DIM * d) * (1.0 + MERGE_GROWTH * m.max(1.0).log10()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within(predicted: f64, measured: f64, share: f64) -> bool {
        (predicted - measured).abs() <= share * measured
    }

    /// The model against every H200 build it was fitted to (graph
    /// construction as the NOTICE gives it), each within 30%.
    #[test]
    fn reproduces_the_h200_measurements() {
        for (n, dim, measured) in [
            (1_000_000, 128, 0.43),
            (1_000_000, 768, 2.24),
            (10_000_000, 96, 5.70),
            (3_000_000, 768, 7.63),
            (2_000_000, 128, 1.01),
        ] {
            let p = graph_seconds(n, dim);
            assert!(within(p, measured, 0.3), "{n} x {dim}: predicted {p:.2} s, measured {measured} s");
        }
        // sharded: rows, dim, shards, the average shard, graph construction
        for (n, dim, k, measured) in [
            (1_000_000, 128, 9, 2.72),
            (10_000_000, 96, 9, 28.2),
            (2_000_000, 128, 7, 6.26),
            (1_000_000, 768, 7, 10.49),
        ] {
            let e = estimate(n, dim, k, &vec![2 * n / k; k], 1);
            assert!(within(e.total_s(), measured, 0.3), "{n} x {dim}: {e:?} against {measured} s");
        }
    }

    /// Paged builds streamed to one GPU (H100): graph construction as
    /// CREATE INDEX's report gives it.
    #[test]
    fn reproduces_the_streamed_builds() {
        for (n, dim, measured) in [(1_000_000, 128, 1.03), (20_000_000, 96, 15.74)] {
            let p = streamed_seconds(n, dim);
            assert!(within(p, measured, 0.3), "{n} x {dim}: predicted {p:.2} s, measured {measured} s");
        }
    }

    #[test]
    fn more_devices_share_the_shards() {
        let one = estimate(10_000_000, 96, 8, &[2_500_000; 8], 1);
        let eight = estimate(10_000_000, 96, 8, &[2_500_000; 8], 8);
        assert!((one.shards_s / eight.shards_s - 8.0).abs() < 1e-9);
        assert_eq!(one.merge_s, eight.merge_s);
        assert_eq!(estimate(1000, 4, 1, &[], 1).merge_s, 0.0);
    }
}
