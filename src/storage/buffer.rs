//! Buffers with their lock held, and generic WAL records over them.
//!
//! Every page of the index uses the whole area after the page header as
//! contents, with pd_lower = pd_upper = BLCKSZ so that neither a generic WAL record nor
//! log_newpage_range mistakes any of it for a hole (`codec` formats them).

use pgrx::pg_sys;

use super::bulk::{relation_needs_wal, Image};
use super::codec::{PageMut, PageRef};
use super::delta::page_delta;
use super::layout::{Layout, BLCKSZ};
use crate::worker::{ChangedList, PageChange, LIST_IN_LOG, ROW_IN_LOG};
use gpu_graph_engine::NO_NODE;

/// A pinned buffer with its content lock held; both released on drop.
pub struct Locked {
    pub buf: pg_sys::Buffer,
}

impl Locked {
    /// # Safety
    /// `rel` must be an open relation and `block` exist in its main fork.
    pub unsafe fn read(rel: pg_sys::Relation, block: u32, exclusive: bool) -> Locked {
        let mode = if exclusive { pg_sys::BUFFER_LOCK_EXCLUSIVE } else { pg_sys::BUFFER_LOCK_SHARE };
        // SAFETY: `rel` is an open relation (the caller's contract); a block
        // that does not exist is an ERROR of ReadBufferExtended, and the
        // buffer either returns is pinned, so it can be locked.
        unsafe {
            let buf = recent::pin(rel, block);
            pg_sys::LockBuffer(buf, mode as i32);
            Locked { buf }
        }
    }

    /// Extends the relation's `fork` by one page, returned locked
    /// exclusively (PageInit not done: the caller formats it).
    ///
    /// # Safety
    /// `rel` must be an open index relation; in the main fork, the caller
    /// serialises extension (the relation extension lock, or a relation no
    /// one else can see yet).
    pub unsafe fn extend(rel: pg_sys::Relation, fork: pg_sys::ForkNumber::Type) -> Locked {
        // SAFETY: as for `read`; P_NEW makes ReadBufferExtended add a block.
        unsafe {
            let buf = pg_sys::ReadBufferExtended(
                rel,
                fork,
                pg_sys::InvalidBlockNumber, // P_NEW
                pg_sys::ReadBufferMode::RBM_NORMAL,
                std::ptr::null_mut(),
            );
            pg_sys::LockBuffer(buf, pg_sys::BUFFER_LOCK_EXCLUSIVE as i32);
            Locked { buf }
        }
    }

    pub fn block(&self) -> pg_sys::BlockNumber {
        // SAFETY: the buffer is pinned while `self` lives.
        unsafe { pg_sys::BufferGetBlockNumber(self.buf) }
    }

    /// The page in the buffer, read in place.
    ///
    /// # Safety
    /// Nothing may write the buffer while the view lives: under an exclusive
    /// lock, no Xlog::finish or in-place write of this buffer meanwhile.
    pub unsafe fn page(&self) -> PageRef<'_> {
        // SAFETY: the buffer is pinned and locked while `self` lives, so its
        // page is a MAXALIGNed BLCKSZ image no other process writes; this
        // process does not either (the caller's contract).
        unsafe { PageRef::new(pg_sys::BufferGetPage(self.buf)) }
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        // on an ERROR, PostgreSQL's abort releases locks and pins itself
        if !std::thread::panicking() {
            // SAFETY: `self` holds the pin and the lock this releases, once.
            unsafe { pg_sys::UnlockReleaseBuffer(self.buf) };
        }
    }
}

/// A record's most pages (generic_xlog.c's MAX_GENERIC_XLOG_PAGES: what
/// generic_redo replays).
const MAX_PAGES: usize = 4;

/// One WAL record over up to four locked buffers, in the format of
/// PostgreSQL's generic WAL records (resource manager RM_GENERIC_ID), which
/// every server replays without this extension: the changes are made to
/// private copies of the pages, then applied and logged at once as
/// GenericXLogFinish does, each page's change found by [`page_delta`]
/// rather than its byte-by-byte comparison (see `delta`).
pub struct Xlog {
    rel: pg_sys::Relation,
    /// the pages registered (and the nodes changed on each), for the
    /// change log
    pages: [PageChange; MAX_PAGES],
    /// a page's one changed list, when it fits the change log
    lists: [Option<ChangedList>; MAX_PAGES],
    /// the buffers registered, and a page's one changed row (its node),
    /// which `finish` reads from the buffer for the change log (as it
    /// reads the meta page's contents, when the meta page is one)
    bufs: [pg_sys::Buffer; MAX_PAGES],
    rows: [Option<(u32, Layout)>; MAX_PAGES],
    /// each page's new image, and whether it is logged whole (a new page)
    images: [Option<Box<Image>>; MAX_PAGES],
    fresh: [bool; MAX_PAGES],
    registered: usize,
}

impl Xlog {
    /// # Safety
    /// `rel` must be an open index relation, and each buffer registered
    /// stay locked exclusively until `finish` returns.
    pub unsafe fn start(rel: pg_sys::Relation) -> Xlog {
        Xlog {
            rel,
            pages: [PageChange::whole(0); MAX_PAGES],
            lists: [None; MAX_PAGES],
            bufs: [0; MAX_PAGES],
            rows: [None; MAX_PAGES],
            images: Default::default(),
            fresh: [false; MAX_PAGES],
            registered: 0,
        }
    }

    /// Registers a buffer locked exclusively by the caller; returns the image
    /// of its page to modify, which the record applies at [`Xlog::finish`].
    /// `fresh` logs the full image (a new page).
    pub fn register(&mut self, locked: &Locked, fresh: bool) -> PageMut<'_> {
        // a page registered again is changed further in the same image (as
        // GenericXLogRegisterBuffer does)
        let i = match self.bufs[..self.registered].iter().position(|&b| b == locked.buf) {
            Some(i) => i,
            None => {
                let i = self.registered;
                if i == MAX_PAGES {
                    // (a caller's bug, as GenericXLogRegisterBuffer's ERROR)
                    pgrx::error!("gpu_graph: a WAL record over more than {MAX_PAGES} pages");
                }
                self.pages[i] = PageChange::whole(locked.block());
                self.bufs[i] = locked.buf;
                self.fresh[i] = fresh;
                self.registered += 1;
                // (copied into uninitialised memory: zeroing 8 KB first was
                // as much again, ~35 times an insert)
                let mut image = Box::<Image>::new_uninit();
                // SAFETY: the buffer is pinned and locked exclusively
                // (`locked`, the caller's contract): its page is BLCKSZ
                // bytes no one writes meanwhile; the image is BLCKSZ bytes,
                // all written here.
                self.images[i] = Some(unsafe {
                    std::ptr::copy_nonoverlapping(
                        pg_sys::BufferGetPage(locked.buf) as *const u8,
                        image.as_mut_ptr() as *mut u8,
                        BLCKSZ,
                    );
                    image.assume_init()
                });
                i
            }
        };
        let image = self.images[i].as_mut().expect("a registered page has its image");
        // SAFETY: the image is MAXALIGNed BLCKSZ bytes that only this view
        // uses until the borrow of `self` ends.
        unsafe { PageMut::new(image.0.as_mut_ptr() as pg_sys::Page) }
    }

    /// Tells the change log that only `nodes`' lists or rows changed on the
    /// page registered last (else the whole page is read again).
    pub fn only(&mut self, nodes: std::ops::Range<u32>) {
        if let Some(p) = self.pages[..self.registered].last_mut() {
            (p.lo, p.hi) = (nodes.start, nodes.end);
        }
    }

    /// [`Xlog::only`] one node, whose new list is `list` (of `degree`
    /// places): the change log carries it when it fits, and the worker
    /// need not read the page.
    pub fn only_list(&mut self, node: u32, list: &[u32], degree: usize) {
        self.only(node..node + 1);
        if degree <= LIST_IN_LOG && list.len() <= degree && self.registered > 0 {
            let mut l = [NO_NODE; LIST_IN_LOG];
            l[..list.len()].copy_from_slice(list);
            self.lists[self.registered - 1] = Some(l);
        }
    }

    /// [`Xlog::only`] one node, whose vector tuple (the row) was written
    /// on the page registered last (in `layout`): the change log carries
    /// the row as the page holds it when it fits, and the worker need not
    /// read the page.
    pub fn only_row(&mut self, node: u32, layout: &Layout) {
        self.only(node..node + 1);
        if layout.vector_size() <= ROW_IN_LOG && self.registered > 0 {
            self.rows[self.registered - 1] = Some((node, *layout));
        }
    }

    /// Applies the changes to the buffers and logs them; then notes the
    /// pages in the search worker's change log while the caller still holds
    /// their locks exclusively (so before anyone reads them, and before a
    /// commit).
    pub fn finish(self) {
        let n = self.registered;
        // SAFETY: `rel` is open (start's contract); each buffer registered
        // is pinned and locked exclusively until after this returns.
        unsafe {
            let page = |i: usize| pg_sys::BufferGetPage(self.bufs[i]);
            let images: [&[u8]; MAX_PAGES] = std::array::from_fn(|i| self.images[i].as_ref().map_or(&[][..], |m| &m.0));
            if relation_needs_wal(self.rel) {
                // the changes found before the critical section (they allocate)
                let deltas: Vec<Option<Vec<u8>>> = (0..n)
                    .map(|i| {
                        let old = std::slice::from_raw_parts(page(i) as *const u8, BLCKSZ);
                        // a page with a hole (none of ours: see the top) is
                        // logged whole rather than reason about it here
                        (!self.fresh[i] && no_hole(old) && no_hole(images[i])).then(|| {
                            let mut d = Vec::with_capacity(256);
                            page_delta(old, images[i], &mut d);
                            d
                        })
                    })
                    .collect();
                pg_sys::XLogBeginInsert();
                pg_sys::CritSectionCount += 1;
                for (i, delta) in deltas.iter().enumerate() {
                    std::ptr::copy_nonoverlapping(images[i].as_ptr(), page(i) as *mut u8, BLCKSZ);
                    pg_sys::MarkBufferDirty(self.bufs[i]);
                    let whole = if delta.is_none() { pg_sys::REGBUF_FORCE_IMAGE } else { 0 };
                    pg_sys::XLogRegisterBuffer(i as u8, self.bufs[i], (pg_sys::REGBUF_STANDARD | whole) as u8);
                    if let Some(d) = delta.as_ref().filter(|d| !d.is_empty()) {
                        pg_sys::XLogRegisterBufData(i as u8, d.as_ptr() as *mut _, d.len() as i32);
                    }
                }
                let lsn = pg_sys::XLogInsert(pg_sys::RmgrIds::RM_GENERIC_ID as u8, 0);
                for i in 0..n {
                    let header = &mut *(page(i) as *mut pg_sys::PageHeaderData);
                    header.pd_lsn = pg_sys::PageXLogRecPtr { xlogid: (lsn >> 32) as u32, xrecoff: lsn as u32 };
                }
                pg_sys::CritSectionCount -= 1;
            } else {
                pg_sys::CritSectionCount += 1;
                for (i, image) in images.iter().enumerate().take(n) {
                    std::ptr::copy_nonoverlapping(image.as_ptr(), page(i) as *mut u8, BLCKSZ);
                    pg_sys::MarkBufferDirty(self.bufs[i]);
                }
                pg_sys::CritSectionCount -= 1;
            }
            // the row written, or the meta page's contents: a patch that
            // finds all it needs in the change log reads no page
            let rows: [Option<&[u8]>; MAX_PAGES] = std::array::from_fn(|i| match (i < n, self.pages[i].block) {
                (false, _) => None,
                (true, 0) => Some(PageRef::new(page(i)).meta_bytes()),
                (true, _) => self.rows[i].map(|(node, layout)| PageRef::new(page(i)).tuple_bytes(&layout, node)),
            });
            crate::worker::note_changes(self.rel, &self.pages[..n], &self.lists[..n], &rows[..n]);
            for (i, row) in rows.iter().enumerate().take(n) {
                if let (0, Some(meta)) = (self.pages[i].block, row) {
                    crate::worker::meta_mirror::written(self.rel, meta);
                }
            }
        }
    }
}

/// Whether a page image has no hole between pd_lower and pd_upper (every
/// page of ours: see the top), so that its every byte is content.
fn no_hole(page: &[u8]) -> bool {
    let at = |o: usize| u16::from_ne_bytes([page[o], page[o + 1]]) as usize;
    at(std::mem::offset_of!(pg_sys::PageHeaderData, pd_lower))
        == at(std::mem::offset_of!(pg_sys::PageHeaderData, pd_upper))
}

/// The relation's counters in the cumulative statistics (pg_stat and
/// pg_statio views), None where it is not counted; associates it on first
/// use, as PostgreSQL's own pgstat_count_* macros do.
///
/// # Safety
/// `rel` must be an open relation.
pub unsafe fn stat_counts<'a>(rel: pg_sys::Relation) -> Option<&'a mut pg_sys::PgStat_TableCounts> {
    // SAFETY: an open relation's pgstat fields are this backend's.
    unsafe {
        let r = &mut *rel;
        if r.pgstat_info.is_null() && r.pgstat_enabled {
            pg_sys::pgstat_assoc_relation(rel);
        }
        r.pgstat_info.as_mut().map(|i| &mut i.t_counts)
    }
}

/// The buffer each block was last found in, per backend: a search reads
/// the same pages again and again, and ReadRecentBuffer pins a buffer that
/// still holds its block without the shared buffer table's lookup (on the
/// development machine, 293k SIFT rows, a CPU scan at ef_search 20:
/// hash_search_with_hash_value fell from 20% of the backend's time to 3%
/// with the meta page among the pages; without it, as kept, 16% more
/// queries/s at one client and 13% at two, the means of three alternating
/// pairs). A stale entry, or another relation's block
/// in the same entry, costs one failed check: ReadRecentBuffer compares
/// the buffer's tag itself, so no entry ever pins the wrong page.
mod recent {
    use pgrx::pg_sys;
    use std::cell::RefCell;

    /// Entries, direct-mapped by (relation, block): 128 kB a backend, made
    /// on its first read of a gpu_graph page.
    const ENTRIES: usize = 1 << 14;

    thread_local! {
        /// (block, buffer) of each entry
        static SEEN: RefCell<Vec<(u32, pg_sys::Buffer)>> = const { RefCell::new(Vec::new()) };
    }

    fn slot(rel_node: u32, block: u32) -> usize {
        let h = ((rel_node as u64) << 32 | block as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> 50) as usize & (ENTRIES - 1)
    }

    /// `block` of `rel`'s main fork, pinned: ReadBufferExtended's
    /// RBM_NORMAL read, with its counts in the relation's statistics.
    ///
    /// # Safety
    /// `rel` must be an open relation and `block` exist in its main fork.
    pub unsafe fn pin(rel: pg_sys::Relation, block: u32) -> pg_sys::Buffer {
        // SAFETY: `rel` is open (the caller's contract).
        let node = unsafe { (*rel).rd_node };
        let at = slot(node.relNode.into(), block);
        // not the meta page, which every scan reads: PostgreSQL 15's
        // ReadRecentBuffer holds the buffer header's spinlock while it
        // checks the tag, where ReadBuffer's pin is one compare-and-swap,
        // and the scans the worker serves read no other page (their path
        // stays as measured on the GPU)
        let known = SEEN.with_borrow(|s| s.get(at).copied()).filter(|e| e.0 == block && block != 0);
        if let Some((_, buf)) = known {
            // SAFETY: `buf` is a buffer number ReadBufferExtended gave this
            // backend; the call pins it only if it still holds this block
            // of this relation (and valid contents).
            if unsafe { pg_sys::ReadRecentBuffer(node, pg_sys::ForkNumber::MAIN_FORKNUM, block, buf) } {
                // SAFETY: `rel` is open.
                if let Some(c) = unsafe { super::stat_counts(rel) } {
                    c.t_blocks_fetched += 1;
                    c.t_blocks_hit += 1;
                }
                return buf;
            }
        }
        // SAFETY: as for the caller.
        let buf = unsafe {
            pg_sys::ReadBufferExtended(
                rel,
                pg_sys::ForkNumber::MAIN_FORKNUM,
                block,
                pg_sys::ReadBufferMode::RBM_NORMAL,
                std::ptr::null_mut(),
            )
        };
        SEEN.with_borrow_mut(|s| {
            if s.is_empty() {
                s.resize(ENTRIES, (u32::MAX, 0));
            }
            s[at] = (block, buf);
        });
        buf
    }
}
