// A scripted ctx_eval_api for the retrieval-probe tests (eval/passkey, eval/ruler_niah): a real
// tokenizer (byte or a BPE fixture), generation answered by a function of the prompt text and the
// attention window, teacher-forced scores whose argmax is right or wrong by window, held-out
// documents, and the records the plugin writes. Model-free.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include <lua.hpp>

#include "data/bpe_byte_map.h"
#include "data/bpe_tokenizer.h"
#include "data/tokenizer.h"
#include "model_fixtures.h"
#include "eval/eval_plugin.h"
#include "lua/options.h"
#include "lua/runtime.h"

namespace ctx::probe_test {

struct Rec {
    std::string task;
    std::map<std::string, double> num;
    std::map<std::string, std::string> str;
    std::vector<std::string> order;  // field order
};

struct Mock {
    const Tokenizer* tok = nullptr;
    // greedy output for a prompt, given the generate request's window (0: full attention)
    std::function<std::string(const std::string& prompt, int32_t window)> respond =
        [](const std::string&, int32_t) { return std::string(); };
    bool tf_right_full = true, tf_right_windowed = false;  // argmax == target?
    int32_t lt = 64;
    std::vector<std::vector<int32_t>> docs;
    std::vector<std::string> prompts;            // every generated prompt's text
    std::vector<ctx_generate_request> gen_reqs;  // scalar fields only
    std::vector<ctx_score_request> score_reqs;   // scalar fields only
    std::vector<Rec> records;
    Rec current;
    std::vector<std::string> logs;
};
inline Mock* g_mock = nullptr;

inline int64_t mock_tokenize(ctx_eval_host*, const char* text, int64_t len, int32_t* out,
                             int64_t cap, ctx_err*) {
    const std::vector<int32_t> ids = g_mock->tok->encode(std::string_view(text, len));
    for (size_t i = 0; i < ids.size() && static_cast<int64_t>(i) < cap; ++i) out[i] = ids[i];
    return static_cast<int64_t>(ids.size());
}
inline int64_t mock_detokenize(ctx_eval_host*, const int32_t* ids, int64_t n, char* out,
                               int64_t cap, ctx_err*) {
    const std::string s = g_mock->tok->decode(ids, static_cast<size_t>(n), true);
    const auto len = static_cast<int64_t>(s.size());
    if (out && cap > 0) {
        std::copy_n(s.data(), std::min(len, cap), out);
        if (len < cap) out[len] = '\0';
    }
    return len;
}
inline int32_t mock_special(ctx_eval_host*, const char* role) {
    const auto id = std::string(role) == "eos" ? g_mock->tok->eos_id() : std::nullopt;
    return id ? *id : -1;
}
inline void mock_model_info(ctx_eval_host*, ctx_eval_model_info* info) {
    info->vocab_size = g_mock->tok->vocab_size();
    info->context_length = g_mock->lt;
    info->trained_length = g_mock->lt;
}
inline int64_t mock_num_docs(ctx_eval_host*) { return static_cast<int64_t>(g_mock->docs.size()); }
inline int64_t mock_doc_len(ctx_eval_host*, int64_t d) {
    return static_cast<int64_t>(g_mock->docs[static_cast<size_t>(d)].size());
}
inline ctx_status mock_copy(ctx_eval_host*, int64_t d, int64_t start, int64_t n, int32_t* out,
                            ctx_err*) {
    const auto& doc = g_mock->docs[static_cast<size_t>(d)];
    std::copy_n(doc.begin() + start, n, out);
    return CTX_OK;
}
inline ctx_status mock_generate(ctx_eval_host*, const ctx_generate_request* req, int32_t* toks,
                                int64_t* lens, int32_t* finish, ctx_err*) {
    ctx_generate_request copy = *req;
    copy.prompts = nullptr;
    copy.prompt_lengths = nullptr;
    g_mock->gen_reqs.push_back(copy);
    const int64_t M = req->max_new_tokens;
    for (int64_t p = 0; p < req->n_prompts; ++p) {
        const std::string prompt = g_mock->tok->decode(req->prompts[p], req->prompt_lengths[p]);
        g_mock->prompts.push_back(prompt);
        const std::vector<int32_t> out = g_mock->tok->encode(g_mock->respond(prompt, req->window));
        const int64_t n = std::min<int64_t>(M, static_cast<int64_t>(out.size()));
        std::copy_n(out.begin(), n, toks + p * M);
        lens[p] = n;
        finish[p] = CTX_FINISH_LENGTH;
    }
    return CTX_OK;
}
inline ctx_status mock_score(ctx_eval_host*, const ctx_score_request* q, ctx_err*) {
    ctx_score_request copy = *q;
    copy.tokens = nullptr;
    copy.positions = nullptr;
    copy.targets = nullptr;
    copy.logprobs = nullptr;
    copy.argmax = nullptr;
    g_mock->score_reqs.push_back(copy);
    const bool right = q->window == 0 ? g_mock->tf_right_full : g_mock->tf_right_windowed;
    for (int64_t i = 0; i < q->n_rows * q->row_len; ++i) {
        if (q->logprobs) q->logprobs[i] = -0.25f;
        if (q->argmax) q->argmax[i] = right ? q->targets[i] : q->targets[i] + 1;
    }
    return CTX_OK;
}
inline void mock_begin(ctx_eval_host*, const char* task) {
    g_mock->current = Rec{task, {}, {}, {}};
}
inline void mock_number(ctx_eval_host*, const char* k, double v) {
    g_mock->current.num[k] = v;
    g_mock->current.order.emplace_back(k);
}
inline void mock_string(ctx_eval_host*, const char* k, const char* v) {
    g_mock->current.str[k] = v;
    g_mock->current.order.emplace_back(k);
}
inline ctx_status mock_end(ctx_eval_host*, ctx_err*) {
    g_mock->records.push_back(g_mock->current);
    return CTX_OK;
}
inline void mock_log(ctx_eval_host*, int32_t, const char* m) { g_mock->logs.emplace_back(m); }

inline ctx_eval_api mock_api() {
    ctx_eval_api a{};
    a.struct_size = sizeof(ctx_eval_api);
    a.metric = [](ctx_eval_host*, const char*, double) {};
    a.model_info = mock_model_info;
    a.num_documents = mock_num_docs;
    a.document_length = mock_doc_len;
    a.copy_tokens = mock_copy;
    a.record_begin = mock_begin;
    a.record_number = mock_number;
    a.record_string = mock_string;
    a.record_end = mock_end;
    a.log = mock_log;
    a.tokenize = mock_tokenize;
    a.detokenize = mock_detokenize;
    a.special_token = mock_special;
    a.generate = mock_generate;
    a.score_rows = mock_score;
    return a;
}

struct Result {
    ctx_status status = CTX_OK;
    std::string error;
    Mock mock;
    std::vector<Rec> of(const std::string& task) const {
        std::vector<Rec> out;
        for (const Rec& r : mock.records)
            if (r.task == task) out.push_back(r);
        return out;
    }
};

inline const Tokenizer& byte_tokenizer() {
    static std::unique_ptr<Tokenizer> t = load_tokenizer("byte");
    return *t;
}

// A byte-level BPE fixture: the 256 bytes plus every prefix of the common words of the probes'
// texts as tokens (so a word counts as one token and a cut inside it as one too), built in the
// HF tokenizer.json shape the real loader reads. Token counts are then far from byte counts and
// depend on where the filler is cut.
inline const Tokenizer& bpe_tokenizer() {
    static std::unique_ptr<Tokenizer> t = [] {
        using nlohmann::json;
        const auto& bm = bpe::byte_map();
        json vocab = json::object();
        for (int b = 0; b < 256; ++b) vocab[bm.to_utf8(static_cast<uint8_t>(b))] = b;
        json merges = json::array();
        int next = 256;
        const char* words[] = {
            "The",        " The",    " grass",   " is",     " green",     " sky",   " blue",
            " sun",       " yellow", " Here",    " we",     " go",        " There", " and",
            " back",      " again",  " pass",    " key",    " Remember",  " it",    " What",
            " special",   " magic",  " numbers", " for",    " text",      " the",   " provided",
            " mentioned", " are",    " all",     " hidden", " important", " VAR"};
        for (const char* w : words) {
            std::string mapped;
            std::vector<std::string> chars;
            for (const char* c = w; *c; ++c) chars.push_back(bm.to_utf8(static_cast<uint8_t>(*c)));
            std::string prefix = chars[0];
            for (size_t i = 1; i < chars.size(); ++i) {
                const std::string merged = prefix + chars[i];
                if (!vocab.contains(merged)) {
                    vocab[merged] = next++;
                    merges.push_back(prefix + " " + chars[i]);
                }
                prefix = merged;
            }
        }
        json j;
        j["version"] = "1.0";
        j["normalizer"] = nullptr;
        j["pre_tokenizer"] = {
            {"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
        j["decoder"] = {{"type", "ByteLevel"}};
        j["added_tokens"] = json::array();
        j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"dropout", nullptr}};
        return std::unique_ptr<Tokenizer>(parse_bpe_tokenizer_json(j.dump(), "probe_bpe.json"));
    }();
    return *t;
}

inline int64_t count_with(const Tokenizer& t, const std::string& s) {
    return static_cast<int64_t>(t.encode(s).size());
}

// Creates eval/<name> with a Lua options table and runs it against the mock.
inline Result run_mock(const std::string& name, const std::string& options_lua,
                       const std::function<void(Mock&)>& setup = {},
                       size_t api_size = sizeof(ctx_eval_api)) {
    Result res;
    res.mock.tok = &byte_tokenizer();
    if (setup) setup(res.mock);
    g_mock = &res.mock;
    ctx_eval_api api = mock_api();
    api.struct_size = static_cast<uint32_t>(api_size);
    const LoadedPlugin& lib = test::plugins().get("eval/" + name);
    lua::Runtime rt;
    rt.run_string("opts = " + options_lua, "options");
    lua_getglobal(rt.state(), "opts");
    lua::Options o = lua::Options::parse(rt.state(), -1, plugin_option_schema(*lib.descriptor),
                                         "eval/" + name + " options", "test:");
    auto* vt = static_cast<const ctx_eval_vtable*>(lib.descriptor->vtable);
    PluginHostContext host("eval/" + name, 1);
    void* inst = nullptr;
    ctx_err err{};
    res.status = vt->create(&host.api, reinterpret_cast<const ctx_options*>(&o), &inst, &err);
    if (res.status == CTX_OK) {
        res.status = vt->run(inst, &api, nullptr, &err);
        vt->destroy(inst);
    }
    res.error = err.message;
    g_mock = nullptr;
    return res;
}

}  // namespace ctx::probe_test
