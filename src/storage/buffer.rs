//! Buffers with their lock held, and GenericXLog records over them.
//!
//! Every page of the index uses the whole area after the page header as
//! contents, with pd_lower = pd_upper = BLCKSZ so that neither GenericXLog nor
//! log_newpage_range mistakes any of it for a hole (`codec` formats them).

use pgrx::pg_sys;

use super::codec::{PageMut, PageRef};
use super::layout::Layout;
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
        // buffer it returns is pinned, so it can be locked.
        unsafe {
            let buf = pg_sys::ReadBufferExtended(
                rel,
                pg_sys::ForkNumber::MAIN_FORKNUM,
                block,
                pg_sys::ReadBufferMode::RBM_NORMAL,
                std::ptr::null_mut(),
            );
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
    /// lock, no GenericXLogFinish or in-place write of this buffer meanwhile.
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

/// GenericXLog's most pages a record (MAX_GENERIC_XLOG_PAGES).
const MAX_PAGES: usize = 4;

/// One GenericXLog record over up to four locked buffers.
pub struct Xlog {
    state: *mut pg_sys::GenericXLogState,
    rel: pg_sys::Relation,
    /// the pages registered (and the nodes changed on each), for the
    /// change log
    pages: [PageChange; MAX_PAGES],
    /// a page's one changed list, when it fits the change log
    lists: [Option<ChangedList>; MAX_PAGES],
    /// the buffers registered, and a page's one changed row (its node),
    /// which `finish` reads from the buffer for the change log
    bufs: [pg_sys::Buffer; MAX_PAGES],
    rows: [Option<(u32, Layout)>; MAX_PAGES],
    registered: usize,
}

impl Xlog {
    /// # Safety
    /// `rel` must be an open index relation, and each buffer registered
    /// stay locked exclusively until `finish` returns.
    pub unsafe fn start(rel: pg_sys::Relation) -> Xlog {
        // SAFETY: `rel` is an open relation (the caller's contract).
        let state = unsafe { pg_sys::GenericXLogStart(rel) };
        Xlog {
            state,
            rel,
            pages: [PageChange::whole(0); MAX_PAGES],
            lists: [None; MAX_PAGES],
            bufs: [0; MAX_PAGES],
            rows: [None; MAX_PAGES],
            registered: 0,
        }
    }

    /// Registers a buffer locked exclusively by the caller; returns the image
    /// of its page to modify, which the record applies at [`Xlog::finish`].
    /// `fresh` logs the full image (a new page).
    pub fn register(&mut self, locked: &Locked, fresh: bool) -> PageMut<'_> {
        let flags = if fresh { pg_sys::GENERIC_XLOG_FULL_IMAGE as i32 } else { 0 };
        // GenericXLogRegisterBuffer refuses a fifth page with an ERROR first
        if self.registered < MAX_PAGES {
            self.pages[self.registered] = PageChange::whole(locked.block());
            self.lists[self.registered] = None;
            self.bufs[self.registered] = locked.buf;
            self.rows[self.registered] = None;
            self.registered += 1;
        }
        // SAFETY: the state is live until finish or drop, which take `self`;
        // the buffer is pinned and locked (`locked`). The image returned is
        // the state's own MAXALIGNed copy of the page, which only the view
        // uses until the borrow of `self` ends.
        unsafe { PageMut::new(pg_sys::GenericXLogRegisterBuffer(self.state, locked.buf, flags)) }
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
        // SAFETY: the state is live (finish consumes it; forget skips the
        // abort); `rel` is open (start's contract). The rows are read from
        // the buffers, changed now, under the caller's exclusive locks
        // (register's contract), which outlive this call.
        unsafe {
            pg_sys::GenericXLogFinish(self.state);
            let rows: [Option<&[u8]>; MAX_PAGES] = std::array::from_fn(|i| {
                let (node, layout) = self.rows[i].filter(|_| i < n)?;
                Some(PageRef::new(pg_sys::BufferGetPage(self.bufs[i])).tuple_bytes(&layout, node))
            });
            crate::worker::note_changes(self.rel, &self.pages[..n], &self.lists[..n], &rows[..n]);
        }
        std::mem::forget(self);
    }
}

impl Drop for Xlog {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            // SAFETY: the state is live: finish forgets `self` instead of dropping it.
            unsafe { pg_sys::GenericXLogAbort(self.state) };
        }
    }
}
