// libFuzzer target for the recipe option layer: lua/options.cpp (Options::parse, a Lua table
// checked against a schema) and core/options.cpp (the typed getters, choice, messages). No Lua
// code runs: the input is a small text format this target defines, turned into a schema and a
// Lua table with the C API, so the fuzzer spends its time on the option code, not on Lua's parser.
//
//   !name:T        a schema entry; T is N number, I integer, B boolean, S string, L list of
//   !name:T!       numbers, T table, A any; a trailing '!' makes it required
//   key=VALUE      a table entry; key is a name, or [VALUE] for a non-string key
//   ^VALUE         the value handed to parse instead of the table (nil, a number, ...)
//   VALUE          123 | -7 | 1.5 | 1e999 | nan | inf | true | false | nil | "text to end of line
//                  or to the next '"' | {VALUE, VALUE, [VALUE]=VALUE, name=VALUE}
//
// parse must return Options or raise ctx::Error. Options it returns must keep its promises: only
// schema keys, every required key, and each key readable with the getter of its declared type.
#include <lua.hpp>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "fuzz_support.h"
#include "lua/options.h"

namespace {

using ctx::OptSpec;
using ctx::OptType;

// Reads the value syntax above and pushes each value onto the Lua stack.
class ValueReader {
public:
    ValueReader(lua_State* L, std::string_view text) : L_(L), s_(text) {}

    // Pushes one value (nil when there is none to read); depth bounds nesting.
    void push_value(int depth = 0) {
        skip_spaces();
        if (at_end()) return lua_pushnil(L_);
        const char c = s_[i_];
        if (c == '"') return push_string();
        if (c == '{' && depth < 8) return push_table(depth + 1);
        if (word("true")) return lua_pushboolean(L_, 1);
        if (word("false")) return lua_pushboolean(L_, 0);
        if (word("nil")) return lua_pushnil(L_);
        if (word("nan")) return lua_pushnumber(L_, std::nan(""));
        if (word("inf")) return lua_pushnumber(L_, HUGE_VAL);
        if (word("-inf")) return lua_pushnumber(L_, -HUGE_VAL);
        push_number();
    }

    // name (a string key) or [VALUE]; false when neither starts here.
    bool push_key(int depth) {
        skip_spaces();
        if (at_end()) return false;
        if (s_[i_] == '[') {
            ++i_;
            push_value(depth);
            if (!at_end() && s_[i_] == ']') ++i_;
            return true;
        }
        const size_t start = i_;
        while (!at_end() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '_'))
            ++i_;
        if (i_ == start) return false;
        lua_pushlstring(L_, s_.data() + start, i_ - start);
        return true;
    }

    // t[key] = value for the key and value on top of the stack, t at absolute index `table`.
    // Lua refuses nil and NaN keys; those entries are dropped.
    void set_field(int table) {
        const int kt = lua_type(L_, -2);
        if (kt == LUA_TNIL || (kt == LUA_TNUMBER && std::isnan(lua_tonumber(L_, -2)))) {
            lua_pop(L_, 2);
            return;
        }
        lua_rawset(L_, table);
    }

    bool take(char c) {
        skip_spaces();
        if (at_end() || s_[i_] != c) return false;
        ++i_;
        return true;
    }

private:
    bool at_end() const { return i_ >= s_.size(); }
    void skip_spaces() {
        while (!at_end() && s_[i_] == ' ') ++i_;
    }
    bool word(std::string_view w) {
        if (s_.substr(i_, w.size()) != w) return false;
        i_ += w.size();
        return true;
    }

    void push_string() {
        ++i_;
        const size_t end = std::min(s_.find('"', i_), s_.size());
        lua_pushlstring(L_, s_.data() + i_, end - i_);
        i_ = end < s_.size() ? end + 1 : end;
    }

    void push_number() {
        // strtod/strtoll need a terminated string: copy the token.
        const size_t start = i_;
        while (!at_end() && std::string_view("0123456789+-.eExXabcdefABCDEFpP").find(s_[i_]) !=
                                std::string_view::npos)
            ++i_;
        const std::string token(s_.substr(start, i_ - start));
        if (token.empty()) {
            ++i_;  // an unknown character: skip it, push nil
            return lua_pushnil(L_);
        }
        char* end = nullptr;
        errno = 0;
        const long long integer = std::strtoll(token.c_str(), &end, 10);
        if (*end == '\0' && errno == 0) return lua_pushinteger(L_, integer);
        lua_pushnumber(L_, std::strtod(token.c_str(), nullptr));
    }

    // {VALUE, [VALUE]=VALUE, name=VALUE, ...}: positional values take 1, 2, ... as Lua does.
    void push_table(int depth) {
        ++i_;
        lua_newtable(L_);
        const int table = lua_gettop(L_);
        lua_Integer next_index = 1;
        while (!at_end() && !take('}')) {
            const size_t before = i_;
            if (push_key(depth) && take('=')) {
                push_value(depth);
                set_field(table);
            } else {  // not a key: read it again as a positional value
                lua_settop(L_, table);
                i_ = before;
                push_value(depth);
                lua_rawseti(L_, table, next_index++);
            }
            take(',');
            if (i_ == before) ++i_;  // always make progress
        }
    }

    lua_State* L_;
    std::string_view s_;
    size_t i_ = 0;
};

OptType type_of(char c) {
    switch (c) {
        case 'I': return OptType::Integer;
        case 'B': return OptType::Bool;
        case 'S': return OptType::String;
        case 'L': return OptType::NumberList;
        case 'T': return OptType::Table;
        case 'A': return OptType::Any;
        default: return OptType::Number;
    }
}

// Builds the schema and pushes the value to parse (a table unless a '^' line says otherwise).
std::vector<OptSpec> read_input(lua_State* L, std::string_view input) {
    std::vector<OptSpec> schema;
    lua_newtable(L);
    const int table = lua_gettop(L);
    size_t pos = 0;
    while (pos <= input.size()) {
        const size_t nl = std::min(input.find('\n', pos), input.size());
        const std::string_view line = input.substr(pos, nl - pos);
        pos = nl + 1;
        if (line.empty()) continue;
        if (line[0] == '!') {
            const size_t colon = line.find(':');
            OptSpec spec;
            spec.name = std::string(line.substr(1, colon == std::string_view::npos
                                                       ? std::string_view::npos
                                                       : colon - 1));
            if (colon != std::string_view::npos && colon + 1 < line.size())
                spec.type = type_of(line[colon + 1]);
            spec.required = line.back() == '!' && line.size() > 1;
            bool duplicate = false;  // a schema names each key once
            for (const OptSpec& s : schema) duplicate = duplicate || s.name == spec.name;
            if (!duplicate) schema.push_back(std::move(spec));
        } else if (line[0] == '^') {
            ValueReader r(L, line.substr(1));
            r.push_value();
            lua_replace(L, table);
        } else if (lua_type(L, table) == LUA_TTABLE) {
            ValueReader r(L, line);
            if (!r.push_key(0)) continue;
            r.take('=');
            r.push_value();
            r.set_field(table);
        }
        lua_settop(L, table);
    }
    return schema;
}

// The promises of a successful parse, checked through the core/options.h getters.
void check_options(lua_State* L, const ctx::lua::Options& opt, const std::vector<OptSpec>& schema) {
    for (const std::string& key : opt.keys()) {
        bool known = false;
        for (const OptSpec& s : schema) known = known || s.name == key;
        if (!known) __builtin_trap();
    }
    for (const OptSpec& s : schema) {
        if (s.required && !opt.has(s.name)) __builtin_trap();
        if (!opt.has(s.name)) continue;
        switch (s.type) {  // the declared type's getter must work (a ctx::Error here is a bug)
            case OptType::Number: (void)opt.number(s.name, 0); break;
            case OptType::Integer: (void)opt.integer(s.name, 0); break;
            case OptType::Bool: (void)opt.boolean(s.name, false); break;
            case OptType::String: (void)opt.string(s.name, ""); break;
            case OptType::NumberList: (void)opt.number_list(s.name); break;
            case OptType::Table:
            case OptType::Any: {
                const ctx::lua::LuaRef* ref = opt.ref(s.name);
                if (!ref) __builtin_trap();
                const int top = lua_gettop(L);
                ref->push();
                if (lua_gettop(L) != top + 1) __builtin_trap();
                lua_settop(L, top);
                break;
            }
        }
        // Getters of other types are errors, never crashes.
        try {
            (void)opt.integer(s.name, 0);
        } catch (const ctx::Error&) {
        }
        try {
            (void)opt.choice(s.name, "a", {"a", "b"});
        } catch (const ctx::Error&) {
        }
        try {
            (void)opt.number_list(s.name);
            (void)opt.boolean(s.name, false);
        } catch (const ctx::Error&) {
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    lua_State* L = luaL_newstate();
    if (!L) std::abort();
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    const std::vector<OptSpec> schema = read_input(L, input);
    const int top = lua_gettop(L);
    try {
        const ctx::lua::Options opt =
            ctx::lua::Options::parse(L, -1, schema, "ctx.fuzz", "fuzz.lua:1:");
        if (lua_gettop(L) != top) __builtin_trap();  // parse must leave the stack as it was
        check_options(L, opt, schema);
    } catch (const ctx::Error& e) {
        ctx::fuzz::note(e);
        if (lua_gettop(L) != top) __builtin_trap();
    }
    lua_close(L);
    return 0;
}
