//! The algorithms of gpu_graph, free of PostgreSQL and CUDA.
//!
//! Everything talks to storage through the two traits in [`store`]: a
//! [`flat::FlatIndex`] (an index in flat arrays: a build's output, the GPU's
//! upload, the search worker's copy), the in-memory [`memory::MemoryStore`]
//! (concurrent inserts and deletes in tests) and the PostgreSQL page store
//! in the extension implement them, so one search, one insert and one prune
//! routine serve every path.

pub mod candidates;
pub mod cfs;
pub mod collect_rows;
pub mod cost;
pub mod dataset;
pub mod distance;
pub mod filter;
pub mod filter_rows;
pub mod flat;
pub mod graph;
pub mod idset;
pub mod insert;
pub mod medoid;
pub mod memory;
pub mod merge;
pub mod metric;
pub mod node;
pub mod outliers;
pub mod params;
pub mod partition;
pub mod prune;
pub mod random;
pub mod recall;
pub mod repair;
pub mod rnn_descent;
pub mod search;
pub mod sharded;
pub mod store;

/// Padding for unused slots of a fixed-size neighbour list.
pub const NO_NODE: u32 = u32::MAX;
