//! The Rust side of `kernels/abi.h`: every layout and constant the host and
//! the kernels share, with the same names (constants without `GG_`).
//!
//! Two checks fail when one side changes alone: the unit test below parses
//! abi.h and compares each `#define` and each struct (fields, order,
//! offsets, size) with this file; [`static_asserts`] turns this file into
//! C++ `static_assert`s that the kernel compile check (CI) hands to NVRTC
//! together with abi.h, so the compiler itself confirms every offset.

use cudarc::driver::DeviceRepr;

/// Declares `#[repr(C)]` structs and records their fields' names and offsets
/// for the checks.
macro_rules! abi_structs {
    ($($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty,)* })*) => {
        $(
            $(#[$m])*
            #[repr(C)]
            #[derive(Clone, Copy, Debug, Default, PartialEq)]
            pub struct $name { $($(#[$fm])* pub $f: $t,)* }
        )*
        /// (struct, size, [(field, offset, type)]) of every shared struct.
        pub const STRUCTS: &[(&str, usize, &[(&str, usize, &str)])] = &[
            $((stringify!($name), std::mem::size_of::<$name>(),
               &[$((stringify!($f), std::mem::offset_of!($name, $f), stringify!($t)),)*]),)*
        ];
    };
}

/// Declares the shared constants and records their values for the checks.
macro_rules! abi_consts {
    ($($(#[$m:meta])* $name:ident: $t:ty = $v:expr;)*) => {
        $($(#[$m])* pub const $name: $t = $v;)*
        /// (name without GG_, value) of every shared constant.
        pub const CONSTS: &[(&str, u64)] = &[$((stringify!($name), $name as u64),)*];
    };
}

abi_consts! {
    /// Padding of a neighbour list, and "no node".
    NO_NODE: u32 = gpu_graph_engine::NO_NODE;
    /// Node flags (gpu_graph_engine::node).
    NODE_DELETED: u8 = gpu_graph_engine::node::DELETED;
    NODE_FREE: u8 = gpu_graph_engine::node::FREE;
    // GRNND pools
    POOL_EMPTY: u64 = u64::MAX;
    POOL_NEW_BIT: u32 = 0x8000_0000;
    POOL_ID_MASK: u32 = 0x7FFF_FFFF;
    MODE_ASCENDING: u32 = 1;
    STAT_INSERTED: u32 = 0;
    STAT_DISTANCES: u32 = 1;
    STAT_REDIRECTS: u32 = 2;
    STAT_COUNT: u32 = 4;
    GRNND_WARPS: u32 = 8;
    GRNND_SCRATCH_WORDS: u32 = 6;
    // the CFS filters
    FILTER_RNG: u32 = 0;
    FILTER_NSG: u32 = 1;
    FILTER_VAMANA: u32 = 2;
    FILTER_CAGRA: u32 = 3;
    FILTER_TSDG_ORDER: u32 = 4;
    FILTER_WARPS: u32 = 8;
    // exact k-NN tiles
    KNN_BM: u32 = 128;
    KNN_BN: u32 = 128;
    KNN_KC: u32 = 64;
    KNN_KPAD: u32 = 8;
    KNN_DPAD: u32 = 4;
    KNN_THREADS: u32 = 256;
    KNN_MAX_K: u32 = 32;
    KNN_SMEM_BYTES: u32 = 2 * 128 * (KNN_KC + KNN_KPAD) * 2 + KNN_BM * (KNN_BN + KNN_DPAD) * 4 + (KNN_BM + KNN_BN) * 4;
    // GNN-Descent's k-NN graph
    GNND_K: u32 = 32;
    GNND_CAND: u32 = 32;
    GNND_SAMPLE: u32 = 8;
    GNND_EXPAND: u32 = 2;
    GNND_WARPS: u32 = 4;
    GNND_NEW: u32 = 0x8000_0000;
    GNND_DONE: u32 = 0x4000_0000;
    GNND_ID_MASK: u32 = 0x3FFF_FFFF;
    GNND_JOIN_SMEM_BYTES: u32 = GNND_WARPS * 32 * (KNN_KC + KNN_KPAD) * 2;
    // the persistent search
    CMD_CTAS_BITS: u32 = 5;
    SEQ_LIMIT: u32 = (1 << 27) - 2;
    CMD_QUIT: u32 = 0xFFFF_FFFF;
    CMD_FAULT: u32 = 0xFFFF_FFFE;
    RING_TAG_SHIFT: u32 = 48;
    RING_SLOT_SHIFT: u32 = 24;
    RING_LEN_MASK: u32 = 0xFF_FFFF;
    RING_QUIT: u32 = 0xFF_FFFF;
    RING_PATCH: u32 = 0xFF_FFFE;
    OUT_BAD_INDEX: u32 = 0xFFFF_FFFF;
    MAX_BEAM_ROWS: u32 = 8;
    CAND_CAP: u32 = 256;
    MAX_SEEDS: u32 = 255;
    MAX_SCAN: u32 = 4096;
    DIST_UNROLL: u32 = 16;
    METRIC_L2: u32 = 0;
    METRIC_IP: u32 = 1;
}

/// abi.h's GG_SEARCH_SMEM_BYTES: dynamic shared memory of one search CTA.
pub const fn search_smem_bytes(max_qwords: u32, list_cap: u32) -> u32 {
    4 * max_qwords + 16 * list_cap + 8 * CAND_CAP + 4 * 32
}

abi_structs! {
    /// filter_rows' one parameter, passed by value.
    pub struct FilterParams {
        pub vectors: u64,
        pub starts: u64,
        pub ids: u64,
        pub dists: u64,
        pub work: u64,
        pub out: u64,
        pub rows: u32,
        pub degree: u32,
        pub dp: u32,
        pub lanes: u32,
        pub rule: u32,
        pub factor: f32,
        pub max_lambda: u32,
        pub pad0: u32,
    }

    /// A resident index, one entry of the index table in device memory.
    pub struct IndexDesc {
        pub vectors: u64,
        pub adjacency: u64,
        pub flags: u64,
        pub n: u32,
        pub degree: u32,
        pub entry: u32,
        pub chunks: u32,
        pub half: u32,
        pub metric: u32,
        pub lanes: u32,
        pub gen: u32,
        pub rows: u64,
    }

    /// One copy of a patch to a resident index (`apply_patch`): `len`
    /// bytes from byte `src` of the patch's inbox to device address `dst`.
    pub struct PatchCopy {
        pub dst: u64,
        pub src: u32,
        pub len: u32,
    }

    /// The head of a patch staged for the doorbell's dispatcher: `n`
    /// PatchCopy at byte `table` of the staging buffer; the dispatcher
    /// writes `seq` to the acknowledgement word once applied.
    pub struct PatchHead {
        pub seq: u32,
        pub n: u32,
        pub table: u32,
        pub pad: u32,
    }

    /// A query slot's request header; `qwords` floats of the query follow.
    pub struct RequestHead {
        pub cmd: u32,
        pub index: u32,
        pub gen: u32,
        pub k: u32,
        pub list: u32,
        pub ctas: u32,
        pub max_expand: u32,
        pub offset_beam: u32,
        pub beam: u32,
        pub seeds: u32,
        pub qwords: u32,
        pub scan: u32,
        pub seen: u32,
        pub copy_ns: u32,
        pub pad: [u32; 2],
    }

    /// A CTA's answer header; `k_max` [`ResultHit`]s follow.
    pub struct ResultHead {
        pub cmd: u32,
        pub count: u32,
        pub expanded: u32,
        pub computed: u32,
        pub picked: u64,
        pub start_ns: u32,
        pub search_ns: u32,
        pub steps: u32,
        pub cycles: u32,
        pub claim_cycles: u32,
        pub dist_cycles: u32,
        pub merge_cycles: u32,
        pub dispatch_ns: u32,
        pub copy_ns: u32,
        pub fence_ns: u32,
    }

    pub struct ResultHit {
        pub dist: f32,
        pub id: u32,
    }

    /// The persistent kernel's one parameter, passed by value.
    pub struct SearchParams {
        pub indexes: u64,
        pub cmd: u64,
        pub reqs: u64,
        pub visited: u64,
        pub done: u64,
        pub results: u64,
        pub finish: u64,
        pub n_indexes: u32,
        pub req_stride: u32,
        pub visited_log2: u32,
        pub result_stride: u32,
        pub k_max: u32,
        pub finish_stride: u32,
        pub ctas_per_slot: u32,
        pub list_cap: u32,
        pub max_qwords: u32,
        pub max_sleep_ns: u32,
        pub doorbell: u64,
        pub staging: u64,
        pub ring_log2: u32,
        pub cta_block: u32,
        pub patch_staging: u64,
        pub patch_ack: u64,
    }

    /// The large-batch kernel's one parameter, passed by value.
    pub struct BatchParams {
        pub indexes: u64,
        pub queries: u64,
        pub visited: u64,
        pub hits: u64,
        pub counts: u64,
        pub n_indexes: u32,
        pub index: u32,
        pub gen: u32,
        pub n: u32,
        pub qwords: u32,
        pub k: u32,
        pub list: u32,
        pub max_expand: u32,
        pub offset_beam: u32,
        pub beam: u32,
        pub visited_log2: u32,
        pub visit_base: u32,
        pub width: u32,
        pub pad0: u32,
    }
}

// SAFETY: plain old data of fixed-width fields, laid out as abi.h's struct
// (checked by the tests and the NVRTC static_asserts), so its bytes are the
// kernel's parameter.
unsafe impl DeviceRepr for SearchParams {}
// SAFETY: as for SearchParams.
unsafe impl DeviceRepr for BatchParams {}
// SAFETY: as for SearchParams.
unsafe impl DeviceRepr for FilterParams {}

/// The slot word of query `seq` searched by `ctas` CTAs.
pub fn cmd_word(seq: u32, ctas: u32) -> u32 {
    debug_assert!((1..=SEQ_LIMIT).contains(&seq) && (1..=32).contains(&ctas));
    (seq << CMD_CTAS_BITS) | (ctas - 1)
}

/// Every layout and constant of this file as C++ static_asserts over abi.h:
/// compiled by NVRTC, they fail when abi.h disagrees with this file. NVRTC
/// has no offsetof; a field's place is checked by bit-casting a struct in
/// which only that field is set to 0xA5 bytes and finding them at the Rust
/// offset, with zeros around.
pub fn static_asserts() -> String {
    let mut s = String::from("#include \"abi.h\"\n");
    for (name, size, fields) in STRUCTS {
        s += &format!("static_assert(sizeof({name}) == {size}, \"sizeof({name})\");\n");
        s += &format!("struct Bytes_{name} {{ unsigned char b[sizeof({name})]; }};\n");
        for (f, off, ty) in *fields {
            let (elem, width, marker) = match ty.trim() {
                "u64" => ("", 8, "0xA5A5A5A5A5A5A5A5ull".to_string()),
                "u32" => ("", 4, "0xA5A5A5A5u".to_string()),
                "f32" => ("", 4, "__builtin_bit_cast(float, 0xA5A5A5A5u)".to_string()),
                t if t.starts_with("[u32") => ("[0]", 4, "0xA5A5A5A5u".to_string()),
                t => panic!("abi: no C type for {t}"),
            };
            let probe = format!("probe_{name}_{f}");
            s += &format!(
                "__device__ constexpr Bytes_{name} {probe}() {{ {name} x{{}}; x.{f}{elem} = {marker}; \
                 return __builtin_bit_cast(Bytes_{name}, x); }}\n"
            );
            for i in 0..width {
                s += &format!("static_assert({probe}().b[{}] == 0xA5, \"{name}.{f} at {off}\");\n", off + i);
            }
            if *off > 0 {
                s += &format!("static_assert({probe}().b[{}] == 0, \"{name}.{f} at {off}\");\n", off - 1);
            }
            if off + width < *size {
                s += &format!("static_assert({probe}().b[{}] == 0, \"{name}.{f} width\");\n", off + width);
            }
        }
    }
    for (name, v) in CONSTS {
        s += &format!("static_assert((unsigned long long)(GG_{name}) == {v}ull, \"GG_{name}\");\n");
    }
    for (mq, lc) in [(8u32, 16u32), (2048, 256)] {
        let v = search_smem_bytes(mq, lc);
        s += &format!("static_assert(GG_SEARCH_SMEM_BYTES({mq}u, {lc}u) == {v}u, \"GG_SEARCH_SMEM_BYTES\");\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const ABI_H: &str = include_str!("../../../kernels/abi.h");

    /// abi.h's `#define GG_NAME value` lines whose value is one integer literal.
    fn literal_defines() -> Vec<(String, Option<u64>)> {
        ABI_H
            .lines()
            .filter_map(|l| l.trim().strip_prefix("#define GG_"))
            .map(|rest| {
                let mut it = rest.split_whitespace();
                let name = it.next().unwrap_or_default().split('(').next().unwrap().to_string();
                let value = it.next().and_then(|v| {
                    let v = v.trim_end_matches(['u', 'l', 'L', 'U']);
                    match v.strip_prefix("0x") {
                        Some(hex) => u64::from_str_radix(hex, 16).ok(),
                        None => v.parse().ok(),
                    }
                });
                (name, value)
            })
            .collect()
    }

    /// A struct of abi.h: name, size, and (field, C offset) in order.
    type Parsed = (String, usize, Vec<(String, usize)>);

    /// abi.h's structs; fields are u64, u32 or float, scalars or arrays.
    fn parsed_structs() -> Vec<Parsed> {
        let mut out = Vec::new();
        let mut rest = ABI_H;
        while let Some(i) = rest.find("\nstruct ") {
            let body_start = rest[i..].find('{').unwrap() + i;
            let body_end = rest[body_start..].find("};").unwrap() + body_start;
            let name = rest[i + 8..body_start].trim().to_string();
            let (mut off, mut align, mut fields) = (0usize, 1usize, Vec::new());
            for line in rest[body_start + 1..body_end].lines() {
                let decl = line.split("//").next().unwrap().trim();
                let Some(decl) = decl.strip_suffix(';') else { continue };
                let (ty, names) = decl.split_once(' ').unwrap();
                let size = match ty {
                    "u64" => 8,
                    "u32" | "float" => 4,
                    other => panic!("abi.h: field type {other} not understood by this test"),
                };
                align = align.max(size);
                for n in names.split(',').map(str::trim) {
                    let (n, count) = match n.split_once('[') {
                        Some((n, c)) => (n, c.trim_end_matches(']').parse::<usize>().unwrap()),
                        None => (n, 1),
                    };
                    off = off.next_multiple_of(size);
                    fields.push((n.to_string(), off));
                    off += size * count;
                }
            }
            out.push((name, off.next_multiple_of(align), fields));
            rest = &rest[body_end..];
        }
        out
    }

    #[test]
    fn defines_match() {
        let defines = literal_defines();
        for (name, value) in CONSTS {
            let d = defines.iter().find(|d| d.0 == *name);
            assert!(d.is_some(), "abi.h has no GG_{name}");
            if let Some(v) = d.unwrap().1 {
                assert_eq!(v, *value, "GG_{name}");
            }
        }
        for (name, _) in &defines {
            let known = CONSTS.iter().any(|c| c.0 == name) || name == "SEARCH_SMEM_BYTES";
            assert!(known, "GG_{name} of abi.h has no counterpart in abi.rs");
        }
        // the expressions of abi.h: their values are checked by NVRTC; here
        // at least that they are not literals that drifted
        assert!(defines.iter().any(|d| d.0 == "KNN_SMEM_BYTES" && d.1.is_none()));
    }

    #[test]
    fn structs_match() {
        let parsed = parsed_structs();
        assert_eq!(parsed.len(), STRUCTS.len(), "struct count");
        for (name, size, fields) in STRUCTS {
            let p = parsed.iter().find(|p| p.0 == *name).unwrap_or_else(|| panic!("abi.h has no struct {name}"));
            let ours: Vec<(String, usize)> = fields.iter().map(|(f, o, _)| (f.to_string(), *o)).collect();
            assert_eq!(p.2, ours, "fields of {name}");
            assert_eq!(p.1, *size, "size of {name}");
        }
    }

    #[test]
    fn static_asserts_cover_everything() {
        let s = static_asserts();
        assert!(s.contains("probe_SearchParams_max_sleep_ns().b[92] == 0xA5"));
        assert!(s.contains("probe_ResultHit_dist().b[4] == 0,"));
        assert!(s.contains("GG_CMD_QUIT) == 4294967295ull"));
        assert_eq!(std::mem::size_of::<IndexDesc>(), 64);
        assert_eq!(std::mem::size_of::<RequestHead>(), 64);
        assert_eq!(cmd_word(3, 4), (3 << 5) | 3);
    }
}
