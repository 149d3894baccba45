//! The index's pages: the meta page, node pages laid out so that a node id
//! maps to its page by arithmetic, WAL through GenericXLog, and the engine's
//! storage traits over PostgreSQL buffers.

pub mod buffer;
pub mod layout;
pub mod meta;
pub mod page_store;
pub mod writer;
