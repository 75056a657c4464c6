// CUDA backend kernels: the backward pass of the tensor-core flash attention, the dq kernel and
// the dk / dv kernel (cuda_flash_tc.cu describes both, the operand packing and the tiles;
// cuda_flash_tc.cuh holds what they share with the forward kernel).
#include "backend/cuda/cuda_flash_tc.cuh"

#include <algorithm>

namespace ctx::cuda::tc {

// The terms d logit / d a and d logit / d b of the Linear and KERPLE families times v (as
// cuda_flash.cu), which the caller subtracts from its sums. Not inlined: it serves the general
// logit loop only (the families' own loops below have theirs in line), and 32 inlined copies
// of the switch, the logs and the powers per loop made the dq kernel's code several times the
// size of its hot path.
struct BiasParamTerms {
    float a, b;
};
__device__ __noinline__ BiasParamTerms bias_param_terms(int kind, float v, float pi, float pj,
                                                        float pa, float pb) {
    switch (kind) {
        case kLinear:
            return BiasParamTerms{v * (pi - pj), 0.0f};
        case kKerpleLog: {
            const float dd = fabsf(pi - pj), u = 1.0f + pb * dd;
            return BiasParamTerms{v * logf(u), v * pa * dd / u};
        }
        case kKerplePower: {
            const float dd = fabsf(pi - pj);
            if (dd > 0.0f) {
                const float pw = powf(dd, pb);
                return BiasParamTerms{v * pw, v * pa * pw * logf(dd)};
            }
            return BiasParamTerms{0.0f, 0.0f};
        }
        default:
            return BiasParamTerms{0.0f, 0.0f};
    }
}

// dtable[offset(n, e)] += x[n][e] for a thread's C-fragment values of a tile where bit 4 n + e of
// `in` is set (the pair attends: the logit loop's mask test), the old entries of kGroup column
// tiles loaded before any of them is stored (see add_old_grads: added in the logit loop, the
// 32 entries of a dq tile were 32 round trips in a row). The dk/dv kernel at D 128 takes one
// tile at a time: a whole tile's 16 at once made ptxas spill its staging pointers.
template <int NT, int kGroup, class Offset>
__device__ __forceinline__ void add_tile_to_table(float* dtable, const float (&x)[NT][4],
                                                  uint32_t in, Offset&& offset) {
    static_assert(NT * 4 <= 32 && NT % kGroup == 0, "one bit a value, whole groups");
#pragma unroll
    for (int n0 = 0; n0 < NT; n0 += kGroup) {
        float old[kGroup][4];
#pragma unroll
        for (int n = 0; n < kGroup; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                old[n][e] = (in >> (4 * (n0 + n) + e)) & 1u ? dtable[offset(n0 + n, e)] : 0.0f;
#pragma unroll
        for (int n = 0; n < kGroup; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if ((in >> (4 * (n0 + n) + e)) & 1u)
                    dtable[offset(n0 + n, e)] = old[n][e] + x[n0 + n][e];
    }
}

// ================================================================ dq

// The per-logit output of a dq logit loop: none, the Table bias's gradient, T5's staging.
inline constexpr int kOutNone = 0, kOutTable = 1, kOutT5 = 2;

template <int kD>
__global__ void __launch_bounds__(kThreads, 2)
    flash_tc_dq_kernel(float* dqkv, float* partials, float* dtable, const float* lse,
                       const float* dvec, TcArgs a) {
    // Qs, dOs (kBr, LS) | two stages of [Ks, Vs (kBc, LS) | posK (kBc floats)] |
    // T5: Sd, Bk (kBr, kSP)
    extern __shared__ float sm[];
    __shared__ double red[32];
    constexpr int LS = kD + kPad, KS = kD / 16, DN = kD / 8, NT = kBc / 8;
    constexpr int kStage = 2 * kBc * LS + 2 * kBc;  // bf16 elements
    uint16_t* Qs = reinterpret_cast<uint16_t*>(sm);
    uint16_t* dOs = Qs + kBr * LS;
    auto Ks = [&](int st) { return dOs + kBr * LS + st * kStage; };
    auto Vs = [&](int st) { return Ks(st) + kBc * LS; };
    auto posK = [&](int st) { return reinterpret_cast<float*>(Vs(st) + kBc * LS); };
    float* Sd = reinterpret_cast<float*>(Ks(2));
    int* Bk = reinterpret_cast<int*>(Sd + kBr * kSP);
    const int T = a.T, H = a.H, kind = a.bs.kind, family = call_family(a);
    const int tile = tile_index(), q0 = tile * kBr, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t bh = size_t(b) * H + h, rows = bh * a.Tp * kD;
    const float* pos = a.pos + size_t(b) * T;
    const bool positions = needs_positions(kind);
    const int k_first = first_key_tile(q0, a.window), j_last = min(T - 1, q0 + kBr - 1);
    const int n_tiles = (j_last - k_first) / kBc + 1;
    stage_async<kBr, kD>(Qs, a.q + rows + size_t(q0) * kD, kD);
    stage_async<kBr, kD>(dOs, a.g + rows + size_t(q0) * kD, kD);
    auto load = [&](int it) {
        const int st = it & 1;
        stage_key_tile<kD>(Ks(st), Vs(st), posK(st), a, rows, pos, k_first + it * kBc, positions);
    };
    load(0);  // Q and dO travel in the first group

    const int wr = warp * 16, w0 = q0 + wr, w1 = w0 + 15;
    int i[2], lo[2], hi[2];
    float pi[2], lse_r[2], d_r[2];
    const float* trow[2];
    size_t row[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        i[r] = w0 + g + 8 * r;
        row[r] = bh * T + i[r];
        const bool real = i[r] < T;
        lo[r] = real ? row_lo(a, b, i[r]) : 1;
        hi[r] = real ? i[r] : 0;
        pi[r] = real && positions ? pos[i[r]] : 0.0f;
        lse_r[r] = real ? lse[row[r]] : 0.0f;
        d_r[r] = real ? dvec[row[r]] : 0.0f;
        trow[r] = table_row(a, b, h, i[r]);
    }
    const bool grads = partials != nullptr;
    const bool t5 = grads && kind == kT5;
    const float pa = param_a(a.bs, h), pb = param_b(a.bs, h), scale2 = a.scale * kLog2e;
    double ga = 0.0, gb = 0.0;
    double gt[4] = {0.0, 0.0, 0.0, 0.0};  // T5: buckets tid + kThreads u
    float acc[DN][4];
#pragma unroll
    for (int dn = 0; dn < DN; dn++) acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;

    // The warp's Q and dO rows are the A operands of every tile's S and dP: up to head dim 64
    // their fragments stay in registers (56 ldmatrix a tile become 48; no spill, ptxas -v).
    constexpr bool kQdORegs = kD <= 64;
    uint32_t qf[kQdORegs ? KS : 1][4], gf[kQdORegs ? KS : 1][4];

    for (int it = 0; it < n_tiles; it++) {
        const int k0 = k_first + it * kBc, st = it & 1;
        await_tile(it, n_tiles, load);
        if constexpr (kQdORegs) {
            if (it == 0) {  // Q and dO arrived with the first group
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    ldsm_block<false>(qf[kk], Qs, LS, wr, kk * 16, lane);
                    ldsm_block<false>(gf[kk], dOs, LS, wr, kk * 16, lane);
                }
            }
        }
        const TileCover cv = cover(a, b, w0, w1, k0, k0 + kBc - 1);
        if (cv == kSkip) {
            if (t5)  // the bucket scan below reads every row of the tile
                for (int e = lane; e < 16 * kBc; e += 32) Bk[(wr + e / kBc) * kSP + e % kBc] = -1;
        } else {
            float s[NT][4], dp[NT][4];
            if constexpr (kQdORegs) {
                product_nt<KS, NT>(s, qf, Ks(st), LS, lane);
                product_nt<KS, NT>(dp, gf, Vs(st), LS, lane);
            } else {
                tile_pair<KS, NT>(s, dp, Qs, dOs, wr, Ks(st), Vs(st), LS, lane);
            }
            const float* pk = posK(st);
            // s becomes dS = P (dP - D_i), 0 outside the mask. kParamGrads: the a, b gradients
            // are summed; kOut: the per-logit output (the table gradient, or T5's staging for
            // its bucket sums). One loop per family, mask and output keeps a tile's hot
            // instructions together: one loop with every option tested per logit made the
            // kernel 107k SASS instructions, ~650 between consecutive logits' exp2.
            auto logits = [&](auto fam, auto masked, auto param_grads, auto out) {
                constexpr int F = decltype(fam)::value;
                constexpr bool kMasked = decltype(masked)::value;
                constexpr bool kParamGrads = decltype(param_grads)::value;
                constexpr int kOut = decltype(out)::value;
                constexpr bool kKerple = F == kKerpleLog || F == kKerpleTable;
                const KerpleRows kr = F == kKerpleTable ? kerple_rows(a, h) : KerpleRows{};
                float fa = 0.0f, fb = 0.0f;  // this tile's share of the a, b gradients
                uint32_t attends = 0;        // kOutTable: bit 4 n + e
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = e >> 1, c = n * 8 + 2 * t + (e & 1), j = k0 + c;
                        const bool in = !kMasked || (j >= lo[r] && j <= hi[r]);
                        if constexpr (kOut == kOutTable) attends |= uint32_t(in) << (4 * n + e);
                        const float pj = F == kNone ? 0.0f
                                         : F == kOtherBias ? (positions ? pk[c] : 0.0f)
                                                           : pk[c];
                        float v = 0.0f;
                        if (in) {
                            if constexpr (kKerple) {
                                // the log the bias needs is the one its a-gradient needs
                                float ratio = 0.0f;
                                const float lg =
                                    kerple_log2<F, kParamGrads>(kr, pb, pi[r], pj, &ratio);
                                v = exp2_ftz(
                                        p_exponent(fmaf(s[n][e], scale2, -pa * lg), lse_r[r])) *
                                    (dp[n][e] - d_r[r]);
                                if constexpr (kParamGrads) {
                                    fa -= v * lg * kLn2;
                                    fb -= v * pa * ratio;
                                }
                            } else {
                                const float x =
                                    fmaf(s[n][e], scale2,
                                         bias2_of<F>(a.bs, h, pa, pb, pi[r], pj, trow[r], j, kr));
                                v = exp2_ftz(p_exponent(x, lse_r[r])) * (dp[n][e] - d_r[r]);
                                if constexpr (kParamGrads && F == kLinear) {
                                    fa -= v * (pi[r] - pj);
                                } else if constexpr (kParamGrads) {  // KERPLE-power
                                    const BiasParamTerms d =
                                        bias_param_terms(kind, v, pi[r], pj, pa, pb);
                                    ga -= double(d.a);
                                    gb -= double(d.b);
                                }
                            }
                        }
                        if constexpr (kOut == kOutT5) {
                            Sd[(wr + g + 8 * r) * kSP + c] = v;
                            Bk[(wr + g + 8 * r) * kSP + c] =
                                in ? t5_bucket_call(a.bs, pi[r], pj) : -1;
                        }
                        s[n][e] = v;
                    }
                if constexpr (kOut == kOutTable)  // d logit / d table = 1
                    add_tile_to_table<NT, NT>(dtable, s, attends, [&](int n, int e) {
                        return row[e >> 1] * T + k0 + n * 8 + 2 * t + (e & 1);
                    });
                ga += double(fa);
                gb += double(fb);
            };
            // Every option is a compile-time constant of the loop, so none is tested per logit
            // (and the compiler has no runtime condition to unswitch the unrolled loop on).
            using Yes = std::true_type;
            using No = std::false_type;
            using Other = std::integral_constant<int, kOtherBias>;
            if (t5)
                logits(Other{}, Yes{}, No{}, std::integral_constant<int, kOutT5>{});
            else if (dtable != nullptr)
                logits(Other{}, Yes{}, No{}, std::integral_constant<int, kOutTable>{});
            else
                with_family(family, cv == kPartial, [&](auto fam, auto masked) {
                    using Plain = std::integral_constant<int, kOutNone>;
                    if constexpr (decltype(fam)::value == kNone)
                        logits(fam, masked, No{}, Plain{});
                    else if (grads)
                        logits(fam, masked, Yes{}, Plain{});
                    else
                        logits(fam, masked, No{}, Plain{});
                });
            product_from_c<kBc / 16, DN>(acc, s, Ks(st), LS, lane);
        }
        if (t5) {
            __syncthreads();  // Sd, Bk complete
            t5_tile_grad(gt, Bk, Sd, kBr, kBc, kSP, tid, kThreads);
        }
        __syncthreads();  // stage st (and Sd, Bk) are refilled by the next iteration
    }
    write_dq<DN>(acc, dqkv, a, b, h, i, t);  // dq = scale acc (+ dq accumulating)
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

// ================================================================ dk, dv (and dq by atomics)

// The dq part of a key block's query tile in the one-kernel backward: dq[q0 + m, :] +=
// scale * dS (kBq x kBc, staged in dSs as dS^T: row key, column query) K (kBc x kD), with fp32
// atomic adds. Warp w takes the 16 queries (w & 1) of the tile and every other pair of 8-column
// tiles of the head dim from (w >> 1): 8 accumulators at a time, so the dk / dv accumulators
// keep their registers.
template <int kD>
__device__ __forceinline__ void dq_atomic_tile(float* dqkv, const uint16_t* dSs,
                                               const uint16_t* Ks, const TcArgs& a, int b, int q0,
                                               int warp, int lane) {
    constexpr int LS = kD + kPad, LQ = kBq + kPad, DN = kD / 8;
    static_assert(DN % 2 == 0 && kBq == 32, "two 16-query halves, 8-column tiles in pairs");
    const int m0 = (warp & 1) * 16, g = lane >> 2, t = lane & 3, h = blockIdx.y;
    const bool quad = dq_quad_atomics(a);
#pragma unroll
    for (int dn2 = warp >> 1; dn2 < DN / 2; dn2 += 2) {
        float x[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int kc = 0; kc < kBc / 16; kc++) {
            // dS^T stored k-major (row key): ldmatrix.trans gives A blocks (m, k), (m, k + 8),
            // (m + 8, k), (m + 8, k + 8); the A fragment wants them as (m, k), (m + 8, k), ...
            uint32_t f[4], bf[4];
            ldsm_block<true>(f, dSs, LQ, kc * 16, m0, lane);
            const uint32_t af[4] = {f[0], f[2], f[1], f[3]};
            ldsm_block<true>(bf, Ks, LS, kc * 16, dn2 * 16, lane);
            const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
            mma_bf16_16816(x[0], af, b0);
            mma_bf16_16816(x[1], af, b1);
        }
        if (quad) {  // sm_90: four columns an atomic, each lane its own row g + 8 (t & 1)
            const int i = q0 + m0 + g + 8 * (t & 1);
            float* row =
                i < a.T ? dqkv + (size_t(b) * a.T + i) * 3 * a.C + size_t(h) * a.D : nullptr;
#pragma unroll
            for (int nn = 0; nn < 2; nn++) {
                const int d0 = dn2 * 16 + nn * 8;
                const float c[4] = {x[nn][0] * a.scale, x[nn][1] * a.scale, x[nn][2] * a.scale,
                                    x[nn][3] * a.scale};
                atomic_add_c_quads(c, row != nullptr ? row + d0 : nullptr, a.D - d0, t);
            }
            continue;
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = q0 + m0 + g + 8 * (e >> 1);
            if (i >= a.T) continue;
            float* dq = dqkv + (size_t(b) * a.T + i) * 3 * a.C + size_t(h) * a.D;
#pragma unroll
            for (int nn = 0; nn < 2; nn++) {
                const int d = dn2 * 16 + nn * 8 + 2 * t + (e & 1);
                if (d < a.D) atomicAdd(dq + d, x[nn][e] * a.scale);
            }
        }
    }
}

// kDq false: dk and dv only (the dq kernel runs too). kDq true: the one-kernel backward of
// FlashAttention-2 (5 products per tile instead of the two kernels' 7): dq by fp32 atomics
// (dqkv's dq columns zeroed beforehand under GradStore::Overwrite), and the dq kernel's other
// outputs here: the bias-parameter partials (one per 64-key block, in the two 32-row slots of
// the same layout) and dtable. Not for T5's gradients (their bucket scan is per query tile).
template <int kD, bool kDq>
__global__ void __launch_bounds__(kThreads, 2)
    flash_tc_dkv_kernel(float* dqkv, float* partials, float* dtable, const float* lse,
                        const float* dvec, TcArgs a) {
    // Ks, Vs (kBc, LS) | two stages of [Qs, dOs (kBq, LS) | posQ, lseQ, dQ (kBq floats)] |
    // kDq: dSs (kBc, kBq + kPad) bf16
    extern __shared__ float sm[];
    constexpr int LS = kD + kPad, KS = kD / 16, DN = kD / 8, NT = kBq / 8, LQ = kBq + kPad;
    constexpr int kStage = 2 * kBq * LS + 2 * 3 * kBq;  // bf16 elements
    uint16_t* Ks = reinterpret_cast<uint16_t*>(sm);
    uint16_t* Vs = Ks + kBc * LS;
    auto Qs = [&](int st) { return Vs + kBc * LS + st * kStage; };
    auto dOs = [&](int st) { return Qs(st) + kBq * LS; };
    auto posQ = [&](int st) { return reinterpret_cast<float*>(dOs(st) + kBq * LS); };
    auto lseQ = [&](int st) { return posQ(st) + kBq; };
    auto dQ = [&](int st) { return lseQ(st) + kBq; };
    uint16_t* dSs = Qs(2);
    // KERPLE-log from its tables saves the split form a MUFU lg2 a logit; at head dim 128 the
    // products outweigh the MUFU and the table loop made ptxas spill.
    constexpr bool kTables = kDq || kD <= 80;
    const int T = a.T, C = a.C, D = a.D, H = a.H, kind = a.bs.kind;
    const int family = kTables ? call_family(a) : bias_family(kind);
    // the earliest keys first: they meet the most queries (the reverse of the query kernels)
    const int k0 = blockIdx.x * kBc, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t bh = size_t(b) * H + h, rows = bh * a.Tp * kD;
    const float* pos = a.pos + size_t(b) * T;
    const bool positions = needs_positions(kind);
    auto load = [&](int it) {
        const int q0 = k0 + it * kBq, st = it & 1;
        stage_async<kBq, kD>(Qs(st), a.q + rows + size_t(q0) * kD, kD);
        stage_async<kBq, kD>(dOs(st), a.g + rows + size_t(q0) * kD, kD);
        if (positions) stage_floats_async(posQ(st), pos, q0, kBq, T);
        stage_floats_async(lseQ(st), lse + bh * T, q0, kBq, T);
        stage_floats_async(dQ(st), dvec + bh * T, q0, kBq, T);
        cp_async_commit();
    };
    // queries before k0 see none of these keys, nor those past the last key's window
    const int j_last = min(T - 1, k0 + kBc - 1);
    const int i_last = a.window > 0 ? min(T - 1, j_last + a.window - 1) : T - 1;
    const int n_tiles = (i_last - k0) / kBq + 1;
    stage_async<kBc, kD>(Ks, a.k + rows + size_t(k0) * kD, kD);
    stage_async<kBc, kD>(Vs, a.v + rows + size_t(k0) * kD, kD);
    load(0);  // K and V travel in the first group

    const int wk = warp * 16, w0 = k0 + wk, w1 = w0 + 15;  // this warp's keys
    const int j[2] = {w0 + g, w0 + g + 8};                  // this thread's keys
    float pj[2];
#pragma unroll
    for (int r = 0; r < 2; r++) pj[r] = j[r] < T && positions ? pos[j[r]] : 0.0f;
    const float pa = param_a(a.bs, h), pb = param_b(a.bs, h), scale2 = a.scale * kLog2e;
    const bool grads = kDq && partials != nullptr;  // (not T5: the launch keeps it split)
    // each thread's running a, b gradient sums in double, in shared memory: in registers they
    // made the D = 128 kernel spill
    __shared__ double gsum[2][kDq ? kThreads : 1];
    if (grads) gsum[0][tid] = gsum[1][tid] = 0.0;
    float dk[DN][4], dv[DN][4];
#pragma unroll
    for (int dn = 0; dn < DN; dn++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[dn][e] = dv[dn][e] = 0.0f;
    // The warp's K and V rows are the A operands of every tile's two products: up to head dim
    // 64 their fragments (2 KS x 4 registers) stay in registers, a third of the tile's ldmatrix
    // reads fewer; past it the accumulators leave no room and they are read per k step.
    constexpr bool kKVRegs = kD <= 64;
    uint32_t kf[kKVRegs ? KS : 1][4], vf[kKVRegs ? KS : 1][4];

    for (int it = 0; it < n_tiles; it++) {
        const int q0 = k0 + it * kBq, st = it & 1;
        await_tile(it, n_tiles, load);
        if constexpr (kKVRegs) {
            if (it == 0) {  // K and V arrived with the first group
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    ldsm_block<false>(kf[kk], Ks, LS, wk, kk * 16, lane);
                    ldsm_block<false>(vf[kk], Vs, LS, wk, kk * 16, lane);
                }
            }
        }
        // queries [q0, q0 + kBq) are the rows of the mask test, this warp's keys its columns
        const TileCover cv = cover(a, b, q0, q0 + kBq - 1, w0, w1);
        if (cv != kSkip) {
            float s[NT][4], dp[NT][4];
            if constexpr (kKVRegs) {
                product_nt<KS, NT>(s, kf, Qs(st), LS, lane);
                product_nt<KS, NT>(dp, vf, dOs(st), LS, lane);
            } else {
                tile_pair<KS, NT>(s, dp, Ks, Vs, wk, Qs(st), dOs(st), LS, lane);
            }
            const float *pq = posQ(st), *lq = lseQ(st), *dd = dQ(st);
            // s becomes P^T, dp becomes dS^T (row: key, column: query). kDq adds the dq
            // kernel's per-logit outputs: the a, b gradients (kParamGrads), dtable (kTable).
            auto logits = [&](auto fam, auto masked, auto param_grads, auto table) {
                constexpr int F = decltype(fam)::value;
                constexpr bool kMasked = decltype(masked)::value;
                constexpr bool kParamGrads = decltype(param_grads)::value;
                constexpr bool kTable = decltype(table)::value;
                constexpr bool kKerple = F == kKerpleLog || F == kKerpleTable;
                const KerpleRows kr = F == kKerpleTable ? kerple_rows(a, h) : KerpleRows{};
                float fa = 0.0f, fb = 0.0f;  // this tile's share of the a, b gradients
                uint32_t attends = 0;        // kTable: bit 4 n + e
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = e >> 1, c = n * 8 + 2 * t + (e & 1), i = q0 + c;
                        float p = 0.0f, ds = 0.0f;
                        if (!kMasked || in_mask(a, b, i, j[r])) {
                            if constexpr (kTable) attends |= 1u << (4 * n + e);
                            const float pi = F != kNone && positions ? pq[c] : 0.0f;
                            if constexpr (kKerple && kParamGrads) {
                                // the log the bias needs is the one its a-gradient needs
                                float ratio = 0.0f;
                                const float lg = kerple_log2<F, true>(kr, pb, pi, pj[r], &ratio);
                                p = exp2_ftz(p_exponent(fmaf(s[n][e], scale2, -pa * lg), lq[c]));
                                ds = p * (dp[n][e] - dd[c]);
                                fa -= ds * lg * kLn2;
                                fb -= ds * pa * ratio;
                            } else {
                                const float* trow =
                                    F == kOtherBias ? table_row(a, b, h, i) : nullptr;
                                const float x = fmaf(s[n][e], scale2,
                                                     bias2_of<F>(a.bs, h, pa, pb, pi, pj[r],
                                                                 trow, j[r], kr));
                                p = exp2_ftz(p_exponent(x, lq[c]));
                                ds = p * (dp[n][e] - dd[c]);
                                if constexpr (kParamGrads && F == kLinear) {
                                    fa -= ds * (pi - pj[r]);
                                } else if constexpr (kParamGrads) {  // KERPLE-power
                                    const BiasParamTerms d =
                                        bias_param_terms(kind, ds, pi, pj[r], pa, pb);
                                    fa -= d.a;
                                    fb -= d.b;
                                }
                            }
                        }
                        s[n][e] = p;
                        dp[n][e] = ds;
                    }
                if constexpr (kTable)  // dS^T: row key j[r], column query q0 + c
                    add_tile_to_table<NT, 1>(dtable, dp, attends, [&](int n, int e) {
                        return (bh * T + q0 + n * 8 + 2 * t + (e & 1)) * T + j[e >> 1];
                    });
                if constexpr (kParamGrads) {
                    gsum[0][tid] += double(fa);
                    gsum[1][tid] += double(fb);
                }
            };
            using Yes = std::true_type;
            using No = std::false_type;
            auto by_family = [&] {
                with_family<true, kTables>(family, cv == kPartial, [&](auto fam, auto masked) {
                    if constexpr (kDq && decltype(fam)::value != kNone) {
                        if (grads)
                            logits(fam, masked, Yes{}, No{});
                        else
                            logits(fam, masked, No{}, No{});
                    } else {
                        logits(fam, masked, No{}, No{});
                    }
                });
            };
            if constexpr (kDq) {
                if (dtable != nullptr)
                    logits(std::integral_constant<int, kOtherBias>{}, Yes{}, No{}, Yes{});
                else
                    by_family();
            } else {
                by_family();
            }
            product_from_c<kBq / 16, DN>(dv, s, dOs(st), LS, lane);
            product_from_c<kBq / 16, DN>(dk, dp, Qs(st), LS, lane);
            if constexpr (kDq) {  // this warp's rows of dS^T, for the block's dq product
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int r = 0; r < 2; r++)
                        *reinterpret_cast<uint32_t*>(dSs + (wk + g + 8 * r) * LQ + n * 8 + 2 * t) =
                            pack_bf16(dp[n][2 * r], dp[n][2 * r + 1]);
            }
        } else if constexpr (kDq) {
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int r = 0; r < 2; r++)
                    *reinterpret_cast<uint32_t*>(dSs + (wk + g + 8 * r) * LQ + n * 8 + 2 * t) = 0u;
        }
        if constexpr (kDq) {
            // uniform over the block: whether any of its keys meets a query of the tile
            if (cover(a, b, q0, q0 + kBq - 1, k0, k0 + kBc - 1) != kSkip) {
                __syncthreads();  // dSs complete
                dq_atomic_tile<kD>(dqkv, dSs, Ks, a, b, q0, warp, lane);
            }
        }
        __syncthreads();  // stage st (and dSs) are refilled by the next iteration
    }
    // dk = scale dk, dv = dv (+ the old entries accumulating); dk rotated back by the Split
    // kernels only (the one-kernel backward is not given a rotation)
    write_dk_dv<DN, !kDq>(dk, dv, dqkv, a, b, h, j, t, T, C, D);
    if (grads) {  // as the dq kernel: this block's partial in the first of its two slots
        __shared__ double red[32];
        const int chunks = (T + kBiasGradRows - 1) / kBiasGradRows;
        float* slot = partials + (bh * chunks + 2 * blockIdx.x) * kMaxT5Buckets;
        float* next = 2 * int(blockIdx.x) + 1 < chunks ? slot + kMaxT5Buckets : nullptr;
        const double ga = block_sum(gsum[0][tid], red);
        const double gb = block_sum(gsum[1][tid], red);
        if (tid == 0) {
            slot[0] = float(ga);
            slot[1] = float(gb);
            if (next) next[0] = next[1] = 0.0f;
        }
    }
}

// ================================================================ launch

// Dynamic shared memory (bytes) of the kernels for head dim kD.
size_t dq_smem(int kD, bool t5) {
    const size_t LS = size_t(kD) + kPad;
    const size_t base = (size_t(2 * kBr) * LS + 2 * size_t(2 * kBc) * LS) * 2 + 2 * kBc * 4;
    return base + (t5 ? size_t(2) * kBr * kSP * 4 : 0);
}
size_t dkv_smem(int kD, bool dq) {
    const size_t LS = size_t(kD) + kPad;
    return (size_t(2 * kBc) * LS + 2 * size_t(2 * kBq) * LS) * 2 + 2 * 3 * kBq * 4 +
           (dq ? size_t(kBc) * (kBq + kPad) * 2 : 0);
}

template <int kD>
cudaError_t backward_t(float* dqkv, float* partials, float* dtable, const float* lse,
                       const float* dvec, const TcArgs& a, int B, bool atomic_dq, cudaStream_t s,
                       const FlashTcKernels& kernels) {
    const dim3 grid_k((a.T + kBc - 1) / kBc, a.H, B);
    if (atomic_dq) {
        // on wgmma where it serves: head dim 64 or 128, an inline family, no bias-parameter
        // gradients
        if (kernels.wgmma_dkv && partials == nullptr && wgmma_applies(a, kD))
            return kernels.wgmma_producer
                       ? launch_flash_wg_backward_atomic_producer(dqkv, lse, dvec, a, B, kD,
                                                                  kernels.wgmma_warpgroups, s)
                       : launch_flash_wg_backward_atomic(dqkv, lse, dvec, a, B, kD,
                                                         kernels.wgmma_warpgroups, s);
        auto* kernel = &flash_tc_dkv_kernel<kD, true>;
        static DynamicSharedLimit limit;
        if (const cudaError_t e = limit.raise(kernel, dkv_smem(kD, true)); e != cudaSuccess)
            return e;
        kernel<<<grid_k, kThreads, dkv_smem(kD, true), s>>>(dqkv, partials, dtable, lse, dvec, a);
        return cudaGetLastError();
    }
    // The dq kernel's limit is raised for the T5 staging only when a T5 gradient first needs it,
    // so a GPU with less shared memory per block (sm_86/89: 99 KiB) still runs the others.
    static DynamicSharedLimit limit_dq, limit_dkv, limit_dq_t5;
    if (const cudaError_t e = limit_dq.raise(flash_tc_dq_kernel<kD>, dq_smem(kD, false));
        e != cudaSuccess)
        return e;
    if (const cudaError_t e = limit_dkv.raise(flash_tc_dkv_kernel<kD, false>, dkv_smem(kD, false));
        e != cudaSuccess)
        return e;
    const bool t5 = partials != nullptr && a.bs.kind == kT5;
    if (t5) {  // raised after the smaller limit on every device, so never lowered by it
        if (const cudaError_t e = limit_dq_t5.raise(flash_tc_dq_kernel<kD>, dq_smem(kD, true));
            e != cudaSuccess)
            return e;
    }
    const dim3 grid_q((a.T + kBr - 1) / kBr, a.H, B);
    const bool wgmma = wgmma_applies(a, kD);
    if (kernels.wgmma_dq && wgmma) {  // with the bias-parameter partials when they are asked
        const int wgs = kernels.wgmma_warpgroups;
        if (cudaError_t e = kernels.wgmma_producer
                                ? launch_flash_wg_dq_producer(dqkv, partials, lse, dvec, a, B, kD,
                                                              wgs, kernels.wgmma_tma, s)
                                : launch_flash_wg_dq(dqkv, partials, lse, dvec, a, B, kD, wgs, s);
            e != cudaSuccess)
            return e;
    } else {
        flash_tc_dq_kernel<kD>
            <<<grid_q, kThreads, dq_smem(kD, t5), s>>>(dqkv, partials, dtable, lse, dvec, a);
        if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    if (kernels.wgmma_dkv && wgmma)
        return kernels.wgmma_producer
                   ? launch_flash_wg_dkv_producer(dqkv, lse, dvec, a, B, kD,
                                                  kernels.wgmma_warpgroups, kernels.wgmma_tma, s)
                   : launch_flash_wg_dkv(dqkv, lse, dvec, a, B, kD, kernels.wgmma_warpgroups, s);
    auto* dkv = &flash_tc_dkv_kernel<kD, false>;
    dkv<<<grid_k, kThreads, dkv_smem(kD, false), s>>>(dqkv, nullptr, nullptr, lse, dvec, a);
    return cudaGetLastError();
}

}  // namespace ctx::cuda::tc

namespace ctx::cuda {

size_t flash_tc_backward_smem_bytes(int D, bool t5) {
    const int kD = tc::tc_head_dim(D);
    // static bytes on top of the dynamic ones: the dq kernel's reduction slots (32 doubles),
    // the one-kernel backward's too and its per-thread gradient sums (2 x 128 doubles)
    return std::max(tc::dq_smem(kD, t5) + 32 * sizeof(double),
                    tc::dkv_smem(kD, true) + (32 + 2 * tc::kThreads) * sizeof(double));
}

cudaError_t launch_flash_tc_backward(float* dqkv, float* dvec, float* partials, float* dtable,
                                     const uint16_t* qkv16, uint16_t* packed, const float* dout,
                                     const float* out, const uint16_t* out16, const float* lse,
                                     const float* positions, int B, int T, int C, int H,
                                     KeyMask mask, const BiasArgs& bias, bool accumulate,
                                     const RotationTable& rot, cudaStream_t s,
                                     const FlashTcKernels& kernels) {
    using namespace tc;
    if (B <= 0 || T <= 0) return cudaSuccess;
    TcArgs a = make_args(positions, T, C, H, mask, bias);
    a.accumulate = accumulate;
    a.rot = rot;
    if (a.D > kFlashMaxHeadDim) return cudaErrorInvalidValue;
    // 16-byte rows of dq: D (and so the row stride 3 C) a multiple of 4, dqkv aligned
    a.dq_quad =
        kernels.dq_quad_atomics && a.D % 4 == 0 && reinterpret_cast<uintptr_t>(dqkv) % 16 == 0;
    // the atomic dq's terms cannot be rotated back in the kernel (fuses_rotary asks for Split);
    // Half pairs must sit in one thread's accumulators
    if (rot.table != nullptr &&
        (kernels.backward != FlashBackward::Split || (rot.layout == 0 && (rot.dr / 2) % 8 != 0)))
        return cudaErrorInvalidValue;
    // T5's gradients keep the two kernels (their bucket scan is per query tile)
    const bool atomic_dq =
        kernels.backward == FlashBackward::AtomicDq && !(partials != nullptr && a.bs.kind == kT5);
    // the atomic dq adds onto dqkv: under Overwrite its dq columns start at 0 (zeroed by the
    // dvec pass, which reads the same rows)
    float* zero_dq = atomic_dq && !accumulate ? dqkv : nullptr;
    if (cudaError_t e = out16 != nullptr
                            ? launch_flash_dvec(dvec, dout, out16, B, T, C, H, s, zero_dq)
                            : launch_flash_dvec(dvec, dout, out, B, T, C, H, s, zero_dq);
        e != cudaSuccess)
        return e;
    // q, k, v as the forward packed them; dout packed here
    const size_t n = flash_tc_operand_elems(B, T, C, H);
    uint16_t* g = packed;
    if (cudaError_t e = pack(g, dout, C, 0, B, T, H, a.D, s); e != cudaSuccess) return e;
    a.q = qkv16;
    a.k = qkv16 + n;
    a.v = qkv16 + 2 * n;
    a.g = g;
    if (a.bs.kind == kKerpleLog)  // the forward's decision and tables, rebuilt alike
        if (cudaError_t e = launch_kerple_tables(a, g + n, B, s); e != cudaSuccess) return e;
    if (a.D <= 32)
        return backward_t<32>(dqkv, partials, dtable, lse, dvec, a, B, atomic_dq, s, kernels);
    if (a.D <= 64)
        return backward_t<64>(dqkv, partials, dtable, lse, dvec, a, B, atomic_dq, s, kernels);
    if (a.D <= 80)
        return backward_t<80>(dqkv, partials, dtable, lse, dvec, a, B, atomic_dq, s, kernels);
    return backward_t<kFlashMaxHeadDim>(dqkv, partials, dtable, lse, dvec, a, B, atomic_dq, s,
                                        kernels);
}

}  // namespace ctx::cuda
