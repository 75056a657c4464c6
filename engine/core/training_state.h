// The training state a checkpoint holds (DESIGN.md decision 8), as plain host data. Every layer
// that owns part of it fills its part: the data sources their position (data/batch_source.h),
// the model and optimizer their tensors and configs (io/model_state.h); io/checkpoint.h writes
// and reads it as HDF5.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace ctx {

// One named tensor of an arena (the same names as the model's parameter views).
struct CheckpointTensor {
    std::string name;            // "layers.0.attn.qkv.weight", "pe.wpe"
    std::vector<int64_t> shape;  // row-major
    bool weight_decay = false;
    std::vector<float> params, adam_m, adam_v;  // each prod(shape) floats (moments may be empty)
};

// Everything needed to resume. Plain host data: the caller gathers it from the model,
// optimizer, data stream and every rank before saving, and scatters it after loading.
struct TrainingState {
    // what produced it
    std::string model_config_json;      // ModelConfig + style as JSON
    std::string optimizer_config_json;  // OptimizerConfig as JSON
    std::string recipe_text;            // the recipe source that was running
    std::string pe_plugin;              // "pe/rope" or "none"
    std::string pe_options_json;        // the options the PE was created with
    std::vector<uint8_t> pe_state;      // PePlugin::save_state bytes
    // progress
    int64_t step = 0;         // optimizer updates done (also the LR schedule position)
    int64_t tokens_seen = 0;  // global tokens trained on
    // data position
    int64_t data_epoch = 0;
    int64_t data_index = 0;             // next global row of the epoch
    std::vector<uint8_t> sampler_state; // opaque bytes from the data stream
    // RNG of every rank: xoshiro256** words + Box-Muller spare (core/rng.h State), rank order
    struct RngState {
        std::array<uint64_t, 4> words{};
        bool has_spare = false;
        double spare = 0;
    };
    std::vector<RngState> rank_rngs;
    // tensors in arena order
    std::vector<CheckpointTensor> tensors;
    // free-form metadata (JSON object text), e.g. the run name, Lt/Le, sampler name
    std::string metadata_json = "{}";
};

}  // namespace ctx
