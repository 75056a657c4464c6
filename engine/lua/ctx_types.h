// Userdata types of the ctx module: PE specs, data sources and models.
#pragma once

#include <memory>
#include <string>

#include "data/batch_source.h"
#include "data/token_source.h"
#include "lua/options.h"
#include "model/generate.h"
#include "session/models.h"

struct lua_State;

namespace ctx {

// ctx.pe(name, options): a resolved plugin and its validated options ("none" = NoPE).
struct PeSpec {
    std::string plugin;  // "pe/rope", or "none"
    lua::Options options;
};

inline constexpr const char* kModelType = "ctx.Model";

void register_ctx_types(lua_State* L);
// The model at `index` (a Lua error naming the expected type otherwise).
ModelHandle& check_model(lua_State* L, int index);
// model:logprobs and model:generate (ctx_probes.cpp), raw lua_CFunctions (wrap in guarded<>).
int model_logprobs(lua_State* L);
int model_generate(lua_State* L);
// model:train_predictors, save_predictors, load_predictors, decode_score (ctx_sparsity.cpp).
int model_train_predictors(lua_State* L);
int model_save_predictors(lua_State* L);
int model_load_predictors(lua_State* L);
int model_decode_score(lua_State* L);
// The predictors side file (io/sparsity_file.h) in `dir`: written by ctx.save, save_checkpoint
// and save_hf when the model has predictors (rank 0), read by ctx.load and load_hf when present
// (a file for another model shape is skipped with a warning).
void save_predictors_beside(lua_State* L, const ModelHandle& h, const std::string& dir);
void load_predictors_beside(lua_State* L, ModelHandle& h, const std::string& dir);
// The `sparsity = {mlp = s, heads = s, mlp_positive = b}` option of generation (the key in o),
// for h's predictors; dense when absent. Errors name `context` and the key.
SparsityOptions parse_sparsity_option(lua_State* L, const lua::Options& o, const ModelHandle& h,
                                      const std::string& context, const std::string& where);
// Resolves `name` ("rope", "pe/rope" or "none"), validates the options table at opts_index (may
// be none/nil) against the plugin's declared options, pushes a PeSpec userdata.
PeSpec& make_pe_spec(lua_State* L, const std::string& name, int opts_index,
                     const std::string& where);
// A training data source: the stream ctx.train draws from (it owns the position, saved by
// checkpoints) and, for in-memory data, the tokens ctx.evaluate samples from.
struct DataHandle {
    std::shared_ptr<TokenSource> tokens;   // in-memory sources only
    std::unique_ptr<BatchSource> stream;
    int vocab_size = 0;
};
inline constexpr const char* kDataType = "ctx.Data";
using DataRef = std::shared_ptr<DataHandle>;
// Wraps an in-memory token source in a TokenStream seeded from (seed, rank).
void push_data(lua_State* L, std::shared_ptr<TokenSource> data, uint64_t seed);
void push_data_handle(lua_State* L, DataRef data);
// Sets ctx.model, ctx.train, ctx.evaluate on the table at the top of the stack.
void register_model_functions(lua_State* L);
// The `device`, `precision` and `attention` options of ctx.model, ctx.load and ctx.load_hf
// (`backend` is the older name of `device`): schema entries to append to a function's schema.
std::vector<lua::OptSpec> device_option_specs();
// Reads them (defaults: the command line's --device / --precision, then auto / fp32).
DeviceRequest parse_device_request(lua_State* L, const lua::Options& o);
void push_model(lua_State* L, ModelRef model);
// Sets ctx.save, ctx.load, ctx.save_checkpoint, ctx.latest_checkpoint on the table at the top.
void register_checkpoint_functions(lua_State* L);

// Sets ctx.eval and ctx.run_eval on the table at the top (ctx).
void register_eval_functions(lua_State* L);
// Sets ctx.sampler and ctx.data.corpus / shard / rows (absolute stack indices of ctx, ctx.data).
void register_data_functions(lua_State* L, int ctx_index, int data_index);
// Sets documents on the table at the top (ctx.data).
void register_eval_data_functions(lua_State* L);
void push_documents(lua_State* L, std::shared_ptr<class DocStore> docs);

inline constexpr const char* kDocumentsType = "ctx.Documents";

}  // namespace ctx
