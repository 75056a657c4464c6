// CUDA backend (private, device code): the bf16 tensor-core instruction the tensor-core flash
// kernels (cuda_flash_tc.cu) are written with, mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// (sm_80 and later), and the bf16 packing its operands use.
//
// Fragments (PTX ISA, "Matrix fragments for mma.m16n8k16", bf16), for lane L of the warp with
// g = L / 4 (group) and t = L % 4 (thread in group); a register holds two bf16, the lower
// column / row index in its low half:
//   A (16 x 16, row major)  a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
//                           a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   B (16 x 8, k x n)       b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
//   C, D (16 x 8, fp32)     c[0], c[1] = C[g][2t, 2t+1]    c[2], c[3] = C[g+8][2t, 2t+1]
// So the C fragments of two adjacent 8-column tiles are, packed to bf16, exactly the A fragment
// of one 16-column step: the FlashAttention-2 trick that keeps P in registers between S = Q K^T
// and O = P V.
//
// ldmatrix.x4 (ldsm_x4) loads four 8 x 8 bf16 matrices of a shared tile, lane L giving the row
// address of matrix L / 8, row L % 8. Lane L receives, of each matrix m, register f[m] = row L / 4,
// columns 2 (L % 4) and 2 (L % 4) + 1: the fragment layout above; with .trans (ldsm_x4_trans),
// column L / 4, rows 2 (L % 4) and 2 (L % 4) + 1, so a B operand stored k-major (V rows in O = P V)
// is read without a transposed copy. cp_async16 / cp_async4 (cp.async, sm_80) copy global memory
// to shared memory without registers: issued for the next tile while this one is computed, and
// waited for by group (cp_async_commit, cp_async_wait<N>).
//
// Built by nvcc, mma_bf16_16816 is the instruction; compiled by the CUDA emulation
// (engine/backend/cuda/emu, plain C++), it is the same product computed from the fragments of
// all 32 lanes with their exact layouts above, so the emulated kernels exercise the layout logic;
// ldmatrix is emulated the same way from the 32 lanes' row addresses, and cp.async by copies that
// land only when a wait covers them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#if !defined(__CUDACC__)
#include <cmath>
#include <cstring>
#endif

namespace ctx::cuda {

// The bf16 bit pattern of f, round to nearest even.
__device__ __forceinline__ uint32_t bf16_bits(float f) {
#if defined(__CUDACC__)
    return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(f)));
#else
    return uint32_t(__float2bfloat16_rn(f).x);
#endif
}

// Two floats as one register of bf16: lo in the low half (the lower index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    return bf16_bits(lo) | (bf16_bits(hi) << 16);
}

#if !defined(__CUDACC__)
// Emulation helpers: the float value of the low / high bf16 of a register.
inline float bf16_half(uint32_t r, int high) {
    const uint32_t u = (high ? (r >> 16) : (r & 0xffffu)) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}
#endif

// 2^x as the SFU computes it, flushing denormals to zero (ex2.approx.ftz.f32): one MUFU.EX2.
// exp2f without fast math wraps the same MUFU in a range test and two conditional multiplies
// that only matter for results below 2^-126, which a softmax probability entering a bf16
// product (or a sum of them) loses anyway: 3 of the ~8 instructions per logit of the flash
// kernels' loops. -inf gives +0, as the masked logits need.
__device__ __forceinline__ float exp2_ftz(float x) {
#if defined(__CUDACC__)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    const float y = std::exp2(x);
    return y < 1.17549435e-38f ? 0.0f : y;  // FLT_MIN: denormal results flush to +0
#endif
}

// d += A (16 x 16) B (16 x 8), fp32 accumulation; the warp's 32 lanes call it together.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2]) {
#if defined(__CUDACC__)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    struct Fragments {
        uint32_t a[4], b[2];
    };
    const Fragments mine = {{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
    Fragments all[32];
    emu::warp_gather(&mine, sizeof mine, all);
    const int lane = emu::lane_id(), g = lane >> 2, t = lane & 3;
    // A[r][k] lives in lane (r % 8) * 4 + (k % 8) / 2, register (r >= 8) + 2 (k >= 8), half k % 2;
    // B[k][n] in lane n * 4 + (k % 8) / 2, register (k >= 8), half k % 2.
    for (int e = 0; e < 4; e++) {
        const int r = g + (e >= 2 ? 8 : 0), n = 2 * t + (e & 1);
        float acc = d[e];
        for (int k = 0; k < 16; k++) {
            const float x = bf16_half(all[(r % 8) * 4 + (k % 8) / 2].a[(r >= 8) + 2 * (k >= 8)],
                                      k & 1);
            const float y = bf16_half(all[n * 4 + (k % 8) / 2].b[k >= 8], k & 1);
            acc = fmaf(x, y, acc);
        }
        d[e] = acc;
    }
#endif
}

// p[0..3] += (x, y, z, w) by fp32 atomics: one 16-byte reduction on sm_90 (p 16-byte aligned),
// four elsewhere (the emulation).
__device__ __forceinline__ void atomic_add_f32x4(float* p, float x, float y, float z, float w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4*>(p), make_float4(x, y, z, w));
#else
    atomicAdd(p, x), atomicAdd(p + 1, y), atomicAdd(p + 2, z), atomicAdd(p + 3, w);
#endif
}

// One 16 x 8 C fragment c (c[0], c[1]: row g, columns 2t, 2t + 1; c[2], c[3]: row g + 8) added
// to an fp32 row-major matrix by atomics four columns at a time, as the one-kernel backwards add
// their dq terms on sm_90 (every lane of the warp calls it): lanes t and t ^ 1 trade a pair, so
// that even t holds columns 4 (t / 2) .. + 3 of row g and odd t those of row g + 8, and add them
// by one 16-byte atomic: a quarter of the atomic operations of an atomic an entry, whose rate in
// L2 is estimated to bound the one-kernel pass before the tensor core does (docs/CUDA.md "dq by
// atomics, four columns at a time"). row: the block's column 0 in the lane's own row, g + 8
// (t & 1), 16-byte aligned, or null (not written); columns from `cols` (a multiple of 4) on are
// left out.
__device__ __forceinline__ void atomic_add_c_quads(const float (&c)[4], float* row, int cols,
                                                   int t) {
    const bool odd = (t & 1) != 0;
    const float s0 = __shfl_xor_sync(0xffffffffu, odd ? c[0] : c[2], 1),
                s1 = __shfl_xor_sync(0xffffffffu, odd ? c[1] : c[3], 1);
    const int col = 4 * (t >> 1);
    if (row == nullptr || col >= cols) return;
    if (odd)
        atomic_add_f32x4(row + col, s0, s1, c[2], c[3]);
    else
        atomic_add_f32x4(row + col, c[0], c[1], s0, s1);
}

// Four 8 x 8 matrices of bf16 from shared memory (row addresses p, one per lane, 16-byte aligned).
template <bool kTrans>
__device__ __forceinline__ void ldsm_x4_impl(uint32_t (&f)[4], const uint16_t* p) {
#if defined(__CUDACC__)
    const uint32_t a = uint32_t(__cvta_generic_to_shared(p));
    if constexpr (kTrans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
                     : "r"(a)
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
                     : "r"(a)
                     : "memory");
#else
    const uint16_t* rows[32];
    emu::warp_gather(&p, sizeof p, rows);
    const int lane = emu::lane_id(), g = lane >> 2, t = lane & 3;
    for (int m = 0; m < 4; m++) {
        uint16_t lo, hi;
        if (kTrans) {  // column g of rows 2t, 2t + 1
            lo = rows[8 * m + 2 * t][g];
            hi = rows[8 * m + 2 * t + 1][g];
        } else {  // row g, columns 2t, 2t + 1
            lo = rows[8 * m + g][2 * t];
            hi = rows[8 * m + g][2 * t + 1];
        }
        f[m] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
#endif
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&f)[4], const uint16_t* p) {
    ldsm_x4_impl<false>(f, p);
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&f)[4], const uint16_t* p) {
    ldsm_x4_impl<true>(f, p);
}

// 16 bytes global -> shared, asynchronously (both addresses 16-byte aligned).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if defined(__CUDACC__)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                     uint32_t(__cvta_generic_to_shared(dst))),
                 "l"(src)
                 : "memory");
#else
    emu::cp_async(dst, src, 16, 16);
#endif
}

// 4 bytes global -> shared, asynchronously; zeros instead when !valid (src is then not read).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
#if defined(__CUDACC__)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(
                     uint32_t(__cvta_generic_to_shared(dst))),
                 "l"(src), "r"(valid ? 4 : 0)
                 : "memory");
#else
    emu::cp_async(dst, src, 4, valid ? 4 : 0);
#endif
}

// Closes the group of the copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDACC__)
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
    emu::cp_async_commit();
#endif
}

// Waits until at most N committed groups (the newest) are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDACC__)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#else
    emu::cp_async_wait(N);
#endif
}

}  // namespace ctx::cuda
