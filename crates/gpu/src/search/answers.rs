//! Where the persistent kernel's answers lie in host memory, and how one
//! query's answer is read there: by the server's own collect, and by any
//! process that maps the same memory (the search worker's scans read their
//! own answers: [`ServerConfig::answer_area`](super::ServerConfig)). No
//! driver call: plain loads of memory the GPU wrote before the finish word.
//!
//! A slot's answer is `ctas` blocks of `cta_block` bytes at `slot *
//! result_stride` (abi.h's ResultHead, k_max hits, k_max rows); its finish
//! word, `finish_stride` bytes apart, says which slot word it answers.

use super::merge::{merge_by, MAX_LISTS};
use super::plan::{ServerConfig, Sizing, FINISH_STRIDE_WORDS, MAX_AUTO_SLOTS};
use super::slots::KernelTimes;
use crate::abi::{self, ResultHead, ResultHit};
use crate::error::GpuError;
use std::sync::atomic::{AtomicU32, Ordering};

/// The sizes of an answer area (the finish words, then the result blocks),
/// fixed when the server starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct AnswerLayout {
    pub slots: u32,
    /// bytes between two finish words
    pub finish_stride: u32,
    /// bytes of a slot's blocks
    pub result_stride: u32,
    /// bytes of one CTA's block
    pub cta_block: u32,
    /// hits a block holds room for
    pub k_max: u32,
    /// where the result blocks start, bytes from the area's start
    pub results_at: u32,
}

impl AnswerLayout {
    pub(crate) fn of(z: &Sizing) -> AnswerLayout {
        let finish_stride = FINISH_STRIDE_WORDS * 4;
        AnswerLayout {
            slots: z.slots as u32,
            finish_stride: finish_stride as u32,
            result_stride: z.result_stride as u32,
            cta_block: z.cta_block as u32,
            k_max: z.k_max as u32,
            results_at: (z.slots * finish_stride).next_multiple_of(128) as u32,
        }
    }
    /// Bytes of the whole area.
    pub fn bytes(&self) -> usize {
        self.results_at as usize + self.slots as usize * self.result_stride as usize
    }
}

/// Memory the server's caller gives it for the answers (shared memory that
/// other processes map at `ptr` too): page-aligned, a whole number of
/// pages, mapped as long as the server lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnswerArea {
    pub ptr: usize,
    pub len: usize,
}

/// Bytes an answer area needs for a server of `cfg`, at its most slots
/// (what the device allows is known only at start; a larger area is fine).
pub fn area_bytes(cfg: &ServerConfig) -> Result<usize, GpuError> {
    let mut z = Sizing::new(cfg)?;
    z.slots = if cfg.slots == 0 { MAX_AUTO_SLOTS } else { cfg.slots };
    Ok(AnswerLayout::of(&z).bytes())
}

/// Where one query's answer will be: its slot, the slot word its finish
/// word will hold, its CTAs and hits, its plan's expansion cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Route {
    pub slot: u32,
    pub cmd: u32,
    pub ctas: u32,
    pub k: u32,
    pub max_expand: u32,
}

/// A query's CTA blocks, read where the GPU wrote them, with its counters.
pub struct Blocks<'a> {
    hits: [&'a [ResultHit]; MAX_LISTS],
    rows: [&'a [u64]; MAX_LISTS],
    ctas: usize,
    k: usize,
    /// nodes expanded, all CTAs
    pub expanded: u32,
    /// distances computed, all CTAs
    pub computed: u32,
    /// CTAs stopped by the iteration cap
    pub capped: u32,
    pub times: KernelTimes,
}

/// Whether the query `r` has finished: its finish word, in the finish words
/// at `finish` of layout `l`.
///
/// # Safety
/// `finish` is the live start of those words (the GPU writes them).
pub unsafe fn finished(finish: *const u8, l: &AnswerLayout, r: &Route) -> bool {
    // SAFETY: inside the finish words, 4-aligned (the caller's contract);
    // read atomically since the GPU writes it.
    unsafe {
        let w = finish.add(r.slot as usize * l.finish_stride as usize) as *const AtomicU32;
        (*w).load(Ordering::Acquire) == r.cmd
    }
}

/// The blocks of the finished query `r` in the result blocks at `results`.
/// Err: an answer that makes no sense (a CTA answered another query, or
/// found no index).
///
/// # Safety
/// `results` is the live start of the result blocks of layout `l`; the
/// query's finish word said `r.cmd` (read with acquire), and nobody reuses
/// its slot while the blocks are used.
pub unsafe fn read<'a>(results: *const u8, l: &AnswerLayout, r: &Route) -> Result<Blocks<'a>, String> {
    let (ctas, k) = ((r.ctas as usize).min(MAX_LISTS), (r.k as usize).min(l.k_max as usize));
    let mut b = Blocks {
        hits: [&[]; MAX_LISTS],
        rows: [&[]; MAX_LISTS],
        ctas,
        k,
        expanded: 0,
        computed: 0,
        capped: 0,
        times: KernelTimes::default(),
    };
    let (mut first, mut last) = (u64::MAX, 0u64);
    for c in 0..ctas {
        let at = r.slot as usize * l.result_stride as usize + c * l.cta_block as usize;
        // SAFETY: the block lies inside the result blocks; the GPU wrote it
        // before the finish word the caller read (the caller's contract).
        let (head, hits, rows) = unsafe {
            let base = results.add(at);
            let head = std::ptr::read_volatile(base as *const ResultHead);
            let n = (head.count as usize).min(k);
            let hits = base.add(std::mem::size_of::<ResultHead>()) as *const ResultHit;
            let rows = hits.add(l.k_max as usize) as *const u64;
            (head, std::slice::from_raw_parts(hits, n), std::slice::from_raw_parts(rows, n))
        };
        if head.cmd != r.cmd {
            return Err(format!("CTA {c} answered {:#x} for {:#x}", head.cmd, r.cmd));
        }
        if head.expanded == abi::OUT_BAD_INDEX {
            return Err("the kernel found no such index".into());
        }
        b.expanded = b.expanded.saturating_add(head.expanded);
        b.computed = b.computed.saturating_add(head.computed);
        b.capped += (head.expanded >= r.max_expand) as u32;
        first = first.min(head.picked);
        last = last.max(head.picked + head.search_ns as u64);
        let t = &mut b.times;
        t.start_ns = t.start_ns.max(head.start_ns);
        t.steps = t.steps.max(head.steps);
        if head.cycles >= t.cycles {
            (t.cycles, t.claim_cycles, t.dist_cycles, t.merge_cycles) =
                (head.cycles, head.claim_cycles, head.dist_cycles, head.merge_cycles);
        }
        (b.hits[c], b.rows[c]) = (hits, rows);
    }
    b.times.span_ns = last.saturating_sub(first).min(u32::MAX as u64) as u32;
    Ok(b)
}

impl Blocks<'_> {
    /// The k nearest (distance, node) of the CTAs' lists, each node once,
    /// only those `keep` takes.
    pub fn merged(&self, keep: impl FnMut(u32) -> bool) -> Vec<(f32, u32)> {
        let mut out = Vec::with_capacity(self.k);
        merge_by(&self.hits[..self.ctas], self.k, keep, |h: &ResultHit, _, _| out.push((h.dist, h.id)));
        out
    }

    /// As [`Blocks::merged`], each with its row as the kernel read it (0:
    /// the copy has none for that node).
    pub fn merged_rows(&self, keep: impl FnMut(u32) -> bool) -> Vec<(f32, u32, u64)> {
        let mut out = Vec::with_capacity(self.k);
        merge_by(&self.hits[..self.ctas], self.k, keep, |h: &ResultHit, list, pos| {
            out.push((h.dist, h.id, self.rows[list][pos]))
        });
        out
    }
}
