//! The host's half of ALGAS's GPU-CPU cooperation (section IV-B): the
//! per-CTA result lists of a query, each sorted ascending, merged with a
//! heap into the k best, duplicates and deleted nodes dropped. The GPU never
//! runs a merge kernel.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

#[derive(Clone, Copy, PartialEq)]
struct Head {
    dist: f32,
    node: u32,
    list: u32,
    pos: u32,
}
impl Eq for Head {}
impl Ord for Head {
    fn cmp(&self, o: &Self) -> Ordering {
        self.dist.total_cmp(&o.dist).then(self.node.cmp(&o.node)).then(self.list.cmp(&o.list))
    }
}
impl PartialOrd for Head {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// The `k` nearest of the union of `lists` (each sorted by (distance, node)),
/// ascending, each node once, only nodes for which `keep` is true.
///
/// Duplicates: a node is in two lists only when the visited table of its
/// slot overflowed and two CTAs computed it. Both computed the same float
/// (same code, same lane split, same summation order), so equal nodes leave
/// the heap one right after the other and comparing with the last output is
/// enough.
pub fn merge_lists(lists: &[&[(f32, u32)]], k: usize, mut keep: impl FnMut(u32) -> bool) -> Vec<(f32, u32)> {
    let mut out: Vec<(f32, u32)> = Vec::with_capacity(k);
    if k == 0 {
        return out;
    }
    if lists.len() == 1 {
        // one CTA: already sorted and distinct
        for &(d, n) in lists[0] {
            if out.len() == k {
                break;
            }
            if out.last().is_some_and(|l| l.1 == n) || !keep(n) {
                continue;
            }
            out.push((d, n));
        }
        return out;
    }
    let mut heap: BinaryHeap<Reverse<Head>> = BinaryHeap::with_capacity(lists.len());
    for (i, l) in lists.iter().enumerate() {
        if let Some(&(d, n)) = l.first() {
            heap.push(Reverse(Head { dist: d, node: n, list: i as u32, pos: 0 }));
        }
    }
    while let Some(Reverse(h)) = heap.pop() {
        let l = lists[h.list as usize];
        let next = h.pos as usize + 1;
        if next < l.len() {
            let (d, n) = l[next];
            heap.push(Reverse(Head { dist: d, node: n, list: h.list, pos: next as u32 }));
        }
        if out.last().is_some_and(|x| x.1 == h.node) || !keep(h.node) {
            continue;
        }
        out.push((h.dist, h.node));
        if out.len() == k {
            break;
        }
    }
    out
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
}
