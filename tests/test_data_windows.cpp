// METHODS.md 3.1 windowing and document splits.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "data/windows.h"

using namespace ctx;

TEST(DataWindows, CountsAreFloorOfNMinusOneOverLe) {
    const std::vector<int64_t> lengths = {0, 1, 8, 9, 16, 17, 25, 100};
    const std::vector<int64_t> expect = {0, 0, 0, 1, 1, 2, 3, 12};
    for (size_t d = 0; d < lengths.size(); ++d)
        EXPECT_EQ(windows_in_doc(lengths[d], 8), expect[d]) << "n = " << lengths[d];
    std::vector<int64_t> all = {0, 1, 2, 3, 4, 5, 6, 7};
    const auto w = make_windows(lengths, 8, all);
    EXPECT_EQ(w.size(), 19u);
    // Short documents (n <= Le) are dropped; windows follow document order then k.
    EXPECT_EQ(w.front(), (Window{3, 0}));
    EXPECT_EQ(w[1], (Window{4, 0}));
    EXPECT_EQ(w[2], (Window{5, 0}));
    EXPECT_EQ(w[3], (Window{5, 8}));
    EXPECT_EQ(w.back(), (Window{7, 88}));
}

TEST(DataWindows, CoverageIsNonOverlappingAndTheRemainderIsDiscarded) {
    const int64_t Le = 10;
    for (int64_t n : {11, 20, 21, 37, 101}) {
        const auto w = make_windows({n}, Le, {0});
        std::vector<int> trained(static_cast<size_t>(n), 0), read(static_cast<size_t>(n), 0);
        for (const Window& x : w) {
            for (int64_t t = x.start; t < x.start + Le; ++t) ++trained[static_cast<size_t>(t)];
            for (int64_t t = x.start; t <= x.start + Le; ++t) ++read[static_cast<size_t>(t)];
        }
        const int64_t k = static_cast<int64_t>(w.size());
        for (int64_t t = 0; t < n; ++t) {
            // Trained tokens: exactly [0, k*Le), each once; the rest is the discarded remainder
            // (token k*Le is still read as the last window's final target).
            EXPECT_EQ(trained[static_cast<size_t>(t)], t < k * Le ? 1 : 0) << n << " " << t;
            if (t > k * Le) {
                EXPECT_EQ(read[static_cast<size_t>(t)], 0) << n << " " << t;
            }
        }
        EXPECT_LE(k * Le, n - 1) << "the last target exists";
        EXPECT_LT(n - 1 - k * Le, Le) << "less than a window discarded";
    }
}

TEST(DataWindows, SubsetsAndDocStoresAgree) {
    MemoryDocs docs({std::vector<int32_t>(30, 1), std::vector<int32_t>(5, 2),
                     std::vector<int32_t>(17, 3)},
                    259);
    EXPECT_EQ(make_windows(docs, 8), make_windows({30, 5, 17}, 8, {0, 1, 2}));
    const auto sub = make_windows({30, 5, 17}, 8, {2, 0});
    ASSERT_EQ(sub.size(), 5u);  // doc 2 first (2 windows), then doc 0 (3)
    EXPECT_EQ(sub[0], (Window{2, 0}));
    EXPECT_EQ(sub[2], (Window{0, 0}));
    EXPECT_THROW(make_windows({30}, 0, {0}), Error);
    EXPECT_THROW(make_windows({30}, 8, {1}), Error);
}

TEST(DataWindows, SplitIsByDocumentAndDeterministic) {
    const auto s = split_documents(1000, 0.1, 0.05, 17);
    EXPECT_EQ(s.val.size(), 100u);
    EXPECT_EQ(s.test.size(), 50u);
    EXPECT_EQ(s.train.size(), 850u);
    std::set<int64_t> seen;
    for (const auto* part : {&s.train, &s.val, &s.test}) {
        EXPECT_TRUE(std::is_sorted(part->begin(), part->end()));
        for (int64_t d : *part) EXPECT_TRUE(seen.insert(d).second) << "doc " << d << " twice";
    }
    EXPECT_EQ(seen.size(), 1000u);
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), 999);

    const auto again = split_documents(1000, 0.1, 0.05, 17);
    EXPECT_EQ(again.train, s.train);
    EXPECT_EQ(again.val, s.val);
    EXPECT_EQ(again.test, s.test);
    EXPECT_NE(split_documents(1000, 0.1, 0.05, 18).val, s.val);
    // Not simply the first or last documents.
    EXPECT_GT(s.val.back() - s.val.front(), 500);

    // Windows of different splits never share a document.
    std::vector<int64_t> lengths(1000);
    for (size_t d = 0; d < lengths.size(); ++d) lengths[d] = 10 + static_cast<int64_t>(d % 50);
    std::set<int64_t> train_docs;
    for (const Window& w : make_windows(lengths, 8, s.train)) train_docs.insert(w.doc);
    for (const Window& w : make_windows(lengths, 8, s.val)) EXPECT_EQ(train_docs.count(w.doc), 0u);
}

TEST(DataWindows, SplitEdgeCases) {
    const auto none = split_documents(0, 0.1, 0.0, 1);
    EXPECT_TRUE(none.train.empty() && none.val.empty() && none.test.empty());
    const auto all_val = split_documents(7, 1.0, 0.0, 1);
    EXPECT_EQ(all_val.val.size(), 7u);
    EXPECT_TRUE(all_val.train.empty());
    EXPECT_EQ(split_documents(7, 0.0, 0.0, 1).train.size(), 7u);
    EXPECT_THROW(split_documents(10, 0.7, 0.4, 1), Error);
    EXPECT_THROW(split_documents(10, -0.1, 0.0, 1), Error);
}
