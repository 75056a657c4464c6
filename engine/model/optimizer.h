// AdamW (decoupled weight decay) over the whole parameter arena, global-norm gradient clipping,
// and the warmup + cosine learning-rate schedule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/arena.h"
#include "model/decoder.h"
#include "parallel/comm.h"

namespace ctx {

enum class LrSchedule { Cosine, Linear, Constant };
LrSchedule lr_schedule_from_name(const std::string& name);  // "cosine" | "linear" | "constant"
const char* lr_schedule_name(LrSchedule s);

struct OptimizerConfig {
    float lr = 3e-4f;           // peak learning rate
    float min_lr = 0.0f;        // where the decay ends
    int64_t warmup_steps = 0;   // linear warmup from lr/warmup_steps to lr
    int64_t total_steps = 0;    // schedule length (warmup included); 0: constant after warmup
    int64_t schedule_start = 0; // the optimizer step at which this schedule began (a later
                                // ctx.train with new settings starts a new schedule)
    LrSchedule schedule = LrSchedule::Cosine;
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    float weight_decay = 0.1f;  // applied to parameters declared with weight decay only
    float grad_clip = 1.0f;     // max global L2 norm; 0 disables clipping
    void validate() const;      // throws naming the bad field
};

// Learning rate at 0-based optimizer step `step`, with s = step - schedule_start:
//   s < warmup:  lr * (s + 1) / warmup
//   after warmup, with progress q = (s - warmup) / (total - warmup) clamped to [0, 1]:
//     cosine:   min_lr + 0.5 (lr - min_lr)(1 + cos(pi q))
//     linear:   lr + (min_lr - lr) q
//     constant: lr
double learning_rate(const OptimizerConfig& c, int64_t step);

// ZeRO-1 (sharded optimizer state, docs/PARALLEL.md): over the data-parallel ranks of a Comm,
// rank r keeps the AdamW moments of its shard [shard_begin, shard_end) of the parameter arena
// only (shards of equal size S, multiples of 16 floats; the last one may be shorter or empty),
// updates that part of the parameters from the summed gradients, and all-gathers the updated
// parameters:
//   g reduce-scattered by the GradReducer (each rank's shard summed; grad_reducer.h) ->
//   norm (sum of the shards' squares) -> clip -> AdamW on [lo, hi) -> parameters all-gathered
//   (rank order; by the reducer: NCCL on GPUs) -> after_update
// The update of every element is the one the unsharded optimizer makes (same summed gradient,
// and the clipping factor up to the rounding of the norm's partial sums), so with 2 ranks
// training is bit-identical with and without sharding; moments take 2P/W floats per rank
// instead of 2P. The shards cover the gradient communicator (dp x cp ranks of the grid).
class GradReducer;

class Optimizer {
public:
    // zero_comm: shard over its ranks (ZeRO-1) when non-null and of more than one rank.
    Optimizer(Model& model, const OptimizerConfig& config, Comm* zero_comm = nullptr);
    const OptimizerConfig& config() const { return config_; }
    OptimizerConfig& config() { return config_; }
    int64_t step() const { return step_; }  // updates done so far
    void set_step(int64_t s) { step_ = s; }
    // The moments as arenas of the whole layout: only without sharding (ctx::Error otherwise;
    // use gather_moments / scatter_moments, which work either way).
    Arena& m();
    Arena& v();
    const Arena& m() const;
    const Arena& v() const;

    bool sharded() const { return comm_ != nullptr; }
    size_t shard_begin() const { return lo_; }
    size_t shard_end() const { return hi_; }
    // The whole moments on the host in the arena's layout. Collective when sharded (every rank
    // calls it; each receives all of them).
    void gather_moments(std::vector<float>& m, std::vector<float>& v) const;
    // Sets the moments from whole host arrays in the arena's layout (each rank keeps its shard).
    void scatter_moments(const std::vector<float>& m, const std::vector<float>& v);
    // Switches sharding on (comm of more than one rank) or off (null), keeping the moments.
    // Collective when either side is sharded. Also re-shards after the layout changed (extend),
    // given the moments of the new layout.
    void set_sharding(Comm* zero_comm);
    // After the model's layout changed (extend): the shards of the new layout, from its whole
    // moments m, v (host).
    void relayout(const std::vector<float>& m, const std::vector<float>& v);

    // Global L2 norm of the gradient arena (padding is zero and does not count).
    double grad_norm() const;
    // Clips (if configured) and applies one AdamW update with the scheduled LR; returns
    // {lr used, gradient norm before clipping}. Calls the PE plugin's after_update.
    struct StepInfo {
        double lr, grad_norm;
    };
    StepInfo update();
    // The same with the gradient norm already computed (grad_norm(), the trainer's check).
    // gather: the reducer of the step, which all-gathers the updated shards on the device
    // (null: staged through host memory over the optimizer's Comm).
    StepInfo update(double grad_norm, GradReducer* gather = nullptr);
    // S: floats per shard (multiple of 16; the whole layout unsharded). The reducer's shards.
    size_t shard_floats() const { return shard_; }

private:
    void allocate();  // m_, v_ for [lo_, hi_) of the current layout (zeroed)
    // Unsharded: the whole current layout (model.extend may have grown it and the moments).
    void track_layout() const;
    void allgather_params();

    Model& model_;
    OptimizerConfig config_;
    Comm* comm_ = nullptr;      // ZeRO-1 communicator (null: not sharded)
    mutable size_t lo_ = 0, hi_ = 0;  // this rank's shard of the arena
    mutable size_t shard_ = 0;        // S: floats per shard
    Arena m_, v_;               // AdamW moments of [lo_, hi_) (the whole arena unsharded)
    std::vector<float> gather_stage_;  // (W, S) host staging of the parameter all-gather
    std::vector<AdamWSegment> segments_;  // update(): each tensor's part of the shard
    int64_t step_ = 0;
};

// model.extend(new_len) keeping the AdamW moments of every parameter whose shape is unchanged
// (new ones start at 0), sharded or not. Collective when the optimizer is sharded.
void extend_with_moments(Model& model, Optimizer* opt, int new_len);

}  // namespace ctx
