// Exact k-NN graph by a fused GEMM + top-k on tensor cores (after "CMANNS:
// GPU-Accelerated Graph Index Construction for ANNS via Compute-Memory
// Disaggregation", section 5.1):
//
//   D = |q|^2 + |c|^2 - 2 Q C^T
//
// Q C^T runs on the tensor cores (mma.sync m16n8k16, fp16 in, fp32
// accumulate); the squared norms are computed in fp32 from the original
// vectors and added in the epilogue, never folded into an fp16 operand
// (they overflow fp16's 65504). Each row's best L = 32 * LPL candidates by
// this approximate distance are kept on chip (in registers, one entry per
// lane of the warp that owns the row) across all column tiles; then the
// re-rank kernel recomputes those L distances in fp32 from the f32 vectors
// and keeps the k best, k <= L / 2 (the paper's "re-rank the top 2k").
//
// fp16 staging: vectors are multiplied by a power of two (`scale`, chosen by
// the host from the largest magnitude) so the largest lands near 2^13: no
// overflow, few subnormals, and integer data such as SIFT's 0..255 stays
// exact. The dot product is divided by scale^2 in the epilogue.
//
// No toolkit header (no mma.h, no cuda_fp16.h): NVRTC has none on a
// driver-only machine, so the MMA, ldmatrix and fp16 conversions are inline
// PTX. The tile sizes are in abi.h (the host sizes its launches by them).

#include "common.cuh"

#define NO_ID GG_NO_NODE
#define BM GG_KNN_BM
#define BN GG_KNN_BN
#define KC GG_KNN_KC
#define KS (GG_KNN_KC + GG_KNN_KPAD)
#define DPAD GG_KNN_DPAD
#define THREADS GG_KNN_THREADS

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void ldmatrix_x4(u32& r0, u32& r1, u32& r2, u32& r3, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
}

// Staging: Xh (n x dk halves, zero-padded, scaled) and the fp32 squared norms
// of the unscaled rows. One warp per row.
extern "C" __global__ void knn_prep(const float* __restrict__ X, u32 n, u32 dp, u32 dk, float scale,
                                    u16* __restrict__ Xh, float* __restrict__ norms) {
    const u32 lane = threadIdx.x & 31;
    const u32 row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n) return;
    float acc = 0.f;
    for (u32 o = lane; o < dk; o += 32) {
        float x = o < dp ? X[(size_t)row * dp + o] : 0.f;
        acc = fmaf(x, x, acc);
        Xh[(size_t)row * dk + o] = f2h(x * scale);
    }
    for (u32 m = 16; m > 0; m >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, m);
    if (lane == 0) norms[row] = acc;
}

// (d, id) lexicographic order, so ties resolve the same way everywhere.
__device__ __forceinline__ bool before(float d1, u32 i1, float d2, u32 i2) {
    return d1 < d2 || (d1 == d2 && i1 < i2);
}

// Inserts (d, id) into a warp-distributed ascending list of 32 * LPL entries:
// entry e lives in lane e % 32, register e / 32. The caller checked that it
// beats the last entry.
template <int LPL>
__device__ __forceinline__ void list_insert(float (&ld)[LPL], u32 (&li)[LPL], float d, u32 id, u32 lane) {
    float carry_d = 0.f;
    u32 carry_i = 0;
    bool placed = false;
#pragma unroll
    for (int q = 0; q < LPL; ++q) {
        // entries of this register after the new one move up by one lane,
        // the last one carries into the next register
        u32 gt = __ballot_sync(FULL_MASK, before(d, id, ld[q], li[q]));
        float up_d = __shfl_up_sync(FULL_MASK, ld[q], 1);
        u32 up_i = __shfl_up_sync(FULL_MASK, li[q], 1);
        float last_d = __shfl_sync(FULL_MASK, ld[q], 31);
        u32 last_i = __shfl_sync(FULL_MASK, li[q], 31);
        if (placed) {
            // everything shifts; lane 0 takes the carry
            if (lane == 0) {
                ld[q] = carry_d;
                li[q] = carry_i;
            } else {
                ld[q] = up_d;
                li[q] = up_i;
            }
        } else if (gt) {
            u32 pos = __ffs(gt) - 1;
            if (lane > pos) {
                ld[q] = up_d;
                li[q] = up_i;
            } else if (lane == pos) {
                ld[q] = d;
                li[q] = id;
            }
            placed = true;
        }
        carry_d = last_d;
        carry_i = last_i;
    }
}

// One block owns BM rows and sweeps every column tile; each of its 8 warps
// keeps the candidate lists of 16 rows in registers. Writes the L = 32*LPL
// best (approximate distance, id) of each row to cand_i / cand_d (n x L).
// Dynamic shared memory: see knn_smem_bytes in crates/gpu/src/knn.rs.
template <int LPL>
__device__ void knn_tiles(const u16* __restrict__ Xh, const float* __restrict__ norms, u32 n, u32 dk,
                          float inv_scale2, u32 col_begin, u32 col_end, u32 resume, u32* __restrict__ cand_i,
                          float* __restrict__ cand_d) {
    extern __shared__ __align__(16) unsigned char smem[];
    u16* As = (u16*)smem;                        // BM x KS
    u16* Bs = As + BM * KS;                      // BN x KS
    float* Ds = (float*)(Bs + BN * KS);          // BM x (BN + DPAD): dot products
    float* Nq = Ds + BM * (BN + DPAD);           // BM
    float* Nc = Nq + BM;                         // BN

    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 wm = warp >> 2, wn = warp & 3;  // MMA warp tile: rows wm*64.., cols wn*32..
    const u32 row0 = blockIdx.x * BM;

    for (u32 r = tid; r < BM; r += THREADS) Nq[r] = row0 + r < n ? norms[row0 + r] : 0.f;

    float ld[16][LPL];
    u32 li[16][LPL];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
        const u32 grow = row0 + warp * 16 + r;
#pragma unroll
        for (int q = 0; q < LPL; ++q) {
            if (resume && grow < n) {
                ld[r][q] = cand_d[(size_t)grow * (32 * LPL) + q * 32 + lane];
                li[r][q] = cand_i[(size_t)grow * (32 * LPL) + q * 32 + lane];
            } else {
                ld[r][q] = __int_as_float(0x7f800000);  // +inf
                li[r][q] = NO_ID;
            }
        }
    }

    // columns [col_begin, col_end): a launch covers a slice of the columns so
    // that the host can check for a cancel between launches; the lists go
    // to cand_i / cand_d at the end and come back with `resume`
    for (u32 col0 = col_begin; col0 < col_end; col0 += BN) {
        float acc[4][4][4];
        zero_tiles(acc);

        for (u32 k0 = 0; k0 < dk; k0 += KC) {
            __syncthreads();  // previous stage (or epilogue) done with As/Bs
            // 128 rows x 64 halves = 1024 16-byte pieces per tile
            for (u32 p = tid; p < BM * (KC / 8); p += THREADS) {
                u32 r = p / (KC / 8), q = p % (KC / 8);
                uint4 va = make_uint4(0, 0, 0, 0), vb = make_uint4(0, 0, 0, 0);
                if (row0 + r < n) va = *(const uint4*)(Xh + (size_t)(row0 + r) * dk + k0 + q * 8);
                if (col0 + r < n) vb = *(const uint4*)(Xh + (size_t)(col0 + r) * dk + k0 + q * 8);
                *(uint4*)(As + r * KS + q * 8) = va;
                *(uint4*)(Bs + r * KS + q * 8) = vb;
            }
            __syncthreads();
#pragma unroll
            for (u32 ks = 0; ks < KC; ks += 16) {
                u32 af[4][4], bf[4][2];
#pragma unroll
                for (int mi = 0; mi < 4; ++mi) {
                    // matrices: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15)
                    u32 q = lane >> 3, r = lane & 7;
                    const u16* p = As + (wm * 64 + mi * 16 + (q & 1) * 8 + r) * KS + ks + (q >> 1) * 8;
                    ldmatrix_x4(af[mi][0], af[mi][1], af[mi][2], af[mi][3], p);
                }
#pragma unroll
                for (int nj = 0; nj < 2; ++nj) {
                    // matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
                    u32 q = lane >> 3, r = lane & 7;
                    const u16* p = Bs + (wn * 32 + nj * 16 + (q >> 1) * 8 + r) * KS + ks + (q & 1) * 8;
                    ldmatrix_x4(bf[2 * nj][0], bf[2 * nj][1], bf[2 * nj + 1][0], bf[2 * nj + 1][1], p);
                }
#pragma unroll
                for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                    for (int ni = 0; ni < 4; ++ni)
                        mma_16816(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], bf[ni][0], bf[ni][1]);
            }
        }
        // Epilogue 1: dot products to shared memory.
        {
            const u32 g = lane >> 2, t = lane & 3;
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    u32 r = wm * 64 + mi * 16 + g, c = wn * 32 + ni * 8 + 2 * t;
                    *(float2*)(Ds + r * (BN + DPAD) + c) = make_float2(acc[mi][ni][0], acc[mi][ni][1]);
                    *(float2*)(Ds + (r + 8) * (BN + DPAD) + c) = make_float2(acc[mi][ni][2], acc[mi][ni][3]);
                }
        }
        for (u32 c = tid; c < BN; c += THREADS) Nc[c] = col0 + c < n ? norms[col0 + c] : 0.f;
        __syncthreads();
        // Epilogue 2: distances, and the per-row top-L in registers.
#pragma unroll
        for (int rr = 0; rr < 16; ++rr) {
            const u32 r = warp * 16 + rr, grow = row0 + r;
            if (grow >= n) continue;  // warp-uniform
            const float nq = Nq[r];
            float thr = __shfl_sync(FULL_MASK, ld[rr][LPL - 1], 31);
#pragma unroll
            for (int cc = 0; cc < BN / 32; ++cc) {
                const u32 c = cc * 32 + lane, gcol = col0 + c;
                float d = nq + Nc[c] - 2.f * Ds[r * (BN + DPAD) + c] * inv_scale2;
                d = fmaxf(d, 0.f);
                bool pass = gcol < n && gcol != grow && d < thr;
                u32 m = __ballot_sync(FULL_MASK, pass);
                while (m) {
                    u32 L = __ffs(m) - 1;
                    m &= m - 1;
                    float dd = __shfl_sync(FULL_MASK, d, L);
                    u32 jj = col0 + cc * 32 + L;
                    if (dd < thr) {
                        list_insert<LPL>(ld[rr], li[rr], dd, jj, lane);
                        thr = __shfl_sync(FULL_MASK, ld[rr][LPL - 1], 31);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < 16; ++rr) {
        const u32 grow = row0 + warp * 16 + rr;
        if (grow >= n) continue;
#pragma unroll
        for (int q = 0; q < LPL; ++q) {
            cand_i[(size_t)grow * (32 * LPL) + q * 32 + lane] = li[rr][q];
            cand_d[(size_t)grow * (32 * LPL) + q * 32 + lane] = ld[rr][q];
        }
    }
}

// KNN_LPL (set by the host) compiles only the variant a build needs (0:
// neither, for GNN-Descent's staging and re-rank): the two together take
// seconds of NVRTC time.
#if !defined(KNN_LPL) || KNN_LPL == 1
extern "C" __global__ void __launch_bounds__(THREADS, 1)
    knn_tiles_32(const u16* __restrict__ Xh, const float* __restrict__ norms, u32 n, u32 dk, float inv_scale2,
                 u32 col_begin, u32 col_end, u32 resume, u32* __restrict__ cand_i, float* __restrict__ cand_d) {
    knn_tiles<1>(Xh, norms, n, dk, inv_scale2, col_begin, col_end, resume, cand_i, cand_d);
}
#endif

#if !defined(KNN_LPL) || KNN_LPL == 2

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    knn_tiles_64(const u16* __restrict__ Xh, const float* __restrict__ norms, u32 n, u32 dk, float inv_scale2,
                 u32 col_begin, u32 col_end, u32 resume, u32* __restrict__ cand_i, float* __restrict__ cand_d) {
    knn_tiles<2>(Xh, norms, n, dk, inv_scale2, col_begin, col_end, resume, cand_i, cand_d);
}
#endif

// fp32 re-rank: one warp per row recomputes the L candidates' distances from
// the f32 vectors (X: n x dp, dp a multiple of 4) and writes the k best by
// (distance, id) to out_i / out_d (n x k), NO_ID / +inf where fewer exist.
extern "C" __global__ void knn_rerank(const float* __restrict__ X, u32 n, u32 dp, const u32* __restrict__ cand_i,
                                      u32 L, u32 k, u32* __restrict__ out_i, float* __restrict__ out_d) {
    const u32 lane = threadIdx.x & 31;
    const u32 row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n) return;
    const float4* q = (const float4*)(X + (size_t)row * dp);
    float dist[2];
    u32 ids[2];
    for (u32 e = 0; e < 2; ++e) {
        u32 slot = e * 32 + lane;
        u32 id = slot < L ? cand_i[(size_t)row * L + slot] : NO_ID;
        float acc = __int_as_float(0x7f800000);
        if (id != NO_ID) {
            const float4* c = (const float4*)(X + (size_t)id * dp);
            acc = 0.f;
            for (u32 o = 0; o < dp / 4; ++o) {
                const float4 a = __ldg(q + o), b = __ldg(c + o);
                acc = sq4(a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w, acc);
            }
        }
        dist[e] = acc;
        ids[e] = id;
    }
    // rank of each entry among the (up to) 64
    for (u32 e = 0; e < 2; ++e) {
        u32 rank = 0;
        for (u32 f = 0; f < 2; ++f)
            for (u32 src = 0; src < 32; ++src) {
                float od = __shfl_sync(FULL_MASK, dist[f], src);
                u32 oi = __shfl_sync(FULL_MASK, ids[f], src);
                rank += before(od, oi, dist[e], ids[e]);
            }
        if (ids[e] != NO_ID && rank < k) {
            out_i[(size_t)row * k + rank] = ids[e];
            out_d[(size_t)row * k + rank] = dist[e];
        }
    }
    // fewer than k candidates (n - 1 < k): pad
    u32 valid = __popc(__ballot_sync(FULL_MASK, ids[0] != NO_ID)) + __popc(__ballot_sync(FULL_MASK, ids[1] != NO_ID));
    for (u32 r = valid + lane; r < k; r += 32) {
        out_i[(size_t)row * k + r] = NO_ID;
        out_d[(size_t)row * k + r] = __int_as_float(0x7f800000);
    }
}
