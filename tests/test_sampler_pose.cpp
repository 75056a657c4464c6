// sampler/pose (PoSE, METHODS.md 5.2) through the real plugin and the host wrapper: the row's
// structure (chunks, contiguous positions, skips bounded by the window), the content and boundary
// options, the joint distribution of cut points and skips against the METHODS formula
// (chi-square), determinism and option validation.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "sampler_fixtures.h"

using namespace ctx;
using namespace ctx::test;

namespace {

// A row read back as chunks: the row offsets where positions jump (by more than 1) start a new
// chunk; first offset and skip (position - offset) of each.
struct Chunks {
    std::vector<int> start, skip;
};

Chunks chunks_of(const Row& r) {
    Chunks c;
    for (size_t t = 0; t < r.positions.size(); ++t) {
        const int p = static_cast<int>(r.positions[t]);
        if (t == 0 || r.positions[t] != r.positions[t - 1] + 1.0f) {
            c.start.push_back(static_cast<int>(t));
            c.skip.push_back(p - static_cast<int>(t));
        }
    }
    return c;
}

double chi_square(const std::map<std::vector<int>, double>& observed,
                  const std::map<std::vector<int>, double>& p, double n) {
    double c = 0;
    for (const auto& [key, prob] : p) {
        const auto it = observed.find(key);
        const double o = it == observed.end() ? 0.0 : it->second, e = prob * n;
        c += (o - e) * (o - e) / e;
    }
    return c;
}

}  // namespace

TEST(SamplerPose, ChunksAreContiguousWithNonDecreasingSkipsInsideTheWindow) {
    for (int N : {1, 2, 3, 5}) {
        auto s = make_sampler("pose", {{"chunks", double(N)}});
        const int W = 200, L = 24;
        const auto w = test_window(W);
        int max_chunks = 0, max_last = 0;
        for (uint64_t seed = 0; seed < 400; ++seed) {
            const Row r = sample_row(*s, w, L, seed);
            const Chunks c = chunks_of(r);
            ASSERT_EQ(r.positions[0], 0.0f) << "u_0 = 0";
            ASSERT_LE(static_cast<int>(c.start.size()), N);
            max_chunks = std::max(max_chunks, static_cast<int>(c.start.size()));
            for (size_t i = 1; i < c.skip.size(); ++i) ASSERT_GT(c.skip[i], c.skip[i - 1]);
            for (int t = 0; t < L; ++t) {
                const int p = static_cast<int>(r.positions[t]);
                ASSERT_EQ(r.positions[t], static_cast<float>(p));
                ASSERT_EQ(r.tokens[t], w[p]) << "content = skip: tokens at their positions";
                ASSERT_EQ(r.mask[t], 1.0f);
            }
            const int last = static_cast<int>(r.positions[L - 1]);
            ASSERT_LE(last, W - 1) << "skips stay within Le - Lt";
            max_last = std::max(max_last, last);
        }
        EXPECT_EQ(max_chunks, N) << "all N chunks are seen";
        if (N > 1) EXPECT_GT(max_last, W - 20) << "skips reach the end of the window";
        else EXPECT_EQ(max_last, L - 1) << "one chunk: no skip";
    }
}

TEST(SamplerPose, BoundaryTargetsPerMode) {
    const int W = 120, L = 20;
    const auto w = test_window(W);
    for (const std::string mode : {"concat", "next", "mask"}) {
        auto s = make_sampler("pose", {{"chunks", 3.0}, {"boundary", mode}});
        int boundaries = 0;
        for (uint64_t seed = 0; seed < 200; ++seed) {
            const Row r = sample_row(*s, w, L, seed);
            for (int t = 0; t < L; ++t) {
                const int p = static_cast<int>(r.positions[t]);
                const bool skip_follows = t + 1 < L && r.positions[t + 1] != r.positions[t] + 1.0f;
                if (!skip_follows) {
                    ASSERT_EQ(r.targets[t], w[p + 1]) << "the true next token";
                    ASSERT_EQ(r.mask[t], 1.0f);
                    continue;
                }
                ++boundaries;
                if (mode == "concat") {
                    ASSERT_EQ(r.targets[t], r.tokens[t + 1]) << "the next chunk's first token";
                    ASSERT_EQ(r.mask[t], 1.0f);
                } else {
                    ASSERT_EQ(r.targets[t], w[p + 1]);
                    ASSERT_EQ(r.mask[t], mode == "mask" ? 0.0f : 1.0f);
                }
            }
        }
        EXPECT_GT(boundaries, 200) << mode;
    }
}

TEST(SamplerPose, ContiguousContentKeepsTheTokensAndSkipsOnlyPositions) {
    const int W = 90, L = 16;
    const auto w = test_window(W);
    for (const std::string mode : {"concat", "mask"}) {
        auto s = make_sampler("pose", {{"content", std::string("contiguous")}, {"boundary", mode}});
        bool skipped = false;
        for (uint64_t seed = 0; seed < 100; ++seed) {
            const Row r = sample_row(*s, w, L, seed);
            skipped |= r.positions[L - 1] > float(L - 1);
            for (int t = 0; t < L; ++t) {
                ASSERT_EQ(r.tokens[t], w[t]);
                ASSERT_EQ(r.targets[t], w[t + 1]);
                const bool skip_follows = t + 1 < L && r.positions[t + 1] != r.positions[t] + 1.0f;
                ASSERT_EQ(r.mask[t], skip_follows && mode == "mask" ? 0.0f : 1.0f);
            }
        }
        EXPECT_TRUE(skipped);
    }
}

// N = 3, L = 6, Le = 10 (F = Le - L = 4): the cut pair {c1 < c2} is uniform over the 10 subsets of
// {1..5}; u_1 ~ U{0..F}, u_2 ~ U{u_1..F}, independent of the cuts. The row determines (c1, c2,
// u_1, u_2) when the skips differ; equal skips merge chunks, so the test reads the draw from the
// positions of the cut offsets instead: position(t) - t is u_i on chunk i.
TEST(SamplerPose, CutsAndSkipsFollowTheMethodsDistribution) {
    auto s = make_sampler("pose", {{"chunks", 3.0}});
    const int L = 6, W = 10, F = W - L;
    const auto w = test_window(W);
    // The row shows skip(t) = position(t) - t per offset; the cell is the skip profile
    // (skip at offsets 0..L-1), whose probability sums over the (c1, c2, u1, u2) giving it.
    std::map<std::vector<int>, double> p, observed;
    for (int c1 = 1; c1 <= L - 1; ++c1)
        for (int c2 = c1 + 1; c2 <= L - 1; ++c2)
            for (int u1 = 0; u1 <= F; ++u1)
                for (int u2 = u1; u2 <= F; ++u2) {
                    std::vector<int> prof(L);
                    for (int t = 0; t < L; ++t) prof[t] = t < c1 ? 0 : t < c2 ? u1 : u2;
                    p[prof] += (1.0 / 10.0) * (1.0 / (F + 1)) * (1.0 / (F - u1 + 1));
                }
    double total = 0;
    for (const auto& kv : p) total += kv.second;
    ASSERT_NEAR(total, 1.0, 1e-12);
    const int n = 40000;
    for (uint64_t seed = 0; seed < uint64_t(n); ++seed) {
        const Row r = sample_row(*s, w, L, seed + 1000);
        std::vector<int> prof(L);
        for (int t = 0; t < L; ++t) prof[t] = static_cast<int>(r.positions[t]) - t;
        ASSERT_TRUE(p.count(prof)) << "a profile the formula cannot produce";
        observed[prof] += 1.0;
    }
    const int df = static_cast<int>(p.size()) - 1;
    EXPECT_LT(chi_square(observed, p, n), chi2_q999(df)) << df << " degrees of freedom";
    // The skips are NOT uniform over non-decreasing pairs (that would be 1 / 15 each): the
    // sequential draw gives u_1 = u_2 = 4 probability 1/5 but u_1 = u_2 = 0 only 1/25.
    double both_max = 0, both_zero = 0;
    for (const auto& [prof, o] : observed) {
        if (prof[L - 1] == F && prof[1] == F) both_max += o;  // c1 = 1, u1 = u2 = 4
        if (prof[L - 1] == 0) both_zero += o;
    }
    EXPECT_NEAR(both_zero / n, 1.0 / 25.0, 0.006);
    EXPECT_NEAR(both_max / n, (4.0 / 10.0) * (1.0 / 5.0) * 1.0, 0.01);
}

TEST(SamplerPose, DeterministicBySeedAndForcedWhenTheWindowIsTheRow) {
    auto s = make_sampler("pose", {{"chunks", 4.0}});
    const auto w = test_window(64);
    for (uint64_t seed : {1u, 7u, 99u}) {
        const Row a = sample_row(*s, w, 16, seed), b = sample_row(*s, w, 16, seed);
        EXPECT_EQ(a.tokens, b.tokens);
        EXPECT_EQ(a.positions, b.positions);
        EXPECT_EQ(a.targets, b.targets);
    }
    EXPECT_NE(sample_row(*s, w, 16, 1).positions, sample_row(*s, w, 16, 2).positions);
    const Row r = sample_row(*s, w, 64, 5);  // Le = Lt: no room to skip
    for (int t = 0; t < 64; ++t) {
        ASSERT_EQ(r.positions[t], float(t));
        ASSERT_EQ(r.targets[t], w[t + 1]);
    }
}

TEST(SamplerPose, OptionValidation) {
    auto has = [](const std::string& msg, const std::string& part) {
        return msg.find(part) != std::string::npos;
    };
    std::string msg = error_of([] { make_sampler("pose", {{"chunks", 0.0}}); });
    EXPECT_TRUE(has(msg, "sampler/pose") && has(msg, "option 'chunks' must be an integer >= 1, "
                                                     "got 0")) << msg;
    msg = error_of([] { make_sampler("pose", {{"chunks", 2.5}}); });
    EXPECT_TRUE(has(msg, "option 'chunks' must be an integer >= 1, got 2.5")) << msg;
    msg = error_of([] { make_sampler("pose", {{"content", std::string("shuffled")}}); });
    EXPECT_TRUE(has(msg, "option 'content' must be \"skip\" or \"contiguous\", got "
                         "\"shuffled\"")) << msg;
    msg = error_of([] { make_sampler("pose", {{"boundary", std::string("wrap")}}); });
    EXPECT_TRUE(has(msg, "option 'boundary' must be \"concat\", \"next\" or \"mask\"")) << msg;
    msg = error_of([] { make_sampler("pose", {{"chunk", 2.0}}); });
    EXPECT_TRUE(has(msg, "unknown option 'chunk'")) << msg;

    auto s = make_sampler("pose", {{"chunks", 8.0}});
    const auto w = test_window(64);
    msg = error_of([&] { sample_row(*s, w, 5, 1); });
    EXPECT_TRUE(has(msg, "option 'chunks' = 8: more chunks than the row has tokens (row_len 5)"))
        << msg;
    msg = error_of([&] { sample_row(*s, w, 65, 1); });
    EXPECT_TRUE(has(msg, "row_len 65 must be in [1, window_len = 64]")) << msg;
}
