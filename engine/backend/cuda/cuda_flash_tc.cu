// CUDA backend kernels: tensor-core flash attention (bf16 operands, fp32 accumulation and
// softmax), the path of AttentionMode::Flash when the backend runs Precision::Bf16 (docs/CUDA.md,
// "Flash attention on tensor cores"). The algorithm is FlashAttention-2's; the semantics are
// exactly those of the fp32 kernels in cuda_flash.cu (per-token float positions, every BiasKind
// evaluated per logit through cuda_bias.cuh, causal mask, sliding window, document masks,
// bias-parameter and table gradients in-kernel, accumulate into every gradient, no atomics by
// default),
// except that q, k, v, dout and the probabilities / dlogits entering a product are rounded to
// bf16, and the softmax runs in base 2 (exp2 of logits scaled by log2 e: the same function).
//
// Operands first go through a packing pass (one small kernel for q, k and v, one for dout): as
// bf16 rows per head, (B, H, Tp, kD), T rounded up to Tp = 128 k and the head dim to the kernel's
// kD, zero-padded. Tiles are then plain 16-byte asynchronous copies (cp.async) into shared
// memory, two stages deep: the next tile is in flight while this one is computed.
//
// Warps are the unit: a block is 4 warps, a warp owns 16 rows of every backward product (32 in
// the forward: two m-tiles sharing each K and V fragment) and computes them with mma.sync
// m16n8k16, its operands read from shared memory by ldmatrix (cuda_mma.cuh
// documents both layouts); an operand stored k-major (V in O = P V, K in dq = dS K, dO and Q in
// dv, dk) is read with ldmatrix.trans, so no transposed copy exists. Shared tiles are bf16, rows
// padded by kPad elements so the 8 rows of an 8 x 8 matrix fall in distinct banks.
//
// Per tile, a warp first classifies its 16 x 64 block against the mask (skip, full, partial):
// only partial blocks (the diagonal, window and document edges) test each logit, and the bias
// family is a template argument of the logit loop (none, ALiBi, KERPLE-log inline, the rest
// through bias_value), chosen once per tile.
//
//   flash_tc_fwd_kernel  grid (T/128, H, B), heaviest query tiles first, a warp per 32
//                        queries: per key tile of 64: S = Q K^T, mask + bias, online softmax,
//                        P packed to bf16 in registers as the A operand of O += P V.
//   flash_tc_dq_kernel   grid (T/64, H, B): per key tile, S and dP = dO V^T, P = exp(S - lse),
//                        dS = P (dP - D_i); dq += dS K; dtable += dS; bias-parameter partials
//                        per thread in double (each tile's in float), T5 through a
//                        bucket-owner scan of the tile (as cuda_flash.cu), one partial per
//                        64-row block written into the first of its two 32-row slots (the
//                        second gets 0), so the shared fixed-order reduction
//                        (launch_attention_bias_grad_reduce) applies. One logit loop per bias
//                        family, mask, parameter gradient and per-logit output.
//   flash_tc_dkv_kernel  grid (T/64, H, B): a warp owns 16 keys; per query tile of 32,
//                        S^T = K Q^T, dP^T = V dO^T, then dv += P^T dO, dk += dS^T Q.
//                        With kDq (CTX_FLASH_BACKWARD=atomic: FlashAttention-2's one-kernel
//                        backward, no dq kernel): dS^T also goes to shared memory as bf16 and
//                        the block adds dq += dS K for the tile's 32 queries with fp32 atomics
//                        (5 products per tile instead of 7; dq's last bits vary from run to
//                        run), plus the dq kernel's bias-parameter partials (per 64-key block)
//                        and dtable; T5's gradients keep the two kernels.
// dvec = rowsum(dout * out) comes from cuda_flash.cu's kernel (launch_flash_dvec), in fp32.
#include <array>
#include <mutex>

#include "backend/cuda/cuda_flash_tc.cuh"

namespace ctx::cuda::tc {

// ================================================================ forward

// The forward's warps own two 16-row m-tiles (32 queries) each, so every K and V fragment read
// from shared memory feeds two products: 128 bytes of ldmatrix per mma instead of 256. With one
// m-tile per warp the kernel needed more shared-memory bandwidth (~171 bytes a clock an SM at
// the H100's mma.sync rate) than an SM has (128), and measured 23-34% tensor-pipe activity.
// M, the m-tiles per warp, is 2 wherever the block's shared memory fits the GPU: at head dim 128
// its 128-row Q tile makes 104,960 bytes, past the 99 KiB of sm_86/89, which then run M = 1 (the
// layout before, 87,552 bytes) rather than refuse the forward. CTX_FLASH_FORWARD_MTILES=1 asks
// for M = 1 everywhere (A/B timings against the layout before).
inline constexpr int kBrF = 2 * 16 * 4;  // queries per forward block at M = 2 (4 warps)
static_assert(kBrF % kBc == 0, "whole key tiles per query block (padded_T)");

// Q's fragments stay in registers up to head dim 64 (KS x M x 4 registers), and with one m-tile;
// else they are read per k step: at 80 they made ptxas spill, at 128 the two m-tiles' O (128
// registers) and S (64) leave no room.
template <int kD, int M>
inline constexpr bool kQInRegisters = kD <= 64 || M == 1;

// x[m] (16 x 8 NT) = A_m (16 x 16 KS) times the first 8 NT rows of Bn transposed, for the warp's
// M m-tiles, each B fragment read once for all of them: S = Q K^T. A from registers (qf) or,
// with kStaged, as rows [r + 16 m, r + 16 m + 16) of the staged tile A.
template <int M, int KS, int NT, bool kStaged>
__device__ __forceinline__ void product_nt_m(float (&x)[M][NT][4],
                                             const uint32_t (&qf)[kStaged ? 1 : M][KS][4],
                                             const uint16_t* A, int r, const uint16_t* Bn, int LS,
                                             int lane) {
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int n = 0; n < NT; n++) x[m][n][0] = x[m][n][1] = x[m][n][2] = x[m][n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t af[M][4];
#pragma unroll
        for (int m = 0; m < M; m++) {
            if constexpr (kStaged)
                ldsm_block<false>(af[m], A, LS, r + 16 * m, kk * 16, lane);
            else
#pragma unroll
                for (int u = 0; u < 4; u++) af[m][u] = qf[m][kk][u];
        }
#pragma unroll
        for (int n2 = 0; n2 < NT / 2; n2++) {
            uint32_t bf[4];
            ldsm_block<false>(bf, Bn, LS, n2 * 16, kk * 16, lane);
            const uint32_t b0[2] = {bf[0], bf[2]}, b1[2] = {bf[1], bf[3]};
#pragma unroll
            for (int m = 0; m < M; m++) {
                mma_bf16_16816(x[m][2 * n2], af[m], b0);
                mma_bf16_16816(x[m][2 * n2 + 1], af[m], b1);
            }
        }
    }
}

// o[m] (16 x 8 DN) += P_m V for the warp's m-tiles: P_m's 16 x 16 KC blocks as A fragments
// (pf[m][kc], bf16: half the registers of P's fp32 C fragments), V rows [0, 16 KC) of the
// k-major tile Vk, each V fragment read once.
template <int M, int KC, int DN>
__device__ __forceinline__ void product_pv_m(float (&o)[M][DN][4], const uint32_t (&pf)[M][KC][4],
                                             const uint16_t* Vk, int LS, int lane) {
#pragma unroll
    for (int kc = 0; kc < KC; kc++)
#pragma unroll
        for (int dn2 = 0; dn2 < DN / 2; dn2++) {
            uint32_t bf[4];
            ldsm_block<true>(bf, Vk, LS, kc * 16, dn2 * 16, lane);
            const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
#pragma unroll
            for (int m = 0; m < M; m++) {
                mma_bf16_16816(o[m][2 * dn2], pf[m][kc], b0);
                mma_bf16_16816(o[m][2 * dn2 + 1], pf[m][kc], b1);
            }
        }
}

// kGeneral: the instantiation for the families evaluated through bias_value (KERPLE-power, T5,
// Table); the other serves none, ALiBi and KERPLE-log without a call in it.
template <int kD, bool kGeneral, int M>
__global__ void __launch_bounds__(kThreads) flash_tc_fwd_kernel(float* out, float* lse, TcArgs a) {
    // Qs (BR, LS) | two stages of [Ks (kBc, LS) | Vs (kBc, LS) | posK (kBc floats)]
    extern __shared__ float sm[];
    constexpr int LS = kD + kPad, KS = kD / 16, DN = kD / 8, NT = kBc / 8, BR = M * 64;
    constexpr int kStage = 2 * kBc * LS + 2 * kBc;  // bf16 elements
    constexpr bool kQRegs = kQInRegisters<kD, M>;
    uint16_t* Qs = reinterpret_cast<uint16_t*>(sm);
    const int T = a.T, kind = a.bs.kind, family = bias_family(kind);
    const int q0 = tile_index() * BR, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const size_t bh = size_t(b) * a.H + h, rows = bh * a.Tp * kD;
    const float* pos = a.pos + size_t(b) * T;
    const bool positions = needs_positions(kind);
    auto Ks = [&](int st) { return Qs + BR * LS + st * kStage; };
    auto Vs = [&](int st) { return Ks(st) + kBc * LS; };
    auto posK = [&](int st) { return reinterpret_cast<float*>(Vs(st) + kBc * LS); };
    const int k_first = first_key_tile(q0, a.window), j_last = min(T - 1, q0 + BR - 1);
    const int n_tiles = (j_last - k_first) / kBc + 1;
    stage_async<BR, kD>(Qs, a.q + rows + size_t(q0) * kD, kD);
    auto load = [&](int it) {
        const int st = it & 1;
        stage_key_tile<kD>(Ks(st), Vs(st), posK(st), a, rows, pos, k_first + it * kBc, positions);
    };
    load(0);  // Q travels in the first group

    // row rr = 2 m + r of this thread is query row_i(rr); it attends keys [lo[rr], row_i(rr)]
    // (none past T: lo = INT_MAX). Only what cannot be recomputed for free lives in registers:
    // the two m-tiles' O and S take most of them.
    const int wr = warp * 16 * M, w0 = q0 + wr, w1 = w0 + 16 * M - 1, ig = w0 + (lane >> 2);
    constexpr int R = 2 * M;
    auto row_i = [&](int rr) { return ig + 16 * (rr >> 1) + 8 * (rr & 1); };
    int lo[R];
    float pi[R], m_run[R], l[R];
#pragma unroll
    for (int rr = 0; rr < R; rr++) {
        const bool real = row_i(rr) < T;
        lo[rr] = real ? row_lo(a, b, row_i(rr)) : INT_MAX;
        pi[rr] = real && positions ? pos[row_i(rr)] : 0.0f;
        m_run[rr] = -INFINITY;
        l[rr] = 0.0f;
    }
    const float pa = param_a(a.bs, h), pb = param_b(a.bs, h), scale2 = a.scale * kLog2e;
    float o[M][DN][4];
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int dn = 0; dn < DN; dn++)
            o[m][dn][0] = o[m][dn][1] = o[m][dn][2] = o[m][dn][3] = 0.0f;
    uint32_t qf[kQRegs ? M : 1][KS][4];

    for (int it = 0; it < n_tiles; it++) {
        const int k0 = k_first + it * kBc, st = it & 1;
        await_tile(it, n_tiles, load);  // tile it (and Q) visible to every warp
        if constexpr (kQRegs) {
            if (it == 0) {
#pragma unroll
                for (int m = 0; m < M; m++)
#pragma unroll
                    for (int kk = 0; kk < KS; kk++)
                        ldsm_block<false>(qf[m][kk], Qs, LS, wr + 16 * m, kk * 16, lane);
            }
        }
        const TileCover cv = cover(a, b, w0, w1, k0, k0 + kBc - 1);
        if (cv != kSkip) {
            float s[M][NT][4];
            product_nt_m<M, KS, NT, !kQRegs>(s, qf, Qs, wr, Ks(st), LS, lane);
            const float* pk = posK(st);
            // s becomes the logits in base 2, -inf outside the mask
            float mx[R];
#pragma unroll
            for (int rr = 0; rr < R; rr++) mx[rr] = -INFINITY;
            const int fam_run = kGeneral ? kOtherBias : family;
            with_family<kGeneral, false>(fam_run, cv == kPartial, [&](auto fam, auto masked) {
                constexpr int F = decltype(fam)::value;
                constexpr bool kMasked = decltype(masked)::value;
                const KerpleRows kr{};  // KERPLE-log by its MUFU path (with_family: kTables)
#pragma unroll
                for (int m = 0; m < M; m++)
#pragma unroll
                    for (int n = 0; n < NT; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int rr = 2 * m + (e >> 1), c = n * 8 + 2 * t + (e & 1);
                            const int j = k0 + c;
                            const bool out = kMasked && (j < lo[rr] || j > row_i(rr));
                            const float* trow =
                                F == kOtherBias ? table_row(a, b, h, row_i(rr)) : nullptr;
                            // a masked logit's bias is computed and dropped: a select, not
                            // a branch per logit
                            const float x =
                                out ? -INFINITY
                                    : fmaf(s[m][n][e], scale2,
                                           bias2_of<F>(a.bs, h, pa, pb, pi[rr],
                                                       positions ? pk[c] : 0.0f, trow, j, kr));
                            s[m][n][e] = x;
                            mx[rr] = fmaxf(mx[rr], x);
                        }
            });
            float corr[R], ms[R], sum[R] = {};
            softmax_row_max<R>(mx, m_run, ms, corr);
            uint32_t pf[M][NT / 2][4];  // P in bf16 A fragments
#pragma unroll
            for (int m = 0; m < M; m++)
                probabilities<NT>([&](int n, int e) { return s[m][n][e]; }, ms + 2 * m, sum + 2 * m,
                                  pf[m]);
            softmax_row_sum<R>(sum, l, corr);
#pragma unroll
            for (int m = 0; m < M; m++)
#pragma unroll
                for (int dn = 0; dn < DN; dn++) {
                    o[m][dn][0] *= corr[2 * m];
                    o[m][dn][1] *= corr[2 * m];
                    o[m][dn][2] *= corr[2 * m + 1];
                    o[m][dn][3] *= corr[2 * m + 1];
                }
            product_pv_m<M, kBc / 16, DN>(o, pf, Vs(st), LS, lane);
        }
        __syncthreads();  // stage st is refilled by the next iteration's load
    }
#pragma unroll
    for (int rr = 0; rr < R; rr++) {
        const int i = row_i(rr), m = rr >> 1, r = rr & 1;
        if (i >= T) continue;  // every real row has its diagonal: l > 0
        write_forward_row<DN>(a, out, lse, b, h, i, t, m_run[rr], l[rr],
                              [&](int dn, int e) { return o[m][dn][2 * r + e]; });
    }
}

// ================================================================ packing

// dst (B, H, Tp, kD) bf16 = the H heads of D columns at [col0, col0 + H D) of src (B, T, ld),
// zero past T and past D; part p > 0 of `parts` packs the columns H D p further on into the
// operand B H Tp kD elements p times further on. One thread per bf16 pair (coalesced reads
// along d). With a rotation table, parts 0 and 1 (q and k) are rotated first, each entry as
// rotary_kernel computes it (the same bits as that pass, then packing).
__global__ void pack_rows_kernel(uint16_t* dst, const float* src, int ld, int col0, int B, int T,
                                 int Tp, int H, int D, int kD, int parts, RotationTable rot) {
    const auto* table = reinterpret_cast<const PairRotation*>(rot.table);
    const int half = rot.dr / 2;
    const int P = kD / 2;
    const size_t pairs = size_t(B) * H * Tp * P;  // per part: the pairs of one operand
    for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < pairs * parts;
         idx += size_t(gridDim.x) * blockDim.x) {
        const int part = int(idx / pairs);
        const size_t within = idx % pairs;
        const int d = 2 * int(within % P);
        const size_t r = within / P, bh = r / Tp;
        const int t = int(r % Tp), h = int(bh % H), b = int(bh / H);
        float x0 = 0.0f, x1 = 0.0f;
        if (t < T) {
            const float* p =
                src + (size_t(b) * T + t) * ld + col0 + size_t(part) * H * D + size_t(h) * D;
            if (d < D) x0 = p[d];
            if (d + 1 < D) x1 = p[d + 1];
            if (table != nullptr && part < 2) {
                const PairRotation* rt = table + (size_t(b) * T + t) * half;
                if (d < rot.dr) x0 = rotated_entry(p, d, rot.dr, rot.layout, rt, part == 1);
                if (d + 1 < rot.dr) x1 = rotated_entry(p, d + 1, rot.dr, rot.layout, rt, part == 1);
            }
        }
        reinterpret_cast<uint32_t*>(dst)[idx] = pack_bf16(x0, x1);  // part p at p * pairs
    }
}

// ================================================================ KERPLE-log tables

// kinfo[0] = 1 when all n positions are finite integers whose span (max - min, which bounds
// every |pi - pj| of a call) is below cap, kinfo[1] = span + 1 then (else 0, 0). One block: a
// pass over B x T floats.
__global__ void kerple_info_kernel(int* kinfo, const float* pos, size_t n, int cap) {
    __shared__ float red[32];
    __shared__ int redi[32];
    float hi = -INFINITY, neg_lo = -INFINITY;
    int odd = 0;  // positions that are not finite integers
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float x = pos[i];
        odd += !(fabsf(x) < 8388608.0f && x == rintf(x));
        hi = fmaxf(hi, x);
        neg_lo = fmaxf(neg_lo, -x);
    }
    hi = block_max(hi, red);
    neg_lo = block_max(neg_lo, red);
    odd = block_sum(odd, redi);
    if (threadIdx.x == 0) {
        const float span = n > 0 ? hi + neg_lo : 0.0f;  // exact: integers below 2^23
        const bool use = odd == 0 && span < float(cap);
        kinfo[0] = use ? 1 : 0;
        kinfo[1] = use ? int(span) + 1 : 0;
    }
}

// tab[h cap + d] = log2(1 + b[h] d), tab[(H + h) cap + d] = d / (1 + b[h] d) for the kinfo[1]
// distances d the call needs, with the instructions of the kernels' MUFU path (u = fma(b, d, 1),
// __log2f, __fdividef), so a looked-up term is bit for bit the computed one.
__global__ void kerple_table_kernel(float* tab, const int* kinfo, const float* b, int H, int cap) {
    if (kinfo[0] == 0) return;
    const int filled = kinfo[1];
    for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < size_t(H) * cap;
         idx += size_t(gridDim.x) * blockDim.x) {
        const int h = int(idx / cap), d = int(idx % cap);
        if (d >= filled) continue;
        const float dist = float(d), u = fmaf(b[h], dist, 1.0f);
        tab[size_t(h) * cap + d] = __log2f(u);
        tab[size_t(H + h) * cap + d] = __fdividef(dist, u);
    }
}

size_t kerple_space_elems(int H) {
    // kinfo (2 ints) padded to 16 bytes, then the two tables of H x kKerpleCap floats
    return 8 + size_t(2) * 2 * H * kKerpleCap;
}

cudaError_t launch_kerple_tables(TcArgs& a, uint16_t* space, int B, cudaStream_t s) {
    int* kinfo = reinterpret_cast<int*>(space);
    float* tab = reinterpret_cast<float*>(space + 8);
    kerple_info_kernel<<<1, 1024, 0, s>>>(kinfo, a.pos, size_t(B) * a.T, kKerpleCap);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    const size_t n = size_t(a.H) * kKerpleCap;
    kerple_table_kernel<<<grid_for(n, 256, 4096), 256, 0, s>>>(tab, kinfo, a.bs.b, a.H, kKerpleCap);
    a.ktab = tab;
    a.kinfo = kinfo;
    a.kcap = kKerpleCap;
    return cudaGetLastError();
}

// ================================================================ launch helpers

int tc_head_dim(int D) { return D <= 32 ? 32 : D <= 64 ? 64 : D <= 80 ? 80 : kFlashMaxHeadDim; }
int padded_T(int T) { return (T + kBrF - 1) / kBrF * kBrF; }  // whole forward query blocks

// rows (B, H, Tp, kD) of src's heads at col0 (q and k rotated by rot's table, if any).
cudaError_t pack(uint16_t* rows, const float* src, int ld, int col0, int B, int T, int H, int D,
                 cudaStream_t s, int parts, const RotationTable& rot) {
    const int kD = tc_head_dim(D), Tp = padded_T(T);
    const size_t pairs = size_t(B) * H * Tp * kD / 2 * size_t(parts);
    pack_rows_kernel<<<grid_for(pairs, 256), 256, 0, s>>>(rows, src, ld, col0, B, T, Tp, H, D, kD,
                                                          parts, rot);
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

// Dynamic shared memory (bytes) of the forward kernel for head dim kD.
size_t fwd_smem(int kD, int M) {
    const size_t LS = size_t(kD) + kPad;
    return (size_t(M) * 64 * LS + 2 * size_t(2 * kBc) * LS) * 2 + 2 * kBc * 4;
}

// The properties of the current device (zeros where they cannot be read), read once per device:
// a process may drive GPUs of different kinds, and a wgmma kernel launched on one without wgmma
// traps.
const cudaDeviceProp& this_gpu() {
    constexpr int kDevices = 64;
    static std::array<std::once_flag, kDevices> once;
    static std::array<cudaDeviceProp, kDevices> props;
    static const cudaDeviceProp none{};
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) {
        cudaGetLastError();
        return none;
    }
    std::call_once(once[size_t(device)], [&] {
        cudaDeviceProp p{};
        if (cudaGetDeviceProperties(&p, device) != cudaSuccess) p = cudaDeviceProp{};
        cudaGetLastError();
        props[size_t(device)] = p;
    });
    return props[size_t(device)];
}

// The m-tiles per warp of the forward at head dim kD on the current GPU (see kBrF): the
// requested number (1 or 2) where its shared memory fits, else 1.
int fwd_m(int kD, int requested) {
    const size_t optin = this_gpu().sharedMemPerBlockOptin;
    return requested == 1 || (optin > 0 && fwd_smem(kD, 2) > optin) ? 1 : 2;
}

bool wgmma_device() { return this_gpu().major == 9 && this_gpu().minor == 0; }

bool wgmma_applies(const TcArgs& a, int kD) {
    return (kD == 64 || kD == 128) && bias_family(a.bs.kind) != kOtherBias && wgmma_device();
}

template <int kD, bool kGeneral, int M>
cudaError_t forward_t(float* out, float* lse, const TcArgs& a, int B, cudaStream_t s) {
    auto* kernel = &flash_tc_fwd_kernel<kD, kGeneral, M>;
    static DynamicSharedLimit limit;
    if (const cudaError_t e = limit.raise(kernel, fwd_smem(kD, M)); e != cudaSuccess) return e;
    const dim3 grid((a.T + M * 64 - 1) / (M * 64), a.H, B);
    kernel<<<grid, kThreads, fwd_smem(kD, M), s>>>(out, lse, a);
    return cudaGetLastError();
}
template <int kD, bool kGeneral>
cudaError_t forward_t(float* out, float* lse, const TcArgs& a, int B, cudaStream_t s, int m) {
    // the families through bias_value_call at head dims 80 and 128: one m-tile (with two the
    // call ABI made ptxas spill 36 / 580 bytes, none with one; sm_90)
    if constexpr (kGeneral && kD >= 80)
        return forward_t<kD, true, 1>(out, lse, a, B, s);
    else
        return m == 1 ? forward_t<kD, kGeneral, 1>(out, lse, a, B, s)
                      : forward_t<kD, kGeneral, 2>(out, lse, a, B, s);
}
template <int kD>
cudaError_t forward_t(float* out, float* lse, const TcArgs& a, int B, cudaStream_t s,
                      int mtiles) {
    const int m = fwd_m(kD, mtiles);
    return bias_family(a.bs.kind) == kOtherBias ? forward_t<kD, true>(out, lse, a, B, s, m)
                                                : forward_t<kD, false>(out, lse, a, B, s, m);
}

}  // namespace ctx::cuda::tc

namespace ctx::cuda {

size_t flash_tc_operand_elems(int B, int T, int C, int H) {
    using namespace tc;
    if (B <= 0 || T <= 0 || H <= 0) return 0;
    return size_t(B) * H * padded_T(T) * tc_head_dim(C / H);
}

size_t flash_tc_backward_packed_elems(int B, int T, int C, int H, int bias_kind) {
    const size_t n = flash_tc_operand_elems(B, T, C, H);
    return n == 0 ? 0 : n + (bias_kind == kKerpleLog ? tc::kerple_space_elems(H) : 0);
}

size_t flash_tc_forward_smem_bytes(int D, int mtiles) {
    const int kD = tc::tc_head_dim(D);
    return tc::fwd_smem(kD, tc::fwd_m(kD, mtiles));
}

size_t flash_tc_forward_kerple_elems(int C, int H, int bias_kind, const FlashTcKernels& kernels) {
    using namespace tc;
    if (H <= 0 || bias_kind != kKerpleLog || !kernels.wgmma_forward ||
        !kernels.wgmma_forward_kerple_tables || !wgmma_device())
        return 0;
    const int kD = tc_head_dim(C / H);
    return kD == 64 || kD == 128 ? kerple_space_elems(H) : 0;
}

cudaError_t launch_flash_tc_forward(float* out, uint16_t* out16, float* lse, uint16_t* qkv16,
                                    const float* qkv, const float* positions, int B, int T, int C,
                                    int H, KeyMask mask, const BiasArgs& bias,
                                    const RotationTable& rot, cudaStream_t s,
                                    const FlashTcKernels& kernels, uint16_t* kerple_space) {
    using namespace tc;
    if (B <= 0 || T <= 0) return cudaSuccess;
    TcArgs a = make_args(positions, T, C, H, mask, bias);
    a.out16 = out16;
    if (a.D > kFlashMaxHeadDim) return cudaErrorInvalidValue;
    const size_t n = flash_tc_operand_elems(B, T, C, H);
    uint16_t *q = qkv16, *k = q + n, *v = k + n;
    // q, k, v in one launch (C = H D: the three blocks of columns follow one another)
    if (cudaError_t e = pack(q, qkv, 3 * C, 0, B, T, H, a.D, s, 3, rot); e != cudaSuccess) return e;
    a.q = q;
    a.k = k;
    a.v = v;
    const int kD = tc_head_dim(a.D);
    if (kernels.wgmma_forward && wgmma_applies(a, kD)) {
        // KERPLE-log's terms looked up where the positions allow (the backward's tables, built
        // here too: a MUFU op a logit fewer, where the softmax's exponentials already bound it)
        if (a.bs.kind == kKerpleLog && kerple_space != nullptr)
            if (cudaError_t e = launch_kerple_tables(a, kerple_space, B, s); e != cudaSuccess)
                return e;
        const int wg = kernels.wgmma_warpgroups;
        if (kernels.wgmma_producer)
            return launch_flash_wg_forward_producer(out, lse, a, B, kD, wg, kernels.wgmma_tma, s);
        return launch_flash_wg_forward(out, lse, a, B, kD, wg, s);
    }
    const int mtiles = kernels.forward_mtiles;
    if (a.D <= 32) return forward_t<32>(out, lse, a, B, s, mtiles);
    if (a.D <= 64) return forward_t<64>(out, lse, a, B, s, mtiles);
    if (a.D <= 80) return forward_t<80>(out, lse, a, B, s, mtiles);
    return forward_t<kFlashMaxHeadDim>(out, lse, a, B, s, mtiles);
}

}  // namespace ctx::cuda
