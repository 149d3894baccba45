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

/// How the vector pages store each coordinate: the index option `storage`.
/// The graph is built on the f32 input either way; scans compute distances
/// from the stored values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    F32,
    /// IEEE half, rounded to nearest: half the pages, WAL, upload and GPU
    /// memory
    F16,
}

impl Element {
    pub fn bytes(self) -> usize {
        match self {
            Element::F32 => 4,
            Element::F16 => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Element::F32 => "f32",
            Element::F16 => "f16",
        }
    }
    pub fn from_name(name: &str) -> Option<Element> {
        [Element::F32, Element::F16].into_iter().find(|e| e.name() == name)
    }
    /// The most dimensions an index of this storage takes (a vector tuple
    /// must fit a page: 2040 f32 or 4080 f16 stored coordinates, and inner
    /// product stores one more).
    pub fn max_dim(self) -> usize {
        match self {
            Element::F32 => 2000,
            Element::F16 => 4000,
        }
    }
}

/// A vector tuple's flags: the engine's node flags (gpu_graph_engine::node), widened.
pub const FLAG_DELETED: u16 = gpu_graph_engine::node::DELETED as u16;
pub const FLAG_FREE: u16 = gpu_graph_engine::node::FREE as u16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub degree: usize,
    pub stored_dim: usize,
    pub element: Element,
    /// nodes per chunk (= lists per graph page)
    pub per_chunk: usize,
    /// vector tuples per vector page
    pub per_vector_page: usize,
    pub pages_per_chunk: usize,
}

impl Layout {
    pub fn new(degree: usize, stored_dim: usize, element: Element) -> Layout {
        let lists = USABLE / (4 * degree);
        let per_vector_page = (USABLE / (VECTOR_HEADER + element.bytes() * stored_dim)).max(1);
        // A chunk of as many nodes as the graph page holds leaves its last
        // vector page part empty (63 lists, 20 tuples a page: 80 slots for 63
        // nodes). A chunk of whole vector pages may fill them all for a few
        // unused lists instead; take whichever needs fewer pages a node.
        let whole = lists / per_vector_page * per_vector_page;
        let pages = |per_chunk: usize| 1 + per_chunk.div_ceil(per_vector_page);
        let per_chunk = if whole > 0 && pages(whole) * lists < pages(lists) * whole { whole } else { lists };
        Layout { degree, stored_dim, element, per_chunk, per_vector_page, pages_per_chunk: pages(per_chunk) }
    }
    pub fn vector_size(&self) -> usize {
        VECTOR_HEADER + self.element.bytes() * self.stored_dim
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
        for (degree, dim, e) in [
            (8, 1, Element::F32),
            (32, 128, Element::F32),
            (32, 384, Element::F16),
            (128, 2000, Element::F32),
            (8, 2001, Element::F32),
            (32, 4001, Element::F16),
            (128, 4001, Element::F16),
        ] {
            assert!(dim <= e.max_dim() + 1, "inner product stores one more");
            let l = Layout::new(degree, dim, e);
            assert!(l.per_chunk * 4 * degree <= USABLE);
            assert!(l.per_vector_page * l.vector_size() <= USABLE, "{degree} {dim}");
            let last = l.per_chunk as u32 - 1;
            assert_eq!(l.vector_block(last), l.graph_block(0) + l.pages_per_chunk as u32 - 1);
        }
    }

    #[test]
    fn chunks_of_whole_vector_pages_when_fewer_pages_a_node() {
        // 96 dims: 63 lists, 20 tuples a page; 60 nodes in 4 pages beat 63 in 5
        let l = Layout::new(32, 96, Element::F32);
        assert_eq!((l.per_chunk, l.per_vector_page, l.pages_per_chunk), (60, 20, 4));
        // 128 dims: 15 tuples a page; 60 nodes in 5 pages beat 63 in 6
        let l = Layout::new(32, 128, Element::F32);
        assert_eq!((l.per_chunk, l.pages_per_chunk), (60, 5));
        // 768 dims: 2 a page; 62 nodes in 32 pages beat 63 in 33
        let l = Layout::new(32, 768, Element::F32);
        assert_eq!((l.per_chunk, l.pages_per_chunk), (62, 32));
        // f16, 768 dims: 5 a page; 60 nodes in 13 pages beat 63 in 14
        let l = Layout::new(32, 768, Element::F16);
        assert_eq!((l.per_chunk, l.per_vector_page, l.pages_per_chunk), (60, 5, 13));
        // 1 dim: every list fits with its tuples in one vector page
        let l = Layout::new(32, 1, Element::F32);
        assert_eq!((l.per_chunk, l.pages_per_chunk), (63, 2));
    }
}
