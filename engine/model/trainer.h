// The training loop: sample rows, forward + backward, all-reduce gradients across data-parallel
// ranks, clip, AdamW, log. No allocation inside a step after the first.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "data/batch_source.h"
#include "data/token_source.h"
#include "model/decoder.h"
#include "model/optimizer.h"
#include "parallel/comm.h"
#include "parallel/grad_reducer.h"

namespace ctx {

struct TrainOptions {
    int64_t steps = 100;
    int batch_size = 8;  // rows per rank per step
    int seq_len = 128;
    int log_every = 10;  // 0: no progress lines
    // Data-parallel gradient sum: `reducer` when given (kept across calls by the caller, e.g.
    // an NCCL communicator), else one made for this call from `reduce`.
    GradReduceOptions reduce;
    GradReducer* reducer = nullptr;
    // A step whose loss or gradient norm is not finite is skipped (no update; parameters, moments
    // and the optimizer's step count stay as they were, the batch is consumed) up to this many
    // in a row; one more stops training with an error. 0: the first one stops it.
    int skip_nonfinite = 0;
    // Stop after the step in which any rank received a stop signal (core/stop_signal.h).
    bool stop_on_signal = false;
    // The whole process grid when `comm` (the data-parallel group: different rows, gradients
    // summed) is part of one (tensor or context parallelism): stop decisions are taken over it,
    // so no rank leaves its group mid-collective. Null: comm.
    Comm* world = nullptr;
};

struct StepRecord;
// Called on every rank after every step (e.g. to write metrics.jsonl on rank 0).
using StepCallback = std::function<void(const struct StepRecord&)>;

struct StepRecord {
    int64_t step = 0;  // 1-based optimizer step (a skipped step: the one its batch was for)
    bool skipped = false;  // non-finite loss or gradient norm: no update (skip_nonfinite)
    double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0;
    double tokens = 0;     // global tokens of this step
    double seconds = 0;    // wall time of this step
};

struct TrainResult {
    std::vector<StepRecord> steps;
    int64_t skipped = 0;  // steps skipped for a non-finite loss or gradient norm
    int stopped_by = 0;   // the stop signal that ended training early (0: ran every step; -1:
                          // another rank's)
    double seconds = 0;
    double tokens_per_s = 0;  // over all ranks
    double mfu = 0;           // against peak_flops when given
};

// Produces one batch of rows per call from a caller-owned RNG (evaluation sampling).
using BatchFn = std::function<void(BatchBuffers& out, int B, int T, Rng& rng)>;

// comm: the data-parallel group (world at dp only). peak_flops: the whole world's peak FLOP/s
// for the MFU column, 0 to skip.
TrainResult train(Model& model, Optimizer& opt, BatchSource& data,
                  const TrainOptions& options, Comm& comm, double peak_flops = 0,
                  const StepCallback& on_step = {});

// Mean masked loss over `batches` deterministic batches drawn with Rng(seed).
double evaluate_loss(Model& model, const BatchFn& next_batch, int batches, int B, int T,
                     uint64_t seed, Comm& comm);

}  // namespace ctx
