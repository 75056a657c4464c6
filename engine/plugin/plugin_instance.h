// What every plugin host shares (PE, sampler and eval hosts): the ctx_host_api a plugin's
// callbacks reach (logging, options, parameter registration, RNG), and one created instance:
// create() from validated options, a failed call turned into ctx::Error prefixed with the
// plugin's name, destroy() exactly once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/options.h"
#include "core/rng.h"
#include "ctx/plugin.h"
#include "plugin/registry.h"

namespace ctx {

// A parameter a plugin declared through register_param.
struct PeParamDecl {
    std::string name;  // as the plugin named it ("wpe"); the model stores it as "pe.<name>"
    std::vector<int64_t> shape;
    int32_t init = CTX_INIT_ZEROS;
    float init_scale = 0, init_lo = 0, init_hi = 0;
    bool weight_decay = false;
};

// The option schema a plugin declared, in the form option readers (lua::Options::parse) take.
std::vector<OptSpec> plugin_option_schema(const ctx_plugin_descriptor& d);

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

// lib, after checking that it is of `kind` ("plugin pe/x is not <what>" otherwise).
const LoadedPlugin& require_kind(const LoadedPlugin& lib, int32_t kind, const char* what);

class PluginInstance {
public:
    // The plugin's create() with the host API and the options already bound in.
    using Create = std::function<ctx_status(const ctx_host_api* host, const ctx_options* options,
                                            void** instance, ctx_err* err)>;
    // options must already be validated against plugin_option_schema(). Parameters the plugin
    // registers during create go to `registering` (PE plugins; others have none). A failure
    // throws "<options.where()> <name>: <message>".
    PluginInstance(const LoadedPlugin& lib, const Options& options, uint64_t seed,
                   const Create& create, void (*destroy)(void*),
                   std::vector<PeParamDecl>* registering = nullptr);
    ~PluginInstance();
    PluginInstance(const PluginInstance&) = delete;
    PluginInstance& operator=(const PluginInstance&) = delete;

    void* get() const { return instance_; }
    const std::string& name() const { return name_; }  // "pe/rope"
    PluginHostContext& host() { return *host_; }
    // Throws "<name>: <call> failed (status N): <message>" unless status is CTX_OK.
    void check(ctx_status status, const char* call, const ctx_err& err) const;

private:
    std::string name_;
    std::unique_ptr<PluginHostContext> host_;
    void* instance_ = nullptr;
    void (*destroy_)(void*) = nullptr;
};

}  // namespace ctx
