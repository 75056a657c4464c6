// The embedded Lua 5.4 runtime that runs recipes (DESIGN.md decision 6), in the manner of lua.c:
// chunks run under lua_pcall with a message handler that appends a traceback, and errors while
// loading (syntax, unreadable file) are told apart from errors while running.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

struct lua_State;

namespace ctx::lua {

struct SandboxOptions {
    // Sandboxed (the default): no os.execute / os.exit / os.remove / os.rename / os.tmpname /
    // os.getenv, no io.popen, no package.loadlib and no C module searchers, no string.dump, and
    // load / loadfile / dofile accept text chunks only (mode "t"). io.open and require of Lua
    // files stay (recipes read data and share helpers).
    bool sandboxed = true;
    // Abort the recipe after this many Lua VM instructions (0 = no limit). Counted in steps of
    // 1000 by a count hook; time spent inside C functions (training) is not counted.
    uint64_t max_instructions = 0;
    // Abort when the Lua heap would exceed this many bytes (0 = no limit). Tensors live outside
    // the Lua heap and do not count.
    size_t max_memory_bytes = 0;
};

// Errors from recipes. `what()` is the full message: "recipe.lua:12: message" plus, for run
// errors, "\nstack traceback:\n...".
class LoadError : public Error {  // the chunk could not be read or compiled
public:
    using Error::Error;
};
class RunError : public Error {  // the chunk raised an error (or hit a limit) while running
public:
    using Error::Error;
};

class Runtime {
public:
    explicit Runtime(const SandboxOptions& options = {});
    ~Runtime();
    Runtime(const Runtime&) = delete;
    Runtime& operator=(const Runtime&) = delete;

    lua_State* state() const { return L_; }
    const SandboxOptions& options() const { return options_; }

    // Sets the global `arg` table like lua.c: arg[0] = script, arg[1..] = script arguments.
    void set_args(const std::string& script, const std::vector<std::string>& args);

    // Lets `require` find Lua modules in dir (prepends "dir/?.lua" to package.path), so a recipe
    // can share code with the recipes next to it.
    void add_module_dir(const std::string& dir);

    // Loads then runs a file / a string. Throws LoadError or RunError.
    void run_file(const std::string& path);
    void run_string(const std::string& code, const std::string& chunk_name);

    // Lua heap bytes in use, and VM instructions executed so far (approximate, counted by hook).
    size_t memory_in_use() const;
    uint64_t instructions_executed() const;

private:
    void load_and_run(int load_status);

    lua_State* L_ = nullptr;
    SandboxOptions options_;
    struct Limits;  // allocator and hook state; address stays stable for the C callbacks
    Limits* limits_ = nullptr;
};

// "file:line:" of the Lua code that called the currently running C function (luaL_where level
// 1), e.g. "recipes/smoke.lua:12:". Empty if unknown.
std::string caller_where(lua_State* L);

// Raises a Lua error with the message prefixed by caller_where(). Does not return. C++ code
// called from Lua should throw ctx::Error instead and let the binding convert it; this is for
// the binding layer itself.
[[noreturn]] void raise(lua_State* L, const std::string& message);

}  // namespace ctx::lua
