// CUDA backend (private, device code): sm_90's tensor memory accelerator (TMA) and the
// shared-memory barriers it signals, with an exact emulation for the CPU build.
//
//   mbarrier_init(bar, n)           one thread, before any use; then fence_mbarrier_init() and
//                                   a block barrier
//   mbarrier_arrive_expect_tx(bar, bytes)   this thread arrives and announces `bytes` that
//                                   copies will land on the barrier's current phase
//   tma_load_2d / _3d(dst, map, bar, x, y[, z])   one thread copies the box at (x, y[, z])
//                                   (innermost first) of a tensor map into shared memory; its
//                                   bytes count down the barrier's announced transaction bytes
//   mbarrier_wait(bar, parity)      until the phase of that parity has completed (its arrivals
//                                   came and its bytes landed): the copied tiles are visible
// A phase completes when its arrival count is reached and its announced bytes have landed; the
// barrier then starts the next phase (parities alternate 0, 1, 0, ...). A wait for parity 1 on a
// fresh barrier returns at once (the "previous" phase counts as completed), which is how a
// producer's first wait on an empty-stage barrier passes.
//
// Tensor maps (CUtensorMap, 128 bytes) are encoded on the host (cuda_tma.h) and passed to the
// kernel as `const __grid_constant__ CUtensorMap` parameters; the copy takes their address.
// Boxes copied with 128-byte swizzle land as rows of 128 bytes whose 16-byte chunk c sits at
// c ^ (shared address bits 7-9): the layout a wgmma descriptor with swizzle mode 1 reads
// (cuda_wgmma.cuh wgmma_desc_sw128), and which needs tiles aligned to 1024 bytes.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_wgmma.cuh"

namespace ctx::cuda {

// TMA and mbarrier transaction counts exist from sm_90 (these are built for sm_90a only).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CTX_HAVE_TMA 1
#endif

// p rounded up to the next shared address that is a multiple of kAlign (a power of two): the
// dynamic shared memory is only promised 16-byte alignment, a 128-byte swizzled tile needs 1024.
template <uint32_t kAlign>
__device__ __forceinline__ char* align_shared(char* p) {
    static_assert((kAlign & (kAlign - 1)) == 0, "a power of two");
    return p + ((kAlign - (shared_address(p) & (kAlign - 1))) & (kAlign - 1));
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
#if defined(CTX_HAVE_TMA)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(count)
                 : "memory");
#elif defined(__CUDACC__)
    __trap();
#else
    emu::mbarrier_init(shared_address(bar), count);
#endif
}

// Makes initialised barriers visible to the async proxy (the copies that signal them); a block
// barrier must follow before other threads use them.
__device__ __forceinline__ void fence_mbarrier_init() {
#if defined(CTX_HAVE_TMA)
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
#if defined(CTX_HAVE_TMA)
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(bar))
                 : "memory");
#elif defined(__CUDACC__)
    __trap();
#else
    emu::mbarrier_arrive(shared_address(bar), 0);
#endif
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(CTX_HAVE_TMA)
    asm volatile(
        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)),
        "r"(bytes)
        : "memory");
#elif defined(__CUDACC__)
    __trap();
#else
    emu::mbarrier_arrive(shared_address(bar), bytes);
#endif
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(CTX_HAVE_TMA)
    const uint32_t addr = shared_address(bar);
    uint32_t done = 0;
    do {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(done)
            : "r"(addr), "r"(parity)
            : "memory");
    } while (done == 0);
#elif defined(__CUDACC__)
    __trap();
#else
    emu::mbarrier_wait(shared_address(bar), parity);
#endif
}

__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int x,
                                            int y) {
#if defined(CTX_HAVE_TMA)
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(shared_address(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(bar)), "r"(x), "r"(y)
        : "memory");
#elif defined(__CUDACC__)
    __trap();
#else
    const int coords[2] = {x, y};
    emu::tma_load(shared_address(dst), map, shared_address(bar), coords, 2);
#endif
}

__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int x,
                                            int y, int z) {
#if defined(CTX_HAVE_TMA)
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(shared_address(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(bar)), "r"(x), "r"(y), "r"(z)
        : "memory");
#elif defined(__CUDACC__)
    __trap();
#else
    const int coords[3] = {x, y, z};
    emu::tma_load(shared_address(dst), map, shared_address(bar), coords, 3);
#endif
}

// Byte offset of element (r, k) in a tile of rows of 64 bf16 (128 bytes) stored with the
// 128-byte swizzle from a 1024-byte aligned base, as TMA writes it: chunk (k / 8) ^ (r % 8).
// For register fragments (ldmatrix) read from such a tile.
__device__ __forceinline__ uint32_t sw128_offset(int r, int k) {
    return uint32_t(r) * 128u + ((uint32_t(k / 8) ^ uint32_t(r % 8)) << 4) + uint32_t(k % 8) * 2u;
}

}  // namespace ctx::cuda
