// Backend::activation_matmul_backward on the CPU backend (its default: the activation's backward
// into dpre, then matmul_backward), against loops in double: dpre from central differences of
// the activations' forward formulas (tests/op_reference.h; ReLU exactly), then the chain rule's
// products dinp = dpre W, dW += dpre^T inp, dbias += colsum(dpre). SwiGLU's pre is [gate | up]
// per row. Argument errors name the op and what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "op_reference.h"

namespace {

using ctx::Activation;
using ctx::GradStore;
using FVec = std::vector<float>;

ctx::Backend& cpu() {
    static std::unique_ptr<ctx::Backend> be = ctx::make_cpu_backend(2);
    return *be;
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

double act_value(Activation act, double x) {
    switch (act) {
        case Activation::GeluTanh:
            return ref::gelu_tanh(x);
        case Activation::GeluErf:
            return ref::gelu_erf(x);
        default:
            return x > 0.0 ? x : 0.0;  // Relu
    }
}

double central(double (*f)(double), double x) { return (f(x + 1e-5) - f(x - 1e-5)) / 2e-5; }

// dpre (N, OC) in double from pre (N, OC) and dact (N, OC, or N, OC / 2 for SwiGLU).
ref::Vec reference_dpre(Activation act, const FVec& pre, const FVec& dact, int N, int OC) {
    ref::Vec d(size_t(N) * OC);
    if (act == Activation::SwiGLU) {
        const int F = OC / 2;
        for (int n = 0; n < N; n++)
            for (int f = 0; f < F; f++) {
                const double g = pre[size_t(n) * OC + f], u = pre[size_t(n) * OC + F + f];
                const double dy = dact[size_t(n) * F + f];
                d[size_t(n) * OC + f] = dy * u * central(silu, g);
                d[size_t(n) * OC + F + f] = dy * silu(g);
            }
        return d;
    }
    for (size_t i = 0; i < d.size(); i++) {
        const double x = pre[i];
        const double slope = act == Activation::Relu
                                 ? (x > 0.0 ? 1.0 : 0.0)
                                 : (act_value(act, x + 1e-5) - act_value(act, x - 1e-5)) / 2e-5;
        d[i] = slope * dact[i];
    }
    return d;
}

double rel_err(const FVec& got, const ref::Vec& want) {
    double err = 0, mag = 0;
    for (size_t i = 0; i < got.size(); i++) {
        if (std::isnan(got[i])) return INFINITY;
        err = std::max(err, std::fabs(got[i] - want[i]));
        mag = std::max(mag, std::fabs(want[i]));
    }
    return err / mag;
}

TEST(OpsCpuMlpBackward, MatchesTheChainRuleInDouble) {
    const int N = 37, IC = 19;
    ref::Rng rng(5);
    for (Activation act :
         {Activation::GeluTanh, Activation::GeluErf, Activation::Relu, Activation::SwiGLU}) {
        for (GradStore store : {GradStore::Overwrite, GradStore::Accumulate}) {
            SCOPED_TRACE(testing::Message()
                         << "activation " << int(act) << " store " << int(store));
            const int OC = act == Activation::SwiGLU ? 26 : 23;
            const int dact_w = act == Activation::SwiGLU ? OC / 2 : OC;
            const FVec pre = ref::to_float(rng.normals(size_t(N) * OC, 2.0));
            const FVec dact = ref::to_float(rng.normals(size_t(N) * dact_w));
            const FVec inp = ref::to_float(rng.normals(size_t(N) * IC));
            const FVec W = ref::to_float(rng.normals(size_t(OC) * IC, 0.3));
            const FVec dinp0 = store == GradStore::Overwrite
                                   ? FVec(inp.size(), std::numeric_limits<float>::quiet_NaN())
                                   : ref::to_float(rng.normals(inp.size()));
            const FVec dW0 = ref::to_float(rng.normals(W.size())),
                       db0 = ref::to_float(rng.normals(size_t(OC)));
            FVec dinp = dinp0, dW = dW0, db = db0, dpre(pre.size());
            cpu().activation_matmul_backward(dinp.data(), dW.data(), db.data(), dpre.data(),
                                             dact.data(), pre.data(), inp.data(), W.data(), N, IC,
                                             OC, act, store);

            const ref::Vec d = reference_dpre(act, pre, dact, N, OC);
            ref::Vec want_dinp(inp.size()), want_dW(W.size()), want_db(static_cast<size_t>(OC));
            for (size_t i = 0; i < want_dinp.size(); i++)
                want_dinp[i] = store == GradStore::Overwrite ? 0.0 : dinp0[i];
            for (size_t i = 0; i < want_dW.size(); i++) want_dW[i] = dW0[i];
            for (int o = 0; o < OC; o++) want_db[o] = db0[o];
            for (int n = 0; n < N; n++)
                for (int o = 0; o < OC; o++) {
                    const double g = d[size_t(n) * OC + o];
                    want_db[o] += g;
                    for (int i = 0; i < IC; i++) {
                        want_dinp[size_t(n) * IC + i] += g * W[size_t(o) * IC + i];
                        want_dW[size_t(o) * IC + i] += g * inp[size_t(n) * IC + i];
                    }
                }
            EXPECT_LT(rel_err(dpre, d), 1e-4) << "dpre";
            EXPECT_LT(rel_err(dinp, want_dinp), 1e-4) << "dinp";
            EXPECT_LT(rel_err(dW, want_dW), 1e-4) << "dW";
            EXPECT_LT(rel_err(db, want_db), 1e-4) << "dbias";
        }
    }
}

// Without dinp or dbias: dW alone, and the rest untouched.
TEST(OpsCpuMlpBackward, NullDinpAndBiasAreSkipped) {
    const int N = 5, IC = 3, OC = 4;
    const FVec pre(size_t(N) * OC, 1.5f), dact(pre.size(), 2.0f), inp(size_t(N) * IC, 1.0f),
        W(size_t(OC) * IC, 0.5f);
    FVec dW(W.size(), 0.0f), dpre(pre.size());
    cpu().activation_matmul_backward(nullptr, dW.data(), nullptr, dpre.data(), dact.data(),
                                     pre.data(), inp.data(), W.data(), N, IC, OC, Activation::Relu);
    for (float v : dpre) EXPECT_EQ(v, 2.0f);           // relu'(1.5) * 2
    for (float v : dW) EXPECT_EQ(v, 2.0f * float(N));  // sum over rows of dpre * inp
}

TEST(OpsCpuMlpBackward, BadArgumentsNameTheOp) {
    FVec a(64, 1.0f), b(64, 1.0f), w(64, 0.5f), dw(64), x(64, 1.0f);
    auto expect_error = [](auto&& f, std::initializer_list<const char*> parts) {
        try {
            f();
            ADD_FAILURE() << "expected a ctx::Error";
        } catch (const ctx::Error& e) {
            const std::string msg = e.what();
            for (const char* p : parts)
                EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
        }
    };
    expect_error(
        [&] {
            cpu().activation_matmul_backward(nullptr, dw.data(), nullptr, a.data(), b.data(),
                                             w.data(), x.data(), w.data(), 2, 4, 7,
                                             Activation::SwiGLU);
        },
        {"activation_matmul_backward", "SwiGLU", "even", "7"});
    expect_error(
        [&] {
            cpu().activation_matmul_backward(nullptr, dw.data(), nullptr, b.data(), b.data(),
                                             w.data(), x.data(), w.data(), 2, 4, 8,
                                             Activation::GeluTanh);
        },
        {"activation_matmul_backward", "dpre", "its own"});
    expect_error(
        [&] {
            cpu().activation_matmul_backward(nullptr, dw.data(), nullptr, a.data(), b.data(),
                                             w.data(), x.data(), w.data(), 2, 0, 8,
                                             Activation::GeluTanh);
        },
        {"activation_matmul_backward", "IC 0"});
    // no bf16 storage on the CPU: refused before anything is written
    const FVec a0 = a;
    expect_error(
        [&] {
            cpu().activation_matmul_backward_bf16(
                nullptr, dw.data(), nullptr, a.data(), b.data(),
                reinterpret_cast<const ctx::Bf16*>(w.data()),
                reinterpret_cast<const ctx::Bf16*>(x.data()), w.data(), 2, 4, 8, Activation::Relu);
        },
        {"activation_matmul_backward_bf16", "bf16"});
    EXPECT_EQ(a, a0) << "dpre written before the refusal";
    ctx::MlpBackwardBf16 m;
    m.dW_fc = m.dW_proj = dw.data();
    m.dact = m.dpre = a.data();
    m.dout = b.data();
    m.pre = m.act_out = m.inp = reinterpret_cast<const ctx::Bf16*>(x.data());
    m.W_fc = m.W_proj = w.data();
    m.N = 2;
    m.IC = m.OC = m.OP = 4;
    expect_error([&] { cpu().mlp_backward_bf16(m); }, {"mlp_backward_bf16", "bf16"});
    EXPECT_EQ(a, a0) << "dact written before the refusal";
}

}  // namespace
