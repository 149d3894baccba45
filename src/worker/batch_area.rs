//! A batch's queries and answers on their way between a backend and the
//! worker (gpu_graph_search_batch): a dynamic shared memory segment the
//! backend creates for the call, which the worker attaches while it works
//! on the batch. The slot's request names it (`Request::batch_dsm`) and
//! says how many queries it holds (`batch_n`, of `dim` values each).
//!
//! Layout for room for `cap` queries (`Request::batch_cap`), in this
//! order: `cap * dim` f32 queries (as the user gave them, the first `n`
//! used), `cap` u32 answer counts, `cap * hits` u32 node ids (each query's
//! answer, nearest first, `hits` = the request's `ef`), then for the first
//! `lead` of each answer (see [`lead`]) their f32 search distances and, on
//! an 8-byte boundary, their u64 rows (heap TIDs): from the worker's copy
//! where its distances are the pages' own (the reply's `with_rows`), so the
//! backend reads no index page for them, as for a scan (worker::rows).
//! The worker writes the answers only while it holds the slot (WORKING),
//! and the backend reads them only after it saw DONE, as for a single
//! query's reply.
//!
//! One segment serves all the segments of queries of a call (the backend
//! keeps it), and the worker keeps its mapping from one to the next
//! (`Worker::segment`): a new mapping is a page fault on every page the
//! worker touches (measured: sending a batch took the worker as long as
//! the GPU's search).

use pgrx::pg_sys;

/// The answers' nodes a backend takes first, of `hits` for a call of `k`
/// rows a query: the rows a query returns are nearly always among them
/// (the rest wait until a query needs them, and are read from the pages).
pub fn lead(k: usize, hits: usize) -> usize {
    (k + LEAD_AHEAD).min(hits)
}

/// Nodes of an answer beyond the k asked for in its lead (a few of the k
/// may be invisible to the caller).
const LEAD_AHEAD: usize = 8;

/// Byte offsets of the lead's distances and rows, and the segment's bytes.
fn offsets(cap: usize, dim: usize, hits: usize, lead: usize) -> (usize, usize, usize) {
    let dists = 4 * (cap * dim + cap + cap * hits);
    let rows = (dists + 4 * cap * lead).next_multiple_of(8);
    (dists, rows, rows + 8 * cap * lead)
}

/// Bytes of a batch's segment.
pub fn bytes(cap: usize, dim: usize, hits: usize, lead: usize) -> usize {
    offsets(cap, dim, hits, lead).2
}

/// A mapped batch segment.
pub struct Area {
    seg: *mut pg_sys::dsm_segment,
    base: *mut u8,
    /// queries it has room for, and holds now
    cap: usize,
    n: usize,
    dim: usize,
    hits: usize,
    lead: usize,
}

impl Area {
    /// Backend: a new segment with room for `cap` queries; detached (and
    /// so destroyed) when dropped, or by the transaction's resource owner
    /// on an ERROR.
    pub fn create(cap: usize, dim: usize, hits: usize, lead: usize) -> Area {
        // SAFETY: in a transaction, with a resource owner; dsm_create
        // raises an ERROR when it cannot make the segment.
        unsafe {
            let seg = pg_sys::dsm_create(bytes(cap, dim, hits, lead), 0);
            Area { seg, base: pg_sys::dsm_segment_address(seg) as *mut u8, cap, n: 0, dim, hits, lead }
        }
    }

    /// Whether this segment takes `n` queries of `dim` values with `hits`
    /// answers each, `lead` of them with rows.
    pub fn fits(&self, n: usize, dim: usize, hits: usize, lead: usize) -> bool {
        n <= self.cap && dim == self.dim && hits == self.hits && lead == self.lead
    }

    /// Sets the queries it holds (at most `cap`); the backend clears their
    /// answers before it sends them.
    pub fn set_len(&mut self, n: usize) {
        assert!(n <= self.cap, "{n} queries in a segment for {}", self.cap);
        self.n = n;
    }

    /// Backend, before sending: no answer until the worker writes one.
    pub fn clear_answers(&mut self) {
        // SAFETY: the counts array has cap entries; only the backend holds
        // the segment before it is sent.
        unsafe { std::ptr::write_bytes(self.counts_and_nodes().0, 0, self.n) };
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Worker: the segment a request names (room for `cap` queries), or
    /// None when its backend has already let go of it.
    ///
    /// # Safety
    /// On the worker's main thread, with its resource owner.
    pub unsafe fn attach(handle: u32, cap: usize, dim: usize, hits: usize, lead: usize) -> Option<Area> {
        // SAFETY: the caller's contract; dsm_attach returns NULL for a
        // segment that no longer exists.
        unsafe {
            let seg = pg_sys::dsm_attach(handle);
            if seg.is_null() {
                return None;
            }
            if pg_sys::dsm_segment_map_length(seg) < bytes(cap, dim, hits, lead) {
                pg_sys::dsm_detach(seg);
                return None;
            }
            Some(Area { seg, base: pg_sys::dsm_segment_address(seg) as *mut u8, cap, n: 0, dim, hits, lead })
        }
    }

    /// Worker: whether this mapping is the segment a request names.
    pub fn is(&self, handle: u32, cap: usize, dim: usize, hits: usize, lead: usize) -> bool {
        self.handle() == handle && self.cap == cap && self.dim == dim && self.hits == hits && self.lead == lead
    }

    pub fn handle(&self) -> u32 {
        // SAFETY: a live segment.
        unsafe { pg_sys::dsm_segment_handle(self.seg) }
    }

    pub fn queries(&self) -> &[f32] {
        // SAFETY: the segment holds n * dim floats first (bytes()), mapped
        // while self lives; the backend writes them before submitting and
        // not after.
        unsafe { std::slice::from_raw_parts(self.base as *const f32, self.n * self.dim) }
    }

    /// Backend, before submitting.
    pub fn queries_mut(&mut self) -> &mut [f32] {
        // SAFETY: as for queries(); only the backend holds it yet.
        unsafe { std::slice::from_raw_parts_mut(self.base as *mut f32, self.n * self.dim) }
    }

    fn counts_and_nodes(&self) -> (*mut u32, *mut u32) {
        // SAFETY: offsets within bytes(cap, dim, hits).
        unsafe {
            let counts = (self.base as *mut u32).add(self.cap * self.dim);
            (counts, counts.add(self.cap))
        }
    }

    fn dists_and_rows(&self) -> (*mut f32, *mut u64) {
        let (dists, rows, _) = offsets(self.cap, self.dim, self.hits, self.lead);
        // SAFETY: offsets within bytes(cap, dim, hits, lead), rows 8-aligned
        // (a segment's address is).
        unsafe { (self.base.add(dists) as *mut f32, self.base.add(rows) as *mut u64) }
    }

    /// Worker, holding the slot: query j's answer ((search distance, node),
    /// nearest first), and the first `lead` nodes' rows when `rows` gives
    /// them. Whether every lead node's row was known (the reply's
    /// `with_rows`: the backend then reads no page for them).
    pub fn write<'a>(
        &mut self,
        answers: impl Iterator<Item = &'a [(f32, u32)]>,
        rows: Option<impl Fn(u32) -> Option<u64>>,
    ) -> bool {
        let (counts, nodes) = self.counts_and_nodes();
        let (dists, lead_rows) = self.dists_and_rows();
        let mut with_rows = rows.is_some();
        for (j, a) in answers.take(self.n).enumerate() {
            let a = &a[..a.len().min(self.hits)];
            for (c, &(dist, node)) in a.iter().enumerate() {
                // SAFETY: j < n, c < hits: inside the answer arrays.
                unsafe { *nodes.add(j * self.hits + c) = node };
                if c < self.lead && with_rows {
                    match rows.as_ref().and_then(|r| r(node)) {
                        // SAFETY: c < lead: inside query j's lead arrays.
                        Some(row) => unsafe {
                            *dists.add(j * self.lead + c) = dist;
                            *lead_rows.add(j * self.lead + c) = row;
                        },
                        None => with_rows = false,
                    }
                }
            }
            // SAFETY: as above.
            unsafe { *counts.add(j) = a.len() as u32 };
        }
        with_rows
    }

    /// Backend, after DONE with rows: the search distances and rows of the
    /// first `lead` nodes of query j's answer (as many as it has).
    pub fn lead_of(&self, j: usize) -> (&[f32], &[u64]) {
        let c = self.answer(j).len().min(self.lead);
        let (dists, rows) = self.dists_and_rows();
        // SAFETY: j < n (answer checked it), c <= lead: inside query j's
        // lead arrays, which the worker wrote before DONE.
        unsafe {
            (
                std::slice::from_raw_parts(dists.add(j * self.lead), c),
                std::slice::from_raw_parts(rows.add(j * self.lead), c),
            )
        }
    }

    /// Backend, after DONE: query j's answer.
    pub fn answer(&self, j: usize) -> &[u32] {
        let (counts, nodes) = self.counts_and_nodes();
        assert!(j < self.n, "query {j} of a batch of {}", self.n);
        // SAFETY: j < n (checked); the count is clamped to `hits`, so the
        // slice lies inside query j's answer array.
        unsafe {
            let c = (*counts.add(j) as usize).min(self.hits);
            std::slice::from_raw_parts(nodes.add(j * self.hits), c)
        }
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        // SAFETY: attached or created by this process, detached once.
        unsafe { pg_sys::dsm_detach(self.seg) }
    }
}
