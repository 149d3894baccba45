//! The one step of Collect-Filter-Store that may run elsewhere: a
//! [`Filter`] over many nodes' candidates at once. [`crate::cfs`] collects
//! and stores; a [`FilterRows`] filters: [`CpuFilters`] row by row on all
//! rayon threads, crates/gpu's GpuFilters a batch per kernel launch.

use rayon::prelude::*;

use crate::filter::Filter;

/// Filters rows of candidates.
pub trait FilterRows {
    type Error;
    /// For each row (a node's candidates: (id, squared distance to the
    /// node), ascending by (distance, id), distinct, the node absent), the
    /// ids `filter` keeps, at most `degree`, as [`Filter::apply`] gives
    /// them (ascending distance).
    fn filter_rows(
        &mut self,
        filter: Filter,
        rows: &[Vec<(u32, f32)>],
        degree: usize,
    ) -> Result<Vec<Vec<u32>>, Self::Error>;
}

/// [`Filter::apply`] on each row, on all rayon threads; `vectors` holds the
/// stored vectors (n × `dim`) that the ids name.
pub struct CpuFilters<'a> {
    pub vectors: &'a [f32],
    pub dim: usize,
}

impl FilterRows for CpuFilters<'_> {
    type Error = std::convert::Infallible;

    fn filter_rows(
        &mut self,
        filter: Filter,
        rows: &[Vec<(u32, f32)>],
        degree: usize,
    ) -> Result<Vec<Vec<u32>>, Self::Error> {
        let (all, dim) = (self.vectors, self.dim);
        Ok(rows
            .par_iter()
            .map(|row| {
                let mut vectors = Vec::with_capacity(row.len() * dim);
                for &(id, _) in row {
                    vectors.extend_from_slice(&all[id as usize * dim..(id as usize + 1) * dim]);
                }
                filter.apply(row, &vectors, dim, degree).into_iter().map(|k| k.0).collect()
            })
            .collect())
    }
}

/// A FilterRows (or a [`crate::collect_rows::CollectRows`]) that adds up
/// the time spent in `inner` (a build's report of its filters' share).
pub struct Timed<F> {
    pub inner: F,
    pub ms: f64,
}

impl<F: FilterRows> FilterRows for Timed<F> {
    type Error = F::Error;

    fn filter_rows(
        &mut self,
        filter: Filter,
        rows: &[Vec<(u32, f32)>],
        degree: usize,
    ) -> Result<Vec<Vec<u32>>, F::Error> {
        let t = std::time::Instant::now();
        let kept = self.inner.filter_rows(filter, rows, degree);
        self.ms += t.elapsed().as_secs_f64() * 1e3;
        kept
    }
}
