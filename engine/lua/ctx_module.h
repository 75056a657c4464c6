// The `ctx` module recipes see (DESIGN.md decision 6): build models with PE plugins, in-memory
// data, train, evaluate, log, rank/world info. Every table argument is checked against a schema
// (unknown keys and wrong types are errors with the recipe's file:line).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "io/metrics.h"
#include "model/device_select.h"
#include "parallel/comm.h"
#include "parallel/grad_reducer.h"
#include "plugin/registry.h"

struct lua_State;

namespace ctx {

// What the module needs from the executable; outlives the Lua state.
struct EngineContext {
    PluginRegistry* registry = nullptr;
    Comm* comm = nullptr;
    int threads = 0;  // CPU threads for the CPU backend (0: OpenMP's default)
    std::string recipe_text;  // the running recipe's source, stored in checkpoints
    // --device / --precision: what models use unless the recipe names its own.
    DeviceChoice default_device = DeviceChoice::Auto;
    Precision default_precision = Precision::Fp32;
    bool device_from_cli = false, precision_from_cli = false;
    // Backends are created on first use and shared by every model of the run (one per device
    // kind and precision).
    std::map<std::string, std::unique_ptr<Backend>> backends;
    Backend& backend(DeviceChoice device, Precision precision);
    // Gradient reducers (NCCL communicators are costly to build): one per backend and options,
    // shared by every ctx.train of the run.
    std::map<std::string, std::unique_ptr<GradReducer>> reducers;
    GradReducer& grad_reducer(Backend& backend, const GradReduceOptions& options);
    // Forgets a reducer (after a failed step left it mid-step); the next ctx.train builds anew.
    void drop_grad_reducer(const GradReducer* reducer);
    // One metrics writer per output directory (rank 0 writes, others hold inactive writers).
    std::map<std::string, std::unique_ptr<MetricsWriter>> metrics;
    MetricsWriter& metrics_for(const std::string& out_dir);
};

// Registers the global `ctx` table (and package.loaded.ctx).
void open_ctx_module(lua_State* L, EngineContext* engine);

namespace lua_detail {
EngineContext& engine(lua_State* L);  // the context open_ctx_module registered
}  // namespace lua_detail

}  // namespace ctx
