//! Opening the GPU: driver, device, NVRTC and the GRNND kernels, each failure
//! a [`GpuError`] that says which.

use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::error::{cuda, guard, GpuError};
use crate::loader;
use crate::nvrtc::{self, KernelSource, Target};

/// What was found.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability (major, minor): (9, 0) on Hopper.
    pub cc: (i32, i32),
    pub sm_count: u32,
    pub total_mem: usize,
    /// cuDriverGetVersion: 13000 for CUDA 13.0.
    pub driver_version: i32,
    pub nvrtc_version: (i32, i32),
    pub target: Target,
    pub libcuda: String,
    pub libnvrtc: String,
}

/// An open GPU: a CUDA context, one stream, and the GRNND kernels loaded.
/// Dropping it releases the context; the compiled kernels stay cached in
/// the process.
pub struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) info: DeviceInfo,
    pub(crate) grnnd: Arc<CudaModule>,
    /// knn_exact.cu compiled with its staging and re-rank alone (what
    /// GNN-Descent uses), and for 32- and 64-entry lists
    knn: [OnceLock<Result<Arc<CudaModule>, GpuError>>; 3],
    /// filter.cu (the CFS filters)
    filter: OnceLock<Result<Arc<CudaModule>, GpuError>>,
    /// knn_descent.cu (GNN-Descent's k-NN graph)
    descent: OnceLock<Result<Arc<CudaModule>, GpuError>>,
    /// ms spent compiling and loading kernels by `open` (0 when the process
    /// had compiled them before)
    pub compile_ms: f64,
}

impl Gpu {
    /// Opens device 0 (CUDA_VISIBLE_DEVICES applies).
    pub fn open() -> Result<Gpu, GpuError> {
        Gpu::open_ordinal(0)
    }

    pub fn open_ordinal(ordinal: usize) -> Result<Gpu, GpuError> {
        let libcuda = loader::load_driver()?;
        guard("opening the GPU", || {
            use cudarc::driver::result;
            result::init().map_err(|e| {
                let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
                match name.as_str() {
                    "CUDA_ERROR_NO_DEVICE" => GpuError::NoDevice(format!("cuInit: {name}")),
                    _ => GpuError::NoDriver(format!("cuInit failed: {name} (libcuda: {})", libcuda.display())),
                }
            })?;
            let count = result::device::get_count().map_err(|e| cuda("cuDeviceGetCount", e))?;
            if count <= 0 {
                return Err(GpuError::NoDevice("the driver sees no CUDA device".into()));
            }
            if ordinal >= count as usize {
                return Err(GpuError::NoDevice(format!("device {ordinal} asked for, {count} present")));
            }
            let mut driver_version = 0;
            // SAFETY: a valid out-pointer; cudarc has no wrapper for this call.
            unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) };
            let ctx = CudaContext::new(ordinal).map_err(|e| cuda("creating a CUDA context", e))?;
            // SAFETY: streams are ordered by hand: a build uses one stream in
            // order, and the search server synchronises its management
            // stream before the kernel reads what it wrote. cudarc's events
            // per slice would only add work (and serialise the slot streams).
            unsafe { ctx.disable_event_tracking() };
            let cc = ctx.compute_capability().map_err(|e| cuda("compute capability", e))?;
            let sm_count = ctx
                .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(|e| cuda("SM count", e))? as u32;
            let name = ctx.name().unwrap_or_else(|_| "?".into());
            let total_mem = ctx.total_mem().unwrap_or(0);
            let libnvrtc = loader::load_nvrtc()?;
            let nvrtc_version = nvrtc::version()?;
            let target = nvrtc::target_for(cc)?;
            let stream = ctx.default_stream();
            let info = DeviceInfo {
                ordinal,
                name,
                cc,
                sm_count,
                total_mem,
                driver_version,
                nvrtc_version,
                target,
                libcuda: libcuda.display().to_string(),
                libnvrtc: libnvrtc.display().to_string(),
            };
            let t0 = std::time::Instant::now();
            let grnnd = load_module(&ctx, &nvrtc::RNN_DESCENT, &info.target, &[])?;
            let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
            Ok(Gpu {
                ctx,
                stream,
                info,
                grnnd,
                knn: [OnceLock::new(), OnceLock::new(), OnceLock::new()],
                filter: OnceLock::new(),
                descent: OnceLock::new(),
                compile_ms,
            })
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), GpuError> {
        self.ctx.mem_get_info().map_err(|e| cuda("cuMemGetInfo", e))
    }

    /// Free device memory less a margin: what one build may take.
    pub fn usable_memory(&self) -> Result<usize, GpuError> {
        let (free, _) = self.mem_info()?;
        // keep 5% and 256 MiB for the context, the modules and fragmentation
        Ok(free.saturating_sub(free / 20).saturating_sub(256 << 20))
    }

    /// Fails with OutOfMemory unless `bytes` fit in free memory with a margin.
    pub(crate) fn reserve(&self, bytes: usize, what: &str) -> Result<(), GpuError> {
        let (free, _) = self.mem_info()?;
        if bytes > self.usable_memory()? {
            return Err(GpuError::OutOfMemory { needed: bytes, free, what: what.into() });
        }
        Ok(())
    }

    /// The exact k-NN kernels for lists of 32 * lpl entries (lpl 1 or 2),
    /// or (lpl 0) only its staging and re-rank: compiled on first use (a
    /// build with a random start never pays for them, and GNN-Descent's
    /// start not for the tiles, most of the ~2 s an sm_90 compile takes).
    pub(crate) fn knn_module(&self, lpl: usize) -> Result<Arc<CudaModule>, GpuError> {
        let i = lpl.min(2);
        self.knn[i]
            .get_or_init(|| load_module(&self.ctx, &nvrtc::KNN_EXACT, &self.info.target, &[format!("-DKNN_LPL={i}")]))
            .clone()
    }
}

impl Gpu {
    /// The CFS filters' kernel, compiled on first use.
    pub(crate) fn filter_module(&self) -> Result<Arc<CudaModule>, GpuError> {
        self.filter.get_or_init(|| load_module(&self.ctx, &nvrtc::FILTER, &self.info.target, &[])).clone()
    }

    /// GNN-Descent's kernels, compiled on first use.
    pub(crate) fn descent_module(&self) -> Result<Arc<CudaModule>, GpuError> {
        self.descent.get_or_init(|| load_module(&self.ctx, &nvrtc::KNN_DESCENT, &self.info.target, &[])).clone()
    }
}

pub(crate) fn load_module(
    ctx: &Arc<CudaContext>,
    k: &KernelSource,
    target: &Target,
    options: &[String],
) -> Result<Arc<CudaModule>, GpuError> {
    let c = nvrtc::compiled(k, target, options)?;
    let ptx = match target {
        Target::Cubin(_) => Ptx::from_binary(c.image.clone()),
        Target::Ptx(_) => {
            let s = String::from_utf8_lossy(&c.image).trim_end_matches('\0').to_string();
            Ptx::from_src(s)
        }
    };
    ctx.load_module(ptx).map_err(|e| cuda(&format!("loading {}", k.name), e))
}

pub(crate) fn function(m: &Arc<CudaModule>, name: &str) -> Result<CudaFunction, GpuError> {
    m.load_function(name).map_err(|e| cuda(&format!("kernel {name}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver (CI), opening answers with an error that names what
    /// is missing; it never panics. With one, it opens.
    #[test]
    fn open_answers_without_panicking() {
        match Gpu::open() {
            Ok(g) => assert!(g.info().sm_count > 0),
            Err(e) => {
                let msg = e.to_string();
                assert!(!msg.is_empty());
                assert!(
                    matches!(e, GpuError::NoDriver(_) | GpuError::NoDevice(_) | GpuError::NvrtcMissing(_)),
                    "{msg}"
                );
            }
        }
    }
}
