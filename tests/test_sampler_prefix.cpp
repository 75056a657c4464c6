// sampler/prefix (METHODS.md 2.3) through the real plugin and the host wrapper.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "sampler_fixtures.h"

using namespace ctx;
using namespace ctx::test;

namespace {

double chi_square(const std::vector<double>& observed, const std::vector<double>& expected) {
    double c = 0;
    for (size_t i = 0; i < observed.size(); ++i)
        c += (observed[i] - expected[i]) * (observed[i] - expected[i]) / expected[i];
    return c;
}

bool has(const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos;
}

// Checks one row of prefix-alpha with prefix length m and suffix length s against the window;
// returns the suffix start i.
int check_row(const Row& r, const std::vector<int32_t>& w, int W, int m, int s) {
    const int L = m + s;
    EXPECT_EQ(r.tokens.size(), static_cast<size_t>(L));
    const int i = static_cast<int>(r.positions[m]);
    EXPECT_GT(i, m) << "(1-alpha)*Lt < i";
    EXPECT_LT(i, W - s) << "i < Le - alpha*Lt";
    for (int t = 0; t < L; ++t) {
        const int p = static_cast<int>(r.positions[t]);
        EXPECT_EQ(r.positions[t], static_cast<float>(p)) << "integral original position";
        EXPECT_GE(p, 0);
        EXPECT_EQ(r.tokens[t], w[p]) << "token at position p is window[p], t=" << t;
        EXPECT_EQ(r.targets[t], w[p + 1]) << "every target is the true next token, t=" << t;
        if (t < m) {
            EXPECT_EQ(r.mask[t], 0.0f) << "prefix is never trained, t=" << t;
            EXPECT_LT(p, i) << "prefix positions lie before the suffix";
            if (t > 0) {
                EXPECT_LT(r.positions[t - 1], r.positions[t]) << "strictly increasing";
            }
        } else {
            EXPECT_EQ(r.mask[t], 1.0f) << "suffix is trained, t=" << t;
            EXPECT_EQ(p, i + (t - m)) << "suffix contiguous with original positions";
        }
    }
    return i;
}

}  // namespace

TEST(SamplerPrefix, RowStructureMaskAndTargets) {
    auto s = make_sampler("prefix");  // alpha 0.25
    const int W = 64, L = 16, m = 12, sl = 4;
    const auto w = test_window(W);
    int trained = 0;
    for (uint64_t seed = 0; seed < 300; ++seed) {
        const Row r = sample_row(*s, w, L, seed);
        check_row(r, w, W, m, sl);
        if (HasFailure()) FAIL() << "seed " << seed;
        // The invariant: the prefix never trains a target that is not the true next
        // token, i.e. every mask-1 target is window[p + 1].
        for (int t = 0; t < L; ++t) {
            if (r.mask[t] != 0.0f) {
                ASSERT_EQ(r.targets[t], w[static_cast<int>(r.positions[t]) + 1]);
                ++trained;
            }
        }
        EXPECT_EQ(std::count(r.mask.begin(), r.mask.end(), 1.0f), sl) << "exactly alpha*Lt";
    }
    EXPECT_EQ(trained, 300 * sl);
}

TEST(SamplerPrefix, HalfAndFullAlpha) {
    const auto w = test_window(200);
    auto half = make_sampler("prefix", {{"alpha", 0.5}});
    for (uint64_t seed = 0; seed < 50; ++seed) check_row(sample_row(*half, w, 64, seed), w, 200, 32, 32);
    // alpha = 1: no prefix, the whole row is one trained contiguous span starting at i >= 1.
    auto all = make_sampler("prefix", {{"alpha", 1.0}});
    for (uint64_t seed = 0; seed < 50; ++seed) check_row(sample_row(*all, w, 64, seed), w, 200, 0, 64);
    // Long rows (Floyd over a large [0, i)).
    const auto big = test_window(4096);
    const Row r = sample_row(*half, big, 1024, 11);
    check_row(r, big, 4096, 512, 512);
}

// i is uniform over {m+1 .. Le-s-1}: Le = 64, Lt = 16, alpha = 0.25 -> i in 13..59, 47 values.
TEST(SamplerPrefix, SuffixStartIsUniform) {
    auto s = make_sampler("prefix", {{"alpha", 0.25}});
    const int W = 64, L = 16, m = 12, sl = 4;
    const int lo = m + 1, hi = W - sl - 1, n = hi - lo + 1;
    ASSERT_EQ(n, 47);
    const auto w = test_window(W);
    const int N = n * 300;
    std::vector<double> observed(n, 0.0);
    for (int k = 0; k < N; ++k) {
        const int i = static_cast<int>(sample_row(*s, w, L, 0x5EEDull + k).positions[m]);
        ASSERT_GE(i, lo);
        ASSERT_LE(i, hi);
        observed[i - lo] += 1;
    }
    const std::vector<double> expected(n, static_cast<double>(N) / n);
    EXPECT_LT(chi_square(observed, expected), chi2_q999(n - 1)) << "46 degrees of freedom";
    // Power: a start biased towards the end (weight proportional to i - m, the number of
    // admissible prefix sets grows with i) must be rejected by the same counts.
    std::vector<double> linear(n);
    double z = 0;
    for (int k = 0; k < n; ++k) z += k + 1;
    for (int k = 0; k < n; ++k) linear[k] = N * (k + 1) / z;
    EXPECT_GT(chi_square(observed, linear), 3 * chi2_q999(n - 1));
}

// The joint law of (i, prefix set) against the exact one: Le = 7, Lt = 4, alpha = 0.5 -> s = 2,
// m = 2, i in {3, 4} with probability 1/2 each, then a uniform 2-subset of [0, i): 3 + 6 = 9
// outcomes with probabilities 1/6 and 1/12.
TEST(SamplerPrefix, PrefixSetIsUniformWithoutReplacement) {
    auto s = make_sampler("prefix", {{"alpha", 0.5}});
    const int W = 7, L = 4, m = 2;
    std::map<std::vector<int>, double> expected;
    for (int i = 3; i <= 4; ++i) {
        const double subsets = i * (i - 1) / 2.0;
        for (int a = 0; a < i; ++a)
            for (int b = a + 1; b < i; ++b) expected[{a, b, i}] = 0.5 / subsets;
    }
    ASSERT_EQ(expected.size(), 9u);
    const auto w = test_window(W);
    const int N = 18000;
    std::map<std::vector<int>, double> observed;
    for (int k = 0; k < N; ++k) {
        const Row r = sample_row(*s, w, L, 0xABCDull * (k + 1));
        const std::vector<int> key = {static_cast<int>(r.positions[0]),
                                      static_cast<int>(r.positions[1]),
                                      static_cast<int>(r.positions[m])};
        ASSERT_TRUE(expected.count(key)) << key[0] << " " << key[1] << " " << key[2];
        observed[key] += 1;
    }
    std::vector<double> o, e;
    for (const auto& [key, p] : expected) {
        o.push_back(observed[key]);
        e.push_back(p * N);
    }
    EXPECT_LT(chi_square(o, e), 26.12) << "exact 0.999 quantile, 8 degrees of freedom";
}

TEST(SamplerPrefix, ExactRowWhenTheDrawIsForced) {
    // Le = Lt + 2 and alpha = 1: i = 1 is the only start, the row is x[1..4].
    auto s = make_sampler("prefix", {{"alpha", 1.0}});
    const std::vector<int32_t> w = {10, 11, 12, 13, 14, 15, 16};
    const Row r = sample_row(*s, w, 4, 5);
    EXPECT_EQ(r.tokens, (std::vector<int32_t>{11, 12, 13, 14}));
    EXPECT_EQ(r.positions, (std::vector<float>{1, 2, 3, 4}));
    EXPECT_EQ(r.targets, (std::vector<int32_t>{12, 13, 14, 15}));
    EXPECT_EQ(r.mask, (std::vector<float>{1, 1, 1, 1}));
    // alpha = 0.5, Lt = 2, Le = 4: i = 2, suffix x[2], prefix one of {0, 1}.
    auto h = make_sampler("prefix", {{"alpha", 0.5}});
    const std::vector<int32_t> w4 = {10, 11, 12, 13, 14};
    const Row q = sample_row(*h, w4, 2, 8);
    EXPECT_EQ(q.positions[1], 2.0f);
    EXPECT_EQ(q.tokens[1], 12);
    EXPECT_EQ(q.targets[1], 13);
    EXPECT_EQ(q.mask, (std::vector<float>{0, 1}));
    EXPECT_LT(q.positions[0], 2.0f);
}

TEST(SamplerPrefix, DeterministicBySeed) {
    auto s = make_sampler("prefix", {{"alpha", 0.25}});
    const auto w = test_window(200);
    const Row a = sample_row(*s, w, 64, 42), b = sample_row(*s, w, 64, 42);
    EXPECT_EQ(a.positions, b.positions);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.targets, b.targets);
    EXPECT_EQ(a.mask, b.mask);
    int differ = 0;
    for (uint64_t seed = 0; seed < 20; ++seed)
        differ += sample_row(*s, w, 64, seed).positions != a.positions;
    EXPECT_GE(differ, 19);
}

TEST(SamplerPrefix, OptionValidation) {
    std::string msg = error_of([] { make_sampler("prefix", {{"alpha", 0.0}}); });
    EXPECT_TRUE(has(msg, "sampler/prefix") && has(msg, "option 'alpha' must be in (0, 1], got 0"))
        << msg;
    msg = error_of([] { make_sampler("prefix", {{"alpha", 1.5}}); });
    EXPECT_TRUE(has(msg, "option 'alpha' must be in (0, 1], got 1.5")) << msg;
    msg = error_of([] { make_sampler("prefix", {{"alpha", -0.25}}); });
    EXPECT_TRUE(has(msg, "option 'alpha' must be in (0, 1], got -0.25")) << msg;
    msg = error_of([] { make_sampler("prefix", {{"alpha", std::string("quarter")}}); });
    EXPECT_TRUE(has(msg, "option 'alpha' expects a number")) << msg;
    msg = error_of([] { make_sampler("prefix", {{"alhpa", 0.25}}); });
    EXPECT_TRUE(has(msg, "unknown option 'alhpa'")) << msg;
    EXPECT_EQ(error_of([] { make_sampler("prefix", {{"alpha", 0.3}}); }), "")
        << "any alpha in (0, 1]; integrality depends on row_len";

    // alpha * row_len must be an integer: known only at sample time.
    auto s = make_sampler("prefix", {{"alpha", 0.25}});
    const auto w = test_window(64);
    msg = error_of([&] { sample_row(*s, w, 10, 1); });
    EXPECT_TRUE(has(msg, "sampler/prefix: sample failed (status 1): option 'alpha' = 0.25: "
                         "alpha * row_len = 2.5 must be a positive integer")) << msg;
    auto t = make_sampler("prefix", {{"alpha", 0.1}});
    EXPECT_EQ(error_of([&] { sample_row(*t, w, 30, 1); }), "") << "0.1 * 30 = 3 (decimal input)";
    msg = error_of([&] { sample_row(*s, w, 68, 1); });
    EXPECT_TRUE(has(msg, "row_len 68 must be in [1, window_len = 64]")) << msg;
    // An empty range for i: Le = Lt + 1 = 17 needs 12 < i < 13, no integer.
    const auto w17 = test_window(17);
    msg = error_of([&] { sample_row(*s, w17, 16, 1); });
    EXPECT_TRUE(has(msg, "no valid suffix start") && has(msg, "Lt = row_len = 16") &&
                has(msg, "Le = window_len = 17")) << msg;
    msg = error_of([&] { sample_row(*s, test_window(16), 16, 1); });
    EXPECT_TRUE(has(msg, "no valid suffix start")) << msg;
    EXPECT_EQ(error_of([&] { sample_row(*s, test_window(18), 16, 1); }), "") << "Le = Lt + 2";
}
