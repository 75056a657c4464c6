// Measured FMA throughput (cpu_peak.h).
#include "backend/cpu/cpu_peak.h"

#include <omp.h>

#include <algorithm>
#include <chrono>

#include "backend/cpu/cpu_blas.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ctx::cpu {

namespace {

constexpr int kChains = 12;  // independent FMA chains per thread
constexpr long kIters = 4'000'000;  // x 12 FMAs: about 0.1 s at 2-4 GHz with two pipes

#if defined(__x86_64__)
// Twelve named accumulators, each its own dependency chain (an array would live on the stack).
// The empty asm keeps the compiler from merging chains or dropping the work.
#define CTX_FMA_CHAINS(VEC, SET1, FMADD, REG)                                            \
    VEC a0 = SET1(0.00f), a1 = SET1(0.01f), a2 = SET1(0.02f), a3 = SET1(0.03f);          \
    VEC a4 = SET1(0.04f), a5 = SET1(0.05f), a6 = SET1(0.06f), a7 = SET1(0.07f);          \
    VEC a8 = SET1(0.08f), a9 = SET1(0.09f), a10 = SET1(0.10f), a11 = SET1(0.11f);        \
    const VEC m = SET1(0.999f), c = SET1(1e-4f);                                         \
    for (long k = 0; k < kIters; k++) {                                                  \
        a0 = FMADD(a0, m, c); a1 = FMADD(a1, m, c); a2 = FMADD(a2, m, c);                \
        a3 = FMADD(a3, m, c); a4 = FMADD(a4, m, c); a5 = FMADD(a5, m, c);                \
        a6 = FMADD(a6, m, c); a7 = FMADD(a7, m, c); a8 = FMADD(a8, m, c);                \
        a9 = FMADD(a9, m, c); a10 = FMADD(a10, m, c); a11 = FMADD(a11, m, c);            \
        __asm__ volatile("" : "+" REG(a0), "+" REG(a1), "+" REG(a2), "+" REG(a3),        \
                         "+" REG(a4), "+" REG(a5), "+" REG(a6), "+" REG(a7));            \
        __asm__ volatile("" : "+" REG(a8), "+" REG(a9), "+" REG(a10), "+" REG(a11));     \
    }                                                                                    \
    const VEC sum = (a0 + a1 + a2 + a3) + (a4 + a5 + a6 + a7) + (a8 + a9 + a10 + a11);  \
    return sum[0];

__attribute__((target("avx512f"))) float fma_chains_avx512() {
    CTX_FMA_CHAINS(__m512, _mm512_set1_ps, _mm512_fmadd_ps, "v")
}

__attribute__((target("avx2,fma"))) float fma_chains_avx2() {
    CTX_FMA_CHAINS(__m256, _mm256_set1_ps, _mm256_fmadd_ps, "x")
}
#undef CTX_FMA_CHAINS
#endif

}  // namespace

FmaPeak measure_fma_peak(int threads) {
    FmaPeak p;
#if defined(__x86_64__)
    const CpuFeatures f = cpu_features();
    if (!f.avx2_fma) return p;
    const int lanes = f.avx512 ? 16 : 8;
    p.isa = f.avx512 ? "AVX-512" : "AVX2 FMA";
    threads = std::max(1, threads);
    double best_s = 1e30;
    float sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        double slowest = 0;
#pragma omp parallel num_threads(threads) reduction(max : slowest)
        {
#pragma omp barrier
            const auto t0 = std::chrono::steady_clock::now();
            const float s = f.avx512 ? fma_chains_avx512() : fma_chains_avx2();
            slowest = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#pragma omp atomic
            sink += s;
        }
        best_s = std::min(best_s, slowest);
    }
    static volatile float keep;  // the sums, so the chains are not dead code
    keep = keep + sink;
    const double flops_per_thread = double(kIters) * kChains * lanes * 2.0;
    p.per_thread = flops_per_thread / best_s;
    p.flops = p.per_thread * threads;
    p.flops_per_cycle = 2 * lanes * 2;  // two pipes x lanes x (mul + add)
    p.ghz = p.per_thread / p.flops_per_cycle / 1e9;
#endif
    return p;
}

}  // namespace ctx::cpu
