// CUDA backend (private, device code only): the rotary position embedding's arithmetic, shared by
// the separate pass over qkv (rotary_kernel, cuda_attention.cu) and the tensor-core flash kernels
// that apply it themselves (cuda_flash_tc*.cu: q and k rotated as they are packed, dq and dk as
// they are written). Both paths use these functions, with explicitly rounded operations (no
// contraction a compiler could choose differently in each kernel), so they give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "backend/cuda/cuda_kernels.h"

namespace ctx::cuda {

// Pair k's rotation at one position (ctx_rotary_spec's formula, include/ctx/plugin.h): cos and
// sin of the angle, and the scales of q and of k. 16-byte aligned: one vector load a pair.
struct alignas(16) PairRotation {
    float c, s, sq, sk;
};

// The angle and scales in double (positions reach ~1e5, where a float angle would be off by
// ~1e-2 rad), rounded to float once.
__device__ inline PairRotation pair_rotation(float p, int k, const RotaryArgs& r) {
    const double ang = double(p) * double(r.position_scale) * double(r.inv_freq[k]);
    double sd, cd;
    sincos(ang, &sd, &cd);
    double qs = r.attention_factor, ks = r.attention_factor;
    if (r.amp_base != nullptr) {  // xPos: q scaled by amp^(p / base), k by its inverse
        const double e = double(p) / double(r.amp_scale_base);
        qs *= pow(double(r.amp_base[k]), e);
        ks *= pow(double(r.amp_base[k]), -e);
    }
    return PairRotation{float(cd), float(sd), float(qs), float(ks)};
}

// The two entries of a rotated pair (a0, a1): sc (c a0 - sa a1) and sc (sa a0 + c a1), with
// sa = sin for the forward map and -sin for its transpose (the backward).
__device__ __forceinline__ float rotated_first(float c, float sa, float sc, float a0, float a1) {
    return __fmul_rn(sc, __fmaf_rn(c, a0, -__fmul_rn(sa, a1)));
}
__device__ __forceinline__ float rotated_second(float c, float sa, float sc, float a0, float a1) {
    return __fmul_rn(sc, __fmaf_rn(sa, a0, __fmul_rn(c, a1)));
}

// Entry d (< dr) of a head's rotated row x (x[d'] for d' < dr): its pair's index k, whether it
// is the pair's first entry, and its partner's index. Half (GPT-NeoX): pairs (k, k + dr / 2);
// Interleaved (GPT-J): pairs (2 k, 2 k + 1).
struct PairSlot {
    int k, partner;
    bool first;
};
__device__ __forceinline__ PairSlot pair_slot(int d, int dr, int layout) {
    const int half = dr / 2;
    if (layout == 0) {
        const bool first = d < half;
        return PairSlot{first ? d : d - half, first ? d + half : d - half, first};
    }
    return PairSlot{d / 2, d ^ 1, (d & 1) == 0};
}

// Entry d of the rotated row x (the caller checks d < dr): the forward map with the token's
// pair rotations row[k], q's scale or k's (is_k).
__device__ __forceinline__ float rotated_entry(const float* x, int d, int dr, int layout,
                                               const PairRotation* row, bool is_k) {
    const PairSlot ps = pair_slot(d, dr, layout);
    const PairRotation& rt = row[ps.k];
    const float sc = is_k ? rt.sk : rt.sq;
    return ps.first ? rotated_first(rt.c, rt.s, sc, x[d], x[ps.partner])
                    : rotated_second(rt.c, rt.s, sc, x[ps.partner], x[d]);
}

// ---------------------------------------------------------------- on mma C fragments
// The tensor-core backward's epilogues (cuda_flash_tc_bwd.cu): a thread's C fragments of a
// 16-row tile hold, for rows r = 0, 1 (its groupID and groupID + 8), columns dn * 8 + 2 t + e
// in x[dn][2 r + e] (t: its index within the quad).

// The gradient w.r.t. the rotated q or k (a thread's C fragments x, rows r = 0, 1 whose pair
// rotations start at rt[r], null past T) becomes the gradient w.r.t. the unrotated one: the
// transpose of each pair's rotation (sin negated), with q's scale or k's (is_k), exactly as
// rotary_backward turns the stored rows. Half layout: pair (d, d + dr / 2) is accumulators dn
// and dn + H8 of one thread, H8 = dr / 16 (a compile-time constant, so x stays in registers).
template <int DN, int H8>
__device__ __forceinline__ void rotate_back_half(float (&x)[DN][4],
                                                 const PairRotation* const (&rt)[2], bool is_k,
                                                 int t) {
    static_assert(2 * H8 <= DN, "pairs within the head dim");
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (rt[r] == nullptr) continue;
#pragma unroll
        for (int dn = 0; dn < H8; dn++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int i = 2 * r + e;
                const PairRotation p = rt[r][dn * 8 + 2 * t + e];
                const float sc = is_k ? p.sk : p.sq, a0 = x[dn][i], a1 = x[dn + H8][i];
                x[dn][i] = rotated_first(p.c, -p.s, sc, a0, a1);
                x[dn + H8][i] = rotated_second(p.c, -p.s, sc, a0, a1);
            }
    }
}
template <int DN, int H8 = 1>
__device__ __forceinline__ void rotate_back_half_n(float (&x)[DN][4],
                                                   const PairRotation* const (&rt)[2], bool is_k,
                                                   int t, int h8) {
    if constexpr (H8 <= DN / 2) {
        if (h8 == H8)
            rotate_back_half<DN, H8>(x, rt, is_k, t);
        else
            rotate_back_half_n<DN, H8 + 1>(x, rt, is_k, t, h8);
    }
}
// The fragments' rows are tokens row[r] of batch row b (none at or past T).
template <int DN>
__device__ __forceinline__ void rotate_back_rows(float (&x)[DN][4], const RotationTable& rot, int b,
                                                 int T, const int (&row)[2], bool is_k, int t) {
    const auto* table = reinterpret_cast<const PairRotation*>(rot.table);
    const int half = rot.dr / 2;
    const PairRotation* rt[2];
#pragma unroll
    for (int r = 0; r < 2; r++)
        rt[r] = row[r] < T ? table + (size_t(b) * T + row[r]) * half : nullptr;
    if (rot.layout == 0) {
        rotate_back_half_n<DN>(x, rt, is_k, t, half / 8);
        return;
    }
    // Interleaved: pair (2 k, 2 k + 1) is entries e = 0, 1 of one accumulator
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (rt[r] == nullptr) continue;
#pragma unroll
        for (int dn = 0; dn < DN; dn++) {
            const int d = dn * 8 + 2 * t;
            if (d >= rot.dr) continue;
            const PairRotation p = rt[r][d / 2];
            const float sc = is_k ? p.sk : p.sq, a0 = x[dn][2 * r], a1 = x[dn][2 * r + 1];
            x[dn][2 * r] = rotated_first(p.c, -p.s, sc, a0, a1);
            x[dn][2 * r + 1] = rotated_second(p.c, -p.s, sc, a0, a1);
        }
    }
}

}  // namespace ctx::cuda
