// The tensor-core flash forward on sm_90's warpgroup instruction (wgmma, cuda_wgmma.cuh):
// CTX_FLASH_FORWARD=wgmma, an A/B against the mma.sync forward of cuda_flash_tc.cu until a GPU
// has timed both (docs/CUDA.md "wgmma").
//
// The algorithm and the numbers are those of flash_tc_fwd_kernel with one m-tile per warp (the
// same per-logit bias, masks, base-2 online softmax, P rounded to bf16, fp32 accumulation); what
// changes is who computes the two products. A warpgroup (the same 4 warps) takes 64 queries, and
// per key tile of 64:
//   S (64 x 64)  = Q K^T   one wgmma per 16 columns of the head dim, Q and K read by the
//                          tensor core from shared memory (K-major core matrices), no ldmatrix
//   O (64 x kD) += P V     one wgmma per 16 keys, P from registers (the A fragments the mma.sync
//                          kernel packs), V read N-major from shared memory (its rows as stored),
//                          issued with the next tile's S and run during its softmax
// Each warp's accumulators are exactly the mma.sync kernel's C fragments (s[n][e] = d[4 n + e]),
// so the logit loop, softmax and epilogue below are that kernel's. A product is collective over
// the warpgroup: a key tile is skipped only when it is masked for the warpgroup's 64 rows; a warp
// whose own rows it masks takes the tile through the masked loop (its P is 0).
//
// A block is kWG warpgroups (FlashTcKernels::wgmma_warpgroups: 2 by default, or 1) that share
// the block's staged tiles: the forward's and dq kernel's K and V, the dk / dv kernel's Q and dO.
// Each warpgroup's results do not depend on kWG (a tile past its own range is one it skips).
//
// Head dims 64 and 128, the inline bias families (none, ALiBi, KERPLE-log); the launcher sends
// the rest to the mma.sync kernel. The dq and dk / dv kernels below do the same for the backward.
// Compiled for sm_90a only (engine/CMakeLists.txt).
#include "backend/cuda/cuda_flash_wg_dkv.cuh"

namespace ctx::cuda::tc {

namespace {

// The forward's key tiles in flight: the one whose O += P V is still to run, the one being
// worked on, the next one loading.
inline constexpr int kFwdStages = 3;

template <int kD, int kWG>
constexpr size_t wg_fwd_smem() {
    return size_t(kWG) * kBr * kD * 2 + kFwdStages * (2 * size_t(kBc) * kD * 2 + kBc * 4);
}

template <int kD, int kWG, bool kTables>
__global__ void __launch_bounds__(kWG* kThreads)
    flash_wg_fwd_kernel(float* out, float* lse, TcArgs a) {
    // Qs (kRows x kD, K-major) | kFwdStages stages of [Ks (kBc x kD, K-major) | Vs (kBc x kD,
    // N-major) | posK (kBc floats)]
    extern __shared__ float sm[];
    constexpr int kRows = kWG * kBr, kBlock = kWG * kThreads;
    constexpr size_t kTile = size_t(kBc) * kD * 2, kStage = 2 * kTile + kBc * 4;
    char* Qs = reinterpret_cast<char*>(sm);
    auto Ks = [&](int st) { return Qs + kRows * kD * 2 + st * kStage; };
    auto Vs = [&](int st) { return Ks(st) + kTile; };
    auto posK = [&](int st) { return reinterpret_cast<float*>(Vs(st) + kTile); };
    const int T = a.T;
    const int q0 = tile_index() * kRows, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t bh = size_t(b) * a.H + h, rows = bh * a.Tp * kD;
    const float* pos = a.pos + size_t(b) * T;
    const bool positions = needs_positions(a.bs.kind);
    const KeyTiles kt = key_tiles(a, q0, kRows);
    const int k_first = kt.first, n_tiles = kt.count;
    // this warpgroup's 64 queries from g0: their rows of Qs (8 core-matrix rows of 16 kD bytes)
    const int wg = warp >> 2, g0 = q0 + wg * kBr;
    const char* Qg = Qs + wg * kBr * kD * 2;
    stage_core<kRows, kD, false, kBlock>(Qs, a.q + rows + size_t(q0) * kD);
    auto load = [&](int it) {
        const int st = it % kFwdStages, k0 = k_first + it * kBc;
        stage_core<kBc, kD, false, kBlock>(Ks(st), a.k + rows + size_t(k0) * kD);
        stage_core<kBc, kD, true, kBlock>(Vs(st), a.v + rows + size_t(k0) * kD);
        if (positions) stage_floats_async(posK(st), pos, k0, kBc, T);
        cp_async_commit();
    };
    load(0);  // Q travels in the first group

    WgForwardRows<kD, kTables> rows_of_warp(a, b, h, q0, warp, lane);
    // A pending P V waits through skipped tiles (WgForwardRows): a warpgroup takes an interval of
    // the block's tiles (cover: its first row's first key to its last row), so only its last
    // kWG - 1 tiles can follow, and its stage is refilled three tiles on.
    static_assert(kWG <= kFwdStages - 1, "a pending P V's stage outlives the skipped tiles");
    for (int it = 0; it < n_tiles; it++) {
        const int k0 = k_first + it * kBc, st = it % kFwdStages;
        // tile it + 1 loads into the stage of tile it - 2, whose P V has run (see pending);
        // this thread's copies fenced for the tensor core's (async proxy) reads
        await_tile(it, n_tiles, load, [] { fence_proxy_async(); });
        // a product is the whole warpgroup's: skipped only for a tile none of its rows sees
        const bool take = cover(a, b, g0, g0 + kBr - 1, k0, k0 + kBc - 1) != kSkip;
        rows_of_warp.tile(a, b, Qg, Ks(st), Vs(st), posK(st), k0, take, [] {});
        __syncthreads();  // stage (it + 1) % kFwdStages is refilled by the next iteration
    }
    rows_of_warp.finish();
    rows_of_warp.write(a, out, lse, b);
}

// ================================================================ dq

// The dq kernel on wgmma (CTX_FLASH_DQ=wgmma), the mma.sync dq kernel's algorithm for the common
// case: the inline families without bias-parameter gradients (the launcher sends the rest to the
// mma.sync kernel); dq leaves rotated back when the call rotates. A warpgroup takes 64 queries,
// per key tile of 64 the products and arithmetic of WgDqRows (cuda_flash_wg.cuh).
// With three stages of K, V (kWgDqStages), dq += dS K is not waited for in its tile: it runs
// through the barrier, the next load and the next tile's S and dP issue. Its stage is the one
// before the tile in hand, which the load of the tile after next leaves alone; after a
// warpgroup's last take at most kWG - 1 = 1 tile follows (its tiles are an interval of the
// block's), which loads nothing. One warpgroup at head dim 128 keeps two stages and waits in the
// tile: a third would drop it from two blocks an SM to one (131.5 KiB).
template <int kD, int kWG>
inline constexpr int kWgDqStages = kWG == 1 && kD == 128 ? 2 : 3;

// kGrads: the bias-parameter gradients into partials too (WgDqRows' kParamGrads).
template <int kD, int kWG, bool kGrads>
__global__ void __launch_bounds__(kWG* kThreads)
    flash_wg_dq_kernel(float* dqkv, float* partials, const float* lse, const float* dvec,
                       TcArgs a) {
    // Qs, dOs (kRows x kD, K-major) | kStages stages of [Ks, Vs (kBc x kD, K-major) | posK (kBc
    // floats)]
    constexpr int kStages = kWgDqStages<kD, kWG>;
    constexpr bool kDqInFlight = kStages >= 3;  // dq += dS K runs on into the next tile
    static_assert(!kDqInFlight || kWG <= kStages - 1, "an in-flight dq product's stage is kept");
    extern __shared__ float sm[];
    constexpr int kRows = kWG * kBr, kBlock = kWG * kThreads;
    constexpr size_t kRowBytes = size_t(kRows) * kD * 2, kTile = size_t(kBc) * kD * 2;
    constexpr size_t kStage = 2 * kTile + kBc * 4;
    char* Qs = reinterpret_cast<char*>(sm);
    char* dOs = Qs + kRowBytes;
    auto Ks = [&](int st) { return dOs + kRowBytes + st * kStage; };
    auto Vs = [&](int st) { return Ks(st) + kTile; };
    auto posK = [&](int st) { return reinterpret_cast<float*>(Vs(st) + kTile); };
    const int T = a.T;
    const int q0 = tile_index() * kRows, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t rows = (size_t(b) * a.H + h) * a.Tp * kD;
    const float* pos = a.pos + size_t(b) * T;
    const bool positions = needs_positions(a.bs.kind);
    const KeyTiles kt = key_tiles(a, q0, kRows);
    const int k_first = kt.first, n_tiles = kt.count;
    // this warpgroup's 64 queries from g0 and their rows of Qs, dOs
    const int wg = warp >> 2, g0 = q0 + wg * kBr;
    const char *Qg = Qs + wg * kBr * kD * 2, *dOg = dOs + wg * kBr * kD * 2;
    stage_core<kRows, kD, false, kBlock>(Qs, a.q + rows + size_t(q0) * kD);
    stage_core<kRows, kD, false, kBlock>(dOs, a.g + rows + size_t(q0) * kD);
    auto load = [&](int it) {
        const int st = it % kStages, k0 = k_first + it * kBc;
        stage_core<kBc, kD, false, kBlock>(Ks(st), a.k + rows + size_t(k0) * kD);
        stage_core<kBc, kD, false, kBlock>(Vs(st), a.v + rows + size_t(k0) * kD);
        if (positions) stage_floats_async(posK(st), pos, k0, kBc, T);
        cp_async_commit();
    };
    load(0);  // Q and dO travel in the first group

    WgDqRows<kD, kDqInFlight && !kGrads, kGrads> rows_of_warp(a, b, h, q0, warp, lane, lse, dvec);
    for (int it = 0; it < n_tiles; it++) {
        const int k0 = k_first + it * kBc, st = it % kStages;
        // tile it + 1 loads into the stage of tile it + 1 - kStages; this thread's copies fenced
        // for the tensor core's (async proxy) reads
        await_tile(it, n_tiles, load, [] { fence_proxy_async(); });
        const bool take = cover(a, b, g0, g0 + kBr - 1, k0, k0 + kBc - 1) != kSkip;  // as fwd
        rows_of_warp.tile(a, b, Qg, dOg, Ks(st), Vs(st), posK(st), k0, take, [] {});
        __syncthreads();  // stage (it + 1) % kStages is refilled by the next iteration's load
    }
    rows_of_warp.finish();
    rows_of_warp.write(a, dqkv, b);
    if constexpr (kGrads) {
        __shared__ double red[kWG * 8];
        rows_of_warp.write_param_grads(a, partials, b, g0, red + wg * 8, [] { __syncthreads(); });
    }
}

template <int kD, int kWG>
constexpr size_t wg_dq_smem() {
    return 2 * size_t(kWG) * kBr * kD * 2 +
           kWgDqStages<kD, kWG> * (2 * size_t(kBc) * kD * 2 + kBc * 4);
}

// ================================================================ dk, dv

// The dk / dv kernel on wgmma (CTX_FLASH_DKV=wgmma): a warpgroup takes 64 keys, per query tile
// of kBqWg the products and arithmetic of WgDkvRows (cuda_flash_wg_dkv.cuh).
// With three stages of Q, dO (kWgDkvStages), the tile's dv and dk products are not waited for in
// it but with the next tile's S^T (wgmma_wait<1>), as the dq kernel's product (see there: the
// same stage argument, which packed documents break: WgDkvRows::kSkipSettles). At head dim 64
// only: at 128, the in-flight fragments (P^T, dS^T) live
// through the next tile's issue cost ptxas 56 bytes of spills (sm_90a, CUDA 13.0, 2026-12-06)
// on top of its 255 registers.
template <int kD, int kWG>
inline constexpr int kWgDkvStages = kD <= 64 ? 3 : 2;

// kDq: the one-kernel backward's (WgDkvRows' kDqAtomic), a dS tile a warpgroup more.
template <int kD, int kWG, bool kDq>
constexpr size_t wg_dkv_smem() {
    return 2 * size_t(kWG) * kBc * kD * 2 +
           kWgDkvStages<kD, kWG> * (2 * size_t(kBqWg) * kD * 2 + 3 * kBqWg * 4) +
           (kDq ? kWG * size_t(kDsTileBytes) : 0);
}

// kInFlight: dv's and dk's products run on into the next tile (three stages; not in the
// one-kernel backward, which waits for them with its dq product, nor with packed documents,
// WgDkvRows::kSkipSettles: the launcher picks by the call's doc_start).
template <int kD, int kWG, bool kDq, bool kInFlight>
__global__ void __launch_bounds__(kWG* kThreads)
    flash_wg_dkv_kernel(float* dqkv, const float* lse, const float* dvec, TcArgs a) {
    // Ks, Vs (kWG kBc x kD, K-major) | kStages stages of [Qs, dOs (kBqWg x kD, K-major) | posQ,
    // lseQ, dQ (kBqWg floats)] | kDq: a dS tile a warpgroup
    constexpr int kStages = kWgDkvStages<kD, kWG>;
    static_assert(!kInFlight || (kStages >= 3 && !kDq), "a third stage for products in flight");
    static_assert(!kInFlight || kWG <= kStages - 1, "an in-flight product's stage is kept");
    extern __shared__ float sm[];
    constexpr int kKeyRows = kWG * kBc, kBlock = kWG * kThreads;
    constexpr size_t kKeys = size_t(kKeyRows) * kD * 2, kTile = size_t(kBqWg) * kD * 2;
    constexpr size_t kStage = 2 * kTile + 3 * kBqWg * 4;
    char* Ks = reinterpret_cast<char*>(sm);
    char* Vs = Ks + kKeys;
    auto Qs = [&](int st) { return Vs + kKeys + st * kStage; };
    auto dOs = [&](int st) { return Qs(st) + kTile; };
    auto posQ = [&](int st) { return reinterpret_cast<float*>(dOs(st) + kTile); };
    auto lseQ = [&](int st) { return posQ(st) + kBqWg; };
    auto dQ = [&](int st) { return lseQ(st) + kBqWg; };
    const int T = a.T;
    // the earliest keys first: they meet the most queries
    const int k0 = blockIdx.x * kKeyRows, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t bh = size_t(b) * a.H + h, rows = bh * a.Tp * kD;
    const float* pos = a.pos + size_t(b) * T;
    const bool positions = needs_positions(a.bs.kind);
    const int n_tiles = dkv_query_tiles(a, k0, kKeyRows);
    // this warpgroup's 64 keys (from k0 + wg kBc) and their rows of Ks, Vs
    const int wg = warp >> 2;
    const char *Kg = Ks + wg * kBc * kD * 2, *Vg = Vs + wg * kBc * kD * 2;
    stage_core<kKeyRows, kD, false, kBlock>(Ks, a.k + rows + size_t(k0) * kD);
    stage_core<kKeyRows, kD, false, kBlock>(Vs, a.v + rows + size_t(k0) * kD);
    auto load = [&](int it) {
        const int q0 = k0 + it * kBqWg, st = it % kStages;
        stage_core<kBqWg, kD, false, kBlock>(Qs(st), a.q + rows + size_t(q0) * kD);
        stage_core<kBqWg, kD, false, kBlock>(dOs(st), a.g + rows + size_t(q0) * kD);
        if (positions) stage_floats_async(posQ(st), pos, q0, kBqWg, T);
        stage_floats_async(lseQ(st), lse + bh * T, q0, kBqWg, T);
        stage_floats_async(dQ(st), dvec + bh * T, q0, kBqWg, T);
        cp_async_commit();
    };
    load(0);  // K and V travel in the first group

    char* dS = Vs + kKeys + kStages * kStage;  // kDq only: kWG tiles
    WgDkvRows<kD, kInFlight, true, kDq, CoreTiles<kD>, kKeyRows> rows_of_warp(
        a, b, h, k0, warp, lane, kDq ? dS : nullptr);
    for (int it = 0; it < n_tiles; it++) {
        const int q0 = k0 + it * kBqWg, st = it % kStages;
        // tile it + 1 loads into the stage of tile it + 1 - kStages; this thread's copies fenced
        // for the tensor core's (async proxy) reads
        await_tile(it, n_tiles, load, [] { fence_proxy_async(); });
        // a product is the whole warpgroup's: skipped only for a tile none of its keys meets; a
        // warp whose own keys it misses takes the masked loop (its P^T and dS^T are 0)
        uint32_t takes = 0;  // bit w: warpgroup w's keys meet the tile
#pragma unroll
        for (int w = 0; w < kWG; w++)
            takes |= uint32_t(dkv_tile_meets(a, b, q0, k0 + w * kBc)) << w;
        const bool take = (takes >> wg & 1u) != 0;
        rows_of_warp.tile(a, b, Kg, Vg, Qs(st), dOs(st), posQ(st), lseQ(st), dQ(st), q0, take,
                          [] {});
        if constexpr (kDq)  // dq's columns split over the warpgroups: every dS tile is read
            if (takes != 0) rows_of_warp.add_dq(a, b, Ks, q0, take, dqkv, [] { __syncthreads(); });
        __syncthreads();  // stage (it + 1) % kStages is refilled by the next iteration's load
    }
    rows_of_warp.finish();
    rows_of_warp.write(a, dqkv, b);
}

}  // namespace

// Each kernel's shared-memory limit is raised once per device (the function-local statics).
cudaError_t launch_flash_wg_forward(float* out, float* lse, const TcArgs& a, int B, int kD,
                                    int warpgroups, cudaStream_t s) {
    return with_wg_forward_shape(kD, warpgroups, a.ktab != nullptr, [&](auto d, auto w, auto tab) {
        constexpr int kD_ = decltype(d)::value, kWG = decltype(w)::value;
        auto* k = &flash_wg_fwd_kernel<kD_, kWG, decltype(tab)::value>;
        static DynamicSharedLimit limit;
        if (const cudaError_t e = limit.raise(k, wg_fwd_smem<kD_, kWG>()); e != cudaSuccess)
            return e;
        k<<<wg_grid(a, B, kWG), kWG * kThreads, wg_fwd_smem<kD_, kWG>(), s>>>(out, lse, a);
        return cudaGetLastError();
    });
}

cudaError_t launch_flash_wg_dq(float* dqkv, float* partials, const float* lse, const float* dvec,
                               const TcArgs& a, int B, int kD, int warpgroups, cudaStream_t s) {
    return with_wg_shape(kD, warpgroups, [&](auto d, auto w) {
        constexpr int kD_ = decltype(d)::value, kWG = decltype(w)::value;
        static DynamicSharedLimit plain, grads;  // one per kernel (the two share a type)
        auto launch = [&](auto* k, DynamicSharedLimit& limit) {
            if (const cudaError_t e = limit.raise(k, wg_dq_smem<kD_, kWG>()); e != cudaSuccess)
                return e;
            k<<<wg_grid(a, B, kWG), kWG * kThreads, wg_dq_smem<kD_, kWG>(), s>>>(dqkv, partials,
                                                                                 lse, dvec, a);
            return cudaGetLastError();
        };
        return partials != nullptr ? launch(&flash_wg_dq_kernel<kD_, kWG, true>, grads)
                                   : launch(&flash_wg_dq_kernel<kD_, kWG, false>, plain);
    });
}

cudaError_t launch_flash_wg_dkv(float* dqkv, const float* lse, const float* dvec, const TcArgs& a,
                                int B, int kD, int warpgroups, cudaStream_t s) {
    return with_wg_shape(kD, warpgroups, [&](auto d, auto w) {
        constexpr int kD_ = decltype(d)::value, kWG = decltype(w)::value;
        constexpr size_t smem = wg_dkv_smem<kD_, kWG, false>();
        static DynamicSharedLimit flowing, settled;  // one per kernel (the two share a type)
        auto launch = [&](auto* k, DynamicSharedLimit& limit) {
            if (const cudaError_t e = limit.raise(k, smem); e != cudaSuccess) return e;
            k<<<wg_grid(a, B, kWG), kWG * kThreads, smem, s>>>(dqkv, lse, dvec, a);
            return cudaGetLastError();
        };
        if constexpr (kD_ <= 64)  // three stages: products in flight unless rows are packed
            if (a.doc_start == nullptr)
                return launch(&flash_wg_dkv_kernel<kD_, kWG, false, true>, flowing);
        return launch(&flash_wg_dkv_kernel<kD_, kWG, false, false>, settled);
    });
}

cudaError_t launch_flash_wg_backward_atomic(float* dqkv, const float* lse, const float* dvec,
                                            const TcArgs& a, int B, int kD, int warpgroups,
                                            cudaStream_t s) {
    return with_wg_shape(kD, warpgroups, [&](auto d, auto w) {
        constexpr int kD_ = decltype(d)::value, kWG = decltype(w)::value;
        constexpr size_t smem = wg_dkv_smem<kD_, kWG, true>();
        auto* k = &flash_wg_dkv_kernel<kD_, kWG, true, false>;
        static DynamicSharedLimit limit;  // one per instantiation of this lambda
        if (const cudaError_t e = limit.raise(k, smem); e != cudaSuccess) return e;
        k<<<wg_grid(a, B, kWG), kWG * kThreads, smem, s>>>(dqkv, lse, dvec, a);
        return cudaGetLastError();
    });
}

}  // namespace ctx::cuda::tc
