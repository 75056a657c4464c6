#include "model/trainer.h"

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/stop_signal.h"

namespace ctx {

TrainResult train(Model& model, Optimizer& opt, BatchSource& data,
                  const TrainOptions& o, Comm& comm, double peak_flops,
                  const StepCallback& on_step) {
    CTX_CHECK(o.steps > 0, "steps must be positive, got {}", o.steps);
    CTX_CHECK(o.batch_size > 0, "batch_size must be positive, got {}", o.batch_size);
    CTX_CHECK(o.seq_len > 0, "seq_len must be positive, got {}", o.seq_len);
    CTX_CHECK(o.skip_nonfinite >= 0, "skip_nonfinite must be >= 0, got {}", o.skip_nonfinite);
    int nonfinite_in_a_row = 0;
    const int64_t first_step = opt.step();
    model.reserve(o.batch_size, o.seq_len);
    BatchBuffers buf;
    buf.resize(o.batch_size, o.seq_len);
    TrainResult result;
    result.steps.reserve(static_cast<size_t>(o.steps));
    const double flops_per_token = model.flops_per_token(o.seq_len);
    const auto t_start = std::chrono::steady_clock::now();
    auto t_last = t_start;
    double tokens_since_log = 0;
    auto t_step = t_start;
    const bool interactive = isatty(STDERR_FILENO) != 0;
    std::unique_ptr<GradReducer> own_reducer;
    GradReducer* reducer = o.reducer;
    if (!reducer) {
        own_reducer = make_grad_reducer(model.backend(), comm, o.reduce);
        reducer = own_reducer.get();
    }
    // The backward pass hands finished layers to the reducer; the hook is removed on every exit.
    model.set_grad_ready_hook([reducer](float* g, size_t n) { reducer->ready(g, n); });
    struct HookGuard {
        Model& m;
        ~HookGuard() { m.set_grad_ready_hook({}); }
    } hook_guard{model};
    for (int64_t s = 0; s < o.steps; ++s) {
        data.next(buf, o.batch_size, o.seq_len);
        const Batch batch = buf.batch();
        // The loss is the mean over every trained token of the global batch, so scale the
        // gradient by the global count (all ranks' masks), known before the forward pass.
        double counts[1] = {0};
        for (float m : buf.mask) counts[0] += m;
        comm.allreduce_sum(counts, 1);
        CTX_CHECK(counts[0] > 0, "step {}: the batch trains no token (every loss mask is 0)",
                  opt.step() + 1);
        model.backend().zero(model.grads().data(), model.grads().size());
        // ZeRO-1: each rank needs only its shard's sums (the arena may move between calls).
        reducer->set_shards(opt.sharded() ? GradShards{model.grads().data(), opt.shard_floats()}
                                          : GradShards{});
        reducer->begin();
        const LossSums local = model.forward_backward(batch, static_cast<float>(1.0 / counts[0]));
        reducer->finish();
        // The loss sum, and whether any rank was asked to stop (one all-reduce for both).
        double loss_sum[2] = {local.loss_sum, o.stop_on_signal ? double(stop_request()) : 0.0};
        comm.allreduce_sum(loss_sum, 2);
        if (o.stop_on_signal && o.world && o.world != &comm) {  // the grid decides together
            double stop[1] = {double(stop_request())};
            o.world->allreduce_sum(stop, 1);
            loss_sum[1] = stop[0];
        }
        // The loss and the all-reduced gradient's norm are the same on every rank, so every
        // rank takes the same decision.
        const double loss = loss_sum[0] / counts[0];
        const double norm = opt.grad_norm();
        const bool finite = std::isfinite(loss) && std::isfinite(norm);
        nonfinite_in_a_row = finite ? 0 : nonfinite_in_a_row + 1;
        CTX_CHECK(nonfinite_in_a_row <= o.skip_nonfinite,
                  "step {}: the loss is {} and the gradient norm {}: training diverged ({} "
                  "non-finite step(s) in a row, skip_nonfinite = {}; lower lr, or check the data)",
                  opt.step() + 1, loss, norm, nonfinite_in_a_row, o.skip_nonfinite);
        Optimizer::StepInfo info{learning_rate(opt.config(), opt.step()), norm};
        if (finite) {
            info = opt.update(norm, reducer);
        } else {
            ++result.skipped;
            if (comm.rank() == 0)
                spdlog::warn("step {}: the loss is {} and the gradient norm {}: step skipped (no "
                             "update; {} in a row of at most {})", opt.step() + 1, loss, norm,
                             nonfinite_in_a_row, o.skip_nonfinite);
        }

        StepRecord rec;
        rec.step = finite ? opt.step() : opt.step() + 1;
        rec.skipped = !finite;
        rec.loss = loss;
        rec.lr = info.lr;
        rec.grad_norm = info.grad_norm;
        tokens_since_log += static_cast<double>(o.batch_size) * o.seq_len * comm.size();
        const auto now = std::chrono::steady_clock::now();
        const double dt = std::chrono::duration<double>(now - t_last).count();
        rec.tokens_per_s = dt > 0 ? tokens_since_log / dt : 0;
        rec.tokens = static_cast<double>(o.batch_size) * o.seq_len * comm.size();
        rec.seconds = std::chrono::duration<double>(now - t_step).count();
        t_step = now;
        result.steps.push_back(rec);
        if (on_step) on_step(rec);
        const bool last = s + 1 == o.steps;
        const double elapsed = std::chrono::duration<double>(now - t_start).count();
        const double eta =
            elapsed / static_cast<double>(s + 1) * static_cast<double>(o.steps - s - 1);
        // batches are steps; skipped ones do not advance the optimizer
        const int64_t final_step = first_step + o.steps - result.skipped;
        const std::string skipped_note =
            result.skipped > 0 ? fmt::format(" | skipped {}", result.skipped) : std::string();
        const bool log_line = o.log_every > 0 && (rec.step % o.log_every == 0 || last || s == 0);
        if (comm.rank() == 0 && o.log_every > 0 && interactive && !log_line) {
            // Every step on a terminal: one line rewritten in place.
            std::fprintf(stderr, "\r  step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | "
                         "%.0f tok/s | eta %.0fs%s   ", static_cast<long long>(rec.step),
                         static_cast<long long>(final_step), rec.loss, rec.lr, rec.grad_norm,
                         rec.seconds > 0 ? rec.tokens / rec.seconds : 0.0, eta,
                         skipped_note.c_str());
            std::fflush(stderr);
        }
        if (log_line) {
            if (comm.rank() == 0) {
                if (interactive) std::fprintf(stderr, "\r\033[K");
                spdlog::info("step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | "
                             "{:.0f} tok/s | eta {:.0f}s{}",
                             rec.step, final_step, rec.loss, rec.lr, rec.grad_norm,
                             rec.tokens_per_s, eta, skipped_note);
            }
            t_last = now;
            tokens_since_log = 0;
        }
        if (loss_sum[1] > 0) {  // every rank sees the same sum: all stop after this step
            result.stopped_by = stop_request() ? stop_request() : -1;  // -1: another rank's
            break;
        }
    }
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    const double tokens = static_cast<double>(result.steps.size()) * o.batch_size * o.seq_len *
                          comm.size();
    result.tokens_per_s = result.seconds > 0 ? tokens / result.seconds : 0;
    if (peak_flops > 0) result.mfu = result.tokens_per_s * flops_per_token / peak_flops;
    return result;
}

double evaluate_loss(Model& model, const BatchFn& next_batch, int batches, int B, int T,
                     uint64_t seed, Comm& comm) {
    CTX_CHECK(batches > 0, "batches must be positive, got {}", batches);
    Rng rng(rank_seed(seed, comm.rank()));
    BatchBuffers buf;
    buf.resize(B, T);
    double sums[2] = {0, 0};
    for (int i = 0; i < batches; ++i) {
        next_batch(buf, B, T, rng);
        const LossSums s = model.forward(buf.batch());
        sums[0] += s.loss_sum;
        sums[1] += s.mask_sum;
    }
    comm.allreduce_sum(sums, 2);
    CTX_CHECK(sums[1] > 0, "evaluation trained-token count is 0 (every loss mask is 0)");
    return sums[0] / sums[1];
}

}  // namespace ctx
