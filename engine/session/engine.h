// The application layer (engine/session/): what one run owns and does, for every front end.
// The Lua module (lua/) and the command line (cli/) call it; they translate their own forms
// (recipe tables, arguments) into option structs and back, and hold no application logic.
//
// EngineContext: the run's plugins and communicator, the backends (one per device kind and
// precision, shared by the run's models), gradient reducers and metrics writers.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "io/metrics.h"
#include "model/device_select.h"
#include "parallel/comm.h"
#include "parallel/grad_reducer.h"
#include "parallel/grid.h"
#include "plugin/registry.h"

namespace ctx {

// What the run needs from the executable; outlives everything built with it.
struct EngineContext {
    PluginRegistry* registry = nullptr;
    Comm* comm = nullptr;  // the world: rank 0 writes files and logs
    // The process grid (parallel/grid.h), from --tp / --cp or ctx.parallel{}; built on first use
    // (collective: every rank runs the same recipe), fixed afterwards.
    GridShape grid_shape;
    bool grid_from_cli = false;
    bool sequence_parallel = false;  // models built with tp > 1 use it (Model::set_sequence_parallel)
    std::unique_ptr<ParallelGrid> grid;
    ParallelGrid& parallel();
    // The data-parallel group: ranks that train on different rows and sum their gradients
    // (the world when tp = cp = 1). Data streams, evaluation items and reducers use it.
    Comm& data_comm() { return parallel().dp_group(); }
    // The ranks that hold the same parameters (dp x cp): gradients are summed over them.
    Comm& gradient_comm() { return parallel().dp_cp_group(); }
    // The context-parallel group for a model (null at cp 1).
    Comm* context_comm() { return parallel().cp() > 1 ? &parallel().cp_group() : nullptr; }
    // The tensor-parallel group for a model (null at tp 1).
    Comm* tensor_comm() { return parallel().tp() > 1 ? &parallel().tp_group() : nullptr; }
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
    // shared by every training call of the run.
    std::map<std::string, std::unique_ptr<GradReducer>> reducers;
    GradReducer& grad_reducer(Backend& backend, const GradReduceOptions& options);
    // Forgets a reducer (after a failed step left it mid-step); the next call builds anew.
    void drop_grad_reducer(const GradReducer* reducer);
    // One metrics writer per output directory (rank 0 writes, others hold inactive writers).
    std::map<std::string, std::unique_ptr<MetricsWriter>> metrics;
    MetricsWriter& metrics_for(const std::string& out_dir);
};

}  // namespace ctx
