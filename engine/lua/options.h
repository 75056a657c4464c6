// Option tables: a Lua table checked against a declared schema, turned into ctx::Options
// (core/options.h).
// Used for every table a recipe passes to the engine (ctx.model{...}, optimizer tables) and for
// plugin options (the host validates them against ctx_option_desc before the plugin sees them).
// Unknown keys, wrong types and missing required keys are errors that name the recipe's
// file:line, the table ("ctx.model"), the key and what was expected.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/error.h"
#include "core/options.h"

struct lua_State;

namespace ctx::lua {

// The Lua-free value type and schema (core/options.h), spelled as before inside ctx::lua.
using ctx::OptSpec;
using ctx::OptType;
using ctx::OptValue;
using ctx::opt_type_name;

// A Lua value held by the registry (for Table / Any options). Movable, not copyable; released
// in the destructor.
class LuaRef {
public:
    LuaRef() = default;
    LuaRef(lua_State* L, int index);  // references the value at index
    ~LuaRef();
    LuaRef(LuaRef&& o) noexcept;
    LuaRef& operator=(LuaRef&& o) noexcept;
    LuaRef(const LuaRef&) = delete;
    LuaRef& operator=(const LuaRef&) = delete;
    void push() const;  // pushes the value onto L's stack
    bool valid() const { return L_ != nullptr; }
    lua_State* state() const { return L_; }

private:
    lua_State* L_ = nullptr;
    int ref_ = -1;
};

// Options read from a Lua table. As ctx::Options they go anywhere options go (plugin hosts,
// model construction); the Lua values of Table / Any options stay here, behind ref().
class Options : public ctx::Options {
public:
    using ctx::Options::Options;
    // Reads the table at `index` of L's stack against `schema`. `context` names the table in
    // messages ("ctx.model", "pe/rope options"); `where` is the "file:line:" prefix
    // (caller_where(L) at the call site). Throws ctx::Error:
    //   "recipes/x.lua:7: ctx.model: unknown option 'd_modle' (known: d_model, n_head, ...)"
    //   "recipes/x.lua:7: ctx.model: option 'n_head' expects an integer, got string \"four\""
    //   "recipes/x.lua:7: ctx.model: missing required option 'vocab_size'"
    // Non-string keys are errors too. A value at `index` that is nil gives an empty Options
    // (unless a key is required); a non-table value is an error.
    static Options parse(lua_State* L, int index, const std::vector<OptSpec>& schema,
                         const std::string& context, const std::string& where);

    // Table / Any options; nullptr if absent.
    const LuaRef* ref(const std::string& key) const;

private:
    std::map<std::string, LuaRef> refs_;
};

}  // namespace ctx::lua
