// bf16 activation storage on the CUDA backend (backend.h, "bf16 activation storage"): in
// Precision::Bf16 the ops that make a product's input (layer norm, RMS norm, the MLP's
// activation, SwiGLU) can write it in bf16, and the products and the head read it so.
//
// References:
//   - the same backend's fp32 op, its output rounded to nearest even on the host (round_bf16):
//     the kernels are one template for both storages, so the bits must be equal;
//   - the CPU backend's fp32 op, rounded: within one bf16 step (the fp32 results differ in the
//     last bits, which may move a rounding across a tie);
//   - for the readers: the same backend's fp32-input op on the same values (bf16 values held in
//     fp32, which it rounds to themselves): equal bits, since both multiply the same bf16 data.
// And the switch: on by default in bf16, off in fp32 and with CTX_BF16_ACTIVATIONS=0, a bad value
// refused, and the *_bf16 ops refused (ctx::Error naming the op) where the storage is off.
//
// Skipped without a CUDA device; under engine/backend/cuda/emu/run_emulated_tests.py the
// kernels and cuBLAS run on the CPU emulation of CUDA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "gpu_test_support.h"

namespace {

using ctx::Activation;
using ctx::Bf16;
using ctx::Precision;

#define REQUIRE_GPU()                                                                      \
    do {                                                                                   \
        if (!have_gpu())                                                                   \
            GTEST_SKIP() << "no CUDA device visible: the bf16 activation tests need a GPU"; \
    } while (0)

ctx::Backend& be() { return gpu_bf16(); }

// ---------------------------------------------------------------- the switch

TEST(OpsGpuBf16Acts, OnInBf16OffInFp32AndByEnvironment) {
    REQUIRE_GPU();
    EXPECT_TRUE(be().bf16_activations());
    EXPECT_NE(be().name().find("bf16 activations"), std::string::npos) << be().name();
    EXPECT_FALSE(gpu().bf16_activations());
    EXPECT_FALSE(cpu().bf16_activations());
    setenv("CTX_BF16_ACTIVATIONS", "0", 1);
    const std::unique_ptr<ctx::Backend> off = ctx::make_cuda_backend(0, Precision::Bf16);
    unsetenv("CTX_BF16_ACTIVATIONS");
    EXPECT_FALSE(off->bf16_activations());
    EXPECT_EQ(off->name().find("activations"), std::string::npos) << off->name();
    setenv("CTX_BF16_ACTIVATIONS", "yes", 1);
    expect_error([] { (void)ctx::make_cuda_backend(0, Precision::Bf16); },
                 {"CTX_BF16_ACTIVATIONS", "yes"});
    unsetenv("CTX_BF16_ACTIVATIONS");

    // where the storage is off, the bf16 ops refuse, naming themselves
    Dev16 y(64);
    Dev x(FVec(64, 1.0f), *off), w(FVec(64, 1.0f), *off), r(1, *off);
    expect_error(
        [&] { off->rmsnorm_forward_bf16(y.get(), r.get(), x.get(), w.get(), 1, 64, 1e-5f); },
        {"rmsnorm_forward_bf16", "CTX_BF16_ACTIVATIONS"});
    expect_error([&] { gpu().matmul_forward_bf16(r.get(), y.get(), w.get(), nullptr, 1, 64, 1); },
                 {"matmul_forward_bf16", "fp32"});
    FVec hx(64, 1.0f), hr(1);
    std::vector<uint16_t> hy(64);
    expect_error([&] {
        cpu().layernorm_forward_bf16(reinterpret_cast<Bf16*>(hy.data()), hr.data(), hr.data(),
                                     hx.data(), hx.data(), nullptr, 1, 64, 1e-5f);
    }, {"layernorm_forward_bf16", "cpu"});
}

// ---------------------------------------------------------------- the writers

struct Rows {
    int N, C;
};

class OpsGpuBf16ActsWriters : public ::testing::TestWithParam<Rows> {};

TEST_P(OpsGpuBf16ActsWriters, NormsWriteTheirFp32OutputRounded) {
    REQUIRE_GPU();
    const auto [N, C] = GetParam();
    ref::Rng rng(11);
    const FVec x = randn(rng, size_t(N) * C, 3.0), w = randn(rng, C), b = randn(rng, C);
    Dev gx(x, be()), gw(w, be()), gb(b, be()), out(x.size(), be());
    Dev mean(N, be()), rstd(N, be()), mean16(N, be()), rstd16(N, be());
    Dev16 out16(x.size());
    // layer norm
    be().layernorm_forward(out.get(), mean.get(), rstd.get(), gx.get(), gw.get(), gb.get(), N, C,
                           1e-5f);
    be().layernorm_forward_bf16(out16.get(), mean16.get(), rstd16.get(), gx.get(), gw.get(),
                                gb.get(), N, C, 1e-5f);
    expect_same_bits(out16.host(), rounded(out.host()), "layernorm out");
    expect_same_bits(mean16.host(), mean.host(), "layernorm mean");
    expect_same_bits(rstd16.host(), rstd.host(), "layernorm rstd");
    FVec cout(x.size()), cmean(N), crstd(N);
    cpu().layernorm_forward(cout.data(), cmean.data(), crstd.data(), x.data(), w.data(), b.data(),
                            N, C, 1e-5f);
    expect_within_bf16_step(out16.host(), cout, "layernorm out vs cpu");
    // RMS norm
    be().rmsnorm_forward(out.get(), rstd.get(), gx.get(), gw.get(), N, C, 1e-6f);
    be().rmsnorm_forward_bf16(out16.get(), rstd16.get(), gx.get(), gw.get(), N, C, 1e-6f);
    expect_same_bits(out16.host(), rounded(out.host()), "rmsnorm out");
    expect_same_bits(rstd16.host(), rstd.host(), "rmsnorm rstd");
    cpu().rmsnorm_forward(cout.data(), crstd.data(), x.data(), w.data(), N, C, 1e-6f);
    expect_within_bf16_step(out16.host(), cout, "rmsnorm out vs cpu");
}

TEST_P(OpsGpuBf16ActsWriters, ActivationsWriteTheirFp32OutputRounded) {
    REQUIRE_GPU();
    const auto [N, C] = GetParam();
    ref::Rng rng(12);
    const size_t n = size_t(N) * C;
    const FVec x = randn(rng, n, 2.5);
    Dev gx(x, be()), out(n, be());
    Dev16 out16(n);
    for (Activation act : {Activation::GeluTanh, Activation::GeluErf, Activation::Relu}) {
        const std::string what = "activation " + std::to_string(int(act));
        be().activation_forward(out.get(), gx.get(), n, act);
        be().activation_forward_bf16(out16.get(), gx.get(), n, act);
        expect_same_bits(out16.host(), rounded(out.host()), what.c_str());
        FVec cout(n);
        cpu().activation_forward(cout.data(), x.data(), n, act);
        expect_within_bf16_step(out16.host(), cout, (what + " vs cpu").c_str());
    }
    // SwiGLU over rows [gate | up] of 2C: out (N, C)
    const FVec gu = randn(rng, 2 * n, 2.0);
    Dev ggu(gu, be());
    be().swiglu_forward(out.get(), ggu.get(), N, C);
    be().swiglu_forward_bf16(out16.get(), ggu.get(), N, C);
    expect_same_bits(out16.host(), rounded(out.host()), "swiglu");
    FVec cout(n);
    cpu().swiglu_forward(cout.data(), gu.data(), N, C);
    expect_within_bf16_step(out16.host(), cout, "swiglu vs cpu");
}

// C odd: rows of bf16 start at odd element offsets (2-byte aligned only).
INSTANTIATE_TEST_SUITE_P(Shapes, OpsGpuBf16ActsWriters,
                         ::testing::Values(Rows{37, 96}, Rows{5, 101}, Rows{64, 768}),
                         [](const auto& info) {
                             char name[64];
                             std::snprintf(name, sizeof name, "N%d_C%d", info.param.N,
                                           info.param.C);
                             return std::string(name);
                         });

// ---------------------------------------------------------------- the readers

struct Product {
    int N, IC, OC;
    bool bias;
};

class OpsGpuBf16ActsReaders : public ::testing::TestWithParam<Product> {};

TEST_P(OpsGpuBf16ActsReaders, ProductsReadBf16AsTheyReadItsFp32Value) {
    REQUIRE_GPU();
    const auto [N, IC, OC, with_bias] = GetParam();
    ref::Rng rng(13);
    const FVec x = rounded(randn(rng, size_t(N) * IC)), W = randn(rng, size_t(OC) * IC, 0.2);
    const FVec bias = randn(rng, OC), dout = randn(rng, size_t(N) * OC);
    const FVec dinp0 = randn(rng, x.size()), dW0 = randn(rng, W.size()), db0 = randn(rng, OC);
    Dev gx(x, be()), gW(W, be()), gb(bias, be()), gdout(dout, be());
    Dev16 x16(x);
    const float* b = with_bias ? gb.get() : nullptr;
    // forward
    Dev out(size_t(N) * OC, be()), out16(size_t(N) * OC, be());
    be().matmul_forward(out.get(), gx.get(), gW.get(), b, N, IC, OC);
    be().matmul_forward_bf16(out16.get(), x16.get(), gW.get(), b, N, IC, OC);
    expect_same_bits(out16.host(), out.host(), "matmul_forward");
    // the bf16 band around the CPU's fp32 product (a silent fp32 path on W would be closer,
    // but the inputs are bf16 here, so only the weight's rounding shows: checked by the above)
    FVec cout(size_t(N) * OC);
    cpu().matmul_forward(cout.data(), x.data(), W.data(), with_bias ? bias.data() : nullptr, N, IC,
                         OC);
    EXPECT_LT(rel_err(out16.host(), cout), 1e-2);
    // backward, accumulating into pre-filled gradients; with and without dinp
    for (bool with_dinp : {true, false}) {
        Dev dinp(dinp0, be()), dW(dW0, be()), db(db0, be());
        Dev dinp16(dinp0, be()), dW16(dW0, be()), db16(db0, be());
        be().matmul_backward(with_dinp ? dinp.get() : nullptr, dW.get(),
                             with_bias ? db.get() : nullptr, gdout.get(), gx.get(), gW.get(), N,
                             IC, OC);
        be().matmul_backward_bf16(with_dinp ? dinp16.get() : nullptr, dW16.get(),
                                  with_bias ? db16.get() : nullptr, gdout.get(), x16.get(),
                                  gW.get(), N, IC, OC);
        expect_same_bits(dW16.host(), dW.host(), "matmul_backward dW");
        expect_same_bits(dinp16.host(), dinp.host(), "matmul_backward dinp");
        expect_same_bits(db16.host(), db.host(), "matmul_backward dbias");
        if (with_dinp) {
            EXPECT_GT(rel_err(dinp16.host(), dinp0), 1e-3) << "dinp was not added to";
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, OpsGpuBf16ActsReaders,
                         ::testing::Values(Product{37, 96, 240, true},
                                           Product{64, 128, 1003, false},
                                           Product{129, 64, 48, true}),
                         [](const auto& info) {
                             const Product& p = info.param;
                             char name[64];
                             std::snprintf(name, sizeof name, "N%d_IC%d_OC%d%s", p.N, p.IC, p.OC,
                                           p.bias ? "_bias" : "");
                             return std::string(name);
                         });

// The MLP's first product and its activation, pre-activation and activation both stored in
// bf16. With the activation kernel (CTX_MLP_GELU=kernel, and every activation but GELU's tanh
// form by default): pre is the fp32 product (matmul_forward_bf16's bits) rounded, out its
// activation rounded (activation_forward_bf16 / swiglu_forward_bf16 of that fp32 product: the
// same bits). GELU (tanh) by default comes from cuBLASLt's epilogue, which rounds its own fp32
// values: both within one bf16 step of those (a product of another algorithm may sum in another
// order, and the epilogue's tanh is its own). Either way out is within a rounding of the
// fp32-storage op's (which may take GELU from cuBLASLt's epilogue).
TEST(OpsGpuBf16Acts, ProductWithActivation) {
    REQUIRE_GPU();
    const int N = 48, IC = 64, OC = 256;
    ref::Rng rng(14);
    const FVec x = rounded(randn(rng, size_t(N) * IC)), W = randn(rng, size_t(OC) * IC, 0.2);
    const FVec bias = randn(rng, OC);
    Dev gx(x, be()), gW(W, be()), gb(bias, be());
    Dev16 x16(x);
    const std::unique_ptr<ctx::Backend> kernel = make_bf16_backend_with("CTX_MLP_GELU", "kernel");
    for (ctx::Backend* b : {kernel.get(), &be()})
        for (Activation act :
             {Activation::GeluTanh, Activation::GeluErf, Activation::Relu, Activation::SwiGLU}) {
            const bool epilogue = b == &be() && act == Activation::GeluTanh;
            SCOPED_TRACE(testing::Message() << int(act) << (epilogue ? " epilogue" : " kernel"));
            const int width = act == Activation::SwiGLU ? OC / 2 : OC;  // out's columns
            Dev pre(size_t(N) * OC, be()), out(size_t(N) * width, be()), p(size_t(N) * OC, be());
            Dev16 pre16(size_t(N) * OC), out16(size_t(N) * width), again(size_t(N) * width);
            be().matmul_activation_forward(pre.get(), out.get(), gx.get(), gW.get(), gb.get(), N,
                                           IC, OC, act);
            b->matmul_activation_forward_bf16(pre16.get(), out16.get(), x16.get(), gW.get(),
                                              gb.get(), N, IC, OC, act);
            be().matmul_forward_bf16(p.get(), x16.get(), gW.get(), gb.get(), N, IC, OC);
            if (act == Activation::SwiGLU)
                be().swiglu_forward_bf16(again.get(), p.get(), N, OC / 2);
            else
                be().activation_forward_bf16(again.get(), p.get(), size_t(N) * OC, act);
            if (epilogue) {
                expect_within_bf16_step(pre16.host(), p.host(), "pre: the fp32 product, rounded");
                expect_within_bf16_step(out16.host(), again.host(),
                                        "out: the activation of the fp32 product, rounded");
            } else {
                expect_same_bits(pre16.host(), rounded(p.host()),
                                 "pre = the fp32 product, rounded");
                expect_same_bits(out16.host(), again.host(),
                                 "out = activation of the fp32 product");
            }
            expect_within_bf16_step(pre16.host(), pre.host(), "pre against the fp32-storage op");
            expect_within_bf16_step(out16.host(), out.host(), "out against the fp32-storage op");
        }
    Dev16 a(64), b(64);
    expect_error(
        [&] {
            be().matmul_activation_forward_bf16(a.get(), b.get(), x16.get(), gW.get(), nullptr, 1,
                                                IC, 7, Activation::SwiGLU);
        },
        {"matmul_activation_forward_bf16", "even"});
}

// The head fused with its loss, reading the final norm in bf16: the same bits as from fp32.
TEST(OpsGpuBf16Acts, HeadLossReadsBf16Rows) {
    REQUIRE_GPU();
    const int N = 37, C = 64, V = 211;
    ref::Rng rng(15);
    const FVec x = rounded(randn(rng, size_t(N) * C)), W = randn(rng, size_t(V) * C, 0.3);
    std::vector<int32_t> targets(N);
    FVec mask(N);
    for (int n = 0; n < N; n++) {
        targets[size_t(n)] = (n * 29 + 5) % V;
        mask[size_t(n)] = n % 7 == 3 ? 0.0f : 1.0f;
    }
    const FVec dinp0 = randn(rng, x.size()), dW0 = randn(rng, W.size());
    Dev gx(x, be()), gW(W, be()), gmask(mask, be());
    Dev16 x16(x);
    const size_t scratch = be().lm_head_scratch_floats(N, V);
    Dev s1(scratch, be()), s2(scratch, be());
    Dev l1(N, be()), l2(N, be()), dinp1(dinp0, be()), dinp2(dinp0, be()), dW1(dW0, be()),
        dW2(dW0, be());
    be().lm_head_loss(l1.get(), dinp1.get(), dW1.get(), s1.get(), gx.get(), gW.get(),
                      targets.data(), gmask.get(), N, C, V, 0.5f);
    be().lm_head_loss_bf16(l2.get(), dinp2.get(), dW2.get(), s2.get(), x16.get(), gW.get(),
                           targets.data(), gmask.get(), N, C, V, 0.5f);
    expect_same_bits(l2.host(), l1.host(), "losses");
    expect_same_bits(dinp2.host(), dinp1.host(), "dinp");
    expect_same_bits(dW2.host(), dW1.host(), "dW");
    // the CPU's fp32 head and loss on the same rows: within the bf16 band (W is rounded)
    FVec logits(size_t(N) * V), closs(N);
    cpu().matmul_forward(logits.data(), x.data(), W.data(), nullptr, N, C, V);
    cpu().crossentropy_forward(closs.data(), logits.data(), targets.data(), mask.data(), N, V);
    EXPECT_LT(rel_err(l2.host(), closs), 1e-2);
}

// The attention output in bf16 (flash mode on the tensor-core kernels): the forward writes the
// bits of its fp32 out rounded, with the same lse; the backward reading it gives the bits of the
// fp32-out backward given the rounded values (its rowsum(dout * out) reads those). Past one
// 128-query block, with and without a window; ALiBi slopes learned (their gradient too).
TEST(OpsGpuBf16Acts, AttentionOutputInBf16) {
    REQUIRE_GPU();
    using ctx::AttentionMode;
    const int B = 2, T = 150, C = 128, H = 2;  // head dim 64
    ASSERT_TRUE(be().attention_out_bf16(AttentionMode::Flash));
    ASSERT_FALSE(be().attention_out_bf16(AttentionMode::Materialised));
    ASSERT_FALSE(gpu().attention_out_bf16(AttentionMode::Flash));
    ref::Rng rng(21);
    const FVec qkv = randn(rng, size_t(B) * T * 3 * C), dout = randn(rng, size_t(B) * T * C);
    const FVec slopes = {0.25f, 0.0625f};
    FVec pos(size_t(B) * T);
    for (int i = 0; i < B * T; i++) pos[size_t(i)] = float(i % T) * 1.5f;
    const size_t saved = be().attention_saved_floats(AttentionMode::Flash, B, T, C, H);
    const size_t lse = ctx::attention_saved_floats(AttentionMode::Flash, B, T, H);
    const size_t scratch = be().attention_scratch_floats(B, T, C, H, AttentionMode::Flash);
    for (int window : {0, 40}) {
        SCOPED_TRACE(window);
        Dev gqkv(qkv, be()), gpos(pos, be()), gdout(dout, be()), s1(saved, be()), s2(saved, be());
        Dev out1(size_t(B) * T * C, be()), a1(slopes, be()), a2(slopes, be());
        Dev da1(FVec(H, 0.0f), be()), da2(FVec(H, 0.0f), be());
        Dev16 out2(size_t(B) * T * C);
        auto options = [&](Dev& a, Dev& da) {
            ctx::AttentionOptions o;
            o.mode = AttentionMode::Flash;
            o.window = window;
            o.bias.kind = ctx::BiasKind::Linear;
            o.bias.a = a.get();
            o.bias.da = da.get();
            o.dqkv_store = ctx::GradStore::Overwrite;
            return o;
        };
        const ctx::AttentionOptions o1 = options(a1, da1), o2 = options(a2, da2);
        be().attention_forward(out1.get(), s1.get(), gqkv.get(), gpos.get(), B, T, C, H, o1);
        be().attention_forward_bf16(out2.get(), s2.get(), gqkv.get(), gpos.get(), B, T, C, H, o2);
        const FVec want = rounded(out1.host());
        expect_same_bits(out2.host(), want, "out");
        expect_same_bits(s2.host(lse), s1.host(lse), "lse");
        Dev out1r(want, be()), d1(qkv.size(), be()), d2(qkv.size(), be());
        Dev sc1(scratch, be()), sc2(scratch, be());
        be().attention_backward(d1.get(), sc1.get(), gdout.get(), gqkv.get(), s1.get(), out1r.get(),
                                gpos.get(), B, T, C, H, o1);
        be().attention_backward_bf16(d2.get(), sc2.get(), gdout.get(), gqkv.get(), s2.get(),
                                     out2.get(), gpos.get(), B, T, C, H, o2);
        expect_same_bits(d2.host(), d1.host(), "dqkv");
        expect_same_bits(da2.host(), da1.host(), "da");
        FVec d = d1.host();
        EXPECT_GT(*std::max_element(d.begin(), d.end()), 0.1f) << "a gradient to compare";
    }
    // only the bf16 flash kernels write or read it in bf16
    Dev buf(size_t(B) * T * 3 * C, be());
    Dev16 out16(size_t(B) * T * C);
    ctx::AttentionOptions m;
    m.mode = AttentionMode::Materialised;
    expect_error(
        [&] {
            be().attention_forward_bf16(out16.get(), buf.get(), buf.get(), buf.get(), B, T, C, H,
                                        m);
        },
        {"attention_forward_bf16", "flash mode only", "materialised"});
    ctx::AttentionOptions f;
    f.mode = AttentionMode::Flash;
    Dev16 out16f(size_t(B) * T * C, gpu());
    Dev fbuf(size_t(B) * T * 3 * C, gpu());
    expect_error(
        [&] {
            gpu().attention_backward_bf16(fbuf.get(), fbuf.get(), fbuf.get(), fbuf.get(),
                                          fbuf.get(), out16f.get(), fbuf.get(), B, T, C, H, f);
        },
        {"attention_backward_bf16", "does not store activations in bf16"});
}

}  // namespace
