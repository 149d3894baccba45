//! The search worker steps aside while CREATE INDEX builds on the GPU.
//!
//! The worker's persistent kernel never leaves the GPU, and without MPS the
//! GPU time-slices the contexts of different processes: a build beside it
//! ran at half speed (measured on an H200, 10M x 96: the GRNND rounds took
//! 12.9 s beside the worker, 5.8 s alone). So a backend about to build on
//! the GPU registers here and wakes the worker; the worker, seeing a
//! builder, drops its copies and its GPU context and exits, and the
//! postmaster's restart waits until no builder is left before it opens the
//! GPU again. Meanwhile scans search on the CPU, as whenever the worker is
//! absent.
//!
//! A builder leaves on the way out of the build, whichever way it goes; one
//! that dies without leaving (FATAL ends a process without unwinding) is
//! recognised by its pid no longer being a live backend's.

use std::sync::atomic::{AtomicI32, Ordering};

use pgrx::pg_sys;

use super::set_latch;
use super::shmem::shared;

/// Builds at once that make the worker step aside; more run beside it.
const MAX_BUILDERS: usize = 16;

/// The pids of the backends building on the GPU (0: a free entry).
pub struct GpuBuilders([AtomicI32; MAX_BUILDERS]);

impl GpuBuilders {
    /// Whether a live backend is building on the GPU. Cheap when none is
    /// (loads only); entries of dead backends are cleared on the way.
    pub fn any(&self) -> bool {
        let mut any = false;
        for e in &self.0 {
            let pid = e.load(Ordering::Acquire);
            if pid == 0 {
                continue;
            }
            // SAFETY: BackendPidGetProc takes ProcArrayLock itself and only
            // reads the proc array.
            if unsafe { pg_sys::BackendPidGetProc(pid) }.is_null() {
                let _ = e.compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed);
            } else {
                any = true;
            }
        }
        any
    }
}

/// This backend's registration as a GPU builder, for as long as it lives,
/// and the NVRTC shield its GPU threads need (their first compile puts
/// NVRTC's handlers on the backend's cancel and terminate signals; see
/// crates/gpu/src/nvrtc_signals.rs). Kept on the backend's main thread from
/// before its GPU threads start until they have ended.
pub struct GpuBuild {
    entry: Option<&'static AtomicI32>,
    // dropped after `entry` is released (Drop below runs first)
    _shield: crate::threads::NvrtcShield,
}

impl GpuBuild {
    /// Registers this backend (when gpu_graph is preloaded and an entry is
    /// free) and wakes the worker so that it steps aside now.
    pub fn begin() -> GpuBuild {
        let _shield = crate::threads::NvrtcShield::new();
        let Some(shared) = shared() else { return GpuBuild { entry: None, _shield } };
        // SAFETY: MyProcPid is this process's pid, set at its start.
        let pid = unsafe { pg_sys::MyProcPid };
        let entry = shared
            .gpu_builders
            .0
            .iter()
            .find(|e| e.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed).is_ok());
        if entry.is_some() && shared.worker().is_some() {
            set_latch(shared.worker_procno.load(Ordering::Acquire));
        }
        GpuBuild { entry, _shield }
    }
}

impl Drop for GpuBuild {
    fn drop(&mut self) {
        if let Some(e) = self.entry {
            e.store(0, Ordering::Release);
        }
    }
}
