// The persistent GPU search kernel (after "ALGAS: A Low-latency GPU-Based
// Approximate Nearest Neighbor Search System"): one launch serves every query
// of the search worker until it is told to quit.
//
// Compiled at run time by NVRTC (crates/gpu/src/search/launch.rs) with
// abi.h and common.cuh handed over from memory; every layout it shares with
// the host (IndexDesc, RequestHead, ResultHead, SearchParams, the slot words)
// is in abi.h, mirrored by crates/gpu/src/abi.rs.
//
// Grid: slots x ctas_per_slot blocks of GG_WARPS warps each (the host's
// ServerConfig::cta_warps). Block b serves query slot b / ctas_per_slot as
// its CTA number t = b % ctas_per_slot; its warp 0 does the whole search,
// the others only help with the distance loops of several passes (see
// team_helper); with the doorbell one block more, the last, dispatches the
// requests (dispatch). The host chose the grid from the occupancy API so that
// every block is resident at once: a spinning block that is not resident
// would never let the others finish (deadlock).
//
// Slot protocol (ALGAS section IV-A / V-A, no GDRCopy):
//   cmd[slot]     device memory, written by the dispatcher (the doorbell,
//                 the default: see dispatch) right after its copy of the
//                 request (header + query) into reqs[slot], or by the host
//                 with cuStreamWriteValue32 on a side stream right after
//                 the async copy of the request on the same stream; either
//                 way the request is in device memory before the word
//                 changes. Values: "Work" =
//                 seq << 5 | (ctas - 1), seq = 1, 2, ... per slot (27 bits;
//                 the host clears the slot's visited table and starts again
//                 at 1 before it would wrap), GG_CMD_QUIT, GG_CMD_FAULT (test
//                 switch); 0 = never used ("None"). The CTA count rides in
//                 the word so that a CTA that sits a query out never reads
//                 the request buffer (which the host may already be
//                 refilling for the next query once this one finished).
//                 Only the kernel polls it (device-local).
//   finish[slot]  mapped pinned host memory, written only by the kernel:
//                 the sequence number of the last finished query
//                 ("Finish"); only the host polls it (host-local). The
//                 host's reading of it and freeing the slot is "Done".
//   The GPU writes a slot's host-side word only after it received that
//   slot's query, the host writes cmd only when the slot is free, so the
//   two never race and no coherence protocol is needed. Sequence numbers
//   instead of state values mean no word is ever reset: a CTA serves a
//   query when cmd differs from the last value it saw.
//
// Per query, each active CTA (t < ctas of the request):
//   * keeps its own candidate list of `list` entries (dist, id) in shared
//     memory, sorted ascending; bit 31 of an id marks it expanded;
//   * shares one visited set with the other CTAs of its slot (see
//     visit_claim): each node's distance is computed by exactly one CTA;
//   * starts (the request's `scan` > 0, the default) from the nearest of
//     its share of `scan` nodes spread evenly over the node ids (j % T ==
//     t), measured with no claims and merged into its list, which it then
//     claims in the visited set; or (scan 0)
//     starts, in one round, with the entry point (whoever claims it),
//     its share of the query's `seeds` start nodes spread evenly over the
//     node ids, and its share of the entry point's list: CTA t of T takes
//     the seeds and the entry's neighbours j with j % T == t, so the CTAs
//     leave the entry in different directions (first-come claims would
//     hand them all to whichever CTA woke first);
//   * then repeats: take the first unexpanded candidates of its list -- one
//     while the first unexpanded one sits before position `offset_beam`,
//     `beam_width` after (beam extend: the localisation phase is greedy,
//     the diffusion phase expands several per sort) -- load their
//     neighbour lists, claim the unvisited neighbours, compute their
//     distances, drop those not nearer than the list's last entry and
//     merge the rest into the list (merge_unsorted); a step whose
//     neighbours fit one pass of the distance loop reads their rows
//     beside the claims and looks at the claims after (step_spec);
//   * stops when every entry of its list is expanded, or after
//     `max_expand` expansions (the iteration cap: the paper has none; it
//     bounds a query's time whatever the graph);
//   * writes its first k live (not deleted) entries and a header to the
//     slot's result block in mapped pinned host memory and arrives on the
//     slot's device counter (an atomic of system scope, acquire and
//     release); the last CTA to arrive resets the counter and writes
//     finish[slot] with a release store, which orders every CTA's answer
//     before it (a query of one CTA writes it at once).
//   The host merges the per-CTA lists with a heap and drops duplicates
//   (ALGAS IV-B: no GPU merge kernel).
//
// Index data (vectors, adjacency, flags, descriptors) and requests are read
// with ld.global.cg (L2 only): this kernel never ends, so L1 is never
// invalidated by a launch, and an unload followed by a load can put new data
// at the address of old data.

#include "common.cuh"

#define ID_MASK 0x7FFFFFFFu
// bit 31 of an id in a CTA's list: expanded
#define EXP_BIT 0x80000000u
#define NO_NODE GG_NO_NODE
#define CAND_CAP GG_CAND_CAP
#define MAX_R GG_MAX_BEAM_ROWS
// Linear probes of the visited table before a node is taken as unvisited.
#define VISIT_PROBES 32

// ---------------------------------------------------------------- memory ops

__device__ __forceinline__ u32 ld_acquire_u32(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u32 ld_cg_u32(const void* p) {
    u32 v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ u32 ld_cg_u8(const void* p) {
    unsigned short v;
    asm volatile("ld.global.cg.u8 %0, [%1];" : "=h"(v) : "l"(p));
    return (u32)v;
}
__device__ __forceinline__ u64 ld_cg_u64(const void* p) {
    u64 v;
    asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ void ld_cg_v4(const void* p, u32& a, u32& b, u32& c, u32& d) {
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p));
}
__device__ __forceinline__ u64 ld_relaxed_u64(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
// mapped host memory (the doorbell ring, the staged requests): every read
// goes over PCIe, none is served by a cache from an earlier lap
__device__ __forceinline__ u64 ld_acquire_sys_u64(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void ld_volatile_v4(const void* p, u32& a, u32& b, u32& c, u32& d) {
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                 : "l"(p)
                 : "memory");
}
__device__ __forceinline__ void st_release_gpu(u32* p, u32 v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ u32 atom_add_sys(u32* p, u32 v) {
    u32 old;
    asm volatile("atom.acq_rel.sys.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
__device__ __forceinline__ void st_release_sys(u32* p, u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_v2(void* p, u32 a, u32 b) {
    asm volatile("st.global.v2.u32 [%0], {%1,%2};" : : "l"(p), "r"(a), "r"(b) : "memory");
}
__device__ __forceinline__ void st_v4(void* p, u32 a, u32 b, u32 c, u32 d) {
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" : : "l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
__device__ __forceinline__ void fence_sys() { asm volatile("fence.sc.sys;" : : : "memory"); }
__device__ __forceinline__ void nanosleep_ns(u32 ns) { asm volatile("nanosleep.u32 %0;" : : "r"(ns)); }
// The GPU's nanosecond clock (one for all SMs): the latency breakdown.
__device__ __forceinline__ u64 globaltimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ u32 hash32(u32 x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

// ------------------------------------------------------------ visited set
//
// One open-addressing table per slot of 2^visited_log2 64-bit entries
// (generation << 32 | node), linear probing. The generation is the query's
// sequence number: an entry of an older generation counts as empty, so the
// table is never cleared between queries (no barrier among the CTAs, no
// race: the paper's per-query bitmap clear races with the other CTAs'
// first marks). Its size depends on the work of one query, not on the
// index, so one table serves every resident index. Generations only grow
// (the host clears a table before its sequence numbers wrap), so a claim
// of a node's home slot is one 64-bit atomicMax (claim_batch); past it,
// a load and a compare-and-swap a slot. When VISIT_PROBES slots in a
// row hold other nodes of this query the node is taken as unvisited (its
// distance may then be computed twice; the host drops duplicates).
// Returns true when this call claimed the node.
__device__ __forceinline__ bool visit_claim(u64* table, u32 mask, u32 gen, u32 id, u32 h, u64 cur) {
    const u64 key = ((u64)gen << 32) | (u64)id;
    for (u32 p = 0; p < VISIT_PROBES;) {
        if ((u32)(cur >> 32) == gen) {
            if ((u32)cur == id) return false;
            ++p;
            h = (h + 1) & mask;
            cur = ld_relaxed_u64(table + h);
            continue;
        }
        u64 old = atomicCAS((unsigned long long*)(table + h), (unsigned long long)cur, (unsigned long long)key);
        if (old == cur) return true;
        cur = old;  // another CTA of this query took the slot: look again
    }
    return true;
}

// ------------------------------------------------------------ distances
//
// m candidate ids ci[0..m) (bit 31 ignored) -> cd[0..m). G lanes per vector
// (a power of two, chosen by the host so that chunks <= GG_DIST_UNROLL * G),
// 32 / G vectors per pass; each lane issues all its (up to DIST_UNROLL)
// independent 16-byte loads of a vector before it uses any, and sums into
// four accumulators (a dependent chain a quarter as long). fp32 rows, and
// fp16 rows where the tensor cores' loop below is compiled out (before
// sm_80, -DGG_NO_MMA); fp32 SIFT (32 chunks) has G = 2. (Tried on the
// H200: G lanes a vector each loading one chunk, coalesced whole rows per
// load, made a query 10% slower; see docs/benchmarks.md.)
#define DIST_UNROLL GG_DIST_UNROLL
template <bool HALF, bool IP>
__device__ __forceinline__ void distances_t(const unsigned char* vec, u32 chunks, u32 G, const float* q, const u32* ci,
                                            float* cd, u32 m, u32 lane, u32 warp, u32 warps) {
    const u32 sub = lane & (G - 1);
    const u32 per = 32 / G;
    const u32 which = lane / G;
    // pass p (vectors p * per ..) is warp p % warps's
    for (u32 b = warp * per; b < m; b += per * warps) {
        const u32 i = b + which;
        const bool act = i < m;
        float ac[4] = {0.f, 0.f, 0.f, 0.f};
        if (act) {
            const unsigned char* row = vec + (u64)(ci[i] & ID_MASK) * chunks * 16u;
            for (u32 c0 = 0; c0 < chunks; c0 += DIST_UNROLL * G) {
                u32 w[DIST_UNROLL][4];
#pragma unroll
                for (u32 u = 0; u < DIST_UNROLL; u++) {
                    const u32 c = c0 + sub + u * G;
                    if (c < chunks) {
                        ld_cg_v4(row + (u64)c * 16u, w[u][0], w[u][1], w[u][2], w[u][3]);
                    } else {
                        w[u][0] = w[u][1] = w[u][2] = w[u][3] = 0u;
                    }
                }
#pragma unroll
                for (u32 u = 0; u < DIST_UNROLL; u++) {
                    const u32 c = c0 + sub + u * G;
                    if (c < chunks) {
                        if (HALF) {
                            const float* qq = q + c * 8u;
#pragma unroll
                            for (u32 e = 0; e < 4; e++) {
                                const float x0 = h2f(w[u][e] & 0xFFFFu), x1 = h2f(w[u][e] >> 16);
                                if (IP) {
                                    ac[e] = fmaf(x0, qq[2 * e], ac[e]);
                                    ac[e] = fmaf(x1, qq[2 * e + 1], ac[e]);
                                } else {
                                    const float d0 = x0 - qq[2 * e], d1 = x1 - qq[2 * e + 1];
                                    ac[e] = fmaf(d0, d0, ac[e]);
                                    ac[e] = fmaf(d1, d1, ac[e]);
                                }
                            }
                        } else {
                            const float* qq = q + c * 4u;
#pragma unroll
                            for (u32 e = 0; e < 4; e++) {
                                const float x = __uint_as_float(w[u][e]);
                                if (IP) {
                                    ac[e] = fmaf(x, qq[e], ac[e]);
                                } else {
                                    const float d = x - qq[e];
                                    ac[e] = fmaf(d, d, ac[e]);
                                }
                            }
                        }
                    }
                }
            }
        }
        float acc = (ac[0] + ac[1]) + (ac[2] + ac[3]);
        for (u32 o = G >> 1; o > 0; o >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, o);
        if (act && sub == 0) cd[i] = IP ? -acc : acc;
    }
    __syncwarp();
}

// fp16 rows on the tensor cores (sm_80+; -DGG_NO_MMA for the A/B): a
// pass of 32 rows as two tiles of 16, lane (g = lane / 4, t = lane % 4)
// reading chunks t, t + 4, ... of rows g and g + 8 of each tile (a load
// instruction then touches 8 rows' lines, not 32). L2: the lane's halved
// differences x / 2 - q / 2 (f16x2, one instruction per two dimensions;
// the query rounded to f16, as the rows are, once a query: half_query)
// are at once its share of the A fragment of mma.m16n8k16 and of the B
// fragment of its own row, so D * D^T's diagonal, accumulated in f32 and
// times 4, is each row's squared distance:
// no conversion of the row to f32 (the scalar loop spent three
// instructions a dimension, one of them the conversion: 1M SIFT on an
// H200, a query's kernel 54.9 -> 48.4 / 48.7 us at ef 10; 768 dimensions
// wait on their rows' loads and did not change). Inner product: B is the
// query. A chunk of 8 dimensions makes two k-steps. The distances are
// fp16's, the query's rounding included (~1e-3 relative where the query
// is not exactly fp16): the list's order, and an answer's distance. The
// halving keeps every difference of two fp16 values in range (a plain
// x - q beyond 65504 was infinite, and so was its row's distance).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define GG_NO_MMA
#endif
#ifndef GG_NO_MMA
#define MMA_BATCH 4u  // chunks of each of a lane's four rows in flight at once
#define HALF2_HALF 0x38003800u  // (0.5, 0.5) in f16x2
#ifdef GG_Q_EACH_PASS
#define L2_SCALE 1.f
#else
#define L2_SCALE 4.f  // the squares of halved differences
#endif

__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
    u32 d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    u32 d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
__device__ __forceinline__ void mma16816(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// The query as the tensor cores read it, in place of its f32 values, once
// a query: chunk c's 8 dimensions as 4 f16x2 words at word 4c; L2: -q / 2
// (distances_mma takes x / 2 - q / 2, whose range holds any difference of
// two fp16 values), inner product: q. Chunks 32r.. write the bytes that
// chunks 16r.. read, in an earlier round (or this one, before its stores).
// (-DGG_Q_EACH_PASS: the query converted in every pass, the A/B.)
__device__ __forceinline__ void half_query(float* q, u32 chunks, u32 metric, u32 lane) {
#ifndef GG_Q_EACH_PASS
    const float s = metric == GG_METRIC_IP ? 1.f : -0.5f;
    for (u32 c0 = 0; c0 < chunks; c0 += 32) {
        const u32 c = c0 + lane;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
        if (c < chunks) {
            a = *(const float4*)(q + c * 8u);
            b = *(const float4*)(q + c * 8u + 4u);
        }
        __syncwarp();
        if (c < chunks) {
            uint4 h;
            h.x = pack_h2(s * a.x, s * a.y);
            h.y = pack_h2(s * a.z, s * a.w);
            h.z = pack_h2(s * b.x, s * b.y);
            h.w = pack_h2(s * b.z, s * b.w);
            *(uint4*)((u32*)q + c * 4u) = h;
        }
        __syncwarp();
    }
#endif
}
template <bool IP>
__device__ __forceinline__ void distances_mma(const unsigned char* vec, u32 chunks, const float* q, const u32* ci,
                                              float* cd, u32 m, u32 lane, u32 warp, u32 warps) {
    const u32 g = lane >> 2, t = lane & 3;
    const u32 row_bytes = chunks * 16u;
    const u32 per_lane = (chunks + 3) / 4;
    // pass p (rows 32 p ..) is warp p % warps's; rows g, g + 8 (tile 0)
    // and g + 16, g + 24 (tile 1) are this lane's
    for (u32 b = warp * 32; b < m; b += 32 * warps) {
        const unsigned char* rows[4];
#pragma unroll
        for (u32 r = 0; r < 4; r++) {
            const u32 i = b + g + 8 * r;
            rows[r] = i < m ? vec + (u64)(ci[i] & ID_MASK) * row_bytes : nullptr;
        }
        float acc[4][4];  // [tile * 2 + n-tile][c0..c3]
#pragma unroll
        for (u32 x = 0; x < 4; x++) acc[x][0] = acc[x][1] = acc[x][2] = acc[x][3] = 0.f;
        for (u32 j0 = 0; j0 < per_lane; j0 += MMA_BATCH) {
            u32 w[MMA_BATCH][4][4];
#pragma unroll
            for (u32 u = 0; u < MMA_BATCH; u++) {
                const u32 c = (j0 + u) * 4 + t;
#pragma unroll
                for (u32 r = 0; r < 4; r++) {
                    if (rows[r] != nullptr && c < chunks) {
                        ld_cg_v4(rows[r] + (u64)c * 16u, w[u][r][0], w[u][r][1], w[u][r][2], w[u][r][3]);
                    } else {
                        w[u][r][0] = w[u][r][1] = w[u][r][2] = w[u][r][3] = 0u;
                    }
                }
            }
#pragma unroll
            for (u32 u = 0; u < MMA_BATCH; u++) {
                const u32 c = (j0 + u) * 4 + t;
                u32 qh[4] = {0u, 0u, 0u, 0u};
                if (c < chunks) {
#ifdef GG_Q_EACH_PASS
                    const float* qq = q + c * 8u;
#pragma unroll
                    for (u32 e = 0; e < 4; e++) qh[e] = pack_h2(qq[2 * e], qq[2 * e + 1]);
#else
                    const uint4 v = *(const uint4*)((const u32*)q + c * 4u);
                    qh[0] = v.x;
                    qh[1] = v.y;
                    qh[2] = v.z;
                    qh[3] = v.w;
#endif
                }
#pragma unroll
                for (u32 tile = 0; tile < 2; tile++) {
                    u32 lo[4], hi[4];  // rows g (+16) and g + 8 (+16)
#pragma unroll
                    for (u32 e = 0; e < 4; e++) {
#ifdef GG_Q_EACH_PASS
                        lo[e] = IP ? w[u][2 * tile][e] : hsub2(w[u][2 * tile][e], qh[e]);
                        hi[e] = IP ? w[u][2 * tile + 1][e] : hsub2(w[u][2 * tile + 1][e], qh[e]);
#else
                        // x / 2 - q / 2 in one rounding (qh holds -q / 2)
                        lo[e] = IP ? w[u][2 * tile][e] : hfma2(w[u][2 * tile][e], HALF2_HALF, qh[e]);
                        hi[e] = IP ? w[u][2 * tile + 1][e] : hfma2(w[u][2 * tile + 1][e], HALF2_HALF, qh[e]);
#endif
                    }
#pragma unroll
                    for (u32 k = 0; k < 4; k += 2) {
                        if (IP) {
                            mma16816(acc[2 * tile], lo[k], hi[k], lo[k + 1], hi[k + 1], qh[k], qh[k + 1]);
                        } else {
                            mma16816(acc[2 * tile], lo[k], hi[k], lo[k + 1], hi[k + 1], lo[k], lo[k + 1]);
                            mma16816(acc[2 * tile + 1], lo[k], hi[k], lo[k + 1], hi[k + 1], hi[k], hi[k + 1]);
                        }
                    }
                }
            }
        }
        // row g's value: L2, C0[g][g] (lane (g, g / 2), element g & 1);
        // row g + 8's: C1[g + 8][g] (element 2 + (g & 1)). IP: every
        // column holds x . q: lane (g, 0), elements 0 and 2.
#pragma unroll
        for (u32 tile = 0; tile < 2; tile++) {
            const u32 i0 = b + 16 * tile + g, i1 = i0 + 8;
            if (IP) {
                if (t == 0) {
                    if (i0 < m) cd[i0] = -acc[2 * tile][0];
                    if (i1 < m) cd[i1] = -acc[2 * tile][2];
                }
            } else if (t == (g >> 1)) {
                const u32 odd = g & 1;
                if (i0 < m) cd[i0] = L2_SCALE * (odd ? acc[2 * tile][1] : acc[2 * tile][0]);
                if (i1 < m) cd[i1] = L2_SCALE * (odd ? acc[2 * tile + 1][3] : acc[2 * tile + 1][2]);
            }
        }
    }
    __syncwarp();
}
#endif

// Rows a pass of the distance loop measures: 32 on the tensor cores, else
// 32 / G.
__device__ __forceinline__ u32 pass_rows(u32 half, u32 G) {
#ifndef GG_NO_MMA
    if (half) return 32;
#endif
    return 32 / G;
}

// The distance loop of warp `warp` of `warps` for the index's row format.
__device__ __forceinline__ void distances_of(const unsigned char* vec, u32 chunks, u32 G, u32 half, u32 metric,
                                             const float* q, const u32* ci, float* cd, u32 m, u32 lane, u32 warp,
                                             u32 warps) {
    if (half) {
#ifndef GG_NO_MMA
        if (metric == GG_METRIC_IP) distances_mma<true>(vec, chunks, q, ci, cd, m, lane, warp, warps);
        else distances_mma<false>(vec, chunks, q, ci, cd, m, lane, warp, warps);
#else
        if (metric == GG_METRIC_IP) distances_t<true, true>(vec, chunks, G, q, ci, cd, m, lane, warp, warps);
        else distances_t<true, false>(vec, chunks, G, q, ci, cd, m, lane, warp, warps);
#endif
    } else {
        if (metric == GG_METRIC_IP) distances_t<false, true>(vec, chunks, G, q, ci, cd, m, lane, warp, warps);
        else distances_t<false, false>(vec, chunks, G, q, ci, cd, m, lane, warp, warps);
    }
}

// Helper warps (-DGG_WARPS=n, n > 1: the persistent kernel's CTAs of n
// warps): warp 0 searches as a single-warp CTA does; the others only take
// their share of the passes of each distance loop, so that a step of
// several passes (the start, beam steps) waits on memory once per `warps`
// passes instead of once per pass. Warp 0 posts the loop in `team_job`,
// both barriers of the team delimit it; the batch kernel's single-warp
// blocks compute alone.
#ifndef GG_WARPS
#define GG_WARPS 1
#endif
#if GG_WARPS > 1
#define JOB_DISTANCES 1u
#define JOB_QUIT 2u
struct TeamJob {
    const unsigned char* vec;
    const float* q;
    const u32* ci;
    float* cd;
    u32 op, m, chunks, G, half, metric;
};
__shared__ TeamJob team_job;
__device__ __forceinline__ void team_sync(u32 id) { asm volatile("bar.sync %0, %1;" : : "r"(id), "r"(blockDim.x) : "memory"); }

// A helper warp's life: each distance loop warp 0 posts, until Quit.
__device__ void team_helper(u32 warp, u32 lane) {
    const u32 warps = blockDim.x >> 5;
    for (;;) {
        team_sync(1);
        const TeamJob j = team_job;
        if (j.op == JOB_QUIT) return;
        distances_of(j.vec, j.chunks, j.G, j.half, j.metric, j.q, j.ci, j.cd, j.m, lane, warp, warps);
        team_sync(2);
    }
}

// Warp 0: the helpers leave (the kernel quits).
__device__ __forceinline__ void team_quit(u32 lane) {
    if (blockDim.x <= 32) return;
    if (lane == 0) team_job.op = JOB_QUIT;
    __syncwarp();
    team_sync(1);
}
#else
__device__ __forceinline__ void team_quit(u32) {}
#endif

__device__ __forceinline__ void distances(const IndexDesc& ix, const float* q, const u32* ci, float* cd, u32 m,
                                          u32 lane) {
    const unsigned char* vec = (const unsigned char*)ix.vectors;
    // (more lanes a vector when a step brings few candidates, each lane's
    // share of a row then shorter, changed nothing on the H200: a step's
    // distances wait on the rows' loads, not on the arithmetic)
    const u32 G = ix.lanes;
#if GG_WARPS > 1
    // a loop of one pass is warp 0's alone (no barrier)
    if (blockDim.x > 32 && m > pass_rows(ix.half, G)) {
        if (lane == 0) {
            team_job.vec = vec;
            team_job.q = q;
            team_job.ci = ci;
            team_job.cd = cd;
            team_job.op = JOB_DISTANCES;
            team_job.m = m;
            team_job.chunks = ix.chunks;
            team_job.G = G;
            team_job.half = ix.half;
            team_job.metric = ix.metric;
        }
        __syncwarp();
        team_sync(1);
        distances_of(vec, ix.chunks, G, ix.half, ix.metric, q, ci, cd, m, lane, 0, blockDim.x >> 5);
        team_sync(2);
        return;
    }
#endif
    distances_of(vec, ix.chunks, G, ix.half, ix.metric, q, ci, cd, m, lane, 0, 1);
}

// ------------------------------------------------------------ list upkeep

// Merges c <= 32 unsorted new entries (cd, ci)[0..c) into the sorted list
// (ad, ai)[0..cnt), writing the first min(cap, cnt + c) of the union into
// (bd, bi): a new entry's place is its rank among the new ones (counted,
// not sorted: a step brings few; a bitonic sort of 32 then a merge by binary
// searches took 10% more of a query on the H200) plus a binary search in the
// list; an old entry's is its own plus the new entries before it (old first
// on equal keys). A node can be among the new entries twice: two lanes'
// claims of it in one batch both succeed when a third node's claim moves it
// off its home slot between them (claim_batch issues every atomic before it
// reads any); equal new entries then rank by lane, each its own place. Without
// that they took one place, and the list kept a stale entry from an older
// merge: 1M x768, a 2,000-row inner-product index, one batch answer in
// 1,000 out of order at ef 40 (docs/benchmarks.md).
__device__ __forceinline__ u32 merge_unsorted(const float* ad, const u32* ai, u32 cnt, float* bd, u32* bi, u32 cap,
                                              const float* cd, const u32* ci, u32 c, u32 lane) {
#ifndef GG_MERGE_SPLIT
    if (cnt <= 32) {
        // a list of at most 32 (one old entry a lane): one pass over the
        // new entries counts, for lane L's new entry, the new ones before
        // it, and for its old entry, the new ones before that; a ballot of
        // "old entry <= new entry x" gives new entry x the old ones before
        // it (in place of a binary search: the merges took a quarter of a
        // query's cycles, their loads one after the other)
        const bool fresh = lane < c, old = lane < cnt;
        float d = 0.f, dj = 0.f;
        u32 id = 0, key = 0, ij = 0, kj = 0;
        if (fresh) {
            d = cd[lane];
            id = ci[lane];
            key = id & ID_MASK;
        }
        if (old) {
            dj = ad[lane];
            ij = ai[lane];
            kj = ij & ID_MASK;
        }
        u32 rn = 0, ro = 0, lo = 0;
        for (u32 x = 0; x < c; x++) {
            const float dx = cd[x];
            const u32 kx = ci[x] & ID_MASK;
            rn += key_lt(dx, kx, d, key) || (x < lane && kx == key && dx == d);
            const bool le = old && key_le(dj, kj, dx, kx);
            ro += old && !le;
            const u32 below = __popc(__ballot_sync(FULL_MASK, le));
            if (x == lane) lo = below;
        }
        if (fresh && rn + lo < cap) {
            bd[rn + lo] = d;
            bi[rn + lo] = id;
        }
        if (old && lane + ro < cap) {
            bd[lane + ro] = dj;
            bi[lane + ro] = ij;
        }
        __syncwarp();
        const u32 total = cnt + c;
        return total < cap ? total : cap;
    }
#endif
    if (lane < c) {
        const float d = cd[lane];
        const u32 id = ci[lane];
        const u32 key = id & ID_MASK;
        u32 r = 0;
        // (a node twice among the new entries, equal keys, takes its lane
        // order: see the comment above)
        for (u32 j = 0; j < c; j++) {
            const float dj = cd[j];
            const u32 kj = ci[j] & ID_MASK;
            r += key_lt(dj, kj, d, key) || (j < lane && kj == key && dj == d);
        }
        u32 lo = 0, hi = cnt;
        while (lo < hi) {
            const u32 mid = (lo + hi) >> 1;
            if (key_le(ad[mid], ai[mid] & ID_MASK, d, key)) lo = mid + 1;
            else hi = mid;
        }
        const u32 pos = r + lo;
        if (pos < cap) {
            bd[pos] = d;
            bi[pos] = id;
        }
    }
    for (u32 j = lane; j < cnt; j += 32) {
        const float dj = ad[j];
        const u32 ij = ai[j];
        const u32 kj = ij & ID_MASK;
        u32 before = 0;
        for (u32 x = 0; x < c; x++) before += key_lt(cd[x], ci[x] & ID_MASK, dj, kj);
        const u32 pos = j + before;
        if (pos < cap) {
            bd[pos] = dj;
            bi[pos] = ij;
        }
    }
    __syncwarp();
    const u32 total = cnt + c;
    return total < cap ? total : cap;
}

// Where a CTA's search time goes (SM cycles, clock64): the breakdown.
struct Phases {
    u64 claim;
    u64 dist;
    u64 merge;
};

__device__ __forceinline__ u64 cycles() { return clock64(); }

// ------------------------------------------------------------ the kernel

struct Lists {
    float* ad;
    u32* ai;
    float* bd;
    u32* bi;
    u32 cnt;
};

// The merge's output becomes the list.
__device__ __forceinline__ void swap_lists(Lists& L) {
    float* td = L.ad;
    L.ad = L.bd;
    L.bd = td;
    u32* ti = L.ai;
    L.ai = L.bi;
    L.bi = ti;
}

// A list's first entries (an empty list: a query's start, the scan's
// first 32): c <= 32 unsorted new entries (cd, ci) sorted in registers,
// 15 rounds of shuffles, the first min(cap, c) written to (bd, bi); where
// counting ranks (merge_unsorted) took a loop of 32 shared loads after
// shared loads. Only at the start, and a function of its own: inlined, it
// made the persistent kernel spill more registers (nvdisasm, sm_90: 193
// local loads inlined in every merge, 136 at the start alone, 86 as a
// call, 58 with no sort).
__device__ __noinline__ u32 sort_first(float* bd, u32* bi, u32 cap, const float* cd, const u32* ci, u32 c,
                                          u32 lane) {
    // (an empty lane: the largest key, last)
    float d = __int_as_float(0x7f800000);
    u32 id = 0xFFFFFFFFu;
    if (lane < c) {
        d = cd[lane];
        id = ci[lane];
    }
    u32 key = id & ID_MASK;
#pragma unroll
    for (u32 k = 2; k <= 32; k <<= 1) {
#pragma unroll
        for (u32 j = k >> 1; j > 0; j >>= 1) {
            const float od = __shfl_xor_sync(FULL_MASK, d, j);
            const u32 oid = __shfl_xor_sync(FULL_MASK, id, j);
            const u32 okey = oid & ID_MASK;
            // ascending runs where bit k of the lane is clear; the
            // lower lane of a pair keeps the smaller key there
            const bool keep_min = ((lane & k) == 0) == ((lane & j) == 0);
            const bool take = keep_min ? key_lt(od, okey, d, key) : key_lt(d, key, od, okey);
            if (take) {
                d = od;
                id = oid;
                key = okey;
            }
        }
    }
    const u32 n = c < cap ? c : cap;
    if (lane < n) {
        bd[lane] = d;
        bi[lane] = id;
    }
    __syncwarp();
    return n;
}

// The ms survivors (cd, ci)[0..ms) merged into the list, 32 at a time;
// each 32 from entry `refilter` on only with what is nearer than the
// list's last entry by then (a query's start of 64 nodes: ~5 of its
// second 32, not 32).
__device__ __forceinline__ void merge_all(Lists& L, u32 cap, float* cd, u32* ci, u32 ms, u32 lane,
                                          u32 refilter = 32) {
    for (u32 b = 0; b < ms; b += 32) {
        u32 c = ms - b < 32 ? ms - b : 32;
#ifndef GG_NO_REFILTER
        if (b >= refilter && L.cnt >= cap) {
            const float thr = L.ad[cap - 1];
            const bool in = lane < c;
            const float d = in ? cd[b + lane] : 0.f;
            const u32 id = in ? ci[b + lane] : 0u;
            const bool keep = in && d < thr;
            const u32 bal = __ballot_sync(FULL_MASK, keep);
            __syncwarp();
            if (keep) {
                const u32 p = b + __popc(bal & lanemask_lt());
                cd[p] = d;
                ci[p] = id;
            }
            __syncwarp();
            c = __popc(bal);
            if (c == 0) continue;
        }
#endif
        L.cnt = merge_unsorted(L.ad, L.ai, L.cnt, L.bd, L.bi, cap, cd + b, ci + b, c, lane);
        swap_lists(L);
    }
}

// Distances of the m new ids in ci, then the ones nearer than the list's
// last entry merged into the list, 32 at a time (FIRST: the scan's start,
// an empty list's first 32 sorted by sort_first, -DGG_START_COUNT merged
// as any other for the A/B).
template <bool FIRST = false>
__device__ __forceinline__ void absorb(const IndexDesc& ix, const float* q, u32* ci, float* cd, u32 m, Lists& L,
                                       u32 cap, Phases& ph, u32 lane) {
    if (m == 0) return;
    const u64 t0 = cycles();
    distances(ix, q, ci, cd, m, lane);
    const u64 t1 = cycles();
    ph.dist += t1 - t0;
    // survivors, compacted in place
    const float inf = __int_as_float(0x7f800000);
    const float thr = L.cnt >= cap ? L.ad[cap - 1] : inf;
    u32 ms = 0;
    for (u32 b = 0; b < m; b += 32) {
        const u32 i = b + lane;
        float d = inf;
        u32 id = NO_NODE;
        bool keep = false;
        if (i < m) {
            d = cd[i];
            id = ci[i];
            keep = d < thr;
        }
        const u32 bal = __ballot_sync(FULL_MASK, keep);
        __syncwarp();
        if (keep) {
            const u32 p = ms + __popc(bal & lanemask_lt());
            cd[p] = d;
            ci[p] = id;
        }
        ms += __popc(bal);
        __syncwarp();
    }
    __syncwarp();
#ifndef GG_START_COUNT
    if (FIRST && L.cnt == 0 && ms > 0) {
        const u32 c = ms < 32 ? ms : 32;
        L.cnt = sort_first(L.bd, L.bi, cap, cd, ci, c, lane);
        swap_lists(L);
        merge_all(L, cap, cd + c, ci + c, ms - c, lane, 0);
    } else
#endif
    {
        merge_all(L, cap, cd, ci, ms, lane);
    }
    ph.merge += cycles() - t1;
}

// Whether node `id` (< n: a node; else none) is this query's to measure,
// given what the atomicMax of (gen, id) on its home slot `h` returned.
__device__ __forceinline__ bool claimed(u64* table, u32 mask, u32 gen, u32 n, u32 id, u32 h, u64 got) {
    if (id >= n) return false;
    const u64 key = ((u64)gen << 32) | (u64)id;
    if ((u32)(got >> 32) != gen) return true;  // took an older query's slot
    if (got == key) return false;               // visited
    const u32 h1 = (h + 1) & mask;
    if (got < key) {
        // took the slot of another node of this query: it moves on along
        // its probe sequence
        visit_claim(table, mask, gen, (u32)got, h1, ld_relaxed_u64(table + h1));
        return true;
    }
    return visit_claim(table, mask, gen, id, h1, ld_relaxed_u64(table + h1));
}

// Lane `lane`'s ids of a step: e = u * 32 + lane of src for e < total,
// NO_NODE past it.
template <u32 R, typename Src>
__device__ __forceinline__ void gather_ids(Src src, u32 total, u32 lane, u32 (&ids)[R]) {
#pragma unroll
    for (u32 u = 0; u < R; u++) {
        const u32 e = u * 32 + lane;
        ids[u] = e < total ? src(e) : NO_NODE;
    }
}

// The claim of node `id` (< n: a node; else none, 0 returned): one atomic:
// the larger of (generation, id) keys stays in its home slot `h`, so an
// older query's entry (smaller generation) gives way, and the node was
// visited when the old key is its own; `claimed` reads what it returns.
__device__ __forceinline__ u64 claim_home(u64* table, u32 mask, u32 gen, u32 n, u32 id, u32& h) {
    h = 0;
    if (id >= n) return 0;
    h = hash32(id) & mask;
    return atomicMax((unsigned long long*)(table + h), (unsigned long long)(((u64)gen << 32) | (u64)id));
}

// Claims the unvisited ones among up to CAND_CAP ids produced by src(e) for
// e < total (e = u * 32 + lane) and writes them to ci; returns their count.
// Every lane issues all its id loads, then one atomicMax per id on its home
// slot, before it looks at any result: two round trips for a step, whatever
// the beam width (a load then a compare-and-swap made three; the claims
// took a third of a query's cycles on the H200, a quarter after). A home
// slot taken by another node of this query sends one of the two on along
// its probe sequence (visit_claim).
template <typename Src>
__device__ __forceinline__ u32 claim_batch(u64* table, u32 mask, u32 gen, u32 n, u32 total, Src src, u32* ci,
                                           const unsigned char* vec, u32 row_bytes, u32 lane) {
    u32 ids[MAX_R];
    u64 got[MAX_R];
    u32 hs[MAX_R];
    gather_ids(src, total, lane, ids);
    // a row longer than two lines (wide vectors) starts its way to L2 now,
    // beside the claims' atomics: its distance then takes several passes
    // of a few rows each, every one a round trip (500k x768 on an H100,
    // ef 20: the kernel's p50 254 -> 240 us at one thread, 241 -> 225 at
    // 64; SIFT's two-line rows, one pass a step, lost 5% to the extra
    // instructions). A visited node's row is fetched for nothing.
    if (row_bytes > 256) {
#pragma unroll
        for (u32 u = 0; u < MAX_R; u++) {
            const u32 id = ids[u] & ID_MASK;
            if (id < n) {
                const unsigned char* row = vec + (u64)id * row_bytes;
                for (u32 b = 0; b < row_bytes; b += 128) asm volatile("prefetch.global.L2 [%0];" : : "l"(row + b));
            }
        }
    }
#pragma unroll
    for (u32 u = 0; u < MAX_R; u++) got[u] = claim_home(table, mask, gen, n, ids[u] & ID_MASK, hs[u]);
    u32 m = 0;
#pragma unroll
    for (u32 u = 0; u < MAX_R; u++) {
        if (u * 32 >= total) break;
        const bool fresh = claimed(table, mask, gen, n, ids[u] & ID_MASK, hs[u], got[u]);
        const u32 bal = __ballot_sync(FULL_MASK, fresh);
        if (fresh) ci[m + __popc(bal & lanemask_lt())] = ids[u];
        m += __popc(bal);
    }
    __syncwarp();
    return m;
}

// A step whose ids all fit SPEC_ROWS passes of the distance loop (SIFT's
// two-line rows: a beam-1 step's 32 neighbours in one pass): their rows
// are measured while their claims are in flight, visited ones too, and
// the claims' answers are looked at only after. One round trip a step
// fewer (ids, then claims and rows together, against ids, claims, rows);
// a visited neighbour's distance is computed for nothing, inside a pass
// that runs anyway. Wider steps (beam extend, wide rows) would add passes
// of rows, each a round trip: they claim first (claim_batch). Returns the
// fresh ids, merged into the list when nearer than its last entry.
#ifndef GG_SPEC_ROWS
#define GG_SPEC_ROWS 1u
#endif
#define SPEC_ROWS GG_SPEC_ROWS
template <typename Src>
__device__ __forceinline__ u32 step_spec(const IndexDesc& ix, const float* q, u64* table, u32 mask, u32 gen,
                                         u32 total, Src src, u32* ci, float* cd, Lists& L, u32 cap, Phases& ph,
                                         u32 lane) {
    const u64 t0 = cycles();
    u32 ids[SPEC_ROWS];
    u64 got[SPEC_ROWS];
    u32 hs[SPEC_ROWS];
    gather_ids(src, total, lane, ids);
#pragma unroll
    for (u32 u = 0; u < SPEC_ROWS; u++) {
        const u32 e = u * 32 + lane;
        const u32 id = ids[u] & ID_MASK;
        got[u] = claim_home(table, mask, gen, ix.n, id, hs[u]);
        // a padding entry measures row 0 for nothing
        if (e < total) ci[e] = id < ix.n ? ids[u] : 0u;
    }
    __syncwarp();
    const u64 t1 = cycles();
    distances(ix, q, ci, cd, total, lane);
    const u64 t2 = cycles();
    const float inf = __int_as_float(0x7f800000);
    const float thr = L.cnt >= cap ? L.ad[cap - 1] : inf;
    u32 ms = 0, fresh_n = 0;
#pragma unroll
    for (u32 u = 0; u < SPEC_ROWS; u++) {
        if (u * 32 >= total) break;
        const u32 e = u * 32 + lane;
        const bool fresh = claimed(table, mask, gen, ix.n, ids[u] & ID_MASK, hs[u], got[u]);
        const float d = e < total ? cd[e] : inf;
        const bool keep = fresh && d < thr;
        fresh_n += __popc(__ballot_sync(FULL_MASK, fresh));
        const u32 bal = __ballot_sync(FULL_MASK, keep);
        __syncwarp();
        // in place: entry p <= e of a row already read
        if (keep) {
            const u32 p = ms + __popc(bal & lanemask_lt());
            cd[p] = d;
            ci[p] = ids[u];
        }
        ms += __popc(bal);
        __syncwarp();
    }
    const u64 t3 = cycles();
    merge_all(L, cap, cd, ci, ms, lane);
    ph.claim += (t1 - t0) + (t3 - t2);
    ph.dist += t2 - t1;
    ph.merge += cycles() - t3;
    return fresh_n;
}

// The first `width` entries of the lists of the selected nodes (width =
// degree: the whole lists).
struct AdjSrc {
    const u32* adj;
    const u32* sel;
    u32 degree;
    u32 width;
    __device__ __forceinline__ u32 operator()(u32 e) const {
        const u32 s = sel[e / width];
        return ld_cg_u32(adj + (u64)s * degree + (e % width));
    }
};

// The entry point's neighbours j with j % ctas == t.
struct EntrySrc {
    const u32* row;
    u32 t;
    u32 ctas;
    __device__ __forceinline__ u32 operator()(u32 e) const { return ld_cg_u32(row + t + e * ctas); }
};

// Node j of a sample of `total` nodes spread evenly over the ids, the same
// for every query (its rows stay in L2): the seeds' and the scan's.
__device__ __forceinline__ u32 spread_node(u32 j, u32 n, u32 total) { return (u32)((u64)j * n / total); }

// The query's start nodes: seed j of `total` is node j * n / total (a
// sample of the whole index, the same for every query: its rows stay in
// L2), CTA t of T taking j = t, t + T, ...; the nearest of them start the
// search closer to its answer than the entry alone (the CPU model, 500k
// SIFT: 14.0 -> 12.0 steps at ef 10, 15.0 -> 13.9 at ef 20 with 64 seeds).
struct SeedSrc {
    u32 entry;
    u32 seeds;  // this CTA's
    u32 total;
    u32 n;
    u32 t;
    u32 ctas;
    __device__ __forceinline__ u32 operator()(u32 e) const {
        // e == 0: the entry point, marked expanded (every CTA expands it
        // next); 1..seeds: this CTA's seeds
        if (e == 0) return entry | EXP_BIT;
        if (e <= seeds) return spread_node(t + (e - 1) * ctas, n, total);
        return NO_NODE;
    }
};

// The start in one round: the seeds' ids, then the entry's share.
struct StartSrc {
    SeedSrc seeds;
    EntrySrc entry;
    u32 first;
    __device__ __forceinline__ u32 operator()(u32 e) const { return e < first ? seeds(e) : entry(e - first); }
};

// A CTA's shared memory: the query, two lists (distance, id) of list_cap,
// the candidate buffer and 32 selected ids
// (GG_SEARCH_SMEM_BYTES).
struct Smem {
    float* q;
    float* l0d;
    u32* l0i;
    float* l1d;
    u32* l1i;
    float* cd;
    u32* ci;
    u32* sel;
};

__device__ __forceinline__ Smem carve(unsigned char* smem, u32 max_qwords, u32 list_cap) {
    Smem S;
    S.q = (float*)smem;
    S.l0d = S.q + max_qwords;
    S.l0i = (u32*)(S.l0d + list_cap);
    S.l1d = (float*)(S.l0i + list_cap);
    S.l1i = (u32*)(S.l1d + list_cap);
    S.cd = (float*)(S.l1i + list_cap);
    S.ci = (u32*)(S.cd + CAND_CAP);
    S.sel = S.ci + CAND_CAP;
    return S;
}

// Entry `xi` of the index table, read through L2 into ix (its loads only
// issued: desc_usable looks at them, so that other loads can go in the
// same round trip); an `xi` past the table reads entry 0 and is unusable.
__device__ __forceinline__ void load_desc(const IndexDesc* indexes, u32 n_indexes, u32 xi, IndexDesc& ix) {
    const IndexDesc* desc = indexes + (xi < n_indexes ? xi : 0u);
    ix.vectors = ((u64)ld_cg_u32((const u32*)&desc->vectors + 1) << 32) | ld_cg_u32(&desc->vectors);
    ix.adjacency = ((u64)ld_cg_u32((const u32*)&desc->adjacency + 1) << 32) | ld_cg_u32(&desc->adjacency);
    ix.flags = ((u64)ld_cg_u32((const u32*)&desc->flags + 1) << 32) | ld_cg_u32(&desc->flags);
    ix.n = ld_cg_u32(&desc->n);
    ix.degree = ld_cg_u32(&desc->degree);
    ix.entry = ld_cg_u32(&desc->entry);
    ix.chunks = ld_cg_u32(&desc->chunks);
    ix.half = ld_cg_u32(&desc->half);
    ix.metric = ld_cg_u32(&desc->metric);
    ix.lanes = ld_cg_u32(&desc->lanes);
    ix.gen = ld_cg_u32(&desc->gen);
    ix.rows = ((u64)ld_cg_u32((const u32*)&desc->rows + 1) << 32) | ld_cg_u32(&desc->rows);
}

// Whether ix, entry `xi` of a table of n_indexes, is a loaded index of
// generation `xgen` that a search can use.
__device__ __forceinline__ bool desc_usable(const IndexDesc& ix, u32 xi, u32 n_indexes, u32 xgen) {
    return xi < n_indexes && ix.gen != 0 && ix.gen == xgen && ix.n > 0 && ix.entry < ix.n && ix.degree > 0 &&
           ix.degree <= CAND_CAP;
}

// Copies `qwords` floats (a multiple of 4) of a query into shared memory,
// every lane's 16-byte pieces in flight at once (one round trip whatever
// the dimensions, not one per 128): on sm_80+ by cp.async, L2 to shared
// memory with no registers in between (a staging array of registers made
// the kernel spill more).
__device__ __forceinline__ void load_query(const u32* src, float* q, u32 qwords, u32 lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(GG_SERIAL_HEAD)
    for (u32 i = lane * 4; i < qwords; i += 128) {
        const u32 dst = (u32)__cvta_generic_to_shared(q + i);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(dst), "l"(src + i) : "memory");
    }
    asm volatile("cp.async.wait_all;" : : : "memory");
#else
    for (u32 i = lane * 4; i < qwords; i += 128) {
        u32 a, b, cc, d;
        ld_cg_v4(src + i, a, b, cc, d);
        q[i] = __uint_as_float(a);
        q[i + 1] = __uint_as_float(b);
        q[i + 2] = __uint_as_float(cc);
        q[i + 3] = __uint_as_float(d);
    }
#endif
    __syncwarp();
}

// How one CTA searches (a request's fields).
struct CtaPlan {
    u32 k;
    u32 cap;  // candidate list length
    u32 max_expand;
    u32 offset_beam;
    u32 beam;
    u32 seeds;
    u32 scan;
};

// One query's search by CTA t of `ctas` (the query in S.q; the visited
// table `table` of 2^k entries - 1 = vmask shared by the query's CTAs,
// entries of generation `gen`), through the first `width` entries of each
// list (0: whole lists; TSDG's prefix for large batches); writes its first
// k live entries to `hits` (and their rows to `rows_out`, when not null and
// the index has rows) and returns how many, with the nodes expanded,
// distances computed, steps taken and when its start ended (globaltimer).
// The same search for the persistent kernel (a slot's CTAs) and the batch
// kernel (one CTA a query).
__device__ __forceinline__ u32 search_one(const IndexDesc& ix, const Smem& S, u64* table, u32 vmask, u32 gen, u32 t,
                                          u32 ctas, const CtaPlan& p, u32 width, ResultHit* hits,
                                          u64* rows_out, u32& expanded, u32& computed, u32& steps, u64& started, Phases& ph,
                                          u32 lane) {
    Lists L;
    L.ad = S.l0d;
    L.ai = S.l0i;
    L.bd = S.l1d;
    L.bi = S.l1i;
    L.cnt = 0;
    const u32 cap = p.cap;
    const u32* adj = (const u32*)ix.adjacency;
    const u32 w = width == 0 || width > ix.degree ? ix.degree : width;
    const u32 bmax_r = CAND_CAP / w;
    const u32 bmax = bmax_r < 32 ? bmax_r : 32;
    const u32 bw = p.beam < bmax ? (p.beam > 0 ? p.beam : 1) : bmax;
    u32* ci = S.ci;
    float* cd = S.cd;
    const unsigned char* vec = (const unsigned char*)ix.vectors;
    const u32 row_bytes = ix.chunks * 16u;

#ifndef GG_NO_MMA
    if (ix.half) half_query(S.q, ix.chunks, ix.metric, lane);
#endif
    u64 tc = cycles();
    u32 m;
    if (p.scan > 0) {
        // start by a scan: this CTA's share of nodes j * n / scan (a fixed
        // sample, its rows in L2), CAND_CAP at a time into the list with no
        // claims; the list's entries then claimed, their distances known
        const u32 total = p.scan < ix.n ? p.scan : ix.n;
        const u32 mine = t < total ? (total - t + ctas - 1) / ctas : 0;
        for (u32 b = 0; b < mine; b += CAND_CAP) {
            m = mine - b < CAND_CAP ? mine - b : CAND_CAP;
            for (u32 e = lane; e < m; e += 32) ci[e] = spread_node(t + (b + e) * ctas, ix.n, total);
            __syncwarp();
            absorb<true>(ix, S.q, ci, cd, m, L, cap, ph, lane);
        }
        computed += mine;
        tc = cycles();
        for (u32 j = lane; j < L.cnt; j += 32) {
            u32 h;
            const u32 id = L.ai[j];
            const u64 got = claim_home(table, vmask, gen, ix.n, id, h);
            claimed(table, vmask, gen, ix.n, id, h, got);
        }
        __syncwarp();
        ph.claim += cycles() - tc;
        expanded = 0;
    } else {
        // start: the entry point and this CTA's seeds, and every CTA expands
        // its share of the entry point's neighbours; in one round (the
        // kernel's start took 9.5 us of a query in two, 5.5 in one, H200)
        // unless they are more than a round takes
        SeedSrc ss;
        ss.entry = ix.entry;
        ss.total = p.seeds < GG_MAX_SEEDS ? p.seeds : GG_MAX_SEEDS;
        ss.seeds = t < ss.total ? (ss.total - t + ctas - 1) / ctas : 0;
        ss.n = ix.n;
        ss.t = t;
        ss.ctas = ctas;
        EntrySrc es;
        es.row = adj + (u64)ix.entry * ix.degree;
        es.t = t;
        es.ctas = ctas;
        const u32 share = t < w ? (w - t + ctas - 1) / ctas : 0;
        StartSrc st0;
        st0.seeds = ss;
        st0.entry = es;
        st0.first = 1 + ss.seeds;
        if (st0.first + share <= CAND_CAP) {
            m = claim_batch(table, vmask, gen, ix.n, st0.first + share, st0, ci, vec, row_bytes, lane);
        } else {
            m = claim_batch(table, vmask, gen, ix.n, st0.first, ss, ci, vec, row_bytes, lane);
            ph.claim += cycles() - tc;
            computed += m;
            absorb(ix, S.q, ci, cd, m, L, cap, ph, lane);
            tc = cycles();
            m = claim_batch(table, vmask, gen, ix.n, share, es, ci, vec, row_bytes, lane);
        }
        ph.claim += cycles() - tc;
        computed += m;
        absorb(ix, S.q, ci, cd, m, L, cap, ph, lane);
        expanded = 1;
    }
    steps = 0;
    started = globaltimer();
    u32 nsel = 0;
    for (;;) {
        if (nsel > 0) {
            ++steps;
            AdjSrc as;
            as.adj = adj;
            as.sel = S.sel;
            as.degree = ix.degree;
            as.width = w;
            const u32 total = nsel * w;
            // (-DGG_NO_SPEC compiles the claim-first step alone: the A/B of
            // docs/benchmarks.md, through GPU_GRAPH_SEARCH_NVRTC_OPTIONS)
#ifndef GG_NO_SPEC
            if (total * ix.lanes <= SPEC_ROWS * 32u) {
                computed += step_spec(ix, S.q, table, vmask, gen, total, as, ci, cd, L, cap, ph, lane);
            } else
#endif
            {
                tc = cycles();
                m = claim_batch(table, vmask, gen, ix.n, total, as, ci, vec, row_bytes, lane);
                ph.claim += cycles() - tc;
                computed += m;
                absorb(ix, S.q, ci, cd, m, L, cap, ph, lane);
            }
            expanded += nsel;
        }
        if (expanded >= p.max_expand) break;
        // the next candidates to expand: the first unexpanded ones
        nsel = 0;
        u32 want = 0xFFFFFFFFu;
        for (u32 base = 0; base < L.cnt && nsel < want; base += 32) {
            const u32 j = base + lane;
            const bool un = j < L.cnt && (L.ai[j] & EXP_BIT) == 0;
            const u32 bal = __ballot_sync(FULL_MASK, un);
            if (bal != 0 && want == 0xFFFFFFFFu) {
                const u32 first = base + __ffs(bal) - 1;
                want = first >= p.offset_beam ? bw : 1;
            }
            if (un) {
                const u32 r = nsel + __popc(bal & lanemask_lt());
                if (r < want) {
                    S.sel[r] = L.ai[j];
                    L.ai[j] = L.ai[j] | EXP_BIT;
                }
            }
            const u32 got = nsel + __popc(bal);
            nsel = got < want ? got : want;
        }
        __syncwarp();
        if (nsel == 0) break;  // every candidate of the list is expanded
    }

    // the first k live entries
    const unsigned char* flags = (const unsigned char*)ix.flags;
    u32 written = 0;
    for (u32 base = 0; base < L.cnt && written < p.k; base += 32) {
        const u32 j = base + lane;
        bool live = false;
        u32 id = 0;
        float d = 0.f;
        u64 row = 0;
        if (j < L.cnt) {
            id = L.ai[j] & ID_MASK;
            d = L.ad[j];
            // (the row's load beside the flag's: one round trip for both)
            if (rows_out != nullptr && ix.rows != 0) row = ld_cg_u64((const u64*)ix.rows + id);
            live = (ld_cg_u8(flags + id) & (GG_NODE_DELETED | GG_NODE_FREE)) == 0;
        }
        const u32 bal = __ballot_sync(FULL_MASK, live);
        if (live) {
            const u32 r = written + __popc(bal & lanemask_lt());
            if (r < p.k) {
                st_v2(hits + r, __float_as_uint(d), id);
                if (rows_out != nullptr) st_v2(rows_out + r, (u32)row, (u32)(row >> 32));
            }
        }
        const u32 got = written + __popc(bal);
        written = got < p.k ? got : p.k;
    }
    return written;
}

// ------------------------------------------------------------ dispatcher

// The doorbell (P.doorbell != 0; the grid's last block, warp 0): the host
// writes a query's request into its slot's staging bytes in mapped host
// memory and posts an entry on the ring there -- no driver call. The
// dispatcher reads the next 32 entries in one round trip over PCIe, copies
// the posted requests into their slots' device buffers (each lane's loads
// all issued before its stores; a run of requests in one round trip:
// copy_requests) and writes the slot words, which the slot's
// CTAs poll in device memory as before. This replaces a copy and a stream
// write a query: the copy engine's start-up and the driver calls on the
// host's thread. (An earlier try had the CTAs read the request's fields
// from host memory one by one, a PCIe round trip each: 11 us more a query.)
#define COPY_ROUND 8u

// Copies words first, first + step, ... of `len` bytes host -> device,
// words of W bytes (W = 16, 4 or 1): COPY_ROUND loads in flight before
// their stores (one PCIe round trip a round, not one a word). A request is
// copied by the warp (first = lane, step = 32), a patch's copy by one lane
// (0, 1). List ids move as whole words (16 or 4 bytes).
template <u32 W>
__device__ __forceinline__ void copy_from_host(unsigned char* dst, const unsigned char* src, u32 len, u32 first,
                                               u32 step) {
    const u32 words = len / W;
    for (u32 w0 = first; w0 < words; w0 += COPY_ROUND * step) {
        u32 r[COPY_ROUND][4];
#pragma unroll
        for (u32 u = 0; u < COPY_ROUND; u++) {
            const u64 o = (u64)(w0 + u * step) * W;
            if (w0 + u * step < words) {
                if (W == 16) {
                    ld_volatile_v4(src + o, r[u][0], r[u][1], r[u][2], r[u][3]);
                } else if (W == 4) {
                    r[u][0] = *(const volatile u32*)(src + o);
                } else {
                    r[u][0] = *(const volatile unsigned char*)(src + o);
                }
            }
        }
#pragma unroll
        for (u32 u = 0; u < COPY_ROUND; u++) {
            const u64 o = (u64)(w0 + u * step) * W;
            if (w0 + u * step < words) {
                if (W == 16) {
                    st_v4(dst + o, r[u][0], r[u][1], r[u][2], r[u][3]);
                } else if (W == 4) {
                    *(u32*)(dst + o) = r[u][0];
                } else {
                    dst[o] = (unsigned char)r[u][0];
                }
            }
        }
    }
}

// The patch staged at P.patch_staging (Registry::patch): a lane a copy,
// 32 copies a round, the table and each copy's bytes read from host memory
// in a few round trips; then fenced, and acknowledged to the host, which
// reuses the staging buffer (and frees memory a copy may write) only after.
__device__ void apply_staged_patch(const SearchParams& P, u32 lane) {
    const unsigned char* base = (const unsigned char*)P.patch_staging;
    u32 h[4] = {0, 0, 0, 0};
    if (lane == 0) ld_volatile_v4(base, h[0], h[1], h[2], h[3]);
    const u32 seq = __shfl_sync(FULL_MASK, h[0], 0), n = __shfl_sync(FULL_MASK, h[1], 0),
              table = __shfl_sync(FULL_MASK, h[2], 0);
    for (u32 i0 = 0; i0 < n; i0 += 32) {
        const u32 i = i0 + lane;
        if (i < n) {
            u32 c[4];
            ld_volatile_v4(base + table + (u64)i * sizeof(PatchCopy), c[0], c[1], c[2], c[3]);
            unsigned char* dst = (unsigned char*)((u64)c[0] | ((u64)c[1] << 32));
            const unsigned char* src = base + c[2];
            const u32 len = c[3];
            // aligned words (the host aligns every copy's bytes to 16): a
            // query reading a list meanwhile sees each id old or new, never
            // half of one; bytes only for a run of flags
            const u64 align = (u64)dst | c[2] | len;
            if ((align & 15u) == 0) copy_from_host<16>(dst, src, len, 0, 1);
            else if ((align & 3u) == 0) copy_from_host<4>(dst, src, len, 0, 1);
            else copy_from_host<1>(dst, src, len, 0, 1);
        }
    }
    __threadfence();
    __syncwarp();
    if (lane == 0) {
        fence_sys();
        st_release_sys((u32*)P.patch_ack, seq);
    }
    __syncwarp();
}

// The requests of entries [j, n) of a poll (lane x holds entry x in `e`)
// that are requests in a row and fit COPY_ROUND rounds of 32 chunks
// together, copied in one PCIe round trip: round u copies chunks
// 32 (u - first round of its entry) + lane of one entry. Each entry's
// own lane then stamps its device copy and releases its slot word (one
// MEMBAR for all of them), the word taken from the loaded registers, not
// read back from L2. Returns the entry after the last one copied; j when
// entry j alone needs more rounds (the caller copies it alone). The
// serial copy, a round trip and a fence an entry, queued requests ~32 us
// behind it at 470k queries/s; copied in runs, 64 submitting threads got
// 860k queries/s, the dispatch's p50 7.3 us (1M SIFT, ef 10, H200,
// docs/benchmarks.md).
__device__ __forceinline__ u32 copy_requests(const SearchParams& P, u64 e, u32 j, u32 n, u64 seen, u32 lane) {
    const u32 slot = (u32)(e >> GG_RING_SLOT_SHIFT) & GG_RING_LEN_MASK;
    const u32 chunks = (u32)e & GG_RING_LEN_MASK;
    const bool req = lane >= j && lane < n && slot != GG_RING_QUIT && slot != GG_RING_PATCH;
    // the run: requests from j on, up to the first entry that is not one
    const u32 not_req = __ballot_sync(FULL_MASK, lane >= j && !req);
    const u32 stop = not_req == 0 ? 32u : __ffs(not_req) - 1u;
    // (a request has its header at least: one round)
    const u32 rounds = req && lane < stop ? (chunks + 31u) / 32u + (chunks == 0) : 0u;
    // inclusive prefix sum of the rounds over the lanes
    u32 incl = rounds;
#pragma unroll
    for (u32 d = 1; d < 32; d <<= 1) {
        const u32 o = __shfl_up_sync(FULL_MASK, incl, d);
        if (lane >= d) incl += o;
    }
    const bool in_run = rounds > 0 && incl <= COPY_ROUND;
    const u32 run = __ballot_sync(FULL_MASK, in_run);
    if (run == 0) return j;
    // entries j .. end - 1 (in_run holds for a prefix of them)
    const u32 end = 32u - __clz(run);
    const u32 excl = incl - rounds;
    u32 r[COPY_ROUND][4];
    u32 slot_u[COPY_ROUND], chunk_u[COPY_ROUND];
    bool ok_u[COPY_ROUND];
#pragma unroll
    for (u32 u = 0; u < COPY_ROUND; u++) {
        // the entry round u copies: the first whose rounds end after u
        const u32 x = __ffs(__ballot_sync(FULL_MASK, in_run && incl > u) | 0x80000000u) - 1u;
        const u32 xs = __shfl_sync(FULL_MASK, slot, x & 31u);
        const u32 xc = __shfl_sync(FULL_MASK, chunks, x & 31u);
        const u32 xe = __shfl_sync(FULL_MASK, excl, x & 31u);
        const bool xin = (run >> x) & 1u;
        chunk_u[u] = (u - xe) * 32u + lane;
        slot_u[u] = xs;
        ok_u[u] = xin && chunk_u[u] < xc;
        if (ok_u[u]) {
            const unsigned char* src = (const unsigned char*)P.staging + (u64)xs * P.req_stride + (u64)chunk_u[u] * 16u;
            ld_volatile_v4(src, r[u][0], r[u][1], r[u][2], r[u][3]);
        } else {
            r[u][0] = r[u][1] = r[u][2] = r[u][3] = 0;
        }
    }
#pragma unroll
    for (u32 u = 0; u < COPY_ROUND; u++) {
        if (ok_u[u]) {
            unsigned char* dst = (unsigned char*)P.reqs + (u64)slot_u[u] * P.req_stride + (u64)chunk_u[u] * 16u;
            st_v4(dst, r[u][0], r[u][1], r[u][2], r[u][3]);
        }
    }
    const u64 copied = globaltimer();
    // each entry's slot word: word 0 of its chunk 0, which lane 0 loaded
    // in the entry's first round
    u32 c = 0;
#pragma unroll
    for (u32 u = 0; u < COPY_ROUND; u++) {
        const u32 w = __shfl_sync(FULL_MASK, r[u][0], 0);
        if (in_run && excl == u) c = w;
    }
    // the stamps after the copy of the header's chunk (another lane's)
    __syncwarp();
    if (in_run) {
        RequestHead* h = (RequestHead*)((unsigned char*)P.reqs + (u64)slot * P.req_stride);
        h->seen = (u32)seen;
        h->copy_ns = (u32)(copied - seen);
    }
    // every lane's copy before the words: the release of each is
    // cumulative over the warp's stores ordered by the __syncwarp
    __syncwarp();
    if (in_run) st_release_gpu((u32*)P.cmd + slot, c);
    __syncwarp();
    return end;
}

__device__ void dispatch(const SearchParams& P, u32 lane) {
    const u64* ring = (const u64*)P.doorbell;
    const u32 mask = (1u << P.ring_log2) - 1u;
    u32* cmd = (u32*)P.cmd;
    const u32 slots = (gridDim.x - 1u) / P.ctas_per_slot;
    u32 head = 0, idle = 0;
    for (;;) {
        const u32 at = head + lane;
        const u64 e = ld_acquire_sys_u64(ring + (at & mask));
        const u32 tag = ((at >> P.ring_log2) + 1u) & 0xFFFFu;
        const u32 bal = __ballot_sync(FULL_MASK, (u32)(e >> GG_RING_TAG_SHIFT) == tag);
        // the entries posted in a row from `head` (a later one waits for
        // an earlier one whose host thread has not written it yet)
        const u32 n = bal == FULL_MASK ? 32u : __ffs(~bal) - 1u;
        if (n == 0) {
            ++idle;
            nanosleep_ns(idle < 65536 ? 32u : P.max_sleep_ns);
            continue;
        }
        idle = 0;
        // when this poll saw the entries (the breakdown's dispatch time)
        const u64 seen = globaltimer();
        for (u32 j = 0; j < n; j++) {
#ifndef GG_SERIAL_DISPATCH
            // requests in a row: copied together (-DGG_SERIAL_DISPATCH:
            // one after the other, the A/B); a poll's last entry alone
            // takes the serial copy, 0.5 us shorter for one request (H200:
            // copy 1.3-1.4 us against 1.8-2.0 at one thread)
            const u32 next = j + 1u < n ? copy_requests(P, e, j, n, seen, lane) : j;
            if (next > j) {
                j = next - 1u;
                continue;
            }
#endif
            const u64 ej = __shfl_sync(FULL_MASK, e, j);
            const u32 slot = (u32)(ej >> GG_RING_SLOT_SHIFT) & GG_RING_LEN_MASK;
            if (slot == GG_RING_QUIT) {
                for (u32 s = lane; s < slots; s += 32) st_release_gpu(cmd + s, GG_CMD_QUIT);
                return;
            }
            if (slot == GG_RING_PATCH) {
                // applied before any query posted after it is dispatched
                apply_staged_patch(P, lane);
                continue;
            }
            const u32 chunks = (u32)ej & GG_RING_LEN_MASK;
            const unsigned char* src = (const unsigned char*)P.staging + (u64)slot * P.req_stride;
            unsigned char* dst = (unsigned char*)P.reqs + (u64)slot * P.req_stride;
            copy_from_host<16>(dst, src, chunks * 16u, lane, 32u);
            const u64 copied = globaltimer();
            // the copy's stores of every lane before lane 0's below
            __syncwarp();
            // RequestHead.cmd: lane 0 stored that word itself, and reads it
            // back from L2 (.cg)
            u32 c = 0;
            if (lane == 0) {
                RequestHead* h = (RequestHead*)dst;
                h->seen = (u32)seen;
                h->copy_ns = (u32)(copied - seen);
                c = ld_cg_u32(dst);
            }
            c = __shfl_sync(FULL_MASK, c, 0);
            // the request before its slot word: the release alone orders
            // every lane's copy (the __syncwarp above) before the word;
            // -DGG_FENCE_TWICE fences first as well (the A/B)
#ifdef GG_FENCE_TWICE
            __threadfence();
            __syncwarp();
#endif
            if (lane == 0) st_release_gpu(cmd + slot, c);
        }
        head += n;
    }
}

#ifndef GG_IDLE_FAST
#define GG_IDLE_FAST 256u
#endif
#define IDLE_FAST GG_IDLE_FAST

// The one parameter is __grid_constant__: read in place from the parameter
// space. Without it the compiler copies the struct to local memory, and the
// kernel drops from 154 registers to 128 with spills (about 15% fewer
// queries/s at 64 threads on an H200).
extern "C" __global__ void __launch_bounds__(32 * GG_WARPS)
    search_persistent(const __grid_constant__ SearchParams P) {
    const IndexDesc* indexes = (const IndexDesc*)P.indexes;
    u32* cmd = (u32*)P.cmd;
    u64* visited = (u64*)P.visited;
    u32* done = (u32*)P.done;
    u32* finish = (u32*)P.finish;
    const u32 list_cap = P.list_cap, max_qwords = P.max_qwords, k_max = P.k_max;
    extern __shared__ __align__(16) unsigned char smem[];
    const Smem S = carve(smem, max_qwords, list_cap);

    const u32 lane = threadIdx.x & 31u;
    if (P.doorbell != 0 && blockIdx.x == gridDim.x - 1u) {
        if (threadIdx.x < 32) dispatch(P, lane);
        return;
    }
#if GG_WARPS > 1
    if (threadIdx.x >= 32) {
        team_helper(threadIdx.x >> 5, lane);
        return;
    }
#endif
    const u32 slot = blockIdx.x / P.ctas_per_slot;
    const u32 t = blockIdx.x - slot * P.ctas_per_slot;
    const u32 vmask = (1u << P.visited_log2) - 1u;
    u64* table = visited + ((u64)slot << P.visited_log2);
    const RequestHead* req = (const RequestHead*)(P.reqs + (u64)slot * P.req_stride);
    ResultHead* out = (ResultHead*)(P.results + (u64)slot * P.result_stride + (u64)t * P.cta_block);
    ResultHit* hits = (ResultHit*)(out + 1);
    u64* rows_out = (u64*)(hits + k_max);

    u32 last = 0, idle = 0;
    // this CTA's last answer: its hits written -> its finish word stored (ns)
    u32 fence_ns = 0;
    for (;;) {
        u32 c = 0;
        if (lane == 0) c = ld_acquire_u32(cmd + slot);
        c = __shfl_sync(FULL_MASK, c, 0);
        if (c == last) {
            // idle: back off, deeper the longer the slot stays idle; the
            // first ~100 us of polls short, so that a client's next query
            // (one client through SQL: ~60 us between a slot's queries)
            // is seen within a poll's round trip, not after a 512 ns nap
            ++idle;
            const u32 ns = idle < IDLE_FAST ? 64u : idle < 2048 ? 512u : idle < 65536 ? 4096u : P.max_sleep_ns;
            nanosleep_ns(ns);
            continue;
        }
        __syncwarp();
        if (c == GG_CMD_QUIT) {
            team_quit(lane);
            return;
        }
        if (c == GG_CMD_FAULT) {
            // test switch: an illegal address, which poisons the context
            volatile u32* bad = (volatile u32*)(u64)0x10;
            *bad = lane;
            asm volatile("trap;");
        }
        last = c;
        idle = 0;
        const u32 ctas = (c & 31u) + 1u;
        if (t >= ctas) continue;  // this CTA sits the query out
        const u64 picked = globaltimer();
        // the request is in device memory before cmd changed (stream order,
        // or the dispatcher's fence);
        // its own sequence word says so (and nobody rewrites it before this
        // CTA arrives below); the other fields are read beside it, in the
        // same round trip, and again with it when it did not say so
        CtaPlan p;
        u32 qwords, xi, xgen, seen, copy_ns;
        // (-DGG_SERIAL_HEAD: the word, the fields, then the descriptor and
        // the query, each a round trip of its own: the A/B)
#ifdef GG_SERIAL_HEAD
        while (ld_cg_u32(&req->cmd) != c) nanosleep_ns(32);
#endif
        for (;;) {
            const u32 rc = ld_cg_u32(&req->cmd);
            p.k = ld_cg_u32(&req->k);
            p.cap = ld_cg_u32(&req->list);
            p.max_expand = ld_cg_u32(&req->max_expand);
            p.offset_beam = ld_cg_u32(&req->offset_beam);
            p.beam = ld_cg_u32(&req->beam);
            p.seeds = ld_cg_u32(&req->seeds);
            p.scan = ld_cg_u32(&req->scan);
            qwords = ld_cg_u32(&req->qwords);
            xi = ld_cg_u32(&req->index);
            xgen = ld_cg_u32(&req->gen);
            seen = ld_cg_u32(&req->seen);
            copy_ns = ld_cg_u32(&req->copy_ns);
            if (rc == c) break;
            nanosleep_ns(32);
        }
        const u64 c0 = cycles();
        IndexDesc ix;
        load_desc(indexes, P.n_indexes, xi, ix);
        // the query's loads beside the descriptor's: one round trip for both
#ifndef GG_SERIAL_HEAD
        if (qwords <= max_qwords) load_query((const u32*)(req + 1), S.q, qwords, lane);
#endif
        const bool ok = desc_usable(ix, xi, P.n_indexes, xgen) && p.cap > 0 && p.cap <= list_cap && p.k <= k_max &&
                        qwords <= max_qwords;
        u32 written = 0, expanded = 0, computed = 0, steps = 0;
        u64 started = picked, searched = picked;
        Phases ph = {0, 0, 0};
        if (ok) {
#ifdef GG_SERIAL_HEAD
            load_query((const u32*)(req + 1), S.q, qwords, lane);
#endif
            written = search_one(ix, S, table, vmask, c, t, ctas, p, 0, hits, rows_out, expanded, computed, steps,
                                 started, ph, lane);
            searched = globaltimer();
        } else {
            expanded = GG_OUT_BAD_INDEX;
        }
        if (lane == 0) {
            unsigned char* o = (unsigned char*)out;
            st_v4(o + 16, (u32)picked, (u32)(picked >> 32), (u32)(started - picked), (u32)(searched - picked));
            st_v4(o + 32, steps, (u32)(cycles() - c0), (u32)ph.claim, (u32)ph.dist);
            // (the host leaves `seen` 0: no doorbell, no dispatch time)
            st_v4(o + 48, (u32)ph.merge, seen != 0 ? (u32)picked - seen : 0u, copy_ns, fence_ns);
            st_v4(out, c, written, expanded, computed);
        }
        // every lane's hits before lane 0's finish word or count: the
        // __syncwarp orders them before lane 0's release (the word's, or
        // the count's acq_rel), which is cumulative; no fence of its own
        // (-DGG_FENCE_TWICE: fence.sc.sys here and before the word after
        // the count too, the A/B: one query's finish 2.4 -> 1.1 us)
#ifdef GG_FENCE_TWICE
        fence_sys();
#endif
        __syncwarp();
        // (-DGG_ALWAYS_COUNT: every query counts its CTAs, the A/B of
        // docs/benchmarks.md)
#ifndef GG_ALWAYS_COUNT
#define GG_ALWAYS_COUNT 0
#endif
        if (lane == 0 && ctas == 1 && !GG_ALWAYS_COUNT) {
            // alone: no count of the CTAs that finished
            st_release_sys(finish + (u64)slot * P.finish_stride, c);
        } else if (lane == 0) {
            // release: this CTA's hits before its count; acquire: the
            // other CTAs' before the word
            const u32 a = atom_add_sys(done + slot, 1u);
            if (a == ctas - 1) {
                // the last CTA of the query: reset the counter, then Finish
                atomicExch(done + slot, 0u);
#ifdef GG_FENCE_TWICE
                fence_sys();
#endif
                st_release_sys(finish + (u64)slot * P.finish_stride, c);
            }
        }
        fence_ns = (u32)(globaltimer() - searched);
        __syncwarp();
    }
}

// The large-batch search (TSDG's and CAGRA's "large batch" regime): n
// queries in device memory, one single-warp CTA a query, block b taking
// queries b, b + gridDim.x, ... with its own visited table, whose
// generation is visit_base + (the block's query number): the host moves
// visit_base past every launch, so no table is ever cleared between
// queries or batches. Each query is the persistent kernel's search with one
// CTA (the CPU's beam search); its first k live hits go to hits[q * k ..],
// their count to counts[q] (GG_OUT_BAD_INDEX when the index is not loaded
// at generation `gen`). Launched on its own stream beside the persistent
// kernel, which keeps its resident blocks: this kernel takes whatever the
// SMs have left, and its blocks simply wait for room.
// Resident blocks per SM the batch kernel is compiled for (the host passes
// -DGG_BATCH_MIN_BLOCKS=n): more blocks, fewer registers each. 16 gives 128
// registers (a few bytes spilled) against the persistent kernel's 154: its
// warps then fit wherever one of the persistent kernel's would, and on an
// H200 it served 10-20% more queries/s than at 160. Without a bound (1)
// ptxas took 255, which no SM sub-partition beside the persistent kernel's
// warps could hold: its blocks never started.
#ifndef GG_BATCH_MIN_BLOCKS
#define GG_BATCH_MIN_BLOCKS 16
#endif
extern "C" __global__ void __launch_bounds__(32, GG_BATCH_MIN_BLOCKS)
    search_batch(const __grid_constant__ BatchParams P) {
    extern __shared__ __align__(16) unsigned char smem[];
    const Smem S = carve(smem, P.qwords, P.list);
    const u32 lane = threadIdx.x;
    const u32 vmask = (1u << P.visited_log2) - 1u;
    u64* table = (u64*)P.visited + ((u64)blockIdx.x << P.visited_log2);
    u32* counts = (u32*)P.counts;
    IndexDesc ix;
    load_desc((const IndexDesc*)P.indexes, P.n_indexes, P.index, ix);
    const bool ok = desc_usable(ix, P.index, P.n_indexes, P.gen);
    CtaPlan p;
    p.k = P.k;
    p.cap = P.list;
    p.max_expand = P.max_expand;
    p.offset_beam = P.offset_beam;
    p.beam = P.beam;
    p.seeds = 0;
    p.scan = 0;
    u32 j = 0;
    for (u32 qi = blockIdx.x; qi < P.n; qi += gridDim.x, ++j) {
        u32 written = GG_OUT_BAD_INDEX, expanded = 0, computed = 0, steps = 0;
        u64 started = 0;
        Phases ph = {0, 0, 0};
        if (ok) {
            load_query((const u32*)P.queries + (u64)qi * P.qwords, S.q, P.qwords, lane);
            ResultHit* hits = (ResultHit*)P.hits + (u64)qi * P.k;
            written = search_one(ix, S, table, vmask, P.visit_base + j, 0, 1, p, P.width, hits, nullptr, expanded, computed,
                                 steps, started, ph, lane);
        }
        if (lane == 0) counts[qi] = written;
        __syncwarp();
    }
}

// A patch's copies to a resident index (Registry::patch, registry.rs), in
// one launch: the driver's batched copy took ~1 us for each of a patch's
// scattered lists (an insert changes ~35), on the thread that also takes
// the worker's queries. `n` PatchCopy at byte `at` of the inbox, one warp a
// copy. Launched beside the persistent kernel only where the batch kernel
// may be (its single-warp blocks, fewer registers: they fit where one of
// the persistent kernel's would).
extern "C" __global__ void __launch_bounds__(32) apply_patch(const u8* __restrict__ inbox, u32 at, u32 n) {
    const PatchCopy* copies = (const PatchCopy*)(inbox + at);
    const u32 lane = threadIdx.x;
    for (u32 i = blockIdx.x; i < n; i += gridDim.x) {
        const PatchCopy c = copies[i];
        const u8* src = inbox + c.src;
        u8* dst = (u8*)c.dst;
        // aligned words (the host aligns every copy's bytes to 16): a query
        // reading a list meanwhile sees each id old or new, never half of
        // one; bytes only for a run of flags
        const u64 align = c.dst | c.src | c.len;
        if ((align & 15u) == 0) {
            for (u32 w = lane; w < c.len / 16; w += 32) ((uint4*)dst)[w] = ((const uint4*)src)[w];
        } else if ((align & 3u) == 0) {
            for (u32 w = lane; w < c.len / 4; w += 32) ((u32*)dst)[w] = ((const u32*)src)[w];
        } else {
            for (u32 b = lane; b < c.len; b += 32) dst[b] = src[b];
        }
    }
}
