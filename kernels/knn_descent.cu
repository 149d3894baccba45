// GNN-Descent (Tagore, "Scalable graph indexing using GPUs", section 4,
// Algorithm 1): an approximate k-NN graph in two phases, every step on the
// device (crates/gpu/src/knn_descent.rs runs them).
//
//   init     each list GG_GNND_K random neighbours, all "new"
//   phase 1  NN-Descent's local join with shared samples: a node's nearest
//            new and old neighbours plus the nodes that sampled it (reverse
//            new and old), 32 rows whose pairwise products are one 32 x 32
//            tensor-core tile (mma.sync m16n8k16 over the fp16 rows staged
//            by knn_exact.cu's knn_prep, fp32 accumulate, norms added in
//            fp32). New-new and new-old pairs count; each row keeps its
//            nearest column of every 8-column MMA tile (the paper's "closest
//            node within each warp", several candidates a row, not GNND's
//            one) and offers it to that row's node when it beats the node's
//            farthest neighbour. Offers land in a per-node buffer (one atomic
//            claim a slot); gnnd_merge then merges each buffer into its list
//            with one warp a node and no lock ("lock-free merging").
//   phase 2  node-specific sampling: each node reads the lists of its
//            GG_GNND_EXPAND nearest neighbours not expanded before (never
//            revisited: the "done" flag) and merges the nearer of their
//            neighbours into its own list.
//
// Distances here are |a|^2 + |b|^2 - 2 a.b over the fp16 copy (exact for
// integer data such as SIFT's, approximate for floats); knn_exact.cu's
// knn_rerank then recomputes the final lists' distances in fp32 and orders
// them, as it does for the exact graph.
//
// Decisions where the paper is silent: sample sizes (8 of each kind, so one
// join is one 32-row tile), m = 2 in phase 2, candidates a round
// (GG_GNND_CAND; offers beyond are dropped, as NN-Descent's bounded
// samples are), and reverse samples claimed first come first served.

#include "common.cuh"

#define K GG_GNND_K
#define CAND GG_GNND_CAND
#define SAMPLE GG_GNND_SAMPLE
#define NEW_F GG_GNND_NEW
#define DONE_F GG_GNND_DONE
#define ID_MASK GG_GNND_ID_MASK
#define EMPTY 0xFFFFFFFFFFFFFFFFull
#define KC GG_KNN_KC
#define STR (GG_KNN_KC + GG_KNN_KPAD)  // halves a staged row takes in shared memory

__device__ __forceinline__ u32 gid(u64 s) { return (u32)s & ID_MASK; }
__device__ __forceinline__ float gdist(u64 s) { return s == EMPTY ? __int_as_float(0x7f800000) : slot_dist(s); }

// A squared distance from norms and a product, never below +0 (a -0's bits
// would sort as the largest key).
__device__ __forceinline__ float from_dot(float na, float nb, float dot, float inv_scale2) {
    const float d = na + nb - 2.f * dot * inv_scale2;
    return d > 0.f ? d : 0.f;
}

__device__ __forceinline__ u32 warp_id() { return blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); }

// Dot product of two staged fp16 rows (dk halves, dk a multiple of 8) by one
// lane; the squared distance from the fp32 norms.
__device__ __forceinline__ float staged_dist(const u16* __restrict__ Xh, const float* __restrict__ norms, u32 dk,
                                             float inv_scale2, u32 a, u32 b) {
    const uint4* pa = (const uint4*)(Xh + (size_t)a * dk);
    const uint4* pb = (const uint4*)(Xh + (size_t)b * dk);
    float acc0 = 0.f, acc1 = 0.f;
    for (u32 o = 0; o < dk / 8; ++o) {
        const uint4 x = __ldg(pa + o), y = __ldg(pb + o);
        acc0 = fmaf(h2f(x.x & 0xffff), h2f(y.x & 0xffff), acc0);
        acc1 = fmaf(h2f(x.x >> 16), h2f(y.x >> 16), acc1);
        acc0 = fmaf(h2f(x.y & 0xffff), h2f(y.y & 0xffff), acc0);
        acc1 = fmaf(h2f(x.y >> 16), h2f(y.y >> 16), acc1);
        acc0 = fmaf(h2f(x.z & 0xffff), h2f(y.z & 0xffff), acc0);
        acc1 = fmaf(h2f(x.z >> 16), h2f(y.z >> 16), acc1);
        acc0 = fmaf(h2f(x.w & 0xffff), h2f(y.w & 0xffff), acc0);
        acc1 = fmaf(h2f(x.w >> 16), h2f(y.w >> 16), acc1);
    }
    return from_dot(norms[a], norms[b], acc0 + acc1, inv_scale2);
}

// Ascending bitonic sort of one 64-bit key a lane.
__device__ __forceinline__ u64 warp_sort(u64 v, u32 lane) {
    for (u32 k = 2; k <= 32; k <<= 1)
        for (u32 j = k >> 1; j > 0; j >>= 1) {
            const u64 o = __shfl_xor_sync(FULL_MASK, v, j);
            const bool keep_min = ((lane & j) == 0) == ((lane & k) == 0);
            v = keep_min ? (o < v ? o : v) : (o > v ? o : v);
        }
    return v;
}

// The 32 smallest of two ascending lists (one key a lane each), ascending:
// a[i] against b[31 - i] leaves a bitonic sequence of them, then merged.
__device__ __forceinline__ u64 warp_merge_low(u64 a, u64 b, u32 lane) {
    const u64 rb = __shfl_sync(FULL_MASK, b, 31 - lane);
    u64 v = a < rb ? a : rb;
    for (u32 j = 16; j > 0; j >>= 1) {
        const u64 o = __shfl_xor_sync(FULL_MASK, v, j);
        v = (lane & j) == 0 ? (o < v ? o : v) : (o > v ? o : v);
    }
    return v;
}

// An id no slot holds (ids are masked to 30 bits): asks in_list nothing.
#define NOT_AN_ID 0xFFFFFFFFu

// Whether id is in the warp's list (one slot a lane). Warp-wide: every lane
// calls it, with NOT_AN_ID when it has nothing to ask.
__device__ __forceinline__ bool in_list(u64 list, u32 id) {
    bool found = false;
    for (u32 src = 0; src < 32; ++src) {
        const u64 s = __shfl_sync(FULL_MASK, list, src);
        found |= s != EMPTY && gid(s) == id;
    }
    return found;
}

// Drops (to EMPTY) a key whose id a lower lane's key also has.
__device__ __forceinline__ u64 drop_repeats(u64 c, u32 lane) {
    bool repeat = false;
    for (u32 src = 0; src < 32; ++src) {
        const u64 s = __shfl_sync(FULL_MASK, c, src);
        repeat |= src < lane && s != EMPTY && c != EMPTY && gid(s) == gid(c);
    }
    return repeat ? EMPTY : c;
}

// Merges candidates c (one a lane, EMPTY for none; flags as they should be
// stored) into the ascending list; the new list, and how many candidates
// entered it (on every lane).
__device__ __forceinline__ u64 merge_into(u64 list, u64 c, u32 lane, u32* entered) {
    if (in_list(list, c == EMPTY ? NOT_AN_ID : gid(c))) c = EMPTY;
    c = drop_repeats(c, lane);
    c = warp_sort(c, lane);
    const u64 merged = warp_merge_low(list, c, lane);
    // a candidate entered if its key is in the merged list
    bool kept = false;
    for (u32 src = 0; src < 32; ++src) kept |= __shfl_sync(FULL_MASK, merged, src) == c && c != EMPTY;
    *entered = __popc(__ballot_sync(FULL_MASK, kept));
    return merged;
}

// Random lists: lane i of node v's warp draws one neighbour (never v).
extern "C" __global__ void gnnd_init(const u16* __restrict__ Xh, const float* __restrict__ norms, u32 n, u32 dk,
                                     float inv_scale2, u64 seed, u64* __restrict__ lists) {
    const u32 lane = threadIdx.x & 31, v = warp_id();
    if (v >= n) return;
    u32 r = (u32)(mix64(seed ^ ((u64)v * K + lane + 1)) % (u64)(n - 1));
    if (r >= v) ++r;
    u64 s = pack_slot(staged_dist(Xh, norms, dk, inv_scale2, v, r), r | NEW_F);
    s = warp_sort(drop_repeats(s, lane), lane);
    lists[(size_t)v * K + lane] = s;
}

// Phase 1, the samples: each node's SAMPLE nearest new neighbours (then no
// longer new) and SAMPLE nearest old ones, and the node offered to each of
// them as a reverse sample (first come first served, SAMPLE at most).
extern "C" __global__ void gnnd_sample(u64* __restrict__ lists, u32 n, u32* __restrict__ fwd,
                                       u32* __restrict__ rev, u32* __restrict__ rev_cnt) {
    const u32 lane = threadIdx.x & 31, v = warp_id();
    if (v >= n) return;
    u64 s = lists[(size_t)v * K + lane];
    const bool valid = s != EMPTY;
    const bool is_new = valid && ((u32)s & NEW_F);
    const bool is_old = valid && !is_new;
    const u32 rank_new = __popc(__ballot_sync(FULL_MASK, is_new) & lanemask_lt());
    const u32 rank_old = __popc(__ballot_sync(FULL_MASK, is_old) & lanemask_lt());
    u32* f = fwd + (size_t)v * 2 * SAMPLE;  // [new | old]
    if (lane < 2 * SAMPLE) f[lane] = GG_NO_NODE;
    __syncwarp();
    const u32 u = gid(s);
    if (is_new && rank_new < SAMPLE) {
        f[rank_new] = u;
        lists[(size_t)v * K + lane] = s & ~(u64)NEW_F;
        const u32 at = atomicAdd(rev_cnt + 2 * (size_t)u, 1u);
        if (at < SAMPLE) rev[(size_t)u * 2 * SAMPLE + at] = v;
    }
    if (is_old && rank_old < SAMPLE) {
        f[SAMPLE + rank_old] = u;
        const u32 at = atomicAdd(rev_cnt + 2 * (size_t)u + 1, 1u);
        if (at < SAMPLE) rev[(size_t)u * 2 * SAMPLE + SAMPLE + at] = v;
    }
}

// Phase 1, the local join: one warp a node, its 32 sampled ids (rows 0-15
// new: forward then reverse; 16-31 old) staged KC dimensions at a time, the
// 32 x 32 products on the tensor cores (2 x 4 MMA tiles).
extern "C" __global__ void __launch_bounds__(GG_GNND_WARPS * 32)
    gnnd_join(const u16* __restrict__ Xh, const float* __restrict__ norms, u32 n, u32 dk, float inv_scale2,
              const u64* __restrict__ lists, const u32* __restrict__ fwd, const u32* __restrict__ rev,
              const u32* __restrict__ rev_cnt, u64* __restrict__ cand, u32* __restrict__ cand_cnt) {
    extern __shared__ __align__(16) unsigned char smem[];
    const u32 lane = threadIdx.x & 31, v = warp_id();
    if (v >= n) return;
    u16* rows = (u16*)smem + (threadIdx.x >> 5) * 32 * STR;
    // lane i holds row i's id: new forward, new reverse, old forward, old reverse
    const u32 part = lane / SAMPLE, j = lane % SAMPLE;
    u32 id;
    if (part == 0) id = fwd[(size_t)v * 2 * SAMPLE + j];
    else if (part == 2) id = fwd[(size_t)v * 2 * SAMPLE + SAMPLE + j];
    else {
        const u32 kind = part == 1 ? 0 : 1;
        id = j < rev_cnt[2 * (size_t)v + kind] ? rev[(size_t)v * 2 * SAMPLE + kind * SAMPLE + j] : GG_NO_NODE;
    }
    const bool valid = id != GG_NO_NODE;
    const float norm = valid ? norms[id] : 0.f;
    // the farthest neighbour of the row's node: offers must beat it
    const float worst = valid ? gdist(lists[(size_t)id * K + K - 1]) : 0.f;
    if (__ballot_sync(FULL_MASK, valid) == 0) return;

    const u32 g = lane >> 2, t = lane & 3;
    float acc[2][4][4];
    zero_tiles(acc);
    for (u32 c0 = 0; c0 < dk; c0 += KC) {
        // 32 rows x KC halves = 256 16-byte pieces, 8 a lane
        for (u32 p = lane; p < 32 * KC / 8; p += 32) {
            const u32 r = p / (KC / 8), q = p % (KC / 8);
            const u32 rid = __shfl_sync(FULL_MASK, id, r);
            uint4 x = make_uint4(0, 0, 0, 0);
            if (rid != GG_NO_NODE) x = __ldg((const uint4*)(Xh + (size_t)rid * dk + c0) + q);
            *(uint4*)(rows + r * STR + q * 8) = x;
        }
        __syncwarp();
#pragma unroll
        for (u32 kk = 0; kk < KC; kk += 16) {
            u32 a[2][4], b[4][2];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                const u16* r0 = rows + (mi * 16 + g) * STR + kk + 2 * t;
                a[mi][0] = *(const u32*)r0;
                a[mi][1] = *(const u32*)(r0 + 8 * STR);
                a[mi][2] = *(const u32*)(r0 + 8);
                a[mi][3] = *(const u32*)(r0 + 8 * STR + 8);
            }
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const u16* r0 = rows + (ni * 8 + g) * STR + kk + 2 * t;
                b[ni][0] = *(const u32*)r0;
                b[ni][1] = *(const u32*)(r0 + 8);
            }
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni)
                    mma_16816(acc[mi][ni], a[mi][0], a[mi][1], a[mi][2], a[mi][3], b[ni][0], b[ni][1]);
        }
        __syncwarp();
    }
    // each row's nearest column of each 8-column tile, offered to the row
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 row = mi * 16 + g + 8 * h;
            const u32 rid = __shfl_sync(FULL_MASK, id, row);
            const float rnorm = __shfl_sync(FULL_MASK, norm, row);
            const float rworst = __shfl_sync(FULL_MASK, worst, row);
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                float best = __int_as_float(0x7f800000);
                u32 best_id = GG_NO_NODE;
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const u32 col = ni * 8 + 2 * t + e;
                    const u32 cid = __shfl_sync(FULL_MASK, id, col);
                    const float cnorm = __shfl_sync(FULL_MASK, norm, col);
                    // new-new and new-old pairs: rows and columns 0-15 are new
                    const bool pair = rid != GG_NO_NODE && cid != GG_NO_NODE && rid != cid && (row < 16 || col < 16);
                    const float d = from_dot(rnorm, cnorm, acc[mi][ni][2 * h + e], inv_scale2);
                    if (pair && key_lt(d, cid, best, best_id)) {
                        best = d;
                        best_id = cid;
                    }
                }
                // across the group's four lanes (the tile's 8 columns)
#pragma unroll
                for (u32 m = 1; m < 4; m <<= 1) {
                    const float od = __shfl_xor_sync(FULL_MASK, best, m);
                    const u32 oi = __shfl_xor_sync(FULL_MASK, best_id, m);
                    if (key_lt(od, oi, best, best_id)) {
                        best = od;
                        best_id = oi;
                    }
                }
                if (t == 0 && best_id != GG_NO_NODE && best < rworst) {
                    const u32 at = atomicAdd(cand_cnt + rid, 1u);
                    if (at < CAND) cand[(size_t)rid * CAND + at] = pack_slot(best, best_id);
                }
            }
        }
}

// Phase 1, the merge: each node's offers into its list (new ones flagged
// new), the offer buffer emptied; the entries that entered added to *stat.
extern "C" __global__ void gnnd_merge(u64* __restrict__ lists, u32 n, const u64* __restrict__ cand,
                                      u32* __restrict__ cand_cnt, unsigned long long* __restrict__ stat) {
    const u32 lane = threadIdx.x & 31, v = warp_id();
    if (v >= n) return;
    const u32 cnt = min(cand_cnt[v], CAND);
    if (cnt == 0) return;
    u64 c = lane < cnt ? cand[(size_t)v * CAND + lane] : EMPTY;
    if (c != EMPTY) c |= NEW_F;
    u32 entered;
    const u64 merged = merge_into(lists[(size_t)v * K + lane], c, lane, &entered);
    lists[(size_t)v * K + lane] = merged;
    if (lane == 0) {
        cand_cnt[v] = 0;
        atomicAdd(stat, (unsigned long long)entered);
    }
}

// Phase 2: each node reads the lists of its GG_GNND_EXPAND nearest
// neighbours not expanded yet and merges the nearer of their neighbours.
// A node's own warp alone writes its list; others may read it meanwhile
// (each slot one 64-bit store: whole, old or new).
extern "C" __global__ void gnnd_expand(const u16* __restrict__ Xh, const float* __restrict__ norms, u32 n, u32 dk,
                                       float inv_scale2, u64* __restrict__ lists,
                                       unsigned long long* __restrict__ stat) {
    const u32 lane = threadIdx.x & 31, v = warp_id();
    if (v >= n) return;
    u64 list = lists[(size_t)v * K + lane];
    const bool open = list != EMPTY && !((u32)list & DONE_F);
    const u32 ballot = __ballot_sync(FULL_MASK, open);
    const u32 rank = __popc(ballot & lanemask_lt());
    if (open && rank < GG_GNND_EXPAND) list |= DONE_F;
    // the neighbours to expand, read before the merges move the list
    u32 expand[GG_GNND_EXPAND];
    u32 left = ballot;
#pragma unroll
    for (u32 e = 0; e < GG_GNND_EXPAND; ++e) {
        expand[e] = left ? gid(__shfl_sync(FULL_MASK, list, __ffs(left) - 1)) : GG_NO_NODE;
        left &= left - 1;
    }
    u32 entered_all = 0;
#pragma unroll
    for (u32 e = 0; e < GG_GNND_EXPAND; ++e) {
        if (expand[e] == GG_NO_NODE) break;  // warp-uniform
        const u64 s = lists[(size_t)expand[e] * K + lane];
        const u32 x = s == EMPTY || gid(s) == v ? NOT_AN_ID : gid(s);
        // neighbours v has already cost no distance
        const bool known = in_list(list, x);
        const float worst = gdist(__shfl_sync(FULL_MASK, list, 31));
        u64 c = EMPTY;
        if (x != NOT_AN_ID && !known) {
            const float d = staged_dist(Xh, norms, dk, inv_scale2, v, x);
            if (d < worst) c = pack_slot(d, x);
        }
        u32 entered;
        list = merge_into(list, c, lane, &entered);
        entered_all += entered;
    }
    lists[(size_t)v * K + lane] = list;
    if (lane == 0 && entered_all) atomicAdd(stat, (unsigned long long)entered_all);
}

// The lists' ids (n x K, NO_NODE where empty), for knn_rerank.
extern "C" __global__ void gnnd_ids(const u64* __restrict__ lists, u32 n, u32* __restrict__ ids) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * K) return;
    const u64 s = lists[i];
    ids[i] = s == EMPTY ? GG_NO_NODE : gid(s);
}
