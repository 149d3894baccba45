//! The meta page's two changing fields that a scan the worker answers
//! needs (the generation and the node count), for each index written or
//! scanned since the server started, in shared memory: such a scan then
//! neither pins nor locks the meta page.
//!
//! Every scan read the meta page, and every insert locks it exclusively to
//! take a node id (and, every chunk of nodes, while it extends the
//! relation). Beside 5,000 inserts/s at 64 clients a searching backend
//! spent ~2% of its time waiting for that page's content lock (H100 and
//! H200, docs/benchmarks.md), and at read-only every scan's pin and share
//! lock are four atomic operations on two lines that every core takes in
//! turn.
//!
//! The rule that makes the mirror safe to read in place of the page:
//! every write of the meta page goes through `storage::buffer::Xlog`,
//! which notes it here (`advance`) while the writer still holds the
//! page's exclusive lock, so before it can commit; and the mirror is
//! written nowhere else but under the page's lock with what the page
//! holds (a scan that read the page, `seen`; a build, which holds the
//! index exclusively, `built`). Both fields only grow, so the entry an
//! index's readers and writers find first is at least what the page held
//! when any committed change was made. A request whose generation is
//! newer than a copy's is only stricter, and a node count beyond what a
//! scan may see names nodes whose rows the executor's visibility check
//! drops. A build sets its entry (a file name used again never inherits
//! an older index's values), and the worker clears the entries of files
//! gone (`sweep`): a reader that then misses reads the page, and claims
//! the entry again under its lock. On a standby (recovery writes the
//! pages, not this) the page is read.
//!
//! The fields that never change after the first row (dimensions, metric,
//! layout) come from the relation cache (`rd_amcache`), which PostgreSQL
//! drops whenever the index is rebuilt or altered.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use pgrx::pg_sys;

use super::image::Key;
use super::shmem::shared;
use crate::storage::meta::Meta;

/// Indexes the mirror holds; an index beyond them is read from its page.
pub const ENTRIES: usize = 1024;

/// One index's fields, on a line of its own (read by every scan, written
/// by every insert into that index alone).
#[repr(C, align(64))]
struct Entry {
    /// db << 32 | relfilenode, 0 while unused: claimed by compare-and-swap
    /// (to CLAIMING, then the name)
    name: AtomicU64,
    /// the tablespace, stored before the name (and cleared before it)
    spc: AtomicU32,
    node_count: AtomicU32,
    generation: AtomicU64,
}

/// `Entry::name` while its claimer writes the key (never a real name: no
/// database has OID 2^32 - 1).
const CLAIMING: u64 = u64::MAX;

impl Entry {
    /// The name, once no claim is half done (a claimer stores the
    /// tablespace and the name right after its compare-and-swap).
    fn name_settled(&self) -> u64 {
        loop {
            let n = self.name.load(Ordering::Acquire);
            if n != CLAIMING {
                return n;
            }
            std::hint::spin_loop();
        }
    }
}

#[repr(C)]
pub struct MetaMirror {
    entries: [Entry; ENTRIES],
}

impl MetaMirror {
    /// The entry of `key`; with `claim`, an unused one becomes it (None:
    /// none found, or the table is full).
    fn entry(&self, key: Key, claim: bool) -> Option<&Entry> {
        let name = (key.db as u64) << 32 | key.rel as u64;
        let start = (name.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize % ENTRIES;
        for i in 0..ENTRIES {
            let e = &self.entries[(start + i) % ENTRIES];
            let mut found = e.name_settled();
            if found == 0 {
                if !claim {
                    return None;
                }
                // the tablespace before the name: whoever reads the name
                // reads the whole key
                match e.name.compare_exchange(0, CLAIMING, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        e.spc.store(key.spc, Ordering::Relaxed);
                        e.name.store(name, Ordering::Release);
                        return Some(e);
                    }
                    Err(_) => found = e.name_settled(),
                }
            }
            // (another key; the same name in another tablespace; or an entry
            // being cleared, whose tablespace is already 0)
            if found == name && e.spc.load(Ordering::Acquire) == key.spc {
                return Some(e);
            }
        }
        None
    }

    /// A write of `key`'s meta page, under its exclusive lock: the fields
    /// grow to what the page now holds.
    pub fn advance(&self, key: Key, generation: u64, node_count: u32) {
        if let Some(e) = self.entry(key, true) {
            e.generation.fetch_max(generation, Ordering::AcqRel);
            e.node_count.fetch_max(node_count, Ordering::AcqRel);
        }
    }

    /// A build's meta page: the entry holds exactly its fields (a file name
    /// may be used again after its index was dropped).
    pub fn set(&self, key: Key, generation: u64, node_count: u32) {
        if let Some(e) = self.entry(key, true) {
            e.generation.store(generation, Ordering::Release);
            e.node_count.store(node_count, Ordering::Release);
        }
    }

    /// Clears the entries whose index is gone (`exists` false: its file
    /// has no pages), so that their places serve other indexes: the
    /// fields first, the name last.
    pub fn sweep(&self, exists: impl Fn(Key) -> bool) {
        for e in &self.entries {
            let name = e.name.load(Ordering::Acquire);
            let spc = e.spc.load(Ordering::Acquire);
            if name == 0 || name == CLAIMING || spc == 0 {
                continue;
            }
            let key = Key { spc, db: (name >> 32) as u32, rel: name as u32 };
            if !exists(key) {
                // the count first: a reader that takes the generation (read
                // first) from before this finds the count zero, a miss
                e.node_count.store(0, Ordering::Release);
                e.generation.store(0, Ordering::Release);
                e.spc.store(0, Ordering::Release);
                e.name.store(0, Ordering::Release);
            }
        }
    }

    /// (generation, node count) of `key`, when the mirror holds it (a
    /// count of zero, an entry being cleared or an index without a row yet,
    /// is a miss).
    pub fn get(&self, key: Key) -> Option<(u64, u32)> {
        let e = self.entry(key, false)?;
        // (read after the writers' release: at least the page's values as
        // of any change committed before this scan began)
        let generation = e.generation.load(Ordering::Acquire);
        let node_count = e.node_count.load(Ordering::Acquire);
        (node_count > 0).then_some((generation, node_count))
    }
}

fn key_of(rel: pg_sys::Relation) -> Key {
    // SAFETY: callers pass an open relation.
    unsafe { Key::of_relation(rel) }
}

/// Whether the mirror may stand for the page: the server preloads
/// gpu_graph and is not replaying WAL.
fn usable() -> bool {
    // SAFETY: reads shared memory's recovery state; any backend may.
    shared().is_some() && !unsafe { pg_sys::RecoveryInProgress() }
}

/// [`usable`], and the scans of this session ask the worker (others read
/// the page whole for their CPU search).
fn for_worker() -> bool {
    usable() && super::client::wanted()
}

/// From `storage::buffer::Xlog::finish`: the meta page of `rel` was just
/// written with `meta_bytes` (its contents), its lock still held.
///
/// # Safety
/// `rel` must be an open relation.
pub unsafe fn written(rel: pg_sys::Relation, meta_bytes: &[u8]) {
    let Some(s) = shared() else { return };
    if meta_bytes.len() < std::mem::size_of::<Meta>() {
        return;
    }
    // SAFETY: at least size_of::<Meta>() bytes (checked), a plain-data
    // struct for which any bytes are a value; read unaligned.
    let m: Meta = unsafe { std::ptr::read_unaligned(meta_bytes.as_ptr() as *const Meta) };
    s.meta_mirror.advance(key_of(rel), m.generation, m.node_count);
}

/// From the end of a build: `meta` is what the index's meta page holds now.
///
/// # Safety
/// `rel` must be an open relation.
pub unsafe fn built(rel: pg_sys::Relation, meta: &Meta) {
    if let Some(s) = shared() {
        s.meta_mirror.set(key_of(rel), meta.generation, meta.node_count);
    }
}

/// The meta page as a scan the worker answers needs it, without reading
/// the page: the relation cache's copy with the mirror's generation and
/// node count. None when either lacks it (the caller reads the page, then
/// calls [`seen`]). Its entry point, free list and pinned rows are the
/// cached copy's: a scan that searches on the CPU reads the page.
///
/// # Safety
/// `rel` must be an open gpu_graph index.
pub unsafe fn for_scan(rel: pg_sys::Relation) -> Option<Meta> {
    if !for_worker() {
        return None;
    }
    // SAFETY: an open relation (the caller's contract); rd_amcache is ours
    // (no other code of this access method uses it), null or a Meta that
    // `seen` put there.
    let cached = unsafe { (*rel).rd_amcache as *const Meta };
    if cached.is_null() {
        return None;
    }
    let (generation, node_count) = shared()?.meta_mirror.get(key_of(rel))?;
    // SAFETY: as above.
    let mut m = unsafe { *cached };
    m.generation = generation;
    m.node_count = node_count;
    Some(m)
}

/// The index's degree (fixed at its build) for the planner's estimate:
/// the relation cache's copy, else the page's (which a scan may then cache).
///
/// # Safety
/// `rel` must be an open gpu_graph index.
pub unsafe fn degree(rel: pg_sys::Relation) -> u32 {
    // SAFETY: as in `for_scan`.
    let cached = unsafe { (*rel).rd_amcache as *const Meta };
    if !cached.is_null() {
        // SAFETY: as in `for_scan`.
        return unsafe { (*cached).degree };
    }
    // SAFETY: the caller's contract; `seen` runs under the page's lock.
    unsafe { Meta::read_then(rel, |m| seen(rel, m)).degree }
}

/// A scan read `meta` from the page and still holds its share lock: the
/// relation cache keeps its copy (once it has dimensions, which never
/// change after), and the mirror takes its fields.
///
/// # Safety
/// `rel` must be an open gpu_graph index whose meta page's lock the
/// caller holds (`Meta::read_then`).
pub unsafe fn seen(rel: pg_sys::Relation, meta: &Meta) {
    if !usable() || meta.dim == 0 {
        return;
    }
    // SAFETY: an open relation (the caller's contract): its index memory
    // context lives as long as its relcache entry, which frees rd_amcache
    // when it is rebuilt.
    unsafe {
        if (*rel).rd_amcache.is_null() {
            let p = pg_sys::MemoryContextAlloc((*rel).rd_indexcxt, std::mem::size_of::<Meta>()) as *mut Meta;
            p.write(*meta);
            (*rel).rd_amcache = p as *mut std::ffi::c_void;
        }
    }
    if let Some(s) = shared() {
        s.meta_mirror.advance(key_of(rel), meta.generation, meta.node_count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mirror() -> Box<MetaMirror> {
        // SAFETY: every field is an atomic integer, for which zero is valid
        // (shared memory starts zeroed).
        unsafe { Box::new_zeroed().assume_init() }
    }

    fn key(rel: u32) -> Key {
        Key { spc: 1663, db: 5, rel }
    }

    #[test]
    fn fields_only_grow_and_a_build_sets_them() {
        let m = mirror();
        assert_eq!(m.get(key(7)), None);
        m.advance(key(7), 10, 100);
        m.advance(key(7), 9, 120);
        assert_eq!(m.get(key(7)), Some((10, 120)));
        m.set(key(7), 0, 5);
        assert_eq!(m.get(key(7)), Some((0, 5)));
        m.set(key(7), 3, 0);
        assert_eq!(m.get(key(7)), None, "no rows yet: read the page");
        m.set(key(7), 0, 5);
        // an index gone: its entry is cleared, and another takes the place
        m.advance(key(9), 4, 4);
        m.sweep(|k| k.rel != 7);
        assert_eq!(m.get(key(7)), None);
        assert_eq!(m.get(key(9)), Some((4, 4)));
        m.advance(key(7), 2, 2);
        assert_eq!(m.get(key(7)), Some((2, 2)));
        assert_eq!(m.get(key(8)), None);
        // the same file name in another tablespace is another index
        let other = Key { spc: 1664, ..key(7) };
        assert_eq!(m.get(other), None);
        m.advance(other, 3, 3);
        assert_eq!(m.get(other), Some((3, 3)));
        assert_eq!(m.get(key(7)), Some((2, 2)));
    }

    #[test]
    fn a_full_table_holds_no_more() {
        let m = mirror();
        for rel in 1..=ENTRIES as u32 {
            m.advance(key(rel), rel as u64, rel);
        }
        for rel in 1..=ENTRIES as u32 {
            assert_eq!(m.get(key(rel)), Some((rel as u64, rel)));
        }
        m.advance(key(ENTRIES as u32 + 1), 1, 1);
        assert_eq!(m.get(key(ENTRIES as u32 + 1)), None);
    }
}
