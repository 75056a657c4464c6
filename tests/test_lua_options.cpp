// Option tables: every OptType accepted and rejected with the exact messages recipes see, unknown
// and missing keys, references to nested values, and the getters.
#include <gtest/gtest.h>
#include <lua.hpp>

#include <memory>
#include <string>

#include "lua/options.h"
#include "lua/runtime.h"

using ctx::lua::LuaRef;
using ctx::lua::Options;
using ctx::lua::OptSpec;
using ctx::lua::OptType;

namespace {

const std::vector<OptSpec> kModel = {
    {"vocab_size", OptType::Integer, true, "tokens"},
    {"d_model", OptType::Integer, false, "width"},
    {"n_head", OptType::Integer, false, "heads"},
    {"dropout", OptType::Number, false, ""},
    {"bias", OptType::Bool, false, ""},
    {"name", OptType::String, false, ""},
    {"betas", OptType::NumberList, false, ""},
    {"init", OptType::Table, false, ""},
    {"hook", OptType::Any, false, ""},
};

class LuaOptions : public ::testing::Test {
protected:
    ctx::lua::Runtime rt;
    lua_State* L = rt.state();

    // Evaluates `expr` and parses the result as ctx.model options at "recipe.lua:7:".
    Options parse(const std::string& expr, const std::vector<OptSpec>& schema = kModel,
                  const std::string& where = "recipe.lua:7:") {
        if (luaL_dostring(L, ("return " + expr).c_str()) != LUA_OK) {
            ADD_FAILURE() << lua_tostring(L, -1);
            lua_settop(L, 0);
            return Options{};
        }
        const int top = lua_gettop(L);
        Options o = Options::parse(L, -1, schema, "ctx.model", where);
        EXPECT_EQ(lua_gettop(L), top);  // parse leaves the stack as it was
        lua_settop(L, 0);
        return o;
    }

    // Parses expecting ctx::Error; returns its message and checks the stack is left alone.
    std::string error(const std::string& expr, const std::vector<OptSpec>& schema = kModel,
                      const std::string& where = "recipe.lua:7:") {
        EXPECT_EQ(luaL_dostring(L, ("return " + expr).c_str()), LUA_OK);
        const int top = lua_gettop(L);
        std::string msg;
        try {
            Options::parse(L, -1, schema, "ctx.model", where);
            ADD_FAILURE() << "expected an error for " << expr;
        } catch (const ctx::Error& e) {
            msg = e.what();
        }
        EXPECT_EQ(lua_gettop(L), top);
        lua_settop(L, 0);
        return msg;
    }
};

}  // namespace

TEST_F(LuaOptions, AcceptsEveryType) {
    Options o = parse(R"({vocab_size = 256, d_model = 64.0, dropout = 0.1, bias = false,
                          name = "tiny", betas = {0.9, 0.95}, init = {std = 0.02},
                          hook = print})");
    EXPECT_EQ(o.integer("vocab_size", 0), 256);
    EXPECT_EQ(o.integer("d_model", 0), 64);  // an integral float is an integer
    EXPECT_DOUBLE_EQ(o.number("dropout", 0), 0.1);
    EXPECT_FALSE(o.boolean("bias", true));
    EXPECT_EQ(o.string("name", ""), "tiny");
    EXPECT_EQ(o.number_list("betas"), (std::vector<double>{0.9, 0.95}));
    ASSERT_NE(o.ref("init"), nullptr);
    ASSERT_NE(o.ref("hook"), nullptr);
    o.ref("hook")->push();
    EXPECT_TRUE(lua_iscfunction(L, -1));
    lua_pop(L, 1);
    EXPECT_EQ(o.keys(), (std::vector<std::string>{"betas", "bias", "d_model", "dropout", "hook",
                                                  "init", "name", "vocab_size"}));
    EXPECT_EQ(o.where(), "recipe.lua:7:");
    EXPECT_EQ(o.context(), "ctx.model");
}

TEST_F(LuaOptions, NumberAcceptsIntegersAndFloats) {
    Options o = parse("{vocab_size = 1, dropout = 3}");
    EXPECT_DOUBLE_EQ(o.number("dropout", 0), 3.0);
    EXPECT_DOUBLE_EQ(o.number("vocab_size", 0), 1.0);  // integers read as numbers too
    EXPECT_EQ(error("{vocab_size = 1, dropout = '0.1'}"),
              "recipe.lua:7: ctx.model: option 'dropout' expects a number, got string \"0.1\"");
}

TEST_F(LuaOptions, IntegerRejections) {
    EXPECT_EQ(error("{vocab_size = 2.5}"),
              "recipe.lua:7: ctx.model: option 'vocab_size' expects an integer, got 2.5");
    EXPECT_EQ(error("{vocab_size = 'four'}"),
              "recipe.lua:7: ctx.model: option 'vocab_size' expects an integer, got string "
              "\"four\"");
    EXPECT_EQ(error("{vocab_size = 1e300}"),
              "recipe.lua:7: ctx.model: option 'vocab_size' expects an integer, got 1e+300");
    EXPECT_EQ(error("{vocab_size = 1/0}"),
              "recipe.lua:7: ctx.model: option 'vocab_size' expects an integer, got inf");
    EXPECT_EQ(error("{vocab_size = true}"),
              "recipe.lua:7: ctx.model: option 'vocab_size' expects an integer, got boolean true");
    EXPECT_EQ(error("{vocab_size = io.stdout}"),  // userdata are named by __name
              "recipe.lua:7: ctx.model: option 'vocab_size' expects an integer, got FILE*");
    EXPECT_EQ(error("{vocab_size = print}"),
              "recipe.lua:7: ctx.model: option 'vocab_size' expects an integer, got function");
    EXPECT_EQ(parse("{vocab_size = -3.0}").integer("vocab_size", 0), -3);
    EXPECT_EQ(parse("{vocab_size = math.maxinteger}").integer("vocab_size", 0),
              INT64_MAX);
}

TEST_F(LuaOptions, BoolAndStringAreStrict) {
    EXPECT_EQ(error("{vocab_size = 1, bias = 1}"),
              "recipe.lua:7: ctx.model: option 'bias' expects a boolean, got number 1");
    EXPECT_EQ(error("{vocab_size = 1, bias = 'true'}"),
              "recipe.lua:7: ctx.model: option 'bias' expects a boolean, got string \"true\"");
    EXPECT_EQ(error("{vocab_size = 1, name = 3}"),
              "recipe.lua:7: ctx.model: option 'name' expects a string, got number 3");
    EXPECT_EQ(error("{vocab_size = 1, name = {}}"),
              "recipe.lua:7: ctx.model: option 'name' expects a string, got table");
    EXPECT_EQ(error("{vocab_size = 1, name = 1.5}"),
              "recipe.lua:7: ctx.model: option 'name' expects a string, got number 1.5");
}

TEST_F(LuaOptions, LongStringsAreShortenedInMessages) {
    EXPECT_EQ(error("{vocab_size = string.rep('a', 100)}"),
              "recipe.lua:7: ctx.model: option 'vocab_size' expects an integer, got string \"" +
                  std::string(40, 'a') + "...\"");
}

TEST_F(LuaOptions, NumberList) {
    EXPECT_EQ(parse("{vocab_size = 1, betas = {}}").number_list("betas"), std::vector<double>{});
    EXPECT_EQ(parse("{vocab_size = 1, betas = {1, 2.5, 3}}").number_list("betas"),
              (std::vector<double>{1, 2.5, 3}));
    EXPECT_EQ(error("{vocab_size = 1, betas = {0.9, 'x'}}"),
              "recipe.lua:7: ctx.model: option 'betas' expects a list of numbers, element [2] is "
              "string \"x\"");
    EXPECT_EQ(error("{vocab_size = 1, betas = {0.9, nil, 3}}"),
              "recipe.lua:7: ctx.model: option 'betas' expects a list of numbers, element [2] is "
              "nil");
    EXPECT_EQ(error("{vocab_size = 1, betas = {0.9, beta2 = 0.95}}"),
              "recipe.lua:7: ctx.model: option 'betas' expects a list of numbers, got a table "
              "with key \"beta2\"");
    EXPECT_EQ(error("{vocab_size = 1, betas = 0.9}"),
              "recipe.lua:7: ctx.model: option 'betas' expects a list of numbers, got number 0.9");
}

TEST_F(LuaOptions, NestedTableRefCanBePushedAndRead) {
    Options o = parse("{vocab_size = 1, init = {std = 0.02, kind = 'normal'}}");
    const LuaRef* ref = o.ref("init");
    ASSERT_NE(ref, nullptr);
    EXPECT_TRUE(ref->valid());
    EXPECT_EQ(ref->state(), L);
    ref->push();
    ASSERT_TRUE(lua_istable(L, -1));
    lua_getfield(L, -1, "std");
    EXPECT_DOUBLE_EQ(lua_tonumber(L, -1), 0.02);
    lua_pop(L, 1);
    // The nested table parses with its own schema.
    Options inner = Options::parse(L, -1, {{"std", OptType::Number, false, ""}, {"kind", OptType::String, false, ""}},
                                   "ctx.model init", "recipe.lua:7:");
    EXPECT_EQ(inner.string("kind", ""), "normal");
    lua_pop(L, 1);
    EXPECT_EQ(error("{vocab_size = 1, init = 0.02}"),
              "recipe.lua:7: ctx.model: option 'init' expects a table, got number 0.02");
    EXPECT_EQ(o.ref("hook"), nullptr);
}

TEST_F(LuaOptions, LuaRefMoves) {
    lua_pushstring(L, "held");
    LuaRef a(L, -1);
    lua_pop(L, 1);
    LuaRef b(std::move(a));
    EXPECT_FALSE(a.valid());
    ASSERT_TRUE(b.valid());
    LuaRef c;
    EXPECT_FALSE(c.valid());
    c = std::move(b);
    EXPECT_FALSE(b.valid());
    c.push();
    EXPECT_STREQ(lua_tostring(L, -1), "held");
    lua_pop(L, 1);
    EXPECT_THROW(a.push(), ctx::Error);
}

namespace {
std::unique_ptr<Options> g_held;  // options kept past the call that parsed them, like a model
int hold_options(lua_State* L) {
    g_held = std::make_unique<Options>(Options::parse(
        L, 1, {{"init", OptType::Table, false, ""}}, "hold", ctx::lua::caller_where(L)));
    return 0;
}
}  // namespace

TEST_F(LuaOptions, RefMadeInCoroutineOutlivesIt) {
    lua_register(L, "hold", hold_options);
    rt.run_string("coroutine.wrap(function() hold{init = {v = 3}} end)()\n"
                  "collectgarbage(); collectgarbage()",
                  "co");
    ASSERT_TRUE(g_held);
    const LuaRef* ref = g_held->ref("init");
    ASSERT_NE(ref, nullptr);
    lua_State* co = ref->state();
    EXPECT_NE(co, L);  // pushed back onto the thread that parsed it, which is kept alive
    ref->push();
    lua_getfield(co, -1, "v");
    EXPECT_EQ(lua_tointeger(co, -1), 3);
    lua_pop(co, 2);
    g_held.reset();
    lua_gc(L, LUA_GCCOLLECT, 0);
}

TEST_F(LuaOptions, UnknownKeyListsKnownAndSuggests) {
    EXPECT_EQ(error("{vocab_size = 1, d_modle = 64}"),
              "recipe.lua:7: ctx.model: unknown option 'd_modle' (known: betas, bias, d_model, "
              "dropout, hook, init, n_head, name, vocab_size); did you mean 'd_model'?");
    EXPECT_EQ(error("{vocab_size = 1, layers = 4}"),
              "recipe.lua:7: ctx.model: unknown option 'layers' (known: betas, bias, d_model, "
              "dropout, hook, init, n_head, name, vocab_size)");
    EXPECT_EQ(error("{x = 1}", {}), "recipe.lua:7: ctx.model: unknown option 'x' (known: none)");
}

TEST_F(LuaOptions, NonStringKeys) {
    EXPECT_EQ(error("{128, vocab_size = 1}"),
              "recipe.lua:7: ctx.model: unexpected positional value number 128 at [1] (options "
              "are written name = value)");
    EXPECT_EQ(error("{[true] = 1}"),
              "recipe.lua:7: ctx.model: option names must be strings, got boolean true");
}

TEST_F(LuaOptions, RequiredMissing) {
    EXPECT_EQ(error("{d_model = 64}"),
              "recipe.lua:7: ctx.model: missing required option 'vocab_size'");
    const std::vector<OptSpec> two = {{"a", OptType::Number, true, ""},
                                      {"b", OptType::Number, true, ""}};
    EXPECT_EQ(error("{}", two), "recipe.lua:7: ctx.model: missing required options 'a', 'b'");
    EXPECT_EQ(error("nil", two), "recipe.lua:7: ctx.model: missing required options 'a', 'b'");
}

TEST_F(LuaOptions, NonTableArgument) {
    EXPECT_EQ(error("5"), "recipe.lua:7: ctx.model: expects a table of options, got number 5");
    EXPECT_EQ(error("'big'"),
              "recipe.lua:7: ctx.model: expects a table of options, got string \"big\"");
}

TEST_F(LuaOptions, NilArgumentIsEmpty) {
    const std::vector<OptSpec> optional = {{"lr", OptType::Number, false, ""}};
    Options o = parse("nil", optional);
    EXPECT_FALSE(o.has("lr"));
    EXPECT_TRUE(o.keys().empty());
    EXPECT_DOUBLE_EQ(o.number("lr", 3e-4), 3e-4);
    // An absent stack slot (none) is treated the same.
    Options none = Options::parse(L, lua_gettop(L) + 1, optional, "opt", "x.lua:1:");
    EXPECT_FALSE(none.has("lr"));
}

TEST_F(LuaOptions, GettersReturnDefaults) {
    Options o = parse("{vocab_size = 5}");
    EXPECT_TRUE(o.has("vocab_size"));
    EXPECT_FALSE(o.has("d_model"));
    EXPECT_EQ(o.integer("d_model", 64), 64);
    EXPECT_DOUBLE_EQ(o.number("dropout", 0.5), 0.5);
    EXPECT_TRUE(o.boolean("bias", true));
    EXPECT_EQ(o.string("name", "dflt"), "dflt");
    EXPECT_TRUE(o.number_list("betas").empty());
    EXPECT_EQ(o.ref("init"), nullptr);
}

TEST_F(LuaOptions, GetterOfWrongKindNamesTheKey) {
    Options o = parse("{vocab_size = 5, name = 'x'}");
    try {
        o.integer("name", 0);
        FAIL();
    } catch (const ctx::Error& e) {
        EXPECT_STREQ(e.what(), "recipe.lua:7: ctx.model: option 'name' is not an integer");
    }
}

TEST_F(LuaOptions, Choice) {
    const std::vector<OptSpec> rope = {{"layout", OptType::String, false, ""}};
    luaL_dostring(L, "return {layout = 'halfs'}");
    Options bad = Options::parse(L, -1, rope, "pe/rope", "recipe.lua:7:");
    lua_settop(L, 0);
    try {
        bad.choice("layout", "half", {"half", "interleaved"});
        FAIL();
    } catch (const ctx::Error& e) {
        EXPECT_STREQ(e.what(),
                     "recipe.lua:7: pe/rope: option 'layout' must be one of half, interleaved; "
                     "got \"halfs\"");
    }
    luaL_dostring(L, "return {layout = 'interleaved'}");
    Options good = Options::parse(L, -1, rope, "pe/rope", "recipe.lua:7:");
    lua_settop(L, 0);
    EXPECT_EQ(good.choice("layout", "half", {"half", "interleaved"}), "interleaved");
    Options absent = Options::parse(L, 1, rope, "pe/rope", "recipe.lua:7:");
    EXPECT_EQ(absent.choice("layout", "half", {"half", "interleaved"}), "half");
}

TEST_F(LuaOptions, FailKeyAndEmptyWhere) {
    Options o = parse("{vocab_size = 5}");
    try {
        o.fail_key("d_model", "must be divisible by n_head");
        FAIL();
    } catch (const ctx::Error& e) {
        EXPECT_STREQ(e.what(), "recipe.lua:7: ctx.model: option 'd_model' must be divisible by n_head");
    }
    EXPECT_EQ(error("{x = 1}", {{"y", OptType::Number, false, ""}}, ""),
              "ctx.model: unknown option 'x' (known: y)");
}

TEST_F(LuaOptions, TypeNames) {
    EXPECT_STREQ(ctx::lua::opt_type_name(OptType::Integer), "integer");
    EXPECT_STREQ(ctx::lua::opt_type_name(OptType::NumberList), "list of numbers");
    EXPECT_STREQ(ctx::lua::opt_type_name(OptType::Any), "any value");
}
