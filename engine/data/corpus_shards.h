// The default corpus on disk: generated documents, split by document into <dir>/train.shard and
// <dir>/val.shard, with <dir>/corpus.json recording the options so a later run with the same
// options reuses the shards instead of regenerating them. Tokens are bytes, or (bpe_vocab > 0)
// a byte-level BPE trained on the train split's text (data/bpe_train.h) and saved as
// <dir>/tokenizer.json, which evaluation then needs to find the recalls' text.
#pragma once

#include <string>
#include <vector>

#include "data/corpus.h"

namespace ctx {

struct CorpusShards {
    std::string train_path, val_path;
    std::vector<int64_t> train_lengths, val_lengths;  // tokens per document
    std::vector<int64_t> recall_distances;            // bytes, every recall of every document
    std::string tokenizer;                            // "byte" or the tokenizer.json path
    int32_t vocab_size = 0;
    bool reused = false;                              // the shards existed with these options
};

// Writes the shards (atomically) unless <dir>/corpus.json already records exactly these options
// and both shards exist. Creates dir.
CorpusShards write_corpus_shards(const std::string& dir, const CorpusOptions& options,
                                 double val_fraction, int32_t bpe_vocab = 0);

}  // namespace ctx
