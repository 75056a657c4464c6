// The synthetic long-document corpus: determinism, lengths, and the long-range recalls.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "data/corpus.h"

using namespace ctx;

namespace {

CorpusOptions small_options(uint64_t seed) {
    CorpusOptions o;
    o.n_docs = 12;
    o.seed = seed;
    return o;
}

bool ends_with(const std::string& s, size_t end, const std::string& suffix) {
    return end >= suffix.size() && s.compare(end - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

TEST(DataCorpus, DeterministicBySeed) {
    const auto a = generate_corpus(small_options(7));
    const auto b = generate_corpus(small_options(7));
    const auto c = generate_corpus(small_options(8));
    ASSERT_EQ(a.size(), 12u);
    int same_as_other_seed = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].text, b[i].text);
        EXPECT_EQ(a[i].recalls, b[i].recalls);
        same_as_other_seed += a[i].text == c[i].text;
    }
    EXPECT_EQ(same_as_other_seed, 0);
    EXPECT_NE(a[0].text, a[1].text) << "documents differ from each other";
    // A document depends on (options, index) only, not on how many are generated.
    EXPECT_EQ(generate_document(small_options(7), 5).text, a[5].text);
    EXPECT_EQ(a[0].text.rfind("Log 0: notes from ", 0), 0u);
    EXPECT_NE(a[0].text.find("Facts for the record:\nNote: "), std::string::npos);
}

TEST(DataCorpus, LengthsStayWithinBounds) {
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{2000, 12000}, {300, 400}, {50, 50},
                          {5000, 5100}}) {
        CorpusOptions o = small_options(3);
        o.n_docs = 20;
        o.min_len = lo;
        o.max_len = hi;
        int64_t min_seen = INT64_MAX, max_seen = 0;
        for (const auto& d : generate_corpus(o)) {
            const auto n = static_cast<int64_t>(d.text.size());
            min_seen = std::min(min_seen, n);
            max_seen = std::max(max_seen, n);
            EXPECT_GE(n, lo);
            EXPECT_LE(n, hi);
            for (const auto& r : d.recalls) EXPECT_LE(r.value_end, n);
        }
        if (hi - lo >= 1000) {
            EXPECT_GT(max_seen - min_seen, (hi - lo) / 2) << "lengths spread";
        }
    }
}

TEST(DataCorpus, RecallsAreFarFromTheirSourceAndPointAtTheValue) {
    CorpusOptions o = small_options(21);
    o.n_docs = 30;
    int64_t recalls = 0, beyond_4x64 = 0, questions = 0;
    std::set<std::string> values;
    for (const auto& d : generate_corpus(o)) {
        const std::string& t = d.text;
        for (const auto& r : d.recalls) {
            ++recalls;
            ASSERT_LT(r.source_end, r.value_begin);
            ASSERT_GE(r.distance(), o.min_distance) << "never closer than min_distance";
            beyond_4x64 += r.distance() > 4 * 64;
            const std::string value = t.substr(r.value_begin, r.value_end - r.value_begin);
            ASSERT_FALSE(value.empty());
            EXPECT_EQ(t.substr(r.source_begin, r.source_end - r.source_begin), value)
                << "the recalled value is the one stated earlier";
            values.insert(value);
            EXPECT_EQ(t[r.value_end], '.') << "the span covers the whole value";
            // The span starts right after the recall's prefix, and so does the source's.
            if (r.question) {
                ++questions;
                EXPECT_TRUE(ends_with(t, r.value_begin, "? Answer: "));
            } else {
                EXPECT_TRUE(ends_with(t, r.value_begin, " is "));
                const size_t line = t.rfind("Reminder: ", r.value_begin);
                ASSERT_NE(line, std::string::npos);
                EXPECT_EQ(t.find('.', line), static_cast<size_t>(r.value_end));
            }
            EXPECT_TRUE(ends_with(t, r.source_begin, " is ") ||
                        ends_with(t, r.source_begin, "? Answer: "));
        }
        // The text alone gives the same spans (for evaluation on decoded shards).
        EXPECT_EQ(find_recall_spans(t), d.recalls);
    }
    EXPECT_GT(recalls, 30 * 15) << "plenty of recalls per document";
    EXPECT_GT(beyond_4x64, recalls * 8 / 10) << "most recalls need more than 4 x 64 bytes";
    EXPECT_GT(questions, recalls / 5);
    EXPECT_LT(questions, recalls * 3 / 5);
    EXPECT_GT(values.size(), 200u) << "values are random, not a handful of constants";
}

TEST(DataCorpus, DistancesSpanTheConfiguredRange) {
    CorpusOptions o = small_options(5);
    o.n_docs = 20;
    o.facts_per_doc = 3;  // few enough that due recalls rarely queue for a sentence slot
    o.min_distance = 64;
    o.max_distance = 1024;
    int64_t n = 0, short_range = 0, long_range = 0;
    for (const auto& d : generate_corpus(o)) {
        for (const auto& r : d.recalls) {
            ++n;
            EXPECT_GE(r.distance(), 64);
            // Queued recalls may wait for a free sentence slot, so allow a little slack.
            EXPECT_LE(r.distance(), 1024 + 400);
            short_range += r.distance() < 256;
            long_range += r.distance() >= 512;
        }
    }
    ASSERT_GT(n, 100);
    // Log-uniform on [64, 1024]: P(< 256) = 1/2, P(>= 512) = 1/4, before recalls wait for the
    // next sentence slot (which only lengthens them).
    EXPECT_GT(short_range, n * 35 / 100);
    EXPECT_GT(long_range, n / 5);
}

TEST(DataCorpus, RecallRateAndFactsControlTheRecalls) {
    CorpusOptions o = small_options(9);
    o.recall_rate = 0.0;
    for (const auto& d : generate_corpus(o)) EXPECT_TRUE(d.recalls.empty());
    o.recall_rate = 0.9;
    o.facts_per_doc = 0;
    for (const auto& d : generate_corpus(o)) {
        EXPECT_TRUE(d.recalls.empty());
        EXPECT_EQ(d.n_facts, 0);
    }
}

TEST(DataCorpus, ValidatesOptions) {
    CorpusOptions o;
    o.min_len = 100;
    o.max_len = 50;
    EXPECT_THROW(generate_document(o, 0), Error);
    o = CorpusOptions{};
    o.recall_rate = 1.5;
    try {
        generate_document(o, 0);
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("recall_rate must be in [0, 1], got 1.5"),
                  std::string::npos) << e.what();
    }
}

TEST(DataCorpus, FarFractionAddsATailOfFarRecalls) {
    CorpusOptions o = small_options(11);
    o.n_docs = 30;
    o.facts_per_doc = 3;
    o.min_distance = 8;
    o.max_distance = 256;
    int64_t n = 0, far = 0;
    for (const auto& d : generate_corpus(o)) {
        for (const auto& r : d.recalls) far += r.distance() > 256 + 200, ++n;
    }
    EXPECT_LT(far, n / 20) << "without the tail, little waits past max_distance (queueing only)";
    o.far_fraction = 0.3;
    o.far_distance = 2048;
    int64_t n2 = 0, far2 = 0, beyond = 0;
    for (const auto& d : generate_corpus(o)) {
        for (const auto& r : d.recalls) {
            ++n2;
            far2 += r.distance() > 256 + 200;
            beyond += r.distance() > 2048 + 400;
        }
    }
    ASSERT_GT(n2, 200);
    // 30% of draws land in [256, 2048]; far recalls wait longer, so their share of the recalls
    // made is lower than their share of the draws, but far above the no-tail corpus's.
    EXPECT_GT(far2, n2 / 8);
    EXPECT_LT(far2, n2 * 3 / 10);
    EXPECT_EQ(beyond, 0) << "nothing past far_distance (plus a queueing slack)";
    o.far_distance = 100;
    EXPECT_THROW(generate_document(o, 0), Error) << "far_distance below max_distance";
}

// local_repeat: a filler name recurs within its paragraph; 0 leaves the corpus as it was (no
// extra random draws).
TEST(DataCorpus, LocalRepeatMakesNamesRecurWithinParagraphs) {
    const auto repeats = [](double p) {
        CorpusOptions o = small_options(13);
        o.n_docs = 10;
        o.facts_per_doc = 1;
        o.local_repeat = p;
        int64_t same = 0, pairs = 0;
        for (const auto& d : generate_corpus(o)) {
            size_t at = 0;
            while ((at = d.text.find("\n\n", at)) != std::string::npos) {
                const size_t end = d.text.find("\n\n", at + 2);
                const std::string para =
                    d.text.substr(at, end == std::string::npos ? std::string::npos : end - at);
                // names that open a filler sentence: "X said that ...", "X walked to ..."
                std::vector<std::string> names;
                for (const char* verb : {" said that", " walked to"}) {
                    size_t k = 0;
                    while ((k = para.find(verb, k)) != std::string::npos) {
                        size_t b = k;
                        while (b > 0 && para[b - 1] != ' ' && para[b - 1] != '\n') --b;
                        names.push_back(para.substr(b, k - b));
                        k += 3;
                    }
                }
                for (size_t i = 0; i < names.size(); ++i)
                    for (size_t j = i + 1; j < names.size(); ++j) same += names[i] == names[j], ++pairs;
                at += 2;
            }
        }
        return pairs ? static_cast<double>(same) / static_cast<double>(pairs) : 0.0;
    };
    const double none = repeats(0.0), strong = repeats(0.9);
    EXPECT_LT(none, 0.15) << "30 names drawn at random rarely coincide";
    EXPECT_GT(strong, 0.6) << "the paragraph's own name most of the time";
}
