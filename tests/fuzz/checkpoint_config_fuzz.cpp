// libFuzzer target for the strings a checkpoint stores and a resume parses once HDF5 has handed
// them over (model/config_json.cpp): model_config_json and optimizer_config_json. The input is
//   model config JSON, a NUL byte, optimizer config JSON
// (either part may be empty), parsed with nlohmann as session/models.cpp does. Reading must give
// a config or ctx::Error; a config that reads must write back as JSON that reads to the same.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "fuzz_support.h"
#include "model/config_json.h"

using nlohmann::json;

namespace {

json parse(std::string_view text) {
    return json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

// Parses text as a config (From: JSON -> Config, throws ctx::Error); one that is accepted must
// write JSON that reads back to the same JSON.
template <class Config>
void round_trip(std::string_view text, Config (*from)(const json&), json (*to)(const Config&)) {
    const json j = parse(text);
    if (j.is_discarded()) return;  // the caller reports bad JSON before interpreting it
    Config c;
    try {
        c = from(j);
    } catch (const ctx::Error& e) {
        ctx::fuzz::note(e);
        return;
    }
    const json written = to(c);
    try {
        if (to(from(parse(written.dump()))) != written) __builtin_trap();
    } catch (const ctx::Error&) {
        __builtin_trap();  // a config that was accepted once must be accepted again
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string_view input(reinterpret_cast<const char*>(data), size);
    const std::string_view model_text = ctx::fuzz::take_until(input, std::string_view("\0", 1));
    round_trip(model_text, ctx::model_config_from_json, ctx::model_config_to_json);
    round_trip(input, ctx::optimizer_config_from_json, ctx::optimizer_config_to_json);
    return 0;
}
