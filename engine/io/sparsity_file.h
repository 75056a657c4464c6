// Sparsity predictors (model/sparsity.h) on disk: one F32 safetensors file with the arena's
// tensors by name and, in its metadata, what they were made for (format, version, the model's
// shape, ranks and label fractions). It goes next to a checkpoint or inside an HF export
// directory as `sparsity_predictors.safetensors` (HF's loaders ignore files they do not know).
#pragma once

#include <memory>
#include <string>

#include "model/sparsity.h"

namespace ctx {

inline constexpr const char* kPredictorsFile = "sparsity_predictors.safetensors";

// Writes atomically; errors name the path.
void save_predictors(const SparsityPredictors& p, const std::string& path);
// Reads a file written by save_predictors for a model of `config` on `backend`. A file for
// another model shape, another format or a missing tensor is an error naming the path and what
// differs.
std::unique_ptr<SparsityPredictors> load_predictors(const std::string& path,
                                                    const ModelConfig& config, Backend& backend);

}  // namespace ctx
