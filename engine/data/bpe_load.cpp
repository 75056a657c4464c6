// Loading BpeTokenizer from HF tokenizer.json or GPT-2's vocab.json + merges.txt.
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "data/bpe_json.h"
#include "data/bpe_tokenizer.h"
#include "data/utf8.h"

namespace ctx {
namespace {

using bpe::Json;
namespace fs = std::filesystem;

constexpr int64_t kMaxTokenId = 100'000'000;  // sane bound: ids index dense tables
constexpr int kMaxJsonDepth = 128;

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("tokenizer {}: cannot open: {}", path, std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) fail("tokenizer {}: read error", path);
    return ss.str();
}

Json parse_json(std::string_view text, const std::string& origin) {
    // nlohmann parses any depth, but dump() (in messages) recurses per level: a deeply nested
    // value ([[[[...]]]], a few hundred KB) would overflow the stack. serde_json, which HF
    // tokenizers reads with, stops at the same depth.
    auto limit_depth = [&](int depth, Json::parse_event_t, Json&) {
        if (depth > kMaxJsonDepth)
            fail("tokenizer {}: JSON nested deeper than {} levels", origin, kMaxJsonDepth);
        return true;
    };
    try {
        return Json::parse(text.begin(), text.end(), limit_depth);
    } catch (const Json::exception& e) {  // parse_error, and out_of_range for 1e999
        // nlohmann's message carries the line and column ("... at line 3, column 5: ...").
        fail("tokenizer {}: malformed JSON: {}", origin, e.what());
    }
}

std::string quoted_key(const std::string& where, const std::string& key) {
    return where + "[" + Json(key).dump() + "]";
}

bpe::Vocab vocab_from_json(const Json& j, const std::string& where) {
    if (!j.is_object())
        fail("{}: expected an object of token -> id, got {}", where.empty() ? "vocabulary" : where,
             bpe::json_kind(j));
    bpe::Vocab vocab;
    vocab.reserve(j.size());
    for (auto it = j.begin(); it != j.end(); ++it) {
        const Json& v = it.value();
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxTokenId)
            fail("{}: expected a token id in [0, {}], got {}", quoted_key(where, it.key()),
                 kMaxTokenId, v.dump());
        vocab.emplace(it.key(), static_cast<int32_t>(v.get<int64_t>()));
    }
    return vocab;
}

// "a b": exactly one space (HF splits on ' ' and wants two parts).
bool split_merge_line(std::string_view line, bpe::MergeRule& rule) {
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
        return false;
    rule.left = std::string(line.substr(0, space));
    rule.right = std::string(line.substr(space + 1));
    return true;
}

std::vector<bpe::MergeRule> merges_from_json(const Json& j, const std::string& where) {
    if (!j.is_array()) fail("{}: expected an array, got {}", where, bpe::json_kind(j));
    std::vector<bpe::MergeRule> merges;
    merges.reserve(j.size());
    for (size_t i = 0; i < j.size(); ++i) {
        const Json& m = j[i];
        bpe::MergeRule rule;
        rule.where = bpe::json_index(where, i);
        bool ok = false;
        if (m.is_string()) {
            ok = split_merge_line(m.get_ref<const std::string&>(), rule);
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
            rule.left = m[0].get<std::string>();
            rule.right = m[1].get<std::string>();
            ok = true;
        }
        if (!ok)
            fail("{}: expected \"a b\" or [\"a\", \"b\"], got {}", rule.where, m.dump());
        merges.push_back(std::move(rule));
    }
    return merges;
}

bpe::BpeModel model_from_json(const Json& root) {
    const Json& model = bpe::json_require(root, "model", "tokenizer");
    if (!model.is_object()) fail("model: expected an object, got {}", bpe::json_kind(model));
    std::string type;
    if (const Json* t = bpe::json_find(model, "type")) {
        if (!t->is_string()) fail("model.type: expected a string, got {}", bpe::json_kind(*t));
        type = t->get<std::string>();
    } else if (bpe::json_find(model, "merges")) {
        type = "BPE";  // old files without "type"
    }
    if (type != "BPE")
        fail("model.type: unsupported model type \"{}\" (only BPE is supported, not WordPiece, "
             "Unigram or WordLevel)", type.empty() ? "(missing)" : type);
    if (const Json* d = bpe::json_find(model, "dropout"); d && !d->is_null()) {
        if (!d->is_number() || d->get<double>() != 0.0)
            fail("model.dropout: BPE dropout ({}) is not supported; set it to null", d->dump());
    }
    bpe::BpeOptions opt;
    if (const Json* u = bpe::json_find(model, "unk_token"); u && !u->is_null()) {
        if (!u->is_string()) fail("model.unk_token: expected a string, got {}", bpe::json_kind(*u));
        opt.unk_token = u->get<std::string>();
    }
    opt.continuing_subword_prefix =
        bpe::json_string_or(model, "continuing_subword_prefix", "", "model");
    opt.end_of_word_suffix = bpe::json_string_or(model, "end_of_word_suffix", "", "model");
    opt.fuse_unk = bpe::json_bool_or(model, "fuse_unk", false, "model");
    opt.byte_fallback = bpe::json_bool_or(model, "byte_fallback", false, "model");
    opt.ignore_merges = bpe::json_bool_or(model, "ignore_merges", false, "model");
    bpe::Vocab vocab = vocab_from_json(bpe::json_require(model, "vocab", "model"), "model.vocab");
    const Json* merges = bpe::json_find(model, "merges");
    std::vector<bpe::MergeRule> rules;
    if (merges && !merges->is_null()) rules = merges_from_json(*merges, "model.merges");
    return bpe::BpeModel(std::move(vocab), rules, std::move(opt));
}

BpeTokenizer::Decoder decoder_from_json(const Json& j, const std::string& where) {
    if (j.is_null()) return BpeTokenizer::Decoder::JoinWithSpaces;
    const std::string type = bpe::json_type(j, where);
    if (type == "ByteLevel") return BpeTokenizer::Decoder::ByteLevel;
    if (type == "Sequence") {
        const Json& list = bpe::json_array(j, "decoders", where);
        if (list.size() == 1)
            return decoder_from_json(list[0], bpe::json_index(where + ".decoders", 0));
    }
    fail("{}: unsupported decoder type \"{}\" (supported: ByteLevel, or null)", where, type);
}

// HF's AddedVocabulary: each token keeps the id it already has (an earlier added token, or the
// model's token with that content), else takes the next id after the model and earlier ones.
// The ids written in the file are only checked, as HF does.
std::vector<bpe::AddedToken> added_from_json(const Json& list, const bpe::BpeModel& model) {
    std::vector<bpe::AddedToken> tokens;
    std::map<std::string, size_t> index;
    int64_t max_added = -1;
    for (size_t i = 0; i < list.size(); ++i) {
        const std::string where = bpe::json_index("added_tokens", i);
        const Json& j = list[i];
        bpe::AddedToken t;
        t.content = bpe::json_string(j, "content", where);
        t.single_word = bpe::json_bool_or(j, "single_word", false, where);
        t.lstrip = bpe::json_bool_or(j, "lstrip", false, where);
        t.rstrip = bpe::json_bool_or(j, "rstrip", false, where);
        t.special = bpe::json_bool_or(j, "special", false, where);
        t.normalized = bpe::json_bool_or(j, "normalized", !t.special, where);
        const Json& id = bpe::json_require(j, "id", where);
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxTokenId)
            fail("{}.id: expected a token id in [0, {}], got {}", where, kMaxTokenId, id.dump());
        if (t.content.empty()) continue;
        if (auto it = index.find(t.content); it != index.end()) {
            t.id = tokens[it->second].id;
            tokens[it->second] = t;
        } else {
            if (auto m = model.token_to_id(t.content)) {
                t.id = *m;
            } else {
                const auto size = static_cast<int64_t>(model.size());
                t.id = static_cast<int32_t>(max_added < 0 ? size
                                            : (max_added >= size || size == 0) ? max_added + 1
                                                                               : size);
            }
            index.emplace(t.content, tokens.size());
            tokens.push_back(t);
        }
        max_added = std::max<int64_t>(max_added, t.id);
        if (t.id != id.get<int64_t>())
            spdlog::warn("tokenizer: added token '{}' is written with id {} but gets id {} (as in "
                         "HF tokenizers)", t.content, id.get<int64_t>(), t.id);
    }
    return tokens;
}

std::optional<int32_t> id_of(const BpeTokenizer::Parts& p, const std::string& token) {
    for (const auto& t : p.added)
        if (t.content == token) return t.id;
    return p.model.token_to_id(token);
}

// eos/bos: tokenizer_config.json beside the file when it names them, else the usual spellings
// (GPT-2 and NeoX use <|endoftext|> for both).
void resolve_eos_bos(BpeTokenizer::Parts& p, const fs::path& dir) {
    auto config_token = [&](const Json& config, const char* key) -> std::optional<int32_t> {
        const Json* v = bpe::json_find(config, key);
        if (!v) return std::nullopt;
        if (v->is_object()) v = bpe::json_find(*v, "content");
        if (!v || !v->is_string()) return std::nullopt;
        return id_of(p, v->get<std::string>());
    };
    const fs::path config_path = dir / "tokenizer_config.json";
    std::error_code ec;
    if (!dir.empty() && fs::is_regular_file(config_path, ec)) {
        try {
            const Json config = Json::parse(read_file(config_path.string()));
            p.eos = config_token(config, "eos_token");
            p.bos = config_token(config, "bos_token");
        } catch (const std::exception& e) {
            spdlog::warn("tokenizer: ignoring {}: {}", config_path.string(), e.what());
        }
    }
    auto first_of = [&](std::initializer_list<const char*> names) -> std::optional<int32_t> {
        for (const char* n : names)
            if (auto id = id_of(p, n)) return id;
        return std::nullopt;
    };
    if (!p.eos) p.eos = first_of({"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>"});
    if (!p.bos) p.bos = first_of({"<s>", "<|begin_of_text|>", "<bos>", "<|bos|>", "<|endoftext|>"});
}

void check_tokens_are_utf8(const bpe::Vocab& vocab, const std::string& where) {
    for (const auto& [token, id] : vocab)
        if (utf8::find_invalid(token) != std::string_view::npos)
            fail("{}: token with id {} is not valid UTF-8", where, id);
}

std::unique_ptr<BpeTokenizer> build_from_json(const Json& root, const std::string& origin) {
    if (!root.is_object()) fail("expected a JSON object at the top, got {}", bpe::json_kind(root));
    if (const Json* v = bpe::json_find(root, "version"); v && !(v->is_string() && *v == "1.0"))
        fail("version: unknown tokenizer.json version {} (expected \"1.0\")", v->dump());
    static const Json null_json;
    auto member = [&](const char* key) -> const Json& {
        const Json* v = bpe::json_find(root, key);
        return v ? *v : null_json;
    };
    BpeTokenizer::Parts p;
    p.normalizer = bpe::Normalizer::from_json(member("normalizer"), "normalizer");
    p.pre_tokenizer = bpe::PreTokenizer::from_json(member("pre_tokenizer"), "pre_tokenizer");
    p.model = model_from_json(root);
    p.decoder = decoder_from_json(member("decoder"), "decoder");
    if (const Json& added = member("added_tokens"); !added.is_null()) {
        if (!added.is_array())
            fail("added_tokens: expected an array, got {}", bpe::json_kind(added));
        p.added = added_from_json(added, p.model);
    }
    p.source = origin;
    resolve_eos_bos(p, fs::path(origin).parent_path());
    return std::make_unique<BpeTokenizer>(std::move(p));
}

}  // namespace

std::unique_ptr<BpeTokenizer> parse_bpe_tokenizer_json(std::string_view json_text,
                                                       const std::string& origin) {
    const Json root = parse_json(json_text, origin);
    try {
        return build_from_json(root, origin);
    } catch (const Error& e) {
        fail("tokenizer {}: {}", origin, e.what());
    }
}

std::unique_ptr<BpeTokenizer> load_bpe_tokenizer_json(const std::string& path) {
    return parse_bpe_tokenizer_json(read_file(path), path);
}

std::unique_ptr<BpeTokenizer> load_bpe_vocab_merges(const std::string& vocab_path,
                                                    const std::string& merges_path) {
    BpeTokenizer::Parts p;
    bpe::Vocab vocab;
    try {
        vocab = vocab_from_json(parse_json(read_file(vocab_path), vocab_path), "");
        check_tokens_are_utf8(vocab, "vocabulary");
    } catch (const Error& e) {
        if (std::string(e.what()).rfind("tokenizer ", 0) == 0) throw;
        fail("tokenizer {}: {}", vocab_path, e.what());
    }
    // merges.txt: "a b" per line; "#version" lines and blank lines are skipped.
    std::vector<bpe::MergeRule> merges;
    {
        const std::string text = read_file(merges_path);
        std::istringstream in(text);
        std::string line;
        for (size_t line_no = 1; std::getline(in, line); ++line_no) {
            if (!line.empty() && line.back() == '\r') line.pop_back();  // as Rust's lines()
            if (line.empty() || line.rfind("#version", 0) == 0) continue;
            bpe::MergeRule rule;
            rule.where = fmt::format("line {}", line_no);
            if (utf8::find_invalid(line) != std::string_view::npos)
                fail("tokenizer {}: line {}: not valid UTF-8", merges_path, line_no);
            if (!split_merge_line(line, rule))
                fail("tokenizer {}: line {}: expected \"a b\", got \"{}\"", merges_path, line_no,
                     line);
            merges.push_back(std::move(rule));
        }
    }
    try {
        p.model = bpe::BpeModel(std::move(vocab), merges, {});
    } catch (const Error& e) {
        fail("tokenizer {}: {}", merges_path, e.what());
    }
    p.pre_tokenizer = bpe::PreTokenizer::gpt2();
    p.decoder = BpeTokenizer::Decoder::ByteLevel;
    if (auto eot = p.model.token_to_id("<|endoftext|>")) {
        bpe::AddedToken t;
        t.content = "<|endoftext|>";
        t.id = *eot;
        t.special = true;
        t.normalized = false;
        p.added.push_back(t);
    }
    p.source = vocab_path;
    resolve_eos_bos(p, fs::path(vocab_path).parent_path());
    return std::make_unique<BpeTokenizer>(std::move(p));
}

}  // namespace ctx
