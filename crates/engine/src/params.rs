//! Build parameters shared by the CPU and GPU builders (one struct, so both
//! paths read the same index options).

/// RNN-Descent / GRNND parameters ("GRNND: A GPU-Parallel Relative NN-Descent
/// Algorithm for Efficient Approximate Nearest Neighbor Graph Construction").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BuildParams {
    /// Neighbours kept per node in the final graph.
    pub degree: usize,
    /// Random initial neighbours per node.
    pub s: usize,
    /// Capacity of a node's candidate pool during refinement.
    pub r: usize,
    /// Outer rounds (reverse edges added between them).
    pub t1: usize,
    /// Update rounds per outer round.
    pub t2: usize,
    /// Share of each list whose reverse edges are added between outer rounds.
    pub rho: f32,
    pub seed: u64,
}

/// The defaults: the cheapest settings that reach recall@10 0.96 at ef 40 on
/// both SIFT and MiniLM with a margin (the measurements are in
/// docs/benchmarks.md, "Build parameters of RNN-Descent").
impl Default for BuildParams {
    fn default() -> Self {
        BuildParams { degree: 32, s: 16, r: 64, t1: 3, t2: 8, rho: 1.0, seed: 0x5eed }
    }
}

/// Order in which an RNN-Descent round scans a pool (the CPU's
/// rnn_descent::build_in and the GPU's kernels/rnn_descent.cu alike).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanOrder {
    /// Algorithm 2's ascending distance order.
    Ascending,
    /// GRNND's disordered propagation: a fresh random order every round.
    /// Its lists are sparser (mean degree 14.2 against 16.6 on 1M x768) and
    /// make the better start for a CFS graph: from the CPU's start in this
    /// order NSG's graph reached recall@10 0.941 at ef 20 against 0.922 in
    /// ascending order, TSDG's 0.901 against 0.886 (docs/benchmarks.md).
    Random,
}
