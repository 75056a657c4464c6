#include "plugin/plugin_instance.h"

#include <spdlog/spdlog.h>

#include "core/error.h"

namespace ctx {
namespace {

OptType opt_type_of(int32_t t, const char* plugin, const char* name) {
    switch (t) {
        case CTX_OPT_NUMBER: return OptType::Number;
        case CTX_OPT_INTEGER: return OptType::Integer;
        case CTX_OPT_BOOL: return OptType::Bool;
        case CTX_OPT_STRING: return OptType::String;
        case CTX_OPT_NUMBER_LIST: return OptType::NumberList;
        default: fail("plugin {} declares option '{}' with unknown type {}", plugin, name, t);
    }
}

const Options& opts_of(const ctx_options* o) {
    return *reinterpret_cast<const Options*>(o);
}

// ---- ctx_host_api callbacks. They run inside plugin code, so nothing may throw out of them.
void host_log(void* host, int32_t level, const char* message) {
    auto* h = static_cast<PluginHostContext*>(host);
    const char* msg = message ? message : "";
    switch (level) {
        case CTX_LOG_DEBUG: spdlog::debug("[{}] {}", h->plugin_name, msg); break;
        case CTX_LOG_WARN: spdlog::warn("[{}] {}", h->plugin_name, msg); break;
        case CTX_LOG_ERROR: spdlog::error("[{}] {}", h->plugin_name, msg); break;
        default: spdlog::info("[{}] {}", h->plugin_name, msg); break;
    }
}

int32_t host_opt_has(void*, const ctx_options* o, const char* key) {
    return o && key && opts_of(o).has(key) ? 1 : 0;
}

double host_opt_number(void*, const ctx_options* o, const char* key, double dflt) {
    try {
        return o && key ? opts_of(o).number(key, dflt) : dflt;
    } catch (...) {
        return dflt;
    }
}

int64_t host_opt_integer(void*, const ctx_options* o, const char* key, int64_t dflt) {
    try {
        return o && key ? opts_of(o).integer(key, dflt) : dflt;
    } catch (...) {
        return dflt;
    }
}

int32_t host_opt_bool(void*, const ctx_options* o, const char* key, int32_t dflt) {
    try {
        return o && key ? (opts_of(o).boolean(key, dflt != 0) ? 1 : 0) : dflt;
    } catch (...) {
        return dflt;
    }
}

const char* host_opt_string(void* host, const ctx_options* o, const char* key,
                            const char* dflt) {
    // The returned pointer must outlive the call: keep the string in the host context.
    try {
        if (!o || !key || !opts_of(o).has(key)) return dflt;
        auto& kept = static_cast<PluginHostContext*>(host)->strings[key];
        kept = opts_of(o).string(key, "");
        return kept.c_str();
    } catch (...) {
        return dflt;
    }
}

int64_t host_opt_number_list(void*, const ctx_options* o, const char* key, double* out,
                             int64_t cap) {
    try {
        if (!o || !key || !opts_of(o).has(key)) return -1;
        const auto v = opts_of(o).number_list(key);
        for (int64_t i = 0; i < cap && i < static_cast<int64_t>(v.size()); ++i) out[i] = v[i];
        return static_cast<int64_t>(v.size());
    } catch (...) {
        return -1;
    }
}

int32_t host_register_param(void* host, const ctx_param_desc* d, ctx_err* err) {
    auto* h = static_cast<PluginHostContext*>(host);
    if (!h->registering) {
        ctx_err_set(err, "register_param may only be called inside create() or extend()");
        return -1;
    }
    if (!d || !d->name || !*d->name || d->ndim < 1 || d->ndim > 4) {
        ctx_err_set(err, "register_param: a parameter needs a name and 1..4 dimensions");
        return -1;
    }
    PeParamDecl p;
    p.name = d->name;
    for (int i = 0; i < d->ndim; ++i) {
        if (d->shape[i] <= 0) {
            ctx_err_set(err, "register_param: every dimension must be positive");
            return -1;
        }
        p.shape.push_back(d->shape[i]);
    }
    p.init = d->init;
    p.init_scale = d->init_scale;
    p.init_lo = d->init_lo;
    p.init_hi = d->init_hi;
    p.weight_decay = d->weight_decay != 0;
    auto& list = *h->registering;
    for (size_t i = 0; i < list.size(); ++i) {
        if (list[i].name == p.name) {  // re-declaration during extend(): replaces the shape
            list[i] = p;
            return static_cast<int32_t>(i);
        }
    }
    list.push_back(p);
    return static_cast<int32_t>(list.size() - 1);
}

uint64_t host_rng_u64(void* host) { return static_cast<PluginHostContext*>(host)->rng.next_u64(); }

}  // namespace

PluginHostContext::PluginHostContext(std::string name, uint64_t seed)
    : plugin_name(std::move(name)), rng(seed) {
    api.struct_size = sizeof(ctx_host_api);
    api.abi_major = CTX_PLUGIN_ABI_MAJOR;
    api.abi_minor = CTX_PLUGIN_ABI_MINOR;
    api.host = this;
    api.log = host_log;
    api.opt_has = host_opt_has;
    api.opt_number = host_opt_number;
    api.opt_integer = host_opt_integer;
    api.opt_bool = host_opt_bool;
    api.opt_string = host_opt_string;
    api.opt_number_list = host_opt_number_list;
    api.register_param = host_register_param;
    api.rng_u64 = host_rng_u64;
}

std::vector<OptSpec> plugin_option_schema(const ctx_plugin_descriptor& d) {
    std::vector<OptSpec> schema;
    for (int32_t i = 0; i < d.n_options; ++i) {
        const ctx_option_desc& o = d.options[i];
        schema.push_back({o.name, opt_type_of(o.type, d.name, o.name), false,
                          o.help ? o.help : ""});
    }
    return schema;
}

const LoadedPlugin& require_kind(const LoadedPlugin& lib, int32_t kind, const char* what) {
    CTX_CHECK(lib.kind() == kind, "plugin {} is not {}", lib.full_name, what);
    return lib;
}

PluginInstance::PluginInstance(const LoadedPlugin& lib, const Options& options, uint64_t seed,
                               const Create& create, void (*destroy)(void*),
                               std::vector<PeParamDecl>* registering)
    : name_(lib.full_name), host_(std::make_unique<PluginHostContext>(name_, seed)),
      destroy_(destroy) {
    ctx_err err{};
    host_->registering = registering;
    const ctx_status st = create(&host_->api, reinterpret_cast<const ctx_options*>(&options),
                                 &instance_, &err);
    host_->registering = nullptr;
    if (st != CTX_OK) {
        instance_ = nullptr;
        fail("{} {}: {}", options.where(), name_,
             err.message[0] ? err.message : "create() failed without a message");
    }
}

PluginInstance::~PluginInstance() {
    if (instance_ && destroy_) destroy_(instance_);
}

void PluginInstance::check(ctx_status status, const char* call, const ctx_err& err) const {
    if (status == CTX_OK) return;
    fail("{}: {} failed (status {}): {}", name_, call, static_cast<int>(status),
         err.message[0] ? err.message : "no message");
}

}  // namespace ctx
