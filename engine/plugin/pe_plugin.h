// The host side of a PE plugin: implements ctx_host_api for it, turns its ctx_status errors into
// ctx::Error (prefixed with the plugin's name), and translates its hook specs into backend specs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/rng.h"
#include "ctx/plugin.h"
#include "lua/options.h"
#include "plugin/registry.h"

namespace ctx {

struct PeParamDecl {
    std::string name;  // as the plugin named it ("wpe"); the model stores it as "pe.<name>"
    std::vector<int64_t> shape;
    int32_t init = CTX_INIT_ZEROS;
    float init_scale = 0, init_lo = 0, init_hi = 0;
    bool weight_decay = false;
};

// The option schema a plugin declared, in the form lua::Options::parse takes.
std::vector<lua::OptSpec> plugin_option_schema(const ctx_plugin_descriptor& d);

// Host services shared by every plugin instance: logging, options, parameter registration, RNG.
// The address is the `void* host` of ctx_host_api, so it must not move while the plugin lives.
struct PluginHostContext {
    std::string plugin_name;
    Rng rng;
    std::vector<PeParamDecl>* registering = nullptr;  // non-null only during create / extend
    std::map<std::string, std::string> strings;        // opt_string results, kept alive here
    ctx_host_api api{};
    explicit PluginHostContext(std::string name, uint64_t seed);
};

class PePlugin {
public:
    // Creates the instance: options must already be validated against plugin_option_schema().
    PePlugin(const LoadedPlugin& lib, const ctx_model_info& model, const lua::Options& options,
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

    std::vector<uint8_t> save_state();
    void load_state(const std::vector<uint8_t>& state);

private:
    void check(ctx_status status, const char* call, const ctx_err& err) const;

    const LoadedPlugin* lib_;
    const ctx_pe_vtable* vt_;
    std::string name_;
    ctx_model_info model_{};
    uint32_t hooks_ = 0;
    std::unique_ptr<PluginHostContext> host_;
    void* instance_ = nullptr;
    std::vector<PeParamDecl> params_;
};

}  // namespace ctx
