#include "model/config_json.h"

#include <set>

#include "core/error.h"

namespace ctx {
namespace {

using json = nlohmann::json;

// Reads j[key] into out with the type of out; refuses wrong types. Missing keys keep defaults.
template <typename T>
void read(const json& j, const char* key, T& out, std::set<std::string>& seen) {
    seen.insert(key);
    auto it = j.find(key);
    if (it == j.end()) return;
    try {
        out = it->get<T>();
    } catch (const json::exception&) {
        fail("config key '{}' has the wrong type ({})", key, it->type_name());
    }
}

void refuse_unknown(const json& j, const std::set<std::string>& seen, const char* what) {
    CTX_CHECK(j.is_object(), "{} must be a JSON object", what);
    for (const auto& [k, v] : j.items())
        CTX_CHECK(seen.count(k), "{}: unknown key '{}' (written by a newer ctxengine?)", what, k);
}

}  // namespace

json model_config_to_json(const ModelConfig& c) {
    return json{{"vocab_size", c.vocab_size},
                {"d_model", c.d_model},
                {"n_layer", c.n_layer},
                {"n_head", c.n_head},
                {"context_length", c.context_length},
                {"ffn_hidden", c.ffn_hidden},
                {"norm_eps", c.norm_eps},
                {"init_std", c.init_std},
                {"activation", activation_name(c.activation)},
                {"parallel_residual", c.parallel_residual},
                {"tied_embeddings", c.tied_embeddings},
                {"embedding_layernorm", c.embedding_layernorm},
                {"attention_bias", c.attention_bias},
                {"mlp_bias", c.mlp_bias},
                {"norm_bias", c.norm_bias}};
}

ModelConfig model_config_from_json(const json& j) {
    ModelConfig c;
    std::set<std::string> seen;
    std::string act = activation_name(c.activation);
    read(j, "vocab_size", c.vocab_size, seen);
    read(j, "d_model", c.d_model, seen);
    read(j, "n_layer", c.n_layer, seen);
    read(j, "n_head", c.n_head, seen);
    read(j, "context_length", c.context_length, seen);
    read(j, "ffn_hidden", c.ffn_hidden, seen);
    read(j, "norm_eps", c.norm_eps, seen);
    read(j, "init_std", c.init_std, seen);
    read(j, "activation", act, seen);
    read(j, "parallel_residual", c.parallel_residual, seen);
    read(j, "tied_embeddings", c.tied_embeddings, seen);
    read(j, "embedding_layernorm", c.embedding_layernorm, seen);
    read(j, "attention_bias", c.attention_bias, seen);
    read(j, "mlp_bias", c.mlp_bias, seen);
    read(j, "norm_bias", c.norm_bias, seen);
    refuse_unknown(j, seen, "model config");
    c.activation = activation_from_name(act);
    c.validate();
    return c;
}

json optimizer_config_to_json(const OptimizerConfig& c) {
    return json{{"lr", c.lr},
                {"min_lr", c.min_lr},
                {"warmup_steps", c.warmup_steps},
                {"total_steps", c.total_steps},
                {"schedule_start", c.schedule_start},
                {"schedule", lr_schedule_name(c.schedule)},
                {"beta1", c.beta1},
                {"beta2", c.beta2},
                {"eps", c.eps},
                {"weight_decay", c.weight_decay},
                {"grad_clip", c.grad_clip}};
}

OptimizerConfig optimizer_config_from_json(const json& j) {
    OptimizerConfig c;
    std::set<std::string> seen;
    std::string schedule = lr_schedule_name(c.schedule);
    read(j, "lr", c.lr, seen);
    read(j, "min_lr", c.min_lr, seen);
    read(j, "warmup_steps", c.warmup_steps, seen);
    read(j, "total_steps", c.total_steps, seen);
    read(j, "schedule_start", c.schedule_start, seen);
    read(j, "schedule", schedule, seen);
    read(j, "beta1", c.beta1, seen);
    read(j, "beta2", c.beta2, seen);
    read(j, "eps", c.eps, seen);
    read(j, "weight_decay", c.weight_decay, seen);
    read(j, "grad_clip", c.grad_clip, seen);
    refuse_unknown(j, seen, "optimizer config");
    c.schedule = lr_schedule_from_name(schedule);
    c.validate();
    return c;
}

}  // namespace ctx
