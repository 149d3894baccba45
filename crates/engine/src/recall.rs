//! Exact ground truth by brute force and tie-aware recall@k.
//!
//! Everything here uses the SQL operators' distances over the raw vectors,
//! so recall is measured the way a user would check it with a sequential scan.

use rayon::prelude::*;

use crate::dataset::Matrix;
use crate::distance::{cosine_distance, l2_distance, negative_inner_product};
use crate::metric::Metric;

/// The SQL operator of `metric` (`<->`, `<=>`, `<#>`) on raw vectors.
pub fn operator_distance(metric: Metric, a: &[f32], b: &[f32]) -> f64 {
    match metric {
        Metric::L2 => l2_distance(a, b),
        Metric::Cosine => cosine_distance(a, b),
        Metric::InnerProduct => negative_inner_product(a, b),
    }
}

/// For each query (rows of `queries`), the `k` nearest rows of `base` as
/// (row, operator distance), ascending, ties by row id.
pub fn exact_knn(base: &[f32], dim: usize, queries: &[f32], k: usize, metric: Metric) -> Vec<Vec<(u32, f64)>> {
    queries
        .par_chunks_exact(dim)
        .map(|q| {
            let mut all: Vec<(f64, u32)> =
                base.chunks_exact(dim).enumerate().map(|(i, x)| (operator_distance(metric, q, x), i as u32)).collect();
            let cmp = |a: &(f64, u32), b: &(f64, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
            let k = k.min(all.len());
            if k < all.len() {
                all.select_nth_unstable_by(k, cmp);
                all.truncate(k);
            }
            all.sort_unstable_by(cmp);
            all.into_iter().map(|(d, i)| (i, d)).collect()
        })
        .collect()
}

/// Relative slack when comparing a returned row's distance with the true
/// k-th one: the two may come from different summation orders.
const TIE_EPS: f64 = 1e-6;

/// Recall@k of one query: the share of `k` slots filled by a returned row
/// (the first `k` of `found_dists`) at most as far as the true k-th
/// neighbour. Ties count as hits (SIFT's integer vectors have many).
pub fn recall_at_k(found_dists: &[f64], true_kth_dist: f64, k: usize) -> f64 {
    if k == 0 {
        return 1.0;
    }
    let limit = true_kth_dist + TIE_EPS * true_kth_dist.abs().max(f64::MIN_POSITIVE);
    let hits = found_dists.iter().take(k).filter(|&&d| d <= limit).count();
    hits as f64 / k as f64
}

/// Mean recall@k over queries: `found[q]` are the distances a search
/// returned for query q, `truth[q]` its exact neighbours (at least `k`, or
/// all rows when there are fewer; then k shrinks to match).
pub fn mean_recall(found: &[Vec<f64>], truth: &[Vec<(u32, f64)>], k: usize) -> f64 {
    assert_eq!(found.len(), truth.len());
    if found.is_empty() {
        return 1.0;
    }
    let sum: f64 = found
        .iter()
        .zip(truth)
        .map(|(f, t)| {
            let k = k.min(t.len());
            if k == 0 {
                1.0
            } else {
                recall_at_k(f, t[k - 1].1, k)
            }
        })
        .sum();
    sum / found.len() as f64
}

/// Ground truth from a file's ids (one row of ids per query): the first `k`
/// ids of each row with their operator distances, as [`exact_knn`] returns.
pub fn truth_from_ids(
    base: &Matrix<f32>,
    queries: &Matrix<f32>,
    ids: &Matrix<i32>,
    k: usize,
    metric: Metric,
) -> Vec<Vec<(u32, f64)>> {
    (0..queries.len())
        .map(|q| {
            ids.row(q)
                .iter()
                .take(k)
                .map(|&id| (id as u32, operator_distance(metric, queries.row(q), base.row(id as usize))))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brute_force_ties_by_id() {
        // 1-D points 0, 3, 1, 1, 5; query 1.
        let base = [0.0, 3.0, 1.0, 1.0, 5.0];
        let gt = exact_knn(&base, 1, &[1.0], 3, Metric::L2);
        assert_eq!(gt[0], vec![(2, 0.0), (3, 0.0), (0, 1.0)]);
        assert_eq!(exact_knn(&base, 1, &[1.0], 9, Metric::L2)[0].len(), 5);
        let ip = exact_knn(&[1.0, 0.0, 2.0, 0.0], 2, &[1.0, 0.0], 1, Metric::InnerProduct);
        assert_eq!(ip[0], vec![(1, -2.0)]);
    }

    #[test]
    fn tie_aware() {
        // the true 2nd neighbour is at 1.0; a returned row at 1.0 with another id counts
        assert_eq!(recall_at_k(&[0.0, 1.0], 1.0, 2), 1.0);
        assert_eq!(recall_at_k(&[0.0, 1.0 + 1e-9], 1.0, 2), 1.0);
        assert_eq!(recall_at_k(&[0.0, 1.1], 1.0, 2), 0.5);
        assert_eq!(recall_at_k(&[0.0], 1.0, 2), 0.5); // too few rows returned
        assert_eq!(recall_at_k(&[0.0, 0.5, 0.7], 1.0, 2), 1.0); // only the first k count
        let truth = vec![vec![(0, 0.0), (1, 2.0)], vec![(3, 1.0), (4, 1.0)]];
        assert_eq!(mean_recall(&[vec![0.0, 3.0], vec![1.0, 1.0]], &truth, 2), 0.75);
    }
}
