// The wgmma flash forward and dq kernel with a producer warpgroup
// (CTX_FLASH_WGMMA_PIPELINE=producer), an A/B against the lock-step kernels of
// cuda_flash_wg_sm90a.cu until a GPU has timed both.
//
// In the lock-step kernels every warpgroup stages a share of each tile and all meet at the block
// barrier once a tile, so both run their products at the same moments and both do their
// per-logit arithmetic at the same moments, while the tensor core waits. Here (FlashAttention-3's
// warp specialisation) a block is kWG consumer warpgroups, which compute exactly what the
// lock-step kernels' do (WgForwardRows, WgDqRows: the same bits), and one producer warpgroup,
// which only copies: the block's query rows once (Q; Q and dO), then K, V and the key positions
// of every tile into kStages stages. They meet at named barriers (cuda_device.cuh), never at the
// block's:
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
// forward's P V, the dq kernel's dS K) has run, which it knows once tile j is done, so the stage
// of j - 2 is released by the slower consumer during its tile j - 1: one consumer may run a tile
// ahead of the other before it waits for a load. Four stages: j - 1 .. j + 2.
//
// Arrivals balance, as named barriers need (a surplus arrival would count in the next phase):
// every consumer syncs full for every tile of the block (also the ones it skips) and arrives at
// empty for every tile that is refilled (tile j when j + kStages < n_tiles), and the turns count
// only the tiles both consumers take (an interval: each takes an interval of the block's tiles).
#include "backend/cuda/cuda_flash_wg.cuh"

namespace ctx::cuda::tc {

namespace {

inline constexpr int kProducerStages = 4;

// Shared memory: kRowOps operands of the block's query rows (Q; Q and dO), then the stages of
// [K | V | key positions].
template <int kD, int kWG, int kRowOps>
constexpr size_t wg_producer_smem() {
    return size_t(kRowOps) * kWG * kBr * kD * 2 +
           kProducerStages * (2 * size_t(kBc) * kD * 2 + kBc * 4);
}

// Named barrier ids (1-15; 0 is __syncthreads'): full(stage, c), empty(stage), turn(c).
template <int kWG>
struct ProducerBarriers {
    static constexpr int kFull = 1, kEmpty = kFull + kProducerStages * kWG;
    static constexpr int kTurn = kEmpty + kProducerStages;
    static_assert(kTurn + kWG - 1 <= 15, "16 named barriers a block");
    static constexpr int kFullThreads = 2 * kThreads, kAllThreads = (kWG + 1) * kThreads;
    static __device__ __forceinline__ int full(int st, int c) { return kFull + st * kWG + c; }
    static __device__ __forceinline__ int empty(int st) { return kEmpty + st; }
    static __device__ __forceinline__ int turn(int c) { return kTurn + c; }
};

// Registers a thread after setmaxnreg (two consumers): 128 x 24 + 256 x 240 = 64,512 of 65,536.
inline constexpr int kProducerRegs = 24, kConsumerRegs = 240;
static_assert(kThreads * kProducerRegs + 2 * kThreads * kConsumerRegs <= 65536,
              "one block's registers");

// The block's pipeline. Rows: WgForwardRows or WgDqRows, made by make_rows(warp, lane) in each
// consumer thread; row_src[o]: operand o's rows in global memory (this head's, from row 0);
// kVNMajor: V staged N-major (the forward's O += P V) or K-major (the dq kernel's dP = dO V^T).
// Per tile a consumer calls run_tile(rows, its row operands, their stride, K, V, positions, k0,
// take, issued); after the last, done(rows, its warpgroup, a barrier over its threads).
template <int kD, int kWG, int kRowOps, bool kVNMajor, class MakeRows, class RunTile, class Done>
__device__ __forceinline__ void producer_pipeline(const TcArgs& a,
                                                  const uint16_t* const (&row_src)[kRowOps],
                                                  MakeRows&& make_rows, RunTile&& run_tile,
                                                  Done&& done) {
    extern __shared__ float sm[];
    using Bar = ProducerBarriers<kWG>;
    constexpr int kStages = kProducerStages, kRows = kWG * kBr;
    constexpr size_t kRowBytes = size_t(kRows) * kD * 2, kTile = size_t(kBc) * kD * 2;
    constexpr size_t kStage = 2 * kTile + kBc * 4;
    char* rows_smem = reinterpret_cast<char*>(sm);
    auto Ks = [&](int st) { return rows_smem + kRowOps * kRowBytes + st * kStage; };
    auto Vs = [&](int st) { return Ks(st) + kTile; };
    auto posK = [&](int st) { return reinterpret_cast<float*>(Vs(st) + kTile); };
    const int T = a.T, q0 = tile_index() * kRows, h = blockIdx.y, b = blockIdx.z;
    const int k_first = first_key_tile(q0, a.window), j_last = min(T - 1, q0 + kRows - 1);
    const int n_tiles = (j_last - k_first) / kBc + 1;
    const int wg = int(threadIdx.x) / kThreads;

    if (wg == kWG) {  // the producer
        if constexpr (kWG == 2) warpgroup_max_registers<kProducerRegs, false>();
        const int thread = int(threadIdx.x) - kWG * kThreads;
        const size_t rows = (size_t(b) * a.H + h) * a.Tp * kD;
        const float* pos = a.pos + size_t(b) * T;
        const bool positions = needs_positions(a.bs.kind);
        auto load = [&](int j) {  // tile j into stage j % kStages, one commit group
            const int st = j % kStages, k0 = k_first + j * kBc;
            stage_core<kBc, kD, false, kThreads, false>(Ks(st), a.k + rows + size_t(k0) * kD,
                                                        thread);
            stage_core<kBc, kD, kVNMajor, kThreads, false>(Vs(st), a.v + rows + size_t(k0) * kD,
                                                           thread);
            if (positions) stage_floats_async(posK(st), pos, k0, kBc, T, thread);
            cp_async_commit();
        };
#pragma unroll
        for (int o = 0; o < kRowOps; o++)
            stage_core<kRows, kD, false, kThreads, false>(
                rows_smem + o * kRowBytes, row_src[o] + rows + size_t(q0) * kD, thread);
        load(0);  // the query rows travel in the first group
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
                if (j + 2 >= kStages)  // the stage of tile j - 2: every consumer is done with it
                    named_barrier_sync(Bar::empty((j + 2) % kStages), Bar::kAllThreads);
                load(j + 2);
            }
        }
        return;
    }

    // a consumer: this warpgroup's 64 queries, their K-major rows of each row operand
    if constexpr (kWG == 2) warpgroup_max_registers<kConsumerRegs, true>();
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
    const char* own_rows = rows_smem + wg * kBr * kD * 2;  // operand o at + o kRowBytes
    auto rows_of_warp = make_rows(warp, lane);
    auto takes = [&](int c, int k0) {  // whether consumer c's rows see the tile from k0
        const int c0 = q0 + c * kBr;
        return cover(a, b, c0, c0 + kBr - 1, k0, k0 + kBc - 1) != kSkip;
    };
    auto both_take = [&](int j) {
        const int k0 = k_first + j * kBc;
        return kWG == 2 && j < n_tiles && takes(0, k0) && takes(1, k0);
    };
    auto release = [&](int j) {  // this warpgroup no longer reads tile j's stage
        if (j + kStages < n_tiles) named_barrier_arrive(Bar::empty(j % kStages), Bar::kAllThreads);
    };
    // a product still in flight waits through skipped tiles for the next take (WgForwardRows):
    // at most kWG - 1 follow a warpgroup's last take, and its stage is refilled kStages tiles on
    static_assert(kWG <= kStages - 1, "an in-flight product's stage outlives the skipped tiles");
    int held = -1;      // the tile whose stage a product still in flight reads
    bool first = true;  // no tile both consumers take has been issued yet
    bool turns = both_take(0);  // tile j's, then j + 1's (each computed once)
    for (int j = 0; j < n_tiles; j++) {
        const int k0 = k_first + j * kBc, st = j % kStages;
        named_barrier_sync(Bar::full(st, wg), Bar::kFullThreads);
        const bool take = takes(wg, k0), turns_next = both_take(j + 1);
        // consumer 0 goes first at the first tile both take; the other's last turn is not waited
        if (turns && !(wg == 0 && first)) named_barrier_sync(Bar::turn(wg), Bar::kFullThreads);
        run_tile(rows_of_warp, own_rows, kRowBytes, Ks(st), Vs(st), posK(st), k0, take, [&] {
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
        }
    }
    rows_of_warp.finish();
    if (held >= 0) release(held);
    // a barrier over this consumer's threads for done's sums: full(0, wg), idle now (every phase
    // of it has completed; a phase may name another count)
    done(rows_of_warp, wg, [&] { named_barrier_sync(Bar::full(0, wg), kThreads); });
}

template <int kD, int kWG, bool kTables>
__global__ void __launch_bounds__((kWG + 1) * kThreads, 1)
    flash_wg_fwd_producer_kernel(float* out, float* lse, TcArgs a) {
    using Rows = WgForwardRows<kD, kTables>;
    const int q0 = tile_index() * kWG * kBr, h = blockIdx.y, b = blockIdx.z;
    const uint16_t* const rows[1] = {a.q};
    producer_pipeline<kD, kWG, 1, true>(
        a, rows, [&](int warp, int lane) { return Rows(a, b, h, q0, warp, lane); },
        [&](Rows& r, const char* Qg, size_t, const char* Ks, const char* Vs, const float* pk,
            int k0, bool take, auto&& issued) { r.tile(a, b, Qg, Ks, Vs, pk, k0, take, issued); },
        [&](Rows& r, int, auto&&) { r.write(a, out, lse, b); });
}

// dq += dS K in flight into the next tile (WgDqRows): its K stays staged until then. kGrads: the
// bias-parameter gradients into partials too.
template <int kD, int kWG, bool kGrads>
__global__ void __launch_bounds__((kWG + 1) * kThreads, 1)
    flash_wg_dq_producer_kernel(float* dqkv, float* partials, const float* lse, const float* dvec,
                                TcArgs a) {
    using Rows = WgDqRows<kD, true, kGrads>;
    const int q0 = tile_index() * kWG * kBr, h = blockIdx.y, b = blockIdx.z;
    const uint16_t* const rows[2] = {a.q, a.g};
    __shared__ double red[kGrads ? kWG * 8 : 1];
    producer_pipeline<kD, kWG, 2, false>(
        a, rows, [&](int warp, int lane) { return Rows(a, b, h, q0, warp, lane, lse, dvec); },
        [&](Rows& r, const char* Qg, size_t row_bytes, const char* Ks, const char* Vs,
            const float* pk, int k0, bool take,
            auto&& issued) { r.tile(a, b, Qg, Qg + row_bytes, Ks, Vs, pk, k0, take, issued); },
        [&](Rows& r, int wg, auto&& sync) {
            r.write(a, dqkv, b);
            if constexpr (kGrads)
                r.write_param_grads(a, partials, b, q0 + wg * kBr, red + wg * 8, sync);
        });
}

}  // namespace

cudaError_t launch_flash_wg_forward_producer(float* out, float* lse, const TcArgs& a, int B, int kD,
                                             int warpgroups, cudaStream_t s) {
    return with_wg_forward_shape(kD, warpgroups, a.ktab != nullptr, [&](auto d, auto w, auto tab) {
        constexpr int kD_ = decltype(d)::value, kWG = decltype(w)::value;
        constexpr size_t smem = wg_producer_smem<kD_, kWG, 1>();
        auto* k = &flash_wg_fwd_producer_kernel<kD_, kWG, decltype(tab)::value>;
        static DynamicSharedLimit limit;
        if (const cudaError_t e = limit.raise(k, smem); e != cudaSuccess) return e;
        k<<<wg_grid(a, B, kWG), (kWG + 1) * kThreads, smem, s>>>(out, lse, a);
        return cudaGetLastError();
    });
}

cudaError_t launch_flash_wg_dq_producer(float* dqkv, float* partials, const float* lse,
                                        const float* dvec, const TcArgs& a, int B, int kD,
                                        int warpgroups, cudaStream_t s) {
    return with_wg_shape(kD, warpgroups, [&](auto d, auto w) {
        constexpr int kD_ = decltype(d)::value, kWG = decltype(w)::value;
        constexpr size_t smem = wg_producer_smem<kD_, kWG, 2>();
        static DynamicSharedLimit plain, grads;  // one per kernel (the two share a type)
        auto launch = [&](auto* k, DynamicSharedLimit& limit) {
            if (const cudaError_t e = limit.raise(k, smem); e != cudaSuccess) return e;
            k<<<wg_grid(a, B, kWG), (kWG + 1) * kThreads, smem, s>>>(dqkv, partials, lse, dvec, a);
            return cudaGetLastError();
        };
        return partials != nullptr ? launch(&flash_wg_dq_producer_kernel<kD_, kWG, true>, grads)
                                   : launch(&flash_wg_dq_producer_kernel<kD_, kWG, false>, plain);
    });
}

}  // namespace ctx::cuda::tc
