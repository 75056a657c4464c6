// The embedded Lua runtime, modelled on lua.c: a state with our own allocator (memory limit) and a
// count hook (instruction limit), the standard libraries minus the sandbox removals, and chunks
// run under lua_pcall with a traceback message handler.
//
// Lua errors may be longjmp (liblua5.4, plain C) or C++ exceptions (liblua5.4-c++, which the
// build links now); this file is written to be correct with either. With longjmp, C++
// destructors are skipped, so every C function here that Lua calls keeps no C++ objects with
// destructors alive across a Lua call that may raise. Everything that allocates Lua memory runs
// under lua_pcall (an unprotected memory error would panic and abort). C++ exceptions are only
// thrown from the top-level Runtime methods, after lua_pcall has returned: Lua's C++ build
// catches every exception (catch (...)) and would turn a ctx::Error into a bogus status.
#include "lua/runtime.h"

#include <lua.hpp>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <spdlog/spdlog.h>

namespace ctx::lua {

namespace {

// Allocator and hook state. Reached from C callbacks through the allocator's ud pointer
// (lua_getallocf), which works from any coroutine of the state. (Runtime::Limits, private in the
// header, is this struct; the callbacks here name it by its own name.)
struct LimitState {
    size_t max_bytes = 0;
    size_t used = 0;
    bool memory_refused = false;  // the allocator refused a block during this run

    uint64_t max_instructions = 0;
    uint64_t instructions = 0;       // total, approximate (steps of kHookStep)
    uint64_t run_start = 0;          // `instructions` when the outermost run began
    bool instructions_exceeded = false;
    int depth = 0;                   // nesting of run_file / run_string (a binding may re-enter)

    std::string chunk_label;        // for messages without a Lua position (memory limit)
    bool pass_script_args = false;  // run_file passes arg[1..n] as `...`, like lua.c

    bool warn_on = false;            // lua_setwarnf state, as in lauxlib ("@on" / "@off")
    bool warn_cont = false;
    std::string warn_buf;
};

constexpr int kHookStep = 1000;

LimitState* limits_of(lua_State* L) {
    void* ud = nullptr;
    lua_getallocf(L, &ud);
    return static_cast<LimitState*>(ud);
}

// ------------------------------------------------------------------ allocator, hook, warnings

// Lua's allocator contract: nsize == 0 frees; ptr == NULL means osize encodes the object type,
// not a size. Returning NULL for growth makes Lua run an emergency collection, retry, and then
// raise LUA_ERRMEM. Shrinking must never fail, so the limit only applies to growth.
void* limited_alloc(void* ud, void* ptr, size_t osize, size_t nsize) {
    auto* lim = static_cast<LimitState*>(ud);
    const size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        std::free(ptr);
        lim->used -= old;
        return nullptr;
    }
    if (lim->max_bytes != 0 && nsize > old && lim->used - old + nsize > lim->max_bytes) {
        lim->memory_refused = true;
        return nullptr;
    }
    void* p = std::realloc(ptr, nsize);
    if (p) lim->used = lim->used - old + nsize;
    return p;
}

// Count hook, every kHookStep VM instructions. Over the limit it raises an error; it also drops
// the hook step to 1 so that a recipe catching the error with pcall gets it again on its very
// next instruction, all the way out to the top level.
void count_hook(lua_State* L, lua_Debug* ar) {
    LimitState* lim = limits_of(L);
    lim->instructions += kHookStep;
    if (lim->max_instructions == 0 || lim->instructions - lim->run_start <= lim->max_instructions)
        return;
    lim->instructions_exceeded = true;
    lua_sethook(L, count_hook, LUA_MASKCOUNT, 1);
    char where[LUA_IDSIZE + 32] = "";
    if (lua_getinfo(L, "Sl", ar) && ar->currentline > 0)
        std::snprintf(where, sizeof where, "%s:%d: ", ar->short_src, ar->currentline);
    char msg[sizeof where + 128];
    std::snprintf(msg, sizeof msg,
                  "%sinstruction limit of %" PRIu64
                  " exceeded (raise it with --max-instructions or 0 for none)",
                  where, lim->max_instructions);
    lua_pushstring(L, msg);
    lua_error(L);
}

// warn() as in lauxlib: off by default, "@on" / "@off" control messages, pieces joined until
// tocont is 0. Goes to the engine log instead of bare stderr.
void warn_function(void* ud, const char* msg, int tocont) {
    auto* lim = static_cast<LimitState*>(ud);
    try {
        if (!lim->warn_cont && !tocont && msg[0] == '@') {
            if (std::strcmp(msg, "@on") == 0) lim->warn_on = true;
            if (std::strcmp(msg, "@off") == 0) lim->warn_on = false;
            return;
        }
        lim->warn_cont = tocont != 0;
        if (!lim->warn_on) return;
        lim->warn_buf += msg;
        if (!tocont) {
            spdlog::warn("Lua warning: {}", lim->warn_buf);
            lim->warn_buf.clear();
        }
    } catch (...) {  // never let an exception into Lua's C frames
    }
}

int panic_function(lua_State* L) {
    const char* msg = lua_tostring(L, -1);
    std::fprintf(stderr, "ctxengine: unprotected error in call to Lua API (%s)\n",
                 msg ? msg : "error object is not a string");
    return 0;  // Lua aborts
}

// ------------------------------------------------------------------ message handler

// lua.c's msghandler: a non-string error object is turned into a string with __tostring (or a
// note of its type); then the traceback is appended (lua.c omits the traceback after
// __tostring; we keep it, a recipe author wants to see where the error came from).
int message_handler(lua_State* L) {
    const char* msg = lua_tostring(L, 1);
    if (msg == nullptr) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
            msg = lua_tostring(L, -1);
        else
            msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

// ------------------------------------------------------------------ sandbox

// Stands in for a removed function, so that a recipe learns why it is missing.
int disabled_function(lua_State* L) {
    return luaL_error(L, "%s is disabled in sandboxed recipes (run with --unsafe to allow it)",
                      lua_tostring(L, lua_upvalueindex(1)));
}

void disable(lua_State* L, const char* lib, const char* name) {
    if (lua_getglobal(L, lib) != LUA_TTABLE) {
        lua_pop(L, 1);
        return;
    }
    lua_pushfstring(L, "%s.%s", lib, name);
    lua_pushcclosure(L, disabled_function, 1);
    lua_setfield(L, -2, name);
    lua_pop(L, 1);
}

// load / loadfile / dofile as in lbaselib.c, but loading text only: a mode argument is still
// checked to be a string and then ignored ("t" is used), so recipes passing "bt" keep working.
// Reimplemented rather than wrapped so that errors name 'load' and show no extra [C] frame.
constexpr int kReaderSlot = 5;  // where the reader keeps the piece it returned (lbaselib.c)

const char* generic_reader(lua_State* L, void*, size_t* size) {
    luaL_checkstack(L, 2, "too many nested functions");
    lua_pushvalue(L, 1);
    lua_call(L, 0, 1);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        *size = 0;
        return nullptr;
    }
    if (!lua_isstring(L, -1)) luaL_error(L, "reader function must return a string");
    lua_replace(L, kReaderSlot);
    return lua_tolstring(L, kReaderSlot, size);
}

int load_result(lua_State* L, int status, int env_index) {
    if (status != LUA_OK) {
        luaL_pushfail(L);
        lua_insert(L, -2);
        return 2;  // fail, message
    }
    if (env_index != 0) {  // the given env becomes the chunk's first upvalue (_ENV)
        lua_pushvalue(L, env_index);
        if (!lua_setupvalue(L, -2, 1)) lua_pop(L, 1);
    }
    return 1;
}

int load_text_only(lua_State* L) {  // load(chunk [, chunkname [, mode [, env]]])
    size_t len = 0;
    const char* s = lua_tolstring(L, 1, &len);
    luaL_optstring(L, 3, "t");
    const int env = !lua_isnone(L, 4) ? 4 : 0;
    int status;
    if (s != nullptr) {
        const char* name = luaL_optstring(L, 2, s);
        status = luaL_loadbufferx(L, s, len, name, "t");
    } else {
        const char* name = luaL_optstring(L, 2, "=(load)");
        luaL_checktype(L, 1, LUA_TFUNCTION);
        lua_settop(L, kReaderSlot);
        status = lua_load(L, generic_reader, nullptr, name, "t");
    }
    return load_result(L, status, env);
}

int loadfile_text_only(lua_State* L) {  // loadfile([filename [, mode [, env]]])
    const char* filename = luaL_optstring(L, 1, nullptr);
    luaL_optstring(L, 2, "t");
    const int env = !lua_isnone(L, 3) ? 3 : 0;
    return load_result(L, luaL_loadfilex(L, filename, "t"), env);
}

int dofile_continuation(lua_State* L, int, lua_KContext) { return lua_gettop(L) - 1; }
int dofile_text_only(lua_State* L) {
    const char* filename = luaL_optstring(L, 1, nullptr);
    lua_settop(L, 1);
    if (luaL_loadfilex(L, filename, "t") != LUA_OK) return lua_error(L);
    lua_callk(L, 0, LUA_MULTRET, 0, dofile_continuation);
    return dofile_continuation(L, 0, 0);
}

// The Lua-file searcher of loadlib.c (package.searchpath over package.path), loading text only;
// the stock one loads binary chunks too. Upvalue 1 is the package table.
int searcher_lua_text(lua_State* L) {
    const char* name = luaL_checkstring(L, 1);
    lua_getfield(L, lua_upvalueindex(1), "path");
    if (lua_type(L, -1) != LUA_TSTRING) return luaL_error(L, "'package.path' must be a string");
    lua_getfield(L, lua_upvalueindex(1), "searchpath");
    lua_pushvalue(L, 1);
    lua_pushvalue(L, -3);
    lua_call(L, 2, 2);  // filename, or nil and the list of files tried
    if (lua_isnil(L, -2)) return 1;
    const char* filename = lua_tostring(L, -2);
    if (luaL_loadfilex(L, filename, "t") != LUA_OK)
        return luaL_error(L, "error loading module '%s' from file '%s':\n\t%s", name, filename,
                          lua_tostring(L, -1));
    lua_pushstring(L, filename);  // second argument to the loader, as in loadlib.c
    return 2;
}

void apply_sandbox(lua_State* L) {
    static const char* const removed[][2] = {
        {"os", "execute"}, {"os", "exit"},  {"os", "remove"},      {"os", "rename"},
        {"os", "tmpname"}, {"os", "getenv"}, {"io", "popen"},      {"package", "loadlib"},
        {"string", "dump"},
        // The debug library could lift the limits (sethook) or reach into other code's locals;
        // traceback and getinfo stay for error reporting.
        {"debug", "sethook"}, {"debug", "gethook"}, {"debug", "setlocal"},
        {"debug", "setupvalue"}, {"debug", "upvaluejoin"}, {"debug", "setmetatable"},
        {"debug", "setuservalue"}, {"debug", "getregistry"}, {"debug", "debug"},
    };
    for (const auto& r : removed) disable(L, r[0], r[1]);

    lua_register(L, "load", load_text_only);
    lua_register(L, "loadfile", loadfile_text_only);
    lua_register(L, "dofile", dofile_text_only);

    // package.searchers = {preload, Lua files (text only)}; no C modules.
    lua_getglobal(L, "package");
    lua_pushliteral(L, "");
    lua_setfield(L, -2, "cpath");
    lua_getfield(L, -1, "searchers");
    lua_pushvalue(L, -2);
    lua_pushcclosure(L, searcher_lua_text, 1);
    lua_rawseti(L, -2, 2);
    for (lua_Integer i = luaL_len(L, -1); i > 2; --i) {
        lua_pushnil(L);
        lua_rawseti(L, -2, i);
    }
    lua_pop(L, 2);
}

int open_runtime(lua_State* L) {
    const bool sandboxed = lua_toboolean(L, 1);
    luaL_openlibs(L);
    if (sandboxed) apply_sandbox(L);
    return 0;
}

// ------------------------------------------------------------------ protected helpers

// Chunk loading under lua_pcall, so that a memory error while loading becomes a status instead
// of a panic. On return the chunk or the error message is on top of the stack.
struct LoadRequest {
    const char* path = nullptr;  // run_file
    const char* code = nullptr;  // run_string
    size_t size = 0;
    const char* chunk_name = nullptr;
    const char* mode = nullptr;
    int status = LUA_OK;
};

int protected_load(lua_State* L) {
    auto* req = static_cast<LoadRequest*>(lua_touserdata(L, 1));
    req->status = req->path ? luaL_loadfilex(L, req->path, req->mode)
                            : luaL_loadbufferx(L, req->code, req->size, req->chunk_name, req->mode);
    return 1;  // the chunk or the message
}

int load_protected(lua_State* L, LoadRequest& req) {
    lua_pushcfunction(L, protected_load);
    lua_pushlightuserdata(L, &req);
    const int status = lua_pcall(L, 1, 1, 0);
    return status != LUA_OK ? status : req.status;
}

struct ArgsRequest {
    const std::string* script;
    const std::vector<std::string>* args;
};

int protected_set_args(lua_State* L) {
    auto* req = static_cast<ArgsRequest*>(lua_touserdata(L, 1));
    const auto& args = *req->args;
    lua_createtable(L, static_cast<int>(args.size()), 1);
    lua_pushlstring(L, req->script->data(), req->script->size());
    lua_rawseti(L, -2, 0);
    for (size_t i = 0; i < args.size(); ++i) {
        lua_pushlstring(L, args[i].data(), args[i].size());
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
    lua_setglobal(L, "arg");
    return 0;
}

// lua.c passes the script arguments (arg[1..n]) to the main chunk as `...`.
int protected_push_script_args(lua_State* L) {
    if (lua_getglobal(L, "arg") != LUA_TTABLE) return 0;
    const int n = static_cast<int>(luaL_len(L, 1));
    luaL_checkstack(L, n + 3, "too many arguments to script");
    for (int i = 1; i <= n; ++i) lua_rawgeti(L, 1, i);
    return n;
}

std::string message_at(lua_State* L, int index) {
    size_t len = 0;
    const char* s = lua_tolstring(L, index, &len);
    return s ? std::string(s, len) : std::string("(error object is not a string)");
}

}  // namespace

struct Runtime::Limits : LimitState {};

// ------------------------------------------------------------------ Runtime

Runtime::Runtime(const SandboxOptions& options) : options_(options), limits_(new Limits) {
    limits_->max_bytes = options.max_memory_bytes;
    limits_->max_instructions = options.max_instructions;
    L_ = lua_newstate(limited_alloc, static_cast<LimitState*>(limits_));
    if (L_ == nullptr) {
        delete limits_;
        fail("cannot create the Lua state (memory limit of {} bytes too small? raise it with "
             "--max-lua-memory or 0 for none)",
             options.max_memory_bytes);
    }
    lua_atpanic(L_, panic_function);
    lua_setwarnf(L_, warn_function, static_cast<LimitState*>(limits_));
    lua_pushcfunction(L_, open_runtime);
    lua_pushboolean(L_, options.sandboxed);
    const int status = lua_pcall(L_, 1, 0, 0);
    if (status != LUA_OK) {
        std::string msg = message_at(L_, -1);
        const bool memory = limits_->memory_refused;
        lua_close(L_);
        delete limits_;
        if (memory)
            fail("the Lua memory limit of {} bytes is too small to start the runtime (raise it "
                 "with --max-lua-memory or 0 for none)",
                 options.max_memory_bytes);
        fail("cannot open the Lua standard libraries: {}", msg);
    }
    // Installed even without a limit, to count instructions_executed().
    lua_sethook(L_, count_hook, LUA_MASKCOUNT, kHookStep);
}

Runtime::~Runtime() {
    lua_close(L_);  // frees through limited_alloc, so limits_ goes after
    delete limits_;
}

void Runtime::set_args(const std::string& script, const std::vector<std::string>& args) {
    ArgsRequest req{&script, &args};
    lua_pushcfunction(L_, protected_set_args);
    lua_pushlightuserdata(L_, &req);
    if (lua_pcall(L_, 1, 0, 0) != LUA_OK) {
        std::string msg = message_at(L_, -1);
        lua_pop(L_, 1);
        throw RunError("cannot set the script arguments: " + msg);
    }
}

void Runtime::run_file(const std::string& path) {
    if (limits_->depth == 0) limits_->memory_refused = false;
    LoadRequest req;
    req.path = path.c_str();
    req.mode = options_.sandboxed ? "t" : nullptr;
    const int status = load_protected(L_, req);
    limits_->chunk_label = path;
    limits_->pass_script_args = true;
    load_and_run(status);
}

void Runtime::run_string(const std::string& code, const std::string& chunk_name) {
    if (limits_->depth == 0) limits_->memory_refused = false;
    // A plain name is made a literal chunk name ("=name"), so that messages read "name:3:"
    // rather than Lua's [string "name"]:3:. Names starting with '@' or '=' are kept as they are.
    std::string name = chunk_name;
    if (name.empty() || (name[0] != '@' && name[0] != '=')) name = "=" + name;
    LoadRequest req;
    req.code = code.data();
    req.size = code.size();
    req.chunk_name = name.c_str();
    req.mode = options_.sandboxed ? "t" : nullptr;
    const int status = load_protected(L_, req);
    limits_->chunk_label = name.substr(1);
    limits_->pass_script_args = false;  // like lua.c's -e chunks
    load_and_run(status);
}

// The chunk (or, when load_status is not LUA_OK, the load error message) is on top of the stack.
void Runtime::load_and_run(int load_status) {
    const std::string label = limits_->chunk_label;
    const bool with_args = limits_->pass_script_args;
    const std::string memory_message = fmt::format(
        "{}: recipe exceeded the Lua memory limit of {} bytes (raise it with --max-lua-memory or "
        "0 for none)",
        label, limits_->max_bytes);

    if (load_status != LUA_OK) {
        std::string msg = message_at(L_, -1);
        lua_pop(L_, 1);
        if (load_status == LUA_ERRMEM && limits_->memory_refused) msg = memory_message;
        throw LoadError(msg);
    }

    // Stack: ... handler chunk [args]
    const int handler = lua_gettop(L_);
    lua_pushcfunction(L_, message_handler);
    lua_insert(L_, handler);
    int nargs = 0;
    if (with_args) {
        lua_pushcfunction(L_, protected_push_script_args);
        if (lua_pcall(L_, 0, LUA_MULTRET, 0) != LUA_OK) {
            std::string msg = message_at(L_, -1);
            lua_settop(L_, handler - 1);
            throw RunError(limits_->memory_refused ? memory_message : msg);
        }
        nargs = lua_gettop(L_) - (handler + 1);
    }

    // The instruction budget is per outermost run; a binding may run a file from inside a
    // recipe (nested run), which shares the budget of the recipe that called it.
    struct DepthGuard {
        lua_State* L;
        Limits* lim;
        explicit DepthGuard(lua_State* state, Limits* l) : L(state), lim(l) {
            if (lim->depth++ == 0) {
                lim->run_start = lim->instructions;
                lim->instructions_exceeded = false;
                lua_sethook(L, count_hook, LUA_MASKCOUNT, kHookStep);
            }
        }
        ~DepthGuard() {
            if (--lim->depth == 0) lua_sethook(L, count_hook, LUA_MASKCOUNT, kHookStep);
        }
    } guard(L_, limits_);

    const int status = lua_pcall(L_, nargs, 0, handler);
    if (status == LUA_OK) {
        lua_settop(L_, handler - 1);
        return;
    }
    std::string msg = message_at(L_, -1);
    lua_settop(L_, handler - 1);
    if (status == LUA_ERRMEM || (status == LUA_ERRERR && limits_->memory_refused)) {
        // No message handler runs for memory errors, so there is no line to report.
        lua_gc(L_, LUA_GCCOLLECT, 0);  // give the next run the memory the failed one held
        if (limits_->memory_refused) msg = memory_message;
    } else if (status == LUA_ERRERR && limits_->instructions_exceeded) {
        msg = fmt::format("{}: instruction limit of {} exceeded (raise it with "
                          "--max-instructions or 0 for none)",
                          label, limits_->max_instructions);
    }
    throw RunError(msg);
}

void Runtime::add_module_dir(const std::string& dir) {
    const std::string prefix = (dir.empty() ? std::string(".") : dir) + "/?.lua;";
    lua_getglobal(L_, "package");
    lua_getfield(L_, -1, "path");
    const std::string path = prefix + (lua_isstring(L_, -1) ? lua_tostring(L_, -1) : "");
    lua_pop(L_, 1);
    lua_pushstring(L_, path.c_str());
    lua_setfield(L_, -2, "path");
    lua_pop(L_, 1);
}

size_t Runtime::memory_in_use() const { return limits_->used; }

uint64_t Runtime::instructions_executed() const { return limits_->instructions; }

std::string caller_where(lua_State* L) {
    luaL_where(L, 1);
    std::string where = message_at(L, -1);
    lua_pop(L, 1);
    while (!where.empty() && where.back() == ' ') where.pop_back();  // luaL_where ends in ": "
    return where;
}

void raise(lua_State* L, const std::string& message) {
    // Nothing with a destructor of ours is alive when lua_error jumps.
    luaL_where(L, 1);
    lua_pushlstring(L, message.data(), message.size());
    lua_concat(L, 2);
    lua_error(L);
    std::abort();  // not reached; lua_error does not return
}

}  // namespace ctx::lua
