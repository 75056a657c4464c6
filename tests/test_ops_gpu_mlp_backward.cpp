// activation_matmul_backward on the CUDA backend (backend.h): the MLP's activation backward
// and its first product's backward in one op. In bf16 precision the activation kernel writes
// bf16(dpre) in the products' padded rows and the bias gradient's column sums
// (launch_activation_backward_bf16), so no fp32 dpre is written or read back (the dpre scratch
// is left as it was: checked, so a fallback to the two ops would fail).
//
// References:
//   - the same backend's two ops (activation_backward / swiglu_backward with Overwrite into an
//     fp32 dpre, then matmul_backward or matmul_backward_bf16): the element formulas are one
//     device function (cuda_activation.cuh) and the column sums keep the chunks and order of
//     the rounding pass, so dinp, dW and dbias must be equal bit for bit;
//   - the CPU backend: dpre from its activation backward, then its matmul_backward on the
//     bf16-rounded dpre, inp and W (the products of bf16 values are exact in fp32, so only the
//     summation order differs, plus the rare dpre entry whose rounding a last-bit difference of
//     the two backends' fp32 activation gradients moves); dbias from the CPU's fp32 dpre;
//   - fp32 precision: the default composition, within fp32 summation error of the CPU.
// With bf16 storage pre is bf16 too (as matmul_activation_forward_bf16 stores it): the two ops
// and the CPU are then given its rounded values. Gradients are pre-filled: dW and dbias
// accumulate, dinp as GradStore says (Overwrite into NaN).
//
// Skipped without a CUDA device; under engine/backend/cuda/emu/run_emulated_tests.py the kernels
// and cuBLAS run on the CPU emulation of CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <vector>

#include "backend/op_common.h"
#include "backend/operand.h"
#include "gpu_test_support.h"

namespace {

using ctx::Activation;
using ctx::GradStore;

#define REQUIRE_GPU()                                                                    \
    do {                                                                                 \
        if (!have_gpu())                                                                 \
            GTEST_SKIP() << "no CUDA device visible: the MLP backward tests need a GPU"; \
    } while (0)

struct MlpCase {
    int N, IC, OC;  // OC: the width of pre (2F for SwiGLU)
    Activation act;
    bool bias, dinp;
    GradStore store;
};
void PrintTo(const MlpCase& c, std::ostream* os) {
    const char* names[] = {"gelu_tanh", "gelu_erf", "swiglu", "relu"};
    *os << c.N << "x" << c.IC << "x" << c.OC << " " << names[int(c.act)] << (c.bias ? " bias" : "")
        << (c.dinp ? " dinp" : "") << (c.store == GradStore::Overwrite ? " overwrite" : "");
}

size_t dact_size(const MlpCase& c) {
    return size_t(c.N) * (c.act == Activation::SwiGLU ? c.OC / 2 : c.OC);
}

// The CPU's dpre (N, OC), fp32: the reference's first half.
FVec cpu_dpre(const MlpCase& c, const FVec& pre, const FVec& dact) {
    FVec dpre(size_t(c.N) * c.OC, 0.0f);
    if (c.act == Activation::SwiGLU)
        cpu().swiglu_backward(dpre.data(), pre.data(), dact.data(), c.N, c.OC / 2,
                              GradStore::Overwrite);
    else
        cpu().activation_backward(dpre.data(), pre.data(), dact.data(), dpre.size(), c.act,
                                  GradStore::Overwrite);
    return dpre;
}

struct Grads {
    FVec dinp, dW, dbias, dpre;
};

constexpr float kUntouched = 12345.0f;  // the dpre scratch's contents before the op

class OpsGpuMlpBackward : public ::testing::TestWithParam<MlpCase> {
protected:
    void SetUp() override {
        const MlpCase& c = GetParam();
        ref::Rng rng(7 + c.N + 3 * c.IC + 5 * c.OC + 11 * int(c.act));
        pre = randn(rng, size_t(c.N) * c.OC, 2.0);
        dact = randn(rng, dact_size(c));
        inp = randn(rng, size_t(c.N) * c.IC);
        W = randn(rng, size_t(c.OC) * c.IC, 0.2);
        dinp0 = c.store == GradStore::Overwrite
                    ? FVec(inp.size(), std::numeric_limits<float>::quiet_NaN())
                    : randn(rng, inp.size());
        dW0 = randn(rng, W.size());
        dbias0 = randn(rng, size_t(c.OC));
    }

    // Runs `op` on `be` with device copies of the case's data (pre's values: pre_values), the
    // dpre scratch filled with kUntouched.
    template <class Op>
    Grads run(ctx::Backend& be, const FVec& pre_values, Op&& op) {
        const MlpCase& c = GetParam();
        Dev gpre(pre_values, be), gdact(dact, be), gW(W, be), gdinp(dinp0, be), gdW(dW0, be),
            gdb(dbias0, be), gdpre(FVec(pre.size(), kUntouched), be);
        op(c.dinp ? gdinp.get() : nullptr, gdW.get(), c.bias ? gdb.get() : nullptr, gdpre.get(),
           gdact.get(), gpre.get(), gW.get());
        return {gdinp.host(), gdW.host(), gdb.host(), gdpre.host()};
    }

    FVec pre, dact, inp, W, dinp0, dW0, dbias0;
};

// The fused op against the same backend's two ops, then against the CPU.
TEST_P(OpsGpuMlpBackward, Bf16MatchesTheTwoOpsAndTheCpu) {
    REQUIRE_GPU();
    const MlpCase& c = GetParam();
    ctx::Backend& be = gpu_bf16();
    const FVec inp_r = rounded(inp);

    for (bool storage16 : {true, false}) {
        SCOPED_TRACE(storage16 ? "bf16 storage" : "fp32 storage");
        // bf16 storage keeps pre and inp rounded (matmul_activation_forward_bf16 stores pre so)
        const FVec pre_v = storage16 ? rounded(pre) : pre;
        Dev16 g16(inp_r, be), p16(rounded(pre), be);  // p16 read only with bf16 storage
        Dev g32(inp, be);
        const ctx::Operand x =
            storage16 ? ctx::Operand::in_bf16(g16.get()) : ctx::Operand(g32.get());
        const Grads fused =
            run(be, pre_v,
                [&](float* dinp, float* dW, float* db, float* dpre, const float* dact_,
                    const float* pre_, const float* W_) {
                    const ctx::Operand p = storage16 ? ctx::Operand::in_bf16(p16.get())
                                                     : ctx::Operand(const_cast<float*>(pre_));
                    ctx::activation_matmul_backward(be, dinp, dW, db, dpre, dact_, p, x, W_, c.N,
                                                    c.IC, c.OC, c.act, c.store);
                });
        const Grads two =
            run(be, pre_v,
                [&](float* dinp, float* dW, float* db, float* dpre, const float* dact_,
                    const float* pre_, const float* W_) {
                    ctx::activation_backward_rows(be, dpre, dact_, pre_, c.N, c.OC, c.act);
                    ctx::matmul_backward(be, dinp, dW, db, dpre, x, W_, c.N, c.IC, c.OC, c.store);
                });
        EXPECT_EQ(fused.dpre, FVec(pre.size(), kUntouched))
            << "the fused bf16 path writes no fp32 dpre (did it fall back to the two ops?)";
        if (c.dinp) expect_same_bits(fused.dinp, two.dinp, "dinp");
        expect_same_bits(fused.dW, two.dW, "dW");
        if (c.bias) expect_same_bits(fused.dbias, two.dbias, "dbias");
        if (!c.dinp) {
            expect_same_bits(fused.dinp, dinp0, "dinp untouched (null)");
        }

        // the CPU: products of the rounded operands, the bias gradient from the fp32 dpre
        const FVec dpre = cpu_dpre(c, pre_v, dact), dpre_r = rounded(dpre), W_r = rounded(W);
        FVec dinp = c.store == GradStore::Overwrite ? FVec(inp.size(), 0.0f) : dinp0, dW = dW0,
             dbias = dbias0, scratch = dW0;
        cpu().matmul_backward(c.dinp ? dinp.data() : nullptr, dW.data(), nullptr, dpre_r.data(),
                              inp_r.data(), W_r.data(), c.N, c.IC, c.OC);
        cpu().matmul_backward(nullptr, scratch.data(), dbias.data(), dpre.data(), inp.data(),
                              W.data(), c.N, c.IC, c.OC);
        if (c.dinp) {
            EXPECT_LT(rel_err(fused.dinp, dinp), 2e-3) << "dinp";
        }
        EXPECT_LT(rel_err(fused.dW, dW), 2e-3) << "dW";
        if (c.bias) {
            EXPECT_LT(rel_err(fused.dbias, dbias), 1e-5) << "dbias";
        }
    }
}

// fp32 precision runs the default (the two ops): within fp32 summation error of
// the CPU, and dpre written.
TEST_P(OpsGpuMlpBackward, Fp32MatchesTheCpu) {
    REQUIRE_GPU();
    const MlpCase& c = GetParam();
    Dev gx(inp);
    const Grads got =
        run(gpu(), pre,
            [&](float* dinp, float* dW, float* db, float* dpre, const float* dact_,
                const float* pre_, const float* W_) {
                gpu().activation_matmul_backward(dinp, dW, db, dpre, dact_, pre_, gx.get(), W_, c.N,
                                                 c.IC, c.OC, c.act, c.store);
            });
    FVec dinp = c.store == GradStore::Overwrite ? FVec(inp.size(), 0.0f) : dinp0, dW = dW0,
         dbias = dbias0, dpre(pre.size());
    cpu().activation_matmul_backward(
        c.dinp ? dinp.data() : nullptr, dW.data(), c.bias ? dbias.data() : nullptr, dpre.data(),
        dact.data(), pre.data(), inp.data(), W.data(), c.N, c.IC, c.OC, c.act, c.store);
    EXPECT_LT(rel_err(got.dpre, dpre), 1e-5) << "dpre";
    if (c.dinp) {
        EXPECT_LT(rel_err(got.dinp, dinp), 1e-5) << "dinp";
    }
    EXPECT_LT(rel_err(got.dW, dW), 1e-5) << "dW";
    EXPECT_LT(rel_err(got.dbias, dbias), 1e-5) << "dbias";
}

constexpr auto kOver = GradStore::Overwrite;
constexpr auto kAcc = GradStore::Accumulate;

INSTANTIATE_TEST_SUITE_P(
    Shapes, OpsGpuMlpBackward,
    ::testing::Values(
        // GPT-2's MLP in miniature: gelu_tanh, bias, dinp written
        MlpCase{70, 48, 96, Activation::GeluTanh, true, true, kOver},
        MlpCase{70, 48, 96, Activation::GeluTanh, true, true, kAcc},
        // odd widths (bf16 rows padded to a multiple of 8), many row chunks (N > 64 * 32)
        MlpCase{2100, 24, 37, Activation::GeluErf, true, true, kOver},
        MlpCase{33, 40, 21, Activation::Relu, true, false, kAcc},
        MlpCase{1, 16, 24, Activation::GeluTanh, false, true, kOver},
        MlpCase{9, 16, 24, Activation::GeluErf, false, false, kOver},  // dW alone
        MlpCase{0, 16, 24, Activation::GeluTanh, true, true, kOver},   // no rows: nothing
        // SwiGLU: pre = [gate | up], F odd (74 = 2 x 37), no bias as in Llama, and with one
        MlpCase{130, 40, 74, Activation::SwiGLU, false, true, kOver},
        MlpCase{130, 40, 74, Activation::SwiGLU, true, true, kAcc},
        MlpCase{2100, 16, 48, Activation::SwiGLU, true, false, kOver}));

TEST(OpsGpuMlpBackwardChecks, BadArgumentsAreRefused) {
    REQUIRE_GPU();
    for (ctx::Backend* be : {&gpu(), &gpu_bf16()}) {
        Dev a(64, *be), b(64, *be), w(64, *be), dw(64, *be), x(64, *be), d(64, *be);
        expect_error(
            [&] {
                be->activation_matmul_backward(d.get(), dw.get(), nullptr, a.get(), b.get(),
                                               w.get(), x.get(), w.get(), 2, 4, 7,
                                               Activation::SwiGLU);
            },
            {"activation_matmul_backward", "SwiGLU", "even"});
        expect_error(
            [&] {
                be->activation_matmul_backward(d.get(), dw.get(), nullptr, a.get(), a.get(),
                                               w.get(), x.get(), w.get(), 2, 4, 8,
                                               Activation::GeluTanh);
            },
            {"activation_matmul_backward", "dpre"});
    }
    Dev16 x16(64);
    Dev a(64, gpu_bf16()), b(64, gpu_bf16()), w(64, gpu_bf16()), dw(64, gpu_bf16());
    expect_error(
        [&] {
            gpu_bf16().activation_matmul_backward_bf16(nullptr, dw.get(), nullptr, nullptr, b.get(),
                                                       x16.get(), x16.get(), w.get(), 2, 4, 8,
                                                       Activation::Relu);
        },
        {"activation_matmul_backward_bf16", "dpre"});
    // the fp32 backend has no bf16 storage: the op refuses, naming itself
    expect_error(
        [&] {
            Dev16 y(64, gpu_bf16());
            gpu().activation_matmul_backward_bf16(nullptr, dw.get(), nullptr, a.get(), b.get(),
                                                  y.get(), y.get(), w.get(), 2, 4, 8,
                                                  Activation::Relu);
        },
        {"activation_matmul_backward_bf16", "bf16"});
}

}  // namespace
