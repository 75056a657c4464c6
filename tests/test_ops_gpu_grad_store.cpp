// GradStore on the CUDA backend (fp32 and bf16): Overwrite writes the input gradient over a
// buffer of NaNs (cuBLAS with beta 0 reads no C; the kernels do not read dinp), giving what
// Accumulate gives into zeros on the same backend within 1e-6 of the largest entry (cuBLAS may
// pick another algorithm for beta 0, a compiler may fuse an accumulation into one rounding); the
// parameter gradients accumulate in both modes, bit for bit alike. And against the CPU backend's
// Overwrite at the consistency tests' fp32 tolerance.
//
// Skipped without a CUDA device; emulated by engine/backend/cuda/emu/run_emulated_tests.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <limits>
#include <vector>

#include "gpu_test_support.h"

namespace {

using ctx::Activation;
using ctx::GradStore;

#define REQUIRE_GPU()                                                                      \
    do {                                                                                   \
        if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible: these tests need a GPU"; \
    } while (0)

const float kNaN = std::numeric_limits<float>::quiet_NaN();

bool same_bits(const FVec& a, const FVec& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool any_nan(const FVec& v) {
    for (float x : v)
        if (std::isnan(x)) return true;
    return false;
}

void matmul_case(ctx::Backend& be, bool bf16_input) {
    const int N = 70, IC = 96, OC = 200;
    ref::Rng rng(21);
    const FVec dout = randn(rng, size_t(N) * OC), inp = rounded(randn(rng, size_t(N) * IC));
    const FVec W = randn(rng, size_t(OC) * IC, 0.3), dW0 = randn(rng, W.size());
    const FVec db0 = randn(rng, OC);
    Dev gdout(dout, be), ginp(inp, be), gW(W, be);
    // bf16 storage: the same (bf16-valued) input as bf16 bit patterns
    std::vector<uint16_t> bits(inp.size() + inp.size() % 2, 0);
    for (size_t i = 0; i < inp.size(); i++) {
        uint32_t u;
        std::memcpy(&u, &inp[i], sizeof u);
        bits[i] = uint16_t(u >> 16);
    }
    FVec words(bits.size() / 2);
    std::memcpy(words.data(), bits.data(), bits.size() * sizeof(uint16_t));
    Dev g16(words, be);
    auto run = [&](float fill, GradStore store, FVec& dW, FVec& db) {
        Dev dinp(FVec(inp.size(), fill), be), gdW(dW0, be), gdb(db0, be);
        if (bf16_input)
            be.matmul_backward_bf16(dinp.get(), gdW.get(), gdb.get(), gdout.get(),
                                    reinterpret_cast<const ctx::Bf16*>(g16.get()), gW.get(), N,
                                    IC, OC, store);
        else
            be.matmul_backward(dinp.get(), gdW.get(), gdb.get(), gdout.get(), ginp.get(), gW.get(),
                               N, IC, OC, store);
        dW = gdW.host();
        db = gdb.host();
        return dinp.host();
    };
    FVec dW_z, db_z, dW_w, db_w;
    const FVec zero = run(0.0f, GradStore::Accumulate, dW_z, db_z);
    const FVec written = run(kNaN, GradStore::Overwrite, dW_w, db_w);
    EXPECT_FALSE(any_nan(written)) << "the old contents were read";
    EXPECT_LT(rel_err(written, zero), 1e-6);
    EXPECT_TRUE(same_bits(dW_w, dW_z)) << "dW accumulates in both modes";
    EXPECT_TRUE(same_bits(db_w, db_z)) << "dbias accumulates in both modes";
    EXPECT_GT(rel_err(dW_w, dW0), 1e-3) << "dW was not added to";
    if (&be == &gpu()) {  // the CPU's Overwrite on the same operands
        FVec c(inp.size(), kNaN), cdW = dW0, cdb = db0;
        cpu().matmul_backward(c.data(), cdW.data(), cdb.data(), dout.data(), inp.data(), W.data(),
                              N, IC, OC, GradStore::Overwrite);
        EXPECT_LT(rel_err(written, c), 1e-5);
    }
}

TEST(OpsGpuGradStore, MatmulBackwardOverwritesDinp) {
    REQUIRE_GPU();
    matmul_case(gpu(), false);
    matmul_case(gpu_bf16(), false);
    matmul_case(gpu_bf16(), true);  // bf16 activation storage
}

TEST(OpsGpuGradStore, ActivationAndSwigluBackwardOverwrite) {
    REQUIRE_GPU();
    ref::Rng rng(22);
    const int N = 9, F = 123;
    const size_t n = size_t(N) * F;
    const FVec x = randn(rng, n, 2.5), dout = randn(rng, n);
    for (ctx::Backend* be : {&gpu(), &gpu_bf16()}) {
        Dev gx(x, *be), gdout(dout, *be);
        for (Activation act : {Activation::GeluTanh, Activation::GeluErf, Activation::Relu}) {
            Dev zero(FVec(n, 0.0f), *be), nan(FVec(n, kNaN), *be);
            be->activation_backward(zero.get(), gx.get(), gdout.get(), n, act);
            be->activation_backward(nan.get(), gx.get(), gdout.get(), n, act, GradStore::Overwrite);
            EXPECT_LT(rel_err(nan.host(), zero.host()), 1e-6) << "activation " << int(act);
            FVec c(n, kNaN);
            cpu().activation_backward(c.data(), x.data(), dout.data(), n, act,
                                      GradStore::Overwrite);
            EXPECT_LT(rel_err(nan.host(), c), 1e-5) << "activation " << int(act);
        }
        const FVec gu = randn(rng, 2 * n, 2.0);
        Dev ggu(gu, *be), zero(FVec(2 * n, 0.0f), *be), nan(FVec(2 * n, kNaN), *be);
        be->swiglu_backward(zero.get(), ggu.get(), gdout.get(), N, F);
        be->swiglu_backward(nan.get(), ggu.get(), gdout.get(), N, F, GradStore::Overwrite);
        EXPECT_LT(rel_err(nan.host(), zero.host()), 1e-6) << "swiglu";
        FVec c(2 * n, kNaN);
        cpu().swiglu_backward(c.data(), gu.data(), dout.data(), N, F, GradStore::Overwrite);
        EXPECT_LT(rel_err(nan.host(), c), 1e-5) << "swiglu";
    }
}

// attention_backward with opt.dqkv_store on each path: materialised and fp32 flash (zeroed
// first), the bf16 tensor-core flash kernels, which write each entry themselves, and their
// one-kernel form, whose atomic dq adds onto columns the dvec pass zeroed: T 150 has full and
// partial tiles; a window and a bias with parameter gradients; D 64, 32 and 21 (odd: the
// tensor-core kernels then write entry by entry instead of in 8-byte pairs).
TEST(OpsGpuGradStore, AttentionBackwardWritesDqkv) {
    REQUIRE_GPU();
    ref::Rng rng(23);
    const int B = 2, T = 150;
    const FVec slopes = {0.3f, 0.2f, 0.1f, 0.05f};
    for (int C : {128, 256, 42}) {
        for (int H : {2, 4}) {
            if (C % H != 0 || C / H > 64) continue;
            const size_t n = size_t(B) * T * 3 * C;
            const FVec qkv = randn(rng, n), dout = randn(rng, size_t(B) * T * C);
            FVec pos(size_t(B) * T);
            for (size_t i = 0; i < pos.size(); i++) pos[i] = 0.75f * float(i % T);
            struct Path {
                ctx::Backend* be;
                ctx::AttentionMode mode;
                const char* name;
            };
            for (const Path& p : {Path{&gpu(), ctx::AttentionMode::Materialised, "fp32 mat"},
                                  Path{&gpu(), ctx::AttentionMode::Flash, "fp32 flash"},
                                  Path{&gpu_bf16(), ctx::AttentionMode::Flash, "bf16 flash"},
                                  Path{&gpu_bf16_atomic_dq(), ctx::AttentionMode::Flash,
                                       "bf16 flash, atomic dq"}}) {
                ctx::Backend& be = *p.be;
                ctx::AttentionOptions opt;
                opt.mode = p.mode;
                opt.window = 97;
                opt.bias.kind = ctx::BiasKind::Linear;
                opt.bias.a = slopes.data();  // host slopes, staged by the backend
                Dev gqkv(qkv, be), gdout(dout, be), gpos(pos, be), out(size_t(B) * T * C, be);
                Dev saved(be.attention_saved_floats(p.mode, B, T, C, H), be);
                Dev scratch(be.attention_scratch_floats(B, T, C, H, p.mode), be);
                be.attention_forward(out.get(), saved.get(), gqkv.get(), gpos.get(), B, T, C, H,
                                     opt);
                Dev zero(FVec(n, 0.0f), be), nan(FVec(n, kNaN), be);
                Dev da_z(FVec(H, 0.0f), be), da_w(FVec(H, 0.0f), be);
                opt.bias.da = da_z.get();
                be.attention_backward(zero.get(), scratch.get(), gdout.get(), gqkv.get(),
                                      saved.get(), out.get(), gpos.get(), B, T, C, H, opt);
                opt.bias.da = da_w.get();
                opt.dqkv_store = GradStore::Overwrite;
                be.attention_backward(nan.get(), scratch.get(), gdout.get(), gqkv.get(),
                                      saved.get(), out.get(), gpos.get(), B, T, C, H, opt);
                char what[64];
                std::snprintf(what, sizeof what, "%s C %d H %d", p.name, C, H);
                EXPECT_FALSE(any_nan(nan.host())) << what << ": an entry was not written";
                // (the atomic dq adds in an order that may differ between the two calls)
                const bool atomic = p.be == &gpu_bf16_atomic_dq();
                EXPECT_LE(rel_err(nan.host(), zero.host()), atomic ? 1e-6 : 1e-7) << what;
                EXPECT_TRUE(same_bits(da_w.host(), da_z.host())) << what;
            }
        }
    }
}

}  // namespace
