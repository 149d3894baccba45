//! The index's pages: the meta page, node pages laid out so that a node id
//! maps to its page by arithmetic, WAL in generic records, and the engine's
//! storage traits over PostgreSQL buffers.
//!
//! - [`layout`]: which page holds node `n`
//! - [`codec`]: what a page's bytes mean (lists, vector tuples, the meta page)
//! - [`buffer`]: locked buffers and generic WAL records over them
//! - [`delta`]: a page's change as a generic WAL record's fragments
//! - [`meta`]: the meta page
//! - [`corrupt`]: the ERROR a damaged page raises
//! - [`page_store`]: the engine's storage traits over buffers
//! - [`writer`]: a whole index at once (CREATE INDEX)

pub mod buffer;
pub mod bulk;
pub mod codec;
pub mod corrupt;
pub mod delta;
pub mod layout;
pub mod meta;
pub mod page_store;
pub mod writer;
