//! The query slots of the shared-memory ring and their state machine.
//!
//! Each slot has one state word, `seq << 8 | state`, changed only by
//! compare-and-swap (or by a plain store from the one process that owns the
//! slot in that state). A backend claims a free slot by bumping its sequence
//! number, and every later transition names that number, so a process that
//! let go of a slot can never change it again after someone else took it.
//!
//! ```text
//!            backend                 worker                    backend
//! FREE(s) --claim--> FILLING(s+1) --submit--> SUBMITTED --take--> WORKING --answer--> DONE --release--> FREE
//!                                                 |                  |
//!                              backend gives up:  v                  v  backend gives up
//!                                               FREE             ABANDONED --worker answers--> FREE
//! ```
//!
//! Who writes what: the request part only in FILLING (its backend), the
//! reply part only after the worker took the slot (WORKING, or ABANDONED if
//! the backend gave up meanwhile). A slot the worker took becomes FREE only
//! by the worker itself (ABANDONED → FREE) or by the backend after DONE, so
//! the worker never writes into a slot someone else has claimed since. A new
//! worker (after a restart) puts WORKING slots back to SUBMITTED (their
//! backends may still wait) and frees ABANDONED ones: the old worker is gone
//! and will not answer them.
//!
//! The slots are a fixed ring; a backend looks for a free one starting at
//! its own PGPROC number, so concurrent claims seldom meet.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering};

use super::outcome::Outcome;
use crate::gucs::EF_SEARCH_MAX;

/// The most dimensions a query through the worker has (its slot's size and
/// the search kernel's limit); wider ones search on the CPU.
pub const MAX_QUERY_DIM: usize = 2000;

/// The most results one answer carries: a scan's first round is `ef_search` rows.
pub const MAX_HITS: usize = EF_SEARCH_MAX as usize;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    Free = 0,
    Filling = 1,
    Submitted = 2,
    Working = 3,
    Done = 4,
    Abandoned = 5,
}

impl State {
    fn from_bits(b: u64) -> State {
        match b & 0xff {
            0 => State::Free,
            1 => State::Filling,
            2 => State::Submitted,
            3 => State::Working,
            4 => State::Done,
            _ => State::Abandoned,
        }
    }
}

fn word(seq: u64, state: State) -> u64 {
    seq << 8 | state as u64
}

/// What a backend asks. Written by the backend in FILLING only.
#[repr(C)]
pub struct Request {
    /// the backend's PGPROC number (its latch)
    pub procno: i32,
    /// database and index OIDs (the worker's relation lock) and the index's
    /// RelFileNode (its pages)
    pub db: u32,
    pub index: u32,
    pub spc_node: u32,
    pub db_node: u32,
    pub rel_node: u32,
    /// relpersistence is permanent (WAL-logged buffers) rather than unlogged
    pub permanent: bool,
    /// gpu_graph.inject_fault
    pub fault: bool,
    /// the meta page's generation the backend read
    pub generation: u64,
    /// the change log's published position at submission: the copy must
    /// have read the log up to here (u64::MAX on a standby, where WAL
    /// replay writes the pages: the generation alone tells)
    pub need: u64,
    pub k: u32,
    pub ef: u32,
    /// gpu_graph.worker_delay, milliseconds
    pub delay_ms: u32,
    pub dim: u32,
    /// GetCurrentTimestamp() at submission
    pub submitted_at: i64,
    /// a batch (gpu_graph_search_batch) of this many queries, in the
    /// dynamic shared memory segment `batch_dsm` (worker::batch_area),
    /// answered there; 0: one query, in `query`
    pub batch_n: u32,
    pub batch_dsm: u32,
    /// the segment's room, in queries (its layout: worker::batch_area)
    pub batch_cap: u32,
    /// entries of each list a batch searches (0: all; TSDG's prefix)
    pub batch_width: u32,
    /// nodes of each answer the worker gives rows for (batch_area::lead)
    pub batch_lead: u32,
    /// the query as the user gave it (`dim` values)
    pub query: [f32; MAX_QUERY_DIM],
}

/// The worker's answer. Written by the worker in WORKING only.
#[repr(C)]
pub struct Reply {
    pub outcome: Outcome,
    pub n: u32,
    /// node ids, nearest first
    pub nodes: [u32; MAX_HITS],
    /// whether `dists` and `rows` hold each node's search distance and row
    /// (its heap TID) as the copy had them: a copy whose vectors are the
    /// pages' own (not rounded to fp16); else the backend reads them from
    /// the pages
    pub with_rows: bool,
    pub dists: [f32; MAX_HITS],
    pub rows: [u64; MAX_HITS],
    /// when the worker answered (GetCurrentTimestamp)
    pub answered_at: i64,
}

#[repr(C, align(64))]
pub struct Slot {
    word: AtomicU64,
    request: UnsafeCell<Request>,
    reply: UnsafeCell<Reply>,
}

// SAFETY: the word is atomic; the cells are written only by the process the
// state word makes their owner, and read by the other side only after an
// acquire load of the word has seen the owner's release of them.
unsafe impl Sync for Slot {}

impl Slot {
    pub fn state(&self) -> (u64, State) {
        let w = self.word.load(Ordering::Acquire);
        (w >> 8, State::from_bits(w))
    }

    fn cas(&self, seq: u64, from: State, to: State) -> bool {
        self.word.compare_exchange(word(seq, from), word(seq, to), Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Backend: FREE → FILLING under a new sequence number, which it returns.
    pub fn claim(&self) -> Option<u64> {
        let (seq, state) = self.state();
        if state != State::Free {
            return None;
        }
        let next = seq + 1;
        self.word
            .compare_exchange(word(seq, State::Free), word(next, State::Filling), Ordering::AcqRel, Ordering::Relaxed)
            .ok()
            .map(|_| next)
    }

    /// Backend, in FILLING.
    ///
    /// # Safety
    /// The caller holds the slot in FILLING under its sequence number.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn request_mut(&self) -> &mut Request {
        // SAFETY: in FILLING only the claiming backend touches the request
        // (the caller's contract).
        unsafe { &mut *self.request.get() }
    }

    /// Backend: FILLING → SUBMITTED (a release store publishes the request).
    pub fn submit(&self, seq: u64) {
        self.word.store(word(seq, State::Submitted), Ordering::Release);
    }

    /// Backend: lets go of its slot in whatever state it is in.
    pub fn abandon(&self, seq: u64) {
        loop {
            let (s, state) = self.state();
            let to = match state {
                _ if s != seq => return, // let go of already
                State::Filling | State::Submitted | State::Done => State::Free,
                State::Working => State::Abandoned,
                State::Free | State::Abandoned => return,
            };
            if self.cas(seq, state, to) {
                return;
            }
        }
    }

    /// Backend, in DONE.
    ///
    /// # Safety
    /// The slot is DONE under the caller's sequence number.
    pub unsafe fn reply(&self) -> &Reply {
        // SAFETY: in DONE the worker has released the reply and writes it no
        // more (the caller's contract).
        unsafe { &*self.reply.get() }
    }

    /// Worker: SUBMITTED → WORKING; the sequence number of the request taken.
    pub fn take(&self) -> Option<u64> {
        let (seq, state) = self.state();
        (state == State::Submitted && self.cas(seq, State::Submitted, State::Working)).then_some(seq)
    }

    /// Worker, in WORKING.
    ///
    /// # Safety
    /// The worker holds the slot in WORKING (or ABANDONED) under `seq`.
    pub unsafe fn request(&self) -> &Request {
        // SAFETY: once submitted the backend writes the request no more, and
        // the slot cannot be claimed again while the worker holds it (the
        // caller's contract).
        unsafe { &*self.request.get() }
    }

    /// Worker, in WORKING.
    ///
    /// # Safety
    /// As for [`Slot::request`].
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn reply_mut(&self) -> &mut Reply {
        // SAFETY: in WORKING or ABANDONED only the worker touches the reply
        // (the caller's contract).
        unsafe { &mut *self.reply.get() }
    }

    /// Worker: whether the backend has given up on request `seq`.
    pub fn abandoned(&self, seq: u64) -> bool {
        self.state() == (seq, State::Abandoned)
    }

    /// Worker: WORKING → DONE after writing the reply; true when the backend
    /// still waits (wake it). An abandoned slot is freed instead.
    pub fn answer(&self, seq: u64) -> bool {
        if self.cas(seq, State::Working, State::Done) {
            return true;
        }
        self.cas(seq, State::Abandoned, State::Free);
        false
    }

    /// A starting worker: requests the previous worker took are queued again,
    /// abandoned ones freed.
    pub fn recover(&self) {
        loop {
            let (seq, state) = self.state();
            let done = match state {
                State::Working => self.cas(seq, State::Working, State::Submitted),
                State::Abandoned => self.cas(seq, State::Abandoned, State::Free),
                _ => true,
            };
            if done {
                return;
            }
        }
    }
}
