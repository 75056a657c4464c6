// C++ objects living in Lua userdata: placement-new on creation, destructor from __gc, typed
// access through the metatable name. Shared by the ctx module's source files.
#pragma once

#include <lua.hpp>

#include <new>
#include <string>

#include "core/error.h"
#include "lua/options.h"

namespace ctx::lua {

template <typename T>
T* new_userdata(lua_State* L, const char* type) {
    void* mem = lua_newuserdatauv(L, sizeof(T), 0);
    T* obj = new (mem) T();
    luaL_setmetatable(L, type);
    return obj;
}

template <typename T>
int gc_userdata(lua_State* L) {
    static_cast<T*>(lua_touserdata(L, 1))->~T();
    return 0;
}

template <typename T>
T* test_userdata(lua_State* L, int index, const char* type) {
    return static_cast<T*>(luaL_testudata(L, index, type));
}

// The value of a Table/Any option as a typed userdata, or an error naming the key.
template <typename T>
T& option_userdata(lua_State* L, const Options& o, const std::string& key, const char* type,
                   const char* expected) {
    const LuaRef* ref = o.ref(key);
    if (!ref) fail("{} {}: missing option '{}'", o.where(), o.context(), key);
    ref->push();
    T* obj = test_userdata<T>(L, -1, type);
    lua_pop(L, 1);
    if (!obj) o.fail_key(key, fmt::format("expects {}", expected));
    return *obj;
}

// Registers a metatable with __gc, optional __tostring/__len and an __index method table.
void new_type(lua_State* L, const char* name, lua_CFunction gc, const luaL_Reg* methods,
              lua_CFunction tostring, lua_CFunction len);

}  // namespace ctx::lua
