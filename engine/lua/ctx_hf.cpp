// ctx module: HF model directories in and out (lua/ctx_hf.h).
#include "lua/ctx_hf.h"

#include <lua.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>

#include "core/error.h"
#include "data/tokenizer.h"
#include "lua/ctx_module.h"
#include "lua/ctx_tokenizer.h"
#include "lua/ctx_types.h"
#include "lua/lua_guard.h"
#include "lua/userdata.h"

namespace ctx {

using json = nlohmann::json;
namespace fs = std::filesystem;

ModelRef load_hf_model(lua_State* L, const std::string& dir, const DeviceRequest& device,
                       const std::string& where) {
    return model_from_hf(lua_detail::engine(L), dir, device, where);
}

std::string tokenizer_source_path(const Tokenizer& tok) {
    const std::string name = tok.name();
    if (name.rfind("bpe:", 0) != 0) return "";
    const size_t colon = name.find(':', 4);  // after the style
    return colon == std::string::npos ? "" : name.substr(colon + 1);
}

namespace {

using lua::guarded;
using lua::OptType;

// ctx.load_hf(dir [, {backend = "cpu"}]) -> model, tokenizer or nil
int l_load_hf(lua_State* L) {
    const std::string dir = luaL_checkstring(L, 1);
    const std::string where = lua::caller_where(L);
    const auto o = lua::Options::parse(L, 2, device_option_specs(), "ctx.load_hf", where);
    ModelRef h = load_hf_model(L, dir, parse_device_request(L, o), where);
    load_predictors_beside(L, *h, dir);
    std::error_code ec;
    const bool has_tok = fs::is_regular_file(fs::path(dir) / "tokenizer.json", ec) ||
                         (fs::is_regular_file(fs::path(dir) / "vocab.json", ec) &&
                          fs::is_regular_file(fs::path(dir) / "merges.txt", ec));
    TokenizerRef tok;
    if (has_tok) {
        tok = load_tokenizer(dir);
        if (tok->vocab_size() > h->model->config().vocab_size)
            spdlog::warn("{}: the tokenizer has {} tokens but the model's vocabulary is {}", dir,
                         tok->vocab_size(), h->model->config().vocab_size);
    } else {
        spdlog::info("{}: no tokenizer.json (or vocab.json + merges.txt): ctx.load_hf returns no "
                     "tokenizer", dir);
    }
    push_model(L, std::move(h));
    if (tok) *lua::new_userdata<TokenizerRef>(L, kTokenizerType) = std::move(tok);
    else lua_pushnil(L);
    return 2;
}

// ctx.save_hf(model, dir [, {tokenizer = ctx.Tokenizer or path}])
int l_save_hf(lua_State* L) {
    auto* ref = static_cast<ModelRef*>(luaL_checkudata(L, 1, kModelType));
    const std::string dir = luaL_checkstring(L, 2);
    const auto o = lua::Options::parse(
        L, 3,
        {{"tokenizer", OptType::Any, false,
          "the tokenizer whose files to copy: a ctx.Tokenizer or a directory / tokenizer.json"}},
        "ctx.save_hf", lua::caller_where(L));
    std::string source;
    TokenizerRef tok;
    if (const lua::LuaRef* t = o.ref("tokenizer")) {
        t->push();
        if (lua_type(L, -1) == LUA_TSTRING) {
            source = lua_tostring(L, -1);
            lua_pop(L, 1);
            tok = load_tokenizer(source);  // checks it loads, and gives the bos/eos ids
        } else {
            tok = test_tokenizer(L, -1);
            lua_pop(L, 1);
            if (!tok) o.fail_key("tokenizer", "expects a ctx.Tokenizer or a path");
            source = tokenizer_source_path(*tok);
            if (source.empty())
                o.fail_key("tokenizer", fmt::format("is {}, which has no HF tokenizer files",
                                                    tok->name()));
        }
    }
    // Every rank gathers (tensor parallelism), rank 0 writes; its error is raised on every rank.
    save_hf_model(*lua_detail::engine(L).comm, **ref, dir, source, tok.get());
    save_predictors_beside(L, **ref, dir);
    return 0;
}

}  // namespace

void register_hf_functions(lua_State* L) {
    const luaL_Reg fns[] = {{"load_hf", guarded<l_load_hf>},
                            {"save_hf", guarded<l_save_hf>},
                            {nullptr, nullptr}};
    luaL_setfuncs(L, fns, 0);
}

}  // namespace ctx
