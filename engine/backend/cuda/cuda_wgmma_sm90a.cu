// The wgmma check product (backend.h cuda_wgmma_gemm): C = A B^T (or A B, B read N-major)
// through the warpgroup
// instruction of cuda_wgmma.cuh, one warpgroup per 64 x kN tile of C, the whole K in shared
// memory. Its purpose is the layouts, not speed: it stages the operands in the K-major
// no-swizzle core-matrix layout the flash kernels will use, issues one product per 16 columns of
// K (A by descriptor, or as register fragments read with ldmatrix from the same tiles), and
// stores the accumulators by their documented layout, so a wrong idea of any of them shows as
// a wrong C on the GPU while the emulation (which implements those ideas) passes.
//
// A second kernel takes the operands by TMA into 128-byte swizzled tiles (cuda_tma.cuh), the
// layout and the copies of TMA-fed kernels, checked the same way.
//
// Compiled for sm_90a only (engine/CMakeLists.txt: wgmma exists on no other target); the host
// launches it only on a compute capability 9.0 device (cuda_wgmma_check.cpp).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_tma.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

namespace ctx::cuda {

namespace {

constexpr int kGroupThreads = 128;
constexpr uint32_t kCoreBytes = 128;  // a core matrix: 8 rows x 16 bytes

// Byte offset of element (r, k) in a K-major no-swizzle tile of K columns: core matrices
// kCoreBytes apart along K (LBO), 16 K bytes apart along the rows (SBO).
__device__ __forceinline__ uint32_t core_offset(int r, int k, int K) {
    return uint32_t(r / 8) * uint32_t(16 * K) + uint32_t(k / 8) * kCoreBytes +
           uint32_t(r % 8) * 16u + uint32_t(k % 8) * 2u;
}

// Byte offset of element (n, k) of an N-major no-swizzle tile of K rows: the core matrices of
// core_offset (LBO along K, SBO along N), each now 8 K rows of 16 bytes along N.
__device__ __forceinline__ uint32_t core_offset_n_major(int n, int k, int K) {
    return uint32_t(n / 8) * uint32_t(16 * K) + uint32_t(k / 8) * kCoreBytes +
           uint32_t(k % 8) * 16u + uint32_t(n % 8) * 2u;
}

// Columns [n0, n0 + cols) of the K rows of src (row-major, ld N) into that layout.
__device__ __forceinline__ void stage_tile_n_major(char* dst, const uint16_t* src, int N, int n0,
                                                   int cols, int K) {
    const int chunks = K * cols / 8;
    for (int c = int(threadIdx.x); c < chunks; c += kGroupThreads) {
        const int k = c / (cols / 8), n = (c % (cols / 8)) * 8;
        *reinterpret_cast<uint4*>(dst + core_offset_n_major(n, k, K)) =
            *reinterpret_cast<const uint4*>(src + size_t(k) * N + n0 + n);
    }
}

// rows x K bf16 of src (row-major, ld K) into the core-matrix layout at dst, 16 bytes at a time.
__device__ __forceinline__ void stage_tile(char* dst, const uint16_t* src, int rows, int K) {
    const int chunks = rows * K / 8;
    for (int c = int(threadIdx.x); c < chunks; c += kGroupThreads) {
        const int r = c / (K / 8), k = (c % (K / 8)) * 8;
        *reinterpret_cast<uint4*>(dst + core_offset(r, k, K)) =
            *reinterpret_cast<const uint4*>(src + size_t(r) * K + k);
    }
}

template <int kN, bool kRegA, bool kTransB>
__global__ void __launch_bounds__(kGroupThreads)
    wgmma_gemm_kernel(float* C, const uint16_t* A, const uint16_t* B, int N, int K,
                      bool accumulate) {
    // As (64 x K) | Bs (kN x K), both K-major core-matrix tiles
    extern __shared__ float sm[];
    char* As = reinterpret_cast<char*>(sm);
    char* Bs = As + 64 * K * 2;
    const int m0 = int(blockIdx.y) * 64, n0 = int(blockIdx.x) * kN;
    const int tid = int(threadIdx.x), w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    stage_tile(As, A + size_t(m0) * K, 64, K);
    if constexpr (kTransB)
        stage_tile_n_major(Bs, B, N, n0, kN, K);
    else
        stage_tile(Bs, B + size_t(n0) * K, kN, K);
    fence_proxy_async();  // the stores above, visible to the tensor core's reads
    __syncthreads();

    // d[4 i + 2 h + e] = C[m0 + 16 w + g + 8 h][n0 + 8 i + 2 t + e]
    float d[kN / 2];
    for (int i = 0; i < kN / 8; i++)
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 2; e++)
                d[4 * i + 2 * h + e] =
                    accumulate ? C[size_t(m0 + 16 * w + g + 8 * h) * N + n0 + 8 * i + 2 * t + e]
                               : NAN;  // scale-d 0 must not read these
    const uint32_t sbo = uint32_t(16 * K);
    for (int ks = 0; ks < K / 16; ks++) {
        // this k step's two core-matrix columns of each operand
        const uint64_t db = wgmma_desc(Bs + 2 * ks * kCoreBytes, kCoreBytes, sbo);
        const bool acc = accumulate || ks > 0;
        if constexpr (kRegA) {
            // the warp's 16 rows as an m16n8k16 A fragment: matrices (rows 0-7 | 8-15) x
            // (k 0-7 | 8-15) in fragment order, each one core matrix
            uint32_t a[4];
            const int m = lane >> 3, r = 16 * w + (m & 1) * 8 + (lane & 7);
            ldsm_x4(a, reinterpret_cast<const uint16_t*>(
                           As + core_offset(r, 16 * ks + (m >> 1) * 8, K)));
            wgmma_fence_after(a, d);  // a was written by ldmatrix
            wgmma_rs<kN, kTransB>(d, a, db, acc);
            // the product may read a until it completes, and the next step rewrites a
            wgmma_commit();
            wgmma_wait<0>();
        } else {
            if (ks == 0) wgmma_fence_after(d);
            wgmma_ss<kN, kTransB>(d, wgmma_desc(As + 2 * ks * kCoreBytes, kCoreBytes, sbo), db,
                                  acc);
        }
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(d);
    for (int i = 0; i < kN / 8; i++)
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 2; e++)
                C[size_t(m0 + 16 * w + g + 8 * h) * N + n0 + 8 * i + 2 * t + e] =
                    d[4 * i + 2 * h + e];
}

// The same product with the operands brought in by TMA and read with the 128-byte swizzle, the
// layout of TMA-fed kernels: A's 64 rows as K / 64 boxes of 64 rows x 64 values; B K-major the
// same with kN rows, or N-major (K x N) as kN / 64 boxes of K rows x 64 columns. One mbarrier,
// one phase. Rows of A at or past M arrive as zeros (TMA's out-of-bounds fill); C's are not
// touched.
template <int kN, bool kRegA, bool kTransB>
__global__ void __launch_bounds__(kGroupThreads)
    wgmma_gemm_tma_kernel(float* C, const __grid_constant__ CUtensorMap map_a,
                          const __grid_constant__ CUtensorMap map_b, int M, int N, int K,
                          bool accumulate) {
    // [up to 1008 bytes to the next 1024-byte address] As (K / 64 blocks of 64 x 128 bytes) |
    // Bs (K / 64 blocks of kN x 128 bytes; N-major kN / 64 blocks of K x 128 bytes) | mbarrier
    extern __shared__ float sm[];
    char* As = align_shared<1024>(reinterpret_cast<char*>(sm));
    char* Bs = As + 64 * K * 2;
    uint64_t* bar = reinterpret_cast<uint64_t*>(Bs + kN * K * 2);
    const int m0 = int(blockIdx.y) * 64, n0 = int(blockIdx.x) * kN;
    const int tid = int(threadIdx.x), w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    if (tid == 0) {
        mbarrier_init(bar, 1);
        fence_mbarrier_init();
    }
    __syncthreads();
    if (tid == 0) {
        mbarrier_arrive_expect_tx(bar, uint32_t((64 + kN) * K * 2));
        for (int kb = 0; kb < K / 64; kb++)
            tma_load_2d(As + kb * 64 * 128, &map_a, bar, 64 * kb, m0);
        if constexpr (kTransB) {
            for (int nb = 0; nb < kN / 64; nb++)
                tma_load_2d(Bs + nb * K * 128, &map_b, bar, n0 + 64 * nb, 0);
        } else {
            for (int kb = 0; kb < K / 64; kb++)
                tma_load_2d(Bs + kb * kN * 128, &map_b, bar, 64 * kb, n0);
        }
    }
    mbarrier_wait(bar, 0);

    // d[4 i + 2 h + e] = C[m0 + 16 w + g + 8 h][n0 + 8 i + 2 t + e]
    float d[kN / 2];
    for (int i = 0; i < kN / 8; i++)
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 2; e++) {
                const int m = m0 + 16 * w + g + 8 * h;
                d[4 * i + 2 * h + e] = accumulate && m < M
                                           ? C[size_t(m) * N + n0 + 8 * i + 2 * t + e]
                                           : NAN;  // scale-d 0 must not read these
            }
    for (int ks = 0; ks < K / 16; ks++) {
        const int kb = ks / 4, kin = (ks % 4) * 16;  // the 64-value block and K within it
        const uint64_t db = kTransB ? wgmma_desc_sw128(Bs + ks * 16 * 128, uint32_t(K * 128), 1024)
                                    : wgmma_desc_sw128(Bs + kb * kN * 128 + kin * 2, 16, 1024);
        const bool acc = accumulate || ks > 0;
        if constexpr (kRegA) {
            uint32_t a[4];
            const int m = lane >> 3, r = 16 * w + (m & 1) * 8 + (lane & 7);
            ldsm_x4(a, reinterpret_cast<const uint16_t*>(As + kb * 64 * 128 +
                                                         sw128_offset(r, kin + (m >> 1) * 8)));
            wgmma_fence_after(a, d);
            wgmma_rs<kN, kTransB>(d, a, db, acc);
            wgmma_commit();
            wgmma_wait<0>();
        } else {
            if (ks == 0) wgmma_fence_after(d);
            wgmma_ss<kN, kTransB>(d, wgmma_desc_sw128(As + kb * 64 * 128 + kin * 2, 16, 1024), db,
                                  acc);
        }
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(d);
    for (int i = 0; i < kN / 8; i++)
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 2; e++) {
                const int m = m0 + 16 * w + g + 8 * h;
                if (m < M) C[size_t(m) * N + n0 + 8 * i + 2 * t + e] = d[4 * i + 2 * h + e];
            }
}

template <int kN, bool kRegA, bool kTransB>
cudaError_t launch_tma(float* C, const CUtensorMap& a, const CUtensorMap& b, int M, int N, int K,
                       bool accumulate, cudaStream_t s) {
    const int shmem = 1024 + (64 + kN) * K * 2 + 8;
    auto* kernel = wgmma_gemm_tma_kernel<kN, kRegA, kTransB>;
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shmem);
    if (e != cudaSuccess) return e;
    kernel<<<dim3(N / kN, (M + 63) / 64), kGroupThreads, shmem, s>>>(C, a, b, M, N, K, accumulate);
    return cudaGetLastError();
}

template <int kN>
cudaError_t launch_tma_tile(float* C, const CUtensorMap& a, const CUtensorMap& b, int M, int N,
                            int K, bool a_from_registers, bool b_n_major, bool accumulate,
                            cudaStream_t s) {
    if (b_n_major)
        return a_from_registers ? launch_tma<kN, true, true>(C, a, b, M, N, K, accumulate, s)
                                : launch_tma<kN, false, true>(C, a, b, M, N, K, accumulate, s);
    return a_from_registers ? launch_tma<kN, true, false>(C, a, b, M, N, K, accumulate, s)
                            : launch_tma<kN, false, false>(C, a, b, M, N, K, accumulate, s);
}

template <int kN, bool kRegA, bool kTransB>
cudaError_t launch(float* C, const uint16_t* A, const uint16_t* B, int M, int N, int K,
                   bool accumulate, cudaStream_t s) {
    const int shmem = (64 + kN) * K * 2;
    auto* kernel = wgmma_gemm_kernel<kN, kRegA, kTransB>;
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shmem);
    if (e != cudaSuccess) return e;
    kernel<<<dim3(N / kN, M / 64), kGroupThreads, shmem, s>>>(C, A, B, N, K, accumulate);
    return cudaGetLastError();
}

template <int kN>
cudaError_t launch_tile(float* C, const uint16_t* A, const uint16_t* B, int M, int N, int K,
                        bool a_from_registers, bool b_n_major, bool accumulate, cudaStream_t s) {
    if (b_n_major)
        return a_from_registers ? launch<kN, true, true>(C, A, B, M, N, K, accumulate, s)
                                : launch<kN, false, true>(C, A, B, M, N, K, accumulate, s);
    return a_from_registers ? launch<kN, true, false>(C, A, B, M, N, K, accumulate, s)
                            : launch<kN, false, false>(C, A, B, M, N, K, accumulate, s);
}

}  // namespace

cudaError_t launch_wgmma_gemm_tma(float* C, const CUtensorMap& a, const CUtensorMap& b, int M,
                                  int N, int K, int n_tile, bool a_from_registers, bool b_n_major,
                                  bool accumulate, cudaStream_t s) {
    return n_tile == 128
               ? launch_tma_tile<128>(C, a, b, M, N, K, a_from_registers, b_n_major, accumulate, s)
               : launch_tma_tile<64>(C, a, b, M, N, K, a_from_registers, b_n_major, accumulate, s);
}

cudaError_t launch_wgmma_gemm(float* C, const uint16_t* A, const uint16_t* B, int M, int N, int K,
                              int n_tile, bool a_from_registers, bool b_n_major, bool accumulate,
                              cudaStream_t s) {
    if (n_tile == 32)  // the one-kernel backward's dq columns a warpgroup at head dim 64
        return launch_tile<32>(C, A, B, M, N, K, a_from_registers, b_n_major, accumulate, s);
    return n_tile == 128
               ? launch_tile<128>(C, A, B, M, N, K, a_from_registers, b_n_major, accumulate, s)
               : launch_tile<64>(C, A, B, M, N, K, a_from_registers, b_n_major, accumulate, s);
}

}  // namespace ctx::cuda
