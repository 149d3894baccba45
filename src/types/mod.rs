//! The vector types: real[] (reading it, the distance functions and
//! operators, the operator classes of the access method) and pgvector's
//! `vector` and `halfvec` (read directly; their operator classes are the
//! `gpu_graph_pgvector` extension's).

pub mod array;
pub mod functions;
pub mod pgvector;
