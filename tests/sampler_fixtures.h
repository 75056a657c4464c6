// Shared helpers for sampler and data tests: the real sampler plugins from the build tree,
// created with options built through a real Lua table (as a recipe would), and one-row calls.
#pragma once

#include <lua.hpp>

#include <cmath>

#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <variant>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "lua/options.h"
#include "lua/runtime.h"
#include "plugin/pe_plugin.h"
#include "plugin/registry.h"
#include "plugin/sampler_plugin.h"

namespace ctx::test {

inline PluginRegistry& sampler_plugins() {
    static PluginRegistry reg;
    static bool scanned = false;
    if (!scanned) {
        reg.scan_directory(std::string(CTX_TEST_BINARY_DIR) + "/plugins");
        scanned = true;
    }
    return reg;
}

using SamplerOption = std::variant<double, std::string>;

// "chunk", {{"alpha", 0.5}, {"boundary", std::string("mask")}} -> a SamplerPlugin, or the
// ctx::Error that validation (host schema or plugin create) raises.
inline std::unique_ptr<SamplerPlugin> make_sampler(
    const std::string& name, const std::map<std::string, SamplerOption>& opts = {},
    int32_t vocab_size = 259) {
    static lua::Runtime runtime;
    lua_State* L = runtime.state();
    lua_newtable(L);
    for (const auto& [k, v] : opts) {
        if (auto* d = std::get_if<double>(&v))
            lua_pushnumber(L, *d);
        else
            lua_pushstring(L, std::get<std::string>(v).c_str());
        lua_setfield(L, -2, k.c_str());
    }
    const LoadedPlugin& lib = sampler_plugins().get("sampler/" + name);
    try {
        lua::Options o = lua::Options::parse(L, -1, plugin_option_schema(*lib.descriptor),
                                             "sampler/" + name + " options", "test:");
        lua_pop(L, 1);
        return std::make_unique<SamplerPlugin>(lib, o, vocab_size, 1);
    } catch (...) {
        lua_settop(L, 0);
        throw;
    }
}

struct Row {
    std::vector<int32_t> tokens, targets;
    std::vector<float> positions, mask;
    std::vector<int64_t> source;  // the window index of each token (ABI 1.4), -1 if not given
};

// window 0..window_len tokens (window_len + 1 values); the row stream seeds rng the same way.
inline Row sample_row(RowSampler& s, const std::vector<int32_t>& window, int64_t row_len,
                      uint64_t seed) {
    Row r;
    r.tokens.assign(static_cast<size_t>(row_len), -1);
    r.targets.assign(static_cast<size_t>(row_len), -1);
    r.positions.assign(static_cast<size_t>(row_len), -1.0f);
    r.mask.assign(static_cast<size_t>(row_len), -1.0f);
    r.source.assign(static_cast<size_t>(row_len), -1);
    ctx_sample_row row{r.tokens.data(), r.positions.data(), r.targets.data(), r.mask.data(),
                       row_len, r.source.data()};
    auto st = Rng(seed).state().words;
    s.sample(window.data(), static_cast<int64_t>(window.size()) - 1, st.data(), row);
    return r;
}

// A window whose token at position p is distinct from its neighbours and readable in
// failures: (p * 7 + 3) % 256 (distinct for windows up to 256 tokens long).
inline std::vector<int32_t> test_window(int64_t window_len) {
    std::vector<int32_t> w(static_cast<size_t>(window_len + 1));
    for (int64_t p = 0; p <= window_len; ++p) w[static_cast<size_t>(p)] = static_cast<int32_t>((p * 7 + 3) % 256);
    return w;
}

// The message of the ctx::Error f throws ("" if it throws none).
template <typename F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// Upper 0.999 quantile of chi-square with df degrees of freedom (Wilson-Hilferty; within 1%
// of the exact value for df >= 10).
inline double chi2_q999(int df) {
    const double z = 3.090232306167813, k = 2.0 / (9.0 * df);
    const double c = 1.0 - k + z * std::sqrt(k);
    return df * c * c * c;
}

}  // namespace ctx::test
