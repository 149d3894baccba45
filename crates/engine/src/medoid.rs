//! The entry point of a built graph: the point nearest the mean.

use rayon::prelude::*;

use crate::distance::l2sq;

/// Index of the stored vector nearest the centroid; `None` when empty.
/// Ties go to the lowest index, so the answer does not depend on threads.
pub fn medoid(vectors: &[f32], stored_dim: usize) -> Option<u32> {
    if stored_dim == 0 || vectors.len() < stored_dim {
        return None;
    }
    let n = vectors.len() / stored_dim;
    // over blocks fixed by n alone and added in order, so the result does
    // not depend on how rayon splits the work
    let block = n.div_ceil(64).max(1024) * stored_dim;
    let partial: Vec<RowSum> = vectors
        .par_chunks(block)
        .map(|rows| {
            let mut s = RowSum::new(stored_dim);
            s.add(rows);
            s
        })
        .collect();
    let mut sum = RowSum::new(stored_dim);
    partial.iter().for_each(|p| sum.merge(p));
    let mut nearest = NearestRow::new(sum.mean());
    nearest.add(0, vectors);
    nearest.row()
}

/// The sum of rows, added piece by piece, in f64 (millions of f32
/// additions would lose the low digits).
pub struct RowSum {
    sum: Vec<f64>,
    rows: usize,
}

impl RowSum {
    pub fn new(stored_dim: usize) -> RowSum {
        RowSum { sum: vec![0f64; stored_dim], rows: 0 }
    }
    pub fn add(&mut self, rows: &[f32]) {
        let d = self.sum.len();
        for row in rows.chunks_exact(d) {
            for (a, &x) in self.sum.iter_mut().zip(row) {
                *a += x as f64;
            }
        }
        self.rows += rows.len() / d;
    }
    pub fn merge(&mut self, other: &RowSum) {
        self.sum.iter_mut().zip(&other.sum).for_each(|(a, b)| *a += b);
        self.rows += other.rows;
    }
    pub fn mean(&self) -> Vec<f32> {
        self.sum.iter().map(|s| (s / self.rows.max(1) as f64) as f32).collect()
    }
}

/// The row nearest a point (squared L2; the lower number on a tie), over
/// pieces of rows numbered in order.
pub struct NearestRow {
    point: Vec<f32>,
    best: Option<(f32, u32)>,
}

impl NearestRow {
    pub fn new(point: Vec<f32>) -> NearestRow {
        NearestRow { point, best: None }
    }
    /// Rows numbered `first..`.
    pub fn add(&mut self, first: usize, rows: &[f32]) {
        let p = &self.point;
        let near = rows
            .par_chunks_exact(p.len())
            .enumerate()
            .map(|(i, row)| (l2sq(row, p), (first + i) as u32))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        if let Some(c) = near {
            if self.best.is_none_or(|b| c.0.total_cmp(&b.0).then(c.1.cmp(&b.1)).is_lt()) {
                self.best = Some(c);
            }
        }
    }
    pub fn row(&self) -> Option<u32> {
        self.best.map(|b| b.1)
    }
}

#[cfg(test)]
mod tests {
    use super::medoid;

    #[test]
    fn nearest_the_mean() {
        assert_eq!(medoid(&[], 2), None);
        assert_eq!(medoid(&[5.0, 5.0], 2), Some(0));
        // mean (1, 1): point 2 sits on it
        let v = [0.0, 0.0, 3.0, 3.0, 1.0, 1.0, 0.0, 0.0];
        assert_eq!(medoid(&v, 2), Some(2));
        // two points equally near the mean (0, 0): the lower index wins
        let v = [-1.0, 0.0, 1.0, 0.0, 3.0, 0.0, -3.0, 0.0];
        assert_eq!(medoid(&v, 2), Some(0));
    }
}
