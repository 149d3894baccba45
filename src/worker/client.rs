//! The backend's side: a scan asks the worker for its first round through a
//! query slot, sleeps on its latch until the answer or gpu_graph.gpu_timeout,
//! and hands out the answer's rows.
//!
//! An answer carries each node's row (heap TID) and search distance as the
//! worker's copy holds them (worker::rows says why they are as good as the
//! pages': any row the copy pairs wrongly is one the scan's snapshot cannot
//! see), so the scan reads no index page. Where the copy's distances are
//! not the pages' (fp16 roundings of a storage = 'f32' index on the GPU),
//! each node is re-read under its buffer lock instead, its TID from the
//! pages with the exact distance of the vector stored there (the CPU
//! search's metric functions), free and deleted nodes dropped; batches are
//! checked so too.
//!
//! The worker answers only from a copy at least as new as the meta page the
//! scan read (its generation). Its copies follow the index's writes through
//! the change log (worker::changes): every page a backend writes is noted
//! before the write can commit, and the worker patches the noted pages into
//! its copies before answering, so a row committed before the scan started
//! is in the copy that answers. A copy that cannot follow (the log
//! overflowed, the copy is full and the device has no room to grow it)
//! answers "stale": the worker makes a new one, and the scan searches on
//! the CPU meanwhile.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::search::Hit;
use pgrx::pg_sys;

use super::batch_area::{self, Area};
use super::image::Key;
use super::outcome::Outcome;
use super::own_answer::{self, Own};
use super::ring::{Reply, Request, Slot, MAX_HITS, MAX_QUERY_DIM};
use super::shmem::{shared, Shared};
use super::stats::{add, counters, record, record_batch_fallback};
use super::{nap, set_latch};
use crate::gucs::{SearchDevice, GPU_TIMEOUT, INJECT_FAULT, SEARCH_DEVICE, WORKER_DELAY, WORKER_SPIN};
use crate::storage::meta::Meta;
use crate::storage::page_store::PageStore;

/// The worker's first round of a scan.
pub struct Answer {
    /// the live nodes of the answer, in increasing exact distance
    pub hits: Vec<Hit>,
    /// every node of the answer: a CPU search that continues the scan
    /// expands them and never returns them again
    pub handed: Vec<u32>,
    /// the answer's nodes after those checked (a batch's: see
    /// `batch_first_rounds`), nearest first by the worker's distances
    pub rest: Vec<u32>,
}

/// The first round of a scan from the search worker, or None when the scan
/// is to search on the CPU (counted, with the reason when it wanted the worker).
///
/// # Safety
/// `index` must be the open index `store` reads.
pub unsafe fn first_round(
    index: pg_sys::Relation,
    meta: &Meta,
    store: &PageStore,
    query: &[f32],
    ef: usize,
) -> Option<Answer> {
    if !wanted() {
        add(&counters().scans_cpu, 1);
        return None;
    }
    // SAFETY: `index` is open (the caller's contract).
    let answer = unsafe { ask(index, meta, query, ef) };
    record(answer.as_ref().err().copied().unwrap_or(Outcome::Answered));
    answer.ok().map(|Replied { nodes, hits }| {
        let t = Instant::now();
        let answer = match hits {
            Some(hits) => Answer { hits, handed: nodes, rest: Vec::new() },
            None => {
                // the nearest SCAN_VERIFY_FIRST by the worker's distances
                // now, the rest if the scan wants more rows (verify_nodes)
                add(&counters().scans_reread, 1);
                let first = nodes.len().min(SCAN_VERIFY_FIRST);
                let mut answer = verify(store, meta, &[query], |_| &nodes[..first]).pop().expect("one answer a query");
                answer.rest = nodes[first..].to_vec();
                answer.handed = nodes;
                answer
            }
        };
        counters().latency.verify.record(t.elapsed().as_micros() as i64);
        answer
    })
}

/// A scan's answer from the worker: its nodes, nearest first, and when the
/// copy gave each node's search distance and row (worker::rows) the hits
/// the scan hands out.
struct Replied {
    nodes: Vec<u32>,
    hits: Option<Vec<Hit>>,
}

/// Nodes of a scan's first round read again from the pages before its
/// first row is handed out: the worker's answer holds ef nodes nearest
/// first (by the GPU copy's distances: those of the pages' own values), and
/// a LIMIT 10 needs 10 live rows; the rest are read when the scan asks for
/// more. Re-reading all 40 of the default ef_search took the backend ~20 us
/// a scan on 1M SIFT (H200), a tenth of its round trip.
const SCAN_VERIFY_FIRST: usize = 16;

/// The nodes nearest a new row's stored vector (`stored`, graph distance)
/// from the search worker, nearest first, at most `ef` of them: an insert's
/// neighbour search (engine::insert::insert_near), the larger part of its
/// CPU time, done on the GPU's copy. None when the insert is to search on
/// the CPU: searches not wanted on the worker, a metric whose searches do
/// not order by graph distance, or no answer (counted either way).
///
/// # Safety
/// `index` must be the open index `meta` was read from.
pub unsafe fn insert_neighbours(index: pg_sys::Relation, meta: &Meta, stored: &[f32], ef: usize) -> Option<Vec<u32>> {
    // SAFETY: reads the clock; any backend may.
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    // inner product searches by inner product, not by the graph's L2 over
    // the stored vectors; L2 and cosine (unit vectors) order alike
    if !wanted() || meta.metric() == Metric::InnerProduct || now < INSERTS_ON_CPU_UNTIL.load(Ordering::Relaxed) {
        add(&counters().inserts_cpu, 1);
        return None;
    }
    let timeout = Duration::from_millis(GPU_TIMEOUT.get() as u64);
    let fill = |r: &mut Request| r.query[..stored.len()].copy_from_slice(stored);
    // SAFETY: `index` is open (the caller's contract). Not in the scans'
    // latencies: a wider beam than theirs.
    let nodes = unsafe {
        exchange(index, meta, stored.len(), ef, Patience { timeout, poll: false }, fill, |answered, _| match answered {
            Answered::Reply(reply) => reply.nodes[..reply.n as usize].to_vec(),
            Answered::Own(own) => own.hits.iter().map(|h| h.1).collect(),
        })
    }
    .inspect_err(|o| {
        if *o == Outcome::Timeout {
            // SAFETY: as above.
            let now = unsafe { pg_sys::GetCurrentTimestamp() };
            let backoff = (timeout.as_micros() as i64 * 10).max(INSERT_BACKOFF_US);
            INSERTS_ON_CPU_UNTIL.store(now + backoff, Ordering::Relaxed);
        }
    })
    .ok();
    add(if nodes.is_some() { &counters().inserts_worker } else { &counters().inserts_cpu }, 1);
    nodes
}

/// After an insert waited gpu_timeout for the worker in vain, this
/// backend's inserts search on the CPU for ten times as long, at least a
/// second (a COPY of many rows behind a stalled worker would otherwise
/// wait that long a row).
static INSERTS_ON_CPU_UNTIL: AtomicI64 = AtomicI64::new(0);
const INSERT_BACKOFF_US: i64 = 1_000_000;

/// Whether searches are to ask the worker (gpu_graph.search_device).
pub(super) fn wanted() -> bool {
    match SEARCH_DEVICE.get() {
        SearchDevice::Cpu => false,
        SearchDevice::Gpu => true,
        SearchDevice::Auto => shared().is_some_and(|s| s.configured),
    }
}

/// The slot this backend holds, for the exit callback (a FATAL error or
/// pg_terminate_backend ends the process without unwinding).
static HELD_SLOT: AtomicUsize = AtomicUsize::new(usize::MAX);
static HELD_SEQ: AtomicU64 = AtomicU64::new(0);
static EXIT_CALLBACK: std::sync::Once = std::sync::Once::new();

/// A claimed slot; dropping it lets go of the slot in whatever state it is
/// (also when an ERROR unwinds through the wait).
struct Claim {
    slot: &'static Slot,
    seq: u64,
}

impl Claim {
    fn new(shared: &'static Shared) -> Option<Claim> {
        let slots = shared.slots();
        // each backend starts at its own place, so claims rarely collide
        // SAFETY: MyProc is this backend's PGPROC, set up before any query runs.
        let start = unsafe { (*pg_sys::MyProc).pgprocno } as usize % slots.len();
        (0..slots.len()).map(|j| (start + j) % slots.len()).find_map(|i| {
            let seq = slots[i].claim()?;
            // SAFETY: a backend may register exit callbacks at any time; this
            // one has the signature before_shmem_exit expects.
            EXIT_CALLBACK
                .call_once(|| unsafe { pg_sys::before_shmem_exit(Some(let_go_at_exit), pg_sys::Datum::from(0)) });
            HELD_SEQ.store(seq, Ordering::Relaxed);
            HELD_SLOT.store(i, Ordering::Relaxed);
            Some(Claim { slot: &slots[i], seq })
        })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.slot.abandon(self.seq);
        HELD_SLOT.store(usize::MAX, Ordering::Relaxed);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn let_go_at_exit(_code: i32, _arg: pg_sys::Datum) {
    let i = HELD_SLOT.load(Ordering::Relaxed);
    if let (Some(s), true) = (shared(), i != usize::MAX) {
        s.slots()[i].abandon(HELD_SEQ.load(Ordering::Relaxed));
        // the claim was never dropped (a FATAL while waiting): let go once
        HELD_SLOT.store(usize::MAX, Ordering::Relaxed);
    }
}

/// Submits the query and waits; the answer.
///
/// # Safety
/// `index` must be an open index relation.
unsafe fn ask(index: pg_sys::Relation, meta: &Meta, query: &[f32], ef: usize) -> Result<Replied, Outcome> {
    let timeout = Duration::from_millis(GPU_TIMEOUT.get() as u64);
    let fill = |r: &mut Request| r.query[..query.len()].copy_from_slice(query);
    // SAFETY: the caller's contract.
    unsafe {
        exchange(index, meta, query.len(), ef, Patience { timeout, poll: true }, fill, |answered, submitted_at| {
            // SAFETY: reads the clock; any backend may.
            let now = pg_sys::GetCurrentTimestamp();
            let c = counters();
            c.latency.roundtrip.record(now - submitted_at);
            match answered {
                Answered::Reply(reply) => {
                    c.latency.wake.record(now - reply.answered_at);
                    let n = reply.n as usize;
                    let nodes = &reply.nodes[..n];
                    let hits = reply
                        .with_rows
                        .then(|| hits_with_rows(meta, (0..n).map(|j| (reply.dists[j], nodes[j], reply.rows[j]))));
                    Replied { nodes: nodes.to_vec(), hits }
                }
                Answered::Own(own) => {
                    // read where the GPU wrote it: no wake-up
                    c.latency.wake.record(0);
                    own_answer::record_kernel(&own);
                    let nodes = own.hits.iter().map(|h| h.1).collect();
                    // a row the copy never read (0): the pages tell
                    let hits = own
                        .hits
                        .iter()
                        .all(|h| super::rows::known(h.2))
                        .then(|| hits_with_rows(meta, own.hits.iter().copied()));
                    Replied { nodes, hits }
                }
            }
        })
    }
}

/// How long a request waits for its answer, and whether it polls first
/// (scans: see [`wait`]).
#[derive(Clone, Copy)]
struct Patience {
    timeout: Duration,
    poll: bool,
}

/// How a request was answered: the worker's reply, or the answer the
/// backend read where the GPU wrote it (worker::own_answer).
enum Answered<'a> {
    Reply(&'a Reply),
    Own(Own),
}

/// Claims a slot, fills its request (`fill` the query part), submits and
/// waits as `patience` says; `read` takes what it needs of the answer.
///
/// # Safety
/// `index` must be an open index relation.
unsafe fn exchange<T>(
    index: pg_sys::Relation,
    meta: &Meta,
    dim: usize,
    ef: usize,
    patience: Patience,
    fill: impl FnOnce(&mut Request),
    read: impl FnOnce(Answered<'_>, i64) -> T,
) -> Result<T, Outcome> {
    let shared = shared().ok_or(Outcome::Absent)?;
    shared.worker().ok_or(Outcome::Absent)?;
    // SAFETY: `index` is open (the caller's contract), with its relcache
    // entry and pg_class row.
    let rel = unsafe { &*index };
    // SAFETY: as above.
    let persistence = unsafe { (*rel.rd_rel).relpersistence } as u8;
    // a temporary index lives in this backend's local buffers
    if persistence == pg_sys::RELPERSISTENCE_TEMP || dim > MAX_QUERY_DIM {
        return Err(Outcome::Unfit);
    }
    super::own_core::keep_off(shared.worker_core());
    let claim = Claim::new(shared).ok_or(Outcome::Busy)?;
    let starts = shared.worker_starts.load(Ordering::Acquire);
    // SAFETY: reads the clock; any backend may.
    let submitted_at = unsafe { pg_sys::GetCurrentTimestamp() };
    {
        // SAFETY: the claim holds the slot in FILLING under its sequence number.
        let r = unsafe { claim.slot.request_mut() };
        // SAFETY: MyProc and MyDatabaseId are this backend's, set before any query runs.
        (r.procno, r.db) = unsafe { ((*pg_sys::MyProc).pgprocno, pg_sys::MyDatabaseId.to_u32()) };
        r.index = rel.rd_id.to_u32();
        // SAFETY: `index` is open (the caller's contract).
        let key = unsafe { Key::of_relation(index) };
        (r.spc_node, r.db_node, r.rel_node) = (key.spc, key.db, key.rel);
        r.permanent = persistence == pg_sys::RELPERSISTENCE_PERMANENT;
        r.fault = INJECT_FAULT.get();
        r.generation = meta.generation;
        // SAFETY: reads shared memory's recovery state; any backend may.
        r.need = if unsafe { pg_sys::RecoveryInProgress() } {
            u64::MAX
        } else if super::changes::unpublished() {
            // a transaction that wrote needs its own rows in the copy too
            // (published only at its commit): its scans must see them, and
            // an insert linked from a copy without the rows its statement
            // wrote just before found neighbours only among older rows,
            // and some rows no search reached
            shared.changes.head()
        } else {
            shared.changes.published()
        };
        r.ef = ef.min(MAX_HITS) as u32;
        r.k = r.ef;
        r.delay_ms = WORKER_DELAY.get() as u32;
        r.dim = dim as u32;
        r.submitted_at = submitted_at;
        r.batch_n = 0;
        r.batch_dsm = 0;
        r.batch_cap = 0;
        r.batch_width = 0;
        r.batch_lead = 0;
        fill(r);
    }
    claim.slot.submit(claim.seq);
    set_latch(shared.worker_procno.load(Ordering::Acquire));
    if let Some(own) = wait(shared, &claim, starts, patience)? {
        return match own {
            Ok(own) => Ok(read(Answered::Own(own), submitted_at)),
            Err(why) => {
                pgrx::log!("gpu_graph: an answer read from the answer area made no sense: {why}");
                Err(Outcome::Error)
            }
        };
    }
    // SAFETY: wait returned Ok(None): the slot is DONE under the claim's
    // sequence number.
    let reply = unsafe { claim.slot.reply() };
    match reply.outcome {
        Outcome::Answered => Ok(read(Answered::Reply(reply), submitted_at)),
        other => Err(other),
    }
}

/// Queries of a batch sent to the worker at a time: one segment of at most
/// BATCH_QUERIES, and of at most BATCH_BYTES of queries.
const BATCH_QUERIES: usize = 8192;
const BATCH_BYTES: usize = 32 << 20;

/// The most queries of `dim` values one segment to the worker takes.
pub fn batch_segment(dim: usize) -> usize {
    BATCH_QUERIES.min(BATCH_BYTES / (4 * dim.max(1))).max(1)
}

/// A batch call (gpu_graph_search_batch) as the worker sees it: k rows a
/// query, beam ef, the first `width` entries of each list (0: all), and
/// the shared-memory segment its queries go to the worker in, one for all
/// its segments of queries (made at the first, for `cap`).
pub struct BatchCall {
    pub k: usize,
    pub ef: usize,
    pub width: usize,
    area: Option<Area>,
    cap: usize,
}

impl BatchCall {
    pub fn new(k: usize, ef: usize, width: usize, cap: usize) -> BatchCall {
        BatchCall { k, ef, width, area: None, cap }
    }
}

/// How long a batch may take in the worker before its queries search on
/// the CPU instead: gpu_graph.gpu_timeout and 100 us a query (the GPU
/// takes about 1 us, the CPU test mode 50 us on two cores).
fn batch_timeout(n: usize) -> Duration {
    Duration::from_millis(GPU_TIMEOUT.get() as u64) + Duration::from_micros(100 * n as u64)
}

/// The first rounds of a batch's queries (gpu_graph_search_batch, `k` rows
/// each, through the first `width` entries of each list: 0 all) from the
/// worker's batch search: the first nodes of each answer (batch_area::lead)
/// with the rows and distances of the worker's copy where its distances are
/// the pages' own, as a scan's first round takes them, else checked against
/// the pages; the rest when a query needs them. None when they are to
/// search on the CPU (too many values for one segment, a worker that is
/// absent, busy, stale or failed).
///
/// # Safety
/// `index` must be the open index `store` reads.
pub unsafe fn batch_first_rounds(
    index: pg_sys::Relation,
    meta: &Meta,
    store: &PageStore,
    queries: &[&[f32]],
    call: &mut BatchCall,
) -> Option<Vec<Answer>> {
    let (k, ef, width) = (call.k, call.ef, call.width);
    let (n, dim) = (queries.len(), queries.first()?.len());
    if !wanted() || n > batch_segment(dim) {
        return None;
    }
    let hits = ef.min(MAX_HITS);
    let lead = batch_area::lead(k, hits);
    let slot = &mut call.area;
    if !slot.as_ref().is_some_and(|a| a.fits(n, dim, hits, lead)) {
        *slot = None; // the old one goes before the new one is made
        *slot = Some(Area::create(call.cap.max(n).min(batch_segment(dim)), dim, hits, lead));
    }
    let area = slot.as_mut().expect("made above");
    area.set_len(n);
    area.clear_answers();
    for (dst, q) in area.queries_mut().chunks_exact_mut(dim).zip(queries) {
        dst.copy_from_slice(q);
    }
    let (handle, room) = (area.handle(), area.cap() as u32);
    let fill = |r: &mut Request| {
        (r.batch_n, r.batch_dsm, r.batch_cap, r.batch_width) = (n as u32, handle, room, width as u32);
        r.batch_lead = lead as u32;
    };
    // SAFETY: the caller's contract.
    let r = unsafe {
        exchange(index, meta, dim, ef, Patience { timeout: batch_timeout(n), poll: false }, fill, |answered, _| {
            // a batch never polls, so the worker replies (own answers are
            // a polling scan's)
            matches!(answered, Answered::Reply(r) if r.with_rows)
        })
    };
    let c = counters();
    add(&c.batches, 1);
    let with_rows = match r {
        Ok(w) => w,
        Err(o) => {
            // a worker that took the segment may still write answers into
            // it (a timeout): the next segment of queries gets a new one
            call.area = None;
            record_batch_fallback(o);
            pgrx::debug1!("gpu_graph: a batch of {n} queries searches on the CPU: the worker answered {o:?}");
            return None;
        }
    };
    add(&c.batch_queries, n as u64);
    // only the lead of each answer is taken now: the rows a query returns
    // are nearly always among them
    let cut = |j: usize| area.answer(j).len().min(lead);
    let mut answers = if with_rows {
        (0..n).map(|j| lead_with_rows(area, meta, j)).collect()
    } else {
        add(&c.batch_queries_reread, n as u64);
        verify(store, meta, queries, |j| &area.answer(j)[..cut(j)])
    };
    for (j, a) in answers.iter_mut().enumerate() {
        // the lead was handed out; the rest is handed out too
        a.rest = area.answer(j)[cut(j)..].to_vec();
        a.handed.extend_from_slice(&a.rest);
    }
    Some(answers)
}

/// Query j's lead with the rows and search distances the worker's copy
/// gave (as a scan's reply with rows).
fn lead_with_rows(area: &Area, meta: &Meta, j: usize) -> Answer {
    let (dists, rows) = area.lead_of(j);
    let nodes = &area.answer(j)[..dists.len()];
    let hits = hits_with_rows(meta, (0..nodes.len()).map(|i| (dists[i], nodes[i], rows[i])));
    Answer { hits, handed: nodes.to_vec(), rest: Vec::new() }
}

/// An answer's (search distance, node, row) from the worker's copy
/// (worker::rows) as the hits a scan or batch hands out, whether the
/// worker replied them or the scan read them where the GPU wrote them.
/// Nodes allocated after the caller read the meta page hold rows its
/// snapshot cannot see: dropped (as in `verify`).
fn hits_with_rows(meta: &Meta, hits: impl Iterator<Item = (f32, u32, u64)>) -> Vec<Hit> {
    hits.filter(|&(_, node, _)| node < meta.node_count)
        .map(|(dist, node, payload)| Hit { dist, node, payload })
        .collect()
}

/// The live nodes among `nodes` (an answer's rest) with their rows and
/// exact distances from the pages, nearest first, as [`verify`] gives them.
pub fn verify_nodes(store: &PageStore, meta: &Meta, query: &[f32], nodes: &[u32]) -> Vec<Hit> {
    verify(store, meta, &[query], |_| nodes).pop().map(|a| a.hits).unwrap_or_default()
}

/// Waits until the slot is answered, the timeout passes or the worker is
/// gone: Ok(None) when the worker's reply is in the slot (DONE), Ok(Some)
/// when the scan read its answer where the GPU wrote it (worker::own_answer).
/// Interrupts are served while it sleeps: a cancel raises its ERROR here and
/// the claim lets go of the slot as the ERROR unwinds.
fn wait(
    shared: &Shared,
    claim: &Claim,
    starts: u64,
    patience: Patience,
) -> Result<Option<Result<Own, String>>, Outcome> {
    let Patience { timeout, poll } = patience;
    let t0 = Instant::now();
    let done = || claim.slot.state() == (claim.seq, super::ring::State::Done);
    // gpu_graph.worker_spin: a scan polls first, yielding its core between
    // two looks. An answer seen so needs no signal from the worker
    // (SetLatch signals only a process asleep on its latch) and no sleep and
    // wake-up of the backend; the yield gives the core to whatever else can
    // run, so polling costs the others little when the backends outnumber
    // the cores. H200, 16 cores, 1M SIFT, ef_search 10, one call: polling
    // with yields 108.6k / 146.2k / 161.9k / 159.9k queries/s at 16 / 24 /
    // 32 / 64 clients, against 102-103k / 103k polling without them and
    // 110k / 120-123k sleeping at once (polling without yields, another
    // call: 106k at 32 clients, 65k at 64). While it polls, a scan reads
    // its answer on the GPU itself. Inserts and batches sleep at once.
    let spin = if poll { Duration::from_micros(WORKER_SPIN.get().max(0) as u64) } else { Duration::ZERO };
    while t0.elapsed() < spin {
        if done() {
            return Ok(None);
        }
        if let Some(own) = own_answer::take(shared, claim.slot, claim.seq, starts) {
            return Ok(Some(own));
        }
        // SAFETY: no arguments; lets another runnable thread have the core.
        unsafe { libc::sched_yield() };
    }
    // asleep from now on: the worker answers (and wakes) this request
    claim.slot.sleep(claim.seq);
    if poll {
        // the GPU may have finished before the worker saw the sleep
        if let Some(own) = own_answer::take(shared, claim.slot, claim.seq, starts) {
            return Ok(Some(own));
        }
    }
    loop {
        if done() {
            return Ok(None);
        }
        // a worker that exits wakes its waiters; one that restarted will not
        // answer what the old one took
        if shared.worker().is_none() || shared.worker_starts.load(Ordering::Acquire) != starts {
            return Err(Outcome::Absent);
        }
        let left = timeout.saturating_sub(t0.elapsed());
        if left.is_zero() {
            return Err(Outcome::Timeout);
        }
        // look again at least every 100 ms whatever wakes us
        nap(left.min(Duration::from_millis(100)));
    }
}

/// Re-reads each node of the answers under its buffer lock: free and
/// deleted nodes are dropped, the rest get their TID and exact distance
/// from the pages, nearest first. Nodes allocated after the scan read the
/// meta page (a copy can be newer) hold rows its snapshot cannot see:
/// dropped too. Query j's answer is `nodes(j)`; each vector page is read
/// once for all the nodes on it (a batch's answers share many).
fn verify<'a>(store: &PageStore, meta: &Meta, queries: &[&[f32]], nodes: impl Fn(usize) -> &'a [u32]) -> Vec<Answer> {
    let metric = meta.metric();
    let prepared: Vec<Vec<f32>> = queries.iter().map(|q| metric.prepare_query(q)).collect();
    // (query, node) of every node the scan's snapshot may see
    let (mut of, mut all) = (Vec::new(), Vec::new());
    for j in 0..queries.len() {
        for &node in nodes(j).iter().filter(|&&node| node < meta.node_count) {
            of.push(j as u32);
            all.push(node);
        }
    }
    let visits = store.visit_many(&all, |i, x| metric.search_distance(&prepared[of[i] as usize], x));
    let mut answers: Vec<Answer> =
        (0..queries.len()).map(|j| Answer { hits: Vec::new(), handed: nodes(j).to_vec(), rest: Vec::new() }).collect();
    for ((&j, &node), v) in of.iter().zip(&all).zip(visits) {
        if let Some(v) = v.filter(|v| !v.deleted) {
            answers[j as usize].hits.push(Hit { dist: v.dist, node, payload: v.payload });
        }
    }
    for a in &mut answers {
        a.hits.sort_by(|a, b| a.dist.total_cmp(&b.dist).then(a.node.cmp(&b.node)));
    }
    answers
}
