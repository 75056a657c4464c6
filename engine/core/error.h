// One exception type for the engine. It never crosses the plugin ABI (plugins get ctx_status);
// the CLI catches it at the top and exits non-zero with its message.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace ctx {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
    throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace ctx

// Checks a condition that depends on user input or external state (not an internal invariant).
#define CTX_CHECK(cond, ...)                 \
    do {                                     \
        if (!(cond)) ::ctx::fail(__VA_ARGS__); \
    } while (0)
