// CUDA backend (private, device code): the attention bias families evaluated on real-valued
// distances, shared by the materialised attention kernels (cuda_attention.cu) and the flash
// kernels (cuda_flash.cu), so both compute bit-identical logits.
#pragma once

#include "backend/cuda/cuda_kernels.h"

namespace ctx::cuda {

// BiasKind values (backend.h)
inline constexpr int kNone = 0, kLinear = 1, kKerpleLog = 2, kKerplePower = 3, kT5 = 4, kTable = 5;

__device__ __forceinline__ int key_start(int i, int window) {
    return window > 0 ? max(0, i - window + 1) : 0;
}

// First key query i of batch row b attends: the window's start, raised to its document's first
// token in packed rows (non-decreasing in i).
__device__ __forceinline__ int key_lo(const KeyMask& m, int b, int T, int i) {
    const int lo = key_start(i, m.window);
    return m.doc_start ? max(lo, int(m.doc_start[size_t(b) * T + i])) : lo;
}

// ================================================================ bias evaluation

// T5 bucket of d (METHODS.md 1.6), in double: the device twin of t5_bucket (op_common.h).
__device__ inline int t5_bucket_direct(double d, int nb, int md) {
    const double n = fmax(0.0, floor(d));
    const int me = nb / 2;
    if (n < me) return int(n);
    const double v = me + floor(log(n / me) / log(double(md) / me) * double(nb - me));
    return int(fmin(double(nb - 1), v));
}

// Bucket of d = pi - pj; the distance is formed in double (exact for float positions), so the
// floor at integer boundaries agrees with the CPU backend bit for bit.
__device__ __forceinline__ int t5_bucket(const BiasArgs& bs, float pi, float pj) {
    const double d = double(pi) - double(pj);
    if (bs.lut != nullptr) {
        const double md = bs.md;
        return bs.lut[int(d >= 0.0 ? (d < md ? d : md) : 0.0)];  // NaN lands on 0
    }
    return t5_bucket_direct(d, bs.nb, bs.md);
}

// bias_h(pi - pj) of the logit of query i, key j; trow is row i of the Table bias (else unused).
__device__ __forceinline__ float bias_value(const BiasArgs& bs, int h, float pi, float pj,
                                            const float* trow, int j) {
    switch (bs.kind) {
        case kLinear:
            return -(bs.a[h] * (pi - pj));
        case kKerpleLog:
            return -(bs.a[h] * logf(1.0f + bs.b[h] * fabsf(pi - pj)));
        case kKerplePower: {
            const float d = fabsf(pi - pj);
            return d > 0.0f ? -(bs.a[h] * powf(d, bs.b[h])) : 0.0f;  // |d|^b, 0 at d = 0
        }
        case kT5:
            return bs.a[size_t(h) * bs.nb + t5_bucket(bs, pi, pj)];
        case kTable:
            return trow[j];
        case kNone:
        default:
            return 0.0f;
    }
}

// T5 bucket gradients of one (rows, cols) tile of dS (row stride ld; Bk the tile's buckets, -1
// where masked): bucket x is owned by thread x % threads and summed in a fixed (row-major) order,
// tiles in order, so the sums are deterministic without atomics; gt[u] holds bucket
// tid + threads u (at most 4 threads' worth of buckets).
__device__ __forceinline__ void t5_tile_grad(double (&gt)[4], const int* Bk, const float* S,
                                             int rows, int cols, int ld, int tid, int threads) {
    for (int e = 0; e < rows * cols; e++) {
        const int rr = e / cols, cc = e % cols, bk = Bk[rr * ld + cc];
        if (bk >= 0 && bk % threads == tid) {
            const double v = double(S[rr * ld + cc]);
            const int u = bk / threads;
            if (u == 0) gt[0] += v;
            else if (u == 1) gt[1] += v;
            else if (u == 2) gt[2] += v;
            else gt[3] += v;
        }
    }
}

}  // namespace ctx::cuda
