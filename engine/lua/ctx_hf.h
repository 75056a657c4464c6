// ctx.load_hf / ctx.save_hf: HF transformers model directories (config.json, safetensors,
// tokenizer files) as ctxengine models, and back (io/hf_model.h, docs/HF.md). The helpers
// below are shared with `ctxengine convert` and the reference tests.
//
//   local model, tok = ctx.load_hf(dir [, {backend = "cpu"}])
//       tok: the directory's tokenizer (tokenizer.json, or vocab.json + merges.txt) as a
//       ctx.Tokenizer, or nil when the directory has none
//   ctx.save_hf(model, dir [, {tokenizer = tok_or_path}])
//       writes config.json (context = the model's current context_length, RoPE scaling fields),
//       model.safetensors ({"format": "pt"}, F32) and copies the tokenizer's files
#pragma once

#include <string>

#include "io/hf_model.h"
#include "lua/ctx_types.h"

struct lua_State;

namespace ctx {

class Tokenizer;

// Reads an HF directory into a new model (session/models.h model_from_hf with the ctx module's
// engine context on L). Pushes nothing. hf_spec_of and save_hf_model: session/models.h.
ModelRef load_hf_model(lua_State* L, const std::string& dir, const DeviceRequest& device,
                       const std::string& where);

// The file a ctx.Tokenizer was loaded from ("" for the byte tokenizer): its name() is
// "bpe:<style>:<source>".
std::string tokenizer_source_path(const Tokenizer& tok);

// Sets ctx.load_hf and ctx.save_hf on the table at the top of the stack (ctx).
void register_hf_functions(lua_State* L);

}  // namespace ctx
