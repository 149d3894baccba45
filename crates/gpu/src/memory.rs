//! Memory behind RAII types, so each allocation is freed in one place.
//!
//! Device memory is cudarc's `CudaSlice` (freed on drop, on the stream it was
//! allocated on), allocated through [`zeroed`]; on devices with memory pools
//! cudarc takes it from the stream-ordered pool. Stream memory operations
//! (cuStreamWriteValue32, the search server's slot words) refuse pool
//! memory, so what they write is [`PlainDevice`] (cuMemAlloc). Page-locked
//! host memory is [`Pinned`]: cudarc's own pinned slice synchronises on an
//! event at every access and cannot be mapped into the device's address
//! space, both wrong for the search server, whose host threads and kernel
//! share such memory through a lock-free protocol.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{result, CudaContext, CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};

use crate::error::{cuda, GpuError};

/// `len` zeroed elements on `stream`'s device.
pub fn zeroed<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    len: usize,
    what: &str,
) -> Result<CudaSlice<T>, GpuError> {
    stream.alloc_zeros(len.max(1)).map_err(|e| cuda(&format!("allocating {what}"), e))
}

/// The device address of a slice (for a kernel parameter or a copy at an
/// offset). Event tracking is off in every context of this crate, so taking
/// the address records nothing.
pub fn device_addr<T>(s: &CudaSlice<T>) -> u64 {
    s.device_ptr(s.stream()).0
}

/// Zeroed device memory from cuMemAlloc, not from a pool.
pub struct PlainDevice {
    ctx: Arc<CudaContext>,
    addr: sys::CUdeviceptr,
}

impl PlainDevice {
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize, what: &str) -> Result<PlainDevice, GpuError> {
        let bytes = bytes.max(4);
        ctx.bind_to_thread().map_err(|e| cuda("binding the context", e))?;
        // SAFETY: a plain allocation of `bytes`, owned by the value returned.
        let addr = unsafe { result::malloc_sync(bytes) }.map_err(|e| cuda(&format!("allocating {what}"), e))?;
        let d = PlainDevice { ctx: ctx.clone(), addr };
        // SAFETY: `bytes` bytes were just allocated at `addr`.
        unsafe { result::memset_d8_sync(addr, 0, bytes) }.map_err(|e| cuda(&format!("clearing {what}"), e))?;
        Ok(d)
    }
    pub fn addr(&self) -> u64 {
        self.addr
    }
}

impl Drop for PlainDevice {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated in `new`, freed once, after its users stopped
        // (the search server leaks it when its kernel would not stop).
        let _ = unsafe { result::free_sync(self.addr) };
    }
}

/// Page-locked host memory, zeroed, optionally mapped into the device's
/// address space (the kernel then reads and writes it over the bus).
pub struct Pinned {
    ctx: Arc<CudaContext>,
    ptr: *mut u8,
    len: usize,
    device: u64,
    /// the caller's memory, page-locked by [`Pinned::register`] (else the
    /// driver's allocation)
    registered: bool,
}

// SAFETY: the pointer is owned by this value; who may touch which bytes when
// is the business of the protocol built on it (slot ownership, finish words).
unsafe impl Send for Pinned {}
// SAFETY: as above: `&Pinned` only hands out raw pointers.
unsafe impl Sync for Pinned {}

impl Pinned {
    pub fn new(ctx: &Arc<CudaContext>, len: usize, mapped: bool, what: &str) -> Result<Pinned, GpuError> {
        let len = len.max(4);
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | if mapped { sys::CU_MEMHOSTALLOC_DEVICEMAP } else { 0 };
        ctx.bind_to_thread().map_err(|e| cuda("binding the context", e))?;
        // SAFETY: a plain allocation; the pointer is checked and zeroed below.
        let ptr =
            unsafe { result::malloc_host(len, flags) }.map_err(|e| cuda(&format!("pinning {what}"), e))? as *mut u8;
        let mut p = Pinned { ctx: ctx.clone(), ptr, len, device: 0, registered: false };
        // SAFETY: `len` bytes were just allocated at `ptr`.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        if mapped {
            p.map(what)?;
        }
        Ok(p)
    }

    /// The caller's `len` bytes at `ptr` (page-aligned, a whole number of
    /// pages), zeroed, page-locked and mapped into the device's address
    /// space: memory other processes map too (shared memory), where they
    /// read what the kernel writes.
    ///
    /// # Safety
    /// The bytes stay mapped at `ptr` as long as the returned value lives,
    /// and nothing else writes them meanwhile but through it.
    pub unsafe fn register(ctx: &Arc<CudaContext>, ptr: *mut u8, len: usize, what: &str) -> Result<Pinned, GpuError> {
        ctx.bind_to_thread().map_err(|e| cuda("binding the context", e))?;
        // SAFETY: the caller's contract.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: `len` bytes at `ptr` are the caller's, mapped (its contract).
        let r = unsafe { sys::cuMemHostRegister_v2(ptr as *mut c_void, len, flags) };
        r.result().map_err(|e| cuda(&format!("page-locking {what}"), e))?;
        let mut p = Pinned { ctx: ctx.clone(), ptr, len, device: 0, registered: true };
        p.map(what)?;
        Ok(p)
    }

    fn map(&mut self, what: &str) -> Result<(), GpuError> {
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is live DEVICEMAP memory; cudarc has no wrapper for
        // this call.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, self.ptr as *mut c_void, 0) };
        r.result().map_err(|e| cuda(&format!("mapping {what}"), e))?;
        self.device = d;
        Ok(())
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The device's address of a mapped allocation (0 when not mapped).
    pub fn device_addr(&self) -> u64 {
        self.device
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_host in `new` (or registered there),
        // freed once; nothing reads it any more (the owner drops it after
        // the kernel stopped, or leaks it when the kernel would not stop).
        let _ = unsafe {
            if self.registered {
                sys::cuMemHostUnregister(self.ptr as *mut c_void).result()
            } else {
                result::free_host(self.ptr as *mut c_void)
            }
        };
    }
}

/// Copies from host to device, issued on `stream` as one batch
/// (cuMemcpyBatchAsync, CUDA 13 drivers): one driver call where a copy
/// each costs microseconds of the calling thread. The copies of one batch
/// may land in any order; batches on a stream land in its order. Each copy
/// is (device address, host source, bytes); the sources must stay
/// untouched until the stream has passed the batch.
///
/// # Safety
/// Each destination holds its bytes; each source is readable for them.
pub unsafe fn memcpy_htod_batch_async(
    stream: &CudaStream,
    copies: &[(u64, *const u8, usize)],
) -> Result<(), sys::CUresult> {
    if copies.is_empty() {
        return Ok(());
    }
    let mut dsts: Vec<sys::CUdeviceptr> = copies.iter().map(|c| c.0).collect();
    let mut srcs: Vec<sys::CUdeviceptr> = copies.iter().map(|c| c.1 as sys::CUdeviceptr).collect();
    let mut sizes: Vec<usize> = copies.iter().map(|c| c.2).collect();
    // SAFETY: plain old data; every field set below.
    let mut attr: sys::CUmemcpyAttributes = unsafe { std::mem::zeroed() };
    // the sources are read when the stream gets there (pinned, untouched
    // until then: the caller's contract)
    attr.srcAccessOrder = sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    attr.srcLocHint.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST;
    attr.dstLocHint.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    attr.dstLocHint.id = stream.context().ordinal() as i32;
    let mut attr_index = 0usize;
    // SAFETY: the arrays hold `copies.len()` entries; one attribute for all
    // of them (from index 0); the caller's contract for the memory.
    let r = unsafe {
        sys::cuMemcpyBatchAsync_v2(
            dsts.as_mut_ptr(),
            srcs.as_mut_ptr(),
            sizes.as_mut_ptr(),
            copies.len(),
            &mut attr,
            &mut attr_index,
            1,
            stream.cu_stream(),
        )
    };
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(e),
    }
}

/// Whether [`memcpy_htod_many`] sends batches (cleared when the driver
/// refuses one: drivers before CUDA 13 have no cuMemcpyBatchAsync_v2).
static BATCH_COPIES: AtomicBool = AtomicBool::new(true);

/// Issues host-to-device copies on `stream` without waiting: one batch (a
/// driver call) where the driver takes batches and there is more than one
/// copy, else a call a copy. The copies may land in any order; the
/// stream's later work comes after all of them. Err: the failed call.
///
/// # Safety
/// As [`memcpy_htod_batch_async`].
pub unsafe fn memcpy_htod_many(
    stream: &CudaStream,
    copies: &[(u64, *const u8, usize)],
) -> Result<(), cudarc::driver::DriverError> {
    if copies.len() > 1 && BATCH_COPIES.load(Ordering::Relaxed) {
        // SAFETY: the caller's contract.
        match unsafe { memcpy_htod_batch_async(stream, copies) } {
            Ok(()) => return Ok(()),
            // an older driver: a call a copy from now on
            Err(_) => BATCH_COPIES.store(false, Ordering::Relaxed),
        }
    }
    for &(at, src, len) in copies {
        // SAFETY: the caller's contract.
        unsafe { result::memcpy_htod_async(at, std::slice::from_raw_parts(src, len), stream.cu_stream()) }?;
    }
    Ok(())
}
