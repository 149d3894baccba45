//! real[] as a vector type: reading it, the distance functions and operators,
//! and the operator classes of the access method.

pub mod array;
pub mod functions;
