// CUDA backend kernels: elementwise ops, sum of squares, embedding, layer norm, column sums,
// GELU, the vocabulary-parallel cross-entropy and AdamW (fp32; the whole-row softmax
// cross-entropy is cuda_lm_head.cu's). The host side (validation, cuBLAS matmuls,
// staging of host inputs) lives in cuda_dense_ops.cpp; the op contract in backend/backend.h.
//
// Determinism: no kernel here uses atomics. Reductions over rows (dbias, layernorm dw/db) are two
// stages with a chunking that depends on the shapes only; the embedding scatter is grouped by
// destination row on the host (each destination row is owned by one block).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "backend/cuda/cuda_activation.cuh"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace ctx::cuda {

namespace {

constexpr int kThreads = 256;

// An output element in the storage of its buffer: fp32, or bf16 rounded to nearest even (bf16
// activation storage, Backend::bf16_activations). Each kernel that writes an activation a
// product reads is templated on it, so both storages compute the same fp32 value.
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// ================================================================ elementwise

__global__ void add_kernel(float* out, const float* a, const float* b, size_t n) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        out[i] = a[i] + b[i];  // out may alias a or b: read before write, same index
}

__global__ void accumulate_kernel(float* y, const float* x, size_t n) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        y[i] += x[i];
}

// dst[r * ds + c] (=, += when acc) src[r * ss + c], one thread per element of (rows, cols).
__global__ void copy_2d_kernel(float* dst, size_t ds, const float* src, size_t ss, size_t rows,
                               size_t cols, bool acc) {
    const size_t n = rows * cols;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const size_t r = i / cols, c = i % cols;
        const float x = src[r * ss + c];
        if (acc) {
            dst[r * ds + c] += x;
        } else {
            dst[r * ds + c] = x;
        }
    }
}

__global__ void scale_kernel(float* x, float v, size_t n) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        x[i] *= v;
}

__global__ void sum_squares_kernel(double* partials, const float* x, size_t n) {
    __shared__ double red[32];
    double acc = 0.0;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const double v = x[i];
        acc += v * v;
    }
    acc = block_sum(acc, red);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// ================================================================ embedding

// One block per token row n.
__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* positions,
                                         const float* wte, const float* wpe, int C, int V, int P,
                                         int vocab_begin) {
    const int n = blockIdx.x;
    const int tok = tokens[n] - vocab_begin;
    const bool here = tok >= 0 && tok < V;  // another vocabulary shard's token: a zero row
    float* o = out + size_t(n) * C;
    const float* e = wte + size_t(here ? tok : 0) * C;
    if (wpe == nullptr) {
        for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = here ? e[c] : 0.0f;
        return;
    }
    // interp (backend.h): j0 = floor(p), f = p - j0, rows j0 and min(j0 + 1, P - 1)
    const float p = positions[n];
    int j0 = int(floorf(p));
    j0 = j0 < 0 ? 0 : (j0 > P - 1 ? P - 1 : j0);
    const int j1 = j0 + 1 < P ? j0 + 1 : P - 1;
    const float f = p - float(j0), w0 = 1.0f - f;
    const float* e0 = wpe + size_t(j0) * C;
    const float* e1 = wpe + size_t(j1) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        o[c] = (here ? e[c] : 0.0f) + w0 * e0[c] + f * e1[c];
}

// One block per destination group; the group's source rows are summed in their listed order.
__global__ void grouped_row_add_kernel(float* dst, const float* dout, const int32_t* target,
                                       const int32_t* start, const int32_t* row,
                                       const float* weight, int C) {
    const int g = blockIdx.x;
    const int k0 = start[g], k1 = start[g + 1];
    float* d = dst + size_t(target[g]) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.0f;
        for (int k = k0; k < k1; k++) {
            const float w = weight != nullptr ? weight[k] : 1.0f;
            s += w * dout[size_t(row[k]) * C + c];
        }
        d[c] += s;
    }
}

// ================================================================ layer norm

constexpr int kRowsPerBlock = 4;  // one warp per row

// Rms: RMS norm (no centering, no bias, mean not written): the same kernels with m = 0.
// K > 0 (C <= 32 K): the warp keeps its row in registers (K values per lane, columns
// lane + 32 k), so x is read from memory once instead of once per pass (mean, variance,
// output), in the same order of sums as K = 0.
template <bool Rms, int K, class Out>
__global__ void layernorm_forward_kernel(Out* out, float* mean, float* rstd, const float* inp,
                                         const float* w, const float* b, int N, int C, float eps) {
    const int n = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (n >= N) return;
    const float* x = inp + size_t(n) * C;
    Out* y = out + size_t(n) * C;
    constexpr int KR = K > 0 ? K : 1;
    float xr[KR] = {};  // K > 0: x[lane + 32 k]
    auto row = [&](int k, int c) {
        if constexpr (K > 0)
            return xr[k];
        else
            return x[c];
    };
    if constexpr (K > 0)
#pragma unroll
        for (int k = 0; k < K; k++) xr[k] = lane + 32 * k < C ? x[lane + 32 * k] : 0.0f;
    // the columns of this lane, k = 0, 1, ... (K = 0: until past C)
    auto each = [&](auto&& f) {
        if constexpr (K > 0) {
#pragma unroll
            for (int k = 0; k < K; k++)
                if (lane + 32 * k < C) f(k, lane + 32 * k);
        } else {
            for (int c = lane, k = 0; c < C; c += 32, k++) f(k, c);
        }
    };
    float sum = 0.0f;
    if (!Rms) each([&](int k, int c) { sum += row(k, c); });
    const float m = Rms ? 0.0f : warp_sum(sum) / float(C);
    float var = 0.0f;
    each([&](int k, int c) {
        const float d = row(k, c) - m;
        var += d * d;
    });
    const float s = 1.0f / sqrtf(warp_sum(var) / float(C) + eps);
    each([&](int k, int c) {
        const float v = (row(k, c) - m) * s * w[c];
        store(y + c, b != nullptr ? v + b[c] : v);
    });
    if (lane == 0) {
        if (!Rms) mean[n] = m;
        rstd[n] = s;
    }
}

template <bool Rms>
__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                               const float* w, const float* mean,
                                               const float* rstd, int N, int C) {
    const int n = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (n >= N) return;
    const float* x = inp + size_t(n) * C;
    const float* dy = dout + size_t(n) * C;
    float* dx = dinp + size_t(n) * C;
    const float m = Rms ? 0.0f : mean[n], s = rstd[n];
    float dm = 0.0f, dnm = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float dnorm = w[c] * dy[c];
        dm += dnorm;
        dnm += dnorm * (x[c] - m) * s;
    }
    dm = Rms ? 0.0f : warp_sum(dm) / float(C);  // RMS norm: no centering, no mean term
    dnm = warp_sum(dnm) / float(C);
    for (int c = lane; c < C; c += 32) {
        const float norm = (x[c] - m) * s;
        dx[c] += (w[c] * dy[c] - dm - norm * dnm) * s;
    }
}

// ================================================================ column reductions (two stages)
// Stage 1: block (32 columns x 8 row lanes) per (column tile, row chunk) writes the chunk's sum of
// each column; stage 2: one thread per column adds the chunks in order. Block shape: kColTile x
// kColLanes (cuda_kernels.h).

// mode 0: sum of x; mode 1: layernorm (sum of (x - mean) rstd dout -> part0, of dout -> part1;
// mean null: RMS norm, x rstd dout)
template <int Mode>
__global__ void column_partials_kernel(float* part0, float* part1, const float* x,
                                       const float* dout, const float* mean, const float* rstd,
                                       int N, int C, int rows_per_chunk) {
    __shared__ float s0[kColLanes][kColTile + 1], s1[kColLanes][kColTile + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int c = blockIdx.x * kColTile + tx, g = blockIdx.y;
    const int r0 = g * rows_per_chunk;
    const int r1 = min(N, r0 + rows_per_chunk);
    float a0 = 0.0f, a1 = 0.0f;
    if (c < C) {
        for (int r = r0 + ty; r < r1; r += kColLanes) {
            const size_t idx = size_t(r) * C + c;
            if (Mode == 0) {
                a0 += x[idx];
            } else {
                const float dy = dout[idx];
                a0 += (x[idx] - (mean != nullptr ? mean[r] : 0.0f)) * rstd[r] * dy;
                a1 += dy;
            }
        }
    }
    s0[ty][tx] = a0;
    s1[ty][tx] = a1;
    __syncthreads();
    if (ty == 0 && c < C) {
        float t0 = 0.0f, t1 = 0.0f;
        for (int k = 0; k < kColLanes; k++) {
            t0 += s0[k][tx];
            t1 += s1[k][tx];
        }
        part0[size_t(g) * C + c] = t0;
        if (Mode == 1 && part1 != nullptr) part1[size_t(g) * C + c] = t1;
    }
}

__global__ void column_finish_kernel(float* out, const float* part, int G, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int g = 0; g < G; g++) s += part[size_t(g) * C + c];
    out[c] += s;
}

__global__ void broadcast_rows_kernel(float* out, const float* bias, int N, int C) {
    const size_t total = size_t(N) * C;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += size_t(gridDim.x) * blockDim.x)
        out[i] = bias[i % size_t(C)];
}

// ================================================================ GELU

// act: 0 = GeluTanh, 1 = GeluErf, 3 = Relu (Activation's values). inp16, when not null, gets
// the input rounded to bf16 (the MLP's pre-activation kept for the backward pass).
template <class Out>
__global__ void activation_forward_kernel(Out* out, __nv_bfloat16* inp16, const float* inp,
                                          size_t n, int act) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const float x = inp[i];
        if (inp16 != nullptr) inp16[i] = __float2bfloat16_rn(x);
        if (act == 0) {
            const float u = kGeluTanhScale * (x + kGeluCubic * x * x * x);
            store(out + i, 0.5f * x * (1.0f + tanhf(u)));
        } else if (act == 3) {
            store(out + i, x > 0.0f ? x : 0.0f);
        } else {
            store(out + i, 0.5f * x * (1.0f + erff(x * kInvSqrt2)));
        }
    }
}

// SwiGLU over rows of inp (N, 2F) = [gate | up]: one thread per output element (n, f); inp16
// as in activation_forward_kernel.
template <class Out>
__global__ void swiglu_forward_kernel(Out* out, __nv_bfloat16* inp16, const float* inp, int N,
                                      int F) {
    const size_t total = size_t(N) * F;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += size_t(gridDim.x) * blockDim.x) {
        const size_t n = i / F, f = i % F;
        const float g = inp[n * 2 * F + f], u = inp[n * 2 * F + F + f];
        if (inp16 != nullptr) {
            inp16[n * 2 * F + f] = __float2bfloat16_rn(g);
            inp16[n * 2 * F + F + f] = __float2bfloat16_rn(u);
        }
        store(out + i, g / (1.0f + expf(-g)) * u);
    }
}

// acc: add into dinp, else write over it (GradStore)
__global__ void swiglu_backward_kernel(float* dinp, const float* inp, const float* dout, int N,
                                       int F, bool acc) {
    const size_t total = size_t(N) * F;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += size_t(gridDim.x) * blockDim.x) {
        const size_t n = i / F, f = i % F;
        const float g = inp[n * 2 * F + f], u = inp[n * 2 * F + F + f], dy = dout[i];
        float* dg = dinp + n * 2 * F + f;
        const float d_gate = swiglu_gate_grad(g, u, dy), d_up = swiglu_up_grad(g, dy);
        dg[0] = acc ? dg[0] + d_gate : d_gate;
        dg[F] = acc ? dg[F] + d_up : d_up;
    }
}

// Grouped-query heads: one thread per element of the full (N, 3HD) rows. Forward copies from the
// grouped row; backward (one thread per grouped element) sums the G query heads' gradients, so
// no two threads write one element.
__global__ void kv_repeat_forward_kernel(float* qkv, const float* grouped, int N, int H, int Hkv,
                                         int D) {
    const size_t HD = size_t(H) * D, KD = size_t(Hkv) * D, total = size_t(N) * 3 * HD;
    const int G = H / Hkv;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += size_t(gridDim.x) * blockDim.x) {
        const size_t n = i / (3 * HD), c = i % (3 * HD);
        const float* src = grouped + n * (HD + 2 * KD);
        if (c < HD) {
            qkv[i] = src[c];
        } else {
            const size_t part = c / HD - 1, h = (c % HD) / D, d = c % D;  // part 0: k, 1: v
            qkv[i] = src[HD + part * KD + (h / G) * D + d];
        }
    }
}

__global__ void kv_repeat_backward_kernel(float* dgrouped, const float* dqkv, int N, int H,
                                          int Hkv, int D) {
    const size_t HD = size_t(H) * D, KD = size_t(Hkv) * D, row = HD + 2 * KD;
    const size_t total = size_t(N) * row;
    const int G = H / Hkv;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += size_t(gridDim.x) * blockDim.x) {
        const size_t n = i / row, c = i % row;
        const float* src = dqkv + n * 3 * HD;
        if (c < HD) {
            dgrouped[i] += src[c];
        } else {
            const size_t part = (c - HD) / KD, kvh = ((c - HD) % KD) / D, d = c % D;
            float sum = 0.0f;
            for (int g = 0; g < G; g++) sum += src[(part + 1) * HD + (kvh * G + g) * D + d];
            dgrouped[i] += sum;
        }
    }
}

__global__ void activation_backward_kernel(float* dinp, const float* inp, const float* dout,
                                           size_t n, int act, bool acc) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const float v = activation_grad(inp[i], act) * dout[i];
        dinp[i] = acc ? dinp[i] + v : v;
    }
}

// ================================================================ cross-entropy, vocabulary-parallel

// One block per row: this shard's max, sum of exp(logit - max), and the target's logit.
__global__ void crossentropy_shard_stats_kernel(float* stats, const float* logits,
                                                const int32_t* targets, int V, int vocab_begin) {
    __shared__ float red[32];
    const int n = blockIdx.x;
    const float* x = logits + size_t(n) * V;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += expf(x[i] - mx);
    sum = block_sum(sum, red);
    if (threadIdx.x == 0) {
        const int t = targets[n] - vocab_begin;
        stats[size_t(n) * 3] = mx;
        stats[size_t(n) * 3 + 1] = sum;
        stats[size_t(n) * 3 + 2] = t >= 0 && t < V ? x[t] : 0.0f;
    }
}

// One block per row: the global max and normaliser from every shard's stats (S, N, 3), in shard
// order (the CPU backend's order), then the loss and (dlogits != null) this shard's gradient.
__global__ void crossentropy_shard_finish_kernel(float* losses, float* dlogits,
                                                 const float* all_stats, int S, int N,
                                                 const int32_t* targets, const float* mask, int V,
                                                 int vocab_begin, float grad_scale) {
    const int n = blockIdx.x;
    const float mk = mask != nullptr ? mask[n] : 1.0f;
    float* dx = dlogits != nullptr ? dlogits + size_t(n) * V : nullptr;
    if (mk == 0.0f) {
        if (threadIdx.x == 0) losses[n] = 0.0f;
        if (dx != nullptr)
            for (int i = threadIdx.x; i < V; i += blockDim.x) dx[i] = 0.0f;
        return;
    }
    float M = -INFINITY, Z = 0.0f, xt = 0.0f;
    for (int s = 0; s < S; s++) M = fmaxf(M, all_stats[(size_t(s) * N + n) * 3]);
    for (int s = 0; s < S; s++) {
        const float* st = all_stats + (size_t(s) * N + n) * 3;
        Z += st[1] * expf(st[0] - M);
        xt += st[2];
    }
    if (threadIdx.x == 0) losses[n] = mk * (logf(Z) + M - xt);
    if (dx == nullptr) return;
    const float g = grad_scale * mk, sc = g / Z;
    const int t = targets[n] - vocab_begin;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float d = expf(dx[i] - M) * sc;
        dx[i] = i == t ? d - g : d;
    }
}

// ================================================================ AdamW

// One element's update (weight decay wd); both kernels below run this same code.
__device__ __forceinline__ void adamw_element(float* params, const float* grads, float* m, float* v,
                                              size_t i, const AdamWArgs& a, float wd) {
    const float g = grads[i] * a.grad_scale, b1 = a.beta1, b2 = a.beta2;
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi * a.inv_bc1, vhat = vi * a.inv_bc2;
    params[i] -= a.lr * (mhat / (sqrtf(vhat) + a.eps) + wd * params[i]);
}

__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, size_t n,
                             AdamWArgs a) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        adamw_element(params, grads, m, v, i, a, a.wd);
}

// Multi-tensor AdamW: block x updates chunk x (a piece of one segment, at most kAdamWChunk
// floats), decayed or not as its segment.
__global__ void adamw_chunks_kernel(float* params, const float* grads, float* m, float* v,
                                    const AdamWChunk* chunks, AdamWArgs a) {
    const AdamWChunk c = chunks[blockIdx.x];
    const float wd = c.decay ? a.wd : 0.0f;
    for (uint32_t k = threadIdx.x; k < c.n; k += blockDim.x)
        adamw_element(params, grads, m, v, c.offset + k, a, wd);
}

}  // namespace

// ================================================================ launchers

cudaError_t launch_add(float* out, const float* a, const float* b, size_t n, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    add_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, a, b, n);
    return cudaGetLastError();
}

cudaError_t launch_accumulate(float* y, const float* x, size_t n, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    accumulate_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(y, x, n);
    return cudaGetLastError();
}

cudaError_t launch_copy_2d(float* dst, size_t dst_stride, const float* src, size_t src_stride,
                           size_t rows, size_t cols, bool accumulate, cudaStream_t s) {
    if (rows == 0 || cols == 0) return cudaSuccess;
    copy_2d_kernel<<<grid_for(rows * cols, kThreads), kThreads, 0, s>>>(
        dst, dst_stride, src, src_stride, rows, cols, accumulate);
    return cudaGetLastError();
}

cudaError_t launch_scale(float* x, float v, size_t n, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    scale_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(x, v, n);
    return cudaGetLastError();
}

int sum_squares_partials(size_t n) {
    const size_t per_block = size_t(kThreads) * 16;
    size_t g = (n + per_block - 1) / per_block;
    return int(g < 1 ? 1 : (g > 1024 ? 1024 : g));
}

cudaError_t launch_sum_squares(double* partials, const float* x, size_t n, cudaStream_t s) {
    sum_squares_kernel<<<sum_squares_partials(n), kThreads, 0, s>>>(partials, x, n);
    return cudaGetLastError();
}

cudaError_t launch_embedding_forward(float* out, const int32_t* tokens, const float* positions,
                                     const float* wte, const float* wpe, int N, int C, int V,
                                     int P, int vocab_begin, cudaStream_t s) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    embedding_forward_kernel<<<N, 128, 0, s>>>(out, tokens, positions, wte, wpe, C, V, P,
                                               vocab_begin);
    return cudaGetLastError();
}

cudaError_t launch_grouped_row_add(float* dst, const float* dout, const int32_t* target,
                                   const int32_t* start, const int32_t* row, const float* weight,
                                   int G, int C, cudaStream_t s) {
    if (G <= 0 || C <= 0) return cudaSuccess;
    grouped_row_add_kernel<<<G, 128, 0, s>>>(dst, dout, target, start, row, weight, C);
    return cudaGetLastError();
}

namespace {

template <class Out>
cudaError_t layernorm_forward(Out* out, float* mean, float* rstd, const float* inp,
                              const float* w, const float* b, int N, int C, float eps,
                              cudaStream_t s) {
    if (N <= 0) return cudaSuccess;
    const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
    // the row in registers up to the one-pass backward's width (its buckets), else the loop
    static_assert(kNormOnePassMaxC == kRowInRegistersMaxC, "every width has its bucket");
    auto pick = [&](auto rms) {
        constexpr bool R = decltype(rms)::value;
        if (C > kRowInRegistersMaxC) return &layernorm_forward_kernel<R, 0, Out>;
        return with_row_width(
            C, [](auto K) { return &layernorm_forward_kernel<R, decltype(K)::value, Out>; });
    };
    auto* kernel = mean == nullptr ? pick(std::true_type{})  // RMS norm
                                   : pick(std::false_type{});
    kernel<<<blocks, 32 * kRowsPerBlock, 0, s>>>(out, mean, rstd, inp, w, b, N, C, eps);
    return cudaGetLastError();
}

__nv_bfloat16* as_bf16(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

}  // namespace

cudaError_t launch_layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                     const float* w, const float* b, int N, int C, float eps,
                                     cudaStream_t s) {
    return layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps, s);
}

cudaError_t launch_layernorm_forward(uint16_t* out, float* mean, float* rstd, const float* inp,
                                     const float* w, const float* b, int N, int C, float eps,
                                     cudaStream_t s) {
    return layernorm_forward(as_bf16(out), mean, rstd, inp, w, b, N, C, eps, s);
}

cudaError_t launch_layernorm_backward_dinp(float* dinp, const float* dout, const float* inp,
                                           const float* w, const float* mean, const float* rstd,
                                           int N, int C, cudaStream_t s) {
    if (N <= 0) return cudaSuccess;
    const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
    if (mean == nullptr)
        layernorm_backward_dinp_kernel<true><<<blocks, 32 * kRowsPerBlock, 0, s>>>(
            dinp, dout, inp, w, mean, rstd, N, C);
    else
        layernorm_backward_dinp_kernel<false><<<blocks, 32 * kRowsPerBlock, 0, s>>>(
            dinp, dout, inp, w, mean, rstd, N, C);
    return cudaGetLastError();
}

int column_chunks(int N) {
    const int g = (N + 31) / 32;
    return g < 1 ? 1 : (g > 64 ? 64 : g);
}

cudaError_t launch_layernorm_backward_params(float* dw, float* db, float* partials,
                                             const float* dout, const float* inp,
                                             const float* mean, const float* rstd, int N, int C,
                                             cudaStream_t s) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    const int G = column_chunks(N), rows = (N + G - 1) / G;
    float* p0 = partials;
    float* p1 = db != nullptr ? partials + size_t(G) * C : nullptr;
    const dim3 grid((C + kColTile - 1) / kColTile, G), block(kColTile, kColLanes);
    column_partials_kernel<1><<<grid, block, 0, s>>>(p0, p1, inp, dout, mean, rstd, N, C, rows);
    column_finish_kernel<<<(C + 127) / 128, 128, 0, s>>>(dw, p0, G, C);
    if (db != nullptr) column_finish_kernel<<<(C + 127) / 128, 128, 0, s>>>(db, p1, G, C);
    return cudaGetLastError();
}

cudaError_t launch_column_sum_add(float* out, float* partials, const float* x, int N, int C,
                                  cudaStream_t s) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    const int G = column_chunks(N), rows = (N + G - 1) / G;
    const dim3 grid((C + kColTile - 1) / kColTile, G), block(kColTile, kColLanes);
    column_partials_kernel<0>
        <<<grid, block, 0, s>>>(partials, nullptr, x, nullptr, nullptr, nullptr, N, C, rows);
    column_finish_kernel<<<(C + 127) / 128, 128, 0, s>>>(out, partials, G, C);
    return cudaGetLastError();
}

cudaError_t launch_column_finish_add(float* out, const float* partials, int G, int C,
                                     cudaStream_t s) {
    if (G <= 0 || C <= 0) return cudaSuccess;
    column_finish_kernel<<<(C + 127) / 128, 128, 0, s>>>(out, partials, G, C);
    return cudaGetLastError();
}

cudaError_t launch_broadcast_rows(float* out, const float* bias, int N, int C, cudaStream_t s) {
    const size_t total = size_t(N) * size_t(C);
    if (total == 0) return cudaSuccess;
    broadcast_rows_kernel<<<grid_for(total, kThreads), kThreads, 0, s>>>(out, bias, N, C);
    return cudaGetLastError();
}

cudaError_t launch_activation_forward(float* out, const float* inp, size_t n, int act,
                                      cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    activation_forward_kernel<float>
        <<<grid_for(n, kThreads), kThreads, 0, s>>>(out, nullptr, inp, n, act);
    return cudaGetLastError();
}

cudaError_t launch_activation_forward(uint16_t* out, const float* inp, size_t n, int act,
                                      cudaStream_t s, uint16_t* inp16) {
    if (n == 0) return cudaSuccess;
    activation_forward_kernel<__nv_bfloat16>
        <<<grid_for(n, kThreads), kThreads, 0, s>>>(as_bf16(out), as_bf16(inp16), inp, n, act);
    return cudaGetLastError();
}

cudaError_t launch_activation_backward(float* dinp, const float* inp, const float* dout, size_t n,
                                       int act, bool accumulate, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    activation_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(dinp, inp, dout, n,
                                                                          act, accumulate);
    return cudaGetLastError();
}

cudaError_t launch_swiglu_forward(float* out, const float* inp, int N, int F, cudaStream_t s) {
    const size_t n = size_t(N) * F;
    if (n == 0) return cudaSuccess;
    swiglu_forward_kernel<float>
        <<<grid_for(n, kThreads), kThreads, 0, s>>>(out, nullptr, inp, N, F);
    return cudaGetLastError();
}

cudaError_t launch_swiglu_forward(uint16_t* out, const float* inp, int N, int F, cudaStream_t s,
                                  uint16_t* inp16) {
    const size_t n = size_t(N) * F;
    if (n == 0) return cudaSuccess;
    swiglu_forward_kernel<__nv_bfloat16>
        <<<grid_for(n, kThreads), kThreads, 0, s>>>(as_bf16(out), as_bf16(inp16), inp, N, F);
    return cudaGetLastError();
}

cudaError_t launch_swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F,
                                   bool accumulate, cudaStream_t s) {
    const size_t n = size_t(N) * F;
    if (n == 0) return cudaSuccess;
    swiglu_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(dinp, inp, dout, N, F,
                                                                      accumulate);
    return cudaGetLastError();
}

cudaError_t launch_kv_repeat(float* qkv, float* dgrouped, const float* grouped,
                             const float* dqkv, int N, int H, int Hkv, int D, cudaStream_t s) {
    const size_t HD = size_t(H) * D, KD = size_t(Hkv) * D;
    if (dqkv == nullptr) {
        const size_t n = size_t(N) * 3 * HD;
        if (n == 0) return cudaSuccess;
        kv_repeat_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(qkv, grouped, N, H,
                                                                             Hkv, D);
    } else {
        const size_t n = size_t(N) * (HD + 2 * KD);
        if (n == 0) return cudaSuccess;
        kv_repeat_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(dgrouped, dqkv, N, H,
                                                                              Hkv, D);
    }
    return cudaGetLastError();
}

cudaError_t launch_crossentropy_shard_stats(float* stats, const float* logits,
                                            const int32_t* targets, int N, int V,
                                            int vocab_begin, cudaStream_t s) {
    if (N <= 0) return cudaSuccess;
    crossentropy_shard_stats_kernel<<<N, kThreads, 0, s>>>(stats, logits, targets, V,
                                                           vocab_begin);
    return cudaGetLastError();
}

cudaError_t launch_crossentropy_shard_finish(float* losses, float* dlogits,
                                             const float* all_stats, int S,
                                             const int32_t* targets, const float* mask, int N,
                                             int V, int vocab_begin, float grad_scale,
                                             cudaStream_t s) {
    if (N <= 0) return cudaSuccess;
    crossentropy_shard_finish_kernel<<<N, kThreads, 0, s>>>(losses, dlogits, all_stats, S, N,
                                                            targets, mask, V, vocab_begin,
                                                            grad_scale);
    return cudaGetLastError();
}

cudaError_t launch_adamw_chunks(float* params, const float* grads, float* m, float* v,
                                const AdamWChunk* chunks, size_t count, const AdamWArgs& a,
                                cudaStream_t s) {
    if (count == 0) return cudaSuccess;
    adamw_chunks_kernel<<<unsigned(count), kThreads, 0, s>>>(params, grads, m, v, chunks, a);
    return cudaGetLastError();
}

cudaError_t launch_adamw(float* params, const float* grads, float* m, float* v, size_t n,
                         const AdamWArgs& a, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(params, grads, m, v, n, a);
    return cudaGetLastError();
}

}  // namespace ctx::cuda
