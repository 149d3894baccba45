//! The doorbell: how the host hands the persistent kernel work without a
//! driver call. A ring of u64 entries in mapped host memory (abi.h's
//! GG_RING_*): a query's slot and request length, a patch, or the quit;
//! the kernel's dispatcher block (`dispatch` in
//! kernels/search_persistent.cu) reads them in order, so whatever is
//! posted after a patch finds the patch applied. A patch's copies are
//! staged in mapped host memory too (a header, the bytes, a table of
//! PatchCopy), and the dispatcher acknowledges each patch by writing its
//! sequence number to a mapped word once applied: until then the host
//! leaves the staging buffer alone and frees no memory a copy may write.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;

use crate::abi;
use crate::error::GpuError;
use crate::memory::Pinned;

/// How long a wait for the dispatcher's acknowledgement may take before
/// the kernel is taken to be gone.
const ACK_WAIT: Duration = Duration::from_secs(2);

pub(crate) struct Doorbell {
    ring: Pinned,
    log2: u32,
    /// the next entry
    tail: AtomicU64,
    /// the dispatcher's word: the sequence number of the last patch applied
    ack: Pinned,
    /// the sequence number of the last patch posted
    patches: AtomicU32,
}

impl Doorbell {
    pub fn new(ctx: &Arc<CudaContext>, log2: u32) -> Result<Doorbell, GpuError> {
        Ok(Doorbell {
            ring: Pinned::new(ctx, 8 << log2, true, "the doorbell ring")?,
            log2,
            tail: AtomicU64::new(0),
            ack: Pinned::new(ctx, 64, true, "the patch acknowledgement")?,
            patches: AtomicU32::new(0),
        })
    }

    /// Device addresses of the ring and the acknowledgement word.
    pub fn ring_addr(&self) -> u64 {
        self.ring.device_addr()
    }
    pub fn ack_addr(&self) -> u64 {
        self.ack.device_addr()
    }
    pub fn log2(&self) -> u32 {
        self.log2
    }

    /// Posts an entry: `slot`'s staged request of `len` 16-byte chunks, or
    /// (`RING_PATCH`, `RING_QUIT`) a patch or the quit. The caller has
    /// written whatever the entry names; at most one entry a slot, one
    /// patch and the quit are ever unread, fewer than the ring holds.
    pub fn post(&self, slot: u32, len: u32) {
        let i = self.tail.fetch_add(1, Ordering::AcqRel);
        let tag = ((i >> self.log2) + 1) & 0xFFFF;
        let entry =
            (tag << abi::RING_TAG_SHIFT) | ((slot as u64) << abi::RING_SLOT_SHIFT) | (len & abi::RING_LEN_MASK) as u64;
        // SAFETY: entry i mod 2^log2 of the ring, 8-aligned, alive as long
        // as self; the release orders what it names before it (the
        // dispatcher reads them after it, over PCIe, with acquire).
        unsafe {
            let e = (self.ring.ptr() as *const AtomicU64).add((i & ((1 << self.log2) - 1)) as usize);
            (*e).store(entry, Ordering::Release);
        }
    }

    /// The next patch's sequence number (for its header).
    pub fn next_patch(&self) -> u32 {
        self.patches.load(Ordering::Acquire).wrapping_add(1)
    }

    /// Posts the patch staged under `seq` (from [`Doorbell::next_patch`]).
    pub fn post_patch(&self, seq: u32) {
        self.patches.store(seq, Ordering::Release);
        self.post(abi::RING_PATCH, 0);
    }

    /// Waits until the dispatcher has applied every patch posted (Err: it
    /// did not within ACK_WAIT, the kernel is gone).
    pub fn wait_patches(&self) -> Result<(), String> {
        let want = self.patches.load(Ordering::Acquire);
        let started = Instant::now();
        loop {
            // SAFETY: the first word of the mapped acknowledgement, alive
            // as long as self; the GPU writes it, so it is read atomically.
            let got = unsafe { (*(self.ack.ptr() as *const AtomicU32)).load(Ordering::Acquire) };
            // sequence numbers wrap: applied when not behind
            if want.wrapping_sub(got) as i32 <= 0 {
                return Ok(());
            }
            if started.elapsed() > ACK_WAIT {
                return Err(format!("the search kernel did not apply patch {want} (at {got}) within {ACK_WAIT:?}"));
            }
            std::thread::yield_now();
        }
    }
}
