// What the CPU backend learns about the machine: its choice of OpenBLAS kernels
// (backend/cpu/cpu_blas.h: the override rule, and that a backend in this process runs kernels
// that match the CPU's features), and the measured FMA peak (backend/cpu/cpu_peak.h).
#include <gtest/gtest.h>

#include <cblas.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_blas.h"
#include "backend/cpu/cpu_peak.h"

namespace {

using ctx::cpu::blas_core_override;
using ctx::cpu::CpuFeatures;

TEST(CpuBlas, GenericFallbacksAreReplacedByTheCpusWidestKernels) {
    const CpuFeatures avx512{true, true}, avx2{true, false}, sse{false, false};
    EXPECT_EQ(blas_core_override("Prescott", avx512), "SkylakeX");
    EXPECT_EQ(blas_core_override("Prescott", avx2), "Haswell");
    EXPECT_EQ(blas_core_override("Nehalem", avx2), "Haswell");
    EXPECT_EQ(blas_core_override("Sandybridge", avx512), "SkylakeX");
    EXPECT_EQ(blas_core_override("Core2", sse), "");  // nothing better to offer
}

TEST(CpuBlas, AvxTwoKernelsOnAnAvx512CpuAreReplaced) {
    // what 0.3.21 picks on an AMD Zen 5 (family 26, AVX-512)
    const CpuFeatures avx512{true, true}, avx2{true, false};
    EXPECT_EQ(blas_core_override("Haswell", avx512), "SkylakeX");
    EXPECT_EQ(blas_core_override("Zen", avx512), "SkylakeX");
    EXPECT_EQ(blas_core_override("Haswell", avx2), "");  // already the widest the CPU runs
    EXPECT_EQ(blas_core_override("Zen", avx2), "");
}

TEST(CpuBlas, AvxFiveTwelveChoicesAndUnknownNamesStand) {
    const CpuFeatures avx512{true, true};
    for (const char* known : {"SkylakeX", "Cooperlake", "SapphireRapids", "unknown"})
        EXPECT_EQ(blas_core_override(known, avx512), "") << known;
}

TEST(CpuBlas, ABackendRunsKernelsThatMatchTheCpu) {
    std::unique_ptr<ctx::Backend> be = ctx::make_cpu_backend(1);
    const ctx::cpu::BlasKernels& k = ctx::cpu::ensure_blas_kernels();
    const std::string active = openblas_get_corename();
    EXPECT_EQ(active, k.active);
    EXPECT_NE(be->name().find(active), std::string::npos) << be->name();
    if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
        EXPECT_EQ(blas_core_override(active, ctx::cpu::cpu_features()), "")
            << "still on generic kernels: detected " << k.detected << ", " << k.note;
    }
    // The products are right after a switch: C = A B on a 33 x 17 x 29 product against loops.
    const int M = 33, N = 17, K = 29;
    std::vector<float> A(M * K), B(K * N), C(M * N);
    for (int i = 0; i < M * K; i++) A[i] = float((i * 7) % 11) - 5.0f;
    for (int i = 0; i < K * N; i++) B[i] = float((i * 5) % 13) - 6.0f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A.data(), K, B.data(),
                N, 0.0f, C.data(), N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float ref = 0;  // small integers: exact in float in any order
            for (int p = 0; p < K; p++) ref += A[i * K + p] * B[p * N + j];
            ASSERT_EQ(C[i * N + j], ref) << i << "," << j;
        }
}

TEST(CpuPeak, MeasuredFmaThroughputIsAPlausibleClockTimesTheVectorWidth) {
    const ctx::cpu::CpuFeatures f = ctx::cpu::cpu_features();
    const ctx::cpu::FmaPeak one = ctx::cpu::measure_fma_peak(1);
    if (!f.avx2_fma) {
        EXPECT_EQ(one.flops, 0.0);  // nothing to measure: callers fall back to the clock
        return;
    }
    EXPECT_EQ(one.isa, f.avx512 ? "AVX-512" : "AVX2 FMA");
    // flops = per_thread x threads, and per_thread = GHz x 2 pipes x lanes x 2 FLOPs.
    EXPECT_DOUBLE_EQ(one.flops, one.per_thread);
    const double lanes = f.avx512 ? 16 : 8;
    EXPECT_NEAR(one.per_thread, one.ghz * 1e9 * 2 * lanes * 2, 1e-6 * one.per_thread);
    // Any CPU of the last decade runs FMA chains between 0.5 and 6 GHz-equivalents; a wrong
    // FLOP count or a spilled loop (the first version ran at 1 "GHz") would fall outside.
    EXPECT_GT(one.ghz, 0.5);
    EXPECT_LT(one.ghz, 6.0);
    const ctx::cpu::FmaPeak two = ctx::cpu::measure_fma_peak(2);
    EXPECT_DOUBLE_EQ(two.flops, 2 * two.per_thread);
}

}  // namespace
