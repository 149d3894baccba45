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
//! A scan's search on the GPU can be collected by the scan itself
//! (worker::own_answer): the worker publishes where the answer will be (its
//! route) and leaves it to the backend while that one polls.
//!
//! ```text
//! WORKING --backend sees the GPU finished--> COLLECTING --read--> COLLECTED --worker frees the GPU slot--> FREE
//!    |
//!    +-- backend asleep (it said so), the GPU finished --> ANSWERING (worker) --answer--> DONE
//! ```
//!
//! One compare-and-swap out of WORKING decides who reads the answer (the
//! backend's to COLLECTING, the worker's to ANSWERING or DONE), so the
//! worker never frees the GPU slot under a backend reading it. A backend
//! that gives up in ANSWERING leaves it ABANDONED, as in WORKING.
//!
//! The slots are a fixed ring; a backend looks for a free one starting at
//! its own PGPROC number, so concurrent claims seldom meet.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering};

use super::outcome::Outcome;
use crate::gucs::EF_SEARCH_MAX;
use gpu_graph_gpu::search::answers::Route;

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
    Collecting = 6,
    Collected = 7,
    Answering = 8,
}

impl State {
    fn from_bits(b: u64) -> State {
        match b & 0xff {
            0 => State::Free,
            1 => State::Filling,
            2 => State::Submitted,
            3 => State::Working,
            4 => State::Done,
            6 => State::Collecting,
            7 => State::Collected,
            8 => State::Answering,
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
    /// the sequence number whose `route` the worker has published
    route_seq: AtomicU64,
    /// the sequence number of the request whose backend sleeps on its latch
    /// (the worker then answers it)
    asleep: AtomicU64,
    /// where the GPU writes the answer (written by the worker before it
    /// publishes `route_seq`)
    route: UnsafeCell<Route>,
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
                State::Working | State::Answering => State::Abandoned,
                // (a backend that read its answer: the worker frees the slot)
                State::Collecting => State::Collected,
                State::Free | State::Abandoned | State::Collected => return,
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

    /// Worker: WORKING (or ANSWERING) → DONE after writing the reply; true
    /// when the backend still waits (wake it). An abandoned slot is freed
    /// instead.
    pub fn answer(&self, seq: u64) -> bool {
        if self.cas(seq, State::Working, State::Done) || self.cas(seq, State::Answering, State::Done) {
            return true;
        }
        self.cas(seq, State::Abandoned, State::Free);
        false
    }

    /// Worker, in WORKING: where the GPU will write request `seq`'s answer,
    /// for its backend to read there.
    pub fn publish(&self, seq: u64, route: Route) {
        // SAFETY: only the worker writes the route, in WORKING, before the
        // release store below; a backend reads it only after an acquire
        // load of that store under its own sequence number.
        unsafe { *self.route.get() = route };
        self.route_seq.store(seq, Ordering::Release);
    }

    /// Backend: the route the worker published for request `seq`.
    pub fn route(&self, seq: u64) -> Option<Route> {
        // SAFETY: published under `seq` (acquire): written before, and not
        // again while the slot is this request's.
        (self.route_seq.load(Ordering::Acquire) == seq).then(|| unsafe { *self.route.get() })
    }

    /// Backend: WORKING → COLLECTING; true when the backend now reads the
    /// answer itself (the worker will not touch it until COLLECTED).
    pub fn collect(&self, seq: u64) -> bool {
        self.cas(seq, State::Working, State::Collecting)
    }

    /// Backend: COLLECTING → COLLECTED, the answer read.
    pub fn collected(&self, seq: u64) {
        self.word.store(word(seq, State::Collected), Ordering::Release);
    }

    /// Backend: about to sleep on its latch until the worker answers.
    pub fn sleep(&self, seq: u64) {
        // (SeqCst: ordered before the backend's next look at the state)
        self.asleep.store(seq, Ordering::SeqCst);
    }

    /// Worker: whether the backend of request `seq` sleeps (or will).
    pub fn asleep(&self, seq: u64) -> bool {
        self.asleep.load(Ordering::SeqCst) == seq
    }

    /// Worker: WORKING → ANSWERING, before it reads the answer of a request
    /// whose backend could read it too; false when the backend has.
    pub fn answering(&self, seq: u64) -> bool {
        self.cas(seq, State::Working, State::Answering)
    }

    /// Worker: COLLECTED → FREE once the GPU slot is free again.
    pub fn free_collected(&self, seq: u64) -> bool {
        self.cas(seq, State::Collected, State::Free)
    }

    /// A starting worker, before its device (and answer area) is set up:
    /// requests the previous worker took are queued again, abandoned and
    /// collected ones freed, and a backend reading its answer is let finish.
    pub fn recover(&self) {
        self.route_seq.store(0, Ordering::Release);
        loop {
            let (seq, state) = self.state();
            let done = match state {
                State::Working | State::Answering => self.cas(seq, state, State::Submitted),
                State::Abandoned | State::Collected => self.cas(seq, state, State::Free),
                State::Collecting => {
                    std::hint::spin_loop();
                    false
                }
                _ => true,
            };
            if done {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot as shared memory starts it: all zero, FREE under sequence 0.
    fn slot() -> Box<Slot> {
        // SAFETY: every field of a Slot is valid all zero (atomics, plain
        // numbers and arrays of them), as the shared memory that holds them.
        unsafe { Box::<Slot>::new_zeroed().assume_init() }
    }

    /// Claimed, submitted and taken by the worker: WORKING under its seq.
    fn working(s: &Slot) -> u64 {
        let seq = s.claim().expect("a free slot");
        s.submit(seq);
        assert_eq!(s.take(), Some(seq));
        seq
    }

    fn route() -> Route {
        Route { slot: 3, cmd: 7, ctas: 2, k: 10, max_expand: 104 }
    }

    #[test]
    fn a_polling_scan_reads_its_own_answer_and_the_worker_frees_the_slot() {
        let s = slot();
        let seq = working(&s);
        assert_eq!(s.route(seq), None, "nothing published yet");
        s.publish(seq, route());
        assert_eq!(s.route(seq), Some(route()));
        assert_eq!(s.route(seq + 1), None, "a route is its request's only");
        assert!(s.collect(seq));
        assert!(!s.answering(seq), "the worker must not read an answer the scan reads");
        assert!(!s.answer(seq), "nor answer it");
        assert_eq!(s.state(), (seq, State::Collecting));
        s.collected(seq);
        assert!(s.free_collected(seq));
        assert_eq!(s.state(), (seq, State::Free));
        assert_eq!(s.claim(), Some(seq + 1));
    }

    #[test]
    fn the_worker_answers_a_scan_that_sleeps_and_the_scan_keeps_out() {
        let s = slot();
        let seq = working(&s);
        s.publish(seq, route());
        assert!(!s.asleep(seq));
        s.sleep(seq);
        assert!(s.asleep(seq));
        assert!(s.answering(seq));
        assert!(!s.collect(seq), "one compare-and-swap out of WORKING decides who reads");
        assert!(s.answer(seq), "its backend still waits: wake it");
        assert_eq!(s.state(), (seq, State::Done));
    }

    #[test]
    fn a_backend_that_gives_up_leaves_each_state_to_its_owner() {
        // reading its answer: the worker still frees the GPU slot
        let s = slot();
        let seq = working(&s);
        assert!(s.collect(seq));
        s.abandon(seq);
        assert_eq!(s.state(), (seq, State::Collected));
        assert!(s.free_collected(seq));
        // while the worker answers: abandoned, freed by the worker's answer
        let seq = working(&s);
        assert!(s.answering(seq));
        s.abandon(seq);
        assert_eq!(s.state(), (seq, State::Abandoned));
        assert!(!s.answer(seq), "no one to wake");
        assert_eq!(s.state(), (seq, State::Free));
    }

    #[test]
    fn a_new_worker_requeues_what_the_old_one_took_and_forgets_its_routes() {
        let s = slot();
        let seq = working(&s);
        s.publish(seq, route());
        assert!(s.answering(seq));
        s.recover();
        assert_eq!(s.state(), (seq, State::Submitted));
        assert_eq!(s.route(seq), None, "the old worker's answer area is gone");
        assert_eq!(s.take(), Some(seq));
        assert!(s.collect(seq));
        s.collected(seq);
        s.recover();
        assert_eq!(s.state(), (seq, State::Free));
    }
}
