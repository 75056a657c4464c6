// CPU backend ops other than attention: memory, elementwise, embedding, layer norm, matmul, GELU,
// cross-entropy, AdamW. Forwards are compared with the double-precision references of
// op_reference.h; gradients with central differences of those references (loss L = sum(out * R)
// for a fixed random R). Every backward starts from pre-filled gradient buffers and the test
// checks that the op added to them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <ostream>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_math.h"
#include "core/error.h"
#include "op_reference.h"

namespace {

using ref::Vec;

ctx::Backend& cpu() {
    static std::unique_ptr<ctx::Backend> backend = ctx::make_cpu_backend(2);
    return *backend;
}

// got - base, in double: what a backward op added to a pre-filled buffer.
Vec added(const std::vector<float>& got, const Vec& base) {
    Vec d(got.size());
    for (size_t i = 0; i < got.size(); i++) d[i] = double(got[i]) - base[i];
    return d;
}

constexpr double kFwdTol = 2e-5;   // fp32 op vs double reference, relative to the largest value
constexpr double kGradTol = 2e-4;  // fp32 analytic gradient vs double central differences

// ================================================================ memory + elementwise

TEST(OpsCpuMemory, AllocIsZeroedAndAligned) {
    for (size_t n : {size_t(0), size_t(1), size_t(17), size_t(1000)}) {
        float* p = cpu().alloc_floats(n);
        ASSERT_NE(p, nullptr);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
        for (size_t i = 0; i < n; i++) EXPECT_EQ(p[i], 0.0f);
        cpu().free_floats(p);
    }
}

TEST(OpsCpuMemory, CopyAndZero) {
    ref::Rng rng(1);
    const auto src = ref::to_float(rng.normals(77));
    float* d = cpu().alloc_floats(src.size());
    cpu().copy_to_device(d, src.data(), src.size());
    std::vector<float> back(src.size());
    cpu().copy_to_host(back.data(), d, src.size());
    EXPECT_EQ(back, src);
    float* d2 = cpu().alloc_floats(src.size());
    cpu().copy(d2, d, src.size());  // device to device
    cpu().copy_to_host(back.data(), d2, src.size());
    EXPECT_EQ(back, src);
    cpu().free_floats(d2);
    cpu().zero(d, 40);
    cpu().copy_to_host(back.data(), d, src.size());
    for (size_t i = 0; i < src.size(); i++) EXPECT_EQ(back[i], i < 40 ? 0.0f : src[i]);
    cpu().free_floats(d);
}

TEST(OpsCpuElementwise, AddAccumulateScaleSumSquares) {
    ref::Rng rng(2);
    for (size_t n : {size_t(1), size_t(13), size_t(100003)}) {  // the last one runs in parallel
        const auto a = ref::to_float(rng.normals(n)), b = ref::to_float(rng.normals(n));
        std::vector<float> out(n);
        cpu().add(out.data(), a.data(), b.data(), n);
        for (size_t i = 0; i < n; i++) ASSERT_EQ(out[i], a[i] + b[i]);
        std::vector<float> alias = a;  // out aliases a
        cpu().add(alias.data(), alias.data(), b.data(), n);
        EXPECT_EQ(alias, out);
        std::vector<float> y = a;
        cpu().accumulate(y.data(), b.data(), n);
        EXPECT_EQ(y, out);
        cpu().scale(y.data(), -0.5f, n);
        for (size_t i = 0; i < n; i++) ASSERT_EQ(y[i], out[i] * -0.5f);
        double want = 0.0;
        for (float x : a) want += double(x) * double(x);
        EXPECT_NEAR(cpu().sum_squares(a.data(), n), want, 1e-12 * want);
    }
}

// ================================================================ vectorizable exp / tanh

TEST(OpsCpuMath, FastExpAndTanhMatchLibm) {
    double worst_exp = 0.0, worst_tanh = 0.0;
    for (int i = 0; i <= 400000; i++) {
        const float x = -87.0f + 175.0f * float(i) / 400000.0f;  // [-87, 88]
        const double want = std::exp(double(x));
        worst_exp = std::max(worst_exp, std::fabs(ctx::cpu::fast_exp(x) - want) / want);
        const float u = -12.0f + 24.0f * float(i) / 400000.0f;
        worst_tanh = std::max(worst_tanh, std::fabs(ctx::cpu::fast_tanh(u) - std::tanh(double(u))));
    }
    EXPECT_LT(worst_exp, 3e-7);
    EXPECT_LT(worst_tanh, 3e-7);
    double worst_log = 0.0;  // error / max(1, |log x|)
    for (int i = 0; i <= 400000; i++) {
        const float x = float(std::pow(10.0, -30.0 + 60.0 * i / 400000.0));  // [1e-30, 1e30]
        const double want = std::log(double(x));
        const double err = std::fabs(ctx::cpu::fast_log(x) - want);
        worst_log = std::max(worst_log, err / std::max(1.0, std::fabs(want)));
    }
    for (float x : {1.0f, 1.0000001f, 1.5f, 2.0f, 1.41421f, 1.41422f}) {
        const double err = std::fabs(ctx::cpu::fast_log(x) - std::log(double(x)));
        worst_log = std::max(worst_log, err);
    }
    EXPECT_LT(worst_log, 3e-7);
    EXPECT_EQ(ctx::cpu::fast_log(1.0f), 0.0f);
    EXPECT_EQ(ctx::cpu::fast_exp(0.0f), 1.0f);
    EXPECT_EQ(ctx::cpu::fast_exp(-100.0f), 0.0f);
    EXPECT_EQ(ctx::cpu::fast_exp(-INFINITY), 0.0f);
    EXPECT_TRUE(std::isfinite(ctx::cpu::fast_exp(1000.0f)));
    EXPECT_EQ(ctx::cpu::fast_tanh(50.0f), 1.0f);
    EXPECT_EQ(ctx::cpu::fast_tanh(-50.0f), -1.0f);
}

// ================================================================ embedding

struct EmbeddingCase {
    int N, C, V, P;
    bool with_wpe;
};

void PrintTo(const EmbeddingCase& c, std::ostream* os) { *os << "N" << c.N << "_C" << c.C << "_V" << c.V << "_P" << c.P << (c.with_wpe ? "_wpe" : ""); }

class OpsCpuEmbedding : public ::testing::TestWithParam<EmbeddingCase> {};

TEST_P(OpsCpuEmbedding, ForwardAndGradients) {
    const auto [N, C, V, P, with_wpe] = GetParam();
    ref::Rng rng(10 + N * 7 + C);
    std::vector<int32_t> tokens(N);
    for (auto& t : tokens) t = rng.integer(0, V - 1);
    tokens[0] = V - 1;
    if (N > 2) tokens[N - 1] = tokens[1];  // repeated token: the scatter must add both rows
    std::vector<float> positions(N);
    for (int n = 0; n < N; n++) {
        // fractional, integral, the last row (P - 1) and non-monotone positions
        const int kind = n % 4;
        positions[n] = kind == 0 ? float(P - 1)
                     : kind == 1 ? float(rng.integer(0, P - 1))
                                 : float(rng.uniform(0.0, P - 1));
    }
    const Vec wte = rng.normals(size_t(V) * C), wpe = with_wpe ? rng.normals(size_t(P) * C) : Vec{};
    const auto wte_f = ref::to_float(wte), wpe_f = ref::to_float(wpe);

    std::vector<float> out(size_t(N) * C);
    cpu().embedding_forward(out.data(), tokens.data(), positions.data(), wte_f.data(),
                            with_wpe ? wpe_f.data() : nullptr, N, C, V, P);
    const Vec want = ref::embedding_forward(tokens, positions, wte, wpe, N, C, P);
    EXPECT_LT(ref::max_rel_error(out, want), kFwdTol);

    const Vec R = rng.normals(size_t(N) * C);
    const auto R_f = ref::to_float(R);
    const Vec dwte0 = rng.normals(wte.size(), 0.5), dwpe0 = rng.normals(wpe.size(), 0.5);
    auto dwte = ref::to_float(dwte0), dwpe = ref::to_float(dwpe0);
    cpu().embedding_backward(dwte.data(), with_wpe ? dwpe.data() : nullptr, R_f.data(),
                             tokens.data(), positions.data(), N, C, V, P);

    const Vec g_wte = ref::numeric_grad(
        [&](const Vec& x) { return ref::dot(ref::embedding_forward(tokens, positions, x, wpe, N, C, P), R); },
        wte, 1e-3);
    EXPECT_LT(ref::max_rel_error(added(dwte, dwte0), g_wte), kGradTol);
    if (with_wpe) {
        const Vec g_wpe = ref::numeric_grad(
            [&](const Vec& x) { return ref::dot(ref::embedding_forward(tokens, positions, wte, x, N, C, P), R); },
            wpe, 1e-3);
        EXPECT_LT(ref::max_rel_error(added(dwpe, dwpe0), g_wpe), kGradTol);
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, OpsCpuEmbedding,
                         ::testing::Values(EmbeddingCase{1, 8, 5, 3, true},
                                           EmbeddingCase{37, 13, 11, 9, true},
                                           EmbeddingCase{64, 48, 7, 2, true},
                                           EmbeddingCase{20, 33, 9, 1, false},
                                           EmbeddingCase{50, 17, 6, 1, true}),  // P = 1
                         [](const auto& info) { return ::testing::PrintToString(info.param); });

TEST(OpsCpuEmbeddingChecks, RejectsOutOfRangeTokensAndPositions) {
    const std::vector<float> wte(4 * 2, 1.0f), wpe(3 * 2, 1.0f);
    std::vector<float> out(2 * 2);
    const std::vector<int32_t> bad_tok{0, 4};
    const std::vector<float> pos{0.0f, 1.5f};
    EXPECT_THROW(cpu().embedding_forward(out.data(), bad_tok.data(), pos.data(), wte.data(),
                                         wpe.data(), 2, 2, 4, 3),
                 ctx::Error);
    const std::vector<int32_t> tok{0, 3};
    const std::vector<float> bad_pos{0.0f, 2.5f};
    EXPECT_THROW(cpu().embedding_forward(out.data(), tok.data(), bad_pos.data(), wte.data(),
                                         wpe.data(), 2, 2, 4, 3),
                 ctx::Error);
}

// ================================================================ layer norm

struct LayerNormCase {
    int N, C;
    bool with_bias;
};

void PrintTo(const LayerNormCase& c, std::ostream* os) { *os << "N" << c.N << "_C" << c.C << (c.with_bias ? "_bias" : ""); }

class OpsCpuLayerNorm : public ::testing::TestWithParam<LayerNormCase> {};

TEST_P(OpsCpuLayerNorm, ForwardAndGradients) {
    const auto [N, C, with_bias] = GetParam();
    const double eps = 1e-5;
    ref::Rng rng(20 + N + C);
    Vec inp = rng.normals(size_t(N) * C, 2.0);
    for (int c = 0; c < C; c++) inp[c] += 3.0;  // a row with a large mean
    const Vec w = rng.uniforms(C, 0.5, 1.5), b = with_bias ? rng.normals(C) : Vec{};
    const auto inp_f = ref::to_float(inp), w_f = ref::to_float(w), b_f = ref::to_float(b);

    std::vector<float> out(inp.size()), mean(N), rstd(N);
    cpu().layernorm_forward(out.data(), mean.data(), rstd.data(), inp_f.data(), w_f.data(),
                            with_bias ? b_f.data() : nullptr, N, C, float(eps));
    Vec want_mean, want_rstd;
    const Vec want = ref::layernorm_forward(inp, w, b, N, C, eps, &want_mean, &want_rstd);
    EXPECT_LT(ref::max_rel_error(out, want), kFwdTol);
    EXPECT_LT(ref::max_rel_error(mean, want_mean), kFwdTol);
    EXPECT_LT(ref::max_rel_error(rstd, want_rstd), kFwdTol);

    const Vec R = rng.normals(inp.size());
    const auto R_f = ref::to_float(R);
    const Vec dinp0 = rng.normals(inp.size(), 0.5), dw0 = rng.normals(C, 0.5), db0 = rng.normals(C, 0.5);
    auto dinp = ref::to_float(dinp0), dw = ref::to_float(dw0), db = ref::to_float(db0);
    cpu().layernorm_backward(dinp.data(), dw.data(), with_bias ? db.data() : nullptr, R_f.data(),
                             inp_f.data(), w_f.data(), mean.data(), rstd.data(), N, C);

    auto loss = [&](const Vec& x, const Vec& ww, const Vec& bb) {
        return ref::dot(ref::layernorm_forward(x, ww, bb, N, C, eps), R);
    };
    const Vec g_inp = ref::numeric_grad([&](const Vec& x) { return loss(x, w, b); }, inp, 1e-4);
    const Vec g_w = ref::numeric_grad([&](const Vec& x) { return loss(inp, x, b); }, w, 1e-4);
    EXPECT_LT(ref::max_rel_error(added(dinp, dinp0), g_inp), kGradTol);
    EXPECT_LT(ref::max_rel_error(added(dw, dw0), g_w), kGradTol);
    if (with_bias) {
        const Vec g_b = ref::numeric_grad([&](const Vec& x) { return loss(inp, w, x); }, b, 1e-4);
        EXPECT_LT(ref::max_rel_error(added(db, db0), g_b), kGradTol);
    } else {
        EXPECT_EQ(db, ref::to_float(db0));  // untouched
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, OpsCpuLayerNorm,
                         ::testing::Values(LayerNormCase{1, 8, true}, LayerNormCase{7, 13, true},
                                           LayerNormCase{33, 64, false},
                                           LayerNormCase{16, 100, true}),
                         [](const auto& info) { return ::testing::PrintToString(info.param); });

// ================================================================ RMS norm

class OpsCpuRmsNorm : public ::testing::TestWithParam<LayerNormCase> {};

TEST_P(OpsCpuRmsNorm, ForwardAndGradients) {
    const auto [N, C, unused] = GetParam();
    const double eps = 1e-6;
    ref::Rng rng(40 + N + C);
    Vec inp = rng.normals(size_t(N) * C, 2.0);
    for (int c = 0; c < C; c++) inp[c] += 3.0;  // a row with a large mean: not centred
    const Vec w = rng.uniforms(C, 0.5, 1.5);
    const auto inp_f = ref::to_float(inp), w_f = ref::to_float(w);
    std::vector<float> out(inp.size()), rstd(N);
    cpu().rmsnorm_forward(out.data(), rstd.data(), inp_f.data(), w_f.data(), N, C, float(eps));
    Vec want_rstd;
    const Vec want = ref::rmsnorm_forward(inp, w, N, C, eps, &want_rstd);
    EXPECT_LT(ref::max_rel_error(out, want), kFwdTol);
    EXPECT_LT(ref::max_rel_error(rstd, want_rstd), kFwdTol);

    const Vec R = rng.normals(inp.size());
    const auto R_f = ref::to_float(R);
    const Vec dinp0 = rng.normals(inp.size(), 0.5), dw0 = rng.normals(C, 0.5);
    auto dinp = ref::to_float(dinp0), dw = ref::to_float(dw0);
    cpu().rmsnorm_backward(dinp.data(), dw.data(), R_f.data(), inp_f.data(), w_f.data(),
                           rstd.data(), N, C);
    auto loss = [&](const Vec& x, const Vec& ww) {
        return ref::dot(ref::rmsnorm_forward(x, ww, N, C, eps), R);
    };
    const Vec g_inp = ref::numeric_grad([&](const Vec& x) { return loss(x, w); }, inp, 1e-4);
    const Vec g_w = ref::numeric_grad([&](const Vec& x) { return loss(inp, x); }, w, 1e-4);
    EXPECT_LT(ref::max_rel_error(added(dinp, dinp0), g_inp), kGradTol);
    EXPECT_LT(ref::max_rel_error(added(dw, dw0), g_w), kGradTol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, OpsCpuRmsNorm,
                         ::testing::Values(LayerNormCase{1, 8, false}, LayerNormCase{7, 13, false},
                                           LayerNormCase{33, 64, false},
                                           LayerNormCase{16, 100, false}),
                         [](const auto& info) { return ::testing::PrintToString(info.param); });

// ================================================================ matmul

struct MatmulCase {
    int N, IC, OC;
    bool with_bias;
};

void PrintTo(const MatmulCase& c, std::ostream* os) { *os << "N" << c.N << "_IC" << c.IC << "_OC" << c.OC << (c.with_bias ? "_bias" : ""); }

class OpsCpuMatmul : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(OpsCpuMatmul, ForwardAndGradients) {
    const auto [N, IC, OC, with_bias] = GetParam();
    ref::Rng rng(30 + N * 3 + IC + OC);
    const Vec inp = rng.normals(size_t(N) * IC), W = rng.normals(size_t(OC) * IC, 0.3);
    const Vec bias = with_bias ? rng.normals(OC) : Vec{};
    const auto inp_f = ref::to_float(inp), W_f = ref::to_float(W), bias_f = ref::to_float(bias);

    std::vector<float> out(size_t(N) * OC, 123.0f);  // garbage: forward writes
    cpu().matmul_forward(out.data(), inp_f.data(), W_f.data(), with_bias ? bias_f.data() : nullptr,
                         N, IC, OC);
    EXPECT_LT(ref::max_rel_error(out, ref::matmul_forward(inp, W, bias, N, IC, OC)), kFwdTol);

    const Vec R = rng.normals(out.size());
    const auto R_f = ref::to_float(R);
    const Vec dinp0 = rng.normals(inp.size(), 0.5), dW0 = rng.normals(W.size(), 0.5),
              dbias0 = rng.normals(OC, 0.5);
    auto dinp = ref::to_float(dinp0), dW = ref::to_float(dW0), dbias = ref::to_float(dbias0);
    cpu().matmul_backward(dinp.data(), dW.data(), with_bias ? dbias.data() : nullptr, R_f.data(),
                          inp_f.data(), W_f.data(), N, IC, OC);
    auto loss = [&](const Vec& x, const Vec& w, const Vec& b) {
        return ref::dot(ref::matmul_forward(x, w, b, N, IC, OC), R);
    };
    const Vec g_inp = ref::numeric_grad([&](const Vec& x) { return loss(x, W, bias); }, inp, 1e-3);
    const Vec g_W = ref::numeric_grad([&](const Vec& x) { return loss(inp, x, bias); }, W, 1e-3);
    EXPECT_LT(ref::max_rel_error(added(dinp, dinp0), g_inp), kGradTol);
    EXPECT_LT(ref::max_rel_error(added(dW, dW0), g_W), kGradTol);
    if (with_bias) {
        const Vec g_b = ref::numeric_grad([&](const Vec& x) { return loss(inp, W, x); }, bias, 1e-3);
        EXPECT_LT(ref::max_rel_error(added(dbias, dbias0), g_b), kGradTol);
    }

    // dinp = nullptr: only dW (and dbias) are produced.
    auto dW2 = ref::to_float(dW0);
    cpu().matmul_backward(nullptr, dW2.data(), nullptr, R_f.data(), inp_f.data(), W_f.data(), N,
                          IC, OC);
    EXPECT_LT(ref::max_rel_error(added(dW2, dW0), g_W), kGradTol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, OpsCpuMatmul,
                         ::testing::Values(MatmulCase{1, 5, 3, true}, MatmulCase{7, 13, 11, true},
                                           MatmulCase{16, 24, 40, false},
                                           MatmulCase{33, 17, 70, true}),
                         [](const auto& info) { return ::testing::PrintToString(info.param); });

// The products run as a fixed grid of library tiles (and a small layer's weight gradient as
// fixed chunks of rows): shapes that cross tiles and chunks, against double loops, and the same
// bits with 1 and 2 threads.
TEST(OpsCpuMatmulTiles, MatchDoubleLoopsAndDoNotDependOnTheThreadCount) {
    struct Shape { int N, IC, OC; };
    for (const Shape sh : {Shape{2500, 64, 192}, Shape{1100, 40, 9}, Shape{300, 300, 520}}) {
        const int N = sh.N, IC = sh.IC, OC = sh.OC;
        SCOPED_TRACE(::testing::Message() << "N " << N << " IC " << IC << " OC " << OC);
        ref::Rng rng(91 + N + IC + OC);
        const Vec inp = rng.normals(size_t(N) * IC), W = rng.normals(size_t(OC) * IC, 0.3),
                  bias = rng.normals(OC), R = rng.normals(size_t(N) * OC);
        const auto inp_f = ref::to_float(inp), W_f = ref::to_float(W), bias_f = ref::to_float(bias),
                   R_f = ref::to_float(R);
        // double loops: out = inp W^T + bias, dinp = R W, dW = R^T inp
        Vec out_ref(size_t(N) * OC), dinp_ref(size_t(N) * IC, 0.0), dW_ref(size_t(OC) * IC, 0.0);
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) {
                double acc = bias[o];
                for (int i = 0; i < IC; i++) acc += inp[size_t(n) * IC + i] * W[size_t(o) * IC + i];
                out_ref[size_t(n) * OC + o] = acc;
                const double r = R[size_t(n) * OC + o];
                for (int i = 0; i < IC; i++) {
                    dinp_ref[size_t(n) * IC + i] += r * W[size_t(o) * IC + i];
                    dW_ref[size_t(o) * IC + i] += r * inp[size_t(n) * IC + i];
                }
            }
        std::vector<float> out[2], dinp[2], dW[2];
        for (int threads : {1, 2}) {
            std::unique_ptr<ctx::Backend> be = ctx::make_cpu_backend(threads);
            const int k = threads - 1;
            out[k].assign(size_t(N) * OC, 7.0f);
            dinp[k].assign(size_t(N) * IC, 0.0f);
            dW[k].assign(size_t(OC) * IC, 0.0f);
            be->matmul_forward(out[k].data(), inp_f.data(), W_f.data(), bias_f.data(), N, IC, OC);
            be->matmul_backward(dinp[k].data(), dW[k].data(), nullptr, R_f.data(), inp_f.data(),
                                W_f.data(), N, IC, OC);
        }
        EXPECT_LT(ref::max_rel_error(out[1], out_ref), kFwdTol);
        EXPECT_LT(ref::max_rel_error(dinp[1], dinp_ref), kFwdTol);
        EXPECT_LT(ref::max_rel_error(dW[1], dW_ref), kFwdTol);
        EXPECT_EQ(out[0], out[1]);
        EXPECT_EQ(dinp[0], dinp[1]);
        EXPECT_EQ(dW[0], dW[1]);
    }
}

// ================================================================ activation

TEST(OpsCpuActivation, GeluForwardAndGradients) {
    ref::Rng rng(40);
    for (ctx::Activation act : {ctx::Activation::GeluTanh, ctx::Activation::GeluErf}) {
        for (size_t n : {size_t(1), size_t(257), size_t(5000)}) {
            Vec x = rng.normals(n, 2.5);
            x[0] = 0.0;
            auto f = [&](double v) {
                return act == ctx::Activation::GeluTanh ? ref::gelu_tanh(v) : ref::gelu_erf(v);
            };
            const auto x_f = ref::to_float(x);
            std::vector<float> out(n);
            cpu().activation_forward(out.data(), x_f.data(), n, act);
            Vec want(n);
            for (size_t i = 0; i < n; i++) want[i] = f(x[i]);
            EXPECT_LT(ref::max_rel_error(out, want), kFwdTol);

            const Vec R = rng.normals(n), d0 = rng.normals(n, 0.5);
            const auto R_f = ref::to_float(R);
            auto dinp = ref::to_float(d0);
            cpu().activation_backward(dinp.data(), x_f.data(), R_f.data(), n, act);
            Vec g(n);  // elementwise: one central difference per entry
            for (size_t i = 0; i < n; i++) g[i] = R[i] * (f(x[i] + 1e-5) - f(x[i] - 1e-5)) / 2e-5;
            EXPECT_LT(ref::max_rel_error(added(dinp, d0), g), kGradTol)
                << "activation " << int(act) << " n " << n;
        }
    }
}

// ReLU is exact arithmetic: out = max(x, 0) bit for bit, and the backward adds dout where x > 0
// and nothing elsewhere (0 at x = 0 itself, as PyTorch's relu). -0 and tiny values included.
TEST(OpsCpuActivation, ReluForwardAndGradientsExactly) {
    ref::Rng rng(41);
    for (size_t n : {size_t(1), size_t(17), size_t(5000)}) {
        auto x = ref::to_float(rng.normals(n, 2.0));
        x[0] = 0.0f;
        if (n > 2) {
            x[1] = -0.0f;
            x[2] = 1e-30f;
        }
        std::vector<float> out(n);
        cpu().activation_forward(out.data(), x.data(), n, ctx::Activation::Relu);
        const auto dout = ref::to_float(rng.normals(n)), d0 = ref::to_float(rng.normals(n, 0.5));
        auto dinp = d0;
        cpu().activation_backward(dinp.data(), x.data(), dout.data(), n, ctx::Activation::Relu);
        for (size_t i = 0; i < n; i++) {
            ASSERT_EQ(out[i], x[i] > 0.0f ? x[i] : 0.0f) << "x " << x[i];
            ASSERT_FALSE(std::signbit(out[i])) << "relu(" << x[i] << ") must be +0";
            ASSERT_EQ(dinp[i], x[i] > 0.0f ? d0[i] + dout[i] : d0[i]) << "x " << x[i];
        }
    }
}

// matmul_activation_forward (the default: the product, then the activation) against the double
// references: pre = inp W^T + b, out = act(pre), for each elementwise activation; SwiGLU's out
// (N, OC / 2) = silu(gate) up of pre = [gate | up], an odd OC refused.
TEST(OpsCpuActivation, MatmulActivationForwardIsTheProductThenTheActivation) {
    ref::Rng rng(43);
    const int N = 7, IC = 9, OC = 13;
    const Vec inp = rng.normals(size_t(N) * IC), W = rng.normals(size_t(OC) * IC, 0.4),
              b = rng.normals(OC, 0.3);
    const Vec want_pre = ref::matmul_forward(inp, W, b, N, IC, OC);
    for (ctx::Activation act :
         {ctx::Activation::GeluTanh, ctx::Activation::GeluErf, ctx::Activation::Relu}) {
        std::vector<float> pre(size_t(N) * OC), out(pre.size());
        const auto fi = ref::to_float(inp), fw = ref::to_float(W), fb = ref::to_float(b);
        cpu().matmul_activation_forward(pre.data(), out.data(), fi.data(), fw.data(), fb.data(), N,
                                        IC, OC, act);
        Vec want_out(want_pre.size());
        for (size_t i = 0; i < want_out.size(); ++i) {
            const double x = want_pre[i];
            want_out[i] = act == ctx::Activation::GeluTanh  ? ref::gelu_tanh(x)
                          : act == ctx::Activation::GeluErf ? ref::gelu_erf(x)
                                                            : std::max(x, 0.0);
        }
        EXPECT_LT(ref::max_rel_error(pre, want_pre), kFwdTol) << int(act);
        EXPECT_LT(ref::max_rel_error(out, want_out), kFwdTol) << int(act);
    }
    {  // SwiGLU over OC = 2 x 13 columns [gate | up]
        const Vec W2 = rng.normals(size_t(2 * OC) * IC, 0.4), b2 = rng.normals(2 * OC, 0.3);
        const Vec p = ref::matmul_forward(inp, W2, b2, N, IC, 2 * OC);
        const auto fi = ref::to_float(inp), fw = ref::to_float(W2), fb = ref::to_float(b2);
        std::vector<float> pre(size_t(N) * 2 * OC), out(size_t(N) * OC);
        cpu().matmul_activation_forward(pre.data(), out.data(), fi.data(), fw.data(), fb.data(), N,
                                        IC, 2 * OC, ctx::Activation::SwiGLU);
        Vec want_out(out.size());
        for (int n = 0; n < N; n++)
            for (int f = 0; f < OC; f++) {
                const double g = p[size_t(n) * 2 * OC + f], u = p[size_t(n) * 2 * OC + OC + f];
                want_out[size_t(n) * OC + f] = g / (1.0 + std::exp(-g)) * u;
            }
        EXPECT_LT(ref::max_rel_error(pre, p), kFwdTol) << "swiglu pre";
        EXPECT_LT(ref::max_rel_error(out, want_out), kFwdTol) << "swiglu out";
    }
    std::vector<float> x(size_t(N) * 2 * OC), y(x.size()), w(size_t(2 * OC) * IC);
    EXPECT_THROW(cpu().matmul_activation_forward(x.data(), y.data(), x.data(), w.data(), nullptr,
                                                 N, IC, 2 * OC - 1, ctx::Activation::SwiGLU),
                 ctx::Error);
}

// SwiGLU: out = silu(gate) * up over rows [gate | up], against double formulas and central
// differences in each of the 2F inputs (each output depends on one gate and one up entry).
TEST(OpsCpuActivation, SwiGluForwardAndGradients) {
    ref::Rng rng(41);
    auto silu = [](double g) { return g / (1.0 + std::exp(-g)); };
    for (auto [N, F] : {std::pair{1, 1}, std::pair{3, 17}, std::pair{64, 100}}) {
        Vec x = rng.normals(size_t(N) * 2 * F, 2.5);
        const auto x_f = ref::to_float(x);
        std::vector<float> out(size_t(N) * F);
        cpu().swiglu_forward(out.data(), x_f.data(), N, F);
        Vec want(out.size());
        for (int n = 0; n < N; n++)
            for (int f = 0; f < F; f++)
                want[size_t(n) * F + f] = silu(x[size_t(n) * 2 * F + f]) * x[size_t(n) * 2 * F + F + f];
        EXPECT_LT(ref::max_rel_error(out, want), kFwdTol);

        const Vec R = rng.normals(out.size()), d0 = rng.normals(x.size(), 0.5);
        const auto R_f = ref::to_float(R);
        auto dinp = ref::to_float(d0);
        cpu().swiglu_backward(dinp.data(), x_f.data(), R_f.data(), N, F);
        Vec g(x.size());
        const double h = 1e-5;
        for (int n = 0; n < N; n++)
            for (int f = 0; f < F; f++) {
                const double a = x[size_t(n) * 2 * F + f], u = x[size_t(n) * 2 * F + F + f];
                const double r = R[size_t(n) * F + f];
                g[size_t(n) * 2 * F + f] = r * u * (silu(a + h) - silu(a - h)) / (2 * h);
                g[size_t(n) * 2 * F + F + f] = r * silu(a);
            }
        EXPECT_LT(ref::max_rel_error(added(dinp, d0), g), kGradTol) << N << "x" << F;
    }
}

// ================================================================ grouped-query key/value heads

// kv_repeat_forward against HF's repeat_kv (query head h reads key/value head h / G), and its
// backward as the sum over each group's query heads (the adjoint: <fwd(x), y> = <x, bwd(y)>).
TEST(OpsCpuKvRepeat, RepeatsHeadsAndSumsGradientsBack) {
    ref::Rng rng(43);
    for (auto [N, H, Hkv, D] : {std::tuple{1, 2, 1, 1}, std::tuple{5, 8, 2, 3},
                                std::tuple{7, 6, 6, 4}, std::tuple{3, 12, 4, 16}}) {
        const int G = H / Hkv, Q = (H + 2 * Hkv) * D, F = 3 * H * D;
        const Vec x = rng.normals(size_t(N) * Q);
        const auto x_f = ref::to_float(x);
        std::vector<float> out(size_t(N) * F, -1.0f);
        cpu().kv_repeat_forward(out.data(), x_f.data(), N, H, Hkv, D);
        Vec want(out.size());
        for (int n = 0; n < N; n++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < D; d++) {
                    const double* row = x.data() + size_t(n) * Q;
                    double* w = want.data() + size_t(n) * F;
                    w[h * D + d] = row[h * D + d];                                    // q
                    w[H * D + h * D + d] = row[H * D + (h / G) * D + d];              // k
                    w[2 * H * D + h * D + d] = row[(H + Hkv) * D + (h / G) * D + d];  // v
                }
        EXPECT_EQ(ref::to_double(out), want) << N << " " << H << "/" << Hkv;  // exact copies

        const Vec y = rng.normals(out.size()), d0 = rng.normals(x.size());
        const auto y_f = ref::to_float(y);
        auto dx = ref::to_float(d0);
        cpu().kv_repeat_backward(dx.data(), y_f.data(), N, H, Hkv, D);
        Vec g(x.size(), 0.0);  // the transpose of the copy above, entry by entry
        for (int n = 0; n < N; n++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < D; d++) {
                    double* gr = g.data() + size_t(n) * Q;
                    const double* yr = y.data() + size_t(n) * F;
                    gr[h * D + d] += yr[h * D + d];
                    gr[H * D + (h / G) * D + d] += yr[H * D + h * D + d];
                    gr[(H + Hkv) * D + (h / G) * D + d] += yr[2 * H * D + h * D + d];
                }
        EXPECT_LT(ref::max_rel_error(added(dx, d0), g), kFwdTol);
        double lhs = 0, rhs = 0;  // adjoint identity in double
        for (size_t i = 0; i < want.size(); i++) lhs += want[i] * y[i];
        for (size_t i = 0; i < g.size(); i++) rhs += x[i] * g[i];
        EXPECT_NEAR(lhs, rhs, 1e-9 * (1 + std::fabs(lhs)));
    }
}

// ================================================================ cross-entropy

struct CrossEntropyCase {
    int N, V;
    float grad_scale;
};

void PrintTo(const CrossEntropyCase& c, std::ostream* os) { *os << "N" << c.N << "_V" << c.V << "_gs" << int(c.grad_scale * 1000); }

class OpsCpuCrossEntropy : public ::testing::TestWithParam<CrossEntropyCase> {};

TEST_P(OpsCpuCrossEntropy, ForwardAndGradients) {
    const auto [N, V, grad_scale] = GetParam();
    ref::Rng rng(50 + N + V);
    Vec logits = rng.normals(size_t(N) * V, 3.0);
    for (int i = 0; i < V; i++) logits[i] += 80.0;  // a row that overflows a naive exp
    std::vector<int32_t> targets(N);
    Vec mask(N);
    for (int n = 0; n < N; n++) {
        targets[n] = rng.integer(0, V - 1);
        mask[n] = n % 3 == 1 ? 0.0 : (n % 3 == 2 ? 0.5 : 1.0);
    }
    if (N > 1) targets[1] = -7;  // masked rows may carry any target
    const auto logits_f = ref::to_float(logits), mask_f = ref::to_float(mask);

    const Vec want = ref::crossentropy(logits, targets, mask, N, V);
    std::vector<float> losses(N, 99.0f);
    cpu().crossentropy_forward(losses.data(), logits_f.data(), targets.data(), mask_f.data(), N, V);
    EXPECT_LT(ref::max_rel_error(losses, want), kFwdTol);

    std::vector<float> d = logits_f, losses2(N, 99.0f);
    cpu().crossentropy_forward_backward(d.data(), losses2.data(), targets.data(), mask_f.data(), N,
                                        V, grad_scale);
    EXPECT_LT(ref::max_rel_error(losses2, want), kFwdTol);
    // dlogits = d/dlogits [grad_scale * sum_n losses[n]]
    const Vec g = ref::numeric_grad(
        [&](const Vec& x) {
            const Vec l = ref::crossentropy(x, targets, mask, N, V);
            double s = 0.0;
            for (double v : l) s += grad_scale * v;
            return s;
        },
        logits, 1e-4);
    EXPECT_LT(ref::max_rel_error(d, g), kGradTol);
    for (int n = 0; n < N; n++) {
        if (mask[n] != 0.0) continue;
        EXPECT_EQ(losses2[n], 0.0f);
        for (int i = 0; i < V; i++) ASSERT_EQ(d[size_t(n) * V + i], 0.0f) << "row " << n;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, OpsCpuCrossEntropy,
                         ::testing::Values(CrossEntropyCase{1, 2, 1.0f},
                                           CrossEntropyCase{7, 13, 0.25f},
                                           CrossEntropyCase{12, 97, 1.0f / 12},
                                           CrossEntropyCase{5, 1000, 3.0f}),
                         [](const auto& info) { return ::testing::PrintToString(info.param); });

TEST(OpsCpuCrossEntropyChecks, RejectsOutOfRangeTargets) {
    const std::vector<float> logits(2 * 3, 0.0f), mask{1.0f, 1.0f};
    std::vector<float> losses(2), d = logits;
    for (int32_t bad : {-1, 3}) {
        const std::vector<int32_t> targets{0, bad};
        EXPECT_THROW(cpu().crossentropy_forward(losses.data(), logits.data(), targets.data(),
                                                mask.data(), 2, 3),
                     ctx::Error);
        EXPECT_THROW(cpu().crossentropy_forward_backward(d.data(), losses.data(), targets.data(),
                                                         mask.data(), 2, 3, 1.0f),
                     ctx::Error);
    }
}

TEST(OpsCpuCrossEntropyChecks, UniformLogitsGiveLogV) {
    const int N = 3, V = 4096;
    std::vector<float> d(size_t(N) * V, 0.25f), losses(N), mask(N, 1.0f);
    const std::vector<int32_t> targets{0, 17, V - 1};
    cpu().crossentropy_forward_backward(d.data(), losses.data(), targets.data(), mask.data(), N, V,
                                        1.0f);
    for (int n = 0; n < N; n++) {
        EXPECT_NEAR(losses[n], std::log(double(V)), 1e-5);
        EXPECT_NEAR(d[size_t(n) * V + targets[n]], 1.0 / V - 1.0, 1e-6);
        EXPECT_NEAR(d[size_t(n) * V + (targets[n] + 1) % V], 1.0 / V, 1e-9);
    }
}

// ================================================================ residual product

// matmul_residual_forward: out = residual + inp @ W^T (+ bias), against loops in double; the
// residual and inp are left as they were; out aliasing either is refused.
TEST(OpsCpuMatmulResidual, AddsTheResidualToTheProduct) {
    ref::Rng rng(70);
    const int N = 13, IC = 19, OC = 7;
    const Vec inp = rng.normals(size_t(N) * IC), W = rng.normals(size_t(OC) * IC),
              b = rng.normals(OC), res = rng.normals(size_t(N) * OC);
    const auto inp_f = ref::to_float(inp), W_f = ref::to_float(W), b_f = ref::to_float(b),
               res_f = ref::to_float(res);
    for (bool with_bias : {true, false}) {
        std::vector<float> out(size_t(N) * OC, 123.0f);
        cpu().matmul_residual_forward(out.data(), res_f.data(), inp_f.data(), W_f.data(),
                                      with_bias ? b_f.data() : nullptr, N, IC, OC);
        Vec want(out.size());
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) {
                double s = double(res_f[size_t(n) * OC + o]) + (with_bias ? double(b_f[o]) : 0.0);
                for (int i = 0; i < IC; i++)
                    s += double(inp_f[size_t(n) * IC + i]) * double(W_f[size_t(o) * IC + i]);
                want[size_t(n) * OC + o] = s;
            }
        EXPECT_LT(ref::max_rel_error(out, want), 1e-5) << "bias " << with_bias;
        EXPECT_EQ(res_f, ref::to_float(res));
    }
    std::vector<float> buf(size_t(N) * OC);
    EXPECT_THROW(cpu().matmul_residual_forward(buf.data(), buf.data(), inp_f.data(), W_f.data(),
                                               nullptr, N, IC, OC),
                 ctx::Error);
}

// ================================================================ AdamW

TEST(OpsCpuAdamW, MatchesRecurrenceInDouble) {
    ref::Rng rng(60);
    const size_t n = 10007;  // parallel path, odd size
    ctx::AdamWParams hp;
    hp.lr = 3e-3f;
    hp.beta1 = 0.9f;
    hp.beta2 = 0.95f;
    hp.eps = 1e-8f;
    hp.weight_decay = 0.1f;
    Vec p = rng.normals(n), m(n, 0.0), v(n, 0.0);
    auto p_f = ref::to_float(p), m_f = ref::to_float(m), v_f = ref::to_float(v);
    for (int step = 1; step <= 5; step++) {
        const Vec g = rng.normals(n, step == 3 ? 1e-3 : 1.0);
        const auto g_f = ref::to_float(g);
        hp.step = step;
        cpu().adamw_update(p_f.data(), g_f.data(), m_f.data(), v_f.data(), n, hp);
        const double b1 = hp.beta1, b2 = hp.beta2;
        for (size_t i = 0; i < n; i++) {
            m[i] = b1 * m[i] + (1 - b1) * g[i];
            v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
            const double mhat = m[i] / (1 - std::pow(b1, step));
            const double vhat = v[i] / (1 - std::pow(b2, step));
            p[i] -= double(hp.lr) * (mhat / (std::sqrt(vhat) + double(hp.eps)) +
                                     double(hp.weight_decay) * p[i]);
        }
        EXPECT_LT(ref::max_rel_error(p_f, p), 1e-6) << "step " << step;
        EXPECT_LT(ref::max_rel_error(m_f, m), 1e-5) << "step " << step;
        EXPECT_LT(ref::max_rel_error(v_f, v), 1e-5) << "step " << step;
    }
}

// adamw_update_segments (the Backend default: a call per piece) against the recurrence in
// double with each piece's own decay; the floats between the pieces are not touched.
TEST(OpsCpuAdamW, SegmentsDecayPerPieceAndSkipTheGaps) {
    ref::Rng rng(61);
    const size_t n = 9000;
    const std::vector<ctx::AdamWSegment> segs = {
        {0, 768, false}, {784, 5000, true}, {5784, 3, false}, {5800, 3000, true}, {8999, 1, true}};
    ctx::AdamWParams hp;
    hp.lr = 3e-3f;
    hp.beta2 = 0.95f;
    hp.weight_decay = 0.3f;
    Vec p = rng.normals(n), m(n, 0.0), v(n, 0.0);
    auto p_f = ref::to_float(p), m_f = ref::to_float(m), v_f = ref::to_float(v);
    const auto p0 = p_f;
    std::vector<int> decay(n, -1);  // -1: in no piece
    for (const auto& sg : segs)
        for (size_t i = sg.offset; i < sg.offset + sg.n; i++) decay[i] = sg.decay ? 1 : 0;
    for (int step = 1; step <= 3; step++) {
        const Vec g = rng.normals(n);
        const auto g_f = ref::to_float(g);
        hp.step = step;
        cpu().adamw_update_segments(p_f.data(), g_f.data(), m_f.data(), v_f.data(), segs, hp);
        const double b1 = hp.beta1, b2 = hp.beta2;
        for (size_t i = 0; i < n; i++) {
            if (decay[i] < 0) continue;
            m[i] = b1 * m[i] + (1 - b1) * g[i];
            v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
            const double mhat = m[i] / (1 - std::pow(b1, step));
            const double vhat = v[i] / (1 - std::pow(b2, step));
            const double wd = decay[i] ? double(hp.weight_decay) : 0.0;
            p[i] -= double(hp.lr) * (mhat / (std::sqrt(vhat) + double(hp.eps)) + wd * p[i]);
        }
        EXPECT_LT(ref::max_rel_error(p_f, p), 1e-6) << "step " << step;
        EXPECT_LT(ref::max_rel_error(m_f, m), 1e-5) << "step " << step;
    }
    for (size_t i = 0; i < n; i++)
        if (decay[i] < 0) {
            EXPECT_EQ(p_f[i], p0[i]) << i;
            EXPECT_EQ(m_f[i], 0.0f) << i;
            EXPECT_EQ(v_f[i], 0.0f) << i;
        }
}

TEST(OpsCpuAdamW, ConstantGradientClosedForm) {
    // With a constant gradient g from m = v = 0: mhat = g and vhat = g^2 at every step, so each
    // step is p <- p - lr (sign(g) |g| / (|g| + eps) + wd p).
    const std::vector<float> g{0.5f, -2.0f, 1e-3f, 0.0f, 7.0f};
    const size_t n = g.size();
    std::vector<float> p{1.0f, -1.0f, 0.25f, 2.0f, 0.0f}, m(n, 0.0f), v(n, 0.0f);
    ctx::AdamWParams hp;
    hp.lr = 0.01f;
    hp.weight_decay = 0.5f;
    Vec want(p.begin(), p.end());
    for (int step = 1; step <= 4; step++) {
        hp.step = step;
        cpu().adamw_update(p.data(), g.data(), m.data(), v.data(), n, hp);
        for (size_t i = 0; i < n; i++)
            want[i] -= double(hp.lr) * (g[i] / (std::fabs(double(g[i])) + double(hp.eps)) +
                                        double(hp.weight_decay) * want[i]);
        for (size_t i = 0; i < n; i++) EXPECT_NEAR(p[i], want[i], 2e-6) << "step " << step << " i " << i;
    }
}

}  // namespace
