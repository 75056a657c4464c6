// ctx module: contextual sparsity (Deja Vu, model/sparsity.h) from recipes.
//   model:train_predictors{data = docs, tokens = 8192, ...} -> {recall_mlp = ..., ...}
//   model:save_predictors(path), model:load_predictors(path)
//   model:decode_score{data = docs, sparsity = {...}} -> {perplexity, decode_tokens_per_s, ...}
//   model:generate(prompt, {sparsity = {mlp = 0.8, heads = 0.5}}), ctx.run_eval{..., sparsity}
#include <lua.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include <spdlog/spdlog.h>
#include "data/shard.h"
#include "data/windows.h"
#include "io/sparsity_file.h"
#include "lua/ctx_module.h"
#include "lua/ctx_types.h"
#include "lua/options.h"
#include "lua/runtime.h"
#include "lua/userdata.h"

namespace ctx {

using lua::OptType;

namespace {


// n rows of `len` tokens spread evenly over the windows of docs: window slot i * parts + part
// of n * parts slots, so the rows of different parts (training, held out) never coincide.
std::vector<std::vector<int32_t>> spread_rows(const DocStore& docs, int len, int n, int part,
                                              int parts, const std::string& what) {
    const std::vector<Window> w = make_windows(docs, len - 1);  // a window reads Le + 1 tokens
    CTX_CHECK(static_cast<int64_t>(w.size()) >= static_cast<int64_t>(n) * parts,
              "{}: the documents hold {} windows of {} tokens; {} are needed", what, w.size(),
              len, static_cast<int64_t>(n) * parts);
    std::vector<std::vector<int32_t>> rows;
    const double step = static_cast<double>(w.size()) / (static_cast<double>(n) * parts);
    for (int i = 0; i < n; ++i) {
        const Window& win = w[static_cast<size_t>((static_cast<double>(i) * parts + part) * step)];
        std::vector<int32_t> r(static_cast<size_t>(len));
        docs.read(win.doc, win.start, len, r.data());
        rows.push_back(std::move(r));
    }
    return rows;
}

void push_list(lua_State* L, const std::vector<double>& v) {
    lua_createtable(L, static_cast<int>(v.size()), 0);
    for (size_t i = 0; i < v.size(); ++i) {
        lua_pushnumber(L, v[i]);
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
}

double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

}  // namespace

SparsityOptions parse_sparsity_option(lua_State* L, const lua::Options& o, const ModelHandle& h,
                                      const std::string& context, const std::string& where) {
    SparsityOptions s;
    const lua::LuaRef* ref = o.ref("sparsity");
    if (!ref) return s;
    ref->push();
    const auto so = lua::Options::parse(
        L, lua_gettop(L),
        {{"mlp", OptType::Number, false, "fraction of MLP hidden units skipped, in [0, 1)"},
         {"heads", OptType::Number, false, "fraction of attention heads skipped, in [0, 1)"},
         {"mlp_positive", OptType::Bool, false,
          "keep only units with a positive predictor score (ReLU models)"}},
        context + " sparsity", where);
    lua_pop(L, 1);
    if (!h.predictors)
        o.fail_key("sparsity", "needs sparsity predictors: model:train_predictors{...} or "
                               "model:load_predictors(path) first");
    s.predictors = h.predictors.get();
    s.units = static_cast<float>(so.number("mlp", 0.0));
    s.heads = static_cast<float>(so.number("heads", 0.0));
    s.units_positive = so.boolean("mlp_positive", false);
    if (!(s.units >= 0.0f && s.units < 1.0f))
        o.fail_key("sparsity", fmt::format("mlp must be in [0, 1), got {}", s.units));
    if (!(s.heads >= 0.0f && s.heads < 1.0f))
        o.fail_key("sparsity", fmt::format("heads must be in [0, 1), got {}", s.heads));
    return s;
}

// model:train_predictors{data = docs, tokens = 8192, held_out = 2048, row_len = Lt, ...}
int model_train_predictors(lua_State* L) {
    ModelHandle& h = check_model(L, 1);
    const std::string where = lua::caller_where(L);
    const auto o = lua::Options::parse(
        L, 2,
        {{"data", OptType::Any, true, "documents the model's activations are collected on"},
         {"tokens", OptType::Integer, false, "training tokens (default 8192)"},
         {"held_out", OptType::Integer, false, "held-out tokens for the recall (default 2048)"},
         {"row_len", OptType::Integer, false, "tokens per row (default: the trained length)"},
         {"mlp_rank", OptType::Integer, false, "rank of the MLP predictors (default 64)"},
         {"heads_rank", OptType::Integer, false, "rank of the head predictors (default 32)"},
         {"label_mlp", OptType::Number, false, "GELU/SwiGLU: fraction of units labelled 1 "
                                               "(default 0.25; ReLU: the active ones)"},
         {"label_heads", OptType::Number, false, "fraction of heads labelled 1 (default 0.5)"},
         {"epochs", OptType::Integer, false, "passes over the tokens (default 20)"},
         {"batch", OptType::Integer, false, "tokens per step (default 256)"},
         {"lr", OptType::Number, false, "AdamW learning rate (default 0.01)"},
         {"seed", OptType::Integer, false, "initialisation and shuffling (default 1)"},
         {"recall_mlp", OptType::Number, false, "keep fraction of the reported unit recall "
                                                "(default 0.25)"},
         {"recall_heads", OptType::Number, false, "keep fraction of the reported head recall "
                                                  "(default 0.5)"}},
        "model:train_predictors", where);
    const auto docs = lua::option_userdata<std::shared_ptr<DocStore>>(L, o, "data", kDocumentsType,
                                                                "a document set");
    const int row_len = static_cast<int>(o.integer("row_len", h.trained_length));
    const int64_t tokens = o.integer("tokens", 8192), held = o.integer("held_out", 2048);
    if (row_len < 2) o.fail_key("row_len", fmt::format("must be >= 2, got {}", row_len));
    if (tokens < row_len || held < row_len)
        o.fail_key(tokens < row_len ? "tokens" : "held_out",
                   fmt::format("must be at least one row of {} tokens", row_len));
    PredictorShape shape;
    shape.unit_rank = static_cast<int>(o.integer("mlp_rank", 64));
    shape.head_rank = static_cast<int>(o.integer("heads_rank", 32));
    shape.label_units = static_cast<float>(o.number("label_mlp", 0.25));
    shape.label_heads = static_cast<float>(o.number("label_heads", 0.5));
    PredictorTraining t;
    t.epochs = static_cast<int>(o.integer("epochs", 20));
    t.batch = static_cast<int>(o.integer("batch", 256));
    t.lr = static_cast<float>(o.number("lr", 1e-2));
    t.seed = static_cast<uint64_t>(o.integer("seed", 1));
    const float recall_units = static_cast<float>(o.number("recall_mlp", 0.25));
    const float recall_heads = static_cast<float>(o.number("recall_heads", 0.5));
    if (!(recall_units > 0 && recall_units <= 1))
        o.fail_key("recall_mlp", fmt::format("must be in (0, 1], got {}", recall_units));
    if (!(recall_heads > 0 && recall_heads <= 1))
        o.fail_key("recall_heads", fmt::format("must be in (0, 1], got {}", recall_heads));
    const int n_train = static_cast<int>(tokens / row_len), n_held = static_cast<int>(held / row_len);
    const int parts = 2;  // training rows from even slots, held-out from odd ones
    const std::string what = where + " model:train_predictors";
    // Every rank computes the same (small) predictors; no communication.
    const SparsityData train =
        collect_sparsity_data(*h.model, spread_rows(*docs, row_len, n_train, 0, parts, what));
    const SparsityData test =
        collect_sparsity_data(*h.model, spread_rows(*docs, row_len, n_held, 1, parts, what));
    auto p = std::make_shared<SparsityPredictors>(h.model->config(), h.model->backend(), shape,
                                                  t.seed);
    const PredictorLosses losses = train_predictors(*p, train, t);
    const PredictorRecall recall = predictor_recall(*p, test, recall_units, recall_heads);
    h.predictors = p;
    if (lua_detail::engine(L).comm->rank() == 0)
        spdlog::info("sparsity predictors: {} training tokens, {} held out; unit recall {:.3f} "
                     "at keep {}, head recall {:.3f} at keep {}", train.tokens, test.tokens,
                     recall.mean_units(), recall_units, recall.mean_heads(), recall_heads);
    lua_newtable(L);
    lua_pushnumber(L, recall.mean_units());
    lua_setfield(L, -2, "recall_mlp");
    lua_pushnumber(L, recall.mean_heads());
    lua_setfield(L, -2, "recall_heads");
    push_list(L, recall.units);
    lua_setfield(L, -2, "recall_mlp_by_layer");
    push_list(L, recall.heads);
    lua_setfield(L, -2, "recall_heads_by_layer");
    if (!recall.active_recall.empty()) {
        lua_pushnumber(L, mean(recall.active_recall));
        lua_setfield(L, -2, "recall_active");
        lua_pushnumber(L, mean(recall.active_selected));
        lua_setfield(L, -2, "selected_active");
    }
    push_list(L, losses.units_first);
    lua_setfield(L, -2, "loss_mlp_first");
    push_list(L, losses.units_last);
    lua_setfield(L, -2, "loss_mlp_last");
    push_list(L, losses.heads_first);
    lua_setfield(L, -2, "loss_heads_first");
    push_list(L, losses.heads_last);
    lua_setfield(L, -2, "loss_heads_last");
    lua_pushinteger(L, train.tokens);
    lua_setfield(L, -2, "tokens");
    return 1;
}

// model:decode_score{data = docs, rows = 4, row_len = 4 Lt, prefix = Lt, sparsity = {...}}:
// teacher-forced decoding of rows spread over the documents (score_by_decoding).
int model_decode_score(lua_State* L) {
    ModelHandle& h = check_model(L, 1);
    const std::string where = lua::caller_where(L);
    const auto o = lua::Options::parse(
        L, 2,
        {{"data", OptType::Any, true, "documents to take the rows from"},
         {"rows", OptType::Integer, false, "rows decoded together (default 4)"},
         {"row_len", OptType::Integer, false, "tokens per row (default 4 x the trained length)"},
         {"prefix", OptType::Integer, false, "tokens prefilled before decoding (default: the "
                                             "trained length)"},
         {"sparsity", OptType::Table, false, "{mlp = s, heads = s, mlp_positive = b}"}},
        "model:decode_score", where);
    const auto docs = lua::option_userdata<std::shared_ptr<DocStore>>(L, o, "data", kDocumentsType,
                                                                      "a document set");
    const int rows = static_cast<int>(o.integer("rows", 4));
    const int row_len = static_cast<int>(o.integer("row_len", 4 * h.trained_length));
    const int prefix = static_cast<int>(o.integer("prefix", h.trained_length));
    if (rows < 1) o.fail_key("rows", fmt::format("must be >= 1, got {}", rows));
    if (prefix < 1 || prefix >= row_len)
        o.fail_key("prefix", fmt::format("must be in [1, row_len = {}), got {}", row_len, prefix));
    const SparsityOptions sp = parse_sparsity_option(L, o, h, "model:decode_score", where);
    const DecodeScore s = score_by_decoding(
        *h.model, spread_rows(*docs, row_len, rows, 0, 1, where + " model:decode_score"), prefix,
        sp);
    lua_newtable(L);
    lua_pushnumber(L, s.perplexity());
    lua_setfield(L, -2, "perplexity");
    lua_pushnumber(L, s.nll_sum / static_cast<double>(std::max<int64_t>(s.tokens, 1)));
    lua_setfield(L, -2, "nll");
    lua_pushinteger(L, s.tokens);
    lua_setfield(L, -2, "tokens");
    lua_pushnumber(L, s.decode_tokens_per_s());
    lua_setfield(L, -2, "decode_tokens_per_s");
    lua_pushnumber(L, s.decode_seconds);
    lua_setfield(L, -2, "decode_seconds");
    return 1;
}

void save_predictors_beside(lua_State* L, const ModelHandle& h, const std::string& dir) {
    if (!h.predictors) return;
    const std::string path = (std::filesystem::path(dir) / kPredictorsFile).string();
    on_rank0(*lua_detail::engine(L).comm, [&] { save_predictors(*h.predictors, path); });
}

void load_predictors_beside(lua_State* L, ModelHandle& h, const std::string& dir) {
    const std::string path = (std::filesystem::path(dir) / kPredictorsFile).string();
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) return;
    const bool logs = lua_detail::engine(L).comm->rank() == 0;
    try {
        h.predictors = load_predictors(path, h.model->config(), h.model->backend());
        if (logs) spdlog::info("sparsity predictors loaded from {}", path);
    } catch (const Error& e) {  // another model's file in a shared directory: say so, go on
        if (logs) spdlog::warn("sparsity predictors not loaded: {}", e.what());
    }
}

// model:save_predictors(path): rank 0 writes (collective)
int model_save_predictors(lua_State* L) {
    ModelHandle& h = check_model(L, 1);
    const std::string path = luaL_checkstring(L, 2);
    CTX_CHECK(h.predictors, "{} model:save_predictors: the model has no predictors "
              "(model:train_predictors or model:load_predictors first)", lua::caller_where(L));
    on_rank0(*lua_detail::engine(L).comm, [&] { save_predictors(*h.predictors, path); });
    return 0;
}

// model:load_predictors(path)
int model_load_predictors(lua_State* L) {
    ModelHandle& h = check_model(L, 1);
    const std::string path = luaL_checkstring(L, 2);
    h.predictors = load_predictors(path, h.model->config(), h.model->backend());
    return 0;
}

}  // namespace ctx
