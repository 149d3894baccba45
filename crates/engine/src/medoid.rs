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
    // the sum in f64 (millions of f32 additions would lose the low digits),
    // over blocks fixed by n alone and added in order, so the result does
    // not depend on how rayon splits the work
    let block = n.div_ceil(64).max(1024) * stored_dim;
    let partial: Vec<Vec<f64>> = vectors
        .par_chunks(block)
        .map(|rows| {
            let mut s = vec![0f64; stored_dim];
            for row in rows.chunks_exact(stored_dim) {
                for (a, &x) in s.iter_mut().zip(row) {
                    *a += x as f64;
                }
            }
            s
        })
        .collect();
    let mut sum = vec![0f64; stored_dim];
    for p in &partial {
        sum.iter_mut().zip(p).for_each(|(a, b)| *a += b);
    }
    let centroid: Vec<f32> = sum.iter().map(|s| (s / n as f64) as f32).collect();
    vectors
        .par_chunks_exact(stored_dim)
        .enumerate()
        .map(|(i, row)| (l2sq(row, &centroid), i))
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
        .map(|(_, i)| i as u32)
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
