#include "model/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ctx {

LrSchedule lr_schedule_from_name(const std::string& name) {
    if (name == "cosine") return LrSchedule::Cosine;
    if (name == "linear") return LrSchedule::Linear;
    if (name == "constant") return LrSchedule::Constant;
    fail("unknown learning-rate schedule '{}' (expected cosine, linear or constant)", name);
}

const char* lr_schedule_name(LrSchedule s) {
    switch (s) {
        case LrSchedule::Cosine: return "cosine";
        case LrSchedule::Linear: return "linear";
        default: return "constant";
    }
}

void OptimizerConfig::validate() const {
    CTX_CHECK(lr > 0 && std::isfinite(lr), "lr must be positive, got {}", lr);
    CTX_CHECK(min_lr >= 0 && min_lr <= lr, "min_lr must be in [0, lr], got {}", min_lr);
    CTX_CHECK(warmup_steps >= 0, "warmup_steps must be >= 0, got {}", warmup_steps);
    CTX_CHECK(total_steps >= 0, "total_steps must be >= 0, got {}", total_steps);
    CTX_CHECK(schedule_start >= 0, "schedule_start must be >= 0, got {}", schedule_start);
    CTX_CHECK(beta1 >= 0 && beta1 < 1, "beta1 must be in [0, 1), got {}", beta1);
    CTX_CHECK(beta2 >= 0 && beta2 < 1, "beta2 must be in [0, 1), got {}", beta2);
    CTX_CHECK(eps > 0, "eps must be positive, got {}", eps);
    CTX_CHECK(weight_decay >= 0, "weight_decay must be >= 0, got {}", weight_decay);
    CTX_CHECK(grad_clip >= 0, "grad_clip must be >= 0 (0 disables), got {}", grad_clip);
}

double learning_rate(const OptimizerConfig& c, int64_t optimizer_step) {
    const int64_t step = std::max<int64_t>(0, optimizer_step - c.schedule_start);
    if (c.warmup_steps > 0 && step < c.warmup_steps)
        return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
    if (c.schedule == LrSchedule::Constant || c.total_steps <= c.warmup_steps) return c.lr;
    double q = static_cast<double>(step - c.warmup_steps) /
               static_cast<double>(c.total_steps - c.warmup_steps);
    q = std::min(1.0, std::max(0.0, q));
    if (c.schedule == LrSchedule::Linear) return c.lr + (c.min_lr - c.lr) * q;
    return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * q));
}

Optimizer::Optimizer(Model& model, const OptimizerConfig& config)
    : model_(model), config_(config),
      m_(model.backend(), model.layout().total()), v_(model.backend(), model.layout().total()) {
    config_.validate();
}

double Optimizer::grad_norm() const {
    Arena& g = model_.grads();
    return std::sqrt(model_.backend().sum_squares(g.data(), g.size()));
}

Optimizer::StepInfo Optimizer::update() {
    Backend& be = model_.backend();
    Arena& p = model_.params();
    Arena& g = model_.grads();
    CTX_CHECK(m_.size() == p.size() && v_.size() == p.size(),
              "optimizer moments do not match the parameters (was the model extended without "
              "the optimizer?)");
    const double norm = grad_norm();
    CTX_CHECK(std::isfinite(norm), "the gradient norm is {} at step {}: training diverged "
              "(lower lr, or check the data)", norm, step_ + 1);
    if (config_.grad_clip > 0 && norm > config_.grad_clip)
        be.scale(g.data(), static_cast<float>(config_.grad_clip / (norm + 1e-6)), g.size());
    const double lr = learning_rate(config_, step_);
    AdamWParams hp;
    hp.lr = static_cast<float>(lr);
    hp.beta1 = config_.beta1;
    hp.beta2 = config_.beta2;
    hp.eps = config_.eps;
    hp.step = step_ + 1;
    for (const ParamView& view : model_.layout().views()) {
        hp.weight_decay = view.weight_decay ? config_.weight_decay : 0.0f;
        be.adamw_update(p.at(view), g.at(view), m_.at(view), v_.at(view), view.numel, hp);
    }
    ++step_;
    model_.after_update();
    return {lr, norm};
}

}  // namespace ctx
