//! A batch's queries and answers on their way between a backend and the
//! worker (gpu_graph_search_batch): a dynamic shared memory segment the
//! backend creates for the call, which the worker attaches while it works
//! on the batch. The slot's request names it (`Request::batch_dsm`) and
//! says how many queries it holds (`batch_n`, of `dim` values each).
//!
//! Layout for room for `cap` queries (`Request::batch_cap`), in this
//! order: `cap * dim` f32 queries (as the user gave them, the first `n`
//! used), `cap` u32 answer counts, `cap * hits` u32 node ids (each query's
//! answer, nearest first, `hits` = the request's `ef`). The worker writes
//! the answers only while it holds the slot (WORKING), and the backend
//! reads them only after it saw DONE, as for a single query's reply.
//!
//! One segment serves all the segments of queries of a call (the backend
//! keeps it), and the worker keeps its mapping from one to the next
//! (`Worker::segment`): a new mapping is a page fault on every page the
//! worker touches (measured: sending a batch took the worker as long as
//! the GPU's search).

use pgrx::pg_sys;

/// Bytes of a batch's segment.
pub fn bytes(cap: usize, dim: usize, hits: usize) -> usize {
    4 * (cap * dim + cap + cap * hits)
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
}

impl Area {
    /// Backend: a new segment with room for `cap` queries; detached (and
    /// so destroyed) when dropped, or by the transaction's resource owner
    /// on an ERROR.
    pub fn create(cap: usize, dim: usize, hits: usize) -> Area {
        // SAFETY: in a transaction, with a resource owner; dsm_create
        // raises an ERROR when it cannot make the segment.
        unsafe {
            let seg = pg_sys::dsm_create(bytes(cap, dim, hits), 0);
            Area { seg, base: pg_sys::dsm_segment_address(seg) as *mut u8, cap, n: 0, dim, hits }
        }
    }

    /// Whether this segment takes `n` queries of `dim` values with `hits`
    /// answers each.
    pub fn fits(&self, n: usize, dim: usize, hits: usize) -> bool {
        n <= self.cap && dim == self.dim && hits == self.hits
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
    pub unsafe fn attach(handle: u32, cap: usize, dim: usize, hits: usize) -> Option<Area> {
        // SAFETY: the caller's contract; dsm_attach returns NULL for a
        // segment that no longer exists.
        unsafe {
            let seg = pg_sys::dsm_attach(handle);
            if seg.is_null() {
                return None;
            }
            if pg_sys::dsm_segment_map_length(seg) < bytes(cap, dim, hits) {
                pg_sys::dsm_detach(seg);
                return None;
            }
            Some(Area { seg, base: pg_sys::dsm_segment_address(seg) as *mut u8, cap, n: 0, dim, hits })
        }
    }

    /// Worker: whether this mapping is the segment a request names.
    pub fn is(&self, handle: u32, cap: usize, dim: usize, hits: usize) -> bool {
        self.handle() == handle && self.cap == cap && self.dim == dim && self.hits == hits
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

    /// Worker, holding the slot: query j's answer (node ids, nearest first).
    pub fn write(&mut self, answers: impl Iterator<Item = impl Iterator<Item = u32>>) {
        let (counts, nodes) = self.counts_and_nodes();
        for (j, a) in answers.take(self.n).enumerate() {
            let mut c = 0;
            for node in a.take(self.hits) {
                // SAFETY: j < n, c < hits: inside the answer arrays.
                unsafe { *nodes.add(j * self.hits + c) = node };
                c += 1;
            }
            // SAFETY: as above.
            unsafe { *counts.add(j) = c as u32 };
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
