// The tensor-core flash forward on sm_90's warpgroup instruction (wgmma, cuda_wgmma.cuh):
// CTX_FLASH_FORWARD=wgmma, an A/B against the mma.sync forward of cuda_flash_tc.cu until a GPU
// has timed both (docs/CUDA.md "wgmma").
//
// The algorithm and the numbers are those of flash_tc_fwd_kernel with one m-tile per warp (the
// same per-logit bias, masks, base-2 online softmax, P rounded to bf16, fp32 accumulation); what
// changes is who computes the two products. A block is one warpgroup (the same 4 warps, 64
// queries), and per key tile of 64:
//   S (64 x 64)  = Q K^T   one wgmma per 16 columns of the head dim, Q and K read by the
//                          tensor core from shared memory (K-major core matrices), no ldmatrix
//   O (64 x kD) += P V     one wgmma per 16 keys, P from registers (the A fragments the mma.sync
//                          kernel packs), V read N-major from shared memory (its rows as stored)
// Each warp's accumulators are exactly the mma.sync kernel's C fragments (s[n][e] = d[4 n + e]),
// so the logit loop, softmax and epilogue below are that kernel's. A product is collective over
// the warpgroup: a key tile is skipped only when it is masked for the whole block; a warp whose
// own rows it masks takes the tile through the masked loop (its P is 0).
//
// Head dims 64 and 128, the inline bias families (none, ALiBi, KERPLE-log); the launcher sends
// the rest to the mma.sync kernel. The dq kernel below does the same for the backward's dq.
// Compiled for sm_90a only (engine/CMakeLists.txt).
#include "backend/cuda/cuda_flash_tc.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

namespace ctx::cuda::tc {

namespace {

constexpr uint32_t kCore = 128;  // bytes of a core matrix (8 rows x 16 bytes)

// R rows of kD bf16 (global row stride kD) into a core-matrix layout, 16 bytes per cp.async.
// K-major (Q and K, the operands of S = Q K^T): core matrices kCore apart along the head dim
// (LBO), 16 kD bytes apart along the rows (SBO). kNMajor (V, the B operand of O = P V, whose K is
// the R = kBc keys and N the head dim): core matrices kCore apart along the keys (LBO), 16 R
// bytes apart along the head dim (SBO), each 8 keys of 16 bytes (8 head-dim entries) as V's rows
// hold them.
template <int R, int kD, bool kNMajor>
__device__ __forceinline__ void stage_core(char* dst, const uint16_t* src) {
    constexpr int V = kD / 8, N = R * V, IT = (N + kThreads - 1) / kThreads;
#pragma unroll
    for (int it = 0; it < IT; it++) {
        const int idx = int(threadIdx.x) + it * kThreads;
        if (N % kThreads == 0 || idx < N) {
            const int r = idx / V, v = idx % V;
            const int at = kNMajor ? v * 16 * R + (r / 8) * kCore + (r % 8) * 16
                                   : (r / 8) * 16 * kD + v * kCore + (r % 8) * 16;
            cp_async16(dst + at, src + size_t(r) * kD + v * 8);
        }
    }
}

template <int kD>
constexpr size_t wg_fwd_smem() {
    return size_t(kBr) * kD * 2 + 2 * (2 * size_t(kBc) * kD * 2 + kBc * 4);
}

template <int kD>
__global__ void __launch_bounds__(kThreads) flash_wg_fwd_kernel(float* out, float* lse, TcArgs a) {
    // Qs (kBr x kD, K-major) | two stages of [Ks (kBc x kD, K-major) | Vs (kBc x kD, N-major) |
    // posK (kBc floats)]
    extern __shared__ float sm[];
    constexpr int DN = kD / 8, NT = kBc / 8, KS = kD / 16;
    constexpr size_t kTile = size_t(kBc) * kD * 2, kStage = 2 * kTile + kBc * 4;
    char* Qs = reinterpret_cast<char*>(sm);
    auto Ks = [&](int st) { return Qs + kBr * kD * 2 + st * kStage; };
    auto Vs = [&](int st) { return Ks(st) + kTile; };
    auto posK = [&](int st) { return reinterpret_cast<float*>(Vs(st) + kTile); };
    const int T = a.T, kind = a.bs.kind, family = bias_family(kind);
    const int q0 = tile_index() * kBr, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const size_t bh = size_t(b) * a.H + h, rows = bh * a.Tp * kD;
    const float* pos = a.pos + size_t(b) * T;
    const bool positions = needs_positions(kind);
    const int k_first = first_key_tile(q0, a.window), j_last = min(T - 1, q0 + kBr - 1);
    const int n_tiles = (j_last - k_first) / kBc + 1;
    stage_core<kBr, kD, false>(Qs, a.q + rows + size_t(q0) * kD);
    auto load = [&](int it) {
        const int st = it & 1, k0 = k_first + it * kBc;
        stage_core<kBc, kD, false>(Ks(st), a.k + rows + size_t(k0) * kD);
        stage_core<kBc, kD, true>(Vs(st), a.v + rows + size_t(k0) * kD);
        if (positions) stage_floats_async(posK(st), pos, k0, kBc, T);
        cp_async_commit();
    };
    load(0);  // Q travels in the first group

    // rows r = 0, 1 of this thread: queries ig and ig + 8 of the warp's 16
    const int w0 = q0 + warp * 16, w1 = w0 + 15, ig = w0 + (lane >> 2);
    int lo[2];
    float pi[2], m_run[2], l[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = ig + 8 * r;
        const bool real = i < T;
        lo[r] = real ? row_lo(a, b, i) : INT_MAX;
        pi[r] = real && positions ? pos[i] : 0.0f;
        m_run[r] = -INFINITY;
        l[r] = 0.0f;
    }
    const float pa = param_a(a.bs, h), pb = param_b(a.bs, h), scale2 = a.scale * kLog2e;
    float o[DN * 4];  // the warp's O rows as wgmma accumulators: o[4 dn + e] = C fragment [dn][e]
#pragma unroll
    for (int i = 0; i < DN * 4; i++) o[i] = 0.0f;

    for (int it = 0; it < n_tiles; it++) {
        const int k0 = k_first + it * kBc, st = it & 1;
        // this thread's copies fenced for the tensor core's (async proxy) reads
        await_tile(it, n_tiles, load, [] { fence_proxy_async(); });
        // a product is the whole warpgroup's: skipped only for a tile the block never sees
        if (cover(a, b, q0, q0 + kBr - 1, k0, k0 + kBc - 1) != kSkip) {
            float s[NT * 4];
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
                wgmma_ss<kBc>(s, wgmma_desc(Qs + ks * 2 * kCore, kCore, 16 * kD),
                              wgmma_desc(Ks(st) + ks * 2 * kCore, kCore, 16 * kD), ks > 0);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operands(s);

            const float* pk = posK(st);
            const TileCover cv = cover(a, b, w0, w1, k0, k0 + kBc - 1);
            float mx[2] = {-INFINITY, -INFINITY};
            with_family<false, false>(family, cv != kFull, [&](auto fam, auto masked) {
                constexpr int F = decltype(fam)::value;
                constexpr bool kMasked = decltype(masked)::value;
                const KerpleRows kr{};  // KERPLE-log by its MUFU path, as the mma.sync forward
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
            float corr[2], ms[2], sum[2] = {};
            softmax_row_max<2>(mx, m_run, ms, corr);
            uint32_t pf[NT / 2][4];  // P in bf16 A fragments: the mma.sync forward's
            probabilities<NT>([&](int n, int e) { return s[4 * n + e]; }, ms, sum, pf);
            softmax_row_sum<2>(sum, l, corr);
#pragma unroll
            for (int dn = 0; dn < DN; dn++) {
                o[4 * dn] *= corr[0];
                o[4 * dn + 1] *= corr[0];
                o[4 * dn + 2] *= corr[1];
                o[4 * dn + 3] *= corr[1];
            }
            wgmma_fence();  // o and pf were written by this thread since the last product
#pragma unroll
            for (int kc = 0; kc < kBc / 16; kc++)
                wgmma_rs<kD, true>(o, pf[kc], wgmma_desc(Vs(st) + kc * 2 * kCore, kCore, 16 * kBc),
                                   true);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operands(o);
        }
        __syncthreads();  // stage st is refilled by the next iteration's load
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = ig + 8 * r;
        if (i >= T) continue;  // every real row has its diagonal: l > 0
        write_forward_row<DN>(a, out, lse, b, h, i, t, m_run[r], l[r],
                              [&](int dn, int e) { return o[4 * dn + 2 * r + e]; });
    }
}

// ================================================================ dq

// The dq kernel on wgmma (CTX_FLASH_DQ=wgmma), the mma.sync dq kernel's algorithm for the common
// case: no bias-parameter gradients, no table or T5 output, no rotation (the launcher sends the
// rest to the mma.sync kernel). A block is one warpgroup of 64 queries; per key tile of 64:
//   S = Q K^T, dP = dO V^T   wgmma_ss from K-major Q, dO, K, V tiles (K and V rows as stored)
//   dS = P (dP - D_i)        the mma.sync kernel's per-logit arithmetic (p_exponent, the masks)
//   dq += dS K               wgmma_rs: dS as bf16 A fragments, K read N-major from the SAME tile
//                            (a K-major core matrix of 8 keys x 8 head-dim entries is also the
//                            N-major one of K as the B of dS K; only LBO and SBO trade places)
template <int kD>
__global__ void __launch_bounds__(kThreads)
    flash_wg_dq_kernel(float* dqkv, const float* lse, const float* dvec, TcArgs a) {
    // Qs, dOs (kBr x kD, K-major) | two stages of [Ks, Vs (kBc x kD, K-major) | posK (kBc floats)]
    extern __shared__ float sm[];
    constexpr int DN = kD / 8, NT = kBc / 8, KS = kD / 16;
    constexpr size_t kRows = size_t(kBr) * kD * 2, kTile = size_t(kBc) * kD * 2;
    constexpr size_t kStage = 2 * kTile + kBc * 4;
    char* Qs = reinterpret_cast<char*>(sm);
    char* dOs = Qs + kRows;
    auto Ks = [&](int st) { return dOs + kRows + st * kStage; };
    auto Vs = [&](int st) { return Ks(st) + kTile; };
    auto posK = [&](int st) { return reinterpret_cast<float*>(Vs(st) + kTile); };
    const int T = a.T, H = a.H, kind = a.bs.kind, family = call_family(a);
    const int q0 = tile_index() * kBr, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const size_t bh = size_t(b) * H + h, rows = bh * a.Tp * kD;
    const float* pos = a.pos + size_t(b) * T;
    const bool positions = needs_positions(kind);
    const int k_first = first_key_tile(q0, a.window), j_last = min(T - 1, q0 + kBr - 1);
    const int n_tiles = (j_last - k_first) / kBc + 1;
    stage_core<kBr, kD, false>(Qs, a.q + rows + size_t(q0) * kD);
    stage_core<kBr, kD, false>(dOs, a.g + rows + size_t(q0) * kD);
    auto load = [&](int it) {
        const int st = it & 1, k0 = k_first + it * kBc;
        stage_core<kBc, kD, false>(Ks(st), a.k + rows + size_t(k0) * kD);
        stage_core<kBc, kD, false>(Vs(st), a.v + rows + size_t(k0) * kD);
        if (positions) stage_floats_async(posK(st), pos, k0, kBc, T);
        cp_async_commit();
    };
    load(0);  // Q and dO travel in the first group

    const int w0 = q0 + warp * 16, w1 = w0 + 15;
    int i[2], lo[2], hi[2];
    float pi[2], lse_r[2], d_r[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        i[r] = w0 + g + 8 * r;
        const size_t row = bh * T + i[r];
        const bool real = i[r] < T;
        lo[r] = real ? row_lo(a, b, i[r]) : 1;
        hi[r] = real ? i[r] : 0;
        pi[r] = real && positions ? pos[i[r]] : 0.0f;
        lse_r[r] = real ? lse[row] : 0.0f;
        d_r[r] = real ? dvec[row] : 0.0f;
    }
    const float pa = param_a(a.bs, h), pb = param_b(a.bs, h), scale2 = a.scale * kLog2e;
    float acc[DN][4] = {};  // dq: the warp's rows as wgmma accumulators (acc[dn][e] = d[4 dn + e])
    float(&accd)[DN * 4] = reinterpret_cast<float(&)[DN * 4]>(acc);

    for (int it = 0; it < n_tiles; it++) {
        const int k0 = k_first + it * kBc, st = it & 1;
        // this thread's copies fenced for the tensor core's (async proxy) reads
        await_tile(it, n_tiles, load, [] { fence_proxy_async(); });
        if (cover(a, b, q0, q0 + kBr - 1, k0, k0 + kBc - 1) != kSkip) {
            float s[NT * 4], dp[NT * 4];
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                const uint32_t at = ks * 2 * kCore;
                wgmma_ss<kBc>(s, wgmma_desc(Qs + at, kCore, 16 * kD),
                              wgmma_desc(Ks(st) + at, kCore, 16 * kD), ks > 0);
                wgmma_ss<kBc>(dp, wgmma_desc(dOs + at, kCore, 16 * kD),
                              wgmma_desc(Vs(st) + at, kCore, 16 * kD), ks > 0);
            }
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operands(s);
            wgmma_fence_operands(dp);
            const float* pk = posK(st);
            const TileCover cv = cover(a, b, w0, w1, k0, k0 + kBc - 1);
            // s becomes dS = P (dP - D_i), 0 outside the mask (a warp whose rows the tile
            // misses takes the masked loop: all 0)
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
                        const bool in = !kMasked || (j >= lo[r] && j <= hi[r]);
                        const float pj = F == kNone ? 0.0f : pk[c];
                        float v = 0.0f;
                        if (in) {
                            float x;
                            if constexpr (kKerple)
                                x = fmaf(s[4 * n + e], scale2,
                                         -pa * kerple_log2<F, false>(kr, pb, pi[r], pj, nullptr));
                            else
                                x = fmaf(s[4 * n + e], scale2,
                                         bias2_of<F>(a.bs, h, pa, pb, pi[r], pj, nullptr, j, kr));
                            v = exp2_ftz(p_exponent(x, lse_r[r])) * (dp[4 * n + e] - d_r[r]);
                        }
                        s[4 * n + e] = v;
                    }
            });
            uint32_t df[NT / 2][4];  // dS in bf16 A fragments (k step kc: tiles 2 kc, 2 kc + 1)
#pragma unroll
            for (int n = 0; n < NT; n++) {
                df[n / 2][2 * (n & 1)] = pack_bf16(s[4 * n], s[4 * n + 1]);
                df[n / 2][2 * (n & 1) + 1] = pack_bf16(s[4 * n + 2], s[4 * n + 3]);
            }
            wgmma_fence();  // df written by this thread since the last product
#pragma unroll
            for (int kc = 0; kc < kBc / 16; kc++)  // K read N-major: LBO along keys, SBO along d
                wgmma_rs<kD, true>(accd, df[kc],
                                   wgmma_desc(Ks(st) + kc * 2 * 16 * kD, 16 * kD, kCore), true);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_operands(accd);
        }
        __syncthreads();  // stage st is refilled by the next iteration's load
    }
    float* dq[2];
#pragma unroll
    for (int r = 0; r < 2; r++)
        dq[r] = i[r] < T ? dqkv + (size_t(b) * T + i[r]) * 3 * a.C + size_t(h) * a.D : nullptr;
    write_grads<DN>(acc, dq, a.scale, a.accumulate, a.D, t);
}

template <int kD>
constexpr size_t wg_dq_smem() {
    return 2 * size_t(kBr) * kD * 2 + 2 * (2 * size_t(kBc) * kD * 2 + kBc * 4);
}

template <int kD>
cudaError_t wg_dq(float* dqkv, const float* lse, const float* dvec, const TcArgs& a, int B,
                  cudaStream_t s) {
    auto* kernel = &flash_wg_dq_kernel<kD>;
    static const cudaError_t ready = allow_dynamic_shared(kernel, wg_dq_smem<kD>());
    if (ready != cudaSuccess) return ready;
    const dim3 grid((a.T + kBr - 1) / kBr, a.H, B);
    kernel<<<grid, kThreads, wg_dq_smem<kD>(), s>>>(dqkv, lse, dvec, a);
    return cudaGetLastError();
}

template <int kD>
cudaError_t wg_forward(float* out, float* lse, const TcArgs& a, int B, cudaStream_t s) {
    auto* kernel = &flash_wg_fwd_kernel<kD>;
    static const cudaError_t ready = allow_dynamic_shared(kernel, wg_fwd_smem<kD>());
    if (ready != cudaSuccess) return ready;
    const dim3 grid((a.T + kBr - 1) / kBr, a.H, B);
    kernel<<<grid, kThreads, wg_fwd_smem<kD>(), s>>>(out, lse, a);
    return cudaGetLastError();
}

}  // namespace

cudaError_t launch_flash_wg_forward(float* out, float* lse, const TcArgs& a, int B, int kD,
                                    cudaStream_t s) {
    return kD == 64 ? wg_forward<64>(out, lse, a, B, s) : wg_forward<128>(out, lse, a, B, s);
}

cudaError_t launch_flash_wg_dq(float* dqkv, const float* lse, const float* dvec, const TcArgs& a,
                               int B, int kD, cudaStream_t s) {
    return kD == 64 ? wg_dq<64>(dqkv, lse, dvec, a, B, s) : wg_dq<128>(dqkv, lse, dvec, a, B, s);
}

}  // namespace ctx::cuda::tc
