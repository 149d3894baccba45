//! How a sharded build splits its points (Tagore, "balanced partition"):
//! k-means on a sample, then every point in its two nearest clusters with
//! room, so that each shard fits one build and the shards overlap enough
//! for their graphs to join into one.

use rayon::prelude::*;

use crate::distance::l2sq;
use crate::random::SplitMix64;

/// The global ids of each shard, ascending.
#[derive(Clone, Debug, PartialEq)]
pub struct Partition {
    pub shards: Vec<Vec<u32>>,
}

/// Clusters ranked per point before the capped assignment falls back to a
/// scan of every cluster.
const RANKED: usize = 8;
/// Lloyd iterations on the sample.
const ITERATIONS: usize = 8;

/// Shards and their cap for `n` points when one build holds at most
/// `max_rows`: (1, n) when they fit at once; else every point goes to two
/// shards, which fill to 90% of `max_rows` on average (the rest is room for
/// the capped assignment).
pub fn plan(n: usize, max_rows: usize) -> (usize, usize) {
    assert!(max_rows >= 2, "a shard holds at least two points");
    if n <= max_rows {
        return (1, n);
    }
    let k = (2 * n).div_ceil(max_rows * 9 / 10).max(2);
    (k, max_rows)
}

/// `k` clusters of at most `cap` points each, every point in its two
/// nearest clusters with room (one when k is 1): centroids from Lloyd's
/// k-means on up to `sample` points, then points assigned in id order, so
/// the answer depends on `seed` alone, not on the threads.
pub fn partition(vectors: &[f32], dim: usize, k: usize, cap: usize, sample: usize, seed: u64) -> Partition {
    let n = vectors.len() / dim;
    if k == 1 {
        return Partition { shards: vec![(0..n as u32).collect()] };
    }
    let ids = sample_ids(n, sample, seed);
    let points: Vec<f32> =
        ids.iter().flat_map(|&i| &vectors[i as usize * dim..(i as usize + 1) * dim]).copied().collect();
    let mut assign = Assigner::new(kmeans(&points, dim, k, seed), dim, n, cap);
    assign.add(vectors);
    assign.finish()
}

/// The points k-means samples: every one when there are at most `sample`,
/// else about `sample` random ids without repeats (enough for centroids),
/// ascending.
pub fn sample_ids(n: usize, sample: usize, seed: u64) -> Vec<u32> {
    if n <= sample {
        return (0..n as u32).collect();
    }
    let mut rng = SplitMix64(seed ^ 0x7061_7274_6974_696f);
    let mut ids: Vec<u32> = (0..sample).map(|_| rng.below(n as u32)).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The capped assignment of points to their two nearest clusters with room,
/// fed in id order a batch at a time (all at once, or read back from the
/// index's pages when they do not fit in memory): each batch ranked on
/// every core, then assigned in order.
pub struct Assigner {
    centroids: Vec<f32>,
    dim: usize,
    k: usize,
    cap: usize,
    copies: usize,
    next: u32,
    shards: Vec<Vec<u32>>,
}

impl Assigner {
    /// For `n` points into the `centroids` (k × dim), each cluster holding
    /// at most `cap`.
    pub fn new(centroids: Vec<f32>, dim: usize, n: usize, cap: usize) -> Assigner {
        let k = centroids.len() / dim.max(1);
        let copies = k.min(2);
        assert!(k >= 1 && cap * k >= copies * n, "{k} clusters of {cap} cannot hold {n} points {copies} times each");
        let shards = vec![Vec::with_capacity(cap.min(copies * n)); k];
        Assigner { centroids, dim, k, cap, copies, next: 0, shards }
    }

    /// The next points (ids from the count added so far).
    pub fn add(&mut self, vectors: &[f32]) {
        let (dim, k, cap) = (self.dim, self.k, self.cap);
        let centroids = &self.centroids;
        let ranked: Vec<[u32; RANKED]> = vectors
            .par_chunks_exact(dim)
            .map(|v| {
                let mut d: Vec<(f32, u32)> =
                    centroids.chunks_exact(dim).enumerate().map(|(c, m)| (l2sq(v, m), c as u32)).collect();
                d.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                let mut r = [u32::MAX; RANKED];
                for (slot, &(_, c)) in r.iter_mut().zip(&d) {
                    *slot = c;
                }
                r
            })
            .collect();
        let shards = &mut self.shards;
        for (v, r) in vectors.chunks_exact(dim).zip(&ranked) {
            let p = self.next;
            self.next += 1;
            let mut first = None;
            for _ in 0..self.copies {
                let pick = r
                    .iter()
                    .copied()
                    .filter(|&c| c != u32::MAX)
                    .find(|&c| Some(c) != first && shards[c as usize].len() < cap)
                    .or_else(|| {
                        // all ranked ones full: the nearest cluster with room
                        (0..k as u32).filter(|&c| Some(c) != first && shards[c as usize].len() < cap).min_by(
                            |&a, &b| {
                                let da = l2sq(v, &centroids[a as usize * dim..(a as usize + 1) * dim]);
                                let db = l2sq(v, &centroids[b as usize * dim..(b as usize + 1) * dim]);
                                da.total_cmp(&db).then(a.cmp(&b))
                            },
                        )
                    })
                    .expect("the caps hold every point twice");
                shards[pick as usize].push(p);
                first = Some(pick);
            }
        }
    }

    pub fn finish(self) -> Partition {
        Partition { shards: self.shards }
    }
}

/// Lloyd's k-means over `points` (the sample); `k` × dim centroids.
pub fn kmeans(points: &[f32], dim: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64(seed ^ 0x6b6d_6561_6e73);
    let m = points.len() / dim;
    assert!(m > 0, "k-means needs a point");
    let mut centroids: Vec<f32> = (0..k)
        .flat_map(|_| {
            let p = rng.below(m as u32) as usize;
            points[p * dim..(p + 1) * dim].to_vec()
        })
        .collect();
    for _ in 0..ITERATIONS {
        let nearest: Vec<u32> = points
            .par_chunks_exact(dim)
            .map(|v| {
                centroids
                    .chunks_exact(dim)
                    .enumerate()
                    .map(|(c, m)| (l2sq(v, m), c as u32))
                    .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
                    .map(|(_, c)| c)
                    .unwrap_or(0)
            })
            .collect();
        // sums in f64, in point order: the same centroids on any thread count
        let mut sums = vec![0f64; k * dim];
        let mut counts = vec![0usize; k];
        for (p, &c) in nearest.iter().enumerate() {
            counts[c as usize] += 1;
            let s = &mut sums[c as usize * dim..(c as usize + 1) * dim];
            for (a, &x) in s.iter_mut().zip(&points[p * dim..(p + 1) * dim]) {
                *a += x as f64;
            }
        }
        for c in 0..k {
            let mc = &mut centroids[c * dim..(c + 1) * dim];
            if counts[c] == 0 {
                // an empty cluster restarts at a random sample point
                let p = rng.below(m as u32) as usize;
                mc.copy_from_slice(&points[p * dim..(p + 1) * dim]);
            } else {
                for (x, s) in mc.iter_mut().zip(&sums[c * dim..(c + 1) * dim]) {
                    *x = (s / counts[c] as f64) as f32;
                }
            }
        }
    }
    centroids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(n: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut rng = SplitMix64(seed);
        (0..n * dim).map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32).collect()
    }

    #[test]
    fn every_point_twice_within_the_caps_and_deterministic() {
        let (n, dim) = (5000, 8);
        let v = points(n, dim, 1);
        let (k, cap) = plan(n, 1500);
        assert!(k * cap >= 2 * n);
        let p = partition(&v, dim, k, cap, 2000, 7);
        assert_eq!(p.shards.len(), k);
        let mut seen = vec![0u8; n];
        for s in &p.shards {
            assert!(s.len() <= cap);
            assert!(s.windows(2).all(|w| w[0] < w[1]), "ascending, no repeats");
            for &i in s {
                seen[i as usize] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c == 2), "every point in exactly two shards");
        assert_eq!(p, partition(&v, dim, k, cap, 2000, 7));
    }

    #[test]
    fn plan_one_shard_when_it_fits() {
        assert_eq!(plan(100, 100), (1, 100));
        let (k, cap) = plan(1_000_000, 250_000);
        assert_eq!(cap, 250_000);
        assert!(k * cap >= 2_000_000 && k == 9);
        let p = partition(&points(300, 4, 2), 4, 1, 300, 100, 1);
        assert_eq!(p.shards, vec![(0..300).collect::<Vec<u32>>()]);
    }
}
