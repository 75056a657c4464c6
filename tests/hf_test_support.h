// Helpers of the HF mapping tests (test_io_hf_*.cpp): configs of tiny models of each family, a
// model built from a spec with the real plugins, temporary safetensors files, error text.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "io/hf_model.h"
#include "io/safetensors.h"
#include "model_fixtures.h"

#define EXPECT_HAS(text, substr) \
    EXPECT_NE(std::string(text).find(substr), std::string::npos) << "message: " << (text)

namespace ctx::test::hf {

using json = nlohmann::json;
namespace fs = std::filesystem;

inline std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

inline json gpt2_json() {
    return {{"model_type", "gpt2"}, {"vocab_size", 11}, {"n_positions", 8}, {"n_embd", 8},
            {"n_layer", 2}, {"n_head", 2}, {"n_inner", 12}};
}
inline json neox_json() {
    return {{"model_type", "gpt_neox"}, {"vocab_size", 11}, {"max_position_embeddings", 16},
            {"hidden_size", 16}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
            {"intermediate_size", 20}, {"rotary_pct", 0.5}, {"use_parallel_residual", true}};
}
inline json bloom_json() {
    return {{"model_type", "bloom"}, {"vocab_size", 11}, {"hidden_size", 12}, {"n_layer", 2},
            {"n_head", 3}, {"seq_length", 8}};
}
// 4 heads of dim 4 sharing 2 key/value heads
inline json llama_json(const std::string& type = "llama") {
    return {{"model_type", type}, {"vocab_size", 11}, {"max_position_embeddings", 16},
            {"hidden_size", 16}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
            {"num_key_value_heads", 2}, {"intermediate_size", 20}};
}

// A model built from a spec with the real plugins, parameters from `seed`.
inline std::unique_ptr<Model> model_of(const HfSpec& s, uint64_t seed = 3) {
    std::map<std::string, test::OptionValue> opts;
    for (const auto& [k, v] : s.pe_options.items()) {
        if (v.is_string()) opts[k] = v.get<std::string>();
        else opts[k] = v.get<double>();
    }
    return std::make_unique<Model>(s.config, test::cpu(),
                                   test::make_pe(s.pe_plugin.substr(3), s.config, opts), seed);
}

inline std::string temp_file(const std::string& name) {
    const fs::path d = fs::path(CTX_TEST_BINARY_DIR) / "test_tmp" / "hf_mapping";
    fs::create_directories(d);
    return (d / name).string();
}

inline void write_hf(const std::string& path, const std::vector<HfTensor>& tensors) {
    std::vector<StWriteTensor> w;
    for (const HfTensor& t : tensors) w.push_back({t.name, t.shape, t.data.data()});
    write_safetensors(path, w, {{"format", "pt"}});
}

// The model's parameters -> HF tensors -> a safetensors file -> ours again: the same names and
// shapes, bit for bit (gtest expectations). Returns what was read back.
inline HostTensors expect_bit_exact_round_trip(const HfSpec& spec, const Model& m,
                                               const std::string& file) {
    const HostTensors ours = model_tensors(m, m.params());
    const std::string path = temp_file(file);
    write_hf(path, ours_to_hf_tensors(spec, ours));
    HostTensors back = hf_tensors_to_ours(spec, SafetensorsSet::open_file(path));
    EXPECT_EQ(back.size(), ours.size()) << spec.model_type;
    for (const auto& [name, t] : ours) {
        if (!back.count(name)) {
            ADD_FAILURE() << spec.model_type << ": " << name << " not read back";
            continue;
        }
        EXPECT_EQ(back.at(name).shape, t.shape) << name;
        EXPECT_EQ(std::memcmp(back.at(name).data.data(), t.data.data(), t.data.size() * 4), 0)
            << spec.model_type << " " << name;
    }
    return back;
}

inline const HfTensor& by_name(const std::vector<HfTensor>& v, const std::string& name) {
    for (const HfTensor& t : v)
        if (t.name == name) return t;
    throw Error("no tensor " + name);
}

}  // namespace ctx::test::hf
