//! The filters of Collect-Filter-Store (Tagore's GNN-Descent paper, §CFS;
//! TSDG's first stage): which of a node's candidates become its neighbours.
//! Every filter reads candidates in ascending distance (ties by id) with
//! their stored vectors, as [`crate::prune::rng_prune`] does, and returns
//! the kept (id, distance) in ascending distance. Distances are squared L2
//! between stored vectors (the graph distance); where a filter's factor
//! applies to true distances (Vamana's and TSDG's alpha) it is squared here.

use crate::metric::graph_distance;
use crate::prune::{occludes, rng_prune};

/// A graph's neighbour filter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Filter {
    /// RNN-Descent's rule: `c` dropped when a kept `k` has d(c, k) <= d(v, c)
    Rng,
    /// NSG's MRNG rule: dropped when d(c, k) < d(v, c) (strict)
    Nsg,
    /// Vamana's RobustPrune: dropped when alpha · d(c, k) <= d(v, c)
    Vamana { alpha: f32 },
    /// CAGRA's rank-based pruning: candidates ordered by how many nearer
    /// candidates offer a detour (k with d(v, k) < d(v, c) and
    /// d(k, c) < d(v, c)), then by rank; the first `degree` kept
    Cagra,
    /// TSDG's second stage, an order more than a filter: the candidates by
    /// (lambda, distance), lambda being the detours CAGRA counts; those
    /// with more than `max_lambda` dropped (see [`tsdg_order`])
    TsdgOrder { max_lambda: usize },
}

impl Filter {
    /// The factor on the candidate-to-kept distance in Vamana's test: alpha
    /// squared (distances are squared); 1 for the others. The GPU's filter
    /// takes it from here.
    pub fn factor(self) -> f32 {
        match self {
            Filter::Vamana { alpha } => alpha * alpha,
            _ => 1.0,
        }
    }

    /// The kept candidates, at most `degree`, in ascending distance (TSDG's
    /// order: in its order). `cands`: (id, squared distance to the node),
    /// ascending, distinct, the node absent; `vectors` their stored vectors
    /// in that order.
    pub fn apply(self, cands: &[(u32, f32)], vectors: &[f32], dim: usize, degree: usize) -> Vec<(u32, f32)> {
        let row = |i: usize| &vectors[i * dim..(i + 1) * dim];
        match self {
            Filter::Rng => rng_prune(cands, vectors, dim, degree),
            Filter::Nsg => greedy(cands, degree, |k, i| {
                let (kd, cd) = (cands[k].1, cands[i].1);
                // the duplicate exception of the RNG rule, with a strict test
                (kd != 0.0 || cd == 0.0) && graph_distance(row(i), row(k)) < cd
            }),
            Filter::Vamana { .. } => {
                let a2 = self.factor();
                greedy(cands, degree, |k, i| occludes(cands[k].1, cands[i].1, || a2 * graph_distance(row(i), row(k))))
            }
            Filter::Cagra => {
                let detours = detours(cands, vectors, dim);
                let mut order: Vec<usize> = (0..cands.len()).collect();
                order.sort_by_key(|&i| (detours[i], i));
                order.truncate(degree);
                order.sort_unstable();
                order.into_iter().map(|i| cands[i]).collect()
            }
            Filter::TsdgOrder { max_lambda } => {
                let mut kept = tsdg_order(cands, vectors, dim, max_lambda);
                kept.truncate(degree);
                kept
            }
        }
    }
}

/// Keeps candidates in order unless `occluded(k, i)` for an already kept
/// `k`; stops at `degree` kept.
fn greedy(cands: &[(u32, f32)], degree: usize, occluded: impl Fn(usize, usize) -> bool) -> Vec<(u32, f32)> {
    let mut kept: Vec<usize> = Vec::with_capacity(degree);
    for i in 0..cands.len() {
        if kept.len() >= degree {
            break;
        }
        if !kept.iter().any(|&k| occluded(k, i)) {
            kept.push(i);
        }
    }
    kept.into_iter().map(|k| cands[k]).collect()
}

/// For each candidate `i` (ascending, `vectors` theirs), how many nearer
/// ones `k` offer a detour: d(v, k) < d(v, i) and d(k, i) < d(v, i). CAGRA's
/// rank and TSDG's lambda.
fn detours(cands: &[(u32, f32)], vectors: &[f32], dim: usize) -> Vec<usize> {
    let row = |i: usize| &vectors[i * dim..(i + 1) * dim];
    (0..cands.len())
        .map(|i| {
            let cd = cands[i].1;
            (0..i).filter(|&k| cands[k].1 < cd && graph_distance(row(i), row(k)) < cd).count()
        })
        .collect()
}

/// Whether node list `ids` is in `order` (`own`: the node's stored vector,
/// `row`: any node's): sorted by distance and ordered again it comes back
/// unchanged. Exact where the order drops no edge (TSDG's lambda at least
/// the list's length); how the tests check a TSDG graph's lists.
pub fn in_order(order: Filter, own: &[f32], ids: &[u32], row: &dyn Fn(u32) -> Vec<f32>) -> bool {
    let rows: Vec<Vec<f32>> = ids.iter().map(|&u| row(u)).collect();
    let mut at: Vec<usize> = (0..ids.len()).collect();
    let dist: Vec<f32> = rows.iter().map(|r| graph_distance(own, r)).collect();
    at.sort_unstable_by(|&a, &b| dist[a].total_cmp(&dist[b]).then(ids[a].cmp(&ids[b])));
    let cands: Vec<(u32, f32)> = at.iter().map(|&i| (ids[i], dist[i])).collect();
    let vectors: Vec<f32> = at.iter().flat_map(|&i| rows[i].iter().copied()).collect();
    let again = order.apply(&cands, &vectors, own.len(), ids.len());
    again.iter().map(|c| c.0).eq(ids.iter().copied())
}

/// TSDG's second stage on one list (ascending distance, `vectors` its
/// stored vectors): each edge's lambda, how many other edges of the list
/// occlude it at alpha 1 (a nearer neighbour k with d(k, c) < d(v, c));
/// returns the list ordered by (lambda, distance) without the edges whose
/// lambda exceeds `max_lambda`, so that a prefix is itself a good list.
pub fn tsdg_order(list: &[(u32, f32)], vectors: &[f32], dim: usize, max_lambda: usize) -> Vec<(u32, f32)> {
    let mut keyed: Vec<(usize, usize)> = detours(list, vectors, dim)
        .into_iter()
        .enumerate()
        .map(|(i, lambda)| (lambda, i))
        .filter(|&(lambda, _)| lambda <= max_lambda)
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, i)| list[i]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prune::tests::cands;

    fn ids(kept: &[(u32, f32)]) -> Vec<u32> {
        kept.iter().map(|k| k.0).collect()
    }

    #[test]
    fn nsg_is_strict_where_rng_is_not() {
        // d(2, origin)^2 = 5 = d(2, 1)^2: an exact tie, dropped by the RNG
        // rule (<=), kept by NSG's (<)
        let (c, v) = cands(&[(1, [2.0, 0.0]), (2, [1.0, 2.0])]);
        assert_eq!(ids(&Filter::Rng.apply(&c, &v, 2, 8)), vec![1]);
        assert_eq!(ids(&Filter::Nsg.apply(&c, &v, 2, 8)), vec![1, 2]);
    }

    #[test]
    fn vamana_alpha_keeps_more() {
        // 2 at (2, 1): d(v,2)^2 = 5, d(1,2)^2 = 2. Occluded at alpha 1
        // (2 <= 5) and alpha 1.5 (4.5 <= 5); kept at alpha 1.6 (5.12 > 5)
        let (c, v) = cands(&[(1, [1.0, 0.0]), (2, [2.0, 1.0])]);
        assert_eq!(ids(&Filter::Vamana { alpha: 1.0 }.apply(&c, &v, 2, 8)), vec![1]);
        assert_eq!(ids(&Filter::Vamana { alpha: 1.5 }.apply(&c, &v, 2, 8)), vec![1]);
        assert_eq!(ids(&Filter::Vamana { alpha: 1.6 }.apply(&c, &v, 2, 8)), vec![1, 2]);
        // at alpha 1 it is the RNG rule
        assert_eq!(Filter::Vamana { alpha: 1.0 }.apply(&c, &v, 2, 8), Filter::Rng.apply(&c, &v, 2, 8));
    }

    #[test]
    fn cagra_ranks_by_detours_and_fills_the_degree() {
        // 1 (no detour), 2 behind 1 (one detour), 3 on the other side (none),
        // 4 behind 1 and 2 (two). Degree 3: 1, 3, then 2 (fewest detours),
        // returned in distance order; degree 8 keeps all four
        let (c, v) = cands(&[(1, [1.0, 0.0]), (2, [2.0, 0.0]), (3, [0.0, -2.5]), (4, [3.0, 0.0])]);
        assert_eq!(ids(&Filter::Cagra.apply(&c, &v, 2, 3)), vec![1, 2, 3]);
        assert_eq!(ids(&Filter::Cagra.apply(&c, &v, 2, 2)), vec![1, 3]);
        assert_eq!(Filter::Cagra.apply(&c, &v, 2, 8).len(), 4);
    }

    #[test]
    fn tsdg_orders_by_lambda_then_distance() {
        // lambdas: 1 → 0, 2 → 1 (behind 1), 3 → 0, 4 → 2 (behind 1 and 2)
        let (c, v) = cands(&[(1, [1.0, 0.0]), (2, [2.0, 0.0]), (3, [0.0, -2.5]), (4, [3.0, 0.0])]);
        assert_eq!(ids(&tsdg_order(&c, &v, 2, 8)), vec![1, 3, 2, 4]);
        assert_eq!(ids(&tsdg_order(&c, &v, 2, 1)), vec![1, 3, 2]);
    }
}
