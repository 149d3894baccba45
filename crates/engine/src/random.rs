//! A tiny fast generator, no dependency: plenty for picking random initial
//! neighbours. The GPU kernels use the same finaliser (kernels/common.cuh's
//! mix64), so the GPU and CPU builders start from the same random graph.

/// splitmix64's finaliser (Steele, Lea & Flood).
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }
    /// Uniform in 0..n (Lemire's multiply-shift; the bias is below 2^-32).
    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next_u64() >> 32) * n as u64) >> 32) as u32
    }
}
