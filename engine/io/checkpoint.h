// HDF5 checkpoints of the full training state (DESIGN.md decision 8). A resumed run continues
// bit-exactly. Files are written to a temporary name, flushed and renamed; the `latest` pointer
// of a run directory is updated last; checksums are verified on load.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace ctx {

inline constexpr const char* kCheckpointFormat = "ctxengine-checkpoint";
inline constexpr int kCheckpointVersion = 1;

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

// Writes `path` atomically: `<path>.tmp-<pid>` is written, flushed (H5Fflush + fsync), closed and
// renamed over `path`; a crash at any point leaves either the old file or the new one. Throws
// ctx::Error naming the path on any HDF5 or filesystem failure (and removes the temp file).
void save_checkpoint(const std::string& path, const TrainingState& state);

// Reads and verifies a checkpoint: the format attribute must be kCheckpointFormat and the version
// one this build reads; every dataset's checksum and the metadata checksum must match. Throws
// ctx::Error with the path and what is wrong (not an HDF5 file / truncated, wrong format, newer
// version, checksum mismatch in <dataset>, missing <dataset>) and never crashes on bad input.
TrainingState load_checkpoint(const std::string& path);

// Run directories: `<dir>/latest` is a small text file holding the file name of the newest
// complete checkpoint in dir; it is replaced atomically (temp + rename) after the checkpoint file
// itself is in place.
void set_latest_checkpoint(const std::string& dir, const std::string& file_name);
// Path of the newest checkpoint in dir, or "" if there is no `latest` pointer. Throws if the
// pointer names a file that does not exist.
std::string latest_checkpoint(const std::string& dir);

}  // namespace ctx
