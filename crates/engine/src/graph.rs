//! The output of every graph builder (CPU or GPU): fixed-degree adjacency.

use crate::NO_NODE;

/// A built graph: `degree` slots per node, each list sorted by increasing
/// distance from its node and padded with [`NO_NODE`].
#[derive(Clone, Debug)]
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
