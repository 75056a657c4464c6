// The CUDA backend's Backend::lm_head_loss (cuda_lm_head_ops.cpp, cuda_lm_head.cu): logit rows
// padded to 64 columns, an online-softmax loss kernel, the gradient written in place (fp32) or
// as the bf16 operand of the backward products (Precision::Bf16).
// References: the CPU backend's op (the Backend default, itself checked against double loops in
// test_ops_lm_head.cpp) for fp32; for bf16, double loops over the bf16-ROUNDED x and W with the
// gradient rounded to bf16 as the kernel does, and the unrounded fp32 result as the band that a
// silent fp32 path would fall inside. Skipped without a GPU (run_emulated_tests.py runs it on the
// CPU emulation of CUDA and cuBLAS).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gpu_test_support.h"

namespace {

#define REQUIRE_GPU()                                                                          \
    do {                                                                                       \
        if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible: the CUDA lm-head tests need one"; \
    } while (0)

class ChunkMib {  // CTX_LM_HEAD_CHUNK_MIB for a scope (null: the default budget)
public:
    explicit ChunkMib(const char* v) {
        if (v != nullptr)
            setenv("CTX_LM_HEAD_CHUNK_MIB", v, 1);
        else
            unsetenv("CTX_LM_HEAD_CHUNK_MIB");
    }
    ~ChunkMib() { unsetenv("CTX_LM_HEAD_CHUNK_MIB"); }
};

struct Case {
    int N, C, V;
    FVec x, W, mask, dinp0, dW0;
    std::vector<int32_t> targets;
    float grad_scale = 0.37f;
};

Case make_case(int N, int C, int V, uint64_t seed) {
    ref::Rng rng(seed);
    Case k{N, C, V, randn(rng, size_t(N) * C), randn(rng, size_t(V) * C, 0.5), FVec(N),
           randn(rng, size_t(N) * C, 0.1), randn(rng, size_t(V) * C, 0.1), {}};
    k.targets.resize(N);
    for (int n = 0; n < N; ++n) {
        k.targets[n] = rng.integer(0, V - 1);
        const int r = rng.integer(0, 9);
        k.mask[n] = r == 0 ? 0.0f : (r == 1 ? 0.5f : 1.0f);
    }
    return k;
}

struct Out {
    FVec losses, dinp, dW;
};

// The op on `be` with host targets (validated and uploaded by the op) and device data.
Out run_on(ctx::Backend& be, const Case& k, bool train) {
    Dev x(k.x, be), W(k.W, be), mask(k.mask, be), dinp(k.dinp0, be), dW(k.dW0, be),
        losses(size_t(k.N), be), scratch(be.lm_head_scratch_floats(k.N, k.V), be);
    be.lm_head_loss(losses.get(), train ? dinp.get() : nullptr, train ? dW.get() : nullptr,
                    scratch.get(), x.get(), W.get(), k.targets.data(), mask.get(), k.N, k.C, k.V,
                    k.grad_scale);
    return {losses.host(), dinp.host(), dW.host()};
}

Out run_cpu(const Case& k, bool train) {
    FVec losses(k.N), dinp = k.dinp0, dW = k.dW0, scratch(cpu().lm_head_scratch_floats(k.N, k.V));
    cpu().lm_head_loss(losses.data(), train ? dinp.data() : nullptr, train ? dW.data() : nullptr,
                       scratch.data(), k.x.data(), k.W.data(), k.targets.data(), k.mask.data(),
                       k.N, k.C, k.V, k.grad_scale);
    return {losses, dinp, dW};
}

// The bf16 path in double: x, W rounded; logits exact; the gradient computed in fp32 from them
// and rounded to bf16 before both products, which add into the pre-filled gradients.
Out bf16_reference(const Case& k) {
    const int N = k.N, C = k.C, V = k.V;
    FVec xr(k.x.size()), Wr(k.W.size());
    for (size_t i = 0; i < xr.size(); ++i) xr[i] = round_bf16(k.x[i]);
    for (size_t i = 0; i < Wr.size(); ++i) Wr[i] = round_bf16(k.W[i]);
    std::vector<double> dinp(k.dinp0.begin(), k.dinp0.end()), dW(k.dW0.begin(), k.dW0.end());
    FVec losses(N);
    std::vector<double> z(V);
    FVec g(V);
    for (int n = 0; n < N; ++n) {
        double mx = -INFINITY;
        for (int v = 0; v < V; ++v) {
            double s = 0.0;
            for (int c = 0; c < C; ++c) s += double(xr[size_t(n) * C + c]) * Wr[size_t(v) * C + c];
            z[v] = s;
            mx = std::max(mx, s);
        }
        double sum = 0.0;
        for (int v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
        const double lse = mx + std::log(sum), m = k.mask[n];
        losses[n] = float(m * (lse - z[k.targets[n]]));
        for (int v = 0; v < V; ++v)
            g[v] = round_bf16(float(k.grad_scale * m *
                                    (std::exp(z[v] - lse) - (v == k.targets[n] ? 1.0 : 0.0))));
        for (int v = 0; v < V; ++v)
            for (int c = 0; c < C; ++c) {
                dinp[size_t(n) * C + c] += double(g[v]) * Wr[size_t(v) * C + c];
                dW[size_t(v) * C + c] += double(g[v]) * xr[size_t(n) * C + c];
            }
    }
    return {losses, FVec(dinp.begin(), dinp.end()), FVec(dW.begin(), dW.end())};
}

struct Shape {
    int N, C, V;
    const char* mib;  // CTX_LM_HEAD_CHUNK_MIB
    int chunk;        // the CUDA backend's rows per chunk (logit rows padded to 64 columns)
    int most;         // its most rows per chunk (the scratch's rows for any N up to this one)
};

// One chunk with an odd vocabulary; three chunks of 200 rows (1000 -> 1024 columns, 256 rows
// per MiB); a vocabulary already a multiple of 64 (no padding).
const Shape kShapes[] = {{37, 16, 101, nullptr, 37, 37}, {600, 8, 1000, "1", 200, 256},
                         {64, 8, 128, nullptr, 64, 64}};

TEST(OpsGpuLmHead, Fp32MatchesTheCpuInOneChunkAndInMany) {
    REQUIRE_GPU();
    for (const Shape& s : kShapes) {
        ChunkMib env(s.mib);
        SCOPED_TRACE(testing::Message() << "N " << s.N << " C " << s.C << " V " << s.V);
        EXPECT_EQ(gpu().lm_head_chunk_rows(s.N, s.V), s.chunk);
        EXPECT_EQ(gpu().lm_head_scratch_floats(s.N, s.V),
                  size_t(s.most) * size_t((s.V + 63) / 64 * 64));
        const Case k = make_case(s.N, s.C, s.V, 40 + s.N);
        const Out want = run_cpu(k, true), got = run_on(gpu(), k, true);
        EXPECT_CLOSE(got.losses, want.losses, kFwdTol);
        EXPECT_CLOSE(got.dinp, want.dinp, kGradTol);
        EXPECT_CLOSE(got.dW, want.dW, kGradTol);
        const Out scored = run_on(gpu(), k, false);  // losses only: gradients left alone
        EXPECT_CLOSE(scored.losses, want.losses, kFwdTol);
        EXPECT_EQ(scored.dinp, k.dinp0);
        EXPECT_EQ(scored.dW, k.dW0);
    }
}

TEST(OpsGpuLmHead, Bf16RoundsTheOperandsAndTheGradient) {
    REQUIRE_GPU();
    for (const Shape& s : kShapes) {
        ChunkMib env(s.mib);
        SCOPED_TRACE(testing::Message() << "N " << s.N << " C " << s.C << " V " << s.V);
        EXPECT_EQ(gpu_bf16().lm_head_chunk_rows(s.N, s.V), s.chunk);
        const Case k = make_case(s.N, s.C, s.V, 70 + s.N);
        const Out want = bf16_reference(k), got = run_on(gpu_bf16(), k, true);
        EXPECT_CLOSE(got.losses, want.losses, kFwdTol);
        // fp32 sums in another order, and a gradient entry within fp32 rounding of a bf16 tie
        // may round the other way: each is 2^-8 of one small term
        EXPECT_CLOSE(got.dinp, want.dinp, 1e-3);
        EXPECT_CLOSE(got.dW, want.dW, 1e-3);
        // the unrounded fp32 result is visibly elsewhere (a silent fp32 path fails here) yet
        // inside bf16's band
        const Out fp32 = run_cpu(k, true);
        FVec d_fp32(fp32.dW.size()), d_got(got.dW.size());
        for (size_t i = 0; i < d_got.size(); ++i) {
            d_fp32[i] = fp32.dW[i] - k.dW0[i];
            d_got[i] = got.dW[i] - k.dW0[i];
        }
        EXPECT_GT(rel_err(d_got, d_fp32), 1e-4);
        EXPECT_LT(rel_err(d_got, d_fp32), 3e-2);
        const Out scored = run_on(gpu_bf16(), k, false);
        EXPECT_CLOSE(scored.losses, want.losses, kFwdTol);
        EXPECT_EQ(scored.dW, k.dW0);
    }
}

TEST(OpsGpuLmHead, StagedTargetsAreNotReadBack) {
    REQUIRE_GPU();
    const Case k = make_case(37, 16, 101, 3);
    std::vector<int32_t> tokens(k.N, 0);
    FVec positions(k.N, 0.0f);
    ctx::BatchInputs host;
    host.tokens = tokens.data();
    host.targets = k.targets.data();
    host.positions = positions.data();
    host.mask = k.mask.data();
    host.N = k.N;
    const ctx::BatchInputs staged = gpu().stage_batch(host);
    Dev x(k.x), W(k.W), losses(size_t(k.N)), dinp(k.dinp0), dW(k.dW0),
        scratch(gpu().lm_head_scratch_floats(k.N, k.V));
    const uint64_t before = gpu().input_readbacks();
    gpu().lm_head_loss(losses.get(), dinp.get(), dW.get(), scratch.get(), x.get(), W.get(),
                       staged.targets, staged.mask, k.N, k.C, k.V, k.grad_scale);
    EXPECT_EQ(gpu().input_readbacks(), before);
    EXPECT_CLOSE(losses.host(), run_cpu(k, false).losses, kFwdTol);
    DevInts targets(k.targets);  // device targets that were not staged: read back, checked
    Dev mask(k.mask);
    gpu().lm_head_loss(losses.get(), nullptr, nullptr, scratch.get(), x.get(), W.get(),
                       targets.get(), mask.get(), k.N, k.C, k.V, k.grad_scale);
    EXPECT_GT(gpu().input_readbacks(), before);
}

TEST(OpsGpuLmHead, RefusesBadTargetsNamingTheRow) {
    REQUIRE_GPU();
    ChunkMib env("1");
    Case k = make_case(600, 8, 1000, 5);
    k.targets[500] = 1000;  // in the third chunk
    k.mask[500] = 1.0f;
    for (ctx::Backend* be : {&gpu(), &gpu_bf16()})
        expect_error([&] { run_on(*be, k, true); }, {"target 1000 at row 500"});
}

}  // namespace
