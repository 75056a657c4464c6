// HF transformers checkpoints <-> ctxengine models (DESIGN.md decision 9): GPT-2, GPT-NeoX /
// Pythia, BLOOM, Llama, Mistral and Qwen2 as config.json + safetensors (+ tokenizer files).
// docs/HF.md has the mapping.
//
//   read:  config.json -> HfSpec (ModelConfig, style, PE plugin and options)
//          safetensors -> our parameter views by name (Conv1D weights transposed, fused per-head
//          query_key_value rows re-ordered to [q | k | v], learned positions -> pe.wpe)
//   write: a model (config, PE, PE state) -> HfSpec -> config.json, and the inverse mapping of
//          every view into an F32 model.safetensors with {"format": "pt"} metadata.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"

namespace ctx {

class Model;
class Arena;
class SafetensorsSet;

// A config.json in ctxengine terms.
struct HfSpec {
    std::string model_type;  // "gpt2" | "gpt_neox" | "bloom" | "llama" | "mistral" | "qwen2"
    std::string style;       // ctxengine style: gpt2 | neox | bloom | llama
    ModelConfig config;      // context_length = n_positions / max_position_embeddings / seq_length
    std::string pe_plugin;   // "pe/learned" | "pe/rope" | "pe/alibi"
    nlohmann::json pe_options = nlohmann::json::object();  // as ctx.pe(name, options) takes them
    int64_t bos_token_id = -1, eos_token_id = -1;  // -1: not given
};

// The model types read and written.
inline constexpr const char* kHfModelTypes = "gpt2, gpt_neox, bloom, llama, mistral, qwen2";

// config.json -> spec. `origin` (the file) starts every message; errors name the key and what
// was expected. Unknown model types and settings ctxengine cannot reproduce are refused.
HfSpec hf_spec_from_config(const nlohmann::json& config, const std::string& origin);

// The HF model a ctxengine model becomes, chosen by its PE: pe/learned -> GPT-2, pe/rope ->
// GPT-NeoX, pe/alibi -> BLOOM. Knobs the chosen architecture cannot express are an error naming
// them. pe_state (the plugin's save_state bytes) supplies RoPE's current scaling factor.
HfSpec hf_spec_for_model(const ModelConfig& config, const std::string& style,
                         const std::string& pe_plugin, const nlohmann::json& pe_options,
                         const std::vector<uint8_t>& pe_state);
// spec -> config.json, with the context as n_positions / max_position_embeddings / seq_length.
nlohmann::json hf_config_json(const HfSpec& spec);

// One host tensor in ctxengine's layout (HostTensors: by view name, "layers.0.attn.qkv.weight").
struct HostTensor {
    std::vector<int64_t> shape;
    std::vector<float> data;
};
using HostTensors = std::map<std::string, HostTensor>;

// The tensors of an HF checkpoint as our views. Every tensor the spec needs must be present
// with its shape; anything else (but known buffers such as GPT-2's attn.bias mask) is an
// error. The message lists every missing, unexpected and mis-shaped tensor.
HostTensors hf_tensors_to_ours(const HfSpec& spec, const SafetensorsSet& set);

// Our views -> HF tensors with their HF names (tied heads are not written).
struct HfTensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> data;
};
std::vector<HfTensor> ours_to_hf_tensors(const HfSpec& spec, const HostTensors& ours);

// DIR/config.json + DIR/model.safetensors (or the sharded index) -> spec and tensors.
struct HfCheckpoint {
    HfSpec spec;
    HostTensors tensors;
};
HfCheckpoint read_hf_checkpoint(const std::string& dir);

// Writes DIR/config.json and DIR/model.safetensors (creating DIR). tokenizer_source, when not
// empty, is a directory or a tokenizer.json / vocab.json whose tokenizer files are copied.
void write_hf_checkpoint(const std::string& dir, const HfSpec& spec, const HostTensors& ours,
                         const std::string& tokenizer_source);

// Host copies of a model's arena (parameters or gradients) by view name, and the inverse.
HostTensors model_tensors(const Model& model, const Arena& arena);
// Sets every parameter from `tensors`: each view must be present with its shape, and nothing
// else may be there.
void set_model_params(Model& model, const HostTensors& tensors, const std::string& origin);

}  // namespace ctx
