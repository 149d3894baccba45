//! Server configuration, the per-query plan (how a query's beam is spread
//! over its slot's CTAs) and the memory layouts shared with
//! kernels/search_persistent.cu.

/// How a SearchServer is sized. Every `0` means "choose from the device".
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Query slots: the most queries in flight at once. 0 = as many as the
    /// resident-block limit allows with `ctas_per_slot`, at most 256.
    pub slots: usize,
    /// Single-warp CTAs per slot (at most 32). 0 = [`DEFAULT_CTAS_PER_SLOT`].
    pub ctas_per_slot: usize,
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
    /// Keep an fp16 copy of an index's vectors instead of fp32 when every
    /// value converts exactly (SIFT's 0..255 integers do): half the bytes per
    /// distance, the same distances.
    pub half_when_exact: bool,
    /// Deepest back-off of an idle CTA between two polls of its slot word.
    pub max_sleep_ns: u32,
    /// Enables [`crate::search::SearchServer::inject_fault`] (tests only).
    pub allow_fault_injection: bool,
    /// How a query's `ef` becomes a plan.
    pub policy: SearchPolicy,
}

/// Default CTAs per slot (see [`SearchPolicy`]).
pub const DEFAULT_CTAS_PER_SLOT: usize = 4;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            slots: 0,
            ctas_per_slot: 0,
            max_dim: 2048,
            max_list: 256,
            max_k: 256,
            visited_log2: 0,
            groups: 0,
            max_indexes: 64,
            half_when_exact: true,
            max_sleep_ns: 20_000,
            allow_fault_injection: false,
            policy: SearchPolicy::default(),
        }
    }
}

/// Turns (k, ef) into a [`QueryPlan`].
///
/// The paper fixes the CTAs per query and gives each the whole list; we
/// spread the beam instead: a query with beam ef = max(ef, k) uses
/// ceil(ef / list_per_cta) CTAs (at most the slot's), each with a list of
/// ceil(ef / ctas) entries. With one CTA the search is the CPU's beam
/// search (same entry, same stop rule, same list length); with several,
/// the shared visited set keeps them apart and the union of their lists
/// stands for the beam.
///
/// Defaults (16 per CTA, beam 4, 8 seeds, 4 CTAs per slot): on SIFT 100k
/// the CPU model ([`crate::search::sim`]) keeps recall at or above the CPU
/// search at every ef while cutting the sequential steps of a query (at ef
/// 64: 55 steps with one CTA of 64, 21 with 4 of 16) for ~25% more
/// distances; lists of 8 or less lose recall (ef 10 as 2x5: 0.65 against
/// 0.85). On the H200 the default beat lists of 32 and beam 2 on 1M SIFT
/// at 64 threads, and beam 1 by far (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SearchPolicy {
    /// Target list length per CTA.
    pub list_per_cta: usize,
    /// Beam extend starts once the first unexpanded candidate sits at this
    /// position of the list or later; 0 = half the list.
    pub offset_beam: usize,
    /// Candidates expanded per sort in the diffusion phase.
    pub beam_width: usize,
    /// Pseudo-random start nodes per CTA when a query uses more than one
    /// CTA (with one CTA the search starts at the entry point only, as the
    /// CPU's does).
    pub seeds: usize,
    /// Iteration cap: a CTA stops after cap_factor * list + cap_extra
    /// expansions even if its list still holds unexpanded candidates.
    pub cap_factor: usize,
    pub cap_extra: usize,
}

impl Default for SearchPolicy {
    fn default() -> Self {
        SearchPolicy { list_per_cta: 16, offset_beam: 0, beam_width: 4, seeds: 8, cap_factor: 4, cap_extra: 64 }
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
    /// Random start nodes per CTA (at most 31).
    pub seeds: u32,
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
            seeds: if ctas > 1 { self.seeds.min(31) as u32 } else { 0 },
        }
    }
}

// ------------------------------------------------------------------ layouts
// (kernels/search_persistent.cu)

/// Bytes of a request header; the query's floats follow.
pub(crate) const REQ_HEAD_BYTES: usize = 64;
/// Bytes of a CTA's result header; k_max (dist, id) pairs follow.
pub(crate) const OUT_HEAD_BYTES: usize = 16;
/// Candidate buffer of a CTA: beam * degree at most this.
pub(crate) const CAND_CAP: usize = 256;
/// IndexDesc size.
pub(crate) const DESC_BYTES: usize = 64;
/// Work words: seq << 5 | (ctas - 1); seq stays below this.
pub(crate) const SEQ_LIMIT: u32 = (1 << 27) - 2;
pub(crate) const CMD_QUIT: u32 = 0xFFFF_FFFF;
pub(crate) const CMD_FAULT: u32 = 0xFFFF_FFFE;
/// Result header word 2 when the kernel found no loaded index for a request.
pub(crate) const OUT_BAD_INDEX: u32 = 0xFFFF_FFFF;
/// Bit 0 of a node's flags.
pub const FLAG_DELETED: u8 = 1;

/// Dynamic shared memory of one CTA (the kernel's carve-up).
pub(crate) fn shared_bytes(max_qwords: usize, list_cap: usize) -> usize {
    4 * max_qwords + 16 * list_cap + 8 * CAND_CAP + 8 * 32 + 4 * 32
}

pub(crate) fn cmd_word(seq: u32, ctas: u32) -> u32 {
    debug_assert!((1..=SEQ_LIMIT).contains(&seq) && (1..=32).contains(&ctas));
    (seq << 5) | (ctas - 1)
}

/// Row format of an index on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowFormat {
    pub half: bool,
    /// 16-byte chunks per row
    pub chunks: usize,
    /// floats of the query the kernel reads (chunks * 4 or * 8)
    pub qwords: usize,
    /// lanes per distance
    pub lanes: u32,
}

impl RowFormat {
    pub fn new(dim: usize, half: bool) -> RowFormat {
        let per = if half { 8 } else { 4 };
        let chunks = dim.div_ceil(per);
        // each lane issues up to 16 loads per vector (DIST_UNROLL): G = the
        // smallest power of two with chunks <= 16 G
        let lanes = chunks.div_ceil(16).next_power_of_two().clamp(1, 32) as u32;
        RowFormat { half, chunks, qwords: chunks * per, lanes }
    }
    pub fn row_bytes(&self) -> usize {
        self.chunks * 16
    }
}

/// f32 -> IEEE half, only when the value converts exactly.
pub(crate) fn f16_exact(x: f32) -> Option<u16> {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0 {
        // zero (f32 subnormals are far below half's range)
        return if man == 0 { Some(sign) } else { None };
    }
    if exp == 0xff {
        return None;
    }
    let e = exp - 127;
    if e > 15 {
        return None;
    }
    if e >= -14 {
        if man & 0x1fff != 0 {
            return None;
        }
        return Some(sign | (((e + 15) as u16) << 10) | ((man >> 13) as u16));
    }
    if e < -24 {
        return None;
    }
    // half subnormal: value = m * 2^-24 with m = full * 2^(e + 1)
    let full = man | 0x80_0000;
    let s = (-(e + 1)) as u32;
    if full & ((1u32 << s) - 1) != 0 {
        return None;
    }
    Some(sign | (full >> s) as u16)
}

#[cfg(test)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let e = ((h >> 10) & 0x1f) as i32;
    let m = (h & 0x3ff) as f32;
    sign * match e {
        0 => m * 2f32.powi(-24),
        31 => f32::INFINITY,
        _ => (1.0 + m / 1024.0) * 2f32.powi(e - 15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_exact_roundtrips() {
        for v in
            [0.0f32, -0.0, 1.0, -1.0, 255.0, 0.5, 65504.0, -2.0f32.powi(-14), 2.0f32.powi(-24), 3.0 * 2.0f32.powi(-20)]
        {
            let h = f16_exact(v).unwrap_or_else(|| panic!("{v} should convert"));
            assert_eq!(f16_to_f32(h).to_bits(), v.to_bits(), "{v}");
        }
        for i in 0..=255 {
            let h = f16_exact(i as f32).unwrap();
            assert_eq!(f16_to_f32(h), i as f32);
        }
        for v in [0.1f32, 65505.0, 1e6, 2.0f32.powi(-25), 1.0 + 2.0f32.powi(-11), f32::NAN, f32::INFINITY] {
            assert!(f16_exact(v).is_none(), "{v} is not exact in half");
        }
    }

    #[test]
    fn plans() {
        let p = SearchPolicy::default();
        let q = p.plan(10, 10, 4);
        assert_eq!((q.ctas, q.list, q.seeds), (1, 10, 0));
        let q = p.plan(10, 20, 4);
        assert_eq!((q.ctas, q.list, q.seeds), (2, 10, 8));
        let q = p.plan(10, 64, 4);
        assert_eq!((q.ctas, q.list), (4, 16));
        let q = p.plan(10, 1000, 4);
        assert_eq!((q.ctas, q.list), (4, 250));
        let q = p.plan(100, 20, 4);
        assert_eq!((q.ctas, q.list), (4, 25));
        assert!(q.max_expand >= q.list);
    }

    #[test]
    fn row_formats() {
        let r = RowFormat::new(128, true);
        assert_eq!((r.chunks, r.qwords, r.lanes), (16, 128, 1));
        let r = RowFormat::new(128, false);
        assert_eq!((r.chunks, r.qwords, r.lanes), (32, 128, 2));
        let r = RowFormat::new(129, false);
        assert_eq!((r.chunks, r.qwords, r.lanes), (33, 132, 4));
        let r = RowFormat::new(3, false);
        assert_eq!((r.chunks, r.qwords, r.lanes), (1, 4, 1));
        let r = RowFormat::new(2000, false);
        assert_eq!((r.chunks, r.lanes), (500, 32));
        let r = RowFormat::new(768, false);
        assert_eq!((r.chunks, r.lanes), (192, 16));
    }
}
