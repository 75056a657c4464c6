// CUDA backend (private, device code): what the tensor-core flash kernels share
// (cuda_flash_tc.cu: forward and packing; cuda_flash_tc_bwd.cu: backward): tile sizes, the
// arguments, asynchronous staging, ldmatrix fragment loads and the products built from them,
// mask classification of a warp's block, and the bias families the logit loops are specialised
// for. The file comment of cuda_flash_tc.cu describes the algorithm.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_bias.cuh"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_flash.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_rotary.cuh"

namespace ctx::cuda::tc {

inline constexpr int kThreads = 128;  // 4 warps
inline constexpr int kBr = 64;        // queries per block (dq): 16 per warp
inline constexpr int kBc = 64;        // keys per tile (forward, dq), keys per block (dkv): 16 per warp
inline constexpr int kBq = 32;        // queries per tile of the dkv kernel
inline constexpr int kPad = 8;        // bf16 padding per staged row (16 bytes)
inline constexpr int kSP = kBc + 1;   // row stride of the T5 staging tiles (floats / ints)
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;
static_assert(kBr == 2 * kBiasGradRows, "a block's partial fills two 32-row slots");

struct TcArgs {
    const float* pos;                  // (B, T)
    const uint16_t *q, *k, *v, *g;     // packed bf16 rows (B, H, Tp, kD); null if not packed
    int T, Tp, C, H, D, window;
    const int32_t* doc_start;  // (B, T) packed rows, or null (KeyMask)
    float scale;               // 1 / sqrt(D)
    BiasArgs bs;
    bool accumulate = true;    // backward: dqkv += (else =, GradStore::Overwrite)
    // forward: out written in bf16 here (B, T, C) instead of in fp32 (Backend::
    // attention_forward_bf16); backward: out read from here (dvec)
    uint16_t* out16 = nullptr;
    // KERPLE-log (backward): per head h and integer distance d, log2(1 + b[h] d) at
    // ktab[h kcap + d] and d / (1 + b[h] d) at ktab[(H + h) kcap + d] (launch_kerple_tables),
    // computed as the MUFU path computes them, so bit-identical; kinfo[0] = 1 when this call's
    // positions are all integers spanning less than kcap (the backward kernels then look the
    // terms up instead of up to two MUFU ops a logit), kinfo[1] = the distances filled.
    const float* ktab = nullptr;
    const int* kinfo = nullptr;
    int kcap = 0;
    // The rotation of q and k (AttentionOptions::rotary), or none: the forward's packing applies
    // it, the backward's dq and dk leave rotated back (rotate_back_rows).
    RotationTable rot;
    // backward: dq's atomics four columns at a time where the GPU has them (sm_90): set by the
    // launcher when FlashTcKernels::dq_quad_atomics and every dq row is 16-byte aligned
    bool dq_quad = false;
};

inline constexpr int kKerpleCap = 65536;  // distances per head in the KERPLE-log tables

// Whether a one-kernel backward adds dq's terms four columns at a time (atomic_add_c_quads):
// on sm_90 (and in the emulation) when the launcher found every dq row 16-byte aligned (TcArgs::
// dq_quad).
__device__ __forceinline__ bool dq_quad_atomics(const TcArgs& a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    return false;
#else
    return a.dq_quad;
#endif
}

// R rows of W bf16 from src (row stride lds elements) into dst (row stride W + kPad), as
// asynchronous 16-byte copies of the whole block (the caller commits the group).
template <int R, int W>
__device__ __forceinline__ void stage_async(uint16_t* dst, const uint16_t* src, size_t lds) {
    constexpr int V = W / 8, N = R * V, IT = (N + kThreads - 1) / kThreads;
    static_assert(W % 8 == 0, "whole 16-byte vectors per row");
#pragma unroll
    for (int it = 0; it < IT; it++) {
        const int idx = int(threadIdx.x) + it * kThreads;
        if (N % kThreads == 0 || idx < N) {
            const int r = idx / V, v = idx % V;
            cp_async16(dst + r * (W + kPad) + v * 8, src + size_t(r) * lds + v * 8);
        }
    }
}

// dst[c] = src[i0 + c] for c < n, 0 at and past T, asynchronously.
__device__ __forceinline__ void stage_floats_async(float* dst, const float* src, int i0, int n,
                                                   int T, int thread = int(threadIdx.x)) {
    for (int c = thread; c < n; c += kThreads) {
        const bool in = i0 + c < T;
        cp_async4(dst + c, src + (in ? i0 + c : 0), in);
    }
}

// Tile `it` of a loop of n tiles, staged two deep: issues tile it + 1 (load(it + 1), which
// commits its group) when there is one, waits for tile it's group and makes it visible to the
// block. The caller ends each iteration with __syncthreads before the stage is reused.
// before_barrier runs between the wait and the barrier (the wgmma kernels' async-proxy fence).
struct Nothing {
    __device__ __forceinline__ void operator()() const {}
};
template <class Load, class BeforeBarrier = Nothing>
__device__ __forceinline__ void await_tile(int it, int n, Load&& load,
                                           BeforeBarrier before_barrier = {}) {
    if (it + 1 < n) {
        load(it + 1);
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    before_barrier();
    __syncthreads();
}

// The four 8 x 8 matrices of the 16 x 16 block at (r0, c0) of a staged tile (row stride LS), in
// the order (r0, c0), (r0 + 8, c0), (r0, c0 + 8), (r0 + 8, c0 + 8). As an A operand f is its
// fragment; as a B operand stored n-major (row n, k contiguous) the n-tiles r0 and r0 + 8 are
// {f0, f2} and {f1, f3}; read with kTrans from a tile stored k-major (row k, n contiguous), the
// n-tiles c0 and c0 + 8 are {f0, f1} and {f2, f3}.
template <bool kTrans>
__device__ __forceinline__ void ldsm_block(uint32_t (&f)[4], const uint16_t* tile, int LS, int r0,
                                           int c0, int lane) {
    const int m = lane >> 3;
    const uint16_t* p = tile + (r0 + (m & 1) * 8 + (lane & 7)) * LS + c0 + (m >> 1) * 8;
    if constexpr (kTrans)
        ldsm_x4_trans(f, p);
    else
        ldsm_x4(f, p);
}

// x (16 x 8 NT) += the A fragment af times the first 8 NT rows of Bn (n-major, row stride LS),
// columns [16 kk, 16 kk + 16), transposed: one k step of a product.
template <int NT>
__device__ __forceinline__ void mma_k_step(float (&x)[NT][4], const uint32_t (&af)[4],
                                           const uint16_t* Bn, int LS, int kk, int lane) {
    static_assert(NT % 2 == 0, "n-tiles in pairs");
#pragma unroll
    for (int n2 = 0; n2 < NT / 2; n2++) {
        uint32_t bf[4];
        ldsm_block<false>(bf, Bn, LS, n2 * 16, kk * 16, lane);
        const uint32_t b0[2] = {bf[0], bf[2]}, b1[2] = {bf[1], bf[3]};
        mma_bf16_16816(x[2 * n2], af, b0);
        mma_bf16_16816(x[2 * n2 + 1], af, b1);
    }
}

// x (16 x 8 NT) = A (16 x 16 KS) times the first 8 NT rows of Bn transposed, A given as KS
// fragments: S = Q K^T (Q in registers).
template <int KS, int NT>
__device__ __forceinline__ void product_nt(float (&x)[NT][4], const uint32_t (&af)[KS][4],
                                           const uint16_t* Bn, int LS, int lane) {
#pragma unroll
    for (int n = 0; n < NT; n++) x[n][0] = x[n][1] = x[n][2] = x[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) mma_k_step<NT>(x, af[kk], Bn, LS, kk, lane);
}

// The same with A as rows [r, r + 16) of a staged tile, its fragments read per k step.
template <int KS, int NT>
__device__ __forceinline__ void product_nt_staged(float (&x)[NT][4], const uint16_t* A, int r,
                                                  const uint16_t* Bn, int LS, int lane) {
#pragma unroll
    for (int n = 0; n < NT; n++) x[n][0] = x[n][1] = x[n][2] = x[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t af[4];
        ldsm_block<false>(af, A, LS, r, kk * 16, lane);
        mma_k_step<NT>(x, af, Bn, LS, kk, lane);
    }
}

// The two products of a backward tile, both over the head dim: x = A1 B1^T and y = A2 B2^T,
// A rows [r, r + 16) of staged tiles, B rows the n columns. dq: S = Q K^T, dP = dO V^T; dkv:
// S^T = K Q^T, dP^T = V dO^T. One after the other: half the A fragments live at once (the
// dk/dv kernel at D = 128 spilled when they were interleaved).
template <int KS, int NT>
__device__ __forceinline__ void tile_pair(float (&x)[NT][4], float (&y)[NT][4],
                                          const uint16_t* A1, const uint16_t* A2, int r,
                                          const uint16_t* B1, const uint16_t* B2, int LS,
                                          int lane) {
    product_nt_staged<KS, NT>(x, A1, r, B1, LS, lane);
    product_nt_staged<KS, NT>(y, A2, r, B2, LS, lane);
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
// tiles per k step: P or dS straight from registers) and Y rows [0, 16 KC) of the k-major tile
// Bk (row k, n contiguous), read with ldmatrix.trans: O += P V, dq += dS K, dv += P^T dO,
// dk += dS^T Q.
template <int KC, int DN>
__device__ __forceinline__ void product_from_c(float (&acc)[DN][4], const float (&c)[2 * KC][4],
                                               const uint16_t* Bk, int LS, int lane) {
    static_assert(DN % 2 == 0, "n-tiles in pairs");
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        uint32_t af[4];
        c_to_a(af, c[2 * kc], c[2 * kc + 1]);
#pragma unroll
        for (int dn2 = 0; dn2 < DN / 2; dn2++) {
            uint32_t bf[4];
            ldsm_block<true>(bf, Bk, LS, kc * 16, dn2 * 16, lane);
            const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
            mma_bf16_16816(acc[2 * dn2], af, b0);
            mma_bf16_16816(acc[2 * dn2 + 1], af, b1);
        }
    }
}

// ================================================================ masks and biases

// Query i may attend key j of batch row b: causal, its window, its document (packed rows).
__device__ __forceinline__ bool in_mask(const TcArgs& a, int b, int i, int j) {
    return i < a.T && j <= i && j >= key_lo(KeyMask{a.window, a.doc_start}, b, a.T, i);
}

// First key query i attends (i < T); non-decreasing in i, so over rows [r0, r1] it is smallest
// at r0 and largest at r1.
__device__ __forceinline__ int row_lo(const TcArgs& a, int b, int i) {
    return key_lo(KeyMask{a.window, a.doc_start}, b, a.T, i);
}

// How a warp's block of rows (queries) [i0, i1] meets keys [j0, j1]: kSkip (no pair attends),
// kFull (every pair attends: no per-logit test), kPartial.
enum TileCover { kSkip, kFull, kPartial };
__device__ __forceinline__ TileCover cover(const TcArgs& a, int b, int i0, int i1, int j0,
                                           int j1) {
    if (i0 >= a.T || j0 > i1 || j1 < row_lo(a, b, i0)) return kSkip;
    if (i1 < a.T && j1 <= i0 && j0 >= row_lo(a, b, i1)) return kFull;
    return kPartial;
}

__device__ __forceinline__ const float* table_row(const TcArgs& a, int b, int h, int i) {
    return a.bs.kind == kTable && i < a.T ? a.bs.table + ((size_t(b) * a.H + h) * a.T + i) * a.T
                                          : nullptr;
}

// The bias families the logit loops are instantiated for; the rest go through bias_value.
// kKerpleTable is KERPLE-log with its terms looked up (TcArgs::ktab), chosen per call.
inline constexpr int kOtherBias = -1, kKerpleTable = 100;
__host__ __device__ __forceinline__ int bias_family(int kind) {
    return kind == kNone || kind == kLinear || kind == kKerpleLog ? kind : kOtherBias;
}

// Key tile k0 of the forward and dq kernels into one stage: K and V rows (kBc, kD + kPad) and,
// when the bias reads them, the keys' positions; commits the group.
template <int kD>
__device__ __forceinline__ void stage_key_tile(uint16_t* Ks, uint16_t* Vs, float* posK,
                                               const TcArgs& a, size_t rows, const float* pos,
                                               int k0, bool positions) {
    stage_async<kBc, kD>(Ks, a.k + rows + size_t(k0) * kD, kD);
    stage_async<kBc, kD>(Vs, a.v + rows + size_t(k0) * kD, kD);
    if (positions) stage_floats_async(posK, pos, k0, kBc, a.T);
    cp_async_commit();
}

// The family a backward kernel's logit loops run for this call: KERPLE-log from its tables
// when the call's positions allow them (their entries are the values the forward computes, so
// a logit is the same number in the forward and the backward either way).
__device__ __forceinline__ int call_family(const TcArgs& a) {
    const int f = bias_family(a.bs.kind);
    return f == kKerpleLog && a.kinfo != nullptr && a.kinfo[0] != 0 ? kKerpleTable : f;
}

// One head's rows of the KERPLE-log tables and the last distance they hold.
struct KerpleRows {
    const float *lg = nullptr, *ratio = nullptr;
    int last = 0;
};
__device__ __forceinline__ KerpleRows kerple_rows(const TcArgs& a, int h) {
    KerpleRows r;
    if (a.ktab != nullptr && a.kinfo[0] != 0) {
        r.lg = a.ktab + size_t(h) * a.kcap;
        r.ratio = a.ktab + size_t(a.H + h) * a.kcap;
        r.last = a.kinfo[1] - 1;
    }
    return r;
}

// KERPLE-log's log2(1 + b d) for d = |pi - pj| and, with kRatio, d / (1 + b d) (its b-gradient
// term) into *ratio: for kKerpleTable two loads (d is an exact integer: dist + 2^23 carries it in
// its low mantissa bits, so no F2I, which issues at the MUFU's rate; any distance, a masked
// logit's too, clamps into the rows), else the fast log2 and division (MUFU).
template <int F, bool kRatio>
__device__ __forceinline__ float kerple_log2(const KerpleRows& kr, float pb, float pi, float pj,
                                             float* ratio) {
    const float dist = fabsf(pi - pj);
    if constexpr (F == kKerpleTable) {
        const int d = min(int(__float_as_uint(dist + 8388608.0f) - 0x4B000000u), kr.last);
        if constexpr (kRatio) *ratio = kr.ratio[d];
        return kr.lg[d];
    } else {
        const float u = fmaf(pb, dist, 1.0f);
        if constexpr (kRatio) *ratio = __fdividef(dist, u);
        return __log2f(u);
    }
}

// The head's bias parameters a[h], b[h] where the family has them (0 otherwise).
__device__ __forceinline__ float param_a(const BiasArgs& bs, int h) {
    return bs.kind >= kLinear && bs.kind <= kKerplePower ? bs.a[h] : 0.0f;
}
__device__ __forceinline__ float param_b(const BiasArgs& bs, int h) {
    return bs.kind == kKerpleLog || bs.kind == kKerplePower ? bs.b[h] : 0.0f;
}

// The general families (KERPLE-power, T5, Table) through one out-of-line copy of bias_value
// and of the T5 bucket: inlined into a logit loop, their 32 copies (powf, T5's bucket logs in
// double) put ~450 instructions between consecutive logits' hot instructions, so each tile
// taking that loop fetched code from across ~200 KB.
static __device__ __noinline__ float bias_value_call(BiasArgs bs, int h, float pi, float pj,
                                                     const float* trow, int j) {
    return bias_value(bs, h, pi, pj, trow, j);
}
static __device__ __noinline__ int t5_bucket_call(BiasArgs bs, float pi, float pj) {
    return t5_bucket(bs, pi, pj);
}

// Bias of logit (i, j) times log2 e (the logits are kept in base 2) for family F (pa, pb: the
// head's parameters a[h], b[h]): ALiBi is one multiply-add, KERPLE-log a fast log2 (bf16 logits
// need no more) or a table load (kr), the rest bias_value's exact arithmetic.
template <int F>
__device__ __forceinline__ float bias2_of(const BiasArgs& bs, int h, float pa, float pb, float pi,
                                          float pj, const float* trow, int j,
                                          const KerpleRows& kr) {
    if constexpr (F == kNone)
        return 0.0f;
    else if constexpr (F == kLinear)
        return (pa * kLog2e) * (pj - pi);
    else if constexpr (F == kKerpleLog || F == kKerpleTable)
        return -pa * kerple_log2<F, false>(kr, pb, pi, pj, nullptr);
    else
        return bias_value_call(bs, h, pi, pj, trow, j) * kLog2e;
}

// f(family, masked) with both as compile-time constants (std::integral_constant), so the logit
// loop of each tile is specialised; the choice is uniform over the block. Partial tiles (a few
// per row: the diagonal, window and document edges) test each logit against the mask; every
// tile evaluates its family's bias the same way, so a logit is the same number in the forward
// and both backward kernels.
//
// kGeneral false: a kernel instantiated for the inline families only (the forward's: calls to
// bias_value_call there made ptxas spill its two m-tiles' accumulators across the call ABI);
// the launch sends kOtherBias to the kernel's other instantiation, so that case runs nothing.
// kTables false: no KERPLE-log loop from the tables (the forward's: its 64 table loads a tile
// in flight made ptxas spill; the tables hold the MUFU path's values, so it computes them).
// The cases left out run nothing: the launches never send them (a __trap() there cost the
// forward 52-132 bytes of spill at head dims 64-80, ptxas sm_90).
template <bool kGeneral = true, bool kTables = true, class Fn>
__device__ __forceinline__ void with_family(int family, bool masked, Fn&& f) {
    auto run = [&](auto fam) {
        if (masked)
            f(fam, std::true_type{});
        else
            f(fam, std::false_type{});
    };
    switch (family) {
        case kNone: run(std::integral_constant<int, kNone>{}); break;
        case kLinear: run(std::integral_constant<int, kLinear>{}); break;
        case kKerpleLog: run(std::integral_constant<int, kKerpleLog>{}); break;
        case kKerpleTable:
            if constexpr (kTables)
                run(std::integral_constant<int, kKerpleTable>{});
            break;
        default:
            if constexpr (kGeneral)
                run(std::integral_constant<int, kOtherBias>{});
            break;
    }
}

// The query tile a block works on: heaviest (latest) first, so the long causal rows start early.
__device__ __forceinline__ int tile_index() { return int(gridDim.x - 1 - blockIdx.x); }

// First key tile of the query block at q0 (causal with window): the block's first query's.
__device__ __forceinline__ int first_key_tile(int q0, int window) {
    const int j_lo = window > 0 ? max(0, q0 - window + 1) : 0;
    return (j_lo / kBc) * kBc;
}

// The exponent of P = 2^(x - lse log2 e) for a base-2 logit x and its row's log-sum-exp, as one
// fused multiply-add in every backward kernel: written x - lse * kLog2e, nvcc fused it in the
// dk/dv kernel but not in the dq kernel (which hoisted the product out of its loop), so their
// P differed in the last bits on a GPU (the table gradient of the one-kernel backward, taken
// from dk/dv, is to equal the dq kernel's) while the emulation, built without contraction,
// rounded both twice.
__device__ __forceinline__ float p_exponent(float x, float lse) { return fmaf(-lse, kLog2e, x); }

// The gradient rows (the backward kernels' epilogues).

// f(dn, i, p) for each of a thread's gradient entries that is there, one at a time (the rows
// described below, when they cannot move in 8-byte pairs): accumulator x[dn][i] (i = 2 r + e)
// belongs at p of row r.
template <int DN, class F>
__device__ __forceinline__ void each_entry(float* const (&row)[2], int D, int t, F&& f) {
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int dn = 0; dn < DN; dn++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = dn * 8 + 2 * t + e;
                if (row[r] != nullptr && d < D) f(dn, 2 * r + e, row[r] + d);
            }
}

// A thread's C-fragment accumulators x (16 rows x 8 DN columns of a warp: rows g and g + 8,
// columns 8 dn + 2 t, + 1) and the gradient rows they belong to (row[r]: row g + 8 r's first
// head-dim entry, null past T; D entries each). write_grads stores scale x there, added to what
// the rows hold (GradStore::Accumulate) with every load before any store: loaded, added and
// stored an entry at a time, each load waited for the store before it (which might alias it),
// so the 64 entries of a dk / dv thread at head dim 64 were 64 round trips to memory in a row
// (SASS, sm_90), as long as the tile loop of a short causal row. With `pairs` (D even and the
// rows 8-byte aligned: dqkv is, and C = H D keeps every row so) two entries move as 8 bytes.
template <int DN>
__device__ __forceinline__ void add_old_grads(float (&x)[DN][4], float* const (&row)[2], int D,
                                              int t, bool pairs) {
    if (pairs) {
        // into an array first: added as each arrived, ptxas kept only 2-3 loads in flight
        float2 old[2][DN];
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int dn = 0; dn < DN; dn++) {
                const int d = dn * 8 + 2 * t;
                old[r][dn] = row[r] != nullptr && d < D
                                 ? *reinterpret_cast<const float2*>(row[r] + d)
                                 : make_float2(0.0f, 0.0f);
            }
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int dn = 0; dn < DN; dn++) {
                x[dn][2 * r] += old[r][dn].x;
                x[dn][2 * r + 1] += old[r][dn].y;
            }
        return;
    }
    each_entry<DN>(row, D, t, [&](int dn, int i, float* p) { x[dn][i] += *p; });
}
template <int DN>
__device__ __forceinline__ void store_grads(const float (&x)[DN][4], float* const (&row)[2], int D,
                                            int t, bool pairs) {
    if (pairs) {
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int dn = 0; dn < DN; dn++) {
                const int d = dn * 8 + 2 * t;
                if (row[r] != nullptr && d < D)
                    *reinterpret_cast<float2*>(row[r] + d) =
                        make_float2(x[dn][2 * r], x[dn][2 * r + 1]);
            }
        return;
    }
    each_entry<DN>(row, D, t, [&](int dn, int i, float* p) { *p = x[dn][i]; });
}
// rotate(x) runs between the scaling and the stores (rotate_back_rows), so that with Accumulate
// only the new terms are rotated.
struct NoRotation {
    template <class X>
    __device__ __forceinline__ void operator()(X&) const {}
};
template <int DN, class Rotate = NoRotation>
__device__ __forceinline__ void write_grads(float (&x)[DN][4], float* const (&row)[2], float scale,
                                            bool accumulate, int D, int t,
                                            Rotate&& rotate = Rotate{}) {
    // rounded before anything is added: a product contracted into an fma with the old entry
    // would differ in the last bit from the separate passes the rotary checks compare with
#pragma unroll
    for (int dn = 0; dn < DN; dn++)
#pragma unroll
        for (int i = 0; i < 4; i++) x[dn][i] = __fmul_rn(x[dn][i], scale);
    rotate(x);
    const float* any = row[0] != nullptr ? row[0] : row[1];
    const bool pairs = D % 2 == 0 && (reinterpret_cast<uintptr_t>(any) & 7u) == 0;
    if (accumulate) add_old_grads<DN>(x, row, D, t, pairs);
    store_grads<DN>(x, row, D, t, pairs);
}

// The backward kernels' epilogues. write_dq: dq = scale acc for this thread's query rows i[0],
// i[1] of head h, rotated back when the call rotates (the gradient w.r.t. q before rotary).
// write_dk_dv: dk = scale dk (rotated back likewise, with kRotation) and dv = dv for its key rows
// j[0], j[1]; T, C, D are a's, as the caller holds them (read from `a` here, where the one-kernel
// backward's epilogue reads them, ptxas spilled that kernel at D 128: 64 bytes, sm_90). Both add
// to the rows' old entries with a.accumulate.
template <int DN>
__device__ __forceinline__ void write_dq(float (&acc)[DN][4], float* dqkv, const TcArgs& a, int b,
                                         int h, const int (&i)[2], int t) {
    float* dq[2];
#pragma unroll
    for (int r = 0; r < 2; r++)
        dq[r] = i[r] < a.T ? dqkv + (size_t(b) * a.T + i[r]) * 3 * a.C + size_t(h) * a.D : nullptr;
    if (a.rot.table != nullptr) {
        write_grads<DN>(acc, dq, a.scale, a.accumulate, a.D, t,
                        [&](auto& x) { rotate_back_rows<DN>(x, a.rot, b, a.T, i, false, t); });
    } else {
        write_grads<DN>(acc, dq, a.scale, a.accumulate, a.D, t);
    }
}
template <int DN, bool kRotation = true>
__device__ __forceinline__ void write_dk_dv(float (&dk)[DN][4], float (&dv)[DN][4], float* dqkv,
                                            const TcArgs& a, int b, int h, const int (&j)[2], int t,
                                            int T, int C, int D) {
    float *dkr[2], *dvr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float* row = j[r] < T ? dqkv + (size_t(b) * T + j[r]) * 3 * C + size_t(h) * D : nullptr;
        dkr[r] = row ? row + C : nullptr;
        dvr[r] = row ? row + 2 * C : nullptr;
    }
    bool rotated = false;
    if constexpr (kRotation) {
        if (a.rot.table != nullptr) {
            write_grads<DN>(dk, dkr, a.scale, a.accumulate, D, t,
                            [&](auto& x) { rotate_back_rows<DN>(x, a.rot, b, T, j, true, t); });
            rotated = true;
        }
    }
    if (!rotated) write_grads<DN>(dk, dkr, a.scale, a.accumulate, D, t);
    write_grads<DN>(dv, dvr, 1.0f, a.accumulate, D, t);
}

// The forward's online softmax after a key tile's logits, for a thread's R rows (rows g and g + 8
// of each of its m-tiles). softmax_row_max: each row's max over the tile (mx: this thread's,
// reduced here over the 4 threads of the row) joins the running max m_run; ms is the max the
// tile's probabilities are taken against (0 for a row with nothing visible yet) and corr the
// factor that rescales what the row has gathered so far.
template <int R>
__device__ __forceinline__ void softmax_row_max(float (&mx)[R], float (&m_run)[R], float (&ms)[R],
                                                float (&corr)[R]) {
#pragma unroll
    for (int rr = 0; rr < R; rr++) {
        mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(kFullMask, mx[rr], 1));
        mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(kFullMask, mx[rr], 2));
        const float mn = fmaxf(m_run[rr], mx[rr]);
        ms[rr] = mn == -INFINITY ? 0.0f : mn;
        corr[rr] = exp2_ftz(m_run[rr] - ms[rr]);
        m_run[rr] = mn;
    }
}
// P = 2^(s - ms) of one m-tile's C fragments s(n, e) (NT 8-column tiles, rows g and g + 8 against
// ms[0], ms[1]) as the bf16 A fragments of O += P V (the C fragments of tiles 2 kc and 2 kc + 1
// are k step kc's A fragment), summed in fp32 before rounding into sum[0], sum[1].
template <int NT, class S>
__device__ __forceinline__ void probabilities(S&& s, const float* ms, float* sum,
                                              uint32_t (&pf)[NT / 2][4]) {
#pragma unroll
    for (int n = 0; n < NT; n++) {
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            p[e] = exp2_ftz(s(n, e) - ms[e >> 1]);
            sum[e >> 1] += p[e];
        }
        pf[n / 2][2 * (n & 1)] = pack_bf16(p[0], p[1]);
        pf[n / 2][2 * (n & 1) + 1] = pack_bf16(p[2], p[3]);
    }
}
// Each row's tile sum (this thread's, reduced here over the 4 threads of the row) into the
// running sum l, after rescaling it by corr.
template <int R>
__device__ __forceinline__ void softmax_row_sum(float (&sum)[R], float (&l)[R],
                                                const float (&corr)[R]) {
#pragma unroll
    for (int rr = 0; rr < R; rr++) {
        sum[rr] += __shfl_xor_sync(kFullMask, sum[rr], 1);
        sum[rr] += __shfl_xor_sync(kFullMask, sum[rr], 2);
        l[rr] = l[rr] * corr[rr] + sum[rr];
    }
}

// The forward's last step for query row i of head h: its output, o(dn, e) / l for this thread's
// head-dim entries dn * 8 + 2 t + e (C-fragment columns), to out (fp32) or a.out16 (rounded as it
// is written: bf16 activation storage), and (thread t 0) its log-sum-exp from the running max
// and sum of the base-2 softmax.
template <int DN, class O>
__device__ __forceinline__ void write_forward_row(const TcArgs& a, float* out, float* lse, int b,
                                                  int h, int i, int t, float m_run, float l,
                                                  O&& o) {
    const float inv = 1.0f / l;
    const size_t row = (size_t(b) * a.T + i) * a.C + size_t(h) * a.D;
    if (a.out16 != nullptr) {
        uint16_t* dst = a.out16 + row;
#pragma unroll
        for (int dn = 0; dn < DN; dn++) {
            const int d = dn * 8 + 2 * t;
            if (d < a.D) dst[d] = uint16_t(bf16_bits(o(dn, 0) * inv));
            if (d + 1 < a.D) dst[d + 1] = uint16_t(bf16_bits(o(dn, 1) * inv));
        }
    } else {
        float* dst = out + row;
#pragma unroll
        for (int dn = 0; dn < DN; dn++) {
            const int d = dn * 8 + 2 * t;
            if (d < a.D) dst[d] = o(dn, 0) * inv;
            if (d + 1 < a.D) dst[d + 1] = o(dn, 1) * inv;
        }
    }
    if (t == 0) lse[(size_t(b) * a.H + h) * a.T + i] = (m_run + log2f(l)) * kLn2;
}

// Positions are read only by the families of a position-dependent bias.
__device__ __forceinline__ bool needs_positions(int kind) { return kind != kNone && kind != kTable; }

// ================================================================ host side (cuda_flash_tc.cu)

int tc_head_dim(int D);  // the kernel's head dim (32, 64, 80, 128) for D
int padded_T(int T);     // T rounded up to whole forward query blocks (whole key tiles)
// rows (B, H, Tp, kD) bf16 of src's heads at col0 (src (B, T, ld)), zero-padded; with parts > 1
// also the next parts - 1 blocks of H D columns into the next operands of rows (each B H Tp kD
// elements on from the last): q, k, v of qkv rows in one launch, q and k rotated by rot's
// table if it has one.
cudaError_t pack(uint16_t* rows, const float* src, int ld, int col0, int B, int T, int H, int D,
                 cudaStream_t s, int parts = 1, const RotationTable& rot = RotationTable{});
TcArgs make_args(const float* positions, int T, int C, int H, KeyMask mask, const BiasArgs& bias);
// The kernels on wgmma (cuda_flash_wg_sm90a.cu; compute capability 9.0 only) for packed operands
// of head dim kD 64 or 128 and the inline bias families (wgmma_applies), in blocks of `warpgroups`
// (1 or 2) warpgroups of 64 queries (forward, dq) or keys (dk / dv) that share the block's other
// tiles. Each writes (or adds to, with a.accumulate) what the mma.sync kernel it replaces does:
// the forward out and lse; the dq kernel dqkv's dq columns and, given partials, the
// bias-parameter gradients' per-chunk sums; the dk / dv kernel its dk and dv columns, rotated
// back with a.rot.
cudaError_t launch_flash_wg_forward(float* out, float* lse, const TcArgs& a, int B, int kD,
                                    int warpgroups, cudaStream_t s);
cudaError_t launch_flash_wg_dq(float* dqkv, float* partials, const float* lse, const float* dvec,
                               const TcArgs& a, int B, int kD, int warpgroups, cudaStream_t s);
cudaError_t launch_flash_wg_dkv(float* dqkv, const float* lse, const float* dvec, const TcArgs& a,
                                int B, int kD, int warpgroups, cudaStream_t s);
// The one-kernel backward on wgmma (CTX_FLASH_BACKWARD=atomic with CTX_FLASH_DKV=wgmma): the dk /
// dv kernel adding dq's terms by fp32 atomics (dqkv's dq columns zeroed or accumulated onto by
// the caller), head dims 64 and 128, no bias-parameter gradients (no partials).
cudaError_t launch_flash_wg_backward_atomic(float* dqkv, const float* lse, const float* dvec,
                                            const TcArgs& a, int B, int kD, int warpgroups,
                                            cudaStream_t s);
// Its form with a producer warpgroup (cuda_flash_wg_producer_sm90a.cu, by cp.async), the same
// dk, dv bits and dq's terms.
cudaError_t launch_flash_wg_backward_atomic_producer(float* dqkv, const float* lse,
                                                     const float* dvec, const TcArgs& a, int B,
                                                     int kD, int warpgroups, cudaStream_t s);
// The three with a producer warpgroup and named barriers (cuda_flash_wg_producer_sm90a.cu): the
// same bits as launch_flash_wg_forward / _dq / _dkv. tma: the tiles by TMA into 128-byte
// swizzled tiles, each stage signalled by an mbarrier (CTX_FLASH_WGMMA_LOADS=tma); else cp.async.
cudaError_t launch_flash_wg_forward_producer(float* out, float* lse, const TcArgs& a, int B, int kD,
                                             int warpgroups, bool tma, cudaStream_t s);
cudaError_t launch_flash_wg_dq_producer(float* dqkv, float* partials, const float* lse,
                                        const float* dvec, const TcArgs& a, int B, int kD,
                                        int warpgroups, bool tma, cudaStream_t s);
cudaError_t launch_flash_wg_dkv_producer(float* dqkv, const float* lse, const float* dvec,
                                         const TcArgs& a, int B, int kD, int warpgroups, bool tma,
                                         cudaStream_t s);
bool wgmma_device();  // the current GPU runs sm_90a code (compute capability 9.0)
// Whether the wgmma kernels serve a call of kernel head dim kD: 64 or 128, an inline bias family,
// a wgmma_device.
bool wgmma_applies(const TcArgs& a, int kD);
// KERPLE-log's backward only: decides on the device whether this call's B x T positions allow
// the tables and fills them from the bias's b, in `space` (kerple_space_elems bf16 elements past
// the packed operands, 16-byte aligned); sets a.ktab, a.kinfo, a.kcap. No host synchronisation.
size_t kerple_space_elems(int H);
cudaError_t launch_kerple_tables(TcArgs& a, uint16_t* space, int B, cudaStream_t s);

}  // namespace ctx::cuda::tc
