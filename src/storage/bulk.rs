//! Writing a new index's pages straight to its file, outside shared buffers,
//! as nbtsort does for btree: no buffer mapping, pins or content locks per
//! page, full-page images logged 32 to a record (XLR_MAX_BLOCK_ID), and no
//! WAL at all where PostgreSQL needs none for the relation (wal_level =
//! minimal and the relation created in this transaction: the commit syncs
//! its file; an unlogged index's main fork).
//!
//! Durability with WAL: each write asks the checkpointer to fsync its
//! segment (as a write through shared buffers would), and each batch is
//! logged and written with DELAY_CHKPT_START set, as PostgreSQL does where a
//! WAL record and the change it describes must not straddle a checkpoint's
//! start: a checkpoint whose redo pointer lies after a batch's record waits
//! until that batch is written and its fsync asked for, so its sync phase
//! covers the batch; a batch logged after the redo pointer is replayed. So no
//! build fsyncs its whole file itself (nbtsort and PostgreSQL 17's
//! bulk_write do, when a checkpoint began during the build: they skip the
//! fsync requests; at 10M rows that was seconds of a build's end).
//!
//! Nothing may read these blocks through shared buffers before
//! [`BulkWriter::finish`]: the buffer manager would not know of them.

use pgrx::pg_sys;

use super::codec::PageMut;
use super::layout::BLCKSZ;

/// One page image in private memory, MAXALIGNed as the codec and
/// PostgreSQL's page functions want.
#[repr(C, align(8))]
pub(super) struct Image(pub(super) [u8; BLCKSZ]);

/// InvalidSubTransactionId.
const INVALID_SUBXACT: pg_sys::SubTransactionId = 0;

/// Whether changes to `rel` are WAL-logged: RelationNeedsWAL.
///
/// # Safety
/// `rel` must be an open relation.
pub(super) unsafe fn relation_needs_wal(rel: pg_sys::Relation) -> bool {
    // SAFETY: an open relation's relcache entry has its pg_class row;
    // wal_level is a plain setting of this backend.
    unsafe {
        let r = &*rel;
        (*r.rd_rel).relpersistence as u8 == pg_sys::RELPERSISTENCE_PERMANENT
            && (pg_sys::wal_level >= pg_sys::WalLevel::WAL_LEVEL_REPLICA as i32
                || (r.rd_createSubid == INVALID_SUBXACT && r.rd_firstRelfilenodeSubid == INVALID_SUBXACT))
    }
}

pub struct BulkWriter {
    rel: pg_sys::Relation,
    fork: pg_sys::ForkNumber::Type,
    wal: bool,
    /// blocks numbered so far (the next block [`BulkWriter::append`] gives)
    blocks: u32,
    /// blocks in the file so far
    extended: u32,
    /// images waiting to be logged and written, and their block numbers
    images: Vec<Box<Image>>,
    numbers: Vec<pg_sys::BlockNumber>,
    /// images filled so far in `images`
    filled: usize,
    /// bytes written to the relation (and logged, with WAL)
    pub bytes: u64,
}

impl BulkWriter {
    /// XLR_MAX_BLOCK_ID: the most pages one record can carry.
    const BATCH: usize = 32;

    /// # Safety
    /// `rel` must be a new index relation with an empty main fork, open
    /// while the writer lives, that no other process can see yet.
    pub unsafe fn new(rel: pg_sys::Relation) -> BulkWriter {
        // SAFETY: as this function's.
        unsafe { Self::for_fork(rel, pg_sys::ForkNumber::MAIN_FORKNUM) }
    }

    /// A writer of `fork` of `rel`. An unlogged index's init fork is always
    /// WAL-logged (recovery copies it over the main fork, so it must survive
    /// a crash) and synced by [`BulkWriter::finish_synced`], as btree's
    /// `btbuildempty` does.
    ///
    /// # Safety
    /// As [`BulkWriter::new`], for `fork`.
    pub unsafe fn for_fork(rel: pg_sys::Relation, fork: pg_sys::ForkNumber::Type) -> BulkWriter {
        BulkWriter {
            rel,
            fork,
            // SAFETY: `rel` is open (the caller's contract).
            wal: fork == pg_sys::ForkNumber::INIT_FORKNUM || unsafe { relation_needs_wal(rel) },
            blocks: 0,
            extended: 0,
            images: (0..Self::BATCH).map(|_| Box::new(Image([0; BLCKSZ]))).collect(),
            numbers: Vec::with_capacity(Self::BATCH),
            filled: 0,
            bytes: 0,
        }
    }

    pub fn wal(&self) -> bool {
        self.wal
    }

    /// The block the next [`BulkWriter::append`] or [`BulkWriter::skip`] numbers.
    pub fn next_block(&self) -> u32 {
        self.blocks
    }

    /// Formats the next block of the file through `format` (which gets a
    /// zeroed page to format whole) and queues it.
    pub fn append(&mut self, format: &mut dyn FnMut(&mut PageMut)) {
        let block = self.blocks;
        self.blocks += 1;
        self.queue(block, format);
    }

    /// Numbers the next block without writing it: a block that
    /// [`BulkWriter::rewrite`] will write before the build ends. It stays a
    /// hole in the file until then (reading as zeros; md.c itself pads a
    /// segment that ends in one when the next begins), never written twice
    /// nor logged twice. If the build does not end, the relation goes with
    /// its transaction.
    pub fn skip(&mut self) {
        self.blocks += 1;
    }

    /// Formats an already appended block anew through `format` and queues it.
    pub fn rewrite(&mut self, block: u32, format: &mut dyn FnMut(&mut PageMut)) {
        assert!(block < self.blocks, "gpu_graph: rewriting block {block} of {}", self.blocks);
        if self.numbers.contains(&block) {
            self.flush(); // one image of a block per record, the older first
        }
        self.queue(block, format);
    }

    fn queue(&mut self, block: u32, format: &mut dyn FnMut(&mut PageMut)) {
        let image = &mut self.images[self.filled];
        image.0.fill(0);
        // SAFETY: the image is a MAXALIGNed BLCKSZ page only this view uses.
        format(&mut unsafe { PageMut::new(image.0.as_mut_ptr() as pg_sys::Page) });
        self.numbers.push(block);
        self.filled += 1;
        if self.filled == Self::BATCH {
            self.flush();
        }
    }

    /// Logs the queued images in one record (which sets their LSNs), then
    /// writes them to the file.
    fn flush(&mut self) {
        if self.filled == 0 {
            return;
        }
        let mut pages: Vec<pg_sys::Page> =
            self.images[..self.filled].iter_mut().map(|i| i.0.as_mut_ptr() as pg_sys::Page).collect();
        // a checkpoint starting meanwhile waits for the batch (module comment)
        let _delay = self.wal.then(DelayCheckpointStart::set);
        // SAFETY: `rel` is open (new's contract) and no other process sees
        // it; every page is a formatted BLCKSZ image in our memory. Appended
        // blocks are queued in the order they were numbered, so each one
        // extended lies past the file's end (after a hole, if skipped blocks
        // came between); a rewritten one lies within it.
        unsafe {
            if self.wal {
                pg_sys::log_newpages(
                    &mut (*self.rel).rd_node,
                    self.fork,
                    self.filled as i32,
                    self.numbers.as_mut_ptr(),
                    pages.as_mut_ptr(),
                    true,
                );
            }
            let smgr = pg_sys::RelationGetSmgr(self.rel);
            for (&page, &block) in pages.iter().zip(&self.numbers) {
                pg_sys::PageSetChecksumInplace(page, block);
                let data = page as *mut std::ffi::c_char;
                // with WAL, each write asks the checkpointer to fsync it;
                // without, the commit syncs the file
                if block >= self.extended {
                    pg_sys::smgrextend(smgr, self.fork, block, data, !self.wal);
                    self.extended = block + 1;
                } else {
                    pg_sys::smgrwrite(smgr, self.fork, block, data, !self.wal);
                }
            }
        }
        self.bytes += (self.filled * BLCKSZ) as u64;
        self.filled = 0;
        self.numbers.clear();
    }

    /// Writes what is queued now, so that the file holds every page
    /// appended so far (a paged build reads its vector pages back).
    pub fn write_queued(&mut self) {
        self.flush();
    }

    /// Writes what is queued. Shared buffers may read the relation after
    /// this; its durability is the checkpointer's (with WAL) or the
    /// commit's (without), as the module's comment says.
    pub fn finish(mut self) {
        self.flush();
    }

    /// Writes what is queued and fsyncs the fork now: for the init fork,
    /// whose writes no checkpoint is asked to sync.
    pub fn finish_synced(mut self) {
        self.flush();
        // SAFETY: `rel` is open (new's contract).
        unsafe { pg_sys::smgrimmedsync(pg_sys::RelationGetSmgr(self.rel), self.fork) };
    }
}

/// DELAY_CHKPT_START on this backend while it lives, cleared on the way out
/// however it leaves (an ERROR while writing unwinds through it).
struct DelayCheckpointStart;

impl DelayCheckpointStart {
    fn set() -> DelayCheckpointStart {
        // SAFETY: MyProc is this backend's own PGPROC; the checkpointer only
        // reads the flags.
        unsafe { (*pg_sys::MyProc).delayChkptFlags |= pg_sys::DELAY_CHKPT_START as i32 };
        DelayCheckpointStart
    }
}

impl Drop for DelayCheckpointStart {
    fn drop(&mut self) {
        // SAFETY: as in `set`.
        unsafe { (*pg_sys::MyProc).delayChkptFlags &= !(pg_sys::DELAY_CHKPT_START as i32) };
    }
}
