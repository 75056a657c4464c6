#include "cli/data_cmd.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "data/byte_tokenizer.h"
#include "data/corpus.h"
#include "data/corpus_shards.h"
#include "data/recall_qa.h"
#include "data/shard.h"
#include "data/windows.h"

namespace ctx {
namespace {

struct UsageError : Error {
    using Error::Error;
};

void usage(FILE* out) {
    std::fprintf(
        out,
        "usage: ctxengine data generate --out DIR [--docs N] [--min-len N] [--max-len N]\n"
        "                               [--seed N] [--val-fraction F] [--facts N]\n"
        "                               [--recall-rate F] [--min-distance N]\n"
        "                               [--max-distance N] [--bpe N] [--le LIST]\n"
        "       ctxengine data info FILE.shard [--le LIST]\n"
        "       ctxengine data qa --out FILE.jsonl --context N [--qa-docs N] [--first-doc N]\n"
        "                         [--max-items N] [--min-answer-distance N] [corpus options]\n\n"
        "generate  writes the synthetic long-document corpus (byte tokens, vocab 259) as\n"
        "          DIR/train.shard and DIR/val.shard, split by document, and prints a summary.\n"
        "          Defaults: --docs 1000 --min-len 2000 --max-len 12000 --seed 1\n"
        "          --val-fraction 0.1 --facts 6 --recall-rate 0.9 --min-distance 192\n"
        "          --max-distance 4096 (bytes from a fact's latest mention to its recall,\n"
        "          log-uniform; choose them around the Lt and Le you will train with)\n"
        "          --bpe N: tokens from a byte-level BPE of N tokens trained on the train\n"
        "          split (DIR/tokenizer.json) instead of bytes\n"
        "info      validates a shard and prints its header and document statistics.\n"
        "qa        writes AltQA-shaped question rows from generated documents: N bytes of\n"
        "          context ending in \"Question: what is ...? Answer:\" and the recalled value\n"
        "          (docs/EVAL.md). Documents --first-doc (default: --docs, i.e. ones the corpus\n"
        "          with these options never contained) .. + --qa-docs (default 100).\n"
        "--le      comma-separated window lengths to count windows for\n"
        "          (default 64,128,256,512,1024,2048,4096).\n");
}

int64_t parse_int(const std::string& flag, const std::string& v) {
    try {
        size_t used = 0;
        const long long x = std::stoll(v, &used);
        if (used == v.size()) return x;
    } catch (...) {
    }
    throw UsageError(fmt::format("{} expects an integer, got '{}'", flag, v));
}

double parse_double(const std::string& flag, const std::string& v) {
    try {
        size_t used = 0;
        const double x = std::stod(v, &used);
        if (used == v.size()) return x;
    } catch (...) {
    }
    throw UsageError(fmt::format("{} expects a number, got '{}'", flag, v));
}

std::vector<int64_t> parse_le(const std::string& v) {
    std::vector<int64_t> out;
    std::stringstream ss(v);
    std::string item;
    while (std::getline(ss, item, ',')) {
        const int64_t le = parse_int("--le", item);
        if (le <= 0) throw UsageError(fmt::format("--le values must be positive, got {}", le));
        out.push_back(le);
    }
    if (out.empty()) throw UsageError("--le needs at least one window length");
    return out;
}

// Flags of the form --name VALUE after the positional words.
std::map<std::string, std::string> parse_flags(const std::vector<std::string>& args, size_t from,
                                               const std::vector<std::string>& known) {
    std::map<std::string, std::string> flags;
    for (size_t i = from; i < args.size(); ++i) {
        const std::string& a = args[i];
        if (std::find(known.begin(), known.end(), a) == known.end())
            throw UsageError(fmt::format("unknown option '{}'", a));
        if (i + 1 >= args.size()) throw UsageError(fmt::format("{} needs a value", a));
        flags[a] = args[++i];
    }
    return flags;
}

// Documents, tokens, a power-of-two length histogram, and windows per Le.
void print_summary(const std::string& name, const std::vector<int64_t>& lengths,
                   const std::vector<int64_t>& les) {
    int64_t tokens = 0, lo = lengths.empty() ? 0 : INT64_MAX, hi = 0;
    std::map<int64_t, int64_t> hist;  // bucket floor (power of two) -> docs
    for (int64_t n : lengths) {
        tokens += n;
        lo = std::min(lo, n);
        hi = std::max(hi, n);
        int64_t b = 1;
        while (b * 2 <= n) b *= 2;
        ++hist[n == 0 ? 0 : b];
    }
    std::printf("%s: %zu docs, %lld tokens (min %lld, mean %.1f, max %lld per doc)\n",
                name.c_str(), lengths.size(), static_cast<long long>(tokens),
                static_cast<long long>(lo),
                lengths.empty() ? 0.0 : static_cast<double>(tokens) / lengths.size(),
                static_cast<long long>(hi));
    std::printf("  length histogram (tokens):\n");
    for (const auto& [b, count] : hist)
        std::printf("    [%6lld, %6lld)  %lld\n", static_cast<long long>(b),
                    static_cast<long long>(b == 0 ? 1 : 2 * b), static_cast<long long>(count));
    std::printf("  %8s %10s %10s %12s\n", "Le", "docs>Le", "windows", "tokens used");
    for (int64_t le : les) {
        int64_t docs = 0, windows = 0;
        for (int64_t n : lengths) {
            const int64_t w = windows_in_doc(n, le);
            docs += w > 0;
            windows += w;
        }
        std::printf("  %8lld %10lld %10lld %12lld\n", static_cast<long long>(le),
                    static_cast<long long>(docs), static_cast<long long>(windows),
                    static_cast<long long>(windows * le));
    }
}

CorpusOptions corpus_flags(const std::map<std::string, std::string>& f) {
    CorpusOptions o;
    if (f.count("--docs")) o.n_docs = parse_int("--docs", f.at("--docs"));
    if (f.count("--min-len")) o.min_len = parse_int("--min-len", f.at("--min-len"));
    if (f.count("--max-len")) o.max_len = parse_int("--max-len", f.at("--max-len"));
    if (f.count("--seed")) o.seed = static_cast<uint64_t>(parse_int("--seed", f.at("--seed")));
    if (f.count("--facts"))
        o.facts_per_doc = static_cast<int>(parse_int("--facts", f.at("--facts")));
    if (f.count("--recall-rate"))
        o.recall_rate = parse_double("--recall-rate", f.at("--recall-rate"));
    if (f.count("--min-distance"))
        o.min_distance = parse_int("--min-distance", f.at("--min-distance"));
    if (f.count("--max-distance"))
        o.max_distance = parse_int("--max-distance", f.at("--max-distance"));
    try {
        o.validate();
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    return o;
}

const std::vector<std::string> kCorpusFlags = {"--docs", "--min-len", "--max-len", "--seed",
                                               "--facts", "--recall-rate", "--min-distance",
                                               "--max-distance"};

std::vector<std::string> with_corpus_flags(std::vector<std::string> flags) {
    flags.insert(flags.end(), kCorpusFlags.begin(), kCorpusFlags.end());
    return flags;
}

int cmd_generate(const std::vector<std::string>& args) {
    const auto f =
        parse_flags(args, 1, with_corpus_flags({"--out", "--val-fraction", "--le", "--bpe"}));
    if (!f.count("--out")) throw UsageError("data generate needs --out DIR");
    const CorpusOptions o = corpus_flags(f);
    const double val_fraction =
        f.count("--val-fraction") ? parse_double("--val-fraction", f.at("--val-fraction")) : 0.1;
    const auto les = parse_le(f.count("--le") ? f.at("--le") : "64,128,256,512,1024,2048,4096");
    if (!(val_fraction >= 0.0 && val_fraction <= 1.0))
        throw UsageError(fmt::format("--val-fraction must be in [0, 1], got {}", val_fraction));

    const int64_t bpe = f.count("--bpe") ? parse_int("--bpe", f.at("--bpe")) : 0;
    if (bpe != 0 && (bpe < 257 || bpe > (1 << 24)))
        throw UsageError(fmt::format("--bpe must be 0 (bytes) or a vocabulary size in [257, {}], "
                                     "got {}", 1 << 24, bpe));
    const CorpusShards shards =
        write_corpus_shards(f.at("--out"), o, val_fraction, static_cast<int32_t>(bpe));
    const std::string& train_path = shards.train_path;
    const std::string& val_path = shards.val_path;
    std::vector<int64_t> distances = shards.recall_distances;
    const int64_t recalls = static_cast<int64_t>(distances.size());
    int64_t far = 0;
    if (shards.reused) std::printf("the shards in %s already hold this corpus\n", f.at("--out").c_str());
    std::printf("corpus: seed %llu, %lld docs, lengths [%lld, %lld] bytes, %d facts live, recall "
                "rate %.2f\n", static_cast<unsigned long long>(o.seed),
                static_cast<long long>(o.n_docs), static_cast<long long>(o.min_len),
                static_cast<long long>(o.max_len), o.facts_per_doc, o.recall_rate);
    if (!distances.empty()) {
        std::sort(distances.begin(), distances.end());
        for (int64_t d : distances) far += d > 256;
        const auto q = [&](double p) {
            return static_cast<long long>(distances[static_cast<size_t>(p * (distances.size() - 1))]);
        };
        std::printf("recalls: %lld, distance to the source mention (bytes): p10 %lld, median %lld, "
                    "p90 %lld; %.1f%% beyond 256\n", static_cast<long long>(recalls), q(0.1),
                    q(0.5), q(0.9), 100.0 * static_cast<double>(far) / distances.size());
    }
    if (bpe > 0)
        std::printf("tokenizer: %s (byte-level BPE, vocabulary %d, trained on the train split)\n",
                    shards.tokenizer.c_str(), shards.vocab_size);
    print_summary(train_path, shards.train_lengths, les);
    print_summary(val_path, shards.val_lengths, les);
    return 0;
}

int cmd_info(const std::vector<std::string>& args) {
    if (args.size() < 2 || args[1].rfind("--", 0) == 0)
        throw UsageError("data info needs a shard file");
    const auto f = parse_flags(args, 2, {"--le"});
    const auto les = parse_le(f.count("--le") ? f.at("--le") : "64,128,256,512,1024,2048,4096");
    const ShardReader shard(args[1]);
    std::printf("%s: shard version %u, %d-byte tokens, vocab_size %d, %lld docs, %lld tokens\n",
                shard.path().c_str(), kShardVersion, shard.token_bytes(), shard.vocab_size(),
                static_cast<long long>(shard.n_docs()), static_cast<long long>(shard.n_tokens()));
    print_summary(shard.path(), shard.doc_lengths(), les);
    return 0;
}

int cmd_qa(const std::vector<std::string>& args) {
    const auto f = parse_flags(args, 1, with_corpus_flags({"--out", "--context", "--qa-docs",
                                                           "--first-doc", "--max-items",
                                                           "--min-answer-distance"}));
    if (!f.count("--out")) throw UsageError("data qa needs --out FILE.jsonl");
    if (!f.count("--context")) throw UsageError("data qa needs --context BYTES");
    RecallQaOptions q;
    q.corpus = corpus_flags(f);
    q.context = parse_int("--context", f.at("--context"));
    if (f.count("--qa-docs")) q.docs = parse_int("--qa-docs", f.at("--qa-docs"));
    q.first_doc = f.count("--first-doc") ? parse_int("--first-doc", f.at("--first-doc"))
                                         : q.corpus.n_docs;
    if (f.count("--max-items")) q.max_items = parse_int("--max-items", f.at("--max-items"));
    if (f.count("--min-answer-distance"))
        q.min_distance = parse_int("--min-answer-distance", f.at("--min-answer-distance"));
    std::vector<RecallQaItem> items;
    try {
        items = make_recall_qa(q);
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    std::string text;
    int64_t far = 0;
    for (const RecallQaItem& it : items) {
        text += recall_qa_jsonl(it) + "\n";
        far += it.distance > q.context / 2;
    }
    write_file_atomic(f.at("--out"), text);
    std::printf("wrote %s: %zu questions from documents %lld..%lld, %lld bytes of context each; "
                "%lld with the answer in the first half of the context\n",
                f.at("--out").c_str(), items.size(), static_cast<long long>(q.first_doc),
                static_cast<long long>(q.first_doc + q.docs - 1),
                static_cast<long long>(q.context), static_cast<long long>(far));
    return 0;
}

}  // namespace

int run_data_command(const std::vector<std::string>& args) {
    try {
        if (args.empty() || args[0] == "--help" || args[0] == "-h") {
            usage(args.empty() ? stderr : stdout);
            return args.empty() ? 2 : 0;
        }
        if (args[0] == "generate") return cmd_generate(args);
        if (args[0] == "qa") return cmd_qa(args);
        if (args[0] == "info") return cmd_info(args);
        throw UsageError(fmt::format("unknown data command '{}' (known: generate, info, qa)", args[0]));
    } catch (const UsageError& e) {
        std::fprintf(stderr, "ctxengine data: %s\n", e.what());
        usage(stderr);
        return 2;
    } catch (const Error& e) {
        std::fprintf(stderr, "ctxengine data: %s\n", e.what());
        return 1;
    }
}

}  // namespace ctx
