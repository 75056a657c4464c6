// CUDA backend kernels of the bf16 mixed-precision path (Precision::Bf16): the fp32 -> bf16
// rounding of the matrix-product operands (with a bias gradient's column sums on the way, for
// the output gradient of a product with a bias), and the MLP activation's backward written
// straight into that rounded form. The products themselves are cublasGemmEx calls with
// bf16 A/B, fp32 C and fp32 compute (CudaBackend::gemm_bf16, cuda_backend.cpp); everything else
// stays fp32 (backend.h, enum Precision).
//
// One element per thread, grid-stride: the cast is memory-bound (4 bytes read, 2 written per
// element) and coalesced; no vector loads because operand rows may start at any float offset.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_activation.cuh"
#include "backend/cuda/cuda_bf16.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_kernels.h"  // column_chunks, kColTile, launch_column_finish_add

namespace ctx::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void round_to_bf16_kernel(__nv_bfloat16* dst, const float* src, size_t n) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

// dst (rows, ld) = src (rows, cols) rounded, columns [cols, ld) zero.
__global__ void round_rows_to_bf16_kernel(__nv_bfloat16* dst, size_t ld, const float* src,
                                          size_t rows, size_t cols) {
    const size_t n = rows * ld;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const size_t r = i / ld, c = i % ld;
        dst[i] = c < cols ? __float2bfloat16_rn(src[r * cols + c]) : __float2bfloat16_rn(0.0f);
    }
}

// Where the rounding kernels' values come from: element (r, c) of a matrix of C columns.
struct PlainRows {  // the matrix itself
    const float* x;
    int C;
    __device__ float operator()(int r, int c) const { return x[size_t(r) * C + c]; }
};
__device__ __forceinline__ float value(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float value(const __nv_bfloat16* p, size_t i) {
    return __bfloat162float(p[i]);
}

template <class Pre>  // float, or __nv_bfloat16 (pre stored in bf16)
struct ActivationGradRows {  // act'(pre) * dact, both (N, C)
    const Pre* pre;
    const float* dact;
    int C, act;
    __device__ float operator()(int r, int c) const {
        const size_t i = size_t(r) * C + c;
        return activation_grad(value(pre, i), act) * dact[i];
    }
};
template <class Pre>
struct SwigluGradRows {  // [d gate | d up] (N, 2F) from pre (N, 2F) = [gate | up], dact (N, F)
    const Pre* pre;
    const float* dact;
    int F;
    __device__ float operator()(int r, int c) const {
        const int f = c < F ? c : c - F;
        const size_t row = size_t(r) * 2 * F;
        const float g = value(pre, row + f), dy = dact[size_t(r) * F + f];
        return c < F ? swiglu_gate_grad(g, value(pre, row + F + f), dy) : swiglu_up_grad(g, dy);
    }
};

// The first stage of launch_column_sum_add (cuda_dense.cu: tiles of 32 columns x 8 row lanes,
// rows in G chunks, each lane's rows in order, then the lanes in order) over the values of
// `el`, which are rounded into dst on the way; columns [C, ld) of dst get zeros.
template <class Rows>
__global__ void round_rows_colsum_kernel(__nv_bfloat16* dst, size_t ld, float* part, Rows el,
                                         int N, int C, int rows_per_chunk) {
    __shared__ float s0[kColLanes][kColTile + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int c = blockIdx.x * kColTile + tx, g = blockIdx.y;
    const int r0 = g * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float a0 = 0.0f;
    if (size_t(c) < ld) {
        for (int r = r0 + ty; r < r1; r += kColLanes) {
            if (c < C) {
                const float v = el(r, c);
                // never fused with el's last product into an fma: the sums must be of the
                // values the fp32 kernels write, as the rounding pass over them adds them
                a0 = __fadd_rn(a0, v);
                dst[size_t(r) * ld + c] = __float2bfloat16_rn(v);
            } else {
                dst[size_t(r) * ld + c] = __float2bfloat16_rn(0.0f);
            }
        }
    }
    s0[ty][tx] = a0;
    __syncthreads();
    if (part != nullptr && ty == 0 && c < C) {
        float t0 = 0.0f;
        for (int k = 0; k < kColLanes; k++) t0 += s0[k][tx];
        part[size_t(g) * C + c] = t0;
    }
}

template <class Rows>
cudaError_t launch_rows_colsum(uint16_t* dst, size_t ld, float* out, float* partials, Rows el,
                               int N, int C, cudaStream_t s) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    if (ld < size_t(C) || (out != nullptr && partials == nullptr)) return cudaErrorInvalidValue;
    const int G = column_chunks(N), rows = (N + G - 1) / G;
    const dim3 grid(unsigned((ld + kColTile - 1) / kColTile), unsigned(G)),
        block(kColTile, kColLanes);
    round_rows_colsum_kernel<Rows><<<grid, block, 0, s>>>(reinterpret_cast<__nv_bfloat16*>(dst),
                                                          ld, partials, el, N, C, rows);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    if (out == nullptr) return cudaSuccess;
    return launch_column_finish_add(out, partials, G, C, s);
}

}  // namespace

cudaError_t launch_round_rows_colsum_bf16(uint16_t* dst, size_t ld, float* out, float* partials,
                                          const float* src, int N, int C, cudaStream_t s) {
    return launch_rows_colsum(dst, ld, out, partials, PlainRows{src, C}, N, C, s);
}

template <class Pre>
cudaError_t activation_backward_bf16(uint16_t* dst, size_t ld, float* dbias, float* partials,
                                     const Pre* pre, const float* dact, int N, int C, int act,
                                     cudaStream_t s) {
    if (act == 2) {  // Activation::SwiGLU: C = 2F
        if (C % 2 != 0) return cudaErrorInvalidValue;
        return launch_rows_colsum(dst, ld, dbias, partials, SwigluGradRows<Pre>{pre, dact, C / 2},
                                  N, C, s);
    }
    return launch_rows_colsum(dst, ld, dbias, partials,
                              ActivationGradRows<Pre>{pre, dact, C, act}, N, C, s);
}

cudaError_t launch_activation_backward_bf16(uint16_t* dst, size_t ld, float* dbias,
                                            float* partials, const float* pre, const float* dact,
                                            int N, int C, int act, cudaStream_t s) {
    return activation_backward_bf16(dst, ld, dbias, partials, pre, dact, N, C, act, s);
}

cudaError_t launch_activation_backward_bf16(uint16_t* dst, size_t ld, float* dbias,
                                            float* partials, const uint16_t* pre,
                                            const float* dact, int N, int C, int act,
                                            cudaStream_t s) {
    return activation_backward_bf16(dst, ld, dbias, partials,
                                    reinterpret_cast<const __nv_bfloat16*>(pre), dact, N, C, act,
                                    s);
}

cudaError_t launch_round_rows_to_bf16(uint16_t* dst, size_t ld, const float* src, size_t rows,
                                      size_t cols, cudaStream_t s) {
    if (rows == 0 || ld == 0) return cudaSuccess;
    if (ld < cols) return cudaErrorInvalidValue;
    round_rows_to_bf16_kernel<<<grid_for(rows * ld, kThreads), kThreads, 0, s>>>(
        reinterpret_cast<__nv_bfloat16*>(dst), ld, src, rows, cols);
    return cudaGetLastError();
}

cudaError_t launch_round_to_bf16(uint16_t* dst, const float* src, size_t n, cudaStream_t s) {
    static_assert(sizeof(__nv_bfloat16) == sizeof(uint16_t), "bf16 is 16 bits");
    if (n == 0) return cudaSuccess;
    round_to_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(
        reinterpret_cast<__nv_bfloat16*>(dst), src, n);
    return cudaGetLastError();
}

}  // namespace ctx::cuda
