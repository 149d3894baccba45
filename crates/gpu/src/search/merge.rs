//! The host's half of ALGAS's GPU-CPU cooperation (section IV-B): the
//! per-CTA result lists of a query, each sorted ascending, merged into the
//! k best, duplicates and deleted nodes dropped. The GPU never runs a merge
//! kernel.

use std::cmp::Ordering;

use crate::abi::ResultHit;

/// A list entry: its search distance and node.
pub trait Scored: Copy {
    fn dist(&self) -> f32;
    fn node(&self) -> u32;
}

impl Scored for (f32, u32) {
    fn dist(&self) -> f32 {
        self.0
    }
    fn node(&self) -> u32 {
        self.1
    }
}

/// A CTA's hit as the kernel wrote it (merged where it lies, in mapped
/// memory: no copy first).
impl Scored for ResultHit {
    fn dist(&self) -> f32 {
        self.dist
    }
    fn node(&self) -> u32 {
        self.id
    }
}

/// The most lists one merge takes: a query's CTAs (QueryPlan's clamp).
pub const MAX_LISTS: usize = 32;

/// The `k` nearest of the union of `lists` (each sorted by (distance, node);
/// at most MAX_LISTS of them), ascending, each node once, only nodes for
/// which `keep` is true.
///
/// Duplicates: a node is in two lists, or twice in one, only when the
/// visited table of its slot overflowed or two claims of it in one batch
/// both succeeded (see the kernel's merge_unsorted). Both computed the same float
/// (same code, same lane split, same summation order), so equal nodes come
/// out one right after the other and comparing with the last output is
/// enough.
///
/// The least head is found by a scan of the lists' heads (a query has a few
/// CTAs, and k is tens): no heap, and no allocation but the output's, on
/// the worker's thread that merges every answer.
pub fn merge_lists<T: Scored>(lists: &[&[T]], k: usize, keep: impl FnMut(u32) -> bool) -> Vec<(f32, u32)> {
    let mut out: Vec<(f32, u32)> = Vec::with_capacity(k);
    merge_by(lists, k, keep, |h: &T, _, _| out.push((h.dist(), h.node())));
    out
}

/// The merge of [`merge_lists`], handing each kept entry to `emit` with its
/// list and its position there (a caller that needs more of an entry than
/// its distance and node: its row, beside the hits).
pub fn merge_by<T: Scored>(
    lists: &[&[T]],
    k: usize,
    mut keep: impl FnMut(u32) -> bool,
    mut emit: impl FnMut(&T, usize, usize),
) {
    assert!(lists.len() <= MAX_LISTS, "{} lists to merge, at most {MAX_LISTS}", lists.len());
    let mut pos = [0usize; MAX_LISTS];
    let (mut out, mut last) = (0usize, None::<u32>);
    while out < k {
        // the least head by (distance, node), the first list's on a tie
        let mut best: Option<(usize, f32, u32)> = None;
        for (i, l) in lists.iter().enumerate() {
            if let Some(h) = l.get(pos[i]) {
                let (d, n) = (h.dist(), h.node());
                let less = |&(_, bd, bn): &(usize, f32, u32)| d.total_cmp(&bd).then(n.cmp(&bn)) == Ordering::Less;
                if best.as_ref().is_none_or(less) {
                    best = Some((i, d, n));
                }
            }
        }
        let Some((i, _, n)) = best else { break };
        let at = pos[i];
        pos[i] += 1;
        if last == Some(n) || !keep(n) {
            continue;
        }
        emit(&lists[i][at], i, at);
        (out, last) = (out + 1, Some(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_dedupes_filters() {
        let a = [(0.5, 3), (1.0, 7), (2.0, 9)];
        let b = [(0.1, 1), (1.0, 7), (1.5, 4)];
        let c: [(f32, u32); 0] = [];
        let m = merge_lists(&[&a, &b, &c], 10, |_| true);
        assert_eq!(m, vec![(0.1, 1), (0.5, 3), (1.0, 7), (1.5, 4), (2.0, 9)]);
        let m = merge_lists(&[&a, &b], 3, |n| n != 3);
        assert_eq!(m, vec![(0.1, 1), (1.0, 7), (1.5, 4)]);
        let m = merge_lists(&[&a], 2, |n| n != 3);
        assert_eq!(m, vec![(1.0, 7), (2.0, 9)]);
        // ties by node id
        let a = [(1.0, 5)];
        let b = [(1.0, 2)];
        assert_eq!(merge_lists(&[&a, &b], 2, |_| true), vec![(1.0, 2), (1.0, 5)]);
    }

    #[test]
    fn equals_sorting_the_union() {
        // lists as CTAs write them: sorted, distinct within a list, a node
        // in two lists with the same distance
        let mut x = 12345u32;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        let dist = |n: u32| (n % 97) as f32 * 0.25;
        for round in 0..200 {
            let ctas = 1 + round % 8;
            let lists: Vec<Vec<(f32, u32)>> = (0..ctas)
                .map(|_| {
                    let mut l: Vec<(f32, u32)> = (0..next() % 40).map(|_| next() % 300).map(|n| (dist(n), n)).collect();
                    l.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                    l.dedup();
                    l
                })
                .collect();
            let refs: Vec<&[(f32, u32)]> = lists.iter().map(|l| l.as_slice()).collect();
            let k = (next() % 50) as usize;
            let keep = |n: u32| !n.is_multiple_of(11);
            let mut want: Vec<(f32, u32)> = lists.concat().into_iter().filter(|h| keep(h.1)).collect();
            want.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            want.dedup();
            want.truncate(k);
            assert_eq!(merge_lists(&refs, k, keep), want, "round {round}");
        }
    }
}
