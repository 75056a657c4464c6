#include "plugin/pe_plugin.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "core/error.h"

namespace ctx {

PePlugin::PePlugin(const LoadedPlugin& lib, const ctx_model_info& model, const Options& options,
                   uint64_t seed)
    : lib_(&lib), vt_(static_cast<const ctx_pe_vtable*>(lib.descriptor->vtable)),
      name_(lib.full_name), model_(model), hooks_(vt_->hooks),
      instance_(require_kind(lib, CTX_PLUGIN_PE, "a positional encoding"), options, seed,
                [&](const ctx_host_api* host, const ctx_options* o, void** out, ctx_err* err) {
                    return vt_->create(host, &model, o, out, err);
                },
                vt_->destroy, &params_) {}

PePlugin::~PePlugin() = default;

void PePlugin::init_params(std::vector<ctx_tensor>& tensors, Rng& rng) {
    CTX_CHECK(tensors.size() == params_.size(), "{}: expected {} parameter tensors, got {}",
              name_, params_.size(), tensors.size());
    bool plugin_init = false;
    for (size_t i = 0; i < params_.size(); ++i) {
        const PeParamDecl& p = params_[i];
        size_t n = 1;
        for (int64_t d : p.shape) n *= static_cast<size_t>(d);
        float* x = tensors[i].data;
        switch (p.init) {
            case CTX_INIT_ZEROS: std::memset(x, 0, n * sizeof(float)); break;
            case CTX_INIT_NORMAL:
                for (size_t k = 0; k < n; ++k) x[k] = static_cast<float>(rng.normal() * p.init_scale);
                break;
            case CTX_INIT_UNIFORM:
                for (size_t k = 0; k < n; ++k)
                    x[k] = static_cast<float>(rng.uniform(p.init_lo, p.init_hi));
                break;
            case CTX_INIT_PLUGIN: plugin_init = true; break;
            default: fail("{}: parameter '{}' has unknown init kind {}", name_, p.name, p.init);
        }
    }
    if (plugin_init) {
        CTX_CHECK(vt_->init_params != nullptr,
                  "{}: a parameter asks for plugin initialisation but init_params is NULL", name_);
        ctx_err err{};
        instance_.check(vt_->init_params(instance_.get(), tensors.data(),
                                         static_cast<int32_t>(tensors.size()), &err),
                        "init_params", err);
    }
}

ctx_input_spec PePlugin::input_spec() {
    ctx_input_spec spec{};
    spec.struct_size = sizeof(spec);
    spec.table_param = -1;
    ctx_err err{};
    instance_.check(vt_->input_spec(instance_.get(), &spec, &err), "input_spec", err);
    if (spec.kind == CTX_INPUT_TABLE) {
        CTX_CHECK(spec.table_param >= 0 && spec.table_param < static_cast<int32_t>(params_.size()),
                  "{}: input table parameter index {} is out of range", name_, spec.table_param);
        CTX_CHECK(params_[spec.table_param].shape.size() == 2,
                  "{}: the input table must be a (rows, d_model) matrix", name_);
    } else {
        CTX_CHECK(spec.kind == CTX_INPUT_GENERIC && vt_->input_forward != nullptr,
                  "{}: input hook kind {} is unknown or input_forward is NULL", name_, spec.kind);
    }
    return spec;
}

void PePlugin::input_forward(const std::vector<ctx_tensor>& params, const float* positions,
                             int64_t n_tokens, float* x) {
    ctx_err err{};
    instance_.check(
        vt_->input_forward(instance_.get(), params.data(), static_cast<int32_t>(params.size()),
                           positions, n_tokens, x, &err),
        "input_forward", err);
}

void PePlugin::input_backward(const std::vector<ctx_tensor>& params, std::vector<ctx_tensor>& grads,
                              const float* positions, int64_t n_tokens, const float* dx) {
    if (!vt_->input_backward) return;
    ctx_err err{};
    instance_.check(
        vt_->input_backward(instance_.get(), params.data(), grads.data(),
                            static_cast<int32_t>(params.size()), positions, n_tokens, dx, &err),
        "input_backward", err);
}

RotarySpec PePlugin::rotary_spec(int64_t seq_len) {
    ctx_rotary_spec s{};
    s.struct_size = sizeof(s);
    s.position_scale = 1.0f;
    s.attention_factor = 1.0f;
    s.amp_scale_base = 512.0f;
    ctx_err err{};
    instance_.check(vt_->rotary_spec(instance_.get(), seq_len, &s, &err), "rotary_spec", err);
    CTX_CHECK(s.rotary_dims > 0 && s.rotary_dims % 2 == 0 && s.inv_freq != nullptr,
              "{}: rotary_spec returned rotary_dims {} (must be even and positive) or no "
              "frequencies", name_, s.rotary_dims);
    CTX_CHECK(s.layout == CTX_ROTARY_HALF || s.layout == CTX_ROTARY_INTERLEAVED,
              "{}: unknown rotary layout {}", name_, s.layout);
    RotarySpec r;
    r.rotary_dims = s.rotary_dims;
    r.layout = s.layout == CTX_ROTARY_HALF ? RotaryLayout::Half : RotaryLayout::Interleaved;
    r.inv_freq = s.inv_freq;
    r.position_scale = s.position_scale;
    r.attention_factor = s.attention_factor;
    r.amp_base = s.amp_base;
    r.amp_scale_base = s.amp_scale_base;
    return r;
}

ctx_bias_spec PePlugin::bias_spec(int64_t seq_len) {
    ctx_bias_spec s{};
    s.struct_size = sizeof(s);
    s.param_a = s.param_b = -1;
    s.num_buckets = 32;
    s.max_distance = 128;
    ctx_err err{};
    instance_.check(vt_->bias_spec(instance_.get(), seq_len, &s, &err), "bias_spec", err);
    const int32_t n = static_cast<int32_t>(params_.size());
    CTX_CHECK(s.kind >= CTX_BIAS_NONE && s.kind <= CTX_BIAS_GENERIC, "{}: unknown bias kind {}",
              name_, s.kind);
    CTX_CHECK(s.param_a < n && s.param_b < n, "{}: bias parameter index out of range", name_);
    // The attention op reads (n_head) or (n_head, num_buckets) floats from the named parameters.
    auto numel = [&](int32_t i) {
        int64_t k = 1;
        for (int64_t d : params_[i].shape) k *= d;
        return k;
    };
    auto per_head = [&](int32_t i, const char* what) {
        CTX_CHECK(i >= 0, "{}: bias kind {} needs a parameter for {}", name_, s.kind, what);
        CTX_CHECK(numel(i) == model_.n_head, "{}: bias parameter '{}' ({}) must have n_head = {} "
                  "entries, it has {}", name_, params_[i].name, what, model_.n_head, numel(i));
    };
    switch (s.kind) {
        case CTX_BIAS_LINEAR:
            CTX_CHECK(s.slopes != nullptr || s.param_a >= 0,
                      "{}: a linear bias needs fixed slopes or a slope parameter", name_);
            if (s.param_a >= 0) per_head(s.param_a, "slopes");
            break;
        case CTX_BIAS_KERPLE_LOG:
        case CTX_BIAS_KERPLE_POWER:
            per_head(s.param_a, "r1");
            per_head(s.param_b, "r2");
            break;
        case CTX_BIAS_T5:
            CTX_CHECK(s.param_a >= 0, "{}: a T5 bias needs a table parameter", name_);
            CTX_CHECK(s.num_buckets >= 2 && s.max_distance > s.num_buckets / 2,
                      "{}: T5 num_buckets {} must be >= 2 and max_distance {} > num_buckets / 2",
                      name_, s.num_buckets, s.max_distance);
            CTX_CHECK(numel(s.param_a) == int64_t(model_.n_head) * s.num_buckets,
                      "{}: the T5 table '{}' must have n_head x num_buckets = {} x {} entries, it "
                      "has {}", name_, params_[s.param_a].name, model_.n_head, s.num_buckets,
                      numel(s.param_a));
            break;
        case CTX_BIAS_GENERIC:
            CTX_CHECK(has_generic_bias(),
                      "{} asks for the generic bias (CTX_BIAS_GENERIC) but does not provide "
                      "bias_forward and bias_backward: those vtable slots exist from plugin ABI "
                      "{}.1 (this ctxengine supports {}.{}; the plugin was built for {}.{} and its "
                      "vtable is {} bytes, {} are needed)", name_, CTX_PLUGIN_ABI_MAJOR,
                      CTX_PLUGIN_ABI_MAJOR, CTX_PLUGIN_ABI_MINOR, lib_->descriptor->abi_major,
                      lib_->descriptor->abi_minor, vt_->struct_size,
                      CTX_OFFSET_END(ctx_pe_vtable, bias_backward));
            break;
        default: break;
    }
    return s;
}

bool PePlugin::has_generic_bias() const {
    return vt_->struct_size >= CTX_OFFSET_END(ctx_pe_vtable, bias_backward) &&
           vt_->bias_forward != nullptr && vt_->bias_backward != nullptr;
}

void PePlugin::bias_forward(const std::vector<ctx_tensor>& params, int32_t head,
                            const float* distance, const float* query_pos, int64_t n, float* bias) {
    CTX_CHECK(has_generic_bias(), "{}: bias_forward is not provided", name_);
    ctx_err err{};
    instance_.check(
        vt_->bias_forward(instance_.get(), params.data(), static_cast<int32_t>(params.size()), head,
                          distance, query_pos, n, bias, &err),
        "bias_forward", err);
}

void PePlugin::bias_backward(const std::vector<ctx_tensor>& params, std::vector<ctx_tensor>& grads,
                             int32_t head, const float* distance, const float* query_pos, int64_t n,
                             const float* dbias) {
    CTX_CHECK(has_generic_bias(), "{}: bias_backward is not provided", name_);
    CTX_CHECK(grads.size() == params.size(), "{}: {} gradient tensors for {} parameters", name_,
              grads.size(), params.size());
    ctx_err err{};
    instance_.check(vt_->bias_backward(instance_.get(), params.data(), grads.data(),
                                       static_cast<int32_t>(params.size()), head, distance,
                                       query_pos, n, dbias, &err),
                    "bias_backward", err);
}

const std::vector<PeParamDecl>& PePlugin::extend(int64_t old_len, int64_t new_len) {
    CTX_CHECK(vt_->extend != nullptr, "{} does not support extend()", name_);
    ctx_err err{};
    PluginHostContext& host = instance_.host();
    host.registering = &params_;
    const ctx_status st = vt_->extend(&host.api, instance_.get(), old_len, new_len, &err);
    host.registering = nullptr;
    instance_.check(st, "extend", err);
    return params_;
}

void PePlugin::extend_params(const std::vector<ctx_tensor>& old_params,
                             std::vector<ctx_tensor>& new_params) {
    if (!vt_->extend_params) {
        // Unchanged shapes (RoPE, ALiBi: no parameters at all) need no filling: the model
        // copied the tensors already.
        bool same = old_params.size() == new_params.size();
        for (size_t i = 0; same && i < old_params.size(); ++i)
            same = old_params[i].ndim == new_params[i].ndim &&
                   std::equal(old_params[i].shape, old_params[i].shape + 4, new_params[i].shape);
        if (same) return;
        fail("{}: parameter shapes changed in extend() but extend_params is NULL", name_);
    }
    ctx_err err{};
    instance_.check(vt_->extend_params(instance_.get(), old_params.data(), new_params.data(),
                             static_cast<int32_t>(new_params.size()), &err),
          "extend_params", err);
}

bool PePlugin::has_after_update() const { return vt_->after_update != nullptr; }

void PePlugin::after_update(std::vector<ctx_tensor>& params) {
    if (!vt_->after_update) return;
    ctx_err err{};
    instance_.check(vt_->after_update(instance_.get(), params.data(),
                                      static_cast<int32_t>(params.size()), &err),
                    "after_update", err);
}

std::vector<uint8_t> PePlugin::save_state() {
    if (!vt_->save_state) return {};
    ctx_err err{};
    size_t size = 0;
    instance_.check(vt_->save_state(instance_.get(), nullptr, 0, &size, &err),
                    "save_state (size query)", err);
    std::vector<uint8_t> buf(size);
    if (size)
        instance_.check(vt_->save_state(instance_.get(), buf.data(), size, &size, &err),
                        "save_state", err);
    buf.resize(size);
    return buf;
}

void PePlugin::load_state(const std::vector<uint8_t>& state) {
    if (!vt_->load_state) {
        CTX_CHECK(state.empty(), "{}: checkpoint has plugin state but load_state is NULL", name_);
        return;
    }
    ctx_err err{};
    instance_.check(vt_->load_state(instance_.get(), state.data(), state.size(), &err),
                    "load_state", err);
}

}  // namespace ctx
