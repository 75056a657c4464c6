// CUDA backend kernels: the layer-norm and RMS-norm backward in one pass over the rows, for
// widths up to kNormOnePassMaxC (cuda_kernels.h; wider rows take cuda_dense.cu's two passes).
//
// The two-pass form reads x and dout twice: a warp per row for dx, then a column-tiled pass for
// dw and db. Here a warp keeps its row's normalised x and dout in registers (K values per lane,
// columns lane + 32 k), adds dx, and keeps running per-column sums of the dw, db terms for the
// rows it owns; a block of kNormWarps warps covers a chunk of rows, and its warps' sums are
// added in warp order into the chunk's partial row. A second kernel adds the chunks' rows into
// dw, db in a fixed order. No atomics: the same bits on every run (as the two-pass form, whose
// sums it does not reproduce bit for bit: the order differs).
#include <cuda_runtime.h>

#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace ctx::cuda {

namespace {

constexpr int kNormWarps = 4;
constexpr int kReduceLanes = 8;  // row lanes of the chunk reduction (32 columns per block)

// Rms: RMS norm (no centering, no db; mean unused). K: columns per lane, 32 K >= C.
template <bool Rms, int K>
__global__ void __launch_bounds__(32 * kNormWarps)
    norm_backward_kernel(float* dinp, float* part_w, float* part_b, const float* dout,
                         const float* inp, const float* w, const float* mean, const float* rstd,
                         int N, int C, int rows_per_chunk) {
    __shared__ float red[kNormWarps][32 * K];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, chunk = blockIdx.x;
    const int r1 = min(N, (chunk + 1) * rows_per_chunk);
    float wc[K], aw[K], ab[K];  // weights; this warp's running dw, db terms per column
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int c = lane + 32 * k;
        wc[k] = c < C ? w[c] : 0.0f;
        aw[k] = ab[k] = 0.0f;
    }
    for (int n = chunk * rows_per_chunk + warp; n < r1; n += kNormWarps) {
        const float* x = inp + size_t(n) * C;
        const float* dy = dout + size_t(n) * C;
        float* dx = dinp + size_t(n) * C;
        const float m = Rms ? 0.0f : mean[n], s = rstd[n];
        float xn[K], g[K];  // (x - mean) rstd and dout of this row
        float dm = 0.0f, dnm = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int c = lane + 32 * k;
            xn[k] = c < C ? (x[c] - m) * s : 0.0f;
            g[k] = c < C ? dy[c] : 0.0f;
            const float dnorm = wc[k] * g[k];
            dm += dnorm;
            dnm += dnorm * xn[k];
        }
        dm = Rms ? 0.0f : warp_sum(dm) / float(C);  // RMS norm: no mean term
        dnm = warp_sum(dnm) / float(C);
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int c = lane + 32 * k;
            if (c < C) dx[c] += (wc[k] * g[k] - dm - xn[k] * dnm) * s;
            aw[k] += xn[k] * g[k];
            ab[k] += g[k];
        }
    }
    // the chunk's partial rows: the warps' sums added in warp order
    auto write_partial = [&](const float(&acc)[K], float* part) {
#pragma unroll
        for (int k = 0; k < K; k++) red[warp][lane + 32 * k] = acc[k];
        __syncthreads();
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float t = 0.0f;
            for (int v = 0; v < kNormWarps; v++) t += red[v][c];
            part[size_t(chunk) * C + c] = t;
        }
        __syncthreads();  // red is refilled by the next call
    };
    write_partial(aw, part_w);
    if (!Rms && part_b != nullptr) write_partial(ab, part_b);
}

// out (C) += the sum over the G rows of part (G, C): block (32 columns, kReduceLanes lanes),
// lane l adds rows l, l + kReduceLanes, ..., then the lanes are added in order.
__global__ void column_reduce_add_kernel(float* out, const float* part, int G, int C) {
    __shared__ float s[kReduceLanes][33];
    const int tx = threadIdx.x, ty = threadIdx.y, c = blockIdx.x * 32 + tx;
    float a = 0.0f;
    if (c < C)
        for (int g = ty; g < G; g += kReduceLanes) a += part[size_t(g) * C + c];
    s[ty][tx] = a;
    __syncthreads();
    if (ty == 0 && c < C) {
        float t = 0.0f;
        for (int l = 0; l < kReduceLanes; l++) t += s[l][tx];
        out[c] += t;
    }
}

template <bool Rms>
cudaError_t norm_backward(float* dinp, float* dw, float* db, float* partials, const float* dout,
                          const float* inp, const float* w, const float* mean, const float* rstd,
                          int N, int C, cudaStream_t s) {
    const int G = norm_backward_chunks(N), rows = (N + G - 1) / G;
    float* part_w = partials;
    float* part_b = db != nullptr ? partials + size_t(G) * C : nullptr;
    static_assert(kNormOnePassMaxC == kRowInRegistersMaxC, "every width has its bucket");
    auto* kernel =
        with_row_width(C, [](auto K) { return &norm_backward_kernel<Rms, decltype(K)::value>; });
    kernel<<<G, 32 * kNormWarps, 0, s>>>(dinp, part_w, part_b, dout, inp, w, mean, rstd, N, C,
                                         rows);
    const dim3 grid((C + 31) / 32), block(32, kReduceLanes);
    column_reduce_add_kernel<<<grid, block, 0, s>>>(dw, part_w, G, C);
    if (part_b != nullptr) column_reduce_add_kernel<<<grid, block, 0, s>>>(db, part_b, G, C);
    return cudaGetLastError();
}

}  // namespace

int norm_backward_chunks(int N) {
    const int g = (N + 31) / 32;  // 32 rows per chunk: 8 per warp
    return g < 1 ? 1 : (g > 256 ? 256 : g);
}

cudaError_t launch_norm_backward(float* dinp, float* dw, float* db, float* partials,
                                 const float* dout, const float* inp, const float* w,
                                 const float* mean, const float* rstd, int N, int C,
                                 cudaStream_t s) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    if (C > kNormOnePassMaxC) return cudaErrorInvalidValue;
    if (mean == nullptr)
        return norm_backward<true>(dinp, dw, nullptr, partials, dout, inp, w, nullptr, rstd, N,
                                   C, s);
    return norm_backward<false>(dinp, dw, db, partials, dout, inp, w, mean, rstd, N, C, s);
}

}  // namespace ctx::cuda
