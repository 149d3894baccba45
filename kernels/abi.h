// The host-kernel ABI of gpu_graph: every memory layout and constant that the
// host (crates/gpu) and the kernels of this folder share, written once.
//
// crates/gpu/src/abi.rs mirrors it field for field and constant for constant
// (#[repr(C)], the same names without the GG_ prefix). Two checks keep the
// two sides together, and each fails when one side changes alone:
//   * `cargo test -p gpu_graph_gpu` parses this file and compares every
//     #define and every struct (field names, order, offsets, size) with the
//     Rust side;
//   * the kernel compile check (scripts/check-kernels.sh, in CI) compiles
//     static_asserts generated from the Rust side (abi::static_asserts)
//     against this file with NVRTC itself.
//
// NVRTC gets this file from memory (crates/gpu/src/nvrtc.rs): kernels
// include it by name, and it includes nothing (a machine with only the
// driver and libnvrtc has no toolkit headers).
#pragma once

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

// ------------------------------------------------------------------ graphs

// Padding of a neighbour list, and "no node".
#define GG_NO_NODE 0xFFFFFFFFu

// Node flags, one byte per node (gpu_graph_engine::node): deleted nodes are
// traversed but never a result; free slots hold no node.
#define GG_NODE_DELETED 1u
#define GG_NODE_FREE 2u

// ------------------------------------------------- GRNND (rnn_descent.cu)

// A pool slot (64 bits): distance bits << 32 | new bit | id. A squared
// distance is >= 0, so its bits order as the float does and a whole slot
// orders by distance. EMPTY sorts after every real slot.
#define GG_POOL_EMPTY 0xFFFFFFFFFFFFFFFFull
#define GG_POOL_NEW_BIT 0x80000000u
#define GG_POOL_ID_MASK 0x7FFFFFFFu

// grnnd_update's mode bits: scan a pool in ascending distance (Algorithm 2,
// as the CPU builder) instead of GRNND's fresh random order.
#define GG_MODE_ASCENDING 1u

// grnnd_update's statistics counters (u64 each)
#define GG_STAT_INSERTED 0u
#define GG_STAT_DISTANCES 1u
#define GG_STAT_REDIRECTS 2u
#define GG_STAT_COUNT 4u

// One warp per vertex, this many warps per block; each warp has
// GG_GRNND_SCRATCH_WORDS * R words of dynamic shared memory.
#define GG_GRNND_WARPS 8u
#define GG_GRNND_SCRATCH_WORDS 6u

// ----------------------------------------------- CFS filters (filter.cu)

// filter_rows' rule: gpu_graph_engine::filter::Filter's variants
#define GG_FILTER_RNG 0u
#define GG_FILTER_NSG 1u
#define GG_FILTER_VAMANA 2u
#define GG_FILTER_CAGRA 3u
#define GG_FILTER_TSDG_ORDER 4u
// One warp per row, this many warps per block.
#define GG_FILTER_WARPS 8u

// filter_rows' one parameter (passed by value). Row r's candidates are
// entries starts[r] .. starts[r + 1] of ids and dists, ascending by
// (distance to the row's node, id), distinct, the node absent.
struct FilterParams {
    u64 vectors;  // n rows of dp floats (zero-padded)
    u64 starts;   // rows + 1 u32
    u64 ids;      // the candidates (u32)
    u64 dists;    // their squared distances to the row's node (float)
    u64 work;     // a u32 per candidate: the detour counts (CAGRA, TSDG's order)
    u64 out;      // rows x degree u32: the kept ids, GG_NO_NODE padded
    u32 rows;
    u32 degree;
    u32 dp;
    u32 lanes;  // lanes per distance, a power of two <= 32
    u32 rule;   // GG_FILTER_*
    float factor;  // Filter::factor: alpha squared for Vamana, else 1
    u32 max_lambda;  // TSDG's order: edges occluded by more are dropped
    u32 pad0;
};

// --------------------------------------------- exact k-NN (knn_exact.cu)

#define GG_KNN_BM 128u      // rows of a block tile
#define GG_KNN_BN 128u      // columns of a block tile
#define GG_KNN_KC 64u       // dimensions per shared-memory stage
#define GG_KNN_KPAD 8u      // row padding (halves): 144-byte rows, conflict-free ldmatrix
#define GG_KNN_DPAD 4u      // distance tile row padding (floats)
#define GG_KNN_THREADS 256u // 8 warps: 2 (rows) x 4 (columns) for the MMA, 16 rows each for top-k
// Largest k of the exact k-NN graph: the on-chip lists hold 64 candidates,
// re-ranked to k <= 32.
#define GG_KNN_MAX_K 32u
// Dynamic shared memory of knn_tiles: two fp16 operand stages, the distance
// tile and the two norm vectors.
#define GG_KNN_SMEM_BYTES                                                                         \
    (2u * 128u * (GG_KNN_KC + GG_KNN_KPAD) * 2u + GG_KNN_BM * (GG_KNN_BN + GG_KNN_DPAD) * 4u + \
     (GG_KNN_BM + GG_KNN_BN) * 4u)

// ------------------------------ GNN-Descent's k-NN graph (knn_descent.cu)

// List slots: distance bits << 32 | flags | id (ids below 2^30); all ones
// is an empty slot. Rows are staged as knn_exact.cu's (fp16, dk a multiple
// of GG_KNN_KC, rows padded by GG_KNN_KPAD halves in shared memory).
#define GG_GNND_K 32u          // neighbours a list keeps
#define GG_GNND_CAND 32u       // candidates offered to a node in one join round
#define GG_GNND_SAMPLE 8u      // ids of each kind a join takes: new, old, reverse new, reverse old
#define GG_GNND_EXPAND 2u      // phase 2: nearest unexpanded neighbours whose lists a node reads
#define GG_GNND_WARPS 4u       // warps a block (one node a warp)
#define GG_GNND_NEW 0x80000000u   // not yet in a local join (NN-Descent's new flag)
#define GG_GNND_DONE 0x40000000u  // its list already expanded in phase 2
#define GG_GNND_ID_MASK 0x3FFFFFFFu
// Shared memory of gnnd_join: each warp stages 32 rows of one chunk.
#define GG_GNND_JOIN_SMEM_BYTES (GG_GNND_WARPS * 32u * (GG_KNN_KC + GG_KNN_KPAD) * 2u)

// ----------------------------- the persistent search (search_persistent.cu)

// Slot words (cmd[slot]): seq << GG_CMD_CTAS_BITS | (ctas - 1), seq =
// 1 .. GG_SEQ_LIMIT; or one of the commands below; 0 = never used.
#define GG_CMD_CTAS_BITS 5u
#define GG_SEQ_LIMIT 134217726u  // (1 << 27) - 2
#define GG_CMD_QUIT 0xFFFFFFFFu
#define GG_CMD_FAULT 0xFFFFFFFEu  // test switch: an illegal address
// Doorbell entries (SearchParams.doorbell, mapped host memory, a ring of
// 2^ring_log2 u64): lap tag << 48 | slot << 24 | the request's 16-byte
// chunks; the tag of entry i is (i >> ring_log2) + 1 (low 16 bits), so an
// entry of the last lap (or the zeroed ring) never looks posted. The slot
// GG_RING_QUIT asks the dispatcher to quit every slot.
#define GG_RING_TAG_SHIFT 48u
#define GG_RING_SLOT_SHIFT 24u
#define GG_RING_LEN_MASK 0xFFFFFFu
#define GG_RING_QUIT 0xFFFFFFu
// The slot GG_RING_PATCH: the patch staged at SearchParams.patch_staging
// (a PatchHead, then its bytes and its table of PatchCopy).
#define GG_RING_PATCH 0xFFFFFEu
// ResultHead.expanded when the request named no loaded index
#define GG_OUT_BAD_INDEX 0xFFFFFFFFu
// Neighbour ids gathered per step: beam * degree <= GG_CAND_CAP, so at most
// GG_MAX_BEAM_ROWS ids per lane.
#define GG_MAX_BEAM_ROWS 8u
#define GG_CAND_CAP 256u
// Start nodes of one query (RequestHead.seeds): a CTA's share and the entry
// point fit one round of GG_CAND_CAP claims.
#define GG_MAX_SEEDS 255u
// Nodes a query may measure at its start in place of the entry point and
// the seeds (RequestHead.scan).
#define GG_MAX_SCAN 4096u
// Loads in flight per lane of a distance: a row of `chunks` 16-byte chunks
// takes the smallest power of two G of lanes with chunks <= GG_DIST_UNROLL * G.
#define GG_DIST_UNROLL 16u
// Distance kinds of an index
#define GG_METRIC_L2 0u  // squared L2 over the stored vectors (L2, cosine)
#define GG_METRIC_IP 1u  // -dot over the first stored_dim - 1 coordinates
// Dynamic shared memory of one CTA: the query, two lists (distance, id) of
// list_cap, the candidate buffer and 32 selected ids.
#define GG_SEARCH_SMEM_BYTES(max_qwords, list_cap) \
    (4u * (max_qwords) + 16u * (list_cap) + 8u * GG_CAND_CAP + 4u * 32u)

// A resident index (a table of these in device memory, one per index).
struct IndexDesc {
    u64 vectors;    // n rows of chunks * 16 bytes (fp32, or fp16 when exact)
    u64 adjacency;  // n x degree u32, GG_NO_NODE padded
    u64 flags;      // n bytes of GG_NODE_* flags
    u32 n;
    u32 degree;
    u32 entry;
    u32 chunks;  // 16-byte chunks per row
    u32 half;    // rows are fp16
    u32 metric;  // GG_METRIC_*
    u32 lanes;   // lanes per distance, a power of two <= 32
    u32 gen;     // != 0 while loaded: a request must name the same
    u64 rows;    // n u64: each node's row (its heap TID), written beside
                 // the hits of the persistent kernel's answers; 0: none
};

// One copy of a patch to a resident index (Registry::patch), applied by
// apply_patch: `len` bytes from byte `src` of the patch's inbox to device
// address `dst`.
struct PatchCopy {
    u64 dst;
    u32 src;
    u32 len;
};

// The head of a patch staged for the doorbell's dispatcher: `n` PatchCopy
// at byte `table` of the staging buffer, whose `src` are byte offsets in
// it; the dispatcher writes `seq` to SearchParams.patch_ack once applied.
struct PatchHead {
    u32 seq;
    u32 n;
    u32 table;
    u32 pad;
};

// A query slot's request in device memory: this header, then qwords floats.
struct RequestHead {
    u32 cmd;    // the slot word of this query (written last by the host copy)
    u32 index;  // entry of the index table
    u32 gen;    // IndexDesc.gen it expects
    u32 k;
    u32 list;         // candidate list length of each CTA
    u32 ctas;         // CTAs that search
    u32 max_expand;   // iteration cap: expansions per CTA
    u32 offset_beam;  // beam extend from this list position on
    u32 beam;         // candidates expanded per step after that
    u32 seeds;        // start nodes spread over the ids, all CTAs (at most GG_MAX_SEEDS)
    u32 qwords;       // floats of the query that follow
    u32 scan;         // nodes measured at the start in place of entry and seeds, all CTAs (0: none; at most GG_MAX_SCAN)
    // written by the dispatcher into its device copy (the host leaves them
    // 0): %globaltimer's low word when it saw the ring entry, and the ns
    // its copy of the request from host memory took (the breakdown)
    u32 seen;
    u32 copy_ns;
    u32 pad[2];
};

// A CTA's answer in mapped host memory (SearchParams.cta_block bytes): this
// header, then k_max ResultHit entries, then k_max u64: each hit's row
// (IndexDesc.rows[id]; 0 when the index has none).
struct ResultHead {
    u32 cmd;       // the slot word it answers
    u32 count;     // hits written
    u32 expanded;  // nodes expanded (GG_OUT_BAD_INDEX: no such index)
    u32 computed;  // distances computed
    // where the CTA's time went (%globaltimer, ns): the latency breakdown
    u64 picked;      // when the CTA took the query (its slot word changed)
    u32 start_ns;    // picked -> the entry point, seeds and entry's list absorbed
    u32 search_ns;   // picked -> its hits written (then: the fences, the finish word)
    u32 steps;       // steps of the search loop (expansion rounds)
    // SM cycles (clock64): the query's whole search, and of it the visited
    // claims, the distances, the survivors' merges into the list
    u32 cycles;
    u32 claim_cycles;
    u32 dist_cycles;
    u32 merge_cycles;
    u32 dispatch_ns;  // the dispatcher seeing the ring entry -> picked (0 without the doorbell)
    u32 copy_ns;      // of which its copy of the request from host memory
    u32 fence_ns;     // this CTA's previous answer: its hits written -> its finish word stored
};

struct ResultHit {
    float dist;
    u32 id;
};

// The persistent kernel's one parameter (passed by value). Addresses are
// device addresses (u64) so the layout is the same on both sides.
struct SearchParams {
    u64 indexes;   // IndexDesc[n_indexes]
    u64 cmd;       // u32 per slot: the slot words (device memory)
    u64 reqs;      // req_stride bytes per slot: RequestHead + query
    u64 visited;   // u64 << visited_log2 per slot
    u64 done;      // u32 per slot: CTAs finished with the current query
    u64 results;   // result_stride bytes per slot (mapped host memory)
    u64 finish;    // u32 every finish_stride words (mapped host memory)
    u32 n_indexes;
    u32 req_stride;
    u32 visited_log2;
    u32 result_stride;
    u32 k_max;
    u32 finish_stride;
    u32 ctas_per_slot;
    u32 list_cap;
    u32 max_qwords;
    u32 max_sleep_ns;
    u64 doorbell;   // the doorbell ring (mapped host memory); 0: none, the
                    // host writes the slot words itself
    u64 staging;    // req_stride bytes per slot: the requests as the host
                    // wrote them (mapped host memory), copied by the
                    // dispatcher to `reqs`
    u32 ring_log2;  // entries of the ring: 2^ring_log2
    u32 cta_block;  // bytes of one CTA's answer within a slot's result_stride
    u64 patch_staging;  // a patch for the dispatcher (mapped host memory)
    u64 patch_ack;      // u32: the last patch applied (mapped host memory)
};

// The large-batch kernel's one parameter (search_batch, passed by value):
// n queries of qwords floats each (prepared as a slot's query), each
// searched by one single-warp CTA with a list of `list`; block b uses the
// visited table b (2^visited_log2 entries) and generation visit_base + the
// number of queries it searched before.
struct BatchParams {
    u64 indexes;  // IndexDesc[n_indexes]
    u64 queries;  // n x qwords floats
    u64 visited;  // u64 << visited_log2 per block
    u64 hits;     // n x k ResultHit
    u64 counts;   // n u32: hits written (GG_OUT_BAD_INDEX: no such index)
    u32 n_indexes;
    u32 index;  // entry of the index table
    u32 gen;    // IndexDesc.gen it expects
    u32 n;
    u32 qwords;
    u32 k;
    u32 list;
    u32 max_expand;
    u32 offset_beam;
    u32 beam;
    u32 visited_log2;
    u32 visit_base;
    u32 width;  // entries of each list searched (0: all; TSDG's prefix)
    u32 pad0;
};
