// The CUDA backend's products with fused epilogues (cuda_blaslt.cpp): matmul_forward with a bias
// (cuBLASLt's BIAS epilogue) and matmul_activation_forward with GELU (tanh form: GELU_AUX_BIAS,
// the pre-activation kept in the aux matrix), fp32 and bf16; the unfused fallbacks (other
// activations, an output width the GELU aux refuses, CTX_CUBLASLT=0) give the same results.
// Reference: the CPU backend (fp32; for bf16 on bf16-rounded operands, so only the order of the
// fp32 sums differs). Under the CPU emulation (run_emulated_tests.py) the tests also count the
// emulated cublasLtMatmul calls, so a silent fallback to the unfused path fails there.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "gpu_test_support.h"

// Defined only by the emulation's runtime (engine/backend/cuda/emu/cublasLt.h).
extern "C" long emu_cublaslt_matmul_calls() __attribute__((weak));
extern "C" long emu_cublaslt_matmul_calls_bf16_out() __attribute__((weak));

namespace {

#define REQUIRE_GPU()                                                                        \
    do {                                                                                     \
        if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible: the cuBLASLt tests need one"; \
    } while (0)

long lt_calls() { return emu_cublaslt_matmul_calls ? emu_cublaslt_matmul_calls() : -1; }
long lt_calls_bf16_out() {
    return emu_cublaslt_matmul_calls_bf16_out ? emu_cublaslt_matmul_calls_bf16_out() : -1;
}

struct Shape {
    int N, IC, OC;
};
// an MLP-like product; odd sizes; an output width that is not a multiple of 8 (the GELU aux's
// leading dimension must be: that case runs unfused)
const Shape kShapes[] = {{64, 32, 128}, {33, 17, 24}, {5, 8, 1003}};

struct Data {
    FVec inp, W, bias;
};

Data make_data(const Shape& s, uint64_t seed) {
    ref::Rng rng(seed);
    return {randn(rng, size_t(s.N) * s.IC), randn(rng, size_t(s.OC) * s.IC, 0.3),
            randn(rng, size_t(s.OC), 0.5)};
}

// The op on `be` (fused where it can be): pre and out of matmul_activation_forward, or (act
// null) matmul_forward's out in both.
struct Out {
    FVec pre, out;
};

Out run_on(ctx::Backend& be, const Shape& s, const Data& d, bool with_bias,
           const ctx::Activation* act) {
    Dev inp(d.inp, be), W(d.W, be), bias(d.bias, be), pre(size_t(s.N) * s.OC, be),
        out(size_t(s.N) * s.OC, be);
    const float* b = with_bias ? bias.get() : nullptr;
    if (act == nullptr) {
        be.matmul_forward(out.get(), inp.get(), W.get(), b, s.N, s.IC, s.OC);
        const FVec o = out.host();
        return {o, o};
    }
    be.matmul_activation_forward(pre.get(), out.get(), inp.get(), W.get(), b, s.N, s.IC, s.OC,
                                 *act);
    return {pre.host(), out.host()};
}

Out run_cpu(const Shape& s, const Data& d, bool with_bias, const ctx::Activation* act) {
    FVec pre(size_t(s.N) * s.OC), out(pre.size());
    const float* b = with_bias ? d.bias.data() : nullptr;
    cpu().matmul_forward(pre.data(), d.inp.data(), d.W.data(), b, s.N, s.IC, s.OC);
    if (act == nullptr) return {pre, pre};
    cpu().activation_forward(out.data(), pre.data(), pre.size(), *act);
    return {pre, out};
}

// Whether this call should have gone through cuBLASLt (one product): GELU with its epilogue
// when the width allows it, else any product with a bias (the unfused activation's product too).
bool fused(const Shape& s, bool with_bias, const ctx::Activation* act) {
    const bool gelu = act != nullptr && *act == ctx::Activation::GeluTanh && s.OC % 8 == 0;
    return gelu || with_bias;
}

TEST(OpsGpuBlasLt, EpiloguesMatchTheCpuInBothPrecisions) {
    REQUIRE_GPU();
    const ctx::Activation gelu = ctx::Activation::GeluTanh, erf = ctx::Activation::GeluErf,
                          relu = ctx::Activation::Relu;
    const ctx::Activation* acts[] = {nullptr, &gelu, &erf, &relu};
    for (ctx::Backend* be : {&gpu(), &gpu_bf16()}) {
        const bool bf16 = be->precision() == ctx::Precision::Bf16;
        for (const Shape& s : kShapes)
            for (const ctx::Activation* act : acts)
                for (bool with_bias : {true, false}) {
                    SCOPED_TRACE(testing::Message()
                                 << (bf16 ? "bf16" : "fp32") << " N " << s.N << " IC " << s.IC
                                 << " OC " << s.OC << " act " << (act ? int(*act) : -1)
                                 << " bias " << with_bias);
                    Data d = make_data(s, 7 + s.OC);
                    Data ref = d;  // bf16: the CPU on the rounded operands, bias unrounded
                    if (bf16) {
                        ref.inp = rounded(d.inp);
                        ref.W = rounded(d.W);
                    }
                    const long before = lt_calls();
                    const Out got = run_on(*be, s, d, with_bias, act);
                    const Out want = run_cpu(s, ref, with_bias, act);
                    EXPECT_CLOSE(got.pre, want.pre, 2e-5);
                    EXPECT_CLOSE(got.out, want.out, 2e-5);
                    if (before >= 0) {
                        EXPECT_EQ(lt_calls() - before, long(fused(s, with_bias, act)));
                    }
                }
    }
}

TEST(OpsGpuBlasLt, TheUnfusedPathCanBeChosenAndBadValuesAreRefused) {
    REQUIRE_GPU();
    const Shape s{64, 32, 128};
    const Data d = make_data(s, 3);
    const ctx::Activation gelu = ctx::Activation::GeluTanh;
    setenv("CTX_CUBLASLT", "0", 1);
    std::unique_ptr<ctx::Backend> off = ctx::make_cuda_backend(0);
    unsetenv("CTX_CUBLASLT");
    EXPECT_EQ(off->name().find("cuBLASLt"), std::string::npos) << off->name();
    EXPECT_NE(gpu().name().find("cuBLASLt"), std::string::npos) << gpu().name();
    const long before = lt_calls();
    const Out unfused = run_on(*off, s, d, true, &gelu);
    if (before >= 0) {
        EXPECT_EQ(lt_calls(), before);
    }
    const Out fused_out = run_on(gpu(), s, d, true, &gelu);
    EXPECT_CLOSE(fused_out.pre, unfused.pre, 2e-5);
    EXPECT_CLOSE(fused_out.out, unfused.out, 2e-5);
    setenv("CTX_CUBLASLT", "yes", 1);
    expect_error([] { (void)ctx::make_cuda_backend(0); }, {"CTX_CUBLASLT", "yes"});
    unsetenv("CTX_CUBLASLT");
}

// matmul_residual_forward (a block's output projections with its residual add): out = residual
// + inp @ W^T (+ bias) as one product (cuBLASLt, C = the residual with beta 1) on the fp32 and
// bf16 backends, and from bf16 storage (matmul_residual_forward_bf16: the same bits as from the
// fp32 input, which it rounds the same way); against the CPU's default (matmul_forward, then
// add). With CTX_CUBLASLT=0 the unfused path (the output started as the residual plus the bias,
// the product added with beta 1) agrees. out aliasing the residual is refused.
TEST(OpsGpuBlasLt, ResidualAddedInTheProduct) {
    REQUIRE_GPU();
    auto made = [](const char* lt, ctx::Precision p) {
        setenv("CTX_CUBLASLT", lt, 1);
        std::unique_ptr<ctx::Backend> be = ctx::make_cuda_backend(0, p);
        unsetenv("CTX_CUBLASLT");
        return be;
    };
    const std::unique_ptr<ctx::Backend> off32 = made("0", ctx::Precision::Fp32),
                                        off16 = made("0", ctx::Precision::Bf16);
    for (ctx::Backend* be : {&gpu(), &gpu_bf16(), off32.get(), off16.get()}) {
        const bool bf16 = be->precision() == ctx::Precision::Bf16, lt = be == &gpu() ||
                                                                         be == &gpu_bf16();
        for (const Shape& s : kShapes)
            for (bool with_bias : {true, false}) {
                SCOPED_TRACE(testing::Message() << be->name() << " N " << s.N << " IC " << s.IC
                                                << " OC " << s.OC << " bias " << with_bias);
                const Data d = make_data(s, 11 + s.OC);
                ref::Rng rng(s.N * 3 + s.OC);
                const FVec residual = randn(rng, size_t(s.N) * s.OC, 2.0);
                const FVec rin = bf16 ? rounded(d.inp) : d.inp, rW = bf16 ? rounded(d.W) : d.W;
                FVec want(residual.size());
                cpu().matmul_residual_forward(want.data(), residual.data(), rin.data(),
                                              rW.data(), with_bias ? d.bias.data() : nullptr,
                                              s.N, s.IC, s.OC);
                Dev inp(d.inp, *be), W(d.W, *be), bias(d.bias, *be), res(residual, *be),
                    out(residual.size(), *be);
                const long before = lt_calls();
                be->matmul_residual_forward(out.get(), res.get(), inp.get(), W.get(),
                                            with_bias ? bias.get() : nullptr, s.N, s.IC, s.OC);
                if (before >= 0) {
                    EXPECT_EQ(lt_calls() - before, lt ? 1 : 0);
                }
                const FVec got = out.host();
                EXPECT_CLOSE(got, want, 2e-5);
                EXPECT_EQ(res.host(), residual) << "the residual was written";
                if (bf16 && be->bf16_activations()) {
                    Dev16 inp16(rounded(d.inp), *be);
                    Dev out16(residual.size(), *be);
                    be->matmul_residual_forward_bf16(out16.get(), res.get(), inp16.get(), W.get(),
                                                     with_bias ? bias.get() : nullptr, s.N, s.IC,
                                                     s.OC);
                    EXPECT_EQ(out16.host(), got) << "bf16 storage";
                }
            }
        Dev buf(64 * 128, *be), inp(64 * 32, *be), W(128 * 32, *be);
        expect_error([&] {
            be->matmul_residual_forward(buf.get(), buf.get(), inp.get(), W.get(), nullptr, 64, 32,
                                        128);
        }, {"matmul_residual_forward", "residual"});
    }
}

// bf16 activation storage's MLP product (matmul_activation_forward_bf16) with GELU (tanh): one
// cuBLASLt product whose epilogue writes pre and gelu(pre) in bf16 (bf16 D and aux, the fp32
// bias by CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE), within one bf16 step of the CPU's fp32 values on
// the rounded operands; a width the aux refuses (1003), CTX_MLP_GELU=kernel and CTX_CUBLASLT=0
// take the fp32 product and the activation kernel, as close. Under the emulation the bf16-output
// products are counted (a silent fallback fails), and an fp32 bias read as bf16 (the library's
// default type with a bf16 D) would be garbage.
TEST(OpsGpuBlasLt, GeluEpilogueWritesBf16Activations) {
    REQUIRE_GPU();
    // strict: a configuration cuBLASLt refuses on a GPU fails here instead of falling back
    const std::unique_ptr<ctx::Backend> strict = make_bf16_backend_with("CTX_CUBLASLT", "strict"),
                                        kernel = make_bf16_backend_with("CTX_MLP_GELU", "kernel"),
                                        off = make_bf16_backend_with("CTX_CUBLASLT", "0");
    const ctx::Activation gelu = ctx::Activation::GeluTanh;
    for (ctx::Backend* be : {strict.get(), kernel.get(), off.get()})
        for (const Shape& s : kShapes)
            for (bool with_bias : {true, false}) {
                SCOPED_TRACE(testing::Message() << be->name() << " N " << s.N << " IC " << s.IC
                                                << " OC " << s.OC << " bias " << with_bias);
                ASSERT_TRUE(be->bf16_activations());
                Data d = make_data(s, 5 + s.OC);
                d.inp = rounded(d.inp);
                Data ref = d;
                ref.W = rounded(d.W);
                const Out want = run_cpu(s, ref, with_bias, &gelu);
                Dev16 inp(d.inp, *be), pre(size_t(s.N) * s.OC, *be), out(size_t(s.N) * s.OC, *be);
                Dev W(d.W, *be), bias(d.bias, *be);
                const long before = lt_calls_bf16_out();
                be->matmul_activation_forward_bf16(pre.get(), out.get(), inp.get(), W.get(),
                                                   with_bias ? bias.get() : nullptr, s.N, s.IC,
                                                   s.OC, gelu);
                if (before >= 0) {
                    const bool epilogue = be == strict.get() && s.OC % 8 == 0;
                    EXPECT_EQ(lt_calls_bf16_out() - before, epilogue ? 1 : 0);
                }
                expect_within_bf16_step(pre.host(), want.pre, "pre");
                expect_within_bf16_step(out.host(), want.out, "out");
            }
    expect_error([] { (void)make_bf16_backend_with("CTX_MLP_GELU", "fused"); },
                 {"CTX_MLP_GELU", "fused", "epilogue", "kernel"});
    expect_error([] { (void)make_bf16_backend_with("CTX_CUBLASLT", "yes"); },
                 {"CTX_CUBLASLT", "yes", "strict"});
    // emulation only: a bf16 output cuBLASLt refuses runs the fp32 product and the activation
    // kernel (the bits of CTX_MLP_GELU=kernel), or is an error naming the op when strict
    if (lt_calls_bf16_out() < 0) return;
    setenv("CTX_EMU_LT_REFUSE", "bf16_out", 1);
    const std::unique_ptr<ctx::Backend> refusing = make_bf16_backend_with("CTX_CUBLASLT", "1"),
                                        refusing_strict =
                                            make_bf16_backend_with("CTX_CUBLASLT", "strict");
    const Shape s{64, 32, 128};
    const Data d = make_data(s, 3);
    auto gelu_bf16 = [&](ctx::Backend& be) {
        Dev16 inp(rounded(d.inp), be), pre(size_t(s.N) * s.OC, be), out(size_t(s.N) * s.OC, be);
        Dev W(d.W, be), bias(d.bias, be);
        be.matmul_activation_forward_bf16(pre.get(), out.get(), inp.get(), W.get(), bias.get(), s.N,
                                          s.IC, s.OC, gelu);
        return Out{pre.host(), out.host()};
    };
    const long before = lt_calls_bf16_out();
    const Out fell_back = gelu_bf16(*refusing), by_kernel = gelu_bf16(*kernel);
    EXPECT_EQ(lt_calls_bf16_out(), before);
    expect_same_bits(fell_back.pre, by_kernel.pre, "pre (fallback)");
    expect_same_bits(fell_back.out, by_kernel.out, "out (fallback)");
    expect_error([&] { (void)gelu_bf16(*refusing_strict); },
                 {"matmul_activation_forward_bf16", "no algorithm", "strict"});
    unsetenv("CTX_EMU_LT_REFUSE");
}

}  // namespace
