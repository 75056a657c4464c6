// CUDA backend (private header): launchers of the bf16 mixed-precision path (Precision::Bf16,
// backend.h), kernels in cuda_bf16.cu. Plain C++ declarations (bf16 data is passed as its 16-bit
// patterns, uint16_t), so the host files compile without NVIDIA's bf16 header.
//
// Not to be confused with NVIDIA's <cuda_bf16.h> (the __nv_bfloat16 type): include this one as
// "backend/cuda/cuda_bf16.h" and NVIDIA's with angle brackets; engine/backend/cuda is never an
// include directory, so the two cannot shadow each other.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ctx::cuda {

// dst (n) = src (n) rounded to bf16, round-to-nearest-even (__float2bfloat16_rn: ties to the
// even 8-bit significand, overflow to +-inf, NaN to the canonical 0x7fff); dst holds the bf16 bit
// patterns. src and dst must not overlap.
cudaError_t launch_round_to_bf16(uint16_t* dst, const float* src, size_t n, cudaStream_t s);
// dst (rows, ld) = src (rows, cols) rounded as above, columns [cols, ld) zero (ld >= cols): a
// product operand whose rows are padded to an aligned leading dimension.
cudaError_t launch_round_rows_to_bf16(uint16_t* dst, size_t ld, const float* src, size_t rows,
                                      size_t cols, cudaStream_t s);
// The same for src (N, C) into dst (N, ld), and in the same pass over src out (C) += its column
// sums (a bias gradient; out and partials non-null), partials: column_chunks(N) * C floats. The sums take the chunks, lanes
// and order of launch_column_sum_add, so out gets the same bits as from that kernel.
cudaError_t launch_round_rows_colsum_bf16(uint16_t* dst, size_t ld, float* out, float* partials,
                                          const float* src, int N, int C, cudaStream_t s);
// The same with src = the activation's backward (Backend::activation_matmul_backward's dpre):
// act'(pre) * dact for act 0, 1, 3 (GeluTanh, GeluErf, Relu; pre, dact (N, C)), or SwiGLU's
// [d gate | d up] for act 2 (pre (N, C) = [gate | up], dact (N, C / 2), C even), each value the
// fp32 one cuda_dense.cu's activation backward writes; dbias may be null (no column sums, and
// partials may be null too).
cudaError_t launch_activation_backward_bf16(uint16_t* dst, size_t ld, float* dbias,
                                            float* partials, const float* pre, const float* dact,
                                            int N, int C, int act, cudaStream_t s);
// The same with pre stored in bf16 (its values widened to fp32 exactly).
cudaError_t launch_activation_backward_bf16(uint16_t* dst, size_t ld, float* dbias,
                                            float* partials, const uint16_t* pre,
                                            const float* dact, int N, int C, int act,
                                            cudaStream_t s);

}  // namespace ctx::cuda
