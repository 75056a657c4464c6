// The host side of evaluation plugins: ctx_eval_api over a model, a document set and a metrics
// sink, and the instance wrapper. Above the model (it runs it), unlike the PE and sampler hosts.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/options.h"
#include "ctx/plugin.h"
#include "data/shard.h"
#include "io/metrics.h"
#include "model/decoder.h"
#include "model/generate.h"
#include "parallel/comm.h"
#include "plugin/plugin_instance.h"
#include "plugin/registry.h"

namespace ctx {

// The scoring behind ctx_eval_api's score_rows / row_logprobs, for any caller (eval plugins,
// model:logprobs): per-token log-probabilities of q.targets (and argmax ids) of q.n_rows rows
// of q.row_len, attention limited to q.window tokens if > 0. Rows are split across the ranks of
// comm in groups of consecutive rows whose size depends only on the request (so the scores do not
// depend on the number of ranks) and the results gathered, so every rank must call it with the
// same request. rows is staging, resized as needed. Throws ctx::Error.
// With sparsity predictors set, the rows are scored by teacher-forced decoding through the
// KV-cache path with contextual sparsity instead (model/generate.h, decode_rows), so scoring
// tasks measure the sparse model.
void score_rows(Model& model, Comm& comm, BatchBuffers& rows, const ctx_score_request& q,
                const SparsityOptions* sparsity = nullptr);

// What one evaluation run sees. Lives for the duration of EvalPlugin::run.
struct EvalContext {
    Model* model = nullptr;
    const DocStore* documents = nullptr;
    MetricsWriter* metrics = nullptr;
    Comm* comm = nullptr;                // the data-parallel group: items are split over its ranks
    bool logs = true;                    // this rank logs (one rank of the whole grid does)
    int trained_length = 0;              // the model's original Lt
    const class Tokenizer* tokenizer = nullptr;  // for text tasks; nullptr: none given
    Record tags = Record::object();      // added to every record (method, stage, ...)
    std::vector<Record>* collected = nullptr;  // records are also returned to the caller
    SparsityOptions sparsity;  // contextual sparsity of every generation the task asks for
};

class EvalPlugin {
public:
    EvalPlugin(const LoadedPlugin& lib, const Options& options, uint64_t seed);
    ~EvalPlugin();
    EvalPlugin(const EvalPlugin&) = delete;
    EvalPlugin& operator=(const EvalPlugin&) = delete;
    const std::string& name() const { return name_; }
    // Runs the task; throws ctx::Error (prefixed with the plugin name) when it fails.
    void run(EvalContext& context);

private:
    const LoadedPlugin* lib_;
    const ctx_eval_vtable* vt_;
    std::string name_;
    PluginInstance instance_;
};

}  // namespace ctx
