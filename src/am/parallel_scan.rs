//! CREATE INDEX's heap scan on several processes, with PostgreSQL's parallel
//! build machinery as btree (nbtsort.c) and pgvector's HNSW use it.
//!
//! PostgreSQL 15 plans parallel index builds only for btree, so the number
//! of workers comes from plan_create_index_workers here (it weighs
//! max_parallel_maintenance_workers, the table's parallel_workers and size,
//! and maintenance_work_mem). The leader and the workers each take blocks
//! of one parallel table scan and read their rows with the same [`Loader`]
//! as the serial scan. A worker spills its rows to a dynamic shared memory
//! area (DSA) in batches of about 16 MB and records each batch in a table in
//! the build's DSM segment; the leader then copies every batch after its own
//! rows, in parallel, into the one array the builder takes.
//!
//! Where a row's stored form depends on that row alone (every metric but
//! inner product), the leader does not scan: it hands each batch, as soon
//! as it and the batches before it are complete, to the caller's
//! [`Stream`] (CREATE INDEX writes their vector pages while the workers
//! scan), in the order the copy appends them in, until the workers are
//! done; the rest is the caller's to write after (during the GPU build). A
//! streaming leader asks for one more worker to scan in its place, within
//! max_parallel_maintenance_workers. The area grows
//! with the rows (no up-front allocation of the whole budget, which costs a
//! posix_fallocate of it), and is freed with the parallel context. The order
//! of the rows is the order of the batches, not the heap's: the graph does
//! not depend on it.
//!
//! Past maintenance_work_mem, where the leader streams, the scan goes
//! "paged" rather than fail: every batch then goes to the stream, the
//! leader frees each once streamed, and the batch table is a ring, a
//! worker waiting for a slot to come free; the leader streams until every
//! batch is streamed, and nothing is gathered. The area then holds about
//! maintenance_work_mem (the table's batches), whatever the table's size.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use pgrx::pg_sys;
use pgrx::prelude::*;
use rayon::prelude::*;

use super::loader::{Loader, SharedCounts};
use super::options;
use crate::latch;

const KEY_SHARED: u64 = 0x6767_0000_0000_0001;
const KEY_SCAN: u64 = 0x6767_0000_0000_0002;

/// A batch of rows in the DSA: `rows` payloads, then their vectors.
#[repr(C)]
struct Batch {
    ptr: AtomicU64,
    rows: AtomicU64,
}

/// The build's state in its DSM segment, followed by `capacity` [`Batch`]es.
#[repr(C)]
struct Shared {
    heap: pg_sys::Oid,
    index: pg_sys::Oid,
    concurrent: bool,
    area: pg_sys::dsa_handle,
    counts: SharedCounts,
    /// the workers' heap tuples and zero vectors skipped
    heap_tuples: AtomicU64,
    skipped_zero: AtomicU64,
    /// batches taken: batch `seq` lives in slot `seq % capacity`
    batches: AtomicU32,
    capacity: u32,
    /// batches the leader has freed once streamed (paged mode, in order):
    /// a slot is taken again only once the batch before in it is freed
    freed: AtomicU32,
    /// workers done with their share (their batches all recorded)
    finished: AtomicU32,
    /// the leader's latch (in its PGPROC), set at each batch recorded
    leader: *mut pg_sys::Latch,
}

impl Shared {
    fn batches(&self) -> &[Batch] {
        // SAFETY: `capacity` batches follow the header in the allocation the
        // leader sized for them (see `bytes`); Batch's alignment divides
        // Shared's size (both are 8-aligned).
        unsafe {
            let first = (self as *const Shared).add(1) as *const Batch;
            std::slice::from_raw_parts(first, self.capacity as usize)
        }
    }

    fn bytes(capacity: usize) -> usize {
        std::mem::size_of::<Shared>() + capacity * std::mem::size_of::<Batch>()
    }

    /// Copies a worker's rows into a new DSA chunk and records it.
    ///
    /// # Safety
    /// `area` must be this build's DSA area, attached.
    unsafe fn put(&self, area: *mut pg_sys::dsa_area, vectors: &[f32], payloads: &[u64]) {
        let bytes = std::mem::size_of_val(payloads) + std::mem::size_of_val(vectors);
        let seq = self.batches.fetch_add(1, Ordering::AcqRel) as usize;
        if seq >= self.capacity as usize {
            self.wait_for_slot(seq);
        }
        let slot = seq % self.capacity as usize;
        // SAFETY: `area` is attached (the caller's contract); an allocation
        // of `bytes` holds the payloads (8-aligned: DSA allocations are
        // MAXALIGNed) and then the vectors.
        unsafe {
            let ptr = pg_sys::dsa_allocate_extended(area, bytes, pg_sys::DSA_ALLOC_HUGE as i32);
            let at = pg_sys::dsa_get_address(area, ptr) as *mut u8;
            std::ptr::copy_nonoverlapping(payloads.as_ptr(), at as *mut u64, payloads.len());
            let v = at.add(std::mem::size_of_val(payloads)) as *mut f32;
            std::ptr::copy_nonoverlapping(vectors.as_ptr(), v, vectors.len());
            let b = &self.batches()[slot];
            b.rows.store(payloads.len() as u64, Ordering::Relaxed);
            b.ptr.store(ptr, Ordering::Release);
            pg_sys::SetLatch(self.leader);
        }
    }

    /// Batch `seq`, past the table, waits until the leader has freed the
    /// batch before it in its slot: the scan is paged (the batches held are
    /// past the budget anyway), or the ERROR where it cannot be.
    fn wait_for_slot(&self, seq: usize) {
        if !self.counts.pageable {
            error!("gpu_graph: the parallel heap scan ran out of batch entries ({})", self.capacity);
        }
        if !self.counts.paged.swap(true, Ordering::AcqRel) {
            // SAFETY: the leader's latch, in its PGPROC, for the build.
            unsafe { pg_sys::SetLatch(self.leader) };
        }
        while seq >= self.freed.load(Ordering::Acquire) as usize + self.capacity as usize {
            // nobody sets this worker's latch: a poll, serving interrupts
            latch::nap(Duration::from_millis(1));
        }
    }

    /// Frees the batches `from..to` once streamed (paged mode) and makes
    /// their slots free; `to`.
    ///
    /// # Safety
    /// `area` must be this build's DSA area, attached, the batches
    /// recorded and streamed, and this the leader (the one that frees).
    unsafe fn free(&self, area: *mut pg_sys::dsa_area, from: usize, to: usize) -> usize {
        if from == to {
            return to;
        }
        for seq in from..to {
            let b = &self.batches()[seq % self.capacity as usize];
            // SAFETY: a recorded batch's chunk of the attached area (the
            // caller's contract), read no more once streamed.
            unsafe { pg_sys::dsa_free(area, b.ptr.load(Ordering::Acquire)) };
            // a slot's pointer set again is its next batch's
            b.ptr.store(0, Ordering::Relaxed);
        }
        self.freed.store(to as u32, Ordering::Release);
        to
    }

    /// A recorded batch's payloads and vectors (`sd` floats a row).
    ///
    /// # Safety
    /// `area` must be this build's DSA area, attached, and the batch
    /// recorded (its pointer set); on the thread that attached it
    /// (dsa_get_address may map segments).
    unsafe fn batch(&self, area: *mut pg_sys::dsa_area, b: &Batch, sd: usize) -> (&[u64], &[f32]) {
        let rows = b.rows.load(Ordering::Relaxed) as usize;
        // SAFETY: a recorded batch holds `rows` payloads then rows x sd
        // vectors (Shared::put), in the attached area (the caller's
        // contract), left alone until the area is detached.
        unsafe {
            let at = pg_sys::dsa_get_address(area, b.ptr.load(Ordering::Acquire)) as *const u8;
            let v = at.add(rows * 8) as *const f32;
            (std::slice::from_raw_parts(at as *const u64, rows), std::slice::from_raw_parts(v, rows * sd))
        }
    }
}

/// Takes a parallel scan's rows as they arrive, in node order: the
/// dimension, then a batch's payloads and stored vectors.
pub type Stream<'a> = &'a mut dyn FnMut(usize, &[u64], &[f32]);

/// What [`scan`] read.
pub struct Scanned {
    pub loader: Loader,
    pub heap_tuples: f64,
    /// parallel workers launched
    pub workers: usize,
    /// the scan went past maintenance_work_mem: every row went to the
    /// stream, in node order, and the loader holds none (its dimension and
    /// zero-vector count are right)
    pub paged: bool,
}

fn estimate(e: &mut pg_sys::shm_toc_estimator, bytes: usize) {
    // shm_toc_estimate_chunk and _keys, macros in C
    e.space_for_chunks += bytes.next_multiple_of(pg_sys::ALIGNOF_BUFFER as usize);
    e.number_of_keys += 1;
}

/// The locks a participant takes, as nbtsort's workers do.
fn locks(concurrent: bool) -> (pg_sys::LOCKMODE, pg_sys::LOCKMODE) {
    let heap = if concurrent { pg_sys::ShareUpdateExclusiveLock } else { pg_sys::ShareLock };
    (heap as pg_sys::LOCKMODE, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE)
}

/// Reads the heap into a loader, in parallel when PostgreSQL grants workers.
/// `stream` (when the rows' stored form is final as read) takes the rows
/// while the workers scan, if there are workers.
///
/// # Safety
/// ambuild's arguments.
pub unsafe fn scan(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    index_info: *mut pg_sys::IndexInfo,
    metric: Metric,
    params: &BuildParams,
    stream: Option<Stream>,
) -> Scanned {
    // SAFETY: ambuild's relations are open and locked (the caller's contract).
    let (mut loader, mut workers) = unsafe {
        let workers = pg_sys::plan_create_index_workers((*heap).rd_id, (*index).rd_id);
        (Loader::new(heap, metric, params), workers)
    };
    if workers > 0 && stream.is_some() {
        // PostgreSQL counted the leader as a participant of the scan
        // SAFETY: a plain setting of this backend.
        workers = (workers + 1).min(unsafe { pg_sys::max_parallel_maintenance_workers });
    }
    if workers <= 0 {
        // SAFETY: the caller's contract; null: a scan of the whole heap.
        let heap_tuples = unsafe { loader.scan(heap, index, index_info, std::ptr::null_mut(), true, stream) };
        return Scanned { paged: loader.paged, loader, heap_tuples, workers: 0 };
    }
    // SAFETY: the caller's contract.
    unsafe { in_parallel(heap, index, index_info, loader, workers, stream) }
}

/// # Safety
/// ambuild's arguments, and `workers` > 0.
unsafe fn in_parallel(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    index_info: *mut pg_sys::IndexInfo,
    mut loader: Loader,
    workers: i32,
    stream: Option<Stream>,
) -> Scanned {
    // SAFETY: the leader's side of nbtsort's _bt_begin_parallel and
    // _bt_end_parallel, on ambuild's open relations. Every pointer comes
    // from PostgreSQL's allocators for this context and lives until
    // DestroyParallelContext; an ERROR anywhere in between is cleaned up by
    // the transaction's abort (parallel contexts, the DSA area's segments
    // and the registered snapshot are all released there).
    unsafe {
        let concurrent = (*index_info).ii_Concurrent;
        pg_sys::EnterParallelMode();
        let pcxt =
            pg_sys::CreateParallelContext(c"gpu_graph".as_ptr(), c"gpu_graph_parallel_scan_main".as_ptr(), workers);
        let snapshot = if concurrent {
            pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot())
        } else {
            &raw mut pg_sys::SnapshotAnyData
        };
        let scan_bytes = pg_sys::table_parallelscan_estimate(heap, snapshot);
        // each batch but a worker's last holds at least SPILL_BYTES of the budget
        let capacity = pg_sys::maintenance_work_mem as usize * 1024 / Loader::SPILL_BYTES + workers as usize + 1;
        estimate(&mut (*pcxt).estimator, Shared::bytes(capacity));
        estimate(&mut (*pcxt).estimator, scan_bytes);
        pg_sys::InitializeParallelDSM(pcxt);
        if (*pcxt).seg.is_null() {
            // no DSM to be had: scan alone
            finish_parallel(pcxt, concurrent, snapshot);
            let heap_tuples = loader.scan(heap, index, index_info, std::ptr::null_mut(), true, stream);
            return Scanned { paged: loader.paged, loader, heap_tuples, workers: 0 };
        }
        let shared = pg_sys::shm_toc_allocate((*pcxt).toc, Shared::bytes(capacity)) as *mut Shared;
        std::ptr::write_bytes(shared as *mut u8, 0, Shared::bytes(capacity));
        let area = pg_sys::dsa_create(pg_sys::BuiltinTrancheIds::LWTRANCHE_PARALLEL_QUERY_DSA as i32);
        (*shared).heap = (*heap).rd_id;
        (*shared).index = (*index).rd_id;
        (*shared).concurrent = concurrent;
        (*shared).area = pg_sys::dsa_get_handle(area);
        (*shared).capacity = capacity as u32;
        // a stream takes every batch: the leader streams them (or, with no
        // worker launched, its own rows)
        (*shared).counts.pageable = stream.is_some();
        (*shared).leader = &raw mut (*pg_sys::MyProc).procLatch;
        pg_sys::shm_toc_insert((*pcxt).toc, KEY_SHARED, shared as *mut std::ffi::c_void);
        let pscan = pg_sys::shm_toc_allocate((*pcxt).toc, scan_bytes) as pg_sys::ParallelTableScanDesc;
        pg_sys::table_parallelscan_initialize(heap, pscan, snapshot);
        pg_sys::shm_toc_insert((*pcxt).toc, KEY_SCAN, pscan as *mut std::ffi::c_void);
        pg_sys::LaunchParallelWorkers(pcxt);
        let launched = (*pcxt).nworkers_launched as usize;

        let shared: &'static Shared = &*shared;
        let mut tuples = 0.0;
        let mut streamed = None;
        match stream {
            Some(stream) if launched > 0 => {
                streamed = Some(stream_batches(pcxt, shared, area, pscan, loader.metric, stream))
            }
            overflow => {
                // the leader takes its share too, and reports the blocks
                // scanned; with a stream, no worker was launched: its rows
                // go there should it page, as a serial scan's
                loader = loader.sharing(&shared.counts);
                let scan = pg_sys::table_beginscan_parallel(heap, pscan);
                tuples = loader.scan(heap, index, index_info, scan, true, overflow);
            }
        }
        pg_sys::WaitForParallelWorkersToFinish(pcxt);
        tuples += shared.heap_tuples.load(Ordering::Acquire) as f64;
        loader.skipped_zero += shared.skipped_zero.load(Ordering::Acquire);
        take_dim(&mut loader, shared);
        let paged = loader.paged || shared.counts.paged.load(Ordering::Acquire);
        // paged: every batch was streamed and freed, nothing to gather
        let batches =
            if paged { shared.batches.load(Ordering::Acquire) as usize } else { gather(&mut loader, shared, area) };
        if streamed.is_some_and(|s| s > batches) || (paged && streamed.unwrap_or(0) != batches) {
            error!("gpu_graph: the parallel heap scan recorded {batches} batches, {streamed:?} of them streamed");
        }
        loader = loader.alone();
        loader.paged = paged;
        pg_sys::dsa_detach(area);
        finish_parallel(pcxt, concurrent, snapshot);
        Scanned { loader, heap_tuples: tuples, workers: launched, paged }
    }
}

/// The leader's share when it streams: each worker batch, once it and
/// every batch before it are recorded, goes to `stream` (the order
/// `gather` appends them in, so the node numbers agree), until every
/// worker has finished (what is left then waits for no scan: the caller
/// writes it while the graph is built); the blocks handed out so far go to
/// pg_stat_progress_create_index meanwhile. Paged, each batch is freed once
/// streamed, and every batch is streamed before this returns. The batches
/// streamed.
///
/// # Safety
/// A context made by `in_parallel`, its workers launched; `area` and
/// `pscan` are its DSA area (attached) and parallel scan.
unsafe fn stream_batches(
    pcxt: *mut pg_sys::ParallelContext,
    shared: &Shared,
    area: *mut pg_sys::dsa_area,
    pscan: pg_sys::ParallelTableScanDesc,
    metric: Metric,
    stream: Stream,
) -> usize {
    // SAFETY: the caller's contract.
    let launched = unsafe { (*pcxt).nworkers_launched as u32 };
    let capacity = shared.capacity as usize;
    let (mut next, mut freed) = (0, 0);
    loop {
        if shared.counts.paged.load(Ordering::Acquire) {
            // SAFETY: the batches before `next` are streamed, in the
            // attached area (the caller's contract).
            freed = unsafe { shared.free(area, freed, next) };
        }
        // looked at before each batch: once the workers are done, what is
        // left goes on while the graph is built, not before (unless paged)
        // SAFETY: the caller's contract.
        if unsafe { workers_done(pcxt, shared, launched) } && !streams_on(shared, launched, next) {
            return next;
        }
        let recorded = shared.batches.load(Ordering::Acquire) as usize;
        let b = &shared.batches()[next % capacity];
        // a taken slot's pointer is set once its rows are copied; until its
        // batch before is freed, it is that batch's
        let ready = next < recorded && next < freed + capacity && b.ptr.load(Ordering::Acquire) != 0;
        if !ready {
            // SAFETY: the context's parallel scan (the caller's contract).
            unsafe { report_blocks(pscan) };
            // a worker sets the latch at each batch; the timeout is a fallback
            latch::nap(Duration::from_millis(100));
            continue;
        }
        let dim = shared.counts.dim.load(Ordering::Acquire) as usize;
        // SAFETY: recorded, in the attached area (the caller's contract).
        let (payloads, vectors) = unsafe { shared.batch(area, b, metric.stored_dim(dim)) };
        stream(dim, payloads, vectors);
        next += 1;
    }
}

/// Whether the workers are done: all finished, or none running (one
/// failed: WaitForParallelWorkersToFinish raises its ERROR).
///
/// # Safety
/// A context whose `launched` workers were launched, `shared` its state.
unsafe fn workers_done(pcxt: *mut pg_sys::ParallelContext, shared: &Shared, launched: u32) -> bool {
    // SAFETY: the caller's contract.
    shared.finished.load(Ordering::Acquire) >= launched || unsafe { !any_worker_running(pcxt) }
}

/// Once the workers are done, whether the leader streams on from batch
/// `next`: paged (every batch goes to the stream, none is gathered), every
/// worker finished (else one failed) and batches left. Read after the
/// workers are seen done: a worker may set paged at its last batch, and
/// one seen stopped may have finished since `finished` was read.
fn streams_on(shared: &Shared, launched: u32, next: usize) -> bool {
    shared.counts.paged.load(Ordering::Acquire)
        && shared.finished.load(Ordering::Acquire) >= launched
        && next < shared.batches.load(Ordering::Acquire) as usize
}

/// Whether any launched worker is still running (one that failed to start
/// is not: WaitForParallelWorkersToFinish reports it).
///
/// # Safety
/// A context whose workers were launched.
unsafe fn any_worker_running(pcxt: *mut pg_sys::ParallelContext) -> bool {
    // SAFETY: the caller's contract: `worker` holds nworkers_launched
    // entries, their handles set by LaunchParallelWorkers.
    unsafe {
        (0..(*pcxt).nworkers_launched as usize).any(|i| {
            let handle = (*(*pcxt).worker.add(i)).bgwhandle;
            let mut pid = 0;
            !handle.is_null()
                && pg_sys::GetBackgroundWorkerPid(handle, &mut pid) != pg_sys::BgwHandleStatus::BGWH_STOPPED
        })
    }
}

/// The blocks handed out so far, in pg_stat_progress_create_index (the
/// leader reports them when it scans a share itself).
///
/// # Safety
/// `pscan` is a parallel scan of a heap (a block scan).
unsafe fn report_blocks(pscan: pg_sys::ParallelTableScanDesc) {
    // SAFETY: heap tables' parallel scans are block scans (the caller's
    // contract); phs_nallocated is an atomic the workers add to, read whole.
    unsafe {
        let pb = pscan as pg_sys::ParallelBlockTableScanDesc;
        let total = (*pb).phs_nblocks as u64;
        let done = std::ptr::read_volatile(&raw const (*pb).phs_nallocated.value).min(total);
        pg_sys::pgstat_progress_update_param(pg_sys::PROGRESS_SCAN_BLOCKS_TOTAL as i32, total as i64);
        pg_sys::pgstat_progress_update_param(pg_sys::PROGRESS_SCAN_BLOCKS_DONE as i32, done as i64);
    }
}

/// # Safety
/// A context made by `in_parallel`, its workers done.
unsafe fn finish_parallel(pcxt: *mut pg_sys::ParallelContext, concurrent: bool, snapshot: pg_sys::Snapshot) {
    // SAFETY: the caller's contract; the snapshot was registered when
    // `concurrent`.
    unsafe {
        if concurrent {
            pg_sys::UnregisterSnapshot(snapshot);
        }
        pg_sys::DestroyParallelContext(pcxt);
        pg_sys::ExitParallelMode();
    }
}

/// The dimension any participant saw, to a leader that saw no row.
fn take_dim(loader: &mut Loader, shared: &Shared) {
    let dim = shared.counts.dim.load(Ordering::Acquire) as usize;
    if loader.dim == 0 && dim > 0 {
        loader.dim = dim;
        loader.stored_dim = loader.metric.stored_dim(dim);
    }
}

/// Appends every worker's batches to the leader's rows, copying in
/// parallel; the batches appended.
///
/// # Safety
/// `area` is the build's DSA area, attached, the workers are done, the
/// scan not paged (every batch held, in its own slot), and the dimension
/// taken (`take_dim`).
unsafe fn gather(loader: &mut Loader, shared: &Shared, area: *mut pg_sys::dsa_area) -> usize {
    let sd = loader.stored_dim;
    let n = shared.batches.load(Ordering::Acquire) as usize;
    // addresses first, on this thread (dsa_get_address may map segments)
    // SAFETY: the workers are done, so every batch is recorded, in the
    // attached area (the caller's contract).
    let batches: Vec<(&[u64], &[f32])> =
        shared.batches()[..n].iter().map(|b| unsafe { shared.batch(area, b, sd) }).collect();
    let added = batches.iter().map(|b| b.0.len()).sum::<usize>();
    append_parallel(&mut loader.payloads, batches.iter().map(|b| b.0), added);
    append_parallel(&mut loader.vectors, batches.iter().map(|b| b.1), added * sd);
    n
}

/// Appends `parts` (`len` values in all) to `out`, copying them on every
/// core into capacity that is neither zeroed first nor touched by one
/// thread alone (at 10M x 96 a zeroing resize and its page faults on one
/// core cost as much as the scan).
fn append_parallel<'a, T: Copy + Send + Sync + 'a>(out: &mut Vec<T>, parts: impl Iterator<Item = &'a [T]>, len: usize) {
    out.reserve_exact(len);
    let mut spare = &mut out.spare_capacity_mut()[..len];
    let mut targets = Vec::new();
    for part in parts {
        let (head, rest) = std::mem::take(&mut spare).split_at_mut(part.len());
        targets.push((head, part));
        spare = rest;
    }
    assert!(spare.is_empty(), "gpu_graph: the parts do not fill the space reserved");
    targets.into_par_iter().for_each(|(head, part)| {
        head.write_copy_of_slice(part);
    });
    let new_len = out.len() + len;
    // SAFETY: the `len` values after the old length were all written above
    // (the parts' lengths sum to `len`, and each went to its own range).
    unsafe { out.set_len(new_len) };
}

/// A parallel worker of the heap scan (CreateParallelContext names it).
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn gpu_graph_parallel_scan_main(
    _seg: *mut pg_sys::dsm_segment,
    toc: *mut pg_sys::shm_toc,
) {
    // SAFETY: the worker's side of nbtsort's _bt_parallel_build_main: the
    // leader put both keys in the segment before launching, and keeps it
    // (and the area, the relations and their locks) until every worker has
    // finished. The shared state lives as long as this process needs it.
    unsafe {
        let shared: &'static Shared = &*(pg_sys::shm_toc_lookup(toc, KEY_SHARED, false) as *const Shared);
        let pscan = pg_sys::shm_toc_lookup(toc, KEY_SCAN, false) as pg_sys::ParallelTableScanDesc;
        let (heap_lock, index_lock) = locks(shared.concurrent);
        let heap = pg_sys::table_open(shared.heap, heap_lock);
        let index = pg_sys::index_open(shared.index, index_lock);
        let index_info = pg_sys::BuildIndexInfo(index);
        (*index_info).ii_Concurrent = shared.concurrent;
        let area = pg_sys::dsa_attach(shared.area);
        let (metric, params) = (options::metric(index), options::build_params(index));
        // the area stays attached until after the last spill (the flush below)
        let spill = Box::new(move |v: &[f32], p: &[u64]| shared.put(area, v, p));
        let mut loader = Loader::new(heap, metric, &params).sharing(&shared.counts).spilling(spill);
        let scan = pg_sys::table_beginscan_parallel(heap, pscan);
        let tuples = loader.scan(heap, index, index_info, scan, false, None);
        loader.flush();
        shared.heap_tuples.fetch_add(tuples as u64, Ordering::AcqRel);
        shared.skipped_zero.fetch_add(loader.skipped_zero, Ordering::AcqRel);
        shared.finished.fetch_add(1, Ordering::AcqRel);
        pg_sys::SetLatch(shared.leader);
        drop(loader);
        pg_sys::dsa_detach(area);
        pg_sys::index_close(index, index_lock);
        pg_sys::table_close(heap, heap_lock);
    }
}
