#include "data/corpus_shards.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/file_util.h"
#include "data/bpe_train.h"
#include "data/tokenizer.h"
#include "data/shard.h"
#include "data/windows.h"

namespace ctx {

static nlohmann::json manifest(const CorpusOptions& o, double val_fraction, int32_t bpe_vocab) {
    return {{"generator", "ctxengine-corpus-1"},
            {"n_docs", o.n_docs},
            {"min_len", o.min_len},
            {"max_len", o.max_len},
            {"seed", o.seed},
            {"facts_per_doc", o.facts_per_doc},
            {"recall_rate", o.recall_rate},
            {"max_recalls_per_fact", o.max_recalls_per_fact},
            {"min_distance", o.min_distance},
            {"max_distance", o.max_distance},
            {"val_fraction", val_fraction},
            {"tokenizer", bpe_vocab > 0 ? "bpe-" + std::to_string(bpe_vocab) + "-on-train"
                                        : std::string("bytes+specials-259")}};
}

CorpusShards write_corpus_shards(const std::string& dir_name, const CorpusOptions& o,
                                 double val_fraction, int32_t bpe_vocab) {
    o.validate();
    CTX_CHECK(val_fraction >= 0.0 && val_fraction <= 1.0,
              "val_fraction must be in [0, 1], got {}", val_fraction);
    const std::filesystem::path dir(dir_name);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    CTX_CHECK(!ec, "cannot create directory {}: {}", dir.string(), ec.message());
    CorpusShards out;
    out.train_path = (dir / "train.shard").string();
    out.val_path = (dir / "val.shard").string();
    const std::string manifest_path = (dir / "corpus.json").string();
    const nlohmann::json want = manifest(o, val_fraction, bpe_vocab);
    const std::string tokenizer_path = (dir / "tokenizer.json").string();
    out.tokenizer = bpe_vocab > 0 ? tokenizer_path : "byte";

    if (std::filesystem::exists(out.train_path) && std::filesystem::exists(out.val_path) &&
        std::filesystem::exists(manifest_path) &&
        (bpe_vocab == 0 || std::filesystem::exists(tokenizer_path))) {
        std::ifstream in(manifest_path);
        const nlohmann::json have = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
        if (have == want) {
            out.reused = true;
            out.train_lengths = ShardReader(out.train_path).doc_lengths();
            out.val_lengths = ShardReader(out.val_path).doc_lengths();
            out.vocab_size = ShardReader(out.train_path).vocab_size();
            return out;
        }
    }

    // The split uses the corpus seed, so (options) -> (shards) is a pure function.
    const DocSplit split = split_documents(o.n_docs, val_fraction, 0.0, o.seed);
    std::vector<char> is_val(static_cast<size_t>(o.n_docs), 0);
    for (int64_t d : split.val) is_val[static_cast<size_t>(d)] = 1;
    std::vector<std::string> train_text, val_text;
    for (int64_t i = 0; i < o.n_docs; ++i) {
        CorpusDoc doc = generate_document(o, i);
        for (const RecallSpan& r : doc.recalls) out.recall_distances.push_back(r.distance());
        (is_val[static_cast<size_t>(i)] ? val_text : train_text).push_back(std::move(doc.text));
    }
    std::filesystem::remove(manifest_path, ec);  // stale until every file is rewritten
    std::unique_ptr<Tokenizer> tok;
    if (bpe_vocab > 0) {
        // Trained on the train split only, so validation text is never seen by the tokenizer.
        BpeTrainOptions bo;
        bo.vocab_size = bpe_vocab;
        BpeTrainer trainer(bo);
        for (const std::string& t : train_text) trainer.add(t);
        write_file_atomic(tokenizer_path, trainer.train());
    }
    tok = load_tokenizer(out.tokenizer);
    std::vector<std::vector<int32_t>> train, val;
    for (const std::string& t : train_text) train.push_back(tok->encode(t));
    for (const std::string& t : val_text) val.push_back(tok->encode(t));
    out.vocab_size = tok->vocab_size();
    write_shard(out.train_path, train, tok->vocab_size());
    write_shard(out.val_path, val, tok->vocab_size());
    for (const auto& d : train) out.train_lengths.push_back(static_cast<int64_t>(d.size()));
    for (const auto& d : val) out.val_lengths.push_back(static_cast<int64_t>(d.size()));
    write_file_atomic(manifest_path, want.dump(2) + "\n");
    return out;
}

}  // namespace ctx
