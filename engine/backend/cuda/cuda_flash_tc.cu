// CUDA backend kernels: tensor-core flash attention (bf16 operands, fp32 accumulation and
// softmax), the path of AttentionMode::Flash when the backend runs Precision::Bf16 (docs/CUDA.md,
// "Flash attention on tensor cores"). The algorithm is FlashAttention-2's; the semantics are
// exactly those of the fp32 kernels in cuda_flash.cu (per-token float positions, every BiasKind
// evaluated per logit through cuda_bias.cuh, causal mask, sliding window, bias-parameter and
// table gradients in-kernel, accumulate into every gradient, no atomics), except that q, k, v,
// dout and the probabilities / dlogits entering a product are rounded to bf16.
//
// Operands first go through a packing pass (two small kernels per call): q, k, v (and dout) as
// bf16 rows per head, (B, H, Tp, kD) with T rounded up to Tp = 64 k and the head dim to the
// kernel's kD, zero-padded, plus the transposes a product reads k-major, (B, H, kD, Tp): v^T
// (forward), k^T, q^T, dout^T (backward). Tiles are then plain 16-byte copies into shared memory,
// unrolled so every load of a tile is in flight at once, with no bounds checks.
//
// Warps are the unit: a block is 4 warps, a warp owns 16 rows of every product and computes
// them with mma.sync m16n8k16 (cuda_mma.cuh, which documents the fragment layouts). Shared
// tiles are bf16, rows padded by kPad elements so the fragment loads of the 8 row groups fall in
// distinct banks.
//
//   flash_tc_fwd_kernel  grid (T/64, H, B), heaviest query tiles first: Q fragments in
//                        registers; per key tile of 64: S = Q K^T, mask + bias, online
//                        softmax, P stays in registers as the A operand of O += P V.
//   flash_tc_dq_kernel   grid (T/64, H, B): per key tile, S and dP = dO V^T, P = exp(S - lse),
//                        dS = P (dP - D_i); dq += dS K; dtable += dS; bias-parameter partials
//                        per thread in double, T5 through a bucket-owner scan of the tile
//                        (as cuda_flash.cu), one partial per 64-row block written into the
//                        first of its two 32-row slots (the second gets 0), so the shared
//                        fixed-order reduction (launch_attention_bias_grad_reduce) applies.
//   flash_tc_dkv_kernel  grid (T/64, H, B): a warp owns 16 keys; per query tile of 32,
//                        S^T = K Q^T, dP^T = V dO^T, then dv += P^T dO, dk += dS^T Q.
// dvec = rowsum(dout * out) comes from cuda_flash.cu's kernel (launch_flash_dvec), in fp32.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_bias.cuh"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_flash.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mma.cuh"

namespace ctx::cuda {

namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kBr = 64;        // queries per block (forward, dq): 16 per warp
constexpr int kBc = 64;        // keys per tile (forward, dq), keys per block (dkv): 16 per warp
constexpr int kBq = 32;        // queries per tile of the dkv kernel
constexpr int kPad = 8;        // bf16 padding per staged row
constexpr int kSP = kBc + 1;   // row stride of the T5 staging tiles (floats / ints)
static_assert(kBr == 2 * kBiasGradRows, "a block's partial fills two 32-row slots");

struct TcArgs {
    const float* pos;  // (B, T)
    // packed bf16 operands: rows (B, H, Tp, kD), transposes (B, H, kD, Tp); null if not packed
    const uint16_t *q, *k, *v, *g, *qt, *kt, *vt, *gt;
    int T, Tp, C, H, D, window;
    const int32_t* doc_start;  // (B, T) packed rows, or null (KeyMask)
    float scale;       // 1 / sqrt(D)
    BiasArgs bs;
};

__device__ __forceinline__ uint32_t ld32(const uint16_t* p) {
    return *reinterpret_cast<const uint32_t*>(p);
}

// R rows of W bf16 from src (row stride lds elements) into dst (row stride W + kPad): 16-byte
// copies, the loop unrolled so all of a thread's loads are issued before its stores.
template <int R, int W>
__device__ __forceinline__ void stage(uint16_t* dst, const uint16_t* src, size_t lds) {
    constexpr int V = W / 8, N = R * V, IT = (N + kThreads - 1) / kThreads;
    static_assert(W % 8 == 0, "whole 16-byte vectors per row");
#pragma unroll
    for (int it = 0; it < IT; it++) {
        const int idx = int(threadIdx.x) + it * kThreads;
        if (N % kThreads == 0 || idx < N) {
            const int r = idx / V, v = idx % V;
            *reinterpret_cast<uint4*>(dst + r * (W + kPad) + v * 8) =
                *reinterpret_cast<const uint4*>(src + size_t(r) * lds + v * 8);
        }
    }
}

// A fragment of rows [r, r + 16), columns [k, k + 16) of a staged (.., LS) tile.
__device__ __forceinline__ void load_a(uint32_t (&f)[4], const uint16_t* tile, int LS, int r,
                                       int k, int g, int t) {
    const uint16_t* p = tile + (r + g) * LS + k + 2 * t;
    f[0] = ld32(p);
    f[1] = ld32(p + 8 * LS);
    f[2] = ld32(p + 8);
    f[3] = ld32(p + 8 * LS + 8);
}

// B fragment (16 x 8) whose column n is row n0 + n of a staged (.., LS) tile, k from k0: the
// "n x k" storage of K in Q K^T, V in dO V^T, Q in K Q^T, and of every transposed tile.
__device__ __forceinline__ void load_b(uint32_t (&f)[2], const uint16_t* tile, int LS, int n0,
                                       int k0, int g, int t) {
    const uint16_t* p = tile + (n0 + g) * LS + k0 + 2 * t;
    f[0] = ld32(p);
    f[1] = ld32(p + 8);
}

// A fragment of the 16 x 16 block formed by the C fragments of column tiles c and c + 1.
__device__ __forceinline__ void c_to_a(uint32_t (&f)[4], const float (&c0)[4],
                                       const float (&c1)[4]) {
    f[0] = pack_bf16(c0[0], c0[1]);
    f[1] = pack_bf16(c0[2], c0[3]);
    f[2] = pack_bf16(c1[0], c1[1]);
    f[3] = pack_bf16(c1[2], c1[3]);
}

// acc (16 x 8 DN) += X Y with X the 16 x 16 KC block held as C fragments in c (two 8-column
// tiles per k step: P or dS straight from registers) and Y from the transposed tile Bt (row d of
// Bt is column d of Y): O += P V, dq += dS K, dv += P^T dO, dk += dS^T Q.
template <int KC, int DN>
__device__ __forceinline__ void product_from_c(float (&acc)[DN][4], const float (&c)[2 * KC][4],
                                               const uint16_t* Bt, int LT, int g, int t) {
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        uint32_t af[4];
        c_to_a(af, c[2 * kc], c[2 * kc + 1]);
#pragma unroll
        for (int dn = 0; dn < DN; dn++) {
            uint32_t bf[2];
            load_b(bf, Bt, LT, dn * 8, kc * 16, g, t);
            mma_bf16_16816(acc[dn], af, bf);
        }
    }
}

// Query i may attend key j of batch row b: causal, its window, its document (packed rows).
__device__ __forceinline__ bool in_mask(const TcArgs& a, int b, int i, int j) {
    return i < a.T && j <= i && j >= key_lo(KeyMask{a.window, a.doc_start}, b, a.T, i);
}

__device__ __forceinline__ const float* table_row(const TcArgs& a, int b, int h, int i) {
    return a.bs.kind == kTable && i < a.T ? a.bs.table + ((size_t(b) * a.H + h) * a.T + i) * a.T
                                          : nullptr;
}

// The query tile a block works on: heaviest (latest) first, so the long causal rows start early.
__device__ __forceinline__ int tile_index() { return int(gridDim.x - 1 - blockIdx.x); }

// First key tile of query tile q0 (causal with window); its last key is min(T, q0 + kBr) - 1.
__device__ __forceinline__ int first_key_tile(int q0, int window) {
    const int j_lo = window > 0 ? max(0, q0 - window + 1) : 0;
    return (j_lo / kBc) * kBc;
}

// ================================================================ forward

template <int kD>
__global__ void __launch_bounds__(kThreads) flash_tc_fwd_kernel(float* out, float* lse, TcArgs a) {
    extern __shared__ float sm[];  // Qs (kBr, LS) | Ks (kBc, LS) | Vt (kD, LT) | posK (kBc)
    constexpr int LS = kD + kPad, LT = kBc + kPad, KS = kD / 16, DN = kD / 8, NT = kBc / 8;
    uint16_t* Qs = reinterpret_cast<uint16_t*>(sm);
    uint16_t* Ks = Qs + kBr * LS;
    uint16_t* Vt = Ks + kBc * LS;
    float* posK = reinterpret_cast<float*>(Vt + kD * LT);
    const int T = a.T, C = a.C, D = a.D;
    const int q0 = tile_index() * kBr, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const size_t bh = size_t(b) * a.H + h, rows = bh * a.Tp * kD;
    const float* pos = a.pos + size_t(b) * T;
    stage<kBr, kD>(Qs, a.q + rows + size_t(q0) * kD, kD);
    __syncthreads();
    const int wr = warp * 16;
    uint32_t qf[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++) load_a(qf[kk], Qs, LS, wr, kk * 16, g, t);

    // rows i[0] = q0 + wr + g and i[1] = i[0] + 8 of this thread
    int i[2] = {q0 + wr + g, q0 + wr + g + 8};
    float pi[2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float* trow[2];
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        pi[r] = i[r] < T ? pos[i[r]] : 0.0f;
        trow[r] = table_row(a, b, h, i[r]);
    }
    float o[DN][4];
#pragma unroll
    for (int dn = 0; dn < DN; dn++) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;

    const int j_last = min(T - 1, q0 + kBr - 1);
    const int w_first = q0 + wr, w_last = q0 + wr + 15;  // this warp's rows
    for (int k0 = first_key_tile(q0, a.window); k0 <= j_last; k0 += kBc) {
        __syncthreads();  // the previous tile is no longer read
        stage<kBc, kD>(Ks, a.k + rows + size_t(k0) * kD, kD);
        stage<kD, kBc>(Vt, a.vt + rows + k0, a.Tp);
        for (int c = threadIdx.x; c < kBc; c += kThreads) posK[c] = k0 + c < T ? pos[k0 + c] : 0.0f;
        __syncthreads();
        // the whole tile is masked for this warp: after its last row, or before its window
        if (k0 > w_last || w_first >= T ||
            (a.window > 0 && k0 + kBc - 1 < key_start(w_first, a.window)))
            continue;
        float s[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
#pragma unroll
            for (int n = 0; n < NT; n++) {
                uint32_t bf[2];
                load_b(bf, Ks, LS, n * 8, kk * 16, g, t);
                mma_bf16_16816(s[n], qf[kk], bf);
            }
        float mx[2] = {-INFINITY, -INFINITY};
        uint32_t valid = 0;  // bit 4 n + e
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, c = n * 8 + 2 * t + (e & 1), j = k0 + c;
                if (!in_mask(a, b, i[r], j)) continue;
                const float x = s[n][e] * a.scale + bias_value(a.bs, h, pi[r], posK[c], trow[r], j);
                s[n][e] = x;
                valid |= 1u << (4 * n + e);
                mx[r] = fmaxf(mx[r], x);
            }
        float corr[2], sum[2] = {0.0f, 0.0f};
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 2));
            const float mn = fmaxf(m[r], mx[r]);
            corr[r] = m[r] == -INFINITY ? 0.0f : expf(m[r] - mn);
            m[r] = mn;
        }
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = (valid >> (4 * n + e)) & 1u ? expf(s[n][e] - m[e >> 1]) : 0.0f;
                s[n][e] = p;
                sum[e >> 1] += p;
            }
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            sum[r] += __shfl_xor_sync(kFullMask, sum[r], 1);
            sum[r] += __shfl_xor_sync(kFullMask, sum[r], 2);
            l[r] = l[r] * corr[r] + sum[r];
        }
#pragma unroll
        for (int dn = 0; dn < DN; dn++) {
            o[dn][0] *= corr[0];
            o[dn][1] *= corr[0];
            o[dn][2] *= corr[1];
            o[dn][3] *= corr[1];
        }
        product_from_c<kBc / 16, DN>(o, s, Vt, LT, g, t);
    }
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        if (i[r] >= T) continue;  // every real row has its diagonal: l > 0
        const float inv = 1.0f / l[r];
        float* dst = out + (size_t(b) * T + i[r]) * C + size_t(h) * D;
#pragma unroll
        for (int dn = 0; dn < DN; dn++) {
            const int d = dn * 8 + 2 * t;
            if (d < D) dst[d] = o[dn][2 * r] * inv;
            if (d + 1 < D) dst[d + 1] = o[dn][2 * r + 1] * inv;
        }
        if (t == 0) lse[(size_t(b) * a.H + h) * T + i[r]] = m[r] + logf(l[r]);
    }
}

// ================================================================ backward: dq

// d logit / d (a, b) of the Linear and KERPLE families times v, added to ga, gb (as cuda_flash.cu).
__device__ __forceinline__ void bias_param_grads(double& ga, double& gb, int kind, float v,
                                                 float pi, float pj, float pa, float pb) {
    switch (kind) {
        case kLinear:
            ga -= double(v * (pi - pj));
            break;
        case kKerpleLog: {
            const float dd = fabsf(pi - pj), u = 1.0f + pb * dd;
            ga -= double(v * logf(u));
            gb -= double(v * pa * dd / u);
            break;
        }
        case kKerplePower: {
            const float dd = fabsf(pi - pj);
            if (dd > 0.0f) {
                const float pw = powf(dd, pb);
                ga -= double(v * pw);
                gb -= double(v * pa * pw * logf(dd));
            }
            break;
        }
        default:
            break;
    }
}

// The two products of a backward tile, both over the head dim (KS steps of 16) into NT column
// tiles of 8: x = A1 B1^T and y = A2 B2^T, A rows [r, r + 16) of staged tiles, B rows the
// columns. dq: S = Q K^T, dP = dO V^T; dkv: S^T = K Q^T, dP^T = V dO^T.
template <int KS, int NT>
__device__ __forceinline__ void tile_pair(float (&x)[NT][4], float (&y)[NT][4],
                                          const uint16_t* A1, const uint16_t* A2, int r,
                                          const uint16_t* B1, const uint16_t* B2, int LS, int g,
                                          int t) {
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) x[n][e] = y[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t a1[4], a2[4];
        load_a(a1, A1, LS, r, kk * 16, g, t);
        load_a(a2, A2, LS, r, kk * 16, g, t);
#pragma unroll
        for (int n = 0; n < NT; n++) {
            uint32_t bf[2];
            load_b(bf, B1, LS, n * 8, kk * 16, g, t);
            mma_bf16_16816(x[n], a1, bf);
            load_b(bf, B2, LS, n * 8, kk * 16, g, t);
            mma_bf16_16816(y[n], a2, bf);
        }
    }
}

template <int kD>
__global__ void __launch_bounds__(kThreads)
    flash_tc_dq_kernel(float* dqkv, float* partials, float* dtable, const float* lse,
                       const float* dvec, TcArgs a) {
    // Qs, dOs (kBr, LS) | Ks, Vs (kBc, LS) | Kt (kD, LT) | posK (kBc) | T5: Sd, Bk (kBr, kSP)
    extern __shared__ float sm[];
    __shared__ double red[32];
    constexpr int LS = kD + kPad, LT = kBc + kPad, KS = kD / 16, DN = kD / 8, NT = kBc / 8;
    uint16_t* Qs = reinterpret_cast<uint16_t*>(sm);
    uint16_t* dOs = Qs + kBr * LS;
    uint16_t* Ks = dOs + kBr * LS;
    uint16_t* Vs = Ks + kBc * LS;
    uint16_t* Kt = Vs + kBc * LS;
    float* posK = reinterpret_cast<float*>(Kt + kD * LT);
    float* Sd = posK + kBc;
    int* Bk = reinterpret_cast<int*>(Sd + kBr * kSP);
    const int T = a.T, C = a.C, D = a.D, H = a.H, kind = a.bs.kind;
    const int tile = tile_index(), q0 = tile * kBr, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t bh = size_t(b) * H + h, rows = bh * a.Tp * kD;
    const float* pos = a.pos + size_t(b) * T;
    stage<kBr, kD>(Qs, a.q + rows + size_t(q0) * kD, kD);
    stage<kBr, kD>(dOs, a.g + rows + size_t(q0) * kD, kD);
    const int wr = warp * 16;
    int i[2] = {q0 + wr + g, q0 + wr + g + 8};
    float pi[2], lse_r[2], d_r[2];
    const float* trow[2];
    size_t row[2];
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        row[r] = (size_t(b) * H + h) * T + i[r];
        const bool real = i[r] < T;
        pi[r] = real ? pos[i[r]] : 0.0f;
        lse_r[r] = real ? lse[row[r]] : 0.0f;
        d_r[r] = real ? dvec[row[r]] : 0.0f;
        trow[r] = table_row(a, b, h, i[r]);
    }
    const bool grads = partials != nullptr;
    const bool t5 = grads && kind == kT5;
    const float pa = grads && kind >= kLinear && kind <= kKerplePower ? a.bs.a[h] : 0.0f;
    const float pb = grads && (kind == kKerpleLog || kind == kKerplePower) ? a.bs.b[h] : 0.0f;
    double ga = 0.0, gb = 0.0;
    double gt[4] = {0.0, 0.0, 0.0, 0.0};  // T5: buckets tid + kThreads u
    float acc[DN][4];
#pragma unroll
    for (int dn = 0; dn < DN; dn++) acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;

    const int j_last = min(T - 1, q0 + kBr - 1);
    const int w_first = q0 + wr, w_last = q0 + wr + 15;
    for (int k0 = first_key_tile(q0, a.window); k0 <= j_last; k0 += kBc) {
        __syncthreads();
        stage<kBc, kD>(Ks, a.k + rows + size_t(k0) * kD, kD);
        stage<kBc, kD>(Vs, a.v + rows + size_t(k0) * kD, kD);
        stage<kD, kBc>(Kt, a.kt + rows + k0, a.Tp);
        for (int c = tid; c < kBc; c += kThreads) posK[c] = k0 + c < T ? pos[k0 + c] : 0.0f;
        __syncthreads();
        const bool masked = k0 > w_last || w_first >= T ||
                            (a.window > 0 && k0 + kBc - 1 < key_start(w_first, a.window));
        if (masked) {
            if (t5)  // the bucket scan below reads every row of the tile
                for (int e = lane; e < 16 * kBc; e += 32) Bk[(wr + e / kBc) * kSP + e % kBc] = -1;
        } else {
            float s[NT][4], dp[NT][4];
            tile_pair<KS, NT>(s, dp, Qs, dOs, wr, Ks, Vs, LS, g, t);
            // s becomes dS = P (dP - D_i), 0 outside the mask
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = e >> 1, c = n * 8 + 2 * t + (e & 1), j = k0 + c;
                    const bool in = in_mask(a, b, i[r], j);
                    float v = 0.0f;
                    if (in) {
                        const float x =
                            s[n][e] * a.scale + bias_value(a.bs, h, pi[r], posK[c], trow[r], j);
                        v = expf(x - lse_r[r]) * (dp[n][e] - d_r[r]);
                        if (dtable != nullptr) dtable[row[r] * T + j] += v;
                        if (grads && !t5) bias_param_grads(ga, gb, kind, v, pi[r], posK[c], pa, pb);
                    }
                    if (t5) {
                        Sd[(wr + g + 8 * r) * kSP + c] = v;
                        Bk[(wr + g + 8 * r) * kSP + c] = in ? t5_bucket(a.bs, pi[r], posK[c]) : -1;
                    }
                    s[n][e] = v;
                }
            product_from_c<kBc / 16, DN>(acc, s, Kt, LT, g, t);
        }
        if (t5) {
            __syncthreads();  // Sd, Bk complete
            t5_tile_grad(gt, Bk, Sd, kBr, kBc, kSP, tid, kThreads);
        }
    }
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        if (i[r] >= T) continue;
        float* dq = dqkv + (size_t(b) * T + i[r]) * 3 * C + size_t(h) * D;
#pragma unroll
        for (int dn = 0; dn < DN; dn++) {
            const int d = dn * 8 + 2 * t;
            if (d < D) dq[d] += acc[dn][2 * r] * a.scale;
            if (d + 1 < D) dq[d + 1] += acc[dn][2 * r + 1] * a.scale;
        }
    }
    if (grads) {
        // this block's rows are 32-row chunks 2 tile and 2 tile + 1 of the partials layout
        const int chunks = (T + kBiasGradRows - 1) / kBiasGradRows;
        float* slot = partials + ((size_t(b) * H + h) * chunks + 2 * tile) * kMaxT5Buckets;
        float* next = 2 * tile + 1 < chunks ? slot + kMaxT5Buckets : nullptr;
        if (t5) {
            for (int u = 0; u < 4; u++) {
                const int x = tid + kThreads * u;
                if (x < a.bs.nb) {
                    slot[x] = float(gt[u]);
                    if (next) next[x] = 0.0f;
                }
            }
        } else {
            ga = block_sum(ga, red);
            gb = block_sum(gb, red);
            if (tid == 0) {
                slot[0] = float(ga);
                slot[1] = float(gb);
                if (next) next[0] = next[1] = 0.0f;
            }
        }
    }
}

// ================================================================ backward: dk, dv

template <int kD>
__global__ void __launch_bounds__(kThreads)
    flash_tc_dkv_kernel(float* dqkv, const float* lse, const float* dvec, TcArgs a) {
    // Ks, Vs (kBc, LS) | Qs, dOs (kBq, LS) | Qt, dOt (kD, LQ) | posQ, lseQ, dQ (kBq)
    extern __shared__ float sm[];
    constexpr int LS = kD + kPad, LQ = kBq + kPad, KS = kD / 16, DN = kD / 8, NT = kBq / 8;
    uint16_t* Ks = reinterpret_cast<uint16_t*>(sm);
    uint16_t* Vs = Ks + kBc * LS;
    uint16_t* Qs = Vs + kBc * LS;
    uint16_t* dOs = Qs + kBq * LS;
    uint16_t* Qt = dOs + kBq * LS;
    uint16_t* dOt = Qt + kD * LQ;
    float* posQ = reinterpret_cast<float*>(dOt + kD * LQ);
    float* lseQ = posQ + kBq;
    float* dQ = lseQ + kBq;
    const int T = a.T, C = a.C, D = a.D, H = a.H;
    const int k0 = tile_index() * kBc, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const size_t bh = size_t(b) * H + h, rows = bh * a.Tp * kD;
    const float* pos = a.pos + size_t(b) * T;
    stage<kBc, kD>(Ks, a.k + rows + size_t(k0) * kD, kD);
    stage<kBc, kD>(Vs, a.v + rows + size_t(k0) * kD, kD);
    const int wk = warp * 16;
    const int j[2] = {k0 + wk + g, k0 + wk + g + 8};  // this thread's keys
    const float pj[2] = {j[0] < T ? pos[j[0]] : 0.0f, j[1] < T ? pos[j[1]] : 0.0f};
    float dk[DN][4], dv[DN][4];
#pragma unroll
    for (int dn = 0; dn < DN; dn++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[dn][e] = dv[dn][e] = 0.0f;

    const int j_last = min(T - 1, k0 + kBc - 1);
    const int i_last = a.window > 0 ? min(T - 1, j_last + a.window - 1) : T - 1;
    const int w_first = k0 + wk, w_last = k0 + wk + 15;  // this warp's keys
    for (int q0 = k0; q0 <= i_last; q0 += kBq) {  // queries before k0 see none of these keys
        __syncthreads();
        stage<kBq, kD>(Qs, a.q + rows + size_t(q0) * kD, kD);
        stage<kBq, kD>(dOs, a.g + rows + size_t(q0) * kD, kD);
        stage<kD, kBq>(Qt, a.qt + rows + q0, a.Tp);
        stage<kD, kBq>(dOt, a.gt + rows + q0, a.Tp);
        for (int c = threadIdx.x; c < kBq; c += kThreads) {
            const int i = q0 + c;
            const size_t row = (size_t(b) * H + h) * T + i;
            posQ[c] = i < T ? pos[i] : 0.0f;
            lseQ[c] = i < T ? lse[row] : 0.0f;
            dQ[c] = i < T ? dvec[row] : 0.0f;
        }
        __syncthreads();
        // no query of the tile sees this warp's keys: all before them, or all past the window
        if (q0 + kBq - 1 < w_first || w_first >= T ||
            (a.window > 0 && q0 > w_last + a.window - 1))
            continue;
        float s[NT][4], dp[NT][4];
        tile_pair<KS, NT>(s, dp, Ks, Vs, wk, Qs, dOs, LS, g, t);
        // s becomes P^T, dp becomes dS^T (row: key, column: query)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, c = n * 8 + 2 * t + (e & 1), i = q0 + c;
                float p = 0.0f, ds = 0.0f;
                if (j[r] < T && in_mask(a, b, i, j[r])) {
                    const float x = s[n][e] * a.scale +
                                    bias_value(a.bs, h, posQ[c], pj[r], table_row(a, b, h, i), j[r]);
                    p = expf(x - lseQ[c]);
                    ds = p * (dp[n][e] - dQ[c]);
                }
                s[n][e] = p;
                dp[n][e] = ds;
            }
        product_from_c<kBq / 16, DN>(dv, s, dOt, LQ, g, t);
        product_from_c<kBq / 16, DN>(dk, dp, Qt, LQ, g, t);
    }
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        if (j[r] >= T) continue;
        float* dst = dqkv + (size_t(b) * T + j[r]) * 3 * C + size_t(h) * D;
#pragma unroll
        for (int dn = 0; dn < DN; dn++) {
            const int d = dn * 8 + 2 * t;
            if (d < D) {
                dst[C + d] += dk[dn][2 * r] * a.scale;
                dst[2 * C + d] += dv[dn][2 * r];
            }
            if (d + 1 < D) {
                dst[C + d + 1] += dk[dn][2 * r + 1] * a.scale;
                dst[2 * C + d + 1] += dv[dn][2 * r + 1];
            }
        }
    }
}

// ================================================================ packing

// dst (B, H, Tp, kD) bf16 = the H heads of D columns at [col0, col0 + H D) of src (B, T, ld),
// zero past T and past D. One thread per bf16 pair (coalesced reads along d).
__global__ void pack_rows_kernel(uint16_t* dst, const float* src, int ld, int col0, int B, int T,
                                 int Tp, int H, int D, int kD) {
    const int P = kD / 2;
    const size_t pairs = size_t(B) * H * Tp * P;
    for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < pairs;
         idx += size_t(gridDim.x) * blockDim.x) {
        const int d = 2 * int(idx % P);
        const size_t r = idx / P, bh = r / Tp;
        const int t = int(r % Tp), h = int(bh % H), b = int(bh / H);
        float x0 = 0.0f, x1 = 0.0f;
        if (t < T) {
            const float* p = src + (size_t(b) * T + t) * ld + col0 + size_t(h) * D;
            if (d < D) x0 = p[d];
            if (d + 1 < D) x1 = p[d + 1];
        }
        reinterpret_cast<uint32_t*>(dst)[idx] = pack_bf16(x0, x1);
    }
}

constexpr int kTr = 32;  // transpose tile

// dst (BH, kD, Tp) = src (BH, Tp, kD) transposed, through a (32, 33) shared tile; grid
// (Tp / 32, ceil(kD / 32), BH), block (32, 8).
__global__ void transpose_kernel(uint16_t* dst, const uint16_t* src, int Tp, int kD) {
    __shared__ uint16_t tile[kTr][kTr + 1];
    const size_t bh = blockIdx.z;
    const int t0 = blockIdx.x * kTr, d0 = blockIdx.y * kTr, x = threadIdx.x;
    const uint16_t* in = src + bh * Tp * kD;
    uint16_t* out = dst + bh * Tp * kD;
    for (int y = threadIdx.y; y < kTr; y += 8)
        if (d0 + x < kD) tile[y][x] = in[size_t(t0 + y) * kD + d0 + x];
    __syncthreads();
    for (int y = threadIdx.y; y < kTr; y += 8)
        if (d0 + y < kD) out[size_t(d0 + y) * Tp + t0 + x] = tile[x][y];
}

// ================================================================ launch helpers

int tc_head_dim(int D) { return D <= 32 ? 32 : D <= 64 ? 64 : D <= 80 ? 80 : kFlashMaxHeadDim; }
int padded_T(int T) { return (T + kBc - 1) / kBc * kBc; }

// rows (B, H, Tp, kD) of src's heads at col0, and their transpose when trans is not null.
cudaError_t pack(uint16_t* rows, uint16_t* trans, const float* src, int ld, int col0, int B,
                 int T, int H, int D, cudaStream_t s) {
    const int kD = tc_head_dim(D), Tp = padded_T(T);
    const size_t pairs = size_t(B) * H * Tp * kD / 2;
    pack_rows_kernel<<<grid_for(pairs, 256), 256, 0, s>>>(rows, src, ld, col0, B, T, Tp, H, D, kD);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess || trans == nullptr) return e;
    const dim3 grid(Tp / kTr, (kD + kTr - 1) / kTr, B * H);
    transpose_kernel<<<grid, dim3(kTr, 8), 0, s>>>(trans, rows, Tp, kD);
    return cudaGetLastError();
}

TcArgs make_args(const float* positions, int T, int C, int H, KeyMask mask,
                 const BiasArgs& bias) {
    TcArgs a{};
    a.pos = positions;
    a.T = T;
    a.Tp = padded_T(T);
    a.C = C;
    a.H = H;
    a.D = C / H;
    a.window = mask.window;
    a.doc_start = mask.doc_start;
    a.scale = 1.0f / sqrtf(float(a.D));
    a.bs = bias;
    return a;
}

size_t fwd_smem(int kD) {
    return (size_t(kBr + kBc) * (kD + kPad) + size_t(kD) * (kBc + kPad)) * 2 + kBc * 4;
}
size_t dq_smem(int kD, bool t5) {
    const size_t base = (size_t(2 * kBr + 2 * kBc) * (kD + kPad) + size_t(kD) * (kBc + kPad)) * 2 +
                        kBc * 4;
    return base + (t5 ? size_t(2) * kBr * kSP * 4 : 0);
}
size_t dkv_smem(int kD) {
    return (size_t(2 * kBc + 2 * kBq) * (kD + kPad) + size_t(2) * kD * (kBq + kPad)) * 2 +
           3 * kBq * 4;
}

template <int kD>
cudaError_t forward_t(float* out, float* lse, const TcArgs& a, int B, cudaStream_t s) {
    static const cudaError_t ready = allow_dynamic_shared(flash_tc_fwd_kernel<kD>, fwd_smem(kD));
    if (ready != cudaSuccess) return ready;
    const dim3 grid((a.T + kBr - 1) / kBr, a.H, B);
    flash_tc_fwd_kernel<kD><<<grid, kThreads, fwd_smem(kD), s>>>(out, lse, a);
    return cudaGetLastError();
}

template <int kD>
cudaError_t backward_t(float* dqkv, float* partials, float* dtable, const float* lse,
                       const float* dvec, const TcArgs& a, int B, cudaStream_t s) {
    static const cudaError_t ready_dq = allow_dynamic_shared(flash_tc_dq_kernel<kD>, dq_smem(kD, true));
    static const cudaError_t ready_dkv = allow_dynamic_shared(flash_tc_dkv_kernel<kD>, dkv_smem(kD));
    if (ready_dq != cudaSuccess) return ready_dq;
    if (ready_dkv != cudaSuccess) return ready_dkv;
    const bool t5 = partials != nullptr && a.bs.kind == kT5;
    const dim3 grid_q((a.T + kBr - 1) / kBr, a.H, B), grid_k((a.T + kBc - 1) / kBc, a.H, B);
    flash_tc_dq_kernel<kD><<<grid_q, kThreads, dq_smem(kD, t5), s>>>(dqkv, partials, dtable, lse,
                                                                     dvec, a);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    flash_tc_dkv_kernel<kD><<<grid_k, kThreads, dkv_smem(kD), s>>>(dqkv, lse, dvec, a);
    return cudaGetLastError();
}

}  // namespace

size_t flash_tc_packed_elems(int B, int T, int C, int H) {
    if (B <= 0 || T <= 0 || H <= 0) return 0;
    return size_t(7) * B * H * padded_T(T) * tc_head_dim(C / H);
}

cudaError_t launch_flash_tc_forward(float* out, float* lse, uint16_t* packed, const float* qkv,
                                    const float* positions, int B, int T, int C, int H, KeyMask mask,
                                    const BiasArgs& bias, cudaStream_t s) {
    if (B <= 0 || T <= 0) return cudaSuccess;
    TcArgs a = make_args(positions, T, C, H, mask, bias);
    if (a.D > kFlashMaxHeadDim) return cudaErrorInvalidValue;
    const size_t n = size_t(B) * H * a.Tp * tc_head_dim(a.D);  // one packed operand
    uint16_t *q = packed, *k = q + n, *v = k + n, *vt = v + n;
    for (cudaError_t e : {pack(q, nullptr, qkv, 3 * C, 0, B, T, H, a.D, s),
                          pack(k, nullptr, qkv, 3 * C, C, B, T, H, a.D, s),
                          pack(v, vt, qkv, 3 * C, 2 * C, B, T, H, a.D, s)})
        if (e != cudaSuccess) return e;
    a.q = q;
    a.k = k;
    a.vt = vt;
    if (a.D <= 32) return forward_t<32>(out, lse, a, B, s);
    if (a.D <= 64) return forward_t<64>(out, lse, a, B, s);
    if (a.D <= 80) return forward_t<80>(out, lse, a, B, s);
    return forward_t<kFlashMaxHeadDim>(out, lse, a, B, s);
}

cudaError_t launch_flash_tc_backward(float* dqkv, float* dvec, float* partials, float* dtable,
                                     uint16_t* packed, const float* dout, const float* qkv,
                                     const float* out, const float* lse, const float* positions,
                                     int B, int T, int C, int H, KeyMask mask, const BiasArgs& bias,
                                     cudaStream_t s) {
    if (B <= 0 || T <= 0) return cudaSuccess;
    TcArgs a = make_args(positions, T, C, H, mask, bias);
    if (a.D > kFlashMaxHeadDim) return cudaErrorInvalidValue;
    if (cudaError_t e = launch_flash_dvec(dvec, dout, out, B, T, C, H, s); e != cudaSuccess)
        return e;
    const size_t n = size_t(B) * H * a.Tp * tc_head_dim(a.D);
    uint16_t *q = packed, *k = q + n, *v = k + n, *g = v + n, *qt = g + n, *kt = qt + n,
             *gt = kt + n;
    for (cudaError_t e : {pack(q, qt, qkv, 3 * C, 0, B, T, H, a.D, s),
                          pack(k, kt, qkv, 3 * C, C, B, T, H, a.D, s),
                          pack(v, nullptr, qkv, 3 * C, 2 * C, B, T, H, a.D, s),
                          pack(g, gt, dout, C, 0, B, T, H, a.D, s)})
        if (e != cudaSuccess) return e;
    a.q = q;
    a.k = k;
    a.v = v;
    a.g = g;
    a.qt = qt;
    a.kt = kt;
    a.gt = gt;
    if (a.D <= 32) return backward_t<32>(dqkv, partials, dtable, lse, dvec, a, B, s);
    if (a.D <= 64) return backward_t<64>(dqkv, partials, dtable, lse, dvec, a, B, s);
    if (a.D <= 80) return backward_t<80>(dqkv, partials, dtable, lse, dvec, a, B, s);
    return backward_t<kFlashMaxHeadDim>(dqkv, partials, dtable, lse, dvec, a, B, s);
}

}  // namespace ctx::cuda
