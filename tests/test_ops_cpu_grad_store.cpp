// GradStore (backend.h): the backward ops that take one write their input gradient over the
// buffer (Overwrite) instead of adding to it (Accumulate, the convention). Checked on the CPU
// backend: Overwrite into a buffer of NaNs gives what Accumulate gives into zeros (so the old
// contents are neither read nor kept: no NaN survives; the values agree to 1e-6 of the largest,
// not always bit for bit, since the compiler may fuse d + g * dy into one rounding where it
// accumulates), Accumulate still adds to what is there, and the parameter gradients (dW, dbias)
// accumulate in both modes. matmul_backward's dinp is also held to naive double loops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace {

using ctx::Activation;
using ctx::GradStore;
using FVec = std::vector<float>;

ctx::Backend& cpu() {
    static std::unique_ptr<ctx::Backend> be = ctx::make_cpu_backend(2);
    return *be;
}

FVec wave(size_t n, float scale, float phase) {
    FVec v(n);
    for (size_t i = 0; i < n; i++) v[i] = scale * std::sin(0.37f * float(i) + phase);
    return v;
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();

bool same_bits(const FVec& a, const FVec& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// max |got - want| / max |want| (NaN in got: infinity)
double rel_err(const FVec& got, const FVec& want) {
    double err = 0, mag = 0;
    for (size_t i = 0; i < got.size(); i++) {
        if (std::isnan(got[i])) return INFINITY;
        err = std::max(err, std::fabs(double(got[i]) - double(want[i])));
        mag = std::max(mag, std::fabs(double(want[i])));
    }
    return err / mag;
}

TEST(OpsCpuGradStore, MatmulBackwardWritesDinpAndAccumulatesParameters) {
    const int N = 37, IC = 48, OC = 29;
    const FVec dout = wave(size_t(N) * OC, 1.0f, 0.1f), inp = wave(size_t(N) * IC, 0.8f, 0.7f);
    const FVec W = wave(size_t(OC) * IC, 0.5f, 1.3f);
    const FVec dW0 = wave(W.size(), 0.2f, 2.0f), db0 = wave(OC, 0.3f, 2.5f);
    const FVec pre = wave(size_t(N) * IC, 0.4f, 3.0f);  // what dinp held before

    FVec acc = pre, dW_a = dW0, db_a = db0;
    cpu().matmul_backward(acc.data(), dW_a.data(), db_a.data(), dout.data(), inp.data(), W.data(),
                          N, IC, OC);
    FVec zero(acc.size(), 0.0f), dW_z = dW0, db_z = db0;
    cpu().matmul_backward(zero.data(), dW_z.data(), db_z.data(), dout.data(), inp.data(),
                          W.data(), N, IC, OC, GradStore::Accumulate);
    FVec nan(acc.size(), kNaN), dW_w = dW0, db_w = db0;
    cpu().matmul_backward(nan.data(), dW_w.data(), db_w.data(), dout.data(), inp.data(), W.data(),
                          N, IC, OC, GradStore::Overwrite);
    EXPECT_LT(rel_err(nan, zero), 1e-6) << "Overwrite differs from Accumulate into zeros";
    EXPECT_TRUE(same_bits(dW_w, dW_z)) << "dW must accumulate in both modes";
    EXPECT_TRUE(same_bits(db_w, db_z)) << "dbias must accumulate in both modes";
    double err = 0, err_acc = 0, dW_moved = 0;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
            double s = 0;
            for (int o = 0; o < OC; o++)
                s += double(dout[size_t(n) * OC + o]) * double(W[size_t(o) * IC + i]);
            const size_t k = size_t(n) * IC + i;
            err = std::max(err, std::fabs(nan[k] - s));
            err_acc = std::max(err_acc, std::fabs(acc[k] - (s + pre[k])));
        }
    for (size_t k = 0; k < dW0.size(); k++)
        dW_moved = std::max(dW_moved, double(std::fabs(dW_w[k] - dW0[k])));
    EXPECT_LT(err, 1e-5);
    EXPECT_LT(err_acc, 1e-5) << "Accumulate (the default) must add to what dinp held";
    EXPECT_GT(dW_moved, 1e-3);
}

TEST(OpsCpuGradStore, ActivationBackwardWrites) {
    const size_t n = 1003;
    const FVec x = wave(n, 3.0f, 0.2f), dout = wave(n, 1.0f, 0.9f), pre = wave(n, 0.5f, 1.7f);
    for (Activation act : {Activation::GeluTanh, Activation::GeluErf, Activation::Relu}) {
        FVec zero(n, 0.0f), nan(n, kNaN), acc = pre;
        cpu().activation_backward(zero.data(), x.data(), dout.data(), n, act);
        cpu().activation_backward(nan.data(), x.data(), dout.data(), n, act, GradStore::Overwrite);
        cpu().activation_backward(acc.data(), x.data(), dout.data(), n, act);
        EXPECT_LT(rel_err(nan, zero), 1e-6) << "activation " << int(act);
        FVec want(n);
        for (size_t i = 0; i < n; i++) want[i] = pre[i] + zero[i];
        EXPECT_LT(rel_err(acc, want), 1e-6) << "activation " << int(act);
    }
}

TEST(OpsCpuGradStore, SwigluBackwardWrites) {
    const int N = 7, F = 33;
    const FVec gu = wave(size_t(N) * 2 * F, 2.0f, 0.4f), dout = wave(size_t(N) * F, 1.0f, 1.1f);
    const FVec pre = wave(gu.size(), 0.5f, 2.2f);
    FVec zero(gu.size(), 0.0f), nan(gu.size(), kNaN), acc = pre;
    cpu().swiglu_backward(zero.data(), gu.data(), dout.data(), N, F);
    cpu().swiglu_backward(nan.data(), gu.data(), dout.data(), N, F, GradStore::Overwrite);
    cpu().swiglu_backward(acc.data(), gu.data(), dout.data(), N, F);
    EXPECT_LT(rel_err(nan, zero), 1e-6);
    FVec want(acc.size());
    for (size_t i = 0; i < acc.size(); i++) want[i] = pre[i] + zero[i];
    EXPECT_LT(rel_err(acc, want), 1e-6);
}

// attention_backward with opt.dqkv_store: Overwrite into NaNs equals Accumulate into zeros
// (the CPU zeroes, then adds), in both modes, with a bias whose parameters get gradients.
TEST(OpsCpuGradStore, AttentionBackwardWritesDqkv) {
    const int B = 2, T = 19, C = 32, H = 2;
    const size_t n = size_t(B) * T * 3 * C;
    const FVec qkv = wave(n, 1.0f, 0.3f), dout = wave(size_t(B) * T * C, 1.0f, 1.9f);
    FVec pos(size_t(B) * T);
    for (size_t i = 0; i < pos.size(); i++) pos[i] = 0.5f * float(i % T);
    const FVec slopes = {0.5f, 0.25f};
    for (ctx::AttentionMode mode : {ctx::AttentionMode::Materialised, ctx::AttentionMode::Flash}) {
        ctx::AttentionOptions opt;
        opt.mode = mode;
        opt.bias.kind = ctx::BiasKind::Linear;
        opt.bias.a = slopes.data();
        FVec out(size_t(B) * T * C), saved(ctx::attention_saved_floats(mode, B, T, H));
        cpu().attention_forward(out.data(), saved.data(), qkv.data(), pos.data(), B, T, C, H, opt);
        FVec scratch(cpu().attention_scratch_floats(B, T, C, H, mode));
        FVec zero(n, 0.0f), nan(n, kNaN), da_z(H, 0.0f), da_w(H, 0.0f);
        opt.bias.da = da_z.data();
        cpu().attention_backward(zero.data(), scratch.data(), dout.data(), qkv.data(),
                                 saved.data(), out.data(), pos.data(), B, T, C, H, opt);
        opt.bias.da = da_w.data();
        opt.dqkv_store = GradStore::Overwrite;
        cpu().attention_backward(nan.data(), scratch.data(), dout.data(), qkv.data(),
                                 saved.data(), out.data(), pos.data(), B, T, C, H, opt);
        const char* m = ctx::attention_mode_name(mode);
        EXPECT_TRUE(same_bits(nan, zero)) << m;
        EXPECT_TRUE(same_bits(da_w, da_z)) << m;
        EXPECT_NE(da_w[0], 0.0f) << m << ": the slope gradient was not computed";
    }
}

}  // namespace
