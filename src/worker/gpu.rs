//! The adapter over crates/gpu's persistent search kernel (SearchServer):
//! every use of its API by the worker is in this file.

use gpu_graph_engine::metric::Metric;
use gpu_graph_gpu::search::{IndexImage, ResidentId, SearchError, SearchServer, ServerConfig, Ticket};
use gpu_graph_gpu::{Gpu, GpuError};

use super::device::{Failure, Hits};
use super::image::Image;

pub struct GpuSearch {
    // fields drop in order: the server (and its kernel) before the context
    server: SearchServer,
    gpu: Gpu,
}

pub struct GpuResident {
    id: ResidentId,
    metric: Metric,
}

pub struct GpuPending(Ticket);

fn failure(e: SearchError) -> Failure {
    match e {
        SearchError::Busy => Failure::Busy,
        SearchError::Invalid(s) => Failure::Unfit(s),
        SearchError::Timeout => Failure::Error("the GPU did not answer in time".into()),
        SearchError::Gpu(e) => Failure::Error(e.to_string()),
        // the context is gone: only a new process gets a new one
        e @ (SearchError::Closed | SearchError::Poisoned(_)) => Failure::Fatal(e.to_string()),
    }
}

impl GpuSearch {
    pub fn open() -> Result<GpuSearch, String> {
        let gpu = Gpu::open().map_err(|e| e.to_string())?;
        // fault injection is reachable only through a superuser-only setting
        let cfg = ServerConfig { allow_fault_injection: true, ..ServerConfig::default() };
        let server = SearchServer::start(&gpu, cfg).map_err(|e| e.to_string())?;
        Ok(GpuSearch { server, gpu })
    }

    pub fn describe(&self) -> String {
        let i = self.server.info();
        format!("{} ({} query slots of {} CTAs)", self.gpu.info().name, i.slots, i.ctas_per_slot)
    }

    /// gpu_graph.gpu_memory_limit = 0: the device memory free now less 1 GiB.
    pub fn auto_limit(&self) -> usize {
        self.gpu.mem_info().map(|(free, _)| free.saturating_sub(1 << 30)).unwrap_or(0)
    }

    /// Uploads a copy; its device bytes.
    pub fn load(&self, image: &Image) -> Result<(GpuResident, usize), Failure> {
        let entry = image.entry.expect("only copies with an entry point are uploaded");
        let img = IndexImage {
            vectors: &image.vectors,
            stored_dim: image.stored_dim,
            adjacency: &image.adjacency,
            degree: image.degree,
            entry,
            flags: Some(&image.flags),
            metric: image.metric,
        };
        match self.server.load(&img) {
            Ok(id) => {
                let bytes = self.server.bytes(id).unwrap_or(0);
                Ok((GpuResident { id, metric: image.metric }, bytes))
            }
            Err(e) => Err(self.load_failure(e)),
        }
    }

    fn load_failure(&self, e: GpuError) -> Failure {
        if let Some(why) = self.server.poisoned() {
            return Failure::Fatal(why);
        }
        match e {
            GpuError::OutOfMemory { .. } | GpuError::Unsupported(_) => Failure::Unfit(e.to_string()),
            e => Failure::Error(e.to_string()),
        }
    }

    pub fn unload(&self, r: GpuResident) {
        // queries against it fail from now on; an error here leaves device
        // memory behind, which the next poisoned-server check reports
        let _ = self.server.unload(r.id);
    }

    pub fn submit(&self, r: &GpuResident, query: &[f32], k: usize, ef: usize) -> Result<GpuPending, Failure> {
        let k = k.min(self.server.info().k_max);
        self.server.submit(r.id, &r.metric.prepare_query(query), k, ef).map(GpuPending).map_err(failure)
    }

    pub fn poll(&self, p: &mut GpuPending) -> Result<Option<Hits>, Failure> {
        self.server.poll(&mut p.0).map_err(failure)
    }

    pub fn inject_fault(&self) -> Result<(), Failure> {
        self.server.inject_fault().map_err(failure)
    }

    /// Whether the kernel still runs (a fault may come with no query waiting).
    pub fn health(&self) -> Result<(), Failure> {
        self.server.health().map_err(failure)
    }

    pub fn shutdown(&self) {
        let _ = self.server.shutdown();
    }
}
