// ModelConfig and OptimizerConfig as JSON (checkpoints, exports, logs). Reading is strict:
// unknown keys and wrong types are errors, so a checkpoint from a newer build is refused clearly.
#pragma once

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/optimizer.h"

namespace ctx {

nlohmann::json model_config_to_json(const ModelConfig& c);
ModelConfig model_config_from_json(const nlohmann::json& j);  // throws ctx::Error
nlohmann::json optimizer_config_to_json(const OptimizerConfig& c);
OptimizerConfig optimizer_config_from_json(const nlohmann::json& j);

}  // namespace ctx
