// The sm_90 warpgroup tensor-core instruction (wgmma, backend/cuda/cuda_wgmma.cuh) through
// cuda_wgmma_gemm: C = A B^T (+ C) against double loops, with A from shared-memory descriptors
// and from register fragments, 64- and 128-column tiles, one to sixteen k steps, and the
// scale-d flag (the kernel fills its accumulators with NaN when it must not read them). On a
// GPU this checks the layouts the flash kernels are to be built on; under the emulation
// (run_emulated_tests.py) it checks the kernel against the emulator's model of them.
//
// Skips without a GPU, and on GPUs other than compute capability 9.0 (no wgmma).
// Labelled "gpu" in ctest (tests/gpu_tests.cmake).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "gpu_test_support.h"
#include "op_reference.h"

namespace {

#define REQUIRE_WGMMA()                                                                  \
    do {                                                                                 \
        if (!have_gpu())                                                                 \
            GTEST_SKIP() << "no CUDA device visible: the wgmma tests need an sm_90 GPU"; \
        if (!ctx::cuda_has_wgmma(0))                                                     \
            GTEST_SKIP() << "device 0 is not compute capability 9.0: no wgmma";          \
    } while (0)

FVec bf16_values(ref::Rng& rng, size_t n) {
    FVec v = randn(rng, n);
    for (float& x : v) x = round_bf16(x);
    return v;
}

struct Case {
    int M, N, K, n_tile;
    bool regs, accumulate, n_major = false, tma = false;
};

// A failing case's operands and result, for working out offline which layout the GPU read
// (gpu_validate.sh sets CTX_WGMMA_DUMP_DIR under its output): a first line of text
// "M N K n_tile regs accumulate n_major tma", then a (M x K), b (N x K, or K x N N-major), c0 and
// the GPU's C (M x N) as little-endian float32 (a and b hold bf16 values). A device session has
// minutes; the analysis of a wrong layout need not spend them.
void dump_failure(const Case& c, const FVec& a, const FVec& b, const FVec& c0, const FVec& got) {
    const char* dir = std::getenv("CTX_WGMMA_DUMP_DIR");
    if (dir == nullptr || *dir == '\0') return;
    const std::string path = std::string(dir) + "/wgmma_M" + std::to_string(c.M) + "_N" +
                             std::to_string(c.N) + "_K" + std::to_string(c.K) + "_t" +
                             std::to_string(c.n_tile) + (c.regs ? "_regs" : "_desc") +
                             (c.accumulate ? "_acc" : "") + (c.n_major ? "_nmajor" : "") +
                             (c.tma ? "_tma" : "") + ".bin";
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) {
        ADD_FAILURE() << "cannot write " << path;
        return;
    }
    std::fprintf(f, "%d %d %d %d %d %d %d %d\n", c.M, c.N, c.K, c.n_tile, int(c.regs),
                 int(c.accumulate), int(c.n_major), int(c.tma));
    for (const FVec* v : {&a, &b, &c0, &got}) std::fwrite(v->data(), sizeof(float), v->size(), f);
    const bool ok = std::fclose(f) == 0;
    EXPECT_TRUE(ok) << "writing " << path;
}

void check(const Case& c, uint64_t seed) {
    SCOPED_TRACE(testing::Message()
                 << "M " << c.M << " N " << c.N << " K " << c.K << " tile " << c.n_tile
                 << (c.regs ? ", A in registers" : ", A by descriptor")
                 << (c.accumulate ? ", accumulate" : "") << (c.n_major ? ", B N-major" : "")
                 << (c.tma ? ", TMA, 128-byte swizzle" : ""));
    ref::Rng rng(seed);
    const FVec a = bf16_values(rng, size_t(c.M) * c.K), b = bf16_values(rng, size_t(c.N) * c.K);
    const FVec c0 = randn(rng, size_t(c.M) * c.N);
    Dev16 da(a), db(b);
    Dev dc(c0);
    ctx::WgmmaGemmOptions o;
    o.n_tile = c.n_tile;
    o.a_from_registers = c.regs;
    o.accumulate = c.accumulate;
    o.b_n_major = c.n_major;
    o.tma = c.tma;
    ctx::cuda_wgmma_gemm(dc.get(), reinterpret_cast<const uint16_t*>(da.get()),
                         reinterpret_cast<const uint16_t*>(db.get()), c.M, c.N, c.K, o);
    const FVec got = dc.host();
    int bad = 0;
    for (int m = 0; m < c.M; m++)
        for (int n = 0; n < c.N; n++) {
            double want = c.accumulate ? double(c0[size_t(m) * c.N + n]) : 0.0,
                   mag = std::fabs(want);
            for (int k = 0; k < c.K; k++) {
                const double bk = c.n_major ? b[size_t(k) * c.N + n] : b[size_t(n) * c.K + k];
                const double p = double(a[size_t(m) * c.K + k]) * bk;
                want += p;
                mag += std::fabs(p);
            }
            // fp32 accumulation of exact bf16 products: a few ulps of the magnitude
            const double g = got[size_t(m) * c.N + n];
            if (!(std::fabs(g - want) <= 1e-5 * mag + 1e-6) && bad++ < 5)
                ADD_FAILURE() << "C[" << m << "][" << n << "] = " << g << ", expected " << want;
        }
    EXPECT_EQ(bad, 0) << "wrong entries";
    if (bad > 0) dump_failure(c, a, b, c0, got);
}

TEST(OpsGpuWgmma, ProductMatchesLoops) {
    REQUIRE_WGMMA();
    uint64_t seed = 1;
    for (bool regs : {false, true})
        for (const Case& c :
             {Case{64, 64, 16, 64, regs, false}, Case{128, 192, 48, 64, regs, false},
              Case{64, 128, 128, 128, regs, false}, Case{192, 256, 256, 128, regs, false},
              Case{128, 128, 64, 64, regs, true}, Case{64, 256, 32, 128, regs, true},
              Case{64, 32, 64, 32, regs, false}, Case{128, 96, 128, 32, regs, true}})
            check(c, seed++);
}

// B read N-major (imm-trans-b), as O = P V reads V's rows: which descriptor stride steps which
// dimension there is the least certain reading of the PTX ISA, so it has a test of its own.
TEST(OpsGpuWgmma, NMajorBMatchesLoops) {
    REQUIRE_WGMMA();
    uint64_t seed = 100;
    for (bool regs : {false, true})
        for (const Case& c :
             {Case{64, 64, 16, 64, regs, false, true}, Case{128, 128, 64, 64, regs, false, true},
              Case{64, 256, 128, 128, regs, true, true}, Case{128, 64, 128, 32, regs, false, true},
              Case{64, 96, 64, 32, regs, true, true}})
            check(c, seed++);
}

// The operands by TMA into 128-byte swizzled tiles (the copies, the mbarrier, the swizzled
// descriptors K-major and N-major, ldmatrix fragments from swizzled rows): K in 64-value blocks
// (one to four), M not a multiple of 64 (the last block's rows past M come in as TMA's zeros).
TEST(OpsGpuWgmma, TmaSwizzledOperandsMatchLoops) {
    REQUIRE_WGMMA();
    uint64_t seed = 200;
    for (bool regs : {false, true})
        for (bool n_major : {false, true})
            for (const Case& c : {Case{64, 64, 64, 64, regs, false, n_major, true},
                                  Case{128, 192, 128, 64, regs, false, n_major, true},
                                  Case{100, 128, 256, 128, regs, false, n_major, true},
                                  Case{192, 256, 192, 128, regs, true, n_major, true}})
                check(c, seed++);
}

TEST(OpsGpuWgmma, RefusesWhatItCannotRun) {
    REQUIRE_WGMMA();
    Dev16 a(64 * 32), b(128 * 32);
    Dev c(64 * 128);
    const auto* A = reinterpret_cast<const uint16_t*>(a.get());
    const auto* B = reinterpret_cast<const uint16_t*>(b.get());
    ctx::WgmmaGemmOptions o;
    EXPECT_THROW(ctx::cuda_wgmma_gemm(c.get(), A, B, 32, 128, 32, o), ctx::Error);   // M
    EXPECT_THROW(ctx::cuda_wgmma_gemm(c.get(), A, B, 64, 96, 32, o), ctx::Error);    // N
    EXPECT_THROW(ctx::cuda_wgmma_gemm(c.get(), A, B, 64, 128, 24, o), ctx::Error);   // K
    EXPECT_THROW(ctx::cuda_wgmma_gemm(c.get(), A, B, 64, 128, 512, o), ctx::Error);  // K
    o.n_tile = 96;
    EXPECT_THROW(ctx::cuda_wgmma_gemm(c.get(), A, B, 64, 192, 32, o), ctx::Error);
    o.n_tile = 32;
    o.tma = true;  // 32-column tiles without TMA only
    EXPECT_THROW(ctx::cuda_wgmma_gemm(c.get(), A, B, 64, 128, 64, o), ctx::Error);
    o.n_tile = 64;
    EXPECT_THROW(ctx::cuda_wgmma_gemm(c.get(), A, B, 64, 128, 32, o), ctx::Error);  // K % 64
    EXPECT_THROW(ctx::cuda_wgmma_gemm(c.get(), A, B, 0, 128, 64, o), ctx::Error);   // M
}

}  // namespace
