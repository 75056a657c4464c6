// AdamW (decoupled weight decay) over the whole parameter arena, global-norm gradient clipping,
// and the warmup + cosine learning-rate schedule.
#pragma once

#include <cstdint>
#include <string>

#include "model/arena.h"
#include "model/decoder.h"

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

class Optimizer {
public:
    Optimizer(Model& model, const OptimizerConfig& config);
    const OptimizerConfig& config() const { return config_; }
    OptimizerConfig& config() { return config_; }
    int64_t step() const { return step_; }  // updates done so far
    void set_step(int64_t s) { step_ = s; }
    Arena& m() { return m_; }
    Arena& v() { return v_; }
    const Arena& m() const { return m_; }
    const Arena& v() const { return v_; }

    // Global L2 norm of the gradient arena (padding is zero and does not count).
    double grad_norm() const;
    // Clips (if configured) and applies one AdamW update with the scheduled LR; returns
    // {lr used, gradient norm before clipping}. Calls the PE plugin's after_update.
    struct StepInfo {
        double lr, grad_norm;
    };
    StepInfo update();

private:
    Model& model_;
    OptimizerConfig config_;
    Arena m_, v_;  // AdamW moments, same layout as the parameters
    int64_t step_ = 0;
};

}  // namespace ctx
