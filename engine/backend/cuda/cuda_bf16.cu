// CUDA backend kernels of the bf16 mixed-precision path (Precision::Bf16): the fp32 -> bf16
// rounding of the matrix-product operands. The products themselves are cublasGemmEx calls with
// bf16 A/B, fp32 C and fp32 compute (CudaBackend::gemm_bf16, cuda_backend.cpp); everything else
// stays fp32 (backend.h, enum Precision).
//
// One element per thread, grid-stride: the cast is memory-bound (4 bytes read, 2 written per
// element) and coalesced; no vector loads because operand rows may start at any float offset.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_bf16.h"
#include "backend/cuda/cuda_device.cuh"

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

}  // namespace

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
