#include "data/bpe_train.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <queue>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "data/bpe_byte_map.h"
#include "data/bpe_pretokenize.h"
#include "data/utf8.h"

namespace ctx {
namespace {

using Pair = uint64_t;  // (left id << 32) | right id
Pair pair_of(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
int32_t left_of(Pair p) { return static_cast<int32_t>(p >> 32); }
int32_t right_of(Pair p) { return static_cast<int32_t>(p & 0xffffffffu); }

struct Word {
    std::vector<int32_t> symbols;
    int64_t count = 0;
};

// Pair statistics over all words: counts, and which words hold each pair (a superset: entries
// are not removed when a merge takes a pair out of a word, they are re-checked on use).
class PairStats {
public:
    void add_word(const Word& w, int32_t index, int64_t sign) {
        for (size_t i = 0; i + 1 < w.symbols.size(); ++i) {
            const Pair p = pair_of(w.symbols[i], w.symbols[i + 1]);
            counts_[p] += sign * w.count;
            if (sign > 0) where_[p].insert(index);
        }
    }
    int64_t count(Pair p) const {
        const auto it = counts_.find(p);
        return it == counts_.end() ? 0 : it->second;
    }
    std::vector<int32_t> words_with(Pair p) const {
        const auto it = where_.find(p);
        if (it == where_.end()) return {};
        std::vector<int32_t> v(it->second.begin(), it->second.end());
        std::sort(v.begin(), v.end());
        return v;
    }
    const std::unordered_map<Pair, int64_t>& counts() const { return counts_; }

private:
    std::unordered_map<Pair, int64_t> counts_;
    std::unordered_map<Pair, std::unordered_set<int32_t>> where_;
};

// Max-heap order: higher count first, then the smaller pair.
struct Candidate {
    int64_t count;
    Pair pair;
    bool operator<(const Candidate& o) const {
        return std::tie(count, o.pair) < std::tie(o.count, pair);
    }
};

// The word with every non-overlapping (a, b), left to right, replaced by z.
std::vector<int32_t> merged(const std::vector<int32_t>& s, int32_t a, int32_t b, int32_t z) {
    std::vector<int32_t> out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
            out.push_back(z);
            ++i;
        } else {
            out.push_back(s[i]);
        }
    }
    return out;
}

}  // namespace

void BpeTrainOptions::validate() const {
    const auto specials = static_cast<int32_t>(special_tokens.size());
    CTX_CHECK(vocab_size >= 256 + specials && vocab_size <= (1 << 24),
              "bpe training: vocab_size must be in [{}, {}] (256 bytes + {} special tokens), got {}",
              256 + specials, 1 << 24, specials, vocab_size);
    CTX_CHECK(min_frequency >= 1, "bpe training: min_frequency must be >= 1, got {}",
              min_frequency);
    for (const std::string& s : special_tokens)
        CTX_CHECK(!s.empty() && utf8::find_invalid(s) == std::string_view::npos,
                  "bpe training: special tokens must be non-empty UTF-8");
}

BpeTrainer::BpeTrainer(BpeTrainOptions options) : options_(std::move(options)) {
    options_.validate();
}

void BpeTrainer::add(std::string_view text) {
    const size_t bad = utf8::find_invalid(text);
    CTX_CHECK(bad == std::string_view::npos,
              "bpe training: text is not valid UTF-8 (byte offset {})", bad);
    static const bpe::PreTokenizer pre = bpe::PreTokenizer::gpt2();
    bpe::PreTokens pieces;
    pre.run(text, pieces);
    for (std::string_view p : pieces.pieces) {
        const auto it = word_counts_.find(p);
        if (it == word_counts_.end()) word_counts_.emplace(std::string(p), 1);
        else ++it->second;
    }
}

std::string BpeTrainer::train() {
    const bpe::ByteMap& bytes = bpe::byte_map();
    // Symbols: the bytes, then merges. A merge whose string already exists reuses its id (two
    // different splits of the same string), as HF's trainer does.
    std::vector<std::string> text_of(256);  // the bytes a symbol spells
    std::unordered_map<std::string, int32_t> id_of;
    for (int b = 0; b < 256; ++b) {
        text_of[b] = std::string(1, static_cast<char>(b));
        id_of.emplace(text_of[b], b);
    }
    std::vector<Word> words;
    words.reserve(word_counts_.size());
    for (const auto& [w, n] : word_counts_) {
        Word word;
        word.count = n;
        for (unsigned char c : w) word.symbols.push_back(c);
        words.push_back(std::move(word));
    }
    PairStats stats;
    for (size_t i = 0; i < words.size(); ++i) stats.add_word(words[i], static_cast<int32_t>(i), 1);
    std::priority_queue<Candidate> heap;
    for (const auto& [p, n] : stats.counts())
        if (n > 0) heap.push({n, p});

    const int32_t target = options_.vocab_size - static_cast<int32_t>(options_.special_tokens.size());
    std::vector<std::pair<int32_t, int32_t>> merges;
    while (static_cast<int32_t>(text_of.size()) < target && !heap.empty()) {
        const Candidate top = heap.top();
        heap.pop();
        const int64_t now = stats.count(top.pair);
        if (now != top.count) {  // stale entry: re-queue with the current count
            if (now > 0) heap.push({now, top.pair});
            continue;
        }
        if (now < options_.min_frequency) break;
        const int32_t a = left_of(top.pair), b = right_of(top.pair);
        const std::string joined = text_of[a] + text_of[b];
        int32_t z;
        if (const auto it = id_of.find(joined); it != id_of.end()) {
            z = it->second;
        } else {
            z = static_cast<int32_t>(text_of.size());
            text_of.push_back(joined);
            id_of.emplace(joined, z);
        }
        merges.emplace_back(a, b);
        std::unordered_set<Pair> touched;
        for (int32_t w : stats.words_with(top.pair)) {
            Word& word = words[static_cast<size_t>(w)];
            std::vector<int32_t> next = merged(word.symbols, a, b, z);
            if (next.size() == word.symbols.size()) continue;  // pair no longer in this word
            stats.add_word(word, w, -1);
            for (size_t i = 0; i + 1 < word.symbols.size(); ++i)
                touched.insert(pair_of(word.symbols[i], word.symbols[i + 1]));
            word.symbols = std::move(next);
            stats.add_word(word, w, 1);
            for (size_t i = 0; i + 1 < word.symbols.size(); ++i)
                touched.insert(pair_of(word.symbols[i], word.symbols[i + 1]));
        }
        std::vector<Pair> order(touched.begin(), touched.end());
        std::sort(order.begin(), order.end());  // heap contents independent of hash order
        for (Pair p : order)
            if (const int64_t n = stats.count(p); n > 0) heap.push({n, p});
    }

    // tokenizer.json in HF's layout (ordered keys: ids ascending in "vocab").
    using OJson = nlohmann::ordered_json;
    OJson vocab = OJson::object();
    for (size_t id = 0; id < text_of.size(); ++id) vocab[bytes.encode(text_of[id])] = id;
    OJson added = OJson::array();
    int32_t next_id = static_cast<int32_t>(text_of.size());
    for (const std::string& s : options_.special_tokens) {
        if (vocab.contains(s)) continue;
        vocab[s] = next_id;
        added.push_back({{"id", next_id},
                         {"content", s},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", true}});
        ++next_id;
    }
    OJson merge_list = OJson::array();
    for (const auto& [a, b] : merges)
        merge_list.push_back({bytes.encode(text_of[a]), bytes.encode(text_of[b])});
    const OJson byte_level = {{"type", "ByteLevel"},
                              {"add_prefix_space", false},
                              {"trim_offsets", true},
                              {"use_regex", true}};
    OJson j = {{"version", "1.0"},
               {"truncation", nullptr},
               {"padding", nullptr},
               {"added_tokens", added},
               {"normalizer", nullptr},
               {"pre_tokenizer", byte_level},
               {"post_processor", nullptr},
               {"decoder", byte_level},
               {"model",
                {{"type", "BPE"},
                 {"dropout", nullptr},
                 {"unk_token", nullptr},
                 {"continuing_subword_prefix", nullptr},
                 {"end_of_word_suffix", nullptr},
                 {"fuse_unk", false},
                 {"byte_fallback", false},
                 {"ignore_merges", false},
                 {"vocab", vocab},
                 {"merges", merge_list}}}};
    vocab_size_ = next_id;
    num_merges_ = static_cast<int64_t>(merges.size());
    return j.dump(1) + "\n";
}

}  // namespace ctx
