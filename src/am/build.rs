//! CREATE INDEX (ambuild) and the init fork of unlogged indexes (ambuildempty).
//!
//! The heap is scanned into one contiguous array of stored vectors (already
//! normalised or augmented per metric), the graph is built on the GPU or on
//! all cores (`construct`), and the pages go straight to the file through a
//! [`BulkWriter`] (`storage::bulk`): the vector pages while the graph is
//! built, the graph pages once it exists.

use std::time::Instant;

use gpu_graph_engine::cfs::CfsParams;
use gpu_graph_engine::merge;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::repair::{relink, Walk};
use pgrx::pg_sys;
use pgrx::prelude::*;

use super::construct::{construct, construct_paged, Constructed, Device, PagedBuild};
use super::loader::Loader;
use super::vector::{check_encodable, check_storage};
use super::{options, paged, parallel_scan};
use crate::storage::bulk::BulkWriter;
use crate::storage::meta::{Meta, PHASES};
use crate::storage::page_store::PageStore;
use crate::storage::writer::{self, VectorPages};

const PHASE_LOAD: i64 = 2;
const PHASE_VECTORS: i64 = 3;
const PHASE_BUILD: i64 = 4;
const PHASE_GRAPH: i64 = 5;

#[pg_guard]
pub unsafe extern "C-unwind" fn ambuildphasename(phase: i64) -> *mut std::ffi::c_char {
    let name: &'static std::ffi::CStr = match phase {
        PHASE_LOAD => c"loading tuples",
        PHASE_VECTORS => c"writing vector pages",
        PHASE_BUILD => c"building graph",
        PHASE_GRAPH => c"writing graph pages",
        _ => return std::ptr::null_mut(),
    };
    name.as_ptr() as *mut _
}

fn report(param: u32, value: i64) {
    // SAFETY: updates this backend's own progress entry; a no-op when no
    // command is being tracked.
    unsafe { pg_sys::pgstat_progress_update_param(param as i32, value) };
}

fn ms(t: Instant) -> f32 {
    t.elapsed().as_secs_f32() * 1000.0
}

/// Records on the meta page how the graph was built.
///
/// # Safety
/// `index` must be an open gpu_graph index.
unsafe fn record_build(index: pg_sys::Relation, built: &Constructed, timings: [f32; 6], workers: usize) {
    let update = |m: &mut Meta| {
        m.entry = built.graph.entry.unwrap_or(gpu_graph_engine::NO_NODE);
        m.build_ms = timings;
        m.scan_workers = workers as u32;
        if let Some(st) = &built.shards {
            m.shards = st.shards as u32;
            m.largest_shard = st.largest as u32;
            m.shard_overlap = st.overlap as f32;
            m.partition_ms = st.partition_ms as f32;
            m.merge_ms = st.merge_ms as f32;
        }
        match &built.device {
            Device::Cpu { threads } => {
                m.build_device = 1;
                m.build_threads = *threads as u32;
            }
            Device::Gpu { name } => {
                m.build_device = 2;
                m.set_device_name(name);
            }
        }
    };
    // SAFETY: `index` is an open gpu_graph index (the caller's contract).
    unsafe {
        Meta::update(index, update);
        crate::worker::meta_mirror::built(index, &Meta::read(index));
    }
}

/// What the page phases wrote, for the NOTICE.
struct Pages {
    vector_bytes: u64,
    graph_bytes: u64,
    /// None when the relation needs no WAL
    logged_bytes: Option<u64>,
    /// of the vector pages' time, what went while the workers scanned
    streamed_ms: f32,
}

fn megabytes(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

impl Pages {
    fn describe(&self, phase: &str, ms: f32, bytes: u64) -> String {
        let mb = megabytes(bytes);
        format!("{phase} {:.2} s ({mb:.0} MB, {:.0} MB/s)", ms / 1000.0, mb / (ms as f64 / 1000.0).max(1e-6))
    }
    fn wal(&self) -> String {
        match self.logged_bytes {
            Some(b) => format!("{:.0} MB of page images logged", megabytes(b)),
            None => "no WAL needed".into(),
        }
    }
}

/// The NOTICE that sums a build up.
fn notice_built(
    loader: &Loader,
    n: usize,
    workers: usize,
    built: &Constructed,
    timings: [f32; 6],
    pages: &Pages,
    total: Instant,
) {
    let mut device = match &built.device {
        Device::Cpu { threads } => format!("the CPU with {threads} threads"),
        Device::Gpu { name } => format!("the GPU ({name})"),
    };
    if let Some(c) = &built.cfs {
        device += &format!(
            " (CFS refinement {:.2} s of it, {:.2} s searching and {:.2} s filtering on the {})",
            c.total_ms / 1000.0,
            c.collect_ms / 1000.0,
            c.filter_ms / 1000.0,
            if c.on_gpu { "GPU" } else { "CPU" }
        );
    }
    if let Some(st) = &built.shards {
        device += &format!(
            " in {} shards (at most {} rows, overlap {:.2}; partition {:.2} s, merge {:.2} s, {:.2} s of it making every node reachable, {} linked)",
            st.shards,
            st.largest,
            st.overlap,
            st.partition_ms / 1000.0,
            st.merge_ms / 1000.0,
            st.reach_ms / 1000.0,
            st.repaired
        );
    }
    let phases: Vec<String> = PHASES
        .iter()
        .zip(timings)
        .filter(|(p, t)| *t > 0.0 || !matches!(**p, "upload" | "download"))
        .map(|(p, t)| match *p {
            "vector pages" if pages.streamed_ms > 0.0 => format!(
                "{}, {:.2} s of it during the heap scan",
                pages.describe(p, t, pages.vector_bytes),
                pages.streamed_ms / 1000.0
            ),
            "vector pages" => pages.describe(p, t, pages.vector_bytes),
            "graph pages" => pages.describe(p, t, pages.graph_bytes),
            "heap scan" if workers > 0 => {
                format!(
                    "{p} {:.2} s (with {workers} parallel worker{})",
                    t / 1000.0,
                    if workers == 1 { "" } else { "s" }
                )
            }
            _ => format!("{p} {:.2} s", t / 1000.0),
        })
        .collect();
    // DEBUG1, as PostgreSQL's own build reports: pgvector and btree print
    // nothing at CREATE INDEX; the numbers stay in gpu_graph_info
    debug1!(
        "gpu_graph: built {} rows ({} dims, {}) on {device} in {:.2} s: {}; {}{}",
        n,
        loader.dim,
        loader.metric.name(),
        total.elapsed().as_secs_f64(),
        phases.join(", "),
        pages.wal(),
        if loader.skipped_zero > 0 {
            format!("; {} zero vectors not indexed", loader.skipped_zero)
        } else {
            String::new()
        }
    );
}

/// The vector pages' writer, started at the first rows (which give the
/// dimension; an index of this storage must take it).
fn vector_pages<'a>(
    pages: &'a mut Option<VectorPages>,
    out: &mut BulkWriter,
    meta: &Meta,
    dim: usize,
) -> &'a mut VectorPages {
    pages.get_or_insert_with(|| {
        check_storage(meta.element(), dim);
        let mut m = *meta;
        m.dim = dim as u32;
        VectorPages::new(out, m.layout())
    })
}

/// The nodes written so far, in pg_stat_progress_create_index; a cancel
/// raises its ERROR here.
fn nodes_written(done: u32) {
    report(pg_sys::PROGRESS_CREATEIDX_TUPLES_DONE, done as i64);
    crate::latch::check_interrupts();
}

/// The heap scan's outcome, for a paged build.
struct Scan<'a> {
    loader: &'a Loader,
    heap_tuples: f64,
    workers: usize,
    load_ms: f32,
    streamed_ms: f32,
}

/// The rest of CREATE INDEX when the scan went paged (its vectors exceed
/// maintenance_work_mem, so every one went to its vector page as it was
/// read): the graph built in shards read back from those pages
/// (`construct_paged`), its lists written as the merge makes them, then
/// every node made reachable through the pages.
///
/// # Safety
/// `index` is ambuild's index, `out` its writer, which wrote the vector
/// pages of every row the scan read through `vector_writer`.
#[allow(clippy::too_many_arguments)]
unsafe fn build_paged(
    index: pg_sys::Relation,
    scan: Scan,
    mut meta: Meta,
    mut out: BulkWriter,
    mut vector_writer: Option<VectorPages>,
    params: &BuildParams,
    knn: gpu_graph_gpu::KnnInit,
    cfs: Option<CfsParams>,
    total: Instant,
) -> *mut pg_sys::IndexBuildResult {
    let loader = scan.loader;
    meta.dim = loader.dim as u32;
    let vectors_out = vector_pages(&mut vector_writer, &mut out, &meta, loader.dim);
    let t = Instant::now();
    let n = vectors_out.finish(&mut out, &mut nodes_written);
    out.write_queued();
    let vector_ms = scan.streamed_ms + ms(t);
    meta.node_count = n as u32;
    meta.built_rows = n as u64;
    let layout = meta.layout();
    let vector_bytes = out.bytes;
    report(pg_sys::PROGRESS_CREATEIDX_SUBPHASE, PHASE_BUILD);
    // SAFETY: a plain setting of this backend (kB).
    let budget = unsafe { pg_sys::maintenance_work_mem } as usize * 1024;
    let plan = |held: usize| {
        paged::plan(n, budget, &layout, params, held, cfs.map(|c| c.algorithm)).unwrap_or_else(|least| {
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "gpu_graph: maintenance_work_mem ({} MB) is too small to build this index even in shards read back from its pages: it needs about {} MB for shards of {} rows",
                    budget >> 20,
                    (least >> 20) + 1,
                    paged::min_shard_rows(n)
                ),
                format!("Raise it for this build, e.g. SET maintenance_work_mem = '{}MB';", (least >> 20) + 1)
            );
        })
    };
    // SAFETY: the index's vector pages of nodes 0..n are in its file (the
    // writer wrote out its queue above).
    let mut rows = unsafe { paged::PageRows::new(index, layout, n) };
    let mut lists = paged::TempLists::new(params.degree);
    let mut graph_ms = 0.0;
    let mut merged = |first: usize, part: &[u32]| {
        let t = Instant::now();
        writer::write_lists(&mut out, &layout, first, n, part, &mut |_| {
            crate::latch::check_interrupts();
        });
        graph_ms += ms(t);
    };
    let mut built = construct_paged(PagedBuild {
        rows: &mut rows,
        lists: &mut lists,
        params,
        knn,
        plan: &plan,
        merged: &mut merged,
        budget,
        lists_chunk: layout.per_chunk,
        cfs,
    });
    drop(lists);
    report(pg_sys::PROGRESS_CREATEIDX_SUBPHASE, PHASE_GRAPH);
    writer::write_meta(&mut out, &meta);
    let pages = Pages {
        vector_bytes,
        graph_bytes: out.bytes - vector_bytes,
        logged_bytes: out.wal().then_some(out.bytes),
        streamed_ms: scan.streamed_ms,
    };
    out.finish();
    let timings = [scan.load_ms, 0.0, built.construct_ms - graph_ms, 0.0, vector_ms, graph_ms];
    // SAFETY: the index is open and whole from here on.
    unsafe { record_build(index, &built, timings, scan.workers) };
    // nodes no walk reaches get a link from a reached one, through the pages
    let t = Instant::now();
    // SAFETY: as above.
    let store = unsafe { PageStore::new(index, &Meta::read(index)) };
    // over a copy of the lists where it fits the budget, else list by list
    let walk = if n * params.degree * 4 <= budget / 2 { Walk::InMemory } else { Walk::ByList };
    let linked = relink(&store, walk);
    if let Some(st) = built.shards.as_mut() {
        st.repaired = linked;
        st.reach_ms = t.elapsed().as_secs_f64() * 1e3;
        st.merge_ms += st.reach_ms;
    }
    notice_built(loader, n, scan.workers, &built, timings, &pages, total);
    // SAFETY: as in ambuild.
    let mut result = unsafe { pgrx::PgBox::<pg_sys::IndexBuildResult>::alloc0() };
    result.heap_tuples = scan.heap_tuples;
    result.index_tuples = n as f64;
    result.into_pg()
}

#[pg_guard]
pub unsafe extern "C-unwind" fn ambuild(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    index_info: *mut pg_sys::IndexInfo,
) -> *mut pg_sys::IndexBuildResult {
    crate::threads::init_rayon();
    // SAFETY: PostgreSQL calls ambuild with the heap and the new, empty index
    // open and locked, and `index_info` describing the index.
    let (params, metric, knn, storage) = unsafe {
        (options::build_params(index), options::metric(index), options::knn_init(index), options::storage(index))
    };
    // SAFETY: as above.
    let cfs = unsafe { options::cfs_params(index, params.degree) };
    let knn = if cfs.is_some() { knn.for_cfs() } else { knn };
    let total = Instant::now();
    let mut meta = Meta::new(metric, &params, storage);
    meta.set_cfs(cfs.as_ref());
    // SAFETY: `index` is the new, empty index ambuild was given, open
    // through the build; nothing reads it through shared buffers before
    // the writer finishes.
    let mut out = unsafe { BulkWriter::new(index) };
    let mut vector_writer = None;

    report(pg_sys::PROGRESS_CREATEIDX_SUBPHASE, PHASE_LOAD);
    let t = Instant::now();
    // with parallel workers, the vector pages of the rows they read are
    // written while they scan, where a row's stored form is its own
    let mut streamed_ms = 0.0;
    let mut stream = |dim: usize, payloads: &[u64], stored: &[f32]| {
        let t = Instant::now();
        vector_pages(&mut vector_writer, &mut out, &meta, dim).push(&mut out, stored, payloads, &mut nodes_written);
        streamed_ms += ms(t);
    };
    let stream: Option<parallel_scan::Stream> = metric.stored_alone().then_some(&mut stream);
    // SAFETY: ambuild's own arguments.
    let scanned = unsafe { parallel_scan::scan(heap, index, index_info, metric, &params, stream) };
    let mut loader = scanned.loader;
    let (max_norm, pinned) = loader.finish();
    let load_ms = ms(t);
    if scanned.paged {
        let scan =
            Scan { loader: &loader, heap_tuples: scanned.heap_tuples, workers: scanned.workers, load_ms, streamed_ms };
        // SAFETY: ambuild's index, its vector pages written by `out`.
        return unsafe { build_paged(index, scan, meta, out, vector_writer, &params, knn, cfs, total) };
    }

    let n = loader.payloads.len();
    meta.dim = loader.dim as u32;
    meta.max_norm = max_norm;
    for (p, stored) in &pinned {
        check_encodable(meta.element(), stored);
        meta.pin(*p);
    }
    meta.node_count = n as u32;
    meta.built_rows = n as u64;
    let layout = meta.layout();
    let vectors_out = vector_pages(&mut vector_writer, &mut out, &meta, loader.dim);

    // the rest of the vector pages need no graph: they are written while a
    // GPU builds it
    let mut vector_ms = streamed_ms;
    let order = super::construct::cpu_order(cfs);
    let mut built = construct(&loader.vectors, loader.stored_dim.max(1), n, &params, knn, order, &mut || {
        report(pg_sys::PROGRESS_CREATEIDX_SUBPHASE, PHASE_VECTORS);
        report(pg_sys::PROGRESS_CREATEIDX_TUPLES_TOTAL, n as i64);
        let t = Instant::now();
        let (sd, from) = (loader.stored_dim, vectors_out.taken());
        vectors_out.push(&mut out, &loader.vectors[from * sd..], &loader.payloads[from..], &mut nodes_written);
        let written = vectors_out.finish(&mut out, &mut nodes_written);
        assert_eq!(written, n, "gpu_graph: vector pages written for every row");
        vector_ms += ms(t);
        report(pg_sys::PROGRESS_CREATEIDX_SUBPHASE, PHASE_BUILD);
        report(pg_sys::PROGRESS_CREATEIDX_TUPLES_DONE, 0);
    });
    let vector_bytes = out.bytes;
    if built.shards.is_none() {
        // (a sharded build's merge did this already)
        let t = Instant::now();
        merge::ensure_reachable(&mut built.graph, &loader.vectors, loader.stored_dim.max(1));
        built.construct_ms += ms(t);
    }
    if let Some(cfs) = &cfs {
        super::refine::refine(&mut built, &loader.vectors, loader.stored_dim.max(1), cfs);
    }

    report(pg_sys::PROGRESS_CREATEIDX_SUBPHASE, PHASE_GRAPH);
    let t = Instant::now();
    writer::write_graph_pages(&mut out, &layout, &built.graph, &mut nodes_written);
    writer::write_meta(&mut out, &meta);
    let pages = Pages {
        vector_bytes,
        graph_bytes: out.bytes - vector_bytes,
        logged_bytes: out.wal().then_some(out.bytes),
        streamed_ms,
    };
    out.finish();
    // the pinned outliers' true coordinates (the build saw them scaled to M)
    if !pinned.is_empty() {
        // SAFETY: the index is open and whole from here on.
        let store = unsafe { PageStore::new(index, &meta) };
        for (node, stored) in &pinned {
            store.put_vector(*node, stored);
        }
    }
    let graph_ms = ms(t);

    let timings = [load_ms, built.upload_ms, built.construct_ms, built.download_ms, vector_ms, graph_ms];
    // SAFETY: the index is open, and a gpu_graph index from its meta page on.
    unsafe { record_build(index, &built, timings, scanned.workers) };
    notice_built(&loader, n, scanned.workers, &built, timings, &pages, total);

    // SAFETY: ambuild runs in a memory context that outlives its result,
    // where alloc0 pallocs a zeroed IndexBuildResult.
    let mut result = unsafe { pgrx::PgBox::<pg_sys::IndexBuildResult>::alloc0() };
    result.heap_tuples = scanned.heap_tuples;
    result.index_tuples = n as f64;
    result.into_pg()
}

#[pg_guard]
pub unsafe extern "C-unwind" fn ambuildempty(index: pg_sys::Relation) {
    // SAFETY: PostgreSQL calls ambuildempty with an open, unlogged index
    // that has no init fork yet.
    unsafe {
        let params: BuildParams = options::build_params(index);
        let mut meta = Meta::new(options::metric(index), &params, options::storage(index));
        meta.set_cfs(options::cfs_params(index, params.degree).as_ref());
        writer::write_init_fork(index, &meta);
    }
}
