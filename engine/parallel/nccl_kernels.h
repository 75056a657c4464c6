// Kernels of the NCCL gradient reducer (parallel/nccl_reducer.cpp), in nccl_kernels.cu. Plain C++ declarations; bf16 data is passed as its 16-bit patterns
// (uint16_t), so the host side compiles without NVIDIA's bf16 header. Every launcher enqueues on
// `s` and returns cudaGetLastError(); n = 0 launches nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ctx::cuda {

// dst (n) = src (n) rounded to bf16, round to nearest, ties to even (overflow gives +-inf; NaN
// stays NaN, quieted). src and dst must not overlap.
cudaError_t launch_grad_to_bf16(uint16_t* dst, const float* src, size_t n, cudaStream_t s);
// dst (n) = src (n) widened to fp32 (exact).
cudaError_t launch_grad_from_bf16(float* dst, const uint16_t* src, size_t n, cudaStream_t s);
// out (n) = g_0 + g_1 + ... + g_{world-1}, left to right in fp32, from gathered (world, n)
// (fp32, or bf16 patterns widened exactly): the deterministic mode's fixed order.
cudaError_t launch_grad_sum_ranks(float* out, const float* gathered, int world, size_t n,
                                  cudaStream_t s);
cudaError_t launch_grad_sum_ranks_bf16(float* out, const uint16_t* gathered, int world, size_t n,
                                       cudaStream_t s);

}  // namespace ctx::cuda
