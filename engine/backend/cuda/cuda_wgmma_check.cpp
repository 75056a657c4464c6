// backend.h's wgmma check product: validates its arguments and the device, runs
// launch_wgmma_gemm (cuda_wgmma_sm90a.cu) and waits for it, so a fault shows here.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_tma.h"
#include "core/error.h"

namespace ctx {

bool cuda_has_wgmma(int device) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return p.major == 9 && p.minor == 0;  // sm_90a code runs on 9.0 only
}

void cuda_wgmma_gemm(float* C, const uint16_t* A, const uint16_t* B, int M, int N, int K,
                     const WgmmaGemmOptions& o) {
    int device = 0;
    CTX_CHECK(cudaGetDevice(&device) == cudaSuccess && cuda_has_wgmma(device),
              "wgmma needs a compute capability 9.0 GPU (sm_90a); device {} is not one", device);
    CTX_CHECK(o.n_tile == 64 || o.n_tile == 128 || (o.n_tile == 32 && !o.tma),
              "wgmma check: n_tile {} (expected 64 or 128, or 32 without TMA)", o.n_tile);
    if (o.tma)
        CTX_CHECK(M > 0 && N > 0 && N % o.n_tile == 0 && K >= 64 && K <= 256 && K % 64 == 0,
                  "wgmma check with TMA: M {} (positive), N {} (a multiple of {}), K {} (a "
                  "multiple of 64, 64..256)",
                  M, N, o.n_tile, K);
    else
        CTX_CHECK(M > 0 && M % 64 == 0 && N > 0 && N % o.n_tile == 0 && K >= 16 && K <= 256 &&
                      K % 16 == 0,
                  "wgmma check: M {} (a multiple of 64), N {} (of {}), K {} (of 16, 16..256)", M, N,
                  o.n_tile, K);
    for (const void* p :
         {static_cast<const void*>(C), static_cast<const void*>(A), static_cast<const void*>(B)})
        CTX_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0,
                  "wgmma check: operands must be 16-byte aligned");
    cudaError_t e = cudaSuccess;
    if (o.tma) {
        // A: K x M (innermost first) in boxes of 64 x 64; B: K x N in boxes of 64 x n_tile, or
        // N-major N x K in boxes of 64 x K
        cuda::TmaBf16Tensor ta, tb;
        ta.base = A;
        ta.dims[0] = uint64_t(K), ta.dims[1] = uint64_t(M), ta.strides[0] = uint64_t(K) * 2;
        ta.box[0] = 64, ta.box[1] = 64;
        tb.base = B;
        if (o.b_n_major) {
            tb.dims[0] = uint64_t(N), tb.dims[1] = uint64_t(K), tb.strides[0] = uint64_t(N) * 2;
            tb.box[0] = 64, tb.box[1] = uint32_t(K);
        } else {
            tb.dims[0] = uint64_t(K), tb.dims[1] = uint64_t(N), tb.strides[0] = uint64_t(K) * 2;
            tb.box[0] = 64, tb.box[1] = uint32_t(o.n_tile);
        }
        CUtensorMap ma, mb;
        cuda::encode_tma_map(&ma, ta, "wgmma check: A");
        cuda::encode_tma_map(&mb, tb, "wgmma check: B");
        e = cuda::launch_wgmma_gemm_tma(C, ma, mb, M, N, K, o.n_tile, o.a_from_registers,
                                        o.b_n_major, o.accumulate, nullptr);
    } else {
        e = cuda::launch_wgmma_gemm(C, A, B, M, N, K, o.n_tile, o.a_from_registers, o.b_n_major,
                                    o.accumulate, nullptr);
    }
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    CTX_CHECK(e == cudaSuccess, "wgmma check product failed: {}", cudaGetErrorString(e));
}

}  // namespace ctx
