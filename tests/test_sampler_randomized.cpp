// sampler/randomized (METHODS.md 2.4, Giraffe randomized positions) through the real plugin and
// the host wrapper.
#include <gtest/gtest.h>

#include <cmath>

#include "sampler_fixtures.h"

using namespace ctx;
using namespace ctx::test;

namespace {

bool has(const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos;
}

// Float positions are doubles rounded once; a gap read back from floats may be off by the
// spacing of floats at the position (<= 2^-23 * |p|) at each end.
double slack(float p) { return 2.0 * std::ldexp(1.0, -23) * (std::fabs(p) + 1.0); }

}  // namespace

TEST(SamplerRandomized, PositionsTokensAndTargets) {
    auto s = make_sampler("randomized");  // eps 1/16, span "start"
    const double eps = 1.0 / 16.0;
    const int W = 128, L = 64;
    const auto w = test_window(W);
    for (uint64_t seed = 0; seed < 300; ++seed) {
        const Row r = sample_row(*s, w, L, seed);
        ASSERT_EQ(r.positions.size(), static_cast<size_t>(L));
        ASSERT_EQ(r.positions[0], 0.0f) << "p_0 = 0";
        for (int t = 0; t < L; ++t) {
            ASSERT_EQ(r.tokens[t], w[t]) << "the window's first row_len tokens";
            ASSERT_EQ(r.targets[t], w[t + 1]) << "the true next token";
            ASSERT_EQ(r.mask[t], 1.0f);
            if (t == 0) continue;
            ASSERT_LT(r.positions[t - 1], r.positions[t]) << "strictly increasing";
            const double g = static_cast<double>(r.positions[t]) - r.positions[t - 1];
            ASSERT_GE(g, eps - slack(r.positions[t])) << "seed " << seed << " t " << t;
            ASSERT_LE(g, 2.0 + slack(r.positions[t])) << "seed " << seed << " t " << t;
        }
    }
}

// Mean and variance of the gaps against U[eps, 2]: mean (eps + 2) / 2, variance (2 - eps)^2 / 12;
// the tolerance on the mean is 5 standard errors, and a 16-bin histogram passes chi-square.
TEST(SamplerRandomized, GapsAreUniformBetweenEpsAndTwo) {
    for (double eps : {1.0 / 16.0, 0.5, 1.5}) {
        auto s = make_sampler("randomized", {{"eps", eps}});
        const int W = 256, L = 256, rows = 200, bins = 16;
        const auto w = test_window(W);
        const double mean = (eps + 2.0) / 2.0, var = (2.0 - eps) * (2.0 - eps) / 12.0;
        double sum = 0, sum2 = 0, n = 0;
        std::vector<double> hist(bins, 0.0);
        double last = 0;
        for (int k = 0; k < rows; ++k) {
            const Row r = sample_row(*s, w, L, 0xFACEull + k);
            for (int t = 1; t < L; ++t) {
                const double g = static_cast<double>(r.positions[t]) - r.positions[t - 1];
                sum += g;
                sum2 += g * g;
                n += 1;
                int b = static_cast<int>((g - eps) / (2.0 - eps) * bins);
                b = std::min(std::max(b, 0), bins - 1);
                hist[b] += 1;
            }
            last += r.positions[L - 1];
        }
        const double m = sum / n, v = sum2 / n - m * m;
        EXPECT_NEAR(m, mean, 5.0 * std::sqrt(var / n)) << "eps " << eps;
        EXPECT_NEAR(v, var, 0.05 * var) << "eps " << eps;
        // The expected last position is (L - 1) * mean (~ L for the default eps).
        EXPECT_NEAR(last / rows, (L - 1) * mean, 5.0 * std::sqrt((L - 1) * var / rows));
        double chi2 = 0;
        for (double h : hist) chi2 += (h - n / bins) * (h - n / bins) / (n / bins);
        // Bin edges of floats near p can shift a gap by ~1e-5: negligible for 16 bins.
        EXPECT_LT(chi2, 37.70) << "exact 0.999 quantile, 15 degrees of freedom, eps " << eps;
    }
}

TEST(SamplerRandomized, RandomSpanKeepsTokensContiguousAndPositionsFromZero) {
    auto s = make_sampler("randomized", {{"span", std::string("random")}});
    const int W = 100, L = 20;
    const auto w = test_window(W);
    std::vector<int> seen(W - L + 1, 0);
    for (uint64_t seed = 0; seed < 2000; ++seed) {
        const Row r = sample_row(*s, w, L, seed);
        int o = -1;
        for (int p = 0; p + L <= W; ++p)
            if (w[p] == r.tokens[0] && w[p + 1] == r.tokens[1]) o = p;  // window tokens repeat mod 256 only
        ASSERT_GE(o, 0);
        seen[o] += 1;
        ASSERT_EQ(r.positions[0], 0.0f);
        for (int t = 0; t < L; ++t) {
            ASSERT_EQ(r.tokens[t], w[o + t]);
            ASSERT_EQ(r.targets[t], w[o + t + 1]);
            ASSERT_EQ(r.mask[t], 1.0f);
            if (t) {
                ASSERT_LT(r.positions[t - 1], r.positions[t]);
            }
        }
    }
    EXPECT_GT(seen.front(), 0);
    EXPECT_GT(seen.back(), 0);
    for (int c : seen) EXPECT_GT(c, 0) << "every offset 0 .. W-L occurs in 2000 rows";
    // row_len == window_len: the whole window whatever the span.
    const Row full = sample_row(*s, w, W, 3);
    EXPECT_EQ(full.tokens[0], w[0]);
    EXPECT_EQ(full.targets[W - 1], w[W]);
}

TEST(SamplerRandomized, StrictlyIncreasingAtLargePositionsWithTinyEps) {
    // Gaps down to 1e-6 at positions ~ 8000, where floats are 2^-11 apart: rounding alone would
    // collapse neighbours; the plugin keeps them strictly increasing.
    auto s = make_sampler("randomized", {{"eps", 1e-6}});
    const auto w = test_window(8192);
    for (uint64_t seed = 0; seed < 5; ++seed) {
        const Row r = sample_row(*s, w, 8192, seed);
        ASSERT_EQ(r.positions[0], 0.0f);
        for (int t = 1; t < 8192; ++t) ASSERT_LT(r.positions[t - 1], r.positions[t]) << t;
        EXPECT_NEAR(r.positions[8191], 8191 * (1.0 + 0.5e-6), 400.0);
    }
}

TEST(SamplerRandomized, DeterministicBySeed) {
    auto s = make_sampler("randomized");
    const auto w = test_window(200);
    const Row a = sample_row(*s, w, 64, 42), b = sample_row(*s, w, 64, 42);
    EXPECT_EQ(a.positions, b.positions);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.targets, b.targets);
    int differ = 0;
    for (uint64_t seed = 0; seed < 20; ++seed)
        differ += sample_row(*s, w, 64, seed).positions != a.positions;
    EXPECT_GE(differ, 19);
}

TEST(SamplerRandomized, OptionValidation) {
    for (double bad : {0.0, -0.5, 2.0, 3.0}) {
        const std::string msg = error_of([&] { make_sampler("randomized", {{"eps", bad}}); });
        EXPECT_TRUE(has(msg, "sampler/randomized") && has(msg, "option 'eps' must be in (0, 2)"))
            << msg;
    }
    EXPECT_EQ(error_of([] { make_sampler("randomized", {{"eps", 1.999}}); }), "");
    std::string msg = error_of([] { make_sampler("randomized", {{"eps", std::string("x")}}); });
    EXPECT_TRUE(has(msg, "option 'eps' expects a number")) << msg;
    msg = error_of([] { make_sampler("randomized", {{"span", std::string("end")}}); });
    EXPECT_TRUE(has(msg, "option 'span' must be \"start\" or \"random\", got \"end\"")) << msg;
    auto s = make_sampler("randomized");
    msg = error_of([&] { sample_row(*s, test_window(8), 9, 1); });
    EXPECT_TRUE(has(msg, "row_len 9 must be in [1, window_len = 8]")) << msg;
}
