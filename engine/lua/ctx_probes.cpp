// ctx module: probes written in Lua, model:logprobs and model:generate (docs/EVAL.md, "Probes
// written in Lua"). Registered as model methods by ctx_model.cpp.
#include <lua.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "eval/eval_plugin.h"
#include "lua/ctx_module.h"
#include "lua/ctx_tokenizer.h"
#include "lua/ctx_types.h"
#include "lua/options.h"
#include "lua/runtime.h"
#include "model/generate.h"

namespace ctx {
namespace {

using lua::OptType;


// The Lua sequence at `index` as token ids (T = int32_t: integers >= 0) or numbers (float), or
// an error naming `what`.
template <class T>
std::vector<T> lua_list(lua_State* L, int index, const std::string& what) {
    constexpr bool ids = std::is_integral_v<T>;
    index = lua_absindex(L, index);
    CTX_CHECK(lua_istable(L, index), "{} must be a list of {}, got a {}", what,
              ids ? "token ids" : "numbers", luaL_typename(L, index));
    const lua_Integer n = luaL_len(L, index);
    std::vector<T> out(static_cast<size_t>(n));
    for (lua_Integer i = 1; i <= n; ++i) {
        lua_rawgeti(L, index, i);
        int ok = 0;
        if constexpr (ids) {
            const lua_Integer v = lua_tointegerx(L, -1, &ok);
            ok = ok && v >= 0 && v <= INT32_MAX;
            out[static_cast<size_t>(i - 1)] = static_cast<T>(v);
        } else {
            out[static_cast<size_t>(i - 1)] = static_cast<T>(lua_tonumberx(L, -1, &ok));
        }
        lua_pop(L, 1);
        CTX_CHECK(ok, "{}[{}] must be {}", what, i,
                  ids ? "a token id (an integer >= 0)" : "a number");
    }
    return out;
}

std::vector<int32_t> int_list(lua_State* L, int index, const std::string& what) {
    return lua_list<int32_t>(L, index, what);
}
std::vector<float> number_list(lua_State* L, int index, const std::string& what) {
    return lua_list<float>(L, index, what);
}

// A batch argument: a list of lists (rows) or one list (a single row; *single = true).
bool is_batch(lua_State* L, int index) {
    if (!lua_istable(L, index)) return false;
    const int t = lua_rawgeti(L, index, 1);
    lua_pop(L, 1);
    return t == LUA_TTABLE || t == LUA_TSTRING;
}

void push_floats(lua_State* L, const float* v, size_t n) {
    lua_createtable(L, static_cast<int>(n), 0);
    for (size_t i = 0; i < n; ++i) {
        lua_pushnumber(L, v[i]);
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
}

// model:logprobs(tokens [, {positions =, window =}]) -> {log p(tokens[i+1] | tokens[1..i])}
// tokens: one sequence of n >= 2 ids, or a list of sequences of one length (then a list of
// results). positions: the n positions of the sequence (of every sequence), default 0 .. n-1.
// Every rank must call it alike: rows are split across ranks and gathered.
}  // namespace

int model_logprobs(lua_State* L) {
    ModelHandle& h = check_model(L, 1);
    const std::string where = lua::caller_where(L);
    const bool batch = is_batch(L, 2);
    std::vector<std::vector<int32_t>> seqs;
    if (batch) {
        for (lua_Integer i = 1; i <= luaL_len(L, 2); ++i) {
            lua_rawgeti(L, 2, i);
            seqs.push_back(int_list(L, -1, fmt::format("model:logprobs: tokens[{}]", i)));
            lua_pop(L, 1);
        }
    } else {
        seqs.push_back(int_list(L, 2, "model:logprobs: tokens"));
    }
    if (lua_isnoneornil(L, 3)) lua_pushnil(L);
    const auto o = lua::Options::parse(
        L, lua_isnoneornil(L, 3) ? lua_gettop(L) : 3,
        {{"positions", OptType::Table, false, "the sequence's positions (default 0 .. n-1)"},
         {"window", OptType::Integer, false, "attend only to the last `window` tokens"}},
        "model:logprobs", where);
    CTX_CHECK(!seqs.empty(), "model:logprobs: no sequences");
    const size_t n = seqs[0].size();
    CTX_CHECK(n >= 2, "model:logprobs: a sequence needs at least 2 tokens, got {}", n);
    const int32_t V = h.model->config().vocab_size;
    for (size_t r = 0; r < seqs.size(); ++r) {
        CTX_CHECK(seqs[r].size() == n, "model:logprobs: every sequence must have the length of the "
                  "first ({}), sequence {} has {}", n, r + 1, seqs[r].size());
        for (int32_t t : seqs[r])
            CTX_CHECK(t < V, "model:logprobs: token {} is outside the vocabulary [0, {})", t, V);
    }
    std::vector<float> pos(n);
    for (size_t i = 0; i < n; ++i) pos[i] = static_cast<float>(i);
    if (const lua::LuaRef* ref = o.ref("positions")) {
        ref->push();
        pos = number_list(L, -1, "model:logprobs: positions");
        lua_pop(L, 1);
        CTX_CHECK(pos.size() == n, "model:logprobs: positions has {} entries, the sequence {}",
                  pos.size(), n);
    }
    const size_t T = n - 1, R = seqs.size();
    std::vector<int32_t> tokens(R * T), targets(R * T);
    std::vector<float> positions(R * T), out(R * T);
    for (size_t r = 0; r < R; ++r)
        for (size_t t = 0; t < T; ++t) {
            tokens[r * T + t] = seqs[r][t];
            targets[r * T + t] = seqs[r][t + 1];
            positions[r * T + t] = pos[t];
        }
    ctx_score_request q{};
    q.struct_size = sizeof q;
    q.tokens = tokens.data();
    q.positions = positions.data();
    q.targets = targets.data();
    q.n_rows = static_cast<int64_t>(R);
    q.row_len = static_cast<int64_t>(T);
    q.window = static_cast<int32_t>(o.integer("window", 0));
    q.logprobs = out.data();
    BatchBuffers rows;
    score_rows(*h.model, lua_detail::engine(L).data_comm(), rows, q);
    if (!batch) {
        push_floats(L, out.data(), T);
        return 1;
    }
    lua_createtable(L, static_cast<int>(R), 0);
    for (size_t r = 0; r < R; ++r) {
        push_floats(L, out.data() + r * T, T);
        lua_rawseti(L, -2, static_cast<lua_Integer>(r + 1));
    }
    return 1;
}

// model:generate(prompt [, {max_new_tokens = 32, stop = {...}, positions = {...},
//                           tokenizer = tok, window = 0}]) -> {tokens =, finish =, text =}
// Greedy, with a key/value cache (model/generate.h). prompt: token ids, or text with `tokenizer`;
// or a list of prompts (then a list of results). stop: token ids and / or strings (strings need
// the tokenizer). positions: the prompt's positions (one prompt only). Prompts are split across
// ranks and the results gathered, so every rank must call it alike.
int model_generate(lua_State* L) {
    ModelHandle& h = check_model(L, 1);
    const std::string where = lua::caller_where(L);
    if (lua_isnoneornil(L, 3)) lua_pushnil(L);
    const auto o = lua::Options::parse(
        L, lua_isnoneornil(L, 3) ? lua_gettop(L) : 3,
        {{"max_new_tokens", OptType::Integer, false, "tokens to generate at most (default 32)"},
         {"stop", OptType::Table, false, "token ids and / or strings that end a row"},
         {"positions", OptType::Table, false, "the prompt's positions (default 0 .. n-1)"},
         {"tokenizer", OptType::Any, false, "a ctx.Tokenizer: text prompts, stop strings, text"},
         {"window", OptType::Integer, false, "attend only to the last `window` tokens"},
         {"sparsity", OptType::Table, false, "{mlp = s, heads = s, mlp_positive = b}: decode "
                                             "with contextual sparsity (model:train_predictors)"}},
        "model:generate", where);
    TokenizerRef tok;
    if (const lua::LuaRef* ref = o.ref("tokenizer")) {
        ref->push();
        tok = test_tokenizer(L, -1);
        lua_pop(L, 1);
        if (!tok) o.fail_key("tokenizer", "expects a ctx.Tokenizer");
    }
    auto prompt_at = [&](int index, const std::string& what) {
        if (lua_type(L, index) == LUA_TSTRING) {
            CTX_CHECK(tok, "{}: a text prompt needs the `tokenizer` option", what);
            return tok->encode(lua_tostring(L, index));
        }
        return int_list(L, index, what);
    };
    const bool batch = is_batch(L, 2);
    std::vector<std::vector<int32_t>> prompts;
    if (batch) {
        for (lua_Integer i = 1; i <= luaL_len(L, 2); ++i) {
            lua_rawgeti(L, 2, i);
            prompts.push_back(prompt_at(lua_gettop(L), fmt::format("model:generate: prompt {}", i)));
            lua_pop(L, 1);
        }
    } else {
        prompts.push_back(prompt_at(2, "model:generate: prompt"));
    }
    const int32_t V = h.model->config().vocab_size;
    for (const auto& p : prompts) {
        CTX_CHECK(!p.empty(), "model:generate: a prompt needs at least one token");
        for (int32_t t : p)
            CTX_CHECK(t < V, "model:generate: token {} is outside the vocabulary [0, {})", t, V);
    }
    GenerateOptions g;
    g.max_new_tokens = static_cast<int>(o.integer("max_new_tokens", 32));
    if (g.max_new_tokens < 1 || g.max_new_tokens > (1 << 20))
        o.fail_key("max_new_tokens", fmt::format("must be in [1, 2^20], got {}", g.max_new_tokens));
    g.window = static_cast<int>(o.integer("window", 0));
    g.sparsity = parse_sparsity_option(L, o, h, "model:generate", where);
    if (const lua::LuaRef* ref = o.ref("stop")) {
        ref->push();
        for (lua_Integer i = 1; i <= luaL_len(L, -1); ++i) {
            lua_rawgeti(L, -1, i);
            if (lua_type(L, -1) == LUA_TSTRING) {
                g.stop_strings.push_back(lua_tostring(L, -1));
            } else {
                int ok = 0;
                const lua_Integer v = lua_tointegerx(L, -1, &ok);
                if (!ok || v < 0 || v >= V)
                    o.fail_key("stop", fmt::format("entry {} must be a token id in [0, {}) or a "
                                                   "string", i, V));
                g.stop_tokens.push_back(static_cast<int32_t>(v));
            }
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    if (!g.stop_strings.empty() && !tok) o.fail_key("stop", "strings need the `tokenizer` option");
    if (tok) g.decode = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids); };
    std::vector<std::vector<float>> positions;
    if (const lua::LuaRef* ref = o.ref("positions")) {
        CTX_CHECK(prompts.size() == 1, "model:generate: positions apply to one prompt");
        ref->push();
        positions.push_back(number_list(L, -1, "model:generate: positions"));
        lua_pop(L, 1);
        CTX_CHECK(positions[0].size() == prompts[0].size(),
                  "model:generate: positions has {} entries, the prompt {}", positions[0].size(),
                  prompts[0].size());
    }
    // Prompt i on rank i % world; the results travel as floats (count, finish, tokens), summed.
    Comm& comm = lua_detail::engine(L).data_comm();  // prompts split over data-parallel ranks
    const size_t P = prompts.size(), stride = static_cast<size_t>(g.max_new_tokens) + 2;
    std::vector<float> packed(P * stride, 0.0f);
    std::vector<std::vector<int32_t>> mine;
    std::vector<std::vector<float>> mine_pos;
    std::vector<size_t> index;
    for (size_t i = static_cast<size_t>(comm.rank()); i < P; i += static_cast<size_t>(comm.size())) {
        mine.push_back(prompts[i]);
        if (!positions.empty()) mine_pos.push_back(positions[i]);
        index.push_back(i);
    }
    if (!mine.empty()) {
        const std::vector<GenerateResult> res = generate(*h.model, mine, g, mine_pos);
        for (size_t k = 0; k < res.size(); ++k) {
            float* slot = packed.data() + index[k] * stride;
            slot[0] = static_cast<float>(res[k].tokens.size());
            slot[1] = static_cast<float>(static_cast<int>(res[k].finish));
            for (size_t t = 0; t < res[k].tokens.size(); ++t) slot[2 + t] = float(res[k].tokens[t]);
        }
    }
    comm.allreduce_sum(packed.data(), packed.size());
    auto push_result = [&](size_t i) {
        const float* slot = packed.data() + i * stride;
        GenerateResult r;
        r.finish = static_cast<GenerateResult::Finish>(static_cast<int>(slot[1]));
        for (int t = 0; t < static_cast<int>(slot[0]); ++t)
            r.tokens.push_back(static_cast<int32_t>(slot[2 + t]));
        lua_createtable(L, 0, 3);
        lua_createtable(L, static_cast<int>(r.tokens.size()), 0);
        for (size_t t = 0; t < r.tokens.size(); ++t) {
            lua_pushinteger(L, r.tokens[t]);
            lua_rawseti(L, -2, static_cast<lua_Integer>(t + 1));
        }
        lua_setfield(L, -2, "tokens");
        lua_pushstring(L, finish_name(r.finish));
        lua_setfield(L, -2, "finish");
        if (tok) {
            std::string text = tok->decode(r.tokens);
            if (r.finish == GenerateResult::Finish::StopString)
                for (const std::string& s : g.stop_strings)
                    if (const size_t at = text.find(s); at != std::string::npos) text.resize(at);
            lua_pushlstring(L, text.data(), text.size());
            lua_setfield(L, -2, "text");
        }
    };
    if (!batch) {
        push_result(0);
        return 1;
    }
    lua_createtable(L, static_cast<int>(P), 0);
    for (size_t i = 0; i < P; ++i) {
        push_result(i);
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
    return 1;
}

}  // namespace ctx
