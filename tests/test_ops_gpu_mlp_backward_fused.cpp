// mlp_backward_bf16 on the CUDA backend (backend.h MlpBackwardBf16): the MLP's backward in one op
// with bf16 storage. For GELU (tanh) the product that makes the activation's gradient takes
// GELU's derivative in cuBLASLt's epilogue (DGELU_BGRAD, bf16 dpre for fc's products, fc's bias
// gradient in fp32), so no fp32 dact or dpre is written; elsewhere the op is the default's two
// ops (matmul_backward_bf16, then activation_matmul_backward_bf16).
//
// References:
//   - the same backend's two ops, called one after the other (the default's composition):
//     fc_proj's gradients (dW_proj, db_proj) come from the same rounded dout by the same calls,
//     so they must be equal bit for bit; the default composition (other activations,
//     CTX_MLP_GELU=kernel, a width the epilogue refuses) must equal them in every output;
//   - for the epilogue path, fc's gradients: within bf16 rounding of the two ops' (dpre's bf16
//     rounding is the products' input either way, but the epilogue's fp32 value and GELU's
//     derivative are computed by another code), and db_fc as close (the emulator sums the
//     unrounded dpre as the two ops do; NVIDIA does not say which the library sums);
//   - the CPU backend, in double-checked fp32, for the epilogue path's dpre formula: dinp
//     against the CPU's activation backward and products on the rounded operands.
// The epilogue cases run on a backend with CTX_CUBLASLT=strict, so a configuration cuBLASLt
// refuses on a GPU fails them (a ctx::Error naming it) instead of passing on the fallback; under
// the emulation the bf16-output products are counted too, and the fallback itself is checked by
// making the emulated heuristic refuse (CTX_EMU_LT_REFUSE). Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backend/operand.h"
#include "gpu_test_support.h"

extern "C" long emu_cublaslt_matmul_calls_bf16_out() __attribute__((weak));

namespace {

using ctx::Activation;
using ctx::GradStore;
using ctx::MlpBackwardBf16;

#define REQUIRE_GPU()                                                                          \
    do {                                                                                       \
        if (!have_gpu())                                                                       \
            GTEST_SKIP() << "no CUDA device visible: the fused MLP backward tests need a GPU"; \
    } while (0)

long bf16_out_calls() {
    return emu_cublaslt_matmul_calls_bf16_out ? emu_cublaslt_matmul_calls_bf16_out() : -1;
}

struct Case {
    int N, IC, OC, OP;  // OC: the width of pre (2F for SwiGLU)
    Activation act;
    bool bias;
    GradStore store;
};
void PrintTo(const Case& c, std::ostream* os) {
    const char* names[] = {"gelu_tanh", "gelu_erf", "swiglu", "relu"};
    *os << c.N << "x" << c.IC << "x" << c.OC << "x" << c.OP << " " << names[int(c.act)]
        << (c.bias ? " bias" : "") << (c.store == GradStore::Overwrite ? " overwrite" : "");
}

int act_width(const Case& c) { return c.act == Activation::SwiGLU ? c.OC / 2 : c.OC; }

// The op's inputs (bf16 storage: pre, act_out and inp bf16 values) and pre-filled gradients.
struct Inputs {
    FVec pre, act_out, inp, W_fc, W_proj, dout;
    FVec dinp0, dW_fc0, db_fc0, dW_proj0, db_proj0;
};

Inputs make_inputs(const Case& c, uint64_t seed) {
    ref::Rng rng(seed);
    const size_t OA = size_t(act_width(c));
    Inputs in;
    in.pre = rounded(randn(rng, size_t(c.N) * c.OC, 1.5));
    in.act_out = rounded(randn(rng, size_t(c.N) * OA));
    in.inp = rounded(randn(rng, size_t(c.N) * c.IC));
    in.W_fc = randn(rng, size_t(c.OC) * c.IC, 0.2);
    in.W_proj = randn(rng, size_t(c.OP) * OA, 0.2);
    in.dout = randn(rng, size_t(c.N) * c.OP);
    in.dinp0 = randn(rng, size_t(c.N) * c.IC, 0.1);
    in.dW_fc0 = randn(rng, in.W_fc.size(), 0.1);
    in.db_fc0 = randn(rng, size_t(c.OC), 0.1);
    in.dW_proj0 = randn(rng, in.W_proj.size(), 0.1);
    in.db_proj0 = randn(rng, size_t(c.OP), 0.1);
    return in;
}

struct Outputs {
    FVec dinp, dW_fc, db_fc, dW_proj, db_proj;
};

// The op on `be` (fused: one mlp_backward_bf16 call; else the two ops it composes).
Outputs run(ctx::Backend& be, const Case& c, const Inputs& in, bool fused) {
    const size_t OA = size_t(act_width(c));
    Dev16 pre(in.pre, be), act_out(in.act_out, be), inp(in.inp, be);
    Dev W_fc(in.W_fc, be), W_proj(in.W_proj, be), dout(in.dout, be);
    Dev dinp(in.dinp0, be), dW_fc(in.dW_fc0, be), db_fc(in.db_fc0, be), dW_proj(in.dW_proj0, be),
        db_proj(in.db_proj0, be);
    // the scratch starts as garbage: an op that reads it before writing fails
    Dev dact(FVec(size_t(c.N) * OA, 12345.0f), be), dpre(FVec(size_t(c.N) * c.OC, -777.0f), be);
    MlpBackwardBf16 m;
    m.dinp = dinp.get();
    m.dinp_store = c.store;
    m.dW_fc = dW_fc.get();
    m.db_fc = c.bias ? db_fc.get() : nullptr;
    m.dW_proj = dW_proj.get();
    m.db_proj = c.bias ? db_proj.get() : nullptr;
    m.dact = dact.get();
    m.dpre = dpre.get();
    m.dout = dout.get();
    m.pre = pre.get();
    m.act_out = act_out.get();
    m.inp = inp.get();
    m.W_fc = W_fc.get();
    m.W_proj = W_proj.get();
    m.N = c.N;
    m.IC = c.IC;
    m.OC = c.OC;
    m.OP = c.OP;
    m.act = c.act;
    if (fused) {
        be.mlp_backward_bf16(m);
    } else {
        be.matmul_backward_bf16(m.dact, m.dW_proj, m.db_proj, m.dout, m.act_out, m.W_proj, c.N,
                                int(OA), c.OP, GradStore::Overwrite);
        be.activation_matmul_backward_bf16(m.dinp, m.dW_fc, m.db_fc, m.dpre, m.dact, m.pre, m.inp,
                                           m.W_fc, c.N, c.IC, c.OC, c.act, c.store);
    }
    return {dinp.host(), dW_fc.host(), db_fc.host(), dW_proj.host(), db_proj.host()};
}

void expect_same(const Outputs& got, const Outputs& want) {
    expect_same_bits(got.dinp, want.dinp, "dinp");
    expect_same_bits(got.dW_fc, want.dW_fc, "dW_fc");
    expect_same_bits(got.db_fc, want.db_fc, "db_fc");
    expect_same_bits(got.dW_proj, want.dW_proj, "dW_proj");
    expect_same_bits(got.db_proj, want.db_proj, "db_proj");
}

// Whether the op takes the epilogue path on the default bf16 backend.
bool epilogue(const Case& c) { return c.act == Activation::GeluTanh && c.OC % 8 == 0; }

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
    const Case& c = info.param;
    const char* names[] = {"gelu_tanh", "gelu_erf", "swiglu", "relu"};
    return std::to_string(c.N) + "x" + std::to_string(c.IC) + "x" + std::to_string(c.OC) + "x" +
           std::to_string(c.OP) + "_" + names[int(c.act)] + (c.bias ? "_bias" : "") +
           (c.store == GradStore::Overwrite ? "_overwrite" : "");
}

class OpsGpuMlpBackwardFused : public ::testing::TestWithParam<Case> {};

// The default backend, except that a refused cuBLASLt configuration is an error.
ctx::Backend& strict() {
    static std::unique_ptr<ctx::Backend> be = make_bf16_backend_with("CTX_CUBLASLT", "strict");
    return *be;
}

TEST_P(OpsGpuMlpBackwardFused, MatchesTheTwoOps) {
    REQUIRE_GPU();
    const Case c = GetParam();
    const Inputs in = make_inputs(c, 31 + c.OC + c.OP);
    const Outputs two = run(strict(), c, in, false);
    const long before = bf16_out_calls();
    const Outputs got = run(strict(), c, in, true);
    if (before >= 0) {
        EXPECT_EQ(bf16_out_calls() - before, epilogue(c) ? 1 : 0) << "DGELU products";
    }
    if (!epilogue(c)) {
        expect_same(got, two);
        return;
    }
    // fc_proj's gradients: the same calls on the same rounded dout
    expect_same_bits(got.dW_proj, two.dW_proj, "dW_proj");
    expect_same_bits(got.db_proj, two.db_proj, "db_proj");
    // fc's: from dpre rounded to bf16 either way (an entry's rounding may move by one step)
    EXPECT_CLOSE(got.dinp, two.dinp, 2e-3);
    EXPECT_CLOSE(got.dW_fc, two.dW_fc, 2e-3);
    EXPECT_CLOSE(got.db_fc, two.db_fc, 2e-3);
    // the pre-filled gradients were added to (dinp as its store says)
    if (c.store == GradStore::Accumulate) {
        EXPECT_GT(rel_err(got.dinp, in.dinp0), 1e-2);
    }
}

// CTX_MLP_GELU=kernel: the two ops, bit for bit, and no DGELU product.
TEST_P(OpsGpuMlpBackwardFused, KernelPathIsTheTwoOps) {
    REQUIRE_GPU();
    const Case c = GetParam();
    const std::unique_ptr<ctx::Backend> kernel = make_bf16_backend_with("CTX_MLP_GELU", "kernel");
    const Inputs in = make_inputs(c, 7 + c.OC);
    const Outputs two = run(*kernel, c, in, false);
    const long before = bf16_out_calls();
    const Outputs got = run(*kernel, c, in, true);
    if (before >= 0) {
        EXPECT_EQ(bf16_out_calls(), before);
    }
    expect_same(got, two);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, OpsGpuMlpBackwardFused,
    ::testing::Values(Case{48, 32, 128, 32, Activation::GeluTanh, true, GradStore::Overwrite},
                      Case{33, 24, 40, 16, Activation::GeluTanh, true, GradStore::Accumulate},
                      Case{17, 16, 64, 24, Activation::GeluTanh, false, GradStore::Overwrite},
                      Case{12, 16, 32, 20, Activation::GeluTanh, true, GradStore::Accumulate},
                      Case{9, 8, 1003, 8, Activation::GeluTanh, true, GradStore::Overwrite},
                      Case{20, 16, 64, 16, Activation::SwiGLU, true, GradStore::Overwrite},
                      Case{20, 16, 48, 16, Activation::GeluErf, true, GradStore::Accumulate}),
    case_name);

// The epilogue path's fc gradients against the CPU: dpre = (bf16(dout) @ bf16(W_proj)) *
// gelu'(pre) from the CPU's ops, rounded to bf16, then its products on the rounded operands;
// db_fc from the unrounded dpre.
TEST(OpsGpuMlpBackwardFusedCpu, EpilogueMatchesTheCpu) {
    REQUIRE_GPU();
    const Case c{40, 24, 64, 32, Activation::GeluTanh, true, GradStore::Overwrite};
    const Inputs in = make_inputs(c, 99);
    const Outputs got = run(strict(), c, in, true);
    const FVec dout16 = rounded(in.dout), Wp16 = rounded(in.W_proj), Wf16 = rounded(in.W_fc);
    FVec dact(size_t(c.N) * c.OC, 0.0f), dpre(dact.size(), 0.0f), dWp(in.dW_proj0.size(), 0.0f);
    // dact (N, OC) = bf16(dout) (N, OP) @ bf16(W_proj) (OP, OC)
    cpu().matmul_backward(dact.data(), dWp.data(), nullptr, dout16.data(), in.act_out.data(),
                          Wp16.data(), c.N, c.OC, c.OP, GradStore::Overwrite);
    cpu().activation_backward(dpre.data(), in.pre.data(), dact.data(), dpre.size(), c.act,
                              GradStore::Overwrite);
    const FVec dpre16 = rounded(dpre);
    FVec dinp(in.dinp0.size(), 0.0f), dWf = in.dW_fc0, dbf = in.db_fc0;
    cpu().matmul_backward(dinp.data(), dWf.data(), nullptr, dpre16.data(), in.inp.data(),
                          Wf16.data(), c.N, c.IC, c.OC, GradStore::Overwrite);
    for (int n = 0; n < c.N; n++)
        for (int o = 0; o < c.OC; o++) dbf[o] += dpre[size_t(n) * c.OC + o];
    EXPECT_CLOSE(got.dinp, dinp, 2e-3);
    EXPECT_CLOSE(got.dW_fc, dWf, 2e-3);
    EXPECT_CLOSE(got.db_fc, dbf, 2e-3);
}

// Emulation only: where cuBLASLt offers no algorithm for the DGELU product, the op is the two
// ops bit for bit (after fc_proj's weight gradient, through its own dact), and with
// CTX_CUBLASLT=strict it is an error naming the op.
TEST(OpsGpuMlpBackwardFusedCpu, RefusedEpilogueFallsBackOrFailsWhenStrict) {
    REQUIRE_GPU();
    if (bf16_out_calls() < 0) GTEST_SKIP() << "needs the emulation's CTX_EMU_LT_REFUSE";
    const Case c{24, 16, 64, 16, Activation::GeluTanh, true, GradStore::Accumulate};
    const Inputs in = make_inputs(c, 5);
    setenv("CTX_EMU_LT_REFUSE", "dgelu", 1);
    const std::unique_ptr<ctx::Backend> be = make_bf16_backend_with("CTX_CUBLASLT", "1"),
                                        st = make_bf16_backend_with("CTX_CUBLASLT", "strict");
    const Outputs two = run(*be, c, in, false);
    const long before = bf16_out_calls();
    const Outputs got = run(*be, c, in, true);
    EXPECT_EQ(bf16_out_calls(), before);
    expect_same(got, two);
    expect_error([&] { (void)run(*st, c, in, true); },
                 {"mlp_backward_bf16", "no algorithm", "strict"});
    unsetenv("CTX_EMU_LT_REFUSE");
}

}  // namespace
