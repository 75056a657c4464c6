// sampler/full (METHODS.md 2.1) through the real plugin and the host wrapper.
#include <gtest/gtest.h>

#include "sampler_fixtures.h"

using namespace ctx;
using namespace ctx::test;

TEST(SamplerFull, RowIsTheWholeWindowWithOriginalPositions) {
    auto s = make_sampler("full");
    const auto w = test_window(16);
    const Row r = sample_row(*s, w, 16, 5);
    for (int p = 0; p < 16; ++p) {
        EXPECT_EQ(r.tokens[p], w[p]) << p;
        EXPECT_EQ(r.positions[p], static_cast<float>(p)) << p;
        EXPECT_EQ(r.targets[p], w[p + 1]) << p;  // the true next token, incl. the last one
        EXPECT_EQ(r.mask[p], 1.0f) << p;
    }
    EXPECT_EQ(r.targets[15], (16 * 7 + 3) % 256);
}

TEST(SamplerFull, ShorterRowTakesTheStartByDefault) {
    auto s = make_sampler("full");
    const auto w = test_window(32);
    for (uint64_t seed = 0; seed < 20; ++seed) {
        const Row r = sample_row(*s, w, 8, seed);
        for (int p = 0; p < 8; ++p) {
            ASSERT_EQ(r.positions[p], static_cast<float>(p));
            ASSERT_EQ(r.tokens[p], w[p]);
            ASSERT_EQ(r.targets[p], w[p + 1]);
        }
    }
}

TEST(SamplerFull, RandomSpanIsContiguousOriginalAndUniform) {
    auto s = make_sampler("full", {{"span", std::string("random")}});
    const int W = 16, L = 8, n_offsets = W - L + 1;  // offsets 0..8
    const auto w = test_window(W);
    std::vector<int> counts(n_offsets, 0);
    const int N = 9000;
    for (int i = 0; i < N; ++i) {
        const Row r = sample_row(*s, w, L, 1000 + i);
        const int o = static_cast<int>(r.positions[0]);
        ASSERT_GE(o, 0);
        ASSERT_LT(o, n_offsets);
        for (int t = 0; t < L; ++t) {
            ASSERT_EQ(r.positions[t], static_cast<float>(o + t));
            ASSERT_EQ(r.tokens[t], w[o + t]);
            ASSERT_EQ(r.targets[t], w[o + t + 1]);
            ASSERT_EQ(r.mask[t], 1.0f);
        }
        ++counts[o];
    }
    double chi2 = 0;
    const double expect = static_cast<double>(N) / n_offsets;
    for (int c : counts) chi2 += (c - expect) * (c - expect) / expect;
    EXPECT_LT(chi2, 26.12) << "chi-square, 8 degrees of freedom, 0.999 quantile 26.12";
    // Deterministic: same rng state, same row.
    EXPECT_EQ(sample_row(*s, w, L, 77).positions, sample_row(*s, w, L, 77).positions);
}

TEST(SamplerFull, RejectsBadOptionsAndLengths) {
    std::string msg = error_of([] { make_sampler("full", {{"span", std::string("middle")}}); });
    EXPECT_NE(msg.find("sampler/full"), std::string::npos) << msg;
    EXPECT_NE(msg.find("option 'span' must be \"start\" or \"random\", got \"middle\""),
              std::string::npos) << msg;
    msg = error_of([] { make_sampler("full", {{"spam", std::string("start")}}); });
    EXPECT_NE(msg.find("unknown option 'spam'"), std::string::npos) << msg;
    msg = error_of([] { make_sampler("full", {{"span", 3.0}}); });
    EXPECT_NE(msg.find("'span'"), std::string::npos) << msg;

    auto s = make_sampler("full");
    const auto w = test_window(8);
    msg = error_of([&] { sample_row(*s, w, 9, 1); });
    EXPECT_NE(msg.find("sampler/full: sample failed (status 1): row_len 9 must be in [1, "
                       "window_len = 8]"), std::string::npos) << msg;
}

TEST(SamplerFull, HostRejectsRowsOutsideTheVocabulary) {
    // The window holds bytes up to 255; with a 100-token vocabulary the wrapper's row check
    // must catch what the plugin copied.
    auto s = make_sampler("full", {}, 100);
    const auto w = test_window(32);  // w[p] = 7p + 3: w[14] = 101 is the first >= 100
    const std::string msg = error_of([&] { sample_row(*s, w, 32, 1); });
    EXPECT_NE(msg.find("sampler/full: invalid row: target 101 at index 13 is outside the "
                       "vocabulary [0, 100)"), std::string::npos) << msg;
}
