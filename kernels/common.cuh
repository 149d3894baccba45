// Device helpers shared by the kernels of this folder: one definition of the
// random mix, the fp16 conversion, the warp masks, the (distance, id) order,
// the squared-L2 distance of a lane group, the tensor-core step and the one
// prune rule.
//
// Handed to NVRTC from memory with abi.h (crates/gpu/src/nvrtc.rs); like the
// kernels it includes nothing else: everything is a compiler built-in or
// inline PTX.
#pragma once
#include "abi.h"

#define FULL_MASK 0xFFFFFFFFu

// splitmix64's finaliser: the random start (rnn_descent.cu, the same
// generator as the CPU builder's), GRNND's pair order, the search's seeds.
__device__ __forceinline__ u64 mix64(u64 x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

// fp16 bits -> float
__device__ __forceinline__ float h2f(u32 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((u16)h));
    return f;
}

// float -> fp16 bits, round to nearest even
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// The lanes below this one (for compaction after a ballot).
__device__ __forceinline__ u32 lanemask_lt() {
    u32 m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

// (distance, id) order: ascending distance, ties by id.
__device__ __forceinline__ bool key_lt(float ad, u32 ai, float bd, u32 bi) {
    return ad < bd || (ad == bd && ai < bi);
}
__device__ __forceinline__ bool key_le(float ad, u32 ai, float bd, u32 bi) {
    return ad < bd || (ad == bd && ai <= bi);
}

__device__ __forceinline__ float sq4(float a0, float a1, float a2, float a3, float b0, float b1, float b2, float b3,
                                     float acc) {
    const float d0 = a0 - b0, d1 = a1 - b1, d2 = a2 - b2, d3 = a3 - b3;
    acc = fmaf(d0, d0, acc);
    acc = fmaf(d1, d1, acc);
    acc = fmaf(d2, d2, acc);
    acc = fmaf(d3, d3, acc);
    return acc;
}

// Stored vectors of a build: n rows of dp values (dp a multiple of 4,
// zero-padded), fp32, or fp16 when half != 0 (only when exact).
struct Vecs {
    const void* x;
    u32 dp;
    u32 half;
};

// Squared L2 between rows a and b, computed by the G consecutive lanes of a
// group (G a power of two dividing 32); every lane of the group gets the sum.
// Called by the whole warp (the reduction shuffles over all 32 lanes); lanes
// with active == false load nothing and return 0.
__device__ __forceinline__ float group_dist(Vecs V, u32 a, u32 b, u32 sub, u32 G, bool active) {
    float acc = 0.f;
    if (active) {
        const u32 q = V.dp >> 2;  // 4-value pieces per row
        if (V.half) {
            const uint2* pa = (const uint2*)((const u16*)V.x + (u64)a * V.dp);
            const uint2* pb = (const uint2*)((const u16*)V.x + (u64)b * V.dp);
            for (u32 o = sub; o < q; o += G) {
                const uint2 x = __ldg(pa + o), y = __ldg(pb + o);
                acc = sq4(h2f(x.x & 0xffff), h2f(x.x >> 16), h2f(x.y & 0xffff), h2f(x.y >> 16), h2f(y.x & 0xffff),
                          h2f(y.x >> 16), h2f(y.y & 0xffff), h2f(y.y >> 16), acc);
            }
        } else {
            const float4* pa = (const float4*)((const float*)V.x + (u64)a * V.dp);
            const float4* pb = (const float4*)((const float*)V.x + (u64)b * V.dp);
            for (u32 o = sub; o < q; o += G) {
                const float4 x = __ldg(pa + o), y = __ldg(pb + o);
                acc = sq4(x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w, acc);
            }
        }
    }
    for (u32 m = G >> 1; m > 0; m >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, m);
    return acc;
}

// MMA accumulator tiles (M x N tiles of 4 floats a lane) set to zero.
template <int M, int N>
__device__ __forceinline__ void zero_tiles(float (&acc)[M][N][4]) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int n = 0; n < N; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.f;
}

// A candidate slot of GRNND's pools and GNN-Descent's lists: the distance's
// bits above the id and its flags, so that slots order by distance as
// integers (distances are never negative).
__device__ __forceinline__ u64 pack_slot(float d, u32 id_and_flags) {
    return ((u64)__float_as_uint(d) << 32) | (u64)id_and_flags;
}
__device__ __forceinline__ float slot_dist(u64 s) { return __uint_as_float((u32)(s >> 32)); }

// One tensor-core step, D += A B (m16n8k16, fp16 in, fp32 accumulate), as
// inline PTX (NVRTC has no mma.h on a driver-only machine). Fragments, with
// g = lane / 4 and t = lane % 4 (PTX ISA, "mma.m16n8k16"): a0 = A[g][2t..],
// a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]; b0 = B[2t..][g],
// b1 = B[2t+8..][g]; c[0..1] = C[g][2t..], c[2..3] = C[g+8][2t..].
__device__ __forceinline__ void mma_16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The one prune rule of gpu_graph (gpu_graph_engine::prune::occludes): a kept
// neighbour at distance `kept` from the node occludes a candidate at
// distance `cand` when their distance to each other, `between`, is <= cand;
// except that a kept copy of the node itself (kept == 0) prunes only other
// copies, so two copies of one vector cannot form an island.
__device__ __forceinline__ bool occludes(float kept, float cand, float between) {
    if (kept == 0.f && cand > 0.f) return false;
    return between <= cand;
}
