//! The output of every graph builder (CPU or GPU): fixed-degree adjacency,
//! and the final cut that turns a node's candidate pool into its list.

use crate::NO_NODE;

/// A built graph: `degree` slots per node, each list sorted by increasing
/// distance from its node and padded with [`NO_NODE`].
#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    pub degree: usize,
    pub adjacency: Vec<u32>,
    /// Search entry point (the medoid); `None` for an empty graph.
    pub entry: Option<u32>,
}

impl Graph {
    pub fn len(&self) -> usize {
        self.adjacency.len().checked_div(self.degree).unwrap_or(0)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The neighbours of `node` without padding.
    pub fn neighbors(&self, node: u32) -> impl Iterator<Item = u32> + '_ {
        let s = node as usize * self.degree;
        self.adjacency[s..s + self.degree].iter().copied().take_while(|&n| n != NO_NODE)
    }
}

/// The final cut of RNN-Descent, the same for the CPU builder and the GPU
/// one (`grnnd_finish` in kernels/rnn_descent.cu does exactly this on the
/// device, and the GPU crate's build check compares the two list for list):
/// `node`'s candidates sorted by (distance, id), each id kept once (its
/// nearest copy), the node itself dropped, the nearest `out.len()` written to
/// `out` and the rest padded with [`NO_NODE`]. Distances are squared, never
/// negative: their bit patterns order as the values do, as on the device.
pub fn final_cut(
    node: u32,
    cands: impl IntoIterator<Item = (f32, u32)>,
    scratch: &mut Vec<(f32, u32)>,
    out: &mut [u32],
) {
    scratch.clear();
    scratch.extend(cands.into_iter().filter(|c| c.1 != node));
    scratch.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    // an id can come twice at different distances (an exact k-NN start and
    // a redirect computed with another summation order): the first is nearest
    let mut k = 0;
    for &(_, id) in scratch.iter() {
        if k == out.len() {
            break;
        }
        if !out[..k].contains(&id) {
            out[k] = id;
            k += 1;
        }
    }
    out[k..].fill(NO_NODE);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_sorts_dedupes_drops_self_and_pads() {
        let mut scratch = Vec::new();
        let mut out = [0u32; 3];
        // node 0: id 5 twice (the nearer copy counts), 3, itself
        final_cut(0, [(2.0, 5), (1.0, 3), (0.5, 5), (0.0, 0)], &mut scratch, &mut out);
        assert_eq!(out, [5, 3, NO_NODE]);
        let mut one = [0u32; 1];
        final_cut(0, [(2.0, 5), (1.0, 3), (0.5, 5)], &mut scratch, &mut one);
        assert_eq!(one, [5]);
        // ties by id
        final_cut(9, [(1.0, 7), (1.0, 2), (1.0, 4)], &mut scratch, &mut out);
        assert_eq!(out, [2, 4, 7]);
    }
}
