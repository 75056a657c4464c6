#include "model/optimizer.h"

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "parallel/grad_reducer.h"

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
    // Non-finite values would also not survive the JSON a checkpoint keeps them in (null).
    CTX_CHECK(eps > 0 && std::isfinite(eps), "eps must be positive and finite, got {}", eps);
    CTX_CHECK(weight_decay >= 0 && std::isfinite(weight_decay),
              "weight_decay must be >= 0 and finite, got {}", weight_decay);
    CTX_CHECK(grad_clip >= 0 && std::isfinite(grad_clip),
              "grad_clip must be >= 0 and finite (0 disables), got {}", grad_clip);
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

Optimizer::Optimizer(Model& model, const OptimizerConfig& config, Comm* zero_comm)
    : model_(model), config_(config) {
    config_.validate();
    comm_ = zero_comm && zero_comm->size() > 1 ? zero_comm : nullptr;
    allocate();
}

void Optimizer::allocate() {
    const size_t P = model_.layout().total();
    if (comm_) {
        const size_t W = static_cast<size_t>(comm_->size());
        shard_ = ((P + W - 1) / W + 15) / 16 * 16;
        lo_ = std::min(P, shard_ * static_cast<size_t>(comm_->rank()));
        hi_ = std::min(P, lo_ + shard_);
    } else {
        shard_ = P;
        lo_ = 0;
        hi_ = P;
    }
    m_ = Arena(model_.backend(), hi_ - lo_);
    v_ = Arena(model_.backend(), hi_ - lo_);
    if (comm_)
        spdlog::info("ZeRO-1: rank {} of {} keeps the AdamW moments of parameters [{}, {}) of {} "
                     "({} floats instead of {})", comm_->rank(), comm_->size(), lo_, hi_, P,
                     2 * (hi_ - lo_), 2 * P);
}

void Optimizer::track_layout() const {
    if (comm_) return;
    lo_ = 0;
    hi_ = shard_ = model_.layout().total();
}

Arena& Optimizer::m() {
    CTX_CHECK(!sharded(), "internal: the moments are sharded (ZeRO-1): use gather_moments");
    return m_;
}
Arena& Optimizer::v() {
    CTX_CHECK(!sharded(), "internal: the moments are sharded (ZeRO-1): use gather_moments");
    return v_;
}
const Arena& Optimizer::m() const { return const_cast<Optimizer*>(this)->m(); }
const Arena& Optimizer::v() const { return const_cast<Optimizer*>(this)->v(); }

void Optimizer::gather_moments(std::vector<float>& m, std::vector<float>& v) const {
    track_layout();
    Backend& be = model_.backend();
    const size_t P = model_.layout().total();
    for (auto [out, mine] : {std::pair{&m, &m_}, std::pair{&v, &v_}}) {
        if (!comm_) {
            out->resize(P);
            be.copy_to_host(out->data(), mine->data(), P);
            continue;
        }
        const size_t W = static_cast<size_t>(comm_->size());
        std::vector<float> send(shard_, 0.0f), all(W * shard_);
        be.copy_to_host(send.data(), mine->data(), hi_ - lo_);
        comm_->allgather(send.data(), shard_ * sizeof(float), all.data());
        out->assign(all.begin(), all.begin() + static_cast<ptrdiff_t>(P));
    }
}

void Optimizer::scatter_moments(const std::vector<float>& m, const std::vector<float>& v) {
    track_layout();
    const size_t P = model_.layout().total();
    CTX_CHECK(m.size() == P && v.size() == P, "optimizer moments of {} / {} floats for a layout "
              "of {}", m.size(), v.size(), P);
    Backend& be = model_.backend();
    be.copy_to_device(m_.data(), m.data() + lo_, hi_ - lo_);
    be.copy_to_device(v_.data(), v.data() + lo_, hi_ - lo_);
}

void Optimizer::set_sharding(Comm* zero_comm) {
    std::vector<float> m, v;
    gather_moments(m, v);  // of the current shards (collective if sharded)
    comm_ = zero_comm && zero_comm->size() > 1 ? zero_comm : nullptr;
    allocate();
    if (m.size() == model_.layout().total()) scatter_moments(m, v);
}

void Optimizer::relayout(const std::vector<float>& m, const std::vector<float>& v) {
    allocate();
    scatter_moments(m, v);
}

void extend_with_moments(Model& model, Optimizer* opt, int new_len) {
    if (!opt) {
        model.extend(new_len, nullptr, nullptr);
        return;
    }
    if (!opt->sharded()) {
        model.extend(new_len, &opt->m(), &opt->v());
        return;
    }
    // Sharded: extend whole copies of the moments, then shard the new layout.
    Backend& be = model.backend();
    std::vector<float> m, v;
    opt->gather_moments(m, v);
    Arena am(be, m.size()), av(be, v.size());
    be.copy_to_device(am.data(), m.data(), m.size());
    be.copy_to_device(av.data(), v.data(), v.size());
    model.extend(new_len, &am, &av);
    m.resize(am.size());
    v.resize(av.size());
    be.copy_to_host(m.data(), am.data(), am.size());
    be.copy_to_host(v.data(), av.data(), av.size());
    opt->relayout(m, v);
}

void Optimizer::allgather_params() {
    Backend& be = model_.backend();
    const size_t P = model_.layout().total(), W = static_cast<size_t>(comm_->size());
    gather_stage_.resize((W + 1) * shard_);
    float* send = gather_stage_.data() + W * shard_;  // (S) this rank's shard, zero padded
    std::fill(send, send + shard_, 0.0f);
    be.copy_to_host(send, model_.params().data() + lo_, hi_ - lo_);
    comm_->allgather(send, shard_ * sizeof(float), gather_stage_.data());
    be.copy_to_device(model_.params().data(), gather_stage_.data(), P);
}

double Optimizer::grad_norm() const {
    const Arena& g = model_.grads();
    Backend& be = model_.backend();
    if (!comm_ && !model_.tensor_parallel()) return std::sqrt(be.sum_squares(g.data(), g.size()));
    // Sharded (ZeRO-1): only this rank's shard is known to hold the summed gradient (the
    // reducer reduce-scatters), so each rank sums the squares of its shard and the shards' sums
    // are added. Tensor parallelism: each split tensor's part on its rank, each replicated one
    // once (norm_ranges), then the sum over the tensor-parallel group.
    track_layout();
    const std::vector<std::pair<size_t, size_t>> whole{{0, g.size()}};
    double sum[1] = {0};
    for (const auto& [lo, hi] : model_.tensor_parallel() ? model_.norm_ranges() : whole) {
        const size_t a = std::max(lo, lo_), b = std::min(hi, hi_);
        if (a < b) sum[0] += be.sum_squares(g.data() + a, b - a);
    }
    if (comm_) comm_->allreduce_sum(sum, 1);
    if (model_.tensor_parallel()) model_.tensor_group().comm()->allreduce_sum(sum, 1);
    return std::sqrt(sum[0]);
}

Optimizer::StepInfo Optimizer::update() { return update(grad_norm()); }

Optimizer::StepInfo Optimizer::update(double norm, GradReducer* gather) {
    Backend& be = model_.backend();
    Arena& p = model_.params();
    Arena& g = model_.grads();
    track_layout();
    CTX_CHECK(m_.size() == hi_ - lo_ && hi_ <= p.size() && (comm_ || hi_ == p.size()),
              "optimizer moments do not match the parameters (was the model extended without "
              "the optimizer?)");
    // (The norm is the whole gradient's, from every shard: grad_norm().)
    CTX_CHECK(std::isfinite(norm), "the gradient norm is {} at step {}: training diverged "
              "(lower lr, or check the data)", norm, step_ + 1);
    const double lr = learning_rate(config_, step_);
    AdamWParams hp;
    hp.lr = static_cast<float>(lr);
    hp.beta1 = config_.beta1;
    hp.beta2 = config_.beta2;
    hp.eps = config_.eps;
    hp.step = step_ + 1;
    hp.weight_decay = config_.weight_decay;
    // global-norm clipping inside the update (the gradients are left as they are: one pass
    // over them fewer, the same update bit for bit)
    if (config_.grad_clip > 0 && norm > config_.grad_clip)
        hp.grad_scale = static_cast<float>(config_.grad_clip / (norm + 1e-6));
    // every tensor's part in this rank's shard (all of it unsharded), offsets from lo_: one call
    segments_.clear();
    for (const ParamView& view : model_.layout().views()) {
        const size_t a = std::max(view.offset, lo_), b = std::min(view.offset + view.numel, hi_);
        if (a < b) segments_.push_back(AdamWSegment{a - lo_, b - a, view.weight_decay});
    }
    be.adamw_update_segments(p.data() + lo_, g.data() + lo_, m_.data(), v_.data(), segments_, hp);
    if (comm_ && gather) {
        gather->allgather_shards(p.data(), p.size(), shard_);  // device memory, NCCL on GPUs
    } else if (comm_) {
        allgather_params();
    }
    ++step_;
    model_.after_update();
    return {lr, norm};
}

}  // namespace ctx
