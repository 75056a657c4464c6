// Option tables: a Lua table checked against a declared schema, turned into plain C++ values.
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

struct lua_State;

namespace ctx::lua {

enum class OptType {
    Number,      // any Lua number
    Integer,     // a Lua integer, or a float with an integral value
    Bool,
    String,
    NumberList,  // a Lua sequence of numbers {1, 2.5, 3}
    Table,       // a nested table, kept as a registry reference for the caller to parse
    Any          // any value, kept as a registry reference (e.g. a model or plugin userdata)
};
const char* opt_type_name(OptType t);

struct OptSpec {
    std::string name;
    OptType type = OptType::Number;
    bool required = false;
    std::string help;
};

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

using OptValue = std::variant<double, int64_t, bool, std::string, std::vector<double>>;

class Options {
public:
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

    bool has(const std::string& key) const;
    double number(const std::string& key, double dflt) const;
    int64_t integer(const std::string& key, int64_t dflt) const;
    bool boolean(const std::string& key, bool dflt) const;
    std::string string(const std::string& key, const std::string& dflt) const;
    std::vector<double> number_list(const std::string& key) const;  // empty if absent
    // Table / Any options; nullptr if absent.
    const LuaRef* ref(const std::string& key) const;

    // Checks a string option against allowed values; throws naming where/context/key.
    std::string choice(const std::string& key, const std::string& dflt,
                       const std::vector<std::string>& allowed) const;

    // For error messages raised later by the caller about a specific key's value:
    // "<where> <context>: option '<key>' <message>".
    [[noreturn]] void fail_key(const std::string& key, const std::string& message) const;

    const std::string& where() const { return where_; }
    const std::string& context() const { return context_; }
    // Keys present, in sorted order (for logging the effective configuration).
    std::vector<std::string> keys() const;

private:
    std::string where_, context_;
    std::map<std::string, OptValue> values_;
    std::map<std::string, LuaRef> refs_;
};

}  // namespace ctx::lua
