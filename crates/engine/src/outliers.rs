//! Inner product's M, robust to a few rows of outsized norm.
//!
//! The MIPS-to-L2 reduction (see [`crate::metric`]) gives every row the
//! coordinate sqrt(M² − |x|²) with M the largest norm. One row of norm 1e20
//! among rows of norm ~1 makes that coordinate 1e20 for all of them: in f32
//! their differences vanish and the graph's distances to the outlier
//! overflow (in f16 everything does), and recall@10 fell from 0.966 to
//! 0.055. So the few rows whose norms stand apart from the rest by a gap
//! ([`GAP`]) are *pinned* instead: M is the largest norm of the others, a
//! pinned row keeps its raw coordinates (search ranks by −⟨q,x⟩ on them, so
//! its distance stays exact) with 0 as its extra coordinate, and every
//! search starts from the pinned rows as well as the entry point, so one
//! that wins a query's top k is always seen.

/// At most this many rows are pinned (the meta page keeps their ids).
pub const MAX_PINNED: usize = 16;

/// A row is an outlier when its norm is more than this many times the next
/// smaller norm that is not one: a gap no dense embedding set has among its
/// largest norms.
pub const GAP: f32 = 2.0;

/// M and the pinned rows for rows of these `norms`: the ids of the up to
/// [`MAX_PINNED`] largest norms above the last gap of more than [`GAP`]
/// among the `MAX_PINNED + 1` largest, and the largest norm below it.
pub fn split(norms: &[f32]) -> (f32, Vec<u32>) {
    let mut top: Vec<u32> = (0..norms.len() as u32).collect();
    let k = top.len().min(MAX_PINNED + 1);
    if k == 0 {
        return (0.0, Vec::new());
    }
    let by_norm = |a: &u32, b: &u32| norms[*b as usize].total_cmp(&norms[*a as usize]).then(a.cmp(b));
    if top.len() > k {
        top.select_nth_unstable_by(k - 1, by_norm);
        top.truncate(k);
    }
    top.sort_unstable_by(by_norm);
    let norm = |i: usize| norms[top[i] as usize];
    // pinned: top[..p] for the largest p with norm(p - 1) > GAP × norm(p)
    let p = (1..k).rev().find(|&p| norm(p - 1) > GAP * norm(p)).unwrap_or(0);
    (norm(p), top[..p].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_only_rows_beyond_a_gap() {
        let mut norms: Vec<f32> = (0..1000).map(|i| 1.0 + (i % 97) as f32 / 97.0).collect();
        assert_eq!(split(&norms), (norms.iter().copied().fold(0.0, f32::max), vec![]));
        norms[17] = 1e20;
        norms[400] = 5e3;
        let (m, pinned) = split(&norms);
        assert_eq!(pinned, vec![17, 400]);
        assert!(m < 2.0);
        // more outliers than can be pinned: M covers the rest
        let many: Vec<f32> = (0..100).map(|i| if i < 30 { 1e6 + i as f32 } else { 1.0 }).collect();
        let (m, pinned) = split(&many);
        assert!(pinned.is_empty() && m > 1e6, "{m} {pinned:?}");
        assert_eq!(split(&[]), (0.0, vec![]));
        assert_eq!(split(&[3.0]), (3.0, vec![]));
    }
}
