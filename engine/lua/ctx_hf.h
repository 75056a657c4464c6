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

// Reads an HF directory into a new model (PE built from config.json, parameters from the
// weights). Needs the ctx module's engine context on L for plugins and backends. Pushes nothing.
ModelRef load_hf_model(lua_State* L, const std::string& dir, const DeviceRequest& device,
                       const std::string& where);

// The HF spec of a live model, the PE's current state (e.g. RoPE's factor after extend) included.
HfSpec hf_spec_of(const ModelHandle& h);

// Writes the model as an HF directory. tokenizer_source: "" (no tokenizer files), a directory,
// or a tokenizer.json / vocab.json; tok (may be null) supplies bos/eos ids for config.json.
void save_hf_model(const ModelHandle& h, const std::string& dir,
                   const std::string& tokenizer_source, const Tokenizer* tok);

// The file a ctx.Tokenizer was loaded from ("" for the byte tokenizer): its name() is
// "bpe:<style>:<source>".
std::string tokenizer_source_path(const Tokenizer& tok);

// Sets ctx.load_hf and ctx.save_hf on the table at the top of the stack (ctx).
void register_hf_functions(lua_State* L);

}  // namespace ctx
