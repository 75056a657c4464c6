// The wgmma flash forward, dq and dk / dv kernels with a producer warpgroup
// (CTX_FLASH_WGMMA_PIPELINE=producer), an A/B against the lock-step kernels of
// cuda_flash_wg_sm90a.cu until a GPU has timed both.
//
// In the lock-step kernels every warpgroup stages a share of each tile and all meet at the block
// barrier once a tile, so both run their products at the same moments and both do their
// per-logit arithmetic at the same moments, while the tensor core waits. Here (FlashAttention-3's
// warp specialisation) a block is kWG consumer warpgroups, which compute exactly what the
// lock-step kernels' do (WgForwardRows, WgDqRows, WgDkvRows: the same bits), and one producer
// warpgroup, which only copies: the block's own rows once (Q; Q and dO; the dk / dv kernel's K
// and V), then each tile (K, V and the key positions; Q, dO and the queries' positions,
// log-sum-exps and D) into kStages stages. They meet at named barriers (cuda_device.cuh), never at
// the block's:
//   full(stage, c)  the producer, once the stage's copies have landed and are fenced for the
//                   tensor core's reads, and consumer c, before it reads them: 256 threads. One
//                   per consumer, so the consumers need not be in step.
//   empty(stage)    every consumer, once it no longer reads the stage (after the product of its
//                   tile still in flight has run), and the producer, before it refills it: all
//                   threads.
//   turn(c)         two consumers: c issues its first products of a tile only after the other
//                   has issued those of the tile before (counting the tiles both take), so the
//                   tensor core alternates between them and one's softmax runs under the other's
//                   products (FlashAttention-3's ping-pong).
// With two consumers, setmaxnreg gives the producer's registers to them: 24 and 240 a thread.
//
// The schedule: the producer hands out tile j, then fills tile j + 2 into the stage of tile
// j - 2. A consumer at tile j keeps tile j - 1's stage until the product that reads it (the
// forward's P V, the dq kernel's dS K, the dk / dv kernel's at D 64 without packed documents) has
// run, which it knows once tile j is done, so the stage of j - 2 is released by the slower consumer
// during its tile j - 1: one consumer may run a tile ahead of the other before it waits for a load.
// Four stages: j - 1 .. j + 2.
//
// Arrivals balance, as named barriers need (a surplus arrival would count in the next phase):
// every consumer syncs full for every tile of the block (also the ones it skips) and arrives at
// empty for every tile that is refilled (tile j when j + kStages < n_tiles), and the turns count
// only the tiles both consumers take (an interval: each takes an interval of the block's tiles).
#include <cstring>
#include <type_traits>

#include "backend/cuda/cuda_flash_wg_dkv.cuh"
#include "backend/cuda/cuda_tma.cuh"
#include "backend/cuda/cuda_tma.h"

namespace ctx::cuda::tc {

namespace {

inline constexpr int kProducerStages = 4;

// Named barrier ids (1-15; 0 is __syncthreads'): full(stage, c), empty(stage), turn(c), and
// kDs, the one-kernel backward's barrier over the consumers before dq's products read every
// consumer's dS tile (DkvPlan's kDq).
template <int kWG>
struct ProducerBarriers {
    static constexpr int kFull = 1, kEmpty = kFull + kProducerStages * kWG;
    static constexpr int kTurn = kEmpty + kProducerStages, kDs = kTurn + kWG;
    static_assert(kDs <= 15, "16 named barriers a block");
    static constexpr int kFullThreads = 2 * kThreads, kAllThreads = (kWG + 1) * kThreads;
    static __device__ __forceinline__ int full(int st, int c) { return kFull + st * kWG + c; }
    static __device__ __forceinline__ int empty(int st) { return kEmpty + st; }
    static __device__ __forceinline__ int turn(int c) { return kTurn + c; }
};

// Registers a thread after setmaxnreg (two consumers): 128 x 24 + 256 x 240 = 64,512 of 65,536.
inline constexpr int kProducerRegs = 24, kConsumerRegs = 240;
static_assert(kThreads * kProducerRegs + 2 * kThreads * kConsumerRegs <= 65536,
              "one block's registers");

// The block's pipeline (the schedule above) for a Plan, one per kernel, which says what is
// staged where and what a consumer computes:
//   n_tiles                              the block's tiles
//   load_rows(thread)                    the producer stages the block's own rows (once)
//   load_tile(j, thread)                 ... and tile j into stage j % kProducerStages, both
//                                        without a commit (the pipeline commits)
//   takes(c, j)                          whether consumer c's rows meet tile j (an interval)
//   make_rows(warp, lane)                a consumer thread's Rows (WgForwardRows, ...)
//   run_tile(rows, wg, j, take, issued)  consumer wg's tile j; issued() after its first products
//   done(rows, wg, sync)                 after the last tile; sync: a barrier over its threads
template <int kWG, class Plan>
__device__ __forceinline__ void producer_pipeline(const Plan& plan) {
    using Bar = ProducerBarriers<kWG>;
    constexpr int kStages = kProducerStages;
    const int n_tiles = plan.n_tiles;
    const int wg = int(threadIdx.x) / kThreads;
    if constexpr (Plan::kTma) {  // the stages' full barriers, before any thread uses them
        if (threadIdx.x == 0) {
            for (int st = 0; st < kStages; st++) mbarrier_init(plan.full(st), kThreads);
            fence_mbarrier_init();
        }
        __syncthreads();
    }

    if (wg == kWG) {  // the producer
        if constexpr (kWG == 2) warpgroup_max_registers<kProducerRegs, false>();
        const int thread = int(threadIdx.x) - kWG * kThreads;
        if constexpr (Plan::kTma) {
            // tile j's copies (the block's rows with tile 0) signal its stage's full barrier
            // as they land: nothing to wait for here but the empty stages
            plan.load_tile(0, thread);
            if (n_tiles > 1) plan.load_tile(1, thread);
            for (int j = 0; j + 2 < n_tiles; j++) {
                if (j + 2 >= kStages)
                    named_barrier_sync(Bar::empty((j + 2) % kStages), Bar::kAllThreads);
                plan.load_tile(j + 2, thread);
            }
        } else {
            auto load = [&](int j) {  // tile j into stage j % kStages, one commit group
                plan.load_tile(j, thread);
                cp_async_commit();
            };
            plan.load_rows(thread);
            load(0);  // the block's rows travel in the first group
            if (n_tiles > 1) load(1);
            for (int j = 0; j < n_tiles; j++) {
                // tile j landed (tile j + 1 may still be in flight), fenced for the async proxy
                if (j + 1 < n_tiles)
                    cp_async_wait<1>();
                else
                    cp_async_wait<0>();
                fence_proxy_async();
#pragma unroll
                for (int c = 0; c < kWG; c++)
                    named_barrier_arrive(Bar::full(j % kStages, c), Bar::kFullThreads);
                if (j + 2 < n_tiles) {
                    if (j + 2 >=
                        kStages)  // the stage of tile j - 2: every consumer is done with it
                        named_barrier_sync(Bar::empty((j + 2) % kStages), Bar::kAllThreads);
                    load(j + 2);
                }
            }
        }
        return;
    }

    // a consumer
    if constexpr (kWG == 2) warpgroup_max_registers<kConsumerRegs, true>();
    auto rows_of_warp = plan.make_rows(int(threadIdx.x) >> 5, int(threadIdx.x) & 31);
    auto both_take = [&](int j) {
        return kWG == 2 && j < n_tiles && plan.takes(0, j) && plan.takes(1, j);
    };
    auto release = [&](int j) {  // this warpgroup no longer reads tile j's stage
        if (j + kStages < n_tiles) named_barrier_arrive(Bar::empty(j % kStages), Bar::kAllThreads);
    };
    // a product still in flight waits through skipped tiles for the next take (WgForwardRows,
    // WgDqRows): at most kWG - 1 follow a warpgroup's last take, and its stage is refilled
    // kStages tiles on; where more may follow (dk / dv with packed documents) nothing is in
    // flight after a tile (kSkipSettles)
    static_assert(kWG <= kStages - 1, "an in-flight product's stage outlives the skipped tiles");
    int held = -1;      // the tile whose stage a product still in flight reads
    bool first = true;  // no tile both consumers take has been issued yet
    bool turns = both_take(0);  // tile j's, then j + 1's (each computed once)
    for (int j = 0; j < n_tiles; j++) {
        if constexpr (Plan::kTma)  // phase j / kStages of the stage's barrier
            mbarrier_wait(plan.full(j % kStages), uint32_t(j / kStages) & 1u);
        else
            named_barrier_sync(Bar::full(j % kStages, wg), Bar::kFullThreads);
        const bool take = plan.takes(wg, j), turns_next = both_take(j + 1);
        // consumer 0 goes first at the first tile both take; the other's last turn is not waited
        if (turns && !(wg == 0 && first)) named_barrier_sync(Bar::turn(wg), Bar::kFullThreads);
        plan.run_tile(rows_of_warp, wg, j, take, [&] {
            if (turns && !(wg == 1 && !turns_next))
                named_barrier_arrive(Bar::turn(1 - wg), Bar::kFullThreads);
        });
        if (turns) first = false;
        turns = turns_next;
        if (take) {
            if (held >= 0) release(held);  // its product has run
            held = j;
        } else {
            release(j);
            // the Rows' products have all run (kSkipSettles): the held stage goes now, as the
            // producer may wait for it long before this consumer's loop ends (dk / dv with
            // packed documents)
            if constexpr (decltype(rows_of_warp)::kSkipSettles)
                if (held >= 0) {
                    release(held);
                    held = -1;
                }
        }
    }
    rows_of_warp.finish();
    if (held >= 0) release(held);
    // a barrier over this consumer's threads for done's sums: full(0, wg), idle now (every phase
    // of it has completed; a phase may name another count)
    plan.done(rows_of_warp, wg, [&] { named_barrier_sync(Bar::full(0, wg), kThreads); });
}

// The packed operands' tensor maps (bf16 [B H][Tp][kD]; g: dO), a kernel parameter: boxes of 64
// head-dim entries by a kernel's row or tile count (tc_maps on the host).
struct TcMaps {
    CUtensorMap q, k, v, g;
};

constexpr uint32_t round_up_1024(size_t bytes) { return uint32_t((bytes + 1023) / 1024 * 1024); }

// Tile j's stage is signalled by its full mbarrier (CTX_FLASH_WGMMA_LOADS=tma): the producer's
// threads store the tile's per-row floats (plain loads, zeros past T) and arrive (release), and
// thread 0 announces the stage's bytes and issues its copies, kD / 64 boxes of 64 head-dim
// entries per operand; the phase completes when all 128 have arrived and every byte has landed.
// Each n-row operand lands as kD / 64 blocks of n x 128 bytes, 128-byte swizzled (Sw128Tiles).
// The block's own rows travel with tile 0.
__device__ __forceinline__ void tma_operand(char* dst, const CUtensorMap* map, uint64_t* bar,
                                            int row0, int bh, int rows, int kD) {
    for (int c = 0; c < kD / 64; c++) tma_load_3d(dst + c * rows * 128, map, bar, 64 * c, row0, bh);
}
__device__ __forceinline__ void store_row_floats(float* dst, const float* src, int i0, int n, int T,
                                                 int thread) {
    for (int c = thread; c < n; c += kThreads) dst[c] = i0 + c < T ? src[i0 + c] : 0.0f;
}

// The forward's and dq kernel's block: kWG * 64 queries from q0 and kRowOps operands of them
// (Q; Q and dO), staged K-major once; per key tile a stage of [K | V | key positions], V
// N-major for the forward's O += P V (kVNMajor), K-major for the dq kernel's dP = dO V^T.
// kTma: the operands by TMA into 128-byte swizzled tiles (V as K: kVNMajor does not apply),
// the block's rows with tile 0, the stages rounded to 1024 bytes and their mbarriers after
// them, all from a 1024-byte aligned start (maps: the call's tensor maps).
template <int kD, int kWG, int kRowOps, bool kVNMajor, bool kTma_ = false>
struct QueryBlock {
    static constexpr bool kTma = kTma_;
    using Tiles = std::conditional_t<kTma, Sw128Tiles<kD>, CoreTiles<kD>>;
    static constexpr int kRows = kWG * kBr;
    static constexpr size_t kRowBytes = size_t(kRows) * kD * 2, kTile = size_t(kBc) * kD * 2;
    static constexpr size_t kStage =
        kTma ? round_up_1024(2 * kTile + kBc * 4) : 2 * kTile + kBc * 4;
    static constexpr size_t kSmem =
        (kTma ? 1024 + 8 * kProducerStages : 0) + kRowOps * kRowBytes + kProducerStages * kStage;
    const TcArgs& a;
    const TcMaps* maps;  // kTma
    char* smem;
    int q0, h, b, k_first, n_tiles;

    __device__ __forceinline__ QueryBlock(const TcArgs& a_, char* smem_,
                                          const TcMaps* maps_ = nullptr)
        : a(a_),
          maps(maps_),
          smem(kTma ? align_shared<1024>(smem_) : smem_),
          q0(tile_index() * kRows),
          h(blockIdx.y),
          b(blockIdx.z) {
        const KeyTiles kt = key_tiles(a, q0, kRows);
        k_first = kt.first;
        n_tiles = kt.count;
    }
    __device__ __forceinline__ int k0(int j) const { return k_first + j * kBc; }
    __device__ __forceinline__ char* Ks(int j) const {
        return smem + kRowOps * kRowBytes + (j % kProducerStages) * kStage;
    }
    __device__ __forceinline__ char* Vs(int j) const { return Ks(j) + kTile; }
    __device__ __forceinline__ float* posK(int j) const {
        return reinterpret_cast<float*>(Vs(j) + kTile);
    }
    __device__ __forceinline__ uint64_t* full(int st) const {  // kTma
        return reinterpret_cast<uint64_t*>(smem + kRowOps * kRowBytes + kProducerStages * kStage) +
               st;
    }
    // consumer wg's 64 rows of row operand o (kTma: a sub-block of each 64-entry block)
    __device__ __forceinline__ const char* own_rows(int wg, int o) const {
        return smem + o * kRowBytes + wg * kBr * (kTma ? 128 : kD * 2);
    }
    __device__ __forceinline__ size_t head_rows() const {
        return (size_t(b) * a.H + h) * a.Tp * kD;
    }
    __device__ __forceinline__ void load_rows(int thread) const {
#pragma unroll
        for (int o = 0; o < kRowOps; o++)  // operand 0 is Q, 1 is dO
            stage_core<kRows, kD, false, kThreads, false>(
                smem + o * kRowBytes, (o == 0 ? a.q : a.g) + head_rows() + size_t(q0) * kD, thread);
    }
    __device__ __forceinline__ void load_tile(int j, int thread) const {
        if constexpr (kTma) {
            uint64_t* bar = full(j % kProducerStages);
            if (needs_positions(a.bs.kind))
                store_row_floats(posK(j), a.pos + size_t(b) * a.T, k0(j), kBc, a.T, thread);
            if (thread != 0) {
                mbarrier_arrive(bar);
                return;
            }
            const int bh = b * a.H + h;
            mbarrier_arrive_expect_tx(bar,
                                      uint32_t(2 * kTile + (j == 0 ? kRowOps * kRowBytes : 0)));
            tma_operand(Ks(j), &maps->k, bar, k0(j), bh, kBc, kD);
            tma_operand(Vs(j), &maps->v, bar, k0(j), bh, kBc, kD);
            if (j == 0)
                for (int o = 0; o < kRowOps; o++)  // operand 0 is Q, 1 is dO
                    tma_operand(smem + o * kRowBytes, o == 0 ? &maps->q : &maps->g, bar, q0, bh,
                                kRows, kD);
        } else {
            const size_t at = head_rows() + size_t(k0(j)) * kD;
            stage_core<kBc, kD, false, kThreads, false>(Ks(j), a.k + at, thread);
            stage_core<kBc, kD, kVNMajor, kThreads, false>(Vs(j), a.v + at, thread);
            if (needs_positions(a.bs.kind))
                stage_floats_async(posK(j), a.pos + size_t(b) * a.T, k0(j), kBc, a.T, thread);
        }
    }
    __device__ __forceinline__ bool takes(int c, int j) const {
        const int c0 = q0 + c * kBr;
        return cover(a, b, c0, c0 + kBr - 1, k0(j), k0(j) + kBc - 1) != kSkip;
    }
};

template <int kD, int kWG, bool kTables, class Block = QueryBlock<kD, kWG, 1, true>>
struct ForwardPlan : Block {
    using Rows = WgForwardRows<kD, kTables, typename Block::Tiles, Block::kRows>;
    float *out, *lse;

    template <class... BlockArgs>
    __device__ __forceinline__ ForwardPlan(float* out_, float* lse_, const BlockArgs&... block)
        : Block(block...), out(out_), lse(lse_) {}
    __device__ __forceinline__ Rows make_rows(int warp, int lane) const {
        return Rows(this->a, this->b, this->h, this->q0, warp, lane);
    }
    template <class Issued>
    __device__ __forceinline__ void run_tile(Rows& r, int wg, int j, bool take,
                                             Issued&& issued) const {
        r.tile(this->a, this->b, this->own_rows(wg, 0), this->Ks(j), this->Vs(j), this->posK(j),
               this->k0(j), take, issued);
    }
    template <class Sync>
    __device__ __forceinline__ void done(Rows& r, int, Sync&&) const {
        r.write(this->a, out, lse, this->b);
    }
};

// dq += dS K in flight into the next tile (WgDqRows): its K stays staged until then. kGrads: the
// bias-parameter gradients into partials too.
template <int kD, int kWG, bool kGrads, class Block = QueryBlock<kD, kWG, 2, false>>
struct DqPlan : Block {
    using Rows = WgDqRows<kD, true, kGrads, typename Block::Tiles, Block::kRows>;
    float *dqkv, *partials;
    const float *lse, *dvec;
    double* red;  // kGrads: 8 doubles a consumer for write_param_grads' sums

    template <class... BlockArgs>
    __device__ __forceinline__ DqPlan(float* dqkv_, float* partials_, const float* lse_,
                                      const float* dvec_, double* red_, const BlockArgs&... block)
        : Block(block...), dqkv(dqkv_), partials(partials_), lse(lse_), dvec(dvec_), red(red_) {}
    __device__ __forceinline__ Rows make_rows(int warp, int lane) const {
        return Rows(this->a, this->b, this->h, this->q0, warp, lane, lse, dvec);
    }
    template <class Issued>
    __device__ __forceinline__ void run_tile(Rows& r, int wg, int j, bool take,
                                             Issued&& issued) const {
        r.tile(this->a, this->b, this->own_rows(wg, 0), this->own_rows(wg, 1), this->Ks(j),
               this->Vs(j), this->posK(j), this->k0(j), take, issued);
    }
    template <class Sync>
    __device__ __forceinline__ void done(Rows& r, int wg, Sync&& sync) const {
        r.write(this->a, dqkv, this->b);
        if constexpr (kGrads)
            r.write_param_grads(this->a, partials, this->b, this->q0 + wg * kBr, red + wg * 8,
                                sync);
    }
};

// The dk / dv kernel's block: kWG * 64 keys from k0, K and V staged K-major once; per query tile
// of kBqWg a stage of [Q | dO (K-major) | the queries' positions, log-sum-exps, D].
// kInFlight: dv's and dk's products in flight into the next tile (head dim 64 without packed
// documents, as the lock-step kernel's: WgDkvRows::kSkipSettles). kTma: the operands by TMA
// into 128-byte swizzled tiles as QueryBlock's (K and V with tile 0), each stage rounded to
// 1024 bytes, the stages' mbarriers after them.
// kDq: the one-kernel backward (CTX_FLASH_BACKWARD=atomic; WgDkvRows' kDqAtomic): after each
// tile the consumers meet at the kDs barrier and each adds its columns of dq over every
// consumer's dS tile. The dS tiles are double-buffered by the tile's parity: the consumers are
// not in step, and one may store tile j + 1's dS while the other's products still read tile j's
// (they have read it before that one passes tile j + 1's kDs barrier, so two buffers suffice).
// dS (or a consumer's zeros) is stored only on tiles some consumer takes, each of which has its
// kDs barrier, and those tiles are a run (causality, windows and documents): a tile none takes
// would have no barrier to order its stores after the other consumer's reads.
// By cp.async only: at head dim 128 with two consumers the four stages and 32 KiB of dS tiles
// fill the 227 KiB a block may have, leaving no room for TMA's alignment and barriers.
template <int kD, int kWG, bool kInFlight, bool kTma_ = false, bool kDq = false>
struct DkvPlan {
    static_assert(!(kDq && (kTma_ || kInFlight)), "the one-kernel form: cp.async, settled tiles");
    static constexpr bool kTma = kTma_;
    using Tiles = std::conditional_t<kTma, Sw128Tiles<kD>, CoreTiles<kD>>;
    // At head dim 128 with two consumers (240 registers) dv's products wait for dS^T:
    // overlapping it they keep P^T's fragments live, which spilled 52 bytes (sm_90a, CUDA 13.0,
    // 2026-12-06); the other consumer's products keep the tensor core busy meanwhile.
    static constexpr bool kDvOverlapsDs = kD <= 64 || kWG == 1;
    static constexpr int kKeyRows = kWG * kBc;
    using Rows = WgDkvRows<kD, kInFlight, kDvOverlapsDs, kDq, Tiles, kKeyRows>;
    static constexpr size_t kKeys = size_t(kKeyRows) * kD * 2, kTile = size_t(kBqWg) * kD * 2;
    static constexpr size_t kStage =
        kTma ? round_up_1024(2 * kTile + 3 * kBqWg * 4) : 2 * kTile + 3 * kBqWg * 4;
    static constexpr size_t kDsBuffer = size_t(kWG) * kDsTileBytes;  // a tile's dS tiles
    static constexpr size_t kSmem = (kTma ? 1024 + 8 * kProducerStages : 0) + 2 * kKeys +
                                    kProducerStages * kStage + (kDq ? 2 * kDsBuffer : 0);
    const TcArgs& a;
    const TcMaps* maps;  // kTma
    char* smem;
    float* dqkv;
    const float *lse, *dvec;
    int k0, h, b, n_tiles;

    __device__ __forceinline__ DkvPlan(const TcArgs& a_, const TcMaps* maps_, char* smem_,
                                       float* dqkv_, const float* lse_, const float* dvec_)
        : a(a_),
          maps(maps_),
          smem(kTma ? align_shared<1024>(smem_) : smem_),
          dqkv(dqkv_),
          lse(lse_),
          dvec(dvec_),
          k0(blockIdx.x * kKeyRows),  // the earliest keys first: they meet the most queries
          h(blockIdx.y),
          b(blockIdx.z),
          n_tiles(dkv_query_tiles(a_, k0, kKeyRows)) {}
    __device__ __forceinline__ int q0(int j) const { return k0 + j * kBqWg; }
    __device__ __forceinline__ char* Qs(int j) const {
        return smem + 2 * kKeys + (j % kProducerStages) * kStage;
    }
    __device__ __forceinline__ char* dOs(int j) const { return Qs(j) + kTile; }
    __device__ __forceinline__ float* posQ(int j) const {
        return reinterpret_cast<float*>(dOs(j) + kTile);
    }
    __device__ __forceinline__ float* lseQ(int j) const { return posQ(j) + kBqWg; }
    __device__ __forceinline__ float* dQ(int j) const { return lseQ(j) + kBqWg; }
    __device__ __forceinline__ uint64_t* full(int st) const {
        return reinterpret_cast<uint64_t*>(smem + 2 * kKeys + kProducerStages * kStage) + st;
    }
    // kDq: tile j's dS tiles (after the stages; kDq has no mbarriers there)
    __device__ __forceinline__ char* ds(int j) const {
        return smem + 2 * kKeys + kProducerStages * kStage + (j & 1) * kDsBuffer;
    }
    __device__ __forceinline__ size_t bh() const { return size_t(b) * a.H + h; }
    __device__ __forceinline__ void load_rows(int thread) const {
        const size_t at = (bh() * a.Tp + k0) * kD;
        stage_core<kKeyRows, kD, false, kThreads, false>(smem, a.k + at, thread);
        stage_core<kKeyRows, kD, false, kThreads, false>(smem + kKeys, a.v + at, thread);
    }
    __device__ __forceinline__ void load_tile(int j, int thread) const {
        if constexpr (kTma) {
            uint64_t* bar = full(j % kProducerStages);
            if (needs_positions(a.bs.kind))
                store_row_floats(posQ(j), a.pos + size_t(b) * a.T, q0(j), kBqWg, a.T, thread);
            store_row_floats(lseQ(j), lse + bh() * a.T, q0(j), kBqWg, a.T, thread);
            store_row_floats(dQ(j), dvec + bh() * a.T, q0(j), kBqWg, a.T, thread);
            if (thread != 0) {
                mbarrier_arrive(bar);
                return;
            }
            mbarrier_arrive_expect_tx(bar, uint32_t(2 * kTile + (j == 0 ? 2 * kKeys : 0)));
            tma_operand(Qs(j), &maps->q, bar, q0(j), int(bh()), kBqWg, kD);
            tma_operand(dOs(j), &maps->g, bar, q0(j), int(bh()), kBqWg, kD);
            if (j == 0) {
                tma_operand(smem, &maps->k, bar, k0, int(bh()), kKeyRows, kD);
                tma_operand(smem + kKeys, &maps->v, bar, k0, int(bh()), kKeyRows, kD);
            }
        } else {
            const size_t at = (bh() * a.Tp + q0(j)) * kD;
            stage_core<kBqWg, kD, false, kThreads, false>(Qs(j), a.q + at, thread);
            stage_core<kBqWg, kD, false, kThreads, false>(dOs(j), a.g + at, thread);
            if (needs_positions(a.bs.kind))
                stage_floats_async(posQ(j), a.pos + size_t(b) * a.T, q0(j), kBqWg, a.T, thread);
            stage_floats_async(lseQ(j), lse + bh() * a.T, q0(j), kBqWg, a.T, thread);
            stage_floats_async(dQ(j), dvec + bh() * a.T, q0(j), kBqWg, a.T, thread);
        }
    }
    __device__ __forceinline__ bool takes(int c, int j) const {
        return dkv_tile_meets(a, b, q0(j), k0 + c * kBc);
    }
    __device__ __forceinline__ Rows make_rows(int warp, int lane) const {
        return Rows(a, b, h, k0, warp, lane, kDq ? ds(0) : nullptr);
    }
    template <class Issued>
    __device__ __forceinline__ void run_tile(Rows& r, int wg, int j, bool take,
                                             Issued&& issued) const {
        // this consumer's 64 keys of K, V: a sub-block of their rows (of each 64-entry block)
        const char* Kg = smem + wg * kBc * (kTma ? 128 : kD * 2);
        if constexpr (kDq) r.ds_tiles = ds(j);
        r.tile(a, b, Kg, Kg + kKeys, Qs(j), dOs(j), posQ(j), lseQ(j), dQ(j), q0(j), take, issued);
        if constexpr (kDq)  // every consumer, or none when none takes the tile (kSkip for all)
            if (takes(0, j) || (kWG == 2 && takes(1, j)))
                r.add_dq(a, b, smem, q0(j), take, dqkv,
                         [] { named_barrier_sync(ProducerBarriers<kWG>::kDs, kWG * kThreads); });
    }
    template <class Sync>
    __device__ __forceinline__ void done(Rows& r, int, Sync&&) const {
        r.write(a, dqkv, b);
    }
};

template <int kD, int kWG, bool kTables>
__global__ void __launch_bounds__((kWG + 1) * kThreads, 1)
    flash_wg_fwd_producer_kernel(float* out, float* lse, TcArgs a) {
    extern __shared__ float sm[];
    producer_pipeline<kWG>(ForwardPlan<kD, kWG, kTables>(out, lse, a, reinterpret_cast<char*>(sm)));
}

template <int kD, int kWG, bool kTables>
__global__ void __launch_bounds__((kWG + 1) * kThreads, 1)
    flash_wg_fwd_tma_kernel(float* out, float* lse, TcArgs a, const __grid_constant__ TcMaps maps) {
    extern __shared__ float sm[];
    producer_pipeline<kWG>(ForwardPlan<kD, kWG, kTables, QueryBlock<kD, kWG, 1, true, true>>(
        out, lse, a, reinterpret_cast<char*>(sm), &maps));
}

template <int kD, int kWG, bool kGrads>
__global__ void __launch_bounds__((kWG + 1) * kThreads, 1)
    flash_wg_dq_producer_kernel(float* dqkv, float* partials, const float* lse, const float* dvec,
                                TcArgs a) {
    extern __shared__ float sm[];
    __shared__ double red[kGrads ? kWG * 8 : 1];
    producer_pipeline<kWG>(
        DqPlan<kD, kWG, kGrads>(dqkv, partials, lse, dvec, red, a, reinterpret_cast<char*>(sm)));
}

template <int kD, int kWG, bool kGrads>
__global__ void __launch_bounds__((kWG + 1) * kThreads, 1)
    flash_wg_dq_tma_kernel(float* dqkv, float* partials, const float* lse, const float* dvec,
                           TcArgs a, const __grid_constant__ TcMaps maps) {
    extern __shared__ float sm[];
    __shared__ double red[kGrads ? kWG * 8 : 1];
    producer_pipeline<kWG>(DqPlan<kD, kWG, kGrads, QueryBlock<kD, kWG, 2, false, true>>(
        dqkv, partials, lse, dvec, red, a, reinterpret_cast<char*>(sm), &maps));
}

template <int kD, int kWG, bool kInFlight, bool kDq = false>
__global__ void __launch_bounds__((kWG + 1) * kThreads, 1)
    flash_wg_dkv_producer_kernel(float* dqkv, const float* lse, const float* dvec, TcArgs a) {
    extern __shared__ float sm[];
    producer_pipeline<kWG>(DkvPlan<kD, kWG, kInFlight, false, kDq>(
        a, nullptr, reinterpret_cast<char*>(sm), dqkv, lse, dvec));
}

template <int kD, int kWG, bool kInFlight>
__global__ void __launch_bounds__((kWG + 1) * kThreads, 1)
    flash_wg_dkv_tma_kernel(float* dqkv, const float* lse, const float* dvec, TcArgs a,
                            const __grid_constant__ TcMaps maps) {
    extern __shared__ float sm[];
    producer_pipeline<kWG>(
        DkvPlan<kD, kWG, kInFlight, true>(a, &maps, reinterpret_cast<char*>(sm), dqkv, lse, dvec));
}

// The tensor maps of a call: q and (with dO) g in boxes of query_rows, k and v of key_rows.
TcMaps tc_maps(const TcArgs& a, int B, int kD, int query_rows, int key_rows, bool with_g,
               const char* what) {
    TcMaps maps;
    std::memset(&maps, 0, sizeof maps);
    TmaBf16Tensor t;
    t.rank = 3;
    t.dims[0] = uint64_t(kD), t.dims[1] = uint64_t(a.Tp), t.dims[2] = uint64_t(B) * a.H;
    t.strides[0] = uint64_t(kD) * 2, t.strides[1] = uint64_t(a.Tp) * kD * 2;
    t.box[0] = 64, t.box[2] = 1;
    const struct {
        CUtensorMap* map;
        const uint16_t* base;
        int rows;
        bool used;
    } ops[4] = {{&maps.q, a.q, query_rows, true},
                {&maps.k, a.k, key_rows, true},
                {&maps.v, a.v, key_rows, true},
                {&maps.g, a.g, query_rows, with_g}};
    for (const auto& op : ops)
        if (op.used) {
            t.base = op.base;
            t.box[1] = uint32_t(op.rows);
            encode_tma_map(op.map, t, what);
        }
    return maps;
}

}  // namespace

cudaError_t launch_flash_wg_forward_producer(float* out, float* lse, const TcArgs& a, int B, int kD,
                                             int warpgroups, bool tma, cudaStream_t s) {
    return with_wg_forward_shape(kD, warpgroups, a.ktab != nullptr, [&](auto d, auto w, auto tab) {
        constexpr int kD_ = decltype(d)::value, kWG = decltype(w)::value;
        constexpr bool kTab = decltype(tab)::value;
        const dim3 grid = wg_grid(a, B, kWG), block((kWG + 1) * kThreads);
        if (tma) {
            using Block = QueryBlock<kD_, kWG, 1, true, true>;
            const TcMaps maps = tc_maps(a, B, kD_, Block::kRows, kBc, false, "flash forward (TMA)");
            auto* k = &flash_wg_fwd_tma_kernel<kD_, kWG, kTab>;
            static DynamicSharedLimit limit;
            if (const cudaError_t e = limit.raise(k, Block::kSmem); e != cudaSuccess) return e;
            k<<<grid, block, Block::kSmem, s>>>(out, lse, a, maps);
            return cudaGetLastError();
        }
        constexpr size_t smem = QueryBlock<kD_, kWG, 1, true>::kSmem;
        auto* k = &flash_wg_fwd_producer_kernel<kD_, kWG, kTab>;
        static DynamicSharedLimit limit;
        if (const cudaError_t e = limit.raise(k, smem); e != cudaSuccess) return e;
        k<<<grid, block, smem, s>>>(out, lse, a);
        return cudaGetLastError();
    });
}

cudaError_t launch_flash_wg_dq_producer(float* dqkv, float* partials, const float* lse,
                                        const float* dvec, const TcArgs& a, int B, int kD,
                                        int warpgroups, bool tma, cudaStream_t s) {
    return with_wg_shape(kD, warpgroups, [&](auto d, auto w) {
        constexpr int kD_ = decltype(d)::value, kWG = decltype(w)::value;
        const dim3 grid = wg_grid(a, B, kWG), block((kWG + 1) * kThreads);
        if (tma) {
            using Block = QueryBlock<kD_, kWG, 2, false, true>;
            const TcMaps maps = tc_maps(a, B, kD_, Block::kRows, kBc, true, "flash dq (TMA)");
            static DynamicSharedLimit plain, grads;  // one per kernel (the two share a type)
            auto launch = [&](auto* k, DynamicSharedLimit& limit) {
                if (const cudaError_t e = limit.raise(k, Block::kSmem); e != cudaSuccess) return e;
                k<<<grid, block, Block::kSmem, s>>>(dqkv, partials, lse, dvec, a, maps);
                return cudaGetLastError();
            };
            return partials != nullptr ? launch(&flash_wg_dq_tma_kernel<kD_, kWG, true>, grads)
                                       : launch(&flash_wg_dq_tma_kernel<kD_, kWG, false>, plain);
        }
        constexpr size_t smem = QueryBlock<kD_, kWG, 2, false>::kSmem;
        static DynamicSharedLimit plain, grads;  // one per kernel (the two share a type)
        auto launch = [&](auto* k, DynamicSharedLimit& limit) {
            if (const cudaError_t e = limit.raise(k, smem); e != cudaSuccess) return e;
            k<<<grid, block, smem, s>>>(dqkv, partials, lse, dvec, a);
            return cudaGetLastError();
        };
        return partials != nullptr ? launch(&flash_wg_dq_producer_kernel<kD_, kWG, true>, grads)
                                   : launch(&flash_wg_dq_producer_kernel<kD_, kWG, false>, plain);
    });
}

cudaError_t launch_flash_wg_dkv_producer(float* dqkv, const float* lse, const float* dvec,
                                         const TcArgs& a, int B, int kD, int warpgroups, bool tma,
                                         cudaStream_t s) {
    return with_wg_shape(kD, warpgroups, [&](auto d, auto w) {
        constexpr int kD_ = decltype(d)::value, kWG = decltype(w)::value;
        const dim3 grid = wg_grid(a, B, kWG), block((kWG + 1) * kThreads);
        // products in flight at head dim 64 unless rows are packed
        const bool flowing = kD_ <= 64 && a.doc_start == nullptr;
        if (tma) {
            constexpr size_t smem = DkvPlan<kD_, kWG, false, true>::kSmem;
            const TcMaps maps = tc_maps(a, B, kD_, kBqWg, kWG * kBc, true, "flash dk/dv (TMA)");
            static DynamicSharedLimit flowing_limit, settled_limit;
            auto launch = [&](auto* k, DynamicSharedLimit& limit) {
                if (const cudaError_t e = limit.raise(k, smem); e != cudaSuccess) return e;
                k<<<grid, block, smem, s>>>(dqkv, lse, dvec, a, maps);
                return cudaGetLastError();
            };
            if constexpr (kD_ <= 64) {
                static_assert(DkvPlan<kD_, kWG, true, true>::kSmem == smem, "one layout");
                if (flowing) return launch(&flash_wg_dkv_tma_kernel<kD_, kWG, true>, flowing_limit);
            }
            return launch(&flash_wg_dkv_tma_kernel<kD_, kWG, false>, settled_limit);
        }
        constexpr size_t smem = DkvPlan<kD_, kWG, false>::kSmem;
        static DynamicSharedLimit flowing_limit, settled_limit;  // one per kernel (one type)
        auto launch = [&](auto* k, DynamicSharedLimit& limit) {
            if (const cudaError_t e = limit.raise(k, smem); e != cudaSuccess) return e;
            k<<<grid, block, smem, s>>>(dqkv, lse, dvec, a);
            return cudaGetLastError();
        };
        if constexpr (kD_ <= 64) {
            static_assert(DkvPlan<kD_, kWG, true>::kSmem == smem, "one layout");
            if (flowing)
                return launch(&flash_wg_dkv_producer_kernel<kD_, kWG, true>, flowing_limit);
        }
        return launch(&flash_wg_dkv_producer_kernel<kD_, kWG, false>, settled_limit);
    });
}

cudaError_t launch_flash_wg_backward_atomic_producer(float* dqkv, const float* lse,
                                                     const float* dvec, const TcArgs& a, int B,
                                                     int kD, int warpgroups, cudaStream_t s) {
    return with_wg_shape(kD, warpgroups, [&](auto d, auto w) {
        constexpr int kD_ = decltype(d)::value, kWG = decltype(w)::value;
        constexpr size_t smem = DkvPlan<kD_, kWG, false, false, true>::kSmem;
        auto* k = &flash_wg_dkv_producer_kernel<kD_, kWG, false, true>;
        static DynamicSharedLimit limit;  // one per instantiation of this lambda
        if (const cudaError_t e = limit.raise(k, smem); e != cudaSuccess) return e;
        k<<<wg_grid(a, B, kWG), (kWG + 1) * kThreads, smem, s>>>(dqkv, lse, dvec, a);
        return cudaGetLastError();
    });
}

}  // namespace ctx::cuda::tc
