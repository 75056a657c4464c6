// ctx module: long-document data. ctx.data.corpus (the generated default corpus as shards),
// ctx.data.shard, ctx.sampler and ctx.data.rows (windows -> sampler -> training rows).
#include <lua.hpp>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "data/corpus_shards.h"
#include "data/row_stream.h"
#include "data/shard.h"
#include "data/windows.h"
#include "lua/ctx_module.h"
#include "lua/ctx_types.h"
#include "lua/lua_guard.h"
#include "lua/userdata.h"
#include "plugin/sampler_plugin.h"

namespace ctx {
namespace {

using lua::guarded;
using lua::OptSpec;
using lua::OptType;
using DocumentsRef = std::shared_ptr<DocStore>;

constexpr const char* kSamplerSpecType = "ctx.SamplerSpec";

// ctx.sampler(name, options): resolved plugin + validated options; instantiated per stream.
struct SamplerSpec {
    const LoadedPlugin* lib = nullptr;
    lua::Options options;
};

// Training rows from a row stream; owns the documents and the sampler the stream reads.
class RowStreamSource final : public BatchSource {
public:
    RowStreamSource(DocumentsRef docs, std::unique_ptr<SamplerPlugin> sampler,
                    std::vector<Window> windows, const RowStreamConfig& config)
        : docs_(std::move(docs)), sampler_(std::move(sampler)),
          stream_(*docs_, std::move(windows), *sampler_, config) {}

    void next(BatchBuffers& out, int B, int T) override {
        const RowStreamConfig& c = stream_.config();
        CTX_CHECK(B == c.batch_size && T == c.row_len,
                  "this data stream yields batches of {} rows of {} tokens, but {} x {} were "
                  "asked for", c.batch_size, c.row_len, B, T);
        stream_.next(out);
    }
    bool fixed_shape(int* B, int* T) const override {
        *B = stream_.config().batch_size;
        *T = static_cast<int>(stream_.config().row_len);
        return true;
    }
    int64_t num_windows() const override { return stream_.num_windows(); }
    void save(TrainingState& s, Comm&) const override {
        s.data_epoch = stream_.cursor().epoch;
        s.data_index = stream_.cursor().index;
    }
    void restore(const TrainingState& s, Comm&) override {
        stream_.set_cursor(StreamCursor{s.data_epoch, s.data_index});
    }
    const RowStream& stream() const { return stream_; }

private:
    DocumentsRef docs_;
    std::unique_ptr<SamplerPlugin> sampler_;
    RowStream stream_;
};

DocumentsRef check_documents(lua_State* L, const lua::Options& o, const std::string& key) {
    return lua::option_userdata<DocumentsRef>(L, o, key, kDocumentsType,
                                              "documents (ctx.data.corpus{...}.train, "
                                              "ctx.data.shard(path), ctx.data.documents{...})");
}

// ctx.data.corpus{dir = "data/generated/default", docs = 400, ...} -> {train =, val =, dir =}
int l_corpus(lua_State* L) {
    const std::string where = lua::caller_where(L);
    const auto o = lua::Options::parse(
        L, 1,
        {{"dir", OptType::String, true, "where the shards live (generated when missing)"},
         {"docs", OptType::Integer, false, "number of documents"},
         {"min_len", OptType::Integer, false, "shortest document (bytes)"},
         {"max_len", OptType::Integer, false, "longest document (bytes)"},
         {"seed", OptType::Integer, false, "corpus seed"},
         {"val_fraction", OptType::Number, false, "documents held out for validation"},
         {"facts", OptType::Integer, false, "facts live at once per document"},
         {"recall_rate", OptType::Number, false, "probability a due fact is recalled"},
         {"min_distance", OptType::Integer, false, "shortest recall distance (bytes)"},
         {"max_distance", OptType::Integer, false, "longest recall distance (bytes)"}},
        "ctx.data.corpus", where);
    CorpusOptions c;
    c.n_docs = o.integer("docs", c.n_docs);
    c.min_len = o.integer("min_len", c.min_len);
    c.max_len = o.integer("max_len", c.max_len);
    c.seed = static_cast<uint64_t>(o.integer("seed", static_cast<int64_t>(c.seed)));
    c.facts_per_doc = static_cast<int>(o.integer("facts", c.facts_per_doc));
    c.recall_rate = o.number("recall_rate", c.recall_rate);
    c.min_distance = o.integer("min_distance", c.min_distance);
    c.max_distance = o.integer("max_distance", c.max_distance);
    const double val_fraction = o.number("val_fraction", 0.1);
    const std::string dir = o.string("dir", "");
    EngineContext& engine = lua_detail::engine(L);
    // Rank 0 writes; the others wait and then read the same files.
    std::string error;
    if (engine.comm->rank() == 0) {
        try {
            const CorpusShards s = write_corpus_shards(dir, c, val_fraction);
            spdlog::info("corpus {}: {} train + {} validation documents ({})", dir,
                         s.train_lengths.size(), s.val_lengths.size(),
                         s.reused ? "reused" : "generated");
        } catch (const std::exception& e) {
            error = e.what();
        }
    }
    uint64_t len = error.size();
    engine.comm->broadcast(&len, sizeof len, 0);
    error.resize(len);
    if (len) engine.comm->broadcast(error.data(), len, 0);
    if (!error.empty()) fail("{} ctx.data.corpus: {}", where, error);

    lua_createtable(L, 0, 3);
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
    auto* spec = lua::new_userdata<SamplerSpec>(L, kSamplerSpecType);
    spec->lib = lib;
    spec->options = std::move(options);
    return 1;
}

// ctx.data.rows{docs =, sampler =, window = Le, row_len = Lt, batch_size = B, seed = S}
int l_rows(lua_State* L) {
    const std::string where = lua::caller_where(L);
    const auto o = lua::Options::parse(
        L, 1,
        {{"docs", OptType::Any, true, "training documents"},
         {"sampler", OptType::Any, false, "ctx.sampler(name, options) or a name (default full)"},
         {"window", OptType::Integer, true, "window length Le the sampler draws from"},
         {"row_len", OptType::Integer, false, "tokens per row (default: window)"},
         {"batch_size", OptType::Integer, true, "rows per rank per step"},
         {"seed", OptType::Integer, false, "order and sampling seed"}},
        "ctx.data.rows", where);
    DocumentsRef docs = check_documents(L, o, "docs");
    const SamplerSpec* spec = nullptr;
    if (const lua::LuaRef* ref = o.ref("sampler")) {
        ref->push();
        if (lua_type(L, -1) == LUA_TSTRING) {
            lua_pushcfunction(L, guarded<l_sampler>);
            lua_insert(L, -2);
            lua_call(L, 1, 1);
        }
        spec = lua::test_userdata<SamplerSpec>(L, -1, kSamplerSpecType);
        if (!spec) o.fail_key("sampler", "expects ctx.sampler(name, options) or a name");
    } else {
        lua_pushcfunction(L, guarded<l_sampler>);
        lua_pushstring(L, "full");
        lua_call(L, 1, 1);
        spec = lua::test_userdata<SamplerSpec>(L, -1, kSamplerSpecType);
    }
    EngineContext& engine = lua_detail::engine(L);
    RowStreamConfig c;
    c.window_len = o.integer("window", 0);
    c.row_len = o.integer("row_len", c.window_len);
    c.batch_size = static_cast<int>(o.integer("batch_size", 0));
    c.seed = static_cast<uint64_t>(o.integer("seed", 1));
    c.rank = engine.comm->rank();
    c.world = engine.comm->size();
    if (c.window_len <= 0) o.fail_key("window", fmt::format("must be positive, got {}", c.window_len));
    if (c.row_len <= 0 || c.row_len > c.window_len)
        o.fail_key("row_len", fmt::format("must be in [1, window = {}], got {}", c.window_len, c.row_len));
    if (c.batch_size <= 0) o.fail_key("batch_size", fmt::format("must be positive, got {}", c.batch_size));
    std::vector<Window> windows = make_windows(*docs, c.window_len);
    if (static_cast<int64_t>(windows.size()) < static_cast<int64_t>(c.world) * c.batch_size)
        o.fail_key("docs", fmt::format("hold {} windows of {} tokens, fewer than one global batch "
                                       "({} ranks x {} rows)", windows.size(), c.window_len,
                                       c.world, c.batch_size));
    auto sampler = std::make_unique<SamplerPlugin>(*spec->lib, spec->options, docs->vocab_size(),
                                                   c.seed);
    {
        // One trial row now, so a sampler option that does not fit these lengths (chunk's
        // alpha * row_len) fails at this line rather than at the first training step.
        std::vector<int32_t> window(static_cast<size_t>(c.window_len + 1)), tok(c.row_len), tgt(c.row_len);
        std::vector<float> pos(c.row_len), mask(c.row_len);
        docs->read(windows[0].doc, windows[0].start, c.window_len + 1, window.data());
        uint64_t rng[4] = {1, 2, 3, 4};
        ctx_sample_row row{tok.data(), pos.data(), tgt.data(), mask.data(), c.row_len};
        try {
            sampler->sample(window.data(), c.window_len, rng, row);
        } catch (const Error& e) {
            fail("{} ctx.data.rows: {}", where, e.what());
        }
    }
    auto handle = std::make_shared<DataHandle>();
    handle->vocab_size = docs->vocab_size();
    handle->stream = std::make_unique<RowStreamSource>(docs, std::move(sampler), std::move(windows), c);
    push_data_handle(L, std::move(handle));
    return 1;
}

int sampler_tostring(lua_State* L) {
    auto* s = static_cast<SamplerSpec*>(luaL_checkudata(L, 1, kSamplerSpecType));
    lua_pushfstring(L, "ctx.SamplerSpec(%s)", s->lib->full_name.c_str());
    return 1;
}

}  // namespace

void register_data_functions(lua_State* L, int ctx_index, int data_index) {
    lua::new_type(L, kSamplerSpecType, lua::gc_userdata<SamplerSpec>, nullptr,
                  guarded<sampler_tostring>, nullptr);
    lua_pushcfunction(L, guarded<l_sampler>);
    lua_setfield(L, ctx_index, "sampler");
    const luaL_Reg fns[] = {{"corpus", guarded<l_corpus>},
                            {"shard", guarded<l_shard>},
                            {"rows", guarded<l_rows>},
                            {nullptr, nullptr}};
    lua_pushvalue(L, data_index);
    luaL_setfuncs(L, fns, 0);
    lua_pop(L, 1);
}

}  // namespace ctx
