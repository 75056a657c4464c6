// Backend consistency: every op of backend.h on the CUDA backend against the CPU backend on the
// same random inputs (forwards, every gradient, the accumulate-vs-write semantics), including
// attention (its materialised mode; the flash mode is test_ops_gpu_flash.cpp) over every bias
// kind, rotary modes, windows, odd T, fractional and unsorted positions, head dims 64/80/128 and
// 256 (beyond the flash kernels) and attention over a key/value cache. The CPU backend is itself
// tested against double-precision references (test_ops_cpu_*), so agreement here to fp32
// rounding means the CUDA ops implement the contract. AdamW: test_ops_gpu_adamw.cpp.
//
// Every test skips (GTEST_SKIP) when no CUDA device is visible, including builds without CUDA.
// Labelled "gpu" in ctest (tests/gpu_tests.cmake): ctest -L gpu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "gpu_test_support.h"
#include "op_reference.h"

namespace {

#define REQUIRE_GPU()                                                                        \
    do {                                                                                     \
        if (!have_gpu())                                                                     \
            GTEST_SKIP() << "no CUDA device visible (cuda_device_count() == 0): the CUDA "   \
                            "backend consistency tests need a GPU";                          \
    } while (0)


// ================================================================ memory and elementwise

TEST(OpsGpuMemory, AllocIsZeroedAndCopiesRoundTrip) {
    REQUIRE_GPU();
    EXPECT_EQ(gpu().kind(), ctx::DeviceKind::CUDA);
    EXPECT_TRUE(ctx::cuda_backend_available());
    float* empty = gpu().alloc_floats(0);
    EXPECT_NE(empty, nullptr);
    gpu().free_floats(empty);
    const size_t n = 100003;
    Dev a(n);
    EXPECT_EQ(a.host(), FVec(n, 0.0f));
    ref::Rng rng(1);
    const FVec x = randn(rng, n);
    gpu().copy_to_device(a.get(), x.data(), n);
    EXPECT_EQ(a.host(), x);
    Dev b(n);
    gpu().copy(b.get(), a.get(), n);
    EXPECT_EQ(b.host(), x);
    gpu().zero(b.get() + 10, 100);
    FVec want = x;
    std::fill(want.begin() + 10, want.begin() + 110, 0.0f);
    EXPECT_EQ(b.host(), want);
}

// device_memory counts every allocation of the CUDA backends on the device (buffers and
// grow-only scratch), gives it back on free, and keeps the peak; host backends report none.
TEST(OpsGpuMemory, DeviceMemoryCountsBuffersAndScratchAndKeepsThePeak) {
    REQUIRE_GPU();
    EXPECT_FALSE(cpu().device_memory().available);
    const ctx::Backend::DeviceMemory m0 = gpu().device_memory();
    ASSERT_TRUE(m0.available);
    EXPECT_GE(m0.peak, m0.current);
    const size_t n = size_t(1) << 20;  // 4 MiB, a multiple of the 64-byte rounding
    float* a = gpu().alloc_floats(n);
    const ctx::Backend::DeviceMemory m1 = gpu().device_memory();
    EXPECT_EQ(m1.current - m0.current, n * sizeof(float));
    EXPECT_GE(m1.peak, m1.current);
    gpu().free_floats(a);
    const ctx::Backend::DeviceMemory m2 = gpu().device_memory();
    EXPECT_EQ(m2.current, m0.current);
    EXPECT_EQ(m2.peak, std::max(m0.peak, m1.current));
    // scratch: staging a batch larger than any before grows the backend's token buffers
    const int N = 3 << 20;
    std::vector<int32_t> tokens(size_t(N), 1);
    ctx::BatchInputs batch;
    batch.N = N;
    batch.tokens = tokens.data();
    gpu().stage_batch(batch);
    const ctx::Backend::DeviceMemory m3 = gpu().device_memory();
    EXPECT_GE(m3.current, m2.current + size_t(N) * sizeof(int32_t));
    EXPECT_GE(m3.peak, m3.current);
}

TEST(OpsGpuElementwise, AddAccumulateScaleSumSquares) {
    REQUIRE_GPU();
    for (size_t n : {size_t(1), size_t(1000), (size_t(1) << 20) + 7}) {
        ref::Rng rng(n);
        const FVec a = randn(rng, n), b = randn(rng, n);
        FVec ca = a, cb = b, out(n);
        Dev ga(a), gb(b), gout(n);
        cpu().add(out.data(), ca.data(), cb.data(), n);
        gpu().add(gout.get(), ga.get(), gb.get(), n);
        EXPECT_EQ(gout.host(), out);
        cpu().add(ca.data(), ca.data(), cb.data(), n);  // out aliases a
        gpu().add(ga.get(), ga.get(), gb.get(), n);
        EXPECT_EQ(ga.host(), ca);
        cpu().add(cb.data(), ca.data(), cb.data(), n);  // out aliases b
        gpu().add(gb.get(), ga.get(), gb.get(), n);
        EXPECT_EQ(gb.host(), cb);
        cpu().accumulate(ca.data(), cb.data(), n);
        gpu().accumulate(ga.get(), gb.get(), n);
        EXPECT_EQ(ga.host(), ca);
        cpu().scale(ca.data(), -0.37f, n);
        gpu().scale(ga.get(), -0.37f, n);
        EXPECT_EQ(ga.host(), ca);
        const double want = cpu().sum_squares(ca.data(), n);
        const double got = gpu().sum_squares(ga.get(), n);
        EXPECT_NEAR(got, want, 1e-12 * want) << n;
        EXPECT_EQ(gpu().sum_squares(ga.get(), n), got) << "sum_squares is not deterministic";
    }
}

// A column block of row-major matrices (the ring's [k | v] out of qkv and its gradient back):
// against plain loops, copy and accumulate.
TEST(OpsGpuElementwise, Copy2dCopiesAndAccumulatesColumnBlocks) {
    REQUIRE_GPU();
    const size_t rows = 37, src_stride = 24, dst_stride = 17, cols = 16;
    ref::Rng rng(5);
    const FVec src = randn(rng, rows * src_stride), dst0 = randn(rng, rows * dst_stride);
    Dev gsrc(src), gdst(dst0);
    for (bool acc : {false, true}) {
        FVec want = acc ? gdst.host() : dst0;
        for (size_t r = 0; r < rows; ++r)
            for (size_t c = 0; c < cols; ++c) {
                const float x = src[r * src_stride + 5 + c];
                want[r * dst_stride + c] = acc ? want[r * dst_stride + c] + x : x;
            }
        gpu().copy_2d(gdst.get(), dst_stride, gsrc.get() + 5, src_stride, rows, cols, acc);
        EXPECT_EQ(gdst.host(), want) << (acc ? "accumulate" : "copy");
        FVec host = acc ? FVec() : dst0;  // the CPU backend's (the host default) agrees
        if (!acc) {
            cpu().copy_2d(host.data(), dst_stride, src.data() + 5, src_stride, rows, cols, false);
            EXPECT_EQ(host, want);
        }
    }
}

// ================================================================ embedding

struct EmbCase {
    std::string name;
    int N, C, V, P;
    bool wpe, device_tokens;
};
void PrintTo(const EmbCase& c, std::ostream* os) { *os << c.name; }
class OpsGpuEmbedding : public ::testing::TestWithParam<EmbCase> {};

TEST_P(OpsGpuEmbedding, ForwardBackwardMatchCpu) {
    REQUIRE_GPU();
    const EmbCase& ec = GetParam();
    const int N = ec.N, C = ec.C, V = ec.V, P = ec.P;
    ref::Rng rng(N * 31 + C);
    std::vector<int32_t> tokens(N);
    for (auto& t : tokens) t = rng.integer(0, V - 1);  // small V: many repeats
    FVec pos(N);
    for (int n = 0; n < N; n++) {
        pos[n] = float(rng.uniform(0.0, P - 1));
        if (n % 7 == 0) pos[n] = float(P - 1);  // the last row (j1 clamps to it)
        if (n % 11 == 0) pos[n] = 0.0f;
        if (n % 5 == 0) pos[n] = std::floor(pos[n]);  // integral: f = 0
    }
    const FVec wte = randn(rng, size_t(V) * C), wpe = randn(rng, size_t(P) * C);
    Dev gwte(wte), gwpe(wpe), gpos(pos), gout(size_t(N) * C);
    DevInts dtok(tokens);
    const int32_t* gtok = ec.device_tokens ? dtok.get() : tokens.data();
    FVec out(size_t(N) * C);
    cpu().embedding_forward(out.data(), tokens.data(), pos.data(), wte.data(),
                            ec.wpe ? wpe.data() : nullptr, N, C, V, P);
    gpu().embedding_forward(gout.get(), gtok, gpos.get(), gwte.get(), ec.wpe ? gwpe.get() : nullptr,
                            N, C, V, P);
    EXPECT_CLOSE(gout.host(), out, kFwdTol);

    // backward accumulates into pre-filled gradients
    const FVec dout = randn(rng, size_t(N) * C);
    FVec dwte = randn(rng, wte.size()), dwpe = randn(rng, wpe.size());
    Dev gdout(dout), gdwte(dwte), gdwpe(dwpe);
    cpu().embedding_backward(dwte.data(), ec.wpe ? dwpe.data() : nullptr, dout.data(),
                             tokens.data(), pos.data(), N, C, V, P);
    gpu().embedding_backward(gdwte.get(), ec.wpe ? gdwpe.get() : nullptr, gdout.get(), gtok,
                             gpos.get(), N, C, V, P);
    const FVec got_dwte = gdwte.host(), got_dwpe = gdwpe.host();
    EXPECT_CLOSE(got_dwte, dwte, kGradTol);
    EXPECT_CLOSE(got_dwpe, dwpe, kGradTol);

    // deterministic: a second identical accumulation adds bit-identical amounts
    Dev h_wte(got_dwte), h_wpe(got_dwpe);
    gpu().embedding_backward(gdwte.get(), ec.wpe ? gdwpe.get() : nullptr, gdout.get(), gtok,
                             gpos.get(), N, C, V, P);
    gpu().embedding_backward(h_wte.get(), ec.wpe ? h_wpe.get() : nullptr, gdout.get(), gtok,
                             gpos.get(), N, C, V, P);
    EXPECT_EQ(gdwte.host(), h_wte.host());
    EXPECT_EQ(gdwpe.host(), h_wpe.host());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, OpsGpuEmbedding,
    ::testing::Values(EmbCase{"one_row", 1, 8, 3, 2, true, false},
                      EmbCase{"no_wpe", 37, 48, 5, 4, false, false},
                      EmbCase{"fractional", 129, 80, 7, 33, true, false},
                      EmbCase{"device_tokens", 64, 128, 50, 16, true, true},
                      EmbCase{"wide", 300, 768, 1000, 300, true, false}),
    [](const auto& info) { return info.param.name; });

TEST(OpsGpuEmbeddingChecks, BadTokensAndPositionsAreRefused) {
    REQUIRE_GPU();
    const int N = 3, C = 4, V = 5, P = 6;
    Dev wte(size_t(V) * C), wpe(size_t(P) * C), out(size_t(N) * C);
    std::vector<int32_t> tokens = {0, 5, 1};  // 5 is outside [0, 5)
    const FVec pos_h = {0, 1, 2};
    Dev pos(pos_h);
    EXPECT_THROW(gpu().embedding_forward(out.get(), tokens.data(), pos.get(), wte.get(), wpe.get(),
                                         N, C, V, P),
                 ctx::Error);
    tokens[1] = 4;
    const FVec far_h = {0, 5.5f, 2};  // beyond P - 1
    Dev far(far_h);
    EXPECT_THROW(gpu().embedding_forward(out.get(), tokens.data(), far.get(), wte.get(), wpe.get(),
                                         N, C, V, P),
                 ctx::Error);
    EXPECT_THROW(gpu().embedding_backward(wte.get(), wpe.get(), out.get(), tokens.data(), far.get(),
                                          N, C, V, P),
                 ctx::Error);
    // the backend still works after a refused call
    gpu().embedding_forward(out.get(), tokens.data(), pos.get(), wte.get(), wpe.get(), N, C, V, P);
    EXPECT_EQ(out.host(), FVec(size_t(N) * C, 0.0f));
}

// ================================================================ layer norm

struct LnCase {
    int N, C;
    bool bias;
};
class OpsGpuLayerNorm : public ::testing::TestWithParam<LnCase> {};

TEST_P(OpsGpuLayerNorm, ForwardBackwardMatchCpu) {
    REQUIRE_GPU();
    const auto [N, C, use_b] = GetParam();
    ref::Rng rng(N * 7 + C);
    FVec x = randn(rng, size_t(N) * C, 2.0);
    for (int n = 0; n < N; n++)  // offsets: the variance is computed about the mean
        for (int c = 0; c < C; c++) x[size_t(n) * C + c] += float(n % 5) * 3.0f;
    const FVec w = randn(rng, C), b = randn(rng, C);
    FVec out(size_t(N) * C), mean(N), rstd(N);
    Dev gx(x), gw(w), gb(b), gout(out.size()), gmean(N), grstd(N);
    cpu().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                            use_b ? b.data() : nullptr, N, C, 1e-5f);
    gpu().layernorm_forward(gout.get(), gmean.get(), grstd.get(), gx.get(), gw.get(),
                            use_b ? gb.get() : nullptr, N, C, 1e-5f);
    EXPECT_CLOSE(gout.host(), out, kFwdTol);
    EXPECT_CLOSE(gmean.host(), mean, kFwdTol);
    EXPECT_CLOSE(grstd.host(), rstd, kFwdTol);

    const FVec dout = randn(rng, out.size());
    FVec dx = randn(rng, x.size()), dw = randn(rng, C), db = randn(rng, C);
    Dev gdout(dout), gdx(dx), gdw(dw), gdb(db);
    cpu().layernorm_backward(dx.data(), dw.data(), use_b ? db.data() : nullptr, dout.data(),
                             x.data(), w.data(), mean.data(), rstd.data(), N, C);
    gpu().layernorm_backward(gdx.get(), gdw.get(), use_b ? gdb.get() : nullptr, gdout.get(),
                             gx.get(), gw.get(), gmean.get(), grstd.get(), N, C);
    EXPECT_CLOSE(gdx.host(), dx, kGradTol);
    EXPECT_CLOSE(gdw.host(), dw, kGradTol);
    EXPECT_CLOSE(gdb.host(), db, kGradTol);
}

INSTANTIATE_TEST_SUITE_P(Cases, OpsGpuLayerNorm,
                         ::testing::Values(LnCase{1, 8, true}, LnCase{7, 768, true},
                                           LnCase{33, 80, false}, LnCase{130, 1000, true},
                                           LnCase{4099, 64, true}, LnCase{9000, 300, true},
                                           LnCase{70, 1056, true}, LnCase{41, 1024, false}));

// RMS norm (the layer-norm kernels without centering or bias): rows with large offsets, so a
// kernel that centred would be far off.
TEST_P(OpsGpuLayerNorm, RmsNormForwardBackwardMatchCpu) {
    REQUIRE_GPU();
    const auto [N, C, unused] = GetParam();
    ref::Rng rng(N * 11 + C);
    FVec x = randn(rng, size_t(N) * C, 2.0);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) x[size_t(n) * C + c] += float(n % 5) * 3.0f;
    const FVec w = randn(rng, C);
    FVec out(size_t(N) * C), rstd(N);
    Dev gx(x), gw(w), gout(out.size()), grstd(N);
    cpu().rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
    gpu().rmsnorm_forward(gout.get(), grstd.get(), gx.get(), gw.get(), N, C, 1e-6f);
    EXPECT_CLOSE(gout.host(), out, kFwdTol);
    EXPECT_CLOSE(grstd.host(), rstd, kFwdTol);
    const FVec dout = randn(rng, out.size());
    FVec dx = randn(rng, x.size()), dw = randn(rng, C);
    Dev gdout(dout), gdx(dx), gdw(dw);
    cpu().rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N,
                           C);
    gpu().rmsnorm_backward(gdx.get(), gdw.get(), gdout.get(), gx.get(), gw.get(), grstd.get(), N,
                           C);
    EXPECT_CLOSE(gdx.host(), dx, kGradTol);
    EXPECT_CLOSE(gdw.host(), dw, kGradTol);
}

// ================================================================ dense layer

struct MmCase {
    int N, IC, OC;
    bool bias, dinp;
};
class OpsGpuMatmul : public ::testing::TestWithParam<MmCase> {};

TEST_P(OpsGpuMatmul, ForwardBackwardMatchCpu) {
    REQUIRE_GPU();
    const auto [N, IC, OC, use_bias, use_dinp] = GetParam();
    ref::Rng rng(N + IC * 3 + OC * 5);
    const FVec x = randn(rng, size_t(N) * IC), W = randn(rng, size_t(OC) * IC, 0.2),
               bias = randn(rng, OC);
    FVec out = randn(rng, size_t(N) * OC);  // garbage: the forward writes
    Dev gx(x), gW(W), gbias(bias), gout(out);
    cpu().matmul_forward(out.data(), x.data(), W.data(), use_bias ? bias.data() : nullptr, N, IC,
                         OC);
    gpu().matmul_forward(gout.get(), gx.get(), gW.get(), use_bias ? gbias.get() : nullptr, N, IC,
                         OC);
    EXPECT_CLOSE(gout.host(), out, kFwdTol);

    const FVec dout = randn(rng, out.size());
    FVec dx = randn(rng, x.size()), dW = randn(rng, W.size()), db = randn(rng, OC);
    Dev gdout(dout), gdx(dx), gdW(dW), gdb(db);
    cpu().matmul_backward(use_dinp ? dx.data() : nullptr, dW.data(),
                          use_bias ? db.data() : nullptr, dout.data(), x.data(), W.data(), N, IC,
                          OC);
    gpu().matmul_backward(use_dinp ? gdx.get() : nullptr, gdW.get(), use_bias ? gdb.get() : nullptr,
                          gdout.get(), gx.get(), gW.get(), N, IC, OC);
    EXPECT_CLOSE(gdx.host(), dx, kGradTol);
    EXPECT_CLOSE(gdW.host(), dW, kGradTol);
    EXPECT_CLOSE(gdb.host(), db, kGradTol);
}

INSTANTIATE_TEST_SUITE_P(Cases, OpsGpuMatmul,
                         ::testing::Values(MmCase{1, 1, 1, true, true},
                                           MmCase{7, 33, 65, true, true},
                                           MmCase{37, 80, 240, false, true},
                                           MmCase{64, 768, 2304, true, false},
                                           MmCase{130, 128, 5003, false, true},
                                           MmCase{2049, 96, 48, true, true}));

// ================================================================ activation

class OpsGpuActivation : public ::testing::TestWithParam<ctx::Activation> {};

TEST_P(OpsGpuActivation, ForwardBackwardMatchCpu) {
    REQUIRE_GPU();
    const ctx::Activation act = GetParam();
    const size_t n = 100001;
    ref::Rng rng(5);
    const FVec x = randu(rng, n, -8.0, 8.0), dout = randn(rng, n);
    FVec out(n), dx = randn(rng, n);
    Dev gx(x), gout(n), gdout(dout), gdx(dx);
    cpu().activation_forward(out.data(), x.data(), n, act);
    gpu().activation_forward(gout.get(), gx.get(), n, act);
    EXPECT_CLOSE(gout.host(), out, kFwdTol);
    cpu().activation_backward(dx.data(), x.data(), dout.data(), n, act);
    gpu().activation_backward(gdx.get(), gx.get(), gdout.get(), n, act);
    EXPECT_CLOSE(gdx.host(), dx, kFwdTol);
}

INSTANTIATE_TEST_SUITE_P(Kinds, OpsGpuActivation,
                         ::testing::Values(ctx::Activation::GeluTanh, ctx::Activation::GeluErf,
                                           ctx::Activation::Relu),
                         [](const auto& info) {
                             return info.param == ctx::Activation::GeluTanh ? "tanh"
                                    : info.param == ctx::Activation::Relu   ? "relu"
                                                                            : "erf";
                         });

TEST(OpsGpuSwiGlu, ForwardBackwardMatchCpu) {
    REQUIRE_GPU();
    for (auto [N, F] : {std::pair{1, 3}, std::pair{37, 1000}, std::pair{513, 64}}) {
        ref::Rng rng(N + F);
        const FVec x = randu(rng, size_t(N) * 2 * F, -8.0, 8.0), dout = randn(rng, size_t(N) * F);
        FVec out(size_t(N) * F), dx = randn(rng, x.size());
        Dev gx(x), gout(out.size()), gdout(dout), gdx(dx);
        cpu().swiglu_forward(out.data(), x.data(), N, F);
        gpu().swiglu_forward(gout.get(), gx.get(), N, F);
        EXPECT_CLOSE(gout.host(), out, kFwdTol);
        cpu().swiglu_backward(dx.data(), x.data(), dout.data(), N, F);
        gpu().swiglu_backward(gdx.get(), gx.get(), gdout.get(), N, F);
        EXPECT_CLOSE(gdx.host(), dx, kFwdTol);
    }
}

TEST(OpsGpuKvRepeat, ForwardBackwardMatchCpu) {
    REQUIRE_GPU();
    for (auto [N, H, Hkv, D] : {std::tuple{3, 4, 1, 8}, std::tuple{129, 12, 4, 64},
                                std::tuple{17, 8, 8, 16}}) {
        ref::Rng rng(N + H + Hkv);
        const size_t Q = size_t(H + 2 * Hkv) * D, F = size_t(3) * H * D;
        const FVec x = randn(rng, N * Q), dout = randn(rng, N * F);
        FVec out(N * F), dx = randn(rng, x.size());
        Dev gx(x), gout(out.size()), gdout(dout), gdx(dx);
        cpu().kv_repeat_forward(out.data(), x.data(), N, H, Hkv, D);
        gpu().kv_repeat_forward(gout.get(), gx.get(), N, H, Hkv, D);
        EXPECT_EQ(gout.host(), out);  // copies: exact
        cpu().kv_repeat_backward(dx.data(), dout.data(), N, H, Hkv, D);
        gpu().kv_repeat_backward(gdx.get(), gdout.get(), N, H, Hkv, D);
        EXPECT_CLOSE(gdx.host(), dx, kFwdTol);
    }
}

// ================================================================ cross-entropy

struct CeCase {
    std::string name;
    int N, V;
    bool mask, device_targets;
};
void PrintTo(const CeCase& c, std::ostream* os) { *os << c.name; }
class OpsGpuCrossEntropy : public ::testing::TestWithParam<CeCase> {};

TEST_P(OpsGpuCrossEntropy, ForwardAndFusedBackwardMatchCpu) {
    REQUIRE_GPU();
    const CeCase& cc = GetParam();
    const int N = cc.N, V = cc.V;
    ref::Rng rng(N + V);
    FVec logits = randn(rng, size_t(N) * V, 3.0);
    std::vector<int32_t> targets(N);
    FVec mask(N, 1.0f);
    for (int n = 0; n < N; n++) {
        targets[n] = rng.integer(0, V - 1);
        if (cc.mask && n % 3 == 1) {
            mask[n] = 0.0f;
            targets[n] = -7;  // ignored where the mask is 0
        }
        if (cc.mask && n % 3 == 2) mask[n] = 0.5f;
    }
    Dev glogits(logits), gmask(mask), glosses(N);
    DevInts dtargets(targets);
    const int32_t* gt = cc.device_targets ? dtargets.get() : targets.data();
    FVec losses(N);
    cpu().crossentropy_forward(losses.data(), logits.data(), targets.data(),
                               cc.mask ? mask.data() : nullptr, N, V);
    gpu().crossentropy_forward(glosses.get(), glogits.get(), gt, cc.mask ? gmask.get() : nullptr,
                               N, V);
    EXPECT_CLOSE(glosses.host(), losses, kFwdTol);

    const float scale = 1.0f / float(N);
    FVec lossesb = randn(rng, N);
    Dev glossesb(lossesb);
    cpu().crossentropy_forward_backward(logits.data(), lossesb.data(), targets.data(),
                                        cc.mask ? mask.data() : nullptr, N, V, scale);
    gpu().crossentropy_forward_backward(glogits.get(), glossesb.get(), gt,
                                        cc.mask ? gmask.get() : nullptr, N, V, scale);
    EXPECT_CLOSE(glossesb.host(), lossesb, kFwdTol);
    EXPECT_CLOSE(glogits.host(), logits, kFwdTol);
}

INSTANTIATE_TEST_SUITE_P(Cases, OpsGpuCrossEntropy,
                         ::testing::Values(CeCase{"one", 1, 2, false, false},
                                           CeCase{"masked", 37, 101, true, false},
                                           CeCase{"device_targets", 64, 1000, true, true},
                                           CeCase{"gpt2_vocab", 9, 50257, false, false}),
                         [](const auto& info) { return info.param.name; });

TEST(OpsGpuCrossEntropyChecks, BadTargetOfATrainedRowIsRefused) {
    REQUIRE_GPU();
    const int N = 2, V = 4;
    Dev logits(size_t(N) * V), losses(N);
    const std::vector<int32_t> targets = {1, 4};
    const FVec mask_h = {1.0f, 1.0f};
    Dev mask(mask_h);
    EXPECT_THROW(gpu().crossentropy_forward(losses.get(), logits.get(), targets.data(), mask.get(),
                                            N, V),
                 ctx::Error);
    EXPECT_THROW(gpu().crossentropy_forward_backward(logits.get(), losses.get(), targets.data(),
                                                     nullptr, N, V, 1.0f),
                 ctx::Error);
}

// ================================================================ rotary

struct RotaryCase {
    std::string name;
    int B, T, C, H, dr;
    ctx::RotaryLayout layout;
    float position_scale, attention_factor;
    bool xpos;
    PosStyle pos;
    float offset = 0.0f;  // added to every position
};
void PrintTo(const RotaryCase& c, std::ostream* os) { *os << c.name; }
class OpsGpuRotary : public ::testing::TestWithParam<RotaryCase> {};

TEST_P(OpsGpuRotary, ForwardAndTransposeMatchCpu) {
    REQUIRE_GPU();
    const RotaryCase& rc = GetParam();
    const int B = rc.B, T = rc.T, C = rc.C, H = rc.H;
    ref::Rng rng(100 + rc.dr + T);
    FVec positions = make_positions(rng, B, T, rc.pos);
    for (auto& p : positions) p += rc.offset;
    const TestRotation rot(rc.dr, rc.layout, rc.position_scale, rc.attention_factor, rc.xpos);
    const ctx::RotarySpec& spec = rot.spec;

    FVec qkv = randn(rng, size_t(B) * T * 3 * C);
    Dev gqkv(qkv), gpos(positions);
    cpu().rotary_forward(qkv.data(), positions.data(), B, T, C, H, spec);
    gpu().rotary_forward(gqkv.get(), gpos.get(), B, T, C, H, spec);
    EXPECT_CLOSE(gqkv.host(), qkv, kFwdTol);

    FVec g = randn(rng, qkv.size());
    Dev gg(g);
    cpu().rotary_backward(g.data(), positions.data(), B, T, C, H, spec);
    gpu().rotary_backward(gg.get(), gpos.get(), B, T, C, H, spec);
    EXPECT_CLOSE(gg.host(), g, kFwdTol);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, OpsGpuRotary,
    ::testing::Values(
        RotaryCase{"half_full", 2, 5, 16, 2, 8, ctx::RotaryLayout::Half, 1.0f, 1.0f, false, kContiguous},
        RotaryCase{"interleaved_full", 2, 5, 16, 2, 8, ctx::RotaryLayout::Interleaved, 1.0f, 1.0f, false, kGaps},
        RotaryCase{"half_partial", 1, 7, 36, 3, 4, ctx::RotaryLayout::Half, 0.25f, 1.0f, false, kGaps},
        RotaryCase{"interleaved_partial", 3, 1, 30, 3, 6, ctx::RotaryLayout::Interleaved, 1.0f, 1.0f, false, kWide},
        RotaryCase{"half_yarn_factor", 2, 6, 24, 2, 12, ctx::RotaryLayout::Half, 0.5f, 1.1386f, false, kWide},
        RotaryCase{"half_xpos", 2, 6, 20, 2, 6, ctx::RotaryLayout::Half, 1.0f, 1.0f, true, kWide},
        RotaryCase{"interleaved_xpos_factor", 1, 9, 24, 3, 8, ctx::RotaryLayout::Interleaved, 1.0f, 1.2f, true, kUnsorted},
        RotaryCase{"large_positions", 1, 4, 16, 1, 16, ctx::RotaryLayout::Half, 1.0f, 1.0f, false, kContiguous, 98765.5f},
        RotaryCase{"disabled", 1, 3, 8, 2, 0, ctx::RotaryLayout::Half, 1.0f, 1.0f, false, kContiguous},
        RotaryCase{"d64_neox_quarter", 2, 33, 256, 4, 16, ctx::RotaryLayout::Half, 1.0f, 1.0f, false, kGaps},
        RotaryCase{"d80_interleaved", 2, 17, 160, 2, 80, ctx::RotaryLayout::Interleaved, 0.25f, 1.0f, false, kWide},
        RotaryCase{"d128_xpos", 1, 65, 512, 4, 128, ctx::RotaryLayout::Half, 1.0f, 1.0f, true, kContiguous, 3000.0f}),
    [](const auto& info) { return info.param.name; });

TEST(OpsGpuRotaryChecks, RejectsBadRotaryDims) {
    REQUIRE_GPU();
    Dev qkv(3 * 8), pos(1);
    FVec inv(8, 1.0f);
    ctx::RotarySpec spec;
    spec.inv_freq = inv.data();
    spec.rotary_dims = 3;  // odd
    EXPECT_THROW(gpu().rotary_forward(qkv.get(), pos.get(), 1, 1, 8, 2, spec), ctx::Error);
    spec.rotary_dims = 6;  // > head_dim 4
    EXPECT_THROW(gpu().rotary_backward(qkv.get(), pos.get(), 1, 1, 8, 2, spec), ctx::Error);
}

// ================================================================ attention

struct AttnCase {
    std::string name;
    int B, T, C, H;
    ctx::BiasKind kind;
    int window;
    PosStyle pos;
    int num_buckets = 32, max_distance = 128;
    bool learn = true;    // da/db (or dtable) non-null
    bool host_a = false;  // a in host memory (fixed ALiBi slopes come from the plugin)
};
void PrintTo(const AttnCase& c, std::ostream* os) { *os << c.name; }


class OpsGpuAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(OpsGpuAttention, ForwardBackwardMatchCpu) {
    REQUIRE_GPU();
    const AttnCase& ac = GetParam();
    const int B = ac.B, T = ac.T, C = ac.C, H = ac.H;
    ref::Rng rng(1000 + T * 13 + C + int(ac.kind));
    const FVec positions = make_positions(rng, B, T, ac.pos);
    const FVec qkv = randn(rng, size_t(B) * T * 3 * C);
    BiasData bd = make_bias_data(rng, ac.kind, ac.B, ac.H, ac.T, ac.num_buckets);
    Dev gpos(positions), gqkv(qkv), ga(bd.a), gb(bd.b), gda(bd.da), gdb(bd.db), gtable(bd.table),
        gdtable(bd.dtable);

    auto options = [&](bool on_gpu) {
        ctx::AttentionOptions o;
        o.window = ac.window;
        o.bias.kind = ac.kind;
        o.bias.num_buckets = ac.num_buckets;
        o.bias.max_distance = ac.max_distance;
        if (ac.kind == ctx::BiasKind::Table) {
            o.bias.table = on_gpu ? gtable.get() : bd.table.data();
            if (ac.learn) o.bias.dtable = on_gpu ? gdtable.get() : bd.dtable.data();
        } else if (ac.kind != ctx::BiasKind::None) {
            o.bias.a = on_gpu && !ac.host_a ? ga.get() : bd.a.data();
            o.bias.b = bd.b.empty() ? nullptr : (on_gpu ? gb.get() : bd.b.data());
            if (ac.learn) {
                o.bias.da = on_gpu ? gda.get() : bd.da.data();
                if (!bd.b.empty()) o.bias.db = on_gpu ? gdb.get() : bd.db.data();
            }
        }
        return o;
    };
    const ctx::AttentionOptions copt = options(false), gopt = options(true);

    FVec out(size_t(B) * T * C), att(size_t(B) * H * T * T);
    Dev gout(out.size()), gatt(att.size());
    cpu().attention_forward(out.data(), att.data(), qkv.data(), positions.data(), B, T, C, H, copt);
    gpu().attention_forward(gout.get(), gatt.get(), gqkv.get(), gpos.get(), B, T, C, H, gopt);
    EXPECT_CLOSE(gout.host(), out, kFwdTol);
    EXPECT_CLOSE(gatt.host(), att, kFwdTol);

    const FVec dout = randn(rng, out.size());
    FVec dqkv = randn(rng, qkv.size());  // pre-filled: backward accumulates
    Dev gdout(dout), gdqkv(dqkv);
    FVec cscratch(cpu().attention_scratch_floats(B, T, C, H, ctx::AttentionMode::Materialised));
    Dev gscratch(gpu().attention_scratch_floats(B, T, C, H, ctx::AttentionMode::Materialised));
    cpu().attention_backward(dqkv.data(), cscratch.data(), dout.data(), qkv.data(), att.data(), nullptr,
                             positions.data(), B, T, C, H, copt);
    gpu().attention_backward(gdqkv.get(), gscratch.get(), gdout.get(), gqkv.get(), gatt.get(), nullptr,
                             gpos.get(), B, T, C, H, gopt);
    EXPECT_CLOSE(gdqkv.host(), dqkv, kGradTol);
    // empty vectors (no such parameter) compare equal trivially
    EXPECT_CLOSE(gda.host(), bd.da, kGradTol);
    EXPECT_CLOSE(gdb.host(), bd.db, kGradTol);
    EXPECT_CLOSE(gdtable.host(), bd.dtable, kGradTol);
}

// Bit-identical gradients on a repeated call: no atomics in any gradient path.
TEST_P(OpsGpuAttention, BackwardIsDeterministic) {
    REQUIRE_GPU();
    const AttnCase& ac = GetParam();
    const int B = ac.B, T = ac.T, C = ac.C, H = ac.H;
    ref::Rng rng(77 + T);
    const FVec positions = make_positions(rng, B, T, ac.pos);
    const FVec qkv = randn(rng, size_t(B) * T * 3 * C), dout = randn(rng, size_t(B) * T * C);
    BiasData bd = make_bias_data(rng, ac.kind, ac.B, ac.H, ac.T, ac.num_buckets);
    Dev gpos(positions), gqkv(qkv), ga(bd.a), gb(bd.b), gtable(bd.table), gdout(dout);
    Dev gout(size_t(B) * T * C), gatt(size_t(B) * H * T * T);
    Dev gscratch(gpu().attention_scratch_floats(B, T, C, H, ctx::AttentionMode::Materialised));
    std::vector<FVec> results[2];
    for (int run = 0; run < 2; run++) {
        Dev gdqkv(qkv.size()), gda(bd.a.size()), gdb(bd.b.size()), gdtable(bd.table.size());
        ctx::AttentionOptions o;
        o.window = ac.window;
        o.bias.kind = ac.kind;
        o.bias.num_buckets = ac.num_buckets;
        o.bias.max_distance = ac.max_distance;
        if (ac.kind == ctx::BiasKind::Table) {
            o.bias.table = gtable.get();
            o.bias.dtable = gdtable.get();
        } else if (ac.kind != ctx::BiasKind::None) {
            o.bias.a = ga.get();
            o.bias.b = bd.b.empty() ? nullptr : gb.get();
            o.bias.da = gda.get();
            o.bias.db = bd.b.empty() ? nullptr : gdb.get();
        }
        gpu().attention_forward(gout.get(), gatt.get(), gqkv.get(), gpos.get(), B, T, C, H, o);
        gpu().attention_backward(gdqkv.get(), gscratch.get(), gdout.get(), gqkv.get(), gatt.get(), nullptr,
                                 gpos.get(), B, T, C, H, o);
        results[run] = {gout.host(), gatt.host(), gdqkv.host(), gda.host(), gdb.host(),
                        gdtable.host()};
    }
    for (size_t k = 0; k < results[0].size(); k++) EXPECT_EQ(results[0][k], results[1][k]) << k;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, OpsGpuAttention,
    ::testing::Values(
        AttnCase{"none_T1", 2, 1, 16, 2, ctx::BiasKind::None, 0, kContiguous},
        AttnCase{"none_d64_odd", 2, 37, 128, 2, ctx::BiasKind::None, 0, kContiguous},
        AttnCase{"none_d80_window", 1, 45, 160, 2, ctx::BiasKind::None, 7, kGaps},
        AttnCase{"none_d128_long", 1, 301, 256, 2, ctx::BiasKind::None, 0, kWide},
        AttnCase{"none_d256", 1, 20, 256, 1, ctx::BiasKind::None, 0, kGaps},
        AttnCase{"linear_d64", 2, 33, 256, 4, ctx::BiasKind::Linear, 0, kGaps},
        AttnCase{"linear_host_slopes_fixed", 2, 29, 128, 2, ctx::BiasKind::Linear, 0, kGaps, 32,
                 128, false, true},
        AttnCase{"linear_window_unsorted", 2, 40, 32, 4, ctx::BiasKind::Linear, 5, kUnsorted},
        AttnCase{"kerple_log_d80", 2, 77, 160, 2, ctx::BiasKind::KerpleLog, 0, kWide},
        AttnCase{"kerple_log_window", 1, 70, 32, 2, ctx::BiasKind::KerpleLog, 6, kGaps},
        AttnCase{"kerple_power_d128", 1, 65, 256, 2, ctx::BiasKind::KerplePower, 0, kGaps},
        AttnCase{"kerple_power_unsorted", 2, 31, 24, 3, ctx::BiasKind::KerplePower, 0, kUnsorted},
        AttnCase{"kerple_power_window", 2, 50, 64, 1, ctx::BiasKind::KerplePower, 9, kWide},
        AttnCase{"t5_default", 2, 100, 128, 2, ctx::BiasKind::T5, 0, kWide},
        AttnCase{"t5_small_buckets", 2, 19, 16, 2, ctx::BiasKind::T5, 0, kGaps, 8, 20},
        AttnCase{"t5_window_unsorted", 1, 70, 32, 4, ctx::BiasKind::T5, 11, kUnsorted, 16, 64},
        AttnCase{"t5_direct_buckets", 1, 90, 64, 1, ctx::BiasKind::T5, 0, kWide, 64, 5000},
        AttnCase{"t5_512_buckets", 1, 40, 32, 2, ctx::BiasKind::T5, 0, kWide, 512, 1000},
        AttnCase{"t5_fixed", 1, 20, 16, 2, ctx::BiasKind::T5, 0, kGaps, 32, 128, false},
        AttnCase{"table_d64", 2, 45, 128, 2, ctx::BiasKind::Table, 0, kGaps},
        AttnCase{"table_window", 2, 75, 32, 4, ctx::BiasKind::Table, 8, kContiguous},
        AttnCase{"table_T1", 3, 1, 18, 3, ctx::BiasKind::Table, 0, kContiguous},
        AttnCase{"table_fixed", 1, 9, 12, 3, ctx::BiasKind::Table, 0, kContiguous, 32, 128,
                 false}),
    [](const auto& info) { return info.param.name; });

TEST(OpsGpuAttentionChecks, BadOptionsAreRefused) {
    REQUIRE_GPU();
    const int B = 1, T = 3, C = 8, H = 2;
    Dev qkv(size_t(B) * T * 3 * C), out(size_t(B) * T * C), att(size_t(B) * H * T * T), pos(T);
    ctx::AttentionOptions opt;
    opt.bias.kind = ctx::BiasKind::Table;  // no table
    EXPECT_THROW(gpu().attention_forward(out.get(), att.get(), qkv.get(), pos.get(), B, T, C, H, opt),
                 ctx::Error);
    opt.bias.kind = ctx::BiasKind::T5;
    Dev a(size_t(H) * 1024);
    opt.bias.a = a.get();
    opt.bias.num_buckets = 1024;  // more than the backends allow
    EXPECT_THROW(gpu().attention_forward(out.get(), att.get(), qkv.get(), pos.get(), B, T, C, H, opt),
                 ctx::Error);
    opt = {};
    opt.window = -1;
    EXPECT_THROW(gpu().attention_forward(out.get(), att.get(), qkv.get(), pos.get(), B, T, C, H, opt),
                 ctx::Error);
    EXPECT_THROW(gpu().attention_forward(out.get(), att.get(), qkv.get(), pos.get(), B, T, 9, H, {}),
                 ctx::Error);  // 9 channels over 2 heads
}

// ================================================================ attention over a KV cache

struct CachedCase {
    std::string name;
    ctx::BiasKind kind;
    int window, Tq, S, C, H;
    bool host_a = false;
};
void PrintTo(const CachedCase& c, std::ostream* os) { *os << c.name; }
class OpsGpuAttentionCached : public ::testing::TestWithParam<CachedCase> {};

TEST_P(OpsGpuAttentionCached, MatchesCpu) {
    REQUIRE_GPU();
    const CachedCase& cc = GetParam();
    const int B = 3, S = cc.S, C = cc.C, H = cc.H, Tq = cc.Tq;
    const std::vector<int32_t> lens = {S, std::max(Tq, S / 3), std::max(Tq, S - 5)};  // ragged
    ref::Rng rng(11 + S + Tq);
    const FVec qkv = randn(rng, size_t(B) * Tq * 3 * C);
    const FVec kc = randn(rng, size_t(B) * S * C), vc = randn(rng, size_t(B) * S * C);
    FVec kpos(size_t(B) * S);
    for (int b = 0; b < B; b++) {
        float p = float(rng.uniform(0, 3));
        for (int t = 0; t < S; t++, p += float(rng.uniform(0.25, 2.5))) kpos[size_t(b) * S + t] = p;
    }
    AttnCase ac{cc.name, B, Tq, C, H, cc.kind, cc.window, kContiguous, 8, 20};
    BiasData bd = make_bias_data(rng, ac.kind, ac.B, ac.H, ac.T, ac.num_buckets);
    if (cc.kind == ctx::BiasKind::Table) bd.table = randn(rng, size_t(B) * H * Tq * S);
    Dev gqkv(qkv), gkc(kc), gvc(vc), gkpos(kpos), ga(bd.a), gb(bd.b), gtable(bd.table);

    auto options = [&](bool on_gpu) {
        ctx::AttentionOptions o;
        o.window = cc.window;
        o.bias.kind = cc.kind;
        o.bias.num_buckets = 8;
        o.bias.max_distance = 20;
        if (cc.kind == ctx::BiasKind::Table) {
            o.bias.table = on_gpu ? gtable.get() : bd.table.data();
        } else if (cc.kind != ctx::BiasKind::None) {
            o.bias.a = on_gpu && !cc.host_a ? ga.get() : bd.a.data();
            o.bias.b = bd.b.empty() ? nullptr : (on_gpu ? gb.get() : bd.b.data());
        }
        return o;
    };
    FVec out(size_t(B) * Tq * C);
    FVec cscratch(cpu().attention_cached_scratch_floats(S));
    Dev gout(out.size()), gscratch(gpu().attention_cached_scratch_floats(S));
    cpu().attention_cached_forward(out.data(), cscratch.data(), qkv.data(), kc.data(), vc.data(),
                                   kpos.data(), lens.data(), B, Tq, S, C, H, options(false));
    gpu().attention_cached_forward(gout.get(), gscratch.get(), gqkv.get(), gkc.get(), gvc.get(),
                                   gkpos.get(), lens.data(), B, Tq, S, C, H, options(true));
    EXPECT_CLOSE(gout.host(), out, kFwdTol);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, OpsGpuAttentionCached,
    ::testing::Values(
        CachedCase{"none_decode", ctx::BiasKind::None, 0, 1, 23, 16, 2},
        CachedCase{"none_prefill_d64", ctx::BiasKind::None, 0, 5, 23, 128, 2},
        CachedCase{"none_long_d128", ctx::BiasKind::None, 0, 3, 300, 256, 2},
        CachedCase{"linear_d80", ctx::BiasKind::Linear, 0, 1, 150, 160, 2},
        CachedCase{"linear_host_slopes", ctx::BiasKind::Linear, 0, 2, 40, 32, 4, true},
        CachedCase{"kerple_log", ctx::BiasKind::KerpleLog, 0, 4, 23, 16, 2},
        CachedCase{"kerple_power_window", ctx::BiasKind::KerplePower, 6, 1, 23, 16, 2},
        CachedCase{"t5", ctx::BiasKind::T5, 0, 3, 40, 16, 2},
        CachedCase{"t5_window_long", ctx::BiasKind::T5, 130, 2, 290, 64, 1},
        CachedCase{"table", ctx::BiasKind::Table, 0, 4, 23, 16, 2},
        CachedCase{"table_window", ctx::BiasKind::Table, 5, 1, 23, 16, 2}),
    [](const auto& info) { return info.param.name; });

TEST(OpsGpuAttentionCachedChecks, BadLengthsAreRefused) {
    REQUIRE_GPU();
    const int B = 1, Tq = 2, S = 4, C = 8, H = 2;
    Dev qkv(size_t(B) * Tq * 3 * C), kc(size_t(B) * S * C), vc(size_t(B) * S * C), kpos(S),
        out(size_t(B) * Tq * C);
    const std::vector<int32_t> lens = {1};  // fewer entries than new tokens
    EXPECT_THROW(gpu().attention_cached_forward(out.get(), nullptr, qkv.get(), kc.get(), vc.get(),
                                                kpos.get(), lens.data(), B, Tq, S, C, H, {}),
                 ctx::Error);
}

}  // namespace
