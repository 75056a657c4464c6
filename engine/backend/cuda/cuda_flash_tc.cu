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
// bf16 rows per head, (B, H, Tp, kD), T rounded up to Tp = 64 k and the head dim to the kernel's
// kD, zero-padded. Tiles are then plain 16-byte asynchronous copies (cp.async) into shared
// memory, two stages deep: the next tile is in flight while this one is computed.
//
// Warps are the unit: a block is 4 warps, a warp owns 16 rows of every product and computes
// them with mma.sync m16n8k16, its operands read from shared memory by ldmatrix (cuda_mma.cuh
// documents both layouts); an operand stored k-major (V in O = P V, K in dq = dS K, dO and Q in
// dv, dk) is read with ldmatrix.trans, so no transposed copy exists. Shared tiles are bf16, rows
// padded by kPad elements so the 8 rows of an 8 x 8 matrix fall in distinct banks.
//
// Per tile, a warp first classifies its 16 x 64 block against the mask (skip, full, partial):
// only partial blocks (the diagonal, window and document edges) test each logit, and the bias
// family is a template argument of the logit loop (none, ALiBi, KERPLE-log inline, the rest
// through bias_value), chosen once per tile.
//
//   flash_tc_fwd_kernel  grid (T/64, H, B), heaviest query tiles first: Q fragments in
//                        registers; per key tile of 64: S = Q K^T, mask + bias, online
//                        softmax, P stays in registers as the A operand of O += P V.
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
#include "backend/cuda/cuda_flash_tc.cuh"

namespace ctx::cuda::tc {

// ================================================================ forward

template <int kD>
__global__ void __launch_bounds__(kThreads) flash_tc_fwd_kernel(float* out, float* lse, TcArgs a) {
    // Qs (kBr, LS) | two stages of [Ks (kBc, LS) | Vs (kBc, LS) | posK (kBc floats)]
    extern __shared__ float sm[];
    constexpr int LS = kD + kPad, KS = kD / 16, DN = kD / 8, NT = kBc / 8;
    constexpr int kStage = 2 * kBc * LS + 2 * kBc;  // bf16 elements
    uint16_t* Qs = reinterpret_cast<uint16_t*>(sm);
    const int T = a.T, C = a.C, D = a.D, kind = a.bs.kind, family = bias_family(kind);
    const int q0 = tile_index() * kBr, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const size_t bh = size_t(b) * a.H + h, rows = bh * a.Tp * kD;
    const float* pos = a.pos + size_t(b) * T;
    const bool positions = needs_positions(kind);
    auto Ks = [&](int st) { return Qs + kBr * LS + st * kStage; };
    auto Vs = [&](int st) { return Ks(st) + kBc * LS; };
    auto posK = [&](int st) { return reinterpret_cast<float*>(Vs(st) + kBc * LS); };
    const int k_first = first_key_tile(q0, a.window), j_last = min(T - 1, q0 + kBr - 1);
    const int n_tiles = (j_last - k_first) / kBc + 1;
    stage_async<kBr, kD>(Qs, a.q + rows + size_t(q0) * kD, kD);
    auto load = [&](int it) {
        const int st = it & 1;
        stage_key_tile<kD>(Ks(st), Vs(st), posK(st), a, rows, pos, k_first + it * kBc, positions);
    };
    load(0);  // Q travels in the first group

    // rows i[0] = q0 + wr + g and i[1] = i[0] + 8 of this thread; keys [lo, hi] (empty past T)
    const int wr = warp * 16, w0 = q0 + wr, w1 = w0 + 15;
    int i[2], lo[2], hi[2];
    float pi[2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float* trow[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        i[r] = w0 + (lane >> 2) + 8 * r;
        const bool real = i[r] < T;
        lo[r] = real ? row_lo(a, b, i[r]) : 1;
        hi[r] = real ? i[r] : 0;
        pi[r] = real && positions ? pos[i[r]] : 0.0f;
        trow[r] = table_row(a, b, h, i[r]);
    }
    const float pa = param_a(a.bs, h), pb = param_b(a.bs, h), scale2 = a.scale * kLog2e;
    float o[DN][4];
#pragma unroll
    for (int dn = 0; dn < DN; dn++) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
    uint32_t qf[KS][4];

    for (int it = 0; it < n_tiles; it++) {
        const int k0 = k_first + it * kBc, st = it & 1;
        await_tile(it, n_tiles, load);  // tile it (and Q) visible to every warp
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < KS; kk++) ldsm_block<false>(qf[kk], Qs, LS, wr, kk * 16, lane);
        }
        const TileCover cv = cover(a, b, w0, w1, k0, k0 + kBc - 1);
        if (cv != kSkip) {
            float s[NT][4];
            product_nt<KS, NT>(s, qf, Ks(st), LS, lane);
            const float* pk = posK(st);
            // s becomes the logits in base 2, -inf outside the mask
            float mx[2] = {-INFINITY, -INFINITY};
            with_family(family, cv == kPartial, [&](auto fam, auto masked) {
                constexpr int F = decltype(fam)::value;
                constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = e >> 1, c = n * 8 + 2 * t + (e & 1), j = k0 + c;
                        if (kMasked && (j < lo[r] || j > hi[r])) {
                            s[n][e] = -INFINITY;
                            continue;
                        }
                        const float x = fmaf(s[n][e], scale2,
                                             bias2_of<F>(a.bs, h, pa, pb, pi[r],
                                                         positions ? pk[c] : 0.0f, trow[r], j));
                        s[n][e] = x;
                        mx[r] = fmaxf(mx[r], x);
                    }
            });
            float corr[2], ms[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 2));
                const float mn = fmaxf(m[r], mx[r]);
                ms[r] = mn == -INFINITY ? 0.0f : mn;  // a row with nothing visible yet
                corr[r] = exp2f(m[r] - ms[r]);
                m[r] = mn;
            }
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float p = exp2f(s[n][e] - ms[e >> 1]);
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
            product_from_c<kBc / 16, DN>(o, s, Vs(st), LS, lane);
        }
        __syncthreads();  // stage st is refilled by the next iteration's load
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
        if (t == 0) lse[(size_t(b) * a.H + h) * T + i[r]] = (m[r] + log2f(l[r])) * kLn2;
    }
}

// ================================================================ packing

// dst (B, H, Tp, kD) bf16 = the H heads of D columns at [col0, col0 + H D) of src (B, T, ld),
// zero past T and past D; part p > 0 of `parts` packs the columns H D p further on into the
// operand B H Tp kD elements p times further on. One thread per bf16 pair (coalesced reads
// along d).
__global__ void pack_rows_kernel(uint16_t* dst, const float* src, int ld, int col0, int B, int T,
                                 int Tp, int H, int D, int kD, int parts) {
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
        }
        reinterpret_cast<uint32_t*>(dst)[idx] = pack_bf16(x0, x1);  // part p at p * pairs
    }
}

// ================================================================ launch helpers

int tc_head_dim(int D) { return D <= 32 ? 32 : D <= 64 ? 64 : D <= 80 ? 80 : kFlashMaxHeadDim; }
int padded_T(int T) { return (T + kBc - 1) / kBc * kBc; }

// rows (B, H, Tp, kD) of src's heads at col0.
cudaError_t pack(uint16_t* rows, const float* src, int ld, int col0, int B, int T, int H, int D,
                 cudaStream_t s, int parts) {
    const int kD = tc_head_dim(D), Tp = padded_T(T);
    const size_t pairs = size_t(B) * H * Tp * kD / 2 * size_t(parts);
    pack_rows_kernel<<<grid_for(pairs, 256), 256, 0, s>>>(rows, src, ld, col0, B, T, Tp, H, D, kD,
                                                          parts);
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
size_t fwd_smem(int kD) {
    const size_t LS = size_t(kD) + kPad;
    return (size_t(kBr) * LS + 2 * size_t(2 * kBc) * LS) * 2 + 2 * kBc * 4;
}
template <int kD>
cudaError_t forward_t(float* out, float* lse, const TcArgs& a, int B, cudaStream_t s) {
    static const cudaError_t ready = allow_dynamic_shared(flash_tc_fwd_kernel<kD>, fwd_smem(kD));
    if (ready != cudaSuccess) return ready;
    const dim3 grid((a.T + kBr - 1) / kBr, a.H, B);
    flash_tc_fwd_kernel<kD><<<grid, kThreads, fwd_smem(kD), s>>>(out, lse, a);
    return cudaGetLastError();
}

}  // namespace ctx::cuda::tc

namespace ctx::cuda {

size_t flash_tc_packed_elems(int B, int T, int C, int H) {
    using namespace tc;
    if (B <= 0 || T <= 0 || H <= 0) return 0;
    return size_t(4) * B * H * padded_T(T) * tc_head_dim(C / H);
}

size_t flash_tc_forward_smem_bytes(int D) { return tc::fwd_smem(tc::tc_head_dim(D)); }

cudaError_t launch_flash_tc_forward(float* out, float* lse, uint16_t* packed, const float* qkv,
                                    const float* positions, int B, int T, int C, int H, KeyMask mask,
                                    const BiasArgs& bias, cudaStream_t s) {
    using namespace tc;
    if (B <= 0 || T <= 0) return cudaSuccess;
    TcArgs a = make_args(positions, T, C, H, mask, bias);
    if (a.D > kFlashMaxHeadDim) return cudaErrorInvalidValue;
    const size_t n = size_t(B) * H * a.Tp * tc_head_dim(a.D);  // one packed operand
    uint16_t *q = packed, *k = q + n, *v = k + n;
    // q, k, v in one launch (C = H D: the three blocks of columns follow one another)
    if (cudaError_t e = pack(q, qkv, 3 * C, 0, B, T, H, a.D, s, 3); e != cudaSuccess) return e;
    a.q = q;
    a.k = k;
    a.v = v;
    if (a.D <= 32) return forward_t<32>(out, lse, a, B, s);
    if (a.D <= 64) return forward_t<64>(out, lse, a, B, s);
    if (a.D <= 80) return forward_t<80>(out, lse, a, B, s);
    return forward_t<kFlashMaxHeadDim>(out, lse, a, B, s);
}

}  // namespace ctx::cuda
