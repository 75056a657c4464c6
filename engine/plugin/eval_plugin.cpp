#include "plugin/eval_plugin.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "data/token_source.h"

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

// Rows are split across ranks (row r on rank r % world); the log-probabilities are then summed
// over ranks, which reassembles them exactly because every other rank contributes zeros.
ctx_status api_row_logprobs(ctx_eval_host* h, const int32_t* tokens, const float* positions,
                            const int32_t* targets, int64_t n_rows, int64_t row_len,
                            float* logprobs, ctx_err* err) {
    try {
        EvalContext& c = *h->context;
        CTX_CHECK(n_rows > 0 && row_len > 0, "row_logprobs: n_rows and row_len must be positive");
        const int rank = c.comm->rank(), world = c.comm->size();
        const size_t total = static_cast<size_t>(n_rows * row_len);
        std::fill(logprobs, logprobs + total, 0.0f);
        std::vector<int64_t> mine;
        for (int64_t r = rank; r < n_rows; r += world) mine.push_back(r);
        if (!mine.empty()) {
            const int B = static_cast<int>(mine.size()), T = static_cast<int>(row_len);
            if (h->rows.B != B || h->rows.T != T) h->rows.resize(B, T);
            for (int b = 0; b < B; ++b) {
                const size_t src = static_cast<size_t>(mine[b] * row_len);
                std::copy(tokens + src, tokens + src + T, h->rows.tokens.begin() + b * T);
                std::copy(positions + src, positions + src + T, h->rows.positions.begin() + b * T);
                std::copy(targets + src, targets + src + T, h->rows.targets.begin() + b * T);
            }
            std::fill(h->rows.mask.begin(), h->rows.mask.end(), 1.0f);
            c.model->forward(h->rows.batch());
            const float* losses = c.model->losses();
            for (int b = 0; b < B; ++b)
                for (int t = 0; t < T; ++t)
                    logprobs[mine[b] * row_len + t] = -losses[static_cast<size_t>(b) * T + t];
        }
        c.comm->allreduce_sum(logprobs, total);
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
        if (c.comm->rank() == 0) spdlog::info("[{}] {}", h->plugin_name, h->record.dump());
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
    if (h->context->comm->rank() != 0 && level < CTX_LOG_WARN) return;
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
        return a;
    }();
    return api;
}

}  // namespace

EvalPlugin::EvalPlugin(const LoadedPlugin& lib, const lua::Options& options, uint64_t seed)
    : lib_(&lib), vt_(static_cast<const ctx_eval_vtable*>(lib.descriptor->vtable)),
      name_(lib.full_name) {
    CTX_CHECK(lib.kind() == CTX_PLUGIN_EVAL, "plugin {} is not an evaluation task", name_);
    host_ = std::make_unique<PluginHostContext>(name_, seed);
    ctx_err err{};
    const ctx_status st = vt_->create(&host_->api, reinterpret_cast<const ctx_options*>(&options),
                                      &instance_, &err);
    if (st != CTX_OK) {
        instance_ = nullptr;
        fail("{} {}: {}", options.where(), name_,
             err.message[0] ? err.message : "create() failed without a message");
    }
}

EvalPlugin::~EvalPlugin() {
    if (instance_) vt_->destroy(instance_);
}

void EvalPlugin::run(EvalContext& context) {
    CTX_CHECK(context.model && context.documents && context.comm,
              "internal: evaluation needs a model, documents and a communicator");
    ctx_eval_host host;
    host.context = &context;
    host.plugin_name = name_;
    ctx_err err{};
    const ctx_status st = vt_->run(instance_, &eval_api(), &host, &err);
    if (st != CTX_OK)
        fail("{}: run failed (status {}): {}", name_, static_cast<int>(st),
             err.message[0] ? err.message : "no message");
    CTX_CHECK(host.pending_error.empty(), "{}: {}", name_, host.pending_error);
    CTX_CHECK(!host.in_record, "{}: a record was begun but never ended", name_);
}

}  // namespace ctx
