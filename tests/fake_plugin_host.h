// The fake ctx_host_api shared by the PE plugin tests (test_plugin_pe.cpp, test_plugin_pe_bias.cpp,
// test_plugin_pe_rope.cpp): options served from a std::map and checked against the plugin's
// declared options, register_param recorded, log lines kept, a splitmix64 rng; plus Instance, one
// plugin instance created through the vtable and destroyed at scope exit. Header-only; uses only
// ctx/plugin.h, plugin/registry.h, GoogleTest and the standard library.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "plugin/registry.h"

namespace ctx::test_host {

// ---------------------------------------------------------------- fake host
using OptValue = std::variant<double, int64_t, bool, std::string, std::vector<double>>;
using OptMap = std::map<std::string, OptValue>;

struct RecordedParam {
    std::string name;
    ctx_param_desc desc{};  // desc.name points at `name`
};

struct FakeHost {
    const ctx_plugin_descriptor* plugin = nullptr;
    OptMap options;
    bool registering = false;
    std::vector<RecordedParam> params;
    int registered = 0;  // register_param calls, accepted or not
    std::vector<std::pair<int32_t, std::string>> logs;
    std::vector<std::string> undeclared_reads;  // keys a plugin read that it did not declare
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    ctx_host_api api{};

    explicit FakeHost(const ctx_plugin_descriptor* d) : plugin(d) {
        api.struct_size = sizeof(ctx_host_api);
        api.abi_major = CTX_PLUGIN_ABI_MAJOR;
        api.abi_minor = CTX_PLUGIN_ABI_MINOR;
        api.host = this;
        api.log = &FakeHost::log;
        api.opt_has = &FakeHost::opt_has;
        api.opt_number = &FakeHost::opt_number;
        api.opt_integer = &FakeHost::opt_integer;
        api.opt_bool = &FakeHost::opt_bool;
        api.opt_string = &FakeHost::opt_string;
        api.opt_number_list = &FakeHost::opt_number_list;
        api.register_param = &FakeHost::register_param;
        api.rng_u64 = &FakeHost::rng_u64;
    }
    const ctx_options* opts() const { return reinterpret_cast<const ctx_options*>(&options); }

    // What the real host does before create(): every key declared, with a matching type.
    std::string validate_options() const {
        for (const auto& [key, value] : options) {
            const ctx_option_desc* d = declared(key);
            if (!d) return "unknown option '" + key + "'";
            const bool ok = (d->type == CTX_OPT_NUMBER &&
                             (std::holds_alternative<double>(value) ||
                              std::holds_alternative<int64_t>(value))) ||
                            (d->type == CTX_OPT_INTEGER && std::holds_alternative<int64_t>(value)) ||
                            (d->type == CTX_OPT_BOOL && std::holds_alternative<bool>(value)) ||
                            (d->type == CTX_OPT_STRING && std::holds_alternative<std::string>(value)) ||
                            (d->type == CTX_OPT_NUMBER_LIST &&
                             std::holds_alternative<std::vector<double>>(value));
            if (!ok) return "option '" + key + "' has the wrong type";
        }
        return "";
    }
    const ctx_option_desc* declared(const std::string& key) const {
        for (int32_t i = 0; i < plugin->n_options; ++i)
            if (key == plugin->options[i].name) return &plugin->options[i];
        return nullptr;
    }
    const RecordedParam* param(const std::string& name) const {
        for (const auto& p : params)
            if (p.name == name) return &p;
        return nullptr;
    }

    static FakeHost& self(void* h) { return *static_cast<FakeHost*>(h); }
    static const OptValue* find(void* h, const ctx_options* o, const char* key) {
        FakeHost& s = self(h);
        EXPECT_EQ(reinterpret_cast<const OptMap*>(o), &s.options);
        if (!s.declared(key)) s.undeclared_reads.push_back(key);
        auto it = s.options.find(key);
        return it == s.options.end() ? nullptr : &it->second;
    }
    static void log(void* h, int32_t level, const char* message) {
        self(h).logs.emplace_back(level, message);
    }
    static int32_t opt_has(void* h, const ctx_options* o, const char* key) {
        return find(h, o, key) != nullptr;
    }
    static double opt_number(void* h, const ctx_options* o, const char* key, double dflt) {
        const OptValue* v = find(h, o, key);
        if (!v) return dflt;
        if (auto* i = std::get_if<int64_t>(v)) return static_cast<double>(*i);
        return std::get<double>(*v);
    }
    static int64_t opt_integer(void* h, const ctx_options* o, const char* key, int64_t dflt) {
        const OptValue* v = find(h, o, key);
        return v ? std::get<int64_t>(*v) : dflt;
    }
    static int32_t opt_bool(void* h, const ctx_options* o, const char* key, int32_t dflt) {
        const OptValue* v = find(h, o, key);
        return v ? std::get<bool>(*v) : dflt;
    }
    static const char* opt_string(void* h, const ctx_options* o, const char* key,
                                  const char* dflt) {
        const OptValue* v = find(h, o, key);
        return v ? std::get<std::string>(*v).c_str() : dflt;
    }
    static int64_t opt_number_list(void* h, const ctx_options* o, const char* key, double* out,
                                   int64_t cap) {
        const OptValue* v = find(h, o, key);
        if (!v) return -1;
        const auto& list = std::get<std::vector<double>>(*v);
        for (int64_t i = 0; i < cap && i < static_cast<int64_t>(list.size()); ++i) out[i] = list[i];
        return static_cast<int64_t>(list.size());
    }
    static int32_t register_param(void* h, const ctx_param_desc* d, ctx_err* err) {
        FakeHost& s = self(h);
        ++s.registered;
        if (!s.registering) {
            ctx_err_set(err, "register_param outside create()/extend()");
            return -1;
        }
        EXPECT_GE(d->struct_size, sizeof(ctx_param_desc));
        RecordedParam p;
        p.name = d->name;
        p.desc = *d;
        for (size_t i = 0; i < s.params.size(); ++i) {
            if (s.params[i].name == p.name) {  // re-declared by extend(): new shape
                s.params[i] = p;
                s.params[i].desc.name = s.params[i].name.c_str();
                return static_cast<int32_t>(i);
            }
        }
        s.params.push_back(p);
        for (auto& q : s.params) q.desc.name = q.name.c_str();
        return static_cast<int32_t>(s.params.size() - 1);
    }
    static uint64_t rng_u64(void* h) {  // splitmix64
        uint64_t z = (self(h).rng += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
};

inline ctx_model_info model_info(int32_t n_head, int32_t head_dim, int32_t context_length = 1024,
                          int32_t d_model = 0) {
    ctx_model_info m{};
    m.struct_size = sizeof m;
    m.n_head = n_head;
    m.head_dim = head_dim;
    m.d_model = d_model > 0 ? d_model : n_head * head_dim;
    m.n_layer = 2;
    m.vocab_size = 50257;
    m.context_length = context_length;
    return m;
}

// One plugin instance created through the vtable, destroyed at scope exit.
struct Instance {
    const ctx_pe_vtable* vt = nullptr;
    FakeHost host;
    void* inst = nullptr;
    ctx_status status = CTX_ERR_INTERNAL;
    ctx_err err{};

    Instance(const ctx::LoadedPlugin& lib, const ctx_model_info& model, OptMap options)
        : vt(static_cast<const ctx_pe_vtable*>(lib.descriptor->vtable)), host(lib.descriptor) {
        host.options = std::move(options);
        const std::string invalid = host.validate_options();
        EXPECT_EQ(invalid, "") << "the test passed options the plugin does not declare";
        host.registering = true;
        status = vt->create(&host.api, &model, host.opts(), &inst, &err);
        host.registering = false;
        EXPECT_TRUE(host.undeclared_reads.empty())
            << "plugin read undeclared option " << host.undeclared_reads.front();
        if (status != CTX_OK) {
            EXPECT_EQ(inst, nullptr);
        }
    }
    ~Instance() {
        if (inst) vt->destroy(inst);
    }
    std::string message() const { return err.message; }

    ctx_rotary_spec rotary(int64_t seq_len) {
        ctx_rotary_spec s{};
        s.struct_size = sizeof s;
        ctx_err e{};
        EXPECT_EQ(vt->rotary_spec(inst, seq_len, &s, &e), CTX_OK) << e.message;
        return s;
    }
    ctx_bias_spec bias(int64_t seq_len) {
        ctx_bias_spec s{};
        s.struct_size = sizeof s;
        s.param_a = s.param_b = 7;  // the plugin must overwrite them
        s.num_buckets = s.max_distance = -5;
        ctx_err e{};
        EXPECT_EQ(vt->bias_spec(inst, seq_len, &s, &e), CTX_OK) << e.message;
        return s;
    }
    ctx_status extend(int64_t old_len, int64_t new_len) {
        err = ctx_err{};
        host.registering = true;
        const ctx_status st = vt->extend(&host.api, inst, old_len, new_len, &err);
        host.registering = false;
        return st;
    }
};

inline bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

inline void expect_rel_near(double got, double want, double rel, const std::string& what) {
    EXPECT_LE(std::fabs(got - want), rel * std::fabs(want)) << what << ": got " << got
                                                             << ", want " << want;
}

}  // namespace ctx::test_host
