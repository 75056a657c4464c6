#include "eval/eval_plugin.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string_view>

#include "core/error.h"
#include "data/token_source.h"
#include "data/tokenizer.h"
#include "model/generate.h"

// The opaque host handle eval plugins receive. Callbacks run inside plugin code: nothing may
// throw out of them, so every one catches and reports through ctx_err or the pending error.
struct ctx_eval_host {
    ctx::EvalContext* context = nullptr;
    std::string plugin_name;
    ctx::Record record;
    std::string task;
    bool in_record = false;
    std::string pending_error;  // a failure inside a void callback, reported at record_end/run
    ctx::BatchBuffers rows;     // staging for row_logprobs
    std::vector<float> gathered;
};

namespace ctx {
namespace {

ctx_status fail_status(ctx_err* err, const std::string& message) {
    ctx_err_set(err, message.c_str());
    return CTX_ERR_INVALID_ARGUMENT;
}

// This rank's rows (staged in `rows`, their indices in `mine`) scored into out (2, n_rows,
// row_len): log-probabilities, then argmax ids, at the rows' places. One forward pass.
void score_by_forward(Model& model, BatchBuffers& rows, const ctx_score_request& q,
                      const std::vector<int64_t>& mine, std::vector<float>& out) {
    const int B = rows.B, T = rows.T;
    const size_t total = static_cast<size_t>(q.n_rows * q.row_len);
    const int saved_window = model.attention_window();
    model.set_attention_window(q.window);
    try {
        model.forward(rows.batch());
    } catch (...) {
        model.set_attention_window(saved_window);
        throw;
    }
    model.set_attention_window(saved_window);
    const float* losses = model.losses();
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t)
            out[mine[b] * q.row_len + t] = -losses[static_cast<size_t>(b) * T + t];
    if (!q.argmax) return;
    const std::vector<int32_t> best = model.argmax(rows.batch());  // (B, T), first maxima
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t)
            out[total + mine[b] * q.row_len + t] =
                static_cast<float>(best[static_cast<size_t>(b) * T + t]);
}

// The same by teacher-forced decoding through the KV-cache path with contextual sparsity.
void score_by_decoding_sparse(Model& model, BatchBuffers& rows, const ctx_score_request& q,
                              const SparsityOptions& sparsity, const std::vector<int64_t>& mine,
                              std::vector<float>& out) {
    const int B = rows.B, T = rows.T;
    const size_t total = static_cast<size_t>(q.n_rows * q.row_len);
    std::vector<float> lp(static_cast<size_t>(B) * T);
    std::vector<int32_t> best(lp.size());
    decode_rows(model, DecodeRows{B, T, rows.tokens.data(), rows.positions.data(),
                                  rows.targets.data()},
                1, q.window, sparsity, lp.data(), best.data());
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t) {
            const size_t i = static_cast<size_t>(b) * T + t;
            out[mine[b] * q.row_len + t] = lp[i];
            if (q.argmax) out[total + mine[b] * q.row_len + t] = static_cast<float>(best[i]);
        }
}

}  // namespace

// Rows are scored in groups of consecutive rows, group g on rank g % world, one forward pass
// (or decoding run) per group; the outputs are then summed over ranks, which reassembles them
// exactly because every other rank contributes zeros (argmax ids travel as floats: exact below
// 2^24). A group's size depends only on the rows, so each group is the same call on any number
// of ranks and the scores do not depend on the world size, even where the matrix library's
// result for a row depends on the rows computed with it (OpenBLAS's AVX2 kernels). A group holds
// up to kScoreGroupTokens tokens (at least one row), which also bounds the activations' memory.
constexpr int64_t kScoreGroupTokens = 4096;

void score_rows(Model& model, Comm& comm, BatchBuffers& rows, const ctx_score_request& q,
                const SparsityOptions* sparsity) {
    CTX_CHECK(q.n_rows > 0 && q.row_len > 0, "score_rows: n_rows and row_len must be positive");
    CTX_CHECK(q.window >= 0, "score_rows: window must be >= 0, got {}", q.window);
    CTX_CHECK(q.tokens && q.positions && q.targets, "score_rows: tokens, positions and "
                                                    "targets must be given");
    const int64_t V = model.config().vocab_size;
    CTX_CHECK(!q.argmax || V < (int64_t(1) << 24), "score_rows: vocabulary too large");
    const int rank = comm.rank(), world = comm.size();
    const size_t total = static_cast<size_t>(q.n_rows * q.row_len);
    // (2, n_rows, row_len): log-probabilities, then argmax ids
    std::vector<float> out(2 * total, 0.0f);
    const int64_t group = std::max<int64_t>(1, kScoreGroupTokens / q.row_len);
    std::vector<int64_t> mine;
    for (int64_t g0 = rank * group; g0 < q.n_rows; g0 += world * group) {
        mine.clear();
        for (int64_t r = g0; r < std::min(q.n_rows, g0 + group); ++r) mine.push_back(r);
        const int B = static_cast<int>(mine.size()), T = static_cast<int>(q.row_len);
        if (rows.B != B || rows.T != T) rows.resize(B, T);
        for (int b = 0; b < B; ++b) {
            const size_t src = static_cast<size_t>(mine[b] * q.row_len);
            std::copy(q.tokens + src, q.tokens + src + T, rows.tokens.begin() + b * T);
            std::copy(q.positions + src, q.positions + src + T, rows.positions.begin() + b * T);
            std::copy(q.targets + src, q.targets + src + T, rows.targets.begin() + b * T);
        }
        std::fill(rows.mask.begin(), rows.mask.end(), 1.0f);
        if (sparsity && sparsity->predictors)
            score_by_decoding_sparse(model, rows, q, *sparsity, mine, out);
        else
            score_by_forward(model, rows, q, mine, out);
    }
    comm.allreduce_sum(out.data(), q.argmax ? 2 * total : total);
    if (q.logprobs) std::copy_n(out.begin(), total, q.logprobs);
    if (q.argmax)
        for (size_t i = 0; i < total; ++i) q.argmax[i] = static_cast<int32_t>(out[total + i]);
}

namespace {

ctx_status score_rows_impl(ctx_eval_host* h, const ctx_score_request& q, ctx_err* err) {
    try {
        score_rows(*h->context->model, *h->context->comm, h->rows, q, &h->context->sparsity);
        return CTX_OK;
    } catch (const std::exception& e) {
        return fail_status(err, e.what());
    }
}


ctx_status api_score_rows(ctx_eval_host* h, const ctx_score_request* request, ctx_err* err) {
    if (!request || request->struct_size < CTX_OFFSET_END(ctx_score_request, argmax))
        return fail_status(err, "score_rows: the request struct is missing or too small");
    return score_rows_impl(h, *request, err);
}

ctx_score_request logprob_request(const int32_t* tokens, const float* positions,
                                  const int32_t* targets, int64_t n_rows, int64_t row_len,
                                  int32_t window, float* logprobs) {
    ctx_score_request q{};
    q.struct_size = sizeof q;
    q.tokens = tokens;
    q.positions = positions;
    q.targets = targets;
    q.n_rows = n_rows;
    q.row_len = row_len;
    q.window = window;
    q.logprobs = logprobs;
    return q;
}

ctx_status api_row_logprobs(ctx_eval_host* h, const int32_t* tokens, const float* positions,
                            const int32_t* targets, int64_t n_rows, int64_t row_len,
                            float* logprobs, ctx_err* err) {
    return score_rows_impl(
        h, logprob_request(tokens, positions, targets, n_rows, row_len, 0, logprobs), err);
}

ctx_status api_row_logprobs_windowed(ctx_eval_host* h, const int32_t* tokens,
                                     const float* positions, const int32_t* targets,
                                     int64_t n_rows, int64_t row_len, int32_t window,
                                     float* logprobs, ctx_err* err) {
    return score_rows_impl(
        h, logprob_request(tokens, positions, targets, n_rows, row_len, window, logprobs), err);
}

const Tokenizer& tokenizer_of(ctx_eval_host* h) {
    CTX_CHECK(h->context->tokenizer != nullptr,
              "this task needs a tokenizer: pass tokenizer = ctx.tokenizer(spec) (or a spec "
              "string) to ctx.run_eval");
    return *h->context->tokenizer;
}

int64_t api_tokenize(ctx_eval_host* h, const char* text, int64_t text_len, int32_t* out,
                     int64_t cap, ctx_err* err) {
    try {
        CTX_CHECK(text != nullptr && text_len >= 0, "tokenize: no text");
        const std::vector<int32_t> ids =
            tokenizer_of(h).encode(std::string_view(text, static_cast<size_t>(text_len)));
        const auto n = static_cast<int64_t>(ids.size());
        if (out) std::copy_n(ids.begin(), std::min(n, std::max<int64_t>(cap, 0)), out);
        return n;
    } catch (const std::exception& e) {
        fail_status(err, e.what());
        return -1;
    }
}

int64_t api_detokenize(ctx_eval_host* h, const int32_t* ids, int64_t n, char* out, int64_t cap,
                       ctx_err* err) {
    try {
        CTX_CHECK(n >= 0 && (ids != nullptr || n == 0), "detokenize: no ids");
        const std::string text = tokenizer_of(h).decode(ids, static_cast<size_t>(n), true);
        const auto len = static_cast<int64_t>(text.size());
        if (out && cap > 0) {
            const int64_t k = std::min(len, cap);
            std::copy_n(text.data(), k, out);
            if (len < cap) out[len] = '\0';
        }
        return len;
    } catch (const std::exception& e) {
        fail_status(err, e.what());
        return -1;
    }
}

int32_t api_special_token(ctx_eval_host* h, const char* role) {
    const Tokenizer* t = h->context->tokenizer;
    if (!t || !role) return -1;
    std::optional<int32_t> id;
    if (std::string_view(role) == "eos") id = t->eos_id();
    else if (std::string_view(role) == "bos") id = t->bos_id();
    return id ? *id : -1;
}

// Prompt p is generated on rank p % world; outputs are summed over ranks (zeros elsewhere), as
// row_logprobs does, in doubles (exact for token ids and lengths).
ctx_status api_generate(ctx_eval_host* h, const ctx_generate_request* req, int32_t* out_tokens,
                        int64_t* out_lengths, int32_t* out_finish, ctx_err* err) {
    try {
        EvalContext& c = *h->context;
        CTX_CHECK(req && req->struct_size >= CTX_OFFSET_END(ctx_generate_request, stop_strings),
                  "generate: the request struct is missing or too small");
        CTX_CHECK(req->n_prompts >= 1 && req->prompts && req->prompt_lengths,
                  "generate: needs at least one prompt");
        CTX_CHECK(req->max_new_tokens >= 1, "generate: max_new_tokens must be >= 1, got {}",
                  req->max_new_tokens);
        CTX_CHECK(out_tokens && out_lengths && out_finish, "generate: output buffers are NULL");
        GenerateOptions o;
        o.max_new_tokens = req->max_new_tokens;
        o.window = req->window;
        o.sparsity = c.sparsity;
        if (req->stop_at_eos) {
            const int32_t eos = api_special_token(h, "eos");
            CTX_CHECK(eos >= 0, "generate: stop_at_eos needs a tokenizer with an end-of-text token");
            o.stop_tokens.push_back(eos);
        }
        for (int32_t i = 0; i < req->n_stop_strings; ++i)
            if (req->stop_strings[i] && *req->stop_strings[i]) o.stop_strings.emplace_back(req->stop_strings[i]);
        if (c.tokenizer) {
            const Tokenizer* t = c.tokenizer;
            o.decode = [t](const std::vector<int32_t>& ids) { return t->decode(ids, true); };
        }
        CTX_CHECK(o.stop_strings.empty() || o.decode,
                  "generate: stop strings need a tokenizer (ctx.run_eval{{tokenizer = ...}})");
        const int rank = c.comm->rank(), world = c.comm->size();
        const int64_t n = req->n_prompts, M = req->max_new_tokens;
        std::vector<int64_t> mine;
        std::vector<std::vector<int32_t>> prompts;
        for (int64_t p = rank; p < n; p += world) {
            CTX_CHECK(req->prompts[p] && req->prompt_lengths[p] >= 1,
                      "generate: prompt {} is empty", p);
            mine.push_back(p);
            prompts.emplace_back(req->prompts[p], req->prompts[p] + req->prompt_lengths[p]);
        }
        // (n, M + 2): tokens, then length and finish
        std::vector<double> gathered(static_cast<size_t>(n * (M + 2)), 0.0);
        if (!prompts.empty()) {
            const std::vector<GenerateResult> res = generate(*c.model, prompts, o);
            for (size_t i = 0; i < mine.size(); ++i) {
                double* row = gathered.data() + mine[i] * (M + 2);
                for (size_t t = 0; t < res[i].tokens.size(); ++t) row[t] = res[i].tokens[t];
                row[M] = static_cast<double>(res[i].tokens.size());
                row[M + 1] = static_cast<double>(static_cast<int>(res[i].finish));
            }
        }
        c.comm->allreduce_sum(gathered.data(), gathered.size());
        for (int64_t p = 0; p < n; ++p) {
            const double* row = gathered.data() + p * (M + 2);
            for (int64_t t = 0; t < M; ++t) out_tokens[p * M + t] = static_cast<int32_t>(row[t]);
            out_lengths[p] = static_cast<int64_t>(row[M]);
            out_finish[p] = static_cast<int32_t>(row[M + 1]);
        }
        return CTX_OK;
    } catch (const std::exception& e) {
        return fail_status(err, e.what());
    }
}

void api_model_info(ctx_eval_host* h, ctx_eval_model_info* info) {
    if (!info) return;
    const ModelConfig& c = h->context->model->config();
    info->struct_size = sizeof(ctx_eval_model_info);
    info->vocab_size = c.vocab_size;
    info->context_length = c.context_length;
    info->trained_length = h->context->trained_length > 0 ? h->context->trained_length
                                                          : c.context_length;
}

int64_t api_num_documents(ctx_eval_host* h) { return h->context->documents->n_docs(); }

int64_t api_document_length(ctx_eval_host* h, int64_t doc) {
    const DocStore& d = *h->context->documents;
    return doc >= 0 && doc < d.n_docs() ? d.doc_len(doc) : -1;
}

ctx_status api_copy_tokens(ctx_eval_host* h, int64_t doc, int64_t start, int64_t n, int32_t* out,
                           ctx_err* err) {
    const DocStore& d = *h->context->documents;
    if (doc < 0 || doc >= d.n_docs())
        return fail_status(err, fmt::format("document {} does not exist ({} documents)", doc,
                                            d.n_docs()));
    if (start < 0 || n < 0 || start + n > d.doc_len(doc))
        return fail_status(err, fmt::format("tokens [{}, {}) are outside document {} of length {}",
                                            start, start + n, doc, d.doc_len(doc)));
    d.read(doc, start, n, out);
    return CTX_OK;
}

void api_record_begin(ctx_eval_host* h, const char* task) {
    if (h->in_record) h->pending_error = "record_begin called twice without record_end";
    h->in_record = true;
    h->task = task && *task ? task : h->plugin_name;
    h->record = Record::object();
}

void api_record_number(ctx_eval_host* h, const char* key, double value) {
    if (!h->in_record || !key) {
        h->pending_error = "record_number outside a record (call record_begin first)";
        return;
    }
    if (std::isfinite(value) && value == std::floor(value) && std::fabs(value) < 0x1p53)
        h->record[key] = static_cast<int64_t>(value);  // counts and lengths print as integers
    else if (std::isfinite(value))
        h->record[key] = value;
    else
        h->record[key] = std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
}

void api_record_string(ctx_eval_host* h, const char* key, const char* value) {
    if (!h->in_record || !key) {
        h->pending_error = "record_string outside a record (call record_begin first)";
        return;
    }
    h->record[key] = value ? value : "";
}

ctx_status api_record_end(ctx_eval_host* h, ctx_err* err) {
    try {
        if (!h->pending_error.empty()) {
            const std::string e = h->pending_error;
            h->pending_error.clear();
            return fail_status(err, e);
        }
        if (!h->in_record) return fail_status(err, "record_end without record_begin");
        h->in_record = false;
        EvalContext& c = *h->context;
        // Tags first (method, stage, ...), then the task's own fields.
        Record full = Record::object();
        full["type"] = "eval";
        full["task"] = h->task;
        for (const auto& [k, v] : c.tags.items()) full[k] = v;
        for (const auto& [k, v] : h->record.items()) full[k] = v;
        if (c.metrics) {
            c.metrics->jsonl(full);
            Record row = full;
            row.erase("type");
            c.metrics->csv(h->task, row);
        }
        if (c.logs) spdlog::info("[{}] {}", h->plugin_name, h->record.dump());
        if (c.collected) c.collected->push_back(std::move(full));
        return CTX_OK;
    } catch (const std::exception& e) {
        return fail_status(err, e.what());
    }
}

void api_metric(ctx_eval_host* h, const char* name, double value) {
    api_record_begin(h, h->plugin_name.c_str());
    api_record_number(h, name, value);
    ctx_err err{};
    if (api_record_end(h, &err) != CTX_OK) h->pending_error = err.message;
}

void api_log(ctx_eval_host* h, int32_t level, const char* message) {
    if (!h->context->logs && level < CTX_LOG_WARN) return;
    const char* m = message ? message : "";
    if (level >= CTX_LOG_ERROR)
        spdlog::error("[{}] {}", h->plugin_name, m);
    else if (level == CTX_LOG_WARN)
        spdlog::warn("[{}] {}", h->plugin_name, m);
    else if (level == CTX_LOG_DEBUG)
        spdlog::debug("[{}] {}", h->plugin_name, m);
    else
        spdlog::info("[{}] {}", h->plugin_name, m);
}

const ctx_eval_api& eval_api() {
    static const ctx_eval_api api = [] {
        ctx_eval_api a{};
        a.struct_size = sizeof(ctx_eval_api);
        a.row_logprobs = api_row_logprobs;
        a.metric = api_metric;
        a.model_info = api_model_info;
        a.num_documents = api_num_documents;
        a.document_length = api_document_length;
        a.copy_tokens = api_copy_tokens;
        a.record_begin = api_record_begin;
        a.record_number = api_record_number;
        a.record_string = api_record_string;
        a.record_end = api_record_end;
        a.log = api_log;
        a.tokenize = api_tokenize;
        a.detokenize = api_detokenize;
        a.special_token = api_special_token;
        a.row_logprobs_windowed = api_row_logprobs_windowed;
        a.generate = api_generate;
        a.score_rows = api_score_rows;
        return a;
    }();
    return api;
}

}  // namespace

EvalPlugin::EvalPlugin(const LoadedPlugin& lib, const Options& options, uint64_t seed)
    : lib_(&lib), vt_(static_cast<const ctx_eval_vtable*>(lib.descriptor->vtable)),
      name_(lib.full_name),
      instance_(require_kind(lib, CTX_PLUGIN_EVAL, "an evaluation task"), options, seed,
                vt_->create, vt_->destroy) {}

EvalPlugin::~EvalPlugin() = default;

void EvalPlugin::run(EvalContext& context) {
    CTX_CHECK(context.model && context.documents && context.comm,
              "internal: evaluation needs a model, documents and a communicator");
    ctx_eval_host host;
    host.context = &context;
    host.plugin_name = name_;
    ctx_err err{};
    instance_.check(vt_->run(instance_.get(), &eval_api(), &host, &err), "run", err);
    CTX_CHECK(host.pending_error.empty(), "{}: {}", name_, host.pending_error);
    CTX_CHECK(!host.in_record, "{}: a record was begun but never ended", name_);
}

}  // namespace ctx
