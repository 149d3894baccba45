//! The engine's CFS filters on the GPU (kernels/filter.cu's filter_rows):
//! [`GpuFilters`] is a [`FilterRows`] for gpu_graph_engine::cfs::refine_with,
//! one kernel launch per batch of rows over vectors uploaded once. Each
//! filter's lists equal Filter::apply's (gpu-graph-gpucheck compares them
//! list for list).

use cudarc::driver::{LaunchConfig, PushKernelArg};
use gpu_graph_engine::filter::Filter;
use gpu_graph_engine::filter_rows::FilterRows;

use crate::abi::{self, FilterParams};
use crate::device::{function, Gpu};
use crate::error::{cuda, guard, GpuError};
use crate::grnnd::lanes_for;
use crate::memory::{device_addr, zeroed};
use crate::vectors::DeviceVectors;

/// filter_rows' rule code of `filter`.
fn rule(filter: Filter) -> u32 {
    match filter {
        Filter::Rng => abi::FILTER_RNG,
        Filter::Nsg => abi::FILTER_NSG,
        Filter::Vamana { .. } => abi::FILTER_VAMANA,
        Filter::Cagra => abi::FILTER_CAGRA,
        Filter::TsdgOrder { .. } => abi::FILTER_TSDG_ORDER,
    }
}

/// The stored vectors on the device, filtering rows of candidates.
pub struct GpuFilters<'g> {
    gpu: &'g Gpu,
    dv: DeviceVectors,
}

impl<'g> GpuFilters<'g> {
    /// Uploads `vectors` (n × `dim` stored vectors, those the ids name) and
    /// launches the kernel once: a first launch while a persistent kernel
    /// runs (GpuCollect's) may wait forever under CUDA's lazy loading.
    pub fn new(gpu: &'g Gpu, vectors: &[f32], dim: usize) -> Result<GpuFilters<'g>, GpuError> {
        gpu.reserve(DeviceVectors::plan(vectors.len() / dim.max(1), dim)?.bytes(), "the CFS filters' vectors")?;
        let dv = guard("uploading the vectors", || DeviceVectors::upload(gpu, vectors, dim))?;
        let mut f = GpuFilters { gpu, dv };
        if !vectors.is_empty() {
            f.filter_rows(Filter::Rng, &[vec![(0, 0.0)]], 1)?;
        }
        Ok(f)
    }
}

impl FilterRows for GpuFilters<'_> {
    type Error = GpuError;

    fn filter_rows(
        &mut self,
        filter: Filter,
        rows: &[Vec<(u32, f32)>],
        degree: usize,
    ) -> Result<Vec<Vec<u32>>, GpuError> {
        if rows.is_empty() || degree == 0 {
            return Ok(vec![Vec::new(); rows.len()]);
        }
        let total: usize = rows.iter().map(Vec::len).sum();
        if total >= u32::MAX as usize {
            return Err(GpuError::Unsupported(format!("{total} candidates in one batch of rows")));
        }
        let mut starts = Vec::with_capacity(rows.len() + 1);
        let (mut ids, mut dists) = (Vec::with_capacity(total), Vec::with_capacity(total));
        starts.push(0u32);
        for row in rows {
            ids.extend(row.iter().map(|c| c.0));
            dists.extend(row.iter().map(|c| c.1));
            starts.push(ids.len() as u32);
        }
        let kept = guard("the GPU's CFS filter", || {
            let st = &self.gpu.stream;
            let f = function(&self.gpu.filter_module()?, "filter_rows")?;
            let up = |what: &str, e| cuda(&format!("uploading {what}"), e);
            let starts_d = st.clone_htod(&starts).map_err(|e| up("the row starts", e))?;
            let ids_d = st.clone_htod(&ids).map_err(|e| up("the candidates", e))?;
            let dists_d = st.clone_htod(&dists).map_err(|e| up("the candidates", e))?;
            let counts = matches!(filter, Filter::Cagra | Filter::TsdgOrder { .. });
            let work_len = if counts { total } else { 1 };
            let work = zeroed::<u32>(st, work_len, "the detour counts")?;
            let out = zeroed::<u32>(st, rows.len() * degree, "the kept lists")?;
            let p = FilterParams {
                vectors: device_addr(&self.dv.x),
                starts: device_addr(&starts_d),
                ids: device_addr(&ids_d),
                dists: device_addr(&dists_d),
                work: device_addr(&work),
                out: device_addr(&out),
                rows: rows.len() as u32,
                degree: degree as u32,
                dp: self.dv.dp as u32,
                lanes: lanes_for(self.dv.dp, 0),
                rule: rule(filter),
                factor: filter.factor(),
                max_lambda: match filter {
                    Filter::TsdgOrder { max_lambda } => max_lambda.min(u32::MAX as usize) as u32,
                    _ => 0,
                },
                pad0: 0,
            };
            let w = abi::FILTER_WARPS as usize;
            let cfg = LaunchConfig {
                grid_dim: (rows.len().div_ceil(w) as u32, 1, 1),
                block_dim: (abi::FILTER_WARPS * 32, 1, 1),
                shared_mem_bytes: (w * 2 * degree * 4) as u32,
            };
            let mut b = st.launch_builder(&f);
            b.arg(&p);
            // SAFETY: FilterParams is abi.h's layout; every address in it is
            // a live allocation of this stream, sized as its comment in
            // abi.h says; one warp per row with 2 * degree words of shared
            // memory each.
            unsafe { b.launch(cfg) }.map_err(|e| cuda("filter_rows", e))?;
            let kept = st.clone_dtoh(&out).map_err(|e| cuda("downloading the kept lists", e))?;
            st.synchronize().map_err(|e| cuda("filter_rows", e))?;
            Ok(kept)
        })?;
        Ok(kept.chunks(degree).map(|k| k.iter().copied().take_while(|&x| x != abi::NO_NODE).collect()).collect())
    }
}
