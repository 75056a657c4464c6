// ctx module: checkpoints. ctx.save / ctx.load, and run directories with a `latest` pointer.
// Saving is collective: every rank contributes its data-stream position, rank 0 writes, and a
// failure on rank 0 is broadcast so every rank raises the same error instead of hanging.
#include <lua.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/checkpoint.h"
#include "lua/ctx_module.h"
#include "lua/ctx_types.h"
#include "lua/lua_guard.h"
#include "lua/userdata.h"
#include "model/config_json.h"
#include "io/model_state.h"

namespace ctx {
namespace {

using lua::guarded;
using lua::OptType;
using json = nlohmann::json;

// Runs `what` on rank 0 and raises its error (if any) on every rank.
template <typename F>
void on_rank0(Comm& comm, F&& what) {
    std::string error;
    if (comm.rank() == 0) {
        try {
            what();
        } catch (const std::exception& e) {
            error = e.what();
        }
    }
    uint64_t len = error.size();
    comm.broadcast(&len, sizeof(len), 0);
    error.resize(len);
    if (len) comm.broadcast(error.data(), len, 0);
    if (!error.empty()) throw Error(error);
}

// Table / Any keys of the options argument shared by save and save_checkpoint.
const std::vector<lua::OptSpec> kSaveSchema = {
    {"model", OptType::Any, true, "the model (with its optimizer state)"},
    {"data", OptType::Any, false, "the training data stream whose position to save"},
    {"metadata", OptType::Table, false, "flat key = value pairs stored with the checkpoint"},
};

void save_state(lua_State* L, const std::string& path, const lua::Options& o) {
    EngineContext& engine = lua_detail::engine(L);
    ModelHandle& h = *lua::option_userdata<ModelRef>(L, o, "model", kModelType, "a ctx.model");
    TrainingState s;
    capture_model(*h.model, h.optimizer.get(), s);
    s.recipe_text = engine.recipe_text;
    s.pe_plugin = h.pe_name;
    s.pe_options_json = h.pe_options_json;
    if (h.model->pe()) s.pe_state = h.model->pe()->save_state();
    s.tokens_seen = h.tokens_seen;
    if (o.has("data")) {
        DataRef d = lua::option_userdata<DataRef>(L, o, "data", kDataType, "a ctx.data source");
        d->stream->save(s, *engine.comm);
    }
    json meta = {{"style", h.style}, {"trained_length", h.trained_length},
                 {"world_size", engine.comm->size()}};
    if (const lua::LuaRef* ref = o.ref("metadata")) {
        ref->push();
        lua_pushnil(L);
        while (lua_next(L, -2) != 0) {
            if (lua_type(L, -2) != LUA_TSTRING) o.fail_key("metadata", "must have string keys");
            const std::string k = lua_tostring(L, -2);
            if (lua_type(L, -1) == LUA_TNUMBER) meta["user"][k] = lua_tonumber(L, -1);
            else if (lua_type(L, -1) == LUA_TBOOLEAN) meta["user"][k] = lua_toboolean(L, -1) != 0;
            else if (lua_type(L, -1) == LUA_TSTRING) meta["user"][k] = lua_tostring(L, -1);
            else o.fail_key("metadata", fmt::format("value of '{}' must be a number, string or "
                                                    "boolean", k));
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    s.metadata_json = meta.dump();
    on_rank0(*engine.comm, [&] {
        const std::filesystem::path parent = std::filesystem::path(path).parent_path();
        if (!parent.empty()) std::filesystem::create_directories(parent);
        save_checkpoint(path, s);
        spdlog::info("saved checkpoint {} (step {}, {} tokens)", path, s.step, s.tokens_seen);
    });
}

// ctx.save(path, {model = m, data = stream, metadata = {...}})
int l_save(lua_State* L) {
    const std::string path = luaL_checkstring(L, 1);
    const auto o = lua::Options::parse(L, 2, kSaveSchema, "ctx.save", lua::caller_where(L));
    save_state(L, path, o);
    return 0;
}

// ctx.save_checkpoint(dir, {...}) -> path: dir/step-00000123.h5, then dir/latest points at it.
int l_save_checkpoint(lua_State* L) {
    const std::string dir = luaL_checkstring(L, 1);
    const auto o = lua::Options::parse(L, 2, kSaveSchema, "ctx.save_checkpoint",
                                       lua::caller_where(L));
    ModelHandle& h = *lua::option_userdata<ModelRef>(L, o, "model", kModelType, "a ctx.model");
    const int64_t step = h.optimizer ? h.optimizer->step() : 0;
    const std::string name = fmt::format("step-{:08d}.h5", step);
    save_state(L, dir + "/" + name, o);
    on_rank0(*lua_detail::engine(L).comm, [&] { set_latest_checkpoint(dir, name); });
    lua_pushstring(L, (dir + "/" + name).c_str());
    return 1;
}

// ctx.latest_checkpoint(dir) -> path or nil
int l_latest_checkpoint(lua_State* L) {
    const std::string path = latest_checkpoint(luaL_checkstring(L, 1));
    if (path.empty()) lua_pushnil(L);
    else lua_pushstring(L, path.c_str());
    return 1;
}

// ctx.load(path, {data = stream, backend = "cpu"}) -> model (optimizer state restored)
int l_load(lua_State* L) {
    const std::string path = luaL_checkstring(L, 1);
    const std::string where = lua::caller_where(L);
    std::vector<lua::OptSpec> schema = {
        {"data", OptType::Any, false, "a data stream to continue from the saved position"}};
    for (const lua::OptSpec& s : device_option_specs()) schema.push_back(s);
    const auto o = lua::Options::parse(L, 2, schema, "ctx.load", where);
    EngineContext& engine = lua_detail::engine(L);
    const TrainingState s = load_checkpoint(path);
    ModelConfig c;
    json meta;
    try {
        c = model_config_from_json(json::parse(s.model_config_json));
        meta = json::parse(s.metadata_json);
    } catch (const json::exception& e) {
        fail("{}: the model configuration is not valid JSON: {}", path, e.what());
    } catch (const Error& e) {
        fail("{}: {}", path, e.what());
    }
    const std::string style = meta.value("style", std::string("gpt2"));
    PeSpec none;
    none.plugin = "none";
    const PeSpec& spec = s.pe_plugin == "none" || s.pe_plugin.empty()
                             ? none
                             : pe_spec_from_json(L, s.pe_plugin, s.pe_options_json, where);
    ModelRef h = build_model(L, c, style, spec, 1, parse_device_request(L, o));
    h->trained_length = meta.value("trained_length", c.context_length);
    h->tokens_seen = s.tokens_seen;
    if (h->model->pe()) h->model->pe()->load_state(s.pe_state);
    if (!s.optimizer_config_json.empty()) {
        try {
            h->optimizer = std::make_unique<Optimizer>(
                *h->model, optimizer_config_from_json(json::parse(s.optimizer_config_json)));
        } catch (const json::exception& e) {
            fail("{}: the optimizer configuration is not valid JSON: {}", path, e.what());
        }
    }
    try {
        restore_model(*h->model, h->optimizer.get(), s);
    } catch (const Error& e) {
        fail("{}: {}", path, e.what());
    }
    if (o.has("data")) {
        DataRef d = lua::option_userdata<DataRef>(L, o, "data", kDataType, "a ctx.data source");
        d->stream->restore(s, *engine.comm);
    }
    if (engine.comm->rank() == 0)
        spdlog::info("loaded checkpoint {} (step {}, {} tokens, {})", path, s.step, s.tokens_seen,
                     h->pe_name);
    push_model(L, std::move(h));
    return 1;
}

}  // namespace

void register_checkpoint_functions(lua_State* L) {
    const luaL_Reg fns[] = {{"save", guarded<l_save>},
                            {"load", guarded<l_load>},
                            {"save_checkpoint", guarded<l_save_checkpoint>},
                            {"latest_checkpoint", guarded<l_latest_checkpoint>},
                            {nullptr, nullptr}};
    luaL_setfuncs(L, fns, 0);
}

}  // namespace ctx
