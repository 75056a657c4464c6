#include "io/model_state.h"

#include <fmt/ranges.h>

#include <map>

#include "core/error.h"
#include "model/config_json.h"

namespace ctx {

// Checkpoints hold the whole model by name whatever the grid (docs/PARALLEL.md): under tensor
// parallelism capture gathers every rank's part (collective over the group) and restore keeps
// this rank's part, so a run saved at one tp resumes at another.
void capture_model(const Model& model, const Optimizer* opt, TrainingState& state) {
    state.model_config_json = model_config_to_json(model.config()).dump();
    if (opt) {
        state.optimizer_config_json = optimizer_config_to_json(opt->config()).dump();
        state.step = opt->step();
    }
    state.tensors.clear();
    const std::vector<float> params = model.gather_full(model.params());
    std::vector<float> adam_m, adam_v;  // whole moments (gathered when sharded: collective)
    if (opt) {
        opt->gather_moments(adam_m, adam_v);
        adam_m = model.gather_full_host(adam_m.data());
        adam_v = model.gather_full_host(adam_v.data());
    }
    for (const ParamView& v : model.full_layout().views()) {
        CheckpointTensor t;
        t.name = v.name;
        t.shape = v.shape;
        t.weight_decay = v.weight_decay;
        t.params.assign(params.begin() + v.offset, params.begin() + v.offset + v.numel);
        if (opt) {
            t.adam_m.assign(adam_m.begin() + v.offset, adam_m.begin() + v.offset + v.numel);
            t.adam_v.assign(adam_v.begin() + v.offset, adam_v.begin() + v.offset + v.numel);
        }
        state.tensors.push_back(std::move(t));
    }
}

void restore_model(Model& model, Optimizer* opt, const TrainingState& state) {
    const ArenaLayout& layout = model.full_layout();
    std::map<std::string, const CheckpointTensor*> by_name;
    for (const CheckpointTensor& t : state.tensors) by_name[t.name] = &t;
    CTX_CHECK(by_name.size() == layout.views().size(),
              "the checkpoint holds {} tensors but the model has {} parameters", by_name.size(),
              layout.views().size());
    std::vector<float> params(layout.total(), 0.0f);
    std::vector<float> adam_m, adam_v;  // whole moments, handed to the optimizer at the end
    if (opt) {
        adam_m.assign(layout.total(), 0.0f);
        adam_v.assign(layout.total(), 0.0f);
    }
    for (const ParamView& v : layout.views()) {
        auto it = by_name.find(v.name);
        CTX_CHECK(it != by_name.end(), "the checkpoint has no tensor '{}'", v.name);
        const CheckpointTensor& t = *it->second;
        CTX_CHECK(t.shape == v.shape, "tensor '{}' has shape [{}] in the checkpoint but [{}] in "
                  "the model", v.name, fmt::join(t.shape, ", "), fmt::join(v.shape, ", "));
        CTX_CHECK(t.params.size() == v.numel, "tensor '{}' holds {} values, expected {}", v.name,
                  t.params.size(), v.numel);
        std::copy(t.params.begin(), t.params.end(), params.begin() + v.offset);
        if (opt && !t.adam_m.empty()) {
            CTX_CHECK(t.adam_m.size() == v.numel && t.adam_v.size() == v.numel,
                      "tensor '{}' has moments of the wrong size", v.name);
            std::copy(t.adam_m.begin(), t.adam_m.end(), adam_m.begin() + v.offset);
            std::copy(t.adam_v.begin(), t.adam_v.end(), adam_v.begin() + v.offset);
        }
    }
    model.scatter_full(params.data(), model.params());
    if (opt) {
        std::vector<float> m(model.layout().total()), v(model.layout().total());
        model.scatter_full_host(adam_m.data(), m.data());
        model.scatter_full_host(adam_v.data(), v.data());
        opt->scatter_moments(m, v);
        opt->set_step(state.step);
    }
}

}  // namespace ctx
