//! The one pruning rule of gpu_graph (RNN-Descent's Algorithm 2 / the RNG
//! rule), shared by the final cut of every builder, insert and repair.

use crate::metric::graph_distance;

/// Keeps candidates in ascending distance order; a candidate `c` is dropped
/// when an already kept `k` has `graph_distance(c, k) <= c.dist` (Algorithm 2
/// prunes on `<=`, which also drops exact duplicates). Stops at `degree` kept.
///
/// One exception: a kept `k` at distance 0 (an exact copy of the node itself)
/// prunes nothing but further copies. Under the plain rule it would occlude
/// every other candidate (`d(c, k) = d(c, node) = c.dist`), leaving a node
/// that has a duplicate with a single edge, to that duplicate: two copies of
/// one vector would form an island, fatal when one of them is the entry point.
///
/// `cands`: (id, distance to the node), sorted ascending, no duplicates, the
/// node itself absent. `vectors`: the stored vectors of `cands`, in the same
/// order, `stored_dim` floats each. Returns the kept (id, distance), ascending.
pub fn rng_prune(cands: &[(u32, f32)], vectors: &[f32], stored_dim: usize, degree: usize) -> Vec<(u32, f32)> {
    debug_assert_eq!(vectors.len(), cands.len() * stored_dim);
    let row = |i: usize| &vectors[i * stored_dim..(i + 1) * stored_dim];
    // indices into `cands` of the kept ones
    let mut kept: Vec<usize> = Vec::with_capacity(degree);
    for (i, &(_, dist)) in cands.iter().enumerate() {
        if kept.len() >= degree {
            break;
        }
        let occluded = kept.iter().any(|&k| occludes(cands[k].1, dist, || graph_distance(row(i), row(k))));
        if !occluded {
            kept.push(i);
        }
    }
    kept.into_iter().map(|k| cands[k]).collect()
}

/// Whether a kept neighbour at distance `kept_dist` from the node occludes a
/// candidate at `cand_dist`, `between` being their distance to each other
/// (computed only when needed). The rule of [`rng_prune`], exception
/// included; RNN-Descent's update applies the same test.
#[inline]
pub fn occludes(kept_dist: f32, cand_dist: f32, between: impl FnOnce() -> f32) -> bool {
    if kept_dist == 0.0 && cand_dist > 0.0 {
        return false;
    }
    between() <= cand_dist
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Candidates of the node at the origin, sorted by squared distance.
    pub(crate) fn cands(points: &[(u32, [f32; 2])]) -> (Vec<(u32, f32)>, Vec<f32>) {
        let mut c: Vec<(u32, f32, [f32; 2])> =
            points.iter().map(|&(id, p)| (id, p[0] * p[0] + p[1] * p[1], p)).collect();
        c.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        (c.iter().map(|x| (x.0, x.1)).collect(), c.iter().flat_map(|x| x.2).collect())
    }

    #[test]
    fn keeps_directions_drops_occluded() {
        // 1 and 2 lie on the +x axis: 2 is nearer to 1 than to the origin.
        // 3 on the +y axis is nearer to the origin than to 1. 4 on -x is kept.
        let (c, v) = cands(&[(1, [1.0, 0.0]), (2, [2.0, 0.0]), (3, [0.0, 1.5]), (4, [-3.0, 0.0])]);
        let kept = rng_prune(&c, &v, 2, 8);
        assert_eq!(kept.iter().map(|k| k.0).collect::<Vec<_>>(), vec![1, 3, 4]);
        assert_eq!(kept[0].1, 1.0);
    }

    #[test]
    fn ties_prune() {
        // d(2, origin) = 2, d(2, 1) = 1 <= 2: dropped
        let (c, v) = cands(&[(1, [1.0, 0.0]), (2, [1.0, 1.0])]);
        assert_eq!(rng_prune(&c, &v, 2, 8).len(), 1);
        // an exact tie: d(2, origin) = 5 = d(2, 1) (squared): `<=` drops it
        let (c, v) = cands(&[(1, [2.0, 0.0]), (2, [1.0, 2.0])]);
        assert_eq!(graph_distance(&v[2..4], &v[0..2]), c[1].1);
        assert_eq!(rng_prune(&c, &v, 2, 8).len(), 1);
        // d(2, origin) = 1, d(2, 1) = 2 > 1: kept
        let (c, v) = cands(&[(1, [1.0, 0.0]), (2, [0.0, 1.0])]);
        assert_eq!(rng_prune(&c, &v, 2, 8).len(), 2);
    }

    #[test]
    fn duplicate_candidates_keep_one() {
        let (c, v) = cands(&[(7, [1.0, 1.0]), (3, [1.0, 1.0]), (5, [-1.0, 0.0])]);
        let kept: Vec<u32> = rng_prune(&c, &v, 2, 8).iter().map(|k| k.0).collect();
        assert_eq!(kept, vec![5, 3]); // 5 is nearer; of the copies the lower id comes first
    }

    #[test]
    fn copy_of_the_node_does_not_isolate_it() {
        // 9 and 8 sit on the node itself; 1 and 2 in opposite directions
        let (c, v) = cands(&[(9, [0.0, 0.0]), (8, [0.0, 0.0]), (1, [1.0, 0.0]), (2, [-1.0, 0.0])]);
        let kept: Vec<u32> = rng_prune(&c, &v, 2, 8).iter().map(|k| k.0).collect();
        assert_eq!(kept, vec![8, 1, 2]); // one copy, then the real neighbours
    }

    #[test]
    fn stops_at_degree() {
        // a pentagon with growing radii: each pair is farther apart than the
        // nearer of the two is from the origin, so the rule keeps all five
        let pts: Vec<(u32, [f32; 2])> = (0..5)
            .map(|i| {
                let (a, r) = (i as f32 * std::f32::consts::TAU / 5.0, 1.0 + i as f32 * 0.01);
                (i, [a.cos() * r, a.sin() * r])
            })
            .collect();
        let (c, v) = cands(&pts);
        assert_eq!(rng_prune(&c, &v, 2, 8).len(), 5);
        let kept = rng_prune(&c, &v, 2, 3);
        assert_eq!(kept.iter().map(|k| k.0).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert!(rng_prune(&[], &[], 2, 3).is_empty());
    }
}
