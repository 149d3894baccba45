//! The meta page (block 0): what the index is and where to start.

use gpu_graph_engine::cfs::{Algorithm, CfsParams};
use gpu_graph_engine::filter::Filter;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::outliers::MAX_PINNED;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::NO_NODE;
use pgrx::pg_sys;

use super::buffer::{Locked, Xlog};
use super::corrupt::corrupted;
use super::layout::{Element, Layout};

pub const MAGIC: u32 = 0x4750_4752; // "GPGR"
/// 2: chunks of whole vector pages where that takes fewer pages (Layout::new);
/// scan_workers; storage. 3: the free list chained through the free slots
/// (free_head), not a bounded array on this page
pub const FORMAT_VERSION: u32 = 3;

/// Build phases whose duration the meta page records, in this order.
/// Page writes include their WAL; vector pages are written while a GPU build
/// runs, so with a GPU the phases overlap and add up to more than the total.
pub const PHASES: [&str; 6] = ["heap scan", "upload", "graph construction", "download", "vector pages", "graph pages"];

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Meta {
    pub magic: u32,
    pub version: u32,
    /// input dimensions; 0 while the index holds no vector yet
    pub dim: u32,
    pub metric: u32,
    pub degree: u32,
    /// the index of its name in options::ALGORITHMS: 0 = rnn_descent, then
    /// the CFS graphs nsg, vamana, cagra, tsdg (their parameters below)
    pub algorithm: u32,
    pub s: u32,
    pub r: u32,
    pub t1: u32,
    pub t2: u32,
    pub rho: f32,
    /// M of the inner-product augmentation (see engine::metric)
    pub max_norm: f32,
    /// ids below this have been allocated
    pub node_count: u32,
    pub entry: u32,
    /// bumped by every change a copy of the index elsewhere must see
    pub generation: u64,
    /// rows indexed by CREATE INDEX
    pub built_rows: u64,
    /// 1 = CPU, 2 = GPU
    pub build_device: u32,
    pub build_threads: u32,
    /// parallel workers that scanned the heap beside the leader
    pub scan_workers: u32,
    /// bytes a stored coordinate takes: 4 (f32) or 2 (f16)
    pub element_bytes: u32,
    /// milliseconds of each of [`PHASES`]
    pub build_ms: [f32; 6],
    /// the GPU's name, NUL-padded (empty for a CPU build)
    pub device_name: [u8; 64],
    /// slots freed by VACUUM, kept for reuse by inserts: a chain from
    /// `free_head` through each free slot's vector header, which holds the
    /// next free id where a live one holds its heap TID (NO_NODE ends it)
    pub free_count: u32,
    pub free_head: u32,
    /// a sharded build's shards (0: built whole), its largest shard's rows,
    /// shard rows over rows, and the milliseconds of its partition and merge
    pub shards: u32,
    pub largest_shard: u32,
    pub shard_overlap: f32,
    pub partition_ms: f32,
    pub merge_ms: f32,
    /// inner product's pinned outliers (engine::outliers), NO_NODE after the last
    pub pinned: [u32; MAX_PINNED],
    /// a CFS graph's alpha, candidates and largest lambda (0 in an index
    /// of rnn_descent, or one built before these fields existed)
    pub alpha: f32,
    pub candidates: u32,
    pub max_lambda: u32,
}

impl Meta {
    pub fn new(metric: Metric, params: &BuildParams, element: Element) -> Meta {
        Meta {
            magic: MAGIC,
            version: FORMAT_VERSION,
            dim: 0,
            metric: metric.code(),
            degree: params.degree as u32,
            algorithm: 0,
            s: params.s as u32,
            r: params.r as u32,
            t1: params.t1 as u32,
            t2: params.t2 as u32,
            rho: params.rho,
            max_norm: 0.0,
            node_count: 0,
            entry: NO_NODE,
            generation: 0,
            built_rows: 0,
            build_device: 0,
            build_threads: 0,
            scan_workers: 0,
            element_bytes: element.bytes() as u32,
            build_ms: [0.0; 6],
            device_name: [0; 64],
            free_count: 0,
            free_head: NO_NODE,
            shards: 0,
            largest_shard: 0,
            shard_overlap: 0.0,
            partition_ms: 0.0,
            merge_ms: 0.0,
            pinned: [NO_NODE; MAX_PINNED],
            alpha: 0.0,
            candidates: 0,
            max_lambda: 0,
        }
    }

    /// The CFS graph the index was built as (None: rnn_descent); the codes
    /// are set_cfs's.
    pub fn cfs(&self) -> Option<Algorithm> {
        let (alpha, max_lambda) = (self.alpha, self.max_lambda as usize);
        match self.algorithm {
            1 => Some(Algorithm::Nsg),
            2 => Some(Algorithm::Vamana { alpha }),
            3 => Some(Algorithm::Cagra),
            4 => Some(Algorithm::Tsdg { alpha, max_lambda }),
            _ => None,
        }
    }

    /// The filter inserts and VACUUM keep lists by: the graph's own.
    pub fn filter(&self) -> Filter {
        self.cfs().map_or(Filter::Rng, Algorithm::filter)
    }

    /// What orders the lists the filter keeps: TSDG's lambda order.
    pub fn order(&self) -> Option<Filter> {
        self.cfs().and_then(Algorithm::order)
    }

    /// Records the CFS graph the index is built as (None: rnn_descent).
    pub fn set_cfs(&mut self, cfs: Option<&CfsParams>) {
        let Some(c) = cfs else { return };
        let (code, alpha, max_lambda) = match c.algorithm {
            Algorithm::Nsg => (1, 0.0, 0),
            Algorithm::Vamana { alpha } => (2, alpha, 0),
            Algorithm::Cagra => (3, 0.0, 0),
            Algorithm::Tsdg { alpha, max_lambda } => (4, alpha, max_lambda as u32),
        };
        (self.algorithm, self.alpha, self.candidates, self.max_lambda) = (code, alpha, c.pool as u32, max_lambda);
    }
    pub fn metric(&self) -> Metric {
        Metric::from_code(self.metric).expect("checked() refuses an unknown metric")
    }
    pub fn stored_dim(&self) -> usize {
        self.metric().stored_dim(self.dim as usize)
    }
    pub fn element(&self) -> Element {
        if self.element_bytes == 2 {
            Element::F16
        } else {
            Element::F32
        }
    }
    pub fn layout(&self) -> Layout {
        Layout::new(self.degree as usize, self.stored_dim(), self.element())
    }
    pub fn entry(&self) -> Option<u32> {
        (self.entry != NO_NODE).then_some(self.entry)
    }
    pub fn pinned(&self) -> impl Iterator<Item = u32> + '_ {
        self.pinned.iter().copied().take_while(|&p| p != NO_NODE)
    }
    /// Pins `node` if there is room; false when all places are taken.
    pub fn pin(&mut self, node: u32) -> bool {
        match self.pinned.iter().position(|&p| p == NO_NODE || p == node) {
            Some(i) => {
                self.pinned[i] = node;
                true
            }
            None => false,
        }
    }
    /// Unpins `node` (freed by VACUUM), keeping the rest in order.
    pub fn unpin(&mut self, node: u32) {
        if let Some(i) = self.pinned.iter().position(|&p| p == node) {
            self.pinned.copy_within(i + 1.., i);
            self.pinned[MAX_PINNED - 1] = NO_NODE;
        }
    }
    pub fn device_name(&self) -> String {
        let end = self.device_name.iter().position(|&b| b == 0).unwrap_or(self.device_name.len());
        String::from_utf8_lossy(&self.device_name[..end]).into_owned()
    }
    pub fn set_device_name(&mut self, name: &str) {
        self.device_name = [0; 64];
        let b = name.as_bytes();
        let n = b.len().min(63);
        self.device_name[..n].copy_from_slice(&b[..n]);
    }
    pub fn params(&self) -> BuildParams {
        BuildParams {
            degree: self.degree as usize,
            s: self.s as usize,
            r: self.r as usize,
            t1: self.t1 as usize,
            t2: self.t2 as usize,
            rho: self.rho,
            seed: BuildParams::default().seed,
        }
    }

    /// # Safety
    /// `rel` must be an open gpu_graph index.
    pub unsafe fn read(rel: pg_sys::Relation) -> Meta {
        // SAFETY: `rel` is an open index (the caller's contract), block 0 its
        // meta page; the view is dropped before the shared lock is.
        let m = unsafe { Locked::read(rel, 0, false).page().meta() };
        // SAFETY: as above.
        unsafe { m.checked(rel) }
    }

    /// [`Meta::read`], and `also` called with the contents while the
    /// page's share lock is still held (no write of it can come between).
    ///
    /// # Safety
    /// `rel` must be an open gpu_graph index.
    pub unsafe fn read_then(rel: pg_sys::Relation, also: impl FnOnce(&Meta)) -> Meta {
        // SAFETY: as in `read`; the lock is held until `b` drops.
        unsafe {
            let b = Locked::read(rel, 0, false);
            let m = b.page().meta().checked(rel);
            also(&m);
            drop(b);
            m
        }
    }

    /// Whether a field holds what no gpu_graph write makes.
    pub fn inconsistent(&self) -> bool {
        let node = |n: u32| n == NO_NODE || n < self.node_count;
        Metric::from_code(self.metric).is_none()
            || !(8..=128).contains(&self.degree)
            || !matches!(self.element_bytes, 2 | 4)
            || self.dim as usize > super::layout::Element::F16.max_dim()
            || !node(self.entry)
            || !node(self.free_head)
            || self.free_count > self.node_count
            || !self.pinned.iter().all(|&p| node(p))
    }

    /// `self`, or an ERROR when it is not a meta page of this format or
    /// holds what no gpu_graph write makes (every later computation trusts
    /// these fields: a degree of 0 would divide by zero in the layout).
    ///
    /// # Safety
    /// `rel` must be the open index `self` was read from.
    pub unsafe fn checked(self, rel: pg_sys::Relation) -> Meta {
        // SAFETY: `rel` is open (the caller's contract).
        let bad = |what: String| unsafe { corrupted(rel, 0, what) };
        if self.magic != MAGIC {
            bad(format!("its meta page has magic {:#x}, not {MAGIC:#x}", self.magic));
        }
        if self.version != FORMAT_VERSION {
            pgrx::error!("gpu_graph: the index's meta page is not of format {FORMAT_VERSION}; REINDEX it");
        }
        if self.inconsistent() {
            bad(format!(
                "its meta page is inconsistent (metric {}, degree {}, element bytes {}, dimensions {}, nodes {}, \
                 entry {}, free list {} of {})",
                self.metric,
                self.degree,
                self.element_bytes,
                self.dim,
                self.node_count,
                self.entry,
                self.free_head,
                self.free_count
            ));
        }
        self
    }

    /// Reads the meta page under an exclusive lock, lets `f` change it, and
    /// WAL-logs the change. Returns what `f` returned.
    ///
    /// # Safety
    /// `rel` must be an open gpu_graph index.
    pub unsafe fn update<T>(rel: pg_sys::Relation, f: impl FnOnce(&mut Meta) -> T) -> T {
        // SAFETY: `rel` is an open index (the caller's contract), block 0 its
        // meta page. The page is read before the record registers it and
        // written only through the record's copy, so no view of the buffer
        // lives across Xlog::finish.
        unsafe {
            let b = Locked::read(rel, 0, true);
            let mut m = b.page().meta().checked(rel);
            let out = f(&mut m);
            m.generation += 1;
            let mut x = Xlog::start(rel);
            x.register(&b, false).put_meta(&m);
            x.finish();
            out
        }
    }
}

const _: () = assert!(std::mem::size_of::<Meta>() <= super::layout::USABLE);
