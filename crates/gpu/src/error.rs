//! Why a GPU could not be used or a GPU build stopped. Every variant's text is
//! meant for a user's WARNING/ERROR line: it says what is missing and where
//! it was looked for.

use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub enum GpuError {
    /// libcuda could not be loaded, or cuInit failed (no NVIDIA driver).
    NoDriver(String),
    /// A driver is there but it shows no usable device.
    NoDevice(String),
    /// libnvrtc (the run-time CUDA compiler) could not be loaded.
    NvrtcMissing(String),
    /// NVRTC rejected a kernel: the file and the compiler's log.
    Compile { kernel: String, log: String },
    /// Too little free GPU memory for this build.
    OutOfMemory { needed: usize, free: usize, what: String },
    /// The caller's cancel callback asked to stop (query cancel).
    Cancelled,
    /// The input cannot be built on the GPU (too many rows, a pool too large).
    Unsupported(String),
    /// Any other CUDA driver failure.
    Cuda(String),
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::NoDriver(s) => write!(f, "no NVIDIA driver: {s}"),
            GpuError::NoDevice(s) => write!(f, "no usable GPU: {s}"),
            GpuError::NvrtcMissing(s) => {
                write!(f, "the CUDA run-time compiler (NVRTC) is missing: {s}")
            }
            GpuError::Compile { kernel, log } => {
                write!(f, "NVRTC could not compile {kernel}: {}", log.trim())
            }
            GpuError::OutOfMemory { needed: 0, what, .. } => write!(f, "too little GPU memory for {what}"),
            GpuError::OutOfMemory { needed, free, what } => write!(
                f,
                "too little GPU memory for {what}: {} MiB needed, {} MiB free",
                needed.div_ceil(1 << 20),
                free >> 20
            ),
            GpuError::Cancelled => write!(f, "canceled"),
            GpuError::Unsupported(s) => write!(f, "cannot build on the GPU: {s}"),
            GpuError::Cuda(s) => write!(f, "CUDA error: {s}"),
        }
    }
}

impl std::error::Error for GpuError {}

/// A driver call's error, with the driver's own name for it.
pub(crate) fn cuda(what: &str, e: cudarc::driver::DriverError) -> GpuError {
    use cudarc::driver::sys::CUresult;
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    match e.0 {
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
            GpuError::OutOfMemory { needed: 0, free: 0, what: format!("{what} ({name})") }
        }
        _ => GpuError::Cuda(format!("{what}: {name}")),
    }
}

/// Runs `f`, turning a panic inside cudarc (a symbol missing from an old
/// driver, say) into an error: a build must never take the backend down.
pub(crate) fn guard<T>(what: &str, f: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            Err(GpuError::Cuda(format!("{what}: {msg}")))
        }
    }
}
