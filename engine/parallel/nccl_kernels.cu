// Kernels of the NCCL gradient reducer (declared in nccl_kernels.h): bf16 casts for the
// wire and the rank-ordered sum of the deterministic mode. Grid-stride loops, one element per
// thread and iteration; no atomics, so every element has one fixed sequence of operations.
#include <cuda_runtime.h>

#include <cstring>

#include "backend/cuda/cuda_device.cuh"
#include "parallel/nccl_kernels.h"

namespace ctx::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // NaN: quiet
    // Round to nearest even on the 16 bits dropped: add 0x7fff plus the lowest kept bit.
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

__device__ __forceinline__ float from_bf16(uint16_t h) {
    const uint32_t u = uint32_t(h) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(uint16_t v) { return from_bf16(v); }

__global__ void to_bf16_kernel(uint16_t* dst, const float* src, size_t n) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        dst[i] = to_bf16(src[i]);
}

__global__ void from_bf16_kernel(float* dst, const uint16_t* src, size_t n) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        dst[i] = from_bf16(src[i]);
}

// out (n) = sum over r of gathered (world, n) [r][i], r ascending.
template <class T>
__global__ void sum_ranks_kernel(float* out, const T* gathered, int world, size_t n) {
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        float acc = widen(gathered[i]);
        for (int r = 1; r < world; r++) acc += widen(gathered[size_t(r) * n + i]);
        out[i] = acc;
    }
}

}  // namespace

cudaError_t launch_grad_to_bf16(uint16_t* dst, const float* src, size_t n, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    to_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(dst, src, n);
    return cudaGetLastError();
}

cudaError_t launch_grad_from_bf16(float* dst, const uint16_t* src, size_t n, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    from_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(dst, src, n);
    return cudaGetLastError();
}

cudaError_t launch_grad_sum_ranks(float* out, const float* gathered, int world, size_t n,
                                  cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    sum_ranks_kernel<float><<<grid_for(n, kThreads), kThreads, 0, s>>>(out, gathered, world, n);
    return cudaGetLastError();
}

cudaError_t launch_grad_sum_ranks_bf16(float* out, const uint16_t* gathered, int world, size_t n,
                                       cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    sum_ranks_kernel<uint16_t>
        <<<grid_for(n, kThreads), kThreads, 0, s>>>(out, gathered, world, n);
    return cudaGetLastError();
}

}  // namespace ctx::cuda
