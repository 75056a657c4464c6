// HF checkpoints <-> ctxengine (io/hf_model.h) without Python: config.json parsing and its
// errors, the tensor mapping (Conv1D transposes, per-head fused QKV) round tripping bit for bit
// through safetensors, clear lists of missing / unexpected / mis-shaped tensors, and which
// models can be exported. The comparison with transformers itself is tests/hf_reference.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "hf_test_support.h"

using namespace ctx;
using namespace ctx::test::hf;

TEST(HfConfig, Gpt2) {
    const HfSpec s = hf_spec_from_config(gpt2_json(), "config.json");
    EXPECT_EQ(s.style, "gpt2");
    EXPECT_EQ(s.pe_plugin, "pe/learned");
    EXPECT_EQ(s.config.context_length, 8);
    EXPECT_EQ(s.config.ffn(), 12);
    EXPECT_EQ(s.config.activation, Activation::GeluTanh);
    EXPECT_TRUE(s.config.tied_embeddings);
    EXPECT_FALSE(s.config.parallel_residual);
    json j = gpt2_json();
    j.erase("model_type");
    j["architectures"] = {"GPT2LMHeadModel"};  // older configs: the class name only
    EXPECT_EQ(hf_spec_from_config(j, "c").model_type, "gpt2");
}

TEST(HfConfig, NeoxRopeSpellings) {
    HfSpec s = hf_spec_from_config(neox_json(), "config.json");
    EXPECT_EQ(s.pe_plugin, "pe/rope");
    EXPECT_TRUE(s.config.parallel_residual);
    EXPECT_FALSE(s.config.tied_embeddings);
    EXPECT_EQ(s.config.activation, Activation::GeluErf);
    EXPECT_EQ(s.pe_options["rotary_pct"], 0.5);
    EXPECT_EQ(s.pe_options["layout"], "half");
    EXPECT_FALSE(s.pe_options.contains("scaling"));

    json j = neox_json();
    j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};  // legacy spelling
    s = hf_spec_from_config(j, "config.json");
    EXPECT_EQ(s.pe_options["scaling"], "linear");
    EXPECT_EQ(s.pe_options["factor"], 4.0);
    EXPECT_EQ(s.pe_options["original_length"], 4);  // 16 / 4
    j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0},
                         {"original_max_position_embeddings", 16}};
    s = hf_spec_from_config(j, "config.json");
    EXPECT_EQ(s.pe_options["scaling"], "dynamic_ntk");
    EXPECT_EQ(s.pe_options["original_length"], 16);
    j.erase("rope_scaling");
    j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 500.0},
                            {"partial_rotary_factor", 0.25}};
    j.erase("rotary_pct");
    s = hf_spec_from_config(j, "config.json");
    EXPECT_EQ(s.pe_options["base"], 500.0);
    EXPECT_EQ(s.pe_options["rotary_pct"], 0.25);
    EXPECT_EQ(s.pe_options["scaling"], "linear");
}

// transformers' yarn, llama3 and longrope load as pe/rope's hf_yarn / llama3 / longrope with
// L0 read where each transformers version keeps it, and export back to configs that load to the
// same options (plus the attention factor, written out).
TEST(HfConfig, NeoxTransformersRopeTypesRoundTrip) {
    json j = neox_json();  // max_position_embeddings 16
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", 16.0}};
    HfSpec s = hf_spec_from_config(j, "config.json");
    EXPECT_EQ(s.pe_options["scaling"], "hf_yarn");
    EXPECT_EQ(s.pe_options["original_length"], 16);  // 4.49: max_position_embeddings
    EXPECT_EQ(s.pe_options["yarn_beta_fast"], 16.0);
    EXPECT_FALSE(s.pe_options.contains("yarn_beta_slow"));
    j["rope_scaling"]["original_max_position_embeddings"] = 8;  // later transformers
    s = hf_spec_from_config(j, "config.json");
    EXPECT_EQ(s.pe_options["original_length"], 8);
    HfSpec e = hf_spec_for_model(s.config, s.style, s.pe_plugin, s.pe_options, {});
    json out = hf_config_json(e);
    EXPECT_EQ(out["max_position_embeddings"], 8);
    EXPECT_EQ(out["rope_scaling"]["original_max_position_embeddings"], 8);
    EXPECT_DOUBLE_EQ(out["rope_scaling"]["attention_factor"].get<double>(), 0.1 * std::log(4.0) + 1);
    HfSpec back = hf_spec_from_config(out, "exported");
    for (const char* k : {"scaling", "factor", "original_length", "yarn_beta_fast", "base"})
        EXPECT_EQ(back.pe_options[k], s.pe_options[k]) << k;

    j = neox_json();
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8}};
    s = hf_spec_from_config(j, "config.json");
    EXPECT_EQ(s.pe_options["scaling"], "llama3");
    EXPECT_EQ(s.pe_options["original_length"], 8);
    e = hf_spec_for_model(s.config, s.style, s.pe_plugin, s.pe_options, {});
    back = hf_spec_from_config(hf_config_json(e), "exported");
    EXPECT_EQ(back.pe_options, s.pe_options) << back.pe_options.dump();

    j = neox_json();
    j["original_max_position_embeddings"] = 4;  // 4.49's top-level L0: factor 16 / 4
    j["rope_scaling"] = {{"rope_type", "longrope"}, {"short_factor", {1.0, 2.0}},
                         {"long_factor", {3.0, 4.0}}};
    s = hf_spec_from_config(j, "config.json");
    EXPECT_EQ(s.pe_options["scaling"], "longrope");
    EXPECT_EQ(s.pe_options["original_length"], 4);
    EXPECT_EQ(s.pe_options["factor"], 4.0);
    EXPECT_EQ(s.pe_options["long_factor"], json({3.0, 4.0}));
    e = hf_spec_for_model(s.config, s.style, s.pe_plugin, s.pe_options, {});
    out = hf_config_json(e);
    EXPECT_EQ(out["original_max_position_embeddings"], 4);
    EXPECT_DOUBLE_EQ(out["rope_scaling"]["attention_factor"].get<double>(),
                     std::sqrt(1 + std::log(4.0) / std::log(4.0)));
    back = hf_spec_from_config(out, "exported");
    for (const char* k : {"scaling", "factor", "original_length", "short_factor", "long_factor"})
        EXPECT_EQ(back.pe_options[k], s.pe_options[k]) << k;
}

// ReLU MLPs (OPT-style, or models fine-tuned into ReLU form for contextual sparsity) map both ways
// for GPT-2 ("activation_function") and GPT-NeoX ("hidden_act"); BLOOM's fixed tanh GELU
// refuses them by name.
TEST(HfConfig, ReluMapsBothWays) {
    json j = gpt2_json();
    j["activation_function"] = "relu";
    HfSpec s = hf_spec_from_config(j, "config.json");
    EXPECT_EQ(s.config.activation, Activation::Relu);
    json out = hf_config_json(hf_spec_for_model(s.config, s.style, s.pe_plugin, s.pe_options, {}));
    EXPECT_EQ(out["activation_function"], "relu");
    j = neox_json();
    j["hidden_act"] = "relu";
    s = hf_spec_from_config(j, "config.json");
    EXPECT_EQ(s.config.activation, Activation::Relu);
    out = hf_config_json(hf_spec_for_model(s.config, s.style, s.pe_plugin, s.pe_options, {}));
    EXPECT_EQ(out["hidden_act"], "relu");
    EXPECT_EQ(hf_spec_from_config(out, "exported").config.activation, Activation::Relu);
}

TEST(HfConfig, ClearErrors) {
    auto err = [](json j) { return error_of([&] { hf_spec_from_config(j, "dir/config.json"); }); };
    json j = gpt2_json();
    j["model_type"] = "mamba";
    EXPECT_HAS(err(j), "dir/config.json: model_type \"mamba\" is not supported (supported: gpt2, "
                       "gpt_neox, bloom, llama, mistral, qwen2)");
    EXPECT_HAS(err(json{{"n_embd", 8}}), "no \"model_type\"");
    j = gpt2_json();
    j["n_embd"] = "eight";
    EXPECT_HAS(err(j), "\"n_embd\" must be an integer, got \"eight\"");
    j = gpt2_json();
    j["activation_function"] = "sigmoid";
    EXPECT_HAS(err(j), "\"activation_function\" = \"sigmoid\" is not supported (gelu, gelu_new, "
                       "gelu_pytorch_tanh, gelu_fast, relu)");
    j = gpt2_json();
    j["scale_attn_by_inverse_layer_idx"] = true;
    EXPECT_HAS(err(j), "\"scale_attn_by_inverse_layer_idx\" = true is not supported");
    j = neox_json();
    j["rope_scaling"] = {{"rope_type", "su"}, {"factor", 4.0}};
    EXPECT_HAS(err(j), "rope type \"su\" is not supported (default, linear, dynamic, yarn, "
                       "llama3 and longrope are)");
    j = neox_json();
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
    EXPECT_HAS(err(j), "rope type \"llama3\" needs \"original_max_position_embeddings\"");
    j = neox_json();
    j["rope_scaling"] = {{"rope_type", "longrope"}, {"short_factor", {1.0}}};
    EXPECT_HAS(err(j), "rope type \"longrope\" needs a list \"long_factor\"");
    j = neox_json();
    j["rotary_pct"] = 0.1875;  // 8 * 0.1875 = 1.5 -> 1 dim
    EXPECT_HAS(err(j), "gives 1 rotary dims of head_dim 8");
    j = bloom_json();
    j["apply_residual_connection_post_layernorm"] = true;
    EXPECT_HAS(err(j), "\"apply_residual_connection_post_layernorm\" = true is not supported");
    // Found by tests/fuzz/hf_config_fuzz: sizes whose derived layer sizes overflowed int, and an
    // epsilon that became inf.
    j = bloom_json();
    j["hidden_size"] = 1 << 30;
    j["n_head"] = 1;
    EXPECT_HAS(err(j), "dir/config.json: hidden_size 1073741824 is too large (BLOOM's MLP is 4 x "
                       "hidden_size)");
    j = gpt2_json();
    j["n_embd"] = 1 << 30;
    j["n_head"] = 1;
    EXPECT_HAS(err(j), "dir/config.json: d_model (1073741824) and ffn_hidden (12) are too large");
    j = gpt2_json();
    j["layer_norm_epsilon"] = 1e39;
    EXPECT_HAS(err(j), "dir/config.json: norm_eps must be positive and finite, got inf");
}

// Found while fuzzing (tests/fuzz/hf_config_fuzz): "vocab_size" nested 300000 levels deep parsed,
// then overflowed the stack in dump() for the message (ctxengine convert died with SIGSEGV).
TEST(HfConfig, DeeplyNestedJsonIsRefusedNotACrash) {
    const fs::path dir = fs::temp_directory_path() / ("ctx_hf_deep_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << R"({"model_type": "gpt2", "vocab_size": )"
                                       << std::string(300000, '[') << std::string(300000, ']')
                                       << "}";
    EXPECT_HAS(error_of([&] { read_hf_checkpoint(dir.string()); }),
               "config.json: JSON nested deeper than 128 levels");
    fs::remove_all(dir);
}

TEST(HfMapping, RoundTripThroughSafetensorsIsBitExact) {
    json untied_bloom = bloom_json(), no_bias_neox = neox_json(), seq_neox = neox_json();
    untied_bloom["tie_word_embeddings"] = false;
    no_bias_neox["attention_bias"] = false;
    seq_neox["use_parallel_residual"] = false;
    int i = 0;
    for (const json& cfg : {gpt2_json(), neox_json(), no_bias_neox, seq_neox, bloom_json(), untied_bloom}) {
        const HfSpec spec = hf_spec_from_config(cfg, "config.json");
        auto m = model_of(spec);
        const std::string file = "roundtrip" + std::to_string(i++) + ".safetensors";
        const HostTensors back = expect_bit_exact_round_trip(spec, *m, file);
        // and a model loads them
        auto m2 = model_of(spec, 99);
        set_model_params(*m2, back, file);
        EXPECT_EQ(std::memcmp(m2->params().data(), m->params().data(), m->params().size() * 4), 0);
    }
}

TEST(HfMapping, LayoutsOfFusedAndTransposedWeights) {
    // GPT-2's Conv1D c_attn is (in, out) = ours transposed; its columns are [q | k | v].
    HfSpec spec = hf_spec_from_config(gpt2_json(), "c");
    auto m = model_of(spec);
    HostTensors ours = model_tensors(*m, m->params());
    std::vector<HfTensor> hf = ours_to_hf_tensors(spec, ours);
    const int C = 8;
    const HostTensor& qkv = ours.at("layers.1.attn.qkv.weight");  // (3C, C)
    const HfTensor& c_attn = by_name(hf, "transformer.h.1.attn.c_attn.weight");  // (C, 3C)
    EXPECT_EQ(c_attn.shape, (std::vector<int64_t>{C, 3 * C}));
    EXPECT_EQ(c_attn.data[5 * 3 * C + 17], qkv.data[17 * C + 5]);
    EXPECT_EQ(by_name(hf, "transformer.wpe.weight").data, ours.at("pe.wpe").data);

    // NeoX's query_key_value rows are per head [h0: q k v | h1: q k v]; ours [q | k | v].
    spec = hf_spec_from_config(neox_json(), "c");
    m = model_of(spec);
    ours = model_tensors(*m, m->params());
    hf = ours_to_hf_tensors(spec, ours);
    const int H = 2, D = 8, NC = 16;
    const HostTensor& w = ours.at("layers.0.attn.qkv.weight");
    const HfTensor& fused = by_name(hf, "gpt_neox.layers.0.attention.query_key_value.weight");
    const HfTensor& fused_b = by_name(hf, "gpt_neox.layers.0.attention.query_key_value.bias");
    for (int h = 0; h < H; ++h)
        for (int part = 0; part < 3; ++part)
            for (int d = 0; d < D; ++d) {
                const int hf_row = h * 3 * D + part * D + d, our_row = part * NC + h * D + d;
                EXPECT_EQ(fused.data[hf_row * NC + 3], w.data[our_row * NC + 3]);
                EXPECT_EQ(fused_b.data[hf_row], ours.at("layers.0.attn.qkv.bias").data[our_row]);
            }
    EXPECT_EQ(by_name(hf, "embed_out.weight").data, ours.at("lm_head.weight").data);
}

TEST(HfMapping, ListsMissingUnexpectedAndMisshapedTensors) {
    const HfSpec spec = hf_spec_from_config(gpt2_json(), "c");
    auto m = model_of(spec);
    std::vector<HfTensor> hf = ours_to_hf_tensors(spec, model_tensors(*m, m->params()));
    std::vector<HfTensor> bad;
    for (HfTensor t : hf) {
        if (t.name == "transformer.h.0.ln_2.bias") continue;  // missing
        if (t.name == "transformer.wpe.weight") t.shape = {4, 16};  // wrong shape, same size
        bad.push_back(t);
    }
    bad.push_back({"transformer.h.0.attn.bias", {1, 1, 8, 8}, std::vector<float>(64, 1)});  // known buffer
    bad.push_back({"transformer.h.0.extra.weight", {2}, {1, 2}});                         // unexpected
    const std::string path = temp_file("bad.safetensors");
    write_hf(path, bad);
    const std::string msg = error_of([&] { hf_tensors_to_ours(spec, SafetensorsSet::open_file(path)); });
    EXPECT_HAS(msg, "bad.safetensors: the tensors do not match config.json (gpt2: 2 layers");
    EXPECT_HAS(msg, "missing (1): transformer.h.0.ln_2.bias");
    EXPECT_HAS(msg, "wrong shape: transformer.wpe.weight is [4, 16] (expected [8, 8])");
    EXPECT_HAS(msg, "unexpected (1): transformer.h.0.extra.weight");
    EXPECT_EQ(msg.find("attn.bias,"), std::string::npos) << msg;

    // A stored copy of a tied head must be the embedding.
    std::vector<HfTensor> with_head = hf;
    with_head.push_back(by_name(hf, "transformer.wte.weight"));
    with_head.back().name = "lm_head.weight";
    write_hf(path, with_head);
    EXPECT_EQ(hf_tensors_to_ours(spec, SafetensorsSet::open_file(path)).size(), hf.size());
    with_head.back().data[0] += 1.0f;
    write_hf(path, with_head);
    EXPECT_HAS(error_of([&] { hf_tensors_to_ours(spec, SafetensorsSet::open_file(path)); }),
               "lm_head.weight differs from transformer.wte.weight but config.json ties them");

    // Checkpoints of the bare base model (no "transformer." prefix) read the same.
    std::vector<HfTensor> bare = hf;
    for (HfTensor& t : bare) t.name = t.name.substr(std::strlen("transformer."));
    write_hf(path, bare);
    EXPECT_EQ(hf_tensors_to_ours(spec, SafetensorsSet::open_file(path)).size(), hf.size());
}

TEST(HfExport, ConfigRoundTripsAndRefusals) {
    for (const json& cfg : {gpt2_json(), neox_json(), bloom_json()}) {
        const HfSpec s = hf_spec_from_config(cfg, "c");
        const HfSpec e = hf_spec_for_model(s.config, s.style, s.pe_plugin, s.pe_options, {});
        const HfSpec back = hf_spec_from_config(hf_config_json(e), "exported");
        EXPECT_EQ(back.model_type, s.model_type);
        EXPECT_EQ(back.pe_options, s.pe_options) << back.pe_options.dump() << s.pe_options.dump();
        EXPECT_EQ(back.config.context_length, s.config.context_length);
        EXPECT_EQ(back.config.ffn(), s.config.ffn());
        EXPECT_EQ(back.config.parallel_residual, s.config.parallel_residual);
        EXPECT_EQ(back.config.tied_embeddings, s.config.tied_embeddings);
        EXPECT_EQ(back.config.activation, s.config.activation);
    }
    const ModelConfig base = hf_spec_from_config(neox_json(), "c").config;
    auto spec_err = [&](ModelConfig c, const std::string& pe, json o) {
        return error_of([&] { hf_spec_for_model(c, "neox", pe, o, {}); });
    };
    EXPECT_HAS(spec_err(base, "pe/rope", {{"rotary_pct", 0.5}, {"layout", "interleaved"}}),
               "layout = \"interleaved\"");
    EXPECT_HAS(spec_err(base, "pe/rope", {{"scaling", "yarn"}, {"factor", 2.0}}),
               "scaling = yarn");
    EXPECT_HAS(spec_err(base, "pe/t5_bias", json::object()), "pe/t5_bias has no transformers equivalent");
    EXPECT_HAS(spec_err(base, "pe/learned", json::object()),
               "cannot be written as gpt2 (pe/learned):\n  parallel_residual = true");
    ModelConfig bloomish = hf_spec_from_config(bloom_json(), "c").config;
    bloomish.ffn_hidden = 20;
    EXPECT_HAS(spec_err(bloomish, "pe/alibi", json::object()), "ffn_hidden != 4 * d_model");

    // Static NTK-aware scaling becomes a larger rope_theta: base * s^(dr / (dr - 2)).
    const HfSpec ntk = hf_spec_for_model(base, "neox", "pe/rope",
                                         {{"rotary_pct", 0.5}, {"scaling", "ntk"}, {"factor", 2.0}}, {});
    EXPECT_DOUBLE_EQ(ntk.pe_options["base"].get<double>(), 10000.0 * std::pow(2.0, 4.0 / 2.0));
    EXPECT_FALSE(hf_config_json(ntk)["rope_scaling"].is_object());
}

TEST(HfExport, RopeFactorComesFromThePluginState) {
    // linear scaling without an explicit factor: extend() picks s = Le / L; the export must
    // write that s, which only the plugin's state knows.
    HfSpec s = hf_spec_from_config(neox_json(), "c");
    s.pe_options["scaling"] = "linear";
    auto m = model_of(s);
    m->extend(64, nullptr, nullptr);
    const HfSpec e = hf_spec_for_model(m->config(), "neox", "pe/rope", s.pe_options,
                                       m->pe()->save_state());
    const json cfg = hf_config_json(e);
    EXPECT_EQ(cfg["max_position_embeddings"], 64);
    EXPECT_EQ(cfg["rope_scaling"]["rope_type"], "linear");
    EXPECT_DOUBLE_EQ(cfg["rope_scaling"]["factor"].get<double>(), 4.0);  // 64 / 16
    EXPECT_HAS(error_of([&] {
                   hf_spec_for_model(m->config(), "neox", "pe/rope", s.pe_options, {1, 2, 3});
               }),
               "not the documented 32-byte version 1 layout");
}
