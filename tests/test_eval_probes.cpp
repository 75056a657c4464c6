// eval/passkey and eval/ruler_niah (METHODS.md 5.4): the prompt generators (structure, token
// length within one token of the target for the byte tokenizer and a BPE fixture, depth,
// determinism), the scoring rules, the option errors and the records against a scripted host
// (model-free, probe_mock_host.h), and both tasks end to end through the real host on a tiny
// byte-level model trained for a few steps.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <set>
#include <lua.hpp>

#include "model/optimizer.h"
#include "probe_mock_host.h"

// The plugins' host-free parts, compiled into this test directly.
#include "../plugins/eval/passkey/passkey_prompt.cpp"
#include "../plugins/eval/ruler_niah/niah_prompt.cpp"
#include "../plugins/eval/common/probe_runner.h"
#include "lua/options.h"
#include "lua/runtime.h"

namespace ctx {
namespace {

using namespace probe_test;

ctx_retrieval::CountTokens counter(const Tokenizer& t) {
    return [&t](const std::string& s) { return count_with(t, s); };
}

size_t occurrences(const std::string& text, const std::string& part) {
    size_t n = 0;
    for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
    return n;
}

// What a model that copies perfectly from its attention span would answer: the key sentence is
// seen when it starts within the last `window` tokens (0: always).
bool visible(const std::string& prompt, size_t offset, int32_t window) {
    if (window == 0) return true;
    const Tokenizer& t = *g_mock->tok;
    return count_with(t, prompt) - count_with(t, prompt.substr(0, offset)) <= window;
}

std::string passkey_answer(const std::string& prompt, int32_t window) {
    std::smatch m;
    if (!std::regex_search(prompt, m, std::regex("The pass key is ([0-9]+)\\. Remember it")))
        return " none";
    return visible(prompt, static_cast<size_t>(m.position(0)), window) ? " " + m[1].str() + "."
                                                                       : " 0.";
}

// All values of visible needles whose key the question asks for.
std::string niah_answer(const std::string& prompt, int32_t window) {
    const size_t q = prompt.rfind("What are all");
    const std::string question = prompt.substr(q);
    std::string out;
    const std::regex needle("One of the special magic [a-z]+ for ([a-z-]+) is: ([^ ]+)\\.");
    for (auto it =
             std::sregex_iterator(prompt.begin(), prompt.begin() + static_cast<long>(q), needle);
         it != std::sregex_iterator(); ++it)
        if (question.find((*it)[1].str()) != std::string::npos &&
            visible(prompt, static_cast<size_t>(it->position(0)), window))
            out.append(" ").append((*it)[2].str());
    return out;
}

// ================================================================ passkey generator
TEST(PasskeyGenerator, PromptStructure) {
    const Tokenizer& bt = byte_tokenizer();
    for (double depth : {0.0, 0.3, 1.0}) {
        const passkey::PasskeyPrompt p = passkey::make_prompt(700, depth, 11, "", counter(bt));
        EXPECT_GE(p.key, 1);
        EXPECT_LE(p.key, passkey::kMaxKey);
        const std::string key = passkey::key_sentence(p.key);
        EXPECT_EQ(key, "The pass key is " + std::to_string(p.key) + ". Remember it. " +
                           std::to_string(p.key) + " is the pass key.");
        EXPECT_EQ(occurrences(p.text, key), 1u);
        EXPECT_EQ(occurrences(p.text, "pass key is"), 2u);  // the key sentence and the prefix
        EXPECT_EQ(p.text.find(std::string(passkey::kTaskLine) + "\n"), 0u);
        EXPECT_EQ(p.text.substr(p.text.size() - 38), "\nWhat is the pass key? The pass key is");
        EXPECT_EQ(p.text.find(key), p.key_offset);
        // between the task line and the question: the key sentence and pieces of the repeated
        // filler (whole sentences before the key, a cut at the end)
        std::string rest = p.text.substr(std::strlen(passkey::kTaskLine) + 1);
        rest = rest.substr(0, rest.size() - 38);
        rest.replace(rest.find(key), key.size(), "");
        std::string filler = passkey::kFiller;
        for (int i = 0; i < 40; ++i) filler += std::string(" ") + passkey::kFiller;
        for (size_t b = 0, e; b < rest.size(); b = e + 1) {
            e = rest.find('\n', b);
            if (e == std::string::npos) e = rest.size();
            if (e > b) {
                EXPECT_NE(filler.find(rest.substr(b, e - b)), std::string::npos)
                    << rest.substr(b, e - b);
            }
        }
    }
    // K covers [1, 50000]
    int64_t lo = passkey::kMaxKey, hi = 1;
    for (uint64_t s = 0; s < 3000; ++s) {
        uint64_t rng[4];
        ctx_rng_seed(rng, s);
        const int64_t k =
            1 + static_cast<int64_t>(ctx_retrieval::uniform_below(rng, passkey::kMaxKey));
        lo = std::min(lo, k), hi = std::max(hi, k);
    }
    EXPECT_LT(lo, 100);
    EXPECT_GT(hi, 49900);
}

TEST(PasskeyGenerator, LengthWithinOneTokenByteAndBpe) {
    for (const Tokenizer* t : {&byte_tokenizer(), &bpe_tokenizer()}) {
        const bool bpe = t == &bpe_tokenizer();
        for (int64_t target : {bpe ? 140 : 260, 333, 1000, 4099}) {
            for (double depth : {0.0, 0.1, 0.5, 0.77, 1.0}) {
                for (uint64_t seed : {1, 2}) {
                    const auto p = passkey::make_prompt(target, depth, seed, "", counter(*t));
                    const int64_t n = count_with(*t, p.text);
                    EXPECT_EQ(n, p.tokens);
                    EXPECT_LE(n, target) << t->name() << " target " << target << " depth " << depth;
                    EXPECT_GE(n, target - 1)
                        << t->name() << " target " << target << " depth " << depth;
                }
            }
        }
    }
    // the BPE fixture really merges: far fewer tokens than bytes
    const auto p = passkey::make_prompt(1000, 0.5, 3, "", counter(bpe_tokenizer()));
    EXPECT_GT(static_cast<double>(p.text.size()), 2.5 * static_cast<double>(p.tokens));
}

TEST(PasskeyGenerator, DepthPlacesTheKeySentence) {
    for (const Tokenizer* t : {&byte_tokenizer(), &bpe_tokenizer()}) {
        for (double depth : {0.0, 0.25, 0.5, 0.75, 1.0}) {
            const auto p = passkey::make_prompt(3000, depth, 5, "", counter(*t));
            // one sentence of filler (< 25 bytes) is the placement's granularity
            EXPECT_NEAR(p.needle_depth, depth, 0.03) << t->name() << " depth " << depth;
            const size_t start = std::strlen(passkey::kTaskLine) + 1;
            const size_t end = p.text.size() - 38;
            const double byte_depth =
                static_cast<double>(p.key_offset - start) /
                static_cast<double>(end - start - passkey::key_sentence(p.key).size());
            EXPECT_NEAR(byte_depth, depth, 0.03) << depth;
            if (depth == 0.0) {
                EXPECT_EQ(p.key_offset, start);  // right after the task line
            } else if (depth == 1.0) {           // right before the question
                EXPECT_EQ(p.key_offset + passkey::key_sentence(p.key).size(), end);
            } else {  // at a sentence start of the filler
                EXPECT_EQ(p.text.substr(p.key_offset - 2, 2), ".\n");
            }
        }
    }
}

TEST(PasskeyGenerator, DeterministicBySeed) {
    const auto c = counter(bpe_tokenizer());
    EXPECT_EQ(passkey::make_prompt(500, 0.4, 9, "", c).text,
              passkey::make_prompt(500, 0.4, 9, "", c).text);
    std::set<int64_t> keys;
    for (uint64_t s = 0; s < 20; ++s) keys.insert(passkey::make_prompt(300, 0.4, s, "", c).key);
    EXPECT_GT(keys.size(), 15u);
    // through the plugin: the same options give the same prompts, another seed others
    const auto run = [](int seed) {
        return run_mock("passkey",
                        "{ token_lengths = {400}, depths = {0.5}, per_setting = 3, "
                        "windowed = false, seed = " +
                            std::to_string(seed) + " }")
            .mock.prompts;
    };
    const auto a = run(4), b = run(4), d = run(5);
    ASSERT_EQ(a.size(), 3u);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, d);
    EXPECT_NE(a[0], a[1]);  // items of a setting differ
}

TEST(PasskeyGenerator, ChatTemplateWrapsBeforeTheAnswerPrefix) {
    const auto p =
        passkey::make_prompt(600, 0.5, 1, "USER: {prompt} ASSISTANT:", counter(byte_tokenizer()));
    EXPECT_EQ(p.text.rfind("USER: There is an important info", 0), 0u);
    EXPECT_EQ(p.text.substr(p.text.size() - 48),
              "What is the pass key? ASSISTANT: The pass key is");
    EXPECT_LE(p.tokens, 600);
    EXPECT_GE(p.tokens, 599);
    try {
        passkey::make_prompt(100, 0.5, 1, "", counter(byte_tokenizer()));
        FAIL() << "no error";
    } catch (const ctx_retrieval::TaskError& e) {
        EXPECT_NE(std::string(e.what()).find("alone has"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("more than the target 100"), std::string::npos);
    }
}

// ================================================================ RULER generator
struct NiahCase {
    niah::Variant variant;
    niah::HaystackKind haystack;
    size_t gold, needles;  // gold values; needle sentences in the prompt (haystack excluded)
};

TEST(NiahGenerator, NeedlesPerVariant) {
    using V = niah::Variant;
    using H = niah::HaystackKind;
    const NiahCase cases[] = {{V::Single, H::Noise, 1, 1},
                              {V::MultiKey, H::Noise, 1, 4},
                              {V::MultiValue, H::Noise, 4, 4},
                              {V::MultiQuery, H::Noise, 4, 4}};
    const std::regex needle(
        "One of the special magic numbers for ([a-z]+-[a-z]+) is: ([0-9]{7})\\.");
    for (const NiahCase& c : cases) {
        const niah::Spec spec{c.variant, c.haystack, niah::ValueType::Numbers};
        const auto p =
            niah::make_prompt(spec, 1500, 0.5, 3, "", counter(byte_tokenizer()), nullptr);
        SCOPED_TRACE(niah::variant_name(c.variant));
        ASSERT_EQ(p.gold.size(), c.gold);
        std::map<std::string, std::vector<std::string>> by_key;
        for (auto it = std::sregex_iterator(p.text.begin(), p.text.end(), needle);
             it != std::sregex_iterator(); ++it)
            by_key[(*it)[1]].push_back((*it)[2]);
        size_t n = 0;
        for (const auto& [k, vs] : by_key) n += vs.size();
        EXPECT_EQ(n, c.needles);
        for (const std::string& g : p.gold)
            EXPECT_EQ(occurrences(p.text, " is: " + g + "."), 1u) << g;
        // the question asks for the gold keys, the answer prefix ends the prompt
        const std::string q =
            p.text.substr(p.text.rfind("\nWhat are all the special magic numbers for "));
        for (const std::string& k : p.keys) {
            EXPECT_NE(q.find(k), std::string::npos);
            EXPECT_EQ(by_key.count(k), 1u);
        }
        EXPECT_NE(q.find(" mentioned in the provided text? The special magic numbers for "),
                  std::string::npos);
        EXPECT_EQ(q.substr(q.size() - 35), " mentioned in the provided text are");
        EXPECT_EQ(p.keys.size(), c.variant == V::MultiQuery ? 4u : 1u);
        EXPECT_EQ(by_key.size(), c.variant == V::MultiKey || c.variant == V::MultiQuery ? 4u : 1u);
        EXPECT_EQ(p.tf_answer.empty(), c.variant == V::MultiValue || c.variant == V::MultiQuery);
        if (c.variant == V::MultiQuery) {
            EXPECT_NE(q.find(", and "), std::string::npos);
        }
        // the first gold needle at the depth, at a sentence start
        EXPECT_NEAR(p.needle_depth, 0.5, 0.03);
        EXPECT_EQ(p.text.substr(p.gold_offset - 2, 2), ".\n");
        EXPECT_EQ(p.text.find(niah::needle_sentence(spec.value_type, p.keys[0], p.gold[0])),
                  p.gold_offset);
    }
}

TEST(NiahGenerator, AllNeedleHaystack) {
    const niah::Spec spec{niah::Variant::MultiKey, niah::HaystackKind::Needle,
                          niah::ValueType::Uuids};
    const auto p = niah::make_prompt(spec, 2000, 0.3, 8, "", counter(byte_tokenizer()), nullptr);
    const std::regex needle(
        "One of the special magic uuids for ([a-z]+-[a-z]+) is: ([0-9a-f-]{36})\\.");
    size_t n = 0, gold = 0;
    for (auto it = std::sregex_iterator(p.text.begin(), p.text.end(), needle);
         it != std::sregex_iterator(); ++it, ++n)
        gold += (*it)[1] == p.keys[0];
    EXPECT_GT(n, 15u);    // the haystack is needles
    EXPECT_EQ(gold, 1u);  // only one with the asked key
    EXPECT_NEAR(p.needle_depth, 0.3, 0.05);
    EXPECT_EQ(p.tf_answer, " " + p.gold[0]);
}

TEST(NiahGenerator, EssayHaystackAtSentenceStarts) {
    // a made-up essay with a multi-byte character so a cut must respect UTF-8
    const std::string essay =
        "Gardens need patience. A seed sown in spring may not show itself until the rains "
        "come? Even then the shoots are small! The café owner down the road says the same of "
        "bread.\nShe bakes at four every morning.";
    for (const Tokenizer* t : {&byte_tokenizer(), &bpe_tokenizer()}) {
        for (double depth : {0.0, 0.4, 0.9}) {
            ctx_retrieval::Haystack h([&](std::string& s) {
                if (!s.empty()) s += "\n\n";
                s += essay;
                return true;
            });
            const niah::Spec spec{niah::Variant::Single, niah::HaystackKind::Essay,
                                  niah::ValueType::Words};
            const auto p = niah::make_prompt(spec, 700, depth, 2, "", counter(*t), &h);
            EXPECT_LE(p.tokens, 700);
            EXPECT_GE(p.tokens, 699);
            EXPECT_NE(p.text.find("Gardens need patience."), std::string::npos);
            const char before = p.text[p.gold_offset - 2];
            EXPECT_TRUE(before == '.' || before == '?' || before == '!' ||
                        p.text[p.gold_offset - 2] == '\n' || depth == 0.0)
                << p.text.substr(p.gold_offset - 20, 40);
            EXPECT_NEAR(p.needle_depth, depth, 0.1);
        }
    }
    EXPECT_THROW(niah::make_prompt({niah::Variant::Single, niah::HaystackKind::Essay, {}}, 500, 0.5,
                                   1, "", counter(byte_tokenizer()), nullptr),
                 ctx_retrieval::TaskError);
}

TEST(NiahGenerator, VariableTrackingChain) {
    const niah::Spec spec{niah::Variant::VariableTracking, niah::HaystackKind::Noise, {}};
    for (double depth : {0.0, 0.6, 1.0}) {
        const auto p =
            niah::make_prompt(spec, 1200, depth, 4, "", counter(byte_tokenizer()), nullptr);
        ASSERT_EQ(p.gold.size(), 5u);
        const std::string& v = p.keys[0];
        EXPECT_GE(std::stoi(v), 10000);
        EXPECT_LE(std::stoi(v), 99999);
        std::set<std::string> names(p.gold.begin(), p.gold.end());
        EXPECT_EQ(names.size(), 5u);
        for (const std::string& n : p.gold)
            EXPECT_TRUE(std::regex_match(n, std::regex("[A-Z]{5}"))) << n;
        // in chain order: VAR A = v, then VAR B = VAR A, ...
        size_t at = p.text.find("VAR " + p.gold[0] + " = " + v + "\n");
        ASSERT_NE(at, std::string::npos);
        EXPECT_EQ(at, p.gold_offset);
        for (int i = 1; i < 5; ++i) {
            const size_t next = p.text.find("VAR " + p.gold[i] + " = VAR " + p.gold[i - 1] + "\n");
            ASSERT_NE(next, std::string::npos);
            EXPECT_GT(next, at);
            at = next;
        }
        EXPECT_EQ(occurrences(p.text, "VAR "), 9u);  // 5 statements (4 of them naming 2)
        EXPECT_NE(p.text.find("Question: Find all variables that are assigned the value " + v +
                              " in the text above."),
                  std::string::npos);
        EXPECT_TRUE(p.tf_answer.empty());
        EXPECT_NEAR(p.needle_depth, depth, 0.05);
    }
}

TEST(NiahGenerator, ValueTypes) {
    uint64_t rng[4];
    ctx_rng_seed(rng, 1);
    std::set<std::string> words;
    for (int i = 0; i < 2000; ++i) {
        const std::string n = niah::random_value(niah::ValueType::Numbers, rng);
        EXPECT_TRUE(std::regex_match(n, std::regex("[1-9][0-9]{6}"))) << n;
        const std::string u = niah::random_value(niah::ValueType::Uuids, rng);
        EXPECT_TRUE(std::regex_match(
            u, std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")))
            << u;
        words.insert(niah::random_value(niah::ValueType::Words, rng));
        EXPECT_TRUE(std::regex_match(niah::random_key(rng), std::regex("[a-z]+-[a-z]+")));
    }
    EXPECT_EQ(words.size(), static_cast<size_t>(ctx_retrieval::kNumValueWords));  // all reachable
}

TEST(NiahGenerator, WordListsNeverLeakAValue) {
    // no value word inside a key word or the fixed texts, so echoing them scores nothing
    std::string fixed = std::string(niah::kNoise) + niah::header(niah::ValueType::Words) +
                        niah::kChainHeader +
                        " What are all the special magic words for mentioned in the provided "
                        "text? The special magic words for are Question: Find all variables that "
                        "are assigned the value in the text above. Answer: The variables";
    std::set<std::string> seen;
    for (int64_t i = 0; i < ctx_retrieval::kNumValueWords; ++i) {
        const std::string v = ctx_retrieval::kValueWords[i];
        EXPECT_TRUE(seen.insert(v).second) << v;
        EXPECT_FALSE(ctx_retrieval::contains_ignore_case(fixed, v)) << v;
        for (const char* w : ctx_retrieval::kAdjectives)
            EXPECT_EQ(std::string(w).find(v), std::string::npos) << v;
        for (const char* w : ctx_retrieval::kNouns)
            EXPECT_EQ(std::string(w).find(v), std::string::npos) << v;
    }
}

TEST(NiahGenerator, LengthWithinOneTokenAndDeterministic) {
    using V = niah::Variant;
    for (const Tokenizer* t : {&byte_tokenizer(), &bpe_tokenizer()}) {
        for (V v : {V::Single, V::MultiKey, V::MultiValue, V::MultiQuery, V::VariableTracking}) {
            for (niah::ValueType vt : {niah::ValueType::Numbers, niah::ValueType::Uuids}) {
                for (int64_t target : {777, 2048}) {
                    const niah::Spec spec{v, niah::HaystackKind::Noise, vt};
                    const auto p =
                        niah::make_prompt(spec, target, 0.35, 6, "", counter(*t), nullptr);
                    EXPECT_EQ(count_with(*t, p.text), p.tokens);
                    EXPECT_LE(p.tokens, target) << niah::variant_name(v) << " " << t->name();
                    EXPECT_GE(p.tokens, target - 1) << niah::variant_name(v) << " " << t->name();
                    const auto again =
                        niah::make_prompt(spec, target, 0.35, 6, "", counter(*t), nullptr);
                    EXPECT_EQ(again.text, p.text);
                    const auto other =
                        niah::make_prompt(spec, target, 0.35, 7, "", counter(*t), nullptr);
                    EXPECT_NE(other.gold, p.gold);
                }
            }
        }
    }
}

// ================================================================ scoring
TEST(ProbeScoring, NiahFractionOfGoldFound) {
    EXPECT_EQ(niah::score_output("the value is 1234567.", {"1234567"}), 1.0);
    EXPECT_EQ(niah::score_output("SAXOPHONE and Marigold", {"saxophone", "marigold"}),
              1.0);  // case
    EXPECT_EQ(niah::score_output("1111111, 2222222", {"1111111", "3333333", "2222222", "4444444"}),
              0.5);
    EXPECT_EQ(niah::score_output("", {"1111111"}), 0.0);
    EXPECT_EQ(niah::score_output("no digits", {"1111111", "2222222"}), 0.0);
    const std::string uuid = "1b4e28ba-2fa1-41d2-883f-0016d3cca427";
    EXPECT_EQ(niah::score_output(" 1B4E28BA-2FA1-41D2-883F-0016D3CCA427.", {uuid}), 1.0);
    EXPECT_EQ(niah::score_output(" 1b4e28ba-2fa1-41d2-883f-0016d3cca42", {uuid}),
              0.0);                                               // cut short
    EXPECT_EQ(niah::score_output("12345678", {"1234567"}), 1.0);  // a substring, as RULER's rule
    EXPECT_EQ(niah::score_output("ABCDE FGHIJ", {"abcde", "fghij", "klmno", "pqrst", "uvwxy"}),
              0.4);
}

TEST(ProbeScoring, PasskeyFirstIntegerThroughThePlugin) {
    // scripted outputs: right, no integer, a wrong integer first, K glued to more digits
    int call = 0;
    const Result r =
        run_mock("passkey",
                 "{ token_lengths = {300}, depths = {0.5}, per_setting = 4, "
                 "windowed = false, teacher_forced = false }",
                 [&](Mock& m) {
                     m.respond = [&](const std::string& p, int32_t) {
                         const std::string k = passkey_answer(p, 0);
                         const std::string key = k.substr(1, k.size() - 2);
                         const std::string outs[] = {" " + key + ".", " I forgot.",
                                                     " 12, no, " + key, " " + key + "0"};
                         return outs[call++ % 4];
                     };
                 });
    ASSERT_EQ(r.status, CTX_OK) << r.error;
    const auto items = r.of("passkey_items");
    ASSERT_EQ(items.size(), 4u);
    const double want[] = {1, 0, 0, 0};
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(items[i].num.at("correct"), want[i]) << i;
    EXPECT_EQ(items[1].num.at("predicted"), -1);
    EXPECT_EQ(items[2].num.at("predicted"), 12);
    EXPECT_EQ(items[3].num.at("predicted"), items[3].num.at("expected") * 10);
    EXPECT_TRUE(std::isnan(items[0].num.at("tf_correct")));
    EXPECT_DOUBLE_EQ(r.of("passkey")[0].num.at("accuracy"), 0.25);
}

TEST(ProbeScoring, EffectiveLengthRule) {
    using ctx_retrieval::effective_length;
    EXPECT_EQ(effective_length({{100, 100}, {200, 90}, {400, 80}, {800, 95}}, 85.6), 200);
    EXPECT_EQ(effective_length({{100, 80}, {200, 90}}, 85.6), 0);  // the shortest already fails
    EXPECT_EQ(effective_length({{100, 85.6}, {200, 85.6}}, 85.6), 200);  // at the threshold passes
    EXPECT_EQ(effective_length({{100, 50}, {200, 40}, {400, 39}}, 0.8 * 50), 200);
}

// ================================================================ the plugins on the mock
TEST(PasskeyPlugin, RecordsAndWindowedControl) {
    const Result r =
        run_mock("passkey",
                 "{ token_lengths = {300, 900}, depths = {0, 0.5, 1}, per_setting = 2, "
                 "window = 320, max_new_tokens = 8 }",
                 [](Mock& m) { m.respond = passkey_answer; });
    ASSERT_EQ(r.status, CTX_OK) << r.error;
    const auto items = r.of("passkey_items"), sets = r.of("passkey"),
               lens = r.of("passkey_by_length");
    ASSERT_EQ(items.size(), 12u);
    ASSERT_EQ(sets.size(), 6u);
    ASSERT_EQ(lens.size(), 2u);
    for (const Rec& s : sets) {
        const double len = s.num.at("length"), depth = s.num.at("depth");
        EXPECT_EQ(s.num.at("items"), 2);
        EXPECT_EQ(s.num.at("accuracy"), 1.0);  // full attention sees the key everywhere
        EXPECT_EQ(s.num.at("window"), 320);
        EXPECT_EQ(s.num.at("multiple"), len / 64);
        if (len == 900) {
            EXPECT_NEAR(s.num.at("needle_depth"), depth, 0.05);
        }
        EXPECT_LE(s.num.at("mean_prompt_tokens"), len);
        EXPECT_GE(s.num.at("mean_prompt_tokens"), len - 1);
        // windowed: at 300 tokens everything fits the window (reused), at 900 only a deep key
        const double want = len == 300 || depth == 1 ? 1.0 : 0.0;
        EXPECT_EQ(s.num.at("windowed_accuracy"), want) << len << " " << depth;
        EXPECT_EQ(s.str.count("task"), 0u);
    }
    for (const Rec& it : items) {
        EXPECT_EQ(it.num.at("predicted"), it.num.at("expected"));
        EXPECT_EQ(it.num.at("correct"), 1);
        EXPECT_EQ(it.str.at("output"),
                  " " + std::to_string(static_cast<int64_t>(it.num.at("expected"))) + ".");
    }
    // full generation in 2 x 3 calls (3 settings per length, 2 items each); windowed only at 900
    int windowed_calls = 0;
    for (const auto& q : r.mock.gen_reqs) {
        EXPECT_EQ(q.max_new_tokens, 8);
        windowed_calls += q.window == 320;
    }
    EXPECT_EQ(windowed_calls, 3);
    EXPECT_EQ(lens[0].num.at("items"), 6);
    EXPECT_DOUBLE_EQ(lens[1].num.at("windowed_accuracy"), 1.0 / 3);
}

TEST(PasskeyPlugin, TeacherForcedScores) {
    const Result r = run_mock("passkey",
                              "{ token_lengths = {300, 500}, depths = {0.5}, per_setting = 3, "
                              "window = 400, generate = false }");
    ASSERT_EQ(r.status, CTX_OK) << r.error;
    EXPECT_TRUE(r.mock.gen_reqs.empty());
    for (const Rec& it : r.of("passkey_items")) {
        const double answer_tokens =
            1 + std::to_string(static_cast<int64_t>(it.num.at("expected"))).size();
        EXPECT_EQ(it.num.at("tf_correct"), 1);
        EXPECT_FLOAT_EQ(it.num.at("logprob"), -0.25 * answer_tokens);
        // the mock's windowed argmax is wrong: only rows longer than the window are rescored
        EXPECT_EQ(it.num.at("windowed_tf_correct"), it.num.at("length") == 300 ? 1 : 0);
        EXPECT_TRUE(std::isnan(it.num.at("correct")));
        EXPECT_TRUE(std::isnan(it.num.at("predicted")));
    }
    for (const auto& q : r.mock.score_reqs) {
        EXPECT_TRUE(q.window == 0 || q.window == 400);
        EXPECT_GE(q.row_len, 300);
    }
    const auto sets = r.of("passkey");
    ASSERT_EQ(sets.size(), 2u);
    EXPECT_EQ(sets[0].num.at("tf_accuracy"), 1);
    EXPECT_EQ(sets[1].num.at("windowed_tf_accuracy"), 0);
    EXPECT_TRUE(std::isnan(sets[0].num.at("accuracy")));
    // effective lengths: tf 500 (all right), windowed tf 300 (fails at 500); relative the same
    std::map<std::string, Rec> eff;
    for (const Rec& e : r.of("passkey_effective_length")) eff[e.str.at("metric")] = e;
    ASSERT_EQ(eff.size(), 2u);  // accuracy was not measured
    EXPECT_EQ(eff["tf_accuracy"].num.at("effective_length"), 500);
    EXPECT_EQ(eff["windowed_tf_accuracy"].num.at("effective_length"), 300);
    EXPECT_EQ(eff["windowed_tf_accuracy"].num.at("relative_effective_length"), 300);
    EXPECT_EQ(eff["tf_accuracy"].num.at("threshold"), 85.6);
    EXPECT_EQ(eff["tf_accuracy"].num.at("shortest_score"), 100);
}

TEST(RulerPlugin, EveryVariantOnAPerfectCopier) {
    for (const char* variant : {"single", "multikey", "multivalue", "multiquery"}) {
        const Result r = run_mock("ruler_niah",
                                  std::string("{ variant = '") + variant +
                                      "', token_lengths = {900}, num_depths = 3, per_setting = 2, "
                                      "max_new_tokens = 200, windowed = false }",
                                  [](Mock& m) { m.respond = niah_answer; });
        ASSERT_EQ(r.status, CTX_OK) << variant << ": " << r.error;
        const auto sets = r.of("ruler_niah");
        ASSERT_EQ(sets.size(), 3u);
        for (const Rec& s : sets) {
            EXPECT_EQ(s.num.at("accuracy"), 1.0) << variant;
            EXPECT_EQ(s.str.at("variant"), variant);
            EXPECT_EQ(s.str.at("haystack"), "noise");
            EXPECT_LE(s.num.at("mean_prompt_tokens"), 700);  // 900 - max_new_tokens
            EXPECT_GE(s.num.at("mean_prompt_tokens"), 699);
            const bool tf = std::string(variant) == "single" || std::string(variant) == "multikey";
            EXPECT_EQ(std::isnan(s.num.at("tf_accuracy")), !tf) << variant;
        }
        EXPECT_EQ(sets[0].order.front(), "variant");  // labels lead every record
        EXPECT_EQ(r.of("ruler_niah_items").size(), 6u);
        EXPECT_EQ(r.of("ruler_niah_by_length").size(), 1u);
        EXPECT_TRUE(r.of("ruler_niah_effective_length").empty());  // one length only
    }
    // a copier that gets half of the multivalue values: partial credit
    const Result half = run_mock("ruler_niah",
                                 "{ variant = 'multivalue', token_lengths = {900}, "
                                 "depths = {0.2}, max_new_tokens = 100, windowed = false }",
                                 [](Mock& m) {
                                     m.respond = [](const std::string& p, int32_t w) {
                                         const std::string all = niah_answer(p, w);
                                         return all.substr(0, 16);  // two 7-digit values
                                     };
                                 });
    ASSERT_EQ(half.status, CTX_OK) << half.error;
    EXPECT_DOUBLE_EQ(half.of("ruler_niah")[0].num.at("accuracy"), 0.5);
}

TEST(RulerPlugin, EssayFromTheDocumentsAndVariableTracking) {
    const std::string essay = "Rivers carve valleys over long years. Stones roll and settle. ";
    std::string text;
    for (int i = 0; i < 30; ++i) text += essay;
    const Result r =
        run_mock("ruler_niah",
                 "{ haystack = 'essay', value_type = 'words', token_lengths = {600, 1200}, "
                 "num_depths = 2, per_setting = 1, max_new_tokens = 20, window = 500 }",
                 [&](Mock& m) {
                     m.docs = {byte_tokenizer().encode(text), byte_tokenizer().encode(text)};
                     m.respond = niah_answer;
                 });
    ASSERT_EQ(r.status, CTX_OK) << r.error;
    ASSERT_FALSE(r.mock.prompts.empty());
    EXPECT_NE(r.mock.prompts[0].find("Rivers carve valleys"), std::string::npos);
    EXPECT_EQ(r.of("ruler_niah")[0].str.at("value_type"), "words");
    EXPECT_EQ(r.of("ruler_niah_effective_length").size(), 4u);  // two lengths, four metrics
    const Result none = run_mock("ruler_niah", "{ haystack = 'essay', token_lengths = {600} }");
    EXPECT_NE(none.error.find("haystack \"essay\" needs held-out documents"), std::string::npos)
        << none.error;

    const Result vt = run_mock("ruler_niah",
                               "{ variant = 'vt', token_lengths = {700}, depths = {0.1}, "
                               "per_setting = 2, windowed = false }",
                               [](Mock& m) {
                                   m.respond = [](const std::string& p, int32_t) {
                                       std::string out;  // the five names, upper case
                                       const std::regex var("VAR ([A-Z]{5}) =");
                                       for (auto it = std::sregex_iterator(p.begin(), p.end(), var);
                                            it != std::sregex_iterator(); ++it)
                                           out.append(" ").append((*it)[1].str());
                                       return out;
                                   };
                               });
    ASSERT_EQ(vt.status, CTX_OK) << vt.error;
    EXPECT_EQ(vt.of("ruler_niah")[0].num.at("accuracy"), 1.0);
    EXPECT_EQ(vt.of("ruler_niah")[0].str.at("value_type"), "variables");
    EXPECT_EQ(vt.mock.gen_reqs[0].max_new_tokens, 30);                   // RULER's budget for vt
    EXPECT_EQ(vt.of("ruler_niah_items")[0].str.at("gold").size(), 29u);  // 5 names, spaces
}

TEST(ProbeOptions, BadOptionsAreClearErrors) {
    auto expect = [](const std::string& task, const std::string& opts, const std::string& needle,
                     ctx_status want = CTX_ERR_INVALID_ARGUMENT,
                     size_t api = sizeof(ctx_eval_api)) {
        const Result r = run_mock(task, opts, {}, api);
        EXPECT_EQ(r.status, want) << opts;
        EXPECT_NE(r.error.find(needle), std::string::npos)
            << "'" << r.error << "' lacks '" << needle << "'";
    };
    expect("ruler_niah", "{ variant = 'haystack' }",
           "option 'variant': unknown task variant \"haystack\"");
    expect("ruler_niah", "{ haystack = 'paper' }", "option 'haystack' must be");
    expect("ruler_niah", "{ value_type = 'emoji' }", "option 'value_type' must be");
    expect("ruler_niah", "{ variant = 'vt', value_type = 'words' }",
           "does not apply to variant \"vt\"");
    expect("ruler_niah", "{ variant = 'single', haystack = 'needle' }",
           "is for variant \"multikey\"");
    expect("ruler_niah", "{ token_lengths = {100} }", "length 100 leaves no room for a prompt");
    expect("ruler_niah", "{ token_lengths = {300}, max_new_tokens = 10 }", "alone has");
    for (const std::string task : {"passkey", "ruler_niah"}) {
        expect(task, "{ depths = {0.5, 1.5} }",
               "option 'depths' value 1.5 at index 2 must be in [0, 1]");
        expect(task, "{ depths = {-0.1} }", "must be in [0, 1]");
        expect(task, "{ depths = {0.5}, num_depths = 3 }", "either 'depths'");
        expect(task, "{ num_depths = 1 }", "option 'num_depths' must be in [2, 1000]");
        expect(task, "{ token_lengths = {512}, multiples = {2} }", "either 'token_lengths'");
        expect(task, "{ token_lengths = {0} }",
               "option 'token_lengths' value 0 must be a positive integer");
        expect(task, "{ multiples = {-1} }", "option 'multiples' value -1 must be > 0");
        expect(task, "{ per_setting = 0 }", "option 'per_setting' must be in [1,");
        expect(task, "{ threshold = 150 }", "option 'threshold' is a percentage in (0, 100]");
        expect(task, "{ relative_threshold = 0 }", "option 'relative_threshold' must be in (0, 1]");
        expect(task, "{ generate = false, teacher_forced = false }", "nothing to score");
        expect(task, "{ chat_template = 'no slot' }", "must contain \"{prompt}\" exactly once");
        expect(task, "{ window = -1 }", "option 'window' must be in [0,");
        expect(task, "{ max_new_tokens = 0 }", "option 'max_new_tokens' must be in [1,");
        expect(task, "{ token_lengths = {600} }",
               "needs a host with plugin ABI >= 1.3 (score_rows)", CTX_ERR_UNSUPPORTED,
               offsetof(ctx_eval_api, score_rows));
    }
    expect("passkey", "{ token_lengths = {100} }",
           "length 100: the fixed text (task, needles, question) alone has");
    // an older host still runs generation-only probes
    const Result old = run_mock("passkey",
                                "{ token_lengths = {300}, depths = {0}, per_setting = 1, "
                                "teacher_forced = false }",
                                {}, offsetof(ctx_eval_api, score_rows));
    EXPECT_EQ(old.status, CTX_OK) << old.error;
}

// ================================================================ the real host, end to end
// A tiny byte-level RoPE model trained for a few steps on passkey prompts: the test checks the
// plumbing (records, counts, the windowed control), not that so small a model retrieves.
struct TrainedByteModel {
    ModelConfig config = [] {
        ModelConfig c = test::tiny_config();
        c.vocab_size = 259;
        c.context_length = 64;
        return c;
    }();
    Model model{config, test::cpu(), test::make_pe("rope", config), 5};
    std::unique_ptr<Tokenizer> tokenizer = load_tokenizer("byte");
    MemoryDocs docs{{tokenizer->encode("The river bends near the mill. Boats wait for the tide. "
                                       "Gulls circle the harbour and the nets dry in the sun. ")},
                    259};
    std::unique_ptr<Comm> comm = make_single_comm();
    std::vector<Record> records;
    double first_loss = 0, last_loss = 0;

    TrainedByteModel() {
        std::string text;
        for (uint64_t s = 0; text.size() < 4000; ++s)
            text += passkey::make_prompt(300, 0.5, s, "", counter(*tokenizer)).text + " 1.\n";
        const std::vector<int32_t> ids = tokenizer->encode(text);
        OptimizerConfig oc;
        oc.lr = 1e-2f;
        oc.warmup_steps = 2;
        Optimizer opt(model, oc);
        const int B = 4, T = 64;
        for (int step = 0; step < 20; ++step) {
            BatchBuffers b;
            b.resize(B, T);
            for (int r = 0; r < B; ++r)
                for (int t = 0; t < T; ++t) {
                    const size_t at = static_cast<size_t>((step * B + r) * 97 % 3800 + t);
                    b.tokens[r * T + t] = ids[at];
                    b.targets[r * T + t] = ids[at + 1];
                    b.positions[r * T + t] = static_cast<float>(t);
                    b.mask[r * T + t] = 1;
                }
            test::cpu().zero(model.grads().data(), model.grads().size());
            const double loss = model.forward_backward(b.batch(), 1.0f / (B * T)).mean();
            opt.update();
            (step == 0 ? first_loss : last_loss) = loss;
        }
    }
    void run(const std::string& name, const std::string& options_lua) {
        EvalContext ctx;
        ctx.model = &model;
        ctx.documents = &docs;
        ctx.comm = comm.get();
        ctx.trained_length = config.context_length;
        ctx.tokenizer = tokenizer.get();
        ctx.collected = &records;
        ctx.tags["method"] = "e2e";
        lua::Runtime rt;
        rt.run_string("opts = " + options_lua, "options");
        lua_getglobal(rt.state(), "opts");
        const LoadedPlugin& lib = test::plugins().get("eval/" + name);
        lua::Options o = lua::Options::parse(rt.state(), -1, plugin_option_schema(*lib.descriptor),
                                             "opts", "test:");
        EvalPlugin plugin(lib, o, 1);
        plugin.run(ctx);
    }
    std::vector<Record> of(const std::string& task) const {
        std::vector<Record> out;
        for (const Record& r : records)
            if (r["task"] == task) out.push_back(r);
        return out;
    }
};

TEST(ProbeEndToEnd, PasskeyAndRulerOnATrainedByteModel) {
    TrainedByteModel host;
    EXPECT_LT(host.last_loss, host.first_loss);  // it did train
    host.run("passkey",
             "{ multiples = {4, 6}, depths = {0, 1}, per_setting = 2, max_new_tokens = 6 }");
    const auto items = host.of("passkey_items"), sets = host.of("passkey");
    ASSERT_EQ(items.size(), 8u);
    ASSERT_EQ(sets.size(), 4u);
    for (const Record& s : sets) {
        EXPECT_EQ(s["items"].get<int>(), 2);
        EXPECT_EQ(s["window"].get<int>(), 64);  // the control defaults to Lt
        EXPECT_EQ(s["method"], "e2e");
        for (const char* k :
             {"accuracy", "tf_accuracy", "windowed_accuracy", "windowed_tf_accuracy"}) {
            const double v = s[k].get<double>();
            EXPECT_TRUE(v >= 0 && v <= 1) << k << " = " << v;
        }
        EXPECT_LT(s["mean_logprob"].get<double>(), 0);
        EXPECT_LE(s["mean_prompt_tokens"].get<double>(), s["length"].get<double>());
        EXPECT_GE(s["mean_prompt_tokens"].get<double>(), s["length"].get<double>() - 1);
    }
    for (const Record& it : items) {  // the recorded rule applied to the recorded output
        EXPECT_EQ(it["predicted"].get<int64_t>(),
                  ctx_retrieval::first_integer(it["output"].get<std::string>()));
        EXPECT_EQ(it["correct"].get<int>(), it["predicted"] == it["expected"] ? 1 : 0);
        const double lp = it["logprob"].get<double>();
        EXPECT_TRUE(std::isfinite(lp) && lp < 0);
    }
    EXPECT_EQ(host.of("passkey_by_length").size(), 2u);
    EXPECT_EQ(host.of("passkey_effective_length").size(), 4u);

    host.run("ruler_niah",
             "{ variant = 'single', haystack = 'essay', token_lengths = {500, 600}, "
             "num_depths = 2, per_setting = 1, max_new_tokens = 12 }");
    const auto niah_sets = host.of("ruler_niah");
    ASSERT_EQ(niah_sets.size(), 4u);
    for (const Record& s : niah_sets) {
        EXPECT_EQ(s["variant"], "single");
        EXPECT_EQ(s["haystack"], "essay");
        EXPECT_LE(s["mean_prompt_tokens"].get<double>(), s["length"].get<double>() - 12);
        EXPECT_TRUE(std::isfinite(s["windowed_tf_accuracy"].get<double>()));
    }
    EXPECT_EQ(host.of("ruler_niah_items").size(), 4u);
}

}  // namespace
}  // namespace ctx
