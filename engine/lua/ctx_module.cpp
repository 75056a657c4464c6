// ctx module: basics (version, rank, logging, plugins, PE specs) and in-memory data sources.
#include "lua/ctx_module.h"

#include <spdlog/spdlog.h>

#include "build_info.h"
#include "core/error.h"
#include "data/token_source.h"
#include "lua/ctx_hf.h"
#include "lua/ctx_tokenizer.h"
#include "lua/ctx_types.h"
#include "lua/lua_guard.h"
#include "lua/options.h"
#include "plugin/pe_plugin.h"

namespace ctx {

namespace lua_detail {

static const char* kEngineKey = "ctx.engine";

EngineContext& engine(lua_State* L) {
    lua_getfield(L, LUA_REGISTRYINDEX, kEngineKey);
    auto* e = static_cast<EngineContext*>(lua_touserdata(L, -1));
    lua_pop(L, 1);
    CTX_CHECK(e != nullptr, "internal: the ctx module has no engine context");
    return *e;
}

}  // namespace lua_detail

namespace {

using lua::guarded;
using lua::OptSpec;
using lua::OptType;

// print-like: tostring of every argument, joined by tabs.
std::string join_args(lua_State* L) {
    std::string out;
    const int n = lua_gettop(L);
    for (int i = 1; i <= n; ++i) {
        size_t len = 0;
        const char* s = luaL_tolstring(L, i, &len);
        if (i > 1) out += '\t';
        out.append(s, len);
        lua_pop(L, 1);
    }
    return out;
}

int l_log(lua_State* L) {
    spdlog::info("{}", join_args(L));
    return 0;
}

int l_warn(lua_State* L) {
    spdlog::warn("{}", join_args(L));
    return 0;
}

// ctx.cuda_devices() -> number of visible CUDA devices (0 without CUDA in the build or a GPU)
int l_cuda_devices(lua_State* L) {
    lua_pushinteger(L, cuda_device_count());
    return 1;
}

int l_rank(lua_State* L) {
    lua_pushinteger(L, lua_detail::engine(L).comm->rank());
    return 1;
}

int l_world_size(lua_State* L) {
    lua_pushinteger(L, lua_detail::engine(L).comm->size());
    return 1;
}

// ctx.parallel([{tp = N, cp = N, sequence_parallel = B}]) -> {world, dp, cp, tp, rank, dp_rank,
// cp_rank, tp_rank, sequence_parallel}:
// the process grid and this rank's coordinates (docs/PARALLEL.md). With a table, first sets the
// grid's shape, which is fixed once anything used it (a model, data, ctx.parallel()) or the
// command line gave --tp / --cp: asking for another shape then is an error.
int l_parallel(lua_State* L) {
    EngineContext& engine = lua_detail::engine(L);
    if (!lua_isnoneornil(L, 1)) {
        const lua::Options o = lua::Options::parse(
            L, 1, {{"tp", OptType::Integer, false, "tensor-parallel ranks per model"},
                   {"cp", OptType::Integer, false, "context-parallel ranks per row"},
                   {"sequence_parallel", OptType::Bool, false,
                    "models built from now on keep N/tp rows of the residual stream per rank"}},
            "ctx.parallel", lua::caller_where(L));
        GridShape want = engine.grid ? GridShape{engine.grid->tp(), engine.grid->cp()}
                                     : engine.grid_shape;
        want.tp = static_cast<int>(o.integer("tp", want.tp));
        want.cp = static_cast<int>(o.integer("cp", want.cp));
        const bool fixed = engine.grid || engine.grid_from_cli;
        const GridShape have = engine.grid ? GridShape{engine.grid->tp(), engine.grid->cp()}
                                           : engine.grid_shape;
        CTX_CHECK(!fixed || (want.tp == have.tp && want.cp == have.cp),
                  "ctx.parallel: asks for tp {} x cp {}, but the grid is already tp {} x cp {} "
                  "({}); call ctx.parallel{{...}} before anything uses the grid, and do not "
                  "also pass --tp / --cp", want.tp, want.cp, have.tp, have.cp,
                  engine.grid ? "it was used already" : "set by --tp / --cp");
        engine.grid_shape = want;
        if (o.has("sequence_parallel")) engine.sequence_parallel = o.boolean("sequence_parallel", false);
    }
    const ParallelGrid& g = engine.parallel();
    lua_createtable(L, 0, 9);
    lua_pushboolean(L, engine.sequence_parallel && g.tp() > 1);
    lua_setfield(L, -2, "sequence_parallel");
    const std::pair<const char*, int> fields[] = {
        {"world", g.world().size()}, {"dp", g.dp()},           {"cp", g.cp()},
        {"tp", g.tp()},              {"rank", g.world().rank()}, {"dp_rank", g.dp_rank()},
        {"cp_rank", g.cp_rank()},    {"tp_rank", g.tp_rank()}};
    for (const auto& [k, v] : fields) {
        lua_pushinteger(L, v);
        lua_setfield(L, -2, k);
    }
    return 1;
}

void push_plugin(lua_State* L, const LoadedPlugin& p) {
    lua_createtable(L, 0, 5);
    lua_pushstring(L, p.full_name.c_str());
    lua_setfield(L, -2, "name");
    lua_pushstring(L, plugin_kind_name(p.kind()));
    lua_setfield(L, -2, "kind");
    lua_pushstring(L, p.version());
    lua_setfield(L, -2, "version");
    lua_pushstring(L, p.path.c_str());
    lua_setfield(L, -2, "path");
    lua_pushstring(L, p.descriptor->description ? p.descriptor->description : "");
    lua_setfield(L, -2, "description");
}

int l_plugins(lua_State* L) {
    const auto list = lua_detail::engine(L).registry->list();
    lua_createtable(L, static_cast<int>(list.size()), 0);
    for (size_t i = 0; i < list.size(); ++i) {
        push_plugin(L, *list[i]);
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
    return 1;
}

int l_load_plugin(lua_State* L) {
    const std::string path = luaL_checkstring(L, 1);
    const LoadedPlugin& p = lua_detail::engine(L).registry->load_file(path);
    push_plugin(L, p);
    return 1;
}

// ctx.pe(name, options) -> PE spec: the plugin resolved and its options checked now, so an
// error points at this line of the recipe.
int l_pe(lua_State* L) {
    const std::string name = luaL_checkstring(L, 1);
    if (!lua_isnoneornil(L, 2)) luaL_checktype(L, 2, LUA_TTABLE);
    make_pe_spec(L, name, 2, lua::caller_where(L));
    return 1;
}

// ---- data sources
int l_data_text(lua_State* L) {
    const auto o = lua::Options::parse(L, 1,
                                       {{"text", OptType::String, true, "the text"},
                                        {"seed", OptType::Integer, false, "row sampling seed"}},
                                       "ctx.data.text", lua::caller_where(L));
    push_data(L, std::make_shared<TokenSource>(TokenSource::from_text(o.string("text", ""))),
              static_cast<uint64_t>(o.integer("seed", 1)));
    return 1;
}

int l_data_tokens(lua_State* L) {
    const auto o = lua::Options::parse(L, 1,
                                       {{"tokens", OptType::NumberList, true, "token ids"},
                                        {"vocab_size", OptType::Integer, true, "vocabulary"},
                                        {"seed", OptType::Integer, false, "row sampling seed"}},
                                       "ctx.data.tokens", lua::caller_where(L));
    std::vector<int32_t> tokens;
    for (double t : o.number_list("tokens")) {
        if (t != static_cast<double>(static_cast<int32_t>(t)))
            o.fail_key("tokens", fmt::format("must hold integers, got {}", t));
        tokens.push_back(static_cast<int32_t>(t));
    }
    push_data(L, std::make_shared<TokenSource>(std::move(tokens),
                                               static_cast<int>(o.integer("vocab_size", 0))),
              static_cast<uint64_t>(o.integer("seed", 1)));
    return 1;
}

// ctx.data.synthetic{kind = "cycle", length = N, period = P, vocab_size = V, seed = S}: a random
// sequence of P tokens repeated to length N. After one period every token is predictable, so a
// model with context > P can drive the loss towards 0: the smoke test's signal.
int l_data_synthetic(lua_State* L) {
    const auto o = lua::Options::parse(
        L, 1,
        {{"kind", OptType::String, false, "cycle"},
         {"length", OptType::Integer, true, "tokens in the stream"},
         {"period", OptType::Integer, false, "cycle length"},
         {"vocab_size", OptType::Integer, false, "vocabulary"},
         {"seed", OptType::Integer, false, "seed of the cycle and of row sampling"}},
        "ctx.data.synthetic", lua::caller_where(L));
    o.choice("kind", "cycle", {"cycle"});
    const int64_t length = o.integer("length", 0), period = o.integer("period", 16);
    const int64_t vocab = o.integer("vocab_size", 256);
    if (length < 2) o.fail_key("length", fmt::format("must be at least 2, got {}", length));
    if (period < 1) o.fail_key("period", fmt::format("must be positive, got {}", period));
    if (vocab < 1) o.fail_key("vocab_size", fmt::format("must be positive, got {}", vocab));
    Rng rng(static_cast<uint64_t>(o.integer("seed", 1)));
    std::vector<int32_t> cycle(static_cast<size_t>(period));
    for (auto& t : cycle) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
    std::vector<int32_t> tokens(static_cast<size_t>(length));
    for (int64_t i = 0; i < length; ++i) tokens[i] = cycle[static_cast<size_t>(i % period)];
    push_data(L, std::make_shared<TokenSource>(std::move(tokens), static_cast<int>(vocab)),
              static_cast<uint64_t>(o.integer("seed", 1)));
    return 1;
}

}  // namespace

void open_ctx_module(lua_State* L, EngineContext* engine) {
    lua_pushlightuserdata(L, engine);
    lua_setfield(L, LUA_REGISTRYINDEX, lua_detail::kEngineKey);
    register_ctx_types(L);

    lua_newtable(L);  // ctx
    lua_pushstring(L, CTX_VERSION_STRING);
    lua_setfield(L, -2, "version");
    const luaL_Reg fns[] = {{"log", guarded<l_log>},
                            {"warn", guarded<l_warn>},
                            {"rank", guarded<l_rank>},
                            {"cuda_devices", guarded<l_cuda_devices>},
                            {"world_size", guarded<l_world_size>},
                            {"parallel", guarded<l_parallel>},
                            {"plugins", guarded<l_plugins>},
                            {"load_plugin", guarded<l_load_plugin>},
                            {"pe", guarded<l_pe>},
                            {nullptr, nullptr}};
    luaL_setfuncs(L, fns, 0);
    register_model_functions(L);  // ctx.model, ctx.train, ctx.evaluate
    register_eval_functions(L);   // ctx.eval, ctx.run_eval
    register_checkpoint_functions(L);  // ctx.save, ctx.load, ...
    register_tokenizer_functions(L);   // ctx.tokenizer
    register_hf_functions(L);          // ctx.load_hf, ctx.save_hf

    lua_newtable(L);  // ctx.data
    const luaL_Reg data_fns[] = {{"text", guarded<l_data_text>},
                                 {"tokens", guarded<l_data_tokens>},
                                 {"synthetic", guarded<l_data_synthetic>},
                                 {nullptr, nullptr}};
    luaL_setfuncs(L, data_fns, 0);
    register_eval_data_functions(L);
    register_data_functions(L, lua_gettop(L) - 1, lua_gettop(L));
    lua_setfield(L, -2, "data");

    lua_pushvalue(L, -1);
    lua_setglobal(L, "ctx");
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    lua_pushvalue(L, -2);
    lua_setfield(L, -2, "ctx");
    lua_pop(L, 2);
}

}  // namespace ctx
