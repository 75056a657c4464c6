// CUDA backend (private, device code, sm_90a): the wgmma dk / dv kernels' per-warp arithmetic
// (cuda_flash_wg_sm90a.cu's lock-step kernel, cuda_flash_wg_producer_sm90a.cu's producer one).
#pragma once

#include <type_traits>

#include "backend/cuda/cuda_flash_wg.cuh"

namespace ctx::cuda::tc {

// One warp's 16 keys of a wgmma dk / dv kernel (the lock-step flash_wg_dkv_kernel and the
// producer kernel call tile() per query tile, then finish() and write()): the mma.sync split
// dk / dv kernel's algorithm (its per-logit arithmetic and masks, so P and dS are the same
// numbers) for the inline families. A warpgroup takes 64 keys (16 a warp, the accumulator
// rows); per query tile of kBqWg = 64 (the mma.sync kernel's 32 is below wgmma's N) taken:
//   S^T = K Q^T, dP^T = V dO^T   wgmma_ss from K-major K, V (staged once) and Q, dO tiles, two
//                                commit groups: P^T is computed while dP^T is in flight
//   dv += P^T dO                 wgmma_rs: P^T as bf16 A fragments, dO read N-major from its
//                                K-major tile (LBO and SBO trade places, as K in the dq kernel);
//                                issued before dS^T is computed, which it overlaps
//   dS^T = P^T (dP^T - D)        the mma.sync kernel's products, 0 where the pair is masked
//   dk += dS^T Q                 wgmma_rs likewise, Q read N-major
// P^T's fragments are read by the tensor core until the last wait, so they stay untouched (the
// emulation checks it). dk leaves rotated back when the call rotates.
// kInFlight: the tile's dv and dk products are not waited for in it but with the next tile's
// S^T (wgmma_wait<1>) or in finish(), so the caller keeps the tile's Q and dO staged until then
// (not with packed documents: kSkipSettles).
// kDvOverlapsDs false: dv's products are issued with dk's, after dS^T is computed, so P^T's
// fragments need no registers through that arithmetic (the same bits: the two accumulate apart).
// KERPLE-log from its tables at head dim 64 only, as the mma.sync kernel (the tables hold the
// MUFU path's values: the same logits either way).
// kDqAtomic: FlashAttention-2's one-kernel backward (CTX_FLASH_BACKWARD=atomic), dq's terms
// from here instead of a dq kernel (5 products a tile pair instead of 7). tile() also stores
// dS^T, rounded to bf16 as dk's product takes it, into the warpgroup's dS tile in shared memory
// as the K-major A operand of dq = dS K (rows: the tile's 64 queries, K: the warpgroup's 64
// keys; each warp's keys are a quarter of that K, so the tile needs all four warps' stores).
// add_dq() then runs dq = dS K over the block's keys (kKeyRows: kDqGroups warpgroups' dS tiles
// and K rows), split by columns as FlashAttention-3 splits it: warpgroup w takes dq's head-dim
// columns [w kDqN, (w + 1) kDqN), kDqN = kD / kDqGroups (the dq accumulators, kDqN / 2
// registers, fit beside dk's and dv's at head dim 128; each dq entry is added once a block, not
// once a warpgroup), K read N-major from the staged keys as in the dq kernel, and adds scale *
// dq to dqkv by fp32 atomics (in any order: not bit-reproducible). tile() waits for dv's and
// dk's products (kInFlight is false), add_dq for dq's: nothing is in flight across tiles.
// (Leaving dk's to add_dq's wait, ptxas serialised every product: C7515.)
inline constexpr int kBqWg = 64;
inline constexpr uint32_t kDsTileBytes = uint32_t(kBqWg) * 64 * 2;  // a warpgroup's dS tile

// The query tiles of kBqWg that a dk / dv block of key_rows keys from k0 meets, from k0:
// queries before k0 see none of its keys, nor those past its last key's window; a tile of 64
// from a multiple of 64 below T ends within the padded rows (Tp).
__device__ __forceinline__ int dkv_query_tiles(const TcArgs& a, int k0, int key_rows) {
    const int j_last = min(a.T - 1, k0 + key_rows - 1);
    const int i_last = a.window > 0 ? min(a.T - 1, j_last + a.window - 1) : a.T - 1;
    return (i_last - k0) / kBqWg + 1;
}

// Whether the query tile of kBqWg from q0 meets the 64 keys from c0 (a warpgroup's): its
// products run, else the warpgroup skips the tile.
__device__ __forceinline__ bool dkv_tile_meets(const TcArgs& a, int b, int q0, int c0) {
    return cover(a, b, q0, q0 + kBqWg - 1, c0, c0 + kBc - 1) != kSkip;
}

// Tiles: how K, V (kKeyRows rows, the warpgroup's 64 a sub-block) and the query tiles (Q, dO
// of kBqWg rows) lie in shared memory (CoreTiles, or Sw128Tiles where TMA stages them).
template <int kD, bool kInFlight, bool kDvOverlapsDs = true, bool kDqAtomic = false,
          class Tiles = CoreTiles<kD>, int kKeyRows = kBc>
struct WgDkvRows {
    static_assert(!(kDqAtomic && kInFlight), "add_dq waits for every product of the tile");
    // add_dq's warpgroups (those whose keys the block stages) and each one's dq columns
    static constexpr int kDqGroups = kKeyRows / kBc, kDqN = kD / kDqGroups;
    static_assert(!kDqAtomic || (std::is_same_v<Tiles, CoreTiles<kD>> && kDqN >= 32),
                  "add_dq's column offset is the no-swizzle layout's; wgmma N of 32, 64 or 128");
    // Whether a skipped tile leaves no product in flight (producer_pipeline then releases the
    // last taken tile's stage at once). A key block's queries end at its documents' end (packed
    // rows), which may be many tiles before the block's last: there the kernels run without
    // products in flight (the launchers' packed dispatch), so that stage is neither refilled
    // (lock-step kernel) nor waited for by the producer while a product still reads it. Without
    // packing at most kWG - 1 tiles follow a warpgroup's last take, as in the forward.
    static constexpr bool kSkipSettles = !kInFlight;
    char* ds_tiles;  // kDqAtomic: the block's dS tiles (kDsTileBytes a warpgroup), else null
    static constexpr int DN = kD / 8, NT = kBqWg / 8, KS = kD / 16;
    static constexpr bool kTables = kD <= 64;
    int h, family, t, w0, w1, wg;
    bool positions;
    int j[2];  // this thread's keys (accumulator rows)
    float pa, pb, scale2, pj[2];
    float dk[DN][4] = {}, dv[DN][4] = {};  // wgmma accumulators: x[dn][e] = d[4 dn + e]

    // warp: this warp's index in the block's key warps (16 keys each from k0)
    // (ds: kDqAtomic's dS tiles, one a warpgroup of the block, in the warpgroups' order)
    __device__ __forceinline__ WgDkvRows(const TcArgs& a, int b, int h_, int k0, int warp, int lane,
                                         char* ds = nullptr)
        : ds_tiles(ds),
          h(h_),
          family(kTables ? call_family(a) : bias_family(a.bs.kind)),
          t(lane & 3),
          positions(needs_positions(a.bs.kind)) {
        w0 = k0 + warp * 16;
        wg = warp >> 2;
        w1 = w0 + 15;
        j[0] = w0 + (lane >> 2);
        j[1] = j[0] + 8;
        const float* pos = a.pos + size_t(b) * a.T;
#pragma unroll
        for (int r = 0; r < 2; r++) pj[r] = j[r] < a.T && positions ? pos[j[r]] : 0.0f;
        pa = param_a(a.bs, h);
        pb = param_b(a.bs, h);
        scale2 = a.scale * kLog2e;
    }

    // The query tile from q0 when take (the warpgroup's keys meet it): Kg, Vg the warpgroup's
    // K-major K and V rows; Qs, dOs the tile's K-major Q and dO; pq, lq, dd its queries'
    // positions, log-sum-exps and D = rowsum(dO O). issued() runs right after S^T and dP^T are
    // issued (the producer kernel's turn-taking).
    template <class Issued>
    __device__ __forceinline__ void tile(const TcArgs& a, int b, const char* Kg, const char* Vg,
                                         const char* Qs, const char* dOs, const float* pq,
                                         const float* lq, const float* dd, int q0, bool take,
                                         Issued&& issued) {
        if (!take) return;
        float(&dkd)[DN * 4] = reinterpret_cast<float(&)[DN * 4]>(dk);
        float(&dvd)[DN * 4] = reinterpret_cast<float(&)[DN * 4]>(dv);
        float s[NT * 4], dp[NT * 4];
        wgmma_fence();  // dk, dv are written by wgmma only (and zeroed before the first)
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            wgmma_ss<kBqWg>(s, Tiles::template k_major<kKeyRows>(shared_address(Kg), ks),
                            Tiles::template k_major<kBqWg>(shared_address(Qs), ks), ks > 0);
        }
        wgmma_commit();
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            wgmma_ss<kBqWg>(dp, Tiles::template k_major<kKeyRows>(shared_address(Vg), ks),
                            Tiles::template k_major<kBqWg>(shared_address(dOs), ks), ks > 0);
        }
        wgmma_commit();
        issued();
        wgmma_wait<1>();  // S^T (and the previous tile's dv, dk); dP^T may still run
        wgmma_fence_operands(s);
        // queries [q0, q0 + kBqWg) are the rows of the mask test, this warp's keys its columns;
        // s becomes P^T (row: key, column: query), 0 outside the mask
        const TileCover cv = cover(a, b, q0, q0 + kBqWg - 1, w0, w1);
        uint32_t attends = ~0u;  // bit 4 n + e: the pair attends
        with_family<false, kTables>(family, cv != kFull, [&](auto fam, auto masked) {
            constexpr int F = decltype(fam)::value;
            constexpr bool kMasked = decltype(masked)::value;
            const KerpleRows kr = F == kKerpleTable ? kerple_rows(a, h) : KerpleRows{};
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = e >> 1, c = n * 8 + 2 * t + (e & 1), i = q0 + c;
                    float p = 0.0f;
                    if (!kMasked || in_mask(a, b, i, j[r])) {
                        const float pi = F != kNone && positions ? pq[c] : 0.0f;
                        const float x =
                            fmaf(s[4 * n + e], scale2,
                                 bias2_of<F>(a.bs, h, pa, pb, pi, pj[r], nullptr, j[r], kr));
                        p = exp2_ftz(p_exponent(x, lq[c]));
                    } else {
                        attends &= ~(1u << (4 * n + e));
                    }
                    s[4 * n + e] = p;
                }
        });
        // dv += P^T dO, dO read N-major (LBO along queries), issued before dS^T is computed
        // (kDvOverlapsDs) or after it (P^T's fragments no longer live through that arithmetic)
        auto issue_dv = [&](uint32_t(&pf)[NT / 2][4]) {
            wgmma_fence_after(dvd, pf);  // pf written by this thread since the last product
#pragma unroll
            for (int kc = 0; kc < kBqWg / 16; kc++)
                wgmma_rs<kD, true>(dvd, pf[kc],
                                   Tiles::template n_major<kBqWg>(shared_address(dOs), kc), true);
            wgmma_commit();
        };
        uint32_t pf[NT / 2][4];
        if constexpr (kDvOverlapsDs) {
            a_fragments<NT>(s, pf);
            issue_dv(pf);
            wgmma_wait<1>();  // dP^T; dv's products may still run
        } else {
            wgmma_wait<0>();  // dP^T
        }
        wgmma_fence_operands(dp);
        // dp becomes dS^T = P^T (dP^T - D_i): the mma.sync kernel's product, 0 outside
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int c = n * 8 + 2 * t + (e & 1);
                dp[4 * n + e] =
                    (attends >> (4 * n + e)) & 1u ? s[4 * n + e] * (dp[4 * n + e] - dd[c]) : 0.0f;
            }
        if constexpr (!kDvOverlapsDs) {
            a_fragments<NT>(s, pf);
            issue_dv(pf);
        }
        uint32_t df[NT / 2][4];
        a_fragments<NT>(dp, df);
        if constexpr (kDqAtomic) store_ds(df);
        wgmma_fence_after(dkd, df);  // df written here; dv's products still read pf
#pragma unroll
        for (int kc = 0; kc < kBqWg / 16; kc++)  // Q read N-major likewise
            wgmma_rs<kD, true>(dkd, df[kc], Tiles::template n_major<kBqWg>(shared_address(Qs), kc),
                               true);
        wgmma_commit();
        if constexpr (!kInFlight) {
            wgmma_wait<0>();
            wgmma_fence_operands(dvd);
            wgmma_fence_operands(dkd);
        }
    }

    // kDqAtomic: dS^T's bf16 fragments (df[kc]: keys g, g + 8 of this warp, queries 16 kc +
    // 2 t (+ 1, + 8, + 9)) into the warpgroup's dS tile, element (query i, key k of the warpgroup's
    // 64) at core matrix (i / 8, k / 8): SBO 1024 bytes along the queries, LBO 128 along the keys.
    // A warp's 32 two-byte stores of one register fall in 16 words of distinct banks.
    __device__ __forceinline__ void store_ds(const uint32_t (&df)[NT / 2][4]) const {
        const int g = (int(threadIdx.x) & 31) >> 2, kw = (int(threadIdx.x) >> 5 & 3) * 16;
        char* ds_tile = ds_tiles + wg * kDsTileBytes;
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = kw + g + 8 * (e >> 1), i = 2 * t + (e & 1);  // i: query % 8
                const uint32_t x = df[n / 2][2 * (n & 1) + (e >> 1)];
                *reinterpret_cast<uint16_t*>(ds_tile + n * 1024 + (key / 8) * kCore + i * 16 +
                                             (key % 8) * 2) = uint16_t(e & 1 ? x >> 16 : x);
            }
    }

    // kDqAtomic, a tile the warpgroup does not take (in add_dq, so only where another one takes
    // it): its dS tile as zeros (64 bytes a thread), so that add_dq's products need no branch
    // (one between them makes ptxas serialise them: C7515) and the other warpgroups' columns
    // get no terms from it. Not on a tile no warpgroup takes: no barrier would then order the
    // stores after another warpgroup's reads of the tile before (the producer form's consumers
    // are not in step; a review found it, 2026-12-06).
    __device__ __forceinline__ void zero_ds() const {
        uint4* tile = reinterpret_cast<uint4*>(ds_tiles + wg * kDsTileBytes);
        const int i = int(threadIdx.x) & 127;  // this thread's index in its warpgroup
#pragma unroll
        for (int c = 0; c < int(kDsTileBytes / 16 / 128); c++) tile[c * 128 + i] = uint4{};
    }

    // kDqAtomic, after tile() for the query tile from q0 in every warpgroup of the block: dq's
    // columns [wg kDqN, (wg + 1) kDqN) = dS K over the block's keys (take: this warpgroup took
    // the tile, else it stores a tile of zeros first; every thread of the block calls this, or
    // none when no warpgroup took the tile), Ks the block's K-major K rows, once every warp has
    // stored its part of dS (block_sync: a barrier over the block's kDqGroups warpgroups), then
    // dqkv's dq rows += scale dq.
    template <class BlockSync>
    __device__ __forceinline__ void add_dq(const TcArgs& a, int b, const char* Ks, int q0,
                                           bool take, float* dqkv, BlockSync&& block_sync) {
        if (!take) zero_ds();
        fence_proxy_async();  // this thread's dS stores, for the tensor core's reads
        block_sync();
        const int n0 = wg * kDqN;
        // K read N-major (LBO along keys, SBO along d) from its column n0: core matrices of 8
        // head-dim entries are kCore apart along a row group
        const uint32_t k_cols = shared_address(Ks) + uint32_t(n0 / 8) * kCore;
        float dq[kDqN / 2];
        wgmma_fence();
        // the dS tiles follow each other in shared memory: 4 K steps a tile
#pragma unroll
        for (int kc = 0; kc < kKeyRows / 16; kc++)
            wgmma_ss<kDqN, true>(
                dq,
                wgmma_desc(ds_tiles + (kc / 4) * kDsTileBytes + (kc % 4) * 2 * kCore, kCore, 1024),
                Tiles::template n_major<kKeyRows>(k_cols, kc), kc > 0);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operands(dq);
        wgmma_fence_operands(reinterpret_cast<float(&)[DN * 4]>(dv));
        wgmma_fence_operands(reinterpret_cast<float(&)[DN * 4]>(dk));
        const int g = (int(threadIdx.x) & 31) >> 2, qw = (int(threadIdx.x) >> 5 & 3) * 16;
        if (dq_quad_atomics(a)) {  // four columns an atomic, each lane its row g + 8 (t & 1)
            const int i = q0 + qw + g + 8 * (t & 1);
            float* row = i < a.T ? dqkv + (size_t(b) * a.T + i) * 3 * a.C + size_t(h) * a.D + n0
                                 : nullptr;  // none past T (its dS is 0)
#pragma unroll
            for (int dn = 0; dn < kDqN / 8; dn++) {
                const float c[4] = {dq[4 * dn] * a.scale, dq[4 * dn + 1] * a.scale,
                                    dq[4 * dn + 2] * a.scale, dq[4 * dn + 3] * a.scale};
                // the kernel's head-dim padding past a.D not
                atomic_add_c_quads(c, row != nullptr ? row + 8 * dn : nullptr, a.D - n0 - 8 * dn,
                                   t);
            }
            return;
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int i = q0 + qw + g + 8 * r;
            if (i >= a.T) continue;  // a padded row (its dS is 0)
            float* row = dqkv + (size_t(b) * a.T + i) * 3 * a.C + size_t(h) * a.D + n0;
#pragma unroll
            for (int dn = 0; dn < kDqN / 8; dn++)
#pragma unroll
                for (int e = 0; e < 2; e++)  // the kernel's head-dim padding past a.D not
                    if (n0 + 8 * dn + 2 * t + e < a.D)
                        atomicAdd(row + 8 * dn + 2 * t + e, dq[4 * dn + 2 * r + e] * a.scale);
        }
    }

    // The last dv and dk products, after the last tile.
    __device__ __forceinline__ void finish() {
        wgmma_wait<0>();
        wgmma_fence_operands(reinterpret_cast<float(&)[DN * 4]>(dv));
        wgmma_fence_operands(reinterpret_cast<float(&)[DN * 4]>(dk));
    }

    __device__ __forceinline__ void write(const TcArgs& a, float* dqkv, int b) {
        write_dk_dv<DN>(dk, dv, dqkv, a, b, h, j, t, a.T, a.C, a.D);  // dk rotated back
    }
};

}  // namespace ctx::cuda::tc
