// The host side of a PE plugin: one PluginInstance (plugin/plugin_instance.h: host API, errors
// as ctx::Error prefixed with the plugin's name), its hooks called through the vtable, and its
// hook specs translated into backend specs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/options.h"
#include "core/rng.h"
#include "ctx/plugin.h"
#include "plugin/plugin_instance.h"
#include "plugin/registry.h"

namespace ctx {

class PePlugin {
public:
    // Creates the instance: options must already be validated against plugin_option_schema().
    PePlugin(const LoadedPlugin& lib, const ctx_model_info& model, const Options& options,
             uint64_t seed);
    ~PePlugin();
    PePlugin(const PePlugin&) = delete;
    PePlugin& operator=(const PePlugin&) = delete;

    const std::string& name() const { return name_; }  // "pe/rope"
    const std::string& path() const { return lib_->path; }
    uint32_t hooks() const { return hooks_; }
    bool has(uint32_t hook) const { return (hooks_ & hook) != 0; }
    const std::vector<PeParamDecl>& params() const { return params_; }

    // Initialises the parameter tensors (same order as params()): the host fills ZEROS, NORMAL
    // and UNIFORM from rng; CTX_INIT_PLUGIN ones come from the plugin's init_params.
    void init_params(std::vector<ctx_tensor>& tensors, Rng& rng);

    ctx_input_spec input_spec();
    void input_forward(const std::vector<ctx_tensor>& params, const float* positions,
                       int64_t n_tokens, float* x);
    void input_backward(const std::vector<ctx_tensor>& params, std::vector<ctx_tensor>& grads,
                        const float* positions, int64_t n_tokens, const float* dx);
    // Backend form of the rotary spec for rows of seq_len tokens (inv_freq stays owned by the
    // plugin instance and is valid until the next call).
    RotarySpec rotary_spec(int64_t seq_len);
    // Validated: known kind, parameter indices in range with the shapes the kind reads ((n_head)
    // for learnable slopes and KERPLE r1, r2; (n_head, num_buckets) for the T5 table), and for
    // CTX_BIAS_GENERIC the ABI 1.1 slots (refused, naming the plugin's ABI, when it lacks them).
    ctx_bias_spec bias_spec(int64_t seq_len);

    // The generic bias (CTX_BIAS_GENERIC, ABI 1.1), one head per call; see ctx_pe_vtable.
    // has_generic_bias(): the plugin's vtable is large enough and both slots are non-NULL.
    bool has_generic_bias() const;
    void bias_forward(const std::vector<ctx_tensor>& params, int32_t head, const float* distance,
                      const float* query_pos, int64_t n, float* bias);
    void bias_backward(const std::vector<ctx_tensor>& params, std::vector<ctx_tensor>& grads,
                       int32_t head, const float* distance, const float* query_pos, int64_t n,
                       const float* dbias);

    // Lt -> Le. Returns the parameter declarations after the call (shapes may have changed);
    // then the caller allocates new tensors and calls extend_params.
    const std::vector<PeParamDecl>& extend(int64_t old_len, int64_t new_len);
    void extend_params(const std::vector<ctx_tensor>& old_params,
                       std::vector<ctx_tensor>& new_params);
    void after_update(std::vector<ctx_tensor>& params);
    // The plugin has an after_update hook (callers skip reading its parameters back otherwise).
    bool has_after_update() const;

    std::vector<uint8_t> save_state();
    void load_state(const std::vector<uint8_t>& state);

private:
    const LoadedPlugin* lib_;
    const ctx_pe_vtable* vt_;
    std::string name_;
    ctx_model_info model_{};
    uint32_t hooks_ = 0;
    std::vector<PeParamDecl> params_;  // filled by create (so declared before instance_)
    PluginInstance instance_;
};

}  // namespace ctx
