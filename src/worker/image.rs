//! The worker's copy of an index: stored vectors, neighbour lists and flags
//! in flat arrays, read from the index's pages without a database connection.
//!
//! Why not through a database connection (the worker is connected to none):
//! a background worker can connect to one database for its whole life, and
//! one worker serves every database. The buffer manager needs only the
//! RelFileNode (ReadBufferWithoutRelcache, as WAL replay reads pages). What
//! opening the relation would have given, the loader does itself: session
//! AccessShareLocks, taken without waiting, on the index (database OID +
//! index OID) and on its database, so neither DROP INDEX, REINDEX, TRUNCATE
//! nor DROP DATABASE can remove the file while it is read (nor leave pages
//! of a dropped relation in shared buffers); a relation already gone shows
//! as a missing or empty file and the load is skipped.
//!
//! A copy is read a few hundred pages per step between the worker's other
//! work, so queries on other (resident) indexes keep being answered while a
//! large index loads. Its generation is the meta page's at the start: pages
//! changed during the load make the copy newer than that, never older, and
//! every node a backend gets from it is checked against the pages anyway.

use std::time::Instant;

use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::NO_NODE;
use pgrx::pg_sys;

use super::changes::{Change, List, PageChange, Row, LIST_IN_LOG};
use super::ring::Request;
use super::rows::Rows;
use super::stats::{add, counters};
use crate::storage::codec::{meta_from, PageRef, Tuple};
use crate::storage::layout::{Element, Layout};
use crate::storage::meta::{Meta, FORMAT_VERSION, MAGIC};

/// Which index: its RelFileNode (tablespace, database, relation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub spc: u32,
    pub db: u32,
    pub rel: u32,
}

impl Key {
    pub fn of(req: &Request) -> Key {
        Key { spc: req.spc_node, db: req.db_node, rel: req.rel_node }
    }

    /// An open relation's file.
    ///
    /// # Safety
    /// `rel` must be an open relation.
    pub unsafe fn of_relation(rel: pg_sys::Relation) -> Key {
        // SAFETY: an open relation's relcache entry (the caller's contract).
        let n = unsafe { (*rel).rd_node };
        Key { spc: n.spcNode.to_u32(), db: n.dbNode.to_u32(), rel: n.relNode.to_u32() }
    }

    fn rnode(&self) -> pg_sys::RelFileNode {
        pg_sys::RelFileNode {
            spcNode: pg_sys::Oid::from(self.spc),
            dbNode: pg_sys::Oid::from(self.db),
            relNode: pg_sys::Oid::from(self.rel),
        }
    }

    /// Whether the index still has pages under this RelFileNode (DROP INDEX,
    /// REINDEX and TRUNCATE leave the old file empty until the next
    /// checkpoint, then remove it).
    ///
    /// # Safety
    /// The worker's main thread.
    pub unsafe fn exists(&self) -> bool {
        // SAFETY: on the worker's main thread (the caller's contract) the storage
        // manager may open a relation's files by RelFileNode, whether or not they
        // exist; smgrnblocks is asked only when the main fork exists.
        unsafe {
            let rnode = self.rnode();
            let smgr = pg_sys::smgropen(rnode, pg_sys::InvalidBackendId);
            let alive = pg_sys::smgrexists(smgr, pg_sys::ForkNumber::MAIN_FORKNUM)
                && pg_sys::smgrnblocks(smgr, pg_sys::ForkNumber::MAIN_FORKNUM) > 0;
            close_files(rnode);
            alive
        }
    }
}

/// No file handle outlives its use: a dropped index's relfilenode may be
/// reused once its file is gone.
///
/// # Safety
/// The worker's main thread.
unsafe fn close_files(rnode: pg_sys::RelFileNode) {
    // SAFETY: on the worker's main thread (the caller's contract); closing a
    // RelFileNode no handle is open for does nothing.
    unsafe { pg_sys::smgrclosenode(pg_sys::RelFileNodeBackend { node: rnode, backend: pg_sys::InvalidBackendId }) };
}

/// A session lock taken without waiting, released on drop.
struct SessionLock(pg_sys::LOCKTAG);

impl SessionLock {
    /// # Safety
    /// The worker's main thread, with a resource owner.
    unsafe fn take(field1: u32, field2: u32, field3: u32, kind: pg_sys::LockTagType::Type) -> Option<SessionLock> {
        let tag = pg_sys::LOCKTAG {
            locktag_field1: field1,
            locktag_field2: field2,
            locktag_field3: field3,
            locktag_field4: 0,
            locktag_type: kind as u8,
            locktag_lockmethodid: pg_sys::DEFAULT_LOCKMETHOD as u8,
        };
        // SAFETY: on the worker's main thread, whose resource owner the lock
        // manager needs for a lock (the caller's contract); session locks
        // outlive any transaction and are released on drop or at exit.
        let got = unsafe { pg_sys::LockAcquire(&tag, pg_sys::AccessShareLock as i32, true, true) };
        (got != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL).then_some(SessionLock(tag))
    }
}

impl Drop for SessionLock {
    fn drop(&mut self) {
        // after an ERROR the worker exits; its exit callback releases every lock
        if !std::thread::panicking() {
            // SAFETY: `self` holds this session lock, taken by `take`.
            unsafe { pg_sys::LockRelease(&self.0, pg_sys::AccessShareLock as i32, true) };
        }
    }
}

/// A copy being read.
pub struct Loader {
    pub key: Key,
    pub generation: u64,
    /// the change log lost changes while it was read (an overflow)
    pub lost: bool,
    pub started: Instant,
    /// the index's lock, then its database's (dropped in this order)
    _locks: (SessionLock, SessionLock),
    pub file: File,
    rnode: pg_sys::RelFileNode,
    strategy: pg_sys::BufferAccessStrategy,
    layout: Layout,
    /// next block to read, last block to read
    next: u32,
    last: u32,
    image: Option<FlatIndex>,
    /// each node's row, as read with its vector
    rows: Rows,
    /// inner product's pinned outliers, which every search starts from
    pinned: Vec<u32>,
    /// pages changed while the copy was read (the change log): read again
    /// once it is whole
    pub changed: Changed,
    /// each block's LSN as read (see [`resync`])
    pub lsns: Vec<u64>,
}

/// What reading an index's pages takes besides its RelFileNode: the OIDs
/// its session locks name, and whether its buffers are permanent.
#[derive(Clone, Copy, Debug)]
pub struct File {
    pub db: u32,
    pub index: u32,
    pub permanent: bool,
}

impl File {
    /// Session AccessShareLocks on the index, then its database, taken
    /// without waiting (None when either is locked against them): neither
    /// can be dropped while they are held. Released in the reverse order.
    ///
    /// # Safety
    /// The worker's main thread, with a resource owner.
    unsafe fn lock(&self) -> Option<(SessionLock, SessionLock)> {
        // SAFETY: the caller's contract.
        unsafe {
            // SET_LOCKTAG_OBJECT(InvalidOid, DatabaseRelationId, db, 0), as a
            // backend connected to the database holds one
            let db = SessionLock::take(
                0,
                pg_sys::DatabaseRelationId.to_u32(),
                self.db,
                pg_sys::LockTagType::LOCKTAG_OBJECT,
            )?;
            // SET_LOCKTAG_RELATION(db, index)
            let index = SessionLock::take(self.db, self.index, 0, pg_sys::LockTagType::LOCKTAG_RELATION)?;
            Some((index, db))
        }
    }
}

pub enum Begin {
    Started(Box<Loader>),
    /// locked by someone else, or gone: try again on a later request
    NotNow,
    /// more bytes than `limit` (or than could be allocated)
    TooLarge {
        generation: u64,
        bytes: usize,
    },
}

impl Loader {
    /// Locks the index, reads its meta page and allocates a copy of at most
    /// `limit` bytes (0 = any size).
    ///
    /// # Safety
    /// The worker's main thread, with a resource owner.
    pub unsafe fn begin(req: &Request, limit: usize) -> Begin {
        // SAFETY: the worker's main thread, with a resource owner (the
        // caller's contract).
        let Some((mut l, blocks)) = (unsafe { Self::open(req) }) else {
            return Begin::NotNow;
        };
        // SAFETY: as above; the file has block 0 (open).
        let m: Meta = unsafe { l.read_block(0, |p, _| p.meta()) };
        if m.magic != MAGIC || m.version != FORMAT_VERSION || m.inconsistent() {
            return Begin::NotNow;
        }
        l.pinned = m.pinned().collect();
        l.generation = m.generation;
        let n = if m.dim == 0 { 0 } else { m.node_count as usize };
        l.layout = m.layout();
        let (sd, degree) = (l.layout.stored_dim, l.layout.degree);
        if n > 0 {
            l.last = l.layout.vector_block(n as u32 - 1);
            if l.last >= blocks {
                return Begin::NotNow;
            }
        }
        let bytes = FlatIndex::bytes_for(n, sd, degree);
        if limit > 0 && bytes > limit {
            return Begin::TooLarge { generation: m.generation, bytes };
        }
        // every node free until its page is read; an allocation failure
        // makes the index unfit rather than abort the worker
        let Some(image) = FlatIndex::try_free(m.metric(), sd, degree, n, m.entry()) else {
            return Begin::TooLarge { generation: m.generation, bytes };
        };
        l.image = Some(image);
        l.rows.grow(n);
        Begin::Started(Box::new(l))
    }

    /// Locks the index and its database and opens the index's file: a
    /// loader with no copy yet, and the file's blocks. None when the index
    /// is locked by someone else or gone.
    ///
    /// # Safety
    /// As for [`Loader::begin`].
    unsafe fn open(req: &Request) -> Option<(Loader, u32)> {
        // SAFETY: the worker's main thread, with a resource owner (the
        // caller's contract), may take session locks and open a relation's
        // files by RelFileNode; smgrnblocks is asked only when the file exists.
        unsafe {
            let file = File { db: req.db, index: req.index, permanent: req.permanent };
            let locks = file.lock()?;
            let rnode = Key::of(req).rnode();
            let l = Loader {
                key: Key::of(req),
                generation: 0,
                lost: false,
                started: Instant::now(),
                _locks: locks,
                file,
                rnode,
                strategy: pg_sys::GetAccessStrategy(pg_sys::BufferAccessStrategyType::BAS_BULKREAD),
                layout: Layout::new(8, 1, Element::F32),
                next: 1,
                last: 0,
                image: None,
                rows: Rows::default(),
                pinned: Vec::new(),
                changed: Changed::default(),
                lsns: Vec::new(),
            };
            let smgr = pg_sys::smgropen(rnode, pg_sys::InvalidBackendId);
            if !pg_sys::smgrexists(smgr, pg_sys::ForkNumber::MAIN_FORKNUM) {
                return None;
            }
            let blocks = pg_sys::smgrnblocks(smgr, pg_sys::ForkNumber::MAIN_FORKNUM);
            // a dropped index's file is kept empty until the next checkpoint
            (blocks > 0).then_some((l, blocks))
        }
    }

    pub fn bytes(&self) -> usize {
        self.image.as_ref().map_or(0, FlatIndex::bytes)
    }

    /// How the index's pages hold its vectors.
    pub fn element(&self) -> Element {
        self.layout.element
    }

    /// Calls `f` on block `block` of the index, under a share lock.
    ///
    /// # Safety
    /// As for [`Loader::begin`], and the block must exist.
    unsafe fn read_block<T>(&self, block: u32, f: impl FnOnce(PageRef, u64) -> T) -> T {
        // SAFETY: the caller's contract; the loader's session locks keep the
        // file from being removed meanwhile.
        unsafe { read_block(self.rnode, self.file.permanent, self.strategy, block, f) }
    }

    /// Reads up to `budget` more pages; true when the copy is complete.
    ///
    /// # Safety
    /// As for [`Loader::begin`].
    pub unsafe fn step(&mut self, budget: u32) -> bool {
        let mut image = self.image.take().expect("a started load has an image");
        let n = image.len();
        let l = self.layout;
        let end = self.last.min(self.next.saturating_add(budget - 1));
        while n > 0 && self.next <= end {
            let b = self.next;
            let rows = &mut self.rows;
            // SAFETY: the caller's contract; blocks up to `last` exist
            // (begin), and the loader's session locks keep the file.
            let lsn = unsafe {
                read_block(self.rnode, self.file.permanent, self.strategy, b, |p, lsn| {
                    (copy_block(&mut image, rows, &l, PageChange::whole(b), p), lsn).1
                })
            };
            note_lsn(&mut self.lsns, b, lsn);
            self.next += 1;
        }
        self.image = Some(image);
        n == 0 || self.next > self.last
    }

    /// The finished copy (the lock is released when the loader drops),
    /// the pinned outliers in its entry's list, and its nodes' rows.
    pub fn take(mut self) -> (FlatIndex, Rows) {
        let mut image = self.image.take().expect("a started load has an image");
        image.pin(&self.pinned);
        (image, std::mem::take(&mut self.rows))
    }
}

/// Calls `f` on block `block` of the index in `rnode`, under a share lock.
///
/// # Safety
/// The worker's main thread with a resource owner; the block exists and
/// the caller holds a lock that keeps the file from being removed.
unsafe fn read_block<T>(
    rnode: pg_sys::RelFileNode,
    permanent: bool,
    strategy: pg_sys::BufferAccessStrategy,
    block: u32,
    f: impl FnOnce(PageRef, u64) -> T,
) -> T {
    // SAFETY: on the worker's main thread with a resource owner (the
    // caller's contract), as WAL replay reads a page by RelFileNode. The
    // view lives under the share lock, which no process writes through.
    unsafe {
        let buf = pg_sys::ReadBufferWithoutRelcache(
            rnode,
            pg_sys::ForkNumber::MAIN_FORKNUM,
            block,
            pg_sys::ReadBufferMode::RBM_NORMAL,
            strategy,
            permanent,
        );
        pg_sys::LockBuffer(buf, pg_sys::BUFFER_LOCK_SHARE as i32);
        let page = pg_sys::BufferGetPage(buf);
        // the LSN of the page's last change (every change of a permanent
        // index is WAL-logged): what a resync compares
        let lsn = (*(page as *const pg_sys::PageHeaderData)).pd_lsn;
        let out = f(PageRef::new(page), ((lsn.xlogid as u64) << 32) | lsn.xrecoff as u64);
        pg_sys::UnlockReleaseBuffer(buf);
        out
    }
}

/// Where an index's pages are copied: a whole copy in memory
/// ([`FlatIndex`]), or the changes for a copy on the GPU ([`GpuPatch`]).
pub trait Target {
    fn stored_dim(&self) -> usize;
    fn degree(&self) -> usize;
    fn len(&self) -> usize;
    /// The index now has `n` nodes (never fewer) and this entry point.
    fn grow(&mut self, n: usize, entry: Option<u32>);
    fn list(&mut self, node: usize, list: &[u32]);
    /// Sets a node's flags; where its stored vector goes.
    fn row(&mut self, node: usize, flags: u8) -> &mut [f32];
    /// Inner product's pinned outliers, which the entry's list leads to.
    fn pin(&mut self, pinned: &[u32]);
}

impl Target for FlatIndex {
    fn stored_dim(&self) -> usize {
        self.stored_dim
    }
    fn degree(&self) -> usize {
        self.graph.degree
    }
    fn len(&self) -> usize {
        FlatIndex::len(self)
    }
    fn grow(&mut self, n: usize, entry: Option<u32>) {
        // new nodes start free; their pages are read next (their writes were noted)
        self.vectors.resize(n * self.stored_dim, 0.0);
        self.flags.resize(n, gpu_graph_engine::node::FREE);
        self.graph.adjacency.resize(n * self.graph.degree, NO_NODE);
        self.graph.entry = entry;
    }
    fn list(&mut self, node: usize, list: &[u32]) {
        let d = self.graph.degree;
        self.graph.adjacency[node * d..(node + 1) * d].copy_from_slice(list);
    }
    fn row(&mut self, node: usize, flags: u8) -> &mut [f32] {
        self.flags[node] = flags;
        &mut self.vectors[node * self.stored_dim..(node + 1) * self.stored_dim]
    }
    fn pin(&mut self, pinned: &[u32]) {
        if let (Some(e), false) = (self.graph.entry, pinned.is_empty()) {
            let d = self.graph.degree;
            pin_outliers(e, &mut self.graph.adjacency[e as usize * d..(e as usize + 1) * d], pinned);
        }
    }
}

/// The changes for a copy on the GPU, in runs of consecutive nodes.
pub struct GpuPatch {
    pub stored_dim: usize,
    pub degree: usize,
    pub patch: gpu_graph_gpu::search::Patch,
}

impl Target for GpuPatch {
    fn stored_dim(&self) -> usize {
        self.stored_dim
    }
    fn degree(&self) -> usize {
        self.degree
    }
    fn len(&self) -> usize {
        self.patch.n
    }
    fn grow(&mut self, n: usize, entry: Option<u32>) {
        self.patch.n = n;
        self.patch.entry = entry.unwrap_or(0);
    }
    fn list(&mut self, node: usize, list: &[u32]) {
        match self.patch.lists.last_mut() {
            Some((first, l)) if *first as usize + l.len() / self.degree == node => l.extend_from_slice(list),
            _ => self.patch.lists.push((node as u32, list.to_vec())),
        }
    }
    fn row(&mut self, node: usize, flags: u8) -> &mut [f32] {
        let sd = self.stored_dim;
        if !matches!(self.patch.rows.last(), Some(r) if r.0 as usize + r.1.len() == node) {
            self.patch.rows.push((node as u32, Vec::new(), Vec::new()));
        }
        let run = self.patch.rows.last_mut().expect("a run ends at this node");
        run.1.push(flags);
        run.2.resize(run.2.len() + sd, 0.0);
        let at = run.2.len() - sd;
        &mut run.2[at..]
    }
    fn pin(&mut self, pinned: &[u32]) {
        if pinned.is_empty() {
            return;
        }
        // the entry's list, when this patch carries it
        let (e, d) = (self.patch.entry as usize, self.degree);
        for (first, l) in &mut self.patch.lists {
            let first = *first as usize;
            if (first..first + l.len() / d).contains(&e) {
                let at = (e - first) * d;
                pin_outliers(e as u32, &mut l[at..at + d], pinned);
            }
        }
    }
}

/// What changed in an index since its copy last followed the change log:
/// pages to read again, and lists and rows the log carries (node `lo`'s),
/// and the meta page's latest contents when the log carries them.
#[derive(Default)]
pub struct Changed {
    pub pages: Vec<PageChange>,
    pub lists: Vec<(PageChange, List)>,
    pub rows: Vec<(PageChange, Row)>,
    pub meta: Option<Row>,
}

impl Changed {
    pub fn clear(&mut self) {
        self.pages.clear();
        self.lists.clear();
        self.rows.clear();
        self.meta = None;
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Takes `c` (changes are taken in the log's order): its list or row
    /// when it carries one, else its page; of the meta page (block 0) its
    /// contents, the last ones taken being the latest (its changes are
    /// noted under its lock), or its page when they were not carried.
    pub fn add(&mut self, c: &Change) {
        if c.page.block == 0 {
            self.meta = c.row.clone();
            if self.meta.is_none() {
                self.pages.push(c.page);
            }
            return;
        }
        match (c.list, &c.row) {
            (Some(list), _) => self.lists.push((c.page, list)),
            (None, Some(row)) => self.rows.push((c.page, row.clone())),
            (None, None) => self.pages.push(c.page),
        }
    }
    /// Pages, lists and rows to copy (the meta page's contents one more).
    pub fn len(&self) -> usize {
        self.pages.len() + self.lists.len() + self.rows.len() + self.meta.is_some() as usize
    }
}

/// Copies page `p` (block `c.block`) of an index in layout `l` into
/// `target` and `rows`: a graph page's lists, or a vector page's flags,
/// vectors and rows, of the nodes in `c.lo..c.hi` that the target has.
/// The rows copied.
fn copy_block(target: &mut dyn Target, rows: &mut Rows, l: &Layout, c: PageChange, p: PageRef) -> usize {
    let n = target.len();
    let chunk = (c.block as usize - 1) / l.pages_per_chunk;
    let page = (c.block as usize - 1) % l.pages_per_chunk;
    let first = chunk * l.per_chunk;
    let chunk_end = (first + l.per_chunk).min(n);
    // the nodes of the page that changed
    let only = |lo: usize, hi: usize| lo.max(c.lo as usize)..hi.min(c.hi as usize);
    if page == 0 {
        for node in only(first, chunk_end) {
            target.list(node, p.list(l, node as u32));
        }
        0
    } else {
        let lo = first + (page - 1) * l.per_vector_page;
        let nodes = only(lo, (lo + l.per_vector_page).min(chunk_end));
        for node in nodes.clone() {
            copy_row(target, rows, node, p.tuple(l, node as u32));
        }
        nodes.len()
    }
}

/// Copies node `node`'s vector tuple `t` (read from its page, or a row the
/// change log carried) into `target` and `rows`: its flags, vector and row.
fn copy_row(target: &mut dyn Target, rows: &mut Rows, node: usize, t: Tuple) {
    // the page's flags are the engine's node flags, widened
    t.vector.copy_to(target.row(node, t.header.flags as u8));
    rows.set(node, t.header.payload());
}

/// The pinned outliers go into the entry point `e`'s `list` (its last
/// places, when it is full): the GPU kernel expands the entry first, so
/// every search computes their distances, as the engine's search does by
/// seeding them (engine::outliers).
fn pin_outliers(e: u32, list: &mut [u32], pinned: &[u32]) {
    let d = list.len();
    let missing: Vec<u32> = pinned.iter().copied().filter(|p| *p != e && !list.contains(p)).take(d / 2).collect();
    let used = list.iter().position(|&u| u == NO_NODE).unwrap_or(d);
    let at = used.min(d - missing.len());
    list[at..at + missing.len()].copy_from_slice(&missing);
}

/// Brings a copy of the index in `key` up to date with what changed, from
/// the change log: the meta page first (the node count grows the copy; the
/// entry point and pinned outliers), then the lists and rows the log
/// carries (`changes.lists`, `changes.rows`: each node's last, unless its
/// page is read), then each of `changes.pages` once, only the nodes of it
/// that changed (read after every change noted in the log so far: the
/// latest content). When the log carries all of it, the meta page's
/// contents included (what an INSERT changes) or unchanged since `last`
/// (the meta page as the copy last applied it: kept up to date here), nothing is read from the
/// index's file: neither its locks nor the meta page, which every insert
/// locks, are waited for. The index's generation now, or None when the
/// copy cannot follow (the index locked by DDL, gone, or no longer the
/// copy's layout): it is then refreshed whole when a request needs it.
///
/// # Safety
/// The worker's main thread, with a resource owner.
pub unsafe fn patch(
    key: Key,
    file: File,
    target: &mut dyn Target,
    rows: &mut Rows,
    changes: &mut Changed,
    lsns: &mut Vec<u64>,
    last: &mut Option<Meta>,
) -> Option<u64> {
    // the meta page's contents the log carries, else, when the log noted
    // no change of it, those the copy last applied: every write of the
    // meta page is noted, so it still holds them (an insert's lists of
    // neighbours, written after its node's allocation, come so)
    let carried = changes.meta.as_ref().and_then(|r| meta_from(r.bytes()));
    let known = if changes.meta.is_none() && changes.pages.is_empty() { *last } else { None };
    if let Some(m) = carried.or(known) {
        let l = begin(&m, target, rows, changes)?;
        if changes.pages.is_empty() {
            from_log(&l, target, rows, changes);
            add(&counters().patches_from_log, 1);
            *last = Some(m);
            return Some(end(&m, target));
        }
        // (pages to read: the file's meta page, as new or newer, is
        // checked and grows the copy again there)
    }
    // SAFETY: the caller's contract.
    unsafe {
        with_file(key, file, |rnode, nblocks| {
            patch_blocks(rnode, file.permanent, nblocks, target, rows, changes, lsns, last)
        })
    }
}

/// The checks that `m` (the meta page's contents) is an index `target`
/// can follow, which then grows to its node count; lists and rows the log
/// cannot give for its layout move to `changes.pages`. Its layout, or None
/// when the copy cannot follow.
fn begin(m: &Meta, target: &mut dyn Target, rows: &mut Rows, changes: &mut Changed) -> Option<Layout> {
    let l = m.layout();
    if m.magic != MAGIC
        || m.version != FORMAT_VERSION
        || m.inconsistent()
        || l.stored_dim != target.stored_dim()
        || l.degree != target.degree()
        || (m.node_count as usize) < target.len()
    {
        return None;
    }
    target.grow(m.node_count as usize, m.entry());
    rows.grow(m.node_count as usize);
    if l.degree > LIST_IN_LOG {
        // (never carried for such an index: read their pages)
        changes.pages.extend(changes.lists.drain(..).map(|(c, _)| c));
    }
    // rows of another size than the layout's (never written so): read
    // from their pages
    let pages = &mut changes.pages;
    changes.rows.retain(|(c, row)| {
        let fits = row.bytes().len() == l.vector_size();
        if !fits {
            pages.push(*c);
        }
        fits
    });
    Some(l)
}

/// Copies the lists and rows the log carried, each node's last, none of a
/// node whose page is read (`changes.pages`, merged here).
fn from_log(l: &Layout, target: &mut dyn Target, rows: &mut Rows, changes: &mut Changed) {
    PageChange::merged(&mut changes.pages);
    latest(&mut changes.lists, &changes.pages);
    latest(&mut changes.rows, &changes.pages);
    let (n, degree) = (target.len(), l.degree);
    for (c, list) in changes.lists.iter().filter(|(c, _)| (c.lo as usize) < n) {
        target.list(c.lo as usize, &list[..degree]);
    }
    // rows as their pages held them, decoded as a page's are
    let mut logged = 0;
    for (c, row) in changes.rows.iter().filter(|(c, _)| (c.lo as usize) < n) {
        copy_row(target, rows, c.lo as usize, Tuple::decode(row.bytes(), l.element));
        logged += 1;
    }
    add(&counters().patched_rows_from_log, logged);
}

/// The pinned outliers of `m` into the target; `m`'s generation.
fn end(m: &Meta, target: &mut dyn Target) -> u64 {
    let pinned: Vec<u32> = m.pinned().collect();
    target.pin(&pinned);
    m.generation
}

/// Calls `f` with the index's file open and locked (session locks as a
/// load takes them, then the file) and its length, when it has blocks;
/// closes and unlocks it after. None when the index is locked against the
/// worker or gone.
///
/// # Safety
/// The worker's main thread, with a resource owner.
unsafe fn with_file<T>(key: Key, file: File, f: impl FnOnce(pg_sys::RelFileNode, u32) -> Option<T>) -> Option<T> {
    // SAFETY: the worker's main thread, with a resource owner (the caller's
    // contract); smgrnblocks is asked only when the file exists.
    unsafe {
        let locks = file.lock()?;
        let rnode = key.rnode();
        let smgr = pg_sys::smgropen(rnode, pg_sys::InvalidBackendId);
        let nblocks = if pg_sys::smgrexists(smgr, pg_sys::ForkNumber::MAIN_FORKNUM) {
            pg_sys::smgrnblocks(smgr, pg_sys::ForkNumber::MAIN_FORKNUM)
        } else {
            0
        };
        let out = (nblocks > 0).then(|| f(rnode, nblocks)).flatten();
        close_files(rnode);
        drop(locks);
        out
    }
}

/// [`patch`] once the file is open and locked: the meta page read from it.
///
/// # Safety
/// As for [`patch`], the file locked and `nblocks` long.
#[allow(clippy::too_many_arguments)] // (the file, the copy and what it last read)
unsafe fn patch_blocks(
    rnode: pg_sys::RelFileNode,
    permanent: bool,
    nblocks: u32,
    target: &mut dyn Target,
    rows: &mut Rows,
    changes: &mut Changed,
    lsns: &mut Vec<u64>,
    last: &mut Option<Meta>,
) -> Option<u64> {
    let strategy = std::ptr::null_mut();
    // SAFETY: the caller's contract; block 0 exists (nblocks > 0).
    let m: Meta = unsafe { read_block(rnode, permanent, strategy, 0, |p, _| p.meta()) };
    let l = begin(&m, target, rows, changes)?;
    from_log(&l, target, rows, changes);
    let mut read = 0;
    for &c in changes.pages.iter().filter(|c| c.block > 0 && c.block < nblocks) {
        // SAFETY: the caller's contract; the block exists.
        let (rows, lsn) = unsafe {
            read_block(rnode, permanent, strategy, c.block, |p, lsn| (copy_block(target, rows, &l, c, p), lsn))
        };
        read += rows;
        if c.lo == 0 && c.hi == u32::MAX {
            // (a page read in part leaves the rest as the copy had it)
            note_lsn(lsns, c.block, lsn);
        }
    }
    add(&counters().patched_rows_from_pages, read as u64);
    *last = Some(m);
    Some(end(&m, target))
}

/// Keeps of the lists or rows the log carried (in the order written) each
/// node's last, and none of a node whose page is read (`pages`, merged),
/// which holds the latest: each node once, as a GPU patch's copies land in
/// any order.
fn latest<T>(carried: &mut Vec<(PageChange, T)>, pages: &[PageChange]) {
    // the last of each node first (a stable sort), then the others dropped
    carried.reverse();
    carried.sort_by_key(|(c, _)| c.lo);
    carried.dedup_by_key(|(c, _)| c.lo);
    let read = |c: &PageChange| {
        pages.binary_search_by_key(&c.block, |p| p.block).is_ok_and(|i| (pages[i].lo..pages[i].hi).contains(&c.lo))
    };
    carried.retain(|(c, _)| !read(c));
}

/// Remembers block `b`'s LSN as the copy read it.
fn note_lsn(lsns: &mut Vec<u64>, b: u32, lsn: u64) {
    let b = b as usize;
    if lsns.len() <= b {
        lsns.resize(b + 1, 0);
    }
    lsns[b] = lsn;
}

/// Brings a copy whose change log was lost (a reader lapped by the
/// writers) up to date in place: every block whose LSN differs from the
/// one the copy read (`lsns`) is read again whole; the others are as the
/// copy has them, since every change of a permanent index is WAL-logged
/// and moves its page's LSN. A pass over the page headers, where loading
/// the copy again read and decoded every page with its scans on the CPU.
/// The index's generation and the pages read, or None as for [`patch`]
/// (and for an unlogged index, whose pages keep no LSN).
///
/// # Safety
/// As for [`patch`].
pub unsafe fn resync(
    key: Key,
    file: File,
    target: &mut dyn Target,
    rows: &mut Rows,
    lsns: &mut Vec<u64>,
    last: &mut Option<Meta>,
) -> Option<(u64, usize)> {
    if !file.permanent {
        return None;
    }
    // SAFETY: the caller's contract; the file is open and locked in `f`,
    // and its blocks below `nblocks` exist.
    unsafe {
        with_file(key, file, |rnode, nblocks| {
            let mut changed = Changed::default();
            let strategy = pg_sys::GetAccessStrategy(pg_sys::BufferAccessStrategyType::BAS_BULKREAD);
            for b in 1..nblocks {
                let lsn = read_block(rnode, true, strategy, b, |_, lsn| lsn);
                if lsns.get(b as usize) != Some(&lsn) {
                    changed.pages.push(PageChange::whole(b));
                }
            }
            pg_sys::FreeAccessStrategy(strategy);
            let read = changed.pages.len();
            patch_blocks(rnode, true, nblocks, target, rows, &mut changed, lsns, last).map(|g| (g, read))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_keeps_its_last_carried_change_unless_its_page_is_read() {
        let c = |block, node| PageChange { block, lo: node, hi: node + 1 };
        let mut carried = vec![(c(2, 5), 'a'), (c(2, 7), 'b'), (c(2, 5), 'c'), (c(3, 9), 'd'), (c(4, 20), 'e')];
        let mut pages = vec![c(3, 8), c(3, 10), c(4, 21)];
        PageChange::merged(&mut pages);
        latest(&mut carried, &pages);
        // node 9 is within block 3's nodes read (8..11); node 20 is not
        assert_eq!(carried, vec![(c(2, 5), 'c'), (c(2, 7), 'b'), (c(4, 20), 'e')]);
    }
}
