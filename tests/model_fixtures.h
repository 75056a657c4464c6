// Shared helpers for model-level tests: the real plugins from the build tree, PE instances with
// options built through a real Lua table, tiny configs and batches.
#pragma once

#include <lua.hpp>

#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "backend/backend.h"
#include "data/token_source.h"
#include "lua/options.h"
#include "lua/runtime.h"
#include "model/decoder.h"
#include "plugin/pe_plugin.h"
#include "plugin/registry.h"

namespace ctx::test {

inline PluginRegistry& plugins() {
    static PluginRegistry reg;
    static bool scanned = false;
    if (!scanned) {
        reg.scan_directory(std::string(CTX_TEST_BINARY_DIR) + "/plugins");
        scanned = true;
    }
    return reg;
}

inline Backend& cpu() {
    static std::unique_ptr<Backend> be = make_cpu_backend(0);
    return *be;
}

using OptionValue = std::variant<double, std::string, bool>;

// Builds PE options the way a recipe would: a Lua table checked against the plugin's schema.
inline std::unique_ptr<PePlugin> make_pe(const std::string& name, const ModelConfig& c,
                                         const std::map<std::string, OptionValue>& opts = {},
                                         uint64_t seed = 1) {
    if (name == "none") return nullptr;
    static lua::Runtime runtime;
    lua_State* L = runtime.state();
    lua_newtable(L);
    for (const auto& [k, v] : opts) {
        if (auto* d = std::get_if<double>(&v)) {
            if (*d == static_cast<double>(static_cast<int64_t>(*d)))
                lua_pushinteger(L, static_cast<lua_Integer>(*d));
            else
                lua_pushnumber(L, *d);
        } else if (auto* s = std::get_if<std::string>(&v)) {
            lua_pushstring(L, s->c_str());
        } else {
            lua_pushboolean(L, std::get<bool>(v));
        }
        lua_setfield(L, -2, k.c_str());
    }
    const LoadedPlugin& lib = plugins().get("pe/" + name);
    lua::Options o = lua::Options::parse(L, -1, plugin_option_schema(*lib.descriptor),
                                         "pe/" + name + " options", "test:");
    lua_pop(L, 1);
    ctx_model_info info{sizeof(ctx_model_info), c.d_model, c.n_head, c.head_dim(),
                        c.n_layer, c.vocab_size, c.context_length};
    return std::make_unique<PePlugin>(lib, info, o, seed);
}

inline ModelConfig tiny_config() {
    ModelConfig c;
    c.vocab_size = 13;
    c.d_model = 16;
    c.n_head = 2;
    c.n_layer = 2;
    c.ffn_hidden = 24;
    c.context_length = 12;
    c.init_std = 0.3f;  // large enough that gradients are far from zero
    return c;
}

// Two rows of six tokens with fractional, non-contiguous original positions and a partial mask.
inline BatchBuffers tiny_batch(int vocab) {
    BatchBuffers b;
    b.resize(2, 6);
    const float pos[12] = {0, 1.5f, 2, 4.25f, 7, 9, 3, 4, 5, 6, 10, 11};
    for (int i = 0; i < 12; ++i) {
        b.tokens[i] = (i * 7 + 3) % vocab;
        b.targets[i] = (i * 5 + 1) % vocab;
        b.positions[i] = pos[i];
        b.mask[i] = (i == 4 || i == 8) ? 0.0f : 1.0f;
    }
    return b;
}

}  // namespace ctx::test
