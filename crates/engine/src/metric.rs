//! How each SQL metric maps onto the graph.
//!
//! The graph is always built and pruned under squared L2 over *stored*
//! vectors, because the RNG rule is geometric only for a metric:
//! - L2: stored = the raw vector.
//! - Cosine: stored = the vector scaled to unit length, so squared L2 between
//!   stored vectors is 2·(1 − cos) and orders exactly as `<=>`. Zero vectors
//!   have no direction and are not indexed.
//! - Inner product: stored = the raw vector plus one coordinate
//!   sqrt(M² − |x|²) (M: the largest norm at build time), the standard
//!   MIPS-to-L2 reduction: for a query with a 0 there, squared L2 is
//!   |q|² + M² − 2⟨q,x⟩, which orders as −⟨q,x⟩. A row with a norm above M
//!   (a pinned outlier, see [`crate::outliers`], or a row inserted later) gets
//!   0 there (its edges are off; answers stay exact because the search ranks
//!   by −⟨q,x⟩ itself, and pinned rows are searched from).
//!
//! The search ranks by [`Metric::search_distance`], monotone with the SQL
//! operator, and [`Metric::to_sql`] turns that into the operator's value.

use crate::distance::{dot, l2sq, norm64};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    L2,
    Cosine,
    InnerProduct,
}

impl Metric {
    pub fn name(self) -> &'static str {
        match self {
            Metric::L2 => "l2",
            Metric::Cosine => "cosine",
            Metric::InnerProduct => "inner_product",
        }
    }
    pub fn from_code(code: u32) -> Option<Metric> {
        match code {
            0 => Some(Metric::L2),
            1 => Some(Metric::Cosine),
            2 => Some(Metric::InnerProduct),
            _ => None,
        }
    }
    pub fn code(self) -> u32 {
        match self {
            Metric::L2 => 0,
            Metric::Cosine => 1,
            Metric::InnerProduct => 2,
        }
    }

    /// Length of a stored vector for `dim` input dimensions.
    pub fn stored_dim(self, dim: usize) -> usize {
        match self {
            Metric::InnerProduct => dim + 1,
            _ => dim,
        }
    }

    /// Whether a row's stored form depends on that row alone (inner product's
    /// augmentation waits for the largest norm of all rows).
    pub fn stored_alone(self) -> bool {
        self != Metric::InnerProduct
    }

    /// Whether a row with this vector can be indexed (cosine: not zero).
    pub fn indexable(self, v: &[f32]) -> bool {
        match self {
            Metric::Cosine => norm64(v) > 0.0,
            _ => true,
        }
    }

    /// The stored form of `v`, appended to `out`. `max_norm` is M for
    /// inner product (ignored otherwise).
    pub fn prepare_stored(self, v: &[f32], max_norm: f32, out: &mut Vec<f32>) {
        match self {
            Metric::L2 => out.extend_from_slice(v),
            Metric::Cosine => {
                // in f64: a norm of 1e20 or 1e-40 is no special case
                let n = norm64(v);
                out.extend(v.iter().map(|&x| (x as f64 / n) as f32));
            }
            Metric::InnerProduct => {
                out.extend_from_slice(v);
                let extra = (max_norm as f64).powi(2) - norm64(v).powi(2);
                out.push(extra.max(0.0).sqrt() as f32);
            }
        }
    }

    /// The query form of `q`: what [`Metric::search_distance`] expects.
    pub fn prepare_query(self, q: &[f32]) -> Vec<f32> {
        let mut v = Vec::with_capacity(q.len() + 1);
        self.prepare_into(q, &mut v);
        v
    }

    /// [`Metric::prepare_query`] appended to `out` (many queries in one
    /// array).
    pub fn prepare_into(self, q: &[f32], out: &mut Vec<f32>) {
        match self {
            Metric::L2 => out.extend_from_slice(q),
            Metric::Cosine => {
                let n = norm64(q);
                if n > 0.0 {
                    out.extend(q.iter().map(|&x| (x as f64 / n) as f32));
                } else {
                    out.extend_from_slice(q);
                }
            }
            Metric::InnerProduct => {
                out.extend_from_slice(q);
                out.push(0.0);
            }
        }
    }

    /// The value the search ranks by (smaller is nearer), from a prepared
    /// query to a stored vector.
    #[inline]
    pub fn search_distance(self, q: &[f32], stored: &[f32]) -> f32 {
        match self {
            Metric::L2 | Metric::Cosine => l2sq(q, stored),
            // over the raw coordinates only (the query's extra one is 0), so
            // the sum runs in the same order as the `<#>` operator's
            Metric::InnerProduct => {
                let dim = q.len() - 1;
                -dot(&q[..dim], &stored[..dim])
            }
        }
    }

    /// The SQL operator's value for a search distance.
    pub fn to_sql(self, d: f32) -> f64 {
        match self {
            Metric::L2 => (d.max(0.0) as f64).sqrt(),
            Metric::Cosine => (d.max(0.0) as f64) / 2.0,
            Metric::InnerProduct => d as f64,
        }
    }
}

/// Distance between two stored vectors: what building and pruning use.
#[inline]
pub fn graph_distance(a: &[f32], b: &[f32]) -> f32 {
    l2sq(a, b)
}
