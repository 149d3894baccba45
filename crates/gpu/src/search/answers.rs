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
        let t = &mut b.times;
        if head.picked < first {
            (t.dispatch_ns, t.copy_ns) = (head.dispatch_ns, head.copy_ns);
        }
        t.fence_ns = t.fence_ns.max(head.fence_ns);
        first = first.min(head.picked);
        last = last.max(head.picked + head.search_ns as u64);
        t.start_ns = t.start_ns.max(head.start_ns);
        t.steps = t.steps.max(head.steps);
        if head.cycles >= t.cycles {
            (t.cycles, t.claim_cycles, t.dist_cycles, t.merge_cycles) =
                (head.cycles, head.claim_cycles, head.dist_cycles, head.merge_cycles);
        }
        (b.hits[c], b.rows[c]) = (hits, rows);
    }
    b.times.span_ns = last.saturating_sub(first).min(u32::MAX as u64) as u32;
    (b.times.picked_at, b.times.searched_at) = (first, last);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    const K_MAX: usize = 4;

    /// Two slots of two CTAs each, laid out as `AnswerLayout::of` does.
    fn layout() -> AnswerLayout {
        let cta_block = size_of::<ResultHead>() + (size_of::<ResultHit>() + size_of::<u64>()) * K_MAX;
        AnswerLayout {
            slots: 2,
            finish_stride: 64,
            result_stride: (2 * cta_block).next_multiple_of(128) as u32,
            cta_block: cta_block as u32,
            k_max: K_MAX as u32,
            results_at: 128,
        }
    }

    /// An answer area as the kernel leaves it (8-aligned, as the page-locked
    /// area is).
    struct Area {
        l: AnswerLayout,
        words: Vec<u64>,
    }

    impl Area {
        fn new() -> Area {
            let l = layout();
            Area { l, words: vec![0; l.bytes().div_ceil(8)] }
        }

        fn at(&mut self, byte: usize) -> *mut u8 {
            assert!(byte < self.l.bytes());
            // SAFETY: inside the words (checked above).
            unsafe { (self.words.as_mut_ptr() as *mut u8).add(byte) }
        }

        /// Where CTA `cta` of `slot` writes its answer.
        fn block(&mut self, slot: u32, cta: usize) -> *mut u8 {
            let l = self.l;
            self.at(l.results_at as usize + slot as usize * l.result_stride as usize + cta * l.cta_block as usize)
        }

        /// CTA `cta` of `slot` answering `cmd` with (distance, node, row)
        /// nearest first.
        fn cta(&mut self, slot: u32, cta: usize, cmd: u32, expanded: u32, hits: &[(f32, u32, u64)]) {
            let k_max = self.l.k_max as usize;
            let base = self.block(slot, cta);
            let head = ResultHead { cmd, count: hits.len() as u32, expanded, computed: 10, ..Default::default() };
            // SAFETY: the block lies inside the area, as `read` reads it.
            unsafe {
                std::ptr::write(base as *mut ResultHead, head);
                let h = base.add(size_of::<ResultHead>()) as *mut ResultHit;
                let r = h.add(k_max) as *mut u64;
                for (i, &(dist, id, row)) in hits.iter().enumerate() {
                    *h.add(i) = ResultHit { dist, id };
                    *r.add(i) = row;
                }
            }
        }

        /// The header CTA `cta` of `slot` wrote (after `cta`).
        fn head(&mut self, slot: u32, cta: usize) -> &mut ResultHead {
            let base = self.block(slot, cta);
            // SAFETY: an 8-aligned header inside the area, borrowed with it.
            unsafe { &mut *(base as *mut ResultHead) }
        }

        fn finish(&mut self, slot: u32, cmd: u32) {
            let at = self.at(slot as usize * self.l.finish_stride as usize);
            // SAFETY: a 4-aligned word inside the finish words.
            unsafe { (*(at as *const AtomicU32)).store(cmd, Ordering::Release) };
        }

        fn finished(&self, r: &Route) -> bool {
            // SAFETY: the area's start; the layout is the one it was written in.
            unsafe { finished(self.words.as_ptr() as *const u8, &self.l, r) }
        }

        fn read(&self, r: &Route) -> Result<Vec<(f32, u32, u64)>, String> {
            let results = (self.words.as_ptr() as *const u8).wrapping_add(self.l.results_at as usize);
            // SAFETY: the result blocks of the area, finished for `r`.
            unsafe { read(results, &self.l, r) }.map(|b| b.merged_rows(|_| true))
        }
    }

    #[test]
    fn a_scan_reads_the_ctas_answers_merged_with_their_rows() {
        let mut a = Area::new();
        let r = Route { slot: 1, cmd: 0x42, ctas: 2, k: 3, max_expand: 100 };
        a.cta(1, 0, r.cmd, 12, &[(0.5, 7, 70), (1.5, 9, 90), (2.5, 11, 110)]);
        // the CTAs' lists may share a node (the server's collect drops
        // such repeats too): once, with its row
        a.cta(1, 1, r.cmd, 14, &[(0.25, 3, 30), (0.5, 7, 70)]);
        assert!(!a.finished(&r), "no finish word yet");
        a.finish(1, r.cmd);
        assert!(a.finished(&r));
        assert!(!a.finished(&Route { cmd: 0x43, ..r }), "another request of the slot");
        assert_eq!(a.read(&r).unwrap(), vec![(0.25, 3, 30), (0.5, 7, 70), (1.5, 9, 90)]);
        // a CTA that sat the query out is not read
        assert_eq!(a.read(&Route { ctas: 1, ..r }).unwrap(), vec![(0.5, 7, 70), (1.5, 9, 90), (2.5, 11, 110)]);
    }

    #[test]
    fn the_kernels_clock_spans_the_ctas() {
        let mut a = Area::new();
        let r = Route { slot: 0, cmd: 0x61, ctas: 2, k: 2, max_expand: 100 };
        a.cta(0, 0, r.cmd, 5, &[(1.0, 1, 10)]);
        a.cta(0, 1, r.cmd, 5, &[(2.0, 2, 20)]);
        // CTA 0 took the query first (its dispatch counts), CTA 1 wrote
        // its hits last (the span ends there); the longest fence counts
        for (cta, picked, search_ns, dispatch_ns, copy_ns, fence_ns) in
            [(0, 1_000_000, 30_000, 2_200, 1_300, 2_400), (1, 1_000_300, 40_000, 2_500, 1_400, 900)]
        {
            let h = a.head(0, cta);
            (h.picked, h.search_ns, h.dispatch_ns, h.copy_ns, h.fence_ns) =
                (picked, search_ns, dispatch_ns, copy_ns, fence_ns);
        }
        a.finish(0, r.cmd);
        let results = (a.words.as_ptr() as *const u8).wrapping_add(a.l.results_at as usize);
        // SAFETY: the result blocks of the area, finished for `r`.
        let t = unsafe { read(results, &a.l, &r) }.unwrap().times;
        assert_eq!((t.picked_at, t.searched_at, t.span_ns), (1_000_000, 1_040_300, 40_300));
        assert_eq!((t.dispatch_ns, t.copy_ns, t.fence_ns), (2_200, 1_300, 2_400));
    }

    #[test]
    fn an_answer_that_makes_no_sense_is_refused() {
        let mut a = Area::new();
        let r = Route { slot: 0, cmd: 0x21, ctas: 2, k: 2, max_expand: 100 };
        a.cta(0, 0, r.cmd, 5, &[(1.0, 1, 10)]);
        a.cta(0, 1, 0x20, 5, &[(2.0, 2, 20)]);
        a.finish(0, r.cmd);
        assert!(a.read(&r).unwrap_err().contains("answered 0x20 for 0x21"));
        a.cta(0, 1, r.cmd, abi::OUT_BAD_INDEX, &[]);
        assert_eq!(a.read(&r).unwrap_err(), "the kernel found no such index");
    }
}
