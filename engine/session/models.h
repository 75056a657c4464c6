// Models of a run (session layer, session/engine.h): built from a config and a PE, from a
// checkpoint, or from an HF directory; and the checkpoint state of a live model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/options.h"
#include "core/training_state.h"
#include "data/batch_source.h"
#include "io/hf_model.h"
#include "model/decoder.h"
#include "model/device_select.h"
#include "model/optimizer.h"
#include "model/sparsity.h"
#include "session/engine.h"

namespace ctx {

class Tokenizer;

// A model with its optimizer (created by the first training call, kept so later calls continue
// the same AdamW state and schedule position).
struct ModelHandle {
    std::unique_ptr<Model> model;
    std::unique_ptr<Optimizer> optimizer;
    std::string style, pe_name;
    int trained_length = 0;  // Lt at construction (evaluation multiples are relative to it)
    std::string pe_options_json = "{}";  // the PE's options, to rebuild it from a checkpoint
    int64_t tokens_seen = 0;             // global tokens trained on
    // Contextual sparsity predictors (model:train_predictors / load_predictors), or null.
    std::shared_ptr<SparsityPredictors> predictors;
};
using ModelRef = std::shared_ptr<ModelHandle>;

// Where and how a model computes.
struct DeviceRequest {
    DeviceChoice device = DeviceChoice::Auto;
    Precision precision = Precision::Fp32;
    AttentionChoice attention = AttentionChoice::Auto;
};

// The PE plugin a name means: "rope" and "pe/rope" are "pe/rope"; "none" / "pe/none" is the
// pe/none plugin when installed, else "none" (the engine's built-in NoPE).
std::string pe_plugin_name(const PluginRegistry& registry, const std::string& name);
// The default PE of a model style: learned (gpt2), rope (neox), alibi (bloom).
std::string default_pe(const std::string& style);

// pe_plugin: "pe/rope" or "none"; pe_options validated against the plugin's declared options.
ModelRef build_model(EngineContext& engine, const ModelConfig& config, const std::string& style,
                     const std::string& pe_plugin, const Options& pe_options, uint64_t seed,
                     const DeviceRequest& device);

// A PE's options as JSON (checkpoints keep them), and back, checked against the plugin's
// declared options as a recipe table is ("<where> pe/rope options: unknown option ...").
std::string pe_options_to_json(const PluginRegistry& registry, const std::string& plugin,
                               const Options& options);
// A PE instance for a model of config c ("none": null).
std::unique_ptr<PePlugin> make_pe(EngineContext& engine, const ModelConfig& c,
                                  const std::string& pe_plugin, const Options& pe_options,
                                  uint64_t seed);
// Swaps h's PE (both without parameters: Model::replace_pe) and records the new name and
// options, which checkpoints and HF exports then carry.
void set_model_pe(EngineContext& engine, ModelHandle& h, const std::string& pe_plugin,
                  const Options& pe_options);
Options pe_options_from_json(const PluginRegistry& registry, const std::string& plugin,
                             const std::string& json, const std::string& where);

// A model from a checkpoint: config, PE with its saved options and state, parameters, and the
// optimizer when the checkpoint has one. `path` names the file in errors.
ModelRef model_from_checkpoint(EngineContext& engine, const TrainingState& state,
                               const std::string& path, const DeviceRequest& device);
// The checkpoint state of a model: parameters, optimizer, PE options and state, tokens seen,
// the recipe, and metadata {style, trained_length, world_size} plus the keys of `metadata`
// (ctx.save puts the recipe's table under "user"). data: the training stream whose position
// to save (collective), or null.
TrainingState model_checkpoint_state(EngineContext& engine, const ModelHandle& h,
                                     BatchSource* data, const nlohmann::json& metadata);
// Writes state to path on rank 0 (collective: a failure there is raised on every rank).
void write_checkpoint(EngineContext& engine, const std::string& path, const TrainingState& state);
// Runs `what` on rank 0 and raises its error (if any) on every rank.
void on_rank0(Comm& comm, const std::function<void()>& what);

// An HF directory (config.json, safetensors) as a new model; the PE is built as a recipe would
// ask for it. where: the prefix of option errors.
ModelRef model_from_hf(EngineContext& engine, const std::string& dir, const DeviceRequest& device,
                       const std::string& where);
// The HF spec of a live model, the PE's current state (e.g. RoPE's factor after extend) included.
HfSpec hf_spec_of(const ModelHandle& h);
// Writes the model as an HF directory. tokenizer_source: "" (no tokenizer files), a directory,
// or a tokenizer.json / vocab.json; tok (may be null) supplies bos/eos ids for config.json.
// Collective over comm (the whole tensors are gathered from a tensor-parallel model's ranks);
// rank 0 writes and its error is raised on every rank.
void save_hf_model(Comm& comm, const ModelHandle& h, const std::string& dir,
                   const std::string& tokenizer_source, const Tokenizer* tok);
// The writing part, on one rank, from the whole tensors (model_tensors()).
void write_hf_model(const ModelHandle& h, const std::string& dir, const HostTensors& tensors,
                    const std::string& tokenizer_source, const Tokenizer* tok);

}  // namespace ctx
