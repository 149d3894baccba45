//! The slot protocol, host side (the kernel's side is described at the top
//! of kernels/search_persistent.cu):
//!
//! * Submit: the request (abi.h's RequestHead, then the query) is written to
//!   the slot's staging bytes in mapped pinned memory. With the doorbell
//!   (the default) an entry naming the slot is posted on a ring in mapped
//!   memory, and the kernel's dispatcher copies the request to the slot's
//!   device buffer and sets the slot's device word to
//!   `seq << 5 | (ctas - 1)`: no driver call. Without it
//!   (`ServerConfig::copy_requests`) the request is copied by the driver
//!   and cuStreamWriteValue32 on the same (per-group) stream sets the word;
//!   stream order puts the request in device memory first. The kernel's
//!   CTAs poll only that device-local word.
//! * A query comes after the index's patches so far: on the doorbell the
//!   dispatcher applies a patch before any entry posted after it; on
//!   streams, the group's stream waits for the last patch's event.
//! * Answer: each CTA writes its ResultHead and hits to mapped pinned host
//!   memory, fences at system scope and arrives on a device counter; the last
//!   one writes the slot's finish word (host memory) with the same value (a
//!   query of one CTA writes it at once). The
//!   host polls only that host-local word.
//! * Sequence numbers instead of None/Work/Finish/Done values: no word is
//!   ever reset, so the host and the GPU never race on one; Done is the
//!   host's own bookkeeping (the slot back in its group's free list).
//! * The most recently freed slot of a group is handed out first (LIFO), so
//!   busy slots stay hot; each host thread prefers its own group.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{result, CudaContext, CudaEvent, CudaSlice, CudaStream};
use parking_lot::{Mutex, MutexGuard};

use super::answers::{self, AnswerArea, AnswerLayout, Route};
use super::doorbell::Doorbell;
use super::launch::err_name;
use super::plan::{QueryPlan, Sizing};
use super::registry::Resident;
use crate::abi::{self, RequestHead, SearchParams};
use crate::error::{cuda, GpuError};
use crate::memory::{device_addr, memcpy_htod_many, zeroed, Pinned, PlainDevice};

/// One answered query with the kernel's work counters.
#[derive(Clone, Debug)]
pub struct Answer {
    /// (search distance, node), ascending, distinct, no deleted node
    pub hits: Vec<(f32, u32)>,
    /// nodes expanded, all CTAs
    pub expanded: u32,
    /// distances computed, all CTAs
    pub computed: u32,
    /// CTAs stopped by the iteration cap
    pub capped: u32,
    /// where its time went on the GPU
    pub times: KernelTimes,
}

/// Where a query's time went on the GPU, by the kernel's clock
/// (%globaltimer, ns): the latency breakdown's GPU part.
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelTimes {
    /// the first CTA taking the query → the last one's hits written
    pub span_ns: u32,
    /// the slowest CTA's start: its scan, or the entry point, its seeds and the entry's list
    pub start_ns: u32,
    /// the most steps (expansion rounds) a CTA took
    pub steps: u32,
    /// SM cycles of the slowest CTA's search, and of them its visited
    /// claims, distances and merges
    pub cycles: u32,
    pub claim_cycles: u32,
    pub dist_cycles: u32,
    pub merge_cycles: u32,
    /// the dispatcher seeing the query's ring entry -> the first CTA taking
    /// it (0 without the doorbell), and of that its copy of the request
    pub dispatch_ns: u32,
    pub copy_ns: u32,
    /// the longest of its CTAs' last fences: an earlier answer's hits
    /// written -> its finish word stored
    pub fence_ns: u32,
    /// %globaltimer when the first CTA took the query and when the last
    /// one's hits were written (ns)
    pub picked_at: u64,
    pub searched_at: u64,
}

/// The host's view of a slot, under its mutex.
#[derive(Default)]
pub(crate) struct SlotState {
    /// sequence number of the last query
    pub seq: u32,
    /// the slot word of the last query
    pub cmd: u32,
    pub busy: bool,
    pub abandoned: bool,
    /// the index the query searches: kept alive until the slot is free
    pub resident: Option<Arc<Resident>>,
    ctas: u32,
    k: u32,
    max_expand: u32,
}

struct Group {
    stream: Arc<CudaStream>,
    free: Mutex<Vec<u32>>,
    /// the patches (Registry::patched) this stream is ordered after
    waited: AtomicU64,
    /// requests filled but not sent yet, (slot, slot word, request bytes):
    /// [`Slots::send_held`] sends them all with two driver calls
    held: Mutex<Vec<(u32, u32, usize)>>,
}

pub(crate) struct Slots {
    z: Sizing,
    states: Vec<Mutex<SlotState>>,
    groups: Vec<Group>,
    group_of: Vec<u16>,
    /// slot words: written by cuStreamWriteValue32 (else a 4-byte copy from
    /// `words`, where the device lacks stream memory operations; Err says why)
    pub stream_mem_ops: Result<(), String>,
    cmd: PlainDevice,
    done: CudaSlice<u32>,
    reqs: CudaSlice<u8>,
    visited: CudaSlice<u64>,
    staging: Pinned,
    /// the finish words, then the result blocks (mapped; the caller's
    /// shared memory when it gave an [`AnswerArea`])
    answers: Pinned,
    layout: AnswerLayout,
    words: Pinned,
    /// the doorbell (None: requests copied)
    doorbell: Option<Arc<Doorbell>>,
}

thread_local! {
    static PREFERRED_GROUP: Cell<usize> = const { Cell::new(usize::MAX) };
}
static NEXT_GROUP: AtomicUsize = AtomicUsize::new(0);

impl Slots {
    pub fn new(
        ctx: &Arc<CudaContext>,
        z: &Sizing,
        mgmt: &Arc<CudaStream>,
        doorbell: &Option<Arc<Doorbell>>,
        area: Option<AnswerArea>,
    ) -> Result<Slots, GpuError> {
        let layout = AnswerLayout::of(z);
        let answers = match area {
            // SAFETY: the area's owner keeps it mapped as long as the server
            // (ServerConfig::answer_area), and it fits (checked at start).
            Some(a) => unsafe { Pinned::register(ctx, a.ptr as *mut u8, a.len, "the answer area")? },
            None => Pinned::new(ctx, layout.bytes(), true, "the answers")?,
        };
        let (slots, groups) = (z.slots, z.groups);
        let mut gs = Vec::with_capacity(groups);
        let mut group_of = vec![0u16; slots];
        for g in 0..groups {
            // group g: slots [g * slots / groups, (g + 1) * slots / groups)
            let (lo, hi) = (g * slots / groups, (g + 1) * slots / groups);
            group_of[lo..hi].fill(g as u16);
            let stream = ctx.new_stream().map_err(|e| cuda("creating a slot stream", e))?;
            gs.push(Group {
                stream,
                free: Mutex::new((lo as u32..hi as u32).rev().collect()),
                waited: AtomicU64::new(0),
                held: Mutex::new(Vec::new()),
            });
        }
        let s = Slots {
            states: (0..slots).map(|_| Mutex::new(SlotState::default())).collect(),
            groups: gs,
            group_of,
            stream_mem_ops: Ok(()),
            cmd: PlainDevice::new(ctx, slots * 4, "the slot words")?,
            done: zeroed(mgmt, slots, "the slot counters")?,
            reqs: zeroed(mgmt, slots * z.req_stride, "the request buffers")?,
            visited: zeroed(mgmt, slots << z.visited_log2, "the visited tables")?,
            staging: Pinned::new(ctx, slots * z.req_stride, z.doorbell, "the request staging")?,
            answers,
            layout,
            words: Pinned::new(ctx, slots * 4, false, "the slot word staging")?,
            doorbell: doorbell.clone(),
            z: z.clone(),
        };
        mgmt.synchronize().map_err(|e| cuda("clearing the slots", e))?;
        // stream memory operations: try one on a slot word (no kernel reads
        // it yet); a device or driver without them refuses it
        // SAFETY: `cmd` is a live cuMemAlloc allocation of one word per slot.
        let probe = unsafe { sys::cuStreamWriteValue32_v2(mgmt.cu_stream(), s.cmd.addr(), 0, 0) };
        let stream_mem_ops = match (probe, mgmt.synchronize()) {
            (CUresult::CUDA_SUCCESS, Ok(())) => Ok(()),
            (CUresult::CUDA_SUCCESS, Err(e)) => Err(format!("{e:?}")),
            (r, _) => Err(err_name(r)),
        };
        mgmt.synchronize().map_err(|e| cuda("synchronising", e))?;
        Ok(Slots { stream_mem_ops, ..s })
    }

    /// The slot part of the kernel's parameter.
    pub fn params(&self, p: &mut SearchParams) {
        p.cmd = self.cmd.addr();
        p.reqs = device_addr(&self.reqs);
        p.visited = device_addr(&self.visited);
        p.done = device_addr(&self.done);
        p.results = self.answers.device_addr() + self.layout.results_at as u64;
        p.finish = self.answers.device_addr();
        p.req_stride = self.z.req_stride as u32;
        p.visited_log2 = self.z.visited_log2;
        p.result_stride = self.layout.result_stride;
        p.cta_block = self.layout.cta_block;
        p.k_max = self.layout.k_max;
        p.finish_stride = self.layout.finish_stride / 4;
        p.ctas_per_slot = self.z.ctas as u32;
        p.list_cap = self.z.list_cap as u32;
        p.max_qwords = self.z.max_qwords as u32;
        if let Some(d) = &self.doorbell {
            p.doorbell = d.ring_addr();
            p.staging = self.staging.device_addr();
            p.ring_log2 = d.log2();
        }
    }

    pub fn count(&self) -> usize {
        self.states.len()
    }
    pub fn layout(&self) -> AnswerLayout {
        self.layout
    }
    /// The route of the query in `slot` (its state says which).
    pub fn route(&self, slot: u32, st: &SlotState) -> Route {
        Route { slot, cmd: st.cmd, ctas: st.ctas, k: st.k, max_expand: st.max_expand }
    }
    pub fn groups(&self) -> usize {
        self.groups.len()
    }
    pub fn state(&self, slot: u32) -> MutexGuard<'_, SlotState> {
        self.states[slot as usize].lock()
    }

    /// A free slot: of `group`, or of this thread's preferred group first.
    pub fn take(&self, group: Option<usize>) -> Option<u32> {
        let n = self.groups.len();
        let pop = |g: usize| self.groups[g].free.lock().pop();
        if let Some(g) = group {
            return pop(g % n);
        }
        let pref = PREFERRED_GROUP.with(|p| {
            if p.get() == usize::MAX {
                p.set(NEXT_GROUP.fetch_add(1, Ordering::Relaxed));
            }
            p.get()
        });
        (0..n).find_map(|i| pop((pref + i) % n))
    }

    pub fn release(&self, slot: u32, st: &mut SlotState) {
        st.busy = false;
        st.abandoned = false;
        st.resident = None;
        self.groups[self.group_of[slot as usize] as usize].free.lock().push(slot);
    }

    /// The last value the kernel finished in this slot.
    pub fn finish_word(&self, slot: u32) -> u32 {
        // SAFETY: inside the mapped finish words, 4-aligned, alive as long
        // as self; the GPU writes it, so it is read atomically.
        unsafe {
            let w = self.answers.ptr().add(slot as usize * self.layout.finish_stride as usize) as *const AtomicU32;
            (*w).load(Ordering::Acquire)
        }
    }

    /// Orders what is sent on `slot`'s stream from now on after the copies
    /// of patch `epoch`, whose event is `patched` (Err: the driver's error).
    pub fn order_after(&self, slot: u32, epoch: u64, patched: &CudaEvent) -> Result<(), String> {
        let g = &self.groups[self.group_of[slot as usize] as usize];
        if epoch > g.waited.load(Ordering::Acquire) {
            g.stream.wait(patched).map_err(|e| format!("waiting for a patch: {e:?}"))?;
            g.waited.fetch_max(epoch, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Writes a slot word on the slot's group stream (Err: the driver's error).
    pub fn write_cmd(&self, slot: u32, value: u32) -> Result<(), String> {
        let stream = &self.groups[self.group_of[slot as usize] as usize].stream;
        stream.context().bind_to_thread().map_err(|e| format!("binding the context: {e:?}"))?;
        let addr = self.cmd.addr() + 4 * slot as u64;
        let r = if self.stream_mem_ops.is_ok() {
            // SAFETY: `addr` is this slot's word; cudarc has no stream write.
            unsafe { sys::cuStreamWriteValue32_v2(stream.cu_stream(), addr, value, 0) }.result()
        } else {
            // SAFETY: the slot's staging word is ours while we own the slot;
            // the copy is ordered on the same stream as the request's.
            unsafe {
                let w = (self.words.ptr() as *mut u32).add(slot as usize);
                std::ptr::write_volatile(w, value);
                result::memcpy_htod_async(addr, std::slice::from_raw_parts(w, 1), stream.cu_stream())
            }
        };
        r.map_err(|e| format!("writing a slot word: {}", err_name(e.0)))
    }

    /// Fills the slot's request (the slot is ours, `st` its locked state)
    /// and sends it: on the doorbell posts it (the ring orders it after
    /// every patch posted); else, after the patches up to `after` (their
    /// epoch and the last one's event), copies it to the device and writes
    /// the slot word, or with `hold` leaves both to [`Slots::send_held`].
    /// Err: the driver's error (the context is then unusable).
    #[allow(clippy::too_many_arguments)]
    pub fn send(
        &self,
        slot: u32,
        st: &mut SlotState,
        res: &Arc<Resident>,
        query: &[f32],
        k: usize,
        plan: &QueryPlan,
        hold: bool,
        after: (u64, &CudaEvent),
    ) -> Result<u32, String> {
        if self.doorbell.is_none() {
            self.order_after(slot, after.0, after.1)?;
        }
        let group = &self.groups[self.group_of[slot as usize] as usize];
        let stream = &group.stream;
        let mut seq = st.seq + 1;
        if seq > abi::SEQ_LIMIT {
            // the 27-bit sequence would wrap: entries of old queries could
            // then look current, so clear the slot's visited table first
            let bytes = 8usize << self.z.visited_log2;
            let at = device_addr(&self.visited) + (slot as u64) * bytes as u64;
            // SAFETY: the slot's own table, inside `visited`.
            unsafe { result::memset_d8_async(at, 0, bytes, stream.cu_stream()) }
                .map_err(|e| format!("clearing a visited table: {e:?}"))?;
            if self.doorbell.is_some() {
                // the dispatcher is not ordered after the stream
                stream.synchronize().map_err(|e| format!("clearing a visited table: {e:?}"))?;
            }
            seq = 1;
        }
        let cmd = abi::cmd_word(seq, plan.ctas);
        let head = RequestHead {
            cmd,
            index: res.table,
            gen: res.gen,
            k: k as u32,
            list: plan.list,
            ctas: plan.ctas,
            max_expand: plan.max_expand.max(1),
            offset_beam: plan.offset_beam,
            beam: plan.beam_width.max(1),
            seeds: plan.seeds.min(abi::MAX_SEEDS),
            scan: plan.scan.min(abi::MAX_SCAN),
            qwords: res.fmt.qwords as u32,
            seen: 0,
            copy_ns: 0,
            pad: [0; 2],
        };
        let bytes = std::mem::size_of::<RequestHead>() + 4 * res.fmt.qwords;
        let at = slot as usize * self.z.req_stride;
        // SAFETY: the slot's staging bytes are ours until its next query,
        // which cannot start before this one finished; `bytes` fits the stride.
        let src = unsafe {
            let base = self.staging.ptr().add(at);
            std::ptr::write_unaligned(base as *mut RequestHead, head);
            let q = std::slice::from_raw_parts_mut(
                base.add(std::mem::size_of::<RequestHead>()) as *mut f32,
                res.fmt.qwords,
            );
            res.query_row(query, q);
            std::slice::from_raw_parts(base as *const u8, bytes)
        };
        st.seq = seq;
        st.cmd = cmd;
        st.busy = true;
        st.abandoned = false;
        st.resident = Some(res.clone());
        st.ctas = plan.ctas;
        st.k = k as u32;
        st.max_expand = plan.max_expand.max(1);
        if let Some(d) = &self.doorbell {
            d.post(slot, src.len().div_ceil(16) as u32);
        } else if hold {
            group.held.lock().push((slot, cmd, src.len()));
        } else {
            self.send_one(stream, slot, cmd, src.len())?;
        }
        Ok(cmd)
    }

    /// Copies the first `bytes` of `slot`'s staged request to the device and
    /// writes its slot word `cmd` after it on `stream`.
    fn send_one(&self, stream: &CudaStream, slot: u32, cmd: u32, bytes: usize) -> Result<(), String> {
        let at = slot as usize * self.z.req_stride;
        // SAFETY: the slot's staging bytes, filled by `send`; the
        // destination is this slot's request buffer; the source is pinned
        // and stays untouched until the kernel has read it.
        unsafe {
            let src = std::slice::from_raw_parts(self.staging.ptr().add(at), bytes);
            result::memcpy_htod_async(device_addr(&self.reqs) + at as u64, src, stream.cu_stream())
        }
        .map_err(|e| format!("copying a query: {e:?}"))?;
        self.write_cmd(slot, cmd)
    }

    /// Sends the requests `send` held, each group's with two driver calls
    /// (one batch of copies, one batch of slot word writes) instead of two
    /// a request: the worker's thread submits every query, and at 64
    /// clients those calls were most of its time. Returns how many were
    /// sent; Err: the driver's error (the context is then unusable).
    pub fn send_held(&self) -> Result<usize, String> {
        let mut sent = 0;
        for g in &self.groups {
            let held = std::mem::take(&mut *g.held.lock());
            match held.as_slice() {
                [] => continue,
                &[(slot, cmd, bytes)] => self.send_one(&g.stream, slot, cmd, bytes)?,
                many => {
                    g.stream.context().bind_to_thread().map_err(|e| format!("binding the context: {e:?}"))?;
                    let copies: Vec<(u64, *const u8, usize)> = many
                        .iter()
                        .map(|&(slot, _, bytes)| {
                            let at = slot as usize * self.z.req_stride;
                            // SAFETY: inside the staging buffer (as in `send`).
                            (
                                device_addr(&self.reqs) + at as u64,
                                unsafe { self.staging.ptr().add(at) } as *const u8,
                                bytes,
                            )
                        })
                        .collect();
                    // SAFETY: each slot's request buffer from its staging bytes,
                    // untouched until the kernel has read them (as in `send`).
                    unsafe { memcpy_htod_many(&g.stream, &copies) }.map_err(|e| format!("copying queries: {e:?}"))?;
                    self.write_cmds(&g.stream, many)?;
                }
            }
            sent += held.len();
        }
        Ok(sent)
    }

    /// The slot words of `held` on `stream`, in one cuStreamBatchMemOp a
    /// chunk where the device takes stream memory operations.
    fn write_cmds(&self, stream: &CudaStream, held: &[(u32, u32, usize)]) -> Result<(), String> {
        // the driver takes at most 256 operations a call
        const CHUNK: usize = 256;
        if self.stream_mem_ops.is_err() {
            return held.iter().try_for_each(|&(slot, cmd, _)| self.write_cmd(slot, cmd));
        }
        for chunk in held.chunks(CHUNK) {
            let mut ops: Vec<sys::CUstreamBatchMemOpParams> = chunk
                .iter()
                .map(|&(slot, cmd, _)| {
                    // SAFETY: plain old data; the write's fields set below.
                    let mut op: sys::CUstreamBatchMemOpParams = unsafe { std::mem::zeroed() };
                    op.writeValue.operation = sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_32;
                    op.writeValue.address = self.cmd.addr() + 4 * slot as u64;
                    op.writeValue.__bindgen_anon_1.value = cmd;
                    op
                })
                .collect();
            // SAFETY: `ops` holds chunk.len() writes of slot words in `cmd`.
            unsafe { sys::cuStreamBatchMemOp_v2(stream.cu_stream(), ops.len() as u32, ops.as_mut_ptr(), 0) }
                .result()
                .map_err(|e| format!("writing slot words: {}", err_name(e.0)))?;
        }
        Ok(())
    }

    /// Reads the finished query of `slot` (its finish word says `st.cmd`),
    /// frees the slot and merges the CTAs' lists. Err: an answer that makes
    /// no sense (a CTA answered another query, or found no index).
    pub fn collect(&self, slot: u32, st: &mut SlotState) -> Result<Answer, String> {
        let route = self.route(slot, st);
        // each CTA's hits where the GPU wrote them, merged in place before
        // the slot is let go (another thread may submit to it after)
        // SAFETY: the result blocks follow the finish words in `answers`;
        // the caller read the finish word `st.cmd`; the slot is released
        // only below, after the merge.
        let read =
            unsafe { answers::read(self.answers.ptr().add(self.layout.results_at as usize), &self.layout, &route) };
        let res = st.resident.as_ref().expect("a busy slot names its index");
        let answer = read.map(|b| Answer {
            hits: b.merged(|v| res.is_result(v)),
            expanded: b.expanded,
            computed: b.computed,
            capped: b.capped,
            times: b.times,
        });
        self.release(slot, st);
        answer
    }

    /// A dropped ticket: the slot comes back now if the GPU has finished it,
    /// else once it has ([`Slots::reclaim`]).
    pub fn abandon(&self, slot: u32, cmd: u32) {
        let mut st = self.state(slot);
        if !st.busy || st.cmd != cmd {
            return;
        }
        if self.finish_word(slot) == cmd {
            self.release(slot, &mut st);
        } else {
            st.abandoned = true;
        }
    }

    /// Frees abandoned slots whose query has finished; how many.
    pub fn reclaim(&self) -> usize {
        let mut freed = 0;
        for (i, s) in self.states.iter().enumerate() {
            if let Some(mut st) = s.try_lock() {
                if st.busy && st.abandoned && self.finish_word(i as u32) == st.cmd {
                    self.release(i as u32, &mut st);
                    freed += 1;
                }
            }
        }
        freed
    }

    /// Whether a query is still on the GPU.
    pub fn any_in_flight(&self) -> bool {
        self.states.iter().enumerate().any(|(i, s)| {
            let st = s.lock();
            st.busy && self.finish_word(i as u32) != st.cmd
        })
    }

    /// Quit in every slot: on the doorbell a quit posted after every
    /// request (the dispatcher writes the slot words, then returns); and one
    /// copy of the whole word array on `mgmt`, after the slot words still
    /// queued on the group streams.
    pub fn quit_all(&self, mgmt: &CudaStream) {
        if let Some(d) = &self.doorbell {
            d.post(abi::RING_QUIT, 0);
        }
        for g in &self.groups {
            let _ = g.stream.synchronize();
        }
        let n = self.count();
        // SAFETY: the staging words are ours (no submit runs once the server
        // is closed); the copy covers exactly the device's slot words.
        unsafe {
            let w = self.words.ptr() as *mut u32;
            for i in 0..n {
                std::ptr::write_volatile(w.add(i), abi::CMD_QUIT);
            }
            let words = std::slice::from_raw_parts(w as *const u32, n);
            if result::memcpy_htod_async(self.cmd.addr(), words, mgmt.cu_stream()).is_ok() {
                let _ = mgmt.synchronize();
            }
        }
    }
}
