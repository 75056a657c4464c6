// The `ctx` module recipes see (DESIGN.md decision 6): build models with PE plugins, in-memory
// data, train, evaluate, log, rank/world info. Every table argument is checked against a schema
// (unknown keys and wrong types are errors with the recipe's file:line).
#pragma once

#include "session/engine.h"

struct lua_State;

namespace ctx {

// Registers the global `ctx` table (and package.loaded.ctx).
void open_ctx_module(lua_State* L, EngineContext* engine);

namespace lua_detail {
EngineContext& engine(lua_State* L);  // the context open_ctx_module registered
}  // namespace lua_detail

}  // namespace ctx
