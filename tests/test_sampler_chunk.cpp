// sampler/chunk (METHODS.md 2.2) through the real plugin and the host wrapper.
#include <gtest/gtest.h>

#include <map>

#include "sampler_fixtures.h"

using namespace ctx;
using namespace ctx::test;

namespace {

// Segment starts of a row: the positions at offsets 0, s, 2s, ...
std::vector<int> starts_of(const Row& r, int k, int s) {
    std::vector<int> a;
    for (int i = 0; i < k; ++i) a.push_back(static_cast<int>(r.positions[i * s]));
    return a;
}

// Every placement of k non-overlapping length-s segments in W tokens, in lexicographic order.
void enumerate(int W, int k, int s, std::vector<int>& cur, std::vector<std::vector<int>>& out) {
    if (static_cast<int>(cur.size()) == k) {
        out.push_back(cur);
        return;
    }
    const int lo = cur.empty() ? 0 : cur.back() + s;
    const int left = k - static_cast<int>(cur.size());  // segments still to place, this one too
    for (int a = lo; a + left * s <= W; ++a) {
        cur.push_back(a);
        enumerate(W, k, s, cur, out);
        cur.pop_back();
    }
}

std::vector<std::vector<int>> placements(int W, int k, int s) {
    std::vector<std::vector<int>> out;
    std::vector<int> cur;
    enumerate(W, k, s, cur, out);
    return out;
}

double chi_square(const std::vector<double>& observed, const std::vector<double>& expected) {
    double c = 0;
    for (size_t i = 0; i < observed.size(); ++i)
        c += (observed[i] - expected[i]) * (observed[i] - expected[i]) / expected[i];
    return c;
}

}  // namespace

TEST(SamplerChunk, SegmentsAreContiguousOrderedAndOriginal) {
    auto s = make_sampler("chunk");  // alpha 0.25: 4 segments
    const int W = 64, L = 16, k = 4, seg = 4;
    const auto w = test_window(W);
    for (uint64_t seed = 0; seed < 300; ++seed) {
        const Row r = sample_row(*s, w, L, seed);
        ASSERT_EQ(r.tokens.size(), static_cast<size_t>(L));
        for (int t = 0; t < L; ++t) {
            const int p = static_cast<int>(r.positions[t]);
            ASSERT_EQ(r.positions[t], static_cast<float>(p)) << "integral original position";
            ASSERT_GE(p, 0);
            ASSERT_LT(p, W);
            ASSERT_EQ(r.tokens[t], w[p]) << "token at position p is window[p]";
            if (t > 0) {
                ASSERT_LT(r.positions[t - 1], r.positions[t]) << "strictly increasing";
            }
            if (t % seg != 0) {
                ASSERT_EQ(r.positions[t], r.positions[t - 1] + 1) << "contiguous";
            }
        }
        const auto a = starts_of(r, k, seg);
        for (int i = 1; i < k; ++i) ASSERT_GE(a[i], a[i - 1] + seg) << "non-overlapping";
        ASSERT_LE(a[k - 1] + seg, W);
    }
}

TEST(SamplerChunk, BoundaryTargetsPerMode) {
    auto concat = make_sampler("chunk", {{"alpha", 0.25}});
    auto next = make_sampler("chunk", {{"alpha", 0.25}, {"boundary", std::string("next")}});
    auto mask = make_sampler("chunk", {{"alpha", 0.25}, {"boundary", std::string("mask")}});
    const int W = 64, L = 16, seg = 4;
    const auto w = test_window(W);
    int discontinuities = 0;
    for (uint64_t seed = 0; seed < 100; ++seed) {
        const Row c = sample_row(*concat, w, L, seed);
        const Row n = sample_row(*next, w, L, seed);
        const Row m = sample_row(*mask, w, L, seed);
        // The boundary mode does not touch the random stream: same placement in every mode.
        ASSERT_EQ(c.positions, n.positions);
        ASSERT_EQ(c.positions, m.positions);
        ASSERT_EQ(c.tokens, n.tokens);
        for (int t = 0; t < L; ++t) {
            const int p = static_cast<int>(c.positions[t]);
            const bool boundary = t % seg == seg - 1 && t != L - 1;
            if (!boundary) {  // inside a segment, and the row's last token, in every mode
                for (const Row* r : {&c, &n, &m}) {
                    ASSERT_EQ(r->targets[t], w[p + 1]) << "t=" << t;
                    ASSERT_EQ(r->mask[t], 1.0f) << "t=" << t;
                }
                continue;
            }
            const int next_start = static_cast<int>(c.positions[t + 1]);
            EXPECT_EQ(c.targets[t], w[next_start]) << "concat: the next segment's first token";
            EXPECT_EQ(c.mask[t], 1.0f);
            EXPECT_EQ(n.targets[t], w[p + 1]) << "next: the true next token";
            EXPECT_EQ(n.mask[t], 1.0f);
            EXPECT_EQ(m.targets[t], w[p + 1]) << "mask: the true next token, untrained";
            EXPECT_EQ(m.mask[t], 0.0f);
            discontinuities += next_start != p + 1;
        }
        EXPECT_EQ(c.targets[L - 1], w[static_cast<int>(c.positions[L - 1]) + 1]);
    }
    EXPECT_GT(discontinuities, 200) << "most boundaries jump in a window 4x the row";
}

TEST(SamplerChunk, ExactRowWhenThePlacementIsForced) {
    // W == L: the only placement is the whole window, segments [0,4) [4,8); with boundary
    // "mask" index 3 is the only untrained target.
    auto s = make_sampler("chunk", {{"alpha", 0.5}, {"boundary", std::string("mask")}});
    const std::vector<int32_t> w = {10, 11, 12, 13, 14, 15, 16, 17, 18};
    const Row r = sample_row(*s, w, 8, 3);
    EXPECT_EQ(r.tokens, (std::vector<int32_t>{10, 11, 12, 13, 14, 15, 16, 17}));
    EXPECT_EQ(r.positions, (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
    EXPECT_EQ(r.targets, (std::vector<int32_t>{11, 12, 13, 14, 15, 16, 17, 18}));
    EXPECT_EQ(r.mask, (std::vector<float>{1, 1, 1, 0, 1, 1, 1, 1}));
}

TEST(SamplerChunk, DeterministicBySeed) {
    auto s = make_sampler("chunk", {{"alpha", 0.125}});
    const auto w = test_window(200);
    const Row a = sample_row(*s, w, 64, 42), b = sample_row(*s, w, 64, 42);
    EXPECT_EQ(a.positions, b.positions);
    EXPECT_EQ(a.targets, b.targets);
    int differ = 0;
    for (uint64_t seed = 0; seed < 20; ++seed)
        differ += sample_row(*s, w, 64, seed).positions != a.positions;
    EXPECT_GE(differ, 19);
}

// The joint distribution of the placement, against the uniform one over all C(free + k, k)
// placements (enumerated): W = 12, L = 4, alpha = 0.5 -> 2 segments of 2, 45 placements.
TEST(SamplerChunk, PlacementIsUniformOverAllPlacements) {
    auto s = make_sampler("chunk", {{"alpha", 0.5}});
    const int W = 12, L = 4, k = 2, seg = 2;
    const auto all = placements(W, k, seg);
    ASSERT_EQ(all.size(), 45u);  // C(8 + 2, 2)
    std::map<std::vector<int>, int> index;
    for (size_t i = 0; i < all.size(); ++i) index[all[i]] = static_cast<int>(i);
    const auto w = test_window(W);
    const int N = 45 * 400;
    std::vector<double> observed(all.size(), 0.0);
    for (int i = 0; i < N; ++i) {
        const auto a = starts_of(sample_row(*s, w, L, 0xC0FFEEull + i), k, seg);
        ASSERT_TRUE(index.count(a));
        observed[index[a]] += 1;
    }
    const std::vector<double> uniform(all.size(), static_cast<double>(N) / all.size());
    const double chi2 = chi_square(observed, uniform);
    EXPECT_LT(chi2, chi2_q999(44)) << "44 degrees of freedom";
    // Power check: sorting two independent draws from [0, free] (free = 8) puts probability
    // 2/81 on each placement with distinct v = a - i*s values and 1/81 on equal ones; the same
    // counts must reject that distribution.
    std::vector<double> sorted_iid;
    for (const auto& a : all) sorted_iid.push_back(N * (a[0] == a[1] - seg ? 1.0 : 2.0) / 81.0);
    EXPECT_GT(chi_square(observed, sorted_iid), 3 * chi2_q999(44));
}

// Each start's marginal against the exact one from enumeration: W = 16, L = 8, alpha = 0.25 ->
// 4 segments of 2, C(12, 4) = 495 placements, every start takes 9 values.
TEST(SamplerChunk, EachStartMarginalMatchesStarsAndBars) {
    auto s = make_sampler("chunk", {{"alpha", 0.25}, {"boundary", std::string("next")}});
    const int W = 16, L = 8, k = 4, seg = 2;
    const auto all = placements(W, k, seg);
    ASSERT_EQ(all.size(), 495u);
    std::vector<std::map<int, double>> expected(k);
    for (const auto& a : all)
        for (int i = 0; i < k; ++i) expected[i][a[i]] += 1.0 / all.size();
    const auto w = test_window(W);
    const int N = 20000;
    std::vector<std::map<int, double>> observed(k);
    for (int n = 0; n < N; ++n) {
        const auto a = starts_of(sample_row(*s, w, L, 0xBEEFull * (n + 1)), k, seg);
        for (int i = 0; i < k; ++i) observed[i][a[i]] += 1;
    }
    // Exact 0.999 quantile for 8 degrees of freedom (9 values per start).
    for (int i = 0; i < k; ++i) {
        ASSERT_EQ(expected[i].size(), 9u);
        std::vector<double> o, e;
        for (const auto& [v, p] : expected[i]) {
            o.push_back(observed[i].count(v) ? observed[i][v] : 0.0);
            e.push_back(p * N);
        }
        double total = 0;
        for (double x : o) total += x;
        EXPECT_EQ(total, N) << "start " << i << " fell outside its valid range";
        EXPECT_LT(chi_square(o, e), 26.12) << "start " << i;
    }
    // The first start's marginal is far from uniform (P(a_0 = 0) = C(11,3)/495 = 1/3).
    EXPECT_NEAR(expected[0][0], 165.0 / 495.0, 1e-12);
}

TEST(SamplerChunk, ManySmallSegmentsAndASingleSegment) {
    const auto w = test_window(4096);
    auto many = make_sampler("chunk", {{"alpha", 1.0 / 256}});
    const Row r = sample_row(*many, w, 1024, 9);  // 256 segments of 4
    for (int t = 1; t < 1024; ++t) ASSERT_LT(r.positions[t - 1], r.positions[t]);
    for (int t = 0; t < 1024; ++t) ASSERT_EQ(r.tokens[t], w[static_cast<int>(r.positions[t])]);

    auto one = make_sampler("chunk", {{"alpha", 1.0}});  // one contiguous span, anywhere
    const Row c = sample_row(*one, w, 100, 4);
    const int o = static_cast<int>(c.positions[0]);
    for (int t = 0; t < 100; ++t) {
        ASSERT_EQ(c.positions[t], static_cast<float>(o + t));
        ASSERT_EQ(c.targets[t], w[o + t + 1]);
        ASSERT_EQ(c.mask[t], 1.0f);
    }
}

TEST(SamplerChunk, OptionValidation) {
    auto has = [](const std::string& msg, const std::string& part) {
        return msg.find(part) != std::string::npos;
    };
    std::string msg = error_of([] { make_sampler("chunk", {{"alpha", 0.3}}); });
    EXPECT_TRUE(has(msg, "sampler/chunk") && has(msg, "option 'alpha' = 0.3: 1/alpha")) << msg;
    msg = error_of([] { make_sampler("chunk", {{"alpha", 0.0}}); });
    EXPECT_TRUE(has(msg, "option 'alpha' must be in (0, 1], got 0")) << msg;
    msg = error_of([] { make_sampler("chunk", {{"alpha", 2.0}}); });
    EXPECT_TRUE(has(msg, "option 'alpha' must be in (0, 1], got 2")) << msg;
    msg = error_of([] { make_sampler("chunk", {{"boundary", std::string("wrap")}}); });
    EXPECT_TRUE(has(msg, "option 'boundary' must be \"concat\", \"next\" or \"mask\", got "
                         "\"wrap\"")) << msg;
    msg = error_of([] { make_sampler("chunk", {{"alpha", std::string("quarter")}}); });
    EXPECT_TRUE(has(msg, "option 'alpha' expects a number")) << msg;
    msg = error_of([] { make_sampler("chunk", {{"alhpa", 0.25}}); });
    EXPECT_TRUE(has(msg, "unknown option 'alhpa'")) << msg;
    EXPECT_EQ(error_of([] { make_sampler("chunk", {{"alpha", 0.1}}); }), "") << "1/0.1 = 10";

    // alpha * row_len must be an integer: known only at sample time.
    auto s = make_sampler("chunk", {{"alpha", 0.25}});
    const auto w = test_window(64);
    msg = error_of([&] { sample_row(*s, w, 10, 1); });
    EXPECT_TRUE(has(msg, "sampler/chunk: sample failed (status 1): option 'alpha' = 0.25: "
                         "alpha * row_len = 2.5 must be an integer")) << msg;
    msg = error_of([&] { sample_row(*s, w, 68, 1); });
    EXPECT_TRUE(has(msg, "row_len 68 must be in [1, window_len = 64]")) << msg;
}
