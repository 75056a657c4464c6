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

namespace ctx {
namespace {

using lua::guarded;
using lua::OptType;
using json = nlohmann::json;

// Table / Any keys of the options argument shared by save and save_checkpoint.
const std::vector<lua::OptSpec> kSaveSchema = {
    {"model", OptType::Any, true, "the model (with its optimizer state)"},
    {"data", OptType::Any, false, "the training data stream whose position to save"},
    {"metadata", OptType::Table, false, "flat key = value pairs stored with the checkpoint"},
};

void save_state(lua_State* L, const std::string& path, const lua::Options& o) {
    EngineContext& engine = lua_detail::engine(L);
    ModelHandle& h = *lua::option_userdata<ModelRef>(L, o, "model", kModelType, "a ctx.model");
    json user = json::object();
    if (const lua::LuaRef* ref = o.ref("metadata")) {
        ref->push();
        lua_pushnil(L);
        while (lua_next(L, -2) != 0) {
            if (lua_type(L, -2) != LUA_TSTRING) o.fail_key("metadata", "must have string keys");
            const std::string k = lua_tostring(L, -2);
            if (lua_type(L, -1) == LUA_TNUMBER) user[k] = lua_tonumber(L, -1);
            else if (lua_type(L, -1) == LUA_TBOOLEAN) user[k] = lua_toboolean(L, -1) != 0;
            else if (lua_type(L, -1) == LUA_TSTRING) user[k] = lua_tostring(L, -1);
            else o.fail_key("metadata", fmt::format("value of '{}' must be a number, string or "
                                                    "boolean", k));
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    BatchSource* data = nullptr;
    if (o.has("data"))
        data = lua::option_userdata<DataRef>(L, o, "data", kDataType, "a ctx.data source")
                   ->stream.get();
    json meta = json::object();
    if (!user.empty()) meta["user"] = user;
    write_checkpoint(engine, path, model_checkpoint_state(engine, h, data, meta));
    save_predictors_beside(L, h, std::filesystem::path(path).parent_path().string());
}

// ctx.save(path, {model = m, data = stream, metadata = {...}})
int l_save(lua_State* L) {
    const std::string path = luaL_checkstring(L, 1);
    const auto o = lua::Options::parse(L, 2, kSaveSchema, "ctx.save", lua::caller_where(L));
    save_state(L, path, o);
    return 0;
}

// ctx.save_checkpoint(dir, {..., keep_last =, keep_every =}) -> path: dir/step-00000123.h5,
// then dir/latest points at it, then older step files beyond the retention are deleted.
int l_save_checkpoint(lua_State* L) {
    const std::string dir = luaL_checkstring(L, 1);
    std::vector<lua::OptSpec> schema = kSaveSchema;
    schema.push_back({"keep_last", OptType::Integer, false,
                      "keep the newest N step files of dir (default 0: all)"});
    schema.push_back({"keep_every", OptType::Integer, false,
                      "with keep_last, also keep every step that is a multiple of M"});
    const auto o = lua::Options::parse(L, 2, schema, "ctx.save_checkpoint", lua::caller_where(L));
    CheckpointRetention keep{o.integer("keep_last", 0), o.integer("keep_every", 0)};
    if (keep.keep_last < 0)
        o.fail_key("keep_last", fmt::format("must be >= 0, got {}", keep.keep_last));
    if (keep.keep_every < 0)
        o.fail_key("keep_every", fmt::format("must be >= 0, got {}", keep.keep_every));
    if (keep.keep_every > 0 && keep.keep_last == 0)
        o.fail_key("keep_every", "only applies with keep_last (without it every file is kept)");
    ModelHandle& h = *lua::option_userdata<ModelRef>(L, o, "model", kModelType, "a ctx.model");
    const int64_t step = h.optimizer ? h.optimizer->step() : 0;
    const std::string name = fmt::format("step-{:08d}.h5", step);
    save_state(L, dir + "/" + name, o);
    on_rank0(*lua_detail::engine(L).comm, [&] {
        set_latest_checkpoint(dir, name);
        const RetentionResult r = apply_checkpoint_retention(dir, keep);
        for (const std::string& f : r.failed)
            spdlog::warn("checkpoint retention: could not delete {}/{}", dir, f);
    });
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
    ModelRef h = model_from_checkpoint(engine, s, path, parse_device_request(L, o));
    load_predictors_beside(L, *h, std::filesystem::path(path).parent_path().string());
    if (o.has("data")) {
        DataRef d = lua::option_userdata<DataRef>(L, o, "data", kDataType, "a ctx.data source");
        d->stream->restore(s, engine.data_comm());
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
