// ModelConfig: the Llama-family fields (n_kv_head, norm, swiglu, sliding_window,
// attention_out_bias), their validation, the JSON form checkpoints keep (enum fields by name,
// older checkpoints without attention_out_bias) and how windows combine.
#include <gtest/gtest.h>

#include <limits>

#include "core/error.h"
#include "model/config.h"
#include "model/config_json.h"

namespace ctx {
namespace {

std::string error_of(const ModelConfig& c) {
    try {
        c.validate();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(ModelConfig, LlamaStyleAndDerivedShapes) {
    ModelConfig c = ModelConfig::from_style("llama");
    EXPECT_EQ(c.norm, NormKind::RMSNorm);
    EXPECT_EQ(c.activation, Activation::SwiGLU);
    EXPECT_FALSE(c.tied_embeddings || c.attention_bias || c.attention_out_bias || c.mlp_bias ||
                 c.norm_bias);
    c.d_model = 64, c.n_head = 8, c.n_kv_head = 2, c.ffn_hidden = 100;
    EXPECT_EQ(c.head_dim(), 8);
    EXPECT_EQ(c.kv_heads(), 2);
    EXPECT_TRUE(c.grouped_kv());
    EXPECT_EQ(c.qkv_rows(), (8 + 2 * 2) * 8);
    EXPECT_EQ(c.fc_rows(), 200);  // [gate | up]
    c.n_kv_head = 0;              // 0: one per query head
    EXPECT_EQ(c.qkv_rows(), 3 * 64);
    EXPECT_FALSE(c.grouped_kv());
    EXPECT_EQ(ModelConfig::from_style("gpt2").fc_rows(), 4 * 128);
}

TEST(ModelConfig, ValidationNamesTheField) {
    ModelConfig c = ModelConfig::from_style("llama");
    c.n_kv_head = 3;  // of 4 heads
    EXPECT_NE(error_of(c).find("n_kv_head (3) must divide n_head (4)"), std::string::npos);
    c = ModelConfig::from_style("llama");
    c.norm_bias = true;
    EXPECT_NE(error_of(c).find("norm = rmsnorm has no bias"), std::string::npos);
    c = ModelConfig::from_style("gpt2");
    c.sliding_window = -1;
    EXPECT_NE(error_of(c).find("sliding_window must be >= 0"), std::string::npos);
    EXPECT_EQ(error_of(ModelConfig::from_style("llama")), "");
}

TEST(ModelConfig, ReluActivationRoundTripsAndUnknownNamesAreRefused) {
    ModelConfig c = ModelConfig::from_style("gpt2");
    c.activation = activation_from_name("relu");
    EXPECT_EQ(c.activation, Activation::Relu);
    EXPECT_FALSE(c.gated_mlp());
    const nlohmann::json j = model_config_to_json(c);
    EXPECT_EQ(j["activation"], "relu");
    EXPECT_EQ(model_config_from_json(j).activation, Activation::Relu);
    EXPECT_EQ(config_enum_choices(Activation::Relu),
              (std::vector<std::string>{"gelu_tanh", "gelu_erf", "swiglu", "relu"}));
    std::string what;
    try {
        activation_from_name("relu6");
    } catch (const Error& e) {
        what = e.what();
    }
    EXPECT_NE(what.find("unknown activation 'relu6' (expected gelu_tanh, gelu_erf, swiglu or relu)"),
              std::string::npos) << what;
}

TEST(ModelConfig, JsonKeepsEveryFieldAndReadsOlderCheckpoints) {
    ModelConfig c = ModelConfig::from_style("llama");
    c.n_kv_head = 2, c.sliding_window = 9, c.attention_bias = true;  // Qwen2-like + window
    const nlohmann::json j = model_config_to_json(c);
    EXPECT_EQ(j["norm"], "rmsnorm");
    EXPECT_EQ(j["activation"], "swiglu");
    const ModelConfig back = model_config_from_json(j);
    EXPECT_EQ(model_config_to_json(back), j);
    EXPECT_EQ(back.n_kv_head, 2);
    EXPECT_TRUE(back.attention_bias);
    EXPECT_FALSE(back.attention_out_bias);

    // The Llama-era fields are left out where an older reader's defaults say the same, so
    // checkpoints of the other styles stay readable by older builds.
    const nlohmann::json gpt2 = model_config_to_json(ModelConfig::from_style("gpt2"));
    for (const char* k : {"n_kv_head", "norm", "sliding_window", "attention_out_bias"})
        EXPECT_FALSE(gpt2.contains(k)) << k;
    EXPECT_EQ(model_config_from_json(gpt2).attention_out_bias, true);

    // Written before attention_out_bias existed: one switch for every attention bias.
    nlohmann::json old = model_config_to_json(ModelConfig::from_style("gpt2"));
    old.erase("attention_out_bias");
    old.erase("norm");
    old["attention_bias"] = false;
    EXPECT_FALSE(model_config_from_json(old).attention_out_bias);
    EXPECT_EQ(model_config_from_json(old).norm, NormKind::LayerNorm);
    old["attention_bias"] = true;
    EXPECT_TRUE(model_config_from_json(old).attention_out_bias);

    old["norm"] = "batchnorm";
    try {
        model_config_from_json(old);
        ADD_FAILURE() << "accepted norm = batchnorm";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("unknown norm 'batchnorm' (expected layernorm or "
                                             "rmsnorm)"), std::string::npos) << e.what();
    }
}

// Found by tests/fuzz/checkpoint_config_fuzz: a float beyond int's range was converted with
// undefined behaviour, a wide integer wrapped, and a non-finite norm_eps was accepted although
// the checkpoint's JSON cannot hold it (written as null, the checkpoint no longer loaded).
TEST(ModelConfig, JsonRefusesValuesThatDoNotFitTheField) {
    auto error_of_json = [](const char* text) -> std::string {
        try {
            model_config_from_json(nlohmann::json::parse(text));
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    EXPECT_NE(error_of_json(R"({"n_layer": 1e30})")
                  .find("config key 'n_layer' must be an integer in [-2147483648, 2147483647], "
                        "got 1e+30"),
              std::string::npos);
    EXPECT_NE(error_of_json(R"({"n_layer": 4294967297})").find("got 4294967297"),
              std::string::npos);
    EXPECT_NE(error_of_json(R"({"n_head": 2.5})").find("'n_head' must be an integer"),
              std::string::npos);
    EXPECT_NE(error_of_json(R"({"n_head": "4"})").find("'n_head' has the wrong type (string)"),
              std::string::npos);
    EXPECT_EQ(error_of_json(R"({"n_layer": 3.0})"), "");  // an integral float is an integer
    EXPECT_EQ(model_config_from_json(nlohmann::json::parse(R"({"n_layer": 3.0})")).n_layer, 3);
    EXPECT_NE(error_of_json(R"({"norm_eps": 1e39})").find("norm_eps must be positive and finite"),
              std::string::npos);
}

// Found by tests/fuzz/hf_config_fuzz: ffn() = 4 * d_model overflowed int for a d_model the
// validation accepted.
TEST(ModelConfig, ValidationRefusesSizesWhoseLayersOverflow) {
    ModelConfig c = ModelConfig::from_style("gpt2");
    c.d_model = 1 << 30, c.n_head = 1;
    EXPECT_NE(error_of(c).find("d_model (1073741824) and ffn_hidden (0) are too large"),
              std::string::npos);
    c.d_model = 64, c.ffn_hidden = 1 << 30;  // fc_rows() = 2 * ffn() with swiglu
    EXPECT_NE(error_of(c).find("are too large"), std::string::npos);
    c.ffn_hidden = 0, c.init_std = std::numeric_limits<float>::infinity();
    EXPECT_NE(error_of(c).find("init_std must be positive and finite, got inf"),
              std::string::npos);
}

TEST(ModelConfig, WindowsCombineToTheTighter) {
    ModelConfig c;
    EXPECT_EQ(c.window_with(0), 0);
    EXPECT_EQ(c.window_with(5), 5);
    c.sliding_window = 8;
    EXPECT_EQ(c.window_with(0), 8);
    EXPECT_EQ(c.window_with(5), 5);
    EXPECT_EQ(c.window_with(12), 8);
}

}  // namespace
}  // namespace ctx
