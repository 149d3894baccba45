//! RNN-Descent on the CPU (Ono & Matsui, "Relative NN-Descent"; Algorithms 1
//! and 2 as the GRNND paper restates them).
//!
//! Decisions the paper leaves open:
//! - Collect, then merge: an update writes only its own vertex's pool; the
//!   candidates it redirects (and, between outer rounds, the reverse edges)
//!   go to a per-task outbox, bucketed by target range, and are appended to
//!   their pools after the round, one target range at a time. The build is
//!   memory-bound (a random vector per candidate), and a lock per redirect,
//!   as in the authors' code, cost a cache miss each, a third of the time;
//!   merging per range keeps the range's pools in cache, needs no lock, and
//!   makes the graph a pure function of (vectors, params), whatever the
//!   thread count. A redirect waits for the next round even when its target
//!   comes later in this one (Jacobi rather than Gauss–Seidel order).
//! - Each entry stores (distance, id, new): a distance is computed once, when
//!   the pair is first met; a redirect carries the distance just computed.
//! - New/old flags: after an update every kept entry is old, so two old
//!   entries of one pool were already tested against each other and the pair
//!   is skipped (Ono & Matsui's optimisation). A redirected or reverse entry
//!   arrives new. Reverse edges leave the forward entries' flags as they are
//!   (the reference marks them all new again, re-testing pairs already known
//!   to pass).
//! - Candidates are scanned in ascending order (Algorithm 2 as printed), or
//!   in a fresh random order each round ([`ScanOrder::Random`], GRNND's
//!   disordered propagation, the GPU's default). One scan serves both: the
//!   farther of an occluding pair (by distance, ties by id) leaves the pool
//!   and is offered to the nearer one, which in a random order can remove
//!   an already accepted candidate (GRNND's Alg. 4 line 8); in ascending
//!   order the farther is always the candidate, and this is Algorithm 2.
//! - The prune test is [`crate::prune::occludes`], the one rule of the
//!   engine (`<=`, with its exception for copies of the vertex itself).

use rayon::prelude::*;

use crate::distance::prefetch;
use crate::graph::{final_cut, Graph};
use crate::medoid::medoid;
use crate::metric::graph_distance;
use crate::params::{BuildParams, ScanOrder};
use crate::prune::occludes;
use crate::random::{mix64, SplitMix64};
use crate::NO_NODE;

/// Called on the calling thread between update rounds: `done` of `total`
/// rounds. Returning `false` stops the build (query cancel); `build` then
/// returns `None`.
pub trait Progress {
    fn round(&mut self, done: usize, total: usize) -> bool;
}

impl<F: FnMut(usize, usize) -> bool> Progress for F {
    fn round(&mut self, done: usize, total: usize) -> bool {
        self(done, total)
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    dist: f32,
    id: u32,
    new: bool,
}

/// Sorts a pool by ascending distance, ties by id, and removes repeated ids;
/// a repeated id stays old if any copy is old (its pairs with the other old
/// entries are known). Distances are squares, never negative, so their bits
/// order as the values do and one u64 key sorts by (distance, id).
fn sort_dedupe(pool: &mut Vec<Entry>) {
    pool.sort_unstable_by_key(|e| ((e.dist.to_bits() as u64) << 32) | e.id as u64);
    pool.dedup_by(|later, kept| {
        let same = later.id == kept.id;
        if same {
            kept.new &= later.new;
        }
        same
    });
}

/// How many candidates ahead of the scan their vectors are prefetched.
const PREFETCH_AHEAD: usize = 2;

/// Entries for other vertices' pools, produced by one task of a round.
struct Outbox {
    /// `buckets[t / range]` holds (t, entry) pairs
    buckets: Vec<Vec<(u32, Entry)>>,
    range: usize,
}

impl Outbox {
    fn new(n: usize, range: usize) -> Outbox {
        Outbox { buckets: (0..n.div_ceil(range)).map(|_| Vec::new()).collect(), range }
    }
    #[inline]
    fn push(&mut self, target: u32, e: Entry) {
        self.buckets[target as usize / self.range].push((target, e));
    }
}

/// Target range of one merge step: its pools (about 40 entries of 12 bytes
/// each) should stay in a core's L2 while the range's entries land.
fn merge_range(n: usize) -> usize {
    (n.div_ceil(256)).clamp(1024, 8192)
}

/// Appends every outbox entry to its pool; ranges in parallel, so no two
/// threads touch one pool. Outboxes come in vertex order, so the result
/// does not depend on how rayon split the round.
fn merge(pools: &mut [Vec<Entry>], outboxes: Vec<Outbox>, range: usize) {
    pools.par_chunks_mut(range).enumerate().for_each(|(b, chunk)| {
        let base = b * range;
        for ob in &outboxes {
            for &(t, e) in &ob.buckets[b] {
                chunk[t as usize - base].push(e);
            }
        }
    });
}

struct Builder<'a> {
    vectors: &'a [f32],
    dim: usize,
    range: usize,
}

impl Builder<'_> {
    #[inline]
    fn row(&self, i: u32) -> &[f32] {
        &self.vectors[i as usize * self.dim..(i as usize + 1) * self.dim]
    }
    #[inline]
    fn dist(&self, a: u32, b: u32) -> f32 {
        graph_distance(self.row(a), self.row(b))
    }

    /// S distinct random neighbours per vertex, from a generator seeded by
    /// (seed, vertex) so the start does not depend on threads.
    fn init(&self, pools: &mut [Vec<Entry>], s: usize, seed: u64) {
        let n = pools.len() as u32;
        pools.par_iter_mut().enumerate().for_each(|(v, pool)| {
            let v = v as u32;
            let mut rng = SplitMix64(seed ^ (v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            if (n as usize) <= s + 1 {
                pool.extend((0..n).filter(|&u| u != v).map(|u| Entry { dist: self.dist(v, u), id: u, new: true }));
                return;
            }
            while pool.len() < s {
                let u = rng.below(n);
                if u != v && !pool.iter().any(|e| e.id == u) {
                    pool.push(Entry { dist: self.dist(v, u), id: u, new: true });
                }
            }
        });
    }

    /// Runs `f(vertex, pool, outbox)` over all pools in parallel and returns
    /// the outboxes in vertex order.
    fn round<F>(&self, pools: &mut [Vec<Entry>], f: F) -> Vec<Outbox>
    where
        F: Fn(u32, &mut Vec<Entry>, &mut Outbox, &mut Vec<Entry>) + Sync,
    {
        let n = pools.len();
        pools
            .par_iter_mut()
            .enumerate()
            .with_min_len(256)
            .fold(
                || (Outbox::new(n, self.range), Vec::new()),
                |(mut ob, mut scratch), (v, pool)| {
                    f(v as u32, pool, &mut ob, &mut scratch);
                    (ob, scratch)
                },
            )
            .map(|(ob, _)| ob)
            .collect()
    }

    /// Algorithm 2 for one vertex `v`, its pool scanned in ascending order,
    /// or in the random order of `round_key` when given: its `pool` becomes
    /// the kept candidates, the pruned ones go to the outbox of the nearer
    /// one of the pair that pruned them.
    fn update(
        &self,
        v: u32,
        round_key: Option<u64>,
        pool: &mut Vec<Entry>,
        r: usize,
        out: &mut Outbox,
        kept: &mut Vec<Entry>,
    ) {
        // nothing arrived since the last update: the pool is that update's
        // kept list, every pair tested; a converged vertex costs nothing
        if !pool.iter().any(|e| e.new) {
            return;
        }
        sort_dedupe(pool);
        pool.truncate(r);
        if let Some(key) = round_key {
            // a key per (round, vertex, id), as the GPU's; ids are distinct here
            let vk = key ^ ((v as u64) << 31);
            pool.sort_unstable_by_key(|e| ((mix64(vk ^ e.id as u64) as u32 as u64) << 32) | e.id as u64);
        }
        kept.clear();
        // an old candidate before the first new one meets only old kept
        // entries: no distance, so no vector to load
        let first_new = pool.iter().position(|e| e.new).unwrap_or(pool.len());
        for c in pool.iter().skip(first_new).take(PREFETCH_AHEAD) {
            prefetch(self.row(c.id));
        }
        for (i, &c) in pool.iter().enumerate() {
            if i + PREFETCH_AHEAD >= first_new {
                if let Some(p) = pool.get(i + PREFETCH_AHEAD) {
                    prefetch(self.row(p.id));
                }
            }
            let mut alive = true;
            for k in kept.iter_mut() {
                if k.dist < 0.0 || (!c.new && !k.new) {
                    continue;
                }
                let c_nearer = (c.dist, c.id) < (k.dist, k.id);
                let (near, far) = if c_nearer { (c.dist, k.dist) } else { (k.dist, c.dist) };
                let mut between = 0.0;
                if occludes(near, far, || {
                    between = self.dist(c.id, k.id);
                    between
                }) {
                    if c_nearer {
                        // an accepted one leaves (only in a random order)
                        out.push(c.id, Entry { dist: between, id: k.id, new: true });
                        k.dist = REMOVED;
                    } else {
                        out.push(k.id, Entry { dist: between, id: c.id, new: true });
                        alive = false;
                        break;
                    }
                }
            }
            if alive {
                // keep the flag through this scan: a later old candidate must
                // still be tested against a kept entry that was new
                kept.push(c);
            }
        }
        pool.clear();
        // every pair among the kept entries has now been tested
        pool.extend(kept.iter().filter(|e| e.dist != REMOVED).map(|&e| Entry { new: false, ..e }));
    }
}

/// The distance of an accepted candidate that a later, nearer one removed
/// (distances are squares, never negative).
const REMOVED: f32 = -1.0;

/// Builds the graph over `vectors` (n × stored_dim stored vectors, squared L2),
/// on all rayon threads. Lists are sorted by distance, cut to `params.degree`
/// and padded with NO_NODE; `entry` is the medoid.
pub fn build(vectors: &[f32], stored_dim: usize, params: &BuildParams, progress: &mut dyn Progress) -> Option<Graph> {
    build_in(vectors, stored_dim, params, ScanOrder::Ascending, progress)
}

/// [`build`] with the pools scanned in `order`.
pub fn build_in(
    vectors: &[f32],
    stored_dim: usize,
    params: &BuildParams,
    order: ScanOrder,
    progress: &mut dyn Progress,
) -> Option<Graph> {
    let n = vectors.len().checked_div(stored_dim).unwrap_or(0);
    assert!(n < NO_NODE as usize, "node ids are u32");
    let b = Builder { vectors, dim: stored_dim, range: merge_range(n) };
    let mut pools: Vec<Vec<Entry>> = (0..n).map(|_| Vec::new()).collect();
    b.init(&mut pools, params.s.max(1), params.seed);
    rounds(&b, pools, params, order, progress)
}

/// `t1` outer rounds of `t2` updates each, reverse offers between outer
/// rounds, then the final cut.
fn rounds(
    b: &Builder,
    mut pools: Vec<Vec<Entry>>,
    params: &BuildParams,
    order: ScanOrder,
    progress: &mut dyn Progress,
) -> Option<Graph> {
    let (t1, t2) = (params.t1, params.t2);
    let degree = params.degree;
    let n = pools.len();
    // a pool never needs to hold fewer than the final degree
    let r = params.r.max(degree);
    let total = t1 * t2;
    let mut done = 0;
    for outer in 0..t1 {
        for _ in 0..t2 {
            // a fresh order each round (the GPU's key: kernels/rnn_descent.cu)
            let key = (order == ScanOrder::Random)
                .then(|| mix64(params.seed ^ ((done as u64) << 40) ^ 0x6a09_e667_f3bc_c909));
            let out = b.round(&mut pools, |v, pool, ob, kept| b.update(v, key, pool, r, ob, kept));
            merge(&mut pools, out, b.range);
            done += 1;
            if !progress.round(done, total) {
                return None;
            }
        }
        if outer + 1 < t1 {
            // each vertex offers itself to the nearest ceil(rho·len) entries
            // of its pool (as the pools stood before any offer landed)
            let rho = params.rho as f64;
            let out = b.round(&mut pools, |v, pool, ob, _| {
                sort_dedupe(pool);
                pool.truncate(r);
                let take = ((rho * pool.len() as f64).ceil() as usize).min(pool.len());
                for e in &pool[..take] {
                    ob.push(e.id, Entry { dist: e.dist, id: v, new: true });
                }
            });
            merge(&mut pools, out, b.range);
        }
    }

    // the final cut: a pool holds its kept entries plus the redirects of the
    // last round
    let mut adjacency = vec![NO_NODE; n * degree];
    if degree > 0 {
        adjacency
            .par_chunks_mut(degree)
            .zip(pools.par_iter())
            .enumerate()
            .for_each_init(Vec::new, |scratch, (v, (out, pool))| {
                final_cut(v as u32, pool.iter().map(|e| (e.dist, e.id)), scratch, out)
            });
    }
    Some(Graph { degree, adjacency, entry: medoid(b.vectors, b.dim) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never_cancel() -> impl FnMut(usize, usize) -> bool {
        |_, _| true
    }

    #[test]
    fn tiny_inputs() {
        let p = BuildParams::default();
        let g = build(&[], 3, &p, &mut never_cancel()).unwrap();
        assert!(g.is_empty() && g.entry.is_none());
        let g = build(&[1.0, 2.0], 2, &p, &mut never_cancel()).unwrap();
        assert_eq!((g.len(), g.entry, g.neighbors(0).count()), (1, Some(0), 0));
        let g = build(&[0.0, 1.0, 3.0], 1, &p, &mut never_cancel()).unwrap();
        assert_eq!(g.neighbors(0).collect::<Vec<_>>(), vec![1]);
        assert_eq!(g.neighbors(1).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(g.entry, Some(1));
    }

    #[test]
    fn grid_lists_sorted_deterministic_cancellable() {
        // a 20×20 grid with a little jitter: every list sorted, no self loops,
        // in both scan orders
        let mut rng = SplitMix64(1);
        let v: Vec<f32> = (0..400)
            .flat_map(|i| [(i % 20) as f32, (i / 20) as f32])
            .map(|x| x + (rng.below(1000) as f32) * 1e-4)
            .collect();
        let p = BuildParams { degree: 8, ..BuildParams::default() };
        let mut graphs = Vec::new();
        for order in [ScanOrder::Ascending, ScanOrder::Random] {
            let g = build_in(&v, 2, &p, order, &mut never_cancel()).unwrap();
            let mut far = 0;
            for u in 0..400u32 {
                let l: Vec<u32> = g.neighbors(u).collect();
                assert!(!l.is_empty() && l.len() <= 8 && !l.contains(&u));
                let d: Vec<f32> =
                    l.iter().map(|&x| graph_distance(&v[u as usize * 2..][..2], &v[x as usize * 2..][..2])).collect();
                assert!(d.windows(2).all(|w| w[0] <= w[1]), "{order:?} node {u}: {d:?}");
                // on a grid the nearest point is one step away; the descent is
                // approximate, so allow a few nodes that never met theirs
                if d[0] > 1.1 {
                    far += 1;
                }
            }
            assert!(far <= 8, "{order:?}: {far} of 400 nodes miss their nearest neighbour");
            // the same graph whatever the thread count
            let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
            let g1 = one.install(|| build_in(&v, 2, &p, order, &mut never_cancel()).unwrap());
            assert_eq!((&g1.adjacency, g1.entry), (&g.adjacency, g.entry), "{order:?}");
            let mut calls = 0;
            let mut stop_at_3 = |done: usize, total: usize| {
                assert_eq!(total, p.t1 * p.t2);
                calls += 1;
                done < 3
            };
            assert!(build_in(&v, 2, &p, order, &mut stop_at_3).is_none());
            assert_eq!(calls, 3);
            graphs.push(g.adjacency);
        }
        // the orders are two schedules, not one
        assert_ne!(graphs[0], graphs[1]);
    }
}
