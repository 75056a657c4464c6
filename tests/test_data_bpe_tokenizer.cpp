// Byte-level BPE (data/bpe_tokenizer.h): the byte map, merges by rank on hand-made vocabularies,
// each pre-tokenizer behaviour, added tokens, both merges spellings, the error messages, round
// trips, concurrent encode and the Lua binding. Expected ids here are worked out by hand; the
// comparison with HF itself is tests/tokenizer_parity (ctest tokenizer.parity).
#include <gtest/gtest.h>
#include <lua.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/rng.h"
#include "data/bpe_byte_map.h"
#include "data/bpe_pretokenize.h"
#include "data/bpe_regex.h"
#include "data/bpe_tokenizer.h"
#include "data/utf8.h"
#include "lua/ctx_tokenizer.h"
#include "lua/runtime.h"

using namespace ctx;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

#define EXPECT_ERROR_HAS(stmt, text) \
    EXPECT_NE(error_of([&] { stmt; }).find(text), std::string::npos) << error_of([&] { stmt; })

// A fresh directory under the system temp dir.
fs::path temp_dir(const std::string& name) {
    const fs::path d = fs::temp_directory_path() /
                       ("ctx_bpe_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

void write(const fs::path& p, const std::string& text) {
    std::ofstream(p, std::ios::binary) << text;
}

// tokenizer.json for a byte-level vocabulary where the token of byte b has id b, plus `extra`
// tokens (ids from 256 on, in order) and the given merges (of mapped strings) in pair form.
json byte_level_json(const std::vector<std::string>& extra,
                     const std::vector<std::pair<std::string, std::string>>& merges) {
    json j;
    j["version"] = "1.0";
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
    j["decoder"] = {{"type", "ByteLevel"}};
    j["added_tokens"] = json::array();
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[bpe::byte_map().to_utf8(static_cast<uint8_t>(b))] = b;
    for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + static_cast<int>(i);
    json m = json::array();
    for (const auto& [a, b] : merges) m.push_back({a, b});
    j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}, {"dropout", nullptr}};
    return j;
}

// A character-level tokenizer.json: no pre-tokenizer (the text is one word), no decoder.
json char_level_json(const std::vector<std::string>& vocab,
                     const std::vector<std::string>& merges) {
    json v = json::object();
    for (size_t i = 0; i < vocab.size(); ++i) v[vocab[i]] = i;
    return {{"model", {{"type", "BPE"}, {"vocab", v}, {"merges", merges}}}};
}

// The vocabulary spelling of one byte.
std::string mapped(uint8_t b) { return bpe::byte_map().to_utf8(b); }

std::unique_ptr<BpeTokenizer> from(const json& j) {
    return parse_bpe_tokenizer_json(j.dump(), "test.json");
}

json added(const std::string& content, int id, bool special, bool normalized = false) {
    return {{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
            {"rstrip", false}, {"normalized", normalized}, {"special", special}};
}

std::vector<std::string> pieces(const json& pre_tokenizer, const std::string& text) {
    const auto p = bpe::PreTokenizer::from_json(pre_tokenizer, "pre_tokenizer");
    bpe::PreTokens out;
    p.run(text, out);
    return {out.pieces.begin(), out.pieces.end()};
}

using Pieces = std::vector<std::string>;
using Ids = std::vector<int32_t>;

// A valid UTF-8 string of random code points from every range (1- to 4-byte forms).
std::string random_utf8(Rng& rng, size_t n) {
    std::string s;
    for (size_t i = 0; i < n; ++i) {
        char32_t cp;
        switch (rng.below(5)) {
            case 0: cp = static_cast<char32_t>(rng.below(0x80)); break;
            case 1: cp = static_cast<char32_t>(0x80 + rng.below(0x800 - 0x80)); break;
            case 2: cp = static_cast<char32_t>(0x800 + rng.below(0xD800 - 0x800)); break;
            case 3: cp = static_cast<char32_t>(0xE000 + rng.below(0x10000 - 0xE000)); break;
            default: cp = static_cast<char32_t>(0x10000 + rng.below(0x110000 - 0x10000)); break;
        }
        utf8::append(s, cp);
    }
    return s;
}

}  // namespace

TEST(BpeByteMap, IsABijectionThatKeepsPrintableBytes) {
    const auto& m = bpe::byte_map();
    std::set<char32_t> chars;
    int same = 0;
    for (int b = 0; b < 256; ++b) {
        const char32_t c = m.to_char(static_cast<uint8_t>(b));
        chars.insert(c);
        EXPECT_EQ(m.to_byte(c), b);
        if (c == static_cast<char32_t>(b)) ++same;
        const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        EXPECT_EQ(c == static_cast<char32_t>(b), printable) << b;
    }
    EXPECT_EQ(chars.size(), 256u);
    EXPECT_EQ(same, 188);
    // The 68 others take U+0100.. in byte order: NUL first, then ..., space is 'Ġ', '\n' is 'Ċ'.
    EXPECT_EQ(m.to_char(0), 0x100u);
    EXPECT_EQ(m.to_char('\n'), 0x10Au);
    EXPECT_EQ(m.to_char(' '), 0x120u);
    EXPECT_EQ(m.to_char(0x7F), 0x121u);
    EXPECT_EQ(m.to_char(0xAD), 0x143u);
    EXPECT_EQ(m.to_byte(0x144), -1);
    EXPECT_EQ(m.encode("a b\n"), "a\xC4\xA0" "b\xC4\x8A");
    std::string back;
    EXPECT_TRUE(m.decode("a\xC4\xA0" "b", back));
    EXPECT_EQ(back, "a b");
    EXPECT_FALSE(m.decode("\xE4\xBD\xA0", back));  // 你 is no byte's character
}

TEST(BpeModel, MergesApplyByRankNotByPosition) {
    const std::vector<std::string> vocab = {"a", "b", "c", "bc", "ab", "abc"};
    // b+c has the best rank, then a+bc: "abc" -> a bc -> abc.
    EXPECT_EQ(from(char_level_json(vocab, {"b c", "a b", "a bc"}))->encode("abc"), (Ids{5}));
    // a+b first: ab c, and no rule joins ab and c.
    EXPECT_EQ(from(char_level_json(vocab, {"a b", "b c", "a bc"}))->encode("abc"), (Ids{4, 2}));
}

TEST(BpeModel, EqualRanksMergeLeftmostFirst) {
    const auto tok = from(char_level_json({"a", "aa", "b", "ab", "abab"}, {"a a", "a b", "ab ab"}));
    EXPECT_EQ(tok->encode("aaa"), (Ids{1, 0}));
    EXPECT_EQ(tok->encode("aaaa"), (Ids{1, 1}));
    // ab ab ab: the pair at 0 and the pair at 2 have one rank; the left one merges first.
    EXPECT_EQ(tok->encode("ababab"), (Ids{4, 3}));
    EXPECT_EQ(tok->encode("b"), (Ids{2}));
}

TEST(BpeModel, ByteLevelWordsOnAHandMadeVocabulary) {
    const std::string G = "\xC4\xA0";  // 'Ġ', the space's character
    const auto tok = from(byte_level_json({G + "t", "he", G + "the"},
                                          {{G, "t"}, {"h", "e"}, {G + "t", "he"}}));
    // Pieces "the" and " the": t|he (no rule joins t and he) and Ġthe.
    EXPECT_EQ(tok->encode("the the"), (Ids{'t', 257, 258}));
    EXPECT_EQ(tok->decode(tok->encode("the the")), "the the");
    EXPECT_EQ(tok->encode(" t"), (Ids{256}));
    EXPECT_EQ(tok->encode("\xC3\xA9"), (Ids{0xC3, 0xA9}));  // é: its two bytes
    EXPECT_EQ(tok->vocab_size(), 259);
}

TEST(BpeModel, BothMergeSpellingsGiveTheSameIds) {
    const std::string G = "\xC4\xA0";
    json pairs = byte_level_json({G + "t", "he", G + "the", "in", "ing"},
                                 {{G, "t"}, {"h", "e"}, {G + "t", "he"}, {"i", "n"}, {"in", "g"}});
    json legacy = pairs;
    legacy["model"]["merges"] = json::array();
    for (const auto& m : pairs["model"]["merges"])
        legacy["model"]["merges"].push_back(m[0].get<std::string>() + " " +
                                            m[1].get<std::string>());
    const auto a = from(pairs), b = from(legacy);
    Rng rng(3);
    for (int i = 0; i < 50; ++i) {
        std::string s;
        const char* words[] = {"the", " thing", " sing", "in", "\xE4\xBD\xA0", " ", "ing", "t"};
        for (int k = 0; k < 12; ++k) s += words[rng.below(8)];
        EXPECT_EQ(a->encode(s), b->encode(s)) << s;
    }
    EXPECT_EQ(a->encode(" the singing"), (Ids{258, ' ', 's', 260, 260}));
}

TEST(BpeModel, UnknownCharactersUseUnkOrByteFallback) {
    json j = char_level_json({"<unk>", "a", "b"}, {});
    j["model"]["unk_token"] = "<unk>";
    EXPECT_EQ(from(j)->encode("axxb"), (Ids{1, 0, 0, 2}));
    j["model"]["fuse_unk"] = true;
    EXPECT_EQ(from(j)->encode("axxb"), (Ids{1, 0, 2}));
    json f = char_level_json({"<unk>", "a", "<0xC3>", "<0xA9>"}, {});
    f["model"]["unk_token"] = "<unk>";
    f["model"]["byte_fallback"] = true;
    EXPECT_EQ(from(f)->encode("a\xC3\xA9z"), (Ids{1, 2, 3, 0}));  // é as bytes, z unknown
    // Without an unk token an unknown character is dropped (as HF).
    EXPECT_EQ(from(char_level_json({"a"}, {}))->encode("aza"), (Ids{0, 0}));
}

TEST(BpeModel, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
    json j = char_level_json({"a", "b", "c", "ab", "abc", "bc"}, {"a b", "b c"});
    EXPECT_EQ(from(j)->encode("abc"), (Ids{3, 2}));
    j["model"]["ignore_merges"] = true;
    EXPECT_EQ(from(j)->encode("abc"), (Ids{4}));
}

TEST(BpePreTokenizer, Gpt2PatternOnHandExamples) {
    const json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
    EXPECT_EQ(pieces(bl, "Hello world's  123 !!?  \n x"),
              (Pieces{"Hello", " world", "'s", " ", " 123", " !!?", "  \n", " x"}));
    EXPECT_EQ(pieces(bl, "don't I'll"), (Pieces{"don", "'t", " I", "'ll"}));
    // U+0085 is white space for Oniguruma (HF) though not for PCRE2's own \s: runs of it split
    // like spaces.
    EXPECT_EQ(pieces(bl, "\xC2\x85\xC2\x85" "b"), (Pieces{"\xC2\x85", "\xC2\x85", "b"}));
    EXPECT_EQ(pieces(bl, "a\xE3\x80\x80\xE3\x80\x80" "b"),
              (Pieces{"a", "\xE3\x80\x80", "\xE3\x80\x80", "b"}));  // U+3000 twice
    EXPECT_EQ(pieces(bl, "!\xE2\x80\x8B"), (Pieces{"!\xE2\x80\x8B"}));  // U+200B is not space
}

TEST(BpePreTokenizer, ByteLevelPrefixSpace) {
    const json bl = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
    EXPECT_EQ(pieces(bl, "hi"), (Pieces{" hi"}));
    EXPECT_EQ(pieces(bl, " hi"), (Pieces{" hi"}));
    EXPECT_EQ(pieces(bl, "\thi"), (Pieces{" ", "\t", "hi"}));  // only ' ' counts as present
    EXPECT_EQ(pieces(bl, ""), (Pieces{}));
}

TEST(BpePreTokenizer, SplitBehaviours) {
    auto split = [](const char* behavior, bool invert) {
        return json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior},
                    {"invert", invert}};
    };
    const std::string t = "--a-b--c-";
    EXPECT_EQ(pieces(split("Removed", false), t), (Pieces{"a", "b", "c"}));
    EXPECT_EQ(pieces(split("Isolated", false), t),
              (Pieces{"-", "-", "a", "-", "b", "-", "-", "c", "-"}));
    EXPECT_EQ(pieces(split("MergedWithPrevious", false), t),
              (Pieces{"-", "-", "a-", "b-", "-", "c-"}));
    EXPECT_EQ(pieces(split("MergedWithNext", false), t),
              (Pieces{"-", "-a", "-b", "-", "-c", "-"}));
    EXPECT_EQ(pieces(split("Contiguous", false), t), (Pieces{"--", "a", "-", "b", "--", "c", "-"}));
    EXPECT_EQ(pieces(split("Removed", true), t), (Pieces{"-", "-", "-", "-", "-", "-"}));
    EXPECT_EQ(pieces(split("MergedWithPrevious", true), t),
              (Pieces{"-", "-a", "-b", "-", "-c", "-"}));
    // A pattern that matches the empty string: Rust's iteration skips an empty match right after
    // a match, so "aab" stays whole when merged with the next piece.
    const json a_star = {{"type", "Split"}, {"pattern", {{"Regex", "a*"}}},
                         {"behavior", "MergedWithNext"}, {"invert", false}};
    EXPECT_EQ(pieces(a_star, "aab"), (Pieces{"aab"}));
}

TEST(BpePreTokenizer, BloomSplitThenByteLevelWithoutRegex) {
    const json bloom = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", bpe::kBloomPattern}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    // The nested class excludes ( \s | and . , ! ? ...; '[' and ']' are ordinary characters.
    EXPECT_EQ(pieces(bloom, "Hello, world! (x|y) [a]"),
              (Pieces{"Hello", ",", " world", "! (", "x", "|", "y", ")", " [a]"}));
    EXPECT_TRUE(bpe::PreTokenizer::from_json(bloom, "p").byte_level_pieces());
}

TEST(BpePreTokenizer, DigitsWhitespaceSplitAndMappingBeforeLaterSteps) {
    EXPECT_EQ(pieces({{"type", "Digits"}, {"individual_digits", true}}, "a123b"),
              (Pieces{"a", "1", "2", "3", "b"}));
    EXPECT_EQ(pieces({{"type", "Digits"}, {"individual_digits", false}}, "a12b\xD9\xA1"),
              (Pieces{"a", "12", "b", "\xD9\xA1"}));  // U+0661 is a number too
    EXPECT_EQ(pieces({{"type", "WhitespaceSplit"}}, " a  b\tc "), (Pieces{"a", "b", "c"}));
    // A ByteLevel that is not last maps the text itself: the space is 'Ġ' for the next step.
    const json seq = {{"type", "Sequence"},
                      {"pretokenizers",
                       {{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}},
                        {{"type", "WhitespaceSplit"}}}}};
    EXPECT_EQ(pieces(seq, "a b"), (Pieces{"a\xC4\xA0" "b"}));
    EXPECT_FALSE(bpe::PreTokenizer::from_json(seq, "p").byte_level_pieces());
}

TEST(BpeRegex, TranslatesOnigurumaSpellings) {
    EXPECT_EQ(bpe::translate_onig_pattern("\\s+(?!\\S)"), "\\p{White_Space}+(?!\\P{White_Space})");
    EXPECT_EQ(bpe::translate_onig_pattern("\\h"), "[0-9a-fA-F]");
    EXPECT_EQ(bpe::translate_onig_pattern("\\u00e9"), "\\x{00e9}");
    EXPECT_EQ(bpe::translate_onig_pattern("[a[bc]]"), "[abc]");
    EXPECT_EQ(bpe::translate_onig_pattern("(?m:.)"), "(?s:.)");
    EXPECT_ERROR_HAS(bpe::translate_onig_pattern("[a&&b]"), "class intersection");
    EXPECT_ERROR_HAS(bpe::Regex::onig("(unclosed"), "regex \"(unclosed\" does not compile");
    std::vector<bpe::Span> m;
    bpe::Regex::onig("[^a\\S]").find_all("a b\xC2\x85" "c", m);  // not a, not non-space
    EXPECT_EQ(m, (std::vector<bpe::Span>{{1, 2}, {3, 5}}));
}

namespace {

// Byte-level tokenizer without merges (plain text ids are bytes) and these added tokens.
std::unique_ptr<BpeTokenizer> with_added(const std::vector<json>& tokens) {
    json j = byte_level_json({"<|endoftext|>"}, {});
    for (const auto& t : tokens) j["added_tokens"].push_back(t);
    return from(j);
}

}  // namespace

TEST(BpeAddedTokens, SplitBeforeBpeLongestFirst) {
    json eot = added("<|endoftext|>", 256, true);
    json pad = added("<pad>", 257, true);
    json end = added("<|end", 258, false);
    const auto tok = with_added({eot, pad, end});
    EXPECT_EQ(tok->encode("a<|endoftext|>b"), (Ids{'a', 256, 'b'}));
    EXPECT_EQ(tok->encode("<|endoftext|><pad><pad>"), (Ids{256, 257, 257}));
    EXPECT_EQ(tok->encode("<|endo"), (Ids{258, 'o'}));  // the longest that matches
    EXPECT_EQ(tok->encode("<pa"), (Ids{'<', 'p', 'a'}));
    EXPECT_EQ(tok->token_to_id("<pad>"), 257);
    EXPECT_EQ(tok->eos_id(), 256);
    EXPECT_EQ(tok->decode(Ids{'a', 256, 257, 'b'}), "a<|endoftext|><pad>b");
    EXPECT_EQ(tok->decode(Ids{'a', 256, 257, 'b'}, true), "ab");
    EXPECT_EQ(tok->decode(Ids{258}, true), "<|end");  // not special: kept
}

TEST(BpeAddedTokens, StripAndSingleWordOptions) {
    json l = added("[L]", 257, false);
    l["lstrip"] = true;
    json r = added("[R]", 258, false);
    r["rstrip"] = true;
    json w = added("hello", 259, false, true);
    w["single_word"] = true;
    const auto tok = with_added({l, r, w});
    const int32_t sp = ' ';
    EXPECT_EQ(tok->encode("a  [L]b"), (Ids{'a', 257, 'b'}));
    EXPECT_EQ(tok->encode("a[R] \t b"), (Ids{'a', 258, 'b'}));
    EXPECT_EQ(tok->encode("hello there"), (Ids{259, sp, 't', 'h', 'e', 'r', 'e'}));
    EXPECT_EQ(tok->encode("say hello!"), (Ids{'s', 'a', 'y', sp, 259, '!'}));
    EXPECT_EQ(tok->encode("ahello"), (Ids{'a', 'h', 'e', 'l', 'l', 'o'}));
    EXPECT_EQ(tok->encode("hello_"), (Ids{'h', 'e', 'l', 'l', 'o', '_'}));
}

TEST(BpeAddedTokens, IdsFollowHfAssignment) {
    // A content already in the vocabulary keeps its id; a new one comes after the model's.
    json j = byte_level_json({"<|endoftext|>"}, {});
    j["added_tokens"].push_back(added("<|endoftext|>", 256, true));
    j["added_tokens"].push_back(added("<new>", 257, true));
    const auto tok = from(j);
    EXPECT_EQ(tok->token_to_id("<new>"), 257);
    EXPECT_EQ(tok->vocab_size(), 258);
}

TEST(BpeErrors, InvalidUtf8NamesTheByteOffset) {
    const auto tok = with_added({});
    EXPECT_ERROR_HAS(tok->encode("ab\xC3("), "not valid UTF-8 at byte offset 2");
    EXPECT_ERROR_HAS(tok->encode("abcdefghij\xF0\x9F\x98"), "byte offset 10");
    EXPECT_ERROR_HAS(tok->encode("\xC0\xAF"), "byte offset 0");        // overlong
    EXPECT_ERROR_HAS(tok->encode("x\xED\xA0\x80"), "byte offset 1");   // surrogate
    EXPECT_ERROR_HAS(tok->encode("\xF4\x90\x80\x80"), "byte offset 0");  // past U+10FFFF
}

TEST(BpeErrors, UnknownIdsInDecodeNameTheIndex) {
    const auto tok = with_added({});
    EXPECT_ERROR_HAS(tok->decode(Ids{'a', 'b', 99999}), "id 99999 at index 2");
    EXPECT_ERROR_HAS(tok->decode(Ids{-1}), "id -1 at index 0");
}

TEST(BpeErrors, MalformedFilesNameWhereAndWhat) {
    EXPECT_ERROR_HAS(
        parse_bpe_tokenizer_json("{\n  \"model\": {\n    \"type\": \"BPE\",,\n", "bad.json"),
        "tokenizer bad.json: malformed JSON");
    EXPECT_ERROR_HAS(
        parse_bpe_tokenizer_json("{\n  \"model\": {\n    \"type\": \"BPE\",,\n", "bad.json"),
        "line 3, column");
    // Found by tests/fuzz/tokenizer_json_fuzz: a number beyond double's range escaped as
    // nlohmann's out_of_range instead of ctx::Error.
    EXPECT_ERROR_HAS(parse_bpe_tokenizer_json(R"({"model": {"vocab": {"a": 2e7060}}})", "big.json"),
                     "tokenizer big.json: malformed JSON: [json.exception.out_of_range.406] "
                     "number overflow parsing '2e7060'");
    json j = char_level_json({"a", "b", "ab"}, {"a b"});
    j["model"]["merges"].push_back(12);
    EXPECT_ERROR_HAS(from(j),
                     "test.json: model.merges[1]: expected \"a b\" or [\"a\", \"b\"], got 12");
    j["model"]["merges"][1] = "a b c";
    EXPECT_ERROR_HAS(from(j), "model.merges[1]: expected");
    j["model"]["merges"][1] = json::array({"a"});
    EXPECT_ERROR_HAS(from(j), "model.merges[1]: expected");
    j["model"]["merges"][1] = "a z";
    EXPECT_ERROR_HAS(from(j),
                     "model.merges[1]: merge \"a z\": token \"z\" is not in the vocabulary");
    j["model"]["merges"][1] = "b a";
    EXPECT_ERROR_HAS(from(j), "the merged token \"ba\" is not in the vocabulary");
    json v = char_level_json({"a"}, {});
    v["model"]["vocab"]["b"] = -3;
    EXPECT_ERROR_HAS(from(v), "model.vocab[\"b\"]: expected a token id");
    json d = char_level_json({"a"}, {});
    d["model"]["dropout"] = 0.1;
    EXPECT_ERROR_HAS(from(d), "model.dropout: BPE dropout");
}

// Found while fuzzing (tests/fuzz/tokenizer_json_fuzz): a merge written as [[[[...]]]] 200000
// levels deep (a 400 KB file) parsed, then overflowed the stack in dump() for the message.
TEST(BpeErrors, DeeplyNestedJsonIsRefusedNotACrash) {
    const std::string deep = std::string(200000, '[') + std::string(200000, ']');
    const std::string text = R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [)" + deep +
                             "]}}";
    EXPECT_ERROR_HAS(parse_bpe_tokenizer_json(text, "deep.json"),
                     "tokenizer deep.json: JSON nested deeper than 128 levels");
    const fs::path d = temp_dir("deep");
    write(d / "vocab.json", R"({"a": )" + deep + "}");
    write(d / "merges.txt", "");
    EXPECT_ERROR_HAS(load_bpe_vocab_merges((d / "vocab.json").string(),
                                           (d / "merges.txt").string()),
                     "JSON nested deeper than 128 levels");
    fs::remove_all(d);
}

TEST(BpeErrors, UnsupportedComponentsAreNamed) {
    for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
        json j = {{"model", {{"type", type}, {"vocab", json::object()}}}};
        EXPECT_ERROR_HAS(from(j), std::string("model.type: unsupported model type \"") + type);
    }
    json n = char_level_json({"a"}, {});
    n["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", {{{"type", "NFC"}}, {{"type", "BertNormalizer"}}}}};
    EXPECT_ERROR_HAS(from(n),
                     "normalizer.normalizers[1]: unsupported normalizer type \"BertNormalizer\"");
    json p = char_level_json({"a"}, {});
    p["pre_tokenizer"] = {{"type", "Metaspace"}};
    EXPECT_ERROR_HAS(from(p), "pre_tokenizer: unsupported pre_tokenizer type \"Metaspace\"");
    p["pre_tokenizer"] = {
        {"type", "Split"}, {"pattern", {{"String", "x"}}}, {"behavior", "Sideways"}};
    EXPECT_ERROR_HAS(from(p), "pre_tokenizer.behavior: unknown split behavior \"Sideways\"");
    json dec = char_level_json({"a"}, {});
    dec["decoder"] = {{"type", "WordPiece"}};
    EXPECT_ERROR_HAS(from(dec), "decoder: unsupported decoder type \"WordPiece\"");
}

TEST(BpeLoad, SpecsResolveFilesAndDirectories) {
    const fs::path d = temp_dir("load");
    const std::string G = "\xC4\xA0";
    json j = byte_level_json({G + "t"}, {{G, "t"}});
    write(d / "tokenizer.json", j.dump());
    EXPECT_EQ(load_tokenizer(d.string())->encode(" t"), (Ids{256}));
    EXPECT_EQ(load_tokenizer((d / "tokenizer.json").string())->encode(" t"), (Ids{256}));
    EXPECT_EQ(load_tokenizer("byte")->name(), "byte");

    // GPT-2 files: vocab.json + merges.txt with its "#version" line.
    const fs::path g = d / "gpt2";
    fs::create_directories(g);
    json vocab = j["model"]["vocab"];
    vocab["<|endoftext|>"] = 257;
    write(g / "vocab.json", vocab.dump());
    write(g / "merges.txt", "#version: 0.2\n" + G + " t\n");
    for (const fs::path& spec : {g, g / "vocab.json"}) {
        const auto tok = load_tokenizer(spec.string());
        EXPECT_EQ(tok->encode(" t<|endoftext|>"), (Ids{256, 257})) << spec;
        EXPECT_EQ(tok->eos_id(), 257);
        EXPECT_EQ(tok->name(), "bpe:gpt2:" + (g / "vocab.json").string());
    }
    write(g / "merges.txt", "#version: 0.2\n" + G + " t\nbad\n");
    EXPECT_ERROR_HAS(load_tokenizer(g.string()),
                     "merges.txt: line 3: expected \"a b\", got \"bad\"");

    EXPECT_ERROR_HAS(load_tokenizer((d / "nope.json").string()), "no such file or directory");
    const fs::path empty = d / "empty";
    fs::create_directories(empty);
    EXPECT_ERROR_HAS(load_tokenizer(empty.string()), "neither tokenizer.json nor vocab.json");
    const fs::path lonely = d / "lonely";
    fs::create_directories(lonely);
    write(lonely / "vocab.json", "{}");
    EXPECT_ERROR_HAS(load_tokenizer((lonely / "vocab.json").string()),
                     "needs merges.txt beside it");
    fs::remove_all(d);
}

TEST(BpeRoundTrip, RandomUtf8AndTheFixture) {
    const std::string G = "\xC4\xA0";
    // Merges inside multi-byte characters too: E4 BD (a CJK lead) and F0 9F (an emoji lead).
    const std::string e4 = mapped(0xE4), bd = mapped(0xBD), f0 = mapped(0xF0), x9f = mapped(0x9F);
    const auto tok = from(byte_level_json(
        {G + "t", "he", G + "the", "in", "ing", e4 + bd, f0 + x9f},
        {{G, "t"}, {"h", "e"}, {G + "t", "he"}, {"i", "n"}, {"in", "g"}, {e4, bd}, {f0, x9f}}));
    Rng rng(7);
    for (int i = 0; i < 300; ++i) {
        const std::string s = random_utf8(rng, rng.below(60));
        ASSERT_EQ(tok->decode(tok->encode(s)), s);
    }
    std::ifstream in(std::string(CTX_TEST_SOURCE_DIR) + "/tests/tokenizer_parity/fixture.txt",
                     std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    ASSERT_GT(ss.str().size(), 1000u);
    EXPECT_EQ(tok->decode(tok->encode(ss.str())), ss.str());
}

TEST(BpeDecode, InvalidByteSequencesBecomeReplacementCharacters) {
    const auto tok = with_added({});
    const std::string fffd = "\xEF\xBF\xBD";
    EXPECT_EQ(tok->decode(Ids{'a', 0xF0, 0x9F, 0x98, 'b'}), "a" + fffd + "b");  // one per cut char
    EXPECT_EQ(tok->decode(Ids{0xFF}), fffd);
    EXPECT_EQ(tok->decode(Ids{0xED, 0xA0, 0x80}), fffd + fffd + fffd);
    EXPECT_EQ(utf8::to_valid_lossy("\xC0\xAFz"), fffd + fffd + "z");
    EXPECT_EQ(utf8::to_valid_lossy("ok \xE2\x82\xAC"), "ok \xE2\x82\xAC");
}

TEST(BpeNormalizer, NfcTokenizersSeeComposedText) {
    json j = byte_level_json({mapped(0xC3) + mapped(0xA9)}, {{mapped(0xC3), mapped(0xA9)}});  // é
    j["normalizer"] = {{"type", "NFC"}};
    const auto tok = from(j);
    EXPECT_EQ(tok->encode("e\xCC\x81"), (Ids{256}));  // e + U+0301 composes to é
    EXPECT_EQ(tok->decode(tok->encode("e\xCC\x81")), "\xC3\xA9");  // NFC text comes back
    json s = char_level_json({"i", "\xCC\x87", "x", "!"}, {});
    s["normalizer"] = {
        {"type", "Sequence"},
        {"normalizers", {{{"type", "Lowercase"}}, {{"type", "Prepend"}, {"prepend", "!"}}}}};
    EXPECT_EQ(from(s)->encode("\xC4\xB0X"), (Ids{3, 0, 1, 2}));  // İ lowercases to i + U+0307
}

TEST(BpeThreads, ConcurrentEncodeMatchesSerial) {
    const std::string G = "\xC4\xA0";
    const auto tok =
        from(byte_level_json({G + "t", "he", G + "the"}, {{G, "t"}, {"h", "e"}, {G + "t", "he"}}));
    Rng rng(5);
    std::vector<std::string> texts;
    std::vector<Ids> serial;
    for (int i = 0; i < 64; ++i) {
        texts.push_back(random_utf8(rng, 200) + " the then there");
        serial.push_back(tok->encode(texts.back()));
    }
    std::vector<std::thread> threads;
    std::atomic<int> mismatches{0};
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            for (int round = 0; round < 20; ++round)
                for (size_t i = t; i < texts.size(); i += 2)
                    if (tok->encode(texts[i]) != serial[i]) ++mismatches;
        });
    for (auto& th : threads) th.join();
    EXPECT_EQ(mismatches.load(), 0);
}

TEST(BpeLua, TokenizerUserdata) {
    const fs::path d = temp_dir("lua");
    json j = byte_level_json({"<|endoftext|>"}, {});
    j["added_tokens"].push_back(added("<|endoftext|>", 256, true));
    write(d / "tokenizer.json", j.dump());
    lua::Runtime rt;
    lua_State* L = rt.state();
    lua_newtable(L);
    register_tokenizer_functions(L);
    lua_setglobal(L, "ctx");
    rt.run_string("local t = ctx.tokenizer('" + (d / "tokenizer.json").string() + R"(')
        local ids = t:encode('hi<|endoftext|>')
        assert(#ids == 3 and ids[1] == 104 and ids[2] == 105 and ids[3] == 256, 'encode')
        assert(t:decode(ids) == 'hi<|endoftext|>', 'decode')
        assert(t:decode(ids, true) == 'hi', 'decode skip_special')
        assert(t:vocab_size() == 257, 'vocab_size')
        assert(t:token_to_id('<|endoftext|>') == 256, 'token_to_id')
        assert(t:token_to_id('nope') == nil, 'token_to_id of a non-token')
        assert(t:eos_id() == 256 and t:bos_id() == 256, 'eos/bos')
        assert(t:name():find('^bpe:gpt2:'), t:name())
        assert(tostring(t):find('ctx.Tokenizer'), 'tostring')
        local ok, err = pcall(t.decode, t, {1, 2, 1e9})
        assert(not ok and err:find('index 2'), err)
        ok, err = pcall(t.decode, t, {1, 'x'})
        assert(not ok and err:find('ids%[2%]'), err)
        ok, err = pcall(ctx.tokenizer, 'no/such/tokenizer.json')
        assert(not ok and err:find('no such file'), err)
        assert(ctx.tokenizer('byte'):vocab_size() == 259)
    )",
                  "bpe_lua_test");
    fs::remove_all(d);
}

// Throughput of encode on a few MB of text (run with --gtest_also_run_disabled_tests; set
// CTX_BPE_BENCH_TOKENIZER to a tokenizer spec, and CTX_BPE_BENCH_TEXT to a UTF-8 file, else the
// fixture's lines shuffled to ~4 MB). Prints MB/s for one thread and for several.
TEST(BpeBench, DISABLED_EncodeThroughput) {
    const char* spec = std::getenv("CTX_BPE_BENCH_TOKENIZER");
    ASSERT_TRUE(spec) << "set CTX_BPE_BENCH_TOKENIZER";
    const auto tok = load_tokenizer(spec);
    const char* text_path = std::getenv("CTX_BPE_BENCH_TEXT");
    std::ifstream in(text_path
                         ? std::string(text_path)
                         : std::string(CTX_TEST_SOURCE_DIR) + "/tests/tokenizer_parity/fixture.txt",
                     std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    if (!text_path) {
        const std::string base = text;
        std::vector<std::string> lines;
        for (size_t a = 0, b; a < base.size(); a = b + 1) {
            b = base.find('\n', a);
            if (b == std::string::npos) b = base.size();
            lines.push_back(base.substr(a, b - a + 1));
        }
        Rng rng(1);
        text.clear();
        while (text.size() < (4u << 20)) text += lines[rng.below(lines.size())];
    }
    auto seconds_since = [](auto t0) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    for (int pass = 0; pass < 2; ++pass) {  // the first pass fills the word cache
        const auto t0 = std::chrono::steady_clock::now();
        const auto ids = tok->encode(text);
        const double s = seconds_since(t0);
        std::printf("%s, 1 thread, pass %d: %.1f MB in %.3f s = %.1f MB/s, %zu tokens\n",
                    tok->name().c_str(), pass, text.size() / 1e6, s, text.size() / 1e6 / s,
                    ids.size());
    }
    const unsigned n = std::max(2u, std::thread::hardware_concurrency());
    std::vector<std::string> parts(n);
    for (size_t i = 0, a = 0; i < n; ++i) {  // cut at line ends
        size_t b = i + 1 == n ? text.size()
                              : text.find('\n', std::min(text.size(), (i + 1) * text.size() / n));
        b = b == std::string::npos ? text.size() : b;
        parts[i] = text.substr(a, b - a);
        a = b;
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (unsigned i = 0; i < n; ++i) threads.emplace_back([&, i] { tok->encode(parts[i]); });
    for (auto& t : threads) t.join();
    const double s = seconds_since(t0);
    std::printf("%u threads: %.1f MB/s\n", n, text.size() / 1e6 / s);
}
