// The byte-level BPE trainer (data/bpe_train.h): merges checked by hand on a tiny corpus and
// against a naive re-count-everything reference on random corpora; the tokenizer.json it writes
// loads with the engine's BPE loader and round-trips any text; determinism; errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "core/error.h"
#include "data/bpe_byte_map.h"
#include "data/bpe_pretokenize.h"
#include "data/bpe_train.h"
#include "data/tokenizer.h"

namespace ctx {
namespace {

std::string train(const std::vector<std::string>& texts, int32_t vocab, int64_t min_freq = 2) {
    BpeTrainOptions o;
    o.vocab_size = vocab;
    o.min_frequency = min_freq;
    BpeTrainer t(o);
    for (const auto& s : texts) t.add(s);
    return t.train();
}

// The merges of a tokenizer.json as byte strings.
std::vector<std::pair<std::string, std::string>> merges_of(const std::string& json) {
    const auto j = nlohmann::json::parse(json);
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& m : j["model"]["merges"]) {
        std::string a, b;
        EXPECT_TRUE(bpe::byte_map().decode(m[0].get<std::string>(), a));
        EXPECT_TRUE(bpe::byte_map().decode(m[1].get<std::string>(), b));
        out.emplace_back(a, b);
    }
    return out;
}

std::unique_ptr<Tokenizer> load_json(const std::string& json, const std::string& name) {
    const auto path = std::filesystem::temp_directory_path() / ("ctx_bpe_train_" + name + ".json");
    std::ofstream(path) << json;
    return load_tokenizer(path.string());
}

// A naive trainer for reference: after every merge, recount every adjacent pair of every word
// from scratch, take the largest count, ties to the smaller (left id, right id).
std::vector<std::pair<std::string, std::string>> naive_merges(const std::vector<std::string>& texts,
                                                              int32_t vocab, int64_t min_freq) {
    std::map<std::string, int64_t> counts;
    bpe::PreTokens pieces;
    for (const auto& t : texts) {
        pieces.clear();
        bpe::PreTokenizer::gpt2().run(t, pieces);
        for (auto p : pieces.pieces) ++counts[std::string(p)];
    }
    std::vector<std::string> text_of;
    std::map<std::string, int32_t> id_of;
    for (int b = 0; b < 256; ++b) {
        text_of.emplace_back(1, static_cast<char>(b));
        id_of[text_of.back()] = b;
    }
    std::vector<std::pair<std::vector<int32_t>, int64_t>> words;
    for (const auto& [w, n] : counts) {
        std::vector<int32_t> s;
        for (unsigned char c : w) s.push_back(c);
        words.emplace_back(s, n);
    }
    std::vector<std::pair<std::string, std::string>> out;
    while (static_cast<int32_t>(text_of.size()) < vocab - 1) {  // one special token
        std::map<std::pair<int32_t, int32_t>, int64_t> pc;
        for (const auto& [s, n] : words)
            for (size_t i = 0; i + 1 < s.size(); ++i) pc[{s[i], s[i + 1]}] += n;
        std::pair<int32_t, int32_t> best{-1, -1};
        int64_t best_n = 0;
        for (const auto& [p, n] : pc)  // map order: smaller pair first, so ">" keeps it on ties
            if (n > best_n) best = p, best_n = n;
        if (best_n < min_freq) break;
        const std::string joined = text_of[best.first] + text_of[best.second];
        int32_t z;
        if (id_of.count(joined)) {
            z = id_of[joined];
        } else {
            z = static_cast<int32_t>(text_of.size());
            text_of.push_back(joined);
            id_of[joined] = z;
        }
        out.emplace_back(text_of[best.first], text_of[best.second]);
        for (auto& [s, n] : words) {
            std::vector<int32_t> t;
            for (size_t i = 0; i < s.size(); ++i) {
                if (i + 1 < s.size() && s[i] == best.first && s[i + 1] == best.second) {
                    t.push_back(z);
                    ++i;
                } else {
                    t.push_back(s[i]);
                }
            }
            s = t;
        }
    }
    return out;
}

// "abab" x3 and "ab" x2 (pre-tokens " abab", " ab": the space is part of the piece).
// Pairs: (' ',a) 5, (a,b) 3*2+2 = 8, (b,a) 3: first merge a+b; then (' ',ab) 5, (ab,ab) 3;
// then ' '+ab, then ' ab'+ab. With vocab 256 + 4 + 1 special that is all.
TEST(BpeTrain, MergesFollowPairCountsByHand) {
    const std::string json = train({"abab abab abab ab ab"}, 256 + 4 + 1);
    const auto m = merges_of(json);
    ASSERT_EQ(m.size(), 3u) << "only 3 merges reach min_frequency 2";
    EXPECT_EQ(m[0], std::make_pair(std::string("a"), std::string("b")));
    EXPECT_EQ(m[1], std::make_pair(std::string(" "), std::string("ab")));
    EXPECT_EQ(m[2], std::make_pair(std::string(" ab"), std::string("ab")));
    auto tok = load_json(json, "hand");
    // " abab" is one token now; "abab" (no space) is "ab" "ab".
    EXPECT_EQ(tok->encode(" abab").size(), 1u);
    EXPECT_EQ(tok->encode("abab").size(), 2u);
    EXPECT_EQ(tok->vocab_size(), 256 + 3 + 1);
    EXPECT_EQ(tok->eos_id(), 259);  // the special token follows the merges
}

TEST(BpeTrain, IncrementalCountsEqualANaiveRecount) {
    std::mt19937 rng(7);
    const std::vector<std::string> words = {"the", "cat", "catalog", "at", "a", "tea", "eat",
                                            "12", "123", "1234", "ate", "théâtre", "x"};
    for (int trial = 0; trial < 6; ++trial) {
        std::vector<std::string> texts;
        for (int d = 0; d < 5; ++d) {
            std::string t;
            const int n = 20 + static_cast<int>(rng() % 60);
            for (int i = 0; i < n; ++i) {
                if (i) t += (rng() % 7 == 0) ? ", " : " ";
                t += words[rng() % words.size()];
            }
            texts.push_back(t);
        }
        const int32_t vocab = 256 + 1 + 10 + static_cast<int32_t>(rng() % 40);
        const int64_t min_freq = 1 + rng() % 3;
        EXPECT_EQ(merges_of(train(texts, vocab, min_freq)), naive_merges(texts, vocab, min_freq))
            << "trial " << trial;
    }
}

TEST(BpeTrain, TrainedTokenizerRoundTripsAnyTextAndCompresses) {
    std::vector<std::string> texts;
    for (int i = 0; i < 50; ++i)
        texts.push_back("Note: the vault code of Harbor Station is " + std::to_string(10000 + i * 37) +
                        ". Reminder: the vault code of Harbor Station is " +
                        std::to_string(10000 + i * 37) + ".\n");
    const std::string json = train(texts, 400);
    auto tok = load_json(json, "roundtrip");
    for (const std::string& t : {texts[3], std::string("unseen words: zebra, ünïcödé ✓ 日本"),
                                 std::string("\n\n  tabs\tand spaces  "), std::string("")}) {
        const auto ids = tok->encode(t);
        EXPECT_EQ(tok->decode(ids), t);
    }
    const auto ids = tok->encode(texts[0]);
    EXPECT_LT(ids.size() * 3, texts[0].size()) << "frequent phrases become few tokens";
    EXPECT_EQ(tok->encode(" Harbor").size(), 1u);
    EXPECT_EQ(tok->encode(" Station").size(), 1u);
}

TEST(BpeTrain, DeterministicAndIndependentOfInsertionOrderOfEqualWords) {
    const std::vector<std::string> a = {"one two three two one", "three three two"};
    const std::vector<std::string> b = {"three three two", "one two three two one"};
    EXPECT_EQ(train(a, 280), train(a, 280));
    EXPECT_EQ(train(a, 280), train(b, 280)) << "only word counts matter";
}

TEST(BpeTrain, StopsAtTheVocabularySizeOrMinFrequency) {
    std::string text;
    for (int i = 0; i < 200; ++i) text += "alpha beta gamma delta epsilon " + std::to_string(i) + " ";
    BpeTrainOptions o;
    o.vocab_size = 300;
    BpeTrainer t(o);
    t.add(text);
    const auto j = nlohmann::json::parse(t.train());
    EXPECT_EQ(t.vocab_size(), 300);
    EXPECT_EQ(j["model"]["vocab"].size(), 300u);
    EXPECT_EQ(t.num_merges(), 300 - 256 - 1);
    // With a huge vocabulary it stops once no pair occurs twice: fewer merges than slots.
    o.vocab_size = 5000;
    BpeTrainer t2(o);
    t2.add("abc abd");
    t2.train();
    EXPECT_LT(t2.vocab_size(), 5000);
    // pieces "abc" and " abd": only (a, b) occurs twice
    EXPECT_EQ(t2.num_merges(), 1);
}

TEST(BpeTrain, ClearErrors) {
    BpeTrainOptions o;
    o.vocab_size = 200;
    try {
        BpeTrainer t(o);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("vocab_size must be in [257,"), std::string::npos)
            << e.what();
    }
    o.vocab_size = 300;
    o.min_frequency = 0;
    EXPECT_THROW(BpeTrainer{o}, Error);
    o.min_frequency = 2;
    BpeTrainer t(o);
    try {
        t.add(std::string("ok \xff bad"));
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not valid UTF-8 (byte offset 3)"), std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace ctx
