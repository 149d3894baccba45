//! The persistent kernel itself: compiled once per process, launched once
//! with its one parameter struct ([`SearchParams`], abi.h), and asked now and
//! then whether it still runs.

use std::sync::Arc;

use cudarc::driver::sys::{self, CUfunction_attribute, CUresult};
use cudarc::driver::{CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};

use crate::abi::SearchParams;
use crate::device::{function, load_module, Gpu};
use crate::error::{cuda, GpuError};
use crate::nvrtc;

/// What the kernel's stream says.
pub(crate) enum KernelState {
    Running,
    /// It returned: every slot saw Quit (or it quit by itself).
    Exited,
    /// A CUDA error: a fault inside the kernel or a lost device, sticky for
    /// the process.
    Failed(String),
}

pub(crate) struct Kernel {
    /// also holds the batch kernel (search_batch)
    pub module: Arc<CudaModule>,
    func: CudaFunction,
    pub stream: Arc<CudaStream>,
    /// warps of each CTA: 1, or the helper warps' -DGG_WARPS
    warps: u32,
    pub compile_ms: f64,
}

impl Kernel {
    /// Compiles (once per process) and loads the kernel, with room for
    /// `smem` bytes of dynamic shared memory per CTA.
    /// `batch_min_blocks`: the batch kernel's __launch_bounds__ minimum of
    /// resident blocks per SM (0: none); `warps`: of each of the
    /// persistent kernel's CTAs.
    pub fn load(gpu: &Gpu, smem: usize, batch_min_blocks: u32, warps: u32) -> Result<Kernel, GpuError> {
        let t = std::time::Instant::now();
        let mut opts =
            if batch_min_blocks > 0 { vec![format!("-DGG_BATCH_MIN_BLOCKS={batch_min_blocks}")] } else { vec![] };
        if warps > 1 {
            opts.push(format!("-DGG_WARPS={warps}"));
        }
        // a developer's switch for comparing variants of the kernel on the
        // GPU machine (e.g. "-DGG_OPT_X"): options added to its compile
        if let Ok(extra) = std::env::var("GPU_GRAPH_SEARCH_NVRTC_OPTIONS") {
            opts.extend(extra.split_whitespace().map(str::to_string));
        }
        let module = load_module(&gpu.ctx, &nvrtc::SEARCH_PERSISTENT, &gpu.info.target, &opts)?;
        let func = function(&module, "search_persistent")?;
        if smem > 48 * 1024 {
            func.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
                .map_err(|e| cuda("raising the kernel's shared memory", e))?;
        }
        let stream = gpu.ctx.new_stream().map_err(|e| cuda("creating the kernel's stream", e))?;
        Ok(Kernel { module, func, stream, warps, compile_ms: t.elapsed().as_secs_f64() * 1e3 })
    }

    /// Registers a thread of the kernel uses.
    pub fn registers(&self) -> Result<usize, GpuError> {
        self.func
            .get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)
            .map(|r| r as usize)
            .map_err(|e| cuda("the kernel's registers", e))
    }

    /// Resident blocks (CTAs of `warps` warps) per SM at `smem` bytes each.
    pub fn blocks_per_sm(&self, smem: usize) -> Result<usize, GpuError> {
        self.func
            .occupancy_max_active_blocks_per_multiprocessor(32 * self.warps, smem, None)
            .map(|b| b as usize)
            .map_err(|e| cuda("occupancy", e))
    }

    /// Launches `blocks` CTAs of `warps` warps, which run until Quit.
    pub fn launch(&self, params: SearchParams, blocks: usize, smem: usize) -> Result<(), GpuError> {
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (32 * self.warps, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut b = self.stream.launch_builder(&self.func);
        b.arg(&params);
        // SAFETY: the one parameter is abi.h's SearchParams (layout checked),
        // and every address in it stays valid until the kernel has exited
        // (the server frees nothing before, and leaks what it must when the
        // kernel will not stop).
        unsafe { b.launch(cfg) }.map_err(|e| cuda("launching search_persistent", e))?;
        Ok(())
    }

    pub fn state(&self) -> KernelState {
        // SAFETY: a live stream; cudarc has no query of a stream.
        match unsafe { sys::cuStreamQuery(self.stream.cu_stream()) } {
            CUresult::CUDA_ERROR_NOT_READY => KernelState::Running,
            CUresult::CUDA_SUCCESS => KernelState::Exited,
            e => KernelState::Failed(err_name(e)),
        }
    }
}

/// The driver's name of a CUDA result.
pub(crate) fn err_name(r: CUresult) -> String {
    cudarc::driver::result::DriverError(r)
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{r:?}"))
}
