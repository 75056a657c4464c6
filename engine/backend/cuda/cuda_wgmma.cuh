// CUDA backend (private, device code): the sm_90 warpgroup tensor-core instruction,
// wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 (sm_90a), its shared-memory operand
// descriptors and its ordering instructions, with an exact emulation for the CPU build.
//
// A warpgroup is 4 warps (128 threads, the first a multiple of 128 in the block). One wgmma
// computes D (64 x N, fp32) += A (64 x 16) B (16 x N) for the whole group, asynchronously:
//   wgmma_fence_after(regs...)    before the first product and after registers it reads (A
//                                 fragments, accumulators) were written by other instructions
//   wgmma_ss / wgmma_rs ...       issued products (A from shared memory, or from registers)
//   wgmma_commit()                closes a group of them
//   wgmma_wait<N>()               until at most N groups are in flight; then
//   wgmma_fence_operands(d)       so the compiler reads d only after the wait
// Shared memory written by ordinary stores (or cp.async) before a product reads it is made
// visible to the tensor core's (async) proxy by fence_proxy_async() before the barrier.
//
// Layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix"):
//   Operands in shared memory, no swizzle: 8 x 8 "core matrices" of bf16, each 8 rows of 16
//   contiguous bytes (128 bytes); core matrix (r / 8, k / 8) of an M (or N) x K operand at
//   start + (r / 8) SBO + (k / 8) LBO. K-major (the default): a core matrix's 16-byte rows run
//   along K, so B is given as its transpose (N rows of K) and K and Q rows serve as B and A of
//   S = Q K^T as they are stored. B N-major (kTransB): the rows run along N, as V's rows (head
//   dim at one key) do for O = P V. wgmma_desc encodes start, LBO and SBO (each >> 4, 14 bits)
//   with swizzle mode 0; which stride steps which dimension in the N-major case is as we read
//   the PTX ISA and CUTLASS's layout notes (LBO along K there too), to be confirmed by the check
//   on a GPU.
//   A from registers (wgmma_rs): warp w of the group holds rows 16 w .. 16 w + 15 as the A
//   fragment of mma.m16n8k16 (cuda_mma.cuh): the C fragments of a previous product, packed to
//   bf16, are A fragments, as FlashAttention-3 feeds P to P V.
//   Accumulators d[N / 2]: thread (w, g = lane / 4, t = lane % 4) holds d[4 i + 2 h + e] =
//   D[16 w + g + 8 h][8 i + 2 t + e]: mma.m16n8k16's C fragment, once per 8 columns.
//
// Built by nvcc for sm_90a (the only target with wgmma; other targets trap, and the host never
// launches them there), these are the instructions; compiled by the CUDA emulation they are a
// per-thread computation from the descriptors and the warp's gathered A fragments that runs
// when a wait covers it (emu/cuda_runtime.h), so the emulated kernels exercise the layouts,
// the grouping and the waits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_mma.cuh"

namespace ctx::cuda {

// The shared-memory address of smem (the emulation: its offset in the dynamic shared memory).
__device__ __forceinline__ uint32_t shared_address(const void* smem) {
#if defined(__CUDACC__)
    return uint32_t(__cvta_generic_to_shared(smem));
#else
    return emu::kSharedBase +
           uint32_t(static_cast<const char*>(smem) - static_cast<const char*>(emu::dyn_shared()));
#endif
}

// A K-major, no-swizzle shared-memory operand starting at shared address addr (16-byte
// aligned): core matrices LBO bytes apart along K and SBO bytes apart along M / N.
__device__ __forceinline__ uint64_t wgmma_desc_at(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t((lbo >> 4) & 0x3FFFu) << 16) |
           (uint64_t((sbo >> 4) & 0x3FFFu) << 32);
}
__device__ __forceinline__ uint64_t wgmma_desc(const void* smem, uint32_t lbo, uint32_t sbo) {
    return wgmma_desc_at(shared_address(smem), lbo, sbo);
}
// An operand with the 128-byte swizzle (mode 1; the layout TMA's 128-byte swizzle writes,
// cuda_tma.cuh), in 1024-byte atoms of 8 rows of 128 bytes whose 16-byte chunk c sits at
// c ^ (address bits 7-9). K-major: rows of 64 K values 128 bytes apart, 8-row groups SBO apart,
// the start advanced 32 bytes per K step of 16 (LBO unused: 16). MN-major: K rows of 64 M / N
// values 128 bytes apart, 8-row groups SBO apart, the next 64 M / N values LBO apart (the
// strides trade roles against the no-swizzle MN-major layout; CUTLASS's canonical GMMA layouts).
__device__ __forceinline__ uint64_t wgmma_desc_sw128_at(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return wgmma_desc_at(addr, lbo, sbo) | (uint64_t(1) << 62);
}
__device__ __forceinline__ uint64_t wgmma_desc_sw128(const void* smem, uint32_t lbo, uint32_t sbo) {
    return wgmma_desc_sw128_at(shared_address(smem), lbo, sbo);
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#elif defined(__CUDACC__)
    __trap();
#else
    emu::warpgroup_barrier();
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#elif defined(__CUDACC__)
    __trap();
#else
    emu::wgmma_commit();
#endif
}

// setmaxnreg: this warpgroup's registers a thread become kRegs (24-256, a multiple of 8),
// collectively; a producer warpgroup gives registers back (kIncrease false) and consumers take
// them (true: waits until the block's pool has them). The kernel's launch bounds set the count
// every warpgroup starts with; the counts after must fit the 64 K registers of the block's SM
// share.
template <int kRegs, bool kIncrease>
__device__ __forceinline__ void warpgroup_max_registers() {
    static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg's range");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (kIncrease)
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
    else
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#elif defined(__CUDACC__)
    __trap();
#else
    emu::set_max_registers(kRegs);
#endif
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#elif defined(__CUDACC__)
    __trap();
#else
    emu::wgmma_wait(N);
#endif
}

// Shared memory written by the generic proxy (st.shared, cp.async) visible to wgmma's reads.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Keeps the compiler from moving reads of the accumulators above the wait that completes them
// (the wait names no registers), and writes of a product's registers below the fence before it
// (wgmma_fence_after).
template <int R>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[R]) {
#if defined(__CUDACC__)
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
#else
    (void)d;  // the emulated wait wrote them already
#endif
}
template <int R>
__device__ __forceinline__ void wgmma_fence_operands(uint32_t (&f)[R]) {
#if defined(__CUDACC__)
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+r"(f[i])::"memory");
#else
    (void)f;
#endif
}
template <int M, class X, int R>
__device__ __forceinline__ void wgmma_fence_operands(X (&x)[M][R]) {
#pragma unroll
    for (int m = 0; m < M; m++) wgmma_fence_operands(x[m]);
}

// wgmma_fence() once the registers the next products read (accumulators, A fragments) have
// their values: the fence names no registers, so without the operands tied to this point the
// compiler could sink their last writes (O's rescale, P's packing) below it.
template <class... Regs>
__device__ __forceinline__ void wgmma_fence_after(Regs&... regs) {
    (wgmma_fence_operands(regs), ...);
    wgmma_fence();
}

#if !defined(__CUDACC__)
namespace wgmma_emu {
// This thread's rows g and g + 8 of its warp's A (16 x 16) from the 32 lanes' fragments.
inline void a_rows(const uint32_t (&a)[4], float (&rows)[32]) {
    struct Frag {
        uint32_t a[4];
    };
    const Frag mine = {{a[0], a[1], a[2], a[3]}};
    Frag all[32];
    emu::warp_gather(&mine, sizeof mine, all);
    const int g = emu::lane_id() >> 2;
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 16; k++) {
            const int r = g + 8 * h;
            rows[16 * h + k] =
                bf16_half(all[(r % 8) * 4 + (k % 8) / 2].a[(r >= 8) + 2 * (k >= 8)], k & 1);
        }
}
}  // namespace wgmma_emu
#endif

// The products for N 64 and 128. Inline PTX names every accumulator register, so the operand
// lists are spelled out once per N (CTX_WGMMA_REGS*: the string, CTX_WGMMA_ACC*: the operands) and
// the scalar operands follow them: descriptor(s) or A's four registers, scale-d, trans-b. kTransB:
// B read N-major (its core matrices' 16-byte rows run along N: 8 N values at one K, as V's rows
// hold head-dim entries at one key) instead of K-major; no swizzle either way, LBO along K and SBO
// along N (the PTX ISA's "interleave" layouts).
#define CTX_WGMMA_REGS16                   \
    "{"                                    \
    "%0, %1, %2, %3, %4, %5, %6, %7, "     \
    "%8, %9, %10, %11, %12, %13, %14, %15" \
    "}"
#define CTX_WGMMA_ACC16(d)                                                                      \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),         \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
        "+f"(d[14]), "+f"(d[15])
#define CTX_WGMMA_REGS32                       \
    "{"                                        \
    "%0, %1, %2, %3, %4, %5, %6, %7, "         \
    "%8, %9, %10, %11, %12, %13, %14, %15, "   \
    "%16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31"   \
    "}"
#define CTX_WGMMA_ACC32(d)                                                                         \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define CTX_WGMMA_REGS64                       \
    "{"                                        \
    "%0, %1, %2, %3, %4, %5, %6, %7, "         \
    "%8, %9, %10, %11, %12, %13, %14, %15, "   \
    "%16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, " \
    "%40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, " \
    "%56, %57, %58, %59, %60, %61, %62, %63"   \
    "}"
#define CTX_WGMMA_ACC64(d)                                                                         \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),            \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
        "+f"(d[63])
#define CTX_WGMMA_PRED(n) "{\n.reg .pred p;\nsetp.ne.b32 p, %" #n ", 0;\n"

template <int N, bool kTransB>
struct WgmmaOps {
    static_assert(N == 32 || N == 64 || N == 128, "the products written out: N 32, 64 and 128");
    static __device__ __forceinline__ void ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                              bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        if constexpr (N == 32)
            asm volatile(
                CTX_WGMMA_PRED(
                    18) "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " CTX_WGMMA_REGS16
                        ", %16, %17, p, 1, 1, 0, %19;\n}\n"
                : CTX_WGMMA_ACC16(d)
                : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(int(kTransB)));
        else if constexpr (N == 64)
            asm volatile(
                CTX_WGMMA_PRED(
                    34) "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " CTX_WGMMA_REGS32
                        ", %32, %33, p, 1, 1, 0, %35;\n}\n"
                : CTX_WGMMA_ACC32(d)
                : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(int(kTransB)));
        else
            asm volatile(
                CTX_WGMMA_PRED(
                    66) "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " CTX_WGMMA_REGS64
                        ", %64, %65, p, 1, 1, 0, %67;\n}\n"
                : CTX_WGMMA_ACC64(d)
                : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(int(kTransB)));
#elif defined(__CUDACC__)
        __trap();
#else
        emu::wgmma_issue(d, N, nullptr, nullptr, desc_a, desc_b, accumulate, kTransB);
#endif
    }
    static __device__ __forceinline__ void rs(float (&d)[N / 2], const uint32_t (&a)[4],
                                              uint64_t desc_b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        if constexpr (N == 32)
            asm volatile(
                CTX_WGMMA_PRED(
                    21) "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " CTX_WGMMA_REGS16
                        ", {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
                : CTX_WGMMA_ACC16(d)
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)),
                  "n"(int(kTransB)));
        else if constexpr (N == 64)
            asm volatile(
                CTX_WGMMA_PRED(
                    37) "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " CTX_WGMMA_REGS32
                        ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                : CTX_WGMMA_ACC32(d)
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)),
                  "n"(int(kTransB)));
        else
            asm volatile(
                CTX_WGMMA_PRED(
                    69) "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " CTX_WGMMA_REGS64
                        ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
                : CTX_WGMMA_ACC64(d)
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)),
                  "n"(int(kTransB)));
#elif defined(__CUDACC__)
        __trap();
#else
        float rows[32];
        wgmma_emu::a_rows(a, rows);
        emu::wgmma_issue(d, N, rows, a, 0, desc_b, accumulate, kTransB);
#endif
    }
};

#undef CTX_WGMMA_PRED
#undef CTX_WGMMA_ACC64
#undef CTX_WGMMA_REGS64
#undef CTX_WGMMA_ACC32
#undef CTX_WGMMA_REGS32
#undef CTX_WGMMA_ACC16
#undef CTX_WGMMA_REGS16

// d (64 x N) (+)= A B with A (64 x 16) and B (16 x N; stored as N x 16, or N-major with
// kTransB) from shared memory. accumulate false ignores d's old values (scale-d 0).
template <int N, bool kTransB = false>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                         bool accumulate) {
    WgmmaOps<N, kTransB>::ss(d, desc_a, desc_b, accumulate);
}
// The same with A from registers: this warp's 16 rows as an m16n8k16 A fragment.
template <int N, bool kTransB = false>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                         bool accumulate) {
    WgmmaOps<N, kTransB>::rs(d, a, desc_b, accumulate);
}

}  // namespace ctx::cuda
