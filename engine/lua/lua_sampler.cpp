// ctx.sampler.lua: rows made by a recipe function (lua_sampler.h).
#include "lua/lua_sampler.h"

#include <lua.hpp>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "plugin/sampler_plugin.h"
#include "lua/userdata.h"

namespace ctx::lua {

namespace {

constexpr const char* kRngType = "ctx.SamplerRng";

// The row's RNG stream, lent to Lua for one call: null outside it.
struct RngBox {
    uint64_t* state = nullptr;
};

uint64_t* live_state(lua_State* L) {
    auto* box = static_cast<RngBox*>(luaL_checkudata(L, 1, kRngType));
    if (box->state == nullptr)
        luaL_error(L, "rng: used outside the sampler call it was passed to");
    return box->state;
}

// rng:below(n) -> integer uniform in [0, n), n >= 1
int rng_below(lua_State* L) {
    uint64_t* s = live_state(L);
    const lua_Integer n = luaL_checkinteger(L, 2);
    luaL_argcheck(L, n >= 1, 2, "n must be >= 1");
    lua_pushinteger(L, static_cast<lua_Integer>(ctx_rng_below(s, static_cast<uint64_t>(n))));
    return 1;
}

// rng:uniform() -> number uniform in [0, 1) (53 random bits)
int rng_uniform(lua_State* L) {
    uint64_t* s = live_state(L);
    lua_pushnumber(L, ctx_rng_unit(s));
    return 1;
}

int traceback(lua_State* L) {
    const char* msg = lua_tostring(L, 1);
    luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
    return 1;
}

// field `key` of the table at `index`: row_len numbers into out (via conv); an error message
// naming the field otherwise ("" when fine). Absent and `optional`: false, out untouched.
template <class T, class Conv>
std::string read_list(lua_State* L, int index, const char* key, int64_t row_len, bool optional,
                      T* out, Conv conv, bool& present) {
    present = lua_getfield(L, index, key) != LUA_TNIL;
    if (!present) {
        lua_pop(L, 1);
        return optional ? "" : fmt::format("the result has no list '{}'", key);
    }
    if (!lua_istable(L, -1)) {
        const std::string type = luaL_typename(L, -1);
        lua_pop(L, 1);
        return fmt::format("'{}' must be a list, got a {}", key, type);
    }
    const lua_Integer n = luaL_len(L, -1);
    if (n != row_len) {
        lua_pop(L, 1);
        return fmt::format("'{}' has {} entries, the row has {}", key, n, row_len);
    }
    for (int64_t i = 0; i < row_len; ++i) {
        lua_rawgeti(L, -1, i + 1);
        std::string bad;
        if (!conv(L, out[i])) bad = luaL_tolstring(L, -1, nullptr);  // pushes the text
        if (!bad.empty()) {
            lua_pop(L, 3);
            return fmt::format("'{}'[{}] = {} is not a {}", key, i + 1, bad,
                               std::is_integral_v<T> ? "32-bit integer" : "number");
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return "";
}

bool to_int32(lua_State* L, int32_t& out) {
    int ok = 0;
    const lua_Integer v = lua_tointegerx(L, -1, &ok);
    if (!ok || v < INT32_MIN || v > INT32_MAX) return false;
    out = static_cast<int32_t>(v);
    return true;
}

bool to_float(lua_State* L, float& out) {
    int ok = 0;
    const lua_Number v = lua_tonumberx(L, -1, &ok);
    if (!ok) return false;
    out = static_cast<float>(v);
    return true;
}

}  // namespace

void register_lua_sampler_types(lua_State* L) {
    const luaL_Reg methods[] = {{"below", rng_below}, {"uniform", rng_uniform}, {nullptr, nullptr}};
    new_type(L, kRngType, gc_userdata<RngBox>, methods, nullptr, nullptr);
}

LuaRowSampler::LuaRowSampler(std::shared_ptr<const LuaRef> fn, std::string name,
                             std::string where, int32_t vocab_size)
    : fn_(std::move(fn)), name_("lua:" + std::move(name)), where_(std::move(where)),
      vocab_(vocab_size) {}

void LuaRowSampler::sample(const int32_t* window, int64_t window_len, uint64_t rng_state[4],
                           ctx_sample_row& row) {
    lua_State* L = fn_->state();
    const int top = lua_gettop(L);
    lua_pushcfunction(L, traceback);
    fn_->push();
    lua_createtable(L, static_cast<int>(window_len + 1), 0);
    for (int64_t p = 0; p <= window_len; ++p) {
        lua_pushinteger(L, window[p]);
        lua_rawseti(L, -2, p + 1);
    }
    lua_pushinteger(L, window_len);
    lua_pushinteger(L, row.row_len);
    RngBox* box = new_userdata<RngBox>(L, kRngType);
    box->state = rng_state;
    lua_pushvalue(L, -1);  // keep the box referenced until it is disarmed below
    lua_insert(L, top + 1);
    const int status = lua_pcall(L, 4, 1, top + 2);
    box->state = nullptr;
    if (status != LUA_OK) {
        std::string msg = lua_tostring(L, -1) ? lua_tostring(L, -1) : "(no message)";
        lua_settop(L, top);
        fail("{} ({}): {}", name_, where_, msg);
    }
    std::string problem;
    if (!lua_istable(L, -1)) {
        problem = fmt::format("the function must return a table {{tokens =, positions =, "
                              "targets =, mask =}}, got a {}", luaL_typename(L, -1));
    } else {
        const int res = lua_gettop(L);
        bool present = false;
        problem = read_list(L, res, "tokens", row.row_len, false, row.tokens, to_int32, present);
        if (problem.empty())
            problem = read_list(L, res, "positions", row.row_len, false, row.positions, to_float,
                                present);
        if (problem.empty())
            problem = read_list(L, res, "targets", row.row_len, false, row.targets, to_int32,
                                present);
        if (problem.empty()) {
            problem = read_list(L, res, "mask", row.row_len, true, row.loss_mask, to_float,
                                present);
            if (problem.empty() && !present)
                for (int64_t i = 0; i < row.row_len; ++i) row.loss_mask[i] = 1.0f;
        }
    }
    lua_settop(L, top);
    if (!problem.empty()) fail("{} ({}): invalid row: {}", name_, where_, problem);
    validate_sample_row(row, vocab_, true, name_);
}

}  // namespace ctx::lua
