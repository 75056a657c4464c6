// CUDA backend (private, device code, sm_90a): what the wgmma flash kernels share
// (cuda_flash_wg_sm90a.cu, cuda_flash_wg_producer_sm90a.cu): the core-matrix staging of tiles
// for the tensor core's shared-memory operands, accumulators packed as A fragments, and the
// launchers' shapes.
#pragma once

#include "backend/cuda/cuda_flash_tc.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

namespace ctx::cuda::tc {

inline constexpr uint32_t kCore = 128;  // bytes of a core matrix (8 rows x 16 bytes)

// R rows of kD bf16 (global row stride kD) into a core-matrix layout, 16 bytes per cp.async.
// K-major (Q and K, the operands of S = Q K^T): core matrices kCore apart along the head dim
// (LBO), 16 kD bytes apart along the rows (SBO). kNMajor (V, the B operand of O = P V, whose K is
// the R = kBc keys and N the head dim): core matrices kCore apart along the keys (LBO), 16 R
// bytes apart along the head dim (SBO), each 8 keys of 16 bytes (8 head-dim entries) as V's rows
// hold them. By kBlock threads (thread: this one's index among them), 8 consecutive threads
// filling one core matrix (its 8 rows: 128 contiguous bytes, every bank once; a thread per row's
// next 16 bytes put 8 threads 128 bytes or 16 R apart, on the same 4 banks); 4 such groups of a
// warp read 64 contiguous bytes of each of 8 rows from global memory. kUnrolled false keeps the
// loop (a producer warpgroup with few registers: unrolled, its addresses spill).
template <int R, int kD, bool kNMajor, int kBlock, bool kUnrolled = true>
__device__ __forceinline__ void stage_core(char* dst, const uint16_t* src,
                                           int thread = int(threadIdx.x)) {
    constexpr int V = kD / 8, N = R * V, IT = (N + kBlock - 1) / kBlock;
    static_assert(R % 8 == 0, "whole core matrices");
    auto copy = [&](int it) {
        const int idx = thread + it * kBlock;
        if (N % kBlock == 0 || idx < N) {
            const int r = idx % 8 + 8 * (idx / (8 * V)), v = (idx / 8) % V;
            const int at = kNMajor ? v * 16 * R + (r / 8) * kCore + (r % 8) * 16
                                   : (r / 8) * 16 * kD + v * kCore + (r % 8) * 16;
            cp_async16(dst + at, src + size_t(r) * kD + v * 8);
        }
    };
    if constexpr (kUnrolled) {
#pragma unroll
        for (int it = 0; it < IT; it++) copy(it);
    } else {
#pragma unroll 1
        for (int it = 0; it < IT; it++) copy(it);
    }
}

// How a staged tile of bf16 rows of kD lies in shared memory, as the descriptors that read it
// say: k_major<R>(tile, ks), the operand at K step ks (head-dim entries 16 ks ..) of R-row tiles
// read K-major from shared address tile (a sub-block of rows may start inside the tile; R is the
// whole tile's rows); n_major<R>(tile, kc), the rows 16 kc .. of such a tile read N-major (the
// head dim along N: K in dq = dS K, Q and dO in dk, dv); pv<R>(tile, kc), the same for the
// forward's V (which CoreTiles stage N-major).
// CoreTiles: stage_core's no-swizzle core matrices (cp.async by threads). A K-major tile read
// N-major: LBO (K, the rows) 8 rows = 16 kD bytes, SBO (N, the head dim) a core matrix.
template <int kD>
struct CoreTiles {
    template <int R>
    static __device__ __forceinline__ uint64_t k_major(uint32_t tile, int ks) {
        return wgmma_desc_at(tile + ks * 2 * kCore, kCore, 16 * kD);
    }
    template <int R>
    static __device__ __forceinline__ uint64_t n_major(uint32_t tile, int kc) {
        return wgmma_desc_at(tile + kc * 2 * 16 * kD, 16 * kD, kCore);
    }
    template <int R>
    static __device__ __forceinline__ uint64_t pv(uint32_t tile, int kc) {
        return wgmma_desc_at(tile + kc * 2 * kCore, kCore, 16 * R);
    }
};
// Sw128Tiles: TMA's 128-byte swizzle (cuda_tma.cuh), the head dim in blocks of 64 entries: block
// c of an R-row tile at tile + c R 128 bytes, its row r 128 bytes at r 128 (from a 1024-byte
// aligned tile). K-major: K step ks in block ks / 4, 32 bytes a step along the row; N-major: 16
// rows from row 16 kc, the next 64 head-dim entries (N) a block (R 128 bytes) on.
template <int kD>
struct Sw128Tiles {
    static_assert(kD % 64 == 0, "whole 64-entry blocks");
    template <int R>
    static __device__ __forceinline__ uint64_t k_major(uint32_t tile, int ks) {
        return wgmma_desc_sw128_at(tile + (ks / 4) * R * 128 + (ks % 4) * 32, 16, 1024);
    }
    template <int R>
    static __device__ __forceinline__ uint64_t n_major(uint32_t tile, int kc) {
        return wgmma_desc_sw128_at(tile + kc * 16 * 128, R * 128, 1024);
    }
    template <int R>
    static __device__ __forceinline__ uint64_t pv(uint32_t tile, int kc) {
        return n_major<R>(tile, kc);  // V is staged as K is
    }
};

// Accumulators x of a product (a warp's 16 rows, NT 8-column tiles) rounded to bf16 as the A
// fragments of a product over those columns: k step kc's from tiles 2 kc and 2 kc + 1.
template <int NT>
__device__ __forceinline__ void a_fragments(const float (&x)[NT * 4], uint32_t (&f)[NT / 2][4]) {
#pragma unroll
    for (int n = 0; n < NT; n++) {
        f[n / 2][2 * (n & 1)] = pack_bf16(x[4 * n], x[4 * n + 1]);
        f[n / 2][2 * (n & 1) + 1] = pack_bf16(x[4 * n + 2], x[4 * n + 3]);
    }
}

// The key tiles of kBc that a forward or dq block of row_count queries from q0 meets: from
// first (its first query's first key, window permitting) to its last query.
struct KeyTiles {
    int first, count;
};
__device__ __forceinline__ KeyTiles key_tiles(const TcArgs& a, int q0, int row_count) {
    const int first = first_key_tile(q0, a.window), j_last = min(a.T - 1, q0 + row_count - 1);
    return {first, (j_last - first) / kBc + 1};
}

// One warp's 16 query rows of a wgmma forward (rows ig and ig + 8 of this thread), a warpgroup
// of 4 such warps per 64 queries: the online-softmax state, O as wgmma accumulators, and the P
// of the last tile taken, whose O += P V is still to run. The forward kernels
// (flash_wg_fwd_kernel: every warpgroup stages and meets at the block barrier; the producer
// kernel: a producer warpgroup stages) differ only in how tiles reach shared memory; per tile
// both call tile(), then finish() and write() after the last.
//
// O += P V of the last tile taken runs while the next tile's logits and softmax do
// (FlashAttention-3's intra-warpgroup overlap): it is issued with the next tile's S and waited
// for after that tile's take, outside it. Within the take, ptxas hoisted the wait (which names
// no registers) to the top of the softmax's basic block, leaving only the logit loop to
// overlap; below the take's join it cannot rise above the exponentials. Its P (pf_prev, read by
// the tensor core until the wait) and its V (prev_v) are kept until then. O goes through the
// same steps in the same order as without the overlap (... O *= corr_j, O += P_j V_j,
// O *= corr_j+1 ...), so its bits do not change. The product is issued whether or not a P is
// pending (P = 0 then, against the tile in hand: O += 0 leaves O's bits): issued under a
// condition, ptxas serialised every wgmma of the kernel (C7520), and so it did when P was copied
// into pf_prev rather than packed there, or zeroed in a branch; and so it does (C7515) when the
// wait is put off to the next take, across the barrier. So a pending product waits through
// skipped tiles for the next taken one or the end: the caller keeps its V staged until then.
// kTables: an instantiation that also looks KERPLE-log's terms up when the call has tables
// (kKerpleTable; launch_kerple_tables): one MUFU op a logit fewer. Its own instantiation, since
// the table loop costs registers (at D 64 with two warpgroups 128 -> 175, a block an SM less)
// that the other families should not pay.
// Tiles: how Q, K and V lie in shared memory (CoreTiles, or Sw128Tiles where TMA stages them);
// kQRows: the rows of the block's Q tile (the warpgroup's 64 are a sub-block of it).
template <int kD, bool kTables, class Tiles = CoreTiles<kD>, int kQRows = kBr>
struct WgForwardRows {
    static constexpr int DN = kD / 8, NT = kBc / 8, KS = kD / 16;
    // a skipped tile keeps the pending P V (its V stays staged): at most kWG - 1 tiles follow
    // a warpgroup's last take (its rows meet every key tile up to their diagonal)
    static constexpr bool kSkipSettles = false;
    int h, family, ig, t, w0, w1;
    bool positions;
    int lo[2];
    float pa, pb, scale2, pi[2], m_run[2], l[2];
    float o[DN * 4];  // the warp's O rows as wgmma accumulators: o[4 dn + e] = C fragment [dn][e]
    uint32_t pf_prev[NT / 2][4] = {};
    bool pending = false;  // whether pf_prev holds a tile's P (warpgroup-uniform)
    uint32_t prev_v = 0;   // the shared address of its V

    // warp: this warp's index in the block's query warps (16 queries each from q0)
    __device__ __forceinline__ WgForwardRows(const TcArgs& a, int b, int h_, int q0, int warp,
                                             int lane)
        : h(h_),
          family(kTables ? call_family(a) : bias_family(a.bs.kind)),
          t(lane & 3),
          positions(needs_positions(a.bs.kind)) {
        w0 = q0 + warp * 16;
        w1 = w0 + 15;
        ig = w0 + (lane >> 2);
        const float* pos = a.pos + size_t(b) * a.T;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int i = ig + 8 * r;
            const bool real = i < a.T;
            lo[r] = real ? row_lo(a, b, i) : INT_MAX;
            pi[r] = real && positions ? pos[i] : 0.0f;
            m_run[r] = -INFINITY;
            l[r] = 0.0f;
        }
        pa = param_a(a.bs, h);
        pb = param_b(a.bs, h);
        scale2 = a.scale * kLog2e;
#pragma unroll
        for (int i = 0; i < DN * 4; i++) o[i] = 0.0f;
    }

    __device__ __forceinline__ void issue_pv() {
#pragma unroll
        for (int kc = 0; kc < kBc / 16; kc++)
            wgmma_rs<kD, true>(o, pf_prev[kc], Tiles::template pv<kBc>(prev_v, kc), true);
        wgmma_commit();
    }

    // The key tile from k0 (K-major Ks, N-major Vs, positions pk), taken when take (the
    // warpgroup's rows see it): S = Q K^T (Qg: the warpgroup's K-major Q rows) is issued with
    // the pending P V, then the softmax; the pending P V is waited for either way. issued()
    // runs right after both products are issued (the producer kernel's turn-taking).
    template <class Issued>
    __device__ __forceinline__ void tile(const TcArgs& a, int b, const char* Qg, const char* Ks,
                                         const char* Vs, const float* pk, int k0, bool take,
                                         Issued&& issued) {
        float s[NT * 4], corr[2];  // the take's P (fp32) and O's rescale for it
        if (take) {
            if (!pending) prev_v = shared_address(Vs);  // P = 0: any landed tile, this one
            wgmma_fence_after(o, pf_prev);              // both written here since the last product
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
                wgmma_ss<kBc>(s, Tiles::template k_major<kQRows>(shared_address(Qg), ks),
                              Tiles::template k_major<kBc>(shared_address(Ks), ks), ks > 0);
            wgmma_commit();
            issue_pv();
            issued();
            wgmma_wait<1>();  // S; the previous tile's P V may still run
            wgmma_fence_operands(s);

            const TileCover cv = cover(a, b, w0, w1, k0, k0 + kBc - 1);
            float mx[2] = {-INFINITY, -INFINITY};
            with_family<false, kTables>(family, cv != kFull, [&](auto fam, auto masked) {
                constexpr int F = decltype(fam)::value;
                constexpr bool kMasked = decltype(masked)::value;
                // KERPLE-log from its tables when the call has them (kKerpleTable), else by MUFU
                const KerpleRows kr = F == kKerpleTable ? kerple_rows(a, h) : KerpleRows{};
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = e >> 1, i = ig + 8 * r, c = n * 8 + 2 * t + (e & 1);
                        const int j = k0 + c;
                        const bool outside = kMasked && (j < lo[r] || j > i);
                        const float x =
                            outside ? -INFINITY
                                    : fmaf(s[4 * n + e], scale2,
                                           bias2_of<F>(a.bs, h, pa, pb, pi[r],
                                                       positions ? pk[c] : 0.0f, nullptr, j, kr));
                        s[4 * n + e] = x;
                        mx[r] = fmaxf(mx[r], x);
                    }
            });
            float ms[2], sum[2] = {};
            softmax_row_max<2>(mx, m_run, ms, corr);
#pragma unroll
            for (int n = 0; n < NT; n++)  // P in fp32, as probabilities() takes it
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[4 * n + e] = exp2_ftz(s[4 * n + e] - ms[e >> 1]);
                    sum[e >> 1] += s[4 * n + e];
                }
            softmax_row_sum<2>(sum, l, corr);
        }
        wgmma_wait<0>();  // the previous tile's P V (none in flight after a skipped tile)
        if (take) {
            wgmma_fence_operands(o);
#pragma unroll
            for (int dn = 0; dn < DN; dn++) {
                o[4 * dn] *= corr[0];
                o[4 * dn + 1] *= corr[0];
                o[4 * dn + 2] *= corr[1];
                o[4 * dn + 3] *= corr[1];
            }
            a_fragments<NT>(s, pf_prev);  // P in bf16 A fragments: the mma.sync forward's
            prev_v = shared_address(Vs);
            pending = true;
        }
    }

    // The last pending P V, after the last tile.
    __device__ __forceinline__ void finish() {
        if (pending) {
            wgmma_fence_after(o, pf_prev);
            issue_pv();
            wgmma_wait<0>();
            wgmma_fence_operands(o);
        }
    }

    __device__ __forceinline__ void write(const TcArgs& a, float* out, float* lse, int b) const {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int i = ig + 8 * r;
            if (i >= a.T) continue;  // every real row has its diagonal: l > 0
            write_forward_row<DN>(a, out, lse, b, h, i, t, m_run[r], l[r],
                                  [&](int dn, int e) { return o[4 * dn + 2 * r + e]; });
        }
    }
};

// One warp's 16 query rows of a wgmma dq kernel (the lock-step flash_wg_dq_kernel and the
// producer kernel call tile() per key tile, then finish() and write()): per tile taken,
//   S = Q K^T, dP = dO V^T   wgmma_ss from K-major Q, dO, K, V tiles (K and V rows as stored),
//                            two commit groups: P is computed while dP is in flight
//   dS = P (dP - D_i)        the mma.sync kernel's per-logit arithmetic (p_exponent, the masks)
//   dq += dS K               wgmma_rs: dS as bf16 A fragments, K read N-major from the SAME tile
//                            (a K-major core matrix of 8 keys x 8 head-dim entries is also the
//                            N-major one of K as the B of dS K; only LBO and SBO trade places)
// kInFlight: dq += dS K is not waited for in its tile but completes with the next tile's S
// (wgmma_wait<1>: groups complete in order) or in finish(), so the caller keeps the tile's K
// staged until then. Nothing but wgmma writes acc in the loop, and ptxas keeps the in-flight dS
// fragments' registers (no C7515 / C7520, SASS checked 2026-12-06).
// kParamGrads: the bias-parameter gradients too (ALiBi's a, KERPLE-log's a and b), summed per
// thread over its logits as the mma.sync dq kernel sums them (a float per tile added to a
// double), then per warpgroup into the partials (write_param_grads). They need a logit's dS and
// its bias terms together, so this instantiation waits for dP before the logits (P's
// exponentials no longer run under dP), as that kernel computes them.
// Tiles, kQRows: as WgForwardRows' (K and V tiles of kBc rows; Q, dO of kQRows).
template <int kD, bool kInFlight, bool kParamGrads = false, class Tiles = CoreTiles<kD>,
          int kQRows = kBr>
struct WgDqRows {
    static constexpr int DN = kD / 8, NT = kBc / 8, KS = kD / 16;
    static constexpr bool kSkipSettles = false;  // as WgForwardRows: its dq product runs on
    int h, family, t, w0, w1;
    bool positions;
    double ga = 0.0, gb = 0.0;  // kParamGrads: this thread's share of the a, b gradients
    int i[2], lo[2], hi[2];
    float pa, pb, scale2, pi[2], lse_r[2], d_r[2];
    float acc[DN][4] = {};  // dq: the warp's rows as wgmma accumulators (acc[dn][e] = d[4 dn + e])

    // warp: this warp's index in the block's query warps (16 queries each from q0)
    __device__ __forceinline__ WgDqRows(const TcArgs& a, int b, int h_, int q0, int warp, int lane,
                                        const float* lse, const float* dvec)
        : h(h_), family(call_family(a)), t(lane & 3), positions(needs_positions(a.bs.kind)) {
        w0 = q0 + warp * 16;
        w1 = w0 + 15;
        const size_t bh = size_t(b) * a.H + h;
        const float* pos = a.pos + size_t(b) * a.T;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            i[r] = w0 + (lane >> 2) + 8 * r;
            const size_t row = bh * a.T + i[r];
            const bool real = i[r] < a.T;
            lo[r] = real ? row_lo(a, b, i[r]) : 1;
            hi[r] = real ? i[r] : 0;
            pi[r] = real && positions ? pos[i[r]] : 0.0f;
            lse_r[r] = real ? lse[row] : 0.0f;
            d_r[r] = real ? dvec[row] : 0.0f;
        }
        pa = param_a(a.bs, h);
        pb = param_b(a.bs, h);
        scale2 = a.scale * kLog2e;
    }

    // The key tile from k0 (K-major Ks and Vs, positions pk) when take (the warpgroup's rows see
    // it); Qg, dOg: the warpgroup's K-major Q and dO rows. issued() runs right after S and dP
    // are issued (the producer kernel's turn-taking).
    template <class Issued>
    __device__ __forceinline__ void tile(const TcArgs& a, int b, const char* Qg, const char* dOg,
                                         const char* Ks, const char* Vs, const float* pk, int k0,
                                         bool take, Issued&& issued) {
        if (!take) return;
        float(&accd)[DN * 4] = reinterpret_cast<float(&)[DN * 4]>(acc);
        float s[NT * 4], dp[NT * 4];
        wgmma_fence();  // acc is written by wgmma only (and zeroed before the first dq)
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
            wgmma_ss<kBc>(s, Tiles::template k_major<kQRows>(shared_address(Qg), ks),
                          Tiles::template k_major<kBc>(shared_address(Ks), ks), ks > 0);
        wgmma_commit();
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
            wgmma_ss<kBc>(dp, Tiles::template k_major<kQRows>(shared_address(dOg), ks),
                          Tiles::template k_major<kBc>(shared_address(Vs), ks), ks > 0);
        wgmma_commit();
        issued();
        const TileCover cv = cover(a, b, w0, w1, k0, k0 + kBc - 1);
        if constexpr (kParamGrads) {
            wgmma_wait<0>();  // S and dP (and the previous tile's dq)
            wgmma_fence_operands(s);
            wgmma_fence_operands(dp);
            param_grad_logits(a, s, dp, pk, k0, cv);
        } else {
            wgmma_wait<1>();  // S (and the previous tile's dq); dP may still run
            wgmma_fence_operands(s);
            p_then_ds(a, s, dp, pk, k0, cv);
        }
        uint32_t df[NT / 2][4];
        a_fragments<NT>(s, df);
        wgmma_fence_after(accd, df);  // df written by this thread since the last product
#pragma unroll
        for (int kc = 0; kc < kBc / 16; kc++)  // K read N-major
            wgmma_rs<kD, true>(accd, df[kc], Tiles::template n_major<kBc>(shared_address(Ks), kc),
                               true);
        wgmma_commit();
        if constexpr (!kInFlight) {
            wgmma_wait<0>();
            wgmma_fence_operands(accd);
        }
    }

    // s becomes P, 0 outside the mask (a warp whose rows the tile misses takes the masked loop:
    // all 0), while dP is in flight; then dS = P (dP - D_i) once dP has come.
    __device__ __forceinline__ void p_then_ds(const TcArgs& a, float (&s)[NT * 4],
                                              float (&dp)[NT * 4], const float* pk, int k0,
                                              TileCover cv) {
        uint32_t attends = ~0u;  // bit 4 n + e: the pair attends
        with_family<false, true>(family, cv != kFull, [&](auto fam, auto masked) {
            constexpr int F = decltype(fam)::value;
            constexpr bool kMasked = decltype(masked)::value;
            const KerpleRows kr = F == kKerpleTable ? kerple_rows(a, h) : KerpleRows{};
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = e >> 1, c = n * 8 + 2 * t + (e & 1), j = k0 + c;
                    float p = 0.0f;
                    if (!kMasked || (j >= lo[r] && j <= hi[r])) {
                        const float pj = F == kNone ? 0.0f : pk[c];
                        const float x =
                            fmaf(s[4 * n + e], scale2,
                                 bias2_of<F>(a.bs, h, pa, pb, pi[r], pj, nullptr, j, kr));
                        p = exp2_ftz(p_exponent(x, lse_r[r]));
                    } else {
                        attends &= ~(1u << (4 * n + e));
                    }
                    s[4 * n + e] = p;
                }
        });
        wgmma_wait<0>();  // dP
        wgmma_fence_operands(dp);
        // s becomes dS = P (dP - D_i), 0 outside the mask
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[4 * n + e] = (attends >> (4 * n + e)) & 1u
                                   ? s[4 * n + e] * (dp[4 * n + e] - d_r[e >> 1])
                                   : 0.0f;
    }

    // s becomes dS, and each logit's dS times its bias's derivatives goes into fa, fb (the
    // mma.sync dq kernel's terms: ALiBi d logit / d a = p_i - p_j; KERPLE-log's from its log
    // and ratio, looked up or computed), a float per tile added to ga, gb.
    __device__ __forceinline__ void param_grad_logits(const TcArgs& a, float (&s)[NT * 4],
                                                      const float (&dp)[NT * 4], const float* pk,
                                                      int k0, TileCover cv) {
        float fa = 0.0f, fb = 0.0f;
        with_family<false, true>(family, cv != kFull, [&](auto fam, auto masked) {
            constexpr int F = decltype(fam)::value;
            constexpr bool kMasked = decltype(masked)::value;
            constexpr bool kKerple = F == kKerpleLog || F == kKerpleTable;
            const KerpleRows kr = F == kKerpleTable ? kerple_rows(a, h) : KerpleRows{};
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = e >> 1, c = n * 8 + 2 * t + (e & 1), j = k0 + c;
                    float v = 0.0f;
                    if (!kMasked || (j >= lo[r] && j <= hi[r])) {
                        const float pj = F == kNone ? 0.0f : pk[c];
                        if constexpr (kKerple) {
                            float ratio = 0.0f;  // the log the bias needs is its a-gradient's
                            const float lg = kerple_log2<F, true>(kr, pb, pi[r], pj, &ratio);
                            v = exp2_ftz(
                                    p_exponent(fmaf(s[4 * n + e], scale2, -pa * lg), lse_r[r])) *
                                (dp[4 * n + e] - d_r[r]);
                            fa -= v * lg * kLn2;
                            fb -= v * pa * ratio;
                        } else {
                            const float x =
                                fmaf(s[4 * n + e], scale2,
                                     bias2_of<F>(a.bs, h, pa, pb, pi[r], pj, nullptr, j, kr));
                            v = exp2_ftz(p_exponent(x, lse_r[r])) * (dp[4 * n + e] - d_r[r]);
                            if constexpr (F == kLinear) fa -= v * (pi[r] - pj);
                        }
                    }
                    s[4 * n + e] = v;
                }
        });
        ga += double(fa);
        gb += double(fb);
    }

    // kParamGrads, after the last tile: the warpgroup's a, b gradient sums (a fixed order:
    // each warp's tree, then the 4 warps' as block_sum adds them) into the partials' 32-row
    // chunk of its first row g0, the next chunk zeroed, as the mma.sync dq kernel writes its 64
    // rows. red: 8 doubles of this warpgroup's in shared memory; sync: a barrier over its 128
    // threads (or more).
    template <class Sync>
    __device__ __forceinline__ void write_param_grads(const TcArgs& a, float* partials, int b,
                                                      int g0, double* red, Sync&& sync) const {
        const int lane = int(threadIdx.x) & 31, w = (int(threadIdx.x) >> 5) & 3;
        double sa = warp_sum(ga), sb = warp_sum(gb);
        if (lane == 0) {
            red[w] = sa;
            red[4 + w] = sb;
        }
        sync();
        sa = warp_sum(lane < 4 ? red[lane] : 0.0);
        sb = warp_sum(lane < 4 ? red[4 + lane] : 0.0);
        const int chunks = (a.T + kBiasGradRows - 1) / kBiasGradRows, chunk = g0 / kBiasGradRows;
        if (int(threadIdx.x) % kThreads == 0 && chunk < chunks) {
            float* slot = partials + ((size_t(b) * a.H + h) * chunks + chunk) * kMaxT5Buckets;
            slot[0] = float(sa);
            slot[1] = float(sb);
            if (chunk + 1 < chunks) slot[kMaxT5Buckets] = slot[kMaxT5Buckets + 1] = 0.0f;
        }
    }

    // The last dq product, after the last tile.
    __device__ __forceinline__ void finish() {
        float(&accd)[DN * 4] = reinterpret_cast<float(&)[DN * 4]>(acc);
        wgmma_wait<0>();
        wgmma_fence_operands(accd);
    }

    __device__ __forceinline__ void write(const TcArgs& a, float* dqkv, int b) {
        write_dq<DN>(acc, dqkv, a, b, h, i, t);  // rotated back when the call rotates
    }
};

// f(kD, kWG) with both as compile-time constants: head dims 64 and 128, one or two warpgroups.
// with_wg_forward_shape: f(kD, kWG, kTables), kTables whether the call has KERPLE-log tables.
template <class F>
cudaError_t with_wg_shape(int kD, int warpgroups, F&& f) {
    using One = std::integral_constant<int, 1>;
    using Two = std::integral_constant<int, 2>;
    auto by_groups = [&](auto d) { return warpgroups == 1 ? f(d, One{}) : f(d, Two{}); };
    return kD == 64 ? by_groups(std::integral_constant<int, 64>{})
                    : by_groups(std::integral_constant<int, 128>{});
}

template <class F>
cudaError_t with_wg_forward_shape(int kD, int warpgroups, bool tables, F&& f) {
    return with_wg_shape(kD, warpgroups, [&](auto d, auto w) {
        return tables ? f(d, w, std::true_type{}) : f(d, w, std::false_type{});
    });
}

// A block takes kWG * 64 queries (forward, dq) or keys (dk / dv): the grid, the block.
inline dim3 wg_grid(const TcArgs& a, int B, int kWG) {
    return dim3((a.T + kWG * 64 - 1) / (kWG * 64), a.H, B);
}

}  // namespace ctx::cuda::tc
