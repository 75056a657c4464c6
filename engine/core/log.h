// Logging through spdlog. Every line carries the MPI rank when there is more than one.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace ctx::log {

// Sets up the default logger; level is one of trace/debug/info/warn/error/off.
void init(int rank, int world_size, const std::string& level);
void set_level(const std::string& level);

}  // namespace ctx::log
