//! The algorithms of gpu_graph, free of PostgreSQL and CUDA.
//!
//! Everything talks to storage through the two traits in [`store`]: the
//! in-memory [`memory::MemoryStore`] (tests, benchmarks) and the PostgreSQL
//! page store in the extension implement them, so one search, one insert and
//! one prune routine serve every path.

pub mod candidates;
pub mod dataset;
pub mod distance;
pub mod graph;
pub mod idset;
pub mod insert;
pub mod medoid;
pub mod memory;
pub mod metric;
pub mod params;
pub mod prune;
pub mod recall;
pub mod repair;
pub mod rnn_descent;
pub mod search;
pub mod store;

/// Padding for unused slots of a fixed-size neighbour list.
pub const NO_NODE: u32 = u32::MAX;
