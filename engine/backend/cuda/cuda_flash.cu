// CUDA backend kernels: flash-style fused causal attention, fp32 (docs/CUDA.md, "Flash
// attention"). Tiled over queries and keys with an online softmax: no (T, T) matrix is ever
// stored; the forward saves only the per-row log-sum-exp (B, H, T), and the backward recomputes
// the probabilities tile by tile from it.
//
// Same semantics as the materialised path (cuda_attention.cu, backend.h): per-token float
// positions, the bias of every BiasKind evaluated in-kernel on the real-valued distance
// p_i - p_j (Linear, KERPLE log/power, T5 through the host-built bucket table or the direct
// formula in double, the explicit Table), causal mask and sliding window. The bias evaluation
// (cuda_bias.cuh) is shared with cuda_attention.cu, so both modes form bit-identical logits.
// CudaBackend runs these kernels in AttentionMode::Flash (cuda_attention_ops.cpp, through
// FlashAttention in cuda_flash_ops.cpp).
//
// Blocks: kThreads = 128 threads, tiles of kTile = 32 queries x 32 keys. Thread t owns row
// r = t / 4 of a tile and, for logits, the 8 columns c = t % 4 + 4 k; for the output (and dq, dk,
// dv) the dims d = t % 4 + 4 k of its row. The four threads of a row are adjacent lanes of one
// warp, so row max / row sum are two xor-shuffles.
//
//   flash_fwd_kernel       grid (T/32, H, B): Q tile in shared memory, loop over the causal key
//                          tiles (window: only tiles that intersect it), online softmax, out and
//                          lse = m + log(l) written once.
//   flash_bwd_dvec_kernel  D_i = rowsum(dout * out), one warp per (b, h, i).
//   flash_bwd_dq_kernel    grid (T/32, H, B): per query tile, recompute P = exp(S - lse) and
//                          dS = P (dP - D_i) per key tile; dq += dS k / sqrt(D); dtable += dS;
//                          bias-parameter gradients accumulated per thread (double) and written
//                          as one partial per (b, h, query tile); the existing fixed-order reduce
//                          (launch_attention_bias_grad_reduce, same layout, 32-row chunks) sums
//                          them into da / db.
//   flash_bwd_dkv_kernel   grid (T/32, H, B): per key tile, loop over the query tiles that see it,
//                          recompute P and dS the same way; dv += P^T dout, dk += dS^T q / sqrt(D).
//
// No atomics: every output element is owned by one thread of one block, dq and dk/dv come from
// two kernels instead of an atomic dq, and every reduction has a fixed order. Results are
// bit-for-bit repeatable on a given GPU.
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_flash.h"
#include "backend/cuda/cuda_bias.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace ctx::cuda {

namespace {

constexpr int kTile = kFlashTile;
constexpr int kThreads = kFlashThreads;
constexpr int kCols = kTile * kTile / kThreads;  // logits per thread per tile pair (8)
constexpr int kPS = kTile + 1;                    // row stride of the (32, 32) tiles in shared
static_assert(kThreads == 4 * kTile, "four threads per tile row");
static_assert(kTile == kBiasGradRows, "bias partials share the materialised path's 32-row chunks");
static_assert(kMaxT5Buckets <= 4 * kThreads, "each thread owns at most 4 T5 buckets");



// ================================================================ tile helpers

struct FlashArgs {
    const float* qkv;  // (B, T, 3C)
    const float* pos;  // (B, T)
    int T, C, H, D, window;
    const int32_t* doc_start;  // (B, T) packed rows, or null (KeyMask)
    float scale;       // 1 / sqrt(D)
    BiasArgs bs;
};

// Rows [r0, r0 + kTile) of a (T, D) view with row stride ld into dst (kTile, LD); rows >= T are 0.
__device__ __forceinline__ void load_tile(float* dst, int LD, const float* src, size_t ld, int r0,
                                          int T, int D) {
    for (int idx = threadIdx.x; idx < kTile * D; idx += kThreads) {
        const int r = idx / D, d = idx % D, row = r0 + r;
        dst[r * LD + d] = row < T ? src[size_t(row) * ld + d] : 0.0f;
    }
}

// The logits this thread owns in the tile pair (query tile q0, key tile k0): s[k] for row r and
// column c = q4 + 4 k, i.e. query i = q0 + r, key j = k0 + c. valid bit k: j is inside the causal
// mask and the window of a real query (i < T); s[k] is meaningful only then.
__device__ __forceinline__ unsigned tile_logits(float (&s)[kCols], const float* Qs,
                                                const float* Ks, int LD, int q0, int k0, int r,
                                                int q4, int b, int h, const FlashArgs& a) {
    const int i = q0 + r;
    unsigned valid = 0;
    if (i >= a.T) return 0;
    const float* pos = a.pos + size_t(b) * a.T;
    const float pi = pos[i];
    const int lo = key_lo(KeyMask{a.window, a.doc_start}, b, a.T, i);
    const float* trow =
        a.bs.kind == kTable ? a.bs.table + ((size_t(b) * a.H + h) * a.T + i) * a.T : nullptr;
    const float* q = Qs + r * LD;
#pragma unroll
    for (int k = 0; k < kCols; k++) {
        const int c = q4 + 4 * k, j = k0 + c;
        s[k] = 0.0f;
        if (j > i || j < lo) continue;
        const float* kr = Ks + c * LD;
        float dot = 0.0f;
        for (int d = 0; d < a.D; d++) dot += q[d] * kr[d];
        s[k] = dot * a.scale + bias_value(a.bs, h, pi, pos[j], trow, j);
        valid |= 1u << k;
    }
    return valid;
}

// First key tile and last key of query tile q0 (causal, window).
__device__ __forceinline__ void key_range(int q0, const FlashArgs& a, int& k_first, int& j_last) {
    const int j_lo = a.window > 0 ? max(0, q0 - a.window + 1) : 0;
    k_first = (j_lo / kTile) * kTile;
    j_last = min(a.T - 1, q0 + kTile - 1);
}

// ================================================================ forward

template <int kD>
__global__ void flash_fwd_kernel(float* out, float* lse, FlashArgs a) {
    extern __shared__ float sm[];  // Qs, Ks, Vs (kTile, LD) | Ps (kTile, kPS)
    constexpr int kNK = (kD + 3) / 4;
    const int D = a.D, LD = D + 1, C = a.C, T = a.T;
    float* Qs = sm;
    float* Ks = Qs + kTile * LD;
    float* Vs = Ks + kTile * LD;
    float* Ps = Vs + kTile * LD;
    const int q0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, r = tid >> 2, q4 = tid & 3;
    const float* base = a.qkv + size_t(b) * T * 3 * C + size_t(h) * D;
    load_tile(Qs, LD, base, size_t(3) * C, q0, T, D);
    float acc[kNK];
#pragma unroll
    for (int k = 0; k < kNK; k++) acc[k] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    int k_first, j_last;
    key_range(q0, a, k_first, j_last);
    for (int k0 = k_first; k0 <= j_last; k0 += kTile) {  // uniform over the block
        __syncthreads();  // the previous tile's Ks, Vs, Ps are no longer read
        load_tile(Ks, LD, base + C, size_t(3) * C, k0, T, D);
        load_tile(Vs, LD, base + 2 * C, size_t(3) * C, k0, T, D);
        __syncthreads();
        float s[kCols];
        const unsigned valid = tile_logits(s, Qs, Ks, LD, q0, k0, r, q4, b, h, a);
        float mx = -INFINITY;
#pragma unroll
        for (int k = 0; k < kCols; k++)
            if (valid & (1u << k)) mx = fmaxf(mx, s[k]);
        mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
        const float mn = fmaxf(m, mx);
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < kCols; k++) {
            const float p = (valid & (1u << k)) ? expf(s[k] - mn) : 0.0f;
            Ps[r * kPS + q4 + 4 * k] = p;
            sum += p;
        }
        sum += __shfl_xor_sync(kFullMask, sum, 1);
        sum += __shfl_xor_sync(kFullMask, sum, 2);
        const float corr = m == -INFINITY ? 0.0f : expf(m - mn);
        l = l * corr + sum;
        m = mn;
        __syncthreads();  // Ps of the row (written by the row's four lanes) is visible
        const float* pr = Ps + r * kPS;
#pragma unroll
        for (int k = 0; k < kNK; k++) {
            const int d = q4 + 4 * k;
            if (d < D) {
                float x = acc[k] * corr;
                for (int c = 0; c < kTile; c++) x += pr[c] * Vs[c * LD + d];
                acc[k] = x;
            }
        }
    }
    const int i = q0 + r;
    if (i < T) {  // every real row has its diagonal: l >= 1
        const float inv = 1.0f / l;
        float* o = out + (size_t(b) * T + i) * C + size_t(h) * D;
#pragma unroll
        for (int k = 0; k < kNK; k++) {
            const int d = q4 + 4 * k;
            if (d < D) o[d] = acc[k] * inv;
        }
        if (q4 == 0) lse[(size_t(b) * a.H + h) * T + i] = m + logf(l);
    }
}

// ================================================================ backward

constexpr int kRowWarps = 8;

// dvec (B, H, T) = rowsum(dout * out) per head; one warp per (b, h, i). out in fp32 or bf16.
template <class Out>
__global__ void flash_bwd_dvec_kernel(float* dvec, const float* dout, const Out* out, int B, int T,
                                      int C, int H, float* zero_dq) {
    const int lane = threadIdx.x & 31;
    const size_t row = size_t(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
    if (row >= size_t(B) * H * T) return;  // whole warps leave together
    const int i = int(row % T), h = int((row / T) % H), b = int(row / (size_t(T) * H));
    const int D = C / H;
    const size_t off = (size_t(b) * T + i) * C + size_t(h) * D;
    float x = 0.0f;
    for (int d = lane; d < D; d += 32) x += dout[off + d] * load_value(out, off + d);
    x = warp_sum(x);
    if (lane == 0) dvec[row] = x;
    if (zero_dq != nullptr) {
        float* dq = zero_dq + (size_t(b) * T + i) * 3 * C + size_t(h) * D;
        for (int d = lane; d < D; d += 32) dq[d] = 0.0f;
    }
}

// Recomputes this thread's probabilities and dlogits of a tile pair into Ps / Ss (row r, columns
// q4 + 4 k): P = exp(S - lse_i), dS = P (dO_i . V_j - D_i); 0 outside the mask.
__device__ __forceinline__ unsigned tile_dlogits(float (&p)[kCols], float (&ds)[kCols],
                                                 float (&s)[kCols], const float* Qs,
                                                 const float* Ks, const float* dOs,
                                                 const float* Vs, int LD, int q0, int k0, int r,
                                                 int q4, int b, int h, float lse_i, float d_i,
                                                 const FlashArgs& a) {
    const unsigned valid = tile_logits(s, Qs, Ks, LD, q0, k0, r, q4, b, h, a);
    const float* g = dOs + r * LD;
#pragma unroll
    for (int k = 0; k < kCols; k++) {
        p[k] = 0.0f;
        ds[k] = 0.0f;
        if (!(valid & (1u << k))) continue;
        const int c = q4 + 4 * k;
        const float* vr = Vs + c * LD;
        float dp = 0.0f;
        for (int d = 0; d < a.D; d++) dp += g[d] * vr[d];
        p[k] = expf(s[k] - lse_i);
        ds[k] = p[k] * (dp - d_i);
    }
    return valid;
}

// Per query tile: dq, dtable, bias-parameter partials.
template <int kD>
__global__ void flash_bwd_dq_kernel(float* dqkv, float* partials, float* dtable,
                                    const float* dout, const float* lse, const float* dvec,
                                    FlashArgs a) {
    extern __shared__ float sm[];  // Qs, dOs, Ks, Vs (kTile, LD) | Ss (kTile, kPS) | Bk (int)
    __shared__ double red[32];
    constexpr int kNK = (kD + 3) / 4;
    const int D = a.D, LD = D + 1, C = a.C, T = a.T, H = a.H;
    float* Qs = sm;
    float* dOs = Qs + kTile * LD;
    float* Ks = dOs + kTile * LD;
    float* Vs = Ks + kTile * LD;
    float* Ss = Vs + kTile * LD;
    int* Bk = reinterpret_cast<int*>(Ss + kTile * kPS);
    const int q0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, r = tid >> 2, q4 = tid & 3, i = q0 + r;
    const float* base = a.qkv + size_t(b) * T * 3 * C + size_t(h) * D;
    load_tile(Qs, LD, base, size_t(3) * C, q0, T, D);
    load_tile(dOs, LD, dout + size_t(b) * T * C + size_t(h) * D, size_t(C), q0, T, D);
    const size_t row = (size_t(b) * H + h) * T + i;
    const float lse_i = i < T ? lse[row] : 0.0f, d_i = i < T ? dvec[row] : 0.0f;
    const float* pos = a.pos + size_t(b) * T;
    const float pi = i < T ? pos[i] : 0.0f;
    const int kind = a.bs.kind;
    const bool grads = partials != nullptr;
    const bool t5 = grads && kind == kT5;
    const float pa = grads && kind >= kLinear && kind <= kKerplePower ? a.bs.a[h] : 0.0f;
    const float pb = grads && (kind == kKerpleLog || kind == kKerplePower) ? a.bs.b[h] : 0.0f;
    double ga = 0.0, gb = 0.0;
    double gt[4] = {0.0, 0.0, 0.0, 0.0};  // T5: buckets tid + kThreads u
    float acc[kNK];
#pragma unroll
    for (int k = 0; k < kNK; k++) acc[k] = 0.0f;
    int k_first, j_last;
    key_range(q0, a, k_first, j_last);
    for (int k0 = k_first; k0 <= j_last; k0 += kTile) {
        __syncthreads();
        load_tile(Ks, LD, base + C, size_t(3) * C, k0, T, D);
        load_tile(Vs, LD, base + 2 * C, size_t(3) * C, k0, T, D);
        __syncthreads();
        float p[kCols], ds[kCols], s[kCols];
        const unsigned valid =
            tile_dlogits(p, ds, s, Qs, Ks, dOs, Vs, LD, q0, k0, r, q4, b, h, lse_i, d_i, a);
#pragma unroll
        for (int k = 0; k < kCols; k++) {
            const int c = q4 + 4 * k, j = k0 + c;
            const bool in = valid & (1u << k);
            Ss[r * kPS + c] = ds[k];
            if (t5) Bk[r * kPS + c] = in ? t5_bucket(a.bs, pi, pos[j]) : -1;
            if (!in) continue;
            const float v = ds[k];
            if (dtable != nullptr) dtable[row * T + j] += v;  // d logit / d table = 1
            if (!grads) continue;
            const float pj = pos[j];
            switch (kind) {
                case kLinear:  // d/da [-a d] = -d
                    ga -= double(v * (pi - pj));
                    break;
                case kKerpleLog: {  // d/da = -log(1 + b|d|), d/db = -a |d| / (1 + b|d|)
                    const float dd = fabsf(pi - pj), u = 1.0f + pb * dd;
                    ga -= double(v * logf(u));
                    gb -= double(v * pa * dd / u);
                    break;
                }
                case kKerplePower: {  // d/da = -|d|^b, d/db = -a |d|^b log|d|, 0 at d = 0
                    const float dd = fabsf(pi - pj);
                    if (dd > 0.0f) {
                        const float ld = logf(dd), pw = powf(dd, pb);
                        ga -= double(v * pw);
                        gb -= double(v * pa * pw * ld);
                    }
                    break;
                }
                default:
                    break;
            }
        }
        __syncthreads();  // Ss, Bk complete
        if (t5) t5_tile_grad(gt, Bk, Ss, kTile, kTile, kPS, tid, kThreads);
        const float* sr = Ss + r * kPS;
#pragma unroll
        for (int k = 0; k < kNK; k++) {
            const int d = q4 + 4 * k;
            if (d < D) {
                float x = acc[k];
                for (int c = 0; c < kTile; c++) x += sr[c] * Ks[c * LD + d];
                acc[k] = x;
            }
        }
    }
    if (i < T) {  // the old entries read before any is written (see add_old_entries)
        float* dq = dqkv + (size_t(b) * T + i) * 3 * C + size_t(h) * D;
        add_old_entries<kNK>(acc, dq, q4, D, a.scale);
#pragma unroll
        for (int k = 0; k < kNK; k++)
            if (q4 + 4 * k < D) dq[q4 + 4 * k] = acc[k];
    }
    if (grads) {
        const int chunks = gridDim.x;
        float* slot = partials + ((size_t(b) * H + h) * chunks + blockIdx.x) * kMaxT5Buckets;
        if (t5) {
            for (int u = 0; u < 4; u++) {
                const int x = tid + kThreads * u;
                if (x < a.bs.nb) slot[x] = float(gt[u]);
            }
        } else {
            ga = block_sum(ga, red);
            gb = block_sum(gb, red);
            if (tid == 0) {
                slot[0] = float(ga);
                slot[1] = float(gb);
            }
        }
    }
}

// Per key tile: dk, dv over the query tiles that attend to it.
template <int kD>
__global__ void flash_bwd_dkv_kernel(float* dqkv, const float* dout, const float* lse,
                                     const float* dvec, FlashArgs a) {
    extern __shared__ float sm[];  // Ks, Vs, Qs, dOs (kTile, LD) | Ps, Ss (kTile, kPS)
    constexpr int kNK = (kD + 3) / 4;
    const int D = a.D, LD = D + 1, C = a.C, T = a.T, H = a.H;
    float* Ks = sm;
    float* Vs = Ks + kTile * LD;
    float* Qs = Vs + kTile * LD;
    float* dOs = Qs + kTile * LD;
    float* Ps = dOs + kTile * LD;
    float* Ss = Ps + kTile * kPS;
    const int k0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, r = tid >> 2, q4 = tid & 3;
    const float* base = a.qkv + size_t(b) * T * 3 * C + size_t(h) * D;
    const float* dbase = dout + size_t(b) * T * C + size_t(h) * D;
    load_tile(Ks, LD, base + C, size_t(3) * C, k0, T, D);
    load_tile(Vs, LD, base + 2 * C, size_t(3) * C, k0, T, D);
    float dk[kNK], dv[kNK];
#pragma unroll
    for (int k = 0; k < kNK; k++) dk[k] = dv[k] = 0.0f;
    const int j_last = min(T - 1, k0 + kTile - 1);
    const int i_last = a.window > 0 ? min(T - 1, j_last + a.window - 1) : T - 1;
    for (int q0 = k0; q0 <= i_last; q0 += kTile) {  // k0 is tile aligned: query tiles from k0
        __syncthreads();
        load_tile(Qs, LD, base, size_t(3) * C, q0, T, D);
        load_tile(dOs, LD, dbase, size_t(C), q0, T, D);
        __syncthreads();
        const int i = q0 + r;
        const size_t row = (size_t(b) * H + h) * T + i;
        const float lse_i = i < T ? lse[row] : 0.0f, d_i = i < T ? dvec[row] : 0.0f;
        float p[kCols], ds[kCols], s[kCols];
        tile_dlogits(p, ds, s, Qs, Ks, dOs, Vs, LD, q0, k0, r, q4, b, h, lse_i, d_i, a);
#pragma unroll
        for (int k = 0; k < kCols; k++) {
            Ps[r * kPS + q4 + 4 * k] = p[k];
            Ss[r * kPS + q4 + 4 * k] = ds[k];
        }
        __syncthreads();
        // thread (r, q4) now accumulates key row c = r of the tile
#pragma unroll
        for (int k = 0; k < kNK; k++) {
            const int d = q4 + 4 * k;
            if (d < D) {
                float xv = dv[k], xk = dk[k];
                for (int rr = 0; rr < kTile; rr++) {
                    xv += Ps[rr * kPS + r] * dOs[rr * LD + d];
                    xk += Ss[rr * kPS + r] * Qs[rr * LD + d];
                }
                dv[k] = xv;
                dk[k] = xk;
            }
        }
    }
    const int j = k0 + r;
    if (j < T) {
        float* g = dqkv + (size_t(b) * T + j) * 3 * C + size_t(h) * D;
        add_old_entries<kNK>(dk, g + C, q4, D, a.scale);
        add_old_entries<kNK>(dv, g + 2 * C, q4, D, 1.0f);
#pragma unroll
        for (int k = 0; k < kNK; k++) {
            const int d = q4 + 4 * k;
            if (d < D) {
                g[C + d] = dk[k];
                g[2 * C + d] = dv[k];
            }
        }
    }
}

// ================================================================ launch helpers

FlashArgs make_args(const float* qkv, const float* positions, int T, int C, int H, KeyMask mask,
                    const BiasArgs& bias) {
    FlashArgs a;
    a.qkv = qkv;
    a.pos = positions;
    a.T = T;
    a.C = C;
    a.H = H;
    a.D = C / H;
    a.window = mask.window;
    a.doc_start = mask.doc_start;
    a.scale = 1.0f / sqrtf(float(a.D));
    a.bs = bias;
    return a;
}

template <int kD>
cudaError_t flash_forward_t(float* out, float* lse, const FlashArgs& a, int B, cudaStream_t s) {
    // every head dim <= kD launches with at most kD's bytes: raise the limit once, to that
    static DynamicSharedLimit limit;
    if (const cudaError_t e = limit.raise(flash_fwd_kernel<kD>, flash_forward_smem_bytes(kD));
        e != cudaSuccess)
        return e;
    const size_t smem = flash_forward_smem_bytes(a.D);
    const dim3 grid((a.T + kTile - 1) / kTile, a.H, B);
    flash_fwd_kernel<kD><<<grid, kThreads, smem, s>>>(out, lse, a);
    return cudaGetLastError();
}

template <int kD>
cudaError_t flash_backward_t(float* dqkv, float* partials, float* dtable, const float* dout,
                             const float* lse, const float* dvec, const FlashArgs& a, int B,
                             cudaStream_t s) {
    static DynamicSharedLimit limit_dq, limit_dkv;
    const size_t most = flash_backward_smem_bytes(kD);  // every head dim <= kD, as the forward
    if (const cudaError_t e = limit_dq.raise(flash_bwd_dq_kernel<kD>, most); e != cudaSuccess)
        return e;
    if (const cudaError_t e = limit_dkv.raise(flash_bwd_dkv_kernel<kD>, most); e != cudaSuccess)
        return e;
    const size_t smem = flash_backward_smem_bytes(a.D);
    const dim3 grid((a.T + kTile - 1) / kTile, a.H, B);
    flash_bwd_dq_kernel<kD><<<grid, kThreads, smem, s>>>(dqkv, partials, dtable, dout, lse, dvec,
                                                         a);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    flash_bwd_dkv_kernel<kD><<<grid, kThreads, smem, s>>>(dqkv, dout, lse, dvec, a);
    return cudaGetLastError();
}

}  // namespace

size_t flash_forward_smem_bytes(int D) {
    return (size_t(3) * kTile * (D + 1) + size_t(kTile) * kPS) * sizeof(float);
}

size_t flash_backward_smem_bytes(int D) {
    // dq kernel: Qs, dOs, Ks, Vs | Ss | Bk (int); dkv kernel: Ks, Vs, Qs, dOs | Ps | Ss
    return (size_t(4) * kTile * (D + 1) + size_t(2) * kTile * kPS) * sizeof(float);
}

cudaError_t launch_flash_forward(float* out, float* lse, const float* qkv, const float* positions,
                                 int B, int T, int C, int H, KeyMask mask, const BiasArgs& bias,
                                 cudaStream_t s) {
    if (B <= 0 || T <= 0) return cudaSuccess;
    const FlashArgs a = make_args(qkv, positions, T, C, H, mask, bias);
    if (a.D <= 32) return flash_forward_t<32>(out, lse, a, B, s);
    if (a.D <= 64) return flash_forward_t<64>(out, lse, a, B, s);
    if (a.D <= 80) return flash_forward_t<80>(out, lse, a, B, s);
    if (a.D <= kFlashMaxHeadDim) return flash_forward_t<kFlashMaxHeadDim>(out, lse, a, B, s);
    return cudaErrorInvalidValue;
}

template <class Out>
cudaError_t dvec_t(float* dvec, const float* dout, const Out* out, int B, int T, int C, int H,
                   cudaStream_t s, float* zero_dq) {
    const size_t rows = size_t(B) * H * T;
    if (rows == 0) return cudaSuccess;
    const unsigned grid = unsigned((rows + kRowWarps - 1) / kRowWarps), threads = 32 * kRowWarps;
    flash_bwd_dvec_kernel<Out><<<grid, threads, 0, s>>>(dvec, dout, out, B, T, C, H, zero_dq);
    return cudaGetLastError();
}

cudaError_t launch_flash_dvec(float* dvec, const float* dout, const float* out, int B, int T, int C,
                              int H, cudaStream_t s, float* zero_dq) {
    return dvec_t(dvec, dout, out, B, T, C, H, s, zero_dq);
}

cudaError_t launch_flash_dvec(float* dvec, const float* dout, const uint16_t* out16, int B, int T,
                              int C, int H, cudaStream_t s, float* zero_dq) {
    return dvec_t(dvec, dout, out16, B, T, C, H, s, zero_dq);
}

cudaError_t launch_flash_backward(float* dqkv, float* dvec, float* partials, float* dtable,
                                  const float* dout, const float* qkv, const float* out,
                                  const float* lse, const float* positions, int B, int T, int C,
                                  int H, KeyMask mask, const BiasArgs& bias, cudaStream_t s) {
    if (B <= 0 || T <= 0) return cudaSuccess;
    const FlashArgs a = make_args(qkv, positions, T, C, H, mask, bias);
    if (a.D > kFlashMaxHeadDim) return cudaErrorInvalidValue;
    if (cudaError_t e = launch_flash_dvec(dvec, dout, out, B, T, C, H, s); e != cudaSuccess)
        return e;
    if (a.D <= 32) return flash_backward_t<32>(dqkv, partials, dtable, dout, lse, dvec, a, B, s);
    if (a.D <= 64) return flash_backward_t<64>(dqkv, partials, dtable, dout, lse, dvec, a, B, s);
    if (a.D <= 80) return flash_backward_t<80>(dqkv, partials, dtable, dout, lse, dvec, a, B, s);
    return flash_backward_t<kFlashMaxHeadDim>(dqkv, partials, dtable, dout, lse, dvec, a, B, s);
}

}  // namespace ctx::cuda
