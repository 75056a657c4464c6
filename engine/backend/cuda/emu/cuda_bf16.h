// CPU emulation of the part of NVIDIA's <cuda_bf16.h> the ctxengine CUDA backend uses (the
// __nv_bfloat16 storage type and the round-to-nearest-even conversion), for checking the backend's
// LOGIC on a machine without a GPU (engine/backend/cuda/emu/run_emulated_tests.py). Not part of
// any build target. Not to be confused with engine/backend/cuda/cuda_bf16.h (the backend's own
// launcher declarations).
#pragma once
#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
    uint16_t x;  // the bit pattern: the upper 16 bits of an fp32 number
};

// fp32 -> bf16, round to nearest, ties to even, as __float2bfloat16_rn (cvt.rn.bf16.f32): NaN ->
// the canonical 0x7fff, values beyond the largest bf16 (after rounding) -> +-inf, subnormals kept.
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.x = 0x7fffu;
        return r;
    }
    // add just under half an ulp of bf16, plus one when the kept part is odd (ties to even)
    r.x = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return r;
}

inline float __bfloat162float(__nv_bfloat16 h) {
    const uint32_t u = uint32_t(h.x) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}
