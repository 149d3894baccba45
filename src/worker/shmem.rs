//! The worker's shared memory: a header (who serves, the counters, the table
//! of resident copies) and then the ring's query slots. Requested in
//! shmem_request_hook with its size from gpu_graph.worker_slots, set up once
//! in shmem_startup_hook (again after a crash restart); backends inherit the
//! pointer through fork. Exists only when gpu_graph is preloaded.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use pgrx::pg_sys;
use pgrx::prelude::*;

use super::changes::ChangeLog;
use super::gpu_builds::GpuBuilders;
use super::ring::Slot;
use super::stats::{Counters, ResidentTable};
use crate::gucs::WORKER_SLOTS;

#[repr(C)]
pub struct Shared {
    pub nslots: u32,
    /// a worker was registered at server start
    pub configured: bool,
    /// the worker serving now: pid (0 = none) and PGPROC number (its latch)
    pub worker_pid: AtomicI32,
    pub worker_procno: AtomicI32,
    /// bumped at every worker start
    pub worker_starts: AtomicU64,
    /// what the running worker searches with: [`DEVICE_CPU`] or [`DEVICE_GPU`]
    pub worker_device: AtomicU32,
    /// the core the worker keeps to itself, plus one (0: none; see `own_core`)
    pub worker_core: AtomicI32,
    pub counters: Counters,
    pub residents: ResidentTable,
    /// backends building an index on the GPU now (see `gpu_builds`)
    pub gpu_builders: GpuBuilders,
    /// the index pages backends changed (see `changes`)
    pub changes: ChangeLog,
    /// the GPU worker's answer layout in the answer area (see `own_answer`)
    pub answers: super::own_answer::Published,
    /// each index's meta page generation and node count (see `meta_mirror`)
    pub meta_mirror: super::meta_mirror::MetaMirror,
}

pub const DEVICE_CPU: u32 = 1;
pub const DEVICE_GPU: u32 = 2;

/// PG_CACHE_LINE_SIZE: ShmemInitStruct hands out memory aligned to it.
const ALIGN: usize = 128;

// the slots after the header are aligned
const _: () = assert!(ALIGN.is_multiple_of(std::mem::align_of::<Slot>()));

fn header_size() -> usize {
    std::mem::size_of::<Shared>().next_multiple_of(ALIGN)
}

fn size(nslots: usize) -> usize {
    // the answer area after the slots, on a page boundary of its own
    answers_at(nslots) + super::own_answer::area_bytes() + super::own_answer::PAGE
}

/// Bytes from the header to the slots' end (the answer area follows, page-aligned).
fn answers_at(nslots: usize) -> usize {
    header_size() + nslots * std::mem::size_of::<Slot>()
}

static SHARED: AtomicPtr<Shared> = AtomicPtr::new(std::ptr::null_mut());
static CONFIGURED: AtomicBool = AtomicBool::new(false);
static mut PREV_REQUEST: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP: pg_sys::shmem_startup_hook_type = None;

/// The shared memory, when gpu_graph was preloaded.
pub fn shared() -> Option<&'static Shared> {
    let p = SHARED.load(Ordering::Acquire);
    // SAFETY: a non-null SHARED points at the initialised shared memory
    // (startup stores it after setting it up), which lives as long as the
    // process; everything in it that changes is atomic or in a cell.
    (!p.is_null()).then(|| unsafe { &*p })
}

impl Shared {
    pub fn slots(&self) -> &[Slot] {
        // SAFETY: `nslots` slots follow the header in the one allocation
        // startup set up (see `size`), aligned: the header is padded to the
        // cache line, a multiple of Slot's alignment.
        unsafe {
            let first = (self as *const Shared as *const u8).add(header_size()) as *const Slot;
            std::slice::from_raw_parts(first, self.nslots as usize)
        }
    }

    /// The answer area: where the GPU worker's server writes the answers
    /// (page-aligned, the same address in every process: the postmaster's
    /// mapping, inherited through fork), and its bytes.
    pub fn answer_area(&self) -> (*mut u8, usize) {
        let start = self as *const Shared as usize + answers_at(self.nslots as usize);
        (start.next_multiple_of(super::own_answer::PAGE) as *mut u8, super::own_answer::area_bytes())
    }

    /// The core the worker keeps to itself, -1 for none.
    pub fn worker_core(&self) -> i32 {
        self.worker_core.load(Ordering::Relaxed) - 1
    }

    /// The serving worker's pid, when one serves.
    pub fn worker(&self) -> Option<i32> {
        Some(self.worker_pid.load(Ordering::Acquire)).filter(|&p| p != 0)
    }
}

/// Installs the hooks (from _PG_init while shared_preload_libraries loads).
pub fn install(worker_registered: bool) {
    CONFIGURED.store(worker_registered, Ordering::Relaxed);
    // SAFETY: _PG_init runs on the postmaster's only thread while it loads
    // shared_preload_libraries, before either hook can be called.
    unsafe {
        PREV_REQUEST = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(request);
        PREV_STARTUP = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(startup);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn request() {
    // SAFETY: the postmaster calls the hook once, on its only thread, after
    // install set PREV_REQUEST; requesting shared memory is allowed there.
    unsafe {
        if let Some(prev) = PREV_REQUEST {
            prev();
        }
        pg_sys::RequestAddinShmemSpace(size(WORKER_SLOTS.get() as usize));
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn startup() {
    // SAFETY: the postmaster (or a backend, in EXEC_BACKEND builds) calls
    // the hook on its only thread after install set PREV_STARTUP. Holding
    // AddinShmemInitLock (MainLWLockArray entry 21), ShmemInitStruct returns
    // the segment of `size(nslots)` bytes, zeroed here by whoever creates it.
    unsafe {
        if let Some(prev) = PREV_STARTUP {
            prev();
        }
        let nslots = WORKER_SLOTS.get() as usize;
        let lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock; // AddinShmemInitLock
        pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let p = pg_sys::ShmemInitStruct(c"gpu_graph search worker".as_ptr(), size(nslots), &mut found) as *mut Shared;
        if !found {
            // all zero: every slot FREE with sequence number 0, counters at 0
            std::ptr::write_bytes(p as *mut u8, 0, size(nslots));
            (*p).nslots = nslots as u32;
            (*p).configured = CONFIGURED.load(Ordering::Relaxed);
        }
        pg_sys::LWLockRelease(lock);
        SHARED.store(p, Ordering::Release);
    }
}
