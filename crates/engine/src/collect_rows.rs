//! The other step of Collect-Filter-Store that may run elsewhere (beside
//! [`crate::filter_rows`]): the collect's searches. [`crate::cfs`] asks a
//! [`CollectRows`] for the hits of a batch of nodes and does everything
//! else itself: [`CpuCollect`] searches on all rayon threads, crates/gpu's
//! GpuCollect a batch per launch of the GPU's batch search.

use std::ops::Range;

use rayon::prelude::*;

use crate::cfs::View;
use crate::filter_rows::Timed;
use crate::graph::Graph;
use crate::metric::Metric;
use crate::search::Search;

/// Searches the start graph for nodes' own vectors.
pub trait CollectRows {
    type Error;
    /// For each node of `nodes` (in order), the (id, distance) hits a beam
    /// search of beam `pool` for the node's stored vector over the start
    /// graph finds (the graph distance: squared L2 over stored vectors): at
    /// most `pool`, distinct, in any order, the node itself among them or
    /// not. The distances come with the hits because the collect needs
    /// them: computed again after a GPU search, from vectors no longer in
    /// any cache, they took 20 times as long as the search itself.
    fn collect_rows(&mut self, nodes: Range<usize>, pool: usize) -> Result<Vec<Vec<(u32, f32)>>, Self::Error>;
}

/// The engine's search on all rayon threads; `vectors` holds the n × `dim`
/// stored vectors that `start` links.
pub struct CpuCollect<'a> {
    pub vectors: &'a [f32],
    pub dim: usize,
    pub start: &'a Graph,
}

impl CollectRows for CpuCollect<'_> {
    type Error = std::convert::Infallible;

    fn collect_rows(&mut self, nodes: Range<usize>, pool: usize) -> Result<Vec<Vec<(u32, f32)>>, Self::Error> {
        let (vectors, dim, start) = (self.vectors, self.dim, self.start);
        let view = View { vectors, dim, degree: start.degree, adjacency: &start.adjacency, entry: start.entry };
        Ok(nodes
            .into_par_iter()
            .map(|v| {
                // L2 over stored vectors is the graph distance, whatever the SQL metric
                let mut search = Search::new(&view, Metric::L2, &vectors[v * dim..(v + 1) * dim]);
                search.next_round(&view, pool).iter().map(|h| (h.node, h.dist)).collect()
            })
            .collect())
    }
}

/// The time spent in the searches too (a build's report of their share).
impl<C: CollectRows> CollectRows for Timed<C> {
    type Error = C::Error;

    fn collect_rows(&mut self, nodes: Range<usize>, pool: usize) -> Result<Vec<Vec<(u32, f32)>>, C::Error> {
        let t = std::time::Instant::now();
        let hits = self.inner.collect_rows(nodes, pool);
        self.ms += t.elapsed().as_secs_f64() * 1e3;
        hits
    }
}
