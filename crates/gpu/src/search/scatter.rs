//! With copied requests (`ServerConfig::copy_requests`; on the doorbell
//! the kernel's dispatcher applies patches, doorbell.rs):
//! a patch's copies applied on the device by one launch of `apply_patch`
//! (kernels/search_persistent.cu) instead of the driver's batched copy,
//! which cost the host ~1 us a copy: `gpu-graph-searchcheck --patch-costs`
//! on an H100 timed an insert's patch (a row and 36 scattered lists) at 40
//! us, 62-80 us with queries running, against 10 us for the same bytes in
//! three copies. The patch's bytes and a table of abi.h's PatchCopy go to
//! a device inbox in one copy; the kernel scatters them.

use std::mem::size_of;
use std::sync::Arc;

use cudarc::driver::{
    result, CudaFunction, CudaModule, CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};

use crate::abi::PatchCopy;
use crate::device::function;
use crate::error::{cuda, GpuError};
use crate::memory::{device_addr, zeroed, Pinned};

/// Fewer copies than this go through the driver's batched copy.
pub const SCATTER_MIN: usize = 4;

/// Most blocks of one launch (each a warp, a copy at a time).
const MAX_BLOCKS: usize = 256;

pub(crate) struct Scatter {
    func: CudaFunction,
    inbox: CudaSlice<u8>,
}

impl Scatter {
    /// `apply_patch` of the persistent kernel's module with an inbox of
    /// `bytes`, launched once empty here: before the persistent kernel
    /// starts (a first launch while it runs may wait for the context to go
    /// idle: see SearchServer::start).
    pub fn new(module: &Arc<CudaModule>, stream: &Arc<CudaStream>, bytes: usize) -> Result<Scatter, GpuError> {
        let func = function(module, "apply_patch")?;
        let inbox = zeroed::<u8>(stream, bytes, "the patch inbox")?;
        let s = Scatter { func, inbox };
        // SAFETY: no copies: the kernel reads nothing.
        unsafe { s.launch(stream, 0, 0) }.map_err(|e| cuda("the patch kernel's first launch", e))?;
        stream.synchronize().map_err(|e| cuda("the patch kernel's first launch", e))?;
        Ok(s)
    }

    /// Bytes of the table of `n` copies (8-aligned after the data).
    pub fn table_bytes(n: usize) -> usize {
        8 + n * size_of::<PatchCopy>()
    }

    /// Writes the table of `copies` (device address, bytes `range` of the
    /// staging buffer) after the first `used` bytes of `staging`, copies
    /// both to the inbox and applies them on `stream`.
    ///
    /// # Safety
    /// Each destination lies inside device memory that outlives the
    /// stream's work; the staging buffer holds `used` +
    /// [`Scatter::table_bytes`] bytes and is not written again until the
    /// stream has passed this copy; the inbox is used on `stream` alone.
    pub unsafe fn apply(
        &self,
        stream: &CudaStream,
        staging: &Pinned,
        used: usize,
        copies: &[(u64, std::ops::Range<usize>)],
    ) -> Result<(), DriverError> {
        let at = used.next_multiple_of(8);
        let end = at + copies.len() * size_of::<PatchCopy>();
        assert!(end <= staging.len().min(self.inbox.len()), "a patch's table beyond its staging buffer");
        // SAFETY: bytes at..end of the pinned buffer, 8-aligned, which the
        // caller lets this call write (the contract).
        let table = unsafe { std::slice::from_raw_parts_mut(staging.ptr().add(at) as *mut PatchCopy, copies.len()) };
        for (t, (dst, r)) in table.iter_mut().zip(copies) {
            *t = PatchCopy { dst: *dst, src: r.start as u32, len: r.len() as u32 };
        }
        // SAFETY: the first `end` bytes of the staging buffer to the inbox,
        // which is as large; the contract for the rest.
        unsafe {
            result::memcpy_htod_async(
                device_addr(&self.inbox),
                std::slice::from_raw_parts(staging.ptr(), end),
                stream.cu_stream(),
            )?;
            self.launch(stream, at, copies.len())
        }
    }

    /// # Safety
    /// The inbox holds `n` PatchCopy at `at`, each within device memory.
    unsafe fn launch(&self, stream: &CudaStream, at: usize, n: usize) -> Result<(), DriverError> {
        let cfg = LaunchConfig {
            grid_dim: (n.clamp(1, MAX_BLOCKS) as u32, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (inbox, at, n) = (device_addr(&self.inbox), at as u32, n as u32);
        let mut b = stream.launch_builder(&self.func);
        b.arg(&inbox);
        b.arg(&at);
        b.arg(&n);
        // SAFETY: the kernel's parameters (const u8*, u32, u32); the caller's
        // contract for what it reads and writes.
        unsafe { b.launch(cfg) }.map(|_| ())
    }
}
