// libFuzzer target for the HF config.json mapping (io/hf_config.cpp: config.json -> HfSpec with
// its ModelConfig and PE options, and back) and the model config JSON a checkpoint stores
// (model/config_json.cpp). The input is a config.json text, parsed as read_hf_checkpoint parses
// it. A config that maps must then
//   - survive model_config_to_json -> model_config_from_json unchanged (what a checkpoint of the
//     model stores must load again), and
//   - go through the export mapping (hf_spec_for_model, hf_config_json) and be read again; a
//     refusal there is a ctx::Error, anything else is a bug.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "io/hf_model.h"
#include "fuzz_support.h"
#include "model/config_json.h"

using nlohmann::json;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    // read_hf_checkpoint refuses malformed JSON and nesting deeper than 128 levels before mapping.
    bool too_deep = false;
    auto limit_depth = [&](int depth, json::parse_event_t, json&) {
        too_deep = too_deep || depth > 128;
        return !too_deep;
    };
    const json config = json::parse(data, data + size, limit_depth, /*allow_exceptions=*/false);
    if (config.is_discarded() || too_deep) return 0;
    ctx::HfSpec spec;
    try {
        spec = ctx::hf_spec_from_config(config, "fuzz/config.json");
    } catch (const ctx::Error& e) {
        ctx::fuzz::note(e);
        return 0;
    }
    const json stored = ctx::model_config_to_json(spec.config);
    try {
        const ctx::ModelConfig loaded = ctx::model_config_from_json(json::parse(stored.dump()));
        if (ctx::model_config_to_json(loaded) != stored) __builtin_trap();
    } catch (const ctx::Error&) {
        __builtin_trap();  // a config the mapping accepted could not be read back
    }
    try {
        const ctx::HfSpec out =
            ctx::hf_spec_for_model(spec.config, spec.style, spec.pe_plugin, spec.pe_options, {});
        const json written = ctx::hf_config_json(out);
        (void)ctx::hf_spec_from_config(json::parse(written.dump()), "fuzz/exported.json");
    } catch (const ctx::Error& e) {
        ctx::fuzz::note(e);
    }
    return 0;
}
