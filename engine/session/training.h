// Training a model of the run (session layer): the optimizer created on the first call and kept
// (a new optimizer config starts a new schedule at the current step, AdamW moments kept), the
// run's gradient reducer, and one metrics record per step.
#pragma once

#include <optional>
#include <string>

#include "model/trainer.h"
#include "session/models.h"

namespace ctx {

struct TrainRequest {
    TrainOptions train;  // steps, rows, logging, reducer options (the reducer is the run's)
    // The optimizer for the first call; later calls use it only when new_schedule is set.
    OptimizerConfig optimizer;
    bool new_schedule = false;  // the caller gave an optimizer config for this call
    std::string out_dir;        // one metrics.jsonl line per step here ("" for none)
    bool zero = false;          // ZeRO-1: AdamW state sharded over the data-parallel ranks
    // Survival (docs/ARCHITECTURE.md "Reliability"): on a stop signal the run saves
    // checkpoint_dir/step-N.h5 (model, optimizer, data position) and ends with kExitStopped;
    // resume continues this call from checkpoint_dir/latest when there is one.
    std::string checkpoint_dir;
    bool resume = false;
    // Also save checkpoint_dir/step-N.h5 (and point `latest` at it) after every this many
    // optimizer steps of the call (0: only on a stop signal), so a run that dies without a
    // signal (a lost node) loses at most this many steps; keep_last > 0 then keeps the newest
    // keep_last step files (CheckpointRetention).
    int64_t checkpoint_every = 0;
    int64_t keep_last = 0;
};

// Trains h on data; adds the step's tokens to h.tokens_seen. `where` prefixes reducer errors.
TrainResult train_model(EngineContext& engine, ModelHandle& h, BatchSource& data,
                        TrainRequest request, const std::string& where);

// Positional-encoding parameters for a metrics line (KERPLE's r1/r2, T5 tables, ...): mean, min
// and max per tensor as "pe.<name>.mean" etc.
void add_pe_param_stats(const Model& model, Record& r);

}  // namespace ctx
