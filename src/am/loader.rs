//! What CREATE INDEX reads from the heap: every row's vector checked and
//! stored (normalised or augmented per metric) in one contiguous array, with
//! its TID. The same loader serves the serial scan and each participant of a
//! parallel one (`parallel_scan`), which then share the row count (for the
//! maintenance_work_mem budget) and the dimension.
//!
//! Past the budget, where a row's stored form is its own (every metric but
//! inner product), the scan goes on "paged": the rows go on to the build's
//! [`Stream`] (serial scan) or a worker's spill (parallel scan) rather than
//! stay held, so the vectors never all sit in memory. Inner product needs
//! every vector (for the largest norm) and raises its ERROR there.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::{distance, outliers};
use pgrx::pg_sys;
use pgrx::prelude::*;

use super::parallel_scan::Stream;
use super::vector::{at_tid, check_dim, checked};
use crate::storage::codec::tid_to_payload;
use crate::types::pgvector::Column;

/// What the participants of a parallel scan share, in its shared memory.
#[repr(C)]
#[derive(Default)]
pub struct SharedCounts {
    /// rows claimed by every participant, [`Loader::CLAIM`] at a time while
    /// far from the budget (one at a time, 16 processes contend for this
    /// line); at most that many a participant above the rows stored
    pub rows: AtomicU64,
    /// the dimension of the first row any participant saw (0: none yet)
    pub dim: AtomicU32,
    /// whether the scan may go paged: the leader streams every worker
    /// batch (set before the workers start)
    pub pageable: bool,
    /// set by the first participant past the budget (when pageable): from
    /// then on none counts rows, and the leader frees each batch it streams
    pub paged: AtomicBool,
}

pub struct Loader {
    pub metric: Metric,
    pub dim: usize,
    pub stored_dim: usize,
    /// stored vectors, `stored_dim` apart; for inner product the last
    /// coordinate is filled once the largest norm is known
    pub vectors: Vec<f32>,
    pub payloads: Vec<u64>,
    pub skipped_zero: u64,
    budget: usize,
    /// bytes a row costs the build besides its stored vector: the payload,
    /// the builder's candidate pools and the final lists
    per_row: usize,
    estimated_rows: f64,
    /// in a parallel scan, the counts every participant shares
    shared: Option<&'static SharedCounts>,
    /// rows of this participant's last claim: the shared count when it was
    /// made, and how many are left of it
    claim_base: u64,
    claim_left: u64,
    /// in a parallel worker, where the rows go every [`Loader::SPILL_BYTES`]
    /// (and at the end), so that the worker never holds its whole share
    spill: Option<Spill>,
    /// past the budget: the budget is not checked any more, and the rows go
    /// on to the scan's stream (or the spill) rather than stay held
    pub paged: bool,
}

/// Takes a batch of rows: their stored vectors and payloads.
pub type Spill = Box<dyn FnMut(&[f32], &[u64])>;

impl Loader {
    /// A loader for `heap`'s rows under the build's budget
    /// (maintenance_work_mem).
    ///
    /// # Safety
    /// `heap` must be an open relation.
    pub unsafe fn new(heap: pg_sys::Relation, metric: Metric, params: &BuildParams) -> Loader {
        // SAFETY: `heap` is open (the caller's contract), so its pg_class
        // row is there; maintenance_work_mem is a plain setting.
        let (budget, estimated_rows) =
            unsafe { (pg_sys::maintenance_work_mem as usize * 1024, (*(*heap).rd_rel).reltuples as f64) };
        Loader {
            metric,
            dim: 0,
            stored_dim: 0,
            vectors: Vec::new(),
            payloads: Vec::new(),
            skipped_zero: 0,
            budget,
            per_row: super::paged::builder_bytes_per_row(params),
            estimated_rows,
            shared: None,
            claim_base: 0,
            claim_left: 0,
            spill: None,
            paged: false,
        }
    }

    /// Rows a participant of a parallel scan claims at a time.
    const CLAIM: u64 = 1024;

    /// The rows stored so far counting this one, for the budget: exact
    /// alone; in a parallel scan, the rows claimed up to this one's, which
    /// may run ahead of the rows stored by the others' unused claims (less
    /// than CLAIM rows a participant, and claims near the budget are of one
    /// row).
    fn count_row(&mut self, per_row: usize) -> u64 {
        let Some(s) = self.shared else { return self.payloads.len() as u64 + 1 };
        if self.claim_left == 0 {
            let room = (self.budget / per_row) as u64;
            let claim = if s.rows.load(Ordering::Relaxed) + Self::CLAIM <= room { Self::CLAIM } else { 1 };
            self.claim_base = s.rows.fetch_add(claim, Ordering::Relaxed);
            self.claim_left = claim;
        }
        self.claim_base += 1;
        self.claim_left -= 1;
        self.claim_base
    }

    /// How much a worker's loader holds before it spills its rows.
    pub const SPILL_BYTES: usize = 16 << 20;

    /// How much a serial scan holds once paged before its rows go on to
    /// their pages.
    const PAGED_BYTES: usize = 1 << 20;

    /// This loader on its own again (before the shared memory goes).
    pub fn alone(mut self) -> Loader {
        self.shared = None;
        self
    }

    /// Where this loader's rows go, in batches of about SPILL_BYTES.
    pub fn spilling(mut self, spill: Spill) -> Loader {
        self.spill = Some(spill);
        self
    }

    /// Hands the rows held to the spill (if any).
    pub fn flush(&mut self) {
        if let Some(spill) = self.spill.as_mut() {
            if !self.payloads.is_empty() {
                spill(&self.vectors, &self.payloads);
                self.vectors.clear();
                self.payloads.clear();
            }
        }
    }

    /// This loader as one participant of a parallel scan.
    pub fn sharing(mut self, shared: &'static SharedCounts) -> Loader {
        self.shared = Some(shared);
        self
    }

    /// Whether this scan is paged (a participant of a parallel one may have
    /// made it so); then rows are not counted.
    fn paged_now(&mut self) -> bool {
        if !self.paged && self.shared.is_some_and(|s| s.paged.load(Ordering::Acquire)) {
            self.paged = true;
        }
        self.paged
    }

    /// The budget is exceeded at `rows` rows of `per_row` bytes: the scan
    /// goes paged where it can (`can_page`: the rows have a stream to go
    /// to), else the ERROR.
    fn over_budget(&mut self, rows: usize, per_row: usize, can_page: bool) {
        // a worker's spill goes to a leader that streams it when pageable
        let spilled = self.spill.is_some() && self.shared.is_some_and(|s| s.pageable);
        let can_page = self.metric.stored_alone() && (can_page || spilled);
        if can_page {
            self.paged = true;
            if let Some(s) = self.shared {
                s.paged.store(true, Ordering::Release);
            }
            return;
        }
        let needed = (self.estimated_rows.max(rows as f64) * per_row as f64 / 1048576.0).ceil();
        let raise = if self.metric.stored_alone() {
            "Raise it for this build"
        } else {
            "An inner-product index needs all its vectors in memory to build: raise it for this build"
        };
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "gpu_graph: this index needs about {needed} MB of maintenance_work_mem to build ({} bytes a row), but maintenance_work_mem is {} MB",
                per_row,
                self.budget / 1048576
            ),
            format!("{raise}, e.g. SET maintenance_work_mem = '{}MB';", needed as u64 + 64)
        );
    }

    /// `can_page`: past the budget the rows have a stream to go to.
    fn add(&mut self, v: &[f32], payload: u64, whence: &dyn Fn() -> String, can_page: bool) {
        if self.dim == 0 {
            self.dim = v.len();
            self.stored_dim = self.metric.stored_dim(self.dim);
            if let Some(s) = self.shared {
                // the first row of any participant sets it for all
                if let Err(first) = s.dim.compare_exchange(0, v.len() as u32, Ordering::AcqRel, Ordering::Acquire) {
                    self.dim = first as usize;
                    self.stored_dim = self.metric.stored_dim(self.dim);
                }
            }
        }
        check_dim(self.dim, v.len(), whence);
        if !self.metric.indexable(v) {
            self.skipped_zero += 1;
            return;
        }
        if !self.paged_now() {
            let per_row = self.stored_dim * 4 + self.per_row;
            let rows = self.count_row(per_row) as usize;
            if rows * per_row > self.budget {
                self.over_budget(rows, per_row, can_page);
            }
        }
        match self.metric {
            // inner product: raw vector plus the augmentation coordinate, set later
            Metric::InnerProduct => {
                self.vectors.extend_from_slice(v);
                self.vectors.push(0.0);
            }
            m => m.prepare_stored(v, 0.0, &mut self.vectors),
        }
        self.payloads.push(payload);
        if self.spill.is_some() && self.vectors.len() * 4 >= Self::SPILL_BYTES {
            self.flush();
        }
    }

    /// Inner product: fills the augmentation coordinate now that M is
    /// known. Returns M and the pinned outliers (rows, that is node ids;
    /// engine::outliers) with their stored form. In `vectors` a pinned row
    /// is scaled down to norm M, so the graph is built on finite distances
    /// with the outlier placed where its direction points; the caller writes
    /// its true form to its page once the build is done.
    pub fn finish(&mut self) -> (f32, Vec<(u32, Vec<f32>)>) {
        if self.metric != Metric::InnerProduct || self.payloads.is_empty() {
            return (0.0, Vec::new());
        }
        use rayon::prelude::*;
        let (d, sd) = (self.dim, self.stored_dim);
        let norms: Vec<f32> = self.vectors.par_chunks(sd).map(|v| distance::norm(&v[..d])).collect();
        let (max_norm, pinned) = outliers::split(&norms);
        let pinned: Vec<(u32, Vec<f32>)> = pinned
            .into_iter()
            .map(|p| {
                let row = &mut self.vectors[p as usize * sd..(p as usize + 1) * sd];
                let mut true_form = Vec::with_capacity(sd);
                Metric::InnerProduct.prepare_stored(&row[..d], max_norm, &mut true_form);
                let scale = (max_norm as f64 / norms[p as usize] as f64) as f32;
                row[..d].iter_mut().for_each(|x| *x *= scale);
                (p, true_form)
            })
            .collect();
        self.vectors.par_chunks_mut(sd).for_each(|v| {
            let mut tmp = Vec::with_capacity(sd);
            Metric::InnerProduct.prepare_stored(&v[..d], max_norm, &mut tmp);
            v.copy_from_slice(&tmp);
        });
        (max_norm, pinned)
    }

    /// Reads the rows of `scan` (a parallel scan's share; null: the whole
    /// heap) into this loader; the heap tuples seen. `progress`: report
    /// blocks scanned (one process of a build does). `overflow`: where the
    /// rows go, in node order, should the scan go paged (then none are
    /// held at its end).
    ///
    /// # Safety
    /// ambuild's relations and index info (or a parallel worker's), and a
    /// scan of `heap` or null.
    pub unsafe fn scan(
        &mut self,
        heap: pg_sys::Relation,
        index: pg_sys::Relation,
        index_info: *mut pg_sys::IndexInfo,
        scan: pg_sys::TableScanDesc,
        progress: bool,
        overflow: Option<Stream>,
    ) -> f64 {
        // SAFETY: ambuild's open index (the caller's contract).
        let column = unsafe { Column::of_index(index) };
        let mut scanning = Scanning { loader: self, column, overflow };
        // SAFETY: the caller's contract; the callback gets `scanning` as its
        // state, which outlives the scan and is used by nothing else
        // meanwhile.
        let tuples = unsafe {
            pg_sys::table_index_build_scan(
                heap,
                index,
                index_info,
                true,
                progress,
                Some(load_callback),
                &raw mut scanning as *mut c_void,
                scan,
            )
        };
        if scanning.loader.paged {
            scanning.page_out();
        }
        tuples
    }
}

/// A loader during its scan, with where its rows go once it is paged.
struct Scanning<'l, 's> {
    loader: &'l mut Loader,
    /// the index column's type, which its datums have
    column: Column,
    overflow: Option<Stream<'s>>,
}

impl Scanning<'_, '_> {
    fn add(&mut self, v: &[f32], payload: u64, whence: &dyn Fn() -> String) {
        self.loader.add(v, payload, whence, self.overflow.is_some());
        // paged: the rows held go on (all of them at the switch), a batch
        // of about PAGED_BYTES at a time (the budget is the shards' now)
        if self.loader.paged && self.loader.vectors.len() * 4 >= Loader::PAGED_BYTES {
            self.page_out();
        }
    }

    /// Hands the rows held to the overflow stream (if any).
    fn page_out(&mut self) {
        let l = &mut *self.loader;
        if let Some(overflow) = self.overflow.as_mut() {
            if !l.payloads.is_empty() {
                overflow(l.dim, &l.payloads, &l.vectors);
                l.vectors.clear();
                l.payloads.clear();
            }
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn load_callback(
    _index: pg_sys::Relation,
    tid: pg_sys::ItemPointer,
    values: *mut pg_sys::Datum,
    isnull: *mut bool,
    _alive: bool,
    state: *mut c_void,
) {
    // SAFETY: table_index_build_scan passes the heap tuple's TID and the
    // datum and null flag of the index's one column, and `state` is the
    // Scanning that Loader::scan gave it, alive and not otherwise borrowed
    // during the scan. A non-null datum of the column is of its type.
    unsafe {
        if *isnull {
            return; // NULL vectors are not indexed
        }
        let scanning = &mut *(state as *mut Scanning);
        let whence = || at_tid(tid);
        let v = checked(scanning.column, *values, &whence);
        scanning.add(&v, tid_to_payload(&*tid), &whence);
    }
}
