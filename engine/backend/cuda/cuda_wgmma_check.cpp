// backend.h's wgmma check product: validates its arguments and the device, runs
// launch_wgmma_gemm (cuda_wgmma_sm90a.cu) and waits for it, so a fault shows here.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
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
    CTX_CHECK(o.n_tile == 64 || o.n_tile == 128, "wgmma check: n_tile {} (expected 64 or 128)",
              o.n_tile);
    CTX_CHECK(
        M > 0 && M % 64 == 0 && N > 0 && N % o.n_tile == 0 && K >= 16 && K <= 256 && K % 16 == 0,
        "wgmma check: M {} (a multiple of 64), N {} (of {}), K {} (of 16, 16..256)", M, N, o.n_tile,
        K);
    for (const void* p :
         {static_cast<const void*>(C), static_cast<const void*>(A), static_cast<const void*>(B)})
        CTX_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0,
                  "wgmma check: operands must be 16-byte aligned");
    cudaError_t e = cuda::launch_wgmma_gemm(C, A, B, M, N, K, o.n_tile, o.a_from_registers,
                                            o.b_n_major, o.accumulate, nullptr);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    CTX_CHECK(e == cudaSuccess, "wgmma check product failed: {}", cudaGetErrorString(e));
}

}  // namespace ctx
