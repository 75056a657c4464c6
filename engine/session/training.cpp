#include "session/training.h"

#include <algorithm>

#include "core/error.h"

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

TrainResult train_model(EngineContext& engine, ModelHandle& h, BatchSource& data,
                        TrainRequest request, const std::string& where) {
    OptimizerConfig& oc = request.optimizer;
    oc.schedule_start = h.optimizer ? h.optimizer->step() : 0;
    Comm* zero_comm = request.zero ? engine.comm : nullptr;
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
    TrainOptions& t = request.train;
    try {
        t.reducer = &engine.grad_reducer(h.model->backend(), t.reduce);
    } catch (const Error& e) {
        fail("{} ctx.train: {}", where, e.what());
    }
    TrainResult r;
    try {
        r = train(*h.model, *h.optimizer, data, t, *engine.comm, 0, on_step);
    } catch (...) {
        // A step that failed mid-backward leaves the reducer mid-step: do not reuse it.
        engine.drop_grad_reducer(t.reducer);
        throw;
    }
    for (const StepRecord& s : r.steps) h.tokens_seen += static_cast<int64_t>(s.tokens);
    return r;
}

}  // namespace ctx
