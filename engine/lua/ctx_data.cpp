// ctx module: long-document data. ctx.data.corpus (the generated default corpus as shards),
// ctx.data.shard, ctx.sampler and ctx.data.rows (windows -> sampler -> training rows).
#include <algorithm>
#include <cmath>
#include <functional>

#include <lua.hpp>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/file_util.h"
#include "data/corpus_shards.h"
#include "data/recall_qa.h"
#include "data/mix_sampler.h"
#include "data/row_stream.h"
#include "data/row_stream_source.h"
#include "data/shard.h"
#include "data/windows.h"
#include "data/tokenizer.h"
#include "lua/ctx_module.h"
#include "lua/ctx_tokenizer.h"
#include "lua/ctx_types.h"
#include "lua/lua_guard.h"
#include "lua/lua_sampler.h"
#include "lua/userdata.h"
#include "plugin/sampler_plugin.h"

namespace ctx {
namespace {

using lua::guarded;
using lua::OptSpec;
using lua::OptType;

constexpr const char* kSamplerSpecType = "ctx.SamplerSpec";

// ctx.sampler(name, options) or ctx.sampler.mix{...}: a tree of resolved sampler plugins with
// validated options, instantiated once per row stream.
struct SamplerNode {
    const LoadedPlugin* lib = nullptr;  // a plugin leaf, or nullptr for a mix or a Lua leaf
    lua::Options options;
    std::shared_ptr<const lua::LuaRef> lua_fn;  // a Lua leaf (ctx.sampler.lua)
    std::string lua_name, lua_where;
    struct Child {
        double weight = 1;
        int64_t window = 0;
        std::shared_ptr<const SamplerNode> node;
    };
    std::vector<Child> children;  // a mix
};

struct SamplerSpec {
    std::shared_ptr<const SamplerNode> node;
};

std::unique_ptr<RowSampler> instantiate(const SamplerNode& n, int32_t vocab, uint64_t seed) {
    if (n.lib) return std::make_unique<SamplerPlugin>(*n.lib, n.options, vocab, seed);
    if (n.lua_fn)
        return std::make_unique<lua::LuaRowSampler>(n.lua_fn, n.lua_name, n.lua_where, vocab);
    std::vector<MixChild> kids;
    for (const SamplerNode::Child& c : n.children)
        kids.push_back(MixChild{c.weight, c.window, instantiate(*c.node, vocab, seed)});
    return std::make_unique<MixSampler>(std::move(kids));
}

DocumentsRef check_documents(lua_State* L, const lua::Options& o, const std::string& key) {
    return lua::option_userdata<DocumentsRef>(L, o, key, kDocumentsType,
                                              "documents (ctx.data.corpus{...}.train, "
                                              "ctx.data.shard(path), ctx.data.documents{...})");
}

// Runs write() on rank 0 only, then every rank raises rank 0's error, if any: the broadcast also
// makes the other ranks wait until the files exist.
void on_rank0(lua_State* L, const std::string& where, const char* what,
              const std::function<void()>& write) {
    EngineContext& engine = lua_detail::engine(L);
    std::string error;
    if (engine.comm->rank() == 0) {
        try {
            write();
        } catch (const std::exception& e) {
            error = e.what();
        }
    }
    uint64_t len = error.size();
    engine.comm->broadcast(&len, sizeof len, 0);
    error.resize(len);
    if (len) engine.comm->broadcast(error.data(), len, 0);
    if (!error.empty()) fail("{} {}: {}", where, what, error);
}

// The generator options shared by ctx.data.corpus and ctx.data.recall_qa's corpus table.
std::vector<OptSpec> corpus_schema() {
    return {{"docs", OptType::Integer, false, "number of documents"},
            {"min_len", OptType::Integer, false, "shortest document (bytes)"},
            {"max_len", OptType::Integer, false, "longest document (bytes)"},
            {"seed", OptType::Integer, false, "corpus seed"},
            {"facts", OptType::Integer, false, "facts live at once per document"},
            {"recall_rate", OptType::Number, false, "probability a due fact is recalled"},
            {"min_distance", OptType::Integer, false, "shortest recall distance (bytes)"},
            {"max_distance", OptType::Integer, false, "longest recall distance (bytes)"},
            {"far_fraction", OptType::Number, false,
             "probability a recall distance comes from [max_distance, far_distance] instead"},
            {"far_distance", OptType::Integer, false, "longest far recall distance (bytes)"},
            {"local_repeat", OptType::Number, false,
             "probability a filler name/thing/place is its paragraph's own (0..1)"}};
}

CorpusOptions corpus_options(const lua::Options& o) {
    CorpusOptions c;
    c.n_docs = o.integer("docs", c.n_docs);
    c.min_len = o.integer("min_len", c.min_len);
    c.max_len = o.integer("max_len", c.max_len);
    c.seed = static_cast<uint64_t>(o.integer("seed", static_cast<int64_t>(c.seed)));
    c.facts_per_doc = static_cast<int>(o.integer("facts", c.facts_per_doc));
    c.recall_rate = o.number("recall_rate", c.recall_rate);
    c.min_distance = o.integer("min_distance", c.min_distance);
    c.max_distance = o.integer("max_distance", c.max_distance);
    c.far_fraction = o.number("far_fraction", c.far_fraction);
    c.far_distance = o.integer("far_distance", c.far_distance);
    c.local_repeat = o.number("local_repeat", c.local_repeat);
    return c;
}

// ctx.data.recall_qa{out = "x.jsonl", corpus = {...ctx.data.corpus options}, context = 512,
//                    docs = 100, first_doc = N, max_items = 0, min_distance = 0} -> items written
// AltQA-shaped question rows from generated documents (data/recall_qa.h); rank 0 writes the file
// (atomically), every rank returns the count. first_doc defaults to corpus.docs: documents the
// corpus of those options never contained.
int l_recall_qa(lua_State* L) {
    const std::string where = lua::caller_where(L);
    const auto o = lua::Options::parse(
        L, 1,
        {{"out", OptType::String, true, "the JSONL file to write"},
         {"corpus", OptType::Table, false, "generator options (as ctx.data.corpus; dir and "
                                           "val_fraction are ignored)"},
         {"context", OptType::Integer, true, "prompt length in bytes"},
         {"docs", OptType::Integer, false, "documents to draw questions from (default 100)"},
         {"first_doc", OptType::Integer, false, "index of the first (default: corpus.docs)"},
         {"max_items", OptType::Integer, false, "at most this many items (0: all)"},
         {"min_distance", OptType::Integer, false, "only answers mentioned at least this far back"}},
        "ctx.data.recall_qa", where);
    RecallQaOptions q;
    if (const lua::LuaRef* ref = o.ref("corpus")) {
        ref->push();
        std::vector<OptSpec> schema = corpus_schema();
        schema.push_back({"dir", OptType::Any, false, "ignored"});
        schema.push_back({"val_fraction", OptType::Any, false, "ignored"});
        const auto c = lua::Options::parse(L, lua_gettop(L), schema, "ctx.data.recall_qa corpus", where);
        q.corpus = corpus_options(c);
        lua_pop(L, 1);
    }
    q.context = o.integer("context", 0);
    q.docs = o.integer("docs", 100);
    q.first_doc = o.integer("first_doc", q.corpus.n_docs);
    q.max_items = o.integer("max_items", 0);
    q.min_distance = o.integer("min_distance", 0);
    std::vector<RecallQaItem> items;
    try {
        items = make_recall_qa(q);
    } catch (const Error& e) {
        fail("{} ctx.data.recall_qa: {}", where, e.what());
    }
    const std::string out = o.string("out", "");
    on_rank0(L, where, "ctx.data.recall_qa", [&] {
        std::string text;
        for (const RecallQaItem& it : items) text += recall_qa_jsonl(it) + "\n";
        write_file_atomic(out, text);
    });
    lua_pushinteger(L, static_cast<lua_Integer>(items.size()));
    return 1;
}

// ctx.data.corpus{dir = "data/generated/default", docs = 400, ...} -> {train =, val =, dir =}
int l_corpus(lua_State* L) {
    const std::string where = lua::caller_where(L);
    std::vector<OptSpec> schema = corpus_schema();
    schema.push_back({"dir", OptType::String, true, "where the shards live (generated when missing)"});
    schema.push_back({"val_fraction", OptType::Number, false, "documents held out for validation"});
    schema.push_back({"bpe", OptType::Integer, false,
                      "tokens: 0 = bytes (default), N = a byte-level BPE of N tokens trained on "
                      "the train split (saved as <dir>/tokenizer.json)"});
    const auto o = lua::Options::parse(L, 1, schema, "ctx.data.corpus", where);
    const CorpusOptions c = corpus_options(o);
    const double val_fraction = o.number("val_fraction", 0.1);
    const std::string dir = o.string("dir", "");
    const int64_t bpe = o.integer("bpe", 0);
    if (bpe != 0 && (bpe < 257 || bpe > (1 << 24)))
        o.fail_key("bpe", fmt::format("must be 0 (bytes) or a vocabulary size in [257, {}], got {}",
                                      1 << 24, bpe));
    // Rank 0 writes; the others wait and then read the same files.
    on_rank0(L, where, "ctx.data.corpus", [&] {
        const CorpusShards s = write_corpus_shards(dir, c, val_fraction, static_cast<int32_t>(bpe));
        spdlog::info("corpus {}: {} train + {} validation documents, {} tokens ({})", dir,
                     s.train_lengths.size(), s.val_lengths.size(),
                     bpe > 0 ? fmt::format("BPE, vocabulary {}", s.vocab_size) : "bytes",
                     s.reused ? "reused" : "generated");
    });

    lua_createtable(L, 0, 4);
    *lua::new_userdata<TokenizerRef>(L, kTokenizerType) =
        load_tokenizer(bpe > 0 ? dir + "/tokenizer.json" : "byte");
    lua_setfield(L, -2, "tokenizer");
    push_documents(L, std::make_shared<ShardReader>(dir + "/train.shard"));
    lua_setfield(L, -2, "train");
    push_documents(L, std::make_shared<ShardReader>(dir + "/val.shard"));
    lua_setfield(L, -2, "val");
    lua_pushstring(L, dir.c_str());
    lua_setfield(L, -2, "dir");
    return 1;
}

// ctx.data.shard(path) -> documents
int l_shard(lua_State* L) {
    push_documents(L, std::make_shared<ShardReader>(luaL_checkstring(L, 1)));
    return 1;
}

int l_sampler(lua_State* L) {
    const std::string name = luaL_checkstring(L, 1);
    const std::string where = lua::caller_where(L);
    const std::string full = name.rfind("sampler/", 0) == 0 ? name : "sampler/" + name;
    EngineContext& engine = lua_detail::engine(L);
    const LoadedPlugin* lib = engine.registry->find(full);
    if (!lib) {
        try {
            engine.registry->get(full);
        } catch (const Error& e) {
            fail("{} {}", where, e.what());
        }
    }
    if (lua_isnoneornil(L, 2)) lua_pushnil(L);
    const int idx = lua_isnoneornil(L, 2) ? lua_gettop(L) : 2;
    lua::Options options = lua::Options::parse(L, idx, plugin_option_schema(*lib->descriptor),
                                               full + " options", where);
    auto node = std::make_shared<SamplerNode>();
    node->lib = lib;
    node->options = std::move(options);
    lua::new_userdata<SamplerSpec>(L, kSamplerSpecType)->node = std::move(node);
    return 1;
}

// ctx.sampler.lua(fn [, {name = "..."}]): rows from a recipe function (lua/lua_sampler.h).
int l_sampler_lua(lua_State* L) {
    const std::string where = lua::caller_where(L);
    if (!lua_isfunction(L, 1))
        fail("{} ctx.sampler.lua: expects a function(window, window_len, row_len, rng) returning "
             "{{tokens =, positions =, targets =, mask =}}, got a {}", where, luaL_typename(L, 1));
    if (lua_isnoneornil(L, 2)) lua_pushnil(L);
    const int idx = lua_isnoneornil(L, 2) ? lua_gettop(L) : 2;
    const auto o = lua::Options::parse(
        L, idx, {{"name", OptType::String, false, "shown in logs and errors (default: function)"}},
        "ctx.sampler.lua", where);
    auto node = std::make_shared<SamplerNode>();
    node->lua_fn = std::make_shared<const lua::LuaRef>(L, 1);
    node->lua_name = o.string("name", "function");
    node->lua_where = where;
    lua::new_userdata<SamplerSpec>(L, kSamplerSpecType)->node = std::move(node);
    return 1;
}

// ctx.sampler("chunk", {...}) goes through the table's __call: drop the table argument.
int l_sampler_call(lua_State* L) {
    lua_remove(L, 1);
    return l_sampler(L);
}

// The SamplerSpec at the top of the stack, or a name there turned into one (in place).
const SamplerSpec* to_sampler_spec(lua_State* L) {
    if (lua_type(L, -1) == LUA_TSTRING) {
        lua_pushcfunction(L, guarded<l_sampler>);
        lua_insert(L, -2);
        lua_call(L, 1, 1);
    }
    return lua::test_userdata<SamplerSpec>(L, -1, kSamplerSpecType);
}

// ctx.sampler.mix{ {weight = 0.25, sampler = "full"},
//                  {weight = 0.75, sampler = ctx.sampler("chunk", {alpha = 0.25}), window = 512} }
int l_sampler_mix(lua_State* L) {
    const std::string where = lua::caller_where(L);
    const char* what = "ctx.sampler.mix";
    if (!lua_istable(L, 1))
        fail("{} {}: expects a list of {{weight =, sampler =, window =}} tables", where, what);
    const auto n = static_cast<lua_Integer>(lua_rawlen(L, 1));
    lua_pushnil(L);
    while (lua_next(L, 1)) {  // only the array part 1..n may be present
        lua_pop(L, 1);
        if (!(lua_isinteger(L, -1) && lua_tointeger(L, -1) >= 1 && lua_tointeger(L, -1) <= n)) {
            lua_pushvalue(L, -1);
            const std::string key = luaL_tolstring(L, -1, nullptr);
            fail("{} {}: expects a list of child tables, found key '{}'", where, what, key);
        }
    }
    if (n == 0) fail("{} {}: needs at least one child", where, what);
    auto node = std::make_shared<SamplerNode>();
    for (lua_Integer i = 1; i <= n; ++i) {
        lua_rawgeti(L, 1, i);
        const int idx = lua_gettop(L);
        const auto o = lua::Options::parse(
            L, idx,
            {{"weight", OptType::Number, true, "relative frequency of this child's rows (> 0)"},
             {"sampler", OptType::Any, true, "ctx.sampler(name, options), a name or a mix"},
             {"window", OptType::Integer, false,
              "use only the first `window` positions of the stream's window (default: all)"}},
            fmt::format("{} child {}", what, i), where);
        SamplerNode::Child c;
        c.weight = o.number("weight", 0);
        c.window = o.integer("window", 0);
        if (!(std::isfinite(c.weight) && c.weight > 0))
            o.fail_key("weight", fmt::format("must be finite and > 0, got {}", c.weight));
        if (o.has("window") && c.window <= 0)
            o.fail_key("window", fmt::format("must be positive, got {}", c.window));
        o.ref("sampler")->push();
        const SamplerSpec* spec = to_sampler_spec(L);
        if (!spec) o.fail_key("sampler", "expects ctx.sampler(name, options), a name or a mix");
        c.node = spec->node;
        node->children.push_back(std::move(c));
        lua_settop(L, idx - 1);
    }
    lua::new_userdata<SamplerSpec>(L, kSamplerSpecType)->node = std::move(node);
    return 1;
}

// curriculum = {{steps = 200, window = 256}, {steps = 200, window = 384}, {window = 512}}
std::vector<CurriculumStage> parse_curriculum(lua_State* L, const lua::Options& o,
                                              const std::string& where) {
    o.ref("curriculum")->push();
    const int t = lua_gettop(L);
    const auto n = static_cast<lua_Integer>(lua_rawlen(L, t));
    if (n == 0) o.fail_key("curriculum", "needs at least one stage {steps = N, window = Le}");
    std::vector<CurriculumStage> stages;
    for (lua_Integer i = 1; i <= n; ++i) {
        lua_rawgeti(L, t, i);
        const bool last = i == n;
        const auto s = lua::Options::parse(
            L, lua_gettop(L),
            {{"steps", OptType::Integer, !last, "steps (batches) in this stage; the last stage "
                                                "runs until the end"},
             {"window", OptType::Integer, true, "Le of this stage"}},
            fmt::format("ctx.data.rows curriculum stage {}", i), where);
        CurriculumStage st{s.integer("steps", 0), s.integer("window", 0)};
        if (s.has("steps") && st.steps <= 0)
            s.fail_key("steps", fmt::format("must be positive, got {}", st.steps));
        if (st.window <= 0) s.fail_key("window", fmt::format("must be positive, got {}", st.window));
        stages.push_back(st);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return stages;
}

// ctx.data.rows{docs =, sampler =, window = Le, row_len = Lt, batch_size = B, seed = S}
// or, with Le growing by step, curriculum = {{steps = 200, window = 256}, {window = 512}}
int l_rows(lua_State* L) {
    const std::string where = lua::caller_where(L);
    const auto o = lua::Options::parse(
        L, 1,
        {{"docs", OptType::Any, true, "training documents"},
         {"sampler", OptType::Any, false,
          "ctx.sampler(name, options), ctx.sampler.mix{...} or a name (default full)"},
         {"window", OptType::Integer, false, "window length Le the sampler draws from"},
         {"curriculum", OptType::Table, false,
          "stages of growing Le instead of window: {{steps = N, window = Le}, ..., {window = Le}}"},
         {"row_len", OptType::Integer, false, "tokens per row (default: window)"},
         {"batch_size", OptType::Integer, true, "rows per rank per step"},
         {"seed", OptType::Integer, false, "order and sampling seed"},
         {"pack", OptType::String, false,
          "restart | continue: documents end to end, several per window, attention masked "
          "between them; positions restart per document or continue (default: one document "
          "per window)"}},
        "ctx.data.rows", where);
    DocumentsRef docs = check_documents(L, o, "docs");
    PackPositions pack = PackPositions::None;
    if (o.has("pack")) {
        pack = o.choice("pack", "restart", {"restart", "continue"}) == "restart"
                   ? PackPositions::Restart
                   : PackPositions::Continue;
        std::vector<int64_t> ids(static_cast<size_t>(docs->n_docs()));
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
        docs = std::make_shared<PackedDocs>(docs, ids);
    }
    const SamplerSpec* spec = nullptr;
    if (const lua::LuaRef* ref = o.ref("sampler")) {
        ref->push();
        spec = to_sampler_spec(L);
        if (!spec) o.fail_key("sampler", "expects ctx.sampler(name, options), ctx.sampler.mix{...} or a name");
    } else {
        lua_pushstring(L, "full");
        spec = to_sampler_spec(L);
    }
    if (o.has("window") == o.has("curriculum"))
        fail("{} ctx.data.rows: give exactly one of 'window' (one Le) and 'curriculum' (stages "
             "of growing Le)", where);
    std::vector<CurriculumStage> stages;
    if (o.has("curriculum")) stages = parse_curriculum(L, o, where);
    else stages.push_back(CurriculumStage{0, o.integer("window", 0)});

    EngineContext& engine = lua_detail::engine(L);
    RowStreamConfig c;
    c.window_len = stages.front().window;
    int64_t max_window = 0;
    for (const CurriculumStage& s : stages) max_window = std::max(max_window, s.window);
    c.row_len = o.integer("row_len", c.window_len);
    c.batch_size = static_cast<int>(o.integer("batch_size", 0));
    c.seed = static_cast<uint64_t>(o.integer("seed", 1));
    c.rank = engine.data_comm().rank();  // data-parallel ranks read different rows
    c.world = engine.data_comm().size();
    c.pack = pack;
    if (c.window_len <= 0) o.fail_key("window", fmt::format("must be positive, got {}", c.window_len));
    if (c.row_len <= 0 || c.row_len > c.window_len)
        o.fail_key("row_len", fmt::format("must be in [1, window = {}], got {}", c.window_len, c.row_len));
    if (c.batch_size <= 0) o.fail_key("batch_size", fmt::format("must be positive, got {}", c.batch_size));
    std::vector<std::vector<Window>> windows;
    for (const CurriculumStage& s : stages) {
        windows.push_back(make_windows(*docs, s.window));
        if (static_cast<int64_t>(windows.back().size()) < static_cast<int64_t>(c.world) * c.batch_size)
            o.fail_key("docs", fmt::format("hold {} windows of {} tokens, fewer than one global "
                                           "batch ({} ranks x {} rows)", windows.back().size(),
                                           s.window, c.world, c.batch_size));
    }
    std::unique_ptr<RowSampler> sampler;
    try {
        sampler = instantiate(*spec->node, docs->vocab_size(), c.seed);
        // Trial rows now (every child of a mix, every stage's Le), so a sampler option that
        // does not fit these lengths (chunk's alpha * row_len) fails at this line rather than
        // at the first training step.
        for (size_t k = 0; k < stages.size(); ++k) {
            const Window& w = windows[k].front();
            std::vector<int32_t> window(static_cast<size_t>(stages[k].window + 1));
            docs->read(w.doc, w.start, stages[k].window + 1, window.data());
            sampler->trial(window.data(), stages[k].window, c.row_len);
        }
    } catch (const Error& e) {
        fail("{} ctx.data.rows: {}", where, e.what());
    }
    auto handle = std::make_shared<DataHandle>();
    handle->vocab_size = docs->vocab_size();
    if (o.has("curriculum"))
        handle->stream = std::make_unique<CurriculumSource>(docs, std::move(sampler), stages, c);
    else
        handle->stream = std::make_unique<RowStreamSource>(docs, std::move(sampler),
                                                           std::move(windows.front()), c);
    push_data_handle(L, std::move(handle));
    return 1;
}

int sampler_tostring(lua_State* L) {
    auto* s = static_cast<SamplerSpec*>(luaL_checkudata(L, 1, kSamplerSpecType));
    const std::string name = s->node->lib     ? s->node->lib->full_name
                             : s->node->lua_fn ? "lua:" + s->node->lua_name
                                               : "mix";
    lua_pushfstring(L, "ctx.SamplerSpec(%s)", name.c_str());
    return 1;
}

}  // namespace

void register_data_functions(lua_State* L, int ctx_index, int data_index) {
    lua::new_type(L, kSamplerSpecType, lua::gc_userdata<SamplerSpec>, nullptr,
                  guarded<sampler_tostring>, nullptr);
    // ctx.sampler is a callable table: ctx.sampler("chunk", {...}) and ctx.sampler.mix{...}.
    lua_newtable(L);
    lua_pushcfunction(L, guarded<l_sampler_mix>);
    lua_setfield(L, -2, "mix");
    lua_pushcfunction(L, guarded<l_sampler_lua>);
    lua_setfield(L, -2, "lua");
    lua::register_lua_sampler_types(L);
    lua_newtable(L);
    lua_pushcfunction(L, guarded<l_sampler_call>);
    lua_setfield(L, -2, "__call");
    lua_setmetatable(L, -2);
    lua_setfield(L, ctx_index, "sampler");
    const luaL_Reg fns[] = {{"corpus", guarded<l_corpus>},
                            {"shard", guarded<l_shard>},
                            {"rows", guarded<l_rows>},
                            {"recall_qa", guarded<l_recall_qa>},
                            {nullptr, nullptr}};
    lua_pushvalue(L, data_index);
    luaL_setfuncs(L, fns, 0);
    lua_pop(L, 1);
}

}  // namespace ctx
