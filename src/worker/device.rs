//! What the worker searches with: the GPU's persistent kernel, or in the
//! test mode (gpu_graph.worker_device = cpu) the engine's CPU search over the
//! worker's own copy, so machines without a GPU run the real protocol.

use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::search::search;
use gpu_graph_engine::store::{GraphView, Prefix};

use super::gpu::{GpuBatch, GpuPending, GpuResident, GpuSearch};
use super::outcome::Outcome;
use super::rows::Rows;
use super::shmem::{DEVICE_CPU, DEVICE_GPU};
use crate::gucs::WorkerDevice;

/// (search distance, node), nearest first.
pub type Hits = Vec<(f32, u32)>;

pub enum Device {
    Cpu,
    Gpu(Box<GpuSearch>),
}

/// A resident copy on its device.
pub enum Handle {
    Cpu(FlatIndex),
    Gpu(GpuResident),
    /// an index without an entry point (nothing live): every answer is empty
    Empty,
}

pub enum Start {
    Done(Hits),
    Pending(GpuPending),
}

pub enum BatchStart {
    Done(Vec<Hits>),
    Pending(GpuBatch),
}

impl Device {
    pub fn open(kind: WorkerDevice) -> Result<Device, String> {
        match kind {
            WorkerDevice::Cpu => Ok(Device::Cpu),
            WorkerDevice::Gpu => GpuSearch::open().map(|g| Device::Gpu(Box::new(g))),
        }
    }

    pub fn code(&self) -> u32 {
        match self {
            Device::Cpu => DEVICE_CPU,
            Device::Gpu(_) => DEVICE_GPU,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Device::Cpu => "the CPU (gpu_graph.worker_device = cpu, a test mode)".into(),
            Device::Gpu(g) => g.describe(),
        }
    }

    /// Bytes of copies kept when gpu_graph.gpu_memory_limit is 0 (0 = no limit).
    pub fn auto_limit(&self) -> usize {
        match self {
            Device::Cpu => 0,
            Device::Gpu(g) => g.auto_limit(),
        }
    }

    /// Makes a copy resident; returns it and the bytes it occupies. Err:
    /// what that means for the index's scans, and why.
    /// `rows`: each node's row, which a GPU copy writes beside its answers.
    pub fn install(&self, index: FlatIndex, rows: &Rows) -> Result<(Handle, usize), (Outcome, String)> {
        if index.graph.entry.is_none() {
            return Ok((Handle::Empty, 0));
        }
        match self {
            Device::Cpu => {
                let bytes = index.bytes();
                Ok((Handle::Cpu(index), bytes))
            }
            Device::Gpu(g) => g.load(&index, rows).map(|(r, bytes)| (Handle::Gpu(r), bytes)),
        }
    }

    /// Whether the copy holds its vectors rounded (fp16 rows on the GPU):
    /// its search distances are then not exactly those of the index's
    /// vectors unless the pages hold fp16 too.
    pub fn rounds(&self, h: &Handle) -> bool {
        match (self, h) {
            (Device::Gpu(g), Handle::Gpu(r)) => g.half(r),
            _ => false,
        }
    }

    pub fn remove(&self, h: Handle) {
        if let (Device::Gpu(g), Handle::Gpu(r)) = (self, h) {
            g.unload(r);
        }
    }

    /// Starts a search for the `k` nearest with beam `ef` (`query` as the
    /// user gave it). A GPU search starts at the next [`Device::send_held`].
    pub fn start(&self, h: &Handle, query: &[f32], k: usize, ef: usize) -> Result<Start, Outcome> {
        match (self, h) {
            (_, Handle::Empty) => Ok(Start::Done(Vec::new())),
            (_, Handle::Cpu(index)) => {
                let hits = search(index, index.metric, query, k, ef);
                Ok(Start::Done(hits.iter().map(|h| (h.dist, h.node)).collect()))
            }
            (Device::Gpu(g), Handle::Gpu(r)) => g.submit(r, query, k, ef).map(Start::Pending),
            (Device::Cpu, Handle::Gpu(_)) => unreachable!("a GPU copy without a GPU"),
        }
    }

    /// Starts the searches of a batch (`queries`: `dim` values each, as
    /// the user gave them), each as [`Device::start`] would, through the
    /// first `width` entries of each list (0: all).
    pub fn start_batch(
        &self,
        h: &Handle,
        queries: &[f32],
        dim: usize,
        k: usize,
        ef: usize,
        width: usize,
    ) -> Result<BatchStart, Outcome> {
        let n = queries.len() / dim.max(1);
        match (self, h) {
            (_, Handle::Empty) => Ok(BatchStart::Done(vec![Vec::new(); n])),
            (_, Handle::Cpu(index)) => {
                let g = Prefix { graph: index, width: if width == 0 { index.degree() } else { width } };
                let answer = |q: &[f32]| search(&g, index.metric, q, k, ef).iter().map(|h| (h.dist, h.node)).collect();
                Ok(BatchStart::Done(queries.chunks_exact(dim).map(answer).collect()))
            }
            (Device::Gpu(g), Handle::Gpu(r)) => g.submit_batch(r, queries, dim, k, ef, width).map(BatchStart::Pending),
            (Device::Cpu, Handle::Gpu(_)) => unreachable!("a GPU copy without a GPU"),
        }
    }

    /// Sends the GPU searches `start` (and `start_batch`'s single queries)
    /// held: two driver calls for all of them.
    pub fn send_held(&self) -> Result<usize, Outcome> {
        match self {
            Device::Gpu(g) => g.send_held(),
            Device::Cpu => Ok(0),
        }
    }

    /// The answers of a started batch, when they are there.
    pub fn poll_batch(&self, b: &mut GpuBatch) -> Result<Option<Vec<Hits>>, Outcome> {
        match self {
            Device::Gpu(g) => g.poll_batch(b),
            Device::Cpu => unreachable!("the CPU answers at once"),
        }
    }

    /// The answer of a started search, when it is there.
    pub fn poll(&self, p: &mut GpuPending) -> Result<Option<Hits>, Outcome> {
        match self {
            Device::Gpu(g) => g.poll(p),
            Device::Cpu => unreachable!("the CPU answers at once"),
        }
    }

    /// Where a started search's answer will be in the shared answer area
    /// (worker::own_answer); None when the device keeps its answers.
    pub fn route(&self, p: &GpuPending) -> Option<gpu_graph_gpu::search::answers::Route> {
        match self {
            Device::Gpu(g) => g.route(p),
            Device::Cpu => None,
        }
    }

    /// Whether a started search has finished on the device.
    pub fn finished(&self, p: &GpuPending) -> bool {
        match self {
            Device::Gpu(g) => g.finished(p),
            Device::Cpu => false,
        }
    }

    /// gpu_graph.inject_fault: makes the worker fail as a device fault would.
    pub fn inject_fault(&self) {
        match self {
            Device::Gpu(g) => g.inject_fault(),
            Device::Cpu => pgrx::error!("gpu_graph: search worker fault injected (gpu_graph.inject_fault)"),
        }
    }

    /// Err(why) when the device can serve no more: the worker exits and is
    /// started again.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Device::Gpu(g) => g.health(),
            Device::Cpu => Ok(()),
        }
    }

    pub fn shutdown(&self) {
        if let Device::Gpu(g) = self {
            g.shutdown();
        }
    }
}
