// The Llama family in HF form (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) without
// Python: config.json defaults and errors, the sliced q/k/v and gate/up tensors round tripping
// bit for bit, where each HF tensor lands in our fused views, and what export refuses. The
// comparison with transformers (logits, loss, every gradient) is tests/hf_reference.
#include <gtest/gtest.h>

#include <cstring>

#include "hf_test_support.h"

using namespace ctx;
using namespace ctx::test::hf;

TEST(HfLlama, ConfigOfEachFamily) {
    HfSpec s = hf_spec_from_config(llama_json(), "config.json");
    const ModelConfig& m = s.config;
    EXPECT_EQ(s.style, "llama");
    EXPECT_EQ(s.pe_plugin, "pe/rope");
    EXPECT_EQ(m.norm, NormKind::RMSNorm);
    EXPECT_EQ(m.activation, Activation::SwiGLU);
    EXPECT_EQ(m.n_kv_head, 2);
    EXPECT_EQ(m.qkv_rows(), 16 + 2 * 8);
    EXPECT_FALSE(m.tied_embeddings);
    EXPECT_FALSE(m.attention_bias || m.attention_out_bias || m.mlp_bias || m.norm_bias);
    EXPECT_FLOAT_EQ(m.norm_eps, 1e-6f);
    EXPECT_EQ(s.pe_options["rotary_pct"].get<double>(), 1.0);  // whole heads
    EXPECT_EQ(s.pe_options["base"].get<double>(), 10000.0);
    EXPECT_EQ(m.sliding_window, 0);

    json j = llama_json("mistral");
    j["sliding_window"] = 6;
    j["rope_theta"] = 1e6;
    s = hf_spec_from_config(j, "config.json");
    EXPECT_EQ(s.config.sliding_window, 6);
    EXPECT_EQ(s.pe_options["base"].get<double>(), 1e6);
    j["sliding_window"] = nullptr;  // Mistral v0.2+: no window
    EXPECT_EQ(hf_spec_from_config(j, "c").config.sliding_window, 0);
    j.erase("sliding_window");  // absent: MistralConfig's default
    EXPECT_EQ(hf_spec_from_config(j, "c").config.sliding_window, 4096);
    j["attention_bias"] = true;  // Mistral's layers have no biases whatever the config says
    EXPECT_FALSE(hf_spec_from_config(j, "c").config.attention_bias);

    s = hf_spec_from_config(llama_json("qwen2"), "config.json");
    EXPECT_TRUE(s.config.attention_bias);
    EXPECT_FALSE(s.config.attention_out_bias || s.config.mlp_bias);

    j = llama_json();
    j["attention_bias"] = true;  // Llama's switch covers q, k, v and o
    s = hf_spec_from_config(j, "c");
    EXPECT_TRUE(s.config.attention_bias && s.config.attention_out_bias);
    j = llama_json();
    j.erase("num_key_value_heads");  // Llama's default: one key/value head per query head
    EXPECT_FALSE(hf_spec_from_config(j, "c").config.grouped_kv());
    j = llama_json("qwen2");
    j["num_key_value_heads"] = nullptr;  // null: one per query head; absent: Qwen2Config's 32
    EXPECT_EQ(hf_spec_from_config(j, "c").config.kv_heads(), 4);
    j["num_attention_heads"] = 32, j["hidden_size"] = 64;
    j.erase("num_key_value_heads");
    EXPECT_EQ(hf_spec_from_config(j, "c").config.kv_heads(), 32);
    j = llama_json();
    j["num_key_value_heads"] = 2;  // (Mistral's default is 8)
    j["architectures"] = {"MistralForCausalLM"};
    j.erase("model_type");
    EXPECT_EQ(hf_spec_from_config(j, "c").model_type, "mistral");
}

TEST(HfLlama, ClearErrors) {
    auto err = [](json j) { return error_of([&] { hf_spec_from_config(j, "dir/config.json"); }); };
    json j = llama_json();
    j["hidden_act"] = "gelu";
    EXPECT_HAS(err(j), "dir/config.json: \"hidden_act\" = \"gelu\" is not supported");
    j = llama_json();
    j["num_key_value_heads"] = 3;
    EXPECT_HAS(err(j), "num_attention_heads 4 is not a multiple of num_key_value_heads 3");
    j = llama_json();
    j["head_dim"] = 8;
    EXPECT_HAS(err(j), "\"head_dim\" = 8 differs from hidden_size / num_attention_heads = 4");
    j = llama_json("qwen2");
    j["use_sliding_window"] = true;
    EXPECT_HAS(err(j), "\"use_sliding_window\" = true is not supported");
    j = llama_json();
    j["partial_rotary_factor"] = 0.5;
    EXPECT_HAS(err(j), "a rotary fraction below 1 (partial_rotary_factor / rotary_pct) is not "
                       "part of llama");
}

TEST(HfLlama, RoundTripThroughSafetensorsIsBitExact) {
    json tied_qwen = llama_json("qwen2"), mqa_mistral = llama_json("mistral"),
         biased_llama = llama_json();
    tied_qwen["tie_word_embeddings"] = true;
    mqa_mistral["num_key_value_heads"] = 1;
    mqa_mistral["sliding_window"] = 5;
    biased_llama["attention_bias"] = biased_llama["mlp_bias"] = true;
    int i = 0;
    for (const json& cfg : {llama_json(), tied_qwen, mqa_mistral, biased_llama}) {
        const HfSpec spec = hf_spec_from_config(cfg, "config.json");
        auto m = model_of(spec);
        expect_bit_exact_round_trip(spec, *m, "llama" + std::to_string(i++) + ".safetensors");
        // the exported config reads back as the same model
        const HfSpec again = hf_spec_from_config(hf_config_json(spec), "exported");
        EXPECT_EQ(again.model_type, spec.model_type);
        EXPECT_EQ(again.config.n_kv_head, spec.config.kv_heads());
        EXPECT_EQ(again.config.sliding_window, spec.config.sliding_window);
        EXPECT_EQ(again.config.attention_out_bias, spec.config.attention_out_bias);
        EXPECT_EQ(again.config.tied_embeddings, spec.config.tied_embeddings);
    }
}

TEST(HfLlama, SeparateProjectionsAreRowsOfTheFusedViews) {
    const HfSpec spec = hf_spec_from_config(llama_json("qwen2"), "c");
    auto m = model_of(spec);
    const HostTensors ours = model_tensors(*m, m->params());
    const std::vector<HfTensor> hf = ours_to_hf_tensors(spec, ours);
    const int C = 16, D = 4, F = 20;
    // attn.qkv.weight (32, 16): rows [q 0..15 | k 16..23 | v 24..31]
    const HostTensor& qkv = ours.at("layers.1.attn.qkv.weight");
    const HfTensor& k = by_name(hf, "model.layers.1.self_attn.k_proj.weight");
    EXPECT_EQ(k.shape, (std::vector<int64_t>{2 * D, C}));
    EXPECT_EQ(k.data[3 * C + 7], qkv.data[(16 + 3) * C + 7]);
    const HfTensor& vb = by_name(hf, "model.layers.1.self_attn.v_proj.bias");
    EXPECT_EQ(vb.data[5], ours.at("layers.1.attn.qkv.bias").data[24 + 5]);
    // mlp.fc.weight (40, 16): rows [gate | up]
    const HfTensor& up = by_name(hf, "model.layers.0.mlp.up_proj.weight");
    EXPECT_EQ(up.shape, (std::vector<int64_t>{F, C}));
    EXPECT_EQ(up.data[2 * C + 1], ours.at("layers.0.mlp.fc.weight").data[(F + 2) * C + 1]);
    EXPECT_THROW(by_name(hf, "model.layers.0.self_attn.o_proj.bias"), Error);  // Qwen2: none
    EXPECT_EQ(by_name(hf, "lm_head.weight").data, ours.at("lm_head.weight").data);  // untied
}

TEST(HfLlama, ExportRefusesWhatNoFamilyExpresses) {
    auto refusal = [](const ModelConfig& c, const std::string& pe) {
        return error_of([&] { hf_spec_for_model(c, "llama", pe, json::object(), {}); });
    };
    ModelConfig c = ModelConfig::from_style("llama");
    c.n_head = 4;
    EXPECT_EQ(refusal(c, "pe/rope"), "");
    EXPECT_HAS(refusal(c, "pe/alibi"), "norm = rmsnorm (bloom uses layernorm)");
    EXPECT_HAS(refusal(c, "pe/alibi"), "activation = swiglu (bloom's MLP is GELU)");
    EXPECT_HAS(refusal(c, "pe/learned"), "norm = rmsnorm (gpt2 uses layernorm)");
    ModelConfig half = c;  // a Llama block with a GELU MLP
    half.activation = Activation::GeluErf;
    EXPECT_HAS(refusal(half, "pe/rope"), "activation = gelu_erf (the Llama family's MLP is SwiGLU)");
    ModelConfig neox = ModelConfig::from_style("neox");
    neox.n_kv_head = 1;  // GPT-NeoX has no grouped-query attention: the Llama family it is
    EXPECT_HAS(refusal(neox, "pe/rope"), "norm = layernorm (the Llama family uses RMSNorm)");
    ModelConfig windowed = c;
    windowed.sliding_window = 8;
    windowed.mlp_bias = true;
    EXPECT_HAS(refusal(windowed, "pe/rope"), "biases with sliding_window (Mistral has no biases");
    ModelConfig out_bias_only = c;  // a bias on o_proj alone: no family has it
    out_bias_only.attention_out_bias = true;
    EXPECT_HAS(refusal(out_bias_only, "pe/rope"), "attention_out_bias != attention_bias");
    // Qwen2 exports say "no window" explicitly (transformers 4.49 masks by sliding_window
    // whenever it is set)
    ModelConfig qwen = c;
    qwen.attention_bias = true;
    const HfSpec qs = hf_spec_for_model(qwen, "llama", "pe/rope", json::object(), {});
    EXPECT_EQ(qs.model_type, "qwen2");
    EXPECT_TRUE(hf_config_json(qs)["sliding_window"].is_null());
    const std::string partial = error_of([&] {
        hf_spec_for_model(c, "llama", "pe/rope", json{{"rotary_pct", 0.5}}, {});
    });
    EXPECT_HAS(partial, "pe/rope rotary_pct < 1 (the Llama family rotates whole heads)");
}
