//! gpu_graph's GPU side, CUDA through cudarc with every entry point resolved
//! at run time: this crate loads and answers (with a [`GpuError`]) on a
//! machine with no NVIDIA driver.
//!
//! - [`Gpu::open`]: finds libcuda and NVRTC (see [`loader`]), opens device 0,
//!   compiles the kernels of `kernels/` for its architecture (once per
//!   process, [`nvrtc`]) and loads them.
//! - [`abi`]: the host–kernel ABI, mirroring `kernels/abi.h`.
//! - [`memory`]: device and pinned memory behind RAII types.
//! - [`build`]: the GRNND graph build (kernels/rnn_descent.cu) from a random,
//!   exact k-NN or GNN-Descent start, with the engine's final cut.
//! - [`knn_graph`]: the exact k-NN graph on tensor cores (kernels/knn_exact.cu).
//! - [`descent_graph`]: GNN-Descent's approximate k-NN graph, its local joins
//!   on tensor cores (kernels/knn_descent.cu), a GRNND build's start.
//! - [`filter::GpuFilters`]: the engine's CFS filters (RNG, NSG, Vamana,
//!   CAGRA) over batches of candidate rows (kernels/filter.cu).
//! - [`collect::GpuCollect`]: the CFS collect's searches, by the search
//!   server's batch kernel.
//! - [`nvrtc_signals`]: the signals NVRTC takes over in a process's first
//!   compile, and the shield that keeps them from a host's main thread.
//! - [`thread_signals`]: the signal mask of the threads a host starts.
//! - [`search`]: the persistent search kernel (kernels/search_persistent.cu)
//!   and its host side, for the search worker.

pub mod abi;
pub mod collect;
pub mod device;
pub mod error;
pub mod filter;
pub mod grnnd;
pub mod knn;
pub mod knn_descent;
pub mod loader;
pub mod memory;
pub mod nvrtc;
pub mod nvrtc_signals;
pub mod search;
pub mod thread_signals;
mod vectors;

pub use device::{DeviceInfo, Gpu};
pub use error::GpuError;
pub use grnnd::{
    build, build_streamed, build_with, device_bytes, Control, GpuOptions, KnnInit, PhaseTimes, Start,
    EXACT_KNN_AUTO_MAX_ROWS,
};
pub use knn::{knn_graph, KnnGraph};
pub use knn_descent::{descent_graph, DescentParams};
