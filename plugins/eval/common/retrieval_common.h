// Shared by the generation-scored retrieval tasks (eval/longchat_lines, eval/altqa, and through
// probe_runner.h eval/passkey and eval/ruler_niah): JSON rows from files with file:line errors,
// record-safe text, scoring rules, checked options, chat templates, tokenization and batched
// greedy generation through ctx_eval_api. Header-only (namespace ctx_retrieval), so each plugin
// stays one self-contained shared library.
//
// Errors are thrown as TaskError inside the plugin and turned into a status + message at the ABI
// boundary (entry_point below): no exception ever leaves a plugin call.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ctx/plugin.h"

namespace ctx_retrieval {

// A failure with the status the plugin call returns.
struct TaskError : std::runtime_error {
    ctx_status status;
    explicit TaskError(const std::string& message, ctx_status s = CTX_ERR_INVALID_ARGUMENT)
        : std::runtime_error(message), status(s) {}
};

[[noreturn]] inline void fail(const std::string& message) { throw TaskError(message); }

// Runs body and converts anything it throws into a status and a message in err.
inline ctx_status entry_point(ctx_err* err, const std::function<void()>& body) {
    try {
        body();
        return CTX_OK;
    } catch (const TaskError& e) {
        ctx_err_set(err, e.what());
        return e.status;
    } catch (const std::bad_alloc&) {
        ctx_err_set(err, "out of memory");
        return CTX_ERR_OUT_OF_MEMORY;
    } catch (const std::exception& e) {
        ctx_err_set(err, e.what());
        return CTX_ERR_INTERNAL;
    } catch (...) {
        ctx_err_set(err, "unknown internal error");
        return CTX_ERR_INTERNAL;
    }
}

// ---------------------------------------------------------------- text
inline bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Python's str.strip() for ASCII whitespace (the published answers are stripped this way).
inline std::string_view strip(std::string_view s) {
    size_t b = 0, e = s.size();
    while (b < e && is_space(s[b])) ++b;
    while (e > b && is_space(s[e - 1])) --e;
    return s.substr(b, e - b);
}

// Length of the valid UTF-8 sequence starting at s[i], or 0 if the bytes there are not one.
inline size_t utf8_seq_len(std::string_view s, size_t i) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return 0;
    for (size_t k = 1; k < n; ++k)
        if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
    if (n == 2 && c < 0xC2) return 0;  // overlong
    return n;
}

// Text for a record: model output may be any bytes (a byte-level model emits invalid UTF-8,
// which JSON cannot carry), so invalid bytes and control characters become '?', line breaks and
// tabs become spaces (one CSV row per item, as Giraffe's log lines), and the result is cut to
// max_bytes at a character boundary.
inline std::string record_text(std::string_view s, size_t max_bytes) {
    std::string out;
    for (size_t i = 0; i < s.size();) {
        const size_t n = utf8_seq_len(s, i);
        if (n == 0) {
            if (out.size() + 1 > max_bytes) break;
            out += '?';
            ++i;
            continue;
        }
        if (out.size() + n > max_bytes) break;
        const auto c = static_cast<unsigned char>(s[i]);
        if (n == 1 && (c == '\n' || c == '\r' || c == '\t'))
            out += ' ';
        else if (n == 1 && (c < 0x20 || c == 0x7F))
            out += '?';
        else
            out.append(s.substr(i, n));
        i += n;
    }
    return out;
}

// Giraffe's (and landmark attention's) integer rule: the first run of ASCII digits in the text
// as an integer (a sign is not part of it: "-7" reads 7), or -1 when there is none. Leading
// zeros are dropped (int("007") == 7); runs longer than 18 digits saturate to INT64_MAX, which
// no expected value equals.
inline int64_t first_integer(std::string_view text) {
    size_t i = 0;
    while (i < text.size() && !(text[i] >= '0' && text[i] <= '9')) ++i;
    if (i == text.size()) return -1;
    int64_t v = 0;
    int digits = 0;
    bool saturated = false;
    for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
        if (v == 0 && digits == 0 && text[i] == '0') continue;
        if (++digits > 18)
            saturated = true;
        else
            v = v * 10 + (text[i] - '0');
    }
    return saturated ? INT64_MAX : v;
}

// Case-insensitive (ASCII) substring test: RULER's string_match_all per gold value.
inline bool contains_ignore_case(std::string_view text, std::string_view needle) {
    auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    if (needle.empty()) return true;
    for (size_t i = 0; i + needle.size() <= text.size(); ++i) {
        size_t k = 0;
        while (k < needle.size() && lower(text[i + k]) == lower(needle[k])) ++k;
        if (k == needle.size()) return true;
    }
    return false;
}

// ---------------------------------------------------------------- chat template
// "{prompt}" must occur exactly once; "" means no template.
inline void check_template(const std::string& tpl) {
    if (tpl.empty()) return;
    const size_t at = tpl.find("{prompt}");
    if (at == std::string::npos || tpl.find("{prompt}", at + 1) != std::string::npos)
        fail("option 'chat_template' must contain \"{prompt}\" exactly once, got \"" + tpl + "\"");
}

inline std::string apply_template(const std::string& tpl, const std::string& prompt) {
    if (tpl.empty()) return prompt;
    const size_t at = tpl.find("{prompt}");
    return tpl.substr(0, at) + prompt + tpl.substr(at + 8);
}

// ---------------------------------------------------------------- files and rows
struct Row {
    std::string file;   // path as given
    int64_t line = 0;   // 1-based line in the file (JSONL) or 0 (array element)
    int64_t index = 0;  // 0-based row index within the file
    nlohmann::json value;
    std::string where() const {
        return line > 0 ? file + ":" + std::to_string(line)
                        : file + " [element " + std::to_string(index) + "]";
    }
};

// "a.jsonl;b.jsonl" -> paths (the option ABI has no string lists).
inline std::vector<std::string> split_paths(const std::string& spec) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= spec.size()) {
        size_t end = spec.find(';', start);
        if (end == std::string::npos) end = spec.size();
        const std::string_view p = strip(std::string_view(spec).substr(start, end - start));
        if (!p.empty()) out.emplace_back(p);
        start = end + 1;
    }
    return out;
}

// "dir/2k.jsonl" -> "2k": names a split in records.
inline std::string file_stem(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    const size_t dot = name.find_last_of('.');
    return dot == std::string::npos || dot == 0 ? name : name.substr(0, dot);
}

// JSON Lines (one object per non-blank line), or one JSON array of objects when the file's
// first non-blank character is '['. Every row must be an object.
inline std::vector<Row> read_rows(const std::string& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) fail("'" + path + "' is a directory, not a file");
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot open '" + path + "': " + std::strerror(errno));
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<Row> rows;
    const std::string_view body = strip(all);
    if (!body.empty() && body.front() == '[') {
        nlohmann::json arr;
        try {
            arr = nlohmann::json::parse(body);
        } catch (const nlohmann::json::exception& e) {
            fail(path + ": not valid JSON (expected a JSON array of row objects): " + e.what());
        }
        for (size_t i = 0; i < arr.size(); ++i) {
            Row r{path, 0, static_cast<int64_t>(i), std::move(arr[i])};
            if (!r.value.is_object()) fail(r.where() + ": expected a JSON object");
            rows.push_back(std::move(r));
        }
        if (rows.empty()) fail("'" + path + "' holds no rows");
        return rows;
    }
    size_t pos = 0;
    int64_t line = 0;
    while (pos < all.size()) {
        size_t end = all.find('\n', pos);
        if (end == std::string::npos) end = all.size();
        ++line;
        const std::string_view text = strip(std::string_view(all).substr(pos, end - pos));
        pos = end + 1;
        if (text.empty()) continue;
        Row r{path, line, static_cast<int64_t>(rows.size()), {}};
        try {
            r.value = nlohmann::json::parse(text);
        } catch (const nlohmann::json::exception& e) {
            fail(r.where() +
                 ": malformed JSON line (expected one JSON object per line): " + e.what());
        }
        if (!r.value.is_object())
            fail(r.where() + ": expected a JSON object, got " + r.value.type_name());
        rows.push_back(std::move(r));
    }
    if (rows.empty()) fail("'" + path + "' holds no rows");
    return rows;
}

// A required string field (non-empty after stripping when nonempty is set).
inline std::string string_field(const Row& r, const char* key, bool nonempty = true) {
    const auto it = r.value.find(key);
    if (it == r.value.end()) fail(r.where() + ": missing field '" + key + "'");
    if (!it->is_string())
        fail(r.where() + ": field '" + key + "' must be a string, got " + it->type_name());
    std::string s = it->get<std::string>();
    if (nonempty && strip(s).empty()) fail(r.where() + ": field '" + key + "' is empty");
    return s;
}

// An integer field given as a JSON integer or a string of digits; returns false when absent.
inline bool integer_field(const Row& r, const char* key, int64_t* out) {
    const auto it = r.value.find(key);
    if (it == r.value.end()) return false;
    if (it->is_number_integer()) {
        *out = it->get<int64_t>();
        return true;
    }
    if (it->is_number_float()) {
        const double d = it->get<double>();
        if (d == static_cast<double>(static_cast<int64_t>(d))) {
            *out = static_cast<int64_t>(d);
            return true;
        }
    }
    if (it->is_string()) {
        const std::string_view s = strip(it->get_ref<const std::string&>());
        bool digits = !s.empty() && s.size() <= 18;
        for (char c : s) digits = digits && c >= '0' && c <= '9';
        if (digits) {
            *out = std::stoll(std::string(s));
            return true;
        }
    }
    fail(r.where() + ": field '" + key + "' must be an integer, got " + it->dump());
}

// ---------------------------------------------------------------- the host
// The ABI 1.2 services these tasks need; fails with a clear message on an older host.
inline void require_text_api(const ctx_eval_api* api, const char* task) {
    if (!api || !ctx_eval_api_has(api, tokenize) || !ctx_eval_api_has(api, detokenize) ||
        !ctx_eval_api_has(api, special_token) || !ctx_eval_api_has(api, generate))
        throw TaskError(std::string(task) +
                            " needs a host with plugin ABI >= 1.2 (tokenize, detokenize, "
                            "special_token, generate); this ctxengine's evaluation API is older",
                        CTX_ERR_UNSUPPORTED);
}

inline std::vector<int32_t> tokenize(const ctx_eval_api* api, ctx_eval_host* h,
                                     const std::string& text) {
    ctx_err err{};
    // Most tokenizers give at most one id per byte; a few more covers added BOS/EOS.
    std::vector<int32_t> ids(text.size() + 8);
    int64_t n = api->tokenize(h, text.data(), static_cast<int64_t>(text.size()), ids.data(),
                              static_cast<int64_t>(ids.size()), &err);
    if (n < 0) fail(std::string("tokenize failed: ") + err.message);
    if (n > static_cast<int64_t>(ids.size())) {
        ids.resize(static_cast<size_t>(n));
        n = api->tokenize(h, text.data(), static_cast<int64_t>(text.size()), ids.data(), n, &err);
        if (n < 0) fail(std::string("tokenize failed: ") + err.message);
    }
    ids.resize(static_cast<size_t>(n));
    return ids;
}

inline std::string detokenize(const ctx_eval_api* api, ctx_eval_host* h, const int32_t* ids,
                              int64_t n) {
    if (n == 0) return {};
    ctx_err err{};
    const int64_t len = api->detokenize(h, ids, n, nullptr, 0, &err);
    if (len < 0) fail(std::string("detokenize failed: ") + err.message);
    std::string out(static_cast<size_t>(len) + 1, '\0');
    if (api->detokenize(h, ids, n, out.data(), len + 1, &err) < 0)
        fail(std::string("detokenize failed: ") + err.message);
    out.resize(static_cast<size_t>(len));
    return out;
}

struct GenSettings {
    int32_t max_new_tokens = 32;
    int32_t window = 0;
    int32_t stop_at_eos = 0;
    int64_t batch_size = 8;
};

struct GenOutput {
    std::string text;    // decoded, special tokens skipped
    int64_t tokens = 0;  // generated tokens
    int32_t finish = CTX_FINISH_LENGTH;
};

inline const char* finish_name(int32_t f) {
    return f == CTX_FINISH_STOP_TOKEN    ? "stop_token"
           : f == CTX_FINISH_STOP_STRING ? "stop_string"
                                         : "length";
}

// Greedy generation for every prompt, batch_size prompts per host call (the host spreads a
// call's prompts over the ranks). after_batch(done) reports progress.
inline std::vector<GenOutput> generate_all(const ctx_eval_api* api, ctx_eval_host* h,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const GenSettings& s,
                                           const std::function<void(size_t)>& after_batch = {}) {
    std::vector<GenOutput> out(prompts.size());
    const size_t B = static_cast<size_t>(s.batch_size), M = static_cast<size_t>(s.max_new_tokens);
    for (size_t first = 0; first < prompts.size(); first += B) {
        const size_t n = std::min(B, prompts.size() - first);
        std::vector<const int32_t*> ptrs(n);
        std::vector<int64_t> lens(n), out_len(n);
        std::vector<int32_t> toks(n * M), finish(n);
        for (size_t i = 0; i < n; ++i) {
            const auto& p = prompts[first + i];
            if (p.empty()) fail("prompt " + std::to_string(first + i) + " tokenizes to nothing");
            ptrs[i] = p.data();
            lens[i] = static_cast<int64_t>(p.size());
        }
        ctx_generate_request req{};
        req.struct_size = sizeof(req);
        req.n_prompts = static_cast<int64_t>(n);
        req.prompts = ptrs.data();
        req.prompt_lengths = lens.data();
        req.max_new_tokens = s.max_new_tokens;
        req.window = s.window;
        req.stop_at_eos = s.stop_at_eos;
        ctx_err err{};
        const ctx_status st =
            api->generate(h, &req, toks.data(), out_len.data(), finish.data(), &err);
        if (st != CTX_OK) throw TaskError(std::string("generate failed: ") + err.message, st);
        for (size_t i = 0; i < n; ++i) {
            const int64_t len =
                std::min<int64_t>(std::max<int64_t>(out_len[i], 0), static_cast<int64_t>(M));
            GenOutput& o = out[first + i];
            o.tokens = len;
            o.finish = finish[i];
            o.text = detokenize(api, h, toks.data() + i * M, len);
        }
        if (after_batch) after_batch(first + n);
    }
    return out;
}

// ---------------------------------------------------------------- options
// An integer option checked against [lo, hi], the error naming it.
inline int64_t integer_option(const ctx_host_api* host, const ctx_options* opts, const char* key,
                              int64_t dflt, int64_t lo, int64_t hi) {
    const int64_t v = host->opt_integer(host->host, opts, key, dflt);
    if (v < lo || v > hi)
        fail(std::string("option '") + key + "' must be in [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "], got " + std::to_string(v));
    return v;
}

// A number list option of 1 to max_len values (empty when absent).
inline std::vector<double> number_list_option(const ctx_host_api* host, const ctx_options* opts,
                                              const char* key, int64_t max_len = 256) {
    if (!host->opt_has(host->host, opts, key)) return {};
    std::vector<double> v(static_cast<size_t>(max_len));
    const int64_t n = host->opt_number_list(host->host, opts, key, v.data(), max_len);
    if (n < 1 || n > max_len)
        fail(std::string("option '") + key + "' needs 1 to " + std::to_string(max_len) +
             " values, got " + std::to_string(n));
    v.resize(static_cast<size_t>(n));
    return v;
}

// The options both tasks share (docs/EVAL.md), read and checked in create().
struct CommonOptions {
    GenSettings gen;
    bool stop_at_eos_given = false;  // else: stop at EOS when the tokenizer has one
    std::string chat_template;
    int64_t max_prompt_tokens = 0;  // 0: no limit
    int64_t output_chars = 200;
};

inline CommonOptions read_common_options(const ctx_host_api* host, const ctx_options* opts,
                                         int64_t default_max_new_tokens) {
    CommonOptions c;
    auto integer = [&](const char* key, int64_t dflt, int64_t lo, int64_t hi) {
        return integer_option(host, opts, key, dflt, lo, hi);
    };
    c.gen.max_new_tokens =
        static_cast<int32_t>(integer("max_new_tokens", default_max_new_tokens, 1, 1 << 20));
    c.gen.window = static_cast<int32_t>(integer("window", 0, 0, INT32_MAX));
    c.stop_at_eos_given = host->opt_has(host->host, opts, "stop_at_eos");
    c.gen.stop_at_eos = host->opt_bool(host->host, opts, "stop_at_eos", 1) ? 1 : 0;
    c.gen.batch_size = integer("batch_size", 8, 1, 1 << 20);
    c.chat_template = host->opt_string(host->host, opts, "chat_template", "");
    check_template(c.chat_template);
    c.max_prompt_tokens = integer("max_prompt_tokens", 0, 0, INT64_MAX);
    c.output_chars = integer("output_chars", 200, 0, 1 << 20);
    return c;
}

// The generation settings of a run: Giraffe's HF generate stops at EOS, so unless the recipe
// said otherwise an output ends at EOS whenever the tokenizer has one.
inline GenSettings run_settings(const CommonOptions& c, const ctx_eval_api* api, ctx_eval_host* h) {
    GenSettings g = c.gen;
    if (!c.stop_at_eos_given) g.stop_at_eos = api->special_token(h, "eos") >= 0 ? 1 : 0;
    return g;
}

// "%g" of a number, for messages.
inline std::string num_text(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

// One record through the host; throws when the host refuses it.
class RecordWriter {
public:
    RecordWriter(const ctx_eval_api* api, ctx_eval_host* h, const char* task) : api_(api), h_(h) {
        api_->record_begin(h_, task);
    }
    RecordWriter& num(const char* key, double v) {
        api_->record_number(h_, key, v);
        return *this;
    }
    RecordWriter& str(const char* key, const std::string& v) {
        api_->record_string(h_, key, v.c_str());
        return *this;
    }
    void end() {
        ctx_err err{};
        const ctx_status st = api_->record_end(h_, &err);
        if (st != CTX_OK) throw TaskError(std::string("record failed: ") + err.message, st);
    }

private:
    const ctx_eval_api* api_;
    ctx_eval_host* h_;
};

inline void log(const ctx_eval_api* api, ctx_eval_host* h, int32_t level, const std::string& m) {
    if (api->log) api->log(h, level, m.c_str());
}

// splitmix64-style mixing of a seed with two indices, so each item's stream depends only on
// (seed, a, b), never on the order or number of other items.
inline uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b = 0) {
    auto sm = [](uint64_t z) {
        z += 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    };
    return sm(sm(sm(seed) ^ a) ^ (b * 0xD1B54A32D192ED03ull));
}

// Uniform integer in [0, n) without modulo bias (rejection of the top partial range).
inline uint64_t uniform_below(uint64_t rng[4], uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = ctx_rng_next_u64(rng);
    while (x >= limit);
    return x % n;
}

}  // namespace ctx_retrieval
