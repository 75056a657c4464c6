#include "session/training.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/stop_signal.h"
#include "io/checkpoint.h"
#include "model/config_json.h"

namespace ctx {

void add_pe_param_stats(const Model& model, Record& r) {
    std::vector<float> host;
    for (const ParamView& v : model.layout().views()) {
        if (v.name.rfind("pe.", 0) != 0) continue;
        host.resize(v.numel);
        model.backend().copy_to_host(host.data(), model.params().at(v), v.numel);
        double sum = 0, lo = host[0], hi = host[0];
        for (float x : host) {
            sum += x;
            lo = std::min<double>(lo, x);
            hi = std::max<double>(hi, x);
        }
        r[v.name + ".mean"] = sum / static_cast<double>(v.numel);
        r[v.name + ".min"] = lo;
        r[v.name + ".max"] = hi;
    }
}

namespace {

// Where this model computes, to rebuild it from a checkpoint the same way.
DeviceRequest device_of(const ModelHandle& h) {
    DeviceRequest d;
    d.device = h.model->backend().kind() == DeviceKind::CUDA ? DeviceChoice::Cuda : DeviceChoice::Cpu;
    d.precision = h.model->backend().precision();
    d.attention = h.model->attention_choice();
    return d;
}

// resume: the state of this call's latest checkpoint replaces h's and data's; returns the steps
// already done (0 when the directory has none).
int64_t resume_from(EngineContext& engine, ModelHandle& h, BatchSource& data,
                    const TrainRequest& request, int64_t start, const std::string& where) {
    const std::string path = latest_checkpoint(request.checkpoint_dir);
    if (path.empty()) return 0;
    const TrainingState s = load_checkpoint(path);
    nlohmann::json meta = nlohmann::json::parse(s.metadata_json, nullptr, false);
    CTX_CHECK(meta.is_object() && meta.value("train_start", int64_t{-1}) == start,
              "{} ctx.train: {} is not a checkpoint of this training call (it started at "
              "optimizer step {}, this call starts at {}): give each ctx.train its own "
              "checkpoint_dir", where, path, meta.is_object() ? meta.value("train_start", int64_t{-1})
                                                               : int64_t{-1}, start);
    ModelRef loaded = model_from_checkpoint(engine, s, path, device_of(h));
    CTX_CHECK(model_config_to_json(loaded->model->config()) ==
                  model_config_to_json(h.model->config()) && loaded->pe_name == h.pe_name,
              "{} ctx.train: {} holds a different model than this recipe builds", where, path);
    h = std::move(*loaded);
    data.restore(s, engine.data_comm());
    if (engine.comm->rank() == 0)
        spdlog::info("resumed from {} (optimizer step {}, {} of this call's steps done)", path,
                     s.step, s.step - start);
    return s.step - start;
}

// checkpoint_dir/step-N.h5 of the current state (collective), `latest` pointed at it, then the
// retention of request.keep_last; returns the file's name.
std::string save_step_checkpoint(EngineContext& engine, ModelHandle& h, BatchSource& data,
                                 const TrainRequest& request, const nlohmann::json& meta) {
    const std::string name = fmt::format("step-{:08d}.h5", h.optimizer->step());
    write_checkpoint(engine, request.checkpoint_dir + "/" + name,
                     model_checkpoint_state(engine, h, &data, meta));
    on_rank0(*engine.comm, [&] {
        set_latest_checkpoint(request.checkpoint_dir, name);
        if (request.keep_last > 0) {
            CheckpointRetention keep;
            keep.keep_last = request.keep_last;
            const RetentionResult r = apply_checkpoint_retention(request.checkpoint_dir, keep);
            for (const std::string& f : r.failed)
                spdlog::warn("checkpoint retention: could not delete {}", f);
        }
    });
    return name;
}

}  // namespace

TrainResult train_model(EngineContext& engine, ModelHandle& h, BatchSource& data,
                        TrainRequest request, const std::string& where) {
    const int64_t start = h.optimizer ? h.optimizer->step() : 0;
    const int64_t call_steps = request.train.steps;
    if (request.resume) {
        const int64_t done = resume_from(engine, h, data, request, start, where);
        if (done >= call_steps) return TrainResult{};  // this call had finished
        if (done > 0) {
            request.train.steps = call_steps - done;
            request.new_schedule = false;  // the checkpoint's schedule continues
        }
    }
    OptimizerConfig& oc = request.optimizer;
    oc.schedule_start = h.optimizer ? h.optimizer->step() : 0;
    // Shards over the ranks that sum gradients (dp x cp): the reducer reduce-scatters to them.
    Comm* zero_comm = request.zero ? &engine.gradient_comm() : nullptr;
    if (!h.optimizer)
        h.optimizer = std::make_unique<Optimizer>(*h.model, oc, zero_comm);
    else if (request.new_schedule)
        h.optimizer->config() = oc;
    // ZeRO-1 may change between calls (and a loaded checkpoint starts unsharded): the moments
    // move to the new layout.
    if (h.optimizer->sharded() != (zero_comm && zero_comm->size() > 1))
        h.optimizer->set_sharding(zero_comm);
    StepCallback on_step;
    if (!request.out_dir.empty()) {
        MetricsWriter* metrics = &engine.metrics_for(request.out_dir);
        Model* model = h.model.get();
        on_step = [metrics, model](const StepRecord& s) {
            Record r = Record::object();
            r["type"] = "train";
            r["step"] = s.step;
            r["loss"] = s.loss;
            r["lr"] = s.lr;
            r["grad_norm"] = s.grad_norm;
            if (s.skipped) r["skipped"] = true;  // no update (skip_nonfinite)
            r["tokens"] = s.tokens;
            r["step_seconds"] = s.seconds;
            r["tokens_per_s"] = s.seconds > 0 ? s.tokens / s.seconds : 0.0;
            if (metrics->active()) add_pe_param_stats(*model, r);
            metrics->jsonl(r);
        };
    }
    CTX_CHECK(request.checkpoint_every == 0 || !request.checkpoint_dir.empty(),
              "{} ctx.train: checkpoint_every needs checkpoint_dir", where);
    // Every step: the tokens seen (so a checkpoint saved during the call has them), then the
    // periodic checkpoint.
    StepCallback inner = on_step;
    on_step = [&engine, &h, &data, &request, inner, start, call_steps](const StepRecord& s) {
        h.tokens_seen += static_cast<int64_t>(s.tokens);
        if (inner) inner(s);
        if (request.checkpoint_every <= 0 || s.skipped ||
            (s.step - start) % request.checkpoint_every != 0)
            return;
        save_step_checkpoint(engine, h, data, request,
                             {{"train_start", start}, {"train_steps", call_steps}});
    };
    TrainOptions& t = request.train;
    try {
        t.reducer = &engine.grad_reducer(h.model->backend(), t.reduce);
    } catch (const Error& e) {
        fail("{} ctx.train: {}", where, e.what());
    }
    TrainResult r;
    try {
        t.world = engine.comm;  // stop decisions over the whole grid
        r = train(*h.model, *h.optimizer, data, t, engine.data_comm(), 0, on_step);
    } catch (...) {
        // A step that failed mid-backward leaves the reducer mid-step: do not reuse it.
        engine.drop_grad_reducer(t.reducer);
        throw;
    }
    if (r.stopped_by != 0) {
        const std::string by = r.stopped_by > 0 ? signal_name(r.stopped_by) : "a stop signal";
        set_exit_status_override(kExitStopped);
        if (request.checkpoint_dir.empty())
            fail("{} ctx.train: stopped by {} after optimizer step {}; nothing saved (give "
                 "ctx.train a checkpoint_dir to continue later)", where, by, h.optimizer->step());
        const std::string name = save_step_checkpoint(
            engine, h, data, request,
            {{"train_start", start}, {"train_steps", call_steps}, {"stopped_by", by}});
        fail("{} ctx.train: stopped by {} after optimizer step {}: saved {}/{}; run the same "
             "command again to continue (resume = \"auto\")", where, by, h.optimizer->step(),
             request.checkpoint_dir, name);
    }
    return r;
}

}  // namespace ctx
