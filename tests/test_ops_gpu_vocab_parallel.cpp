// The vocabulary-parallel ops (tensor parallelism, docs/PARALLEL.md) on the CUDA backend against
// the CPU backend: the embedding of one vocabulary shard (zero rows for the other shards' tokens,
// gradients only into this shard's rows) and the sharded cross-entropy's statistics and finish
// (loss, and the in-place gradient of this shard's logits). The CPU ops are checked against the
// whole-vocabulary ops in test_tensor_parallel.cpp. Skips without a GPU; label "gpu".
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "gpu_test_support.h"

namespace {

#define REQUIRE_GPU()                                                                         \
    do {                                                                                      \
        if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible: the CUDA backend tests need one"; \
    } while (0)

TEST(OpsGpuVocabParallel, EmbeddingShardMatchesCpu) {
    REQUIRE_GPU();
    const int N = 41, C = 24, V = 30, S = 3, Vs = V / S, P = 9;
    ref::Rng rng(5);
    std::vector<int32_t> tokens(N);
    for (auto& t : tokens) t = rng.integer(0, V - 1);
    FVec pos(N);
    for (auto& p : pos) p = float(rng.uniform(0.0, P - 1));
    const FVec wte = randn(rng, size_t(Vs) * C), wpe = randn(rng, size_t(P) * C);
    const FVec dout = randn(rng, size_t(N) * C);
    for (int s = 0; s < S; ++s) {
        const ctx::VocabShard shard{s * Vs, V};
        for (bool with_wpe : {false, true}) {
            Dev gwte(wte), gwpe(wpe), gpos(pos), gout(size_t(N) * C), gdout(dout);
            FVec out(size_t(N) * C);
            cpu().embedding_forward(out.data(), tokens.data(), pos.data(), wte.data(),
                                    with_wpe ? wpe.data() : nullptr, N, C, Vs, P, shard);
            gpu().embedding_forward(gout.get(), tokens.data(), gpos.get(), gwte.get(),
                                    with_wpe ? gwpe.get() : nullptr, N, C, Vs, P, shard);
            EXPECT_CLOSE(gout.host(), out, kFwdTol);
            FVec dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
            Dev gdwte(dwte), gdwpe(dwpe);
            cpu().embedding_backward(dwte.data(), with_wpe ? dwpe.data() : nullptr, dout.data(),
                                     tokens.data(), pos.data(), N, C, Vs, P, shard);
            gpu().embedding_backward(gdwte.get(), with_wpe ? gdwpe.get() : nullptr, gdout.get(),
                                     tokens.data(), gpos.get(), N, C, Vs, P, shard);
            EXPECT_CLOSE(gdwte.host(), dwte, kGradTol);
            EXPECT_CLOSE(gdwpe.host(), dwpe, kGradTol);
        }
    }
}

TEST(OpsGpuVocabParallel, ShardedCrossEntropyMatchesCpu) {
    REQUIRE_GPU();
    const int N = 37, V = 1000, S = 4, Vs = V / S;
    ref::Rng rng(9);
    std::vector<int32_t> targets(N);
    FVec mask(N, 1.0f);
    for (int n = 0; n < N; n++) {
        targets[n] = rng.integer(0, V - 1);
        if (n % 4 == 1) mask[n] = 0.0f;
        if (n % 4 == 2) mask[n] = 0.5f;
    }
    std::vector<FVec> logits;
    FVec stats(size_t(S) * N * 3);
    Dev gstats(stats.size());
    for (int s = 0; s < S; ++s) {
        logits.push_back(randn(rng, size_t(N) * Vs, 3.0));
        const ctx::VocabShard shard{s * Vs, V};
        Dev glog(logits[s]), gst(size_t(N) * 3);
        cpu().crossentropy_shard_stats(stats.data() + size_t(s) * N * 3, logits[s].data(),
                                       targets.data(), N, Vs, shard);
        gpu().crossentropy_shard_stats(gst.get(), glog.get(), targets.data(), N, Vs, shard);
        const FVec got = gst.host();
        EXPECT_CLOSE(got, FVec(stats.begin() + size_t(s) * N * 3,
                               stats.begin() + size_t(s + 1) * N * 3), kFwdTol);
    }
    gpu().copy_to_device(gstats.get(), stats.data(), stats.size());  // the CPU's, gathered
    Dev gmask(mask);
    for (int s = 0; s < S; ++s) {
        const ctx::VocabShard shard{s * Vs, V};
        FVec loss(N), d = logits[s];
        Dev gloss(N), gd(d);
        cpu().crossentropy_shard_finish(loss.data(), d.data(), stats.data(), S, targets.data(),
                                        mask.data(), N, Vs, shard, 0.125f);
        gpu().crossentropy_shard_finish(gloss.get(), gd.get(), gstats.get(), S, targets.data(),
                                        gmask.get(), N, Vs, shard, 0.125f);
        EXPECT_CLOSE(gloss.host(), loss, kFwdTol);
        EXPECT_CLOSE(gd.host(), d, kFwdTol);
        Dev gloss_only(N);  // forward only: losses, logits untouched
        gpu().crossentropy_shard_finish(gloss_only.get(), nullptr, gstats.get(), S,
                                        targets.data(), gmask.get(), N, Vs, shard, 0.125f);
        EXPECT_CLOSE(gloss_only.host(), loss, kFwdTol);
    }
}

}  // namespace
