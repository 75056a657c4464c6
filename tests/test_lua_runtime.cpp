// The embedded Lua runtime: running files and strings, load vs run errors, the sandbox, the
// instruction and memory limits, script arguments and the binding helpers.
#include <gtest/gtest.h>
#include <lua.hpp>

#include <cstdlib>
#include <fstream>
#include <string>

#include "lua/runtime.h"

using ctx::lua::LoadError;
using ctx::lua::RunError;
using ctx::lua::Runtime;
using ctx::lua::SandboxOptions;

namespace {

const std::string kFixtures = std::string(CTX_TEST_SOURCE_DIR) + "/tests/lua_fixtures/";

std::string global_string(lua_State* L, const char* name) {
    lua_getglobal(L, name);
    size_t len = 0;
    const char* s = lua_tolstring(L, -1, &len);
    std::string out = s ? std::string(s, len) : std::string("<not a string>");
    lua_pop(L, 1);
    return out;
}

lua_Integer global_integer(lua_State* L, const char* name) {
    lua_getglobal(L, name);
    EXPECT_TRUE(lua_isinteger(L, -1)) << name << " is " << luaL_typename(L, -1);
    lua_Integer v = lua_tointeger(L, -1);
    lua_pop(L, 1);
    return v;
}

// Runs code expecting a RunError; returns its message.
template <typename F>
std::string run_error(F&& f) {
    try {
        f();
    } catch (const RunError& e) {
        return e.what();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "expected RunError, got another exception: " << e.what();
        return "";
    }
    ADD_FAILURE() << "expected RunError, nothing was thrown";
    return "";
}

template <typename F>
std::string load_error(F&& f) {
    try {
        f();
    } catch (const LoadError& e) {
        return e.what();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "expected LoadError, got another exception: " << e.what();
        return "";
    }
    ADD_FAILURE() << "expected LoadError, nothing was thrown";
    return "";
}

SandboxOptions unsafe() {
    SandboxOptions o;
    o.sandboxed = false;
    return o;
}

}  // namespace

// ------------------------------------------------------------------ running

TEST(LuaRuntime, RunsFileAndSetsGlobals) {
    Runtime rt;
    rt.set_args(kFixtures + "ok.lua", {"--steps", "10"});
    rt.run_file(kFixtures + "ok.lua");
    lua_State* L = rt.state();
    EXPECT_EQ(global_integer(L, "answer"), 42);
    EXPECT_EQ(global_string(L, "greeting"), "hello from " + kFixtures + "ok.lua");
    // lua.c passes arg[1..n] to the script as `...`.
    ASSERT_EQ(luaL_dostring(L, "return script_args.n, script_args[1], script_args[2]"), LUA_OK);
    EXPECT_EQ(lua_tointeger(L, -3), 2);
    EXPECT_STREQ(lua_tostring(L, -2), "--steps");
    EXPECT_STREQ(lua_tostring(L, -1), "10");
    lua_settop(L, 0);
    EXPECT_EQ(lua_gettop(L), 0);
}

TEST(LuaRuntime, SetArgsBuildsArgTable) {
    Runtime rt;
    rt.set_args("recipes/smoke.lua", {"a", "b"});
    rt.run_string("n = #arg; a0 = arg[0]; a2 = arg[2]", "args");
    EXPECT_EQ(global_integer(rt.state(), "n"), 2);
    EXPECT_EQ(global_string(rt.state(), "a0"), "recipes/smoke.lua");
    EXPECT_EQ(global_string(rt.state(), "a2"), "b");
}

TEST(LuaRuntime, RunStringUsesChunkNameInMessages) {
    Runtime rt;
    std::string msg = run_error([&] { rt.run_string("local x = 1\nerror('boom')", "inline"); });
    EXPECT_EQ(msg.rfind("inline:2: boom\nstack traceback:\n", 0), 0u) << msg;
    // Names with Lua's own '@' / '=' prefixes are kept.
    msg = run_error([&] { rt.run_string("error('boom')", "@file.lua"); });
    EXPECT_EQ(msg.rfind("file.lua:1: boom", 0), 0u) << msg;
}

TEST(LuaRuntime, StackIsBalancedAndRuntimeReusableAfterErrors) {
    Runtime rt;
    lua_State* L = rt.state();
    const int top = lua_gettop(L);
    run_error([&] { rt.run_string("error('first')", "a"); });
    load_error([&] { rt.run_string("x = = 1", "b"); });
    rt.run_string("after = 7", "c");
    EXPECT_EQ(global_integer(L, "after"), 7);
    EXPECT_EQ(lua_gettop(L), top);
}

// ------------------------------------------------------------------ load vs run errors

TEST(LuaRuntime, SyntaxErrorIsLoadError) {
    Runtime rt;
    const std::string msg = load_error([&] { rt.run_file(kFixtures + "syntax_error.lua"); });
    EXPECT_NE(msg.find("syntax_error.lua:3: '=' expected near 'foo'"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("stack traceback"), std::string::npos) << msg;
}

TEST(LuaRuntime, MissingFileIsLoadError) {
    Runtime rt;
    const std::string path = kFixtures + "missing.lua";
    const std::string msg = load_error([&] { rt.run_file(path); });
    EXPECT_EQ(msg.rfind("cannot open " + path, 0), 0u) << msg;
}

TEST(LuaRuntime, RuntimeErrorIsRunErrorWithTraceback) {
    Runtime rt;
    const std::string msg = run_error([&] { rt.run_file(kFixtures + "runtime_error.lua"); });
    EXPECT_NE(msg.find("runtime_error.lua:3: attempt to index a nil value (field 'missing')"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("\nstack traceback:\n"), std::string::npos) << msg;
    EXPECT_NE(msg.find("in upvalue 'inner'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("runtime_error.lua:10: in main chunk"), std::string::npos) << msg;
}

TEST(LuaRuntime, ErrorObjectWithTostring) {
    Runtime rt;
    const std::string msg = run_error([&] { rt.run_file(kFixtures + "tostring_error.lua"); });
    EXPECT_EQ(msg.rfind("custom error (code 7)\nstack traceback:\n", 0), 0u) << msg;
}

TEST(LuaRuntime, ErrorObjectWithoutTostring) {
    Runtime rt;
    const std::string msg = run_error([&] { rt.run_string("error({})", "t"); });
    EXPECT_EQ(msg.rfind("(error object is a table value)\nstack traceback:", 0), 0u) << msg;
}

// ------------------------------------------------------------------ sandbox

TEST(LuaSandbox, RemovedFunctionsExplainThemselves) {
    const char* calls[][2] = {
        {"os.execute('true')", "os.execute"}, {"os.exit(0)", "os.exit"},
        {"os.remove('x')", "os.remove"},      {"os.rename('x', 'y')", "os.rename"},
        {"os.tmpname()", "os.tmpname"},       {"os.getenv('HOME')", "os.getenv"},
        {"io.popen('ls')", "io.popen"},       {"package.loadlib('x', 'y')", "package.loadlib"},
        {"string.dump(print)", "string.dump"}, {"('x'):dump()", "string.dump"},
    };
    Runtime rt;
    for (const auto& c : calls) {
        const std::string msg = run_error([&] { rt.run_string(c[0], "sb"); });
        EXPECT_EQ(msg.rfind(std::string("sb:1: ") + c[1] +
                                " is disabled in sandboxed recipes (run with --unsafe to allow it)",
                            0),
                  0u)
            << msg;
    }
}

TEST(LuaSandbox, NoCModuleSearchers) {
    Runtime rt;
    rt.run_string("nsearchers = #package.searchers; cpath = package.cpath", "sb");
    EXPECT_EQ(global_integer(rt.state(), "nsearchers"), 2);
    EXPECT_EQ(global_string(rt.state(), "cpath"), "");
    const std::string msg = run_error([&] { rt.run_string("require('no_such_module_xyz')", "sb"); });
    EXPECT_NE(msg.find("module 'no_such_module_xyz' not found"), std::string::npos) << msg;
    EXPECT_EQ(msg.find(".so'"), std::string::npos) << msg;  // no C paths were searched
}

TEST(LuaSandbox, RequireOfLuaFileWorks) {
    Runtime rt;
    rt.run_string("package.path = '" + kFixtures + "?.lua'", "setup");
    rt.run_file(kFixtures + "uses_require.lua");
    EXPECT_EQ(global_integer(rt.state(), "scaled"), 40);
}

TEST(LuaSandbox, BinaryChunksAreRefused) {
    // Bytes from string.dump in an unsafe runtime...
    std::string bytes;
    {
        Runtime rt(unsafe());
        rt.run_string("bytes = string.dump(function() return 42 end)", "dump");
        bytes = global_string(rt.state(), "bytes");
        ASSERT_EQ(bytes.rfind("\x1bLua", 0), 0u);
        // ...which the unsafe runtime itself loads fine.
        rt.run_string("v = load(bytes)()", "load");
        EXPECT_EQ(global_integer(rt.state(), "v"), 42);
    }
    const std::string path = testing::TempDir() + "ctx_lua_binary_chunk.luac";
    std::ofstream(path, std::ios::binary) << bytes;

    Runtime rt;
    lua_State* L = rt.state();
    lua_pushlstring(L, bytes.data(), bytes.size());
    lua_setglobal(L, "bytes");
    lua_pushstring(L, path.c_str());
    lua_setglobal(L, "path");
    rt.run_string(R"(
        local f, e1 = load(bytes)
        assert(f == nil)
        local g, e2 = load(bytes, "chunk", "b")
        assert(g == nil)
        local h, e3 = loadfile(path, "bt")
        assert(h == nil)
        local ok, e4 = pcall(dofile, path)
        assert(not ok)
        e = {e1, e2, e3, e4}
        text_ok = load("return 1 + 1", "text", "b")()  -- text still loads even when asking "b"
    )",
                  "sb");
    ASSERT_EQ(luaL_dostring(L, "return e[1], e[2], e[3], e[4]"), LUA_OK);
    EXPECT_STREQ(lua_tostring(L, 1), "attempt to load a binary chunk (mode is 't')");
    EXPECT_STREQ(lua_tostring(L, 2), "attempt to load a binary chunk (mode is 't')");
    EXPECT_NE(std::string(lua_tostring(L, 3)).find("attempt to load a binary chunk (mode is 't')"),
              std::string::npos);
    EXPECT_NE(std::string(lua_tostring(L, 4)).find("attempt to load a binary chunk (mode is 't')"),
              std::string::npos);
    lua_settop(L, 0);
    EXPECT_EQ(global_integer(L, "text_ok"), 2);

    // The recipe file itself may not be binary either.
    const std::string msg = load_error([&] { rt.run_file(path); });
    EXPECT_NE(msg.find("attempt to load a binary chunk (mode is 't')"), std::string::npos) << msg;
    std::remove(path.c_str());

    // Nor a module found by require.
    const std::string module = testing::TempDir() + "ctx_binary_module.lua";
    std::ofstream(module, std::ios::binary) << bytes;
    rt.run_string("package.path = '" + testing::TempDir() + "?.lua'", "setup");
    const std::string req = run_error([&] { rt.run_string("require('ctx_binary_module')", "sb"); });
    // As with the stock searcher, the message has no position (it is raised inside require).
    EXPECT_EQ(req.rfind("error loading module 'ctx_binary_module' from file '" + module +
                            "':\n\t",
                        0),
              0u)
        << req;
    EXPECT_NE(req.find("attempt to load a binary chunk (mode is 't')"), std::string::npos) << req;
    std::remove(module.c_str());
}

TEST(LuaSandbox, TextOnlyLoadBehavesLikeLoad) {
    Runtime rt;
    rt.run_string("local env = {y = 5}; v = load('return y', 'c', 'bt', env)()", "sb");
    EXPECT_EQ(global_integer(rt.state(), "v"), 5);
    // Reader functions work as in stock load.
    rt.run_string("local parts, i = {'return ', '1 + 2'}, 0\n"
                  "r = load(function() i = i + 1; return parts[i] end)()",
                  "sb");
    EXPECT_EQ(global_integer(rt.state(), "r"), 3);
    // Misuse reads as it would with the stock function.
    const std::string msg = run_error([&] { rt.run_string("load()", "sb"); });
    EXPECT_EQ(msg.rfind("sb:1: bad argument #1 to 'load' (function expected, got no value)\n"
                        "stack traceback:\n\t[C]: in function 'load'\n\tsb:1: in main chunk",
                        0),
              0u)
        << msg;
}

TEST(LuaSandbox, UnsafeKeepsFullLibrary) {
    setenv("CTX_LUA_TEST_VAR", "hello", 1);
    Runtime rt(unsafe());
    rt.run_string("v = os.getenv('CTX_LUA_TEST_VAR'); n = #package.searchers; "
                  "d = type(string.dump(function() end))",
                  "unsafe");
    EXPECT_EQ(global_string(rt.state(), "v"), "hello");
    EXPECT_EQ(global_integer(rt.state(), "n"), 4);
    EXPECT_EQ(global_string(rt.state(), "d"), "string");
}

TEST(LuaSandbox, IoOpenStays) {
    Runtime rt;
    lua_pushstring(rt.state(), (kFixtures + "helper_mod.lua").c_str());
    lua_setglobal(rt.state(), "path");
    rt.run_string("local f = assert(io.open(path)); first = f:read('l'); f:close()", "sb");
    EXPECT_EQ(global_string(rt.state(), "first"), "-- A helper module required by uses_require.lua.");
}

// ------------------------------------------------------------------ limits

TEST(LuaLimits, InstructionLimitStopsInfiniteLoop) {
    SandboxOptions o;
    o.max_instructions = 100000;
    Runtime rt(o);
    const std::string msg = run_error([&] { rt.run_string("local x = 0\nwhile true do end", "spin"); });
    EXPECT_EQ(msg.rfind("spin:2: instruction limit of 100000 exceeded (raise it with "
                        "--max-instructions or 0 for none)\nstack traceback:",
                        0),
              0u)
        << msg;
    EXPECT_GE(rt.instructions_executed(), 100000u);
    // The budget is per run: the runtime stays usable.
    rt.run_string("done = 1", "after");
    EXPECT_EQ(global_integer(rt.state(), "done"), 1);
}

TEST(LuaLimits, InstructionLimitCannotBeCaughtByPcall) {
    SandboxOptions o;
    o.max_instructions = 50000;
    Runtime rt(o);
    const std::string msg = run_error([&] {
        rt.run_string("while true do pcall(function() while true do end end) end", "spin");
    });
    EXPECT_NE(msg.find("instruction limit of 50000 exceeded"), std::string::npos) << msg;
}

TEST(LuaLimits, InstructionLimitReachesCoroutines) {
    SandboxOptions o;
    o.max_instructions = 50000;
    Runtime rt(o);
    std::string msg = run_error([&] {
        rt.run_string("coroutine.wrap(function() while true do end end)()", "co");
    });
    EXPECT_NE(msg.find("co:1: instruction limit of 50000 exceeded"), std::string::npos) << msg;
    // resume catches the coroutine's error, but the main loop runs out of budget too.
    msg = run_error([&] {
        rt.run_string("while true do coroutine.resume(coroutine.create(function() "
                      "while true do end end)) end",
                      "co");
    });
    EXPECT_NE(msg.find("instruction limit of 50000 exceeded"), std::string::npos) << msg;
}

TEST(LuaLimits, InstructionsAreCountedWithoutLimit) {
    Runtime rt;
    rt.run_string("local s = 0; for i = 1, 100000 do s = s + i end", "count");
    EXPECT_GE(rt.instructions_executed(), 100000u);
}

TEST(LuaLimits, MemoryLimitStopsGrowingTable) {
    SandboxOptions o;
    o.max_memory_bytes = 8u << 20;
    Runtime rt(o);
    EXPECT_GT(rt.memory_in_use(), 0u);
    EXPECT_LT(rt.memory_in_use(), o.max_memory_bytes);
    const std::string msg = run_error([&] {
        rt.run_string("local t = {}\nfor i = 1, 1e9 do t[i] = ('x'):rep(64) .. i end", "grow");
    });
    EXPECT_EQ(msg, "grow: recipe exceeded the Lua memory limit of 8388608 bytes (raise it with "
                   "--max-lua-memory or 0 for none)");
    EXPECT_LE(rt.memory_in_use(), o.max_memory_bytes);
    // The state recovers: the failed run's table was garbage.
    rt.run_string("t = {}; for i = 1, 1000 do t[i] = i end; n = #t", "after");
    EXPECT_EQ(global_integer(rt.state(), "n"), 1000);
}

TEST(LuaLimits, MemoryErrorCaughtInsideRecipe) {
    SandboxOptions o;
    o.max_memory_bytes = 4u << 20;
    Runtime rt(o);
    rt.run_string("ok, err = pcall(function() local s = ('x'):rep(16 * 1024 * 1024) end)", "pc");
    ASSERT_EQ(luaL_dostring(rt.state(), "return ok, err"), LUA_OK);
    EXPECT_FALSE(lua_toboolean(rt.state(), -2));
    EXPECT_STREQ(lua_tostring(rt.state(), -1), "not enough memory");
    lua_settop(rt.state(), 0);
}

TEST(LuaLimits, MemoryLimitTooSmallToStart) {
    // 100 bytes fails in lua_newstate itself, 4000 while opening the libraries.
    for (size_t limit : {size_t{100}, size_t{4000}}) {
        SandboxOptions o;
        o.max_memory_bytes = limit;
        try {
            Runtime rt(o);
            ADD_FAILURE() << "expected ctx::Error for a limit of " << limit;
        } catch (const ctx::Error& e) {
            EXPECT_NE(std::string(e.what()).find("--max-lua-memory"), std::string::npos)
                << e.what();
        }
    }
}

// ------------------------------------------------------------------ binding helpers

namespace {
int where_fn(lua_State* L) {
    const std::string w = ctx::lua::caller_where(L);
    lua_pushlstring(L, w.data(), w.size());
    return 1;
}
// raise() is handed a short literal: the std::string temporary it gets is skipped by the
// longjmp, so binding code keeps messages it builds out of scope (or small) before raising.
int raise_fn(lua_State* L) { ctx::lua::raise(L, "bad thing"); }
}  // namespace

TEST(LuaBinding, CallerWhereAndRaise) {
    Runtime rt;
    lua_State* L = rt.state();
    lua_register(L, "where", where_fn);
    lua_register(L, "fail", raise_fn);
    rt.run_string("\nw = where()", "recipe.lua");
    EXPECT_EQ(global_string(L, "w"), "recipe.lua:2:");
    const std::string msg = run_error([&] { rt.run_string("fail()", "recipe.lua"); });
    EXPECT_EQ(msg.rfind("recipe.lua:1: bad thing\nstack traceback:", 0), 0u) << msg;
    // From C with no Lua caller, where is empty.
    lua_pushcfunction(L, where_fn);
    lua_call(L, 0, 1);
    EXPECT_STREQ(lua_tostring(L, -1), "");
    lua_pop(L, 1);
}
