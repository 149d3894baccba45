//! Server configuration, the per-query plan (how a query's beam is spread
//! over its slot's CTAs) and the server's sizes (slots, CTAs, strides).

use std::mem::size_of;

use crate::abi::{self, IndexDesc, RequestHead, ResultHead, ResultHit};
use crate::error::GpuError;

/// How a SearchServer is sized. Every `0` means "choose from the device".
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Query slots: the most queries in flight at once. 0 = as many as the
    /// resident-block limit allows with `ctas_per_slot`, at most 256.
    pub slots: usize,
    /// CTAs per slot (at most 32). 0 = [`DEFAULT_CTAS_PER_SLOT`].
    pub ctas_per_slot: usize,
    /// Warps of each CTA (1 or 2): warp 0 searches, the others take their
    /// share of each distance loop of several passes (wide rows, a
    /// query's start, beam steps). More warps a CTA, fewer CTAs resident
    /// (registers): fewer slots. 0 = [`DEFAULT_CTA_WARPS`].
    pub cta_warps: usize,
    /// Largest stored dimension of an index (sizes each CTA's shared copy of
    /// the query; a larger index is refused at load).
    pub max_dim: usize,
    /// Longest candidate list of one CTA (a query whose plan needs more is
    /// refused).
    pub max_list: usize,
    /// Largest k of a query (rounded up to even).
    pub max_k: usize,
    /// log2 of the entries of each slot's visited table; 0 = chosen from
    /// `max_list` and `ctas_per_slot` (at least 4x the nodes one query can
    /// compute at degree 32, between 2^12 and 2^17).
    pub visited_log2: u32,
    /// Slot groups, each with its own submission stream and free list (the
    /// worker may give each host thread a group, ALGAS V-B). 0 = min(8, slots).
    pub groups: usize,
    /// Indexes resident at once.
    pub max_indexes: usize,
    /// When an index's vectors are kept in fp16 instead of fp32.
    pub half_rows: HalfRows,
    /// Deepest back-off of an idle CTA between two polls of its slot word.
    pub max_sleep_ns: u32,
    /// Enables [`crate::search::SearchServer::inject_fault`] (tests only).
    pub allow_fault_injection: bool,
    /// Slots the caller wants at least (the worker: its ring's): where
    /// the default warps a CTA ([`DEFAULT_CTA_WARPS`], `cta_warps` 0)
    /// would leave fewer, the server takes one warp a CTA (a small GPU:
    /// twice the CTAs resident). 0 = no such wish.
    pub min_slots: usize,
    /// How a query reaches the kernel: false (the default), through the
    /// doorbell, the request written to mapped host memory and a ring
    /// entry posted there, which one block of the kernel reads and
    /// dispatches (no driver call a query); true, an async copy of the
    /// request and a stream write of the slot word (the A/B of
    /// docs/benchmarks.md).
    pub copy_requests: bool,
    /// How a query's `ef` becomes a plan.
    pub policy: SearchPolicy,
    /// Resident blocks per SM the batch kernel is compiled for (its
    /// __launch_bounds__: fewer registers each, at least 1).
    pub batch_min_blocks: u32,
    /// Where the answers go (see [`crate::search::answers`]): the caller's
    /// shared memory, or None for memory of the server's own. An area too
    /// small for the sizes the device gives is not used
    /// ([`ServerInfo::answer_area`](super::ServerInfo)).
    pub answer_area: Option<super::answers::AnswerArea>,
}

/// The most slots the server sizes itself to ([`ServerConfig::slots`] 0).
pub const MAX_AUTO_SLOTS: usize = 256;

/// When a resident index's vectors are kept in fp16 on the device: half the
/// bytes a distance reads (a search's time is mostly those reads: 80% of
/// its cycles at 768 dimensions on the H200).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfRows {
    /// always fp32
    Never,
    /// when every value converts exactly (SIFT's 0..255 integers do): the
    /// same distances
    WhenExact,
    /// whenever every value is finite and within fp16's range, rounded to
    /// the nearest: distances to about 1e-3, for searches whose caller
    /// recomputes the exact distances of what they find (the worker's:
    /// the backend re-reads every answered node from the pages)
    Rounded,
}

/// Default of [`ServerConfig::batch_min_blocks`] (kernels/search_persistent.cu
/// says why).
pub const DEFAULT_BATCH_MIN_BLOCKS: u32 = 16;

/// Default CTAs per slot (see [`SearchPolicy`]).
pub const DEFAULT_CTAS_PER_SLOT: usize = 4;

/// Default warps of a CTA (see [`ServerConfig::cta_warps`]).
pub const DEFAULT_CTA_WARPS: usize = 2;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            slots: 0,
            ctas_per_slot: 0,
            cta_warps: 0,
            max_dim: 2048,
            max_list: 256,
            max_k: 256,
            visited_log2: 0,
            groups: 0,
            max_indexes: 64,
            half_rows: HalfRows::WhenExact,
            max_sleep_ns: 20_000,
            allow_fault_injection: false,
            min_slots: 0,
            copy_requests: false,
            policy: SearchPolicy::default(),
            batch_min_blocks: DEFAULT_BATCH_MIN_BLOCKS,
            answer_area: None,
        }
    }
}

/// Turns (k, ef) into a [`QueryPlan`].
///
/// The paper fixes the CTAs per query and gives each the whole list; we
/// spread the beam instead: a query with beam ef = max(ef, k) uses
/// ceil(ef / list_per_cta) CTAs (at most the slot's), each with a list of
/// ceil(ef / ctas) entries. With one CTA, beam 1 and no seeds the search
/// is the CPU's beam search (same entry, same stop rule, same list
/// length); with several, the shared visited set keeps them apart and the
/// union of their lists stands for the beam.
///
/// Defaults (16 per CTA, beam 4, 4 CTAs per slot): on SIFT 100k
/// the CPU model ([`crate::search::sim`]) keeps recall at or above the CPU
/// search at every ef while cutting the sequential steps of a query (at ef
/// 64: 55 steps with one CTA of 64, 21 with 4 of 16) for ~25% more
/// distances; lists of 8 or less lose recall (ef 10 as 2x5: 0.65 against
/// 0.85). On the H200 the default beat lists of 32 and beam 2 on 1M SIFT
/// at 64 threads, and beam 1 by far (see the module documentation). Beam
/// extend from list position 2 instead of half the list: on 1M SIFT (H200,
/// one call) 7.5% less latency at one thread and 7-8% more queries/s at 16
/// at ef 40 and 64, the same at 64 threads, recall within 0.001 (the
/// model: 17.1 steps at ef 40 against 21.0, 2-5% more distances).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SearchPolicy {
    /// Target list length per CTA.
    pub list_per_cta: usize,
    /// Beam extend starts once the first unexpanded candidate sits at this
    /// position of the list or later; 0 = half the list.
    pub offset_beam: usize,
    /// Candidates expanded per sort in the diffusion phase.
    pub beam_width: usize,
    /// Start nodes of a query besides the entry point, where `scan` is 0:
    /// node j * n / seeds for j < seeds (at most [`abi::MAX_SEEDS`]), CTA t
    /// of T taking j = t, t + T, ... (0: the entry point alone, as the CPU's
    /// search starts).
    /// The same sample for every query, so its rows stay in L2; the
    /// nearest of them put a query nearer its answer than the entry alone.
    /// 64 against 8 random nodes a CTA (1M SIFT, H100, two alternating
    /// runs each): steps 13.9 -> 11.9 at ef 10, 15.5 -> 14.5 at ef 20;
    /// kernel p50 at one thread 67 -> 63 us and 74 -> 72 us (the start
    /// takes 5-7 us more); 64 threads 323k -> 353-378k queries/s at ef 10,
    /// 316-341k -> 348-374k at ef 20; recall@10 0.967 -> 0.969-0.970 at ef
    /// 10, 0.987 -> 0.986 at ef 20. 128 took as many steps fewer again
    /// and gave it back in the start (19 us at ef 10).
    pub seeds: usize,
    /// Nodes measured in place of the entry point, its list and the seeds
    /// (0: no scan, those instead): node j * n / scan for j < scan (at
    /// most [`abi::MAX_SCAN`]), CTA t of T taking j = t, t + T, ...; each
    /// CTA's list starts as the nearest of its share, which are then
    /// claimed in the visited set. A fixed sample, so its rows stay in L2.
    /// The start then reads no neighbour list and claims one list of nodes
    /// instead of ~97: 64 against the entry + 64 seeds (1M SIFT, H200,
    /// searchcheck, two runs): kernel p50 at one thread 61.2 / 61.3 ->
    /// 54.9 / 54.1 us at ef 10 (start 13 -> 7.7 us, 12.1 steps either
    /// way), 67.9 / 67.6 -> 64.8 / 64.5 at ef 20, 83 -> 79 at ef 40;
    /// recall@10 the same (0.9648 / 0.9691 against 0.9645 / 0.9685 at ef
    /// 10; 0.9967 against 0.9951 at ef 40); 64 threads the same. More
    /// rows cost more than the steps they save (a 32-row pass of one CTA
    /// takes ~2 us): 128 took 11.7 steps and a start of 11.9 us, 1,024
    /// 9.8 steps and 48.5 us.
    pub scan: usize,
    /// Iteration cap: a CTA stops after cap_factor * list + cap_extra
    /// expansions even if its list still holds unexpanded candidates.
    pub cap_factor: usize,
    pub cap_extra: usize,
}

impl Default for SearchPolicy {
    fn default() -> Self {
        SearchPolicy {
            list_per_cta: 16,
            offset_beam: 2,
            beam_width: 4,
            seeds: 64,
            scan: 64,
            cap_factor: 4,
            cap_extra: 64,
        }
    }
}

/// What one query does: filled in by [`SearchPolicy::plan`] or by hand
/// ([`crate::search::SearchServer::submit_plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryPlan {
    /// CTAs of the slot that search (1..=ctas_per_slot).
    pub ctas: u32,
    /// Candidate list length of each CTA.
    pub list: u32,
    /// Iteration cap: expansions per CTA.
    pub max_expand: u32,
    pub offset_beam: u32,
    pub beam_width: u32,
    /// Start nodes spread over the ids, all CTAs together (at most
    /// [`abi::MAX_SEEDS`]), beside the entry point; only when `scan` is 0.
    pub seeds: u32,
    /// Nodes measured at the start in place of the entry and the seeds,
    /// all CTAs (0: none; at most [`abi::MAX_SCAN`]).
    pub scan: u32,
}

impl SearchPolicy {
    pub fn plan(&self, k: usize, ef: usize, ctas_per_slot: usize) -> QueryPlan {
        let ef = ef.max(k).max(1);
        let per = self.list_per_cta.max(1);
        let ctas = ef.div_ceil(per).clamp(1, ctas_per_slot.clamp(1, 32));
        let list = ef.div_ceil(ctas);
        self.plan_with(ctas, list)
    }

    /// The plan for a fixed CTA count and list length.
    pub fn plan_with(&self, ctas: usize, list: usize) -> QueryPlan {
        let list = list.max(1);
        let offset = if self.offset_beam == 0 { list / 2 } else { self.offset_beam };
        QueryPlan {
            ctas: ctas.clamp(1, 32) as u32,
            list: list as u32,
            max_expand: (self.cap_factor * list + self.cap_extra).clamp(1, u32::MAX as usize) as u32,
            offset_beam: offset as u32,
            beam_width: self.beam_width.clamp(1, 32) as u32,
            seeds: self.seeds.min(abi::MAX_SEEDS as usize) as u32,
            scan: self.scan.min(abi::MAX_SCAN as usize) as u32,
        }
    }
}

/// Warps an SM that the persistent kernel leaves to the batch kernel: one
/// for each of an SM's four sub-partitions (a warp's registers come from
/// its sub-partition's quarter of the register file).
pub(crate) const BATCH_ROOM_PER_SM: usize = 4;

/// Bytes between two finish words: each on its own 64-byte line.
pub(crate) const FINISH_STRIDE_WORDS: usize = 16;

/// The server's sizes, fixed at start from [`ServerConfig`] and the device.
#[derive(Clone, Debug)]
pub(crate) struct Sizing {
    pub slots: usize,
    pub ctas: usize,
    /// warps of a CTA
    pub warps: usize,
    pub groups: usize,
    pub max_qwords: usize,
    pub list_cap: usize,
    pub k_max: usize,
    pub visited_log2: u32,
    pub max_indexes: usize,
    /// bytes of a slot's request: header and query
    pub req_stride: usize,
    /// bytes of one CTA's answer: header, k_max hits, k_max rows
    pub cta_block: usize,
    /// bytes of a slot's answers
    pub result_stride: usize,
    /// dynamic shared memory of one CTA
    pub smem: usize,
    /// the doorbell's dispatcher block (not `copy_requests`)
    pub doorbell: bool,
    /// log2 of the doorbell ring's entries
    pub ring_log2: u32,
}

impl Sizing {
    /// Everything that does not depend on the device.
    pub fn new(cfg: &ServerConfig) -> Result<Sizing, GpuError> {
        let ctas = if cfg.ctas_per_slot == 0 { DEFAULT_CTAS_PER_SLOT } else { cfg.ctas_per_slot };
        if !(1..=32).contains(&ctas) {
            return Err(GpuError::Unsupported(format!("{ctas} CTAs per slot (1 to 32)")));
        }
        let warps = if cfg.cta_warps == 0 { DEFAULT_CTA_WARPS } else { cfg.cta_warps };
        // (four warps, on an H200: searchcheck's batches beside the
        // persistent kernel did not end within its 100 s, where two warps'
        // whole check took 29 s; a hang or a crawl, not understood yet)
        if !(1..=2).contains(&warps) {
            return Err(GpuError::Unsupported(format!("{warps} warps a CTA (1 or 2)")));
        }
        let max_qwords = cfg.max_dim.max(1).next_multiple_of(8);
        let list_cap = cfg.max_list.max(1);
        let k_max = cfg.max_k.max(1).next_multiple_of(2);
        let cta_block = size_of::<ResultHead>() + (size_of::<ResultHit>() + size_of::<u64>()) * k_max;
        Ok(Sizing {
            slots: cfg.slots,
            ctas,
            warps,
            groups: 0,
            max_qwords,
            list_cap,
            k_max,
            visited_log2: if cfg.visited_log2 == 0 {
                ((list_cap * ctas * 16).next_power_of_two().trailing_zeros()).clamp(12, 17)
            } else {
                cfg.visited_log2.clamp(8, 24)
            },
            max_indexes: cfg.max_indexes.max(1),
            req_stride: (size_of::<RequestHead>() + 4 * max_qwords).next_multiple_of(128),
            cta_block,
            result_stride: (ctas * cta_block).next_multiple_of(128),
            smem: abi::search_smem_bytes(max_qwords as u32, list_cap as u32) as usize,
            doorbell: !cfg.copy_requests,
            ring_log2: 0,
        })
    }

    /// Slots and groups, once the kernel's occupancy is known: every CTA
    /// must be resident at once (a spinning CTA that is not would never let
    /// the others finish).
    pub fn fit(&mut self, cfg: &ServerConfig, blocks_per_sm: usize, sm_count: usize) -> Result<(), GpuError> {
        // the dispatcher's block is resident beside the slots' CTAs (by
        // default in the batch kernel's room, which it hardly dents)
        let resident = (blocks_per_sm * sm_count).saturating_sub(self.doorbell as usize);
        // by default one warp an SM sub-partition (4 an SM) is left to the
        // batch kernel, whose blocks could otherwise never start
        let slots = if cfg.slots == 0 {
            ((blocks_per_sm * sm_count).saturating_sub(self.batch_room() * sm_count) / self.ctas)
                .clamp(1, MAX_AUTO_SLOTS)
        } else {
            cfg.slots
        };
        if slots == 0 || slots * self.ctas > resident {
            return Err(GpuError::Unsupported(format!(
                "{slots} slots x {} CTAs do not fit resident at once: {blocks_per_sm} blocks per SM x {sm_count} SMs \
                 ({} bytes of shared memory each)",
                self.ctas, self.smem
            )));
        }
        self.slots = slots;
        // at most one entry a slot and the quit are ever posted and not
        // yet read, and the dispatcher reads 32 at a time
        self.ring_log2 = (2 * slots + 2).next_power_of_two().max(64).trailing_zeros();
        self.groups = if cfg.groups == 0 { slots.min(8) } else { cfg.groups.min(slots) }.max(1);
        Ok(())
    }

    /// Whether these sizes (fitted) have fewer slots than `cfg` wants while
    /// its CTAs' warps are the default of several: then one warp a CTA.
    pub fn fewer_than_wanted(&self, cfg: &ServerConfig) -> bool {
        cfg.cta_warps == 0 && self.warps > 1 && self.slots < cfg.min_slots
    }

    /// Blocks of the persistent kernel's grid.
    pub fn blocks(&self) -> usize {
        self.slots * self.ctas + self.doorbell as usize
    }

    /// Blocks of the persistent kernel an SM leaves to the batch kernel's
    /// warps.
    pub fn batch_room(&self) -> usize {
        BATCH_ROOM_PER_SM.div_ceil(self.warps)
    }

    pub fn visited_bytes(&self) -> usize {
        self.slots << self.visited_log2 << 3
    }
    /// Device bytes of the server itself (slot words, requests, visited
    /// tables, the index table).
    pub fn device_bytes(&self) -> usize {
        self.slots * (8 + self.req_stride) + self.visited_bytes() + self.max_indexes * size_of::<IndexDesc>()
    }
    /// Pinned host bytes.
    pub fn pinned_bytes(&self) -> usize {
        self.slots * (self.req_stride + self.result_stride + FINISH_STRIDE_WORDS * 4 + 4) + (8 << self.ring_log2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans() {
        let p = SearchPolicy::default();
        let q = p.plan(10, 10, 4);
        assert_eq!((q.ctas, q.list, q.seeds), (1, 10, 64));
        let q = p.plan(10, 20, 4);
        assert_eq!((q.ctas, q.list, q.seeds), (2, 10, 64));
        assert_eq!(SearchPolicy { seeds: 1000, ..p }.plan(10, 20, 4).seeds, abi::MAX_SEEDS);
        let q = p.plan(10, 64, 4);
        assert_eq!((q.ctas, q.list), (4, 16));
        let q = p.plan(10, 1000, 4);
        assert_eq!((q.ctas, q.list), (4, 250));
        let q = p.plan(100, 20, 4);
        assert_eq!((q.ctas, q.list), (4, 25));
        assert!(q.max_expand >= q.list);
    }

    #[test]
    fn sizes() {
        let mut z = Sizing::new(&ServerConfig::default()).unwrap();
        assert_eq!((z.ctas, z.max_qwords, z.k_max, z.req_stride), (4, 2048, 256, 8192 + 128));
        assert_eq!(z.smem, 4 * 2048 + 16 * 256 + 8 * 256 + 128);
        // two-warp CTAs: two blocks an SM left to the batch kernel's warps
        assert_eq!(z.warps, 2);
        z.fit(&ServerConfig::default(), 6, 132).unwrap();
        assert_eq!((z.slots, z.groups), ((6 - 2) * 132 / 4, 8));
        let mut one = Sizing::new(&ServerConfig { cta_warps: 1, ..ServerConfig::default() }).unwrap();
        one.fit(&ServerConfig::default(), 12, 132).unwrap();
        assert_eq!((one.slots, one.groups), (256, 8));
        assert!(Sizing::new(&ServerConfig { cta_warps: 3, ..ServerConfig::default() }).is_err());
        // a ring of 128 slots: two warps keep 132 on 132 SMs; on 58 SMs
        // (6 blocks an SM) they would leave 58, so one warp a CTA
        let want = ServerConfig { min_slots: 128, ..ServerConfig::default() };
        let mut big = Sizing::new(&want).unwrap();
        big.fit(&want, 6, 132).unwrap();
        assert!(!big.fewer_than_wanted(&want));
        let mut small = Sizing::new(&want).unwrap();
        small.fit(&want, 6, 58).unwrap();
        assert_eq!(small.slots, 58);
        assert!(small.fewer_than_wanted(&want));
        let fixed = ServerConfig { cta_warps: 2, ..want.clone() };
        assert!(!small.fewer_than_wanted(&fixed));
        assert!(z.fit(&ServerConfig { slots: 500, ..ServerConfig::default() }, 12, 132).is_err());
        // the doorbell's dispatcher takes one resident block: 6 x 132 / 4
        // slots fill every block without it
        let full = ServerConfig { slots: 198, ..ServerConfig::default() };
        assert!(z.fit(&full, 6, 132).is_err());
        assert_eq!((z.fit(&ServerConfig { slots: 197, ..full.clone() }, 6, 132), z.blocks()), (Ok(()), 197 * 4 + 1));
        let copy = ServerConfig { copy_requests: true, ..full };
        let mut c = Sizing::new(&copy).unwrap();
        c.fit(&copy, 6, 132).unwrap();
        assert_eq!(c.blocks(), 198 * 4);
        assert_eq!(z.ring_log2, 9);
        assert!(Sizing::new(&ServerConfig { ctas_per_slot: 33, ..ServerConfig::default() }).is_err());
    }
}
