// ctx.sampler.lua (lua/lua_sampler.h): a sampler written in Lua against the C plugins it
// re-implements (sampler/full with span = "random" draws the same rng:below as the plugin, so
// the rows must be identical row for row), the rng's lifetime, and every kind of bad result,
// each named in the error with the recipe line.
#include <gtest/gtest.h>

#include <lua.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "lua/lua_sampler.h"
#include "lua/runtime.h"
#include "sampler_fixtures.h"

using namespace ctx;
using namespace ctx::test;

namespace {

// A LuaRowSampler over the global function `name` that `code` defines.
struct LuaSampler {
    lua::Runtime runtime;
    std::unique_ptr<lua::LuaRowSampler> sampler;
    LuaSampler(const std::string& code, const std::string& name, int32_t vocab = 259) {
        runtime.run_string(code, "sampler_test.lua");
        lua_State* L = runtime.state();
        lua::register_lua_sampler_types(L);
        lua_getglobal(L, name.c_str());
        auto fn = std::make_shared<const lua::LuaRef>(L, -1);
        lua_pop(L, 1);
        sampler = std::make_unique<lua::LuaRowSampler>(fn, name, "sampler_test.lua:1:", vocab);
    }
};

// sampler/full with span = "random", in Lua: the same single draw rng:below(W - L + 1).
const char* kFullRandom = R"(
function full_random(window, W, L, rng)
  local o = 0
  if L < W then o = rng:below(W - L + 1) end
  local t, p, g = {}, {}, {}
  for r = 1, L do
    t[r] = window[o + r]      -- window[p + 1] is the token at position p = o + r - 1
    p[r] = o + r - 1
    g[r] = window[o + r + 1]
  end
  return { tokens = t, positions = p, targets = g }
end
)";

}  // namespace

TEST(LuaSampler, SameRowsAsThePluginItReimplements) {
    LuaSampler lua(kFullRandom, "full_random");
    auto plugin = make_sampler("full", {{"span", std::string("random")}});
    const auto w = test_window(200);
    bool moved = false;
    for (uint64_t seed = 0; seed < 200; ++seed) {
        const Row a = sample_row(*lua.sampler, w, 32, seed), b = sample_row(*plugin, w, 32, seed);
        ASSERT_EQ(a.tokens, b.tokens) << seed;
        ASSERT_EQ(a.positions, b.positions) << seed;
        ASSERT_EQ(a.targets, b.targets) << seed;
        ASSERT_EQ(a.mask, std::vector<float>(32, 1.0f)) << "mask defaults to 1";
        moved |= a.positions[0] > 0.0f;
    }
    EXPECT_TRUE(moved);
    EXPECT_EQ(lua.sampler->name(), "lua:full_random");
}

TEST(LuaSampler, UniformAndMaskAreUsed) {
    LuaSampler lua(R"(
function halves(window, W, L, rng)
  local t, p, g, m = {}, {}, {}, {}
  for r = 1, L do
    t[r], p[r], g[r] = window[r], r - 1 + rng:uniform() * 0.5, window[r + 1]
    m[r] = (r % 2 == 0) and 1 or 0
  end
  return { tokens = t, positions = p, targets = g, mask = m }
end)", "halves");
    const auto w = test_window(40);
    const Row r = sample_row(*lua.sampler, w, 10, 3);
    for (int i = 0; i < 10; ++i) {
        EXPECT_GE(r.positions[i], float(i));
        EXPECT_LT(r.positions[i], float(i) + 0.5f);
        EXPECT_EQ(r.mask[i], (i + 1) % 2 == 0 ? 1.0f : 0.0f);
    }
    EXPECT_NE(r.positions, sample_row(*lua.sampler, w, 10, 4).positions);
    EXPECT_EQ(r.positions, sample_row(*lua.sampler, w, 10, 3).positions);
}

TEST(LuaSampler, BadResultsAreNamedWithTheRecipeLine) {
    const std::string code = std::string(kFullRandom) + R"(
function short(w, W, L, rng) local r = full_random(w, W, L, rng); r.tokens[L] = nil; return r end
function text(w, W, L, rng) local r = full_random(w, W, L, rng); r.targets[2] = "x"; return r end
function nothing(w, W, L, rng) return 7 end
function missing(w, W, L, rng) local r = full_random(w, W, L, rng); r.positions = nil; return r end
function vocab(w, W, L, rng) local r = full_random(w, W, L, rng); r.tokens[1] = 999; return r end
function order(w, W, L, rng) local r = full_random(w, W, L, rng); r.positions[2] = 0; return r end
function boom(w, W, L, rng) error("no rows today") end
function keep(w, W, L, rng) saved = rng; return full_random(w, W, L, rng) end
function late(w, W, L, rng) saved:below(3) end
)";
    const auto w = test_window(64);
    auto message = [&](const std::string& fn) {
        LuaSampler lua(code, fn);
        return error_of([&] { sample_row(*lua.sampler, w, 16, 1); });
    };
    auto has = [](const std::string& msg, const std::string& part) {
        return msg.find(part) != std::string::npos;
    };
    std::string m = message("short");
    EXPECT_TRUE(has(m, "lua:short (sampler_test.lua:1:): invalid row: 'tokens' has 15 entries, "
                       "the row has 16")) << m;
    m = message("text");
    EXPECT_TRUE(has(m, "'targets'[2] = x is not a 32-bit integer")) << m;
    m = message("nothing");
    EXPECT_TRUE(has(m, "must return a table {tokens =, positions =, targets =, mask =}, got a "
                       "number")) << m;
    m = message("missing");
    EXPECT_TRUE(has(m, "the result has no list 'positions'")) << m;
    m = message("vocab");
    EXPECT_TRUE(has(m, "lua:vocab: invalid row: token 999 at index 0 is outside the vocabulary")) << m;
    m = message("order");
    EXPECT_TRUE(has(m, "positions must increase strictly")) << m;
    m = message("boom");
    EXPECT_TRUE(has(m, "no rows today") && has(m, "stack traceback") &&
                has(m, "sampler_test.lua:")) << m;

    // the rng is disarmed when its call returns
    LuaSampler lua(code, "keep");
    sample_row(*lua.sampler, w, 16, 1);
    lua_State* L = lua.runtime.state();
    lua_getglobal(L, "late");
    auto late = std::make_shared<const lua::LuaRef>(L, -1);
    lua_pop(L, 1);
    lua::LuaRowSampler after(late, "late", "sampler_test.lua:1:", 259);
    m = error_of([&] { sample_row(after, w, 16, 1); });
    EXPECT_TRUE(has(m, "rng: used outside the sampler call it was passed to")) << m;
    EXPECT_EQ(lua_gettop(L), 0) << "the stack is left as found";
}

// Not a timing assertion: prints rows/s of the Lua sampler next to the C plugin, for the docs.
TEST(LuaSampler, SpeedNextToThePlugin) {
    LuaSampler lua(kFullRandom, "full_random");
    auto plugin = make_sampler("full", {{"span", std::string("random")}});
    const auto w = test_window(512);
    auto rate = [&](RowSampler& s) {
        const auto t0 = std::chrono::steady_clock::now();
        int n = 0;
        for (; n < 2000; ++n) sample_row(s, w, 128, n);
        return n / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    const double l = rate(*lua.sampler), c = rate(*plugin);
    std::printf("rows of 128 from windows of 512: Lua %.0f rows/s, C plugin %.0f rows/s\n", l, c);
    EXPECT_GT(l, 0.0);
}
