//! The change log: every page of a gpu_graph index that a backend changes
//! (through `storage::buffer::Xlog`, the one way index pages are written
//! after the build) is noted here, in a ring in shared memory, before the
//! page's buffer lock is released and so before the change can commit. The
//! worker reads the ring after it has taken a batch of requests and re-reads
//! the noted pages of the indexes it holds into their copies, so a copy
//! answers with every change committed before the request was submitted.
//!
//! An entry names the nodes of its page that changed (an insert changes
//! one list on each of several graph pages of 63 lists; the worker
//! re-reads those alone), and a change of one list carries the list itself
//! (degree up to 32), so the worker copies it without reading the page,
//! whose buffer lock the writers hold most of the time under inserts. A
//! change that writes one node's row (an insert's new vector) carries the
//! row, as its page holds it, for the same reason.
//!
//! A ring, not a queue: writers never wait for the worker. A reader that
//! falls more than [`CAPACITY`] entries behind has lost changes: it refreshes
//! its copies whole ([`Overflow`]), never answers from one that missed a
//! change.
//!
//! Each entry carries a stamp, its sequence number + 1, stored last (a
//! seqlock): a reader takes an entry only when the stamp says it is whole
//! and still the one it wants.
//!
//! A transaction that noted changes publishes the log's head just before it
//! commits (an xact callback): `published` then covers every change of
//! every committed transaction. A request carries the published position
//! its backend read at submission, so the worker patches its copies only
//! when a request needs changes it has not read yet, not every time an
//! insert in progress writes one more page (an insert writes about ten, one
//! at a time, over a millisecond or more): a patch covers whole inserts, and
//! several when they come fast.

use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgrx::pg_sys;

use super::image::Key;
use super::shmem::shared;

/// Entries the ring holds: 48 bytes each, 3.1 MB of shared memory. Larger
/// bursts (a VACUUM rewriting many lists, a bulk insert) between two
/// requests refresh the copies whole.
pub const CAPACITY: usize = 1 << 16;

/// The longest list a change carries itself (degree 32, the default):
/// the worker then copies it from the log instead of reading its page.
pub const LIST_IN_LOG: usize = 32;

/// Lists the log holds (2.2 MB): the last [`PAYLOADS`] changes' own.
/// A reader further behind reads their pages, as for other changes.
const PAYLOADS: usize = 1 << 14;

pub type List = [u32; LIST_IN_LOG];

/// The row log: 64-byte granules (4 MB), a row in as many consecutive
/// ones as it needs, each stamped with its entry's sequence number + 1 so
/// that a reader takes a row only when every granule still holds it. A
/// 128-dimension f16 row (264 bytes) takes 5: the log holds the last
/// ~13,000 such rows; a reader further behind reads their pages.
const GRANULES: usize = 1 << 16;
const GRANULE_WORDS: usize = 7;
const GRANULE_BYTES: usize = 8 * GRANULE_WORDS;

/// The longest row a change carries: any (a vector tuple fits a page).
pub const ROW_IN_LOG: usize = 8192;

/// A row as its page holds it (a vector tuple's bytes), in 8-byte words
/// so that its vector is 8-aligned as on a page and read in place.
#[derive(Clone, Debug)]
pub struct Row {
    words: Vec<u64>,
    len: usize,
}

impl Row {
    #[cfg(test)]
    pub fn new(bytes: &[u8]) -> Row {
        Row { words: bytes.chunks(8).map(word).collect(), len: bytes.len() }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes (new and
        // ChangeLog::row make it so), and u8 needs no alignment.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.len) }
    }
}

impl PartialEq for Row {
    fn eq(&self, other: &Row) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for Row {}

/// Up to 8 bytes as a word in memory order (zero after their end).
fn word(bytes: &[u8]) -> u64 {
    let mut w = [0; 8];
    w[..bytes.len()].copy_from_slice(bytes);
    u64::from_ne_bytes(w)
}

#[repr(C)]
pub struct ChangeLog {
    /// entries ever noted (the next one's sequence number)
    head: AtomicU64,
    /// the head as the last committing writer saw it: every change of a
    /// committed transaction is below it
    published: AtomicU64,
    entries: [Entry; CAPACITY],
    /// entry `seq`'s list, when it has one, at `seq % PAYLOADS`
    payloads: [Stamped<LIST_WORDS>; PAYLOADS],
    /// granules ever taken by rows (the next row's first, mod GRANULES)
    rows_head: AtomicU64,
    rows: [Stamped<GRANULE_WORDS>; GRANULES],
}

/// W words written under a stamp (a seqlock): 0 while being written, else
/// the seq + 1 of the entry whose list or part of a row they hold. A reader
/// takes the words only when the stamp is the one it wants before and
/// after reading them. One slot of the list payloads, or one granule of
/// the row log.
#[repr(C)]
struct Stamped<const W: usize> {
    stamp: AtomicU64,
    words: [AtomicU64; W],
}

impl<const W: usize> Stamped<W> {
    /// Writes `words` (the rest of the slot left as it was) for entry `seq`.
    fn put(&self, seq: u64, words: impl Iterator<Item = u64>) {
        self.stamp.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        for (to, w) in self.words.iter().zip(words) {
            to.store(w, Ordering::Relaxed);
        }
        self.stamp.store(seq + 1, Ordering::Release);
    }

    /// The words, if entry `seq`'s were whole here before and after reading.
    fn get(&self, seq: u64) -> Option<[u64; W]> {
        if self.stamp.load(Ordering::Acquire) != seq + 1 {
            return None;
        }
        let words = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        (self.stamp.load(Ordering::Relaxed) == seq + 1).then_some(words)
    }
}

/// A list's words in a payload: two ids a word.
const LIST_WORDS: usize = LIST_IN_LOG / 2;
const _: () = assert!(LIST_IN_LOG.is_multiple_of(2));

#[repr(C)]
struct Entry {
    /// 0: being written; else the sequence number + 1 of what it holds
    stamp: AtomicU64,
    spc: AtomicU32,
    db: AtomicU32,
    rel: AtomicU32,
    block: AtomicU32,
    lo: AtomicU32,
    hi: AtomicU32,
    /// 1: the change is node `lo`'s list, in the payloads
    listed: AtomicU32,
    /// not 0: the change is node `lo`'s row, of this many bytes, in the
    /// granules from `row_at` on
    row_len: AtomicU32,
    row_at: AtomicU32,
}

/// A reader fell more than [`CAPACITY`] entries behind.
#[derive(Debug, PartialEq, Eq)]
pub struct Overflow;

/// A page changed: the index's file and the page; when the change is one
/// node's list (`page.lo`), that list as written (NO_NODE after its end);
/// when it is one node's row, that row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub key: Key,
    pub page: PageChange,
    pub list: Option<List>,
    pub row: Option<Row>,
}

/// A block that changed, and which of its nodes' lists or rows did:
/// `lo..hi` (all of them: [`PageChange::whole`]). A reader then re-reads
/// those alone: an insert changes one list on each of ~8 graph pages of 63
/// lists, and a patch that decoded and copied whole pages spent most of
/// its time on lists that had not changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageChange {
    pub block: u32,
    pub lo: u32,
    pub hi: u32,
}

impl PageChange {
    pub const fn whole(block: u32) -> PageChange {
        PageChange { block, lo: 0, hi: u32::MAX }
    }

    /// The changes of `pages` one per block, their nodes merged (the range
    /// that covers them), in block order.
    pub fn merged(pages: &mut Vec<PageChange>) {
        pages.sort_unstable_by_key(|p| p.block);
        pages.dedup_by(|later, kept| {
            let same = later.block == kept.block;
            if same {
                kept.lo = kept.lo.min(later.lo);
                kept.hi = kept.hi.max(later.hi);
            }
            same
        });
    }
}

/// How long a reader waits for an entry a writer has claimed but not yet
/// stamped (a few stores; only a descheduled writer takes longer) before it
/// gives up on the ring as on an overflow.
const CLAIMED_WAIT: Duration = Duration::from_millis(100);

impl ChangeLog {
    /// Notes a change of `page`, carrying node `page.lo`'s `list` or `row`
    /// when it is one of those (a longer row than [`ROW_IN_LOG`] is not).
    fn note(&self, key: Key, page: PageChange, list: Option<&List>, row: Option<&[u8]>) {
        let row = row.filter(|r| !r.is_empty() && r.len() <= ROW_IN_LOG);
        let seq = self.head.fetch_add(1, Ordering::AcqRel);
        let e = &self.entries[(seq % CAPACITY as u64) as usize];
        e.stamp.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        e.spc.store(key.spc, Ordering::Relaxed);
        e.db.store(key.db, Ordering::Relaxed);
        e.rel.store(key.rel, Ordering::Relaxed);
        e.block.store(page.block, Ordering::Relaxed);
        e.lo.store(page.lo, Ordering::Relaxed);
        e.hi.store(page.hi, Ordering::Relaxed);
        e.listed.store(list.is_some() as u32, Ordering::Relaxed);
        e.row_len.store(row.map_or(0, |r| r.len() as u32), Ordering::Relaxed);
        if let Some(row) = row {
            e.row_at.store(self.put_row(seq, row), Ordering::Relaxed);
        }
        if let Some(list) = list {
            let words = list.chunks_exact(2).map(|w| w[0] as u64 | (w[1] as u64) << 32);
            self.payloads[(seq % PAYLOADS as u64) as usize].put(seq, words);
        }
        e.stamp.store(seq + 1, Ordering::Release);
    }

    /// Writes entry `seq`'s row into the next granules; the first's index.
    fn put_row(&self, seq: u64, row: &[u8]) -> u32 {
        let first = self.rows_head.fetch_add(row.len().div_ceil(GRANULE_BYTES) as u64, Ordering::Relaxed);
        for (i, part) in row.chunks(GRANULE_BYTES).enumerate() {
            self.rows[((first + i as u64) % GRANULES as u64) as usize].put(seq, part.chunks(8).map(word));
        }
        (first % GRANULES as u64) as u32
    }

    /// Entry `seq`'s row (`len` bytes from granule `at` on), if every
    /// granule of it still holds it.
    fn row(&self, seq: u64, at: u32, len: u32) -> Option<Row> {
        let len = len as usize;
        let mut words = Vec::with_capacity(len.div_ceil(GRANULE_BYTES) * GRANULE_WORDS);
        for i in 0..len.div_ceil(GRANULE_BYTES) {
            words.extend(self.rows[(at as usize + i) % GRANULES].get(seq)?);
        }
        Some(Row { words, len })
    }

    /// Entry `seq`'s list, if it is still in the payloads.
    fn list(&self, seq: u64) -> Option<List> {
        let words = self.payloads[(seq % PAYLOADS as u64) as usize].get(seq)?;
        Some(std::array::from_fn(|i| (words[i / 2] >> (32 * (i % 2))) as u32))
    }

    /// The next entry's sequence number: where a reader starting now begins.
    pub fn head(&self) -> u64 {
        self.head.load(Ordering::Acquire)
    }

    /// Every change noted so far is below `published` from now on.
    fn publish(&self) {
        self.published.fetch_max(self.head(), Ordering::AcqRel);
    }

    /// What a request submitted now needs its copy to have read up to.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }

    /// Appends the changes from sequence number `from` on to `out`; the
    /// sequence number to read from next time.
    pub fn read(&self, from: u64, out: &mut Vec<Change>) -> Result<u64, Overflow> {
        let head = self.head();
        if head.saturating_sub(from) > CAPACITY as u64 {
            return Err(Overflow);
        }
        for seq in from..head {
            let e = &self.entries[(seq % CAPACITY as u64) as usize];
            let since = Instant::now();
            loop {
                let s = e.stamp.load(Ordering::Acquire);
                if s == seq + 1 {
                    break;
                }
                if s > seq + 1 {
                    // a later lap's: this one is gone
                    return Err(Overflow);
                }
                // 0 or an earlier lap's: claimed by a writer that has not
                // stamped it yet
                if since.elapsed() > CLAIMED_WAIT {
                    return Err(Overflow);
                }
                std::thread::yield_now();
            }
            let key = Key {
                spc: e.spc.load(Ordering::Relaxed),
                db: e.db.load(Ordering::Relaxed),
                rel: e.rel.load(Ordering::Relaxed),
            };
            let page = PageChange {
                block: e.block.load(Ordering::Relaxed),
                lo: e.lo.load(Ordering::Relaxed),
                hi: e.hi.load(Ordering::Relaxed),
            };
            let listed = e.listed.load(Ordering::Relaxed) == 1;
            let (row_len, row_at) = (e.row_len.load(Ordering::Relaxed), e.row_at.load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if e.stamp.load(Ordering::Relaxed) != seq + 1 {
                return Err(Overflow);
            }
            // a list or row overwritten since: its page is read instead
            let list = if listed { self.list(seq) } else { None };
            let row = if row_len > 0 { self.row(seq, row_at, row_len) } else { None };
            out.push(Change { key, page, list, row });
        }
        Ok(head)
    }
}

/// Whether this process noted changes its transaction has not published.
static UNPUBLISHED: AtomicBool = AtomicBool::new(false);

/// Whether this process's transaction wrote index pages it has not
/// published yet (its searches then need the copy to hold them too).
pub fn unpublished() -> bool {
    UNPUBLISHED.load(Ordering::Relaxed)
}

/// Notes that `pages` of `rel` changed, with the one list or row each
/// wrote when it did (a backend's Xlog, before it lets go of the
/// buffers). Nothing when gpu_graph is not preloaded (no worker).
///
/// # Safety
/// `rel` must be an open relation.
pub unsafe fn note(rel: pg_sys::Relation, pages: &[PageChange], lists: &[Option<List>], rows: &[Option<&[u8]>]) {
    let Some(s) = shared() else { return };
    UNPUBLISHED.store(true, Ordering::Relaxed);
    // SAFETY: an open relation (the caller's contract).
    let key = unsafe { Key::of_relation(rel) };
    for ((&page, list), &row) in pages.iter().zip(lists).zip(rows) {
        s.changes.note(key, page, list.as_ref(), row);
    }
}

/// Registers [`before_commit`] (from _PG_init, in every process that loads
/// gpu_graph).
pub fn register() {
    // SAFETY: called while the library loads, on the process's only
    // thread; the callback lives as long as the library.
    unsafe { pg_sys::RegisterXactCallback(Some(before_commit), std::ptr::null_mut()) };
}

/// Publishes this process's changes just before its transaction (or a
/// parallel worker's part of one, or a PREPARE) commits.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn before_commit(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    if matches!(event, XACT_EVENT_PRE_COMMIT | XACT_EVENT_PARALLEL_PRE_COMMIT | XACT_EVENT_PRE_PREPARE)
        && UNPUBLISHED.swap(false, Ordering::Relaxed)
    {
        if let Some(s) = shared() {
            s.changes.publish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log() -> Box<ChangeLog> {
        // all zero, as shared memory starts
        // SAFETY: every field is an atomic integer, for which zero is valid.
        unsafe { Box::new_zeroed().assume_init() }
    }

    fn change(rel: u32, block: u32) -> Change {
        Change {
            key: Key { spc: 1, db: 2, rel },
            page: PageChange { block, lo: block * 3, hi: block * 3 + 1 },
            list: None,
            row: None,
        }
    }

    fn put(l: &ChangeLog, c: &Change) {
        l.note(c.key, c.page, c.list.as_ref(), c.row.as_ref().map(Row::bytes));
    }

    /// A change writing a row of `len` bytes, each `first` + its place.
    fn rowed(block: u32, first: u8, len: usize) -> Change {
        let bytes: Vec<u8> = (0..len).map(|i| first.wrapping_add(i as u8)).collect();
        Change { row: Some(Row::new(&bytes)), ..change(5, block) }
    }

    fn listed(block: u32, first: u32) -> Change {
        Change { list: Some(std::array::from_fn(|i| first + i as u32)), ..change(5, block) }
    }

    #[test]
    fn a_list_comes_with_its_change_until_overwritten() {
        let l = log();
        put(&l, &listed(1, 100));
        put(&l, &change(5, 2));
        let mut out = Vec::new();
        assert_eq!(l.read(0, &mut out), Ok(2));
        assert_eq!(out, vec![listed(1, 100), change(5, 2)]);
        // PAYLOADS more listed changes overwrite the first one's list: that
        // change comes without it (its page is read), the later ones with
        for b in 0..PAYLOADS as u32 {
            put(&l, &listed(b, b));
        }
        out.clear();
        assert_eq!(l.read(0, &mut out), Ok(2 + PAYLOADS as u64));
        assert_eq!(out[0], Change { list: None, ..listed(1, 100) });
        assert_eq!(out[2], listed(0, 0));
        assert_eq!(out[1 + PAYLOADS], listed(PAYLOADS as u32 - 1, PAYLOADS as u32 - 1));
    }

    #[test]
    fn a_row_comes_with_its_change_until_overwritten() {
        let l = log();
        // 264 bytes: a 128-dimension f16 row, 5 granules
        put(&l, &rowed(1, 7, 264));
        put(&l, &change(5, 2));
        let mut out = Vec::new();
        assert_eq!(l.read(0, &mut out), Ok(2));
        assert_eq!(out, vec![rowed(1, 7, 264), change(5, 2)]);
        assert_eq!(out[0].row.as_ref().unwrap().bytes().len(), 264);
        // rows of one granule fill the rest of the ring, then one more
        // takes the first row's first granule (its others still hold it):
        // that change comes without its row (its page is read), the
        // later ones with theirs
        let more = GRANULES as u32 - 5 + 1;
        for b in 0..more {
            put(&l, &rowed(b, b as u8, GRANULE_BYTES));
        }
        out.clear();
        assert_eq!(l.read(0, &mut out), Ok(2 + more as u64));
        assert_eq!(out[0], Change { row: None, ..rowed(1, 7, 264) });
        assert_eq!(out[1], change(5, 2));
        assert_eq!(out[2], rowed(0, 0, GRANULE_BYTES));
        assert_eq!(out[1 + more as usize], rowed(more - 1, (more - 1) as u8, GRANULE_BYTES));
    }

    #[test]
    fn a_row_being_written_or_rewritten_is_not_taken() {
        let l = log();
        put(&l, &rowed(1, 3, 3 * GRANULE_BYTES + 1));
        let mut out = Vec::new();
        let read = |out: &mut Vec<Change>| {
            out.clear();
            l.read(0, out).unwrap();
            out[0].row.clone()
        };
        assert_eq!(read(&mut out), rowed(1, 3, 3 * GRANULE_BYTES + 1).row);
        // a writer has claimed its last granule (stamp 0) or finished
        // writing it for a later entry: the row is not taken
        for stamp in [0, 2] {
            l.rows[3].stamp.store(stamp, Ordering::Relaxed);
            assert_eq!(read(&mut out), None);
            assert_eq!(out[0], change(5, 1));
        }
        l.rows[3].stamp.store(1, Ordering::Relaxed);
        assert_eq!(read(&mut out), rowed(1, 3, 3 * GRANULE_BYTES + 1).row);
    }

    #[test]
    fn rows_longer_than_the_log_takes_are_not_carried() {
        let l = log();
        put(&l, &rowed(1, 0, ROW_IN_LOG + 1));
        let mut out = Vec::new();
        assert_eq!(l.read(0, &mut out), Ok(1));
        assert_eq!(out, vec![change(5, 1)]);
    }

    #[test]
    fn changes_of_a_block_merge_into_the_range_of_their_nodes() {
        let p = |block, lo, hi| PageChange { block, lo, hi };
        let mut pages = vec![p(7, 10, 11), p(3, 0, u32::MAX), p(7, 4, 5), p(3, 8, 9), p(9, 1, 2), p(7, 12, 13)];
        PageChange::merged(&mut pages);
        assert_eq!(pages, vec![PageChange::whole(3), p(7, 4, 13), p(9, 1, 2)]);
    }

    #[test]
    fn a_reader_gets_every_change_once_in_order() {
        let l = log();
        let mut out = Vec::new();
        assert_eq!(l.read(0, &mut out), Ok(0));
        put(&l, &change(5, 1));
        put(&l, &change(6, 0));
        let next = l.read(0, &mut out).unwrap();
        assert_eq!((next, out.clone()), (2, vec![change(5, 1), change(6, 0)]));
        out.clear();
        put(&l, &change(5, 9));
        assert_eq!(l.read(next, &mut out), Ok(3));
        assert_eq!(out, vec![change(5, 9)]);
    }

    #[test]
    fn published_covers_what_was_noted_before() {
        let l = log();
        put(&l, &change(5, 1));
        assert_eq!(l.published(), 0);
        l.publish();
        put(&l, &change(5, 2));
        assert_eq!(l.published(), 1);
        l.publish();
        assert_eq!(l.published(), 2);
    }

    #[test]
    fn a_reader_lapped_by_the_writers_is_told() {
        let l = log();
        for b in 0..=CAPACITY as u32 {
            put(&l, &change(5, b));
        }
        let mut out = Vec::new();
        assert_eq!(l.read(0, &mut out), Err(Overflow));
        // one lap behind exactly still reads
        assert_eq!(l.read(1, &mut out), Ok(CAPACITY as u64 + 1));
        assert_eq!(out.len(), CAPACITY);
        assert_eq!(out[0], change(5, 1));
    }
}
