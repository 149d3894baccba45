//! Distance kernels on f32 slices. The SQL operators call these same
//! functions, so a distance the index returns equals the operator's bit for bit.
//!
//! On x86-64 with AVX2+FMA (checked once at run time) the kernels are AVX2
//! intrinsics with four independent 8-lane accumulators; elsewhere a portable
//! 8-lane loop.

/// Sums `f(a[i], b[i])` over the common prefix in eight lanes (the portable
/// fallback); fixed-size chunks let LLVM drop the bounds checks.
#[inline(always)]
fn sum_lanes(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let n = a.len().min(b.len());
    let (a8, b8) = (a[..n].chunks_exact(8), b[..n].chunks_exact(8));
    let (ta, tb) = (a8.remainder(), b8.remainder());
    let mut acc = [0f32; 8];
    for (x, y) in a8.zip(b8) {
        let x: &[f32; 8] = x.try_into().unwrap();
        let y: &[f32; 8] = y.try_into().unwrap();
        for l in 0..8 {
            acc[l] += f(x[l], y[l]);
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + (acc[2] + acc[6]) + (acc[3] + acc[7]);
    for (x, y) in ta.iter().zip(tb) {
        s += f(*x, *y);
    }
    s
}

#[inline(always)]
fn l2sq_generic(a: &[f32], b: &[f32]) -> f32 {
    sum_lanes(a, b, |x, y| (x - y) * (x - y))
}

#[inline(always)]
fn dot_generic(a: &[f32], b: &[f32]) -> f32 {
    sum_lanes(a, b, |x, y| x * y)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Sums `step(acc, x, y)` over 8-lane blocks of the common prefix, four
    /// accumulators wide, then the scalar tail with `tail`. Written with
    /// intrinsics: LLVM auto-vectorises the generic loop only at 128 bits.
    #[inline(always)]
    unsafe fn sum(
        a: &[f32],
        b: &[f32],
        step: impl Fn(__m256, __m256, __m256) -> __m256,
        tail: impl Fn(f32, f32) -> f32,
    ) -> f32 {
        // SAFETY: `sum` is inlined into the #[target_feature(enable =
        // "avx2,fma")] functions below, whose callers checked the CPU has
        // them; every load reads within a[..n] and b[..n].
        unsafe {
            let n = a.len().min(b.len());
            let (pa, pb) = (a.as_ptr(), b.as_ptr());
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 32 <= n {
                for (j, acc) in acc.iter_mut().enumerate() {
                    let x = _mm256_loadu_ps(pa.add(i + 8 * j));
                    let y = _mm256_loadu_ps(pb.add(i + 8 * j));
                    *acc = step(*acc, x, y);
                }
                i += 32;
            }
            while i + 8 <= n {
                acc[0] = step(acc[0], _mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)));
                i += 8;
            }
            let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
            let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            let h = _mm_add_ss(h, _mm_movehdup_ps(h));
            let mut s = _mm_cvtss_f32(h);
            while i < n {
                s += tail(*pa.add(i), *pb.add(i));
                i += 1;
            }
            s
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn l2sq(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: this function's features are sum's requirement
        unsafe {
            sum(
                a,
                b,
                |acc, x, y| {
                    let d = _mm256_sub_ps(x, y);
                    _mm256_fmadd_ps(d, d, acc)
                },
                |x, y| (x - y) * (x - y),
            )
        }
    }
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: as in l2sq
        unsafe { sum(a, b, |acc, x, y| _mm256_fmadd_ps(x, y, acc), |x, y| x * y) }
    }
    pub fn has_avx2() -> bool {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
    }
}

/// Squared Euclidean distance over the common prefix of `a` and `b`.
#[inline]
pub fn l2sq(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2() {
        // SAFETY: the CPU supports the enabled features (checked above).
        return unsafe { x86::l2sq(a, b) };
    }
    l2sq_generic(a, b)
}

/// Inner product over the common prefix of `a` and `b`.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2() {
        // SAFETY: as above.
        return unsafe { x86::dot(a, b) };
    }
    dot_generic(a, b)
}

/// Asks the CPU to start loading `v` into cache: a distance to a random
/// vector waits mostly on memory, so callers that know their next vectors
/// issue this a few distances ahead.
#[inline]
pub fn prefetch(v: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in v.chunks(16) {
        // SAFETY: prefetching has no architectural effect, any address is allowed
        unsafe { std::arch::x86_64::_mm_prefetch(line.as_ptr() as *const i8, std::arch::x86_64::_MM_HINT_T0) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = v;
}

pub fn norm(a: &[f32]) -> f32 {
    norm64(a) as f32
}

/// Sum of `a[i]·b[i]` in f64: exact enough for every finite f32 input, where
/// an f32 sum of squares overflows above 1.8e19 and underflows below 1e-19.
fn dot64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// |a| accumulated in f64 (see [`dot64`]).
pub fn norm64(a: &[f32]) -> f64 {
    dot64(a, a).sqrt()
}

/// Whether f32 sums of these magnitudes are safe: finite and far from
/// subnormal, so the fast kernels' result is the f64 one rounded.
#[inline]
fn safe(x: f32) -> bool {
    x.is_finite() && x > 1e-30
}

/// `<->`: Euclidean distance.
pub fn l2_distance(a: &[f32], b: &[f32]) -> f64 {
    (l2sq(a, b) as f64).sqrt()
}

/// `<=>`: 1 − cos(a, b); NaN when either vector is zero (as pgvector). The
/// fast f32 kernels serve where their sums can neither overflow nor lose
/// themselves in subnormals; other finite inputs ('{1e20,0}', '{1e-40,1e-40}')
/// are summed in f64, so every finite input gets the right answer.
pub fn cosine_distance(a: &[f32], b: &[f32]) -> f64 {
    let (na, nb) = (dot(a, a), dot(b, b));
    let d = dot(a, b);
    let (d, na, nb) = if safe(na) && safe(nb) && d.is_finite() {
        (d as f64, na as f64, nb as f64)
    } else {
        (dot64(a, b), dot64(a, a), dot64(b, b))
    };
    let sim = d / (na.sqrt() * nb.sqrt());
    1.0 - sim.clamp(-1.0, 1.0)
}

/// `inner_product(a, b)`.
pub fn inner_product(a: &[f32], b: &[f32]) -> f64 {
    dot(a, b) as f64
}

/// `<#>`: the negative inner product (so that smaller is nearer, as pgvector).
pub fn negative_inner_product(a: &[f32], b: &[f32]) -> f64 {
    -(dot(a, b) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn kernels_match_naive() {
        for n in [0usize, 1, 7, 8, 9, 31, 128, 384, 1000] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let l: f32 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
            let d: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((l2sq(&a, &b) - l).abs() <= 1e-4 * l.max(1.0), "l2 n={n}");
            assert!((dot(&a, &b) - d).abs() <= 1e-4 * d.abs().max(1.0), "dot n={n}");
        }
    }
    #[test]
    fn operators() {
        assert_eq!(l2_distance(&[0.0, 0.0], &[3.0, 4.0]), 5.0);
        assert!((cosine_distance(&[1.0, 0.0], &[0.0, 2.0]) - 1.0).abs() < 1e-12);
        assert!(cosine_distance(&[1.0, 1.0], &[2.0, 2.0]).abs() < 1e-7);
        assert_eq!(negative_inner_product(&[1.0, 2.0], &[3.0, 4.0]), -11.0);
    }
}
