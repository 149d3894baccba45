// The filters of Collect-Filter-Store on the GPU (Tagore's GNN-Descent
// paper, §5.2): gpu_graph_engine::filter::Filter::apply over a batch of
// candidate rows, exactly, checked list for list against it by
// gpu-graph-gpucheck (filters.rs). One warp per row; a batch of rows fills
// the GPU (Tagore gives a row several warps instead).
//
//   * RNG, NSG, Vamana (Tagore's serial paradigm): candidates in order, each
//     kept unless an already kept one occludes it (filter_occludes: the
//     predicate of each rule), until `degree` are kept. Each lane group of G
//     computes one candidate-to-kept distance; the kept ids and distances
//     sit in shared memory. Tagore's wavefront tests a candidate against the
//     kept ones in parallel the same way.
//   * CAGRA (rank-based): each candidate's detour count (the nearer
//     candidates k with detour(): d(v, k) < d(v, i) and d(k, i) < d(v, i)),
//     the lane groups taking the k in parallel, into `work`; then each lane
//     ranks its candidates by (detours, index) against all the row's; those
//     ranked below `degree` are kept, in candidate order, as the engine's
//     stable sort and truncate do.
//   * TSDG's order (its second stage): the same detour counts (its lambda),
//     then the candidates with at most `max_lambda` in (lambda, index)
//     order, each written at its rank (filter.rs's tsdg_order).
//
// Rows come one after another (FilterParams.starts), so the store's lists,
// whose lengths vary widely, take no padding.

#include "common.cuh"

// Whether a kept neighbour at `kept` from the node occludes a candidate at
// `cand`, `between` being their squared distance: Filter::apply's predicate
// of each rule (RNG: common.cuh's occludes; NSG: strict, with the same
// duplicate exception; Vamana: occludes with factor = alpha squared on the
// candidate-to-kept distance).
__device__ __forceinline__ bool filter_occludes(u32 rule, float factor, float kept, float cand, float between) {
    switch (rule) {
        case GG_FILTER_NSG:
            return (kept != 0.f || cand == 0.f) && between < cand;
        case GG_FILTER_VAMANA:
            return occludes(kept, cand, factor * between);
        default:  // GG_FILTER_RNG
            return occludes(kept, cand, between);
    }
}

// CAGRA's detour (engine: filter.rs's detours): a candidate at `via` from
// the node, `between` from the candidate at `cand`, offers it a detour.
__device__ __forceinline__ bool detour(float via, float cand, float between) {
    return via < cand && between < cand;
}

// The serial filters on one row; `kept` holds 2 * degree words of the warp.
__device__ void serial_row(const FilterParams& p, Vecs V, u32 row, u32 lane, u32* kept) {
    const u32* starts = (const u32*)p.starts;
    const u32* cand = (const u32*)p.ids + starts[row];
    const float* cand_d = (const float*)p.dists + starts[row];
    const u32 C = starts[row + 1] - starts[row];
    float* kept_d = (float*)(kept + p.degree);
    const u32 G = p.lanes, sub = lane & (G - 1), grp = lane / G, P = 32 / G;
    u32 nk = 0;
    for (u32 i = 0; i < C && nk < p.degree; ++i) {
        const u32 c = cand[i];
        const float dc = cand_d[i];
        bool occluded = false;
        for (u32 b = 0; b < nk && !occluded; b += P) {
            const u32 j = b + grp;
            const bool act = j < nk;
            const float between = group_dist(V, c, act ? kept[j] : 0u, sub, G, act);
            occluded = __any_sync(FULL_MASK,
                                  act && sub == 0 && filter_occludes(p.rule, p.factor, kept_d[act ? j : 0], dc, between));
        }
        if (!occluded) {
            if (lane == 0) {
                kept[nk] = c;
                kept_d[nk] = dc;
            }
            ++nk;
            __syncwarp();
        }
    }
    u32* out = (u32*)p.out + (u64)row * p.degree;
    for (u32 j = lane; j < p.degree; j += 32) out[j] = j < nk ? kept[j] : GG_NO_NODE;
}

// CAGRA's rank-based filter, or TSDG's order, on one row.
__device__ void cagra_row(const FilterParams& p, Vecs V, u32 row, u32 lane) {
    const bool tsdg = p.rule == GG_FILTER_TSDG_ORDER;
    const u32* starts = (const u32*)p.starts;
    const u32* cand = (const u32*)p.ids + starts[row];
    const float* cand_d = (const float*)p.dists + starts[row];
    u32* det = (u32*)p.work + starts[row];
    const u32 C = starts[row + 1] - starts[row];
    const u32 G = p.lanes, sub = lane & (G - 1), grp = lane / G, P = 32 / G;
    for (u32 i = 0; i < C; ++i) {
        const u32 c = cand[i];
        const float dc = cand_d[i];
        u32 count = 0;
        for (u32 b = 0; b < i; b += P) {
            const u32 k = b + grp;
            const float dk = k < i ? cand_d[k] : 0.f;
            // the distance only where it can matter
            const bool act = k < i && dk < dc;
            const float between = group_dist(V, c, act ? cand[k] : 0u, sub, G, act);
            count += __popc(__ballot_sync(FULL_MASK, act && sub == 0 && detour(dk, dc, between)));
        }
        if (lane == 0) det[i] = count;
    }
    __syncwarp();  // orders lane 0's counts before every lane reads them
    u32* out = (u32*)p.out + (u64)row * p.degree;
    u32 nk = 0;
    for (u32 b = 0; b < C; b += 32) {
        const u32 i = b + lane;
        bool keep = false;
        u32 rank = 0;
        if (i < C) {
            const u32 di = det[i];
            for (u32 j = 0; j < C && rank < p.degree; ++j) {
                const u32 dj = det[j];
                rank += (!tsdg || dj <= p.max_lambda) && (dj < di || (dj == di && j < i));
            }
            keep = rank < p.degree && (!tsdg || di <= p.max_lambda);
        }
        const u32 m = __ballot_sync(FULL_MASK, keep);
        if (keep) out[tsdg ? rank : nk + __popc(m & lanemask_lt())] = cand[i];
        nk += __popc(m);
    }
    for (u32 j = nk + lane; j < p.degree; j += 32) out[j] = GG_NO_NODE;
}

// GG_FILTER_WARPS rows per block; dynamic shared memory: 2 * degree words
// per warp (the serial filters' kept ids and distances).
extern "C" __global__ void __launch_bounds__(GG_FILTER_WARPS * 32) filter_rows(const __grid_constant__ FilterParams p) {
    extern __shared__ u32 filter_words[];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 row = blockIdx.x * GG_FILTER_WARPS + warp;
    if (row >= p.rows) return;  // whole warp
    const Vecs V = {(const void*)p.vectors, p.dp, 0u};
    if (p.rule == GG_FILTER_CAGRA || p.rule == GG_FILTER_TSDG_ORDER) {
        cagra_row(p, V, row, lane);
    } else {
        serial_row(p, V, row, lane, filter_words + (u64)warp * 2 * p.degree);
    }
}
