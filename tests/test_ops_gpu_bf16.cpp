// The CUDA backend in bf16 mixed precision (make_cuda_backend(0, Precision::Bf16), backend.h enum
// Precision): matmul_forward / matmul_backward round their operands (activations, weights and
// the output gradient) to bf16, round to nearest even, multiply on tensor cores with fp32
// accumulation and write / accumulate fp32 results; biases, their gradients and every other op
// stay fp32.
//
// References:
//   - exact values: operands chosen so that the rounding (ties to even, above/below a tie,
//     overflow, NaN) decides the result, with the expected bf16 values written out by hand;
//   - the CPU backend (fp32) on bf16-ROUNDED copies of the matmul operands (round_bf16, gpu_test_support.h):
//     a product of two bf16 numbers is exact in fp32 (8 + 8 significant bits), so the two differ
//     only in summation order: tolerance at fp32 accumulation level (kSumTol);
//   - the CPU backend on the unrounded fp32 operands: the bf16 band (kBf16Band), and for shapes
//     with many outputs the rounding must be visible (> kBf16Visible), so a backend that silently
//     ran fp32 fails.
// Gradients are pre-filled with unrounded random values: the backward ops accumulate (beta = 1)
// into fp32.
//
// Skipped when no CUDA device is visible; under engine/backend/cuda/emu/run_emulated_tests.py the
// kernels and cuBLAS (bf16 GemmEx included) run on a CPU emulation of CUDA.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "gpu_test_support.h"

namespace {

using ctx::Precision;

#define REQUIRE_GPU()                                                                        \
    do {                                                                                     \
        if (!have_gpu())                                                                     \
            GTEST_SKIP() << "no CUDA device visible (cuda_device_count() == 0): the CUDA "   \
                            "bf16 tests need a GPU";                                         \
    } while (0)

// Summation-order differences of fp32 accumulation (max |err| / max |want|): forward and dinp
// sum IC or OC products, dW sums N products (up to 2049 here) on top of a pre-filled gradient.
constexpr double kSumTol = 2e-5;
constexpr double kSumTolDW = 5e-5;
// bf16 operands (8 significant bits: relative rounding error <= 2^-9 per operand) against fp32
// ones: each product is off by up to ~2^-8 relative, random sums by ~1e-3 of the largest output.
constexpr double kBf16Band = 1e-2;
constexpr double kBf16Visible = 1e-4;

ctx::Backend& bf16() { return gpu_bf16(); }

// A device buffer of the bf16 backend (allocated, filled and read on its own stream).
struct BDev : Dev {
    explicit BDev(size_t n) : Dev(n, gpu_bf16()) {}
    explicit BDev(const FVec& h) : Dev(h, gpu_bf16()) {}
};

bool bitwise_equal(const FVec& a, const FVec& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---------------------------------------------------------------- the host rounding itself

TEST(OpsGpuBf16, HostRoundingReference) {
    // The test's own reference, checked on values whose bf16 neighbours are known: 1 + k 2^-8
    // lies on a tie for odd k (bf16 spacing at 1 is 2^-7).
    const float t = std::ldexp(1.0f, -8), tiny = std::ldexp(1.0f, -20);
    EXPECT_EQ(round_bf16(1.0f + t), 1.0f);                                  // tie -> even (1)
    EXPECT_EQ(round_bf16(1.0f + 3 * t), 1.0f + 4 * t);                      // tie -> even
    EXPECT_EQ(round_bf16(1.0f + t + tiny), 1.0f + 2 * t);                   // above the tie
    EXPECT_EQ(round_bf16(1.0f + t - tiny), 1.0f);                           // below the tie
    EXPECT_EQ(round_bf16(-(1.0f + 3 * t)), -(1.0f + 4 * t));                // sign kept
    EXPECT_EQ(round_bf16(FLT_MAX), INFINITY);                               // overflow
    EXPECT_EQ(round_bf16(std::ldexp(255.0f, 120)), std::ldexp(255.0f, 120)); // largest bf16
    EXPECT_TRUE(std::isnan(round_bf16(NAN)));
    EXPECT_EQ(round_bf16(0.1f), 0.10009765625f);  // 0x3dcccccd -> 0x3dcd
}

// ---------------------------------------------------------------- backend identity

TEST(OpsGpuBf16, PrecisionAndName) {
    REQUIRE_GPU();
    EXPECT_EQ(bf16().precision(), Precision::Bf16);
    EXPECT_EQ(bf16().kind(), ctx::DeviceKind::CUDA);
    EXPECT_NE(bf16().name().find("bf16"), std::string::npos) << bf16().name();
    EXPECT_EQ(bf16().name().find("fp32"), std::string::npos) << bf16().name();
    const std::unique_ptr<ctx::Backend> f32 = ctx::make_cuda_backend(0, Precision::Fp32);
    EXPECT_EQ(f32->precision(), Precision::Fp32);
    EXPECT_NE(f32->name().find("fp32"), std::string::npos) << f32->name();
    EXPECT_EQ(f32->name().find("bf16"), std::string::npos) << f32->name();
    EXPECT_THROW(ctx::make_cuda_backend(0, static_cast<Precision>(7)), ctx::Error);
}

// ---------------------------------------------------------------- exact rounding through the ops

// Operands whose bf16 roundings are known exactly; with the other operand 1 (exact in bf16) the
// products and sums are exact, so every output is checked for equality.
struct Probe {
    float in, want;  // fp32 operand, its bf16 value
};
std::vector<Probe> probes() {
    const float t = std::ldexp(1.0f, -8), tiny = std::ldexp(1.0f, -20);
    return {{1.0f + t, 1.0f},                  {1.0f + 3 * t, 1.0f + 4 * t},
            {1.0f + t + tiny, 1.0f + 2 * t},   {1.0f + t - tiny, 1.0f},
            {-(1.0f + 3 * t), -(1.0f + 4 * t)}, {0.1f, 0.10009765625f},
            {1000.3f, 1000.0f},                {FLT_MAX, INFINITY}};
}

void expect_exact(const FVec& got, const std::vector<float>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); i++) EXPECT_EQ(got[i], want[i]) << what << " entry " << i;
}

TEST(OpsGpuBf16, ForwardRoundsActivationsAndWeightsToNearestEven) {
    REQUIRE_GPU();
    const std::vector<Probe> p = probes();
    const int K = int(p.size());
    std::vector<float> in(static_cast<size_t>(K)), want(static_cast<size_t>(K));
    for (int k = 0; k < K; k++) in[size_t(k)] = p[size_t(k)].in, want[size_t(k)] = p[size_t(k)].want;
    {  // activations: out (K, 1) = x (K, 1) @ [1]^T, no bias
        BDev x(in), W(FVec{1.0f}), out(static_cast<size_t>(K));
        bf16().matmul_forward(out.get(), x.get(), W.get(), nullptr, K, 1, 1);
        expect_exact(out.host(), want, "activation");
    }
    {  // weights: out (1, K) = [1] @ W^T, W (K, 1)
        BDev x(FVec{1.0f}), W(in), out(static_cast<size_t>(K));
        bf16().matmul_forward(out.get(), x.get(), W.get(), nullptr, 1, 1, K);
        expect_exact(out.host(), want, "weight");
    }
    {  // the bias is added in fp32, unrounded: out = bias + bf16(1 + 3t) * 1
        const float bias = 1.0f + std::ldexp(1.0f, -20);
        BDev x(FVec{p[1].in}), W(FVec{1.0f}), b(FVec{bias}), out(1);
        bf16().matmul_forward(out.get(), x.get(), W.get(), b.get(), 1, 1, 1);
        expect_exact(out.host(), {p[1].want + bias}, "bias");
    }
    {  // NaN propagates
        BDev x(FVec{NAN, 2.0f}), W(FVec{1.0f}), out(2);
        bf16().matmul_forward(out.get(), x.get(), W.get(), nullptr, 2, 1, 1);
        const FVec o = out.host();
        EXPECT_TRUE(std::isnan(o[0]));
        EXPECT_EQ(o[1], 2.0f);
    }
}

TEST(OpsGpuBf16, BackwardRoundsEveryOperandToNearestEven) {
    REQUIRE_GPU();
    const std::vector<Probe> p = probes();
    const int K = int(p.size()) - 1;  // finite probes only (an inf operand would make 0 * inf)
    std::vector<float> in(static_cast<size_t>(K)), want(static_cast<size_t>(K));
    for (int k = 0; k < K; k++) in[size_t(k)] = p[size_t(k)].in, want[size_t(k)] = p[size_t(k)].want;
    const float pre = 0.5f;  // pre-filled gradients: the ops accumulate onto them in fp32
    std::vector<float> want_acc(static_cast<size_t>(K));
    for (int k = 0; k < K; k++) want_acc[size_t(k)] = pre + want[size_t(k)];
    {  // dout rounded: N = K rows, IC = OC = 1, x = W = 1: dinp[n] += bf16(dout[n]), dW += sum
        BDev dout(in), x(FVec(size_t(K), 1.0f)), W(FVec{1.0f});
        BDev dx(FVec(size_t(K), pre)), dW(FVec{pre});
        bf16().matmul_backward(dx.get(), dW.get(), nullptr, dout.get(), x.get(), W.get(), K, 1, 1);
        expect_exact(dx.host(), want_acc, "dinp from dout");
    }
    {  // W rounded: N = 1, IC = K, OC = 1, dout = 1: dinp[i] += bf16(W[i])
        BDev dout(FVec{1.0f}), x(FVec(size_t(K), 1.0f)), W(in);
        BDev dx(FVec(size_t(K), pre)), dW(FVec(size_t(K), pre));
        bf16().matmul_backward(dx.get(), dW.get(), nullptr, dout.get(), x.get(), W.get(), 1, K, 1);
        expect_exact(dx.host(), want_acc, "dinp from W");
    }
    {  // inp rounded: N = 1, IC = K, OC = 1, dout = 1: dW[i] += bf16(x[i]); dbias += 1 (fp32)
        BDev dout(FVec{1.0f}), x(in), W(FVec(size_t(K), 1.0f));
        BDev dW(FVec(size_t(K), pre)), db(FVec{pre});
        bf16().matmul_backward(nullptr, dW.get(), db.get(), dout.get(), x.get(), W.get(), 1, K, 1);
        expect_exact(dW.host(), want_acc, "dW from inp");
        expect_exact(db.host(), {pre + 1.0f}, "dbias");
    }
    {  // dbias sums the unrounded fp32 dout: 0.5 + (1 + 3t) + (1 + t) exactly
        const float t = std::ldexp(1.0f, -8);
        BDev dout(FVec{1.0f + 3 * t, 1.0f + t}), x(FVec{1.0f, 1.0f}), W(FVec{1.0f});
        BDev dW(FVec{0.0f}), db(FVec{pre});
        bf16().matmul_backward(nullptr, dW.get(), db.get(), dout.get(), x.get(), W.get(), 2, 1, 1);
        expect_exact(db.host(), {pre + 2.0f + 4 * t}, "dbias fp32");
        expect_exact(dW.host(), {(1.0f + 4 * t) + 1.0f}, "dW bf16");  // bf16(dout) summed
    }
}

// ---------------------------------------------------------------- random shapes

struct MmCase {
    int N, IC, OC;
    bool bias, dinp;
};
void PrintTo(const MmCase& c, std::ostream* os) {
    *os << c.N << "x" << c.IC << "x" << c.OC << (c.bias ? " bias" : "") << (c.dinp ? " dinp" : "");
}

class OpsGpuBf16Matmul : public ::testing::TestWithParam<MmCase> {};

TEST_P(OpsGpuBf16Matmul, MatchesCpuOnRoundedOperands) {
    REQUIRE_GPU();
    const auto [N, IC, OC, use_bias, use_dinp] = GetParam();
    ref::Rng rng(11 + N + IC * 3 + OC * 5);
    const FVec x = randn(rng, size_t(N) * IC), W = randn(rng, size_t(OC) * IC, 0.2),
               bias = randn(rng, OC), dout = randn(rng, size_t(N) * OC);
    const FVec xr = rounded(x), Wr = rounded(W), doutr = rounded(dout);
    const float* cb = use_bias ? bias.data() : nullptr;
    const bool big = size_t(N) * OC >= 64 && size_t(N) * IC >= 64 && size_t(OC) * IC >= 64;

    // ---- forward: out (N, OC) = bf16(x) bf16(W)^T + bias (fp32)
    FVec want(size_t(N) * OC), want32(size_t(N) * OC);
    cpu().matmul_forward(want.data(), xr.data(), Wr.data(), cb, N, IC, OC);
    cpu().matmul_forward(want32.data(), x.data(), W.data(), cb, N, IC, OC);
    BDev gx(x), gW(W), gbias(bias), gout(randn(rng, want.size()));  // garbage: forward writes
    bf16().matmul_forward(gout.get(), gx.get(), gW.get(), use_bias ? gbias.get() : nullptr, N, IC,
                          OC);
    const FVec out = gout.host();
    EXPECT_LT(rel_err(out, want), kSumTol) << "forward vs rounded operands";
    const double band = rel_err(out, want32);
    EXPECT_LT(band, kBf16Band) << "forward vs fp32 operands";
    if (big) {
        EXPECT_GT(band, kBf16Visible) << "forward shows no bf16 rounding";
    }

    // ---- backward, gradients pre-filled (accumulation into fp32)
    const FVec dx0 = randn(rng, x.size()), dW0 = randn(rng, W.size()), db0 = randn(rng, OC);
    FVec dx = dx0, dW = dW0, db = db0, dx32 = dx0, dW32 = dW0, scratch = dW0;
    cpu().matmul_backward(use_dinp ? dx.data() : nullptr, dW.data(), nullptr, doutr.data(),
                          xr.data(), Wr.data(), N, IC, OC);
    cpu().matmul_backward(use_dinp ? dx32.data() : nullptr, dW32.data(), nullptr, dout.data(),
                          x.data(), W.data(), N, IC, OC);
    // dbias sums the fp32 dout (not rounded)
    cpu().matmul_backward(nullptr, scratch.data(), db.data(), dout.data(), x.data(), W.data(), N,
                          IC, OC);
    BDev gdout(dout), gdx(dx0), gdW(dW0), gdb(db0);
    bf16().matmul_backward(use_dinp ? gdx.get() : nullptr, gdW.get(),
                           use_bias ? gdb.get() : nullptr, gdout.get(), gx.get(), gW.get(), N, IC,
                           OC);
    const FVec gdx_h = gdx.host(), gdW_h = gdW.host(), gdb_h = gdb.host();
    // measured errors, for comparing runs (emulated, GPU models)
    std::printf("  out %.1e (fp32 %.1e)  dinp %.1e (fp32 %.1e)  dW %.1e (fp32 %.1e)  db %.1e\n",
                rel_err(out, want), band, use_dinp ? rel_err(gdx_h, dx) : 0.0,
                use_dinp ? rel_err(gdx_h, dx32) : 0.0, rel_err(gdW_h, dW), rel_err(gdW_h, dW32),
                use_bias ? rel_err(gdb_h, db) : 0.0);
    if (use_dinp) {
        EXPECT_LT(rel_err(gdx_h, dx), kSumTol) << "dinp vs rounded operands";
        EXPECT_LT(rel_err(gdx_h, dx32), kBf16Band) << "dinp vs fp32 operands";
    } else {
        EXPECT_TRUE(bitwise_equal(gdx_h, dx0)) << "dinp = null must leave the buffer alone";
    }
    EXPECT_LT(rel_err(gdW_h, dW), kSumTolDW) << "dW vs rounded operands";
    EXPECT_LT(rel_err(gdW_h, dW32), kBf16Band) << "dW vs fp32 operands";
    if (use_bias) {
        EXPECT_LT(rel_err(gdb_h, db), kSumTol) << "dbias (fp32 column sums)";
        // taken in the pass that rounds dout, in the fp32 backend's chunks and order: its bits
        Dev fdW(dW0), fdb(db0), fdout(dout), fx(x), fW(W);
        gpu().matmul_backward(nullptr, fdW.get(), fdb.get(), fdout.get(), fx.get(), fW.get(), N,
                              IC, OC);
        EXPECT_TRUE(bitwise_equal(gdb_h, fdb.host())) << "dbias differs from the fp32 backend's";
    } else {
        EXPECT_TRUE(bitwise_equal(gdb_h, db0)) << "dbias = null must leave the buffer alone";
    }

    // The fp32 inputs are left as they were (rounding goes to scratch, never in place): the
    // weights are the optimizer's master copy.
    EXPECT_TRUE(bitwise_equal(gx.host(), x));
    EXPECT_TRUE(bitwise_equal(gW.host(), W));
    EXPECT_TRUE(bitwise_equal(gdout.host(), dout));
    EXPECT_TRUE(bitwise_equal(gbias.host(), bias));

    // Deterministic: the same call from the same pre-filled gradients gives the same bits.
    BDev gdx2(dx0), gdW2(dW0), gdb2(db0), gout2(want.size());
    bf16().matmul_forward(gout2.get(), gx.get(), gW.get(), use_bias ? gbias.get() : nullptr, N,
                          IC, OC);
    bf16().matmul_backward(use_dinp ? gdx2.get() : nullptr, gdW2.get(),
                           use_bias ? gdb2.get() : nullptr, gdout.get(), gx.get(), gW.get(), N,
                           IC, OC);
    EXPECT_TRUE(bitwise_equal(gout2.host(), out));
    EXPECT_TRUE(bitwise_equal(gdx2.host(), gdx_h));
    EXPECT_TRUE(bitwise_equal(gdW2.host(), gdW_h));
    EXPECT_TRUE(bitwise_equal(gdb2.host(), gdb_h));
}

// Odd shapes (no dimension a multiple of 8: cuBLAS falls back from its aligned tensor-core
// kernels), a vector-sized product, null dinp / dbias, long N reductions, a large vocabulary.
INSTANTIATE_TEST_SUITE_P(Cases, OpsGpuBf16Matmul,
                         ::testing::Values(MmCase{1, 1, 1, true, true},
                                           MmCase{7, 33, 65, true, true},
                                           MmCase{37, 80, 240, false, true},
                                           MmCase{64, 256, 768, true, false},
                                           MmCase{130, 128, 1003, false, false},
                                           MmCase{2049, 96, 48, true, true}));

// ---------------------------------------------------------------- the other ops stay fp32

TEST(OpsGpuBf16, NonMatmulOpsStayFp32) {
    REQUIRE_GPU();
    ref::Rng rng(5);
    const int N = 37, C = 96, V = 211;
    // layernorm: fp32 statistics and output (fp32 tolerance, far below bf16 rounding)
    const FVec x = randn(rng, size_t(N) * C, 2.0), w = randn(rng, C), b = randn(rng, C);
    FVec out(x.size()), mean(N), rstd(N);
    cpu().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                            C, 1e-5f);
    BDev gx(x), gw(w), gb(b), gout(x.size()), gmean(static_cast<size_t>(N)), grstd(static_cast<size_t>(N));
    bf16().layernorm_forward(gout.get(), gmean.get(), grstd.get(), gx.get(), gw.get(), gb.get(), N,
                             C, 1e-5f);
    EXPECT_LT(rel_err(gout.host(), out), kFwdTol);
    EXPECT_LT(rel_err(grstd.host(), rstd), kFwdTol);

    // cross-entropy: fp32 softmax statistics and gradients
    const FVec logits = randn(rng, size_t(N) * V, 3.0);
    std::vector<int32_t> targets(static_cast<size_t>(N));
    for (int n = 0; n < N; n++) targets[size_t(n)] = (n * 17 + 3) % V;
    FVec dl = logits, losses(N);
    cpu().crossentropy_forward_backward(dl.data(), losses.data(), targets.data(), nullptr, N, V,
                                        0.25f);
    BDev gdl(logits), glosses(static_cast<size_t>(N));
    bf16().crossentropy_forward_backward(gdl.get(), glosses.get(), targets.data(), nullptr, N, V,
                                         0.25f);
    EXPECT_LT(rel_err(glosses.host(), losses), kFwdTol);
    EXPECT_LT(rel_err(gdl.host(), dl), kFwdTol);

    // attention (materialised): fp32 products and softmax
    const int B = 2, T = 13, AC = 32, H = 2;
    const FVec qkv = randn(rng, size_t(B) * T * 3 * AC);
    FVec pos(size_t(B) * T);
    for (int i = 0; i < B * T; i++) pos[size_t(i)] = float(i % T);
    ctx::AttentionOptions opt;
    FVec aout(size_t(B) * T * AC), att(ctx::attention_saved_floats(opt.mode, B, T, H));
    cpu().attention_forward(aout.data(), att.data(), qkv.data(), pos.data(), B, T, AC, H, opt);
    BDev gqkv(qkv), gpos(pos), gaout(aout.size()), gatt(att.size());
    bf16().attention_forward(gaout.get(), gatt.get(), gqkv.get(), gpos.get(), B, T, AC, H, opt);
    EXPECT_LT(rel_err(gaout.host(), aout), kFwdTol);
    EXPECT_LT(rel_err(gatt.host(), att), kFwdTol);
}

}  // namespace
