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
#include "parallel/comm.h"
#include "plugin/plugin_instance.h"
#include "plugin/registry.h"

namespace ctx {

// What one evaluation run sees. Lives for the duration of EvalPlugin::run.
struct EvalContext {
    Model* model = nullptr;
    const DocStore* documents = nullptr;
    MetricsWriter* metrics = nullptr;
    Comm* comm = nullptr;
    int trained_length = 0;              // the model's original Lt
    const class Tokenizer* tokenizer = nullptr;  // for text tasks; nullptr: none given
    Record tags = Record::object();      // added to every record (method, stage, ...)
    std::vector<Record>* collected = nullptr;  // records are also returned to the caller
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
