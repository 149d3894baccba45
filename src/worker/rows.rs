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
//!
//! That is also why the worker's answer thread may read a copy's rows while
//! its main thread patches them (each row one atomic word), and may answer
//! from the rows of a copy that was replaced or stopped following the log
//! after its search started: they are at a state from the request's on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

/// Node → row (a heap TID as the pages encode it; 0 for a node not read).
/// One table a copy; [`Rows::share`] hands the answer thread a reader.
#[derive(Default)]
pub struct Rows(Arc<RwLock<Vec<AtomicU64>>>);

impl Rows {
    /// The copy now has `n` nodes (never fewer): the new ones unknown until
    /// their vectors are read.
    pub fn grow(&mut self, n: usize) {
        let mut t = self.0.write().unwrap_or_else(|e| e.into_inner());
        if n > t.len() {
            t.resize_with(n, || AtomicU64::new(0));
        }
    }

    pub fn set(&mut self, node: usize, row: u64) {
        self.read().0[node].store(row, Ordering::Relaxed);
    }

    /// The same table, for answers from this copy (on the answer thread).
    pub fn share(&self) -> Rows {
        Rows(Arc::clone(&self.0))
    }

    /// The table as it is, for an answer's nodes.
    pub fn read(&self) -> RowsRead<'_> {
        RowsRead(self.0.read().unwrap_or_else(|e| e.into_inner()))
    }
}

pub struct RowsRead<'a>(RwLockReadGuard<'a, Vec<AtomicU64>>);

impl RowsRead<'_> {
    /// Node `node`'s row; None when it was never read (a row's line pointer
    /// is never 0).
    pub fn get(&self, node: u32) -> Option<u64> {
        self.0.get(node as usize).map(|r| r.load(Ordering::Relaxed)).filter(|r| r & 0xFFFF != 0)
    }
}
