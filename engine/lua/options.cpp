// Option tables checked against a schema. Everything here runs on behalf of a C function called
// from Lua, so errors are thrown as ctx::Error and the binding turns them into Lua errors; the
// Lua stack is put back as it was before anything is thrown.
#include "lua/options.h"

#include <lua.hpp>

#include <algorithm>
#include <cmath>
#include <set>

namespace ctx::lua {

// ------------------------------------------------------------------ LuaRef

// The value is kept in the registry (shared by all threads of the state) and pushed back onto
// the stack of the thread that created the reference: binding code parses options and pushes
// their values with the lua_State it was called with, which may be a coroutine. A coroutine can
// be collected while a reference made on it is still held (a model keeps its options), so for a
// thread other than the main one the registry holds the pair {value, thread}, which keeps the
// thread, and so L_, alive until the reference is released.
namespace {
bool is_main_thread(lua_State* L) {
    const bool main = lua_pushthread(L) == 1;
    lua_pop(L, 1);
    return main;
}
}  // namespace

LuaRef::LuaRef(lua_State* L, int index) : L_(L) {
    index = lua_absindex(L, index);
    if (is_main_thread(L)) {
        lua_pushvalue(L, index);
    } else {
        lua_createtable(L, 2, 0);
        lua_pushvalue(L, index);
        lua_rawseti(L, -2, 1);
        lua_pushthread(L);
        lua_rawseti(L, -2, 2);
    }
    ref_ = luaL_ref(L, LUA_REGISTRYINDEX);
}

LuaRef::~LuaRef() {
    if (L_) luaL_unref(L_, LUA_REGISTRYINDEX, ref_);
}

LuaRef::LuaRef(LuaRef&& o) noexcept : L_(o.L_), ref_(o.ref_) {
    o.L_ = nullptr;
    o.ref_ = -1;
}

LuaRef& LuaRef::operator=(LuaRef&& o) noexcept {
    if (this != &o) {
        if (L_) luaL_unref(L_, LUA_REGISTRYINDEX, ref_);
        L_ = o.L_;
        ref_ = o.ref_;
        o.L_ = nullptr;
        o.ref_ = -1;
    }
    return *this;
}

void LuaRef::push() const {
    if (!L_) throw Error("LuaRef::push on an empty reference");
    lua_rawgeti(L_, LUA_REGISTRYINDEX, ref_);
    if (!is_main_thread(L_)) {  // {value, thread}
        lua_rawgeti(L_, -1, 1);
        lua_remove(L_, -2);
    }
}

// ------------------------------------------------------------------ parsing helpers

namespace {

// Restores the stack top however parse() leaves (values pushed by lua_next, rawget, ...).
struct StackGuard {
    lua_State* L;
    int top;
    explicit StackGuard(lua_State* l) : L(l), top(lua_gettop(l)) {}
    ~StackGuard() { lua_settop(L, top); }
};

std::string number_text(lua_State* L, int index) {
    lua_pushvalue(L, index);  // lua_tolstring converts in place; work on a copy
    std::string s = lua_tostring(L, -1);
    lua_pop(L, 1);
    return s;
}

// A value as it appears in messages: `string "four"`, `number 3`, `boolean true`, `table`.
std::string describe(lua_State* L, int index) {
    switch (lua_type(L, index)) {
        case LUA_TNIL: return "nil";
        case LUA_TNONE: return "no value";
        case LUA_TNUMBER: return "number " + number_text(L, index);
        case LUA_TBOOLEAN: return lua_toboolean(L, index) ? "boolean true" : "boolean false";
        case LUA_TSTRING: {
            size_t len = 0;
            const char* s = lua_tolstring(L, index, &len);
            return "string " + quote_option_text(std::string(s, len));
        }
        default: {
            // Engine userdata name their type (e.g. "ctx.Model") through __name.
            if (luaL_getmetafield(L, index, "__name") == LUA_TSTRING) {
                std::string name = lua_tostring(L, -1);
                lua_pop(L, 1);
                return name;
            }
            return luaL_typename(L, index);
        }
    }
}

// Optimal string alignment distance (edits, with adjacent transpositions counted as one), for
// "did you mean" on misspelt keys such as d_modle.
size_t edit_distance(const std::string& a, const std::string& b) {
    const size_t n = a.size(), m = b.size();
    std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
    for (size_t i = 0; i <= n; ++i) d[i][0] = i;
    for (size_t j = 0; j <= m; ++j) d[0][j] = j;
    for (size_t i = 1; i <= n; ++i)
        for (size_t j = 1; j <= m; ++j) {
            const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
    return d[n][m];
}

std::string suggestion(const std::string& key, const std::vector<std::string>& known) {
    std::string best;
    size_t best_d = 3;  // suggest at distance <= 2 only
    for (const auto& k : known) {
        const size_t d = edit_distance(key, k);
        if (d < best_d && d < key.size()) {
            best_d = d;
            best = k;
        }
    }
    return best;
}

}  // namespace

// ------------------------------------------------------------------ Options::parse

Options Options::parse(lua_State* L, int index, const std::vector<OptSpec>& schema,
                       const std::string& context, const std::string& where) {
    index = lua_absindex(L, index);
    StackGuard guard(L);
    Options out(where, context);
    const std::string pre = out.message_prefix();

    const int type = lua_type(L, index);
    if (type != LUA_TTABLE && type != LUA_TNIL && type != LUA_TNONE)
        throw Error(pre + "expects a table of options, got " + describe(L, index));

    if (type == LUA_TTABLE) {
        // Collect the keys first and check them in sorted order, so that which error a table
        // with several mistakes reports does not depend on the hash order.
        std::vector<std::string> keys;
        lua_pushnil(L);
        while (lua_next(L, index) != 0) {
            // Never lua_tostring a key here: it would convert it in place and break lua_next.
            if (lua_type(L, -2) != LUA_TSTRING) {
                if (lua_isinteger(L, -2))
                    throw Error(pre + "unexpected positional value " + describe(L, -1) + " at [" +
                                number_text(L, -2) + "] (options are written name = value)");
                throw Error(pre + "option names must be strings, got " + describe(L, -2));
            }
            size_t len = 0;
            const char* k = lua_tolstring(L, -2, &len);
            keys.emplace_back(k, len);
            lua_pop(L, 1);
        }
        std::sort(keys.begin(), keys.end());

        std::vector<std::string> known;
        for (const auto& s : schema) known.push_back(s.name);
        std::sort(known.begin(), known.end());

        for (const auto& key : keys) {
            auto spec = std::find_if(schema.begin(), schema.end(),
                                     [&](const OptSpec& s) { return s.name == key; });
            if (spec == schema.end()) {
                std::string msg = pre + "unknown option '" + key + "' (known: ";
                if (known.empty()) msg += "none";
                for (size_t i = 0; i < known.size(); ++i) msg += (i ? ", " : "") + known[i];
                msg += ")";
                const std::string s = suggestion(key, known);
                if (!s.empty()) msg += "; did you mean '" + s + "'?";
                throw Error(msg);
            }
            lua_pushlstring(L, key.data(), key.size());
            lua_rawget(L, index);
            const int v = lua_gettop(L);
            const std::string bad = pre + "option '" + key + "' expects ";
            switch (spec->type) {
                case OptType::Number:
                    if (lua_type(L, v) != LUA_TNUMBER)
                        throw Error(bad + "a number, got " + describe(L, v));
                    out.set(key, static_cast<double>(lua_tonumber(L, v)));
                    break;
                case OptType::Integer: {
                    int64_t i = 0;
                    if (lua_isinteger(L, v)) {
                        out.set(key, static_cast<int64_t>(lua_tointeger(L, v)));
                    } else if (lua_type(L, v) == LUA_TNUMBER) {
                        if (!integral_value(lua_tonumber(L, v), &i))
                            throw Error(bad + "an integer, got " + number_text(L, v));
                        out.set(key, i);
                    } else {
                        throw Error(bad + "an integer, got " + describe(L, v));
                    }
                    break;
                }
                case OptType::Bool:
                    if (lua_type(L, v) != LUA_TBOOLEAN)
                        throw Error(bad + "a boolean, got " + describe(L, v));
                    out.set(key, static_cast<bool>(lua_toboolean(L, v)));
                    break;
                case OptType::String: {
                    // Strict: lua_isstring would accept numbers too.
                    if (lua_type(L, v) != LUA_TSTRING)
                        throw Error(bad + "a string, got " + describe(L, v));
                    size_t len = 0;
                    const char* s = lua_tolstring(L, v, &len);
                    out.set(key, std::string(s, len));
                    break;
                }
                case OptType::NumberList: {
                    if (lua_type(L, v) != LUA_TTABLE)
                        throw Error(bad + "a list of numbers, got " + describe(L, v));
                    // A sequence 1..n: every key a positive integer, no holes (a hole shows as
                    // a nil element below n = number of entries).
                    lua_Integer count = 0;
                    lua_pushnil(L);
                    while (lua_next(L, v) != 0) {
                        if (!lua_isinteger(L, -2) || lua_tointeger(L, -2) < 1) {
                            const std::string k = lua_type(L, -2) == LUA_TSTRING
                                                      ? quote_option_text(lua_tostring(L, -2))
                                                      : describe(L, -2);
                            throw Error(bad + "a list of numbers, got a table with key " + k);
                        }
                        ++count;
                        lua_pop(L, 1);
                    }
                    std::vector<double> list;
                    list.reserve(static_cast<size_t>(count));
                    for (lua_Integer i = 1; i <= count; ++i) {
                        lua_rawgeti(L, v, i);
                        if (lua_type(L, -1) != LUA_TNUMBER)
                            throw Error(bad + "a list of numbers, element [" + std::to_string(i) +
                                        "] is " + describe(L, -1));
                        list.push_back(static_cast<double>(lua_tonumber(L, -1)));
                        lua_pop(L, 1);
                    }
                    out.set(key, std::move(list));
                    break;
                }
                case OptType::Table:
                    if (lua_type(L, v) != LUA_TTABLE)
                        throw Error(bad + "a table, got " + describe(L, v));
                    out.refs_.emplace(key, LuaRef(L, v));
                    out.held_keys_.insert(key);
                    break;
                case OptType::Any:  // a key present in a table never holds nil
                    out.refs_.emplace(key, LuaRef(L, v));
                    out.held_keys_.insert(key);
                    break;
            }
            lua_settop(L, v - 1);
        }
    }

    std::vector<std::string> missing;
    for (const auto& s : schema)
        if (s.required && !out.has(s.name)) missing.push_back("'" + s.name + "'");
    if (!missing.empty()) {
        std::string msg = pre + (missing.size() == 1 ? "missing required option "
                                                     : "missing required options ");
        for (size_t i = 0; i < missing.size(); ++i) msg += (i ? ", " : "") + missing[i];
        throw Error(msg);
    }
    return out;
}

// ------------------------------------------------------------------ Lua values

const LuaRef* Options::ref(const std::string& key) const {
    auto it = refs_.find(key);
    return it == refs_.end() ? nullptr : &it->second;
}

}  // namespace ctx::lua
