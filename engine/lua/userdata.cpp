#include "lua/userdata.h"

namespace ctx::lua {

void new_type(lua_State* L, const char* name, lua_CFunction gc, const luaL_Reg* methods,
              lua_CFunction tostring, lua_CFunction len) {
    luaL_newmetatable(L, name);
    lua_pushcfunction(L, gc);
    lua_setfield(L, -2, "__gc");
    if (tostring) {
        lua_pushcfunction(L, tostring);
        lua_setfield(L, -2, "__tostring");
    }
    if (len) {
        lua_pushcfunction(L, len);
        lua_setfield(L, -2, "__len");
    }
    if (methods) {
        lua_newtable(L);
        luaL_setfuncs(L, methods, 0);
        lua_setfield(L, -2, "__index");
    }
    lua_pop(L, 1);
}

}  // namespace ctx::lua
