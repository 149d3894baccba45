// GRNND ("GRNND: A GPU-Parallel Relative NN-Descent Algorithm for Efficient
// Approximate Nearest Neighbor Graph Construction", Algorithms 3-6), over
// squared L2 between stored vectors; plus the graph kernels that share its
// distance: the final cut, the fp16 copy, and the prune of given lists.
//
// Compiled at run time by NVRTC (crates/gpu/src/nvrtc.rs) with abi.h and
// common.cuh handed over from memory.
//
// Layout (abi.h)
//   X      n rows of `dp` values, dp = the stored dimension rounded up to a
//          multiple of 4 and zero-padded (vector loads; same L2 distance).
//          fp32, or fp16 when the host found every value exactly
//          representable in fp16 (SIFT's integers 0..255 are): the same
//          distances for half the memory traffic. Never a lossy fp16 copy.
//   pool   n x R slots of 64 bits, one per candidate: the distance to the
//          pool's owner, the "new" bit (not yet tested against the other
//          candidates of the same pool: NN-Descent's new/old flag) and the id
//          (hence n < 2^31); GG_POOL_EMPTY = all ones.
//          Storing the distance in the slot (one 64-bit word) means that
//          neither the replace-farthest step of Algorithm 6 nor the pair test
//          ever recomputes d(v, n): the paper leaves this open; recomputing R
//          distances per insert is ruinous at high dimension.
//   cnt    n claim counters per pool buffer (slots [0, min(cnt, R)) are
//          claimed; see warp_insert).
//
// Decisions on the paper's gaps (each one is also commented where it lives):
//   * Pair schedule ("random neighbour pairs", Alg. 4 line 3): each round
//     every warp shuffles its vertex's pool (a fresh random key per
//     (round, vertex, neighbour)) and runs RNN-Descent's accepted-set scan in
//     that order: every candidate is tested against the candidates accepted
//     before it. This is the reading that fits the paper's ascending /
//     descending / random ablation (Fig. 7), it evaluates each pair at most
//     once, and it is Algorithm 2 (the CPU builder's scan) when the order is
//     ascending (mode bit GG_MODE_ASCENDING, for measurements).
//   * Redirect rule: the engine's one prune rule (common.cuh's occludes, the
//     same as gpu_graph_engine::prune::occludes: <=, a copy of v prunes only
//     copies), applied symmetrically: the farther of the pair (by distance
//     to v, ties by id) leaves v's pool and is offered to the nearer one's
//     pool. In a random order the farther one can be an already accepted
//     candidate: it is then removed ("mark n_far <- bot", Alg. 4 line 8) and
//     the scan goes on with the current candidate. (GRNND's Eq. 2 prunes on
//     strict <; one rule for every builder, insert and repair keeps the GPU
//     and CPU graphs alike, and filter.cu's RNG filter, the same occludes, is
//     checked list for list against the engine's rng_prune.)
//   * Old-old pairs are not re-tested: two candidates that both survived the
//     previous round of the same pool were already tested against each other
//     (Ono & Matsui's flags). An accepted candidate keeps its flag until the
//     end of the scan, as in the CPU builder. Redirected and reverse edges
//     arrive as "new".
//   * Double buffer: each round reads pool_in and writes pool_out, which the
//     host cleared; survivors and redirects both go to pool_out (Alg. 4 lines
//     7 and 13) and race only for slots, which the inserts arbitrate with
//     atomics. A redirect waits for the next round (Jacobi order), as in the
//     CPU builder.
//   * Insert races (Alg. 6): the de-duplication scan and the slot claim are
//     separate steps, so two warps can insert the same id into one pool at
//     the same time. We accept that rare duplicate instead of locking: the
//     next round's scan drops a candidate equal to an accepted one, and the
//     final cut de-duplicates. Free slots are claimed with one atomicAdd on
//     the pool's counter (never two writers for a slot); a full pool's
//     replace-farthest is a compare-and-swap on the farthest slot, retried a
//     few times when another warp changed the pool in between.
//   * Alg. 6 step 3 as printed writes pool[tid], right only for R <= 32: the
//     farthest slot is found by a warp max-reduction over (slot value, index)
//     and lane 0 swaps it. The new candidate replaces it only when strictly
//     nearer.
//   * Reverse edges (Alg. 3 line 14): "the top rho*k neighbours" = the
//     ceil(rho*k) nearest entries of the pool, k = its size (as the CPU
//     builder), read from a snapshot (the current buffer) and inserted into
//     the other buffer, which starts as a copy of it, so no warp reads a pool
//     that reverse inserts are changing.
//   * The final cut (grnnd_finish) is gpu_graph_engine::graph::final_cut,
//     done here so that only n x degree ids cross the bus instead of n x R
//     pool slots; the build check compares the two list for list.

#include "common.cuh"

#define NEW_BIT GG_POOL_NEW_BIT
#define ID_MASK GG_POOL_ID_MASK
#define EMPTY_SLOT GG_POOL_EMPTY
#define NO_NODE GG_NO_NODE
// Tries of the compare-and-swap of a full pool's farthest slot.
#define REPLACE_TRIES 4

__device__ __forceinline__ u32 slot_id(u64 s) { return (u32)s & ID_MASK; }

__device__ __forceinline__ u64 load_slot(const u64* p) {
    // pools are written by other warps during a round
    return *(const volatile u64*)p;
}
__device__ __forceinline__ void store_slot(u64* p, u64 v) { *(volatile u64*)p = v; }

// Algorithm 6, warp-cooperative: offers x (at distance d from u) to u's pool.
// All 32 lanes call it with the same arguments. Returns whether x entered.
__device__ bool warp_insert(u64* __restrict__ pool, u32* __restrict__ cnt, u32 R, u32 u, u32 x, float d,
                           bool is_new, u32 lane) {
    if (u == x) return false;  // never a self loop
    u64* p = pool + (size_t)u * R;
    const u64 val = pack_slot(d, x | (is_new ? NEW_BIT : 0u));
    // Step 1: de-duplication (ballot over the pool).
    bool found = false;
    for (u32 i = lane; i < R; i += 32) {
        u64 s = load_slot(p + i);
        found |= (s != EMPTY_SLOT) && slot_id(s) == x;
    }
    if (__any_sync(FULL_MASK, found)) return false;
    // Step 2: a free slot, claimed with one atomic on the pool's counter: a
    // slot index below R belongs to this warp alone, so a plain store fills
    // it. (The printed algorithm counts valid entries: a read-then-write
    // race between warps.)
    u32 slot = 0;
    if (lane == 0) slot = atomicAdd(cnt + u, 1u);
    slot = __shfl_sync(FULL_MASK, slot, 0);
    if (slot < R) {
        if (lane == 0) store_slot(p + slot, val);
        return true;
    }
    // Step 3: the pool is full: replace the farthest slot if x is nearer.
    // Slots claimed but not yet written (still EMPTY) are not candidates, so
    // a claim never loses its slot.
    for (int attempt = 0; attempt < REPLACE_TRIES; ++attempt) {
        u64 mx = 0;
        u32 mi = 0;
        bool dup = false;
        for (u32 i = lane; i < R; i += 32) {
            u64 s = load_slot(p + i);
            dup |= (s != EMPTY_SLOT) && slot_id(s) == x;
            if (s != EMPTY_SLOT && s >= mx) {
                mx = s;
                mi = i;
            }
        }
        if (__any_sync(FULL_MASK, dup)) return false;
        for (u32 m = 16; m > 0; m >>= 1) {
            u64 omx = __shfl_xor_sync(FULL_MASK, mx, m);
            u32 omi = __shfl_xor_sync(FULL_MASK, mi, m);
            if (omx > mx || (omx == mx && omi > mi)) {
                mx = omx;
                mi = omi;
            }
        }
        if (mx == 0 || !(d < slot_dist(mx))) return false;
        bool ok = false;
        if (lane == 0) ok = atomicCAS(p + mi, mx, val) == mx;
        if (__shfl_sync(FULL_MASK, ok ? 1 : 0, 0)) return true;
    }
    return false;
}

// Per-warp scratch in dynamic shared memory: GG_GRNND_SCRATCH_WORDS arrays of R words.
struct WarpScratch {
    u32* cid;    // candidates: id | NEW_BIT
    float* cd;   // their distance to v
    u32* key;    // random sort key
    u32* order;  // visiting order (indices into cid)
    u32* aid;    // accepted: id | NEW_BIT
    float* ad;   // their distance to v; < 0 once removed
};

__device__ __forceinline__ WarpScratch scratch(u32 R) {
    extern __shared__ u32 smem_words[];
    u32* base = smem_words + (size_t)(threadIdx.x >> 5) * GG_GRNND_SCRATCH_WORDS * R;
    WarpScratch s;
    s.cid = base;
    s.cd = (float*)(base + R);
    s.key = base + 2 * R;
    s.order = base + 3 * R;
    s.aid = base + 4 * R;
    s.ad = (float*)(base + 5 * R);
    return s;
}

// Calls emit(position, slot) for each slot of v's pool that holds a
// candidate (not EMPTY, not v itself), the positions packed from 0 in slot
// order; returns how many. Whole warp.
template <typename Emit>
__device__ __forceinline__ u32 live_slots(const u64* __restrict__ pool, u32 v, u32 R, u32 lane, Emit emit) {
    u32 k = 0;
    for (u32 base = 0; base < R; base += 32) {
        const u32 i = base + lane;
        const u64 sl = i < R ? pool[(size_t)v * R + i] : EMPTY_SLOT;
        const bool valid = sl != EMPTY_SLOT && slot_id(sl) != v;
        const u32 m = __ballot_sync(FULL_MASK, valid);
        if (valid) emit(k + __popc(m & lanemask_lt()), sl);
        k += __popc(m);
    }
    __syncwarp();
    return k;
}

// Loads v's pool into (cid, cd) with each candidate's sort key; returns the
// count. Whole warp.
__device__ __forceinline__ u32 load_pool(const u64* __restrict__ pool, u32 v, u32 R, WarpScratch s, u32 lane,
                                         u64 rseed, bool ascending) {
    return live_slots(pool, v, R, lane, [&](u32 pos, u64 sl) {
        s.cid[pos] = (u32)sl;
        s.cd[pos] = slot_dist(sl);
        // Disordered propagation: a fresh random key per (round, v, id); or
        // ascending distance (a distance's float bits order as the float;
        // ties by position).
        s.key[pos] = ascending ? (u32)(sl >> 32) : (u32)mix64(rseed ^ ((u64)v << 31) ^ (u64)slot_id(sl));
    });
}

// One update round (Algorithm 4) for every vertex: one warp per vertex.
// Dynamic shared memory: GG_GRNND_SCRATCH_WORDS * R words per warp.
// The kernel is latency-bound (each warp walks its pool through dependent
// loads), so warps per SM matter more than registers: it is capped for 6
// blocks of 8 warps per SM (40 registers, a few spilled to L1) instead of the
// 60 registers, 4 blocks it would take. Measured on an H200, 1M SIFT: the
// 24 rounds take 437 ms capped at 6 blocks, 458 ms at 5, 549 ms uncapped.
__device__ __forceinline__ void update_body(const void* __restrict__ X, u32 half, u32 n, u32 dp, u32 G,
                                            const u64* __restrict__ pool_in, u64* __restrict__ pool_out,
                                            u32* __restrict__ cnt_out, u32 R, u64 seed, u32 round, u32 mode,
                                            u64* __restrict__ stats) {
    const u32 lane = threadIdx.x & 31;
    const u32 v = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (v >= n) return;  // whole warp
    const Vecs V = {X, dp, half};
    WarpScratch s = scratch(R);
    const u32 sub = lane & (G - 1);  // lane within its distance group
    const u32 grp = lane / G;        // group index
    const u32 P = 32 / G;            // distances per warp step
    u32 n_inserted = 0, n_dist = 0, n_redirect = 0;  // lane 0's counts

    const u64 rseed = mix64(seed ^ ((u64)round << 40) ^ 0x6a09e667f3bcc909ull);
    const u32 k = load_pool(pool_in, v, R, s, lane, rseed, (mode & GG_MODE_ASCENDING) != 0);
    // visiting order = rank of each key (ties by position)
    for (u32 i = lane; i < k; i += 32) {
        u32 ki = s.key[i], r = 0;
        for (u32 j = 0; j < k; ++j) {
            u32 kj = s.key[j];
            r += (kj < ki) || (kj == ki && j < i);
        }
        s.order[r] = i;
    }
    __syncwarp();

    // The accepted-set scan in that order, with the symmetric redirect rule.
    u32 na = 0;
    for (u32 t = 0; t < k; ++t) {
        const u32 ci = s.order[t];
        const u32 cI = s.cid[ci];
        const u32 c = cI & ID_MASK;
        const bool cnew = (cI & NEW_BIT) != 0;
        const float dvc = s.cd[ci];
        bool alive = true;
        for (u32 b32 = 0; b32 < na && alive; b32 += 32) {
            // the accepted entries of this chunk that need a test: not
            // removed, and not an old-old pair
            u32 j = b32 + lane;
            bool inr = j < na;
            u32 aI = inr ? s.aid[j] : 0u;
            float dva = inr ? s.ad[j] : -1.f;
            bool live = inr && dva >= 0.f;
            if (__any_sync(FULL_MASK, live && (aI & ID_MASK) == c)) {
                // the same id twice in one pool (an insert race): drop it
                alive = false;
                break;
            }
            bool need = live && (cnew || (aI & NEW_BIT) != 0);
            u32 needm = __ballot_sync(FULL_MASK, need);
            while (needm && alive) {
                // the next P entries to test, one per lane group, in order
                u32 pick = needm;
                for (u32 q = 0; q < grp && pick; ++q) pick &= pick - 1;
                bool act = pick != 0;
                u32 src = act ? (u32)(__ffs(pick) - 1) : 0u;
                for (u32 q = 0; q < P && needm; ++q) needm &= needm - 1;
                u32 jj = __shfl_sync(FULL_MASK, j, src);
                u32 aJ = __shfl_sync(FULL_MASK, aI, src);
                float dvj = __shfl_sync(FULL_MASK, dva, src);
                float d = group_dist(V, c, aJ & ID_MASK, sub, G, act);
                n_dist += __popc(__ballot_sync(FULL_MASK, act && sub == 0));
                // the one prune rule, the nearer of the pair kept
                const float dfar = fmaxf(dvc, dvj), dnear = fminf(dvc, dvj);
                const bool occ = act && sub == 0 && occludes(dnear, dfar, d);
                u32 occm = __ballot_sync(FULL_MASK, occ);
                // apply the occluders in accepted order (groups are in order)
                while (occm) {
                    u32 L = __ffs(occm) - 1;
                    occm &= occm - 1;
                    float dd = __shfl_sync(FULL_MASK, d, L);
                    u32 a = __shfl_sync(FULL_MASK, aJ, L) & ID_MASK;
                    float da = __shfl_sync(FULL_MASK, dvj, L);
                    u32 jx = __shfl_sync(FULL_MASK, jj, L);
                    bool c_near = dvc < da || (dvc == da && c < a);
                    ++n_redirect;
                    if (!c_near) {
                        // c is the farther: it goes to a's pool and leaves v's
                        n_inserted += warp_insert(pool_out, cnt_out, R, a, c, dd, true, lane);
                        alive = false;
                        break;
                    }
                    // the accepted a is the farther: it goes to c's pool and
                    // leaves v's; c is tested against the rest
                    n_inserted += warp_insert(pool_out, cnt_out, R, c, a, dd, true, lane);
                    if (lane == 0) s.ad[jx] = -1.f;
                    __syncwarp();
                }
            }
        }
        if (alive) {
            if (lane == 0) {
                s.aid[na] = cI;
                s.ad[na] = dvc;
            }
            ++na;
            __syncwarp();
        }
    }
    __syncwarp();

    // Survivors go to v's own next pool, as "old": each was tested against
    // every other survivor (Alg. 4 lines 11-14). Batched: one de-duplication
    // pass over the pool, one claim for all, then one store per lane.
    // (cid / cd are free now: they hold the compacted survivors.)
    u32 m = 0;
    for (u32 b = 0; b < na; b += 32) {
        u32 j = b + lane;
        bool live = j < na && s.ad[j] >= 0.f;
        u32 mm = __ballot_sync(FULL_MASK, live);
        if (live) {
            u32 pos = m + __popc(mm & lanemask_lt());
            s.cid[pos] = s.aid[j] & ID_MASK;
            s.cd[pos] = s.ad[j];
            s.key[pos] = 0;  // duplicate flag
        }
        m += __popc(mm);
    }
    __syncwarp();
    u64* pv = pool_out + (size_t)v * R;
    for (u32 base = 0; base < R; base += 32) {
        u64 sl = base + lane < R ? load_slot(pv + base + lane) : EMPTY_SLOT;
        u32 sid = sl != EMPTY_SLOT ? slot_id(sl) : NO_NODE;
        for (u32 q = 0; q < m; ++q)
            if (__any_sync(FULL_MASK, sid == s.cid[q]) && lane == 0) s.key[q] = 1;
    }
    __syncwarp();
    u32 m2 = 0;
    for (u32 b = 0; b < m; b += 32) {
        u32 q = b + lane;
        bool keep = q < m && s.key[q] == 0;
        u32 mm = __ballot_sync(FULL_MASK, keep);
        if (keep) s.order[m2 + __popc(mm & lanemask_lt())] = q;
        m2 += __popc(mm);
    }
    __syncwarp();
    if (m2 > 0) {
        u32 first = 0;
        if (lane == 0) first = atomicAdd(cnt_out + v, m2);
        first = __shfl_sync(FULL_MASK, first, 0);
        for (u32 i = lane; i < m2; i += 32) {
            u32 q = s.order[i];
            if (first + i < R) store_slot(pv + first + i, pack_slot(s.cd[q], s.cid[q]));
        }
        // a pool filled by redirects: the rest compete for the farthest slots
        for (u32 i = (first < R ? R - first : 0); i < m2; ++i) {
            u32 q = s.order[i];
            warp_insert(pool_out, cnt_out, R, v, s.cid[q], s.cd[q], false, lane);
        }
    }
    if (lane == 0) {
        if (n_inserted) atomicAdd(stats + GG_STAT_INSERTED, (u64)n_inserted);
        if (n_dist) atomicAdd(stats + GG_STAT_DISTANCES, (u64)n_dist);
        if (n_redirect) atomicAdd(stats + GG_STAT_REDIRECTS, (u64)n_redirect);
    }
}

extern "C" __global__ void __launch_bounds__(GG_GRNND_WARPS * 32, 6)
    grnnd_update(const void* __restrict__ X, u32 half, u32 n, u32 dp, u32 G, const u64* __restrict__ pool_in,
                 u64* __restrict__ pool_out, u32* __restrict__ cnt_out, u32 R, u64 seed, u32 round, u32 mode,
                 u64* __restrict__ stats) {
    update_body(X, half, n, dp, G, pool_in, pool_out, cnt_out, R, seed, round, mode, stats);
}

// Reverse edges (Algorithm 3 line 14, Sec. 3.6): for each pool of the
// snapshot, its ceil(rho * k) nearest entries u get v in u's pool of the
// other buffer (pool_out, a copy of the snapshot made by the host), as new.
extern "C" __global__ void grnnd_reverse(const u64* __restrict__ snap, u64* __restrict__ pool_out,
                                         u32* __restrict__ cnt_out, u32 n, u32 R, float rho) {
    const u32 lane = threadIdx.x & 31;
    const u32 v = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (v >= n) return;
    WarpScratch s = scratch(R);
    const u32 k = load_pool(snap, v, R, s, lane, 0, true);
    u32 take = (u32)ceilf(rho * (float)k);
    if (take > k) take = k;
    if (take == 0) return;
    // rank by (distance, id); the `take` nearest are sampled
    for (u32 i = lane; i < k; i += 32) {
        float di = s.cd[i];
        u32 ii = s.cid[i] & ID_MASK, r = 0;
        for (u32 j = 0; j < k; ++j) {
            float dj = s.cd[j];
            u32 ij = s.cid[j] & ID_MASK;
            r += (dj < di) || (dj == di && (ij < ii || (ij == ii && j < i)));
        }
        s.order[i] = r;
    }
    __syncwarp();
    for (u32 i = 0; i < k; ++i) {
        if (s.order[i] >= take) continue;
        warp_insert(pool_out, cnt_out, R, s.cid[i] & ID_MASK, v, s.cd[i], true, lane);
    }
}

// Random initialisation (Algorithm 3 line 4): S distinct random neighbours
// per vertex (never itself), all "new", after the `keep` slots an exact k-NN
// start already wrote (keep = 0: the whole pool row is written, EMPTY beyond
// S). Sets the pool's counter.
extern "C" __global__ void grnnd_init_random(const void* __restrict__ X, u32 half, u32 n, u32 dp, u32 G,
                                             u64* __restrict__ pool, u32* __restrict__ cnt, u32 R, u32 S,
                                             u64 seed, u32 keep) {
    const u32 lane = threadIdx.x & 31;
    const u32 v = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (v >= n) return;
    const Vecs V = {X, dp, half};
    WarpScratch s = scratch(R);
    const u32 sub = lane & (G - 1);
    const u32 grp = lane / G;
    const u32 P = 32 / G;
    u64* pv = pool + (size_t)v * R;
    if (keep > R) keep = R;
    // the exact neighbours already there (no random pick repeats one)
    u32 have = 0;
    if (keep > 0) {
        for (u32 i = 0; i < keep; ++i) {
            u64 sl = pv[i];
            if (sl != EMPTY_SLOT && lane == 0) s.cid[have] = slot_id(sl);
            have += sl != EMPTY_SLOT;
        }
    }
    u32 avail = n - 1 > have ? n - 1 - have : 0;
    if (S > avail) S = avail;
    if (S > R - keep) S = R - keep;
    if (lane == 0) {
        // The engine's generator (rnn_descent.rs: SplitMix64 seeded by
        // seed ^ v * golden, Lemire's multiply-shift), so the GPU and the CPU
        // start from the same random graph. Rejection sampling; S <= R.
        u32 got = 0;
        if (keep == 0 && n <= S + 1) {
            for (u32 u = 0; u < n; ++u)
                if (u != v) s.cid[got++] = u;
        } else {
            u64 st = seed ^ ((u64)v * 0x9e3779b97f4a7c15ull);
            while (got < S) {
                st += 0x9e3779b97f4a7c15ull;
                u64 z = mix64(st);
                u32 r = (u32)(((z >> 32) * (u64)n) >> 32);
                if (r == v) continue;
                bool seen = false;
                for (u32 q = 0; q < have + got; ++q) seen |= s.cid[q] == r;
                if (!seen) {
                    s.cid[have + got] = r;
                    ++got;
                }
            }
        }
    }
    __syncwarp();
    for (u32 b = 0; b < S; b += P) {
        u32 j = b + grp;
        bool act = j < S;
        u32 r = act ? s.cid[have + j] : 0u;
        float d = group_dist(V, v, r, sub, G, act);
        if (act && sub == 0) pv[keep + j] = pack_slot(d, r | NEW_BIT);
    }
    if (keep == 0)
        for (u32 i = S + lane; i < R; i += 32) pv[i] = EMPTY_SLOT;
    if (lane == 0) cnt[v] = keep + S;
}

// Initialisation from a k-NN graph (ids and distances, n x k, NO_NODE for
// missing): one thread per pool slot; EMPTY beyond k.
extern "C" __global__ void grnnd_init_knn(const u32* __restrict__ knn_id, const float* __restrict__ knn_d, u32 n,
                                          u32 k, u64* __restrict__ pool, u32* __restrict__ cnt, u32 R) {
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)n * R) return;
    u32 v = (u32)(t / R), i = (u32)(t % R);
    u64 val = EMPTY_SLOT;
    if (i < k) {
        u32 id = knn_id[(size_t)v * k + i];
        if (id != NO_NODE && id != v) val = pack_slot(knn_d[(size_t)v * k + i], id | NEW_BIT);
    }
    pool[t] = val;
    if (i == 0) cnt[v] = k < R ? k : R;
}

// The final cut: each pool sorted by (distance, id), repeated ids dropped
// (the nearest copy stays), the nearest `degree` written to adj (n x degree),
// NO_NODE after. One warp per vertex; scratch as grnnd_update's.
extern "C" __global__ void grnnd_finish(const u64* __restrict__ pool, u32 n, u32 R, u32 degree,
                                        u32* __restrict__ adj) {
    const u32 lane = threadIdx.x & 31;
    const u32 v = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (v >= n) return;
    WarpScratch s = scratch(R);
    u64* keys = (u64*)s.cid;     // R keys: (distance bits, id), no flag
    u64* sorted = (u64*)s.key;   // R sorted keys
    u32* dupf = s.aid;           // R flags
    const u32 k =
        live_slots(pool, v, R, lane, [&](u32 pos, u64 sl) { keys[pos] = (sl & 0xFFFFFFFF00000000ull) | slot_id(sl); });
    for (u32 i = lane; i < k; i += 32) {
        u64 ki = keys[i];
        u32 r = 0;
        for (u32 j = 0; j < k; ++j) {
            u64 kj = keys[j];
            r += kj < ki || (kj == ki && j < i);
        }
        sorted[r] = ki;
    }
    __syncwarp();
    // an id seen earlier in the sorted order is a duplicate
    for (u32 i = lane; i < k; i += 32) {
        u32 id = (u32)sorted[i];
        bool dup = false;
        for (u32 j = 0; j < i && !dup; ++j) dup = (u32)sorted[j] == id;
        dupf[i] = dup;
    }
    __syncwarp();
    u32 out = 0;
    for (u32 base = 0; base < k && out < degree; base += 32) {
        u32 i = base + lane;
        bool keep = i < k && !dupf[i];
        u32 m = __ballot_sync(FULL_MASK, keep);
        u32 pos = out + __popc(m & lanemask_lt());
        if (keep && pos < degree) adj[(size_t)v * degree + pos] = (u32)sorted[i];
        out += __popc(m);
    }
    for (u32 i = (out < degree ? out : degree) + lane; i < degree; i += 32) adj[(size_t)v * degree + i] = NO_NODE;
}

// fp16 copy of the vectors, used only when exact: *lossy becomes nonzero if
// some value does not survive f32 -> f16 -> f32 unchanged.
extern "C" __global__ void grnnd_to_half(const float* __restrict__ X, u64 count, u16* __restrict__ Xh,
                                         u32* __restrict__ lossy) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    bool bad = false;
    for (; i < count; i += (u64)gridDim.x * blockDim.x) {
        float x = X[i];
        const u16 h = f2h(x);
        Xh[i] = h;
        bad |= h2f(h) != x;
    }
    if (__any_sync(FULL_MASK, bad) && (threadIdx.x & 31) == 0) atomicOr(lossy, 1u);
}
