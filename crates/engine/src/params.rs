//! Build parameters shared by the CPU and GPU builders (one struct, so both
//! paths read the same index options).

/// RNN-Descent / GRNND parameters (000_e75164c80b1a33b2.txt).
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

/// Defaults measured with `cargo run --release --example tune -- sift|minilm S,R,T1,T2,RHO ...`
/// on a 2-core x86-64 (AVX2, no GPU): wall seconds of the build, then
/// recall@10 at ef 40 (tie-aware, exact ground truth), degree 32. SIFT = the
/// first 100k rows of sift128 (L2), MiniLM = all 61,666 rows of minilm384
/// (cosine). The build is deterministic, so recall is exact; times vary by
/// about ±5% between runs.
///
/// | S  | R  | T1 | T2 | rho  | SIFT s | SIFT r@10 | MiniLM s | MiniLM r@10 |
/// |----|----|----|----|------|--------|-----------|----------|-------------|
/// | 16 | 64 | 2  | 8  | 1    | 2.27   | 0.955     | 2.44     | 0.943       |
/// | 16 | 64 | 3  | 4  | 1    | 2.38   | 0.965     | 2.40     | 0.943       |
/// | 16 | 64 | 3  | 6  | 0.5  | 2.30   | 0.960     | 2.40     | 0.947       |
/// | 16 | 64 | 4  | 3  | 1    | 2.80   | 0.971     | 2.66     | 0.952       |
/// | 12 | 64 | 3  | 8  | 1    | 2.73   | 0.969     | 2.98     | 0.954       |
/// | 16 | 64 | 3  | 6  | 1    | 3.02   | 0.974     | 2.96     | 0.959       |
/// | 16 | 64 | 3  | 8  | 0.75 | 2.93   | 0.971     | 2.92     | 0.958       |
/// | 16 | 64 | 3  | 7  | 1    | 3.17   | 0.973     | 3.24     | 0.964       |
/// | 16 | 64 | 3  | 8  | 1    | 3.17   | 0.975     | 3.34     | 0.967       |
/// | 16 | 96 | 3  | 8  | 1    | 3.47   | 0.977     | 3.63     | 0.968       |
/// | 32 | 64 | 4  | 4  | 1    | 4.10   | 0.982     | 3.96     | 0.966       |
/// | 32 | 96 | 4  | 4  | 1    | 5.14   | 0.985     | 5.09     | 0.973       |
///
/// MiniLM (higher dimension) is the harder set: the cheapest settings that
/// reach 0.96 on it are T2 = 7 and 8, equally fast within the noise, and 8
/// keeps more margin. More outer rounds (T1) or a larger S and R buy recall
/// at a steep price in time.
impl Default for BuildParams {
    fn default() -> Self {
        BuildParams { degree: 32, s: 16, r: 64, t1: 3, t2: 8, rho: 1.0, seed: 0x5eed }
    }
}
