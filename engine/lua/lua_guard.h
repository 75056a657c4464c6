// Calling C++ from Lua safely. Lua is linked as C++ (liblua5.4-c++), so lua_error unwinds with
// an exception and destructors run; but a ctx::Error must not cross Lua frames itself. guarded<F>
// turns it into a Lua error carrying the recipe's file:line.
#pragma once

#include <lua.hpp>

#include <exception>
#include <string>

#include "lua/runtime.h"

namespace ctx::lua {

template <int (*F)(lua_State*)>
int guarded(lua_State* L) {
    std::string message;
    try {
        return F(L);
    } catch (const std::exception& e) {  // Lua's own errors are not std::exceptions: they pass
        message = e.what();
    }
    const std::string where = caller_where(L);
    if (!where.empty() && message.rfind(where, 0) != 0) message = where + " " + message;
    lua_pushlstring(L, message.data(), message.size());
    return lua_error(L);
}

}  // namespace ctx::lua
