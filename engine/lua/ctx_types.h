// Userdata types of the ctx module: PE specs, data sources and models.
#pragma once

#include <memory>
#include <string>

#include "data/token_source.h"
#include "lua/options.h"
#include "model/decoder.h"
#include "model/optimizer.h"

struct lua_State;

namespace ctx {

// ctx.pe(name, options): a resolved plugin and its validated options ("none" = NoPE).
struct PeSpec {
    std::string plugin;  // "pe/rope", or "none"
    lua::Options options;
};

// A model with its optimizer (created by the first ctx.train, kept so later calls continue the
// same AdamW state and schedule position).
struct ModelHandle {
    std::unique_ptr<Model> model;
    std::unique_ptr<Optimizer> optimizer;
    std::string style, pe_name;
    int trained_length = 0;  // Lt at construction (evaluation multiples are relative to it)
};

void register_ctx_types(lua_State* L);
// Resolves `name` ("rope", "pe/rope" or "none"), validates the options table at opts_index (may
// be none/nil) against the plugin's declared options, pushes a PeSpec userdata.
PeSpec& make_pe_spec(lua_State* L, const std::string& name, int opts_index,
                     const std::string& where);
void push_data(lua_State* L, std::shared_ptr<TokenSource> data);
// Sets ctx.model, ctx.train, ctx.evaluate on the table at the top of the stack.
void register_model_functions(lua_State* L);
// Sets ctx.eval and ctx.run_eval on the table at the top (ctx).
void register_eval_functions(lua_State* L);
// Sets documents on the table at the top (ctx.data).
void register_eval_data_functions(lua_State* L);
void push_documents(lua_State* L, std::shared_ptr<class DocumentSet> docs);

inline constexpr const char* kModelType = "ctx.Model";
inline constexpr const char* kDocumentsType = "ctx.Documents";
using ModelRef = std::shared_ptr<ModelHandle>;

}  // namespace ctx
