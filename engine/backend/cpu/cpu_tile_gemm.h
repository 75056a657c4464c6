// Small matrix products for the CPU kernels: C (M, N) = alpha * A (M, K) B (K, N) [+ C], with A
// read through two strides (so A or A^T), B row-major. Written for the shapes BLAS handles
// worst: attention's per-head products at head dims 32-64 and 64-256 keys, where OpenBLAS spends
// more time packing and dispatching than multiplying (13-19 GFLOP/s measured; docs/BENCHMARKS.md).
//
// The micro-kernel keeps an (MR rows) x (NV vectors) tile of C in registers and walks k once:
// broadcast A[r, k], load B[k, j:j+NV*lanes], FMA. Nothing is packed: B's rows are read where
// they lie (any ldb), A's elements one at a time (any strides). The vectors are the build ISA's
// build's widest float vector (-march: 16 lanes on AVX-512, 8 on AVX2 + FMA, else scalar).
//
// Every C element is one FMA chain over k in increasing order, whatever the vector width, the
// tile it falls in or the thread that computes it: results are bit-identical across AVX2 and
// AVX-512 builds and across thread counts. A column tail (N not a multiple of the lanes) is
// loaded and stored lane by lane, never touching memory beyond B's or C's N columns.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace ctx::cpu {

#if defined(__AVX512F__)
inline constexpr int kTileLanes = 16;
inline constexpr int kTileNV = 4;  // 4 x 4 accumulators of 32 zmm registers
#elif defined(__AVX2__) && defined(__FMA__)
inline constexpr int kTileLanes = 8;
inline constexpr int kTileNV = 2;  // 4 x 2 accumulators of 16 ymm registers
#else
inline constexpr int kTileLanes = 1;  // portable scalar fallback (the same FMA chains)
inline constexpr int kTileNV = 4;
#endif
// Rows per call: up to 8 when a column chunk has few vectors (8 x 2 accumulators on AVX-512, 8 x 1
// on AVX2: enough independent FMA chains to cover the FMA latency when N is a head dim of 32),
// else 4 (4 x kTileNV accumulators).
inline constexpr int kTileMR = 8;
inline constexpr int kTileWideNV = kTileLanes == 16 ? 2 : 1;  // chunks of <= this many vectors take 8 rows
inline constexpr int kTileCols = kTileLanes * kTileNV;  // columns one micro-kernel call covers

namespace tile_detail {

// The vector of the build's ISA. Loads and stores of a tail touch lanes [0, n) only (masked).
#if defined(__AVX512F__)
using Vec = __m512;
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline __mmask16 lanes(int n) { return __mmask16((1u << n) - 1u); }
inline Vec load_part(const float* p, int n) { return _mm512_maskz_loadu_ps(lanes(n), p); }
inline void store_part(float* p, Vec v, int n) { _mm512_mask_storeu_ps(p, lanes(n), v); }
inline Vec broadcast(float x) { return _mm512_set1_ps(x); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec zero() { return _mm512_setzero_ps(); }
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline __m256i lanes(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline Vec load_part(const float* p, int n) { return _mm256_maskload_ps(p, lanes(n)); }
inline void store_part(float* p, Vec v, int n) { _mm256_maskstore_ps(p, lanes(n), v); }
inline Vec broadcast(float x) { return _mm256_set1_ps(x); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec zero() { return _mm256_setzero_ps(); }
#else
using Vec = float;
inline Vec load(const float* p) { return *p; }
inline void store(float* p, Vec v) { *p = v; }
inline Vec load_part(const float* p, int) { return *p; }
inline void store_part(float* p, Vec v, int) { *p = v; }
inline Vec broadcast(float x) { return x; }
inline Vec fma(Vec a, Vec b, Vec c) { return std::fma(a, b, c); }
inline Vec mul(Vec a, Vec b) { return a * b; }
inline Vec zero() { return 0.0f; }
#endif

// C[r, c*lanes + l] for r < MR, c < NV; the last vector holds `tail` lanes (Tail) or all.
// C = alpha * acc, or fma(alpha, acc, C) when accumulating: the same operations on every ISA.
template <int MR, int NV, bool Tail>
inline void micro(int K, float alpha, const float* A, ptrdiff_t a_rs, ptrdiff_t a_ks,
                  const float* B, ptrdiff_t ldb, float* C, ptrdiff_t ldc, bool accumulate,
                  int tail) {
    Vec acc[MR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
        for (int c = 0; c < NV; c++) acc[r][c] = zero();
    for (int k = 0; k < K; k++) {
        const float* b = B + k * ldb;
        Vec bv[NV];
#pragma GCC unroll 8
        for (int c = 0; c < NV; c++)
            bv[c] = (Tail && c == NV - 1) ? load_part(b + c * kTileLanes, tail)
                                          : load(b + c * kTileLanes);
        const float* a = A + k * a_ks;
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            const Vec ar = broadcast(a[r * a_rs]);
#pragma GCC unroll 8
            for (int c = 0; c < NV; c++) acc[r][c] = fma(ar, bv[c], acc[r][c]);
        }
    }
    const Vec al = broadcast(alpha);
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        float* cr = C + r * ldc;
#pragma GCC unroll 8
        for (int c = 0; c < NV; c++) {
            float* p = cr + c * kTileLanes;
            if (Tail && c == NV - 1)
                store_part(p, accumulate ? fma(al, acc[r][c], load_part(p, tail))
                                         : mul(al, acc[r][c]), tail);
            else
                store(p, accumulate ? fma(al, acc[r][c], load(p)) : mul(al, acc[r][c]));
        }
    }
}

template <int MR, int NV>
inline void micro_cols(int K, float alpha, const float* A, ptrdiff_t a_rs, ptrdiff_t a_ks,
                       const float* B, ptrdiff_t ldb, float* C, ptrdiff_t ldc, bool accumulate,
                       int tail) {
    if (tail == kTileLanes)
        micro<MR, NV, false>(K, alpha, A, a_rs, a_ks, B, ldb, C, ldc, accumulate, tail);
    else
        micro<MR, NV, true>(K, alpha, A, a_rs, a_ks, B, ldb, C, ldc, accumulate, tail);
}

template <int MR>
inline void micro_rows(int nv, int K, float alpha, const float* A, ptrdiff_t a_rs,
                       ptrdiff_t a_ks, const float* B, ptrdiff_t ldb, float* C, ptrdiff_t ldc,
                       bool accumulate, int tail) {
#define CTX_TILE_COLS(NV) \
    return micro_cols<MR, NV>(K, alpha, A, a_rs, a_ks, B, ldb, C, ldc, accumulate, tail)
    if constexpr (MR > 4) {  // only chunks of <= kTileWideNV vectors come here (tile_gemm_rows)
        if constexpr (kTileWideNV >= 2)
            if (nv == 2) CTX_TILE_COLS(2);
        CTX_TILE_COLS(1);
    } else {
        if constexpr (kTileNV >= 4) {
            if (nv == 4) CTX_TILE_COLS(4);
            if (nv == 3) CTX_TILE_COLS(3);
        }
        if (nv == 2) CTX_TILE_COLS(2);
        CTX_TILE_COLS(1);
    }
#undef CTX_TILE_COLS
}

}  // namespace tile_detail

// Rows [0, mr) of C, mr <= kTileMR, all N columns: C[r, n] = alpha * sum_k A[r*a_rs + k*a_ks] *
// B[k*ldb + n] (+ C[r*ldc + n] when accumulate). K = 0 gives alpha * 0 (+ C).
inline void tile_gemm_rows(int mr, int N, int K, float alpha, const float* A, ptrdiff_t a_rs,
                           ptrdiff_t a_ks, const float* B, ptrdiff_t ldb, float* C,
                           ptrdiff_t ldc, bool accumulate) {
    using namespace tile_detail;
    for (int j = 0; j < N; j += kTileCols) {
        const int n = std::min(kTileCols, N - j);
        const int nv = (n + kTileLanes - 1) / kTileLanes;
        const int tail = n - (nv - 1) * kTileLanes;
        const float* b = B + j;
        float* c = C + j;
        // Up to 4 rows, or up to 8 on a narrow chunk, per micro-kernel call.
        for (int r = 0; r < mr;) {
            const int rows = std::min(mr - r, nv <= kTileWideNV ? 8 : 4);
            const float* a = A + r * a_rs;
            float* cr = c + r * ldc;
            switch (rows) {
#define CTX_TILE_ROWS(R) \
    case R: micro_rows<R>(nv, K, alpha, a, a_rs, a_ks, b, ldb, cr, ldc, accumulate, tail); break;
                CTX_TILE_ROWS(8) CTX_TILE_ROWS(7) CTX_TILE_ROWS(6) CTX_TILE_ROWS(5)
                CTX_TILE_ROWS(4) CTX_TILE_ROWS(3) CTX_TILE_ROWS(2) CTX_TILE_ROWS(1)
#undef CTX_TILE_ROWS
            }
            r += rows;
        }
    }
}

// dst[c, r] = src[r * lds + c] for r < rows, c < cols (dst row-major, ld ldd): a matrix transposed
// into a panel (attention's keys to (D, T), so that score rows are contiguous). 8 x 8 blocks go
// through registers (AVX: 24 shuffles per 64 floats instead of 64 scalar load-store pairs).
inline void transpose_into(float* dst, ptrdiff_t ldd, const float* src, ptrdiff_t lds, int rows,
                           int cols) {
    int r0 = 0;
#if defined(__AVX__)
    for (; r0 + 8 <= rows; r0 += 8) {
        int c0 = 0;
        for (; c0 + 8 <= cols; c0 += 8) {
            const float* s = src + r0 * lds + c0;
            __m256 x[8], y[8];
            for (int i = 0; i < 8; i++) x[i] = _mm256_loadu_ps(s + i * lds);
            for (int i = 0; i < 8; i += 2) {  // pairs of rows interleaved
                y[i] = _mm256_unpacklo_ps(x[i], x[i + 1]);
                y[i + 1] = _mm256_unpackhi_ps(x[i], x[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {  // groups of four rows
                x[i] = _mm256_shuffle_ps(y[i], y[i + 2], 0x44);
                x[i + 1] = _mm256_shuffle_ps(y[i], y[i + 2], 0xEE);
                x[i + 2] = _mm256_shuffle_ps(y[i + 1], y[i + 3], 0x44);
                x[i + 3] = _mm256_shuffle_ps(y[i + 1], y[i + 3], 0xEE);
            }
            float* d = dst + c0 * ldd + r0;
            for (int i = 0; i < 4; i++) {  // 128-bit halves of rows i and i + 4
                _mm256_storeu_ps(d + i * ldd, _mm256_permute2f128_ps(x[i], x[i + 4], 0x20));
                _mm256_storeu_ps(d + (i + 4) * ldd, _mm256_permute2f128_ps(x[i], x[i + 4], 0x31));
            }
        }
        for (; c0 < cols; c0++)
            for (int r = r0; r < r0 + 8; r++) dst[c0 * ldd + r] = src[r * lds + c0];
    }
#endif
    for (int r = r0; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[c * ldd + r] = src[r * lds + c];
}

// The whole (M, N) product, kTileMR rows at a time (one thread; callers parallelise outside).
inline void tile_gemm(int M, int N, int K, float alpha, const float* A, ptrdiff_t a_rs,
                      ptrdiff_t a_ks, const float* B, ptrdiff_t ldb, float* C, ptrdiff_t ldc,
                      bool accumulate) {
    for (int i = 0; i < M; i += kTileMR)
        tile_gemm_rows(std::min(kTileMR, M - i), N, K, alpha, A + i * a_rs, a_rs, a_ks, B, ldb,
                       C + i * ldc, ldc, accumulate);
}

}  // namespace ctx::cpu
