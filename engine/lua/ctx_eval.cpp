// ctx module: evaluation tasks (ctx.eval, ctx.run_eval) and document sets (ctx.data.documents).
#include <map>

#include <lua.hpp>

#include "core/error.h"
#include "data/byte_tokenizer.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "data/windows.h"
#include "lua/ctx_module.h"
#include "lua/ctx_tokenizer.h"
#include "lua/ctx_types.h"
#include "lua/lua_guard.h"
#include "lua/userdata.h"
#include "eval/eval_plugin.h"

namespace ctx {
namespace {

using lua::guarded;
using lua::OptSpec;
using lua::OptType;

constexpr const char* kEvalSpecType = "ctx.EvalSpec";
using DocumentsRef = std::shared_ptr<DocStore>;

// ctx.eval(name, options): the task's plugin resolved and its options validated at this line.
struct EvalSpec {
    std::string plugin;  // "eval/perplexity"
    std::unique_ptr<EvalPlugin> instance;
};

std::string eval_name(const std::string& name) {
    return name.rfind("eval/", 0) == 0 ? name : "eval/" + name;
}

EvalSpec& make_eval_spec(lua_State* L, const std::string& name, int opts_index,
                         const std::string& where) {
    EngineContext& engine = lua_detail::engine(L);
    const std::string full = eval_name(name);
    const LoadedPlugin* lib = engine.registry->find(full);
    if (!lib) {
        try {
            engine.registry->get(full);
        } catch (const Error& e) {
            fail("{} {}", where, e.what());
        }
    }
    if (opts_index == 0) lua_pushnil(L);
    const int idx = opts_index == 0 ? lua_gettop(L) : opts_index;
    const lua::Options options = lua::Options::parse(
        L, idx, plugin_option_schema(*lib->descriptor), full + " options", where);
    if (opts_index == 0) lua_pop(L, 1);
    auto* spec = lua::new_userdata<EvalSpec>(L, kEvalSpecType);
    spec->plugin = full;
    spec->instance = std::make_unique<EvalPlugin>(*lib, options, 1);
    return *spec;
}

int l_eval(lua_State* L) {
    const std::string name = luaL_checkstring(L, 1);
    if (!lua_isnoneornil(L, 2)) luaL_checktype(L, 2, LUA_TTABLE);
    make_eval_spec(L, name, lua_isnoneornil(L, 2) ? 0 : 2, lua::caller_where(L));
    return 1;
}

// Pushes a JSON value as a Lua value (records are flat: numbers and strings).
void push_json(lua_State* L, const Record& v) {
    if (v.is_number_integer()) lua_pushinteger(L, v.get<int64_t>());
    else if (v.is_number()) lua_pushnumber(L, v.get<double>());
    else if (v.is_string()) lua_pushstring(L, v.get<std::string>().c_str());
    else if (v.is_boolean()) lua_pushboolean(L, v.get<bool>());
    else lua_pushstring(L, v.dump().c_str());
}

// Reads a flat table of string/number/boolean values into a record (tags).
// Tags in name order: a Lua table has no order of its own (and its traversal order changes from
// run to run), while CSV columns must not.
Record read_tags(lua_State* L, const lua::Options& o, const std::string& key) {
    Record tags = Record::object();
    const lua::LuaRef* ref = o.ref(key);
    if (!ref) return tags;
    std::map<std::string, Record> sorted;
    ref->push();
    lua_pushnil(L);
    while (lua_next(L, -2) != 0) {
        if (lua_type(L, -2) != LUA_TSTRING) o.fail_key(key, "must have string keys");
        const std::string k = lua_tostring(L, -2);
        switch (lua_type(L, -1)) {
            case LUA_TNUMBER:
                if (lua_isinteger(L, -1)) sorted[k] = lua_tointeger(L, -1);
                else sorted[k] = lua_tonumber(L, -1);
                break;
            case LUA_TSTRING: sorted[k] = lua_tostring(L, -1); break;
            case LUA_TBOOLEAN: sorted[k] = lua_toboolean(L, -1) != 0; break;
            default: o.fail_key(key, fmt::format("value of '{}' must be a string, number or boolean", k));
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    for (auto& [k, v] : sorted) tags[k] = std::move(v);
    return tags;
}

// ctx.run_eval{eval = ctx.eval(...) | "name", model = m, data = documents, out_dir = "runs/x",
//              tags = {method = "chunk", stage = "after"}, tokenizer = "byte" | ctx.tokenizer(...)}
// -> array of records. data may be omitted by tasks that bring their own (a JSONL file).
int l_run_eval(lua_State* L) {
    const std::string where = lua::caller_where(L);
    const auto o = lua::Options::parse(
        L, 1,
        {{"eval", OptType::Any, true, "ctx.eval(name, options) or a task name"},
         {"model", OptType::Any, true, "ctx.model"},
         {"data", OptType::Any, false, "held-out documents (ctx.data.documents or a split)"},
         {"out_dir", OptType::String, false, "where metrics.jsonl and <task>.csv go"},
         {"tags", OptType::Table, false, "fields added to every record"},
         {"tokenizer", OptType::Any, false, "text tasks: ctx.tokenizer(spec) or a spec (default: "
                                            "\"byte\" for byte-level models of vocabulary 259)"},
         {"sparsity", OptType::Table, false, "{mlp = s, heads = s, mlp_positive = b}: tasks "
                                             "that generate decode with contextual sparsity"}},
        "ctx.run_eval", where);
    EvalSpec* spec = nullptr;
    o.ref("eval")->push();
    if (lua_type(L, -1) == LUA_TSTRING) {
        const std::string name = lua_tostring(L, -1);
        spec = &make_eval_spec(L, name, 0, where);  // stays on the stack while it runs
    } else {
        spec = lua::test_userdata<EvalSpec>(L, -1, kEvalSpecType);
        if (!spec) o.fail_key("eval", "expects ctx.eval(name, options) or a task name");
    }
    ModelHandle& h = *lua::option_userdata<ModelRef>(L, o, "model", kModelType, "a ctx.model");
    DocumentsRef docs = o.has("data")
                            ? lua::option_userdata<DocumentsRef>(L, o, "data", kDocumentsType,
                                                                 "a document set")
                            : std::make_shared<MemoryDocs>(std::vector<std::vector<int32_t>>{}, 1);
    TokenizerRef tokenizer;
    if (const lua::LuaRef* ref = o.ref("tokenizer")) {
        ref->push();
        if (lua_type(L, -1) == LUA_TSTRING) {
            try {
                tokenizer = load_tokenizer(lua_tostring(L, -1));
            } catch (const Error& e) {
                o.fail_key("tokenizer", e.what());
            }
        } else {
            tokenizer = test_tokenizer(L, -1);
            if (!tokenizer) o.fail_key("tokenizer", "expects ctx.tokenizer(spec) or a spec string");
        }
        lua_pop(L, 1);
        if (tokenizer->vocab_size() > h.model->config().vocab_size)
            o.fail_key("tokenizer", fmt::format("has vocabulary size {} but the model's is {}",
                                                tokenizer->vocab_size(),
                                                h.model->config().vocab_size));
    } else if (h.model->config().vocab_size == ByteTokenizer::kVocabSize) {
        tokenizer = load_tokenizer("byte");
    }
    if (docs->vocab_size() > h.model->config().vocab_size)
        o.fail_key("data", fmt::format("has vocabulary size {} but the model's is {}",
                                       docs->vocab_size(), h.model->config().vocab_size));
    EngineContext& engine = lua_detail::engine(L);
    std::vector<Record> records;
    EvalContext c;
    c.model = h.model.get();
    c.documents = docs.get();
    c.comm = &engine.data_comm();
    c.logs = engine.comm->rank() == 0;
    c.trained_length = h.trained_length;
    c.tokenizer = tokenizer.get();
    c.tags = read_tags(L, o, "tags");
    c.collected = &records;
    c.sparsity = parse_sparsity_option(L, o, h, "ctx.run_eval", where);
    if (o.has("out_dir")) c.metrics = &engine.metrics_for(o.string("out_dir", ""));
    spec->instance->run(c);

    lua_createtable(L, static_cast<int>(records.size()), 0);
    for (size_t i = 0; i < records.size(); ++i) {
        lua_newtable(L);
        for (const auto& [k, v] : records[i].items()) {
            push_json(L, v);
            lua_setfield(L, -2, k.c_str());
        }
        lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
    return 1;
}

// ctx.data.documents{texts = {"...", ...}}: byte-tokenized in-memory documents.
int l_documents(lua_State* L) {
    const auto o = lua::Options::parse(L, 1, {{"texts", OptType::Table, true, "document texts"}},
                                       "ctx.data.documents", lua::caller_where(L));
    std::vector<std::vector<int32_t>> docs;
    o.ref("texts")->push();
    const lua_Integer n = luaL_len(L, -1);
    for (lua_Integer i = 1; i <= n; ++i) {
        lua_rawgeti(L, -1, i);
        if (lua_type(L, -1) != LUA_TSTRING)
            o.fail_key("texts", fmt::format("element {} must be a string", i));
        size_t len = 0;
        const char* s = lua_tolstring(L, -1, &len);
        std::vector<int32_t> tokens(len);  // bytes as tokens 0..255
        for (size_t k = 0; k < len; ++k) tokens[k] = static_cast<unsigned char>(s[k]);
        docs.push_back(std::move(tokens));
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    *lua::new_userdata<DocumentsRef>(L, kDocumentsType) =
        std::make_shared<MemoryDocs>(std::move(docs), 256);
    return 1;
}

int documents_len(lua_State* L) {
    auto* d = static_cast<DocumentsRef*>(luaL_checkudata(L, 1, kDocumentsType));
    lua_pushinteger(L, static_cast<lua_Integer>((*d)->n_docs()));
    return 1;
}

DocStore& check_docs(lua_State* L) {
    return **static_cast<DocumentsRef*>(luaL_checkudata(L, 1, kDocumentsType));
}

// docs:vocab_size(), docs:num_tokens(), docs:doc_len(i) (1-based), docs:num_windows(Le)
int documents_vocab_size(lua_State* L) {
    lua_pushinteger(L, check_docs(L).vocab_size());
    return 1;
}

int documents_num_tokens(lua_State* L) {
    const DocStore& d = check_docs(L);
    int64_t n = 0;
    for (int64_t i = 0; i < d.n_docs(); ++i) n += d.doc_len(i);
    lua_pushinteger(L, static_cast<lua_Integer>(n));
    return 1;
}

int documents_doc_len(lua_State* L) {
    const DocStore& d = check_docs(L);
    const lua_Integer i = luaL_checkinteger(L, 2);
    if (i < 1 || i > d.n_docs())
        fail("{} docs:doc_len({}): expected an index in [1, {}]", lua::caller_where(L), i,
             d.n_docs());
    lua_pushinteger(L, static_cast<lua_Integer>(d.doc_len(i - 1)));
    return 1;
}

int documents_num_windows(lua_State* L) {
    const DocStore& d = check_docs(L);
    const lua_Integer le = luaL_checkinteger(L, 2);
    if (le < 1) fail("{} docs:num_windows({}): expected a positive length", lua::caller_where(L), le);
    lua_pushinteger(L, static_cast<lua_Integer>(make_windows(d, le).size()));
    return 1;
}

int eval_tostring(lua_State* L) {
    auto* s = static_cast<EvalSpec*>(luaL_checkudata(L, 1, kEvalSpecType));
    lua_pushfstring(L, "ctx.EvalSpec(%s)", s->plugin.c_str());
    return 1;
}

}  // namespace

void push_documents(lua_State* L, std::shared_ptr<DocStore> docs) {
    *lua::new_userdata<DocumentsRef>(L, kDocumentsType) = std::move(docs);
}

void register_eval_functions(lua_State* L) {
    lua::new_type(L, kEvalSpecType, lua::gc_userdata<EvalSpec>, nullptr, guarded<eval_tostring>,
                  nullptr);
    const luaL_Reg doc_methods[] = {{"vocab_size", guarded<documents_vocab_size>},
                                    {"num_tokens", guarded<documents_num_tokens>},
                                    {"doc_len", guarded<documents_doc_len>},
                                    {"num_windows", guarded<documents_num_windows>},
                                    {nullptr, nullptr}};
    lua::new_type(L, kDocumentsType, lua::gc_userdata<DocumentsRef>, doc_methods, nullptr,
                  guarded<documents_len>);
    const luaL_Reg fns[] = {{"eval", guarded<l_eval>}, {"run_eval", guarded<l_run_eval>},
                            {nullptr, nullptr}};
    luaL_setfuncs(L, fns, 0);
}

void register_eval_data_functions(lua_State* L) {
    lua_pushcfunction(L, guarded<l_documents>);
    lua_setfield(L, -2, "documents");
}

}  // namespace ctx
