// CUDA backend kernels: rotary position embedding and the non-matmul parts of causal attention
// with per-token float positions (bias families evaluated in-kernel on real-valued distances, an
// explicit bias table, the sliding window), its backward, and attention over a key/value cache.
// The matrix products (q k^T, P v and their gradients) are cuBLAS calls made by the host side,
// cuda_attention_ops.cpp, which also documents the overall flow.
//
// This is the attention's materialised mode (AttentionMode::Materialised): the forward writes the
// (B, H, T, T) probabilities that mode saves for backward, and the backward reads them. The flash
// mode (cuda_flash.cu) replaces launch_attention_softmax + the two cuBLAS products with one tiled
// kernel (online softmax over key tiles, bias evaluated per tile with the same bias_value() of
// cuda_bias.cuh, only a (B, H, T) log-sum-exp saved) and recomputes the probabilities tile by tile
// in backward; its bias parameter gradients are per-tile partial sums reduced by
// launch_attention_bias_grad_reduce below.
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/cuda_bias.cuh"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_rotary.cuh"

namespace ctx::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;  // row kernels: one warp per attention row

// ================================================================ rotary

// One thread per (token, pair k): its rotation (cuda_rotary.cuh), then every head's q and k pair.
__global__ void rotary_kernel(float* qkv, const float* positions, int BT, int C, int H,
                              RotaryArgs r, float sign) {
    const int half = r.dr / 2, D = C / H;
    const int stride = r.layout == 0 ? 1 : 2;     // index of x0 of pair k
    const int offset = r.layout == 0 ? half : 1;  // x1 = x0 + offset
    const size_t total = size_t(BT) * half;
    for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
         idx += size_t(gridDim.x) * blockDim.x) {
        const int bt = int(idx / half), k = int(idx % half);
        const PairRotation rt = pair_rotation(positions[bt], k, r);
        const float sa = sign * rt.s;
        float* x = qkv + size_t(bt) * 3 * C;
        for (int h = 0; h < H; h++) {
            float* q0 = x + h * D + k * stride;
            float* q1 = q0 + offset;
            const float a0 = *q0, a1 = *q1;
            *q0 = rotated_first(rt.c, sa, rt.sq, a0, a1);
            *q1 = rotated_second(rt.c, sa, rt.sq, a0, a1);
            float* k0 = x + C + h * D + k * stride;
            float* k1 = k0 + offset;
            const float b0 = *k0, b1 = *k1;
            *k0 = rotated_first(rt.c, sa, rt.sk, b0, b1);
            *k1 = rotated_second(rt.c, sa, rt.sk, b0, b1);
        }
    }
}

__global__ void rotary_table_kernel(PairRotation* table, const float* positions, int BT,
                                    RotaryArgs r) {
    const int half = r.dr / 2;
    const size_t total = size_t(BT) * half;
    for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
         idx += size_t(gridDim.x) * blockDim.x)
        table[idx] = pair_rotation(positions[idx / half], int(idx % half), r);
}

// ================================================================ attention forward

// One warp per row (b, h, i) of att (B, H, T, T), which holds q.k / sqrt(D) on entry.
__global__ void attention_softmax_kernel(float* att, const float* positions, int B, int H, int T,
                                         KeyMask mask, BiasArgs bs) {
    const int lane = threadIdx.x & 31;
    const size_t row = size_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
    if (row >= size_t(B) * H * T) return;
    const int i = int(row % T);
    const size_t bh = row / T;
    const int h = int(bh % H), b = int(bh / H);
    float* r = att + row * T;
    const float* pos = positions + size_t(b) * T;
    const float pi = pos[i];
    const int lo = key_lo(mask, b, T, i);
    const float* trow = bs.kind == kTable ? bs.table + row * T : nullptr;
    float mx = -INFINITY;
    for (int j = lane; j < T; j += 32) {
        if (j < lo || j > i) {
            r[j] = 0.0f;
            continue;
        }
        const float x = r[j] + bias_value(bs, h, pi, pos[j], trow, j);
        r[j] = x;
        mx = fmaxf(mx, x);
    }
    mx = warp_max(mx);
    // The next loop reads entries other lanes wrote (its lanes start at lo, not 0): only
    // __syncwarp orders memory between lanes (a shuffle does not).
    __syncwarp();
    float sum = 0.0f;
    for (int j = lo + lane; j <= i; j += 32) {
        const float e = expf(r[j] - mx);
        r[j] = e;
        sum += e;
    }
    const float inv = 1.0f / warp_sum(sum);
    for (int j = lo + lane; j <= i; j += 32) r[j] *= inv;
}

// ================================================================ attention backward

// One warp per row (h, i) of one batch row: dS = P (dP - sum_j P dP), 0 outside the mask.
__global__ void attention_dlogits_kernel(float* ds, const float* att, float* dtable, int H, int T,
                                         KeyMask mask_b) {
    const int lane = threadIdx.x & 31;
    const size_t row = size_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
    if (row >= size_t(H) * T) return;
    const int i = int(row % T), lo = key_lo(mask_b, 0, T, i);
    const float* p = att + row * T;
    float* d = ds + row * T;
    float dot = 0.0f;
    for (int j = lo + lane; j <= i; j += 32) dot += p[j] * d[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32) {
        const bool in = j >= lo && j <= i;
        const float v = in ? p[j] * (d[j] - dot) : 0.0f;
        d[j] = v;
        if (in && dtable != nullptr) dtable[row * T + j] += v;  // d logit / d table = 1
    }
}

// Block (chunk of kBiasGradRows query rows, head h) of one batch row b. Warps take rows, lanes
// take keys. Linear/KERPLE: per-thread double sums, then a block tree. T5: one histogram per warp
// in shared memory; within a warp the 32 lanes' contributions are added one lane at a time by
// the lane that owns the bucket (bucket % 32), so every bucket is summed in a fixed order.
__global__ void bias_grad_partials_kernel(float* partials, const float* ds, const float* pos,
                                          int b, int H, int T, KeyMask mask_b, BiasArgs bs,
                                          int chunks) {
    extern __shared__ double hist[];  // T5: (kWarpsPerBlock, nb)
    __shared__ double red[32];
    const int chunk = blockIdx.x, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool t5 = bs.kind == kT5;
    const int nb = bs.nb;
    if (t5)
        for (int x = threadIdx.x; x < kWarpsPerBlock * nb; x += blockDim.x) hist[x] = 0.0;
    __syncthreads();
    const float a = (bs.kind >= kLinear && bs.kind <= kKerplePower) ? bs.a[h] : 0.0f;
    const float bb = (bs.kind == kKerpleLog || bs.kind == kKerplePower) ? bs.b[h] : 0.0f;
    double ga = 0.0, gb = 0.0;
    const int i_end = min(T, (chunk + 1) * kBiasGradRows);
    for (int i = chunk * kBiasGradRows + warp; i < i_end; i += kWarpsPerBlock) {
        const int lo = key_lo(mask_b, 0, T, i);
        const float* dsr = ds + (size_t(h) * T + i) * T;
        const float pi = pos[i];
        for (int j0 = lo; j0 <= i; j0 += 32) {  // uniform over the warp
            const int j = j0 + lane;
            const bool valid = j <= i;
            const float v = valid ? dsr[j] : 0.0f;
            const float pj = valid ? pos[j] : pi;
            switch (bs.kind) {
                case kLinear:  // d/da [-a d] = -d
                    ga -= double(v * (pi - pj));
                    break;
                case kKerpleLog: {  // d/da = -log(1 + b|d|), d/db = -a |d| / (1 + b|d|)
                    const float d = fabsf(pi - pj), u = 1.0f + bb * d;
                    ga -= double(v * logf(u));
                    gb -= double(v * a * d / u);
                    break;
                }
                case kKerplePower: {  // d/da = -|d|^b, d/db = -a |d|^b log|d|, 0 at d = 0
                    const float d = fabsf(pi - pj);
                    if (valid && d > 0.0f) {
                        const float ld = logf(d), pw = powf(d, bb);
                        ga -= double(v * pw);
                        gb -= double(v * a * pw * ld);
                    }
                    break;
                }
                case kT5: {
                    const int bucket = valid ? t5_bucket(bs, pi, pj) : 0;
                    double* hw = hist + size_t(warp) * nb;
                    for (int l = 0; l < 32; l++) {
                        const int bl = __shfl_sync(kFullMask, bucket, l);
                        const float vl = __shfl_sync(kFullMask, v, l);
                        if ((bl & 31) == lane) hw[bl] += double(vl);
                    }
                    break;
                }
                default:
                    break;
            }
        }
    }
    __syncthreads();
    float* slot = partials + ((size_t(b) * H + h) * chunks + chunk) * kMaxT5Buckets;
    if (t5) {
        for (int x = threadIdx.x; x < nb; x += blockDim.x) {
            double s = 0.0;
            for (int w = 0; w < kWarpsPerBlock; w++) s += hist[size_t(w) * nb + x];
            slot[x] = float(s);
        }
    } else {
        ga = block_sum(ga, red);
        gb = block_sum(gb, red);
        if (threadIdx.x == 0) {
            slot[0] = float(ga);
            slot[1] = float(gb);
        }
    }
}

// One thread per (head, slot): the partials of every (b, chunk) in a fixed order.
__global__ void bias_grad_reduce_kernel(float* da, float* db, const float* partials, int B, int H,
                                        int chunks, int kind, int nslots, int nb) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= H * nslots) return;
    const int h = idx / nslots, x = idx % nslots;
    double s = 0.0;
    for (int b = 0; b < B; b++)
        for (int c = 0; c < chunks; c++)
            s += partials[((size_t(b) * H + h) * chunks + c) * kMaxT5Buckets + x];
    if (kind == kT5) {
        if (da != nullptr) da[size_t(h) * nb + x] += float(s);
    } else if (x == 0) {
        if (da != nullptr) da[h] += float(s);
    } else if (kind != kLinear && db != nullptr) {
        db[h] += float(s);
    }
}

// ================================================================ attention over a KV cache

constexpr int kCachedThreads = 128;  // keys per tile

// One block per (row b, head h, query i); keys in tiles of kCachedThreads with an online softmax
// (running max m, running sum l, rescaled output accumulator), so no (S) score buffer is needed.
__global__ void attention_cached_kernel(float* out, const float* qkv, const float* kc,
                                        const float* vc, const float* kpos, const int32_t* lens,
                                        int Tq, int S, int C, int H, int window, float scale,
                                        BiasArgs bs, const int32_t* heads, int HS) {
    extern __shared__ float sm[];  // q (D) | acc (D) | p (kCachedThreads)
    __shared__ float red[32];
    const int idx = blockIdx.x;
    // With a head subset (contextual sparsity) block h of a query runs its h-th listed head.
    const int b = idx / (HS * Tq), i = idx % Tq;
    int h = (idx / Tq) % HS;
    if (heads) {
        h = heads[(size_t(b) * Tq + i) * HS + h];
        if (h < 0) return;  // the whole block: before any barrier
    }
    const int D = C / H, tid = threadIdx.x;
    float* qs = sm;
    float* acc = sm + D;
    float* ps = sm + 2 * D;
    const int c = lens[b] - Tq + i, lo = key_start(c, window);
    const float* q = qkv + (size_t(b) * Tq + i) * 3 * C + size_t(h) * D;
    const float* k = kc + size_t(b) * S * C + size_t(h) * D;  // (S, D), ld C
    const float* v = vc + size_t(b) * S * C + size_t(h) * D;  // (S, D), ld C
    const float* pos = kpos + size_t(b) * S;
    const float pc = pos[c];
    const float* trow = bs.kind == kTable ? bs.table + ((size_t(b) * H + h) * Tq + i) * S : nullptr;
    for (int d = tid; d < D; d += blockDim.x) {
        qs[d] = q[d];
        acc[d] = 0.0f;
    }
    __syncthreads();
    float m = -INFINITY, l = 0.0f;
    for (int t0 = lo; t0 <= c; t0 += kCachedThreads) {  // uniform over the block
        const int j = t0 + tid;
        float s = -INFINITY;
        if (j <= c) {
            const float* kj = k + size_t(j) * C;
            float dot = 0.0f;
            for (int d = 0; d < D; d++) dot += qs[d] * kj[d];
            s = dot * scale + bias_value(bs, h, pc, pos[j], trow, j);
        }
        const float mn = fmaxf(m, block_max(s, red));
        const float p = j <= c ? expf(s - mn) : 0.0f;
        ps[tid] = p;
        const float tile_sum = block_sum(p, red);  // its barriers also publish ps
        const float corr = m == -INFINITY ? 0.0f : expf(m - mn);
        l = l * corr + tile_sum;
        const int nk = min(kCachedThreads, c - t0 + 1);
        for (int d = tid; d < D; d += blockDim.x) {  // each thread owns its acc[d]
            float a = acc[d] * corr;
            for (int jj = 0; jj < nk; jj++) a += ps[jj] * v[size_t(t0 + jj) * C + d];
            acc[d] = a;
        }
        m = mn;
        __syncthreads();  // ps is rewritten by the next tile
    }
    float* o = out + (size_t(b) * Tq + i) * C + size_t(h) * D;
    const float inv = 1.0f / l;
    for (int d = tid; d < D; d += blockDim.x) o[d] = acc[d] * inv;
}

}  // namespace

// ================================================================ launchers

cudaError_t launch_rotary(float* qkv, const float* positions, int BT, int C, int H,
                          const RotaryArgs& r, float sign, cudaStream_t s) {
    const size_t total = size_t(BT) * size_t(r.dr / 2);
    if (total == 0) return cudaSuccess;
    rotary_kernel<<<grid_for(total, 128), 128, 0, s>>>(qkv, positions, BT, C, H, r, sign);
    return cudaGetLastError();
}

cudaError_t launch_rotary_table(float* table, const float* positions, int BT, const RotaryArgs& r,
                                cudaStream_t s) {
    const size_t total = size_t(BT) * size_t(r.dr / 2);
    if (total == 0) return cudaSuccess;
    rotary_table_kernel<<<grid_for(total, 128), 128, 0, s>>>(reinterpret_cast<PairRotation*>(table),
                                                             positions, BT, r);
    return cudaGetLastError();
}

cudaError_t launch_attention_softmax(float* att, const float* positions, int B, int H, int T,
                                     KeyMask mask, const BiasArgs& bias, cudaStream_t s) {
    const size_t rows = size_t(B) * H * T;
    if (rows == 0) return cudaSuccess;
    const size_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    attention_softmax_kernel<<<unsigned(blocks), 32 * kWarpsPerBlock, 0, s>>>(att, positions, B,
                                                                               H, T, mask, bias);
    return cudaGetLastError();
}

cudaError_t launch_attention_dlogits(float* ds, const float* att_b, float* dtable_b, int H, int T,
                                     KeyMask mask_b, cudaStream_t s) {
    const size_t rows = size_t(H) * T;
    if (rows == 0) return cudaSuccess;
    const size_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    attention_dlogits_kernel<<<unsigned(blocks), 32 * kWarpsPerBlock, 0, s>>>(ds, att_b, dtable_b,
                                                                               H, T, mask_b);
    return cudaGetLastError();
}

cudaError_t launch_attention_bias_grad_partials(float* partials, const float* ds,
                                                const float* pos_b, int b, int H, int T,
                                                KeyMask mask_b, const BiasArgs& bias,
                                                cudaStream_t s) {
    const int chunks = (T + kBiasGradRows - 1) / kBiasGradRows;
    const size_t shared = bias.kind == kT5 ? size_t(kWarpsPerBlock) * bias.nb * sizeof(double) : 0;
    const dim3 grid(chunks, H);
    bias_grad_partials_kernel<<<grid, 32 * kWarpsPerBlock, shared, s>>>(partials, ds, pos_b, b, H,
                                                                        T, mask_b, bias, chunks);
    return cudaGetLastError();
}

cudaError_t launch_attention_bias_grad_reduce(float* da, float* db, const float* partials, int B,
                                              int H, int T, int kind, int nb, cudaStream_t s) {
    const int chunks = (T + kBiasGradRows - 1) / kBiasGradRows;
    const int nslots = kind == kT5 ? nb : 2;
    const int total = H * nslots;
    bias_grad_reduce_kernel<<<(total + 127) / 128, 128, 0, s>>>(da, db, partials, B, H, chunks,
                                                                 kind, nslots, nb);
    return cudaGetLastError();
}

cudaError_t launch_attention_cached(float* out, const float* qkv, const float* kc,
                                    const float* vc, const float* kpos, const int32_t* lens, int B,
                                    int Tq, int S, int C, int H, int window, const BiasArgs& bias,
                                    const int32_t* heads, int HS, cudaStream_t s) {
    const int blocks = B * HS * Tq;
    if (blocks == 0) return cudaSuccess;
    const int D = C / H;
    const float scale = 1.0f / sqrtf(float(D));
    const size_t shared = (2 * size_t(D) + kCachedThreads) * sizeof(float);
    attention_cached_kernel<<<blocks, kCachedThreads, shared, s>>>(out, qkv, kc, vc, kpos, lens,
                                                                   Tq, S, C, H, window, scale,
                                                                   bias, heads, HS);
    return cudaGetLastError();
}

}  // namespace ctx::cuda
