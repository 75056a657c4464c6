// CUDA backend (private, device code only): reductions and launch helpers shared by the .cu
// files. Every reduction here combines values in a fixed order (tree over lanes, then over warps),
// so results do not depend on scheduling: the backend is deterministic run to run on the same
// GPU model without any atomics in the numeric paths.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ctx::cuda {

inline constexpr unsigned kFullMask = 0xffffffffu;

// Element i of an activation stored in fp32, or in bf16 as its bit pattern.
__device__ __forceinline__ float load_value(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float load_value(const uint16_t* p, size_t i) {
    return __uint_as_float(uint32_t(p[i]) << 16);
}

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
    return v;
}

// Named barriers (PTX bar.sync / bar.arrive with an id and a thread count): a barrier over
// `count` threads of the block (a multiple of 32; whole warps execute it), ids 1-15 (0 is
// __syncthreads'). sync waits until `count` threads have arrived in this phase; arrive counts
// this thread and goes on (a producer signalling consumers, a consumer releasing a stage). When a
// phase completes, the shared and global writes its threads made before arriving are visible to
// the waiting threads' later reads.
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
#if defined(__CUDACC__)
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#else
    emu::named_barrier(id, count, true);
#endif
}
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
#if defined(__CUDACC__)
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#else
    emu::named_barrier(id, count, false);
#endif
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// shared: 32 slots of T. Ends with a barrier, so shared may be reused right after.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    T r = lane < nw ? shared[lane] : T(0);
    r = warp_sum(r);
    __syncthreads();
    return r;
}

__device__ __forceinline__ float block_max(float v, float* shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float r = lane < nw ? shared[lane] : -INFINITY;
    r = warp_max(r);
    __syncthreads();
    return r;
}

// x[k] = old + scale x[k] with old = p[d0 + 4 k], for a thread's strided share of a gradient
// row (entries d0 + 4 k < n; 0 past it), before the caller writes x back: every load issued
// before any is used. Read, added and written one entry at a time, each load waited for the
// store before it (which may alias it): a round trip to memory per entry (SASS, sm_90).
template <int K>
__device__ __forceinline__ void add_old_entries(float (&x)[K], const float* p, int d0, int n,
                                                float scale) {
    float old[K];
#pragma unroll
    for (int k = 0; k < K; k++) old[k] = d0 + 4 * k < n ? p[d0 + 4 * k] : 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++) x[k] = old[k] + x[k] * scale;
}

// The norm kernels that keep a warp's row in registers (columns lane + 32 k, k < K): f called
// with std::integral_constant<int, K> for the bucket of width C (<= kRowInRegistersMaxC), its
// result returned.
inline constexpr int kRowInRegistersMaxC = 1024;
template <class F>
auto with_row_width(int C, F&& f) {
    if (C <= 256) return f(std::integral_constant<int, 8>{});
    if (C <= 512) return f(std::integral_constant<int, 16>{});
    if (C <= 768) return f(std::integral_constant<int, 24>{});
    return f(std::integral_constant<int, 32>{});
}

// Raises a kernel's dynamic shared-memory limit above the default 48 KiB (sm_80: up to
// 163 KiB, sm_90: 227 KiB), for the current device.
template <class K>
cudaError_t allow_dynamic_shared(K* kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

// allow_dynamic_shared once per device, not per launch: a launcher keeps one of these per kernel
// and size (a function-local static). The attribute belongs to the kernel on the device that was
// current when it was set, so a process driving several GPUs raises it on each; a failure is not
// remembered (the next launch tries again and reports it again).
class DynamicSharedLimit {
public:
    template <class K>
    cudaError_t raise(K* kernel, size_t bytes) {
        int device = 0;
        if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
        const uint64_t bit = device < 64 ? uint64_t(1) << device : 0;
        if (bit != 0 && (raised_.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
        const cudaError_t e = allow_dynamic_shared(kernel, bytes);
        if (e == cudaSuccess) raised_.fetch_or(bit, std::memory_order_acq_rel);
        return e;
    }

private:
    std::atomic<uint64_t> raised_{0};  // bit d: raised on device d
};

// Blocks of `threads` for a grid-stride loop over n items (capped; the loops stride).
inline unsigned grid_for(size_t n, int threads, size_t cap = 65535) {
    size_t g = (n + size_t(threads) - 1) / size_t(threads);
    if (g < 1) g = 1;
    if (g > cap) g = cap;
    return unsigned(g);
}

}  // namespace ctx::cuda
