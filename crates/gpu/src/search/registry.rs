//! The resident indexes: their device copies and the table of descriptors
//! (abi.h's IndexDesc) the kernel reads, loaded, flagged and unloaded while
//! queries run.

use std::mem::size_of;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{result, CudaEvent, CudaSlice, CudaStream};
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::node;
use half::slice::HalfFloatSliceExt;
use parking_lot::{Mutex, RwLock};
use rayon::prelude::*;

use super::doorbell::Doorbell;
use super::plan::{HalfRows, Sizing};
use super::scatter::{Scatter, SCATTER_MIN};
use super::server::SearchError;
use crate::abi::{self, IndexDesc, PatchCopy, PatchHead, SearchParams};
use crate::error::{cuda, GpuError};
use crate::memory::{device_addr, memcpy_htod_many, zeroed, Pinned};

/// A resident index, named by every query against it. Stale after unload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ResidentId {
    table: u32,
    gen: u32,
}

/// What a resident index occupies.
#[derive(Clone, Copy, Debug)]
pub struct ResidentInfo {
    pub n: usize,
    pub stored_dim: usize,
    pub degree: usize,
    /// vectors kept as fp16 (exact, or rounded: see [`HalfRows`])
    pub half: bool,
    /// device bytes (vectors, adjacency, flags)
    pub bytes: usize,
}

/// Row format of an index on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowFormat {
    pub half: bool,
    /// 16-byte chunks per row
    pub chunks: usize,
    /// floats of the query the kernel reads (chunks * 4 or * 8)
    pub qwords: usize,
    /// lanes per distance
    pub lanes: u32,
}

impl RowFormat {
    pub fn new(dim: usize, half: bool) -> RowFormat {
        let per = if half { 8 } else { 4 };
        let chunks = dim.div_ceil(per);
        // each lane issues up to DIST_UNROLL loads per vector: G = the
        // smallest power of two with chunks <= DIST_UNROLL * G
        let lanes = chunks.div_ceil(abi::DIST_UNROLL as usize).next_power_of_two().clamp(1, 32) as u32;
        RowFormat { half, chunks, qwords: chunks * per, lanes }
    }
    pub fn row_bytes(&self) -> usize {
        self.chunks * 16
    }
}

pub(crate) struct Resident {
    pub table: u32,
    pub gen: u32,
    /// nodes now (grows by [`Registry::patch`] up to `capacity`)
    pub n: AtomicUsize,
    pub capacity: usize,
    pub entry: AtomicU32,
    pub dim: usize,
    pub degree: usize,
    pub ip: bool,
    pub fmt: RowFormat,
    pub bytes: usize,
    /// The host's copy of the node flags (`capacity` of them): answers are
    /// filtered by it, so a node is never returned once `update_flags`
    /// returned.
    pub flags: Vec<AtomicU8>,
    // the device copy, freed when the last Arc goes (after unload)
    vectors: CudaSlice<u8>,
    adjacency: CudaSlice<u32>,
    d_flags: CudaSlice<u8>,
    /// each node's row (the caller's payload: the worker's heap TIDs),
    /// written beside the answers' hits; None when the load gave none
    d_rows: Option<CudaSlice<u64>>,
    metric: u32,
}

impl Resident {
    pub fn n(&self) -> usize {
        self.n.load(Ordering::Acquire)
    }
    pub fn info(&self) -> ResidentInfo {
        ResidentInfo { n: self.n(), stored_dim: self.dim, degree: self.degree, half: self.fmt.half, bytes: self.bytes }
    }
    /// Whether the kernel can measure `query` against this index: fp16 rows
    /// take the query in fp16 too (the tensor cores' distances, see
    /// kernels/search_persistent.cu), so each value must round to a finite
    /// fp16 (|x| <= 65504, or near it); a query that does not is the CPU's.
    pub fn takes_query(&self, query: &[f32]) -> bool {
        !self.fmt.half || fits_fp16(query)
    }

    /// A prepared query (`dim` values) as the kernel reads it: `fmt.qwords`
    /// floats, zero-padded; for inner product the last stored coordinate
    /// is zeroed (-dot over the first dim - 1 only).
    pub fn query_row(&self, query: &[f32], row: &mut [f32]) {
        row.fill(0.0);
        row[..query.len()].copy_from_slice(query);
        if self.ip {
            row[self.dim - 1] = 0.0;
        }
    }

    /// Whether `node` may be returned now.
    pub fn is_result(&self, node: u32) -> bool {
        (node as usize) < self.n() && node::is_result(self.flags[node as usize].load(Ordering::Relaxed))
    }
    fn desc(&self) -> IndexDesc {
        IndexDesc {
            vectors: device_addr(&self.vectors),
            adjacency: device_addr(&self.adjacency),
            flags: device_addr(&self.d_flags),
            n: self.n() as u32,
            degree: self.degree as u32,
            entry: self.entry.load(Ordering::Acquire),
            chunks: self.fmt.chunks as u32,
            half: self.fmt.half as u32,
            metric: self.metric,
            lanes: self.fmt.lanes,
            gen: self.gen,
            rows: self.d_rows.as_ref().map_or(0, device_addr),
        }
    }
}

/// Changed nodes of a resident index (the search worker's copy following
/// its index's pages): vectors with their flags, and lists, each a run of
/// consecutive nodes; the node count and entry point now.
#[derive(Clone, Debug, Default)]
pub struct Patch {
    pub n: usize,
    pub entry: u32,
    /// (first node, flags of the run, its stored vectors)
    pub rows: Vec<(u32, Vec<u8>, Vec<f32>)>,
    /// (first node, the run's lists, degree ids each)
    pub lists: Vec<(u32, Vec<u32>)>,
    /// (first node, the run's rows): an index loaded with rows
    pub payloads: Vec<(u32, Vec<u64>)>,
}

/// How long an unload waits for the queries that hold its index.
const UNLOAD_WAIT: Duration = Duration::from_millis(100);

/// Device bytes a node of a resident index takes: its vector of
/// `vector_bytes`, its list of `degree` ids, its flag byte and, with
/// `rows`, its u64 row (the caller's payload).
fn node_bytes(vector_bytes: usize, degree: usize, rows: bool) -> usize {
    vector_bytes + degree * 4 + 1 + if rows { 8 } else { 0 }
}

/// Rows a resident index is given room to grow by beyond its nodes at load
/// (an eighth, at least 1024): inserts patch it in place until it is full.
fn capacity_for(n: usize) -> usize {
    n + (n / 8).max(1024)
}

enum Entry {
    Free,
    /// being loaded or unloaded: not usable, not reusable
    Busy,
    Ready(Arc<Resident>),
}

pub(crate) struct Registry {
    entries: RwLock<Vec<Entry>>,
    table: CudaSlice<u8>,
    /// Loads, unloads and flag updates, one at a time.
    mgmt: Mutex<Arc<CudaStream>>,
    /// a patch's bytes on their way to the device: pinned once, before the
    /// kernel starts (freeing or pinning host memory while it runs may wait
    /// for the device, which the persistent kernel never leaves idle)
    staging: Mutex<Pinned>,
    /// applies a patch's copies on the device where the kernel may run
    /// beside the persistent one (else the driver's batched copy)
    scatter: Option<Scatter>,
    /// where the kernel's dispatcher applies patches (the staging buffer
    /// then in mapped memory): no driver call a patch, and every query
    /// posted after one finds it applied
    doorbell: Option<Arc<Doorbell>>,
    /// recorded after each patch's copies, which queries submitted after
    /// the patch wait for on their own streams (the worker never waits for
    /// a patch to land); how many patches were recorded
    patched: CudaEvent,
    patch_epoch: AtomicU64,
    next_gen: AtomicU32,
    half: HalfRows,
    max_dim: usize,
    max_qwords: usize,
}

impl Registry {
    pub fn new(
        z: &Sizing,
        max_dim: usize,
        half: HalfRows,
        mgmt: Arc<CudaStream>,
        scatter: Option<Scatter>,
        doorbell: Option<Arc<Doorbell>>,
    ) -> Result<Registry, GpuError> {
        let table = zeroed(&mgmt, z.max_indexes * size_of::<IndexDesc>(), "the index table")?;
        let mgmt_ctx = &mgmt.context().clone();
        Ok(Registry {
            entries: RwLock::new((0..z.max_indexes).map(|_| Entry::Free).collect()),
            table,
            mgmt: Mutex::new(mgmt),
            staging: Mutex::new(Pinned::new(mgmt_ctx, PATCH_STAGING, doorbell.is_some(), "the patch staging")?),
            scatter,
            doorbell,
            patched: mgmt_ctx.new_event(None).map_err(|e| cuda("creating an event", e))?,
            patch_epoch: AtomicU64::new(0),
            next_gen: AtomicU32::new(1),
            half,
            max_dim,
            max_qwords: z.max_qwords,
        })
    }

    /// The patch part of the kernel's parameter (the doorbell's).
    pub fn params(&self, p: &mut SearchParams) {
        if let Some(d) = &self.doorbell {
            p.patch_staging = self.staging.lock().device_addr();
            p.patch_ack = d.ack_addr();
        }
    }

    /// Waits until the dispatcher has applied every patch posted: before
    /// anything else writes or frees what a patch may write.
    fn wait_patches(&self) -> Result<(), SearchError> {
        match &self.doorbell {
            Some(d) => d.wait_patches().map_err(|why| SearchError::Gpu(GpuError::Cuda(why))),
            None => Ok(()),
        }
    }

    /// Device address of the descriptor table (a kernel parameter).
    pub fn table_addr(&self) -> u64 {
        device_addr(&self.table)
    }

    pub fn resident(&self, id: ResidentId) -> Result<Arc<Resident>, SearchError> {
        match self.entries.read().get(id.table as usize) {
            Some(Entry::Ready(r)) if r.gen == id.gen => Ok(r.clone()),
            _ => Err(SearchError::Invalid(format!("index {id:?} is not resident"))),
        }
    }

    /// Uploads an index, with each node's row when `payloads` (one a node)
    /// is given.
    pub fn load(&self, index: &FlatIndex, payloads: Option<&[u64]>) -> Result<ResidentId, SearchError> {
        let n = self.check(index)?;
        if payloads.is_some_and(|p| p.len() != n) {
            return Err(SearchError::Invalid(format!("{} rows for {n} nodes", payloads.map_or(0, |p| p.len()))));
        }
        let dim = index.stored_dim;
        // fp16 rows when the registry's rule takes them, else fp32
        let round = self.half == HalfRows::Rounded;
        let half = (self.half != HalfRows::Never)
            .then(|| encode_rows(&index.vectors, dim, &RowFormat::new(dim, true), round))
            .flatten();
        let (fmt, rows) = match half {
            Some(rows) => (RowFormat::new(dim, true), rows),
            None => {
                let fmt = RowFormat::new(dim, false);
                (fmt, encode_rows(&index.vectors, dim, &fmt, false).expect("fp32 rows hold any value"))
            }
        };
        if fmt.qwords > self.max_qwords {
            return Err(SearchError::Invalid(format!("stored dimension {dim} too large")));
        }
        let table = {
            let mut e = self.entries.write();
            let Some(i) = e.iter().position(|e| matches!(e, Entry::Free)) else {
                return Err(SearchError::Invalid(format!("{} indexes already resident", e.len())));
            };
            e[i] = Entry::Busy;
            i
        };
        let r = self.upload(table, index, n, fmt, &rows, payloads);
        let mut e = self.entries.write();
        match r {
            Ok(res) => {
                let id = ResidentId { table: res.table, gen: res.gen };
                e[table] = Entry::Ready(Arc::new(res));
                Ok(id)
            }
            Err(err) => {
                e[table] = Entry::Free;
                Err(err.into())
            }
        }
    }

    /// The node count of a valid index.
    fn check(&self, ix: &FlatIndex) -> Result<usize, SearchError> {
        let bad = |s: String| Err(SearchError::Invalid(s));
        let (dim, n, degree) = (ix.stored_dim, ix.len(), ix.graph.degree);
        if dim == 0 || dim > self.max_dim {
            return bad(format!("stored dimension {dim} (the server takes 1 to {})", self.max_dim));
        }
        if n == 0 || n >= (1usize << 31) || ix.vectors.len() != n * dim {
            return bad(format!("{n} rows of {} values (1 to 2^31 - 1 rows of {dim})", ix.vectors.len()));
        }
        if degree == 0 || degree > abi::CAND_CAP as usize || ix.graph.adjacency.len() != n * degree {
            return bad(format!(
                "adjacency of {} ids for {n} rows of degree {degree} (degree 1 to {})",
                ix.graph.adjacency.len(),
                abi::CAND_CAP
            ));
        }
        match ix.graph.entry {
            Some(e) if (e as usize) < n => {}
            e => return bad(format!("entry point {e:?} of {n} rows")),
        }
        if ix.metric == Metric::InnerProduct && dim < 2 {
            return bad("inner product needs the extra stored coordinate".into());
        }
        Ok(n)
    }

    fn upload(
        &self,
        table: usize,
        ix: &FlatIndex,
        n: usize,
        fmt: RowFormat,
        rows: &[u8],
        payloads: Option<&[u64]>,
    ) -> Result<Resident, GpuError> {
        let mgmt = self.mgmt.lock();
        let capacity = capacity_for(n);
        let degree = ix.graph.degree;
        let bytes = capacity * node_bytes(fmt.row_bytes(), degree, payloads.is_some());
        let (free, _) = mgmt.context().mem_get_info().map_err(|e| cuda("cuMemGetInfo", e))?;
        if bytes + (256 << 20) > free {
            return Err(GpuError::OutOfMemory { needed: bytes, free, what: "a resident index".into() });
        }
        let up = |what: &str, e| cuda(&format!("uploading {what}"), e);
        let mut vectors = zeroed::<u8>(&mgmt, capacity * fmt.row_bytes(), "the vectors")?;
        let mut adjacency = zeroed::<u32>(&mgmt, capacity * degree, "the graph")?;
        let mut d_flags = zeroed::<u8>(&mgmt, capacity, "the flags")?;
        mgmt.memcpy_htod(rows, &mut vectors.slice_mut(..rows.len())).map_err(|e| up("the vectors", e))?;
        mgmt.memcpy_htod(&ix.graph.adjacency, &mut adjacency.slice_mut(..n * degree))
            .map_err(|e| up("the graph", e))?;
        // the room to grow into holds empty lists: a patch writes a new
        // node's row and its list as they change, not always together
        let empty = (capacity - n) * degree * 4;
        // SAFETY: the bytes after the first n lists of `adjacency`, which
        // holds `capacity` of them; ordered on the stream before any use.
        unsafe {
            result::memset_d8_async(device_addr(&adjacency) + (n * degree * 4) as u64, 0xFF, empty, mgmt.cu_stream())
        }
        .map_err(|e| up("the graph", e))?;
        mgmt.memcpy_htod(&ix.flags, &mut d_flags.slice_mut(..n)).map_err(|e| up("the flags", e))?;
        let d_rows = match payloads {
            Some(p) => {
                let mut d = zeroed::<u64>(&mgmt, capacity, "the rows")?;
                mgmt.memcpy_htod(p, &mut d.slice_mut(..n)).map_err(|e| up("the rows", e))?;
                Some(d)
            }
            None => None,
        };
        let gen = self.next_gen.fetch_add(1, Ordering::Relaxed).max(1);
        let mut flags: Vec<AtomicU8> = ix.flags.iter().map(|&f| AtomicU8::new(f)).collect();
        flags.resize_with(capacity, || AtomicU8::new(node::FREE));
        let res = Resident {
            table: table as u32,
            gen,
            n: AtomicUsize::new(n),
            capacity,
            entry: AtomicU32::new(ix.graph.entry.unwrap_or(0)),
            dim: ix.stored_dim,
            degree,
            ip: ix.metric == Metric::InnerProduct,
            fmt,
            bytes,
            flags,
            vectors,
            adjacency,
            d_flags,
            d_rows,
            metric: if ix.metric == Metric::InnerProduct { abi::METRIC_IP } else { abi::METRIC_L2 },
        };
        self.write_desc(&mgmt, table, &res.desc())?;
        Ok(res)
    }

    /// Writes entry `table` of the descriptor table and waits for it.
    fn write_desc(&self, mgmt: &Arc<CudaStream>, table: usize, desc: &IndexDesc) -> Result<(), GpuError> {
        let at = self.table_addr() + (table * size_of::<IndexDesc>()) as u64;
        // SAFETY: `at` lies inside the table (table < max_indexes); the
        // source is pageable, so the copy has left it when the call returns.
        unsafe { result::memcpy_htod_async(at, std::slice::from_ref(desc), mgmt.cu_stream()) }
            .map_err(|e| cuda("writing the index table", e))?;
        mgmt.synchronize().map_err(|e| cuda("writing the index table", e))
    }

    /// Removes an index: its descriptor is cleared at once (queries that
    /// start from now on find no index) and the table entry freed; its
    /// device memory goes with the last reference. `in_flight` is told to
    /// let go of abandoned slots while this waits, up to UNLOAD_WAIT, for
    /// the queries that hold it; one held longer (a ticket its owner has
    /// not polled, possibly on this very thread: the search worker unloads
    /// between polls) keeps the memory until it is answered or dropped,
    /// after the kernel finished with it. Waiting for them all would wait
    /// for a thread that is waiting here.
    pub fn unload(&self, id: ResidentId, mut in_flight: impl FnMut() -> bool) -> Result<(), SearchError> {
        let res = {
            let mut e = self.entries.write();
            match e.get(id.table as usize) {
                Some(Entry::Ready(r)) if r.gen == id.gen => {
                    let r = r.clone();
                    e[id.table as usize] = Entry::Busy;
                    r
                }
                _ => return Err(SearchError::Invalid(format!("index {id:?} is not resident"))),
            }
        };
        // each busy slot and batch holds a reference
        let deadline = Instant::now() + UNLOAD_WAIT;
        while Arc::strong_count(&res) > 1 && in_flight() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
        self.wait_patches()?;
        let r = self.write_desc(&self.mgmt.lock(), id.table as usize, &IndexDesc::default());
        // the device copy is freed with the last reference, on the
        // management stream, after the clear
        drop(res);
        self.entries.write()[id.table as usize] = Entry::Free;
        r.map_err(SearchError::from)
    }

    /// Sets node flags: the host copy first (answers merged from now on
    /// drop the node even if a query in flight still returns it), then the
    /// device's, one byte or the whole array in one copy.
    pub fn update_flags(&self, id: ResidentId, changes: &[(u32, u8)]) -> Result<(), SearchError> {
        let res = self.resident(id)?;
        if let Some(&(v, _)) = changes.iter().find(|c| c.0 as usize >= res.n()) {
            return Err(SearchError::Invalid(format!("node {v} of {}", res.n())));
        }
        for &(v, f) in changes {
            res.flags[v as usize].store(f, Ordering::Relaxed);
        }
        // a patch applied after this copy would write older flags
        self.wait_patches()?;
        let (at, bytes): (u64, Vec<u8>) = match changes {
            [(v, f)] => (device_addr(&res.d_flags) + *v as u64, vec![*f]),
            _ => (device_addr(&res.d_flags), res.flags.iter().map(|f| f.load(Ordering::Relaxed)).collect()),
        };
        let mgmt = self.mgmt.lock();
        // SAFETY: `at..at + bytes.len()` lies inside the index's flag array;
        // the source is pageable (copied out when the call returns).
        unsafe { result::memcpy_htod_async(at, &bytes, mgmt.cu_stream()) }
            .and_then(|_| mgmt.synchronize())
            .map_err(|e| SearchError::from(cuda("updating flags", e)))
    }

    /// Applies `p` to a resident index in place, while queries run on it:
    /// rows, flags, lists and the node count in one batch of copies (on
    /// the doorbell one ring entry, no driver call; else one driver call:
    /// three, to order them, were a tenth of the worker's thread at
    /// thousands of patches a second), landing in any order. A
    /// query that runs meanwhile reads whole ids (4-byte stores), of nodes
    /// within the room, and ignores ids beyond the count it read; one that
    /// reaches a new node before its row lands ranks it by the row there
    /// before (zeros, or the freed node's), as it may reach a reused node:
    /// every answer is read again from the index's pages by the backend.
    /// Ok(false) when the index must be loaded again instead: more nodes
    /// than its room, or a vector its fp16 rows cannot hold exactly.
    pub fn patch(&self, id: ResidentId, p: &Patch) -> Result<bool, SearchError> {
        let mut res = self.resident(id)?;
        if p.n < res.n() || p.entry as usize >= p.n {
            return Err(SearchError::Invalid(format!("a patch to {} nodes, entry {}, of {}", p.n, p.entry, res.n())));
        }
        if p.n > res.capacity {
            if !self.grow(&res, p.n)? {
                return Ok(false);
            }
            res = self.resident(id)?;
        }
        let dim = res.dim;
        let fits = |r: &(u32, Vec<u8>, Vec<f32>)| r.0 as usize + r.1.len() <= p.n && r.2.len() == r.1.len() * dim;
        if !p.rows.iter().all(fits)
            || !p.lists.iter().all(|l| l.0 as usize + l.1.len() / res.degree <= p.n)
            || !p.payloads.iter().all(|r| r.0 as usize + r.1.len() <= p.n)
        {
            return Err(SearchError::Invalid("a patch beyond its node count".into()));
        }
        // the rows in the device's format, checked before anything changes
        let round = self.half == HalfRows::Rounded;
        let Some(rows) = p.rows.iter().map(|r| encode_rows(&r.2, dim, &res.fmt, round)).collect::<Option<Vec<_>>>()
        else {
            return Ok(false);
        };
        // deletions show on the host at once: answers are filtered by it
        for (first, flags, _) in &p.rows {
            for (i, &f) in flags.iter().enumerate() {
                if !node::is_result(f) {
                    res.flags[*first as usize + i].store(f, Ordering::Relaxed);
                }
            }
        }
        let grown = p.n != res.n() || p.entry != res.entry.load(Ordering::Acquire);
        let mgmt = self.mgmt.lock();
        let staging = self.staging.lock();
        // the last patch's copies have left the staging buffer (long since,
        // as a rule)
        self.wait_patches()?;
        if self.doorbell.is_none() {
            // on streams: the last patch's copies (its event; the doorbell
            // records none, and wait_patches was its wait)
            self.patched.synchronize().map_err(|e| SearchError::from(cuda("patching an index", e)))?;
        }
        // rows, flags, lists, the table entry: one batch (see above)
        let mut up = Upload::new(&mgmt, &staging, self.scatter.as_ref(), self.doorbell.as_deref());
        let rb = res.fmt.row_bytes();
        for ((first, flags, _), rows) in p.rows.iter().zip(&rows) {
            let at = device_addr(&res.vectors) + (*first as usize * rb) as u64;
            up.put(at, rows.len(), |o| o.copy_from_slice(rows))?;
            up.put(device_addr(&res.d_flags) + *first as u64, flags.len(), |o| o.copy_from_slice(flags))?;
        }
        if let Some(d) = &res.d_rows {
            for (first, rows) in &p.payloads {
                up.put(device_addr(d) + *first as u64 * 8, rows.len() * 8, |o| {
                    for (o, r) in o.chunks_exact_mut(8).zip(rows) {
                        o.copy_from_slice(&r.to_ne_bytes());
                    }
                })?;
            }
        }
        for (first, lists) in &p.lists {
            let at = device_addr(&res.adjacency) + (*first as usize * res.degree * 4) as u64;
            up.put(at, lists.len() * 4, |o| {
                for (o, id) in o.chunks_exact_mut(4).zip(lists) {
                    o.copy_from_slice(&id.to_ne_bytes());
                }
            })?;
        }
        if grown {
            let desc = IndexDesc { n: p.n as u32, entry: p.entry, ..res.desc() };
            let at = self.table_addr() + (res.table as usize * size_of::<IndexDesc>()) as u64;
            // SAFETY: IndexDesc is plain old data of this size.
            let bytes =
                unsafe { std::slice::from_raw_parts(&desc as *const IndexDesc as *const u8, size_of::<IndexDesc>()) };
            up.put(at, bytes.len(), |o| o.copy_from_slice(bytes))?;
        }
        up.issue()?;
        if self.doorbell.is_none() {
            // (on the doorbell the ring orders queries after the patch, and
            // a copy on the stream was waited for: no event, no epoch)
            self.patched.record(&mgmt).map_err(|e| SearchError::from(cuda("patching an index", e)))?;
            self.patch_epoch.fetch_add(1, Ordering::AcqRel);
        }
        drop(staging);
        // new rows are answers from now on: a query already on the device
        // may reach a reused node before its row has landed, but every
        // answer is checked against the index's pages by the backend
        for (first, flags, _) in &p.rows {
            for (i, &f) in flags.iter().enumerate() {
                res.flags[*first as usize + i].store(f, Ordering::Relaxed);
            }
        }
        res.n.store(p.n, Ordering::Release);
        res.entry.store(p.entry, Ordering::Release);
        Ok(true)
    }

    /// Moves a resident index whose room is used up (`n` nodes wanted)
    /// into larger arrays beside the old ones, copied on the device (a
    /// millisecond for a million rows, where loading it again from the
    /// pages took most of a second with its scans on the CPU), and swaps
    /// them into its table entry; queries in flight keep the old arrays,
    /// which go with the last of them. False when the device has no room
    /// for both at once.
    fn grow(&self, old: &Arc<Resident>, n: usize) -> Result<bool, SearchError> {
        // the old arrays are copied whole: every patch in them first
        self.wait_patches()?;
        let mgmt = self.mgmt.lock();
        let fail = |e| SearchError::from(cuda("growing a resident index", e));
        let (capacity, rb, degree) = (capacity_for(n), old.fmt.row_bytes(), old.degree);
        let bytes = capacity * node_bytes(rb, degree, old.d_rows.is_some());
        let (free, _) = mgmt.context().mem_get_info().map_err(fail)?;
        if bytes + (256 << 20) > free {
            return Ok(false);
        }
        let vectors = zeroed::<u8>(&mgmt, capacity * rb, "the vectors")?;
        let adjacency = zeroed::<u32>(&mgmt, capacity * degree, "the graph")?;
        let d_flags = zeroed::<u8>(&mgmt, capacity, "the flags")?;
        let d_rows = match &old.d_rows {
            Some(_) => Some(zeroed::<u64>(&mgmt, capacity, "the rows")?),
            None => None,
        };
        let was = old.capacity;
        // SAFETY: each copy within both arrays (the old holds `was` rows,
        // lists, flags; the new `capacity` > `was`), the rest of the new
        // lists emptied, all on the management stream, waited for below.
        unsafe {
            let s = mgmt.cu_stream();
            result::memcpy_dtod_async(device_addr(&vectors), device_addr(&old.vectors), was * rb, s).map_err(fail)?;
            result::memcpy_dtod_async(device_addr(&adjacency), device_addr(&old.adjacency), was * degree * 4, s)
                .map_err(fail)?;
            result::memcpy_dtod_async(device_addr(&d_flags), device_addr(&old.d_flags), was, s).map_err(fail)?;
            if let (Some(new), Some(old)) = (&d_rows, &old.d_rows) {
                result::memcpy_dtod_async(device_addr(new), device_addr(old), was * 8, s).map_err(fail)?;
            }
            let rest = device_addr(&adjacency) + (was * degree * 4) as u64;
            result::memset_d8_async(rest, 0xFF, (capacity - was) * degree * 4, s).map_err(fail)?;
        }
        let mut flags: Vec<AtomicU8> = old.flags.iter().map(|f| AtomicU8::new(f.load(Ordering::Relaxed))).collect();
        flags.resize_with(capacity, || AtomicU8::new(node::FREE));
        let new = Resident {
            table: old.table,
            gen: old.gen,
            n: AtomicUsize::new(old.n()),
            capacity,
            entry: AtomicU32::new(old.entry.load(Ordering::Acquire)),
            dim: old.dim,
            degree,
            ip: old.ip,
            fmt: old.fmt,
            bytes,
            flags,
            vectors,
            adjacency,
            d_flags,
            d_rows,
            metric: old.metric,
        };
        // the copies first, then the entry (write_desc waits for both)
        let table = new.table as usize;
        self.write_desc(&mgmt, table, &new.desc())?;
        self.entries.write()[table] = Entry::Ready(Arc::new(new));
        Ok(true)
    }

    /// Forgets every index (the kernel has exited): their memory is freed.
    pub fn clear(&self) {
        for e in self.entries.write().iter_mut() {
            *e = Entry::Free;
        }
        let _ = self.mgmt.lock().synchronize();
    }

    /// How many patches were issued, and the event after the last one's
    /// copies: a query submitted now is ordered after it.
    pub fn patched(&self) -> (u64, &CudaEvent) {
        (self.patch_epoch.load(Ordering::Acquire), &self.patched)
    }

    /// The management stream, for the server's own one-off copies.
    pub fn mgmt(&self) -> parking_lot::MutexGuard<'_, Arc<CudaStream>> {
        self.mgmt.lock()
    }
}

/// Bytes of pinned memory a patch goes through (and of the device inbox
/// it is copied to for [`Scatter`]); larger patches wait for one part's
/// copies before they fill the next.
pub(crate) const PATCH_STAGING: usize = 4 << 20;

/// A patch's copies to the device: packed into the pinned staging buffer,
/// then scattered by the patch kernel from one copy of the whole ([`Scatter`])
/// or each one DMA copy on the management stream (a pageable copy costs a
/// staging copy and a wait of its own: tens of microseconds per page); a
/// wait only when the buffer is full, the last part issued unwaited (the
/// patch's event orders the queries after it).
struct Upload<'a> {
    stream: &'a Arc<CudaStream>,
    buf: &'a Pinned,
    used: usize,
    copies: Vec<(u64, std::ops::Range<usize>)>,
    scatter: Option<&'a Scatter>,
    doorbell: Option<&'a Doorbell>,
}

impl<'a> Upload<'a> {
    fn new(
        stream: &'a Arc<CudaStream>,
        buf: &'a Pinned,
        scatter: Option<&'a Scatter>,
        doorbell: Option<&'a Doorbell>,
    ) -> Upload<'a> {
        let mut u = Upload { stream, buf, used: 0, copies: Vec::new(), scatter, doorbell };
        u.used = u.start();
        u
    }

    /// Where the bytes start: after the PatchHead on the doorbell.
    fn start(&self) -> usize {
        if self.doorbell.is_some() {
            size_of::<PatchHead>()
        } else {
            0
        }
    }

    /// Room the table of `n` copies takes after the data ([`Scatter`], or
    /// the doorbell's, 16-aligned).
    fn table(&self, n: usize) -> usize {
        if self.doorbell.is_some() {
            return 16 + n * size_of::<PatchCopy>();
        }
        self.scatter.map_or(0, |_| Scatter::table_bytes(n))
    }

    /// Copies `len` bytes, written by `fill`, to device address `at`.
    fn put(&mut self, at: u64, len: usize, fill: impl FnOnce(&mut [u8])) -> Result<(), SearchError> {
        if len + self.table(1) > self.buf.len() {
            // larger than the whole buffer: a pageable copy of its own
            let mut bytes = vec![0u8; len];
            fill(&mut bytes);
            self.flush()?;
            // SAFETY: the caller's destination; the source is pageable,
            // copied out when the call returns, and waited for in flush.
            unsafe { result::memcpy_htod_async(at, &bytes, self.stream.cu_stream()) }
                .map_err(|e| SearchError::from(cuda("patching an index", e)))?;
            return self.flush();
        }
        // each copy's bytes 16-aligned: the patch kernel copies aligned
        // words, whole ids of a list among them (bytes only where the
        // copy itself is a row of flags)
        self.used = self.used.next_multiple_of(16);
        if self.used + len + self.table(self.copies.len() + 1) > self.buf.len() {
            self.flush()?;
        }
        // SAFETY: bytes used..used + len of the pinned buffer, which only
        // this upload (under the staging lock) touches until flushed.
        let out = unsafe { std::slice::from_raw_parts_mut(self.buf.ptr().add(self.used), len) };
        fill(out);
        self.copies.push((at, self.used..self.used + len));
        self.used += len;
        Ok(())
    }

    /// Issues the copies gathered and waits for them (and any before).
    fn flush(&mut self) -> Result<(), SearchError> {
        self.issue()?;
        self.used = self.start();
        if let Some(d) = self.doorbell {
            d.wait_patches().map_err(|why| SearchError::Gpu(GpuError::Cuda(why)))?;
        }
        self.stream.synchronize().map_err(|e| SearchError::from(cuda("patching an index", e)))
    }

    /// Issues the copies gathered, without waiting: the patch kernel's one
    /// launch for many, else one batch (a driver call) where the driver
    /// takes batches, else a call a copy.
    fn issue(&mut self) -> Result<(), SearchError> {
        let fail = |e| SearchError::from(cuda("patching an index", e));
        if let Some(d) = self.doorbell {
            if self.copies.is_empty() {
                return Ok(());
            }
            // the table after the bytes, the head first: the dispatcher
            // applies it (after the last patch: `patch` and `flush` waited
            // for it before the buffer was written again)
            let at = self.used.next_multiple_of(16);
            let seq = d.next_patch();
            let head = PatchHead { seq, n: self.copies.len() as u32, table: at as u32, pad: 0 };
            assert!(
                at + self.copies.len() * size_of::<PatchCopy>() <= self.buf.len(),
                "a patch's table beyond its staging buffer"
            );
            // SAFETY: inside the pinned buffer, which only this upload
            // (under the staging lock) writes; 16-aligned.
            unsafe {
                let table = std::slice::from_raw_parts_mut(self.buf.ptr().add(at) as *mut PatchCopy, self.copies.len());
                for (t, (dst, r)) in table.iter_mut().zip(&self.copies) {
                    *t = PatchCopy { dst: *dst, src: r.start as u32, len: r.len() as u32 };
                }
                std::ptr::write_volatile(self.buf.ptr() as *mut PatchHead, head);
            }
            self.copies.clear();
            d.post_patch(seq);
            return Ok(());
        }
        if let Some(s) = self.scatter.filter(|_| self.copies.len() >= SCATTER_MIN) {
            // SAFETY: destinations inside the index's arrays or its table
            // entry (the caller's checks), which outlive the stream's work;
            // `put` left room for the table; the buffer is not written
            // again before the stream has passed it (the staging lock,
            // `flush`, and the next patch's wait for this one's event); the
            // inbox is used on the management stream alone.
            let r = unsafe { s.apply(self.stream, self.buf, self.used, &self.copies) };
            self.copies.clear();
            return r.map_err(fail);
        }
        let copies: Vec<(u64, *const u8, usize)> =
            // SAFETY: ranges of the pinned buffer filled by `put`.
            self.copies.drain(..).map(|(at, r)| (at, unsafe { self.buf.ptr().add(r.start) } as *const u8, r.len())).collect();
        // SAFETY: destinations inside the index's arrays or its table entry
        // (the caller's checks); the sources stay untouched until the stream
        // has passed them (the staging lock, `flush`, and the next patch's
        // wait for this one's event).
        unsafe { memcpy_htod_many(self.stream, &copies) }.map_err(fail)
    }
}

/// Whether every value rounds to a finite fp16: below 65520 in magnitude
/// (65504 is fp16's largest; 65520 rounds to infinity). A comparison, not
/// a conversion: this runs on the worker's thread for every query.
fn fits_fp16(values: &[f32]) -> bool {
    values.iter().all(|&x| x.abs() < 65520.0)
}

/// The device rows of `vectors` (`dim` values each) in format `fmt`,
/// zero-padded to 16 bytes; None when fp16 rows cannot hold every value:
/// exactly, or with `round` within fp16's range (finite, |x| <= 65504). Slice conversions (F16C where the CPU has it: a value at a time
/// took tens of microseconds for a patch's page of rows), in parallel
/// blocks only when there are many rows.
fn encode_rows(vectors: &[f32], dim: usize, fmt: &RowFormat, round: bool) -> Option<Vec<u8>> {
    const BLOCK: usize = 1024;
    let rb = fmt.row_bytes();
    let mut out = vec![0u8; vectors.len() / dim * rb];
    let block = |(o, v): (&mut [u8], &[f32])| -> bool {
        if !fmt.half {
            for (o, r) in o.chunks_exact_mut(rb).zip(v.chunks(dim)) {
                for (o, x) in o.chunks_exact_mut(4).zip(r) {
                    o.copy_from_slice(&x.to_le_bytes());
                }
            }
            return true;
        }
        let mut h = vec![half::f16::ZERO; v.len()];
        h.convert_from_f32_slice(v);
        let mut back = vec![0.0f32; v.len()];
        h.convert_to_f32_slice(&mut back);
        let held =
            |(x, b): (&f32, &f32)| x.is_finite() && if round { b.is_finite() } else { x.to_bits() == b.to_bits() };
        if !v.iter().zip(&back).all(held) {
            return false;
        }
        for (o, r) in o.chunks_exact_mut(rb).zip(h.chunks(dim)) {
            for (o, x) in o.chunks_exact_mut(2).zip(r) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        true
    };
    let whole = if vectors.len() < 4 * BLOCK * dim {
        out.chunks_mut(rb * BLOCK).zip(vectors.chunks(dim * BLOCK)).all(block)
    } else {
        out.par_chunks_mut(rb * BLOCK).zip(vectors.par_chunks(dim * BLOCK)).all(block)
    };
    whole.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_of_fp16_indexes_within_range() {
        assert!(fits_fp16(&[0.0, -1.5, 65504.0, -65504.0, 65519.0, 1e-9]));
        assert!(!fits_fp16(&[1.0, 65520.0]));
        assert!(!fits_fp16(&[-1e6]));
        assert!(!fits_fp16(&[f32::NAN]));
        assert!(!fits_fp16(&[f32::INFINITY]));
        // the boundary is fp16's own rounding
        for x in [65519.996f32, 65520.0, -65519.996, 65504.0, 1e5] {
            assert_eq!(fits_fp16(&[x]), half::f16::from_f32(x).is_finite(), "{x}");
        }
    }

    #[test]
    fn rounded_fp16_rows_within_range() {
        let rows = encode_rows(&[1.0, 0.1, -3.3], 3, &RowFormat::new(3, true), true).unwrap();
        assert_eq!(&rows[2..4], &half::f16::from_f32(0.1).to_le_bytes());
        assert_eq!(&rows[4..6], &half::f16::from_f32(-3.3).to_le_bytes());
        assert!(encode_rows(&[1.0, 70000.0, 3.0], 3, &RowFormat::new(3, true), true).is_none());
        assert!(encode_rows(&[1.0, f32::NAN, 3.0], 3, &RowFormat::new(3, true), true).is_none());
    }

    #[test]
    fn fp16_rows_only_when_exact() {
        for v in [
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            255.0,
            0.5,
            65504.0,
            -(2.0f32.powi(-14)),
            2.0f32.powi(-24),
            3.0 * 2.0f32.powi(-20),
        ] {
            let row =
                encode_rows(&[v], 1, &RowFormat::new(1, true), false).unwrap_or_else(|| panic!("{v} should convert"));
            let h = half::f16::from_le_bytes([row[0], row[1]]);
            assert_eq!(h.to_f32().to_bits(), v.to_bits(), "{v}");
        }
        for v in [0.1f32, 65505.0, 1e6, 2.0f32.powi(-25), 1.0 + 2.0f32.powi(-11), f32::NAN, f32::INFINITY] {
            assert!(encode_rows(&[v], 1, &RowFormat::new(1, true), false).is_none(), "{v} is not exact in half");
        }
    }

    #[test]
    fn row_formats() {
        let r = RowFormat::new(128, true);
        assert_eq!((r.chunks, r.qwords, r.lanes), (16, 128, 1));
        let r = RowFormat::new(128, false);
        assert_eq!((r.chunks, r.qwords, r.lanes), (32, 128, 2));
        let r = RowFormat::new(129, false);
        assert_eq!((r.chunks, r.qwords, r.lanes), (33, 132, 4));
        let r = RowFormat::new(3, false);
        assert_eq!((r.chunks, r.qwords, r.lanes), (1, 4, 1));
        let r = RowFormat::new(2000, false);
        assert_eq!((r.chunks, r.lanes), (500, 32));
        let r = RowFormat::new(768, false);
        assert_eq!((r.chunks, r.lanes), (192, 16));
        let rows = encode_rows(&[1.0, 2.0, 3.0], 3, &RowFormat::new(3, false), false).unwrap();
        assert_eq!(rows.len(), 16);
        assert_eq!(&rows[4..8], &2.0f32.to_le_bytes());
        // fp16: exact values only, each row padded to its 16 bytes
        let rows = encode_rows(&[1.0, 0.5, -2.0, 3.0, 4.0, 65504.0], 3, &RowFormat::new(3, true), false).unwrap();
        assert_eq!(rows.len(), 32);
        assert_eq!(&rows[2..4], &half::f16::from_f32(0.5).to_le_bytes());
        assert_eq!(&rows[6..16], &[0u8; 10]);
        assert_eq!(&rows[20..22], &half::f16::from_f32(65504.0).to_le_bytes());
        assert!(encode_rows(&[1.0, 0.1, 3.0], 3, &RowFormat::new(3, true), false).is_none());
        assert!(encode_rows(&[1.0, f32::INFINITY, 3.0], 3, &RowFormat::new(3, true), false).is_none());
        // more rows than a block, in parallel
        let many: Vec<f32> = (0..3 * 5000).map(|i| (i % 2048) as f32).collect();
        let rows = encode_rows(&many, 3, &RowFormat::new(3, true), false).unwrap();
        assert_eq!(&rows[16 * 4999..16 * 4999 + 2], &half::f16::from_f32(many[3 * 4999]).to_le_bytes());
    }
}
