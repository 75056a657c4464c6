// The default corpus on disk: generated documents, byte-tokenized, split by document into
// <dir>/train.shard and <dir>/val.shard, with <dir>/corpus.json recording the options so a
// later run with the same options reuses the shards instead of regenerating them.
#pragma once

#include <string>
#include <vector>

#include "data/corpus.h"

namespace ctx {

struct CorpusShards {
    std::string train_path, val_path;
    std::vector<int64_t> train_lengths, val_lengths;  // tokens per document
    std::vector<int64_t> recall_distances;            // bytes, every recall of every document
    bool reused = false;                              // the shards existed with these options
};

// Writes the shards (atomically) unless <dir>/corpus.json already records exactly these options
// and both shards exist. Creates dir.
CorpusShards write_corpus_shards(const std::string& dir, const CorpusOptions& options,
                                 double val_fraction);

}  // namespace ctx
