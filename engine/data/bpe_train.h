// Trains a GPT-2 style byte-level BPE tokenizer (the kind data/bpe_tokenizer.h loads and HF
// `tokenizers` reads) from text, in process: no Python needed for the generated corpus or
// `ctxengine tokenize --train-bpe`.
//
// The classic algorithm (Sennrich et al.; HF's BpeTrainer): pre-tokenize every text with GPT-2's
// ByteLevel pattern, count the distinct pieces ("words"), start from one symbol per byte, and
// repeatedly merge the most frequent adjacent pair of symbols (counted over all words, weighted by
// word frequency) into a new symbol, until the vocabulary is full or no pair occurs
// `min_frequency` times. Deterministic: ties go to the pair of smaller (left id, right id).
//
// Ids: 0..255 are the bytes in byte order, merges follow in the order they were learnt, then the
// special tokens. The result is a complete tokenizer.json (ByteLevel pre-tokenizer and decoder,
// no normalizer, the merges as [left, right] pairs).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ctx {

struct BpeTrainOptions {
    int32_t vocab_size = 1024;  // bytes + merges + special tokens
    int64_t min_frequency = 2;  // stop merging once the best pair occurs fewer times
    std::vector<std::string> special_tokens{"<|endoftext|>"};
    void validate() const;      // ctx::Error naming the bad field
};

class BpeTrainer {
public:
    explicit BpeTrainer(BpeTrainOptions options);
    // Counts the pre-tokenized pieces of one text (valid UTF-8, else ctx::Error).
    void add(std::string_view text);
    // Learns the merges and returns tokenizer.json's text.
    std::string train();
    // After train(): what was learnt.
    int32_t vocab_size() const { return vocab_size_; }
    int64_t num_merges() const { return num_merges_; }

private:
    BpeTrainOptions options_;
    std::map<std::string, int64_t, std::less<>> word_counts_;  // ordered: deterministic ids
    int32_t vocab_size_ = 0;
    int64_t num_merges_ = 0;
};

}  // namespace ctx
