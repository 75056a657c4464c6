// The contextual-sparsity ops of the CUDA backend against the CPU backend's (which
// test_ops_cpu_sparse.cpp checks against naive loops): matmul_rows_forward, matmul_rows_project,
// select_topk (exactly the same choice, ties and thresholds included) and attention over a KV
// cache with a head subset. Skips without a GPU; runs under emulation
// (engine/backend/cuda/emu/run_emulated_tests.py BUILD --only=test_ops_gpu_sparse).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "gpu_test_support.h"
#include "op_reference.h"

namespace {

#define REQUIRE_GPU()                                                                        \
    do {                                                                                     \
        if (!have_gpu())                                                                     \
            GTEST_SKIP() << "no CUDA device visible (cuda_device_count() == 0): the CUDA "   \
                            "backend consistency tests need a GPU";                          \
    } while (0)

using IVec = std::vector<int32_t>;

IVec selection(ref::Rng& rng, int N, int groups, int K) {
    IVec idx(size_t(N) * K);
    for (int n = 0; n < N; n++) {
        IVec all(static_cast<size_t>(groups));
        std::iota(all.begin(), all.end(), 0);
        for (int i = groups - 1; i > 0; i--) std::swap(all[size_t(i)], all[size_t(rng.integer(0, i))]);
        for (int k = 0; k < K; k++)
            idx[size_t(n) * K + k] = rng.integer(0, 4) == 0 ? -1 : all[size_t(k)];
    }
    return idx;
}

TEST(OpsGpuSparse, MatmulRowsMatchCpu) {
    REQUIRE_GPU();
    for (auto [N, C, M, K, G] : {std::tuple{3, 17, 40, 9, 1}, std::tuple{2, 64, 48, 3, 8},
                                 std::tuple{5, 256, 1024, 200, 1}, std::tuple{1, 96, 96, 6, 16}}) {
        ref::Rng rng(N + C + M + K + G);
        const int ld = M + 3;
        const FVec inp = randn(rng, size_t(N) * C), W = randn(rng, size_t(M) * C);
        const FVec b = randn(rng, size_t(M)), bc = randn(rng, size_t(C));
        const FVec Wt = randn(rng, size_t(M) * C), h0 = randn(rng, size_t(N) * ld);
        const IVec idx = selection(rng, N, M / G, K);
        DevInts gidx(idx);
        for (bool bias : {true, false}) {
            FVec h = h0;  // untouched entries keep these
            Dev gh(h), ginp(inp), gW(W), gb(b);
            cpu().matmul_rows_forward(h.data(), ld, inp.data(), W.data(), bias ? b.data() : nullptr,
                                      idx.data(), N, C, K, G);
            gpu().matmul_rows_forward(gh.get(), ld, ginp.get(), gW.get(), bias ? gb.get() : nullptr,
                                      gidx.get(), N, C, K, G);
            EXPECT_CLOSE(gh.host(), h, kFwdTol);
            FVec out(size_t(N) * C);
            Dev gout(out.size()), gWt(Wt), gbc(bc);
            cpu().matmul_rows_project(out.data(), h.data(), ld, Wt.data(),
                                      bias ? bc.data() : nullptr, idx.data(), N, C, K, G);
            gpu().matmul_rows_project(gout.get(), gh.get(), ld, gWt.get(),
                                      bias ? gbc.get() : nullptr, gidx.get(), N, C, K, G);
            EXPECT_CLOSE(gout.host(), out, kFwdTol);
        }
    }
}

TEST(OpsGpuSparse, SelectTopkMatchesCpuExactly) {
    REQUIRE_GPU();
    const float none = -std::numeric_limits<float>::infinity();
    for (auto [N, M, K, threshold, ties] :
         {std::tuple{3, 40, 9, none, false}, std::tuple{2, 1000, 100, 0.0f, false},
          std::tuple{4, 16, 16, none, false}, std::tuple{5, 600, 7, none, true},
          std::tuple{2, 64, 20, 0.5f, true}, std::tuple{1, 3, 1, none, false},
          std::tuple{2, 300, 299, none, true}}) {
        ref::Rng rng(N + M + K);
        FVec s = randn(rng, size_t(N) * M);
        if (ties)
            for (float& v : s) v = std::round(v * 2.0f) / 2.0f;
        if (ties) s[1] = -0.0f;
        IVec idx(size_t(N) * K);
        cpu().select_topk(idx.data(), s.data(), N, M, K, threshold);
        Dev gs(s), gidx(idx.size());
        gpu().select_topk(reinterpret_cast<int32_t*>(gidx.get()), gs.get(), N, M, K, threshold);
        const FVec bits = gidx.host();
        IVec got(bits.size());
        std::memcpy(got.data(), bits.data(), got.size() * sizeof(int32_t));
        EXPECT_EQ(got, idx) << "N " << N << " M " << M << " K " << K;
    }
}

TEST(OpsGpuSparse, CachedAttentionHeadSubsetMatchesCpu) {
    REQUIRE_GPU();
    const int B = 2, Tq = 2, S = 150, H = 4, D = 16, C = H * D, HS = 2;
    ref::Rng rng(3);
    const FVec qkv = randn(rng, size_t(B) * Tq * 3 * C);
    const FVec kc = randn(rng, size_t(B) * S * C), vc = randn(rng, size_t(B) * S * C);
    FVec kpos(size_t(B) * S);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < S; j++) kpos[size_t(b) * S + j] = float(j);
    const std::vector<int32_t> lens = {140, 150};
    const IVec heads = {1, 3, 0, -1, 2, 3, -1, -1};
    FVec out(size_t(B) * Tq * C, 7.5f), scratch(cpu().attention_cached_scratch_floats(S));
    Dev gqkv(qkv), gkc(kc), gvc(vc), gkpos(kpos), gout(out), gscratch(1);
    DevInts gheads(heads);
    ctx::AttentionOptions opt;
    opt.heads = heads.data();
    opt.heads_k = HS;
    cpu().attention_cached_forward(out.data(), scratch.data(), qkv.data(), kc.data(), vc.data(),
                                   kpos.data(), lens.data(), B, Tq, S, C, H, opt);
    opt.heads = gheads.get();
    gpu().attention_cached_forward(gout.get(), gscratch.get(), gqkv.get(), gkc.get(), gvc.get(),
                                   gkpos.get(), lens.data(), B, Tq, S, C, H, opt);
    EXPECT_CLOSE(gout.host(), out, kFwdTol);  // unlisted heads: 7.5 on both
}

}  // namespace
