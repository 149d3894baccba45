//! Where node `n` lives.
//!
//! Block 0 is the meta page. The rest is a sequence of chunks; a chunk is one
//! graph page holding the neighbour lists of `per_chunk` nodes, followed by
//! the vector pages holding those nodes' vector tuples. A vector tuple is the
//! heap TID, a flags word and the stored vector, so a scan reads a node's TID,
//! its deleted flag and its vector under one buffer lock (a slot reused after
//! VACUUM can never pair one row's TID with another row's distance).
//! Separating lists from vectors keeps every node a fixed size up to 2000
//! dimensions, where list and vector together would not fit a page.
//!
//! This file says which page holds a node and how many of each fit; where
//! in the page and in which bytes is the codec's (`codec`).

pub const BLCKSZ: usize = pgrx::pg_sys::BLCKSZ as usize;
/// Page header, MAXALIGNed.
pub const PAGE_HEADER: usize = 24;
pub const USABLE: usize = BLCKSZ - PAGE_HEADER;
/// TID (6 bytes) + flags (2 bytes) before each stored vector.
pub const VECTOR_HEADER: usize = 8;

/// A vector tuple's flags: the engine's node flags (gpu_graph_engine::node), widened.
pub const FLAG_DELETED: u16 = gpu_graph_engine::node::DELETED as u16;
pub const FLAG_FREE: u16 = gpu_graph_engine::node::FREE as u16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub degree: usize,
    pub stored_dim: usize,
    /// nodes per chunk (= lists per graph page)
    pub per_chunk: usize,
    /// vector tuples per vector page
    pub per_vector_page: usize,
    pub pages_per_chunk: usize,
}

impl Layout {
    pub fn new(degree: usize, stored_dim: usize) -> Layout {
        let lists = USABLE / (4 * degree);
        let per_vector_page = (USABLE / (VECTOR_HEADER + 4 * stored_dim)).max(1);
        // A chunk of as many nodes as the graph page holds leaves its last
        // vector page part empty (63 lists, 20 tuples a page: 80 slots for 63
        // nodes). A chunk of whole vector pages may fill them all for a few
        // unused lists instead; take whichever needs fewer pages a node.
        let whole = lists / per_vector_page * per_vector_page;
        let pages = |per_chunk: usize| 1 + per_chunk.div_ceil(per_vector_page);
        let per_chunk = if whole > 0 && pages(whole) * lists < pages(lists) * whole { whole } else { lists };
        Layout { degree, stored_dim, per_chunk, per_vector_page, pages_per_chunk: pages(per_chunk) }
    }
    pub fn vector_size(&self) -> usize {
        VECTOR_HEADER + 4 * self.stored_dim
    }
    pub fn graph_block(&self, node: u32) -> u32 {
        1 + (node as usize / self.per_chunk * self.pages_per_chunk) as u32
    }
    pub fn vector_block(&self, node: u32) -> u32 {
        let slot = node as usize % self.per_chunk;
        self.graph_block(node) + 1 + (slot / self.per_vector_page) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn fits_a_page_at_the_limits() {
        for (degree, dim) in [(8, 1), (32, 128), (32, 384), (128, 2000), (8, 2001)] {
            let l = Layout::new(degree, dim);
            assert!(l.per_chunk * 4 * degree <= USABLE);
            assert!(l.per_vector_page * l.vector_size() <= USABLE, "{degree} {dim}");
            let last = l.per_chunk as u32 - 1;
            assert_eq!(l.vector_block(last), l.graph_block(0) + l.pages_per_chunk as u32 - 1);
        }
    }

    #[test]
    fn chunks_of_whole_vector_pages_when_fewer_pages_a_node() {
        // 96 dims: 63 lists, 20 tuples a page; 60 nodes in 4 pages beat 63 in 5
        let l = Layout::new(32, 96);
        assert_eq!((l.per_chunk, l.per_vector_page, l.pages_per_chunk), (60, 20, 4));
        // 128 dims: 15 tuples a page; 60 nodes in 5 pages beat 63 in 6
        let l = Layout::new(32, 128);
        assert_eq!((l.per_chunk, l.pages_per_chunk), (60, 5));
        // 768 dims: 2 a page; 62 nodes in 32 pages beat 63 in 33
        let l = Layout::new(32, 768);
        assert_eq!((l.per_chunk, l.pages_per_chunk), (62, 32));
        // 1 dim: every list fits with its tuples in one vector page
        let l = Layout::new(32, 1);
        assert_eq!((l.per_chunk, l.pages_per_chunk), (63, 2));
    }
}
