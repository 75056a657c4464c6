// Backend::lm_head_loss, the language-model head fused with its softmax cross-entropy, on the CPU
// backend (the Backend default: matmul_forward, crossentropy_*, matmul_backward chunk by chunk)
// and through ProfilingBackend. References: plain double loops of the op contract (logits,
// log-sum-exp, and the gradient grad_scale * mask * (softmax - onehot) pushed through both
// products), the loops' gradient itself checked by central differences of their loss on a small
// case; the unfused ops on the whole (N, V) logits. The chunking rule and its environment
// override are checked on their own.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/op_common.h"
#include "backend/profiling_backend.h"
#include "core/error.h"
#include "op_reference.h"

namespace {

using ref::Vec;

ctx::Backend& cpu() {
    static std::unique_ptr<ctx::Backend> backend = ctx::make_cpu_backend(2);
    return *backend;
}

// Sets CTX_LM_HEAD_CHUNK_MIB for a scope (unset: the backend's default budget).
class ChunkMib {
public:
    explicit ChunkMib(const char* value) {
        if (value != nullptr)
            setenv("CTX_LM_HEAD_CHUNK_MIB", value, 1);
        else
            unsetenv("CTX_LM_HEAD_CHUNK_MIB");
    }
    ~ChunkMib() { unsetenv("CTX_LM_HEAD_CHUNK_MIB"); }
};

struct Case {
    int N, C, V;
    Vec x, W, mask;
    std::vector<int32_t> targets;
    float grad_scale;
};

Case make_case(int N, int C, int V, uint64_t seed) {
    ref::Rng rng(seed);
    Case k{N, C, V, rng.normals(size_t(N) * C), rng.normals(size_t(V) * C, 0.5), Vec(N), {}, 0.37f};
    k.targets.resize(N);
    for (int n = 0; n < N; ++n) {
        k.targets[n] = rng.integer(0, V - 1);
        const int r = rng.integer(0, 9);
        k.mask[n] = r == 0 ? 0.0 : (r == 1 ? 0.5 : 1.0);  // some rows off, some half weight
    }
    return k;
}

struct Result {
    Vec losses, dinp, dW;
};

// The op contract in double: logits = x W^T; loss = mask (lse - logit[target]); with
// g = grad_scale mask (softmax - onehot): dinp = g W, dW = g^T x.
Result reference(const Case& k) {
    const int N = k.N, C = k.C, V = k.V;
    Result r{Vec(N), Vec(size_t(N) * C, 0.0), Vec(size_t(V) * C, 0.0)};
    Vec z(V), g(V);
    for (int n = 0; n < N; ++n) {
        double mx = -INFINITY;
        for (int v = 0; v < V; ++v) {
            double s = 0.0;
            for (int c = 0; c < C; ++c) s += k.x[size_t(n) * C + c] * k.W[size_t(v) * C + c];
            z[v] = s;
            mx = std::max(mx, s);
        }
        double sum = 0.0;
        for (int v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
        const double lse = mx + std::log(sum), m = k.mask[n];
        r.losses[n] = m * (lse - z[k.targets[n]]);
        for (int v = 0; v < V; ++v)
            g[v] = k.grad_scale * m * (std::exp(z[v] - lse) - (v == k.targets[n] ? 1.0 : 0.0));
        for (int v = 0; v < V; ++v)
            for (int c = 0; c < C; ++c) {
                r.dinp[size_t(n) * C + c] += g[v] * k.W[size_t(v) * C + c];
                r.dW[size_t(v) * C + c] += g[v] * k.x[size_t(n) * C + c];
            }
    }
    return r;
}

// The op on backend `be` (host memory), with the gradients pre-filled by `pre` (returned minus
// it, i.e. what the op added); train false: losses only.
Result run(ctx::Backend& be, const Case& k, bool train, double pre = 0.25) {
    const std::vector<float> x = ref::to_float(k.x), W = ref::to_float(k.W),
                             mask = ref::to_float(k.mask);
    std::vector<float> losses(k.N, -1.0f), dinp(size_t(k.N) * k.C, float(pre)),
        dW(size_t(k.V) * k.C, float(pre));
    std::vector<float> scratch(be.lm_head_scratch_floats(k.N, k.V));
    be.lm_head_loss(losses.data(), train ? dinp.data() : nullptr, train ? dW.data() : nullptr,
                    scratch.data(), x.data(), W.data(), k.targets.data(), mask.data(), k.N, k.C,
                    k.V, k.grad_scale);
    Result r{ref::to_double(losses), ref::to_double(dinp), ref::to_double(dW)};
    for (double& d : r.dinp) d -= pre;
    for (double& d : r.dW) d -= pre;
    return r;
}

TEST(OpsLmHead, ReferenceGradientMatchesCentralDifferences) {
    const Case k = make_case(5, 4, 7, 11);
    const Result r = reference(k);
    auto loss = [&](const Vec& x, const Vec& W) {
        Case c = k;
        c.x = x;
        c.W = W;
        const Result q = reference(c);
        double s = 0.0;
        for (double l : q.losses) s += l;
        return s * k.grad_scale;  // the gradient is of grad_scale * sum of masked losses
    };
    const Vec gx = ref::numeric_grad([&](const Vec& x) { return loss(x, k.W); }, k.x);
    const Vec gw = ref::numeric_grad([&](const Vec& W) { return loss(k.x, W); }, k.W);
    EXPECT_LT(ref::max_rel_error(r.dinp, gx), 1e-6);
    EXPECT_LT(ref::max_rel_error(r.dW, gw), 1e-6);
}

TEST(OpsLmHead, ChunkRowsSplitEvenlyAndBoundTheScratch) {
    EXPECT_EQ(ctx::lm_head_most_rows(1000, 262144), 262);
    EXPECT_EQ(ctx::lm_head_most_rows(1000, 10), 1);  // a row larger than the budget: one row
    EXPECT_EQ(ctx::lm_head_rows_for(701, 262), 234);  // 3 chunks: 234, 234, 233
    EXPECT_EQ(ctx::lm_head_rows_for(524, 262), 262);
    EXPECT_EQ(ctx::lm_head_rows_for(525, 262), 175);
    EXPECT_EQ(ctx::lm_head_rows_for(100, 262), 100);
    EXPECT_EQ(ctx::lm_head_rows_for(0, 262), 1);
    for (int most : {1, 7, 64, 262})
        for (int N = 1; N <= 1000; ++N) {
            const int R = ctx::lm_head_rows_for(N, most), chunks = (N + R - 1) / R;
            ASSERT_LE(R, std::min(N, most)) << N << " " << most;  // fits min(N', most) scratch
            ASSERT_EQ(chunks, (N + most - 1) / most) << N << " " << most;  // fewest chunks
            ASSERT_LT(size_t(chunks - 1) * R, size_t(N)) << N << " " << most;  // none empty
        }
    ChunkMib env("1");  // 262144 floats
    EXPECT_EQ(cpu().lm_head_chunk_rows(701, 1000), 234);
    EXPECT_EQ(cpu().lm_head_scratch_floats(701, 1000), size_t(262) * 1000);
    EXPECT_EQ(cpu().lm_head_scratch_floats(100, 1000), size_t(100) * 1000);
}

TEST(OpsLmHead, MatchesTheReferenceInOneChunkAndInMany) {
    struct Shape {
        int N, C, V;
        const char* mib;
        int chunk;
    };
    for (const Shape& s : {Shape{37, 16, 101, nullptr, 37}, Shape{300, 8, 1000, "1", 150},
                           Shape{701, 6, 1000, "1", 234}, Shape{9, 5, 70000, "1", 3}}) {
        ChunkMib env(s.mib);
        SCOPED_TRACE(testing::Message() << "N " << s.N << " C " << s.C << " V " << s.V);
        ASSERT_EQ(cpu().lm_head_chunk_rows(s.N, s.V), s.chunk);
        const Case k = make_case(s.N, s.C, s.V, 100 + s.N);
        const Result want = reference(k);
        const Result got = run(cpu(), k, true);
        EXPECT_LT(ref::max_rel_error(got.losses, want.losses), 2e-5);
        EXPECT_LT(ref::max_rel_error(got.dinp, want.dinp), 2e-4);
        EXPECT_LT(ref::max_rel_error(got.dW, want.dW), 2e-4);
        const Result scored = run(cpu(), k, false);  // losses only, gradients untouched
        EXPECT_LT(ref::max_rel_error(scored.losses, want.losses), 2e-5);
        for (double d : scored.dinp) ASSERT_EQ(d, 0.0);
        for (double d : scored.dW) ASSERT_EQ(d, 0.0);
    }
}

TEST(OpsLmHead, AgreesWithTheUnfusedOpsOnTheWholeLogits) {
    ChunkMib env("1");
    const Case k = make_case(701, 6, 1000, 5);  // 3 chunks
    const Result fused = run(cpu(), k, true, 0.0);
    const std::vector<float> x = ref::to_float(k.x), W = ref::to_float(k.W),
                             mask = ref::to_float(k.mask);
    std::vector<float> logits(size_t(k.N) * k.V), losses(k.N), dinp(size_t(k.N) * k.C, 0.0f),
        dW(size_t(k.V) * k.C, 0.0f);
    cpu().matmul_forward(logits.data(), x.data(), W.data(), nullptr, k.N, k.C, k.V);
    cpu().crossentropy_forward_backward(logits.data(), losses.data(), k.targets.data(),
                                        mask.data(), k.N, k.V, k.grad_scale);
    cpu().matmul_backward(dinp.data(), dW.data(), nullptr, logits.data(), x.data(), W.data(), k.N,
                          k.C, k.V);
    // the same ops on the same rows: losses and dinp equal, dW summed in 3 parts
    for (int n = 0; n < k.N; ++n) ASSERT_EQ(float(fused.losses[n]), losses[n]) << n;
    EXPECT_LT(ref::max_rel_error(dinp, fused.dinp), 1e-6);
    EXPECT_LT(ref::max_rel_error(dW, fused.dW), 1e-5);
}

TEST(OpsLmHead, RepeatsBitForBit) {
    ChunkMib env("1");
    const Case k = make_case(300, 8, 1000, 9);
    const Result a = run(cpu(), k, true), b = run(cpu(), k, true);
    EXPECT_EQ(a.losses, b.losses);
    EXPECT_EQ(a.dinp, b.dinp);
    EXPECT_EQ(a.dW, b.dW);
}

TEST(OpsLmHead, ProfilingBackendForwardsTheOpAndCountsItsProducts) {
    ChunkMib env("1");
    const Case k = make_case(300, 8, 1000, 3);
    ctx::ProfilingBackend prof(cpu());
    EXPECT_EQ(prof.lm_head_chunk_rows(300, 1000), 150);
    EXPECT_EQ(prof.lm_head_scratch_floats(300, 1000), cpu().lm_head_scratch_floats(300, 1000));
    const Result got = run(prof, k, true), want = run(cpu(), k, true);
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_EQ(got.dW, want.dW);
    bool found = false;
    for (const auto& row : prof.rows())
        if (row.op == "lm_head_loss") {
            found = true;
            EXPECT_EQ(row.shape, "N=300 C=8 V=1000 chunk=150");
            EXPECT_EQ(row.calls, 1L);
            EXPECT_DOUBLE_EQ(row.flops, 6.0 * 300 * 8 * 1000);
        }
    EXPECT_TRUE(found);
}

TEST(OpsLmHead, RefusesBadInput) {
    const Case k = make_case(700, 4, 1000, 1);
    std::vector<float> x = ref::to_float(k.x), W = ref::to_float(k.W), losses(k.N),
        dinp(size_t(k.N) * k.C), scratch(cpu().lm_head_scratch_floats(k.N, k.V));
    std::vector<int32_t> targets = k.targets;
    targets[500] = 1000;  // outside [0, 1000), in the third chunk of 1 MiB ones
    {
        ChunkMib env("1");
        try {
            cpu().lm_head_loss(losses.data(), nullptr, nullptr, scratch.data(), x.data(),
                               W.data(), targets.data(), nullptr, k.N, k.C, k.V, 1.0f);
            ADD_FAILURE() << "a target outside the vocabulary was accepted";
        } catch (const ctx::Error& e) {  // the row in the whole batch, not in its chunk
            EXPECT_NE(std::string(e.what()).find("target 1000 at row 500"), std::string::npos)
                << e.what();
        }
    }
    EXPECT_THROW(cpu().lm_head_loss(losses.data(), dinp.data(), nullptr, scratch.data(), x.data(),
                                    W.data(), k.targets.data(), nullptr, k.N, k.C, k.V, 1.0f),
                 ctx::Error);  // training without the head's gradient
    for (const char* bad : {"0", "-3", "12x", "abc", "2000000"}) {
        ChunkMib env(bad);
        try {
            (void)cpu().lm_head_chunk_rows(k.N, k.V);
            ADD_FAILURE() << "CTX_LM_HEAD_CHUNK_MIB=" << bad << " was accepted";
        } catch (const ctx::Error& e) {
            EXPECT_NE(std::string(e.what()).find("CTX_LM_HEAD_CHUNK_MIB"), std::string::npos);
            EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
        }
    }
}

}  // namespace
