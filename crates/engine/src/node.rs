//! The state of a node, as one set of bits everywhere it is stored: the
//! in-memory store, a [`crate::flat::FlatIndex`], the index pages (widened to
//! u16 in a vector tuple's header) and the GPU kernels (`kernels/abi.h`,
//! `GG_NODE_*`, checked against these by the GPU crate's ABI test).

/// Deleted: still traversed (its edges keep the graph navigable until VACUUM
/// repairs the lists that point at it), never a result.
pub const DELETED: u8 = 1;
/// Free: no node in this slot (VACUUM freed it, or it was never written);
/// neither traversed nor a result. Its list is empty.
pub const FREE: u8 = 2;
/// A live node: neither bit.
pub const LIVE: u8 = 0;

/// Whether a node with these flags may be returned by a search.
#[inline]
pub fn is_result(flags: u8) -> bool {
    flags & (DELETED | FREE) == 0
}
