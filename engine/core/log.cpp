#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/error.h"

namespace ctx::log {

void set_level(const std::string& level) {
    const auto lvl = spdlog::level::from_str(level);
    // from_str maps unknown names to "off"; refuse them instead of silently muting the log.
    CTX_CHECK(lvl != spdlog::level::off || level == "off",
              "unknown log level '{}' (expected trace, debug, info, warn, error or off)", level);
    spdlog::set_level(lvl);
}

void init(int rank, int world_size, const std::string& level) {
    auto logger = spdlog::stderr_color_mt("ctx");
    spdlog::set_default_logger(logger);
    if (world_size > 1)
        spdlog::set_pattern(fmt::format("[%H:%M:%S.%e] [rank {}] [%^%l%$] %v", rank));
    else
        spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    set_level(level);
}

}  // namespace ctx::log
