//! The row (heap TID) of each node of a copy, kept by the worker beside the
//! copy and followed through the same loads and patches as its vectors, so
//! that an answer carries each node's row and search distance and the
//! backend hands them out without reading the index's pages again.
//!
//! Why an answer's rows and distances are as good as the pages' (a row
//! committed before the scan started is in the copy that answers, see
//! worker::client): a node's row changes only when VACUUM has freed the
//! node and an insert reuses it. Both are written to the log before they
//! commit, after the rows they replace were dead to every snapshot. So a
//! row the copy pairs with a node, at any state of the copy from the one
//! the request needed on, is either the one the scan's snapshot knew or one
//! committed after the request was made: invisible to the scan, and dropped
//! by the executor's visibility check whatever its distance.

/// Node → row (a heap TID as the pages encode it; 0 for a node not read).
#[derive(Default)]
pub struct Rows(Vec<u64>);

impl Rows {
    /// The copy now has `n` nodes (never fewer): the new ones unknown until
    /// their vectors are read.
    pub fn grow(&mut self, n: usize) {
        if n > self.0.len() {
            self.0.resize(n, 0);
        }
    }

    pub fn set(&mut self, node: usize, row: u64) {
        self.0[node] = row;
    }

    /// The rows of nodes `first..first + n` as the pages encode them (0:
    /// not read), for the GPU's copy of them.
    pub fn run(&self, first: usize, n: usize) -> Vec<u64> {
        (first..first + n).map(|i| self.0.get(i).copied().unwrap_or(0)).collect()
    }

    /// Node `node`'s row; None when it was never read.
    pub fn get(&self, node: u32) -> Option<u64> {
        self.0.get(node as usize).copied().filter(|&r| known(r))
    }
}

/// Whether a row as a copy holds it (here, or as the GPU wrote it beside a
/// hit) is one read from the pages: a row's line pointer is never 0.
pub fn known(row: u64) -> bool {
    row & 0xFFFF != 0
}
